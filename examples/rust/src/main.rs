//! One round trip through channels-nats from Rust: connect, make a process channel, add it to
//! the group "chat", send a message to the group and receive it back on the channel, with every
//! pending operation's result coming through one result queue.
//!
//! Usage: CN_LIB=path/to/libchannels_nats.so cargo run --release -- [nats-url]

use std::env;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use channels_nats_example::{Client, Library, Queue};
use rmpv::Value;

/// How long a pending operation may take before the example gives up.
const WAIT: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chat: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = env::args().nth(1).unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let lib = Library::load(&library_path())?;
    println!("channels-nats {}, server {url}", lib.version());

    // Every pending operation reports to this queue; the calls below wait on it for their own.
    let mut queue = Queue::new(lib)?;
    // The configuration is the JSON form of the Django CONFIG block.
    let config = format!(r#"{{"servers": [{}]}}"#, json_string(&url));
    let client = Client::connect(lib, &mut queue, &config, WAIT)?;
    let channel = client.new_channel(&mut queue, WAIT)?;
    println!("channel: {channel}");
    client.group_add(&mut queue, "chat", &channel, WAIT)?;

    // The body of every Channels message is a msgpack map with string keys.
    let message =
        Value::Map(vec![("type".into(), "chat.message".into()), ("text".into(), "hello from Rust".into())]);
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, &message)?;

    // Start the receive first, so that it waits in the channel's mailbox; then send, then wait
    // for the receive's result (the message) in the queue.
    let receiving = client.start_receive(&mut queue, &channel)?;
    client.group_send(&mut queue, "chat", &body, WAIT)?;
    let received = client.finish_receive(&mut queue, receiving, Duration::from_secs(5))?;

    let received = rmpv::decode::read_value(&mut received.as_slice())?;
    let text = received["text"].as_str().ok_or("the message has no str field \"text\"")?;
    println!("received: {text}");
    client.close(&mut queue, WAIT)?; // the result is the final statistics, unused here
    Ok(())
}

/// CN_LIB, else the library `make lib` builds: ../../build/<goos>-<goarch>/ from this crate.
fn library_path() -> PathBuf {
    if let Some(path) = env::var_os("CN_LIB") {
        return path.into();
    }
    let os = match env::consts::OS {
        "macos" => "darwin",
        os => os,
    };
    let arch = match env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        arch => arch,
    };
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../build")
        .join(format!("{os}-{arch}"))
        .join(libloading::library_filename("channels_nats"))
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => out.extend(['\\', c]),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out + "\""
}

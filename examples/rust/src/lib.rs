//! A small safe wrapper over the C ABI of channels-nats (`include/channels_nats.h`), loaded at
//! run time with `libloading`. Only the calls the example needs are wrapped.
//!
//! - The library is loaded once and never unloaded: a Go c-shared library cannot be (dlclose
//!   does nothing, FreeLibrary crashes), so the `libloading::Library` lives in a static.
//! - No call of the library waits. An operation finishes during its call, or returns CN_PENDING
//!   and later puts its result into a result queue ([`Queue`]), which signals one end of a
//!   socket pair. The methods here block on that socket until the result of their operation is
//!   in: simple, and enough for an example (an event loop would watch the socket instead).
//! - The only callback is the log callback; it catches panics, because unwinding out of an
//!   `extern "C"` function aborts the process.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::{self, Read};
use std::panic::catch_unwind;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use std::{fmt, ptr, slice};

#[cfg(windows)]
use std::net::{Ipv4Addr, TcpListener, TcpStream as Stream};
#[cfg(unix)]
use std::os::unix::net::UnixStream as Stream;

// cn_status values used here (the header has them all; a C enum is an int on these platforms).
const CN_OK: c_int = 0;
const CN_PENDING: c_int = 1;
const CN_ERR: c_int = 2;
const CN_INVALID_ARG: c_int = 3;
const CN_NOT_PENDING: c_int = 12;
const CN_TIMEOUT: c_int = 15;
const CN_INTERNAL: c_int = 17;

type LogCallback = unsafe extern "C" fn(*mut c_void, c_int, *const c_char);
type Out<T> = *mut T;
const NULL: *mut c_void = ptr::null_mut(); // no closure: results are matched by their op

/// `cn_result`: what `cn_queue_take` fills in. `text` and `data` are lent until the next take.
#[repr(C)]
#[derive(Clone, Copy)]
struct CnResult {
    op: u64,
    closure: *mut c_void,
    status: c_int,
    text: *const c_char,
    data: *const u8,
    len: usize,
    rearm: *mut u64, // this example starts receives over by name: it does not use the word
}

const EMPTY: CnResult = CnResult {
    op: 0,
    closure: NULL,
    status: CN_OK,
    text: ptr::null(),
    data: ptr::null(),
    len: 0,
    rearm: ptr::null_mut(),
};

/// The loaded library: the function pointers, and the handle that keeps them valid.
#[rustfmt::skip]
pub struct Library {
    status_text: unsafe extern "C" fn(c_int) -> *const c_char,
    last_error: unsafe extern "C" fn() -> *const c_char,
    version: unsafe extern "C" fn() -> *const c_char,
    free: unsafe extern "C" fn(*mut c_void),
    queue_new: unsafe extern "C" fn(isize, Out<u64>) -> c_int,
    queue_take: unsafe extern "C" fn(u64, *mut CnResult, usize, Out<usize>) -> c_int,
    queue_free: unsafe extern "C" fn(u64) -> c_int,
    connect: unsafe extern "C" fn(*const c_char, Option<LogCallback>, *mut c_void, u64, *mut c_void,
                                  Out<u64>) -> c_int,
    close: unsafe extern "C" fn(u64, u64, *mut c_void) -> c_int,
    new_channel: unsafe extern "C" fn(u64, *const c_char, u64, *mut c_void, Out<*mut c_char>,
                                      Out<u64>) -> c_int,
    group_add: unsafe extern "C" fn(u64, *const c_char, *const c_char, u64, *mut c_void, Out<u64>) -> c_int,
    send: unsafe extern "C" fn(u64, *const c_char, *const u8, usize, u64, *mut c_void, Out<u64>) -> c_int,
    group_send: unsafe extern "C" fn(u64, *const c_char, *const u8, usize, u64, *mut c_void,
                                     Out<u64>) -> c_int,
    receive: unsafe extern "C" fn(u64, *const c_char, u64, *mut c_void, Out<*const u8>, Out<usize>,
                                  Out<u64>) -> c_int,
    cancel: unsafe extern "C" fn(u64, u64) -> c_int,
    _lib: libloading::Library,
}

static LIBRARY: OnceLock<Library> = OnceLock::new();

impl Library {
    /// Loads the library, once per process: later calls return the first one, whatever `path`.
    pub fn load(path: &Path) -> Result<&'static Library, Error> {
        if let Some(lib) = LIBRARY.get() {
            return Ok(lib);
        }
        // SAFETY: the library's initialisers only start the Go runtime; the function types in
        // `Library` are those of channels_nats.h.
        let lib = unsafe { Self::open(path) }.map_err(|e| {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            Error::Load(format!("{}: {e}{cause}", path.display()))
        })?;
        if let Err(lost_race) = LIBRARY.set(lib) {
            std::mem::forget(lost_race); // another thread loaded it first; never unload
        }
        Ok(LIBRARY.get().expect("loaded above"))
    }

    unsafe fn open(path: &Path) -> Result<Library, libloading::Error> {
        let lib = unsafe { libloading::Library::new(path)? };
        // Copies each function pointer out of its Symbol; valid as long as `lib` is loaded.
        macro_rules! load {
            ($($field:ident),*) => {{
                $(let $field = *unsafe { lib.get(concat!("cn_", stringify!($field), "\0"))? };)*
                Library { $($field,)* _lib: lib }
            }};
        }
        let loaded = load! {
            status_text, last_error, version, free, queue_new, queue_take, queue_free, connect,
            close, new_channel, group_add, send, group_send, receive, cancel
        };
        Ok(loaded)
    }

    /// The library version, e.g. "0.1.0".
    pub fn version(&self) -> &'static str {
        unsafe { static_str((self.version)()) }
    }

    /// An error for `status`, with this thread's `cn_last_error()` (read it right after the call).
    fn check(&self, status: c_int) -> Result<(), Error> {
        match status {
            CN_OK => Ok(()),
            _ => Err(self.last_error(status)),
        }
    }

    fn last_error(&self, status: c_int) -> Error {
        self.error(status, unsafe { text((self.last_error)()) })
    }

    fn error(&self, status: c_int, detail: String) -> Error {
        let name = unsafe { static_str((self.status_text)(status)) };
        Error::Status { status, name, detail }
    }

    fn cstring(&self, s: &str) -> Result<CString, Error> {
        CString::new(s).map_err(|_| self.error(CN_INVALID_ARG, format!("{s:?} contains a NUL byte")))
    }
}

/// A failure: the library could not be loaded, or a call or a result had an error `status` (a
/// cn_status code) whose `name` is its cn_status_text() and `detail` the cn_last_error() or the
/// result's text.
#[derive(Debug, Clone)]
pub enum Error {
    Load(String),
    Status { status: i32, name: &'static str, detail: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(what) => write!(f, "cannot load the library {what}"),
            Error::Status { name, detail, .. } => write!(f, "{name} ({detail})"),
        }
    }
}

impl std::error::Error for Error {}

/// One result, copied out of the queue (what `cn_queue_take` lends is valid until the next take).
struct Outcome {
    status: c_int,
    text: String,
    data: Option<Vec<u8>>,
}

/// A result queue, signalled on a socket pair. Methods that take from it need `&mut self`:
/// takes (and receives with this queue) must not run concurrently, and `&mut` says so.
pub struct Queue {
    lib: &'static Library,
    handle: u64,
    reader: Stream,
    // The end the library writes one byte to when the queue goes from empty to non-empty. It must
    // stay open until cn_queue_free: Drop frees the queue first, then the fields close it.
    _writer: Stream,
    stash: Vec<(u64, Outcome)>, // results taken while waiting for another operation's
}

impl Queue {
    pub fn new(lib: &'static Library) -> Result<Queue, Error> {
        let io = |e: io::Error| lib.error(CN_ERR, format!("socket pair: {e}"));
        let (reader, writer) = socket_pair().map_err(io)?;
        writer.set_nonblocking(true).map_err(io)?; // a full socket never holds up the library
        let mut handle = 0;
        lib.check(unsafe { (lib.queue_new)(raw_socket(&writer), &mut handle) })?;
        Ok(Queue { lib, handle, reader, _writer: writer, stash: Vec::new() })
    }

    /// One cn_queue_take: copies what it lends into the stash. Returns how many it took.
    fn take(&mut self) -> Result<usize, Error> {
        let mut results = [EMPTY; 8];
        let mut count = 0;
        let st =
            unsafe { (self.lib.queue_take)(self.handle, results.as_mut_ptr(), results.len(), &mut count) };
        self.lib.check(st)?;
        for r in &results[..count] {
            let data = (!r.data.is_null()).then(|| unsafe { slice::from_raw_parts(r.data, r.len) }.to_vec());
            self.stash.push((r.op, Outcome { status: r.status, text: unsafe { text(r.text) }, data }));
        }
        Ok(count)
    }

    /// Waits up to `timeout` for the result of `op`; None when it did not come in time.
    ///
    /// It blocks on the socket only after a take found the queue empty: the library signals every
    /// change from empty to non-empty, so the next result wakes it. A byte left over from results
    /// taken already only costs one more (empty) take.
    fn wait(&mut self, op: u64, timeout: Duration) -> Result<Option<Outcome>, Error> {
        let deadline = Instant::now() + timeout;
        for _ in 0..100_000 {
            if let Some(i) = self.stash.iter().position(|(o, _)| *o == op) {
                return Ok(Some(self.stash.remove(i).1));
            }
            if self.take()? > 0 {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.sleep_until_signalled(left)?;
        }
        Ok(None)
    }

    /// Blocks until the library signals or `left` passes, and discards the signal bytes.
    fn sleep_until_signalled(&mut self, left: Duration) -> Result<(), Error> {
        let lib = self.lib;
        let io = |e: io::Error| lib.error(CN_ERR, format!("notify socket: {e}"));
        self.reader.set_read_timeout(Some(left.max(Duration::from_millis(1)))).map_err(io)?;
        match self.reader.read(&mut [0; 64]) {
            Ok(0) => Err(io(io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => Ok(()),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    /// The status of a call that returned `st`: CN_OK at once, or with CN_PENDING the result of
    /// `op` within `timeout`.
    fn settle(&mut self, st: c_int, op: u64, timeout: Duration, what: &str) -> Result<Outcome, Error> {
        if st != CN_PENDING {
            self.lib.check(st)?;
            return Ok(Outcome { status: CN_OK, text: String::new(), data: None });
        }
        match self.wait(op, timeout)? {
            Some(r) if r.status == CN_OK => Ok(r),
            Some(r) => Err(self.lib.error(r.status, r.text)),
            None => Err(self.lib.error(CN_TIMEOUT, format!("no result of {what} within {timeout:?}"))),
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Pending operations that report here are withdrawn (a receive loses no message).
        unsafe { (self.lib.queue_free)(self.handle) };
    }
}

/// A receive started with [`Client::start_receive`]: the message, or the pending operation.
#[must_use = "finish it with Client::finish_receive"]
pub struct Receiving {
    op: u64,
    ready: Option<Vec<u8>>,
}

/// A client. Close it with [`Client::close`]; dropping it closes it too (waiting a few seconds).
pub struct Client {
    lib: &'static Library,
    handle: u64,
    closed: bool,
}

impl Client {
    /// Connects with a JSON configuration (the keys of the Django CONFIG block). The connect is
    /// always pending: its result, named by the client handle, comes through `queue`.
    pub fn connect(
        lib: &'static Library, queue: &mut Queue, config_json: &str, timeout: Duration,
    ) -> Result<Client, Error> {
        let config = lib.cstring(config_json)?;
        let mut handle = 0;
        let st =
            unsafe { (lib.connect)(config.as_ptr(), Some(on_log), NULL, queue.handle, NULL, &mut handle) };
        if st != CN_PENDING {
            return Err(lib.last_error(st));
        }
        let mut client = Client { lib, handle, closed: false };
        if let Err(e) = queue.settle(st, handle, timeout, "the connect") {
            // A failed connect leaves a closed client; one still connecting is closed by Drop.
            client.closed = !matches!(e, Error::Status { status: CN_TIMEOUT, .. });
            return Err(e);
        }
        Ok(client)
    }

    /// Makes a new process channel of this client.
    pub fn new_channel(&self, queue: &mut Queue, timeout: Duration) -> Result<String, Error> {
        let (mut name, mut op): (*mut c_char, u64) = (ptr::null_mut(), 0);
        let st = unsafe {
            (self.lib.new_channel)(self.handle, ptr::null(), queue.handle, NULL, &mut name, &mut op)
        };
        if st == CN_OK {
            let channel = unsafe { text(name) };
            unsafe { (self.lib.free)(name.cast()) }; // library memory goes back through cn_free
            return Ok(channel);
        }
        // Pending until the server confirmed the process subscription; the name is the text.
        Ok(queue.settle(st, op, timeout, "new_channel")?.text)
    }

    pub fn group_add(
        &self, queue: &mut Queue, group: &str, channel: &str, timeout: Duration,
    ) -> Result<(), Error> {
        let (group, channel) = (self.lib.cstring(group)?, self.lib.cstring(channel)?);
        let mut op = 0;
        let st = unsafe {
            (self.lib.group_add)(self.handle, group.as_ptr(), channel.as_ptr(), queue.handle, NULL, &mut op)
        };
        queue.settle(st, op, timeout, "group_add").map(drop)
    }

    /// Sends a msgpack map to a channel: accepted at once, or pending while the outbound buffer
    /// is full.
    pub fn send(
        &self, queue: &mut Queue, channel: &str, body: &[u8], timeout: Duration,
    ) -> Result<(), Error> {
        let channel = self.lib.cstring(channel)?;
        let mut op = 0;
        let st = unsafe {
            (self.lib.send)(
                self.handle,
                channel.as_ptr(),
                body.as_ptr(),
                body.len(),
                queue.handle,
                NULL,
                &mut op,
            )
        };
        queue.settle(st, op, timeout, "the send").map(drop)
    }

    /// Sends a msgpack map to every member of a group (as [`Client::send`]).
    pub fn group_send(
        &self, queue: &mut Queue, group: &str, body: &[u8], timeout: Duration,
    ) -> Result<(), Error> {
        let group = self.lib.cstring(group)?;
        let mut op = 0;
        let st = unsafe {
            (self.lib.group_send)(
                self.handle,
                group.as_ptr(),
                body.as_ptr(),
                body.len(),
                queue.handle,
                NULL,
                &mut op,
            )
        };
        queue.settle(st, op, timeout, "the group_send").map(drop)
    }

    /// Starts receiving the next message of a channel: a message waiting is returned at once,
    /// otherwise the receive waits in the channel's mailbox until [`Client::finish_receive`].
    pub fn start_receive(&self, queue: &mut Queue, channel: &str) -> Result<Receiving, Error> {
        let channel = self.lib.cstring(channel)?;
        let (mut body, mut len, mut op) = (ptr::null(), 0, 0);
        let st = unsafe {
            (self.lib.receive)(
                self.handle,
                channel.as_ptr(),
                queue.handle,
                NULL,
                &mut body,
                &mut len,
                &mut op,
            )
        };
        match st {
            // Lent until the next take or receive with this queue: copied now.
            CN_OK => {
                Ok(Receiving { op: 0, ready: Some(unsafe { slice::from_raw_parts(body, len) }.to_vec()) })
            }
            CN_PENDING => Ok(Receiving { op, ready: None }),
            _ => Err(self.lib.last_error(st)),
        }
    }

    /// The message of a receive, waiting up to `timeout`. On timeout the receive is cancelled,
    /// which never loses a message: one it had got already goes back to the front of the mailbox,
    /// unless its result is in, which is then returned.
    pub fn finish_receive(
        &self, queue: &mut Queue, receiving: Receiving, timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        if let Some(message) = receiving.ready {
            return Ok(message);
        }
        let op = receiving.op;
        let outcome = match queue.wait(op, timeout)? {
            Some(outcome) => outcome,
            None => match unsafe { (self.lib.cancel)(self.handle, op) } {
                CN_OK => return Err(self.lib.error(CN_TIMEOUT, format!("no message within {timeout:?}"))),
                CN_NOT_PENDING => queue.wait(op, Duration::from_secs(1))?.ok_or_else(|| {
                    self.lib.error(CN_INTERNAL, "the finished receive's result did not come".into())
                })?,
                st => return Err(self.lib.last_error(st)),
            },
        };
        match (outcome.status, outcome.data) {
            (CN_OK, Some(message)) => Ok(message),
            (status, _) => Err(self.lib.error(status, outcome.text)),
        }
    }

    /// Closes the client: pending operations end with CN_CLOSED, buffered publishes are written,
    /// and the close's result carries the client's final statistics (JSON), which it returns.
    pub fn close(mut self, queue: &mut Queue, timeout: Duration) -> Result<String, Error> {
        self.close_on(queue, timeout)
    }

    fn close_on(&mut self, queue: &mut Queue, timeout: Duration) -> Result<String, Error> {
        self.closed = true;
        let st = unsafe { (self.lib.close)(self.handle, queue.handle, NULL) };
        Ok(queue.settle(st, self.handle, timeout, "the close")?.text)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // A queue of its own, so that the close is done (publishes written) before Drop returns.
        let closed =
            Queue::new(self.lib).and_then(|mut queue| self.close_on(&mut queue, Duration::from_secs(5)));
        if let Err(e) = closed {
            eprintln!("channels-nats: close: {e}");
        }
    }
}

/// A connected pair of stream sockets.
#[cfg(unix)]
fn socket_pair() -> io::Result<(Stream, Stream)> {
    Stream::pair()
}

/// A connected pair of stream sockets: Windows has no socketpair, so a loopback connection.
#[cfg(windows)]
fn socket_pair() -> io::Result<(Stream, Stream)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let writer = Stream::connect(listener.local_addr()?)?;
    let (reader, _) = listener.accept()?;
    Ok((reader, writer))
}

/// The notify value for cn_queue_new: a file descriptor, or a SOCKET on Windows.
#[cfg(unix)]
fn raw_socket(s: &Stream) -> isize {
    use std::os::unix::io::AsRawFd;
    s.as_raw_fd() as isize
}

#[cfg(windows)]
fn raw_socket(s: &Stream) -> isize {
    use std::os::windows::io::AsRawSocket;
    s.as_raw_socket() as isize
}

/// The log callback: runs on a library thread, must not call the library.
unsafe extern "C" fn on_log(_closure: *mut c_void, level: c_int, message: *const c_char) {
    let _ = catch_unwind(|| eprintln!("channels-nats log {level}: {}", unsafe { text(message) }));
}

/// Copies a C string (NULL gives "").
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A static string of the library (which is never unloaded).
unsafe fn static_str(p: *const c_char) -> &'static str {
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("(not UTF-8)")
}

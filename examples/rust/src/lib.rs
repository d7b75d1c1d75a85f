//! A small safe wrapper over the C ABI of channels-nats (`include/channels_nats.h`), loaded at
//! run time with `libloading`. Only the calls the example needs are wrapped.
//!
//! - The library is loaded once and never unloaded: a Go c-shared library cannot be (dlclose
//!   does nothing, FreeLibrary crashes), so the `libloading::Library` lives in a static.
//! - Callbacks run on threads the library owns. Every callback here catches panics, because
//!   unwinding out of an `extern "C"` function aborts the process.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{OnceLock, mpsc};
use std::time::Duration;
use std::{fmt, ptr, slice};

// cn_status values used here (the header has them all; a C enum is an int on these platforms).
const CN_OK: c_int = 0;
const CN_PENDING: c_int = 1;
const CN_INVALID_ARG: c_int = 3;
const CN_NOT_PENDING: c_int = 12;
const CN_TIMEOUT: c_int = 15;
const CN_INTERNAL: c_int = 17;

type Callback = unsafe extern "C" fn(*mut c_void, c_int, *const c_char, *const u8, usize);
type LogCallback = unsafe extern "C" fn(*mut c_void, c_int, *const c_char);
type Cb = Option<Callback>; // NULL selects the waiting form
type Out<T> = *mut T;
const NULL: *mut c_void = ptr::null_mut(); // no closure
const NO_OP: Out<u64> = ptr::null_mut(); // no cn_op wanted (waiting form)

/// The loaded library: the function pointers, and the handle that keeps them valid.
#[rustfmt::skip]
pub struct Library {
    status_text: unsafe extern "C" fn(c_int) -> *const c_char,
    last_error: unsafe extern "C" fn() -> *const c_char,
    version: unsafe extern "C" fn() -> *const c_char,
    free: unsafe extern "C" fn(*mut c_void),
    connect: unsafe extern "C" fn(*const c_char, Option<LogCallback>, *mut c_void, Cb, *mut c_void,
                                  Out<u64>) -> c_int,
    close: unsafe extern "C" fn(u64, Cb, *mut c_void) -> c_int,
    new_channel: unsafe extern "C" fn(u64, *const c_char, Cb, *mut c_void, Out<*mut c_char>,
                                      Out<u64>) -> c_int,
    group_add: unsafe extern "C" fn(u64, *const c_char, *const c_char, Cb, *mut c_void, Out<u64>) -> c_int,
    send: unsafe extern "C" fn(u64, *const c_char, *const u8, usize, Cb, *mut c_void, Out<u64>) -> c_int,
    group_send: unsafe extern "C" fn(u64, *const c_char, *const u8, usize, Cb, *mut c_void,
                                     Out<u64>) -> c_int,
    receive: unsafe extern "C" fn(u64, *const c_char, Cb, *mut c_void, Out<*mut u8>, Out<usize>,
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
            status_text, last_error, version, free, connect, close, new_channel, group_add, send,
            group_send, receive, cancel
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

/// A failure: the library could not be loaded, or a call returned an error `status` (a cn_status
/// code) whose `name` is its cn_status_text() and `detail` the cn_last_error() or callback text.
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

/// A connected client. Dropping it closes it (waiting form); don't drop one inside a callback.
pub struct Client {
    lib: &'static Library,
    handle: u64,
}

impl Client {
    /// Connects with a JSON configuration (the keys of the Django CONFIG block) and waits.
    pub fn connect(lib: &'static Library, config_json: &str) -> Result<Client, Error> {
        let config = lib.cstring(config_json)?;
        let mut handle = 0;
        // Waiting form (callback None): returns once connected, or with the reason it could not.
        let st = unsafe { (lib.connect)(config.as_ptr(), Some(on_log), NULL, None, NULL, &mut handle) };
        lib.check(st)?;
        Ok(Client { lib, handle })
    }

    /// Makes a new process channel of this client.
    pub fn new_channel(&self) -> Result<String, Error> {
        let mut name: *mut c_char = ptr::null_mut();
        let st = unsafe { (self.lib.new_channel)(self.handle, ptr::null(), None, NULL, &mut name, NO_OP) };
        self.lib.check(st)?;
        let channel = unsafe { text(name) };
        unsafe { (self.lib.free)(name.cast()) }; // library memory goes back through cn_free
        Ok(channel)
    }

    pub fn group_add(&self, group: &str, channel: &str) -> Result<(), Error> {
        let (group, channel) = (self.lib.cstring(group)?, self.lib.cstring(channel)?);
        let st =
            unsafe { (self.lib.group_add)(self.handle, group.as_ptr(), channel.as_ptr(), None, NULL, NO_OP) };
        self.lib.check(st)
    }

    /// Sends a msgpack map to a channel.
    pub fn send(&self, channel: &str, body: &[u8]) -> Result<(), Error> {
        let channel = self.lib.cstring(channel)?;
        let st = unsafe {
            (self.lib.send)(self.handle, channel.as_ptr(), body.as_ptr(), body.len(), None, NULL, NO_OP)
        };
        self.lib.check(st)
    }

    /// Sends a msgpack map to every member of a group.
    pub fn group_send(&self, group: &str, body: &[u8]) -> Result<(), Error> {
        let group = self.lib.cstring(group)?;
        let st = unsafe {
            (self.lib.group_send)(self.handle, group.as_ptr(), body.as_ptr(), body.len(), None, NULL, NO_OP)
        };
        self.lib.check(st)
    }

    /// Receives the next message of a channel (its msgpack body), waiting up to `timeout`.
    /// Uses the pending form: the callback sends the result through a channel.
    pub fn receive(&self, channel: &str, timeout: Duration) -> Result<Vec<u8>, Error> {
        let (lib, h) = (self.lib, self.handle);
        let channel = lib.cstring(channel)?;
        let (tx, rx) = mpsc::channel();
        // Leaked for the callback, which takes it back; if the callback never runs, we do.
        let closure = Box::into_raw(Box::new(Reply { lib, tx })).cast::<c_void>();
        let (mut body, mut len, mut op) = (ptr::null_mut(), 0, 0);
        let st = unsafe {
            (lib.receive)(h, channel.as_ptr(), Some(on_receive), closure, &mut body, &mut len, &mut op)
        };
        if st != CN_PENDING {
            drop(unsafe { Box::from_raw(closure.cast::<Reply>()) }); // no callback: not pending
            lib.check(st)?;
            let message = unsafe { slice::from_raw_parts(body, len) }.to_vec();
            unsafe { (lib.free)(body.cast()) };
            return Ok(message);
        }
        let panicked = || Err(lib.error(CN_INTERNAL, "the receive callback panicked".into()));
        match rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(mpsc::RecvTimeoutError::Disconnected) => panicked(),
            Err(mpsc::RecvTimeoutError::Timeout) => match unsafe { (lib.cancel)(h, op) } {
                // Withdrawn: the callback will not run, so the closure is ours again.
                CN_OK => {
                    drop(unsafe { Box::from_raw(closure.cast::<Reply>()) });
                    Err(lib.error(CN_TIMEOUT, format!("no message within {timeout:?}")))
                }
                // It finished meanwhile: its callback runs or ran, so wait for it, lose nothing.
                CN_NOT_PENDING => rx.recv().unwrap_or_else(|_| panicked()),
                // Unknown state: leave the closure to the callback (a small leak at worst).
                st => Err(lib.last_error(st)),
            },
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Waiting form: when it returns, no callback of this client runs any more.
        let st = unsafe { (self.lib.close)(self.handle, None, NULL) };
        if let Err(e) = self.lib.check(st) {
            eprintln!("channels-nats: close: {e}");
        }
    }
}

/// What a pending receive hands to its callback.
struct Reply {
    lib: &'static Library,
    tx: mpsc::Sender<Result<Vec<u8>, Error>>,
}

/// The completion callback of a receive; the library calls it once, on one of its threads.
unsafe extern "C" fn on_receive(
    closure: *mut c_void, status: c_int, detail: *const c_char, data: *const u8, len: usize,
) {
    let reply = unsafe { Box::from_raw(closure.cast::<Reply>()) }; // ours again; dropped at the end
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let result = match status {
            // `data` is valid only during the call: copy it.
            CN_OK if !data.is_null() => Ok(unsafe { slice::from_raw_parts(data, len) }.to_vec()),
            _ => Err(reply.lib.error(status, unsafe { text(detail) })),
        };
        let _ = reply.tx.send(result);
    }));
}

/// The log callback: may run on any library thread, must not call the library.
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

"""Loading the native library, and what its status codes mean in Python.

The library (a Go runtime) is loaded on first use, never at import: a process that forks after
the Go runtime started cannot use it, and Django imports the backend long before it is used
(S21). The cffi declarations come from the C header shipped beside the library, so they cannot
drift from it. The calls go through the compiled cffi module beside the library when there is one
built from that header (python/cffi_build.py), else through cffi's ABI mode: the same calls,
about 0.4 µs slower each.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import cffi
from channels.exceptions import MessageTooLarge

from ._header import FINGERPRINT_FUNCTION, cdef_from_header, fingerprint

_log = logging.getLogger("channels_nats")

COMPILED_MODULE = "_cffi.abi3.so"
"""The compiled cffi module's file name (python/cffi_build.py writes it beside the library)."""

LIBRARY_ENV = "CHANNELS_NATS_LIBRARY"
"""Environment variable naming a library file to use instead of the bundled one."""

FORK_ERROR = (
    "channels_nats: this process was forked after the NATS library was loaded, and a forked "
    "copy of its Go runtime cannot run. Create the channel layer in the worker process after the "
    "fork (for example: no gunicorn --preload that touches the layer, or multiprocessing with the "
    "'spawn' start method)."
)


class ChannelLayerClosed(RuntimeError):
    """A call was made, or an operation was waiting, while the layer was being closed."""


class PublishTimeout(TimeoutError):
    """A send waited publish_deadline for room in the outbound buffer: the connection took nothing
    for that long (a frozen server, a stalled link, an outage). Nothing of the message was sent."""


class _State:
    lib: Any = None
    ffi: cffi.FFI | None = None
    fastpath: Any = None  # the module channels_nats._fastpath, with the compiled module
    loaded_by: int = 0
    forked = False


_state = _State()
_load_lock = threading.Lock()


def library_file_name() -> str:
    if sys.platform == "win32":
        return "channels_nats.dll"
    if sys.platform == "darwin":
        return "libchannels_nats.dylib"
    return "libchannels_nats.so"


def library_path() -> Path:
    """The library to load: $CHANNELS_NATS_LIBRARY, else the one inside the package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files(__package__ or "channels_nats"))) / library_file_name()


def _after_fork_in_child() -> None:
    if _state.lib is not None:
        _state.forked = True


if hasattr(os, "register_at_fork"):  # Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """Whether this process was forked after the library was loaded (it cannot use it)."""
    return _state.forked


def load() -> tuple[cffi.FFI, Any]:
    """Loads the library on first use and returns (ffi, lib)."""
    if _state.forked:
        raise RuntimeError(FORK_ERROR)
    if _state.lib is not None:
        return _state.ffi, _state.lib  # type: ignore[return-value]
    with _load_lock:
        if _state.lib is None:
            path = library_path()
            header = path.with_name("channels_nats.h")
            if not path.is_file() or not header.is_file():
                raise RuntimeError(
                    f"channels_nats: the native library is missing ({path} and {header}); "
                    f"reinstall the package, or set {LIBRARY_ENV} to a library built with 'make lib'"
                )
            text = header.read_text(encoding="utf-8")
            loaded = _load_compiled(path, text)
            if loaded is None:
                ffi = cffi.FFI()
                ffi.cdef(cdef_from_header(text))
                loaded = ffi, ffi.dlopen(str(path)), None
            _state.ffi, _state.lib, _state.fastpath = loaded
            _state.loaded_by = os.getpid()
    return _state.ffi, _state.lib  # type: ignore[return-value]


def _load_compiled(path: Path, header: str) -> tuple[cffi.FFI, Any, Any] | None:
    """The compiled cffi module beside the library (python/cffi_build.py), when there is one built
    from this header: its ffi and lib, and the module channels_nats._fastpath in the same
    file. None to use ABI mode. A module that cannot be used is logged, not raised: ABI mode
    calls the same functions, only slower."""
    module_path = path.with_name(COMPILED_MODULE)
    if path.name != library_file_name() or not module_path.is_file():
        return None  # it is linked to the library of the standard name in its directory
    try:
        module = _load_extension("channels_nats._cffi", module_path)
        built_from = module.ffi.string(getattr(module.lib, FINGERPRINT_FUNCTION)()).decode()
        fastpath = _load_extension("channels_nats._fastpath", module_path)
    except (ImportError, OSError, AttributeError) as e:
        _log.warning("channels_nats: cannot use %s (%s); calling the library through cffi's ABI mode", module_path, e)
        return None
    if built_from != fingerprint(header):
        _log.warning(
            "channels_nats: %s was built from another channels_nats.h than the one beside it; calling the "
            "library through cffi's ABI mode (rebuild it: make accelerator, or reinstall the package)",
            module_path,
        )
        return None
    return module.ffi, module.lib, fastpath


def _load_extension(name: str, path: Path) -> Any:
    """The extension module name from the file path (one file may hold several)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no loader for {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fastpath() -> Any:
    """The module channels_nats._fastpath (fastpath.c) when the compiled module is used, else None."""
    load()
    return _state.fastpath


def call_mode() -> str:
    """How Python calls the library (loads it): "compiled" (the cffi module beside the library)
    or "abi" (cffi's ABI mode, through libffi: the same calls, slower)."""
    _, lib = load()
    return "compiled" if hasattr(lib, FINGERPRINT_FUNCTION) else "abi"


def text(pointer: Any) -> str:
    """A C string from the library as str (never NULL)."""
    ffi, _ = load()
    value = ffi.string(pointer)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def version() -> str:
    """The version of the native library (loads it)."""
    _, lib = load()
    return text(lib.cn_version())


# Status codes of include/channels_nats.h.
OK = 0
PENDING = 1
INVALID_CONFIG = 4
INVALID_NAME = 5
INVALID_MESSAGE = 6
MESSAGE_TOO_LARGE = 7
FOREIGN_CHANNEL = 8
CLOSED = 10
NOT_PENDING = 12
ILLEGAL_STATE = 13
NO_SERVER = 14
TIMEOUT = 15
FORKED = 16


def error_for(status: int, detail: str, publishing: bool = False) -> BaseException:
    """The exception a failed call raises; publishing tells a send's timeout from others."""
    if status in (INVALID_NAME, INVALID_CONFIG, INVALID_MESSAGE):
        return TypeError(detail)
    if status == MESSAGE_TOO_LARGE:
        return MessageTooLarge(detail)
    if status == FOREIGN_CHANNEL:
        return ValueError(detail)
    if status == CLOSED:
        return ChannelLayerClosed(detail or "channels_nats: the layer is closed")
    if status == NO_SERVER:
        return ConnectionError(detail)
    if status == TIMEOUT:
        return PublishTimeout(detail) if publishing else TimeoutError(detail)
    if status == FORKED:
        return RuntimeError(FORK_ERROR)
    detail = detail or f"error {status}"
    return RuntimeError(detail if detail.startswith("channels_nats") else f"channels_nats: {detail}")


def last_error() -> str:
    _, lib = load()
    return text(lib.cn_last_error())


def check(status: int) -> int:
    """Returns status when it is OK or PENDING; raises the matching exception otherwise."""
    if status in (OK, PENDING):
        return status
    raise_for(status, last_error())


def raise_for(status: int, detail: str) -> NoReturn:
    raise error_for(status, detail)

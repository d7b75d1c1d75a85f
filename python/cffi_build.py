"""Builds the compiled cffi module: the fast way for Python to call the native library.

    python cffi_build.py path/to/libchannels_nats.so

Writes _cffi.abi3.so next to the library, linked to it (rpath $ORIGIN). Without this module the
package calls the library through cffi's ABI mode (libffi), which costs about 0.4 µs more per call,
and a receive that finds a message waiting is one call. The same file holds a second module,
channels_nats._fastpath (fastpath.c): cn_receive and cn_queue_take as one CPython call each, which
receives and takes use instead of the cffi functions. Both are built for the stable ABI, so one
build serves every CPython 3.10 and later. The file records a fingerprint of the header it was
built from, and the package uses it only with a header of the same fingerprint next to it.

Linux only for now (a C compiler and the Python headers are needed): elsewhere, or when either is
missing, nothing is built and the package uses ABI mode. The wheel build hook (hatch_build.py)
and `make accelerator` call build().
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

MODULE_FILE = "_cffi.abi3.so"
"""The file name of the compiled module: _native.py looks for it next to the library."""

FASTPATH_SOURCE = Path(__file__).resolve().parent / "fastpath.c"
"""The C source of channels_nats._fastpath, compiled into the same file."""


def _header_module() -> ModuleType:
    """channels_nats/_header.py, loaded on its own: the package's dependencies may be absent here."""
    path = Path(__file__).resolve().parent / "channels_nats" / "_header.py"
    spec = importlib.util.spec_from_file_location("channels_nats_header", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cffi_build: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unavailable() -> str | None:
    """Why no module can be built here, or None."""
    if not sys.platform.startswith("linux"):
        return f"the compiled module is built on Linux only (this is {sys.platform})"
    if sys.implementation.name != "cpython":
        return f"the compiled module needs CPython (this is {sys.implementation.name})"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return f"no Python headers in {include} (Debian: apt-get install python3-dev)"
    if shutil.which(_compiler()[0]) is None:
        return f"no C compiler ({_compiler()[0]}; set CC)"
    return None


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def build(library: Path) -> Path | None:
    """Compiles the module next to library (with channels_nats.h beside it); returns its path, or
    None when it cannot be built here (unavailable() says why). A failed compile raises."""
    if unavailable() is not None:
        return None
    import cffi  # a build requirement; imported here so unavailable() works without it

    header_module = _header_module()
    library = library.resolve()
    header = library.with_name("channels_nats.h")
    text = header.read_text(encoding="utf-8")
    function = header_module.FINGERPRINT_FUNCTION
    ffi = cffi.FFI()
    ffi.cdef(header_module.cdef_from_header(text) + f"\nconst char *{function}(void);\n")
    ffi.set_source(
        "_cffi",
        f'#include "channels_nats.h"\n'
        f'static const char *{function}(void) {{ return "{header_module.fingerprint(text)}"; }}\n',
    )
    target = library.with_name(MODULE_FILE)
    with tempfile.TemporaryDirectory(prefix="channels-nats-cffi-") as scratch:
        source = Path(scratch) / "_cffi.c"
        ffi.emit_c_code(str(source))
        partial = Path(scratch) / MODULE_FILE
        command = [
            *_compiler(),
            "-shared",
            "-fPIC",
            "-O2",
            f"-I{sysconfig.get_paths()['include']}",
            f"-I{library.parent}",
            str(source),
            str(FASTPATH_SOURCE),
            f"-L{library.parent}",
            f"-l:{library.name}",
            "-Wl,-rpath,$ORIGIN",
            "-o",
            str(partial),
        ]
        subprocess.run(command, check=True)
        os.replace(partial, target)  # never a half-written module next to the library
    return target


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python cffi_build.py path/to/libchannels_nats.so")
    library = Path(sys.argv[1])
    if not library.with_name("channels_nats.h").is_file() or not library.is_file():
        raise SystemExit(f"cffi_build: {library} and channels_nats.h beside it must exist (make lib)")
    reason = unavailable()
    if reason is not None:
        print(f"cffi_build: not built: {reason}; the package uses cffi's ABI mode")
        return
    print(f"cffi_build: built {build(library)}")


if __name__ == "__main__":
    main()

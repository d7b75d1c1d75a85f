"""The C header as cffi declarations. Dependency-free: the build of the compiled cffi module
(python/cffi_build.py) loads this file on its own, where the package's dependencies are absent."""

from __future__ import annotations

import hashlib
import re


def cdef_from_header(text: str) -> str:
    """Turns include/channels_nats.h into declarations cffi can parse."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or stripped in ('extern "C" {', "}"):
            continue
        kept.append(line.replace("CN_EXTERN ", ""))
    return "\n".join(kept)


def fingerprint(text: str) -> str:
    """What a compiled cffi module records of the header it was built from: a module built from
    another header than the library's would call its functions with the wrong signatures."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


FINGERPRINT_FUNCTION = "channels_nats_cffi_header"
"""The function a compiled cffi module adds, returning the fingerprint of its header."""

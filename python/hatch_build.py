"""Puts the native library and its header into the wheel.

- CHANNELS_NATS_PREBUILT=<dir>: take the library and channels_nats.h from <dir> (platform wheels
  built elsewhere, as wheels/build.sh does; CHANNELS_NATS_PLATFORM_TAG then names their platform,
  which also decides the library's file name).
- Otherwise build them with Go from the repository this package sits in, or from the Go sources an
  sdist carries (go/), with capi/build.sh, and compile the cffi module (cffi_build.py) beside
  the library where it can be (Linux, with a C compiler and the Python headers).
A compiled cffi module makes the wheel cp310-abi3 (with CHANNELS_NATS_PREBUILT: when <dir> has
one); without one the wheel is py3-none and the package calls the library through ABI mode.
An editable install (pip install -e) builds it with Go into the source package directory.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cffi_build  # beside this file, in the repository and in the sdist

LIBRARY_NAMES = {"linux": "libchannels_nats.so", "darwin": "libchannels_nats.dylib", "win32": "channels_nats.dll"}


def platform_tag() -> str:
    """The wheel platform tag of this machine. Linux builds pin glibc 2.17 (capi/build.sh); macOS
    builds need macOS 12, Go's oldest, and hold one architecture (never universal2)."""
    machine = platform.machine().lower()
    if sys.platform.startswith("linux"):
        arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
        return f"manylinux_2_17_{arch}.manylinux2014_{arch}"
    if sys.platform == "darwin":
        return f"macosx_12_0_{machine}"
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def library_name(tag: str) -> str:
    """The library's file name in a wheel for the platform tag (a wheel may be built on another OS)."""
    if tag.startswith("win"):
        return LIBRARY_NAMES["win32"]
    if tag.startswith("macosx"):
        return LIBRARY_NAMES["darwin"]
    return LIBRARY_NAMES["linux"]


def go_target() -> tuple[str, str]:
    goos = "linux" if sys.platform.startswith("linux") else {"darwin": "darwin", "win32": "windows"}[sys.platform]
    machine = platform.machine().lower()
    goarch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[machine]
    return goos, goarch


class CustomBuildHook(BuildHookInterface):  # pyright: ignore[reportMissingTypeArgument]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if version == "editable":  # the package is imported from the source tree: put them there
            built = self._build_with_go()
            self._build_compiled(built / library_name(platform_tag()))
            for name in (library_name(platform_tag()), "channels_nats.h", cffi_build.MODULE_FILE):
                if (built / name).is_file():
                    shutil.copy2(built / name, Path(self.root) / "channels_nats" / name)
            return
        prebuilt = os.environ.get("CHANNELS_NATS_PREBUILT")
        if prebuilt:
            source = Path(prebuilt)
            tag = os.environ.get("CHANNELS_NATS_PLATFORM_TAG", platform_tag())
        else:
            source = self._build_with_go()
            tag = platform_tag()
        name = library_name(tag)
        library = source / name
        header = source / "channels_nats.h"
        for path in (library, header):
            if not path.is_file():
                raise RuntimeError(f"channels-nats: {path} is missing")
        build_data["force_include"][str(library)] = f"channels_nats/{name}"
        build_data["force_include"][str(header)] = "channels_nats/channels_nats.h"
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{tag}"
        compiled = source / cffi_build.MODULE_FILE
        if not prebuilt:
            compiled = self._build_compiled(library)
        if compiled is not None and compiled.is_file():
            build_data["force_include"][str(compiled)] = f"channels_nats/{cffi_build.MODULE_FILE}"
            build_data["tag"] = f"cp310-abi3-{tag}"  # a stable-ABI extension: CPython 3.10 and later

    def _build_compiled(self, library: Path) -> Path | None:
        """The compiled cffi module beside library, or None (the package then uses ABI mode)."""
        reason = cffi_build.unavailable()
        if reason is not None:
            self.app.display_warning(f"channels-nats: no compiled cffi module: {reason}; calls go through ABI mode")
            return None
        self.app.display_info("channels-nats: compiling the cffi module")
        try:
            return cffi_build.build(library)
        except (OSError, subprocess.CalledProcessError) as e:  # the package works without it
            self.app.display_warning(f"channels-nats: compiling the cffi module failed ({e}); using ABI mode")
            return None

    def _build_with_go(self) -> Path:
        here = Path(self.root)
        for go_root in (here.parent, here / "go"):
            if (go_root / "go.mod").is_file() and (go_root / "capi" / "build.sh").is_file():
                break
        else:
            raise RuntimeError("channels-nats: no Go sources found to build the native library from")
        if shutil.which("go") is None:
            raise RuntimeError(
                "channels-nats: building from source needs Go 1.26 or later on PATH (https://go.dev/dl/); "
                "or install a platform wheel, or set CHANNELS_NATS_PREBUILT to a directory with a built library"
            )
        goos, goarch = go_target()
        self.app.display_info(f"channels-nats: building the native library with Go ({goos}/{goarch})")
        try:
            subprocess.run(["bash", str(go_root / "capi" / "build.sh"), goos, goarch], check=True)
        except FileNotFoundError as e:
            raise RuntimeError("channels-nats: building from source needs bash and Go on PATH") from e
        return go_root / "build" / f"{goos}-{goarch}"

"""Checks one platform wheel of channels-nats against the package it was built from.

    python wheels/check_wheel.py WHEEL --tag PLATFORM-TAG [--compiled] [--extract DIR] [--auditwheel]

- The file name and the WHEEL file carry exactly the py3-none-<platform> tags of PLATFORM-TAG
  (a compressed tag set such as manylinux_2_17_x86_64.manylinux2014_x86_64 gives one tag each),
  or with --compiled the cp310-abi3-<platform> ones, and the wheel is not marked pure Python.
- METADATA names channels-nats with the version, Python floor and dependencies of
  python/pyproject.toml.
- The package holds every module of python/channels_nats, py.typed, the header, and the native
  library under the file name of that platform (and no other platform's library); with
  --compiled also the compiled cffi module (python/cffi_build.py), without it none.
- RECORD lists every file with its right SHA-256 and size.
- The library is under 8 MiB.
- --auditwheel (Linux tags): `auditwheel show` finds no external library and a glibc baseline no
  newer than the tag's, for the tag's CPU.
- --extract DIR writes the library and the header to DIR for further checks.

Prints one line with the wheel's and the library's sizes; exits non-zero with the reason.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "channels_nats"
COMPILED_MODULE = "_cffi.abi3.so"  # python/cffi_build.py
MODULE_INITS = (b"PyInit__cffi", b"PyInit__fastpath")  # the two modules the file holds
LIBRARIES = {"win": "channels_nats.dll", "macosx": "libchannels_nats.dylib", "manylinux": "libchannels_nats.so"}
LIBRARY_LIMIT = 8 * 1024 * 1024


class WheelError(Exception):
    """A check failed; the message says which."""


def project() -> tuple[str, str, set[str]]:
    """The version, Python floor and dependencies that python/pyproject.toml declares."""
    text = (REPO / "python" / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', text, re.M)
    python = re.search(r'^requires-python = "([^"]+)"', text, re.M)
    deps = re.search(r"^dependencies = \[([^\]]*)\]", text, re.M)
    if not (version and python and deps):
        raise WheelError("cannot read version, requires-python and dependencies from python/pyproject.toml")
    return version[1], python[1], set(re.findall(r'"([^"]+)"', deps[1]))


def library_name(tag: str) -> str:
    for prefix, name in LIBRARIES.items():
        if tag.startswith(prefix):
            return name
    raise WheelError(f"no library name is known for the platform tag {tag}")


def check_name_and_tags(wheel: zipfile.ZipFile, path: Path, tag: str, version: str, compiled: bool) -> str:
    """Returns the .dist-info directory name."""
    python_abi = "cp310-abi3" if compiled else "py3-none"
    want_name = f"{PACKAGE}-{version}-{python_abi}-{tag}.whl"
    if path.name != want_name:
        raise WheelError(f"the file is named {path.name}, not {want_name}")
    info = f"{PACKAGE}-{version}.dist-info"
    fields = Parser().parsestr(wheel.read(f"{info}/WHEEL").decode())
    tags = set(fields.get_all("Tag") or [])
    want_tags = {f"{python_abi}-{platform}" for platform in tag.split(".")}
    if tags != want_tags:
        raise WheelError(f"WHEEL has the tags {sorted(tags)}, not {sorted(want_tags)}")
    if fields["Root-Is-Purelib"] != "false" or fields["Wheel-Version"] != "1.0":
        raise WheelError(f"WHEEL must say Wheel-Version 1.0 and Root-Is-Purelib false:\n{fields}")
    return info


def check_metadata(wheel: zipfile.ZipFile, info: str, version: str, python: str, deps: set[str]) -> None:
    meta = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    found = (meta["Name"], meta["Version"], meta["Requires-Python"], set(meta.get_all("Requires-Dist") or []))
    want = ("channels-nats", version, python, deps)
    if found != want:
        raise WheelError(f"METADATA says (name, version, python, dependencies) {found}, not {want}")


def check_contents(wheel: zipfile.ZipFile, info: str, library: str, compiled: bool) -> None:
    names = {n for n in wheel.namelist() if not n.endswith("/")}
    modules = {f"{PACKAGE}/{p.name}" for p in (REPO / "python" / PACKAGE).glob("*.py")}
    bundled = ("py.typed", "channels_nats.h", library, *([COMPILED_MODULE] if compiled else []))
    want = modules | {f"{PACKAGE}/{n}" for n in bundled}
    want |= {f"{info}/{n}" for n in ("METADATA", "WHEEL", "RECORD")}
    if names != want:
        raise WheelError(f"the wheel holds {sorted(names - want)} too many and misses {sorted(want - names)}")
    if compiled:
        module = wheel.read(f"{PACKAGE}/{COMPILED_MODULE}")
        for init in MODULE_INITS:
            if init not in module:
                raise WheelError(f"{COMPILED_MODULE} has no {init.decode()}: it was not built by python/cffi_build.py")


def check_record(wheel: zipfile.ZipFile, info: str) -> None:
    record = f"{info}/RECORD"
    listed: set[str] = set()
    for line in wheel.read(record).decode().splitlines():
        name, digest, size = line.rsplit(",", 2)
        listed.add(name)
        if name == record:
            continue
        data = wheel.read(name)
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != want or size != str(len(data)):
            raise WheelError(f"RECORD has a wrong hash or size for {name}")
    unlisted = {n for n in wheel.namelist() if not n.endswith("/")} - listed
    if unlisted:
        raise WheelError(f"RECORD does not list {sorted(unlisted)}")


def check_auditwheel(path: Path, tag: str) -> str:
    """Runs auditwheel show; returns the manylinux tag it says the wheel is consistent with."""
    ours = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+?)(\..*)?", tag)
    if ours is None:
        raise WheelError(f"--auditwheel needs a manylinux tag, not {tag}")
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(path)], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise WheelError(f"auditwheel show failed:\n{shown.stdout}{shown.stderr}")
    report = json.loads(shown.stdout)
    found = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", report["overall_tag"])
    if found is None or found[3] != ours[3]:
        raise WheelError(f"auditwheel sees {report['overall_tag']}, not a {ours[3]} manylinux wheel")
    if (int(found[1]), int(found[2])) > (int(ours[1]), int(ours[2])):
        raise WheelError(f"auditwheel says {report['overall_tag']}, newer than the tag {tag}")
    if report["external_libs"]:
        raise WheelError(f"auditwheel finds external libraries: {report['external_libs']}")
    return str(report["overall_tag"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--tag", required=True, help="the platform tag the wheel must carry")
    parser.add_argument("--compiled", action="store_true", help="the wheel must hold the compiled cffi module")
    parser.add_argument("--extract", type=Path, help="write the library and the header to this directory")
    parser.add_argument("--auditwheel", action="store_true", help="also run auditwheel show (manylinux tags)")
    args = parser.parse_args()
    path: Path = args.wheel
    tag: str = args.tag
    try:
        version, python, deps = project()
        library = library_name(tag)
        with zipfile.ZipFile(path) as wheel:
            info = check_name_and_tags(wheel, path, tag, version, args.compiled)
            check_metadata(wheel, info, version, python, deps)
            check_contents(wheel, info, library, args.compiled)
            check_record(wheel, info)
            size = wheel.getinfo(f"{PACKAGE}/{library}").file_size
            if size >= LIBRARY_LIMIT:
                raise WheelError(f"the library has {size} bytes, not under {LIBRARY_LIMIT} (8 MiB)")
            if args.extract:
                for name in (library, "channels_nats.h"):
                    target: Path = args.extract / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(f"{PACKAGE}/{name}"))
        audit = f"; auditwheel: {check_auditwheel(path, tag)}" if args.auditwheel else ""
    except (WheelError, OSError, KeyError, zipfile.BadZipFile) as e:
        print(f"check_wheel: {path.name}: FAILED: {e}", file=sys.stderr)
        return 1
    mib = 1024 * 1024
    print(
        f"check_wheel: {path.name}: {path.stat().st_size / mib:.2f} MiB, {library} {size / mib:.2f} MiB"
        f" (limit 8 MiB); tags, METADATA, contents and RECORD right{audit}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks that every place that states the release version agrees: the Python package
(python/pyproject.toml), the Go library (layer.Version), the C library (cn_version() in
capi/wrappers.c) and the newest entry of CHANGELOG.md. With a tag (the release workflow passes the
pushed one, e.g. v1.0.0), the tag must name that version too.

    python wheels/check_version.py [TAG]

Exit status 0 when they agree, 1 with a line per disagreement otherwise."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOURCES = {
    "python/pyproject.toml": r'^version = "([^"]+)"',
    "layer/layer.go": r'^const Version = "([^"]+)"',
    "capi/wrappers.c": r'^#define CN_VERSION_TEXT "([^"]+)"',
    "CHANGELOG.md": r"^## \[(\d[^\]]*)\]",
}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for path, pattern in SOURCES.items():
        match = re.search(pattern, (ROOT / path).read_text(encoding="utf-8"), re.M)
        found[path] = match.group(1) if match else None
    return found


def main(argv: list[str]) -> int:
    found = versions()
    problems = [f"{path}: no version found (pattern {SOURCES[path]})" for path, v in found.items() if v is None]
    stated = {v for v in found.values() if v is not None}
    if len(stated) > 1:
        problems.append("the versions differ: " + ", ".join(f"{path} says {v}" for path, v in found.items()))
    if len(argv) > 1:
        tag = argv[1].removeprefix("refs/tags/")
        if not re.fullmatch(r"v\d+\.\d+\.\d+(?:[-.a-z0-9]*)?", tag):
            problems.append(f"tag {tag!r} is not of the form v<major>.<minor>.<patch>")
        elif stated and tag[1:] not in stated:
            problems.append(f"tag {tag} does not match the package version {', '.join(sorted(stated))}")
    for problem in problems:
        print(f"check_version: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_version: {stated.pop()} everywhere" + (f", and the tag {argv[1]}" if len(argv) > 1 else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

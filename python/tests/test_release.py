"""The release carries one version everywhere, and the release workflow's check refuses a tag that
names another (issue: a release that pip would pick: above the nats-py layer's 0.10.1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from channels_nats import _native

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "wheels" / "check_version.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=30, check=False)


def test_one_version_everywhere_and_above_the_nats_py_layer() -> None:
    done = check()
    assert done.returncode == 0, done.stderr
    version = done.stdout.split()[1]
    assert tuple(int(part) for part in version.split(".")[:3]) > (0, 10, 1)
    assert _native.version() == version  # the library that is loaded says the same


def test_a_tag_of_another_version_is_refused() -> None:
    version = check().stdout.split()[1]
    assert check(f"v{version}").returncode == 0
    refused = check("v0.10.2")
    assert refused.returncode == 1
    assert "does not match" in refused.stderr
    assert check("release-1").returncode == 1

"""How Python calls the library: the compiled cffi module beside it, or cffi's ABI mode.

The suite's library (make test-py) has the compiled module beside it (make accelerator). A
library without one, or with one built from another header, is called in ABI mode: checked in
fresh processes, since a process loads the library once. make install-check and make
wheels-check prove that the wheels which bundle the module use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from channels_nats import _native

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the compiled module is Linux-only")

# A receive that waits, then two that find their messages waiting (the fence's message came
# after them on the same subscription), a backlog whose ready receives yield to the loop every
# READY_STREAK-th time, waiting members of a group that get a dict each, and which receive and
# take functions the loop's queue uses.
ROUND_TRIP = """
import asyncio, sys
from channels_nats import NatsChannelLayer, _native, _results

async def main():
    layer = NatsChannelLayer(servers=sys.argv[1])
    channel, fence = await layer.new_channel(), await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0.2)
    await layer.send(channel, {"type": "mode.check", "n": 1})
    got = [(await asyncio.wait_for(waiting, 10))["n"]]
    for n in (2, 3):
        await layer.send(channel, {"type": "mode.check", "n": n})
    await layer.send(fence, {"type": "mode.fence"})
    await asyncio.wait_for(layer.receive(fence), 10)
    got += [(await layer.receive(channel))["n"] for _ in range(2)]
    # A backlog of 3 streaks after a receive that waited: 2 of its receives yield to the loop.
    streak = _results.READY_STREAK
    fenced = asyncio.ensure_future(layer.receive(fence))
    await asyncio.sleep(0.2)
    for n in range(3 * streak):
        await layer.send(channel, {"type": "mode.backlog", "n": n})
    await layer.send(fence, {"type": "mode.fence"})
    await asyncio.wait_for(fenced, 10)
    turns, spinning = 0, True

    async def spin():
        nonlocal turns
        while spinning:
            turns += 1
            await asyncio.sleep(0)

    spinner = asyncio.ensure_future(spin())
    await asyncio.sleep(0)
    before = turns
    backlog = [(await layer.receive(channel))["n"] for _ in range(3 * streak)]
    yielded, spinning = turns - before, False
    await spinner
    assert backlog == list(range(3 * streak)), backlog
    # Waiting members of a group, settled by one take: a dict each (S9), copied or decoded.
    members = [await layer.new_channel() for _ in range(3)]
    for member in members:
        await layer.group_add("mode-group", member)
    for message in ({"type": "mode.flat", "n": 1}, {"type": "mode.nested", "items": [1]}):
        waiting = [asyncio.ensure_future(layer.receive(member)) for member in members]
        await asyncio.sleep(0.2)
        await layer.group_send("mode-group", message)
        each = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert each == [message] * 3 and len({id(one) for one in each}) == 3, each
        assert "items" not in message or len({id(one["items"]) for one in each}) == 3, each
    queue, fastpath = _results.for_running_loop(), _native.fastpath()
    await layer.close()
    kind = "fastpath" if fastpath is not None and queue.receive is fastpath.receive else "cffi"
    take = "fastpath" if fastpath is not None and queue._take_compiled is fastpath.take else "cffi"
    print(_native.call_mode(), kind, take, *got, "yields", yielded)

asyncio.run(main())
"""


def library_dir() -> Path:
    return _native.library_path().parent


def compiled_module() -> Path:
    """The compiled module beside the suite's library: make accelerator and the Linux x86_64 wheel
    have one; a py3-none wheel (the release workflow's Linux arm64 run) has none."""
    module = library_dir() / _native.COMPILED_MODULE
    if not module.is_file():
        pytest.skip(f"no {_native.COMPILED_MODULE} beside the library under test (a py3-none wheel)")
    return module


def run_round_trip(library: Path, nats_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, _native.LIBRARY_ENV: str(library)}
    return subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, nats_url], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def copy_library(to: Path, with_module: bool) -> Path:
    source = library_dir()
    names = [_native.library_file_name(), "channels_nats.h", *([_native.COMPILED_MODULE] if with_module else [])]
    for name in names:
        shutil.copy2(source / name, to / name)
    return to / _native.library_file_name()


def test_the_suite_calls_through_the_compiled_module() -> None:
    compiled_module()
    assert _native.call_mode() == "compiled"
    assert _native.fastpath() is not None


def test_the_compiled_module_receives_in_one_call(tmp_path: Path, nats_url: str) -> None:
    compiled_module()
    done = run_round_trip(copy_library(tmp_path, with_module=True), nats_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["compiled", "fastpath", "fastpath", "1", "2", "3", "yields", "2"]


def test_without_the_module_abi_mode_does_the_same(tmp_path: Path, nats_url: str) -> None:
    done = run_round_trip(copy_library(tmp_path, with_module=False), nats_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["abi", "cffi", "cffi", "1", "2", "3", "yields", "2"]


def test_a_module_built_from_another_header_is_not_used(tmp_path: Path, nats_url: str) -> None:
    compiled_module()
    library = copy_library(tmp_path, with_module=True)
    header = tmp_path / "channels_nats.h"
    header.write_text(header.read_text(encoding="utf-8") + "\n/* another build */\n", encoding="utf-8")
    done = run_round_trip(library, nats_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["abi", "cffi", "cffi", "1", "2", "3", "yields", "2"]
    assert "was built from another channels_nats.h" in done.stderr


def test_a_module_beside_a_renamed_library_is_not_used(tmp_path: Path, nats_url: str) -> None:
    compiled_module()
    library = copy_library(tmp_path, with_module=True)
    renamed = library.rename(tmp_path / "libchannels_nats-copy.so")
    done = run_round_trip(renamed, nats_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["abi", "cffi", "cffi", "1", "2", "3", "yields", "2"]

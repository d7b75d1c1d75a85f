"""How Python calls the library: the compiled cffi module beside it, or cffi's ABI mode.

The suite's library (make test-py) has the compiled module beside it (make accelerator). A
library without one, or with one built from another header, is called in ABI mode: checked in
fresh processes, since a process loads the library once. make install-check and make
wheels-check prove that the wheels which bundle the module use it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import unique

from channels_nats import NatsChannelLayer, _native, _results

MakeLayer = Callable[..., NatsChannelLayer]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the compiled module is Linux-only")

# A receive that waits, then two that find their messages waiting (the fence's message came
# after them on the same subscription), a backlog whose ready receives yield to the loop every
# READY_STREAK-th time, members of a group that get a dict each, and which receive and take
# functions the loop's queue uses. The members' messages are checked twice: settled by a take
# for receives that wait, and taken by receives that find them waiting.
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
    # Receives that wait, one after another on a channel, start the last one over
    # (cn_receive with no name) and wait as the same op, and a receive after a flush starts anew.
    # Any take between two receives (a result or a read event of the connection on this loop,
    # which a slow spell makes likelier) ends the chance to start over: the next receive is made
    # by name, as it must be. So of the four receives after a first, at least one starts over.
    queue, ops = _results.for_running_loop(), []
    for n in range(1, 7):
        if n == 6:
            await layer.flush()
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0.1)
        ops += [op for op, (_, _, sending) in queue.waiting.items() if not sending]
        await layer.send(channel, {"type": "mode.again", "n": n})
        assert (await asyncio.wait_for(waiting, 10))["n"] == n
    assert len(ops) == 6 and any(a == b for a, b in zip(ops[:4], ops[1:5])) and ops[5] not in ops[:5], ops
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
    # The same messages waiting in each member's mailbox, taken by receives that find them there:
    # a dict each too, one a consumer changed included.
    for message in ({"type": "mode.flat", "n": 2}, {"type": "mode.nested", "items": [2]}):
        fenced = asyncio.ensure_future(layer.receive(fence))
        await asyncio.sleep(0.2)
        await layer.group_send("mode-group", message)
        await layer.send(fence, {"type": "mode.fence"})
        await asyncio.wait_for(fenced, 10)
        first = await layer.receive(members[0])
        first["changed"] = True
        each = [first] + [await layer.receive(member) for member in members[1:]]
        assert each[1:] == [message] * 2 and len({id(one) for one in each}) == 3, each
        assert "items" not in message or len({id(one["items"]) for one in each}) == 3, each
    queue, fastpath = _results.for_running_loop(), _native.fastpath()
    await layer.close()
    kind = "fastpath" if fastpath is not None and queue.receive is fastpath.receive else "cffi"
    again = "fastpath" if fastpath is not None and queue.receive_again is fastpath.receive_again else "cffi"
    assert again == kind, (again, kind)
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


async def test_members_finding_one_group_message_waiting_share_its_decode(make_layer: MakeLayer) -> None:
    """A group message waiting in several members' mailboxes is decoded once for their receives
    when its values are immutable, and once per receive when they are not; each receive gets a
    dict of its own (S9). Bodies equal byte for byte share a decode, any other body gets its own,
    in order."""
    compiled_module()
    fastpath = _native.fastpath()
    assert fastpath is not None
    layer = make_layer(capacity=1000)
    members = [await layer.new_channel() for _ in range(3)]
    fence, group = await layer.new_channel(), unique("decode")
    for member in members:
        await layer.group_add(group, member)
    decodes = 0

    def counting(body: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return msgpack.unpackb(body)

    async def fenced(send: Any) -> None:
        """send(), then waits until what it sent is in the mailboxes (S10)."""
        waiting = asyncio.ensure_future(layer.receive(fence))
        await asyncio.sleep(0.2)
        await send()
        await layer.send(fence, {"type": "decode.fence"})
        await asyncio.wait_for(waiting, 10)

    _results.for_running_loop()  # the loop's queue configures the module first
    fastpath.configure(counting, _results.READY_STREAK)  # which forgets every decode kept before
    try:
        for message, want in (({"type": "d.flat", "n": 1}, 1), ({"type": "d.nested", "l": [1]}, 3)):
            await fenced(lambda message=message: layer.group_send(group, message))
            decodes = 0
            each = [await layer.receive(member) for member in members]
            assert decodes == want, (message, decodes)
            assert each == [message] * 3
            assert len({id(one) for one in each}) == 3
        # One channel, bodies that repeat among others: each receive gets what was sent, in order.
        # Fixed bytes, so that which of them share a set of the module's cache never changes.
        sent = [{"type": "d.mix", "n": n % 5, "pad": "p" * (n % 3)} for n in range(200)]

        async def send_all() -> None:
            for message in sent:
                await layer.send(members[0], message)

        await fenced(send_all)
        decodes = 0
        got = [await layer.receive(members[0]) for _ in sent]
        assert got == sent
        assert decodes == 15, decodes  # the 15 different bodies
        # Another decode function: no decode made by the one before is handed out.
        fastpath.configure(lambda body: {"type": "d.other"}, _results.READY_STREAK)
        await fenced(lambda: layer.send(members[0], sent[0]))
        assert await layer.receive(members[0]) == {"type": "d.other"}
    finally:
        fastpath.configure(msgpack.unpackb, _results.READY_STREAK)

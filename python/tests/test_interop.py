"""Interoperability with the reference layer (SPEC section 3).

A process of this implementation and a process of the reference layer (PyPI "channels-nats"
0.10.x, nats-py based, same import name) on one nats-server must exchange send, group_send and
plain-channel work both ways. The reference needs Python >= 3.13, so it runs in a Debian trixie
root (tests/interop/make-reference-env.sh builds it under build/reference/, once) and is driven
over JSON lines by tests/interop/ref_peer.py; tests/interop/peer.py is the handle on it.

Needs root (debootstrap, chroot, a bind mount of /proc) and, the first time, the Debian mirror
and PyPI. A `nats_url` fixture (a running nats-server) comes from conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.interop

INTEROP_DIR = Path(__file__).resolve().parent / "interop"


def _load_peer_module() -> Any:
    # Loaded by path: tests/interop is not a package, and this works whatever pytest's rootdir
    # and import mode are.
    spec = importlib.util.spec_from_file_location("channels_nats_interop_peer", INTEROP_DIR / "peer.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


peer_module = _load_peer_module()
RefPeer = peer_module.RefPeer

TEST_TIMEOUT = 90.0  # one test, end to end
QUIET = 0.5  # how long "nothing more arrives" is watched for
SETTLE = 0.5  # time for both sides' plain-channel subscriptions to reach the server
WORK_CHANNEL = "interop-work"

# Every type a Channels message may carry through msgpack, with the edges that tell bin from
# str and int from bool.
TYPES_MESSAGE: dict[str, Any] = {
    "type": "interop.types",
    "bin": b"\x00\x01\xfe\xff",
    "empty_bin": b"",
    "text": "h\u00e9llo \u2713",
    "empty_text": "",
    "digits_text": "123",
    "big": 2**62,
    "negative": -(2**62),
    "zero": 0,
    "float": 1.5,
    "float_fraction": -0.1,
    "none": None,
    "yes": True,
    "no": False,
    "list": [1, "two", None, b"\x03", [2.5, {"k": b"v"}]],
    "empty_list": [],
    "nested": {"a": {"b": {"c": [True, None, "x"]}}, "bytes": b"\x10", "empty": {}},
}


# --- helpers ------------------------------------------------------------------------------


def run(coro: Any) -> Any:
    """Run one test's coroutine on a fresh loop, bounded so a hang fails instead of stalling."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, TEST_TIMEOUT)

    return asyncio.run(bounded())


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def assert_same(got: Any, want: Any, path: str = "message") -> None:
    """Equal, and of the same type at every depth (bytes stay bytes, True is not 1)."""
    assert type(got) is type(want), (
        f"{path}: received {type(got).__name__} {got!r}, sent {type(want).__name__} {want!r}"
    )
    if isinstance(want, dict):
        assert set(got) == set(want), f"{path}: keys {sorted(got)} received, {sorted(want)} sent"
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{path}: {len(got)} items received, {len(want)} sent"
        for index, (got_item, want_item) in enumerate(zip(got, want, strict=True)):
            assert_same(got_item, want_item, f"{path}[{index}]")
    else:
        assert got == want, f"{path}: received {got!r}, sent {want!r}"


def ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply.get("ok") is True, f"reference peer: {reply}"
    return reply


@contextlib.asynccontextmanager
async def our_layer(cls: type, url: str) -> AsyncIterator[Any]:
    layer = cls(servers=[url])
    try:
        yield layer
    finally:
        await layer.close()


async def our_receive(layer: Any, channel: str, timeout: float = 5.0) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(layer.receive(channel), timeout)
    except asyncio.TimeoutError:
        pytest.fail(f"our layer received nothing on {channel} within {timeout}s")


async def our_nothing_more(layer: Any, channel: str, timeout: float = QUIET) -> None:
    try:
        extra = await asyncio.wait_for(layer.receive(channel), timeout)
    except asyncio.TimeoutError:
        return
    pytest.fail(f"our layer received a second copy on {channel}: {extra!r}")


async def ref_receive(peer: Any, channel: str, timeout: float = 5.0) -> dict[str, Any]:
    reply = await peer.acall("receive", channel=channel, timeout=timeout)
    assert reply.get("ok") is True, f"the reference received nothing on {channel}: {reply}"
    return reply["message"]


async def ref_nothing_more(peer: Any, channel: str, timeout: float = QUIET) -> None:
    reply = await peer.acall("receive", channel=channel, timeout=timeout)
    assert reply == {"id": reply.get("id"), "ok": False, "error": "timeout"}, (
        f"the reference received a second copy on {channel}: {reply}"
    )


async def our_drain(layer: Any, channel: str, idle: float) -> list[dict[str, Any]]:
    """Receive until nothing arrives for `idle` seconds."""
    got = []
    while True:
        try:
            got.append(await asyncio.wait_for(layer.receive(channel), idle))
        except asyncio.TimeoutError:
            return got


async def ref_drain(peer: Any, channel: str, idle: float) -> list[dict[str, Any]]:
    return ok(await peer.acall("drain", channel=channel, timeout=idle))["messages"]


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def reference_env() -> Path:
    """The trixie root with the reference layer; built on first use (about a minute)."""
    script = INTEROP_DIR / "make-reference-env.sh"
    try:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{script} did not finish within {error.timeout}s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{script} exited with status {done.returncode}; the interop tests need the reference layer.\n"
            f"{done.stderr.strip()}\n{done.stdout.strip()[-4000:]}",
            pytrace=False,
        )
    return peer_module.REFERENCE_ROOT


@pytest.fixture(scope="session")
def ours() -> type:
    """Our NatsChannelLayer, after making sure the import is not the reference layer itself
    (both are `channels_nats`; testing the reference against itself would prove nothing)."""
    from channels_nats import NatsChannelLayer

    source = Path(inspect.getsourcefile(NatsChannelLayer) or "")
    text = source.read_text(encoding="utf-8") if source.is_file() else ""
    if re.search(r"^\s*(?:from\s+nats[.\s]|import\s+nats\b)", text, re.MULTILINE):
        pytest.fail(
            f"channels_nats is imported from {source}, which uses nats-py: that is the reference layer",
            pytrace=False,
        )
    return NatsChannelLayer


@pytest.fixture
def ref(reference_env: Path, nats_url: str) -> Any:
    """One reference-layer process (one NatsChannelLayer, one loop) on the test's server."""
    peer = RefPeer(nats_url, root=reference_env)
    try:
        assert str(peer.info.get("version", "")).startswith("0.10."), f"reference peer: {peer.info}"
        yield peer
    finally:
        peer.close()


# --- process channels -----------------------------------------------------------------------


def test_reference_sends_to_our_process_channel(ours: type, ref: Any, nats_url: str) -> None:
    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            channel = await layer.new_channel()
            ok(await ref.acall("send", channel=channel, message={"type": "from.reference", "n": 1}))
            assert await our_receive(layer, channel) == {"type": "from.reference", "n": 1}
            await our_nothing_more(layer, channel)

    run(main())


def test_we_send_to_reference_process_channel(ours: type, ref: Any, nats_url: str) -> None:
    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            channel = ok(await ref.acall("new_channel"))["channel"]
            receiving = asyncio.ensure_future(ref_receive(ref, channel))
            await layer.send(channel, {"type": "from.ours", "n": 2})
            assert await receiving == {"type": "from.ours", "n": 2}
            await ref_nothing_more(ref, channel)

    run(main())


def test_process_channels_both_ways_in_one_conversation(ours: type, ref: Any, nats_url: str) -> None:
    """A request/reply exchange: each side answers on the channel the other one named."""

    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            mine = await layer.new_channel()
            theirs = ok(await ref.acall("new_channel"))["channel"]
            for n in range(5):
                await layer.send(theirs, {"type": "ping", "n": n, "reply_to": mine})
                ping = await ref_receive(ref, theirs)
                assert ping == {"type": "ping", "n": n, "reply_to": mine}
                ok(await ref.acall("send", channel=ping["reply_to"], message={"type": "pong", "n": n}))
                assert await our_receive(layer, mine) == {"type": "pong", "n": n}

    run(main())


# --- groups ---------------------------------------------------------------------------------


def test_our_group_send_reaches_reference_member(ours: type, ref: Any, nats_url: str) -> None:
    async def main() -> None:
        group = unique("interop-g")
        async with our_layer(ours, nats_url) as layer:
            member = ok(await ref.acall("new_channel"))["channel"]
            ok(await ref.acall("group_add", group=group, channel=member))
            await layer.group_send(group, {"type": "group.from.ours"})
            assert await ref_receive(ref, member) == {"type": "group.from.ours"}
            await ref_nothing_more(ref, member)

    run(main())


def test_reference_group_send_reaches_our_member(ours: type, ref: Any, nats_url: str) -> None:
    async def main() -> None:
        group = unique("interop-g")
        async with our_layer(ours, nats_url) as layer:
            member = await layer.new_channel()
            await layer.group_add(group, member)
            ok(await ref.acall("group_send", group=group, message={"type": "group.from.reference"}))
            assert await our_receive(layer, member) == {"type": "group.from.reference"}
            await our_nothing_more(layer, member)

    run(main())


@pytest.mark.parametrize("sender", ["ours", "reference"])
def test_group_with_members_on_both_sides_each_gets_exactly_one(
    ours: type, ref: Any, nats_url: str, sender: str
) -> None:
    """Two process-channel members in each process; every member gets each group message once."""

    async def main() -> None:
        group = unique("interop-mixed")
        async with our_layer(ours, nats_url) as layer:
            our_members = [await layer.new_channel(), await layer.new_channel()]
            for channel in our_members:
                await layer.group_add(group, channel)
            ref_members = [ok(await ref.acall("new_channel"))["channel"] for _ in range(2)]
            for channel in ref_members:
                ok(await ref.acall("group_add", group=group, channel=channel))

            for n in range(3):
                message = {"type": "group.mixed", "n": n, "from": sender}
                if sender == "ours":
                    await layer.group_send(group, message)
                else:
                    ok(await ref.acall("group_send", group=group, message=message))
                got = await asyncio.gather(
                    *(our_receive(layer, channel) for channel in our_members),
                    *(ref_receive(ref, channel) for channel in ref_members),
                )
                assert got == [message] * 4
            await asyncio.gather(
                *(our_nothing_more(layer, channel) for channel in our_members),
                *(ref_nothing_more(ref, channel) for channel in ref_members),
            )

    run(main())


@pytest.mark.parametrize("sender", ["ours", "reference"])
def test_group_plain_member_in_both_processes_gets_one_copy(ours: type, ref: Any, nats_url: str, sender: str) -> None:
    """A plain channel that is a group member in both processes shares the queue group
    `<prefix>.ch.<channel>` (SPEC 3, last row): each group message is delivered once overall."""

    async def main() -> None:
        group = unique("interop-gplain")
        channel = unique("interop-gmember")
        count = 12
        async with our_layer(ours, nats_url) as layer:
            await layer.group_add(group, channel)
            ok(await ref.acall("group_add", group=group, channel=channel))
            for n in range(count):
                message = {"type": "group.plain", "n": n}
                if sender == "ours":
                    await layer.group_send(group, message)
                else:
                    ok(await ref.acall("group_send", group=group, message=message))
            our_got, ref_got = await asyncio.gather(our_drain(layer, channel, 1.5), ref_drain(ref, channel, 1.5))
            delivered = Counter(m["n"] for m in our_got + ref_got)
            assert sorted(delivered) == list(range(count)), f"ours {our_got}, reference {ref_got}"
            assert set(delivered.values()) == {1}, f"duplicates: ours {our_got}, reference {ref_got}"

    run(main())


# --- plain channel work ---------------------------------------------------------------------


@pytest.mark.parametrize("sender", ["ours", "reference", "both"])
def test_plain_channel_work_is_shared_exactly_once(ours: type, ref: Any, nats_url: str, sender: str) -> None:
    """Both processes receive on one plain channel; 20 messages go to exactly one of them each,
    and (queue group `<prefix>.ch.<channel>` on both sides) neither takes them all."""

    async def main() -> None:
        count = 20
        idle = 2.0
        async with our_layer(ours, nats_url) as layer:
            our_side = asyncio.ensure_future(our_drain(layer, WORK_CHANNEL, idle))
            ref_side = asyncio.ensure_future(ref_drain(ref, WORK_CHANNEL, idle))
            await asyncio.sleep(SETTLE)  # both receives subscribe before anything is sent
            for n in range(count):
                message = {"type": "work", "n": n}
                if sender == "ours" or (sender == "both" and n % 2 == 0):
                    await layer.send(WORK_CHANNEL, message)
                else:
                    ok(await ref.acall("send", channel=WORK_CHANNEL, message=message))
            our_got, ref_got = await asyncio.gather(our_side, ref_side)
            delivered = Counter(m["n"] for m in our_got + ref_got)
            summary = f"ours got {sorted(m['n'] for m in our_got)}, reference got {sorted(m['n'] for m in ref_got)}"
            assert sorted(delivered) == list(range(count)), f"lost messages: {summary}"
            assert set(delivered.values()) == {1}, f"delivered twice: {summary}"
            # Random queue-group choice: one side getting none of 20 has odds of about 2e-6.
            assert our_got, f"not shared: {summary}"
            assert ref_got, f"not shared: {summary}"

    run(main())


# --- message types --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["send", "group_send"])
def test_message_types_round_trip_reference_to_ours(ours: type, ref: Any, nats_url: str, path: str) -> None:
    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            channel = await layer.new_channel()
            if path == "send":
                ok(await ref.acall("send", channel=channel, message=TYPES_MESSAGE))
            else:
                group = unique("interop-types")
                await layer.group_add(group, channel)
                ok(await ref.acall("group_send", group=group, message=TYPES_MESSAGE))
            assert_same(await our_receive(layer, channel), TYPES_MESSAGE)

    run(main())


@pytest.mark.parametrize("path", ["send", "group_send"])
def test_message_types_round_trip_ours_to_reference(ours: type, ref: Any, nats_url: str, path: str) -> None:
    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            channel = ok(await ref.acall("new_channel"))["channel"]
            if path == "send":
                await layer.send(channel, TYPES_MESSAGE)
            else:
                group = unique("interop-types")
                ok(await ref.acall("group_add", group=group, channel=channel))
                await layer.group_send(group, TYPES_MESSAGE)
            assert_same(await ref_receive(ref, channel), TYPES_MESSAGE)

    run(main())


def test_message_types_survive_a_full_round_trip(ours: type, ref: Any, nats_url: str) -> None:
    """Ours -> reference -> ours: the reference decodes and re-encodes, we decode again."""

    async def main() -> None:
        async with our_layer(ours, nats_url) as layer:
            mine = await layer.new_channel()
            theirs = ok(await ref.acall("new_channel"))["channel"]
            await layer.send(theirs, TYPES_MESSAGE)
            echoed = await ref_receive(ref, theirs)
            ok(await ref.acall("send", channel=mine, message=echoed))
            assert_same(await our_receive(layer, mine), TYPES_MESSAGE)

    run(main())

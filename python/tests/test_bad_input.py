"""Bad input through the Python package against a real nats-server (issue 8, "Bad input").

Foreign frames published raw on every subject kind the layer subscribes to, messages msgpack or
the wire contract cannot carry, oversized messages, and configurations that are valid Python but
hostile for the library. Invalid names and bad frames on a plain channel with a waiting reader
are in test_layer.py.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from channels.exceptions import MessageTooLarge
from conftest import NatsServer, dead_port, pack, raw_send, unique, wait_subscribed, wait_until

from channels_nats import NatsChannelLayer

MakeLayer = Callable[..., NatsChannelLayer]
Message = dict[str, Any]

LOGGER = "channels_nats"
BAD_FRAME_TEXT = "not a Channels message"
MAX_PAYLOAD = 1024 * 1024
CALL_BOUND = 30.0  # no call of a hostile configuration may take longer than this (seconds)


# ---- helpers ---------------------------------------------------------------------------------


def dropped(layer: NatsChannelLayer, kind: str) -> int:
    return int(layer.stats()["dropped"][kind])


def warnings_with(caplog: pytest.LogCaptureFixture, *texts: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and all(t in r.getMessage() for t in texts)
    ]


async def finish(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---- foreign frames on every subject kind (S8, S3) ------------------------------------------

BAD_BODIES: dict[str, bytes] = {
    "array": pack([1, 2, 3]),
    "int-keys": pack({1: "x"}),
    "invalid-byte": b"\xc1",
    "truncated-map": b"\x82\xa4type",
    "text": b"hello, not msgpack",
    "empty": b"",
}
REPEATS = 3  # each foreign frame is published this often: counted every time, logged once


@pytest.mark.parametrize("case", ["no-header", "header-of-another-client", "header-ok-body-not-a-map"])
async def test_foreign_frames_on_the_process_subject(
    make_layer: MakeLayer, nats_server: NatsServer, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """S8, S3: a .pc. frame without a Channel header, with a header naming another client's channel,
    or with a valid header and a body that is not a msgpack map is a bad frame: counted each time,
    logged once, and the waiting receive gets the next good message."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, other, sender = make_layer(), make_layer(), make_layer()
    channel = await layer.new_channel()
    foreign = await other.new_channel()
    subject = "channels.pc." + channel.split("!")[0]
    headers: dict[str, str] | None
    body = pack({"type": "forged"})
    if case == "no-header":
        headers = None
    elif case == "header-of-another-client":
        headers = {"Channel": foreign}
    else:
        headers, body = {"Channel": channel}, pack(["type", "array"])
    reader = asyncio.create_task(layer.receive(channel))
    try:
        await asyncio.to_thread(raw_send, nats_server.port, subject, body, headers, REPEATS)
        await wait_until(lambda: dropped(layer, "bad_frame") == REPEATS, f"{REPEATS} bad frames")
        await asyncio.sleep(0.05)
        assert not reader.done()
        await sender.send(channel, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
        await wait_until(lambda: bool(warnings_with(caplog, BAD_FRAME_TEXT, subject)), "the bad frame warning")
        logged = warnings_with(caplog, BAD_FRAME_TEXT, subject)
        assert len(logged) == 1, [r.getMessage() for r in caplog.records]
        stats = layer.stats()
        assert stats["dropped"]["no_mailbox"] == 0
        assert stats["delivered"] == 1
        assert dropped(other, "bad_frame") == 0
    finally:
        await finish([reader])


async def test_a_process_frame_for_a_channel_nobody_has_is_no_mailbox(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """S8, docs/semantics.md: a well-formed .pc. frame whose Channel header names a channel of this
    client that does not exist is counted as no_mailbox; the real channel keeps working."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    nonlocal_part = channel.split("!")[0]
    missing = nonlocal_part + "!" + uuid.uuid4().hex
    reader = asyncio.create_task(layer.receive(channel))
    try:
        body = pack({"type": "to-nobody"})
        await asyncio.to_thread(
            raw_send, nats_server.port, "channels.pc." + nonlocal_part, body, {"Channel": missing}, 2
        )
        await wait_until(lambda: dropped(layer, "no_mailbox") == 2, "2 no_mailbox drops")
        assert dropped(layer, "bad_frame") == 0
        assert not reader.done()
        await sender.send(channel, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
    finally:
        await finish([reader])


async def test_no_mailbox_drops_are_logged_once(
    make_layer: MakeLayer, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer = make_layer()
    channel = await layer.new_channel()
    nonlocal_part = channel.split("!")[0]
    missing = nonlocal_part + "!" + uuid.uuid4().hex
    body = pack({"type": "to-nobody"})
    await asyncio.to_thread(raw_send, nats_server.port, "channels.pc." + nonlocal_part, body, {"Channel": missing}, 3)
    await wait_until(lambda: dropped(layer, "no_mailbox") == 3, "3 no_mailbox drops")
    await asyncio.sleep(0.1)
    assert len([r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]) == 1


async def test_foreign_frames_on_a_plain_channel_subject_with_headers(
    make_layer: MakeLayer, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """S8: on .ch. every kind of non-map body is a bad frame, with or without (ignored) headers."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(), make_layer()
    name = unique("bad-plain")
    subject = f"channels.ch.{name}"
    reader = asyncio.create_task(layer.receive(name))
    try:
        await wait_subscribed(nats_server, subject)
        for body in BAD_BODIES.values():
            await asyncio.to_thread(raw_send, nats_server.port, subject, body, {"Channel": "x!y", "X-Junk": "1"})
        await wait_until(lambda: dropped(layer, "bad_frame") == len(BAD_BODIES), "every bad body counted")
        assert not reader.done()
        await sender.send(name, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
        await wait_until(lambda: bool(warnings_with(caplog, BAD_FRAME_TEXT, subject)), "the bad frame warning")
        assert len(warnings_with(caplog, BAD_FRAME_TEXT, subject)) == 1
    finally:
        await finish([reader])


@pytest.mark.parametrize("member", ["process", "plain"])
async def test_foreign_frames_on_a_group_subject(
    make_layer: MakeLayer, nats_server: NatsServer, caplog: pytest.LogCaptureFixture, member: str
) -> None:
    """S8, S3: bad frames on .grp. reach the process-member subscription (no queue) and a plain
    member's queue subscription alike: counted, logged once, and the member gets the next
    group_send."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(), make_layer()
    group = unique("bad-grp")
    subject = f"channels.grp.{group}"
    channel = await layer.new_channel() if member == "process" else unique("plain-member")
    await layer.group_add(group, channel)
    reader = asyncio.create_task(layer.receive(channel))
    try:
        await wait_subscribed(nats_server, subject)
        for body in BAD_BODIES.values():
            await asyncio.to_thread(raw_send, nats_server.port, subject, body)
        await asyncio.to_thread(raw_send, nats_server.port, subject, BAD_BODIES["array"], {"Channel": channel})
        expected = len(BAD_BODIES) + 1
        await wait_until(lambda: dropped(layer, "bad_frame") == expected, f"{expected} bad frames")
        await asyncio.sleep(0.05)
        assert not reader.done()
        await sender.group_send(group, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
        await wait_until(lambda: bool(warnings_with(caplog, BAD_FRAME_TEXT, subject)), "the bad frame warning")
        assert len(warnings_with(caplog, BAD_FRAME_TEXT, subject)) == 1
        assert dropped(layer, "no_mailbox") == 0
    finally:
        await finish([reader])


# ---- messages the wire cannot carry (S8, C5) -------------------------------------------------


class Opaque:
    pass


def deep(levels: int) -> Message:
    message: Message = {"type": "deep"}
    for _ in range(levels):
        message = {"type": "deep", "inner": message}
    return message


UNENCODABLE: list[Any] = [
    {"type": "x", "set": {1, 2}},
    {"type": "x", "frozenset": frozenset()},
    {"type": "x", "object": Opaque()},
    {"type": "x", "class": Opaque},
    {"type": "x", "big": 2**70},
    {"type": "x", "negbig": -(2**70)},
    {"type": "x", "complex": 1j},
    {"type": "x", "decimal": decimal.Decimal("1.5")},
    {"type": "x", "when": datetime.datetime(2024, 1, 1)},
    {"type": "x", "pattern": re.compile("x")},
    {b"type": "bytes key"},
    {"type": "x", "nested": {"deeper": {2: "int key"}}},
    {"type": "x", "list": [[{None: 1}]]},
    {"type": "x", "float-key": {1.5: 1}},
    {"type": "x", "bool-key": {True: 1}},
    {"type": "x", "tuple-key": {(1, 2): 1}},
    deep(2000),
]


async def test_unencodable_messages_raise_type_error_before_sending(make_layer: MakeLayer) -> None:
    """S8: everything msgpack or the wire contract (string keys at every depth) cannot carry is a
    TypeError, and nothing is published; the layer goes on."""
    layer, receiver = make_layer(), make_layer()
    channel = await receiver.new_channel()
    group = unique("unencodable")
    await receiver.group_add(group, channel)
    for message in UNENCODABLE:
        with pytest.raises(TypeError):
            await layer.send(channel, message)
        with pytest.raises(TypeError):
            await layer.group_send(group, message)
    assert layer.stats().get("published", 0) == 0
    nan: Message = {"type": "nan", "v": float("nan"), "inf": float("-inf")}
    await layer.send(channel, nan)
    got = await asyncio.wait_for(receiver.receive(channel), 5)
    assert math.isnan(got["v"])
    assert got["inf"] == float("-inf")
    assert receiver.stats()["dropped"]["bad_frame"] == 0


async def test_oversized_messages_leave_the_connection_usable(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """S7: a burst of oversized sends to every kind of target raises MessageTooLarge each time; the
    connection stays up and good messages in between are all delivered."""
    layer, receiver = make_layer(), make_layer()
    channel = await receiver.new_channel()
    group = unique("big")
    await receiver.group_add(group, channel)
    plain = unique("big-plain")
    huge: Message = {"type": "huge", "data": b"x" * (MAX_PAYLOAD + 1)}
    very_huge: Message = {"type": "huge", "data": b"x" * (8 * MAX_PAYLOAD)}
    for i in range(20):
        for target in (channel, plain):
            with pytest.raises(MessageTooLarge):
                await layer.send(target, huge if i % 2 else very_huge)
        with pytest.raises(MessageTooLarge):
            await layer.group_send(group, huge)
        await layer.send(channel, {"type": "ok", "i": i})
    for i in range(20):
        assert await asyncio.wait_for(receiver.receive(channel), 5) == {"type": "ok", "i": i}
    stats = layer.stats()
    assert stats["connected"] is True
    assert stats["published"] == 20
    assert stats["reconnects"] == 0


# ---- hostile configuration over the C ABI ----------------------------------------------------


async def first_use(layer: NatsChannelLayer) -> None:
    """The first call connects, which is where the library reads the configuration."""
    try:
        await asyncio.wait_for(layer.new_channel(), CALL_BOUND)
    finally:
        await asyncio.wait_for(layer.close(), CALL_BOUND)


def hostile_configs(nats_url: str) -> dict[str, dict[str, Any]]:
    dead = dead_port()
    return {
        "negative-connect-timeout": {"connect_options": {"connect_timeout": -1}},
        "negative-drain-timeout": {"connect_options": {"drain_timeout": -0.5, "flush_timeout": -1e9}},
        "negative-reconnect-wait": {"connect_options": {"reconnect_time_wait": -3}},
        "capacity-10**30": {"capacity": 10**30},
        "channel-capacity-10**30": {"channel_capacity": {"x*": 10**30}},
        "channel-capacity-zero": {"channel_capacity": {"x*": 0}},
        "max-reconnects-10**30": {"connect_options": {"max_reconnect_attempts": 10**30}},
        "max-reconnects-minus-5": {"connect_options": {"max_reconnect_attempts": -5}},
        "pending-limit-negative": {"connect_options": {"pending_msgs_limit": -1}},
        "expiry-nan": {"expiry": float("nan")},
        "expiry-inf": {"mailbox_grace": float("inf")},
        "expiry-1e300": {"expiry": 1e300},
        "regex-python-only": {"channel_capacity": [{"regex": r"(?=x)x", "capacity": 2}]},
        "regex-backreference": {"channel_capacity": {re.compile(r"(a)\1"): 2}},
        "tls-cert-without-key": {"connect_options": {"tls_cert": "/nonexistent/cert.pem"}},
        "prefix-1mb": {"prefix": "p" * (1 << 20)},
        "prefix-wildcard": {"prefix": "a.>"},
        "connect-option-wrong-type": {"connect_options": {"connect_timeout": "soon", "name": 5}},
        "token-1mb": {"connect_options": {"token": "t" * (1 << 20), "connect_timeout": 2}},
        "name-1mb": {"connect_options": {"name": "n" * (1 << 20), "connect_timeout": 2}},
        "servers-1000-garbage": {
            "servers": [
                f"nats://127.0.0.1:{dead}"
                if i % 4 == 0
                else ("nats://127.0.0.1:99999", "nats://[::1", "%zz:4222")[i % 3]
                for i in range(1000)
            ],
            "connect_options": {"connect_timeout": 0.5, "max_reconnect_attempts": 0},
        },
        "servers-nul-bytes": {"servers": ["nats://127.0.0.1:4222\x00x", "\x00"]},
    }


HOSTILE_NAMES = list(hostile_configs("nats://127.0.0.1:4222"))


@pytest.mark.parametrize("name", HOSTILE_NAMES)
async def test_hostile_configs_fail_cleanly(name: str, nats_url: str, make_layer: MakeLayer) -> None:
    """Configs that are valid Python but hostile for the library raise TypeError, ValueError or
    ConnectionError (at construction or first use) within a bound, or work; never crash or hang."""
    config = hostile_configs(nats_url)[name]
    started = time.monotonic()
    outcome, text = "ok", ""
    try:
        layer = make_layer(**config)
        await first_use(layer)
    except (TypeError, ValueError, ConnectionError) as e:
        text = str(e)
        outcome = f"{type(e).__name__}: {text[:200]}"
    assert len(text) < 64 * 1024, "the error text carries the hostile input whole"
    elapsed = time.monotonic() - started
    print(f"hostile config {name}: {outcome} in {elapsed:.2f} s")
    assert elapsed < CALL_BOUND
    # The library is still usable after the hostile config.
    good = make_layer()
    channel = await good.new_channel()
    await good.send(channel, {"type": "after"})
    assert await asyncio.wait_for(good.receive(channel), 5) == {"type": "after"}


REFUSED = [
    "negative-connect-timeout",
    "negative-drain-timeout",
    "negative-reconnect-wait",
    "capacity-10**30",
    "channel-capacity-10**30",
    "channel-capacity-zero",
    "max-reconnects-10**30",
    "max-reconnects-minus-5",
    "pending-limit-negative",
    "expiry-nan",
    "expiry-inf",
    "expiry-1e300",
    "regex-python-only",
    "regex-backreference",
    "tls-cert-without-key",
    "prefix-1mb",
    "prefix-wildcard",
    "connect-option-wrong-type",
    "servers-1000-garbage",
    "servers-nul-bytes",
]


@pytest.mark.parametrize("name", REFUSED)
async def test_invalid_configs_are_refused(name: str, nats_url: str, make_layer: MakeLayer) -> None:
    """The hostile configs that are invalid are refused, not silently accepted."""
    config = hostile_configs(nats_url)[name]
    refused: Callable[[], Awaitable[None]] = lambda: first_use(make_layer(**config))  # noqa: E731
    with pytest.raises((TypeError, ValueError, ConnectionError)):
        await refused()


async def test_a_python_invalid_regex_in_channel_capacity(make_layer: MakeLayer) -> None:
    """A regex rule Python cannot compile is refused at construction (re.error today, which is
    neither TypeError nor ValueError)."""
    with pytest.raises((TypeError, ValueError, re.error)):
        make_layer(channel_capacity=[{"regex": "(", "capacity": 1}])


async def test_regex_flags_reach_the_library(make_layer: MakeLayer) -> None:
    """channel_capacity with re.IGNORECASE: the library applies the rule too (it drops past the
    pattern's capacity, not the default's); flags it has no form for are refused at once."""
    layer, sender = make_layer(capacity=50, channel_capacity={re.compile("WEB", re.I): 2}), make_layer()
    channel = await layer.new_channel("web")
    for n in range(5):
        await sender.send(channel, {"type": "t", "n": n})
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 3, "3 capacity drops")
    with pytest.raises(TypeError, match="VERBOSE"):
        NatsChannelLayer(channel_capacity={re.compile("web", re.X): 2})


def test_connect_options_values_are_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'max_pings_outstanding' and 'max_outstanding_pings'"):
        NatsChannelLayer(connect_options={"max_pings_outstanding": 2, "max_outstanding_pings": 2})
    with pytest.raises(TypeError, match="'token' must be a string"):
        NatsChannelLayer(connect_options={"token": lambda: "t"})
    path = tmp_path / "seed.nk"
    layer = NatsChannelLayer(connect_options={"nkey_seed": path})
    assert str(path) in layer._config.decode()  # pyright: ignore[reportPrivateUsage]

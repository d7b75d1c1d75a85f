"""NatsChannelLayer through its public API against real nats-servers.

Each test names the rules it holds: S1-S21 and section 3 of SPEC.md, the reference layer's tests
(anchor section 5a, "ref N") and the Channels checklist (C1-C25). Layers made with make_layer
stand for separate processes; nothing here reads private attributes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull, MessageTooLarge
from channels.layers import BaseChannelLayer
from conftest import NatsServer, dead_port, pack, raw_send, unique, wait_subscribed, wait_until

import channels_nats
from channels_nats import ChannelLayerClosed, NatsChannelLayer, _results

MakeLayer = Callable[..., NatsChannelLayer]
Message = dict[str, Any]

LOGGER = "channels_nats"
MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload
FAST_RECONNECT: dict[str, Any] = {"reconnect_time_wait": 0.1, "drain_timeout": 0.5}
NEW_CHANNEL_NAME = re.compile(r"^specific\.[0-9a-f]{12}![0-9a-f]{32}$")


# ---- helpers ---------------------------------------------------------------------------------


def warnings_with(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING and text in r.getMessage()]


async def times_out(awaitable: Awaitable[Any], timeout: float = 0.3) -> bool:
    """True when awaitable did not finish within timeout (it is cancelled then)."""
    try:
        await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        return True
    return False


async def receive(layer: NatsChannelLayer, channel: str, timeout: float = 5) -> Message:
    return await asyncio.wait_for(layer.receive(channel), timeout)


async def finish(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancels and awaits tasks that a test left waiting."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def django_settings() -> None:
    """Django settings for get_channel_layer(): configured once, minimal, if nobody did it."""
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        settings.configure()


# ---- API surface (S15, S2, S7, C16, C19) -----------------------------------------------------


def test_api_surface() -> None:
    layer = NatsChannelLayer()
    assert isinstance(layer, BaseChannelLayer)
    assert layer.extensions == ["groups"]  # S15: flush is process-local, so not the spec's "flush"
    assert layer.MessageTooLarge is MessageTooLarge
    assert layer.ChannelFull is ChannelFull
    assert issubclass(ChannelLayerClosed, RuntimeError)
    assert channels_nats.ChannelLayerClosed is ChannelLayerClosed
    assert {"ChannelLayerClosed", "NatsChannelLayer", "__version__"} <= set(channels_nats.__all__)
    for name in ("send", "receive", "new_channel", "group_add", "group_discard", "group_send", "flush", "close"):
        assert inspect.iscoroutinefunction(getattr(layer, name)), name  # channels_redis pubsub #14
    assert layer.stats() == {}  # S20: nothing before the first connection


def test_constructor_needs_no_loop_and_does_no_io(own_nats_server: NatsServer) -> None:
    """C16, Channels test_layers #3: override_settings builds layers repeatedly from sync code."""
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    layers = [NatsChannelLayer(servers=own_nats_server.url, capacity=5, expiry=3) for _ in range(200)]
    unreachable = [NatsChannelLayer(servers=f"nats://127.0.0.1:{dead_port()}") for _ in range(20)]
    assert own_nats_server.num_connections() == 0
    assert layers[0].capacity == 5
    assert layers[0].expiry == 3
    assert all(layer.stats() == {} for layer in layers + unreachable)


async def test_get_channel_layer_builds_a_nats_layer(django_settings: None, nats_url: str) -> None:
    """SPEC section 1: one settings block; Channels test_layers #2-3 (expiry, override_settings)."""
    from channels.layers import get_channel_layer
    from django.test import override_settings

    config = {"servers": [nats_url], "expiry": 100500, "capacity": 7, "prefix": unique("gcl")}
    settings_block = {"default": {"BACKEND": "channels_nats.NatsChannelLayer", "CONFIG": config}}
    with override_settings(CHANNEL_LAYERS=settings_block):
        layer = get_channel_layer()
        assert isinstance(layer, NatsChannelLayer)
        try:
            assert get_channel_layer() is layer
            assert layer.expiry == 100500
            assert layer.capacity == 7
            channel = await layer.new_channel()
            await layer.send(channel, {"type": "hello"})
            assert await receive(layer, channel) == {"type": "hello"}
        finally:
            await layer.close()
    with override_settings(CHANNEL_LAYERS={}):
        assert get_channel_layer() is None


def test_unknown_config_key_lists_the_known_keys() -> None:
    """S19."""
    with pytest.raises(TypeError) as raised:
        NatsChannelLayer(servers="nats://127.0.0.1:4222", hosts=["redis://x"])
    text = str(raised.value)
    assert "hosts" in text
    for key in ("servers", "prefix", "expiry", "capacity", "channel_capacity", "group_expiry", "connect_options"):
        assert key in text, key


def test_unknown_connect_option_is_refused() -> None:
    """S19."""
    with pytest.raises(TypeError) as raised:
        NatsChannelLayer(connect_options={"reconect_time_wait": 1})
    assert "reconect_time_wait" in str(raised.value)
    assert "reconnect_time_wait" in str(raised.value)  # the known keys are listed
    NatsChannelLayer(connect_options={"reconnect_time_wait": 0.5, "name": "x", "max_reconnect_attempts": -1})


@pytest.mark.parametrize(
    "config",
    [
        {"capacity": "x"},
        {"expiry": "soon"},
        {"servers": 5},
        {"servers": [5]},
        {"servers": []},
        {"channel_capacity": {5: 1}},
        {"host_reads": "no"},
        {"host_reads": 0},
    ],
)
def test_bad_config_types_raise_type_error(config: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        NatsChannelLayer(**config)


async def test_an_invalid_prefix_is_refused_at_first_use(make_layer: MakeLayer) -> None:
    """Section 3: a prefix that would make a bad subject is refused with TypeError."""
    layer = make_layer(prefix="bad..prefix")
    with pytest.raises(TypeError):
        await asyncio.wait_for(layer.new_channel(), 10)


async def test_channel_capacity_globs_and_regexes_are_enforced(make_layer: MakeLayer) -> None:
    """S2, ref 16, channels_redis core #4 (replacement): a pattern bounds the matching mailboxes."""
    layer = make_layer(channel_capacity={"tiny*": 1, re.compile(r"pair\."): 2})
    sender = make_layer()
    tiny, pair, normal = await layer.new_channel("tiny"), await layer.new_channel("pair"), await layer.new_channel()
    for channel in (tiny, pair, normal):
        for i in range(4):
            await sender.send(channel, {"type": "n", "i": i})
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 3 + 2, "5 capacity drops")
    assert (await receive(layer, tiny))["i"] == 0
    assert [(await receive(layer, pair))["i"] for _ in range(2)] == [0, 1]
    assert [(await receive(layer, normal))["i"] for _ in range(4)] == [0, 1, 2, 3]
    assert await times_out(layer.receive(tiny))
    assert await times_out(layer.receive(pair))


def test_get_capacity_follows_channel_capacity() -> None:
    """ref 16, BaseChannelLayer.get_capacity: the patterns as Channels reads them."""
    layer = NatsChannelLayer(capacity=9, channel_capacity={"tiny*": 1, re.compile(r"pair\."): 2})
    assert layer.get_capacity("tiny-queue") == 1
    assert layer.get_capacity("pair.abc!def") == 2
    assert layer.get_capacity("specific.abc!def") == 9


async def test_channel_capacity_as_a_list_of_rules(make_layer: MakeLayer) -> None:
    """README (Configuration): channel_capacity may also be a list of {"pattern"|"regex", "capacity"}."""
    layer = make_layer(channel_capacity=[{"pattern": "tiny*", "capacity": 1}, {"regex": r"pair\.", "capacity": 2}])
    sender = make_layer()
    tiny, pair = await layer.new_channel("tiny"), await layer.new_channel("pair")
    for channel in (tiny, pair):
        for i in range(3):
            await sender.send(channel, {"type": "n", "i": i})
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 2 + 1, "3 capacity drops")
    assert (await receive(layer, tiny))["i"] == 0
    assert [(await receive(layer, pair))["i"] for _ in range(2)] == [0, 1]


# ---- names and messages (C1, C5, S8, section 3, ref 36, 71) ---------------------------------

CHANNELS_INVALID_NAMES: list[Any] = ["has space", "bad*name", "¯\\_(ツ)_/¯", "chat" * 25, "", "x?y", 123, None]
NATS_INVALID_NAMES = ["a..b", ".x", "x.", "x\n"]  # Channels accepts them; NATS would misread them


@pytest.mark.parametrize("name", CHANNELS_INVALID_NAMES)
async def test_invalid_names_raise_type_error_before_any_io(make_layer: MakeLayer, name: Any) -> None:
    """C1, ref 36, channels_redis core #7: refused before connecting (the server does not exist)."""
    layer = make_layer(servers=f"nats://127.0.0.1:{dead_port()}")
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: layer.send(name, {"type": "x"}),
        lambda: layer.receive(name),
        lambda: layer.group_add("group", name),
        lambda: layer.group_add(name, "channel"),
        lambda: layer.group_discard("group", name),
        lambda: layer.group_discard(name, "channel"),
        lambda: layer.group_send(name, {"type": "x"}),
    ]
    for call in calls:
        with pytest.raises(TypeError):
            await asyncio.wait_for(call(), 5)
    assert layer.stats() == {}  # never connected


@pytest.mark.parametrize("name", NATS_INVALID_NAMES)
async def test_names_nats_cannot_carry_raise_type_error(make_layer: MakeLayer, name: str) -> None:
    """Section 3: names valid for Channels whose subject NATS would misread are refused."""
    layer = make_layer()
    BaseChannelLayer().require_valid_channel_name(name)  # Channels itself accepts it
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: layer.send(name, {"type": "x"}),
        lambda: layer.send(name + "!local", {"type": "x"}),
        lambda: layer.receive(name),
        lambda: layer.group_add("group", name),
        lambda: layer.group_add(name, "channel"),
        lambda: layer.group_send(name, {"type": "x"}),
    ]
    if not name.endswith("."):  # new_channel("x.") means prefix "x", as new_channel("x!") does
        calls.append(lambda: layer.new_channel(name))
    for call in calls:
        with pytest.raises(TypeError) as raised:
            await asyncio.wait_for(call(), 5)
        assert str(raised.value)  # names the rule
    assert layer.stats().get("published", 0) == 0


async def test_names_nats_cannot_carry_are_refused_without_a_server(make_layer: MakeLayer) -> None:
    """C1 ("before any I/O"), README ("invalid names ... raise TypeError"): the refusal of a name
    NATS cannot carry does not depend on reaching a server."""
    layer = make_layer(servers=f"nats://127.0.0.1:{dead_port()}")
    for name in NATS_INVALID_NAMES:
        for call in name_calls(layer, name):
            with pytest.raises(TypeError):
                await asyncio.wait_for(call(), 5)


def name_calls(layer: NatsChannelLayer, name: str) -> list[Callable[[], Awaitable[Any]]]:
    return [
        lambda: layer.send(name, {"type": "x"}),
        lambda: layer.group_send(name, {"type": "x"}),
        lambda: layer.receive(name),
        lambda: layer.group_add(name, "channel"),
    ]


async def test_bad_messages_are_refused_before_any_io(make_layer: MakeLayer) -> None:
    """C5, S8, ref 36: not a dict, the reserved key and values msgpack cannot carry are TypeErrors,
    from send() and group_send() alike. None of this needs a server."""
    layer = make_layer(servers=f"nats://127.0.0.1:{dead_port()}")
    bad_value: Any = "not a dict"
    for send in (lambda m: layer.send("ch", m), lambda m: layer.group_send("grp", m)):
        with pytest.raises(TypeError, match="must be a dict"):
            await send(bad_value)
        with pytest.raises(TypeError, match="must be a dict"):
            await send(["type", "x"])
        with pytest.raises(TypeError, match="__asgi_channel__ is reserved"):
            await send({"type": "x", "__asgi_channel__": "y"})
        for unpackable in ({"type": "x", "s": {1, 2}}, {"type": "x", "o": object()}, {"type": "x", "i": 2**64}):
            with pytest.raises(TypeError):
                await send(unpackable)
    assert layer.stats() == {}


async def test_non_str_keys_are_refused_at_send(make_layer: MakeLayer) -> None:
    """S8, ref 71: a message the other side could not decode is refused at send, at any depth
    (the reference layer only noticed at receive)."""
    layer = make_layer()
    channel = await layer.new_channel()
    undecodable: list[Any] = [{"type": "x", "nested": {1: "y"}}, {1: "y"}, {"type": "x", "l": [{b"k": 1}]}]
    for message in undecodable:
        with pytest.raises(TypeError):
            await layer.send(channel, message)
        with pytest.raises(TypeError):
            await layer.group_send("grp", message)
    assert layer.stats().get("published", 0) == 0
    await layer.send(channel, {"type": "ok"})
    assert await receive(layer, channel) == {"type": "ok"}


async def test_new_channel_names_are_valid_and_unique(make_layer: MakeLayer) -> None:
    """Section 3, ref 2, channels_redis core #18-19: new names, new client prefixes, despite seeding."""
    layer, other = make_layer(), make_layer()
    random.seed(1)
    first = await layer.new_channel()
    random.seed(1)
    second = await layer.new_channel()
    random.seed(1)
    third = await other.new_channel()
    assert len({first, second, third}) == 3
    for name in (first, second, third):
        assert NEW_CHANNEL_NAME.match(name), name
        layer.require_valid_channel_name(name)
    assert first.split("!")[0] == second.split("!")[0] != third.split("!")[0]
    assert first.split("!")[0] == f"specific.{layer.stats()['client_id']}"
    custom = await layer.new_channel("custom")
    assert custom.startswith(f"custom.{layer.stats()['client_id']}!")


async def test_names_in_steady_use_are_checked_once(make_layer: MakeLayer) -> None:
    """A process that uses 10,000 channel and group names again and again checks each name once
    (a check runs a regular expression), also while names used only once pass through."""
    layer = make_layer()
    checked: list[object] = []
    check_channel, check_group = layer.require_valid_channel_name, layer.require_valid_group_name

    def count_channel(name: object, receive: bool = False) -> bool:
        checked.append(name)
        return check_channel(name, receive)

    def count_group(name: object) -> bool:
        checked.append(name)
        return check_group(name)

    layer.require_valid_channel_name = count_channel  # type: ignore[method-assign]
    layer.require_valid_group_name = count_group  # type: ignore[method-assign]
    steady = [f"steady.{n}" for n in range(10_000)]
    for round_ in range(3):
        for n, name in enumerate(steady):
            await layer.send(name, {"type": "t"})
            await layer.group_send(name, {"type": "t"})
            if n % 2 == 0:
                await layer.send(f"once.{round_}.{n}", {"type": "t"})
        if round_ == 0:
            assert len(checked) == 2 * len(steady) + len(steady) // 2
            checked.clear()
    assert len(checked) == len(steady), f"{len(checked) - len(steady)} steady names were checked again"


# ---- round trips (ref 1-6, 37, 35; S7, S9, S10) ----------------------------------------------


async def test_process_channel_round_trip(make_layer: MakeLayer) -> None:
    """ref 1, channels_redis core #5."""
    layer, other = make_layer(), make_layer()
    channel = await layer.new_channel()
    await other.send(channel, {"type": "test.message", "text": "안녕"})
    assert await receive(layer, channel) == {"type": "test.message", "text": "안녕"}
    await layer.send(channel, {"type": "own"})  # a process sending to itself
    assert await receive(layer, channel) == {"type": "own"}


async def test_plain_channel_receive_then_send(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """ref 3, channels_redis core #1 and #6 (adapted: receive first), S1."""
    layer, other = make_layer(), make_layer()
    name = unique("test-channel")
    reader = asyncio.create_task(layer.receive(name))
    await wait_subscribed(nats_server, f"channels.ch.{name}")
    for i in range(3):
        await other.send(name, {"type": "n", "i": i})
    assert (await asyncio.wait_for(reader, 5))["i"] == 0
    assert [(await receive(layer, name))["i"] for _ in range(2)] == [1, 2]


async def test_group_send_reaches_every_member_in_every_process(make_layer: MakeLayer) -> None:
    """ref 4, channels_redis core #9 and #12: one copy per member, none to a discarded one."""
    a, b, sender = make_layer(), make_layer(), make_layer()
    group = unique("room")
    a1, a2, a3, b1 = await a.new_channel(), await a.new_channel(), await a.new_channel(), await b.new_channel()
    for layer, channel in ((a, a1), (a, a2), (a, a3), (b, b1)):
        await layer.group_add(group, channel)
    await a.group_add(group, a1)  # adding twice is not an error
    await a.group_discard(group, a3)
    await sender.group_send(group, {"type": "hello"})
    for layer, channel in ((a, a1), (a, a2), (b, b1)):
        assert await receive(layer, channel) == {"type": "hello"}
    for layer, channel in ((a, a1), (a, a2), (a, a3), (b, b1)):
        assert await times_out(layer.receive(channel), 0.2), channel  # exactly one copy, none to a3


async def test_group_edge_cases(make_layer: MakeLayer) -> None:
    """C11, channels_redis pubsub #17, rabbitmq #18 and #22: no-op sends and discards."""
    layer = make_layer()
    await layer.group_discard(unique("never-added"), "some-channel")  # before any connection
    await layer.group_send(unique("nobody"), {"type": "x"})
    channel = await layer.new_channel()
    await layer.group_discard(unique("other"), channel)
    group = unique("g")
    await layer.group_add(group, channel)
    await layer.group_discard(group, channel)
    await layer.group_discard(group, channel)
    await layer.group_send(group, {"type": "after-discard"})
    await layer.send(channel, {"type": "direct"})
    assert await receive(layer, channel) == {"type": "direct"}  # ref 8: S10 order, the group one never came
    assert await times_out(layer.receive(channel), 0.2)


async def test_group_members_get_distinct_dicts(make_layer: MakeLayer) -> None:
    """ref 5, S9, C5."""
    layer, sender = make_layer(), make_layer()
    group = unique("g")
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, first)
    await layer.group_add(group, second)
    await sender.group_send(group, {"type": "x", "items": [1, 2], "inner": {"k": "v"}})
    one, two = await receive(layer, first), await receive(layer, second)
    assert one == two
    assert one is not two
    assert one["items"] is not two["items"]
    assert one["inner"] is not two["inner"]
    one["items"].append(3)
    one["inner"]["k"] = "changed"
    one["type"] = "mutated"
    assert two == {"type": "x", "items": [1, 2], "inner": {"k": "v"}}


async def test_waiting_group_members_get_distinct_dicts(make_layer: MakeLayer) -> None:
    """S9, C5 for members whose receives wait when the message comes: their results are settled
    together, and a message of strings and numbers is decoded once and copied for each."""
    layer, sender = make_layer(), make_layer()
    group = unique("g")
    members = [await layer.new_channel() for _ in range(4)]
    for member in members:
        await layer.group_add(group, member)
    flat = {"type": "flat", "n": 1, "f": 0.5, "b": b"x", "none": None, "yes": True}
    nested = {"type": "nested", "items": [1, 2], "inner": {"k": "v"}}
    for message in (flat, nested):
        waiting = [asyncio.ensure_future(layer.receive(member)) for member in members]
        await asyncio.sleep(0.1)  # every receive waits
        await sender.group_send(group, message)
        got = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert got == [message] * len(members)
        assert len({id(one) for one in got}) == len(members)
        got[0]["type"] = "mutated"
        del got[0]["n" if message is flat else "items"]
        if message is nested:
            assert len({id(one["items"]) for one in got[1:]}) == len(members) - 1
            got[1]["items"].append(3)
            got[1]["inner"]["k"] = "changed"
        assert got[2:] == [message] * (len(members) - 2)


async def test_order_of_sends_and_group_sends(make_layer: MakeLayer) -> None:
    """ref 6, S10, C9: order within one subscription, and across subscriptions of one connection."""
    layer, sender = make_layer(), make_layer()
    group = unique("g")
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    for i in range(20):
        await sender.send(channel, {"type": "direct", "i": i})
    assert [(await receive(layer, channel))["i"] for _ in range(20)] == list(range(20))
    for i in range(20):
        await sender.group_send(group, {"type": "group", "i": i})
    assert [(await receive(layer, channel))["i"] for _ in range(20)] == list(range(20))
    for i in range(30):  # mixed: the reference layer could deliver these as 1, 3, 2
        if i % 3 == 1:
            await sender.group_send(group, {"type": "group", "i": i})
        else:
            await sender.send(channel, {"type": "direct", "i": i})
    assert [(await receive(layer, channel))["i"] for _ in range(30)] == list(range(30))


async def test_a_receive_draining_a_backlog_lets_other_tasks_run(make_layer: MakeLayer) -> None:
    """A receive that finds its message waiting returns without suspending, so a consumer
    draining a backlog would hold the event loop for the whole backlog: every READY_STREAK-th
    such receive in a row yields to the loop first, and no other one does."""
    streak = _results.READY_STREAK
    count = 20 * streak
    layer, sender = make_layer(capacity=count), make_layer()
    backlog, fence = await layer.new_channel(), await layer.new_channel()
    for i in range(count):
        await sender.send(backlog, {"type": "backlog", "i": i})
    await sender.send(fence, {"type": "fence"})
    assert await receive(layer, fence) == {"type": "fence"}  # S10: the whole backlog is in its mailbox
    turns = 0
    spinning = True

    async def spin() -> None:
        nonlocal turns
        while spinning:
            turns += 1
            await asyncio.sleep(0)

    async def drain() -> tuple[list[int], int]:
        before = turns
        got = [(await layer.receive(backlog))["i"] for _ in range(count)]
        return got, turns - before

    spinner = asyncio.ensure_future(spin())
    try:
        got, during = await asyncio.wait_for(drain(), 10)
    finally:
        spinning = False
        await spinner
    assert got == list(range(count))
    # The receive after the fence's waited, so the streak starts at 0: the 33rd, 65th, ...
    # receives yield, 19 of the 640. Each lets the spinner take one turn.
    yields = (count - 1) // streak
    assert yields - 1 <= during <= yields + 1, f"the spinner ran {during} times during {count} ready receives"


async def test_every_type_the_spec_allows_round_trips(make_layer: MakeLayer) -> None:
    """ref 37, spec M2, C5: bytes stay bytes, str stays str, 64-bit ints, floats, lists, None."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    message: Message = {
        "type": "types",
        "bytes": b"\x00\xff\x80binary",
        "empty_bytes": b"",
        "text": "안녕 ☃",
        "big": 2**62,
        "min": -(2**63),
        "max": 2**63 - 1,
        "float": 1.5,
        "list": [1, None, "a", b"b", [2.5]],
        "nested": {"a": {"b": {"c": [True, False]}}},
        "none": None,
        "true": True,
        "false": False,
    }
    await sender.send(channel, message)
    got = await receive(layer, channel)
    assert got == message
    assert type(got["bytes"]) is bytes
    assert type(got["text"]) is str
    assert type(got["true"]) is bool
    assert type(got["big"]) is int
    assert type(got["float"]) is float
    assert type(got["list"][3]) is bytes


async def test_large_messages_round_trip(make_layer: MakeLayer) -> None:
    """spec M3/M4, C6: about 900 KB of bytes by send and by group_send."""
    layer, sender = make_layer(), make_layer()
    group = unique("big")
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    data = os.urandom(900_000)
    await sender.send(channel, {"type": "big", "data": data})
    await sender.group_send(group, {"type": "big-group", "data": data})
    assert await receive(layer, channel) == {"type": "big", "data": data}
    assert await receive(layer, channel) == {"type": "big-group", "data": data}


async def test_message_too_large(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """S7, ref 35, C6: over max_payload raises MessageTooLarge before sending; the layer goes on.
    Headers count: a body that fits alone is too large with a process channel's Channel header."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    with pytest.raises(MessageTooLarge):
        await sender.send(channel, {"type": "huge", "data": b"x" * MAX_PAYLOAD})
    with pytest.raises(layer.MessageTooLarge):
        await sender.group_send(unique("g"), {"type": "huge", "data": b"x" * MAX_PAYLOAD})
    # msgpack: fixmap(1) + "type"(5) + "t"(2) + "data"(5) + bin32 header(5) = 18 bytes around the data
    fits_alone: Message = {"type": "t", "data": b"y" * (MAX_PAYLOAD - 18 - 10)}
    assert len(pack(fits_alone)) == MAX_PAYLOAD - 10
    with pytest.raises(MessageTooLarge):
        await sender.send(channel, fits_alone)  # + "Channel: specific...!..." header
    plain = unique("plain-big")
    reader = asyncio.create_task(layer.receive(plain))
    await wait_subscribed(nats_server, f"channels.ch.{plain}")
    await sender.send(plain, fits_alone)  # no header on plain channels: it fits
    assert await asyncio.wait_for(reader, 10) == fits_alone
    assert sender.stats()["published"] == 1
    assert sender.stats()["connected"] is True
    await sender.send(channel, {"type": "small"})
    assert await receive(layer, channel) == {"type": "small"}


# ---- plain channels (ref 13, 14, 34; C8) -----------------------------------------------------


async def test_plain_channel_reaches_exactly_one_reader_across_processes(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """ref 13, channels_postgres #18, C8: queue groups; every message read exactly once."""
    readers = [make_layer() for _ in range(3)]
    sender = make_layer()
    name = unique("worker-queue")
    got: list[tuple[int, int]] = []

    async def read(index: int, layer: NatsChannelLayer) -> None:
        while True:
            got.append((index, (await layer.receive(name))["i"]))

    tasks = [asyncio.create_task(read(i, layer)) for i, layer in enumerate(readers)]
    try:
        await wait_subscribed(nats_server, f"channels.ch.{name}", 3)
        await sender.send(name, {"type": "job", "i": 0})
        await wait_until(lambda: len(got) == 1, "the first job")
        await asyncio.sleep(0.3)
        assert len(got) == 1  # one reader, not every process
        for i in range(1, 60):
            await sender.send(name, {"type": "job", "i": i})
        await wait_until(lambda: len(got) == 60, "60 jobs")
        await asyncio.sleep(0.3)
        assert sorted(i for _, i in got) == list(range(60))  # no loss, no duplicate
    finally:
        await finish(tasks)


async def test_two_readers_in_one_process_share_a_plain_channel(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """ref 14, C15: each message completes exactly one of the two receives."""
    layer, sender = make_layer(), make_layer()
    name = unique("shared")
    first = asyncio.create_task(layer.receive(name))
    second = asyncio.create_task(layer.receive(name))
    try:
        await wait_subscribed(nats_server, f"channels.ch.{name}")
        await sender.send(name, {"type": "one"})
        await wait_until(lambda: first.done() or second.done(), "one receive")
        await asyncio.sleep(0.2)
        assert first.done() != second.done()
        await sender.send(name, {"type": "two"})
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert sorted([first.result()["type"], second.result()["type"]]) == ["one", "two"]
    finally:
        await finish([first, second])


async def test_group_message_to_a_shared_plain_member_reaches_one_reader(make_layer: MakeLayer) -> None:
    """ref 34: a plain member read by two processes gets one copy of a group message."""
    a, b, sender = make_layer(), make_layer(), make_layer()
    name, group = unique("shared-worker"), unique("jobs")
    await a.group_add(group, name)
    await b.group_add(group, name)
    tasks = [asyncio.create_task(a.receive(name)), asyncio.create_task(b.receive(name))]
    try:
        await sender.group_send(group, {"type": "job"})
        await wait_until(lambda: any(t.done() for t in tasks), "one delivery")
        await asyncio.sleep(0.3)
        assert sum(t.done() for t in tasks) == 1
        assert next(t for t in tasks if t.done()).result() == {"type": "job"}
    finally:
        await finish(tasks)


async def test_messages_to_a_plain_member_of_a_group_are_kept(make_layer: MakeLayer) -> None:
    """Channels test_inmemorychannel #6 (adapted) and channels_redis core #10: group_add of a
    plain name subscribes it, so messages wait for the first receive."""
    layer, sender = make_layer(), make_layer()
    name, group = unique("plain-member"), unique("g")
    await layer.group_add(group, name)
    for i in range(5):
        await sender.group_send(group, {"type": "n", "i": i})
    assert [(await receive(layer, name))["i"] for _ in range(5)] == list(range(5))


# ---- capacity, expiry, stats (S2, S3, S4, S20; ref 10, 11, 12, 17) ---------------------------


async def test_full_mailbox_drops_new_messages(make_layer: MakeLayer) -> None:
    """ref 11, S2, channels_redis core #3 (replacement): sends never raise; the newest are dropped."""
    layer, sender = make_layer(capacity=2), make_layer()
    channel = await layer.new_channel()
    for i in range(5):
        await sender.send(channel, {"type": "n", "i": i})  # never ChannelFull
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 3, "3 drops")
    assert [(await receive(layer, channel))["i"] for _ in range(2)] == [0, 1]
    assert await times_out(layer.receive(channel))


async def test_group_send_to_a_full_member_drops_silently(make_layer: MakeLayer) -> None:
    """channels_redis core #14 (adapted), Channels test_inmemorychannel #7: group_send never raises;
    each member's mailbox is bounded on its own (S2: per full channel name)."""
    layer, sender = make_layer(capacity=3), make_layer()
    group = unique("g")
    full, roomy = await layer.new_channel(), await layer.new_channel()
    await sender.send(full, {"type": "n", "i": 0})
    await layer.group_add(group, full)
    await layer.group_add(group, roomy)
    for i in range(1, 5):
        await sender.group_send(group, {"type": "n", "i": i})
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 2 + 1, "3 drops")
    assert [(await receive(layer, full))["i"] for _ in range(3)] == [0, 1, 2]
    assert [(await receive(layer, roomy))["i"] for _ in range(3)] == [1, 2, 3]
    assert await times_out(layer.receive(full), 0.2)
    assert await times_out(layer.receive(roomy), 0.2)


async def test_a_full_mailbox_warns_once(make_layer: MakeLayer, caplog: pytest.LogCaptureFixture) -> None:
    """ref 12, S3: one "is full" warning for 18 drops, then one "has room again" with the count."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(capacity=2), make_layer()
    channel = await layer.new_channel()
    for i in range(20):
        await sender.send(channel, {"type": "n", "i": i})
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 18, "18 drops")
    await wait_until(lambda: len(warnings_with(caplog, "is full")) >= 1, "the full warning")
    full = warnings_with(caplog, "is full")
    assert len(full) == 1
    assert channel in full[0].getMessage()
    assert (await receive(layer, channel))["i"] == 0
    await sender.send(channel, {"type": "n", "i": 20})
    await wait_until(lambda: len(warnings_with(caplog, "has room again")) >= 1, "the room warning")
    await asyncio.sleep(0.1)
    room = warnings_with(caplog, "has room again")
    assert len(room) == 1
    assert "18 message(s)" in room[0].getMessage()
    assert len(warnings_with(caplog, "is full")) == 1
    assert [(await receive(layer, channel))["i"] for _ in range(2)] == [1, 20]


async def test_library_warnings_reach_the_channels_nats_logger(
    make_layer: MakeLayer, caplog: pytest.LogCaptureFixture
) -> None:
    """S3: the library's records arrive on logger "channels_nats" at WARNING, logged on a library
    thread: never the loop's, although the loop routed the message that made the record (it
    reads the connection, cn_on_readable) while it held the GIL."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(capacity=1), make_layer()
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "n"})
    await sender.send(channel, {"type": "n"})
    await wait_until(lambda: len(warnings_with(caplog, "is full")) == 1, "a warning")
    record = warnings_with(caplog, "is full")[0]
    assert record.name == "channels_nats"
    assert record.levelname == "WARNING"
    assert layer.stats()["host_reads"]["reads"] > 0
    assert record.thread != threading.get_ident()
    assert "1 message(s) dropped" in record.getMessage()


async def test_the_loop_reads_the_connection_unless_host_reads_is_off(make_layer: MakeLayer) -> None:
    """The loop that connected reads the connection (cn_read_events); with host_reads=False the
    library's thread does, and the messages arrive the same."""
    for host_reads in (True, False):
        layer, sender = make_layer(host_reads=host_reads), make_layer()
        channel = await layer.new_channel()
        for i in range(20):
            await sender.send(channel, {"type": "n", "i": i})
        assert [(await receive(layer, channel))["i"] for _ in range(20)] == list(range(20))
        reads = layer.stats()["host_reads"]["reads"]
        assert (reads > 0) == host_reads, f"host_reads={host_reads}: the loop read {reads} times"


async def test_expired_messages_are_skipped(make_layer: MakeLayer) -> None:
    """ref 10, S4, Channels test_inmemorychannel #8/#10."""
    layer, sender = make_layer(expiry=0.05), make_layer()
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "stale"})
    await asyncio.sleep(0.25)
    await sender.send(channel, {"type": "fresh"})
    assert await receive(layer, channel) == {"type": "fresh"}
    assert layer.stats()["dropped"]["expired"] == 1
    await sender.send(channel, {"type": "alone"})
    await asyncio.sleep(0.25)
    assert await times_out(layer.receive(channel))


async def test_expired_messages_do_not_hold_the_capacity(make_layer: MakeLayer) -> None:
    """ref 17, ref 72, S2: expired entries are reclaimed before a new message is dropped."""
    layer, sender = make_layer(capacity=1, expiry=0.2), make_layer()
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "stale"})
    await asyncio.sleep(0.4)
    await sender.send(channel, {"type": "fresh"})
    assert await receive(layer, channel) == {"type": "fresh"}
    stats = layer.stats()
    assert stats["dropped"]["capacity"] == 0
    assert stats["dropped"]["expired"] == 1


async def test_stats_counters(make_layer: MakeLayer) -> None:
    """S20: published, delivered, each kind of drop, reconnects, subscriptions, mailboxes."""
    layer, sender = make_layer(capacity=1), make_layer()
    assert layer.stats() == {}
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "a"})
    await sender.send(channel, {"type": "b"})  # dropped: capacity 1
    await wait_until(lambda: layer.stats()["dropped"]["capacity"] == 1, "a capacity drop")
    await receive(layer, channel)
    stats, sent = layer.stats(), sender.stats()
    assert sent["published"] == 2
    assert stats["published"] == 0
    assert stats["delivered"] == 1
    assert sent["delivered"] == 0
    assert set(stats["dropped"]) >= {"capacity", "expired", "slow_consumer", "bad_frame"}
    assert stats["dropped"]["expired"] == stats["dropped"]["bad_frame"] == stats["dropped"]["slow_consumer"] == 0
    assert stats["reconnects"] == 0
    assert stats["subscriptions"] >= 1
    assert stats["mailboxes"] >= 1
    assert stats["connected"] is True
    assert channel.startswith(f"specific.{stats['client_id']}!")


async def test_group_expiry_ends_unread_memberships(make_layer: MakeLayer, caplog: pytest.LogCaptureFixture) -> None:
    """S18: a member nobody reads leaves its groups after group_expiry, counted and logged."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(group_expiry=0.2), make_layer()
    group = unique("g")
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    await wait_until(lambda: layer.stats()["groups_expired"] == 1, "the membership to expire")
    await wait_until(lambda: bool(warnings_with(caplog, "group_expiry")), "the group_expiry warning")
    await sender.group_send(group, {"type": "late"})
    await sender.send(channel, {"type": "direct"})
    assert await receive(layer, channel) == {"type": "direct"}


async def test_prefixes_keep_applications_apart(make_layer: MakeLayer) -> None:
    """channels_redis core #25 (adapted): different prefixes on one server do not meet."""
    app_a, app_b, app_a_sender = make_layer(prefix="appa"), make_layer(prefix="appb"), make_layer(prefix="appa")
    group, plain = unique("g"), unique("q")
    channel = await app_a.new_channel()
    await app_a.group_add(group, channel)
    await app_a.group_add(group, plain)
    await app_b.group_send(group, {"type": "other-app"})
    await app_b.send(plain, {"type": "other-app"})
    assert await times_out(app_a.receive(channel))
    assert await times_out(app_a.receive(plain))
    await app_a_sender.group_send(group, {"type": "same-app"})
    assert await receive(app_a, channel) == {"type": "same-app"}
    assert await receive(app_a, plain) == {"type": "same-app"}


# ---- process channels of other clients (S12, S13; ref 41, 42, 51, 52) -----------------------


async def test_another_process_channel_can_be_sent_to_not_received(make_layer: MakeLayer) -> None:
    """S12, ref 41-42, C3, channels_redis core #8."""
    owner, stranger = make_layer(), make_layer()
    channel = await owner.new_channel()
    await stranger.new_channel()  # connected, with a client id of its own
    with pytest.raises(ValueError, match="belongs to another client"):
        await stranger.receive(channel)
    with pytest.raises(ValueError, match="belongs to another client"):
        await stranger.group_add(unique("g"), channel)
    with pytest.raises(ValueError, match="belongs to another client"):
        await stranger.receive("specific.0123456789ab!")  # a process prefix that is not its own
    await stranger.send(channel, {"type": "routed"})
    assert await receive(owner, channel) == {"type": "routed"}


async def test_receiving_on_the_process_prefix(make_layer: MakeLayer) -> None:
    """S13, ref 51-52: the prefix gets messages of channels without a mailbox of their own."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    prefix = channel.split("!")[0] + "!"
    prefix_reader = asyncio.create_task(layer.receive(prefix))
    try:
        await sender.send(channel, {"type": "own-mailbox"})  # ref 52: the full-name mailbox wins
        assert await receive(layer, channel) == {"type": "own-mailbox"}
        await asyncio.sleep(0.2)
        assert not prefix_reader.done()
        await sender.send(prefix + "aa11", {"type": "no-mailbox"})
        assert await asyncio.wait_for(prefix_reader, 5) == {"type": "no-mailbox"}
        await sender.send(prefix + "bb22", {"type": "kept"})  # kept in the prefix mailbox
        assert await receive(layer, prefix) == {"type": "kept"}
    finally:
        await finish([prefix_reader])


# ---- one client per layer, every loop (S11; ref 9, 27-30, 43, 57, 62, 68 rewritten) ---------


async def test_a_channel_made_on_one_loop_is_received_on_another(make_layer: MakeLayer) -> None:
    """S11: a new_channel name may be received from any loop of the owning process."""
    layer, sender = make_layer(), make_layer()
    made_elsewhere = await asyncio.to_thread(lambda: asyncio.run(layer.new_channel()))  # that loop is gone now
    await sender.send(made_elsewhere, {"type": "to-main"})
    assert await receive(layer, made_elsewhere) == {"type": "to-main"}

    made_here = await layer.new_channel()

    def receive_in_own_loop() -> Message:
        return asyncio.run(asyncio.wait_for(layer.receive(made_here), 10))

    elsewhere = asyncio.ensure_future(asyncio.to_thread(receive_in_own_loop))
    await asyncio.sleep(0.2)
    await sender.send(made_here, {"type": "to-thread"})
    assert await asyncio.wait_for(elsewhere, 10) == {"type": "to-thread"}
    assert made_elsewhere.split("!")[0] == made_here.split("!")[0]  # one client id


async def test_two_loops_in_two_threads_share_one_layer(make_layer: MakeLayer) -> None:
    """S11, ref 43 rewritten: the same layer used at once from two loops; each loop receives on
    channels made by the other, with nothing lost or duplicated."""
    layer, sender = make_layer(), make_layer()
    channels = [await layer.new_channel() for _ in range(2)]
    barrier = threading.Barrier(3)

    def run(channel: str) -> list[int]:
        async def main() -> list[int]:
            made = await layer.new_channel()
            await layer.send(made, {"type": "self", "i": -1})
            assert (await layer.receive(made))["i"] == -1
            await asyncio.to_thread(barrier.wait, 10)
            return [(await asyncio.wait_for(layer.receive(channel), 10))["i"] for _ in range(50)]

        return asyncio.run(main())

    threads = [asyncio.ensure_future(asyncio.to_thread(run, channel)) for channel in channels]
    await asyncio.to_thread(barrier.wait, 10)
    for i in range(50):
        for channel in channels:
            await sender.send(channel, {"type": "n", "i": i})
    results = await asyncio.wait_for(asyncio.gather(*threads), 20)
    assert results == [list(range(50)), list(range(50))]


async def test_async_to_sync_opens_no_new_connection(own_nats_server: NatsServer, make_layer: MakeLayer) -> None:
    """S11, ref 9 and channels_redis core #16 rewritten: 20 async_to_sync(group_send) calls from
    sync code reach a member on the main loop over the layer's one connection."""
    layer = make_layer(servers=own_nats_server.url)
    group = unique("g")
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    assert await asyncio.to_thread(own_nats_server.num_connections) == 1

    def sync_code() -> Message:
        for i in range(20):
            async_to_sync(layer.group_send)(group, {"type": "n", "i": i})
        made = async_to_sync(layer.new_channel)()
        async_to_sync(layer.send)(made, {"type": "sync-round-trip"})
        return async_to_sync(layer.receive)(made)

    assert await asyncio.to_thread(sync_code) == {"type": "sync-round-trip"}
    assert [(await receive(layer, channel))["i"] for _ in range(20)] == list(range(20))
    assert await asyncio.to_thread(own_nats_server.num_connections) == 1


# ---- flush (S15; ref 18, 28, 47, 48) ---------------------------------------------------------


async def test_flush_clears_groups_and_mailboxes(make_layer: MakeLayer) -> None:
    """ref 18, S15."""
    layer, sender = make_layer(), make_layer()
    group = unique("g")
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    probe = await layer.new_channel()
    await sender.send(channel, {"type": "before-flush"})
    await sender.send(probe, {"type": "probe"})
    assert await receive(layer, probe) == {"type": "probe"}  # S10: so "before-flush" is in its mailbox
    await layer.flush()
    assert layer.stats()["groups"] == 0
    assert await times_out(layer.receive(channel), 0.2)  # the mailbox was emptied; this re-creates it
    await sender.group_send(group, {"type": "group-after-flush"})
    await sender.send(channel, {"type": "direct"})
    assert await receive(layer, channel) == {"type": "direct"}  # S10: the group message never came
    assert await times_out(layer.receive(channel), 0.2)


async def test_a_receive_waiting_during_flush_gets_a_later_message(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """ref 47-48, S15: waiting receives keep waiting on fresh mailboxes, with their subscriptions."""
    layer, sender = make_layer(), make_layer()
    channel, plain = await layer.new_channel(), unique("plain")
    process_reader = asyncio.create_task(layer.receive(channel))
    plain_readers = [asyncio.create_task(layer.receive(plain)) for _ in range(2)]
    try:
        await wait_subscribed(nats_server, f"channels.ch.{plain}")
        await asyncio.sleep(0.05)
        await layer.flush()
        await sender.send(channel, {"type": "after-flush"})
        await sender.send(plain, {"type": "p1"})
        await sender.send(plain, {"type": "p2"})
        assert await asyncio.wait_for(process_reader, 5) == {"type": "after-flush"}
        got = await asyncio.wait_for(asyncio.gather(*plain_readers), 5)
        assert sorted(m["type"] for m in got) == ["p1", "p2"]
    finally:
        await finish([process_reader, *plain_readers])


async def test_flush_with_the_server_gone_does_not_raise(own_nats_server: NatsServer, make_layer: MakeLayer) -> None:
    """ref 28, S15."""
    layer = make_layer(servers=own_nats_server.url, connect_options=FAST_RECONNECT)
    channel = await layer.new_channel()
    await layer.group_add(unique("g"), channel)
    await layer.group_add(unique("g"), unique("plain"))
    own_nats_server.stop()
    await asyncio.wait_for(layer.flush(), 5)
    await asyncio.wait_for(layer.flush(), 5)
    assert layer.stats()["groups"] == 0
    await NatsChannelLayer(servers=own_nats_server.url).flush()  # never connected: nothing to do


# ---- close (S16; ref 55, 56, 61) -------------------------------------------------------------


async def test_close_ends_waiting_receives(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """ref 55-56, S16: a process channel reader and both readers of a plain channel."""
    layer = make_layer()
    channel, plain = await layer.new_channel(), unique("plain")
    tasks = [
        asyncio.create_task(layer.receive(channel)),
        asyncio.create_task(layer.receive(plain)),
        asyncio.create_task(layer.receive(plain)),
    ]
    await wait_subscribed(nats_server, f"channels.ch.{plain}")
    await asyncio.sleep(0.05)
    await asyncio.wait_for(layer.close(), 10)
    for task in tasks:
        with pytest.raises(ChannelLayerClosed):
            await asyncio.wait_for(task, 5)


async def test_close_never_raises(own_nats_server: NatsServer, make_layer: MakeLayer) -> None:
    """S16, ref 61: closing with the server gone, closing twice, closing a layer never connected."""
    await NatsChannelLayer(servers=f"nats://127.0.0.1:{dead_port()}").close()
    layer = make_layer(servers=own_nats_server.url, connect_options=FAST_RECONNECT)
    channel = await layer.new_channel()
    waiting = asyncio.create_task(layer.receive(channel))
    await asyncio.sleep(0.05)
    own_nats_server.stop()
    await layer.send(channel, {"type": "buffered during the outage"})
    started = time.monotonic()
    await asyncio.wait_for(layer.close(), 10)
    assert time.monotonic() - started < 5  # bounded by drain_timeout, not 50 s
    await layer.close()
    with pytest.raises(ChannelLayerClosed):
        await asyncio.wait_for(waiting, 5)


async def test_a_call_after_close_reconnects_with_a_new_client_id(make_layer: MakeLayer) -> None:
    """S16, S12: the old process channel names become foreign."""
    layer, sender = make_layer(), make_layer()
    old = await layer.new_channel()
    old_id = layer.stats()["client_id"]
    await layer.close()
    assert layer.stats() == {}
    new = await layer.new_channel()
    assert layer.stats()["client_id"] != old_id
    assert new.split("!")[0] != old.split("!")[0]
    with pytest.raises(ValueError, match="belongs to another client"):
        await layer.receive(old)
    with pytest.raises(ValueError, match="belongs to another client"):
        await layer.group_add(unique("g"), old)
    await layer.send(old, {"type": "to nobody"})  # sending is still allowed
    await sender.send(new, {"type": "works"})
    assert await receive(layer, new) == {"type": "works"}


# ---- reconnect (S17; ref 26, 32) -------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_every_kind_of_receive_comes_back_after_a_server_restart(
    own_nats_server: NatsServer, make_layer: MakeLayer, caplog: pytest.LogCaptureFixture
) -> None:
    """ref 26, 32, S17: pending receives on a process channel, a group member and a plain channel
    get messages again once the server is back (publishing until it lands; at most once)."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer = make_layer(servers=own_nats_server.url, connect_options=FAST_RECONNECT)
    sender = make_layer(servers=own_nats_server.url, connect_options=FAST_RECONNECT)
    group, plain = unique("g"), unique("plain")
    channel, member = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, member)
    tasks = {
        "process": asyncio.create_task(layer.receive(channel)),
        "group": asyncio.create_task(layer.receive(member)),
        "plain": asyncio.create_task(layer.receive(plain)),
    }
    publish: dict[str, Callable[[], Awaitable[None]]] = {
        "process": lambda: sender.send(channel, {"type": "process"}),
        "group": lambda: sender.group_send(group, {"type": "group"}),
        "plain": lambda: sender.send(plain, {"type": "plain"}),
    }
    try:
        await wait_subscribed(own_nats_server, f"channels.ch.{plain}")
        own_nats_server.stop()
        await asyncio.sleep(0.5)
        own_nats_server.start()
        deadline = time.monotonic() + 15
        while not all(t.done() for t in tasks.values()):
            assert time.monotonic() < deadline, {k: t.done() for k, t in tasks.items()}
            for kind, task in tasks.items():
                if not task.done():
                    await publish[kind]()
            await asyncio.sleep(0.2)
        assert {kind: task.result()["type"] for kind, task in tasks.items()} == {k: k for k in tasks}
        assert layer.stats()["reconnects"] >= 1
        await wait_until(lambda: bool(warnings_with(caplog, "reconnected")), "the reconnect warning")
    finally:
        await finish(list(tasks.values()))


# ---- credentials never leak (S19) ------------------------------------------------------------


async def test_url_credentials_never_appear_in_errors(make_layer: MakeLayer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    port = dead_port()
    layer = make_layer(servers=[f"nats://user:s3cret@127.0.0.1:{port}"])
    with pytest.raises(ConnectionError) as raised:
        await asyncio.wait_for(layer.send("ch", {"type": "x"}), 10)
    assert "s3cret" not in str(raised.value)
    assert "s3cret" not in repr(raised.value)
    assert str(port) in str(raised.value)  # it still says where it tried
    assert not [r for r in caplog.records if "s3cret" in r.getMessage()]


async def test_url_credentials_never_appear_in_logs(
    own_nats_server: NatsServer, make_layer: MakeLayer, caplog: pytest.LogCaptureFixture
) -> None:
    """The disconnect and reconnect warnings name the server without its password."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    url = f"nats://user:s3cret@127.0.0.1:{own_nats_server.port}"  # a server without auth accepts any
    layer = make_layer(servers=url, connect_options=FAST_RECONNECT)
    await layer.new_channel()
    own_nats_server.stop()
    await wait_until(lambda: bool(warnings_with(caplog, "disconnected")), "the disconnect warning")
    own_nats_server.start()
    await wait_until(lambda: bool(warnings_with(caplog, "reconnected")), "the reconnect warning")
    records = [r for r in caplog.records if r.name == LOGGER]
    assert records
    assert not [r.getMessage() for r in records if "s3cret" in r.getMessage()]
    assert str(own_nats_server.port) in warnings_with(caplog, "reconnected")[0].getMessage()


# ---- frames that are not Channels messages (S8, S3; ref 53) ---------------------------------


async def test_a_bad_frame_does_not_end_the_consumer(
    make_layer: MakeLayer, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """ref 53, S8: a msgpack array and an invalid byte, published raw, are dropped, counted and
    logged once; the waiting receive gets the next good message."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    layer, sender = make_layer(), make_layer()
    name = unique("raw")
    subject = f"channels.ch.{name}"
    reader = asyncio.create_task(layer.receive(name))
    try:
        await wait_subscribed(nats_server, subject)
        for frame in (b"\x91\x01", b"\xc1"):
            await asyncio.to_thread(raw_send, nats_server.port, subject, frame)
        await wait_until(lambda: layer.stats()["dropped"]["bad_frame"] == 2, "2 bad frames")
        await asyncio.sleep(0.1)
        assert not reader.done()
        await sender.send(name, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
        await wait_until(lambda: bool(warnings_with(caplog, "not a Channels message")), "the bad frame warning")
        bad = warnings_with(caplog, "not a Channels message")
        assert len(bad) == 1
        assert subject in bad[0].getMessage()
        assert layer.stats()["delivered"] == 1
    finally:
        await finish([reader])


async def test_a_process_frame_without_a_channel_header_is_dropped(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """Section 3, S8: .pc. frames are routed by their Channel header; one without it is a bad frame."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    subject = "channels.pc." + channel.split("!")[0]
    reader = asyncio.create_task(layer.receive(channel))
    try:
        body = pack({"type": "headerless"})
        await asyncio.to_thread(raw_send, nats_server.port, subject, body)
        await wait_until(lambda: layer.stats()["dropped"]["bad_frame"] == 1, "a bad frame")
        assert not reader.done()
        await sender.send(channel, {"type": "good"})
        assert await asyncio.wait_for(reader, 5) == {"type": "good"}
    finally:
        await finish([reader])


async def test_a_raw_msgpack_map_is_a_message(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """Section 3: the body is the bare msgpack map, so a program without this package can send."""
    layer = make_layer()
    name = unique("raw-good")
    reader = asyncio.create_task(layer.receive(name))
    try:
        await wait_subscribed(nats_server, f"channels.ch.{name}")
        body = pack({"type": "from-elsewhere", "b": b"\x00"})
        await asyncio.to_thread(raw_send, nats_server.port, f"channels.ch.{name}", body)
        assert await asyncio.wait_for(reader, 5) == {"type": "from-elsewhere", "b": b"\x00"}
    finally:
        await finish([reader])

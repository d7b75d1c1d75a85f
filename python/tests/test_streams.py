"""Receives on process channels that wait through streams (channels_nats/_buffers.py,
cn_receive_stream and cn_stream_stop in include/channels_nats.h).

A receive that must wait on a process channel starts a stream: the library hands over each of the
channel's next messages, up to the stream's credit, as they arrive, with no call per message; one
that finds no receive waiting is kept in the channel's buffer. The credit adapts: 1 for a
channel's first stream, twice the last for each next one up to CREDIT while the consumer keeps
waiting, 1 again once a message finds nobody waiting or a backlog is found.

Here: a waiting consumer is served with one library call per CREDIT messages, in order; what a
stream takes while nobody waits is kept, counted delivered, expires, and goes back to the mailbox
after IDLE like a mailbox's content; capacity (S2), cancellation (S14), flush (S15) and close
(S16) still hold; receives that wait together each get a message of their own.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import NatsServer, pack, raw_send, wait_until

from channels_nats import NatsChannelLayer, _buffers, _native
from channels_nats._native import ChannelLayerClosed

MakeLayer = Callable[..., NatsChannelLayer]
Message = dict[str, Any]

pytestmark = pytest.mark.timeout(60)


# ---- recording the library's stream calls -----------------------------------------------------


class StreamCalls:
    """The cn_receive_stream calls made during a test: (channel, credit, status), in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def credits(self, channel: str) -> list[int]:
        """The credit of each stream started on channel (calls that returned CN_PENDING)."""
        return [credit for name, credit, status in self.calls if name == channel and status == _native.PENDING]

    def made(self, channel: str) -> int:
        """Every call on channel, also those that found messages waiting (CN_OK)."""
        return sum(1 for name, _, _ in self.calls if name == channel)


class RecordingLib:
    """The loaded library, with cn_receive_stream recorded; everything else passes through."""

    def __init__(self, lib: Any, record: StreamCalls) -> None:
        self._lib = lib
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def cn_receive_stream(self, client: int, channel: bytes, credit: int, *rest: Any) -> int:
        status = int(self._lib.cn_receive_stream(client, channel, credit, *rest))
        self._record.calls.append((channel.decode(), int(credit), status))
        return status


@pytest.fixture
def stream_calls(monkeypatch: pytest.MonkeyPatch) -> StreamCalls:
    """Records cn_receive_stream calls during this test only: _native.load(), which the package
    calls for every use of the library, returns a pass-through wrapper until the test ends."""
    record = StreamCalls()
    ffi, lib = _native.load()
    recording = RecordingLib(lib, record)
    monkeypatch.setattr(_native, "load", lambda: (ffi, recording))
    return record


# ---- helpers --------------------------------------------------------------------------------------


def buffers_of(layer: NatsChannelLayer) -> _buffers.ReceiveBuffers:
    buffers = layer._buffers  # pyright: ignore[reportPrivateUsage]
    assert buffers is not None, "the layer has no client"
    return buffers


def waiting(layer: NatsChannelLayer, channel: str) -> int:
    """How many receives wait on channel's buffer (0 when it has none)."""
    buffers = layer._buffers  # pyright: ignore[reportPrivateUsage]
    buffer = None if buffers is None else buffers.by_channel.get(channel)
    return 0 if buffer is None else len(buffer.waiters)


def kept(layer: NatsChannelLayer, channel: str) -> int:
    """How many messages wait in channel's buffer (0 when it has none)."""
    buffer = buffers_of(layer).by_channel.get(channel)
    return 0 if buffer is None or buffer.items is None else len(buffer.items)


def owed(layer: NatsChannelLayer, channel: str) -> int:
    """The credit of channel's stream that is still to come."""
    return buffers_of(layer).by_channel[channel].owed


async def until_waiting(layer: NatsChannelLayer, channel: str, count: int = 1) -> None:
    await wait_until(lambda: waiting(layer, channel) >= count, f"{count} receive(s) waiting on {channel}")


def delivered(layer: NatsChannelLayer) -> int:
    return int(layer.stats()["delivered"])


def dropped(layer: NatsChannelLayer, why: str) -> int:
    return int(layer.stats()["dropped"][why])


async def marker(layer: NatsChannelLayer, sender: NatsChannelLayer) -> None:
    """Returns once everything sender sent so far to layer's process channels has reached layer:
    a marker sent after it to another process channel of layer arrives after it (S10). The marker
    counts as one delivery in layer's stats."""
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "marker"})
    assert await asyncio.wait_for(layer.receive(channel), 5) == {"type": "marker"}


async def send_numbered(sender: NatsChannelLayer, channel: str, numbers: range) -> None:
    for i in numbers:
        await sender.send(channel, {"type": "m", "i": i})


async def received(layer: NatsChannelLayer, channel: str, count: int) -> list[int]:
    return [(await asyncio.wait_for(layer.receive(channel), 5))["i"] for _ in range(count)]


async def times_out(layer: NatsChannelLayer, channel: str, timeout: float = 0.2) -> bool:
    try:
        await asyncio.wait_for(layer.receive(channel), timeout)
    except asyncio.TimeoutError:
        return True
    return False


async def serve(layer: NatsChannelLayer, sender: NatsChannelLayer, channel: str, numbers: range) -> list[int]:
    """Sends each number once a receive waits for it (nothing is buffered); returns what came."""
    got: list[int] = []
    for i in numbers:
        receiving = asyncio.ensure_future(layer.receive(channel))
        await until_waiting(layer, channel)
        await sender.send(channel, {"type": "m", "i": i})
        got.append((await asyncio.wait_for(receiving, 5))["i"])
        assert kept(layer, channel) == 0, "a message that found a receive waiting was buffered"
    return got


async def ramp_up(layer: NatsChannelLayer, sender: NatsChannelLayer, channel: str, calls: StreamCalls) -> int:
    """Serves messages 0, 1, ... to a receive that waits for each, until a stream with the full
    CREDIT runs on channel and has handed over its first one; returns how many were served.
    The stream then owes CREDIT - 1 more, and nobody waits."""
    served = 0
    while calls.credits(channel)[-1:] != [_buffers.CREDIT]:
        assert served < 4 * _buffers.CREDIT, f"the credit never reached CREDIT: {calls.credits(channel)}"
        assert await serve(layer, sender, channel, range(served, served + 1)) == [served]
        served += 1
    assert owed(layer, channel) == _buffers.CREDIT - 1
    return served


def publish_from_a_busy_loop(server: NatsServer, channel: str, message: Message) -> None:
    """Holds the event loop for a moment, as a busy loop does (what the layer started meanwhile
    reaches the server), then publishes message to channel as a peer does, and returns once the
    server has processed it (PING/PONG): all before the loop runs anything else."""
    time.sleep(0.2)
    subject = "channels.pc." + channel.partition("!")[0]
    raw_send(server.port, subject, pack(message), {"Channel": channel})


def doubling_credits(total: int) -> list[int]:
    """The credits of the streams that serve total messages to a consumer that waits for each:
    1, then twice the last, up to CREDIT (the rule of _buffers)."""
    credits: list[int] = []
    credit = 1
    while sum(credits) < total:
        credits.append(credit)
        credit = min(_buffers.CREDIT, credit * 2)
    return credits


# ---- a waiting consumer: few streams, order kept -----------------------------------------------


async def test_a_stream_with_full_credit_serves_that_many_waiting_receives(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """Once the credit is up, a receive that waits starts one stream and the next CREDIT - 1
    receives that wait get their messages through it, with no call into the library; the credit
    counts down and every message counts delivered."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    calls = stream_calls.made(channel)
    more = _buffers.CREDIT - 1
    assert await serve(layer, sender, channel, range(first, first + more)) == list(range(first, first + more))
    assert stream_calls.made(channel) == calls  # the same stream carried them all
    assert owed(layer, channel) == 0
    assert delivered(layer) == first + more
    # Its credit is used: the next receive that waits starts another, again with the full credit.
    assert await serve(layer, sender, channel, range(100, 101)) == [100]
    assert stream_calls.made(channel) == calls + 1
    assert stream_calls.credits(channel)[-1] == _buffers.CREDIT


async def test_waiting_receives_keep_the_order_across_many_streams(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """Several CREDITs of messages, each to a receive that waits: every message comes once, in
    order, through streams whose credit doubles from 1 up to CREDIT (one call per CREDIT messages
    once it is up), each started when the last one's credit was used."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    total = 5 * _buffers.CREDIT + 3
    assert await serve(layer, sender, channel, range(total)) == list(range(total))
    expected = doubling_credits(total)
    assert stream_calls.credits(channel) == expected
    assert stream_calls.made(channel) == len(expected)  # each call started a stream
    assert expected.count(_buffers.CREDIT) >= 4
    assert delivered(layer) == total
    assert await times_out(layer, channel)


async def test_a_consumer_outpaced_at_times_gets_every_message_once_in_order(make_layer: MakeLayer) -> None:
    """A consumer that is busy at times while a sender sends in bursts: messages reach it through
    streams, the buffer and the mailbox in turn; none is lost, doubled or reordered."""
    layer, sender = make_layer(capacity=1000), make_layer()
    channel = await layer.new_channel()
    total = 400
    got: list[int] = []

    async def consume() -> None:
        while len(got) < total:
            got.append((await asyncio.wait_for(layer.receive(channel), 5))["i"])
            if random.random() < 0.05:
                await asyncio.sleep(0.002)  # busy for a moment

    consuming = asyncio.create_task(consume())
    await until_waiting(layer, channel)
    for i in range(total):
        await sender.send(channel, {"type": "m", "i": i})
        if i % 7 == 6:
            await asyncio.sleep(random.uniform(0, 0.003))
    await asyncio.wait_for(consuming, 30)
    assert got == list(range(total))
    assert delivered(layer) == total
    assert await times_out(layer, channel)


# ---- messages that arrive while no receive waits ------------------------------------------------


async def test_messages_arriving_while_the_consumer_is_busy_are_kept_in_order(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """What arrives while no receive waits goes into the buffer, up to the stream's credit: the
    library counts those delivered, the rest stays in the mailbox. The next receives get all of
    them in order, the buffered ones without a call into the library; and the next stream starts
    from credit 1 again."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    left = owed(layer, channel)
    busy = left + 5  # more than the stream may take
    await send_numbered(sender, channel, range(first, first + busy))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == left, "the stream's messages in the buffer")
    assert delivered(layer) == first + left + 1  # and the marker; the other 5 wait in the mailbox
    calls = stream_calls.made(channel)
    assert await received(layer, channel, left) == list(range(first, first + left))
    assert stream_calls.made(channel) == calls  # taken from the buffer
    assert await received(layer, channel, busy - left) == list(range(first + left, first + busy))
    assert delivered(layer) == first + busy + 1
    assert await times_out(layer, channel)
    assert stream_calls.credits(channel)[-1] == 1


# ---- S14: cancellation, and a consumer that stops ----------------------------------------------


async def test_a_receive_cancelled_while_its_stream_runs_loses_nothing(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """S14: receives that time out leave their stream running; what it takes afterwards waits
    in the buffer for the next receive, and what it cannot take in the mailbox: all of it comes,
    in order, the first to the next receive."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    assert await times_out(layer, channel, 0.05)  # the channel's first stream: credit 1
    assert owed(layer, channel) == 1
    await send_numbered(sender, channel, range(3))
    assert await received(layer, channel, 3) == [0, 1, 2]
    first = 3 + await ramp_up(layer, sender, channel, stream_calls)
    for _ in range(3):  # cancelled again and again while the stream runs
        assert await times_out(layer, channel, 0.05)
    assert (waiting(layer, channel), owed(layer, channel)) == (0, _buffers.CREDIT - 1)
    await send_numbered(sender, channel, range(first, first + 6))
    assert await received(layer, channel, 6) == list(range(first, first + 6))
    assert delivered(layer) == first + 6
    assert await times_out(layer, channel)


async def test_an_abandoned_stream_stops_and_its_messages_go_back(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """S14, S5: a consumer that stops receiving does not keep what its stream took: about IDLE
    later the stream is stopped and the messages are in the mailbox again, no longer counted
    delivered, where a receive on another event loop in another thread gets them in order; what
    is sent after that stays in the mailbox (the stream took it otherwise: it had credit left)."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    await send_numbered(sender, channel, range(5))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == 5, "the messages in the buffer")
    assert owed(layer, channel) == _buffers.CREDIT - 1 - 5
    assert delivered(layer) == first + 5 + 1
    buffers = buffers_of(layer)
    started = time.monotonic()
    await wait_until(lambda: channel not in buffers.by_channel, "the buffer to go back", timeout=_buffers.IDLE * 4)
    assert time.monotonic() - started >= _buffers.IDLE / 2  # not at once: the consumer may come back
    assert delivered(layer) == first + 1
    await sender.send(channel, {"type": "m", "i": 5})
    await marker(layer, sender)
    assert delivered(layer) == first + 2  # the stream was stopped: the message waits in the mailbox

    def elsewhere() -> list[int]:
        return asyncio.run(received(layer, channel, 6))

    assert await asyncio.to_thread(elsewhere) == list(range(6))
    assert delivered(layer) == first + 2 + 6


async def test_a_stream_left_by_an_event_loop_that_ended_goes_back_too(make_layer: MakeLayer) -> None:
    """S14, S5: the consumer received on an event loop of its own (asyncio.run, async_to_sync)
    that has ended since, and nothing else receives in this process: its stream must still be
    stopped after about IDLE, and what the stream took must go back to the mailbox."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()

    def consume_elsewhere() -> bool:
        return asyncio.run(times_out(layer, channel, 0.05))  # starts a stream and leaves it

    assert await asyncio.to_thread(consume_elsewhere)
    assert owed(layer, channel) == 1
    await send_numbered(sender, channel, range(3))
    await wait_until(lambda: kept(layer, channel) == 1, "the stream's message in the buffer")
    assert delivered(layer) == 1
    await wait_until(lambda: delivered(layer) == 0, "the stream's message to go back", timeout=_buffers.IDLE * 4)
    assert await received(layer, channel, 3) == [0, 1, 2]


# ---- capacity and expiry ----------------------------------------------------------------------


async def test_capacity_holds_with_a_stream_running(make_layer: MakeLayer, stream_calls: StreamCalls) -> None:
    """S2: with nobody receiving, a channel keeps at most its capacity in the mailbox plus its
    stream's outstanding credit in the buffer; the rest is dropped and counted."""
    capacity, extra = 5, 7
    layer, sender = make_layer(capacity=capacity), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    outstanding = owed(layer, channel)
    at_most = capacity + outstanding
    await send_numbered(sender, channel, range(at_most + extra))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == outstanding, "the stream's messages in the buffer")
    stats = layer.stats()
    assert stats["dropped"]["capacity"] == extra
    assert stats["delivered"] == first + outstanding + 1
    assert await received(layer, channel, at_most) == list(range(at_most))
    assert await times_out(layer, channel)
    assert dropped(layer, "capacity") == extra
    assert delivered(layer) == first + at_most + 1


async def test_buffered_stream_messages_expire_as_in_the_mailbox(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """S4: what a stream took while nobody waited expires when it would have in the mailbox: a
    later receive skips it and gets the next live message; the expired ones are counted as
    expired drops, not as delivered."""
    layer, sender = make_layer(expiry=0.5), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    await send_numbered(sender, channel, range(5))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == 5, "the messages in the buffer")
    await asyncio.sleep(0.6)  # past their expiry
    await sender.send(channel, {"type": "m", "i": 5})
    assert (await asyncio.wait_for(layer.receive(channel), 5))["i"] == 5
    stats = layer.stats()
    assert stats["dropped"]["expired"] == 5
    assert stats["delivered"] == first + 1 + 1


async def test_buffered_stream_messages_that_expire_unread_are_counted(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """S4: nobody receives again: the expired messages of an abandoned buffer are counted as
    expired drops when it goes back after IDLE, and none of them is delivered later."""
    layer, sender = make_layer(expiry=0.3), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    await send_numbered(sender, channel, range(5))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == 5, "the messages in the buffer")
    await wait_until(lambda: dropped(layer, "expired") == 5, "the expired drops", timeout=_buffers.IDLE * 4)
    assert delivered(layer) == first + 1
    await sender.send(channel, {"type": "m", "i": 5})
    assert await received(layer, channel, 1) == [5]
    assert dropped(layer, "expired") == 5


# ---- flush and close ----------------------------------------------------------------------------


async def test_flush_while_a_receive_waits_on_a_stream(make_layer: MakeLayer) -> None:
    """S15: flush empties the mailboxes, but a receive that waits keeps waiting (cn_flush:
    "Receives that are waiting keep waiting"), and gets a message sent after the flush."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    receiving = asyncio.ensure_future(layer.receive(channel))
    await until_waiting(layer, channel)
    await layer.flush()
    await asyncio.sleep(0.05)
    assert not receiving.done()
    await sender.send(channel, {"type": "after-flush"})
    assert await asyncio.wait_for(receiving, 5) == {"type": "after-flush"}


async def test_flush_keeps_a_waiting_receive_subscribed(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """S15 (docs/semantics.md: "Receives that are waiting keep waiting, with the subscriptions they
    need"): a message that reaches the server right after the flush, while the event loop is busy
    for a moment, still reaches the receive that waits on a stream (as it does on a plain
    channel, whose waiting receive keeps its subscription)."""
    layer = make_layer()
    channel = await layer.new_channel()
    receiving = asyncio.ensure_future(layer.receive(channel))
    await until_waiting(layer, channel)
    await layer.flush()
    publish_from_a_busy_loop(nats_server, channel, {"type": "after-flush"})
    try:
        assert await asyncio.wait_for(receiving, 2) == {"type": "after-flush"}
    finally:
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)


async def test_flush_drops_what_a_stream_kept(make_layer: MakeLayer, stream_calls: StreamCalls) -> None:
    """S15: messages a stream took before a flush are gone after it, like the mailbox's; a
    receive afterwards gets the next message sent."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await ramp_up(layer, sender, channel, stream_calls)
    await send_numbered(sender, channel, range(5))
    await marker(layer, sender)
    await wait_until(lambda: kept(layer, channel) == 5, "the messages in the buffer")
    await layer.flush()
    receiving = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0.2)
    assert not receiving.done()
    await sender.send(channel, {"type": "m", "i": 5})
    assert (await asyncio.wait_for(receiving, 5))["i"] == 5


async def test_close_ends_receives_waiting_on_streams(make_layer: MakeLayer, stream_calls: StreamCalls) -> None:
    """S16: receives waiting on streams, on this loop and on another thread's loop, end with
    ChannelLayerClosed at close(); the next call connects again and receives work as before."""
    layer, sender = make_layer(), make_layer()
    first, second, third = [await layer.new_channel() for _ in range(3)]
    waiting_here = [asyncio.ensure_future(layer.receive(c)) for c in (first, first, second)]
    await until_waiting(layer, first, 2)
    await until_waiting(layer, second)

    def receive_elsewhere() -> str:
        async def run() -> str:
            try:
                await asyncio.wait_for(layer.receive(third), 10)
            except ChannelLayerClosed:
                return "closed"
            return "received"

        return asyncio.run(run())

    elsewhere = asyncio.ensure_future(asyncio.to_thread(receive_elsewhere))
    await until_waiting(layer, third)
    # Two receives wait on first: each has a stream of its own (credit 1, then 2).
    assert [len(stream_calls.credits(c)) for c in (first, second, third)] == [2, 1, 1]
    await layer.close()
    for task in waiting_here:
        with pytest.raises(ChannelLayerClosed):
            await asyncio.wait_for(task, 5)
    assert await asyncio.wait_for(elsewhere, 5) == "closed"
    assert layer.stats() == {}
    fresh = await layer.new_channel()  # connects again: a new client, new streams
    assert fresh.partition("!")[0] != first.partition("!")[0]
    assert await serve(layer, sender, fresh, range(3)) == [0, 1, 2]
    assert stream_calls.credits(fresh) == [1, 2]
    assert delivered(layer) == 3


# ---- receives that wait together ----------------------------------------------------------------


async def test_two_receives_waiting_on_one_channel_get_one_message_each(make_layer: MakeLayer) -> None:
    """Two receives wait on the same channel: each of two messages goes to exactly one of them,
    the longest-waiting first, and nothing is left over."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = asyncio.ensure_future(layer.receive(channel))
    await until_waiting(layer, channel, 1)
    second = asyncio.ensure_future(layer.receive(channel))
    await until_waiting(layer, channel, 2)
    await send_numbered(sender, channel, range(2))
    try:
        assert [(await asyncio.wait_for(t, 2))["i"] for t in (first, second)] == [0, 1]
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
    assert await times_out(layer, channel)
    assert delivered(layer) == 2


async def test_more_receives_waiting_than_a_stream_s_credit_all_get_a_message(
    make_layer: MakeLayer, stream_calls: StreamCalls
) -> None:
    """More receives wait on one channel than any stream's credit (CREDIT + 2, after the credit is
    up): as many messages reach them, one each."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = await ramp_up(layer, sender, channel, stream_calls)
    count = _buffers.CREDIT + 2
    tasks = [asyncio.ensure_future(layer.receive(channel)) for _ in range(count)]
    await until_waiting(layer, channel, count)
    await send_numbered(sender, channel, range(first, first + count))
    try:
        done, _ = await asyncio.wait(tasks, timeout=2)
        assert sorted(t.result()["i"] for t in done) == list(range(first, first + count))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_consumers_on_two_loops_share_a_channel_without_loss(make_layer: MakeLayer) -> None:
    """Two consumers of one process channel, on this loop and on another thread's loop (that one
    polling with timeouts, S14), while messages stream in: each message reaches exactly one of
    them, and nothing is left over."""
    layer, sender = make_layer(capacity=1000), make_layer()
    channel = await layer.new_channel()
    total = 300
    here: list[int] = []
    there: list[int] = []
    stop = threading.Event()

    def poll_elsewhere() -> None:
        async def run() -> None:
            while not stop.is_set():
                try:
                    there.append((await asyncio.wait_for(layer.receive(channel), 0.02))["i"])
                except asyncio.TimeoutError:
                    pass

        asyncio.run(run())

    async def consume_here() -> None:
        while True:
            here.append((await layer.receive(channel))["i"])

    polling = asyncio.ensure_future(asyncio.to_thread(poll_elsewhere))
    consuming = asyncio.create_task(consume_here())
    try:
        await until_waiting(layer, channel, 2)
        for i in range(total):
            await sender.send(channel, {"type": "m", "i": i})
            if i % 10 == 9:
                await asyncio.sleep(0.002)
        await wait_until(lambda: len(here) + len(there) >= total, "every message at a consumer")
    finally:
        stop.set()
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await asyncio.wait_for(polling, 5)
    assert sorted(here + there) == list(range(total))
    assert await times_out(layer, channel)
    assert delivered(layer) == total

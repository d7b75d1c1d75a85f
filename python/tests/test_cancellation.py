"""Cancellation (S14, C14) and the lifetimes it must not disturb (S5, S6).

A cancelled receive raises CancelledError at once and never loses a message: one already handed
over goes back to the front of its mailbox, also when the waiter's event loop was closed under
it. Polling with wait_for is a sequence of cancellations, so it must lose nothing either.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import NatsServer, unique

from channels_nats import NatsChannelLayer

MakeLayer = Callable[..., NatsChannelLayer]
Message = dict[str, Any]


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def subscribers(server: NatsServer, subject: str) -> int:
    return sum(subject in (c.get("subscriptions_list") or []) for c in server.connz()["connections"])


async def wait_subscribers(server: NatsServer, subject: str, count: int) -> None:
    """Waits until the server itself lists exactly count connections subscribed to subject."""
    deadline = time.monotonic() + 10
    while (found := await asyncio.to_thread(subscribers, server, subject)) != count:
        if time.monotonic() > deadline:
            pytest.fail(f"the server has {found} subscriber(s) on {subject}, not {count}")
        await asyncio.sleep(0.02)


async def receive(layer: NatsChannelLayer, channel: str, timeout: float = 5) -> Message:
    return await asyncio.wait_for(layer.receive(channel), timeout)


async def times_out(layer: NatsChannelLayer, channel: str, timeout: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(layer.receive(channel), timeout)
    except asyncio.TimeoutError:
        return True
    return False


async def finish(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---- timeouts (S14, ref 20, channels_redis pubsub #15) ---------------------------------------


async def test_a_timed_out_receive_on_a_process_channel_loses_nothing(make_layer: MakeLayer) -> None:
    """ref 20: what arrives between polls waits for the next receive (S5: cancelling is not a
    disconnect, the mailbox stays)."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 0.1)
        assert time.monotonic() - started < 1.0  # honoured at once, no cleanup hang
    await sender.send(channel, {"type": "between-polls"})
    await asyncio.sleep(0.1)  # nobody reads now
    assert await receive(layer, channel) == {"type": "between-polls"}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.05)
    await sender.send(channel, {"type": "right-after"})
    assert await receive(layer, channel) == {"type": "right-after"}


async def test_back_to_back_polls_of_a_plain_channel_lose_nothing(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """S6: release_linger keeps the subscription (and so the queue-group share) between polls."""
    layer, sender = make_layer(), make_layer()
    name = unique("polled")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(name), 0.5)  # subscribes, then times out
    await sender.send(name, {"type": "first"})
    assert await receive(layer, name) == {"type": "first"}
    got: list[int] = []
    for i in range(20):
        await sender.send(name, {"type": "n", "i": i})
        while len(got) <= i:
            try:
                got.append((await asyncio.wait_for(layer.receive(name), 0.02))["i"])
            except asyncio.TimeoutError:
                pass
    assert got == list(range(20))
    assert await asyncio.to_thread(subscribers, nats_server, f"channels.ch.{name}") == 1


class Progress:
    """Tells a receiving loop (of any thread) when to give up: the sender is done and nothing
    arrived for a second, so what is missing was lost. Keeps a failing run short."""

    def __init__(self) -> None:
        self.sent = threading.Event()

    def given_up(self, last_arrival: float) -> bool:
        return self.sent.is_set() and time.monotonic() - last_arrival > 1.0


async def storm(layer: NatsChannelLayer, channel: str, total: int, progress: Progress) -> list[int]:
    """Receives with random tiny timeouts (wait_for) until total messages arrived."""
    got: list[int] = []
    timeouts = 0
    last = time.monotonic()
    while len(got) < total and not progress.given_up(last):
        try:
            message = await asyncio.wait_for(layer.receive(channel), random.uniform(0.0001, 0.003))
        except asyncio.TimeoutError:
            timeouts += 1
            continue
        got.append(message["i"])
        last = time.monotonic()
    assert timeouts > 10, "the storm did not cancel anything"
    return got


async def send_numbered(sender: NatsChannelLayer, channel: str, total: int, progress: Progress) -> None:
    for i in range(total):
        await sender.send(channel, {"type": "n", "i": i})
        if i % 5 == 4:
            await asyncio.sleep(random.uniform(0, 0.004))
    progress.sent.set()


@pytest.mark.timeout(60)
async def test_polls_with_short_pauses_keep_the_plain_subscription(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """S6, header (cn_receive), README (release_linger): a plain channel keeps its subscription
    for release_linger after its last reader was cancelled. A poller that pauses 1 ms between
    polls never leaves it unread for that long, so nothing may be lost or handed back."""
    layer, sender = make_layer(capacity=1000), make_layer()
    name = unique("paused-polls")
    progress = Progress()
    got: list[int] = []

    async def poll() -> None:
        last = time.monotonic()
        while len(got) < 400 and not progress.given_up(last):
            try:
                got.append((await asyncio.wait_for(layer.receive(name), 0.002))["i"])
                last = time.monotonic()
            except asyncio.TimeoutError:
                await asyncio.sleep(0.001)

    polling = asyncio.create_task(poll())
    await wait_subscribers(nats_server, f"channels.ch.{name}", 1)
    for i in range(400):
        await sender.send(name, {"type": "n", "i": i})
        await asyncio.sleep(0.003)
    progress.sent.set()
    await polling
    assert sorted(got) == list(range(400)), missing(got, 400)
    assert layer.stats()["handed_back"] == 0


def missing(got: list[int], total: int) -> str:
    return f"{len(got)} received, missing {sorted(set(range(total)) - set(got))[:20]}"


@pytest.mark.timeout(60)
async def test_a_cancellation_storm_on_a_process_channel_loses_nothing(make_layer: MakeLayer) -> None:
    """S14, C14: 500 numbered messages against receives cancelled by tiny timeouts: each number
    exactly once."""
    layer, sender = make_layer(capacity=1000), make_layer()
    channel = await layer.new_channel()
    progress = Progress()
    receiver = asyncio.create_task(storm(layer, channel, 500, progress))
    await send_numbered(sender, channel, 500, progress)
    got = await receiver
    assert sorted(got) == list(range(500)), missing(got, 500)
    assert await times_out(layer, channel)  # and nothing twice
    assert layer.stats()["delivered"] == 500


@pytest.mark.timeout(60)
async def test_a_cancellation_storm_on_a_plain_channel_loses_nothing(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """S14, S6: the same storm on a plain channel, whose subscription must outlive every poll."""
    layer, sender = make_layer(capacity=1000), make_layer()
    name = unique("storm")
    progress = Progress()
    receiver = asyncio.create_task(storm(layer, name, 500, progress))
    await wait_subscribers(nats_server, f"channels.ch.{name}", 1)
    await send_numbered(sender, name, 500, progress)
    got = await receiver
    assert sorted(got) == list(range(500)), missing(got, 500)
    assert await times_out(layer, name)
    stats = layer.stats()
    assert stats["handed_back"] == 0
    assert stats["dropped"]["capacity"] == 0


# ---- cancelled tasks (S14, C14, ref 25) ------------------------------------------------------


async def test_cancelling_a_waiting_receive_raises_and_keeps_the_message(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    task = asyncio.create_task(layer.receive(channel))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    await sender.send(channel, {"type": "kept"})
    assert await receive(layer, channel) == {"type": "kept"}


async def test_cancellations_racing_deliveries_lose_nothing(make_layer: MakeLayer) -> None:
    """S14: a message handed over just as its receive is cancelled goes back to the front of its
    mailbox; each receive either returns it or raises CancelledError."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    got: list[int] = []
    cancelled = 0
    for i in range(150):
        task = asyncio.create_task(layer.receive(channel))
        await asyncio.sleep(0)
        await sender.send(channel, {"type": "n", "i": i})
        await asyncio.sleep(random.choice([0, 0.0001, 0.0003, 0.0006, 0.001]))
        task.cancel()
        try:
            got.append((await task)["i"])
        except asyncio.CancelledError:
            cancelled += 1
    while len(got) < 150:
        try:
            got.append((await receive(layer, channel, 2))["i"])
        except asyncio.TimeoutError:
            break
    assert sorted(got) == list(range(150)), f"missing {sorted(set(range(150)) - set(got))}"
    assert cancelled > 0
    assert await times_out(layer, channel, 0.2)


def block_the_loop(seconds: float) -> None:
    """Holds the event loop thread, so results from library threads queue up behind it."""
    time.sleep(seconds)


async def test_a_receive_cancelled_after_its_message_arrived_loses_nothing(make_layer: MakeLayer) -> None:
    """S14: the message reached the receive's future, but the task is cancelled before it resumed
    (a timer or another task cancels it in the same loop iteration). The receive raises
    CancelledError, so the message must go back to the mailbox."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    lost: list[int] = []
    for i in range(5):
        task = asyncio.create_task(layer.receive(channel))
        await asyncio.sleep(0.05)  # waiting in the library
        await sender.send(channel, {"type": "n", "i": i})
        block_the_loop(0.2)  # the library delivers; the result waits for the loop
        await asyncio.sleep(0)  # the result is settled, the task's wake-up is queued after us
        task.cancel()
        try:
            assert (await task)["i"] == i
            continue
        except asyncio.CancelledError:
            pass
        try:
            assert (await receive(layer, channel, 0.5))["i"] == i
        except asyncio.TimeoutError:
            lost.append(i)
    assert lost == [], f"messages lost by cancelled receives: {lost}"


async def test_a_group_add_cancelled_after_it_completed_leaves_no_membership(make_layer: MakeLayer) -> None:
    """The same moment for group_add: it raised CancelledError, so no membership may be left."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    group = unique("g")
    task = asyncio.create_task(layer.group_add(group, channel))
    await asyncio.sleep(0)  # waiting for the server's confirmation
    block_the_loop(0.2)
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
        member = True
    except asyncio.CancelledError:
        member = False
    await sender.group_send(group, {"type": "group"})
    await sender.send(channel, {"type": "marker"})
    assert (await receive(layer, channel))["type"] == ("group" if member else "marker")


@pytest.mark.timeout(60)
async def test_a_storm_of_timer_cancellations_loses_nothing(make_layer: MakeLayer) -> None:
    """S14: as asyncio.timeout() and consumer shutdowns do, a timer cancels the receiving task
    itself at a random moment; 500 numbered messages arrive exactly once."""
    layer, sender = make_layer(capacity=1000), make_layer()
    channel = await layer.new_channel()
    loop = asyncio.get_running_loop()

    progress = Progress()

    async def receiver() -> list[int]:
        got: list[int] = []
        last = time.monotonic()
        while len(got) < 500 and not progress.given_up(last):
            task = asyncio.create_task(layer.receive(channel))
            timer = loop.call_later(random.uniform(0.0001, 0.003), task.cancel)
            try:
                got.append((await task)["i"])
                last = time.monotonic()
            except asyncio.CancelledError:
                pass
            timer.cancel()
        return got

    receiving = asyncio.create_task(receiver())
    await send_numbered(sender, channel, 500, progress)
    got = await receiving
    assert sorted(got) == list(range(500)), missing(got, 500)


async def test_a_second_receiver_keeps_the_channel(make_layer: MakeLayer) -> None:
    """ref 25: cancelling one of two readers of a process channel leaves the other working."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    first = asyncio.create_task(layer.receive(channel))
    second = asyncio.create_task(layer.receive(channel))
    await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await sender.send(channel, {"type": "to-the-second"})
    assert await asyncio.wait_for(second, 5) == {"type": "to-the-second"}


async def test_a_timed_out_read_is_not_a_disconnect(make_layer: MakeLayer) -> None:
    """ref 22: a group member whose receive timed out is still a member."""
    layer, sender = make_layer(), make_layer()
    group, channel = unique("g"), await layer.new_channel()
    plain = unique("plain-member")
    await layer.group_add(group, channel)
    await layer.group_add(group, plain)
    assert await times_out(layer, channel, 0.1)
    assert await times_out(layer, plain, 0.1)
    await asyncio.sleep(0.5)  # past release_linger: a plain member of a group keeps its subscription
    await sender.group_send(group, {"type": "still-a-member"})
    assert await receive(layer, channel) == {"type": "still-a-member"}
    assert await receive(layer, plain) == {"type": "still-a-member"}


@pytest.mark.timeout(30)
async def test_a_receive_abandoned_by_its_closed_loop_loses_nothing(make_layer: MakeLayer) -> None:
    """S14: a message handed to a waiter whose event loop was closed (not cancelled) goes back to
    its mailbox and reaches a receive on another loop. For a process and a plain channel."""
    layer, sender = make_layer(), make_layer()
    channel, plain = await layer.new_channel(), unique("plain-abandoned")
    abandoned: list[asyncio.Task[Any]] = []  # kept alive until the end: no "destroyed" noise now

    def abandon_receive(name: str) -> None:
        loop = asyncio.new_event_loop()
        abandoned.append(loop.create_task(layer.receive(name)))
        loop.run_until_complete(asyncio.sleep(0.3))  # the receive is waiting now
        loop.close()  # stopped and closed, the task neither finished nor cancelled

    for name in (channel, plain):
        await asyncio.to_thread(abandon_receive, name)
        assert not abandoned[-1].done()
        await sender.send(name, {"type": "for-the-abandoned", "name": name})
        assert await receive(layer, name) == {"type": "for-the-abandoned", "name": name}
        await sender.send(name, {"type": "next"})
        assert await receive(layer, name) == {"type": "next"}
    assert layer.stats()["delivered"] == 4


async def test_a_cancelled_group_add_leaves_no_membership(make_layer: MakeLayer) -> None:
    """ref 7, header (cn_group_add): a group_add that raised CancelledError left no membership,
    whenever the cancellation landed."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    cancelled = 0
    for attempt in range(40):
        group = unique(f"g{attempt}")
        task = asyncio.create_task(layer.group_add(group, channel))
        await asyncio.sleep(0)
        await asyncio.sleep(random.choice([0, 0, 0.0001, 0.0002, 0.0004, 0.0008]))
        task.cancel()
        try:
            await task
            member = True
        except asyncio.CancelledError:
            member = False
            cancelled += 1
        await sender.group_send(group, {"type": "group", "attempt": attempt})
        await sender.send(channel, {"type": "marker", "attempt": attempt})
        first = await receive(layer, channel)  # S10: a group message would come first
        if member:
            assert first == {"type": "group", "attempt": attempt}
            assert await receive(layer, channel) == {"type": "marker", "attempt": attempt}
            await layer.group_discard(group, channel)
        else:
            assert first == {"type": "marker", "attempt": attempt}, f"attempt {attempt}: cancelled, yet a member"
    assert cancelled > 0


async def test_a_cancelled_send_raises_promptly(make_layer: MakeLayer) -> None:
    """S14: a send waiting for its connection (the server accepts TCP but never answers) is
    cancelled at once; so are receive and new_channel."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        port = silent.getsockname()[1]
        layer = make_layer(servers=f"nats://127.0.0.1:{port}", connect_options={"connect_timeout": 20})
        calls = [
            lambda: layer.send("ch", {"type": "x"}),
            lambda: layer.group_send("g", {"type": "x"}),
            lambda: layer.receive("ch"),
            lambda: layer.new_channel(),
        ]
        for call in calls:
            task = asyncio.create_task(call())
            await asyncio.sleep(0.2)
            assert not task.done()
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
            assert time.monotonic() - started < 1.0
        started = time.monotonic()
        await asyncio.wait_for(layer.close(), 10)  # abandons the connect in progress
        assert time.monotonic() - started < 5
    finally:
        silent.close()


async def test_a_send_cancelled_as_it_starts_raises(make_layer: MakeLayer) -> None:
    """S14: a send on a connected layer cancelled at once raises CancelledError; the layer goes on."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await sender.new_channel()
    for _ in range(20):
        task = asyncio.create_task(sender.send(channel, {"type": "maybe"}))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await sender.send(channel, {"type": "after"})
    assert await receive(layer, channel) == {"type": "after"}


@pytest.mark.timeout(60)
async def test_many_concurrent_receives_all_complete(make_layer: MakeLayer) -> None:
    """C15, S10: 1000 channels of one layer, one waiting receive each, one message each."""
    layer, sender = make_layer(), make_layer()
    channels = await asyncio.gather(*(layer.new_channel() for _ in range(1000)))
    assert len(set(channels)) == 1000
    tasks = [asyncio.create_task(layer.receive(channel)) for channel in channels]
    await asyncio.sleep(0.1)
    for i, channel in enumerate(channels):
        await sender.send(channel, {"type": "n", "i": i})
    results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [r["i"] for r in results] == list(range(1000))
    assert layer.stats()["delivered"] == 1000


# ---- lifetimes a cancellation ends, or must not end (S5, S6; ref 19, 21, 24) ---------------


async def test_a_cancelled_plain_reader_releases_the_subscription(
    make_layer: MakeLayer, nats_server: NatsServer
) -> None:
    """ref 24, S6: after release_linger the process holds no queue-group share it will not read."""
    layer = make_layer(release_linger=0.2)
    name = unique("released")
    subject = f"channels.ch.{name}"
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(name), 0.3)
    await wait_subscribers(nats_server, subject, 0)
    task = asyncio.create_task(layer.receive(name))  # a new reader subscribes again
    try:
        await wait_subscribers(nats_server, subject, 1)
    finally:
        await finish([task])


async def test_a_released_plain_channel_hands_its_messages_back(make_layer: MakeLayer, nats_server: NatsServer) -> None:
    """S6: what a released mailbox still held is re-published, and another reader gets it."""
    quitter = make_layer(release_linger=2.0)  # the 40 sends below come within it
    worker, sender = make_layer(), make_layer()
    await sender.new_channel()  # connected before the linger starts
    name = unique("handed-back")
    subject = f"channels.ch.{name}"
    got: list[int] = []

    async def work() -> None:
        while True:
            got.append((await worker.receive(name))["i"])

    working = asyncio.create_task(work())
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(quitter.receive(name), 0.05)  # subscribed, and now lingering
        await wait_subscribers(nats_server, subject, 2)
        for i in range(40):
            await sender.send(name, {"type": "n", "i": i})
        await wait_until(lambda: len(got) == 40, "every message at the worker")
        await asyncio.sleep(0.3)
        assert sorted(got) == list(range(40))
        assert quitter.stats()["handed_back"] > 0
        assert quitter.stats()["delivered"] == 0
    finally:
        await finish([working])


async def test_an_idle_process_mailbox_is_reclaimed_after_the_grace(make_layer: MakeLayer) -> None:
    """ref 19, 21, S5: no reader, no traffic, no group for mailbox_grace: the mailbox goes."""
    layer, sender = make_layer(mailbox_grace=0.2), make_layer()
    await sender.new_channel()  # connected first: its send must come within the grace
    channel = await layer.new_channel()
    assert await times_out(layer, channel, 0.05)
    await sender.send(channel, {"type": "one"})
    assert await receive(layer, channel) == {"type": "one"}  # a consumer that ended on a message
    await wait_until(lambda: layer.stats()["mailboxes"] == 0, "the mailbox to be reclaimed")
    await sender.send(channel, {"type": "too-late"})
    await wait_until(lambda: layer.stats()["dropped"]["no_mailbox"] == 1, "a no_mailbox drop")


async def test_a_waiting_or_grouped_mailbox_is_kept_past_the_grace(make_layer: MakeLayer) -> None:
    """S5: a receiver or a group membership keeps a mailbox, however long."""
    layer, sender = make_layer(mailbox_grace=0.1), make_layer()
    waited, grouped = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(unique("g"), grouped)
    waiting = asyncio.create_task(layer.receive(waited))
    await asyncio.sleep(0.5)
    await sender.send(waited, {"type": "w"})
    await sender.send(grouped, {"type": "g"})
    assert await asyncio.wait_for(waiting, 5) == {"type": "w"}
    assert await receive(layer, grouped) == {"type": "g"}


@pytest.mark.timeout(60)
async def test_threads_cancelling_receives_on_their_own_loops(make_layer: MakeLayer) -> None:
    """S11 with S14: four threads, each on its own loop, poll channels of one layer with tiny
    timeouts while the main loop sends; every message arrives exactly once."""
    layer, sender = make_layer(capacity=1000), make_layer()
    channels = [await layer.new_channel() for _ in range(4)]

    progress = Progress()

    def poll(channel: str) -> list[int]:
        return asyncio.run(storm(layer, channel, 100, progress))

    pollers = [asyncio.ensure_future(asyncio.to_thread(poll, channel)) for channel in channels]
    for i in range(100):
        for channel in channels:
            await sender.send(channel, {"type": "n", "i": i})
        await asyncio.sleep(0.002)
    progress.sent.set()
    results = await asyncio.wait_for(asyncio.gather(*pollers), 40)
    assert [sorted(got) for got in results] == [list(range(100))] * 4

"""Faults that keep the socket open (a frozen broker, a stalled or slow link), seen from the event
loop of the process that uses the layer (S14): no call may hold the loop while the connection
takes nothing, sends wait for room instead (PublishTimeout after publish_deadline), and nothing
that was accepted vanishes uncounted.

The loop is watched by a 10 ms ticker task: its longest gap, less the 10 ms it sleeps, is the
longest time anything kept the loop from running. The bound is STALL_BOUND.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conftest import NatsServer, unique, wait_until
from faultproxy import FaultProxy

from channels_nats import ChannelLayerClosed, NatsChannelLayer, PublishTimeout

STALL_BOUND = 0.020
"""The longest the layer may keep its caller's event loop from running, in seconds."""

TICK = 0.010


class LoopWatch:
    """A ticker task on the running loop that records the longest stall it saw.

    Three kinds of pause are measured apart and not counted, because the layer causes none:
    - the pauses of Python's own garbage collector (gc.callbacks; a test holding thousands of
      pending sends makes the interpreter collect);
    - the time the loop's thread was ready to run but had no CPU (the kernel's run-queue wait,
      /proc/thread-self/schedstat: on 2 cores shared with nats-server, the proxy and the
      library's threads, the kernel may run others first);
    - the time the loop's selector slept past its own timeout while no thread of this process
      ran (the process's CPU time, which counts the library's threads, stood still): the timer
      was delivered late, and nothing could hold the loop, the GIL included. In a virtual
      machine whose CPUs are all halted, the hypervisor can deliver it tens of milliseconds late
      (seen under perf on this machine: both CPUs idle for 19 ms while the loop's 3 ms timeout
      was due). A call into the layer is never in the selector, so the time the layer blocks
      the loop, asleep or not, still counts; so does the CPU any thread of this process used
      while the selector overslept."""

    def __init__(self) -> None:
        self.worst = 0.0  # the longest gap, less the tick and the pauses above in it
        self.worst_raw = 0.0
        self.worst_detail = ""  # what the loop's thread did during the worst gap
        self.ticks = 0
        self._collecting = 0.0
        self._collected = 0.0
        self._overslept = 0.0
        self._selector: Any = None
        self._task: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting = time.monotonic()
        elif self._collecting:
            self._collected += time.monotonic() - self._collecting

    def _watch_selector(self, loop: asyncio.AbstractEventLoop) -> None:
        """Counts the selector's late wake-ups while the process stood still (the third pause
        above), less what the run-queue wait already counts."""
        selector = getattr(loop, "_selector", None)
        if selector is None:
            return
        select = selector.select

        def timed_select(timeout: float | None = None) -> Any:
            if timeout is None or timeout <= 0:
                return select(timeout)
            start, cpu, queued = time.monotonic(), time.process_time(), self._queued()
            ready = select(timeout)
            late = time.monotonic() - start - timeout
            if late > 0:
                late -= (time.process_time() - cpu) + (self._queued() - queued)
                self._overslept += max(0.0, late)
            return ready

        selector.select = timed_select
        self._selector = selector

    @staticmethod
    def _queued() -> float:
        """Seconds this thread has waited for a CPU since it started (0 where Linux does not say)."""
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except OSError:
            return 0.0

    def _sample(self) -> tuple[float, ...]:
        """The clocks a gap is read from: wall time; the three pauses; this thread's CPU time and
        its voluntary and involuntary context switches (a thread that slept inside a call, on a
        lock, shows voluntary ones); the process's CPU time."""
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return (
            time.monotonic(),
            self._collected,
            self._queued(),
            self._overslept,
            time.thread_time(),
            usage.ru_nvcsw,
            usage.ru_nivcsw,
            time.process_time(),
        )

    async def _tick(self) -> None:
        last = self._sample()
        while True:
            await asyncio.sleep(TICK)
            now = self._sample()
            wall, collected, queued, overslept, thread_cpu, slept, preempted, process_cpu = (
                b - a for a, b in zip(last, now, strict=True)
            )
            gap = wall - TICK
            self.worst_raw = max(self.worst_raw, gap)
            held = gap - collected - queued - overslept
            if held > self.worst:
                self.worst = held
                self.worst_detail = (
                    f"ticks {wall * 1000:.1f} ms apart, a gap of {gap * 1000:.1f} ms: "
                    f"the collector {collected * 1000:.1f} ms, waiting for a CPU {queued * 1000:.1f} ms, "
                    f"the selector oversleeping {overslept * 1000:.1f} ms; "
                    f"the loop's thread ran {thread_cpu * 1000:.1f} ms "
                    f"with {int(slept)} voluntary and {int(preempted)} involuntary switches; "
                    f"the process ran {process_cpu * 1000:.1f} ms"
                )
            self.ticks += 1
            last = now

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._watch_selector(asyncio.get_running_loop())
        self._task = asyncio.ensure_future(self._tick())

    async def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)
        if self._selector is not None:
            del self._selector.select  # the class's own select again
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


@asynccontextmanager
async def watched_loop() -> AsyncIterator[LoopWatch]:
    watch = LoopWatch()
    watch.start()
    try:
        yield watch
    finally:
        await watch.stop()


def assert_no_stall(watch: LoopWatch, what: str) -> None:
    assert watch.ticks > 0, "the ticker never ran"
    assert watch.worst <= STALL_BOUND, (
        f"{what}: the event loop was held for {watch.worst * 1000:.1f} ms "
        f"({watch.worst_raw * 1000:.1f} ms with the collector's pauses and the waits for a CPU; "
        f"{watch.worst_detail})"
    )


async def burst(count: int, send: Callable[[], Awaitable[None]], workers: int = 50) -> list[BaseException | None]:
    """count sends from workers tasks at once (as many consumers would send, each yielding to the
    loop after a send), and each one's outcome: None when it was accepted, else what it raised."""
    outcomes: list[BaseException | None] = []

    async def worker(share: int) -> None:
        for _ in range(share):
            try:
                await send()
                outcomes.append(None)
            except Exception as e:
                outcomes.append(e)
            await asyncio.sleep(0)

    shares = [count // workers + (i < count % workers) for i in range(workers)]
    await asyncio.gather(*(worker(share) for share in shares))
    return outcomes


def freeze(server: NatsServer, seconds: float) -> None:
    """Freezes the broker (SIGSTOP) and thaws it (SIGCONT) seconds later, from the running loop."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    asyncio.get_running_loop().call_later(seconds, os.kill, pid, signal.SIGCONT)


class Received:
    """Counts the messages a receiving layer gets on one channel, by their "n"."""

    def __init__(self, layer: NatsChannelLayer, channel: str) -> None:
        self.numbers: list[int] = []
        self._task = asyncio.ensure_future(self._run(layer, channel))

    async def _run(self, layer: NatsChannelLayer, channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            self.numbers.append(message["n"])

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("count", "size", "workers"), [(200, 500_000, 5), (20_000, 1_000, 50)])
async def test_a_frozen_broker_never_holds_the_loop_during_a_burst(
    own_nats_server: NatsServer, count: int, size: int, workers: int
) -> None:
    """A SIGSTOP of the broker for 3 s during a burst of sends: the sends that found room in the
    outbound buffer returned at once, the others waited for room, and those that found none within
    publish_deadline (2 s) raised PublishTimeout. The loop ran all along. After SIGCONT everything
    accepted arrives, and nothing that timed out. (Large messages come from fewer tasks at once:
    packing 500 KB costs the loop its own time, whatever the layer does.)"""
    sender = NatsChannelLayer(servers=own_nats_server.url, publish_deadline=2)
    receiver = NatsChannelLayer(servers=own_nats_server.url, capacity=count)
    try:
        channel = await receiver.new_channel()
        await sender.send(channel, {"type": "warm", "n": -1})
        assert (await asyncio.wait_for(receiver.receive(channel), 5))["n"] == -1
        pad = b"x" * size
        numbers = iter(range(count))

        async def send() -> None:
            await sender.send(channel, {"type": "big", "n": next(numbers), "pad": pad})

        async with watched_loop() as watch:
            freeze(own_nats_server, 3.0)
            outcomes = await burst(count, send, workers)
        assert_no_stall(watch, f"{count} sends of {size} bytes to a frozen broker")
        timeouts = [e for e in outcomes if e is not None]
        assert all(isinstance(e, PublishTimeout) for e in timeouts), {type(e).__name__ for e in timeouts}
        assert timeouts, "no send waited for room: the outbound buffer is not bounded"
        assert "publish_deadline" in str(timeouts[0])
        accepted = count - len(timeouts)
        stats = sender.stats()
        assert stats["publish_timeouts"] == len(timeouts)
        assert stats["published"] == accepted + 1
        # Thawed, the broker gets every accepted message.
        for _ in range(accepted):
            await asyncio.wait_for(receiver.receive(channel), 10)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver.receive(channel), 0.3)
        assert sender.stats()["lost"] == {"messages": 0, "bytes": 0}
        print(
            f"\n[faults] frozen broker, {count} x {size} B: {accepted} accepted, {len(timeouts)} PublishTimeout, "
            f"worst loop stall {watch.worst * 1000:.1f} ms ({watch.worst_raw * 1000:.1f} ms raw)"
        )
    finally:
        await sender.close()
        await receiver.close()


@pytest.mark.timeout(60)
async def test_receives_that_wait_again_on_a_frozen_broker_never_hold_the_loop(own_nats_server: NatsServer) -> None:
    """Consumers whose receives wait again after each message (started over through the shared
    word, with no call) while the broker is frozen: cancelling half of them returns at once, and
    the loop runs all along. After the thaw a group message reaches the others, in order, and
    waits in the cancelled ones' mailboxes (S14). A close during a second freeze ends the
    receives still waiting with ChannelLayerClosed, within the drain bound."""
    group, members = unique("frozen-again"), 200
    sender = NatsChannelLayer(servers=own_nats_server.url)
    receiver = NatsChannelLayer(servers=own_nats_server.url, connect_options={"drain_timeout": 1})
    consumers: dict[str, asyncio.Future[None]] = {}
    try:
        channels = [await receiver.new_channel() for _ in range(members)]
        for channel in channels:
            await receiver.group_add(group, channel)
        got: dict[str, list[int]] = {channel: [] for channel in channels}

        async def consume(channel: str) -> None:
            while True:
                got[channel].append((await receiver.receive(channel))["n"])

        consumers.update((channel, asyncio.ensure_future(consume(channel))) for channel in channels)
        # Each consumer's first receive waited by name; the second and third start over.
        for n in range(2):
            await sender.group_send(group, {"type": "t", "n": n})
        await wait_until(lambda: all(len(numbers) == 2 for numbers in got.values()), "every member to get 0 and 1")
        cancelled, kept = channels[::2], channels[1::2]

        async with watched_loop() as watch:
            freeze(own_nats_server, 2.0)
            for channel in cancelled:
                consumers[channel].cancel()
            await asyncio.gather(*(consumers[channel] for channel in cancelled), return_exceptions=True)
            await asyncio.sleep(2.5)  # thawed
            await sender.group_send(group, {"type": "t", "n": 2})
            await wait_until(lambda: all(len(got[channel]) == 3 for channel in kept), "the kept members to get 2")
        assert_no_stall(watch, f"cancelling {len(cancelled)} receives that waited again on a frozen broker")
        assert all(got[channel] == [0, 1, 2] for channel in kept)
        assert all(got[channel] == [0, 1] for channel in cancelled)
        for channel in cancelled:
            assert (await asyncio.wait_for(receiver.receive(channel), 5))["n"] == 2

        freeze(own_nats_server, 3.0)
        started = time.monotonic()
        async with watched_loop() as watch:
            await receiver.close()
        took = time.monotonic() - started
        assert_no_stall(watch, "a close on a frozen broker with receives waiting again")
        assert took < 1 + 1.5, f"close took {took:.1f} s with drain_timeout 1"
        ended = await asyncio.wait_for(asyncio.gather(*(consumers[c] for c in kept), return_exceptions=True), 5)
        assert all(isinstance(result, ChannelLayerClosed) for result in ended), {type(r).__name__ for r in ended}
        await asyncio.sleep(max(0.0, started + 3.2 - time.monotonic()))  # thawed before the sender closes
    finally:
        for consumer in consumers.values():
            consumer.cancel()
        await sender.close()
        await receiver.close()


@pytest.mark.timeout(90)
async def test_a_stalled_link_never_holds_the_loop_and_loses_nothing_uncounted(
    own_nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy that stops forwarding both ways while a sender does 360 group_sends a second of
    2 KB, long enough for the pings to declare the link dead; then it forwards again and the
    layer reconnects. The loop ran all along; every send either raised PublishTimeout or was
    accepted, and every accepted one either arrived or is counted (stats and log) as lost."""
    group = unique("stall")
    # Room for the whole backlog the sender writes after the stall: drops here would hide losses.
    receiver = NatsChannelLayer(servers=own_nats_server.url, capacity=100_000)
    with FaultProxy(own_nats_server.url) as proxy:
        sender = NatsChannelLayer(
            servers=proxy.url, publish_deadline=2, connect_options={"ping_interval": 1, "max_pings_outstanding": 2}
        )
        try:
            channel = await receiver.new_channel()
            await receiver.group_add(group, channel)
            received = Received(receiver, channel)
            accepted: list[int] = []
            timeouts = 0
            caplog.set_level(logging.WARNING, logger="channels_nats")

            async def traffic(seconds: float, start: int) -> int:
                nonlocal timeouts
                n, pad = start, b"p" * 2048
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    try:
                        await sender.group_send(group, {"type": "t", "n": n, "pad": pad})
                        accepted.append(n)
                    except PublishTimeout:
                        timeouts += 1
                    n += 1
                    await asyncio.sleep(1 / 360)
                return n

            async with watched_loop() as watch:
                n = await traffic(1.0, 0)
                proxy.stop("both")
                n = await traffic(8.0, n)
                proxy.pass_()
                await wait_until(lambda: sender.stats()["connected"], "the sender to reconnect", 20)
                await traffic(1.0, n)
            assert_no_stall(watch, "a stalled link")
            await asyncio.sleep(1.0)  # the last messages arrive
            await received.stop()
            stats = sender.stats()
            got = set(received.numbers)
            lost = stats["lost"]["messages"]
            missing = set(accepted) - got
            assert got <= set(accepted), "a message that raised PublishTimeout was delivered"
            assert len(missing) <= lost, f"{len(missing)} accepted sends never arrived, only {lost} counted as lost"
            assert lost > 0, "the stall lost nothing: the test did not stall the link"
            assert stats["reconnects"] >= 1, "the dead link was not noticed"
            assert timeouts == stats["publish_timeouts"] > 0
            logged = [r.getMessage() for r in caplog.records if "counted as lost" in r.getMessage()]
            assert logged, "the loss was not logged"
            print(
                f"\n[faults] stalled link: accepted {len(accepted)}, arrived {len(got)}, lost counted {lost}, "
                f"timeouts {timeouts}, worst loop stall {watch.worst * 1000:.1f} ms "
                f"({watch.worst_raw * 1000:.1f} ms raw)"
            )
        finally:
            await sender.close()
            await receiver.close()


@pytest.mark.timeout(60)
async def test_a_slow_link_never_holds_the_loop_and_delivers_everything(own_nats_server: NatsServer) -> None:
    """A proxy that delays every byte by 200 ms: sends and receives go on, later, and the loop
    runs all along."""
    group = unique("slow")
    with FaultProxy(own_nats_server.url) as proxy:
        sender = NatsChannelLayer(servers=proxy.url)
        receiver = NatsChannelLayer(servers=proxy.url, capacity=1000)  # a slow loop must not drop (S2)
        try:
            channel = await receiver.new_channel()
            await receiver.group_add(group, channel)
            await sender.new_channel()  # connected before the delay
            proxy.delay(200)
            received = Received(receiver, channel)
            async with watched_loop() as watch:
                for n in range(300):
                    await sender.group_send(group, {"type": "t", "n": n, "pad": b"s" * 2048})
                    await asyncio.sleep(1 / 360)
                await wait_until(lambda: len(received.numbers) >= 300, "300 messages through a slow link")
            await received.stop()
            assert_no_stall(watch, "a 200 ms link")
            assert received.numbers == list(range(300))
            assert sender.stats()["lost"]["messages"] == 0
        finally:
            await sender.close()
            await receiver.close()


@pytest.mark.timeout(60)
async def test_close_on_a_stalled_link_reports_what_did_not_go_out(
    own_nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """close() on a link that forwards nothing: within drain_timeout nothing is confirmed, so
    every message accepted just before is counted and logged as lost, and the close does not
    take longer than the drain bound."""
    with FaultProxy(own_nats_server.url) as proxy:
        sender = NatsChannelLayer(servers=proxy.url, connect_options={"drain_timeout": 1})
        receiver = NatsChannelLayer(servers=own_nats_server.url)
        channel = await receiver.new_channel()
        await sender.new_channel()
        proxy.stop("both")
        for n in range(1000):
            await sender.send(channel, {"type": "t", "n": n})
        caplog.set_level(logging.WARNING, logger="channels_nats")
        started = time.monotonic()
        async with watched_loop() as watch:
            await sender.close()
        took = time.monotonic() - started
        proxy.cut()  # whatever the proxy held never reaches the server
        assert_no_stall(watch, "close on a stalled link")
        assert took < 1 + 1.5, f"close took {took:.1f} s with drain_timeout 1"
        logged = [r.getMessage() for r in caplog.records if "closed with" in r.getMessage()]
        assert logged, [r.getMessage() for r in caplog.records]
        assert "1000 publish(es)" in logged[0], logged[0]
        # None of them reached the server.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver.receive(channel), 0.5)
        await receiver.close()


async def test_a_mailbox_holds_no_more_than_its_capacity_with_a_slow_reader(make_layer: Any) -> None:
    """S2: capacity counts every message not yet taken by a consumer; nothing is held ahead of
    the reader anywhere. A burst of 300 to a channel of capacity 100 whose reader waits in one
    receive: that receive gets one, the mailbox keeps 100, 199 are dropped and counted."""
    receiver, sender = make_layer(capacity=100), make_layer()
    channel = await receiver.new_channel()
    first = asyncio.ensure_future(receiver.receive(channel))
    await asyncio.sleep(0.05)
    for n in range(300):
        await sender.send(channel, {"type": "t", "n": n})
    assert (await asyncio.wait_for(first, 5))["n"] == 0
    await wait_until(lambda: receiver.stats()["dropped"]["capacity"] >= 199, "199 capacity drops")
    got = [(await asyncio.wait_for(receiver.receive(channel), 5))["n"] for _ in range(100)]
    assert got == list(range(1, 101))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(receiver.receive(channel), 0.3)
    assert receiver.stats()["dropped"]["capacity"] == 199


async def test_draining_a_backlog_does_not_hold_the_loop(make_layer: Any) -> None:
    """A consumer that drains a backlog gets each message without suspending (it was waiting in
    the mailbox); every so many in a row the receive yields first, so the loop runs others while
    thousands are drained. Without that, 5,000 messages held the loop for tens of milliseconds."""
    receiver, sender = make_layer(capacity=10_000), make_layer()
    channel, marker = await receiver.new_channel(), await receiver.new_channel()
    for n in range(5_000):
        await sender.send(channel, {"type": "t", "n": n})
    await sender.send(marker, {"type": "marker"})
    await asyncio.wait_for(receiver.receive(marker), 10)  # arrival order (S10): the backlog is in
    async with watched_loop() as watch:
        await asyncio.sleep(0.03)  # the ticker runs first: a drain shorter than one tick has no gap to see
        got = [(await receiver.receive(channel))["n"] for _ in range(5_000)]
    assert got == list(range(5_000))
    assert_no_stall(watch, "draining 5,000 waiting messages")

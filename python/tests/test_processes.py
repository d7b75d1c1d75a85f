"""Several OS processes on one nats-server: what one process sends, the others receive.

The children are started with multiprocessing's "spawn" method (a fresh interpreter each, so the
native library is loaded in each child, never inherited), find the library through
CHANNELS_NATS_LIBRARY in the environment they inherit, take the server URL as an argument, and
report through multiprocessing queues. Each child runs one coroutine with asyncio.run and bounds
every wait, so a lost message fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any, Protocol

import pytest

from channels_nats import NatsChannelLayer

pytestmark = pytest.mark.timeout(60)

CTX = multiprocessing.get_context("spawn")
CHILD_DEADLINE = 20.0
"""Seconds a child may run in all; the parent waits a little longer for its report."""


class Server(Protocol):
    """What these tests use of conftest's NatsServer."""

    def connz(self) -> dict[str, Any]: ...


# ---- children (module level, so a spawned interpreter can import them) -------------------------


def group_member_main(url: str, prefix: str, group: str, ready: Queue[Any], results: Queue[Any]) -> None:
    """Joins group with a process channel and a plain channel, then reports what each received
    until the "test.end" marker the parent sends after the message under test."""
    asyncio.run(_group_member(url, prefix, group, ready, results))


async def _group_member(url: str, prefix: str, group: str, ready: Queue[Any], results: Queue[Any]) -> None:
    layer = NatsChannelLayer(servers=[url], prefix=prefix)
    got: dict[str, list[Any]] = {}
    try:
        process_channel = await layer.new_channel()
        plain_channel = f"member-{uuid.uuid4().hex}"
        await layer.group_add(group, process_channel)
        await layer.group_add(group, plain_channel)
        ready.put(("ready", process_channel, plain_channel))

        async def drain(channel: str) -> None:
            messages = got.setdefault(channel, [])
            while True:
                message = await layer.receive(channel)
                if message["type"] == "test.end":
                    return
                messages.append(message)

        await asyncio.wait_for(asyncio.gather(drain(process_channel), drain(plain_channel)), CHILD_DEADLINE)
        results.put(("ok", got))
    except BaseException as e:
        results.put(("error", f"{type(e).__name__}: {e}", got))
    finally:
        await layer.close()


def plain_reader_main(url: str, prefix: str, channel: str, all_sent: Event, results: Queue[Any]) -> None:
    """Reads a plain channel until the parent said everything was sent and nothing came for a
    while, then reports the message numbers it got."""
    asyncio.run(_plain_reader(url, prefix, channel, all_sent, results))


async def _plain_reader(url: str, prefix: str, channel: str, all_sent: Event, results: Queue[Any]) -> None:
    layer = NatsChannelLayer(servers=[url], prefix=prefix)
    got: list[int] = []
    deadline = time.monotonic() + CHILD_DEADLINE
    try:
        while time.monotonic() < deadline:
            try:
                message = await asyncio.wait_for(layer.receive(channel), 1.0)
            except asyncio.TimeoutError:
                if all_sent.is_set():
                    break  # all sent, and a full second without a message: drained
                continue
            got.append(message["n"])
        results.put(("ok", got))
    except BaseException as e:
        results.put(("error", f"{type(e).__name__}: {e}", got))
    finally:
        await layer.close()


def process_channel_owner_main(url: str, prefix: str, names: Queue[Any], results: Queue[Any]) -> None:
    """Makes a process channel, publishes its name, and reports the first two messages on it."""
    asyncio.run(_process_channel_owner(url, prefix, names, results))


async def _process_channel_owner(url: str, prefix: str, names: Queue[Any], results: Queue[Any]) -> None:
    layer = NatsChannelLayer(servers=[url], prefix=prefix)
    got: list[Any] = []
    try:
        channel = await layer.new_channel()
        names.put(channel)
        for _ in range(2):
            got.append(await asyncio.wait_for(layer.receive(channel), CHILD_DEADLINE))
        results.put(("ok", got))
    except BaseException as e:
        results.put(("error", f"{type(e).__name__}: {e}", got))
    finally:
        await layer.close()


def sender_main(url: str, prefix: str, channel: str, message: dict[str, Any], results: Queue[Any]) -> None:
    """Sends one message to a channel of another process."""
    asyncio.run(_sender(url, prefix, channel, message, results))


async def _sender(url: str, prefix: str, channel: str, message: dict[str, Any], results: Queue[Any]) -> None:
    layer = NatsChannelLayer(servers=[url], prefix=prefix)
    try:
        await asyncio.wait_for(layer.send(channel, message), CHILD_DEADLINE)
        results.put(("ok", None))
    except BaseException as e:
        results.put(("error", f"{type(e).__name__}: {e}", None))
    finally:
        await layer.close()


# ---- parent side -------------------------------------------------------------------------------


@pytest.fixture
def spawn() -> Iterator[Callable[..., BaseProcess]]:
    """Starts spawned children; any still alive after the test is killed."""
    started: list[BaseProcess] = []

    def start(target: Callable[..., None], *args: Any) -> BaseProcess:
        process = CTX.Process(target=target, args=args, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
    for process in started:
        assert process.exitcode == 0, f"child {process.pid} exited with {process.exitcode}"


async def get(queue: Queue[Any], timeout: float = CHILD_DEADLINE + 10) -> Any:
    """The next item of a multiprocessing queue, without blocking the event loop."""
    return await asyncio.to_thread(queue.get, True, timeout)


def ok(report: Any) -> Any:
    assert report[0] == "ok", f"a child failed: {report[1]} (got so far: {report[2]!r})"
    return report[1]


def prefix() -> str:
    """A subject prefix of the test's own, so nothing else on the shared server interferes."""
    return f"proc{uuid.uuid4().hex[:10]}"


async def test_group_send_reaches_members_in_three_processes(
    nats_url: str, make_layer: Callable[..., NatsChannelLayer], spawn: Callable[..., BaseProcess]
) -> None:
    pre, group = prefix(), "room"
    ready: Queue[Any] = CTX.Queue()
    results: Queue[Any] = CTX.Queue()
    for _ in range(3):
        spawn(group_member_main, nats_url, pre, group, ready, results)
    members: list[str] = []
    for _ in range(3):
        tag, process_channel, plain_channel = await get(ready)
        assert tag == "ready"
        members += [process_channel, plain_channel]
    assert len(set(members)) == 6

    parent = make_layer(prefix=pre)
    await parent.group_send(group, {"type": "chat.message", "text": "hello", "blob": b"\x00\xff"})
    # Everything one connection receives arrives in order (S10): once the end marker is read,
    # any duplicate of the message would already have been read too.
    await parent.group_send(group, {"type": "test.end"})

    received: dict[str, list[Any]] = {}
    for _ in range(3):
        received.update(ok(await get(results)))
    assert sorted(received) == sorted(members)
    for channel, messages in received.items():
        assert messages == [{"type": "chat.message", "text": "hello", "blob": b"\x00\xff"}], channel


async def test_plain_channel_shared_by_three_processes_delivers_each_message_once(
    nats_server: Server,
    nats_url: str,
    make_layer: Callable[..., NatsChannelLayer],
    spawn: Callable[..., BaseProcess],
) -> None:
    pre = prefix()
    channel = "work-queue"
    subject = f"{pre}.ch.{channel}"
    all_sent = CTX.Event()
    results: Queue[Any] = CTX.Queue()
    for _ in range(3):
        spawn(plain_reader_main, nats_url, pre, channel, all_sent, results)

    # Every reader's queue subscription is live on the server before the first send (a message
    # sent to a plain channel nobody reads is lost, S1); the server's monitoring shows them.
    deadline = time.monotonic() + 20
    while True:
        connz = await asyncio.to_thread(nats_server.connz)
        readers = [c for c in connz.get("connections", []) if subject in (c.get("subscriptions_list") or [])]
        if len(readers) == 3:
            break
        assert time.monotonic() < deadline, f"only {len(readers)} of 3 readers subscribed to {subject}"
        await asyncio.sleep(0.05)

    parent = make_layer(prefix=pre)
    for n in range(30):
        await parent.send(channel, {"type": "work", "n": n})
    all_sent.set()

    per_process = [ok(await get(results)) for _ in range(3)]
    everything = Counter(n for got in per_process for n in got)
    assert sorted(everything) == list(range(30)), f"lost: {sorted(set(range(30)) - set(everything))}"
    assert all(count == 1 for count in everything.values()), f"delivered twice: {everything}"
    # The queue group spreads the work: three readers drawing 30 messages at random all land on
    # one reader with probability about 1.5e-5.
    assert sum(1 for got in per_process if got) >= 2, f"one reader got everything: {per_process}"


async def test_process_channel_receives_from_another_child_and_from_the_parent(
    nats_url: str, make_layer: Callable[..., NatsChannelLayer], spawn: Callable[..., BaseProcess]
) -> None:
    pre = prefix()
    names: Queue[Any] = CTX.Queue()
    owner_results: Queue[Any] = CTX.Queue()
    sender_results: Queue[Any] = CTX.Queue()
    spawn(process_channel_owner_main, nats_url, pre, names, owner_results)
    channel: str = await get(names)
    assert "!" in channel

    parent = make_layer(prefix=pre)
    await parent.send(channel, {"type": "hello", "from": "parent"})
    spawn(sender_main, nats_url, pre, channel, {"type": "hello", "from": "child"}, sender_results)
    ok(await get(sender_results))

    got = ok(await get(owner_results))
    assert sorted(message["from"] for message in got) == ["child", "parent"]
    assert all(message["type"] == "hello" for message in got)
    # A process channel belongs to its owner's client: the parent may send, not receive (S12).
    with pytest.raises(ValueError, match="another client"):
        await parent.receive(channel)

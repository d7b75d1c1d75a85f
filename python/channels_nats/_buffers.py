"""Receives on process channels: streams from the library, and messages kept here until taken.

A receive that would cross into the library once per message costs a call, an operation handle
and a completion per message. Instead, a process channel that must wait gets a stream
(cn_receive_stream): the library hands over each of the channel's next messages, up to the
stream's credit, as a result of the process's result queue as it arrives, with no call per
message. A message that finds a receive waiting goes straight to it; one that finds none waits here
in the channel's buffer. When a stream's credit is used, the next receive that must wait starts
another.

A receive that finds a backlog in the mailbox instead (a stream starts only on an empty mailbox)
takes up to PREFETCH messages in one call (cn_receive_many) into the buffer: for a backlog that is
cheaper per message than a stream. So the credit adapts: a channel's first stream has credit 1,
each next one twice the last, up to CREDIT, while its consumer keeps waiting for messages; once
one finds no receive waiting, or a backlog is found, it starts again from 1.

Nothing is lost or kept past its time: each buffered message carries the moment it would have
expired in its mailbox, and expired ones go back to the library, which counts and drops them. A
buffer that no receive waited on or took from for IDLE seconds (a thread sweeps), every buffer at
close, and every buffer without a waiting receive at flush stop their streams and go back to the
library (cn_put_back_many) with the time each message has left, where mailbox rules apply again
(expiry counted in the stats, idle reclaim). Plain channels are never buffered here: their
messages belong to whichever process of the queue group receives first.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from . import _bridge, _native

PREFETCH = 64
"""Messages taken ahead per cn_receive_many call."""

CREDIT = 16
"""The most messages a stream may hand over."""

IDLE = 1.0
"""Seconds a buffer may go without a waiting receive or a take before it goes back."""

_RECORD = struct.Struct("<II")  # body length, milliseconds left: the block format of the header

Item = tuple[float, bytes]
"""A buffered message: (expiry deadline on the monotonic clock, body)."""


class _Buffer:
    __slots__ = ("channel", "credit", "items", "owed", "sink", "streams", "touched", "waiters")

    def __init__(self, channel: str, now: float) -> None:
        self.channel = channel
        self.items: deque[Item] | None = None  # made when first needed: an idle consumer holds none
        self.touched = now
        self.waiters: list[asyncio.Future[Item]] = []  # rarely more than one: a list is smaller
        self.owed = 0  # results still to come from the channel's streams
        self.streams: list[int] = []  # handles of the streams that may still run (all end when owed is 0)
        self.credit = 1  # the next stream's credit
        self.sink: _StreamSink | None = None  # registered while streams run or results are owed

    def held(self) -> deque[Item]:
        """The buffered messages, made on first use. Under ReceiveBuffers.lock."""
        if self.items is None:
            self.items = deque()
        return self.items


class _StreamSink(_bridge.Pending):
    """Takes the results of one channel's streams (one token for all of them)."""

    __slots__ = ("buffer", "owner")
    once = False

    def __init__(self, owner: ReceiveBuffers, buffer: _Buffer) -> None:
        self.owner = owner
        self.buffer = buffer
        self.register()

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        """A message for the longest-waiting receive, else for the buffer; or the error that
        ended the streams. Runs on whichever thread took the result."""
        owner, buffer = self.owner, self.buffer
        if status != _native.OK or body is None:
            owner.ended(buffer, _native.error_for(status, detail))
            return
        now = time.monotonic()
        item = (now + (int(detail) / 1000 if detail else owner.expiry), body)
        with owner.lock:
            buffer.owed -= 1
            if buffer.owed <= 0:
                buffer.streams.clear()  # every stream of the channel has ended
            buffer.touched = now
            waiters = buffer.waiters
            while waiters:
                waiter = waiters.pop(0)
                if not waiter.done():
                    break
            else:
                buffer.held().append(item)
                buffer.credit = 1  # its consumer is busy: a backlog goes the cheaper way
                return
        if waiter.get_loop() is asyncio._get_running_loop():  # pyright: ignore[reportPrivateUsage]
            waiter.set_result(item)  # the common case: taken on the loop that waits
        else:
            owner.hand_over(buffer, item, front=False, waiter=waiter)


class ReceiveBuffers:
    """The streams and buffers of one client, shared by every loop and thread that uses it."""

    def __init__(self, client: int, expiry: float) -> None:
        self.client = client
        self.expiry = expiry
        self.by_channel: dict[str, _Buffer] = {}
        """Channels with a buffer; every name in it was validated by a receive."""
        self.lock = threading.Lock()
        self._sweeper: threading.Thread | None = None  # runs the idle sweep while buffers exist
        self._watched: asyncio.AbstractEventLoop | None = None  # the last loop that waited
        ffi, _ = _native.load()
        self._local = threading.local()
        self._ffi = ffi

    def take(self, buffer: _Buffer) -> bytes | None:
        """The next message buffer holds, or None (nothing held, or it expired: the library then
        counts and drops what expired).

        No lock: deque.popleft() hands each message to exactly one caller, also against a
        sweep on another thread."""
        if not buffer.items:
            return None
        try:
            deadline, body = buffer.items.popleft()
        except IndexError:
            return None  # another thread took the last one
        now = time.monotonic()
        if deadline > now:
            buffer.touched = now
            return body
        buffer.items.appendleft((deadline, body))
        self._drop_expired(buffer)
        return None

    def _drop_expired(self, buffer: _Buffer) -> None:
        """Returns the expired messages at the front of buffer to the library, which counts and
        drops them; the rest stay (giving them back would hand them to the channel's stream,
        which brings them here again)."""
        now = time.monotonic()
        expired: list[Item] = []
        with self.lock:
            items = buffer.items
            while items and items[0][0] <= now:
                expired.append(items.popleft())
        self._put_back(buffer.channel, expired)

    def next(self, channel: str, loop: asyncio.AbstractEventLoop) -> bytes | asyncio.Future[Item] | None:
        """The next message of a process channel if it is here already, else a future of it that
        the channel's stream completes; None when no stream can start (the channel's subscription
        is not ready): the caller receives the classic way."""
        while True:
            with self.lock:
                buffer = self.by_channel.get(channel)
                if buffer is None:
                    buffer = self._new_buffer_locked(channel)
                items = buffer.items
                started = _native.PENDING
                if items:
                    now = time.monotonic()
                    if items[0][0] > now:
                        buffer.touched = now
                        return items.popleft()[1]
                    started = -1  # its front expired
                elif buffer.owed <= len(buffer.waiters):  # more receives wait than results will come
                    started = self._start_stream_locked(buffer)
                if started == _native.PENDING:
                    waiter: asyncio.Future[Item] = loop.create_future()
                    buffer.waiters.append(waiter)
                    break
            if started == _native.ILLEGAL_STATE:
                return None
            if started == _native.OK:  # a backlog in the mailbox: a stream starts only on an empty one
                self.fill(channel)
            else:
                self._drop_expired(buffer)
        if loop is not self._watched:
            _bridge.results().watch(loop)
            self._watched = loop
        return waiter

    def _new_buffer_locked(self, channel: str) -> _Buffer:
        buffer = self.by_channel[channel] = _Buffer(channel, time.monotonic())
        buffer.sink = _StreamSink(self, buffer)
        if self._sweeper is None:
            # A thread, not a loop's timer: the loop that made the first buffer may end (asyncio.run,
            # async_to_sync) while the buffers it made live on.
            self._sweeper = threading.Thread(target=self._sweep_forever, name="channels_nats sweep", daemon=True)
            self._sweeper.start()
        return buffer

    def _start_stream_locked(self, buffer: _Buffer) -> int:
        """cn_receive_stream for buffer's channel: PENDING (started), OK (messages are waiting)
        or ILLEGAL_STATE (not subscribed yet); raises for anything else."""
        _, lib = _native.load()
        complete, _ = _bridge.callbacks()
        assert buffer.sink is not None  # a buffer in by_channel has its sink
        out = self._out()
        credit = buffer.credit
        status = lib.cn_receive_stream(
            self.client, buffer.channel.encode(), credit, complete, buffer.sink.closure(), out.op
        )
        if status == _native.PENDING:
            buffer.owed += credit
            buffer.streams.append(int(out.op[0]))
            buffer.credit = min(CREDIT, credit * 2)
        elif status == _native.OK:
            buffer.credit = 1  # a backlog: cn_receive_many takes it
        elif status != _native.ILLEGAL_STATE:
            _native.check(status)
        return status

    def withdraw(self, channel: str, waiter: asyncio.Future[Item]) -> None:
        """A waiting receive was cancelled: a message it got anyway goes back to the front."""
        buffer = self.by_channel.get(channel)
        if buffer is None:
            return
        with self.lock:
            try:
                buffer.waiters.remove(waiter)
            except ValueError:
                pass
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            self.hand_over(buffer, waiter.result(), front=True)

    def ended(self, buffer: _Buffer, error: BaseException) -> None:
        """The channel's streams ended with error (the client closed): so do its receives."""
        with self.lock:
            buffer.owed = 0
            buffer.streams.clear()
            waiters = list(buffer.waiters)
            buffer.waiters.clear()
        for waiter in waiters:
            _settle(waiter, None, error, None)

    def hand_over(self, buffer: _Buffer, item: Item, front: bool, waiter: asyncio.Future[Item] | None = None) -> None:
        """Gives item to waiter, or to the longest-waiting receive that can still take it, else to
        the buffer: at its end, or at its front when it comes back from a receive that could not
        take it (cancelled meanwhile, or its loop closed)."""
        if waiter is None:
            with self.lock:
                while buffer.waiters:
                    waiter = buffer.waiters.pop(0)
                    if not waiter.done() and not waiter.get_loop().is_closed():
                        break
                else:
                    if front:
                        buffer.held().appendleft(item)
                    else:
                        buffer.held().append(item)
                    return
        _settle(waiter, item, None, lambda: self.hand_over(buffer, item, front=True))

    def fill(self, channel: str) -> None:
        """Takes what else waits in channel's mailbox into its buffer (after a receive found a
        message waiting)."""
        ffi, lib = _native.load()
        out = self._out()
        _native.check(lib.cn_receive_many(self.client, channel.encode(), PREFETCH, out.block, out.len, out.count))
        count = out.count[0]
        if count == 0:
            return
        now = time.monotonic()
        try:
            block = ffi.buffer(out.block[0], out.len[0])[:]
        finally:
            lib.cn_free(out.block[0])
        records: list[Item] = []
        at = 0
        for _ in range(count):
            size, left_ms = _RECORD.unpack_from(block, at)
            at += _RECORD.size
            records.append((now + left_ms / 1000, block[at : at + size]))
            at += size
        with self.lock:
            buffer = self.by_channel.get(channel)
            if buffer is None:
                buffer = self._new_buffer_locked(channel)
            buffer.held().extend(records)
            buffer.touched = now

    def flush(self) -> None:
        """Before the client's flush: what the buffers hold goes back to be flushed with the
        mailboxes. A channel with a waiting receive keeps its stream: the library then keeps its
        mailbox and subscription for it (S15), and its buffer holds nothing."""
        with self.lock:
            idle = [buffer for buffer in self.by_channel.values() if not buffer.waiters]
        for buffer in idle:
            self._stop_streams(buffer)
            self._give_back(buffer.channel, buffer)

    def close(self, error: BaseException) -> None:
        """Before the client's close: every stream stops, every buffered message goes back, and
        every waiting receive ends with error."""
        with self.lock:
            buffers = list(self.by_channel.values())
        for buffer in buffers:
            self._stop_streams(buffer)
            with self.lock:
                waiters = list(buffer.waiters)
                buffer.waiters.clear()
            for waiter in waiters:
                _settle(waiter, None, error, None)
            self._give_back(buffer.channel, buffer)

    def _sweep_forever(self) -> None:
        """Every IDLE seconds, sweeps; ends when no buffer is left (a new one starts another)."""
        while True:
            time.sleep(IDLE)
            if not self._sweep():
                return

    def _sweep(self) -> bool:
        """Returns the buffers nobody waited on or took from for IDLE seconds, and forgets those
        with nothing left; False (and the sweeper ends) when no buffer is left."""
        now = time.monotonic()
        with self.lock:
            idle = [b for b in self.by_channel.values() if not b.waiters and now - b.touched >= IDLE]
        for buffer in idle:
            self._stop_streams(buffer)
            self._give_back(buffer.channel, buffer)
        with self.lock:
            for buffer in idle:
                if not buffer.waiters and not buffer.items and buffer.owed <= 0:
                    del self.by_channel[buffer.channel]
                    if buffer.sink is not None:
                        buffer.sink.forget()
                        buffer.sink = None
            if self.by_channel:
                return True
            self._sweeper = None
            return False

    def _stop_streams(self, buffer: _Buffer) -> None:
        """Stops buffer's streams; afterwards buffer.owed counts the results still on their way."""
        with self.lock:
            streams = list(buffer.streams)
            buffer.streams.clear()
        if not streams or _native.forked():
            return
        ffi, lib = _native.load()
        unused = ffi.new("uint32_t *")
        for stream in streams:
            status = lib.cn_stream_stop(self.client, stream, unused)
            if status == _native.OK:
                with self.lock:
                    buffer.owed -= unused[0]
            elif status == _native.CLOSED:  # the client closed: its streams ended with it
                with self.lock:
                    buffer.owed = 0
            elif status != _native.NOT_PENDING:
                _native.check(status)

    def _give_back(self, channel: str, buffer: _Buffer) -> None:
        items = buffer.items
        taken: list[Item] = []
        while items:  # popleft, not iteration: a taker on another thread may still pop
            try:
                taken.append(items.popleft())
            except IndexError:
                break
        self._put_back(channel, taken)

    def _put_back(self, channel: str, items: list[Item]) -> None:
        """Returns items, taken from channel's buffer, to the front of its mailbox, in order."""
        if not items or _native.forked():
            return
        now = time.monotonic()
        records = [_RECORD.pack(len(body), max(0, int((deadline - now) * 1000))) + body for deadline, body in items]
        block = b"".join(records)
        _, lib = _native.load()
        status = lib.cn_put_back_many(self.client, channel.encode(), block, len(block))
        if status not in (_native.OK, _native.CLOSED):  # a closed client has no mailboxes left
            _native.check(status)

    def _out(self) -> Any:
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = _Out(self._ffi)
        return out


def _settle(
    waiter: asyncio.Future[Any], value: Any, error: BaseException | None, unwanted: Callable[[], None] | None
) -> None:
    """Completes waiter on its own loop; calls unwanted instead when it can no longer take value
    (it was cancelled meanwhile, or its loop is gone)."""
    loop = waiter.get_loop()
    if asyncio._get_running_loop() is loop:  # pyright: ignore[reportPrivateUsage]
        _complete(waiter, value, error, unwanted)
        return
    try:
        loop.call_soon_threadsafe(_complete, waiter, value, error, unwanted)
    except RuntimeError:  # its loop is closed
        if unwanted is not None:
            unwanted()


def _complete(
    waiter: asyncio.Future[Any], value: Any, error: BaseException | None, unwanted: Callable[[], None] | None
) -> None:
    if waiter.done():  # cancelled meanwhile
        if unwanted is not None:
            unwanted()
    elif error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(value)


class _Out:
    """Out-parameters for the library, one set per thread."""

    def __init__(self, ffi: Any) -> None:
        self.block = ffi.new("uint8_t **")
        self.len = ffi.new("size_t *")
        self.count = ffi.new("size_t *")
        self.op = ffi.new("cn_op *")

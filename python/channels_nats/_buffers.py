"""Messages of process channels taken ahead from the library, one call for many.

When a receive on a process channel finds a message waiting, the channel has a backlog, and the
receives after it would each cross into the library for one message. Instead, the layer takes up
to PREFETCH more in one call (cn_receive_many) and keeps them here, each with the moment it would
have expired in its mailbox. Receives take from here first.

Nothing is lost or kept past its time: a buffer whose oldest message expired, a buffer nobody
took from for IDLE seconds, and every buffer at flush or close go back to the library
(cn_put_back_many) with the time each message has left, where mailbox rules apply again (expiry
counted in the stats, idle reclaim). Plain channels are never buffered here: their messages
belong to whichever process of the queue group receives first.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import deque
from typing import Any

from . import _native

PREFETCH = 64
"""Messages taken ahead per call."""

IDLE = 1.0
"""Seconds a buffer may go untouched before its messages go back to the library."""

_RECORD = struct.Struct("<II")  # body length, milliseconds left: the block format of the header


class _Buffer:
    __slots__ = ("items", "touched")

    def __init__(self, now: float) -> None:
        self.items: deque[tuple[float, bytes]] = deque()  # (expiry deadline on the monotonic clock, body)
        self.touched = now


class ReceiveBuffers:
    """The receive buffers of one client, shared by every loop and thread that uses it."""

    def __init__(self, client: int) -> None:
        self._client = client
        self._buffers: dict[str, _Buffer] = {}
        self._lock = threading.Lock()
        self._sweeper: asyncio.AbstractEventLoop | None = None  # the loop the idle sweep runs on
        ffi, _ = _native.load()
        self._local = threading.local()
        self._ffi = ffi

    def take(self, channel: str) -> bytes | None:
        """The next buffered message of channel, or None (nothing buffered, or it expired: the
        buffer then went back to the library, which drops and counts what expired).

        No lock: deque.popleft() hands each message to exactly one caller, also against a
        sweep on another thread."""
        buffer = self._buffers.get(channel)
        if buffer is None:
            return None
        try:
            deadline, body = buffer.items.popleft()
        except IndexError:
            return None  # an empty buffer stays until the sweep
        now = time.monotonic()
        if deadline > now:
            buffer.touched = now
            return body
        buffer.items.appendleft((deadline, body))
        with self._lock:
            if self._buffers.get(channel) is buffer:
                del self._buffers[channel]
        self._give_back(channel, buffer)
        return None

    def fill(self, channel: str) -> None:
        """Takes what else waits in channel's mailbox into its buffer (after a receive found a
        message waiting)."""
        ffi, lib = _native.load()
        out = self._out()
        _native.check(lib.cn_receive_many(self._client, channel.encode(), PREFETCH, out.block, out.len, out.count))
        count = out.count[0]
        if count == 0:
            return
        now = time.monotonic()
        try:
            block = ffi.buffer(out.block[0], out.len[0])[:]
        finally:
            lib.cn_free(out.block[0])
        records: list[tuple[float, bytes]] = []
        at = 0
        for _ in range(count):
            size, left_ms = _RECORD.unpack_from(block, at)
            at += _RECORD.size
            records.append((now + left_ms / 1000, block[at : at + size]))
            at += size
        with self._lock:
            buffer = self._buffers.get(channel)
            if buffer is None:
                buffer = self._buffers[channel] = _Buffer(now)
            buffer.items.extend(records)
            buffer.touched = now
            loop = asyncio.get_running_loop()
            schedule = self._sweeper is None or self._sweeper.is_closed()  # none, or died with its loop
            if schedule:
                self._sweeper = loop
        if schedule:
            loop.call_later(IDLE, self._sweep)

    def give_back_all(self) -> None:
        """Every buffered message goes back to the library (flush, close)."""
        with self._lock:
            buffers, self._buffers = self._buffers, {}
        for channel, buffer in buffers.items():
            self._give_back(channel, buffer)

    def _sweep(self) -> None:
        """Returns the buffers nobody took from for IDLE seconds; runs again while any is left."""
        now = time.monotonic()
        with self._lock:
            idle = [channel for channel, buffer in self._buffers.items() if now - buffer.touched >= IDLE]
            stale = [(channel, self._buffers.pop(channel)) for channel in idle]
            again = bool(self._buffers)
            if not again:
                self._sweeper = None
        for channel, buffer in stale:
            self._give_back(channel, buffer)
        if again:
            asyncio.get_running_loop().call_later(IDLE, self._sweep)

    def _give_back(self, channel: str, buffer: _Buffer) -> None:
        now = time.monotonic()
        records: list[bytes] = []
        while True:  # popleft, not iteration: a taker on another thread may still pop
            try:
                deadline, body = buffer.items.popleft()
            except IndexError:
                break
            records.append(_RECORD.pack(len(body), max(0, int((deadline - now) * 1000))) + body)
        if not records or _native.forked():
            return
        block = b"".join(records)
        _, lib = _native.load()
        status = lib.cn_put_back_many(self._client, channel.encode(), block, len(block))
        if status not in (_native.OK, _native.CLOSED):  # a closed client has no mailboxes left
            _native.check(status)

    def _out(self) -> Any:
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = _Out(self._ffi)
        return out


class _Out:
    """cn_receive_many's out-parameters, one set per thread."""

    def __init__(self, ffi: Any) -> None:
        self.block = ffi.new("uint8_t **")
        self.len = ffi.new("size_t *")
        self.count = ffi.new("size_t *")

"""Results of the native library reaching asyncio event loops.

Each event loop that uses the layer has a result queue of its own in the library (cn_queue_new)
and a socket pair: the library writes a byte to the pair when results wait, and the loop takes
them on its own thread (add_reader; a watcher thread for loops that have none, the Windows
proactor). A pending operation is a future of the loop that started it, found by its operation
handle: a result settles its future where it was taken, with no hop between threads, and no
library thread ever enters Python for it.

The library lends each message body until the queue's next take or receive: it is decoded
straight from the library's memory. Nothing waits here; a message that reaches Python is handed
to its receiver at once, and one whose receiver was cancelled meanwhile is given back with
cn_cancel. When a loop closes, its queue is freed, and the library withdraws what was pending
there (a waiting receive loses no message).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from . import _native

Waiting = tuple["asyncio.Future[Any] | concurrent.futures.Future[Any]", int, bool]
"""What a pending operation waits with: its future, its client, and whether it is a send."""

TAKE_BATCH = 128
"""Results taken per cn_queue_take call: each take wakes at most this many tasks, so one loop
iteration stays short even when thousands of results come at once."""

RESULT = struct.Struct("@QPiPPNP")
"""cn_result as laid out in memory (op, closure, status, text, data, len, rearm): read as integers in one
go, far cheaper than a cffi attribute read per field. Checked against the header on first use."""

READY_STREAK = 32
"""Receives in a row on one loop that found a message waiting, after which the next one yields to
the loop first (receive returns 0 without taking anything)."""

CLOSE = 1
"""The closure of a close: its result has the client handle as op, like the connect's."""

IMMUTABLE = frozenset((str, int, float, bool, bytes, type(None)))
"""The types of a decoded message's values that its members may share: a message that holds
only these is copied for each member, not decoded again."""


class LoopQueue:
    """The result queue of one event loop, and the operations waiting on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        ffi, lib = _native.load()
        if ffi.sizeof("cn_result") != RESULT.size:
            raise RuntimeError(f"channels_nats: cn_result is {ffi.sizeof('cn_result')} bytes, not {RESULT.size}")
        self.loop = loop
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        handle = ffi.new("cn_queue *")
        try:
            _native.check(lib.cn_queue_new(self._writer.fileno(), handle))
        except BaseException:
            self._close_sockets()
            raise
        self.handle = int(handle[0])
        # A receive that finds a message waiting is the hot path of every saturated consumer:
        # the compiled module's one-call receive, else the same through cffi.
        fastpath = _native.fastpath()
        self.receive: Callable[[int, bytes, int], Any] = self._receive_through_cffi
        self.receive_again: Callable[[int, int, int], Any] = self._receive_again_through_cffi
        # A take that settles a fan-out's receives: the compiled module's, else _settle.
        self._take_compiled: Callable[[int, int, dict[int, Waiting], Callable[..., None]], int] | None = None
        if fastpath is not None:
            fastpath.configure(msgpack.unpackb, READY_STREAK)
            self.receive = fastpath.receive
            self.receive_again = fastpath.receive_again
            self._take_compiled = fastpath.take
        self._settle_other_result = self._settle_other  # one bound method for every take
        self._cn_receive = lib.cn_receive
        self._cn_cancel = lib.cn_cancel
        self._on_readable_call = lib.cn_on_readable
        self._null = ffi.NULL
        self._ffi = ffi
        self._buffer = ffi.buffer
        self.waiting: dict[int, Waiting] = {}
        # The receive of each channel (by the name the consumer passed) that waited and got its
        # message since the last take: the next receive on that channel starts it over
        # (cn_receive with no name), which the library allows until this queue's next take, and
        # so the take forgets them.
        self.again: dict[str, int] = {}
        self._ready = 0  # receives in a row on this loop that found a message waiting (through cffi)
        self.closing: dict[int, asyncio.Future[None]] = {}
        # Out-parameters of the calls made with this queue: each is read right after its call,
        # before anything else runs on the loop's thread.
        self.op = ffi.new("cn_op *")
        self._body = ffi.new("const uint8_t **")
        self._len = ffi.new("size_t *")
        self._results = ffi.new("cn_result[]", TAKE_BATCH)
        self._count = ffi.new("size_t *")
        self._results_buffer = ffi.buffer(self._results)
        self._watcher: threading.Thread | None = None
        self._freed = False
        self._reading: dict[int, int] = {}  # client -> the duplicate of its read events this loop watches
        self._settled_this_turn = False  # a take settled operations, and the tasks it woke have not run yet
        try:
            loop.add_reader(self._reader.fileno(), self.take)
        except NotImplementedError:  # a proactor loop: a thread watches for it
            self._watcher = threading.Thread(target=self._watch, name="channels_nats results", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """For loops without add_reader: wakes the loop to take when the library signals."""
        taken = threading.Event()

        def take() -> None:
            taken.set()
            self.take()

        while not self._freed:
            try:
                select.select([self._reader], [], [], 1.0)
                if self._freed:
                    return
                taken.clear()
                self.loop.call_soon_threadsafe(take)
            except (OSError, ValueError, RuntimeError):  # the pair or the loop was closed
                return
            taken.wait(1.0)

    def read_connection(self, client: int) -> bool:
        """Makes this loop read the client's connection (cn_read_events, cn_on_readable), where
        the library offers that and the loop has add_reader; reports whether it does. It watches a
        duplicate of the descriptor, which it closes itself: the library closes its own when the
        client closes, which may be before this loop's thread has unregistered it."""
        if self._watcher is not None or client in self._reading:
            return client in self._reading
        ffi, lib = _native.load()
        fd = ffi.new("intptr_t *")
        if lib.cn_read_events(client, fd) != _native.OK or fd[0] < 0:
            return False
        mine = os.dup(fd[0])
        try:
            self.loop.add_reader(mine, self._on_readable, client)
        except (NotImplementedError, RuntimeError, ValueError, OSError):
            os.close(mine)
            return False
        self._reading[client] = mine
        return True

    def _on_readable(self, client: int) -> None:
        """The client's connection has bytes: read them here, then settle what they delivered
        (unsignalled: the library writes no byte for this queue during the call)."""
        self._on_readable_call(client, self.handle)  # a closed client returns CN_CLOSED: stop_reading follows
        self._take_results()

    def stop_reading(self, client: int) -> None:
        """Stops reading the client's connection on this loop (the client closes). From another
        thread, it is done on the loop's own."""
        if self._freed or client not in self._reading:
            return
        try:
            running = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            running = False
        if not running:
            try:
                self.loop.call_soon_threadsafe(self.stop_reading, client)
            except RuntimeError:  # the loop closed: free() closes the descriptor
                pass
            return
        mine = self._reading.pop(client)
        try:
            self.loop.remove_reader(mine)
        finally:
            os.close(mine)

    def _receive_through_cffi(self, client: int, channel: bytes, queue: int) -> Any:
        """cn_receive with no closure, returning what channels_nats._fastpath.receive does: the
        decoded message, or an int: the op of a pending receive (> 0), minus the status of a
        failed call (< 0), or 0 after READY_STREAK ready receives in a row (nothing was taken:
        the caller yields to the loop and asks again)."""
        if self._ready >= READY_STREAK:
            self._ready = 0
            return 0
        status = self._cn_receive(client, channel, queue, self._null, self._body, self._len, self.op)
        return self._received_through_cffi(status, int(self.op[0]))

    def _receive_again_through_cffi(self, client: int, op: int, queue: int) -> Any:
        """cn_receive with channel NULL, starting receive op over, returning what
        channels_nats._fastpath.receive_again does: as _receive_through_cffi."""
        if self._ready >= READY_STREAK:
            self._ready = 0
            return 0
        self.op[0] = op
        status = self._cn_receive(client, self._null, queue, self._null, self._body, self._len, self.op)
        return self._received_through_cffi(status, op)

    def _received_through_cffi(self, status: int, op: int) -> Any:
        """What a receive through cffi returns for a call that returned status."""
        if status == _native.OK:
            self._ready += 1
            return msgpack.unpackb(self._buffer(self._body[0], self._len[0]))
        self._ready = 0
        if status == _native.PENDING:
            return op
        return -status

    def expect(self, op: int, client: int, publishing: bool = False) -> asyncio.Future[Any]:
        """A future of this loop for the result of pending operation op."""
        future: asyncio.Future[Any] = self.loop.create_future()
        self.waiting[op] = (future, client, publishing)
        return future

    def take(self) -> None:
        """Takes the results in the queue and settles their operations (on the loop's thread).

        One batch per call: a full batch schedules the next take behind the tasks it woke. A
        task cancelled before it resumed gives its result back with cn_cancel, which the library
        accepts until this queue's next take: so every woken task runs before that."""
        if self._freed:
            return
        try:
            # First the signal bytes, then the results: none is missed. A read that returns less
            # than it asked for took them all, so a wake-up costs one read, not two.
            while len(self._reader.recv(4096)) == 4096:
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._take_results()

    def _take_results(self) -> None:
        """take, without reading the signal bytes first. After a take that settled anything, the
        next one waits for the loop's next turn, behind the tasks this one woke: both the signal
        and the read events (_on_readable) can ask for a take in one turn."""
        if self._freed:  # a batch scheduled before the loop closed
            return
        if self._settled_this_turn:
            self.loop.call_soon(self.take)
            return
        self.again.clear()  # the take keeps what the last one handed over: it cannot start over
        if self._take_compiled is not None:
            n = self._take_compiled(self.handle, TAKE_BATCH, self.waiting, self._settle_other_result)
            if n < 0:
                _native.raise_for(-n, _native.last_error())
        else:
            _, lib = _native.load()
            _native.check(lib.cn_queue_take(self.handle, self._results, TAKE_BATCH, self._count))
            n = self._count[0]
            if n:
                self._settle(RESULT.iter_unpack(self._results_buffer[: n * RESULT.size]))
        if n:
            self._settled_this_turn = True
            self.loop.call_soon(self._next_turn)
        if n == TAKE_BATCH:
            # More results wait: the next batch, behind the tasks this one woke. The signal
            # bytes were read before this take: results that come now, after it, write a new one.
            self.loop.call_soon(self._take_results)

    def _next_turn(self) -> None:
        """Runs after the tasks the last take woke (they were scheduled before it)."""
        self._settled_this_turn = False

    def _settle(self, records: Any) -> None:
        """Settles the results of a take made through cffi, as the compiled module's take does."""
        waiting, unpackb = self.waiting, msgpack.unpackb
        # The members of one group message share its body and come one after another. Its first
        # decode goes to the first member and, when its values are all IMMUTABLE, a copy of it to
        # each of the others: no task runs before all of them are settled, so none changed it yet.
        last_data, buffer, first, flat = -1, None, {}, None  # -1: no body yet (0 is none)
        # The words results carry (rearm) are for the compiled module's receive_again only.
        for op, closure, status, text, data, length, _ in records:
            if closure or status != _native.OK or not data:
                self._settle_other(op, closure, status, text, data, length)
                continue
            entry = waiting.pop(op, None)
            if entry is None:
                continue
            future, client, _ = entry
            if future.done():  # its caller was cancelled before the result came: give it back
                self._cn_cancel(client, op)
            elif data == last_data:  # the next member of that group message: the same body
                if flat is None:
                    flat = all(type(value) in IMMUTABLE for value in first.values())
                future.set_result(first.copy() if flat else unpackb(buffer))
            else:
                last_data, buffer = data, self._buffer(self._ffi.cast("uint8_t *", data), length)
                first, flat = unpackb(buffer), None
                future.set_result(first)

    def _settle_other(self, op: int, closure: int, status: int, text: int, data: int, length: int) -> None:
        """Settles a result that is not a received message: a close's, a failure, or a result
        without a body (text is an address, lent until the next take; a result with a body and
        no closure is a received message, which the callers settle themselves)."""
        if closure == CLOSE:
            closed = self.closing.pop(op, None)
            if closed is not None and not closed.done():
                closed.set_result(None)
            return
        entry = self.waiting.pop(op, None)
        if entry is None:
            return
        future, client, publishing = entry
        if future.done():  # its caller was cancelled before the result came: give it back
            self._cn_cancel(client, op)
        elif status != _native.OK:
            detail = _native.text(self._ffi.cast("char *", text)) if text else ""
            future.set_exception(_native.error_for(status, detail, publishing))
        else:  # no body: a send's or a group_add's (None), a new_channel's (the name)
            future.set_result(_native.text(self._ffi.cast("char *", text)) if text else None)

    def free(self) -> None:
        """Ends the queue (its loop closes): the library withdraws what was pending here."""
        if self._freed:
            return
        self._freed = True
        if self._watcher is None:
            for fd in [self._reader.fileno(), *self._reading.values()]:
                try:
                    self.loop.remove_reader(fd)
                except (RuntimeError, ValueError, OSError):
                    pass
        for fd in self._reading.values():
            os.close(fd)
        self._reading.clear()
        if not _native.forked():
            _, lib = _native.load()
            lib.cn_queue_free(self.handle)
        self._close_sockets()
        for future, _, _ in self.waiting.values():
            if not future.done():
                future.set_exception(_native.ChannelLayerClosed("channels_nats: the event loop of this call closed"))
        self.waiting.clear()

    def _close_sockets(self) -> None:
        self._reader.close()
        self._writer.close()


_queues: dict[asyncio.AbstractEventLoop, LoopQueue] = {}
"""Each event loop's queue. Read without the lock (one dict lookup per call, the hot path of
every receive); changed only with it."""
_queues_lock = threading.Lock()

queue_of = _queues.get
"""The queue of an event loop, or None: the receive's hot path looks its loop's queue up with this
(one call), and falls back to for_running_loop."""


def for_running_loop() -> LoopQueue:
    """The result queue of the running event loop, made on first use."""
    loop = asyncio.get_running_loop()
    queue = _queues.get(loop)
    if queue is None:
        with _queues_lock:
            queue = _queues.get(loop)
            if queue is None:
                queue = _queues[loop] = LoopQueue(loop)
                _free_on_close(loop, queue)
    return queue


def _free_on_close(loop: asyncio.AbstractEventLoop, queue: LoopQueue) -> None:
    """Frees queue when loop closes (asyncio.run and async_to_sync make and close loops)."""
    close = loop.close

    def close_and_free() -> None:
        with _queues_lock:
            _queues.pop(loop, None)
        queue.free()
        close()

    loop.close = close_and_free  # type: ignore[method-assign]


def _forget_after_fork() -> None:
    """In a forked child, no queue of the parent's may be used: the next call makes a new one,
    which refuses (the library cannot run after a fork)."""
    _queues.clear()


if hasattr(os, "register_at_fork"):  # Windows has no fork
    os.register_at_fork(after_in_child=_forget_after_fork)


def free_all() -> None:
    """Frees every queue (the interpreter exits)."""
    with _queues_lock:
        queues = list(_queues.values())
        _queues.clear()
    for queue in queues:
        queue.free()


def wait_blocking(client: int, timeout: float) -> None:
    """Closes client from a thread with no event loop (interpreter exit), waiting at most timeout
    seconds for the close's result."""
    ffi, lib = _native.load()
    reader, writer = socket.socketpair()
    try:
        handle = ffi.new("cn_queue *")
        _native.check(lib.cn_queue_new(writer.fileno(), handle))
        try:
            if lib.cn_close(client, handle[0], ffi.cast("void *", CLOSE)) != _native.PENDING:
                return
            results, count = ffi.new("cn_result[]", 16), ffi.new("size_t *")
            while select.select([reader], [], [], timeout)[0]:
                reader.recv(4096)
                lib.cn_queue_take(handle[0], results, 16, count)
                if any(results[i].closure == ffi.cast("void *", CLOSE) for i in range(count[0])):
                    return
        finally:
            lib.cn_queue_free(handle[0])
    finally:
        reader.close()
        writer.close()

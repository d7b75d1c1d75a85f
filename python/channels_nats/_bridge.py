"""Results of the native library reaching asyncio event loops.

Every client puts the results of its pending operations into one result queue of the process
(cn_set_result_queue); the library writes a byte to a socket pair when the queue stops being
empty. Each event loop that started an operation watches the other end (add_reader) and takes
the results on its own thread: no library thread ever enters Python for them, so the loop never
hands the interpreter lock to another thread for a message. A loop without add_reader (the
Windows proactor) gets a watcher thread instead.

A pending operation is a Completion (a future on the caller's loop) registered under the integer
token that travels as the operation's closure. A result for another loop crosses over through
that loop's LoopInbox (one call_soon_threadsafe per batch). A result that can no longer reach its
caller - the future was cancelled, or the loop closed - is handed to the completion's abandon
hook, which for a receive puts the message back into its mailbox (S14).

Connect and close still report through a C callback on a library thread (_on_complete).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import select
import socket
import struct
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from . import _native

logger = logging.getLogger("channels_nats")

Abandon = Callable[[int, "bytes | None"], None]
"""Called with (status, body) when a result cannot be delivered to its caller."""


class LoopInbox:
    """Results waiting to be settled on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._items: deque[Callable[[], None]] = deque()
        self._scheduled = False

    def push(self, item: Callable[[], None]) -> bool:
        """Queues item to run on the loop; False when the loop is gone or closed."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            return False
        with self._lock:
            self._items.append(item)
            if self._scheduled:
                return True
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # closed since the check; the queue held only this item
            with self._lock:
                self._items.clear()
                self._scheduled = False
            return False
        return True

    def _drain(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        for item in items:
            item()


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox] = weakref.WeakKeyDictionary()
_inboxes_lock = threading.Lock()


def inbox_for(loop: asyncio.AbstractEventLoop) -> LoopInbox:
    with _inboxes_lock:
        inbox = _inboxes.get(loop)
        if inbox is None:
            inbox = _inboxes[loop] = LoopInbox(loop)
        return inbox


class Pending:
    """Something the library finishes later, registered under the token its closure carries."""

    __slots__ = ("token",)
    once = True
    """False for a stream's sink: it stays registered for every result of its token."""

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        raise NotImplementedError

    def register(self, token: int | None = None) -> None:
        """Registers under token (a new one when None). A result that was taken before the
        registration (another thread emptied the queue first) finishes it at once."""
        self.token = next(_tokens) if token is None else token
        with _pending_lock:
            early = _early.pop(self.token, None)
            if early is None:
                _pending[self.token] = self
        if early is not None:
            self.finish(*early)

    def closure(self) -> Any:
        return closure(self.token)

    def forget(self) -> None:
        """The operation finished at once or was withdrawn: no result will come."""
        with _pending_lock:
            _pending.pop(self.token, None)


class Completion(Pending):
    """One pending operation: the future its caller awaits on its own loop."""

    __slots__ = ("abandon", "future", "loop")

    def __init__(self, token: int | None = None, abandon: Abandon | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.future: asyncio.Future[tuple[str, bytes | None]] = loop.create_future()
        self.abandon = abandon
        self.register(token)  # first: whatever happens next, its result has an owner
        results().watch(loop)

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        """Runs on whichever thread took the result."""
        if asyncio._get_running_loop() is self.loop:  # pyright: ignore[reportPrivateUsage]
            self.settle(status, detail, body)
        elif not inbox_for(self.loop).push(lambda: self.settle(status, detail, body)):
            self.give_up(status, body)  # its loop is closed: nobody will settle it

    def settle(self, status: int, detail: str, body: bytes | None) -> None:
        """Runs on the caller's loop."""
        if self.future.done():  # cancelled meanwhile
            self.give_up(status, body)
        elif status == _native.OK:
            self.future.set_result((detail, body))
        else:
            self.future.set_exception(_native.error_for(status, detail))

    def give_up(self, status: int, body: bytes | None) -> None:
        if self.abandon is not None:
            try:
                self.abandon(status, body)
            except Exception:
                logger.exception("channels_nats: could not return an abandoned result")


_pending: dict[int, Pending] = {}
_early: dict[int, tuple[int, str, bytes | None]] = {}
"""Results taken before their operation was registered (the thread that started it had not
got the interpreter back yet); only tokens of pending operations can land here."""
_pending_lock = threading.Lock()  # _pending and _early change together
_tokens = itertools.count(1)


def next_token() -> int:
    return next(_tokens)


class _Types:
    void_p: Any = None


_types = _Types()


def closure(token: int) -> Any:
    """The closure argument that carries token."""
    ffi, _ = _native.load()
    if _types.void_p is None:  # ffi.typeof once: casting by name parses the type every time
        _types.void_p = ffi.typeof("void *")
    return ffi.cast(_types.void_p, token)


def _deliver_all(results: list[tuple[int, int, str, bytes | None]]) -> None:
    """Finishes the operations of (token, status, detail, body) results, in order."""
    finishing: list[tuple[Pending, int, str, bytes | None]] = []
    with _pending_lock:  # once per batch
        for token, status, detail, body in results:
            pending = _pending.get(token)
            if pending is None:
                _early[token] = (status, detail, body)
            else:
                if pending.once:
                    del _pending[token]
                finishing.append((pending, status, detail, body))
    for pending, status, detail, body in finishing:
        pending.finish(status, detail, body)


TAKE_BATCH = 1024
"""Results taken per cn_queue_take call."""


class _TakeScratch(threading.local):
    """cn_queue_take's out-parameters, one set per thread that takes results."""

    def __init__(self) -> None:
        ffi, _ = _native.load()
        if ffi.sizeof("cn_result") != _RESULT.size:
            raise RuntimeError(f"channels_nats: cn_result is {ffi.sizeof('cn_result')} bytes, not {_RESULT.size}")
        self.results = ffi.new("cn_result[]", TAKE_BATCH)
        self.count = ffi.new("size_t *")
        self.memory = ffi.new("void **")


class ResultQueue:
    """The process's result queue and the socket pair that signals it (see the module doc)."""

    def __init__(self) -> None:
        ffi, lib = _native.load()
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        handle = ffi.new("cn_queue *")
        _native.check(lib.cn_queue_new(self._writer.fileno(), handle))
        self.handle = int(handle[0])
        self._watched: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._watcher: threading.Thread | None = None
        self._last_watched: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._taking = threading.RLock()  # a result's finish may take again (a cancelled receive)
        self._scratch = _TakeScratch()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Makes loop take results when the queue is signalled. Runs on the loop's thread."""
        if loop is self._last_watched or loop in self._watched:
            return
        with self._lock:
            try:
                loop.add_reader(self._reader.fileno(), self.take)
            except NotImplementedError:  # a proactor loop: a thread watches for it
                if self._watcher is None:
                    watcher = threading.Thread(target=self._watch_forever, name="channels_nats results", daemon=True)
                    watcher.start()
                    self._watcher = watcher
            self._watched.add(loop)
            self._last_watched = loop  # the common case, one loop, without the weak set's cost

    def _watch_forever(self) -> None:
        while True:
            select.select([self._reader], [], [])
            self.take()

    def take(self) -> None:
        """Takes every result in the queue and finishes its operation (any thread)."""
        try:
            while self._reader.recv(4096):  # first the signal bytes, then the results: none is missed
                pass
        except (BlockingIOError, InterruptedError):
            pass
        # One thread at a time takes and hands over: results of one stream that two threads took
        # in two batches must reach its buffer in their order.
        with self._taking:
            self._take_all()

    def _take_all(self) -> None:
        ffi, lib = _native.load()
        scratch = self._scratch
        results, count, memory = scratch.results, scratch.count, scratch.memory
        while True:
            _native.check(lib.cn_queue_take(self.handle, results, TAKE_BATCH, count, memory))
            n = count[0]
            if n == 0:
                return
            try:
                batch = _unpack_results(ffi, ffi.buffer(results, n * _RESULT.size), memory[0])
            finally:
                lib.cn_free(memory[0])
            _deliver_all(batch)
            if n < TAKE_BATCH:
                return


_RESULT = struct.Struct("@PiPPN")
"""cn_result as laid out in memory (closure, status, text, data, len): read as integers in one go,
far cheaper than a cffi attribute read per field. Checked against the header on first use."""


def _unpack_results(ffi: Any, raw: Any, memory: Any) -> list[tuple[int, int, str, bytes | None]]:
    """(token, status, text, body) of each cn_result in raw. The texts and bodies lie back to back
    in memory, in the order of the results: copied in one piece, then sliced."""
    records = list(_RESULT.iter_unpack(raw))
    base = int(ffi.cast("uintptr_t", memory))
    end = base
    for _, _, text, data, length in reversed(records):  # the last result with a text or a body
        if data:
            end = data + length
            break
        if text:
            end = text + len(ffi.string(ffi.cast("char *", text))) + 1
            break
    block = ffi.buffer(memory, end - base)[:] if end > base else b""
    batch: list[tuple[int, int, str, bytes | None]] = []
    for token, status, text, data, length in records:
        detail = ""
        if text:
            at = text - base
            detail = block[at : block.index(b"\0", at)].decode("utf-8", "replace")
        if data:
            at = data - base
            batch.append((token, status, detail, block[at : at + length]))
        else:
            batch.append((token, status, detail, None))
    return batch


class _Results:
    queue: ResultQueue | None = None


_results = _Results()
_results_lock = threading.Lock()


def results() -> ResultQueue:
    """The process's result queue, made on first use."""
    queue = _results.queue
    if queue is None:
        with _results_lock:
            if _results.queue is None:
                _results.queue = ResultQueue()
            queue = _results.queue
    return queue


def _on_complete(token: Any, status: int, text: Any, data: Any, length: int) -> None:
    ffi, _ = _native.load()
    body = ffi.buffer(data, length)[:] if data != ffi.NULL else None
    detail = _native.text(text) if text != ffi.NULL else ""
    _deliver_all([(int(ffi.cast("uintptr_t", token)), status, detail, body)])


def _on_log(_closure: Any, level: int, message: Any) -> None:
    logger.log(level, _native.text(message))


class _Callbacks:
    complete: Any = None
    log: Any = None


_callbacks = _Callbacks()
_callbacks_lock = threading.Lock()


def callbacks() -> tuple[Any, Any]:
    """The C callbacks for completions and logs, made once per process (each costs executable
    memory in cffi's ABI mode)."""
    if _callbacks.complete is not None:
        return _callbacks.complete, _callbacks.log
    ffi, _ = _native.load()
    with _callbacks_lock:
        if _callbacks.complete is None:
            _callbacks.complete = ffi.callback(
                "void(void *, cn_status, const char *, const uint8_t *, size_t)", _on_complete
            )
            _callbacks.log = ffi.callback("void(void *, int, const char *)", _on_log)
    return _callbacks.complete, _callbacks.log

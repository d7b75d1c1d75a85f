"""Results of the native library reaching asyncio event loops.

Operations that have to wait finish on a library thread, through one C callback. Each pending
operation registers a Completion (a future on the caller's loop) under an integer token that
travels as the callback's closure. Results for one loop are queued in its LoopInbox, and a batch
of them costs one call_soon_threadsafe (coalesced wake-ups). A result that can no longer reach
its caller - the future was cancelled, or the loop closed - is handed to the completion's
abandon hook, which for a receive puts the message back into its mailbox (S14).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
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
    """Something a library callback finishes; finish() runs on the library thread."""

    __slots__ = ("token",)

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        raise NotImplementedError

    def register(self) -> None:
        self.token = next(_tokens)
        _pending[self.token] = self

    def closure(self) -> Any:
        ffi, _ = _native.load()
        return ffi.cast("void *", self.token)

    def forget(self) -> None:
        """The operation finished at once or was withdrawn: no callback will come."""
        _pending.pop(self.token, None)


class Completion(Pending):
    """One pending operation: the future its caller awaits on its own loop."""

    __slots__ = ("abandon", "future", "inbox")

    def __init__(self, abandon: Abandon | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[tuple[str, bytes | None]] = loop.create_future()
        self.inbox = inbox_for(loop)
        self.abandon = abandon
        self.register()

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        if not self.inbox.push(lambda: self.settle(status, detail, body)):
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
_tokens = itertools.count(1)


def _on_complete(closure: Any, status: int, text: Any, data: Any, length: int) -> None:
    ffi, _ = _native.load()
    pending = _pending.pop(int(ffi.cast("uintptr_t", closure)), None)
    if pending is None:
        return
    body = ffi.buffer(data, length)[:] if data != ffi.NULL else None
    detail = _native.text(text) if text != ffi.NULL else ""
    pending.finish(status, detail, body)


def _on_batch(_closure: Any, results: Any, count: int) -> None:
    """Every result that was ready, in one call: one GIL acquisition for the whole batch, and one
    wake-up per event loop."""
    ffi, _ = _native.load()
    null = ffi.NULL
    per_inbox: dict[LoopInbox, list[tuple[Completion, int, str, bytes | None]]] = {}
    for i in range(count):
        r = results[i]
        pending = _pending.pop(int(ffi.cast("uintptr_t", r.closure)), None)
        if pending is None:
            continue
        body = ffi.buffer(r.data, r.len)[:] if r.data != null else None
        detail = _native.text(r.text) if r.text != null else ""
        if isinstance(pending, Completion):
            per_inbox.setdefault(pending.inbox, []).append((pending, r.status, detail, body))
        else:
            pending.finish(r.status, detail, body)
    for inbox, settled in per_inbox.items():
        if not inbox.push(lambda settled=settled: _settle_all(settled)):
            for completion, status, _, body in settled:
                completion.give_up(status, body)  # its loop is closed: nobody will settle it


def _settle_all(settled: list[tuple[Completion, int, str, bytes | None]]) -> None:
    for completion, status, detail, body in settled:
        completion.settle(status, detail, body)


def _on_log(_closure: Any, level: int, message: Any) -> None:
    logger.log(level, _native.text(message))


class _Callbacks:
    complete: Any = None
    batch: Any = None
    log: Any = None


_callbacks = _Callbacks()
_callbacks_lock = threading.Lock()


def callbacks() -> tuple[Any, Any]:
    """The C callbacks for completions and logs, made once per process (each costs executable
    memory in cffi's ABI mode)."""
    ffi, _ = _native.load()
    with _callbacks_lock:
        if _callbacks.complete is None:
            _callbacks.complete = ffi.callback(
                "void(void *, cn_status, const char *, const uint8_t *, size_t)", _on_complete
            )
            _callbacks.batch = ffi.callback("void(void *, const cn_result *, size_t)", _on_batch)
            _callbacks.log = ffi.callback("void(void *, int, const char *)", _on_log)
    return _callbacks.complete, _callbacks.log


def batch_callback() -> Any:
    """The C callback that receives results in batches (cn_set_batch_callback)."""
    callbacks()
    return _callbacks.batch

"""This process's member of the list's sync group, on the channel layer itself.

The pages open on a process hear every change through wireview's broadcast (live.py). A process
with no page open hears nothing that way, and a process that starts later has heard nothing yet,
so each process also keeps one channel of its own in the group "todos.sync":

- every change is also sent to that group (publish), so every process's copy follows every change,
  whether or not a page is open on it;
- a process that starts asks the group for the list ("board.hello" with its channel), every other
  process answers with its copy ("board.snapshot", sent to that channel), and the newcomer takes
  each item (store.Board.apply keeps the newest revision of each).

It starts with the first request the process serves (start_replica wraps the ASGI application),
and that request waits for the first answer, at most SYNC_WAIT, so the first page a process renders
already shows the list. If the layer fails here, the page still works, with a list that follows
only the pages open on this process; the failure is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from asgiref.typing import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from channels.layers import get_channel_layer

from .store import BOARD, Item

SYNC_GROUP = "todos.sync"
SYNC_WAIT = 0.5
"""Seconds the first request of a process waits for another process's copy of the list."""

log = logging.getLogger("todos")


class Replica:
    def __init__(self) -> None:
        self._opening: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._receiving: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def ensure_started(self) -> None:
        """Joins the group and asks for the list once per event loop; later calls return at once."""
        loop = asyncio.get_running_loop()
        if self._opening is None or self._loop is not loop:
            self._loop = loop
            self._synced = asyncio.Event()
            self._opening = loop.create_task(self._open())
        # Shielded: a request that goes away does not cancel the start for the others.
        await asyncio.shield(self._opening)

    async def _open(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            log.warning("no channel layer: the list of this process follows only its own pages")
            return
        try:
            channel = await layer.new_channel()
            await layer.group_add(SYNC_GROUP, channel)
            self._receiving = asyncio.get_running_loop().create_task(self._receive(channel))
            await layer.group_send(SYNC_GROUP, {"type": "board.hello", "reply_to": channel})
        except Exception:
            log.exception("could not join %s: the list of this process follows only its own pages", SYNC_GROUP)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), SYNC_WAIT)
        log.info("joined %s with %d items", SYNC_GROUP, len(BOARD.items()))

    async def _receive(self, channel: str) -> None:
        layer = get_channel_layer()
        assert layer is not None
        while True:
            try:
                message = await layer.receive(channel)
                await self._handle(layer, channel, message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the sync channel of this process failed; trying again in 1 s")
                await asyncio.sleep(1)

    async def _handle(self, layer: Any, channel: str, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "board.item":
            if item := Item.from_message(message.get("item")):
                BOARD.apply(item)
        elif kind == "board.hello":
            reply_to = message.get("reply_to")
            if isinstance(reply_to, str) and reply_to != channel:
                await layer.send(reply_to, {"type": "board.snapshot", "items": BOARD.snapshot()})
        elif kind == "board.snapshot":
            items = message.get("items")
            for data in items if isinstance(items, list) else []:
                if item := Item.from_message(data):
                    BOARD.apply(item)
            self._synced.set()


REPLICA = Replica()


async def publish(item: Item) -> None:
    """Sends a changed item to every process's copy of the list (this one's too: a no-op there)."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(SYNC_GROUP, {"type": "board.item", "item": item.as_message()})


def start_replica(app: ASGI3Application) -> ASGI3Application:
    """The ASGI application `app`, starting this process's replica with its first request."""

    async def application(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] in ("http", "websocket"):
            await REPLICA.ensure_started()
        await app(scope, receive, send)

    return application

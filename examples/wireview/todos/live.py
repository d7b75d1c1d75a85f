"""The wireview component of the shared todo list.

Its state is not in the component: the list is this process's (store.BOARD), and the component only
renders it. A handler changes the list of its own process, then broadcasts the changed item on the
topic "todos" with wireview's broadcast(). Every XTodoList on every process is subscribed to that
topic: the channel layer (NATS) carries the broadcast to each process, wireview calls
notification() on each of its components there, and each one puts the item into its process's
list and renders again. Applying an item is idempotent (store.py), so the many components of a
process may all apply the same one. The item also goes to the sync group (replica.py), which keeps
the list of a process with no page open up to date.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from wireview import JS, Component

from .replica import publish
from .store import BOARD, MAX_TEXT, Item

TOPIC = "todos"
"""The wireview topic (a channel layer group) of the list's changes."""


class XTodoList(Component):
    class Meta:
        template_name = "todos/list.html"
        subscriptions: ClassVar[set[str]] = {TOPIC}

    live: bool = False
    """Set once this component has joined over its WebSocket: the page shows "live" then."""

    @property
    def items(self) -> list[Item]:
        return BOARD.items()

    @property
    def left(self) -> int:
        return sum(1 for item in BOARD.items() if not item.done)

    @property
    def process(self) -> str:
        return settings.PROCESS_NAME

    @property
    def max_text(self) -> int:
        return MAX_TEXT

    async def joined(self) -> None:
        self.live = True

    async def add(self, text: str = "") -> None:
        if item := BOARD.add(text):
            await self._share(item)
        await self.push_js(JS().set_value("#new-item", ""))

    async def toggle(self, item_id: str) -> None:
        current = BOARD.get(item_id)
        if current and (item := BOARD.change(item_id, done=not current.done)):
            await self._share(item)

    async def remove(self, item_id: str) -> None:
        if item := BOARD.change(item_id, removed=True):
            await self._share(item)

    async def notification(self, channel: str, **kwargs: Any) -> None:
        # Another component's change (or this one's own, back from the layer: a no-op).
        if item := Item.from_message(kwargs.get("item")):
            BOARD.apply(item)

    async def _share(self, item: Item) -> None:
        await publish(item)
        await self.broadcast(TOPIC, item=item.as_message())

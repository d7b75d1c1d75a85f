"""The todo list of this process.

Each process keeps its own copy of the list in memory; nothing is stored anywhere else. A change
is made on the copy of the process whose page it came from and travels to the other processes as
the changed item, whole (store.Item.as_message). An item carries a revision, and a copy takes an
item only when it is newer than the one it has (a higher revision; between two changes of the
same revision, made at once on two processes, the higher writer id wins). So a copy can take the
same item any number of times and in any order and ends up the same as every other copy that took
the same items: each process applies what it hears, however often it hears it.

A removed item stays as a tombstone, so that an older copy of it arriving later does not bring it
back. The page renders the list in worker threads while the event loop changes it: one lock.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from django.conf import settings

MAX_TEXT = 200
"""Longer texts are cut to this many characters."""
MAX_ITEMS = 100
"""A list holds at most this many items; adding more is refused."""
MAX_TOMBSTONES = 1000
"""Removed items kept to refuse late copies of them; the oldest go first."""


@dataclass(frozen=True)
class Item:
    id: str
    text: str
    done: bool
    removed: bool
    created: float
    """When it was added (Unix time): the list's order."""
    origin: str
    """The name of the process it was added on (django-A, ...)."""
    rev: int
    writer: str
    """The process that made this revision: a name with a random suffix, unique per process."""

    def newer_than(self, other: Item) -> bool:
        return (self.rev, self.writer) > (other.rev, other.writer)

    def as_message(self) -> dict[str, Any]:
        """The item as the channel layer carries it: str, bool, float and int values only."""
        return asdict(self)

    @classmethod
    def from_message(cls, data: object) -> Item | None:
        """The item a message carries, or None when it is not one (nothing from outside is trusted)."""
        if not isinstance(data, dict):
            return None
        try:
            item = cls(
                id=str(data["id"]),
                text=str(data["text"])[:MAX_TEXT],
                done=bool(data["done"]),
                removed=bool(data["removed"]),
                created=float(data["created"]),
                origin=str(data["origin"]),
                rev=int(data["rev"]),
                writer=str(data["writer"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return item if item.id else None


class Board:
    """One process's copy of the list."""

    def __init__(self, process: str) -> None:
        self.process = process
        self.writer = f"{process}.{secrets.token_hex(4)}"
        self._items: dict[str, Item] = {}
        self._lock = threading.Lock()

    def items(self) -> list[Item]:
        """The items to show, oldest first."""
        with self._lock:
            shown = [item for item in self._items.values() if not item.removed]
        return sorted(shown, key=lambda item: (item.created, item.id))

    def get(self, item_id: str) -> Item | None:
        with self._lock:
            item = self._items.get(item_id)
        return None if item is None or item.removed else item

    def add(self, text: str) -> Item | None:
        """A new item on this process, or None (empty text, or the list is full)."""
        text = " ".join(text.split())[:MAX_TEXT]
        if not text or len(self.items()) >= MAX_ITEMS:
            return None
        item = Item(secrets.token_hex(8), text, False, False, time.time(), self.process, 1, self.writer)
        self.apply(item)
        return item

    def change(self, item_id: str, **fields: Any) -> Item | None:
        """The next revision of an item with `fields` changed (done=..., removed=...), or None if
        there is no such item."""
        with self._lock:
            current = self._items.get(item_id)
            if current is None or current.removed:
                return None
            item = replace(current, **fields, rev=current.rev + 1, writer=self.writer)
            self._items[item_id] = item
            self._prune()
        return item

    def apply(self, item: Item) -> bool:
        """Takes an item heard from any process; True when it changed this copy."""
        with self._lock:
            current = self._items.get(item.id)
            if current is not None and not item.newer_than(current):
                return False
            self._items[item.id] = item
            self._prune()
        return True

    def _prune(self) -> None:
        """Drops the oldest tombstones past MAX_TOMBSTONES (the lock is held)."""
        tombstones = [item for item in self._items.values() if item.removed]
        if len(tombstones) > MAX_TOMBSTONES:
            tombstones.sort(key=lambda item: item.created)
            for item in tombstones[: len(tombstones) - MAX_TOMBSTONES]:
                del self._items[item.id]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every item, tombstones included, as messages: what a process that starts later needs."""
        with self._lock:
            return [item.as_message() for item in self._items.values()]


BOARD = Board(settings.PROCESS_NAME)
"""This process's list."""

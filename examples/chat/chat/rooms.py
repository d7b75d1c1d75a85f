"""Room names and the group each room is."""

import re

ROOM_NAME = re.compile(r"[A-Za-z0-9_-]{1,50}")
"""A room name: ASCII letters, digits, '-' and '_', 1 to 50 characters."""


def valid_room(name: str) -> bool:
    return ROOM_NAME.fullmatch(name) is not None


def group_name(room: str) -> str:
    """The channel layer group of a room: every socket in the room, in every process, is a member."""
    return f"chat_{room}"

"""The chat consumer: one WebSocket, a member of its room's group for as long as it is open."""

import json
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from .rooms import group_name, valid_room

MAX_TEXT = 2000
"""Longer messages are cut to this many characters."""


class ChatConsumer(AsyncWebsocketConsumer):
    group: str | None = None

    async def connect(self) -> None:
        route = self.scope.get("url_route")
        room = str(route["kwargs"].get("room", "")) if route else ""
        if not valid_room(room):
            await self.close()  # before accept: the handshake is refused
            return
        self.group = group_name(room)
        # Returns once the NATS server confirmed the subscription: from here on nothing sent
        # to the room is missed.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Takes {"text": "..."}; anything else is ignored."""
        if self.group is None or text_data is None:
            return
        try:
            data: Any = json.loads(text_data)
        except ValueError:
            return
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text.strip():
            return
        # One publish: NATS hands it to every member of the room, in this process and the others.
        await self.channel_layer.group_send(
            self.group, {"type": "chat.message", "text": text[:MAX_TEXT], "sender": settings.CHAT_SENDER}
        )

    async def chat_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"text": event["text"], "sender": event["sender"]}))

"""The memory benchmark's consumer: joins group "bench" on connect, then idles.

Idling is Channels' own pending receive on the consumer's channel. A client text frame
"broadcast" makes this consumer group_send one message to the group; every member forwards it
to its WebSocket as "bench:<text>", which is how bench/memory.py checks the setup is real.
"""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

GROUP = "bench"


class BenchConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        assert self.channel_layer is not None
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data and text_data.startswith("broadcast"):
            assert self.channel_layer is not None
            await self.channel_layer.group_send(GROUP, {"type": "bench.message", "text": text_data})
        elif text_data == "ping":
            await self.send(text_data="pong")

    async def bench_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data="bench:" + str(event.get("text", "")))

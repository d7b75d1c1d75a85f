from __future__ import annotations

import asyncio

from channels_nats import NatsChannelLayer


async def test_round_trip(layer: NatsChannelLayer, make_layer) -> None:
    other = make_layer()
    channel = await layer.new_channel()
    await other.send(channel, {"type": "test.message", "text": "안녕"})
    assert await layer.receive(channel) == {"type": "test.message", "text": "안녕"}
    await layer.group_add("room", channel)
    await other.group_send("room", {"type": "g", "b": b"\x00\x01"})
    assert await asyncio.wait_for(layer.receive(channel), 5) == {"type": "g", "b": b"\x00\x01"}
    assert layer.stats()["delivered"] == 2

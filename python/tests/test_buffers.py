"""Receive buffers (channels_nats/_buffers.py): a process channel with a backlog is taken many
messages per call, and nothing buffered is lost, reordered, or kept past its expiry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from conftest import unique, wait_until

from channels_nats import NatsChannelLayer, _buffers

MakeLayer = Callable[..., NatsChannelLayer]


async def backlog(layer: NatsChannelLayer, sender: NatsChannelLayer, channel: str, count: int) -> None:
    """count messages {"type": "m", "i": 0...} waiting in channel's mailbox, for sure: a marker
    sent after them to another process channel of layer arrives after them (S10). The marker
    counts as one delivery in the stats."""
    marker = await layer.new_channel()
    for i in range(count):
        await sender.send(channel, {"type": "m", "i": i})
    await sender.send(marker, {"type": "marker"})
    assert await asyncio.wait_for(layer.receive(marker), 5) == {"type": "marker"}


async def received(layer: NatsChannelLayer, channel: str, count: int) -> list[int]:
    return [(await asyncio.wait_for(layer.receive(channel), 5))["i"] for _ in range(count)]


async def test_a_backlog_comes_in_order_with_one_call_for_many(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(capacity=500), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 200)
    assert (await layer.receive(channel))["i"] == 0
    # The first receive took PREFETCH in one call: the library counts them delivered.
    assert layer.stats()["delivered"] == 1 + _buffers.PREFETCH
    assert await received(layer, channel, 199) == list(range(1, 200))
    assert layer.stats()["delivered"] == 1 + 200
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.1)


async def test_buffered_messages_expire_as_in_the_mailbox_and_are_counted(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(expiry=0.5), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 10)
    assert (await layer.receive(channel))["i"] == 0  # 9 are buffered now
    await asyncio.sleep(0.6)  # and expired
    await sender.send(channel, {"type": "m", "i": 10})
    assert (await asyncio.wait_for(layer.receive(channel), 5))["i"] == 10
    stats = layer.stats()
    assert stats["dropped"]["expired"] == 9
    assert stats["delivered"] == 1 + 2


async def test_an_untouched_buffer_goes_back_and_reaches_another_loop(make_layer: MakeLayer) -> None:
    """A consumer that stops after one message of a backlog does not keep the rest: after
    _buffers.IDLE they are in the mailbox again (not delivered), in order, for any receiver."""
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 20)
    assert (await layer.receive(channel))["i"] == 0
    assert layer.stats()["delivered"] == 1 + 20
    await wait_until(lambda: layer.stats()["delivered"] == 1 + 1, "the buffer to go back", timeout=_buffers.IDLE * 4)

    def elsewhere() -> list[int]:
        return asyncio.run(received(layer, channel, 19))

    assert await asyncio.to_thread(elsewhere) == list(range(1, 20))


async def test_flush_empties_the_buffers_too(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 10)
    await layer.receive(channel)
    await layer.flush()
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "m", "i": 100})
    assert await received(layer, channel, 1) == [100]


async def test_a_cancelled_receive_loses_nothing_of_a_buffer(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 30)
    got: list[int] = []
    for _ in range(40):  # a receive cancelled at every point: before, while or after it takes
        task = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0)
        task.cancel()
        try:
            got.append((await task)["i"])
        except asyncio.CancelledError:
            pass
    got += await received(layer, channel, 30 - len(got))
    assert got == list(range(30))


async def test_plain_channels_are_not_buffered(make_layer: MakeLayer) -> None:
    """A plain channel's backlog stays in the mailbox, from where a release hands it back to the
    other readers of the queue group (S6): a receive takes one message, not the rest."""
    first, sender = make_layer(), make_layer()
    channel = unique("plain-unbuffered")
    reader = asyncio.ensure_future(first.receive(channel))
    await wait_until(lambda: first.stats().get("subscriptions", 0) >= 1, "the plain channel's subscription")
    await asyncio.sleep(0.2)  # confirmed by the server
    for i in range(10):
        await sender.send(channel, {"type": "m", "i": i})
    assert (await asyncio.wait_for(reader, 5))["i"] == 0
    assert first.stats()["delivered"] == 1
    await asyncio.sleep(0.1)
    assert first.stats()["delivered"] == 1  # nothing taken ahead


async def test_close_with_a_buffer_then_a_new_connection_starts_clean(make_layer: MakeLayer) -> None:
    layer, sender = make_layer(), make_layer()
    channel = await layer.new_channel()
    await backlog(layer, sender, channel, 10)
    await layer.receive(channel)
    await layer.close()  # the 9 buffered go back to the library before the connection ends
    fresh = await layer.new_channel()  # reconnects: a new client, new buffers
    await backlog(layer, sender, fresh, 3)
    assert await received(layer, fresh, 3) == [0, 1, 2]
    assert layer.stats()["delivered"] == 1 + 3

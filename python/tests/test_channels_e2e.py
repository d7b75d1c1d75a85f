"""Django Channels end to end on NatsChannelLayer: consumers, get_channel_layer(), the
WebsocketCommunicator and ApplicationCommunicator test helpers, and sync code through
async_to_sync.

Settings are configured once for the test process; each test gets its own CHANNEL_LAYERS through
override_settings, which makes channels' ChannelLayerManager drop its cached backends on entry and
on exit (channels/layers.py, ChannelLayerManager._reset_backends). Two aliases, "default" and
"other", are two layer instances on the same server and prefix: each stands for one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar, Protocol

import django
import pytest
from asgiref.sync import async_to_sync
from channels.consumer import SyncConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import channel_layers, get_channel_layer
from channels.routing import URLRouter
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.conf import settings
from django.test import override_settings
from django.urls import path

from channels_nats import NatsChannelLayer

if not settings.configured:
    settings.configure(INSTALLED_APPS=[], CHANNEL_LAYERS={}, USE_TZ=True)
    django.setup()

pytestmark = pytest.mark.timeout(60)

BACKEND = "channels_nats.NatsChannelLayer"
ROOM = "room"
WAIT = 5.0
"""Seconds a communicator waits for a message before the test fails (Channels' default is 1)."""


class Server(Protocol):
    """What these tests use of conftest's NatsServer."""

    monitor_port: int

    @property
    def url(self) -> str: ...

    def num_connections(self) -> int: ...


@contextlib.contextmanager
def layers_on(url: str) -> Iterator[str]:
    """CHANNEL_LAYERS with aliases "default" and "other" on url, under a prefix of their own
    (so the group can be called "room" on a shared server). Yields the prefix."""
    prefix = f"e2e{uuid.uuid4().hex[:10]}"
    config = {"BACKEND": BACKEND, "CONFIG": {"servers": [url], "prefix": prefix}}
    with override_settings(CHANNEL_LAYERS={"default": config, "other": config}):
        yield prefix


async def close_cached_layers() -> None:
    for layer in list(channel_layers.backends.values()):
        assert isinstance(layer, NatsChannelLayer)
        await layer.flush()
        await layer.close()


@pytest.fixture
async def configured(nats_url: str) -> AsyncIterator[str]:
    with layers_on(nats_url) as prefix:
        yield prefix
        await close_cached_layers()


def layer_for(alias: str) -> NatsChannelLayer:
    layer = get_channel_layer(alias)
    assert isinstance(layer, NatsChannelLayer)
    return layer


# ---- the application -------------------------------------------------------------------------


class ChatConsumer(AsyncWebsocketConsumer):
    """Joins ROOM on connect, broadcasts what the socket says, forwards chat.message events."""

    channel_names: ClassVar[list[str]] = []
    """The channel name of every consumer that connected (tests reset it)."""

    async def connect(self) -> None:
        await self.channel_layer.group_add(ROOM, self.channel_name)
        ChatConsumer.channel_names.append(self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(ROOM, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.channel_layer.group_send(ROOM, {"type": "chat.message", "text": text_data})

    async def chat_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["text"])


class OtherProcessChatConsumer(ChatConsumer):
    """The same consumer on the "other" layer instance: a consumer of another process."""

    channel_layer_alias = "other"


# channels' URLRouter is annotated for its own route types; Django's path() is what users pass.
routes: list[Any] = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/other/", OtherProcessChatConsumer.as_asgi()),
]
application = URLRouter(routes)


async def connected(url: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, url)
    accepted, _ = await communicator.connect(timeout=WAIT)
    assert accepted
    return communicator


# ---- websocket consumers ---------------------------------------------------------------------


async def test_chat_message_reaches_both_clients_across_layer_instances(configured: str) -> None:
    ChatConsumer.channel_names = []
    first = await connected("/ws/chat/")
    second = await connected("/ws/other/")
    assert layer_for("default") is not layer_for("other")
    assert layer_for("default").stats()["client_id"] != layer_for("other").stats()["client_id"]

    await first.send_to(text_data="hello from the first")
    assert await first.receive_from(timeout=WAIT) == "hello from the first"
    assert await second.receive_from(timeout=WAIT) == "hello from the first"

    await second.send_to(text_data="안녕 from the second")
    assert await first.receive_from(timeout=WAIT) == "안녕 from the second"
    assert await second.receive_from(timeout=WAIT) == "안녕 from the second"

    assert await first.receive_nothing(0.2)
    assert await second.receive_nothing(0.2)
    await first.disconnect()
    await second.disconnect()


async def test_disconnect_leaves_the_group(configured: str) -> None:
    ChatConsumer.channel_names = []
    staying = await connected("/ws/chat/")
    leaving = await connected("/ws/other/")  # alone on the "other" layer
    third = await connected("/ws/chat/")
    leaving_channel = ChatConsumer.channel_names[1]
    other = layer_for("other")
    assert other.stats()["groups"] == 1

    await leaving.disconnect()
    # No membership is left in the leaving consumer's process...
    assert other.stats()["groups"] == 0
    assert layer_for("default").stats()["groups"] == 1

    await third.send_to(text_data="after the disconnect")
    assert await staying.receive_from(timeout=WAIT) == "after the disconnect"
    assert await third.receive_from(timeout=WAIT) == "after the disconnect"
    # ...and the broadcast did not reach its channel: a receive on it finds nothing.
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(other.receive(leaving_channel), 0.5)
    await staying.disconnect()
    await third.disconnect()


async def test_layer_message_to_a_consumer_channel(configured: str) -> None:
    """channels' test_async_websocket_consumer_specific_channel_layer, with the channel name
    captured from the consumer (the layer keeps no public channel list)."""
    ChatConsumer.channel_names = []
    client = await connected("/ws/chat/")
    channel = ChatConsumer.channel_names[0]
    await layer_for("other").send(channel, {"type": "chat.message", "text": "direct"})
    assert await client.receive_from(timeout=WAIT) == "direct"
    await client.disconnect()


# ---- sync code ---------------------------------------------------------------------------------


class SyncRelay(SyncConsumer):
    """Relays a "relay" event, from its socket or from the layer, with async_to_sync: to a
    channel (send) and to a group (group_send)."""

    channel_names: ClassVar[list[str]] = []

    def relay(self, message: dict[str, Any]) -> None:
        SyncRelay.channel_names.append(self.channel_name)
        forwarded = {"type": "relayed", "text": message["text"], "by": self.channel_name}
        async_to_sync(self.channel_layer.send)(message["reply_to"], forwarded)
        async_to_sync(self.channel_layer.group_send)(message["group"], forwarded)


async def test_sync_consumer_sends_and_group_sends_with_async_to_sync(configured: str) -> None:
    SyncRelay.channel_names = []
    receiver = layer_for("other")
    reply_to = await receiver.new_channel()
    member = await receiver.new_channel()
    await receiver.group_add("watchers", member)

    communicator = ApplicationCommunicator(SyncRelay.as_asgi(), {"type": "channel"})
    try:
        await communicator.send_input({"type": "relay", "text": "one", "reply_to": reply_to, "group": "watchers"})
        first = await asyncio.wait_for(receiver.receive(reply_to), WAIT)
        assert await asyncio.wait_for(receiver.receive(member), WAIT) == first
        consumer_channel = SyncRelay.channel_names[0]
        assert first == {"type": "relayed", "text": "one", "by": consumer_channel}

        # The same handler, reached through the consumer's own channel on the layer.
        await receiver.send(
            consumer_channel, {"type": "relay", "text": "two", "reply_to": reply_to, "group": "watchers"}
        )
        second = await asyncio.wait_for(receiver.receive(reply_to), WAIT)
        assert await asyncio.wait_for(receiver.receive(member), WAIT) == second
        assert second == {"type": "relayed", "text": "two", "by": consumer_channel}
    finally:
        communicator.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await communicator.future


async def test_sync_code_in_a_thread_group_sends_to_an_async_receiver(configured: str) -> None:
    receiver = layer_for("other")
    channel = await receiver.new_channel()
    await receiver.group_add("news", channel)
    sender = layer_for("default")

    def sync_view() -> None:
        # No event loop in this thread: each async_to_sync call runs on a new, short-lived loop.
        for n in range(3):
            async_to_sync(sender.group_send)("news", {"type": "news.item", "n": n})
        async_to_sync(sender.send)(channel, {"type": "news.done"})

    await asyncio.to_thread(sync_view)
    got = [await asyncio.wait_for(receiver.receive(channel), WAIT) for _ in range(4)]
    assert got == [{"type": "news.item", "n": n} for n in range(3)] + [{"type": "news.done"}]


def total_connections(server: Server) -> int:
    """Connections the server accepted since it started (its /varz counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as r:
        return int(json.load(r)["total_connections"])


async def test_async_to_sync_group_send_twenty_times_opens_no_extra_connection(own_nats_server: Server) -> None:
    """S11: the reference layer leaked a connection per async_to_sync call."""
    with layers_on(own_nats_server.url):
        try:
            receiver = layer_for("other")
            channel = await receiver.new_channel()
            await receiver.group_add("g", channel)
            assert own_nats_server.num_connections() == 1
            accepted_before = total_connections(own_nats_server)
            layer = layer_for("default")
            client_ids: list[str] = []

            def sync_code() -> None:
                for n in range(20):
                    async_to_sync(layer.group_send)("g", {"type": "tick", "n": n})
                    client_ids.append(layer.stats()["client_id"])

            await asyncio.to_thread(sync_code)
            got = [await asyncio.wait_for(receiver.receive(channel), WAIT) for _ in range(20)]
            assert got == [{"type": "tick", "n": n} for n in range(20)]
            assert own_nats_server.num_connections() == 2  # the receiver's and this layer's one
            assert total_connections(own_nats_server) == accepted_before + 1
            assert len(set(client_ids)) == 1
            assert layer.stats()["published"] == 20
        finally:
            await close_cached_layers()

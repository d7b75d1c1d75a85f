"""ASGI entry point of the memory benchmark's minimal consumer app (bench/memory.py, scenario 6).

    BENCH_LAYER=nats|redis|redis-pubsub|inmemory|reference BENCH_NATS=nats://... BENCH_REDIS=redis://...
    python -m daphne -b 127.0.0.1 -p PORT asgi:application        (with this directory on sys.path)

Settings come from django.conf.settings.configure here (no settings module); the only route is the
WebSocket consumer in consumers.py. "reference" is the PyPI nats-py layer, which is also imported
as channels_nats: it is the same backend path, run with the reference root's Python.
"""

from __future__ import annotations

import os
from typing import Any

import django
from django.conf import settings


def channel_layers() -> dict[str, Any]:
    """CHANNEL_LAYERS for the layer named by BENCH_LAYER."""
    layer = os.environ.get("BENCH_LAYER", "inmemory")
    nats_url = os.environ.get("BENCH_NATS", "nats://127.0.0.1:4222")
    redis_url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")
    if layer in ("nats", "reference"):
        backend: dict[str, Any] = {"BACKEND": "channels_nats.NatsChannelLayer", "CONFIG": {"servers": [nats_url]}}
    elif layer == "redis":
        backend = {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [redis_url]}}
    elif layer == "redis-pubsub":
        backend = {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [redis_url]}}
    elif layer == "inmemory":
        backend = {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    else:
        raise ValueError(f"BENCH_LAYER: unknown layer {layer!r}")
    return {"default": backend}


if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-memory-not-secret",
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["channels"],
        CHANNEL_LAYERS=channel_layers(),
        USE_TZ=True,
    )
    django.setup()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs the settings above)
from consumers import BenchConsumer  # noqa: E402

application = ProtocolTypeRouter({"websocket": BenchConsumer.as_asgi()})

from typing import Any

from django.urls import re_path

from . import consumers

# Any name is routed; the consumer refuses the invalid ones (the handshake gets a 403).
websocket_urlpatterns: list[Any] = [re_path(r"^ws/chat/(?P<room>[^/]+)/$", consumers.ChatConsumer.as_asgi())]

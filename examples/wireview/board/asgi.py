"""ASGI entry point: HTTP to Django (static files too), WebSockets to wireview.

Run with: daphne -b 127.0.0.1 -p 8011 board.asgi:application  (DJANGO_SETTINGS_MODULE=board.settings)
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")

import django

django.setup()  # before wireview.urls: its consumer imports Django models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from todos.replica import start_replica  # noqa: E402
from wireview.urls import websocket_urlpatterns  # noqa: E402

# daphne and uvicorn serve only this application, so it serves wireview's JavaScript itself. A
# deployment puts a web server or WhiteNoise in front for static files instead.
http = ASGIStaticFilesHandler(get_asgi_application())

# wireview's consumer checks the Origin against ALLOWED_HOSTS itself.
websocket = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # pyright: ignore[reportArgumentType]
application = start_replica(ProtocolTypeRouter({"http": http, "websocket": websocket}))

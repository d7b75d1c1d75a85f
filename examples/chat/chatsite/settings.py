"""Settings of the chat example: Django Channels on channels_nats.NatsChannelLayer, no database.

Environment:
    NATS_URL              NATS server URL(s), comma-separated (default nats://127.0.0.1:4222)
    CHAT_SENDER           the label this process puts on the messages typed into it (default "django")
    DJANGO_DEBUG          "1" turns DEBUG on (default off)
    DJANGO_ALLOWED_HOSTS  comma-separated host names (default 127.0.0.1,localhost,[::1])
    DJANGO_SECRET_KEY     the secret key (default: a fixed development key; set one for anything public)
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "channels-nats-chat-example-development-key-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") in ("1", "true", "True", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]

# No database, no auth, no sessions: the chat keeps nothing, every message goes through NATS.
INSTALLED_APPS = ["daphne", "channels", "chat"]
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware"]
DATABASES: dict[str, dict[str, str]] = {}

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
USE_TZ = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_nats.NatsChannelLayer",
        "CONFIG": {
            "servers": [u.strip() for u in os.environ.get("NATS_URL", "nats://127.0.0.1:4222").split(",") if u.strip()],
            "connect_options": {"name": f"chat {os.environ.get('CHAT_SENDER', 'django')}"},
        },
    }
}

CHAT_SENDER = os.environ.get("CHAT_SENDER", "django")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}

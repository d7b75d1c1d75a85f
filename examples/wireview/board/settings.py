"""Settings of the wireview example: a shared todo list on channels_nats.NatsChannelLayer, no database.

Environment:
    NATS_URL              NATS server URL(s), comma-separated (default nats://127.0.0.1:4222)
    WIREVIEW_PROCESS      the name of this process, shown on its page (default "django")
    DJANGO_DEBUG          "1" turns DEBUG on (default off)
    DJANGO_ALLOWED_HOSTS  comma-separated host names (default 127.0.0.1,localhost,[::1])
    DJANGO_SECRET_KEY     the secret key (default: a fixed development key; set one for anything public).
                          Every process must have the same: wireview signs each component's state with it.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "channels-nats-wireview-example-development-key-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") in ("1", "true", "True", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]

# daphne first (runserver speaks ASGI), then wireview and Channels. auth and contenttypes because
# wireview's consumer imports the auth models; sessions for AuthMiddlewareStack. No database: the
# sessions live in signed cookies and nobody logs in.
INSTALLED_APPS = [
    "daphne",
    "wireview",
    "channels",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "todos",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
DATABASES: dict[str, dict[str, str]] = {}
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"

ROOT_URLCONF = "board.urls"
ASGI_APPLICATION = "board.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
STATIC_URL = "static/"
USE_TZ = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_nats.NatsChannelLayer",
        "CONFIG": {
            "servers": [u.strip() for u in os.environ.get("NATS_URL", "nats://127.0.0.1:4222").split(",") if u.strip()],
            "connect_options": {"name": f"wireview {os.environ.get('WIREVIEW_PROCESS', 'django')}"},
        },
    }
}

PROCESS_NAME = os.environ.get("WIREVIEW_PROCESS", "django")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"wireview": {"level": "WARNING"}},
}

"""The Django project of the wireview example (settings, ASGI application, URLs)."""

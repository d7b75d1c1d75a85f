from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.shortcuts import render

from .rooms import valid_room


def room(request: HttpRequest, room: str) -> HttpResponse:
    if not valid_room(room):
        return HttpResponseNotFound(b"Room names are 1 to 50 ASCII letters, digits, '-' or '_'.\n", "text/plain")
    return render(request, "chat/room.html", {"room": room, "sender": settings.CHAT_SENDER})

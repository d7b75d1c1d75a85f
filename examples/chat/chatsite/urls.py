from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/chat/lobby/", permanent=False)),
    path("chat/", include("chat.urls")),
]

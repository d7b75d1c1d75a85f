from django.urls import include, path
from todos.views import index

urlpatterns = [
    path("", include("wireview.urls")),  # wireview's upload endpoint, at the root as it wants
    path("", index, name="index"),
]

"""channels_nats: a Django Channels channel layer on NATS.

    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_nats.NatsChannelLayer",
                                  "CONFIG": {"servers": ["nats://127.0.0.1:4222"]}}}

The layer itself is a Go library (connection, reconnection, mailboxes, groups, cancellation) that
this package loads on first use through cffi.
"""

from importlib import metadata

from ._native import ChannelLayerClosed, PublishTimeout
from .layer import NatsChannelLayer

try:
    __version__ = metadata.version("channels-nats")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"

__all__ = ["ChannelLayerClosed", "NatsChannelLayer", "PublishTimeout", "__version__"]

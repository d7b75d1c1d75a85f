"""Fixtures: real nats-servers (the binary make server builds from the pinned Go module) and
layers that are closed after each test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from channels_nats import NatsChannelLayer

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NatsServer:
    """A nats-server process on loopback that a test can stop and start again on the same port."""

    binary: str
    port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    extra: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port), *self.extra]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def connz(self) -> dict[str, Any]:
        """The server's monitoring view of its client connections."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/connz?subs=1", timeout=5) as r:
            return json.load(r)

    def num_connections(self) -> int:
        return int(self.connz()["num_connections"])


def nats_server_binary() -> str:
    binary = os.environ.get("NATS_SERVER", str(REPO / "build" / "nats-server"))
    if not Path(binary).is_file():
        pytest.fail(f"no nats-server at {binary}: run 'make server' (or set NATS_SERVER)")
    return binary


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer(nats_server_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_nats_server() -> Iterator[NatsServer]:
    """A server of the test's own, for tests that stop it or count its connections."""
    server = NatsServer(nats_server_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
async def make_layer(nats_url: str) -> AsyncIterator[Callable[..., NatsChannelLayer]]:
    """Makes layers (each stands for one process) that are flushed and closed after the test."""
    made: list[NatsChannelLayer] = []

    def make(**config: Any) -> NatsChannelLayer:
        config.setdefault("servers", [nats_url])
        layer = NatsChannelLayer(**config)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.flush()
        await layer.close()


@pytest.fixture
async def layer(make_layer: Callable[..., NatsChannelLayer]) -> NatsChannelLayer:
    return make_layer()

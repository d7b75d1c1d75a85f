"""Fixtures: real nats-servers (the binary make server builds from the pinned Go module) and
layers that are closed after each test."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgpack
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
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as probe:
                    probe_port = probe.getsockname()[1]
            except OSError:
                time.sleep(0.02)
                continue
            self._wait_until_gone(probe_port, deadline)
            return
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def _wait_until_gone(self, client_port: int, deadline: float) -> None:
        """The server drops a closed connection on its own time; until it has, the readiness
        probe counts in connz, and a test that counts connections would see it."""
        while time.monotonic() < deadline:
            try:
                listed = self.connz().get("connections") or []
            except OSError:  # the monitoring listener may open a moment after the client one
                listed = None
            if listed is not None and all(c.get("port") != client_port for c in listed):
                return
            time.sleep(0.01)
        raise RuntimeError(f"nats-server on port {self.port} still lists the probe from port {client_port}")

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


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Polls condition (it may be fed by library threads) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def subscribers(server: NatsServer, subject: str) -> int:
    """How many connections the server lists with a subscription on subject."""
    return sum(subject in (c.get("subscriptions_list") or []) for c in server.connz()["connections"])


async def wait_subscribed(server: NatsServer, subject: str, count: int = 1) -> None:
    """Waits until the server itself has count connections subscribed to subject."""
    deadline = time.monotonic() + 10
    while await asyncio.to_thread(subscribers, server, subject) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"the server never had {count} subscriber(s) on {subject}")
        await asyncio.sleep(0.02)


class RawPublisher:
    """A bare NATS client over a socket: CONNECT (headers on), PUB/HPUB, PING/PONG."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = self.sock.makefile("rb")
        info = self.reader.readline()
        assert info.startswith(b"INFO "), info
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"name":"raw-bad-input"}\r\n')
        self.ping()

    def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        if headers is None:
            self.sock.sendall(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
            return
        head = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        hdr = head.encode()
        total = len(hdr) + len(payload)
        self.sock.sendall(b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(hdr), total, hdr, payload))

    def ping(self) -> None:
        """Returns once the server answered PONG: it processed everything sent before."""
        self.sock.sendall(b"PING\r\n")
        while True:
            line = self.reader.readline()
            assert line, "the server closed the connection"
            assert not line.startswith(b"-ERR"), line
            if line.startswith(b"PONG"):
                return

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def raw_send(port: int, subject: str, payload: bytes, headers: dict[str, str] | None = None, times: int = 1) -> None:
    publisher = RawPublisher(port)
    try:
        for _ in range(times):
            publisher.publish(subject, payload, headers)
        publisher.ping()
    finally:
        publisher.close()


def rss_kb() -> int:
    """This process's resident memory, in kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def unique(stem: str) -> str:
    """A channel or group name no other test uses (they share one server)."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def dead_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pack(message: Any) -> bytes:
    """msgpack as peers pack it (bin for bytes); a message is a bare map (SPEC section 3)."""
    return cast(bytes, msgpack.packb(message, use_bin_type=True))

"""The fault proxy helper against a plain echo server, no NATS involved."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from faultproxy import FaultProxy


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        conn: socket.socket = self.request
        with contextlib.suppress(OSError):  # the proxy may cut the connection
            while data := conn.recv(65536):
                conn.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield f"{host!s}:{port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(echo_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(echo_server) as proxy:
        yield proxy


def connect(proxy: FaultProxy) -> socket.socket:
    host, port = proxy.addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def round_trip(sock: socket.socket, message: bytes) -> None:
    sock.sendall(message)
    assert receive(sock, len(message)) == message


def test_pass(proxy: FaultProxy) -> None:
    assert proxy.url == f"nats://{proxy.addr}"
    with connect(proxy) as sock:
        round_trip(sock, b"hello")
        assert proxy.conns() == (1, 1)


def test_stop_both_holds_bytes_until_pass(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"warm up")
        proxy.stop()
        sock.sendall(b"ping")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(4)
        proxy.pass_()
        sock.settimeout(5)
        assert receive(sock, 4) == b"ping"


def test_cut_closes_connections_and_accepts_new_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"hello")
        proxy.cut()
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b""
    with connect(proxy) as sock:
        round_trip(sock, b"after the cut")
        assert proxy.conns() == (1, 2)


def test_errors_are_raised(proxy: FaultProxy) -> None:
    with pytest.raises(RuntimeError, match="error:"):
        proxy.delay(-1)
    proxy.pass_()  # still in step with its replies


def test_refuses_a_target_off_loopback() -> None:
    with pytest.raises(RuntimeError, match="exited"):
        FaultProxy("192.0.2.1:4222")

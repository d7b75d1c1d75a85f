"""The fault proxy (internal/faultproxy) for the tests: it sits between the layer and nats-server
and stalls or slows the link while the TCP connection stays open, which stopping the server
cannot do. The build/faultproxy binary does the work; this class drives it over its stdin."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Literal

REPO = Path(__file__).resolve().parents[2]

# How long a command waits for the binary's reply: it answers at once, so a silent binary is stuck.
REPLY_TIMEOUT = 5.0

Direction = Literal["up", "down", "both"]


class FaultProxy:
    """A loopback TCP proxy to target (host:port or nats://host:port on loopback). Modes apply at
    once to open and new connections; pass_() ends stop() and delay(). Use it as a context manager
    or call close()."""

    def __init__(self, target: str) -> None:
        binary = os.environ.get("FAULTPROXY", str(REPO / "build" / "faultproxy"))
        if not Path(binary).is_file():
            raise RuntimeError(f"no faultproxy at {binary}: run 'make faultproxy' (or set FAULTPROXY)")
        self._process = subprocess.Popen(
            [binary, "-target", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._stdin: IO[str] = self._process.stdin
        # A thread reads the replies, so that waiting for one can time out.
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_replies, args=(self._process.stdout,), daemon=True)
        self._reader.start()
        self._lock = threading.Lock()  # one command at a time, so replies match their commands
        try:
            first = self._next_reply()
            if not first.startswith("listening "):
                raise RuntimeError(f"faultproxy started with {first!r}, not 'listening <address>'")
        except BaseException:
            self.close()
            raise
        self._addr = first.removeprefix("listening ")

    @property
    def addr(self) -> str:
        """Where the proxy listens: "127.0.0.1:<port>"."""
        return self._addr

    @property
    def url(self) -> str:
        """The proxy as a NATS server URL: "nats://127.0.0.1:<port>"."""
        return f"nats://{self._addr}"

    def pass_(self) -> None:
        """Forward normally, and at once whatever stop() or delay() held."""
        self._command("pass")

    def delay(self, ms: int) -> None:
        """Forward every chunk ms milliseconds after it was read, both ways (0 ends it)."""
        self._command(f"delay {ms}")

    def stop(self, direction: Direction = "both") -> None:
        """Stop forwarding ("up" is client to server) with the connections left open, until pass_()."""
        self._command(f"stop {direction}")

    def cut(self) -> None:
        """Close every open connection; new ones are still accepted."""
        self._command("cut")

    def refuse(self, on: bool) -> None:
        """While on, close every new connection as soon as it is accepted."""
        self._command("refuse on" if on else "refuse off")

    def conns(self) -> tuple[int, int]:
        """How many client connections are open now, and how many were accepted in all."""
        open_now, accepted = self._command("conns").split()
        return int(open_now), int(accepted)

    def close(self) -> None:
        """Stop the proxy and its connections. Closing twice is harmless."""
        self._stdin.close()  # EOF on stdin tells the binary to quit
        try:
            self._process.wait(REPLY_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(REPLY_TIMEOUT)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _read_replies(self, stdout: IO[str]) -> None:
        with stdout:
            for line in stdout:
                self._replies.put(line.rstrip("\n"))
        self._replies.put(None)  # the binary has exited

    def _next_reply(self) -> str:
        try:
            reply = self._replies.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            raise RuntimeError(f"faultproxy did not answer within {REPLY_TIMEOUT} s") from None
        if reply is None:
            raise RuntimeError(f"faultproxy exited (status {self._process.wait(REPLY_TIMEOUT)})")
        return reply

    def _command(self, line: str) -> str:
        """Sends one command and returns what its "ok" reply carries after "ok"."""
        with self._lock:
            try:
                self._stdin.write(line + "\n")
                self._stdin.flush()
            except (BrokenPipeError, ValueError) as e:  # ValueError: stdin closed by close()
                raise RuntimeError(f"faultproxy {line!r}: the proxy is not running") from e
            reply = self._next_reply()
        if reply.startswith("error:"):
            raise RuntimeError(f"faultproxy {line!r}: {reply}")
        if reply != "ok" and not reply.startswith("ok "):
            raise RuntimeError(f"faultproxy {line!r}: unexpected reply {reply!r}")
        return reply.removeprefix("ok").strip()

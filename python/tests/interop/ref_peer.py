"""A peer process that drives the *reference* channel layer for the interop tests.

Runs inside the trixie root built by make-reference-env.sh, with the reference layer's venv:

    chroot build/reference/root /opt/ref/bin/python /opt/ref_peer.py nats://127.0.0.1:PORT

Python 3.13, the standard library and the reference layer (PyPI "channels-nats" 0.10.x, which
is also imported as ``channels_nats``) only. The pytest side talks to it through peer.RefPeer.

Protocol: one JSON object per line on stdin, one per line on stdout (flushed after each).
On start it prints {"event": "ready", "version": ..., "python": ..., "pid": ...}.
Every command is {"op": ..., "id": ..., ...}; its reply carries the same "id" and "ok".
Commands run as concurrent tasks on the one event loop, so a receive may be pending while
other commands come in; replies come in completion order, matched by "id".

    {"op": "ping"}                                  -> {"ok": true, "version": ..., "python": ...}
    {"op": "new_channel", "prefix": "specific"?}    -> {"ok": true, "channel": "specific.<id>!<hex>"}
    {"op": "send", "channel": c, "message": {...}}  -> {"ok": true}
    {"op": "group_send", "group": g, "message": {...}} -> {"ok": true}
    {"op": "group_add", "group": g, "channel": c}   -> {"ok": true}
    {"op": "group_discard", "group": g, "channel": c} -> {"ok": true}
    {"op": "receive", "channel": c, "timeout": 5}   -> {"ok": true, "message": {...}}
                                                      or {"ok": false, "error": "timeout"}
    {"op": "drain", "channel": c, "timeout": 1, "max": n?}
        receive until one receive times out (or n messages) -> {"ok": true, "messages": [...]}
        A receive that returns keeps a plain channel's subscription, so this loses nothing
        between receives; only the final, timed-out one gives it up.
    {"op": "flush"}                                 -> {"ok": true}
    {"op": "close"}                                 -> {"ok": true}, then the process exits
Errors: {"ok": false, "error": "<Type>: <text>", "type": "<Type>"}. A reply to a line that is
not a JSON object has "id": null. EOF on stdin closes the layer and exits.

JSON has no bytes: a bytes value anywhere in a message travels as {"__bytes__": "<base64>"},
both ways, so the tests can tell bytes from str after the round trip.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import platform
import sys
import traceback
from typing import Any

import channels_nats
from channels_nats import NatsChannelLayer

BYTES_KEY = "__bytes__"


def to_wire(value: Any) -> Any:
    """A message value as JSON can carry it: bytes become {"__bytes__": base64}."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {key: to_wire(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_wire(item) for item in value]
    return value


def from_wire(value: Any) -> Any:
    """The inverse of to_wire."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(BYTES_KEY), str):
            return base64.b64decode(value[BYTES_KEY])
        return {key: from_wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_wire(item) for item in value]
    return value


class Peer:
    def __init__(self, url: str) -> None:
        self.layer = NatsChannelLayer(servers=url)
        self.tasks: set[asyncio.Task] = set()
        self.closing = asyncio.Event()

    def reply(self, body: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    async def handle(self, command: dict[str, Any]) -> None:
        ident = command.get("id")
        try:
            result = await self.dispatch(command)
        except Exception as error:  # every failure is the test's to see
            result = {"ok": False, "error": f"{type(error).__name__}: {error}", "type": type(error).__name__}
            if not isinstance(error, (TypeError, ValueError, AssertionError, KeyError)):
                traceback.print_exc(file=sys.stderr)
        except asyncio.CancelledError:
            result = {"ok": False, "error": "cancelled", "type": "CancelledError"}
        self.reply({"id": ident, **result})

    async def dispatch(self, command: dict[str, Any]) -> dict[str, Any]:
        layer = self.layer
        op = command.get("op")
        if op == "ping":
            return {"ok": True, "version": channels_nats.__version__, "python": platform.python_version()}
        if op == "new_channel":
            return {"ok": True, "channel": await layer.new_channel(command.get("prefix", "specific"))}
        if op == "send":
            await layer.send(command["channel"], from_wire(command["message"]))
            return {"ok": True}
        if op == "group_send":
            await layer.group_send(command["group"], from_wire(command["message"]))
            return {"ok": True}
        if op == "group_add":
            await layer.group_add(command["group"], command["channel"])
            return {"ok": True}
        if op == "group_discard":
            await layer.group_discard(command["group"], command["channel"])
            return {"ok": True}
        if op == "receive":
            try:
                message = await asyncio.wait_for(layer.receive(command["channel"]), command.get("timeout"))
            except TimeoutError:
                return {"ok": False, "error": "timeout"}
            return {"ok": True, "message": to_wire(message)}
        if op == "drain":
            limit = command.get("max")
            messages = []
            while limit is None or len(messages) < limit:
                try:
                    message = await asyncio.wait_for(layer.receive(command["channel"]), command.get("timeout", 1.0))
                except TimeoutError:
                    break
                messages.append(to_wire(message))
            return {"ok": True, "messages": messages}
        if op == "flush":
            await layer.flush()
            return {"ok": True}
        if op == "close":
            await layer.close()
            self.closing.set()
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

    def start(self, line: bytes) -> None:
        try:
            command = json.loads(line)
            if not isinstance(command, dict):
                raise ValueError("a command is a JSON object")
        except ValueError as error:
            self.reply({"id": None, "ok": False, "error": f"bad command line: {error}", "type": "ValueError"})
            return
        task = asyncio.get_running_loop().create_task(self.handle(command))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        python = platform.python_version()
        self.reply({"event": "ready", "version": channels_nats.__version__, "python": python, "pid": os.getpid()})
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            while not self.closing.is_set():
                reading = asyncio.ensure_future(reader.readline())
                await asyncio.wait({reading, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    break
                line = reading.result()
                if not line:  # EOF: the test side went away
                    break
                if line.strip():
                    self.start(line)
        finally:
            closing.cancel()
            # Let what is still running answer (a close ends pending receives with
            # ChannelLayerClosed), but do not hang on it.
            if not self.closing.is_set():
                try:
                    await asyncio.wait_for(self.layer.close(), 10)
                except Exception:
                    traceback.print_exc(file=sys.stderr)
            if self.tasks:
                await asyncio.wait(set(self.tasks), timeout=2)
            for task in list(self.tasks):
                task.cancel()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: ref_peer.py <nats_url>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="ref_peer %(levelname)s %(name)s: %(message)s")
    asyncio.run(Peer(sys.argv[1]).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())

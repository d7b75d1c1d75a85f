"""Two processes of an installed channels-nats do a group_send (wheels/install-run.sh runs this).

    python group_send_check.py NATS-URL

First, in this process: channels_nats is imported from the running Python's site-packages (not
from a source tree) and loads the library bundled beside it (through the compiled cffi module
when the wheel bundles one). Then process B (this file again,
with the "receive" argument) joins a group and waits for one message, and this process (A)
group_sends until B reports it on its stdout, for at most 20 s. B checks that non-ASCII text and
bytes arrive as sent. Exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import NoReturn

# The installed package: the linters run without it, as bench/ does.
import channels_nats  # pyright: ignore[reportMissingImports]
from channels_nats import NatsChannelLayer, _native  # pyright: ignore[reportMissingImports]

GROUP = "install-check"
TEXT = "héllo"
BLOB = b"\x00\xff"
TIMEOUT = 20.0


def fail(message: str) -> NoReturn:
    sys.exit(f"group_send_check: FAILED: {message}")


def check_installed() -> None:
    if channels_nats.__file__ is None:
        fail("channels_nats has no __init__.py: it is not an installed package")
    package = Path(channels_nats.__file__).resolve().parent
    site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if package.parent not in site:
        fail(f"channels_nats was imported from {package}, not from this Python's site-packages")
    bundled = package / _native.library_file_name()
    if not bundled.is_file() or not (package / "channels_nats.h").is_file():
        fail(f"the installed package has no {bundled.name} or channels_nats.h")
    if _native.library_path() != bundled:
        fail(f"the package would load {_native.library_path()}, not the library it bundles")
    mode = _native.call_mode()
    if (package / _native.COMPILED_MODULE).is_file() and mode != "compiled":
        fail(f"the package bundles {_native.COMPILED_MODULE} but calls the library in {mode} mode")
    print(
        f"group_send_check: channels-nats {channels_nats.__version__} installed in {package.parent},"
        f" bundled native library {_native.version()}, called in {mode} mode",
        flush=True,
    )


async def receive(url: str) -> None:
    """Process B: joins the group, waits for one message, checks it and reports it on stdout."""
    layer = NatsChannelLayer(servers=[url])
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    print(f"group_send_check: B (pid {os.getpid()}) joined {GROUP} with {channel}", file=sys.stderr, flush=True)
    message = await asyncio.wait_for(layer.receive(channel), TIMEOUT)
    if message.get("type") != "install.check" or message.get("text") != TEXT or message.get("blob") != BLOB:
        fail(f"B got {message!r}")
    print(f"message {message['n']} from pid {message['pid']}", flush=True)
    await layer.close()


async def send(url: str) -> None:
    """Process A: starts B, then group_sends until B reports the message, for at most TIMEOUT."""
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "receive", url, stdout=asyncio.subprocess.PIPE
    )
    assert receiver.stdout is not None
    layer = NatsChannelLayer(servers=[url])
    try:
        report = asyncio.ensure_future(receiver.stdout.readline())
        deadline = time.monotonic() + TIMEOUT
        sent = 0
        while not report.done():
            if time.monotonic() > deadline:
                fail(f"B did not report the message within {TIMEOUT:.0f} s ({sent} sent)")
            sent += 1
            message = {"type": "install.check", "n": sent, "pid": os.getpid(), "text": TEXT, "blob": BLOB}
            await layer.group_send(GROUP, message)
            await asyncio.wait({report}, timeout=0.1)
        got = report.result().decode().strip()
        if not got:
            fail(f"B exited with {await receiver.wait()} before it reported a message")
        if await asyncio.wait_for(receiver.wait(), TIMEOUT) != 0:
            fail(f"B exited with {receiver.returncode}")
        print(f"group_send_check: A (pid {os.getpid()}) sent {sent} time(s); B got {got}", flush=True)
    finally:
        await layer.close()
        if receiver.returncode is None:
            receiver.kill()
            await receiver.wait()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "receive":
        asyncio.run(receive(sys.argv[2]))
        return
    if len(sys.argv) != 2:
        sys.exit("usage: python group_send_check.py NATS-URL")
    check_installed()
    asyncio.run(send(sys.argv[1]))
    print("group_send_check: ok", flush=True)


if __name__ == "__main__":
    main()

"""How results reach event loops (channels_nats/_bridge.py): every loop that waits takes them from
the process's result queue on its own thread; a loop without add_reader gets a watcher thread."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from channels_nats import NatsChannelLayer

MakeLayer = Callable[..., NatsChannelLayer]


PROACTOR_LIKE = """
import asyncio, json, sys, threading
from channels_nats import NatsChannelLayer

class LoopWithoutReaders(asyncio.SelectorEventLoop):
    def add_reader(self, fd, callback, *args):  # like the Windows proactor loop
        raise NotImplementedError

async def main():
    layer, sender = NatsChannelLayer(servers=sys.argv[1]), NatsChannelLayer(servers=sys.argv[1])
    channel = await layer.new_channel()
    waiter = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0.2)  # it waits in its mailbox
    await sender.send(channel, {"type": "one"})
    first = await asyncio.wait_for(waiter, 10)
    waiter = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0.2)
    await sender.send(channel, {"type": "two"})
    second = await asyncio.wait_for(waiter, 10)
    watcher = any(t.name == "channels_nats results" for t in threading.enumerate())
    await layer.close()
    await sender.close()
    print(json.dumps({"first": first, "second": second, "watcher": watcher}))

loop = LoopWithoutReaders()
loop.run_until_complete(main())
loop.close()
"""


async def test_a_loop_without_add_reader_gets_its_results(nats_url: str) -> None:
    """In a process whose only loop cannot watch the queue (the Windows proactor), a watcher
    thread takes the results and hands them to the loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROACTOR_LIKE, nats_url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out.decode().splitlines()[-1]) == {
        "first": {"type": "one"},
        "second": {"type": "two"},
        "watcher": True,
    }


async def test_results_of_many_loops_are_routed_to_each(make_layer: MakeLayer) -> None:
    """Several loops in several threads wait at once on one client; whichever loop takes a
    result from the queue, it reaches the loop that waits for it."""
    layer, sender = make_layer(), make_layer()
    channels = [await layer.new_channel() for _ in range(4)]  # the default executor has 6 threads here
    started = threading.Barrier(len(channels) + 1)

    def wait_in_own_loop(channel: str) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            waiter = asyncio.ensure_future(layer.receive(channel))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(started.wait, 10)
            return await asyncio.wait_for(waiter, 10)

        return asyncio.run(run())

    results = [asyncio.ensure_future(asyncio.to_thread(wait_in_own_loop, c)) for c in channels]
    await asyncio.to_thread(started.wait, 10)
    for index, channel in enumerate(channels):
        await sender.send(channel, {"type": "for", "index": index})
    assert [await r for r in results] == [{"type": "for", "index": i} for i in range(len(channels))]

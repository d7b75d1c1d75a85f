"""CPU per delivery when one process wakes many waiting receives: the cost behind fan-out latency.

    python bench/wake_cost.py --url nats://127.0.0.1:4222 [--members 2000] [--messages 30] [--burst]

One process holds --members process channels in one group, each with a receive waiting; a second
layer instance in the same process sends --messages group messages, one at a time, waiting until
every member got each. With --burst it sends them all at once: most receives then find a message
waiting (the saturated case). Prints one JSON object: deliveries, wall and CPU time per delivery (process
CPU: the interpreter and every library thread). It imports `channels_nats`, so the same file
measures this layer (PYTHONPATH=python) and the nats-py layer (inside the reference root).

The object also has the floor: the same consumers, on the same interpreter, getting the same
bodies with no channel layer and no I/O, measured once before the layer and once after, and
averaged (the machine's speed drifts; a slow spell then weighs on both sides). Without --burst
each delivery is a future resolved with the msgpack decode of the body and the task it wakes;
with --burst, after the first, a receive that returns the decode at once. `floor_multiple` is
the layer's CPU per delivery over the floor's: what the layer adds to what any asyncio consumer
of a decoded message pays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any


async def measure(url: str, members: int, messages: int, burst: bool) -> dict[str, Any]:
    from channels_nats import NatsChannelLayer  # pyright: ignore[reportMissingImports]

    worker = NatsChannelLayer(servers=url, capacity=max(100, messages))
    publisher = NatsChannelLayer(servers=url)
    channels = [await worker.new_channel() for _ in range(members)]
    for channel in channels:
        await worker.group_add("wake-cost", channel)
    await publisher.group_send("wake-cost-warmup", {"type": "warmup"})  # connects
    got = 0
    everyone = asyncio.Event()

    async def consume(channel: str) -> None:
        nonlocal got
        for _ in range(messages):
            await worker.receive(channel)
            got += 1
            if got % members == 0:
                everyone.set()

    consumers = [asyncio.ensure_future(consume(channel)) for channel in channels]
    await asyncio.sleep(0.3)  # every receive waits
    wall, cpu = time.perf_counter(), time.process_time()
    for index in range(messages):
        everyone.clear()
        await publisher.group_send("wake-cost", {"type": "bench.msg", "i": index})
        if not burst:
            await everyone.wait()
    await asyncio.gather(*consumers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for layer in (worker, publisher):
        await layer.close()
    return {
        "members": members,
        "messages": messages,
        "deliveries": got,
        "wall_us_per_delivery": wall * 1e6 / got,
        "cpu_us_per_delivery": cpu * 1e6 / got,
    }


async def measure_floor(members: int, messages: int, burst: bool) -> dict[str, Any]:
    """The consumers of measure() with the layer replaced by futures (with burst, after each
    consumer's first, by a coroutine that returns the decode at once)."""
    import msgpack

    bodies = [msgpack.packb({"type": "bench.msg", "i": index}) for index in range(messages)]
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[Any]] = []
    got = 0
    everyone = asyncio.Event()

    async def receive(slot: int) -> Any:
        if burst and slot > 0:  # the first waits, as a receive made before the burst does
            return msgpack.unpackb(bodies[slot], raw=False)
        future = loop.create_future()
        waiting.append(future)
        return await future

    async def consume() -> None:
        nonlocal got
        for slot in range(messages):
            await receive(slot)
            got += 1
            if got % members == 0:
                everyone.set()

    consumers = [asyncio.ensure_future(consume()) for _ in range(members)]
    await asyncio.sleep(0.3)
    wall, cpu = time.perf_counter(), time.process_time()
    for body in bodies[:1] if burst else bodies:
        everyone.clear()
        ready, waiting[:] = list(waiting), []
        for future in ready:
            future.set_result(msgpack.unpackb(body, raw=False))
        if not burst:
            await everyone.wait()
    await asyncio.gather(*consumers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_us_per_delivery": wall * 1e6 / got, "cpu_us_per_delivery": cpu * 1e6 / got}


def require_proc() -> None:
    """Refuses to measure on Linux without /proc, which no real deployment lacks: there the Go
    runtime of this layer's library asks glibc for the stack bounds of a main thread on each of
    its calls into the library, glibc looks for them in /proc/self/maps, and the failed open
    costs microseconds a call (bench/README.md)."""
    if sys.platform.startswith("linux") and not os.path.exists("/proc/self/maps"):
        raise SystemExit("bench: /proc is not mounted here; mount it first (bench/run.py does in the reference root)")


def measure_with_floor(url: str, members: int, messages: int, burst: bool) -> dict[str, Any]:
    """measure(), with the mean of a floor measured before it and one after it, and the layer's
    CPU per delivery as a multiple of that."""
    before = asyncio.run(measure_floor(members, messages, burst))
    result = asyncio.run(measure(url, members, messages, burst))
    after = asyncio.run(measure_floor(members, messages, burst))
    floor = (before["cpu_us_per_delivery"] + after["cpu_us_per_delivery"]) / 2
    result["floor_cpu_us_per_delivery"] = floor
    result["floor_multiple"] = result["cpu_us_per_delivery"] / floor
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument(
        "--burst", action="store_true", help="send every message at once: receives mostly find a backlog (saturation)"
    )
    args = parser.parse_args()
    require_proc()
    print(json.dumps(measure_with_floor(args.url, args.members, args.messages, args.burst)))


if __name__ == "__main__":
    main()

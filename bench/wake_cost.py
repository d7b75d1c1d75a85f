"""CPU per delivery when one process wakes many waiting receives: the cost behind fan-out latency.

    python bench/wake_cost.py --url nats://127.0.0.1:4222 [--members 2000] [--messages 30] [--burst]

One process holds --members process channels in one group, each with a receive waiting; a second
layer instance in the same process sends --messages group messages, one at a time, waiting until
every member got each. With --burst it sends them all at once: most receives then find a message
waiting (the saturated case). Prints one JSON object: deliveries, wall and CPU time per delivery (process
CPU: the interpreter and every library thread). It imports `channels_nats`, so the same file
measures this layer (PYTHONPATH=python) and the nats-py layer (inside the reference root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument(
        "--burst", action="store_true", help="send every message at once: receives mostly find a backlog (saturation)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.url, args.members, args.messages, args.burst))))


if __name__ == "__main__":
    main()

"""Benchmark scenarios for Channels layers, one subcommand each.

    python bench/scenarios.py <scenario> --layer <layer> --url <server url> [options]

Scenarios: fanout, saturation, pingpong, throughput, connections, wake. Layers: nats (this
repository's layer), reference (the nats-py layer, PyPI channels-nats 0.10.x, run inside the
trixie root), redis (channels_redis RedisChannelLayer), redis-pubsub (RedisPubSubChannelLayer),
inmemory (InMemoryChannelLayer; throughput only, the others need several processes).

Progress goes to stderr; the last stdout line is one JSON object:
{"scenario": str, "layer": str, "params": {...}, "metrics": {...}}.

Standard library, channels and the layer under test only: this file also runs on Python 3.13
inside the reference root, where channels_redis and this repository's package are absent, so
every layer import happens inside make_layer(). wake runs bench/wake_cost.py, which is copied
beside this file there.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import sys
import time
import urllib.request
from multiprocessing.connection import Connection
from typing import Any

LAYERS = ("nats", "reference", "redis", "redis-pubsub", "inmemory")
READY_TIMEOUT = 180.0


def log(message: str) -> None:
    print(f"[{os.getpid()}] {message}", file=sys.stderr, flush=True)


def make_layer(layer: str, url: str, capacity: int) -> Any:
    """A fresh channel layer instance of the given kind (imports happen here, on purpose)."""
    if layer in ("nats", "reference"):
        from channels_nats import NatsChannelLayer  # pyright: ignore[reportMissingImports]

        return NatsChannelLayer(servers=url, capacity=capacity)
    if layer == "redis":
        from channels_redis.core import RedisChannelLayer  # pyright: ignore[reportMissingImports]

        return RedisChannelLayer(hosts=[url], capacity=capacity)
    if layer == "redis-pubsub":
        from channels_redis.pubsub import RedisPubSubChannelLayer  # pyright: ignore[reportMissingImports]

        return RedisPubSubChannelLayer(hosts=[url])
    if layer == "inmemory":
        from channels.layers import InMemoryChannelLayer

        return InMemoryChannelLayer(capacity=capacity)
    raise SystemExit(f"unknown layer {layer!r} (known: {', '.join(LAYERS)})")


async def close_layer(layer: Any) -> None:
    """Best effort: each layer family names its shutdown differently."""
    # Never flush(): in the Channels API it empties the layer (and, on redis, the database).
    for name in ("close", "close_pools"):
        method = getattr(layer, name, None)
        if method is None:
            continue
        try:
            result = method()
            if asyncio.iscoroutine(result):
                await asyncio.wait_for(result, 10)
        except Exception as exc:  # shutdown must not hide the numbers
            log(f"close: {name}() failed: {exc!r}")
        return


def percentile(values: list[float], p: float) -> float:
    """The reference bench's rule: values[min(n-1, round(p/100*(n-1)))] of the sorted values."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def emit(scenario: str, layer: str, params: dict[str, Any], metrics: dict[str, Any]) -> None:
    params = {**params, "python": platform.python_version()}
    print(json.dumps({"scenario": scenario, "layer": layer, "params": params, "metrics": metrics}), flush=True)


# --- fan-out and saturation -------------------------------------------------------------------


def fanout_worker(conn: Connection, layer_name: str, url: str, group: str, count: int, messages: int, cap: int) -> None:
    asyncio.run(_fanout_worker(conn, layer_name, url, group, count, messages, cap))


async def _fanout_worker(
    conn: Connection, layer_name: str, url: str, group: str, count: int, messages: int, cap: int
) -> None:
    layer = make_layer(layer_name, url, cap)
    loop = asyncio.get_running_loop()
    channels = [await layer.new_channel() for _ in range(count)]
    for channel in channels:
        await layer.group_add(group, channel)
    latencies = array.array("d")
    received = [0.0, float("inf")]  # last delivery time, first delivery time

    async def drain(channel: str) -> None:
        for _ in range(messages):
            message = await layer.receive(channel)
            now = time.time()
            latencies.append(now - message["ts"])
            received[0] = max(received[0], now)
            received[1] = min(received[1], now)

    tasks = [asyncio.ensure_future(drain(channel)) for channel in channels]
    await asyncio.sleep(0.3)  # every receive is pending before the publisher may start
    conn.send("ready")
    deadline: float = await loop.run_in_executor(None, conn.recv)
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.time()))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    conn.send({"latencies": latencies.tobytes(), "last": received[0], "first": received[1], "incomplete": len(pending)})
    await close_layer(layer)


def fanout_publisher(
    conn: Connection, layer_name: str, url: str, group: str, messages: int, gap: float, cap: int
) -> None:
    asyncio.run(_fanout_publisher(conn, layer_name, url, group, messages, gap, cap))


async def _fanout_publisher(
    conn: Connection, layer_name: str, url: str, group: str, messages: int, gap: float, cap: int
) -> None:
    layer = make_layer(layer_name, url, cap)
    loop = asyncio.get_running_loop()
    await layer.group_send(group + "-warmup", {"type": "bench.warmup"})  # connects
    conn.send("ready")
    await loop.run_in_executor(None, conn.recv)  # "go"
    first = time.time()
    start = first
    for index in range(messages):
        if gap > 0:
            delay = start + index * gap - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        await layer.group_send(group, {"type": "bench.msg", "ts": time.time(), "i": index})
    last = time.time()
    conn.send({"first": first, "last": last})
    await close_layer(layer)


def _recv(conn: Connection, timeout: float, what: str) -> Any:
    if not conn.poll(timeout):
        raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
    return conn.recv()


def run_fanout(args: argparse.Namespace, scenario: str) -> None:
    gap = args.gap if scenario == "fanout" else 0.0
    procs, members, messages = args.processes, args.members, args.messages
    urls = [u for u in args.urls.split(",") if u] or [args.url]  # a cluster: the processes spread over it
    per_worker = members // procs
    cap = max(100, messages * 2)
    group = f"bench{os.getpid()}x{int(time.time())}"
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[Any, Connection]] = []
    nodes = f" over {len(urls)} servers" if len(urls) > 1 else ""
    log(f"{scenario}: {args.layer} N={per_worker * procs} P={procs} M={messages} gap={gap}{nodes}")
    started = time.time()
    for index in range(procs):
        parent, child = ctx.Pipe()
        url = urls[index % len(urls)]
        proc = ctx.Process(
            target=fanout_worker, args=(child, args.layer, url, group, per_worker, messages, cap), daemon=True
        )
        proc.start()
        workers.append((proc, parent))
    pub_parent, pub_child = ctx.Pipe()
    publisher = ctx.Process(
        target=fanout_publisher,
        args=(pub_child, args.layer, urls[procs % len(urls)], group, messages, gap, cap),
        daemon=True,
    )
    publisher.start()
    try:
        for _, conn in workers:
            _recv(conn, READY_TIMEOUT, "a worker's members")
        _recv(pub_parent, READY_TIMEOUT, "the publisher")
        setup_s = time.time() - started
        log(f"{scenario}: ready after {setup_s:.1f}s; publishing")
        bound = args.bound if scenario == "saturation" else messages * gap + args.grace
        deadline = time.time() + bound
        for _, conn in workers:
            conn.send(deadline)
        pub_parent.send("go")
        published = _recv(pub_parent, bound + 60, "the publisher's report")
        results = [_recv(conn, bound + 60, "a worker's report") for _, conn in workers]
    finally:
        for proc, _ in [*workers, (publisher, None)]:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.terminate()
    latencies = array.array("d")
    for result in results:
        latencies.frombytes(result["latencies"])
    values = sorted(v * 1000 for v in latencies)
    deliveries = len(values)
    expected = per_worker * procs * messages
    last = max((r["last"] for r in results if r["last"] > 0), default=float("nan"))
    wall = last - published["first"]
    metrics: dict[str, Any] = {
        "deliveries": deliveries,
        "expected": expected,
        "complete": deliveries == expected,
        "deliveries_per_s": deliveries / wall if deliveries and wall > 0 else 0.0,
        "wall_s": wall,
        "publish_s": published["last"] - published["first"],
        "setup_s": setup_s,
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
        "max_ms": values[-1] if values else float("nan"),
    }
    if scenario == "saturation":
        metrics["bound_s"] = bound
    log(f"{scenario}: {deliveries}/{expected} deliveries, {metrics['deliveries_per_s']:,.0f}/s")
    params: dict[str, Any] = {"members": per_worker * procs, "processes": procs, "messages": messages, "gap_s": gap}
    if len(urls) > 1:
        params["servers"] = len(urls)
    emit(scenario, args.layer, params, metrics)


# --- ping-pong --------------------------------------------------------------------------------


def pingpong_peer(conn: Connection, layer_name: str, url: str, role: str, rounds: int, warmup: int) -> None:
    asyncio.run(_pingpong_peer(conn, layer_name, url, role, rounds, warmup))


async def _pingpong_peer(conn: Connection, layer_name: str, url: str, role: str, rounds: int, warmup: int) -> None:
    layer = make_layer(layer_name, url, 100)
    loop = asyncio.get_running_loop()
    mine = await layer.new_channel()
    conn.send(mine)
    other: str = await loop.run_in_executor(None, conn.recv)
    # Each side's CPU (every thread of its process: the library's included) over the measured
    # rounds: from the first measured ping to the stop.
    if role == "pong":
        cpu_start = time.process_time()
        while True:
            message = await layer.receive(mine)
            if message.get("stop"):
                break
            if message.get("i") == warmup:
                cpu_start = time.process_time()
            await layer.send(other, message)
        conn.send({"cpu_s": time.process_time() - cpu_start})
    else:
        rtts: list[float] = []
        cpu_start = time.process_time()
        for index in range(warmup + rounds):
            if index == warmup:
                cpu_start = time.process_time()
            start = time.perf_counter()
            await layer.send(other, {"type": "bench.ping", "i": index})
            await layer.receive(mine)
            if index >= warmup:
                rtts.append((time.perf_counter() - start) * 1000)
        await layer.send(other, {"type": "bench.ping", "stop": True})
        conn.send({"rtts": rtts, "cpu_s": time.process_time() - cpu_start})
    await close_layer(layer)


def run_pingpong(args: argparse.Namespace) -> None:
    ctx = multiprocessing.get_context("spawn")
    peers: list[tuple[Any, Connection]] = []
    for role in ("ping", "pong"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=pingpong_peer, args=(child, args.layer, args.url, role, args.rounds, args.warmup), daemon=True
        )
        proc.start()
        peers.append((proc, parent))
    try:
        names = [_recv(conn, READY_TIMEOUT, "a peer's channel") for _, conn in peers]
        peers[0][1].send(names[1])
        peers[1][1].send(names[0])
        log(f"pingpong: {args.layer} {args.rounds} rounds")
        result = _recv(peers[0][1], 300, "the ping side's report")
        pong = _recv(peers[1][1], 30, "the pong side")
    finally:
        for proc, _ in peers:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.terminate()
    rtts = sorted(result["rtts"])
    metrics = {
        "rounds": len(rtts),
        "rtt_p50_ms": percentile(rtts, 50),
        "rtt_p99_ms": percentile(rtts, 99),
        "rtt_max_ms": rtts[-1] if rtts else float("nan"),
        "round_trips_per_s": len(rtts) / (sum(rtts) / 1000) if rtts else 0.0,
        "cpu_us_per_round_trip": (result["cpu_s"] + pong["cpu_s"]) * 1e6 / len(rtts) if rtts else float("nan"),
    }
    log(
        f"pingpong: p50 {metrics['rtt_p50_ms']:.3f} ms, p99 {metrics['rtt_p99_ms']:.3f} ms, "
        f"{metrics['cpu_us_per_round_trip']:.0f} us of CPU per round trip"
    )
    emit("pingpong", args.layer, {"rounds": args.rounds, "warmup": args.warmup}, metrics)


# --- one process, one channel -----------------------------------------------------------------


async def _throughput(args: argparse.Namespace) -> dict[str, Any]:
    layer = make_layer(args.layer, args.url, max(1000, args.batch * 2))
    channel = await layer.new_channel()
    body = b"x" * args.size
    batch = args.batch

    async def one_batch() -> None:
        for index in range(batch):
            await layer.send(channel, {"type": "bench.tp", "i": index, "body": body})
        for _ in range(batch):
            message = await layer.receive(channel)
            if len(message["body"]) != len(body):
                raise SystemExit("throughput: body changed in transit")

    await one_batch()  # warm-up: connection, subscriptions
    batches = max(1, args.count // batch)
    start = time.perf_counter()
    for _ in range(batches):
        await one_batch()
    wall = time.perf_counter() - start
    await close_layer(layer)
    total = batches * batch
    return {
        "messages": total,
        "wall_s": wall,
        "messages_per_s": total / wall,
        "mb_per_s": total * len(body) / wall / 1e6,
    }


def run_throughput(args: argparse.Namespace) -> None:
    log(f"throughput: {args.layer} {args.count} x {args.size} B in batches of {args.batch}")
    metrics = asyncio.run(_throughput(args))
    log(f"throughput: {metrics['messages_per_s']:,.0f} msg/s")
    emit("throughput", args.layer, {"size": args.size, "count": args.count, "batch": args.batch}, metrics)


# --- async_to_sync(group_send) x 20: server connections opened -----------------------------------


class RedisInfo:
    """INFO over one socket held for the whole measurement (so it is not counted in the delta)."""

    def __init__(self, url: str) -> None:
        hostport = url.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = hostport.rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port or 6379)), timeout=10)

    def counts(self) -> tuple[int, int]:
        self.sock.sendall(b"INFO\r\n")
        data = b""
        while b"\r\n" not in data:
            data += self.sock.recv(65536)
        header, _, rest = data.partition(b"\r\n")
        size = int(header[1:])
        while len(rest) < size + 2:
            rest += self.sock.recv(65536)
        fields = dict(
            line.split(":", 1) for line in rest[:size].decode().splitlines() if ":" in line and not line.startswith("#")
        )
        return int(fields["connected_clients"]), int(fields["total_connections_received"])

    def close(self) -> None:
        self.sock.close()


def nats_counts(monitor: str) -> tuple[int, int]:
    with urllib.request.urlopen(monitor.rstrip("/") + "/varz", timeout=10) as response:
        varz = json.load(response)
    return int(varz["connections"]), int(varz["total_connections"])


def run_connections(args: argparse.Namespace) -> None:
    from asgiref.sync import async_to_sync

    if args.layer == "inmemory":
        raise SystemExit("connections: the in-memory layer has no server")
    redis_info = RedisInfo(args.url) if args.layer.startswith("redis") else None

    def counts() -> tuple[int, int]:
        time.sleep(0.3)  # let the server see closes and opens
        if redis_info is not None:
            return redis_info.counts()
        if not args.monitor:
            raise SystemExit("connections: --monitor http://127.0.0.1:<port> is needed for NATS layers")
        return nats_counts(args.monitor)

    layer = make_layer(args.layer, args.url, 100)
    open_before, total_before = counts()
    for index in range(args.calls):
        async_to_sync(layer.group_send)("bench-sync", {"type": "bench.sync", "i": index})
    open_after, total_after = counts()
    metrics = {
        "connections_opened": total_after - total_before,
        "connections_open_after": open_after - open_before,
        "calls": args.calls,
    }
    async_to_sync(close_layer)(layer)
    if redis_info is not None:
        redis_info.close()
    log(
        f"connections: {args.calls} calls opened {metrics['connections_opened']}, {open_after - open_before} still open"
    )
    emit("connections", args.layer, {"calls": args.calls}, metrics)


# --- wake cost -------------------------------------------------------------------------------


def run_wake(args: argparse.Namespace) -> None:
    """bench/wake_cost.py's measure between two of its floors, in one process: the CPU per delivery
    of waking waiting receives with a group message, and that as a multiple of the floor (bare
    futures)."""
    if args.layer not in ("nats", "reference"):
        raise SystemExit("wake: wake_cost.py measures the layers named channels_nats (nats, reference)")
    log(f"wake: {args.members} members, {args.messages} messages")
    measured = wake_cost_module().measure_with_floor(args.url, args.members, args.messages, False)
    metrics = {
        key: measured[key]
        for key in (
            "cpu_us_per_delivery",
            "wall_us_per_delivery",
            "floor_cpu_us_per_delivery",
            "floor_multiple",
            "deliveries",
        )
    }
    emit("wake", args.layer, {"members": args.members, "messages": args.messages}, metrics)


def wake_cost_module() -> Any:
    """bench/wake_cost.py, which lies beside this file (in the reference root too)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wake_cost  # pyright: ignore[reportMissingImports]

    return wake_cost


def main() -> None:
    wake_cost_module().require_proc()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True)

    def common(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--layer", required=True, choices=LAYERS)
        p.add_argument("--url", default="nats://127.0.0.1:4222", help="server URL (nats:// or redis://)")
        return p

    for name in ("fanout", "saturation"):
        p = common(name, "P processes hold N members of one group; a publisher does M group_sends")
        p.add_argument("--members", type=int, default=1000)
        p.add_argument("--processes", type=int, default=2)
        p.add_argument("--messages", type=int, default=50)
        p.add_argument("--gap", type=float, default=0.01, help="seconds between publishes (fanout only)")
        p.add_argument("--grace", type=float, default=10.0, help="fanout: wait this long after the last gap")
        p.add_argument("--bound", type=float, default=60.0, help="saturation: give up after this many seconds")
        p.add_argument(
            "--urls",
            default="",
            help="comma-separated server URLs of one cluster: worker i uses URL i (round robin), the publisher"
            " the next one; --url is then ignored",
        )
    p = common("pingpong", "two processes bounce a message over process channels")
    p.add_argument("--rounds", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=50)
    p = common("throughput", "one process, one channel: send a batch, receive it, repeat")
    p.add_argument("--size", type=int, default=100, help="body bytes")
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--batch", type=int, default=100)
    p = common("connections", "async_to_sync(group_send) x calls from sync code: server connections opened")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--monitor", default="", help="nats-server monitoring URL (http://127.0.0.1:<port>)")
    p = common("wake", "one process wakes M times N waiting receives: CPU per delivery against the floor")
    p.add_argument("--members", type=int, default=2000)
    p.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()

    if args.scenario in ("fanout", "saturation"):
        if args.layer == "inmemory":
            raise SystemExit(f"{args.scenario}: the in-memory layer cannot span processes")
        run_fanout(args, args.scenario)
    elif args.scenario == "pingpong":
        if args.layer == "inmemory":
            raise SystemExit("pingpong: the in-memory layer cannot span processes")
        run_pingpong(args)
    elif args.scenario == "throughput":
        run_throughput(args)
    elif args.scenario == "wake":
        run_wake(args)
    else:
        run_connections(args)


if __name__ == "__main__":
    main()

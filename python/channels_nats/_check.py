"""`python -m channels_nats check`: a health check to run before blaming the application.

It reads the layer's CONFIG (from Django settings, or a server URL given on the command line),
connects, sends a message through a process channel and through a group and receives both, and
prints the server it reached (version, cluster peers), the round-trip times and the layer's
stats(). Exit status: 0 when everything worked, 1 when the layer failed (the reason is printed),
2 when the configuration cannot be used. Nothing it prints shows a credential: the texts come
from the library, which removes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m channels_nats", description="Tools for people who run the layer.")
    commands = p.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="connect, round-trip a message through a channel and a group, print the server and stats()",
        description="Connects with the layer's CONFIG, round-trips a message through a process channel and a "
        "group, and prints the server, the round-trip times and stats(). Exit status 0: healthy; 1: the layer "
        "failed; 2: the configuration cannot be used.",
    )
    check.add_argument("--settings", help="Django settings module (default: $DJANGO_SETTINGS_MODULE)")
    check.add_argument("--alias", default="default", help="the CHANNEL_LAYERS alias to check (default: default)")
    check.add_argument(
        "--servers", nargs="+", metavar="URL", help="check these NATS URLs with default settings instead"
    )
    check.add_argument("--timeout", type=float, default=15, help="seconds for the whole check (default: 15)")
    return p


class ConfigProblem(Exception):
    """The configuration cannot be used (exit status 2)."""


def layer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The CONFIG block to check."""
    if args.servers:
        return {"servers": args.servers}
    module = args.settings or os.environ.get("DJANGO_SETTINGS_MODULE")
    if not module:
        raise ConfigProblem("no configuration: give --settings, set DJANGO_SETTINGS_MODULE, or give --servers")
    os.environ["DJANGO_SETTINGS_MODULE"] = module
    try:
        from django.conf import settings

        layers = settings.CHANNEL_LAYERS
    except Exception as e:
        raise ConfigProblem(f"cannot read CHANNEL_LAYERS from {module}: {type(e).__name__}: {e}") from e
    entry = layers.get(args.alias)
    if entry is None:
        raise ConfigProblem(f"{module}.CHANNEL_LAYERS has no {args.alias!r} layer (it has: {', '.join(layers)})")
    backend = entry.get("BACKEND", "")
    if backend.rsplit(".", 1)[-1] != "NatsChannelLayer" or not backend.startswith("channels_nats"):
        raise ConfigProblem(f"CHANNEL_LAYERS[{args.alias!r}] uses {backend!r}, not channels_nats.NatsChannelLayer")
    return dict(entry.get("CONFIG", {}))


async def round_trips(config: dict[str, Any]) -> dict[str, Any]:
    from channels_nats import NatsChannelLayer

    try:
        layer = NatsChannelLayer(**config)
    except TypeError as e:
        raise ConfigProblem(str(e)) from e
    try:
        started = time.perf_counter()
        channel = await layer.new_channel("check")
        connected = time.perf_counter() - started

        started = time.perf_counter()
        await layer.send(channel, {"type": "check.process"})
        if (await layer.receive(channel))["type"] != "check.process":
            raise RuntimeError("the process channel returned another message")
        process = time.perf_counter() - started

        group = f"check-{channel.rpartition('!')[2][:12]}"
        await layer.group_add(group, channel)
        started = time.perf_counter()
        await layer.group_send(group, {"type": "check.group"})
        if (await layer.receive(channel))["type"] != "check.group":
            raise RuntimeError("the group returned another message")
        grouped = time.perf_counter() - started
        await layer.group_discard(group, channel)
        stats = layer.stats()
    finally:
        await layer.close()
    return {"connect_s": connected, "process_s": process, "group_s": grouped, "stats": stats}


def report(result: dict[str, Any]) -> str:
    stats = result["stats"]
    server = stats.get("server", {})
    peers = server.get("peers") or []
    cluster = f", cluster {server['cluster']} ({len(peers)} peer(s) announced)" if server.get("cluster") else ""
    lines = [
        "channels_nats check: OK",
        f"  server      {server.get('url', '?')} (name {server.get('name') or '?'}, "
        f"nats-server {server.get('version') or '?'}{cluster})",
        *(f"  peer        {peer}" for peer in peers),
        f"  max_payload {server.get('max_payload', '?')} bytes",
        f"  connect     {result['connect_s'] * 1000:.1f} ms (including the first subscription)",
        f"  process     round trip {result['process_s'] * 1000:.2f} ms",
        f"  group       round trip {result['group_s'] * 1000:.2f} ms",
        f"  stats       {json.dumps(stats, sort_keys=True)}",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from channels_nats import __version__, _native

    try:
        config = layer_config(args)
        print(
            f"channels_nats {__version__}, library {_native.version()} (called in {_native.call_mode()} mode),"
            f" Python {sys.version.split()[0]}"
        )
        result = asyncio.run(asyncio.wait_for(round_trips(config), args.timeout))
    except ConfigProblem as e:
        print(f"channels_nats check: configuration: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except (asyncio.TimeoutError, TimeoutError) as e:
        why = f"{type(e).__name__}: {e}" if str(e) else f"no answer within {args.timeout} s"
        print(f"channels_nats check: FAILED: {why}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:
        print(f"channels_nats check: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(report(result))
    return EXIT_OK

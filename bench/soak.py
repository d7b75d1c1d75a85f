"""Soak test: minutes of mixed traffic through the layer while nats-server is SIGKILLed and restarted.

    build/venv/bin/python bench/soak.py [--minutes 10] [--restart-every 60] [--consumers 200]
        [--rate 200] [--downtime 1] [--out bench/results/soak-<UTC>.json]

Prerequisites: `make lib server venv` (checked, not run). The script starts build/nats-server on a
free loopback port and, in spawned processes:

- 2 consumer processes, each with --consumers/2 churning consumer tasks (new_channel, group_add to
  one of GROUPS, receive for a random lifetime, group_discard, then again with a new channel), one
  stable probe consumer per group (it records every group message it gets), and one worker reading
  the plain channel "soak-work" (single delivery across both processes);
- 1 publisher at --rate messages/s: 3 of 4 are sends to "soak-work", 1 of 4 a group_send to the
  groups in turn; every message carries a sequence number.

Every --restart-every seconds the parent SIGKILLs nats-server and restarts it on the same port after
--downtime seconds. Every 10 s each process reports its RSS (/proc/self/status VmRSS) and
layer.stats(); the parent prints a progress line. At the end (or Ctrl-C) it writes the time series
and a summary: RSS and goroutines after warm-up (min(2 min, 20% of the run)) vs at the end and their
max, the verdict ("flat": RSS growth after warm-up < 10% and goroutines within +-20%, per process),
and delivered vs published with the losses attributed to each restart. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BUILD = REPO / "build"
VENV_PY = BUILD / "venv" / "bin" / "python"
LIB = BUILD / "linux-amd64" / "libchannels_nats.so"
NATS_SERVER = BUILD / "nats-server"

GROUPS = ("soak-g0", "soak-g1", "soak-g2", "soak-g3")
WORK = "soak-work"
SAMPLE_EVERY = 10.0
CONSUMER_PROCS = 2
LIFETIME = (30.0, 180.0)  # seconds a churning consumer keeps one channel
OP_TIMEOUT = 10.0  # new_channel / group_add / send wait at most this long (counted as an error)
RESTART_WINDOW = (-2.0, 20.0)  # a lost message published within this window of a restart is that restart's


def say(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def output(cmd: list[str], **kwargs: Any) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kwargs).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc.__class__.__name__})"


# --- child processes --------------------------------------------------------------------------


class Counters:
    """What a child process reports; the seq lists are emptied at every sample."""

    def __init__(self) -> None:
        self.deliveries = 0  # messages received by churning consumers
        self.churns = 0  # channels given up (left the group) and replaced
        self.active = 0  # churning consumers currently in a group
        self.errors: dict[str, int] = {}
        self.last_error = ""
        self.work_seqs: list[int] = []  # "soak-work" seqs received (worker) or sent (publisher)
        self.group_seqs: dict[str, list[int]] = {g: [] for g in GROUPS}  # probe receipts / group_sends
        self.sent_times: list[tuple[int, float]] = []  # publisher: (seq, time) of every sent message
        self.publish_behind = 0  # publisher: ticks skipped because a send was slow

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        self.last_error = f"{name}: {exc}"[:200]


def _sample(name: str, layer: Any, c: Counters, started: float) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "proc": name,
        "t": round(time.time() - started, 1),
        "wall": time.time(),
        "rss_kb": rss_kb(),
        "stats": layer.stats(),
        "deliveries": c.deliveries,
        "churns": c.churns,
        "active": c.active,
        "errors": dict(c.errors),
        "last_error": c.last_error,
        "publish_behind": c.publish_behind,
        "work_seqs": c.work_seqs,
        "group_seqs": c.group_seqs,
        "sent_times": c.sent_times,
    }
    c.work_seqs, c.group_seqs, c.sent_times = [], {g: [] for g in GROUPS}, []
    return sample


async def _sampler(name: str, layer: Any, c: Counters, out: Any, stop: EventType, started: float) -> None:
    """Reports every SAMPLE_EVERY seconds, and once more (final) when stop is set."""
    next_at = time.monotonic() + SAMPLE_EVERY
    while not stop.is_set():
        await asyncio.sleep(0.25)
        if time.monotonic() >= next_at:
            next_at += SAMPLE_EVERY
            out.put(_sample(name, layer, c, started))


async def _churning(layer: Any, index: int, c: Counters, rng: random.Random) -> None:
    group = GROUPS[index % len(GROUPS)]
    await asyncio.sleep(rng.uniform(0, 5))  # stagger the start
    while True:
        try:
            channel = await asyncio.wait_for(layer.new_channel("soak"), OP_TIMEOUT)
            await asyncio.wait_for(layer.group_add(group, channel), OP_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            c.error(exc)
            await asyncio.sleep(1)
            continue
        c.active += 1
        end = time.monotonic() + rng.uniform(*LIFETIME)
        try:
            while (left := end - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(layer.receive(channel), left)
                    c.deliveries += 1
                except asyncio.TimeoutError:
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    c.error(exc)
                    await asyncio.sleep(1)
        finally:
            c.active -= 1
        try:
            await layer.group_discard(group, channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            c.error(exc)
        c.churns += 1


async def _probe(layer: Any, group: str, c: Counters) -> None:
    """A stable member of one group: records every group message's seq."""
    while True:
        try:
            channel = await asyncio.wait_for(layer.new_channel("probe"), OP_TIMEOUT)
            await asyncio.wait_for(layer.group_add(group, channel), OP_TIMEOUT)
            break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            c.error(exc)
            await asyncio.sleep(1)
    while True:
        try:
            message = await layer.receive(channel)
            c.group_seqs[group].append(int(message["seq"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            c.error(exc)
            await asyncio.sleep(1)


async def _worker(layer: Any, c: Counters) -> None:
    while True:
        try:
            message = await layer.receive(WORK)
            c.work_seqs.append(int(message["seq"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            c.error(exc)
            await asyncio.sleep(1)


async def _until(stop: EventType) -> None:
    await asyncio.to_thread(stop.wait)  # the thread ends when the parent sets stop


def _layer(url: str) -> Any:
    from channels_nats.layer import NatsChannelLayer  # in the child: spawn re-imports this module

    return NatsChannelLayer(servers=url, capacity=1000)


async def _consumer_main(name: str, url: str, consumers: int, out: Any, stop: EventType, started: float) -> None:
    layer = _layer(url)
    c = Counters()
    rng = random.Random(name)
    await layer.new_channel("warmup")  # connect
    tasks = [asyncio.create_task(_worker(layer, c))]
    tasks += [asyncio.create_task(_probe(layer, g, c)) for g in GROUPS]
    tasks += [asyncio.create_task(_churning(layer, i, c, rng)) for i in range(consumers)]
    sampler = asyncio.create_task(_sampler(name, layer, c, out, stop, started))
    await _until(stop)
    await asyncio.sleep(0.5)  # let the last deliveries in
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    sampler.cancel()
    out.put({**_sample(name, layer, c, started), "final": True})
    await layer.close()


async def _publisher_main(url: str, rate: float, out: Any, stop: EventType, started: float) -> None:
    layer = _layer(url)
    c = Counters()
    await layer.new_channel("warmup")
    sampler = asyncio.create_task(_sampler("publisher", layer, c, out, stop, started))
    await asyncio.sleep(8)  # consumers join their groups first
    seq = 0
    period = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < next_at:
            await asyncio.sleep(next_at - now)
        elif now - next_at > 1.0:  # a slow send (broker down): skip ahead, do not burst
            c.publish_behind += int((now - next_at) / period)
            next_at = now
        next_at += period
        seq += 1
        sent_at = time.time()
        try:
            if seq % 4 == 0:
                group = GROUPS[(seq // 4) % len(GROUPS)]
                await asyncio.wait_for(layer.group_send(group, {"type": "soak.group", "seq": seq}), OP_TIMEOUT)
                c.group_seqs[group].append(seq)
            else:
                await asyncio.wait_for(layer.send(WORK, {"type": "soak.work", "seq": seq}), OP_TIMEOUT)
                c.work_seqs.append(seq)
            c.sent_times.append((seq, sent_at))
            c.deliveries += 1
        except Exception as exc:
            c.error(exc)
    sampler.cancel()
    await asyncio.sleep(0.5)
    out.put({**_sample("publisher", layer, c, started), "final": True})
    await layer.close()


def consumer_proc(name: str, url: str, consumers: int, out: Any, stop: EventType, started: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    asyncio.run(_consumer_main(name, url, consumers, out, stop, started))


def publisher_proc(url: str, rate: float, out: Any, stop: EventType, started: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_publisher_main(url, rate, out, stop, started))


# --- parent -----------------------------------------------------------------------------------


class Broker:
    """build/nats-server on one loopback port, SIGKILLed and restarted on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C goes to us, not to it
        )
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"soak: nats-server did not come up on {self.url}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def measured() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "CHANNELS_NATS_LIBRARY": str(LIB)}
    probe = (
        "import importlib.metadata as m, channels_nats, platform;"
        "print(channels_nats.__version__, m.version('channels'), platform.python_version())"
    )
    ours, channels_v, py = (output([str(VENV_PY), "-c", probe], env=env).split() + ["?"] * 3)[:3]
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "revision": output(["git", "describe", "--tags", "--always", "--dirty"], cwd=REPO),
        "channels_nats": ours,
        "channels": channels_v,
        "python": py,
        "nats_server": output([str(NATS_SERVER), "--version"]),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "kernel": platform.release(),
    }


class Collector:
    """Keeps the time series (without the seq lists) and the seq bookkeeping."""

    def __init__(self) -> None:
        self.series: dict[str, list[dict[str, Any]]] = {}
        self.sent: dict[int, float] = {}  # seq -> publish time (wall)
        self.work_sent: set[int] = set()
        self.group_sent: dict[str, set[int]] = {g: set() for g in GROUPS}
        self.work_got: list[int] = []
        self.probe_got: dict[str, dict[str, set[int]]] = {}  # proc -> group -> seqs

    def add(self, s: dict[str, Any]) -> None:
        proc = s["proc"]
        if proc == "publisher":
            self.sent.update((seq, t) for seq, t in s["sent_times"])
            self.work_sent.update(s["work_seqs"])
            for g, seqs in s["group_seqs"].items():
                self.group_sent[g].update(seqs)
        else:
            self.work_got.extend(s["work_seqs"])
            mine = self.probe_got.setdefault(proc, {g: set() for g in GROUPS})
            for g, seqs in s["group_seqs"].items():
                mine[g].update(seqs)
        point = {k: v for k, v in s.items() if k not in ("work_seqs", "group_seqs", "sent_times", "wall")}
        self.series.setdefault(proc, []).append(point)

    def drain(self, q: Any, timeout: float = 0.0) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                self.add(q.get(timeout=max(0.0, deadline - time.time())) if timeout else q.get_nowait())
            except queue.Empty:
                return


def progress(col: Collector, elapsed: float, restarts: int) -> None:
    parts = [f"{elapsed:5.0f}s restarts={restarts}"]
    if not col.series:
        parts.append("(no samples yet)")
    for proc, points in sorted(col.series.items()):
        p = points[-1]
        st = p["stats"] or {}
        dropped = sum((st.get("dropped") or {}).values())
        parts.append(
            f"{proc}: rss={p['rss_kb'] / 1024:.1f}MB gor={st.get('goroutines', '?')} "
            f"mb={st.get('mailboxes', '?')} subs={st.get('subscriptions', '?')} "
            f"pub={st.get('published', '?')} dlv={st.get('delivered', '?')} drop={dropped} "
            f"rec={st.get('reconnects', '?')} err={sum(p['errors'].values())}"
        )
    say(" | ".join(parts))


def _median_at(points: list[dict[str, Any]], key: Any, start: int) -> float | None:
    window = [v for v in (key(p) for p in points[start : start + 3]) if v is not None]
    return statistics.median(window) if window else None


def summarize(col: Collector, args: argparse.Namespace, restarts: list[float], t0: float) -> dict[str, Any]:
    duration = max((p["t"] for pts in col.series.values() for p in pts), default=0.0)
    warmup = min(120.0, 0.2 * args.minutes * 60)
    procs: dict[str, Any] = {}
    flat, short = True, False
    for proc, points in sorted(col.series.items()):
        regular = [p for p in points if not p.get("final")] or points
        after = [i for i, p in enumerate(regular) if p["t"] >= warmup]
        last = points[-1]["stats"] or {}
        if not after:
            procs[proc] = {
                "note": "run shorter than warm-up: no verdict",
                "published": last.get("published"),
                "delivered": last.get("delivered"),
                "dropped": last.get("dropped"),
            }
            short = True
            continue
        w = after[0]
        end = max(len(regular) - 3, w)

        def rss(p: dict[str, Any]) -> float:
            return float(p["rss_kb"])

        def gor(p: dict[str, Any]) -> float | None:
            return p["stats"].get("goroutines") if p["stats"] else None

        rss_w, rss_e = _median_at(regular, rss, w), _median_at(regular, rss, end)
        gor_w, gor_e = _median_at(regular, gor, w), _median_at(regular, gor, end)
        growth = (rss_e - rss_w) / rss_w if rss_w and rss_e else None
        gchange = (gor_e - gor_w) / gor_w if gor_w and gor_e is not None else None
        ok = growth is not None and growth < 0.10 and gchange is not None and abs(gchange) <= 0.20
        flat = flat and ok
        procs[proc] = {
            "rss_kb_start": regular[0]["rss_kb"],
            "rss_kb_warm": rss_w,
            "rss_kb_end": rss_e,
            "rss_kb_max": max(p["rss_kb"] for p in regular),
            "rss_growth_after_warmup": None if growth is None else round(growth, 4),
            "goroutines_warm": gor_w,
            "goroutines_end": gor_e,
            "goroutines_max": max((gor(p) or 0) for p in regular),
            "goroutines_change_after_warmup": None if gchange is None else round(gchange, 4),
            "mailboxes_warm": _median_at(regular, lambda p: p["stats"].get("mailboxes"), w),
            "mailboxes_end": _median_at(regular, lambda p: p["stats"].get("mailboxes"), end),
            "mailboxes_max": max((p["stats"] or {}).get("mailboxes", 0) for p in regular),
            "subscriptions_end": _median_at(regular, lambda p: p["stats"].get("subscriptions"), end),
            "published": last.get("published"),
            "delivered": last.get("delivered"),
            "dropped": last.get("dropped"),
            "reconnects": last.get("reconnects"),
            "recoveries": last.get("recoveries"),
            "errors": points[-1]["errors"],
            "last_error": points[-1]["last_error"],
            "churns": points[-1]["churns"],
            "flat": ok,
        }
    # Losses: "soak-work" seqs never received, group seqs missing at a probe.
    got = set(col.work_got)
    lost_work = sorted(col.work_sent - got)
    duplicates = len(col.work_got) - len(got)
    lost_group: list[int] = []
    group_expected = 0
    for per_group in col.probe_got.values():
        for g, seqs in per_group.items():
            group_expected += len(col.group_sent[g])
            lost_group.extend(sorted(col.group_sent[g] - seqs))
    per_restart = []
    attributed: set[int] = set()
    for r in restarts:
        lo, hi = r + RESTART_WINDOW[0], r + RESTART_WINDOW[1]
        work = [s for s in lost_work if lo <= col.sent.get(s, -1e18) < hi]
        group = [s for s in lost_group if lo <= col.sent.get(s, -1e18) < hi]
        times = [col.sent[s] - r for s in work + group]
        attributed.update(work)
        attributed.update(group)
        per_restart.append(
            {
                "at_s": round(r - t0, 1),
                "lost_work": len(work),
                "lost_group_deliveries": len(group),
                "loss_window_s": [round(min(times), 2), round(max(times), 2)] if times else None,
            }
        )
    other = [s for s in lost_work + lost_group if s not in attributed]
    stats_pub = (procs.get("publisher") or {}).get("published") or 0
    stats_dlv = sum((v.get("delivered") or 0) for k, v in procs.items() if k != "publisher")
    return {
        "duration_s": duration,
        "warmup_s": warmup,
        "verdict": "no verdict (shorter than warm-up)" if short or not procs else "flat" if flat else "not flat",
        "processes": procs,
        "traffic": {
            "published_stats": stats_pub,
            "delivered_stats": stats_dlv,
            "work_sent": len(col.work_sent),
            "work_received": len(got),
            "work_lost": len(lost_work),
            "work_duplicates": duplicates,
            "group_sends": sum(len(v) for v in col.group_sent.values()),
            "probe_expected": group_expected,
            "probe_lost": len(lost_group),
            "lost_outside_restart_windows": len(other),
        },
        "restarts": per_restart,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--restart-every", type=float, default=60, help="seconds between broker SIGKILLs (0: never)")
    ap.add_argument("--downtime", type=float, default=1.0, help="seconds the broker stays down")
    ap.add_argument("--consumers", type=int, default=200, help="churning consumers over both processes")
    ap.add_argument("--rate", type=float, default=200, help="messages/s published")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/soak-<UTC>.json)")
    args = ap.parse_args()
    missing = [str(p.relative_to(REPO)) for p in (LIB, NATS_SERVER, VENV_PY) if not p.exists()]
    if missing:
        say(f"missing {', '.join(missing)}: run `make lib server venv` first")
        return 2
    os.environ.setdefault("CHANNELS_NATS_LIBRARY", str(LIB))
    sys.path.insert(0, str(REPO / "python"))  # spawned children get the parent's sys.path
    out_path = Path(args.out or RESULTS / f"soak-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json")
    info = measured()
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    stop_pub, stop_cons = ctx.Event(), ctx.Event()
    broker = Broker()
    col = Collector()
    restarts: list[float] = []
    procs: list[Any] = []
    interrupted = False
    t0 = time.time()
    say(
        f"{args.minutes:g} min, nats-server on {broker.url}, restart every {args.restart_every:g}s, "
        f"{args.consumers} consumers in {CONSUMER_PROCS} processes, {args.rate:g} msg/s -> {out_path}"
    )
    try:
        broker.start()
        per_proc = args.consumers // CONSUMER_PROCS
        for i in range(CONSUMER_PROCS):
            procs.append(
                ctx.Process(
                    target=consumer_proc, args=(f"consumer-{i}", broker.url, per_proc, q, stop_cons, t0), daemon=True
                )
            )
        procs.append(ctx.Process(target=publisher_proc, args=(broker.url, args.rate, q, stop_pub, t0), daemon=True))
        for p in procs:
            p.start()
        end = t0 + args.minutes * 60
        next_restart = t0 + args.restart_every if args.restart_every > 0 else float("inf")
        next_progress = t0 + SAMPLE_EVERY + 1
        while time.time() < end:
            col.drain(q, timeout=0.5)
            now = time.time()
            if now >= next_restart and now < end - 5:
                say(f"{now - t0:5.0f}s SIGKILL nats-server, restart in {args.downtime:g}s")
                restarts.append(now)
                broker.kill()
                time.sleep(args.downtime)
                broker.start()
                next_restart += args.restart_every
            if now >= next_progress:
                progress(col, now - t0, len(restarts))
                next_progress += SAMPLE_EVERY
            dead = [p.name for p in procs if not p.is_alive()]
            if dead:
                say(f"process(es) exited early: {', '.join(dead)}")
                break
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping and writing what was collected")
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            stop_pub.set()
            col.drain(q, timeout=3)  # publisher's last sample; consumers take the last messages
            stop_cons.set()
            deadline = time.time() + 20
            while time.time() < deadline and any(p.is_alive() for p in procs):
                col.drain(q, timeout=0.5)
            for p in procs:
                if p.is_alive():
                    say(f"{p.name} did not stop: killing it")
                    p.kill()
                p.join(timeout=5)
            col.drain(q, timeout=0.5)
        broker.kill()
    summary = summarize(col, args, restarts, t0)
    report = {
        "measured": info,
        "params": {**vars(args), "out": str(out_path), "groups": list(GROUPS), "lifetime_s": list(LIFETIME)},
        "interrupted": interrupted,
        "summary": summary,
        "series": col.series,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    tr = summary["traffic"]
    for proc, s in summary["processes"].items():
        if "rss_kb_warm" in s:
            say(
                f"{proc}: RSS start/warm/end/max {s['rss_kb_start'] / 1024:.1f}/{s['rss_kb_warm'] / 1024:.1f}/"
                f"{s['rss_kb_end'] / 1024:.1f}/{s['rss_kb_max'] / 1024:.1f} MB "
                f"({s['rss_growth_after_warmup']:+.1%}), goroutines warm/end/max "
                f"{s['goroutines_warm']}/{s['goroutines_end']}/{s['goroutines_max']}, mailboxes "
                f"{s['mailboxes_warm']}/{s['mailboxes_end']}/{s['mailboxes_max']}, errors {s['errors']}"
            )
        else:
            say(f"{proc}: {s.get('note')}")
    say(
        f"published {tr['published_stats']} delivered {tr['delivered_stats']}; work {tr['work_received']}/"
        f"{tr['work_sent']} (lost {tr['work_lost']}, dup {tr['work_duplicates']}); probes lost "
        f"{tr['probe_lost']}/{tr['probe_expected']}; outside restart windows {tr['lost_outside_restart_windows']}"
    )
    for r in summary["restarts"]:
        say(
            f"restart at {r['at_s']}s: lost work {r['lost_work']}, group {r['lost_group_deliveries']}, "
            f"window {r['loss_window_s']}"
        )
    say(f"verdict: {summary['verdict']} -> {out_path}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

"""Scenario 6, "memory": RSS per idle consumer, WebSocket consumers through an ASGI server.

    build/venv/bin/python bench/memory.py --layer nats|redis|redis-pubsub|inmemory|reference \
        [--nats nats://127.0.0.1:4222] [--redis redis://127.0.0.1:6379] \
        [--connections 2000] [--procs 2] [--idle 3]

Starts --procs daphne processes of bench/memory_app (a consumer that joins group "bench" on
connect and idles on its pending receive) with the layer under test, opens one warm-up WebSocket
to each and reads each process's VmRSS, then opens --connections more (spread evenly), lets them
idle, reads VmRSS again: rss_per_consumer_kb = (after - before) / connections of that process,
averaged over the processes. Last, one client asks its consumer to group_send once, and every
connection must see it (deliveries_ok); InMemoryChannelLayer is per process, so there only the
sender's process is expected to deliver.

"reference" (PyPI channels-nats 0.10.x on nats-py) runs daphne inside the trixie root
(build/reference/root, /opt/ref/bin/python) with /proc bind-mounted meanwhile; daphne is
pip-installed there on first use. With --in-root the other layers run there too, on the same
interpreter, from the venv bench/layers-env.sh made (/opt/layers, this tree's package in
/opt/layers-src). The servers (nats, redis) are the caller's.

Progress goes to stderr; the last stdout line is one JSON object:
{"scenario": "memory", "layer": ..., "params": {...}, "metrics": {...}}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
APP_DIR = HERE / "memory_app"
APP_FILES = ("asgi.py", "consumers.py")
REFERENCE_ROOT = REPO / "build" / "reference" / "root"
APP_IN_ROOT = "/opt/bench_memory_app"
PYTHON_IN_ROOT = "/opt/ref/bin/python"
PIP_IN_ROOT = "/opt/ref/bin/pip"
LAYERS_PYTHON_IN_ROOT = "/opt/layers/bin/python"
LAYERS_SRC_IN_ROOT = "/opt/layers-src"
DAPHNE_SPEC = "daphne==4.2.3"
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
LAYERS = ("nats", "redis", "redis-pubsub", "inmemory", "reference")


def log(text: str) -> None:
    print(f"memory: {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_nofile(want: int) -> int:
    """Raise the soft open-files limit towards `want` (at most the hard limit); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def rss_kb(pid: int) -> int:
    """VmRSS of pid in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def load_peer_module() -> ModuleType:
    """python/tests/interop/peer.py, for its shared /proc mount handling of the reference root."""
    path = REPO / "python" / "tests" / "interop" / "peer.py"
    spec = importlib.util.spec_from_file_location("bench_interop_peer", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def in_root(args: list[str], env: dict[str, str] | None = None) -> list[str]:
    """A command line that runs args inside the reference root with a clean environment."""
    envs = [f"{k}={v}" for k, v in {**ROOT_ENV, **(env or {})}.items()]
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return ["env", "-i", *envs, chroot, str(REFERENCE_ROOT), *args]


class Server:
    """One daphne process serving memory_app."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, port: int, logfile: Path, nofile: int) -> None:
        self.port = port
        self.logfile = logfile
        self._log = logfile.open("wb")

        def preexec() -> None:
            os.setsid()
            with contextlib.suppress(ValueError, OSError):
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=preexec
        )

    @property
    def pid(self) -> int:
        # env -i and chroot exec their commands, so this pid is the Python process itself.
        return self.proc.pid

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return
            time.sleep(0.1)
        raise RuntimeError(f"daphne did not listen on {self.port} within {timeout}s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()


def host_command(args: argparse.Namespace, port: int) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    paths = [str(APP_DIR)]
    if args.layer == "nats":
        paths.append(str(REPO / "python"))
        env.setdefault("CHANNELS_NATS_LIBRARY", str(REPO / "build" / "linux-amd64" / "libchannels_nats.so"))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(BENCH_LAYER=args.layer, BENCH_NATS=args.nats, BENCH_REDIS=args.redis)
    argv = [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port), "asgi:application"]
    return argv, env


def root_command(args: argparse.Namespace, port: int) -> list[str]:
    """daphne inside the root: the reference's venv for it, the layers' venv for the others."""
    env = {"PYTHONPATH": APP_IN_ROOT, "BENCH_LAYER": args.layer, "BENCH_NATS": args.nats, "BENCH_REDIS": args.redis}
    python = PYTHON_IN_ROOT
    if args.layer != "reference":
        python = LAYERS_PYTHON_IN_ROOT
        env["PYTHONPATH"] += f":{LAYERS_SRC_IN_ROOT}"
        env["CHANNELS_NATS_LIBRARY"] = f"{LAYERS_SRC_IN_ROOT}/libchannels_nats.so"
    daphne = [python, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port), "asgi:application"]
    return in_root(daphne, env)


def copy_app_into_root() -> None:
    target = REFERENCE_ROOT / APP_IN_ROOT.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    for name in APP_FILES:
        shutil.copy2(APP_DIR / name, target / name)


def python_in_root(python: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_root([python, "-c", code]), capture_output=True, text=True, timeout=60)


def tree_version() -> str:
    describe = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True)
    return "tree " + describe.stdout.decode().strip()


def prepare_layers_in_root(layer: str) -> dict[str, str]:
    """Copy the app into the root for a layer other than the reference; returns versions found
    in the layers' venv (made by bench/layers-env.sh)."""
    if not (REFERENCE_ROOT / LAYERS_PYTHON_IN_ROOT.lstrip("/")).is_symlink():
        raise RuntimeError("no /opt/layers venv in the root: run bench/layers-env.sh (as root)")
    copy_app_into_root()
    probe = (
        "import importlib.metadata as m, platform; "
        "print(m.version('daphne'), m.version('channels'), m.version('channels-redis'), platform.python_version())"
    )
    check = python_in_root(LAYERS_PYTHON_IN_ROOT, probe)
    if check.returncode != 0:
        raise RuntimeError(f"the layers' venv in the root does not work: {check.stderr.strip()}")
    daphne_v, channels_v, redis_v, python_v = check.stdout.split()
    versions = {"daphne": daphne_v, "channels": channels_v, "python_version": python_v}
    if layer.startswith("redis"):
        versions["layer_version"] = redis_v
    elif layer == "nats":
        versions["layer_version"] = tree_version()
    return versions


def prepare_reference() -> dict[str, str]:
    """Copy the app into the root and make sure daphne is there; returns versions found."""
    if not (REFERENCE_ROOT / "opt" / "ref" / "pyvenv.cfg").is_file():
        raise RuntimeError("no reference root: run python/tests/interop/make-reference-env.sh (as root)")
    copy_app_into_root()
    probe = (
        "import daphne, channels, channels_nats; "
        "print(daphne.__version__, channels.__version__, channels_nats.__version__)"
    )
    check = python_in_root(PYTHON_IN_ROOT, probe)
    if check.returncode != 0:
        log(f"installing {DAPHNE_SPEC} into the reference root")
        pip = in_root([PIP_IN_ROOT, "install", "--disable-pip-version-check", "-q", DAPHNE_SPEC])
        subprocess.run(pip, check=True, timeout=600)
        check = python_in_root(PYTHON_IN_ROOT, probe)
        if check.returncode != 0:
            raise RuntimeError(f"daphne does not import in the reference root: {check.stderr.strip()}")
    daphne_v, channels_v, layer_v = check.stdout.split()
    return {"daphne": daphne_v, "channels": channels_v, "layer_version": layer_v}


def host_versions(layer: str) -> dict[str, str]:
    from importlib import metadata

    versions: dict[str, str] = {}
    for key, dist in (("daphne", "daphne"), ("channels", "channels")):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[key] = metadata.version(dist)
    if layer.startswith("redis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions["layer_version"] = metadata.version("channels-redis")
    elif layer == "nats":
        versions["layer_version"] = tree_version()
    return versions


async def open_ws(port: int, sem: asyncio.Semaphore, timeout: float) -> ClientConnection:
    async with sem:
        return await asyncio.wait_for(
            connect(f"ws://127.0.0.1:{port}/", ping_interval=None, open_timeout=timeout, max_queue=16),
            timeout + 1,
        )


async def expect_broadcast(ws: ClientConnection, token: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            frame = await asyncio.wait_for(ws.recv(), left)
        except (asyncio.TimeoutError, Exception):
            return False
        if frame == f"bench:{token}":
            return True


async def measure(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    sem = asyncio.Semaphore(args.concurrency)
    per_proc = [
        args.connections // len(servers) + (1 if i < args.connections % len(servers) else 0)
        for i in range(len(servers))
    ]
    sockets: list[list[ClientConnection]] = [[] for _ in servers]
    try:
        # Warm-up: one connection per process loads the consumer path and connects the layer.
        for i, srv in enumerate(servers):
            ws = await open_ws(srv.port, sem, args.timeout)
            await ws.send("ping")
            reply = await asyncio.wait_for(ws.recv(), args.timeout)
            if reply != "pong":
                raise RuntimeError(f"warm-up on process {i}: unexpected reply {reply!r}")
            sockets[i].append(ws)
        await asyncio.sleep(args.settle)
        before = [rss_kb(srv.pid) for srv in servers]
        log(f"warm-up done; RSS before: {', '.join(f'{kb / 1024:.1f} MiB' for kb in before)}")

        started = time.monotonic()
        for i, srv in enumerate(servers):
            results = await asyncio.gather(
                *(open_ws(srv.port, sem, args.timeout) for _ in range(per_proc[i])), return_exceptions=True
            )
            opened = [r for r in results if isinstance(r, ClientConnection)]
            failed = [r for r in results if not isinstance(r, ClientConnection)]
            sockets[i].extend(opened)
            if failed:
                log(f"process {i}: {len(failed)} connections failed, first: {failed[0]!r}")
            log(f"process {i}: {len(opened)} connections open")
        connect_s = time.monotonic() - started
        # Each consumer's group_add runs in connect(), before accept: an open socket is a joined consumer.
        log(f"all connected in {connect_s:.1f}s; idling {args.idle}s")
        await asyncio.sleep(args.idle)
        after = [rss_kb(srv.pid) for srv in servers]
        opened_per_proc = [len(s) - 1 for s in sockets]
        per_consumer = [(a - b) / n for a, b, n in zip(after, before, opened_per_proc, strict=True) if n > 0]
        log(f"RSS after: {', '.join(f'{kb / 1024:.1f} MiB' for kb in after)}")

        # One group_send from process 0's warm-up consumer; everyone in the group must see it.
        token = f"broadcast-{os.getpid()}-{time.monotonic_ns()}"
        everyone = [ws for group in sockets for ws in group]
        expected = len(sockets[0]) if args.layer == "inmemory" else len(everyone)
        waiters = {asyncio.create_task(expect_broadcast(ws, token, args.timeout)) for ws in everyone}
        sent_at = time.monotonic()
        await sockets[0][0].send(token)
        delivered = 0
        pending = waiters
        # Stop as soon as everyone expected has it (in-memory: the other process never will).
        while pending and delivered < expected:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            delivered += sum(1 for task in done if task.result())
        deliver_s = time.monotonic() - sent_at
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        log(f"group_send: {delivered} of {expected} expected consumers received it in {deliver_s:.2f}s")
    finally:
        closers = [ws.close() for group in sockets for ws in group]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), 20)

    return {
        "rss_per_consumer_kb": round(sum(per_consumer) / len(per_consumer), 2) if per_consumer else None,
        "rss_per_consumer_kb_by_process": [round(v, 2) for v in per_consumer],
        "rss_before_kb": before,
        "rss_after_kb": after,
        "rss_total_before_kb": sum(before),
        "rss_total_after_kb": sum(after),
        "connections": sum(opened_per_proc),
        "connections_by_process": opened_per_proc,
        "connections_failed": args.connections - sum(opened_per_proc),
        "connect_s": round(connect_s, 3),
        "deliveries_ok": delivered,
        "deliveries_expected": expected,
        "delivery_s": round(deliver_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", required=True, choices=LAYERS)
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--connections", type=int, default=2000, help="idle WebSocket consumers in total")
    parser.add_argument("--procs", type=int, default=2, help="daphne processes the consumers are spread over")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before the second RSS reading")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after warm-up before the first reading")
    parser.add_argument("--concurrency", type=int, default=50, help="WebSocket handshakes in flight")
    parser.add_argument("--timeout", type=float, default=20.0, help="per-connection and delivery timeout")
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument(
        "--in-root", action="store_true", help="run every layer in the reference root (see bench/layers-env.sh)"
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the daphne logs here (default: discarded)")
    args = parser.parse_args(argv)

    nofile = raise_nofile(max(4096, args.connections * 2 + 1024))
    if nofile < args.connections + 256:
        log(f"warning: open-files limit is {nofile}, low for {args.connections} connections")

    # SIGTERM from the orchestrator: unwind through the finally blocks below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    workdir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-memory-"))
    servers: list[Server] = []
    peer: ModuleType | None = None
    proc_acquired = False
    try:
        in_the_root = args.layer == "reference" or args.in_root
        if in_the_root:
            peer = load_peer_module()
            peer.acquire_proc(REFERENCE_ROOT)
            proc_acquired = True
        if args.layer == "reference":
            versions = prepare_reference()
            python_version = "3.13 (reference root)"
        elif in_the_root:
            versions = prepare_layers_in_root(args.layer)
            python_version = f"{versions.pop('python_version')} (reference root)"
        else:
            versions = host_versions(args.layer)
            python_version = platform.python_version()
        for i in range(args.procs):
            port = free_port()
            logfile = workdir / f"daphne-{i}.log"
            if in_the_root:
                servers.append(Server(root_command(args, port), None, port, logfile, nofile))
            else:
                command, env = host_command(args, port)
                servers.append(Server(command, env, port, logfile, nofile))
        for srv in servers:
            srv.wait_ready(args.start_timeout)
        log(f"{args.procs} daphne processes up ({args.layer}): pids {[s.pid for s in servers]}")
        metrics = asyncio.run(measure(args, servers))
        for i, srv in enumerate(servers):
            if srv.proc.poll() is not None:
                raise RuntimeError(f"daphne {i} died during the run:\n{srv.tail()}")
    except Exception as exc:
        log(f"failed: {exc}")
        for i, srv in enumerate(servers):
            log(f"daphne {i} log tail:\n{srv.tail()}")
        return 1
    finally:
        for srv in servers:
            srv.stop()
        if peer is not None and proc_acquired:
            peer.release_proc(REFERENCE_ROOT)
        if args.log_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    result = {
        "scenario": "memory",
        "layer": args.layer,
        "params": {
            "connections": args.connections,
            "procs": args.procs,
            "idle_s": args.idle,
            "asgi_server": "daphne",
            "consumer": "AsyncWebsocketConsumer, group_add on connect, idle on its pending receive",
            "python": python_version,
            "nats": args.nats if args.layer in ("nats", "reference") else None,
            "redis": args.redis if args.layer.startswith("redis") else None,
            "delivery_note": "InMemoryChannelLayer is per process: only the sender's process is expected"
            if args.layer == "inmemory"
            else "every consumer in both processes is expected",
            **versions,
        },
        "metrics": metrics,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

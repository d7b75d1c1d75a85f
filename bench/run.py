"""Run the benchmark scenarios for every layer, then write JSON, a markdown table and a chart.

    build/venv/bin/python bench/run.py [--scenarios fanout,pingpong] [--sizes 1000,10000]
        [--procs 2,4] [--layers nats,reference,redis] [--repeats 3] [--baseline REV] [--skip-setup]

Prerequisites are made first (make lib accelerator server venv, pip install -r bench/requirements.txt,
redis-server from apt, the reference root via make-reference-env.sh); nats-server and
redis-server are started on free loopback ports and stopped at the end. Each (scenario, params,
layer) runs --repeats times in a fresh process with a timeout, the layers of a cell taking turns
(repeat 1 of every layer, then repeat 2, ...); the report keeps every run and the median, min and
max of each metric. --baseline REV adds this layer as built from revision REV (layer
`baseline`), for a before-and-after in one run. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
BUILD = REPO / "build"
VENV_PY = BUILD / "venv" / "bin" / "python"
LIB = BUILD / "linux-amd64" / "libchannels_nats.so"
NATS_SERVER = BUILD / "nats-server"
RAW = BUILD / "bench" / "rawnats"
MEMORY = BENCH / "memory.py"
ROOT = BUILD / "reference" / "root"
# Every Python layer but the reference runs in the root too, on the same interpreter as the
# reference (bench/layers-env.sh makes the venv and copies this tree's package there).
LAYERS_PY = "/opt/layers/bin/python"
LAYERS_SRC = "/opt/layers-src"
LAYERS_ENV = {"PYTHONPATH": LAYERS_SRC, "CHANNELS_NATS_LIBRARY": f"{LAYERS_SRC}/libchannels_nats.so"}
# The layer as built from --baseline REV: a git worktree under build/baseline, its package copied
# into the root like this tree's.
BASELINES = BUILD / "baseline"
BASELINE_SRC = "/opt/baseline-src"
BASELINE_ENV = {"PYTHONPATH": BASELINE_SRC, "CHANNELS_NATS_LIBRARY": f"{BASELINE_SRC}/libchannels_nats.so"}
PYTHON_LAYERS = ("nats", "baseline", "redis", "redis-pubsub", "inmemory")
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}

ALL_SCENARIOS = ("fanout", "saturation", "cluster", "pingpong", "throughput", "connections", "memory", "wake")
ALL_LAYERS = ("nats", "baseline", "reference", "redis", "redis-pubsub", "inmemory", "raw")
DEFAULT_LAYERS = ("nats", "reference", "redis", "redis-pubsub", "inmemory", "raw")
# Which layers each scenario runs for (raw: bench/rawnats; memory: bench/memory.py).
SCENARIO_LAYERS = {
    "fanout": ("nats", "baseline", "reference", "redis", "redis-pubsub", "raw"),
    "saturation": ("nats", "baseline", "reference", "redis", "redis-pubsub", "raw"),
    "cluster": ("nats", "baseline", "reference"),
    "pingpong": ("nats", "baseline", "reference", "redis", "redis-pubsub", "raw"),
    "throughput": ("nats", "baseline", "reference", "redis", "redis-pubsub", "inmemory", "raw"),
    "connections": ("nats", "baseline", "reference", "redis", "redis-pubsub"),
    "memory": ("nats", "reference", "redis", "redis-pubsub", "inmemory"),
    "wake": ("nats", "baseline", "reference"),
}
# The figure each table row shows, per scenario, and whether lower is better.
HEADLINE: dict[str, list[tuple[str, bool]]] = {
    "fanout": [("p50_ms", True), ("p99_ms", True), ("deliveries_per_s", False)],
    "saturation": [("deliveries_per_s", False)],
    "cluster": [("deliveries_per_s", False)],
    "pingpong": [("rtt_p50_ms", True), ("rtt_p99_ms", True), ("cpu_us_per_round_trip", True)],
    "throughput": [("messages_per_s", False)],
    "connections": [("connections_opened", True)],
    "memory": [("rss_per_consumer_kb", True)],
    "wake": [("cpu_us_per_delivery", True), ("floor_cpu_us_per_delivery", True), ("floor_multiple", True)],
}


def results_stem(out: str) -> Path:
    """Where --out puts the results, without the suffix: a bare name in RESULTS, a path as given."""
    path = Path(out)
    return RESULTS / path if path.parent == Path() else path


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def output(cmd: list[str], **kwargs: Any) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc.__class__.__name__})"


def in_root(args: list[str], env: dict[str, str] | None = None) -> list[str]:
    envs = {**ROOT_ENV, **(env or {})}
    return ["env", "-i", *(f"{k}={v}" for k, v in envs.items()), "chroot", str(ROOT), *args]


class Baseline:
    """The revision of --baseline, as a full commit id ('' without it)."""

    rev = ""


class Where:
    """Where the Python layers other than the reference run: in the root (the reference's
    interpreter), or on the host's venv when the root cannot be had."""

    in_root = False
    why_host = "not set up"


# --- prerequisites ----------------------------------------------------------------------------


def setup(args: argparse.Namespace, layers: set[str]) -> dict[str, str]:
    """Build and install what the chosen layers need; returns {layer: reason} for unavailable ones."""
    missing: dict[str, str] = {}
    say("make lib accelerator server venv")
    # Tool output goes to stderr: stdout ends with the markdown table only.
    make = ["make", "--no-print-directory", "lib", "accelerator", "server", "venv"]
    subprocess.run(make, cwd=REPO, check=True, stdout=sys.stderr)
    say("pip install -r bench/requirements.txt into build/venv")
    subprocess.run(
        [
            str(VENV_PY),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
            str(BENCH / "requirements.txt"),
        ],
        check=True,
        stdout=sys.stderr,
    )
    if layers & {"redis", "redis-pubsub"} and not shutil.which("redis-server"):
        say("apt-get install -y redis-server")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        ok = (
            subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], env=env, stdout=sys.stderr).returncode
            == 0
        )
        if not ok:
            subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=sys.stderr)
            ok = (
                subprocess.run(
                    ["apt-get", "install", "-y", "-qq", "redis-server"], env=env, stdout=sys.stderr
                ).returncode
                == 0
            )
        if not ok:
            missing["redis"] = missing["redis-pubsub"] = "apt-get install redis-server failed"
    if layers & {"reference", *PYTHON_LAYERS}:
        say("reference root (python/tests/interop/make-reference-env.sh)")
        script = str(REPO / "python/tests/interop/make-reference-env.sh")
        if subprocess.run(["bash", script], cwd=REPO, stdout=sys.stderr).returncode:
            missing["reference"] = "make-reference-env.sh failed (see its output)"
            Where.why_host = "the reference root could not be made"
    if layers & set(PYTHON_LAYERS) and "reference" not in missing:
        say("the Python layers' venv in the root (bench/layers-env.sh)")
        if subprocess.run(["bash", str(BENCH / "layers-env.sh")], cwd=REPO, stdout=sys.stderr).returncode:
            Where.why_host = "bench/layers-env.sh failed (see its output)"
        else:
            Where.in_root = True
    if "baseline" in layers:
        why = build_baseline(Baseline.rev)
        if why:
            missing["baseline"] = why
    if "raw" in layers:
        say("go build -o build/bench/rawnats ./bench/rawnats")
        if not (BENCH / "rawnats").is_dir():
            missing["raw"] = "bench/rawnats does not exist"
        elif subprocess.run(["go", "build", "-o", str(RAW), "./bench/rawnats"], cwd=REPO, stdout=sys.stderr).returncode:
            missing["raw"] = "go build ./bench/rawnats failed"
    return missing


def baseline_dir(rev: str) -> Path:
    return BASELINES / rev[:12]


def build_baseline(rev: str) -> str:
    """Builds this layer at revision rev (a full commit id) in a worktree; '' or why not."""
    tree = baseline_dir(rev)
    if not (tree / "python" / "channels_nats").is_dir():
        say(f"git worktree add build/baseline/{rev[:12]}")
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, stdout=sys.stderr)
        shutil.rmtree(tree, ignore_errors=True)
        if subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev], cwd=REPO, stdout=sys.stderr
        ).returncode:
            return f"git worktree add of {rev} failed"
    say(f"make lib in build/baseline/{rev[:12]}")
    if subprocess.run(["make", "--no-print-directory", "lib"], cwd=tree, stdout=sys.stderr).returncode:
        return f"make lib failed at {rev}"
    builder = tree / "python" / "cffi_build.py"
    if builder.is_file():  # a revision with a compiled cffi module: built as `make accelerator` does
        library = tree / "build" / "linux-amd64" / "libchannels_nats.so"
        if subprocess.run([str(VENV_PY), str(builder), str(library)], stdout=sys.stderr).returncode:
            return f"building the compiled cffi module failed at {rev}"
    return ""


def install_baseline(rev: str) -> None:
    """Copies the baseline's package, library and header into the root (like bench/layers-env.sh)."""
    tree, target = baseline_dir(rev), ROOT / BASELINE_SRC.lstrip("/")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(tree / "python" / "channels_nats", target / "channels_nats")
    shutil.copy2(tree / "build" / "linux-amd64" / "libchannels_nats.so", target)
    shutil.copy2(tree / "include" / "channels_nats.h", target)
    compiled = tree / "build" / "linux-amd64" / "_cffi.abi3.so"
    if compiled.is_file():
        shutil.copy2(compiled, target)


CLUSTER_NODES = 3
"""Nodes of the routed cluster of the cluster scenario."""


class Servers:
    """nats-server (with monitoring) and redis-server on free loopback ports; with want_cluster
    also a routed cluster of CLUSTER_NODES nats-servers."""

    def __init__(self, want_redis: bool, want_cluster: bool = False) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cluster_urls: list[str] = []
        port, mport = free_port(), free_port()
        self.nats_url = f"nats://127.0.0.1:{port}"
        self.monitor = f"http://127.0.0.1:{mport}"
        say(f"nats-server on {self.nats_url}, monitoring {self.monitor}")
        self.procs.append(
            subprocess.Popen(
                [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(port), "-m", str(mport)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        self.redis_url = ""
        if want_redis and shutil.which("redis-server"):
            rport = free_port()
            self.redis_url = f"redis://127.0.0.1:{rport}"
            say(f"redis-server on {self.redis_url}")
            self.procs.append(
                subprocess.Popen(
                    ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if want_cluster:
            self._start_cluster()
        for url in (self.nats_url, self.redis_url, *self.cluster_urls):
            if url:
                self._wait(url)
        if self.cluster_urls:
            self._wait_routes()

    def _start_cluster(self) -> None:
        ports = [(free_port(), free_port(), free_port()) for _ in range(CLUSTER_NODES)]
        routes = ",".join(f"nats://127.0.0.1:{route}" for _, route, _ in ports)
        self.cluster_monitors = [f"http://127.0.0.1:{monitor}" for _, _, monitor in ports]
        for index, (client, route, monitor) in enumerate(ports):
            self.cluster_urls.append(f"nats://127.0.0.1:{client}")
            self.procs.append(
                subprocess.Popen(
                    [
                        str(NATS_SERVER),
                        "-a",
                        "127.0.0.1",
                        "-p",
                        str(client),
                        "-m",
                        str(monitor),
                        "-n",
                        f"bench-{index}",
                        "--cluster_name",
                        "bench",
                        "--cluster",
                        f"nats://127.0.0.1:{route}",
                        "--routes",
                        routes,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        say(f"a {CLUSTER_NODES}-node cluster on {', '.join(self.cluster_urls)}")

    def _wait_routes(self) -> None:
        """Until every node has a route to every other (the cluster scenario spans them)."""
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                counts = [
                    json.loads(urllib.request.urlopen(f"{m}/routez", timeout=2).read())["num_routes"]
                    for m in self.cluster_monitors
                ]
            except (OSError, ValueError, KeyError):
                counts = []
            if counts and min(counts) >= CLUSTER_NODES - 1:
                return
            time.sleep(0.2)
        raise SystemExit(f"bench: the {CLUSTER_NODES}-node cluster formed no full mesh of routes in 20 s")

    @staticmethod
    def _wait(url: str) -> None:
        host, _, port = url.split("://", 1)[1].rpartition(":")
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"bench: {url} did not come up")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class ProcMount:
    """/proc bind-mounted into the reference root while its runs go (unmounted only if we mounted it)."""

    def __init__(self) -> None:
        self.mounted = False

    def ensure(self) -> None:
        # Whether it is mounted, not whether we mounted it: a memory run takes down the mount it
        # found. A run without /proc would make every call of this layer from a main thread
        # slower (scenarios.py refuses to run then).
        target = ROOT / "proc"
        if subprocess.run(["mountpoint", "-q", str(target)]).returncode == 0:
            return
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", "/proc", str(target)], check=True)
        self.mounted = True

    def release(self) -> None:
        # memory.py takes a mount it finds with nobody inside the root for a leftover, and
        # replaces it with its own: ours may be gone already.
        if self.mounted and subprocess.run(["mountpoint", "-q", str(ROOT / "proc")]).returncode == 0:
            subprocess.run(["umount", str(ROOT / "proc")])
        self.mounted = False


# --- the runs ---------------------------------------------------------------------------------


def jobs(args: argparse.Namespace, layers: list[str]) -> list[tuple[str, dict[str, Any], str]]:
    """(scenario, scenario args, layer) for every run, without repeats."""
    out: list[tuple[str, dict[str, Any], str]] = []
    for scenario in args.scenarios:
        for params in scenario_params(args, scenario):
            for layer in layers:
                if layer in SCENARIO_LAYERS[scenario]:
                    out.append((scenario, params, layer))
    return out


def scenario_params(args: argparse.Namespace, scenario: str) -> list[dict[str, Any]]:
    if scenario == "fanout":
        return [
            {"members": n, "processes": p, "messages": args.messages, "gap": 0.01}
            for n in args.sizes
            for p in args.procs
        ]
    if scenario == "saturation":
        return [
            {"members": n, "processes": p, "messages": args.saturation_messages, "bound": 60}
            for n in args.sizes
            for p in args.procs
        ]
    if scenario == "cluster":  # compare with saturation N=10000 P=2 on the single server
        return [
            {
                "members": 10000,
                "processes": 2,
                "messages": args.saturation_messages,
                "bound": 60,
                "servers": CLUSTER_NODES,
            }
        ]
    if scenario == "pingpong":
        return [{"rounds": args.rounds}]
    if scenario == "throughput":
        return [{"size": 100, "count": args.count}, {"size": 65536, "count": args.count}]
    if scenario == "connections":
        return [{"calls": 20}]
    if scenario == "wake":
        return [{"members": 2000, "messages": 30}]
    return [{"connections": args.consumers, "procs": 2}]  # memory


def command(scenario: str, params: dict[str, Any], layer: str, servers: Servers) -> list[str]:
    url = servers.redis_url if layer.startswith("redis") else servers.nats_url
    flags = [f"--{k}={v}" for k, v in params.items() if k != "servers"]
    if scenario == "cluster":  # saturation, the processes spread over the cluster's nodes
        scenario, url = "saturation", servers.cluster_urls[0]
        flags.append(f"--urls={','.join(servers.cluster_urls)}")
    if scenario == "connections" and layer in ("nats", "baseline", "reference"):
        flags.append(f"--monitor={servers.monitor}")
    if layer == "raw":
        names = {"processes": "procs", "rounds": "roundtrips", "bound": "timeout"}
        units = {"gap": "s", "bound": "s"}
        raw_flags = [f"-{names.get(k, k)}={v}{units.get(k, '')}" for k, v in params.items()]
        return [str(RAW), "-scenario", scenario, "-nats", url, *raw_flags]
    if scenario == "memory":
        where = "--redis" if layer.startswith("redis") else "--nats"
        in_root_flag = ["--in-root"] if Where.in_root else []
        return [str(VENV_PY), str(MEMORY), "--layer", layer, where, url, *in_root_flag, *flags]
    args = ["/opt/bench/scenarios.py", scenario, "--layer", "nats" if layer == "baseline" else layer, "--url", url]
    args += flags
    if layer == "reference":
        return in_root(["/opt/ref/bin/python", *args])
    if Where.in_root:
        return in_root([LAYERS_PY, *args], BASELINE_ENV if layer == "baseline" else LAYERS_ENV)
    if layer == "baseline":
        tree = baseline_dir(Baseline.rev)
        lib = tree / "build" / "linux-amd64" / "libchannels_nats.so"
        env = [f"PYTHONPATH={tree / 'python'}", f"CHANNELS_NATS_LIBRARY={lib}"]
        return ["env", *env, str(VENV_PY), str(BENCH / "scenarios.py"), *args[1:]]
    return [str(VENV_PY), str(BENCH / "scenarios.py"), *args[1:]]


def run_one(cmd: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "CHANNELS_NATS_LIBRARY": str(LIB)}
    started = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s", "seconds": timeout}
    seconds = time.time() - started
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return {"error": f"exit {proc.returncode}: {tail}", "seconds": seconds}
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"last stdout line is not JSON: {lines[-1][:200]}", "seconds": seconds}
    result["seconds"] = seconds
    metrics = result.get("metrics", {})
    for key in list(metrics):  # bench/rawnats names its latencies latency_p50_ms and so on
        if key.startswith("latency_") and key[len("latency_") :] not in metrics:
            metrics[key[len("latency_") :]] = metrics[key]
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """median, min, max of every numeric metric over the successful runs."""
    ok = [r["metrics"] for r in runs if "metrics" in r]
    out: dict[str, dict[str, float]] = {}
    for key in ok[0] if ok else {}:
        values = [m[key] for m in ok if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        else:
            out[key] = {"all": all(m.get(key) for m in ok)}  # booleans: true only if every run was
    return out


# --- what was measured --------------------------------------------------------------------------


def measured(missing: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "CHANNELS_NATS_LIBRARY": str(LIB)}
    probe = (
        "import importlib.metadata as m, channels_nats, platform;"
        "print(channels_nats.__version__, m.version('channels'), m.version('channels-redis'),"
        " platform.python_version())"
    )
    ours, channels_v, redis_layer, host_py = (output([str(VENV_PY), "-c", probe], env=env).split() + ["?"] * 4)[:4]
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "revision": output(["git", "describe", "--tags", "--always", "--dirty"], cwd=REPO),
        "channels_nats": ours,
        "channels": channels_v,
        "channels_redis": redis_layer,
        "python_host": host_py,
        "nats_server": output([str(NATS_SERVER), "--version"]),
        "redis_server": output(["redis-server", "--version"]) if shutil.which("redis-server") else "absent",
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "kernel": platform.release(),
        "unavailable": missing,
    }
    if Baseline.rev:
        info["baseline"] = output(["git", "describe", "--tags", "--always", Baseline.rev], cwd=REPO)
    info["python_layers"] = (
        output(in_root([LAYERS_PY, "-c", "import platform; print(platform.python_version())"])) + " (reference root)"
        if Where.in_root
        else f"{host_py} (host venv: {Where.why_host})"
    )
    if Where.in_root:
        probe_root = "import importlib.metadata as m; print(m.version('channels'), m.version('channels-redis'))"
        info["channels"], info["channels_redis"] = (output(in_root([LAYERS_PY, "-c", probe_root])).split() + ["?"] * 2)[
            :2
        ]
    if "reference" not in missing and ROOT.is_dir():
        show = output(in_root(["/opt/ref/bin/pip", "show", "channels-nats"]))
        info["reference_channels_nats"] = next(
            (line.split(":", 1)[1].strip() for line in show.splitlines() if line.startswith("Version:")), show
        )
        info["python_root"] = output(
            in_root(["/opt/ref/bin/python", "-c", "import platform; print(platform.python_version())"])
        )
    return info


# --- report -------------------------------------------------------------------------------------


def row_label(scenario: str, params: dict[str, Any]) -> str:
    if scenario in ("fanout", "saturation"):
        return f"{scenario} N={params['members']} P={params['processes']} M={params['messages']}"
    if scenario == "cluster":
        nodes, n, p, m = params["servers"], params["members"], params["processes"], params["messages"]
        return f"saturation, {nodes}-node cluster N={n} P={p} M={m}"
    if scenario == "throughput":
        return f"throughput {params['size']} B"
    if scenario == "pingpong":
        return f"pingpong K={params['rounds']}"
    if scenario == "connections":
        return f"async_to_sync x{params['calls']}"
    if scenario == "wake":
        return f"wake cost N={params['members']} M={params['messages']}"
    return scenario


def fmt(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1000:
        return str(int(value))
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def markdown(report: dict[str, Any], layers: list[str]) -> str:
    m = report["measured"]
    against = [other for other in ("baseline", "reference", "redis") if other in layers or other != "baseline"]
    lines = [
        f"# Benchmark results {m['date']}",
        "",
        f"Revision `{m['revision']}`; {m['cpu_model']} x {m['cpu_count']};"
        f" channels-nats {m['channels_nats']} (this layer),"
        f" reference channels-nats {m.get('reference_channels_nats', 'n/a')} (Python {m.get('python_root', 'n/a')}),"
        f" channels {m['channels']}, channels_redis {m['channels_redis']},"
        f" Python {m.get('python_layers', m['python_host'])} for the other Python layers,"
        f" {m['nats_server']}, {m['redis_server'].split(' sha=')[0]}.",
        f"Repeats per cell: {report['repeats']}; cells are median (min-max). Lower is better for ms and connections,"
        " higher for /s. Ratios are ours/other on the medians.",
        *(
            [f"The layer `baseline` is this layer at revision `{m['baseline']}`, run in turn with the tree's."]
            if m.get("baseline")
            else []
        ),
        "",
        "| scenario | metric | " + " | ".join(layers) + "".join(f" | ours/{other}" for other in against) + " |",
        "|---|---|" + "---|" * (len(layers) + len(against)),
    ]
    for entry in report["results"]:
        scenario, params = entry["scenario"], entry["params"]
        for metric, _lower in HEADLINE.get(scenario, []):
            cells: list[str] = []
            medians: dict[str, float] = {}
            for layer in layers:
                run = entry["layers"].get(layer)
                if run is None:
                    cells.append("")
                    continue
                stats = run["summary"].get(metric)
                if not stats or "median" not in stats:
                    cells.append("failed" if run.get("errors") else "-")
                    continue
                medians[layer] = stats["median"]
                cell = fmt(stats["median"])
                if stats["min"] != stats["max"]:
                    cell += f" ({fmt(stats['min'])}-{fmt(stats['max'])})"
                complete = run["summary"].get("complete")
                if complete is not None and not complete.get("all", True):
                    cell += " incomplete"
                cells.append(cell)

            def ratio(other: str, medians: dict[str, float] = medians) -> str:
                if "nats" in medians and medians.get(other):
                    return f"{medians['nats'] / medians[other]:.2f}"
                return ""

            lines.append(
                f"| {row_label(scenario, params)} | {metric} | "
                + " | ".join(cells)
                + "".join(f" | {ratio(other)}" for other in against)
                + " |"
            )
    errors = [
        f"- {row_label(e['scenario'], e['params'])} / {layer}: {err}"
        for e in report["results"]
        for layer, run in e["layers"].items()
        for err in run.get("errors", [])
    ]
    unavailable = [f"- {layer}: {why}" for layer, why in m["unavailable"].items()]
    if errors or unavailable:
        lines += ["", "## Failures and unavailable layers", "", *unavailable, *errors]
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], layers: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, str, list[dict[str, Any]]]] = []
    for scenario, metric, title in (
        ("fanout", "p99_ms", "fan-out p99 latency, ms (log; lower is better)"),
        ("saturation", "deliveries_per_s", "saturation deliveries/s (log; higher is better)"),
        ("cluster", "deliveries_per_s", "saturation over a 3-node cluster, deliveries/s (higher is better)"),
        ("pingpong", "rtt_p50_ms", "ping-pong round trip p50, ms (lower is better)"),
        ("throughput", "messages_per_s", "one channel messages/s (log; higher is better)"),
        ("connections", "connections_opened", "connections opened by async_to_sync x20"),
        ("memory", "rss_per_consumer_kb", "RSS per idle consumer, KB (lower is better)"),
    ):
        entries = [e for e in report["results"] if e["scenario"] == scenario]
        if entries:
            panels.append((metric, title, entries))
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.4 * len(panels)), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, (metric, title, entries) in zip((a[0] for a in axes), panels, strict=True):
        present = [
            layer for layer in layers if any(metric in e["layers"].get(layer, {}).get("summary", {}) for e in entries)
        ]
        width = 0.8 / max(1, len(present))
        for li, layer in enumerate(present):
            xs, ys, lo, hi = [], [], [], []
            for xi, entry in enumerate(entries):
                stats = entry["layers"].get(layer, {}).get("summary", {}).get(metric)
                if stats and "median" in stats:
                    xs.append(xi + (li - (len(present) - 1) / 2) * width)
                    ys.append(stats["median"])
                    lo.append(stats["median"] - stats["min"])
                    hi.append(stats["max"] - stats["median"])
            if xs:
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=layer, color=colors(layers.index(layer)))
        ax.set_xticks(range(len(entries)))
        ax.set_xticklabels([row_label(e["scenario"], e["params"]) for e in entries], fontsize=8)
        ax.set_title(title, fontsize=10)
        if "log" in title:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=max(1, len(present)))
    fig.suptitle(
        f"channels-nats benchmarks {report['measured']['date']} ({report['measured']['revision']})", fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- main ---------------------------------------------------------------------------------------

# Rough seconds per run, for the ETA (measured on the 2-core development machine).
ESTIMATE = {
    "fanout": 6.0,
    "saturation": 6.0,
    "cluster": 6.0,
    "pingpong": 9.0,
    "throughput": 2.0,
    "connections": 2.0,
    "memory": 20.0,
    "wake": 8.0,
}


STANDARD_SET_OPTIONS = (
    "scenarios",
    "layers",
    "sizes",
    "procs",
    "messages",
    "saturation_messages",
    "rounds",
    "count",
    "consumers",
)
"""The options that choose the cells. latest.md and latest.png stand for the standard set: a run
with any of these changed (fewer scenarios, layers or sizes, other counts) writes its table and
chart beside its JSON instead."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="fanout,saturation,cluster,pingpong,throughput,connections,memory,wake")
    parser.add_argument("--layers", default=",".join(DEFAULT_LAYERS), help="(baseline comes with --baseline)")
    parser.add_argument(
        "--baseline",
        default="",
        metavar="REV",
        help="also run this layer as built from git revision REV (layer 'baseline'), turn about with the tree's",
    )
    parser.add_argument("--sizes", default="1000,10000", help="fan-out members (N)")
    parser.add_argument("--procs", default="2,4", help="fan-out worker processes (P)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50, help="fan-out group_sends (M)")
    parser.add_argument(
        "--saturation-messages",
        type=int,
        default=60,
        help="saturation group_sends (60: with 20, 10,000 members were served in about 0.4 s, too short a window)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=10000,
        help="ping-pong round trips (K; 10,000: the p99 of 2,000 is their 20th slowest, and moved with the machine)",
    )
    parser.add_argument("--count", type=int, default=2000, help="throughput messages, for each body size")
    parser.add_argument("--consumers", type=int, default=2000, help="memory: idle WebSocket consumers")
    parser.add_argument("--memory-repeats", type=int, default=1, help="repeats of the (slow) memory scenario")
    parser.add_argument(
        "--wake-repeats",
        type=int,
        default=5,
        help="repeats of the wake scenario (5: a spell of the machine's slowness moves one run of it by half)",
    )
    parser.add_argument("--timeout", type=float, default=150, help="seconds per run")
    parser.add_argument("--skip-setup", action="store_true", help="do not run make/pip/apt/reference setup")
    parser.add_argument(
        "--out", default="", help="the JSON file: a name in bench/results, or a path (default: a UTC timestamp)"
    )
    args = parser.parse_args()
    args.standard = all(getattr(args, key) == parser.get_default(key) for key in STANDARD_SET_OPTIONS)
    args.out = args.out.removesuffix(".json")
    if args.out and not (out_dir := results_stem(args.out).parent).is_dir():
        parser.error(f"--out {args.out}.json: there is no directory {out_dir}")
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.procs = [int(p) for p in args.procs.split(",") if p]
    layers = [layer for layer in args.layers.split(",") if layer]
    for name, known in (("scenario", ALL_SCENARIOS), ("layer", ALL_LAYERS)):
        chosen = args.scenarios if name == "scenario" else layers
        bad = [c for c in chosen if c not in known]
        if bad:
            raise SystemExit(f"bench: unknown {name}(s) {bad}; known: {', '.join(known)}")
    if args.baseline:
        found = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{args.baseline}^{{commit}}"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if found.returncode:
            raise SystemExit(f"bench: --baseline {args.baseline} is not a commit of this repository")
        Baseline.rev = found.stdout.strip()
        if "baseline" not in layers:
            layers.insert(layers.index("nats") + 1 if "nats" in layers else 0, "baseline")
    elif "baseline" in layers:
        raise SystemExit("bench: the layer baseline needs --baseline REV")

    t0 = time.time()
    missing = {} if args.skip_setup else setup(args, set(layers))
    if "memory" in args.scenarios and not MEMORY.exists():
        missing["memory"] = "bench/memory.py does not exist"
    if "baseline" in layers and not (baseline_dir(Baseline.rev) / "build/linux-amd64/libchannels_nats.so").exists():
        missing.setdefault("baseline", f"build/baseline/{Baseline.rev[:12]} was not built")
    if "raw" in layers and not RAW.exists():
        missing.setdefault("raw", "build/bench/rawnats was not built")
    if "reference" in layers and not (ROOT / "opt/ref/bin/python").is_symlink():
        missing.setdefault("reference", "build/reference/root has no /opt/ref venv")
    want_redis = bool({"redis", "redis-pubsub"} & set(layers))
    if want_redis and not shutil.which("redis-server"):
        missing.setdefault("redis", "redis-server is not installed")
        missing.setdefault("redis-pubsub", "redis-server is not installed")

    todo = [j for j in jobs(args, layers) if j[2] not in missing and not (j[0] == "memory" and "memory" in missing)]
    skipped = [j for j in jobs(args, layers) if j not in todo]

    def repeats(scenario: str) -> int:
        return {"memory": args.memory_repeats, "wake": args.wake_repeats}.get(scenario, args.repeats)

    runs_total = sum(repeats(s) for s, _, _ in todo)
    eta = sum(ESTIMATE.get(s, 5) * (3 if p.get("members", 0) >= 10000 else 1) * repeats(s) for s, p, _ in todo)
    say(
        f"{runs_total} runs ({len(todo)} cells x {args.repeats}); first estimate {eta / 60:.1f} min;"
        f" skipped: {missing or 'none'}"
    )

    servers = Servers(want_redis and "redis" not in missing, "cluster" in args.scenarios)
    mount = ProcMount()
    if args.skip_setup:
        if (ROOT / LAYERS_PY.lstrip("/")).is_symlink() and (ROOT / LAYERS_SRC.lstrip("/") / "channels_nats").is_dir():
            Where.in_root = True  # as the last bench/layers-env.sh left it
        else:
            Where.why_host = "--skip-setup, and the root has no /opt/layers venv (bench/layers-env.sh)"
    if Where.in_root and "baseline" in layers and "baseline" not in missing:
        install_baseline(Baseline.rev)
    if ("reference" in layers and "reference" not in missing) or Where.in_root:
        (ROOT / "opt/bench").mkdir(parents=True, exist_ok=True)
        for script in ("scenarios.py", "wake_cost.py"):
            shutil.copy2(BENCH / script, ROOT / "opt/bench" / script)
        mount.ensure()
    info = measured(missing)  # before the runs: pip show in the root wants /proc
    results: list[dict[str, Any]] = []
    done = 0
    spent = 0.0
    interrupted = False
    index: dict[str, dict[str, Any]] = {}
    try:
        cells: dict[str, list[str]] = {}  # cell key -> its layers, in the order of todo
        for scenario, params, layer in todo:
            cells.setdefault(json.dumps([scenario, params], sort_keys=True), []).append(layer)
        for key, cell_layers in cells.items():
            scenario, params = json.loads(key)
            entry = index.setdefault(key, {"scenario": scenario, "params": params, "layers": {}})
            results.append(entry)
            runs: dict[str, list[dict[str, Any]]] = {layer: [] for layer in cell_layers}
            # The layers take turns, so that a slow spell of the machine does not fall on one.
            for repeat in range(repeats(scenario)):
                for layer in cell_layers:
                    if layer == "reference" or (Where.in_root and layer in PYTHON_LAYERS):
                        mount.ensure()  # again: a memory run takes down the mount it found
                    run = run_one(command(scenario, params, layer, servers), args.timeout)
                    runs[layer].append(run)
                    done += 1
                    spent += run["seconds"]
                    left = (runs_total - done) * spent / done
                    figure = (
                        ", ".join(f"{k}={fmt(v)}" for k, v in run["metrics"].items() if isinstance(v, (int, float)))[
                            :150
                        ]
                        if "metrics" in run
                        else run["error"][:200]
                    )
                    say(
                        f"[{done}/{runs_total} ETA {left / 60:.1f} min] {row_label(scenario, params)} {layer}"
                        f" #{repeat + 1}: {figure}"
                    )
                    entry["layers"][layer] = {
                        "runs": runs[layer],
                        "summary": summarize(runs[layer]),
                        "errors": [r["error"] for r in runs[layer] if "error" in r],
                    }
    except KeyboardInterrupt:  # Ctrl-C: keep what was measured so far
        interrupted = True
        say("interrupted: writing the runs finished so far")
    finally:
        servers.stop()
        mount.release()
    for scenario, params, layer in skipped:
        key = json.dumps([scenario, params], sort_keys=True)
        entry = index.setdefault(key, {"scenario": scenario, "params": params, "layers": {}})
        if entry not in results:
            results.append(entry)
        why = missing.get(layer) or missing.get(scenario, "skipped")
        entry["layers"][layer] = {"runs": [], "summary": {}, "errors": [f"unavailable: {why}"]}

    report = {
        "measured": info,
        "repeats": args.repeats,
        "interrupted": interrupted,
        "args": {k: v for k, v in vars(args).items()},
        "wall_s": time.time() - t0,
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = results_stem(args.out or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    json_path = stem.with_name(stem.name + ".json")
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    shown = [layer for layer in ALL_LAYERS if layer in layers]
    if args.standard:
        stem = RESULTS / "latest"
    table, picture = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".png")
    table.write_text(markdown(report, shown))
    chart(report, shown, picture)
    say(
        f"wrote {json_path}, {table}, {picture} in {report['wall_s'] / 60:.1f} min"
        + ("" if args.standard else " (not the standard set: latest.md and latest.png are left as they were)")
    )
    print(table.read_text())


if __name__ == "__main__":
    main()

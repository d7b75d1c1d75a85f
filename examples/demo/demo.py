#!/usr/bin/env python3
"""The channels-nats demo: one nats-server, two Django processes of examples/chat, and a self-check.

    build/venv/bin/python examples/demo/demo.py            # make demo: serve until Ctrl-C
    build/venv/bin/python examples/demo/demo.py --check    # make demo-check: proof lines, then stop
    build/venv/bin/python examples/demo/demo.py --check --server uvicorn   # the same under uvicorn

It starts build/nats-server on loopback, two processes of the chat under an ASGI server (daphne, or
uvicorn with --server uvicorn; and the Go front of examples/gofront when it is there), proves that
a message sent to a room on one process reaches the other through NATS, prints the URLs and serves
until Ctrl-C. Everything it started is stopped on the way out, whatever happened; with --check,
a Django process that does not stop cleanly within a bounded wait after SIGTERM (a traceback in
its log, an exit status its server does not give on a clean stop, SIGKILL needed) fails the check.
Logs go to build/demo/.

The Demo class is also what examples/demo/browser_check.py and examples/wireview/check.py run:
Site says which Django project it serves, Server which ASGI server runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
OUT = BUILD / "demo"
CHAT_DIR = ROOT / "examples" / "chat"
GOFRONT_DIR = ROOT / "examples" / "gofront"
HOST = "127.0.0.1"
ROOM = "demo"
START_TIMEOUT = 30.0
"""Seconds a process may take to listen and answer."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop the demo."""
LETTERS = "ABCDEFGH"
"""The names of the Django processes: django-A, django-B, ..."""
STOP_TIMEOUT = 5.0
"""Seconds a process may take to stop after SIGTERM before it is killed."""
SHUTDOWN_TROUBLE = re.compile(
    r"Traceback \(most recent call last\)|Task was destroyed but it is pending|Exception ignored in"
    r"|Fatal Python error|Unclosed|was never awaited|^ERROR|\bERROR:",
    re.MULTILINE,
)
"""What a process that stopped cleanly does not write into its log while it stops."""


class DemoError(Exception):
    """A failure explained to the user in its message."""


SAY_PREFIX = "demo"
"""The word before the progress lines; examples/wireview/check.py sets its own."""


def say(message: str) -> None:
    print(f"{SAY_PREFIX}: {message}", flush=True)


@dataclass(frozen=True)
class Site:
    """A Django project the demo serves on its processes.

    path_entries go first on PYTHONPATH (the project's directory first: the ASGI servers import
    `asgi` from there). source_layer: the processes import channels_nats from python/ of this
    repository with the library `make lib` built (CHANNELS_NATS_LIBRARY); False: from the
    interpreter's site-packages, with the library inside the installed package.
    name_variable is the environment variable that tells each process its name (django-A, ...).
    """

    name: str
    directory: Path
    settings: str
    asgi: str
    ready_path: str
    ready_text: str
    path_entries: tuple[Path, ...] = ()
    source_layer: bool = True
    name_variable: str = "CHAT_SENDER"


CHAT = Site(
    name="chat",
    directory=CHAT_DIR,
    settings="chatsite.settings",
    asgi="chatsite.asgi:application",
    ready_path=f"/chat/{ROOM}/",
    ready_text='id="chat-log"',
    path_entries=(CHAT_DIR, ROOT / "python"),
)


@dataclass(frozen=True)
class Server:
    """An ASGI server: how to start it, how to read its port, what a clean stop looks like.

    clean_exits: the exit statuses it gives when it stopped on SIGTERM as it should (uvicorn
    re-raises the signal once it has shut down, so its status is -SIGTERM). finished: the line it
    writes when its shutdown is complete; None when it writes none. close_code: the code it closes
    open WebSockets with when it stops; the self-check then stops it with a socket open on each
    process, so its shutdown runs the consumers' disconnect (group_discard through the layer).
    None: the self-check closes its sockets first (daphne 4.2.3 under build/venv's CPython 3.11.7
    dies with SIGSEGV in the garbage collection at interpreter exit when a WebSocket is still open
    at SIGTERM, with the in-memory layer as well; under 3.13 it stops cleanly, as
    examples/wireview/check.py shows).
    """

    name: str
    module: str
    listening: str
    clean_exits: tuple[int, ...]
    finished: str | None
    close_code: int | None

    def command(self, python: str, port: int, asgi: str) -> list[str]:
        if self.name == "uvicorn":
            # No lifespan: Channels' ProtocolTypeRouter has no lifespan handler. The graceful
            # shutdown (closing the WebSockets with 1012, waiting for the tasks) is bounded
            # below STOP_TIMEOUT, so a stuck connection cannot make it wait for the SIGKILL.
            return [
                python, "-m", "uvicorn", "--host", HOST, "--port", str(port), "--lifespan", "off",
                "--timeout-graceful-shutdown", "3", asgi,
            ]  # fmt: skip
        return [python, "-m", "daphne", "-b", HOST, "-p", str(port), asgi]


SERVERS = {
    "daphne": Server("daphne", "daphne", r"Listening on TCP address [\d.]+:(\d+)", (0,), None, None),
    "uvicorn": Server(
        "uvicorn",
        "uvicorn",
        r"Uvicorn running on http://[\d.]+:(\d+)",
        (0, -signal.SIGTERM),
        "Finished server process",
        1012,
    ),
}
"""The ASGI servers the Django processes can run under (--server)."""


def library_path() -> Path:
    """CHANNELS_NATS_LIBRARY, or the library `make lib` builds for this machine."""
    if env := os.environ.get("CHANNELS_NATS_LIBRARY"):
        return Path(env)
    system = platform.system().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    ext = {"darwin": "dylib", "windows": "dll"}.get(system, "so")
    return BUILD / f"{system}-{arch}" / f"libchannels_nats.{ext}"


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET without any proxy from the environment; returns (status, body)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, ""


def _die_with_parent() -> None:
    """Runs in the child before exec (Linux): SIGTERM it if the demo dies without cleaning up."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Service:
    """A process the demo started, in its own process group, with its output in a log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    killed: bool = False
    """It ignored SIGTERM for STOP_TIMEOUT and was killed."""
    stop_seconds: float = 0.0
    log_offset: int = 0
    """Where its log stood when it was sent SIGTERM: what follows is its shutdown."""

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace").rstrip().splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(f"    | {line}" for line in text) or "    | (empty log)"

    def failure(self, what: str) -> DemoError:
        state = "still running" if self.alive() else f"exited with status {self.proc.returncode}"
        return DemoError(f"{self.name} {what} ({state}); the end of {self.log}:\n{self.log_tail()}")


class Demo:
    """Starts nats-server, Django processes of a site (two by default) and optionally the Go front.

    Ports given as 0 are chosen free; gofront_port None leaves the Go front out. A Go front that
    cannot start is a warning, or an error with require_gofront. server names one of SERVERS.
    modules are the Python packages the processes (and the caller) import, besides the server's:
    a missing one is explained with install_hint. Logs go to out. Use as a context manager:
    leaving it stops every process.
    """

    def __init__(
        self,
        nats_port: int = 0,
        ports: Sequence[int] = (0, 0),
        gofront_port: int | None = 0,
        require_gofront: bool = False,
        server: str = "daphne",
        site: Site = CHAT,
        modules: Sequence[str] = ("channels", "django", "websockets"),
        install_hint: str = "`make venv`, or pip install -r python/requirements-dev.txt",
        out: Path = OUT,
    ) -> None:
        if server not in SERVERS:
            raise DemoError(f"unknown server {server!r}: {', '.join(SERVERS)}")
        self.nats_port = nats_port
        self.ports = list(ports)
        self.gofront_port = gofront_port
        self.require_gofront = require_gofront
        self.server = SERVERS[server]
        self.site = site
        self.modules = [*modules, self.server.module]
        self.install_hint = install_hint
        self.out = out
        self.services: list[Service] = []
        self.djangos: list[Service] = []
        self.gofront: Service | None = None
        self.nats_url = ""
        self.stopped: list[Service] = []
        """The Django processes stop() stopped, for shutdown_problems()."""

    def __enter__(self) -> Demo:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- start ------------------------------------------------------------------------------

    def start(self) -> None:
        self.check_tools()
        self.check_ports()
        self.out.mkdir(parents=True, exist_ok=True)
        say(f"starting nats-server on {HOST} ({self.port_text(self.nats_port)})")
        nats = self.spawn("nats-server", [str(BUILD / "nats-server"), "-a", HOST, "-p", str(self.nats_port or -1)])
        self.wait_port(nats, self.nats_port, r"Listening for client connections on [\d.]+:(\d+)")
        self.nats_url = f"nats://{HOST}:{nats.port}"
        say(f"nats-server is up at {self.nats_url}")

        for letter, port in zip(LETTERS, self.ports, strict=False):
            self.start_django(letter, port)
        for django, port in zip(self.djangos, self.ports, strict=True):
            self.wait_django(django, port)
        if self.gofront_port is not None:
            self.start_gofront(self.gofront_port)

    def django_env(self, letter: str) -> dict[str, str | None]:
        """The environment of Django process <letter> (None: removed from the inherited one)."""
        site = self.site
        entries = [str(p) for p in (site.path_entries or (site.directory,))]
        return {
            "DJANGO_SETTINGS_MODULE": site.settings,
            "PYTHONPATH": os.pathsep.join(entries),
            "CHANNELS_NATS_LIBRARY": str(library_path()) if site.source_layer else None,
            "NATS_URL": self.nats_url,
            "PYTHONUNBUFFERED": "1",
            site.name_variable: f"django-{letter}",
        }

    def start_django(self, letter: str, port: int = 0) -> Service:
        """Starts Django process <letter> of the site; wait_django() waits until it answers."""
        say(f"starting Django process {letter} ({self.server.name}, {self.port_text(port)})")
        command = self.server.command(sys.executable, port, self.site.asgi)
        django = self.spawn(f"django-{letter}", command, self.django_env(letter), self.site.directory)
        self.djangos.append(django)
        return django

    def wait_django(self, django: Service, port: int = 0) -> None:
        self.wait_port(django, port, self.server.listening)
        self.wait_http(django, f"{django.url}{self.site.ready_path}", self.site.ready_text)
        say(f"{django.name} answers at {django.url} ({self.server.name})")

    def check_tools(self) -> None:
        missing: list[str] = []
        if not os.access(BUILD / "nats-server", os.X_OK):
            missing.append(f"{BUILD / 'nats-server'} (build it with `make server`)")
        if self.site.source_layer and not library_path().is_file():
            missing.append(f"the native library {library_path()} (build it with `make lib`)")
        for module in self.modules:
            try:
                __import__(module)
            except ImportError:
                missing.append(f"the Python package {module} in {sys.executable} ({self.install_hint})")
        if missing:
            raise DemoError("missing:\n  " + "\n  ".join(missing))
        if self.gofront_port is not None and not GOFRONT_DIR.is_dir():
            self.gofront_left_out(f"there is no {GOFRONT_DIR}")
        if self.gofront_port is not None and not shutil.which("go"):
            self.gofront_left_out("`go` is not on PATH")

    def check_ports(self) -> None:
        djangos = [(f"django-{c}", p) for c, p in zip(LETTERS, self.ports, strict=False)]
        wanted = [("nats-server", self.nats_port), *djangos]
        fixed = [port for _, port in wanted if port]
        if len(set(fixed)) != len(fixed):
            raise DemoError(f"the same port is given twice: {fixed}")
        for name, port in wanted:
            if port and not port_free(port):
                raise DemoError(
                    f"port {port} on {HOST} (for {name}) is busy: another program listens there.\n"
                    "  Stop it, or pick other ports, e.g.\n"
                    '    make demo DEMO_ARGS="--nats-port 4322 --ports 8101,8102 --gofront-port 8103"\n'
                    "    build/venv/bin/python examples/demo/demo.py --nats-port 4322 --ports 8101,8102"
                )
        if self.gofront_port and (self.gofront_port in fixed or not port_free(self.gofront_port)):
            self.gofront_left_out(f"port {self.gofront_port} is busy (pick another with --gofront-port)")

    @staticmethod
    def port_text(port: int) -> str:
        return f"port {port}" if port else "a free port"

    def spawn(
        self, name: str, command: list[str], env: dict[str, str | None] | None = None, cwd: Path = ROOT
    ) -> Service:
        log = self.out / f"{name}.log"
        environment = {**os.environ}
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: Ctrl-C goes to the demo, which stops it
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        service = Service(name, proc, log)
        self.services.append(service)
        return service

    def wait_until(
        self, service: Service, what: str, ready: Callable[[], bool], timeout: float = START_TIMEOUT
    ) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not service.alive():
                raise service.failure(f"did not come up: {what}")
            if time.monotonic() > deadline:
                raise service.failure(f"did not come up within {timeout:.0f} s: {what}")
            time.sleep(0.05)

    def wait_port(self, service: Service, port: int, pattern: str) -> None:
        """Port 0: reads the port the process chose from its log; else waits until the port is bound."""

        def ready() -> bool:
            if port:
                service.port = port
                return not port_free(port)
            found = re.search(pattern, service.log.read_text(errors="replace"))
            if found:
                service.port = int(found.group(1))
            return found is not None

        self.wait_until(service, "listening", ready)

    def wait_http(self, service: Service, url: str, expect: str = 'id="chat-log"') -> None:
        def ready() -> bool:
            try:
                status, body = http_get(url)
            except OSError:
                return False
            return status == 200 and expect in body

        self.wait_until(service, f"GET {url}", ready)

    def start_gofront(self, port: int) -> None:
        """Builds and starts examples/gofront; a failure is a warning: the demo goes on without it."""
        binary = self.out / "gofront"
        say("building the Go front (go build ./examples/gofront)")
        build = subprocess.run(
            ["go", "build", "-o", str(binary), "./examples/gofront"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if build.returncode != 0:
            self.gofront_left_out(f"it does not build:\n{build.stderr.strip()}")
            return
        port = port or free_port()
        say(f"starting the Go front on port {port}")
        front = self.spawn("gofront", [str(binary), "-listen", f"{HOST}:{port}", "-nats", self.nats_url])
        front.port = port
        try:
            self.wait_until(front, "listening", lambda: not port_free(port), timeout=15)
            self.wait_http(front, f"{front.url}/chat/{ROOM}/", expect="chat-log")
        except DemoError as err:
            self.stop_service(front)
            self.gofront_left_out(str(err))
            return
        self.gofront = front
        say(f"the Go front answers at {front.url}")

    def gofront_left_out(self, why: str) -> None:
        if self.require_gofront:
            raise DemoError(f"the Go front is required (--require-gofront) but {why}")
        say(f"WARNING: the Go front is left out: {why}")
        self.gofront_port = None

    # ---- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stops every process this demo started (newest first): SIGTERM to its group, SIGKILL after
        STOP_TIMEOUT. shutdown_problems() then tells whether the Django processes stopped cleanly."""
        names = [service.name for service in self.services]
        # A second Ctrl-C (or a SIGTERM) while stopping must not leave orphans.
        previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
        try:
            for service in reversed(self.services):
                self.stop_service(service)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if names:
            say(f"stopped {', '.join(names)}")

    def stop_service(self, service: Service) -> None:
        if service not in self.services:
            return
        self.services.remove(service)
        if service in self.djangos:
            self.stopped.append(service)
        proc = service.proc
        # A process not reaped yet (running or a zombie) still owns its group id: safe to signal.
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                service.log_offset = service.log.stat().st_size
            started = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                say(f"{service.name} ignored SIGTERM for {STOP_TIMEOUT:.0f} s: SIGKILL")
                service.killed = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            service.stop_seconds = time.monotonic() - started

    def shutdown_problems(self) -> list[str]:
        """What went wrong when stop() stopped the Django processes: one line each, [] if all was clean.

        Clean: gone within STOP_TIMEOUT of SIGTERM with an exit status the server gives on a clean
        stop, its "finished" line written (uvicorn), and nothing in the log since SIGTERM that a
        clean stop does not write (a traceback, a pending task destroyed, an ERROR line)."""
        problems: list[str] = []
        for service in self.stopped:
            where = f"{service.name} ({self.server.name})"
            try:
                tail = service.log.read_bytes()[service.log_offset :].decode(errors="replace")
            except OSError:
                tail = ""
            if service.killed:
                problems.append(f"{where} did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM and was killed")
            elif service.proc.returncode not in self.server.clean_exits:
                problems.append(f"{where} exited with status {service.proc.returncode} after SIGTERM")
            if self.server.finished and self.server.finished not in tail and not service.killed:
                problems.append(f"{where} never wrote {self.server.finished!r}: its shutdown did not finish")
            if found := SHUTDOWN_TROUBLE.search(tail):
                lines = "\n".join(f"    | {line}" for line in tail.rstrip().splitlines()[-30:])
                problems.append(f"{where} wrote {found.group(0)!r} while stopping; the end of {service.log}:\n{lines}")
        return problems

    def shutdown_report(self) -> str:
        """One line on how the Django processes stopped."""
        times = ", ".join(f"{s.name} {s.stop_seconds:.2f} s (status {s.proc.returncode})" for s in self.stopped)
        return f"{self.server.name} stopped cleanly after SIGTERM: {times}"

    def fronts(self) -> list[Service]:
        return self.djangos + ([self.gofront] if self.gofront else [])

    def check_alive(self) -> None:
        for service in self.services:
            if not service.alive():
                raise service.failure("stopped unexpectedly")


# ---- the self-check -------------------------------------------------------------------------


def ws_url(service: Service, room: str = ROOM) -> str:
    return f"ws://{HOST}:{service.port}/ws/chat/{room}/"


async def prove(demo: Demo, timeout: float = 10.0) -> list[str]:
    """Sends a message with a nonce to the room on one front and waits for it on another, for every
    pair to check; returns the proof lines. Raises DemoError when a message does not arrive."""
    from websockets.asyncio.client import connect  # imported here: check_tools explains when it is missing
    from websockets.typing import Origin

    a, b = demo.djangos
    pairs = [(a, b), (b, a)]
    if demo.gofront:
        pairs += [(demo.gofront, a), (a, demo.gofront)]
    sockets: dict[str, ClientConnection] = {}
    async with contextlib.AsyncExitStack() as stack:
        for front in demo.fronts():
            try:
                sockets[front.name] = await stack.enter_async_context(
                    connect(ws_url(front), origin=Origin(front.url), proxy=None, open_timeout=timeout)
                )
            except Exception as err:
                raise DemoError(f"cannot open a WebSocket to {ws_url(front)}: {err!r}") from err
        lines: list[str] = []
        for source, target in pairs:
            text = f"hello from {source.name} {secrets.token_hex(6)}"
            started = time.perf_counter()
            await sockets[source.name].send(json.dumps({"text": text}))
            sender = await receive_text(sockets[target.name], text, started + timeout)
            if sender is None:
                raise DemoError(
                    f"a message sent on {source.url} did not appear on {target.url} within {timeout:.0f} s "
                    f"(logs in {demo.out})"
                )
            ms = (time.perf_counter() - started) * 1000
            lines.append(
                f"proof: a message typed on {source.url} appeared on {target.url} after {ms:.1f} ms "
                f"(sender {sender}, through NATS at {demo.nats_url})"
            )
        return lines


def stop_with_sockets_open(demo: Demo, timeout: float = 10.0) -> str:
    """Stops the demo with a WebSocket open in a room on each Django process, and checks that each
    was closed by its server with the server's close_code. Returns the proof line; raises DemoError."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect  # its own thread answers the closing handshake
    from websockets.typing import Origin

    code = demo.server.close_code
    with contextlib.ExitStack() as stack:
        sockets = []
        for django in demo.djangos:
            ws = connect(ws_url(django), origin=Origin(django.url), proxy=None, open_timeout=timeout)
            sockets.append((django, stack.enter_context(ws)))
        demo.stop()
        for django, ws in sockets:
            try:
                ws.recv(timeout)
            except ConnectionClosed:
                pass
            except TimeoutError:
                raise DemoError(f"the WebSocket to {django.name} was still open after it stopped") from None
            if ws.close_code != code:
                raise DemoError(
                    f"{django.name} ({demo.server.name}) closed its WebSocket with {ws.close_code}, not {code}, "
                    "when it stopped"
                )
    return f"{demo.server.name} closed the open WebSocket of each process with {code} while stopping"


async def receive_text(ws: ClientConnection, text: str, deadline: float) -> str | None:
    """Waits for {"text": text} on the socket; returns its sender, or None at the deadline."""
    while (left := deadline - time.perf_counter()) > 0:
        try:
            frame = await asyncio.wait_for(ws.recv(), left)
        except asyncio.TimeoutError:
            return None
        data = json.loads(frame)
        if isinstance(data, dict) and data.get("text") == text:
            return str(data.get("sender", "?"))
    return None


# ---- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="prove the message paths, stop everything, exit 0/1")
    parser.add_argument("--nats-port", type=int, help="nats-server port (default 4222; --check: a free port)")
    parser.add_argument("--ports", help="the two Django ports, A,B (default 8001,8002; --check: free ports)")
    parser.add_argument("--gofront-port", type=int, help="the Go front's port (default 8003; --check: a free port)")
    parser.add_argument("--no-gofront", action="store_true", help="leave the Go front out")
    parser.add_argument("--require-gofront", action="store_true", help="fail when the Go front cannot start")
    parser.add_argument(
        "--server", choices=sorted(SERVERS), default="daphne", help="the ASGI server of the Django processes"
    )
    args = parser.parse_args(argv)
    if args.ports is None:
        args.ports = "0,0" if args.check else "8001,8002"
    try:
        args.ports = [int(p) for p in args.ports.split(",")]
    except ValueError:
        parser.error(f"--ports takes two port numbers, like 8001,8002, not {args.ports!r}")
    if len(args.ports) != 2:
        parser.error(f"--ports takes two port numbers, like 8001,8002, not {args.ports!r}")
    if args.nats_port is None:
        args.nats_port = 0 if args.check else 4222
    if args.gofront_port is None:
        args.gofront_port = 0 if args.check else 8003
    if args.no_gofront:
        if args.require_gofront:
            parser.error("--no-gofront and --require-gofront exclude each other")
        args.gofront_port = None
    for port in [args.nats_port, *args.ports, args.gofront_port or 0]:
        if not 0 <= port <= 65535:
            parser.error(f"{port} is not a port number")
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def handle_stop_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, so the demo stops what it started.

    SIGINT too: a shell starts background jobs with SIGINT ignored, and Python then keeps it so."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    started = time.monotonic()
    demo = Demo(args.nats_port, args.ports, args.gofront_port, args.require_gofront, server=args.server)
    try:
        demo.start()
        say(f"self-check: a message into room '{ROOM}' on each process, read on the other ({args.server})")
        for line in asyncio.run(prove(demo)):
            print(line, flush=True)
        if args.check:
            if demo.server.close_code is not None:
                say(stop_with_sockets_open(demo))
            demo.stop()
            if problems := demo.shutdown_problems():
                raise DemoError("unclean shutdown:\n  " + "\n  ".join(problems))
            say(demo.shutdown_report())
            say(f"check passed in {time.monotonic() - started:.1f} s ({args.server})")
            return 0
        print()
        print("The chat is up. Open the same room on two processes side by side and type in one:")
        for front in demo.fronts():
            print(f"  {front.name:<12} {front.url}/chat/lobby/")
        print(f"  nats-server  {demo.nats_url}   (logs: {demo.out}/)")
        print("Ctrl-C stops everything.", flush=True)
        while True:
            time.sleep(0.5)
            demo.check_alive()
    except KeyboardInterrupt as stop:
        print()
        say(f"{stop.args[0] if stop.args else 'SIGINT'}: stopping")
        return 1 if args.check else 0
    except DemoError as err:
        say(f"FAILED: {err}")
        return 1
    finally:
        demo.stop()


if __name__ == "__main__":
    sys.exit(main())

"""RefPeer: the pytest side's handle on a reference-layer process (see ref_peer.py).

The reference layer (PyPI "channels-nats" 0.10.x) needs Python 3.13, which lives in the trixie
root that make-reference-env.sh builds under build/reference/root. A RefPeer copies ref_peer.py
into that root (the chroot cannot see the repository), starts

    chroot build/reference/root /opt/ref/bin/python /opt/ref_peer.py <nats_url>

and talks JSON lines to it. The chroot shares the host's network, so a nats-server on 127.0.0.1
is reachable from inside. /proc is bind-mounted into the root while any RefPeer of this process
is running (nats-py and pip want it) and unmounted when the last one closes.

    peer = RefPeer(nats_url)                       # or: with RefPeer(url) as peer / async with
    channel = peer.call("new_channel")["channel"]
    pending = peer.submit("receive", channel=channel, timeout=5)   # a concurrent.futures.Future
    peer.call("send", channel=channel, message={"type": "x", "b": b"\\x00"})
    assert pending.result()["message"]["b"] == b"\\x00"
    reply = await peer.acall("group_send", group="g", message={...})   # from async code
    peer.close()

Values of the keyword arguments and of the replies are converted with to_wire/from_wire, so
bytes stay bytes across the JSON pipe. Replies are the peer's dicts ({"ok": ..., ...}); a call
raises RefPeerError only when the peer itself fails (dies, does not answer in time).
Runs on the host Python (3.11); stdlib only.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
REFERENCE_DIR = REPO / "build" / "reference"
REFERENCE_ROOT = REFERENCE_DIR / "root"
MAKE_ENV = HERE / "make-reference-env.sh"
PEER_SCRIPT = HERE / "ref_peer.py"
PEER_IN_ROOT = "/opt/ref_peer.py"
PYTHON_IN_ROOT = "/opt/ref/bin/python"
BYTES_KEY = "__bytes__"

# What the peer process gets: nothing of the host's environment (PYTHONPATH, pyenv, PIP_*).
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


class RefPeerError(RuntimeError):
    """The peer process failed: it died, did not start, or did not answer in time."""


def to_wire(value: Any) -> Any:
    """A value as JSON can carry it: bytes become {"__bytes__": base64}."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {key: to_wire(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_wire(item) for item in value]
    return value


def from_wire(value: Any) -> Any:
    """The inverse of to_wire."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(BYTES_KEY), str):
            return base64.b64decode(value[BYTES_KEY])
        return {key: from_wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_wire(item) for item in value]
    return value


# --- /proc inside the root ------------------------------------------------------------------
# One bind mount per process that runs peers, counted here; the last close unmounts it.

_proc_lock = threading.Lock()
_proc_users: dict[Path, int] = {}
_proc_owned: dict[Path, bool] = {}


def _processes_in(root: Path) -> list[int]:
    """The pids whose root directory is `root` (someone is running inside it)."""
    target = os.path.realpath(root)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{entry}/root") == target:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def acquire_proc(root: Path = REFERENCE_ROOT) -> None:
    """Make sure root/proc is /proc while a peer runs."""
    root = Path(root)
    proc = root / "proc"
    with _proc_lock:
        if _proc_users.get(root, 0) == 0:
            owned = False
            if os.path.ismount(proc) and not _processes_in(root):
                # Left over from a run that died without unmounting (nobody is inside):
                # take it down, possibly several stacked ones, and start clean.
                for _ in range(8):
                    if not os.path.ismount(proc):
                        break
                    _umount(proc)
            if not os.path.ismount(proc):
                proc.mkdir(exist_ok=True)
                done = subprocess.run(["mount", "--bind", "/proc", str(proc)], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RefPeerError(f"mount --bind /proc {proc} failed: {done.stderr.strip()} (this needs root)")
                owned = True
            # else: another process is running peers in the root on its own mount; share it.
            _proc_owned[root] = owned
        _proc_users[root] = _proc_users.get(root, 0) + 1


def release_proc(root: Path = REFERENCE_ROOT) -> None:
    root = Path(root)
    with _proc_lock:
        users = _proc_users.get(root, 0) - 1
        if users > 0:
            _proc_users[root] = users
            return
        _proc_users.pop(root, None)
        if _proc_owned.pop(root, False) and os.path.ismount(root / "proc"):
            _umount(root / "proc")


def reference_ready(root: Path = REFERENCE_ROOT) -> bool:
    """True if make-reference-env.sh has finished (its marker is there)."""
    return (Path(root).parent / "ready").is_file() and (Path(root) / "opt/ref/pyvenv.cfg").is_file()


# --- the peer ---------------------------------------------------------------------------------


class RefPeer:
    """One reference-layer process (one NatsChannelLayer on one event loop) in the root."""

    def __init__(self, url: str, *, root: Path | str = REFERENCE_ROOT, start_timeout: float = 30.0) -> None:
        self.url = url
        self.root = Path(root)
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stderr: deque[str] = deque(maxlen=200)
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._dead: str | None = None
        self._proc_held = False
        self._start(start_timeout)

    # lifecycle

    def _start(self, start_timeout: float) -> None:
        if not reference_ready(self.root):
            raise RefPeerError(f"no reference environment in {self.root}: run {MAKE_ENV} first")
        # Copy the peer script in (atomically: peers may start side by side).
        target = self.root / PEER_IN_ROOT.lstrip("/")
        staging = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
        shutil.copyfile(PEER_SCRIPT, staging)
        os.replace(staging, target)
        acquire_proc(self.root)
        self._proc_held = True
        try:
            self.proc = subprocess.Popen(
                ["chroot", str(self.root), PYTHON_IN_ROOT, "-u", PEER_IN_ROOT, self.url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=ROOT_ENV,
                cwd="/",
            )
            threading.Thread(target=self._read_stdout, name="refpeer-stdout", daemon=True).start()
            threading.Thread(target=self._read_stderr, name="refpeer-stderr", daemon=True).start()
            try:
                self.info = self._ready.result(timeout=start_timeout)
            except concurrent.futures.TimeoutError:
                raise RefPeerError(
                    f"the reference peer did not start within {start_timeout}s{self._stderr_tail()}"
                ) from None
        except BaseException:
            self.close(timeout=2)
            raise

    def close(self, timeout: float = 15.0) -> None:
        """Close the layer (op "close"), end the process, unmount /proc if this was the last."""
        proc = self.proc
        try:
            if proc is not None and proc.poll() is None:
                try:
                    self.call("close", call_timeout=timeout)
                except (RefPeerError, OSError):
                    pass
                try:
                    if proc.stdin:
                        proc.stdin.close()
                except OSError:
                    pass
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()  # this peer's own pid, nothing else
                    proc.wait(timeout=5)
        finally:
            if self._proc_held:
                self._proc_held = False
                release_proc(self.root)

    def __enter__(self) -> RefPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RefPeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # calls

    def submit(self, op: str, **kw: Any) -> concurrent.futures.Future:
        """Send one command; the Future resolves to its reply (bytes decoded)."""
        ident = next(self._ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        line = (json.dumps({"op": op, "id": ident, **to_wire(kw)}) + "\n").encode()
        with self._lock:
            if self._dead is not None:
                raise RefPeerError(self._dead)
            self._pending[ident] = future
        try:
            stdin = self.proc.stdin if self.proc is not None else None
            if stdin is None:
                raise OSError("the peer process is not running")
            with self._write_lock:
                stdin.write(line)
                stdin.flush()
        except (OSError, ValueError) as error:
            with self._lock:
                self._pending.pop(ident, None)
            raise RefPeerError(f"cannot write to the reference peer: {error}{self._stderr_tail()}") from error
        return future

    @staticmethod
    def _default_timeout(kw: dict[str, Any]) -> float:
        waits = kw.get("timeout")
        return 15.0 + (float(waits) if isinstance(waits, (int, float)) else 0.0)

    def call(self, op: str, *, call_timeout: float | None = None, **kw: Any) -> dict[str, Any]:
        """Send a command and wait (blocking) for its reply.

        `call_timeout` bounds the wait for the reply (default: 15 s plus the command's own
        "timeout", if it has one); past it RefPeerError. Do not call this from a coroutine
        that the reply depends on; use acall there.
        """
        limit = self._default_timeout(kw) if call_timeout is None else call_timeout
        future = self.submit(op, **kw)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise RefPeerError(f"no reply to {op} {kw!r} within {limit}s{self._stderr_tail()}") from None

    async def acall(self, op: str, *, call_timeout: float | None = None, **kw: Any) -> dict[str, Any]:
        """call() for async code: the event loop keeps running while the peer works."""
        limit = self._default_timeout(kw) if call_timeout is None else call_timeout
        future = self.submit(op, **kw)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except asyncio.TimeoutError:
            raise RefPeerError(f"no reply to {op} {kw!r} within {limit}s{self._stderr_tail()}") from None

    # plumbing

    def _read_stdout(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for raw in proc.stdout:
            try:
                body = json.loads(raw)
            except ValueError:
                self._stderr.append(f"(stdout, not JSON) {raw.decode(errors='replace').rstrip()}")
                continue
            if body.get("event") == "ready":
                if not self._ready.done():
                    self._ready.set_result(body)
                continue
            with self._lock:
                future = self._pending.pop(body.get("id"), None)
            if future is not None and not future.done():
                future.set_result(from_wire(body))
            elif body.get("id") is None:
                self._stderr.append(f"(unmatched reply) {body}")
        # EOF: the process is gone (or going); fail whatever still waits.
        code = proc.wait()
        time.sleep(0.05)  # let the stderr reader catch the last lines
        reason = f"the reference peer exited with status {code}{self._stderr_tail()}"
        with self._lock:
            self._dead = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RefPeerError(reason))
        if not self._ready.done():
            self._ready.set_exception(RefPeerError(reason))

    def _read_stderr(self) -> None:
        proc = self.proc
        if proc is None or proc.stderr is None:
            return
        for raw in proc.stderr:
            self._stderr.append(raw.decode(errors="replace").rstrip())

    def stderr_lines(self) -> list[str]:
        return list(self._stderr)

    def _stderr_tail(self, lines: int = 20) -> str:
        tail = list(self._stderr)[-lines:]
        return ("\n--- reference peer stderr ---\n" + "\n".join(tail)) if tail else ""

"""S21, fork: the native library is loaded on first use, never at import; a process forked after
loading it gets a clear RuntimeError naming the fix, at once; a process forked before loading it
works normally.

Every scenario runs in a fresh interpreter (subprocess.run of `python -c`), which forks itself
when the scenario needs a fork: the pytest process is never forked. The scripts print one JSON
line per process ("parent" or "child") for the test to check. A forked child arms a 10 s alarm,
so a hang kills it with SIGALRM (and the test fails) instead of hanging the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from channels_nats._native import LIBRARY_ENV

pytestmark = pytest.mark.timeout(90)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import asyncio, json, os, signal, sys, time

URL = sys.argv[1]

def report(who, **facts):
    print(json.dumps({"who": who, **facts}), flush=True)

def library_mapped():
    with open("/proc/self/maps") as maps:
        return "libchannels_nats" in maps.read()

async def round_trip(layer):
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "ping", "pid": os.getpid()})
    message = await asyncio.wait_for(layer.receive(channel), 10)
    return message == {"type": "ping", "pid": os.getpid()}
"""


def run(script: str, nats_url: str) -> dict[str, dict[str, Any]]:
    """Runs PRELUDE + script in a fresh interpreter; returns its JSON reports by "who"."""
    library = os.environ.get(LIBRARY_ENV)
    assert library, f"{LIBRARY_ENV} is not set: run the tests with 'make test-py'"
    env = {**os.environ, LIBRARY_ENV: library, "PYTHONPATH": str(PACKAGE_ROOT)}
    code = PRELUDE + textwrap.dedent(script)
    done = subprocess.run(
        [sys.executable, "-c", code, nats_url], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    reports: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            reports[report.pop("who")] = report
    return reports


def test_import_and_construction_do_not_load_the_library(nats_url: str) -> None:
    reports = run(
        """
        import channels_nats
        from channels_nats import NatsChannelLayer
        after_import = library_mapped()
        layer = NatsChannelLayer(servers=[URL], capacity=10, expiry=5)
        after_construction = library_mapped()

        # The way Django builds it: CHANNEL_LAYERS, then get_channel_layer() on first use.
        from django.conf import settings
        settings.configure(CHANNEL_LAYERS={
            "default": {"BACKEND": "channels_nats.NatsChannelLayer", "CONFIG": {"servers": [URL]}}})
        from channels.layers import get_channel_layer
        django_layer = get_channel_layer()
        after_get_channel_layer = library_mapped()

        worked = asyncio.run(round_trip(layer))
        report("parent", after_import=after_import, after_construction=after_construction,
               after_get_channel_layer=after_get_channel_layer,
               django_layer=type(django_layer).__name__, worked=worked, after_use=library_mapped())
        """,
        nats_url,
    )
    facts = reports["parent"]
    assert facts["after_import"] is False
    assert facts["after_construction"] is False
    assert facts["django_layer"] == "NatsChannelLayer"
    assert facts["after_get_channel_layer"] is False
    # The check can see the library: it is there once the layer was used.
    assert facts["worked"] is True
    assert facts["after_use"] is True


def test_child_forked_after_loading_gets_a_clear_error_at_once(nats_url: str) -> None:
    reports = run(
        """
        from channels_nats import NatsChannelLayer
        layer = NatsChannelLayer(servers=[URL])

        async def prepare():
            assert await round_trip(layer)
            channel = await layer.new_channel()
            await layer.group_add("forkers", channel)
            return channel

        # asyncio.run closes its loop before the fork. A child inheriting an open loop would
        # unregister its descriptors from the epoll instance it shares with the parent when it
        # closes that loop at exit, and the parent's loop would stop waking up (asyncio, not
        # this package).
        channel = asyncio.run(prepare())

        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a hang ends with SIGALRM, which the parent sees
            outcomes = {}
            elapsed = {}

            def attempt(name, call):
                start = time.monotonic()
                try:
                    result = call()
                    outcomes[name] = "returned " + repr(result)
                except BaseException as e:
                    outcomes[name] = type(e).__name__ + ": " + str(e)
                elapsed[name] = time.monotonic() - start

            def on_new_loop(coroutine_function, *args):
                return lambda: asyncio.run(coroutine_function(*args))

            attempt("new_channel", on_new_loop(layer.new_channel))
            attempt("send", on_new_loop(layer.send, channel, {"type": "x"}))
            attempt("receive", on_new_loop(layer.receive, channel))
            attempt("group_add", on_new_loop(layer.group_add, "forkers", "plain"))
            attempt("group_discard", on_new_loop(layer.group_discard, "forkers", channel))
            attempt("group_send", on_new_loop(layer.group_send, "forkers", {"type": "x"}))
            attempt("stats", layer.stats)
            attempt("flush", on_new_loop(layer.flush))
            fresh = NatsChannelLayer(servers=[URL])
            attempt("fresh_layer_send", on_new_loop(fresh.send, "plain", {"type": "x"}))
            attempt("fresh_layer_new_channel", on_new_loop(fresh.new_channel))
            # The C side guards every export too (for forks Python's at-fork hook never sees,
            # made by C code): with the Python marker cleared, the library itself refuses.
            from channels_nats import _native
            _native._state.forked = False
            attempt("c_guard_send", on_new_loop(layer.send, channel, {"type": "x"}))
            attempt("c_guard_receive", on_new_loop(layer.receive, channel))
            attempt("c_guard_stats", layer.stats)
            _native._state.forked = True
            attempt("close", on_new_loop(layer.close))
            report("child", outcomes=outcomes, elapsed=elapsed)
            sys.exit(0)  # a normal exit: atexit handlers run and must not hang either

        _, status = os.waitpid(pid, 0)
        child = {"exited": os.WIFEXITED(status), "signalled": os.WIFSIGNALED(status),
                 "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                 "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}

        async def after_the_fork():
            still_works = await round_trip(layer)
            await layer.send(channel, {"type": "after"})
            after = await asyncio.wait_for(layer.receive(channel), 10)
            await asyncio.wait_for(layer.close(), 10)
            return still_works, after

        still_works, after = asyncio.run(after_the_fork())
        report("parent", child=child, still_works=still_works, after=after)
        """,
        nats_url,
    )
    parent = reports["parent"]
    assert parent["child"] == {"exited": True, "signalled": False, "code": 0, "signal": None}, parent["child"]
    assert parent["still_works"] is True
    assert parent["after"] == {"type": "after"}

    outcomes: dict[str, str] = reports["child"]["outcomes"]
    elapsed: dict[str, float] = reports["child"]["elapsed"]
    must_refuse = [
        "new_channel",
        "send",
        "receive",
        "group_add",
        "group_discard",
        "group_send",
        "stats",
        "flush",
        "fresh_layer_send",
        "fresh_layer_new_channel",
        "c_guard_send",
        "c_guard_receive",
        "c_guard_stats",
    ]
    for name in must_refuse:
        outcome = outcomes[name]
        assert outcome.startswith("RuntimeError: "), f"{name}: {outcome}"
        assert "fork" in outcome, f"{name}: {outcome}"
        assert "worker process after the fork" in outcome, f"{name} names no fix: {outcome}"
        assert "'spawn'" in outcome, f"{name} names no fix: {outcome}"
    # close() never raises (S16): in a forked child there is nothing of the parent's to close.
    assert outcomes["close"] == "returned None", outcomes["close"]
    assert max(elapsed.values()) < 2, elapsed  # at once, not after a timeout


def test_child_forked_before_loading_works_normally(nats_url: str) -> None:
    reports = run(
        """
        from channels_nats import NatsChannelLayer
        layer = NatsChannelLayer(servers=[URL])  # made before the fork, never used before it
        loaded_before_fork = library_mapped()

        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            worked = asyncio.run(round_trip(layer))
            second = asyncio.run(round_trip(NatsChannelLayer(servers=[URL])))
            report("child", worked=worked, second=second, loaded=library_mapped())
            sys.exit(0)

        _, status = os.waitpid(pid, 0)
        worked = asyncio.run(round_trip(layer))  # the parent loads it only now
        report("parent", loaded_before_fork=loaded_before_fork, child_status=status, worked=worked)
        """,
        nats_url,
    )
    assert reports["parent"] == {"loaded_before_fork": False, "child_status": 0, "worked": True}
    assert reports["child"] == {"worked": True, "second": True, "loaded": True}


def test_a_forked_child_receives_nothing_of_its_parent(nats_url: str) -> None:
    """S2, S21: messages wait only in the library's mailboxes, which a forked child cannot reach.
    With messages waiting (and some received before the fork), the child's receive() raises the
    fork error and gets none of them; the parent gets each of them once."""
    reports = run(
        """
        from channels_nats import NatsChannelLayer
        layer = NatsChannelLayer(servers=[URL])

        async def prepare():
            channel = await layer.new_channel()
            for n in range(6):
                await layer.send(channel, {"type": "n", "n": n})
            first = [(await asyncio.wait_for(layer.receive(channel), 10))["n"] for _ in range(2)]
            return channel, first

        channel, first = asyncio.run(prepare())
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            try:
                got = asyncio.run(layer.receive(channel))
                outcome = "received " + repr(got)
            except BaseException as e:
                outcome = type(e).__name__ + ": " + str(e)
            report("child", outcome=outcome)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)

        async def rest():
            got = [(await asyncio.wait_for(layer.receive(channel), 10))["n"] for _ in range(4)]
            try:
                extra = await asyncio.wait_for(layer.receive(channel), 0.5)
            except asyncio.TimeoutError:
                extra = None
            await layer.close()
            return got, extra

        got, extra = asyncio.run(rest())
        report("parent", status=status, first=first, rest=got, extra=extra)
        """,
        nats_url,
    )
    assert reports["child"]["outcome"].startswith("RuntimeError: "), reports["child"]
    assert "fork" in reports["child"]["outcome"]
    assert reports["parent"] == {"status": 0, "first": [0, 1], "rest": [2, 3, 4, 5], "extra": None}

"""What a user meets when something is wrong, and what a hostile peer can do: the first call
after a failed connect names the cause, no secret reaches any text, forged channel names and
flapping mailboxes cannot flood memory or the log, and no message may expand without bound."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NatsServer, RawPublisher, dead_port, nats_server_binary, pack, rss_kb, wait_until

from channels_nats import NatsChannelLayer
from channels_nats._native import LIBRARY_ENV

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def python(script: str, *args: str, warnings: str = "default") -> subprocess.CompletedProcess[str]:
    """Runs script in a fresh interpreter with the package and library of the test run."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), LIBRARY_ENV: os.environ[LIBRARY_ENV]}
    return subprocess.run(
        [sys.executable, "-W", warnings, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


FIRST_CALL = """
    import asyncio, sys
    from channels_nats import NatsChannelLayer
    options = eval(sys.argv[2])
    layer = NatsChannelLayer(servers=[sys.argv[1]], connect_deadline=0.5, connect_options=options)
    async def main():
        try:
            await layer.group_send("g", {"type": "x"})
            print("sent")
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
    asyncio.run(main())
"""


@pytest.mark.timeout(120)
def test_the_first_call_after_a_failed_connect_names_the_cause(tmp_path: Path) -> None:
    """In fresh processes, every time: the first call raises ConnectionError with the cause, for a
    server that is down, a wrong option, wrong credentials and missing credentials."""
    secured = NatsServer(nats_server_binary(), extra=["--user", "app", "--pass", "right-pw"])
    secured.start()
    try:
        port = dead_port()
        cases = {
            "down": (f"nats://127.0.0.1:{port}", {}, "connect_deadline"),
            "wrong option": (secured.url, {"tls_ca": str(tmp_path / "missing.pem")}, "missing.pem"),
            "wrong credentials": (f"nats://app:wrong-pw@127.0.0.1:{secured.port}", {}, "uthorization"),
            "no credentials": (secured.url, {}, "uthorization"),
        }
        runs = {
            name: [python(FIRST_CALL, url, repr(options)) for _ in range(4)]
            for name, (url, options, _) in cases.items()
        }
    finally:
        secured.stop()
    for name, done in runs.items():
        for run in done:
            out = run.stdout.strip()
            assert out.startswith("ConnectionError: "), f"{name}: {out!r} (stderr {run.stderr[-500:]!r})"
            assert cases[name][2] in out, f"{name}: the cause is not named: {out}"
            assert "wrong-pw" not in out
            assert "right-pw" not in out


@pytest.mark.parametrize(
    ("form", "secret"),
    [
        ("nats://user:pass word@{host}", "pass word"),
        ("nats://user:pa/ss@{host}", "pa/ss"),
        ("nats://user:p@ss@{host}", "p@ss"),
        ("TOKEN-without-scheme@{host}", "TOKEN-without-scheme"),
        ("user:pw-without-scheme@{host}", "pw-without-scheme"),
        ("tls://user:tls-secret@{host}", "tls-secret"),
    ],
)
async def test_no_secret_in_any_text(form: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every URL form nats.go accepts, with the server down: the exception, the log records,
    repr() and stats() show no secret."""
    caplog.set_level(logging.DEBUG, logger="channels_nats")
    url = form.format(host=f"127.0.0.1:{dead_port()}")
    layer = NatsChannelLayer(servers=url, connect_deadline=0.3)
    with pytest.raises(ConnectionError) as raised:
        await layer.send("ch", {"type": "x"})
    texts = [str(raised.value), repr(raised.value), repr(layer), str(layer.stats())]
    texts += [record.getMessage() for record in caplog.records]
    for text in texts:
        assert secret not in text, text
    await layer.close()


@pytest.mark.timeout(120)
async def test_forged_channel_names_cannot_flood_memory_or_the_log(
    make_layer: Any, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """150,000 frames on this client's process subject, each naming a made-up channel of 1 KB:
    they are dropped and counted (no_mailbox), memory stays flat, the log gets at most 2 lines
    for the subject, and what it shows of a name is short, with control characters escaped."""
    caplog.set_level(logging.WARNING, logger="channels_nats")
    layer = make_layer()
    channel = await layer.new_channel()
    prefix = channel.partition("!")[0]
    subject = f"channels.pc.{prefix}"
    body = pack({"type": "forged"})
    publisher = RawPublisher(nats_server.port)
    rss = []
    try:
        nasty = "\x1b[31m\r\u2028\x00"  # no LF: it would end the header line on the wire
        for batch in range(3):
            for n in range(50_000):
                name = f"{prefix}!{nasty}{batch:02d}{n:06d}" + "x" * 1000
                publisher.publish(subject, body, {"Channel": name})
            publisher.ping()
            await wait_until(lambda n=50_000 * (batch + 1): layer.stats()["dropped"]["no_mailbox"] >= n, "drops", 30)
            rss.append(rss_kb())
    finally:
        publisher.close()
    assert layer.stats()["dropped"]["no_mailbox"] == 150_000, layer.stats()
    assert rss[-1] - rss[0] < 10 * 1024, f"RSS after each 50,000 forged frames (kB): {rss}"
    await wait_until(lambda: any(subject in r.getMessage() for r in caplog.records), "the no-mailbox warning")
    lines = [r.getMessage() for r in caplog.records if subject in r.getMessage()]
    assert 1 <= len(lines) <= 2, lines[:5]
    for line in lines:
        assert len(line) < 600, line
        for character in ("\x1b", "\r", "\n", "\u2028", "\x00"):
            assert character not in line, repr(line)


async def test_a_flapping_mailbox_warns_at_the_documented_rate(
    make_layer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """S3: one slow mailbox that fills and drains again and again warns about it at most 3 times
    in any minute (the first drop, "has room again", and a later drop after a minute)."""
    caplog.set_level(logging.WARNING, logger="channels_nats")
    receiver, sender = make_layer(capacity=10), make_layer()
    channel = await receiver.new_channel()
    started = time.monotonic()
    for _ in range(40):
        for n in range(30):
            await sender.send(channel, {"type": "t", "n": n})
        await asyncio.sleep(0.05)  # they arrive: 10 fit, 20 are dropped
        for _ in range(10):
            await asyncio.wait_for(receiver.receive(channel), 5)
    assert time.monotonic() - started < 60
    assert receiver.stats()["dropped"]["capacity"] >= 40 * 20 - 100
    await wait_until(lambda: any(channel in r.getMessage() for r in caplog.records), "the drop warning")
    lines = [r.getMessage() for r in caplog.records if channel in r.getMessage()]
    assert 1 <= len(lines) <= 3, lines


async def test_a_message_that_would_expand_too_much_is_refused(make_layer: Any, nats_server: NatsServer) -> None:
    """A body of nothing but empty maps would decode to some 60 times its size: refused at send
    (TypeError), and dropped as a bad frame when a foreign publisher sends it."""
    layer = make_layer()
    channel = await layer.new_channel()
    bomb: dict[str, Any] = {"type": "bomb", "maps": [{} for _ in range(500_000)]}
    with pytest.raises(TypeError, match="expand"):
        await layer.send(channel, bomb)
    RawPublisher(nats_server.port).publish(f"channels.pc.{channel.partition('!')[0]}", pack(bomb), {"Channel": channel})
    await wait_until(lambda: layer.stats()["dropped"]["bad_frame"] == 1, "the bomb to be dropped")
    fine = {"type": "rows", "rows": [{"id": n, "name": f"row {n}"} for n in range(20_000)]}
    await layer.send(channel, fine)
    assert (await asyncio.wait_for(layer.receive(channel), 5))["rows"][-1]["id"] == 19_999


def test_no_resource_warning_at_exit(nats_url: str) -> None:
    """A process that used the layer, closed or not, exits without a ResourceWarning (with
    -W error a user's test suite would fail)."""
    script = """
        import asyncio, sys
        from channels_nats import NatsChannelLayer
        layer = NatsChannelLayer(servers=[sys.argv[1]])
        async def use():
            channel = await layer.new_channel()
            await layer.send(channel, {"type": "x"})
            await layer.receive(channel)
        asyncio.run(use())
        asyncio.run(use())
        if sys.argv[2] == "close":
            asyncio.run(layer.close())
        print("done")
    """
    for how in ("close", "no close"):
        done = python(script, nats_url, how, warnings="error::ResourceWarning")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "done", done.stderr
        assert "ResourceWarning" not in done.stderr, done.stderr
        assert "unclosed" not in done.stderr, done.stderr

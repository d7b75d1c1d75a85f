"""Reliability and security through the Python layer (issue 8): broker faults with real processes,
a routed 3-node cluster, authentication, TLS and credentials that never leak.

Every server is a real nats-server subprocess (conftest's NatsServer) on loopback; every wait is
bounded, so a lost message fails a test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import pytest
from conftest import NatsServer, free_port, nats_server_binary

from channels_nats import NatsChannelLayer

CTX = multiprocessing.get_context("spawn")
EVENTUAL = 20.0
"""Seconds an eventual delivery may take before the test fails."""
QUICK = {"reconnect_time_wait": 0.2, "drain_timeout": 0.5, "connect_timeout": 1}
"""connect_options that keep reconnects and closes of dead connections short."""


# ---- helpers ---------------------------------------------------------------------------------


def prefix() -> str:
    return f"rel{uuid.uuid4().hex[:10]}"


def kill(server: NatsServer) -> None:
    """SIGKILL: the broker dies without closing its connections cleanly."""
    assert server.process is not None
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    server.process = None


def monitor(server: NatsServer, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/{path}", timeout=5) as r:
        return json.load(r)


async def wait_for(predicate: Callable[[], bool], timeout: float = EVENTUAL, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def eventually_receive(
    consumer: NatsChannelLayer,
    channel: str,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    timeout: float = EVENTUAL,
) -> dict[str, Any]:
    """Sends a fresh tagged message again and again until the consumer receives one of them (interest
    across a cluster and reconnects take a moment); stale copies of earlier attempts are skipped."""
    tag = uuid.uuid4().hex
    deadline = time.monotonic() + timeout
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        try:
            await send({"type": "probe", "tag": tag, "attempt": attempt})
        except (ConnectionError, TimeoutError):
            pass  # the sender may be reconnecting too
        try:
            while True:
                message = await asyncio.wait_for(consumer.receive(channel), 0.3)
                if message.get("tag") == tag:
                    return message
        except asyncio.TimeoutError:
            continue
    pytest.fail(f"nothing reached {channel} within {timeout}s")


async def close_all(layers: list[NatsChannelLayer]) -> None:
    for layer in layers:
        await layer.close()


# ---- 1. broker SIGKILL mid-stream, real processes ---------------------------------------------


def consumer_main(url: str, pfx: str, group: str, ready: Queue[Any], events: Queue[Any]) -> None:
    """A consumer process: a process channel that gets direct sends and one that is a member of
    group; each keeps a receive pending and reports every arrival (kind, number, monotonic time).
    Exceptions raised into this code are reported, not swallowed."""
    asyncio.run(_consumer(url, pfx, group, ready, events))


async def _consumer(url: str, pfx: str, group: str, ready: Queue[Any], events: Queue[Any]) -> None:
    layer = NatsChannelLayer(servers=[url], prefix=pfx)
    errors: list[str] = []
    try:
        direct = await layer.new_channel()
        member = await layer.new_channel()
        await layer.group_add(group, member)
        ready.put((direct, member))

        async def drain(kind: str, channel: str) -> None:
            while True:
                try:
                    message = await layer.receive(channel)
                except Exception as e:  # reported to the parent: nothing may raise here
                    errors.append(f"{kind}: {type(e).__name__}: {e}")
                    await asyncio.sleep(0.1)
                    continue
                if message["type"] == "test.end":
                    return
                events.put(("got", kind, message["n"], time.monotonic(), os.getpid()))

        await asyncio.wait_for(asyncio.gather(drain("direct", direct), drain("group", member)), 60)
    except BaseException as e:
        errors.append(f"main: {type(e).__name__}: {e}")
    finally:
        events.put(("done", errors, layer.stats().get("dropped", {})))
        await layer.close()


@pytest.mark.timeout(90)
async def test_broker_sigkill_and_restart_mid_stream_with_processes(
    own_nats_server: NatsServer, capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]
) -> None:
    pfx, group = prefix(), "stream"
    ready: Queue[Any] = CTX.Queue()
    events: Queue[Any] = CTX.Queue()
    children: list[BaseProcess] = [
        CTX.Process(target=consumer_main, args=(own_nats_server.url, pfx, group, ready, events), daemon=True)
        for _ in range(2)
    ]
    for child in children:
        child.start()
    publisher = NatsChannelLayer(servers=[own_nats_server.url], prefix=pfx)
    try:
        channels = [ready.get(timeout=20) for _ in children]
        directs = [direct for direct, _ in channels]
        arrivals: dict[str, list[tuple[int, float]]] = {}
        send_errors: list[str] = []
        consumer_errors: list[str] = []
        consumer_drops: list[dict[str, int]] = []  # each consumer's stats()["dropped"] at the end
        done = 0

        def take_events() -> None:
            nonlocal done
            while True:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    return
                if event[0] == "got":
                    _, kind, n, at, pid = event
                    arrivals.setdefault(kind, []).append((n, at))
                    if restarted_at and at > restarted_at:
                        resumed_by.setdefault((pid, kind), at)
                else:
                    done += 1
                    consumer_errors.extend(event[1])
                    consumer_drops.append(event[2])

        # Direct sends carry n*2+i so each child's numbers are told apart; group messages carry n.
        n = 0
        killed_at = restarted_at = 0.0
        started = time.monotonic()
        # The first arrival after the restart of each (consumer, kind): the sends go on until
        # every consumer has resumed on both channels, whenever its client reconnects (nats.go
        # waits reconnect_time_wait between attempts, so one consumer may be back a second or
        # two after the other), and the end marker is sent only then.
        resumed_by: dict[tuple[int, str], float] = {}
        tick_at: list[float] = []  # when tick n was published
        while True:
            now = time.monotonic()
            if not killed_at and now - started > 1.5:
                kill(own_nats_server)
                killed_at = time.monotonic()
            if killed_at and not restarted_at and now - killed_at > 1.0:
                own_nats_server.start()
                restarted_at = time.monotonic()
            for i, direct in enumerate(directs):
                try:
                    await publisher.send(direct, {"type": "num", "n": n * 2 + i})
                except Exception as e:
                    send_errors.append(f"{type(e).__name__}: {e}")
            try:
                await publisher.group_send(group, {"type": "num", "n": n})
            except Exception as e:
                send_errors.append(f"{type(e).__name__}: {e}")
            tick_at.append(now)
            n += 1
            take_events()
            if restarted_at:
                if len(resumed_by) == 2 * len(children) and now - max(resumed_by.values()) > 1.0:
                    break
                if now - restarted_at > EVENTUAL:
                    break
            await asyncio.sleep(0.02)
        sent = n
        for direct in directs:
            await publisher.send(direct, {"type": "test.end"})
        await publisher.group_send(group, {"type": "test.end"})
        deadline = time.monotonic() + 20
        while done < len(children) and time.monotonic() < deadline:
            take_events()
            await asyncio.sleep(0.05)
        take_events()

        assert done == len(children), "a consumer did not finish"
        assert consumer_errors == [], f"exceptions raised into consumer code: {consumer_errors}"
        assert len(resumed_by) == 2 * len(children), f"delivery did not resume at every consumer: {resumed_by}"
        resumed = {kind: max(at for (_, k), at in resumed_by.items() if k == kind) for kind in ("direct", "group")}
        group_numbers = Counter(number for number, _ in arrivals["group"])
        group_missing = sorted(set(range(sent)) - set(group_numbers))
        direct_numbers = {number for number, _ in arrivals["direct"]}
        direct_missing = sorted(set(range(sent * 2)) - direct_numbers)
        # Loss window: from the first to the last tick with a missing number (a group number is
        # missing if either consumer lacks it; a direct number n*2+i belongs to tick n).
        missing_ticks = {t for t, c in Counter(group_numbers).items() if c < 2} | set(group_missing)
        missing_ticks |= {d // 2 for d in direct_missing}
        missing_ticks &= set(range(sent))
        window = (tick_at[max(missing_ticks)] - tick_at[min(missing_ticks)] + 0.02) if missing_ticks else 0.0
        first = {kind: round(at - restarted_at, 3) for kind, at in resumed.items()}
        report = {
            "sent_ticks": sent,
            "outage_s": round(restarted_at - killed_at, 3),
            "group_missing": len(group_missing),
            "direct_missing": len(direct_missing),
            "ticks_with_loss": len(missing_ticks),
            "loss_window_s": round(window, 3),
            "lost_direct_ticks_since_kill_s": _span(sorted({d // 2 for d in direct_missing}), tick_at, killed_at),
            "lost_group_ticks_since_kill_s": _span(group_missing, tick_at, killed_at),
            "every_consumer_resumed_after_s": first,
            "publisher_send_errors": len(send_errors),
            "publisher_lost": publisher.stats()["lost"],
            "consumer_drops": consumer_drops,
        }
        record_property("loss_window", report)
        with capsys.disabled():
            print(f"\n[reliability] broker SIGKILL + restart: {report}")
        assert window < 10, f"loss window too long: {report}"
        assert max(first.values()) < 10, f"delivery resumed too late: {report}"
        assert send_errors == [], f"sends raised during a short outage: {send_errors[:3]}"
    finally:
        await publisher.close()
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()


def _span(ticks: list[int], tick_at: list[float], since: float) -> tuple[float, float] | None:
    """The first and last of ticks as seconds since `since` (None when nothing was lost)."""
    ticks = [t for t in ticks if t < len(tick_at)]
    return (round(tick_at[ticks[0]] - since, 3), round(tick_at[ticks[-1]] - since, 3)) if ticks else None


# ---- 2. a connection closed for good -----------------------------------------------------------


@pytest.mark.timeout(60)
async def test_a_connection_closed_for_good_is_recovered(own_nats_server: NatsServer) -> None:
    pfx = prefix()
    options = {"max_reconnect_attempts": 0, "reconnect_time_wait": 0.1, "drain_timeout": 0.5}
    sender = NatsChannelLayer(servers=[own_nats_server.url], prefix=pfx, connect_options=options)
    receiver = NatsChannelLayer(servers=[own_nats_server.url], prefix=pfx, connect_options=options)
    try:
        channel = await receiver.new_channel()
        await sender.send(channel, {"type": "before", "n": 0})
        assert (await asyncio.wait_for(receiver.receive(channel), 5))["type"] == "before"
        pending = asyncio.ensure_future(receiver.receive(channel))  # receive-only: nothing else runs
        await asyncio.sleep(0.1)

        own_nats_server.stop()
        await asyncio.sleep(0.5)  # both connections are closed for good now (no reconnect attempts)
        own_nats_server.start()

        # The next call works again: the layer opens a new connection.
        await sender.send(channel, {"type": "after", "n": 1})
        deadline = time.monotonic() + EVENTUAL
        n = 1
        while not pending.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            n += 1
            await sender.send(channel, {"type": "after", "n": n})
        assert pending.done(), "a receive-only layer did not recover on its own"
        assert pending.result()["type"] == "after"
    finally:
        await close_all([sender, receiver])


# ---- 3. a routed 3-node cluster ---------------------------------------------------------------


class Cluster:
    """Three nats-servers routed to each other on loopback."""

    def __init__(self) -> None:
        binary = nats_server_binary()
        self.route_ports = [free_port() for _ in range(3)]
        self.nodes: list[NatsServer] = []
        for i in range(3):
            routes = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
            extra = ["-n", f"n{i + 1}", "--cluster_name", "c", "--cluster", f"nats://127.0.0.1:{self.route_ports[i]}"]
            self.nodes.append(NatsServer(binary, extra=[*extra, "--routes", routes]))

    def routes(self, node: NatsServer) -> int:
        try:
            return int(monitor(node, "routez")["num_routes"])
        except OSError:
            return -1

    async def wait_routed(self) -> None:
        await wait_for(lambda: all(self.routes(n) >= 2 for n in self.nodes), 15, "every node to have 2 routes")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        for node in c.nodes:
            node.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
async def layers() -> AsyncIterator[list[NatsChannelLayer]]:
    made: list[NatsChannelLayer] = []
    yield made
    await close_all(made)


@pytest.mark.timeout(90)
async def test_cluster_routes_failover_restart_and_single_delivery(
    cluster: Cluster, layers: list[NatsChannelLayer]
) -> None:
    await cluster.wait_routed()
    n1, n2, n3 = cluster.nodes
    pfx = prefix()

    def make(*servers: NatsServer, **options: Any) -> NatsChannelLayer:
        layer = NatsChannelLayer(servers=[s.url for s in servers], prefix=pfx, connect_options={**QUICK, **options})
        layers.append(layer)
        return layer

    # group_send and a process channel across nodes.
    on1, on3 = make(n1), make(n3)
    process_channel = await on1.new_channel()
    member = await on1.new_channel()
    await on1.group_add("g", member)
    await eventually_receive(on1, member, lambda m: on3.group_send("g", m))
    await eventually_receive(on1, process_channel, lambda m: on3.send(process_channel, m))

    # A consumer that knows all three nodes, on node 1 first, survives the loss of node 1.
    name = f"consumer-{uuid.uuid4().hex[:8]}"
    consumer = make(n1, n2, n3, dont_randomize=True, name=name)
    mailbox = await consumer.new_channel()
    await consumer.group_add("failover", mailbox)
    assert name in {c.get("name") for c in n1.connz()["connections"]}, "the consumer is not on node 1"
    await eventually_receive(consumer, mailbox, lambda m: on3.group_send("failover", m))
    kill(n1)
    await eventually_receive(consumer, mailbox, lambda m: on3.group_send("failover", m))
    await eventually_receive(consumer, mailbox, lambda m: on3.send(mailbox, m))

    # Node 1 restarted carries traffic again: a layer that knows only node 1 reaches the consumer.
    n1.start()
    await cluster.wait_routed()
    only1 = make(n1)
    await eventually_receive(consumer, mailbox, lambda m: only1.group_send("failover", m))
    await eventually_receive(consumer, mailbox, lambda m: only1.send(mailbox, m))

    # A plain channel read on two nodes: each message is delivered once overall.
    plain = f"work-{uuid.uuid4().hex[:8]}"
    reader_a, reader_b = make(n1), make(n2)
    got: list[int] = []
    warm: list[str] = []

    async def read(reader: NatsChannelLayer, who: str) -> None:
        while True:
            message = await reader.receive(plain)
            if message["type"] == "warm":
                warm.append(who)
            else:
                got.append(message["n"])

    tasks = [asyncio.ensure_future(read(reader_a, "a")), asyncio.ensure_future(read(reader_b, "b"))]
    try:
        deadline = time.monotonic() + EVENTUAL
        while len(set(warm)) < 2 and time.monotonic() < deadline:
            await on3.send(plain, {"type": "warm"})
            await asyncio.sleep(0.1)
        assert warm, "no reader of the plain channel was reachable"
        for i in range(20):
            await on3.send(plain, {"type": "num", "n": i})
        await wait_for(lambda: len(got) >= 20, 10, "20 plain-channel messages")
        await asyncio.sleep(1.0)  # a duplicate would arrive within this
        counts = Counter(got)
        assert sorted(counts) == list(range(20)), f"missing: {set(range(20)) - set(counts)}"
        assert max(counts.values()) == 1, f"delivered more than once: {[k for k, v in counts.items() if v > 1]}"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- 4. authentication and secrets ------------------------------------------------------------

SECRET = "s3cr3t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def token_server() -> Iterator[NatsServer]:
    server = NatsServer(nats_server_binary(), extra=["--auth", SECRET])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def password_server() -> Iterator[NatsServer]:
    server = NatsServer(nats_server_binary(), extra=["--user", "u", "--pass", SECRET])
    server.start()
    yield server
    server.stop()


async def round_trip(layer: NatsChannelLayer) -> None:
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "ping"})
    assert (await asyncio.wait_for(layer.receive(channel), 5))["type"] == "ping"


async def connect_error(layer: NatsChannelLayer) -> ConnectionError:
    with pytest.raises(ConnectionError) as info:
        await asyncio.wait_for(layer.new_channel(), 15)
    return info.value


def assert_no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret leaked: {text!r}"


@pytest.mark.timeout(60)
async def test_token_and_password_auth_without_leaking_secrets(
    token_server: NatsServer,
    password_server: NatsServer,
    layers: list[NatsChannelLayer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="channels_nats")
    pfx = prefix()

    def make(url: str, **options: Any) -> NatsChannelLayer:
        layer = NatsChannelLayer(servers=[url], prefix=pfx, connect_options={**QUICK, **options})
        layers.append(layer)
        return layer

    await round_trip(make(token_server.url, token=SECRET))
    await round_trip(make(password_server.url, user="u", password=SECRET))
    in_url = make(f"nats://u:{SECRET}@127.0.0.1:{password_server.port}")
    await round_trip(in_url)
    assert_no_secret(repr(in_url), SECRET)
    assert_no_secret(str(in_url), SECRET)

    # Wrong credentials: a clear ConnectionError without the secret (right or wrong) in it.
    wrong = "wr0ng-" + uuid.uuid4().hex[:12]
    for layer in (
        make(token_server.url, token=wrong),
        make(token_server.url),
        make(password_server.url, user="u", password=wrong),
        make(f"nats://u:{wrong}@127.0.0.1:{password_server.port}"),
    ):
        error = await connect_error(layer)
        assert str(error), "the error says nothing"
        assert_no_secret(str(error), SECRET, wrong)
        assert_no_secret(repr(error), SECRET, wrong)
        assert_no_secret(repr(layer), SECRET, wrong)

    # A disconnect/reconnect cycle of the layer with the password in its URL logs no secret.
    password_server.stop()
    await asyncio.sleep(0.5)
    password_server.start()
    await wait_for(
        lambda: any("reconnected" in r.getMessage() for r in caplog.records), EVENTUAL, "a reconnect log record"
    )
    await round_trip(in_url)
    await asyncio.sleep(0.3)  # records of library threads
    assert caplog.records, "no log record at all"
    for record in caplog.records:
        assert_no_secret(record.getMessage(), SECRET, wrong)
        assert_no_secret(repr(record.args), SECRET, wrong)


# ---- 5. TLS, mutual TLS and an nkey -----------------------------------------------------------


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def make_pki(d: Path) -> dict[str, str]:
    """A CA, a server certificate for IP 127.0.0.1 and a client certificate, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed (apt-get install -y openssl)")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
        "-days",
        "2",
        "-subj",
        "/CN=channels-nats test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    for who, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{who}.ext").write_text(ext)
        openssl("req", *ec, "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"), "-subj", f"/CN={who}")
        openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{who}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-out",
            str(d / f"{who}.pem"),
            "-days",
            "2",
            "-extfile",
            str(d / f"{who}.ext"),
        )
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.timeout(60)
async def test_tls_and_mutual_tls(tmp_path: Path, layers: list[NatsChannelLayer]) -> None:
    pki = make_pki(tmp_path)
    binary = nats_server_binary()
    tls = NatsServer(binary, extra=["--tls", "--tlscert", pki["server.pem"], "--tlskey", pki["server.key"]])
    conf = tmp_path / "mtls.conf"
    conf.write_text(
        "tls {\n"
        f'  cert_file: "{pki["server.pem"]}"\n  key_file: "{pki["server.key"]}"\n'
        f'  ca_file: "{pki["ca.pem"]}"\n  verify: true\n'
        "}\n"
    )
    mtls = NatsServer(binary, extra=["-c", str(conf)])
    pfx = prefix()

    def make(server: NatsServer, **options: Any) -> NatsChannelLayer:
        layer = NatsChannelLayer(
            servers=[f"tls://127.0.0.1:{server.port}"], prefix=pfx, connect_options={**QUICK, **options}
        )
        layers.append(layer)
        return layer

    tls.start()
    mtls.start()
    try:
        await round_trip(make(tls, tls_ca=pki["ca.pem"]))
        await connect_error(make(tls))  # the server certificate is signed by an unknown CA
        await round_trip(make(mtls, tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"], tls_key=pki["client.key"]))
        await connect_error(make(mtls, tls_ca=pki["ca.pem"]))  # no client certificate
    finally:
        await close_all(layers)
        layers.clear()
        tls.stop()
        mtls.stop()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _nkey_encode(raw: bytes) -> str:
    return base64.b32encode(raw + _crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def make_user_nkey() -> tuple[str, str]:
    """(seed, public key) of a new user nkey: an ed25519 key in the NATS nkey encoding."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    prefix_seed, prefix_user = 18 << 3, 20 << 3
    seed_text = _nkey_encode(bytes([prefix_seed | (prefix_user >> 5), (prefix_user & 31) << 3]) + seed)
    return seed_text, _nkey_encode(bytes([prefix_user]) + public)


@pytest.mark.timeout(60)
async def test_nkey_auth(tmp_path: Path, layers: list[NatsChannelLayer]) -> None:
    seed, public = make_user_nkey()
    _, other_public = make_user_nkey()
    assert public.startswith("U")
    assert seed.startswith("SU")
    conf = tmp_path / "nkey.conf"
    conf.write_text(f'authorization {{\n  users: [ {{ nkey: "{public}" }} ]\n}}\n')
    seed_file = tmp_path / "user.nk"
    seed_file.write_text(seed + "\n")
    server = NatsServer(nats_server_binary(), extra=["-c", str(conf)])
    server.start()
    try:
        good = NatsChannelLayer(
            servers=[server.url], prefix=prefix(), connect_options={**QUICK, "nkey_seed": str(seed_file)}
        )
        layers.append(good)
        await round_trip(good)
        conf.write_text(f'authorization {{\n  users: [ {{ nkey: "{other_public}" }} ]\n}}\n')
        server.stop()
        server.start()
        refused = NatsChannelLayer(
            servers=[server.url], prefix=prefix(), connect_options={**QUICK, "nkey_seed": str(seed_file)}
        )
        layers.append(refused)
        error = await connect_error(refused)
        assert_no_secret(str(error), seed)
    finally:
        await close_all(layers)
        layers.clear()
        server.stop()

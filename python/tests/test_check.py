"""`python -m channels_nats check`, the health check: exit status 0 with the server, the round
trips and stats() when the layer works; 1 with the reason when it does not; 2 when the
configuration cannot be used. Never a secret in what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import NatsServer, dead_port, nats_server_binary

from channels_nats._native import LIBRARY_ENV

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def check(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (PACKAGE_ROOT, cwd) if p)}
    env[LIBRARY_ENV] = os.environ[LIBRARY_ENV]
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "channels_nats", "check", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def settings_module(tmp_path: Path, name: str, url: str, backend: str = "channels_nats.NatsChannelLayer") -> None:
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
            SECRET_KEY = "check"
            CHANNEL_LAYERS = {{
                "default": {{"BACKEND": {backend!r}, "CONFIG": {{"servers": [{url!r}], "connect_deadline": 0.5}}}}
            }}
        """)
    )


def test_check_against_a_server(nats_url: str) -> None:
    done = check("--servers", nats_url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "channels_nats check: OK" in out
    assert "(called in compiled mode)" in out or "(called in abi mode)" in out
    assert "nats-server 2." in out
    assert "process     round trip" in out
    assert "group       round trip" in out
    assert '"delivered": 2' in out


def test_check_reads_django_settings_and_shows_no_secret(tmp_path: Path) -> None:
    server = NatsServer(nats_server_binary(), extra=["--auth", "check-token-value"])
    server.start()
    try:
        settings_module(tmp_path, "good_settings", f"nats://check-token-value@127.0.0.1:{server.port}")
        good = check("--settings", "good_settings", cwd=tmp_path)
        settings_module(tmp_path, "bad_settings", f"nats://wrong-token-value@127.0.0.1:{server.port}")
        bad = check("--settings", "bad_settings", cwd=tmp_path)
    finally:
        server.stop()
    assert good.returncode == 0, good.stderr
    assert bad.returncode == 1
    assert "ConnectionError" in bad.stderr
    assert "uthorization" in bad.stderr
    for done in (good, bad):
        assert "token-value" not in done.stdout + done.stderr


def test_check_fails_with_the_reason(tmp_path: Path) -> None:
    down = check("--servers", f"nats://127.0.0.1:{dead_port()}", "--timeout", "20")
    assert down.returncode == 1
    assert "FAILED: ConnectionError" in down.stderr
    settings_module(tmp_path, "redis_settings", "redis://x", backend="channels_redis.core.RedisChannelLayer")
    other = check("--settings", "redis_settings", cwd=tmp_path)
    assert other.returncode == 2
    assert "not channels_nats.NatsChannelLayer" in other.stderr
    nothing = check()
    assert nothing.returncode == 2
    assert "DJANGO_SETTINGS_MODULE" in nothing.stderr

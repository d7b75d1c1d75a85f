#!/usr/bin/env bash
# install-check: proves that `pip install ./python` works for a user who has Go.
#
# 1. A fresh venv in build/install-check/venv (any previous one is deleted).
# 2. `pip wheel ./python`: the hatchling build hook (python/hatch_build.py) builds the native library
#    with Go through capi/build.sh and bundles it with its header. The wheel must be tagged
#    py3-none-manylinux_2_17_<arch> and contain both files.
# 3. That wheel is installed with its dependencies from PyPI (channels, msgpack, cffi).
# 4. build/nats-server runs on a free port, and two processes of the installed package, started
#    from outside the repository (so python/ is not importable), do a group_send: B joins a group
#    and waits; A group_sends until B reports the message (at most 20 s).
# CHANNELS_NATS_LIBRARY is unset: the installed package must use the library it bundles.
# Prints progress lines and "install-check: ok"; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/build/install-check
python=${PYTHON:-python3}
pip_flags=(--disable-pip-version-check --quiet)
unset CHANNELS_NATS_LIBRARY CHANNELS_NATS_PREBUILT CHANNELS_NATS_PLATFORM_TAG PYTHONPATH

say() { echo "install-check: $*"; }
fail() {
	echo "install-check: FAILED: $*" >&2
	exit 1
}

server_pid=
receiver_pid=
outside=
cleanup() {
	if [ -n "$receiver_pid" ]; then kill "$receiver_pid" 2>/dev/null || true; fi
	if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
	if [ -n "$outside" ]; then rm -rf "$outside"; fi
}
trap cleanup EXIT

command -v go >/dev/null || fail "go is not on PATH (building from source needs Go)"

case "$(uname -m)" in
x86_64 | amd64) arch=x86_64 ;;
aarch64 | arm64) arch=aarch64 ;;
*) fail "no manylinux wheel is built for $(uname -m)" ;;
esac
want_tag=py3-none-manylinux_2_17_$arch

say "fresh venv in build/install-check/venv ($("$python" --version))"
rm -rf "$work"
mkdir -p "$work/wheel"
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python

say "pip wheel ./python (the build hook builds the native library with Go)"
"$venv_python" -m pip wheel "${pip_flags[@]}" --no-deps -w "$work/wheel" ./python
shopt -s nullglob
wheels=("$work"/wheel/*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || fail "expected one wheel in build/install-check/wheel, found ${#wheels[@]}"
wheel=${wheels[0]}
say "wheel: $(basename "$wheel")"

"$venv_python" - "$wheel" "$want_tag" <<'EOF'
import sys
import zipfile
from pathlib import Path

path, want = Path(sys.argv[1]), sys.argv[2]
parts = path.name[: -len(".whl")].split("-")
if len(parts) != 5:
    sys.exit(f"install-check: FAILED: unexpected wheel name {path.name}")
dist, version, pythons, abis, platforms = parts
tags = {f"{p}-{a}-{q}" for p in pythons.split(".") for a in abis.split(".") for q in platforms.split(".")}
if want not in tags:
    sys.exit(f"install-check: FAILED: the wheel is tagged {sorted(tags)}, not {want}")
with zipfile.ZipFile(path) as wheel:
    names = set(wheel.namelist())
    for member in ("channels_nats/libchannels_nats.so", "channels_nats/channels_nats.h", "channels_nats/py.typed"):
        if member not in names:
            sys.exit(f"install-check: FAILED: the wheel has no {member}")
    meta = wheel.read(f"{dist}-{version}.dist-info/WHEEL").decode()
if "Root-Is-Purelib: false" not in meta or f"Tag: {want}" not in meta:
    sys.exit(f"install-check: FAILED: the wheel's WHEEL file does not say platlib and {want}:\n{meta}")
print(f"install-check: wheel tag {want}, bundles libchannels_nats.so and channels_nats.h")
EOF

say "pip install the wheel and its dependencies"
"$venv_python" -m pip install "${pip_flags[@]}" "$wheel"

if [ ! -x build/nats-server ]; then
	say "building build/nats-server from the pinned module"
	go build -o build/nats-server github.com/nats-io/nats-server/v2
fi

# From here on, nothing runs inside the repository.
outside=$(mktemp -d /tmp/install-check.XXXXXX)
cd "$outside"

"$venv_python" - <<'EOF'
import sysconfig
from pathlib import Path

import channels_nats
from channels_nats import _native

package = Path(channels_nats.__file__).resolve().parent
site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
if package.parent not in site:
    raise SystemExit(f"install-check: FAILED: channels_nats was imported from {package}, not the venv")
for name in ("libchannels_nats.so", "channels_nats.h"):
    if not (package / name).is_file():
        raise SystemExit(f"install-check: FAILED: the installed package has no {name}")
if _native.library_path() != package / "libchannels_nats.so":
    raise SystemExit(f"install-check: FAILED: the package would load {_native.library_path()}")
print(f"install-check: installed channels-nats {channels_nats.__version__} in {package.parent},"
      f" native library {_native.version()}")
EOF

port=$("$venv_python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=nats://127.0.0.1:$port
say "starting build/nats-server on $url"
"$root/build/nats-server" -a 127.0.0.1 -p "$port" >"$work/nats-server.log" 2>&1 &
server_pid=$!
"$venv_python" - "$port" <<'EOF'
import socket
import sys
import time

deadline = time.monotonic() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("install-check: FAILED: nats-server did not start")
        time.sleep(0.05)
EOF

cat >receiver.py <<'EOF'
"""Process B: joins the group, waits for one message, checks it and reports it in a file."""
import asyncio
import os
import sys
from pathlib import Path

from channels_nats import NatsChannelLayer


async def main(url: str, group: str, report: Path) -> None:
    layer = NatsChannelLayer(servers=[url])
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    print(f"install-check: B (pid {os.getpid()}) joined {group} with {channel}", flush=True)
    message = await asyncio.wait_for(layer.receive(channel), 20)
    if message.get("type") != "install.check" or message.get("text") != "héllo" or message.get("blob") != b"\x00\xff":
        sys.exit(f"install-check: FAILED: B got {message!r}")
    tmp = report.with_suffix(".tmp")
    tmp.write_text(f"message {message['n']} from pid {message['pid']}")
    tmp.rename(report)
    await layer.close()


asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
EOF

cat >sender.py <<'EOF'
"""Process A: group_sends until B reports the message, for at most 20 s."""
import asyncio
import os
import sys
import time
from pathlib import Path

from channels_nats import NatsChannelLayer


async def main(url: str, group: str, report: Path) -> None:
    layer = NatsChannelLayer(servers=[url])
    deadline = time.monotonic() + 20
    sent = 0
    while not report.exists():
        if time.monotonic() > deadline:
            sys.exit(f"install-check: FAILED: B did not report the message within 20 s ({sent} sent)")
        sent += 1
        await layer.group_send(group, {"type": "install.check", "n": sent, "pid": os.getpid(), "text": "héllo",
                                       "blob": b"\x00\xff"})
        await asyncio.sleep(0.1)
    print(f"install-check: A (pid {os.getpid()}) sent {sent} time(s); B got {report.read_text()}", flush=True)
    await layer.close()


asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
EOF

say "two processes of the installed package, from $outside: B joins a group, A group_sends"
"$venv_python" receiver.py "$url" install-check "$outside/received" &
receiver_pid=$!
"$venv_python" sender.py "$url" install-check "$outside/received" || fail "process A"
wait "$receiver_pid" || fail "process B exited with $?"
receiver_pid=
say "ok"

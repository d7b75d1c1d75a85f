#!/usr/bin/env bash
# Prepare the benchmark's Python environment inside the reference root, so that every Python layer
# runs on the same interpreter as the reference layer (whose Python >= 3.13 the host may lack):
#
#   build/reference/root/opt/layers       a venv (the root's python3.13) with
#                                         bench/layers-requirements.txt: channels, channels_redis,
#                                         daphne, msgpack, cffi
#   build/reference/root/opt/layers-src   this tree's python/channels_nats, the library built by
#                                         `make lib`, its header and its compiled cffi module
#                                         (`make accelerator`), copied fresh on every run
#
# Needs the root (python/tests/interop/make-reference-env.sh) and root privileges (chroot, mount).
# The venv is made once; a changed requirements file makes it again. Exit status: 0 ready, 2 not
# possible here (the message says why).

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"

root="build/reference/root"
venv="$root/opt/layers"
src="$root/opt/layers-src"
lib="build/linux-amd64/libchannels_nats.so"
requirements="bench/layers-requirements.txt"
marker="$venv/.requirements"

say() { echo "layers-env: $*"; }
die() { echo "layers-env: cannot prepare the benchmark's Python environment: $*" >&2; exit 2; }

[ -x "$root/usr/bin/python3.13" ] || die "no reference root; run python/tests/interop/make-reference-env.sh first"
[ -f "$lib" ] || die "$lib is missing; run make lib first"
[ "$(id -u)" -eq 0 ] || die "this needs root (chroot, mount --bind)"

in_root() {
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        chroot "$root" "$@"
}

if ! cmp -s "$requirements" "$marker"; then
    # pip (and ensurepip, which venv runs) wants /proc; unmount only what this script mounted.
    mounted_proc=0
    cleanup() { if [ "$mounted_proc" -eq 1 ]; then umount "$root/proc" 2>/dev/null || umount -l "$root/proc" || true; fi; }
    trap cleanup EXIT
    mkdir -p "$root/proc"
    if ! mountpoint -q "$root/proc"; then
        mount --bind /proc "$root/proc" || die "mount --bind /proc $root/proc failed"
        mounted_proc=1
    fi
    say "venv /opt/layers (python3.13) with $requirements"
    rm -rf "$venv"
    in_root python3.13 -m venv /opt/layers || die "python3.13 -m venv /opt/layers failed in the root"
    cp "$requirements" "$root/opt/layers-requirements.txt"
    in_root /opt/layers/bin/pip install --disable-pip-version-check --no-cache-dir -q \
        -r /opt/layers-requirements.txt || die "pip install -r $requirements failed in the root (is PyPI reachable?)"
    cleanup
    trap - EXIT
    cp "$requirements" "$marker"
fi

rm -rf "$src"
mkdir -p "$src"
cp -r python/channels_nats "$src/"
cp "$lib" include/channels_nats.h "$src/"
# The compiled cffi module (make accelerator), when there is one: without it the layer runs in
# cffi's ABI mode, slower per call.
compiled="$(dirname "$lib")/_cffi.abi3.so"
if [ -f "$compiled" ]; then cp "$compiled" "$src/"; fi
pyver="$(in_root /opt/layers/bin/python -c 'import platform; print(platform.python_version())')"
say "ready: python $pyver in /opt/layers, this tree's channels_nats in /opt/layers-src"

#!/usr/bin/env bash
# Proves that a Linux wheel of channels-nats works once installed:
# 1. a fresh venv in WORK/venv (any previous one is deleted) installs the wheel, and its
#    dependencies (channels, msgpack, cffi) from PyPI;
# 2. build/nats-server runs on a free port, and from a directory outside the repository (python/
#    is not importable there) wheels/group_send_check.py checks that the installed package loads
#    the library it bundles, then has two processes of it group_send.
# CHANNELS_NATS_LIBRARY and PYTHONPATH are unset: only the installed package may count.
# --no-go: every directory that holds a `go` leaves PATH first, and the script proves that no Go
# is found: what a user without a Go toolchain has.
# Used by python/install-check.sh (a wheel built with Go) and wheels/check.sh (--no-go).
# Usage: wheels/install-run.sh [--no-go] WHEEL WORK
set -euo pipefail
me=install-run
# shellcheck source=wheels/lib.sh
source "$(dirname "$0")/lib.sh"
no_go=false
if [ "${1:-}" = --no-go ]; then
	no_go=true
	shift
fi
[ $# -eq 2 ] || fail "usage: wheels/install-run.sh [--no-go] WHEEL WORK"
wheel=$(readlink -f "$1")
work=$(readlink -f "$2")
python=$(command -v "${PYTHON:-python3}")
unset CHANNELS_NATS_LIBRARY CHANNELS_NATS_PREBUILT CHANNELS_NATS_PLATFORM_TAG PYTHONPATH

nats_pid=
outside=
cleanup() {
	if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; fi
	if [ -n "$outside" ]; then rm -rf "$outside"; fi
}
trap cleanup EXIT

if $no_go; then
	PATH=$(path_without_go)
	if command -v go >/dev/null; then fail "go is still found at $(command -v go)"; fi
	say "no Go on PATH (go: command not found)"
fi

say "fresh venv in $work/venv ($("$python" --version)); pip install $(basename "$wheel") and its dependencies"
rm -rf "$work/venv"
mkdir -p "$work"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"

start_nats_server "$work/nats-server.log"
say "nats-server on $nats_url; two processes of the installed package group_send"
outside=$(mktemp -d /tmp/install-run.XXXXXX)
cp "$root/wheels/group_send_check.py" "$outside/"
(cd "$outside" && "$work/venv/bin/python" group_send_check.py "$nats_url")
say "ok"

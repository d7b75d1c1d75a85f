# Shared by the wheel scripts, which source it after setting `me`, the name their lines start with.
# shellcheck shell=bash disable=SC2034,SC2154 # variables for the callers; they set me

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The five wheels: GOOS GOARCH platform-tag. The Linux libraries need glibc 2.17 (capi/build.sh
# pins it; Go itself needs a kernel no manylinux2010 system has); Go 1.26 needs macOS 12.
WHEEL_TARGETS=(
	"linux amd64 manylinux_2_17_x86_64.manylinux2014_x86_64"
	"linux arm64 manylinux_2_17_aarch64.manylinux2014_aarch64"
	"windows amd64 win_amd64"
	"darwin arm64 macosx_12_0_arm64"
	"darwin amd64 macosx_12_0_x86_64"
)
WHEEL_DIST=$root/build/wheels/dist
TOOLS_PYTHON=$root/build/wheels/tools/bin/python

# linux_tag GOARCH: the platform tag of the Linux wheel for GOARCH.
linux_tag() { printf '%s\n' "${WHEEL_TARGETS[@]}" | awk -v arch="$1" '$1 == "linux" && $2 == arch { print $3 }'; }

say() { echo "$me: $*"; }
fail() {
	echo "$me: FAILED: $*" >&2
	exit 1
}

# require_linux_x86_64: the cross compilers, qemu and Wine of these scripts are Debian's for x86-64.
require_linux_x86_64() {
	[ "$(uname -s)/$(uname -m)" = Linux/x86_64 ] || fail "runs on Linux x86-64, not $(uname -s)/$(uname -m)"
}

# compiled_target GOOS GOARCH: whether its wheel bundles the compiled cffi module (cp310-abi3; the
# others are py3-none and call the library through cffi's ABI mode). Only this machine's: the
# module is compiled against the Python headers here.
compiled_target() { [ "$1/$2" = linux/amd64 ]; }

# wheel_file TAG: the one wheel in build/wheels/dist with that platform tag.
wheel_file() {
	local found=("$WHEEL_DIST"/channels_nats-*-"$1".whl)
	if [ ! -f "${found[0]}" ] || [ "${#found[@]}" -ne 1 ]; then
		fail "not one wheel for $1 in $WHEEL_DIST: run make wheels"
	fi
	echo "${found[0]}"
}

# start_nats_server LOG: starts build/nats-server on a free loopback port (it picks the port and
# logs it) in the background; sets nats_pid and nats_url. The caller kills nats_pid when done.
start_nats_server() {
	[ -x "$root/build/nats-server" ] || fail "no build/nats-server: run make server"
	"$root/build/nats-server" -a 127.0.0.1 -p -1 >"$1" 2>&1 &
	nats_pid=$!
	local port='' _
	for _ in $(seq 100); do
		port=$(sed -n 's/.*Listening for client connections on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1")
		[ -z "$port" ] || break
		kill -0 "$nats_pid" 2>/dev/null || fail "nats-server exited: $(cat "$1")"
		sleep 0.1
	done
	[ -n "$port" ] || fail "nats-server logged no port within 10 s (log: $1)"
	nats_url=nats://127.0.0.1:$port
}

# list_dist: each file in build/wheels/dist with its size.
list_dist() {
	(cd "$WHEEL_DIST" && stat -c '%s %n' -- *) | awk '{ printf "  %6.2f MiB  %s\n", $1 / 1048576, $2 }'
}

# path_without_go: PATH less every directory that holds a `go`: what a user without Go has.
path_without_go() {
	local dir kept=() IFS=:
	for dir in $PATH; do
		[ -x "$dir/go" ] || kept+=("$dir")
	done
	echo "${kept[*]}"
}

#!/usr/bin/env bash
# make wheels-check: proves the wheels and the sdist that `make wheels` put in build/wheels/dist/.
# 1. Every wheel: wheels/check_wheel.py (name and tags, METADATA, contents, RECORD, library under
#    8 MiB; `auditwheel show` agrees with the Linux tags), then capi/check-lib.sh on the library
#    taken out of the wheel (format and CPU, exactly the header's cn_* exports, and per OS the
#    glibc baseline, the imported DLLs, or the install name, load commands and signature); for
#    macOS the minimum OS and the CPU of the dylib must be the tag's.
# 2. x86_64: the wheel installs into a fresh venv on a PATH without Go, and two processes of it
#    group_send through nats-server (wheels/install-run.sh --no-go).
# 3. aarch64: the C example and wheels/queue_check.c (the result queue signalled on a socket pair,
#    as every host uses it), built with the aarch64 cross gcc against the wheel's library, run
#    under qemu-aarch64 against nats-server.
# 4. Windows: the same two programs, built with mingw-w64 against the wheel's DLL, run under Wine
#    against nats-server, with a bcryptprimitives.dll stub built here (wheels/bcryptprimitives.c).
# 5. The sdist: with Go, pip builds a wheel of this machine from it that check_wheel.py accepts;
#    without Go, the build fails with the build hook's message naming Go.
# Installs qemu-user and wine64 when they are missing (wheels/tools.sh check).
set -euo pipefail
cd "$(dirname "$0")/.."
me=wheels-check
# shellcheck source=wheels/lib.sh
source wheels/lib.sh
SECONDS=0
work=build/wheels/check
wineprefix=$root/build/wheels/wine

nats_pid=
wineserver=
cleanup() {
	if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; fi
	# Only the wineserver of this check's own prefix.
	if [ -n "$wineserver" ]; then WINEPREFIX=$wineprefix "$wineserver" -k 2>/dev/null || true; fi
}
trap cleanup EXIT

# run_c NAME WANT COMMAND...: runs a C program (COMMAND NATS-URL) and wants the line WANT.
run_c() {
	local name=$1 want=$2 output
	shift 2
	if ! output=$(timeout 120 "$@" "$nats_url" 2>&1 | tr -d '\r'); then
		printf '%s\n' "$output" >&2
		fail "$(basename "$1") under $name did not succeed"
	fi
	printf '%s\n' "$output" | sed 's/^/    /'
	grep -qxF "$want" <<<"$output" || fail "$(basename "$1") under $name did not print '$want'"
}

# The two C programs: the example (connect, group_send and a pending receive through a result
# queue) and the result queue as an event loop drives it (wheels/queue_check.c: the socket-pair
# signal, take, then a taken result given back with cancel, a group message's three results in one
# take, and the close's statistics).
run_programs() { # NAME DIR COMMAND-PREFIX...
	local name=$1 dir=$2
	shift 2
	run_c "$name" "received: hello from C" "$@" "$dir/chat$exe"
	run_c "$name" "queue: ok" "$@" "$dir/queue_check$exe"
}

require_linux_x86_64
bash wheels/tools.sh check
[ -x "$TOOLS_PYTHON" ] || fail "no build/wheels/tools: run make wheels"
rm -rf "$work"
mkdir -p "$work"

say "[1/5] every wheel: tags, metadata, contents, RECORD, size; the library it bundles"
for target in "${WHEEL_TARGETS[@]}"; do
	read -r goos goarch tag <<<"$target"
	dir=$work/$goos-$goarch
	flags=()
	if [ "$goos" = linux ]; then flags+=(--auditwheel); fi
	if compiled_target "$goos" "$goarch"; then flags+=(--compiled); fi
	"$TOOLS_PYTHON" wheels/check_wheel.py "$(wheel_file "$tag")" --tag "$tag" --extract "$dir" "${flags[@]}"
	# check_wheel.py wrote the library, under the name the tag wants, and the header.
	lib=$(find "$dir" -maxdepth 1 -name '*channels_nats.*' ! -name '*.h')
	capi/check-lib.sh "$lib" "$goos" "$goarch"
	if [ "$goos" = darwin ]; then
		headers=$(llvm-objdump --macho --private-headers "$lib")
		minos=$(awk '/cmd LC_BUILD_VERSION/ { found = 1 } found && $1 == "minos" { print $2; exit }' <<<"$headers")
		cpu=$(llvm-objdump --macho --private-header "$lib" | awk '$1 ~ /^MH_MAGIC/ { print tolower($2) }')
		[[ $tag == "macosx_${minos/./_}_$cpu" ]] || fail "the dylib is for macOS $minos on $cpu, the wheel says $tag"
		say "$tag: the dylib is for macOS $minos on $cpu, as the tag says"
	fi
done

say "[2/5] x86_64: install the wheel with no Go on PATH; two processes group_send"
bash wheels/install-run.sh --no-go "$(wheel_file "$(linux_tag amd64)")" "$work/x86_64"

start_nats_server "$work/nats-server.log"
say "nats-server for the C example on $nats_url"

say "[3/5] aarch64: the C programs with the wheel's library under qemu-aarch64"
dir=$work/linux-arm64
exe=
for program in examples/c/chat.c wheels/queue_check.c; do
	aarch64-linux-gnu-gcc -std=c99 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Wall -Wextra -Werror -O2 -pthread \
		-I"$dir" "$program" -o "$dir/$(basename "$program" .c)" -L"$dir" -lchannels_nats -Wl,-rpath,"$root/$dir"
done
run_programs qemu-aarch64 "$dir" qemu-aarch64 -L /usr/aarch64-linux-gnu

say "[4/5] Windows: the C programs with the wheel's DLL under Wine"
dir=$work/windows-amd64
exe=.exe
# -static: the programs themselves need no MinGW DLL either (winpthreads is linked in).
x86_64-w64-mingw32-gcc -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -O2 \
	-I"$dir" examples/c/chat.c -o "$dir/chat.exe" "$dir/channels_nats.dll" -static -lpthread
x86_64-w64-mingw32-gcc -std=c99 -Wall -Wextra -Werror -O2 \
	-I"$dir" wheels/queue_check.c -o "$dir/queue_check.exe" "$dir/channels_nats.dll" -static -lws2_32
wine=$(command -v wine64 || command -v wine || echo /usr/lib/wine/wine64)
wineserver=$(command -v wineserver || echo /usr/lib/wine/wineserver)
export WINEPREFIX=$wineprefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
if [ ! -d "$wineprefix/drive_c/windows/system32" ]; then
	say "making the Wine prefix build/wheels/wine"
	"$wine" wineboot --init >"$work/wineboot.log" 2>&1 || fail "wineboot (log: $work/wineboot.log)"
fi
x86_64-w64-mingw32-gcc -std=c99 -Wall -Wextra -Werror -O2 -shared -o "$wineprefix/drive_c/windows/system32/bcryptprimitives.dll" \
	wheels/bcryptprimitives.c -ladvapi32
say "Wine $("$wine" --version 2>/dev/null || echo '(version unknown)'), the stub bcryptprimitives.dll in its system32"
run_programs Wine "$dir" "$wine"

say "[5/5] the sdist: it builds with Go, and fails clearly without it"
sdist=("$WHEEL_DIST"/channels_nats-*.tar.gz)
[ -f "${sdist[0]}" ] || fail "no sdist in $WHEEL_DIST: run make wheels"
"$TOOLS_PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/sdist" "${sdist[0]}"
# Built here with Go, a C compiler and Python's headers: the wheel bundles the compiled cffi module.
"$TOOLS_PYTHON" wheels/check_wheel.py "$work/sdist/channels_nats-"*"-cp310-abi3-$(linux_tag amd64).whl" \
	--tag "$(linux_tag amd64)" --compiled
log=$work/sdist-without-go.log
if (PATH=$(path_without_go) && "$TOOLS_PYTHON" -m pip wheel --disable-pip-version-check --no-deps \
	-w "$work/sdist-without-go" "${sdist[0]}") >"$log" 2>&1; then
	fail "the sdist built a wheel with no Go on PATH"
fi
message=$(grep -o 'channels-nats: building from source needs Go[^;]*' "$log" | head -n 1) ||
	fail "without Go the sdist failed without naming Go (log: $log)"
say "without Go, pip says: $message"

say "all checks passed in ${SECONDS} s; the wheels and the sdist:"
list_dist

#!/usr/bin/env bash
# The C harness of the channels-nats C ABI, against a real nats-server (make test-c).
#
#   1. builds into build/ctest/: abi_check and fork_check (linked against the library in
#      build/<goos>-<goarch>/, found through -rpath; both include queue_host.h, the host side of a
#      result queue: a pipe, poll(), cn_queue_take), the header as C99 and as C++;
#   2. starts build/nats-server on a free loopback port (stopped on exit);
#   3. runs abi_check, fork_check, and abi_check again under valgrind (errors and
#      definitely/indirectly lost memory), plus a valgrind leak self-test;
#   4. ends with "N passed, M failed" summed over every run; exits non-zero if anything failed.
#
# Needs: make lib server (the Makefile's test-c target does it), gcc, g++, go, binutils, python3 or
# bash /dev/tcp, valgrind (installed with apt-get when missing: CI is a fresh Debian as root).
#
# Why valgrind runs against a "symbolized twin" of the library: the shipped library is linked with
# -s -w, so valgrind shows every Go frame as "???" and the suppressions could not tell the Go
# runtime from capi's C code (cn_*, cngo_*, bridge_*). run.sh links a second copy from the same
# sources with the same flags as capi/build.sh except -s (it keeps the symbol table; -w still drops
# DWARF, which valgrind 3.19 cannot read anyway), then checks that every loaded section of the twin
# is byte-identical to the shipped library (only the build-id notes differ): valgrind runs the very
# machine code that ships, with names. If build.sh's flags change, that check fails: update the
# go build line below. (valgrind can run the Go runtime here, so AddressSanitizer is not needed.)
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$PWD
go=${GO:-go}
goos=$($go env GOOS)
goarch=$($go env GOARCH)
plat=build/$goos-$goarch
out=build/ctest
lib=$plat/libchannels_nats.so
twin_dir=$out/symbolized

total_passed=0
total_failed=0

say() { echo "ctest: $*"; }

# A check that run.sh decides itself: prints the usual line and counts it.
verdict() { # name ok(0/1) [detail]
	if [ "$2" = 1 ]; then
		echo "ok   $1"
		total_passed=$((total_passed + 1))
	else
		echo "FAIL $1: ${3:-}"
		total_failed=$((total_failed + 1))
	fi
}

finish() {
	echo "$total_passed passed, $total_failed failed"
	if [ "$total_failed" -eq 0 ]; then
		exit 0
	fi
	exit 1
}

# Adds the "N passed, M failed" line of a program's output to the totals; a run that printed none
# (it crashed or hung) counts as one failure.
add_summary() { # output-file exit-status name
	local line p f
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1 || true)
	if [ -z "$line" ]; then
		verdict "$3" 0 "no summary line (exit status $2)"
		return
	fi
	p=${line%% passed*}
	f=${line#*, }
	f=${f%% failed}
	total_passed=$((total_passed + p))
	total_failed=$((total_failed + f))
	if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then
		verdict "$3" 0 "exit status $2 although no check failed"
	fi
}

if [ ! -f "$lib" ] || [ ! -f "$plat/channels_nats.h" ] || [ ! -x build/nats-server ]; then
	echo "ctest: $lib, $plat/channels_nats.h or build/nats-server is missing: run make lib server" >&2
	verdict build 0 "library, header or nats-server missing"
	finish
fi

# ---- build -------------------------------------------------------------------------------
say building
mkdir -p "$out" "$twin_dir"
cflags=(-std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -pedantic -g -I"$plat")
link=(-L"$plat" -lchannels_nats -Wl,-rpath,"$root/$plat" -pthread)
build_ok=1
gcc "${cflags[@]}" capi/ctest/abi_check.c -o "$out/abi_check" "${link[@]}" || build_ok=0
gcc "${cflags[@]}" capi/ctest/fork_check.c -o "$out/fork_check" "${link[@]}" || build_ok=0
verdict build "$build_ok" "abi_check.c or fork_check.c did not compile (see above)"

if gcc -std=c99 -Wall -Wextra -Werror -pedantic -I"$plat" -c capi/ctest/header_c99.c \
	-o "$out/header_c99.o"; then
	verdict header_c99 1
else
	verdict header_c99 0 "the header alone does not compile as C99 -pedantic"
fi
if g++ -std=c++11 -Wall -Wextra -Werror -pedantic -I"$plat" -c capi/ctest/header_cxx.cpp \
	-o "$out/header_cxx.o" &&
	g++ "$out/header_cxx.o" -o "$out/header_cxx" -L"$plat" -lchannels_nats \
		-Wl,-rpath,"$root/$plat" &&
	"$out/header_cxx"; then
	verdict header_cxx 1
else
	verdict header_cxx 0 "the header does not compile, link or run as C++11"
fi
if [ "$build_ok" = 0 ]; then
	finish
fi

# ---- nats-server ---------------------------------------------------------------------------
free_port() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
		return
	fi
	local p i
	for i in $(seq 1 50); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	return 1
}

port=$(free_port)
url=nats://127.0.0.1:$port
build/nats-server -a 127.0.0.1 -p "$port" >"$out/nats-server.log" 2>&1 &
ns_pid=$!
stop_server() {
	kill "$ns_pid" 2>/dev/null || true
	wait "$ns_pid" 2>/dev/null || true
}
trap stop_server EXIT

up=0
for _ in $(seq 1 100); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		up=1
		break
	fi
	if ! kill -0 "$ns_pid" 2>/dev/null; then
		break
	fi
	sleep 0.1
done
if [ "$up" = 0 ]; then
	cat "$out/nats-server.log" >&2 || true
	verdict nats_server 0 "build/nats-server did not accept connections on port $port"
	finish
fi
say "nats-server on $url"

# ---- the runs ------------------------------------------------------------------------------
say abi_check
status=0
timeout -k 5 90 "$out/abi_check" "$url" | tee "$out/abi_check.out" || status=$?
add_summary "$out/abi_check.out" "$status" abi_check_run

say fork_check
status=0
timeout -k 5 60 "$out/fork_check" "$url" | tee "$out/fork_check.out" || status=$?
add_summary "$out/fork_check.out" "$status" fork_check_run

say "abi_check under valgrind"
if ! command -v valgrind >/dev/null 2>&1; then
	say "installing valgrind"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y valgrind >/dev/null || { apt-get update >/dev/null && apt-get install -y valgrind >/dev/null; } || true
fi
if ! command -v valgrind >/dev/null 2>&1; then
	verdict valgrind 0 "valgrind is not installed and apt-get install -y valgrind failed"
	finish
fi

# The symbolized twin of the library (see the top of this file): capi/build.sh's go build without -s.
case "$goos/$goarch" in
linux/amd64) pin=x86_64 ;;
linux/arm64) pin=aarch64 ;;
*) pin= ;;
esac
twin_ok=1
CGO_ENABLED=1 CGO_CFLAGS="-O2 -g${pin:+ -include $root/capi/glibc_pin_$pin.h}" \
	$go build -tags netgo -buildmode=c-shared -trimpath \
	-ldflags "-w -extldflags '-Wl,--version-script=$root/capi/exports.map'" \
	-o "$twin_dir/libchannels_nats.so" ./capi || twin_ok=0
rm -f "$twin_dir/libchannels_nats.h"
if [ "$twin_ok" = 1 ]; then
	differ=
	for section in $(readelf -SW "$lib" | awk '/^ *\[ *[0-9]+\] \./ {
			for (i = 1; i <= NF; i++) if ($i ~ /^\./) { name = $i; flags = $(i + 6); break }
			if (flags ~ /A/ && name !~ /^\.note\./) print name }'); do
		objcopy -O binary --only-section="$section" "$lib" "$out/section.shipped"
		objcopy -O binary --only-section="$section" "$twin_dir/libchannels_nats.so" "$out/section.twin"
		cmp -s "$out/section.shipped" "$out/section.twin" || differ="$differ $section"
	done
	rm -f "$out/section.shipped" "$out/section.twin"
	if [ -n "$differ" ]; then
		twin_ok=0
		verdict valgrind_twin_identical 0 "sections differ from $lib:$differ (capi/build.sh's flags changed? update run.sh)"
	else
		verdict valgrind_twin_identical 1
	fi
else
	verdict valgrind_twin_identical 0 "go build of the symbolized twin failed"
fi
if [ "$twin_ok" = 1 ]; then
	gcc "${cflags[@]}" capi/ctest/abi_check.c -o "$out/abi_check_vg" -L"$twin_dir" -lchannels_nats \
		-Wl,-rpath,"$root/$twin_dir" -pthread

	# GOGC=off: a garbage collection under valgrind made rare false reports (the write barrier,
	# and C reading Go memory the runtime had just returned and reused) and stalled the process
	# long enough for a 20 s connect to time out. The run is short; without collections it is
	# the same every time. GODEBUG=asyncpreemptoff=1: no preemption signals. valgrind takes a
	# return from a signal handler on Go's signal stack, near the goroutine stacks, for a stack
	# that shrank and grew, and marks what lies between as uninitialised: with the library's
	# spare Ps (more threads, more signals) it reported the status of a result as uninitialised
	# in 5 of 26 runs, always at the same read, and in none of 14 without the signals.
	# --fair-sched: no thread of the Go runtime spinning in valgrind's lock starves the others.
	vg=(env GOGC=off GODEBUG=asyncpreemptoff=1 valgrind --error-exitcode=3 --leak-check=full --show-leak-kinds=definite,indirect
		--errors-for-leak-kinds=definite,indirect --suppressions=capi/ctest/go-runtime.supp
		--num-callers=40 --error-limit=no --fair-sched=yes)
	status=0
	CTEST_SCALE=3 CTEST_TIMEOUT=120 timeout -k 5 150 "${vg[@]}" --log-file="$out/valgrind.log" \
		"$out/abi_check_vg" "$url" | tee "$out/abi_check_vg.out" || status=$?
	add_summary "$out/abi_check_vg.out" 0 abi_check_valgrind_run
	grep -E 'ERROR SUMMARY|definitely lost:|indirectly lost:' "$out/valgrind.log" | sed 's/^==[0-9]*== /valgrind: /' || true
	# exit status 3 is valgrind's (errors or leaks); another non-zero status is abi_check's own
	# failures, already counted through its summary line
	if [ "$status" != 3 ] && grep -q 'ERROR SUMMARY: 0 errors' "$out/valgrind.log"; then
		verdict valgrind_clean 1
	else
		# the reports themselves: everything between the header and the heap summary
		sed -n '/^==[0-9]*== Command:/,/HEAP SUMMARY/p' "$out/valgrind.log" | grep -v 'client switching stacks\|to suppress, use: --max-stackframe\|further instances of this message\|Warning: set address range perms' | head -n 200 || true
		grep -A 30 'definitely lost in\|indirectly lost in' "$out/valgrind.log" | head -n 100 || true
		verdict valgrind_clean 0 "valgrind exit status $status (3: errors or leaks; see $out/valgrind.log)"
	fi

	# The leak self-test: a cn_new_channel name left unfreed on purpose must be reported as
	# definitely lost, or the suppressions hide what the caller must free.
	status=0
	CTEST_TIMEOUT=60 timeout -k 5 90 "${vg[@]}" --log-file="$out/valgrind-selftest.log" \
		"$out/abi_check_vg" "$url" --leak-selftest >"$out/selftest.out" 2>&1 || status=$?
	if [ "$status" = 3 ] && grep -q 'definitely lost: [1-9]' "$out/valgrind-selftest.log"; then
		verdict valgrind_leak_selftest 1
	else
		verdict valgrind_leak_selftest 0 "an unfreed cn_new_channel name was not reported (exit $status, see $out/valgrind-selftest.log)"
	fi
fi

finish

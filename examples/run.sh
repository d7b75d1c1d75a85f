#!/usr/bin/env bash
# examples/run.sh - builds the C and the Rust example and runs both against a fresh nats-server.
#
#   make lib server && bash examples/run.sh
#
# Outputs go to build/examples/. Exits non-zero when a build fails, an example fails, or an
# example does not print the text it sent ("received: hello from C" / "received: hello from Rust").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS=0
step() { printf '==> %s\n' "$*"; }
die() { printf 'examples/run.sh: FAIL: %s\n' "$*" >&2; exit 1; }
trap 'printf "examples/run.sh: FAIL: line %s: %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

# The directory `make lib` writes: build/<goos>-<goarch>/.
case "$(uname -s)" in
    Linux) os=linux ext=so ;;
    Darwin) os=darwin ext=dylib ;;
    *) die "unsupported OS $(uname -s)" ;;
esac
case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "unsupported CPU $(uname -m)" ;;
esac
libdir=build/$os-$arch
lib=$PWD/$libdir/libchannels_nats.$ext
out=build/examples
[[ -f $lib && -f $libdir/channels_nats.h ]] || die "no $libdir/libchannels_nats.$ext: run 'make lib' first"
[[ -x build/nats-server ]] || die "no build/nats-server: run 'make server' first"

if ! command -v cargo >/dev/null && [[ -x $HOME/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi
command -v cargo >/dev/null || die "cargo is not installed"
mkdir -p "$out"

step "build the C example: $out/chat-c"
"${CC:-gcc}" -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -O2 -pthread \
    -I"$libdir" examples/c/chat.c -o "$out/chat-c" \
    -L"$libdir" -lchannels_nats -Wl,-rpath,"$PWD/$libdir"

step "build the Rust example: $out/rust-target/release/chat"
CARGO_TARGET_DIR=$out/rust-target cargo build --release --locked --quiet \
    --manifest-path examples/rust/Cargo.toml

# -p -1: the server picks a free port and logs it; no race with other programs for a port.
step "start nats-server on a free port"
log=$out/nats-server.log
build/nats-server -a 127.0.0.1 -p -1 >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
port=
for _ in $(seq 100); do
    kill -0 "$server" 2>/dev/null || die "nats-server exited: $(cat "$log")"
    port=$(sed -n 's/.*Listening for client connections on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log")
    if [[ -n $port ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        break
    fi
    port=
    sleep 0.1
done
[[ -n $port ]] || die "nats-server did not accept connections within 10 s (log: $log)"
url=nats://127.0.0.1:$port
step "nats-server accepts connections at $url"

# run_example NAME TEXT COMMAND...: runs COMMAND URL and checks it printed "received: TEXT".
run_example() {
    local name=$1 want=$2 output
    shift 2
    step "run the $name example"
    if ! output=$("$@" "$url"); then
        printf '%s\n' "$output"
        die "the $name example exited non-zero"
    fi
    printf '%s\n' "$output" | sed 's/^/    /'
    grep -qxF "received: $want" <<<"$output" || die "the $name example did not print 'received: $want'"
    step "$name example OK"
}
run_example C "hello from C" "$out/chat-c"
run_example Rust "hello from Rust" env CN_LIB="$lib" "$out/rust-target/release/chat"

step "all examples passed in ${SECONDS} s"

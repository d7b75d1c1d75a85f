#!/usr/bin/env bash
# Builds the C shared library for GOOS/GOARCH (default: this machine) into build/<goos>-<goarch>/:
#   libchannels_nats.so   the library (stripped, only cn_* exported, glibc 2.17 baseline)
#   channels_nats.h       the public header (a copy of include/channels_nats.h)
#   cgo/libchannels_nats.h  the header cgo generates, kept for the header consistency test
# Usage: capi/build.sh [goos goarch]
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
goos=${1:-$($go env GOOS)}
goarch=${2:-$($go env GOARCH)}
out=build/$goos-$goarch

case "$goos/$goarch" in
linux/amd64) pin=x86_64 ;;
linux/arm64) pin=aarch64 ;;
*)
	echo "capi/build.sh: $goos/$goarch is not built here yet (linux/amd64 and linux/arm64 are)" >&2
	exit 2
	;;
esac

mkdir -p "$out/cgo"
echo "lib: building $out/libchannels_nats.so"
CGO_ENABLED=1 GOOS=$goos GOARCH=$goarch \
	CGO_CFLAGS="-O2 -g -include $PWD/capi/glibc_pin_$pin.h" \
	$go build -tags netgo -buildmode=c-shared -trimpath \
	-ldflags "-s -w -extldflags '-Wl,--version-script=$PWD/capi/exports.map'" \
	-o "$out/libchannels_nats.so" ./capi
mv "$out/libchannels_nats.h" "$out/cgo/libchannels_nats.h"
cp include/channels_nats.h "$out/channels_nats.h"
capi/check-lib.sh "$out/libchannels_nats.so"

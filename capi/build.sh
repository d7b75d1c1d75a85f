#!/usr/bin/env bash
# Builds the C shared library for GOOS/GOARCH (default: this machine) into build/<goos>-<goarch>/:
#   the library            libchannels_nats.so (linux), channels_nats.dll (windows) or
#                          libchannels_nats.dylib (darwin); stripped, exporting only the cn_*
#                          functions of include/channels_nats.h
#   channels_nats.h        the public header (a copy of include/channels_nats.h)
#   cgo/libchannels_nats.h the header cgo generates, kept for the header consistency test
# Targets: linux/amd64 and linux/arm64 (glibc 2.17 baseline), windows/amd64, darwin/arm64 and
# darwin/amd64 (macOS 12). Another target than this machine's is cross-built from Linux: the other
# Linux CPU with Debian's cross gcc, Windows with Debian's mingw-w64, macOS with zig as the C
# compiler and linker (ZIG names it; `make wheels` installs all of them, see wheels/tools.sh).
# Usage: capi/build.sh [goos goarch]
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
goos=${1:-$($go env GOOS)}
goarch=${2:-$($go env GOARCH)}
out=build/$goos-$goarch
host=$($go env GOHOSTOS)/$($go env GOHOSTARCH)

fail() {
	echo "capi/build.sh: $*" >&2
	exit 1
}

# need COMMAND PACKAGE: a cross compiler must be installed (Debian package names).
need() {
	command -v "$1" >/dev/null || fail "$goos/$goarch needs $1: apt-get install $2 (make wheels installs it)"
}

case $goarch in
amd64) cpu=x86_64 ;;
arm64) cpu=aarch64 ;;
*) cpu=$goarch ;;
esac
mkdir -p "$out/cgo"
cflags="-O2 -g"
tags=
cc=
case "$goos/$goarch" in
linux/amd64 | linux/arm64)
	library=libchannels_nats.so
	# The pin header binds glibc symbols to their oldest versions; netgo keeps glibc's resolver
	# (GLIBC_2.34) out. The version script keeps every symbol but cn_* local.
	cflags+=" -include $PWD/capi/glibc_pin_$cpu.h"
	tags=netgo
	extldflags="-Wl,--version-script=$PWD/capi/exports.map"
	if [ "$host" != "$goos/$goarch" ]; then
		cc=$cpu-linux-gnu-gcc
		need "$cc" "gcc-${cpu//_/-}-linux-gnu libc6-dev-$goarch-cross"
	fi
	;;
windows/amd64)
	library=channels_nats.dll
	# The Go linker hands ld a .def file exporting every //export function (the internal cngo_*
	# ones too) unless -Wl,--export-all-symbols is among the flags. Given that flag, it writes
	# none; --exclude-all-symbols then cancels the export of everything, and our own .def file,
	# made from the header, exports exactly the cn_* functions.
	{
		echo "EXPORTS"
		capi/exports.sh
	} >"$out/exports.def"
	def=$PWD/$out/exports.def
	if [ "${host%/*}" = windows ]; then
		def=$(cd "$out" && pwd -W)/exports.def # Git Bash: the linker wants C:/..., not /c/...
	fi
	# -static-libgcc: the thread-local variables of wrappers.c would otherwise import libgcc's DLL.
	extldflags="-Wl,--export-all-symbols -Wl,--exclude-all-symbols $def -static-libgcc"
	if [ "${host%/*}" != windows ]; then
		# The -win32 variant links no MinGW thread or runtime DLL: the DLL needs only KERNEL32
		# and msvcrt.
		cc=x86_64-w64-mingw32-gcc
		need "$cc" gcc-mingw-w64-x86-64-win32
	fi
	;;
darwin/arm64 | darwin/amd64)
	library=libchannels_nats.dylib
	# Apple's linker honours the export list. zig's, used to cross-link, ignores it, so all C
	# symbols but the header's (CN_EXTERN is visibility default) are hidden as well.
	capi/exports.sh | sed 's/^/_/' >"$out/exports.list"
	cflags+=" -fvisibility=hidden"
	extldflags="-Wl,-install_name,@rpath/$library -Wl,-exported_symbols_list,$PWD/$out/exports.list"
	if [ "${host%/*}" != darwin ]; then
		[ -n "${ZIG:-}" ] || fail "$goos/$goarch is cross-linked with zig: set ZIG to the zig executable (make wheels installs ziglang into build/wheels/tools)"
		[ -f wheels/zigcc.sh ] || fail "cross-linking for macOS needs wheels/zigcc.sh from the repository"
		stubs=$PWD/build/macos-sdk-stubs
		bash wheels/macos-stubs.sh "$stubs"
		# macOS 12 is the oldest that Go 1.26 supports; the wheel tag says the same (macosx_12_0).
		cc="$PWD/wheels/zigcc.sh $cpu-macos.12.0 $stubs"
	fi
	;;
*)
	fail "$goos/$goarch is not a target (linux/amd64, linux/arm64, windows/amd64, darwin/arm64, darwin/amd64 are)"
	;;
esac

cc_name=${cc%% *}
echo "lib: building $out/$library${cc:+ (CC=${cc_name##*/})}"
env CGO_ENABLED=1 GOOS="$goos" GOARCH="$goarch" CGO_CFLAGS="$cflags" ${cc:+"CC=$cc"} \
	"$go" build ${tags:+-tags $tags} -buildmode=c-shared -trimpath \
	-ldflags "-s -w -extldflags '$extldflags'" \
	-o "$out/$library" ./capi
mv "$out/${library%.*}.h" "$out/cgo/libchannels_nats.h"
cp include/channels_nats.h "$out/channels_nats.h"
# The checks read PE and Mach-O files with Debian's llvm tools; a native build on Windows or
# macOS (an sdist installed there) has none of them.
if [ "${host%/*}" = linux ]; then
	capi/check-lib.sh "$out/$library" "$goos" "$goarch"
fi

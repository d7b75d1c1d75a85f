#!/usr/bin/env bash
# Checks a built library for its target:
#   all      the file format and CPU are the target's, and it exports exactly the functions
#            include/channels_nats.h declares (capi/exports.sh);
#   linux    no glibc symbol version newer than 2.17 (the manylinux_2_17 baseline);
#   windows  imports only KERNEL32.dll and msvcrt.dll (no MinGW runtime DLL to ship with it);
#   darwin   install name @rpath/libchannels_nats.dylib, loads only macOS system libraries, each
#            once, and on arm64 carries a code signature (arm64 Macs run no unsigned code); it
#            prints the minimum macOS version, which the wheel check compares with the wheel's tag.
# ELF is read with binutils; PE and Mach-O with llvm-objdump (Debian's llvm; make wheels installs it).
# Usage: capi/check-lib.sh LIBRARY GOOS GOARCH
set -euo pipefail
lib=$1 goos=$2 goarch=$3
[ -f "$lib" ] || {
	echo "check-lib: $lib: no such file" >&2
	exit 1
}
path=$(readlink -f "$lib") # the tools read it from the repository root
cd "$(dirname "$0")/.."

fail() {
	echo "check-lib: $lib: $*" >&2
	exit 1
}

# same_exports EXPORTED: the exported functions must be the header's, no more, no fewer.
same_exports() {
	local declared
	declared=$(capi/exports.sh)
	if [ "$declared" != "$1" ]; then
		echo "check-lib: $lib: the exported functions differ from the header's (< header, > library):" >&2
		diff <(echo "$declared") <(echo "$1") >&2 || true
		exit 1
	fi
}

# field TEXT PATTERN: the first line of TEXT matching PATTERN, without the PATTERN.
field() { sed -n "s/^ *$2 *//p" <<<"$1" | head -n 1; }

case $goos/$goarch in
linux/amd64) want=X86-64 ;;
linux/arm64) want=AArch64 ;;
windows/amd64) want=coff-x86-64 ;;
darwin/amd64) want=X86_64 ;;
darwin/arm64) want=ARM64 ;;
*) fail "unknown target $goos/$goarch" ;;
esac
if [ "$goos" != linux ] && ! command -v llvm-objdump >/dev/null; then
	fail "reading a $goos library needs llvm-objdump: apt-get install llvm (make wheels installs it)"
fi

case $goos in
linux)
	machine=$(readelf -h "$path" | sed -n 's/^ *Machine: *//p')
	[[ $machine == *"$want" ]] || fail "is an ELF file for $machine, not $goarch"
	same_exports "$(nm -D --defined-only "$path" | awk '$2 == "T" { print $3 }' | sort)"
	others=$(nm -D --defined-only "$path" | awk '$2 != "T" && $3 !~ /^(_init|_fini)$/ { print $3 }')
	[ -z "$others" ] || fail "unexpected exported symbols: $(paste -sd" " - <<<"$others")"
	newest=$(objdump -T "$path" | grep -oE 'GLIBC_[0-9.]+' | sed 's/GLIBC_//' | sort -V | tail -n 1)
	if [ "$(printf '%s\n2.17\n' "$newest" | sort -V | tail -n 1)" != "2.17" ]; then
		objdump -T "$path" | grep -E "GLIBC_$newest" >&2
		fail "needs GLIBC_$newest, newer than the 2.17 baseline"
	fi
	detail="ELF $machine, newest glibc symbol version $newest"
	;;
windows)
	format=$(llvm-objdump -f "$path" | sed -n 's/.*file format //p')
	[ "$format" = "$want" ] || fail "is a $format file, not a Windows $goarch DLL"
	headers=$(llvm-objdump -p "$path")
	same_exports "$(sed -n '/^Export Table:/,/^$/p' <<<"$headers" | awk '$1 ~ /^[0-9]+$/ && $2 ~ /^0x/ { print $3 }' | sort)"
	imports=$(sed -n 's/^ *DLL Name: *//p' <<<"$headers" | sort -u)
	unexpected=$(grep -vixE 'KERNEL32\.dll|msvcrt\.dll' <<<"$imports" || true)
	[ -z "$unexpected" ] || fail "imports DLLs that are not part of Windows: $unexpected"
	detail="PE $format, imports $(paste -sd' ' - <<<"$imports")"
	;;
darwin)
	cpu=$(llvm-objdump --macho --private-header "$path" | awk '$1 ~ /^MH_MAGIC/ { print $2 " " $5 }')
	[ "$cpu" = "$want DYLIB" ] || fail "is a Mach-O '$cpu' file, not a $want dylib"
	# zig's linker ignores export lists (capi/build.sh), so besides the cn_* functions the Go
	# runtime's own exported glue (crosscall1, crosscall2, _cgo_panic, _cgo_topofstack) and the
	# two symbols every zig-linked dylib exports stay visible. Apple's linker leaves only cn_*.
	exported=$(llvm-objdump --macho --exports-trie "$path" | awk '$1 ~ /^0x/ { print substr($2, 2) }' | sort)
	same_exports "$(grep '^cn_' <<<"$exported" || true)"
	others=$(grep -vxE 'cn_.*|crosscall[12]|_cgo_panic|_cgo_topofstack|_mh_dylib_header|__dso_handle' <<<"$exported" || true)
	[ -z "$others" ] || fail "unexpected exported symbols: $(paste -sd" " - <<<"$others")"
	commands=$(llvm-objdump --macho --private-headers "$path")
	id=$(grep -A2 'cmd LC_ID_DYLIB' <<<"$commands" | sed -n 's/^ *name \(.*\) (offset.*/\1/p')
	[ "$id" = "@rpath/libchannels_nats.dylib" ] || fail "install name '$id', not @rpath/libchannels_nats.dylib"
	loads=$(grep -A2 'cmd LC_LOAD_DYLIB' <<<"$commands" | sed -n 's/^ *name \(.*\) (offset.*/\1/p')
	repeated=$(sort <<<"$loads" | uniq -d)
	[ -z "$repeated" ] || fail "loads the same library more than once: $repeated"
	unexpected=$(grep -vE '^(/usr/lib/libSystem\.B\.dylib|/usr/lib/libresolv\.9\.dylib|/System/Library/Frameworks/(CoreFoundation|Security)\.framework/Versions/A/(CoreFoundation|Security))$' <<<"$loads" || true)
	[ -z "$unexpected" ] || fail "loads libraries that are not part of macOS: $unexpected"
	if [ "$goarch" = arm64 ] && ! grep -q 'cmd LC_CODE_SIGNATURE' <<<"$commands"; then
		fail "has no code signature"
	fi
	build=$(grep -A4 'cmd LC_BUILD_VERSION' <<<"$commands")
	[ "$(field "$build" platform)" = macos ] || fail "is not built for macOS: $build"
	detail="Mach-O $want, minimum macOS $(field "$build" minos), loads $(paste -sd' ' - <<<"$loads" | sed 's|[^ ]*/||g')"
	;;
esac
size=$(stat -c %s "$path" | awk '{ printf "%.2f MiB", $1 / 1048576 }')
echo "check-lib: $lib: $detail; exports the $(capi/exports.sh | wc -l) cn_* functions of the header; $size"

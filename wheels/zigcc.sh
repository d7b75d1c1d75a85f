#!/usr/bin/env bash
# The C compiler and linker that capi/build.sh gives Go (as CC) to cross-build the macOS library
# on Linux: `zig cc` for one macOS target, finding CoreFoundation, Security and libresolv in the
# stubs of wheels/macos-stubs.sh (zig ships only libSystem).
# Usage (as CC): wheels/zigcc.sh ZIG-TARGET STUBS-DIR CC-ARGS...  (e.g. aarch64-macos.12.0)
# ZIG names the zig executable (make wheels installs the ziglang package from PyPI).
set -euo pipefail
target=$1 stubs=$2
shift 2
# Go passes `-framework CoreFoundation` once for every package that asks for it; zig, unlike
# Apple's linker, would then write the same LC_LOAD_DYLIB twice. Keep the first of each.
args=()
frameworks=" "
while (($#)); do
	if [[ $1 == -framework && $# -ge 2 ]]; then
		if [[ $frameworks != *" $2 "* ]]; then
			args+=(-framework "$2")
			frameworks+="$2 "
		fi
		shift 2
		continue
	fi
	args+=("$1")
	shift
done
exec "${ZIG:?ZIG must name the zig executable}" cc -target "$target" -F"$stubs/Frameworks" -L"$stubs/lib" "${args[@]}"

#!/usr/bin/env bash
# Writes the minimal macOS SDK stubs that zig needs to link the library for macOS, into DIR:
#   Frameworks/CoreFoundation.framework/CoreFoundation.tbd
#   Frameworks/Security.framework/Security.tbd
#   lib/libresolv.tbd
# A .tbd file (a text "TAPI" stub) names a system library and the symbols it exports; the linker
# records the library as a load command and binds the symbols to it. Go's linker asks for these
# three libraries (crypto/x509 for the system certificate roots, the DNS resolver), and zig ships
# only libSystem. The symbol lists are those the Go sources of this toolchain import from each
# library (their cgo_import_dynamic lines), so they follow a Go upgrade; no Apple SDK file is used.
# Usage: wheels/macos-stubs.sh DIR
set -euo pipefail
dir=${1:?usage: wheels/macos-stubs.sh DIR}
goroot=$(${GO:-go} env GOROOT)

# stub INSTALL-NAME FILE: the .tbd of the library INSTALL-NAME with every symbol Go imports from it.
stub() {
	local symbols
	symbols=$(grep -rhoE "cgo_import_dynamic [A-Za-z0-9_]+ [A-Za-z0-9_]+ \"$1\"" "$goroot/src" |
		awk '{ print "_" $3 }' | sort -u | paste -sd, - | sed 's/,/, /g')
	if [ -z "$symbols" ]; then
		echo "wheels/macos-stubs.sh: Go imports nothing from $1 any more; update this script" >&2
		exit 1
	fi
	mkdir -p "$(dirname "$2")"
	cat >"$2" <<TBD
--- !tapi-tbd
tbd-version: 4
targets: [ x86_64-macos, arm64-macos ]
install-name: '$1'
exports:
  - targets: [ x86_64-macos, arm64-macos ]
    symbols: [ $symbols ]
...
TBD
}

stub /System/Library/Frameworks/CoreFoundation.framework/Versions/A/CoreFoundation \
	"$dir/Frameworks/CoreFoundation.framework/CoreFoundation.tbd"
stub /System/Library/Frameworks/Security.framework/Versions/A/Security \
	"$dir/Frameworks/Security.framework/Security.tbd"
stub /usr/lib/libresolv.9.dylib "$dir/lib/libresolv.tbd"

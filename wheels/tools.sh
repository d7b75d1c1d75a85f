#!/usr/bin/env bash
# Installs what building or checking the wheels needs, and only what is missing:
#   build  Debian: the aarch64 cross gcc and libc, mingw-w64 (-win32), llvm (llvm-objdump reads
#          PE and Mach-O); PyPI: wheels/requirements.txt (zig, auditwheel, hatchling, build) in a
#          venv at build/wheels/tools
#   check  Debian: qemu-user (runs the aarch64 library), wine64 (runs the Windows DLL)
# Debian packages need root (or sudo); apt-get update runs only when a package is missing.
# Usage: wheels/tools.sh build|check
set -euo pipefail
cd "$(dirname "$0")/.."
tools=build/wheels/tools

say() { echo "wheels/tools.sh: $*"; }
fail() {
	echo "wheels/tools.sh: $*" >&2
	exit 1
}

# apt_install PACKAGE...: installs the packages that are not installed yet.
apt_install() {
	local missing=() package sudo=
	for package in "$@"; do
		dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
	done
	if [ "${#missing[@]}" -eq 0 ]; then
		say "Debian packages present: $*"
		return
	fi
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null || fail "installing ${missing[*]} needs root or sudo"
		sudo=sudo
	fi
	say "installing from Debian: ${missing[*]}"
	$sudo apt-get update -q
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

case ${1:-} in
build)
	apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-mingw-w64-x86-64-win32 llvm
	# The stamp is newer than the requirements once they are installed.
	if [ ! -f "$tools/.installed" ] || [ wheels/requirements.txt -nt "$tools/.installed" ]; then
		say "installing wheels/requirements.txt from PyPI into $tools"
		rm -rf "$tools"
		python3 -m venv "$tools"
		"$tools/bin/python" -m pip install --quiet --disable-pip-version-check -r wheels/requirements.txt
		touch "$tools/.installed"
	else
		say "PyPI tools present in $tools"
	fi
	;;
check)
	apt_install qemu-user wine64
	;;
*)
	fail "usage: wheels/tools.sh build|check"
	;;
esac

#!/usr/bin/env bash
# test-py-matrix: the Python test suite and the install check on every Python the package declares
# besides the development venv's (make venv: python3, 3.11 here): by default 3.10 and 3.13, the
# oldest and the newest (PY_MATRIX="3.10 3.12 3.13" for more).
#
# For each version it finds the interpreter (pyenv's, or python<version> on PATH), makes
# build/venv-<version> from python/requirements-test.txt (once; again when that file changes),
# runs pytest in python/ against build/nats-server and the library of `make lib` (the interop
# tests with the nats-py layer are left to `make test-py`: their peer runs on its own Python 3.13
# whatever the host's), then install-check with that interpreter: `pip install ./python` builds
# the library with Go, and two processes of the installed package group_send.
# Prints a line per step; exits non-zero at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=wheels/lib.sh
me=test-py-matrix
source wheels/lib.sh
versions=${PY_MATRIX:-3.10 3.13}
lib=$(pwd)/build/$(go env GOOS)-$(go env GOARCH)/libchannels_nats.so
[ -f "$lib" ] || fail "no library at $lib: run 'make lib'"

# interpreter VERSION: the path of a python of that minor version.
interpreter() {
	local version=$1 prefix
	if command -v pyenv >/dev/null && prefix=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${version//./\\.}(\\.|$)" | tail -n 1)" 2>/dev/null); then
		echo "$prefix/bin/python$version"
	elif command -v "python$version" >/dev/null; then
		command -v "python$version"
	else
		fail "no Python $version: install it (pyenv install $version) or put python$version on PATH"
	fi
}

for version in $versions; do
	python=$(interpreter "$version")
	venv=build/venv-$version
	say "Python $version: $python ($("$python" --version 2>&1))"
	if [ ! -f "$venv/.installed" ] || [ python/requirements-test.txt -nt "$venv/.installed" ]; then
		say "Python $version: making $venv from python/requirements-test.txt"
		rm -rf "$venv"
		"$python" -m venv "$venv"
		"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
		touch "$venv/.installed"
	fi
	say "Python $version: pytest (without the interop tests)"
	(cd python && CHANNELS_NATS_LIBRARY=$lib NATS_SERVER=$(pwd)/../build/nats-server \
		FAULTPROXY=$(pwd)/../build/faultproxy "../$venv/bin/python" -m pytest -m "not interop" -p no:cacheprovider)
	say "Python $version: install-check"
	PYTHON=$python bash python/install-check.sh
done
say "ok: $versions"

#!/usr/bin/env bash
# install-check: proves that `pip install ./python` works for a user who has Go.
#
# 1. `pip wheel ./python` into build/install-check/wheel (emptied first): the hatchling build hook
#    (python/hatch_build.py) builds the native library with Go through capi/build.sh, compiles
#    the cffi module (python/cffi_build.py) and bundles them with the header.
# 2. wheels/check_wheel.py: that one wheel is tagged cp310-abi3-manylinux_2_17_<arch> and has the
#    right metadata, contents (the compiled module too) and RECORD.
# 3. wheels/install-run.sh: a fresh venv installs it with its dependencies from PyPI, and two
#    processes of the installed package, started outside the repository, group_send through
#    build/nats-server (the check `make wheels-check` also runs, there with no Go on PATH).
# Prints progress lines and "install-check: ok"; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
me=install-check
# shellcheck source=wheels/lib.sh
source wheels/lib.sh
work=build/install-check
python=${PYTHON:-python3}
unset CHANNELS_NATS_LIBRARY CHANNELS_NATS_PREBUILT CHANNELS_NATS_PLATFORM_TAG PYTHONPATH

command -v go >/dev/null || fail "go is not on PATH (building from source needs Go)"
tag=$(linux_tag "$(go env GOARCH)")
[ -n "$tag" ] || fail "no manylinux wheel is built for $(go env GOARCH)"

rm -rf "$work"
mkdir -p "$work/wheel"
say "pip wheel ./python with $("$python" --version) (the build hook builds the native library with Go)"
"$python" -m pip wheel --disable-pip-version-check --quiet --no-deps -w "$work/wheel" ./python
shopt -s nullglob
wheels=("$work"/wheel/*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || fail "expected one wheel in $work/wheel, found ${#wheels[@]}"
# Built here with Go, a C compiler and Python's headers: the wheel bundles the compiled cffi module.
"$python" wheels/check_wheel.py "${wheels[0]}" --tag "$tag" --compiled
PYTHON=$python bash wheels/install-run.sh "${wheels[0]}" "$work"
say "ok"

#!/usr/bin/env bash
# make wheels: the five platform wheels and the sdist of channels-nats, into build/wheels/dist/.
# 1. wheels/tools.sh build installs what is missing: cross compilers, llvm, and the pinned PyPI
#    tools (zig, auditwheel, hatchling, build) in build/wheels/tools.
# 2. For each target of wheels/lib.sh, capi/build.sh builds and checks the library in
#    build/<goos>-<goarch>/ (for linux/amd64 python/cffi_build.py adds the compiled cffi module),
#    and `pip wheel` packs it: python/hatch_build.py takes the library (and the module) from
#    CHANNELS_NATS_PREBUILT and the platform from CHANNELS_NATS_PLATFORM_TAG.
# 3. The sdist: the Python package and the Go sources it builds the library from (needs Go).
# make wheels-check (wheels/check.sh) proves the results.
set -euo pipefail
cd "$(dirname "$0")/.."
me=wheels
# shellcheck source=wheels/lib.sh
source wheels/lib.sh
SECONDS=0

require_linux_x86_64
bash wheels/tools.sh build
ZIG=$("$TOOLS_PYTHON" -c 'import pathlib, ziglang; print(pathlib.Path(ziglang.__file__).parent / "zig")')
export ZIG
rm -rf "$WHEEL_DIST"
mkdir -p "$WHEEL_DIST"
pip_flags=(--quiet --disable-pip-version-check --no-deps --no-build-isolation)

step=0
steps=$((${#WHEEL_TARGETS[@]} + 1))
for target in "${WHEEL_TARGETS[@]}"; do
	read -r goos goarch tag <<<"$target"
	step=$((step + 1))
	bash capi/build.sh "$goos" "$goarch"
	rm -f "build/$goos-$goarch/_cffi.abi3.so" # the hook bundles what it finds there
	if compiled_target "$goos" "$goarch"; then
		say "[$step/$steps] $goos/$goarch: the library, the compiled cffi module, the cp310-abi3-$tag wheel"
		"$TOOLS_PYTHON" python/cffi_build.py "build/$goos-$goarch/libchannels_nats.so"
		[ -f "build/$goos-$goarch/_cffi.abi3.so" ] || fail "no compiled cffi module for $goos/$goarch"
	else
		say "[$step/$steps] $goos/$goarch: the library, then the py3-none-$tag wheel"
	fi
	CHANNELS_NATS_PREBUILT=$root/build/$goos-$goarch CHANNELS_NATS_PLATFORM_TAG=$tag \
		"$TOOLS_PYTHON" -m pip wheel "${pip_flags[@]}" -w "$WHEEL_DIST" ./python
done

say "[$steps/$steps] the sdist"
log=build/wheels/sdist.log
if ! "$TOOLS_PYTHON" -m build --sdist --no-isolation --outdir "$WHEEL_DIST" python >"$log" 2>&1; then
	cat "$log" >&2
	fail "building the sdist"
fi

say "built in ${SECONDS} s, in build/wheels/dist:"
list_dist

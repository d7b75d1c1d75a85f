#!/usr/bin/env bash
# Makes build/wireview-venv, the environment of examples/wireview (`make wireview-venv` runs it).
#
# django-wireview 1.5.1 needs Python 3.12 or later, and build/venv has the host's python3 (3.11
# here), so this venv comes from another interpreter:
#   1. the interpreter: $WIREVIEW_PYTHON if set; else the newest CPython 3.13.x or 3.12.x of pyenv
#      (`pyenv root`, or ~/.pyenv); else python3.13 or python3.12 on PATH. It must have venv.
#   2. the venv, made again when it was made by another interpreter;
#   3. examples/wireview/requirements.txt (every package pinned) with --no-deps, then `pip check`;
#   4. channels-nats from ./python: its wheel is built (hatchling, no build isolation) with the
#      native library of $CHANNELS_NATS_PREBUILT (default build/<goos>-<goarch>, what `make lib`
#      builds) inside, so the example imports the layer as a user who ran `pip install` does.
# Steps 3 and 4 run again only when their inputs changed (requirements.txt; the library, the
# package's sources): a sha256 of them is kept in the venv. One line per step; exits non-zero with
# the reason on any failure.
# Usage: examples/wireview/setup-venv.sh [venv directory, default build/wireview-venv]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-build/wireview-venv}
requirements=examples/wireview/requirements.txt

say() { echo "wireview-venv: $*"; }
fail() {
	echo "wireview-venv: FAILED: $*" >&2
	exit 1
}

# ---- 1. the interpreter ----------------------------------------------------------------------
usable() { # PYTHON: CPython 3.12 or 3.13 with venv and ensurepip
	[ -x "$1" ] && "$1" -c 'import sys, venv, ensurepip; sys.exit(not (3, 12) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null
}
candidates() {
	local root
	root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
	# Plain x.y.z names only (not 3.13t, 3.13-dev, miniconda...), newest first.
	for dir in "$root"/versions/3.1[23].*; do
		[[ ${dir##*/} =~ ^3\.1[23]\.[0-9]+$ ]] && echo "${dir##*/}"
	done | sort -rV | while read -r version; do echo "$root/versions/$version/bin/python"; done
	command -v python3.13 python3.12 2>/dev/null || true
}
if [ -n "${WIREVIEW_PYTHON:-}" ]; then
	usable "$WIREVIEW_PYTHON" || fail "WIREVIEW_PYTHON=$WIREVIEW_PYTHON is not a CPython 3.12 or 3.13 with the venv module"
	python=$WIREVIEW_PYTHON
else
	python=
	while read -r candidate; do
		if usable "$candidate"; then
			python=$candidate
			break
		fi
	done < <(candidates)
	[ -n "$python" ] || fail "django-wireview needs Python 3.12 or later, and none was found (pyenv versions 3.12.x or
  3.13.x, python3.13 or python3.12 on PATH). Install one, e.g. \`pyenv install 3.13.0\` (or Debian's python3.13
  and python3.13-venv), or point WIREVIEW_PYTHON at one."
fi
version=$("$python" -c 'import platform; print(platform.python_version())')
say "[1/4] interpreter: $python (Python $version)"

# ---- 2. the venv -----------------------------------------------------------------------------
identity="$python $version"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.interpreter" 2>/dev/null)" = "$identity" ]; then
	say "[2/4] venv: $venv exists (made by Python $version)"
else
	say "[2/4] venv: creating $venv with Python $version"
	rm -rf "$venv"
	"$python" -m venv "$venv"
	echo "$identity" >"$venv/.interpreter"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

# ---- 3. the pinned requirements --------------------------------------------------------------
digest=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$digest" ]; then
	say "[3/4] requirements: $requirements is installed"
else
	say "[3/4] requirements: installing $requirements (every package pinned; --no-deps, then pip check)"
	rm -f "$venv/.requirements"
	"${pip[@]}" install --quiet --no-deps -r "$requirements" || fail "pip install -r $requirements failed"
	"${pip[@]}" check >/dev/null || {
		"${pip[@]}" check || true
		fail "$requirements is not complete or not consistent (pip check, above): pin what it names"
	}
	echo "$digest" >"$venv/.requirements"
fi

# ---- 4. channels-nats from ./python, with the library of `make lib` --------------------------
if [ -z "${CHANNELS_NATS_PREBUILT:-}" ]; then
	command -v go >/dev/null || fail "set CHANNELS_NATS_PREBUILT to the directory of the native library (make lib)"
	CHANNELS_NATS_PREBUILT=build/$(go env GOOS)-$(go env GOARCH)
fi
[ -d "$CHANNELS_NATS_PREBUILT" ] || fail "$CHANNELS_NATS_PREBUILT is not a directory: build the library with \`make lib\`"
prebuilt=$(cd "$CHANNELS_NATS_PREBUILT" && pwd)
library=
for name in libchannels_nats.so libchannels_nats.dylib channels_nats.dll; do
	[ -f "$prebuilt/$name" ] && library=$prebuilt/$name && break
done
if [ -z "$library" ] || [ ! -f "$prebuilt/channels_nats.h" ]; then
	fail "no native library and channels_nats.h in $prebuilt: build them with \`make lib\`"
fi
digest=$(cat "$library" "$prebuilt/channels_nats.h" python/pyproject.toml python/hatch_build.py \
	python/channels_nats/*.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.channels-nats" 2>/dev/null)" = "$digest" ]; then
	say "[4/4] channels-nats: installed from ./python with $library, unchanged since"
else
	say "[4/4] channels-nats: installing ./python with $library (a wheel built by hatchling, no Go)"
	rm -f "$venv/.channels-nats"
	CHANNELS_NATS_PREBUILT=$prebuilt "${pip[@]}" install --quiet --no-deps --no-build-isolation \
		--force-reinstall ./python || fail "pip install ./python failed"
	echo "$digest" >"$venv/.channels-nats"
fi

# The installed package loads the library inside it (no CHANNELS_NATS_LIBRARY), from outside the
# repository, so that python/ is not what gets imported.
venv_python=$(cd "$venv" && pwd)/bin/python
found=$(cd / && env -u CHANNELS_NATS_LIBRARY -u PYTHONPATH "$venv_python" - <<'EOF'
import importlib.metadata as metadata
import sys

import channels
import channels_nats
import django
import wireview  # noqa: F401

print(
    f"Python {sys.version.split()[0]}, django-wireview {metadata.version('django-wireview')}, Django {django.__version__},"
    f" channels {channels.__version__}, channels-nats {metadata.version('channels-nats')} in {channels_nats.__path__[0]}"
)
EOF
) || fail "the venv cannot import its packages"
say "ready: $venv: $found"

#!/usr/bin/env bash
# Prints the functions include/channels_nats.h declares (its CN_EXTERN lines), one a line, sorted.
# They are exactly what the library exports: capi/check-lib.sh compares them with each built
# library, and capi/build.sh writes them into the export lists of the Windows and macOS links.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -oE '^CN_EXTERN [^(]*\b(cn_[a-z_]+)\(' include/channels_nats.h | grep -oE 'cn_[a-z_]+\($' | tr -d '(' | sort

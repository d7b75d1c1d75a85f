#!/usr/bin/env bash
# Checks a built library: it exports exactly the functions of include/channels_nats.h and needs
# no glibc newer than 2.17 (the manylinux_2_17 baseline).
# Usage: capi/check-lib.sh build/linux-amd64/libchannels_nats.so
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$1

declared=$(grep -oE '^CN_EXTERN [^(]*\b(cn_[a-z_]+)\(' include/channels_nats.h | grep -oE 'cn_[a-z_]+\($' | tr -d '(' | sort)
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sort)
if [ "$declared" != "$exported" ]; then
	echo "check-lib: the exported functions differ from the header's:" >&2
	diff <(echo "$declared") <(echo "$exported") >&2 || true
	exit 1
fi
others=$(nm -D --defined-only "$lib" | awk '$2 != "T" && $3 !~ /^(_init|_fini)$/ { print $3 }')
if [ -n "$others" ]; then
	echo "check-lib: unexpected exported symbols: $others" >&2
	exit 1
fi
newest=$(objdump -T "$lib" | grep -oE 'GLIBC_[0-9.]+' | sed 's/GLIBC_//' | sort -V | tail -n 1)
if [ "$(printf '%s\n2.17\n' "$newest" | sort -V | tail -n 1)" != "2.17" ]; then
	echo "check-lib: $lib needs GLIBC_$newest, newer than the 2.17 baseline:" >&2
	objdump -T "$lib" | grep -E "GLIBC_$newest" >&2
	exit 1
fi
echo "check-lib: $lib exports $(echo "$exported" | wc -l) cn_* functions, newest glibc symbol version $newest, $(du -h "$lib" | cut -f1)"

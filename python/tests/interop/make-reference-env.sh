#!/usr/bin/env bash
# Build the reference environment for the interoperability tests:
#
#   build/reference/root      a minimal Debian trixie root (python3.13), made with debootstrap
#   build/reference/root/opt/ref
#                             a venv there with the reference layer, PyPI "channels-nats==0.10.*"
#   build/reference/ready     marker: the installed reference version ("pip show channels-nats")
#
# The reference layer needs Python >= 3.13 and the host has an older one, so it runs inside the
# root through chroot (same network, so it reaches a nats-server on 127.0.0.1). Packages come
# from the Debian mirror the host's apt is configured with, and from PyPI; nothing else.
#
# Idempotent: once build/reference/ready exists (and the venv is there) a run does
# nothing. A half-made root (debootstrap interrupted) is removed and made again.
#
# Exit status: 0 ready; 2 cannot be made on this machine (the message says why).
# Needs root (debootstrap, chroot, mount). Override the mirror with REFERENCE_MIRROR=<url>.

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
cd "$repo"

ref_dir="build/reference"
root="$ref_dir/root"
marker="$ref_dir/ready"
boot_done="$ref_dir/.debootstrap-done"
suite="trixie"
spec="channels-nats==0.10.*"

# A module file of its own keeps go commands on the repository's module (go vet ./..., go mod tidy)
# from walking the root, and from its /proc while the tests have it mounted.
mkdir -p "$ref_dir"
printf 'module reference_root_not_go_code\n' > "$ref_dir/go.mod"

say() { echo "reference: $*"; }
die() { echo "reference: cannot build the reference environment: $*" >&2; exit 2; }

# Run a command inside the root with a clean environment: the host's PIP_*, PYTHON* and pyenv
# settings mean nothing in there. Proxy settings, if any, are passed on.
in_root() {
    local -a envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
    local v
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        if [ -n "${!v:-}" ]; then envs+=("$v=${!v}"); fi
    done
    env -i "${envs[@]}" chroot "$root" "$@"
}

# The venv's bin/python is a symlink to /usr/bin/python3.13 *inside* the root, so test for the
# venv by its files, not by following that link on the host.
venv_ok() { [ -f "$root/opt/ref/pyvenv.cfg" ] && [ -f "$root/opt/ref/bin/pip" ] && [ -L "$root/opt/ref/bin/python" ]; }

if [ -f "$marker" ] && venv_ok; then
    say "ready ($(cat "$marker")) in $ref_dir; nothing to do"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "this needs root (debootstrap, chroot, mount --bind); run it as root"
command -v chroot >/dev/null || die "chroot is not installed"
command -v mount >/dev/null || die "mount is not installed"

# --- the host's Debian mirror ------------------------------------------------------------
# The first enabled "deb" source whose URI is a Debian archive (path ending in /debian, so not
# debian-security), from /etc/apt/sources.list, *.list and deb822 *.sources.
host_mirror() {
    local f
    {
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -f "$f" ] || continue
            # deb [options] URI suite components...
            sed -e 's/#.*//' "$f" | awk '$1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if (i <= NF) print $i
            }'
        done
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            # deb822 stanzas separated by blank lines (comment lines are dropped, not blanked,
            # so they do not split a stanza); keep the URIs of enabled "deb" stanzas.
            sed -e '/^[[:space:]]*#/d' "$f" | awk '
                function flush() {
                    if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
                        n = split(uris, u, " "); for (k = 1; k <= n; k++) print u[k]
                    }
                    types = ""; uris = ""; enabled = ""
                }
                /^[ \t]*$/ { flush(); next }
                { line = $0; key = line; sub(/:.*/, "", key); val = line; sub(/^[^:]*:[ \t]*/, "", val)
                  if (key == "Types") types = val
                  else if (key == "URIs") uris = val
                  else if (key == "Enabled") enabled = val }
                END { flush() }'
        done
    } | grep -E '^(https?|ftp)://[^ ]+/debian/?$' | head -n 1
}

# --- debootstrap ---------------------------------------------------------------------------
if [ ! -f "$boot_done" ] || [ ! -x "$root/usr/bin/python3.13" ]; then
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap (apt-get)"
        if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
            apt-get update -qq || die "apt-get update failed"
        fi
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; then
            apt-get update -qq || die "apt-get update failed"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
                || die "apt-get install debootstrap failed"
        fi
    fi
    [ -e "/usr/share/debootstrap/scripts/$suite" ] \
        || die "this debootstrap ($(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)) does not know $suite"

    mirror="${REFERENCE_MIRROR:-$(host_mirror || true)}"
    [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/ (set REFERENCE_MIRROR=<url>)"

    if [ -e "$root" ]; then
        say "removing a half-made root from an earlier run"
        if mountpoint -q "$root/proc"; then umount "$root/proc" || die "$root/proc is mounted and busy; stop what runs in the root"; fi
        rm -rf --one-file-system "$root"
    fi
    mkdir -p "$ref_dir"
    say "debootstrap $suite from $mirror (about a minute)"
    start=$(date +%s)
    if ! debootstrap --variant=minbase --include=python3.13,python3.13-venv,ca-certificates \
            "$suite" "$root" "$mirror" >"$ref_dir/debootstrap.out" 2>&1; then
        tail -n 20 "$ref_dir/debootstrap.out" >&2
        [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 20 "$root/debootstrap/debootstrap.log" >&2
        die "debootstrap $suite failed (full output: $ref_dir/debootstrap.out)"
    fi
    [ -x "$root/usr/bin/python3.13" ] || die "debootstrap finished but $root has no /usr/bin/python3.13"
    touch "$boot_done"
    say "debootstrap done in $(( $(date +%s) - start ))s ($(in_root python3.13 --version))"
fi

# --- name resolution and the host's extra CAs (a TLS-inspecting egress proxy, for one) --------
cp -L --remove-destination /etc/resolv.conf "$root/etc/resolv.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -L /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    say "trusting the host's local CAs in the root ($(ls /usr/local/share/ca-certificates/*.crt | wc -l) file(s))"
    in_root update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the root"
fi

# --- venv and the reference layer ----------------------------------------------------------
# pip (and ensurepip, which venv runs) wants /proc. Mount it only for these steps, and only
# unmount what this script mounted: a running RefPeer may be using a mount it made itself.
mounted_proc=0
cleanup() {
    if [ "$mounted_proc" -eq 1 ]; then
        umount "$root/proc" 2>/dev/null || umount -l "$root/proc" 2>/dev/null || true
        mounted_proc=0
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$root/proc"
if ! mountpoint -q "$root/proc"; then
    mount --bind /proc "$root/proc" || die "mount --bind /proc $root/proc failed"
    mounted_proc=1
fi

if ! venv_ok; then
    say "venv /opt/ref (python3.13)"
    rm -rf "$root/opt/ref"
    in_root python3.13 -m venv /opt/ref || die "python3.13 -m venv /opt/ref failed in the root"
fi

say "pip install \"$spec\" (PyPI)"
start=$(date +%s)
if ! in_root /opt/ref/bin/pip install --disable-pip-version-check --no-cache-dir -q "$spec"; then
    die "pip install \"$spec\" failed in the root (is PyPI reachable?)"
fi
version="$(in_root /opt/ref/bin/pip show channels-nats 2>/dev/null | sed -n 's/^Version: //p')"
[ -n "$version" ] || die "pip install said nothing went wrong, but pip show channels-nats finds nothing"
in_root /opt/ref/bin/python -c 'import channels_nats, nats, msgpack' \
    || die "the reference layer does not import in the root"
pyver="$(in_root /opt/ref/bin/python -c 'import platform; print(platform.python_version())')"
say "pip done in $(( $(date +%s) - start ))s"

cleanup
echo "channels-nats $version (python $pyver)" >"$marker"
say "ready: channels-nats $version on python $pyver in $root ($(du -sh --one-file-system "$root" | cut -f1))"

#!/usr/bin/env bash
# Build a local base image (default tag ledgermq-base:<codename>) for machines with a Docker
# engine but no registry: `FROM python:3.11-slim` cannot be pulled there, so we make a minimal
# Debian root filesystem with debootstrap and `docker import` it.
#
# The Debian mirror and release are read from this machine's own apt configuration
# (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and deb822 *.sources) and
# /etc/os-release, so no host name is hard-coded here. Bookworm's python3 is 3.11, which is
# what the project needs.
#
# Usage: jepsen/docker/build-base-image.sh [--force] [--tag TAG] [--suite CODENAME] [--mirror URL]
#   env: LEDGERMQ_BASE_IMAGE (tag), LEDGERMQ_DEBIAN_SUITE, LEDGERMQ_DEBIAN_MIRROR
# The image is built once per machine: an existing tag is kept unless --force is given.
set -euo pipefail

force=0
suite="${LEDGERMQ_DEBIAN_SUITE:-}"
mirror="${LEDGERMQ_DEBIAN_MIRROR:-}"
tag="${LEDGERMQ_BASE_IMAGE:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=1 ;;
    --tag) tag="$2"; shift ;;
    --suite) suite="$2"; shift ;;
    --mirror) mirror="$2"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build-base-image: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "build-base-image: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"

if [ -z "$suite" ]; then
  # shellcheck disable=SC1091
  suite="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
  [ -n "$suite" ] || die "cannot tell the Debian release from /etc/os-release; pass --suite bookworm"
fi
tag="${tag:-ledgermq-base:$suite}"

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "build-base-image: $tag already exists (use --force to rebuild)"
  exit 0
fi

# --- the mirror: the first enabled apt source that serves "$suite" itself -------------------
find_mirror() {
  local f
  # One-line format: deb [options] URI suite component...
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v s="$suite" '
      /^[[:space:]]*deb[[:space:]]/ {
        i = 2
        if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        if ($(i + 1) == s) { print $i; exit }
      }' "$f"
  done | head -n1
  # deb822 format: stanzas of "Key: value" lines separated by blank lines.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v s="$suite" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " s " ") && uris != "") {
          split(uris, u, " "); print u[1]; found = 1; exit
        }
        types = ""; suites = ""; uris = ""; enabled = ""
      }
      /^[[:space:]]*#/ { next }
      /^[[:space:]]*$/ { flush(); next }
      {
        key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
        if (key == "types") types = val
        else if (key == "suites") suites = val
        else if (key == "uris") uris = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { if (!found) flush() }' "$f"
  done | head -n1
}
if [ -z "$mirror" ]; then
  mirror="$(find_mirror | head -n1 || true)"
  [ -n "$mirror" ] || die "no apt source for suite '$suite' in /etc/apt/sources.list{,.d/}; pass --mirror URL"
fi

# --- debootstrap ------------------------------------------------------------------------------
as_root=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "debootstrap needs root: run this script as root (or install sudo)"
  as_root=(sudo)
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
  echo "build-base-image: installing debootstrap (apt-get install -y debootstrap)" >&2
  "${as_root[@]}" apt-get update -qq || die "apt-get update failed; install debootstrap by hand"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
    || die "could not install debootstrap; run: apt-get update && apt-get install -y debootstrap"
fi
debootstrap_bin="$(command -v debootstrap || echo /usr/sbin/debootstrap)"

work="$(mktemp -d /var/tmp/ledgermq-rootfs.XXXXXX)"
cleanup() { "${as_root[@]}" rm -rf --one-file-system "$work"; }
trap cleanup EXIT

# python3 + python3-venv: the project's venv; iptables + iproute2: partitions (cap NET_ADMIN);
# ca-certificates: pip inside the image if a user ever needs it.
packages="python3,python3-venv,iptables,iproute2,ca-certificates"
keyring_args=()
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && keyring_args=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)

echo "build-base-image: debootstrap $suite from $mirror (variant minbase, +$packages)" >&2
t0=$(date +%s)
"${as_root[@]}" "$debootstrap_bin" --variant=minbase --include="$packages" "${keyring_args[@]}" \
  "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 40 "$work/debootstrap.log" >&2
    die "debootstrap failed (log above)"
  }

# Keep the image small: no package lists, caches, docs or man pages.
"${as_root[@]}" rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin \
  "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/usr/share/doc/"* "$work/rootfs/usr/share/man/"* \
  "$work/rootfs/usr/share/info/"*
# The mirror the image was made from, so `apt-get install` inside works like on the host.
echo "deb $mirror $suite main" | "${as_root[@]}" tee "$work/rootfs/etc/apt/sources.list" >/dev/null

"${as_root[@]}" tar -C "$work/rootfs" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "ledgermq base: debootstrap $suite minbase + $packages" \
  - "$tag" >/dev/null
echo "build-base-image: built $tag in $(( $(date +%s) - t0 ))s"

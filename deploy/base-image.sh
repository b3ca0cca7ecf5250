#!/usr/bin/env bash
# Build the offline base image `tidal-base:bookworm` from Debian packages alone:
# debootstrap a minimal bookworm root with python3 (3.11), venv and bubblewrap (the
# sandbox's isolation), strip what a service never reads (docs, man pages, locales, apt
# lists), and `docker import` it. No container registry is involved, which is what a
# machine (or an air-gapped cluster) that cannot pull `python:3.11-slim` needs. The images
# then take it as `--build-arg BASE_IMAGE=...`.
#
#   deploy/base-image.sh [--force]      TIDAL_BASE_IMAGE (tag), DEBIAN_MIRROR (the mirror)
#
# Needs root (debootstrap) and the `debootstrap` package (make test-deploy installs it).
# Idempotent: an existing image of that tag is kept unless --force.
set -euo pipefail

TAG="${TIDAL_BASE_IMAGE:-tidal-base:bookworm}"
SUITE=bookworm

# The Debian mirror: DEBIAN_MIRROR, else the first one this host's apt uses (deb822
# .sources or a one-line sources.list), so a host behind its own mirror or proxy keeps it.
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r "$f" ]] || continue
    awk '/^URIs:/ && $2 !~ /security/ {print $2; exit} /^deb / && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f"
  done | head -n1
}
MIRROR="${DEBIAN_MIRROR:-$(host_mirror)}"
if [[ -z "$MIRROR" ]]; then
  echo "base-image: set DEBIAN_MIRROR (no Debian mirror found in this host's apt sources)" >&2
  exit 1
fi

if [[ "${1:-}" != "--force" ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base-image: $TAG exists (use --force to rebuild)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "base-image: debootstrap needs root" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "base-image: install debootstrap (apt-get install debootstrap)" >&2; exit 1; }

root=$(mktemp -d /tmp/tidal-base.XXXXXX)
# Only the folder this script made is removed (umount first in case debootstrap left mounts).
cleanup() {
  for m in proc sys dev/pts dev; do umount "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,bubblewrap \
  "$SUITE" "$root" "$MIRROR"

# What no service reads at run time; apt's lists come back with `apt-get update`.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
find "$root/usr/lib/python3.11" -name '__pycache__' -prune -exec rm -rf {} +

tar --numeric-owner -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "tidal offline base: debootstrap $SUITE minbase + python3" - "$TAG"
docker image ls "$TAG"

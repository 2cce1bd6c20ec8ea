#!/usr/bin/env bash
# A Debian bookworm base image made from Debian's own packages, for machines that cannot pull from Docker Hub:
# mmdebstrap -> tarball -> `docker import`.  It carries Python 3.11 (bookworm's python3) for the Dockerfiles'
# BASE_IMAGE build argument, and Debian's PostgreSQL 15 and Redis so the test stack needs no postgres/redis image.
# Usage: build.sh CACHE_DIR TAG   (DOCKER_HOST names the daemon).  The tarball is cached in CACHE_DIR and reused
# while this script and the package list are unchanged; the image is re-imported only when missing.
set -euo pipefail
cache=$1 tag=$2
here=$(dirname "$0")
packages=$(grep -v '^#' "$here/packages.txt" | xargs | tr ' ' ,)
key=$(cat "$0" "$here/packages.txt" | sha256sum | cut -c1-12)
tarball=$cache/bookworm-$key.tar
# The machine's Debian mirror (apt sources), so the base comes from where this host's packages come from.
mirror=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
         2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}

if docker image inspect "$tag" >/dev/null 2>&1 \
   && [ "$(docker image inspect -f '{{index .Config.Labels "mindloom.base-key"}}' "$tag")" = "$key" ]; then
  exit 0
fi
if [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  rm -f "$cache"/bookworm-*.tar
  # minbase + our list; apt lists and caches are dropped to keep the image small.
  nice -n 10 mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tarball.part" "$mirror"
  mv "$tarball.part" "$tarball"
fi
docker import --change "LABEL mindloom.base-key=$key" --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null

#!/usr/bin/env bash
# Builds the base image for the exporter's Dockerfile without a container registry: a minimal
# Debian (debootstrap, variant minbase) with Debian's python3 and its venv module, imported into
# local container storage with buildah. Where a registry is reachable, any Python >= 3.11 image
# with `python3 -m venv` (e.g. python:3.11-slim-bookworm) serves as BASE_IMAGE as well.
#
#   build-tools/build-base-image.sh [IMAGE]     (default localhost/inference-bottleneck-exporter-base:bookworm)
#
# Needs root, debootstrap and buildah. Environment: SUITE (bookworm), MIRROR (default: the first
# Debian archive this machine's apt is configured with).
set -euo pipefail

IMAGE=${1:-localhost/inference-bottleneck-exporter-base:bookworm}
SUITE=${SUITE:-bookworm}
# The mirror this machine already uses: the first URI of a deb line (deb822 or one-line style)
# whose path ends in /debian.
apt_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    if [ -r "$f" ]; then cat "$f"; fi
  done | awk '
    /^URIs:/ { for (i = 2; i <= NF; i++) print $i; next }
    /^deb[ \t]/ { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }
  ' | awk '/^https?:\/\/.*\/debian\/?$/ && !found { print; found = 1 }'
}
MIRROR=${MIRROR:-$(apt_mirror)}
[ -n "$MIRROR" ] || { echo "$0: no Debian mirror in /etc/apt; set MIRROR" >&2; exit 1; }

for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found (make tools installs it)" >&2; exit 1; }
done

work=$(mktemp -d)
ctr=""
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

root="$work/rootfs"
# python3-venv brings ensurepip, which the Dockerfile's build stage uses to make its venv.
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$root" "$MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }

# What a runtime image never needs: package caches and lists, docs, man pages, locales, logs.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/tmp/* "$root"/var/tmp/*
# debootstrap copies the build host's resolver and hostname; a container gets its own.
: >"$root/etc/resolv.conf"
: >"$root/etc/hostname"

previous=$(buildah images --quiet --no-trunc "$IMAGE" 2>/dev/null || true)
ctr=$(buildah from scratch)
buildah copy --quiet "$ctr" "$root" / >/dev/null
buildah config \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 \
  --cmd /bin/sh \
  --label "org.opencontainers.image.title=debian-$SUITE-python3 (debootstrap minbase)" \
  --label "org.opencontainers.image.base.name=debootstrap:$SUITE" \
  --label "io.inference-bottleneck-exporter.base.recipe=$(sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$IMAGE" >/dev/null
ctr=""
# The image this one replaces, unless something still uses it.
[ -z "$previous" ] || buildah rmi "$previous" >/dev/null 2>&1 || true
echo "$IMAGE"

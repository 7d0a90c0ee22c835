#!/usr/bin/env bash
# Builds the exporter's image from the Dockerfile with buildah, without a container registry:
# the base is built locally by build-tools/build-base-image.sh unless BASE_IMAGE names one.
#
#   build-tools/build-image.sh [IMAGE]      (default localhost/inference-bottleneck-exporter:VERSION)
#
# Environment: BASE_IMAGE (default: the local debootstrap base, built when absent or built by
# another version of build-base-image.sh: the script's sha256 is the base's label
# io.inference-bottleneck-exporter.base.recipe), REBUILD_BASE=1 (build the local base anew).
# Needs root and buildah (`make tools`).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' exporter/__init__.py)
IMAGE=${1:-localhost/inference-bottleneck-exporter:$VERSION}
LOCAL_BASE=localhost/inference-bottleneck-exporter-base:bookworm
BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}

command -v buildah >/dev/null || { echo "$0: buildah not found (make tools installs it)" >&2; exit 1; }

start=$(date +%s)
if [ "$BASE_IMAGE" = "$LOCAL_BASE" ]; then
  recipe=$(sha256sum <build-tools/build-base-image.sh | cut -d' ' -f1)
  built=$(buildah inspect --type image \
    --format '{{index .OCIv1.Config.Labels "io.inference-bottleneck-exporter.base.recipe"}}' \
    "$LOCAL_BASE" 2>/dev/null || true)
  if [ "${REBUILD_BASE:-0}" = 1 ] || [ "$built" != "$recipe" ]; then
    build-tools/build-base-image.sh "$LOCAL_BASE" >/dev/null
    echo "base image $LOCAL_BASE built in $(( $(date +%s) - start ))s"
  fi
fi

build_args=(
  --build-arg "BASE_IMAGE=$BASE_IMAGE"
  --build-arg "VERSION=$VERSION"
  --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  --build-arg "CREATED=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%dT%H:%M:%SZ)"
)
# Where TLS to PyPI is intercepted, the machine's CA bundle goes in as a build secret (never
# into a layer); pip inside the build uses it.
ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}
if [ -n "$ca" ] && [ -s "$ca" ]; then
  build_args+=(--secret "id=pip-cert,src=$ca")
fi

previous=$(buildah images --quiet --no-trunc "$IMAGE" 2>/dev/null || true)
image_start=$(date +%s)
buildah bud --isolation=chroot --layers=false "${build_args[@]}" --tag "$IMAGE" . >&2
end=$(date +%s)
# The image this one replaces, unless something still uses it.
[ -z "$previous" ] || buildah rmi "$previous" >/dev/null 2>&1 || true
size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -n 1)
echo "image $IMAGE built in $(( end - image_start ))s (total $(( end - start ))s), size $size"

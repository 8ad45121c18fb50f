#!/usr/bin/env bash
# Builds the project's images with whichever container engine is present (docker/engine.sh
# says how it chooses), on the base image engine.sh chooses (making the project's own
# attention-base:bookworm-minbase with debootstrap when it is that one and not there yet),
# leaving no untagged image behind.  `make image` runs it; the container tests build
# through the same functions.
#
#   docker/build-image.sh             the service, attention-server:latest (docker/Dockerfile)
#   docker/build-image.sh balancer    the nginx load balancer, attention-balancer:latest
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/docker/engine.sh"

if ! engine_select; then
    echo "cannot build: $ENGINE_WHY_NOT" >&2
    exit 1
fi
base_image_ensure || { echo "cannot make the base image $BASE_IMAGE" >&2; exit 1; }
echo "base image: $BASE_IMAGE"
case "${1:-server}" in
    server)   tag=$IMAGE;          dockerfile=$ROOT/docker/Dockerfile ;;
    balancer) tag=$BALANCER_IMAGE; dockerfile=$ROOT/docker/balancer/Dockerfile ;;
    *) echo "usage: $0 [server|balancer]" >&2; exit 2 ;;
esac
echo "building $tag with $ENGINE"
engine_build "$tag" "$dockerfile" || exit 1
echo "$tag: $(( $(engine_image_size "$tag") / 1000000 )) MB"

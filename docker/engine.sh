# engine.sh - sourced (never run) by docker/build-image.sh and by the container tests.
# It picks the container engine, chooses the base image (making the project's own when it
# is not there), and builds the project's images, so that `make image` and the tests build
# them the same way.  The caller sets ROOT to the repository root.
#
# The engine is Docker when a Docker engine answers `docker info` (a docker command line
# alone is not enough), and podman otherwise.  podman gets docker/containers.conf through
# CONTAINERS_CONF (runc, and ulimits that fit under the host's hard limits) unless the
# caller set CONTAINERS_CONF already.
#
# The base of the images (BASE_IMAGE, which the caller may set) is Debian's official
# debian:bookworm-slim when the engine holds a copy pulled from a registry (one with a
# registry digest: `docker pull debian:bookworm-slim` once to use it); nothing here pulls.
# Otherwise it is the project's own MINBASE_IMAGE, attention-base:bookworm-minbase:
# debootstrap (minbase) into build/base/, trimmed like Debian's slim image, then imported.
# It never takes Debian's name, which would shadow the official image for every other
# build on the machine.  The tree is kept, so a second import, after the image was removed,
# takes seconds.  The newcomer suite starts its containers from MINBASE_IMAGE always.

ENGINE=
ENGINE_WHY_NOT=
OFFICIAL_BASE_IMAGE=debian:bookworm-slim
MINBASE_IMAGE=attention-base:bookworm-minbase
BASE_IMAGE=${BASE_IMAGE:-}
IMAGE=${IMAGE:-attention-server:latest}
BALANCER_IMAGE=${BALANCER_IMAGE:-attention-balancer:latest}

if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi

# engine_select: sets ENGINE to docker or podman and returns 0, or sets ENGINE_WHY_NOT to
# a sentence saying why neither can be used and returns 1.
engine_select() {
    if command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; then
        ENGINE=docker
        return 0
    fi
    if ! command -v podman >/dev/null 2>&1; then
        ENGINE_WHY_NOT="no Docker engine answers 'docker info' and podman is not installed"
        return 1
    fi
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/docker/containers.conf}
    local err
    if ! err=$(timeout 60 podman info 2>&1 >/dev/null); then
        ENGINE_WHY_NOT="podman is installed but 'podman info' fails: $(echo "$err" | tail -n 1)"
        return 1
    fi
    ENGINE=podman
    return 0
}

# engine_has_image NAME: true when the engine holds an image of that name.
engine_has_image() {
    if [ "$ENGINE" = podman ]; then
        podman image exists "$1"
    else
        docker image inspect "$1" >/dev/null 2>&1
    fi
}

# debian_mirror: prints the Debian mirror that apt on this host already uses for bookworm
# (DEBIAN_MIRROR wins), or deb.debian.org when none is found.
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(awk '/^URIs:/ { uri = $2 } /^Suites:.*bookworm( |$)/ && uri { print uri; exit }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null)
    if [ -z "$uri" ]; then
        uri=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# base_tree_make DIR: debootstraps a minimal bookworm into DIR from the mirror apt uses here,
# and marks it complete with DIR.done.  Returns debootstrap's failure, leaving no DIR.
base_tree_make() {
    local dir=$1 mirror
    mirror=$(debian_mirror)
    echo "making $MINBASE_IMAGE: debootstrap --variant=minbase bookworm from $mirror"
    $SUDO rm -rf "$dir"
    if ! $SUDO debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1; then
        tail -n 5 "$dir.log"
        $SUDO rm -rf "$dir"
        return 1
    fi
    $SUDO touch "$dir.done"
}

# base_tree_trim DIR: trims the tree like Debian's slim image: no manuals, translations or
# documentation but the copyright files, now and in every later apt-get install; no
# downloaded packages kept; the same apt sources as Debian's image (the release, its
# updates and security) on the mirror apt uses here.  Safe to run again on the same tree.
# It refuses any DIR that is not a finished tree of base_tree_make, because it deletes
# files under DIR as root.
base_tree_trim() {
    local dir=$1 mirror
    case "$dir" in
        "$ROOT"/build/base/?*) ;;
        *) echo "base_tree_trim: refusing $dir" >&2; return 1 ;;
    esac
    [ -f "$dir.done" ] && [ -d "$dir/etc/apt" ] || { echo "base_tree_trim: $dir is not a tree" >&2; return 1; }
    mirror=$(debian_mirror)
    printf '%s\n' \
        'path-exclude /usr/share/doc/*' \
        'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' \
        'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' \
        'path-exclude /usr/share/lintian/*' |
        $SUDO tee "$dir/etc/dpkg/dpkg.cfg.d/slim" >/dev/null
    local clean='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'
    printf '%s\n' \
        "DPkg::Post-Invoke { \"$clean\"; };" \
        "APT::Update::Post-Invoke { \"$clean\"; };" \
        'Dir::Cache::pkgcache "";' \
        'Dir::Cache::srcpkgcache "";' |
        $SUDO tee "$dir/etc/apt/apt.conf.d/docker-clean" >/dev/null
    $SUDO find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    $SUDO find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
    $SUDO rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/locale/* \
        "$dir"/usr/share/lintian/* "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin \
        "$dir"/var/lib/apt/lists/* "$dir"/var/log/*.log "$dir"/etc/apt/sources.list
    printf '%s\n' \
        'Types: deb' "URIs: $mirror" 'Suites: bookworm bookworm-updates' 'Components: main' \
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' '' \
        'Types: deb' "URIs: ${mirror%/debian}/debian-security" 'Suites: bookworm-security' \
        'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        $SUDO tee "$dir/etc/apt/sources.list.d/debian.sources" >/dev/null
}

# official_base_pulled: true when the engine holds Debian's official slim image as pulled
# from a registry (podman names it docker.io/library/..., Docker keeps its digest; an image
# imported under that name has neither).
official_base_pulled() {
    if [ "$ENGINE" = podman ]; then
        podman image exists "docker.io/library/$OFFICIAL_BASE_IMAGE"
    else
        [ "$(docker image inspect --format '{{len .RepoDigests}}' "$OFFICIAL_BASE_IMAGE" 2>/dev/null)" \
            -gt 0 ] 2>/dev/null
    fi
}

# minbase_image_ensure: makes sure the engine holds MINBASE_IMAGE: the tree in build/base/
# is trimmed and imported, after it is made when it is not there yet.  Returns 1 when the
# tree cannot be made.
minbase_image_ensure() {
    engine_has_image "$MINBASE_IMAGE" && return 0
    local dir=$ROOT/build/base/bookworm-minbase
    mkdir -p "$ROOT/build/base"
    if [ ! -f "$dir.done" ]; then
        base_tree_make "$dir" || return 1
    fi
    base_tree_trim "$dir" || return 1
    echo "importing $dir as $MINBASE_IMAGE"
    $SUDO tar -C "$dir" -c . | $ENGINE import --change 'CMD ["bash"]' - "$MINBASE_IMAGE" >/dev/null
}

# base_image_ensure: sets BASE_IMAGE (unless the caller did) as the top of this file says
# and makes sure the engine holds it.  Returns 1 when it cannot.
base_image_ensure() {
    if [ -z "$BASE_IMAGE" ]; then
        if official_base_pulled; then BASE_IMAGE=$OFFICIAL_BASE_IMAGE; else BASE_IMAGE=$MINBASE_IMAGE; fi
    fi
    if [ "$BASE_IMAGE" = "$MINBASE_IMAGE" ]; then
        minbase_image_ensure
    else
        engine_has_image "$BASE_IMAGE"
    fi
}

# engine_dangling: the IDs of the untagged images the engine holds, one a line.
engine_dangling() {
    $ENGINE images -q --no-trunc --filter dangling=true 2>/dev/null | sort -u
}

# engine_build TAG DOCKERFILE: builds the image from the repository root on BASE_IMAGE
# (base_image_ensure first), never pulling.  podman is told to write Docker's format, the
# one that keeps HEALTHCHECK (OCI images have no such field).  The build information
# reaches the binary through build arguments, because .git is not in the build context.
# A Dockerfile with a stage named build has that stage tagged too, as TAG's name with
# "-build" (attention-server-build:latest), so that it is no untagged image and its layers
# stay as the cache of the next build (without it every build installs the compiler again).
# The images the build leaves untagged (the stages and images of those names before) are
# removed; untagged images that were there before are left alone, and one still used by a
# container stays.
engine_build() {
    local tag=$1 dockerfile=$2
    local flags=() before rc=0 id
    if [ "$ENGINE" = podman ]; then
        flags=(--format docker --pull=never)
    fi
    flags+=(-f "$dockerfile"
        --build-arg BASE_IMAGE="${BASE_IMAGE:?base_image_ensure first}"
        --build-arg GIT_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
        --build-arg BUILD_DATE="$(git -C "$ROOT" log -1 --format=%cI 2>/dev/null || echo unknown)")
    before=$(engine_dangling)
    if grep -qiE '^FROM .* AS build$' "$dockerfile"; then
        $ENGINE build "${flags[@]}" --target build -t "${tag%:*}-build:${tag##*:}" "$ROOT" || rc=$?
    fi
    [ "$rc" = 0 ] && { $ENGINE build "${flags[@]}" -t "$tag" "$ROOT" || rc=$?; }
    for id in $(comm -13 <(echo "$before") <(engine_dangling)); do
        $ENGINE rmi "$id" >/dev/null 2>&1 || true
    done
    return $rc
}

# engine_image_size TAG: prints the image's size in bytes.
engine_image_size() {
    $ENGINE image inspect --format '{{.Size}}' "$1"
}

# engine.sh - sourced (never run) by docker/build-image.sh and by the container tests.
# It picks the container engine, makes the debian:bookworm-slim base image when it is not
# there, and builds the project's images, so that `make image` and the tests build them the
# same way.  The caller sets ROOT to the repository root.
#
# The engine is Docker when a Docker engine answers `docker info` (a docker command line
# alone is not enough), and podman otherwise.  podman gets docker/containers.conf through
# CONTAINERS_CONF (runc, and ulimits that fit under the host's hard limits) unless the
# caller set CONTAINERS_CONF already.
#
# Where no registry can be reached, debian:bookworm-slim is made locally: debootstrap
# (minbase) into build/base/, trimmed like Debian's own slim image, then imported.  The
# tree is kept, so a second import, after the image was removed, takes seconds.

ENGINE=
ENGINE_WHY_NOT=
BASE_IMAGE=debian:bookworm-slim
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
    echo "making $BASE_IMAGE: debootstrap --variant=minbase bookworm from $mirror"
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

# base_image_ensure: makes sure the engine holds debian:bookworm-slim.  An image already
# there is used as it is; otherwise the tree in build/base/ is trimmed and imported, after
# it is made when it is not there yet.  Returns 1 when the tree cannot be made.
base_image_ensure() {
    engine_has_image "$BASE_IMAGE" && return 0
    local dir=$ROOT/build/base/bookworm-minbase
    mkdir -p "$ROOT/build/base"
    if [ ! -f "$dir.done" ]; then
        base_tree_make "$dir" || return 1
    fi
    base_tree_trim "$dir" || return 1
    echo "importing $dir as $BASE_IMAGE"
    $SUDO tar -C "$dir" -c . | $ENGINE import --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
}

# engine_build TAG DOCKERFILE: builds the image from the repository root, never pulling
# (the base is local).  podman is told to write Docker's format, the one that keeps
# HEALTHCHECK (OCI images have no such field).  The build information reaches the binary
# through build arguments, because .git is not in the build context.
engine_build() {
    local tag=$1 dockerfile=$2
    local flags=()
    if [ "$ENGINE" = podman ]; then
        flags=(--format docker --pull=never)
    fi
    $ENGINE build "${flags[@]}" -f "$dockerfile" -t "$tag" \
        --build-arg GIT_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        --build-arg BUILD_DATE="$(git -C "$ROOT" log -1 --format=%cI 2>/dev/null || echo unknown)" \
        "$ROOT"
}

# engine_image_size TAG: prints the image's size in bytes.
engine_image_size() {
    $ENGINE image inspect --format '{{.Size}}' "$1"
}

#!/usr/bin/env bash
# provision.sh - installs what the build, the tests, the benchmarks or the container tools need
# and is missing here; the Makefile's targets call it (see the top of the Makefile for which
# target asks for which profile).
#
#   scripts/provision.sh PROFILE...
#
# Profiles (each includes the ones it names):
#   build       the compiler, pkg-config and the -dev packages: what `make` and `make run` need
#   test        build, curl, valgrind, openssl, fuzz, checkpoint, browser, api, prism, k8s and
#               s3: what `make test` needs
#   bench       test, ort, and the Debian packages the benchmark scripts use (python3-flask,
#               gunicorn, wrk, gzip): what `make bench` needs
#   container   jq, curl and docker.io (the swarm suite), and podman with its helpers when no
#               Docker engine answers
#   fuzz        clang and its libFuzzer (`make fuzz`, and the fuzz-replay suite of `make test`)
#   checkpoint  Debian's python3-torch and python3-numpy (the checkpoint and viz-capture suites)
#   s3          OpenStack Swift with its S3 middleware, memcached and awscli (the s3-store suite)
#   browser     checkpoint, chromium and the pinned puppeteer-core of tests/browser/
#   api         the pinned OpenAPI linter (Spectral) of api/
#   prism       the pinned validating proxy (Stoplight Prism) of tests/prism/
#   k8s         the pinned Kubernetes schema validator of tests/k8s/
#   ort         the pinned ONNX Runtime of tests/bench/ort/ (installed with --ignore-scripts)
#   podman      podman with its helpers, whether or not a Docker engine answers
#
# A Debian package is installed only when dpkg-query does not report it installed; all the
# missing ones of the profiles asked for are installed by one `apt-get update` and one
# `apt-get install`, as root or through sudo.  nodejs and npm join them when a pinned npm folder
# is to be installed and npm is missing.  A pinned npm folder is installed by `npm ci` unless
# its node_modules/.package-lock.json (which npm writes on every install, and which serves as
# the stamp) is newer than its package.json and package-lock.json.
#
# When everything is there the script changes nothing and takes no lock, so that a target can
# call it every time it runs.  Otherwise it takes a lock (flock on build/.provision.lock) and
# looks again, so that two copies started at once (two make targets run in parallel) install
# one after the other and the second finds nothing left to do.
#
# PROVISION_DRY_RUN=1 prints the apt-get and npm commands instead of running them.
set -eu
cd "$(dirname "$0")/.."

usage() {
    echo "usage: scripts/provision.sh PROFILE... (build test bench container fuzz checkpoint s3" \
        "browser api prism k8s ort podman)" >&2
    exit 2
}

# The gRPC front-end (server/grpc/) is built on gRPC's C core and protobuf-c, whose
# compiler generates the message code from api/grpc/*.proto at build time.  The S3 weight-set
# backend speaks HTTP through libcurl (which also signs its requests, AWS Signature Version 4),
# reads the ListObjectsV2 answers with expat, and hashes each body with OpenSSL's SHA-256 for
# the x-amz-content-sha256 header that S3 servers require.
BUILD_DEBS="build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev zlib1g-dev
            libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
            libcurl4-openssl-dev libexpat1-dev libssl-dev"
# The grpc suite generates its Python stubs from api/grpc/*.proto with protoc and
# grpc_python_plugin and speaks through Debian's grpcio and protobuf; its FP16 and BF16
# checks, and the reductions suite's reference (tests/reductions/), are NumPy's.  The
# grpc-limits suite speaks raw HTTP/2 through Debian's h2 (a message that stalls half-way,
# streams that never send one), which no gRPC client can be made to do.
TEST_DEBS="curl valgrind openssl python3-grpcio python3-protobuf protobuf-compiler
           protobuf-compiler-grpc python3-numpy python3-h2"
# The fuzzers (tests/fuzz/) are clang's: libFuzzer is its compiler-rt's (libclang-rt-dev), and
# `make test` builds them so that they keep building (the fuzz-replay suite).
FUZZ_DEBS="clang libclang-rt-dev"
# The checkpoint suite (tests/checkpoints/) builds its models with Debian's PyTorch and NumPy,
# run by /usr/bin/python3 (a python3 earlier on PATH may not see Debian's packages).
CHECKPOINT_DEBS="python3-torch python3-numpy"
# The s3-store suite (tests/s3/) runs a single-node OpenStack Swift, whose s3api middleware is
# an S3 server that checks every request's signature: its proxy (the S3 endpoint), account,
# container and object servers, and the Python package they share; memcached, without which
# Swift's tempauth refuses every request; awscli, the independent S3 client that creates
# the buckets and reads and writes objects behind the server's back; and faketime, whose
# library moves a process's clock (a server two hours behind the store's must say so).
S3_DEBS="swift swift-proxy swift-account swift-container swift-object python3-swift memcached
         awscli faketime"
# What the benchmark scripts (tests/bench/run.sh and the scripts it runs) install for themselves
# when they are run alone: installed here with the rest, they find it there.
BENCH_DEBS="python3-numpy python3-flask gunicorn wrk curl gzip"
# The container tools (docker/, `make image`, `make test-container`): podman with runc
# (crun cannot run on hosts with hybrid cgroups), debootstrap to make the debian:bookworm-slim
# base image where no registry can be reached, netavark with aardvark-dns so that containers
# find each other by name, podman-compose for docker/compose.yaml.  Not installed by the
# container profile when a Docker engine answers.  The container tests also need jq and curl,
# whatever the engine.
PODMAN_DEBS="podman runc debootstrap iptables containernetworking-plugins netavark aardvark-dns
             podman-compose"
CONTAINER_DEBS="jq curl"
# The swarm suite's engine (tests/swarm/swarm.sh): Debian's Docker Engine, whose daemon the
# suite starts itself when none runs, beside podman, which builds the images it loads.
SWARM_DEBS="docker.io"

debs=""
npm_dirs=""
seen=" "

# add PROFILE: adds the Debian packages and the npm folders of PROFILE (and of the profiles it
# includes) to debs and npm_dirs.
add() {
    case "$seen" in *" $1 "*) return 0 ;; esac
    seen="$seen$1 "
    case $1 in
        build) debs="$debs $BUILD_DEBS" ;;
        test)
            add build
            debs="$debs $TEST_DEBS"
            add fuzz; add checkpoint; add s3; add browser; add api; add prism; add k8s ;;
        bench)
            add test; add ort
            debs="$debs $BENCH_DEBS" ;;
        container)
            debs="$debs $CONTAINER_DEBS $SWARM_DEBS"
            if docker info >/dev/null 2>&1; then
                echo "provision: a Docker engine answers: podman not needed"
            else
                add podman
            fi ;;
        fuzz) debs="$debs $FUZZ_DEBS" ;;
        checkpoint) debs="$debs $CHECKPOINT_DEBS" ;;
        s3) debs="$debs $S3_DEBS" ;;
        browser)
            # the census test writes its capture with PyTorch (tests/browser/capture.py)
            add checkpoint
            debs="$debs chromium"; npm_dirs="$npm_dirs tests/browser" ;;
        api) npm_dirs="$npm_dirs api" ;;
        prism) npm_dirs="$npm_dirs tests/prism" ;;
        k8s) npm_dirs="$npm_dirs tests/k8s" ;;
        ort) npm_dirs="$npm_dirs tests/bench/ort" ;;
        podman) debs="$debs $PODMAN_DEBS" ;;
        *) echo "provision: no profile is named '$1'" >&2; usage ;;
    esac
}

[ $# -gt 0 ] || usage
for profile in "$@"; do add "$profile"; done

# missing_debs and stale_npm_dirs: what is still to install, in the order asked, each once.
missing_debs=""
stale_npm_dirs=""
survey() {
    local p d stamp installed
    # One dpkg-query for them all (it names the packages it knows; the others are missing).
    # shellcheck disable=SC2086
    installed=" $(dpkg-query -W -f='${Package} ${Status}\n' $debs 2>/dev/null |
        awk '$3 == "ok" && $4 == "installed" { printf "%s ", $1 }')"
    missing_debs=""
    for p in $debs; do
        case " $missing_debs $installed" in *" $p "*) continue ;; esac
        missing_debs="$missing_debs $p"
    done
    stale_npm_dirs=""
    for d in $npm_dirs; do
        stamp=$d/node_modules/.package-lock.json
        if [ ! -e "$stamp" ] || [ "$d/package.json" -nt "$stamp" ] ||
            [ "$d/package-lock.json" -nt "$stamp" ]; then
            stale_npm_dirs="$stale_npm_dirs $d"
        fi
    done
    if [ -n "$stale_npm_dirs" ] && ! command -v npm >/dev/null 2>&1; then
        echo "provision: npm is missing: nodejs and npm come from Debian"
        for p in nodejs npm; do
            case " $missing_debs " in *" $p "*) ;; *) missing_debs="$missing_debs $p" ;; esac
        done
    fi
}

# run [-C DIR] COMMAND...: runs it (in DIR), or prints it under PROVISION_DRY_RUN=1.  The lock's
# descriptor is not passed on: a service that a package starts must not hold the lock.
run() {
    local dir=.
    if [ "$1" = -C ]; then dir=$2; shift 2; fi
    if [ "${PROVISION_DRY_RUN:-0}" = 1 ]; then
        if [ "$dir" = . ]; then echo "provision: would run: $*"
        else echo "provision: would run: (cd $dir && $*)"; fi
    else
        (cd "$dir" && "$@") 9>&-
    fi
}

survey
[ -z "$missing_debs$stale_npm_dirs" ] && exit 0

mkdir -p build
exec 9>build/.provision.lock
if ! flock -n 9; then
    echo "provision: another provision.sh is installing; waiting for it"
    flock 9
fi
# What the copy that held the lock installed is not to be installed again.
survey
[ -z "$missing_debs$stale_npm_dirs" ] && exit 0

if [ -n "$missing_debs" ]; then
    echo "provision: installing Debian packages:$missing_debs"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi
    # shellcheck disable=SC2086  # one word a package
    run $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    run $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing_debs
fi

for d in $stale_npm_dirs; do
    # ONNX Runtime's install script only fetches GPU libraries from a host these machines cannot
    # reach; the CPU library is in the package.
    flags="--no-audit --no-fund"
    [ "$d" = tests/bench/ort ] && flags="--ignore-scripts $flags"
    echo "provision: installing the pinned npm packages of $d/"
    # shellcheck disable=SC2086
    run -C "$d" npm ci $flags
    run touch "$d/node_modules/.package-lock.json"
done

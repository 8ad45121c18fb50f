#!/usr/bin/env bash
# The newcomer suite (make test-newcomer): README.md's quick start followed as written, in a
# fresh minimal Debian container: the project's debootstrap base, attention-base:bookworm-minbase
# (docker/engine.sh), which has neither make nor curl.  tests/newcomer/newcomer_test.py does
# the work; this script finds the engine and the image, and skips, saying why, where no
# engine can run a container (the rule of tests/container/lib.sh).
#
#   tests/newcomer/newcomer.sh [--readme FILE] [--filter SUBSTR]
#
# --readme runs another copy of the README (to see the suite fail on one that forgets a
# package).  Packages come from the Debian mirror the container suite's builds use, and are
# kept in build/newcomer/apt/ between runs, so that they are downloaded once.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=newcomer
args=("$@")
set --   # lib.sh reads --filter from the check names of its caller; newcomer_test.py does it here
. "$ROOT/tests/container/lib.sh"
trap 'rm -rf "$tmp"' EXIT
cd "$ROOT" || exit 1

BASE_IMAGE=$MINBASE_IMAGE
engine_ready
/usr/bin/python3 tests/newcomer/newcomer_test.py --engine "$ENGINE" --image "$MINBASE_IMAGE" \
    "${args[@]}"

# lib.sh - sourced by the container suites (tests/container/*.sh, tests/swarm/swarm.sh):
# counting, the skip rule, the engine and the base image, and curl wrappers.  The caller sets
# ROOT and SUITE.
#
# A suite skips, with "SKIPPED: SUITE: why" and "0 passed, 0 failed", only when no engine can
# run a container here: no Docker engine and podman cannot be installed, or podman cannot
# start a container.  Everything after that (building the images included) counts as tests.
#
# A suite given --filter SUBSTR runs, when a check named in it (check "NAME", ok "NAME" or
# fail "NAME" in the suite's file) contains SUBSTR, as a whole, since each step builds on the
# ones before, and reports only the checks whose name contains SUBSTR; when none does it
# prints "0 passed, 0 failed" and ends before anything starts.

. "$ROOT/docker/engine.sh"

passed=0
failed=0
filter=
if [ "${1:-}" = --filter ] && [ -n "${2:-}" ]; then
    filter=$2
    if ! grep -oE '(check|ok|fail) "[^"$]+"' "$0" | sed -E 's/^[a-z]+ "(.*)"$/\1/' |
            grep -qF -- "$filter"; then
        echo "0 passed, 0 failed"
        exit 0
    fi
fi
# selected NAME: true when --filter leaves the check NAME in.
selected() { [ -z "$filter" ] || [[ $1 == *"$filter"* ]]; }
FIXTURES=${FIXTURES:-$ROOT/tests/fixtures}
tmp=$(mktemp -d)

# ok NAME / fail NAME WHY: records one result in the runner's format.
ok() { selected "$1" || return 0; echo "ok   $1"; passed=$((passed + 1)); }
fail() { selected "$1" || return 0; echo "FAIL $1: $2"; failed=$((failed + 1)); }

# check NAME WHY COMMAND...: ok when COMMAND succeeds, otherwise a failure with WHY.
check() {
    local name=$1 why=$2; shift 2
    if "$@"; then ok "$name"; else fail "$name" "$why"; fi
}

# summary: prints the closing line; the exit status says whether anything failed.
summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# skip WHY: says plainly that the suite did not run and why, and ends it without a failure.
skip() {
    echo "SKIPPED: $SUITE: $1"
    echo "0 passed, 0 failed"
    exit 0
}

# engine_ready: installs what is missing (`make container-deps`: jq, curl, and podman when
# no Docker engine answers), selects the engine, makes the base image and proves that a
# container starts.  It skips the suite when no engine can run a container here; a base
# image that cannot be made is a failure.
engine_ready() {
    make -C "$ROOT" --no-print-directory container-deps >"$tmp/deps.log" 2>&1 ||
        skip "the container tools could not be installed: $(tail -n 1 "$tmp/deps.log")"
    engine_select || skip "$ENGINE_WHY_NOT"
    echo "engine: $ENGINE ($($ENGINE --version))"
    if ! base_image_ensure; then
        fail "$SUITE/base-image" "could not make $BASE_IMAGE (debootstrap from $(debian_mirror))"
        summary
        exit 1
    fi
    local err
    if ! err=$($ENGINE run --rm --network none "$BASE_IMAGE" true 2>&1); then
        skip "$ENGINE cannot start a container here: $(echo "$err" | tail -n 1)"
    fi
}

# now: seconds since the epoch, with fractions.
now() { date +%s.%N; }

# seconds_since T0: prints the seconds elapsed since T0, to a tenth.
seconds_since() { awk -v t0="$1" -v t1="$(now)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

# http METHOD URL [CURL ARGS...]: sends one request; the body goes to $tmp/body and the
# status code is printed ("000" when the connection failed).
http() {
    local method=$1 url=$2; shift 2
    curl -s -o "$tmp/body" -w '%{http_code}' -X "$method" --max-time 30 "$@" "$url"
}

# wait_healthz URL SECONDS [CONTAINER]: true once URL/healthz answers 200, false after
# SECONDS, or as soon as CONTAINER (when given) has stopped: nothing will answer then.
wait_healthz() {
    local i
    for ((i = 0; i < $2 * 5; i++)); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1/healthz")" = 200 ] && return 0
        if [ -n "${3:-}" ] && [ $((i % 5)) = 4 ] &&
            [ "$($ENGINE inspect --format '{{.State.Running}}' "$3" 2>/dev/null)" = false ]; then
            return 1
        fi
        sleep 0.2
    done
    return 1
}

# route_conflicts: prints the host's routes that send one subnet to two interfaces (one of
# them down), and what to do.  A bridge podman made with CNI (cni-podman0) outlives a switch
# to netavark; with the same subnet, 10.88.0.0/16, its dead route comes first and a published
# port never reaches the container although the server inside listens.
route_conflicts() {
    local dups
    dups=$(ip route 2>/dev/null | awk '{print $1}' | sort | uniq -d)
    [ -z "$dups" ] && return 0
    local net
    for net in $dups; do
        echo "# the host routes $net through two interfaces:"
        ip route | grep "^$net " | sed 's/^/#   /'
    done
    echo "# a bridge left by podman's CNI backend shadows netavark's; remove it (ip link delete cni-podman0)"
}

# matches_fixture RESPONSE FIXTURE: true when the response's output and attention equal the
# fixture's expected ones, element by element within the fixture's tolerance, in the same
# shape.
matches_fixture() {
    jq -e -n --slurpfile got "$1" --slurpfile fx "$2" '
        $fx[0].expect as $e | $got[0] as $g |
        ["output", "attention"] | all(
            . as $k |
            ($g[$k] | tojson | gsub("[-0-9.eE+]+"; "0")) == ($e[$k] | tojson | gsub("[-0-9.eE+]+"; "0"))
            and ([$g[$k] | .. | numbers] as $a | [$e[$k] | .. | numbers] as $b |
                 ($a | length) > 0 and ($a | length) == ($b | length) and
                 all(range(0; $a | length); ($a[.] - $b[.] | fabs) <= $e.tolerance)))' >/dev/null
}

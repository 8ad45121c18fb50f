#!/usr/bin/env bash
# Runs the test suites of the project and prints their combined count as the last line,
# "N passed, N failed".  Each suite is a program that prints its own "N passed, N failed"
# line; a suite that dies without one counts as one failure.  A suite that cannot run here
# (the container suites and newcomer without a container engine) prints "SKIPPED: NAME: why" and
# "0 passed, 0 failed"; the skips are listed again before the total.  Called by `make test`
# after the builds; run from the repository root.
#
#   tests/run.sh                       every suite
#   tests/run.sh unit v2               the suites named (`make test SUITES="unit v2"`)
#   tests/run.sh --filter drain [SUITE...]
#                                      only the tests whose name contains "drain"
#                                      (`make test T=drain`), in every suite (or the
#                                      suites named); a suite where no test matches
#                                      prints "0 passed, 0 failed", and starts no server
#   tests/run.sh --list                the names of the suites, one a line
#
# What a name is, suite by suite (each takes --filter SUBSTR, or as noted):
#   unit, unit-asan, unit-valgrind     the test's name in tests/unit/test.h (UNIT_TESTS)
#   reference                          "fixture/NAME" of each fixture, "property/..."
#   perf-table                         the printed name, "perf-table/..."
#   integration*, v2, crash*, hostile, shared-store
#                                      the name printed on the test's "ok" line; the
#                                      integration-PATH-GROUP suites add it to their own
#                                      filter (both must match).  The "server/..." checks of
#                                      a server that was started are reported whatever
#                                      the filter says; a test that later ones build on
#                                      runs, unreported, when one of them is chosen
#   checkpoints*, compression-asan, triton-asan, operations-asan, grpc*, reductions*,
#   overflow, bf16, sequences*, policies*, s3-store
#                                      the name of the check function (check_bad_files,
#                                      check_torch_mha/mha.kdim, check_visible, ...)
#   openapi-answers, k8s-manifests     the case's name (as printed), through the
#                                      environment variable TEST_FILTER
#   openapi-lint                       its one check, "openapi-lint"
#   fuzz-replay                        "fuzz-replay/FUZZER" (api, json-fast, grpc)
#   container, compose, swarm          the check's name (image/..., run/..., compose/...,
#                                      swarm/...);
#                                      the whole script runs when one matches, reporting
#                                      only the matching checks
#   newcomer                           "N: first line" of a README block, as printed; the
#                                      blocks before it run too
#   browser                            the test's name (make's T=)
#   viz-capture                        the check's name (capture/...)
set -u
cd "$(dirname "$0")/.."

FIXTURES=${FIXTURES:-tests/fixtures}
total_passed=0
total_failed=0
skipped=
durations=
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

# run_suite NAME COMMAND...: runs one suite, shows its output, adds up its summary.
run_suite() {
    local name=$1; shift
    local log="$log_dir/$name.log"
    echo "=== $name: $*"
    local began=$SECONDS
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # each suite's wall time, listed longest first before the total: what to look at when
    # make test nears its half hour
    durations="$durations$((SECONDS - began)) s  $name"$'\n'
    local summary
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$summary" ]; then
        echo "--- $name ended (exit status $rc) without a summary: counted as 1 failure"
        total_failed=$((total_failed + 1))
        return
    fi
    skipped="$skipped$(grep -E '^SKIPPED: ' "$log")"$'\n'
    local p f
    p=$(echo "$summary" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$summary" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "--- $name exited with status $rc although it reported no failure: counted as 1 failure"
        f=1
    fi
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
}

# The servers the suites start serve HTTP only, so that no two of them (nor a server of the
# user's) contend for gRPC's default port 8001; the grpc suites ask for a free port each.
export ATTN_GRPC_PORT=0
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# every_suite: the suites in the order they run, each through `suite NAME COMMAND...`.
# With --filter the pattern goes to the command as "--filter SUBSTR" after its arguments;
# FILTER_FLAG names another flag (one ending in "=" takes the pattern in the same word, as
# make's T=SUBSTR), and FILTER_FLAG=env passes it as TEST_FILTER in the environment.
every_suite() {
    # Two processes share each list (tests/unit/shards.sh): most unit tests run on one
    # thread, and one process left the second core idle.  Under valgrind the kernel tests run
    # the server's paths only: with two paths they took 235 s there, and the tests'
    # avx512-on-avx2 (tests/unit/kernel_avx512_on_avx2.c) would add half as much again;
    # unit-asan runs it.
    suite unit bash tests/unit/shards.sh --build plain
    suite unit-asan bash tests/unit/shards.sh --build asan
    suite unit-valgrind bash tests/unit/shards.sh --build valgrind
    suite reference build/ref_check "$FIXTURES"
    suite layers /usr/bin/python3 tests/layers/layers_check.py
    suite fuzz-replay bash tests/fuzz/replay.sh
    suite perf-table /usr/bin/python3 tests/bench/perf_table_test.py
    suite readme /usr/bin/python3 tests/readme/readme_test.py --server build/attention-server
    suite viz-capture /usr/bin/python3 tests/browser/capture.py
    suite integration build/itest --server build/attention-server --fixtures "$FIXTURES" \
        --cases tests/integration/cases
    suite integration-asan build/itest --server build/asan/attention-server --fixtures "$FIXTURES" \
        --cases tests/integration/cases
    suite v2 build/v2test --server build/asan/attention-server
    # The answers checked against the reference and the golden files again with each
    # narrower kernel path forced (the suites above run the widest this CPU has; see
    # server/kernel/attention_fused.h).  The unit tests run every path the CPU has already.
    local kernel_paths=portable path group
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
        kernel_paths="avx2 $kernel_paths"
    fi
    for path in $kernel_paths; do
        for group in random/ fixture/; do
            suite "integration-$path-${group%/}" env ATTN_KERNEL="$path" build/itest \
                --server build/attention-server --fixtures "$FIXTURES" \
                --cases tests/integration/cases --filter "$group"
        done
    done
    suite checkpoints /usr/bin/python3 tests/checkpoints/checkpoint_test.py \
        --server build/attention-server
    suite checkpoints-asan /usr/bin/python3 tests/checkpoints/checkpoint_test.py \
        --server build/asan/attention-server
    suite compression-asan /usr/bin/python3 tests/compression/compression_test.py \
        --server build/asan/attention-server
    suite triton-asan /usr/bin/python3 tests/triton/triton_test.py \
        --server build/asan/attention-server
    suite operations-asan /usr/bin/python3 tests/operations/operations_test.py \
        --server build/asan/attention-server
    suite grpc /usr/bin/python3 tests/grpc/grpc_test.py --server build/attention-server
    suite grpc-asan /usr/bin/python3 tests/grpc/grpc_test.py --server build/asan/attention-server
    # plain build only: it reads the server's resident memory against its budget, which
    # AddressSanitizer's shadow and quarantine would swamp
    suite grpc-limits /usr/bin/python3 tests/grpc/grpc_limits_test.py --server build/attention-server
    suite reductions /usr/bin/python3 tests/reductions/reductions_test.py \
        --server build/attention-server
    suite reductions-asan /usr/bin/python3 tests/reductions/reductions_test.py \
        --server build/asan/attention-server
    suite overflow /usr/bin/python3 tests/numbers/overflow_test.py --server build/attention-server
    suite bf16 /usr/bin/python3 tests/numbers/bf16_test.py --server build/attention-server
    # sequences-asan leaves out the resident-size comparison (it prints SKIPPED for it):
    # AddressSanitizer's shadow and quarantine swamp it, and LeakSanitizer checks the leaks
    suite sequences /usr/bin/python3 tests/sequences/sequence_test.py --server build/attention-server
    suite sequences-asan /usr/bin/python3 tests/sequences/sequence_test.py \
        --server build/asan/attention-server
    suite policies /usr/bin/python3 tests/sequences/policy_test.py --server build/attention-server
    # policies-asan replays 300 steps, not 2,000: the trims are the same code a step after
    # the budget is reached, and ASan's slowdown would cost half a minute
    suite policies-asan env POLICY_STEPS=300 /usr/bin/python3 tests/sequences/policy_test.py \
        --server build/asan/attention-server
    suite crash build/crashtest --server build/attention-server --puts 300
    suite hostile build/hostile --server build/attention-server
    # 300 PUTs in the plain build and 250 in the ASan build, whose part is the memory errors
    # of a start-up's scan and a write cut short, which every kill exercises (500 each took
    # over three minutes of make test's half hour together).
    suite crash-asan build/crashtest --server build/asan/attention-server --puts 250
    suite shared-store build/sharetest --server build/attention-server
    # the shared-store scenarios on an S3 bucket: a single-node Swift (tests/s3/swift_s3.sh)
    # started once, three replicas sharing only the bucket, awscli as the independent client
    suite s3-store /usr/bin/python3 tests/s3/s3_store_test.py --server build/attention-server
    suite openapi-lint bash tests/lint-api.sh
    FILTER_FLAG=env suite openapi-answers make --no-print-directory check-api-answers
    suite container bash tests/container/image.sh
    # README.md's quick start as written, in a fresh minimal Debian container
    suite newcomer bash tests/newcomer/newcomer.sh
    FILTER_FLAG=env suite k8s-manifests make --no-print-directory lint-k8s
    FILTER_FLAG=T= suite browser make --no-print-directory test-browser
    suite compose bash tests/container/compose.sh
    suite swarm bash tests/swarm/swarm.sh
}

filter=
chosen=()
while [ $# -gt 0 ]; do
    case $1 in
        --filter) [ $# -ge 2 ] || { echo "run.sh: --filter needs a pattern" >&2; exit 2; }
                  filter=$2; shift 2 ;;
        --list) mode=list; shift ;;
        -*) echo "run.sh: unknown option $1 (see the top of tests/run.sh)" >&2; exit 2 ;;
        *) chosen+=("$1"); shift ;;
    esac
done

# A first pass over every_suite only collects the names, so that a mistyped one is refused
# before anything runs.
known=()
suite() { known+=("$1"); }
every_suite
if [ "${mode:-}" = list ]; then printf '%s\n' "${known[@]}"; exit 0; fi
for name in "${chosen[@]}"; do
    if ! printf '%s\n' "${known[@]}" | grep -qx -- "$name"; then
        echo "run.sh: no suite is named '$name'; the suites: ${known[*]}" >&2
        exit 2
    fi
done
if [ ${#chosen[@]} -eq 0 ]; then chosen=("${known[@]}"); fi

# selected NAME: true when the suite NAME is to run.
selected() { printf '%s\n' "${chosen[@]}" | grep -qx -- "$1"; }
suite() {
    local name=$1; shift
    selected "$name" || return 0
    local flag=${FILTER_FLAG:---filter}
    if [ -z "$filter" ]; then run_suite "$name" "$@"
    elif [ "$flag" = env ]; then run_suite "$name" env TEST_FILTER="$filter" "$@"
    elif [ "${flag%=}" != "$flag" ]; then run_suite "$name" "$@" "$flag$filter"
    else run_suite "$name" "$@" "$flag" "$filter"; fi
}
every_suite

echo
echo "The suites' wall times, longest first:"
echo -n "$durations" | grep -v '^$' | sort -rn | head -n 12 | sed 's/^/  /'
# Suites that could not run here say so with a "SKIPPED: NAME: why" line; they are named
# again just before the total, so that a skip is never mistaken for a pass.
echo -n "$skipped" | grep -v '^$'
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]

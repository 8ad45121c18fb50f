#!/usr/bin/env bash
# shards.sh - the unit, unit-asan and unit-valgrind suites: the unit tests' list run by N
# processes at once (two by default, as the machine make test is sized for has two cores).
# Most unit tests run on one thread, so one process left the second core idle for most of
# the suites' minutes; valgrind runs a process's threads one at a time anyway. The processes
# share one queue file (unit-tests --queue FILE): each takes the next test of the list as it
# finishes one, so the slow kernel tests spread over them however the list changes. Every
# test still runs once, with the same options; each shard's output is printed whole after it
# ends, then the total.
#
#   tests/unit/shards.sh --build plain|asan|valgrind [--shards N] [--filter SUBSTR]
#
#   plain      build/unit-tests
#   asan       build/asan/unit-tests (AddressSanitizer, UndefinedBehaviorSanitizer and
#              LeakSanitizer, with the ASAN_OPTIONS tests/run.sh sets)
#   valgrind   build/unit-tests under memcheck, with UNIT_CPU_PATHS_ONLY=1: the kernel
#              tests run the paths the server has, the tests' avx512-on-avx2 is left to
#              plain and asan
#
# Prints the shards' "ok"/"FAIL" lines and "N passed, N failed" (their sums); exits non-zero
# when any shard did (a failed test, a sanitizer's report, or memcheck's --error-exitcode 9),
# and a shard that ends without its summary line counts as one failure.
set -u
cd "$(dirname "$0")/../.."

shards=2
filter=()
build=
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --shards) shards=$2; shift 2
                  [[ $shards =~ ^[1-9][0-9]*$ ]] || { echo "shards.sh: --shards needs a count" >&2; exit 2; } ;;
        --filter) filter=(--filter "$2"); shift 2 ;;
        *) echo "shards.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case $build in
    plain) command=(build/unit-tests) ;;
    asan) command=(build/asan/unit-tests) ;;
    valgrind) command=(env UNIT_CPU_PATHS_ONLY=1 valgrind -q --error-exitcode=9 --leak-check=full
                       --errors-for-leak-kinds=definite,indirect build/unit-tests) ;;
    *) echo "shards.sh: --build must be plain, asan or valgrind" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/queue"
pids=()
for ((k = 0; k < shards; k++)); do
    "${command[@]}" --queue "$work/queue" "${filter[@]}" >"$work/out.$k" 2>&1 &
    pids+=($!)
done
passed=0 failed=0 rc=0
for ((k = 0; k < shards; k++)); do
    wait "${pids[$k]}"
    status=$?
    echo "--- shard $((k + 1)) of $shards (exit status $status)"
    grep -v -E '^[0-9]+ passed, [0-9]+ failed$' "$work/out.$k"
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$work/out.$k" | tail -n 1)
    if [ -z "$summary" ]; then
        echo "FAIL shard $((k + 1)) of $shards: ended without its summary line"
        failed=$((failed + 1))
    else
        passed=$((passed + ${summary%% passed*}))
        f=${summary#*, }
        failed=$((failed + ${f%% failed}))
    fi
    [ "$status" -ne 0 ] && rc=1
done
echo "$passed passed, $failed failed"
exit $rc

#!/usr/bin/env bash
# replay.sh - the fuzz-replay suite of `make test`: each fuzzer of `make fuzz` (build/fuzz/,
# built by `make test-build`) executes every input of its seed corpus once, without fuzzing.
# One test per fuzzer ("fuzz-replay/api", "fuzz-replay/json-fast", "fuzz-replay/grpc"): it
# passes when the fuzzer exits 0 having executed each seed; a crash, a sanitizer report, a
# leak, a harness's own check failing on a seed, or a seed left unexecuted fails it, with the
# fuzzer's output shown.  So the harnesses keep building and working between fuzzing
# campaigns; finding new inputs is `make fuzz`'s work.  A seed that fails is its own
# reproducer: build/fuzz/fuzz-NAME SEED.
#
#   tests/fuzz/replay.sh [--filter SUBSTR]
set -u
cd "$(dirname "$0")/../.." || exit 1
filter=
[ "${1:-}" = --filter ] && filter=${2:-}

passed=0
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# replay NAME FUZZER SEED_DIR
replay() {
    local name=fuzz-replay/$1 fuzzer=$2 seeds=("$3"/*)
    case $name in *"$filter"*) ;; *) return 0 ;; esac
    if [ ! -x "$fuzzer" ]; then
        echo "FAIL $name: $fuzzer is not built (make test-build builds it)"
        failed=$((failed + 1))
        return
    fi
    # -timeout: a seed that hangs fails after 20 s; timeout(1) bounds the whole run.
    timeout 300 "$fuzzer" -timeout=20 "${seeds[@]}" >"$out" 2>&1
    local rc=$? ran
    ran=$(grep -c '^Executed ' "$out")
    if [ $rc -eq 0 ] && [ "$ran" -eq ${#seeds[@]} ]; then
        echo "ok   $name ($ran seeds)"
        passed=$((passed + 1))
    else
        echo "FAIL $name: exit $rc, $ran of ${#seeds[@]} seeds executed; its output:"
        sed 's/^/    /' "$out" | tail -n 60
        failed=$((failed + 1))
    fi
}

replay api build/fuzz/fuzz-api tests/fuzz/corpus
replay json-fast build/fuzz/fuzz-json-fast tests/fuzz/corpus-json
replay grpc build/fuzz/fuzz-grpc tests/fuzz/corpus-grpc
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

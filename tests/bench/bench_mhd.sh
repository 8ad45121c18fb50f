#!/usr/bin/env bash
# bench_mhd.sh - which libmicrohttpd threading model should the server use?  Measured, not
# assumed.  `make bench-mhd` builds one server per model (build/bench/mhd/, see the
# top of server/http/http.c) and runs this script with their names.
#
# For each model, on a fresh server with --max-inflight 256 (so that the limit, not the model,
# never turns requests away) and everything else at its default:
#   seed   wrk, 16 connections, the smallest fixture's request: requests/s and p99 latency;
#   mix    the same load while one other client sends, back to back, a slow request
#          (slow2048.json: about 9 GFLOP, several hundred ms): the small requests' requests/s,
#          p99 and worst latency, and how many slow requests completed. A model in which a
#          busy thread stalls the connections it polls shows it here.
# Each figure is the median of BENCH_MHD_REPS (default 3) runs of BENCH_MHD_SECONDS (default 4).
# Usage: bash tests/bench/bench_mhd.sh [--quick] VARIANT...   (VARIANT: tpc-select, pool2, ...)
# Writes build/bench/results/mhd.tsv and prints a table. Every server started here is stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
. tests/bench/wrk.sh

REPS=${BENCH_MHD_REPS:-3}
SECS=${BENCH_MHD_SECONDS:-4}
if [ "${1:-}" = --quick ]; then REPS=1 SECS=2; shift; fi
[ $# -gt 0 ] || { echo "usage: bench_mhd.sh [--quick] VARIANT..." >&2; exit 2; }
RESULTS=build/bench/results
mkdir -p "$RESULTS"
bench_need_debs wrk curl python3-numpy
work=$(mktemp -d)
slow_pid=
cleanup() {
    [ -n "$slow_pid" ] && kill "$slow_pid" 2>/dev/null
    bench_stop_all
    rm -rf "$work"
}
trap cleanup EXIT
"$BENCH_PYTHON" tests/bench/make_bodies.py "$work" seed slow2048

printf 'model\tseed_rps\tseed_p99_ms\tmix_rps\tmix_p99_ms\tmix_max_ms\tslow_done\terrors\n' \
    >"$RESULTS/mhd.tsv"
echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $REPS x $SECS s per figure"
for variant in "$@"; do
    BENCH_SERVER=build/bench/mhd/attention-server-$variant
    [ -x "$BENCH_SERVER" ] || { echo "bench_mhd.sh: $BENCH_SERVER is missing" >&2; exit 1; }
    export BENCH_SERVER
    bench_start_ours "$variant" "$work" --max-inflight 256
    url=$BENCH_URL
    : >"$work/seed_rps"; : >"$work/seed_p99"; : >"$work/mix_rps"; : >"$work/mix_p99"
    : >"$work/mix_max"; : >"$work/slow"; rm -f "$work"/slow.*
    errors=0
    for rep in $(seq "$REPS"); do
        bench_wrk "$url" "$work/seed.json" 16 "$SECS"
        echo "$WRK_RPS" >>"$work/seed_rps"; echo "$WRK_P99_MS" >>"$work/seed_p99"
        errors=$((errors + WRK_ERRORS))
        # The slow client: one connection, one request after another, until killed.
        ( n=0; while :; do
              curl -s -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' \
                  --data-binary @"$work/slow2048.json" "$url/v1/attention" >>"$work/slow.$rep"
          done ) &
        slow_pid=$!
        sleep 0.3
        bench_wrk "$url" "$work/seed.json" 16 "$SECS"
        kill "$slow_pid" 2>/dev/null; wait "$slow_pid" 2>/dev/null || true; slow_pid=
        echo "$WRK_RPS" >>"$work/mix_rps"; echo "$WRK_P99_MS" >>"$work/mix_p99"
        echo "$WRK_MAX_MS" >>"$work/mix_max"
        grep -c '^200$' "$work/slow.$rep" >>"$work/slow" || echo 0 >>"$work/slow"
        errors=$((errors + WRK_ERRORS))
    done
    bench_stop_all
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$(bench_median <"$work/seed_rps")" \
        "$(bench_median <"$work/seed_p99")" "$(bench_median <"$work/mix_rps")" "$(bench_median <"$work/mix_p99")" \
        "$(bench_median <"$work/mix_max")" "$(bench_median <"$work/slow")" "$errors" | tee -a "$RESULTS/mhd.tsv"
done
echo
column -t -s $'\t' "$RESULTS/mhd.tsv"

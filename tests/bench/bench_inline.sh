#!/usr/bin/env bash
# bench_inline.sh - does answering small requests on the I/O thread pay, and does it stall the
# I/O threads?  Compares server binaries (or one binary with different flags) in one sitting.
#
# For each VARIANT, given as NAME=BINARY[,FLAG...] (flags separated by commas), on a fresh
# server at its defaults plus those flags, access log off:
#   seed    wrk, 16 connections, the smallest fixture's request (191 B): requests/s, p99;
#   seed1k  the same with the request of tests/fixtures/seed000_encoder.json (1,240 B);
#   mix     the seed load while one other client sends, back to back, slow2048.json (about
#           9 GFLOP, several hundred ms each): the small requests' requests/s, p99 and worst
#           latency, and how many slow requests completed.
# Each figure is the median of BENCH_INLINE_REPS (default 3) runs of BENCH_INLINE_SECONDS
# (default 5). Variants are interleaved run by run, so that a change in the machine's load
# falls on all of them alike.
# Usage: bash tests/bench/bench_inline.sh before=/tmp/before/build/attention-server \
#            after=build/attention-server off=build/attention-server,--inline-max-bytes,0
# With BENCH_INLINE_PEER=1 the Flask + NumPy peer of make bench (tests/bench/peer.py) is
# measured on the seed load too, the same number of runs, after the variants.
# Writes build/bench/results/inline.tsv. Every server and client started here is stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
. tests/bench/wrk.sh

REPS=${BENCH_INLINE_REPS:-3}
SECS=${BENCH_INLINE_SECONDS:-5}
[ $# -gt 0 ] || { echo "usage: bench_inline.sh NAME=BINARY[,FLAG...]..." >&2; exit 2; }
RESULTS=build/bench/results
mkdir -p "$RESULTS"
work=$(mktemp -d)
slow_pid=
cleanup() {
    [ -n "$slow_pid" ] && kill "$slow_pid" 2>/dev/null
    bench_stop_all
    rm -rf "$work"
}
trap cleanup EXIT
"$BENCH_PYTHON" tests/bench/make_bodies.py "$work" seed slow2048
"$BENCH_PYTHON" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["request"], open(sys.argv[2], "w"))' \
    tests/fixtures/seed000_encoder.json "$work/seed1k.json"

echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $REPS x $SECS s per figure"
for rep in $(seq "$REPS"); do
    for variant in "$@"; do
        name=${variant%%=*}
        IFS=, read -r -a spec <<<"${variant#*=}"
        BENCH_SERVER=${spec[0]}
        export BENCH_SERVER
        bench_start_ours "$name" "$work" "${spec[@]:1}"
        url=$BENCH_URL
        bench_wrk "$url" "$work/seed.json" 16 "$SECS"
        echo "$WRK_RPS" >>"$work/$name.seed_rps"; echo "$WRK_P99_MS" >>"$work/$name.seed_p99"
        echo "$WRK_ERRORS" >>"$work/$name.errors"
        bench_wrk "$url" "$work/seed1k.json" 16 "$SECS"
        echo "$WRK_RPS" >>"$work/$name.seed1k_rps"; echo "$WRK_P99_MS" >>"$work/$name.seed1k_p99"
        echo "$WRK_ERRORS" >>"$work/$name.errors"
        # The slow client: one connection, one request after another, until killed (at most
        # 200 requests).
        : >"$work/$name.slow.$rep"
        ( for _ in $(seq 200); do
              curl -s -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' \
                  --data-binary @"$work/slow2048.json" "$url/v1/attention" >>"$work/$name.slow.$rep"
          done ) &
        slow_pid=$!
        sleep 0.3
        bench_wrk "$url" "$work/seed.json" 16 "$SECS"
        kill "$slow_pid" 2>/dev/null; wait "$slow_pid" 2>/dev/null || true; slow_pid=
        echo "$WRK_RPS" >>"$work/$name.mix_rps"; echo "$WRK_P99_MS" >>"$work/$name.mix_p99"
        echo "$WRK_MAX_MS" >>"$work/$name.mix_max"; echo "$WRK_ERRORS" >>"$work/$name.errors"
        grep -c '^200$' "$work/$name.slow.$rep" >>"$work/$name.slow" || echo 0 >>"$work/$name.slow"
        curl -s "$url/metrics" | grep '^attn_http_dispatch_total' | tr '\n' ' ' >"$work/$name.dispatch" || true
        bench_stop_all
    done
done
printf 'variant\tseed_rps\tseed_p99_ms\tseed1k_rps\tseed1k_p99_ms\tmix_rps\tmix_p99_ms\tmix_max_ms\tslow_done\terrors\n' \
    >"$RESULTS/inline.tsv"
for variant in "$@"; do
    name=${variant%%=*}
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$(bench_median <"$work/$name.seed_rps")" \
        "$(bench_median <"$work/$name.seed_p99")" "$(bench_median <"$work/$name.seed1k_rps")" \
        "$(bench_median <"$work/$name.seed1k_p99")" "$(bench_median <"$work/$name.mix_rps")" \
        "$(bench_median <"$work/$name.mix_p99")" "$(bench_median <"$work/$name.mix_max")" \
        "$(bench_median <"$work/$name.slow")" "$(awk '{ s += $1 } END { print s }' "$work/$name.errors")" \
        >>"$RESULTS/inline.tsv"
    echo "$name (last run): $(cat "$work/$name.dispatch" 2>/dev/null)"
done
if [ "${BENCH_INLINE_PEER:-0}" = 1 ]; then
    bench_start_peer peer "$work"
    for rep in $(seq "$REPS"); do
        bench_wrk "$BENCH_URL" "$work/seed.json" 16 "$SECS"
        echo "$WRK_RPS" >>"$work/peer.seed_rps"; echo "$WRK_P99_MS" >>"$work/peer.seed_p99"
    done
    bench_stop_all
    printf 'peer\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\n' "$(bench_median <"$work/peer.seed_rps")" \
        "$(bench_median <"$work/peer.seed_p99")" >>"$RESULTS/inline.tsv"
fi
echo
column -t -s $'\t' "$RESULTS/inline.tsv"

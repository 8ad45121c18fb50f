#!/usr/bin/env bash
# bench_grpc.sh - the gRPC front-end against HTTP v2 binary on the same server, same bytes.
#
# Starts build/attention-server (its defaults, gRPC on a free loopback port). build/bench/grpc-load
# (grpc_load.c) builds each case's ModelInferRequest and writes the same numbers as a binary HTTP
# v2 request (--write-v2); one call each way first checks that both answers are the same bytes
# (a benchmark of a wrong answer fails the run). Then:
#   grpc4096   q, k, v of 4096 x 64 FP32, output only, one call at a time for SECS s: the mean
#              latency against the server's own compute_ms (the kernel's time), i.e. what the
#              protocol costs around the computation                          (target <= 1.3x)
#   grpcseed   q, k, v of the seed case's size (3 x 2: tests/fixtures/seed004_toy projects
#              x 3 x 3 to d = 2), FP32, output only, 16 concurrent calls (grpc-load: one client
#              thread driving them on a completion queue, as wrk drives its connections) against 16
#              connections of wrk on HTTP v2 binary: calls/s over requests/s, the p99 of both
#              beside each other                                               (target >= 0.8x)
#              REPS runs of each, interleaved (gRPC, HTTP, gRPC, ...), medians.
# Settings: BENCH_HTTP_SECONDS and BENCH_HTTP_REPS, as bench_http.sh (defaults 5 and 3).
#
# Usage: bash tests/bench/bench_grpc.sh [--quick] [RESULTS_DIR]   (default build/bench/results)
# Writes RESULTS_DIR/table-grpc.tsv (rows of the summary table), grpc.tsv (every run) and
# checks-grpc.tsv. Exit status 1 when the answers differ, a call fails or the server dies.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
. tests/bench/wrk.sh

REPS=${BENCH_HTTP_REPS:-3}
SECS=${BENCH_HTTP_SECONDS:-5}
if [ "${1:-}" = --quick ]; then REPS=1 SECS=2; shift; fi
RESULTS=${1:-build/bench/results}
LOAD=build/bench/grpc-load
mkdir -p "$RESULTS"

bench_need_debs wrk curl
for bin in build/attention-server "$LOAD"; do
    [ -x "$bin" ] || { echo "bench_grpc.sh: $bin is missing (make bench)" >&2; exit 1; }
done

work=$(mktemp -d)
cleanup() {
    bench_stop_all
    rm -rf "$work"
}
trap cleanup EXIT

grpc_port=$(bench_free_port)
bench_start_ours ours "$work" --grpc-port "$grpc_port"
URL=$BENCH_URL PID=$BENCH_PID TARGET=127.0.0.1:$grpc_port
echo "ours at $URL and grpc://$TARGET (defaults); $REPS x $SECS s per figure, interleaved"

: >"$RESULTS/checks-grpc.tsv"
: >"$RESULTS/table-grpc.tsv"
printf 'case\tprotocol\tconcurrency\trep\trequests\terrors\trps\tmean_ms\tp50_ms\tp99_ms\tcompute_ms\n' \
    >"$RESULTS/grpc.tsv"
failed=0

# grpc CASE REP ARGS...: one grpc-load run; sets G_RPS, G_MEAN_MS, G_P99_MS, G_COMPUTE_MS.
grpc() {
    local case=$1 rep=$2 line
    shift 2
    if ! line=$("$LOAD" --target "$TARGET" "$@" | grep '^GRPC ') || ! kill -0 "$PID" 2>/dev/null; then
        echo "bench_grpc.sh: gRPC failed in $case: ${line:-no result}" >&2
        failed=1
    fi
    eval "$(echo "$line" | sed -E 's/^GRPC //; s/([a-z0-9_]+)=/local g_\1=/g; s/ local /; local /g')"
    G_RPS=${g_rps:-} G_MEAN_MS=${g_mean_ms:-} G_P99_MS=${g_p99_ms:-} G_COMPUTE_MS=${g_compute_ms:-}
    printf '%s\tgrpc\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "${conc:-1}" "$rep" \
        "${g_calls:-}" "${g_failed:-}" "$G_RPS" "$G_MEAN_MS" "${g_p50_ms:-}" "$G_P99_MS" \
        "$G_COMPUTE_MS" >>"$RESULTS/grpc.tsv"
}

# check CASE ARGS...: writes CASE's request for HTTP, makes one gRPC call and one HTTP v2 call,
# and compares the answers' bytes (gRPC's raw outputs against the binary section of HTTP's).
check() {
    local case=$1 hlen out
    shift
    "$LOAD" --target "$TARGET" "$@" --concurrency 1 --max-calls 1 --write-v2 "$work/$case.v2" \
        --save-output "$work/$case.grpc.out" >/dev/null || return 1
    out=$(curl -sS -o "$work/$case.http.out" -D "$work/$case.http.headers" -w '%{http_code}' \
        -X POST -H 'Content-Type: application/octet-stream' \
        -H "Inference-Header-Content-Length: $(cat "$work/$case.v2.hlen")" \
        --data-binary "@$work/$case.v2" "$URL/v2/models/attention/infer") || return 1
    [ "$out" = 200 ] || { echo "bench_grpc.sh: HTTP answered $out" >&2; return 1; }
    hlen=$(sed -nE 's/^inference-header-content-length: *([0-9]+).*/\1/Ip' "$work/$case.http.headers")
    [ -n "$hlen" ] || { echo "bench_grpc.sh: HTTP's answer is not binary" >&2; return 1; }
    tail -c +"$((hlen + 1))" "$work/$case.http.out" >"$work/$case.http.raw"
    if cmp -s "$work/$case.grpc.out" "$work/$case.http.raw"; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "grpc $case" "gRPC raw outputs vs HTTP v2 binary" \
            "$(stat -c %s "$work/$case.grpc.out") B" "equal" "0" "bit for bit" |
            tee -a "$RESULTS/checks-grpc.tsv"
    else
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "grpc $case" "gRPC raw outputs vs HTTP v2 binary" \
            "$(stat -c %s "$work/$case.grpc.out") B" "DIFFER" "0" "bit for bit" |
            tee -a "$RESULTS/checks-grpc.tsv"
        return 1
    fi
}

row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS/table-grpc.tsv"; }

BIG=(--lq 4096 --lk 4096 --d 64 --outputs output)
SMALL=(--lq 3 --lk 3 --d 2 --outputs output)

echo "== grpc4096"
if check grpc4096 "${BIG[@]}"; then
    # One warm-up call, then one call after another for SECS s.
    conc=1 grpc grpc4096 0 "${BIG[@]}" --concurrency 1 --max-calls 1
    conc=1 grpc grpc4096 1 "${BIG[@]}" --concurrency 1 --seconds "$SECS"
    echo "  gRPC 4096x64: mean $G_MEAN_MS ms, p99 $G_P99_MS ms, server's compute_ms $G_COMPUTE_MS"
    row grpc "gRPC ModelInfer q,k,v 4096x64 float32, output only, 1 call at a time: mean vs the kernel's compute_ms" \
        "$G_MEAN_MS" "$G_COMPUTE_MS" ms "<=1.3" "" "" "" \
        "ratio = the call's time / the server's compute_ms of the same calls"
else failed=1; fi

echo "== grpcseed"
if check grpcseed "${SMALL[@]}"; then
    : >"$work/g.rps"; : >"$work/g.p99"; : >"$work/h.rps"; : >"$work/h.p99"
    for rep in $(seq "$REPS"); do
        conc=16 grpc grpcseed "$rep" "${SMALL[@]}" --concurrency 16 --seconds "$SECS"
        echo "$G_RPS" >>"$work/g.rps"; echo "$G_P99_MS" >>"$work/g.p99"
        if ! WRK_V2_HLEN=$(cat "$work/grpcseed.v2.hlen") bench_wrk "$URL" "$work/grpcseed.v2" 16 "$SECS" ||
            [ "$WRK_ERRORS" != 0 ] || ! kill -0 "$PID" 2>/dev/null; then
            echo "bench_grpc.sh: HTTP v2 failed under load (errors: ${WRK_ERRORS:-?})" >&2
            failed=1
        fi
        printf '%s\thttp-v2\t16\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n' grpcseed "$rep" "$WRK_REQUESTS" \
            "$WRK_ERRORS" "$WRK_RPS" "$WRK_MEAN_MS" "$WRK_P50_MS" "$WRK_P99_MS" >>"$RESULTS/grpc.tsv"
        echo "$WRK_RPS" >>"$work/h.rps"; echo "$WRK_P99_MS" >>"$work/h.p99"
        echo "  run $rep: gRPC $G_RPS calls/s (p99 $G_P99_MS ms), HTTP v2 $WRK_RPS req/s (p99 $WRK_P99_MS ms)"
    done
    g_rps=$(bench_median <"$work/g.rps"); h_rps=$(bench_median <"$work/h.rps")
    g_p99=$(bench_median <"$work/g.p99"); h_p99=$(bench_median <"$work/h.p99")
    row grpc "gRPC ModelInfer q,k,v 3x2 float32 (the seed's size), 16 concurrent calls (peer: HTTP v2 binary, wrk 16 connections)" \
        "$g_rps" "$h_rps" "req/s" 0.8 "" "" "" \
        "p99 gRPC $g_p99 ms, HTTP v2 $h_p99 ms (medians of $REPS interleaved runs of $SECS s)"
else failed=1; fi

exit "$failed"

#!/usr/bin/env bash
# bench_http.sh - POST /v1/attention end to end: the C server against the Flask + NumPy peer.
#
# Starts build/attention-server (its defaults) and the peer (tests/bench/peer.py under gunicorn,
# 2 sync workers, NumPy's default BLAS threads) on free loopback ports. Each scenario first sends
# one request to both and checks that the answers agree (compare.py; a benchmark of a wrong
# answer fails the run), then loads both with wrk (post.lua):
#   seed       the smallest fixture's request, 16 connections: requests/s      (target 10x)
#   seed-slow  the same, ours only, with 1,000 slow-header connections held open beside the
#              load (build/bench/slow-clients), against the seed figure without them
#                                                                                (target 0.8x)
#   attn512    q, k, v of 512 x 64, float64, attention returned, one request after another:
#              median latency (curl)                                             (target 5x)
#   attn512v2  the same q, k, v as attn512 sent to ours as a binary v2 request (FP64 bytes,
#              both outputs answered in binary) against the peer's JSON attn512: median
#              latency (curl)                                                    (target 10x)
#   proj4096   x of 4096 x 8 projected to d = 64, float64, no attention, one request after
#              another: median latency (curl)                                     (target 3x)
#   conc1024   4 connections of a compute-heavy request (x 1024 x 64, 8 heads of 64, wo),
#              for information: requests/s, and the server's cores busy and runnable threads
#              while it runs (sample.py): more runnable threads than cores = oversubscription
#   mem32k     x of 32768 x 8 projected to d = 64, float32, no attention, one request to a
#              freshly started server: its peak RSS (VmHWM) and the time        (target < 256 MiB)
#              The server runs with its default limits. The peer would need many GiB for
#              the 32768 x 32768 score matrix; it runs under a 3 GiB address-space cap and its
#              failure is reported as such. Ours is checked against NumPy on the first 256 rows.
# Figures are medians of BENCH_HTTP_REPS (default 3) runs of BENCH_HTTP_SECONDS (default 5) s.
#
# Usage: bash tests/bench/bench_http.sh [--quick] [RESULTS_DIR]   (default build/bench/results)
# Writes RESULTS_DIR/table-http.tsv (rows of the summary table), http.tsv (every run) and
# checks-http.tsv. Exit status 1 when an answer disagrees, a request fails or a server dies.
# Every server started here is stopped at the end, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
. tests/bench/wrk.sh

REPS=${BENCH_HTTP_REPS:-3}
SECS=${BENCH_HTTP_SECONDS:-5}
if [ "${1:-}" = --quick ]; then REPS=1 SECS=2; shift; fi
RESULTS=${1:-build/bench/results}
SERVER=build/attention-server
PEER_CAP_BYTES=$((3 << 30))
mkdir -p "$RESULTS"

bench_need_debs wrk curl python3-numpy python3-flask gunicorn
[ -x "$SERVER" ] || { echo "bench_http.sh: $SERVER is missing (make)" >&2; exit 1; }

work=$(mktemp -d)
cleanup() {
    bench_stop_all
    rm -rf "$work"
}
trap cleanup EXIT

"$BENCH_PYTHON" tests/bench/make_bodies.py "$work"
# The defaults: 16 connections of small requests are more than --max-inflight 8 workers, and
# the requests beyond wait for a worker (--queue-wait-ms) instead of an immediate 503.
bench_start_ours ours "$work"
OURS_URL=$BENCH_URL OURS_PID=$BENCH_PID
bench_start_peer peer "$work"
PEER_URL=$BENCH_URL PEER_PID=$BENCH_PID
echo "ours at $OURS_URL (defaults), peer at $PEER_URL (gunicorn, 2 workers); $REPS x $SECS s per figure"

: >"$RESULTS/checks-http.tsv"
: >"$RESULTS/table-http.tsv"
printf 'case\tservice\tconnections\trep\trequests\terrors\trps\tmean_ms\tp50_ms\tp99_ms\tmax_ms\n' \
    >"$RESULTS/http.tsv"
failed=0

# post URL BODY OUT: one request with curl; prints the seconds it took; fails unless 200.
post() {
    local out
    out=$(curl -sS -o "$3" -w '%{http_code} %{time_total}' -X POST \
        -H 'Content-Type: application/json' --data-binary "@$2" "$1/v1/attention") || return 1
    [ "${out%% *}" = 200 ] || {
        echo "bench_http.sh: $1 answered ${out%% *}: $(head -c 300 "$3")" >&2
        return 1
    }
    echo "${out#* }"
}

# post_v2 URL BODY OUT: one binary v2 request (BODY, its header length in BODY.hlen) to the
# attention model with curl; the answer's headers go to OUT.headers; prints the seconds it
# took; fails unless 200.
post_v2() {
    local out
    out=$(curl -sS -o "$3" -D "$3.headers" -w '%{http_code} %{time_total}' -X POST \
        -H 'Content-Type: application/octet-stream' \
        -H "Inference-Header-Content-Length: $(cat "$2.hlen")" --data-binary "@$2" \
        "$1/v2/models/attention/infer") || return 1
    [ "${out%% *}" = 200 ] || {
        echo "bench_http.sh: $1 answered ${out%% *}: $(head -c 300 "$3")" >&2
        return 1
    }
    echo "${out#* }"
}

# load CASE SERVICE URL PID CONNECTIONS: REPS wrk runs; sets RPS and MEAN_MS (medians).
load() {
    local case=$1 service=$2 url=$3 pid=$4 conns=$5 rep
    : >"$work/rps"; : >"$work/mean"
    for rep in $(seq "$REPS"); do
        if ! bench_wrk "$url" "$work/$case.json" "$conns" "$SECS" || [ "$WRK_ERRORS" != 0 ] ||
            ! kill -0 "$pid" 2>/dev/null; then
            echo "bench_http.sh: $service failed under load in $case (errors: ${WRK_ERRORS:-?})" >&2
            failed=1
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$service" "$conns" "$rep" \
            "$WRK_REQUESTS" "$WRK_ERRORS" "$WRK_RPS" "$WRK_MEAN_MS" "$WRK_P50_MS" "$WRK_P99_MS" \
            "$WRK_MAX_MS" >>"$RESULTS/http.tsv"
        echo "$WRK_RPS" >>"$work/rps"
        echo "$WRK_MEAN_MS" >>"$work/mean"
    done
    RPS=$(bench_median <"$work/rps")
    MEAN_MS=$(bench_median <"$work/mean")
    echo "  $case $service, $conns connection(s): $RPS req/s, mean $MEAN_MS ms"
}

# latency CASE SERVICE URL: one connection, one request after another (curl): after one warm-up,
# at least REPS requests and more until SECS seconds have passed; sets MEAN_MS to the median
# milliseconds of one request (the name says mean for the table's sake; it is a median).
# With POST=post_v2 and BODY set, sends that body as a binary v2 request instead.
latency() {
    local case=$1 service=$2 url=$3 n=0 start t
    local send=${POST:-post} body=${BODY:-$work/$case.json}
    $send "$url" "$body" "$work/$case.lat.out" >/dev/null || { failed=1; MEAN_MS=; return; }
    : >"$work/lat"
    start=$(date +%s.%N)
    while [ "$n" -lt "$REPS" ] || awk -v s="$start" -v now="$(date +%s.%N)" -v l="$SECS" \
            'BEGIN { exit !(now - s < l) }'; do
        t=$($send "$url" "$body" "$work/$case.lat.out") || { failed=1; break; }
        echo "$t" >>"$work/lat"
        printf '%s\t%s\t1\t%s\t1\t0\t\t%s\t\t\t\n' "$case" "$service" "$n" \
            "$(awk -v t="$t" 'BEGIN { print t * 1000 }')" >>"$RESULTS/http.tsv"
        n=$((n + 1))
        [ "$n" -ge 50 ] && break
    done
    MEAN_MS=$(bench_median <"$work/lat" | awk '{ printf "%.3f", $1 * 1000 }')
    echo "  $case $service, 1 connection: median $MEAN_MS ms over $n requests"
}

# check CASE [EXPECT]: one request to each service, then compare.py.
check() {
    local case=$1
    shift
    post "$OURS_URL" "$work/$case.json" "$work/$case.ours.out" >/dev/null &&
        post "$PEER_URL" "$work/$case.json" "$work/$case.peer.out" >/dev/null &&
        "$BENCH_PYTHON" tests/bench/compare.py "$case" "$work/$case.ours.out" \
            "$work/$case.peer.out" "$@" | tee -a "$RESULTS/checks-http.tsv" &&
        [ "${PIPESTATUS[0]}" = 0 ]
}

row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS/table-http.tsv"; }

# field FILE EXPR: a member of a JSON file, e.g. field x.json '["error"]["message"]'; empty if absent.
field() { "$BENCH_PYTHON" -c 'import json, sys
try: print(eval("json.load(open(sys.argv[1]))" + sys.argv[2]))
except Exception: pass' "$1" "$2"; }

# c. seed-sized requests, throughput.
echo "== seed ($(field "$work/seed.expect.json" '["fixture"]'))"
if check seed "$work/seed.expect.json"; then
    load seed ours "$OURS_URL" "$OURS_PID" 16; ours_rps=$RPS
    load seed peer "$PEER_URL" "$PEER_PID" 16; peer_rps=$RPS
    row http "HTTP seed request ($(stat -c %s "$work/seed.json") B), wrk 16 connections" \
        "$ours_rps" "$peer_rps" "req/s" 10 "" "" "" "smallest fixture"
    # The same load with 1,000 slow-header connections open beside it; the server closes
    # them after --header-timeout and slow-clients opens them again, so about 1,000 stay open.
    echo "== seed-slow"
    build/bench/slow-clients --port "${OURS_URL##*:}" --connections 1000 \
        --seconds $((REPS * (SECS + 2) + 5)) >"$work/slow-clients.out" 2>&1 &
    slow_pid=$!
    cp "$work/seed.json" "$work/seed-slow.json"
    sleep 3
    load seed-slow ours "$OURS_URL" "$OURS_PID" 16; slow_rps=$RPS
    kill "$slow_pid" 2>/dev/null; wait "$slow_pid" 2>/dev/null || true
    row http "HTTP seed request, wrk 16 connections, 1,000 slow connections open (peer: without)" \
        "$slow_rps" "$ours_rps" "req/s" 0.8 "" "" "" "ours with / ours without"
else failed=1; fi

# c. large requests, latency with one connection.
for case in attn512 proj4096; do
    echo "== $case"
    if check "$case"; then
        latency "$case" ours "$OURS_URL"; ours_ms=$MEAN_MS
        latency "$case" peer "$PEER_URL"; peer_ms=$MEAN_MS
        case $case in
        attn512) what="HTTP q,k,v 512x64 float64, attention returned, 1 connection"
                 gflop=$(awk 'BEGIN { print 4 * 512 * 512 * 64 * 1e-9 }') ;;
        proj4096) what="HTTP x 4096x8 -> d=64 float64, no attention, 1 connection"
                  gflop=$(awk 'BEGIN { print (4 * 4096 * 4096 * 64 + 3 * 2 * 4096 * 8 * 64) * 1e-9 }') ;;
        esac
        target=3
        [ "$case" = attn512 ] && target=5
        row http "$what" "$ours_ms" "$peer_ms" ms "$target" \
            "$(awk -v g="$gflop" -v a="$ours_ms" -v b="$peer_ms" 'BEGIN { printf "%.1f / %.1f", g / a * 1e3, g / b * 1e3 }')" \
            "" "" "$(stat -c %s "$work/$case.json") B in, $(stat -c %s "$work/$case.ours.out") B out"
    else failed=1; fi
done

# The same attn512 request in the v2 protocol with binary tensors, against the peer's JSON.
echo "== attn512v2"
if post_v2 "$OURS_URL" "$work/attn512.v2" "$work/attn512v2.ours.out" >/dev/null &&
    post "$PEER_URL" "$work/attn512.json" "$work/attn512v2.peer.out" >/dev/null &&
    "$BENCH_PYTHON" tests/bench/compare.py --v2 attn512v2 "$work/attn512v2.ours.out" \
        "$work/attn512v2.ours.out.headers" "$work/attn512v2.peer.out" |
        tee -a "$RESULTS/checks-http.tsv" && [ "${PIPESTATUS[0]}" = 0 ]; then
    POST=post_v2 BODY=$work/attn512.v2 latency attn512v2 ours "$OURS_URL"; ours_ms=$MEAN_MS
    latency attn512 peer "$PEER_URL"; peer_ms=$MEAN_MS
    gflop=$(awk 'BEGIN { print 4 * 512 * 512 * 64 * 1e-9 }')
    row http "HTTP q,k,v 512x64 float64, attention returned: v2 binary vs peer JSON, 1 connection" \
        "$ours_ms" "$peer_ms" ms 10 \
        "$(awk -v g="$gflop" -v a="$ours_ms" -v b="$peer_ms" 'BEGIN { printf "%.1f / %.1f", g / a * 1e3, g / b * 1e3 }')" \
        "" "" "$(stat -c %s "$work/attn512.v2") B in, $(stat -c %s "$work/attn512v2.ours.out") B out (binary FP64 both ways)"
else failed=1; fi

# e. concurrency: 4 clients of a compute-heavy request; cores busy and runnable threads.
echo "== conc1024"
if check conc1024; then
    notes=()
    for service in ours peer; do
        if [ $service = ours ]; then url=$OURS_URL pid=$OURS_PID; else url=$PEER_URL pid=$PEER_PID; fi
        "$BENCH_PYTHON" tests/bench/sample.py "$SECS" "$pid" >"$work/sample.$service" &
        sampler=$!
        REPS_SAVED=$REPS REPS=1
        load conc1024 "$service" "$url" "$pid" 4
        REPS=$REPS_SAVED
        wait "$sampler"
        [ $service = ours ] && ours_rps=$RPS || peer_rps=$RPS
        s=$(cat "$work/sample.$service")
        echo "  $service: $s"
        busy=$(echo "$s" | sed -nE 's/.*cores_busy=([0-9.]+).*/\1/p')
        rmean=$(echo "$s" | sed -nE 's/.*runnable_mean=([0-9.]+).*/\1/p')
        rmax=$(echo "$s" | sed -nE 's/.*runnable_max=([0-9]+).*/\1/p')
        notes+=("$service: $busy cores busy, runnable threads mean $rmean max $rmax")
    done
    row http "HTTP 4 concurrent x 1024x64, 8 heads, wo, float64 (info)" "$ours_rps" "$peer_rps" \
        "req/s" "" "" "" "" "$(nproc) cores; ${notes[0]}; ${notes[1]}"
    # The threading model: the same load on our server with 16 compute threads, which lets
    # every request compute at once and each borrow helpers, as without the pool's bound.
    bench_start_ours ours-16 "$work" --max-inflight 64 --compute-threads 16
    "$BENCH_PYTHON" tests/bench/sample.py "$SECS" "$BENCH_PID" >"$work/sample.ours-16" &
    sampler=$!
    REPS_SAVED=$REPS REPS=1
    load conc1024 ours-16 "$BENCH_URL" "$BENCH_PID" 4
    REPS=$REPS_SAVED
    wait "$sampler"
    bench_stop "$BENCH_PID"
    s=$(cat "$work/sample.ours-16")
    echo "  ours-16: $s"
    rmean=$(echo "$s" | sed -nE 's/.*runnable_mean=([0-9.]+).*/\1/p')
    row http "HTTP 4 concurrent x 1024x64: compute threads = cores vs 16 (info)" "$ours_rps" "$RPS" \
        "req/s" "" "" "" "" "16 compute threads: runnable threads mean $rmean"
else failed=1; fi

# d. memory: one large request to a fresh server; its peak RSS.
echo "== mem32k"
bench_stop "$OURS_PID"
bench_stop "$PEER_PID"
bench_start_ours ours-mem "$work"
MEM_URL=$BENCH_URL MEM_PID=$BENCH_PID
rss_before=$(awk '/^VmHWM/ { print $2 }' /proc/"$MEM_PID"/status)
if secs=$(post "$MEM_URL" "$work/mem32k.json" "$work/mem32k.ours.out"); then
    ours_rss=$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' /proc/"$MEM_PID"/status)
    ours_ms=$(awk -v s="$secs" 'BEGIN { printf "%.1f", s * 1000 }')
    "$BENCH_PYTHON" tests/bench/compare.py --rows 256 mem32k "$work/mem32k.ours.out" \
        "$work/mem32k.json" | tee -a "$RESULTS/checks-http.tsv"
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
    note="ours: default limits, peak RSS ${ours_rss} MiB (at start $((rss_before / 1024)) MiB)"
else
    code=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @"$work/mem32k.json" "$MEM_URL/v1/attention" || true)
    ours_rss="" ours_ms=""
    note="ours REFUSED ($code: $(field "$work/mem32k.ours.out" '["error"]["message"]' | head -c 160))"
    echo "  $note"
fi
bench_stop "$MEM_PID"
# The peer under a cap: gunicorn and its workers inherit RLIMIT_AS.
port=$(bench_free_port)
if bench_start peer-mem "$work" "$port" prlimit --as=$PEER_CAP_BYTES "$BENCH_PYTHON" -m gunicorn \
    --workers 2 --bind "127.0.0.1:$port" --chdir tests/bench --timeout 600 --log-level warning peer:app; then
    PMEM_PID=$BENCH_PID
    if psecs=$(post "$BENCH_URL" "$work/mem32k.json" "$work/mem32k.peer.out" 2>"$work/peer-mem.fail"); then
        peer_ms=$(awk -v s="$psecs" 'BEGIN { printf "%.1f", s * 1000 }')
        peer_rss=$(for p in $(bench_tree_pids "$PMEM_PID"); do awk '/^VmHWM/ { print $2 }' /proc/"$p"/status; done |
            sort -n | tail -n 1 | awk '{ printf "%.0f", $1 / 1024 }')
        note="$note; peer: peak RSS of its busiest process, under a 3 GiB cap"
    else
        peer_ms="" peer_rss=">3072"
        note="$note; peer: fails under a 3 GiB address-space cap ($(head -c 80 "$work/peer-mem.fail" | sed -E 's/.*answered //'))"
    fi
    bench_stop "$PMEM_PID"
else
    peer_ms="" peer_rss=""
    note="$note; peer did not start under the cap"
fi
echo "  ours ${ours_ms:-?} ms, ${ours_rss:-?} MiB; peer ${peer_ms:-?} ms, ${peer_rss:-?} MiB"
row http "HTTP x 32768x8 -> d=64 float32, no attention: time, peak RSS" "$ours_ms" "$peer_ms" ms \
    "<256 MiB" "" "" "${ours_rss:-?} / ${peer_rss:-?} MiB" "$note"
exit "$failed"

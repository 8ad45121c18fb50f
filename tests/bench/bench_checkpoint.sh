#!/usr/bin/env bash
# bench_checkpoint.sh - what the binary and compressed ways in cost and save, each against the
# plain JSON way of sending the same numbers to the same server (build/attention-server).
#
#   ckpt100    PUT /v1/weight-sets/{name}?format=safetensors&preset=torch_mha&heads=20 of an
#              nn.MultiheadAttention(2560, 20) state dict in float32 (100 MiB of numbers,
#              make_checkpoint.py) against PUT of the same weights as JSON (~550 MB: each float32
#              widened to a double and printed with repr). Each PUT goes to a freshly started
#              server, so that its peak RSS (VmHWM) is the upload's own; curl's time_total,
#              median of BENCH_CKPT_REPS (default 5) reps.                        (target 20x)
#              The note gives the safetensors upload's peak RSS as a multiple of the file
#              (target <= 1.5x) and the RSS at start. Both stored sets are first read back
#              (GET ?format=safetensors) and must equal the float32 source bit for bit.
#   gzip512    POST /v1/attention of q, k, v 512 x 64, float64, attention returned (the attn512
#              body of bench_http.sh) sent with Content-Encoding: gzip against the same body
#              plain; one connection, requests interleaved, median latency (curl). For
#              information: on loopback gzip saves no transfer time, it shows what inflating
#              costs the server.
#   gzipout    the same plain request with Accept-Encoding: gzip (curl --compressed, which also
#              inflates the answer) against without. For information.
#   iostall    GET /healthz timed with curl on a server of one I/O thread while another
#              connection posts the gzip512 request with attention returned back to back, with
#              Accept-Encoding: gzip against without: p99 of the GETs. For information: an I/O
#              thread that compressed answers itself stalled every connection it serves.
# Both gzip rows first check that the answer is the plain request's, byte for byte but for
# meta.compute_ms (the time the computation took).
# Every server is started here on a free 127.0.0.1 port (lib.sh's bench_start_ours), with its
# own data directory under a mktemp directory, and stopped by PID at the end, whatever happens.
# Loops are bounded in count and time: BENCH_CKPT_SECONDS (default 240) for the PUT reps,
# BENCH_GZIP_SECONDS (default 60) and 50 requests per way for the gzip rows.
#
# Usage: bash tests/bench/bench_checkpoint.sh [RESULTS_DIR] [--quick]   (default
# build/bench/results; --quick: one PUT each, 10 requests per way).  BENCH_SERVER=PATH measures
# another build of the server instead of build/attention-server (an older commit's, to compare).
# Writes RESULTS_DIR/table-checkpoint.tsv (rows of the summary table) and checks-checkpoint.tsv.
# Exit status 1 when an answer disagrees, a request fails or a server does not start.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh

RESULTS=build/bench/results
REPS=${BENCH_CKPT_REPS:-5}
CKPT_SECS=${BENCH_CKPT_SECONDS:-240}
GZIP_REPS=50
GZIP_SECS=${BENCH_GZIP_SECONDS:-60}
STALL_POSTS=20 STALL_GETS=300
for arg in "$@"; do
    case $arg in
    --quick) REPS=1 GZIP_REPS=10 GZIP_SECS=20 STALL_POSTS=5 STALL_GETS=60 ;;
    *) RESULTS=$arg ;;
    esac
done
SERVER=${BENCH_SERVER:-build/attention-server}
E=2560 HEADS=20   # 4 E^2 + 4 E float32 = 100 MiB and 40 KiB
mkdir -p "$RESULTS"

bench_need_debs python3-numpy curl gzip
[ -x "$SERVER" ] || { echo "bench_checkpoint.sh: $SERVER is missing (make)" >&2; exit 1; }

work=$(mktemp -d)
cleanup() {
    bench_stop_all
    rm -rf "$work"
}
trap cleanup EXIT

: >"$RESULTS/table-checkpoint.tsv"
: >"$RESULTS/checks-checkpoint.tsv"
failed=0

# check_row WHAT CASE DTYPE DIFF TOL VERDICT: a line of the summary's agreement checks (the
# columns of compare.py's); DIFF "0 differ" when bit for bit (byte for byte for the answers).
check_row() { printf 'checkpoint: %s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS/checks-checkpoint.tsv"; }
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS/table-checkpoint.tsv"; }
ms() { awk -v s="$1" 'BEGIN { printf "%.1f", s * 1000 }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
hwm_bytes() { awk '/^VmHWM/ { print $2 * 1024 }' /proc/"$1"/status; }
elapsed_under() { awk -v s="$1" -v now="$(date +%s.%N)" -v l="$2" 'BEGIN { exit !(now - s < l) }'; }

# start NAME FLAG...: the server (lib.sh's bench_start_ours: a free loopback port, its own
# process group, quiet) with a new data directory of its own. Sets URL and PID. It is stopped
# by stop (or by the EXIT trap through bench_stop_all).
start() {
    local name=$1
    shift
    rm -rf "$work/$name.data"
    BENCH_SERVER=$SERVER bench_start_ours "$name" "$work" "$@" || return 1
    PID=$BENCH_PID
    URL=$BENCH_URL
}

# stop PID: stops that server and forgets it (the trap would stop it a second time otherwise),
# and removes its data directory (a stored set is 200 MB).
stop() {
    local pid=$1 p keep=()
    bench_stop "$pid"
    for p in "${BENCH_PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    BENCH_PIDS=("${keep[@]}")
    rm -rf "$work"/*.data
}

# ---------------------------------------------------------------- ckpt100

# Limits for a 100 MiB checkpoint and its ~550 MB JSON twin: the body limit, 26 M numbers, and a
# budget for the JSON body's reservation (25 bytes per byte of text, http_body.c). The budget is
# bookkeeping, not memory: the JSON upload's real peak is reported beside it.
CKPT_FLAGS=(--max-body 1G --max-elements 64M --max-memory 32G --max-request-memory 4G)

# put KIND NAME: one PUT of the checkpoint (KIND safetensors) or of its JSON twin (KIND json) to a
# fresh server; the set is read back and checked when CHECK=1. Sets SECS, RSS (peak, bytes) and
# RSS0 (before the upload, bytes). Fails unless 201 and, when checked, bit for bit.
put() {
    local kind=$1 name=$2 out code
    start "$name" "${CKPT_FLAGS[@]}" || return 1
    RSS0=$(hwm_bytes "$PID")
    if [ "$kind" = safetensors ]; then
        out=$(curl -sS -o "$work/$name.put" -w '%{http_code} %{time_total}' --max-time 600 -X PUT \
            -H 'Content-Type: application/octet-stream' --data-binary "@$work/mha.safetensors" \
            "$URL/v1/weight-sets/$name?format=safetensors&preset=torch_mha&heads=$HEADS") || out=000
    else
        out=$(curl -sS -o "$work/$name.put" -w '%{http_code} %{time_total}' --max-time 600 -X PUT \
            -H 'Content-Type: application/json' --data-binary "@$work/mha.json" \
            "$URL/v1/weight-sets/$name") || out=000
    fi
    # Read before anything else can raise it: the GET below builds a 200 MB answer.
    RSS=$(hwm_bytes "$PID")
    code=${out%% *} SECS=${out#* }
    if [ "$code" != 201 ]; then
        echo "bench_checkpoint.sh: PUT $kind answered $code: $(head -c 300 "$work/$name.put" 2>/dev/null)" >&2
        stop "$PID"
        return 1
    fi
    if [ "${CHECK:-0}" = 1 ]; then
        local said=""
        if ! curl -sS -f -o "$work/$name.get" --max-time 600 "$URL/v1/weight-sets/$name?format=safetensors" ||
            ! said=$("$BENCH_PYTHON" tests/bench/make_checkpoint.py check "$work" "$work/$name.get"); then
            echo "bench_checkpoint.sh: the $kind upload was not stored as sent: ${said:-GET failed}" >&2
            check_row "set read back vs float32 source" "ckpt100 $kind" float32 "${said:-GET failed}" \
                0 FAILED
            stop "$PID"
            return 1
        fi
        echo "  $kind upload read back: $said"
        check_row "set read back vs float32 source" "ckpt100 $kind" float32 "0 differ" 0 ok
        rm -f "$work/$name.get"
    fi
    stop "$PID"
}

ckpt100() {
    echo "== ckpt100: writing the checkpoint and its JSON twin"
    "$BENCH_PYTHON" tests/bench/make_checkpoint.py write "$work" "$E" "$HEADS" || return 1
    local file_bytes json_bytes rep=0 started
    file_bytes=$(stat -c %s "$work/mha.safetensors")
    json_bytes=$(stat -c %s "$work/mha.json")
    : >"$work/st.secs"; : >"$work/st.rss"; : >"$work/st.rss0"; : >"$work/js.secs"; : >"$work/js.rss"
    started=$(date +%s.%N)
    # The first rep also checks both stored sets; later reps only time. At least one rep, at
    # most REPS, and none begun after CKPT_SECS.
    while [ "$rep" -lt "$REPS" ] && { [ "$rep" = 0 ] || elapsed_under "$started" "$CKPT_SECS"; }; do
        local check=$((rep == 0 ? 1 : 0))
        CHECK=$check put safetensors st || return 1
        echo "$SECS" >>"$work/st.secs"; echo "$RSS" >>"$work/st.rss"; echo "$RSS0" >>"$work/st.rss0"
        echo "  rep $rep safetensors: $(ms "$SECS") ms, peak RSS $(mib "$RSS") MiB"
        CHECK=$check put json js || return 1
        echo "$SECS" >>"$work/js.secs"; echo "$RSS" >>"$work/js.rss"
        echo "  rep $rep json: $(ms "$SECS") ms, peak RSS $(mib "$RSS") MiB"
        rep=$((rep + 1))
    done
    local st_ms js_ms st_rss js_rss rss0 times verdict note
    st_ms=$(ms "$(bench_median <"$work/st.secs")")
    js_ms=$(ms "$(bench_median <"$work/js.secs")")
    st_rss=$(bench_median <"$work/st.rss")
    js_rss=$(bench_median <"$work/js.rss")
    rss0=$(bench_median <"$work/st.rss0")
    times=$(awk -v r="$st_rss" -v f="$file_bytes" 'BEGIN { printf "%.2f", r / f }')
    verdict=$(awk -v t="$times" 'BEGIN { print (t <= 1.5) ? "met" : "MISSED" }')
    echo "  median over $rep rep(s): safetensors $st_ms ms, json $js_ms ms; peak RSS $(mib "$st_rss") MiB = ${times}x the file"
    note="safetensors upload: peak RSS $(mib "$st_rss") MiB = $times x the file; target <= 1.5x,"
    note="$note $verdict; RSS at start $(mib "$rss0") MiB; torch_mha E=$E, $HEADS heads,"
    note="$note $file_bytes B file vs $json_bytes B JSON (in_out, repr of each float32 as a"
    note="$note double); each PUT to a fresh server, median of $rep; both sets read back bit for bit"
    row checkpoint "PUT of a 100 MB float32 safetensors file vs the same weights as JSON" \
        "$st_ms" "$js_ms" ms 20 "" "" "$(mib "$st_rss") / $(mib "$js_rss") MiB" "$note"
}

# ---------------------------------------------------------------- gzip512, gzipout

# post BODY OUT [CURL_FLAG...]: one POST /v1/attention (JSON) to URL; prints the seconds it took
# and the bytes that came over the wire; fails unless 200.
post() {
    local body=$1 out=$2 res
    shift 2
    res=$(curl -sS -o "$out" -w '%{http_code} %{time_total} %{size_download}' --max-time 60 -X POST \
        -H 'Content-Type: application/json' "$@" --data-binary "@$body" "$URL/v1/attention") || return 1
    [ "${res%% *}" = 200 ] || {
        echo "bench_checkpoint.sh: POST answered ${res%% *}: $(head -c 300 "$out")" >&2
        return 1
    }
    echo "${res#* }"
}

# The three ways of sending the request, as curl flags (the body file is chosen in way_body).
way_flags() {
    case $1 in
    plain) ;;
    gzip) echo "-H Content-Encoding:gzip" ;;
    gzipout) echo "--compressed" ;;
    esac
}
# timeless FILE: the answer without meta.compute_ms, the one member that differs between two
# answers to the same request.
timeless() { sed -i -E 's/"compute_ms":[0-9.eE+-]+//' "$1"; }
way_body() { [ "$1" = gzip ] && echo "$work/attn512.json.gz" || echo "$work/attn512.json"; }

gzip512() {
    echo "== gzip512, gzipout"
    "$BENCH_PYTHON" tests/bench/make_bodies.py "$work" attn512 >/dev/null || return 1
    gzip -c -6 "$work/attn512.json" >"$work/attn512.json.gz"
    start gzip || return 1
    local way res n=0 started
    declare -A wire_bytes
    # The check: each way's answer (inflated by curl for gzipout) is the plain answer, byte for
    # byte but for the time it took, and the compressed answer really came compressed.
    for way in plain gzip gzipout; do
        # shellcheck disable=SC2046
        res=$(post "$(way_body $way)" "$work/$way.out" -D "$work/$way.headers" $(way_flags $way)) ||
            { stop "$PID"; return 1; }
        wire_bytes[$way]=${res#* }
    done
    local bad=""
    for way in plain gzip gzipout; do timeless "$work/$way.out"; done
    cmp -s "$work/plain.out" "$work/gzip.out" || bad="the gzip'd request's answer differs"
    cmp -s "$work/plain.out" "$work/gzipout.out" || bad="${bad:+$bad; }the gzip'd answer differs"
    grep -qi '^content-encoding: *gzip' "$work/gzipout.headers" || bad="${bad:+$bad; }the answer was not gzip'd"
    if [ -n "$bad" ]; then
        echo "bench_checkpoint.sh: $bad" >&2
        check_row "gzip in/out answers vs plain" gzip512 float64 "$bad" 0 FAILED
        stop "$PID"
        return 1
    fi
    check_row "gzip in/out answers vs plain" gzip512 float64 "0 differ" 0 ok
    # Interleaved, so that the machine's load falls on all three alike.
    : >"$work/plain.lat"; : >"$work/gzip.lat"; : >"$work/gzipout.lat"
    started=$(date +%s.%N)
    while [ "$n" -lt "$GZIP_REPS" ] && { [ "$n" -lt 3 ] || elapsed_under "$started" "$GZIP_SECS"; }; do
        for way in plain gzip gzipout; do
            # shellcheck disable=SC2046
            res=$(post "$(way_body $way)" "$work/$way.lat.out" $(way_flags $way)) || { stop "$PID"; return 1; }
            echo "${res%% *}" >>"$work/$way.lat"
        done
        n=$((n + 1))
    done
    stop "$PID"
    local plain_ms gzip_ms out_ms in_plain in_gzip
    plain_ms=$(ms "$(bench_median <"$work/plain.lat")")
    gzip_ms=$(ms "$(bench_median <"$work/gzip.lat")")
    out_ms=$(ms "$(bench_median <"$work/gzipout.lat")")
    in_plain=$(stat -c %s "$work/attn512.json")
    in_gzip=$(stat -c %s "$work/attn512.json.gz")
    echo "  median over $n requests each: plain $plain_ms ms, gzip in $gzip_ms ms, gzip out $out_ms ms"
    local same="same answer byte for byte but for meta.compute_ms"
    row checkpoint "gzip'd 512x64 v1 request vs the same uncompressed (info)" \
        "$gzip_ms" "$plain_ms" ms "" "" "" "" \
        "q,k,v 512x64 float64, attention returned; body $in_gzip B gzip'd (gzip -6) vs $in_plain B; loopback, 1 connection, median of $n each, interleaved; $same"
    row checkpoint "the same request, answer gzip'd (Accept-Encoding) vs not (info)" \
        "$out_ms" "$plain_ms" ms "" "" "" "" \
        "answer ${wire_bytes[gzipout]} B gzip'd (the server's level 1) vs ${wire_bytes[plain]} B, inflated by curl --compressed; $same"
}

# ---------------------------------------------------------------- iostall

# p99 FILE: the 99th percentile of the numbers in FILE (one a line), in ms.
p99() { sort -g "$1" | awk '{ v[NR] = $1 } END { i = int(NR * 0.99 + 0.999); printf "%.1f\n", v[i] * 1000 }'; }

iostall() {
    echo "== iostall"
    [ -s "$work/attn512.json" ] || "$BENCH_PYTHON" tests/bench/make_bodies.py "$work" attn512 >/dev/null ||
        return 1
    start iostall --io-threads 1 || return 1
    local way bg n started
    declare -A p99s medians counts
    for way in gzipout plain; do
        # One connection's answers, back to back, on the only I/O thread, while another client
        # times /healthz on the same thread; bounded by STALL_POSTS and STALL_GETS.
        # shellcheck disable=SC2046
        (for _ in $(seq "$STALL_POSTS"); do
            post "$work/attn512.json" "$work/stall.$way.out" $(way_flags "$way") >/dev/null || exit 1
        done) &
        bg=$!
        : >"$work/stall.$way.lat"
        n=0 started=$(date +%s.%N)
        while [ "$n" -lt "$STALL_GETS" ] && kill -0 "$bg" 2>/dev/null && elapsed_under "$started" 60; do
            curl -sS -o /dev/null -w '%{time_total}\n' --max-time 10 "$URL/healthz" \
                >>"$work/stall.$way.lat" || break
            n=$((n + 1))
        done
        wait "$bg" || { stop "$PID"; return 1; }
        p99s[$way]=$(p99 "$work/stall.$way.lat")
        medians[$way]=$(ms "$(bench_median <"$work/stall.$way.lat")")
        counts[$way]=$n
    done
    stop "$PID"
    echo "  /healthz while gzip'd answers: median ${medians[gzipout]} ms, p99 ${p99s[gzipout]} ms;" \
        "while plain answers: median ${medians[plain]} ms, p99 ${p99s[plain]} ms"
    row checkpoint "GET /healthz p99 on the I/O thread of gzip'd answers vs of plain ones (info)" \
        "${p99s[gzipout]}" "${p99s[plain]}" ms "" "" "" "" \
        "--io-threads 1; ${counts[gzipout]} and ${counts[plain]} GETs (curl) while one connection posts the 512x64 request with attention returned $STALL_POSTS times, with and without Accept-Encoding: gzip; medians ${medians[gzipout]} and ${medians[plain]} ms. A worker compresses its answer, so the I/O thread should not stall"
}

ckpt100 || failed=1
gzip512 || failed=1
iostall || failed=1
exit "$failed"

#!/usr/bin/env bash
# bench_http.sh - end-to-end latency and throughput of POST /v1/attention, against a NumPy service.
#
# Starts build/attention-server on a free loopback port and, as the competing service,
# tests/bench/numpy_server.py (Python's http.server + NumPy) on another, then for each request body:
#   toy         the request of ../shared/fixtures/seed004_toy.json (3 tokens, inline weights)
#   L256 attn   q, k, v of 256 x 64, heads 4, return_attention true (about 1 MB in, 6 MB out)
#   L256 noattn the same with return_attention false
# it first checks that both services give the same answer (and the toy the fixture's answer),
# then runs the load generator `hey` against each for BENCH_HTTP_SECONDS (default 3) seconds
# with 1 connection (latency) and with 4 (throughput), keep-alive on. Both servers use
# BENCH_BLAS_THREADS (default 1) OpenBLAS threads per product. Every server started here is
# stopped at the end, whatever happens.
#
# Usage: bash tests/bench/bench_http.sh [RESULTS_DIR]   (default build/bench/results)
# Writes RESULTS_DIR/http.tsv and RESULTS_DIR/http_checks.tsv and prints a table. Exit status 1
# when an answer disagrees, a request fails or a server dies during the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh

RESULTS=${1:-build/bench/results}
FIXTURES=${FIXTURES:-../shared/fixtures}
SECONDS_PER_RUN=${BENCH_HTTP_SECONDS:-3}
SERVER=build/attention-server
mkdir -p "$RESULTS"

bench_need_debs hey curl python3-numpy
[ -x "$SERVER" ] || { echo "bench_http.sh: $SERVER is missing (make)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
stop_servers() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap stop_servers EXIT

# start_service NAME COMMAND...: starts COMMAND in the background and waits (10 s at most) for
# its "listening on http://HOST:PORT" line; sets URL and PID.
start_service() {
    local name=$1; shift
    "$@" >"$work/$name.out" 2>"$work/$name.err" &
    PID=$!
    pids+=("$PID")
    local i
    for i in $(seq 100); do
        if grep -q '^listening on http://' "$work/$name.out" 2>/dev/null; then
            URL=$(sed -nE 's|^listening on (http://[^ ]+).*|\1|p' "$work/$name.out" | head -n 1)
            return 0
        fi
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench_http.sh: $name did not start:" >&2
    cat "$work/$name.err" >&2
    exit 1
}

start_service c env ATTN_QUIET=true "$SERVER" --host 127.0.0.1 --port 0 \
    --data-dir "$work/data" --blas-threads "$BENCH_BLAS_THREADS"
C_URL=$URL C_PID=$PID
start_service numpy env OPENBLAS_NUM_THREADS="$BENCH_BLAS_THREADS" \
    "$BENCH_PYTHON" tests/bench/numpy_server.py --port 0
NP_URL=$URL NP_PID=$PID
echo "C server at $C_URL, NumPy service at $NP_URL (BLAS threads $BENCH_BLAS_THREADS)"

# The request bodies.
"$BENCH_PYTHON" - "$FIXTURES/seed004_toy.json" "$work" <<'EOF'
import json, sys
import numpy as np
fixture, work = sys.argv[1], sys.argv[2]
with open(fixture) as f:
    toy = json.load(f)
with open(f"{work}/toy.json", "w") as f:
    json.dump(toy["request"], f)
with open(f"{work}/toy.expect.json", "w") as f:
    json.dump(toy["expect"], f)
rng = np.random.default_rng(256)
q, k, v = (rng.uniform(-2, 2, (256, 64)).tolist() for _ in range(3))
for name, want in (("L256_attn", True), ("L256_noattn", False)):
    with open(f"{work}/{name}.json", "w") as f:
        json.dump({"q": q, "k": k, "v": v, "heads": 4, "return_attention": want}, f)
EOF

# compare_answers CASE C_FILE NUMPY_FILE [EXPECT_FILE]: appends check lines; fails on disagreement.
compare_answers() {
    "$BENCH_PYTHON" - "$@" <<'EOF' | tee -a "$RESULTS/http_checks.tsv"
import json, sys
import numpy as np
case, c_file, np_file = sys.argv[1:4]
def load(path):
    with open(path) as f:
        return json.load(f)
def diff(a, b, key):
    if (key in a) != (key in b):
        return float("inf")
    if key not in a:
        return 0.0
    x, y = np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float)
    return float(np.max(np.abs(x - y))) if x.shape == y.shape else float("inf")
c, n = load(c_file), load(np_file)
pairs = [("C server vs NumPy service", n, 1e-9)]
if len(sys.argv) > 4:
    expect = load(sys.argv[4])
    pairs.append(("C server vs fixture", expect, expect.get("tolerance", 1e-9)))
bad = False
for what, other, tol in pairs:
    d = max(diff(c, other, "output"), diff(c, other, "attention"))
    ok = d <= tol
    bad |= not ok
    print(f"http: {what}\t{case}\tfloat64\t{d:.1e}\t{tol:.0e}\t{'ok' if ok else 'FAILED'}")
sys.exit(1 if bad else 0)
EOF
}

# post URL BODY OUT: one request with curl; fails unless the status is 200.
post() {
    local code
    code=$(curl -sS -o "$3" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        --data-binary "@$2" "$1/v1/attention")
    [ "$code" = 200 ] || { echo "bench_http.sh: $1 answered $code: $(head -c 300 "$3")" >&2; return 1; }
}

: >"$RESULTS/http_checks.tsv"
printf 'case\tservice\tconnections\trequests\trps\tmean_ms\tp50_ms\tp99_ms\tbody_bytes\tresponse_bytes\n' \
    >"$RESULTS/http.tsv"
failed=0
for case in toy L256_attn L256_noattn; do
    body="$work/$case.json"
    post "$C_URL" "$body" "$work/$case.c.out"
    post "$NP_URL" "$body" "$work/$case.np.out"
    expect=()
    [ "$case" = toy ] && expect=("$work/toy.expect.json")
    compare_answers "$case" "$work/$case.c.out" "$work/$case.np.out" "${expect[@]}" || failed=1
    for conns in 1 4; do
        for service in C NumPy; do
            if [ "$service" = C ]; then url=$C_URL pid=$C_PID out="$work/$case.c.out"
            else url=$NP_URL pid=$NP_PID out="$work/$case.np.out"; fi
            log="$work/hey.$case.$service.$conns"
            hey -z "${SECONDS_PER_RUN}s" -c "$conns" -t 60 -m POST -T application/json \
                -D "$body" "$url/v1/attention" >"$log"
            ok=$(sed -nE 's/^ *\[200\][[:space:]]+([0-9]+) responses.*/\1/p' "$log")
            rps=$(sed -nE 's/^ *Requests\/sec:[[:space:]]+([0-9.]+).*/\1/p' "$log")
            p50=$(sed -nE 's/^ *50% in ([0-9.]+) secs.*/\1/p' "$log")
            p99=$(sed -nE 's/^ *99% in ([0-9.]+) secs.*/\1/p' "$log")
            # hey stops at the deadline and may count requests cut short there as errors;
            # anything else (another status, a refused connection, a dead server) is a failure.
            others=$(sed -n '/^Error distribution:/,$p' "$log" |
                grep -vE 'Error distribution|context deadline|Client.Timeout|request canceled|^ *$' || true)
            if ! kill -0 "$pid" 2>/dev/null || [ -z "$ok" ] ||
                grep -qE '^ *\[[0-9]+\][[:space:]]+[0-9]+ responses' <(grep -v '\[200\]' "$log") ||
                [ -n "$others" ]; then
                echo "bench_http.sh: $service failed during $case with $conns connection(s):" >&2
                sed -n '/Status code distribution:/,$p' "$log" >&2
                failed=1
                continue
            fi
            # hey's Requests/sec divides by the whole duration; count only answered requests.
            # Its percentiles have 0.1 ms resolution, so the mean latency of one connection
            # (duration / answered requests) is the figure compared below.
            rps=$(awk -v n="$ok" -v s="$SECONDS_PER_RUN" 'BEGIN { printf "%.1f", n / s }')
            mean=$(awk -v n="$ok" -v s="$SECONDS_PER_RUN" -v c="$conns" \
                'BEGIN { printf "%.3f", s * c * 1000 / n }')
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\n' "$case" "$service" "$conns" \
                "$ok" "$rps" "$mean" "$(awk -v x="$p50" 'BEGIN { print x * 1000 }')" \
                "$(awk -v x="$p99" 'BEGIN { print x * 1000 }')" \
                "$(stat -c %s "$body")" "$(stat -c %s "$out")" >>"$RESULTS/http.tsv"
        done
    done
done

echo
echo "End-to-end POST /v1/attention: hey for $SECONDS_PER_RUN s per run, keep-alive, loopback."
echo "ms/req: mean over the run with 1 connection; req/s: answered requests per second with 4."
awk -F'\t' '
NR == 1 { next }
{ v[$1, $2, $3, "rps"] = $5; v[$1, $2, $3, "mean"] = $6; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
END {
  printf "%-12s %11s %11s %8s   %11s %11s %8s\n", "case", "C ms/req", "NumPy", "NumPy/C",
         "C req/s", "NumPy", "C/NumPy"
  for (i = 1; i <= n; i++) {
    c = order[i]
    cm = v[c, "C", 1, "mean"]; nm = v[c, "NumPy", 1, "mean"]
    cr = v[c, "C", 4, "rps"]; nr = v[c, "NumPy", 4, "rps"]
    printf "%-12s %11s %11s %8s   %11s %11s %8s\n", c, cm, nm,
           (cm > 0 && nm > 0) ? sprintf("%.1fx", nm / cm) : "-", cr, nr,
           (cr > 0 && nr > 0) ? sprintf("%.1fx", cr / nr) : "-"
  }
}' "$RESULTS/http.tsv"
exit "$failed"

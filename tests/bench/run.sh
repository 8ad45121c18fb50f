#!/usr/bin/env bash
# run.sh - every benchmark, each against its peer in the same run, then ONE table.
# `make bench` builds what it needs and calls this script.
#
#   kernel      build/bench/bench-kernel (attention_run) and bench_numpy.py (NumPy), on the same
#               inputs, after checking that they agree
#   ort         bench_ort.sh: the kernel against ONNX Runtime (npm onnxruntime-node, `make
#               ort-deps`) row by row, each side as a share of the FMA peak of the same run
#               (bench-gemm), the sgemm/dgemm rows, and the end-to-end v2 request; its own table
#               (ort.md) in the summary
#   json        build/bench/bench-json: server/jsonw against jansson's json_dumps, 512 x 512
#   http        bench_http.sh: the C server against the Flask + NumPy peer (gunicorn, wrk),
#               including the memory scenario (peak RSS) and the concurrency one
#   grpc        bench_grpc.sh: the gRPC front-end (build/bench/grpc-load) against the kernel's
#               own time and against HTTP v2 binary under wrk, same bytes, same server
#   store-load  build/bench/bench-store-load: a 4096 x 4096 weight set, binary file vs JSON
#   s3-store    bench_store_s3.py: 1,000 small sets on the S3 store (a single-node Swift on
#               loopback, tests/s3/swift_s3.sh) against the same on the directory store:
#               start-up, one sync's CPU and requests, PUT to visible on another replica
#   checkpoint  bench_checkpoint.sh: PUT of a 100 MiB float32 safetensors checkpoint vs the same
#               weights as JSON (time, peak RSS), and the 512 x 64 request gzip'd vs plain
#   reductions  bench_reductions.py: the reductions of the weights (entropy, received, sink, local,
#               top-8; no output) against the output alone, q, k, v of L x 64 causal binary v2,
#               L = 16k, 32k, 128k on one server each, and the reductions' peak RSS
#   sequences   bench_sequences.py: a sequence's step at 32,768 cached keys against the kernel's
#               time plus the empty-request floor, and against the stateless request with all
#               keys; an 8,192-token replay, sequence against stateless requests (sampled), peak
#               RSS; the cache policies' steps at a budget of 1,024 against a full step at
#               32,768 keys; bytes per cached key and 100 live sequences of 8,192 keys
#   viz         viz_bench.mjs: the visualizer (GET /viz) in headless chromium, from request to
#               painted heatmap for L = 512, 2048, 4096 (needs `make browser-deps`)
#
# Every benchmark first checks its answers (a benchmark of a wrong answer fails the run).
# Benchmarks are not tests: a target that is missed is marked in the table, not a failure.
# Settings, all optional:
#   BENCH_COMPUTE_THREADS compute threads for attention_run (default: what the server uses,
#                        from its configuration)
#   BENCH_NUMPY_THREADS  OpenBLAS threads for NumPy, in bench_numpy.py and in the peer (default:
#                        unset, so all cores, as a NumPy user gets)
#   BENCH_HTTP_SECONDS, BENCH_HTTP_REPS   see bench_http.sh
#   BENCH_PYTHON         interpreter with Debian's NumPy and Flask (default /usr/bin/python3)
# Usage: bash tests/bench/run.sh [--quick]   (--quick: one short run per figure, a smoke test)
# Results: build/bench/results/ (summary.txt is the table, made by perf_table.py, which also
# writes it into docs/performance.md after a full run that failed nothing). Exit status 0, or
# 1 when a benchmark or a check failed.
set -u
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh

QUICK=()
STORE_ARGS=()
if [ "${1:-}" = --quick ]; then
    QUICK=(--quick)
    STORE_ARGS=(--reps-bin 1 --reps-json 1 --n 1024)
fi
RESULTS=build/bench/results
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.tsv "$RESULTS"/*.bin "$RESULTS"/summary.txt "$RESULTS"/ort.md
[ -n "${BENCH_NUMPY_THREADS:-}" ] && export OPENBLAS_NUM_THREADS=$BENCH_NUMPY_THREADS

for bin in build/attention-server build/bench/bench-kernel build/bench/bench-json \
    build/bench/bench-store-load build/bench/bench-gemm build/bench/grpc-load; do
    [ -x "$bin" ] || { echo "run.sh: $bin is missing; run \`make bench\`" >&2; exit 1; }
done
bench_need_debs python3-numpy python3-flask gunicorn wrk curl strace \
    swift swift-proxy swift-account swift-container swift-object python3-swift memcached awscli ||
    { echo "run.sh: cannot install what it needs" >&2; exit 1; }

started=$(date +%s)
failed=()
step() {
    local name=$1; shift
    echo
    echo "=== $name"
    "$@" || failed+=("$name")
}

machine="$(nproc) cores, $(sed -nE 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "machine: $machine; load average $(cut -d' ' -f1-3 /proc/loadavg)"
step kernel build/bench/bench-kernel --out "$RESULTS" "${QUICK[@]}"
step numpy "$BENCH_PYTHON" tests/bench/bench_numpy.py --results "$RESULTS" "${QUICK[@]}"
step ort bash tests/bench/bench_ort.sh "$RESULTS" "${QUICK[@]}"
step json build/bench/bench-json --out "$RESULTS" "${QUICK[@]}"
step http bash tests/bench/bench_http.sh "${QUICK[@]}" "$RESULTS"
step grpc bash tests/bench/bench_grpc.sh "${QUICK[@]}" "$RESULTS"
step store-load build/bench/bench-store-load --out "$RESULTS/store.tsv" "${STORE_ARGS[@]}"
step s3-store "$BENCH_PYTHON" tests/bench/bench_store_s3.py --results "$RESULTS" "${QUICK[@]}"
step checkpoint bash tests/bench/bench_checkpoint.sh "$RESULTS" "${QUICK[@]}"
step reductions "$BENCH_PYTHON" tests/bench/bench_reductions.py --results "$RESULTS" "${QUICK[@]}"
step sequences "$BENCH_PYTHON" tests/bench/bench_sequences.py --results "$RESULTS" "${QUICK[@]}"
step viz node tests/bench/viz_bench.mjs --server build/attention-server --out "$RESULTS" "${QUICK[@]}"

# The store benchmark's TSV as a table row: ours = the binary file, peer = JSON.
if [ -s "$RESULTS/store.tsv" ]; then
    awk -F'\t' 'NR > 1 { ms[$1] = $4; bytes[$1] = $2; shape = $9 }
        END { printf "store\tweight-set load (%s): binary .wset vs JSON\t%.1f\t%.1f\tms\t\t\t\t\t%d vs %d bytes\n",
                     shape, ms["binary"], ms["json"], bytes["binary"], bytes["json"] }' \
        "$RESULTS/store.tsv" >"$RESULTS/table-store.tsv"
fi

# The run's facts for tests/bench/perf_table.py, which makes the table (one script for the
# summary and for docs/performance.md; the rules of ratio and target are at its top).
{
    printf 'commit\t%s\n' "$(git rev-parse --short HEAD 2>/dev/null)"
    printf 'machine\t%s\n' "$machine"
    printf 'load\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf 'mode\t%s\n' "$([ ${#QUICK[@]} -gt 0 ] && echo quick || echo full)"
    printf 'seconds\t%s\n' "$(( $(date +%s) - started ))"
} >"$RESULTS/run.tsv"
{
    echo "attention-server benchmarks, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo "machine: $machine; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "ours: build/attention-server and attention_run; peer: NumPy $("$BENCH_PYTHON" -c 'import numpy; print(numpy.__version__)') (kernel), jansson (JSON), Flask + gunicorn 2 workers (HTTP)"
    echo "gRPC rows: ours = gRPC (build/bench/grpc-load), peer = the kernel's compute_ms or HTTP v2 binary (wrk)"
    echo "s3store rows: ours = the S3 store (Swift on loopback), peer = the directory store"
    echo "checkpoint rows: ours = safetensors or gzip, peer = JSON or plain, both to our server"
    echo "sequences rows: ours = sequence steps, peer = the kernel's compute_ms + the empty-request floor, or stateless requests"
    echo "medians; ratio = how many times faster ours is; GFLOP/s and ns/number: ours / peer"
    echo
    "$BENCH_PYTHON" tests/bench/perf_table.py --results "$RESULTS" --print
    if [ -s "$RESULTS/ort.md" ]; then
        echo
        echo "Against ONNX Runtime (tests/bench/bench_ort.sh):"
        cat "$RESULTS/ort.md"
    fi
    echo
    echo "Agreement checks (a benchmark of a wrong answer fails the run):"
    cat "$RESULTS"/checks.tsv "$RESULTS"/checks-json.tsv "$RESULTS"/checks-http.tsv \
        "$RESULTS"/checks-grpc.tsv "$RESULTS"/checks-checkpoint.tsv 2>/dev/null |
        awk -F'\t' '{ printf "  %-44s %-40s %-7s %-9s tol %-6s %s\n", $1, $2, $3, $4, $5, $6 }'
    echo "  store: both weight-set loads give back the original doubles bit for bit (bench-store-load)"
} >"$RESULTS/summary.txt"

echo
echo "================================================================================"
cat "$RESULTS/summary.txt"
echo
echo "total $(( $(date +%s) - started )) s; table saved in $RESULTS/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all benchmarks ran and all checks agreed"
# The page's table follows the latest full run that failed nothing (a --quick run's figures
# are a smoke test, not figures to publish).
if [ ${#QUICK[@]} -eq 0 ]; then
    "$BENCH_PYTHON" tests/bench/perf_table.py --results "$RESULTS" --write docs/performance.md ||
        exit 1
fi

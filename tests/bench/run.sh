#!/usr/bin/env bash
# run.sh - every benchmark of the project, each against its competing implementation, then one
# table of the results with ratios. `make bench` builds what it needs and calls this script.
#
#   1. bench-kernel       attention_run (float64, float32) and the naive reference loops
#   2. bench_numpy.py     the same cases in NumPy, after checking NumPy and C agree
#   3. bench_http.sh      the C server against a Python http.server + NumPy service
#   4. bench-store-load   a 4096 x 4096 weight set: the store's binary file against JSON
#
# Timings are medians (the machine is shared and noisy); every benchmark first checks that the
# answers agree, and a disagreement makes the run fail. Settings, all optional:
#   BENCH_BLAS_THREADS  OpenBLAS threads per product for C and NumPy alike (default 1, as the
#                       server's --blas-threads)
#   BENCH_HTTP_SECONDS  seconds of load per HTTP run (default 3)
#   BENCH_STORE_N       wq of the store benchmark is N x N (default 4096)
#   BENCH_PYTHON        interpreter with Debian's NumPy (default /usr/bin/python3)
# Usage: bash tests/bench/run.sh [--quick]   (--quick: one run per case, a smoke test, not a measurement)
# Results: build/bench/results/*.tsv. Exit status 0, or 1 when a benchmark or a check failed.
set -u
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh

QUICK=()
STORE_ARGS=()
if [ "${1:-}" = --quick ]; then
    QUICK=(--quick)
    STORE_ARGS=(--reps-bin 1 --reps-json 1 --n 1024)
    export BENCH_HTTP_SECONDS=${BENCH_HTTP_SECONDS:-1}
fi
RESULTS=build/bench/results
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.tsv "$RESULTS"/*.bin
export OPENBLAS_NUM_THREADS=$BENCH_BLAS_THREADS

for bin in build/attention-server build/bench/bench-kernel build/bench/bench-store-load; do
    [ -x "$bin" ] || { echo "run.sh: $bin is missing; run \`make bench\`" >&2; exit 1; }
done
bench_need_debs python3-numpy hey curl || { echo "run.sh: cannot install what it needs" >&2; exit 1; }

started=$(date +%s)
failed=()
step() {
    local name=$1; shift
    echo
    echo "=== $name"
    "$@" || failed+=("$name")
}

echo "machine: $(nproc) cores, $(sed -nE 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); BLAS threads $BENCH_BLAS_THREADS"
step kernel build/bench/bench-kernel --out "$RESULTS" "${QUICK[@]}"
step numpy "$BENCH_PYTHON" tests/bench/bench_numpy.py --results "$RESULTS" "${QUICK[@]}"
step http bash tests/bench/bench_http.sh "$RESULTS"
step store-load build/bench/bench-store-load --out "$RESULTS/store.tsv" "${STORE_ARGS[@]}"

echo
echo "================================================================================"
echo "Summary (medians; a ratio above 1 means the C code is that many times faster)"
echo
echo "Attention kernel, ms per call (C: attention_run; NumPy: tests/bench/npattn.py; naive: tests/ref)"
if [ -s "$RESULTS/kernel.tsv" ]; then
    [ -s "$RESULTS/numpy.tsv" ] || printf 'case\n' >"$RESULTS/numpy.tsv"
    awk -F'\t' '
    FNR == 1 { next }
    FILENAME ~ /numpy/ { np[$1 "\t" $2] = $4; next }
    { k = $1 "\t" $2; n = (k in np) ? np[k] : ""
      if (!header++) printf "%-32s %-7s %9s %9s %8s %9s %8s\n", "case", "dtype", "C", "NumPy",
                            "NumPy/C", "naive", "naive/C"
      printf "%-32s %-7s %9.3f %9s %8s %9s %8s\n", $1, $2, $10,
             n == "" ? "-" : sprintf("%.3f", n), n == "" ? "-" : sprintf("%.2fx", n / $10),
             $11 == "-" ? "-" : sprintf("%.3f", $11), $11 == "-" ? "-" : sprintf("%.1fx", $11 / $10) }
    ' "$RESULTS/numpy.tsv" "$RESULTS/kernel.tsv"
else
    echo "  (no results: the kernel benchmark failed)"
fi

echo
echo "HTTP end to end (ms/req: mean with 1 connection; req/s: with 4 connections)"
if [ -s "$RESULTS/http.tsv" ]; then
    awk -F'\t' '
    NR == 1 { next }
    { v[$1, $2, $3, "rps"] = $5; v[$1, $2, $3, "mean"] = $6; size[$1] = $9
      if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    END {
      printf "%-12s %10s %9s %9s %8s %10s %9s %8s\n", "case", "body B", "C ms", "NumPy ms",
             "NumPy/C", "C req/s", "NumPy", "C/NumPy"
      for (i = 1; i <= n; i++) {
        c = order[i]; cm = v[c, "C", 1, "mean"]; nm = v[c, "NumPy", 1, "mean"]
        cr = v[c, "C", 4, "rps"]; nr = v[c, "NumPy", 4, "rps"]
        printf "%-12s %10s %9s %9s %8s %10s %9s %8s\n", c, size[c], cm, nm,
               (cm > 0 && nm > 0) ? sprintf("%.2fx", nm / cm) : "-", cr, nr,
               (cr > 0 && nr > 0) ? sprintf("%.2fx", cr / nr) : "-"
      }
    }' "$RESULTS/http.tsv"
else
    echo "  (no results: the HTTP benchmark failed)"
fi

echo
echo "Weight-set load (store_open of the binary file vs json_load_file + request_decode_weight_set)"
if [ -s "$RESULTS/store.tsv" ]; then
    awk -F'\t' '
    NR == 1 { next }
    { bytes[$1] = $2; ms[$1] = $4; reps[$1] = $3; same[$1] = $8; shape = $9
      if ($1 == "json") detail = sprintf("parse %.0f + convert %.0f + free %.0f ms", $5, $6, $7) }
    END {
      printf "%-8s %14s %5s %11s %10s   (%s)\n", "format", "bytes", "runs", "median ms",
             "identical", shape
      printf "%-8s %14s %5s %11.1f %10s\n", "binary", bytes["binary"], reps["binary"],
             ms["binary"], same["binary"]
      printf "%-8s %14s %5s %11.1f %10s   %s\n", "JSON", bytes["json"], reps["json"], ms["json"],
             same["json"], detail
      printf "JSON/binary: %.2fx the bytes, %.1fx the load time\n", bytes["json"] / bytes["binary"],
             ms["json"] / ms["binary"]
    }' "$RESULTS/store.tsv"
else
    echo "  (no results: the store benchmark failed)"
fi

echo
echo "Agreement checks (a benchmark of a wrong answer is worthless)"
cat "$RESULTS/checks.tsv" "$RESULTS/http_checks.tsv" 2>/dev/null |
    awk -F'\t' '{ printf "  %-34s %-24s %-7s max|diff| %-8s tol %-6s %s\n", $1, $2, $3, $4, $5, $6 }'
[ -s "$RESULTS/kernel.tsv" ] && awk -F'\t' '
    FNR > 1 && $12 != "-" { n[$2]++; if ($12 + 0 > worst[$2]) worst[$2] = $12 + 0 }
    END { for (d in n) printf "  %-34s %-24s %-7s max|diff| %-8.1e tol %-6s ok\n",
                              "kernel: attention_run vs naive ref", n[d] " cases", d, worst[d],
                              d == "float64" ? "1e-12" : "1e-04" }' "$RESULTS/kernel.tsv" | sort -r
echo "  (bench-kernel fails the run when a case is past its tolerance; bench-store-load when a"
echo "   load does not give back the original doubles bit for bit)"

echo
echo "total $(( $(date +%s) - started )) s; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all benchmarks ran and all checks agreed"

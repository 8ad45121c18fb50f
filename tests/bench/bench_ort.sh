#!/usr/bin/env bash
# bench_ort.sh - our attention kernel against ONNX Runtime (CPU, 2 intra-op threads), row by row,
# with the machine's ceiling measured in the same run: the FMA peak of the widest instruction set
# (bench-gemm's register-only FMA loop on the compute threads, tests/bench/fma_peak.h), every row
# printed as a share of it for ours and for ONNX Runtime, and OpenBLAS sgemm and dgemm 4096^3 as
# rows of their own, labelled with the OpenBLAS core that ran them; then the end-to-end row: a
# binary v2 request against the kernel's own time.  Issue 34's targets are printed as met or
# MISSED, never as a failure.
#
# The bfloat16 rows give float32 inputs to our kernel with compute_precision bfloat16 and the same
# inputs to ONNX Runtime in float32; ours is checked against the float64 result within the bound
# of docs/numbers.md (bf16_bound.py) and ONNX Runtime's against ours within that bound plus
# float32's tolerance (ort_bench.mjs --bound).  Their speed-up is over our float32 row of the same
# shape in this run, and their share is of the BF16 peak (vdpbf16ps, measured with the FMA peak;
# none where the CPU lacks avx512_bf16).  The AMX rows (ATTN_KERNEL=amx_bf16) run only where the
# CPU reports amx_bf16; elsewhere the table says they were not run.
#
# Each row: build/bench/bench-kernel --case times ours and writes the inputs and its answer to a
# check file; ort_bench.mjs reads the same inputs, fails the row unless ONNX Runtime's answer
# agrees, then times it.  Medians of bounded repetitions on both sides, the two taking turns in
# three rounds (one with --quick).  The peak is measured before the rows and again after them,
# and the higher of the two is the ceiling: on a shared machine a share of a low reading would
# flatter both sides.
#
# Usage: bash tests/bench/bench_ort.sh RESULTS [--quick]   (from the repository's top; `make bench`
# runs it through run.sh).  Writes RESULTS/ort.md (the table), making the directory RESULTS if
# need be; exit status 0, or 1 when a check failed or a program did not run.
set -u
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
RESULTS=${1:?usage: bash tests/bench/bench_ort.sh RESULTS [--quick]}
QUICK=${2:-}
mkdir -p "$RESULTS"
work=$(mktemp -d)
trap 'bench_stop_all; rm -rf -- "$work"' EXIT
failed=0

[ -e tests/bench/ort/node_modules/onnxruntime-node ] ||
    { echo "bench_ort.sh: onnxruntime-node is missing; run \`make ort-deps\`" >&2; exit 1; }

# The ceiling: bench-gemm prints "peak ISA THREADS F32 F64" per instruction set (widest first),
# "core NAME threads N", then "dgemm GFLOPS MS RUNS" and sgemm.
build/bench/bench-gemm $QUICK >"$work/gemm" || { echo "bench_ort.sh: bench-gemm failed" >&2; exit 1; }
cat "$work/gemm"
core=$(awk '$1 == "core" { print $2 }' "$work/gemm")
read -r dgemm dgemm_ms <<<"$(awk '$1 == "dgemm" { print $2, $3 }' "$work/gemm")"
read -r sgemm sgemm_ms <<<"$(awk '$1 == "sgemm" { print $2, $3 }' "$work/gemm")"
grep '^peak ' "$work/gemm" | head -1 >"$work/peaks"
[ -s "$work/peaks" ] || echo "bench_ort.sh: this CPU has no FMA: no shares of a peak" >&2

# The rows: id dtype batch heads len head_dim causal attention ORT-op targets
#   targets, comma-separated: "xN": ORT/ours >= N;  "%N": ours at >= N% of the FMA peak of its
#   precision;  "fN": our float32 kernel on the same shape over ours >= N (the float32 twin is
#   timed in the same rounds, just before ours, and the ratio is the median of the rounds'
#   ratios: this machine's speed can change between rows);  "-": none.  An ID ending in -amx
#   runs on the amx_bf16 path.
ROWS="n1024-f32      float32 1 1 1024  64 0 0 mha         -
n4096-f32      float32 1 1 4096  64 0 0 mha         x1.05,%80
n16384-f32     float32 1 1 16384 64 0 0 mha         x1.05,%80
n4096-f32-op23 float32 1 1 4096  64 0 0 attention23 -
n1024-f64      float64 1 1 1024  64 0 0 attention23 -
n4096-f64      float64 1 1 4096  64 0 0 attention23 %80
n4096-f32-causal float32 1 1 4096 64 1 0 mha        x1.5
n4096-f32-attn float32 1 1 4096  64 0 1 attention23 x2.0
b4h8n512-f32   float32 4 8 512   64 0 0 mha         x1.2
n4096-bf16     bfloat16 1 1 4096 64 0 0 mha         f1.6
n16384-bf16    bfloat16 1 1 16384 64 0 0 mha        f1.6
n4096-bf16-causal bfloat16 1 1 4096 64 1 0 mha      f1.6
n4096-bf16-amx bfloat16 1 1 4096 64 0 0 mha         f4"

# One line per row measured, "ID OP DTYPE OURS_MS GFLOP TARGETS CAUSAL ORT-JSON", made into the
# table once the second reading of the peak is in; per row with an "fN" target, "ID RATIO
# TWIN_MS" in twins.
: >"$work/measured"
: >"$work/twins"

# The two sides take turns, ROUNDS times per row, and each side's time is the median of its
# rounds' medians: on a shared machine the load moves within seconds, and a row measured all of
# ours and then all of ONNX Runtime's could catch the two sides in different weather.
ROUNDS=3
[ -n "$QUICK" ] && ROUNDS=1

while read -r id dtype batch heads len hd causal attn op target; do
    check_rows=$(( attn ? (len < 64 ? len : 64) : 0 ))
    kernel=${ATTN_KERNEL:-}
    if [ "${id%-amx}" != "$id" ]; then
        if ! grep -qw amx_bf16 /proc/cpuinfo; then
            echo "$id: not run, this CPU lacks amx_bf16"
            echo "| $id ($dtype) | $op | not run: this CPU lacks amx_bf16 | | | | | - | |" \
                >>"$work/not-run"
            continue
        fi
        kernel=amx_bf16
    fi
    ort_dtype=$dtype bound=()
    [ "$dtype" = bfloat16 ] && ort_dtype=float32 bound=(--bound "$work/bound-$id.bin")
    : >"$work/rounds"
    : >"$work/twin-rounds"
    status=0
    for round in $(seq "$ROUNDS"); do
        if [ "${target#*f}" != "$target" ]; then # the float32 twin, in this round
            build/bench/bench-kernel --out "$work/twin" \
                --case "twin,float32,$batch,$heads,$len,$hd,$causal,$attn" $QUICK >/dev/null ||
                { echo "bench_ort.sh: $id: bench-kernel (float32 twin) failed" >&2; status=2; break; }
            awk -F'\t' 'NR == 2 { printf "%s ", $11 }' "$work/twin/kernel.tsv" >>"$work/twin-rounds"
        fi
        env ${kernel:+ATTN_KERNEL=$kernel} build/bench/bench-kernel --out "$work" \
            --case "$id,$dtype,$batch,$heads,$len,$hd,$causal,$attn" $QUICK >/dev/null ||
            { echo "bench_ort.sh: $id: bench-kernel failed" >&2; status=2; break; }
        read -r ours_ms gflop <<<"$(awk -F'\t' 'NR == 2 { print $11, $12 }' "$work/kernel.tsv")"
        if [ "$check_rows" != "$(awk -F'\t' 'NR == 2 { print $13 }' "$work/kernel.tsv")" ]; then
            echo "bench_ort.sh: $id: bench-kernel wrote other check rows than expected" >&2
            status=2; break
        fi
        # every round's answer is checked again: the same inputs, a new run of each side
        if [ "$dtype" = bfloat16 ] && ! "$BENCH_PYTHON" tests/bench/bf16_bound.py \
            --check "$work/check-$id.bin" --batch "$batch" --heads "$heads" --len "$len" \
            --head-dim "$hd" --causal "$causal" --out "$work/bound-$id.bin"; then
            echo "bench_ort.sh: $id: ours is past the bfloat16 bound" >&2; status=2; break
        fi
        ort=$(node tests/bench/ort_bench.mjs --check "$work/check-$id.bin" --op "$op" \
            --dtype "$ort_dtype" --batch "$batch" --heads "$heads" --len "$len" --head-dim "$hd" \
            --causal "$causal" --attention "$attn" --check-rows "$check_rows" "${bound[@]}" \
            $QUICK) || status=1
        echo "$id round $round: ours $ours_ms ms; ORT $op: $ort"
        [ $status -eq 0 ] || break
        echo "$ours_ms $ort" >>"$work/rounds"
        [ -s "$work/twin-rounds" ] && echo "$ours_ms" >>"$work/twin-rounds"
    done
    [ $status -eq 2 ] && { failed=1; continue; }
    if [ "$id" = n4096-f32 ] && [ $status -eq 0 ]; then # kept for the end-to-end row below
        mv "$work/check-$id.bin" "$work/e2e.check"
    fi
    rm -f "$work/check-$id.bin" "$work/bound-$id.bin"
    if [ $status -ne 0 ]; then
        echo "bench_ort.sh: $id: ONNX Runtime failed or disagreed" >&2; failed=1; continue
    fi
    # The medians of the rounds, and the largest difference any round saw.
    read -r ours_ms ort <<<"$(node -e '
        const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n");
        const med = (v) => { v = [...v].sort((a, b) => a - b); const m = v.length >> 1;
                             return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2; };
        const ours = rows.map((r) => Number(r.split(" ")[0]));
        const orts = rows.map((r) => JSON.parse(r.slice(r.indexOf(" ") + 1)));
        const ort = { ...orts[0], ms: med(orts.map((o) => o.ms)),
                      reps: orts.reduce((n, o) => n + o.reps, 0),
                      max_diff: Math.max(...orts.map((o) => o.max_diff)) };
        console.log(med(ours), JSON.stringify(ort));
    ' "$work/rounds")"
    echo "$id: ours $ours_ms ms; ORT $op: $ort (medians of $ROUNDS rounds)"
    if [ -s "$work/twin-rounds" ]; then
        twin_ratio=$(awk '{ print $1 / $2 }' "$work/twin-rounds" | bench_median %.3f)
        twin_ms=$(awk '{ print $1 }' "$work/twin-rounds" | bench_median %.3f)
        echo "$id: float32 twin $twin_ms ms; float32 / ours $twin_ratio (median of the rounds' ratios)"
        echo "$id $twin_ratio $twin_ms" >>"$work/twins"
    fi
    echo "$id $op $dtype $ours_ms $gflop $target $causal $ort" >>"$work/measured"
done <<<"$ROWS"

# The peak again, after the rows; the higher reading of each precision is the ceiling.
build/bench/bench-gemm --peak-only $QUICK >"$work/peak2" ||
    { echo "bench_ort.sh: bench-gemm --peak-only failed" >&2; exit 1; }
cat "$work/peak2"
read -r isa peak_threads peak32 peak64 peak16 <<<"$(cat "$work/peaks" <(head -1 "$work/peak2") | awk '
    $1 == "peak" { isa = $2; t = $3; if ($4 > f) f = $4; if ($5 > d) d = $5; if ($6 > b) b = $6 }
    END { if (isa == "") print "none", 0, 0, 0, 0; else print isa, t, f, d, b + 0 }')"

printf '%s\n' "| row | ORT op | ours ms | ORT ms | ORT/ours (>1: ours faster) | ours GFLOP/s (% of FMA peak) | ORT GFLOP/s (% of FMA peak) | target | max diff / max |" >"$work/table"
printf '%s\n' "|---|---|---|---|---|---|---|---|---|" >>"$work/table"
node -e '
    const [peak32, peak64] = process.argv.slice(1).map(Number);
    const peak16 = Number(process.argv[8]);
    const lines = require("fs").readFileSync(0, "utf8").split("\n").filter((l) => l);
    const twins = Object.fromEntries(require("fs").readFileSync(process.argv[10], "utf8")
        .split("\n").filter((l) => l).map((l) => [l.split(" ")[0], l.split(" ").map(Number)]));
    for (const line of lines) {
        const [id, op, dtype, ours, gflop, targets, causal] = line.split(" ", 7);
        const ort = JSON.parse(line.split(" ").slice(7).join(" "));
        const oursMs = Number(ours), g = Number(gflop);
        const peak = dtype === "bfloat16" ? peak16 : dtype === "float32" ? peak32 : peak64;
        const rate = (ms) => g / ms * 1e3;
        // A causal row counts the whole n^2 (as bench-kernel does), so a share of the peak
        // would overstate it: none is printed there.
        const pct = (ms) => 100 * rate(ms) / peak;
        const share = (ms, p = peak) => causal === "1" ? "causal" :
            p > 0 ? (100 * rate(ms) / p).toFixed(0) + "%" : "no peak";
        const ratio = ort.ms / oursMs;
        const verdicts = targets === "-" ? ["-"] : targets.split(",").map((t) => {
            const n = Number(t.slice(1));
            if (t.startsWith("x"))
                return `ORT/ours >= ${n}: ` + (ratio >= n ? "met" : "MISSED");
            if (t.startsWith("f")) {
                if (!twins[id]) return `float32 kernel/ours >= ${n}: MISSED (no float32 twin)`;
                const [, f, twinMs] = twins[id];
                return `float32 kernel (${twinMs.toFixed(2)} ms)/ours >= ${n}: ` +
                    (f >= n ? "met" : "MISSED") + ` (${f.toFixed(2)})`;
            }
            return `>= ${n}% of the FMA peak: ` + (peak > 0 && pct(oursMs) >= n ? "met" : "MISSED");
        });
        console.log(`| ${id} (${dtype}) | ${op} | ${oursMs.toFixed(2)} | ${ort.ms.toFixed(2)} | ` +
            `${ratio.toFixed(2)} | ${rate(oursMs).toFixed(0)} (${share(oursMs)}) | ` +
            `${rate(ort.ms).toFixed(0)} (${share(ort.ms, dtype === "bfloat16" ? peak32 : peak)}) | ` +
            `${verdicts.join("; ")} | ` +
            `${(ort.max_diff / ort.scale).toExponential(1)} |`);
    }
    // The rows not run (AMX on a CPU without it), then the BLAS rows: what OpenBLAS reaches
    // on the same peak (2 n^3 per product, every core).
    const notRun = require("fs").existsSync(process.argv[9]) ?
        require("fs").readFileSync(process.argv[9], "utf8") : "";
    if (notRun) process.stdout.write(notRun);
    for (const [name, gf, ms, peak] of [["sgemm", process.argv[3], process.argv[4], peak32],
                                        ["dgemm", process.argv[5], process.argv[6], peak64]])
        console.log(`| OpenBLAS ${name} 4096³ (core ${process.argv[7]}) | - | ${Number(ms).toFixed(2)} | - | - | ` +
            `${Number(gf).toFixed(0)} (${peak > 0 ? (100 * gf / peak).toFixed(0) + "%" : "no peak"}) | - | - | - |`);
' "$peak32" "$peak64" "$sgemm" "$sgemm_ms" "$dgemm" "$dgemm_ms" "$core" "$peak16" \
    "$work/not-run" "$work/twins" <"$work/measured" >>"$work/table"

# End to end: the n4096-f32 inputs as one binary v2 request (FP32, output only) to the server on
# loopback, answered within 1.3 times the kernel's own time.  The kernel (bench-kernel, the same
# case) and the requests take turns in rounds, as the rows above do with ONNX Runtime, so that
# both sides of the ratio see the same load: each round times the kernel, then posts requests
# (at least 5, at most 20, about a second) twice: with curl, a new client and connection each,
# and from one keep-alive connection back to back (ort_e2e.py post), as bench-kernel runs its
# repetitions.  Each row's ratio is the median of the rounds' ratios (a round's request median
# over its kernel median: the two sides of a ratio always from the same minutes); the target is
# judged on the second row, the first shows what a client that leaves the CPUs idle between
# requests sees (docs/performance.md, "Where the time goes").  When the rounds' kernel medians
# differ by more than a quarter, the machine changed speed during the row and the verdict says
# so beside met or MISSED.
e2e_row() {
    [ -s "$work/e2e.check" ] || return 1     # kept by the n4096-f32 row above
    "$BENCH_PYTHON" tests/bench/ort_e2e.py body "$work/e2e.check" 4096 64 "$work/e2e.v2" || return 1
    bench_start_ours ortserver "$work" || return 1
    local url=$BENCH_URL/v2/models/attention/infer hlen n spent t round kernel_ms ka
    hlen=$(cat "$work/e2e.v2.hlen")
    # post [ANSWER HEADERS]: one request; prints curl's time.  The timed requests keep no copy
    # of the answer (/dev/null): a client's saving 1 MiB to a file is not the server's time
    # (curl truncating and writing the file took 2 to 4 ms a request here).
    post() {
        local out
        out=$(curl -sS -o "${1:-/dev/null}" -D "${2:-/dev/null}" -w '%{http_code} %{time_total}' \
            -H 'Content-Type: application/octet-stream' -H "Inference-Header-Content-Length: $hlen" \
            --data-binary "@$work/e2e.v2" "$url") || return 1
        [ "${out%% *}" = 200 ] || { echo "bench_ort.sh: the server answered ${out%% *}" >&2; return 1; }
        echo "${out#* }"
    }
    post "$work/e2e.out" "$work/e2e.headers" >/dev/null &&
        "$BENCH_PYTHON" tests/bench/ort_e2e.py check "$work/e2e.check" 4096 64 \
            "$work/e2e.out" "$work/e2e.headers" || return 1
    local min=5 budget=1 most=20
    [ -n "$QUICK" ] && { min=1; budget=0; most=1; }
    mkdir -p "$work/e2ek"
    : >"$work/e2e.rounds"
    for round in $(seq "$ROUNDS"); do
        build/bench/bench-kernel --out "$work/e2ek" --case "n4096-f32,float32,1,1,4096,64,0,0" \
            $QUICK >/dev/null || { echo "bench_ort.sh: e2e: bench-kernel failed" >&2; return 1; }
        kernel_ms=$(awk -F'\t' 'NR == 2 { print $11 }' "$work/e2ek/kernel.tsv")
        : >"$work/e2e.times"
        n=0 spent=0
        while [ $n -lt $most ] && { [ $n -lt $min ] || awk -v s="$spent" -v b="$budget" 'BEGIN { exit !(s < b) }'; }; do
            t=$(post) || return 1
            echo "$t" >>"$work/e2e.times"
            spent=$(awk -v s="$spent" -v t="$t" 'BEGIN { print s + t }')
            n=$((n + 1))
        done
        t=$(awk '{ print $1 * 1000 }' "$work/e2e.times" | bench_median %.3f)
        "$BENCH_PYTHON" tests/bench/ort_e2e.py post "$url" "$work/e2e.v2" "$min" "$most" "$budget" \
            >"$work/e2e.ka" || return 1
        ka=$(awk '{ print $1 * 1000 }' "$work/e2e.ka" | bench_median %.3f)
        echo "end to end round $round: kernel $kernel_ms ms; request median $t ms over $n (curl)," \
            "$ka ms over $(wc -l <"$work/e2e.ka") (one connection, back to back)"
        echo "$kernel_ms $t $ka" >>"$work/e2e.rounds"
    done
    local ms k r_ms r_ka noisy
    k=$(awk '{ print $1 }' "$work/e2e.rounds" | bench_median %.3f)
    ms=$(awk '{ print $2 }' "$work/e2e.rounds" | bench_median %.3f)
    ka=$(awk '{ print $3 }' "$work/e2e.rounds" | bench_median %.3f)
    r_ms=$(awk '{ print $2 / $1 }' "$work/e2e.rounds" | bench_median %.3f)
    r_ka=$(awk '{ print $3 / $1 }' "$work/e2e.rounds" | bench_median %.3f)
    noisy=$(awk 'NR == 1 || $1 < lo { lo = $1 } $1 > hi { hi = $1 }
        END { if (hi > 1.25 * lo) printf " (rounds disagree: kernel %.2f to %.2f ms)", lo, hi }' \
        "$work/e2e.rounds")
    echo "end to end: request $ms ms (curl), $ka ms (back to back); kernel $k ms (medians of $ROUNDS" \
        "rounds); request / kernel $r_ms and $r_ka (medians of the rounds' ratios)$noisy"
    awk -v ms="$ms" -v ka="$ka" -v k="$k" -v r_ms="$r_ms" -v r_ka="$r_ka" -v noisy="$noisy" 'BEGIN {
        printf "| v2 binary request q,k,v 4096x64 (float32), output only, curl on loopback, a new client each | server | %.2f | - | request / kernel alone (%.2f ms, same rounds): %.2f | | | - | |\n",
               ms, k, r_ms
        printf "| the same from one keep-alive connection, back to back | server | %.2f | - | request / kernel alone: %.2f | | | <= 1.3: %s%s | |\n",
               ka, r_ka, (r_ka <= 1.3) ? "met" : "MISSED", noisy }' >>"$work/table"
    bench_stop_all
}
echo
e2e_row || { echo "bench_ort.sh: the end-to-end row failed" >&2; failed=1; }

{
    echo "ours (attention_run, as the server runs it) against ONNX Runtime $(node -p "require('./tests/bench/ort/node_modules/onnxruntime-node/package.json').version") (CPU, 2 intra-op threads);"
    echo "ceiling in this run: the FMA peak ($isa, $peak_threads threads, register-only FMA loop; the higher of a reading before and one after the rows): float32 $peak32 GFLOP/s, float64 $peak64 GFLOP/s;"
    if awk -v b="$peak16" 'BEGIN { exit !(b > 0) }'; then
        echo "BF16 peak (vdpbf16ps, the same loop and threads): $peak16 GFLOP/s, the ceiling of the bfloat16 rows (ours: float32 in, bfloat16 products; ONNX Runtime: float32, its share of the float32 peak);"
    else
        echo "no BF16 peak: this CPU lacks avx512_bf16, so the bfloat16 rows have no share of one;"
    fi
    echo "OpenBLAS (core $core, all cores): sgemm 4096^3 $sgemm GFLOP/s, dgemm $dgemm GFLOP/s;"
    echo "GFLOP/s count 4 n^2 d per head (causal too); medians; ORT/ours > 1 means ours is faster."
    echo
    cat "$work/table"
} >"$RESULTS/ort.md"
echo
cat "$RESULTS/ort.md"
exit $failed

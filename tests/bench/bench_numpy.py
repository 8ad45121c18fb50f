"""bench_numpy.py - the competing implementation, timed on the cases of bench_kernel.c.

Reads kernel.tsv (written by build/bench/bench-kernel) for the list of cases, so that the two
programs cannot drift apart, and times npattn.sdpa on each one with the same policy: one warm-up
run, then at least 5 runs and more until 0.4 s have passed, median in milliseconds. Inputs are
uniform in [-2, 2) and already in the case's dtype, as a notebook's arrays would be; making them
is not timed.

Before any timing it checks that NumPy and the C code agree: for every case listed in check.tsv
it reads the inputs and the C results that bench-kernel wrote (raw little-endian doubles),
recomputes them with NumPy in the same dtype and compares. A disagreement fails the run (exit 1).

Usage: python3 bench_numpy.py --results DIR [--quick]
Writes DIR/numpy.tsv (case, dtype, reps, numpy_ms) and DIR/checks.tsv (one line per check).
OpenBLAS threads: OPENBLAS_NUM_THREADS, which run.sh sets from BENCH_BLAS_THREADS (default 1).
"""

import argparse
import csv
import os
import sys
import time

try:
    import numpy as np
except ImportError:
    sys.exit("bench_numpy.py: NumPy is missing; `bash tests/bench/run.sh` installs Debian's "
             "python3-numpy (or: apt-get install python3-numpy) and runs /usr/bin/python3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npattn  # noqa: E402

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
DTYPES = {"float64": np.float64, "float32": np.float32}


def blas_in_use():
    """The BLAS shared library this process has actually loaded (NumPy's, via libblas.so.3)."""
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line}
    except OSError:
        return "unknown"
    return ", ".join(sorted(os.path.realpath(p) for p in libs)) or "unknown"


def median_ms(fn, min_reps, budget_s, max_reps=200):
    """Runs fn once untimed, then min_reps times and on until budget_s has passed."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or
                                     time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), len(times)


def run_checks(results_dir):
    """Recomputes the C results listed in check.tsv; returns rows for checks.tsv and ok."""
    rows, all_ok = [], True
    with open(os.path.join(results_dir, "check.tsv")) as index:
        for line in index:
            fname, dtype, b, h, length, hd, causal, scale = line.rstrip("\n").split("\t")
            b, h, length, hd, causal = int(b), int(h), int(length), int(hd), causal == "1"
            d = h * hd
            data = np.fromfile(os.path.join(results_dir, fname), dtype="<f8")
            sizes = [b * length * d] * 4 + [b * h * length * length]
            if data.size != sum(sizes):
                sys.exit(f"bench_numpy.py: {fname} holds {data.size} doubles, not {sum(sizes)}")
            parts = np.split(data, np.cumsum(sizes)[:-1])
            q, k, v, c_out = (p.reshape(b, length, d) for p in parts[:4])
            c_attn = parts[4].reshape(b, h, length, length)
            out, attn = npattn.sdpa(q, k, v, heads=h, causal=causal, scale=float(scale),
                                    dtype=DTYPES[dtype])
            diff = max(float(np.max(np.abs(out - c_out))), float(np.max(np.abs(attn - c_attn))))
            ok = bool(diff <= TOLERANCE[dtype])
            all_ok &= ok
            name = f"B{b} H{h} L{length} dh{hd} {'causal' if causal else 'full'}"
            rows.append((name, dtype, f"{diff:.1e}", f"{TOLERANCE[dtype]:.0e}",
                         "ok" if ok else "FAILED"))
            print(f"check attention_run vs NumPy  {name:<28} {dtype}: max |diff| {diff:.1e} "
                  f"(tolerance {TOLERANCE[dtype]:.0e}) {'ok' if ok else 'FAILED'}")
    return rows, all_ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="build/bench/results")
    parser.add_argument("--quick", action="store_true", help="one run per case (smoke test)")
    args = parser.parse_args()
    min_reps, budget = (1, 0.0) if args.quick else (5, 0.4)

    check_rows, checks_ok = run_checks(args.results)
    with open(os.path.join(args.results, "checks.tsv"), "w") as f:
        for row in check_rows:
            f.write("kernel: attention_run vs NumPy\t" + "\t".join(row) + "\n")

    print(f"NumPy {np.__version__}, BLAS {blas_in_use()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print(f"{'case':<34} {'dtype':<7} {'runs':>5} {'median ms':>10}")
    rng = np.random.default_rng(20240611)
    out_rows = []
    with open(os.path.join(args.results, "kernel.tsv")) as f:
        cases = list(csv.DictReader(f, delimiter="\t"))
    for c in cases:
        b, h, length, hd = (int(c[key]) for key in ("batch", "heads", "len", "head_dim"))
        dtype = DTYPES[c["dtype"]]
        shape = (b, length, h * hd)
        q, k, v = (rng.uniform(-2, 2, shape).astype(dtype) for _ in range(3))
        want_attention = c["attention"] == "1"

        def run():
            npattn.sdpa(q, k, v, heads=h if h > 1 else None, causal=c["causal"] == "1",
                        dtype=dtype, return_attention=want_attention)

        ms, reps = median_ms(run, min_reps, budget)
        print(f"{c['case']:<34} {c['dtype']:<7} {reps:>5} {ms:>10.3f}", flush=True)
        out_rows.append((c["case"], c["dtype"], str(reps), f"{ms:.6f}"))
    with open(os.path.join(args.results, "numpy.tsv"), "w") as f:
        f.write("case\tdtype\treps\tnumpy_ms\n")
        for row in out_rows:
            f.write("\t".join(row) + "\n")
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""bench_numpy.py - the kernel's competitor: NumPy on the cases of bench_kernel.c.

Reads kernel.tsv (written by build/bench/bench-kernel) for the list of cases and, for each one,
check-<id>.bin for the very inputs attention_run was given. First it recomputes the case with
npattn.sdpa in the case's dtype and compares with what attention_run returned (output, and the
attention rows written): a difference over the tolerance (relative to the largest magnitude:
1e-6 for float64, 1e-4 for float32) fails the run. A case computed in bfloat16 (kernel.tsv's
compute column) is held instead to the bound of docs/numbers.md against the float64 result
(bf16_bound.py), and NumPy's side of it is float32. Then it times npattn.sdpa with the same
policy as bench-kernel: one warm-up run, then at least 5 runs and more until 1.5 s have passed,
median in milliseconds. Inputs are already arrays of the case's dtype, as a NumPy user's would
be; converting them is not timed.

NumPy's OpenBLAS uses its default thread count (all cores, what a user gets) unless
OPENBLAS_NUM_THREADS is set; run.sh sets it from BENCH_NUMPY_THREADS when that is given.

Usage: python3 bench_numpy.py --results DIR [--quick]
Writes DIR/numpy.tsv, DIR/table-kernel.tsv (rows of the summary table) and DIR/checks.tsv.
"""

import argparse
import csv
import os
import sys
import time

try:
    import numpy as np
except ImportError:
    sys.exit("bench_numpy.py: NumPy is missing; `make bench` installs Debian's python3-numpy "
             "and runs /usr/bin/python3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bf16_bound  # noqa: E402
import npattn  # noqa: E402

TOLERANCE = {"float64": 1e-6, "float32": 1e-4}
DTYPES = {"float64": np.float64, "float32": np.float32}


def blas_threads():
    """OpenBLAS's thread count in this process, if the library says."""
    try:
        import ctypes
        for name in ("libopenblas.so.0", "libopenblasp-r0.3.21.so"):
            try:
                lib = ctypes.CDLL(name)
                return int(lib.openblas_get_num_threads())
            except OSError:
                continue
    except Exception:  # noqa: BLE001 - only informative
        pass
    return os.environ.get("OPENBLAS_NUM_THREADS", "default")


def median_ms(fn, min_reps, budget_s, max_reps=100):
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or
                                     time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), len(times)


def label(c):
    shape = f"n={c['len']} d={c['head_dim']}"
    if c["batch"] != "1" or c["heads"] != "1":
        shape = f"batch {c['batch']} x {c['heads']} heads, L={c['len']} d={c['head_dim']}"
    extra = (", causal" if c["causal"] == "1" else "") + \
            (", attention returned" if c["attention"] == "1" else ", output only")
    compute = ", bfloat16 compute" if c["compute"] == "bfloat16" else ""
    return f"kernel {c['dtype']} {shape}{compute}{extra}"


def rel_diff(a, b):
    scale = max(float(np.max(np.abs(b))), 1e-300)
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - b))) / scale


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="build/bench/results")
    parser.add_argument("--quick", action="store_true", help="one run per case (smoke test)")
    args = parser.parse_args()
    min_reps, budget = (1, 0.0) if args.quick else (5, 1.5)
    threads = blas_threads()
    print(f"NumPy {np.__version__}, OpenBLAS threads {threads} "
          f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    with open(os.path.join(args.results, "kernel.tsv")) as f:
        cases = list(csv.DictReader(f, delimiter="\t"))
    rows, checks, all_ok = [], [], True
    print(f"{'case':<18} {'runs':>5} {'median ms':>10} {'GFLOP/s':>9}  check")
    for c in cases:
        b, h, n, hd = (int(c[key]) for key in ("batch", "heads", "len", "head_dim"))
        check_rows = int(c["check_rows"])
        dtype, causal, want = DTYPES[c["dtype"]], c["causal"] == "1", c["attention"] == "1"
        path = os.path.join(args.results, f"check-{c['id']}.bin")
        data = np.fromfile(path, dtype="<f8")
        os.remove(path)
        size = b * n * h * hd
        if data.size != 4 * size + b * h * check_rows * n:
            sys.exit(f"bench_numpy.py: {path} holds {data.size} doubles, not what kernel.tsv says")
        q, k, v, c_out = (data[i * size:(i + 1) * size].reshape(b, n, h * hd) for i in range(4))
        c_attn = data[4 * size:].reshape(b, h, check_rows, n)
        q, k, v = (a.astype(dtype) for a in (q, k, v))
        heads = h if h > 1 else None

        def run():
            return npattn.sdpa(q, k, v, heads=heads, causal=causal, dtype=dtype,
                               return_attention=want)

        if c["compute"] == "bfloat16":
            if check_rows:
                sys.exit(f"bench_numpy.py: {c['id']}: the bfloat16 bound is the output's only")
            diff, _ = bf16_bound.check(q, k, v, c_out, h, causal)
            ok, tolerance, what = diff <= 1, "bound", "error / bound"
        else:
            out, attn = run()
            diff = rel_diff(c_out, out)
            if check_rows:
                attn = attn.reshape(b, h, n, n)[:, :, :check_rows, :]
                diff = max(diff, rel_diff(c_attn, attn))
            ok, tolerance, what = diff <= TOLERANCE[c["dtype"]], \
                f"{TOLERANCE[c['dtype']]:.0e}", "max rel diff"
            del out, attn
        all_ok &= ok
        checks.append(("kernel: attention_run vs NumPy", c["id"], c["compute"], f"{diff:.1e}",
                       tolerance, "ok" if ok else "FAILED"))
        ms, reps = median_ms(run, min_reps, budget)
        gflop = float(c["gflop"])
        print(f"{c['id']:<18} {reps:>5} {ms:>10.3f} {gflop / ms * 1e3:>9.1f}  "
              f"{what} {diff:.1e} {'ok' if ok else 'FAILED'}", flush=True)
        target = float(c["target"])
        c_ms = float(c["c_ms"])
        rows.append(("kernel", label(c), f"{c_ms:.3f}", f"{ms:.3f}", "ms",
                     f"{target:g}" if target else "", f"{gflop / c_ms * 1e3:.1f} / "
                     f"{gflop / ms * 1e3:.1f}", "", "",
                     f"threads: ours {c['threads']}, NumPy {threads}"))
    with open(os.path.join(args.results, "table-kernel.tsv"), "w") as f:
        for row in rows:
            f.write("\t".join(row) + "\n")
    with open(os.path.join(args.results, "checks.tsv"), "a") as f:
        for row in checks:
            f.write("\t".join(row) + "\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

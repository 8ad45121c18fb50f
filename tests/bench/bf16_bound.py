"""bf16_bound.py - the error bound of compute_precision bfloat16, for the benchmarks' checks.

docs/numbers.md ("bfloat16 products") bounds each output number of a bfloat16 job against the
float64 result: with u = 2^-9 and d the head dim, query row i's scores move by at most
D_i = (2u + u^2 + d 2^-24) scale max_j sum_t |q_it k_jt|, and every number of row i lies within
(e^(2 D_i) - 1 + 2u + 1e-5) max |v| of the float64 result (max |v| over the head's values).
tests/unit/test_kernel_bf16.c holds the kernel to the same bound; a benchmark of a bfloat16 row
is checked with it too, since float32's tolerance (1e-4 of the largest output) does not apply
to products of 8-bit significands.

As a library: bound(q, k, v, heads) gives the bound of every output number, and check(...)
compares an answer with the float64 reference under it (bench_numpy.py). As a program, for
bench_ort.sh: reads a check file of bench-kernel --case (raw little-endian doubles q, k, v, our
output), fails unless our output is within the bound, and writes the bound of every output
number (little-endian doubles, the output's layout) to --out, for ort_bench.mjs --bound.

Usage: bf16_bound.py --check FILE --batch B --heads H --len L --head-dim D --causal 0|1 --out FILE
Prints "worst W of the bound" (W <= 1 passes); exit status 0, or 1 when the output is past it.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npattn  # noqa: E402

U = 2.0 ** -9       # bfloat16's unit roundoff
ROWS_AT_ONCE = 1024  # query rows of |q| |k|^T held at once (memory, at 16k keys and more)


def split_heads(a, heads):
    """(..., L, H*d) -> (..., H, L, d), as npattn.sdpa splits them."""
    return a.reshape(a.shape[:-1] + (heads, -1)).swapaxes(-2, -3)


def bound(q, k, v, heads=1, scale=None):
    """The bound of every number of the output, shaped as the output (..., Lq, H*d)."""
    q, k, v = (split_heads(np.abs(np.asarray(a, dtype=np.float64)), heads) for a in (q, k, v))
    hd = q.shape[-1]
    scale = 1.0 / np.sqrt(hd) if scale is None else scale
    big = np.empty(q.shape[:-1])
    kt = k.swapaxes(-1, -2)
    for r0 in range(0, q.shape[-2], ROWS_AT_ONCE):
        big[..., r0:r0 + ROWS_AT_ONCE] = (q[..., r0:r0 + ROWS_AT_ONCE, :] @ kt).max(axis=-1)
    d = (2 * U + U * U + hd * 2.0 ** -24) * scale * big
    vmax = v.max(axis=(-2, -1))[..., None]
    rows = (np.expm1(2 * d) + 2 * U + 1e-5) * vmax                     # (..., H, Lq)
    per = np.broadcast_to(rows[..., None], rows.shape + (v.shape[-1],))  # (..., H, Lq, d)
    out = per.swapaxes(-2, -3)
    return out.reshape(out.shape[:-2] + (-1,))


def check(q, k, v, ours, heads=1, causal=False):
    """(worst error over its bound, the bound): ours against the float64 result of q, k, v."""
    lq, lk = q.shape[-2], k.shape[-2]
    ref = np.empty(np.shape(ours))
    for r0 in range(0, lq, ROWS_AT_ONCE):  # a chunk of query rows at a time, for memory
        rows = slice(r0, min(r0 + ROWS_AT_ONCE, lq))
        mask = np.arange(lk)[None, :] <= np.arange(lq)[rows, None] if causal else None
        ref[..., rows, :], _ = npattn.sdpa(q[..., rows, :], k, v,
                                           heads=heads if heads > 1 else None, mask=mask,
                                           dtype=np.float64, return_attention=False)
    b = bound(q, k, v, heads)
    return float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - ref) / b)), b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("check", "out"):
        ap.add_argument("--" + name, required=True)
    for name in ("batch", "heads", "len", "head-dim", "causal"):
        ap.add_argument("--" + name, type=int, required=True)
    a = ap.parse_args()
    size = a.batch * a.len * a.heads * a.head_dim
    data = np.fromfile(a.check, dtype="<f8", count=4 * size)
    if data.size != 4 * size:
        sys.exit("bf16_bound.py: %s is shorter than q, k, v and the output" % a.check)
    q, k, v, ours = (data[i * size:(i + 1) * size].reshape(a.batch, a.len, -1) for i in range(4))
    worst, b = check(q, k, v, ours, a.heads, a.causal == 1)
    b.astype("<f8").tofile(a.out)
    print("worst %.3g of the bound" % worst)
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())

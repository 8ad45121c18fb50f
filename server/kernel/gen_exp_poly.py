#!/usr/bin/env python3
"""Prints the coefficients of the float32 exponential's polynomial, EXP_POLY in
server/kernel/attention_fused_path.inc.

The kernel's vexp (attention_fused_impl.inc) reduces x to r in [-ln2/2, ln2/2]
and needs exp(r) there.  This fits 1 + c1 r + ... + c5 r^5 (c0 = 1 is kept, so
that exp(0) comes out 1 exactly) to exp(r) so that the largest *relative* error
over the interval is as small as it can be: least squares on 20000 Chebyshev
points, reweighted 500 times by each point's error (Lawson's algorithm), which
converges to the minimax fit.  It then rounds the coefficients to float32 and
evaluates the polynomial in float32 (Horner, as the kernel does) on 400001
points, and prints that error too.

Degree 5 is the lowest whose float32 error stays under 2 units in the last
place (measured: about 1.4 here; the whole vexp, reduction included, 1.75
units against expf, where the old Taylor polynomial of degree 7 gave 1.0);
tests/unit/test_kernel_paths.c holds every path to 4 units.  Each degree less
is one FMA less in every exponential of the softmax.

Usage: /usr/bin/python3 server/kernel/gen_exp_poly.py   (needs numpy: Debian's python3-numpy)
"""
import numpy as np

DEGREE = 5
HALF_LN2 = np.log(2) / 2


def fit(degree):
    """c1..c_degree of 1 + sum c_k r^k, minimax in relative error."""
    n = 20000
    r = np.cos(np.pi * (np.arange(n) + 0.5) / n) * HALF_LN2
    y = np.exp(r)
    powers = np.vander(r, degree, increasing=True) * r[:, None]  # r^1 .. r^degree
    w = np.full(n, 1.0 / n)
    for _ in range(500):
        sw = np.sqrt(w)
        c = np.linalg.lstsq(powers * (sw / y)[:, None], sw * (y - 1) / y, rcond=None)[0]
        err = np.abs(1 + powers @ c - y) / y
        w = w * err
        w /= w.sum()
    return c


def float32_error(c):
    """Largest relative error of the float32 polynomial, in units of FLT_EPSILON."""
    r = np.linspace(-HALF_LN2, HALF_LN2, 400001).astype(np.float32)
    p = np.full_like(r, c[-1])
    for ck in c[-2::-1]:
        p = (p * r + ck).astype(np.float32)
    p = (p * r + np.float32(1)).astype(np.float32)
    exact = np.exp(r.astype(np.float64))
    return np.max(np.abs(p.astype(np.float64) - exact) / exact) / np.finfo(np.float32).eps


def main():
    c = fit(DEGREE).astype(np.float32)
    print("/* degree %d, float32 error %.2f units in the last place */" % (DEGREE, float32_error(c)))
    print("#define EXP_POLY 1.0f, " + ", ".join(np.format_float_scientific(v, unique=True) + "f" for v in c))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prints the coefficients of the exponential's polynomials, EXP_POLY of each
precision in server/kernel/attention_fused_path.inc.

The kernel's vexp (attention_fused_impl.inc) reduces x to r in [-ln2/2, ln2/2]
and needs exp(r) there; its 2^x for the softmax takes the same coefficients
times ln(2)^k.  Both fits keep c0 = 1, so that exp(0) comes out 1 exactly.
Each degree less is one FMA less in every exponential of the softmax.

float32: 1 + c1 r + ... + c5 r^5, fitted so that the largest *relative* error
over the interval is as small as it can be: least squares on 20000 Chebyshev
points, reweighted 500 times by each point's error (Lawson's algorithm), which
converges to the minimax fit.  It then rounds the coefficients to float32 and
evaluates the polynomial in float32 (Horner, as the kernel does) on 400001
points, and prints that error too.  Degree 5 is the lowest whose float32 error
stays under 2 units in the last place (measured: about 1.4 here; the whole
vexp, reduction included, 1.75 units against expf, where the old Taylor
polynomial of degree 7 gave 1.0).

float64: float64's own arithmetic is too coarse to fit in, so this one is
computed with 40 digits (mpmath): the Chebyshev interpolant of degree 10 of
(exp(r) - 1) / r, near-minimax for a function this smooth, gives 1 + r q(r) of
degree 11.  It is checked as the kernel runs it: 2^r on [-1/2, 1/2] with the
coefficients times ln(2)^k rounded to double, Horner by FMAs (each step one
rounding).  Degree 11 comes to about 0.6 units against 1.5 for the Taylor
polynomial of degree 12 it replaced; degree 10 to about 3.

float64 on AVX-512 (EXP2_T16_POLY, EXP2_T16_TABLE): there 2^x is taken as
2^floor(m) 2^frac(m) 2^r with m = x rounded to sixteenths and |r| <= 1/32:
2^frac(m) from a table of the 16 values 2^(j/16) (two registers, one
vpermt2pd), 2^r by a polynomial fitted to 2^r itself (the same Chebyshev
construction, on [-1/32, 1/32]).  Degree 6 comes to about 1.3 units with the
product by the table entry (degree 5 to about 42): six FMAs and a product
where the polynomial on [-1/2, 1/2] takes eleven.

tests/unit/test_kernel_paths.c holds every path to 4 units in both precisions.

Usage: /usr/bin/python3 server/kernel/gen_exp_poly.py
(needs Debian's python3-numpy and python3-mpmath)
"""
import mpmath as mp
import numpy as np

DEGREE = 5
DEGREE64 = 11
DEGREE64_T16 = 6
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


def fit64(degree):
    """c0..c_degree of 1 + r q(r), q the Chebyshev interpolant of (exp(r) - 1) / r
    (degree coefficients: q of degree - 1)."""
    mp.mp.dps = 40
    half = mp.log(2) / 2
    q = mp.chebyfit(lambda r: mp.expm1(r) / r if r else mp.mpf(1), [-half, half], degree)
    return [1.0] + [float(x) for x in reversed(q)]


def float64_error(c, n=20001):
    """Largest relative error of the kernel's 2^r in double, in units of DBL_EPSILON."""
    mp.mp.dps = 40
    ln2 = mp.log(2)
    cs = [float(mp.mpf(ck) * ln2**k) for k, ck in enumerate(c)]
    worst = mp.mpf(0)
    for i in range(n):
        r = float(mp.mpf(-1) / 2 + mp.mpf(i) / (n - 1))
        p = cs[-1]
        for ck in cs[-2::-1]:
            p = float(mp.mpf(p) * r + ck)      # an FMA: the exact product, one rounding
        exact = mp.power(2, r)
        worst = max(worst, abs((p - exact) / exact))
    return float(worst) / np.finfo(np.float64).eps


def fit64_t16(degree):
    """c0..c_degree of 2^r = 1 + r q(r) on [-1/32, 1/32], q the Chebyshev interpolant of
    (2^r - 1) / r."""
    mp.mp.dps = 40
    h = mp.mpf(1) / 32
    q = mp.chebyfit(lambda r: mp.expm1(r * mp.log(2)) / r if r else mp.log(2), [-h, h], degree)
    return [1.0] + [float(x) for x in reversed(q)]


def table_t16():
    """2^(j/16) for j = 0..15, each rounded to double."""
    mp.mp.dps = 40
    return [float(mp.power(2, mp.mpf(j) / 16)) for j in range(16)]


def float64_t16_error(c, table, n=2001):
    """Largest relative error of 2^(j/16 + r) as the AVX-512 kernel forms it (Horner by
    FMAs, then one product by the table entry), in units of DBL_EPSILON."""
    mp.mp.dps = 40
    h = mp.mpf(1) / 32
    worst = mp.mpf(0)
    for i in range(n):
        r = float(-h + 2 * h * mp.mpf(i) / (n - 1))
        p = c[-1]
        for ck in c[-2::-1]:
            p = float(mp.mpf(p) * r + ck)
        for j, t in enumerate(table):
            exact = mp.power(2, mp.mpf(j) / 16 + r)
            worst = max(worst, abs((float(mp.mpf(p) * t) - exact) / exact))
    return float(worst) / np.finfo(np.float64).eps


def main():
    c = fit(DEGREE).astype(np.float32)
    print("/* degree %d, float32 error %.2f units in the last place */" % (DEGREE, float32_error(c)))
    print("#define EXP_POLY 1.0f, " + ", ".join(np.format_float_scientific(v, unique=True) + "f" for v in c))
    c64 = fit64(DEGREE64)
    print("/* degree %d, float64 error %.2f units in the last place */" % (DEGREE64, float64_error(c64)))
    print("#define EXP_POLY " + ", ".join(repr(v) for v in c64))
    c16, t16 = fit64_t16(DEGREE64_T16), table_t16()
    print("/* AVX-512: degree %d and a table of 16, float64 error %.2f units in the last place */"
          % (DEGREE64_T16, float64_t16_error(c16, t16)))
    print("#define EXP2_T16_POLY " + ", ".join(repr(v) for v in c16))
    print("#define EXP2_T16_TABLE " + ", ".join(v.hex() for v in t16))


if __name__ == "__main__":
    main()

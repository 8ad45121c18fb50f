/*
 * test_half.c - FP16 and BF16 conversions (core/half.h).
 *
 * Widening is checked on all 65,536 patterns of each format against the
 * value the format's definition gives (sign, exponent, fraction, by ldexp in
 * double), and narrowing on the cases where rounding goes wrong: ties, the
 * largest finite number and the first that rounds to Inf, subnormals, the
 * boundary between subnormal and normal, +-0 and NaN; then on random doubles
 * against the definition of round-to-nearest-even (no neighbour is nearer,
 * and a tie goes to the even pattern).
 */
#include "core/half.h"
#include "test.h"

/* An FP16 pattern's value by its definition. */
static double fp16_value(unsigned h)
{
    double sign = (h & 0x8000u) ? -1.0 : 1.0;
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 31)
        return m ? NAN : sign * INFINITY;
    return e == 0 ? sign * ldexp(m, -24) : sign * ldexp(1024 + m, (int)e - 25);
}

/* A BF16 pattern's value by its definition. */
static double bf16_value(unsigned b)
{
    double sign = (b & 0x8000u) ? -1.0 : 1.0;
    unsigned e = (b >> 7) & 0xffu, m = b & 0x7fu;
    if (e == 255)
        return m ? NAN : sign * INFINITY;
    return e == 0 ? sign * ldexp(m, -133) : sign * ldexp(128 + m, (int)e - 134);
}

void test_half_widen_every_pattern(void)
{
    for (unsigned p = 0; p < 65536; p++) {
        double want16 = fp16_value(p), wantb = bf16_value(p);
        double got16 = half_fp16_to_float((uint16_t)p), gotb = half_bf16_to_float((uint16_t)p);
        if (isnan(want16)) {
            ASSERT(isnan(got16));
            ASSERT(half_fp16_is_nonfinite((uint16_t)p));
        } else {
            if (got16 != want16 || signbit(got16) != signbit(want16))
                FAIL_AT("FP16 0x%04x: %.17g, want %.17g", p, got16, want16);
            ASSERT_EQ(half_fp16_is_nonfinite((uint16_t)p), isinf(want16) != 0);
            /* and back: every number is its own nearest */
            ASSERT_EQ(half_fp16_from_double(want16), p);
        }
        if (isnan(wantb)) {
            ASSERT(isnan(gotb));
            ASSERT(half_bf16_is_nonfinite((uint16_t)p));
        } else {
            if (gotb != wantb || signbit(gotb) != signbit(wantb))
                FAIL_AT("BF16 0x%04x: %.17g, want %.17g", p, gotb, wantb);
            ASSERT_EQ(half_bf16_is_nonfinite((uint16_t)p), isinf(wantb) != 0);
            ASSERT_EQ(half_bf16_from_double(wantb), p);
        }
    }
}

void test_half_round_edges(void)
{
    /* FP16 */
    ASSERT_EQ(half_fp16_from_double(0.0), 0x0000);
    ASSERT_EQ(half_fp16_from_double(-0.0), 0x8000);
    ASSERT_EQ(half_fp16_from_double(1.0 + 0x1p-11), 0x3c00);         /* tie: to even (1.0) */
    ASSERT_EQ(half_fp16_from_double(1.0 + 3 * 0x1p-11), 0x3c02);     /* tie: to even (up) */
    ASSERT_EQ(half_fp16_from_double(1.0 + 0x1p-11 + 0x1p-40), 0x3c01); /* past the tie */
    ASSERT_EQ(half_fp16_from_double(65504.0), 0x7bff);                /* largest finite */
    ASSERT_EQ(half_fp16_from_double(65519.99), 0x7bff);
    ASSERT_EQ(half_fp16_from_double(65520.0), 0x7c00);                /* tie past it: Inf */
    ASSERT_EQ(half_fp16_from_double(-1e6), 0xfc00);
    ASSERT_EQ(half_fp16_from_double(INFINITY), 0x7c00);
    ASSERT_EQ(half_fp16_from_double(0x1p-24), 0x0001);                /* least subnormal */
    ASSERT_EQ(half_fp16_from_double(0x1p-25), 0x0000);                /* tie: to even (0) */
    ASSERT_EQ(half_fp16_from_double(-0x1p-25), 0x8000);
    ASSERT_EQ(half_fp16_from_double(0x1p-25 + 0x1p-60), 0x0001);
    ASSERT_EQ(half_fp16_from_double(3 * 0x1p-25), 0x0002);            /* tie: to even (up) */
    ASSERT_EQ(half_fp16_from_double(0x3ffp-24), 0x03ff);              /* largest subnormal */
    ASSERT_EQ(half_fp16_from_double(0x3ffp-24 + 0x1p-25), 0x0400);    /* tie: up to normal */
    ASSERT_EQ(half_fp16_from_double(0x1p-14), 0x0400);                /* least normal */
    ASSERT_EQ(half_fp16_from_double(1e-300), 0x0000);
    ASSERT_EQ(half_fp16_from_double(4.9e-324), 0x0000);               /* a double subnormal */
    ASSERT(half_fp16_is_nonfinite(half_fp16_from_double(NAN)));
    ASSERT((half_fp16_from_double(NAN) & 0x3ff) != 0);
    /* BF16 */
    ASSERT_EQ(half_bf16_from_double(1.0 + 0x1p-8), 0x3f80);          /* tie: to even */
    ASSERT_EQ(half_bf16_from_double(1.0 + 3 * 0x1p-8), 0x3f82);
    ASSERT_EQ(half_bf16_from_double(0x1.fep127), 0x7f7f);             /* largest finite */
    ASSERT_EQ(half_bf16_from_double(0x1.ffp127), 0x7f80);             /* its tie: Inf */
    ASSERT_EQ(half_bf16_from_double(0x1.fefffffp127), 0x7f7f);
    ASSERT_EQ(half_bf16_from_double(3.4028234663852886e38), 0x7f80);  /* FLT_MAX: Inf */
    ASSERT_EQ(half_bf16_from_double(-0.0), 0x8000);
    ASSERT_EQ(half_bf16_from_double(0x1p-133), 0x0001);               /* least subnormal */
    ASSERT_EQ(half_bf16_from_double(0x1p-134), 0x0000);               /* tie: to even */
    ASSERT_EQ(half_bf16_from_double(0x7fp-133 + 0x1p-134), 0x0080);   /* up to normal */
    ASSERT_EQ(half_bf16_from_double(1e300), 0x7f80);
    ASSERT(half_bf16_is_nonfinite(half_bf16_from_double(-NAN)));
    ASSERT(half_bf16_from_double(-NAN) & 0x8000);
}

/* 1 when r is a nearest pattern to d under value(), ties to the even pattern. */
static int is_nearest_even(double d, unsigned r, double (*value)(unsigned))
{
    double v = value(r), err = fabs(d - v);
    if (isinf(v)) { /* Inf: d must be at or past the tie above the largest finite */
        double top = value(r - 1), below = value(r - 2);
        return fabs(d) >= fabs(top) + fabs(top - below) / 2;
    }
    for (int step = -1; step <= 1; step += 2) {
        unsigned n = (unsigned)((int)r + step) & 0xffffu;
        if ((n & 0x7fffu) == 0x7fffu || ((n ^ r) & 0x8000u)) /* past the sign or NaN */
            continue;
        double nv = value(n);
        if (isnan(nv) || isinf(nv))
            continue;
        double nerr = fabs(d - nv);
        if (nerr < err || (nerr == err && (r & 1)))
            return 0;
    }
    return 1;
}

void test_half_round_random(void)
{
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        /* exponents across both formats' ranges, every significand bit random */
        double d = ldexp(test_uniform(&state), (int)(test_next_bits(&state) % 300) - 150);
        unsigned h = half_fp16_from_double(d), b = half_bf16_from_double(d);
        if (!is_nearest_even(d, h, fp16_value))
            FAIL_AT("FP16 of %a: 0x%04x is not the nearest (even)", d, h);
        if (!is_nearest_even(d, b, bf16_value))
            FAIL_AT("BF16 of %a: 0x%04x is not the nearest (even)", d, b);
    }
}

/* The float forms give the double forms' result: on every tie between two
 * neighbouring 16-bit numbers and the floats on either side of it (all of the
 * places where rounding decides), on every float the 16-bit numbers are, and on
 * random floats of every exponent. */
void test_half_from_float_as_from_double(void)
{
    for (unsigned p = 0; p < 65536; p++) {
        for (int fmt = 0; fmt < 2; fmt++) {
            float a = fmt ? half_bf16_to_float((uint16_t)p) : half_fp16_to_float((uint16_t)p);
            float b = fmt ? half_bf16_to_float((uint16_t)(p + 1))
                          : half_fp16_to_float((uint16_t)(p + 1));
            if (isnan(a) || isinf(a) || ((p + 1) & 0x7fffu) == 0)
                continue;
            /* the tie (exact in float); past the largest finite, the tie below Inf */
            float below = fmt ? half_bf16_to_float((uint16_t)(p - 1))
                              : half_fp16_to_float((uint16_t)(p - 1));
            float mid = !isfinite(b) ? (float)((double)a + ((double)a - (double)below) / 2)
                                     : (float)(((double)a + (double)b) / 2);
            float tries[5] = {a, mid, nextafterf(mid, -INFINITY), nextafterf(mid, INFINITY),
                              -mid};
            for (int i = 0; i < 5; i++) {
                unsigned got = fmt ? half_bf16_from_float(tries[i]) : half_fp16_from_float(tries[i]);
                unsigned want = fmt ? half_bf16_from_double(tries[i])
                                    : half_fp16_from_double(tries[i]);
                if (got != want)
                    FAIL_AT("%s of %a: 0x%04x from float, 0x%04x from double",
                            fmt ? "BF16" : "FP16", (double)tries[i], got, want);
            }
        }
    }
    uint64_t state = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 1000000; i++) {
        uint32_t bits = (uint32_t)test_next_bits(&state);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (isnan(f)) {
            ASSERT(half_fp16_is_nonfinite(half_fp16_from_float(f)) &&
                   (half_fp16_from_float(f) & 0x3ff) != 0);
            ASSERT(half_bf16_is_nonfinite(half_bf16_from_float(f)) &&
                   (half_bf16_from_float(f) & 0x7f) != 0);
            continue;
        }
        if (half_fp16_from_float(f) != half_fp16_from_double(f))
            FAIL_AT("FP16 of %a: 0x%04x from float, 0x%04x from double", (double)f,
                    half_fp16_from_float(f), half_fp16_from_double(f));
        if (half_bf16_from_float(f) != half_bf16_from_double(f))
            FAIL_AT("BF16 of %a: 0x%04x from float, 0x%04x from double", (double)f,
                    half_bf16_from_float(f), half_bf16_from_double(f));
    }
    ASSERT_EQ(half_fp16_from_float(65520.0f), 0x7c00);
    ASSERT_EQ(half_fp16_from_float(65519.996f), 0x7bff);
    ASSERT_EQ(half_bf16_from_float(3.4028235e38f), 0x7f80);
    ASSERT_EQ(half_fp16_from_float(-0.0f), 0x8000);
    ASSERT_EQ(half_bf16_from_float(-0.0f), 0x8000);
    ASSERT_EQ(half_fp16_from_float(0x1p-25f), 0x0000);
    ASSERT_EQ(half_fp16_from_float(0x1.000002p-25f), 0x0001);
}

/*
 * numfmt.c - shortest decimal digits without a printf search (see numfmt.h).
 *
 * A finite nonzero double or float is v = c * 2^q with an integer significand
 * c.  The decimals that read back as v are those in its rounding interval:
 * between (c - 1/2) * 2^q and (c + 1/2) * 2^q, the lower end at
 * (c - 1/4) * 2^q when c is a power of two whose predecessor lies in the
 * binade below, both ends included when c is even (readers round ties to
 * even).  In units of 2^(q-2) the bounds and v are the integers
 * Nl = 4c - 2 (or 4c - 1), Nv = 4c and Nr = 4c + 2.
 *
 * With k = floor(log10(width of the interval)), scaling by 10^-k makes the
 * interval between 1 and 10 wide (X = N * 2^(q-2) * 10^-k for each N).  So it
 * holds at most one multiple of 10, and if it does, that one, stripped of its
 * trailing zeros, is the shortest decimal in it.  Otherwise the shortest are
 * integers at this scale, and the nearest to Xv are floor(Xv) and the next
 * one: the first of them inside wins, the nearer (ties to even) if both are.
 * That is four candidates, tried in order, for any double: no search.
 *
 * The scaling is one multiplication by g = ceil(10^-k * 2^r), a 128-bit
 * entry of a generated table (numfmt_pow10.inc), giving X' = N * g / 2^(r-q+2)
 * in 192 bits, the bounds as exact sums of that product and g.  Since g errs
 * upward by less than 1, X' - X lies in [0, N / 2^126), below 2^-71.  Of X'
 * numfmt reads the integer part and the top 62 fraction bits F: when
 * F != 0, X is certainly not an integer and floor(X) = floor(X'); when F is
 * 0, or (for v) F is exactly one half, an exact divisibility test (is
 * N * 2^(q-2-k) / 5^k an integer?) tells whether X is that integer or half.
 * Only a value whose X lies within 2^-62 of an integer without being one
 * would stay undecided; it goes to the printf search (none did in sweeps of
 * millions of values), as do the few subnormals with fewer than three
 * digits at this scale, so every answer is exact.  This is the idea of
 * Giulietti's Schubfach, with the decisions proved by an error bound and an
 * exact test instead of a table-wide analysis.
 */
#include "numfmt.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

#include "numfmt_pow10.inc"

#define FRAC_BITS 62
#define FRAC_MASK ((1ull << FRAC_BITS) - 1)
#define FRAC_HALF (1ull << (FRAC_BITS - 1))

static const char digit_pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Is n * 2^e2 / 5^k an integer (n > 0)?  The exact test behind the fast
 * path's undecided cases. */
static int scaled_is_integer(uint64_t n, int e2, int k)
{
    static const uint64_t pow5[24] = {1ull, 5ull, 25ull, 125ull, 625ull, 3125ull, 15625ull,
        78125ull, 390625ull, 1953125ull, 9765625ull, 48828125ull, 244140625ull, 1220703125ull,
        6103515625ull, 30517578125ull, 152587890625ull, 762939453125ull, 3814697265625ull,
        19073486328125ull, 95367431640625ull, 476837158203125ull, 2384185791015625ull,
        11920928955078125ull};
    if (k > 0 && (k >= 24 || n % pow5[k] != 0))
        return 0;
    return e2 + __builtin_ctzll(n) >= 0;
}

/* One scaled point: floor(X') and the top FRAC_BITS bits of its fraction. */
typedef struct scaled {
    uint64_t whole, frac;
} scaled;

static scaled scaled_from(u128 top, int shift)
{
    scaled s = {(uint64_t)(top >> shift), (uint64_t)(top >> (shift - FRAC_BITS)) & FRAC_MASK};
    return s;
}

/* Finds the shortest decimal digits * 10^exp10 in v's rounding interval,
 * v = c * 2^q (c > 0; irregular when the lower neighbour is a quarter, not a
 * half, unit away).  Returns 0, or -1 when the fast path cannot decide (the
 * caller then searches with printf); see the comment above. */
static int shortest_decimal(uint64_t c, int q, int irregular, uint64_t *digits, int *exp10)
{
    /* k = floor(log10(2^q)), or of 3/4 * 2^q when irregular: the generator and
     * tests/unit/test_numfmt.c check the formula for every q; >> of a negative
     * value is GCC's arithmetic shift, a floor */
    int k = (int)(((long long)q * NUMFMT_LOG10_2_Q41 -
                   (irregular ? NUMFMT_LOG10_4_3_Q41 : 0)) >> 41);
    assert(k >= NUMFMT_POW10_K_MIN && k <= NUMFMT_POW10_K_MAX);
    const struct numfmt_pow10 *p = &numfmt_pow10_table[k - NUMFMT_POW10_K_MIN];
    int shift = p->r - q + 2 - 64; /* binary point of the 192-bit product, within its top 128 */
    assert(shift >= FRAC_BITS && shift <= FRAC_BITS + 4); /* checked as k is */

    /* N * g as top * 2^64 + low, for Nv, then Nl = Nv - dl and Nr = Nv + 2 */
    uint64_t nv = c << 2;
    u128 a = (u128)nv * p->lo;
    u128 top_v = (u128)nv * p->hi + (a >> 64);
    uint64_t low_v = (uint64_t)a;
    uint64_t dl = irregular ? 1 : 2;
    u128 dg = (u128)p->lo * dl; /* dl * g = dg_top * 2^64 + dg_low */
    u128 dg_top = (u128)p->hi * dl + (dg >> 64);
    uint64_t dg_low = (uint64_t)dg;
    u128 top_l = top_v - dg_top - (low_v < dg_low);
    uint64_t ug_low = p->lo << 1; /* 2 * g */
    u128 ug_top = ((u128)p->hi << 1) + (p->lo >> 63);
    u128 top_r = top_v + ug_top + ((uint64_t)(low_v + ug_low) < low_v);

    scaled xv = scaled_from(top_v, shift);
    scaled xl = scaled_from(top_l, shift);
    scaled xr = scaled_from(top_r, shift);
    int e2 = q - 2 - k;
    int l_exact = 0, r_exact = 0, v_half = 0;
    if (xv.frac == 0 && !scaled_is_integer(nv, e2, k))
        return -1;
    if (xv.frac == FRAC_HALF) {
        if (!scaled_is_integer(nv, e2 + 1, k))
            return -1;
        v_half = 1;
    }
    if (xl.frac == 0 && !(l_exact = scaled_is_integer(nv - dl, e2, k)))
        return -1;
    if (xr.frac == 0 && !(r_exact = scaled_is_integer(nv + 2, e2, k)))
        return -1;

    uint64_t s = xv.whole;
    if (s < 100)
        return -1; /* a tiny subnormal: a multiple of 10 may tie in length */
    int inclusive = (c & 1) == 0;
    /* candidate x is inside when above the lower bound and below the upper */
#define ABOVE_LOWER(x) ((x) > xl.whole || ((x) == xl.whole && inclusive && l_exact))
#define BELOW_UPPER(x) ((x) < xr.whole || ((x) == xr.whole && (inclusive || !r_exact)))
    uint64_t tens = s - s % 10;
    uint64_t chosen;
    int e = k;
    if (ABOVE_LOWER(tens)) {
        chosen = tens / 10;
        e++;
    } else if (BELOW_UPPER(tens + 10)) {
        chosen = tens / 10 + 1;
        e++;
    } else {
        int s_in = ABOVE_LOWER(s), t_in = BELOW_UPPER(s + 1);
        if (s_in && t_in) {
            int up = xv.frac > FRAC_HALF || (v_half && (s & 1));
            chosen = up ? s + 1 : s;
        } else if (s_in || t_in) {
            chosen = s_in ? s : s + 1;
        } else {
            return -1; /* cannot happen: the interval is at least 1 wide */
        }
    }
#undef ABOVE_LOWER
#undef BELOW_UPPER
    while (chosen % 10 == 0) {
        chosen /= 10;
        e++;
    }
    *digits = chosen;
    *exp10 = e;
    return 0;
}

/* Writes digits in decimal into out (NUL-terminated); returns the count. */
static int digits_text(uint64_t digits, char *out)
{
    char buf[24];
    char *end = buf + sizeof buf, *d = end;
    /* right to left, two digits a step, in 32-bit arithmetic past 10^8 */
    while (digits >= 100000000) {
        uint32_t eight = (uint32_t)(digits % 100000000);
        digits /= 100000000;
        for (int i = 0; i < 4; i++) {
            d -= 2;
            memcpy(d, digit_pairs + 2 * (eight % 100), 2);
            eight /= 100;
        }
    }
    uint32_t rest = (uint32_t)digits;
    while (rest >= 100) {
        d -= 2;
        memcpy(d, digit_pairs + 2 * (rest % 100), 2);
        rest /= 100;
    }
    if (rest >= 10) {
        d -= 2;
        memcpy(d, digit_pairs + 2 * rest, 2);
    } else {
        *--d = (char)('0' + rest);
    }
    int n = (int)(end - d);
    memcpy(out, d, (size_t)n);
    out[n] = '\0';
    return n;
}

/* The slow path: the fewest digits whose printf rounding reads back to v
 * (as a float when as_float), as an integer and its exponent. */
static void shortest_printf(double v, int as_float, uint64_t *digits, int *exp10)
{
    int max_digits = as_float ? 9 : 17;
    char text[40];
    for (int n = 1;; n++) {
        snprintf(text, sizeof text, "%.*e", n - 1, fabs(v));
        if (n == max_digits ||
            (as_float ? strtof(text, NULL) == (float)fabs(v) : strtod(text, NULL) == fabs(v)))
            break;
    }
    /* text is d[.ddd]e<sign><exponent> */
    uint64_t d = 0;
    int count = 0;
    char *p = text;
    for (; *p != 'e'; p++)
        if (*p != '.') {
            d = d * 10 + (uint64_t)(*p - '0');
            count++;
        }
    int e = atoi(p + 1) - (count - 1);
    while (d % 10 == 0) {
        d /= 10;
        e++;
    }
    *digits = d;
    *exp10 = e;
}

/* The digits of a finite nonzero v = c * 2^q, fast path first. */
static int shortest_text(double v, uint64_t c, int q, int irregular, int as_float, char *out,
                         int *exp10)
{
    uint64_t digits;
    int e;
    if (shortest_decimal(c, q, irregular, &digits, &e) != 0)
        shortest_printf(v, as_float, &digits, &e);
    *exp10 = e;
    return digits_text(digits, out);
}

int numfmt_double(double v, char digits[NUMFMT_DIGITS_MAX + 1], int *exp10)
{
    if (!isfinite(v))
        return -1;
    if (v == 0) {
        *exp10 = 0;
        return digits_text(0, digits);
    }
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    int biased = (int)((bits >> 52) & 0x7FF);
    uint64_t fraction = bits & ((1ull << 52) - 1);
    if (biased == 0)
        return shortest_text(v, fraction, -1074, 0, 0, digits, exp10);
    return shortest_text(v, fraction | (1ull << 52), biased - 1075, fraction == 0 && biased > 1,
                         0, digits, exp10);
}

int numfmt_float(float v, char digits[NUMFMT_DIGITS_MAX + 1], int *exp10)
{
    if (!isfinite(v))
        return -1;
    if (v == 0) {
        *exp10 = 0;
        return digits_text(0, digits);
    }
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    int biased = (int)((bits >> 23) & 0xFF);
    uint32_t fraction = bits & ((1u << 23) - 1);
    if (biased == 0)
        return shortest_text((double)v, fraction, -149, 0, 1, digits, exp10);
    return shortest_text((double)v, fraction | (1u << 23), biased - 150,
                         fraction == 0 && biased > 1, 1, digits, exp10);
}

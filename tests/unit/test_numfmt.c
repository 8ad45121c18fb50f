/*
 * test_numfmt.c - numfmt's shortest digits against a reference built on
 * printf and strtod/strtof, and its table of powers of ten against the
 * definition it is generated from.
 *
 * The reference finds the fewest digits n for which some n-digit decimal
 * reads back to the value: for each n it asks printf for the nearest n-digit
 * decimal (%.{n-1}e, correctly rounded, ties to even) and tries it and its
 * two n-digit neighbours, since only those can be the nearest one inside the
 * rounding interval on either side of the value (a neighbour wins only where
 * the interval is lopsided, below a power of two).  A binary search over n
 * works because a decimal with n digits also has n + 1.  numfmt's digits and
 * exponent must be that decimal's, and read back bit for bit.  The random
 * tests run a few hundred thousand values (the suite also runs under ASan
 * and valgrind); NUMFMT_SWEEP=N runs N values of each kind instead.
 *
 * The table check recomputes every entry of server/json/numfmt_pow10.inc with
 * exact big-integer arithmetic, as server/json/gen_numfmt_pow10.py defines it,
 * and repeats the generator's checks of the facts numfmt.c relies on, so the
 * table and its generator cannot drift apart unnoticed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/numfmt.h"
#include "test.h"

#include "json/numfmt_pow10.inc"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_bits(void)
{
    return test_next_bits(&rng_state);
}

/* Values per random test: dflt, or NUMFMT_SWEEP when set. */
static long sweep_count(long dflt)
{
    const char *text = getenv("NUMFMT_SWEEP");
    long n = text != NULL ? strtol(text, NULL, 10) : 0;
    return n > 0 ? n : dflt;
}

static int reads_back(const char *text, double a, int as_float)
{
    return as_float ? strtof(text, NULL) == (float)a : strtod(text, NULL) == a;
}

/* Is some n-digit decimal read back as a (positive)?  If so, the one nearest
 * a in *mant * 10^*unit. */
static int decimal_with_digits(double a, int as_float, int n, uint64_t *mant, int *unit)
{
    char text[48];
    snprintf(text, sizeof text, "%.*e", n - 1, a);
    uint64_t m = 0;
    char *p = text;
    for (; *p != 'e'; p++)
        if (*p != '.')
            m = m * 10 + (uint64_t)(*p - '0');
    int u = atoi(p + 1) - (n - 1);
    uint64_t low = 1;
    for (int i = 1; i < n; i++)
        low *= 10;
    uint64_t cand[3] = {m, m == low ? low * 10 - 1 : m - 1, m + 1};
    int cand_unit[3] = {u, m == low ? u - 1 : u, u};
    for (int i = 0; i < 3; i++) {
        snprintf(text, sizeof text, "%llue%d", (unsigned long long)cand[i], cand_unit[i]);
        if (reads_back(text, a, as_float)) {
            *mant = cand[i];
            *unit = cand_unit[i];
            return 1;
        }
    }
    return 0;
}

/* The reference digits of a finite nonzero a > 0 (a float value when
 * as_float), without trailing zeros.  Returns 0, or -1 when none is found. */
static int reference_digits(double a, int as_float, uint64_t *mant, int *unit)
{
    int lo = 1, hi = as_float ? 9 : 17;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (decimal_with_digits(a, as_float, mid, mant, unit))
            hi = mid;
        else
            lo = mid + 1;
    }
    if (!decimal_with_digits(a, as_float, lo, mant, unit))
        return -1;
    while (*mant % 10 == 0) {
        *mant /= 10;
        (*unit)++;
    }
    return 0;
}

/* Checks numfmt's answer for v (as a float when as_float) against the
 * reference and its read-back.  Prints and returns -1 on failure. */
static int check_digits(double v, int as_float)
{
    if (as_float)
        v = (double)(float)v;
    char digits[NUMFMT_DIGITS_MAX + 1];
    int exp10 = 12345;
    memset(digits, 'x', sizeof digits);
    int n = as_float ? numfmt_float((float)v, digits, &exp10) : numfmt_double(v, digits, &exp10);
    int ok;
    uint64_t mant = 0;
    int unit = 0;
    if (!isfinite(v)) {
        ok = n == -1 && exp10 == 12345;
    } else if (v == 0) {
        ok = n == 1 && strcmp(digits, "0") == 0 && exp10 == 0;
    } else {
        ok = reference_digits(fabs(v), as_float, &mant, &unit) == 0 && n >= 1 &&
             n <= (as_float ? 9 : 17) && (size_t)n == strnlen(digits, sizeof digits) &&
             digits[0] != '0' && digits[n - 1] != '0' &&
             strtoull(digits, NULL, 10) == mant && exp10 == unit;
        if (ok) {
            char text[48];
            snprintf(text, sizeof text, "%se%d", digits, exp10);
            double back = as_float ? (double)strtof(text, NULL) : strtod(text, NULL);
            double a = fabs(v);
            ok = memcmp(&back, &a, sizeof a) == 0;
        }
    }
    if (!ok)
        fprintf(stderr, "  %s %.17g (%a): numfmt gave %d digits \"%.*s\" e%d, reference %llue%d\n",
                as_float ? "float" : "double", v, v, n, n > 0 ? n : 0, digits, exp10,
                (unsigned long long)mant, unit);
    return ok ? 0 : -1;
}

#define CHECK(v, as_float)                                                  \
    do {                                                                    \
        if (check_digits((v), (as_float)) != 0)                             \
            FAIL_AT("numfmt disagrees with the reference");                 \
    } while (0)

void test_numfmt_double_random_bits(void)
{
    long count = sweep_count(40000);
    for (long i = 0; i < count; i++) {
        uint64_t bits = next_bits();
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v))
            continue;
        if (check_digits(v, 0) != 0)
            FAIL_AT("numfmt_double disagrees with the reference after %ld values", i);
    }
}

void test_numfmt_float_random_bits(void)
{
    long count = sweep_count(50000);
    for (long i = 0; i < count; i++) {
        uint32_t bits = (uint32_t)(next_bits() >> 32);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f))
            continue;
        if (check_digits((double)f, 1) != 0)
            FAIL_AT("numfmt_float disagrees with the reference after %ld values", i);
    }
}

/* What attention answers hold: weights in [0, 1], tiny ones from peaked
 * softmax rows (down to double's and float's subnormals), and outputs of
 * either sign around 1. */
void test_numfmt_attention_like_values(void)
{
    long count = sweep_count(20000);
    for (long i = 0; i < count; i++) {
        double u = (double)(next_bits() >> 11) / 9007199254740992.0;
        double v;
        switch (i % 4) {
        case 0: v = u; break;
        case 1: v = exp(-u * 745.0); break;
        case 2: v = exp(-u * 104.0); break;
        default: v = (u - 0.5) * 8.0;
        }
        CHECK(v, 0);
        CHECK(v, 1);
    }
}

/* Checks v, its neighbours and their negatives, as a double and a float. */
static int check_around(double v)
{
    double d[3] = {v, nextafter(v, 0), nextafter(v, INFINITY)};
    float f = (float)v;
    float fl[3] = {f, nextafterf(f, 0), nextafterf(f, INFINITY)};
    for (int i = 0; i < 3; i++)
        if (check_digits(d[i], 0) != 0 || check_digits(-d[i], 0) != 0 ||
            check_digits((double)fl[i], 1) != 0 || check_digits(-(double)fl[i], 1) != 0)
            return -1;
    return 0;
}

/* Powers of two (where the rounding interval is lopsided) and of ten, the
 * extremes, subnormals around the fast path's lower edge, values just below
 * 1, integers, zero and the non-finite values. */
void test_numfmt_edge_values(void)
{
    for (int e = -1074; e <= 1023; e++)
        if (check_around(ldexp(1.0, e)) != 0)
            FAIL_AT("around 2^%d", e);
    for (int e = -323; e <= 308; e++) {
        char text[16];
        snprintf(text, sizeof text, "1e%d", e);
        if (check_around(strtod(text, NULL)) != 0 || check_around(strtof(text, NULL)) != 0)
            FAIL_AT("around %s", text);
    }
    double extremes[] = {DBL_MIN, DBL_TRUE_MIN, DBL_MAX, FLT_MIN, FLT_TRUE_MIN, FLT_MAX,
                         nextafter(DBL_MIN, 0), (double)nextafterf(FLT_MIN, 0), 0.1, 0.2, 0.3,
                         1.0 / 3.0, 2.0 / 3.0, 3.141592653589793, 2.718281828459045,
                         9007199254740993.0, 16777217.0};
    for (size_t i = 0; i < sizeof extremes / sizeof extremes[0]; i++)
        if (check_around(extremes[i]) != 0)
            FAIL_AT("around %a", extremes[i]);
    for (int c = 1; c <= 400; c++) {
        CHECK(ldexp(c, -1074), 0);
        CHECK(ldexp(c, -149), 1);
    }
    for (int i = 1; i <= 2000; i++) {
        CHECK(1.0 - ldexp(i, -53), 0);
        CHECK(1.0 - ldexp(i, -24), 1);
        CHECK((double)i, 0);
        CHECK((double)i, 1);
        CHECK(i / 1000.0, 0);
        CHECK(i / 1000.0, 1);
        CHECK(ldexp(1.0, 53) + i, 0);
        CHECK(ldexp(1.0, 24) + i, 1);
    }
    double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        CHECK(specials[i], 0);
        CHECK(specials[i], 1);
    }
}

/* Exact ties between the two nearest shortest decimals (c odd times 2^-2
 * gives a value ending in .25 or .75 where 17 or 9 digits are needed): the
 * even one wins. */
void test_numfmt_ties_to_even(void)
{
    for (int i = 0; i < 2000; i++) {
        CHECK(ldexp((double)((1ull << 52) + 2 * (uint64_t)i + 1), -2), 0);
        CHECK(ldexp((double)((1u << 23) + 2 * (unsigned)i + 1), -2), 1);
    }
    struct {
        double v;
        int as_float;
        const char *digits;
        int exp10;
    } cases[] = {
        {1125899906842624.25, 0, "11258999068426242", -1},
        {1125899906842624.75, 0, "11258999068426248", -1},
        {2097152.25, 1, "20971522", -1},
        {2097152.75, 1, "20971528", -1},
        {0.1, 0, "1", -1}, {0.1f, 1, "1", -1}, {100.0, 0, "1", 2}, {5e-324, 0, "5", -324},
        {DBL_MAX, 0, "17976931348623157", 292}, {FLT_TRUE_MIN, 1, "1", -45},
        {-2.5e-300, 0, "25", -301}, {0.30000000000000004, 0, "30000000000000004", -17},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char digits[NUMFMT_DIGITS_MAX + 1];
        int exp10;
        int n = cases[i].as_float ? numfmt_float((float)cases[i].v, digits, &exp10)
                                  : numfmt_double(cases[i].v, digits, &exp10);
        ASSERT_EQ(n, (long long)strlen(cases[i].digits));
        ASSERT_STR_EQ(digits, cases[i].digits);
        ASSERT_EQ(exp10, cases[i].exp10);
    }
}

/*
 * Exact arithmetic for the table check: unsigned integers of BIG_LIMBS
 * 32-bit limbs, least significant first, enough for 10^324 * 2^1074 and
 * for 2^128 * 10^292 with room to spare.  An operation that would overflow
 * sets big_overflow, which fails the test.
 */
#define BIG_LIMBS 80

typedef struct big {
    uint32_t l[BIG_LIMBS];
} big;

static int big_overflow;

static void big_mul_small(big *a, uint32_t m)
{
    uint64_t carry = 0;
    for (int i = 0; i < BIG_LIMBS; i++) {
        uint64_t t = (uint64_t)a->l[i] * m + carry;
        a->l[i] = (uint32_t)t;
        carry = t >> 32;
    }
    if (carry != 0)
        big_overflow = 1;
}

/* a * 2^bits, bits >= 0. */
static void big_shl(big *a, int bits)
{
    int words = bits / 32, rest = bits % 32;
    for (int i = BIG_LIMBS - words; i < BIG_LIMBS; i++)
        if (a->l[i] != 0)
            big_overflow = 1;
    if (words > 0) {
        memmove(a->l + words, a->l, (size_t)(BIG_LIMBS - words) * sizeof a->l[0]);
        memset(a->l, 0, (size_t)words * sizeof a->l[0]);
    }
    if (rest == 0)
        return;
    if (a->l[BIG_LIMBS - 1] >> (32 - rest))
        big_overflow = 1;
    for (int i = BIG_LIMBS - 1; i > 0; i--)
        a->l[i] = (a->l[i] << rest) | (a->l[i - 1] >> (32 - rest));
    a->l[0] <<= rest;
}

/* c (a 128-bit integer) * 10^p10 * 2^p2, with p10, p2 >= 0. */
static big big_term(unsigned __int128 c, int p10, int p2)
{
    big a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < 4; i++)
        a.l[i] = (uint32_t)(c >> (32 * i));
    for (; p10 >= 9; p10 -= 9)
        big_mul_small(&a, 1000000000u);
    for (; p10 > 0; p10--)
        big_mul_small(&a, 10);
    big_shl(&a, p2);
    return a;
}

static int big_cmp(const big *a, const big *b)
{
    for (int i = BIG_LIMBS - 1; i >= 0; i--)
        if (a->l[i] != b->l[i])
            return a->l[i] < b->l[i] ? -1 : 1;
    return 0;
}

/* Compares c1 * 10^e10 * 2^e2 with c2 * 10^f10 * 2^f2 (any signs of the
 * exponents) exactly, by moving negative powers to the other side. */
static int exact_cmp(unsigned __int128 c1, int e10, int e2, unsigned __int128 c2, int f10, int f2)
{
    int d10 = e10 - f10, d2 = e2 - f2;
    big a = big_term(c1, d10 > 0 ? d10 : 0, d2 > 0 ? d2 : 0);
    big b = big_term(c2, d10 < 0 ? -d10 : 0, d2 < 0 ? -d2 : 0);
    return big_cmp(&a, &b);
}

/* Every entry is g(k) = ceil(10^-k * 2^r) with 10^-k * 2^r in [2^127,
 * 2^128), as server/json/gen_numfmt_pow10.py defines it. */
void test_numfmt_pow10_table_matches_definition(void)
{
    typedef unsigned __int128 u128;
    big_overflow = 0;
    size_t entries = sizeof numfmt_pow10_table / sizeof numfmt_pow10_table[0];
    ASSERT_EQ(entries, NUMFMT_POW10_K_MAX - NUMFMT_POW10_K_MIN + 1);
    for (int k = NUMFMT_POW10_K_MIN; k <= NUMFMT_POW10_K_MAX; k++) {
        const struct numfmt_pow10 *e = &numfmt_pow10_table[k - NUMFMT_POW10_K_MIN];
        u128 g = ((u128)e->hi << 64) | e->lo;
        /* x = 10^-k * 2^r in [2^127, 2^128) */
        int in_range = exact_cmp(1, -k, e->r, 1, 0, 127) >= 0 &&
                       exact_cmp(1, -k, e->r, 1, 0, 128) < 0;
        /* g - 1 < x <= g */
        int ceiling = g > 0 && exact_cmp(g - 1, 0, 0, 1, -k, e->r) < 0 &&
                      exact_cmp(1, -k, e->r, g, 0, 0) <= 0;
        if (!in_range || !ceiling || big_overflow)
            FAIL_AT("entry k = %d {0x%016llx, 0x%016llx, %d}: in range %d, ceiling %d, "
                    "overflow %d", k, (unsigned long long)e->hi, (unsigned long long)e->lo, e->r,
                    in_range, ceiling, big_overflow);
    }
}

/* numfmt.c computes k = floor(log10(width)) of a double's rounding interval
 * (2^q, or 3/4 * 2^q below a power of two) with this integer formula, and
 * needs the product's binary point 126 to 130 bits up; both for every q. */
void test_numfmt_pow10_exponent_formula(void)
{
    big_overflow = 0;
    for (int q = -1074; q <= 971; q++)
        for (int irregular = 0; irregular < 2; irregular++) {
            int k = (int)(((long long)q * NUMFMT_LOG10_2_Q41 -
                           (irregular ? NUMFMT_LOG10_4_3_Q41 : 0)) >> 41);
            if (k < NUMFMT_POW10_K_MIN || k > NUMFMT_POW10_K_MAX)
                FAIL_AT("q %d irregular %d: k = %d is outside the table", q, irregular, k);
            /* 10^k <= width < 10^(k+1), width = m/4 * 2^q */
            unsigned m = irregular ? 3 : 4;
            int floor_ok = exact_cmp(4, k, 0, m, 0, q) <= 0 && exact_cmp(m, 0, q, 4, k + 1, 0) < 0;
            if (!floor_ok || big_overflow)
                FAIL_AT("q %d irregular %d: k = %d is not floor(log10(width))", q, irregular, k);
            int shift = numfmt_pow10_table[k - NUMFMT_POW10_K_MIN].r - q + 2;
            if (shift < 126 || shift > 130)
                FAIL_AT("q %d: the binary point is %d bits up", q, shift);
        }
}

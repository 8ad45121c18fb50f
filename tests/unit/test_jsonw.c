/*
 * test_jsonw.c - the JSON writer's text for numbers: jw_double and jw_float
 * against a reference laid out with sprintf and checked against printf.
 *
 * The digits come from numfmt (tests/unit/test_numfmt.c checks them against
 * a printf and strtod search); here the reference writes those digits as
 * printf's %g would with precision max(n, 15) (doubles) or max(n, 6)
 * (floats), and wherever printf's own %g text of a normal number reads back
 * to the value, the test checks that the reference equals it, character for
 * character.  Every writer's text must equal the reference, read back bit
 * for bit with strtod (strtof for floats), and, for a sample, with jansson.
 * JSONW_SWEEP=N runs N values of each random kind instead of the default.
 */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/jsonw.h"
#include "core/mem.h"
#include "json/numfmt.h"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_bits(void)
{
    return test_next_bits(&rng_state);
}

/* Values per random test: dflt, or JSONW_SWEEP when set. */
static long sweep_count(long dflt)
{
    const char *text = getenv("JSONW_SWEEP");
    long n = text != NULL ? strtol(text, NULL, 10) : 0;
    return n > 0 ? n : dflt;
}

/* Writes the reference text of v (a float value when as_float) into out (64
 * bytes).  Returns 0, or -1 when the layout disagrees with printf. */
static int reference_text(double v, int as_float, char *out)
{
    if (!isfinite(v)) {
        strcpy(out, "null");
        return 0;
    }
    if (v == 0) {
        strcpy(out, signbit(v) ? "-0.0" : "0");
        return 0;
    }
    char digits[NUMFMT_DIGITS_MAX + 1];
    int unit;
    int n = as_float ? numfmt_float((float)v, digits, &unit) : numfmt_double(v, digits, &unit);
    if (n < 1 || (size_t)n != strlen(digits))
        return -1;
    int sci = unit + n - 1;
    int min_precision = as_float ? 6 : 15;
    int precision = n > min_precision ? n : min_precision;
    char *o = out;
    if (signbit(v))
        *o++ = '-';
    if (sci < -4 || sci >= precision) {
        o += sprintf(o, "%c%s%se%c%02d", digits[0], n > 1 ? "." : "", digits + 1,
                     sci < 0 ? '-' : '+', abs(sci));
    } else if (sci >= 0) {
        for (int i = 0; i < n || i <= sci; i++) {
            if (i == sci + 1)
                *o++ = '.';
            *o++ = i < n ? digits[i] : '0';
        }
        *o = '\0';
    } else {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -sci - 1; i++)
            *o++ = '0';
        strcpy(o, digits);
    }
    /* printf's %g rounds to the nearest decimal of that precision; when that
     * one reads back, it is the shortest nearest one (for a normal number at
     * least 15 or 6 digits fit in no rounding interval twice), so the texts
     * must agree. */
    double a = fabs(v);
    int normal = as_float ? fabsf((float)a) >= FLT_MIN : a >= DBL_MIN;
    char printed[64];
    snprintf(printed, sizeof printed, "%.*g", precision, v);
    double back = as_float ? (double)strtof(printed, NULL) : strtod(printed, NULL);
    if (normal && back == v && strcmp(printed, out) != 0) {
        fprintf(stderr, "  reference layout: %s, printf: %s\n", out, printed);
        return -1;
    }
    return 0;
}

/* Checks one value's text against the reference and its read-back; with
 * with_jansson, also through json_loads.  Prints and returns -1 on failure. */
static int check_value(double v, int as_float, int with_jansson)
{
    if (as_float)
        v = (double)(float)v;
    jw_buf w;
    jw_init(&w, 0);
    if (as_float)
        jw_float(&w, v);
    else
        jw_double(&w, v);
    size_t len;
    char *text = jw_finish(&w, &len);
    char ref[64];
    int ok = text != NULL && reference_text(v, as_float, ref) == 0 && strcmp(text, ref) == 0;
    if (ok && isfinite(v)) {
        double back = as_float ? (double)strtof(text, NULL) : strtod(text, NULL);
        ok = memcmp(&back, &v, sizeof v) == 0;
        if (ok && with_jansson) {
            json_error_t error;
            json_t *value = json_loadb(text, len, JSON_DECODE_ANY, &error);
            double got = json_number_value(value);
            ok = value != NULL && (as_float ? (float)got == (float)v : got == v) &&
                 signbit(got) == signbit(v);
            json_decref(value);
        }
    }
    if (!ok)
        fprintf(stderr, "  %s %.17g (%a): wrote %s, reference %s\n", as_float ? "float" : "double",
                v, v, text ? text : "(null)", ref);
    mem_free(text);
    return ok ? 0 : -1;
}

#define CHECK(v, as_float)                                                  \
    do {                                                                    \
        if (check_value((v), (as_float), 0) != 0)                           \
            FAIL_AT("jsonw disagrees with the reference");                  \
    } while (0)

void test_jsonw_double_random_bits(void)
{
    long count = sweep_count(10000);
    for (long i = 0; i < count; i++) {
        uint64_t bits = next_bits();
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v))
            continue;
        if (check_value(v, 0, i % 16 == 0) != 0)
            FAIL_AT("jw_double disagrees with the reference after %ld values", i);
    }
}

void test_jsonw_float_random_bits(void)
{
    long count = sweep_count(10000);
    for (long i = 0; i < count; i++) {
        uint32_t bits = (uint32_t)(next_bits() >> 32);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f))
            continue;
        if (check_value((double)f, 1, i % 16 == 0) != 0)
            FAIL_AT("jw_float disagrees with the reference after %ld values", i);
    }
}

/* What attention answers hold: weights in [0, 1], tiny ones from peaked
 * softmax rows (down to double's and float's subnormals), and outputs of
 * either sign around 1. */
void test_jsonw_attention_like_values(void)
{
    long count = sweep_count(5000);
    for (long i = 0; i < count; i++) {
        double u = (double)(next_bits() >> 11) / 9007199254740992.0;
        double v;
        switch (i % 4) {
        case 0: v = u; break;
        case 1: v = exp(-u * 745.0); break;
        case 2: v = exp(-u * 104.0); break;
        default: v = (u - 0.5) * 8.0;
        }
        if (check_value(v, 0, 0) != 0)
            FAIL_AT("jw_double disagrees with the reference");
        if (check_value(v, 1, 0) != 0)
            FAIL_AT("jw_float disagrees with the reference");
    }
}

/* Checks v, its neighbours and their negatives, as a double and a float. */
static int check_around(double v)
{
    double d[4] = {v, nextafter(v, 0), nextafter(v, INFINITY), 0};
    float f = (float)v;
    float fl[3] = {f, nextafterf(f, 0), nextafterf(f, INFINITY)};
    for (int i = 0; i < 3; i++)
        if (check_value(d[i], 0, 1) != 0 || check_value(-d[i], 0, 0) != 0 ||
            check_value((double)fl[i], 1, 1) != 0 || check_value(-(double)fl[i], 1, 0) != 0)
            return -1;
    return 0;
}

/* Powers of two (where the rounding interval is lopsided) and of ten, the
 * extremes, subnormals around the fast path's lower edge, values just below
 * 1, integers, and the places where the text switches to exponent form. */
void test_jsonw_edge_values(void)
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
                         1.0 / 3.0, 2.0 / 3.0, 3.141592653589793, 2.718281828459045, 9007199254740993.0, 16777217.0};
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
}

/* Exact ties between the two nearest shortest decimals (c odd times 2^-2
 * gives a value ending in .25 or .75 where 17 or 9 digits are needed), and
 * the text in each form. */
void test_jsonw_ties_and_format(void)
{
    for (int i = 0; i < 2000; i++) {
        CHECK(ldexp((double)((1ull << 52) + 2 * (uint64_t)i + 1), -2), 0);
        CHECK(ldexp((double)((1u << 23) + 2 * (unsigned)i + 1), -2), 1);
    }
    struct {
        double v;
        int as_float;
        const char *text;
    } cases[] = {
        {1125899906842624.25, 0, "1125899906842624.2"},
        {1125899906842624.75, 0, "1125899906842624.8"},
        {2097152.25, 1, "2097152.2"},
        {2097152.75, 1, "2097152.8"},
        {0.1, 0, "0.1"}, {0.1f, 1, "0.1"}, {1.0, 0, "1"}, {2.0, 1, "2"}, {100.0, 0, "100"},
        {0.0001, 0, "0.0001"}, {0.00001, 0, "1e-05"}, {1.5e-5, 1, "1.5e-05"},
        {1e14, 0, "100000000000000"}, {1e15, 0, "1e+15"}, {1234567890123456.0, 0, "1234567890123456"},
        {1e5, 1, "100000"}, {1e6, 1, "1e+06"}, {1234567.0, 1, "1234567"},
        {1.5e300, 0, "1.5e+300"}, {-2.5e-300, 0, "-2.5e-300"}, {5e-324, 0, "5e-324"},
        {DBL_MAX, 0, "1.7976931348623157e+308"}, {DBL_MIN, 0, "2.2250738585072014e-308"},
        {FLT_MAX, 1, "3.4028235e+38"}, {FLT_MIN, 1, "1.1754944e-38"}, {FLT_TRUE_MIN, 1, "1e-45"},
        {0.30000000000000004, 0, "0.30000000000000004"}, {1e-30, 1, "1e-30"},
        {-0.0, 0, "-0.0"}, {-0.0, 1, "-0.0"}, {0.0, 0, "0"}, {0.0, 1, "0"},
        {INFINITY, 0, "null"}, {NAN, 1, "null"}, {1e300, 1, "null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jw_buf w;
        jw_init(&w, 0);
        if (cases[i].as_float)
            jw_float(&w, cases[i].v);
        else
            jw_double(&w, cases[i].v);
        char *text = jw_finish(&w, NULL);
        int same = text != NULL && strcmp(text, cases[i].text) == 0;
        if (!same) {
            fprintf(stderr, "  %.17g: %s, expected %s\n", cases[i].v, text ? text : "(null)",
                    cases[i].text);
            mem_free(text);
            FAIL_AT("case %zu", i);
        }
        mem_free(text);
        if (check_value(cases[i].v, cases[i].as_float, 1) != 0)
            FAIL_AT("case %zu against the reference", i);
    }
}

/* A generator of its own for the printf comparison, so that its inputs do not
 * depend on the other tests. */
static uint64_t printf_rng_state = 0x9E3779B97F4A7C15ull;

void test_jsonw_numbers_round_trip(void)
{
    double values[] = {0.1, 1.0 / 3.0, -2.5e-300, 1e300, 123456789.0, 0.0, -0.0,
                       5e-324, 1.7976931348623157e308, 0.30000000000000004};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        jw_buf w;
        jw_init(&w, 0);
        jw_double(&w, values[i]);
        size_t len;
        char *text = jw_finish(&w, &len);
        ASSERT(text != NULL);
        double back = strtod(text, NULL);
        int same = memcmp(&back, &values[i], sizeof back) == 0 || (back == 0 && values[i] == 0);
        if (!same) {
            mem_free(text);
            FAIL_AT("%.17g printed as %s", values[i], text);
        }
        mem_free(text);
    }
    jw_buf w;
    jw_init(&w, 0);
    jw_double(&w, 0.1);
    jw_char(&w, ' ');
    jw_float(&w, (double)0.1f);
    char *text = jw_finish(&w, NULL);
    ASSERT_STR_EQ(text, "0.1 0.1");
    mem_free(text);
}

/* The printf search jw_double must agree with: fewest of 15-17 digits. */
static int printf_shortest(double v, char *text)
{
    int n = 0;
    for (int digits = 15; digits <= 17; digits++) {
        n = snprintf(text, 40, "%.*g", digits, v);
        if (strtod(text, NULL) == v)
            break;
    }
    return n;
}

void test_jsonw_matches_printf_shortest(void)
{
    /* Random bit patterns, values in [0, 1) like attention weights, short
     * decimals, and powers of ten across the fast path's edges. */
    for (long i = 0; i < 300000; i++) {
        double v;
        uint64_t b = (uint64_t)(test_uniform(&printf_rng_state) * 4e18) ^ ((uint64_t)i << 40);
        switch (i % 4) {
        case 0: v = (test_uniform(&printf_rng_state) + 2.0) / 4.0; break;
        case 1: memcpy(&v, &b, sizeof v); if (!isfinite(v)) v = 0.5; break;
        case 2: v = floor((test_uniform(&printf_rng_state) + 2.0) * 25000.0) / 1000.0; break;
        default: v = pow(10.0, (double)(i % 31) - 13.0) * floor((test_uniform(&printf_rng_state) + 2.0) * 250.0) / 100.0;
        }
        if (i % 7 == 0)
            v = -v;
        jw_buf w;
        jw_init(&w, 0);
        jw_double(&w, v);
        size_t len;
        char *text = jw_finish(&w, &len);
        char ref[40];
        int ref_len = printf_shortest(v, ref);
        int same_value = text != NULL && strtod(text, NULL) == v &&
                         signbit(strtod(text, NULL)) == signbit(v);
        /* -0.0 is printed so that it reads back as a negative double, not
         * as printf's "-0", which JSON readers take for the integer 0. */
        int ok = same_value && ((int)len <= ref_len || (v == 0 && strcmp(text, "-0.0") == 0));
        if (!ok) {
            fprintf(stderr, "  %.17g printed as %s, printf gives %s\n", v, text ? text : "(null)", ref);
            mem_free(text);
            FAIL_AT("jw_double disagrees with printf");
        }
        mem_free(text);
    }
}

void test_jsonw_strings_escaped(void)
{
    jw_buf w;
    jw_init(&w, 4);
    jw_string(&w, "a\"b\\c\nd\x01");
    char *text = jw_finish(&w, NULL);
    ASSERT_STR_EQ(text, "\"a\\\"b\\\\c\\nd\\u0001\"");
    mem_free(text);
}

/* Bytes that are not well-formed UTF-8 (a client's path unescaped, say) come out as U+FFFD,
 * one for each byte that starts no sequence; well-formed sequences of 2, 3 and 4 bytes stay
 * as they are; every text jansson reads back as valid JSON. */
void test_jsonw_strings_utf8(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e"},
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"\xc3", "\xef\xbf\xbd"},                       /* cut short by the end */
        {"\xc3(", "\xef\xbf\xbd("},                     /* a continuation missing */
        {"\xc0\x80", "\xef\xbf\xbd\xef\xbf\xbd"},      /* overlong NUL */
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong '/' */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},    /* U+10FFFF itself */
        {"\x80\xbf", "\xef\xbf\xbd\xef\xbf\xbd"},      /* lone continuations */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jw_buf w;
        jw_init(&w, 4);
        jw_string(&w, cases[i].in);
        char *text = jw_finish(&w, NULL);
        char want[64];
        snprintf(want, sizeof want, "\"%s\"", cases[i].out);
        if (strcmp(text, want) != 0)
            FAIL_AT("case %zu: got %s", i, text);
        json_error_t err;
        json_t *back = json_loads(text, JSON_DECODE_ANY, &err);
        if (back == NULL)
            FAIL_AT("case %zu: jansson refuses %s: %s", i, text, err.text);
        json_decref(back);
        mem_free(text);
    }
}

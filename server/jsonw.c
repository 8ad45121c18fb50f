/*
 * jsonw.c - the append-only JSON writer (see jsonw.h).
 */
#include "jsonw.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

void jw_init(jw_buf *w, size_t hint)
{
    w->data = NULL;
    w->len = w->cap = 0;
    w->failed = 0;
    if (hint > 0) {
        w->data = mem_malloc(hint);
        if (w->data == NULL)
            w->failed = 1;
        else
            w->cap = hint;
    }
}

/* Makes room for n more bytes plus a terminating NUL. */
static int jw_reserve(jw_buf *w, size_t n)
{
    if (w->failed)
        return -1;
    if (w->len + n + 1 <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n + 1) {
        if (cap > ((size_t)-1) / 2) {
            w->failed = 1;
            return -1;
        }
        cap *= 2;
    }
    char *data = mem_realloc(w->data, cap);
    if (data == NULL) {
        w->failed = 1;
        return -1;
    }
    w->data = data;
    w->cap = cap;
    return 0;
}

static void jw_append(jw_buf *w, const char *text, size_t n)
{
    if (jw_reserve(w, n) != 0)
        return;
    memcpy(w->data + w->len, text, n);
    w->len += n;
}

void jw_raw(jw_buf *w, const char *text)
{
    jw_append(w, text, strlen(text));
}

void jw_char(jw_buf *w, char c)
{
    jw_append(w, &c, 1);
}

void jw_string(jw_buf *w, const char *s)
{
    jw_char(w, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': jw_raw(w, "\\\""); break;
        case '\\': jw_raw(w, "\\\\"); break;
        case '\n': jw_raw(w, "\\n"); break;
        case '\r': jw_raw(w, "\\r"); break;
        case '\t': jw_raw(w, "\\t"); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                jw_raw(w, esc);
            } else {
                jw_char(w, (char)*p);
            }
        }
    }
    jw_char(w, '"');
}

/* Shortest round-trip digits for 1e-11 <= |v| < 1e15, in exact integer
 * arithmetic (the range where every product fits in 128 bits).  With
 * v = m * 2^-s, the doubles nearest v split the line at (4m -/+ 2) * 2^-(s+2)
 * (the lower one at 4m - 1 when m is a power of two); any decimal strictly
 * between those bounds reads back as v.  Scaled by 10^k = 5^k * 2^k so that
 * v * 10^k has 17 digits, the bounds become integers over 2^(s+2-k); the
 * function takes the fewest digits n for which a multiple of 10^(17-n) lies
 * strictly inside, choosing the one nearest v.  Writes the text to out and
 * returns its length, or 0 when v is outside the range (the caller then
 * falls back to printf). */
static int shortest_fast(double v, char *out)
{
    typedef unsigned __int128 u128;
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    int negative = (int)(bits >> 63);
    double a = fabs(v);
    if (!(a >= 1e-11 && a < 1e15))
        return 0;
    int biased = (int)((bits >> 52) & 0x7FF);
    uint64_t m = (bits & ((1ull << 52) - 1)) | (1ull << 52);
    int s = 1075 - biased; /* a = m * 2^-s, s > 0 in this range */
    int k = 16 - (int)floor(log10(a));
    static const uint64_t pow10[18] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull,
        1000000ull, 10000000ull, 100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
        1000000000000ull, 10000000000000ull, 100000000000000ull, 1000000000000000ull,
        10000000000000000ull, 100000000000000000ull};
    u128 lo, hi, mid;
    int t;
    for (int attempt = 0;; attempt++) {
        if (k < 0 || k > 27 || attempt > 2)
            return 0;
        u128 p5 = 1;
        for (int i = 0; i < k; i++)
            p5 *= 5;
        t = s + 2 - k;
        if (t <= 0 || t >= 127)
            return 0;
        mid = ((u128)m << 2) * p5;
        u128 mid_int = mid >> t;
        if (mid_int < pow10[16])
            k++;
        else if (mid_int >= pow10[17])
            k--;
        else {
            int pow2 = (bits & ((1ull << 52) - 1)) == 0 && biased > 1;
            lo = (((u128)m << 2) - (pow2 ? 1 : 2)) * p5;
            hi = (((u128)m << 2) + 2) * p5;
            break;
        }
    }
    u128 mask = ((u128)1 << t) - 1;
    uint64_t first = (uint64_t)(lo >> t) + 1;                       /* smallest x > lo */
    uint64_t last = (uint64_t)(hi >> t) - ((hi & mask) == 0 ? 1 : 0); /* largest x < hi */
    uint64_t vq = (uint64_t)(mid >> t);
    int half_up = ((mid & mask) >> (t - 1)) & 1;
    uint64_t chosen = 0;
    for (int n = 1; n <= 17; n++) {
        uint64_t u = pow10[17 - n];
        uint64_t down = vq / u * u, up = down + u;
        /* nearest multiple of u to v first */
        uint64_t rem = vq - down;
        int prefer_up = rem > u / 2 || (rem == u / 2 && (u == 1 ? half_up : 1));
        uint64_t c1 = prefer_up ? up : down, c2 = prefer_up ? down : up;
        if (c1 >= first && c1 <= last) {
            chosen = c1;
            break;
        }
        if (c2 >= first && c2 <= last) {
            chosen = c2;
            break;
        }
    }
    if (chosen == 0)
        return 0;
    /* chosen * 10^-k, with 17 or 18 digits before stripping zeros */
    char digits[24];
    int nd = 0;
    for (uint64_t c = chosen; c > 0; c /= 10)
        digits[nd++] = (char)('0' + c % 10);
    int point = nd - k; /* digits before the decimal point */
    int first_digit = nd - 1, last_digit = 0;
    while (last_digit < first_digit && digits[last_digit] == '0')
        last_digit++;
    int len = 0;
    if (negative)
        out[len++] = '-';
    if (point <= -4) {
        /* as %g does below 1e-4: d.ddde-XX */
        out[len++] = digits[first_digit];
        if (first_digit > last_digit)
            out[len++] = '.';
        for (int i = first_digit - 1; i >= last_digit; i--)
            out[len++] = digits[i];
        len += snprintf(out + len, 8, "e-%02d", 1 - point);
    } else if (point <= 0) {
        out[len++] = '0';
        out[len++] = '.';
        for (int i = 0; i < -point; i++)
            out[len++] = '0';
        for (int i = first_digit; i >= last_digit; i--)
            out[len++] = digits[i];
    } else {
        int units = nd - point; /* index of the last digit before the point */
        int stop = last_digit < units ? last_digit : units;
        for (int i = first_digit; i >= stop; i--) {
            if (i == units - 1)
                out[len++] = '.';
            out[len++] = digits[i];
        }
    }
    out[len] = '\0';
    return len;
}

void jw_double(jw_buf *w, double v)
{
    if (!isfinite(v)) {
        jw_raw(w, "null");
        return;
    }
    if (v == 0 && signbit(v)) {
        jw_raw(w, "-0.0"); /* "-0" would read back as the integer 0 */
        return;
    }
    char text[48];
    int n = shortest_fast(v, text);
    if (n == 0) {
        for (int digits = 15; digits <= 17; digits++) {
            n = snprintf(text, sizeof text, "%.*g", digits, v);
            if (strtod(text, NULL) == v)
                break;
        }
    }
    jw_append(w, text, (size_t)n);
}

void jw_float(jw_buf *w, double v)
{
    if (!isfinite(v)) {
        jw_raw(w, "null");
        return;
    }
    if (v == 0 && signbit(v)) {
        jw_raw(w, "-0.0");
        return;
    }
    char text[32];
    int n = 0;
    for (int digits = 6; digits <= 9; digits++) {
        n = snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtof(text, NULL) == (float)v)
            break;
    }
    jw_append(w, text, (size_t)n);
}

void jw_size(jw_buf *w, size_t v)
{
    char text[32];
    int n = snprintf(text, sizeof text, "%zu", v);
    jw_append(w, text, (size_t)n);
}

char *jw_finish(jw_buf *w, size_t *len)
{
    if (w->failed || jw_reserve(w, 0) != 0) {
        jw_discard(w);
        return NULL;
    }
    w->data[w->len] = '\0';
    char *text = w->data;
    if (len != NULL)
        *len = w->len;
    w->data = NULL;
    w->len = w->cap = 0;
    return text;
}

void jw_discard(jw_buf *w)
{
    mem_free(w->data);
    w->data = NULL;
    w->len = w->cap = 0;
    w->failed = 0;
}

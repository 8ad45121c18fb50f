/*
 * jsonw.c - the append-only JSON writer (see jsonw.h).
 */
#include "jsonw.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "core/utf8.h"
#include "numfmt.h"

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
        if (*p >= 0x80) {
            /* A client's bytes (a path, a name) reach messages as they came: a
             * byte that is not part of well-formed UTF-8 becomes U+FFFD, so
             * that the text stays JSON (RFC 8259 asks for UTF-8). */
            int n = utf8_length(p);
            if (n == 0)
                jw_raw(w, "\xef\xbf\xbd");
            else
                jw_append(w, (const char *)p, (size_t)n);
            p += n > 0 ? n - 1 : 0;
            continue;
        }
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

/*
 * Numbers.  numfmt gives the shortest digits and their exponent; the text
 * follows printf's %g with precision max(digits, 15) for doubles and
 * max(digits, 6) for floats, the form a printf search would give: "0.1",
 * "100", "1e-05", "1.5e+20".  Zero is "0", negative zero "-0.0" (printf's
 * "-0" would read back as the integer 0), and a non-finite value null.
 */

/* Writes the n digits d (no trailing zeros) times 10^exp10 as printf's %g
 * would with precision max(n, min_precision), after a '-' when negative.
 * Returns the length; out needs 32 bytes. */
static int format_decimal(char *out, int negative, const char *d, int n, int exp10,
                          int min_precision)
{
    int sci = exp10 + n - 1; /* the exponent %e would print */
    int precision = n > min_precision ? n : min_precision;
    char *o = out;
    if (negative)
        *o++ = '-';
    if (sci < -4 || sci >= precision) {
        *o++ = d[0];
        if (n > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)(n - 1));
            o += n - 1;
        }
        *o++ = 'e';
        *o++ = sci < 0 ? '-' : '+';
        unsigned x = (unsigned)(sci < 0 ? -sci : sci);
        if (x >= 100) {
            *o++ = (char)('0' + x / 100);
            x %= 100;
        }
        *o++ = (char)('0' + x / 10);
        *o++ = (char)('0' + x % 10);
    } else if (sci >= 0) {
        int whole = sci + 1;
        if (n <= whole) {
            memcpy(o, d, (size_t)n);
            memset(o + n, '0', (size_t)(whole - n));
            o += whole;
        } else {
            memcpy(o, d, (size_t)whole);
            o += whole;
            *o++ = '.';
            memcpy(o, d + whole, (size_t)(n - whole));
            o += n - whole;
        }
    } else {
        *o++ = '0';
        *o++ = '.';
        memset(o, '0', (size_t)(-sci - 1));
        o += -sci - 1;
        memcpy(o, d, (size_t)n);
        o += n;
    }
    *o = '\0';
    return (int)(o - out);
}

/* Appends v's text given its digits from numfmt (n < 0: not finite). */
static void jw_number(jw_buf *w, int zero, int negative, const char *digits, int n, int exp10,
                      int min_precision)
{
    if (n < 0) {
        jw_raw(w, "null");
    } else if (zero) {
        jw_raw(w, negative ? "-0.0" : "0");
    } else if (jw_reserve(w, 32) == 0) {
        w->len += (size_t)format_decimal(w->data + w->len, negative, digits, n, exp10,
                                         min_precision);
    }
}

void jw_double(jw_buf *w, double v)
{
    char digits[NUMFMT_DIGITS_MAX + 1];
    int exp10;
    int n = numfmt_double(v, digits, &exp10);
    jw_number(w, v == 0, signbit(v) != 0, digits, n, exp10, 15);
}

void jw_float(jw_buf *w, double v)
{
    float f = (float)v;
    char digits[NUMFMT_DIGITS_MAX + 1];
    int exp10;
    int n = numfmt_float(f, digits, &exp10);
    jw_number(w, f == 0, signbit(f) != 0, digits, n, exp10, 6);
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

/* The matrix of jw_matrix and jw_matrix_f32: m (double) or mf (float), the other NULL. */
static void write_matrix(jw_buf *w, const double *m, const float *mf, size_t rows, size_t cols,
                         int transpose, int as_float)
{
    size_t out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
    jw_char(w, '[');
    for (size_t r = 0; r < out_rows; r++) {
        jw_raw(w, r ? ",[" : "[");
        for (size_t c = 0; c < out_cols; c++) {
            if (c)
                jw_char(w, ',');
            size_t i = transpose ? c * cols + r : r * cols + c;
            double v = m != NULL ? m[i] : mf[i];
            if (as_float)
                jw_float(w, v);
            else
                jw_double(w, v);
        }
        jw_char(w, ']');
    }
    jw_char(w, ']');
}

void jw_matrix(jw_buf *w, const double *m, size_t rows, size_t cols, int transpose, int as_float)
{
    write_matrix(w, m, NULL, rows, cols, transpose, as_float);
}

void jw_matrix_f32(jw_buf *w, const float *m, size_t rows, size_t cols, int transpose,
                   int as_float)
{
    write_matrix(w, NULL, m, rows, cols, transpose, as_float);
}

/*
 * jsonw.c - the append-only JSON writer (see jsonw.h).
 */
#include "jsonw.h"

#include <math.h>
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

void jw_double(jw_buf *w, double v)
{
    if (!isfinite(v)) {
        jw_raw(w, "null");
        return;
    }
    char text[32];
    int n = 0;
    for (int digits = 15; digits <= 17; digits++) {
        n = snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v)
            break;
    }
    jw_append(w, text, (size_t)n);
}

void jw_float(jw_buf *w, double v)
{
    if (!isfinite(v)) {
        jw_raw(w, "null");
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

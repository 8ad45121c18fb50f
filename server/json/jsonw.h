/*
 * jsonw.h - a small append-only JSON writer for large numeric responses.
 *
 * jansson builds a node per number, which for a response of millions of
 * numbers costs several times the memory of the text itself; this writer
 * appends text to one growing buffer instead.  Numbers are written with the
 * fewest significant digits that read back to the same value (the nearest
 * such decimal when several have that many digits), so 0.1 stays "0.1" and
 * every double round-trips exactly; numfmt.h finds the digits, this writer
 * only lays them out as JSON text.
 *
 * Errors are sticky: after an allocation failure every call is a no-op and
 * jw_finish returns NULL, so callers check once at the end.
 */
#ifndef ATTN_JSONW_H
#define ATTN_JSONW_H

#include <stddef.h>

typedef struct jw_buf {
    char *data;
    size_t len, cap;
    int failed;
} jw_buf;

/* Starts an empty buffer with room for `hint` bytes (0 is fine). */
void jw_init(jw_buf *w, size_t hint);
void jw_raw(jw_buf *w, const char *text);
void jw_char(jw_buf *w, char c);
/* Writes s as a JSON string with quotes and escapes; a byte that is not
 * part of well-formed UTF-8 is written as U+FFFD. */
void jw_string(jw_buf *w, const char *s);
/* Writes a finite double in shortest round-trip form (non-finite: null). */
void jw_double(jw_buf *w, double v);
/* Writes v, which holds a float value (it is rounded to float first), in the
 * shortest form that reads back to the same float (non-finite: null). */
void jw_float(jw_buf *w, double v);
void jw_size(jw_buf *w, size_t v);
/* Writes the rows x cols row-major matrix m as nested arrays, transposed
 * (cols x rows) when `transpose`; each number as jw_float writes it when
 * as_float, else as jw_double does. */
void jw_matrix(jw_buf *w, const double *m, size_t rows, size_t cols, int transpose, int as_float);
/* The same for a float matrix: each number in its float shortest form when
 * as_float, else as jw_double writes the double it widens to exactly. */
void jw_matrix_f32(jw_buf *w, const float *m, size_t rows, size_t cols, int transpose,
                   int as_float);
/* Returns the NUL-terminated text (caller frees with mem_free) and its length
 * in *len, or NULL after any failure; the buffer is empty afterwards. */
char *jw_finish(jw_buf *w, size_t *len);
/* Drops the buffer's contents. */
void jw_discard(jw_buf *w);

#endif

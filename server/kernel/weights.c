/*
 * weights.c - the table of the eight weight arrays and the rules about them.
 */
#include "weights.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "core/mem.h"

const weights_part_info weights_parts[WEIGHTS_COUNT] = {
    [WEIGHTS_WQ] = {"wq", 1, 1, WEIGHTS_D_IN, WEIGHTS_DK, WEIGHTS_WQ},
    [WEIGHTS_WK] = {"wk", 1, 1, WEIGHTS_D_CTX, WEIGHTS_DK, WEIGHTS_WK},
    [WEIGHTS_WV] = {"wv", 1, 1, WEIGHTS_D_CTX, WEIGHTS_DV, WEIGHTS_WV},
    [WEIGHTS_WO] = {"wo", 1, 0, WEIGHTS_DV, WEIGHTS_D_OUT, WEIGHTS_WO},
    [WEIGHTS_BQ] = {"bq", 0, 0, WEIGHTS_DK, WEIGHTS_DK, WEIGHTS_WQ},
    [WEIGHTS_BK] = {"bk", 0, 0, WEIGHTS_DK, WEIGHTS_DK, WEIGHTS_WK},
    [WEIGHTS_BV] = {"bv", 0, 0, WEIGHTS_DV, WEIGHTS_DV, WEIGHTS_WV},
    [WEIGHTS_BO] = {"bo", 0, 0, WEIGHTS_D_OUT, WEIGHTS_D_OUT, WEIGHTS_WO},
};

int weights_part_named(const char *name, size_t len)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        if (strlen(weights_parts[p].name) == len && memcmp(weights_parts[p].name, name, len) == 0)
            return 1;
    return 0;
}

size_t weights_dim_of(const attn_weights *w, weights_dim d)
{
    switch (d) {
    case WEIGHTS_D_IN: return w->d_in;
    case WEIGHTS_D_CTX: return w->d_ctx;
    case WEIGHTS_DK: return w->dk;
    case WEIGHTS_DV: return w->dv;
    default: return w->d_out;
    }
}

size_t weights_rows(const attn_weights *w, weights_part p)
{
    return weights_parts[p].is_matrix ? weights_dim_of(w, weights_parts[p].rows) : 1;
}

size_t weights_cols(const attn_weights *w, weights_part p)
{
    return weights_dim_of(w, weights_parts[p].cols);
}

double **weights_slot(attn_weights *w, weights_part p)
{
    double **slots[WEIGHTS_COUNT] = {
        [WEIGHTS_WQ] = &w->wq, [WEIGHTS_WK] = &w->wk, [WEIGHTS_WV] = &w->wv, [WEIGHTS_WO] = &w->wo,
        [WEIGHTS_BQ] = &w->bq, [WEIGHTS_BK] = &w->bk, [WEIGHTS_BV] = &w->bv, [WEIGHTS_BO] = &w->bo,
    };
    return slots[p];
}

const double *weights_array(const attn_weights *w, weights_part p)
{
    return *weights_slot((attn_weights *)w, p);
}

float **weights_slot_f32(attn_weights *w, weights_part p)
{
    return &w->f32[p];
}

const float *weights_array_f32(const attn_weights *w, weights_part p)
{
    return w->f32[p];
}

int weights_is_f32(const attn_weights *w)
{
    return w->elem == WEIGHTS_F32;
}

size_t weights_elem_size(const attn_weights *w)
{
    return weights_is_f32(w) ? sizeof(float) : sizeof(double);
}

const char *weights_elem_name(const attn_weights *w)
{
    return weights_is_f32(w) ? "float32" : "float64";
}

const void *weights_data(const attn_weights *w, weights_part p)
{
    return weights_is_f32(w) ? (const void *)w->f32[p] : (const void *)weights_array(w, p);
}

int weights_has(const attn_weights *w, weights_part p)
{
    return weights_data(w, p) != NULL;
}

double weights_get(const attn_weights *w, weights_part p, size_t i)
{
    return weights_is_f32(w) ? (double)w->f32[p][i] : weights_array(w, p)[i];
}

void *weights_part_alloc(attn_weights *w, weights_part p)
{
    size_t bytes;
    if (mem_mul(weights_rows(w, p), weights_cols(w, p), weights_elem_size(w), &bytes) != 0)
        return NULL;
    void *a = mem_malloc(bytes ? bytes : 1);
    if (a == NULL)
        return NULL;
    if (weights_is_f32(w))
        w->f32[p] = a;
    else
        *weights_slot(w, p) = a;
    return a;
}

/* out's dimensions from w, with no arrays, of element type elem. */
static void weights_shell(const attn_weights *w, weights_elem elem, attn_weights *out)
{
    memset(out, 0, sizeof *out);
    out->elem = elem;
    out->d_in = w->d_in;
    out->d_ctx = w->d_ctx;
    out->dk = w->dk;
    out->dv = w->dv;
    out->d_out = w->d_out;
}

/* out: new arrays holding w's numbers in element type elem, which is w's own (a copy) or
 * float64 (widened exactly). */
static int weights_convert(const attn_weights *w, weights_elem elem, attn_weights *out)
{
    assert(elem == w->elem || elem == WEIGHTS_F64);
    weights_shell(w, elem, out);
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!weights_has(w, (weights_part)p))
            continue;
        void *a = weights_part_alloc(out, (weights_part)p);
        if (a == NULL) {
            weights_free(out);
            return -1;
        }
        size_t n = weights_rows(w, (weights_part)p) * weights_cols(w, (weights_part)p);
        if (elem == w->elem)
            memcpy(a, weights_data(w, (weights_part)p), n * weights_elem_size(w));
        else
            for (size_t i = 0; i < n; i++)
                ((double *)a)[i] = weights_get(w, (weights_part)p, i);
    }
    return 0;
}

int weights_widen(const attn_weights *w, attn_weights *out)
{
    return weights_convert(w, WEIGHTS_F64, out);
}

int weights_copy(const attn_weights *w, attn_weights *out)
{
    return weights_convert(w, w->elem, out);
}

void weights_free(attn_weights *w)
{
    if (w == NULL)
        return;
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        mem_free(*weights_slot(w, (weights_part)p));
        mem_free(w->f32[p]);
    }
    memset(w, 0, sizeof *w);
}

int weights_check_heads(size_t heads, size_t dk, size_t dv, attn_error *err)
{
    if (dk % heads != 0)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "heads",
                         "heads = %zu does not divide dk = %zu (the width of queries and keys); "
                         "choose a divisor of %zu.", heads, dk, dk);
    if (dv % heads != 0)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "heads",
                         "heads = %zu does not divide dv = %zu (the width of values); choose a "
                         "divisor of %zu.", heads, dv, dv);
    return 0;
}

double weights_default_scale(size_t dk, size_t heads)
{
    return 1.0 / sqrt((double)(dk / heads));
}

int weights_valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > WEIGHTS_NAME_MAX)
        return 0;
    /* "." and ".." are path segments to every client that normalises a URL:
     * /v1/weight-sets/.. would reach another route, never the set. */
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int weights_check_name(const char *name, const char *field, attn_error *err)
{
    if (weights_valid_name(name))
        return 0;
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                     "\"%.80s\" is not a valid weight-set name: use 1 to %d of A-Z a-z 0-9 . _ - "
                     "(but not \".\" or \"..\").", name, WEIGHTS_NAME_MAX);
}

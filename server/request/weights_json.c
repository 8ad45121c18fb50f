/*
 * weights_json.c - decoding weights objects and PUT bodies, encoding stored
 * sets.
 *
 * Every walk over the arrays follows the table of weights.h.  Shapes are
 * checked in the order a person reads the object: each matrix's inputs
 * against the tokens it is applied to, then each dimension a matrix shares
 * with an earlier one (wk's outputs with wq's, wv's inputs with wk's, wo's
 * inputs with wv's outputs), then each bias against its matrix, so that the
 * member named in an error is the one that disagrees with what came before.
 */
#include "weights_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"

/* Writes the field names of the weight arrays, in table order, to names. */
static void part_names(const char **names)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        names[p] = weights_parts[p].name;
}

/* What a dimension is, for messages. */
static const char *dim_meaning(weights_dim d)
{
    switch (d) {
    case WEIGHTS_D_IN: return "the width of x";
    case WEIGHTS_D_CTX: return "the width of the tokens keys and values are made from";
    case WEIGHTS_DK: return "dk, the width of queries and keys";
    case WEIGHTS_DV: return "dv, the width of values";
    default: return "the width of the output";
    }
}

/* The decoded parts: matrices as json_in tensors in in_out form, biases as
 * tensors of one row. */
typedef struct parts {
    json_in_tensor t[WEIGHTS_COUNT];
    char path[WEIGHTS_COUNT][80];
} parts;

static void parts_free(parts *ps)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        mem_free(ps->t[p].data);
    memset(ps->t, 0, sizeof ps->t);
}

/* The size of dimension d as matrix p holds it (0 when p does not take d). */
static size_t matrix_dim(const parts *ps, int p, weights_dim d, int *as_rows)
{
    const weights_part_info *info = &weights_parts[p];
    if (info->rows == d) {
        *as_rows = 1;
        return ps->t[p].rows;
    }
    if (info->cols == d) {
        *as_rows = 0;
        return ps->t[p].cols;
    }
    return 0;
}

/* Checks the shapes of the decoded parts against tokens and each other. */
static int check_shapes(const parts *ps, int out_in, const weights_json_tokens *tokens,
                        attn_error *err)
{
    /* The user's axes: in_out W is (d_in x d_out); out_in W is (d_out x d_in). */
    const char *in_axis = out_in ? "columns" : "rows", *out_axis = out_in ? "rows" : "columns";
    for (int p = 0; tokens != NULL && tokens->x_width != 0 && p < WEIGHTS_COUNT; p++) {
        const weights_part_info *info = &weights_parts[p];
        if (!info->is_matrix || ps->t[p].data == NULL ||
            (info->rows != WEIGHTS_D_IN && info->rows != WEIGHTS_D_CTX))
            continue;
        int x = info->rows == WEIGHTS_D_IN;
        size_t want = x ? tokens->x_width : tokens->ctx_width;
        if (ps->t[p].rows != want)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", ps->path[p],
                             "%s has %zu %s but %s has %zu features per token; they must match.",
                             ps->path[p], ps->t[p].rows, in_axis, x ? "x" : tokens->ctx_name, want);
    }
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const weights_part_info *info = &weights_parts[p];
        if (!info->is_matrix || ps->t[p].data == NULL)
            continue;
        weights_dim dims[2] = {info->rows, info->cols};
        for (int a = 0; a < 2; a++) {
            int mine_rows = a == 0, ref_rows = 0;
            size_t mine = a == 0 ? ps->t[p].rows : ps->t[p].cols;
            for (int q = 0; q < p; q++) {
                if (!weights_parts[q].is_matrix || ps->t[q].data == NULL)
                    continue;
                size_t ref = matrix_dim(ps, q, dims[a], &ref_rows);
                if (ref == 0)
                    continue;
                if (ref != mine)
                    return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", ps->path[p],
                                     "%s has %zu %s but %s has %zu %s (both give %s).",
                                     ps->path[p], mine, mine_rows ? in_axis : out_axis,
                                     ps->path[q], ref, ref_rows ? in_axis : out_axis,
                                     dim_meaning(dims[a]));
                break;
            }
        }
    }
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const weights_part_info *info = &weights_parts[p];
        if (info->is_matrix || ps->t[p].data == NULL)
            continue;
        const json_in_tensor *m = &ps->t[info->matrix];
        if (m->data == NULL)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", ps->path[p],
                             "%s is given but %s is not; a bias belongs to its projection.",
                             ps->path[p], ps->path[info->matrix]);
        if (ps->t[p].cols != m->cols)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", ps->path[p],
                             "%s has %zu numbers but %s has %zu outputs (one bias per output).",
                             ps->path[p], ps->t[p].cols, ps->path[info->matrix], m->cols);
    }
    return 0;
}

/* Decodes the weight members of obj (other members are not looked at). */
static int decode_members(const json_t *obj, const char *path, int out_in,
                          const weights_json_tokens *tokens, const json_in_budget *budget,
                          attn_weights *w, attn_error *err)
{
    parts ps;
    memset(&ps, 0, sizeof ps);
    int rc = 0;
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        snprintf(ps.path[p], sizeof ps.path[p], "%s%s%s", path, *path ? "." : "",
                 weights_parts[p].name);
    for (int p = 0; p < WEIGHTS_COUNT && rc == 0; p++) {
        const weights_part_info *info = &weights_parts[p];
        const json_t *m = json_object_get(obj, weights_parts[p].name);
        if (m == NULL) {
            if (info->required)
                rc = error_set(err, ERR_BAD_REQUEST, "missing_field", ps.path[p],
                               "%s is missing; weights need wq, wk and wv.", ps.path[p]);
            continue;
        }
        json_in_tensor *t = &ps.t[p];
        if (info->is_matrix) {
            rc = json_in_tensor_decode(budget, m, ps.path[p], 2, JSON_IN_NUMBER, out_in, t, err);
        } else {
            rc = json_in_vector_decode(budget, m, ps.path[p], &t->data, &t->cols, err);
            t->rank = 1;
            t->batch = t->rows = 1;
        }
    }
    if (rc == 0)
        rc = check_shapes(&ps, out_in, tokens, err);
    if (rc != 0) {
        parts_free(&ps);
        return rc;
    }
    w->d_in = ps.t[WEIGHTS_WQ].rows;
    w->d_ctx = ps.t[WEIGHTS_WK].rows;
    w->dk = ps.t[WEIGHTS_WQ].cols;
    w->dv = ps.t[WEIGHTS_WV].cols;
    w->d_out = ps.t[WEIGHTS_WO].data != NULL ? ps.t[WEIGHTS_WO].cols : w->dv;
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        *weights_slot(w, (weights_part)p) = ps.t[p].data;
    return 0;
}

int weights_json_decode(const json_t *obj, const char *path, int out_in,
                        const weights_json_tokens *tokens, const json_in_budget *budget,
                        attn_weights *w, attn_error *err)
{
    memset(w, 0, sizeof *w);
    if (!json_is_object(obj))
        return error_set(err, ERR_BAD_REQUEST, *path ? "wrong_type" : "invalid_json", path,
                         "%s is %s; it must be an object {\"wq\", \"wk\", \"wv\", and optionally "
                         "\"bq\", \"bk\", \"bv\", \"wo\", \"bo\"} or the name of a stored weight set.",
                         path, json_in_kind(obj));
    const char *names[WEIGHTS_COUNT];
    part_names(names);
    int rc = json_in_check_fields(obj, path, names, WEIGHTS_COUNT, err);
    if (rc != 0)
        return rc;
    return decode_members(obj, path, out_in, tokens, budget, w, err);
}

int weights_json_decode_heads(const json_t *root, int allow_null, size_t *heads, attn_error *err)
{
    scalar v = json_in_scalar(json_object_get(root, "heads"));
    return weights_json_heads_value(&v, allow_null, heads, err);
}

int weights_json_heads_value(const scalar *v, int allow_null, size_t *heads, attn_error *err)
{
    *heads = 0;
    if (v->kind == SCALAR_ABSENT || (allow_null && v->kind == SCALAR_NULL))
        return 0;
    if (!scalar_is_number(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "heads",
                         "heads is %s; it must be a whole number >= 1%s.", scalar_kind_words(v),
                         allow_null ? ", or null" : "");
    double h = scalar_number(v);
    if (h < 1 || h != floor(h) || h > 1e6)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "heads",
                         "heads is %g; it must be a whole number >= 1 that divides dk and dv.", h);
    *heads = (size_t)h;
    return 0;
}

int weights_json_decode_set(const json_t *root, size_t max_elements, attn_weights *w,
                            size_t *heads, int *out_in, attn_error *err)
{
    /* The read-only members of a GET answer are accepted and ignored, so that
     * what GET returns can be PUT back unchanged. */
    static const char *const more[] = {"weights_layout", "heads", "name", "shapes",
                                       "parameters", "size_bytes", "stored_at",
                                       "generation", "dtype"};
    enum { MORE = sizeof more / sizeof more[0] };
    const char *known[WEIGHTS_COUNT + MORE];
    part_names(known);
    memcpy(known + WEIGHTS_COUNT, more, sizeof more);
    static const char *const wlayouts[] = {"in_out", "out_in"};
    memset(w, 0, sizeof *w);
    *heads = 0;
    *out_in = 0;
    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The body is %s; it must be a JSON object {\"wq\", \"wk\", \"wv\", and "
                         "optionally \"bq\", \"bk\", \"bv\", \"wo\", \"bo\", \"weights_layout\", "
                         "\"heads\"}.", json_in_kind(root));
    int rc = json_in_check_fields(root, "", known, sizeof known / sizeof known[0], err);
    if (rc != 0 || (rc = json_in_enum(root, "weights_layout", wlayouts, 2, 0, out_in, err)) != 0)
        return rc;
    /* null: no heads, as the summary shows it */
    if ((rc = weights_json_decode_heads(root, 1, heads, err)) != 0)
        return rc;
    size_t elements = 0;
    json_in_budget budget = {max_elements, &elements};
    if ((rc = decode_members(root, "", *out_in, NULL, &budget, w, err)) != 0)
        return rc;
    if (*heads != 0 && (rc = weights_check_heads(*heads, w->dk, w->dv, err)) != 0)
        weights_free(w);
    return rc;
}

void weights_json_encode_set(const weight_set *set, int with_arrays, jw_buf *w)
{
    const attn_weights *wt = &set->w;
    jw_raw(w, "{\"name\":");
    jw_string(w, set->name);
    /* The summary always has heads; the full set only when it was stored. */
    if (set->heads) {
        jw_raw(w, ",\"heads\":");
        jw_size(w, set->heads);
    } else if (!with_arrays) {
        jw_raw(w, ",\"heads\":null");
    }
    jw_raw(w, ",\"weights_layout\":");
    jw_string(w, set->out_in ? "out_in" : "in_out");
    jw_raw(w, ",\"dtype\":");
    jw_string(w, weights_elem_name(wt));
    jw_raw(w, ",\"shapes\":{");
    int first = 1;
    size_t parameters = 0;
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!weights_has(wt, (weights_part)p))
            continue;
        size_t rows = weights_rows(wt, (weights_part)p), cols = weights_cols(wt, (weights_part)p);
        parameters += rows * cols;
        jw_raw(w, first ? "\"" : ",\"");
        first = 0;
        jw_raw(w, weights_parts[p].name);
        jw_raw(w, "\":[");
        if (weights_parts[p].is_matrix) {
            jw_size(w, set->out_in ? cols : rows);
            jw_char(w, ',');
            jw_size(w, set->out_in ? rows : cols);
        } else {
            jw_size(w, cols);
        }
        jw_char(w, ']');
    }
    jw_raw(w, "},\"parameters\":");
    jw_size(w, parameters);
    jw_raw(w, ",\"size_bytes\":");
    jw_size(w, set->size_bytes);
    char when[40];
    time_t secs = (time_t)(set->stored_at_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)(set->stored_at_ms % 1000));
    jw_raw(w, ",\"stored_at\":");
    jw_string(w, when);
    jw_raw(w, ",\"generation\":");
    jw_size(w, (size_t)set->generation);
    /* A float32 set's numbers are widened to double, exactly, and written as jw_double
     * writes a double: the shortest text that reads back to that double, and so to the
     * same float32 once rounded.  The text is longer than the float's own shortest form
     * (0.10000000149011612 for 0.1f), but a GET answer PUT back as JSON then holds the
     * same numbers, not the decimals the float was nearest to. */
    for (int p = 0; with_arrays && p < WEIGHTS_COUNT; p++) {
        if (!weights_has(wt, (weights_part)p))
            continue;
        jw_raw(w, ",\"");
        jw_raw(w, weights_parts[p].name);
        jw_raw(w, "\":");
        size_t rows = weights_rows(wt, (weights_part)p), cols = weights_cols(wt, (weights_part)p);
        if (weights_parts[p].is_matrix) {
            if (weights_is_f32(wt))
                jw_matrix_f32(w, weights_array_f32(wt, (weights_part)p), rows, cols, set->out_in,
                              0);
            else
                jw_matrix(w, weights_array(wt, (weights_part)p), rows, cols, set->out_in, 0);
        } else {
            jw_char(w, '[');
            for (size_t j = 0; j < cols; j++) {
                if (j)
                    jw_char(w, ',');
                jw_double(w, weights_get(wt, (weights_part)p, j));
            }
            jw_char(w, ']');
        }
    }
    jw_char(w, '}');
}

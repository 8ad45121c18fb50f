/*
 * request.c - decoding POST /v1/attention bodies and encoding their answers.
 *
 * Decoding runs in two steps for every matrix: a scan that learns its rank
 * and dimensions and rejects ragged or mistyped nesting without allocating,
 * then (once the running count of numbers is within the limit) a fill that
 * copies the numbers into a freshly allocated row-major array and checks each
 * element's type.  Shapes are then checked against each other in the order a
 * person would read the request: q against k, k against v, heads, mask.
 * Messages speak of the matrices as the user laid them out.
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mem.h"

/* Numbers kept while decoding one request. */
typedef struct decode_ctx {
    size_t max_elements;
    size_t *elements;
    int columns;            /* tokens are columns of x/context/q/k/v */
} decode_ctx;

/* A matrix as decoded: rank 2 (batch = 1) or 3.  rows/cols are as the user
 * sent them until tensor_to_rows transposes a columns-layout matrix. */
typedef struct tensor {
    int rank;
    size_t batch, rows, cols;
    double *data;
} tensor;

enum { ELEM_NUMBER, ELEM_MASK };

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* ---- matrices ---------------------------------------------------------- */

/* Learns the rank (min_rank..max_rank) and dimensions of the nested arrays v
 * at `path`, checking every level is an array of the same length.  Elements
 * are not looked at.  Counts the numbers into ctx and fails with 413 past the
 * limit. */
static int tensor_scan(const decode_ctx *ctx, const json_t *v, const char *path, int max_rank,
                       tensor *t, attn_error *err)
{
    const char *example = max_rank == 3 ? "a matrix (an array of rows, each an array of numbers) "
                                          "or a batch of such matrices"
                                        : "a matrix (an array of rows, each an array of numbers)";
    memset(t, 0, sizeof *t);
    if (!json_is_array(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path, "%s is %s; it must be %s.", path,
                         json_kind(v), example);
    if (json_array_size(v) == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s is empty; it must be %s with at least one number.", path, example);
    const json_t *first = json_array_get(v, 0);
    if (!json_is_array(first))
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s is a flat list; it must be %s, e.g. [[1, 2], [3, 4]].", path, example);
    if (json_array_size(first) == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s[0] is empty; every row needs at least one number.", path);
    const json_t *inner = json_array_get(first, 0);
    t->rank = json_is_array(inner) ? 3 : 2;
    if (t->rank > max_rank)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s has 3 axes; it must be %s.", path, example);
    if (t->rank == 3 && json_is_array(json_array_get(inner, 0)))
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s has more than 3 axes; it must be %s.", path, example);
    if (t->rank == 3 && json_array_size(inner) == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s[0][0] is empty; every row needs at least one number.", path);
    t->batch = t->rank == 3 ? json_array_size(v) : 1;
    t->rows = t->rank == 3 ? json_array_size(first) : json_array_size(v);
    t->cols = t->rank == 3 ? json_array_size(inner) : json_array_size(first);
    char at[200], ref[200];
    for (size_t b = 0; b < t->batch; b++) {
        const json_t *mat = v;
        char mpath[100];
        /* Paths are formatted only for an error. */
        if (t->rank == 3) {
            mat = json_array_get(v, b);
            if (!json_is_array(mat) || json_array_size(mat) != t->rows) {
                snprintf(mpath, sizeof mpath, "%.60s[%zu]", path, b);
                if (!json_is_array(mat))
                    return error_set(err, ERR_BAD_REQUEST, "ragged_matrix", mpath,
                                     "%s is %s, but %s[0] is a matrix; every entry of a batch "
                                     "must be a matrix of the same shape.", mpath, json_kind(mat), path);
                return error_set(err, ERR_BAD_REQUEST, "ragged_matrix", mpath,
                                 "%s has %zu rows but %s[0] has %zu; every matrix of a batch "
                                 "must have the same shape.", mpath, json_array_size(mat), path,
                                 t->rows);
            }
        }
        for (size_t r = 0; r < t->rows; r++) {
            const json_t *row = json_array_get(mat, r);
            if (json_is_array(row) && json_array_size(row) == t->cols)
                continue;
            if (t->rank == 3)
                snprintf(mpath, sizeof mpath, "%.60s[%zu]", path, b);
            else
                snprintf(mpath, sizeof mpath, "%.60s", path);
            snprintf(at, sizeof at, "%s[%zu]", mpath, r);
            snprintf(ref, sizeof ref, "%s[0]", t->rank == 3 ? path : mpath);
            if (t->rank == 3)
                snprintf(ref, sizeof ref, "%.60s[0][0]", path);
            if (!json_is_array(row))
                return error_set(err, ERR_BAD_REQUEST, "ragged_matrix", at,
                                 "%s is %s, but %s is a row of numbers; every row must be an "
                                 "array of the same length.", at, json_kind(row), ref);
            return error_set(err, ERR_BAD_REQUEST, "ragged_matrix", at,
                             "%s has %zu numbers but %s has %zu; all rows must have the "
                             "same length.", at, json_array_size(row), ref, t->cols);
        }
    }
    size_t n;
    if (mem_mul(t->batch, t->rows, t->cols, &n) != 0 || n > ctx->max_elements ||
        *ctx->elements + n > ctx->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                         "The request holds more than %zu numbers (reached at %s), the server's "
                         "limit (--max-elements); send fewer or smaller matrices.",
                         ctx->max_elements, path);
    *ctx->elements += n;
    return 0;
}

/* Allocates t->data and copies the elements of v (already scanned into t)
 * into it, checking each is a number (ELEM_NUMBER) or a boolean or 0/1
 * (ELEM_MASK, stored as 0.0/1.0). */
static int tensor_fill(const json_t *v, const char *path, int kind, tensor *t, attn_error *err)
{
    size_t n = t->batch * t->rows * t->cols;
    t->data = mem_malloc(n * sizeof(double));
    if (t->data == NULL)
        return error_nomem(err);
    double *out = t->data;
    for (size_t b = 0; b < t->batch; b++) {
        const json_t *mat = t->rank == 3 ? json_array_get(v, b) : v;
        for (size_t r = 0; r < t->rows; r++) {
            const json_t *row = json_array_get(mat, r);
            for (size_t c = 0; c < t->cols; c++) {
                const json_t *e = json_array_get(row, c);
                double value;
                if (json_is_number(e)) {
                    value = json_number_value(e);
                } else if (kind == ELEM_MASK && json_is_boolean(e)) {
                    value = json_is_true(e) ? 1.0 : 0.0;
                } else {
                    value = NAN;
                }
                int ok = kind == ELEM_NUMBER ? !isnan(value) : (value == 0.0 || value == 1.0);
                if (!ok || !isfinite(value)) {
                    char at[200];
                    if (t->rank == 3)
                        snprintf(at, sizeof at, "%.60s[%zu][%zu][%zu]", path, b, r, c);
                    else
                        snprintf(at, sizeof at, "%.60s[%zu][%zu]", path, r, c);
                    mem_free(t->data);
                    t->data = NULL;
                    if (kind == ELEM_MASK && json_is_number(e))
                        return error_set(err, ERR_BAD_REQUEST, "invalid_value", at,
                                         "%s is %g; mask entries must be true/false or 1/0 "
                                         "(1 = may attend).", at, value);
                    if (kind == ELEM_MASK)
                        return error_set(err, ERR_BAD_REQUEST, "invalid_value", at,
                                         "%s is %s; mask entries must be true/false or 1/0 "
                                         "(1 = may attend).", at, json_kind(e));
                    return error_set(err, ERR_BAD_REQUEST, "wrong_type", at,
                                     "%s is %s; %s.", at, json_kind(e),
                                     kind == ELEM_MASK ? "mask entries must be true/false or 1/0"
                                                       : "matrix entries must be numbers");
                }
                *out++ = value;
            }
        }
    }
    return 0;
}

/* Transposes every matrix of t in place (rows <-> cols). */
static int tensor_transpose(tensor *t, attn_error *err)
{
    size_t plane = t->rows * t->cols;
    double *tmp = mem_malloc(plane * sizeof(double));
    if (tmp == NULL)
        return error_nomem(err);
    for (size_t b = 0; b < t->batch; b++) {
        double *m = t->data + b * plane;
        for (size_t r = 0; r < t->rows; r++)
            for (size_t c = 0; c < t->cols; c++)
                tmp[c * t->rows + r] = m[r * t->cols + c];
        memcpy(m, tmp, plane * sizeof(double));
    }
    mem_free(tmp);
    size_t rows = t->rows;
    t->rows = t->cols;
    t->cols = rows;
    return 0;
}

/* Decodes the matrix v at path: scan, fill, and for token matrices in the
 * columns layout a transpose, so that t ends up tokens x features. */
static int tensor_decode(const decode_ctx *ctx, const json_t *v, const char *path, int max_rank,
                         int kind, int token_matrix, tensor *t, attn_error *err)
{
    int rc = tensor_scan(ctx, v, path, max_rank, t, err);
    if (rc == 0)
        rc = tensor_fill(v, path, kind, t, err);
    if (rc == 0 && token_matrix && ctx->columns)
        rc = tensor_transpose(t, err);
    if (rc != 0) {
        mem_free(t->data);
        memset(t, 0, sizeof *t);
    }
    return rc;
}

/* Decodes a flat array of numbers (a bias) of any length >= 1. */
static int vector_decode(const decode_ctx *ctx, const json_t *v, const char *path, double **out,
                         size_t *len, attn_error *err)
{
    *out = NULL;
    *len = 0;
    if (!json_is_array(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path,
                         "%s is %s; a bias must be a flat array of numbers.", path, json_kind(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s is empty; a bias needs one number per output.", path);
    if (n > ctx->max_elements || *ctx->elements + n > ctx->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                         "The request holds more than %zu numbers (reached at %s), the server's "
                         "limit (--max-elements).", ctx->max_elements, path);
    double *data = mem_malloc(n * sizeof(double));
    if (data == NULL)
        return error_nomem(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_number(e)) {
            char at[200];
            snprintf(at, sizeof at, "%.60s[%zu]", path, i);
            mem_free(data);
            if (json_is_array(e))
                return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                                 "%s is nested; a bias must be a flat array of numbers.", path);
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", at,
                             "%s is %s; bias entries must be numbers.", at, json_kind(e));
        }
        data[i] = json_number_value(e);
    }
    *ctx->elements += n;
    *out = data;
    *len = n;
    return 0;
}

/* ---- scalars ----------------------------------------------------------- */

static int decode_bool(const json_t *root, const char *name, int def, int *out, attn_error *err)
{
    const json_t *v = json_object_get(root, name);
    *out = def;
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", name,
                         "%s is %s; it must be true or false.", name, json_kind(v));
    *out = json_is_true(v);
    return 0;
}

/* Decodes an enum string field; *out is the index in `values` (def when the
 * field is absent). */
static int decode_enum(const json_t *root, const char *name, const char *const *values,
                       int count, int def, int *out, attn_error *err)
{
    const json_t *v = json_object_get(root, name);
    *out = def;
    if (v == NULL)
        return 0;
    if (json_is_string(v))
        for (int i = 0; i < count; i++)
            if (strcmp(json_string_value(v), values[i]) == 0) {
                *out = i;
                return 0;
            }
    char allowed[128] = "";
    for (int i = 0; i < count; i++) {
        size_t used = strlen(allowed);
        snprintf(allowed + used, sizeof allowed - used, "%s\"%s\"",
                 i == 0 ? "" : (i == count - 1 ? " or " : ", "), values[i]);
    }
    if (!json_is_string(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", name, "%s is %s; it must be %s.",
                         name, json_kind(v), allowed);
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", name, "%s is \"%.40s\"; it must be %s.",
                     name, json_string_value(v), allowed);
}

/* Decodes the optional "heads" member of root into *heads (0 when absent,
 * or null where allow_null says null means "none"). */
static int decode_heads(const json_t *root, int allow_null, size_t *heads, attn_error *err)
{
    const json_t *jh = json_object_get(root, "heads");
    *heads = 0;
    if (jh == NULL || (allow_null && json_is_null(jh)))
        return 0;
    if (!json_is_number(jh))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "heads",
                         "heads is %s; it must be a whole number >= 1%s.", json_kind(jh),
                         allow_null ? ", or null" : "");
    double h = json_number_value(jh);
    if (h < 1 || h != floor(h) || h > 1e6)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "heads",
                         "heads is %g; it must be a whole number >= 1 that divides dk and dv.", h);
    *heads = (size_t)h;
    return 0;
}

/* ---- field names ------------------------------------------------------- */

/* Levenshtein distance, for "did you mean" hints on short field names. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31)
        return 99;
    size_t d[32][32];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* Fails with unknown_field on the first member of obj not in `known`. */
static int check_known_fields(const json_t *obj, const char *prefix, const char *const *known,
                              size_t count, attn_error *err)
{
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        (void)value;
        int found = 0;
        for (size_t i = 0; i < count && !found; i++)
            found = strcmp(key, known[i]) == 0;
        if (found)
            continue;
        /* An unknown field: the nearest known name, if it is close, as a hint. */
        const char *hint = NULL;
        size_t best = 3;
        for (size_t i = 0; i < count; i++) {
            size_t d = edit_distance(key, known[i]);
            if (d < best && strlen(known[i]) > 1) {
                best = d;
                hint = known[i];
            }
        }
        char path[160], hintbuf[96] = "";
        snprintf(path, sizeof path, "%s%s%.100s", prefix, *prefix ? "." : "", key);
        if (hint != NULL)
            snprintf(hintbuf, sizeof hintbuf, " Did you mean \"%s\"?", hint);
        return error_set(err, ERR_BAD_REQUEST, "unknown_field", path,
                         "%s is not a field of this request.%s", path, hintbuf);
    }
    return 0;
}

int request_valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > REQUEST_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* ---- weights ----------------------------------------------------------- */

void request_weights_free(attn_weights *w)
{
    if (w == NULL)
        return;
    double *arrays[8] = {w->wq, w->wk, w->wv, w->wo, w->bq, w->bk, w->bv, w->bo};
    for (int i = 0; i < 8; i++)
        mem_free(arrays[i]);
    memset(w, 0, sizeof *w);
}

int request_decode_weights(const json_t *obj, const char *path, int out_in, size_t x_width,
                           size_t ctx_width, const char *ctx_name, size_t max_elements,
                           size_t *elements, attn_weights *w, attn_error *err)
{
    static const char *const known[] = {"wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"};
    memset(w, 0, sizeof *w);
    if (!json_is_object(obj))
        return error_set(err, ERR_BAD_REQUEST, *path ? "wrong_type" : "invalid_json", path,
                         "%s is %s; it must be an object {\"wq\", \"wk\", \"wv\", and optionally "
                         "\"bq\", \"bk\", \"bv\", \"wo\", \"bo\"} or the name of a stored weight set.",
                         path, json_kind(obj));
    int rc = check_known_fields(obj, path, known, 8, err);
    if (rc != 0)
        return rc;
    decode_ctx ctx = {max_elements, elements, 0};
    /* The user's axes: in_out W is (d_in x d_out); out_in W is (d_out x d_in). */
    const char *in_axis = out_in ? "columns" : "rows", *out_axis = out_in ? "rows" : "columns";
    tensor t[4];
    memset(t, 0, sizeof t);
    double *bias[4] = {0};
    size_t blen[4] = {0};
    char fp[4][80], bp[4][80];
    const char *dot = *path ? "." : "";
    for (int i = 0; i < 4; i++) {
        snprintf(fp[i], sizeof fp[i], "%s%s%s", path, dot, known[i == 3 ? 6 : i]);
        snprintf(bp[i], sizeof bp[i], "%s%s%s", path, dot, known[i == 3 ? 7 : i + 3]);
    }
    for (int i = 0; i < 4 && rc == 0; i++) {
        const json_t *m = json_object_get(obj, i == 3 ? "wo" : known[i]);
        if (m == NULL) {
            if (i < 3)
                rc = error_set(err, ERR_BAD_REQUEST, "missing_field", fp[i],
                               "%s is missing; weights need wq, wk and wv.", fp[i]);
            continue;
        }
        rc = tensor_decode(&ctx, m, fp[i], 2, ELEM_NUMBER, 0, &t[i], err);
        if (rc == 0 && out_in)
            rc = tensor_transpose(&t[i], err);
    }
    for (int i = 0; i < 4 && rc == 0; i++) {
        const json_t *b = json_object_get(obj, i == 3 ? "bo" : known[i + 3]);
        if (b != NULL)
            rc = vector_decode(&ctx, b, bp[i], &bias[i], &blen[i], err);
    }
    /* Now t[i] is in_out: rows = d_in, cols = d_out.  When the tokens are
     * known, each input width is checked against them first, so the matrix
     * at fault is the one named. */
    for (int i = 0; i < 3 && rc == 0 && x_width != 0; i++) {
        size_t want = i == 0 ? x_width : ctx_width;
        const char *src = i == 0 ? "x" : ctx_name;
        if (t[i].rows != want)
            rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", fp[i],
                           "%s has %zu %s but %s has %zu features per token; they must match.",
                           fp[i], t[i].rows, in_axis, src, want);
    }
    if (rc == 0 && t[1].cols != t[0].cols)
        rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", fp[1],
                       "%s has %zu %s but %s has %zu (both give dk, the width of queries and keys).",
                       fp[1], t[1].cols, out_axis, fp[0], t[0].cols);
    if (rc == 0 && t[2].rows != t[1].rows)
        rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", fp[2],
                       "%s has %zu %s but %s has %zu (keys and values are made from the same tokens, "
                       "so both must match their width).", fp[2], t[2].rows, in_axis, fp[1], t[1].rows);
    if (rc == 0 && t[3].data != NULL && t[3].rows != t[2].cols)
        rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", fp[3],
                       "%s has %zu %s but %s gives values of width %zu (wo projects the "
                       "concatenated heads, so it needs dv inputs).", fp[3], t[3].rows, in_axis,
                       fp[2], t[2].cols);
    if (rc == 0 && bias[3] != NULL && t[3].data == NULL)
        rc = error_set(err, ERR_BAD_REQUEST, "conflicting_fields", bp[3],
                       "%s is given but %s is not; the output bias belongs to the output projection.",
                       bp[3], fp[3]);
    for (int i = 0; i < 4 && rc == 0; i++)
        if (bias[i] != NULL && blen[i] != t[i].cols)
            rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", bp[i],
                           "%s has %zu numbers but %s has %zu outputs (one bias per output).",
                           bp[i], blen[i], fp[i], t[i].cols);
    if (rc != 0) {
        for (int i = 0; i < 4; i++) {
            mem_free(t[i].data);
            mem_free(bias[i]);
        }
        return rc;
    }
    w->d_in = t[0].rows;
    w->d_ctx = t[1].rows;
    w->dk = t[0].cols;
    w->dv = t[2].cols;
    w->d_out = t[3].data != NULL ? t[3].cols : w->dv;
    w->wq = t[0].data;
    w->wk = t[1].data;
    w->wv = t[2].data;
    w->wo = t[3].data;
    w->bq = bias[0];
    w->bk = bias[1];
    w->bv = bias[2];
    w->bo = bias[3];
    return 0;
}

int request_decode_weight_set(const json_t *root, size_t max_elements, attn_weights *w,
                              size_t *heads, int *out_in, attn_error *err)
{
    /* The read-only members of a GET answer are accepted and ignored, so that
     * what GET returns can be PUT back unchanged. */
    static const char *const known[] = {"wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo",
                                        "weights_layout", "heads", "name", "shapes",
                                        "parameters", "size_bytes", "stored_at"};
    static const char *const wlayouts[] = {"in_out", "out_in"};
    memset(w, 0, sizeof *w);
    *heads = 0;
    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The body is %s; it must be a JSON object {\"wq\", \"wk\", \"wv\", and "
                         "optionally \"bq\", \"bk\", \"bv\", \"wo\", \"bo\", \"weights_layout\", "
                         "\"heads\"}.", json_kind(root));
    int rc = check_known_fields(root, "", known, sizeof known / sizeof known[0], err);
    if (rc != 0 || (rc = decode_enum(root, "weights_layout", wlayouts, 2, 0, out_in, err)) != 0)
        return rc;
    /* null: no heads, as GET shows it */
    if ((rc = decode_heads(root, 1, heads, err)) != 0)
        return rc;
    /* The weights members alone, for the shared decoder. */
    json_t *members = json_object();
    if (members == NULL)
        return error_nomem(err);
    for (int i = 0; i < 8; i++) {
        json_t *m = json_object_get(root, known[i]);
        if (m != NULL && json_object_set(members, known[i], m) != 0) {
            json_decref(members);
            return error_nomem(err);
        }
    }
    size_t elements = 0;
    rc = request_decode_weights(members, "", *out_in, 0, 0, NULL, max_elements, &elements, w, err);
    json_decref(members);
    if (rc != 0)
        return rc;
    if (*heads != 0 && (w->dk % *heads != 0 || w->dv % *heads != 0)) {
        rc = error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "heads",
                       "heads = %zu does not divide dk = %zu and dv = %zu (the widths of wq/wk "
                       "and of wv).", *heads, w->dk, w->dv);
        request_weights_free(w);
    }
    return rc;
}

/* ---- the request ------------------------------------------------------- */

void request_free(attn_request *req)
{
    if (req == NULL)
        return;
    mem_free(req->x);
    mem_free(req->context);
    mem_free(req->q);
    mem_free(req->k);
    mem_free(req->v);
    mem_free(req->mask);
    request_weights_free(&req->weights);
    memset(req, 0, sizeof *req);
}

/* Checks heads against the widths dk and dv of the job. */
static int check_heads(const attn_request *req, size_t dk, size_t dv, attn_error *err)
{
    size_t h = req->job.heads;
    if (dk % h != 0)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "heads",
                         "heads = %zu does not divide dk = %zu (the width of queries and keys); "
                         "choose a divisor of %zu.", h, dk, dk);
    if (dv % h != 0)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "heads",
                         "heads = %zu does not divide dv = %zu (the width of values); choose a "
                         "divisor of %zu.", h, dv, dv);
    return 0;
}

int request_bind_weights(attn_request *req, const attn_weights *w, int named, attn_error *err)
{
    const char *feat = req->columns ? "rows" : "columns";
    const char *in_axis = req->out_in ? "columns" : "rows";
    if (w->d_in != req->x_width)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", named ? "x" : "weights.wq",
                         "x has %zu features per token (its %s) but weights.wq expects %zu "
                         "(its %s).", req->x_width, feat, w->d_in, named ? "inputs" : in_axis);
    if (w->d_ctx != req->ctx_width) {
        const char *src = req->job.context != NULL ? "context" : "x";
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         named ? src : "weights.wk",
                         "%s has %zu features per token (its %s) but weights.wk and weights.wv "
                         "expect %zu (their %s).", src, req->ctx_width, feat, w->d_ctx,
                         named ? "inputs" : in_axis);
    }
    int rc = check_heads(req, w->dk, w->dv, err);
    if (rc != 0)
        return rc;
    req->job.weights = w;
    req->job.dk = w->dk;
    req->job.dv = w->dv;
    if (!req->scale_given)
        req->job.scale = 1.0 / sqrt((double)(w->dk / req->job.heads));
    return 0;
}

size_t request_result_elements(const attn_request *req)
{
    const attn_job *j = &req->job;
    size_t out = 0, attn = 0, total = 0;
    if (mem_mul(j->batch, j->lq, attention_output_width(j), &out) != 0)
        return (size_t)-1;
    if (j->want_attention &&
        (mem_mul(j->batch, j->heads, j->lq, &attn) != 0 || mem_mul(attn, j->lk, 1, &attn) != 0))
        return (size_t)-1;
    if (__builtin_add_overflow(out, attn, &total))
        return (size_t)-1;
    return total;
}

/* Checks the batch axis of `t` (named `name`) against the reference input. */
static int check_batch(const tensor *t, const char *name, const tensor *ref, const char *ref_name,
                       attn_error *err)
{
    if (t->rank != ref->rank)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", name,
                         "%s is %d-D but %s is %d-D; give all inputs a leading batch axis, or none.",
                         name, t->rank, ref_name, ref->rank);
    if (t->batch != ref->batch)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", name,
                         "%s has a batch of %zu but %s has %zu; batch sizes must agree.", name,
                         t->batch, ref_name, ref->batch);
    return 0;
}

/* The body of request_decode; on failure the caller frees what req holds. */
static int request_decode_into(const json_t *root, const request_limits *limits,
                               attn_request *req, attn_error *err)
{
    static const char *const known[] = {"q", "k", "v", "x", "context", "weights", "heads",
                                        "causal", "mask", "scale", "layout", "weights_layout",
                                        "dtype", "return_attention"};
    static const char *const layouts[] = {"rows", "columns"};
    static const char *const wlayouts[] = {"in_out", "out_in"};
    static const char *const dtypes[] = {"float64", "float32"};
    attn_job *job = &req->job;
    int rc;

    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The body is %s; it must be a JSON object with the request's fields "
                         "(q, k, v or x and weights).", json_kind(root));
    if ((rc = check_known_fields(root, "", known, sizeof known / sizeof known[0], err)) != 0)
        return rc;

    /* Scalars first: they are cheap and shape the rest. */
    int layout, wlayout, dtype, causal, want_attention;
    if ((rc = decode_enum(root, "layout", layouts, 2, 0, &layout, err)) != 0 ||
        (rc = decode_enum(root, "weights_layout", wlayouts, 2, 0, &wlayout, err)) != 0 ||
        (rc = decode_enum(root, "dtype", dtypes, 2, 0, &dtype, err)) != 0 ||
        (rc = decode_bool(root, "causal", 0, &causal, err)) != 0 ||
        (rc = decode_bool(root, "return_attention", 1, &want_attention, err)) != 0)
        return rc;
    req->columns = layout == 1;
    req->out_in = wlayout == 1;
    req->weights_layout_given = json_object_get(root, "weights_layout") != NULL;
    job->dtype = dtype == 1 ? ATTN_FLOAT32 : ATTN_FLOAT64;
    job->causal = causal;
    job->want_attention = want_attention;
    size_t heads;
    if ((rc = decode_heads(root, 0, &heads, err)) != 0)
        return rc;
    req->heads_given = heads != 0;
    job->heads = heads != 0 ? heads : 1;
    const json_t *scale = json_object_get(root, "scale");
    req->scale_given = scale != NULL;
    if (req->scale_given) {
        if (!json_is_number(scale))
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", "scale",
                             "scale is %s; it must be a number > 0.", json_kind(scale));
        job->scale = json_number_value(scale);
        if (!(job->scale > 0) || !isfinite(job->scale))
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", "scale",
                             "scale is %g; it must be a number > 0 (it multiplies q k^T).",
                             job->scale);
    }

    /* Which form: q/k/v, or x with weights. */
    const json_t *jx = json_object_get(root, "x"), *jctx = json_object_get(root, "context");
    const json_t *jw = json_object_get(root, "weights");
    const json_t *jqkv[3] = {json_object_get(root, "q"), json_object_get(root, "k"),
                             json_object_get(root, "v")};
    static const char *const qkv_names[3] = {"q", "k", "v"};
    int any_qkv = jqkv[0] || jqkv[1] || jqkv[2];
    if (jx != NULL && any_qkv)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "x",
                         "The request has both x and %s; give either x with weights, or q, k "
                         "and v.", jqkv[0] ? "q" : jqkv[1] ? "k" : "v");
    if (jx == NULL && !any_qkv)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "q",
                         "The request has neither q, k, v nor x; give q, k and v, or x with weights.");
    decode_ctx ctx = {limits->max_elements, &req->input_elements, req->columns};
    const char *tok = req->columns ? "columns" : "rows", *feat = req->columns ? "rows" : "columns";
    tensor first;

    if (any_qkv) {
        if (jctx != NULL)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "context",
                             "context is only used with x (keys and values are made from it); "
                             "with q, k and v, leave it out.");
        if (jw != NULL)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights",
                             "weights are only used with x; q, k and v are already projected.");
        for (int i = 0; i < 3; i++)
            if (jqkv[i] == NULL)
                return error_set(err, ERR_BAD_REQUEST, "missing_field", qkv_names[i],
                                 "%s is missing; q, k and v go together.", qkv_names[i]);
        tensor t[3];
        double **dest[3] = {&req->q, &req->k, &req->v};
        for (int i = 0; i < 3; i++) {
            if ((rc = tensor_decode(&ctx, jqkv[i], qkv_names[i], 3, ELEM_NUMBER, 1, &t[i], err)) != 0)
                return rc;
            *dest[i] = t[i].data;
            if (i > 0 && (rc = check_batch(&t[i], qkv_names[i], &t[0], "q", err)) != 0)
                return rc;
        }
        if (t[1].cols != t[0].cols)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "k",
                             "k has %zu %s but q has %zu (both must be dk).", t[1].cols, feat,
                             t[0].cols);
        if (t[2].rows != t[1].rows)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "v",
                             "v has %zu %s but k has %zu (both must be Lk, one per key).",
                             t[2].rows, tok, t[1].rows);
        job->batch = t[0].batch;
        job->lq = t[0].rows;
        job->lk = t[1].rows;
        job->dk = t[0].cols;
        job->dv = t[2].cols;
        job->q = req->q;
        job->k = req->k;
        job->v = req->v;
        if ((rc = check_heads(req, job->dk, job->dv, err)) != 0)
            return rc;
        if (!req->scale_given)
            job->scale = 1.0 / sqrt((double)(job->dk / job->heads));
        first = t[0];
    } else {
        if (jw == NULL)
            return error_set(err, ERR_BAD_REQUEST, "missing_field", "weights",
                             "weights is missing; with x, give weights {\"wq\", \"wk\", \"wv\"} "
                             "or the name of a stored weight set.");
        tensor tx, tc;
        if ((rc = tensor_decode(&ctx, jx, "x", 3, ELEM_NUMBER, 1, &tx, err)) != 0)
            return rc;
        req->x = tx.data;
        job->batch = tx.batch;
        job->lq = job->lk = tx.rows;
        req->x_width = req->ctx_width = tx.cols;
        if (jctx != NULL) {
            if ((rc = tensor_decode(&ctx, jctx, "context", 3, ELEM_NUMBER, 1, &tc, err)) != 0)
                return rc;
            req->context = tc.data;
            if ((rc = check_batch(&tc, "context", &tx, "x", err)) != 0)
                return rc;
            job->lk = tc.rows;
            req->ctx_width = tc.cols;
        }
        job->x = req->x;
        job->context = req->context;
        req->batched = tx.rank == 3;
        first = tx;
        if (json_is_string(jw)) {
            const char *name = json_string_value(jw);
            if (!request_valid_name(name))
                return error_set(err, ERR_BAD_REQUEST, "invalid_value", "weights",
                                 "weights is \"%.64s\", which is not a valid weight-set name "
                                 "(1-64 of A-Z a-z 0-9 . _ -).", name);
            snprintf(req->weights_name, sizeof req->weights_name, "%s", name);
        } else {
            if ((rc = request_decode_weights(jw, "weights", req->out_in, req->x_width,
                                             req->ctx_width, jctx ? "context" : "x",
                                             limits->max_elements, &req->input_elements,
                                             &req->weights, err)) != 0)
                return rc;
            req->has_inline_weights = 1;
            if ((rc = request_bind_weights(req, &req->weights, 0, err)) != 0)
                return rc;
        }
    }
    req->batched = first.rank == 3;

    /* The mask: [query][key], optionally batched. */
    const json_t *jm = json_object_get(root, "mask");
    if (jm != NULL) {
        tensor tm;
        if ((rc = tensor_decode(&ctx, jm, "mask", 3, ELEM_MASK, 0, &tm, err)) != 0)
            return rc;
        size_t n = tm.batch * tm.rows * tm.cols;
        req->mask = mem_malloc(n);
        if (req->mask == NULL) {
            mem_free(tm.data);
            return error_nomem(err);
        }
        for (size_t i = 0; i < n; i++)
            req->mask[i] = tm.data[i] != 0.0;
        mem_free(tm.data);
        if (tm.rank == 3 && !req->batched)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "mask",
                             "mask is 3-D but the inputs have no batch axis; give mask as Lq x Lk "
                             "= %zu x %zu.", job->lq, job->lk);
        if (tm.rank == 3 && tm.batch != job->batch)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "mask",
                             "mask has a batch of %zu but the inputs have %zu.", tm.batch, job->batch);
        if (tm.rows != job->lq || tm.cols != job->lk)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "mask",
                             "mask is %zu x %zu but it must be Lq x Lk = %zu x %zu (one row per "
                             "query, one column per key, whatever the layout).", tm.rows, tm.cols,
                             job->lq, job->lk);
        job->mask = req->mask;
        job->mask_batched = tm.rank == 3;
    }
    return 0;
}

int request_decode(const json_t *root, const request_limits *limits, attn_request *req,
                   attn_error *err)
{
    memset(req, 0, sizeof *req);
    int rc = request_decode_into(root, limits, req, err);
    if (rc != 0) {
        request_free(req);
        return rc;
    }
    return 0;
}

/* ---- the response ------------------------------------------------------ */

static void write_number(jw_buf *w, int f32, double v)
{
    if (f32)
        jw_float(w, v);
    else
        jw_double(w, v);
}

/* Writes rows x cols matrix m as nested arrays, transposed when `transpose`. */
static void write_matrix(jw_buf *w, int f32, const double *m, size_t rows, size_t cols,
                         int transpose)
{
    size_t out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
    jw_char(w, '[');
    for (size_t r = 0; r < out_rows; r++) {
        jw_raw(w, r ? ",[" : "[");
        for (size_t c = 0; c < out_cols; c++) {
            if (c)
                jw_char(w, ',');
            write_number(w, f32, transpose ? m[c * cols + r] : m[r * cols + c]);
        }
        jw_char(w, ']');
    }
    jw_char(w, ']');
}

void request_encode_weight_set(const weight_set *set, int with_arrays, jw_buf *w)
{
    static const char *const names[8] = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"};
    const attn_weights *wt = &set->w;
    const double *arrays[8] = {wt->wq, wt->wk, wt->wv, wt->wo, wt->bq, wt->bk, wt->bv, wt->bo};
    /* in_out rows x cols of each matrix */
    size_t rows[4] = {wt->d_in, wt->d_ctx, wt->d_ctx, wt->dv};
    size_t cols[4] = {wt->dk, wt->dk, wt->dv, wt->d_out};
    size_t lens[4] = {wt->dk, wt->dk, wt->dv, wt->d_out};
    jw_raw(w, "{\"name\":");
    jw_string(w, set->name);
    jw_raw(w, ",\"heads\":");
    if (set->heads)
        jw_size(w, set->heads);
    else
        jw_raw(w, "null");
    jw_raw(w, ",\"weights_layout\":");
    jw_string(w, set->out_in ? "out_in" : "in_out");
    jw_raw(w, ",\"shapes\":{");
    int first = 1;
    for (int i = 0; i < 8; i++) {
        if (arrays[i] == NULL)
            continue;
        jw_raw(w, first ? "\"" : ",\"");
        first = 0;
        jw_raw(w, names[i]);
        jw_raw(w, "\":[");
        if (i < 4) {
            jw_size(w, set->out_in ? cols[i] : rows[i]);
            jw_char(w, ',');
            jw_size(w, set->out_in ? rows[i] : cols[i]);
        } else {
            jw_size(w, lens[i - 4]);
        }
        jw_char(w, ']');
    }
    size_t parameters = 0;
    for (int i = 0; i < 4; i++)
        if (arrays[i] != NULL)
            parameters += rows[i] * cols[i];
    for (int i = 4; i < 8; i++)
        if (arrays[i] != NULL)
            parameters += lens[i - 4];
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
    if (with_arrays) {
        for (int i = 0; i < 8; i++) {
            if (arrays[i] == NULL)
                continue;
            jw_raw(w, ",\"");
            jw_raw(w, names[i]);
            jw_raw(w, "\":");
            if (i < 4) {
                write_matrix(w, 0, arrays[i], rows[i], cols[i], set->out_in);
            } else {
                jw_char(w, '[');
                for (size_t j = 0; j < lens[i - 4]; j++) {
                    if (j)
                        jw_char(w, ',');
                    jw_double(w, arrays[i][j]);
                }
                jw_char(w, ']');
            }
        }
    }
    jw_char(w, '}');
}

void request_encode_response(const attn_request *req, const attn_result *result,
                             double compute_ms, jw_buf *w)
{
    const attn_job *j = &req->job;
    int f32 = j->dtype == ATTN_FLOAT32;
    size_t d_out = result->d_out;
    jw_raw(w, "{\"output\":");
    if (req->batched)
        jw_char(w, '[');
    for (size_t b = 0; b < j->batch; b++) {
        if (b)
            jw_char(w, ',');
        write_matrix(w, f32, result->output + b * j->lq * d_out, j->lq, d_out, req->columns);
    }
    if (req->batched)
        jw_char(w, ']');
    if (j->want_attention) {
        jw_raw(w, ",\"attention\":");
        if (req->batched)
            jw_char(w, '[');
        for (size_t b = 0; b < j->batch; b++) {
            if (b)
                jw_char(w, ',');
            if (req->heads_given)
                jw_char(w, '[');
            for (size_t h = 0; h < j->heads; h++) {
                if (h)
                    jw_char(w, ',');
                write_matrix(w, f32, result->attention + (b * j->heads + h) * j->lq * j->lk, j->lq,
                             j->lk, 0);
            }
            if (req->heads_given)
                jw_char(w, ']');
        }
        if (req->batched)
            jw_char(w, ']');
    }
    jw_raw(w, ",\"meta\":{\"dtype\":");
    jw_string(w, f32 ? "float32" : "float64");
    jw_raw(w, ",\"scale\":");
    jw_double(w, j->scale);
    jw_raw(w, ",\"layout\":");
    jw_string(w, req->columns ? "columns" : "rows");
    jw_raw(w, ",\"batch\":");
    if (req->batched)
        jw_size(w, j->batch);
    else
        jw_raw(w, "null");
    jw_raw(w, ",\"heads\":");
    if (req->heads_given)
        jw_size(w, j->heads);
    else
        jw_raw(w, "null");
    jw_raw(w, ",\"lq\":");
    jw_size(w, j->lq);
    jw_raw(w, ",\"lk\":");
    jw_size(w, j->lk);
    jw_raw(w, ",\"dk\":");
    jw_size(w, j->dk / j->heads);
    jw_raw(w, ",\"dv\":");
    jw_size(w, j->dv / j->heads);
    jw_raw(w, ",\"d_out\":");
    jw_size(w, d_out);
    if (req->weights_name[0]) {
        jw_raw(w, ",\"weights\":");
        jw_string(w, req->weights_name);
    }
    jw_raw(w, ",\"compute_ms\":");
    jw_double(w, round(compute_ms * 1000) / 1000);
    jw_raw(w, "}}");
}

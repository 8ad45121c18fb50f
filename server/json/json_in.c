/*
 * json_in.c - reading numbers and small fields out of a parsed JSON body.
 *
 * A matrix is read in two steps: a scan that learns its rank and dimensions
 * and rejects ragged or mistyped nesting without allocating, then (once the
 * running count of numbers is within the budget) a fill that copies the
 * numbers into a freshly allocated row-major array and checks each element.
 * Paths in errors ("q[2][1]") are formatted only when there is an error, so
 * a valid request costs no snprintf per row.
 */
#include "json_in.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"

const char *json_in_kind(const json_t *v)
{
    scalar s = json_in_scalar(v);
    if (s.kind == SCALAR_ABSENT) /* as jansson's json_typeof(NULL) reads */
        s.kind = SCALAR_NULL;
    return scalar_kind_words(&s);
}

scalar json_in_scalar(const json_t *v)
{
    if (v == NULL)
        return (scalar){.kind = SCALAR_ABSENT};
    switch (json_typeof(v)) {
    case JSON_OBJECT: return (scalar){.kind = SCALAR_OBJECT, .size = json_object_size(v)};
    case JSON_ARRAY: return (scalar){.kind = SCALAR_ARRAY, .size = json_array_size(v)};
    case JSON_STRING:
        return (scalar){.kind = SCALAR_STRING, .string = json_string_value(v),
                        .size = json_string_length(v)};
    case JSON_INTEGER: return scalar_integer(json_integer_value(v));
    case JSON_REAL: return scalar_real(json_real_value(v));
    case JSON_TRUE: return scalar_bool(1);
    case JSON_FALSE: return scalar_bool(0);
    default: return (scalar){.kind = SCALAR_NULL};
    }
}

int json_in_whole(const json_t *v, double lo, double hi, double *out)
{
    scalar s = json_in_scalar(v);
    return scalar_whole(&s, lo, hi, out);
}

/* ---- matrices ---------------------------------------------------------- */

/* Learns the rank (min_rank..max_rank) and dimensions of the nested arrays v
 * at `path`, checking every level is an array of the same length.  Elements
 * are not looked at.  Counts the numbers into budget and fails with 413 past the
 * limit. */
static int tensor_scan(const json_in_budget *budget, const json_t *v, const char *path,
                       int max_rank, json_in_tensor *t, attn_error *err)
{
    const char *example = max_rank == 3 ? "a matrix (an array of rows, each an array of numbers) "
                                          "or a batch of such matrices"
                                        : "a matrix (an array of rows, each an array of numbers)";
    memset(t, 0, sizeof *t);
    if (!json_is_array(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path, "%s is %s; it must be %s.", path,
                         json_in_kind(v), example);
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
                                     "must be a matrix of the same shape.", mpath, json_in_kind(mat), path);
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
                                 "array of the same length.", at, json_in_kind(row), ref);
            return error_set(err, ERR_BAD_REQUEST, "ragged_matrix", at,
                             "%s has %zu numbers but %s has %zu; all rows must have the "
                             "same length.", at, json_array_size(row), ref, t->cols);
        }
    }
    size_t n;
    if (mem_mul(t->batch, t->rows, t->cols, &n) != 0 || n > budget->max_elements ||
        *budget->elements + n > budget->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                         "The request holds more than %zu numbers (reached at %s), the server's "
                         "limit (--max-elements); send fewer or smaller matrices.",
                         budget->max_elements, path);
    *budget->elements += n;
    return 0;
}

/* Allocates t->data and copies the elements of v (already scanned into t)
 * into it, checking each is a number (JSON_IN_NUMBER) or a boolean or 0/1
 * (JSON_IN_MASK, stored as 0.0/1.0). */
static int tensor_fill(const json_t *v, const char *path, json_in_elem kind, json_in_tensor *t,
                       attn_error *err)
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
                } else if (kind == JSON_IN_MASK && json_is_boolean(e)) {
                    value = json_is_true(e) ? 1.0 : 0.0;
                } else {
                    value = NAN;
                }
                int ok = kind == JSON_IN_NUMBER ? !isnan(value) : (value == 0.0 || value == 1.0);
                if (!ok || !isfinite(value)) {
                    char at[200];
                    if (t->rank == 3)
                        snprintf(at, sizeof at, "%.60s[%zu][%zu][%zu]", path, b, r, c);
                    else
                        snprintf(at, sizeof at, "%.60s[%zu][%zu]", path, r, c);
                    mem_free(t->data);
                    t->data = NULL;
                    if (kind == JSON_IN_MASK && json_is_number(e))
                        return error_set(err, ERR_BAD_REQUEST, "invalid_value", at,
                                         "%s is %g; mask entries must be true/false or 1/0 "
                                         "(1 = may attend).", at, value);
                    if (kind == JSON_IN_MASK)
                        return error_set(err, ERR_BAD_REQUEST, "invalid_value", at,
                                         "%s is %s; mask entries must be true/false or 1/0 "
                                         "(1 = may attend).", at, json_in_kind(e));
                    return error_set(err, ERR_BAD_REQUEST, "wrong_type", at,
                                     "%s is %s; %s.", at, json_in_kind(e),
                                     kind == JSON_IN_MASK ? "mask entries must be true/false or 1/0"
                                                       : "matrix entries must be numbers");
                }
                *out++ = value;
            }
        }
    }
    return 0;
}

/* Transposes every matrix of t in place (rows <-> cols). */
static int tensor_transpose(json_in_tensor *t, attn_error *err)
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

/* Copies the numbers a, read by json_fast and already known to be a matrix
 * or batch that max_rank allows, into t, counting them against budget as
 * tensor_scan does.  Returns 1 when some number is not what `kind` allows
 * (the caller then decodes the tree, for the error the tree gives). */
static int tensor_from_fast(const json_in_budget *budget, const json_fast_array *a,
                            const char *path, json_in_elem kind, json_in_tensor *t,
                            attn_error *err)
{
    memset(t, 0, sizeof *t);
    if (kind == JSON_IN_MASK)
        for (size_t i = 0; i < a->count; i++)
            if (a->data[i] != 0.0 && a->data[i] != 1.0)
                return 1;
    t->rank = a->depth;
    t->batch = a->depth == 3 ? a->dims[0] : 1;
    t->rows = a->dims[a->depth - 2];
    t->cols = a->dims[a->depth - 1];
    if (a->count > budget->max_elements || *budget->elements + a->count > budget->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                         "The request holds more than %zu numbers (reached at %s), the server's "
                         "limit (--max-elements); send fewer or smaller matrices.",
                         budget->max_elements, path);
    t->data = mem_malloc(a->count * sizeof(double));
    if (t->data == NULL)
        return error_nomem(err);
    memcpy(t->data, a->data, a->count * sizeof(double));
    *budget->elements += a->count;
    return 0;
}

int json_in_tensor_decode(const json_in_budget *budget, const json_t *v, const char *path,
                          int max_rank, json_in_elem kind, int transpose, json_in_tensor *t,
                          attn_error *err)
{
    const json_fast_array *a = json_fast_get(v);
    json_t *tree = NULL;
    int rc = 1;
    if (a != NULL && (a->depth == 2 || (a->depth == 3 && max_rank == 3)))
        rc = tensor_from_fast(budget, a, path, kind, t, err);
    if (rc == 1 && a != NULL) {
        /* Anything but the common case is decoded from the tree, for its errors. */
        if ((tree = json_fast_materialize(a)) == NULL)
            return error_nomem(err);
        v = tree;
    }
    if (rc == 1) {
        rc = tensor_scan(budget, v, path, max_rank, t, err);
        if (rc == 0)
            rc = tensor_fill(v, path, kind, t, err);
    }
    json_decref(tree);
    if (rc == 0 && transpose)
        rc = tensor_transpose(t, err);
    if (rc != 0) {
        mem_free(t->data);
        memset(t, 0, sizeof *t);
    }
    return rc;
}

int json_in_vector_decode(const json_in_budget *budget, const json_t *v, const char *path,
                          double **out, size_t *len, attn_error *err)
{
    *out = NULL;
    *len = 0;
    const json_fast_array *a = json_fast_get(v);
    if (a != NULL && a->depth == 1) {
        if (a->count > budget->max_elements || *budget->elements + a->count > budget->max_elements)
            return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                             "The request holds more than %zu numbers (reached at %s), the "
                             "server's limit (--max-elements).", budget->max_elements, path);
        if ((*out = mem_malloc(a->count * sizeof(double))) == NULL)
            return error_nomem(err);
        memcpy(*out, a->data, a->count * sizeof(double));
        *budget->elements += a->count;
        *len = a->count;
        return 0;
    }
    if (a != NULL) {
        /* Nested: decoded from the tree, for its error. */
        json_t *tree = json_fast_materialize(a);
        if (tree == NULL)
            return error_nomem(err);
        int rc = json_in_vector_decode(budget, tree, path, out, len, err);
        json_decref(tree);
        return rc;
    }
    if (!json_is_array(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path,
                         "%s is %s; a bias must be a flat array of numbers.", path,
                         json_in_kind(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", path,
                         "%s is empty; a bias needs one number per output.", path);
    if (n > budget->max_elements || *budget->elements + n > budget->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", path,
                         "The request holds more than %zu numbers (reached at %s), the server's "
                         "limit (--max-elements).", budget->max_elements, path);
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
                             "%s is %s; bias entries must be numbers.", at, json_in_kind(e));
        }
        data[i] = json_number_value(e);
    }
    *budget->elements += n;
    *out = data;
    *len = n;
    return 0;
}

/* ---- scalars ----------------------------------------------------------- */

int json_in_bool(const json_t *root, const char *name, int def, int *out, attn_error *err)
{
    const json_t *v = json_object_get(root, name);
    *out = def;
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", name,
                         "%s is %s; it must be true or false.", name, json_in_kind(v));
    *out = json_is_true(v);
    return 0;
}

int json_in_enum(const json_t *root, const char *name, const char *const *values,
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
                         name, json_in_kind(v), allowed);
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", name, "%s is \"%.40s\"; it must be %s.",
                     name, json_string_value(v), allowed);
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

int json_in_check_fields(const json_t *obj, const char *prefix, const char *const *known,
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

json_t *json_in_parse(const char *text, size_t len, json_fast_field tensor_field,
                      attn_error *err)
{
    if (len == 0) {
        error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                  "The body is empty; send a JSON object with the request's fields.");
        return NULL;
    }
    json_error_t jerr;
    memset(&jerr, 0, sizeof jerr);
    json_t *root = json_fast_load(text, len, JSON_IN_PARSE_FLAGS, tensor_field, &jerr);
    if (root == NULL) {
        /* jansson leaves jerr empty when it cannot even start for lack of memory. */
        if (json_error_code(&jerr) == json_error_out_of_memory || jerr.text[0] == '\0')
            error_nomem(err);
        else
            error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                      "The body is not valid JSON: %s (line %d, column %d).", jerr.text, jerr.line,
                      jerr.column);
    }
    return root;
}

/*
 * attention_json.c - decoding POST /v1/attention bodies and encoding their
 * answers.
 *
 * Scalars are read first (they are cheap and shape the rest), then which
 * form the request takes (q, k and v, or x with weights), then the matrices,
 * each through json_in.  Every rule between the matrices (q against k, k
 * against v, heads, mask, the weights' widths) is attention_request's; this
 * file only reads JSON into it, and writes the answer.
 */
#include "attention_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "request/weights_json.h"

/* What the request gave of a matrix, as the rules see it. */
static attention_input input_of(const json_in_tensor *t, const char *name)
{
    return (attention_input){name, name, t->rank, t->batch, t->rows, t->cols};
}

/* Reads the scalars: they are cheap and shape the rest. */
static int decode_scalars(const json_t *root, attention_request *req, attn_error *err)
{
    static const char *const layouts[] = {"rows", "columns"};
    static const char *const wlayouts[] = {"in_out", "out_in"};
    static const char *const dtypes[] = {"float64", "float32"};
    attn_job *job = &req->job;
    int rc, layout, wlayout, dtype, causal, want_attention;
    if ((rc = json_in_enum(root, "layout", layouts, 2, 0, &layout, err)) != 0 ||
        (rc = json_in_enum(root, "weights_layout", wlayouts, 2, 0, &wlayout, err)) != 0 ||
        (rc = json_in_enum(root, "dtype", dtypes, 2, 0, &dtype, err)) != 0 ||
        (rc = json_in_bool(root, "causal", 0, &causal, err)) != 0 ||
        (rc = json_in_bool(root, "return_attention", 1, &want_attention, err)) != 0)
        return rc;
    req->columns = layout == 1;
    req->out_in = wlayout == 1;
    req->weights_layout_given = json_object_get(root, "weights_layout") != NULL;
    job->dtype = dtype == 1 ? ATTN_FLOAT32 : ATTN_FLOAT64;
    const json_t *precision = json_object_get(root, "compute_precision");
    if (precision != NULL &&
        (rc = attention_request_set_precision(req, json_is_string(precision) ? NULL
                                                   : json_in_kind(precision),
                                              json_string_value(precision),
                                              "compute_precision", err)) != 0)
        return rc;
    job->causal = causal;
    job->want_attention = want_attention;
    size_t heads;
    if ((rc = weights_json_decode_heads(root, 0, &heads, err)) != 0)
        return rc;
    req->heads_given = heads != 0;
    job->heads = heads != 0 ? heads : 1;
    const json_t *scale = json_object_get(root, "scale");
    if (scale != NULL)
        return attention_request_set_scale(req, json_is_number(scale) ? NULL : json_in_kind(scale),
                                           json_number_value(scale), "scale", err);
    return 0;
}

/* Reads a side of attention_pool (rows or cols): a whole number 1 .. ATTN_POOL_MAX_SIDE. */
static int decode_pool_side(const json_t *obj, const char *name, size_t *out, attn_error *err)
{
    char field[32];
    snprintf(field, sizeof field, "attention_pool.%s", name);
    const json_t *v = json_object_get(obj, name);
    if (v == NULL)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", field,
                         "attention_pool needs %s: how many cells the pooled attention has "
                         "along the %s (1 to %d).", name, strcmp(name, "rows") == 0 ? "queries"
                         : "keys", ATTN_POOL_MAX_SIDE);
    return attention_request_pool_side(json_is_number(v) ? NULL : json_in_kind(v),
                                       json_number_value(v), field, out, err);
}

/* Reads attention_pool.NAME, an optional [start, end) range of whole numbers, the window
 * pooled (checked against the shapes later, by attention_request_check_pool). */
static int decode_range(const json_t *obj, const char *name, size_t *start, size_t *end,
                        attn_error *err)
{
    const json_t *r = json_object_get(obj, name);
    if (r == NULL)
        return 0;
    double a = json_number_value(json_array_get(r, 0)), b = json_number_value(json_array_get(r, 1));
    if (!json_is_array(r) || json_array_size(r) != 2 || !json_is_number(json_array_get(r, 0)) ||
        !json_is_number(json_array_get(r, 1)) || a < 0 || b < 1 || a != floor(a) ||
        b != floor(b) || a > 1e15 || b > 1e15)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", name[0] == 'q'
                         ? "attention_pool.queries" : "attention_pool.keys",
                         "attention_pool.%s must be [start, end]: whole numbers, the %s from "
                         "start up to but not including end.", name, name);
    *start = (size_t)a;
    *end = (size_t)b;
    return 0;
}

/* Reads reductions ({"entropy": true, "topk": 8, ...}, attention_reduce.h), each member by
 * attention_request's rules. */
static int decode_reductions(const json_t *root, attention_request *req, attn_error *err)
{
    static const char *const known[] = {"entropy", "max", "received", "sink", "local", "topk",
                                        "received_total"};
    const json_t *jr = json_object_get(root, "reductions");
    if (jr == NULL)
        return 0;
    if (!json_is_object(jr))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "reductions",
                         "reductions is %s; it must be an object such as {\"entropy\": true, "
                         "\"topk\": 8}.", json_in_kind(jr));
    int rc = json_in_check_fields(jr, "reductions", known, sizeof known / sizeof known[0], err);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)jr, key, v) {
        char field[ATTENTION_FIELD_MAX];
        snprintf(field, sizeof field, "reductions.%s", key);
        scalar value = json_in_scalar(v);
        if (rc == 0 && strcmp(key, "received_total") != 0) /* a sequence's: decode_sequence */
            rc = attention_request_reduce_param(req, key, &value, field, err);
    }
    return rc;
}

/* Reads return_qk and attention_pool ({"rows", "cols", "reduce"}): what the answer carries
 * beside the output. */
static int decode_extras(const json_t *root, attention_request *req, attn_error *err)
{
    static const char *const known[] = {"rows", "cols", "reduce", "queries", "keys"};
    static const char *const reduces[] = {"max", "mean"};
    int rc, want_qk;
    if ((rc = json_in_bool(root, "return_qk", 0, &want_qk, err)) != 0)
        return rc;
    req->job.want_qk = want_qk;
    const json_t *jp = json_object_get(root, "attention_pool");
    if (jp == NULL || json_is_null(jp))
        return 0;
    if (!json_is_object(jp))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "attention_pool",
                         "attention_pool is %s; it must be an object such as {\"rows\": 512, "
                         "\"cols\": 512, \"reduce\": \"max\"}.", json_in_kind(jp));
    if (json_is_false(json_object_get(root, "return_attention")))
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "attention_pool",
                         "attention_pool asks for the attention, pooled, but return_attention "
                         "is false; leave one of them out.");
    const json_t *jr = json_object_get(jp, "reduce");
    int reduce = 0;
    if (jr != NULL && (!json_is_string(jr) ||
                       (strcmp(json_string_value(jr), reduces[0]) != 0 &&
                        strcmp(json_string_value(jr), reduces[1]) != 0)))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "attention_pool.reduce",
                         "attention_pool.reduce must be \"max\" or \"mean\".");
    if (jr != NULL)
        reduce = strcmp(json_string_value(jr), "mean") == 0;
    size_t rows, cols;
    if ((rc = json_in_check_fields(jp, "attention_pool", known, 5, err)) != 0 ||
        (rc = decode_pool_side(jp, "rows", &rows, err)) != 0 ||
        (rc = decode_pool_side(jp, "cols", &cols, err)) != 0)
        return rc;
    attention_request_set_pool(req, rows, cols, reduce ? ATTN_POOL_MEAN : ATTN_POOL_MAX);
    req->pool_queries_field = "attention_pool.queries";
    req->pool_keys_field = "attention_pool.keys";
    if ((rc = decode_range(jp, "queries", &req->pool.q_start, &req->pool.q_end, err)) != 0)
        return rc;
    return decode_range(jp, "keys", &req->pool.k_start, &req->pool.k_end, err);
}

/* Checks which form the request takes, q/k/v or x with weights, and that it
 * has no member of the other; sets *qkv for the first. */
static int check_form(const json_t *root, int *qkv, attn_error *err)
{
    const json_t *jx = json_object_get(root, "x"), *jw = json_object_get(root, "weights");
    const json_t *jq = json_object_get(root, "q"), *jk = json_object_get(root, "k");
    const json_t *jv = json_object_get(root, "v");
    *qkv = jq || jk || jv;
    if (json_object_get(root, "weights_generation") != NULL && !json_is_string(jw))
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights_generation",
                         "weights_generation applies only when weights names a stored set.");
    if (jx != NULL && *qkv)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "x",
                         "The request has both x and %s; give either x with weights, or q, k "
                         "and v.", jq ? "q" : jk ? "k" : "v");
    if (jx == NULL && !*qkv)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "q",
                         "The request has neither q, k, v nor x; give q, k and v, or x with "
                         "weights.");
    if (*qkv && json_object_get(root, "context") != NULL)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "context",
                         "context is only used with x (keys and values are made from it); "
                         "with q, k and v, leave it out.");
    if (*qkv && jw != NULL)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights",
                         "weights are only used with x; q, k and v are already projected.");
    if (!*qkv && jw == NULL)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "weights",
                         "weights is missing; with x, give weights {\"wq\", \"wk\", \"wv\"} "
                         "or the name of a stored weight set.");
    return 0;
}

/* Reads q, k and v and shapes the job from them. */
static int decode_qkv(const json_t *root, const json_in_budget *budget, attention_request *req,
                      attn_error *err)
{
    static const char *const names[3] = {"q", "k", "v"};
    double **dest[3] = {&req->q, &req->k, &req->v};
    attention_input in[3];
    int rc;
    for (int i = 0; i < 3; i++)
        if (json_object_get(root, names[i]) == NULL)
            return error_set(err, ERR_BAD_REQUEST, "missing_field", names[i],
                             "%s is missing; q, k and v go together.", names[i]);
    for (int i = 0; i < 3; i++) {
        json_in_tensor t;
        if ((rc = json_in_tensor_decode(budget, json_object_get(root, names[i]), names[i], 3,
                                         JSON_IN_NUMBER, req->columns, &t, err)) != 0)
            return rc;
        *dest[i] = t.data;
        in[i] = input_of(&t, names[i]);
        /* Checked as each arrives, so that a later input's numbers are not read in vain. */
        if (i > 0 && (rc = attention_request_check_batch(&in[i], &in[0], err)) != 0)
            return rc;
    }
    if ((rc = attention_request_shape_qkv(req, in, err)) != 0)
        return rc;
    req->job.q = req->q;
    req->job.k = req->k;
    req->job.v = req->v;
    return 0;
}

/* Reads the name of a stored set and the optional generation asked of it. */
static int decode_weights_name(const json_t *root, const char *name, attention_request *req,
                               attn_error *err)
{
    int rc = weights_check_name(name, "weights", err);
    if (rc != 0)
        return rc;
    snprintf(req->weights_name, sizeof req->weights_name, "%s", name);
    const json_t *jg = json_object_get(root, "weights_generation");
    if (jg == NULL)
        return 0;
    /* Numbers arrive as doubles: generations are below 2^53, so exact. */
    double g = json_number_value(jg);
    if (!json_is_number(jg) || !(g >= 1 && g < 9007199254740992.0) || g != (double)(uint64_t)g)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "weights_generation",
                         "weights_generation must be a whole number >= 1, the "
                         "generation a PUT of the set answered.");
    req->weights_generation = (uint64_t)g;
    return 0;
}

/* Reads x, the optional context and the weights (inline, then bound; or the
 * name of a stored set, which the caller binds). */
static int decode_x(const json_t *root, const json_in_budget *budget, attention_request *req,
                    attn_error *err)
{
    const json_t *jctx = json_object_get(root, "context"), *jw = json_object_get(root, "weights");
    json_in_tensor tx, tc;
    attention_input x, ctx;
    int rc;
    if ((rc = json_in_tensor_decode(budget, json_object_get(root, "x"), "x", 3, JSON_IN_NUMBER,
                                     req->columns, &tx, err)) != 0)
        return rc;
    req->x = tx.data;
    x = input_of(&tx, "x");
    if (jctx != NULL) {
        if ((rc = json_in_tensor_decode(budget, jctx, "context", 3, JSON_IN_NUMBER, req->columns,
                                         &tc, err)) != 0)
            return rc;
        req->context = tc.data;
        ctx = input_of(&tc, "context");
    }
    if ((rc = attention_request_shape_x(req, &x, jctx ? &ctx : NULL, err)) != 0)
        return rc;
    req->job.x = req->x;
    req->job.context = req->context;
    if (json_is_string(jw))
        return decode_weights_name(root, json_string_value(jw), req, err);
    weights_json_tokens tokens = {req->x_width, req->ctx_width, jctx ? "context" : "x"};
    if ((rc = weights_json_decode(jw, "weights", req->out_in, &tokens, budget, &req->weights,
                                  err)) != 0)
        return rc;
    req->has_inline_weights = 1;
    return attention_request_bind_weights(req, &req->weights, 0, err);
}

/* Reads the mask ([query][key], optionally batched) and checks its shape. */
static int decode_mask(const json_t *jm, const json_in_budget *budget, attention_request *req,
                       attn_error *err)
{
    json_in_tensor tm;
    int rc;
    if ((rc = json_in_tensor_decode(budget, jm, "mask", 3, JSON_IN_MASK, 0, &tm, err)) != 0)
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
    attention_input m = input_of(&tm, "mask");
    if ((rc = attention_request_shape_mask(req, &m, err)) != 0)
        return rc;
    req->job.mask = req->mask;
    return 0;
}

/* The boolean member `name` of obj (absent: false) into *out; 400 "wrong_type" at field. */
static int member_flag(const json_t *obj, const char *name, const char *field, int *out,
                       attn_error *err)
{
    const json_t *v = json_object_get(obj, name);
    *out = json_is_true(v);
    if (v == NULL || json_is_boolean(v))
        return 0;
    return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                     "%s is %s; it must be true or false.", field, json_in_kind(v));
}

/* "sequence": {"id", "start", "end", and a start's cache policy} and
 * reductions.received_total, by request/sequence_step.h's rules, with v1's places for its
 * faults. */
static int decode_sequence(const json_t *root, sequence_ask *a, attn_error *err)
{
    static const char *const known[3 + SEQUENCE_POLICY_PARAMS] = {
        "id", "start", "end", "cache_policy", "cache_sink", "cache_window", "cache_budget",
        "cache_recent", "cache_pool", "compare_full"};
    *a = (sequence_ask){.id_field = "sequence.id", .start_field = "sequence.start",
                        .end_field = "sequence.end",
                        .received_total_field = "reductions.received_total",
                        .heads_field = "heads", .scale_field = "scale", .dtype_field = "dtype",
                        .mask_field = "mask", .context_field = "context", .q_field = "q",
                        .k_field = "k", .v_field = "v", .policy_prefix = "sequence."};
    a->causal_given = json_object_get(root, "causal") != NULL;
    const json_t *jr = json_object_get(root, "reductions");
    int rc;
    if (json_is_object(jr) && (rc = member_flag(jr, "received_total", a->received_total_field,
                                                &a->received_total, err)) != 0)
        return rc;
    a->received_asked = json_is_object(jr) && json_is_true(json_object_get(jr, "received"));
    const json_t *js = json_object_get(root, "sequence");
    if (js != NULL) {
        if (!json_is_object(js))
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", "sequence",
                             "sequence is %s; it must be an object such as {\"id\": 7, "
                             "\"start\": true}.", json_in_kind(js));
        scalar id = json_in_scalar(json_object_get(js, "id"));
        if ((rc = json_in_check_fields(js, "sequence", known, 3 + SEQUENCE_POLICY_PARAMS,
                                       err)) != 0 ||
            (rc = sequence_ask_id(a, &id, "sequence.id", err)) != 0)
            return rc;
        if ((rc = member_flag(js, "start", a->start_field, &a->start, err)) != 0 ||
            (rc = member_flag(js, "end", a->end_field, &a->end, err)) != 0)
            return rc;
        for (int i = 0; i < SEQUENCE_POLICY_PARAMS; i++) {
            scalar v = json_in_scalar(json_object_get(js, sequence_policy_params[i]));
            if ((rc = sequence_ask_policy(a, sequence_policy_params[i], &v, err)) != 0)
                return rc;
        }
    }
    return sequence_ask_check(a, err);
}

/* The body of attention_json_decode; on failure the caller frees what req holds. */
static int decode_into(const json_t *root, const attention_json_limits *limits,
                       attention_request *req, sequence_ask *seq, attn_error *err)
{
    static const char *const known[] = {"q", "k", "v", "x", "context", "weights", "heads",
                                        "causal", "mask", "scale", "layout", "weights_layout",
                                        "dtype", "return_attention", "weights_generation",
                                        "attention_pool", "return_qk", "reductions",
                                        "sequence", "compute_precision"};
    int rc, qkv;
    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The body is %s; it must be a JSON object with the request's fields "
                         "(q, k, v or x and weights).", json_in_kind(root));
    if ((rc = json_in_check_fields(root, "", known, sizeof known / sizeof known[0], err)) != 0 ||
        (rc = decode_scalars(root, req, err)) != 0 || (rc = decode_extras(root, req, err)) != 0 ||
        (rc = decode_reductions(root, req, err)) != 0 ||
        (rc = decode_sequence(root, seq, err)) != 0 || (rc = check_form(root, &qkv, err)) != 0)
        return rc;
    json_in_budget budget = {limits->max_elements, &req->input_elements};
    rc = qkv ? decode_qkv(root, &budget, req, err) : decode_x(root, &budget, req, err);
    if (rc != 0)
        return rc;
    const json_t *jm = json_object_get(root, "mask");
    if (jm != NULL && seq->in_sequence)
        return sequence_step_no_mask(seq, err);
    if (jm != NULL && (rc = decode_mask(jm, &budget, req, err)) != 0)
        return rc;
    if (seq->in_sequence)   /* against the whole cache, once the step is shaped */
        return 0;
    if ((rc = attention_request_check_pool(req, err)) != 0)
        return rc;
    return attention_request_check_reduce(req, err);
}

int attention_json_tensor_field(const char *name, size_t len)
{
    static const char *const matrices[] = {"q", "k", "v", "x", "context", "mask"};
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
        if (strlen(matrices[i]) == len && memcmp(matrices[i], name, len) == 0)
            return 1;
    return weights_part_named(name, len);
}

int attention_json_decode(const json_t *root, const attention_json_limits *limits,
                          attention_request *req, sequence_ask *seq, attn_error *err)
{
    attention_request_init(req);
    int rc = decode_into(root, limits, req, seq, err);
    if (rc != 0) {
        attention_request_free(req);
        return rc;
    }
    return 0;
}

/* ---- the response ------------------------------------------------------ */

/* Writes one value per (batch, head), [batch][head] only where the request had those axes
 * (the shape of "attention", which the reductions share): head(ctx, bh, w) writes the value
 * of head bh (batch * heads + head). */
static void encode_heads(const attention_request *req, jw_buf *w,
                         void (*head)(const void *ctx, size_t bh, jw_buf *w), const void *ctx)
{
    const attn_job *j = &req->job;
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
            head(ctx, b * j->heads + h, w);
        }
        if (req->heads_given)
            jw_char(w, ']');
    }
    if (req->batched)
        jw_char(w, ']');
}

typedef struct attention_ctx {
    const attention_request *req;
    const attn_result *result;
} attention_ctx;

/* The attention of head bh: the pooled grid, or the Lq x Lk weights in the job's
 * precision. */
static void encode_head(const void *ctx, size_t bh, jw_buf *w)
{
    const attention_ctx *c = ctx;
    const attn_job *j = &c->req->job;
    if (j->pool != NULL) {
        size_t br, bc, gr, gc;
        attention_pool_grid(j->pool, j->lq, j->lk, &br, &bc, &gr, &gc);
        jw_matrix(w, c->result->pooled + bh * gr * gc, gr, gc, 0, j->dtype == ATTN_FLOAT32);
    } else if (j->dtype == ATTN_FLOAT32) {
        jw_matrix_f32(w, c->result->attention_f32 + bh * j->lq * j->lk, j->lq, j->lk, 0, 1);
    } else {
        jw_matrix(w, c->result->attention + bh * j->lq * j->lk, j->lq, j->lk, 0, 0);
    }
}

/* "attention", full or pooled. */
static void encode_attention(const attention_request *req, const attn_result *result,
                             jw_buf *w)
{
    attention_ctx c = {req, result};
    jw_raw(w, ",\"attention\":");
    encode_heads(req, w, encode_head, &c);
}

/* n numbers (k per row when k > 0: n / k rows), as a list or a list of rows. */
static void encode_numbers(jw_buf *w, const double *d, const int64_t *ix, size_t n, size_t k,
                           int as_float)
{
    jw_char(w, '[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            jw_char(w, ',');
        if (k > 0 && i % k == 0)
            jw_char(w, '[');
        if (ix != NULL && ix[i] < 0)
            jw_raw(w, "-1");
        else if (ix != NULL)
            jw_size(w, (size_t)ix[i]);
        else if (as_float)
            jw_float(w, d[i]);
        else
            jw_double(w, d[i]);
        if (k > 0 && i % k == k - 1)
            jw_char(w, ']');
    }
    jw_char(w, ']');
}

/* One reduction's numbers: per head n of d (or of ix, for indices), k per row when k > 0. */
typedef struct reduced_ctx {
    const double *d;
    const int64_t *ix;
    size_t n, k;
    int as_float;
} reduced_ctx;

static void encode_reduced_head(const void *ctx, size_t bh, jw_buf *w)
{
    const reduced_ctx *c = ctx;
    size_t at = bh * c->n;
    encode_numbers(w, c->d != NULL ? c->d + at : NULL, c->ix != NULL ? c->ix + at : NULL, c->n,
                   c->k, c->as_float);
}

/* One reduction, `name`: per (batch, head) `per` numbers (rows of k when k > 0), with the
 * batch and heads axes where "attention" has them. */
static void encode_reduced(const attention_request *req, const char *name, const double *d,
                           const int64_t *ix, size_t per, size_t k, int *first, jw_buf *w)
{
    if (d == NULL && ix == NULL)
        return;
    reduced_ctx c = {d, ix, per * (k > 0 ? k : 1), k, req->job.dtype == ATTN_FLOAT32};
    if (!*first)
        jw_char(w, ',');
    *first = 0;
    jw_string(w, name);
    jw_char(w, ':');
    encode_heads(req, w, encode_reduced_head, &c);
}

/* "reductions": the statistics asked for (attention_reduce.h), each shaped like "attention"
 * with its last axis reduced (received: its query axis). */
static void encode_reductions(const attention_request *req, const attn_result *result,
                              const attention_json_sequence *seq, jw_buf *w)
{
    const attn_job *j = &req->job;
    const attn_reduced *r = &result->reduced;
    size_t k = j->reduce != NULL ? j->reduce->topk : 0;
    int first = 1;
    jw_raw(w, ",\"reductions\":{");
    encode_reduced(req, "entropy", r->entropy, NULL, j->lq, 0, &first, w);
    encode_reduced(req, "max_weight", r->max_weight, NULL, j->lq, 0, &first, w);
    encode_reduced(req, "argmax", NULL, r->argmax, j->lq, 0, &first, w);
    encode_reduced(req, "received", r->received, NULL, j->lk, 0, &first, w);
    encode_reduced(req, "sink", r->sink, NULL, j->lq, 0, &first, w);
    encode_reduced(req, "local", r->local, NULL, j->lq, 0, &first, w);
    encode_reduced(req, "topk_indices", NULL, r->topk_indices, j->lq, k, &first, w);
    encode_reduced(req, "topk_weights", r->topk_weights, NULL, j->lq, k, &first, w);
    if (seq != NULL)
        encode_reduced(req, "received_total", seq->step->received_total, NULL,
                       (size_t)seq->step->length, 0, &first, w);
    jw_char(w, '}');
}

/* q or k after the projections, shaped like the output (batch axis, layout). */
static void encode_tokens(const attention_request *req, const char *name, const double *a,
                          size_t tokens, jw_buf *w)
{
    const attn_job *j = &req->job;
    jw_raw(w, ",\"");
    jw_raw(w, name);
    jw_raw(w, "\":");
    if (req->batched)
        jw_char(w, '[');
    for (size_t b = 0; b < j->batch; b++) {
        if (b)
            jw_char(w, ',');
        jw_matrix(w, a + b * tokens * j->dk, tokens, j->dk, req->columns,
                  j->dtype == ATTN_FLOAT32);
    }
    if (req->batched)
        jw_char(w, ']');
}

/* "sequence": the id of a sequence's step and its keys cached after it. */
static void encode_sequence(const attention_request *req, const attention_json_sequence *seq,
                            jw_buf *w)
{
    const sequence_id *id = &seq->ask->id;
    jw_raw(w, ",\"sequence\":{\"id\":");
    if (id->is_string)
        jw_string(w, id->string);
    else
        jw_size(w, (size_t)id->number);
    jw_raw(w, ",\"length\":");
    jw_size(w, (size_t)seq->step->length);
    /* under a cache policy: shaped like the reductions, the keys' or the queries' axis last */
    int first = 0;
    const sequence_step *st = seq->step;
    encode_reduced(req, "kept_positions", NULL, st->kept_positions, (size_t)st->length, 0,
                   &first, w);
    encode_reduced(req, "lost_mass", st->lost_mass, NULL, req->job.lq, 0, &first, w);
    encode_reduced(req, "output_error", st->output_error, NULL, req->job.lq, 0, &first, w);
    jw_char(w, '}');
}

void attention_json_encode(const attention_request *req, const attn_result *result,
                           double compute_ms, const attention_json_sequence *seq, jw_buf *w)
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
        jw_matrix(w, result->output + b * j->lq * d_out, j->lq, d_out, req->columns, f32);
    }
    if (req->batched)
        jw_char(w, ']');
    if (j->want_attention || j->pool != NULL)
        encode_attention(req, result, w);
    /* a sequence's step may compute received for its totals, answered only when asked */
    const attn_reduce *rd = j->reduce;
    if (seq != NULL ? seq->ask->received_asked || seq->ask->received_total ||
                          (rd != NULL && (rd->entropy || rd->max || rd->want_sink ||
                                          rd->want_local || rd->topk > 0))
                    : attention_reduce_any(rd))
        encode_reductions(req, result, seq, w);
    if (seq != NULL)
        encode_sequence(req, seq, w);
    if (j->want_qk) {
        encode_tokens(req, "q", result->q, j->lq, w);
        encode_tokens(req, "k", result->k, j->lk, w);
    }
    jw_raw(w, ",\"meta\":{\"dtype\":");
    jw_string(w, f32 ? "float32" : "float64");
    jw_raw(w, ",\"compute_precision\":");
    jw_string(w, attention_precision_name(j));
    jw_raw(w, ",\"kernel\":");
    jw_string(w, attention_kernel_path());
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
    if (j->pool != NULL) {
        size_t br, bc, gr, gc;
        attention_pool_grid(j->pool, j->lq, j->lk, &br, &bc, &gr, &gc);
        jw_raw(w, ",\"attention_pool\":{\"block_rows\":");
        jw_size(w, br);
        jw_raw(w, ",\"block_cols\":");
        jw_size(w, bc);
        jw_raw(w, ",\"reduce\":");
        jw_string(w, j->pool->reduce == ATTN_POOL_MEAN ? "mean" : "max");
        jw_char(w, '}');
    }
    jw_raw(w, ",\"compute_ms\":");
    jw_double(w, round(compute_ms * 1000) / 1000);
    jw_raw(w, "}}");
}


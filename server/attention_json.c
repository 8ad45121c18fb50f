/*
 * attention_json.c - decoding POST /v1/attention bodies and encoding their
 * answers.
 *
 * Scalars are read first (they are cheap and shape the rest), then the
 * matrices, each through json_in, then the shapes are checked against each
 * other in the order a person would read the request: q against k, k
 * against v, heads, mask.  Messages speak of the matrices as the user laid
 * them out (rows or columns).
 */
#include "attention_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mem.h"
#include "weights_json.h"

void attention_json_free(attention_json_request *req)
{
    if (req == NULL)
        return;
    mem_free(req->x);
    mem_free(req->context);
    mem_free(req->q);
    mem_free(req->k);
    mem_free(req->v);
    mem_free(req->mask);
    weights_free(&req->weights);
    memset(req, 0, sizeof *req);
}

int attention_json_bind_weights(attention_json_request *req, const attn_weights *w, int named,
                                attn_error *err)
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
    int rc = weights_check_heads(req->job.heads, w->dk, w->dv, err);
    if (rc != 0)
        return rc;
    req->job.weights = w;
    req->job.dk = w->dk;
    req->job.dv = w->dv;
    if (!req->scale_given)
        req->job.scale = weights_default_scale(w->dk, req->job.heads);
    return 0;
}

size_t attention_json_result_elements(const attention_json_request *req)
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
static int check_batch(const json_in_tensor *t, const char *name, const json_in_tensor *ref,
                       const char *ref_name, attn_error *err)
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

/* The body of attention_json_decode; on failure the caller frees what req holds. */
static int decode_into(const json_t *root, const attention_json_limits *limits,
                       attention_json_request *req, attn_error *err)
{
    static const char *const known[] = {"q", "k", "v", "x", "context", "weights", "heads",
                                        "causal", "mask", "scale", "layout", "weights_layout",
                                        "dtype", "return_attention", "weights_generation"};
    static const char *const layouts[] = {"rows", "columns"};
    static const char *const wlayouts[] = {"in_out", "out_in"};
    static const char *const dtypes[] = {"float64", "float32"};
    attn_job *job = &req->job;
    int rc;

    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The body is %s; it must be a JSON object with the request's fields "
                         "(q, k, v or x and weights).", json_in_kind(root));
    if ((rc = json_in_check_fields(root, "", known, sizeof known / sizeof known[0], err)) != 0)
        return rc;

    /* Scalars first: they are cheap and shape the rest. */
    int layout, wlayout, dtype, causal, want_attention;
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
    job->causal = causal;
    job->want_attention = want_attention;
    size_t heads;
    if ((rc = weights_json_decode_heads(root, 0, &heads, err)) != 0)
        return rc;
    req->heads_given = heads != 0;
    job->heads = heads != 0 ? heads : 1;
    const json_t *scale = json_object_get(root, "scale");
    req->scale_given = scale != NULL;
    if (req->scale_given) {
        if (!json_is_number(scale))
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", "scale",
                             "scale is %s; it must be a number > 0.", json_in_kind(scale));
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
    if (json_object_get(root, "weights_generation") != NULL && !json_is_string(jw))
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights_generation",
                         "weights_generation applies only when weights names a stored set.");
    if (jx != NULL && any_qkv)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "x",
                         "The request has both x and %s; give either x with weights, or q, k "
                         "and v.", jqkv[0] ? "q" : jqkv[1] ? "k" : "v");
    if (jx == NULL && !any_qkv)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "q",
                         "The request has neither q, k, v nor x; give q, k and v, or x with weights.");
    json_in_budget budget = {limits->max_elements, &req->input_elements};
    const char *tok = req->columns ? "columns" : "rows", *feat = req->columns ? "rows" : "columns";
    json_in_tensor first;

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
        json_in_tensor t[3];
        double **dest[3] = {&req->q, &req->k, &req->v};
        for (int i = 0; i < 3; i++) {
            if ((rc = json_in_tensor_decode(&budget, jqkv[i], qkv_names[i], 3, JSON_IN_NUMBER,
                                             req->columns, &t[i], err)) != 0)
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
        if ((rc = weights_check_heads(job->heads, job->dk, job->dv, err)) != 0)
            return rc;
        if (!req->scale_given)
            job->scale = weights_default_scale(job->dk, job->heads);
        first = t[0];
    } else {
        if (jw == NULL)
            return error_set(err, ERR_BAD_REQUEST, "missing_field", "weights",
                             "weights is missing; with x, give weights {\"wq\", \"wk\", \"wv\"} "
                             "or the name of a stored weight set.");
        json_in_tensor tx, tc;
        if ((rc = json_in_tensor_decode(&budget, jx, "x", 3, JSON_IN_NUMBER, req->columns, &tx,
                                         err)) != 0)
            return rc;
        req->x = tx.data;
        job->batch = tx.batch;
        job->lq = job->lk = tx.rows;
        req->x_width = req->ctx_width = tx.cols;
        if (jctx != NULL) {
            if ((rc = json_in_tensor_decode(&budget, jctx, "context", 3, JSON_IN_NUMBER,
                                             req->columns, &tc, err)) != 0)
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
            if (!weights_valid_name(name))
                return error_set(err, ERR_BAD_REQUEST, "invalid_value", "weights",
                                 "weights is \"%.64s\", which is not a valid weight-set name "
                                 "(1-64 of A-Z a-z 0-9 . _ -).", name);
            snprintf(req->weights_name, sizeof req->weights_name, "%s", name);
            const json_t *jg = json_object_get(root, "weights_generation");
            /* Numbers arrive as doubles: generations are below 2^53, so exact. */
            double g = json_number_value(jg);
            if (jg != NULL && (!json_is_number(jg) || !(g >= 1 && g < 9007199254740992.0) ||
                               g != (double)(uint64_t)g))
                return error_set(err, ERR_BAD_REQUEST, "invalid_value", "weights_generation",
                                 "weights_generation must be a whole number >= 1, the "
                                 "generation a PUT of the set answered.");
            req->weights_generation = jg != NULL ? (uint64_t)g : 0;
        } else {
            weights_json_tokens tokens = {req->x_width, req->ctx_width, jctx ? "context" : "x"};
            if ((rc = weights_json_decode(jw, "weights", req->out_in, &tokens, &budget,
                                          &req->weights, err)) != 0)
                return rc;
            req->has_inline_weights = 1;
            if ((rc = attention_json_bind_weights(req, &req->weights, 0, err)) != 0)
                return rc;
        }
    }
    req->batched = first.rank == 3;

    /* The mask: [query][key], optionally batched. */
    const json_t *jm = json_object_get(root, "mask");
    if (jm != NULL) {
        json_in_tensor tm;
        if ((rc = json_in_tensor_decode(&budget, jm, "mask", 3, JSON_IN_MASK, 0, &tm, err)) != 0)
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

int attention_json_tensor_field(const char *name, size_t len)
{
    static const char *const matrices[] = {"q", "k", "v", "x", "context", "mask"};
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
        if (strlen(matrices[i]) == len && memcmp(matrices[i], name, len) == 0)
            return 1;
    return weights_part_named(name, len);
}

int attention_json_decode(const json_t *root, const attention_json_limits *limits,
                          attention_json_request *req, attn_error *err)
{
    memset(req, 0, sizeof *req);
    int rc = decode_into(root, limits, req, err);
    if (rc != 0) {
        attention_json_free(req);
        return rc;
    }
    return 0;
}

/* ---- the response ------------------------------------------------------ */

void attention_json_encode(const attention_json_request *req, const attn_result *result,
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
        jw_matrix(w, result->output + b * j->lq * d_out, j->lq, d_out, req->columns, f32);
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
                size_t at = (b * j->heads + h) * j->lq * j->lk;
                if (f32)
                    jw_matrix_f32(w, result->attention_f32 + at, j->lq, j->lk);
                else
                    jw_matrix(w, result->attention + at, j->lq, j->lk, 0, 0);
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


/*
 * attention_request.c - the rules of one attention request, stated once.
 *
 * The checks run in the order a person reads a request: each input against
 * the first (rank, batch), then k against q (dk) and v against k (Lk), then
 * the heads, then the mask.  Messages speak of tokens and features; the axis
 * that holds them is named in parentheses ("its columns"), because v1 lets
 * the user lay tokens out as rows or as columns.  The error's field is the
 * place the decoder gave, so v1 says "k" and v2 "inputs[1].shape" for the
 * same words.
 */
#include "attention_request.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "json/json_in.h"

void attention_request_init(attention_request *req)
{
    memset(req, 0, sizeof *req);
    req->heads_field = "heads";
    snprintf(req->x_field, sizeof req->x_field, "x");
    snprintf(req->ctx_field, sizeof req->ctx_field, "context");
}

void attention_request_free(attention_request *req)
{
    if (req == NULL)
        return;
    mem_free(req->x);
    mem_free(req->context);
    mem_free(req->q);
    mem_free(req->k);
    mem_free(req->v);
    mem_free(req->q32);
    mem_free(req->k32);
    mem_free(req->v32);
    mem_free(req->mask);
    weights_free(&req->weights);
    memset(req, 0, sizeof *req);
}

/* The axis that holds the tokens, and the one that holds the features. */
static const char *token_axis(const attention_request *req)
{
    return req->columns ? "columns" : "rows";
}

static const char *feature_axis(const attention_request *req)
{
    return req->columns ? "rows" : "columns";
}

int attention_request_set_scale(attention_request *req, const char *not_number, double value,
                                const char *field, attn_error *err)
{
    if (not_number != NULL)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "scale is %s; it must be a number > 0.", not_number);
    if (!(value > 0) || !isfinite(value))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                         "scale is %g; it must be a number > 0 (it multiplies q k^T).", value);
    req->job.scale = value;
    req->scale_given = 1;
    return 0;
}

int attention_request_set_precision(attention_request *req, const char *not_string,
                                    const char *value, const char *field, attn_error *err)
{
    static const char *const names[] = {"float64", "float32", "bfloat16"};
    if (not_string != NULL)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "compute_precision is %s; it must be \"float64\", \"float32\" or "
                         "\"bfloat16\".", not_string);
    for (int i = 0; i < 3; i++)
        if (!strcmp(value, names[i])) {
            req->job.dtype = i == 0 ? ATTN_FLOAT64 : ATTN_FLOAT32;
            req->job.bf16 = i == 2;
            return 0;
        }
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                     "compute_precision is \"%.20s\"; it must be \"float64\", \"float32\" or "
                     "\"bfloat16\".", value);
}

int attention_request_check_batch(const attention_input *t, const attention_input *ref,
                                  attn_error *err)
{
    if (t->rank != ref->rank)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", t->field,
                         "%s is %d-D but %s is %d-D; give all inputs a leading batch axis, "
                         "or none.",
                         t->name, t->rank, ref->name, ref->rank);
    if (t->batch != ref->batch)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", t->field,
                         "%s has a batch of %zu but %s has %zu; batch sizes must agree.", t->name,
                         t->batch, ref->name, ref->batch);
    return 0;
}

/* heads must divide dk and dv: weights_check_heads, at the request's place. */
static int check_heads(const attention_request *req, size_t dk, size_t dv, attn_error *err)
{
    int rc = weights_check_heads(req->job.heads, dk, dv, err);
    if (rc != 0)
        snprintf(err->field, sizeof err->field, "%s", req->heads_field);
    return rc;
}

int attention_request_shape_qkv(attention_request *req, const attention_input in[3],
                                attn_error *err)
{
    const attention_input *q = &in[0], *k = &in[1], *v = &in[2];
    int rc;
    if ((rc = attention_request_check_batch(k, q, err)) != 0 ||
        (rc = attention_request_check_batch(v, q, err)) != 0)
        return rc;
    if (k->features != q->features)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", k->field,
                         "k has %zu features per token (its %s) but q has %zu (both must be dk).",
                         k->features, feature_axis(req), q->features);
    if (v->tokens != k->tokens)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", v->field,
                         "v has %zu tokens (its %s) but k has %zu (both must be Lk, one per key).",
                         v->tokens, token_axis(req), k->tokens);
    if ((rc = check_heads(req, q->features, v->features, err)) != 0)
        return rc;
    attn_job *job = &req->job;
    job->batch = q->batch;
    job->lq = q->tokens;
    job->lk = k->tokens;
    job->dk = q->features;
    job->dv = v->features;
    req->batched = q->rank == 3;
    if (!req->scale_given)
        job->scale = weights_default_scale(job->dk, job->heads);
    return 0;
}

int attention_request_shape_x(attention_request *req, const attention_input *x,
                              const attention_input *context, attn_error *err)
{
    int rc;
    if (context != NULL && (rc = attention_request_check_batch(context, x, err)) != 0)
        return rc;
    const attention_input *kv = context != NULL ? context : x;
    req->job.batch = x->batch;
    req->job.lq = x->tokens;
    req->job.lk = kv->tokens;
    req->x_width = x->features;
    req->ctx_width = kv->features;
    req->batched = x->rank == 3;
    req->has_context = context != NULL;
    snprintf(req->x_field, sizeof req->x_field, "%s", x->field);
    snprintf(req->ctx_field, sizeof req->ctx_field, "%s", kv->field);
    return 0;
}

int attention_request_shape_mask(attention_request *req, const attention_input *m,
                                 attn_error *err)
{
    const attn_job *job = &req->job;
    if (m->rank == 3 && !req->batched)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", m->field,
                         "mask is 3-D but the inputs have no batch axis; give mask as Lq x Lk "
                         "= %zu x %zu.", job->lq, job->lk);
    if (m->rank == 3 && m->batch != job->batch)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", m->field,
                         "mask has a batch of %zu but the inputs have %zu.", m->batch, job->batch);
    if (m->tokens != job->lq || m->features != job->lk)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", m->field,
                         "mask is %zu x %zu but it must be Lq x Lk = %zu x %zu (one row per "
                         "query, one column per key, whatever the layout).", m->tokens,
                         m->features, job->lq, job->lk);
    req->job.mask_batched = m->rank == 3;
    return 0;
}

int attention_request_bind_weights(attention_request *req, const attn_weights *w, int named,
                                   attn_error *err)
{
    const char *feat = feature_axis(req);
    const char *in_axis = named ? "inputs" : req->out_in ? "columns" : "rows";
    const char *ctx_name = req->has_context ? "context" : "x";
    if (w->d_in != req->x_width)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         named ? req->x_field : "weights.wq",
                         "x has %zu features per token (its %s) but weights.wq expects %zu "
                         "(its %s).", req->x_width, feat, w->d_in, in_axis);
    if (w->d_ctx != req->ctx_width)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         named ? req->ctx_field : "weights.wk",
                         "%s has %zu features per token (its %s) but weights.wk and weights.wv "
                         "expect %zu (their %s).", ctx_name, req->ctx_width, feat, w->d_ctx,
                         in_axis);
    int rc = check_heads(req, w->dk, w->dv, err);
    if (rc != 0)
        return rc;
    req->job.weights = w;
    req->job.dk = w->dk;
    req->job.dv = w->dv;
    if (!req->scale_given)
        req->job.scale = weights_default_scale(w->dk, req->job.heads);
    return 0;
}

int attention_request_bind_set(attention_request *req, const char *name, const attn_weights *w,
                               size_t heads, attn_error *err)
{
    if (req->heads_given && heads != 0 && req->job.heads != heads)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", req->heads_field,
                         "heads is %zu but the weight set \"%s\" was stored with heads = %zu; "
                         "leave heads out to use the stored value.", req->job.heads, name, heads);
    size_t old_heads = req->job.heads;
    int old_given = req->heads_given;
    if (heads != 0) {
        req->job.heads = heads;
        req->heads_given = 1;
    }
    int rc = attention_request_bind_weights(req, w, 1, err);
    if (rc != 0) {
        req->job.heads = old_heads;
        req->heads_given = old_given;
        return rc;
    }
    snprintf(req->weights_name, sizeof req->weights_name, "%s", name);
    return 0;
}

int attention_request_pool_side(const char *not_number, double value, const char *field,
                                size_t *out, attn_error *err)
{
    if (not_number != NULL)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "%s is %s; it must be a whole number from 1 to %d.", field, not_number,
                         ATTN_POOL_MAX_SIDE);
    if (!(value >= 1 && value <= ATTN_POOL_MAX_SIDE) || value != floor(value))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                         "%s is %g; it must be a whole number from 1 to %d.", field, value,
                         ATTN_POOL_MAX_SIDE);
    *out = (size_t)value;
    return 0;
}

int attention_request_check_pool(const attention_request *req, attn_error *err)
{
    const attn_pool *p = req->job.pool;
    if (p == NULL)
        return 0;
    size_t q0, q1, k0, k1;
    attention_pool_window(p, req->job.lq, req->job.lk, &q0, &q1, &k0, &k1);
    if (q1 > req->job.lq || q0 >= q1)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", req->pool_queries_field,
                         "The pooled queries [%zu, %zu) must be a non-empty range within the "
                         "%zu queries.", q0, q1, req->job.lq);
    if (k1 > req->job.lk || k0 >= k1)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", req->pool_keys_field,
                         "The pooled keys [%zu, %zu) must be a non-empty range within the %zu "
                         "keys.", k0, k1, req->job.lk);
    return 0;
}

void attention_request_set_pool(attention_request *req, size_t rows, size_t cols,
                                attn_pool_reduce reduce)
{
    req->pool = (attn_pool){.rows = rows, .cols = cols, .reduce = reduce};
    req->job.pool = &req->pool;
    req->job.want_attention = 0;        /* the pool takes the matrix's place */
}

/* The largest sink or local width taken: past the keys it changes nothing, and a double
 * holds every whole number up to it. */
#define REDUCE_MAX_WIDTH 9007199254740992.0

int attention_request_reduce_param(attention_request *req, const char *key, const scalar *v,
                                   const char *field, attn_error *err)
{
    attn_reduce *r = &req->reduce;
    int *flag = !strcmp(key, "entropy")    ? &r->entropy
                : !strcmp(key, "max")      ? &r->max
                : !strcmp(key, "received") ? &r->received
                                           : NULL;
    if (flag != NULL) {
        if (v->kind != SCALAR_BOOL)
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                             "%s is %s; it must be true or false.", field, scalar_kind_words(v));
        *flag = v->boolean;
        req->job.reduce = r;
        return 0;
    }
    int topk = !strcmp(key, "topk");
    if (!topk && strcmp(key, "sink") != 0 && strcmp(key, "local") != 0)
        return 1;
    double lo = topk ? 1 : 0;
    const char *what = topk ? "a whole number from 1 to the number of keys"
                            : "a whole number >= 0 (a count of keys)";
    if (!scalar_is_number(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field, "%s is %s; it must be %s.",
                         field, scalar_kind_words(v), what);
    double d = scalar_number(v);
    if (!(d >= lo && d <= REDUCE_MAX_WIDTH) || d != floor(d))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field, "%s is %g; it must be %s.",
                         field, d, what);
    if (topk) {
        r->topk = (size_t)d;
        snprintf(req->reduce_topk_field, sizeof req->reduce_topk_field, "%s", field);
    } else if (!strcmp(key, "sink")) {
        r->sink = (size_t)d;
        r->want_sink = 1;
    } else {
        r->local = (size_t)d;
        r->want_local = 1;
    }
    req->job.reduce = r;
    return 0;
}

int attention_request_check_reduce(const attention_request *req, attn_error *err)
{
    const attn_reduce *r = req->job.reduce;
    if (r == NULL || r->topk <= req->job.lk)
        return 0;
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", req->reduce_topk_field,
                     "%s is %zu; it must be a whole number from 1 to the number of keys (%zu).",
                     req->reduce_topk_field, r->topk, req->job.lk);
}

size_t attention_request_result_elements(const attention_request *req)
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
    size_t extra = 0;
    if (j->pool != NULL && __builtin_add_overflow(total, attention_pool_cells(j->pool, j), &total))
        return (size_t)-1;
    if (j->reduce != NULL) {
        /* each factor is at most a count the budget has passed, or topk <= lk */
        size_t n;
        if (mem_mul(j->batch * j->heads, j->lq, 5 + 2 * j->reduce->topk, &n) != 0 ||
            __builtin_add_overflow(total, attention_reduce_numbers(j->reduce, j), &total))
            return (size_t)-1;
    }
    if (j->want_qk && (mem_mul(j->batch, j->lq + j->lk, j->dk, &extra) != 0 ||
                       __builtin_add_overflow(total, extra, &total)))
        return (size_t)-1;
    return total;
}

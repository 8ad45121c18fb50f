/*
 * sequence_step.c - a request as a step of a sequence: the id and the cache
 * policy as any wire gives them, the rules of a step, the job over the
 * cache, the policy's passes (the full cache's, SnapKV's observation) and
 * its trim, the commit.
 */
#include "sequence_step.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/budget.h"
#include "core/compute.h"
#include "core/mem.h"
#include "kernel/attention_reduce.h"

/* Cells (heads x queries x keys) up to which a step without reductions takes its weights
 * received from the matrix: 16 MiB of float, the cost of 4M additions. */
#define SEQUENCE_MATRIX_CELLS (4u << 20)

/* Largest size a policy's parameter takes (a cache of more keys could not be held). */
#define SEQUENCE_POLICY_SIZE_MAX (1u << 30)

/* SnapKV's defaults: the observation window (at most the budget) and the pooling width,
 * those of the SnapKV paper; StreamingLLM's sinks. */
#define SNAPKV_WINDOW 32
#define SNAPKV_POOL 7
#define WINDOW_SINK 4

const char *const sequence_policy_params[SEQUENCE_POLICY_PARAMS] = {
    "cache_policy", "cache_sink", "cache_window", "cache_budget", "cache_recent", "cache_pool",
    "compare_full"};

enum { P_POLICY, P_SINK, P_WINDOW, P_BUDGET, P_RECENT, P_POOL, P_COMPARE };

/* The policies each size belongs to, a bit per sequence_policy_kind. */
static const unsigned param_policies[SEQUENCE_POLICY_PARAMS] = {
    0, 1u << SEQUENCE_POLICY_WINDOW, 1u << SEQUENCE_POLICY_WINDOW | 1u << SEQUENCE_POLICY_SNAPKV,
    1u << SEQUENCE_POLICY_H2O | 1u << SEQUENCE_POLICY_SNAPKV, 1u << SEQUENCE_POLICY_H2O,
    1u << SEQUENCE_POLICY_SNAPKV, 0};

/* Ids as numbers are exact up to here: JSON reads every number as a double. */
#define SEQUENCE_ID_NUMBER_MAX 9007199254740992.0 /* 2^53 */

int sequence_ask_id(sequence_ask *a, const scalar *v, const char *field, attn_error *err)
{
    a->id_field = field;
    if (v == NULL || v->kind == SCALAR_ABSENT)
        return 0;
    if (v->kind == SCALAR_STRING) {
        if (v->size > SEQUENCE_ID_MAX)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                             "%s is a string of %zu bytes; a string id has at most %d.", field,
                             v->size, SEQUENCE_ID_MAX);
        if (v->size == 0)
            return 0;
        a->in_sequence = 1;
        a->id.is_string = 1;
        memcpy(a->id.string, v->string, v->size + 1);
        return 0;
    }
    double d;
    if (v->kind == SCALAR_INTEGER && v->integer == 0)
        return 0;
    if (!scalar_is_number(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "%s is %s; it must be a whole number or a string.", field,
                         scalar_kind_words(v));
    if (!scalar_whole(v, 0, SEQUENCE_ID_NUMBER_MAX, &d))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                         "%s must be a whole number from 1 to 2^53 (send a larger id as a "
                         "string).", field);
    if (d == 0)
        return 0;
    a->in_sequence = 1;
    a->id.number = (uint64_t)d;
    return 0;
}

/* The size of policy parameter i in p. */
static size_t *policy_size(sequence_policy *p, int i)
{
    switch (i) {
    case P_SINK:
        return &p->sink;
    case P_WINDOW:
        return &p->window;
    case P_BUDGET:
        return &p->budget;
    case P_RECENT:
        return &p->recent;
    default:
        return &p->pool;
    }
}

/* a->policy_prefix + the name of policy parameter i, into buf. */
static const char *policy_field(const sequence_ask *a, int i, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s", a->policy_prefix != NULL ? a->policy_prefix : "",
             sequence_policy_params[i]);
    return buf;
}

int sequence_ask_policy(sequence_ask *a, const char *key, const scalar *v, attn_error *err)
{
    int i = 0;
    while (i < SEQUENCE_POLICY_PARAMS && strcmp(sequence_policy_params[i], key) != 0)
        i++;
    if (i == SEQUENCE_POLICY_PARAMS)
        return 1;
    if (v == NULL || v->kind == SCALAR_ABSENT)
        return 0;
    char field[ATTENTION_FIELD_MAX];
    policy_field(a, i, field, sizeof field);
    a->policy_given |= 1u << i;
    if (i == P_POLICY) {
        for (int k = 0; v->kind == SCALAR_STRING && k < SEQUENCE_POLICY_COUNT; k++)
            if (strcmp(v->string, sequence_policy_names[k]) == 0) {
                a->policy.kind = (sequence_policy_kind)k;
                return 0;
            }
        return error_set(err, ERR_BAD_REQUEST,
                         v->kind == SCALAR_STRING ? "invalid_value" : "wrong_type", field,
                         "%s must be \"full\", \"window\", \"h2o\" or \"snapkv\"%s%s.", field,
                         v->kind == SCALAR_STRING ? "" : "; it is ",
                         v->kind == SCALAR_STRING ? "" : scalar_kind_words(v));
    }
    if (i == P_COMPARE) {
        if (v->kind != SCALAR_BOOL)
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                             "%s is %s; it must be true or false.", field, scalar_kind_words(v));
        a->policy.compare_full = v->boolean;
        return 0;
    }
    double lo = i == P_SINK || i == P_RECENT ? 0 : 1, d;
    if (!scalar_is_number(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "%s is %s; it must be a whole number.", field, scalar_kind_words(v));
    if (!scalar_whole(v, lo, SEQUENCE_POLICY_SIZE_MAX, &d))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                         "%s must be a whole number from %.0f to %u (keys).", field, lo,
                         SEQUENCE_POLICY_SIZE_MAX);
    *policy_size(&a->policy, i) = (size_t)d;
    return 0;
}

/* The policy's parameters against each other and the start (sequence_ask_check). */
static int check_policy(sequence_ask *a, attn_error *err)
{
    char field[ATTENTION_FIELD_MAX];
    sequence_policy *p = &a->policy;
    if (a->policy_given == 0)
        return 0;
    int first = 0;
    while (!(a->policy_given & 1u << first))
        first++;
    policy_field(a, first, field, sizeof field);
    if (!a->in_sequence || !a->start)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", field,
                         "%s chooses a sequence's cache policy for its life: give it with %s "
                         "true, on the step that starts the sequence%s.", field,
                         a->start_field, a->in_sequence ? "" : " (named by its id)");
    const char *name = sequence_policy_names[p->kind];
    for (int i = P_SINK; i <= P_POOL; i++)
        if (a->policy_given & 1u << i && !(param_policies[i] & 1u << p->kind))
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                             policy_field(a, i, field, sizeof field),
                             "%s is not a parameter of the cache policy \"%s\"%s; leave it "
                             "out, or choose a policy that takes it (docs/contract.md, Cache "
                             "policies).", field, name,
                             a->policy_given & 1u << P_POLICY ? "" : " (the default)");
    int need = p->kind == SEQUENCE_POLICY_WINDOW ? P_WINDOW
               : p->kind == SEQUENCE_POLICY_FULL ? -1 : P_BUDGET;
    if (need >= 0 && !(a->policy_given & 1u << need))
        return error_set(err, ERR_BAD_REQUEST, "missing_field",
                         policy_field(a, need, field, sizeof field),
                         "The cache policy \"%s\" needs %s: the keys it %s.", name, field,
                         need == P_WINDOW ? "keeps besides the first cache_sink" : "keeps");
    if (p->kind == SEQUENCE_POLICY_WINDOW && !(a->policy_given & 1u << P_SINK))
        p->sink = WINDOW_SINK;
    if (p->kind == SEQUENCE_POLICY_H2O && !(a->policy_given & 1u << P_RECENT))
        p->recent = p->budget / 2;
    if (p->kind == SEQUENCE_POLICY_SNAPKV) {
        if (!(a->policy_given & 1u << P_WINDOW))
            p->window = p->budget < SNAPKV_WINDOW ? p->budget : SNAPKV_WINDOW;
        if (!(a->policy_given & 1u << P_POOL))
            p->pool = SNAPKV_POOL;
        if (p->pool % 2 == 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             policy_field(a, P_POOL, field, sizeof field),
                             "%s is %zu; the pooling is centred on each key, so its width is "
                             "odd (1, 3, 5, 7, ...).", field, p->pool);
    }
    size_t inner = p->kind == SEQUENCE_POLICY_H2O ? p->recent : p->window;
    if ((p->kind == SEQUENCE_POLICY_H2O || p->kind == SEQUENCE_POLICY_SNAPKV) &&
        p->budget < inner)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                         policy_field(a, P_BUDGET, field, sizeof field),
                         "%s is %zu, below cache_%s (%zu): the budget holds the %s keys and "
                         "more.", field, p->budget,
                         p->kind == SEQUENCE_POLICY_H2O ? "recent" : "window", inner,
                         p->kind == SEQUENCE_POLICY_H2O ? "recent" : "window's");
    return 0;
}

int sequence_step_draining(const sequence_ask *a, int draining, attn_error *err)
{
    if (!draining || (a->in_sequence && !a->start))
        return 0;
    return error_set(err, ERR_UNAVAILABLE, "shutting_down", NULL,
                     "The server is shutting down and takes no new work%s; retry on another "
                     "instance.", a->in_sequence ? " (a sequence's steps go on, no new start)"
                                                 : "");
}

int sequence_step_no_mask(const sequence_ask *a, attn_error *err)
{
    return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->mask_field,
                     "A sequence's step takes no mask: its queries see the cached keys by the "
                     "causal rule, or all of them with causal false.");
}

int sequence_ask_check(sequence_ask *a, attn_error *err)
{
    if (!a->in_sequence && (a->start || a->end))
        return error_set(err, ERR_BAD_REQUEST, "missing_field", a->id_field,
                         "%s is true but no sequence is named; give %s (a number from 1, or a "
                         "string).", a->start ? a->start_field : a->end_field, a->id_field);
    if (!a->in_sequence && a->received_total)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->received_total_field,
                         "received_total sums the attention over a sequence's steps; name the "
                         "sequence with %s.", a->id_field);
    return check_policy(a, err);
}

/* The rules a request obeys to be a step, before its sequence is looked at. */
static int check_step(const attention_request *ar, const sequence_ask *a,
                      const sequence_model *model, attn_error *err)
{
    const attn_job *j = &ar->job;
    if (model->inline_weights)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights",
                         "A sequence's step runs on q, k and v, or on a stored weight set by "
                         "name, whose projections it caches; store the weights first (PUT "
                         "/v1/weight-sets/NAME).");
    if (model->has_context)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->context_field,
                         "A sequence's step attends over its own tokens, cached: it takes x "
                         "alone, no context.");
    if (model->has_mask)
        return sequence_step_no_mask(a, err);
    if (j->batch != 1)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", a->q_field,
                         "A sequence's step has one batch row; q has %zu.", j->batch);
    return 0;
}

/* The request against the start of the sequence it continues. */
static int check_against(attention_request *ar, const sequence_ask *a,
                         const sequence_model *model, const sequence_shape *sh, attn_error *err)
{
    attn_job *j = &ar->job;
    char id[SEQUENCE_ID_MAX + 8];
    sequence_id_words(&a->id, id, sizeof id);
    if (strcmp(model->name, sh->model) != 0)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->id_field,
                         "Sequence %s runs on the model \"%s\", as its start did; this step "
                         "names \"%.64s\".", id, sh->model, model->name);
    if (model->generation != sh->generation)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->id_field,
                         "The weight set \"%s\" was replaced (generation %llu at the start of "
                         "sequence %s, %llu now): its cached keys came from the old weights; "
                         "start the sequence again.", sh->model,
                         (unsigned long long)sh->generation, id,
                         (unsigned long long)model->generation);
    if (j->dtype != sh->dtype)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->dtype_field,
                         "Sequence %s computes in %s, as its start did; this step is %s.", id,
                         sh->dtype == ATTN_FLOAT32 ? "float32" : "float64",
                         j->dtype == ATTN_FLOAT32 ? "float32" : "float64");
    if (j->dk != sh->dk)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->k_field,
                         "Sequence %s caches keys of %zu features; this step's have %zu.", id,
                         sh->dk, j->dk);
    if (j->dv != sh->dv)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->v_field,
                         "Sequence %s caches values of %zu features; this step's have %zu.", id,
                         sh->dv, j->dv);
    if (ar->heads_given && j->heads != sh->heads)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->heads_field,
                         "Sequence %s was started with %zu heads; leave heads out or give %zu.",
                         id, sh->heads, sh->heads);
    if (ar->scale_given && j->scale != sh->scale)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->scale_field,
                         "Sequence %s was started with scale %.17g; leave scale out or give the "
                         "same.", id, sh->scale);
    j->heads = sh->heads;
    ar->heads_given = sh->heads_axis;
    j->scale = sh->scale;
    return 0;
}

int sequence_step_begin(attention_request *ar, const sequence_ask *a, const sequence_model *model,
                        sequence_step *st, attn_error *err)
{
    memset(st, 0, sizeof *st);
    if (!a->in_sequence)
        return 0;
    int rc = check_step(ar, a, model, err);
    if (rc != 0)
        return rc;
    attn_job *j = &ar->job;
    sequence_shape shape = {j->dtype, j->heads, j->dk, j->dv, ar->heads_given, j->scale, "",
                            model->generation, a->policy};
    snprintf(shape.model, sizeof shape.model, "%s", model->name);
    if ((rc = sequence_acquire(&a->id, a->start, &shape, a->id_field, &st->seq, err)) != 0)
        return rc;
    if (!a->start &&
        (rc = check_against(ar, a, model, sequence_shape_of(st->seq), err)) != 0)
        return rc;
    if (sequence_shape_of(st->seq)->policy.compare_full)
        j->skip_output = 0;     /* the comparison is of the outputs */
    st->weights = j->weights;   /* a stored set's: the job's own projections are the step's */
    st->rows = j->lq;
    st->before = sequence_length(st->seq);
    st->added = j->lk;
    size_t n = st->before + st->added;
    if (sequence_policy_evicts(&sequence_shape_of(st->seq)->policy) && j->lq > st->added)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", a->q_field,
                         "q has %zu rows but the step brings %zu keys; under a cache policy a "
                         "step's queries are its own keys' positions, at most one a key (the "
                         "keys before may have been evicted).", j->lq, st->added);
    if (j->lq > n)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", a->q_field,
                         "q has %zu rows but the sequence holds %zu keys with this step's; a "
                         "step's queries are its last positions, at most one a key.", j->lq, n);
    j->lk = n;
    /* causal, bottom-right: on unless the request said false; where it matches the kernel's
     * top-left rule (nothing before, as many queries as keys) the kernel's, else the mask
     * of sequence_step_load when there is more than one query (one sees every key) */
    st->causal = !a->causal_given || j->causal;
    j->causal = st->causal && st->before == 0 && j->lq == n;
    /* The totals need every step's weights received.  With no reduction asked, a step
     * whose matrix is small sums its columns (sequence_step_answer): the reductions'
     * sweep would compute every score a second time. */
    st->attention_asked = j->want_attention;
    ar->reduce.query_offset = n - j->lq;
    size_t cells = j->heads * j->lq * n;
    /* (a job that skips the output forms no matrix either: the sweep it is) */
    if (!attention_reduce_any(j->reduce) && j->pool == NULL && !j->skip_output &&
        cells <= SEQUENCE_MATRIX_CELLS) {
        j->want_attention = 1;
        st->received_from_matrix = 1;
        return 0;
    }
    ar->reduce.received = 1;
    j->reduce = &ar->reduce;
    return 0;
}

/* The weights each key received from the step's queries, heads x n, from the matrix. */
static double *column_sums(const attn_job *j, const attn_result *result)
{
    size_t n = j->lk, m = j->lq;
    double *sums = mem_calloc(j->heads * n > 0 ? j->heads * n : 1, sizeof(double));
    if (sums == NULL)
        return NULL;
    for (size_t h = 0; h < j->heads; h++)
        for (size_t i = 0; i < m; i++) {
            double *row = sums + h * n;
            size_t at = (h * m + i) * n;
            if (result->attention_f32 != NULL)
                for (size_t k = 0; k < n; k++)
                    row[k] += result->attention_f32[at + k];
            else
                for (size_t k = 0; k < n; k++)
                    row[k] += result->attention[at + k];
        }
    return sums;
}

size_t sequence_step_extra_elements(const attention_request *ar, const sequence_ask *a,
                                    const sequence_step *st)
{
    if (!a->in_sequence || st->seq == NULL)
        return 0;
    const sequence_policy *p = &sequence_shape_of(st->seq)->policy;
    size_t per_key = (a->received_total ? 1 : 0) + (sequence_policy_evicts(p) ? 1 : 0);
    return ar->job.heads * (ar->job.lk * per_key + (p->compare_full ? 2 * ar->job.lq : 0));
}

/* Whether the step needs the bottom-right mask: causal, not the kernel's own rule, more
 * than one query. */
static int needs_mask(const attn_job *j, const sequence_step *st)
{
    return st->causal && !j->causal && j->lq > 1;
}

/* Copies `rows` rows of `width` numbers from the request (as double or
 * float) into the cache's precision at dst. */
static void copy_rows(void *dst, attn_dtype dtype, const double *src64, const float *src32,
                      size_t count)
{
    if (dtype == ATTN_FLOAT32) {
        float *d = dst;
        if (src32 != NULL)
            memcpy(d, src32, count * sizeof(float));
        else
            for (size_t i = 0; i < count; i++)
                d[i] = (float)src64[i];
    } else {
        double *d = dst;
        if (src64 != NULL)
            memcpy(d, src64, count * sizeof(double));
        else
            for (size_t i = 0; i < count; i++)
                d[i] = src32[i];
    }
}

/* attention_project, its faults as errors. */
static int project(const attn_weights *w, weights_part part, attn_dtype dtype, const double *x,
                   const float *x32, size_t rows, void *out, attn_error *err)
{
    int rc = attention_project(w, part, dtype, x, x32, rows, out);
    if (rc == 0)
        return 0;
    if (rc == 1)
        return error_set(err, ERR_BAD_REQUEST, "not_finite", "x",
                         "A projection of the step's tokens (through %s) is not finite in %s: "
                         "x or the weights are too large for it.", weights_parts[part].name,
                         dtype == ATTN_FLOAT32 ? "float32" : "float64");
    return compute_stop_error(err) != 0 ? err->kind : error_nomem(err);
}

/* Reserves `bytes` in the memory budget for `what` (adding them to *reserved): 503
 * overloaded when they do not fit now, 413 request_too_large when they never could. */
static int reserve(size_t bytes, const char *what, size_t *reserved, attn_error *err)
{
    if (budget_reserve(bytes) != 0)
        return error_set(err, budget_could_fit(bytes) ? ERR_UNAVAILABLE : ERR_TOO_LARGE,
                         budget_could_fit(bytes) ? "overloaded" : "request_too_large", NULL,
                         "The step's %s needs %zu MiB, more than the server's memory budget "
                         "(--max-memory) has free now; send fewer queries in one step.", what,
                         bytes >> 20);
    *reserved += bytes;
    return 0;
}

/* The bottom-right causal mask of m queries over n keys (query i sees keys j <= n - m + i)
 * into *out, its bytes reserved (*reserved). */
static int causal_mask(size_t m, size_t n, unsigned char **out, size_t *reserved,
                       attn_error *err)
{
    int rc = reserve(m * n, "causal mask", reserved, err);
    if (rc != 0)
        return rc;
    unsigned char *mask = *out = mem_malloc(m * n + 1);
    if (mask == NULL)
        return error_nomem(err);
    size_t first = n - m;
    for (size_t i = 0; i < m; i++) {
        memset(mask + i * n, 1, first + i + 1);
        memset(mask + i * n + first + i + 1, 0, n - first - i - 1);
    }
    return 0;
}

int sequence_step_load(attention_request *ar, sequence_step *st, attn_error *err)
{
    if (st->seq == NULL)
        return 0;
    attn_job *j = &ar->job;
    size_t n = st->before + st->added;
    int rc;
    if (needs_mask(j, st) &&
        (rc = causal_mask(j->lq, n, &st->mask, &st->mask_reserved, err)) != 0)
        return rc;
    rc = sequence_reserve(st->seq, st->added, err);
    if (rc != 0)
        return rc;
    const sequence_shape *sh = sequence_shape_of(st->seq);
    size_t esize = sh->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    unsigned char *keys = sequence_keys(st->seq), *values = sequence_values(st->seq);
    unsigned char *new_keys = keys + st->before * sh->dk * esize;
    unsigned char *new_values = values + st->before * sh->dv * esize;
    if (st->weights != NULL) {
        /* x through wq into the step's queries, through wk and wv into the cache */
        st->q = mem_malloc(j->lq * sh->dk * esize);
        if (st->q == NULL)
            return error_nomem(err);
        const attn_weights *w = st->weights;
        if ((rc = project(w, WEIGHTS_WQ, sh->dtype, j->x, NULL, j->lq, st->q, err)) != 0 ||
            (rc = project(w, WEIGHTS_WK, sh->dtype, j->x, NULL, st->added, new_keys, err)) != 0 ||
            (rc = project(w, WEIGHTS_WV, sh->dtype, j->x, NULL, st->added, new_values, err)) != 0)
            return rc;
        j->x = j->context = NULL;
        j->weights = NULL;
        j->q = sh->dtype == ATTN_FLOAT32 ? NULL : st->q;
        j->q32 = sh->dtype == ATTN_FLOAT32 ? st->q : NULL;
    } else {
        copy_rows(new_keys, sh->dtype, j->k, j->k32, st->added * sh->dk);
        copy_rows(new_values, sh->dtype, j->v, j->v32, st->added * sh->dv);
    }
    unsigned char *full_keys = sequence_full_keys(st->seq);
    if (full_keys != NULL) {
        size_t at = sequence_full_length(st->seq);
        memcpy(full_keys + at * sh->dk * esize, new_keys, st->added * sh->dk * esize);
        memcpy((unsigned char *)sequence_full_values(st->seq) + at * sh->dv * esize, new_values,
               st->added * sh->dv * esize);
    }
    if (sh->dtype == ATTN_FLOAT32) {
        j->k = j->v = NULL;
        j->k32 = (const float *)keys;
        j->v32 = (const float *)values;
    } else {
        j->k32 = j->v32 = NULL;
        j->k = (const double *)keys;
        j->v = (const double *)values;
    }
    if (st->mask != NULL) {
        j->mask = st->mask;
        j->mask_batched = 0;
    }
    return 0;
}

/* With a stored set that has wo: result's output (the heads side by side, dv wide) through
 * it, d_out wide, in the place of the output it had. */
static int output_through_wo(sequence_step *st, attn_result *result, attn_error *err)
{
    const attn_weights *w = st->weights;
    if (w == NULL || (weights_is_f32(w) ? weights_array_f32(w, WEIGHTS_WO) != NULL
                                        : weights_array(w, WEIGHTS_WO) != NULL) == 0)
        return 0;
    const sequence_shape *sh = sequence_shape_of(st->seq);
    size_t rows = st->rows, count = rows * w->d_out;
    if (result->output_f32 != NULL) {           /* kept as float, as the kernels formed it */
        st->output_f32 = mem_malloc(count * sizeof(float));
        if (st->output_f32 == NULL)
            return error_nomem(err);
        int rc = project(w, WEIGHTS_WO, ATTN_FLOAT32, NULL, result->output_f32, rows,
                         st->output_f32, err);
        if (rc != 0)
            return rc;
        mem_free(result->output_f32);
        result->output_f32 = st->output_f32;
        st->output_f32 = NULL;
    } else if (result->output != NULL) {
        st->output = mem_malloc(count * sizeof(double));
        if (st->output == NULL)
            return error_nomem(err);
        int rc;
        if (sh->dtype == ATTN_FLOAT32) {
            /* a float32 step answered in double: the product in float, widened */
            float *f = mem_malloc(count * sizeof(float));
            if (f == NULL)
                return error_nomem(err);
            rc = project(w, WEIGHTS_WO, ATTN_FLOAT32, result->output, NULL, rows, f, err);
            for (size_t i = 0; rc == 0 && i < count; i++)
                st->output[i] = f[i];
            mem_free(f);
        } else {
            rc = project(w, WEIGHTS_WO, ATTN_FLOAT64, result->output, NULL, rows, st->output,
                         err);
        }
        if (rc != 0)
            return rc;
        mem_free(result->output);
        result->output = st->output;
        st->output = NULL;
    }
    result->d_out = w->d_out;
    return 0;
}

/* The step's last `rows` queries over lk keys k and v (in the cache's precision) as a job
 * of their own that forms the matrix (out), causal as the step is, bottom-right; its mask
 * (*mask) and memory reserved in the budget (*reserved) for the caller to free.  what: the
 * pass, as refusals name it. */
static int run_matrix(const attn_job *step_job, const sequence_step *st, const char *what,
                      size_t rows, const void *k, const void *v, size_t lk, attn_result *out,
                      unsigned char **mask, size_t *reserved, attn_error *err)
{
    attn_job j = *step_job;
    size_t skip = (j.lq - rows) * j.dk;
    j.q = j.q != NULL ? j.q + skip : NULL;
    j.q32 = j.q32 != NULL ? j.q32 + skip : NULL;
    j.lq = rows;
    j.lk = lk;
    j.k = j.dtype == ATTN_FLOAT32 ? NULL : k;
    j.v = j.dtype == ATTN_FLOAT32 ? NULL : v;
    j.k32 = j.dtype == ATTN_FLOAT32 ? k : NULL;
    j.v32 = j.dtype == ATTN_FLOAT32 ? v : NULL;
    j.x = j.context = NULL;
    j.weights = NULL;
    j.mask = NULL;
    j.mask_batched = 0;
    j.causal = st->causal && rows == lk;    /* the kernel's rule where it is the same */
    j.want_attention = 1;
    j.output_f32 = j.skip_output = j.want_qk = 0;
    j.pool = NULL;
    j.reduce = NULL;
    int rc;
    size_t bytes;
    if (st->causal && !j.causal && rows > 1) {
        if ((rc = causal_mask(rows, lk, mask, reserved, err)) != 0)
            return rc;
        j.mask = *mask;
    }
    if (attention_job_bytes(&j, &bytes) != 0)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The step's %s is too large to compute.", what);
    if ((rc = reserve(bytes, what, reserved, err)) != 0)
        return rc;
    return attention_run(&j, out, err);
}

/* With compare_full under an evicting policy: the step's queries over the full cache, and
 * per head and query the weight it puts on the keys the policy evicted (those not among
 * `positions`, heads x seen, the keys the queries saw) and the error of the policy's
 * output against its own (result's, before any wo). */
static int compare_full(const attention_request *ar, sequence_step *st,
                        const attn_result *result, const int64_t *positions, attn_error *err)
{
    const sequence_shape *sh = sequence_shape_of(st->seq);
    size_t heads = sh->heads, m = st->rows, n = st->before + st->added;
    size_t full_n = sequence_full_length(st->seq) + st->added, dvh = sh->dv / heads;
    attn_result fr;
    memset(&fr, 0, sizeof fr);
    unsigned char *mask = NULL, *seen = NULL;
    size_t reserved = 0;
    int rc = run_matrix(&ar->job, st, "comparison with its full cache", m,
                        sequence_full_keys(st->seq), sequence_full_values(st->seq), full_n, &fr,
                        &mask, &reserved, err);
    if (rc == 0 && (seen = mem_malloc(full_n ? full_n : 1)) == NULL)
        rc = error_nomem(err);
    for (size_t h = 0; rc == 0 && h < heads; h++) {
        memset(seen, 0, full_n);
        for (size_t j = 0; j < n; j++)
            seen[positions[h * n + j]] = 1;
        for (size_t i = 0; i < m; i++) {
            size_t at = (h * m + i) * full_n;
            double lost = 0, diff = 0, norm = 0;
            for (size_t p = 0; p < full_n; p++)
                if (!seen[p])
                    lost += fr.attention_f32 != NULL ? fr.attention_f32[at + p]
                                                     : fr.attention[at + p];
            for (size_t c = 0; c < dvh; c++) {
                size_t o = i * sh->dv + h * dvh + c;
                double mine = result->output_f32 != NULL ? result->output_f32[o]
                                                         : result->output[o];
                diff += (mine - fr.output[o]) * (mine - fr.output[o]);
                norm += fr.output[o] * fr.output[o];
            }
            st->lost_mass[h * m + i] = lost;
            /* all-zero full output: the error is absolute */
            st->output_error[h * m + i] = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        }
    }
    mem_free(seen);
    mem_free(mask);
    attention_result_free(&fr);
    budget_release(reserved);
    return rc;
}

/* SnapKV's prompt: the attention of its last cache_window queries (or all, when fewer)
 * on each of the n keys, summed over those queries, into scores (heads x n). */
static int observe(const attention_request *ar, sequence_step *st, double *scores,
                   attn_error *err)
{
    const sequence_shape *sh = sequence_shape_of(st->seq);
    size_t heads = sh->heads, n = st->before + st->added;
    size_t w = sh->policy.window < st->rows ? sh->policy.window : st->rows;
    attn_result r;
    memset(&r, 0, sizeof r);
    unsigned char *mask = NULL;
    size_t reserved = 0;
    int rc = run_matrix(&ar->job, st, "observation window (SnapKV)", w, sequence_keys(st->seq),
                        sequence_values(st->seq), n, &r, &mask, &reserved, err);
    for (size_t h = 0; rc == 0 && h < heads; h++)
        for (size_t q = 0; q < w; q++)
            for (size_t j = 0; j < n; j++) {
                size_t at = (h * w + q) * n + j;
                scores[h * n + j] += r.attention_f32 != NULL ? r.attention_f32[at]
                                                             : r.attention[at];
            }
    mem_free(mask);
    attention_result_free(&r);
    budget_release(reserved);
    return rc;
}

/* The step's weights received (heads x n), for the commit: from the matrix's columns or
 * the reduction, taken out of result unless the request asked for them. */
static int take_received(attention_request *ar, const sequence_ask *a, sequence_step *st,
                         attn_result *result, attn_error *err)
{
    if (st->received_from_matrix) {
        st->received = column_sums(&ar->job, result);
        if (st->received == NULL)
            return error_nomem(err);
        st->received_owned = 1;
        ar->job.want_attention = st->attention_asked;
        if (!st->attention_asked) {
            mem_free(result->attention);
            mem_free(result->attention_f32);
            result->attention = NULL;
            result->attention_f32 = NULL;
        }
    } else {
        st->received = result->reduced.received;
        st->received_owned = !a->received_asked;
        if (st->received_owned)
            result->reduced.received = NULL;
    }
    return 0;
}

/* Under an evicting policy: the trim after the step (st->keep), the kept positions and
 * the keys after it (st->length); with compare_full, the damage.  totals: the
 * received_total of the n keys the queries saw, after the step (H2O's scores). */
static int decide_trim(attention_request *ar, sequence_step *st, const attn_result *result,
                       const double *totals, attn_error *err)
{
    const sequence_shape *sh = sequence_shape_of(st->seq);
    const sequence_policy *p = &sh->policy;
    size_t heads = sh->heads, n = st->before + st->added;
    int prompt = sequence_appended(st->seq) == 0;
    int64_t appended = sequence_appended(st->seq) + (int64_t)st->added;
    int64_t *positions = mem_malloc(heads * n * sizeof *positions + 1);
    double *scores = NULL;
    int rc = 0;
    st->keep = mem_malloc(heads * n + 1);
    if (positions == NULL || st->keep == NULL)
        rc = error_nomem(err);
    if (rc == 0)
        sequence_positions(st->seq, st->added, positions);
    if (rc == 0 && p->compare_full)
        rc = compare_full(ar, st, result, positions, err);
    if (rc == 0 && p->kind == SEQUENCE_POLICY_SNAPKV && prompt) {
        if ((scores = mem_calloc(heads * n + 1, sizeof *scores)) == NULL)
            rc = error_nomem(err);
        else
            rc = observe(ar, st, scores, err);
    }
    size_t kept = 0;
    if (rc == 0) {
        int64_t boundary = prompt ? sequence_policy_snap_boundary(p, (size_t)appended)
                                  : sequence_snap_boundary(st->seq);
        kept = sequence_policy_keep(p, heads, n, positions, appended,
                                    p->kind == SEQUENCE_POLICY_H2O ? totals : scores, prompt,
                                    boundary, st->keep);
        if (kept == SIZE_MAX)
            rc = error_nomem(err);
    }
    if (rc == 0 && (st->kept_positions = mem_malloc(heads * kept * sizeof(int64_t) + 1)) == NULL)
        rc = error_nomem(err);
    for (size_t h = 0, to = 0; rc == 0 && h < heads; h++)
        for (size_t j = 0; j < n; j++)
            if (st->keep[h * n + j])
                st->kept_positions[to++] = positions[h * n + j];
    st->length = (int64_t)kept;
    mem_free(positions);
    mem_free(scores);
    return rc;
}

int sequence_step_answer(attention_request *ar, const sequence_ask *a, sequence_step *st,
                         attn_result *result, attn_error *err)
{
    if (st->seq == NULL)
        return 0;
    const sequence_shape *sh = sequence_shape_of(st->seq);
    size_t n = st->before + st->added, heads = sh->heads, m = st->rows;
    int evicts = sequence_policy_evicts(&sh->policy);
    int rc = take_received(ar, a, st, result, err);
    if (rc != 0)
        return rc;
    /* the totals after the step: the answer's, and H2O's scores */
    double *totals = NULL;
    if (a->received_total || sh->policy.kind == SEQUENCE_POLICY_H2O) {
        if ((totals = mem_calloc(heads * n + 1, sizeof(double))) == NULL)
            return error_nomem(err);
        sequence_received_total(st->seq, totals, n);
        if (st->received != NULL)
            for (size_t i = 0; i < heads * n; i++)
                totals[i] += st->received[i];
    }
    if (sh->policy.compare_full &&
        ((st->lost_mass = mem_calloc(heads * m + 1, sizeof(double))) == NULL ||
         (st->output_error = mem_calloc(heads * m + 1, sizeof(double))) == NULL))
        rc = error_nomem(err);
    st->length = (int64_t)n;
    if (rc == 0 && evicts)          /* (a policy that evicts nothing loses nothing: zeros) */
        rc = decide_trim(ar, st, result, totals, err);
    if (rc == 0)
        rc = output_through_wo(st, result, err);
    if (rc == 0 && a->received_total && evicts) {
        /* the kept keys' totals, in place: a kept key never moves to a later place */
        for (size_t h = 0, to = 0; h < heads; h++)
            for (size_t j = 0; j < n; j++)
                if (st->keep[h * n + j])
                    totals[to++] = totals[h * n + j];
    }
    if (rc == 0 && a->received_total) {
        st->received_total = totals;
        totals = NULL;
    }
    mem_free(totals);
    return rc;
}

void sequence_step_commit(sequence_step *st)
{
    if (st->seq == NULL)
        return;
    sequence_commit(st->seq, st->added, st->received, st->keep);
    st->committed = 1;
}

void sequence_step_finish(const sequence_ask *a, sequence_step *st)
{
    if (st->seq != NULL)
        sequence_release(st->seq, st->committed ? a->end : a->start);
    st->seq = NULL;
    mem_free(st->mask);
    st->mask = NULL;
    budget_release(st->mask_reserved);
    st->mask_reserved = 0;
    mem_free(st->received_total);
    mem_free(st->kept_positions);
    mem_free(st->lost_mass);
    mem_free(st->output_error);
    mem_free(st->keep);
    st->received_total = st->lost_mass = st->output_error = NULL;
    st->kept_positions = NULL;
    st->keep = NULL;
    if (st->received_owned)
        mem_free(st->received);
    st->received = NULL;
    st->received_owned = 0;
    mem_free(st->q);
    mem_free(st->output);
    mem_free(st->output_f32);
    st->q = NULL;
    st->output = NULL;
    st->output_f32 = NULL;
}

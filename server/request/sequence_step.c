/*
 * sequence_step.c - a request as a step of a sequence: the id as any wire
 * gives it, the rules of a step, the job over the cache, the commit.
 */
#include "sequence_step.h"

#include <stdio.h>
#include <string.h>

#include "core/budget.h"
#include "core/compute.h"
#include "core/mem.h"
#include "kernel/attention_reduce.h"

/* Cells (heads x queries x keys) up to which a step without reductions takes its weights
 * received from the matrix: 16 MiB of float, the cost of 4M additions. */
#define SEQUENCE_MATRIX_CELLS (4u << 20)

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

int sequence_ask_check(const sequence_ask *a, attn_error *err)
{
    if (!a->in_sequence && (a->start || a->end))
        return error_set(err, ERR_BAD_REQUEST, "missing_field", a->id_field,
                         "%s is true but no sequence is named; give %s (a number from 1, or a "
                         "string).", a->start ? a->start_field : a->end_field, a->id_field);
    if (!a->in_sequence && a->received_total)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", a->received_total_field,
                         "received_total sums the attention over a sequence's steps; name the "
                         "sequence with %s.", a->id_field);
    return 0;
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
                            model->generation};
    snprintf(shape.model, sizeof shape.model, "%s", model->name);
    if ((rc = sequence_acquire(&a->id, a->start, &shape, a->id_field, &st->seq, err)) != 0)
        return rc;
    if (!a->start &&
        (rc = check_against(ar, a, model, sequence_shape_of(st->seq), err)) != 0)
        return rc;
    st->weights = j->weights;   /* a stored set's: the job's own projections are the step's */
    st->rows = j->lq;
    st->before = sequence_length(st->seq);
    st->added = j->lk;
    size_t n = st->before + st->added;
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

size_t sequence_step_extra_elements(const attention_request *ar, const sequence_ask *a)
{
    return a->in_sequence && a->received_total ? ar->job.heads * ar->job.lk : 0;
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

int sequence_step_load(attention_request *ar, sequence_step *st, attn_error *err)
{
    if (st->seq == NULL)
        return 0;
    attn_job *j = &ar->job;
    int causal_mask = needs_mask(j, st);
    size_t n = st->before + st->added;
    if (causal_mask) {
        size_t bytes = j->lq * n;
        if (budget_reserve(bytes) != 0)
            return error_set(err, budget_could_fit(bytes) ? ERR_UNAVAILABLE : ERR_TOO_LARGE,
                             budget_could_fit(bytes) ? "overloaded" : "request_too_large", NULL,
                             "The step's causal mask needs %zu MiB, more than the server's "
                             "memory budget (--max-memory) has free now; send fewer queries "
                             "in one step.", bytes >> 20);
        st->mask_reserved = bytes;
        st->mask = mem_malloc(bytes ? bytes : 1);
        if (st->mask == NULL)
            return error_nomem(err);
        size_t first = n - j->lq;       /* query i sees keys j <= first + i */
        for (size_t i = 0; i < j->lq; i++) {
            memset(st->mask + i * n, 1, first + i + 1);
            memset(st->mask + i * n + first + i + 1, 0, n - first - i - 1);
        }
    }
    int rc = sequence_reserve(st->seq, st->added, err);
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

int sequence_step_answer(attention_request *ar, const sequence_ask *a, sequence_step *st,
                         attn_result *result, attn_error *err)
{
    if (st->seq == NULL)
        return 0;
    size_t n = st->before + st->added, heads = sequence_shape_of(st->seq)->heads;
    int rc = output_through_wo(st, result, err);
    if (rc != 0)
        return rc;
    st->length = (int64_t)n;
    /* this step's weights received, for the commit; in the answer only when asked */
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
    if (!a->received_total)
        return 0;
    st->received_total = mem_calloc(heads * n > 0 ? heads * n : 1, sizeof(double));
    if (st->received_total == NULL)
        return error_nomem(err);
    sequence_received_total(st->seq, st->received_total, n);
    if (st->received != NULL)
        for (size_t i = 0; i < heads * n; i++)
            st->received_total[i] += st->received[i];
    return 0;
}

void sequence_step_commit(sequence_step *st)
{
    if (st->seq == NULL)
        return;
    sequence_commit(st->seq, st->added, st->received);
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
    st->received_total = NULL;
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

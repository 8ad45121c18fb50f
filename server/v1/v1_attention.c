/*
 * v1_attention.c - POST /v1/attention: decode, bind a stored weight set,
 * admit against the limits, compute, encode.
 *
 * The JSON tree of the body is freed before the computation starts, so a
 * request holds the tree or its arrays, not both for long.  On an I/O thread
 * (api_request.io_thread) anything that would wait or take long sends the
 * request back for a worker (api_response.deferred) instead of answering.
 * Every request answered is counted in the statistics of its model
 * (metrics/model_stats.h): the set it names, else the built-in model
 * (ATTENTION_MODEL_BUILTIN).
 */
#include <jansson.h>
#include <string.h>

#include "request/admission.h"
#include "message/answer.h"
#include "attention_json.h"
#include "core/compute.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "metrics/model_stats.h"
#include "store/store.h"
#include "request/attention_request.h"
#include "request/sequence_step.h"
#include "v1.h"
#include "v1_private.h"

/* Bytes a number takes in the response at most ("-1.2345678901234567e-300,"). */
#define RESPONSE_BYTES_PER_NUMBER 26

/* Parses and decodes the body into ar.  Returns 0, or a negative ERR_* code
 * with err filled (ar then holds nothing). */
static int decode_body(const api_request *req, const server_config *cfg, attention_request *ar,
                       sequence_ask *seq, attn_error *err)
{
    /* The tree lives only until its numbers are decoded: it is made in the arena. */
    mem_json_arena_begin();
    json_t *root = json_in_parse(req->body, req->body_len, attention_json_tensor_field, err);
    if (root == NULL) {
        mem_json_arena_end();
        memset(ar, 0, sizeof *ar);
        return err->kind;
    }
    attention_json_limits limits = {cfg->max_elements};
    int rc = attention_json_decode(root, &limits, ar, seq, err);
    json_decref(root);
    mem_json_arena_end();
    return rc;
}

/* The stored set ar names, at the generation it asks for.  Returns 0 with
 * *set a reference (the caller releases it), ADMISSION_DEFER when an I/O
 * thread would have to rescan the directory, or a negative ERR_* code with
 * err filled. */
static int find_named_set(const api_request *req, weight_store *store,
                          const attention_request *ar, weight_set **set, api_response *resp,
                          attn_error *err)
{
    if (ar->weights_generation != 0 && req->io_thread) {
        /* Another generation would mean rescanning the directory: not on an
         * I/O thread. */
        *set = store_get(store, ar->weights_name);
        return *set == NULL || (*set)->generation != ar->weights_generation ? ADMISSION_DEFER : 0;
    }
    if (ar->weights_generation != 0) {
        *set = v1_sets_get_generation(store, ar->weights_name, ar->weights_generation,
                                      "weights_generation", &resp->retry_after, err);
        return *set == NULL ? err->kind : 0;
    }
    *set = store_get(store, ar->weights_name);
    if (*set == NULL)
        return error_set(err, ERR_NOT_FOUND, "unknown_weight_set", "weights",
                         "There is no stored weight set named \"%s\"; upload it with PUT "
                         "/v1/weight-sets/%s.", ar->weights_name, ar->weights_name);
    return 0;
}

/* Binds the stored set (borrowed) to ar: its layout must agree with what the
 * request says of it (its heads are checked by attention_request_bind_set).
 * Returns 0 or a negative ERR_* code with err filled. */
static int bind_named_set(attention_request *ar, const weight_set *set, attn_error *err)
{
    if (ar->weights_layout_given && ar->out_in != set->out_in)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "weights_layout",
                         "weights_layout is \"%s\" but the weight set \"%s\" was stored as "
                         "\"%s\"; leave weights_layout out when naming a stored set.",
                         ar->out_in ? "out_in" : "in_out", set->name,
                         set->out_in ? "out_in" : "in_out");
    return attention_request_bind_set(ar, set->name, &set->w, set->heads, err);
}

/* Admits, computes and encodes the job of ar into resp, noting in sample
 * the phases after started (compute_now() when the request was taken up).
 * Returns 0 (resp answered), ADMISSION_DEFER, or a negative ERR_* code with
 * err filled. */
static int compute_and_answer(const api_request *req, const server_config *cfg,
                              attention_request *ar, const sequence_ask *seq,
                              sequence_step *step, double started, model_stats_sample *sample,
                              api_response *resp, attn_error *err)
{
    size_t result_elements = attention_request_result_elements(ar), response_bytes = 0;
    size_t reserved_bytes = 0;
    if (result_elements != SIZE_MAX &&
        __builtin_add_overflow(result_elements, sequence_step_extra_elements(ar, seq, step),
                               &result_elements))
        result_elements = SIZE_MAX;
    if (req->io_thread && admission_io_thread_fits(&ar->job, result_elements) != 0)
        return ADMISSION_DEFER;
    int rc = admission_admit(cfg, &ar->job, result_elements, RESPONSE_BYTES_PER_NUMBER,
                             "set return_attention to false", &response_bytes, &reserved_bytes,
                             err);
    if (rc != 0)
        return rc;
    if ((rc = sequence_step_load(ar, step, err)) != 0) {
        admission_release(reserved_bytes);
        return rc;
    }
    attn_result result;
    memset(&result, 0, sizeof result); /* untouched by a deferred run, freed on failure */
    double start = compute_now();
    sample->input = start - started;
    rc = admission_run(&ar->job, req->io_thread, &result, err);
    if (rc == 0)
        rc = sequence_step_answer(ar, seq, step, &result, err);
    if (rc != 0) {
        attention_result_free(&result);
        admission_release(reserved_bytes);
        return rc;
    }
    double ran = compute_now();
    model_stats_computed(sample, start, ran, result.compute_ms);
    jw_buf w;
    jw_init(&w, response_bytes / 2 + 512);
    /* The computation's own time, without the wait for a compute slot. */
    attention_json_sequence in_seq = {seq, step};
    attention_json_encode(ar, &result, result.compute_ms, seq->in_sequence ? &in_seq : NULL, &w);
    /* the answer is made: the step's keys join the sequence (its weights received may
     * still be the result's) */
    sequence_step_commit(step);
    attention_result_free(&result);
    admission_release(reserved_bytes);
    answer_jw(resp, 200, &w);
    sample->output = compute_now() - ran;
    sample->batch = ar->job.batch;
    return 0;
}

void v1_attention_handle(const api_request *req, const api_env *env, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    attention_request ar;
    sequence_ask seq;
    sequence_step step;
    memset(&seq, 0, sizeof seq);
    memset(&step, 0, sizeof step);
    weight_set *set = NULL;
    double started = compute_now();
    model_stats_sample sample = {req->queued_at > 0 ? started - req->queued_at : 0, 0, 0, 0, 1};
    int rc = decode_body(req, env->cfg, &ar, &seq, &err);
    if (rc == 0)
        rc = sequence_step_draining(&seq, env->draining, &err);
    if (rc == 0 && ar.weights_name[0]) {
        /* Hold a reference for the whole computation: a concurrent replace or
         * delete of the name cannot change or free these numbers. */
        rc = find_named_set(req, env->store, &ar, &set, resp, &err);
        if (rc == 0)
            rc = bind_named_set(&ar, set, &err);
    }
    if (rc == 0 && seq.in_sequence) {
        /* the sequence's turn may mean waiting: never on an I/O thread */
        sequence_model on = {set != NULL ? set->name : ATTENTION_MODEL_BUILTIN,
                             set != NULL ? set->generation : 0, ar.mask != NULL, ar.has_context,
                             ar.has_inline_weights};
        if (ar.x != NULL)
            seq.q_field = "x";
        rc = req->io_thread ? ADMISSION_DEFER : sequence_step_begin(&ar, &seq, &on, &step, &err);
        /* the decoder left these to the step: they count the cache's keys */
        if (rc == 0 && (rc = attention_request_check_pool(&ar, &err)) == 0)
            rc = attention_request_check_reduce(&ar, &err);
    }
    if (rc == 0)
        rc = compute_and_answer(req, env->cfg, &ar, &seq, &step, started, &sample, resp, &err);
    const char *model = set != NULL ? set->name : ATTENTION_MODEL_BUILTIN;
    double handled = compute_now() - started;
    if (rc == 0)
        model_stats_success(model, &sample);
    else if (rc != ADMISSION_DEFER) /* a deferred request is counted by its worker */
        model_stats_failure(model, sample.queue + handled);
    if (rc != ADMISSION_DEFER)
        answer_note_attention(resp, req, model, &sample, rc == 0, handled);
    sequence_step_finish(&seq, &step);
    attention_request_free(&ar);
    weightset_release(set);
    if (rc == ADMISSION_DEFER) {
        resp->deferred = 1;     /* for a worker */
    } else if (rc != 0) {
        answer_error(resp, &err);
    }
}

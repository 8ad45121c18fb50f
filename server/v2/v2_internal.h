/*
 * v2_internal.h - what the files of the v2 protocol share, and nobody else
 * includes: the model a path names, the outputs a request
 * asks for, and the helpers that fill an answer.
 *
 * v2.c holds the models and the metadata answers; v2_request.c reads an
 * inference body's JSON header into the neutral request (api_infer.h);
 * v2_infer.c applies v2's rules to that request and reads it into an
 * attention_request; v2_answer.c writes the inference answer (JSON, or JSON
 * then binary bytes); v2_stats.c the statistics and the repository index.
 */
#ifndef ATTN_V2_INTERNAL_H
#define ATTN_V2_INTERNAL_H

#include "message/api_message.h"
#include "kernel/attention.h"
#include "request/attention_request.h"
#include "request/sequence_step.h"
#include "core/error.h"
#include "json/jsonw.h"
#include "store/store.h"
#include "v2.h"
#include "v2_tensor.h"

#define V2_MODEL_VERSION "1"

/* A model resolved from the path: the built-in attention, or a stored set
 * (a reference the caller drops with v2_model_close). */
typedef struct v2_model {
    const char *name;
    weight_set *set;        /* NULL for the built-in model */
} v2_model;

/* Resolves the model and version a path captured (args, borrowed; version
 * "" for any).  Returns 0, or ERR_NOT_FOUND with err naming "model" or
 * "version"; m holds nothing then. */
int v2_model_open(const api_env *env, const route_args *args, v2_model *m, attn_error *err);

/* Drops the reference m holds (harmless when it holds none). */
void v2_model_close(v2_model *m);

/* Fills r from root, a parsed JSON inference header (borrowed: r borrows
 * from it), with what each field the rules read holds; *params is the array
 * r->params points at (caller frees with mem_free, also on failure).
 * Returns 0, or the out-of-memory error. */
int v2_request_from_json(const struct json_t *root, api_infer_request *r,
                         api_infer_param **params, attn_error *err);

/* The outputs a model answers: q and k (after the projections) only when asked for, and the
 * reductions of the weights (kernel/attention_reduce.h) when their parameters ask for them. */
enum {
    V2_OUT_OUTPUT, V2_OUT_ATTENTION, V2_OUT_Q, V2_OUT_K,
    V2_OUT_ENTROPY, V2_OUT_MAX_WEIGHT, V2_OUT_ARGMAX, V2_OUT_RECEIVED, V2_OUT_SINK, V2_OUT_LOCAL,
    V2_OUT_TOPK_INDICES, V2_OUT_TOPK_WEIGHTS,
    /* a sequence's step (request/sequence_step.h): the keys cached, and their totals; under
     * a cache policy, their positions and, with compare_full, the damage */
    V2_OUT_LENGTH, V2_OUT_RECEIVED_TOTAL, V2_OUT_KEPT_POSITIONS, V2_OUT_LOST_MASS,
    V2_OUT_OUTPUT_ERROR, V2_OUT_COUNT
};

/* The outputs' names, by V2_OUT_*. */
extern const char *const v2_output_names[V2_OUT_COUNT];

/* The request parameter a reduction output needs ("max" for argmax), or NULL for the others. */
const char *v2_output_parameter(int which);

/* Whether the reduction output `which` is asked for by the parameters in r (NULL: none). */
int v2_output_asked(const attn_reduce *r, int which);

/* The outputs asked for, in the order asked, each as JSON or binary. */
typedef struct v2_outputs {
    size_t n;
    int which[V2_OUT_COUNT];
    int binary[V2_OUT_COUNT];
} v2_outputs;

/* What the inference answer says besides the result. */
typedef struct v2_answer_head {
    const char *model;      /* the model's name */
    const char *id;         /* the request's id, or NULL */
    v2_datatype dtype;      /* of every float output (output_datatype) */
    const v2_outputs *outs;
    int fields_only;        /* api_request.fields_only */
    const sequence_step *step; /* a sequence's step (its outputs), else NULL */
} v2_answer_head;

/* Writes the 200 answer of an inference into resp: the JSON header with the
 * outputs asked for (JSON data, or binary_data_size with the bytes after the
 * header), the scale, heads and compute_ms, every float output in head->dtype;
 * with head->fields_only and every output binary, the bytes alone and
 * resp->infer saying the rest.
 * hint is the expected size of the JSON numbers.  Returns 0; or, with resp
 * untouched and err set, ERR_BAD_REQUEST when an output holds a finite number
 * that would be Inf in head->dtype (naming the output and the element), or
 * the out-of-memory error. */
int v2_answer_infer(const v2_answer_head *head, const attention_request *ar,
                    const attn_result *res, double compute_ms, size_t hint, api_response *resp,
                    attn_error *err);

#endif

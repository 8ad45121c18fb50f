/*
 * v2_infer.c - POST /v2/models/{model}/infer: the request read into an
 * attention_request, the limits, the computation, and the answer
 * (v2_answer.c).
 *
 * The rules read the neutral request (message/api_infer.h), which
 * v2_request.c fills from a body's JSON header and a front-end such as gRPC
 * fills from its own message, so that every wire is refused in the same
 * words.
 *
 * Inference runs in the order v1 does: every input is described (name,
 * datatype, shape, where its numbers are) and the shapes checked against
 * each other (attention_request) and against the element and memory limits
 * before any array is allocated; then the numbers are read (binary FP32
 * tensors where they lie in the body, which the HTTP layer placed on a cache
 * line, other binary tensors copied into the arrays; see v2_tensor.h), the
 * header's JSON tree is freed, and the math runs.  The error of a rule between inputs carries the input's place,
 * "inputs[1].shape", and v2's error body puts it before v1's words.
 */
#include "v2_internal.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "request/admission.h"
#include "message/answer.h"
#include "core/compute.h"
#include "json/json_fast.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "metrics/model_stats.h"
#include "request/sequence_step.h"
#include "request/weights_json.h"

/* Bytes a JSON-encoded output number takes at most, as on v1. */
#define V2_JSON_BYTES_PER_NUMBER 26

/* The inputs of a model, by slot. */
enum { IN_Q, IN_K, IN_V, IN_X, IN_CONTEXT, IN_MASK, IN_COUNT };
static const char *const input_names[IN_COUNT] = {"q", "k", "v", "x", "context", "mask"};
/* A front-end refuses more inputs or outputs than these before it decodes them. */
_Static_assert(IN_COUNT == API_INFER_MAX_INPUTS, "v2's inputs, as message/ says them");
_Static_assert(V2_OUT_COUNT == API_INFER_MAX_OUTPUTS, "v2's outputs, as message/ says them");

/* Everything one inference request holds while it runs. */
typedef struct v2_infer {
    v2_model model;
    json_t *root;           /* the JSON header, when the body brought one */
    api_infer_request parsed;   /* what root says, as fields */
    api_infer_param *params;    /* parsed.params (mem_free) */
    const api_infer_request *r; /* what the rules read: parsed, or the front-end's */
    attention_request ar;
    v2_tensor in[IN_COUNT];
    int have[IN_COUNT];
    char place[IN_COUNT][ATTENTION_FIELD_MAX]; /* "inputs[i].shape" of each input */
    v2_datatype dtype;      /* of the float outputs (parameters.output_datatype) */
    int dtype_given;        /* output_datatype was given */
    v2_outputs outs;
    char id[256];
    int has_id;
    int arena;              /* the JSON arena (mem.h) holds root */
    sequence_ask seq;       /* the sequence the request steps, if any */
    char dtype_place[ATTENTION_FIELD_MAX]; /* "inputs[i].datatype" of its first input */
    sequence_step step;
} v2_infer;

/* The request parameter key, or NULL when absent. */
static const scalar *param(const v2_infer *st, const char *key)
{
    return api_infer_param_get(st->r, key);
}

/* Reads a boolean v (NULL or absent: def) named by path in errors. */
static int get_bool(const scalar *v, const char *path, int def, int *out, attn_error *err)
{
    *out = def;
    if (v == NULL || v->kind == SCALAR_ABSENT)
        return 0;
    if (v->kind != SCALAR_BOOL)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path, "%s is %s; it must be true or "
                         "false.", path, scalar_kind_words(v));
    *out = v->boolean;
    return 0;
}

/* "outputs[INDEX]" followed by what in field, which it returns: for the error paths
 * (formatting the fields of every output of every request cost instructions a small
 * request notices). */
static const char *output_field(char *field, size_t len, size_t index, const char *what)
{
    snprintf(field, len, "outputs[%zu]%s", index, what);
    return field;
}

static int decode_outputs(const api_infer_request *r, int binary_default, v2_outputs *o,
                          attn_error *err)
{
    memset(o, 0, sizeof *o);
    if (r->outputs.kind == SCALAR_ABSENT) {
        o->n = 2;
        o->which[0] = V2_OUT_OUTPUT;
        o->which[1] = V2_OUT_ATTENTION;
        o->binary[0] = o->binary[1] = binary_default;
        return 0;
    }
    if (r->outputs.kind != SCALAR_ARRAY || r->outputs.size == 0 || r->outputs.size > V2_OUT_COUNT)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "outputs",
                         "outputs must be an array of 1 to %d objects naming \"output\", "
                         "\"attention\", \"q\", \"k\" or a reduction (\"entropy\", "
                         "\"max_weight\", \"argmax\", \"received\", \"sink\", \"local\", "
                         "\"topk_indices\", \"topk_weights\"), or in a sequence \"length\", "
                         "\"received_total\", \"kept_positions\", \"lost_mass\" or "
                         "\"output_error\".", V2_OUT_COUNT);
    for (size_t i = 0; i < r->n_outputs; i++) {
        const api_infer_output *e = &r->output[i];
        char field[64]; /* formatted on the error paths only */
        const scalar *name = &e->name;
        int is_string = name->kind == SCALAR_STRING;
        const char *s = is_string ? name->string : "";
        int which = -1;
        for (int w = 0; w < V2_OUT_COUNT && which < 0; w++)
            if (!strcmp(s, v2_output_names[w]))
                which = w;
        if (which < 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             output_field(field, sizeof field, i, ".name"),
                             "%s must be \"output\", \"attention\", \"q\", \"k\" or a "
                             "reduction: \"entropy\", \"max_weight\", \"argmax\", "
                             "\"received\", \"sink\", \"local\", \"topk_indices\" or "
                             "\"topk_weights\"; in a sequence also \"length\", "
                             "\"received_total\", \"kept_positions\", \"lost_mass\" or "
                             "\"output_error\" (got %s%.40s%s).", field,
                             is_string ? "\"" : "", is_string ? s : scalar_kind_words(name),
                             is_string ? "\"" : "");
        for (size_t j = 0; j < o->n; j++)
            if (o->which[j] == which)
                return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                                 output_field(field, sizeof field, i, ".name"),
                                 "%s names \"%s\" a second time.", field, s);
        int binary = binary_default;
        if (e->parameters.kind != SCALAR_ABSENT && e->parameters.kind != SCALAR_OBJECT)
            return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                             output_field(field, sizeof field, i, ".parameters"),
                             "%s must be an object.", field);
        if (e->binary_data.kind != SCALAR_ABSENT) {
            output_field(field, sizeof field, i, ".parameters.binary_data");
            int rc = get_bool(&e->binary_data, field, binary_default, &binary, err);
            if (rc != 0)
                return rc;
        }
        o->which[o->n] = which;
        o->binary[o->n] = binary;
        o->n++;
    }
    return 0;
}

/* What the number rules of attention_request are given of v: NULL for a number, else what
 * it is instead. */
static const char *not_number(const scalar *v)
{
    return scalar_is_number(v) ? NULL : scalar_kind_words(v);
}

/* attention_pool_rows, attention_pool_cols and attention_pool_reduce: v1's attention_pool
 * as three parameters, both sides or neither, by attention_request's rules. */
static int decode_pool_parameters(const v2_infer *st, attention_request *ar, attn_error *err)
{
    const scalar *jr = param(st, "attention_pool_rows");
    const scalar *jc = param(st, "attention_pool_cols");
    const scalar *jd = param(st, "attention_pool_reduce");
    if (jr == NULL && jc == NULL && jd == NULL)
        return 0;
    if (jr == NULL || jc == NULL)
        return error_set(err, ERR_BAD_REQUEST, "missing_field",
                         jr == NULL ? "parameters.attention_pool_rows"
                                    : "parameters.attention_pool_cols",
                         "The pooled attention needs both attention_pool_rows and "
                         "attention_pool_cols (1 to %d each).", ATTN_POOL_MAX_SIDE);
    int rc, mean = 0;
    size_t rows, cols;
    if ((rc = attention_request_pool_side(not_number(jr), scalar_number(jr),
                                          "parameters.attention_pool_rows", &rows, err)) != 0 ||
        (rc = attention_request_pool_side(not_number(jc), scalar_number(jc),
                                          "parameters.attention_pool_cols", &cols, err)) != 0)
        return rc;
    if (jd != NULL) {
        const char *s = jd->kind == SCALAR_STRING ? jd->string : "";
        if (strcmp(s, "max") != 0 && strcmp(s, "mean") != 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             "parameters.attention_pool_reduce",
                             "attention_pool_reduce must be \"max\" or \"mean\".");
        mean = strcmp(s, "mean") == 0;
    }
    attention_request_set_pool(ar, rows, cols, mean ? ATTN_POOL_MEAN : ATTN_POOL_MAX);
    ar->pool_queries_field = "parameters.attention_pool_query_start";
    ar->pool_keys_field = "parameters.attention_pool_key_start";
    /* the window: four whole numbers, ends exclusive, checked against the shapes later */
    static const char *const names[4] = {"attention_pool_query_start", "attention_pool_query_end",
                                         "attention_pool_key_start", "attention_pool_key_end"};
    size_t *ends[4] = {&ar->pool.q_start, &ar->pool.q_end, &ar->pool.k_start, &ar->pool.k_end};
    for (int i = 0; i < 4; i++) {
        const scalar *v = param(st, names[i]);
        if (v == NULL)
            continue;
        double d = scalar_number(v);
        char field[64];
        snprintf(field, sizeof field, "parameters.%s", names[i]);
        if (!scalar_is_number(v) || d < 0 || d != floor(d) || d > 1e15 || (i % 2 == 1 && d < 1))
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                             "%s must be a whole number%s.", field,
                             i % 2 == 1 ? " >= 1 (an end, not included)" : " >= 0");
        *ends[i] = (size_t)d;
    }
    return 0;
}

/* Triton's sequence parameters (sequence_id, sequence_start, sequence_end) and what a
 * sequence's step answers besides (received_total), by request/sequence_step.h's rules. */
static int decode_sequence_parameters(v2_infer *st, attn_error *err)
{
    sequence_ask *a = &st->seq;
    a->start_field = "parameters.sequence_start";
    a->end_field = "parameters.sequence_end";
    a->received_total_field = "parameters.received_total";
    a->heads_field = "parameters.heads";
    a->scale_field = "parameters.scale";
    a->policy_prefix = "parameters.";
    a->causal_given = param(st, "causal") != NULL;
    int rc;
    for (int i = 0; i < SEQUENCE_POLICY_PARAMS; i++)
        if ((rc = sequence_ask_policy(a, sequence_policy_params[i],
                                      param(st, sequence_policy_params[i]), err)) != 0)
            return rc;
    if ((rc = sequence_ask_id(a, param(st, "sequence_id"), "parameters.sequence_id", err)) != 0 ||
        (rc = get_bool(param(st, "sequence_start"), a->start_field, 0, &a->start, err)) != 0 ||
        (rc = get_bool(param(st, "sequence_end"), a->end_field, 0, &a->end, err)) != 0 ||
        (rc = get_bool(param(st, "received_total"), a->received_total_field, 0,
                       &a->received_total, err)) != 0)
        return rc;
    return sequence_ask_check(a, err);
}

/* The request-level parameters: causal, scale, heads, binary_data_output, the pool.
 * heads, scale and the pool follow the rules of v1's members of the same name. */
static int decode_parameters(v2_infer *st, attention_request *ar, int *binary_output,
                             attn_error *err)
{
    *binary_output = 0;
    ar->job.heads = 1;
    const scalar *p = &st->r->parameters;
    if (p->kind == SCALAR_ABSENT)
        return 0;
    if (p->kind != SCALAR_OBJECT)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "parameters",
                         "parameters is %s; it must be an object.", scalar_kind_words(p));
    int rc, causal;
    if ((rc = get_bool(param(st, "causal"), "parameters.causal", 0, &causal, err)) != 0 ||
        (rc = get_bool(param(st, "binary_data_output"), "parameters.binary_data_output", 0,
                       binary_output, err)) != 0)
        return rc;
    ar->job.causal = causal;
    if ((rc = decode_sequence_parameters(st, err)) != 0)
        return rc;
    size_t heads;
    static const scalar absent = {.kind = SCALAR_ABSENT};
    const scalar *h = param(st, "heads");
    if ((rc = weights_json_heads_value(h != NULL ? h : &absent, 0, &heads, err)) != 0) {
        snprintf(err->field, sizeof err->field, "parameters.heads");
        return rc;
    }
    ar->heads_given = heads != 0;
    ar->job.heads = heads != 0 ? heads : 1;
    const scalar *s = param(st, "scale");
    if (s != NULL && (rc = attention_request_set_scale(ar, not_number(s), scalar_number(s),
                                                       "parameters.scale", err)) != 0)
        return rc;
    if ((rc = decode_pool_parameters(st, ar, err)) != 0)
        return rc;
    /* the reductions, by v1's rules for its "reductions" members of the same names */
    static const char *const reductions[] = {"entropy", "max", "received", "sink", "local",
                                             "topk"};
    for (size_t i = 0; i < sizeof reductions / sizeof reductions[0]; i++) {
        const scalar *v = param(st, reductions[i]);
        if (v == NULL)
            continue;
        char field[ATTENTION_FIELD_MAX];
        snprintf(field, sizeof field, "parameters.%s", reductions[i]);
        if ((rc = attention_request_reduce_param(ar, reductions[i], v, field, err)) != 0)
            return rc;
    }
    return 0;
}

/* The outputs and the reduction parameters agree: a listed reduction output needs its
 * parameter, and a reduction asked for needs one of its outputs listed (as the pooling
 * parameters need "attention"); 400 "conflicting_fields" at the parameter otherwise.  With no
 * outputs listed, every reduction asked for is answered after "output" (and "attention" only
 * when pooled: a request for reductions is one too long for the full matrix). */
static int match_reductions(const api_infer_request *req, v2_outputs *o,
                            const attention_request *ar, attn_error *err)
{
    const attn_reduce *r = ar->job.reduce;
    if (req->outputs.kind == SCALAR_ABSENT && attention_reduce_any(r)) {
        int binary = o->binary[0];
        o->n = ar->job.pool != NULL ? 2 : 1;    /* output, and attention when pooled */
        for (int w = V2_OUT_ENTROPY; w < V2_OUT_COUNT; w++)
            if (v2_output_asked(r, w)) {
                o->which[o->n] = w;
                o->binary[o->n++] = binary;
            }
        return 0;
    }
    int named[V2_OUT_COUNT] = {0};
    for (size_t i = 0; i < o->n; i++) {
        int w = o->which[i];
        named[w] = 1;
        /* a sequence's outputs are match_sequence_outputs' */
        if (v2_output_parameter(w) == NULL || v2_output_asked(r, w) ||
            w >= V2_OUT_LENGTH)
            continue;
        char field[ATTENTION_FIELD_MAX];
        snprintf(field, sizeof field, "parameters.%s", v2_output_parameter(w));
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", field,
                         "outputs[%zu] names \"%s\", which needs parameters.%s%s.", i,
                         v2_output_names[w], v2_output_parameter(w),
                         w == V2_OUT_TOPK_INDICES || w == V2_OUT_TOPK_WEIGHTS ? " (k)" :
                         w == V2_OUT_SINK || w == V2_OUT_LOCAL ? " (a width)" : ": true");
    }
    for (int w = V2_OUT_ENTROPY; w < V2_OUT_COUNT; w++) {
        /* both outputs of max and of topk count: either one is enough */
        int pair = w == V2_OUT_MAX_WEIGHT   ? V2_OUT_ARGMAX
                   : w == V2_OUT_ARGMAX     ? V2_OUT_MAX_WEIGHT
                   : w == V2_OUT_TOPK_INDICES ? V2_OUT_TOPK_WEIGHTS
                   : w == V2_OUT_TOPK_WEIGHTS ? V2_OUT_TOPK_INDICES
                                              : w;
        if (v2_output_asked(r, w) && !named[w] && !named[pair]) {
            char field[ATTENTION_FIELD_MAX];
            snprintf(field, sizeof field, "parameters.%s", v2_output_parameter(w));
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", field,
                             "%s asks for the \"%s\" output, which outputs does not name.",
                             field, v2_output_names[w]);
        }
    }
    return 0;
}

/* The outputs of a sequence's step: with no outputs listed, received_total (when asked) and
 * length follow the others; listed, received_total needs its parameter and the parameter its
 * output, and neither it nor length is answered outside a sequence (400 conflicting_fields). */
static int match_sequence_outputs(const api_infer_request *req, v2_outputs *o,
                                  const sequence_ask *a, attn_error *err)
{
    if (req->outputs.kind == SCALAR_ABSENT) {
        if (!a->in_sequence)
            return 0;
        int binary = o->binary[0];
        if (a->received_total) {
            o->which[o->n] = V2_OUT_RECEIVED_TOTAL;
            o->binary[o->n++] = binary;
        }
        o->which[o->n] = V2_OUT_LENGTH;
        o->binary[o->n++] = binary;
        return 0;
    }
    int named_total = 0;
    for (size_t i = 0; i < o->n; i++) {
        int w = o->which[i];
        named_total |= w == V2_OUT_RECEIVED_TOTAL;
        if (w >= V2_OUT_LENGTH && !a->in_sequence)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                             "parameters.sequence_id",
                             "outputs[%zu] names \"%s\", which a sequence's step answers; name "
                             "the sequence with parameters.sequence_id.", i, v2_output_names[w]);
        if (w == V2_OUT_RECEIVED_TOTAL && !a->received_total)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                             "parameters.received_total",
                             "outputs[%zu] names \"received_total\", which needs "
                             "parameters.received_total: true.", i);
    }
    if (a->received_total && !named_total)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "parameters.received_total",
                         "parameters.received_total asks for the \"received_total\" output, "
                         "which outputs does not name.");
    return 0;
}

/* The outputs of a cache policy, once the step knows its sequence's policy: with no outputs
 * listed, kept_positions follows under an evicting policy, lost_mass and output_error with
 * compare_full; listed, each needs them (400 conflicting_fields at parameters.sequence_id). */
static int match_policy_outputs(const api_infer_request *req, v2_outputs *o,
                                const sequence_step *step, attn_error *err)
{
    const sequence_policy *p = &sequence_shape_of(step->seq)->policy;
    int has[V2_OUT_COUNT] = {0};
    has[V2_OUT_KEPT_POSITIONS] = sequence_policy_evicts(p);
    has[V2_OUT_LOST_MASS] = has[V2_OUT_OUTPUT_ERROR] = p->compare_full;
    if (req->outputs.kind == SCALAR_ABSENT) {
        for (int w = V2_OUT_KEPT_POSITIONS; w <= V2_OUT_OUTPUT_ERROR; w++)
            if (has[w]) {
                o->which[o->n] = w;
                o->binary[o->n++] = o->binary[0];
            }
        return 0;
    }
    for (size_t i = 0; i < o->n; i++)
        if (o->which[i] >= V2_OUT_KEPT_POSITIONS && !has[o->which[i]])
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                             "parameters.sequence_id",
                             "outputs[%zu] names \"%s\", which a sequence answers when its "
                             "start chose %s; this sequence's did not.", i,
                             v2_output_names[o->which[i]],
                             o->which[i] == V2_OUT_KEPT_POSITIONS
                                 ? "a cache_policy that evicts (window, h2o or snapkv)"
                                 : "compare_full: true with such a policy");
    return 0;
}

/* parameters.output_datatype: the datatype of every float output, FP16, BF16,
 * FP32 or FP64 (absent: check_inputs chooses). */
static int decode_output_datatype(v2_infer *st, attn_error *err)
{
    const scalar *v = st->r->parameters.kind == SCALAR_OBJECT ? param(st, "output_datatype") : NULL;
    if (v == NULL)
        return 0;
    int is_string = v->kind == SCALAR_STRING;
    if (!is_string || v2_datatype_float(v->string, &st->dtype) != 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "parameters.output_datatype",
                         "parameters.output_datatype is %s%.20s%s; it must be \"FP16\", "
                         "\"BF16\", \"FP32\" or \"FP64\".", is_string ? "\"" : "",
                         is_string ? v->string : scalar_kind_words(v), is_string ? "\"" : "");
    st->dtype_given = 1;
    return 0;
}

/* The id, the parameters and the outputs asked for. */
static int describe_head(v2_infer *st, attn_error *err)
{
    const api_infer_request *r = st->r;
    if (r->self.kind != SCALAR_OBJECT)
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The JSON header is %s; it must be an object with \"inputs\".",
                         scalar_kind_words(&r->self));
    const scalar *id = &r->id;
    if (id->kind != SCALAR_ABSENT) {
        if (id->kind != SCALAR_STRING || id->size >= sizeof st->id)
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", "id",
                             "id must be a string of at most %zu bytes.", sizeof st->id - 1);
        memcpy(st->id, id->string, id->size + 1);
        st->has_id = 1;
    }
    int rc, binary_output;
    if ((rc = decode_parameters(st, &st->ar, &binary_output, err)) != 0 ||
        (rc = decode_output_datatype(st, err)) != 0 ||
        (rc = decode_outputs(r, binary_output, &st->outs, err)) != 0 ||
        (rc = match_reductions(r, &st->outs, &st->ar, err)) != 0 ||
        (rc = match_sequence_outputs(r, &st->outs, &st->seq, err)) != 0)
        return rc;
    int attention = 0, output = 0;
    for (size_t i = 0; i < st->outs.n; i++) {
        attention |= st->outs.which[i] == V2_OUT_ATTENTION;
        output |= st->outs.which[i] == V2_OUT_OUTPUT;
        st->ar.job.want_qk |= st->outs.which[i] == V2_OUT_Q || st->outs.which[i] == V2_OUT_K;
    }
    if (st->ar.job.pool != NULL && !attention)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                         "parameters.attention_pool_rows",
                         "attention_pool_rows and attention_pool_cols pool the \"attention\" "
                         "output, which outputs does not ask for.");
    /* a pooled attention takes the matrix's place */
    st->ar.job.want_attention = attention && st->ar.job.pool == NULL;
    st->ar.job.skip_output = !output && !st->ar.job.want_attention;
    return 0;
}

static int input_slot(int builtin, const char *name)
{
    static const int builtin_slots[] = {IN_Q, IN_K, IN_V, IN_MASK};
    static const int set_slots[] = {IN_X, IN_CONTEXT, IN_MASK};
    const int *slots = builtin ? builtin_slots : set_slots;
    size_t n = builtin ? 4 : 3;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, input_names[slots[i]]))
            return slots[i];
    return -1;
}

/* "inputs[INDEX].WHAT" of t in buf, which it returns: for the error paths. */
static char *field_of(const v2_tensor *t, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "inputs[%zu].%s", t->index, what);
    return buf;
}

/* Describes each of "inputs" into its slot, without reading a number. */
static int describe_inputs(v2_infer *st, const api_env *env, v2_body *body, attn_error *err)
{
    int builtin = st->model.set == NULL, rc;
    const api_infer_request *r = st->r;
    if (r->inputs.kind != SCALAR_ARRAY || r->inputs.size == 0)
        return error_set(err, ERR_BAD_REQUEST,
                         r->inputs.kind != SCALAR_ABSENT ? "wrong_type" : "missing_field", "inputs",
                         "inputs must be a non-empty array; model \"%s\" takes %s.",
                         st->model.name, builtin ? "q, k, v and optionally mask"
                                                 : "x, and optionally context and mask");
    /* r holds the first API_INFER_MAX_INPUTS + 1 inputs: the last of them is refused below
     * at the latest, its name being unknown or taken */
    for (size_t i = 0; i < r->n_inputs; i++) {
        v2_tensor t;
        if ((rc = v2_tensor_describe(&r->input[i], i, body, env->cfg->max_elements,
                                     &st->ar.input_elements, &t, err)) != 0)
            return rc;
        int slot = input_slot(builtin, t.name);
        char f[64];
        if (slot < 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             field_of(&t, "name", f, sizeof f),
                             "%s is \"%s\", which model \"%s\" does not take; its inputs are %s.",
                             f, t.name, st->model.name,
                             builtin ? "q, k, v and mask" : "x, context and mask");
        if (st->have[slot])
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             field_of(&t, "name", f, sizeof f),
                             "%s names input \"%s\" a second time.", f, t.name);
        st->in[slot] = t;
        st->have[slot] = 1;
        snprintf(st->place[slot], sizeof st->place[slot], "inputs[%zu].shape", i);
    }
    assert(r->n_inputs == r->inputs.size);
    return v2_body_check_consumed(body, err);
}

/* Checks what the wire alone says of a numeric input: a number datatype,
 * the datatype of the first input ref, and a rank of 2 or 3. */
static int check_numeric(const v2_tensor *t, const v2_tensor *ref, attn_error *err)
{
    char f[64];
    if (t->datatype == V2_BOOL)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                         field_of(t, "datatype", f, sizeof f),
                         "%s of input \"%s\" is BOOL; it must be FP32, FP64, FP16 or BF16.", f,
                         t->name);
    if (t->rank != 2 && t->rank != 3)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", field_of(t, "shape", f, sizeof f),
                         "%s of input \"%s\" has %zu dimensions; it must be [L, d] or [B, L, d].",
                         f, t->name, t->rank);
    if (t->datatype != ref->datatype)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                         field_of(t, "datatype", f, sizeof f),
                         "%s of input \"%s\" is %s but input \"%s\" is %s; numeric inputs share "
                         "one datatype.", f, t->name, v2_datatype_name(t->datatype), ref->name,
                         v2_datatype_name(ref->datatype));
    return 0;
}

/* What the rules see of the input in slot s: its last two dimensions are
 * tokens and features, a third before them the batch. */
static attention_input input_of(const v2_infer *st, int s)
{
    const v2_tensor *t = &st->in[s];
    attention_input in = {input_names[s], st->place[s], (int)t->rank, 1, 0, 0};
    if (t->rank >= 2) {
        in.tokens = t->dims[t->rank - 2];
        in.features = t->dims[t->rank - 1];
    }
    if (t->rank == 3)
        in.batch = t->dims[0];
    return in;
}

/* Checks that the model's required inputs are there and that the numeric
 * ones agree in datatype and rank; sets the job's precision: float64 for FP64
 * inputs, float32 for the others (FP16 and BF16 widen exactly to float32), unless
 * parameters.compute_precision names one (attention_request_set_precision).  The
 * outputs are by default in the precision of the computation, as the metadata
 * declares them (FP32; FP64 for FP64 inputs): a 16-bit answer is asked for with
 * output_datatype, never a rounding the client did not ask for. */
static int check_inputs(v2_infer *st, attn_error *err)
{
    static const int builtin_req[] = {IN_Q, IN_K, IN_V};
    static const int set_req[] = {IN_X};
    int builtin = st->model.set == NULL, rc;
    const int *req_slots = builtin ? builtin_req : set_req;
    size_t n_req = builtin ? 3 : 1;
    for (size_t i = 0; i < n_req; i++)
        if (!st->have[req_slots[i]])
            return error_set(err, ERR_BAD_REQUEST, "missing_field", "inputs",
                             "inputs has no \"%s\"; model \"%s\" needs %s.",
                             input_names[req_slots[i]], st->model.name,
                             builtin ? "q, k and v" : "x");
    const v2_tensor *ref = &st->in[req_slots[0]];
    for (int s = 0; s < IN_MASK; s++)
        if (st->have[s] && (rc = check_numeric(&st->in[s], ref, err)) != 0)
            return rc;
    st->ar.job.dtype = ref->datatype == V2_FP64 ? ATTN_FLOAT64 : ATTN_FLOAT32;
    const scalar *precision = st->r->parameters.kind == SCALAR_OBJECT
                                  ? param(st, "compute_precision") : NULL;
    if (precision != NULL &&
        (rc = attention_request_set_precision(&st->ar, precision->kind == SCALAR_STRING ? NULL
                                                       : scalar_kind_words(precision),
                                              precision->string,
                                              "parameters.compute_precision", err)) != 0)
        return rc;
    int f64 = st->ar.job.dtype == ATTN_FLOAT64;
    if (!st->dtype_given)
        st->dtype = f64 ? V2_FP64 : V2_FP32;
    /* a float32 job's outputs reach the encoder as the kernels formed them (v2_answer.c) */
    st->ar.job.output_f32 = !f64;
    return 0;
}

/* Shapes the job from q, k and v, or from x and context with the model's
 * stored set bound. */
static int shape_job(v2_infer *st, attn_error *err)
{
    if (st->model.set == NULL) {
        attention_input qkv[3] = {input_of(st, IN_Q), input_of(st, IN_K), input_of(st, IN_V)};
        return attention_request_shape_qkv(&st->ar, qkv, err);
    }
    const weight_set *set = st->model.set;
    attention_input x = input_of(st, IN_X), ctx = input_of(st, IN_CONTEXT);
    int rc = attention_request_shape_x(&st->ar, &x, st->have[IN_CONTEXT] ? &ctx : NULL, err);
    if (rc != 0)
        return rc;
    return attention_request_bind_set(&st->ar, set->name, &set->w, set->heads, err);
}

/* Checks the mask's datatype and rank here, its shape by the rules. */
static int shape_mask(v2_infer *st, attn_error *err)
{
    const v2_tensor *m = &st->in[IN_MASK];
    char f[64];
    if (m->datatype != V2_BOOL)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                         field_of(m, "datatype", f, sizeof f),
                         "%s of input \"mask\" is %s; it must be BOOL.", f,
                         v2_datatype_name(m->datatype));
    if (m->rank != 2 && m->rank != 3)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", field_of(m, "shape", f, sizeof f),
                         "%s of input \"mask\" has %zu dimensions; it must be [Lq, Lk] or "
                         "[B, Lq, Lk].", f, m->rank);
    attention_input in = input_of(st, IN_MASK);
    return attention_request_shape_mask(&st->ar, &in, err);
}

/* A step of a sequence: takes the sequence's turn and shapes the job over its cache
 * (request/sequence_step.h), never on an I/O thread, which must not wait for the turn. */
static int begin_step(const api_request *req, v2_infer *st, attn_error *err)
{
    sequence_ask *a = &st->seq;
    if (!a->in_sequence)
        return 0;
    if (req->io_thread)
        return ADMISSION_DEFER;
    int builtin = st->model.set == NULL;
    const int slots[] = {builtin ? IN_Q : IN_X, IN_K, IN_V, IN_MASK, IN_CONTEXT};
    const char **fields[] = {&a->q_field, &a->k_field, &a->v_field, &a->mask_field,
                             &a->context_field};
    for (int i = 0; i < 5; i++)
        *fields[i] = st->place[slots[i]];
    snprintf(st->dtype_place, sizeof st->dtype_place, "inputs[%zu].datatype",
             st->in[st->model.set == NULL ? IN_Q : IN_X].index);
    a->dtype_field = st->dtype_place;
    a->received_asked = st->ar.reduce.received;
    sequence_model on = {st->model.name, builtin ? 0 : st->model.set->generation,
                         st->have[IN_MASK], st->have[IN_CONTEXT], 0};
    int rc = sequence_step_begin(&st->ar, a, &on, &st->step, err);
    return rc != 0 ? rc : match_policy_outputs(st->r, &st->outs, &st->step, err);
}

/* Describes the inputs and checks shapes and parameters into st->ar (no
 * array allocated yet); with a stored set the job is bound to it, in a
 * sequence to the sequence's cache (begin_step). */
static int infer_describe(const api_request *req, v2_infer *st, const api_env *env,
                          v2_body *body, attn_error *err)
{
    int rc;
    attention_request_init(&st->ar);
    st->ar.heads_field = "parameters.heads";
    if ((rc = describe_head(st, err)) != 0 ||
        (rc = sequence_step_draining(&st->seq, env->draining, err)) != 0 ||
        (rc = describe_inputs(st, env, body, err)) != 0 ||
        (rc = check_inputs(st, err)) != 0 || (rc = shape_job(st, err)) != 0 ||
        (st->have[IN_MASK] && (rc = shape_mask(st, err)) != 0) ||
        (rc = begin_step(req, st, err)) != 0)
        return rc;
    if ((rc = attention_request_check_pool(&st->ar, err)) != 0)
        return rc;
    return attention_request_check_reduce(&st->ar, err);
}

/* Allocates and reads a numeric input. */
static int read_input(const v2_tensor *t, double **out, attn_error *err)
{
    *out = mem_malloc(t->count * sizeof(double));
    if (*out == NULL)
        return error_nomem(err);
    return v2_tensor_read_numbers(t, *out, err);
}

/* Reads q, k or v: binary FP32, FP16 or BF16 data as float into *f32 for a job that is
 * not float64 (f64_job 0; the job then computes on it as it came, 16-bit numbers
 * widened), anything else as double into *f64; the job points at the one read. */
static int read_qkv(const v2_tensor *t, int f64_job, double **f64, float **f32,
                    const double **job64, const float **job32, attn_error *err)
{
    if (t->bytes == NULL || t->datatype == V2_FP64 || f64_job) {
        int rc = read_input(t, f64, err);
        *job64 = *f64;
        return rc;
    }
    /* FP32 read where it is in the body when it can be: no copy, no memory of its own. */
    int rc = t->datatype == V2_FP32 ? v2_tensor_view_floats(t, job32, err) : 0;
    if (rc != 0 || *job32 != NULL)
        return rc;
    *f32 = mem_malloc(t->count * sizeof(float));
    if (*f32 == NULL)
        return error_nomem(err);
    *job32 = *f32;
    return v2_tensor_read_floats(t, *f32, err);
}

/* Reads every input's numbers into arrays owned by st->ar. */
static int infer_read(v2_infer *st, attn_error *err)
{
    attention_request *ar = &st->ar;
    attn_job *job = &ar->job;
    int rc;
    if (st->model.set == NULL) {
        int f64 = job->dtype == ATTN_FLOAT64;
        if ((rc = read_qkv(&st->in[IN_Q], f64, &ar->q, &ar->q32, &job->q, &job->q32, err)) != 0 ||
            (rc = read_qkv(&st->in[IN_K], f64, &ar->k, &ar->k32, &job->k, &job->k32, err)) != 0 ||
            (rc = read_qkv(&st->in[IN_V], f64, &ar->v, &ar->v32, &job->v, &job->v32, err)) != 0)
            return rc;
    } else {
        if ((rc = read_input(&st->in[IN_X], &ar->x, err)) != 0)
            return rc;
        job->x = ar->x;
        if (st->have[IN_CONTEXT]) {
            if ((rc = read_input(&st->in[IN_CONTEXT], &ar->context, err)) != 0)
                return rc;
            job->context = ar->context;
        }
    }
    if (st->have[IN_MASK]) {
        ar->mask = mem_malloc(st->in[IN_MASK].count);
        if (ar->mask == NULL)
            return error_nomem(err);
        if ((rc = v2_tensor_read_bools(&st->in[IN_MASK], ar->mask, err)) != 0)
            return rc;
        job->mask = ar->mask;
    }
    return 0;
}

/* Parses the JSON header of body into st->root, in the JSON arena (which
 * the caller ends once the numbers are read, also on failure), and reads it
 * into st->parsed; or takes the request a front-end made as fields. */
static int parse_header(const api_request *req, const v2_body *body, v2_infer *st,
                        attn_error *err)
{
    if (req->infer_request != NULL) { /* made by a front-end: no text to parse */
        st->r = req->infer_request;
        return 0;
    }
    if (body->json_len == 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The JSON header is empty; send an object with \"inputs\".");
    json_error_t jerr;
    memset(&jerr, 0, sizeof jerr);
    mem_json_arena_begin();
    st->arena = 1;
    /* Integers as reals, as on v1: a JSON number is a number however it is
     * written (json_in_whole reads the integer fields). */
    st->root = json_fast_load(body->json, body->json_len,
                              JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL,
                              v2_tensor_data_field, &jerr);
    if (st->root != NULL) {
        st->r = &st->parsed;
        return v2_request_from_json(st->root, &st->parsed, &st->params, err);
    }
    if (json_error_code(&jerr) == json_error_out_of_memory || jerr.text[0] == '\0')
        return error_nomem(err);
    if (json_error_code(&jerr) == json_error_stack_overflow)
        /* Nesting is the fault whatever the framing, so no hint about it. */
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The JSON header nests arrays or objects too deeply: %s (line %d, "
                         "column %d); a tensor has at most a few dimensions.", jerr.text,
                         jerr.line, jerr.column);
    return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                     "The JSON header is not valid JSON: %s (line %d, column %d)%s.", jerr.text,
                     jerr.line, jerr.column,
                     req->inference_header_length.stated ? "" : "; a body with binary tensors needs the "
                     "header Inference-Header-Content-Length");
}

/* Frees the header's tree and closes the arena it was made in. */
static void drop_header(v2_infer *st)
{
    mem_free(st->params);
    st->params = NULL;
    st->r = NULL;
    json_decref(st->root);
    st->root = NULL;
    if (st->arena)
        mem_json_arena_end();
    st->arena = 0;
}

/* The body's parts: the JSON part and the binary section after it, or
 * nothing beside a request given as fields (its inputs say where their
 * bytes are). */
static int infer_body(const api_request *req, v2_body *body, attn_error *err)
{
    if (req->infer_request == NULL)
        return v2_body_split(req->body, req->body_len, req->inference_header_length, body, err);
    memset(body, 0, sizeof *body);
    return 0;
}

/* Reads and checks the request up to a job ready to run: model,
 * framing, header, inputs, limits (reserving the job's memory in
 * *reserved), numbers.  Returns 0, ADMISSION_DEFER, or an ERR_* code. */
static int infer_prepare(const api_request *req, const api_env *env, v2_infer *st,
                         size_t *response_bytes, size_t *reserved, attn_error *err)
{
    v2_body body;
    int rc;
    if ((rc = v2_model_open(env, req->args, &st->model, err)) != 0 ||
        (rc = infer_body(req, &body, err)) != 0 ||
        (rc = parse_header(req, &body, st, err)) != 0 ||
        (rc = infer_describe(req, st, env, &body, err)) != 0)
        return rc;
    int any_json = 0;
    for (size_t i = 0; i < st->outs.n; i++)
        any_json |= !st->outs.binary[i];
    size_t result_elements = attention_request_result_elements(&st->ar);
    size_t extra = sequence_step_extra_elements(&st->ar, &st->seq, &st->step);
    if (result_elements != SIZE_MAX &&
        __builtin_add_overflow(result_elements, extra, &result_elements))
        result_elements = SIZE_MAX;
    if (req->io_thread && (rc = admission_io_thread_fits(&st->ar.job, result_elements)) != 0)
        return rc;
    if ((rc = admission_admit(env->cfg, &st->ar.job, result_elements,
                              any_json ? V2_JSON_BYTES_PER_NUMBER : v2_datatype_size(st->dtype),
                              "ask only for the output \"output\"", response_bytes, reserved,
                              err)) != 0)
        return rc;
    if (!any_json)
        *response_bytes = 0;
    rc = infer_read(st, err);
    drop_header(st);
    if (rc == 0)
        rc = sequence_step_load(&st->ar, &st->step, err);
    return rc;
}

void v2_handle_infer(const api_request *req, const api_env *env, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    v2_infer st;
    memset(&st, 0, sizeof st);
    size_t reserved_bytes = 0, response_bytes = 0;
    attn_result result;
    /* The request's phases, for the statistics of its model (model_stats.h). */
    double started = compute_now();
    model_stats_sample sample = {req->queued_at > 0 ? started - req->queued_at : 0, 0, 0, 0, 1};
    int rc = infer_prepare(req, env, &st, &response_bytes, &reserved_bytes, &err);
    if (rc == 0) {
        double start = compute_now();
        sample.input = start - started;
        rc = admission_run(&st.ar.job, req->io_thread, &result, &err);
        if (rc == 0) {
            double ran = compute_now();
            model_stats_computed(&sample, start, ran, result.compute_ms);
            rc = sequence_step_answer(&st.ar, &st.seq, &st.step, &result, &err);
            /* The computation's own time, without the wait for a compute slot. */
            v2_answer_head head = {st.model.name, st.has_id ? st.id : NULL, st.dtype, &st.outs,
                                   req->fields_only, st.seq.in_sequence ? &st.step : NULL};
            if (rc == 0)
                rc = v2_answer_infer(&head, &st.ar, &result, result.compute_ms,
                                     response_bytes / 2, resp, &err);
            if (rc == 0)
                sequence_step_commit(&st.step);
            attention_result_free(&result);
            sample.output = compute_now() - ran;
            sample.batch = st.ar.job.batch;
            if (rc == 0)
                model_stats_success(st.model.name, &sample);
        }
    }
    /* A request whose model is unknown is counted nowhere; a deferred one
     * is counted by its worker. */
    double handled = compute_now() - started;
    if (rc != 0 && rc != ADMISSION_DEFER && st.model.name != NULL)
        model_stats_failure(st.model.name, sample.queue + handled);
    if (rc != ADMISSION_DEFER)
        answer_note_attention(resp, req, st.model.name != NULL ? st.model.name : "", &sample,
                              rc == 0, handled);
    admission_release(reserved_bytes);
    drop_header(&st);
    sequence_step_finish(&st.seq, &st.step);
    attention_request_free(&st.ar);
    v2_model_close(&st.model);
    if (rc == ADMISSION_DEFER) {
        resp->deferred = 1; /* for a worker */
    } else if (rc != 0) {
        answer_error(resp, &err);
    }
}

/*
 * v2_answer.c - the answer of a v2 inference: a JSON header naming the
 * model, the parameters used and each output asked for, then, for outputs
 * asked in binary, their bytes in the order asked.
 *
 * A front-end that writes a message of its own (gRPC) is given the JSON
 * part's fields instead of its text (api_infer_answer) and the bytes alone.
 *
 * Every float output is written in one datatype, the request's
 * output_datatype or by default the precision of the computation (FP64 for
 * FP64 inputs, FP32 for the others), through v2_tensor.h's encoder
 * (v2_numbers_*); the float32 numbers of a float32 job reach it as they are,
 * without a round trip through double.  An output that holds a finite number
 * the datatype cannot (it would round to Inf) turns the answer into a 400: the
 * encoder finds it while it writes, so the numbers are converted once.
 */
#include "v2_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "message/answer.h"
#include "core/mem.h"

const char *const v2_output_names[V2_OUT_COUNT] = {
    "output", "attention", "q", "k", "entropy", "max_weight", "argmax", "received", "sink",
    "local", "topk_indices", "topk_weights", "length", "received_total", "kept_positions",
    "lost_mass", "output_error"};

const char *v2_output_parameter(int which)
{
    static const char *const params[V2_OUT_COUNT] = {
        NULL, NULL, NULL, NULL, "entropy", "max", "max", "received", "sink", "local", "topk",
        "topk", NULL, "received_total", "cache_policy", "compare_full", "compare_full"};
    return which >= 0 && which < V2_OUT_COUNT ? params[which] : NULL;
}

int v2_output_asked(const attn_reduce *r, int which)
{
    if (r == NULL)
        return 0;
    switch (which) {
    case V2_OUT_ENTROPY:
        return r->entropy;
    case V2_OUT_MAX_WEIGHT:
    case V2_OUT_ARGMAX:
        return r->max;
    case V2_OUT_RECEIVED:
        return r->received;
    case V2_OUT_SINK:
        return r->want_sink;
    case V2_OUT_LOCAL:
        return r->want_local;
    case V2_OUT_TOPK_INDICES:
    case V2_OUT_TOPK_WEIGHTS:
        return r->topk > 0;
    default:
        return 0;
    }
}

/* Whether output `which` is written as INT64 (key indices), not in the inputs' type. */
static int output_int64(int which)
{
    return which == V2_OUT_ARGMAX || which == V2_OUT_TOPK_INDICES || which == V2_OUT_LENGTH ||
           which == V2_OUT_KEPT_POSITIONS;
}

static const char *output_datatype(const v2_answer_head *head, int which)
{
    return output_int64(which) ? "INT64" : v2_datatype_name(head->dtype);
}

static size_t output_esize(const v2_answer_head *head, int which)
{
    return output_int64(which) ? sizeof(int64_t) : v2_datatype_size(head->dtype);
}

/* Shape of an output as written in the answer; returns its rank. */
static size_t output_shape(const v2_answer_head *head, const attention_request *ar,
                           const attn_result *res, int which, size_t dims[4])
{
    const attn_job *j = &ar->job;
    size_t r = 0;
    if (which == V2_OUT_LENGTH) {
        dims[0] = 1;
        return 1;
    }
    if (ar->batched)
        dims[r++] = j->batch;
    if (which == V2_OUT_OUTPUT) {
        dims[r++] = j->lq;
        dims[r++] = res->d_out;
    } else if (which == V2_OUT_Q || which == V2_OUT_K) {
        dims[r++] = which == V2_OUT_Q ? j->lq : j->lk;
        dims[r++] = j->dk;
    } else if (which != V2_OUT_ATTENTION) {
        /* a reduction: the attention's axes with its last reduced (received: the queries) */
        if (ar->heads_given)
            dims[r++] = j->heads;
        dims[r++] = which == V2_OUT_RECEIVED_TOTAL || which == V2_OUT_KEPT_POSITIONS
                        ? (size_t)head->step->length
                    : which == V2_OUT_RECEIVED ? j->lk : j->lq;
        if (which == V2_OUT_TOPK_INDICES || which == V2_OUT_TOPK_WEIGHTS)
            dims[r++] = j->reduce->topk;
    } else {
        if (ar->heads_given)
            dims[r++] = j->heads;
        if (j->pool != NULL) {
            size_t br, bc;
            attention_pool_grid(j->pool, j->lq, j->lk, &br, &bc, &dims[r], &dims[r + 1]);
            return r + 2;
        }
        dims[r++] = j->lq;
        dims[r++] = j->lk;
    }
    return r;
}

/* The n numbers of an output: held as float for a float32 job's output
 * (job.output_f32) and its full attention, in double for the others. */
static v2_numbers output_numbers(const v2_answer_head *head, const attn_result *res, int which,
                                 size_t n)
{
    v2_numbers x = {NULL, NULL, n};
    switch (which) {
    case V2_OUT_RECEIVED_TOTAL:
        x.f64 = head->step->received_total;
        break;
    case V2_OUT_LOST_MASS:
        x.f64 = head->step->lost_mass;
        break;
    case V2_OUT_OUTPUT_ERROR:
        x.f64 = head->step->output_error;
        break;
    case V2_OUT_OUTPUT:
        x.f32 = res->output_f32;
        x.f64 = res->output;
        break;
    case V2_OUT_Q:
        x.f64 = res->q;
        break;
    case V2_OUT_K:
        x.f64 = res->k;
        break;
    case V2_OUT_ENTROPY:
        x.f64 = res->reduced.entropy;
        break;
    case V2_OUT_MAX_WEIGHT:
        x.f64 = res->reduced.max_weight;
        break;
    case V2_OUT_RECEIVED:
        x.f64 = res->reduced.received;
        break;
    case V2_OUT_SINK:
        x.f64 = res->reduced.sink;
        break;
    case V2_OUT_LOCAL:
        x.f64 = res->reduced.local;
        break;
    case V2_OUT_TOPK_WEIGHTS:
        x.f64 = res->reduced.topk_weights;
        break;
    default:
        x.f32 = res->pooled == NULL ? res->attention_f32 : NULL;
        x.f64 = res->pooled != NULL ? res->pooled : res->attention;
    }
    return x;
}

/* The numbers of an INT64 output (output_int64). */
static const int64_t *output_data_i64(const v2_answer_head *head, const attn_result *res,
                                      int which)
{
    if (which == V2_OUT_LENGTH)
        return &head->step->length;
    if (which == V2_OUT_KEPT_POSITIONS)
        return head->step->kept_positions;
    return which == V2_OUT_ARGMAX ? res->reduced.argmax : res->reduced.topk_indices;
}

static void write_json_i64(jw_buf *w, const int64_t *v, size_t n)
{
    jw_char(w, '[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            jw_char(w, ',');
        if (v[i] < 0)
            jw_raw(w, "-1");            /* the only negative one: no key (attention_reduce.h) */
        else
            jw_size(w, (size_t)v[i]);
    }
    jw_char(w, ']');
}

/* n INT64 numbers at dst, little-endian as the protocol's binary data is. */
static void write_binary_i64(unsigned char *dst, const int64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t u = (uint64_t)v[i];
        for (int b = 0; b < 8; b++)
            dst[i * 8 + (size_t)b] = (unsigned char)(u >> (8 * b));
    }
}

/* The model, the id and the parameters the computation used. */
static void write_head(jw_buf *w, const v2_answer_head *head, const attention_request *ar,
                       double ms)
{
    jw_raw(w, "{\"model_name\":");
    jw_string(w, head->model);
    jw_raw(w, ",\"model_version\":\"" V2_MODEL_VERSION "\"");
    if (head->id != NULL) {
        jw_raw(w, ",\"id\":");
        jw_string(w, head->id);
    }
    jw_raw(w, ",\"parameters\":{\"scale\":");
    jw_double(w, ar->job.scale);
    jw_raw(w, ",\"heads\":");
    jw_size(w, ar->job.heads);
    jw_raw(w, ",\"compute_precision\":");
    jw_string(w, attention_precision_name(&ar->job));
    jw_raw(w, ",\"kernel\":");
    jw_string(w, attention_kernel_path());
    if (ar->job.pool != NULL) {
        size_t br, bc, gr, gc;
        attention_pool_grid(ar->job.pool, ar->job.lq, ar->job.lk, &br, &bc, &gr, &gc);
        jw_raw(w, ",\"attention_pool_block_rows\":");
        jw_size(w, br);
        jw_raw(w, ",\"attention_pool_block_cols\":");
        jw_size(w, bc);
    }
    jw_raw(w, ",\"compute_ms\":");
    jw_double(w, round(ms * 1000) / 1000);
    jw_raw(w, "}");
}

/* The error of output `which` whose element `at` (x's number) would be Inf in
 * the answer's datatype. */
static int not_representable(const v2_answer_head *head, int which, const v2_numbers *x,
                             size_t at, attn_error *err)
{
    return error_set(err, ERR_BAD_REQUEST, "not_representable", "parameters.output_datatype",
                     "Output \"%s\" holds %.17g at element %zu, which %s cannot hold (it "
                     "rounds to Inf); ask for a wider output_datatype.", v2_output_names[which],
                     v2_numbers_get(x, at), at, v2_datatype_name(head->dtype));
}

/* One entry of "outputs": name, datatype, shape, and the numbers as JSON
 * data or the byte count of the binary part.  Returns its element count, or
 * 0 with err set when a JSON number cannot be written in the datatype. */
static size_t write_output(jw_buf *w, const v2_answer_head *head, const attention_request *ar,
                           const attn_result *res, size_t i, attn_error *err)
{
    int which = head->outs->which[i];
    size_t dims[4], rank = output_shape(head, ar, res, which, dims), n = 1;
    for (size_t d = 0; d < rank; d++)
        n *= dims[d];
    jw_raw(w, i ? ",{\"name\":" : "{\"name\":");
    jw_string(w, v2_output_names[which]);
    jw_raw(w, ",\"datatype\":");
    jw_string(w, output_datatype(head, which));
    jw_raw(w, ",\"shape\":[");
    for (size_t d = 0; d < rank; d++) {
        if (d)
            jw_char(w, ',');
        jw_size(w, dims[d]);
    }
    jw_char(w, ']');
    if (head->outs->binary[i]) {
        jw_raw(w, ",\"parameters\":{\"binary_data_size\":");
        jw_size(w, n * output_esize(head, which));
        jw_char(w, '}');
    } else if (output_int64(which)) {
        jw_raw(w, ",\"data\":");
        write_json_i64(w, output_data_i64(head, res, which), n);
    } else {
        jw_raw(w, ",\"data\":");
        v2_numbers x = output_numbers(head, res, which, n);
        size_t at = v2_numbers_write_json(w, &x, head->dtype);
        if (at < n) {
            not_representable(head, which, &x, at, err);
            return 0;
        }
    }
    jw_char(w, '}');
    return n;
}

/* Writes the binary outputs, counts[i] elements each, at p in the order asked.
 * Returns 0, or ERR_BAD_REQUEST when a number cannot be written in the datatype. */
static int write_binary(unsigned char *p, const v2_answer_head *head, const attn_result *res,
                        const size_t *counts, attn_error *err)
{
    for (size_t i = 0; i < head->outs->n; i++) {
        if (!head->outs->binary[i])
            continue;
        int which = head->outs->which[i];
        size_t esize = output_esize(head, which);
        if (output_int64(which)) {
            write_binary_i64(p, output_data_i64(head, res, which), counts[i]);
        } else {
            v2_numbers x = output_numbers(head, res, which, counts[i]);
            size_t at = v2_numbers_write_binary(p, &x, head->dtype);
            if (at < counts[i])
                return not_representable(head, which, &x, at, err);
        }
        p += counts[i] * esize;
    }
    return 0;
}

/* Adds a parameter to the answer's fields: an integer, or the real r when
 * is_integer is 0. */
static void infer_param(api_infer_answer *a, const char *key, int is_integer, long long i,
                        double r)
{
    a->params[a->n_params].key = key;
    a->params[a->n_params].string = NULL;
    a->params[a->n_params].is_integer = is_integer;
    a->params[a->n_params].integer = i;
    a->params[a->n_params].real = r;
    a->n_params++;
}

/* The JSON part of an answer whose outputs are all binary, as fields
 * (api_infer_answer): what write_head and write_output write, in their order. */
static void infer_fields(api_infer_answer *a, const v2_answer_head *head,
                         const attention_request *ar, const attn_result *res, double ms)
{
    memset(a, 0, sizeof *a);
    snprintf(a->model_name, sizeof a->model_name, "%s", head->model);
    a->model_version = V2_MODEL_VERSION;
    if (head->id != NULL)
        snprintf(a->id, sizeof a->id, "%s", head->id);
    infer_param(a, "scale", 0, 0, ar->job.scale);
    infer_param(a, "heads", 1, (long long)ar->job.heads, 0);
    infer_param(a, "compute_precision", 0, 0, 0);
    a->params[a->n_params - 1].string = attention_precision_name(&ar->job);
    infer_param(a, "kernel", 0, 0, 0);
    a->params[a->n_params - 1].string = attention_kernel_path();
    if (ar->job.pool != NULL) {
        size_t br, bc, gr, gc;
        attention_pool_grid(ar->job.pool, ar->job.lq, ar->job.lk, &br, &bc, &gr, &gc);
        infer_param(a, "attention_pool_block_rows", 1, (long long)br, 0);
        infer_param(a, "attention_pool_block_cols", 1, (long long)bc, 0);
    }
    infer_param(a, "compute_ms", 0, 0, round(ms * 1000) / 1000);
    for (size_t i = 0; i < head->outs->n && i < API_INFER_MAX_OUTPUTS; i++) {
        int which = head->outs->which[i];
        size_t n = 1;
        a->outputs[i].name = v2_output_names[which];
        a->outputs[i].datatype = output_datatype(head, which);
        a->outputs[i].rank = output_shape(head, ar, res, which, a->outputs[i].dims);
        for (size_t d = 0; d < a->outputs[i].rank; d++)
            n *= a->outputs[i].dims[d];
        a->outputs[i].bytes = n * output_esize(head, which);
        a->n_outputs++;
    }
    a->set = 1;
}

/* Whether every output asked for is binary and the answer's fields can say
 * what its JSON part would. */
static int all_binary(const v2_answer_head *head)
{
    int binary = head->outs->n <= API_INFER_MAX_OUTPUTS;
    for (size_t i = 0; i < head->outs->n; i++)
        binary &= head->outs->binary[i] != 0;
    return binary;
}

/* The answer as fields and bytes with no JSON part (head->fields_only). */
static int answer_fields_only(const v2_answer_head *head, const attention_request *ar,
                              const attn_result *res, double compute_ms, api_response *resp,
                              attn_error *err)
{
    api_infer_answer *a = &resp->infer;
    infer_fields(a, head, ar, res, compute_ms);
    size_t bin_bytes = 0, counts[V2_OUT_COUNT];
    for (size_t i = 0; i < a->n_outputs; i++) {
        bin_bytes += a->outputs[i].bytes;
        counts[i] = a->outputs[i].bytes / output_esize(head, head->outs->which[i]);
    }
    char *body = mem_malloc(bin_bytes ? bin_bytes : 1);
    if (body == NULL) {
        memset(a, 0, sizeof *a);
        return error_nomem(err);
    }
    int rc = write_binary((unsigned char *)body, head, res, counts, err);
    if (rc != 0) {
        mem_free(body);
        memset(a, 0, sizeof *a);
        return rc;
    }
    resp->status = 200;
    resp->body = body;
    resp->body_len = bin_bytes;
    resp->body_static = 0;
    resp->content_type = "application/octet-stream";
    resp->inference_header_length = 0;
    return 0;
}

int v2_answer_infer(const v2_answer_head *head, const attention_request *ar,
                    const attn_result *res, double compute_ms, size_t hint, api_response *resp,
                    attn_error *err)
{
    if (head->fields_only && all_binary(head))
        return answer_fields_only(head, ar, res, compute_ms, resp, err);
    jw_buf w;
    jw_init(&w, hint + 512);
    write_head(&w, head, ar, compute_ms);
    jw_raw(&w, ",\"outputs\":[");
    size_t bin_bytes = 0, counts[V2_OUT_COUNT];
    for (size_t i = 0; i < head->outs->n; i++) {
        counts[i] = write_output(&w, head, ar, res, i, err);
        if (counts[i] == 0) { /* every output has at least one number */
            jw_discard(&w);
            return ERR_BAD_REQUEST;
        }
        if (head->outs->binary[i])
            bin_bytes += counts[i] * output_esize(head, head->outs->which[i]);
    }
    jw_raw(&w, "]}");
    if (bin_bytes == 0) {
        answer_jw(resp, 200, &w);
        return 0;
    }
    size_t header_len;
    char *header = jw_finish(&w, &header_len);
    char *body = header ? mem_malloc(header_len + bin_bytes) : NULL;
    if (body == NULL) {
        mem_free(header);
        return error_nomem(err);
    }
    memcpy(body, header, header_len);
    mem_free(header);
    int rc = write_binary((unsigned char *)body + header_len, head, res, counts, err);
    if (rc != 0) {
        mem_free(body);
        return rc;
    }
    resp->status = 200;
    resp->body = body;
    resp->body_len = header_len + bin_bytes;
    resp->body_static = 0;
    resp->content_type = "application/octet-stream";
    resp->inference_header_length = header_len;
    if (all_binary(head))
        infer_fields(&resp->infer, head, ar, res, compute_ms);
    return 0;
}

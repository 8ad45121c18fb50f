/*
 * grpc_infer.c - ModelInfer: a ModelInferRequest answered by v2's inference
 * handler through the router, and the answer turned into a
 * ModelInferResponse.
 *
 * The request is read under bounds first (grpc_unpack.c: the unpacked
 * form's bytes, the number of inputs and outputs, strings with a NUL byte).
 * The router is given the route and the model directly (route_of and
 * route_args: no path to match, the model checked once, by v2), and the
 * request as v2's neutral request (message/api_infer.h,
 * api_request.infer_request), filled from the message in one step: no JSON
 * tree, no text.  Every input is binary bytes: raw_input_contents where
 * protobuf-c unpacked them (no copy), or typed contents (fp32_contents,
 * fp64_contents, bool_contents) written out as the same little-endian bytes
 * (FP16 and BF16, which have no typed field, come only raw), and every output
 * is asked in binary, so the numbers are never text on the way and v2 applies
 * all of its rules, with the words it gives an HTTP body: the datatype, the
 * shape, a raw length that does not match them (refused before anything is
 * allocated for the computation), the element and memory limits.  v2 answers
 * with the fields of its JSON part (api_response.infer,
 * api_request.fields_only) and the outputs' bytes, no JSON text; they
 * become raw_output_contents, which point into the router's answer until the
 * response is packed, once, inside a ModelStreamInferResponse for a stream.
 * An error is the router's sentence (api_response.error), not its JSON body.
 */
#include "grpc_private.h"

#include <inference.pb-c.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/compute.h"
#include "core/error.h"
#include "core/mem.h"
#include "core/utf8.h"
#include "router/api.h"

/* The binary section starts on this, as the HTTP layer places a v2 body's,
 * so that FP32 inputs are read where they lie. */
#define BODY_ALIGN 64

/* A request parameter as the value v2's rules read, into *v; -1 when it has
 * none this server reads (no value, an unset oneof, a string that is not
 * UTF-8, a number that is not finite), as the HTTP twin's JSON could not
 * hold it either. */
static int parameter_value(const Inference__InferParameter *p, scalar *v)
{
    if (p == NULL) /* a map entry with a key and no value */
        return -1;
    switch (p->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        *v = scalar_bool(p->bool_param);
        return 0;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        *v = scalar_integer(p->int64_param);
        return 0;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        *v = scalar_string(p->string_param);
        return utf8_valid(p->string_param) ? 0 : -1;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        *v = scalar_real(p->double_param);
        return isfinite(p->double_param) ? 0 : -1;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        *v = scalar_real((double)p->uint64_param);
        return 0;
    default:
        return -1;
    }
}

/* The typed contents of input i as bytes: where they are (*src, *n elements of
 * *esize bytes each; bool_contents are ints to be narrowed to bytes).  Returns 0,
 * or -1 with out filled when the contents do not fit the datatype. */
static int typed_contents(const Inference__ModelInferRequest__InferInputTensor *t, size_t i,
                          const void **src, size_t *n, size_t *esize, grpc_answer *out)
{
    const Inference__InferTensorContents *c = t->contents;
    *src = NULL;
    *n = 0;
    *esize = 0;
    if (c == NULL)
        return 0;
    size_t given = (c->n_fp32_contents != 0) + (c->n_fp64_contents != 0) +
                   (c->n_bool_contents != 0);
    const char *want = !strcmp(t->datatype, "FP32")   ? "fp32_contents"
                       : !strcmp(t->datatype, "FP64") ? "fp64_contents"
                       : !strcmp(t->datatype, "BOOL") ? "bool_contents"
                                                      : NULL;
    if (given != 0 && (!strcmp(t->datatype, "FP16") || !strcmp(t->datatype, "BF16"))) {
        /* the protocol has no typed field for them: Triton sends them as raw bytes too */
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "inputs[%zu].contents of input \"%.64s\": datatype %.16s has no typed "
                          "contents; send its numbers as raw_input_contents (2 little-endian "
                          "bytes each).", i, t->name, t->datatype);
        return -1;
    }
    if (given == 0 || want == NULL)
        return 0; /* v2 says what is wrong with the datatype or the missing numbers */
    if (given > 1 || (!strcmp(want, "fp32_contents") && c->n_fp32_contents == 0) ||
        (!strcmp(want, "fp64_contents") && c->n_fp64_contents == 0) ||
        (!strcmp(want, "bool_contents") && c->n_bool_contents == 0)) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "inputs[%zu].contents of input \"%.64s\": datatype %.16s takes its "
                          "numbers in %s and in no other field.", i, t->name, t->datatype, want);
        return -1;
    }
    if (c->n_fp32_contents) {
        *src = c->fp32_contents, *n = c->n_fp32_contents, *esize = 4;
    } else if (c->n_fp64_contents) {
        *src = c->fp64_contents, *n = c->n_fp64_contents, *esize = 8;
    } else {
        *src = c->bool_contents, *n = c->n_bool_contents, *esize = 1;
    }
    return 0;
}

/* Writes n numbers of esize bytes from src (host order) at dst as
 * little-endian bytes; bools (esize 1) come from protobuf-c's ints. */
static void write_le(unsigned char *dst, const void *src, size_t n, size_t esize)
{
    if (esize == 1) {
        const protobuf_c_boolean *b = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = b[i] != 0;
        return;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, src, n * esize);
#else
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < esize; b++)
            dst[i * esize + b] = s[i * esize + esize - 1 - b];
#endif
}

/* Fills r with the request q says, in one step: its id, its parameters
 * (into params, room for q->n_parameters + 1, with binary_data_output
 * added: every output comes back as raw_output_contents), its outputs, each
 * binary, and its inputs, each with its byte count and where its bytes are:
 * raw_input_contents where protobuf-c unpacked them, or typed contents
 * written out as little-endian bytes into *typed (mem_free; NULL when every
 * input is raw), on BODY_ALIGN.  Returns 0, or -1 with out filled when q
 * cannot be said as a v2 request. */
static int request_fields(const Inference__ModelInferRequest *q, api_infer_request *r,
                          api_infer_param *params, unsigned char **typed, grpc_answer *out)
{
    static const unsigned char none[1];         /* empty bytes are still somewhere */
    int raw = q->n_raw_input_contents != 0;
    *typed = NULL;
    if (raw && q->n_raw_input_contents != q->n_inputs) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "raw_input_contents has %zu entries and inputs %zu; give the raw "
                          "contents of every input or of none.", q->n_raw_input_contents,
                          q->n_inputs);
        return -1;
    }
    memset(r, 0, sizeof *r);
    r->self = (scalar){.kind = SCALAR_OBJECT};
    if (q->id[0] != '\0' && utf8_valid(q->id))
        r->id = scalar_string(q->id);
    for (size_t i = 0; i < q->n_parameters; i++) {
        params[i].key = q->parameters[i]->key;
        if (parameter_value(q->parameters[i]->value, &params[i].value) != 0 ||
            !utf8_valid(params[i].key)) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "parameters.%.64s has no value this server can read (a finite "
                              "number, a boolean or a UTF-8 string).", q->parameters[i]->key);
            return -1;
        }
    }
    params[q->n_parameters] = (api_infer_param){"binary_data_output", scalar_bool(1)};
    r->params = params;
    r->n_params = q->n_parameters + 1;
    r->parameters = (scalar){.kind = SCALAR_OBJECT, .size = r->n_params};
    if (q->n_outputs != 0) { /* grpc_unpack let at most API_INFER_MAX_OUTPUTS through */
        r->outputs = (scalar){.kind = SCALAR_ARRAY, .size = q->n_outputs};
        r->n_outputs = q->n_outputs;
        for (size_t i = 0; i < q->n_outputs; i++) {
            if (!utf8_valid(q->outputs[i]->name)) {
                grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                  "outputs[%zu]: its name must be a UTF-8 string.", i);
                return -1;
            }
            r->output[i] = (api_infer_output){{.kind = SCALAR_OBJECT},
                                              scalar_string(q->outputs[i]->name),
                                              {.kind = SCALAR_OBJECT, .size = 1}, scalar_bool(1)};
        }
    }
    size_t sizes[API_INFER_MAX_INPUTS];
    r->inputs = (scalar){.kind = SCALAR_ARRAY, .size = q->n_inputs};
    r->n_inputs = q->n_inputs; /* grpc_unpack let at most API_INFER_MAX_INPUTS through */
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *t = q->inputs[i];
        api_infer_input *in = &r->input[i];
        const void *src;
        size_t n, esize;
        if (raw && t->contents != NULL &&
            (t->contents->n_fp32_contents || t->contents->n_fp64_contents ||
             t->contents->n_bool_contents)) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "inputs[%zu].contents is given beside raw_input_contents; give "
                              "the numbers of an input in one place.", i);
            return -1;
        }
        if (!raw && typed_contents(t, i, &src, &n, &esize, out) != 0)
            return -1;
        if (!utf8_valid(t->name) || !utf8_valid(t->datatype)) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "inputs[%zu]: its name and datatype must be UTF-8 strings.", i);
            return -1;
        }
        sizes[i] = raw ? q->raw_input_contents[i].len : n * esize;
        in->self = (scalar){.kind = SCALAR_OBJECT};
        in->name = scalar_string(t->name);
        in->datatype = scalar_string(t->datatype);
        in->shape = (scalar){.kind = SCALAR_ARRAY, .size = t->n_shape};
        for (size_t d = 0; d < t->n_shape && d < API_INFER_MAX_RANK; d++)
            in->dims[d] = scalar_integer(t->shape[d]);
        in->parameters = (scalar){.kind = SCALAR_OBJECT, .size = 1};
        in->binary_data_size = scalar_integer((long long)sizes[i]);
        in->bytes = raw && sizes[i] != 0 ? q->raw_input_contents[i].data : none;
    }
    if (raw || q->n_inputs == 0)
        return 0;
    /* typed contents: each input's numbers as little-endian bytes, one input
     * after another, each on BODY_ALIGN so that FP32 inputs are read where
     * they lie */
    size_t cap = 0;
    for (size_t i = 0; i < q->n_inputs; i++)
        cap += (sizes[i] + BODY_ALIGN - 1) / BODY_ALIGN * BODY_ALIGN;
    unsigned char *buf = mem_aligned(BODY_ALIGN, cap + BODY_ALIGN);
    if (buf == NULL) {
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
        return -1;
    }
    unsigned char *p = buf;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const void *src;
        size_t n, esize;
        typed_contents(q->inputs[i], i, &src, &n, &esize, out);
        if (n != 0) {
            write_le(p, src, n, esize);
            r->input[i].bytes = p;
        }
        p += (sizes[i] + BODY_ALIGN - 1) / BODY_ALIGN * BODY_ALIGN;
    }
    *typed = buf;
    return 0;
}

/* What a ModelInferResponse is built of (the strings borrow from the
 * router's answer, the bytes from its body). */
typedef struct response_parts {
    Inference__ModelInferResponse r;
    Inference__ModelInferResponse__ParametersEntry entries[API_INFER_MAX_PARAMS];
    Inference__ModelInferResponse__ParametersEntry *entry_ptrs[API_INFER_MAX_PARAMS];
    Inference__InferParameter values[API_INFER_MAX_PARAMS];
    Inference__ModelInferResponse__InferOutputTensor outs[API_INFER_MAX_OUTPUTS];
    Inference__ModelInferResponse__InferOutputTensor *out_ptrs[API_INFER_MAX_OUTPUTS];
    ProtobufCBinaryData raw[API_INFER_MAX_OUTPUTS];
    int64_t shapes[API_INFER_MAX_OUTPUTS][API_INFER_MAX_RANK];
} response_parts;

/* Builds the response of the router's 200 answer resp into out, from the
 * fields v2 gave beside its JSON part (api_response.infer): a
 * ModelInferResponse, or with stream the ModelStreamInferResponse that holds
 * it, packed once. */
static void answer_response(const api_response *resp, int stream, grpc_answer *out)
{
    const api_infer_answer *a = &resp->infer;
    size_t hl = resp->inference_header_length;   /* 0: v2 wrote no JSON part */
    if (!a->set || hl > resp->body_len)
        return grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The answer could not be read.");
    response_parts rp;
    memset(&rp, 0, sizeof rp);
    inference__model_infer_response__init(&rp.r);
    rp.r.model_name = (char *)a->model_name;
    rp.r.model_version = (char *)a->model_version;
    rp.r.id = (char *)a->id;
    for (size_t i = 0; i < a->n_params; i++) {
        Inference__ModelInferResponse__ParametersEntry *e = &rp.entries[i];
        Inference__InferParameter *p = &rp.values[i];
        inference__model_infer_response__parameters_entry__init(e);
        inference__infer_parameter__init(p);
        e->key = (char *)a->params[i].key;
        e->value = p;
        if (a->params[i].string != NULL) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
            p->string_param = (char *)a->params[i].string;
        } else if (a->params[i].is_integer) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
            p->int64_param = a->params[i].integer;
        } else {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
            p->double_param = a->params[i].real;
        }
        rp.entry_ptrs[i] = e;
    }
    rp.r.n_parameters = a->n_params;
    rp.r.parameters = rp.entry_ptrs;
    const unsigned char *bin = (const unsigned char *)resp->body + hl;
    size_t bin_len = resp->body_len - hl, at = 0;
    for (size_t i = 0; i < a->n_outputs; i++) {
        Inference__ModelInferResponse__InferOutputTensor *t = &rp.outs[i];
        inference__model_infer_response__infer_output_tensor__init(t);
        t->name = (char *)a->outputs[i].name;
        t->datatype = (char *)a->outputs[i].datatype;
        t->n_shape = a->outputs[i].rank;
        t->shape = rp.shapes[i];
        for (size_t d = 0; d < t->n_shape; d++)
            rp.shapes[i][d] = (int64_t)a->outputs[i].dims[d];
        if (a->outputs[i].bytes > bin_len - at)
            return grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The answer could not be read.");
        rp.raw[i].data = (uint8_t *)bin + at;
        rp.raw[i].len = a->outputs[i].bytes;
        at += a->outputs[i].bytes;
        rp.out_ptrs[i] = t;
    }
    rp.r.n_outputs = a->n_outputs;
    rp.r.outputs = rp.out_ptrs;
    rp.r.raw_output_contents = rp.raw;
    rp.r.n_raw_output_contents = a->n_outputs;
    if (at != bin_len)
        return grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The answer could not be read.");
    Inference__ModelStreamInferResponse w = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    w.infer_response = &rp.r;
    grpc_answer_pack(out, stream ? &w.base : &rp.r.base);
}


void grpc_infer_stream_error(grpc_answer *out)
{
    if (out->code == GRPC_STATUS_OK) /* a response, packed as the stream's already */
        return;
    Inference__ModelStreamInferResponse w = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    w.error_message = out->message;
    char message[sizeof out->message];
    memcpy(message, out->message, sizeof message);
    grpc_answer_pack(out, &w.base);
    if (out->code == GRPC_STATUS_OK) /* keep the words for the access log */
        memcpy(out->message, message, sizeof message);
}

size_t grpc_infer_unpack_bound(size_t len)
{
    return len > (SIZE_MAX - 65536) / 4 ? SIZE_MAX : 4 * len + 65536;
}

void grpc_infer_answer(const unsigned char *in, size_t len, size_t unpack_cap, double queued_at,
                       int io_thread, int stream, grpc_answer *out)
{
    memset(out, 0, sizeof *out);
    out->route = ROUTE_V2_INFER;
    out->http_status = 400;
    static const grpc_unpack_limit limits[] = {{"inputs", API_INFER_MAX_INPUTS},
                                               {"raw_input_contents", API_INFER_MAX_INPUTS},
                                               {"outputs", API_INFER_MAX_OUTPUTS}};
    grpc_unpack_budget budget;
    grpc_unpack_budget_init(&budget, unpack_cap);
    Inference__ModelInferRequest *q = (Inference__ModelInferRequest *)grpc_unpack(
        &inference__model_infer_request__descriptor, in, len, limits,
        sizeof limits / sizeof limits[0], &budget, out);
    if (q == NULL)
        return;
    /* The route and the model are known: v2 checks the model, once. */
    route_args args;
    if (strlen(q->model_name) >= sizeof args.model ||
        strlen(q->model_version) >= sizeof args.version) {
        grpc_answer_error(out, GRPC_STATUS_NOT_FOUND, "Model \"%.200s\" is unknown.",
                          q->model_name);
        out->http_status = 404;
        inference__model_infer_request__free_unpacked(q, &budget.allocator);
        return;
    }
    memcpy(args.model, q->model_name, strlen(q->model_name) + 1);
    memcpy(args.version, q->model_version, strlen(q->model_version) + 1);
    api_infer_request r;
    api_infer_param *params = mem_malloc((q->n_parameters + 1) * sizeof *params);
    unsigned char *typed = NULL;
    if (params == NULL)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else if (request_fields(q, &r, params, &typed, out) == 0) {
        api_request req = {.method = "POST", .path = "/v2/models/{model}/infer",
                           .route = route_of(ROUTE_V2_INFER), .args = &args,
                           .infer_request = &r, .fields_only = 1, .io_thread = io_thread,
                           .queued_at = queued_at, .protocol = "grpc"};
        api_response resp;
        api_handle(&req, &resp);
        out->http_status = resp.status;
        if (resp.deferred)
            out->deferred = 1;
        else if (resp.status == 200)
            answer_response(&resp, stream, out);
        else
            grpc_answer_from_http(out, &resp);
        _Static_assert(sizeof out->model == sizeof resp.model, "the model's name fits");
        memcpy(out->model, resp.model, sizeof out->model);
        out->phases_timed = resp.phases_timed;
        memcpy(out->phase_seconds, resp.phase_seconds, sizeof out->phase_seconds);
        api_response_free(&resp);
    }
    mem_free(typed);
    mem_free(params);
    inference__model_infer_request__free_unpacked(q, &budget.allocator);
}

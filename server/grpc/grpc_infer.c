/*
 * grpc_infer.c - ModelInfer: a ModelInferRequest answered by v2's inference
 * handler through the router, and the answer turned into a
 * ModelInferResponse.
 *
 * The request is read under bounds first (grpc_unpack.c: the unpacked
 * form's bytes, the number of inputs and outputs, strings with a NUL byte).
 * The router is given the route and the model directly (route_of and
 * route_args: no path to match, the model checked once, by v2).  The
 * inference header is made as the jansson tree v2's parser would make of
 * its text (api_request.inference_header: every number a real), and the
 * binary section holds every input as binary bytes: raw_input_contents as
 * they are, each where protobuf-c unpacked it (api_request.bin_parts, no
 * copy), or typed contents (fp32_contents, fp64_contents, bool_contents)
 * written out as the same little-endian bytes into one body (FP16 and BF16,
 * which have no typed field, come only raw), and every output is asked in
 * binary, so the numbers are never text on the way and v2's decoder applies
 * all of its rules, with its words: the datatype, the shape, a raw length
 * that does not match them (refused before anything is allocated for the
 * computation), the element and memory limits.  v2 answers with the fields
 * of its JSON part (api_response.infer, api_request.infer_fields_only) and
 * the outputs' bytes, no JSON text; they become raw_output_contents, which
 * point into the router's answer until the response is packed.  An error
 * is the router's sentence (api_response.error), not its JSON body.
 */
#include "grpc_private.h"

#include <inference.pb-c.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/compute.h"
#include "core/error.h"
#include "router/api.h"

/* The binary section starts on this, as the HTTP layer places a v2 body's,
 * so that FP32 inputs are read where they lie. */
#define BODY_ALIGN 64

/* ModelStreamInferResponse's field infer_response (2), length-delimited (wire
 * type 2): the key that starts it on the wire. */
#define STREAM_INFER_RESPONSE_KEY ((2u << 3) | 2u)

/* A request parameter as the JSON value v2 reads (numbers as reals, as
 * v2's parser reads every JSON number), or NULL when it has none (no value,
 * an unset oneof, a string that is not UTF-8, a number that is not finite). */
static json_t *parameter_json(const Inference__InferParameter *p)
{
    if (p == NULL) /* a map entry with a key and no value */
        return NULL;
    switch (p->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        return json_boolean(p->bool_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        return json_real((double)p->int64_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        return json_string(p->string_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        return json_real(p->double_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        return json_real((double)p->uint64_param);
    default:
        return NULL;
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

/* A new object of the n members keys[i]: values[i] (literal keys; each
 * value's reference is taken, also on failure), or NULL when a value is NULL
 * (a string that is not UTF-8) or memory runs out.  What json_pack would make,
 * without reading a format for each of the thousands of calls a second. */
static json_t *object_of(size_t n, const char *const *keys, json_t *const *values)
{
    json_t *o = json_object();
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= json_object_set_new_nocheck(o, keys[i], values[i]) == 0;
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* s as a JSON string, null for NULL; NULL when s is not UTF-8. */
static json_t *string_or_null(const char *s)
{
    return s != NULL ? json_string(s) : json_null();
}

/* The inference header of the HTTP twin of q, as v2's parser would make it
 * of its text (every number a real), with each input's byte count in
 * sizes[i]; NULL with out filled when q cannot be said in it. */
static json_t *request_header(const Inference__ModelInferRequest *q, size_t *sizes,
                              grpc_answer *out)
{
    int raw = q->n_raw_input_contents != 0;
    if (raw && q->n_raw_input_contents != q->n_inputs) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "raw_input_contents has %zu entries and inputs %zu; give the raw "
                          "contents of every input or of none.", q->n_raw_input_contents,
                          q->n_inputs);
        return NULL;
    }
    json_t *root = json_object(), *inputs = json_array(), *params = json_object();
    json_object_set_new(root, "inputs", inputs);
    json_object_set_new(root, "parameters", params);
    if (q->id[0] != '\0')
        json_object_set_new(root, "id", json_string(q->id));
    for (size_t i = 0; i < q->n_parameters; i++) {
        json_t *v = parameter_json(q->parameters[i]->value);
        if (v == NULL || json_object_set_new(params, q->parameters[i]->key, v) != 0) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "parameters.%.64s has no value this server can read (a finite "
                              "number, a boolean or a UTF-8 string).", q->parameters[i]->key);
            json_decref(root);
            return NULL;
        }
    }
    /* every output in binary: they come back as raw_output_contents */
    json_object_set_new(params, "binary_data_output", json_true());
    if (q->n_outputs != 0) {
        json_t *outs = json_array();
        json_object_set_new(root, "outputs", outs);
        static const char *const out_keys[] = {"name", "parameters"}, *bin_key = "binary_data";
        for (size_t i = 0; i < q->n_outputs; i++) {
            json_t *bin = json_true();
            json_t *values[] = {string_or_null(q->outputs[i]->name),
                                object_of(1, &bin_key, &bin)};
            json_array_append_new(outs, object_of(2, out_keys, values));
        }
    }
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *t = q->inputs[i];
        const void *src;
        size_t n, esize;
        if (raw && t->contents != NULL &&
            (t->contents->n_fp32_contents || t->contents->n_fp64_contents ||
             t->contents->n_bool_contents)) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "inputs[%zu].contents is given beside raw_input_contents; give "
                              "the numbers of an input in one place.", i);
            json_decref(root);
            return NULL;
        }
        if (!raw && typed_contents(t, i, &src, &n, &esize, out) != 0) {
            json_decref(root);
            return NULL;
        }
        sizes[i] = raw ? q->raw_input_contents[i].len : n * esize;
        json_t *shape = json_array();
        for (size_t d = 0; d < t->n_shape; d++)
            json_array_append_new(shape, json_real((double)t->shape[d]));
        static const char *const in_keys[] = {"name", "datatype", "shape", "parameters"},
                                 *size_key = "binary_data_size";
        json_t *size = json_real((double)sizes[i]);
        json_t *values[] = {string_or_null(t->name), string_or_null(t->datatype), shape,
                            object_of(1, &size_key, &size)};
        json_t *in = object_of(4, in_keys, values);
        if (in == NULL || json_array_append_new(inputs, in) != 0) {
            grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                              "inputs[%zu]: its name and datatype must be UTF-8 strings.", i);
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

/* The body of the HTTP twin for typed contents: each input's numbers as
 * little-endian bytes, one input after another, on BODY_ALIGN.  Returns it
 * (free()) with *len set, or NULL with out filled. */
static unsigned char *request_body(const Inference__ModelInferRequest *q, const size_t *sizes,
                                   size_t *len, grpc_answer *out)
{
    size_t bin = 0;
    for (size_t i = 0; i < q->n_inputs; i++)
        bin += sizes[i];
    unsigned char *buf = aligned_alloc(BODY_ALIGN, (bin + BODY_ALIGN) / BODY_ALIGN * BODY_ALIGN);
    if (buf == NULL) {
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
        return NULL;
    }
    unsigned char *p = buf;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const void *src;
        size_t n, esize;
        typed_contents(q->inputs[i], i, &src, &n, &esize, out);
        if (n != 0)
            write_le(p, src, n, esize);
        p += sizes[i];
    }
    *len = bin;
    return buf;
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
 * fields v2 gave beside its JSON part (api_response.infer). */
static void answer_response(const api_response *resp, grpc_answer *out)
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
        if (a->params[i].is_integer) {
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
    if (at == bin_len)
        grpc_answer_pack(out, &rp.r.base);
    else
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The answer could not be read.");
}


/* Puts the ModelInferResponse packed in out->bytes into a
 * ModelStreamInferResponse as its infer_response.  A message field on the
 * wire is its key, its length and the packed message, so the response is
 * put after the two, not unpacked and packed again.  Returns 0, or -1 when
 * memory ran out (out unchanged). */
static int stream_put_response(grpc_answer *out)
{
    unsigned char head[1 + 10];
    size_t n = 0;
    head[n++] = STREAM_INFER_RESPONSE_KEY;
    for (uint64_t v = out->len;; v >>= 7) {
        head[n++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        if (v < 0x80)
            break;
    }
    unsigned char *bytes = malloc(n + out->len);
    if (bytes == NULL)
        return -1;
    memcpy(bytes, head, n);
    if (out->len != 0)
        memcpy(bytes + n, out->bytes, out->len);
    free(out->bytes);
    out->bytes = bytes;
    out->len += n;
    return 0;
}

void grpc_infer_stream_wrap(grpc_answer *out)
{
    if (out->code == GRPC_STATUS_OK && stream_put_response(out) == 0)
        return;
    if (out->code == GRPC_STATUS_OK)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
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
                       int io_thread, grpc_answer *out)
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
    size_t *sizes = calloc(q->n_inputs + 1, sizeof *sizes);
    /* Raw contents are read where protobuf-c unpacked them, one part an
     * input; typed ones are written out as the HTTP twin's body. */
    api_part *parts = calloc(q->n_raw_input_contents + 1, sizeof *parts);
    json_t *header = NULL;
    unsigned char *buf = NULL;
    size_t body_len = 0;
    if (sizes == NULL || parts == NULL)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else if ((header = request_header(q, sizes, out)) != NULL &&
             (q->n_raw_input_contents != 0 ||
              (buf = request_body(q, sizes, &body_len, out)) != NULL)) {
        static const unsigned char none[1];     /* an empty part is still somewhere */
        for (size_t i = 0; i < q->n_raw_input_contents; i++) {
            const ProtobufCBinaryData *raw = &q->raw_input_contents[i];
            parts[i] = (api_part){raw->len != 0 ? raw->data : none, raw->len};
        }
        if (buf != NULL) {
            /* the request's numbers now live in buf only */
            inference__model_infer_request__free_unpacked(q, &budget.allocator);
            q = NULL;
        }
        api_request req = {.method = "POST", .path = "/v2/models/{model}/infer",
                           .route = route_of(ROUTE_V2_INFER), .args = &args,
                           .body = (const char *)buf, .body_len = body_len,
                           .inference_header = header, .bin_parts = parts,
                           .n_bin_parts = buf != NULL ? 0 : q->n_raw_input_contents,
                           .infer_fields_only = 1, .io_thread = io_thread,
                           .queued_at = queued_at, .protocol = "grpc"};
        api_response resp;
        api_handle(&req, &resp);
        free(buf);
        json_decref(header);
        header = NULL;
        out->http_status = resp.status;
        if (resp.deferred)
            out->deferred = 1;
        else if (resp.status == 200)
            answer_response(&resp, out);
        else
            grpc_answer_from_http(out, &resp);
        _Static_assert(sizeof out->model == sizeof resp.model, "the model's name fits");
        memcpy(out->model, resp.model, sizeof out->model);
        out->phases_timed = resp.phases_timed;
        memcpy(out->phase_seconds, resp.phase_seconds, sizeof out->phase_seconds);
        api_response_free(&resp);
    }
    json_decref(header);
    free(sizes);
    free(parts);
    if (q != NULL)
        inference__model_infer_request__free_unpacked(q, &budget.allocator);
}

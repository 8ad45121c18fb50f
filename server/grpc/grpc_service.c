/*
 * grpc_service.c - the cheap RPCs of the gRPC front-end: liveness,
 * readiness, server and model metadata, and grpc.health.v1's Check (and the
 * status its Watch sends), each answered by asking the router for its HTTP
 * v2 twin and translating the JSON answer into the response message; and
 * what every RPC shares (the method table, the status codes of HTTP
 * statuses, packing).
 *
 * Asking the router keeps one rule in one place: what a model is, what
 * readiness means while draining, which words an error has.  These answers
 * are small, so the JSON in between costs nothing that matters.
 */
#include "grpc_private.h"

#include <health.pb-c.h>
#include <inference.pb-c.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/api.h"

static const char *const method_paths[GRPC_M_COUNT] = {
    [GRPC_M_SERVER_LIVE] = "/inference.GRPCInferenceService/ServerLive",
    [GRPC_M_SERVER_READY] = "/inference.GRPCInferenceService/ServerReady",
    [GRPC_M_MODEL_READY] = "/inference.GRPCInferenceService/ModelReady",
    [GRPC_M_SERVER_METADATA] = "/inference.GRPCInferenceService/ServerMetadata",
    [GRPC_M_MODEL_METADATA] = "/inference.GRPCInferenceService/ModelMetadata",
    [GRPC_M_MODEL_INFER] = "/inference.GRPCInferenceService/ModelInfer",
    [GRPC_M_MODEL_STREAM_INFER] = "/inference.GRPCInferenceService/ModelStreamInfer",
    [GRPC_M_MODEL_CONFIG] = "/inference.GRPCInferenceService/ModelConfig",
    [GRPC_M_MODEL_STATISTICS] = "/inference.GRPCInferenceService/ModelStatistics",
    [GRPC_M_REPOSITORY_INDEX] = "/inference.GRPCInferenceService/RepositoryIndex",
    [GRPC_M_REPOSITORY_LOAD] = "/inference.GRPCInferenceService/RepositoryModelLoad",
    [GRPC_M_REPOSITORY_UNLOAD] = "/inference.GRPCInferenceService/RepositoryModelUnload",
    [GRPC_M_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
    [GRPC_M_HEALTH_WATCH] = "/grpc.health.v1.Health/Watch",
};

grpc_method grpc_method_of(const char *path, size_t len)
{
    for (int m = 1; m < GRPC_M_COUNT; m++)
        if (strlen(method_paths[m]) == len && memcmp(method_paths[m], path, len) == 0)
            return (grpc_method)m;
    return GRPC_M_UNKNOWN;
}

const char *grpc_method_name(grpc_method m)
{
    if (m <= GRPC_M_UNKNOWN || m >= GRPC_M_COUNT)
        return "unknown";
    return strrchr(method_paths[m], '/') + 1;
}

void grpc_answer_error(grpc_answer *out, grpc_status_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->message, sizeof out->message, fmt, ap);
    va_end(ap);
    free(out->bytes);
    out->bytes = NULL;
    out->len = 0;
    out->code = code;
}

/* The gRPC code of an HTTP error status, as docs/grpc.md lists them. */
static grpc_status_code code_of_http(int status)
{
    switch (status) {
    case 400:
    case 415:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case 401:
        return GRPC_STATUS_UNAUTHENTICATED;
    case 403:
        return GRPC_STATUS_PERMISSION_DENIED;
    case 404:
        return GRPC_STATUS_NOT_FOUND;
    case 405:
        return GRPC_STATUS_UNIMPLEMENTED;
    case 409:
    case 412:
        return GRPC_STATUS_FAILED_PRECONDITION;
    case 413:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case 503:
        return GRPC_STATUS_UNAVAILABLE;
    case 504:
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    default:
        return GRPC_STATUS_INTERNAL;
    }
}

void grpc_answer_from_http(grpc_answer *out, const api_response *resp)
{
    /* the sentence the error body holds, as the router filled it beside the body */
    const char *words = resp->error[0] ? resp->error : "The server could not answer.";
    grpc_answer_error(out, code_of_http(resp->status), "%s", words);
    out->retry_after = resp->retry_after;
    out->http_status = resp->status;
    out->route = resp->route;
}

int grpc_http_status_of(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return 200;
    case GRPC_STATUS_INVALID_ARGUMENT:
        return 400;
    case GRPC_STATUS_UNAUTHENTICATED:
        return 401;
    case GRPC_STATUS_PERMISSION_DENIED:
        return 403;
    case GRPC_STATUS_NOT_FOUND:
    case GRPC_STATUS_UNIMPLEMENTED: /* no such method: HTTP's unknown path */
        return 404;
    case GRPC_STATUS_FAILED_PRECONDITION:
        return 412;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return 413;
    case GRPC_STATUS_CANCELLED:
        return 499; /* the client went away: no HTTP status says it, nginx's word for it */
    case GRPC_STATUS_UNAVAILABLE:
        return 503;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return 504;
    default:
        return 500;
    }
}

route_id grpc_method_route(grpc_method m)
{
    switch (m) {
    case GRPC_M_MODEL_INFER:
    case GRPC_M_MODEL_STREAM_INFER:
        return ROUTE_V2_INFER;
    case GRPC_M_HEALTH_CHECK:
    case GRPC_M_HEALTH_WATCH:
        return ROUTE_READYZ;
    case GRPC_M_UNKNOWN:
    case GRPC_M_COUNT:
        return ROUTE_OTHER;
    default:
        return ROUTE_V2;
    }
}

void grpc_answer_from_error(grpc_answer *out, const attn_error *err, route_id rid)
{
    int status = error_http_status(err->kind);
    grpc_status_code code = !strcmp(err->code, "deadline_exceeded") ? GRPC_STATUS_DEADLINE_EXCEEDED
                            : !strcmp(err->code, "client_closed")   ? GRPC_STATUS_CANCELLED
                                                                    : code_of_http(status);
    grpc_answer_error(out, code, "%s", err->message);
    out->retry_after = !strcmp(err->code, "overloaded") ? 1 : 0;
    out->http_status = status;
    out->route = rid;
}

void grpc_answer_pack(grpc_answer *out, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    free(out->bytes);
    out->bytes = malloc(n ? n : 1);
    if (out->bytes == NULL) {
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
        return;
    }
    out->len = protobuf_c_message_pack(msg, out->bytes);
    out->code = GRPC_STATUS_OK;
    out->message[0] = '\0';
}

int grpc_model_path(const char *name, const char *version, const char *tail, char *buf,
                    size_t cap, grpc_answer *out)
{
    /* The name becomes a path segment: one that is no segment names no model. */
    int ok = name[0] != '\0' && strcspn(name, "/?#%") == strlen(name) &&
             strcspn(version, "/?#%") == strlen(version);
    for (const char *p = name; ok && *p; p++)
        ok = (unsigned char)*p >= 0x20 && *p != 0x7f;
    int n = ok ? (version[0] ? snprintf(buf, cap, "/v2/models/%s/versions/%s%s", name, version,
                                        tail)
                             : snprintf(buf, cap, "/v2/models/%s%s", name, tail))
               : -1;
    if (n >= 0 && (size_t)n < cap)
        return 0;
    grpc_answer_error(out, GRPC_STATUS_NOT_FOUND, "Model \"%.200s\" is unknown.", name);
    out->http_status = 404;
    return -1;
}

/* Asks the router for method on path (body: NULL, or a JSON text) and fills
 * out with its status; on success
 * returns its JSON body (the caller decrefs), else NULL with out holding
 * the error (unless ok_status, also a success, was the status: then NULL
 * and out->code OK). */
static json_t *ask_json_body(const char *method, const char *path, const char *body,
                             int ok_status, grpc_answer *out)
{
    api_response resp;
    api_request req = {.method = method, .path = path, .body = body,
                       .body_len = body ? strlen(body) : 0, .protocol = "grpc"};
    api_handle(&req, &resp);
    out->http_status = resp.status;
    out->route = resp.route;
    json_t *root = NULL;
    if (resp.status == 200) {
        root = json_loadb(resp.body, resp.body_len, 0, NULL);
        if (root == NULL)
            grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The answer of %s is not JSON.", path);
    } else if (resp.status == ok_status) {
        out->code = GRPC_STATUS_OK;
    } else {
        grpc_answer_from_http(out, &resp);
    }
    api_response_free(&resp);
    return root;
}

/* ask_json_body for GET. */
static json_t *ask_json(const char *path, int ok_status, grpc_answer *out)
{
    return ask_json_body("GET", path, NULL, ok_status, out);
}

static void answer_probe(grpc_method m, grpc_answer *out)
{
    const char *path = m == GRPC_M_SERVER_LIVE ? "/v2/health/live" : "/v2/health/ready";
    json_t *root = ask_json(path, 503, out);
    if (root == NULL && out->code != GRPC_STATUS_OK)
        return;
    json_decref(root);
    int up = out->http_status == 200;
    if (m == GRPC_M_SERVER_LIVE) {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live = up;
        grpc_answer_pack(out, &r.base);
    } else {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready = up;
        grpc_answer_pack(out, &r.base);
    }
}

/* The names grpc.health.v1 may ask about: "" is the whole server, and the
 * one service it serves may be asked by name. */
static int health_known(const char *service)
{
    return service[0] == '\0' || strcmp(service, "inference.GRPCInferenceService") == 0;
}

/* The protocol's numbers, which grpc_private.h spells without protobuf-c. */
_Static_assert((int)GRPC_HEALTH_SERVING ==
                   (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING &&
               (int)GRPC_HEALTH_NOT_SERVING ==
                   (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING &&
               (int)GRPC_HEALTH_SERVICE_UNKNOWN ==
                   (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN,
               "grpc.health.v1 ServingStatus numbers");

void grpc_health_pack(int status, grpc_answer *out)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    grpc_answer_pack(out, &r.base);
}

int grpc_health_now(void)
{
    /* the readiness probe's answer (not draining, the store read lately), so that a
     * Kubernetes grpc: readiness probe says what httpGet /readyz says */
    api_response resp;
    api_request req = {.method = "GET", .path = "/readyz", .protocol = "grpc"};
    api_handle(&req, &resp);
    int serving = resp.status == 200;
    api_response_free(&resp);
    return serving ? GRPC_HEALTH_SERVING : GRPC_HEALTH_NOT_SERVING;
}

int grpc_health_watch_known(const unsigned char *in, size_t len, grpc_answer *out)
{
    Grpc__Health__V1__HealthCheckRequest *q =
        grpc__health__v1__health_check_request__unpack(NULL, len, in);
    if (q == NULL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "The request is not a HealthCheckRequest.");
        return -1;
    }
    int known = health_known(q->service);
    grpc__health__v1__health_check_request__free_unpacked(q, NULL);
    return known;
}

static void answer_health(const unsigned char *in, size_t len, grpc_answer *out)
{
    Grpc__Health__V1__HealthCheckRequest *q =
        grpc__health__v1__health_check_request__unpack(NULL, len, in);
    if (q == NULL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "The request is not a HealthCheckRequest.");
        return;
    }
    /* Check answers NOT_FOUND for a name not served, as the health spec says */
    if (!health_known(q->service)) {
        grpc_answer_error(out, GRPC_STATUS_NOT_FOUND, "There is no service \"%.200s\".",
                          q->service);
        grpc__health__v1__health_check_request__free_unpacked(q, NULL);
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(q, NULL);
    int status = grpc_health_now();
    out->http_status = status == GRPC_HEALTH_SERVING ? 200 : 503;
    out->route = ROUTE_READYZ; /* as the probe's twin, for /metrics */
    grpc_health_pack(status, out);
}

static void answer_model_ready(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelReadyRequest *q = inference__model_ready_request__unpack(NULL, len, in);
    if (q == NULL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "The request is not a ModelReadyRequest.");
        return;
    }
    char path[768];
    if (grpc_model_path(q->name, q->version, "/ready", path, sizeof path, out) == 0) {
        json_t *root = ask_json(path, 503, out);
        if (root != NULL || out->code == GRPC_STATUS_OK) {
            json_decref(root);
            Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
            r.ready = out->http_status == 200;
            grpc_answer_pack(out, &r.base);
        }
    }
    inference__model_ready_request__free_unpacked(q, NULL);
}

/* Each string of the JSON array a (borrowed from it) into *out, *n. */
static int strings_of(const json_t *a, char ***out, size_t *n)
{
    *n = json_array_size(a);
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (*out == NULL)
        return -1;
    for (size_t i = 0; i < *n; i++)
        (*out)[i] = (char *)(json_is_string(json_array_get(a, i))
                                 ? json_string_value(json_array_get(a, i))
                                 : "");
    return 0;
}

static void answer_server_metadata(grpc_answer *out)
{
    json_t *root = ask_json("/v2", 0, out);
    if (root == NULL)
        return;
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = (char *)json_string_value(json_object_get(root, "name"));
    r.version = (char *)json_string_value(json_object_get(root, "version"));
    if (r.name == NULL || r.version == NULL ||
        strings_of(json_object_get(root, "extensions"), &r.extensions, &r.n_extensions) != 0)
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The server's metadata is incomplete.");
    else
        grpc_answer_pack(out, &r.base);
    free(r.extensions);
    json_decref(root);
}

/* The tensors of a JSON array of {name, datatype, shape} into *out, *n
 * (the caller frees with free_tensors). */
static int tensors_of(const json_t *a, Inference__ModelMetadataResponse__TensorMetadata ***out,
                      size_t *n)
{
    *n = json_array_size(a);
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (*out == NULL)
        return -1;
    for (size_t i = 0; i < *n; i++) {
        const json_t *t = json_array_get(a, i);
        Inference__ModelMetadataResponse__TensorMetadata *m = calloc(1, sizeof *m);
        if (m == NULL)
            return -1;
        inference__model_metadata_response__tensor_metadata__init(m);
        (*out)[i] = m;
        const json_t *shape = json_object_get(t, "shape");
        m->name = (char *)(json_string_value(json_object_get(t, "name")) ?: "");
        m->datatype = (char *)(json_string_value(json_object_get(t, "datatype")) ?: "");
        m->n_shape = json_array_size(shape);
        m->shape = calloc(m->n_shape ? m->n_shape : 1, sizeof *m->shape);
        if (m->shape == NULL)
            return -1;
        for (size_t d = 0; d < m->n_shape; d++)
            m->shape[d] = (int64_t)json_number_value(json_array_get(shape, d));
    }
    return 0;
}

static void free_tensors(Inference__ModelMetadataResponse__TensorMetadata **t, size_t n)
{
    for (size_t i = 0; t != NULL && i < n; i++)
        if (t[i] != NULL) {
            free(t[i]->shape);
            free(t[i]);
        }
    free(t);
}

static void answer_model_metadata(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelMetadataRequest *q = inference__model_metadata_request__unpack(NULL, len, in);
    if (q == NULL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "The request is not a ModelMetadataRequest.");
        return;
    }
    char path[768];
    json_t *root = NULL;
    if (grpc_model_path(q->name, q->version, "", path, sizeof path, out) == 0)
        root = ask_json(path, 0, out);
    inference__model_metadata_request__free_unpacked(q, NULL);
    if (root == NULL)
        return;
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r.name = (char *)(json_string_value(json_object_get(root, "name")) ?: "");
    r.platform = (char *)(json_string_value(json_object_get(root, "platform")) ?: "");
    if (strings_of(json_object_get(root, "versions"), &r.versions, &r.n_versions) != 0 ||
        tensors_of(json_object_get(root, "inputs"), &r.inputs, &r.n_inputs) != 0 ||
        tensors_of(json_object_get(root, "outputs"), &r.outputs, &r.n_outputs) != 0)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else
        grpc_answer_pack(out, &r.base);
    free(r.versions);
    free_tensors(r.inputs, r.n_inputs);
    free_tensors(r.outputs, r.n_outputs);
    json_decref(root);
}

/* The pieces of a response message, freed together (parts_free). */
typedef struct parts {
    void **items;
    size_t n, cap;
    int failed;
} parts;

/* n zeroed bytes owned by p, or NULL (p->failed set) when memory ran out. */
static void *part(parts *p, size_t n)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 32;
        void **items = realloc(p->items, cap * sizeof *items);
        if (items == NULL) {
            p->failed = 1;
            return NULL;
        }
        p->items = items;
        p->cap = cap;
    }
    void *m = calloc(1, n ? n : 1);
    if (m == NULL) {
        p->failed = 1;
        return NULL;
    }
    return p->items[p->n++] = m;
}

static void parts_free(parts *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->items[i]);
    free(p->items);
}

/* Packs msg into out unless a part could not be had. */
static void pack_parts(grpc_answer *out, const ProtobufCMessage *msg, const parts *p)
{
    if (p->failed)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else
        grpc_answer_pack(out, msg);
}

static char *str_of(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return (char *)(s ? s : "");
}

/* The dims of a JSON array into p's memory. */
static int64_t *dims_of(parts *p, const json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int64_t *d = part(p, *n * sizeof *d);
    for (size_t i = 0; d != NULL && i < *n; i++)
        d[i] = (int64_t)json_number_value(json_array_get(a, i));
    return d;
}

static Inference__DataType data_type_of(const json_t *obj)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(
        &inference__data_type__descriptor, str_of(obj, "data_type"));
    return v ? (Inference__DataType)v->value : INFERENCE__DATA_TYPE__TYPE_INVALID;
}

static void answer_model_config(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelConfigRequest *q = inference__model_config_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a ModelConfigRequest.");
    char path[768];
    json_t *root = NULL;
    if (grpc_model_path(q->name, q->version, "/config", path, sizeof path, out) == 0)
        root = ask_json(path, 0, out);
    inference__model_config_request__free_unpacked(q, NULL);
    if (root == NULL)
        return;
    parts p = {0};
    Inference__ModelConfig c = INFERENCE__MODEL_CONFIG__INIT;
    c.name = str_of(root, "name");
    c.platform = str_of(root, "platform");
    c.max_batch_size = (int32_t)json_integer_value(json_object_get(root, "max_batch_size"));
    const json_t *ins = json_object_get(root, "input"), *outs = json_object_get(root, "output");
    c.input = part(&p, json_array_size(ins) * sizeof *c.input);
    for (size_t i = 0; c.input != NULL && i < json_array_size(ins); i++) {
        const json_t *t = json_array_get(ins, i);
        Inference__ModelInput *m = part(&p, sizeof *m);
        if (m == NULL)
            break;
        inference__model_input__init(m);
        m->name = str_of(t, "name");
        m->data_type = data_type_of(t);
        m->dims = dims_of(&p, json_object_get(t, "dims"), &m->n_dims);
        m->optional = json_is_true(json_object_get(t, "optional"));
        c.input[c.n_input++] = m;
    }
    c.output = part(&p, json_array_size(outs) * sizeof *c.output);
    for (size_t i = 0; c.output != NULL && i < json_array_size(outs); i++) {
        const json_t *t = json_array_get(outs, i);
        Inference__ModelOutput *m = part(&p, sizeof *m);
        if (m == NULL)
            break;
        inference__model_output__init(m);
        m->name = str_of(t, "name");
        m->data_type = data_type_of(t);
        m->dims = dims_of(&p, json_object_get(t, "dims"), &m->n_dims);
        c.output[c.n_output++] = m;
    }
    const json_t *params = json_object_get(root, "parameters");
    c.parameters = part(&p, json_object_size(params) * sizeof *c.parameters);
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)params, key, value) {
        Inference__ModelConfig__ParametersEntry *e = part(&p, sizeof *e);
        Inference__ModelParameter *mp = part(&p, sizeof *mp);
        if (c.parameters == NULL || e == NULL || mp == NULL)
            break;
        inference__model_config__parameters_entry__init(e);
        inference__model_parameter__init(mp);
        e->key = (char *)key;
        mp->string_value = str_of(value, "string_value");
        e->value = mp;
        c.parameters[c.n_parameters++] = e;
    }
    Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
    r.config = &c;
    pack_parts(out, &r.base, &p);
    parts_free(&p);
    json_decref(root);
}

/* A {"count", "ns"} of Triton's statistics into p's memory. */
static Inference__StatisticDuration *duration_of(parts *p, const json_t *d)
{
    Inference__StatisticDuration *s = part(p, sizeof *s);
    if (s == NULL)
        return NULL;
    inference__statistic_duration__init(s);
    s->count = (uint64_t)json_integer_value(json_object_get(d, "count"));
    s->ns = (uint64_t)json_integer_value(json_object_get(d, "ns"));
    return s;
}

static Inference__ModelStatistics *statistics_of(parts *p, const json_t *m)
{
    Inference__ModelStatistics *s = part(p, sizeof *s);
    Inference__InferStatistics *is = part(p, sizeof *is);
    if (s == NULL || is == NULL)
        return NULL;
    inference__model_statistics__init(s);
    inference__infer_statistics__init(is);
    s->name = str_of(m, "name");
    s->version = str_of(m, "version");
    s->last_inference = (uint64_t)json_integer_value(json_object_get(m, "last_inference"));
    s->inference_count = (uint64_t)json_integer_value(json_object_get(m, "inference_count"));
    s->execution_count = (uint64_t)json_integer_value(json_object_get(m, "execution_count"));
    const json_t *st = json_object_get(m, "inference_stats");
    is->success = duration_of(p, json_object_get(st, "success"));
    is->fail = duration_of(p, json_object_get(st, "fail"));
    is->queue = duration_of(p, json_object_get(st, "queue"));
    is->compute_input = duration_of(p, json_object_get(st, "compute_input"));
    is->compute_infer = duration_of(p, json_object_get(st, "compute_infer"));
    is->compute_output = duration_of(p, json_object_get(st, "compute_output"));
    is->cache_hit = duration_of(p, json_object_get(st, "cache_hit"));
    is->cache_miss = duration_of(p, json_object_get(st, "cache_miss"));
    s->inference_stats = is;
    const json_t *batches = json_object_get(m, "batch_stats");
    s->batch_stats = part(p, json_array_size(batches) * sizeof *s->batch_stats);
    for (size_t i = 0; s->batch_stats != NULL && i < json_array_size(batches); i++) {
        const json_t *b = json_array_get(batches, i);
        Inference__InferBatchStatistics *bs = part(p, sizeof *bs);
        if (bs == NULL)
            break;
        inference__infer_batch_statistics__init(bs);
        bs->batch_size = (uint64_t)json_integer_value(json_object_get(b, "batch_size"));
        bs->compute_input = duration_of(p, json_object_get(b, "compute_input"));
        bs->compute_infer = duration_of(p, json_object_get(b, "compute_infer"));
        bs->compute_output = duration_of(p, json_object_get(b, "compute_output"));
        s->batch_stats[s->n_batch_stats++] = bs;
    }
    return s;
}

static void answer_statistics(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelStatisticsRequest *q =
        inference__model_statistics_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a ModelStatisticsRequest.");
    char path[768];
    json_t *root = NULL;
    /* no name: every model, as GET /v2/models/stats */
    if (q->name[0] == '\0')
        root = ask_json("/v2/models/stats", 0, out);
    else if (grpc_model_path(q->name, q->version, "/stats", path, sizeof path, out) == 0)
        root = ask_json(path, 0, out);
    inference__model_statistics_request__free_unpacked(q, NULL);
    if (root == NULL)
        return;
    parts p = {0};
    const json_t *models = json_object_get(root, "model_stats");
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    r.model_stats = part(&p, json_array_size(models) * sizeof *r.model_stats);
    for (size_t i = 0; r.model_stats != NULL && i < json_array_size(models); i++) {
        Inference__ModelStatistics *s = statistics_of(&p, json_array_get(models, i));
        if (s == NULL)
            break;
        r.model_stats[r.n_model_stats++] = s;
    }
    pack_parts(out, &r.base, &p);
    parts_free(&p);
    json_decref(root);
}

static void answer_repository_index(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__RepositoryIndexRequest *q =
        inference__repository_index_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a RepositoryIndexRequest.");
    json_t *root = ask_json_body("POST", "/v2/repository/index",
                                 q->ready ? "{\"ready\":true}" : "{}", 0, out);
    inference__repository_index_request__free_unpacked(q, NULL);
    if (root == NULL)
        return;
    parts p = {0};
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    r.models = part(&p, json_array_size(root) * sizeof *r.models);
    for (size_t i = 0; r.models != NULL && i < json_array_size(root); i++) {
        const json_t *m = json_array_get(root, i);
        Inference__RepositoryIndexResponse__ModelIndex *e = part(&p, sizeof *e);
        if (e == NULL)
            break;
        inference__repository_index_response__model_index__init(e);
        e->name = str_of(m, "name");
        e->version = str_of(m, "version");
        e->state = str_of(m, "state");
        e->reason = str_of(m, "reason");
        r.models[r.n_models++] = e;
    }
    pack_parts(out, &r.base, &p);
    parts_free(&p);
    json_decref(root);
}

/* Load and unload: the router's answer to their HTTP twins (the models are
 * always loaded, so an error that says how to store or delete a set). */
static void answer_repository_control(grpc_method m, const unsigned char *in, size_t len,
                                      grpc_answer *out)
{
    int load = m == GRPC_M_REPOSITORY_LOAD;
    /* the two requests have the same fields */
    Inference__RepositoryModelLoadRequest *q = (Inference__RepositoryModelLoadRequest *)
        protobuf_c_message_unpack(load ? &inference__repository_model_load_request__descriptor
                                       : &inference__repository_model_unload_request__descriptor,
                                  NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT, "The request is not a %sRequest.",
                                 grpc_method_name(m));
    char path[768];
    json_t *root = NULL;
    if (grpc_model_path(q->model_name, "", "", path, sizeof path, out) == 0) {
        /* the twin's path is /v2/repository/models/{m}/load, not /v2/models/{m} */
        char twin[800];
        snprintf(twin, sizeof twin, "/v2/repository%s/%s", path + 3, load ? "load" : "unload");
        root = ask_json_body("POST", twin, "{}", 0, out);
    }
    protobuf_c_message_free_unpacked(&q->base, NULL);
    if (root == NULL)
        return;
    json_decref(root);
    Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
    Inference__RepositoryModelUnloadResponse u = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
    grpc_answer_pack(out, load ? &r.base : &u.base);
}

/* The request messages without fields still have to be messages. */
static int empty_message_ok(const ProtobufCMessageDescriptor *d, const unsigned char *in,
                            size_t len)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, in);
    if (m == NULL)
        return 0;
    protobuf_c_message_free_unpacked(m, NULL);
    return 1;
}

void grpc_service_answer(grpc_method m, const unsigned char *in, size_t len, grpc_answer *out)
{
    memset(out, 0, sizeof *out);
    out->route = ROUTE_OTHER;
    switch (m) {
    case GRPC_M_SERVER_LIVE:
    case GRPC_M_SERVER_READY:
        if (!empty_message_ok(m == GRPC_M_SERVER_LIVE ? &inference__server_live_request__descriptor
                                                      : &inference__server_ready_request__descriptor,
                              in, len))
            return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                     "The request is not a %sRequest.", grpc_method_name(m));
        return answer_probe(m, out);
    case GRPC_M_MODEL_READY:
        return answer_model_ready(in, len, out);
    case GRPC_M_SERVER_METADATA:
        if (!empty_message_ok(&inference__server_metadata_request__descriptor, in, len))
            return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                     "The request is not a ServerMetadataRequest.");
        return answer_server_metadata(out);
    case GRPC_M_MODEL_METADATA:
        return answer_model_metadata(in, len, out);
    case GRPC_M_MODEL_CONFIG:
        return answer_model_config(in, len, out);
    case GRPC_M_MODEL_STATISTICS:
        return answer_statistics(in, len, out);
    case GRPC_M_REPOSITORY_INDEX:
        return answer_repository_index(in, len, out);
    case GRPC_M_REPOSITORY_LOAD:
    case GRPC_M_REPOSITORY_UNLOAD:
        return answer_repository_control(m, in, len, out);
    case GRPC_M_HEALTH_CHECK:
        return answer_health(in, len, out);
    default:
        return grpc_answer_error(out, GRPC_STATUS_UNIMPLEMENTED, "This server has no such method.");
    }
}

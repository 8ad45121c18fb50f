/*
 * grpc_service.c - the cheap RPCs of the gRPC front-end: liveness,
 * readiness, server and model metadata, and grpc.health.v1's Check, each
 * answered by asking the router for its HTTP v2 twin and translating the
 * JSON answer into the response message; and what every RPC shares (the
 * method table, the status codes of HTTP statuses, packing).
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
    [GRPC_M_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
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
    /* v2's error body is {"error": "words"}; v1's {"error": {"message": ...}} */
    json_t *root = resp->body ? json_loadb(resp->body, resp->body_len, 0, NULL) : NULL;
    const json_t *e = json_object_get(root, "error");
    const char *words = json_is_string(e) ? json_string_value(e)
                        : json_is_string(json_object_get(e, "message"))
                            ? json_string_value(json_object_get(e, "message"))
                            : "The server could not answer.";
    grpc_answer_error(out, code_of_http(resp->status), "%s", words);
    json_decref(root);
    out->retry_after = resp->retry_after;
    out->http_status = resp->status;
    out->route = resp->route;
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

void grpc_route_ask(const char *method, const char *path, api_response *resp)
{
    api_request req = {.method = method, .path = path};
    api_handle(&req, resp);
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

/* Asks the router for path and fills out with its status; on success
 * returns its JSON body (the caller decrefs), else NULL with out holding
 * the error (unless ok_status, also a success, was the status: then NULL
 * and out->code OK). */
static json_t *ask_json(const char *path, int ok_status, grpc_answer *out)
{
    api_response resp;
    grpc_route_ask("GET", path, &resp);
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

static void answer_health(const unsigned char *in, size_t len, grpc_answer *out)
{
    Grpc__Health__V1__HealthCheckRequest *q =
        grpc__health__v1__health_check_request__unpack(NULL, len, in);
    if (q == NULL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "The request is not a HealthCheckRequest.");
        return;
    }
    /* "" is the whole server; the one service it serves may be asked by name */
    if (q->service[0] != '\0' && strcmp(q->service, "inference.GRPCInferenceService") != 0) {
        grpc_answer_error(out, GRPC_STATUS_NOT_FOUND, "There is no service \"%.200s\".",
                          q->service);
        grpc__health__v1__health_check_request__free_unpacked(q, NULL);
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(q, NULL);
    json_t *root = ask_json("/v2/health/ready", 503, out);
    if (root == NULL && out->code != GRPC_STATUS_OK)
        return;
    json_decref(root);
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = out->http_status == 200
                   ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    grpc_answer_pack(out, &r.base);
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
    case GRPC_M_HEALTH_CHECK:
        return answer_health(in, len, out);
    default:
        return grpc_answer_error(out, GRPC_STATUS_UNIMPLEMENTED, "This server has no such method.");
    }
}

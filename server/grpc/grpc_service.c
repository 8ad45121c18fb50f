/*
 * grpc_service.c - the cheap RPCs of the gRPC front-end: liveness,
 * readiness, server and model metadata, configuration, statistics, the
 * repository, and grpc.health.v1's Check (and the status its Watch sends),
 * each answered by asking the router for its HTTP v2 twin with the answer
 * as fields (api_request.fields_only: message/api_meta.h, which v2 also
 * writes its JSON from) and packing them into the response message; and
 * what every RPC shares (the method table, the status codes of HTTP
 * statuses, packing).
 *
 * Asking the router keeps one rule in one place: what a model is, what
 * readiness means while draining, which words an error has.  No JSON text
 * is made or parsed back on the way.
 */
#include "grpc_private.h"

#include <health.pb-c.h>
#include <inference.pb-c.h>
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
    case 429:
    case 507: /* a full disk; no RPC writes a set today, so for completeness */
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
    out->retry_after = !strcmp(err->code, "overloaded") || status == 429 ? 1 : 0;
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

/* Asks the router for method on path (body: NULL, or a JSON text) with the answer as
 * fields (api_request.fields_only: resp->meta, no body to parse back), into resp; fills
 * out with its status.  Returns 0 for a 200 or ok_status (out->code OK; the caller frees
 * resp with api_response_free), else -1 with out holding the error and resp freed. */
static int ask_body(const char *method, const char *path, const char *body, int ok_status,
                    api_response *resp, grpc_answer *out)
{
    api_request req = {.method = method, .path = path, .body = body,
                       .body_len = body ? strlen(body) : 0, .fields_only = 1,
                       .protocol = "grpc"};
    api_handle(&req, resp);
    out->http_status = resp->status;
    out->route = resp->route;
    if (resp->status == 200 || resp->status == ok_status) {
        out->code = GRPC_STATUS_OK;
        return 0;
    }
    grpc_answer_from_http(out, resp);
    api_response_free(resp);
    return -1;
}

/* ask_body for GET. */
static int ask_fields(const char *path, int ok_status, api_response *resp, grpc_answer *out)
{
    return ask_body("GET", path, NULL, ok_status, resp, out);
}

static void answer_probe(grpc_method m, grpc_answer *out)
{
    const char *path = m == GRPC_M_SERVER_LIVE ? "/v2/health/live" : "/v2/health/ready";
    api_response resp;
    int rc = ask_fields(path, 503, &resp, out); /* the status says it all */
    api_response_free(&resp);
    if (rc != 0)
        return;
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
        api_response resp;
        int rc = ask_fields(path, 503, &resp, out);
        api_response_free(&resp);
        if (rc == 0) {
            Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
            r.ready = out->http_status == 200;
            grpc_answer_pack(out, &r.base);
        }
    }
    inference__model_ready_request__free_unpacked(q, NULL);
}

static void answer_server_metadata(grpc_answer *out)
{
    api_response resp;
    if (ask_fields("/v2", 0, &resp, out) == 0) {
        const api_meta_answer *a = &resp.meta;
        Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
        r.name = (char *)a->name;
        r.version = (char *)a->version;
        r.extensions = (char **)a->extensions;
        r.n_extensions = a->n_extensions;
        if (a->kind != API_META_SERVER)
            grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The server's metadata is incomplete.");
        else
            grpc_answer_pack(out, &r.base);
    }
    api_response_free(&resp);
}

/* The metadata of a model's tensors t[0..n) into m[] (with their shapes in shapes[]) and
 * ptrs[]. */
static void tensors_of(const api_meta_tensor *t, size_t n,
                       Inference__ModelMetadataResponse__TensorMetadata *m,
                       Inference__ModelMetadataResponse__TensorMetadata **ptrs,
                       int64_t (*shapes)[API_META_MAX_RANK])
{
    for (size_t i = 0; i < n; i++) {
        inference__model_metadata_response__tensor_metadata__init(&m[i]);
        m[i].name = (char *)t[i].name;
        m[i].datatype = (char *)t[i].datatype;
        m[i].n_shape = (size_t)t[i].rank;
        m[i].shape = shapes[i];
        for (int d = 0; d < t[i].rank; d++)
            shapes[i][d] = t[i].dims[d];
        ptrs[i] = &m[i];
    }
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
    api_response resp;
    int rc = grpc_model_path(q->name, q->version, "", path, sizeof path, out) == 0
                 ? ask_fields(path, 0, &resp, out)
                 : -1;
    inference__model_metadata_request__free_unpacked(q, NULL);
    if (rc != 0)
        return;
    const api_meta_answer *a = &resp.meta;
    Inference__ModelMetadataResponse__TensorMetadata ins[API_META_MAX_INPUTS],
        outs[API_META_MAX_OUTPUTS], *in_ptrs[API_META_MAX_INPUTS],
        *out_ptrs[API_META_MAX_OUTPUTS];
    int64_t in_shapes[API_META_MAX_INPUTS][API_META_MAX_RANK],
        out_shapes[API_META_MAX_OUTPUTS][API_META_MAX_RANK];
    char *versions[] = {(char *)a->model_version};
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r.name = (char *)a->name;
    r.platform = (char *)a->platform;
    r.versions = versions;
    r.n_versions = 1;
    tensors_of(a->inputs, a->n_inputs, ins, in_ptrs, in_shapes);
    tensors_of(a->outputs, a->n_outputs, outs, out_ptrs, out_shapes);
    r.inputs = in_ptrs;
    r.n_inputs = a->n_inputs;
    r.outputs = out_ptrs;
    r.n_outputs = a->n_outputs;
    if (a->kind != API_META_MODEL)
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The model's metadata is incomplete.");
    else
        grpc_answer_pack(out, &r.base);
    api_response_free(&resp);
}

/* The configuration's data_type of a tensor's datatype (api_meta_config_type's name). */
static Inference__DataType config_type(const char *datatype)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(
        &inference__data_type__descriptor, api_meta_config_type(datatype));
    return v ? (Inference__DataType)v->value : INFERENCE__DATA_TYPE__TYPE_INVALID;
}

static void answer_model_config(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelConfigRequest *q = inference__model_config_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a ModelConfigRequest.");
    char path[768];
    api_response resp;
    int rc = grpc_model_path(q->name, q->version, "/config", path, sizeof path, out) == 0
                 ? ask_fields(path, 0, &resp, out)
                 : -1;
    inference__model_config_request__free_unpacked(q, NULL);
    if (rc != 0)
        return;
    const api_meta_answer *a = &resp.meta;
    Inference__ModelConfig c = INFERENCE__MODEL_CONFIG__INIT;
    c.name = (char *)a->name;
    c.platform = (char *)a->platform;
    c.max_batch_size = a->max_batch_size;
    Inference__ModelInput ins[API_META_MAX_INPUTS], *in_ptrs[API_META_MAX_INPUTS];
    Inference__ModelOutput outs[API_META_MAX_OUTPUTS], *out_ptrs[API_META_MAX_OUTPUTS];
    int64_t in_dims[API_META_MAX_INPUTS][API_META_MAX_RANK],
        out_dims[API_META_MAX_OUTPUTS][API_META_MAX_RANK];
    for (size_t i = 0; i < a->n_inputs; i++) {
        const api_meta_tensor *t = &a->inputs[i];
        inference__model_input__init(&ins[i]);
        ins[i].name = (char *)t->name;
        ins[i].data_type = config_type(t->datatype);
        ins[i].n_dims = (size_t)t->rank;
        ins[i].dims = in_dims[i];
        for (int d = 0; d < t->rank; d++)
            in_dims[i][d] = t->dims[d];
        ins[i].optional = t->optional;
        in_ptrs[i] = &ins[i];
    }
    for (size_t i = 0; i < a->n_outputs; i++) {
        const api_meta_tensor *t = &a->outputs[i];
        inference__model_output__init(&outs[i]);
        outs[i].name = (char *)t->name;
        outs[i].data_type = config_type(t->datatype);
        outs[i].n_dims = (size_t)t->rank;
        outs[i].dims = out_dims[i];
        for (int d = 0; d < t->rank; d++)
            out_dims[i][d] = t->dims[d];
        out_ptrs[i] = &outs[i];
    }
    c.input = in_ptrs;
    c.n_input = a->n_inputs;
    c.output = out_ptrs;
    c.n_output = a->n_outputs;
    /* Triton's free-form parameters, in the order the JSON body writes them */
    Inference__ModelConfig__ParametersEntry entries[2], *entry_ptrs[2];
    Inference__ModelParameter values[2];
    const char *keys[2] = {"input_datatypes", "output_datatypes"};
    const char *strings[2] = {a->input_datatypes, a->output_datatypes};
    for (int i = 0; i < 2; i++) {
        inference__model_config__parameters_entry__init(&entries[i]);
        inference__model_parameter__init(&values[i]);
        entries[i].key = (char *)keys[i];
        values[i].string_value = (char *)strings[i];
        entries[i].value = &values[i];
        entry_ptrs[i] = &entries[i];
    }
    c.parameters = entry_ptrs;
    c.n_parameters = 2;
    Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
    r.config = &c;
    if (a->kind != API_META_CONFIG)
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The model's configuration is incomplete.");
    else
        grpc_answer_pack(out, &r.base);
    api_response_free(&resp);
}

/* A duration of Triton's statistics. */
static Inference__StatisticDuration duration_of(const model_stats_timing *t)
{
    Inference__StatisticDuration d = INFERENCE__STATISTIC_DURATION__INIT;
    d.count = t->count;
    d.ns = t->ns;
    return d;
}

/* The statistics of one model, as v2's JSON says them (v2_stats.c): its one version,
 * no response cache, every execution under batch size 1. */
typedef struct model_statistics {
    Inference__ModelStatistics s;
    Inference__InferStatistics is;
    Inference__InferBatchStatistics batch, *batch_ptr;
    Inference__StatisticDuration d[11];
} model_statistics;

static void statistics_of(model_statistics *m, const api_meta_model *model,
                          const char *version)
{
    const model_stats *st = &model->stats;
    static const model_stats_timing none = {0, 0};
    inference__model_statistics__init(&m->s);
    inference__infer_statistics__init(&m->is);
    inference__infer_batch_statistics__init(&m->batch);
    m->s.name = (char *)model->name;
    m->s.version = (char *)version;
    m->s.last_inference = st->last_inference_ms;
    m->s.inference_count = st->inference_count;
    m->s.execution_count = st->execution_count;
    const model_stats_timing *t[11] = {&st->success, &st->fail, &st->queue, &st->compute_input,
                                       &st->compute_infer, &st->compute_output, &none, &none,
                                       &st->compute_input, &st->compute_infer,
                                       &st->compute_output};
    for (int i = 0; i < 11; i++)
        m->d[i] = duration_of(t[i]);
    m->is.success = &m->d[0];
    m->is.fail = &m->d[1];
    m->is.queue = &m->d[2];
    m->is.compute_input = &m->d[3];
    m->is.compute_infer = &m->d[4];
    m->is.compute_output = &m->d[5];
    m->is.cache_hit = &m->d[6];
    m->is.cache_miss = &m->d[7];
    m->s.inference_stats = &m->is;
    if (st->execution_count > 0) {
        m->batch.batch_size = 1;
        m->batch.compute_input = &m->d[8];
        m->batch.compute_infer = &m->d[9];
        m->batch.compute_output = &m->d[10];
        m->batch_ptr = &m->batch;
        m->s.batch_stats = &m->batch_ptr;
        m->s.n_batch_stats = 1;
    }
}

static void answer_statistics(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__ModelStatisticsRequest *q =
        inference__model_statistics_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a ModelStatisticsRequest.");
    char path[768];
    api_response resp;
    int rc = -1;
    /* no name: every model, as GET /v2/models/stats */
    if (q->name[0] == '\0')
        rc = ask_fields("/v2/models/stats", 0, &resp, out);
    else if (grpc_model_path(q->name, q->version, "/stats", path, sizeof path, out) == 0)
        rc = ask_fields(path, 0, &resp, out);
    inference__model_statistics_request__free_unpacked(q, NULL);
    if (rc != 0)
        return;
    const api_meta_answer *a = &resp.meta;
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    model_statistics *m = calloc(a->n_models + 1, sizeof *m);
    Inference__ModelStatistics **ptrs = calloc(a->n_models + 1, sizeof *ptrs);
    if (m == NULL || ptrs == NULL)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else if (a->kind != API_META_STATS)
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The statistics are incomplete.");
    else {
        for (size_t i = 0; i < a->n_models; i++) {
            statistics_of(&m[i], &a->models[i], a->model_version);
            ptrs[i] = &m[i].s;
        }
        r.model_stats = ptrs;
        r.n_model_stats = a->n_models;
        grpc_answer_pack(out, &r.base);
    }
    free(m);
    free(ptrs);
    api_response_free(&resp);
}

static void answer_repository_index(const unsigned char *in, size_t len, grpc_answer *out)
{
    Inference__RepositoryIndexRequest *q =
        inference__repository_index_request__unpack(NULL, len, in);
    if (q == NULL)
        return grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                                 "The request is not a RepositoryIndexRequest.");
    api_response resp;
    int rc = ask_body("POST", "/v2/repository/index", q->ready ? "{\"ready\":true}" : "{}", 0,
                      &resp, out);
    inference__repository_index_request__free_unpacked(q, NULL);
    if (rc != 0)
        return;
    const api_meta_answer *a = &resp.meta;
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    Inference__RepositoryIndexResponse__ModelIndex *e = calloc(a->n_models + 1, sizeof *e);
    Inference__RepositoryIndexResponse__ModelIndex **ptrs = calloc(a->n_models + 1,
                                                                   sizeof *ptrs);
    if (e == NULL || ptrs == NULL)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else if (a->kind != API_META_INDEX)
        grpc_answer_error(out, GRPC_STATUS_INTERNAL, "The repository's index is incomplete.");
    else {
        for (size_t i = 0; i < a->n_models; i++) {
            inference__repository_index_response__model_index__init(&e[i]);
            e[i].name = (char *)a->models[i].name;
            e[i].version = (char *)a->model_version;
            e[i].state = (char *)"READY";
            e[i].reason = (char *)"";
            ptrs[i] = &e[i];
        }
        r.models = ptrs;
        r.n_models = a->n_models;
        grpc_answer_pack(out, &r.base);
    }
    free(e);
    free(ptrs);
    api_response_free(&resp);
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
    int rc = -1;
    if (grpc_model_path(q->model_name, "", "", path, sizeof path, out) == 0) {
        /* the twin's path is /v2/repository/models/{m}/load, not /v2/models/{m} */
        char twin[800];
        snprintf(twin, sizeof twin, "/v2/repository%s/%s", path + 3, load ? "load" : "unload");
        api_response resp;
        rc = ask_body("POST", twin, "{}", 0, &resp, out);
        api_response_free(&resp);
    }
    protobuf_c_message_free_unpacked(&q->base, NULL);
    if (rc != 0)
        return;
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

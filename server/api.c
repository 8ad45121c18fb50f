/*
 * api.c - the routes of contract v1 and their handlers.
 *
 * POST /v1/attention is the only expensive route: it is admitted only while
 * fewer than --max-inflight computations run and the server is not draining,
 * then decoded, checked against the element and memory limits, computed and
 * encoded.  The JSON tree of the body is freed before the computation starts,
 * so a request holds the tree or its arrays, not both for long.
 */
#include "api.h"

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "attention_json.h"
#include "compute.h"
#include "json_in.h"
#include "jsonw.h"
#include "mem.h"
#include "store.h"
#include "v2.h"
#include "version.h"
#include "weights.h"
#include "weights_json.h"

/* Bytes a number takes in the response at most ("-1.2345678901234567e-300,"). */
#define RESPONSE_BYTES_PER_NUMBER 26

static const server_config *api_cfg;
static weight_store *api_store;
static atomic_int api_draining;
static atomic_long api_computing;

static const char *const ALLOW_GET = "GET, HEAD, OPTIONS";
static const char *const ALLOW_POST = "POST, OPTIONS";
static const char *const ALLOW_SET = "GET, HEAD, PUT, DELETE, OPTIONS";
static const char *const SET_PREFIX = "/v1/weight-sets/";

int api_init(const server_config *cfg, attn_error *err)
{
    store_limits limits = {cfg->max_set_bytes, cfg->max_store_bytes};
    api_store = store_open(cfg->data_dir, &limits, err);
    if (api_store == NULL)
        return err->kind ? err->kind : ERR_INTERNAL;
    api_cfg = cfg;
    atomic_store(&api_draining, 0);
    atomic_store(&api_computing, 0);
    return 0;
}

void api_shutdown(void)
{
    store_close(api_store);
    api_store = NULL;
    api_cfg = NULL;
}

void api_set_draining(int draining)
{
    atomic_store(&api_draining, draining);
}

long api_busy(void)
{
    return atomic_load(&api_computing);
}

metrics_route api_route(const char *path, const char **allow)
{
    static const struct { const char *path; metrics_route route; int post; } routes[] = {
        {"/v1/attention", ROUTE_ATTENTION, 1}, {"/healthz", ROUTE_HEALTHZ, 0},
        {"/readyz", ROUTE_READYZ, 0},          {"/v1/info", ROUTE_INFO, 0},
        {"/metrics", ROUTE_METRICS, 0},        {"/v1/weight-sets", ROUTE_WEIGHT_SETS, 0},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(path, routes[i].path) == 0) {
            *allow = routes[i].post ? ALLOW_POST : ALLOW_GET;
            return routes[i].route;
        }
    /* /v1/weight-sets/{name} is one segment: a path with more below it is
     * no endpoint (404; api_handle lets a PUT there say that the name is
     * invalid), while a single segment that is not a valid name is a bad
     * request for a weight set (400). */
    size_t prefix = strlen(SET_PREFIX);
    if (strncmp(path, SET_PREFIX, prefix) == 0 && path[prefix] != '\0' &&
        strchr(path + prefix, '/') == NULL) {
        *allow = ALLOW_SET;
        return ROUTE_WEIGHT_SET;
    }
    int infer;
    if (v2_route(path, &infer)) {
        *allow = infer ? ALLOW_POST : ALLOW_GET;
        return infer ? ROUTE_V2_INFER : ROUTE_V2;
    }
    *allow = NULL;
    return ROUTE_OTHER;
}

static void respond_static(api_response *resp, int status, const char *body)
{
    resp->status = status;
    resp->body = (char *)body;
    resp->body_len = strlen(body);
    resp->body_static = 1;
    resp->content_type = "application/json";
}

void api_respond_error(api_response *resp, const attn_error *err)
{
    if (resp->route == ROUTE_V2 || resp->route == ROUTE_V2_INFER) {
        v2_respond_error(resp, err); /* the protocol's own error body */
        return;
    }
    jw_buf w;
    jw_init(&w, 256 + strlen(err->message));
    jw_raw(&w, "{\"error\":{\"code\":");
    jw_string(&w, err->code);
    jw_raw(&w, ",\"message\":");
    jw_string(&w, err->message);
    if (err->field[0]) {
        jw_raw(&w, ",\"field\":");
        jw_string(&w, err->field);
    }
    jw_raw(&w, "}}\n");
    api_response_free(resp);
    resp->status = error_http_status(err->kind);
    resp->content_type = "application/json";
    if (err->kind == ERR_UNAVAILABLE && resp->retry_after == 0)
        resp->retry_after = 1;
    resp->body = jw_finish(&w, &resp->body_len);
    resp->body_static = 0;
    if (resp->body == NULL) {
        resp->retry_after = 1;
        respond_static(resp, 503, "{\"error\":{\"code\":\"overloaded\",\"message\":\"The server "
                                  "ran out of memory; retry later.\"}}\n");
    }
}

/* Serialises a jansson value (stolen) as the body of resp. */
static void respond_json(api_response *resp, int status, json_t *value)
{
    /* json_dumps allocates through mem_malloc (mem_install_jansson). */
    char *text = value ? json_dumps(value, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(value);
    if (text == NULL) {
        attn_error err;
        error_nomem(&err);
        api_respond_error(resp, &err);
        return;
    }
    resp->body = text;
    resp->body_len = strlen(text);
    resp->status = status;
    resp->content_type = "application/json";
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Fills resp with a body built by jw (consumed), or the out-of-memory error. */
static void respond_jw(api_response *resp, int status, jw_buf *w)
{
    resp->body = jw_finish(w, &resp->body_len);
    if (resp->body == NULL) {
        attn_error err;
        error_nomem(&err);
        api_respond_error(resp, &err);
        return;
    }
    resp->status = status;
    resp->content_type = "application/json";
}

int api_check_job_limits(const attn_job *job, size_t result_elements, size_t bytes_per_number,
                         const char *attention_hint, size_t *response_bytes, attn_error *err)
{
    size_t work_bytes = 0;
    const char *hint = job->want_attention ? attention_hint : "";
    const char *sep = job->want_attention ? " or " : "";
    *response_bytes = 0;
    if (result_elements > api_cfg->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The answer would hold %zu numbers, more than the server's limit of %zu "
                         "(--max-elements); send fewer tokens%s%s.", result_elements,
                         api_cfg->max_elements, job->want_attention ? ", or " : "", hint);
    if (attention_job_bytes(job, &work_bytes) != 0 ||
        mem_mul(result_elements, bytes_per_number, 1, response_bytes) != 0 ||
        work_bytes + *response_bytes > api_cfg->max_request_memory)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "Computing this request needs about %zu MiB, more than the server's "
                         "limit of %zu MiB per request (--max-request-memory); send fewer "
                         "tokens%s%s.", (work_bytes + *response_bytes) >> 20,
                         api_cfg->max_request_memory >> 20, sep, hint);
    return 0;
}

/* Decodes, checks limits, computes and encodes one attention request. */
static void handle_attention(const api_request *req, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    /* The tree lives only until its numbers are decoded: it is made in the arena. */
    mem_json_arena_begin();
    json_t *root = json_in_parse(req->body, req->body_len, &err);
    if (root == NULL) {
        mem_json_arena_end();
        api_respond_error(resp, &err);
        return;
    }
    attention_json_request ar;
    attention_json_limits limits = {api_cfg->max_elements};
    int rc = attention_json_decode(root, &limits, &ar, &err);
    json_decref(root);
    mem_json_arena_end();
    if (rc != 0) {
        api_respond_error(resp, &err);
        return;
    }
    weight_set *set = NULL;
    if (ar.weights_name[0]) {
        /* Hold a reference for the whole computation: a concurrent replace or
         * delete of the name cannot change or free these numbers. */
        set = store_get(api_store, ar.weights_name);
        if (set == NULL) {
            error_set(&err, ERR_NOT_FOUND, "unknown_weight_set", "weights",
                      "There is no stored weight set named \"%s\"; upload it with PUT "
                      "/v1/weight-sets/%s.", ar.weights_name, ar.weights_name);
            goto fail;
        }
        if (ar.weights_layout_given && ar.out_in != set->out_in) {
            error_set(&err, ERR_BAD_REQUEST, "conflicting_fields", "weights_layout",
                      "weights_layout is \"%s\" but the weight set \"%s\" was stored as "
                      "\"%s\"; leave weights_layout out when naming a stored set.",
                      ar.out_in ? "out_in" : "in_out", set->name, set->out_in ? "out_in" : "in_out");
            goto fail;
        }
        if (ar.heads_given && set->heads != 0 && ar.job.heads != set->heads) {
            error_set(&err, ERR_BAD_REQUEST, "conflicting_fields", "heads",
                      "heads is %zu but the weight set \"%s\" was stored with heads = %zu; leave "
                      "heads out to use the stored value.", ar.job.heads, set->name, set->heads);
            goto fail;
        }
        if (!ar.heads_given && set->heads != 0) {
            ar.job.heads = set->heads;
            ar.heads_given = 1;
        }
        if (attention_json_bind_weights(&ar, &set->w, 1, &err) != 0)
            goto fail;
    }
    size_t result_elements = attention_json_result_elements(&ar), response_bytes = 0;
    if (api_check_job_limits(&ar.job, result_elements, RESPONSE_BYTES_PER_NUMBER,
                             "set return_attention to false", &response_bytes, &err) != 0)
        goto fail;
    attn_result result;
    double start = now_seconds();
    rc = attention_run(&ar.job, &result, &err);
    double ms = (now_seconds() - start) * 1000.0;
    if (rc != 0)
        goto fail;
    jw_buf w;
    jw_init(&w, response_bytes / 2 + 512);
    attention_json_encode(&ar, &result, ms, &w);
    attention_result_free(&result);
    attention_json_free(&ar);
    weightset_release(set);
    respond_jw(resp, 200, &w);
    return;
fail:
    attention_json_free(&ar);
    weightset_release(set);
    api_respond_error(resp, &err);
}

static void handle_set_list(api_response *resp)
{
    size_t count = 0;
    weight_set **sets = NULL;
    attn_error err;
    if (store_list(api_store, &sets, &count, &err) != 0) {
        api_respond_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 256 + count * 256);
    jw_raw(&w, "{\"weight_sets\":[");
    for (size_t i = 0; i < count; i++) {
        if (i)
            jw_char(&w, ',');
        weights_json_encode_set(sets[i], 0, &w);
    }
    jw_raw(&w, "],\"count\":");
    jw_size(&w, count);
    jw_raw(&w, ",\"total_bytes\":");
    jw_size(&w, store_total_bytes(api_store));
    jw_raw(&w, "}");
    store_list_free(sets, count);
    respond_jw(resp, 200, &w);
}

/* GET, PUT and DELETE of /v1/weight-sets/{name}. */
static void handle_set(const api_request *req, const char *name, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    if (!weights_valid_name(name)) {
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "name",
                  "\"%.80s\" is not a valid weight-set name: use 1 to 64 of A-Z a-z 0-9 . _ -.",
                  name);
        api_respond_error(resp, &err);
        return;
    }
    if (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD")) {
        weight_set *set = store_get(api_store, name);
        if (set == NULL) {
            error_set(&err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                      "There is no stored weight set named \"%s\".", name);
            api_respond_error(resp, &err);
            return;
        }
        jw_buf w;
        jw_init(&w, set->size_bytes * 3 + 1024);
        weights_json_encode_set(set, 1, &w);
        weightset_release(set);
        respond_jw(resp, 200, &w);
        return;
    }
    if (!strcmp(req->method, "DELETE")) {
        if (store_delete(api_store, name, &err) != 0) {
            api_respond_error(resp, &err);
            return;
        }
        respond_static(resp, 204, "");
        return;
    }
    /* PUT */
    mem_json_arena_begin();
    json_t *root = json_in_parse(req->body, req->body_len, &err);
    if (root == NULL) {
        mem_json_arena_end();
        api_respond_error(resp, &err);
        return;
    }
    attn_weights wts;
    size_t heads;
    int out_in;
    int rc = weights_json_decode_set(root, api_cfg->max_elements, &wts, &heads, &out_in, &err);
    json_decref(root);
    mem_json_arena_end();
    if (rc != 0) {
        api_respond_error(resp, &err);
        return;
    }
    weight_set *set = weightset_new(name, &wts, heads, out_in);
    if (set == NULL) {
        error_nomem(&err);
        api_respond_error(resp, &err);
        return;
    }
    weightset_retain(set); /* ours, for the answer; store_put takes the other */
    int created = 0;
    if (store_put(api_store, set, &created, &err) != 0) {
        weightset_release(set);
        api_respond_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 512);
    weights_json_encode_set(set, 0, &w);
    weightset_release(set);
    if (created)
        snprintf(resp->location, sizeof resp->location, "%s%s", SET_PREFIX, name);
    respond_jw(resp, created ? 201 : 200, &w);
}

static void handle_info(api_response *resp)
{
    char config[256], core[64];
    int threads;
    attention_blas_describe(config, sizeof config, core, sizeof core, &threads);
    json_t *info = json_pack(
        "{s:s, s:s, s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s, s:i}, s:{s:i, s:i}, s:[s, s], "
        "s:{s:I, s:I, s:I, s:I, s:I}}",
        "name", "attention-server", "version", ATTN_VERSION, "contract", "v1",
        "build", "commit", ATTN_BUILD_COMMIT, "date", ATTN_BUILD_DATE, "compiler", __VERSION__,
        "blas", "library", "OpenBLAS", "config", config, "core", core, "threads", threads,
        "compute", "threads", (int)compute_threads(), "available_cpus", (int)compute_available_cpus(),
        "dtypes", "float64", "float32",
        "limits", "max_body_bytes", (json_int_t)api_cfg->max_body,
        "max_elements", (json_int_t)api_cfg->max_elements,
        "max_request_memory_bytes", (json_int_t)api_cfg->max_request_memory,
        "max_inflight", (json_int_t)api_cfg->max_inflight,
        "max_connections", (json_int_t)api_cfg->max_connections);
    respond_json(resp, 200, info);
}

void api_handle(const api_request *req, api_response *resp)
{
    memset(resp, 0, sizeof *resp);
    const char *allow;
    attn_error err;
    error_clear(&err);
    resp->route = api_route(req->path, &allow);
    resp->allow = allow;
    if (!strcmp(req->method, "OPTIONS") && !strcmp(req->path, "*")) {
        resp->allow = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
        respond_static(resp, 204, "");
        return;
    }
    size_t prefix = strlen(SET_PREFIX);
    if (allow == NULL && !strcmp(req->method, "PUT") && !strncmp(req->path, SET_PREFIX, prefix) &&
        req->path[prefix] != '\0') {
        /* PUT chooses the name: one with a slash (a/b, or a%2Fb decoded) is
         * an invalid name (400) rather than an unknown path. */
        handle_set(req, req->path + prefix, resp);
        return;
    }
    if (allow == NULL) {
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL,
                  "There is no endpoint %.200s; see GET /v1/info and the API description.",
                  req->path);
        api_respond_error(resp, &err);
        return;
    }
    int is_get = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD");
    if (!strcmp(req->method, "OPTIONS")) {
        respond_static(resp, 204, "");
        return;
    }
    int is_set_method = is_get || !strcmp(req->method, "PUT") || !strcmp(req->method, "DELETE");
    if ((allow == ALLOW_GET && !is_get) || (allow == ALLOW_POST && strcmp(req->method, "POST")) ||
        (allow == ALLOW_SET && !is_set_method)) {
        error_set(&err, ERR_METHOD, "method_not_allowed", NULL,
                  "%.20s is not allowed on %.200s; use %s.", req->method, req->path, allow);
        api_respond_error(resp, &err);
        return;
    }
    int draining = atomic_load(&api_draining);
    switch (resp->route) {
    case ROUTE_HEALTHZ:
        respond_static(resp, 200, "{\"status\":\"ok\"}\n");
        return;
    case ROUTE_READYZ:
        if (draining) {
            resp->retry_after = 5;
            error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
                      "The server is shutting down and takes no new work.");
            api_respond_error(resp, &err);
        } else {
            respond_static(resp, 200, "{\"status\":\"ready\"}\n");
        }
        return;
    case ROUTE_INFO:
        handle_info(resp);
        return;
    case ROUTE_METRICS:
        resp->body = metrics_render(&resp->body_len);
        if (resp->body == NULL) {
            error_nomem(&err);
            api_respond_error(resp, &err);
            return;
        }
        resp->status = 200;
        resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
        return;
    case ROUTE_WEIGHT_SETS:
        handle_set_list(resp);
        return;
    case ROUTE_WEIGHT_SET:
        if (draining && strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
            resp->retry_after = 5;
            error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
                      "The server is shutting down and takes no new writes.");
            api_respond_error(resp, &err);
            return;
        }
        handle_set(req, req->path + strlen(SET_PREFIX), resp);
        return;
    case ROUTE_V2: {
        v2_env env = {api_cfg, api_store, draining};
        v2_handle_get(req, &env, resp);
        return;
    }
    case ROUTE_ATTENTION:
    case ROUTE_V2_INFER:
        break;
    default:
        error_set(&err, ERR_INTERNAL, "internal", NULL, "Route without a handler.");
        api_respond_error(resp, &err);
        return;
    }
    if (draining) {
        resp->retry_after = 5;
        error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
                  "The server is shutting down and takes no new work; retry on another instance.");
        api_respond_error(resp, &err);
        return;
    }
    long running = atomic_fetch_add(&api_computing, 1);
    if (running >= api_cfg->max_inflight) {
        atomic_fetch_sub(&api_computing, 1);
        error_set(&err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "The server is already computing %ld requests (--max-inflight); retry shortly.",
                  running);
        api_respond_error(resp, &err);
        return;
    }
    if (resp->route == ROUTE_V2_INFER) {
        v2_env env = {api_cfg, api_store, draining};
        v2_handle_infer(req, &env, resp);
    } else {
        handle_attention(req, resp);
    }
    atomic_fetch_sub(&api_computing, 1);
}

void api_response_free(api_response *resp)
{
    if (resp == NULL)
        return;
    if (!resp->body_static)
        mem_free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
    resp->body_static = 0;
}

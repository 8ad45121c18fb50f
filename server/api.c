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
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "admission.h"
#include "attention_json.h"
#include "compute.h"
#include "json_in.h"
#include "jsonw.h"
#include "mem.h"
#include "store.h"
#include "v2.h"
#include "version.h"
#include "viz.h"
#include "weights.h"
#include "weights_json.h"

/* Bytes a number takes in the response at most ("-1.2345678901234567e-300,"). */
#define RESPONSE_BYTES_PER_NUMBER 26

static const server_config *api_cfg;
static weight_store *api_store;
static atomic_int api_draining;
static atomic_long api_computing;        /* on workers: at most --max-inflight */
static atomic_long api_computing_io;     /* on I/O threads: at most one per thread */

static const char *const ALLOW_GET = "GET, HEAD, OPTIONS";
static const char *const ALLOW_POST = "POST, OPTIONS";
static const char *const ALLOW_SET = "GET, HEAD, PUT, DELETE, OPTIONS";
static const char *const SET_PREFIX = "/v1/weight-sets/";
static const char *const VIZ_PREFIX = "/viz/";

int api_init(const server_config *cfg, attn_error *err)
{
    /* A damaged file is quarantined when it is still damaged three sync
     * intervals later: a version another replica is renaming into place
     * loads well long before that. */
    store_limits limits = {cfg->max_set_bytes, cfg->max_store_bytes, cfg->store_temp_max_age,
                           3 * cfg->store_sync_interval};
    api_store = store_open(cfg->data_dir, &limits, err);
    if (api_store == NULL)
        return err->kind ? err->kind : ERR_INTERNAL;
    if (store_sync_start(api_store, cfg->store_sync_interval, err) != 0) {
        store_close(api_store);
        api_store = NULL;
        return err->kind;
    }
    api_cfg = cfg;
    atomic_store(&api_draining, 0);
    atomic_store(&api_computing, 0);
    atomic_store(&api_computing_io, 0);
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
    return atomic_load(&api_computing) + atomic_load(&api_computing_io);
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
    /* The visualizer's page and files: counted as "other" in /metrics. */
    if (!strcmp(path, "/") || !strcmp(path, "/viz") ||
        strncmp(path, VIZ_PREFIX, strlen(VIZ_PREFIX)) == 0) {
        *allow = ALLOW_GET;
        return ROUTE_OTHER;
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


/* Parses an If-Match value: "*", or one quoted or bare generation (a list
 * of several is taken as its first entry).  Returns the generation, 0 for
 * "*" (any), or -1 when it is not one. */
static long long if_match_generation(const char *value)
{
    while (*value == ' ' || *value == '\t')
        value++;
    if (value[0] == '*')
        return 0;
    if (value[0] == 'W' && value[1] == '/')
        value += 2;
    if (*value == '"')
        value++;
    char *end;
    long long g = strtoll(value, &end, 10);
    if (end == value || g < 1)
        return -1;
    return g;
}

/* Gets the set named name at generation want (0: any): when this replica's
 * copy is not that generation it rescans the shared directory at once.
 * Returns a reference (caller releases), or NULL with err filled: 404 when
 * there is no such set, 503 with *retry_after when this replica has not
 * caught up with a newer write, 412 when the set has moved past want. */
static weight_set *get_generation(const char *name, uint64_t want, const char *field,
                                  int *retry_after, attn_error *err)
{
    weight_set *set = store_get(api_store, name);
    if (want == 0 && set != NULL)
        return set;
    if (set == NULL || set->generation != want) {
        attn_error sync_err;
        error_clear(&sync_err);
        weightset_release(set);
        store_sync(api_store, &sync_err);
        set = store_get(api_store, name);
    }
    if (set != NULL && (want == 0 || set->generation == want))
        return set;
    if (set != NULL && set->generation > want) {
        error_set(err, ERR_PRECONDITION, "generation_mismatch", field,
                  "The weight set \"%s\" is at generation %llu, past %llu: it was replaced since.",
                  name, (unsigned long long)set->generation, (unsigned long long)want);
    } else if (want != 0) {
        *retry_after = 1;
        error_set(err, ERR_UNAVAILABLE, "generation_not_here_yet", field,
                  "This replica does not yet have generation %llu of the weight set \"%s\"; "
                  "retry shortly.", (unsigned long long)want, name);
    } else {
        error_set(err, ERR_NOT_FOUND, "unknown_weight_set", field,
                  "There is no stored weight set named \"%s\".", name);
    }
    weightset_release(set);
    return NULL;
}

/* Sets the ETag of resp to the generation of set. */
static void set_etag(api_response *resp, const weight_set *set)
{
    snprintf(resp->etag, sizeof resp->etag, "\"%llu\"", (unsigned long long)set->generation);
}

/* Decodes, checks limits, computes and encodes one attention request. */
static void handle_attention(const api_request *req, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    /* The tree lives only until its numbers are decoded: it is made in the arena. */
    mem_json_arena_begin();
    json_t *root = json_in_parse(req->body, req->body_len, attention_json_tensor_field, &err);
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
        if (ar.weights_generation != 0 && req->io_thread) {
            /* Another generation would mean rescanning the directory: not on
             * an I/O thread. */
            set = store_get(api_store, ar.weights_name);
            if (set == NULL || set->generation != ar.weights_generation)
                goto defer;
        } else if (ar.weights_generation != 0) {
            set = get_generation(ar.weights_name, ar.weights_generation, "weights_generation",
                                 &resp->retry_after, &err);
            if (set == NULL)
                goto fail;
        } else {
            set = store_get(api_store, ar.weights_name);
        }
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
    size_t reserved_bytes = 0;
    if (req->io_thread && admission_io_thread_fits(&ar.job, result_elements) != 0)
        goto defer;
    if (admission_admit(api_cfg, &ar.job, result_elements, RESPONSE_BYTES_PER_NUMBER,
                      "set return_attention to false", &response_bytes, &reserved_bytes, &err) != 0)
        goto fail;
    attn_result result;
    double start = now_seconds();
    rc = admission_run(&ar.job, req->io_thread, &result, &err);
    double ms = (now_seconds() - start) * 1000.0;
    if (rc != 0) {
        admission_release(reserved_bytes);
        if (rc == ADMISSION_DEFER)
            goto defer;
        goto fail;
    }
    jw_buf w;
    jw_init(&w, response_bytes / 2 + 512);
    attention_json_encode(&ar, &result, ms, &w);
    attention_result_free(&result);
    admission_release(reserved_bytes);
    attention_json_free(&ar);
    weightset_release(set);
    respond_jw(resp, 200, &w);
    return;
fail:
    attention_json_free(&ar);
    weightset_release(set);
    api_respond_error(resp, &err);
    return;
defer:
    attention_json_free(&ar);
    weightset_release(set);
    resp->deferred = 1;
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
                  "\"%.80s\" is not a valid weight-set name: use 1 to 64 of A-Z a-z 0-9 . _ - "
                  "(but not \".\" or \"..\").",
                  name);
        api_respond_error(resp, &err);
        return;
    }
    long long want = 0;
    if (req->if_match != NULL && (want = if_match_generation(req->if_match)) < 0) {
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "If-Match",
                  "If-Match must be * or the ETag a PUT or GET of the set answered, such as "
                  "\"1700000000000000\".");
        api_respond_error(resp, &err);
        return;
    }
    /* The precondition holds on this replica's view, fresh from the shared
     * directory when it does not match at first; GET answers the very set it
     * was checked on. */
    weight_set *checked = NULL;
    if (req->if_match != NULL && strcmp(req->method, "PUT") != 0) {
        checked = get_generation(name, (uint64_t)want, NULL, &resp->retry_after, &err);
        if (checked == NULL) {
            api_respond_error(resp, &err);
            return;
        }
    }
    if (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD")) {
        weight_set *set = checked != NULL ? checked : store_get(api_store, name);
        if (set == NULL) {
            error_set(&err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                      "There is no stored weight set named \"%s\".", name);
            api_respond_error(resp, &err);
            return;
        }
        jw_buf w;
        jw_init(&w, set->size_bytes * 3 + 1024);
        weights_json_encode_set(set, 1, &w);
        set_etag(resp, set);
        weightset_release(set);
        respond_jw(resp, 200, &w);
        return;
    }
    weightset_release(checked);
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
    json_t *root = json_in_parse(req->body, req->body_len, weights_part_named, &err);
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
    set_etag(resp, set);
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

/* GET / (a redirect to the page), GET /viz (the page), GET /viz/NAME (its
 * files and the golden examples under /viz/examples/). */
static void handle_viz(const char *path, api_response *resp)
{
    attn_error err;
    if (!strcmp(path, "/")) {
        snprintf(resp->location, sizeof resp->location, "/viz");
        respond_static(resp, 302, "");
        return;
    }
    const char *name = !strcmp(path, "/viz") ? "" : path + strlen(VIZ_PREFIX);
    if (!strcmp(name, "examples/") || !strcmp(name, "examples")) {
        resp->body = viz_examples_json(&resp->body_len);
        if (resp->body == NULL) {
            error_nomem(&err);
            api_respond_error(resp, &err);
            return;
        }
        resp->status = 200;
        resp->content_type = "application/json";
        return;
    }
    const viz_asset *asset = viz_find(name);
    if (asset == NULL) {
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL,
                  "The visualizer has no file %.200s; the page is GET /viz.", path);
        api_respond_error(resp, &err);
        return;
    }
    resp->status = 200;
    resp->body = (char *)asset->data;
    resp->body_len = asset->size;
    resp->body_static = 1;
    resp->content_type = viz_content_type(asset->name);
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
    case ROUTE_READYZ: {
        store_status st;
        store_get_status(api_store, &st);
        if (draining) {
            resp->retry_after = 5;
            error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
                      "The server is shutting down and takes no new work.");
            api_respond_error(resp, &err);
        } else if (st.interval_ms > 0 &&
                   (st.last_ok_age_ms < 0 || st.last_ok_age_ms > 3LL * st.interval_ms)) {
            /* The shared weight-set directory has been unreadable for three
             * sync intervals: this replica may serve stale sets. */
            resp->retry_after = (int)(st.interval_ms / 1000) + 1;
            error_set(&err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                      "The weight-set directory %s has not been read for %lld ms (more than "
                      "three --store-sync-interval); sets written elsewhere may be missing here.",
                      api_cfg->data_dir, st.last_ok_age_ms);
            api_respond_error(resp, &err);
        } else {
            respond_static(resp, 200, "{\"status\":\"ready\"}\n");
        }
        return;
    }
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
    case ROUTE_OTHER:
        handle_viz(req->path, resp);
        return;
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
    /* --max-inflight counts the workers' requests; those of I/O threads are
     * bounded by the number of threads and never wait. */
    atomic_long *counter = req->io_thread ? &api_computing_io : &api_computing;
    long running = atomic_fetch_add(counter, 1);
    if (!req->io_thread && running >= api_cfg->max_inflight) {
        atomic_fetch_sub(counter, 1);
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
    atomic_fetch_sub(counter, 1);
}


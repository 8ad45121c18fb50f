/*
 * api.c - the router: from a request and its row of the route table to the
 * handler of its endpoint, independent of the HTTP library.
 *
 * Everything every route shares is decided here, in this order: OPTIONS, a
 * path with no endpoint (its handler answers, whatever the method), a method
 * the route does not allow (405 with Allow), what draining refuses (503
 * shutting_down), and for a computation one of the --max-inflight slots (503
 * overloaded when none is free).  The handlers are the modules above the
 * request: v1/ (v1.h), v2/ (v2.h) and viz/ (viz_page.h); the table below is
 * the only place that names them.  This file also keeps the state they are
 * given (api_env): the configuration, the weight-set store, the draining
 * flag.
 */
#include "api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "message/answer.h"
#include "route/route.h"
#include "store/store.h"
#include "v1/v1.h"
#include "v2/v2.h"
#include "viz/viz_page.h"

/* --store-sync-interval's default with --store-url. */
#define API_S3_SYNC_INTERVAL_MS 5000

static const server_config *api_cfg;
static weight_store *api_store;
static atomic_int api_draining;
static atomic_long api_computing;        /* on workers: at most --max-inflight */
static atomic_long api_computing_io;     /* on I/O threads: at most one per thread */

int api_init(const server_config *cfg, attn_error *err)
{
    /* A damaged file is quarantined when it is still damaged three sync
     * intervals later: a version another replica is renaming into place
     * loads well long before that. */
    int s3 = cfg->store_url[0] != '\0';
    /* An object store is listed by a request a sync: a slower default than a
     * directory's, which read-your-writes (weights_generation) does not wait for. */
    long interval = s3 && config_source(cfg, "store-sync-interval") == CONFIG_FROM_DEFAULT
                        ? API_S3_SYNC_INTERVAL_MS
                        : cfg->store_sync_interval;
    store_limits limits = {cfg->max_set_bytes, cfg->max_store_bytes, cfg->store_temp_max_age,
                           3 * interval};
    if (s3) {
        s3_config s3cfg = {0};
        if (s3_parse_url(cfg->store_url, &s3cfg, err) != 0)
            return err->kind;
        snprintf(s3cfg.endpoint, sizeof s3cfg.endpoint, "%s", cfg->s3_endpoint);
        snprintf(s3cfg.region, sizeof s3cfg.region, "%s", cfg->s3_region);
        snprintf(s3cfg.ca_file, sizeof s3cfg.ca_file, "%s", cfg->s3_ca_file);
        api_store = store_open_s3(&s3cfg, &limits, err);
    } else {
        api_store = store_open(cfg->data_dir, &limits, err);
    }
    if (api_store == NULL)
        return err->kind ? err->kind : ERR_INTERNAL;
    if (store_sync_start(api_store, interval, err) != 0) {
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

static void not_found(const api_request *req, const api_env *env, api_response *resp)
{
    (void)env;
    answer_not_found(resp, req->path);
}

/* The handler of each endpoint of the route table. */
static api_handler *const handlers[ENDPOINT_COUNT] = {
    [ENDPOINT_NOT_FOUND] = not_found,
    [ENDPOINT_V1_ATTENTION] = v1_attention_handle,
    [ENDPOINT_HEALTHZ] = v1_probe_healthz,
    [ENDPOINT_READYZ] = v1_probe_readyz,
    [ENDPOINT_V1_INFO] = v1_info_handle,
    [ENDPOINT_METRICS] = v1_metrics_handle,
    [ENDPOINT_V1_SETS] = v1_sets_list,
    [ENDPOINT_V1_SET] = v1_set_handle,
    [ENDPOINT_V1_SET_BELOW] = v1_set_below_handle,
    [ENDPOINT_VIZ] = viz_page_handle,
    [ENDPOINT_V2_SERVER] = v2_handle_server,
    [ENDPOINT_V2_LIVE] = v2_handle_live,
    [ENDPOINT_V2_READY] = v2_handle_ready,
    [ENDPOINT_V2_STATS_ALL] = v2_handle_stats,
    [ENDPOINT_V2_REPO_INDEX] = v2_handle_repository_index,
    [ENDPOINT_V2_REPO_CONTROL] = v2_handle_repository_control,
    [ENDPOINT_V2_MODEL] = v2_handle_model,
    [ENDPOINT_V2_MODEL_READY] = v2_handle_model_ready,
    [ENDPOINT_V2_CONFIG] = v2_handle_config,
    [ENDPOINT_V2_STATS] = v2_handle_stats,
    [ENDPOINT_V2_INFER] = v2_handle_infer,
};

api_handler *api_handler_of(route_endpoint endpoint)
{
    return endpoint < ENDPOINT_COUNT ? handlers[endpoint] : NULL;
}

/* 1 when a server that drains (draining) refuses method on r. */
static int drain_refuses(const route *r, const char *method, int draining)
{
    if (!draining)
        return 0;
    int read = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    return r->drain == ROUTE_DRAIN_REFUSE || (r->drain == ROUTE_DRAIN_READS && !read);
}

/* Runs the handler of a computation in one of its slots.  --max-inflight
 * counts the workers' computations; those of I/O threads are bounded by the
 * number of threads and never wait. */
static void compute_in_slot(api_handler *handle, const api_request *req, const api_env *env,
                            api_response *resp)
{
    atomic_long *counter = req->io_thread ? &api_computing_io : &api_computing;
    long running = atomic_fetch_add(counter, 1);
    if (!req->io_thread && running >= api_cfg->max_inflight) {
        atomic_fetch_sub(counter, 1);
        attn_error err;
        error_set(&err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "The server is already computing %ld requests (--max-inflight); retry shortly.",
                  running);
        answer_error(resp, &err);
        return;
    }
    handle(req, env, resp);
    atomic_fetch_sub(counter, 1);
}

void api_handle(const api_request *req, api_response *resp)
{
    memset(resp, 0, sizeof *resp);
    api_request found;
    route_args args;
    if (req->route == NULL) {
        found = *req;
        found.route = route_find(req->path, &args);
        found.args = &args;
        req = &found;
    }
    const route *r = req->route;
    api_handler *handle = handlers[r->endpoint];
    api_env env = {api_cfg, api_store, atomic_load(&api_draining)};
    resp->route = r->id;
    resp->allow = r->allow;
    if (!strcmp(req->method, "OPTIONS") && !strcmp(req->path, "*")) {
        resp->allow = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
        answer_static(resp, 204, "");
        return;
    }
    if (r->allow == NULL) {
        handle(req, &env, resp);        /* no endpoint: 404, or what its handler says */
        return;
    }
    if (!strcmp(req->method, "OPTIONS")) {
        answer_static(resp, 204, "");
        return;
    }
    if (!route_allows(r, req->method)) {
        attn_error err;
        error_set(&err, ERR_METHOD, "method_not_allowed", NULL,
                  "%.20s is not allowed on %.200s; use %s.", req->method, req->path, r->allow);
        answer_error(resp, &err);
        return;
    }
    if (drain_refuses(r, req->method, env.draining)) {
        answer_draining(resp);
        return;
    }
    if (r->cost == ROUTE_INLINE)
        compute_in_slot(handle, req, &env, resp);
    else
        handle(req, &env, resp);
}

/*
 * api.c - the router: from a request and its row of the route table to the
 * handler of its resource, independent of the HTTP library.
 *
 * Everything every route shares is decided here, in this order: OPTIONS, an
 * unknown path (404), a method the route does not allow (405 with Allow),
 * what draining refuses (503 shutting_down), and for a computation one of
 * the --max-inflight slots (503 overloaded when none is free).  The handlers
 * live in one file per resource: api_attention.c, api_sets.c, api_info.c
 * (info and probes), api_viz.c, api_v2.c.  This file also keeps the state
 * they share: the configuration, the weight-set store, the draining flag.
 */
#include "api.h"

#include <stdatomic.h>
#include <string.h>

#include "message/answer.h"
#include "api_private.h"
#include "route/route.h"
#include "store/store.h"

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

const server_config *api_config(void)
{
    return api_cfg;
}

weight_store *api_weight_store(void)
{
    return api_store;
}

int api_is_draining(void)
{
    return atomic_load(&api_draining);
}

void api_not_found(const api_request *req, api_response *resp)
{
    if (api_sets_put_bad_name(req, resp))
        return;
    attn_error err;
    error_set(&err, ERR_NOT_FOUND, "not_found", NULL,
              "There is no endpoint %.200s; see GET /v1/info and the API description.",
              req->path);
    answer_error(resp, &err);
}

/* 1 when draining refuses method on r. */
static int drain_refuses(const route *r, const char *method)
{
    if (!api_is_draining())
        return 0;
    int read = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    return r->drain == ROUTE_DRAIN_REFUSE || (r->drain == ROUTE_DRAIN_READS && !read);
}

/* Runs the handler of a computation in one of its slots.  --max-inflight
 * counts the workers' computations; those of I/O threads are bounded by the
 * number of threads and never wait. */
static void compute_in_slot(const route *r, const api_request *req, api_response *resp)
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
    r->handle(req, resp);
    atomic_fetch_sub(counter, 1);
}

void api_handle(const api_request *req, api_response *resp)
{
    memset(resp, 0, sizeof *resp);
    const route *r = req->route != NULL ? req->route : route_find(req->path);
    resp->route = r->id;
    resp->allow = r->allow;
    if (!strcmp(req->method, "OPTIONS") && !strcmp(req->path, "*")) {
        resp->allow = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
        answer_static(resp, 204, "");
        return;
    }
    if (r->allow == NULL) {
        r->handle(req, resp);           /* the unknown path */
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
    if (drain_refuses(r, req->method)) {
        answer_draining(resp);
        return;
    }
    if (r->cost == ROUTE_INLINE)
        compute_in_slot(r, req, resp);
    else
        r->handle(req, resp);
}

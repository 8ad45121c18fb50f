/*
 * test_route.c - the route table: every route once, paths to rows and what
 * they capture, methods, the thread that answers them, how a body is read,
 * and a handler in the router for every endpoint.
 */
#include <stdio.h>
#include <string.h>

#include "route/route.h"
#include "router/api.h"
#include "test.h"

/* Every id has a row, and the rows of one id agree on its label and its
 * error form (metrics and error bodies read them by id). */
void test_route_table_rows(void)
{
    static const char *const samples[] = {
        "/v1/attention", "/healthz", "/readyz", "/v1/info", "/metrics", "/v1/weight-sets",
        "/v1/weight-sets/a", "/", "/viz", "/viz/app.js", "/v2", "/v2/", "/v2/health/live",
        "/v2/health/ready", "/v2/models/attention", "/v2/models/m/versions/1/ready",
        "/v2/models/m/config", "/v2/models/m/infer", "/v2/models/m/versions/1/infer", "/nowhere"};
    int seen[ROUTE_COUNT] = {0};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        const route *r = route_find(samples[i], NULL);
        ASSERT(r->id < ROUTE_COUNT);
        seen[r->id] = 1;
        ASSERT_STR_EQ(r->label, route_label(r->id));
        ASSERT_EQ(r->errors, route_error_form(r->id));
        ASSERT(api_handler_of(r->endpoint) != NULL);
    }
    for (int id = 0; id < ROUTE_COUNT; id++)
        ASSERT(seen[id]);
    ASSERT_STR_EQ(route_label(ROUTE_ATTENTION), "/v1/attention");
    ASSERT_STR_EQ(route_label(ROUTE_OTHER), "other");
    ASSERT_EQ(route_error_form(ROUTE_V2_INFER), ROUTE_ERRORS_V2);
    ASSERT_EQ(route_error_form(ROUTE_WEIGHT_SET), ROUTE_ERRORS_V1);
}

/* Paths to routes, with the edges of the patterns: one segment for a
 * weight-set name, any rest below /viz/, the v2 probes before v2 metadata. */
void test_route_find_paths(void)
{
    static const struct { const char *path; route_id id; int known, probe; } cases[] = {
        {"/v1/attention", ROUTE_ATTENTION, 1, 0},      {"/v1/attention/", ROUTE_OTHER, 0, 0},
        {"/healthz", ROUTE_HEALTHZ, 1, 1},             {"/healthzz", ROUTE_OTHER, 0, 0},
        {"/readyz", ROUTE_READYZ, 1, 1},               {"/v1/weight-sets", ROUTE_WEIGHT_SETS, 1, 0},
        {"/v1/weight-sets/x.y-z", ROUTE_WEIGHT_SET, 1, 0},
        {"/v1/weight-sets/", ROUTE_OTHER, 0, 0},       {"/v1/weight-sets/a/b", ROUTE_OTHER, 0, 0},
        {"/v1/weight-sets//a", ROUTE_OTHER, 0, 0},     {"/viz/", ROUTE_OTHER, 1, 0},
        {"/viz/examples/x.json", ROUTE_OTHER, 1, 0},   {"/vizz", ROUTE_OTHER, 0, 0},
        {"/v2/health/live", ROUTE_V2, 1, 1},           {"/v2/health/ready", ROUTE_V2, 1, 1},
        {"/v2", ROUTE_V2, 1, 0},                       {"/v2/models/a/ready", ROUTE_V2, 1, 0},
        {"/v2/models/a/infer", ROUTE_V2_INFER, 1, 0},  {"/v2/models/a/other", ROUTE_OTHER, 0, 0},
        {"/v2/models/stats", ROUTE_V2, 1, 0},          {"/v2/models/a/stats", ROUTE_V2, 1, 0},
        {"/v2/models/a/versions/1/stats", ROUTE_V2, 1, 0},
        {"/v2/repository/index", ROUTE_V2, 1, 0},
        {"/v2/repository/models/a/load", ROUTE_V2, 1, 0},
        {"/v2/repository/models/a/unload", ROUTE_V2, 1, 0},
        {"/v2/repository/models/a/reload", ROUTE_OTHER, 0, 0},
        {"/v2/repository/models//load", ROUTE_OTHER, 0, 0},
        {"", ROUTE_OTHER, 0, 0},                       {"*", ROUTE_OTHER, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const route *r = route_find(cases[i].path, NULL);
        if (r->id != cases[i].id || (r->allow != NULL) != cases[i].known ||
            r->probe != cases[i].probe)
            FAIL_AT("%s: route %d, known %d, probe %d", cases[i].path, (int)r->id,
                    r->allow != NULL, r->probe);
    }
}

/* The methods a route allows, and which thread answers a method on it. */
void test_route_methods_and_cost(void)
{
    const route *attention = route_find("/v1/attention", NULL);
    const route *set = route_find("/v1/weight-sets/a", NULL);
    const route *info = route_find("/v1/info", NULL);
    const route *unknown = route_find("/nowhere", NULL);
    ASSERT(route_allows(attention, "POST"));
    ASSERT(!route_allows(attention, "GET"));
    ASSERT(!route_allows(attention, "POS"));
    ASSERT(route_allows(info, "HEAD"));
    ASSERT(!route_allows(info, "EAD"));
    ASSERT(route_allows(set, "DELETE"));
    ASSERT(!route_allows(unknown, "GET"));
    ASSERT_EQ(route_request_cost(attention, "POST"), ROUTE_INLINE);
    ASSERT_EQ(route_request_cost(attention, "GET"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(attention, "OPTIONS"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(route_find("/v2/models/m/infer", NULL), "POST"), ROUTE_INLINE);
    ASSERT_EQ(route_request_cost(set, "GET"), ROUTE_WORKER);
    ASSERT_EQ(route_request_cost(set, "PUT"), ROUTE_WORKER);
    ASSERT_EQ(route_request_cost(info, "GET"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(unknown, "POST"), ROUTE_CHEAP);
    /* Statistics are read with GET, the repository's routes are POSTs; all
     * are answered on the I/O thread. */
    const route *stats = route_find("/v2/models/stats", NULL);
    const route *index = route_find("/v2/repository/index", NULL);
    const route *load = route_find("/v2/repository/models/a/load", NULL);
    ASSERT(route_allows(stats, "GET"));
    ASSERT(!route_allows(stats, "POST"));
    ASSERT(route_allows(route_find("/v2/models/a/stats", NULL), "GET"));
    ASSERT(route_allows(index, "POST"));
    ASSERT(!route_allows(index, "GET"));
    ASSERT(route_allows(load, "POST"));
    ASSERT_EQ(route_request_cost(index, "POST"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(load, "POST"), ROUTE_CHEAP);
    ASSERT_EQ(index->drain, ROUTE_DRAIN_SERVE);
    ASSERT_EQ(load->drain, ROUTE_DRAIN_REFUSE);
}

/* Every endpoint has its handler in the router's table, and only endpoints
 * do. */
void test_route_every_endpoint_handled(void)
{
    for (int e = 0; e < ENDPOINT_COUNT; e++)
        if (api_handler_of((route_endpoint)e) == NULL)
            FAIL_AT("endpoint %d has no handler", e);
    ASSERT(api_handler_of(ENDPOINT_COUNT) == NULL);
}

/* What a path's placeholders capture, the endpoint it is, and the segment
 * lengths past which a model or a version matches no row. */
void test_route_captures(void)
{
    route_args args;
    const route *r = route_find("/v2/models/m.1/versions/7/infer", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_INFER);
    ASSERT_STR_EQ(args.model, "m.1");
    ASSERT_STR_EQ(args.version, "7");
    r = route_find("/v2/models/attention/config", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_CONFIG);
    ASSERT_STR_EQ(args.model, "attention");
    ASSERT_STR_EQ(args.version, "");
    r = route_find("/v2/models/stats", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_STATS_ALL);
    ASSERT_STR_EQ(args.model, "");
    r = route_find("/v2/models/stats/stats", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_STATS);
    ASSERT_STR_EQ(args.model, "stats");
    r = route_find("/v2/repository/models/s/unload", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_REPO_CONTROL);
    ASSERT_STR_EQ(args.model, "s");
    ASSERT_EQ(route_find("/v2/", NULL)->endpoint, ENDPOINT_V2_SERVER);
    ASSERT_EQ(route_find("/v2/models/m/versions/1", NULL)->endpoint, ENDPOINT_V2_MODEL);
    /* A weight-set name is a segment captured for the handler. */
    r = route_find("/v1/weight-sets/s", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V1_SET);
    ASSERT_STR_EQ(args.model, "");
    ASSERT_STR_EQ(args.name, "s");
    /* Below a set: no endpoint (answered whatever the method, by its handler),
     * the rest of the path captured as the name a PUT there would give. */
    r = route_find("/v1/weight-sets/a/b", &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V1_SET_BELOW);
    ASSERT(r->allow == NULL);
    ASSERT_STR_EQ(args.name, "a/b");
    ASSERT_EQ(route_find("/v1/weight-sets//a", &args)->endpoint, ENDPOINT_V1_SET_BELOW);
    ASSERT_STR_EQ(args.name, "/a");
    ASSERT_EQ(route_find("/v1/weight-sets/", &args)->endpoint, ENDPOINT_V1_SET_BELOW);
    ASSERT_STR_EQ(args.name, "");
    route_find("/v2/models/m/ready", &args);
    ASSERT_STR_EQ(args.name, "");
    ASSERT_EQ(route_find("/nowhere", NULL)->endpoint, ENDPOINT_NOT_FOUND);
    char path[300];
    char name[ROUTE_MODEL_MAX + 1];
    memset(name, 'm', sizeof name - 1);
    name[ROUTE_MODEL_MAX - 1] = '\0';                 /* the longest that fits */
    snprintf(path, sizeof path, "/v2/models/%s/ready", name);
    r = route_find(path, &args);
    ASSERT_EQ(r->endpoint, ENDPOINT_V2_MODEL_READY);
    ASSERT_EQ(strlen(args.model), (size_t)ROUTE_MODEL_MAX - 1);
    name[ROUTE_MODEL_MAX - 1] = 'm';                  /* one more */
    name[ROUTE_MODEL_MAX] = '\0';
    snprintf(path, sizeof path, "/v2/models/%s/ready", name);
    ASSERT_EQ(route_find(path, &args)->endpoint, ENDPOINT_NOT_FOUND);
    ASSERT_STR_EQ(args.model, "");
    char version[ROUTE_VERSION_MAX + 1];
    memset(version, '1', sizeof version - 1);
    version[ROUTE_VERSION_MAX] = '\0';
    snprintf(path, sizeof path, "/v2/models/m/versions/%s/infer", version);
    ASSERT_EQ(route_find(path, NULL)->endpoint, ENDPOINT_NOT_FOUND);
}

/* How each route's body is read: the body column the HTTP layer places
 * bodies by. */
void test_route_body_placement(void)
{
    ASSERT_EQ(route_find("/v1/attention", NULL)->body, ROUTE_BODY_JSON);
    ASSERT_EQ(route_find("/v1/weight-sets/s", NULL)->body, ROUTE_BODY_SET);
    ASSERT_EQ(route_find("/v1/weight-sets/a/b", NULL)->body, ROUTE_BODY_SET);
    ASSERT_EQ(route_find("/v2/models/m/infer", NULL)->body, ROUTE_BODY_V2);
    ASSERT_EQ(route_find("/v2/models/m/versions/1/infer", NULL)->body, ROUTE_BODY_V2);
    ASSERT_EQ(route_find("/v2/repository/index", NULL)->body, ROUTE_BODY_JSON);
    ASSERT_EQ(route_find("/nowhere", NULL)->body, ROUTE_BODY_JSON);
}

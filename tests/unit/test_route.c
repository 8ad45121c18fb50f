/*
 * test_route.c - the route table: every route once, paths to rows, methods
 * and the thread that answers them.
 */
#include <string.h>

#include "route/route.h"
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
        const route *r = route_find(samples[i]);
        ASSERT(r->id < ROUTE_COUNT);
        seen[r->id] = 1;
        ASSERT_STR_EQ(r->label, route_label(r->id));
        ASSERT_EQ(r->errors, route_error_form(r->id));
        ASSERT(r->handle != NULL);
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
        const route *r = route_find(cases[i].path);
        if (r->id != cases[i].id || (r->allow != NULL) != cases[i].known ||
            r->probe != cases[i].probe)
            FAIL_AT("%s: route %d, known %d, probe %d", cases[i].path, (int)r->id,
                    r->allow != NULL, r->probe);
    }
}

/* The methods a route allows, and which thread answers a method on it. */
void test_route_methods_and_cost(void)
{
    const route *attention = route_find("/v1/attention");
    const route *set = route_find("/v1/weight-sets/a");
    const route *info = route_find("/v1/info");
    const route *unknown = route_find("/nowhere");
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
    ASSERT_EQ(route_request_cost(route_find("/v2/models/m/infer"), "POST"), ROUTE_INLINE);
    ASSERT_EQ(route_request_cost(set, "GET"), ROUTE_WORKER);
    ASSERT_EQ(route_request_cost(set, "PUT"), ROUTE_WORKER);
    ASSERT_EQ(route_request_cost(info, "GET"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(unknown, "POST"), ROUTE_CHEAP);
    /* Statistics are read with GET, the repository's routes are POSTs; all
     * are answered on the I/O thread. */
    const route *stats = route_find("/v2/models/stats");
    const route *index = route_find("/v2/repository/index");
    const route *load = route_find("/v2/repository/models/a/load");
    ASSERT(route_allows(stats, "GET"));
    ASSERT(!route_allows(stats, "POST"));
    ASSERT(route_allows(route_find("/v2/models/a/stats"), "GET"));
    ASSERT(route_allows(index, "POST"));
    ASSERT(!route_allows(index, "GET"));
    ASSERT(route_allows(load, "POST"));
    ASSERT_EQ(route_request_cost(index, "POST"), ROUTE_CHEAP);
    ASSERT_EQ(route_request_cost(load, "POST"), ROUTE_CHEAP);
    ASSERT_EQ(index->drain, ROUTE_DRAIN_SERVE);
    ASSERT_EQ(load->drain, ROUTE_DRAIN_REFUSE);
}

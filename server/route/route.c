/*
 * route.c - the route table and the matching of a path against it.
 *
 * The rows are tried in order and the first that matches wins, so a
 * specific path comes before a pattern that would also match it (the v2
 * health probes before the v2 metadata routes).  The v2 model paths are
 * matched by v2_route, which owns their grammar (model and version names).
 */
#include "route.h"

#include <string.h>

#include "router/api_private.h"
#include "v2/v2.h"

static const char ALLOW_GET[] = "GET, HEAD, OPTIONS";
static const char ALLOW_POST[] = "POST, OPTIONS";
static const char ALLOW_SET[] = "GET, HEAD, PUT, DELETE, OPTIONS";

static int v2_metadata_path(const char *path)
{
    int infer;
    return v2_route(path, &infer) && !infer;
}

static int v2_infer_path(const char *path)
{
    int infer;
    return v2_route(path, &infer) && infer;
}

#define V1 ROUTE_ERRORS_V1
#define V2 ROUTE_ERRORS_V2

static const route routes[] = {
    /* pattern, match, id, allow, handler, cost, drain, probe, errors, label */
    {"/v1/attention", NULL, ROUTE_ATTENTION, ALLOW_POST, api_attention_handle, ROUTE_INLINE,
     ROUTE_DRAIN_REFUSE, 0, V1, "/v1/attention"},
    {"/healthz", NULL, ROUTE_HEALTHZ, ALLOW_GET, api_probe_healthz, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 1, V1, "/healthz"},
    {"/readyz", NULL, ROUTE_READYZ, ALLOW_GET, api_probe_readyz, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 1, V1, "/readyz"},
    {"/v1/info", NULL, ROUTE_INFO, ALLOW_GET, api_info_handle, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, V1, "/v1/info"},
    {"/metrics", NULL, ROUTE_METRICS, ALLOW_GET, api_metrics_handle, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, V1, "/metrics"},
    {"/v1/weight-sets", NULL, ROUTE_WEIGHT_SETS, ALLOW_GET, api_sets_list, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, V1, "/v1/weight-sets"},
    /* One segment: a path with more below it is no endpoint (see api_not_found). */
    {"/v1/weight-sets/{}", NULL, ROUTE_WEIGHT_SET, ALLOW_SET, api_set_handle, ROUTE_WORKER,
     ROUTE_DRAIN_READS, 0, V1, "/v1/weight-sets/{name}"},
    /* The visualizer's page and files. */
    {"/", NULL, ROUTE_OTHER, ALLOW_GET, api_viz_handle, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, V1,
     "other"},
    {"/viz", NULL, ROUTE_OTHER, ALLOW_GET, api_viz_handle, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, V1,
     "other"},
    {"/viz/*", NULL, ROUTE_OTHER, ALLOW_GET, api_viz_handle, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0,
     V1, "other"},
    /* Triton's statistics (per model: the v2 model rows below) and model
     * repository; loading and unloading answer an error, whatever the model. */
    {"/v2/models/stats", NULL, ROUTE_V2, ALLOW_GET, api_v2_get, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0,
     V2, "/v2"},
    {"/v2/repository/index", NULL, ROUTE_V2, ALLOW_POST, api_v2_repository, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, V2, "/v2"},
    {"/v2/repository/models/{}/load", NULL, ROUTE_V2, ALLOW_POST, api_v2_repository, ROUTE_CHEAP,
     ROUTE_DRAIN_REFUSE, 0, V2, "/v2"},
    {"/v2/repository/models/{}/unload", NULL, ROUTE_V2, ALLOW_POST, api_v2_repository,
     ROUTE_CHEAP, ROUTE_DRAIN_REFUSE, 0, V2, "/v2"},
    {"/v2/health/live", NULL, ROUTE_V2, ALLOW_GET, api_v2_get, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 1,
     V2, "/v2"},
    {"/v2/health/ready", NULL, ROUTE_V2, ALLOW_GET, api_v2_get, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 1,
     V2, "/v2"},
    {NULL, v2_metadata_path, ROUTE_V2, ALLOW_GET, api_v2_get, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0,
     V2, "/v2"},
    {NULL, v2_infer_path, ROUTE_V2_INFER, ALLOW_POST, api_v2_infer, ROUTE_INLINE,
     ROUTE_DRAIN_REFUSE, 0, V2, "/v2/models/{model}/infer"},
};

/* Every path no row matches. */
static const route unknown = {NULL, NULL, ROUTE_OTHER, NULL, api_not_found, ROUTE_CHEAP,
                              ROUTE_DRAIN_SERVE, 0, V1, "other"};

/* 1 when path matches pattern: "{}" takes one non-empty segment, a final "*"
 * any rest, every other byte itself. */
static int pattern_matches(const char *pattern, const char *path)
{
    while (*pattern != '\0') {
        if (pattern[0] == '*' && pattern[1] == '\0')
            return 1;
        if (pattern[0] == '{' && pattern[1] == '}') {
            size_t n = strcspn(path, "/");
            if (n == 0)
                return 0;
            pattern += 2;
            path += n;
            continue;
        }
        if (*pattern++ != *path++)
            return 0;
    }
    return *path == '\0';
}

const route *route_find(const char *path)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const route *r = &routes[i];
        if (r->pattern != NULL ? pattern_matches(r->pattern, path) : r->match(path))
            return r;
    }
    return &unknown;
}

int route_allows(const route *r, const char *method)
{
    if (r->allow == NULL)
        return 0;
    size_t n = strlen(method);
    for (const char *p = r->allow; (p = strstr(p, method)) != NULL; p += n)
        if ((p == r->allow || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

route_cost route_request_cost(const route *r, const char *method)
{
    if (!strcmp(method, "OPTIONS") || !route_allows(r, method))
        return ROUTE_CHEAP;
    return r->cost;
}

/* The first row of id (each id has one; the unit tests check it). */
static const route *row_of(route_id id)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (routes[i].id == id)
            return &routes[i];
    return &unknown;
}

const char *route_label(route_id id)
{
    return row_of(id)->label;
}

route_errors route_error_form(route_id id)
{
    return row_of(id)->errors;
}

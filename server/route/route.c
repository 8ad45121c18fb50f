/*
 * route.c - the route table and the matching of a path against it.
 *
 * The rows are tried in order and the first that matches wins, so a
 * specific path comes before a pattern that would also match it
 * (/v2/models/stats before /v2/models/{model}).  The table holds every
 * route's grammar, v2's model and version names and weight-set names
 * included: the handlers get what a path captured and never parse it.
 */
#include "route.h"

#include <string.h>

static const char ALLOW_GET[] = "GET, HEAD, OPTIONS";
static const char ALLOW_POST[] = "POST, OPTIONS";
static const char ALLOW_SET[] = "GET, HEAD, PUT, DELETE, OPTIONS";

#define V1 ROUTE_ERRORS_V1
#define V2 ROUTE_ERRORS_V2
#define JSON ROUTE_BODY_JSON

/* The five routes of one v2 model, at any version or at the one given. */
#define V2_MODEL_ROWS(prefix)                                                                  \
    {prefix, ENDPOINT_V2_MODEL, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON,  \
     V2, "/v2"},                                                                               \
    {prefix "/ready", ENDPOINT_V2_MODEL_READY, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP,              \
     ROUTE_DRAIN_SERVE, 0, JSON, V2, "/v2"},                                                   \
    {prefix "/config", ENDPOINT_V2_CONFIG, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, \
     0, JSON, V2, "/v2"},                                                                      \
    {prefix "/stats", ENDPOINT_V2_STATS, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE,  \
     0, JSON, V2, "/v2"},                                                                      \
    {prefix "/infer", ENDPOINT_V2_INFER, ROUTE_V2_INFER, ALLOW_POST, ROUTE_INLINE,             \
     ROUTE_DRAIN_SEQUENCES, 0, ROUTE_BODY_V2, V2, "/v2/models/{model}/infer"}

static const route routes[] = {
    /* pattern, endpoint, id, allow, cost, drain, probe, body, errors, label */
    {"/v1/attention", ENDPOINT_V1_ATTENTION, ROUTE_ATTENTION, ALLOW_POST, ROUTE_INLINE,
     ROUTE_DRAIN_SEQUENCES, 0, JSON, V1, "/v1/attention"},
    {"/healthz", ENDPOINT_HEALTHZ, ROUTE_HEALTHZ, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 1,
     JSON, V1, "/healthz"},
    {"/readyz", ENDPOINT_READYZ, ROUTE_READYZ, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 1,
     JSON, V1, "/readyz"},
    {"/v1/info", ENDPOINT_V1_INFO, ROUTE_INFO, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0,
     JSON, V1, "/v1/info"},
    {"/metrics", ENDPOINT_METRICS, ROUTE_METRICS, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0,
     JSON, V1, "/metrics"},
    {"/v1/weight-sets", ENDPOINT_V1_SETS, ROUTE_WEIGHT_SETS, ALLOW_GET, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, JSON, V1, "/v1/weight-sets"},
    {"/v1/weight-sets/{name}", ENDPOINT_V1_SET, ROUTE_WEIGHT_SET, ALLOW_SET, ROUTE_WORKER,
     ROUTE_DRAIN_READS, 0, ROUTE_BODY_SET, V1, "/v1/weight-sets/{name}"},
    /* No endpoint (a path below a set is none), but a PUT there chose a name
     * with a slash, which its handler refuses as a name: the rest is that name. */
    {"/v1/weight-sets/{name*}", ENDPOINT_V1_SET_BELOW, ROUTE_OTHER, NULL, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, ROUTE_BODY_SET, V1, "other"},
    /* The visualizer's page and files. */
    {"/", ENDPOINT_VIZ, ROUTE_OTHER, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON, V1,
     "other"},
    {"/viz", ENDPOINT_VIZ, ROUTE_OTHER, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON, V1,
     "other"},
    {"/viz/*", ENDPOINT_VIZ, ROUTE_OTHER, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON, V1,
     "other"},
    /* The Open Inference Protocol, with Triton's statistics and model
     * repository; loading and unloading answer an error, whatever the model. */
    {"/v2", ENDPOINT_V2_SERVER, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON, V2,
     "/v2"},
    {"/v2/", ENDPOINT_V2_SERVER, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 0, JSON, V2,
     "/v2"},
    {"/v2/health/live", ENDPOINT_V2_LIVE, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE, 1,
     JSON, V2, "/v2"},
    {"/v2/health/ready", ENDPOINT_V2_READY, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP, ROUTE_DRAIN_SERVE,
     1, JSON, V2, "/v2"},
    {"/v2/models/stats", ENDPOINT_V2_STATS_ALL, ROUTE_V2, ALLOW_GET, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, JSON, V2, "/v2"},
    {"/v2/repository/index", ENDPOINT_V2_REPO_INDEX, ROUTE_V2, ALLOW_POST, ROUTE_CHEAP,
     ROUTE_DRAIN_SERVE, 0, JSON, V2, "/v2"},
    {"/v2/repository/models/{model}/load", ENDPOINT_V2_REPO_CONTROL, ROUTE_V2, ALLOW_POST,
     ROUTE_CHEAP, ROUTE_DRAIN_REFUSE, 0, JSON, V2, "/v2"},
    {"/v2/repository/models/{model}/unload", ENDPOINT_V2_REPO_CONTROL, ROUTE_V2, ALLOW_POST,
     ROUTE_CHEAP, ROUTE_DRAIN_REFUSE, 0, JSON, V2, "/v2"},
    V2_MODEL_ROWS("/v2/models/{model}"),
    V2_MODEL_ROWS("/v2/models/{model}/versions/{version}"),
};

/* Every path no row matches. */
static const route unknown = {NULL, ENDPOINT_NOT_FOUND, ROUTE_OTHER, NULL, ROUTE_CHEAP,
                              ROUTE_DRAIN_SERVE, 0, JSON, V1, "other"};

/* Where a placeholder named name (as "{model}" spells it, of length len)
 * keeps its segment, and how much room it has; NULL when it keeps none. */
static char *capture_of(const char *name, size_t len, route_args *args, size_t *cap)
{
    if (len == 7 && !strncmp(name, "{model}", len)) {
        *cap = sizeof args->model;
        return args->model;
    }
    if (len == 9 && !strncmp(name, "{version}", len)) {
        *cap = sizeof args->version;
        return args->version;
    }
    if ((len == 6 && !strncmp(name, "{name}", len)) || (len == 7 && !strncmp(name, "{name*}", len))) {
        *cap = sizeof args->name;
        return args->name;
    }
    return NULL;
}

/* 1 when path matches pattern, filling args (whose fields the caller emptied):
 * "{...}" takes one non-empty segment, "{...*}" (last) any rest, a final "*"
 * any rest, every other byte itself. */
static int pattern_matches(const char *pattern, const char *path, route_args *args)
{
    while (*pattern != '\0') {
        if (pattern[0] == '*' && pattern[1] == '\0')
            return 1;
        if (pattern[0] == '{') {
            size_t len = strcspn(pattern, "}") + 1;
            int rest = len >= 3 && pattern[len - 2] == '*';
            size_t n = rest ? strlen(path) : strcspn(path, "/"), cap = 0;
            char *into = capture_of(pattern, len, args, &cap);
            if ((n == 0 && !rest) || (into != NULL && n >= cap))
                return 0;
            if (into != NULL) {
                memcpy(into, path, n);
                into[n] = '\0';
            }
            pattern += len;
            path += n;
            continue;
        }
        if (*pattern++ != *path++)
            return 0;
    }
    return *path == '\0';
}

const route *route_find(const char *path, route_args *args)
{
    route_args scratch;
    if (args == NULL)
        args = &scratch;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        args->model[0] = args->version[0] = args->name[0] = '\0';
        if (pattern_matches(routes[i].pattern, path, args))
            return &routes[i];
    }
    args->model[0] = args->version[0] = args->name[0] = '\0';
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

/* The first row of id (the rows of one id agree; the unit tests check it). */
const route *route_of(route_id id)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (routes[i].id == id)
            return &routes[i];
    return &unknown;
}

const char *route_label(route_id id)
{
    return route_of(id)->label;
}

route_errors route_error_form(route_id id)
{
    return route_of(id)->errors;
}

/*
 * route.h - the one table of the server's routes: what each route is.
 *
 * Every route is one row (route.c): the path it matches and the names it
 * captures (a v2 model and version, a weight set), the endpoint it is, the methods it
 * allows, how costly it is to answer, whether it is a probe, what draining
 * refuses of it, how its body is read, which error body it speaks and its
 * label in /metrics.  The table says what a route is, not who answers it:
 * the router (router/api.c) maps each endpoint to its handler, so the
 * modules below the handlers (the metrics, the answers, the HTTP layer) read
 * the table without depending on any handler.  A request is matched once,
 * when its headers arrive, and carries its row and its captures from then on:
 * no handler parses its path again.
 *
 * Adding a route is adding a row to route.c (and, for a new kind of answer,
 * an endpoint here and its handler in the router's table).
 */
#ifndef ATTN_ROUTE_H
#define ATTN_ROUTE_H

/* The routes as /metrics counts them and as their errors are written;
 * several rows may share one. */
typedef enum route_id {
    ROUTE_ATTENTION,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_INFO,
    ROUTE_METRICS,
    ROUTE_WEIGHT_SETS,
    ROUTE_WEIGHT_SET,
    ROUTE_V2,               /* v2 metadata, health, readiness, config, statistics, repository */
    ROUTE_V2_INFER,
    ROUTE_OTHER,            /* the visualizer, and every unknown path */
    ROUTE_COUNT
} route_id;

/* What a request asks for: each endpoint has one handler (the router's
 * table); several rows may lead to one endpoint. */
typedef enum route_endpoint {
    ENDPOINT_NOT_FOUND,     /* every path no row matches: 404 */
    ENDPOINT_V1_ATTENTION,
    ENDPOINT_HEALTHZ,
    ENDPOINT_READYZ,
    ENDPOINT_V1_INFO,
    ENDPOINT_METRICS,
    ENDPOINT_V1_SETS,       /* the list */
    ENDPOINT_V1_SET,        /* one set */
    ENDPOINT_V1_SET_BELOW,  /* more than one segment below /v1/weight-sets/: no endpoint,
                               but a PUT there names a set, with an invalid name (400) */
    ENDPOINT_VIZ,           /* the page, its files and the golden examples */
    ENDPOINT_V2_SERVER,     /* server metadata */
    ENDPOINT_V2_LIVE,
    ENDPOINT_V2_READY,
    ENDPOINT_V2_STATS_ALL,  /* every model's statistics */
    ENDPOINT_V2_REPO_INDEX,
    ENDPOINT_V2_REPO_CONTROL, /* load and unload */
    ENDPOINT_V2_MODEL,      /* model metadata */
    ENDPOINT_V2_MODEL_READY,
    ENDPOINT_V2_CONFIG,
    ENDPOINT_V2_STATS,      /* one model's statistics */
    ENDPOINT_V2_INFER,
    ENDPOINT_COUNT
} route_endpoint;

/* Which thread answers a request of the route, once its body is complete. */
typedef enum route_cost {
    ROUTE_CHEAP,            /* its I/O thread: no file to touch, nothing that takes long */
    ROUTE_INLINE,           /* a computation, under --max-inflight: its I/O thread when it
                               proves small, else a worker */
    ROUTE_WORKER            /* a worker always: it reads or writes the weight-set store */
} route_cost;

/* What the route takes while the server drains (the router answers the 503). */
typedef enum route_drain {
    ROUTE_DRAIN_SERVE,      /* answered as usual (a probe says it is draining itself) */
    ROUTE_DRAIN_READS,      /* GET and HEAD answered, writes refused */
    ROUTE_DRAIN_REFUSE,     /* refused */
    ROUTE_DRAIN_SEQUENCES   /* the handler answers a live sequence's steps, refuses the rest
                             * (request/sequence_step.h: sequence_step_draining) */
} route_drain;

/* How the HTTP layer places and budgets a request body of the route. */
typedef enum route_body {
    ROUTE_BODY_JSON,        /* JSON, parsed into a tree: budgeted as JSON */
    ROUTE_BODY_V2,          /* a JSON header, then binary tensors when
                               Inference-Header-Content-Length says where */
    ROUTE_BODY_SET          /* JSON, or with ?format=safetensors a file read in place */
} route_body;

/* The shape of the route's error bodies (message/answer.h). */
typedef enum route_errors {
    ROUTE_ERRORS_V1,        /* {"error":{"code","message","field"}} */
    ROUTE_ERRORS_V2         /* the Open Inference Protocol's {"error":"sentence"} */
} route_errors;

/* What a path's placeholders captured: "" where the row has none.  A segment
 * (or rest) longer than its field matches no row.  A weight-set name's field
 * is far longer than any valid name (64 bytes), so that a long name is
 * refused by the name rule (400), not as an unknown path. */
#define ROUTE_MODEL_MAX 200
#define ROUTE_VERSION_MAX 40
#define ROUTE_NAME_MAX 256
typedef struct route_args {
    char model[ROUTE_MODEL_MAX];        /* {model} */
    char version[ROUTE_VERSION_MAX];    /* {version} */
    char name[ROUTE_NAME_MAX];          /* {name}, or {name*} */
} route_args;

typedef struct route {
    /* The path: bytes matched as they are, "{model}", "{version}" and
     * "{name}" taking one non-empty segment into route_args, a final
     * "{name*}" the rest of the path, slashes included, empty or not, into
     * the name, a final "*" any rest. */
    const char *pattern;
    route_endpoint endpoint;
    route_id id;
    const char *allow;      /* methods answered, as the Allow header says them; NULL: none
                               (no endpoint: answered by its handler whatever the method) */
    route_cost cost;
    route_drain drain;
    int probe;              /* liveness or readiness: never needs a token */
    route_body body;
    route_errors errors;
    const char *label;      /* in /metrics; the same for every row of one id */
} route;

/* The row of path: the first one that matches, or the row of unknown paths
 * (ENDPOINT_NOT_FOUND, ROUTE_OTHER, allow NULL).  Never NULL; the row is
 * static.  args, when not NULL, receives what the row's placeholders
 * captured. */
const route *route_find(const char *path, route_args *args);

/* The first row of id, for a front-end that knows its request's route
 * without a path to match (gRPC's ModelInfer: ROUTE_V2_INFER, its model in
 * route_args); the rows of one id agree but for the path.  Never NULL. */
const route *route_of(route_id id);

/* 1 when r's Allow list names method (HEAD where GET is allowed is named
 * too), else 0.  OPTIONS is in every known route's list. */
int route_allows(const route *r, const char *method);

/* Which thread answers method on r: r's cost, except that OPTIONS, an
 * unknown path and a method the route does not allow are answered at once
 * (ROUTE_CHEAP), their answer needing nothing but the path. */
route_cost route_request_cost(const route *r, const char *method);

/* The label of id in /metrics, and the error body its rows speak. */
const char *route_label(route_id id);
route_errors route_error_form(route_id id);

#endif

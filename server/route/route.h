/*
 * route.h - the one table of the server's routes.
 *
 * Every route is one row (route.c): the path it matches, the methods it
 * allows, the handler that answers it, how costly it is to answer, whether it
 * is a probe, what draining refuses of it, which error body it speaks and its
 * label in /metrics.  Every part of the server that needs to know a route
 * reads this table: the HTTP layer (which thread answers), the guard (probes
 * need no token), the router (405, draining, the handler), the answer
 * helpers (v1 or v2 error bodies) and the metrics (labels).  A request is
 * matched once, when its headers arrive, and carries its row from then on.
 *
 * Adding a route is adding a row to route.c, and a handler in the file of its
 * resource.
 */
#ifndef ATTN_ROUTE_H
#define ATTN_ROUTE_H

struct api_request;
struct api_response;

/* The routes as /metrics counts them; several rows may share one. */
typedef enum route_id {
    ROUTE_ATTENTION,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_INFO,
    ROUTE_METRICS,
    ROUTE_WEIGHT_SETS,
    ROUTE_WEIGHT_SET,
    ROUTE_V2,               /* v2 metadata, health, readiness and config */
    ROUTE_V2_INFER,
    ROUTE_OTHER,            /* the visualizer, and every unknown path */
    ROUTE_COUNT
} route_id;

/* Which thread answers a request of the route, once its body is complete. */
typedef enum route_cost {
    ROUTE_CHEAP,            /* its I/O thread: no file to touch, nothing that takes long */
    ROUTE_INLINE,           /* a computation, under --max-inflight: its I/O thread when it
                               proves small, else a worker */
    ROUTE_WORKER            /* a worker always: it reads or writes the weight-set store */
} route_cost;

/* What the route takes while the server drains (api.c answers the 503). */
typedef enum route_drain {
    ROUTE_DRAIN_SERVE,      /* answered as usual (a probe says it is draining itself) */
    ROUTE_DRAIN_READS,      /* GET and HEAD answered, writes refused */
    ROUTE_DRAIN_REFUSE      /* refused */
} route_drain;

/* The shape of the route's error bodies (answer.h). */
typedef enum route_errors {
    ROUTE_ERRORS_V1,        /* {"error":{"code","message","field"}} */
    ROUTE_ERRORS_V2         /* the Open Inference Protocol's {"error":"sentence"} */
} route_errors;

/* Answers a request of the route into resp (which api_handle zeroed and gave
 * its route and Allow); always fills resp. */
typedef void route_handler(const struct api_request *req, struct api_response *resp);

typedef struct route {
    /* The path: exact, or with "{}" standing for one non-empty segment, or
     * ending in "*" for any rest.  NULL when match decides instead. */
    const char *pattern;
    int (*match)(const char *path);     /* 1 when path is this route's */
    route_id id;
    const char *allow;      /* methods answered, as the Allow header says them; NULL: none
                               (the unknown path) */
    route_handler *handle;
    route_cost cost;
    route_drain drain;
    int probe;              /* liveness or readiness: never needs a token */
    route_errors errors;
    const char *label;      /* in /metrics; the same for every row of one id */
} route;

/* The row of path: the first one that matches, or the row of unknown paths
 * (ROUTE_OTHER, allow NULL, answered 404).  Never NULL; the row is static. */
const route *route_find(const char *path);

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

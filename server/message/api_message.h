/*
 * api_message.h - the request a handler is given and the answer it fills in.
 *
 * The HTTP layer builds an api_request from a complete request and sends the
 * api_response a handler filled in; the router (api.c) and the handlers below
 * it (api_*.c; v2.c and v2_infer.c) share these types without depending on each other.
 */
#ifndef ATTN_API_MESSAGE_H
#define ATTN_API_MESSAGE_H

#include <stddef.h>

#include "route/route.h"

typedef struct api_request {
    const char *method;
    const char *path;
    const char *body;           /* borrowed; may be NULL when body_len is 0 */
    size_t body_len;
    const char *inference_header_length; /* header of v2 binary bodies, NULL if absent */
    const char *if_match;       /* If-Match header, NULL if absent */
    /* Read and answered on an I/O thread, which must not wait nor compute
     * long: a computation that would is not answered (api_response.deferred)
     * and goes to a worker instead. */
    int io_thread;
    /* The request's row of the route table, route_find(path), found once by
     * the HTTP layer when the headers arrived; NULL: api_handle finds it. */
    const route *route;
    /* The query's arguments, decoded: query_arg(query_ctx, "format") is the
     * value of format=, or NULL when absent.  query_arg NULL: no query. */
    const char *(*query_arg)(const void *query_ctx, const char *key);
    const void *query_ctx;
    /* When the request was queued for a worker (seconds of compute_now()),
     * 0 when it was not: the statistics' queue time. */
    double queued_at;
} api_request;

typedef struct api_response {
    int status;
    char *body;                 /* owned unless body_static; free with api_response_free */
    size_t body_len;
    int body_static;            /* body points at a string literal */
    const char *content_type;   /* static string */
    const char *allow;          /* static string or NULL: methods of the route */
    int retry_after;            /* seconds, 0 for none */
    char location[96];          /* Location header, "" for none */
    char etag[32];              /* ETag header (quoted generation), "" for none */
    size_t inference_header_length; /* v2 binary answers: bytes of the JSON part; 0 for none */
    route_id route;             /* for /metrics and the form of an error body */
    int deferred;               /* io_thread request left unanswered: hand it to a worker */
} api_response;

/* Frees the body of resp (resp may be NULL). */
void api_response_free(api_response *resp);

#endif

/*
 * api.h - routing and the endpoint handlers, independent of the HTTP library.
 *
 * The HTTP layer hands over a method, a path and a complete body; api_handle
 * answers with a status, a body and the few headers that depend on the
 * endpoint (Allow, Retry-After).  Errors become the contract's JSON error
 * body here, so every endpoint answers errors the same way.
 */
#ifndef ATTN_API_H
#define ATTN_API_H

#include <stddef.h>

#include "attention.h"
#include "config.h"
#include "error.h"
#include "metrics.h"

typedef struct api_request {
    const char *method;
    const char *path;
    const char *body;           /* borrowed; may be NULL when body_len is 0 */
    size_t body_len;
    const char *inference_header_length; /* header of v2 binary bodies, NULL if absent */
    const char *if_match;       /* If-Match header, NULL if absent */
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
    metrics_route route;
} api_response;

/* Keeps cfg (borrowed for the life of the server) and opens the weight-set
 * store in cfg->data_dir.  Returns 0, or a negative ERR_* code with err filled
 * (nothing is left open then). */
int api_init(const server_config *cfg, attn_error *err);

/* Releases what api_init set up (the store). */
void api_shutdown(void);

/* While draining, /readyz answers 503 and new work is refused with 503. */
void api_set_draining(int draining);

/* Attention computations under way now. */
long api_busy(void);

/* The route a path belongs to, and in *allow the methods it allows ("GET,
 * HEAD, OPTIONS"; a static string), or ROUTE_OTHER and NULL for an unknown
 * path.  /v1/weight-sets/{name} takes one segment: a longer path below
 * /v1/weight-sets/ is unknown (404), except that api_handle answers a PUT
 * there as a PUT of an invalid name (400 invalid_value). */
metrics_route api_route(const char *path, const char **allow);

/* Answers req (borrowed) into resp, which is always filled, even when
 * memory runs out; the caller frees it with api_response_free. */
void api_handle(const api_request *req, api_response *resp);

/* Replaces the body of resp (freeing it) with the JSON error body for err
 * (borrowed) and sets the status from err->kind, with Retry-After: 1 for a
 * 503 that has none. */
void api_respond_error(api_response *resp, const attn_error *err);

/* Admits a computation: applies the limits every computation is admitted
 * under (--max-elements on the answer's result_elements, --max-request-memory
 * on the job's working memory plus bytes_per_number for each answered
 * number), sets *response_bytes to the latter, and reserves the working
 * memory and the answer in the process memory budget (budget.h).
 * attention_hint says how to drop the attention matrix from the answer ("set
 * return_attention to false"); it is offered when job->want_attention.
 * Returns 0 with *reserved_bytes set, which the caller hands back with
 * budget_release once the answer is built; or ERR_TOO_LARGE (past a limit, or
 * more than the whole budget) or ERR_UNAVAILABLE (the budget is full now) with
 * err filled and nothing reserved. */
int api_admit_job(const attn_job *job, size_t result_elements, size_t bytes_per_number,
                  const char *attention_hint, size_t *response_bytes, size_t *reserved_bytes,
                  attn_error *err);

/* Frees the body of resp (resp may be NULL). */
void api_response_free(api_response *resp);

#endif

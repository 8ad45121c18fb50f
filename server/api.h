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

#include "api_message.h"

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



#endif

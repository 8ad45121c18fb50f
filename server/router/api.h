/*
 * api.h - the router and the state its handlers share, independent of the
 * HTTP library.
 *
 * The HTTP layer hands over a complete request (method, path, body, the
 * headers the API reads, and its row of the route table, route.h);
 * api_handle answers with a status, a body and the few headers that depend
 * on the route (Allow, Retry-After, Location, ETag).  Errors take the form
 * of the route (message/answer.h).  The handlers are the v1, v2 and viz
 * modules, each endpoint's named once, in api.c's table.
 */
#ifndef ATTN_API_H
#define ATTN_API_H

#include <stddef.h>

#include "core/config.h"
#include "message/api_message.h"
#include "route/route.h"
#include "core/error.h"

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

/* The handler of endpoint (every endpoint has one), or NULL for a value
 * that is no endpoint. */
api_handler *api_handler_of(route_endpoint endpoint);

/* Answers req (borrowed) into resp, which is always filled, even when
 * memory runs out; the caller frees it with api_response_free.  The store
 * must be open (api_init). */
void api_handle(const api_request *req, api_response *resp);

#endif

/*
 * http.h - serving the API over libmicrohttpd.
 *
 * The HTTP layer (http.c and its http_*.c, which share http_private.h) is
 * the only code that includes microhttpd.h.  It finds each request's route
 * (route.h) once, runs the guard, admits the body against --max-body and the
 * memory budget before it arrives, hands complete requests to api_handle on
 * the thread the route's cost calls for (its I/O thread or a worker, with a
 * deadline), closes connections that are too slow, adds the CORS, Allow and
 * Retry-After headers, and reports each finished request to the metrics.
 */
#ifndef ATTN_HTTP_H
#define ATTN_HTTP_H

#include <stddef.h>

#include "core/config.h"
#include "core/error.h"

typedef struct http_server http_server;

/* Starts listening on cfg->host:cfg->port (cfg is borrowed for the server's
 * life) with the I/O threads, the --max-inflight workers and the reaper of
 * slow connections (http.c says how they share the work).  The process
 * memory budget (budget.h) must be set first.  Returns the server, or NULL
 * with err filled (nothing left running).  The caller stops it with
 * http_stop. */
http_server *http_start(const server_config *cfg, attn_error *err);

/* The port actually bound (useful with port 0). */
unsigned http_port(const http_server *server);

/* Connections open now. */
unsigned http_connections(const http_server *server);

/* Answers requests still waiting for a worker with 503, waits for the
 * workers to finish what they run (call compute_stop_all(1) first to make
 * that quick), stops listening, closes every connection and frees the
 * server (NULL is fine). */
void http_stop(http_server *server);

#endif

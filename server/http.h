/*
 * http.h - the libmicrohttpd glue: listening, gathering bodies, headers.
 *
 * This is the only module that includes microhttpd.h.  It enforces the body
 * limit while the body arrives, hands complete requests to api_handle, adds
 * the CORS, Allow and Retry-After headers, and reports each finished request
 * to the metrics.
 */
#ifndef ATTN_HTTP_H
#define ATTN_HTTP_H

#include <stddef.h>

#include "config.h"
#include "error.h"

typedef struct http_server http_server;

/* Starts listening on cfg->host:cfg->port (cfg is borrowed for the server's
 * life) with a thread per connection.  Returns the server, or NULL with err
 * filled.  The caller stops it with http_stop. */
http_server *http_start(const server_config *cfg, attn_error *err);

/* The port actually bound (useful with port 0). */
unsigned http_port(const http_server *server);

/* Connections open now. */
unsigned http_connections(const http_server *server);

/* Stops listening, waits for the connection threads, and frees the server
 * (NULL is fine). */
void http_stop(http_server *server);

#endif

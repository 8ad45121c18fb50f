/*
 * guard.h - what a request must pass before any endpoint sees it, whichever
 * front-end brought it: the guard sits below both HTTP and gRPC, so that a
 * token or a limit means the same on either.
 *
 * The HTTP layer hands over the method, the decoded path, the protocol
 * version and every header line as the client sent them; guard_check decides
 * whether the request may go on, or which error answers it: ambiguous framing
 * (two Content-Length headers, Transfer-Encoding with Content-Length), an
 * oversized target or header block, a Host outside the allow-list (the defence
 * against DNS rebinding of a server on a loopback address), a control byte in
 * the decoded path (a %00 that would otherwise cut a weight-set name short),
 * and a missing or wrong bearer token where --auth-writes or --auth-all asks
 * for one, and a write from a web page of a foreign origin (cors.h).
 * guard_cors_origin decides the Access-Control-Allow-Origin answer.
 * Everything here is a pure function of its arguments and of the settings
 * read once by guard_new, so the unit tests need no socket.  The gRPC
 * front-end asks guard_token_check alone: its calls have no HTTP framing,
 * Host or Origin to check.
 */
#ifndef ATTN_GUARD_H
#define ATTN_GUARD_H

#include <stddef.h>

#include "core/config.h"
#include "core/error.h"

/* Longest request target and header block (names, values and separators)
 * answered by the endpoints; longer ones get 414 and 431 from guard_check. */
#define GUARD_MAX_TARGET 8192
#define GUARD_MAX_HEADER_BYTES 16384
/* Most header lines one request may carry. */
#define GUARD_MAX_HEADERS 100
/* Query parameters read from one request: the API names a handful, so more
 * is a mistake or an attack, and a short list keeps the duplicate check cheap. */
#define GUARD_MAX_ARGS 64

/* The headers the API reads from a browser; a preflight allows these only. */
#define GUARD_CORS_ALLOW_HEADERS \
    "Authorization, Content-Type, If-Match, Inference-Header-Content-Length, traceparent, " \
    "tracestate, X-Request-Id"

typedef struct guard guard;

typedef struct guard_header {
    const char *name;           /* borrowed */
    const char *value;          /* borrowed */
} guard_header;

/* One request as the HTTP layer saw it; every pointer is borrowed. */
typedef struct guard_request {
    const char *method;
    const char *path;           /* decoded (see guard_unescape) */
    size_t target_bytes;        /* the request target as sent, query included
                                   (0: unknown, the path's length is used) */
    const char *version;        /* "HTTP/1.1", "HTTP/1.0" */
    const guard_header *headers;
    size_t header_count;        /* header lines the request had; only the first
                                   GUARD_MAX_HEADERS of them are in headers */
    const guard_header *args;   /* the query's parameters, decoded */
    size_t arg_count;           /* parameters the query had; only the first
                                   GUARD_MAX_ARGS of them are in args */
    int probe;                  /* the route is a probe (route.h): no token needed */
} guard_request;

/* What the HTTP layer does besides answering a refused request. */
typedef struct guard_verdict {
    int close;                  /* close the connection after the answer */
    char www_authenticate[96];  /* WWW-Authenticate value of a 401, "" otherwise */
} guard_verdict;

/* Reads the guard's settings from cfg: the bearer tokens (cfg->auth_tokens,
 * comma-separated, and the lines of cfg->auth_token_file), which routes need
 * them, the CORS origins and the Host allow-list.  Returns a new guard that
 * the caller frees with guard_free (it keeps no pointer into cfg), or NULL
 * with err filled: a token file that cannot be read, a token shorter than 16
 * characters or with a character outside A-Z a-z 0-9 - . _ ~ + / =, tokens
 * given while neither auth setting is on, or an auth setting on without a
 * token. */
guard *guard_new(const server_config *cfg, attn_error *err);

/* Frees g (NULL is fine). */
void guard_free(guard *g);

/* Decides whether rq may reach the endpoints.  Returns 0 (v says nothing
 * then), or a negative ERR_* code with err filled and v saying what else to
 * do: ERR_BAD_REQUEST for ambiguous framing (two Content-Length,
 * Content-Encoding or Inference-Header-Content-Length headers...; v->close
 * set), a Host outside the allow-list, a control byte in the path, a query
 * parameter given twice (err->field names it) or more than GUARD_MAX_ARGS of
 * them; ERR_URI_TOO_LONG (the whole target, query included) and
 * ERR_HEADERS_TOO_LARGE past the limits above (v->close set);
 * ERR_UNAUTHORIZED with v->www_authenticate filled when a token is needed and
 * missing or wrong; ERR_FORBIDDEN for a write from a page of a foreign
 * origin (cors_check).  OPTIONS (a browser's preflight carries no credentials)
 * and the probes (rq->probe) never need a token.
 * Token comparison takes the same time whatever the bytes sent. */
int guard_check(const guard *g, const guard_request *rq, guard_verdict *v, attn_error *err);

/* The bearer-token rule of guard_check alone, for a request that is no HTTP
 * request (a gRPC call): with may_need (not a probe, not a preflight), a token
 * is needed under --auth-all, and under --auth-writes for a write (is_write);
 * authorization is the "Bearer TOKEN" value or NULL.  Returns 0, or
 * ERR_UNAUTHORIZED with err filled in guard_check's words. */
int guard_token_check(const guard *g, const char *authorization, int may_need, int is_write,
                      attn_error *err);

/* The Access-Control-Allow-Origin value for a request with the given Origin
 * header (NULL when absent): "*" when any origin is allowed, the origin
 * itself when it is in the list, NULL when CORS is off or the origin is not
 * listed.  *vary is set to 1 when the answer depends on the Origin header (a
 * list is configured), so that caches keep answers apart with Vary: Origin.
 * The result is borrowed from g or from origin. */
const char *guard_cors_origin(const guard *g, const char *origin, int *vary);

/* The methods a preflight from `origin` (NULL when absent) to a server
 * reached as `host` may be told: the route's `allow`, without PUT and DELETE
 * when that origin may not write (cors.h), in buf (n bytes) then.  Returns
 * allow or buf. */
const char *guard_cors_methods(const guard *g, const char *allow, const char *origin,
                               const char *host, char *buf, size_t n);

/* Decodes %HH escapes of s in place, as libmicrohttpd does, except that a
 * decoded NUL becomes the control byte 0x7f: the path stays one C string and
 * guard_check refuses it, instead of a name being cut short at the NUL.
 * Returns the new length. */
size_t guard_unescape(char *s);

/* 1 when host (an address or name as given to --host) is a loopback one:
 * localhost, 127.0.0.0/8 or ::1; else 0. */
int guard_is_loopback(const char *host);

#endif

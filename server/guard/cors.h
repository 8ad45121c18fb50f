/*
 * cors.h - which web pages may change the server's state.
 *
 * --cors-origin says which pages may read answers (guard_cors_origin); this
 * says which may write.  A browser sends any page's PUT or DELETE once the
 * preflight allows it, and writes need no token by default, so at the
 * defaults (--cors-origin *) any page a developer opens could rewrite the
 * weight sets of the server on their machine.  The rule: a write (any method
 * but GET, HEAD, OPTIONS and POST, which only reads or computes) that carries
 * an Origin header goes on only when that origin is the server's own (the
 * page it serves itself: Origin's host and port equal the Host header), is
 * listed in --cors-write-origins, or when writes need a bearer token
 * (--auth-writes, --auth-all), which a page cannot borrow.  A request
 * without Origin (curl, another server) is not a browser's and goes on.
 * The rule holds for the write itself, not only for its preflight, since a
 * preflight can be skipped by a form or an old browser.
 */
#ifndef ATTN_CORS_H
#define ATTN_CORS_H

#include <stddef.h>

#include "core/config.h"
#include "core/error.h"

/* The write policy, read once from the configuration. */
typedef struct cors_policy {
    char write_origins[1024];   /* --cors-write-origins as given */
    int writes_need_token;      /* --auth-writes or --auth-all */
} cors_policy;

/* Fills p from cfg.  Returns 0, or ERR_INTERNAL with err filled when an
 * item of --cors-write-origins is not scheme://host[:port]. */
int cors_policy_init(cors_policy *p, const server_config *cfg, attn_error *err);

/* 1 when method changes state (PUT, DELETE, PATCH...), else 0. */
int cors_is_write(const char *method);

/* 1 when a page of `origin` (an Origin header value; NULL when absent) may
 * send writes to a server reached as `host` (the Host header; may be NULL),
 * else 0. */
int cors_may_write(const cors_policy *p, const char *origin, const char *host);

/* Decides a request: 0 when it may go on, or ERR_FORBIDDEN with err filled
 * (code "cross_origin_write") for a write a page of a foreign origin may
 * not send. */
int cors_check(const cors_policy *p, const char *method, const char *origin, const char *host,
               attn_error *err);

/* The methods a preflight from `origin` to a server reached as `host` may
 * be told: `allow` (a route's "GET, HEAD, PUT, DELETE, OPTIONS") as it is,
 * or without its writes when that origin may not write, written into buf
 * (n bytes).  Returns allow or buf. */
const char *cors_preflight_methods(const cors_policy *p, const char *allow, const char *origin,
                                   const char *host, char *buf, size_t n);

#endif

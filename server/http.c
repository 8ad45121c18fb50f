/*
 * http.c - serving the API over libmicrohttpd.
 *
 * Following libmicrohttpd's own examples, per-request state is allocated on
 * the first call of the access handler, the body is gathered over the
 * following calls, the answer is queued on the last, and everything is freed
 * in the request-completed callback whatever happened.  A body over
 * --max-body is not stored: when Content-Length announces it, the 413 is
 * queued at once (before any body is read); otherwise the rest of the body is
 * read and dropped and the 413 follows.
 */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "api.h"
#include "mem.h"
#include "metrics.h"

/* Threading model.  Compute blocks the thread that serves the connection, so
 * the choice decides what waits for what:
 *   HTTP_POOL_THREADS 0   one thread per connection (HTTP_TPC_POLL: poll()
 *                         rather than select() in each), so a slow request
 *                         delays only its own connection;
 *   HTTP_POOL_THREADS N   N threads, each polling its share of the
 *                         connections with epoll: a thread busy computing
 *                         stalls every connection it serves.
 * Both are compile-time so that tests/bench/bench_mhd.sh can build and measure
 * each variant (make bench-mhd); README "Threading model" has the numbers
 * behind the default. */
#ifndef HTTP_POOL_THREADS
#define HTTP_POOL_THREADS 0
#endif
#ifndef HTTP_TPC_POLL
#define HTTP_TPC_POLL 0
#endif

struct http_server {
    struct MHD_Daemon *daemon;
    const server_config *cfg;
    unsigned port;
};

/* State of one request, from its first byte to its completion. */
typedef struct http_request {
    struct timespec start;
    char *body;
    size_t len, cap;
    int too_large;
    int status;
    size_t bytes_in, bytes_out;
    metrics_route route;
    char method[12];        /* for the access log */
    char path[96];
} http_request;

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

/* Appends data to the request body within the limit; past it, drops the body
 * and marks the request too large.  Returns -1 when out of memory. */
static int body_append(http_request *hr, size_t limit, const char *data, size_t n)
{
    hr->bytes_in += n;
    if (hr->too_large)
        return 0;
    if (hr->len + n > limit) {
        hr->too_large = 1;
        mem_free(hr->body);
        hr->body = NULL;
        hr->len = hr->cap = 0;
        return 0;
    }
    if (hr->len + n > hr->cap) {
        size_t cap = hr->cap ? hr->cap : 4096;
        while (cap < hr->len + n)
            cap *= 2;
        if (cap > limit)
            cap = limit;
        char *body = mem_realloc(hr->body, cap);
        if (body == NULL)
            return -1;
        hr->body = body;
        hr->cap = cap;
    }
    memcpy(hr->body + hr->len, data, n);
    hr->len += n;
    return 0;
}

/* Builds the MHD response for resp (consuming its body) with the common
 * headers, and queues it.  OPTIONS answers get the preflight headers. */
static enum MHD_Result queue_answer(http_server *srv, struct MHD_Connection *conn,
                                    http_request *hr, api_response *resp, int preflight)
{
    struct MHD_Response *r;
    if (resp->body_static)
        r = MHD_create_response_from_buffer(resp->body_len, resp->body, MHD_RESPMEM_PERSISTENT);
    else
        r = MHD_create_response_from_buffer_with_free_callback(resp->body_len, resp->body,
                                                               mem_free);
    if (r == NULL) {
        api_response_free(resp);
        return MHD_NO;
    }
    resp->body = NULL; /* now owned by r */
    const char *origin = srv->cfg->cors_origin;
    if (resp->body_len > 0)
        MHD_add_response_header(r, "Content-Type", resp->content_type ? resp->content_type
                                                                      : "application/json");
    if (resp->location[0])
        MHD_add_response_header(r, "Location", resp->location);
    /* The visualizer's page (server/viz/) runs under the strictest policy it
     * works with: everything from this server, no inline script or style, no
     * plugins, no framing. */
    if (resp->content_type != NULL && !strncmp(resp->content_type, "text/html", 9)) {
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; script-src 'self'; style-src 'self'; "
                                "connect-src 'self'; object-src 'none'; "
                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    }
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    if (strcmp(origin, "*") != 0)
        MHD_add_response_header(r, "Vary", "Origin");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Allow, Retry-After");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (resp->allow != NULL && (resp->status == 405 || preflight))
        MHD_add_response_header(r, "Allow", resp->allow);
    if (preflight && resp->allow != NULL) {
        const char *asked = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", resp->allow);
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                asked != NULL && strlen(asked) < 512 ? asked : "Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    if (resp->retry_after > 0) {
        char text[16];
        snprintf(text, sizeof text, "%d", resp->retry_after);
        MHD_add_response_header(r, "Retry-After", text);
    }
    hr->status = resp->status;
    hr->bytes_out = resp->body_len;
    hr->route = resp->route;
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)resp->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result queue_error(http_server *srv, struct MHD_Connection *conn,
                                   http_request *hr, const char *url, const attn_error *err)
{
    api_response resp;
    memset(&resp, 0, sizeof resp);
    resp.route = api_route(url, &resp.allow);
    api_respond_error(&resp, err);
    return queue_answer(srv, conn, hr, &resp, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    http_server *srv = cls;
    http_request *hr = *con_cls;
    attn_error err;
    if (hr == NULL) {
        hr = mem_calloc(1, sizeof *hr);
        if (hr == NULL)
            return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &hr->start);
        hr->route = ROUTE_OTHER;
        snprintf(hr->method, sizeof hr->method, "%s", method);
        /* Keep the path printable: control characters become '?'. */
        snprintf(hr->path, sizeof hr->path, "%s", url);
        for (char *p = hr->path; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        *con_cls = hr;
        metrics_inflight_add(1);
        const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length != NULL) {
            char *end;
            unsigned long long n = strtoull(length, &end, 10);
            if (*end == '\0' && n > srv->cfg->max_body) {
                hr->too_large = 1;
                error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                          "The body has %llu bytes, more than the server's limit of %zu bytes "
                          "(--max-body).", n, srv->cfg->max_body);
                return queue_error(srv, conn, hr, url, &err);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        if (body_append(hr, srv->cfg->max_body, upload_data, *upload_data_size) != 0)
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (hr->status != 0)
        return MHD_YES; /* already answered (early 413) */
    if (hr->too_large) {
        error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body is larger than the server's limit of %zu bytes (--max-body).",
                  srv->cfg->max_body);
        return queue_error(srv, conn, hr, url, &err);
    }
    api_request req = {method, url, hr->body, hr->len};
    api_response resp;
    api_handle(&req, &resp);
    return queue_answer(srv, conn, hr, &resp, !strcmp(method, "OPTIONS"));
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    http_server *srv = cls;
    http_request *hr = *con_cls;
    if (hr == NULL)
        return;
    double seconds = seconds_since(&hr->start);
    metrics_observe(hr->route, hr->status, seconds, hr->bytes_in, hr->bytes_out);
    metrics_inflight_add(-1);
    if (!srv->cfg->quiet)
        fprintf(stderr, "access %s %s status=%d in=%zu out=%zu ms=%.3f%s\n", hr->method,
                hr->path, hr->status, hr->bytes_in, hr->bytes_out, seconds * 1000.0,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted");
    mem_free(hr->body);
    mem_free(hr);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

http_server *http_start(const server_config *cfg, attn_error *err)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%ld", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) {
        error_set(err, ERR_INTERNAL, "bad_host", "host", "Cannot use host \"%s\": %s.", cfg->host,
                  gai_strerror(gai));
        return NULL;
    }
    http_server *srv = mem_calloc(1, sizeof *srv);
    if (srv == NULL) {
        freeaddrinfo(ai);
        error_nomem(err);
        return NULL;
    }
    srv->cfg = cfg;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    unsigned pool = HTTP_POOL_THREADS;
    if (pool == 0)
        flags |= MHD_USE_THREAD_PER_CONNECTION | (HTTP_TPC_POLL ? MHD_USE_POLL : 0);
    else
        flags |= MHD_USE_EPOLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, &on_request, srv,
        MHD_OPTION_THREAD_POOL_SIZE, pool > 1 ? pool : 0u,
        MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, &on_completed, srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (srv->daemon == NULL) {
        mem_free(srv);
        error_set(err, ERR_INTERNAL, "listen_failed", "port",
                  "Cannot listen on %s port %ld (in use, or not an address of this machine?).",
                  cfg->host, cfg->port);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info != NULL ? info->port : (unsigned)cfg->port;
    return srv;
}

unsigned http_port(const http_server *server)
{
    return server->port;
}

unsigned http_connections(const http_server *server)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(server->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info != NULL ? info->num_connections : 0;
}

void http_stop(http_server *server)
{
    if (server == NULL)
        return;
    MHD_stop_daemon(server->daemon);
    mem_free(server);
}

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
#include "guard.h"
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
    guard *guard;
    char *tls_cert, *tls_key;   /* PEM text, kept while the daemon runs */
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
 * headers, and queues it.  OPTIONS answers get the preflight headers; a
 * request the guard refused gets what its verdict v asks for (NULL: none). */
static enum MHD_Result queue_answer(http_server *srv, struct MHD_Connection *conn,
                                    http_request *hr, api_response *resp, int preflight,
                                    const guard_verdict *v)
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
    int vary = 0;
    const char *origin = guard_cors_origin(
        srv->guard, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"), &vary);
    if (resp->body_len > 0)
        MHD_add_response_header(r, "Content-Type", resp->content_type ? resp->content_type
                                                                      : "application/json");
    if (resp->location[0])
        MHD_add_response_header(r, "Location", resp->location);
    if (resp->etag[0])
        MHD_add_response_header(r, "ETag", resp->etag);
    if (resp->inference_header_length > 0) {
        char text[24];
        snprintf(text, sizeof text, "%zu", resp->inference_header_length);
        MHD_add_response_header(r, "Inference-Header-Content-Length", text);
    }
    if (origin != NULL) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                "Allow, Retry-After, WWW-Authenticate, Inference-Header-Content-Length, ETag");
    }
    if (vary)
        MHD_add_response_header(r, "Vary", "Origin");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (resp->allow != NULL && (resp->status == 405 || preflight))
        MHD_add_response_header(r, "Allow", resp->allow);
    /* A preflight allows the route's methods and the headers the API reads,
     * never whatever the browser asked for. */
    if (preflight && resp->allow != NULL && origin != NULL) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", resp->allow);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", GUARD_CORS_ALLOW_HEADERS);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    if (v != NULL && v->www_authenticate[0])
        MHD_add_response_header(r, "WWW-Authenticate", v->www_authenticate);
    if (v != NULL && v->close)
        MHD_add_response_header(r, "Connection", "close");
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
                                   http_request *hr, const char *url, const attn_error *err,
                                   const guard_verdict *v)
{
    api_response resp;
    memset(&resp, 0, sizeof resp);
    resp.route = api_route(url, &resp.allow);
    api_respond_error(&resp, err);
    return queue_answer(srv, conn, hr, &resp, 0, v);
}

/* The header lines of a request, gathered for guard_check. */
typedef struct header_list {
    guard_header items[GUARD_MAX_HEADERS];
    size_t count;
} header_list;

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    header_list *list = cls;
    if (list->count < GUARD_MAX_HEADERS)
        list->items[list->count] = (guard_header){key, value != NULL ? value : ""};
    list->count++;
    return MHD_YES;
}

/* Runs the guard over a new request; returns 0 when it may go on, else the
 * ERR_* code with err and v filled. */
static int guard_request_check(http_server *srv, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, guard_verdict *v,
                               attn_error *err)
{
    header_list headers;
    headers.count = 0;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &headers);
    guard_request rq = {method, url, version, headers.items, headers.count};
    return guard_check(srv->guard, &rq, v, err);
}

/* Decodes the path and query arguments for libmicrohttpd (see guard_unescape). */
static size_t unescape_path(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    return guard_unescape(s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
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
        guard_verdict verdict;
        if (guard_request_check(srv, conn, url, method, version, &verdict, &err) != 0) {
            hr->too_large = 1; /* whatever body follows is dropped unread */
            return queue_error(srv, conn, hr, url, &err, &verdict);
        }
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
                return queue_error(srv, conn, hr, url, &err, NULL);
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
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    api_request req = {method, url, hr->body, hr->len,
                       MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   "Inference-Header-Content-Length"),
                       MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "If-Match")};
    api_response resp;
    api_handle(&req, &resp);
    return queue_answer(srv, conn, hr, &resp, !strcmp(method, "OPTIONS"), NULL);
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

/* libmicrohttpd's own messages (a client that sent garbage, a failed TLS
 * handshake) count as access log: --quiet drops them. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    const http_server *srv = cls;
    if (srv->cfg->quiet)
        return;
    fputs("libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* Frees what the server holds besides its daemon. */
static void server_free(http_server *srv)
{
    guard_free(srv->guard);
    if (srv->tls_key != NULL)
        memset(srv->tls_key, 0, strlen(srv->tls_key));
    mem_free(srv->tls_key);
    mem_free(srv->tls_cert);
    mem_free(srv);
}

/* Reads a PEM file into a new string (caller frees with mem_free), or
 * returns NULL with err filled. */
static char *read_pem(const char *path, const char *flag, attn_error *err)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        if (size > 0 && size < (1L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
            (text = mem_malloc((size_t)size + 1)) != NULL)
            len = fread(text, 1, (size_t)size, f);
    }
    if (f != NULL)
        fclose(f);
    if (text == NULL || len == 0) {
        mem_free(text);
        error_set(err, ERR_INTERNAL, "bad_config", flag + 2, "Cannot read %s \"%s\".", flag, path);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* Loads --tls-cert and --tls-key when given (both or neither). */
static int tls_load(http_server *srv, attn_error *err)
{
    const server_config *cfg = srv->cfg;
    if (cfg->tls_cert[0] == '\0' && cfg->tls_key[0] == '\0')
        return 0;
    if (cfg->tls_cert[0] == '\0' || cfg->tls_key[0] == '\0')
        return error_set(err, ERR_INTERNAL, "bad_config", "tls",
                         "--tls-cert and --tls-key go together: give both or neither.");
    if (!(MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES))
        return error_set(err, ERR_INTERNAL, "bad_config", "tls",
                         "This libmicrohttpd was built without TLS; --tls-cert cannot be used.");
    srv->tls_cert = read_pem(cfg->tls_cert, "--tls-cert", err);
    if (srv->tls_cert == NULL)
        return ERR_INTERNAL;
    srv->tls_key = read_pem(cfg->tls_key, "--tls-key", err);
    return srv->tls_key == NULL ? ERR_INTERNAL : 0;
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
    srv->guard = guard_new(cfg, err);
    if (srv->guard == NULL || tls_load(srv, err) != 0) {
        freeaddrinfo(ai);
        server_free(srv);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    unsigned pool = HTTP_POOL_THREADS;
    /* Options that are given only sometimes; libmicrohttpd warns about a
     * thread pool of size 0, so none is named then. */
    struct MHD_OptionItem extra[4];
    size_t n_extra = 0;
    if (pool > 1)
        extra[n_extra++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, pool, NULL};
    if (srv->tls_cert != NULL) {
        flags |= MHD_USE_TLS;
        extra[n_extra++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key};
        extra[n_extra++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert};
    }
    extra[n_extra] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    if (pool == 0)
        flags |= MHD_USE_THREAD_PER_CONNECTION | (HTTP_TPC_POLL ? MHD_USE_POLL : 0);
    else
        flags |= MHD_USE_EPOLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* The logger comes first, or libmicrohttpd prints the messages about the
     * options before it on its own. */
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, &on_request, srv,
        MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, srv,
        MHD_OPTION_ARRAY, extra,
        MHD_OPTION_UNESCAPE_CALLBACK, &unescape_path, NULL,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, &on_completed, srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (srv->daemon == NULL) {
        server_free(srv);
        if (cfg->tls_cert[0] != '\0')
            error_set(err, ERR_INTERNAL, "listen_failed", "port",
                      "Cannot serve HTTPS on %s port %ld: the port is taken, or --tls-cert and "
                      "--tls-key are not a matching PEM certificate and key.",
                      cfg->host, cfg->port);
        else
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
    server_free(server);
}

/*
 * http.c - serving the API over libmicrohttpd: the daemon, and the access
 * handler that takes a request from its first byte to its answer.
 *
 * Following libmicrohttpd's own examples, per-request state is allocated on
 * the first call of the access handler (request_begin: the route is found,
 * the guard consulted, the body admitted), the body is gathered over the
 * following calls (http_body.c), the answer is queued on the last, and
 * everything is freed in the request-completed callback whatever happened.
 *
 * Threading model.  A few I/O threads (--io-threads, libmicrohttpd's thread
 * pool, each with its own epoll set) read and write every socket and never
 * wait for anything else: an open connection costs a file descriptor and
 * libmicrohttpd's per-connection buffer, not a thread.  The route table
 * (route.h) says which thread answers a complete request: a cheap one (the
 * probes, /metrics, /v1/info, listings, preflights, every error decided by
 * the path) is answered on its I/O thread; any other is handed to the
 * --max-inflight workers (http_queue.c).  A small computation skips the
 * hand-off, which would cost more than the work: a request of a computing
 * route with a body of at most --inline-max-bytes is first tried on its I/O
 * thread (inline_candidate), where the API answers it only if its work is
 * below ATTENTION_SMALL_FLOPS and a compute slot is free, and hands it back
 * for a worker otherwise.  Workers compute through the compute pool
 * (compute.h), which holds arithmetic to the cores.  Slow and vanished
 * clients are the reaper's (http_conn.c).
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "router/api.h"
#include "message/answer.h"
#include "http_private.h"
#include "work/work_queue.h"
#include "core/mem.h"

/* Fixes the number of I/O threads at build time (make bench-mhd builds one
 * server per value); 0 leaves it to --io-threads. */
#ifndef HTTP_POOL_THREADS
#define HTTP_POOL_THREADS 0
#endif

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

/* The query parameters of a request, gathered for guard_check. */
typedef struct arg_list {
    guard_header items[GUARD_MAX_ARGS];
    size_t count;
} arg_list;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    (void)kind;
    arg_list *list = cls;
    if (list->count < GUARD_MAX_ARGS)
        list->items[list->count] = (guard_header){key, value != NULL ? value : ""};
    list->count++;
    return MHD_YES;
}

/* libmicrohttpd hands the access handler the path without its query; the
 * target as the client sent it, which the guard limits, is seen only here,
 * before it is split.  Kept on the connection; returns NULL, leaving the
 * request's state to request_begin. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *hc = info != NULL ? info->socket_context : NULL;
    if (hc != NULL)
        hc->target_bytes = strlen(uri);
    return NULL;
}

/* Runs the guard over a new request; returns 0 when it may go on, else the
 * ERR_* code with err and v filled. */
static int guard_request_check(http_server *srv, struct MHD_Connection *conn,
                               const http_conn *hc, const char *url, const char *method,
                               const char *version, int probe, guard_verdict *v,
                               attn_error *err)
{
    header_list headers;
    headers.count = 0;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &headers);
    arg_list args;
    args.count = 0;
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect_arg, &args);
    guard_request rq = {.method = method, .path = url, .version = version,
                        .target_bytes = hc != NULL ? hc->target_bytes : 0,
                        .headers = headers.items, .header_count = headers.count,
                        .args = args.items, .arg_count = args.count, .probe = probe};
    return guard_check(srv->guard, &rq, v, err);
}

/* Decodes the path and query arguments for libmicrohttpd (see guard_unescape). */
static size_t unescape_path(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    return guard_unescape(s);
}

/* Reads X-Deadline-Ms: a positive whole number of milliseconds, or 0 when
 * absent; -1 when malformed. */
static long request_deadline_ms(struct MHD_Connection *conn)
{
    const char *text = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Deadline-Ms");
    if (text == NULL)
        return 0;
    char *end;
    errno = 0;
    long ms = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || ms <= 0)
        return -1;
    return ms;
}

/* May hr, complete, be tried on the I/O thread that read it?  Decided
 * before any parsing, from what is already known: a request of a computing
 * route (ROUTE_INLINE in route.c: v1 attention, v2 infer; never a weight-set
 * PUT or DELETE, which write files) whose body is at most
 * --inline-max-bytes.  The API then answers it only when its work proves
 * small and a compute slot is free right now (api_request.io_thread);
 * otherwise it comes back deferred, for a worker.
 * So an I/O thread holds its other connections up for at most: parsing a
 * body of --inline-max-bytes (4 KiB by default: tens of microseconds), work
 * below ATTENTION_SMALL_FLOPS counting the answer's numbers (about a
 * millisecond), and writing that answer. */
static int inline_candidate(const http_server *srv, const http_request *hr, route_cost cost)
{
    return cost == ROUTE_INLINE && hr->len <= srv->cfg->inline_max_bytes;
}

const char *http_query_arg(const void *conn, const char *key)
{
    return MHD_lookup_connection_value((struct MHD_Connection *)conn, MHD_GET_ARGUMENT_KIND, key);
}

/* The first call for a request: its state, its body admission. */
static enum MHD_Result request_begin(http_server *srv, struct MHD_Connection *conn,
                                     const char *url, const char *method, const char *version,
                                     void **con_cls)
{
    http_request *hr = mem_calloc(1, sizeof *hr);
    if (hr == NULL)
        return MHD_NO;
    hr->start = compute_now();
    hr->srv = srv;
    hr->conn = conn;
    hr->mhd_method = method;
    hr->mhd_url = url;
    hr->route = route_find(url, &hr->args);
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hr->hc = info != NULL ? info->socket_context : NULL;
    http_conn_set_phase(hr->hc, CONN_BODY);
    snprintf(hr->method, sizeof hr->method, "%s", method);
    snprintf(hr->path, sizeof hr->path, "%s", url);
    trace_printable(hr->path);
    trace_begin(&hr->trace, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent"),
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "tracestate"),
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id"));
    *con_cls = hr;
    metrics_inflight_add(1);
    attn_error err;
    guard_verdict verdict;
    if (guard_request_check(srv, conn, hr->hc, url, method, version, hr->route->probe,
                            &verdict, &err) != 0) {
        hr->too_large = 1; /* whatever body follows is dropped unread */
        return http_queue_error(srv, conn, hr, &err, &verdict);
    }
    /* Read here, once: the body's placement (http_body.c) and v2's split take the number. */
    hr->inference_header_length = api_length_parse(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Inference-Header-Content-Length"));
    hr->if_match = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "If-Match");
    hr->accept_encoding = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept-Encoding");
    hr->deadline_ms = request_deadline_ms(conn);
    if (hr->deadline_ms < 0) {
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "X-Deadline-Ms",
                  "X-Deadline-Ms must be a positive whole number of milliseconds.");
        return http_queue_error(srv, conn, hr, &err, NULL);
    }
    return http_body_admit(srv, conn, hr, method);
}

/* Answers a complete request that is not cheap: on its I/O thread when it
 * is an inline candidate that proves small, else by a worker. */
static enum MHD_Result hand_over(http_server *srv, struct MHD_Connection *conn, http_request *hr,
                                 route_cost cost)
{
    http_conn_set_phase(hr->hc, CONN_BUSY);
    http_request_token_start(srv, hr);
    hr->handed = 1;
    hr->answered_by = PATH_WORKER;
    if (inline_candidate(srv, hr, cost)) {
        http_request_handle(hr, 1);
        if (!hr->resp.deferred) {
            hr->answered_by = PATH_INLINE;
            return http_queue_answer(srv, conn, hr, &hr->resp, 0, NULL);
        }
        api_response_free(&hr->resp);
        memset(&hr->resp, 0, sizeof hr->resp);
        hr->answered_by = PATH_DEFERRED;
    }
    http_dispatch(srv, hr);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_server *srv = cls;
    http_request *hr = *con_cls;
    if (hr == NULL)
        return request_begin(srv, conn, url, method, version, con_cls);
    if (*upload_data_size != 0) {
        if (hr->status == 0 &&
            http_body_receive(hr, srv->cfg->max_body, upload_data, *upload_data_size) != 0)
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (hr->status != 0)
        return MHD_YES; /* already answered (early 413 or 503) */
    if (hr->job == JOB_DONE) {
        hr->job = JOB_NONE;
        return http_queue_answer(srv, conn, hr, &hr->resp, 0, NULL);
    }
    if (hr->job != JOB_NONE)
        return MHD_YES; /* still with a worker (spurious call) */
    http_trace_phase(hr, TRACE_PHASE_READ, compute_now() - hr->start);
    attn_error err;
    if (http_body_refused(srv, hr, &err))
        return http_queue_error(srv, conn, hr, &err, NULL);
    route_cost cost = route_request_cost(hr->route, method);
    if (cost != ROUTE_CHEAP && work_queue_workers() > 0)
        return hand_over(srv, conn, hr, cost);
    api_request req = {.method = method, .path = url, .body = hr->body, .body_len = hr->len,
                       .inference_header_length = hr->inference_header_length,
                       .if_match = hr->if_match, .route = hr->route, .args = &hr->args,
                       .query_arg = http_query_arg, .query_ctx = conn, .protocol = "http"};
    api_response resp;
    api_handle(&req, &resp);
    return http_queue_answer(srv, conn, hr, &resp, !strcmp(method, "OPTIONS"), NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_server *srv = cls;
    http_request *hr = *con_cls;
    if (hr == NULL)
        return;
    double seconds = compute_now() - hr->start;
    metrics_observe(hr->route->id, hr->status, seconds, hr->bytes_in, hr->bytes_out);
    if (hr->handed)
        metrics_path_observe(hr->answered_by);
    metrics_inflight_add(-1);
    static const char *const via[PATH_COUNT] = {"inline", "worker", "deferred"};
    if (!srv->cfg->quiet)
        http_trace_log(hr, conn, seconds, hr->handed ? via[hr->answered_by] : "io",
                       toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    http_conn_set_phase(hr->hc, CONN_WAIT_HEADERS);
    http_body_release(hr);
    api_response_free(&hr->resp);
    compress_inflater_free(hr->inflater);
    http_body_free(hr);
    int large = hr->bytes_in >= MEM_GIVE_BACK_FROM || hr->bytes_out >= MEM_GIVE_BACK_FROM;
    mem_free(hr);
    *con_cls = NULL;
    if (large)
        mem_give_back(); /* whatever the outcome: a refused body is as large */
}

/* libmicrohttpd's own messages (a client that sent garbage, a failed TLS
 * handshake) count as access log: --quiet drops them. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    const http_server *srv = cls;
    if (srv->cfg->quiet)
        return;
    if (!strcmp(srv->cfg->log_format, "json")) {
        http_trace_log_library(fmt, ap);
        return;
    }
    fputs("libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* The number of I/O threads: --io-threads, which main.c's sizing_resolve
 * (core/sizing.h) has set from the CPUs when it was 0. */
static unsigned io_thread_count(const server_config *cfg)
{
    if (HTTP_POOL_THREADS > 0)
        return HTTP_POOL_THREADS;
    return cfg->io_threads > 0 ? (unsigned)cfg->io_threads : 1;
}

/* Room for the daemon's options, the terminating MHD_OPTION_END included. */
#define HTTP_MAX_OPTIONS 16

/* Fills options (HTTP_MAX_OPTIONS entries) with the daemon's options after
 * the logger, ending with MHD_OPTION_END.  Options are added here, one entry
 * each; the thread pool size is left out when there is one I/O thread, as
 * libmicrohttpd warns about a pool of 0 or 1. */
static void daemon_options(http_server *srv, const struct sockaddr *addr,
                           struct MHD_OptionItem *options)
{
    const server_config *cfg = srv->cfg;
    size_t n = 0;
    unsigned io = io_thread_count(cfg);
    if (io > 1)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)io, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)addr};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED,
                                           (intptr_t)&on_completed, srv};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION,
                                           (intptr_t)&http_on_connection, srv};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                           (intptr_t)cfg->max_connections, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                           (intptr_t)cfg->max_connections_per_ip, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                           (intptr_t)cfg->timeout, NULL};
    /* No SO_REUSEPORT: a second server on a busy port must fail to start, not
     * take half of the connections (libmicrohttpd's default, SO_REUSEADDR,
     * still lets a restart bind while old connections are in TIME_WAIT). */
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)&on_uri, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK,
                                           (intptr_t)&unescape_path, NULL};
    if (srv->tls_cert != NULL) {
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key};
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert};
    }
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

static void server_free(http_server *srv)
{
    for (size_t i = 0; i < srv->static_z_count; i++)
        mem_free(srv->static_z[i].z);
    pthread_mutex_destroy(&srv->static_lock);
    pthread_mutex_destroy(&srv->lock);
    pthread_mutex_destroy(&srv->dispatch_lock);
    pthread_cond_destroy(&srv->reaper_wake);
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
    pthread_mutex_init(&srv->lock, NULL);
    pthread_mutex_init(&srv->dispatch_lock, NULL);
    pthread_mutex_init(&srv->static_lock, NULL);
    pthread_cond_init(&srv->reaper_wake, NULL);
    srv->guard = guard_new(cfg, err);
    if (srv->guard == NULL || tls_load(srv, err) != 0) {
        server_free(srv);
        freeaddrinfo(ai);
        return NULL;
    }
    if (http_threads_start(srv) != 0) {
        server_free(srv);
        freeaddrinfo(ai);
        error_set(err, ERR_INTERNAL, "threads_failed", NULL, "Cannot start the reaper thread.");
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (srv->tls_cert != NULL)
        flags |= MHD_USE_TLS;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_OptionItem options[HTTP_MAX_OPTIONS];
    daemon_options(srv, ai->ai_addr, options);
    /* The logger first, so that it receives libmicrohttpd's messages about
     * the options that follow. */
    srv->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, &http_accept_policy, srv,
                                   &on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, srv,
                                   MHD_OPTION_ARRAY, options, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (srv->daemon == NULL) {
        http_threads_stop(srv);
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
    /* Requests still queued are answered 503 and resumed; the workers finish
     * what they run of this server's (compute_stop_all makes that quick).  Only
     * then is libmicrohttpd stopped, with no connection suspended. */
    pthread_mutex_lock(&server->dispatch_lock);
    server->draining = 1;
    pthread_mutex_unlock(&server->dispatch_lock);
    attn_error err;
    answer_draining_error(&err);
    work_queue_drain(server, &err);
    http_threads_stop(server);
    MHD_stop_daemon(server->daemon);
    server_free(server);
}

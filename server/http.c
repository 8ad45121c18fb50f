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
 *
 * Threading model.  A few I/O threads (--io-threads, libmicrohttpd's thread
 * pool, each with its own epoll set) read and write every socket and never
 * wait for anything else: an open connection costs a file descriptor and
 * libmicrohttpd's per-connection buffer, not a thread.  Cheap requests (the
 * probes, /metrics, /v1/info, listings, preflights) are answered on the I/O
 * thread.  Every other request is handed over complete: its connection is
 * suspended (MHD_suspend_connection), the request joins a queue served by
 * --max-inflight worker threads, and the worker resumes the connection when
 * the answer is ready, so the I/O thread goes on serving other sockets in
 * between.  A small computation skips the hand-off, which would cost more
 * than the work: a POST with a body of at most --inline-max-bytes is first
 * tried on its I/O thread (inline_candidate), where the API answers it only
 * if its work is below ATTENTION_SMALL_FLOPS and a compute slot is free, and
 * hands it back for a worker otherwise (request_handle, shared with the
 * workers).  Workers compute through the compute pool (compute.h), which
 * holds arithmetic to the cores.  A request that finds no worker free within
 * --queue-wait-ms is answered 503 with Retry-After.
 *
 * Slow clients.  libmicrohttpd's own timeout (--timeout) closes only silent
 * connections, so every connection also has a record here, made and
 * dropped by the connection-notify callback, that says which phase it is in
 * (waiting for headers, receiving a body, being answered) and since when.
 * A reaper thread looks at the records a few times a second and closes a
 * connection whose headers have not arrived within --header-timeout, or
 * whose body averages less than --min-body-rate after that.  It closes with
 * shutdown(2), never close(2): the descriptor stays libmicrohttpd's, whose
 * next read sees end-of-file and which then closes and frees the connection
 * itself.  The record is removed under the server's lock by the notify
 * callback, which libmicrohttpd calls before it closes the descriptor, so
 * the reaper (which holds the same lock) never touches a descriptor that
 * could have been reused.  The same reaper peeks (MSG_PEEK) at the sockets
 * of suspended requests: a client that has gone away stops its computation
 * (compute_token_stop), which ends within one block of keys, and a request
 * still queued is dropped.
 *
 * Memory.  A request's body reserves its estimated peak (the body and the
 * tree parsed from it) in the process budget (budget.h) as it arrives, in
 * doubling steps, never for bytes that have not come: a client that
 * announces a large body and sends it slowly holds little.  The
 * reservation goes through the sender's share (budget_client.h), so one
 * address holds at most --max-memory-share of the budget however many
 * connections it opens.  A step that does not fit drops the body and the
 * request is answered 503 with Retry-After once it has been read (the
 * reaper closes it sooner if it crawls): libmicrohttpd 0.9.75 takes an
 * answer only before the body or after all of it (MHD_queue_response), and
 * closing at once would leave an honest client without one.  An announced
 * body that could never fit is 413 at its headers.  Everything is released
 * when the request ends.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "api.h"
#include "budget.h"
#include "budget_client.h"
#include "compute.h"
#include "guard.h"
#include "mem.h"
#include "metrics.h"

/* Fixes the number of I/O threads at build time (make bench-mhd builds one
 * server per value); 0 leaves it to --io-threads. */
#ifndef HTTP_POOL_THREADS
#define HTTP_POOL_THREADS 0
#endif

/* Bytes a request parsed as JSON may need per byte of its body at its peak:
 * the body itself plus the JSON tree, which for short numbers ("0,") takes
 * up to about 24 bytes per byte of text (a boxed number and its slot). */
#define HTTP_BODY_MEMORY_FACTOR 25

/* The smallest step, in body bytes, in which a body's memory is reserved
 * as it arrives (each step doubles what has arrived, up to the announced
 * length): few reservations per request, and never much more than twice
 * what has arrived. */
#define HTTP_BODY_STEP ((size_t)64 << 10)

/* How often the reaper looks at the connections. */
#define HTTP_REAPER_MS 100

typedef enum {
    CONN_WAIT_HEADERS,          /* since opening, or since the previous answer */
    CONN_BODY,                  /* headers arrived; the body is coming */
    CONN_BUSY                   /* complete: being worked on or answered */
} conn_phase;

/* One open connection, from libmicrohttpd's STARTED notification to its
 * CLOSED one.  phase and phase_start change under the server's lock. */
typedef struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    conn_phase phase;
    double phase_start;
    atomic_size_t body_bytes;   /* of the current request */
    int shut;                   /* the reaper has shut it down */
} http_conn;

typedef enum { JOB_NONE, JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

typedef struct http_request http_request;

struct http_server {
    struct MHD_Daemon *daemon;
    const server_config *cfg;
    guard *guard;
    char *tls_cert, *tls_key;   /* PEM text, kept while the daemon runs */
    unsigned port;
    pthread_mutex_t lock;
    pthread_cond_t work;        /* a request was queued, or stopping */
    http_conn *conns;           /* every open connection */
    http_request *queue_head, *queue_tail;
    http_request *running;      /* requests a worker is on */
    pthread_t *workers;
    unsigned worker_count;
    pthread_t reaper;
    int reaper_started;
    pthread_cond_t reaper_wake;
    int stopping;
    atomic_long slow_closed;    /* connections the reaper closed */
};

/* State of one request, from its first byte to its completion. */
struct http_request {
    struct timespec start;
    http_server *srv;
    struct MHD_Connection *conn;
    http_conn *hc;
    char *body;
    size_t len, cap;
    int too_large;
    int no_memory;              /* the body outgrew the budget or its client's share */
    size_t no_memory_need;      /* what it needed then, bytes */
    int status;
    size_t bytes_in, bytes_out;
    size_t reserved;            /* bytes held in the budget, through client */
    budget_client *client;      /* the sender's share of the budget, once looked up */
    int client_known;           /* client has been looked up (it may be NULL) */
    size_t announced;           /* Content-Length; 0 when none or chunked */
    int parses_body;            /* reserves HTTP_BODY_MEMORY_FACTOR per byte */
    metrics_route route;
    char method[12];            /* for the access log */
    char path[96];
    /* Hand-off to a worker (fields below under srv->lock while queued or running). */
    const char *mhd_method, *mhd_url;   /* libmicrohttpd's, valid until completion */
    const char *inference_header_length; /* the v2 header, or NULL; likewise */
    const char *if_match;               /* If-Match, or NULL; likewise */
    http_request *qprev, *qnext;
    job_state job;
    double queued_at;
    long deadline_ms;           /* the request's own X-Deadline-Ms, 0 for none */
    compute_token token;
    api_response resp;
    int handed;                 /* answered_by is set (else: its I/O thread, as a cheap request) */
    metrics_path answered_by;
};

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

static void conn_set_phase(http_server *srv, http_conn *hc, conn_phase phase)
{
    if (hc == NULL)
        return;
    pthread_mutex_lock(&srv->lock);
    hc->phase = phase;
    hc->phase_start = compute_now();
    if (phase == CONN_BODY)
        atomic_store(&hc->body_bytes, 0);
    pthread_mutex_unlock(&srv->lock);
}

/* Reserves `bytes` more in the budget for hr, within its client's share.
 * Returns 0, or -1 (nothing more reserved). */
static int request_reserve(http_request *hr, size_t bytes)
{
    /* Looked up on the first reservation, so that requests without a body
     * never take the clients' lock. */
    if (!hr->client_known) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(hr->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        hr->client = budget_client_get(info != NULL ? info->client_addr : NULL);
        hr->client_known = 1;
    }
    if (budget_client_reserve(hr->client, bytes) != 0)
        return -1;
    hr->reserved += bytes;
    return 0;
}

/* 1 when `need` bytes could never be held for one client: more than the
 * whole budget or than one address's share of it (so 413, not 503). */
static int body_never_fits(size_t need)
{
    size_t share = budget_client_cap();
    return !budget_could_fit(need) || (share != 0 && need > share);
}

/* Fills err with the 413 for a body of `bytes` that needs `need` bytes. */
static int body_never_fits_error(attn_error *err, unsigned long long bytes, size_t need)
{
    size_t share = budget_client_cap();
    return error_set(err, ERR_TOO_LARGE, "body_too_large", NULL,
                     "Handling a body of %llu bytes needs about %zu MiB, more than one client "
                     "may hold of the server's memory budget: %zu MiB (--max-memory, "
                     "--max-memory-share).", bytes, need >> 20,
                     (share != 0 ? share : budget_limit()) >> 20);
}

/* Appends data to the request body within the limit; past it, drops the body
 * and marks the request too large.  The body reserves its memory as it
 * arrives, announced or not; when the budget or the client's share cannot
 * cover it, the body is dropped (and its reservation given back) and the
 * request is answered 503 once it has been read.  Returns -1 when out of
 * memory. */
static int body_append(http_request *hr, size_t limit, const char *data, size_t n)
{
    hr->bytes_in += n;
    if (hr->hc != NULL)
        atomic_fetch_add(&hr->hc->body_bytes, n);
    if (hr->too_large || hr->no_memory)
        return 0;
    if (hr->len + n > limit) {
        hr->too_large = 1;
        mem_free(hr->body);
        hr->body = NULL;
        hr->len = hr->cap = 0;
        return 0;
    }
    size_t factor = hr->parses_body ? HTTP_BODY_MEMORY_FACTOR : 1;
    size_t covered = hr->reserved / factor;
    if (hr->len + n > covered) {
        size_t target = 2 * (hr->len + n);
        if (target < HTTP_BODY_STEP)
            target = HTTP_BODY_STEP;
        size_t most = hr->announced != 0 ? hr->announced : limit;
        if (target > most)
            target = most;
        /* A step never asks past the client's share for what would fit in it,
         * so that a refusal means "taken now" (503) or "never" (413). */
        size_t share = budget_client_cap() / factor;
        if (share != 0 && target > share && share >= hr->len + n)
            target = share;
        if (request_reserve(hr, (target - covered) * factor) != 0) {
            hr->no_memory = 1;
            hr->no_memory_need = (hr->len + n) * factor;
            mem_free(hr->body);
            hr->body = NULL;
            hr->len = hr->cap = 0;
            budget_client_release(hr->client, hr->reserved);
            hr->reserved = 0;
            return 0;
        }
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
    conn_set_phase(srv, hr->hc, CONN_BUSY);
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
    /* A preflight allows the route's methods (its writes only to the origins
     * that may write, cors.h) and the headers the API reads, never whatever
     * the browser asked for. */
    if (preflight && resp->allow != NULL && origin != NULL) {
        char methods[64];
        MHD_add_response_header(
            r, "Access-Control-Allow-Methods",
            guard_cors_methods(srv->guard, resp->allow,
                               MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"),
                               MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host"),
                               methods, sizeof methods));
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

/* Fills resp with the JSON error for err on the route of url. */
static void error_response(api_response *resp, const char *url, const attn_error *err)
{
    memset(resp, 0, sizeof *resp);
    resp->route = api_route(url, &resp->allow);
    api_respond_error(resp, err);
}

static enum MHD_Result queue_error(http_server *srv, struct MHD_Connection *conn,
                                   http_request *hr, const char *url, const attn_error *err,
                                   const guard_verdict *v)
{
    api_response resp;
    error_response(&resp, url, err);
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

/* Requests always answered on the I/O thread: those that neither read a
 * body nor can take long. */
static int cheap_request(const char *method, const char *url)
{
    if (!strcmp(method, "OPTIONS"))
        return 1;
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return 0;
    const char *allow;
    return api_route(url, &allow) != ROUTE_WEIGHT_SET;
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
 * before any parsing, from what is already known: a POST to a computing
 * route (v1 attention, v2 infer; never a PUT or DELETE, which write files)
 * whose body is at most --inline-max-bytes.  The API then answers it only
 * when its work proves small and a compute slot is free right now
 * (api_request.io_thread); otherwise it comes back deferred, for a worker.
 * So an I/O thread holds its other connections up for at most: parsing a
 * body of --inline-max-bytes (4 KiB by default: tens of microseconds), work
 * below ATTENTION_SMALL_FLOPS counting the answer's numbers (about a
 * millisecond), and writing that answer. */
static int inline_candidate(const http_server *srv, const http_request *hr, const char *method,
                            const char *url)
{
    if (hr->len > srv->cfg->inline_max_bytes || strcmp(method, "POST") != 0)
        return 0;
    const char *allow;
    metrics_route route = api_route(url, &allow);
    return route == ROUTE_ATTENTION || route == ROUTE_V2_INFER;
}

/* Starts the request's compute token: its deadline (--deadline, or its own
 * lower X-Deadline-Ms) runs from here, whichever thread computes. */
static void request_token_start(http_server *srv, http_request *hr)
{
    double seconds = (double)srv->cfg->deadline;
    if (hr->deadline_ms > 0 && (double)hr->deadline_ms / 1000.0 < seconds)
        seconds = (double)hr->deadline_ms / 1000.0;
    hr->token.deadline = compute_now() + seconds;
    atomic_init(&hr->token.reason, COMPUTE_RUNNING);
}

/* Answers hr into hr->resp on the calling thread, under its token: the work
 * of a worker (io_thread 0), or of the I/O thread for an inline candidate
 * (io_thread 1: hr->resp.deferred may come back set, with nothing else). */
static void request_handle(http_request *hr, int io_thread)
{
    compute_bind(&hr->token);
    attn_error err;
    error_clear(&err);
    if (compute_stop_error(&err) != 0) {
        error_response(&hr->resp, hr->mhd_url, &err);
    } else {
        api_request req = {hr->mhd_method, hr->mhd_url, hr->body, hr->len,
                           hr->inference_header_length, hr->if_match, io_thread};
        api_handle(&req, &hr->resp);
    }
    compute_bind(NULL);
}

/* Unlinks hr from the queue (under srv->lock). */
static void queue_remove(http_server *srv, http_request *hr)
{
    if (hr->qprev != NULL)
        hr->qprev->qnext = hr->qnext;
    else
        srv->queue_head = hr->qnext;
    if (hr->qnext != NULL)
        hr->qnext->qprev = hr->qprev;
    else
        srv->queue_tail = hr->qprev;
    hr->qprev = hr->qnext = NULL;
}

/* Suspends the connection of a complete request, whose token has started,
 * and queues it for a worker. */
static void dispatch(http_server *srv, http_request *hr)
{
    hr->queued_at = compute_now();
    /* Suspend first: a worker may resume the connection as soon as the
     * request is in the queue. */
    MHD_suspend_connection(hr->conn);
    pthread_mutex_lock(&srv->lock);
    hr->job = JOB_QUEUED;
    hr->qprev = srv->queue_tail;
    hr->qnext = NULL;
    if (srv->queue_tail != NULL)
        srv->queue_tail->qnext = hr;
    else
        srv->queue_head = hr;
    srv->queue_tail = hr;
    pthread_cond_signal(&srv->work);
    pthread_mutex_unlock(&srv->lock);
}

/* Ends a queued request without running it (under srv->lock): its answer is
 * the error, and it joins *resume, the list of connections the caller
 * resumes (resume_all) once it has let go of the lock.  libmicrohttpd is
 * never called under srv->lock, as its threads take that lock inside their
 * callbacks. */
static void finish_unrun(http_server *srv, http_request *hr, const attn_error *err,
                         http_request **resume)
{
    queue_remove(srv, hr);
    error_response(&hr->resp, hr->mhd_url, err);
    hr->job = JOB_DONE;
    hr->qnext = *resume;
    *resume = hr;
}

/* Resumes every connection of the list (outside srv->lock); each request
 * belongs to its I/O thread again from its call on. */
static void resume_all(http_request *list)
{
    while (list != NULL) {
        http_request *next = list->qnext;
        list->qnext = NULL;
        MHD_resume_connection(list->conn);
        list = next;
    }
}

static void *worker_main(void *arg)
{
    http_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    for (;;) {
        while (srv->queue_head == NULL && !srv->stopping)
            pthread_cond_wait(&srv->work, &srv->lock);
        if (srv->queue_head == NULL)
            break;
        http_request *hr = srv->queue_head;
        queue_remove(srv, hr);
        hr->job = JOB_RUNNING;
        hr->qnext = srv->running;
        if (srv->running != NULL)
            srv->running->qprev = hr;
        srv->running = hr;
        pthread_mutex_unlock(&srv->lock);

        request_handle(hr, 0);

        pthread_mutex_lock(&srv->lock);
        if (hr->qprev != NULL)
            hr->qprev->qnext = hr->qnext;
        else
            srv->running = hr->qnext;
        if (hr->qnext != NULL)
            hr->qnext->qprev = hr->qprev;
        hr->qprev = hr->qnext = NULL;
        hr->job = JOB_DONE;
        pthread_mutex_unlock(&srv->lock);
        /* From this call on hr belongs to the I/O thread again. */
        MHD_resume_connection(hr->conn);
        pthread_mutex_lock(&srv->lock);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

/* 1 when the peer of fd has closed its side or reset the connection. */
static int peer_gone(int fd)
{
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* One look at every connection and every handed-over request (under
 * srv->lock); requests ended here join *resume. */
static void reap_once(http_server *srv, http_request **resume)
{
    const server_config *cfg = srv->cfg;
    double now = compute_now();
    for (http_conn *hc = srv->conns; hc != NULL; hc = hc->next) {
        if (hc->shut || hc->fd < 0)
            continue;
        double elapsed = now - hc->phase_start;
        int slow = 0;
        if (hc->phase == CONN_WAIT_HEADERS)
            slow = elapsed > (double)cfg->header_timeout;
        else if (hc->phase == CONN_BODY && cfg->min_body_rate > 0 &&
                 elapsed > (double)cfg->header_timeout)
            slow = (double)atomic_load(&hc->body_bytes) < (double)cfg->min_body_rate * elapsed;
        if (slow) {
            shutdown(hc->fd, SHUT_RDWR);
            hc->shut = 1;
            atomic_fetch_add(&srv->slow_closed, 1);
        }
    }
    double queue_wait = (double)cfg->queue_wait_ms / 1000.0;
    for (http_request *hr = srv->queue_head, *next; hr != NULL; hr = next) {
        next = hr->qnext;
        attn_error err;
        error_clear(&err);
        if (hr->hc != NULL && hr->hc->fd >= 0 && peer_gone(hr->hc->fd)) {
            compute_token_stop(&hr->token, COMPUTE_CLIENT_GONE);
            error_set(&err, ERR_UNAVAILABLE, "client_closed", NULL,
                      "The client closed its connection before the request was started.");
        } else if (now > hr->token.deadline) {
            compute_token_stop(&hr->token, COMPUTE_DEADLINE);
            compute_bind(&hr->token);
            compute_stop_error(&err);
            compute_bind(NULL);
        } else if (now - hr->queued_at > queue_wait) {
            error_set(&err, ERR_UNAVAILABLE, "overloaded", NULL,
                      "Every one of the server's %ld workers stayed busy for %ld ms "
                      "(--max-inflight, --queue-wait-ms); retry shortly.",
                      cfg->max_inflight, cfg->queue_wait_ms);
        } else {
            continue;
        }
        finish_unrun(srv, hr, &err, resume);
    }
    for (http_request *hr = srv->running; hr != NULL; hr = hr->qnext)
        if (hr->hc != NULL && hr->hc->fd >= 0 && peer_gone(hr->hc->fd))
            compute_token_stop(&hr->token, COMPUTE_CLIENT_GONE);
}

static void *reaper_main(void *arg)
{
    http_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += HTTP_REAPER_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&srv->reaper_wake, &srv->lock, &until);
        if (srv->stopping)
            break;
        http_request *resume = NULL;
        reap_once(srv, &resume);
        pthread_mutex_unlock(&srv->lock);
        resume_all(resume);
        pthread_mutex_lock(&srv->lock);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    http_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *hc = mem_calloc(1, sizeof *hc);
        *socket_context = hc;
        if (hc == NULL)
            return; /* served, but not watched */
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc->fd = info != NULL ? info->connect_fd : -1;
        hc->phase = CONN_WAIT_HEADERS;
        hc->phase_start = compute_now();
        atomic_init(&hc->body_bytes, 0);
        pthread_mutex_lock(&srv->lock);
        hc->next = srv->conns;
        if (srv->conns != NULL)
            srv->conns->prev = hc;
        srv->conns = hc;
        pthread_mutex_unlock(&srv->lock);
        return;
    }
    http_conn *hc = *socket_context;
    if (hc == NULL)
        return;
    /* libmicrohttpd closes the descriptor after this returns: unlink first,
     * so that the reaper never shuts down a reused descriptor. */
    pthread_mutex_lock(&srv->lock);
    if (hc->prev != NULL)
        hc->prev->next = hc->next;
    else
        srv->conns = hc->next;
    if (hc->next != NULL)
        hc->next->prev = hc->prev;
    pthread_mutex_unlock(&srv->lock);
    mem_free(hc);
    *socket_context = NULL;
}

/* The first call for a request: its state, its body admission. */
static enum MHD_Result request_begin(http_server *srv, struct MHD_Connection *conn,
                                     const char *url, const char *method, const char *version,
                                     void **con_cls)
{
    http_request *hr = mem_calloc(1, sizeof *hr);
    if (hr == NULL)
        return MHD_NO;
    clock_gettime(CLOCK_MONOTONIC, &hr->start);
    hr->srv = srv;
    hr->conn = conn;
    hr->mhd_method = method;
    hr->mhd_url = url;
    hr->route = ROUTE_OTHER;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hr->hc = info != NULL ? info->socket_context : NULL;
    conn_set_phase(srv, hr->hc, CONN_BODY);
    snprintf(hr->method, sizeof hr->method, "%s", method);
    /* Keep the path printable: control characters become '?'. */
    snprintf(hr->path, sizeof hr->path, "%s", url);
    for (char *p = hr->path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    *con_cls = hr;
    metrics_inflight_add(1);
    attn_error err;
    guard_verdict verdict;
    if (guard_request_check(srv, conn, url, method, version, &verdict, &err) != 0) {
        hr->too_large = 1; /* whatever body follows is dropped unread */
        return queue_error(srv, conn, hr, url, &err, &verdict);
    }
    hr->inference_header_length =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    hr->if_match = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "If-Match");
    hr->deadline_ms = request_deadline_ms(conn);
    if (hr->deadline_ms < 0) {
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "X-Deadline-Ms",
                  "X-Deadline-Ms must be a positive whole number of milliseconds.");
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    hr->parses_body = !strcmp(method, "POST") || !strcmp(method, "PUT");
    const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length == NULL)
        return MHD_YES; /* no body, or a chunked one: reserved as it grows */
    char *end;
    unsigned long long n = strtoull(length, &end, 10);
    if (*end != '\0')
        return MHD_YES; /* libmicrohttpd answers a malformed length itself */
    if (n > srv->cfg->max_body) {
        hr->too_large = 1;
        error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body has %llu bytes, more than the server's limit of %zu bytes "
                  "(--max-body).", n, srv->cfg->max_body);
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    /* Nothing is reserved yet (body_append reserves as the body arrives),
     * but a body that could never fit is refused before it is sent. */
    hr->announced = (size_t)n;
    size_t need = (size_t)n * (hr->parses_body ? HTTP_BODY_MEMORY_FACTOR : 1);
    if (body_never_fits(need)) {
        hr->too_large = 1;
        body_never_fits_error(&err, n, need);
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_server *srv = cls;
    http_request *hr = *con_cls;
    attn_error err;
    if (hr == NULL)
        return request_begin(srv, conn, url, method, version, con_cls);
    if (*upload_data_size != 0) {
        if (hr->status == 0 &&
            body_append(hr, srv->cfg->max_body, upload_data, *upload_data_size) != 0)
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (hr->status != 0)
        return MHD_YES; /* already answered (early 413 or 503) */
    if (hr->job == JOB_DONE) {
        hr->job = JOB_NONE;
        return queue_answer(srv, conn, hr, &hr->resp, 0, NULL);
    }
    if (hr->job != JOB_NONE)
        return MHD_YES; /* still with a worker (spurious call) */
    if (hr->too_large) {
        error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body is larger than the server's limit of %zu bytes (--max-body).",
                  srv->cfg->max_body);
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    if (hr->no_memory && body_never_fits(hr->no_memory_need)) {
        body_never_fits_error(&err, hr->bytes_in, hr->no_memory_need);
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    if (hr->no_memory) {
        error_set(&err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "The server's memory budget (--max-memory), or this client's share of it "
                  "(--max-memory-share), could not hold this body now; retry shortly.");
        return queue_error(srv, conn, hr, url, &err, NULL);
    }
    if (!cheap_request(method, url) && srv->worker_count > 0) {
        conn_set_phase(srv, hr->hc, CONN_BUSY);
        request_token_start(srv, hr);
        hr->handed = 1;
        hr->answered_by = PATH_WORKER;
        if (inline_candidate(srv, hr, method, url)) {
            request_handle(hr, 1);
            if (!hr->resp.deferred) {
                hr->answered_by = PATH_INLINE;
                return queue_answer(srv, conn, hr, &hr->resp, 0, NULL);
            }
            api_response_free(&hr->resp);
            memset(&hr->resp, 0, sizeof hr->resp);
            hr->answered_by = PATH_DEFERRED;
        }
        dispatch(srv, hr);
        return MHD_YES;
    }
    api_request req = {method, url, hr->body, hr->len, hr->inference_header_length,
                       hr->if_match, 0};
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
    if (hr->handed)
        metrics_path_observe(hr->answered_by);
    metrics_inflight_add(-1);
    static const char *const via[PATH_COUNT] = {"inline", "worker", "deferred"};
    if (!srv->cfg->quiet)
        fprintf(stderr, "access %s %s status=%d in=%zu out=%zu ms=%.3f via=%s%s\n", hr->method,
                hr->path, hr->status, hr->bytes_in, hr->bytes_out, seconds * 1000.0,
                hr->handed ? via[hr->answered_by] : "io",
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted");
    conn_set_phase(srv, hr->hc, CONN_WAIT_HEADERS);
    if (hr->client_known) {
        budget_client_release(hr->client, hr->reserved);
        budget_client_put(hr->client);
    }
    api_response_free(&hr->resp);
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

/* The number of I/O threads: --io-threads, else one per available CPU, at
 * least two so that one busy socket never holds up the rest. */
static unsigned io_thread_count(const server_config *cfg)
{
    if (HTTP_POOL_THREADS > 0)
        return HTTP_POOL_THREADS;
    if (cfg->io_threads > 0)
        return (unsigned)cfg->io_threads;
    unsigned cpus = compute_available_cpus();
    return cpus < 2 ? 2 : cpus;
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
                                           (intptr_t)&on_connection, srv};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                           (intptr_t)cfg->max_connections, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                           (intptr_t)cfg->max_connections_per_ip, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                           (intptr_t)cfg->timeout, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK,
                                           (intptr_t)&unescape_path, NULL};
    if (srv->tls_cert != NULL) {
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key};
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert};
    }
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

/* Stops and joins the workers and the reaper that were started. */
static void threads_stop(http_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    srv->stopping = 1;
    pthread_cond_broadcast(&srv->work);
    pthread_cond_broadcast(&srv->reaper_wake);
    pthread_mutex_unlock(&srv->lock);
    for (unsigned i = 0; i < srv->worker_count; i++)
        pthread_join(srv->workers[i], NULL);
    srv->worker_count = 0;
    if (srv->reaper_started)
        pthread_join(srv->reaper, NULL);
    srv->reaper_started = 0;
}

static void server_free(http_server *srv)
{
    pthread_mutex_destroy(&srv->lock);
    pthread_cond_destroy(&srv->work);
    pthread_cond_destroy(&srv->reaper_wake);
    guard_free(srv->guard);
    if (srv->tls_key != NULL)
        memset(srv->tls_key, 0, strlen(srv->tls_key));
    mem_free(srv->tls_key);
    mem_free(srv->tls_cert);
    mem_free(srv->workers);
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
    if (srv != NULL)
        srv->workers = mem_calloc((size_t)cfg->max_inflight, sizeof *srv->workers);
    if (srv == NULL || srv->workers == NULL) {
        if (srv != NULL)
            mem_free(srv);
        freeaddrinfo(ai);
        error_nomem(err);
        return NULL;
    }
    srv->cfg = cfg;
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->work, NULL);
    pthread_cond_init(&srv->reaper_wake, NULL);
    atomic_init(&srv->slow_closed, 0);
    srv->guard = guard_new(cfg, err);
    if (srv->guard == NULL || tls_load(srv, err) != 0) {
        server_free(srv);
        freeaddrinfo(ai);
        return NULL;
    }
    for (long i = 0; i < cfg->max_inflight; i++) {
        if (pthread_create(&srv->workers[srv->worker_count], NULL, worker_main, srv) != 0)
            break;
        srv->worker_count++;
    }
    if (srv->worker_count == (unsigned)cfg->max_inflight &&
        pthread_create(&srv->reaper, NULL, reaper_main, srv) == 0)
        srv->reaper_started = 1;
    if (!srv->reaper_started) {
        threads_stop(srv);
        server_free(srv);
        freeaddrinfo(ai);
        error_set(err, ERR_INTERNAL, "threads_failed", NULL, "Cannot start the worker threads.");
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
    srv->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, &on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, srv,
                                   MHD_OPTION_ARRAY, options, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (srv->daemon == NULL) {
        threads_stop(srv);
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

long http_slow_closed(const http_server *server)
{
    return atomic_load(&((http_server *)server)->slow_closed);
}

void http_stop(http_server *server)
{
    if (server == NULL)
        return;
    /* Requests still queued are answered 503 and resumed; the workers finish
     * what they run (compute_stop_all makes that quick) and stop.  Only then
     * is libmicrohttpd stopped, with no connection suspended. */
    pthread_mutex_lock(&server->lock);
    attn_error err;
    error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
              "The server is shutting down and takes no new work; retry on another instance.");
    http_request *resume = NULL;
    while (server->queue_head != NULL)
        finish_unrun(server, server->queue_head, &err, &resume);
    pthread_mutex_unlock(&server->lock);
    resume_all(resume);
    threads_stop(server);
    MHD_stop_daemon(server->daemon);
    server_free(server);
}

/*
 * http_private.h - what the files of the HTTP layer share: the server, the
 * record of an open connection, the state of one request, and the functions
 * one file offers the others.
 *
 *   http.c         the daemon: start and stop, the access handler that takes a
 *                  request from its first byte to its hand-over, completion
 *   http_body.c    gathering a body under --max-body and the memory budget,
 *                  within its sender's share (budget_client.h)
 *   http_queue.c   the worker threads and their queue (suspend and resume)
 *   http_conn.c    the record of every open connection and the reaper of
 *                  slow or vanished clients
 *   http_answer.c  the response and its headers (CORS, Allow, Retry-After ...)
 *   http_trace.c   the trace's headers, Server-Timing, the phases, the access
 *                  line (what they are is trace/trace.h's)
 *
 * Nothing outside these files includes this header.
 */
#ifndef ATTN_HTTP_PRIVATE_H
#define ATTN_HTTP_PRIVATE_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "message/api_message.h"
#include "core/budget_client.h"
#include "work/work_queue.h"
#include "compress.h"
#include "core/compute.h"
#include "core/config.h"
#include "guard/guard.h"
#include "http.h"
#include "trace/trace.h"
#include "metrics/metrics.h"
#include "route/route.h"

typedef enum {
    CONN_WAIT_HEADERS,          /* since opening, or since the previous answer */
    CONN_BODY,                  /* headers arrived; the body is coming */
    CONN_BUSY                   /* complete: being worked on or answered */
} conn_phase;

/* One open connection, from libmicrohttpd's STARTED notification to its
 * CLOSED one.  Its phase and the time it began (phase_at) are one
 * atomic word, written by the thread serving the connection and read by
 * the reaper, so that the reaper never sees a phase with another's start
 * and a request's phase changes take no lock; the links change under the
 * server's lock. */
typedef struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    _Atomic unsigned long long phase_at; /* microseconds of compute_now() << 2 | conn_phase */
    atomic_size_t body_bytes;   /* of the current request */
    int shut;                   /* the reaper has shut it down */
    size_t target_bytes;        /* the current request's target as sent (on_uri) */
} http_conn;

typedef enum { JOB_NONE, JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

typedef struct http_request http_request;

/* Room for compressed copies of static bodies: the visualizer's files, in
 * two codings, with room to spare; past it a static body is compressed per
 * request, as any other. */
#define HTTP_STATIC_Z_MAX 64

/* One static body compressed once (http_answer.c). */
typedef struct http_static_z {
    const char *body;           /* the static body, by address */
    compress_kind kind;
    char *z;                    /* owned; freed with the server */
    size_t len;
} http_static_z;

struct http_server {
    struct MHD_Daemon *daemon;
    const server_config *cfg;
    guard *guard;
    char *tls_cert, *tls_key;   /* PEM text, kept while the daemon runs */
    unsigned port;
    pthread_mutex_t lock;
    pthread_mutex_t dispatch_lock; /* orders a request's queueing after http_stop's drain */
    int draining;               /* http_stop has begun: requests are refused, not queued */
    http_conn *conns;           /* every open connection */
    pthread_t reaper;
    int reaper_started;
    pthread_cond_t reaper_wake;
    int stopping;
    pthread_mutex_t static_lock; /* guards static_z */
    http_static_z static_z[HTTP_STATIC_Z_MAX];
    size_t static_z_count;
};

/* State of one request, from its first byte to its completion. */
struct http_request {
    double start;               /* its first byte, seconds of compute_now() */
    http_server *srv;
    struct MHD_Connection *conn;
    http_conn *hc;
    char *body;
    size_t len, cap;
    size_t body_shift;          /* bytes from the allocation to body (http_body.c, body_place) */
    size_t binary_at;           /* where a v2 body's binary section starts, or 0 (likewise) */
    size_t populated;           /* a whole body's bytes made resident ahead (http_body.c) */
    int too_large;
    compress_inflater *inflater; /* Content-Encoding gzip or deflate; NULL for none */
    int bad_encoding;           /* the compressed body is not of its coding */
    int no_memory;              /* the body outgrew the budget or its client's share */
    size_t no_memory_need;      /* what it needed then, bytes */
    int status;
    size_t bytes_in, bytes_out;
    size_t reserved;            /* bytes held in the budget, through client */
    budget_client *client;      /* the sender's share of the budget, once looked up */
    int client_known;           /* client has been looked up (it may be NULL) */
    size_t announced;           /* Content-Length; 0 when none or chunked */
    int parses_body;            /* reserves HTTP_BODY_MEMORY_FACTOR per byte (http_body.c) */
    size_t json_containers;     /* '{' and '[' of the JSON that has come, outside strings */
    size_t json_commas;         /* ',' likewise: each, one more value in a container */
    size_t json_counted;        /* the bytes those were counted in */
    int json_in_string;         /* the JSON that has come ends inside a string ... */
    int json_escaped;           /* ... right after its backslash */
    const route *route;         /* its row of the route table, found once */
    route_args args;            /* what the row's placeholders captured of the path */
    char method[12];            /* for the access log */
    char path[96];
    /* Hand-off to a worker (fields below under srv->lock while queued or running). */
    const char *mhd_method, *mhd_url;   /* libmicrohttpd's, valid until completion */
    const char *if_match;               /* If-Match, or NULL; likewise */
    const char *accept_encoding;        /* Accept-Encoding, or NULL; likewise */
    api_length inference_header_length; /* the v2 header, read (api_length_parse) */
    /* The encoding of hr->resp, decided by the worker that made it (http_answer_encode):
     * when answer_encoded is set, answer_coding (NULL: none) and answer_varies are it. */
    int answer_encoded, answer_varies;
    const char *answer_coding;
    work_item item;             /* in the server's work queue (work/work_queue.h) */
    job_state job;
    double queued_at;
    long deadline_ms;           /* the request's own X-Deadline-Ms, 0 for none */
    compute_token token;
    api_response resp;
    int handed;                 /* answered_by is set (else: its I/O thread, as a cheap request) */
    metrics_path answered_by;
    /* Its identity and timeline (http_trace.c). */
    trace_context trace;
    char model[72];             /* the handler's api_response.model */
    unsigned phases_timed;      /* bit 1 << TRACE_PHASE_* */
    double phase_seconds[TRACE_PHASE_COUNT];
};

/* http_trace.c (and trace/trace.h's trace_begin for a new request's trace):
 * the headers every answer carries (traceresponse, X-Request-Id,
 * Server-Timing); noting a phase's seconds; the access line (served: which
 * thread answered; aborted: the answer did not go out whole). */
void http_trace_headers(struct MHD_Response *r, const http_request *hr);
void http_trace_phase(http_request *hr, int phase, double seconds);
void http_trace_log(const http_request *hr, struct MHD_Connection *conn, double seconds,
                    const char *served, int aborted);
/* http_trace.c: one of libmicrohttpd's own messages as a JSON line, for
 * --log-format json (a line of text otherwise, http.c). */
void http_trace_log_library(const char *fmt, va_list ap);

/* http_conn.c: sets the phase of the connection record hc (NULL is fine)
 * and its start to now, without a lock (http_conn). */
void http_conn_set_phase(http_conn *hc, conn_phase phase);

/* http_conn.c: libmicrohttpd's accept policy: a connection is taken while
 * the server's caps, counted with gRPC's, have room (core/conn_ledger.h). */
enum MHD_Result http_accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen);

/* http_conn.c: libmicrohttpd's connection-notify callback, which makes and
 * drops the record of each connection and counts it in the ledger. */
void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode code);

/* http_conn.c: the reaper thread (arg: the server). */
void *http_reaper_main(void *arg);

/* http_body.c: admitting a body from the headers, storing its chunks
 * (inflated first when it is compressed), and the refusal of a body that was
 * dropped or is not of its coding (each says more above it). */
enum MHD_Result http_body_admit(http_server *srv, struct MHD_Connection *conn, http_request *hr,
                                const char *method);
int http_body_receive(http_request *hr, size_t limit, const char *data, size_t n);
int http_body_refused(const http_server *srv, http_request *hr, attn_error *err);
void http_body_release(http_request *hr);
/* Frees hr's body (placed by http_body.c: not a plain mem_free). */
void http_body_free(http_request *hr);

/* http.c: api_request.query_arg, a decoded query argument of the
 * connection conn (NULL when absent). */
const char *http_query_arg(const void *conn, const char *key);

/* http_answer.c: compressing hr->resp as its client's Accept-Encoding asks, on the
 * worker that made it: the I/O thread serves every other connection meanwhile, and a
 * large answer's deflate takes long, even at zlib's fastest level.  An
 * answer made on the I/O thread is compressed there, by http_queue_answer. */
void http_answer_encode(http_request *hr);

/* http_answer.c: queueing resp as hr's answer (preflight: the OPTIONS
 * headers; v: the guard's verdict or NULL), and the error answer on hr's
 * route. */
enum MHD_Result http_queue_answer(http_server *srv, struct MHD_Connection *conn,
                                  http_request *hr, api_response *resp, int preflight,
                                  const guard_verdict *v);
void http_error_response(api_response *resp, const http_request *hr, const attn_error *err);
enum MHD_Result http_queue_error(http_server *srv, struct MHD_Connection *conn,
                                 http_request *hr, const attn_error *err, const guard_verdict *v);

/* http_queue.c: the compute token of hr, answering hr on this thread,
 * handing it to the server's workers, the reaper's thread. */
void http_request_token_start(http_server *srv, http_request *hr);
void http_request_handle(http_request *hr, int io_thread);
void http_dispatch(http_server *srv, http_request *hr);

/* http_conn.c: 1 when the peer of fd has closed its side or reset the
 * connection (a peek, which never blocks). */
int http_peer_gone(int fd);
int http_threads_start(http_server *srv);
void http_threads_stop(http_server *srv);

#endif

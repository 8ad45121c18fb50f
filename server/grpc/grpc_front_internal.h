/*
 * grpc_front_internal.h - what the files of the gRPC server share: a call,
 * the front-end, and the functions each file lends the others.
 *
 * grpc_front.c runs the server, its completion queue, its polling thread and
 * the workers; grpc_call.c is one call's life (its trace, metadata, access
 * line, answer); grpc_watch.c the open Health/Watch calls; grpc_conn.c the
 * listener the front-end accepts on itself, the connections it holds and the
 * rules for calls that wait for their message.  Only the polling thread
 * handles a call's events, so a call's fields need no lock (a worker holds a
 * call only between taking it from the queue and gcall_answer).
 */
#ifndef ATTN_GRPC_FRONT_INTERNAL_H
#define ATTN_GRPC_FRONT_INTERNAL_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/budget_client.h"
#include "core/compute.h"
#include "grpc_front.h"
#include "grpc_private.h"
#include "guard/guard.h"
#include "trace/trace.h"
#include "work/work_queue.h"

typedef struct gconn_table gconn_table;

/* TAG_STREAM: one answer of ModelStreamInfer has gone (the stream reads on);
 * TAG_WATCH: one status of Health/Watch has gone (the watch stays open). */
enum { TAG_NEW, TAG_RECV, TAG_SENT, TAG_CLOSE, TAG_STREAM, TAG_WATCH };

/* How often the open watches read the status again. */
#define WATCH_TICK_MS 100

typedef struct gcall gcall;

typedef struct gtag {
    gcall *call;
    int what;
} gtag;

struct gcall {
    grpc_front *front;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array metadata;
    grpc_method method;
    grpc_byte_buffer *recv;
    int cancelled;              /* set by RECV_CLOSE_ON_SERVER */
    int sent, closed;           /* the polling thread's */
    int close_asked;            /* RECV_CLOSE_ON_SERVER was asked for */
    int close_with_answer;      /* ... in the answer's batch: SENT is also CLOSE */
    int inflight;               /* counted in metrics_inflight until SENT */
    compute_token token;
    work_item item;             /* in the server's work queue (work/work_queue.h) */
    grpc_answer answer;         /* a worker's, between running and done */
    /* Admission: the client's share of the memory budget (core/budget_client.h)
     * and what this call's message reserved in it (gadmit_message). */
    budget_client *client;
    size_t reserved;
    size_t call_reserved;       /* GRPC_CALL_MEMORY while the call is open */
    /* Its connection (grpc_conn.c): the descriptor and socket inode of one the
     * front accepted itself, fd -1 for one gRPC accepted (TLS).  While waiting
     * (between asking for a message and its arrival) the call is in the
     * front's list of waiting calls, which the sweep holds to --header-timeout
     * and --min-body-rate. */
    int conn_fd;
    unsigned long conn_ino;
    int waiting;
    int stream_later;           /* a stream waiting for a request after its first */
    int logged;                 /* its access line is written (the sweep ended it) */
    int large;                  /* it moved MEM_GIVE_BACK_FROM bytes or more */
    double wait_since;          /* compute_now() */
    double wait_from;           /* its first sweep, 0 before (the rate's start) */
    unsigned long long wait_bytes; /* the connection's bytes received then */
    gcall *wait_prev, *wait_next;
    double started, queued_at;  /* compute_now() */
    const unsigned char *in;    /* the request message, in in_slice */
    size_t in_len;
    grpc_slice in_slice;        /* holds the bytes of in while has_in */
    int has_in;
    grpc_slice status_details;
    grpc_metadata trailing;
    char retry_after[16];
    int has_trailing, has_details;
    int stream;                 /* ModelStreamInfer: many requests, one answer each */
    int initial_sent;           /* the initial metadata went with an earlier batch */
    int watch;                  /* Health/Watch, in the front's list of watches */
    int watch_known;            /* it asked for a service served (else SERVICE_UNKNOWN) */
    int watch_told;             /* the status sent last, 0 for none */
    int watch_busy;             /* a batch of it is on its way */
    gcall *watch_prev, *watch_next;
    gtag t_new, t_recv, t_sent, t_close, t_stream, t_watch;
    /* Its trace (trace.h), from the traceparent, tracestate and x-request-id
     * metadata; traceresponse and x-request-id go back in the initial
     * metadata.  A stream is one call: its requests share the ids. */
    trace_context trace;
    char tracestate[TRACE_TRACESTATE_MAX + 1];
    char traceresponse[TRACE_RESPONSE_LEN];
    grpc_metadata initial[2];
    double read_seconds;        /* from the call's start to its (first) message, -1: none */
    const char *served;         /* which thread answers: "inline" (the polling thread), "worker" */
};

struct grpc_front {
    const server_config *cfg;
    guard *guard;               /* the bearer tokens, as HTTP checks them */
    grpc_server *server;
    grpc_completion_queue *cq;
    int port;
    pthread_t poller;
    pthread_mutex_t queue_lock; /* orders queueing a call after the stop's drain */
    int stopping;               /* grpc_front_stop has begun: no call is queued */
    long live;                  /* calls allocated (the polling thread's) */
    int shut;                   /* the server's shutdown tag came */
    gcall *watches;             /* the open Health/Watch calls (the polling thread's) */
    long n_watches;
    int watch_end;              /* the server shuts down: every watch ends */
    int health;                 /* the status the watches were last given */
    double health_read;         /* when it was read (compute_now()) */
    gcall *waiting;             /* the calls waiting for a message (the polling thread's) */
    long n_waiting;
    double swept;               /* when the waiting calls were last swept (compute_now()) */
    gconn_table *conns;         /* the connections it accepted itself, NULL under TLS */
    gtag shutdown_tag;
    pthread_mutex_t shut_lock;
    pthread_cond_t shut_done;
};

/* grpc_call.c: one call. */
gcall *gcall_new(grpc_front *front);
void gcall_free(gcall *c);
/* Lets go of the request message of c. */
void gcall_in_drop(gcall *c);
/* Asks the server for the next call. */
void gcall_request_next(grpc_front *front);
void gcall_close_watch(gcall *c);
void gcall_log(gcall *c, grpc_status_code code, int http_status, route_id rid, double seconds,
               size_t out_len, const grpc_answer *a);
size_t gcall_initial_op(gcall *c, grpc_op *op);
void gcall_answer(gcall *c, grpc_answer *a);
int gcall_read(gcall *c);
double gcall_deadline(const gcall *c);
int gcall_authorized(const gcall *c, grpc_answer *a);
void gcall_recv_next(gcall *c);
void gcall_on_new(gcall *c);

/* grpc_watch.c: Health/Watch. */
void gwatch_log(gcall *c, grpc_status_code code);
void gwatch_unlist(gcall *c);
void gwatch_push(gcall *c);
void gwatch_tick(grpc_front *front);
void gwatch_begin(gcall *c);

/* grpc_conn.c: the connections and the waiting calls. */
/* How often the waiting calls are swept while any waits. */
#define SWEEP_MS 250
/* Listens on --host:--grpc-port and accepts into front's server (started);
 * NULL with err filled when it cannot listen. */
gconn_table *gconn_listen(grpc_front *front, attn_error *err);
int gconn_port(const gconn_table *t);
/* --host:--grpc-port as text ("[::1]:8001"), and the error of a port that
 * cannot be listened on, for either listener (TLS: gRPC's core's). */
void gconn_listen_address(const server_config *cfg, char *out, size_t size);
void gconn_listen_error(const server_config *cfg, attn_error *err);
/* Stops accepting (before the server shuts down); gconn_stop frees t after
 * the server is destroyed.  NULL is fine for both. */
void gconn_stop_accepting(gconn_table *t);
void gconn_stop(gconn_table *t);
/* What an open call holds in gRPC's core before any message (measured: 15 KB
 * a call for 2,000 calls open and waiting), reserved in the client's share
 * for as long as the call is open, so that calls opened and left waiting
 * are bounded by the share, as bodies are. */
#define GRPC_CALL_MEMORY ((size_t)16 << 10)
/* Finds the connection and client address of new call c and reserves its
 * GRPC_CALL_MEMORY; returns 1, or 0 when the share or the budget is full
 * (the call is to be refused). */
int gconn_call_begin(gcall *c);
/* c waits for a message (its RECV_MESSAGE is asked for), or no longer. */
void gconn_wait(gcall *c);
void gconn_unwait(gcall *c);
/* Reserves the peak of c's message, come now; 0, or -1 with a filled
 * (RESOURCE_EXHAUSTED).  gconn_release_message gives it back (with the
 * message: gcall_in_drop). */
int gconn_admit_message(gcall *c, grpc_answer *a);
void gconn_release_message(gcall *c);
/* Holds the waiting calls to their limits and counts connections gone. */
void gconn_sweep(grpc_front *front);
/* The client's address of c as text in out ("" when unknown); returns out. */
const char *gconn_client(const gcall *c, char *out, size_t size);

#endif

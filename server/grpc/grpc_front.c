/*
 * grpc_front.c - the gRPC server: gRPC's C core, one completion queue, the
 * thread that polls it, and the workers that run inference.
 *
 * A call goes through up to four events of the queue, each with its own
 * tag: NEW (grpc_server_request_call gave a call; another is asked for at
 * once), RECV (its one request message arrived), SENT (the answer's batch
 * is done) and CLOSE (RECV_CLOSE_ON_SERVER: it completes when the call
 * ends, with `cancelled` set when the client cancelled, its deadline passed
 * or its connection dropped).  CLOSE is asked for on its own only by a call
 * that outlives the polling thread's handling of its request (a worker's
 * inference, a stream, a watch); a call answered on the polling thread asks
 * for it in the answer's batch, so its SENT is its CLOSE too.  Only
 * the polling thread handles events, so a call's flags need no lock; it is
 * freed once SENT and CLOSE have both come.
 *
 * The cheap RPCs are answered on the polling thread (grpc_service.c), and
 * so is a small ModelInfer when the router finds it small and a compute slot
 * free (as HTTP's I/O threads do).  Any other ModelInfer joins a queue
 * served by --max-inflight workers; a worker binds
 * the call's compute token (the call's deadline, or --deadline when that is
 * sooner) and asks the router, which admits the computation under the same
 * limits as HTTP's.  A CLOSE with `cancelled` stops the token, so the
 * computation ends within one block of keys as for an HTTP client that went
 * away.  A call that waited longer than --queue-wait-ms for a worker is
 * answered UNAVAILABLE with a retry hint when a worker takes it.
 *
 * Every call begins a trace from its metadata as an HTTP request does from
 * its headers (trace/trace.h), answers traceresponse and x-request-id in its
 * initial metadata, and prints its access line, one a request of a stream,
 * through the same writer as HTTP.
 *
 * grpc.health.v1's Watch stays open: the polling thread keeps a list of the
 * open watches, sends each the status at once, and reads the status again
 * every WATCH_TICK_MS while any is open (gRPC's C core has no way to wake
 * the queue from another thread, so the queue is waited on with that
 * timeout), sending each watch a change.  When the server shuts down (the
 * call asked for by grpc_server_request_call fails) every watch is told
 * NOT_SERVING and ended with UNAVAILABLE; a cancelled watch leaves the list
 * at its CLOSE.  A watch holds one message on its way at most (TAG_WATCH):
 * a change meanwhile is sent when it has gone.
 */
#include "grpc_front.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/compute.h"
#include "grpc_private.h"
#include "guard/guard.h"
#include "trace/trace.h"
#include "metrics/metrics.h"

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
    gcall *next;                /* in the workers' queue */
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
    pthread_t *workers;
    size_t n_workers;
    pthread_mutex_t lock;       /* the queue and stopping */
    pthread_cond_t wake;
    gcall *head, *tail;
    int stopping;
    long live;                  /* calls allocated (the polling thread's) */
    int shut;                   /* the server's shutdown tag came */
    gcall *watches;             /* the open Health/Watch calls (the polling thread's) */
    long n_watches;
    int watch_end;              /* the server shuts down: every watch ends */
    int health;                 /* the status the watches were last given */
    double health_read;         /* when it was read (compute_now()) */
    gtag shutdown_tag;
    pthread_mutex_t shut_lock;
    pthread_cond_t shut_done;
};

static gcall *call_new(grpc_front *front)
{
    gcall *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->front = front;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->metadata);
    c->t_new = (gtag){c, TAG_NEW};
    c->t_recv = (gtag){c, TAG_RECV};
    c->t_sent = (gtag){c, TAG_SENT};
    c->t_close = (gtag){c, TAG_CLOSE};
    c->t_stream = (gtag){c, TAG_STREAM};
    c->t_watch = (gtag){c, TAG_WATCH};
    c->read_seconds = -1;
    front->live++;
    return c;
}

static void watch_unlist(gcall *c);

/* Lets go of the request message of c. */
static void call_in_drop(gcall *c)
{
    if (c->has_in)
        grpc_slice_unref(c->in_slice);
    c->has_in = 0;
    c->in = NULL;
}

static void call_free(gcall *c)
{
    if (c->watch)
        watch_unlist(c);
    if (c->call != NULL)
        grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->metadata);
    if (c->recv != NULL)
        grpc_byte_buffer_destroy(c->recv);
    if (c->has_details)
        grpc_slice_unref(c->status_details);
    if (c->has_trailing)
        grpc_slice_unref(c->trailing.value);
    call_in_drop(c);
    c->front->live--;
    free(c);
}

/* Asks the server for the next call. */
static void request_next(grpc_front *front)
{
    gcall *c = call_new(front);
    if (c == NULL)
        return; /* out of memory: no new calls are taken until one ends */
    if (grpc_server_request_call(front->server, &c->call, &c->details, &c->metadata, front->cq,
                                 front->cq, &c->t_new) != GRPC_CALL_OK)
        call_free(c);
}

/* Asks for RECV_CLOSE_ON_SERVER on its own (CLOSE), which completes when
 * the call ends, cancelled or not: for a call that outlives the polling
 * thread's handling of its request (a worker computes it, a stream, a watch),
 * so that a cancel stops its computation.  A unary call answered on the
 * polling thread asks for it in its answer's batch instead (call_answer),
 * which saves a batch and an event of the queue a call.  Once only. */
static void call_close_watch(gcall *c)
{
    if (c->close_asked)
        return;
    c->close_asked = 1;
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (grpc_call_start_batch(c->call, &close_op, 1, &c->t_close, NULL) != GRPC_CALL_OK)
        c->closed = 1;
}

/* The value of c's metadata key (lowercase, as gRPC gives keys) as text in
 * out, cut at size - 1 bytes; NULL when the call has no such key.  A value
 * cut short stays longer than any limit of its reader below size - 1. */
static const char *call_metadata(const gcall *c, const char *key, char *out, size_t size)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->metadata.count; i++) {
        const grpc_metadata *m = &c->metadata.metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == klen &&
            memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) == 0) {
            size_t n = GRPC_SLICE_LENGTH(m->value);
            n = n < size - 1 ? n : size - 1;
            memcpy(out, GRPC_SLICE_START_PTR(m->value), n);
            out[n] = '\0';
            return out;
        }
    }
    return NULL;
}

/* Begins c's trace from its metadata, as HTTP begins a request's from its
 * headers, and makes the initial metadata that answers it. */
static void call_trace_begin(gcall *c)
{
    char parent[128], id[TRACE_REQUEST_ID_MAX + 2];
    const char *tp = call_metadata(c, "traceparent", parent, sizeof parent);
    const char *ts = call_metadata(c, "tracestate", c->tracestate, sizeof c->tracestate);
    const char *rid = call_metadata(c, "x-request-id", id, sizeof id);
    trace_begin(&c->trace, tp, ts, rid);
    trace_response(&c->trace, c->traceresponse);
    c->initial[0].key = grpc_slice_from_static_string("traceresponse");
    c->initial[0].value = grpc_slice_from_static_string(c->traceresponse);
    c->initial[1].key = grpc_slice_from_static_string("x-request-id");
    c->initial[1].value = grpc_slice_from_static_string(c->trace.request_id);
}

/* Writes the access line of c, answered with code (HTTP's twin: http_status,
 * rid) after seconds, having taken in in_len and sent out_len bytes; a's
 * model and phases when a is not NULL. */
static void call_log(gcall *c, grpc_status_code code, int http_status, route_id rid,
                     double seconds, size_t out_len, const grpc_answer *a)
{
    const server_config *cfg = c->front->cfg;
    if (cfg->quiet)
        return;
    double phases[TRACE_PHASE_COUNT] = {0};
    unsigned timed = 0;
    if (c->read_seconds >= 0) {
        phases[TRACE_PHASE_READ] = c->read_seconds;
        timed |= 1u << TRACE_PHASE_READ;
    }
    for (int p = 0; a != NULL && p < API_PHASE_COUNT; p++)
        if (a->phases_timed & (1u << p)) {
            phases[TRACE_PHASE_API(p)] = a->phase_seconds[p];
            timed |= 1u << TRACE_PHASE_API(p);
        }
    /* gRPC names the peer "ipv4:ADDR:PORT" or "ipv6:[ADDR]:PORT" */
    char client[64] = "";
    if (!strcmp(cfg->log_format, "json")) {
        char *peer = grpc_call_get_peer(c->call);
        const char *at = peer != NULL ? strchr(peer, ':') : NULL;
        if (at != NULL) {
            at += at[1] == '[' ? 2 : 1;
            size_t n = strcspn(at, "]");
            if (at[n] != ']' && strrchr(at, ':') != NULL)
                n = (size_t)(strrchr(at, ':') - at);
            snprintf(client, sizeof client, "%.*s", (int)n, at);
        }
        gpr_free(peer);
    }
    const char *path = (const char *)GRPC_SLICE_START_PTR(c->details.method);
    char method_path[128];
    snprintf(method_path, sizeof method_path, "%.*s", (int)GRPC_SLICE_LENGTH(c->details.method),
             path);
    trace_printable(method_path);
    trace_access_line line = {.protocol = "grpc", .trace = &c->trace,
                            .method = grpc_method_name(c->method), .route = route_label(rid),
                            .path = method_path, .model = a != NULL ? a->model : "",
                            .status = http_status ? http_status : 200, .grpc_status = (int)code,
                            .bytes_in = c->in_len, .bytes_out = out_len,
                            .seconds = seconds, .phases_timed = timed,
                            .phase_seconds = phases, .client = client,
                            .served = c->served != NULL ? c->served : "inline",
                            .aborted = code == GRPC_STATUS_CANCELLED};
    trace_access(&line, cfg->log_format);
}

/* Fills op with the initial metadata of c (its trace's traceresponse and
 * x-request-id) unless an earlier batch sent it; returns the ops filled. */
static size_t call_initial_op(gcall *c, grpc_op *op)
{
    if (c->initial_sent)
        return 0;
    c->initial_sent = 1;
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    op->data.send_initial_metadata.count = sizeof c->initial / sizeof c->initial[0];
    op->data.send_initial_metadata.metadata = c->initial;
    return 1;
}

/* Sends the answer and the status of c (from any thread); c belongs to the
 * polling thread again as soon as this returns. */
static void call_answer(gcall *c, grpc_answer *a)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    n += call_initial_op(c, &ops[n]);
    grpc_byte_buffer *bb = NULL;
    /* a stream's answer goes alone: its status ends the stream, after the last */
    int stream_message = c->stream && a->bytes != NULL;
    if (a->code == GRPC_STATUS_OK && a->bytes != NULL) {
        grpc_slice s = grpc_slice_new(a->bytes, a->len, free);
        a->bytes = NULL;
        bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    if (!stream_message)
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = a->code;
    if (!stream_message && a->code != GRPC_STATUS_OK) {
        c->status_details = grpc_slice_from_copied_string(a->message);
        c->has_details = 1;
        ops[n].data.send_status_from_server.status_details = &c->status_details;
    }
    if (!stream_message && a->retry_after > 0) {
        snprintf(c->retry_after, sizeof c->retry_after, "%d", a->retry_after);
        c->trailing.key = grpc_slice_from_static_string("retry-after");
        c->trailing.value = grpc_slice_from_copied_string(c->retry_after);
        c->has_trailing = 1;
        ops[n].data.send_status_from_server.trailing_metadata_count = 1;
        ops[n].data.send_status_from_server.trailing_metadata = &c->trailing;
    }
    if (!stream_message)
        n++;
    if (!stream_message && !c->close_asked) { /* see call_close_watch */
        c->close_asked = c->close_with_answer = 1;
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    }
    double seconds = compute_now() - c->started;
    if (c->in != NULL || !c->stream) {
        call_log(c, a->code, a->http_status, a->route, seconds, a->len, a);
        metrics_observe(a->route, a->http_status ? a->http_status : 200, seconds, c->in_len,
                        a->len);
    }
    call_in_drop(c);
    free(a->bytes);
    a->bytes = NULL;
    if (grpc_call_start_batch(c->call, ops, n, stream_message ? &c->t_stream : &c->t_sent,
                              NULL) != GRPC_CALL_OK) {
        /* cannot happen for a well-formed batch; the call is cancelled rather than left open */
        grpc_call_cancel(c->call, NULL);
        c->sent = 1;
        if (c->close_with_answer)
            c->closed = 1;
    }
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
}

/* Reads the request message of c into c->in: the one slice that gRPC
 * joins the message's pieces into, kept rather than copied again; 0, or -1
 * when the message cannot be read. */
static int call_read(gcall *c)
{
    grpc_byte_buffer_reader r;
    int ok = grpc_byte_buffer_reader_init(&r, c->recv);
    if (ok) {
        c->in_slice = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        c->has_in = 1;
        c->in_len = GRPC_SLICE_LENGTH(c->in_slice);
        c->in = GRPC_SLICE_START_PTR(c->in_slice);
    }
    grpc_byte_buffer_destroy(c->recv);
    c->recv = NULL;
    return ok ? 0 : -1;
}

/* The call's deadline as seconds of compute_now(), capped by --deadline. */
static double call_deadline(const gcall *c)
{
    double limit = (double)c->front->cfg->deadline;
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    gpr_timespec end = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(end, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0) {
        double left = gpr_timespec_to_micros(gpr_time_sub(end, now)) / 1e6;
        if (left < limit)
            limit = left > 0 ? left : 0;
    }
    return compute_now() + limit;
}

/* Checks the bearer token of c's "authorization" metadata as HTTP checks its
 * Authorization header; the probes need none.  Returns 0, or -1 with a filled. */
static int call_authorized(const gcall *c, grpc_answer *a)
{
    int probe = c->method == GRPC_M_SERVER_LIVE || c->method == GRPC_M_SERVER_READY ||
                c->method == GRPC_M_HEALTH_CHECK || c->method == GRPC_M_HEALTH_WATCH;
    char value[4096];
    const char *authorization = call_metadata(c, "authorization", value, sizeof value);
    attn_error err;
    error_clear(&err);
    if (guard_token_check(c->front->guard, authorization, !probe, 0, &err) == 0)
        return 0;
    grpc_answer_error(a, GRPC_STATUS_UNAUTHENTICATED, "%s", err.message);
    a->http_status = 401;
    a->route = c->method == GRPC_M_MODEL_INFER ? ROUTE_V2_INFER : ROUTE_OTHER;
    return -1;
}

/* Writes the access line of watch c, which ended with code. */
static void watch_log(gcall *c, grpc_status_code code)
{
    call_log(c, code, 200, ROUTE_READYZ, compute_now() - c->started, 0, NULL);
}

/* Takes c out of the list of open watches; nothing when it is not in it. */
static void watch_unlist(gcall *c)
{
    if (!c->watch)
        return;
    grpc_front *front = c->front;
    if (c->watch_prev != NULL)
        c->watch_prev->watch_next = c->watch_next;
    else
        front->watches = c->watch_next;
    if (c->watch_next != NULL)
        c->watch_next->watch_prev = c->watch_prev;
    c->watch_prev = c->watch_next = NULL;
    c->watch = 0;
    front->n_watches--;
    metrics_grpc_watches_add(-1);
}

/* Sends watch c what it has not been told: the status now when it differs
 * from the one sent last, and, once the server shuts down, NOT_SERVING and
 * the end of the call.  Nothing while a batch of c is on its way: its
 * TAG_WATCH calls this again. */
static void watch_push(gcall *c)
{
    grpc_front *front = c->front;
    if (!c->watch || c->watch_busy)
        return;
    int status = !c->watch_known ? GRPC_HEALTH_SERVICE_UNKNOWN
                 : front->watch_end ? GRPC_HEALTH_NOT_SERVING
                                    : front->health;
    if (status == c->watch_told && !front->watch_end)
        return;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    n += call_initial_op(c, &ops[n]);
    grpc_answer a;
    memset(&a, 0, sizeof a);
    grpc_byte_buffer *bb = NULL;
    if (status != c->watch_told) {
        grpc_health_pack(status, &a);
        if (a.bytes != NULL) {
            grpc_slice s = grpc_slice_new(a.bytes, a.len, free);
            a.bytes = NULL;
            bb = grpc_raw_byte_buffer_create(&s, 1);
            grpc_slice_unref(s);
            ops[n].op = GRPC_OP_SEND_MESSAGE;
            ops[n++].data.send_message.send_message = bb;
            c->watch_told = status;
        }
    }
    /* the server shuts down, or memory ran out for the message: the watch ends */
    int end = front->watch_end || a.code != GRPC_STATUS_OK;
    if (end) {
        grpc_status_code code = a.code != GRPC_STATUS_OK ? a.code : GRPC_STATUS_UNAVAILABLE;
        c->status_details = grpc_slice_from_copied_string(
            a.code != GRPC_STATUS_OK ? a.message
                                     : "The server is shutting down; watch another instance.");
        c->has_details = 1;
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = code;
        ops[n++].data.send_status_from_server.status_details = &c->status_details;
        watch_log(c, code);
        watch_unlist(c);
    }
    c->watch_busy = 1;
    if (grpc_call_start_batch(c->call, ops, n, end ? &c->t_sent : &c->t_watch, NULL) !=
        GRPC_CALL_OK) {
        /* cannot happen for a well-formed batch; the call is cancelled rather than left open */
        grpc_call_cancel(c->call, NULL);
        watch_unlist(c);
        c->watch_busy = 0;
        c->sent = 1;
    }
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
}

/* Reads the status again and sends each open watch what changed. */
static void watch_tick(grpc_front *front)
{
    front->health = grpc_health_now();
    front->health_read = compute_now();
    for (gcall *c = front->watches, *next; c != NULL; c = next) {
        next = c->watch_next; /* watch_push may take c out of the list */
        watch_push(c);
    }
}

/* A Health/Watch whose request message has come: it joins the list of open
 * watches (at most --max-connections, as each holds a call) and is told the
 * status at once. */
static void watch_begin(gcall *c)
{
    grpc_front *front = c->front;
    grpc_answer a;
    memset(&a, 0, sizeof a);
    int known = grpc_health_watch_known(c->in, c->in_len, &a);
    if (known >= 0 && front->n_watches >= front->cfg->max_connections) {
        grpc_answer_error(&a, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "%ld Health/Watch calls are open already (--max-connections); ask "
                          "Health/Check, or watch again later.", front->n_watches);
        known = -1;
    }
    if (known < 0) {
        a.route = ROUTE_READYZ;
        call_answer(c, &a);
        return;
    }
    call_in_drop(c);
    c->watch = 1;
    c->watch_known = known;
    c->watch_next = front->watches;
    if (front->watches != NULL)
        front->watches->watch_prev = c;
    front->watches = c;
    front->n_watches++;
    metrics_grpc_watches_add(1);
    watch_tick(front);
}

/* The request of c arrived: a cheap RPC is answered now, ModelInfer queued. */
static void on_recv(gcall *c, int ok)
{
    grpc_answer a;
    memset(&a, 0, sizeof a);
    if (ok && c->stream && c->recv == NULL) { /* the client has sent its last request */
        a.route = ROUTE_V2_INFER;
        call_answer(c, &a);
        return;
    }
    int had_message = c->recv != NULL;
    if (!ok || !had_message || call_read(c) != 0) {
        if (!ok) {
            c->sent = 1; /* the call is gone: nothing to send */
            call_close_watch(c); /* its CLOSE comes at once */
            return;
        }
        grpc_answer_error(&a, GRPC_STATUS_INVALID_ARGUMENT, "%s",
                          !had_message ? "The call carried no request message."
                                       : "The request message could not be decompressed.");
        call_answer(c, &a);
        return;
    }
    if (!c->stream)     /* a stream's requests are timed from their arrival */
        c->read_seconds = compute_now() - c->started;
    if (call_authorized(c, &a) != 0) {
        call_answer(c, &a);
        return;
    }
    if (c->method == GRPC_M_HEALTH_WATCH) {
        watch_begin(c);
        return;
    }
    if (!c->stream && c->method != GRPC_M_MODEL_INFER) {
        grpc_service_answer(c->method, c->in, c->in_len, &a);
        call_answer(c, &a);
        return;
    }
    grpc_front *front = c->front;
    metrics_grpc_inflight_add(1);
    c->inflight = 1;
    c->token.deadline = call_deadline(c);
    atomic_init(&c->token.reason, COMPUTE_RUNNING);
    c->queued_at = compute_now();
    if (c->stream)
        c->started = c->queued_at; /* each request of a stream is timed from its arrival */
    /* A small request is answered here, as HTTP answers one on its I/O thread
     * (--inline-max-bytes); the router defers anything larger to a worker. */
    if (!c->stream && c->in_len <= front->cfg->inline_max_bytes) {
        compute_bind(&c->token);
        grpc_infer_answer(c->in, c->in_len, 0, 1, &a);
        compute_bind(NULL);
        if (!a.deferred) {
            call_answer(c, &a);
            return;
        }
        memset(&a, 0, sizeof a);
    }
    call_close_watch(c); /* a worker computes it: a cancel must stop it */
    c->served = "worker";
    pthread_mutex_lock(&front->lock);
    if (front->stopping) { /* the workers are gone */
        pthread_mutex_unlock(&front->lock);
        grpc_answer_error(&a, GRPC_STATUS_UNAVAILABLE, "The server is shutting down and takes no "
                          "new work; retry on another instance.");
        a.http_status = 503;
        a.route = ROUTE_V2_INFER;
        call_answer(c, &a);
        return;
    }
    c->next = NULL;
    if (front->tail != NULL)
        front->tail->next = c;
    else
        front->head = c;
    front->tail = c;
    pthread_cond_signal(&front->wake);
    pthread_mutex_unlock(&front->lock);
}

/* Reads the next request message of c (TAG_RECV); when the call cannot, it
 * is over and nothing more will be sent. */
static void call_recv_next(gcall *c)
{
    grpc_op recv_op;
    memset(&recv_op, 0, sizeof recv_op);
    recv_op.op = GRPC_OP_RECV_MESSAGE;
    recv_op.data.recv_message.recv_message = &c->recv;
    if (grpc_call_start_batch(c->call, &recv_op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
        grpc_call_cancel(c->call, NULL);
        c->sent = 1;
        call_close_watch(c); /* its CLOSE frees it */
    }
}

/* A new call: watch for its end, and read its message. */
static void on_new(gcall *c)
{
    c->started = compute_now();
    call_trace_begin(c);
    c->method = grpc_method_of((const char *)GRPC_SLICE_START_PTR(c->details.method),
                               GRPC_SLICE_LENGTH(c->details.method));
    c->stream = c->method == GRPC_M_MODEL_STREAM_INFER;
    if (c->stream || c->method == GRPC_M_HEALTH_WATCH)
        call_close_watch(c); /* they stay open: their end must be seen */
    call_recv_next(c);
}

/* Shuts the queue down once the server has shut down and every call is freed. */
static void maybe_finish(grpc_front *front)
{
    if (front->shut && front->live == 0) {
        grpc_completion_queue_shutdown(front->cq);
        front->live = -1; /* once */
    }
}

static void *poller_main(void *arg)
{
    grpc_front *front = arg;
    for (;;) {
        /* while watches are open, the queue is left every WATCH_TICK_MS to read the status */
        gpr_timespec until =
            front->n_watches > 0
                ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                               gpr_time_from_millis(WATCH_TICK_MS, GPR_TIMESPAN))
                : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(front->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (front->n_watches > 0 && compute_now() - front->health_read >= WATCH_TICK_MS / 1000.0)
            watch_tick(front);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &front->shutdown_tag) {
            pthread_mutex_lock(&front->shut_lock);
            front->shut = 1;
            pthread_cond_signal(&front->shut_done);
            pthread_mutex_unlock(&front->shut_lock);
            maybe_finish(front);
            continue;
        }
        gtag *t = ev.tag;
        gcall *c = t->call;
        int what = t->what; /* t lies in c, which TAG_NEW may free */
        switch (what) {
        case TAG_NEW:
            if (!ev.success) { /* the server shuts down: so do the watches */
                call_free(c);
                front->watch_end = 1;
                watch_tick(front);
                break;
            }
            request_next(front);
            on_new(c);
            break;
        case TAG_RECV:
            on_recv(c, ev.success);
            break;
        case TAG_WATCH:
            c->watch_busy = 0;
            if (!ev.success || c->closed) { /* the call is over: nothing more goes */
                watch_unlist(c);
                c->sent = 1;
            } else {
                watch_push(c); /* what changed while this status was on its way */
            }
            break;
        case TAG_SENT:
        case TAG_STREAM:
            c->watch_busy = 0;
            if (c->inflight)
                metrics_grpc_inflight_add(-1);
            c->inflight = 0;
            if (what == TAG_STREAM && ev.success)
                call_recv_next(c); /* the next request of the stream */
            else
                c->sent = 1;
            if (what == TAG_SENT && c->close_with_answer)
                c->closed = 1;
            break;
        case TAG_CLOSE:
            c->closed = 1;
            if (c->cancelled)
                compute_token_stop(&c->token, COMPUTE_CLIENT_GONE);
            if (c->watch) { /* cancelled, its deadline passed, or its connection dropped */
                watch_log(c, GRPC_STATUS_CANCELLED);
                watch_unlist(c);
                if (!c->watch_busy)
                    c->sent = 1;
            }
            break;
        }
        if (what != TAG_NEW && c->sent && c->closed)
            call_free(c);
        maybe_finish(front);
    }
    return NULL;
}

/* Answers one queued ModelInfer on a worker. */
static void work(grpc_front *front, gcall *c)
{
    grpc_answer a;
    memset(&a, 0, sizeof a);
    attn_error err;
    error_clear(&err);
    compute_bind(&c->token);
    double waited = compute_now() - c->queued_at;
    if (compute_stop_error(&err) != 0) {
        int reason = atomic_load(&c->token.reason);
        grpc_answer_error(&a, reason == COMPUTE_DEADLINE ? GRPC_STATUS_DEADLINE_EXCEEDED
                              : reason == COMPUTE_CLIENT_GONE ? GRPC_STATUS_CANCELLED
                                                              : GRPC_STATUS_UNAVAILABLE,
                          "%s", err.message);
        a.http_status = 503;
        a.route = ROUTE_V2_INFER;
    } else if (waited * 1000.0 > (double)front->cfg->queue_wait_ms) {
        grpc_answer_error(&a, GRPC_STATUS_UNAVAILABLE,
                          "The server is already computing %ld requests (--max-inflight) and "
                          "this one waited more than %ld ms (--queue-wait-ms); retry shortly.",
                          front->cfg->max_inflight, front->cfg->queue_wait_ms);
        a.retry_after = 1;
        a.http_status = 503;
        a.route = ROUTE_V2_INFER;
    } else {
        grpc_infer_answer(c->in, c->in_len, c->queued_at, 0, &a);
        /* a computation stopped by its token answers with the reason's code */
        int reason = atomic_load(&c->token.reason);
        if (a.code == GRPC_STATUS_UNAVAILABLE && reason == COMPUTE_DEADLINE)
            a.code = GRPC_STATUS_DEADLINE_EXCEEDED;
        else if (a.code == GRPC_STATUS_UNAVAILABLE && reason == COMPUTE_CLIENT_GONE)
            a.code = GRPC_STATUS_CANCELLED;
    }
    compute_bind(NULL);
    if (c->stream)
        grpc_infer_stream_wrap(&a);
    call_answer(c, &a);
}

static void *worker_main(void *arg)
{
    grpc_front *front = arg;
    pthread_mutex_lock(&front->lock);
    for (;;) {
        while (front->head == NULL && !front->stopping)
            pthread_cond_wait(&front->wake, &front->lock);
        if (front->head == NULL)
            break;
        gcall *c = front->head;
        front->head = c->next;
        if (front->head == NULL)
            front->tail = NULL;
        pthread_mutex_unlock(&front->lock);
        work(front, c);
        pthread_mutex_lock(&front->lock);
    }
    pthread_mutex_unlock(&front->lock);
    return NULL;
}

/* The credentials of cfg: TLS with --tls-cert and --tls-key, else none.
 * NULL with err filled when a file cannot be read. */
static grpc_server_credentials *credentials(const server_config *cfg, attn_error *err)
{
    if (cfg->tls_cert[0] == '\0')
        return grpc_insecure_server_credentials_create();
    char *pem[2] = {NULL, NULL};
    const char *paths[2] = {cfg->tls_cert, cfg->tls_key};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(paths[i], "rb");
        long n = -1;
        if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
            fseek(f, 0, SEEK_SET) == 0 && (pem[i] = malloc((size_t)n + 1)) != NULL &&
            fread(pem[i], 1, (size_t)n, f) == (size_t)n)
            pem[i][n] = '\0';
        else {
            free(pem[i]);
            pem[i] = NULL;
        }
        if (f != NULL)
            fclose(f);
    }
    grpc_server_credentials *creds = NULL;
    if (pem[0] != NULL && pem[1] != NULL) {
        grpc_ssl_pem_key_cert_pair pair = {pem[1], pem[0]};
        creds = grpc_ssl_server_credentials_create(NULL, &pair, 1, 0, NULL);
    }
    if (creds == NULL)
        error_set(err, ERR_INTERNAL, "tls", NULL, "gRPC cannot use --tls-cert %.200s and "
                  "--tls-key %.200s.", cfg->tls_cert, cfg->tls_key);
    free(pem[0]);
    free(pem[1]);
    return creds;
}

/* Frees what grpc_front_start made before it failed or after it stopped. */
static void front_free(grpc_front *front)
{
    if (front->server != NULL)
        grpc_server_destroy(front->server);
    if (front->cq != NULL)
        grpc_completion_queue_destroy(front->cq);
    pthread_mutex_destroy(&front->lock);
    pthread_cond_destroy(&front->wake);
    pthread_mutex_destroy(&front->shut_lock);
    pthread_cond_destroy(&front->shut_done);
    free(front->workers);
    guard_free(front->guard);
    free(front);
    grpc_shutdown_blocking();
}

grpc_front *grpc_front_start(const server_config *cfg, attn_error *err)
{
    grpc_front *front = calloc(1, sizeof *front);
    if (front == NULL) {
        error_nomem(err);
        return NULL;
    }
    grpc_init();
    front->cfg = cfg;
    pthread_mutex_init(&front->lock, NULL);
    pthread_cond_init(&front->wake, NULL);
    pthread_mutex_init(&front->shut_lock, NULL);
    pthread_cond_init(&front->shut_done, NULL);
    /* the request message may be as large as an HTTP body (RESOURCE_EXHAUSTED past it);
     * no SO_REUSEPORT (gRPC's default on Linux): a second server on a busy port must fail
     * to start, as the HTTP listener does, not take half of the calls */
    grpc_arg args[3];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = cfg->max_body > INT32_MAX ? INT32_MAX : (int)cfg->max_body;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    grpc_channel_args channel_args = {3, args};
    front->server = grpc_server_create(&channel_args, NULL);
    front->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(front->server, front->cq, NULL);
    front->guard = guard_new(cfg, err);
    grpc_server_credentials *creds = front->guard != NULL ? credentials(cfg, err) : NULL;
    if (creds == NULL) {
        front_free(front);
        return NULL;
    }
    char addr[300];
    int v6 = strchr(cfg->host, ':') != NULL;
    snprintf(addr, sizeof addr, "%s%s%s:%ld", v6 ? "[" : "", cfg->host, v6 ? "]" : "",
             cfg->grpc_port > 0 ? cfg->grpc_port : 0);
    front->port = grpc_server_add_http2_port(front->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (front->port <= 0) {
        error_set(err, ERR_INTERNAL, "grpc_port", NULL, "Cannot listen for gRPC on %s (in use, or not an address of "
                  "this machine); choose another --grpc-port, or 0 to serve HTTP only.", addr);
        front_free(front);
        return NULL;
    }
    grpc_server_start(front->server);
    request_next(front);
    front->n_workers = (size_t)cfg->max_inflight;
    front->workers = calloc(front->n_workers, sizeof *front->workers);
    size_t started = 0;
    if (front->workers != NULL)
        while (started < front->n_workers &&
               pthread_create(&front->workers[started], NULL, worker_main, front) == 0)
            started++;
    int poller_ok = started == front->n_workers &&
                    pthread_create(&front->poller, NULL, poller_main, front) == 0;
    if (!poller_ok) {
        front->n_workers = started;
        error_set(err, ERR_INTERNAL, "grpc", NULL, "The gRPC threads could not be started.");
        /* no poller: shut the server down by hand */
        pthread_mutex_lock(&front->lock);
        front->stopping = 1;
        pthread_cond_broadcast(&front->wake);
        pthread_mutex_unlock(&front->lock);
        for (size_t i = 0; i < started; i++)
            pthread_join(front->workers[i], NULL);
        grpc_server_shutdown_and_notify(front->server, front->cq, &front->shutdown_tag);
        grpc_server_cancel_all_calls(front->server);
        grpc_completion_queue_shutdown(front->cq);
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(front->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            if (ev.type == GRPC_OP_COMPLETE && ev.tag != &front->shutdown_tag)
                call_free(((gtag *)ev.tag)->call);
        }
        front_free(front);
        return NULL;
    }
    return front;
}

int grpc_front_port(const grpc_front *front)
{
    return front->port;
}

void grpc_front_stop(grpc_front *front)
{
    if (front == NULL)
        return;
    /* the workers answer what they hold and what is queued (the router
     * refuses new computations while the server drains) */
    pthread_mutex_lock(&front->lock);
    front->stopping = 1;
    pthread_cond_broadcast(&front->wake);
    pthread_mutex_unlock(&front->lock);
    for (size_t i = 0; i < front->n_workers; i++)
        pthread_join(front->workers[i], NULL);
    /* calls still open (a client that never sent its message) are cancelled
     * when the answers sent have had a moment to leave */
    grpc_server_shutdown_and_notify(front->server, front->cq, &front->shutdown_tag);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 100 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&front->shut_lock);
    while (!front->shut)
        if (pthread_cond_timedwait(&front->shut_done, &front->shut_lock, &until) != 0)
            break;
    pthread_mutex_unlock(&front->shut_lock);
    grpc_server_cancel_all_calls(front->server);
    pthread_join(front->poller, NULL);
    front_free(front);
}

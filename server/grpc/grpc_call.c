/*
 * grpc_call.c - one gRPC call's life: made when gRPC's core gives it, its
 * trace and metadata, its message read, its answer and status sent, its
 * access line, and freed once its answer has gone and it has ended.
 *
 * A call goes through up to four events of the queue, each with its own
 * tag: NEW (grpc_server_request_call gave a call; another is asked for at
 * once), RECV (its one request message arrived), SENT (the answer's batch
 * is done) and CLOSE (RECV_CLOSE_ON_SERVER: it completes when the call
 * ends, with `cancelled` set when the client cancelled, its deadline passed
 * or its connection dropped).  CLOSE is asked for on its own only by a call
 * that outlives the polling thread's handling of its request (a worker's
 * inference, a stream, a watch); a call answered on the polling thread asks
 * for it in the answer's batch, so its SENT is its CLOSE too.  It is freed
 * once SENT and CLOSE have both come.
 *
 * Every call begins a trace from its metadata as an HTTP request does from
 * its headers (trace/trace.h), answers traceresponse and x-request-id in its
 * initial metadata, and prints its access line, one a request of a stream,
 * through the same writer as HTTP's.
 */
#include "grpc_front_internal.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "metrics/metrics.h"

gcall *gcall_new(grpc_front *front)
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
    c->conn_fd = -1;
    front->live++;
    return c;
}


/* Lets go of the request message of c. */
void gcall_in_drop(gcall *c)
{
    if (c->has_in)
        grpc_slice_unref(c->in_slice);
    c->has_in = 0;
    c->in = NULL;
    gconn_release_message(c);
}

void gcall_free(gcall *c)
{
    if (c->watch)
        gwatch_unlist(c);
    gconn_unwait(c);
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
    gcall_in_drop(c);
    budget_client_release(c->client, c->call_reserved);
    budget_client_put(c->client);
    c->front->live--;
    int large = c->large;
    free(c);
    /* only now has gRPC's core let go of everything the call held (its message's
     * buffers, the answer sent): as after a large HTTP request, whatever its answer */
    if (large)
        mem_give_back();
}

/* Asks the server for the next call. */
void gcall_request_next(grpc_front *front)
{
    gcall *c = gcall_new(front);
    if (c == NULL)
        return; /* out of memory: no new calls are taken until one ends */
    if (grpc_server_request_call(front->server, &c->call, &c->details, &c->metadata, front->cq,
                                 front->cq, &c->t_new) != GRPC_CALL_OK)
        gcall_free(c);
}

/* Asks for RECV_CLOSE_ON_SERVER on its own (CLOSE), which completes when
 * the call ends, cancelled or not: for a call that outlives the polling
 * thread's handling of its request (a worker computes it, a stream, a watch),
 * so that a cancel stops its computation.  A unary call answered on the
 * polling thread asks for it in its answer's batch instead (gcall_answer),
 * which saves a batch and an event of the queue a call.  Once only. */
void gcall_close_watch(gcall *c)
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
            /* a NUL would cut the value short ("Bearer TOKEN\0junk" read as the
             * token): it becomes 0x7f, which no reader accepts, as in a path */
            for (size_t z = 0; z < n; z++)
                if (out[z] == '\0')
                    out[z] = 0x7f;
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
void gcall_log(gcall *c, grpc_status_code code, int http_status, route_id rid,
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
    char client[64] = "";
    if (!strcmp(cfg->log_format, "json")) {
        gconn_client(c, client, sizeof client);
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
size_t gcall_initial_op(gcall *c, grpc_op *op)
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
void gcall_answer(gcall *c, grpc_answer *a)
{
    /* An answer made before the router saw the call (no message, one that could
     * not be read or admitted, a refused token) says no route nor status: it
     * counts as its method's route with the twin of its code, never as
     * ROUTE_ATTENTION (0, which no gRPC answer has) with 200. */
    if (a->route == ROUTE_ATTENTION)
        a->route = grpc_method_route(c->method);
    if (a->http_status == 0)
        a->http_status = grpc_http_status_of(a->code);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    n += gcall_initial_op(c, &ops[n]);
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
    if (!stream_message && !c->close_asked) { /* see gcall_close_watch */
        c->close_asked = c->close_with_answer = 1;
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    }
    if (a->len >= MEM_GIVE_BACK_FROM)
        c->large = 1;
    double seconds = compute_now() - c->started;
    if (!c->logged && (c->in != NULL || !c->stream)) {
        gcall_log(c, a->code, a->http_status, a->route, seconds, a->len, a);
        metrics_observe(a->route, a->http_status ? a->http_status : 200, seconds, c->in_len,
                        a->len);
    }
    gcall_in_drop(c);
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
int gcall_read(gcall *c)
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
double gcall_deadline(const gcall *c)
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
int gcall_authorized(const gcall *c, grpc_answer *a)
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

/* Reads the next request message of c (TAG_RECV); when the call cannot, it
 * is over and nothing more will be sent. */
void gcall_recv_next(gcall *c)
{
    grpc_op recv_op;
    memset(&recv_op, 0, sizeof recv_op);
    recv_op.op = GRPC_OP_RECV_MESSAGE;
    recv_op.data.recv_message.recv_message = &c->recv;
    gconn_wait(c);
    if (grpc_call_start_batch(c->call, &recv_op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
        grpc_call_cancel(c->call, NULL);
        c->sent = 1;
        gcall_close_watch(c); /* its CLOSE frees it */
    }
}

/* A new call: watch for its end, and read its message. */
void gcall_on_new(gcall *c)
{
    c->started = compute_now();
    int admitted = gconn_call_begin(c);
    call_trace_begin(c);
    c->method = grpc_method_of((const char *)GRPC_SLICE_START_PTR(c->details.method),
                               GRPC_SLICE_LENGTH(c->details.method));
    c->stream = c->method == GRPC_M_MODEL_STREAM_INFER;
    if (!admitted) { /* the client's share cannot hold one more open call */
        grpc_answer a;
        memset(&a, 0, sizeof a);
        grpc_answer_error(&a, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server's memory budget (--max-memory), or this client's share of "
                          "it (--max-memory-share), cannot hold another open call now; retry "
                          "shortly.");
        a.retry_after = 1;
        gcall_answer(c, &a);
        return;
    }
    if (c->stream || c->method == GRPC_M_HEALTH_WATCH)
        gcall_close_watch(c); /* they stay open: their end must be seen */
    gcall_recv_next(c);
}

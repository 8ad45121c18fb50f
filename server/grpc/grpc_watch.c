/*
 * grpc_watch.c - grpc.health.v1's Watch: calls that stay open and are sent
 * the server's status whenever it changes.
 *
 * The polling thread keeps a list of the open watches, sends each the status
 * at once, and reads the status again every WATCH_TICK_MS while any is open
 * (gRPC's C core has no way to wake the queue from another thread, so the
 * queue is waited on with that timeout), sending each watch a change.  When
 * the server shuts down (the call asked for by grpc_server_request_call
 * fails) every watch is told NOT_SERVING and ended with UNAVAILABLE; a
 * cancelled watch leaves the list at its CLOSE.  A watch holds one message on
 * its way at most (TAG_WATCH): a change meanwhile is sent when it has gone.
 */
#include "grpc_front_internal.h"

#include <stdlib.h>
#include <string.h>

#include "metrics/metrics.h"

/* Writes the access line of watch c, which ended with code. */
void gwatch_log(gcall *c, grpc_status_code code)
{
    gcall_log(c, code, 200, ROUTE_READYZ, compute_now() - c->started, 0, NULL);
}

/* Takes c out of the list of open watches; nothing when it is not in it. */
void gwatch_unlist(gcall *c)
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
void gwatch_push(gcall *c)
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
    n += gcall_initial_op(c, &ops[n]);
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
        gwatch_log(c, code);
        gwatch_unlist(c);
    }
    c->watch_busy = 1;
    if (grpc_call_start_batch(c->call, ops, n, end ? &c->t_sent : &c->t_watch, NULL) !=
        GRPC_CALL_OK) {
        /* cannot happen for a well-formed batch; the call is cancelled rather than left open */
        grpc_call_cancel(c->call, NULL);
        gwatch_unlist(c);
        c->watch_busy = 0;
        c->sent = 1;
    }
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
}

/* Reads the status again and sends each open watch what changed. */
void gwatch_tick(grpc_front *front)
{
    front->health = grpc_health_now();
    front->health_read = compute_now();
    for (gcall *c = front->watches, *next; c != NULL; c = next) {
        next = c->watch_next; /* gwatch_push may take c out of the list */
        gwatch_push(c);
    }
}

/* A Health/Watch whose request message has come: it joins the list of open
 * watches (at most --max-connections, as each holds a call) and is told the
 * status at once. */
void gwatch_begin(gcall *c)
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
        gcall_answer(c, &a);
        return;
    }
    gcall_in_drop(c);
    c->watch = 1;
    c->watch_known = known;
    c->watch_next = front->watches;
    if (front->watches != NULL)
        front->watches->watch_prev = c;
    front->watches = c;
    front->n_watches++;
    metrics_grpc_watches_add(1);
    gwatch_tick(front);
}

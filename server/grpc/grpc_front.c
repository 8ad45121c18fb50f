/*
 * grpc_front.c - the gRPC server: gRPC's C core, one completion queue, the
 * thread that polls it, and the workers that run inference.
 *
 * Only the polling thread handles the queue's events (grpc_call.c has a
 * call's), so a call's flags need no lock.  The cheap RPCs are answered on
 * the polling thread (grpc_service.c), and so is a small ModelInfer when the
 * router finds it small and a compute slot free (as HTTP's I/O threads do).
 * Any other ModelInfer joins the server's one queue (work/work_queue.h),
 * which HTTP's requests join too, served by --max-inflight workers; a
 * worker binds the call's compute token (the call's deadline, or --deadline
 * when that is sooner) and asks the router, which admits the computation
 * under the same limits as HTTP's.  A CLOSE with `cancelled` stops the
 * token, so the computation ends within one block of keys as for an HTTP
 * client that went away.  A call that waited longer than --queue-wait-ms for
 * a worker is answered UNAVAILABLE with a retry hint when a worker takes it.
 *
 * A message is admitted before it is unpacked (grpc_conn.c): its peak is
 * reserved in the budget through the client's share, as an HTTP body's is.
 */
#include "grpc_front_internal.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message/answer.h"
#include "metrics/metrics.h"

static void job_run(work_item *it);
static void job_done(work_item *it);
static void job_refuse(work_item *it, const attn_error *err);
/* a gRPC call's client going away is seen by its CLOSE, which stops its token */
static const work_ops job_ops = {job_run, job_done, job_refuse, NULL};

/* The request of c arrived: a cheap RPC is answered now, ModelInfer queued. */
static void on_recv(gcall *c, int ok)
{
    grpc_answer a;
    memset(&a, 0, sizeof a);
    gconn_unwait(c);
    if (ok && c->stream && c->recv == NULL) { /* the client has sent its last request */
        a.route = ROUTE_V2_INFER;
        gcall_answer(c, &a);
        return;
    }
    int had_message = c->recv != NULL;
    if (!ok || !had_message || gcall_read(c) != 0) {
        if (!ok) {
            c->sent = 1; /* the call is gone: nothing to send */
            gcall_close_watch(c); /* its CLOSE comes at once */
            return;
        }
        grpc_answer_error(&a, GRPC_STATUS_INVALID_ARGUMENT, "%s",
                          !had_message ? "The call carried no request message."
                                       : "The request message could not be decompressed.");
        gcall_answer(c, &a);
        return;
    }
    if (!c->stream)     /* a stream's requests are timed from their arrival */
        c->read_seconds = compute_now() - c->started;
    c->stream_later = c->stream; /* its next request may be long in coming */
    /* the message's peak is reserved before protobuf-c unpacks it */
    if (gconn_admit_message(c, &a) != 0) {
        gcall_answer(c, &a);
        return;
    }
    if (gcall_authorized(c, &a) != 0) {
        gcall_answer(c, &a);
        return;
    }
    if (c->method == GRPC_M_HEALTH_WATCH) {
        gwatch_begin(c);
        return;
    }
    if (!c->stream && c->method != GRPC_M_MODEL_INFER) {
        grpc_service_answer(c->method, c->in, c->in_len, &a);
        gcall_answer(c, &a);
        return;
    }
    grpc_front *front = c->front;
    metrics_grpc_inflight_add(1);
    c->inflight = 1;
    c->token.deadline = gcall_deadline(c);
    atomic_init(&c->token.reason, COMPUTE_RUNNING);
    c->queued_at = compute_now();
    if (c->stream)
        c->started = c->queued_at; /* each request of a stream is timed from its arrival */
    /* A small request is answered here, as HTTP answers one on its I/O thread
     * (--inline-max-bytes); the router defers anything larger to a worker. */
    if (!c->stream && c->in_len <= front->cfg->inline_max_bytes) {
        compute_bind(&c->token);
        grpc_infer_answer(c->in, c->in_len, grpc_infer_unpack_bound(c->in_len), 0, 1, 0, &a);
        compute_bind(NULL);
        if (!a.deferred) {
            gcall_answer(c, &a);
            return;
        }
        memset(&a, 0, sizeof a);
    }
    gcall_close_watch(c); /* a worker computes it: a cancel must stop it */
    c->served = "worker";
    c->item = (work_item){.ops = &job_ops, .token = &c->token, .owner = front};
    pthread_mutex_lock(&front->queue_lock); /* no call joins the queue once the stop drained it */
    int queued = !front->stopping && work_queue_push(&c->item) == 0;
    pthread_mutex_unlock(&front->queue_lock);
    if (!queued) {
        attn_error err;
        answer_draining_error(&err);
        job_refuse(&c->item, &err);
    }
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
        /* while watches are open, the queue is left every WATCH_TICK_MS to read the
         * status; while calls wait for their message, every SWEEP_MS to hold them to
         * their limits; while connections are open, every second to count those gone */
        long tick_ms = front->n_watches > 0 ? WATCH_TICK_MS
                       : front->n_waiting > 0 ? SWEEP_MS
                       : front->conns != NULL ? 1000 : -1;
        gpr_timespec until =
            tick_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(tick_ms, GPR_TIMESPAN))
                        : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(front->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        double now = compute_now();
        if (front->n_watches > 0 && now - front->health_read >= WATCH_TICK_MS / 1000.0)
            gwatch_tick(front);
        if (now - front->swept >= (front->n_waiting > 0 ? SWEEP_MS / 1000.0 : 1.0))
            gconn_sweep(front);
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
                gcall_free(c);
                front->watch_end = 1;
                gwatch_tick(front);
                break;
            }
            gcall_request_next(front);
            gcall_on_new(c);
            break;
        case TAG_RECV:
            on_recv(c, ev.success);
            break;
        case TAG_WATCH:
            c->watch_busy = 0;
            if (!ev.success || c->closed) { /* the call is over: nothing more goes */
                gwatch_unlist(c);
                c->sent = 1;
            } else {
                gwatch_push(c); /* what changed while this status was on its way */
            }
            break;
        case TAG_SENT:
        case TAG_STREAM:
            c->watch_busy = 0;
            if (c->inflight)
                metrics_grpc_inflight_add(-1);
            c->inflight = 0;
            if (what == TAG_STREAM && ev.success)
                gcall_recv_next(c); /* the next request of the stream */
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
                gwatch_log(c, GRPC_STATUS_CANCELLED);
                gwatch_unlist(c);
                if (!c->watch_busy)
                    c->sent = 1;
            }
            break;
        }
        if (what != TAG_NEW && c->sent && c->closed)
            gcall_free(c);
        maybe_finish(front);
    }
    return NULL;
}

/* Answers one queued ModelInfer on a worker. */
static gcall *call_of(work_item *it)
{
    return (gcall *)((char *)it - offsetof(gcall, item));
}

/* Answers a queued ModelInfer on a worker (work/work_queue.h), its token bound. */
static void job_run(work_item *it)
{
    gcall *c = call_of(it);
    grpc_answer *a = &c->answer;
    memset(a, 0, sizeof *a);
    grpc_infer_answer(c->in, c->in_len, grpc_infer_unpack_bound(c->in_len), c->queued_at, 0,
                      c->stream, a);
    /* a computation stopped by its token answers with the reason's code */
    int reason = atomic_load(&c->token.reason);
    if (a->code == GRPC_STATUS_UNAVAILABLE && reason == COMPUTE_DEADLINE)
        a->code = GRPC_STATUS_DEADLINE_EXCEEDED;
    else if (a->code == GRPC_STATUS_UNAVAILABLE && reason == COMPUTE_CLIENT_GONE)
        a->code = GRPC_STATUS_CANCELLED;
    if (c->stream)
        grpc_infer_stream_error(a);
}

/* Sends the answer: the call is the polling thread's again. */
static void job_done(work_item *it)
{
    gcall *c = call_of(it);
    gcall_answer(c, &c->answer);
}

/* Ends a call unrun with the queue's words (overloaded, deadline, client gone,
 * shutting down). */
static void job_refuse(work_item *it, const attn_error *err)
{
    gcall *c = call_of(it);
    memset(&c->answer, 0, sizeof c->answer);
    grpc_answer_from_error(&c->answer, err, ROUTE_V2_INFER);
    if (c->stream)
        grpc_infer_stream_error(&c->answer);
    gcall_answer(c, &c->answer);
}

/* The TLS credentials of --tls-cert and --tls-key; NULL with err filled when
 * a file cannot be read. */
static grpc_server_credentials *credentials(const server_config *cfg, attn_error *err)
{
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

/* The settings gRPC core's own log lines follow (gpr_set_log_function is the
 * process's, so they are too): --quiet drops them, --log-format json makes
 * each a JSON line through the same writer as libmicrohttpd's. */
static const server_config *log_cfg;

static void on_grpc_log(gpr_log_func_args *args)
{
    const server_config *cfg = log_cfg;
    if (cfg == NULL || cfg->quiet)
        return;
    char text[512];
    snprintf(text, sizeof text, "%s", args->message != NULL ? args->message : "");
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        text[--n] = '\0';
    trace_printable(text); /* it may quote a client's bytes: JSON strings must be UTF-8 */
    if (!strcmp(cfg->log_format, "json"))
        trace_log_message("grpc", text);
    else
        fprintf(stderr, "grpc: %s\n", text);
}

/* An integer channel argument. */
static grpc_arg int_arg(const char *key, long value)
{
    grpc_arg a;
    a.type = GRPC_ARG_INTEGER;
    a.key = (char *)key;
    a.value.integer = value > INT32_MAX ? INT32_MAX : (int)value;
    return a;
}

/* Frees what grpc_front_start made before it failed or after it stopped. */
static void front_free(grpc_front *front)
{
    if (front->server != NULL)
        grpc_server_destroy(front->server);
    gconn_stop(front->conns);
    if (front->cq != NULL)
        grpc_completion_queue_destroy(front->cq);
    pthread_mutex_destroy(&front->queue_lock);
    pthread_mutex_destroy(&front->shut_lock);
    pthread_cond_destroy(&front->shut_done);
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
    log_cfg = cfg;
    gpr_set_log_function(on_grpc_log);
    grpc_init();
    front->cfg = cfg;
    pthread_mutex_init(&front->queue_lock, NULL);
    pthread_mutex_init(&front->shut_lock, NULL);
    pthread_cond_init(&front->shut_done, NULL);
    /* the request message may be as large as an HTTP body (RESOURCE_EXHAUSTED past it);
     * no SO_REUSEPORT (gRPC's default on Linux): a second server on a busy port must fail
     * to start, as the HTTP listener does, not take half of the calls.  The limits HTTP
     * holds on a connection, in gRPC's terms (docs/security.md): calls open at once on
     * one connection (--grpc-max-streams, advertised as MAX_CONCURRENT_STREAMS), a
     * connection with no call closed after --timeout, a TLS handshake within
     * --header-timeout, and the metadata of a call within HTTP's header block. */
    grpc_arg args[8];
    int n_args = 0;
    args[n_args++] = int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                             cfg->max_body > INT32_MAX ? INT32_MAX : (long)cfg->max_body);
    args[n_args++] = int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
    args[n_args++] = int_arg(GRPC_ARG_ALLOW_REUSEPORT, 0);
    args[n_args++] = int_arg(GRPC_ARG_MAX_CONCURRENT_STREAMS, cfg->grpc_max_streams);
    args[n_args++] = int_arg(GRPC_ARG_MAX_CONNECTION_IDLE_MS, cfg->timeout * 1000);
    args[n_args++] = int_arg(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, cfg->header_timeout * 1000);
    args[n_args++] = int_arg(GRPC_ARG_MAX_METADATA_SIZE, GUARD_MAX_HEADER_BYTES);
    /* under TLS gRPC's core accepts, and its resource quota bounds what its
     * connections buffer (a share of the budget, as one client's); without TLS the
     * front-end accepts and reserves what is on its way in the budget (grpc_conn.c) */
    grpc_resource_quota *quota = NULL;
    if (cfg->tls_cert[0] != '\0' && budget_client_cap() != 0) {
        quota = grpc_resource_quota_create("grpc");
        grpc_resource_quota_resize(quota, budget_client_cap());
        args[n_args].type = GRPC_ARG_POINTER;
        args[n_args].key = GRPC_ARG_RESOURCE_QUOTA;
        args[n_args].value.pointer.p = quota;
        args[n_args++].value.pointer.vtable = grpc_resource_quota_arg_vtable();
    }
    grpc_channel_args channel_args = {(size_t)n_args, args};
    front->server = grpc_server_create(&channel_args, NULL);
    if (quota != NULL)
        grpc_resource_quota_unref(quota);
    front->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(front->server, front->cq, NULL);
    front->guard = guard_new(cfg, err);
    if (front->guard == NULL) {
        front_free(front);
        return NULL;
    }
    if (cfg->tls_cert[0] == '\0') {
        grpc_server_start(front->server);
        front->conns = gconn_listen(front, err);
        if (front->conns == NULL) {
            front_free(front);
            return NULL;
        }
        front->port = gconn_port(front->conns);
    } else {
        grpc_server_credentials *creds = credentials(cfg, err);
        if (creds == NULL) {
            front_free(front);
            return NULL;
        }
        char addr[300];
        gconn_listen_address(cfg, addr, sizeof addr);
        front->port = grpc_server_add_http2_port(front->server, addr, creds);
        grpc_server_credentials_release(creds);
        if (front->port <= 0) {
            gconn_listen_error(cfg, err);
            front_free(front);
            return NULL;
        }
        grpc_server_start(front->server);
    }
    gcall_request_next(front);
    if (pthread_create(&front->poller, NULL, poller_main, front) != 0) {
        error_set(err, ERR_INTERNAL, "grpc", NULL, "The gRPC threads could not be started.");
        /* no poller: shut the server down by hand */
        gconn_stop_accepting(front->conns);
        grpc_server_shutdown_and_notify(front->server, front->cq, &front->shutdown_tag);
        grpc_server_cancel_all_calls(front->server);
        grpc_completion_queue_shutdown(front->cq);
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(front->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            if (ev.type == GRPC_OP_COMPLETE && ev.tag != &front->shutdown_tag)
                gcall_free(((gtag *)ev.tag)->call);
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
    /* calls still queued are answered UNAVAILABLE; those a worker runs end (main.c
     * stops their computations while it drains) */
    pthread_mutex_lock(&front->queue_lock);
    front->stopping = 1;
    pthread_mutex_unlock(&front->queue_lock);
    attn_error err;
    answer_draining_error(&err);
    work_queue_drain(front, &err);
    /* calls still open (a client that never sent its message) are cancelled
     * when the answers sent have had a moment to leave */
    gconn_stop_accepting(front->conns);
    grpc_server_shutdown_and_notify(front->server, front->cq, &front->shutdown_tag);
    struct timespec until = compute_wake_after(100);
    pthread_mutex_lock(&front->shut_lock);
    while (!front->shut)
        if (pthread_cond_timedwait(&front->shut_done, &front->shut_lock, &until) != 0)
            break;
    pthread_mutex_unlock(&front->shut_lock);
    grpc_server_cancel_all_calls(front->server);
    pthread_join(front->poller, NULL);
    front_free(front);
}

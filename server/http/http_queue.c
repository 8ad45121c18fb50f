/*
 * http_queue.c - handing a request to the server's workers.
 *
 * A complete request that is not cheap (route.h) is handed over: its
 * connection is suspended (MHD_suspend_connection), the request joins the
 * server's one queue (work/work_queue.h, which gRPC's calls join too),
 * served by --max-inflight worker threads, and the worker resumes the
 * connection when the answer is ready, so the I/O thread goes on serving
 * other sockets in between.  The queue ends a request unrun (its client gone,
 * its deadline passed, or past --queue-wait-ms) with the words it keeps for
 * every transport; here that becomes a 503 with Retry-After.
 * libmicrohttpd is never called under srv->lock, as its threads take that
 * lock inside their callbacks.
 */
#include <stddef.h>
#include <string.h>

#include "message/answer.h"
#include "router/api.h"
#include "work/work_queue.h"
#include "http_private.h"

/* Starts the request's compute token: its deadline (--deadline, or its own
 * lower X-Deadline-Ms) runs from here, whichever thread computes. */
void http_request_token_start(http_server *srv, http_request *hr)
{
    double seconds = (double)srv->cfg->deadline;
    if (hr->deadline_ms > 0 && (double)hr->deadline_ms / 1000.0 < seconds)
        seconds = (double)hr->deadline_ms / 1000.0;
    hr->token.deadline = compute_now() + seconds;
    atomic_init(&hr->token.reason, COMPUTE_RUNNING);
}

/* Counts an attention request that never reached its handler (stopped by its
 * deadline or its client while it waited, or refused when --queue-wait-ms ran
 * out) in the autoscaling histograms, as the handler counts the others: its
 * wait for a worker is the very signal they are kept for, and leaving it out
 * would hide an overload behind its own 503s.  No compute time; the model
 * is the one the path names (v2), or "_unknown" (v1 names it in the body,
 * which is not read for this). */
static void observe_unrun(const http_request *hr, int io_thread)
{
    if (hr->route == NULL || (hr->route->id != ROUTE_ATTENTION && hr->route->id != ROUTE_V2_INFER))
        return;
    double waited = io_thread || hr->queued_at <= 0 ? 0 : compute_now() - hr->queued_at;
    metrics_attention_observe(hr->args.model, "http", waited, -1, hr->len);
}

/* Answers hr into hr->resp on the calling thread, under its token: the work
 * of a worker (io_thread 0), or of the I/O thread for an inline candidate
 * (io_thread 1: hr->resp.deferred may come back set, with nothing else). */
void http_request_handle(http_request *hr, int io_thread)
{
    compute_bind(&hr->token);
    attn_error err;
    error_clear(&err);
    if (compute_stop_error(&err) != 0) {
        observe_unrun(hr, io_thread);
        http_error_response(&hr->resp, hr, &err);
    } else {
        api_request req = {.method = hr->mhd_method, .path = hr->mhd_url, .body = hr->body,
                           .body_len = hr->len,
                           .inference_header_length = hr->inference_header_length,
                           .if_match = hr->if_match, .io_thread = io_thread,
                           .route = hr->route, .args = &hr->args, .query_arg = http_query_arg,
                           .query_ctx = hr->conn, .queued_at = io_thread ? 0.0 : hr->queued_at,
                           .protocol = "http"};
        api_handle(&req, &hr->resp);
    }
    compute_bind(NULL);
}

/* The work queue's view of a request (work/work_queue.h). */
static http_request *request_of(work_item *it)
{
    return (http_request *)((char *)it - offsetof(http_request, item));
}

static void job_run(work_item *it)
{
    http_request *hr = request_of(it);
    hr->job = JOB_RUNNING;
    http_request_handle(hr, 0);
    http_answer_encode(hr);
}

/* Hands hr back to its I/O thread: from the resume on, hr is its again. */
static void job_done(work_item *it)
{
    http_request *hr = request_of(it);
    hr->job = JOB_DONE;
    MHD_resume_connection(hr->conn);
}

static void job_refuse(work_item *it, const attn_error *err)
{
    http_request *hr = request_of(it);
    observe_unrun(hr, 0);
    http_error_response(&hr->resp, hr, err);
    job_done(it);
}

/* A suspended connection is not closed by libmicrohttpd, so its record and
 * descriptor stay while the request is with the queue; srv->lock orders this
 * look after the record's making. */
static int job_client_gone(const work_item *it)
{
    const http_request *hr = (const http_request *)((const char *)it - offsetof(http_request, item));
    pthread_mutex_lock(&hr->srv->lock);
    int gone = hr->hc != NULL && hr->hc->fd >= 0 && http_peer_gone(hr->hc->fd);
    pthread_mutex_unlock(&hr->srv->lock);
    return gone;
}

static const work_ops job_ops = {job_run, job_done, job_refuse, job_client_gone};

/* Suspends the connection of a complete request, whose token has started,
 * and queues it for a worker (work/work_queue.h); a queue that stops
 * refuses it at once. */
void http_dispatch(http_server *srv, http_request *hr)
{
    hr->queued_at = compute_now();
    hr->job = JOB_QUEUED;
    hr->item = (work_item){.ops = &job_ops, .token = &hr->token, .owner = srv};
    /* Suspend first: a worker may resume the connection as soon as the
     * request is in the queue. */
    MHD_suspend_connection(hr->conn);
    pthread_mutex_lock(&srv->dispatch_lock); /* none is queued once http_stop drained */
    int queued = !srv->draining && work_queue_push(&hr->item) == 0;
    pthread_mutex_unlock(&srv->dispatch_lock);
    if (!queued) {
        attn_error err;
        answer_draining_error(&err);
        job_refuse(&hr->item, &err);
    }
}

/* Starts the reaper.  Returns 0, or -1. */
int http_threads_start(http_server *srv)
{
    if (pthread_create(&srv->reaper, NULL, http_reaper_main, srv) == 0)
        srv->reaper_started = 1;
    return srv->reaper_started ? 0 : -1;
}

/* Stops and joins the reaper when it was started. */
void http_threads_stop(http_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    srv->stopping = 1;
    pthread_cond_broadcast(&srv->reaper_wake);
    pthread_mutex_unlock(&srv->lock);
    if (srv->reaper_started)
        pthread_join(srv->reaper, NULL);
    srv->reaper_started = 0;
}

/*
 * http_queue.c - the worker threads and the queue that feeds them.
 *
 * A complete request that is not cheap (route.h) is handed over: its
 * connection is suspended (MHD_suspend_connection), the request joins a
 * queue served by --max-inflight worker threads, and the worker resumes the
 * connection when the answer is ready, so the I/O thread goes on serving
 * other sockets in between.  A request that finds no worker free within
 * --queue-wait-ms is answered 503 with Retry-After by the reaper
 * (http_conn.c).  libmicrohttpd is never called under srv->lock, as its
 * threads take that lock inside their callbacks.
 */
#include <string.h>

#include "router/api.h"
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
void http_dispatch(http_server *srv, http_request *hr)
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
    metrics_queue_add(1);
    pthread_cond_signal(&srv->work);
    pthread_mutex_unlock(&srv->lock);
}

/* Ends a queued request without running it (under srv->lock): its answer is
 * the error, and it joins *resume, the list of connections the caller
 * resumes (http_resume_all) once it has let go of the lock.  libmicrohttpd is
 * never called under srv->lock, as its threads take that lock inside their
 * callbacks. */
void http_finish_unrun(http_server *srv, http_request *hr, const attn_error *err,
                       http_request **resume)
{
    queue_remove(srv, hr);
    metrics_queue_add(-1);
    observe_unrun(hr, 0);
    http_error_response(&hr->resp, hr, err);
    hr->job = JOB_DONE;
    hr->qnext = *resume;
    *resume = hr;
}

/* Resumes every connection of the list (outside srv->lock); each request
 * belongs to its I/O thread again from its call on. */
void http_resume_all(http_request *list)
{
    while (list != NULL) {
        http_request *next = list->qnext;
        list->qnext = NULL;
        MHD_resume_connection(list->conn);
        list = next;
    }
}

static void *http_worker_main(void *arg)
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
        metrics_queue_add(-1);
        hr->job = JOB_RUNNING;
        hr->qnext = srv->running;
        if (srv->running != NULL)
            srv->running->qprev = hr;
        srv->running = hr;
        pthread_mutex_unlock(&srv->lock);

        http_request_handle(hr, 0);
        http_answer_encode(hr);

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

/* Starts the --max-inflight workers and the reaper.  Returns 0, or -1 with
 * those that started stopped again. */
int http_threads_start(http_server *srv)
{
    for (long i = 0; i < srv->cfg->max_inflight; i++) {
        if (pthread_create(&srv->workers[srv->worker_count], NULL, http_worker_main, srv) != 0)
            break;
        srv->worker_count++;
    }
    if (srv->worker_count == (unsigned)srv->cfg->max_inflight &&
        pthread_create(&srv->reaper, NULL, http_reaper_main, srv) == 0)
        srv->reaper_started = 1;
    if (srv->reaper_started)
        return 0;
    http_threads_stop(srv);
    return -1;
}

/* Stops and joins the workers and the reaper that were started. */
void http_threads_stop(http_server *srv)
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

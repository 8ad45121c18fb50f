/*
 * work_queue.h - the one queue of work waiting for one of the --max-inflight
 * workers, whichever transport brought it.
 *
 * HTTP requests and gRPC calls that are not cheap join this queue, in the
 * order they came, and --max-inflight worker threads take them: the limit is
 * the server's, not each transport's.  The rules of the wait are written here
 * once, with their words: an item whose client went away, whose deadline
 * passed, or that waited past --queue-wait-ms is ended unrun (the queue's
 * reaper looks a few times a second, and a worker looks again as it takes an
 * item); a transport that stops ends its own items still queued.  A transport
 * says how to run and how to refuse one of its items (work_ops) and turns
 * the error into its own answer (an HTTP status, a gRPC status code).
 */
#ifndef ATTN_WORK_QUEUE_H
#define ATTN_WORK_QUEUE_H

#include "core/compute.h"
#include "core/error.h"

typedef struct work_item work_item;

typedef struct work_ops {
    /* Runs it on a worker thread, its token bound (compute_bind), keeping
     * its answer; then done hands it back to its transport (sends or resumes
     * it), after which the queue reads nothing of it. */
    void (*run)(work_item *it);
    void (*done)(work_item *it);
    /* Ends it unrun with err, on the reaper, a worker or the thread that
     * drains its transport, with no lock of the queue held. */
    void (*refuse)(work_item *it, const attn_error *err);
    /* 1 when its client has gone away, for a transport that must look (HTTP
     * peeks at the socket); NULL when the transport stops the token itself.
     * Called under the queue's lock on the reaper: must not block. */
    int (*client_gone)(const work_item *it);
} work_ops;

struct work_item {
    const work_ops *ops;
    compute_token *token;       /* the item's (started), borrowed */
    const void *owner;          /* the transport that queued it (work_queue_drain) */
    double queued_at;           /* compute_now() when queued, set by work_queue_push */
    work_item *prev, *next;     /* the queue's own */
};

/* Starts `workers` threads and the reaper; queue_wait_ms is --queue-wait-ms.
 * Returns 0, or -1 with nothing left running. */
int work_queue_start(long workers, long queue_wait_ms);

/* The workers running (0 before the start and after the stop): with none,
 * a transport answers every request on its own thread. */
long work_queue_workers(void);

/* Queues it (ops, token and owner set).  Returns 0, or -1 when the queue
 * is stopping or not started (it is not queued then). */
int work_queue_push(work_item *it);

/* Ends every item of owner still queued with err (its refuse), then waits
 * until no item of owner runs: the transport may then stop. */
void work_queue_drain(const void *owner, const attn_error *err);

/* Stops the workers and the reaper (after every transport drained). */
void work_queue_stop(void);

/* Items queued now (the gauge of /metrics counts them too). */
long work_queue_length(void);

#endif

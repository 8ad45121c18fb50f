/*
 * work_queue.c - the one queue of work for the --max-inflight workers (see
 * work_queue.h).
 *
 * One mutex guards the queue and each worker's slot (the item it runs and
 * whose it is); a worker waits on `work`, the reaper wakes every
 * WORK_REAPER_MS, and a drain waits on `idle` for its transport's items to be
 * done.  A transport's callbacks are never called under the mutex (but
 * client_gone, which only peeks), so they may take their own locks.  A
 * worker clears the item from its slot before `done` hands it back, since
 * the transport may free it from then on; the slot keeps the owner until
 * `done` has returned, for the drain.
 */
#include "work_queue.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "metrics/metrics.h"

/* How often the reaper looks at the queue. */
#define WORK_REAPER_MS 100

typedef struct work_slot {
    work_item *it;              /* running, NULL once done begins */
    const void *owner;          /* until done has returned */
} work_slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static pthread_cond_t reaper_wake = PTHREAD_COND_INITIALIZER;
static work_item *queue_head, *queue_tail;
static long queued_count;
static pthread_t *workers, reaper;
static work_slot *slots;
static long worker_count;
static int reaper_started, stopping;
static double queue_wait;       /* seconds */

/* Unlinks it from the queue (under lock). */
static void unlink_item(work_item *it)
{
    if (it->prev != NULL)
        it->prev->next = it->next;
    else
        queue_head = it->next;
    if (it->next != NULL)
        it->next->prev = it->prev;
    else
        queue_tail = it->prev;
    queued_count--;
    metrics_queue_add(-1);
    it->prev = it->next = NULL;
}

/* Whether queued item it must end unrun now, with the words in err: its client
 * went away, it was stopped or its deadline passed, or it waited too long. */
static int verdict(work_item *it, double now, attn_error *err)
{
    if (it->ops->client_gone != NULL && it->ops->client_gone(it)) {
        compute_token_stop(it->token, COMPUTE_CLIENT_GONE);
        error_set(err, ERR_UNAVAILABLE, "client_closed", NULL,
                  "The client closed its connection before the request was started.");
        return 1;
    }
    if (now > it->token->deadline && it->token->deadline > 0)
        compute_token_stop(it->token, COMPUTE_DEADLINE);
    compute_bind(it->token);
    int stopped = compute_stop_error(err) != 0;
    compute_bind(NULL);
    if (stopped)
        return 1;
    if (now - it->queued_at > queue_wait) {
        error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "Every one of the server's %ld workers stayed busy for %ld ms "
                  "(--max-inflight, --queue-wait-ms); retry shortly.",
                  worker_count, (long)(queue_wait * 1000.0 + 0.5));
        return 1;
    }
    return 0;
}

/* Refuses the items of list (linked by next, out of every list), unlocked. */
static void refuse_all(work_item *list, const attn_error *errs)
{
    for (size_t i = 0; list != NULL; i++) {
        work_item *next = list->next;
        list->next = NULL;
        list->ops->refuse(list, &errs[i]);
        list = next;
    }
}

static void *worker_main(void *arg)
{
    work_slot *slot = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (queue_head == NULL && !stopping)
            pthread_cond_wait(&work, &lock);
        if (queue_head == NULL)
            break;
        work_item *it = queue_head;
        unlink_item(it);
        attn_error err;
        error_clear(&err);
        if (verdict(it, compute_now(), &err)) {
            pthread_mutex_unlock(&lock);
            it->ops->refuse(it, &err);
            pthread_mutex_lock(&lock);
            continue;
        }
        slot->it = it;
        slot->owner = it->owner;
        pthread_mutex_unlock(&lock);
        compute_bind(it->token);
        it->ops->run(it);
        compute_bind(NULL);
        pthread_mutex_lock(&lock);
        slot->it = NULL;
        pthread_mutex_unlock(&lock);
        it->ops->done(it);
        pthread_mutex_lock(&lock);
        slot->owner = NULL;
        pthread_cond_broadcast(&idle);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Batches of items the reaper ends per look (the rest wait for the next). */
#define REAP_BATCH 64

static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!stopping) {
        struct timespec until = compute_wake_after(WORK_REAPER_MS);
        pthread_cond_timedwait(&reaper_wake, &lock, &until);
        if (stopping)
            break;
        double now = compute_now();
        work_item *ended = NULL, **tail = &ended;
        attn_error errs[REAP_BATCH];
        size_t n = 0;
        for (work_item *it = queue_head, *next; it != NULL && n < REAP_BATCH; it = next) {
            next = it->next;
            error_clear(&errs[n]);
            if (!verdict(it, now, &errs[n]))
                continue;
            unlink_item(it);
            *tail = it;
            tail = &it->next;
            n++;
        }
        for (long w = 0; w < worker_count; w++) {
            work_item *it = slots[w].it;
            if (it != NULL && it->ops->client_gone != NULL && it->ops->client_gone(it))
                compute_token_stop(it->token, COMPUTE_CLIENT_GONE);
        }
        pthread_mutex_unlock(&lock);
        refuse_all(ended, errs);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int work_queue_start(long n, long queue_wait_ms)
{
    pthread_mutex_lock(&lock);
    stopping = 0;
    queue_wait = (double)queue_wait_ms / 1000.0;
    pthread_mutex_unlock(&lock);
    workers = calloc(n > 0 ? (size_t)n : 1, sizeof *workers);
    slots = calloc(n > 0 ? (size_t)n : 1, sizeof *slots);
    if (workers == NULL || slots == NULL) {
        free(workers);
        free(slots);
        workers = NULL;
        slots = NULL;
        return -1;
    }
    long started = 0;
    while (started < n && pthread_create(&workers[started], NULL, worker_main, &slots[started]) == 0)
        started++;
    pthread_mutex_lock(&lock);
    worker_count = started;
    pthread_mutex_unlock(&lock);
    if (started == n && pthread_create(&reaper, NULL, reaper_main, NULL) == 0) {
        reaper_started = 1;
        return 0;
    }
    work_queue_stop();
    return -1;
}

long work_queue_workers(void)
{
    pthread_mutex_lock(&lock);
    long n = stopping ? 0 : worker_count;
    pthread_mutex_unlock(&lock);
    return n;
}

int work_queue_push(work_item *it)
{
    it->queued_at = compute_now();
    it->prev = it->next = NULL;
    pthread_mutex_lock(&lock);
    if (stopping || worker_count == 0) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    it->prev = queue_tail;
    if (queue_tail != NULL)
        queue_tail->next = it;
    else
        queue_head = it;
    queue_tail = it;
    queued_count++;
    metrics_queue_add(1);
    pthread_cond_signal(&work);
    pthread_mutex_unlock(&lock);
    return 0;
}

void work_queue_drain(const void *owner, const attn_error *err)
{
    pthread_mutex_lock(&lock);
    for (;;) {
        work_item *it = queue_head;
        while (it != NULL && it->owner != owner)
            it = it->next;
        if (it == NULL)
            break;
        unlink_item(it);
        pthread_mutex_unlock(&lock);
        it->ops->refuse(it, err);
        pthread_mutex_lock(&lock);
    }
    for (;;) {
        long w = 0;
        while (w < worker_count && slots[w].owner != owner)
            w++;
        if (w == worker_count)
            break;
        pthread_cond_wait(&idle, &lock);
    }
    pthread_mutex_unlock(&lock);
}

void work_queue_stop(void)
{
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_broadcast(&work);
    pthread_cond_broadcast(&reaper_wake);
    pthread_mutex_unlock(&lock);
    for (long i = 0; i < worker_count; i++)
        pthread_join(workers[i], NULL);
    if (reaper_started)
        pthread_join(reaper, NULL);
    reaper_started = 0;
    pthread_mutex_lock(&lock);
    worker_count = 0;
    pthread_mutex_unlock(&lock);
    free(workers);
    free(slots);
    workers = NULL;
    slots = NULL;
}

long work_queue_length(void)
{
    pthread_mutex_lock(&lock);
    long n = queued_count;
    pthread_mutex_unlock(&lock);
    return n;
}

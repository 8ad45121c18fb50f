/*
 * model_holds.c - how many weight sets of each name exist, so that the
 * per-model series of /metrics (autoscale.c) and the per-model statistics
 * (model_stats.c) of a name are let go when its last set is freed.
 *
 * The store counts every set it makes (metrics_model_hold) and frees
 * (metrics_model_unhold).  A deleted set is freed only when the last request
 * computing with it lets go of its reference, and a request counts itself
 * in the metrics before it does so: when the count of a name reaches zero,
 * nobody can still report under that name's set, and its series and
 * statistics are dropped, their places free for the next model.  Series
 * are always found by name under their table's lock, never kept as an
 * index, so a place reused by another set is never written by a request of
 * the old one.  The release runs under holds_lock, which a new set of the
 * same name must take too, so it cannot drop the series of a set made
 * meanwhile.  Lock order: holds_lock, then the tables' locks.
 */
#include <pthread.h>
#include <string.h>

#include "core/addr_key.h"
#include "core/mem.h"
#include "metrics.h"
#include "metrics_internal.h"

#define HOLD_BUCKETS 4096

typedef struct hold {
    struct hold *next;
    unsigned long count;
    char name[];
} hold;

static pthread_mutex_t holds_lock = PTHREAD_MUTEX_INITIALIZER;
static hold *buckets[HOLD_BUCKETS];

/* The link that points at name's entry (or at the NULL ending its chain).
 * Under holds_lock. */
static hold **hold_link(const char *name)
{
    hold **link = &buckets[addr_key_bucket((const unsigned char *)name, strlen(name),
                                           HOLD_BUCKETS)];
    while (*link != NULL && strcmp((*link)->name, name) != 0)
        link = &(*link)->next;
    return link;
}

void metrics_model_hold(const char *name)
{
    pthread_mutex_lock(&holds_lock);
    hold **link = hold_link(name);
    if (*link == NULL) {
        size_t len = strlen(name) + 1;
        hold *h = mem_malloc(sizeof *h + len);
        if (h != NULL) {        /* out of memory: the name's series are never let go */
            h->next = NULL;
            h->count = 0;
            memcpy(h->name, name, len);
            *link = h;
        }
    }
    if (*link != NULL)
        (*link)->count++;
    pthread_mutex_unlock(&holds_lock);
}

void metrics_model_unhold(const char *name)
{
    pthread_mutex_lock(&holds_lock);
    hold **link = hold_link(name);
    hold *h = *link;
    if (h != NULL && --h->count == 0) {
        *link = h->next;
        mem_free(h);
        autoscale_forget(name);
        model_stats_forget(name);
    }
    pthread_mutex_unlock(&holds_lock);
}

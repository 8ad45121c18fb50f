/*
 * store_table.c - the in-memory table of the weight-set store: the sets
 * with their reference counts (new ones, and those built from a loaded
 * file), and get, put, delete and list.
 *
 * Sets are immutable once in the table; a reader takes a reference under
 * map_lock and computes without any lock.  A put or delete first changes
 * the backend's copy (store->backend: a file, an object), then the table
 * follows it, under write_lock, so the table and the backend never disagree
 * for long.  Every stored version has a generation that grows with each
 * write of the name, also across servers sharing the backend.
 */
#include "store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/compute.h"
#include "core/mem.h"
#include "metrics/metrics.h"

/* How many times a put reads the version in place and writes over it when
 * other servers' writes of the same name keep coming first (conditional
 * writes only): past it the client is told to retry (503 store_busy). */
#define STORE_PUT_ATTEMPTS 8

/* The reference count and the file identity live beside the public struct. */
typedef struct weight_set_box {
    weight_set set;
    long refs;
    file_sig sig;           /* of the file the set was loaded from or written to */
} weight_set_box;

/* The server's one monotonic clock (compute_now) in whole milliseconds, the
 * unit the store's times are kept in as atomic integers. */
int64_t store_monotonic_ms(void)
{
    return (int64_t)(compute_now() * 1000.0);
}

file_sig *store_set_sig(weight_set *set)
{
    return &((weight_set_box *)set)->sig;
}

weight_set *weightset_new(const char *name, attn_weights *w, size_t heads, int out_in)
{
    weight_set_box *box = mem_calloc(1, sizeof *box);
    if (box == NULL) {
        weights_free(w);
        return NULL;
    }
    snprintf(box->set.name, sizeof box->set.name, "%s", name);
    box->set.w = *w;
    box->set.heads = heads;
    box->set.out_in = out_in;
    box->refs = 1;
    memset(w, 0, sizeof *w);
    metrics_model_hold(box->set.name);
    return &box->set;
}

weight_set *store_table_set_loaded(const char *name, store_loaded *file)
{
    weight_set *set = weightset_new(name, &file->w, file->h.heads, file->h.out_in);
    if (set == NULL)
        return NULL;
    set->stored_at_ms = file->h.stored_at_ms;
    set->generation = file->h.generation;
    set->size_bytes = file->h.file_size;
    *store_set_sig(set) = file->sig;
    return set;
}

void weightset_retain(weight_set *set)
{
    if (set != NULL)
        __atomic_add_fetch(&((weight_set_box *)set)->refs, 1, __ATOMIC_SEQ_CST);
}

void weightset_release(weight_set *set)
{
    if (set == NULL)
        return;
    weight_set_box *box = (weight_set_box *)set;
    if (__atomic_sub_fetch(&box->refs, 1, __ATOMIC_SEQ_CST) != 0)
        return;
    /* the last reference: no request computes with this set any more, and
     * each counted itself before letting go */
    metrics_model_unhold(set->name);
    weights_free(&set->w);
    mem_free(box);
}

long store_table_find(weight_store *store, const char *name)
{
    for (size_t i = 0; i < store->count; i++)
        if (strcmp(store->sets[i]->name, name) == 0)
            return (long)i;
    return -1;
}

int store_table_reserve(weight_store *store)
{
    if (store->count < store->cap)
        return 0;
    size_t cap = store->cap ? store->cap * 2 : 16;
    weight_set **sets = mem_realloc(store->sets, cap * sizeof *sets);
    if (sets == NULL)
        return -1;
    store->sets = sets;
    store->cap = cap;
    return 0;
}

int store_grow(void **array, size_t *cap, size_t count, size_t elem)
{
    if (count < *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 8;
    void *p = mem_realloc(*array, n * elem);
    if (p == NULL)
        return -1;
    *array = p;
    *cap = n;
    return 0;
}

weight_set *store_get(weight_store *store, const char *name)
{
    pthread_mutex_lock(&store->map_lock);
    long i = store_table_find(store, name);
    weight_set *set = i >= 0 ? store->sets[i] : NULL;
    weightset_retain(set);
    pthread_mutex_unlock(&store->map_lock);
    return set;
}

size_t store_total_bytes(weight_store *store)
{
    pthread_mutex_lock(&store->map_lock);
    size_t total = store->total_bytes;
    pthread_mutex_unlock(&store->map_lock);
    return total;
}

/* Checks that set fits the limits next to what the table holds now, and
 * makes room for its entry.  Returns 0, or a negative ERR_* code with err
 * filled.  Caller holds write_lock. */
static int put_admit(weight_store *store, const weight_set *set, attn_error *err)
{
    pthread_mutex_lock(&store->map_lock);
    long old = store_table_find(store, set->name);
    size_t old_size = old >= 0 ? store->sets[old]->size_bytes : 0;
    size_t after = store->total_bytes - old_size + set->size_bytes;
    int room = old >= 0 || store_table_reserve(store) == 0;
    pthread_mutex_unlock(&store->map_lock);
    if (after > store->limits.max_total_bytes)
        return error_set(err, ERR_TOO_LARGE, "store_full", NULL,
                         "Storing this set would bring the data directory to %zu bytes, more "
                         "than its limit of %zu (--max-store-bytes); delete sets you no longer "
                         "need.", after, store->limits.max_total_bytes);
    return room ? 0 : error_nomem(err);
}

/* The generation for a new version of the set name: above the version
 * stored now (on_store, ours or another server's) and the table's, and
 * following the clock (now, in microseconds) when that is ahead.  Caller
 * holds write_lock. */
static uint64_t put_generation(weight_store *store, const char *name, uint64_t on_store,
                               uint64_t now_us)
{
    pthread_mutex_lock(&store->map_lock);
    long old = store_table_find(store, name);
    if (old >= 0 && store->sets[old]->generation > on_store)
        on_store = store->sets[old]->generation;
    pthread_mutex_unlock(&store->map_lock);
    return now_us > on_store ? now_us : on_store + 1;
}

/* Puts set (the table takes the caller's reference) in place of the set of
 * its name, if any, whose reference is dropped.  Returns whether the name
 * was in the table.  Caller holds write_lock; room was reserved. */
static int table_swap_in(weight_store *store, weight_set *set)
{
    pthread_mutex_lock(&store->map_lock);
    long old = store_table_find(store, set->name);
    weight_set *previous = NULL;
    if (old >= 0) {
        previous = store->sets[old];
        store->sets[old] = set;
        store->total_bytes -= previous->size_bytes;
    } else {
        store->sets[store->count++] = set;
    }
    store->total_bytes += set->size_bytes;
    pthread_mutex_unlock(&store->map_lock);
    weightset_release(previous);
    return old >= 0;
}

/* store_put, and store_restore when restore is set: then set keeps its
 * generation and time. */
static int put_set(weight_store *store, weight_set *set, int *created, int restore,
                   attn_error *err)
{
    size_t size = store_format_size(set);
    if (size == 0 || size > store->limits.max_set_bytes) {
        weightset_release(set);
        return error_set(err, ERR_TOO_LARGE, "weight_set_too_large", NULL,
                         "This weight set takes %zu bytes, more than the limit of %zu bytes for "
                         "one set (--max-set-bytes).", size, store->limits.max_set_bytes);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!restore)
        set->stored_at_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    set->size_bytes = size;

    pthread_mutex_lock(&store->write_lock);
    int rc = put_admit(store, set, err);
    if (rc != 0)
        goto done;
    /* Read the version in place, give the set the generation after it, and
     * write over exactly that version; a backend with conditional writes
     * answers STORE_CONFLICT when another server wrote first, and the loop
     * reads again, so concurrent writers get increasing generations. */
    uint64_t now_us = (uint64_t)now.tv_sec * 1000000 + (uint64_t)now.tv_nsec / 1000;
    int file_existed = 1;
    for (int attempt = 1;; attempt++) {
        store_version over;
        rc = store->backend->head(store, set->name, 1, &over, err);
        if (rc != 0)
            goto done;
        if (!restore) {
            file_existed = over.generation != 0;
            set->generation = put_generation(store, set->name, over.generation, now_us);
        }
        rc = store->backend->write(store, set, &over, store_set_sig(set), err);
        if (rc != STORE_CONFLICT)
            break;
        if (attempt == STORE_PUT_ATTEMPTS) {
            rc = error_set(err, ERR_UNAVAILABLE, "store_busy", NULL,
                           "Other servers kept writing the weight set \"%s\" while this one "
                           "tried %d times; nothing was changed, retry.", set->name, attempt);
            goto done;
        }
    }
    if (rc < 0)
        goto done;
    if (rc == STORE_NOT_SYNCED)
        rc = err->kind;
    int replaced = table_swap_in(store, set);
    set = NULL; /* the table owns it now */
    if (created != NULL)
        *created = !replaced && !file_existed;
done:
    pthread_mutex_unlock(&store->write_lock);
    weightset_release(set);
    return rc;
}

int store_put(weight_store *store, weight_set *set, int *created, attn_error *err)
{
    return put_set(store, set, created, 0, err);
}

int store_restore(weight_store *store, weight_set *set, attn_error *err)
{
    return put_set(store, set, NULL, 1, err);
}

int store_delete(weight_store *store, const char *name, attn_error *err)
{
    pthread_mutex_lock(&store->write_lock);
    int rc = 0;
    weight_set *gone = store_get(store, name);
    store_version v = {0};
    if (gone == NULL && (rc = store->backend->head(store, name, 0, &v, err)) != 0)
        goto done;
    if (gone == NULL && !v.exists) {
        /* Neither loaded here nor written meanwhile by another server. */
        rc = error_set(err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                       "There is no stored weight set named \"%s\".", name);
        goto done;
    }
    rc = store->backend->remove(store, name, err);
    if (rc < 0)
        goto done;
    if (rc == STORE_NOT_SYNCED)
        rc = err->kind;
    pthread_mutex_lock(&store->map_lock);
    long i = store_table_find(store, name);
    if (i >= 0) {
        store->total_bytes -= store->sets[i]->size_bytes;
        weightset_release(store->sets[i]);
        store->sets[i] = store->sets[--store->count];
    }
    pthread_mutex_unlock(&store->map_lock);
done:
    weightset_release(gone);
    pthread_mutex_unlock(&store->write_lock);
    return rc;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp((*(weight_set *const *)a)->name, (*(weight_set *const *)b)->name);
}

int store_list(weight_store *store, weight_set ***sets, size_t *count, attn_error *err)
{
    *sets = NULL;
    *count = 0;
    pthread_mutex_lock(&store->map_lock);
    size_t n = store->count;
    weight_set **list = n ? mem_malloc(n * sizeof *list) : NULL;
    if (list != NULL)
        for (size_t i = 0; i < n; i++) {
            list[i] = store->sets[i];
            weightset_retain(list[i]);
        }
    pthread_mutex_unlock(&store->map_lock);
    if (n != 0 && list == NULL)
        return error_nomem(err);
    if (list != NULL)
        qsort(list, n, sizeof *list, compare_names);
    *sets = list;
    *count = n;
    return 0;
}

void store_list_free(weight_set **sets, size_t count)
{
    for (size_t i = 0; i < count; i++)
        weightset_release(sets[i]);
    mem_free(sets);
}

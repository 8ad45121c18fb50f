/*
 * store_table.c - the in-memory table of the weight-set store: the sets
 * with their reference counts (new ones, and those built from a loaded
 * file), and get, put, delete and list.
 *
 * Sets are immutable once in the table; a reader takes a reference under
 * map_lock and computes without any lock.  A put or delete first changes
 * the file (store_io.c), then the table follows it, under write_lock, so
 * the table and the directory never disagree for long.  Every stored
 * version has a generation that grows with each write of the name, also
 * across servers sharing the directory.
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

/* The generation for a new version of the file at path: above whatever
 * version is in place now, ours or another server's, and following the
 * clock (now, in microseconds) when that is ahead.  *file_existed tells
 * whether a readable set file was there, perhaps another server's that is
 * not loaded here yet.  Caller holds write_lock. */
static uint64_t put_generation(weight_store *store, const char *name, const char *path,
                               uint64_t now_us, int *file_existed)
{
    uint64_t on_disk = store_io_generation(path);
    *file_existed = on_disk != 0;
    pthread_mutex_lock(&store->map_lock);
    long old = store_table_find(store, name);
    if (old >= 0 && store->sets[old]->generation > on_disk)
        on_disk = store->sets[old]->generation;
    pthread_mutex_unlock(&store->map_lock);
    return now_us > on_disk ? now_us : on_disk + 1;
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
    char final[1400];
    store_path_of(store, set->name, final, sizeof final);
    int file_existed = 1;
    if (!restore)
        set->generation = put_generation(store, set->name, final,
                                         (uint64_t)now.tv_sec * 1000000 + (uint64_t)now.tv_nsec / 1000,
                                         &file_existed);
    if (store_io_write_set(store, set, final, store_set_sig(set)) != 0) {
        /* A full disk or quota is the operator's to fix, not a fault of the
         * server: its own code and status (507), so that a client or a
         * balancer can tell it from a bug. */
        int full = errno == ENOSPC || errno == EDQUOT;
        rc = error_set(err, full ? ERR_NO_SPACE : ERR_INTERNAL,
                       full ? "insufficient_storage" : "internal", NULL,
                       "The weight set could not be stored: %s. Nothing was changed.",
                       strerror(errno));
        goto done;
    }
    if (store_io_fsync_dir(store->dir) != 0) {
        /* The new file is in place but the rename may not survive a crash:
         * report failure so the client retries; the in-memory table follows
         * the file, which is what a restart would most likely see. */
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set was written but the directory could not be synced (%s); "
                       "retry the upload.", strerror(errno));
    }
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
    char path[1400];
    store_path_of(store, name, path, sizeof path);
    struct stat st;
    if (gone == NULL && stat(path, &st) != 0) {
        /* Neither loaded here nor written meanwhile by another server. */
        rc = error_set(err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                       "There is no stored weight set named \"%s\".", name);
        goto done;
    }
    if (store_io_unlink(path) != 0) {
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set could not be deleted: %s. Nothing was changed.",
                       strerror(errno));
        goto done;
    }
    if (store_io_fsync_dir(store->dir) != 0) {
        /* The file is gone; as in store_put, the table follows the file. */
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set was deleted but the directory could not be synced (%s).",
                       strerror(errno));
    }
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

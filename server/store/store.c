/*
 * store.c - opening and closing a weight-set store.
 *
 * The store is split by concern (store_internal.h lists the files): the
 * file format, the table, the backends, the sync with other servers, and
 * quarantine.  This file holds what ties them together: a store is opened
 * on its backend (a data directory, or a bucket and prefix), which is
 * checked, and a first scan loads every set; it is closed by stopping the
 * background sync, closing the backend and dropping the table's references.
 */
#include "store_internal.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"

/* A store with its locks, on backend, before anything is read. */
static weight_store *store_new(const store_backend *backend, const store_limits *limits,
                               attn_error *err)
{
    weight_store *store = mem_calloc(1, sizeof *store);
    if (store == NULL) {
        error_nomem(err);
        return NULL;
    }
    store->backend = backend;
    store_io_host_label(store->host, sizeof store->host);
    store->limits = *limits;
    pthread_mutex_init(&store->write_lock, NULL);
    pthread_mutex_init(&store->map_lock, NULL);
    pthread_mutex_init(&store->sync_lock, NULL);
    pthread_mutex_init(&store->pin_lock, NULL);
    pthread_mutex_init(&store->wake_lock, NULL);
    pthread_cond_init(&store->wake, NULL);
    return store;
}

/* The first scan, which loads every set: store (opened) on success, else
 * NULL with err filled and the store closed. */
static weight_store *store_first_scan(weight_store *store, const char *field, attn_error *err)
{
    if (store_sync_once(store, 1, err) != 0) {
        /* A good file must not be quarantined for our lack of memory:
         * refuse to start instead. */
        if (err->kind != ERR_UNAVAILABLE)
            error_set(err, ERR_INTERNAL, "bad_data_dir", field, "%s", err->message);
        store_close(store);
        return NULL;
    }
    fprintf(stderr, "store: %zu weight set(s) loaded from %s (%zu skipped)\n", store->count,
            store->dir, store->suspect_count);
    return store;
}

weight_store *store_open(const char *dir, const store_limits *limits, attn_error *err)
{
    weight_store *store = store_new(&store_fs_backend, limits, err);
    if (store == NULL)
        return NULL;
    if (store_fs_open(store, dir, err) != 0) {
        store_close(store);
        return NULL;
    }
    return store_first_scan(store, "data-dir", err);
}

weight_store *store_open_s3(const s3_config *cfg, const store_limits *limits, attn_error *err)
{
    weight_store *store = store_new(&store_s3_backend, limits, err);
    if (store == NULL)
        return NULL;
    if (store_s3_open(store, cfg, err) != 0) {
        store_close(store);
        return NULL;
    }
    return store_first_scan(store, "store-url", err);
}

#ifdef ATTN_TESTING
#include "core/test_hooks.h"

weight_store *store_open_on_backend(const store_backend *backend, const store_limits *limits,
                                    attn_error *err)
{
    weight_store *store = store_new(backend, limits, err);
    if (store == NULL)
        return NULL;
    snprintf(store->dir, sizeof store->dir, "test:%s", backend->kind);
    return store_first_scan(store, "data-dir", err);
}
#endif

void store_get_info(weight_store *store, store_info *info)
{
    info->backend = store->backend->kind;
    info->location = store->dir;
    info->conditional_writes = store->backend->conditional_writes != NULL
                                   ? store->backend->conditional_writes(store)
                                   : "not_needed";
}

void store_close(weight_store *store)
{
    if (store == NULL)
        return;
    store_sync_stop(store);
    if (store->backend != NULL)
        store->backend->close(store);
    for (size_t i = 0; i < store->count; i++)
        weightset_release(store->sets[i]);
    mem_free(store->sets);
    mem_free(store->suspects);
    pthread_mutex_destroy(&store->write_lock);
    pthread_mutex_destroy(&store->map_lock);
    pthread_mutex_destroy(&store->sync_lock);
    pthread_mutex_destroy(&store->pin_lock);
    pthread_mutex_destroy(&store->wake_lock);
    pthread_cond_destroy(&store->wake);
    mem_free(store);
}

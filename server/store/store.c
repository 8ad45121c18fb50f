/*
 * store.c - opening and closing a weight-set store.
 *
 * The store is split by concern (store_internal.h lists the files): the
 * file format, the table, the file-system steps, the sync with other
 * servers, and quarantine.  This file holds what ties them together: a
 * store is opened by checking its directory, clearing abandoned temporary
 * files and running a first scan that loads every set; it is closed by
 * stopping the background sync and dropping the table's references.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"

weight_store *store_open(const char *dir, const store_limits *limits, attn_error *err)
{
    if (strlen(dir) == 0 || strlen(dir) >= 1000) {
        error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                  "The data directory must be a path of 1 to 999 characters.");
        return NULL;
    }
    if (store_io_make_dirs(dir) != 0) {
        error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                  "Cannot create the data directory %s: %s.", dir, strerror(errno));
        return NULL;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                  "Cannot read the data directory %s: %s.", dir, strerror(errno));
        return NULL;
    }
    closedir(d);
    weight_store *store = mem_calloc(1, sizeof *store);
    if (store == NULL) {
        error_nomem(err);
        return NULL;
    }
    snprintf(store->dir, sizeof store->dir, "%s", dir);
    store_io_host_label(store->host, sizeof store->host);
    store->limits = *limits;
    pthread_mutex_init(&store->write_lock, NULL);
    pthread_mutex_init(&store->map_lock, NULL);
    pthread_mutex_init(&store->sync_lock, NULL);
    pthread_mutex_init(&store->pin_lock, NULL);
    pthread_mutex_init(&store->wake_lock, NULL);
    pthread_cond_init(&store->wake, NULL);
    store_io_clean_temporaries(store);
    if (store_sync_once(store, 1, err) != 0) {
        /* A good file must not be quarantined for our lack of memory:
         * refuse to start instead. */
        if (err->kind != ERR_UNAVAILABLE)
            error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir", "%s", err->message);
        store_close(store);
        return NULL;
    }
    fprintf(stderr, "store: %zu weight set(s) loaded from %s (%zu skipped)\n", store->count, dir,
            store->suspect_count);
    return store;
}

void store_close(weight_store *store)
{
    if (store == NULL)
        return;
    store_sync_stop(store);
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

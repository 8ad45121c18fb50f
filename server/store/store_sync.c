/*
 * store_sync.c - keeping the table in line with the shared directory.
 *
 * Any number of servers may use one data directory at once.  Each one
 * rescans it (store_sync: every --store-sync-interval from a background
 * thread, and at once when a request asks for a generation it has not seen)
 * and swaps in new and replaced files and drops deleted ones.  A file is
 * reloaded only when its identity (device, inode, size, mtime) changes;
 * opening it before looking (close-to-open) makes NFS revalidate what it
 * cached.  Files that fail to load go to store_quarantine.c.
 *
 * A scan reads and loads with no table lock held, then applies what it
 * found under write_lock, skipping every change that a local put or delete
 * made stale meanwhile.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/compute.h"
#include "core/mem.h"
#include "metrics/metrics.h"

/* One change a scan found, applied under the locks afterwards. */
typedef struct scan_change {
    char name[WEIGHTS_NAME_MAX + 1];
    weight_set *before;     /* the table's set when the scan began (borrowed from snap) */
    weight_set *after;      /* the loaded set (owned), or NULL: the name is gone */
} scan_change;

typedef struct scan_state {
    weight_set **snap;      /* the table when the scan began (references) */
    size_t snap_count;
    unsigned char *seen;    /* snap[i] still has a file */
    scan_change *changes;
    size_t change_count, change_cap;
    suspect_list damaged;   /* files damaged in this scan */
} scan_state;

static void scan_free(scan_state *sc)
{
    store_list_free(sc->snap, sc->snap_count);
    mem_free(sc->seen);
    for (size_t i = 0; i < sc->change_count; i++)
        weightset_release(sc->changes[i].after);
    mem_free(sc->changes);
    mem_free(sc->damaged.items);
}

static long snap_find(const scan_state *sc, const char *name)
{
    for (size_t i = 0; i < sc->snap_count; i++)
        if (strcmp(sc->snap[i]->name, name) == 0)
            return (long)i;
    return -1;
}

/* Notes that the set of name goes from before (borrowed from the snapshot,
 * or NULL: new) to after (owned, or NULL: gone).  Returns 0, or
 * ERR_UNAVAILABLE with err filled when memory runs out (after is then
 * released). */
static int scan_note_change(scan_state *sc, const char *name, weight_set *before,
                            weight_set *after, attn_error *err)
{
    if (store_grow((void **)&sc->changes, &sc->change_cap, sc->change_count, sizeof *sc->changes)) {
        weightset_release(after);
        return error_nomem(err);
    }
    scan_change *c = &sc->changes[sc->change_count++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->before = before;
    c->after = after;
    return 0;
}

/* Looks at one set file of the directory (file is NAME.wset, n its length):
 * loads it when its identity differs from that of the table's version, and
 * notes it when it is damaged.  Returns 0, or ERR_UNAVAILABLE with err
 * filled when memory runs out. */
static int scan_file(weight_store *store, scan_state *sc, const char *file, size_t n, int initial,
                     attn_error *err)
{
    char name[256], path[1400], why[200];
    snprintf(name, sizeof name, "%.*s", (int)(n - 5), file);
    snprintf(path, sizeof path, "%s/%s", store->dir, file);
    /* Opening first makes an NFS client revalidate its cached attributes. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int saved = errno;
        if (fd >= 0)
            close(fd);
        if (saved == ENOENT)
            return 0; /* gone since the listing: a delete, not damage */
        fprintf(stderr, "store: cannot read %s: %s\n", path, strerror(saved));
        long i = snap_find(sc, name);
        if (i >= 0)
            sc->seen[i] = 1; /* keep what we have */
        return 0;
    }
    file_sig sig;
    store_sig_of(&st, &sig);
    long i = weights_valid_name(name) ? snap_find(sc, name) : -1;
    if (i >= 0) {
        sc->seen[i] = 1;
        if (store_sig_equal(store_set_sig(sc->snap[i]), &sig)) {
            close(fd);
            return 0;
        }
    }
    weight_set *set = NULL;
    int nomem = 0, newer = 0;
    store_loaded loaded;
    if (!weights_valid_name(name)) {
        snprintf(why, sizeof why, "the file name is not a valid set name");
    } else if (store_io_load(fd, name, &loaded, why, sizeof why, &nomem, &newer) == 0) {
        set = store_table_set_loaded(name, &loaded);
        if (set == NULL) {
            snprintf(why, sizeof why, "out of memory loading it");
            nomem = 1;
        }
    }
    close(fd);
    if (nomem) {
        fprintf(stderr, "store: out of memory loading %s\n", path);
        return error_nomem(err);
    }
    /* A file of a later format version is a newer server's (a rolling upgrade
     * of replicas sharing the directory): reported once like damage, never
     * quarantined, as the first scan's are not. */
    if (set == NULL)
        return store_quarantine_note(store, &sc->damaged, file, &sig, why, initial || newer) != 0
                   ? error_nomem(err) : 0;
    if (i >= 0 && sc->snap[i]->generation == set->generation &&
        sc->snap[i]->size_bytes == set->size_bytes) {
        /* The same version under a new identity (copied, touched): keep the
         * set, note the file. */
        weightset_release(set);
        pthread_mutex_lock(&store->map_lock);
        *store_set_sig(sc->snap[i]) = sig;
        pthread_mutex_unlock(&store->map_lock);
        return 0;
    }
    /* set->name is a valid name: it loaded. */
    return scan_note_change(sc, set->name, i >= 0 ? sc->snap[i] : NULL, set, err);
}

/* Reads the directory into sc: loads every set file whose identity differs
 * from the table's, notes damaged files, and notes the sets whose file is
 * gone.  No table lock is held. */
static int scan_directory(weight_store *store, scan_state *sc, int initial, attn_error *err)
{
    DIR *d = opendir(store->dir);
    if (d == NULL)
        return error_set(err, ERR_INTERNAL, "store_unreachable", NULL,
                         "Cannot read the data directory %s: %s.", store->dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".wset") == 0)
            rc = scan_file(store, sc, e->d_name, n, initial, err);
    }
    closedir(d);
    for (size_t i = 0; rc == 0 && i < sc->snap_count; i++)
        if (!sc->seen[i])
            rc = scan_note_change(sc, sc->snap[i]->name, sc->snap[i], NULL, err);
    return rc;
}

/* Applies the changes of a scan that still hold: a name a local put or
 * delete touched meanwhile is left alone (the next scan sees it again), and
 * a change is applied only if the file is still the one that was read.
 * Returns -1 when memory ran out for the table (the table is then as it
 * was for that name). */
static int scan_apply(weight_store *store, scan_state *sc)
{
    int rc = 0;
    pthread_mutex_lock(&store->write_lock);
    for (size_t k = 0; k < sc->change_count; k++) {
        scan_change *c = &sc->changes[k];
        char path[1400];
        store_path_of(store, c->name, path, sizeof path);
        struct stat st;
        file_sig now;
        int exists = stat(path, &st) == 0;
        if (exists)
            store_sig_of(&st, &now);
        if (c->after != NULL ? !exists || !store_sig_equal(&now, store_set_sig(c->after))
                             : exists || errno != ENOENT)
            continue;
        pthread_mutex_lock(&store->map_lock);
        long i = store_table_find(store, c->name);
        weight_set *current = i >= 0 ? store->sets[i] : NULL, *dropped = NULL;
        if (current == c->before) {
            if (c->after != NULL && i < 0 && store_table_reserve(store) != 0) {
                rc = -1;
            } else if (c->after != NULL) {
                if (i >= 0) {
                    dropped = store->sets[i];
                    store->total_bytes -= dropped->size_bytes;
                    store->sets[i] = c->after;
                } else {
                    store->sets[store->count++] = c->after;
                }
                store->total_bytes += c->after->size_bytes;
                c->after = NULL;
            } else if (i >= 0) {
                dropped = store->sets[i];
                store->total_bytes -= dropped->size_bytes;
                store->sets[i] = store->sets[--store->count];
            }
        }
        pthread_mutex_unlock(&store->map_lock);
        weightset_release(dropped);
    }
    pthread_mutex_unlock(&store->write_lock);
    return rc;
}

int store_sync_once(weight_store *store, int initial, attn_error *err)
{
    scan_state sc;
    memset(&sc, 0, sizeof sc);
    pthread_mutex_lock(&store->sync_lock);
    int rc = store_list(store, &sc.snap, &sc.snap_count, err);
    if (rc == 0 && sc.snap_count != 0 && (sc.seen = mem_calloc(sc.snap_count, 1)) == NULL)
        rc = error_nomem(err);
    if (rc == 0)
        rc = scan_directory(store, &sc, initial, err);
    if (rc == 0 && scan_apply(store, &sc) != 0)
        rc = error_nomem(err);
    if (rc == 0) {
        mem_free(store->suspects);
        store->suspects = sc.damaged.items;
        store->suspect_count = sc.damaged.count;
        sc.damaged.items = NULL;
        __atomic_store_n(&store->last_ok_ms, store_monotonic_ms(), __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&store->syncs, 1, __ATOMIC_SEQ_CST);
    } else {
        __atomic_add_fetch(&store->sync_errors, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&store->sync_lock);
    scan_free(&sc);
    if (!initial) {
        store_status st;
        store_get_status(store, &st);
        metrics_store_observe(rc == 0, st.sets, st.bytes);
    }
    return rc;
}

int store_sync(weight_store *store, attn_error *err)
{
    return store_sync_once(store, 0, err);
}

/* Whether a rescan for generation want of name may be forced now, recording
 * it when so (STORE_PIN_SYNC_MIN_MS). */
static int pin_sync_allowed(weight_store *store, const char *name, uint64_t want)
{
    uint64_t key = 1469598103934665603ull; /* FNV-1a over the name, then the generation */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        key = (key ^ *p) * 1099511628211ull;
    key = (key ^ want) * 1099511628211ull;
    int64_t now = store_monotonic_ms();
    pthread_mutex_lock(&store->pin_lock);
    pin_sync *slot = &store->pin_syncs[key % STORE_PIN_SLOTS];
    int allowed = slot->key != key || slot->at_ms == 0 || now - slot->at_ms >= STORE_PIN_SYNC_MIN_MS;
    if (allowed) {
        slot->key = key;
        slot->at_ms = now > 0 ? now : 1;
    }
    pthread_mutex_unlock(&store->pin_lock);
    return allowed;
}

int store_sync_for_pin(weight_store *store, const char *name, uint64_t want, uint64_t *on_disk,
                       attn_error *err)
{
    char path[1400];
    store_path_of(store, name, path, sizeof path);
    *on_disk = store_io_generation(path);
    if (*on_disk != want || !pin_sync_allowed(store, name, want))
        return 0;
    return store_sync(store, err);
}

/* The background sync: a scan every interval until store_close. */
static void *sync_thread(void *arg)
{
    weight_store *store = arg;
    int failing = 0;
    pthread_mutex_lock(&store->wake_lock);
    while (!store->stop) {
        struct timespec until = compute_wake_after(store->interval_ms);
        pthread_cond_timedwait(&store->wake, &store->wake_lock, &until);
        if (store->stop)
            break;
        pthread_mutex_unlock(&store->wake_lock);
        attn_error err;
        error_clear(&err);
        int rc = store_sync(store, &err);
        if (rc != 0 && !failing)
            fprintf(stderr, "store: sync failed: %s\n", err.message);
        else if (rc == 0 && failing)
            fprintf(stderr, "store: sync works again\n");
        failing = rc != 0;
        pthread_mutex_lock(&store->wake_lock);
    }
    pthread_mutex_unlock(&store->wake_lock);
    return NULL;
}

int store_sync_start(weight_store *store, long interval_ms, attn_error *err)
{
    if (interval_ms <= 0 || store->thread_running)
        return error_set(err, ERR_INTERNAL, "internal", NULL,
                         "The store sync needs a positive interval and can start only once.");
    store->interval_ms = interval_ms;
    metrics_store_observe(1, store->count, store_total_bytes(store));
    int rc = pthread_create(&store->thread, NULL, sync_thread, store);
    if (rc != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL,
                         "Cannot start the store sync thread: %s.", strerror(rc));
    store->thread_running = 1;
    return 0;
}

void store_get_status(weight_store *store, store_status *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&store->map_lock);
    st->sets = store->count;
    st->bytes = store->total_bytes;
    pthread_mutex_unlock(&store->map_lock);
    int64_t last = __atomic_load_n(&store->last_ok_ms, __ATOMIC_SEQ_CST);
    st->last_ok_age_ms = last > 0 ? store_monotonic_ms() - last : -1;
    st->syncs = __atomic_load_n(&store->syncs, __ATOMIC_SEQ_CST);
    st->sync_errors = __atomic_load_n(&store->sync_errors, __ATOMIC_SEQ_CST);
    st->quarantined = __atomic_load_n(&store->quarantined, __ATOMIC_SEQ_CST);
    st->interval_ms = store->interval_ms;
}

void store_sync_stop(weight_store *store)
{
    if (!store->thread_running)
        return;
    pthread_mutex_lock(&store->wake_lock);
    store->stop = 1;
    pthread_cond_broadcast(&store->wake);
    pthread_mutex_unlock(&store->wake_lock);
    pthread_join(store->thread, NULL);
    store->thread_running = 0;
}

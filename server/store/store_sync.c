/*
 * store_sync.c - keeping the table in line with the backend that replicas share.
 *
 * Any number of servers may use one data directory, or one bucket and prefix, at once.
 * Each one rescans it (store_sync: every --store-sync-interval from a background thread,
 * and at once when a request asks for a generation it has not seen) and swaps in new and
 * replaced sets and drops deleted ones.  A set is reloaded only when its identity (a
 * file's device, inode, size and mtime; an object's ETag and size) changes.  Sets that fail
 * to load go to store_quarantine.c.
 *
 * A scan reads and loads with no table lock held, then applies what it found under
 * write_lock, skipping every change that a local put or delete made stale meanwhile.
 *
 * The background thread first asks the backend whether its listing's identity is the one
 * taken before the last full scan read the entries (the directory's: store_fs.c says when
 * it can be trusted).  When it is the same, the entries are not read, so an idle server's
 * cost does not grow with the sets (10,000 sets: 22% of a core at a scan a second before,
 * nothing measurable now).  A backend without such an identity (an object store) is listed
 * every time: one request per 1,000 sets, and nothing more for the sets whose ETag did not
 * change.  A full scan runs at least every STORE_FULL_SCAN_MS all the same, for what
 * leaves the directory alone: a file rewritten in place by hand, or an attribute cache that
 * hid a change.
 */
#include "store_internal.h"

#include <stdio.h>
#include <string.h>

#include "core/compute.h"
#include "core/mem.h"
#include "metrics/metrics.h"

/* The longest the background thread goes without reading every entry. */
#define STORE_FULL_SCAN_MS 60000

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
    int initial;            /* store_open's scan: nothing quarantined */
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

/* The index of name in the snapshot, which store_list sorted by name, or
 * -1: a binary search, so that a scan of n files costs n log n, not n². */
static long snap_find(const scan_state *sc, const char *name)
{
    size_t lo = 0, hi = sc->snap_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sc->snap[mid]->name, name);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
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

/* Looks at one stored set as the backend listed it (e->file is NAME.wset):
 * loads it when its identity differs from that of the table's version, and
 * notes it when it is damaged.  The backend's list callback; arg is the
 * scan.  Returns 0; ERR_UNAVAILABLE with err filled when memory runs out; or
 * the backend's error when it failed to give the bytes (the scan fails). */
static int scan_entry(weight_store *store, void *arg, const store_entry *e, attn_error *err)
{
    scan_state *sc = arg;
    char name[256], why[200];
    size_t n = strlen(e->file);
    snprintf(name, sizeof name, "%.*s", (int)(n - 5), e->file);
    long i = weights_valid_name(name) ? snap_find(sc, name) : -1;
    if (e->unreadable) {
        if (i >= 0)
            sc->seen[i] = 1; /* keep what we have */
        return 0;
    }
    if (i >= 0) {
        sc->seen[i] = 1;
        if (store_sig_equal(store_set_sig(sc->snap[i]), &e->sig))
            return 0;
    }
    weight_set *set = NULL;
    int nomem = 0, newer = 0, gone = 0, rc = -1;
    store_loaded loaded;
    if (!weights_valid_name(name)) {
        snprintf(why, sizeof why, "the file name is not a valid set name");
    } else if ((rc = store->backend->load(store, e, name, &loaded, why, sizeof why, &nomem,
                                          &newer, &gone, err)) == 0) {
        set = store_table_set_loaded(name, &loaded);
        if (set == NULL) {
            snprintf(why, sizeof why, "out of memory loading it");
            nomem = 1;
        }
    }
    if (rc == STORE_LOAD_FAILED)
        return err->kind; /* the store, not the set: this scan fails */
    if (nomem) {
        fprintf(stderr, "store: out of memory loading %s/%s\n", store->dir, e->file);
        return error_nomem(err);
    }
    if (gone)
        return 0; /* replaced or deleted since the listing: the next scan sees it */
    /* A file of a later format version is a newer server's (a rolling upgrade
     * of replicas sharing the directory): reported once like damage, never
     * quarantined, as the first scan's are not. */
    if (set == NULL)
        return store_quarantine_note(store, &sc->damaged, e->file, &e->sig, why,
                                     sc->initial || newer) != 0
                   ? error_nomem(err) : 0;
    if (i >= 0 && sc->snap[i]->generation == set->generation &&
        sc->snap[i]->size_bytes == set->size_bytes) {
        /* The same version under a new identity (copied, touched): keep the
         * set, note the file. */
        weightset_release(set);
        pthread_mutex_lock(&store->map_lock);
        *store_set_sig(sc->snap[i]) = e->sig;
        pthread_mutex_unlock(&store->map_lock);
        return 0;
    }
    /* set->name is a valid name: it loaded. */
    return scan_note_change(sc, set->name, i >= 0 ? sc->snap[i] : NULL, set, err);
}

int store_scan_wants(void *arg, const store_entry *e)
{
    const scan_state *sc = arg;
    char name[256];
    size_t n = strlen(e->file);
    snprintf(name, sizeof name, "%.*s", (int)(n - 5), e->file);
    long i = weights_valid_name(name) ? snap_find(sc, name) : -1;
    return i < 0 || !store_sig_equal(store_set_sig(sc->snap[i]), &e->sig);
}

/* Lists the store into sc: loads every set whose identity differs from the
 * table's, notes damaged ones, and notes the sets that are gone; *listing
 * and *settled are the backend's (store_backend.list).  No table lock is
 * held. */
static int scan_store(weight_store *store, scan_state *sc, file_sig *listing, int *settled,
                      attn_error *err)
{
    int rc = store->backend->list(store, scan_entry, sc, listing, settled, err);
    for (size_t i = 0; rc == 0 && i < sc->snap_count; i++)
        if (!sc->seen[i])
            rc = scan_note_change(sc, sc->snap[i]->name, sc->snap[i], NULL, err);
    return rc;
}

/* Applies the changes of a scan that still hold: a name a local put or
 * delete touched meanwhile is left alone (the next scan sees it again), and
 * a change is applied only if the file is still the one that was read (when
 * the backend rechecks: store_backend.recheck_before_apply).
 * Returns -1 when memory ran out for the table (the table is then as it
 * was for that name). */
static int scan_apply(weight_store *store, scan_state *sc)
{
    int rc = 0;
    pthread_mutex_lock(&store->write_lock);
    for (size_t k = 0; k < sc->change_count; k++) {
        scan_change *c = &sc->changes[k];
        store_version now;
        attn_error ignored;
        if (store->backend->recheck_before_apply) {
            if (store->backend->head(store, c->name, 0, &now, &ignored) != 0)
                continue; /* not known now: the next scan looks again */
            if (c->after != NULL
                    ? !now.exists || !store_sig_equal(&now.sig, store_set_sig(c->after))
                    : now.exists)
                continue;
        }
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

/* Counts the end of a scan, full or not (rc 0: it worked), and reports it
 * to the metrics unless it is store_open's.  Caller holds sync_lock. */
static void scan_count(weight_store *store, int rc)
{
    if (rc == 0) {
        __atomic_store_n(&store->last_ok_ms, store_monotonic_ms(), __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&store->syncs, 1, __ATOMIC_SEQ_CST);
    } else {
        __atomic_add_fetch(&store->sync_errors, 1, __ATOMIC_SEQ_CST);
    }
}

static void scan_report(weight_store *store, int rc)
{
    store_status st;
    store_get_status(store, &st);
    metrics_store_observe(rc == 0, st.sets, st.bytes);
}

int store_sync_once(weight_store *store, int initial, attn_error *err)
{
    scan_state sc;
    memset(&sc, 0, sizeof sc);
    sc.initial = initial;
    file_sig listing;
    int settled = 0;
    pthread_mutex_lock(&store->sync_lock);
    int rc = store_list(store, &sc.snap, &sc.snap_count, err);
    if (rc == 0 && sc.snap_count != 0 && (sc.seen = mem_calloc(sc.snap_count, 1)) == NULL)
        rc = error_nomem(err);
    if (rc == 0)
        rc = scan_store(store, &sc, &listing, &settled, err);
    if (rc == 0 && scan_apply(store, &sc) != 0)
        rc = error_nomem(err);
    if (rc == 0) {
        mem_free(store->suspects);
        store->suspects = sc.damaged.items;
        store->suspect_count = sc.damaged.count;
        sc.damaged.items = NULL;
        /* the identity taken before the entries were read: a change made
         * while they were read shows as a different one next time */
        store->dir_sig = listing;
        store->dir_sig_settled = settled;
        store->dir_full_ms = store_monotonic_ms();
    } else {
        store->dir_sig_settled = 0;
    }
    scan_count(store, rc);
    pthread_mutex_unlock(&store->sync_lock);
    scan_free(&sc);
    if (!initial)
        scan_report(store, rc);
    return rc;
}

int store_sync(weight_store *store, attn_error *err)
{
    return store_sync_once(store, 0, err);
}

int store_sync_if_changed(weight_store *store, attn_error *err)
{
    pthread_mutex_lock(&store->sync_lock);
    if (store->backend->unchanged == NULL || !store->dir_sig_settled ||
        store->suspect_count != 0 ||
        store_monotonic_ms() - store->dir_full_ms >= STORE_FULL_SCAN_MS) {
        pthread_mutex_unlock(&store->sync_lock);
        return store_sync(store, err);
    }
    int unchanged = store->backend->unchanged(store, &store->dir_sig, err);
    if (unchanged == 0) {
        pthread_mutex_unlock(&store->sync_lock);
        return store_sync(store, err);
    }
    int rc = unchanged == 1 ? 0 : unchanged;
    scan_count(store, rc);
    pthread_mutex_unlock(&store->sync_lock);
    scan_report(store, rc);
    return rc;
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
    store_version v;
    int rc = store->backend->head(store, name, 1, &v, err);
    *on_disk = rc == 0 ? v.generation : 0;
    if (rc != 0)
        return rc;
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
        int rc = store_sync_if_changed(store, &err);
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

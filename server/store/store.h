/*
 * store.h - named weight sets kept in a data directory or an S3 bucket.
 *
 * A weight set is an attn_weights (in_out form) with its default heads and
 * the weights_layout it was uploaded in.  Each set is one file
 * <name>.wset in the data directory (its format: store_format.c and
 * docs/weight-sets.md), or one object PREFIX/<name>.wset of the same bytes
 * in a bucket (store_open_s3; docs/store-backends.md).  What follows is said
 * of the directory; every promise holds for the bucket too, with an object's
 * ETag for a file's identity and one PUT for the rename.  The store's own
 * files are listed in store_internal.h.
 * Writes are durable before they are acknowledged: temporary file, fsync,
 * rename over the old file, fsync of the directory; so after a crash a set
 * is either wholly there or not at all.  At start-up every file is loaded;
 * one that is corrupt or truncated, or whose name is not a valid set name
 * (weights_valid_name), is skipped and logged, and moved to quarantine/ by a
 * later store_sync that finds the same file still damaged.
 *
 * Any number of servers may share the directory (a ReadWriteMany volume):
 * temporary files carry the host, pid and a counter, start-up removes only
 * temporary files that are certainly abandoned, and store_sync (run by a
 * background thread, store_sync_start) brings the table in line with the
 * files that other servers wrote, replaced or deleted.  Every stored version
 * has a generation, a number that grows with each write of the name.
 *
 * Sets are reference-counted and immutable: store_get hands out a reference
 * that stays valid (with the same numbers) until weightset_release, even if
 * the name is replaced or deleted meanwhile.  No store lock is held while a
 * caller computes with a set.
 */
#ifndef ATTN_STORE_H
#define ATTN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernel/weights.h"
#include "s3/s3.h"

typedef struct weight_set {
    char name[WEIGHTS_NAME_MAX + 1];
    attn_weights w;         /* owned by the set */
    size_t heads;           /* 0: none given at upload */
    int out_in;             /* uploaded with weights_layout "out_in" */
    int64_t stored_at_ms;   /* Unix time of the write, in milliseconds */
    uint64_t generation;    /* grows with each write of the name (from the file) */
    size_t size_bytes;      /* bytes of its file */
} weight_set;

typedef struct weight_store weight_store;

typedef struct store_limits {
    size_t max_set_bytes;   /* largest single set file */
    size_t max_total_bytes; /* all set files together */
    long temp_max_age_s;    /* another server's temporary file older than this is
                             * abandoned and removed at start-up; 0: never */
    long quarantine_after_ms; /* a damaged file is quarantined once a scan finds
                               * it still damaged (unchanged) this long after the
                               * first sighting */
} store_limits;

/* What the sync reports (store_get_status). */
typedef struct store_status {
    size_t sets, bytes;         /* loaded now */
    long long last_ok_age_ms;   /* since the last successful scan; -1: none yet */
    unsigned long syncs, sync_errors, quarantined;
    long interval_ms;           /* of the background sync; 0 when not started */
} store_status;

/* Opens (creating if needed) the data directory dir and loads every set in
 * it; dir and limits are borrowed (copied).  A file that is damaged is
 * skipped and reported on stderr, never quarantined here: a later
 * store_sync moves it to quarantine/ if it stays damaged.  Returns the
 * store, which the caller frees with store_close, or NULL with err filled
 * when the directory itself is unusable (500) or memory runs out (503; good
 * files are never quarantined for that). */
weight_store *store_open(const char *dir, const store_limits *limits, attn_error *err);

/* Opens the bucket and prefix of cfg (borrowed, copied) as store_open opens
 * a directory: every set is loaded, damaged objects are skipped.  Returns the
 * store, or NULL with err filled when the credentials are missing, the
 * object store cannot be listed (the message names the endpoint and the S3
 * error code: a wrong secret, a missing bucket, a clock skew), or memory
 * runs out. */
weight_store *store_open_s3(const s3_config *cfg, const store_limits *limits, attn_error *err);

/* Where the sets are kept, for /v1/info; every string is borrowed from the
 * store (or static). */
typedef struct store_info {
    const char *backend;            /* "directory", "s3" */
    const char *location;           /* the directory, or "s3://BUCKET/PREFIX" */
    const char *conditional_writes; /* "supported", "not_supported", "unknown"
                                     * (nothing written yet), "not_needed" (a
                                     * directory: rename is atomic) */
} store_info;
void store_get_info(weight_store *store, store_info *info);

/* Frees the store (NULL is fine), stopping its background sync first; sets
 * still referenced stay valid until released. */
void store_close(weight_store *store);

/* Rescans the directory once: loads new and replaced set files, drops the
 * sets whose file is gone, and swaps them in under a short lock, so readers
 * are never blocked by the loading and see an old or a new set whole.  A
 * damaged file is skipped (its set, if loaded, is kept) and reported once,
 * then quarantined when it stays damaged (store_limits).  Returns 0, or
 * ERR_INTERNAL ("store_unreachable") when the directory cannot be read, or
 * ERR_UNAVAILABLE when memory runs out, with err filled; the table is then
 * left as it was.  Safe to call from any thread, at any time. */
int store_sync(weight_store *store, attn_error *err);

/* At most one rescan per name and generation in this many milliseconds is
 * forced by pins (store_sync_for_pin); the answer meanwhile carries
 * Retry-After: 1, so a client that honours it is served after one wait. */
#define STORE_PIN_SYNC_MIN_MS 1000

/* For a request pinned to generation want of the set named name, which the
 * table does not hold: reads the generation of the set's file in the shared
 * directory into *on_disk (0 when there is none, or no readable set there)
 * and rescans the directory (store_sync) only when that file holds want and
 * no rescan was forced for the same name and generation in the last
 * STORE_PIN_SYNC_MIN_MS.  So a pin costs one read of a file's header, and
 * rescans follow writes, not requests.  Returns 0, or store_sync's error. */
int store_sync_for_pin(weight_store *store, const char *name, uint64_t want, uint64_t *on_disk,
                       attn_error *err);

/* Starts the background thread that runs store_sync every interval_ms
 * (> 0) until store_close.  Returns 0, or ERR_INTERNAL with err filled. */
int store_sync_start(weight_store *store, long interval_ms, attn_error *err);

/* Fills *st (caller-owned) with the sync's state. */
void store_get_status(weight_store *store, store_status *st);

/* Parses a temporary file name ".tmp.HOST.PID.COUNTER" into host (host_len
 * bytes) and *pid.  Returns 0, or -1 when file is not such a name. */
int store_tmp_name_parse(const char *file, char *host, size_t host_len, long *pid);

/* Makes a new set named name (borrowed, copied) from w, heads and out_in,
 * with one reference that the caller drops with weightset_release.  Takes
 * ownership of the arrays of w in every case: *w is zeroed, and when memory
 * runs out the arrays are freed and NULL is returned. */
weight_set *weightset_new(const char *name, attn_weights *w, size_t heads, int out_in);

/* Stores set under set->name, replacing any set of that name, durably, and
 * gives it the next generation (above the one in the file it replaces, even
 * when another server wrote that, and at least the time in microseconds).
 * Takes ownership of the caller's reference to set in every case (a caller
 * that still needs the set takes another with weightset_retain first).
 * Returns 0 with *created (when created is not NULL) = 1 for a new name and
 * 0 for a replacement (also of a file another server wrote that this store
 * has not loaded yet), or a negative
 * ERR_* code (413 over the limits, 503 out of memory, 500 on I/O failure)
 * with err filled.  On failure the store and its files are as they were,
 * with one exception: when only the final fsync of the directory fails, the
 * new file is already in place and the table follows it (the error tells the
 * client to retry, which is harmless). */
int store_put(weight_store *store, weight_set *set, int *created, attn_error *err);

/* Puts back set, a set this store held before a store_put that the caller
 * undoes, with the generation and time it had (store_put would give it new
 * ones, and a client that pinned the old generation would be refused for
 * content that never changed).  Takes ownership of the caller's reference as
 * store_put does, and fails as it does. */
int store_restore(weight_store *store, weight_set *set, attn_error *err);

/* Returns a new reference to the set named name (borrowed), which the caller
 * drops with weightset_release, or NULL if there is none. */
weight_set *store_get(weight_store *store, const char *name);

/* Deletes the set named name (its file first).  Returns 0, ERR_NOT_FOUND
 * (code "unknown_weight_set"), or ERR_INTERNAL on I/O failure, with err
 * filled.  As with store_put, when only the final fsync of the directory
 * fails the set is gone although an error is returned. */
int store_delete(weight_store *store, const char *name, attn_error *err);

/* Lists every set, sorted by name: on success returns 0 with *sets a new
 * array of *count new references, which the caller frees with
 * store_list_free (*sets is NULL when *count is 0).  When memory runs out
 * returns ERR_UNAVAILABLE with err filled, *sets NULL and *count 0, so that
 * "no sets" and "no memory" are told apart. */
int store_list(weight_store *store, weight_set ***sets, size_t *count, attn_error *err);

/* Drops the references of sets[0..count) and frees the array (NULL is
 * fine). */
void store_list_free(weight_set **sets, size_t count);

/* Bytes of all stored files together. */
size_t store_total_bytes(weight_store *store);

/* Takes one more reference / drops one (NULL is fine); the set and its
 * arrays are freed when the last reference is dropped. */
void weightset_retain(weight_set *set);
void weightset_release(weight_set *set);

#endif

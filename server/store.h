/*
 * store.h - named weight sets kept in a data directory.
 *
 * A weight set is an attn_weights (in_out form) with its default heads and
 * the weights_layout it was uploaded in.  Each set is one file
 * <name>.wset in the data directory (format in store.c and the README).
 * Writes are durable before they are acknowledged: temporary file, fsync,
 * rename over the old file, fsync of the directory; so after a crash a set
 * is either wholly there or not at all.  At start-up every file is loaded;
 * one that is corrupt or truncated, or whose name is not a valid set name
 * (weights_valid_name), is logged and moved to quarantine/.
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

#include "error.h"
#include "weights.h"

typedef struct weight_set {
    char name[WEIGHTS_NAME_MAX + 1];
    attn_weights w;         /* owned by the set */
    size_t heads;           /* 0: none given at upload */
    int out_in;             /* uploaded with weights_layout "out_in" */
    int64_t stored_at_ms;   /* Unix time of the write, in milliseconds */
    size_t size_bytes;      /* bytes of its file */
} weight_set;

typedef struct weight_store weight_store;

typedef struct store_limits {
    size_t max_set_bytes;   /* largest single set file */
    size_t max_total_bytes; /* all set files together */
} store_limits;

/* Opens (creating if needed) the data directory dir and loads every set in
 * it; dir and limits are borrowed (copied).  A file that is damaged is
 * reported on stderr and moved to quarantine/.  Returns the store, which
 * the caller frees with store_close, or NULL with err filled when the
 * directory itself is unusable (500) or memory runs out (503; good files are
 * never quarantined for that). */
weight_store *store_open(const char *dir, const store_limits *limits, attn_error *err);

/* Frees the store (NULL is fine); sets still referenced stay valid until
 * released. */
void store_close(weight_store *store);

/* Makes a new set named name (borrowed, copied) from w, heads and out_in,
 * with one reference that the caller drops with weightset_release.  Takes
 * ownership of the arrays of w in every case: *w is zeroed, and when memory
 * runs out the arrays are freed and NULL is returned. */
weight_set *weightset_new(const char *name, attn_weights *w, size_t heads, int out_in);

/* Stores set under set->name, replacing any set of that name, durably.
 * Takes ownership of the caller's reference to set in every case (a caller
 * that still needs the set takes another with weightset_retain first).
 * Returns 0 with *created (when created is not NULL) = 1 for a new name and
 * 0 for a replacement, or a negative
 * ERR_* code (413 over the limits, 503 out of memory, 500 on I/O failure)
 * with err filled.  On failure the store and its files are as they were,
 * with one exception: when only the final fsync of the directory fails, the
 * new file is already in place and the table follows it (the error tells the
 * client to retry, which is harmless). */
int store_put(weight_store *store, weight_set *set, int *created, attn_error *err);

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

/* Testing: make the nth file-system step of the next writes fail (0 = the
 * first step; -1 turns failure injection off).  Steps are open, write,
 * fsync, rename and directory fsync. */
void store_fail_io_after(int n);

#endif

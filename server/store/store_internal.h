/*
 * store_internal.h - what the pieces of the weight-set store share; not for
 * the rest of the server, which sees only store.h.
 *
 * The store is six files, one concern each:
 *   store.c             opening and closing a store: the data directory,
 *                       the locks, the first scan
 *   store_format.c      the file format: encoding and decoding one stored set
 *   store_table.c       the in-memory table: reference-counted sets, get, put,
 *                       delete, list, generations
 *   store_io.c          the file-system steps of a durable write and delete,
 *                       file paths, and temporary files (naming and clean-up)
 *   store_sync.c        the rescan that follows what other replicas wrote,
 *                       and the background thread that runs it
 *   store_quarantine.c  files that fail to load: reported once, moved to
 *                       quarantine/ when they stay damaged
 *
 * Locking: sync_lock lets one scan run at a time; write_lock serialises puts,
 * deletes and the short apply step of a scan (file work included); map_lock
 * guards the in-memory table and is held only for lookups and swaps.
 * Computation never holds any: it holds a reference to an immutable set.
 */
#ifndef ATTN_STORE_INTERNAL_H
#define ATTN_STORE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include "store.h"

/* Temporary files are ".tmp.HOST.PID.COUNTER" (store_tmp_name_parse). */
#define STORE_TMP_PREFIX ".tmp."

/* What identifies one version of a file: a rename puts a new inode in place,
 * and a rewrite in place changes the size or the mtime. */
typedef struct file_sig {
    uint64_t dev, ino;
    int64_t size, mtime_ns;
} file_sig;

/* A file that failed to load: kept here until it loads, disappears,
 * changes, or has stayed damaged long enough to be quarantined. */
typedef struct suspect {
    char file[256];
    file_sig sig;
    int64_t first_ms;       /* monotonic time it was first seen damaged */
} suspect;

struct weight_store {
    char dir[1024];
    char host[64];          /* this host's name, as temporary files carry it */
    store_limits limits;
    pthread_mutex_t write_lock;
    pthread_mutex_t map_lock;
    pthread_mutex_t sync_lock;
    weight_set **sets;
    size_t count, cap;
    size_t total_bytes;
    suspect *suspects;      /* guarded by sync_lock */
    size_t suspect_count;
    /* The background sync and what it reports (atomics). */
    pthread_t thread;
    int thread_running;
    pthread_mutex_t wake_lock;
    pthread_cond_t wake;
    int stop;
    long interval_ms;
    int64_t last_ok_ms;     /* monotonic time of the last successful scan */
    unsigned long sync_errors, syncs, quarantined;
};

/* ---- store_table.c ---- */

/* The identity of the file set was loaded from or written to (beside the
 * public struct, with the reference count). */
file_sig *store_set_sig(weight_set *set);
/* Index of name in the table, or -1.  Caller holds map_lock. */
long store_table_find(weight_store *store, const char *name);
/* Makes room for one more entry; 0, or -1 when memory runs out.  Caller
 * holds map_lock. */
int store_table_reserve(weight_store *store);
/* Makes room in *array (of *cap elements of elem bytes) for element count,
 * doubling it when full.  0, or -1 when memory runs out (the array is then
 * as it was). */
int store_grow(void **array, size_t *cap, size_t count, size_t elem);
int64_t store_monotonic_ms(void);
void store_sig_of(const struct stat *st, file_sig *sig);
int store_sig_equal(const file_sig *a, const file_sig *b);

/* ---- store_format.c ---- */

/* Bytes of the file that would hold set in the current format, or 0 when
 * that overflows. */
size_t store_format_size(const weight_set *set);
/* Writes set to the open file fd (through store_io_write_runs).  0, or -1
 * with errno set. */
int store_format_write(int fd, const weight_set *set);
/* Loads the set file open on fd, which should hold a set named name (the
 * descriptor stays open).  Returns a new set with its generation, size and
 * file identity, or NULL with a reason in why and *nomem set when memory
 * ran out rather than the file being bad, or *newer set when the file is of
 * a format version later than this server reads (another server's, not
 * damage). */
weight_set *store_format_load(int fd, const char *name, char *why, size_t why_len, int *nomem,
                              int *newer);
/* The generation in the header of the file at path, or 0 when there is no
 * readable set file there. */
uint64_t store_format_generation(const char *path);

/* ---- store_io.c ---- */

/* The file of the set named name: DIR/NAME.wset. */
void store_path_of(const weight_store *store, const char *name, char *out, size_t len);
/* Bytes to be written at offset `at` of a file (store_io_write_runs). */
typedef struct store_run {
    const void *data;
    size_t len;
    uint64_t at;
} store_run;
/* Writes the n runs (disjoint) to fd at their offsets, or fails (-1, errno
 * set); the file offset is left where it was.  meanwhile (when not NULL) is
 * called with ctx on the calling thread while a large write's helper thread
 * has begun (before the caller writes too), for work that only reads the
 * runs' data. */
int store_io_write_runs(int fd, const store_run *runs, size_t n, void (*meanwhile)(void *ctx),
                        void *ctx);
/* Writes set durably to final_path: a temporary file, fsync, rename.  Fills
 * *sig with the identity of the new file.  0, or -1 with errno set and no
 * temporary file left behind. */
int store_io_write_set(weight_store *store, const weight_set *set, const char *final_path,
                       file_sig *sig);
/* Unlinks path (a missing file is fine).  0, or -1 with errno set. */
int store_io_unlink(const char *path);
/* fsyncs the directory dir.  0, or -1 with errno set. */
int store_io_fsync_dir(const char *dir);
/* Creates dir and its parents as needed.  0, or -1 with errno set. */
int store_io_make_dirs(const char *dir);
/* This host's name as temporary file names carry it. */
void store_io_host_label(char *out, size_t len);
/* Removes the temporary files in the directory that are certainly abandoned. */
void store_io_clean_temporaries(weight_store *store);

/* ---- store_quarantine.c ---- */

/* A growing array of damaged files, for one scan. */
typedef struct suspect_list {
    suspect *items;
    size_t count, cap;
} suspect_list;

/* Records file (identity sig) as damaged in this scan (into found).  A file
 * first seen damaged is reported; one that was already suspect (in
 * store->suspects) with the same identity keeps its first sighting, and is
 * quarantined once it has stayed damaged for limits.quarantine_after_ms
 * (never during the first scan of store_open, initial).  Returns -1 only
 * when memory runs out.  Caller holds sync_lock. */
int store_quarantine_note(weight_store *store, suspect_list *found, const char *file,
                          const file_sig *sig, const char *why, int initial);

/* ---- store_sync.c ---- */

/* One scan; initial is the first one of store_open (nothing quarantined,
 * nothing reported to the metrics). */
int store_sync_once(weight_store *store, int initial, attn_error *err);
/* Stops the background sync thread if it runs (store_close). */
void store_sync_stop(weight_store *store);

#endif

/*
 * store_internal.h - what the pieces of the weight-set store share; not for
 * the rest of the server, which sees only store.h.
 *
 * The store is split by concern, each file using only those above it in
 * this list but for store.c, which opens and closes it all:
 *   store.c             opening and closing a store: the backend, the locks,
 *                       the first scan
 *   store_format.c      the file format, bytes in and bytes out: encoding a
 *                       set, decoding and checking a header, the checksum
 *   store_io.c          reading a set from its bytes (a file or a buffer),
 *                       and the file-system steps: the durable write and the
 *                       delete, file identities, temporary files
 *   store_fs.c          the directory backend (store_backend, below) over
 *                       store_io.c: one NAME.wset file a set
 *   store_s3.c          the object-store backend over s3/s3.h: one object
 *                       PREFIX/NAME.wset a set, the same bytes
 *   store_table.c       the in-memory table: reference-counted sets (built
 *                       from a loaded file too), get, put, delete, list,
 *                       generations
 *   store_quarantine.c  sets that fail to load: reported once, set aside by
 *                       the backend when they stay damaged
 *   store_sync.c        the rescan that follows what other replicas wrote,
 *                       and the background thread that runs it
 *
 * The table, the sync and quarantine see the place where sets are kept only
 * through store->backend (store_backend): list, load, head, write, remove,
 * set aside.  So every rule above the backend (generations, If-Match, pins,
 * the sync's swap, quarantine's delay) is the same for every backend.
 *
 * Locking: sync_lock lets one scan run at a time; write_lock serialises puts,
 * deletes and the short apply step of a scan (backend work included);
 * map_lock guards the in-memory table and is held only for lookups and
 * swaps.  Computation never holds any: it holds a reference to an immutable
 * set.
 */
#ifndef ATTN_STORE_INTERNAL_H
#define ATTN_STORE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include "store.h"

/* Temporary files are ".tmp.HOST.PID.COUNTER" (store_tmp_name_parse). */
#define STORE_TMP_PREFIX ".tmp."

/* What identifies one version of a stored set.  A file: a rename puts a new
 * inode in place, and a rewrite in place changes the size or the mtime.  An
 * object: its ETag and size (dev, ino and mtime_ns stay 0). */
typedef struct file_sig {
    uint64_t dev, ino;
    int64_t size, mtime_ns;
    char etag[80];          /* without quotes; "" for a file */
} file_sig;

typedef struct store_backend store_backend;
typedef struct store_s3 store_s3;

/* A file that failed to load: kept here until it loads, disappears,
 * changes, or has stayed damaged long enough to be quarantined. */
typedef struct suspect {
    char file[256];
    file_sig sig;
    int64_t first_ms;       /* monotonic time it was first seen damaged */
} suspect;

/* Slots of the pinned-rescan limiter: a collision only makes it stricter. */
#define STORE_PIN_SLOTS 64

/* When a rescan was last forced for one name and generation (key: a hash of
 * both; at_ms: monotonic, 0 for never). */
typedef struct pin_sync {
    uint64_t key;
    int64_t at_ms;
} pin_sync;

struct weight_store {
    const store_backend *backend;
    char dir[1024];         /* the data directory; the object store's s3:// URL */
    char host[64];          /* this host's name, as temporary and quarantined files carry it */
    store_s3 *s3;           /* the object-store backend's state (store_s3.c), or NULL */
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
    /* The listing's identity (the directory's) before the last full scan
     * read its entries, when it can be trusted to change with the next entry
     * added, renamed or removed (dir_sig_settled; never for an object store),
     * and when that scan was (monotonic): store_sync_if_changed
     * (store_sync.c).  Guarded by sync_lock. */
    file_sig dir_sig;
    int dir_sig_settled;
    int64_t dir_full_ms;
    unsigned long sync_errors, syncs, quarantined;
    /* The recent rescans forced by pins (store_sync_for_pin), by a hash of
     * the name and generation; guarded by pin_lock. */
    pthread_mutex_t pin_lock;
    pin_sync pin_syncs[STORE_PIN_SLOTS];
};

/* ---- store_format.c: bytes in, bytes out ---- */

/* Bytes to be written at offset `at` of a file. */
typedef struct store_run {
    const void *data;
    size_t len;
    uint64_t at;
} store_run;

/* The longest header, with its name and padding: where a file's arrays
 * start at the latest. */
#define STORE_FORMAT_HEAD_MAX (96 + WEIGHTS_NAME_MAX)
/* A file ends in the checksum of every byte before it. */
#define STORE_CHECKSUM_BYTES 8
#define STORE_CHECKSUM_SEED 0xCBF29CE484222325ull

/* A set as the bytes of its file: the header (with the name) and each array
 * present, as runs at their offsets, then the checksum at checksum_at. */
typedef struct store_encoding {
    unsigned char head[STORE_FORMAT_HEAD_MAX];
    store_run runs[WEIGHTS_COUNT + 1];  /* borrowed from head and the set */
    size_t count;
    uint64_t checksum_at;
} store_encoding;

/* Encodes set (borrowed, as long as enc is used) into enc.  0, or -1 with
 * errno EOVERFLOW when a size overflows. */
int store_format_encode(const weight_set *set, store_encoding *enc);
/* Folds n bytes into the checksum h (STORE_CHECKSUM_SEED to begin with);
 * chunks of a multiple of 8 bytes fold as one run. */
uint64_t store_format_checksum(uint64_t h, const void *data, size_t n);
/* The checksum of runs[0..n) in their order: the bytes of a whole file. */
uint64_t store_format_checksum_runs(const store_run *runs, size_t n);
void store_format_put_checksum(unsigned char tail[STORE_CHECKSUM_BYTES], uint64_t h);
uint64_t store_format_get_checksum(const unsigned char tail[STORE_CHECKSUM_BYTES]);

/* A header, decoded and checked against the file's size and name. */
typedef struct store_header {
    uint32_t version;
    size_t len;             /* of the header before the name */
    size_t arrays_at;       /* the header, the name and its padding */
    size_t file_size;       /* what the header implies, checksum included */
    unsigned present;       /* which arrays follow (bit p: weights_part p) */
    int out_in;
    size_t heads;
    int64_t stored_at_ms;
    uint64_t generation;
    attn_weights dims;      /* dimensions and element type; no arrays */
} store_header;

/* What store_format_decode_header answers for a file of a later version. */
#define STORE_FORMAT_NEWER 1

/* Decodes the first `have` bytes of a file of file_size bytes (at least
 * STORE_FORMAT_HEAD_MAX of them when the file has that many), which should
 * hold the set called name, into *h.  Returns 0; STORE_FORMAT_NEWER when the
 * file is of a later format version (h->version set: whether it is whole
 * only its checksum tells, store_format_newer_why); or -1 with the reason in
 * why when it is not a set file, a field is out of range, the size does not
 * match or the name differs. */
int store_format_decode_header(const unsigned char *bytes, size_t have, uint64_t file_size,
                               const char *name, store_header *h, char *why, size_t why_len);
/* The reason a file of a later format version is not loaded: another
 * server's when whole (its checksum matches), else damage. */
void store_format_newer_why(uint32_t version, int whole, char *why, size_t why_len);
/* Bytes of array p of w (whether present or not, in w's element type) into
 * *bytes; -1 when that overflows. */
int store_format_array_bytes(const attn_weights *w, int p, size_t *bytes);
/* The generation in a file's first `have` bytes, or 0 when they are no set
 * header. */
uint64_t store_format_generation(const unsigned char *bytes, size_t have);
/* Bytes of the file that would hold set in the current format, or 0 when
 * that overflows. */
size_t store_format_size(const weight_set *set);

/* ---- store_io.c ---- */

/* The file of the set named name: DIR/NAME.wset. */
void store_path_of(const weight_store *store, const char *name, char *out, size_t len);
/* Writes set durably to final_path: a temporary file, fsync, rename.  Fills
 * *sig with the identity of the new file.  0, or -1 with errno set and no
 * temporary file left behind. */
int store_io_write_set(weight_store *store, const weight_set *set, const char *final_path,
                       file_sig *sig);
/* A set file as read: its header, its arrays (owned: weights_free), the
 * identity of the file. */
typedef struct store_loaded {
    store_header h;
    attn_weights w;
    file_sig sig;
} store_loaded;
/* The bytes of one stored version, wherever they are: size of them, and
 * read_at, which reads n of them at offset at into buf (0, or -1 when they
 * cannot be read). */
typedef struct store_source {
    uint64_t size;
    int (*read_at)(void *ctx, void *buf, size_t n, uint64_t at);
    void *ctx;
} store_source;
/* A source over the file open on fd (its size from fstat): 0, or -1 with
 * errno set. */
int store_source_fd(int *fd, store_source *src);
/* Bytes in memory (borrowed), and a source over them, which borrows span. */
typedef struct store_span {
    const unsigned char *bytes;
    size_t len;
} store_span;
void store_source_mem(store_span *span, store_source *src);
/* Reads the set in src, which should be the set called name, and checks it
 * whole.  Returns 0 with *out filled (out->sig left zero: the caller knows
 * the identity), or -1 with the reason in why, *nomem set when memory ran
 * out rather than the bytes being bad, or *newer set when they are of a
 * later format version than this server reads (another server's, not
 * damage); out then holds nothing. */
int store_io_load(const store_source *src, const char *name, store_loaded *out, char *why,
                  size_t why_len, int *nomem, int *newer);
/* The generation in the header of the file at path, or 0 when there is no
 * readable set file there. */
uint64_t store_io_generation(const char *path);
/* The identity of a file from its stat, and whether two are the same. */
void store_sig_of(const struct stat *st, file_sig *sig);
int store_sig_equal(const file_sig *a, const file_sig *b);
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

/* ---- the backends: store_fs.c, store_s3.c ---- */

/* One stored set as a backend's listing found it. */
typedef struct store_entry {
    const char *file;       /* NAME.wset */
    file_sig sig;
    int unreadable;         /* listed but its identity could not be read: keep what is loaded */
    int fd;                 /* store_fs.c: the file, open for load; -1 otherwise */
    store_span *bytes;      /* store_s3.c: the version's bytes, fetched already; or NULL */
} store_entry;

/* What a backend has under one name now (store_backend.head). */
typedef struct store_version {
    int exists;             /* a file or object is there */
    uint64_t generation;    /* its set's generation when asked for; 0: none, or not readable */
    file_sig sig;
} store_version;

/* What store_backend.write and .remove answer besides 0 and ERR_*. */
#define STORE_CONFLICT 1    /* write: another write of the name came first; read head again */
#define STORE_NOT_SYNCED 2  /* done, but may not survive a crash (err says why): the table
                             * follows it and the caller reports err */
#define STORE_LOAD_FAILED 3 /* load: the store did not give the bytes (err says why) */

/* The operations of one backend; store->backend points at one of these. */
struct store_backend {
    const char *kind;       /* "directory", "s3": /v1/info's store.backend */
    /* Whether a scan asks head again, before swapping a set in or out, that
     * the version it read is still the one in place.  A stat is cheap; for
     * an object store it would be a request per changed set (a thousand at
     * a start-up), and a version replaced meanwhile differs from the one the
     * table then holds, so the next listing brings it in anyway. */
    int recheck_before_apply;
    /* Calls each(store, arg, entry, err) for every NAME.wset stored, and
     * fills *listing with an identity of the listing taken before it was read
     * and *settled with whether that identity can be trusted to change with
     * the next set written or removed (0 when the backend has none).  Returns
     * 0; each's non-zero code, which stops the listing; or ERR_INTERNAL /
     * ERR_UNAVAILABLE with err filled ("store_unreachable") when the store
     * cannot be listed. */
    int (*list)(weight_store *store, int (*each)(weight_store *store, void *arg,
                                                 const store_entry *e, attn_error *err),
                void *arg, file_sig *listing, int *settled, attn_error *err);
    /* (A backend that fetches ahead asks store_scan_wants(arg, e) which
     * listed versions the scan will read.) */
    /* Whether the listing's identity is still *listing: 1 when it is, 0 when
     * the store must be listed again, or an ERR_* code with err filled.  NULL
     * when the backend has no such identity (every scan lists). */
    int (*unchanged)(weight_store *store, const file_sig *listing, attn_error *err);
    /* Reads and checks the version of entry e (the set called name), as
     * store_io_load; *gone set (and -1) when it vanished or was replaced
     * since the listing, which is no damage; STORE_LOAD_FAILED with err
     * filled when the store failed to give it (the scan fails). */
    int (*load)(weight_store *store, const store_entry *e, const char *name, store_loaded *out,
                char *why, size_t why_len, int *nomem, int *newer, int *gone, attn_error *err);
    /* The version under name now, with its generation when with_generation.
     * 0 with *v filled, or an ERR_* code with err filled. */
    int (*head)(weight_store *store, const char *name, int with_generation, store_version *v,
                attn_error *err);
    /* Publishes set under its name, durably, in place of the version over
     * (head's, with its generation), and fills *sig with the new version's
     * identity.  0; STORE_CONFLICT; STORE_NOT_SYNCED; or an ERR_* code with
     * err filled and nothing changed. */
    int (*write)(weight_store *store, const weight_set *set, const store_version *over,
                 file_sig *sig, attn_error *err);
    /* Removes the set of name.  0 (also when it was not there);
     * STORE_NOT_SYNCED; or an ERR_* code with err filled and nothing changed. */
    int (*remove)(weight_store *store, const char *name, attn_error *err);
    /* Sets the damaged version sig of file aside (kept for inspection, never
     * loaded again) if it is still that version.  0 when it was moved. */
    int (*set_aside)(weight_store *store, const char *file, const file_sig *sig);
    /* What the store says of itself for /v1/info (store_info), beyond the
     * kind and location: whether writes are conditional.  NULL: "not_needed". */
    const char *(*conditional_writes)(weight_store *store);
    /* Frees the backend's state (store_close). */
    void (*close)(weight_store *store);
};

extern const store_backend store_fs_backend;
extern const store_backend store_s3_backend;

/* Opens the bucket and prefix of cfg for store (fills store->dir with its
 * s3:// URL and store->s3).  0, or an ERR_* code with err filled. */
int store_s3_open(weight_store *store, const s3_config *cfg, attn_error *err);

/* Opens the data directory dir for store (fills store->dir, cleans abandoned
 * temporary files).  0, or ERR_INTERNAL with err filled (field "data-dir"). */
int store_fs_open(weight_store *store, const char *dir, attn_error *err);

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
/* Milliseconds of the monotonic clock (compute_now's). */
int64_t store_monotonic_ms(void);
/* A new set (one reference, the caller's) from a file store_io_load read,
 * whose arrays it takes whether it succeeds or not; NULL when memory runs
 * out. */
weight_set *store_table_set_loaded(const char *name, store_loaded *file);

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
/* The background thread's scan: the directory's identity alone while it is
 * settled and unchanged (and nothing is suspect), a full store_sync
 * otherwise and at least every STORE_FULL_SCAN_MS.  Returns as store_sync. */
int store_sync_if_changed(weight_store *store, attn_error *err);
/* Whether the scan arg (the one store_backend.list was given) will read
 * the listed version e: its name is not in the scan's snapshot of the table
 * with that identity.  A binary search, no lock. */
int store_scan_wants(void *arg, const store_entry *e);
/* Stops the background sync thread if it runs (store_close). */
void store_sync_stop(weight_store *store);

#endif

/*
 * store.c - the weight-set store: files, durability, reference counting.
 *
 * File format (version 2), all integers and doubles little-endian:
 *
 *   offset  size  field
 *        0     8  magic "ATTNWSET"
 *        8     4  format version (2; version 1 files, without the generation,
 *                 are still read)
 *       12     4  flags (bit 0: uploaded with weights_layout out_in)
 *       16     8  heads (0: none)
 *       24    40  d_in, d_ctx, dk, dv, d_out (5 x u64)
 *       64     4  which arrays follow (bits: wq wk wv wo bq bk bv bo)
 *       68     4  name length n (1..WEIGHTS_NAME_MAX = 64)
 *       72     8  stored_at, Unix time in milliseconds (i64)
 *       80     8  generation (u64; version 2 only: version 1 headers end at 80
 *                 and their generation is stored_at x 1000)
 *       88     n  the name, then zero padding to a multiple of 8
 *        .     .  the arrays present, in the order of the bits, as IEEE-754
 *                 doubles (wq is d_in x dk, wk and wv d_ctx x dk and x dv,
 *                 wo dv x d_out, biases their widths), row-major in_out form
 *        .     8  checksum of every byte before it (see checksum_update)
 *
 * The loader accepts a file only if its size is exactly what the header
 * implies and the checksum matches, so a truncated or altered file is never
 * served.  Writes go to ".tmp.HOST.PID.COUNTER" files that are renamed into
 * place after fsync, so servers sharing the directory never collide.
 *
 * Sharing one directory: any number of servers may use it at once.  Each
 * one rescans it (store_sync: every --store-sync-interval from a background
 * thread, and at once when a request asks for a generation it has not seen)
 * and swaps in new and replaced files and drops deleted ones.  A file is
 * reloaded only when its identity (device, inode, size, mtime) changes;
 * opening it before looking (close-to-open) makes NFS revalidate what it
 * cached.  A file that fails to load is skipped and reported, and moved to
 * quarantine/ only when a later scan finds the same file (same identity)
 * still damaged after quarantine_after_ms.
 *
 * Locking: sync_lock lets one scan run at a time; write_lock serialises puts,
 * deletes and the short apply step of a scan (file work included); map_lock
 * guards the in-memory table and is held only for lookups and swaps.
 * Computation never holds any: it holds a reference to an immutable set.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"
#include "metrics.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the weight-set file format is written natively and assumes a little-endian machine"
#endif

#define MAGIC "ATTNWSET"
#define FORMAT_VERSION 2u
#define HEADER_V1 80
#define HEADER_FIXED 88
#define TMP_PREFIX ".tmp."

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

/* The reference count and the file identity live beside the public struct. */
typedef struct weight_set_box {
    weight_set set;
    long refs;
    file_sig sig;           /* of the file the set was loaded from or written to */
} weight_set_box;

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sig_of(const struct stat *st, file_sig *sig)
{
    sig->dev = (uint64_t)st->st_dev;
    sig->ino = (uint64_t)st->st_ino;
    sig->size = (int64_t)st->st_size;
    sig->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

static int sig_equal(const file_sig *a, const file_sig *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns;
}

static file_sig *sig_slot(weight_set *set)
{
    return &((weight_set_box *)set)->sig;
}

static int fail_io_countdown = -1;

void store_fail_io_after(int n)
{
    __atomic_store_n(&fail_io_countdown, n, __ATOMIC_SEQ_CST);
}

/* Returns -1 with errno = EIO when the injected fault is due. */
static int io_fault(void)
{
    int n = __atomic_load_n(&fail_io_countdown, __ATOMIC_SEQ_CST);
    if (n < 0)
        return 0;
    __atomic_store_n(&fail_io_countdown, n - 1, __ATOMIC_SEQ_CST);
    if (n == 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* ---- sets -------------------------------------------------------------- */

/* Bytes of array p of w (whether present or not) into *bytes; -1 when that
 * overflows. */
static int array_bytes(const attn_weights *w, int p, size_t *bytes)
{
    return mem_mul(weights_rows(w, (weights_part)p), weights_cols(w, (weights_part)p),
                   sizeof(double), bytes);
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
    return &box->set;
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
    weights_free(&set->w);
    mem_free(box);
}

/* ---- the file format --------------------------------------------------- */

/* A 64-bit checksum over 8-byte words (multiply-xorshift mixing): fast
 * enough for hundreds of MiB and sensitive to any changed, lost or moved
 * byte.  It guards against torn and damaged files, not against tampering. */
static uint64_t checksum_update(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        h ^= word;
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        h ^= *p++;
        h *= 0x100000001B3ull;
    }
    return h;
}

#define CHECKSUM_SEED 0xCBF29CE484222325ull

/* Size of the file for a set with these dimensions and arrays, or 0 when it
 * overflows. */
static size_t file_size_for(const attn_weights *w, unsigned present, size_t name_len,
                            size_t header_len)
{
    size_t size = header_len + ((name_len + 7) & ~(size_t)7) + 8, n;
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!(present & (1u << p)))
            continue;
        if (array_bytes(w, p, &n) != 0 || __builtin_add_overflow(size, n, &size))
            return 0;
    }
    if (mem_mul(w->d_in, w->dk, 1, &n) || mem_mul(w->d_ctx, w->dk + w->dv, 1, &n) ||
        mem_mul(w->dv, w->d_out, 1, &n))
        return 0;
    return size;
}

static unsigned present_bits(const attn_weights *w)
{
    unsigned bits = 0;
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        if (weights_array(w, (weights_part)p) != NULL)
            bits |= 1u << p;
    return bits;
}

/* Writes all n bytes or fails (-1, errno set). */
static int write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        if (io_fault() != 0)
            return -1;
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t done = write(fd, p, chunk);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += done;
        n -= (size_t)done;
    }
    return 0;
}

static int read_all(int fd, void *data, size_t n)
{
    char *p = data;
    while (n > 0) {
        ssize_t done = read(fd, p, n);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return -1;
        p += done;
        n -= (size_t)done;
    }
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Writes set to the open file fd in the format above. */
static int set_write(int fd, weight_set *set)
{
    unsigned char header[HEADER_FIXED + WEIGHTS_NAME_MAX + 8];
    size_t name_len = strlen(set->name), padded = (name_len + 7) & ~(size_t)7;
    memset(header, 0, sizeof header);
    memcpy(header, MAGIC, 8);
    put_u32(header + 8, FORMAT_VERSION);
    put_u32(header + 12, set->out_in ? 1u : 0u);
    put_u64(header + 16, set->heads);
    const attn_weights *w = &set->w;
    size_t dims[5] = {w->d_in, w->d_ctx, w->dk, w->dv, w->d_out};
    for (int i = 0; i < 5; i++)
        put_u64(header + 24 + 8 * i, dims[i]);
    put_u32(header + 64, present_bits(&set->w));
    put_u32(header + 68, (uint32_t)name_len);
    put_u64(header + 72, (uint64_t)set->stored_at_ms);
    put_u64(header + 80, set->generation);
    memcpy(header + HEADER_FIXED, set->name, name_len);
    uint64_t h = checksum_update(CHECKSUM_SEED, header, HEADER_FIXED + padded);
    if (write_all(fd, header, HEADER_FIXED + padded) != 0)
        return -1;
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const double *a = weights_array(&set->w, (weights_part)p);
        size_t n;
        if (a == NULL)
            continue;
        if (array_bytes(&set->w, p, &n) != 0)
            return -1;
        h = checksum_update(h, a, n);
        if (write_all(fd, a, n) != 0)
            return -1;
    }
    unsigned char tail[8];
    put_u64(tail, h);
    return write_all(fd, tail, 8);
}

/* Loads the set file open on fd (expected to hold a set named `name`; the
 * descriptor stays open).  Returns the set, or NULL with a reason in why and
 * *nomem set when memory ran out rather than the file being bad. */
static weight_set *set_load_fd(int fd, const char *name, char *why, size_t why_len, int *nomem)
{
    *nomem = 0;
    struct stat st;
    unsigned char header[HEADER_FIXED + WEIGHTS_NAME_MAX];
    weight_set *set = NULL;
    attn_weights w;
    memset(&w, 0, sizeof w);
    if (fstat(fd, &st) != 0 || read_all(fd, header, HEADER_V1) != 0) {
        snprintf(why, why_len, "shorter than a header (truncated)");
        goto fail;
    }
    uint32_t version = get_u32(header + 8);
    if (memcmp(header, MAGIC, 8) != 0 || (version != 1 && version != FORMAT_VERSION)) {
        snprintf(why, why_len, "not a version-1 or version-2 weight-set file");
        goto fail;
    }
    size_t header_len = version == 1 ? HEADER_V1 : HEADER_FIXED;
    if (header_len > HEADER_V1 && read_all(fd, header + HEADER_V1, header_len - HEADER_V1) != 0) {
        snprintf(why, why_len, "shorter than a header (truncated)");
        goto fail;
    }
    uint32_t flags = get_u32(header + 12), present = get_u32(header + 64);
    uint32_t name_len = get_u32(header + 68);
    uint64_t heads = get_u64(header + 16);
    uint64_t dims[5];
    for (int i = 0; i < 5; i++)
        dims[i] = get_u64(header + 24 + 8 * i);
    size_t padded = ((size_t)name_len + 7) & ~(size_t)7;
    if (flags > 1 || (present & 7u) != 7u || present > 0xFFu || name_len < 1 || name_len > WEIGHTS_NAME_MAX ||
        (!(present & 8u) && (present & 128u))) {
        snprintf(why, why_len, "header fields out of range");
        goto fail;
    }
    w.d_in = dims[0];
    w.d_ctx = dims[1];
    w.dk = dims[2];
    w.dv = dims[3];
    w.d_out = dims[4];
    size_t expected = file_size_for(&w, present, name_len, header_len);
    if (expected == 0 || w.d_in == 0 || w.d_ctx == 0 || w.dk == 0 || w.dv == 0 || w.d_out == 0 ||
        (!(present & 8u) && w.d_out != w.dv) ||
        (heads != 0 && weights_check_heads((size_t)heads, w.dk, w.dv, NULL) != 0)) {
        snprintf(why, why_len, "inconsistent dimensions in the header");
        goto fail;
    }
    if ((uint64_t)st.st_size != expected) {
        snprintf(why, why_len, "%lld bytes where the header implies %zu (truncated or damaged)",
                 (long long)st.st_size, expected);
        goto fail;
    }
    if (read_all(fd, header + header_len, padded) != 0 ||
        memcmp(header + header_len, name, name_len) != 0 || strlen(name) != name_len) {
        snprintf(why, why_len, "the name inside the file does not match its file name");
        goto fail;
    }
    uint64_t h = checksum_update(CHECKSUM_SEED, header, header_len + padded);
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!(present & (1u << p)))
            continue;
        size_t n;
        array_bytes(&w, p, &n); /* file_size_for has checked that it fits */
        double *a = mem_malloc(n);
        if (a == NULL) {
            snprintf(why, why_len, "out of memory loading it");
            *nomem = 1;
            goto fail;
        }
        *weights_slot(&w, (weights_part)p) = a;
        if (read_all(fd, a, n) != 0) {
            snprintf(why, why_len, "read failed");
            goto fail;
        }
        h = checksum_update(h, a, n);
    }
    unsigned char tail[8];
    if (read_all(fd, tail, 8) != 0 || get_u64(tail) != h) {
        snprintf(why, why_len, "checksum mismatch (damaged file)");
        goto fail;
    }
    set = weightset_new(name, &w, (size_t)heads, (int)(flags & 1u));
    if (set == NULL) {
        snprintf(why, why_len, "out of memory loading it");
        *nomem = 1;
        goto fail;
    }
    set->stored_at_ms = (int64_t)get_u64(header + 72);
    set->generation = version == 1 ? (uint64_t)set->stored_at_ms * 1000 : get_u64(header + 80);
    set->size_bytes = expected;
    sig_of(&st, sig_slot(set));
    return set;
fail:
    weights_free(&w);
    return NULL;
}

/* The generation in the header of the file at path, or 0 when there is no
 * readable set file there. */
static uint64_t file_generation(const char *path)
{
    unsigned char header[HEADER_FIXED];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    uint64_t gen = 0;
    if (read_all(fd, header, HEADER_V1) == 0 && memcmp(header, MAGIC, 8) == 0) {
        if (get_u32(header + 8) == 1)
            gen = get_u64(header + 72) * 1000;
        else if (get_u32(header + 8) == FORMAT_VERSION &&
                 read_all(fd, header + HEADER_V1, HEADER_FIXED - HEADER_V1) == 0)
            gen = get_u64(header + 80);
    }
    close(fd);
    return gen;
}

/* ---- the table --------------------------------------------------------- */

/* Index of name in the table, or -1.  Caller holds map_lock. */
static long table_find(weight_store *store, const char *name)
{
    for (size_t i = 0; i < store->count; i++)
        if (strcmp(store->sets[i]->name, name) == 0)
            return (long)i;
    return -1;
}

/* Makes room for one more entry.  Caller holds map_lock. */
static int table_reserve(weight_store *store)
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

static void path_of(const weight_store *store, const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.wset", store->dir, name);
}

static int fsync_dir(const char *dir)
{
    if (io_fault() != 0)
        return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Moves the damaged file aside into quarantine/ so it is kept for inspection
 * but never loaded again, provided it is still the version sig describes.
 * Another server may rename a good version into place at any moment: if the
 * file moved aside turns out not to be the damaged one, it is linked back
 * (link never replaces a newer file) and nothing is lost. */
static int quarantine(weight_store *store, const char *file, const file_sig *sig)
{
    char qdir[1100], from[1400], to[1500];
    snprintf(qdir, sizeof qdir, "%s/quarantine", store->dir);
    mkdir(qdir, 0755);
    snprintf(from, sizeof from, "%s/%s", store->dir, file);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(to, sizeof to, "%s/%s.%s.%lld%09ld", qdir, file, store->host, (long long)now.tv_sec,
             now.tv_nsec);
    struct stat st;
    file_sig moved;
    if (rename(from, to) != 0) {
        if (errno != ENOENT)
            fprintf(stderr, "store: could not move %s aside: %s\n", from, strerror(errno));
        return -1;
    }
    if (stat(to, &st) == 0 && (sig_of(&st, &moved), !sig_equal(&moved, sig))) {
        if (link(to, from) == 0 || errno == EEXIST)
            unlink(to);
        return -1;
    }
    fprintf(stderr, "store: %s stayed damaged: moved to %s\n", from, to);
    __atomic_add_fetch(&store->quarantined, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* Creates dir and its parents as needed. */
static int make_dirs(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* This host's name as temporary file names carry it: letters, digits and
 * '-' only (a '.' would make the name ambiguous), at most 63 characters. */
static void host_label(char *out, size_t len)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
        snprintf(host, sizeof host, "unknown");
    size_t j = 0;
    for (size_t i = 0; host[i] != '\0' && j + 1 < len; i++) {
        char c = host[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-';
        out[j++] = ok ? c : '-';
    }
    out[j] = '\0';
}

int store_tmp_name_parse(const char *file, char *host, size_t host_len, long *pid)
{
    if (strncmp(file, TMP_PREFIX, strlen(TMP_PREFIX)) != 0)
        return -1;
    const char *h = file + strlen(TMP_PREFIX), *dot = strchr(h, '.');
    if (dot == NULL || dot == h || (size_t)(dot - h) >= host_len)
        return -1;
    char *end;
    errno = 0;
    long p = strtol(dot + 1, &end, 10);
    if (errno != 0 || end == dot + 1 || p <= 0 || *end != '.' || end[1] < '0' || end[1] > '9')
        return -1;
    for (const char *c = end + 1; *c; c++)
        if (*c < '0' || *c > '9')
            return -1;
    memcpy(host, h, (size_t)(dot - h));
    host[dot - h] = '\0';
    *pid = p;
    return 0;
}

/* Removes the temporary files that are certainly abandoned: this host's
 * whose process is gone (or is this very process, which has written nothing
 * yet), and anyone's older than limits.temp_max_age_s (0: never by age).
 * Another live server's write in progress is never touched. */
static void clean_temporaries(weight_store *store)
{
    DIR *d = opendir(store->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d)) != NULL) {
        const char *file = e->d_name;
        size_t n = strlen(file);
        if (strncmp(file, TMP_PREFIX, strlen(TMP_PREFIX)) != 0 ||
            (n > 5 && strcmp(file + n - 5, ".wset") == 0))
            continue; /* not a temporary file (a set may be named ".tmp.x") */
        char path[1400], host[64];
        snprintf(path, sizeof path, "%s/%s", store->dir, file);
        long pid;
        int ours = store_tmp_name_parse(file, host, sizeof host, &pid) == 0 &&
                   strcmp(host, store->host) == 0 &&
                   (pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH));
        struct stat st;
        int old = store->limits.temp_max_age_s > 0 && lstat(path, &st) == 0 &&
                  (double)(now - st.st_mtime) > (double)store->limits.temp_max_age_s;
        if (!ours && !old)
            continue;
        if (unlink(path) == 0)
            fprintf(stderr, "store: removed %s, %s\n", path,
                    ours ? "left by a crashed server on this host" : "abandoned (older than "
                                                                    "--store-temp-max-age)");
    }
    closedir(d);
}

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
    suspect *suspects;      /* files damaged in this scan */
    size_t suspect_count, suspect_cap;
} scan_state;

static void scan_free(scan_state *sc)
{
    store_list_free(sc->snap, sc->snap_count);
    mem_free(sc->seen);
    for (size_t i = 0; i < sc->change_count; i++)
        weightset_release(sc->changes[i].after);
    mem_free(sc->changes);
    mem_free(sc->suspects);
}

static int grow(void **array, size_t *cap, size_t count, size_t elem)
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

static long snap_find(const scan_state *sc, const char *name)
{
    for (size_t i = 0; i < sc->snap_count; i++)
        if (strcmp(sc->snap[i]->name, name) == 0)
            return (long)i;
    return -1;
}

/* Records file (identity sig) as damaged in this scan.  A file first seen
 * damaged is reported; one that was already suspect with the same identity
 * keeps its first sighting, and is quarantined once it has stayed damaged
 * for limits.quarantine_after_ms (never during the first scan of
 * store_open).  Returns -1 only when memory runs out. */
static int scan_damaged(weight_store *store, scan_state *sc, const char *file, const file_sig *sig,
                        const char *why, int initial)
{
    int64_t now = monotonic_ms(), first = now;
    for (size_t i = 0; i < store->suspect_count; i++)
        if (!strcmp(store->suspects[i].file, file) && sig_equal(&store->suspects[i].sig, sig))
            first = store->suspects[i].first_ms;
    if (first == now)
        fprintf(stderr, "store: skipping %s/%s: %s (moved to quarantine/ if it stays so)\n",
                store->dir, file, why);
    if (!initial && now - first >= store->limits.quarantine_after_ms &&
        quarantine(store, file, sig) == 0)
        return 0;
    if (grow((void **)&sc->suspects, &sc->suspect_cap, sc->suspect_count, sizeof *sc->suspects))
        return -1;
    suspect *s = &sc->suspects[sc->suspect_count++];
    snprintf(s->file, sizeof s->file, "%s", file);
    s->sig = *sig;
    s->first_ms = first;
    return 0;
}

/* Reads the directory into sc: loads every set file whose identity differs
 * from the table's, and notes damaged files.  No table lock is held. */
static int scan_directory(weight_store *store, scan_state *sc, int initial, attn_error *err)
{
    DIR *d = opendir(store->dir);
    if (d == NULL)
        return error_set(err, ERR_INTERNAL, "store_unreachable", NULL,
                         "Cannot read the data directory %s: %s.", store->dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        const char *file = e->d_name;
        size_t n = strlen(file);
        if (n <= 5 || strcmp(file + n - 5, ".wset") != 0)
            continue;
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
            errno = saved;
            if (errno != ENOENT) /* gone since the listing: a delete, not damage */
                fprintf(stderr, "store: cannot read %s: %s\n", path, strerror(errno));
            long i = snap_find(sc, name);
            if (i >= 0 && errno != ENOENT)
                sc->seen[i] = 1; /* keep what we have */
            continue;
        }
        file_sig sig;
        sig_of(&st, &sig);
        long i = weights_valid_name(name) ? snap_find(sc, name) : -1;
        if (i >= 0) {
            sc->seen[i] = 1;
            if (sig_equal(sig_slot(sc->snap[i]), &sig)) {
                close(fd);
                continue;
            }
        }
        weight_set *set = NULL;
        int nomem = 0;
        if (!weights_valid_name(name))
            snprintf(why, sizeof why, "the file name is not a valid set name");
        else
            set = set_load_fd(fd, name, why, sizeof why, &nomem);
        close(fd);
        if (nomem) {
            fprintf(stderr, "store: out of memory loading %s\n", path);
            rc = error_nomem(err);
            break;
        }
        if (set == NULL) {
            if (scan_damaged(store, sc, file, &sig, why, initial) != 0) {
                rc = error_nomem(err);
                break;
            }
            continue;
        }
        if (i >= 0 && sc->snap[i]->generation == set->generation &&
            sc->snap[i]->size_bytes == set->size_bytes) {
            /* The same version under a new identity (copied, touched): keep
             * the set, note the file. */
            weightset_release(set);
            pthread_mutex_lock(&store->map_lock);
            *sig_slot(sc->snap[i]) = sig;
            pthread_mutex_unlock(&store->map_lock);
            continue;
        }
        if (grow((void **)&sc->changes, &sc->change_cap, sc->change_count, sizeof *sc->changes)) {
            weightset_release(set);
            rc = error_nomem(err);
            break;
        }
        scan_change *c = &sc->changes[sc->change_count++];
        snprintf(c->name, sizeof c->name, "%s", set->name); /* a valid name: it loaded */
        c->before = i >= 0 ? sc->snap[i] : NULL;
        c->after = set;
        errno = 0;
    }
    closedir(d);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < sc->snap_count; i++) {
        if (sc->seen[i])
            continue;
        if (grow((void **)&sc->changes, &sc->change_cap, sc->change_count, sizeof *sc->changes))
            return error_nomem(err);
        scan_change *c = &sc->changes[sc->change_count++];
        snprintf(c->name, sizeof c->name, "%s", sc->snap[i]->name);
        c->before = sc->snap[i];
        c->after = NULL;
    }
    return 0;
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
        path_of(store, c->name, path, sizeof path);
        struct stat st;
        file_sig now;
        int exists = stat(path, &st) == 0;
        if (exists)
            sig_of(&st, &now);
        if (c->after != NULL ? !exists || !sig_equal(&now, sig_slot(c->after))
                             : exists || errno != ENOENT)
            continue;
        pthread_mutex_lock(&store->map_lock);
        long i = table_find(store, c->name);
        weight_set *current = i >= 0 ? store->sets[i] : NULL, *dropped = NULL;
        if (current == c->before) {
            if (c->after != NULL && i < 0 && table_reserve(store) != 0) {
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

/* One scan; initial is the first one of store_open (nothing quarantined). */
static int sync_once(weight_store *store, int initial, attn_error *err)
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
        store->suspects = sc.suspects;
        store->suspect_count = sc.suspect_count;
        sc.suspects = NULL;
        __atomic_store_n(&store->last_ok_ms, monotonic_ms(), __ATOMIC_SEQ_CST);
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
    return sync_once(store, 0, err);
}

weight_store *store_open(const char *dir, const store_limits *limits, attn_error *err)
{
    if (strlen(dir) == 0 || strlen(dir) >= 1000) {
        error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                  "The data directory must be a path of 1 to 999 characters.");
        return NULL;
    }
    if (make_dirs(dir) != 0) {
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
    host_label(store->host, sizeof store->host);
    store->limits = *limits;
    pthread_mutex_init(&store->write_lock, NULL);
    pthread_mutex_init(&store->map_lock, NULL);
    pthread_mutex_init(&store->sync_lock, NULL);
    pthread_mutex_init(&store->wake_lock, NULL);
    pthread_cond_init(&store->wake, NULL);
    clean_temporaries(store);
    if (sync_once(store, 1, err) != 0) {
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

/* The background sync: a scan every interval until store_close. */
static void *sync_thread(void *arg)
{
    weight_store *store = arg;
    int failing = 0;
    pthread_mutex_lock(&store->wake_lock);
    while (!store->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = until.tv_nsec + (long long)(store->interval_ms % 1000) * 1000000;
        until.tv_sec += store->interval_ms / 1000 + ns / 1000000000;
        until.tv_nsec = (long)(ns % 1000000000);
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
    st->last_ok_age_ms = last > 0 ? monotonic_ms() - last : -1;
    st->syncs = __atomic_load_n(&store->syncs, __ATOMIC_SEQ_CST);
    st->sync_errors = __atomic_load_n(&store->sync_errors, __ATOMIC_SEQ_CST);
    st->quarantined = __atomic_load_n(&store->quarantined, __ATOMIC_SEQ_CST);
    st->interval_ms = store->interval_ms;
}

void store_close(weight_store *store)
{
    if (store == NULL)
        return;
    if (store->thread_running) {
        pthread_mutex_lock(&store->wake_lock);
        store->stop = 1;
        pthread_cond_broadcast(&store->wake);
        pthread_mutex_unlock(&store->wake_lock);
        pthread_join(store->thread, NULL);
    }
    for (size_t i = 0; i < store->count; i++)
        weightset_release(store->sets[i]);
    mem_free(store->sets);
    mem_free(store->suspects);
    pthread_mutex_destroy(&store->write_lock);
    pthread_mutex_destroy(&store->map_lock);
    pthread_mutex_destroy(&store->sync_lock);
    pthread_mutex_destroy(&store->wake_lock);
    pthread_cond_destroy(&store->wake);
    mem_free(store);
}

weight_set *store_get(weight_store *store, const char *name)
{
    pthread_mutex_lock(&store->map_lock);
    long i = table_find(store, name);
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

int store_put(weight_store *store, weight_set *set, int *created, attn_error *err)
{
    size_t size = file_size_for(&set->w, present_bits(&set->w), strlen(set->name), HEADER_FIXED);
    if (size == 0 || size > store->limits.max_set_bytes) {
        weightset_release(set);
        return error_set(err, ERR_TOO_LARGE, "weight_set_too_large", NULL,
                         "This weight set takes %zu bytes, more than the limit of %zu bytes for "
                         "one set (--max-set-bytes).", size, store->limits.max_set_bytes);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    set->stored_at_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    set->size_bytes = size;

    pthread_mutex_lock(&store->write_lock);
    pthread_mutex_lock(&store->map_lock);
    long old = table_find(store, set->name);
    size_t old_size = old >= 0 ? store->sets[old]->size_bytes : 0;
    size_t after = store->total_bytes - old_size + size;
    int room = old >= 0 || table_reserve(store) == 0;
    pthread_mutex_unlock(&store->map_lock);
    int rc = 0;
    if (after > store->limits.max_total_bytes) {
        rc = error_set(err, ERR_TOO_LARGE, "store_full", NULL,
                       "Storing this set would bring the data directory to %zu bytes, more than "
                       "its limit of %zu (--max-store-bytes); delete sets you no longer need.",
                       after, store->limits.max_total_bytes);
        goto done;
    }
    if (!room) {
        rc = error_nomem(err);
        goto done;
    }
    /* HOST.PID.COUNTER: unique among all servers sharing the directory, and
     * never ending in ".wset". */
    static unsigned long tmp_counter;
    char tmp[1400], final[1400];
    snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%s.%ld.%lu", store->dir, store->host,
             (long)getpid(), __atomic_add_fetch(&tmp_counter, 1, __ATOMIC_SEQ_CST));
    path_of(store, set->name, final, sizeof final);
    /* The generation goes up from whatever version is in place now, ours or
     * another server's, and follows the clock when that is ahead. */
    uint64_t gen = (uint64_t)now.tv_sec * 1000000 + (uint64_t)now.tv_nsec / 1000;
    uint64_t on_disk = file_generation(final);
    int file_existed = on_disk != 0; /* perhaps another server's, not loaded here yet */
    pthread_mutex_lock(&store->map_lock);
    old = table_find(store, set->name);
    if (old >= 0 && store->sets[old]->generation > on_disk)
        on_disk = store->sets[old]->generation;
    pthread_mutex_unlock(&store->map_lock);
    if (gen <= on_disk)
        gen = on_disk + 1;
    set->generation = gen;
    int fd = io_fault() == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    int ok = fd >= 0 && set_write(fd, set) == 0 && io_fault() == 0 && fsync(fd) == 0;
    int saved = errno;
    struct stat st;
    if (ok && fstat(fd, &st) == 0)
        sig_of(&st, sig_slot(set));
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    ok = ok && io_fault() == 0 && rename(tmp, final) == 0;
    if (!ok) {
        saved = errno;
        unlink(tmp);
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set could not be stored: %s. Nothing was changed.",
                       strerror(saved));
        goto done;
    }
    if (fsync_dir(store->dir) != 0) {
        /* The new file is in place but the rename may not survive a crash:
         * report failure so the client retries; the in-memory table follows
         * the file, which is what a restart would most likely see. */
        saved = errno;
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set was written but the directory could not be synced (%s); "
                       "retry the upload.", strerror(saved));
    }
    pthread_mutex_lock(&store->map_lock);
    old = table_find(store, set->name);
    weight_set *previous = NULL;
    if (old >= 0) {
        previous = store->sets[old];
        store->sets[old] = set;
        store->total_bytes -= previous->size_bytes;
    } else {
        store->sets[store->count++] = set;
    }
    store->total_bytes += size;
    pthread_mutex_unlock(&store->map_lock);
    set = NULL; /* the table owns it now */
    weightset_release(previous);
    if (created != NULL)
        *created = old < 0 && !file_existed;
done:
    pthread_mutex_unlock(&store->write_lock);
    weightset_release(set);
    return rc;
}

int store_delete(weight_store *store, const char *name, attn_error *err)
{
    pthread_mutex_lock(&store->write_lock);
    int rc = 0;
    weight_set *gone = store_get(store, name);
    char path[1400];
    path_of(store, name, path, sizeof path);
    struct stat st;
    if (gone == NULL && stat(path, &st) != 0) {
        /* Neither loaded here nor written meanwhile by another server. */
        rc = error_set(err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                       "There is no stored weight set named \"%s\".", name);
        goto done;
    }
    if (io_fault() != 0 || (unlink(path) != 0 && errno != ENOENT)) {
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set could not be deleted: %s. Nothing was changed.",
                       strerror(errno));
        goto done;
    }
    if (fsync_dir(store->dir) != 0) {
        /* The file is gone; as in store_put, the table follows the file. */
        rc = error_set(err, ERR_INTERNAL, "internal", NULL,
                       "The weight set was deleted but the directory could not be synced (%s).",
                       strerror(errno));
    }
    pthread_mutex_lock(&store->map_lock);
    long i = table_find(store, name);
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

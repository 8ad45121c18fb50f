/*
 * store.c - the weight-set store: files, durability, reference counting.
 *
 * File format (version 1), all integers and doubles little-endian:
 *
 *   offset  size  field
 *        0     8  magic "ATTNWSET"
 *        8     4  format version (1)
 *       12     4  flags (bit 0: uploaded with weights_layout out_in)
 *       16     8  heads (0: none)
 *       24    40  d_in, d_ctx, dk, dv, d_out (5 x u64)
 *       64     4  which arrays follow (bits: wq wk wv wo bq bk bv bo)
 *       68     4  name length n (1..WEIGHTS_NAME_MAX = 64)
 *       72     8  stored_at, Unix time in milliseconds (i64)
 *       80     n  the name, then zero padding to a multiple of 8
 *        .     .  the arrays present, in the order of the bits, as IEEE-754
 *                 doubles (wq is d_in x dk, wk and wv d_ctx x dk and x dv,
 *                 wo dv x d_out, biases their widths), row-major in_out form
 *        .     8  checksum of every byte before it (see checksum_update)
 *
 * The loader accepts a file only if its size is exactly what the header
 * implies and the checksum matches, so a truncated or altered file is never
 * served.  Writes go to ".tmp.*" files that are renamed into place after
 * fsync; leftovers of a crash are removed at start-up.
 *
 * Locking: write_lock serialises puts and deletes (file work included);
 * map_lock guards the in-memory table and is held only for lookups and swaps.
 * Computation never holds either: it holds a reference to an immutable set.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the weight-set file format is written natively and assumes a little-endian machine"
#endif

#define MAGIC "ATTNWSET"
#define FORMAT_VERSION 1u
#define HEADER_FIXED 80

struct weight_store {
    char dir[1024];
    store_limits limits;
    pthread_mutex_t write_lock;
    pthread_mutex_t map_lock;
    weight_set **sets;
    size_t count, cap;
    size_t total_bytes;
};

/* The reference count lives beside the public struct. */
typedef struct weight_set_box {
    weight_set set;
    long refs;
} weight_set_box;

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
static size_t file_size_for(const attn_weights *w, unsigned present, size_t name_len)
{
    size_t size = HEADER_FIXED + ((name_len + 7) & ~(size_t)7) + 8, n;
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
    unsigned char header[HEADER_FIXED + 64 + 8];
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

/* Loads the set file at path (expected to hold a set named `name`).
 * Returns the set, or NULL with a reason in why. */
static weight_set *set_load(const char *path, const char *name, char *why, size_t why_len,
                            int *nomem)
{
    *nomem = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    unsigned char header[HEADER_FIXED + 64];
    weight_set *set = NULL;
    attn_weights w;
    memset(&w, 0, sizeof w);
    if (fstat(fd, &st) != 0 || read_all(fd, header, HEADER_FIXED) != 0) {
        snprintf(why, why_len, "shorter than a header (truncated)");
        goto fail;
    }
    if (memcmp(header, MAGIC, 8) != 0 || get_u32(header + 8) != FORMAT_VERSION) {
        snprintf(why, why_len, "not a version-%u weight-set file", FORMAT_VERSION);
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
    size_t expected = file_size_for(&w, present, name_len);
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
    if (read_all(fd, header + HEADER_FIXED, padded) != 0 ||
        memcmp(header + HEADER_FIXED, name, name_len) != 0 || strlen(name) != name_len) {
        snprintf(why, why_len, "the name inside the file does not match its file name");
        goto fail;
    }
    uint64_t h = checksum_update(CHECKSUM_SEED, header, HEADER_FIXED + padded);
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
    set->size_bytes = expected;
    close(fd);
    return set;
fail:
    weights_free(&w);
    close(fd);
    return NULL;
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

/* Moves a bad file aside into quarantine/ so it is kept for inspection but
 * never loaded again. */
static void quarantine(const weight_store *store, const char *file)
{
    char qdir[1100], from[1400], to[1500];
    snprintf(qdir, sizeof qdir, "%s/quarantine", store->dir);
    mkdir(qdir, 0755);
    snprintf(from, sizeof from, "%s/%s", store->dir, file);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(to, sizeof to, "%s/%s.%lld%09ld", qdir, file, (long long)now.tv_sec, now.tv_nsec);
    if (rename(from, to) == 0)
        fprintf(stderr, "store: moved %s to %s\n", from, to);
    else
        fprintf(stderr, "store: could not move %s aside: %s\n", from, strerror(errno));
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
    weight_store *store = mem_calloc(1, sizeof *store);
    if (store == NULL) {
        closedir(d);
        error_nomem(err);
        return NULL;
    }
    snprintf(store->dir, sizeof store->dir, "%s", dir);
    store->limits = *limits;
    pthread_mutex_init(&store->write_lock, NULL);
    pthread_mutex_init(&store->map_lock, NULL);
    struct dirent *e;
    size_t loaded = 0, skipped = 0;
    while ((e = readdir(d)) != NULL) {
        const char *file = e->d_name;
        size_t n = strlen(file);
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        int is_set_file = n > 5 && strcmp(file + n - 5, ".wset") == 0;
        if (strncmp(file, ".tmp.", 5) == 0 && !is_set_file) {
                /* A write that a crash interrupted: it was never acknowledged.
             * (Temporary names end in ".<pid>.<n>", never in ".wset", so a
             * set named ".tmp.x" is not mistaken for one.) */
            unlink(path);
            continue;
        }
        if (!is_set_file)
            continue;
        char name[80];
        snprintf(name, sizeof name, "%.*s", (int)(n - 5), file);
        char why[200];
        weight_set *set = NULL;
        int nomem = 0;
        if (!weights_valid_name(name)) {
            snprintf(why, sizeof why, "the file name is not a valid set name");
        } else {
            set = set_load(path, name, why, sizeof why, &nomem);
        }
        if (nomem || (set != NULL && table_reserve(store) != 0)) {
            /* A good file must not be quarantined for our lack of memory:
             * refuse to start instead. */
            fprintf(stderr, "store: out of memory loading %s\n", path);
            weightset_release(set);
            closedir(d);
            store_close(store);
            error_nomem(err);
            return NULL;
        }
        if (set == NULL) {
            fprintf(stderr, "store: skipping %s: %s\n", path, why);
            quarantine(store, file);
            skipped++;
            continue;
        }
        store->sets[store->count++] = set;
        store->total_bytes += set->size_bytes;
        loaded++;
    }
    closedir(d);
    fprintf(stderr, "store: %zu weight set(s) loaded from %s (%zu skipped)\n", loaded, dir, skipped);
    return store;
}

void store_close(weight_store *store)
{
    if (store == NULL)
        return;
    for (size_t i = 0; i < store->count; i++)
        weightset_release(store->sets[i]);
    mem_free(store->sets);
    pthread_mutex_destroy(&store->write_lock);
    pthread_mutex_destroy(&store->map_lock);
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
    size_t size = file_size_for(&set->w, present_bits(&set->w), strlen(set->name));
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
    static unsigned long tmp_counter;
    char tmp[1400], final[1400];
    snprintf(tmp, sizeof tmp, "%s/.tmp.%s.%ld.%lu", store->dir, set->name, (long)getpid(),
             __atomic_add_fetch(&tmp_counter, 1, __ATOMIC_SEQ_CST));
    path_of(store, set->name, final, sizeof final);
    int fd = io_fault() == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    int ok = fd >= 0 && set_write(fd, set) == 0 && io_fault() == 0 && fsync(fd) == 0;
    int saved = errno;
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
        *created = old < 0;
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
    if (gone == NULL) {
        rc = error_set(err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                       "There is no stored weight set named \"%s\".", name);
        goto done;
    }
    char path[1400];
    path_of(store, name, path, sizeof path);
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

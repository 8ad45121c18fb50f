/*
 * store_io.c - reading a stored set from its bytes, wherever they are (a
 * store_source: a file, or an object's body in memory), and the file-system
 * steps of the directory backend: the durable write of a set file, the
 * delete, the directory fsync, file identities, and the temporary files
 * (their names and their clean-up at start-up).  What the bytes mean is
 * store_format.c's business.
 *
 * A write goes to ".tmp.HOST.PID.COUNTER", is fsynced and renamed over the
 * set's file, and the directory is fsynced after: so after a crash a set is
 * either wholly there or not at all, and servers sharing the directory never
 * collide on a temporary name.
 *
 * Test builds (-DATTN_TESTING) can make the nth step fail
 * (store_fail_io_after, test_hooks.h); in the server every step is simply
 * attempted.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"

#ifdef ATTN_TESTING
#include "core/test_hooks.h"

static int fail_io_countdown = -1;

void store_fail_io_after(int n)
{
    __atomic_store_n(&fail_io_countdown, n, __ATOMIC_SEQ_CST);
}

/* Returns -1 with errno = EIO when the injected fault is due.  Each step
 * takes one count, also when two threads write a file's chunks at once. */
static int io_step_fails(void)
{
    int n = __atomic_load_n(&fail_io_countdown, __ATOMIC_SEQ_CST);
    while (n >= 0 && !__atomic_compare_exchange_n(&fail_io_countdown, &n, n - 1, 0,
                                                  __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
    if (n == 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}
#else
/* The server is built without fault injection: every step is attempted. */
static int io_step_fails(void)
{
    return 0;
}
#endif

void store_path_of(const weight_store *store, const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.wset", store->dir, name);
}

/* A large set is written by two threads, the caller and one helper, in
 * chunks of WRITE_CHUNK that each takes in turn: copying the arrays into the
 * page cache is a large part of a large PUT, and two threads copy at once
 * (the fsync after it is the disk's; docs/performance.md has the figures).
 * A set below WRITE_TWO_FROM is written by the caller alone, in the order of
 * its runs.  The caller's meanwhile (the file's checksum) runs while the
 * helper has begun, so that it is not spent before the first write. */
#define WRITE_CHUNK ((size_t)8 << 20)
#define WRITE_TWO_FROM ((size_t)32 << 20)

typedef struct run_writer {
    int fd;
    const store_run *runs;
    size_t n;
    atomic_size_t next;         /* the next chunk to take, counted over every run */
    atomic_int failed;          /* errno of the first failure, or 0 */
} run_writer;

/* Chunk k of the runs as (run, offset in it); -1 past the last. */
static int chunk_at(const run_writer *w, size_t k, size_t *run, size_t *off)
{
    for (size_t r = 0; r < w->n; r++) {
        size_t chunks = (w->runs[r].len + WRITE_CHUNK - 1) / WRITE_CHUNK;
        if (k < chunks) {
            *run = r;
            *off = k * WRITE_CHUNK;
            return 0;
        }
        k -= chunks;
    }
    return -1;
}

static int pwrite_all(int fd, const char *p, size_t n, uint64_t at)
{
    while (n > 0) {
        ssize_t done = pwrite(fd, p, n, (off_t)at);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += done;
        n -= (size_t)done;
        at += (uint64_t)done;
    }
    return 0;
}

/* Takes chunks until none is left or a write failed. */
static void *write_chunks(void *arg)
{
    run_writer *w = arg;
    size_t r, off;
    while (atomic_load(&w->failed) == 0 && chunk_at(w, atomic_fetch_add(&w->next, 1), &r, &off) == 0) {
        const store_run *run = &w->runs[r];
        size_t len = run->len - off < WRITE_CHUNK ? run->len - off : WRITE_CHUNK;
        if (io_step_fails() != 0 ||
            pwrite_all(w->fd, (const char *)run->data + off, len, run->at + off) != 0) {
            int expected = 0;
            atomic_compare_exchange_strong(&w->failed, &expected, errno != 0 ? errno : EIO);
        }
    }
    return NULL;
}

/* Writes the n runs (disjoint) to fd at their offsets, or fails (-1, errno
 * set); the file offset is left where it was.  meanwhile (when not NULL) is
 * called with ctx on the calling thread while a large write's helper thread
 * has begun (before the caller writes too), for work that only reads the
 * runs' data. */
static int write_runs(int fd, const store_run *runs, size_t n, void (*meanwhile)(void *ctx),
                      void *ctx)
{
    run_writer w = {.fd = fd, .runs = runs, .n = n};
    atomic_init(&w.next, 0);
    atomic_init(&w.failed, 0);
    size_t total = 0;
    for (size_t r = 0; r < n; r++)
        total += runs[r].len;
    pthread_t helper;
    int two = total >= WRITE_TWO_FROM && pthread_create(&helper, NULL, write_chunks, &w) == 0;
    if (meanwhile != NULL)
        meanwhile(ctx);
    write_chunks(&w);
    if (two)
        pthread_join(helper, NULL);
    int failed = atomic_load(&w.failed);
    if (failed != 0) {
        errno = failed;
        return -1;
    }
    return 0;
}

/* The checksum of an encoding's runs: write_runs's meanwhile. */
typedef struct run_checksum {
    const store_encoding *enc;
    uint64_t h;
} run_checksum;

static void checksum_runs(void *ctx)
{
    run_checksum *c = ctx;
    c->h = store_format_checksum_runs(c->enc->runs, c->enc->count);
}

/* Writes set to the open file fd: every run at its place while the
 * checksum of the file's bytes, in their order, is computed beside the
 * writer; the checksum goes last.  0, or -1 with errno set. */
static int write_file(int fd, const weight_set *set)
{
    store_encoding enc;
    if (store_format_encode(set, &enc) != 0)
        return -1;
    run_checksum sum = {&enc, 0};
    if (write_runs(fd, enc.runs, enc.count, checksum_runs, &sum) != 0)
        return -1;
    unsigned char tail[STORE_CHECKSUM_BYTES];
    store_format_put_checksum(tail, sum.h);
    store_run last = {tail, sizeof tail, enc.checksum_at};
    return write_runs(fd, &last, 1, NULL, NULL);
}

/* The steps are open, the writes, fsync and rename, in that order. */
int store_io_write_set(weight_store *store, const weight_set *set, const char *final_path,
                       file_sig *sig)
{
    /* HOST.PID.COUNTER: unique among all servers sharing the directory, and
     * never ending in ".wset". */
    static unsigned long tmp_counter;
    char tmp[1400];
    snprintf(tmp, sizeof tmp, "%s/" STORE_TMP_PREFIX "%s.%ld.%lu", store->dir, store->host,
             (long)getpid(), __atomic_add_fetch(&tmp_counter, 1, __ATOMIC_SEQ_CST));
    int fd = io_step_fails() == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    int ok = fd >= 0 && write_file(fd, set) == 0 && io_step_fails() == 0 && fsync(fd) == 0;
    struct stat st;
    if (ok && fstat(fd, &st) == 0)
        store_sig_of(&st, sig);
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    ok = ok && io_step_fails() == 0 && rename(tmp, final_path) == 0;
    if (ok)
        return 0;
    int saved = errno;
    unlink(tmp);
    errno = saved;
    return -1;
}

void store_sig_of(const struct stat *st, file_sig *sig)
{
    memset(sig, 0, sizeof *sig);
    sig->dev = (uint64_t)st->st_dev;
    sig->ino = (uint64_t)st->st_ino;
    sig->size = (int64_t)st->st_size;
    sig->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

int store_sig_equal(const file_sig *a, const file_sig *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && strcmp(a->etag, b->etag) == 0;
}

/* Reads n bytes from fd at offset at; 0, or -1 on an error or a short file. */
static int pread_all(int fd, void *data, size_t n, uint64_t at)
{
    char *p = data;
    while (n > 0) {
        ssize_t done = pread(fd, p, n, (off_t)at);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return -1;
        p += done;
        n -= (size_t)done;
        at += (uint64_t)done;
    }
    return 0;
}

static int fd_read_at(void *ctx, void *buf, size_t n, uint64_t at)
{
    return pread_all(*(int *)ctx, buf, n, at);
}

int store_source_fd(int *fd, store_source *src)
{
    struct stat st;
    if (fstat(*fd, &st) != 0)
        return -1;
    *src = (store_source){(uint64_t)st.st_size, fd_read_at, fd};
    return 0;
}

static int span_read_at(void *ctx, void *buf, size_t n, uint64_t at)
{
    const store_span *m = ctx;
    if (at > m->len || n > m->len - at)
        return -1;
    memcpy(buf, m->bytes + at, n);
    return 0;
}

void store_source_mem(store_span *span, store_source *src)
{
    *src = (store_source){span->len, span_read_at, span};
}

/* 1 when the last bytes of src are the checksum of all the bytes before
 * them, as in every version of the format, else 0. */
static int whole_file_checks(const store_source *src)
{
    enum { CHUNK = 1 << 20 };   /* a multiple of 8, so chunks checksum as one run */
    if (src->size < STORE_CHECKSUM_BYTES)
        return 0;
    unsigned char *buf = mem_malloc(CHUNK);
    if (buf == NULL)
        return 0;
    uint64_t h = STORE_CHECKSUM_SEED, at = 0;
    uint64_t left = src->size - STORE_CHECKSUM_BYTES;
    int ok = 1;
    while (ok && left > 0) {
        size_t n = left < CHUNK ? (size_t)left : CHUNK;
        ok = src->read_at(src->ctx, buf, n, at) == 0;
        h = store_format_checksum(h, buf, n);
        left -= n;
        at += n;
    }
    ok = ok && src->read_at(src->ctx, buf, STORE_CHECKSUM_BYTES, at) == 0 &&
         store_format_get_checksum(buf) == h;
    mem_free(buf);
    return ok;
}

/* Reads the arrays h names from src, from offset *at on, into w (dimensions
 * set), folding them into the checksum *sum.  0, or -1 with the reason in
 * why and *nomem set when memory ran out; arrays read so far stay in w. */
static int read_arrays(const store_source *src, uint64_t *at, const store_header *h,
                       attn_weights *w, uint64_t *sum, char *why, size_t why_len, int *nomem)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!(h->present & (1u << p)))
            continue;
        size_t n;
        store_format_array_bytes(w, p, &n); /* the header's size check has found it fits */
        void *a = weights_part_alloc(w, (weights_part)p);
        if (a == NULL) {
            *nomem = 1;
            return snprintf(why, why_len, "out of memory loading it"), -1;
        }
        if (src->read_at(src->ctx, a, n, *at) != 0)
            return snprintf(why, why_len, "read failed"), -1;
        *at += n;
        *sum = store_format_checksum(*sum, a, n);
    }
    return 0;
}

int store_io_load(const store_source *src, const char *name, store_loaded *out, char *why,
                  size_t why_len, int *nomem, int *newer)
{
    *nomem = 0;
    *newer = 0;
    memset(out, 0, sizeof *out);
    unsigned char head[STORE_FORMAT_HEAD_MAX];
    uint64_t size = src->size;
    size_t have = size < sizeof head ? (size_t)size : sizeof head;
    if (src->read_at(src->ctx, head, have, 0) != 0)
        have = 0;
    int rc = store_format_decode_header(head, have, size, name, &out->h, why, why_len);
    if (rc == STORE_FORMAT_NEWER) {
        *newer = whole_file_checks(src);
        store_format_newer_why(out->h.version, *newer, why, why_len);
        return -1;
    }
    if (rc != 0)
        return -1;
    out->w = out->h.dims;
    uint64_t sum = store_format_checksum(STORE_CHECKSUM_SEED, head, out->h.arrays_at);
    uint64_t at = out->h.arrays_at;
    unsigned char tail[STORE_CHECKSUM_BYTES];
    if (read_arrays(src, &at, &out->h, &out->w, &sum, why, why_len, nomem) != 0)
        goto fail;
    if (src->read_at(src->ctx, tail, sizeof tail, at) != 0 ||
        store_format_get_checksum(tail) != sum) {
        snprintf(why, why_len, "checksum mismatch (damaged file)");
        goto fail;
    }
    return 0;
fail:
    weights_free(&out->w);
    memset(out, 0, sizeof *out);
    return -1;
}

uint64_t store_io_generation(const char *path)
{
    unsigned char head[STORE_FORMAT_HEAD_MAX];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n;
    do
        n = read(fd, head, sizeof head);
    while (n < 0 && errno == EINTR);
    close(fd);
    return n > 0 ? store_format_generation(head, (size_t)n) : 0;
}

int store_io_unlink(const char *path)
{
    if (io_step_fails() != 0 || (unlink(path) != 0 && errno != ENOENT))
        return -1;
    return 0;
}

int store_io_fsync_dir(const char *dir)
{
    if (io_step_fails() != 0)
        return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int store_io_make_dirs(const char *dir)
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
void store_io_host_label(char *out, size_t len)
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
    if (strncmp(file, STORE_TMP_PREFIX, strlen(STORE_TMP_PREFIX)) != 0)
        return -1;
    const char *h = file + strlen(STORE_TMP_PREFIX), *dot = strchr(h, '.');
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
void store_io_clean_temporaries(weight_store *store)
{
    DIR *d = opendir(store->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d)) != NULL) {
        const char *file = e->d_name;
        size_t n = strlen(file);
        if (strncmp(file, STORE_TMP_PREFIX, strlen(STORE_TMP_PREFIX)) != 0 ||
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

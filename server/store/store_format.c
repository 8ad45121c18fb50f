/*
 * store_format.c - the weight-set file format: encoding and decoding one
 * stored set.
 *
 * File format (version 3), all integers and numbers little-endian:
 *
 *   offset  size  field
 *        0     8  magic "ATTNWSET"
 *        8     4  format version (3 for a float32 set, 2 for a float64 one;
 *                 version 1 files, without the generation, are still read)
 *       12     4  flags (bit 0: uploaded with weights_layout out_in)
 *       16     8  heads (0: none)
 *       24    40  d_in, d_ctx, dk, dv, d_out (5 x u64)
 *       64     4  which arrays follow (bits: wq wk wv wo bq bk bv bo)
 *       68     4  name length n (1..WEIGHTS_NAME_MAX = 64)
 *       72     8  stored_at, Unix time in milliseconds (i64)
 *       80     8  generation (u64; version 2 and 3: version 1 headers end at
 *                 80 and their generation is stored_at x 1000)
 *       88     4  element type (version 3 only: 0 float64, 1 float32)
 *       92     4  zero (version 3 only; version 2 headers end at 88)
 *    88/96     n  the name, then zero padding to a multiple of 8
 *        .     .  the arrays present, in the order of the bits, as IEEE-754
 *                 numbers of the element type (doubles in versions 1 and 2,
 *                 8 or 4 bytes each in version 3): wq is d_in x dk, wk and wv
 *                 d_ctx x dk and x dv, wo dv x d_out, biases their widths,
 *                 row-major in_out form
 *        .     8  checksum of every byte before it (see checksum_update)
 *
 * A float64 set is written as version 2, byte for byte what earlier servers
 * wrote, so that a server of an earlier release sharing the directory still
 * reads every set it can serve; only a float32 set needs version 3.  A file
 * of a later version than this server knows is reported as such (newer) and
 * never quarantined: it is another server's, not damage.
 *
 * The loader accepts a file only if its size is exactly what the header
 * implies and the checksum matches, so a truncated or altered file is never
 * served.  Nothing here knows where the file lives or how it is made
 * durable (store_io.c).
 */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the weight-set file format is written natively and assumes a little-endian machine"
#endif

#define MAGIC "ATTNWSET"
#define VERSION_F64 2u      /* written for float64 sets */
#define VERSION_LATEST 3u   /* written for float32 sets; the latest read */
#define HEADER_V1 80
#define HEADER_V2 88
#define HEADER_V3 96

/* Bytes of array p of w (whether present or not, in w's element type) into
 * *bytes; -1 when that overflows. */
static int array_bytes(const attn_weights *w, int p, size_t *bytes)
{
    return mem_mul(weights_rows(w, (weights_part)p), weights_cols(w, (weights_part)p),
                   weights_elem_size(w), bytes);
}

/* The version and the header length a set of w's element type is written with. */
static uint32_t version_for(const attn_weights *w)
{
    return weights_is_f32(w) ? VERSION_LATEST : VERSION_F64;
}

static size_t header_len_of(uint32_t version)
{
    return version == 1 ? HEADER_V1 : version == 2 ? HEADER_V2 : HEADER_V3;
}


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
        if (weights_has(w, (weights_part)p))
            bits |= 1u << p;
    return bits;
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

/* The checksum of runs[0..n), in their order: store_io_write_runs's meanwhile. */
typedef struct run_checksum {
    const store_run *runs;
    size_t n;
    uint64_t h;
} run_checksum;

static void checksum_runs(void *ctx)
{
    run_checksum *c = ctx;
    c->h = CHECKSUM_SEED;
    for (size_t r = 0; r < c->n; r++)
        c->h = checksum_update(c->h, c->runs[r].data, c->runs[r].len);
}

/* Writes set to the open file fd in the format above. */
int store_format_write(int fd, const weight_set *set)
{
    unsigned char header[HEADER_V3 + WEIGHTS_NAME_MAX + 8];
    size_t name_len = strlen(set->name), padded = (name_len + 7) & ~(size_t)7;
    uint32_t version = version_for(&set->w);
    size_t len = header_len_of(version);
    memset(header, 0, sizeof header);
    memcpy(header, MAGIC, 8);
    put_u32(header + 8, version);
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
    if (version >= 3)
        put_u32(header + 88, (uint32_t)set->w.elem);
    memcpy(header + len, set->name, name_len);
    /* Every run is written at its place while the checksum of the file's bytes, in their
     * order, is computed beside the writer (checksum_runs); the checksum goes last. */
    store_run runs[WEIGHTS_COUNT + 1];
    size_t count = 0;
    uint64_t at = len + padded;
    runs[count++] = (store_run){header, len + padded, 0};
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const void *a = weights_data(&set->w, (weights_part)p);
        size_t n;
        if (a == NULL)
            continue;
        if (array_bytes(&set->w, p, &n) != 0) {
            errno = EOVERFLOW;
            return -1;
        }
        runs[count++] = (store_run){a, n, at};
        at += n;
    }
    run_checksum sum = {runs, count, 0};
    if (store_io_write_runs(fd, runs, count, checksum_runs, &sum) != 0)
        return -1;
    unsigned char tail[8];
    put_u64(tail, sum.h);
    store_run last = {tail, 8, at};
    return store_io_write_runs(fd, &last, 1, NULL, NULL);
}

/* A header as read from a file: its bytes (with room for the name that
 * follows) and what they say, checked against each other. */
typedef struct file_header {
    unsigned char bytes[HEADER_V3 + WEIGHTS_NAME_MAX];
    uint32_t version, flags, present, name_len;
    size_t len;             /* of the header: HEADER_V1, _V2 or _V3 */
    size_t padded;          /* of the name, to a multiple of 8 */
    size_t expected;        /* bytes of the whole file */
    uint64_t heads;
} file_header;

/* 1 when the last 8 bytes of the file open on fd (of size file_size) are the checksum of
 * all the bytes before them, as in every version of the format: a file of a later version
 * is then whole, and another server's rather than damage.  0 otherwise. */
static int whole_file_checks(int fd, int64_t file_size)
{
    enum { CHUNK = 1 << 20 };   /* a multiple of 8, so chunks checksum as one run */
    if (file_size < HEADER_V1 + 8 || lseek(fd, 0, SEEK_SET) != 0)
        return 0;
    unsigned char *buf = mem_malloc(CHUNK);
    if (buf == NULL)
        return 0;
    uint64_t h = CHECKSUM_SEED;
    size_t left = (size_t)file_size - 8;
    int ok = 1;
    while (ok && left > 0) {
        size_t n = left < CHUNK ? left : CHUNK;
        ok = read_all(fd, buf, n) == 0;
        h = checksum_update(h, buf, n);
        left -= n;
    }
    ok = ok && read_all(fd, buf, 8) == 0 && get_u64(buf) == h;
    mem_free(buf);
    return ok;
}

/* Reads the header of the file open on fd (of size file_size) into *fh, and
 * the dimensions and element type it gives into *w.  Returns 0, or -1 with
 * the reason in why when a field is out of range or the size does not match
 * (*newer set when the file is of a later version than this server reads). */
static int header_read(int fd, int64_t file_size, file_header *fh, attn_weights *w, char *why,
                       size_t why_len, int *newer)
{
    unsigned char *h = fh->bytes;
    if (read_all(fd, h, HEADER_V1) != 0)
        return snprintf(why, why_len, "shorter than a header (truncated)"), -1;
    fh->version = get_u32(h + 8);
    if (memcmp(h, MAGIC, 8) != 0 || fh->version == 0)
        return snprintf(why, why_len, "not a weight-set file"), -1;
    if (fh->version > VERSION_LATEST) {
        *newer = whole_file_checks(fd, file_size);
        return snprintf(why, why_len, *newer ? "format version %u, written by a newer server "
                        "(this one reads 1 to %u)" : "format version %u, unknown, and the "
                        "checksum does not match (damaged; this server reads 1 to %u)",
                        fh->version, VERSION_LATEST), -1;
    }
    fh->len = header_len_of(fh->version);
    if (fh->len > HEADER_V1 && read_all(fd, h + HEADER_V1, fh->len - HEADER_V1) != 0)
        return snprintf(why, why_len, "shorter than a header (truncated)"), -1;
    uint32_t elem = fh->version >= 3 ? get_u32(h + 88) : (uint32_t)WEIGHTS_F64;
    if (elem > WEIGHTS_F32 || (fh->version >= 3 && get_u32(h + 92) != 0))
        return snprintf(why, why_len, "header fields out of range"), -1;
    w->elem = (weights_elem)elem;
    fh->flags = get_u32(h + 12);
    fh->present = get_u32(h + 64);
    fh->name_len = get_u32(h + 68);
    fh->heads = get_u64(h + 16);
    fh->padded = ((size_t)fh->name_len + 7) & ~(size_t)7;
    uint32_t present = fh->present;
    if (fh->flags > 1 || (present & 7u) != 7u || present > 0xFFu || fh->name_len < 1 ||
        fh->name_len > WEIGHTS_NAME_MAX || (!(present & 8u) && (present & 128u)))
        return snprintf(why, why_len, "header fields out of range"), -1;
    w->d_in = get_u64(h + 24);
    w->d_ctx = get_u64(h + 32);
    w->dk = get_u64(h + 40);
    w->dv = get_u64(h + 48);
    w->d_out = get_u64(h + 56);
    fh->expected = file_size_for(w, present, fh->name_len, fh->len);
    if (fh->expected == 0 || w->d_in == 0 || w->d_ctx == 0 || w->dk == 0 || w->dv == 0 ||
        w->d_out == 0 || (!(present & 8u) && w->d_out != w->dv) ||
        (fh->heads != 0 && weights_check_heads((size_t)fh->heads, w->dk, w->dv, NULL) != 0))
        return snprintf(why, why_len, "inconsistent dimensions in the header"), -1;
    if ((uint64_t)file_size != fh->expected)
        return snprintf(why, why_len, "%lld bytes where the header implies %zu (truncated or "
                        "damaged)", (long long)file_size, fh->expected), -1;
    return 0;
}

/* Reads the arrays that present names into w (dimensions set), folding
 * them into the checksum *h.  Returns 0, or -1 with the reason in why and
 * *nomem set when memory ran out; arrays read so far stay in w. */
static int arrays_read(int fd, unsigned present, attn_weights *w, uint64_t *h, char *why,
                       size_t why_len, int *nomem)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!(present & (1u << p)))
            continue;
        size_t n;
        array_bytes(w, p, &n); /* file_size_for has checked that it fits */
        void *a = weights_part_alloc(w, (weights_part)p);
        if (a == NULL) {
            *nomem = 1;
            return snprintf(why, why_len, "out of memory loading it"), -1;
        }
        if (read_all(fd, a, n) != 0)
            return snprintf(why, why_len, "read failed"), -1;
        *h = checksum_update(*h, a, n);
    }
    return 0;
}

/* Loads the set file open on fd (store_internal.h). */
weight_set *store_format_load(int fd, const char *name, char *why, size_t why_len, int *nomem,
                              int *newer)
{
    *nomem = 0;
    *newer = 0;
    struct stat st;
    file_header fh;
    attn_weights w;
    memset(&w, 0, sizeof w);
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "shorter than a header (truncated)");
        return NULL;
    }
    if (header_read(fd, (int64_t)st.st_size, &fh, &w, why, why_len, newer) != 0)
        goto fail;
    if (read_all(fd, fh.bytes + fh.len, fh.padded) != 0 ||
        memcmp(fh.bytes + fh.len, name, fh.name_len) != 0 || strlen(name) != fh.name_len) {
        snprintf(why, why_len, "the name inside the file does not match its file name");
        goto fail;
    }
    uint64_t h = checksum_update(CHECKSUM_SEED, fh.bytes, fh.len + fh.padded);
    if (arrays_read(fd, fh.present, &w, &h, why, why_len, nomem) != 0)
        goto fail;
    unsigned char tail[8];
    if (read_all(fd, tail, 8) != 0 || get_u64(tail) != h) {
        snprintf(why, why_len, "checksum mismatch (damaged file)");
        goto fail;
    }
    weight_set *set = weightset_new(name, &w, (size_t)fh.heads, (int)(fh.flags & 1u));
    if (set == NULL) {
        snprintf(why, why_len, "out of memory loading it");
        *nomem = 1;
        return NULL; /* weightset_new freed the arrays */
    }
    set->stored_at_ms = (int64_t)get_u64(fh.bytes + 72);
    set->generation = fh.version == 1 ? (uint64_t)set->stored_at_ms * 1000
                                      : get_u64(fh.bytes + 80);
    set->size_bytes = fh.expected;
    store_sig_of(&st, store_set_sig(set));
    return set;
fail:
    weights_free(&w);
    return NULL;
}

/* The generation in the header of the file at path (store_internal.h). */
uint64_t store_format_generation(const char *path)
{
    unsigned char header[HEADER_V2];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    uint64_t gen = 0;
    /* Every version after the first keeps the generation at 80; a later
     * version's is taken too, so that a put here still goes above it. */
    if (read_all(fd, header, HEADER_V1) == 0 && memcmp(header, MAGIC, 8) == 0) {
        if (get_u32(header + 8) == 1)
            gen = get_u64(header + 72) * 1000;
        else if (get_u32(header + 8) >= 2 &&
                 read_all(fd, header + HEADER_V1, HEADER_V2 - HEADER_V1) == 0)
            gen = get_u64(header + 80);
    }
    close(fd);
    return gen;
}

size_t store_format_size(const weight_set *set)
{
    return file_size_for(&set->w, present_bits(&set->w), strlen(set->name),
                         header_len_of(version_for(&set->w)));
}

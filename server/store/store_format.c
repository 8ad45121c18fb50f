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
 * A file is accepted only if its size is exactly what the header implies
 * and the checksum matches, so a truncated or altered file is never served.
 *
 * This file is the format alone, bytes in and bytes out: it encodes a set
 * into the runs of bytes a file holds, decodes and checks a header, and
 * computes the checksum.  It opens, reads and writes nothing (store_io.c
 * does, and makes a write durable) and builds no set (store_table.c does,
 * from what store_io.c loaded).
 */
#include "store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

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

_Static_assert(HEADER_V3 + WEIGHTS_NAME_MAX == STORE_FORMAT_HEAD_MAX,
               "STORE_FORMAT_HEAD_MAX holds the longest header and name");

int store_format_array_bytes(const attn_weights *w, int p, size_t *bytes)
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
uint64_t store_format_checksum(uint64_t h, const void *data, size_t n)
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

/* Size of the file for a set with these dimensions and arrays, or 0 when it
 * overflows. */
static size_t file_size_for(const attn_weights *w, unsigned present, size_t name_len,
                            size_t header_len)
{
    size_t size = header_len + ((name_len + 7) & ~(size_t)7) + 8, n;
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (!(present & (1u << p)))
            continue;
        if (store_format_array_bytes(w, p, &n) != 0 || __builtin_add_overflow(size, n, &size))
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

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

int store_format_encode(const weight_set *set, store_encoding *enc)
{
    unsigned char *header = enc->head;
    size_t name_len = strlen(set->name), padded = (name_len + 7) & ~(size_t)7;
    uint32_t version = version_for(&set->w);
    size_t len = header_len_of(version);
    memset(header, 0, sizeof enc->head);
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
    uint64_t at = len + padded;
    enc->count = 0;
    enc->runs[enc->count++] = (store_run){header, len + padded, 0};
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const void *a = weights_data(&set->w, (weights_part)p);
        size_t n;
        if (a == NULL)
            continue;
        if (store_format_array_bytes(&set->w, p, &n) != 0) {
            errno = EOVERFLOW;
            return -1;
        }
        enc->runs[enc->count++] = (store_run){a, n, at};
        at += n;
    }
    enc->checksum_at = at;
    return 0;
}

uint64_t store_format_checksum_runs(const store_run *runs, size_t n)
{
    uint64_t h = STORE_CHECKSUM_SEED;
    for (size_t r = 0; r < n; r++)
        h = store_format_checksum(h, runs[r].data, runs[r].len);
    return h;
}

void store_format_put_checksum(unsigned char tail[STORE_CHECKSUM_BYTES], uint64_t h)
{
    put_u64(tail, h);
}

uint64_t store_format_get_checksum(const unsigned char tail[STORE_CHECKSUM_BYTES])
{
    return get_u64(tail);
}

int store_format_decode_header(const unsigned char *bytes, size_t have, uint64_t file_size,
                               const char *name, store_header *h, char *why, size_t why_len)
{
    memset(h, 0, sizeof *h);
    if (have < HEADER_V1)
        return snprintf(why, why_len, "shorter than a header (truncated)"), -1;
    h->version = get_u32(bytes + 8);
    if (memcmp(bytes, MAGIC, 8) != 0 || h->version == 0)
        return snprintf(why, why_len, "not a weight-set file"), -1;
    if (h->version > VERSION_LATEST)
        return STORE_FORMAT_NEWER;
    h->len = header_len_of(h->version);
    if (have < h->len)
        return snprintf(why, why_len, "shorter than a header (truncated)"), -1;
    attn_weights *w = &h->dims;
    uint32_t elem = h->version >= 3 ? get_u32(bytes + 88) : (uint32_t)WEIGHTS_F64;
    if (elem > WEIGHTS_F32 || (h->version >= 3 && get_u32(bytes + 92) != 0))
        return snprintf(why, why_len, "header fields out of range"), -1;
    w->elem = (weights_elem)elem;
    uint32_t flags = get_u32(bytes + 12);
    uint32_t present = get_u32(bytes + 64);
    uint32_t name_len = get_u32(bytes + 68);
    uint64_t heads = get_u64(bytes + 16);
    if (flags > 1 || (present & 7u) != 7u || present > 0xFFu || name_len < 1 ||
        name_len > WEIGHTS_NAME_MAX || (!(present & 8u) && (present & 128u)))
        return snprintf(why, why_len, "header fields out of range"), -1;
    w->d_in = get_u64(bytes + 24);
    w->d_ctx = get_u64(bytes + 32);
    w->dk = get_u64(bytes + 40);
    w->dv = get_u64(bytes + 48);
    w->d_out = get_u64(bytes + 56);
    h->present = present;
    h->out_in = (int)(flags & 1u);
    h->heads = (size_t)heads;
    h->arrays_at = h->len + (((size_t)name_len + 7) & ~(size_t)7);
    h->file_size = file_size_for(w, present, name_len, h->len);
    if (h->file_size == 0 || w->d_in == 0 || w->d_ctx == 0 || w->dk == 0 || w->dv == 0 ||
        w->d_out == 0 || (!(present & 8u) && w->d_out != w->dv) ||
        (heads != 0 && weights_check_heads((size_t)heads, w->dk, w->dv, NULL) != 0))
        return snprintf(why, why_len, "inconsistent dimensions in the header"), -1;
    if (file_size != h->file_size)
        return snprintf(why, why_len, "%llu bytes where the header implies %zu (truncated or "
                        "damaged)", (unsigned long long)file_size, h->file_size), -1;
    if (have < h->arrays_at || memcmp(bytes + h->len, name, name_len) != 0 ||
        strlen(name) != name_len)
        return snprintf(why, why_len, "the name inside the file does not match its file name"),
               -1;
    h->stored_at_ms = (int64_t)get_u64(bytes + 72);
    h->generation = h->version == 1 ? (uint64_t)h->stored_at_ms * 1000 : get_u64(bytes + 80);
    return 0;
}

void store_format_newer_why(uint32_t version, int whole, char *why, size_t why_len)
{
    snprintf(why, why_len, whole ? "format version %u, written by a newer server (this one "
             "reads 1 to %u)" : "format version %u, unknown, and the checksum does not match "
             "(damaged; this server reads 1 to %u)", version, VERSION_LATEST);
}

uint64_t store_format_generation(const unsigned char *bytes, size_t have)
{
    /* Every version after the first keeps the generation at 80; a later
     * version's is taken too, so that a put here still goes above it. */
    if (have < HEADER_V1 || memcmp(bytes, MAGIC, 8) != 0)
        return 0;
    uint32_t version = get_u32(bytes + 8);
    if (version == 1)
        return get_u64(bytes + 72) * 1000;
    if (version >= 2 && have >= HEADER_V2)
        return get_u64(bytes + 80);
    return 0;
}

size_t store_format_size(const weight_set *set)
{
    return file_size_for(&set->w, present_bits(&set->w), strlen(set->name),
                         header_len_of(version_for(&set->w)));
}

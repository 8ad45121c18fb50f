/*
 * compress.c - gzip and deflate with zlib (see compress.h).
 *
 * zlib allocates through mem.h, so failure injection reaches it.  Answers
 * are compressed at level 1: the numbers of a JSON answer shrink almost as
 * well as at the default level, in a fraction of the time, and the time is
 * on the request's latency.  An answer from COMPRESS_SPLIT_FROM bytes is
 * deflated in two halves at once (deflate_split), as pigz does: the first
 * half ends in a sync flush, so that the second half's independent stream
 * follows it as one deflate stream, and the two halves' check values are
 * combined (crc32_combine, adler32_combine).  It shrinks a little less (the
 * second half does not see the first's last 32 KB) and takes about half the
 * time on two cores.
 */
#include "compress.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "core/mem.h"

#define COMPRESS_CHUNK 16384

struct compress_inflater {
    z_stream z;
    compress_kind kind;
    int started;        /* inflateInit2 done (deferred until the first bytes) */
    int done;           /* Z_STREAM_END seen */
};

static voidpf z_alloc(voidpf opaque, uInt items, uInt size)
{
    (void)opaque;
    size_t n;
    return mem_mul(items, size, 1, &n) != 0 ? Z_NULL : mem_malloc(n);
}

static void z_free(voidpf opaque, voidpf p)
{
    (void)opaque;
    mem_free(p);
}

/* The next token of a comma-separated header list: its name in name
 * (lower-case) and its q value (1 when absent).  Returns the rest, or NULL
 * at the end. */
static const char *next_coding(const char *s, char *name, size_t cap, double *q)
{
    while (*s == ' ' || *s == '\t' || *s == ',')
        s++;
    if (*s == '\0')
        return NULL;
    size_t n = 0;
    while (*s && *s != ',' && *s != ';' && *s != ' ' && *s != '\t') {
        if (n + 1 < cap)
            name[n++] = (char)((*s >= 'A' && *s <= 'Z') ? *s + 32 : *s);
        s++;
    }
    name[n] = '\0';
    *q = 1;
    while (*s && *s != ',') {
        if ((s[0] == 'q' || s[0] == 'Q') && s[1] == '=')
            *q = strtod(s + 2, NULL);
        s++;
    }
    return s;
}

int compress_encoding_parse(const char *value, compress_kind *kind)
{
    *kind = COMPRESS_NONE;
    if (value == NULL)
        return 0;
    while (*value == ' ' || *value == '\t')
        value++;
    if (*value == '\0' || !strcasecmp(value, "identity"))
        return 0;
    if (!strcasecmp(value, "gzip") || !strcasecmp(value, "x-gzip"))
        *kind = COMPRESS_GZIP;
    else if (!strcasecmp(value, "deflate"))
        *kind = COMPRESS_DEFLATE;
    else
        return -1;
    return 0;
}

/* The weight a parsed Accept-Encoding gives one coding: its own entry's q
 * (the highest, should it be listed twice), else the q of "*", else -1 (not
 * named at all). */
typedef struct accept_weights {
    double gzip, deflate, identity, any;
} accept_weights;

compress_kind compress_accepted(const char *accept_encoding)
{
    accept_weights w = {-1, -1, -1, -1};
    char name[32];
    double q;
    for (const char *s = accept_encoding; s != NULL && (s = next_coding(s, name, sizeof name, &q));) {
        double *slot = !strcmp(name, "gzip") || !strcmp(name, "x-gzip") ? &w.gzip
                       : !strcmp(name, "deflate")                      ? &w.deflate
                       : !strcmp(name, "identity")                     ? &w.identity
                       : !strcmp(name, "*")                            ? &w.any
                                                                       : NULL;
        if (slot != NULL && q > *slot)
            *slot = q;
    }
    /* RFC 9110 12.5.3: a coding's own entry decides over "*", and q=0 means
     * "not acceptable" whatever "*" says.  Of the acceptable codings the one
     * with the highest q is used, gzip on a tie; identity wins only when the
     * client names it (or "*") with a higher q than either. */
    double gzip = w.gzip >= 0 ? w.gzip : w.any;
    double deflate = w.deflate >= 0 ? w.deflate : w.any;
    double identity = w.identity >= 0 ? w.identity : w.any;
    double best = gzip > deflate ? gzip : deflate;
    if (best <= 0 || identity > best)
        return COMPRESS_NONE;
    return gzip >= deflate ? COMPRESS_GZIP : COMPRESS_DEFLATE;
}

const char *compress_name(compress_kind kind)
{
    return kind == COMPRESS_GZIP ? "gzip" : kind == COMPRESS_DEFLATE ? "deflate" : NULL;
}

compress_inflater *compress_inflater_new(compress_kind kind)
{
    compress_inflater *inf = mem_calloc(1, sizeof *inf);
    if (inf != NULL)
        inf->kind = kind;
    return inf;
}

/* Starts zlib once the first bytes are known: "deflate" is the zlib format,
 * but a stream without its header (raw deflate) is taken as well. */
static int inflater_start(compress_inflater *inf, const unsigned char *in, size_t n)
{
    int bits = 15 + 16;
    if (inf->kind == COMPRESS_DEFLATE) {
        int zlib_header = n < 2 || ((in[0] & 0x0f) == 8 && (in[0] * 256 + in[1]) % 31 == 0);
        bits = zlib_header ? 15 : -15;
    }
    inf->z.zalloc = z_alloc;
    inf->z.zfree = z_free;
    int rc = inflateInit2(&inf->z, bits);
    if (rc != Z_OK)
        return rc == Z_MEM_ERROR ? COMPRESS_NOMEM : COMPRESS_CORRUPT;
    inf->started = 1;
    return 0;
}

int compress_inflate(compress_inflater *inf, const void *in, size_t n, compress_sink sink,
                     void *ctx)
{
    if (n == 0)
        return 0;
    if (inf->done) {
        /* More bytes after a gzip member are the next member (RFC 1952 2.2: a
         * file is a series of members, as `cat a.gz b.gz` makes); after a
         * zlib stream they are garbage. */
        if (inf->kind != COMPRESS_GZIP || inflateReset(&inf->z) != Z_OK)
            return COMPRESS_CORRUPT;
        inf->done = 0;
    }
    int rc = inf->started ? 0 : inflater_start(inf, in, n);
    if (rc != 0)
        return rc;
    char out[COMPRESS_CHUNK];
    inf->z.next_in = (Bytef *)in;
    while (n > 0 || inf->z.avail_in > 0) {
        /* avail_in is 32 bits: feed larger chunks in parts. */
        if (inf->z.avail_in == 0) {
            uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
            inf->z.avail_in = part;
            n -= part;
        }
        inf->z.next_out = (Bytef *)out;
        inf->z.avail_out = sizeof out;
        int z = inflate(&inf->z, Z_NO_FLUSH);
        size_t produced = sizeof out - inf->z.avail_out;
        if (produced > 0 && (rc = sink(ctx, out, produced)) != 0)
            return rc;
        if (z == Z_STREAM_END) {
            inf->done = 1;
            if (inf->z.avail_in == 0 && n == 0)
                return 0;
            if (inf->kind != COMPRESS_GZIP || inflateReset(&inf->z) != Z_OK)
                return COMPRESS_CORRUPT; /* bytes after the end of the stream */
            inf->done = 0; /* the next gzip member */
            continue;
        }
        if (z == Z_MEM_ERROR)
            return COMPRESS_NOMEM;
        if (z != Z_OK && z != Z_BUF_ERROR)
            return COMPRESS_CORRUPT;
        if (z == Z_BUF_ERROR && produced == 0 && inf->z.avail_in == 0 && n == 0)
            break;
    }
    return 0;
}

int compress_inflater_done(const compress_inflater *inf)
{
    return inf != NULL && inf->done;
}

void compress_inflater_free(compress_inflater *inf)
{
    if (inf == NULL)
        return;
    if (inf->started)
        inflateEnd(&inf->z);
    mem_free(inf);
}

/* Deflates in[0..n) into out[0..cap) in one call; returns the size, or 0. */
static size_t deflate_once(compress_kind kind, const void *in, size_t n, char *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    z.zalloc = z_alloc;
    z.zfree = z_free;
    if (deflateInit2(&z, 1, Z_DEFLATED, kind == COMPRESS_GZIP ? 15 + 16 : 15, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK)
        return 0;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = (Bytef *)out;
    z.avail_out = (uInt)cap;
    size_t len = deflate(&z, Z_FINISH) == Z_STREAM_END ? cap - z.avail_out : 0;
    deflateEnd(&z);
    return len;
}

/* One half of deflate_split: a raw deflate stream of in[0..n) into out[0..cap), the
 * first half's ending in a sync flush (byte-aligned, not final) and the last half's in
 * the final block, with the check value of its bytes (crc32 for gzip, adler32 for the
 * zlib format); len 0 when it failed. */
typedef struct deflate_half {
    compress_kind kind;
    const unsigned char *in;
    size_t n;
    unsigned char *out;
    size_t cap;
    int last;
    size_t len;
    uLong check;
} deflate_half;

static void *deflate_half_run(void *arg)
{
    deflate_half *h = arg;
    h->len = 0;
    h->check = h->kind == COMPRESS_GZIP ? crc32(0L, h->in, (uInt)h->n)
                                        : adler32(1L, h->in, (uInt)h->n);
    z_stream z;
    memset(&z, 0, sizeof z);
    z.zalloc = z_alloc;
    z.zfree = z_free;
    if (deflateInit2(&z, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    z.next_in = (Bytef *)h->in;
    z.avail_in = (uInt)h->n;
    z.next_out = h->out;
    z.avail_out = (uInt)h->cap;
    int rc = deflate(&z, h->last ? Z_FINISH : Z_SYNC_FLUSH);
    /* a sync flush is whole when it left room in the output */
    if (h->last ? rc == Z_STREAM_END : rc == Z_OK && z.avail_in == 0 && z.avail_out > 0)
        h->len = h->cap - z.avail_out;
    deflateEnd(&z);
    return NULL;
}

static void put_le32(unsigned char *p, uLong v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* in[0..n) deflated in two halves, the second on a thread of its own, framed as kind
 * (gzip: RFC 1952; deflate: the zlib format of RFC 1950).  Returns the buffer (the
 * caller's, mem_free) with *out_len its size, or NULL. */
static char *deflate_split(compress_kind kind, const void *in, size_t n, size_t *out_len)
{
    static const unsigned char gzip_head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 3};
    static const unsigned char zlib_head[2] = {0x78, 0x01}; /* 32K window, fastest */
    size_t head = kind == COMPRESS_GZIP ? sizeof gzip_head : sizeof zlib_head;
    size_t tail = kind == COMPRESS_GZIP ? 8 : 4, m = n / 2;
    /* compressBound holds a stream's wrapper too: room for the sync flush's 5 bytes */
    deflate_half a = {kind, in, m, NULL, compressBound((uLong)m) + 16, 0, 0, 0};
    deflate_half b = {kind, (const unsigned char *)in + m, n - m, NULL,
                      compressBound((uLong)(n - m)) + 16, 1, 0, 0};
    unsigned char *out = mem_malloc(head + a.cap + b.cap + tail);
    b.out = mem_malloc(b.cap);
    if (out == NULL || b.out == NULL) {
        mem_free(out);
        mem_free(b.out);
        return NULL;
    }
    a.out = out + head;
    pthread_t helper;
    int two = pthread_create(&helper, NULL, deflate_half_run, &b) == 0;
    deflate_half_run(&a);
    if (two)
        pthread_join(helper, NULL);
    else
        deflate_half_run(&b);
    if (a.len == 0 || b.len == 0) {
        mem_free(out);
        mem_free(b.out);
        return NULL;
    }
    memcpy(out, kind == COMPRESS_GZIP ? gzip_head : zlib_head, head);
    memcpy(out + head + a.len, b.out, b.len);
    mem_free(b.out);
    unsigned char *end = out + head + a.len + b.len;
    if (kind == COMPRESS_GZIP) {
        put_le32(end, crc32_combine(a.check, b.check, (z_off_t)b.n));
        put_le32(end + 4, (uLong)(n & 0xFFFFFFFFu));
    } else {
        uLong adler = adler32_combine(a.check, b.check, (z_off_t)b.n);
        for (int i = 0; i < 4; i++)
            end[i] = (unsigned char)(adler >> (24 - 8 * i)); /* big-endian */
    }
    *out_len = head + a.len + b.len + tail;
    return (char *)out;
}

/* 1 when the first COMPRESS_SAMPLE_BYTES of in shrink by a quarter or more. */
static int worth_compressing(compress_kind kind, const void *in)
{
    size_t cap = compressBound(COMPRESS_SAMPLE_BYTES) + 32;   /* + the gzip wrapper */
    char *out = mem_malloc(cap);
    if (out == NULL)
        return 0;
    size_t len = deflate_once(kind, in, COMPRESS_SAMPLE_BYTES, out, cap);
    mem_free(out);
    return len > 0 && len <= COMPRESS_SAMPLE_BYTES / 4 * 3;
}

char *compress_deflate(compress_kind kind, const void *in, size_t n, size_t *out_len)
{
    if (n > (1u << 30) || (n > COMPRESS_SAMPLE_BYTES && !worth_compressing(kind, in)))
        return NULL;
    if (n >= COMPRESS_SPLIT_FROM)
        return deflate_split(kind, in, n, out_len);
    size_t cap = compressBound((uLong)n) + 32;
    char *out = mem_malloc(cap);
    if (out == NULL)
        return NULL;
    *out_len = deflate_once(kind, in, n, out, cap);
    if (*out_len == 0) {
        mem_free(out);
        return NULL;
    }
    return out;
}

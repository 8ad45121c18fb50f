/*
 * compress.c - gzip and deflate with zlib (see compress.h).
 *
 * zlib allocates through mem.h, so failure injection reaches it.  Answers
 * are compressed at level 1: the numbers of a JSON answer shrink almost as
 * well as at the default level, in a fraction of the time, and the time is
 * on the request's latency.
 */
#include "compress.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "mem.h"

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

compress_kind compress_accepted(const char *accept_encoding)
{
    int gzip = 0, deflate = 0;
    char name[32];
    double q;
    for (const char *s = accept_encoding; s != NULL && (s = next_coding(s, name, sizeof name, &q));) {
        if (!strcmp(name, "gzip") || !strcmp(name, "x-gzip") || !strcmp(name, "*"))
            gzip = q > 0;
        else if (!strcmp(name, "deflate"))
            deflate = q > 0;
    }
    return gzip ? COMPRESS_GZIP : deflate ? COMPRESS_DEFLATE : COMPRESS_NONE;
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
    if (inf->done)
        return COMPRESS_CORRUPT; /* bytes after the end of the stream */
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
            return inf->z.avail_in > 0 || n > 0 ? COMPRESS_CORRUPT : 0;
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

/*
 * compress.h - gzip and deflate bodies, in and out, with zlib.
 *
 * A request body sent with Content-Encoding: gzip or deflate is inflated as
 * it arrives, chunk by chunk, into a sink that applies the body limit to the
 * inflated bytes, so a small bomb is stopped at the limit with only one
 * chunk buffer in memory.  An answer is deflated whole when the client's
 * Accept-Encoding asks for it.  "deflate" is the zlib format (RFC 1950), as
 * HTTP defines it; a raw deflate stream, which some clients send instead, is
 * accepted too.
 *
 * This module knows nothing of HTTP libraries; it reads header values.
 */
#ifndef ATTN_COMPRESS_H
#define ATTN_COMPRESS_H

#include <stddef.h>

typedef enum { COMPRESS_NONE, COMPRESS_GZIP, COMPRESS_DEFLATE } compress_kind;

/* Answers smaller than this are sent as they are: compressing them saves
 * too little to pay for the time. */
#define COMPRESS_MIN_BYTES 1024

/* The coding a Content-Encoding value names: 0 with *kind set (NONE for a
 * NULL, empty or "identity" value), or -1 for a coding this server does not
 * read (the caller answers 415). */
int compress_encoding_parse(const char *value, compress_kind *kind);

/* The coding to answer with for an Accept-Encoding value (NULL: none), by
 * its q-values (RFC 9110 12.5.3): the acceptable coding of highest q, gzip on
 * a tie, NONE when neither is acceptable or identity is named with a higher
 * q.  A coding's own entry overrides "*"; q=0 makes it unacceptable. */
compress_kind compress_accepted(const char *accept_encoding);

/* The Content-Encoding name of kind ("gzip", "deflate"; NULL for NONE). */
const char *compress_name(compress_kind kind);

typedef struct compress_inflater compress_inflater;

/* Where inflated bytes go: returns 0 to go on, non-zero to stop (that
 * value is then returned by compress_inflate). */
typedef int (*compress_sink)(void *ctx, const char *data, size_t n);

/* A new inflater for kind (not NONE), which the caller frees with
 * compress_inflater_free; NULL when memory runs out. */
compress_inflater *compress_inflater_new(compress_kind kind);

/* Inflates in[0..n) into sink.  A gzip body may hold several members, one
 * after the other (RFC 1952), inflated in turn.  Returns 0, the sink's
 * non-zero value, COMPRESS_CORRUPT when the data is not of the coding (or a
 * deflate stream goes on after its end), or COMPRESS_NOMEM. */
#define COMPRESS_CORRUPT (-1001)
#define COMPRESS_NOMEM (-1002)
int compress_inflate(compress_inflater *inf, const void *in, size_t n, compress_sink sink,
                     void *ctx);

/* 1 when the stream has ended properly, at the end of a member for gzip (a
 * body cut short has not). */
int compress_inflater_done(const compress_inflater *inf);

/* Frees inf (NULL is fine). */
void compress_inflater_free(compress_inflater *inf);

/* Compresses in[0..n) with kind (gzip or deflate) into a new buffer, which
 * the caller frees with mem_free, with *out_len its size; NULL when memory
 * runs out, or when the data would barely shrink: a body past
 * COMPRESS_SAMPLE_BYTES whose first COMPRESS_SAMPLE_BYTES lose less than a
 * quarter is not compressed (raw float tensors of a binary v2 answer barely
 * shrink, and deflating them would add to the answer's latency for little;
 * JSON numbers lose half and more). */
#define COMPRESS_SAMPLE_BYTES 65536
/* From this many bytes, compress_deflate deflates two halves at once, the second on a
 * thread of its own (compress.c). */
#define COMPRESS_SPLIT_FROM ((size_t)1 << 20)
char *compress_deflate(compress_kind kind, const void *in, size_t n, size_t *out_len);

#endif

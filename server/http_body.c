/*
 * http_body.c - gathering a request's body under --max-body and the memory
 * budget.
 *
 * A body over --max-body is not stored: when Content-Length announces it,
 * the 413 is queued at once (before any body is read); otherwise the rest of
 * the body is read and dropped and the 413 follows.  A request with a body
 * reserves its estimated peak in the process budget (budget.h) as soon as
 * its headers arrive, before any body byte is stored: a reservation that
 * does not fit is answered 503 with Retry-After (413 when it could never
 * fit), and it is released when the request ends (http.c, on_completed).
 * A body sent with Content-Encoding gzip or deflate is inflated as it
 * arrives (compress.h); --max-body and the budget apply to the inflated
 * bytes, so a small bomb is dropped like a large body.
 */
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "http_private.h"
#include "mem.h"

/* Bytes a request parsed as JSON may need per byte of its body at its peak:
 * the body itself plus the JSON tree, which for short numbers ("0,") takes
 * up to about 24 bytes per byte of text (a boxed number and its slot). */
#define HTTP_BODY_MEMORY_FACTOR 25

/* Reserves `bytes` more in the budget for hr.  Returns 0, or -1 (nothing
 * more reserved). */
static int request_reserve(http_request *hr, size_t bytes)
{
    if (budget_reserve(bytes) != 0)
        return -1;
    hr->reserved += bytes;
    return 0;
}

/* Appends data to the request body within the limit; past it, drops the body
 * and marks the request too large.  A body whose length was not announced
 * reserves budget as it grows, and past the budget is dropped too.  Returns
 * -1 when out of memory. */
static int body_append(http_request *hr, size_t limit, const char *data, size_t n)
{
    if (hr->too_large || hr->no_memory)
        return 0;
    if (hr->len + n > limit) {
        hr->too_large = 1;
        mem_free(hr->body);
        hr->body = NULL;
        hr->len = hr->cap = 0;
        return 0;
    }
    size_t factor = hr->parses_body ? HTTP_BODY_MEMORY_FACTOR : 1;
    size_t covered = hr->reserved / factor;
    if (hr->len + n > covered) {
        /* Reserve in steps of at least 1 MiB of body so that the budget is
         * not asked for every chunk. */
        size_t want = hr->len + n - covered;
        if (want < ((size_t)1 << 20))
            want = (size_t)1 << 20;
        if (request_reserve(hr, want * factor) != 0) {
            hr->no_memory = 1;
            mem_free(hr->body);
            hr->body = NULL;
            hr->len = hr->cap = 0;
            return 0;
        }
    }
    if (hr->len + n > hr->cap) {
        size_t cap = hr->cap ? hr->cap : 4096;
        while (cap < hr->len + n)
            cap *= 2;
        if (cap > limit)
            cap = limit;
        char *body = mem_realloc(hr->body, cap);
        if (body == NULL)
            return -1;
        hr->body = body;
        hr->cap = cap;
    }
    memcpy(hr->body + hr->len, data, n);
    hr->len += n;
    return 0;
}

/* compress_sink for an inflated body: the limit (--max-body) applies to
 * the inflated bytes; past it, inflating stops (1). */
static int inflated_sink(void *ctx, const char *data, size_t n)
{
    http_request *hr = ctx;
    if (body_append(hr, hr->srv->cfg->max_body, data, n) != 0)
        return -1;
    return hr->too_large || hr->no_memory ? 1 : 0;
}

/* Takes n bytes of the body as they came over the wire: counts them, and
 * inflates them first when the body is compressed.  Returns -1 when out of
 * memory (the connection is dropped), else 0. */
int http_body_receive(http_request *hr, size_t limit, const char *data, size_t n)
{
    hr->bytes_in += n;
    if (hr->hc != NULL)
        atomic_fetch_add(&hr->hc->body_bytes, n);
    if (hr->inflater == NULL)
        return body_append(hr, limit, data, n);
    if (hr->too_large || hr->no_memory || hr->bad_encoding)
        return 0; /* the answer is known: the rest is not inflated */
    int rc = compress_inflate(hr->inflater, data, n, inflated_sink, hr);
    if (rc == COMPRESS_CORRUPT)
        hr->bad_encoding = 1;
    else if (rc == COMPRESS_NOMEM)
        hr->no_memory = 1;
    return rc == -1 ? -1 : 0;
}

/* Reads Content-Encoding: none or identity, gzip or deflate (an inflater
 * for hr), else the 415.  Returns 0, or ERR_UNSUPPORTED_MEDIA with err
 * filled, or -1 when out of memory. */
static int body_encoding(struct MHD_Connection *conn, http_request *hr, attn_error *err)
{
    compress_kind coding;
    if (compress_encoding_parse(
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Encoding"), &coding))
        return error_set(err, ERR_UNSUPPORTED_MEDIA, "unsupported_encoding", "Content-Encoding",
                         "The body's Content-Encoding is not one this server reads: send it "
                         "as it is (identity), gzip or deflate.");
    if (coding != COMPRESS_NONE && (hr->inflater = compress_inflater_new(coding)) == NULL)
        return -1;
    return 0;
}

/* Decides, from its headers, whether the body of hr may come: a
 * Content-Length over --max-body is answered 413 at once, and the body's
 * peak memory is reserved in the budget before any byte is stored (503 when
 * the budget is taken now, 413 when it could never hold it).  Returns
 * MHD_YES to go on, or what queueing the refusal returned. */
enum MHD_Result http_body_admit(http_server *srv, struct MHD_Connection *conn, http_request *hr,
                                const char *method)
{
    attn_error err;
    int rc = body_encoding(conn, hr, &err);
    if (rc == -1)
        return MHD_NO;
    if (rc != 0) {
        hr->too_large = 1; /* the body is dropped unread */
        return http_queue_error(srv, conn, hr, &err, NULL);
    }
    /* A safetensors upload is read in place, not parsed into a tree: its
     * arrays are reserved by the handler once their size is known. */
    const char *format = http_query_arg(conn, "format");
    hr->parses_body = (!strcmp(method, "POST") || !strcmp(method, "PUT")) &&
                      !(format != NULL && !strcmp(format, "safetensors"));
    const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length == NULL)
        return MHD_YES; /* no body, or a chunked one: reserved as it grows */
    char *end;
    unsigned long long n = strtoull(length, &end, 10);
    if (*end != '\0')
        return MHD_YES; /* libmicrohttpd answers a malformed length itself */
    if (n > srv->cfg->max_body) {
        hr->too_large = 1;
        error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body has %llu bytes, more than the server's limit of %zu bytes "
                  "(--max-body).", n, srv->cfg->max_body);
        return http_queue_error(srv, conn, hr, &err, NULL);
    }
    size_t need = (size_t)n * (hr->parses_body ? HTTP_BODY_MEMORY_FACTOR : 1);
    if (n > 0 && request_reserve(hr, need) != 0) {
        if (!budget_could_fit(need)) {
            hr->too_large = 1;
            error_set(&err, ERR_TOO_LARGE, "body_too_large", NULL,
                      "Handling a body of %llu bytes needs about %zu MiB, more than the "
                      "server's whole memory budget of %zu MiB (--max-memory).", n, need >> 20,
                      budget_limit() >> 20);
        } else {
            error_set(&err, ERR_UNAVAILABLE, "overloaded", NULL,
                      "The server's memory budget (--max-memory) is taken by other requests "
                      "now; retry shortly.");
        }
        return http_queue_error(srv, conn, hr, &err, NULL);
    }
    return MHD_YES;
}

/* 1 when the complete body of hr was dropped (over --max-body, or past the
 * budget as it grew) or is not of its Content-Encoding, with err filled;
 * else 0, the inflater (when there was one) freed: the body is complete. */
int http_body_refused(const http_server *srv, http_request *hr, attn_error *err)
{
    if (hr->too_large) {
        error_set(err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body is larger than the server's limit of %zu bytes (--max-body).",
                  srv->cfg->max_body);
        return 1;
    }
    if (hr->no_memory) {
        error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "The server's memory budget (--max-memory) could not hold this body now; "
                  "retry shortly.");
        return 1;
    }
    if (hr->inflater != NULL && hr->bytes_in > 0 &&
        (hr->bad_encoding || !compress_inflater_done(hr->inflater))) {
        error_set(err, ERR_BAD_REQUEST, "invalid_encoding", "Content-Encoding",
                  "The body is not %s data, or it was cut short.",
                  hr->bad_encoding ? "valid compressed" : "complete compressed");
        return 1;
    }
    compress_inflater_free(hr->inflater); /* its window is not needed any more */
    hr->inflater = NULL;
    return 0;
}

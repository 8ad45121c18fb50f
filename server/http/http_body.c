/*
 * http_body.c - gathering a request's body under --max-body and the memory
 * budget.
 *
 * A body over --max-body is not stored: when Content-Length announces it,
 * the 413 is queued at once (before any body is read); otherwise the rest of
 * the body is read and dropped and the 413 follows.
 *
 * Memory.  A request's body reserves its estimated peak (the body and the
 * tree parsed from it) in the process budget (budget.h) as it arrives, in
 * doubling steps, never for bytes that have not come: a client that
 * announces a large body and sends it slowly holds little.  The
 * reservation goes through the sender's share (budget_client.h), so one
 * address holds at most --max-memory-share of the budget however many
 * connections it opens.  A step that does not fit drops the body and the
 * request is answered 503 with Retry-After once it has been read (the
 * reaper closes it sooner if it crawls): libmicrohttpd 0.9.75 takes an
 * answer only before the body or after all of it (MHD_queue_response), and
 * closing at once would leave an honest client without one.  An announced
 * body that could never fit is 413 at its headers.  Everything is released
 * when the request ends (http.c, on_completed, through http_body_release).
 * A large announced body's buffer is made resident ahead of its bytes, as
 * far as its reservation reaches, on two threads (mem_populate): the page
 * faults of a large upload are then taken two at a time before its bytes
 * arrive, not one by one as each page is first written (docs/performance.md
 * has the figures).
 *
 * A v2 inference body with binary tensors (Inference-Header-Content-Length)
 * is placed in its buffer so that its binary section starts on a cache line
 * (body_place): its FP32 tensors are then read where they are, not copied
 * (v2_tensor_view_floats).  Its budget counts the tree only for its JSON
 * header, the part that is parsed (body_need).
 *
 * A body sent with Content-Encoding gzip or deflate is inflated as it
 * arrives (compress.h); --max-body, the budget and the share apply to the
 * inflated bytes, so a small bomb is dropped like a large body.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/budget.h"
#include "core/budget_client.h"
#include "http_private.h"
#include "core/mem.h"

/* The memory a body parsed as JSON may need at its peak, the body itself and the tree
 * jansson makes of it in the JSON arena (core/mem.c: blocks never freed piecemeal, each
 * allocation rounded to 16 bytes), is reserved as
 *
 *     25 bytes a byte + 208 bytes a '{' or '[' + 32 bytes a ','
 *
 * counting the brackets and commas outside strings as the body arrives (body_count_json).
 * Bytes alone cannot bound it: "{}," is 3 bytes of text and 240 bytes of tree.  What the
 * tree takes, measured with jansson 2.14 (allocations rounded as the arena rounds them):
 * a scalar node 32 bytes (a number; a string 48 and up, "null" none), so 16 a byte of
 * "0,"; an object 208 (its 80-byte struct and 8 hash buckets of 16), an array 112 (48
 * and a table of 8 slots); an element's slot 8 bytes, up to 32 with the tables that
 * doubling leaves in the arena (a count just past a power of two); a member's pair 64
 * bytes with its key, and its buckets.  Over bodies of many `{}`, `[]`, `0`, `""`,
 * `1.5e3`, `{"k":0}`, `{"":{}}`, `[0]`, members with short keys, duplicated keys and 2,000
 * nested arrays, at 65,537 to 1,000,000 values, the rule reserves 1.21 to 3.4 times the
 * body and its tree (bodies of `{}` 1.36 times: 80 bytes a byte of tree). */
#define HTTP_BODY_MEMORY_FACTOR 25
#define HTTP_BODY_CONTAINER_COST 208
#define HTTP_BODY_VALUE_COST 32
/* The same for the binary section of a v2 inference body, which is never parsed: the
 * bytes themselves, plus the arrays read from them, at most twice their size (FP32
 * numbers read as double, for x through a weight set). */
#define HTTP_BINARY_MEMORY_FACTOR 3

/* The smallest step, in body bytes, in which a body's memory is reserved
 * as it arrives (each step doubles what has arrived, up to the announced
 * length): few reservations per request, and never much more than twice
 * what has arrived. */
#define HTTP_BODY_STEP ((size_t)64 << 10)
/* The size past which an announced body's buffer takes its whole length (body_append). */
#define HTTP_BODY_WHOLE ((size_t)1 << 20)
/* The boundary a v2 body's binary section is placed on (body_place): a cache line, and
 * the widest vector the kernels load. */
#define HTTP_BODY_ALIGN ((size_t)64)

/* Reserves `bytes` more in the budget for hr, within its client's share.
 * Returns 0, or -1 (nothing more reserved). */
static int request_reserve(http_request *hr, size_t bytes)
{
    /* Looked up on the first reservation, so that requests without a body
     * never take the clients' lock. */
    if (!hr->client_known) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(hr->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        hr->client = budget_client_get(info != NULL ? info->client_addr : NULL);
        hr->client_known = 1;
    }
    if (budget_client_reserve(hr->client, bytes) != 0)
        return -1;
    hr->reserved += bytes;
    return 0;
}

/* 1 when `need` bytes could never be held for one client: more than the
 * whole budget or than one address's share of it (so 413, not 503). */
static int body_never_fits(size_t need)
{
    size_t share = budget_client_cap();
    return !budget_could_fit(need) || (share != 0 && need > share);
}

/* Fills err with the 413 for a body of hr of `bytes` that needs `need` bytes; when its
 * JSON's brackets and commas were counted, the message gives their count, which is then
 * most of the need (the body's length alone may well fit). */
static int body_never_fits_error(const http_request *hr, attn_error *err,
                                 unsigned long long bytes, size_t need)
{
    size_t share = budget_client_cap();
    char json[200] = "";
    if (hr->json_containers != 0 || hr->json_commas != 0)
        snprintf(json, sizeof json,
                 " (its JSON, %zu objects and arrays and %zu commas in the %zu bytes read, "
                 "takes %d bytes an object or array and %d a value in memory once parsed)",
                 hr->json_containers, hr->json_commas, hr->json_counted, HTTP_BODY_CONTAINER_COST,
                 HTTP_BODY_VALUE_COST);
    return error_set(err, ERR_TOO_LARGE, "body_too_large", NULL,
                     "Handling a body of %llu bytes needs %s %zu MiB%s, more than one "
                     "client may hold of the server's memory budget: %zu MiB (--max-memory, "
                     "--max-memory-share).", bytes, json[0] != '\0' ? "at least" : "about",
                     need >> 20, json,
                     (share != 0 ? share : budget_limit()) >> 20);
}

/* Counts the brackets and commas outside strings in the next n bytes of hr's body (those
 * of its JSON: a v2 body's binary section is not parsed), for body_need.  A string's end
 * is its first quote not escaped; its state is kept between calls, since a chunk may end
 * anywhere.  Outside strings the count takes no branch, so that the bytes of a large
 * matrix cost about a cycle each. */
static void body_count_json(http_request *hr, const char *data, size_t n)
{
    if (!hr->parses_body)
        return;
    if (hr->binary_at != 0)
        n = hr->len >= hr->binary_at ? 0 : n < hr->binary_at - hr->len ? n : hr->binary_at - hr->len;
    size_t containers = 0, commas = 0, i = 0;
    int in_string = hr->json_in_string, escaped = hr->json_escaped;
    while (i < n) {
        if (in_string) {
            char c = data[i++];
            if (escaped)
                escaped = 0;
            else if (c == '\\')
                escaped = 1;
            else if (c == '"')
                in_string = 0;
            continue;
        }
        const char *quote = memchr(data + i, '"', n - i);
        size_t end = quote != NULL ? (size_t)(quote - data) : n;
        for (; i < end; i++) {
            char c = data[i];
            containers += (c == '{') | (c == '[');
            commas += c == ',';
        }
        if (quote != NULL) {
            in_string = 1;
            i++;
        }
    }
    hr->json_in_string = in_string;
    hr->json_escaped = escaped;
    hr->json_containers += containers;
    hr->json_commas += commas;
    hr->json_counted += n;
}

/* What the brackets and commas counted so far add to a JSON body's need (see
 * HTTP_BODY_MEMORY_FACTOR); SIZE_MAX past a size_t. */
static size_t body_json_tokens_need(const http_request *hr)
{
    size_t containers, commas, sum;
    if (mem_mul(hr->json_containers, HTTP_BODY_CONTAINER_COST, 1, &containers) != 0 ||
        mem_mul(hr->json_commas, HTTP_BODY_VALUE_COST, 1, &commas) != 0 ||
        __builtin_add_overflow(containers, commas, &sum))
        return SIZE_MAX;
    return sum;
}

/* Budget bytes a body of hr of `len` bytes may need at its peak (body_need), and the
 * longest body that `reserved` bytes cover (body_covered, its inverse).  A body that is
 * not parsed needs itself; one parsed as JSON, HTTP_BODY_MEMORY_FACTOR a byte and the
 * cost of its brackets and commas counted so far; a v2 inference body with binary
 * tensors, that for its JSON header (the first hr->binary_at bytes: all the v2 path
 * parses) and HTTP_BINARY_MEMORY_FACTOR for the rest.  Both saturate rather than wrap. */
static size_t body_need(const http_request *hr, size_t len)
{
    if (!hr->parses_body)
        return len;
    size_t json = hr->binary_at != 0 && hr->binary_at < len ? hr->binary_at : len;
    size_t need, rest;
    if (mem_mul(json, HTTP_BODY_MEMORY_FACTOR, 1, &need) != 0 ||
        mem_mul(len - json, HTTP_BINARY_MEMORY_FACTOR, 1, &rest) != 0 ||
        __builtin_add_overflow(need, rest, &need) ||
        __builtin_add_overflow(need, body_json_tokens_need(hr), &need))
        return SIZE_MAX;
    return need;
}

static size_t body_covered(const http_request *hr, size_t reserved)
{
    if (!hr->parses_body)
        return reserved;
    size_t tokens = body_json_tokens_need(hr);
    if (reserved <= tokens)
        return 0;
    reserved -= tokens;
    size_t json_need;
    if (hr->binary_at == 0 ||
        mem_mul(hr->binary_at, HTTP_BODY_MEMORY_FACTOR, 1, &json_need) != 0 ||
        reserved <= json_need)
        return reserved / HTTP_BODY_MEMORY_FACTOR;
    return hr->binary_at + (reserved - json_need) / HTTP_BINARY_MEMORY_FACTOR;
}

/* Reserves the next step of hr's body, which is to grow to `len` bytes:
 * twice what has arrived, at least HTTP_BODY_STEP, at most the announced
 * length (or `limit`).  Returns 0, or -1 with nothing more reserved. */
static int body_reserve_step(http_request *hr, size_t limit, size_t len)
{
    size_t covered = body_covered(hr, hr->reserved);
    if (len <= covered)
        return 0;
    size_t target = 2 * len;
    if (target < HTTP_BODY_STEP)
        target = HTTP_BODY_STEP;
    /* An inflated body may grow past its announced (compressed) length. */
    size_t most = hr->announced != 0 && hr->inflater == NULL ? hr->announced : limit;
    if (target > most)
        target = most;
    /* A step never asks past the client's share for what would fit in it,
     * so that a refusal means "taken now" (503) or "never" (413). */
    size_t share = body_covered(hr, budget_client_cap());
    if (share != 0 && target > share && share >= len)
        target = share;
    size_t need = body_need(hr, target);
    return need > hr->reserved ? request_reserve(hr, need - hr->reserved) : 0;
}

/* (Re)allocates hr's body for cap bytes, keeping its hr->len bytes.  A v2 body with
 * binary tensors (hr->binary_at set) is placed so that its binary section starts on an
 * HTTP_BODY_ALIGN boundary: the FP32 tensors there are then read where they are
 * (v2_tensor_view_floats), not copied.  The allocation holds HTTP_BODY_ALIGN - 1 bytes
 * more for that; when realloc moves the block to another offset, the bytes move with
 * it.  Returns 0, or -1 (hr unchanged) when out of memory. */
static int body_place(http_request *hr, size_t cap)
{
    size_t spare = hr->binary_at != 0 ? HTTP_BODY_ALIGN - 1 : 0;
    char *base = mem_realloc(hr->body != NULL ? hr->body - hr->body_shift : NULL, cap + spare);
    if (base == NULL)
        return -1;
    size_t shift = 0;
    if (hr->binary_at != 0)
        shift = (HTTP_BODY_ALIGN - ((uintptr_t)base + hr->binary_at) % HTTP_BODY_ALIGN) %
                HTTP_BODY_ALIGN;
    if (shift != hr->body_shift)
        memmove(base + shift, base + hr->body_shift, hr->len);
    hr->body = base + shift;
    hr->body_shift = shift;
    hr->cap = cap;
    return 0;
}

void http_body_free(http_request *hr)
{
    mem_free(hr->body != NULL ? hr->body - hr->body_shift : NULL);
    hr->body = NULL;
    hr->body_shift = 0;
    hr->len = hr->cap = 0;
}

/* Appends data to the request body within the limit; past it, drops the body
 * and marks the request too large.  The body reserves its memory as it
 * arrives, announced or not; when the budget or the client's share cannot
 * cover it, the body is dropped (and its reservation given back) and the
 * request is answered 503 once it has been read.  Returns -1 when out of
 * memory. */
static int body_append(http_request *hr, size_t limit, const char *data, size_t n)
{
    if (hr->too_large || hr->no_memory)
        return 0;
    if (hr->len + n > limit) {
        hr->too_large = 1;
        http_body_free(hr);
        return 0;
    }
    body_count_json(hr, data, n);
    if (body_reserve_step(hr, limit, hr->len + n) != 0) {
        hr->no_memory = 1;
        hr->no_memory_need = body_need(hr, hr->len + n);
        http_body_free(hr);
        budget_client_release(hr->client, hr->reserved);
        hr->reserved = 0;
        return 0;
    }
    if (hr->len + n > hr->cap) {
        /* Past HTTP_BODY_WHOLE bytes, an announced body grows to its whole length at
         * once: no more copies as it grows, and a large one is mapped on its own
         * (mem_tune_allocator), so that none of it stays on the heap once freed (the
         * buffers a doubling body leaves behind would).  Its pages count only as
         * the bytes arrive; the budget is still reserved step by step above, and a
         * slow sender that has not sent HTTP_BODY_WHOLE holds no more than that. */
        size_t cap = hr->cap ? hr->cap : 4096;
        while (cap < hr->len + n)
            cap *= 2;
        if (cap > HTTP_BODY_WHOLE && hr->announced != 0 && hr->inflater == NULL &&
            hr->announced >= hr->len + n)
            cap = hr->announced;
        if (cap > limit)
            cap = limit;
        if (body_place(hr, cap) != 0)
            return -1;
        /* a whole large body is written once as it arrives: one page fault per 2 MiB */
        if (cap > HTTP_BODY_WHOLE && cap == hr->announced)
            mem_advise_huge(hr->body, cap);
    }
    /* A whole large body's pages are made resident ahead of its bytes, no further than
     * its reservation reaches (so a slow sender holds no more than it has reserved), in
     * steps of at least MEM_POPULATE_SPLIT, or the rest of the body. */
    if (hr->cap > HTTP_BODY_WHOLE && hr->cap == hr->announced) {
        size_t covered = body_covered(hr, hr->reserved);
        size_t upto = covered < hr->cap ? covered : hr->cap;
        size_t from = hr->populated > hr->len + n ? hr->populated : hr->len + n;
        if (upto > from && (upto - from >= MEM_POPULATE_SPLIT || upto == hr->cap)) {
            (void)mem_populate(hr->body + from, upto - from);
            hr->populated = upto;
        }
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

/* Where the binary section of a v2 body starts: its Inference-Header-Content-Length,
 * as read once for the handler too (http.c), else 0 (none, or one v2_body_split refuses:
 * the body is not placed).  One past the body is refused later too; placing by it does
 * no harm. */
static size_t binary_section_at(api_length header_length)
{
    if (header_length.stated != 1 || header_length.bytes > SIZE_MAX)
        return 0;
    return (size_t)header_length.bytes;
}

/* Decides, from its headers, whether the body of hr may come: a
 * Content-Length over --max-body is answered 413 at once, and so is one
 * whose peak memory could never be held for one client (the budget or the
 * client's share).  Nothing is reserved yet: body_append reserves as
 * the body arrives.  Returns MHD_YES to go on, or what queueing the refusal
 * returned. */
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
    /* The route's body column says how its body is read (route.h): a
     * safetensors upload is read in place, not parsed into a tree (its arrays
     * are reserved by the handler once their size is known); only a v2 body
     * is framed as a JSON header and binary tensors, elsewhere the whole body
     * is JSON whatever the headers say. */
    const char *format = http_query_arg(conn, "format");
    int in_place = hr->route->body == ROUTE_BODY_SET && format != NULL &&
                   !strcmp(format, "safetensors");
    hr->parses_body = (!strcmp(method, "POST") || !strcmp(method, "PUT")) && !in_place;
    hr->binary_at = hr->route->body == ROUTE_BODY_V2
                        ? binary_section_at(hr->inference_header_length) : 0;
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
    hr->announced = (size_t)n;
    size_t need = body_need(hr, (size_t)n);
    if (body_never_fits(need)) {
        hr->too_large = 1;
        body_never_fits_error(hr, &err, n, need);
        return http_queue_error(srv, conn, hr, &err, NULL);
    }
    return MHD_YES;
}

/* 1 when the complete body of hr was dropped (over --max-body, or past the
 * budget or the client's share as it grew) or is not of its
 * Content-Encoding, with err filled; else 0, the inflater (when there was
 * one) freed: the body is complete. */
int http_body_refused(const http_server *srv, http_request *hr, attn_error *err)
{
    if (hr->too_large) {
        error_set(err, ERR_TOO_LARGE, "body_too_large", NULL,
                  "The body is larger than the server's limit of %zu bytes (--max-body).",
                  srv->cfg->max_body);
        return 1;
    }
    if (hr->no_memory && body_never_fits(hr->no_memory_need)) {
        body_never_fits_error(hr, err, hr->bytes_in, hr->no_memory_need);
        return 1;
    }
    if (hr->no_memory) {
        error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                  "The server's memory budget (--max-memory), or this client's share of it "
                  "(--max-memory-share), could not hold this body now; retry shortly.");
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

/* Gives back what hr holds in the budget and its reference to its client's
 * share; at the request's end. */
void http_body_release(http_request *hr)
{
    if (!hr->client_known)
        return;
    budget_client_release(hr->client, hr->reserved);
    budget_client_put(hr->client);
    hr->reserved = 0;
    hr->client = NULL;
    hr->client_known = 0;
}

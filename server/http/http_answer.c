/*
 * http_answer.c - turning an api_response into libmicrohttpd's response:
 * the body and every header the server adds (Content-Type, Location, ETag,
 * the visualizer's Content-Security-Policy, CORS, Cache-Control, Allow,
 * WWW-Authenticate, Retry-After, and http_trace.c's traceresponse,
 * X-Request-Id and Server-Timing), compressing the body for a client whose
 * Accept-Encoding asks for it (compress.h).
 */
#include <stdio.h>
#include <string.h>

#include "message/answer.h"
#include "compress.h"
#include "http_private.h"
#include "core/mem.h"

/* The headers that describe the body and the resource: Content-Type,
 * Location, ETag, the page's policy, the v2 binary split. */
static void add_content_headers(struct MHD_Response *r, const api_response *resp)
{
    if (resp->body_len > 0)
        MHD_add_response_header(r, "Content-Type", resp->content_type ? resp->content_type
                                                                      : "application/json");
    if (resp->location[0])
        MHD_add_response_header(r, "Location", resp->location);
    if (resp->etag[0])
        MHD_add_response_header(r, "ETag", resp->etag);
    /* The visualizer's page (server/viz/) runs under the strictest policy it
     * works with: everything from this server, no inline script or style, no
     * plugins, no framing. */
    if (resp->content_type != NULL && !strncmp(resp->content_type, "text/html", 9)) {
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; script-src 'self'; style-src 'self'; "
                                "connect-src 'self'; object-src 'none'; "
                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    }
    if (resp->inference_header_length > 0) {
        char text[24];
        snprintf(text, sizeof text, "%zu", resp->inference_header_length);
        MHD_add_response_header(r, "Inference-Header-Content-Length", text);
    }
}

/* A static body (a string literal, one of the visualizer's files) is the same
 * bytes on every request: it is compressed once per coding and the copy kept
 * for the server's life.  Returns 1 with resp pointing at the kept copy (still
 * static), 0 when there is no room left or the body was not compressed (too
 * little gain, or memory ran out): the caller then goes on as for any body. */
static int compress_static(http_server *srv, api_response *resp, compress_kind kind,
                           const char **coding)
{
    const http_static_z *found = NULL;
    pthread_mutex_lock(&srv->static_lock);
    for (size_t i = 0; i < srv->static_z_count && found == NULL; i++)
        if (srv->static_z[i].body == resp->body && srv->static_z[i].kind == kind)
            found = &srv->static_z[i];
    if (found == NULL && srv->static_z_count < HTTP_STATIC_Z_MAX) {
        /* Compressed under the lock: it happens once per body and coding, and a
         * second request for the same file would otherwise do the same work. */
        size_t len = 0;
        char *z = compress_deflate(kind, resp->body, resp->body_len, &len);
        if (z != NULL) {
            metrics_static_compressed_add();
            http_static_z *slot = &srv->static_z[srv->static_z_count++];
            *slot = (http_static_z){resp->body, kind, z, len};
            found = slot;
        }
    }
    pthread_mutex_unlock(&srv->static_lock);
    if (found == NULL)
        return 0;
    resp->body = found->z;
    resp->body_len = found->len;
    *coding = compress_name(kind);
    return 1;
}

/* Compresses the body of resp for a client whose Accept-Encoding (NULL:
 * none) asks for it, when the body is large enough to gain.  Returns the
 * coding used (NULL: none; the body is then unchanged). */
static const char *compress_answer(http_server *srv, api_response *resp,
                                   const char *accept_encoding)
{
    compress_kind kind = compress_accepted(accept_encoding);
    if (kind == COMPRESS_NONE || resp->body_len < COMPRESS_MIN_BYTES)
        return NULL;
    const char *coding = NULL;
    if (resp->body_static && compress_static(srv, resp, kind, &coding))
        return coding;
    size_t len;
    char *z = compress_deflate(kind, resp->body, resp->body_len, &len);
    if (z == NULL)
        return NULL; /* sent as it is */
    api_response_free(resp);
    resp->body = z;
    resp->body_len = len;
    return compress_name(kind);
}

/* Decides the encoding of resp for a client with this Accept-Encoding into hr, compressing
 * the body when it asks and the body is large enough. */
static void encode_answer(http_request *hr, api_response *resp, const char *accept_encoding)
{
    /* Answers of this size vary with Accept-Encoding, whether compressed or not. */
    hr->answer_varies = resp->body_len >= COMPRESS_MIN_BYTES;
    double from = compute_now();
    hr->answer_coding = compress_answer(hr->srv, resp, accept_encoding);
    if (hr->answer_coding != NULL)
        http_trace_phase(hr, TRACE_PHASE_COMPRESS, compute_now() - from);
    hr->answer_encoded = 1;
}

void http_answer_encode(http_request *hr)
{
    encode_answer(hr, &hr->resp, hr->accept_encoding);
}

/* The CORS headers for the request's Origin, the preflight's among them;
 * Vary names Origin when the answer depends on it, and Accept-Encoding when
 * the body is large enough to be compressed (varies_encoding), whether it
 * was or not. */
static void add_cors_headers(struct MHD_Response *r, const http_server *srv,
                             struct MHD_Connection *conn, const api_response *resp, int preflight,
                             int varies_encoding)
{
    int vary = 0;
    const char *origin = guard_cors_origin(
        srv->guard, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"), &vary);
    if (origin != NULL) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                "Allow, Retry-After, WWW-Authenticate, Inference-Header-Content-Length, ETag, "
                                "Server-Timing, traceresponse, X-Request-Id");
    }
    if (vary || varies_encoding)
        MHD_add_response_header(r, "Vary", vary && varies_encoding ? "Origin, Accept-Encoding"
                                           : vary                  ? "Origin"
                                                                   : "Accept-Encoding");
    /* A preflight allows the route's methods (its writes only to the origins
     * that may write, cors.h) and the headers the API reads, never whatever
     * the browser asked for. */
    if (preflight && resp->allow != NULL && origin != NULL) {
        char methods[64];
        MHD_add_response_header(
            r, "Access-Control-Allow-Methods",
            guard_cors_methods(srv->guard, resp->allow,
                               MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"),
                               MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host"),
                               methods, sizeof methods));
        MHD_add_response_header(r, "Access-Control-Allow-Headers", GUARD_CORS_ALLOW_HEADERS);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
}

/* The headers of the exchange: caching, Allow, the guard's verdict,
 * Retry-After. */
static void add_exchange_headers(struct MHD_Response *r, const api_response *resp, int preflight,
                                 const guard_verdict *v)
{
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (resp->allow != NULL && (resp->status == 405 || preflight))
        MHD_add_response_header(r, "Allow", resp->allow);
    if (v != NULL && v->www_authenticate[0])
        MHD_add_response_header(r, "WWW-Authenticate", v->www_authenticate);
    if (v != NULL && v->close)
        MHD_add_response_header(r, "Connection", "close");
    if (resp->retry_after > 0) {
        char text[16];
        snprintf(text, sizeof text, "%d", resp->retry_after);
        MHD_add_response_header(r, "Retry-After", text);
    }
}

/* Keeps in hr what the handler noted in resp (its model, its phases) for
 * Server-Timing and the access log; an answer given before the body was
 * read whole (a refusal at the headers) reads until now. */
_Static_assert(sizeof(((http_request *)0)->model) == sizeof(((api_response *)0)->model),
               "the model is copied whole");

static void note_handler(http_request *hr, const api_response *resp)
{
    if (!(hr->phases_timed & (1u << TRACE_PHASE_READ)))
        http_trace_phase(hr, TRACE_PHASE_READ, compute_now() - hr->start);
    for (int p = 0; p < API_PHASE_COUNT; p++)
        if (resp->phases_timed & (1u << p))
            http_trace_phase(hr, TRACE_PHASE_API(p), resp->phase_seconds[p]);
    if (resp->model[0])
        memcpy(hr->model, resp->model, sizeof hr->model);
}

/* Builds the MHD response for resp (consuming its body) with the common
 * headers, compressed when the client asks and it is large enough, and
 * queues it.  OPTIONS answers get the preflight headers; a request the
 * guard refused gets what its verdict v asks for (NULL: none). */
enum MHD_Result http_queue_answer(http_server *srv, struct MHD_Connection *conn,
                                  http_request *hr, api_response *resp, int preflight,
                                  const guard_verdict *v)
{
    if (!(resp == &hr->resp && hr->answer_encoded))
        encode_answer(hr, resp,
                      MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept-Encoding"));
    note_handler(hr, resp);
    int varies_encoding = hr->answer_varies;
    const char *coding = hr->answer_coding;
    http_conn_set_phase(hr->hc, CONN_BUSY);
    struct MHD_Response *r;
    if (resp->body_static)
        r = MHD_create_response_from_buffer(resp->body_len, resp->body, MHD_RESPMEM_PERSISTENT);
    else
        r = MHD_create_response_from_buffer_with_free_callback(resp->body_len, resp->body,
                                                               mem_free);
    if (r == NULL) {
        api_response_free(resp);
        return MHD_NO;
    }
    resp->body = NULL; /* now owned by r */
    add_content_headers(r, resp);
    add_cors_headers(r, srv, conn, resp, preflight, varies_encoding);
    if (coding != NULL)
        MHD_add_response_header(r, "Content-Encoding", coding);
    add_exchange_headers(r, resp, preflight, v);
    http_trace_headers(r, hr);
    hr->status = resp->status;
    hr->bytes_out = resp->body_len;
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)resp->status, r);
    MHD_destroy_response(r);
    return ok;
}

/* Fills resp with the JSON error for err on the route of hr. */
void http_error_response(api_response *resp, const http_request *hr, const attn_error *err)
{
    memset(resp, 0, sizeof *resp);
    resp->route = hr->route->id;
    resp->allow = hr->route->allow;
    answer_error(resp, err);
}

enum MHD_Result http_queue_error(http_server *srv, struct MHD_Connection *conn,
                                 http_request *hr, const attn_error *err, const guard_verdict *v)
{
    api_response resp;
    http_error_response(&resp, hr, err);
    return http_queue_answer(srv, conn, hr, &resp, 0, v);
}

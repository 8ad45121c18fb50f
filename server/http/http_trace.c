/*
 * http_trace.c - a request's trace and timeline on HTTP's wire: the headers
 * every answer carries (traceresponse, X-Request-Id, Server-Timing), the
 * phases noted as they happen, and the access line with the client's
 * address as libmicrohttpd knows it.
 *
 * What a trace is, the ids and the access line itself are the trace
 * module's (trace/trace.h), shared with the gRPC front-end; this file only
 * moves them between that module and libmicrohttpd.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "http_private.h"

void http_trace_headers(struct MHD_Response *r, const http_request *hr)
{
    char text[TRACE_RESPONSE_LEN];
    trace_response(&hr->trace, text);
    MHD_add_response_header(r, "traceresponse", text);
    MHD_add_response_header(r, "X-Request-Id", hr->trace.request_id);
    char timing[TRACE_SERVER_TIMING_LEN];
    trace_server_timing(hr->phases_timed, hr->phase_seconds, timing);
    if (timing[0] != '\0')
        MHD_add_response_header(r, "Server-Timing", timing);
}

void http_trace_phase(http_request *hr, int phase, double seconds)
{
    hr->phases_timed |= 1u << phase;
    hr->phase_seconds[phase] = seconds > 0 ? seconds : 0;
}

/* The client's address as text ("" when unknown). */
static void client_address(struct MHD_Connection *conn, char *out, size_t size)
{
    out[0] = '\0';
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL)
        return;
    const struct sockaddr *sa = info->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)size);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out,
                  (socklen_t)size);
}

void http_trace_log_library(const char *fmt, va_list ap)
{
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        text[--n] = '\0';
    /* The message may quote a client's bytes: JSON strings must be UTF-8. */
    trace_printable(text);
    trace_log_message("libmicrohttpd", text);
}

void http_trace_log(const http_request *hr, struct MHD_Connection *conn, double seconds,
                    const char *served, int aborted)
{
    char client[INET6_ADDRSTRLEN] = "";
    if (!strcmp(hr->srv->cfg->log_format, "json"))     /* the text line has no address */
        client_address(conn, client, sizeof client);
    trace_access_line a = {.protocol = "http", .trace = &hr->trace, .method = hr->method,
                           .route = route_label(hr->route->id), .path = hr->path,
                           .model = hr->model, .status = hr->status, .bytes_in = hr->bytes_in,
                           .bytes_out = hr->bytes_out, .seconds = seconds,
                           .phases_timed = hr->phases_timed, .phase_seconds = hr->phase_seconds,
                           .client = client, .served = served, .aborted = aborted};
    trace_access(&a, hr->srv->cfg->log_format);
}

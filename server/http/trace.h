/*
 * trace.h - who a request is and where its time went, for either front-end:
 * its place in a W3C trace (traceparent in, traceresponse out), its request
 * id, the phases timed, and the access log line written when it ends.
 *
 * The HTTP layer (http_trace.c) reads these from headers and writes
 * Server-Timing; the gRPC front-end reads them from the call's metadata and
 * answers traceresponse and x-request-id in its initial metadata.  Both print
 * their access line through http_trace_access, so that --log-format json
 * gives one kind of line whichever protocol carried the request.
 */
#ifndef ATTN_HTTP_TRACE_H
#define ATTN_HTTP_TRACE_H

#include <stddef.h>

/* The longest request id of a client that is echoed. */
#define HTTP_REQUEST_ID_MAX 64
/* W3C caps tracestate at 512 characters: a longer one is dropped. */
#define HTTP_TRACESTATE_MAX 512

/* Who a request is in the trace it belongs to: ids as lowercase hex,
 * NUL-terminated. */
typedef struct http_trace {
    char trace_id[33];
    char span_id[17];           /* the server's span */
    char parent_id[17];         /* the caller's span; "" when the trace is new */
    char flags[3];
    char request_id[HTTP_REQUEST_ID_MAX + 1];
    const char *tracestate;     /* borrowed from the caller of begin; NULL: none */
} http_trace;

/* The phases of Server-Timing and the access log, in the order they happen;
 * parse to encode are api_phase's (message/api_message.h), one place further. */
typedef enum http_phase {
    HTTP_PHASE_READ,            /* from the first byte to the whole body (message) */
    HTTP_PHASE_PARSE,
    HTTP_PHASE_QUEUE,
    HTTP_PHASE_COMPUTE,
    HTTP_PHASE_ENCODE,
    HTTP_PHASE_COMPRESS,        /* compressing the answer for Accept-Encoding */
    HTTP_PHASE_COUNT
} http_phase;

/* The trace of a new request from its traceparent, tracestate and request id
 * (each NULL when absent; tracestate borrowed until the access line is
 * written).  A malformed traceparent starts a new trace (and drops
 * tracestate), never an error; an unusable request id is replaced. */
void http_trace_begin(http_trace *t, const char *traceparent, const char *tracestate,
                      const char *request_id);

/* The traceresponse value of t ("00-TRACE-SPAN-FLAGS") into out. */
#define HTTP_TRACERESPONSE_LEN 56       /* with its NUL */
void http_trace_response(const http_trace *t, char out[HTTP_TRACERESPONSE_LEN]);

/* Makes s printable ASCII in place: every other byte (control characters,
 * and bytes of 0x80 and up, which need not be UTF-8) becomes '?'.  For
 * what a client chose (a path, a method's name) before the access log holds
 * it: a JSON line must be UTF-8, and a text line one line. */
void http_trace_printable(char *s);

/* One finished request, as the access log prints it. */
typedef struct http_access {
    const char *protocol;       /* "http" or "grpc" */
    const http_trace *trace;
    const char *method;         /* HTTP's method, or the RPC's name ("ModelInfer") */
    const char *route;          /* the route's label (gRPC: its HTTP twin's) */
    const char *path;           /* the request's path (gRPC: the method's) */
    const char *model;          /* "" for none */
    int status;                 /* HTTP's status (gRPC: its HTTP twin's) */
    int grpc_status;            /* gRPC's status code; unused for HTTP */
    size_t bytes_in, bytes_out;
    double seconds;
    unsigned phases_timed;      /* bit 1 << http_phase */
    const double *phase_seconds; /* HTTP_PHASE_COUNT of them */
    const char *client;         /* the client's address, "" when unknown */
    const char *served;         /* which thread answered: inline, worker, ... */
    int aborted;                /* the answer did not go out whole (gRPC: cancelled) */
} http_access;

/* Writes a's access line on stderr, as one JSON object when format is
 * "json", else as a line of words; written whole, so that lines of
 * concurrent requests never mix. */
void http_trace_access(const http_access *a, const char *format);

#endif

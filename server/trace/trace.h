/*
 * trace.h - who a request is and where its time went, for either front-end:
 * its place in a W3C trace (traceparent in, traceresponse out), its request
 * id, the phases timed, and the access log line written when it ends.
 *
 * This module knows no wire: HTTP (http/http_trace.c) reads the trace from
 * headers and writes Server-Timing; the gRPC front-end reads it from the
 * call's metadata and answers traceresponse and x-request-id in its initial
 * metadata.  Both print their access line through trace_access, so that
 * --log-format json gives one kind of line whichever protocol carried the
 * request.  It sits below both front-ends so that neither includes the other.
 */
#ifndef ATTN_TRACE_H
#define ATTN_TRACE_H

#include <stddef.h>

#include "message/api_message.h"

/* The longest request id of a client that is echoed. */
#define TRACE_REQUEST_ID_MAX 64
/* W3C caps tracestate at 512 characters: a longer one is dropped. */
#define TRACE_TRACESTATE_MAX 512

/* Who a request is in the trace it belongs to: ids as lowercase hex,
 * NUL-terminated. */
typedef struct trace_context {
    char trace_id[33];
    char span_id[17];           /* the server's span */
    char parent_id[17];         /* the caller's span; "" when the trace is new */
    char flags[3];
    char request_id[TRACE_REQUEST_ID_MAX + 1];
    const char *tracestate;     /* borrowed from the caller of begin; NULL: none */
} trace_context;

/* The phases of Server-Timing and the access line, in the order they happen:
 * reading the request (from the first byte to the whole message), the
 * handler's own (api_phase, message/api_message.h: parse, queue, compute,
 * encode), and compressing the answer for Accept-Encoding.  Each is an index
 * into an array of TRACE_PHASE_COUNT seconds and a bit (1 << index) of a
 * phases_timed mask; the handler's are api_phase's order, one place further,
 * so that they are never listed twice. */
#define TRACE_PHASE_READ 0
#define TRACE_PHASE_API(api_phase) (1 + (int)(api_phase))
#define TRACE_PHASE_COMPRESS (1 + API_PHASE_COUNT)
#define TRACE_PHASE_COUNT (2 + API_PHASE_COUNT)

/* The trace of a new request from its traceparent, tracestate and request id
 * (each NULL when absent; tracestate borrowed until the access line is
 * written).  A malformed traceparent starts a new trace (and drops
 * tracestate), never an error; an unusable request id is replaced. */
void trace_begin(trace_context *t, const char *traceparent, const char *tracestate,
                 const char *request_id);

/* The traceresponse value of t ("00-TRACE-SPAN-FLAGS") into out. */
#define TRACE_RESPONSE_LEN 56           /* with its NUL */
void trace_response(const trace_context *t, char out[TRACE_RESPONSE_LEN]);

/* The Server-Timing value of the phases timed (bit 1 << TRACE_PHASE_*) and
 * their seconds (TRACE_PHASE_COUNT of them) into out: "read;dur=0.123, ..."
 * in milliseconds, "" when none was timed. */
#define TRACE_SERVER_TIMING_LEN (TRACE_PHASE_COUNT * 40) /* with its NUL */
void trace_server_timing(unsigned phases_timed, const double *phase_seconds,
                         char out[TRACE_SERVER_TIMING_LEN]);

/* Makes s printable ASCII in place: every other byte (control characters,
 * and bytes of 0x80 and up, which need not be UTF-8) becomes '?'.  For
 * what a client chose (a path, a method's name) before the access log holds
 * it: a JSON line must be UTF-8, and a text line one line. */
void trace_printable(char *s);

/* One finished request, as the access log prints it. */
typedef struct trace_access_line {
    const char *protocol;       /* "http" or "grpc" */
    const trace_context *trace;
    const char *method;         /* HTTP's method, or the RPC's name ("ModelInfer") */
    const char *route;          /* the route's label (gRPC: its HTTP twin's) */
    const char *path;           /* the request's path (gRPC: the method's) */
    const char *model;          /* "" for none */
    int status;                 /* HTTP's status (gRPC: its HTTP twin's) */
    int grpc_status;            /* gRPC's status code; unused for HTTP */
    size_t bytes_in, bytes_out;
    double seconds;
    unsigned phases_timed;      /* bit 1 << TRACE_PHASE_* */
    const double *phase_seconds; /* TRACE_PHASE_COUNT of them */
    const char *client;         /* the client's address, "" when unknown */
    const char *served;         /* which thread answered: inline, worker, ... */
    int aborted;                /* the answer did not go out whole (gRPC: cancelled) */
} trace_access_line;

/* Writes a's access line on stderr, as one JSON object when format is
 * "json", else as a line of words, where the method, the path and the
 * model are each one word or one quoted string (trace.c, text_value);
 * written whole, so that lines of concurrent requests never mix. */
void trace_access(const trace_access_line *a, const char *format);

/* Writes a message of a library the server runs (source: "libmicrohttpd")
 * on stderr as one JSON line with the time, for --log-format json; message
 * must be printable already (trace_printable). */
void trace_log_message(const char *source, const char *message);

#endif

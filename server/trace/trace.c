/*
 * trace.c - the identity and the timeline of every request, whichever
 * front-end carried it: W3C Trace Context in and out, request ids, the
 * Server-Timing value, and the access log line (see trace.h).
 *
 * A request that brings a valid traceparent (W3C Trace Context, version 00,
 * or a later version read as 00 says) joins that trace: the server's span
 * gets a new id and the caller's span becomes its parent, and tracestate,
 * when well formed, is kept for the log.  A malformed traceparent is
 * ignored, never refused: the request starts a new trace, as the
 * specification asks, and its tracestate is dropped with it.  Ids come from
 * getrandom(2), the kernel's CSPRNG, so that ids of concurrent requests and
 * of replicas never collide in practice.  Every answer carries traceresponse
 * (Trace Context Level 2: the trace and the server's span), the request id
 * (the client's own when it sent a usable one, else a new one) and, on HTTP,
 * Server-Timing with the phases that happened.  The access log prints one
 * line per request at its completion, as text or as a JSON object
 * (--log-format), written with jansson.  Nothing here reads a wire: the
 * front-ends hand over what their headers or metadata said.
 */
#include "trace.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Fills buf with n random bytes from the kernel.  getrandom blocks only
 * until the kernel's pool is first seeded at boot; should it fail all the
 * same, the clock and a counter make the bytes, which are still unique in
 * this process (never the same ids twice), if guessable. */
static void kernel_random_bytes(unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno != EINTR)
            break;
    }
    if (got == n)
        return;
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long x = (unsigned long long)ts.tv_sec * 1000000007ULL ^
                           (unsigned long long)ts.tv_nsec ^ (atomic_fetch_add(&counter, 1) << 40);
    for (size_t i = got; i < n; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 29;
        buf[i] = (unsigned char)(x >> 24);
    }
}

/* Each thread draws its ids from its own pool of the kernel's bytes, refilled
 * whole when spent: the ids are the kernel CSPRNG's bytes as before, at one
 * system call per hundred requests or so rather than three a request, which
 * the smallest requests' throughput felt.  Each byte is used once. */
#define RANDOM_POOL_BYTES 4096
static _Thread_local unsigned char random_pool[RANDOM_POOL_BYTES];
static _Thread_local size_t random_pool_left;

static void random_bytes(unsigned char *buf, size_t n)
{
    if (n > RANDOM_POOL_BYTES) {
        kernel_random_bytes(buf, n);
        return;
    }
    if (random_pool_left < n) {
        kernel_random_bytes(random_pool, RANDOM_POOL_BYTES);
        random_pool_left = RANDOM_POOL_BYTES;
    }
    unsigned char *from = random_pool + RANDOM_POOL_BYTES - random_pool_left;
    memcpy(buf, from, n);
    memset(from, 0, n); /* never handed out twice, nor left for a core dump */
    random_pool_left -= n;
}

/* Writes n random bytes as 2n lowercase hex digits and a NUL into out,
 * never all zeros (an id W3C reads as invalid). */
static void random_hex(char *out, size_t n)
{
    unsigned char bytes[32];
    static const char digits[] = "0123456789abcdef";
    int zero;
    do {
        random_bytes(bytes, n);
        zero = 1;
        for (size_t i = 0; i < n; i++)
            zero &= bytes[i] == 0;
    } while (zero);
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Is s[0..n) lowercase hex, and (nonzero) not all zeros? */
static int is_hex(const char *s, size_t n, int nonzero)
{
    int all_zero = 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        all_zero &= c == '0';
    }
    return !(nonzero && all_zero);
}

/* Reads a traceparent into t (trace, parent, flags); 0 when valid, -1 with
 * t unchanged otherwise.  Version 00 is exactly 55 characters; a later
 * version (never ff) may carry more after a '-', which is ignored. */
static int traceparent_parse(const char *v, trace_context *t)
{
    size_t len = strlen(v);
    if (len < 55 || !is_hex(v, 2, 0) || !strncmp(v, "ff", 2) || v[2] != '-' ||
        !is_hex(v + 3, 32, 1) || v[35] != '-' || !is_hex(v + 36, 16, 1) || v[52] != '-' ||
        !is_hex(v + 53, 2, 0))
        return -1;
    if (!strncmp(v, "00", 2) ? len != 55 : len > 55 && v[55] != '-')
        return -1;
    memcpy(t->trace_id, v + 3, 32);
    t->trace_id[32] = '\0';
    memcpy(t->parent_id, v + 36, 16);
    t->parent_id[16] = '\0';
    /* Only the sampled bit is defined; the others are not passed on. */
    int sampled = (v[54] >= '0' && v[54] <= '9' ? v[54] - '0' : v[54] - 'a' + 10) & 1;
    snprintf(t->flags, sizeof t->flags, "0%d", sampled);
    return 0;
}

/* A client's X-Request-Id is echoed when it is 1 to TRACE_REQUEST_ID_MAX
 * characters of letters, digits and ._:- (what balancers and clients
 * generate); anything else is replaced, so that a log line never holds what
 * a client chose to smuggle into it. */
static int request_id_usable(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > TRACE_REQUEST_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* tracestate is kept when it fits W3C's 512 characters and is printable
 * ASCII; its list members are the vendors' business. */
static int tracestate_usable(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > TRACE_TRACESTATE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e)
            return 0;
    return 1;
}

void trace_begin(trace_context *t, const char *traceparent, const char *tracestate,
                 const char *request_id)
{
    memset(t, 0, sizeof *t);
    if (traceparent != NULL && traceparent_parse(traceparent, t) == 0) {
        if (tracestate != NULL && tracestate_usable(tracestate))
            t->tracestate = tracestate;
    } else {
        random_hex(t->trace_id, 16);
        snprintf(t->flags, sizeof t->flags, "00");
    }
    random_hex(t->span_id, 8);
    if (request_id != NULL && request_id_usable(request_id))
        snprintf(t->request_id, sizeof t->request_id, "%s", request_id);
    else
        random_hex(t->request_id, 16);
}

/* The phases' names in Server-Timing and the access line, by TRACE_PHASE_*. */
_Static_assert(API_PHASE_COUNT == 4, "every api_phase has its name below");
static const char *const phase_names[TRACE_PHASE_COUNT] = {
    [TRACE_PHASE_READ] = "read",
    [TRACE_PHASE_API(API_PHASE_PARSE)] = "parse",
    [TRACE_PHASE_API(API_PHASE_QUEUE)] = "queue",
    [TRACE_PHASE_API(API_PHASE_COMPUTE)] = "compute",
    [TRACE_PHASE_API(API_PHASE_ENCODE)] = "encode",
    [TRACE_PHASE_COMPRESS] = "compress"};

/* Appends text to out at *n (the caller sized out for everything). */
static void put_text(char *out, size_t *n, const char *text)
{
    size_t len = strlen(text);
    memcpy(out + *n, text, len);
    *n += len;
}

/* Appends seconds as milliseconds with three decimals ("12.345"). */
static void put_millis(char *out, size_t *n, double seconds)
{
    double us = seconds * 1e6 + 0.5;
    unsigned long long v = us > 0 && us < 1e15 ? (unsigned long long)us : 0;
    char digits[24];
    int k = 0;
    do {
        digits[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0 || k < 4); /* at least "0.000" */
    while (k > 3)
        out[(*n)++] = digits[--k];
    out[(*n)++] = '.';
    while (k > 0)
        out[(*n)++] = digits[--k];
}

void trace_printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

/* The header values are written by hand rather than by snprintf, whose
 * floating-point and format parsing cost the smallest requests a visible
 * share of their time. */
void trace_response(const trace_context *t, char out[TRACE_RESPONSE_LEN])
{
    size_t n = 0;
    put_text(out, &n, "00-");
    put_text(out, &n, t->trace_id);
    put_text(out, &n, "-");
    put_text(out, &n, t->span_id);
    put_text(out, &n, "-");
    put_text(out, &n, t->flags);
    out[n] = '\0';
}

/* Each phase takes at most 40 bytes: ", " + a name of at most 8 + ";dur=" +
 * at most 16 digits and a point. */
void trace_server_timing(unsigned phases_timed, const double *phase_seconds,
                         char out[TRACE_SERVER_TIMING_LEN])
{
    size_t n = 0;
    for (int p = 0; p < TRACE_PHASE_COUNT; p++)
        if (phases_timed & (1u << p)) {
            if (n > 0)
                put_text(out, &n, ", ");
            put_text(out, &n, phase_names[p]);
            put_text(out, &n, ";dur=");
            put_millis(out, &n, phase_seconds[p]);
        }
    out[n] = '\0';
}

/* Now as RFC 3339 UTC with milliseconds. */
static void utc_now(char *out, size_t size)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, size, "%s.%03dZ", day, (int)(ts.tv_nsec / 1000000));
}

/* The JSON access line: one object, written whole under the stream's lock
 * so that lines of concurrent requests never mix. */
static void access_json(const trace_access_line *a)
{
    char when[64];
    utc_now(when, sizeof when);
    json_t *phases = json_object();
    for (int p = 0; p < TRACE_PHASE_COUNT; p++)
        if (a->phases_timed & (1u << p))
            json_object_set_new(phases, phase_names[p], json_real(a->phase_seconds[p] * 1000.0));
    const trace_context *t = a->trace;
    json_t *line = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:f, s:o, "
                             "s:s, s:s, s:b}",
                             "time", when, "protocol", a->protocol, "request_id", t->request_id,
                             "trace_id", t->trace_id, "span_id", t->span_id, "method", a->method,
                             "route", a->route, "path", a->path, "status", a->status, "bytes_in",
                             (json_int_t)a->bytes_in, "bytes_out", (json_int_t)a->bytes_out,
                             "duration_ms", a->seconds * 1000.0, "phases_ms", phases, "client",
                             a->client, "served", a->served, "aborted", a->aborted);
    if (line == NULL)
        return; /* out of memory: the line is lost, the request is not */
    if (!strcmp(a->protocol, "grpc"))
        json_object_set_new(line, "grpc_status", json_integer(a->grpc_status));
    if (t->parent_id[0])
        json_object_set_new(line, "parent_id", json_string(t->parent_id));
    if (t->tracestate != NULL)
        json_object_set_new(line, "tracestate", json_string(t->tracestate));
    if (a->model != NULL && a->model[0])
        json_object_set_new(line, "model", json_string(a->model));
    flockfile(stderr);
    json_dumpf(line, stderr, JSON_COMPACT | JSON_REAL_PRECISION(6));
    fputc('\n', stderr);
    funlockfile(stderr);
    json_decref(line);
}

/* The text line's one rule for a value a client chose (the method, the
 * path, the model's name): a value of printable ASCII with no space, '"' or
 * '\\' is printed as it is, so that the common line reads as before; any
 * other, the empty one too, in double quotes, with '"' and '\\' after a
 * backslash and every byte outside printable ASCII as \xHH.  So a value is
 * one word or one quoted string however it was spelled, and a target such
 * as "/v1/x status=200 model=evil" cannot add fields to the line.  Writes
 * into out (size bytes, at least 3), cutting a value too long for it after a
 * whole character and closing the quote. */
static void text_value(char *out, size_t size, const char *s)
{
    int plain = s[0] != '\0';
    for (const unsigned char *p = (const unsigned char *)s; *p && plain; p++)
        plain = *p > 0x20 && *p < 0x7f && *p != '"' && *p != '\\';
    if (plain) {
        snprintf(out, size, "%s", s);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char c[4];
        size_t k = 0;
        if (*p == '"' || *p == '\\') {
            c[k++] = '\\';
            c[k++] = (char)*p;
        } else if (*p < 0x20 || *p > 0x7e) {
            c[k++] = '\\';
            c[k++] = 'x';
            c[k++] = hex[*p >> 4];
            c[k++] = hex[*p & 15];
        } else {
            c[k++] = (char)*p;
        }
        if (n + k + 2 > size)   /* room for the closing quote and the NUL */
            break;
        memcpy(out + n, c, k);
        n += k;
    }
    out[n++] = '"';
    out[n] = '\0';
}

void trace_access(const trace_access_line *a, const char *format)
{
    if (!strcmp(format, "json")) {
        access_json(a);
        return;
    }
    const trace_context *t = a->trace;
    int model = a->model != NULL && a->model[0];
    /* room for the front-ends' longest method, path and model name, escaped */
    char method[64], path[4 * 128 + 3], model_name[4 * 80 + 3];
    text_value(method, sizeof method, a->method);
    text_value(path, sizeof path, a->path);
    if (model)
        text_value(model_name, sizeof model_name, a->model);
    if (!strcmp(a->protocol, "grpc"))
        fprintf(stderr, "access grpc %s status=%d http=%d in=%zu out=%zu ms=%.3f via=%s id=%s "
                "trace=%s%s%s%s\n", method, a->grpc_status, a->status, a->bytes_in,
                a->bytes_out, a->seconds * 1000.0, a->served, t->request_id, t->trace_id,
                model ? " model=" : "", model ? model_name : "", a->aborted ? " aborted" : "");
    else
        fprintf(stderr, "access %s %s status=%d in=%zu out=%zu ms=%.3f via=%s id=%s "
                "trace=%s%s%s%s\n", method, path, a->status, a->bytes_in, a->bytes_out,
                a->seconds * 1000.0, a->served, t->request_id, t->trace_id,
                model ? " model=" : "", model ? model_name : "", a->aborted ? " aborted" : "");
}

void trace_log_message(const char *source, const char *message)
{
    char when[64];
    utc_now(when, sizeof when);
    json_t *line = json_pack("{s:s, s:s, s:s}", "time", when, "source", source, "message",
                             message);
    if (line == NULL)
        return;
    flockfile(stderr);
    json_dumpf(line, stderr, JSON_COMPACT);
    fputc('\n', stderr);
    funlockfile(stderr);
    json_decref(line);
}

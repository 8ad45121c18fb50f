/*
 * api_message.h - the request a handler is given, what it may use of the
 * server, and the answer it fills in.
 *
 * The HTTP layer builds an api_request from a complete request and sends the
 * api_response a handler filled in; the router (router/api.c) and the
 * handlers below it (v1/, v2/, viz/) share these types without depending on
 * each other.  A handler learns the server's state only from the api_env the
 * router gives it.
 */
#ifndef ATTN_API_MESSAGE_H
#define ATTN_API_MESSAGE_H

#include <stddef.h>

#include "api_infer.h"
#include "api_meta.h"
#include "core/config.h"
#include "route/route.h"
#include "store/store.h"

/* A byte length a request states in text (Inference-Header-Content-Length),
 * as the front-end read it, so that the handler is given a number and never
 * the wire's text.  The zero value is "not stated". */
typedef struct api_length {
    int stated;                 /* 0: absent; 1: bytes holds it; -1: no decimal integer */
    unsigned long long bytes;   /* ULLONG_MAX when larger: longer than any body */
} api_length;

/* Reads text, a header's value (NULL when the request has none), as a byte
 * length: a decimal integer, spaces and tabs around it allowed.  Never fails:
 * what is not one is stated -1, which its handler refuses. */
api_length api_length_parse(const char *text);

typedef struct api_request {
    const char *method;
    const char *path;
    const char *body;           /* borrowed; may be NULL when body_len is 0 */
    size_t body_len;
    /* Where a v2 body's JSON part ends and its binary tensors start, from
     * the Inference-Header-Content-Length header; not stated: the whole body
     * is JSON. */
    api_length inference_header_length;
    /* A v2 inference request already made as its fields (api_infer.h), by a
     * front-end that has them in hand (gRPC) rather than text: v2 reads it
     * in place of a JSON header, and body is then unused (each input says
     * where its bytes are).  Borrowed; NULL: the body says it. */
    const api_infer_request *infer_request;
    /* The answer as fields for a front-end that writes a message of its
     * own from them (gRPC), with no JSON text to parse back: v2's inference,
     * when every output is binary, is api_response.infer and the binary
     * section alone (inference_header_length 0); the server's and a model's
     * metadata and configuration are api_response.meta and no body. */
    int fields_only;
    const char *if_match;       /* If-Match header, NULL if absent */
    /* Read and answered on an I/O thread, which must not wait nor compute
     * long: a computation that would is not answered (api_response.deferred)
     * and goes to a worker instead. */
    int io_thread;
    /* The request's row of the route table and what its path captured,
     * route_find(path, args), found once by the HTTP layer when the headers
     * arrived; route NULL: api_handle finds both. */
    const route *route;
    const route_args *args;
    /* The query's arguments, decoded: query_arg(query_ctx, "format") is the
     * value of format=, or NULL when absent.  query_arg NULL: no query. */
    const char *(*query_arg)(const void *query_ctx, const char *key);
    const void *query_ctx;
    /* When the request was queued for a worker (seconds of compute_now()),
     * 0 when it was not: the statistics' queue time. */
    double queued_at;
    /* The protocol that brought it ("http", "grpc"; a static string, NULL
     * read as unknown): a label of the autoscaling metrics. */
    const char *protocol;
} api_request;

/* The phases of a request a handler times, for Server-Timing and the
 * access log (the HTTP layer times reading and compressing itself). */
typedef enum api_phase {
    API_PHASE_PARSE,            /* decoding the body and admitting the work */
    API_PHASE_QUEUE,            /* waiting for a worker and a compute slot */
    API_PHASE_COMPUTE,          /* the computation's own time */
    API_PHASE_ENCODE,           /* writing the answer */
    API_PHASE_COUNT
} api_phase;

/* What a v2 inference answered in binary holds, described for a front-end
 * that packs it into messages of its own (gRPC), so that it need not parse
 * the answer's JSON part back: filled by v2's answer writer when every
 * output is binary.  Strings are static or copied here; an output's bytes
 * are the next `bytes` of the body's binary section, in order. */
#define API_INFER_MAX_PARAMS 7
typedef struct api_infer_answer {
    int set;                    /* 0: not a binary v2 inference answer */
    char model_name[72];        /* a set name is at most 64 bytes (weights.h) */
    const char *model_version;
    char id[256];               /* "" for none */
    size_t n_params;            /* in the order of the JSON part's "parameters" */
    struct {
        const char *key;
        const char *string;     /* a string (static), or NULL for a number: */
        int is_integer;         /* integer (a JSON integer) or real */
        long long integer;
        double real;
    } params[API_INFER_MAX_PARAMS];
    size_t n_outputs;
    struct {
        const char *name, *datatype;
        size_t rank;
        size_t dims[API_INFER_MAX_RANK];
        size_t bytes;
    } outputs[API_INFER_MAX_OUTPUTS];
} api_infer_answer;

typedef struct api_response {
    int status;
    char *body;                 /* owned unless body_static; free with api_response_free */
    size_t body_len;
    int body_static;            /* body points at a string literal */
    const char *content_type;   /* static string */
    const char *allow;          /* static string or NULL: methods of the route */
    int retry_after;            /* seconds, 0 for none */
    char location[96];          /* Location header, "" for none */
    char etag[32];              /* ETag header (quoted generation), "" for none */
    size_t inference_header_length; /* v2 binary answers: bytes of the JSON part; 0 for none */
    api_infer_answer infer;     /* v2 binary answers: the JSON part as fields */
    api_meta_answer meta;       /* v2 metadata answers as fields (api_meta.h) */
    route_id route;             /* for /metrics and the form of an error body */
    /* An error answer's sentence, as its body says it (v2: the field before
     * the words when they do not name it; v1: the message), "" for none: what
     * a front-end that does not send the JSON body (gRPC) says instead, so
     * that it never parses the body back.  Filled by answer_error. */
    char error[600];
    int deferred;               /* io_thread request left unanswered: hand it to a worker */
    /* What the handler learned, for the access log and Server-Timing: the
     * model ("" for none) and the phases that happened (bit 1 << phase set
     * in phases_timed), in seconds. */
    char model[72];             /* a set name is at most 64 bytes (weights.h) */
    unsigned phases_timed;
    double phase_seconds[API_PHASE_COUNT];
} api_response;

/* What a handler may use of the server, for one request: the router's
 * configuration and weight-set store (borrowed), and whether it drains. */
typedef struct api_env {
    const server_config *cfg;
    weight_store *store;
    int draining;
} api_env;

/* Answers req into resp, which the router zeroed and gave its route and
 * Allow; always fills resp. */
typedef void api_handler(const api_request *req, const api_env *env, api_response *resp);

/* Notes in resp that phase took seconds. */
void api_response_phase(api_response *resp, api_phase phase, double seconds);

/* Notes in resp the request's model (borrowed, copied; cut to fit). */
void api_response_model(api_response *resp, const char *model);

/* Frees the body of resp (resp may be NULL). */
void api_response_free(api_response *resp);

#endif

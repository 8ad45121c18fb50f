/*
 * grpc_private.h - what the files of the gRPC front-end share: the RPCs it
 * knows, and the answer one RPC gives before it is sent.
 *
 * The front-end (grpc_front.c, grpc_call.c, grpc_watch.c, grpc_conn.c, which
 * share grpc_front_internal.h) owns the gRPC server, its completion queue,
 * the calls and the connections; grpc_service.c answers the cheap RPCs and
 * grpc_infer.c ModelInfer, each from the bytes of a request message (read
 * under bounds by grpc_unpack.c) to the bytes of a response message and a
 * status, through the router.
 */
#ifndef ATTN_GRPC_PRIVATE_H
#define ATTN_GRPC_PRIVATE_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "core/error.h"
#include "message/api_message.h"
#include "route/route.h"

/* The RPCs served, by method path (grpc_method_of). */
typedef enum grpc_method {
    GRPC_M_UNKNOWN,
    GRPC_M_SERVER_LIVE,
    GRPC_M_SERVER_READY,
    GRPC_M_MODEL_READY,
    GRPC_M_SERVER_METADATA,
    GRPC_M_MODEL_METADATA,
    GRPC_M_MODEL_INFER,
    GRPC_M_MODEL_STREAM_INFER,
    GRPC_M_MODEL_CONFIG,
    GRPC_M_MODEL_STATISTICS,
    GRPC_M_REPOSITORY_INDEX,
    GRPC_M_REPOSITORY_LOAD,
    GRPC_M_REPOSITORY_UNLOAD,
    GRPC_M_HEALTH_CHECK,
    GRPC_M_HEALTH_WATCH,
    GRPC_M_COUNT
} grpc_method;

/* The answer of one RPC.  bytes (owned, free()) is the packed response
 * message when code is GRPC_STATUS_OK, else NULL and message says why. */
typedef struct grpc_answer {
    grpc_status_code code;
    char message[1024];
    unsigned char *bytes;
    size_t len;
    int retry_after;            /* seconds, 0 for none (a trailing retry-after) */
    int http_status;            /* of the HTTP twin, for /metrics */
    route_id route;             /* of the HTTP twin, for /metrics */
    int deferred;               /* grpc_infer_answer on the polling thread: for a worker */
    /* What the router's handler noted, for the access log (api_response's) */
    char model[72];
    unsigned phases_timed;
    double phase_seconds[API_PHASE_COUNT];
} grpc_answer;

/* The method of a path such as "/inference.GRPCInferenceService/ModelInfer"
 * (len bytes, not terminated). */
grpc_method grpc_method_of(const char *path, size_t len);

/* The name of m for the access log. */
const char *grpc_method_name(grpc_method m);

/* Answers one request message (in, len bytes, borrowed) of a cheap method
 * (any but GRPC_M_MODEL_INFER) into out.  Always fills out. */
void grpc_service_answer(grpc_method m, const unsigned char *in, size_t len, grpc_answer *out);

/* Answers a ModelInferRequest (in, len bytes) into out, on the calling
 * thread, under the compute token it has bound; queued_at is when the call
 * joined the queue (compute_now()).  unpack_cap bounds the bytes the
 * unpacked message may take (0: no bound; past it RESOURCE_EXHAUSTED); a
 * request with more inputs or outputs than v2 takes, or a string with a NUL
 * byte, is refused INVALID_ARGUMENT before it is unpacked.  With io_thread (the polling thread,
 * which must not wait nor compute long) the router answers only a small
 * computation with a compute slot free now, as on HTTP's I/O threads, and
 * otherwise sets out->deferred and nothing else: the call goes to a worker.
 * With stream a response is packed as a ModelStreamInferResponse holding
 * it (an error stays an error: grpc_infer_stream_error).  Always fills out. */
void grpc_infer_answer(const unsigned char *in, size_t len, size_t unpack_cap, double queued_at,
                       int io_thread, int stream, grpc_answer *out);

/* A bound on the unpacked form of a request message of len bytes, for a
 * caller without a reservation of its own to give grpc_infer_answer: four
 * times the wire (a packed bool unpacks to four bytes) and 64 KiB. */
size_t grpc_infer_unpack_bound(size_t len);

/* The allocator a message is unpacked with (grpc_unpack.c): it counts the
 * bytes it hands out (used, in all; live, not yet freed) and refuses the
 * one that would take used past cap (refused set; cap 0: no bound).  A
 * message unpacked with it is freed with it, and it must outlive the
 * message. */
typedef struct grpc_unpack_budget {
    ProtobufCAllocator allocator;
    size_t cap, used, live;
    int refused;                /* a request passed cap */
    int failed;                 /* memory ran out */
} grpc_unpack_budget;

void grpc_unpack_budget_init(grpc_unpack_budget *b, size_t cap);

/* At most max entries of the top-level repeated field named field. */
typedef struct grpc_unpack_limit {
    const char *field;
    size_t max;
} grpc_unpack_limit;

/* Unpacks the message of descriptor d from in (len bytes) through budget:
 * first the wire is walked, and a string field holding a NUL byte or a
 * top-level field with more entries than limits[] allow is refused
 * (INVALID_ARGUMENT naming the field, "inputs[2].name"); then protobuf-c
 * unpacks it.  Returns the message (free with
 * protobuf_c_message_free_unpacked(m, &budget->allocator)), or NULL with out
 * filled: RESOURCE_EXHAUSTED past budget's cap or out of memory,
 * INVALID_ARGUMENT for bytes that are not such a message. */
ProtobufCMessage *grpc_unpack(const ProtobufCMessageDescriptor *d, const unsigned char *in,
                              size_t len, const grpc_unpack_limit *limits, size_t n_limits,
                              grpc_unpack_budget *budget, grpc_answer *out);

/* Turns out, an error answer of ModelInfer, into one of ModelStreamInfer:
 * error_message with code OK (out->message and http_status still say what
 * it was).  An answer with code OK is left as it is: grpc_infer_answer
 * packed it for the stream. */
void grpc_infer_stream_error(grpc_answer *out);

/* Health/Watch: reads its HealthCheckRequest (in, len bytes) and returns 1
 * when it names a service served ("" is the whole server), 0 when not (the
 * watch is told SERVICE_UNKNOWN), or -1 with out filled when in is not a
 * HealthCheckRequest. */
int grpc_health_watch_known(const unsigned char *in, size_t len, grpc_answer *out);

/* The serving status of the whole server now, as Check answers it (what
 * /readyz says): GRPC_HEALTH_SERVING or GRPC_HEALTH_NOT_SERVING. */
enum { GRPC_HEALTH_SERVING = 1, GRPC_HEALTH_NOT_SERVING = 2, GRPC_HEALTH_SERVICE_UNKNOWN = 3 };
int grpc_health_now(void);

/* Packs a HealthCheckResponse of status (a GRPC_HEALTH_ value, the
 * protocol's numbers) into out, as grpc_answer_pack does. */
void grpc_health_pack(int status, grpc_answer *out);

/* Fills out with code and the printf-style message; returns nothing. */
void grpc_answer_error(grpc_answer *out, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills out from the error answer of the router: the gRPC code of its HTTP
 * status (see docs/grpc.md), and its words. */
void grpc_answer_from_http(grpc_answer *out, const api_response *resp);

/* The HTTP twin's status of an answer with code that did not come from the
 * router (a call refused before its handler), for the access log and /metrics. */
int grpc_http_status_of(grpc_status_code code);

/* The route of /metrics and the access log that method m counts under when
 * its answer did not come from the router. */
route_id grpc_method_route(grpc_method m);

/* Fills out from err, an error that ended a call before its handler (the
 * work queue's words): the gRPC code of its HTTP status, DEADLINE_EXCEEDED
 * and CANCELLED for a deadline and a client gone. */
void grpc_answer_from_error(grpc_answer *out, const attn_error *err, route_id rid);

/* Packs msg (a protobuf-c message) into out->bytes with code OK; on out of
 * memory out holds RESOURCE_EXHAUSTED instead. */
void grpc_answer_pack(grpc_answer *out, const ProtobufCMessage *msg);

/* Writes into buf the path of model name (version "" for any) followed by
 * tail ("", "/ready", "/infer"); returns 0, or -1 with out filled
 * (NOT_FOUND) when the name or version cannot be part of a path. */
int grpc_model_path(const char *name, const char *version, const char *tail, char *buf,
                    size_t cap, grpc_answer *out);

#endif

/*
 * metrics.h - the server's counters, in Prometheus text format.
 *
 * The HTTP layer reports every finished request (route, status, duration,
 * bytes in and out), the number in flight, which thread answered a request
 * with work (metrics_path) and the slow connections its reaper closed; the
 * store reports each sync of its directory; the handlers report each
 * attention request's waits, computation and size, the signals an autoscaler
 * follows.  GET /metrics renders them.
 * All functions are thread-safe.
 */
#ifndef ATTN_METRICS_H
#define ATTN_METRICS_H

#include <stddef.h>

#include "route/route.h"


void metrics_observe(route_id id, int status, double seconds, size_t bytes_in,
                     size_t bytes_out);
/* Which thread answered a request that is not answered by its I/O thread
 * as a matter of course (those with a body, and weight-set reads). */
typedef enum metrics_path {
    PATH_INLINE,            /* its I/O thread, the request being small */
    PATH_WORKER,            /* a worker */
    PATH_DEFERRED,          /* a worker, after its I/O thread found it not small */
    PATH_COUNT
} metrics_path;

/* Counts one request answered along path. */
void metrics_path_observe(metrics_path path);

void metrics_inflight_add(int delta);
long metrics_inflight(void);

/* gRPC inference calls received and not yet answered (grpc/grpc_front.h):
 * the gauge attn_grpc_inflight_calls.  They count in metrics_inflight too. */
void metrics_grpc_inflight_add(int delta);

/* Health/Watch calls open now (grpc/grpc_front.h): the gauge
 * attn_grpc_health_watches.  They are not requests in flight: a drain does
 * not wait for them. */
void metrics_grpc_watches_add(int delta);

/* Counts one connection the reaper closed for delivering its headers or
 * body too slowly. */
void metrics_slow_closed_add(void);

/* Counts one static body (a visualizer file) compressed for the answer
 * cache: once per body and coding while the server runs. */
void metrics_static_compressed_add(void);

/* Records the outcome of one weight-store sync (ok non-zero: it worked) and
 * what is loaded after it; /metrics shows the age of the last good one, the
 * sets and bytes, the good ones and the failures. */
void metrics_store_observe(int ok, size_t sets, size_t bytes);

/* The sequences' caches (sequence/sequence.h): live sequences and the bytes
 * their committed keys hold (deltas), steps committed, sequences dropped
 * (by idle timeout, or emptied by a start over), steps refused by a
 * limit, and keys a cache policy evicted. */
typedef enum { METRICS_SEQ_IDLE, METRICS_SEQ_RESTARTED, METRICS_SEQ_DROP_COUNT } metrics_seq_drop;
typedef enum {
    METRICS_SEQ_LIMIT_SEQUENCES, METRICS_SEQ_LIMIT_KEYS, METRICS_SEQ_LIMIT_MEMORY,
    METRICS_SEQ_LIMIT_COUNT
} metrics_seq_limit;
void metrics_sequences_live(long delta);
void metrics_sequence_bytes(long long delta);
void metrics_sequence_step(void);
void metrics_sequence_evicted(size_t keys);
void metrics_sequence_dropped(metrics_seq_drop why);
void metrics_sequence_refused(metrics_seq_limit which);

/* Counts one attention request under its model (the stored set's name, or
 * "attention") and protocol ("http", "grpc", ...; both borrowed): the time
 * it waited for a worker and a compute slot, its computation's own time
 * (compute < 0: it did not compute, as when it failed first) and its body's
 * size.  These are the autoscaling signals (autoscale.c). */
void metrics_attention_observe(const char *model, const char *protocol, double queue_wait,
                               double compute, size_t request_bytes);

/* A weight set named name was made (hold) or freed (unhold); the store
 * calls these for every set.  When the last set of a name is freed (after
 * a delete, once every request that held it has ended and been counted),
 * the name's series of the autoscaling signals and its per-model
 * statistics (model_stats.h) are dropped, so that deleted sets neither
 * grow the page nor keep a place a new set needs (model_holds.c). */
void metrics_model_hold(const char *name);
void metrics_model_unhold(const char *name);

/* Counts requests joining (+1) or leaving (-1) the queue for a worker. */
void metrics_queue_add(int delta);

/* Renders all metrics; returns text the caller frees with mem_free, and its
 * length in *len, or NULL when out of memory. */
char *metrics_render(size_t *len);

#endif

/*
 * model_stats.h - per-model inference statistics, in the shape of Triton's
 * statistics extension.
 *
 * Every attention request is counted under its model: the name of the
 * stored weight set it used, or "attention" (v1 requests with inline or no
 * weights count there, as v2 requests to the built-in model do).  A success
 * adds its times in four phases (waiting for a worker, reading the input,
 * computing, writing the answer); a failure adds its time to the failures.
 * The table is small (one entry per model used and not deleted since: a
 * model's entry goes with its last weight set, metrics_model_unhold) and
 * guarded by one mutex held for a few additions.
 */
#ifndef ATTN_MODEL_STATS_H
#define ATTN_MODEL_STATS_H

#include <stddef.h>
#include <stdint.h>

typedef struct model_stats_timing {
    uint64_t count, ns;
} model_stats_timing;

typedef struct model_stats {
    uint64_t last_inference_ms;     /* Unix time of the last success; 0: none */
    uint64_t inference_count;       /* inferences: the batch sizes of the successes, added */
    uint64_t execution_count;       /* successful requests */
    model_stats_timing success, fail, queue, compute_input, compute_infer, compute_output;
} model_stats;

/* The phases of one successful request, in seconds. */
typedef struct model_stats_sample {
    double queue, input, infer, output;
    size_t batch;
} model_stats_sample;

/* Notes in s the computation that started at start and ended at ran
 * (seconds of compute_now()) and took compute_ms of its own: that is its
 * infer time, and the rest (the wait for a compute slot) is queue time. */
void model_stats_computed(model_stats_sample *s, double start, double ran, double compute_ms);

/* Counts a success or a failure of model (borrowed).  When memory for a new
 * entry runs out the request is not counted. */
void model_stats_success(const char *model, const model_stats_sample *s);
void model_stats_failure(const char *model, double seconds);

/* Copies the statistics of model into *out (zeros when it has none). */
void model_stats_get(const char *model, model_stats *out);

#endif

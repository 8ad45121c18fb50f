/*
 * attention_reduce.h - statistics of the attention weights, computed in the kernel's sweep
 * without the Lq x Lk matrix: what interpretability research reads from attention over long
 * sequences (how peaked each query's weights are, which keys a head attends to, how much mass
 * goes to the first keys or to the neighbourhood of the query).
 *
 * Per (batch, head) and query row i, over its weights w[i][j] (masked keys, and keys after i
 * with causal, weigh 0):
 *   entropy      -sum_j w ln w, in nats;
 *   max_weight   max_j w, and argmax its key index (lowest on ties);
 *   sink         sum_{j < sink} w (the mass on the first `sink` keys);
 *   local        sum_{|i - j| <= local} w (query and key positions as indices);
 *   topk         the k largest weights, descending, and their key indices (lowest first on
 *                ties);
 * and per key j, received = sum_i w[i][j] (the query axis reduced).
 * A fully masked row has entropy, max_weight, sink and local 0, argmax -1, and its top-k
 * weights 0 with indices -1; a row with fewer than k keys it may see (causal rows near the
 * start, masks) pads its top-k the same way.  It adds nothing to received.
 *
 * Memory is O(n d) plus per-task scratch: the outputs (batch x heads x (lq or lk) numbers, k
 * per row for top-k), each row's softmax maximum and sum, and one copy of K packed for the
 * kernel path's score tiles (counted by attention_reduce_scratch_bytes).
 */
#ifndef ATTN_ATTENTION_REDUCE_H
#define ATTN_ATTENTION_REDUCE_H

#include <stddef.h>

#include "attention.h"

typedef struct attn_reduce {
    int entropy, max, received;
    int want_sink, want_local;  /* sink and local asked for (0 is a valid width) */
    size_t sink, local;
    size_t topk;                /* 0: not asked; else 1 .. lk */
    /* The position of query row 0 among the keys, for local: 0, or in a sequence's step
     * the keys cached before its queries (query_offset + lq <= lk). */
    size_t query_offset;
} attn_reduce;

/* Whether r asks for anything. */
int attention_reduce_any(const attn_reduce *r);

/* Numbers (doubles or int64) the reductions of job hold, all arrays together. */
size_t attention_reduce_numbers(const attn_reduce *r, const attn_job *job);

/* Bytes of scratch attention_reduce_run allocates for job, for the memory estimate. */
size_t attention_reduce_scratch_bytes(const attn_job *job);

/* Computes the reductions job->reduce asks for into result->reduced (allocated here; freed by
 * attention_result_free), from q (batch x lq x dk) and k (batch x lk x dk) after any
 * projection, before the scale: in double, or for a float32 job as float (qf, kf, when the
 * caller has them; else q and k rounded).  Runs on the compute pool.  Returns 0, 1 when a
 * score is not finite, or ERR_UNAVAILABLE when memory ran out; a stopped computation
 * returns 0 with the arrays incomplete, which the caller checks. */
int attention_reduce_run(const attn_job *job, const double *q, const double *k, const float *qf,
                         const float *kf, attn_result *result);

#endif

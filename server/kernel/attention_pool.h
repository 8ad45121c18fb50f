/*
 * attention_pool.h - attention weights pooled into a grid of blocks, for looking at long
 * sequences: the Lq x Lk matrix of a 32k-token request is 4 GiB in float32, its 4096 x 4096
 * summary 64 MiB, and a screen shows fewer pixels than that.
 *
 * A request asks for R x C cells (`attention_pool` on v1, the `attention_pool_*` parameters
 * on v2).  The blocks are br = ceil(Lq / R) queries by bc = ceil(Lk / C) keys, so the grid is
 * ceil(Lq / br) x ceil(Lk / bc) (at most R x C; fewer when a side is short), and each cell is
 * the maximum or the mean of the weights in its block, a masked weight counting as 0.  The
 * full matrix is never formed: scores are computed a few rows and keys at a time, in one
 * sweep that keeps each row's softmax statistics and its cells together, so memory is
 * O(n d + R C) per task.
 */
#ifndef ATTN_ATTENTION_POOL_H
#define ATTN_ATTENTION_POOL_H

#include <stddef.h>

#include "attention.h"

/* R and C may each be 1 .. ATTN_POOL_MAX_SIDE. */
#define ATTN_POOL_MAX_SIDE 4096

typedef enum { ATTN_POOL_MAX = 0, ATTN_POOL_MEAN = 1 } attn_pool_reduce;

typedef struct attn_pool {
    size_t rows, cols;          /* R and C asked for */
    attn_pool_reduce reduce;
    /* The window pooled: queries [q_start, q_end) and keys [k_start, k_end); an end of 0
     * means the last one.  Each row's softmax is over all its keys whatever the window. */
    size_t q_start, q_end, k_start, k_end;
} attn_pool;

/* The window of pool for lq queries and lk keys, its ends resolved. */
void attention_pool_window(const attn_pool *pool, size_t lq, size_t lk, size_t *q0, size_t *q1,
                           size_t *k0, size_t *k1);

/* The grid of pool for lq queries and lk keys (over its window): block sizes br x bc, grid
 * gr x gc. */
void attention_pool_grid(const attn_pool *pool, size_t lq, size_t lk, size_t *br, size_t *bc,
                         size_t *gr, size_t *gc);

/* Numbers (doubles) the pooled result of job holds: batch x heads x gr x gc. */
size_t attention_pool_cells(const attn_pool *pool, const attn_job *job);

/* Bytes of scratch attention_pool_run allocates for job, for the memory estimate. */
size_t attention_pool_scratch_bytes(const attn_job *job);

/* Pools the attention weights of every (batch, head) of job into out (batch x heads x gr x
 * gc, row-major), from q (batch x lq x dk) and k (batch x lk x dk): the queries and keys after
 * any projection, before the scale.  job gives the shapes, heads, scale, mask and causal;
 * its q, k, v, x and weights are not read.  Runs on the compute pool.  Returns 0, 1 when a
 * score is not finite, or ERR_UNAVAILABLE when scratch cannot be allocated; a stopped
 * computation (compute_stopped) returns 0 with out incomplete, which the caller checks. */
int attention_pool_run(const attn_job *job, const attn_pool *pool, const double *q,
                       const double *k, double *out);

#endif

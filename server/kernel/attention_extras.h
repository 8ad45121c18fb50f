/*
 * attention_extras.h - q and k after the projections (job->want_qk), the pooled attention
 * weights (job->pool) and their reductions (job->reduce), formed after the output by
 * attention_run.
 */
#ifndef ATTN_ATTENTION_EXTRAS_H
#define ATTN_ATTENTION_EXTRAS_H

#include <stddef.h>

#include "attention.h"

/* Bytes the extras of job allocate at most (0 when it asks for none), for the memory
 * estimate.  Returns 0, or -1 when the count overflows. */
int attention_extras_bytes(const attn_job *job, size_t *bytes);

/* Fills result->q and result->k (want_qk), result->pooled (pool) and result->reduced
 * (reduce).  Returns 0, 1 when a
 * score is not finite, or ERR_UNAVAILABLE when memory ran out; on failure result holds none
 * of them.  A stopped computation returns 0 with them incomplete: the caller checks
 * compute_stopped. */
int attention_extras_run(const attn_job *job, attn_result *result);

#endif

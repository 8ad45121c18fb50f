/*
 * admission.h - whether a computation may start.
 *
 * Every computation, whichever protocol asked for it, is admitted under the
 * same limits (--max-elements, --max-request-memory) and reserves what it
 * will hold in the process memory budget (budget.h) before it allocates.
 */
#ifndef ATTN_ADMISSION_H
#define ATTN_ADMISSION_H

#include <stddef.h>

#include "attention.h"
#include "config.h"
#include "error.h"

/* Admits a computation: applies cfg's limits (--max-elements on the answer's
 * result_elements, --max-request-memory on the job's working memory plus
 * bytes_per_number for each answered number), sets *response_bytes to the
 * latter, and reserves the working memory and the answer in the process
 * memory budget.  attention_hint says how to drop the attention matrix from
 * the answer ("set return_attention to false"); it is offered when
 * job->want_attention.  Returns 0 with *reserved_bytes set, which the caller
 * hands back with admission_release once the answer is built; or
 * ERR_TOO_LARGE (past a limit, or more than the whole budget) or
 * ERR_UNAVAILABLE (the budget is full now) with err filled and nothing
 * reserved. */
int admission_admit(const server_config *cfg, const attn_job *job, size_t result_elements,
                    size_t bytes_per_number, const char *attention_hint, size_t *response_bytes,
                    size_t *reserved_bytes, attn_error *err);

/* Hands back what admission_admit reserved (0 is allowed). */
void admission_release(size_t reserved_bytes);

#endif

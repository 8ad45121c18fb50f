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

#include "kernel/attention.h"
#include "core/config.h"
#include "core/error.h"

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

/* Returned by admission_io_thread_fits and admission_run (a positive value,
 * never an ERR_* code): the request must not be answered on an I/O thread;
 * the handler answers nothing (api_response.deferred) and the HTTP layer
 * hands the request to a worker, which decodes it again. */
#define ADMISSION_DEFER 1

/* Arithmetic worth of writing one number of the answer (finding its
 * shortest digits costs about as much as this many operations of a small
 * product on one core), so that a job with a large answer and little
 * arithmetic is not taken for a small one. */
#define ADMISSION_FLOPS_PER_NUMBER 64.0

/* For a request read on an I/O thread (which must never hold its other
 * connections up for long): 0 when job, with result_elements numbers to
 * answer, is small (attention_job_flops plus ADMISSION_FLOPS_PER_NUMBER per
 * number below ATTENTION_SMALL_FLOPS), else ADMISSION_DEFER. */
int admission_io_thread_fits(const attn_job *job, size_t result_elements);

/* Runs attention_run for an admitted job.  On an I/O thread (io_thread
 * non-zero) it never waits: it runs only when a compute slot is free right
 * now (compute_slot_try_hold) and returns ADMISSION_DEFER otherwise, with
 * result untouched.  Returns what attention_run returns. */
int admission_run(const attn_job *job, int io_thread, attn_result *result, attn_error *err);

#endif

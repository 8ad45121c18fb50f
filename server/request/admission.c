/*
 * admission.c - whether a computation may start: the per-request limits and
 * the process memory budget, the same for every protocol (v1 and v2).
 */
#include "admission.h"

#include "core/budget.h"
#include "core/compute.h"
#include "core/mem.h"

int admission_admit(const server_config *cfg, const attn_job *job, size_t result_elements,
                    size_t bytes_per_number, const char *attention_hint, size_t *response_bytes,
                    size_t *reserved_bytes, attn_error *err)
{
    size_t work_bytes = 0;
    const char *hint = job->want_attention ? attention_hint : "";
    const char *sep = job->want_attention ? " or " : "";
    *response_bytes = 0;
    *reserved_bytes = 0;
    if (result_elements > cfg->max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The answer would hold %zu numbers, more than the server's limit of %zu "
                         "(--max-elements); send fewer tokens%s%s.", result_elements,
                         cfg->max_elements, job->want_attention ? ", or " : "", hint);
    if (attention_job_bytes(job, &work_bytes) != 0 ||
        mem_mul(result_elements, bytes_per_number, 1, response_bytes) != 0 ||
        work_bytes + *response_bytes > cfg->max_request_memory)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "Computing this request needs about %zu MiB, more than the server's "
                         "limit of %zu MiB per request (--max-request-memory); send fewer "
                         "tokens%s%s.", (work_bytes + *response_bytes) >> 20,
                         cfg->max_request_memory >> 20, sep, hint);
    /* The computation's memory comes out of the process budget (budget.h). */
    size_t bytes = work_bytes + *response_bytes;
    if (budget_reserve(bytes) != 0) {
        int later = budget_could_fit(bytes);
        return error_set(err, later ? ERR_UNAVAILABLE : ERR_TOO_LARGE,
                         later ? "overloaded" : "request_too_large", NULL,
                         "Computing this request needs about %zu MiB, more than the server's "
                         "memory budget (--max-memory) %s.", bytes >> 20,
                         later ? "has free now; retry shortly" : "holds");
    }
    *reserved_bytes = bytes;
    return 0;
}

void admission_release(size_t reserved_bytes)
{
    budget_release(reserved_bytes);
}

int admission_io_thread_fits(const attn_job *job, size_t result_elements)
{
    double work = attention_job_flops(job) + ADMISSION_FLOPS_PER_NUMBER * (double)result_elements;
    return work < ATTENTION_SMALL_FLOPS ? 0 : ADMISSION_DEFER;
}

int admission_run(const attn_job *job, int io_thread, attn_result *result, attn_error *err)
{
    if (io_thread && compute_slot_try_hold() != 0)
        return ADMISSION_DEFER;
    int rc = attention_run(job, result, err);
    if (io_thread)
        compute_slot_release();
    return rc;
}

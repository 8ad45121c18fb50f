/*
 * attention_extras.c - what a request may ask for beside the output, for looking inside the
 * computation: q and k after the projections (return_qk, for the visualizer's neuron view),
 * the attention weights pooled into blocks (attention_pool, for long sequences) and their
 * reductions (attention_reduce.h).
 *
 * Both need q and k as the kernels saw them.  The kernels keep them only in packed, per-task
 * pieces, so they are formed again here: for a request with q, k and v they are its own
 * (rounded to float32 for a float32 job); with x and weights, x Wq + bq and context Wk + bk,
 * computed in the job's precision as the kernels compute them.  That is one more pair of
 * projections, small beside the attention itself, and it leaves the kernels untouched.
 * The weights of a set of either element type (weights.h) are taken as attention.c takes
 * them: a float64 projection widens a float32 set's exactly, a float32 one uses them as they
 * are (or rounds a float64 set's).
 */
#include "attention_extras.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "attention_pool.h"
#include "attention_reduce.h"
#include "core/mem.h"

/* Numbers of q (batch x lq x dk) and k (batch x lk x dk). */
static void qk_numbers(const attn_job *job, size_t *nq, size_t *nk)
{
    *nq = job->batch * job->lq * job->dk;
    *nk = job->batch * job->lk * job->dk;
}

/* Whether the reductions are all job asks of the extras and can read a float32 job's q and
 * k as the request gave them, with no double copies (the long-context case). */
static int reduce_in_place(const attn_job *job)
{
    return job->pool == NULL && !job->want_qk && job->weights == NULL &&
           job->dtype == ATTN_FLOAT32 && job->q32 != NULL && job->k32 != NULL;
}

int attention_extras_bytes(const attn_job *job, size_t *bytes)
{
    *bytes = 0;
    int reduce = attention_reduce_any(job->reduce);
    if (job->pool == NULL && !job->want_qk && !reduce)
        return 0;
    if (reduce_in_place(job)) {
        *bytes = attention_reduce_numbers(job->reduce, job) * sizeof(double) +
                 attention_reduce_scratch_bytes(job);
        return 0;
    }
    size_t nq, nk, n;
    if (mem_mul(job->batch, job->lq + job->lk, job->dk, &n) != 0)
        return -1;
    qk_numbers(job, &nq, &nk);
    /* q and k in double; a float32 projection also holds float copies of its inputs, and a
     * float64 one with a float32 set double copies of wq and wk */
    size_t total = n * sizeof(double) * (job->dtype == ATTN_FLOAT32 ? 2 : 1);
    if (job->weights != NULL)
        total += (job->batch * (job->lq + job->lk) * (job->weights->d_in + job->weights->d_ctx) +
                  (job->weights->d_in + job->weights->d_ctx) * job->dk) * sizeof(float);
    if (job->weights != NULL && weights_is_f32(job->weights) && job->dtype != ATTN_FLOAT32)
        total += (job->weights->d_in + job->weights->d_ctx + 2) * job->dk * sizeof(double);
    if (job->pool != NULL)
        total += attention_pool_cells(job->pool, job) * sizeof(double) +
                 attention_pool_scratch_bytes(job);
    if (reduce)
        total += attention_reduce_numbers(job->reduce, job) * sizeof(double) +
                 attention_reduce_scratch_bytes(job);
    *bytes = total;
    return 0;
}

/* y (rows x dk) = a (rows x width) W (width x dk) + b, in double, W and b being parts wp
 * and bp of w (a float32 set's widened first).  Returns 0 or -1 when memory ran out. */
static int project_d(const double *a, size_t rows, size_t width, const attn_weights *w,
                     weights_part wp, weights_part bp, size_t dk, double *y)
{
    const double *wm = weights_array(w, wp), *b = weights_array(w, bp);
    double *wide = NULL, *bwide = NULL;
    if (weights_is_f32(w)) {
        const float *bf = weights_array_f32(w, bp);
        wide = mem_malloc(width * dk * sizeof(double));
        bwide = bf != NULL ? mem_malloc(dk * sizeof(double)) : NULL;
        if (wide == NULL || (bf != NULL && bwide == NULL)) {
            mem_free(wide);
            mem_free(bwide);
            return -1;
        }
        for (size_t i = 0; i < width * dk; i++)
            wide[i] = weights_array_f32(w, wp)[i];
        for (size_t c = 0; bf != NULL && c < dk; c++)
            bwide[c] = bf[c];
        wm = wide;
        b = bwide;
    }
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dk; c++)
            y[r * dk + c] = b != NULL ? b[c] : 0.0;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)dk, (int)width, 1.0,
                a, (int)width, wm, (int)dk, 1.0, y, (int)dk);
    mem_free(wide);
    mem_free(bwide);
    return 0;
}

/* The same in float32 arithmetic, as a float32 job's kernels compute it (a float32 set's
 * arrays as they are, a float64 set's rounded); y is widened. */
static int project_f(const double *a, size_t rows, size_t width, const attn_weights *w,
                     weights_part wp, weights_part bp, size_t dk, double *y)
{
    int f32 = weights_is_f32(w);
    float *af = mem_malloc(rows * width * sizeof(float));
    float *wf = f32 ? NULL : mem_malloc(width * dk * sizeof(float));
    float *yf = mem_malloc(rows * dk * sizeof(float));
    int rc = -1;
    if (af != NULL && (f32 || wf != NULL) && yf != NULL) {
        for (size_t i = 0; i < rows * width; i++)
            af[i] = (float)a[i];
        for (size_t i = 0; !f32 && i < width * dk; i++)
            wf[i] = (float)weights_array(w, wp)[i];
        const float *wm = f32 ? weights_array_f32(w, wp) : wf;
        int has_b = weights_has(w, bp);
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < dk; c++)
                yf[r * dk + c] = has_b ? (float)weights_get(w, bp, c) : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)dk, (int)width,
                    1.0f, af, (int)width, wm, (int)dk, 1.0f, yf, (int)dk);
        for (size_t i = 0; i < rows * dk; i++)
            y[i] = yf[i];
        rc = 0;
    }
    mem_free(af);
    mem_free(wf);
    mem_free(yf);
    return rc;
}

/* Fills q and k (allocated by the caller) as the kernels see them.  Returns 0 or -1 when
 * memory ran out. */
static int form_qk(const attn_job *job, double *q, double *k)
{
    size_t nq, nk;
    qk_numbers(job, &nq, &nk);
    int f32 = job->dtype == ATTN_FLOAT32;
    const attn_weights *w = job->weights;
    if (w == NULL) {
        for (size_t i = 0; i < nq; i++)
            q[i] = job->q32 != NULL ? job->q32[i] : f32 ? (double)(float)job->q[i] : job->q[i];
        for (size_t i = 0; i < nk; i++)
            k[i] = job->k32 != NULL ? job->k32[i] : f32 ? (double)(float)job->k[i] : job->k[i];
        return 0;
    }
    const double *ctx = job->context != NULL ? job->context : job->x;
    size_t rq = job->batch * job->lq, rk = job->batch * job->lk;
    if (!f32)
        return project_d(job->x, rq, w->d_in, w, WEIGHTS_WQ, WEIGHTS_BQ, job->dk, q) != 0 ||
               project_d(ctx, rk, w->d_ctx, w, WEIGHTS_WK, WEIGHTS_BK, job->dk, k) != 0 ? -1 : 0;
    return project_f(job->x, rq, w->d_in, w, WEIGHTS_WQ, WEIGHTS_BQ, job->dk, q) != 0 ||
           project_f(ctx, rk, w->d_ctx, w, WEIGHTS_WK, WEIGHTS_BK, job->dk, k) != 0 ? -1 : 0;
}

int attention_extras_run(const attn_job *job, attn_result *result)
{
    int reduce = attention_reduce_any(job->reduce);
    if (job->pool == NULL && !job->want_qk && !reduce)
        return 0;
    if (reduce_in_place(job)) {
        /* as below: without the output, a non-finite input is found here */
        size_t nq, nk;
        qk_numbers(job, &nq, &nk);
        for (size_t i = 0; job->skip_output && i < nq + nk; i++)
            if (!isfinite(i < nq ? job->q32[i] : job->k32[i - nq]))
                return 1;
        return attention_reduce_run(job, NULL, NULL, job->q32, job->k32, result);
    }
    size_t nq, nk;
    qk_numbers(job, &nq, &nk);
    double *q = mem_malloc(nq * sizeof(double)), *k = mem_malloc(nk * sizeof(double));
    int rc = ERR_UNAVAILABLE;
    if (q == NULL || k == NULL || form_qk(job, q, k) != 0)
        goto fail;
    /* A projection past the precision's range.  With the output computed, its own check
     * finds it (an infinite q or k makes every output number of its rows non-finite). */
    for (size_t i = 0; job->skip_output && i < nq + nk; i++)
        if (!isfinite(i < nq ? q[i] : k[i - nq])) {
            rc = 1;
            goto fail;
        }
    if (job->pool != NULL) {
        result->pooled = mem_malloc(attention_pool_cells(job->pool, job) * sizeof(double));
        if (result->pooled == NULL)
            goto fail;
        rc = attention_pool_run(job, job->pool, q, k, result->pooled);
        if (rc != 0)
            goto fail;
    }
    if (reduce && (rc = attention_reduce_run(job, q, k, NULL, NULL, result)) != 0)
        goto fail;
    if (job->want_qk) {
        result->q = q;
        result->k = k;
        return 0;
    }
    mem_free(q);
    mem_free(k);
    return 0;
fail:
    mem_free(q);
    mem_free(k);
    return rc;
}

/*
 * attention.h - the attention math: projections, scaled dot-product attention
 * per head, and the output projection, on dense row-major arrays.
 *
 * This module knows nothing of JSON or HTTP.  It receives an attn_job whose
 * shapes the request model (attention_request) has already checked against each
 * other, computes in float64 or float32 through OpenBLAS, and writes into
 * result buffers that the caller frees with attention_result_free.  Only the
 * kernel module (server/kernel/) includes cblas.h; the rest of the server
 * reaches OpenBLAS through the functions declared here and in blas_setup.h.
 */
#ifndef ATTN_ATTENTION_H
#define ATTN_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "weights.h"

typedef enum { ATTN_FLOAT64 = 0, ATTN_FLOAT32 = 1 } attn_dtype;

struct attn_pool;                       /* attention_pool.h */
struct attn_reduce;                     /* attention_reduce.h */

/* One attention computation.  Arrays are row-major; "batch x" axes have
 * batch >= 1 (an unbatched request has batch = 1).  All pointers are borrowed
 * for the duration of attention_run. */
typedef struct attn_job {
    size_t batch, lq, lk;
    size_t heads;               /* >= 1; dk and dv are split evenly */
    size_t dk, dv;              /* widths of q/k and of v, all heads together */
    /* Either q/k/v are given (weights == NULL) ... */
    const double *q;            /* batch x lq x dk */
    const double *k;            /* batch x lk x dk */
    const double *v;            /* batch x lk x dv */
    /* A float32 job may give any of q, k and v as float instead (the double pointer
     * then NULL): the kernels read it in place, where a double input is first copied
     * to float.  The v2 path passes binary FP32 tensors this way, so that they reach
     * the kernels without a round trip through double. */
    const float *q32, *k32, *v32;
    /* ... or x (and optionally context) with weights. */
    const double *x;            /* batch x lq x weights->d_in */
    const double *context;      /* NULL (self-attention) or batch x lk x weights->d_ctx */
    const attn_weights *weights;
    const unsigned char *mask;  /* NULL, or (mask_batched ? batch : 1) x lq x lk; 1 = may attend */
    int mask_batched;
    int causal;                 /* query i attends only to keys j <= i */
    double scale;               /* multiplies q k^T */
    attn_dtype dtype;
    /* compute_precision bfloat16, on a float32 job: Q.K^T and P.V of the attention as
     * products of bfloat16 numbers summed in float32, q, k and v (after any projection)
     * rounded to bfloat16 once and the weights P before P.V; the softmax, its maxima and
     * sums, the projections, the pooled weights and the reductions stay float32
     * (docs/numbers.md gives the error).  0 for float64 jobs. */
    int bf16;
    int want_attention;         /* fill result->attention */
    /* A float32 job's output goes to result->output_f32 as the kernels formed it,
     * rather than widened to result->output: for answers sent as float32 anyway. */
    int output_f32;
    /* Leave result->output NULL and compute only the extras: for a request that asks for
     * neither the output nor the full matrix (v2 outputs naming only a pooled attention,
     * q or k), where the output would be most of the work and thrown away. */
    int skip_output;
    /* Extras (attention_extras.c), computed after the output: */
    const struct attn_pool *pool; /* NULL, or fill result->pooled (never with want_attention) */
    int want_qk;                /* fill result->q and result->k */
    const struct attn_reduce *reduce; /* NULL, or fill result->reduced (attention_reduce.h) */
} attn_job;

/* The reductions of the weights a job's reduce asks for (attention_reduce.h), each NULL
 * unless asked: per query row batch x heads x lq, per key (received) batch x heads x lk,
 * top-k batch x heads x lq x k. */
typedef struct attn_reduced {
    double *entropy, *max_weight, *sink, *local, *received, *topk_weights;
    int64_t *argmax, *topk_indices;
} attn_reduced;

/* The attention weights come in the job's precision: a float64 job fills
 * `attention`, a float32 job `attention_f32` (formed in float32 throughout, as
 * NumPy's float32 would, and answered as float32 without a widening copy).
 * The output is widened to double unless the job asks for it as float32. */
typedef struct attn_result {
    double *output;             /* batch x lq x d_out, or NULL with job->output_f32 */
    float *output_f32;          /* float32 jobs with output_f32: batch x lq x d_out */
    double *attention;          /* float64 jobs: batch x heads x lq x lk, or NULL */
    float *attention_f32;       /* float32 jobs: batch x heads x lq x lk, or NULL */
    double *pooled;             /* job->pool: batch x heads x gr x gc (attention_pool.h), or NULL */
    attn_reduced reduced;       /* job->reduce */
    double *q, *k;              /* job->want_qk: batch x lq x dk and batch x lk x dk, after the
                                 * projections, before the scale, in the job's precision */
    size_t d_out;
    double compute_ms;          /* attention_run's own time, less any wait for a compute slot */
} attn_result;

/* Work below this many floating-point operations is small: it runs on its
 * caller's thread alone (handing it to a helper would cost more than it
 * saves), and a request whose whole job is below it may be answered on the
 * I/O thread that read it (http.c).  At the single-thread rates of small
 * products, 4 MFLOP is about a millisecond of arithmetic. */
#define ATTENTION_SMALL_FLOPS 4e6

/* Keys the query rows [i0, i0 + nq) of job may see, nq >= 1: all of them, or with causal
 * up to the last row's own position.  The sweeps that pool or reduce the weights stop
 * there. */
static inline size_t attention_keys_seen(const attn_job *job, size_t i0, size_t nq)
{
    size_t last = i0 + nq - 1;
    return job->causal && last + 1 < job->lk ? last + 1 : job->lk;
}

/* Whether query row i of batch b may see some key: with causal, the keys up to its own
 * position; with a mask, those of them the mask lets through.  Every path tells a fully
 * masked row from an overflow by this: a row whose weights all came out 0 (no score it may
 * see was above -Inf) is fully masked, and yields zeros, only where this says no; where it
 * says yes, each score the row may see overflowed to -Inf (or was NaN), and the job is
 * not_finite (docs/numbers.md).  Rare, so a plain loop over the mask row. */
static inline int attention_row_sees_key(const attn_job *job, size_t b, size_t i)
{
    size_t n = job->causal && i + 1 < job->lk ? i + 1 : job->lk;
    if (job->mask == NULL)
        return n > 0;
    const unsigned char *m = job->mask + ((job->mask_batched ? b : 0) * job->lq + i) * job->lk;
    for (size_t j = 0; j < n; j++)
        if (m[j])
            return 1;
    return 0;
}

/* Numbers of q and k together (batch x (lq + lk) x dk) as a float32 job's float copies of
 * them hold them (attention_floats_pair), 0 for a float64 job: the pooled weights and the
 * reductions compute in float32 from q and k as the kernels had them. */
static inline size_t attention_float_qk_count(const attn_job *job)
{
    return job->dtype == ATTN_FLOAT32 ? job->batch * (job->lq + job->lk) * job->dk : 0;
}

/* The precision job computes in, as requests name it (compute_precision): "float64",
 * "float32" or "bfloat16". */
static inline const char *attention_precision_name(const attn_job *job)
{
    return job->dtype == ATTN_FLOAT64 ? "float64" : job->bf16 ? "bfloat16" : "float32";
}

/* Floating-point operations of job: the projections, the scores and their
 * weighted sum (half of both when causal), and the output projection.  An
 * estimate from the shapes alone, for deciding where a job runs. */
double attention_job_flops(const attn_job *job);

/* Width of the output rows of job: weights->d_out with weights, else dv. */
size_t attention_output_width(const attn_job *job);

/* Bytes of memory attention_run will allocate for job, result buffers
 * included, so that a caller can refuse a request before allocating.
 * Returns 0 and sets *bytes, or -1 if the size overflows. */
int attention_job_bytes(const attn_job *job, size_t *bytes);

/* Computes job.  On success returns 0 and fills result, whose buffers the
 * caller frees with attention_result_free; with job->want_attention, the
 * weights are in result->attention (float64) or result->attention_f32
 * (float32).  On failure returns a negative
 * ERR_* code with err filled (out of memory: ERR_UNAVAILABLE; a score, a
 * projection or an output that is not finite in the job's precision, i.e. a
 * result that really is past its range: ERR_BAD_REQUEST, code "not_finite")
 * and leaves result empty.  Intermediate sums that overflow on the way to a
 * finite result are not an error.  A fully masked query row yields zeros in both output and
 * attention.  Safe to call from several threads at once. */
int attention_run(const attn_job *job, attn_result *result, attn_error *err);

/* One projection of a weight set on its own: out (rows x the part's columns) = x (rows x
 * its rows) . w[part] + its bias (WEIGHTS_WQ, WK, WV or WO), in dtype's precision, out
 * being float for ATTN_FLOAT32 and double otherwise; for a caller that keeps projections
 * (a sequence's cache of keys and values) or applies the output projection itself.  x is
 * double, or for ATTN_FLOAT32 may be given as float (x32, x then NULL).  Returns 0,
 * ERR_UNAVAILABLE when memory ran out or the computation was stopped (compute_stopped), or
 * 1 when a number of out is not finite in that precision.  Runs on the compute pool as
 * attention_run's projections do. */
int attention_project(const attn_weights *w, weights_part part, attn_dtype dtype,
                      const double *x, const float *x32, size_t rows, void *out);

/* Frees the buffers of result (which may be NULL or empty) and zeroes it. */
void attention_result_free(attn_result *result);

/* The BLAS in use: configuration string, core name and thread count.
 * Strings are truncated to fit. */
void attention_blas_describe(char *config, size_t config_len, char *core, size_t core_len,
                             int *threads);

/* Chooses the instruction-set path of the attention kernel: "auto" (the
 * widest this CPU runs), "amx_bf16", "avx512_bf16", "avx512", "avx2" or "portable".  Call once at
 * start-up, before any computation.  Returns 0, or -1 with a message in err
 * (an unknown name, or a path this CPU cannot run), the choice unchanged. */
int attention_kernel_select(const char *name, char *err, size_t errlen);

/* The name of the kernel path in use. */
const char *attention_kernel_path(void);

/* The names of the paths this CPU can run, widest first, in names[0..max);
 * returns how many. */
size_t attention_kernel_available(const char **names, size_t max);

/* The second-level cache the kernel sizes its blocks of query rows by, in
 * bytes; *reported (may be NULL) is 1 when the CPU reported it, 0 when it is
 * assumed. */
size_t attention_kernel_l2_bytes(int *reported);

/* The query rows per block the kernel takes for heads of head_dim numbers
 * of `size` bytes (4 or 8) on this CPU. */
size_t attention_kernel_block_rows(size_t head_dim, size_t size);

/* Sets the threads OpenBLAS uses for one product. */
void attention_blas_set_threads(int threads);

#endif

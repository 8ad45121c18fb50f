/*
 * attention_pool.c - attention weights pooled into blocks without the full matrix (see
 * attention_pool.h).
 *
 * A task is one (batch, head) and a band of grid rows, so that no two tasks write the same
 * cell.  Within it, POOL_ROWS queries at a time, one sweep over the keys, POOL_KEYS at a
 * time: the scores of the tile (one product with OpenBLAS, reading q and k in place), each
 * row's running maximum m and sum l of exp(s - m) as the online softmax keeps them, and
 * the tile's exponentials folded into the row's cells of the window.  A cell's value is
 * relative to the maximum of its row when it was last written (its `ref`), and is brought
 * to the new maximum only when a later tile writes it again (scaling by exp(ref - m) keeps
 * both a maximum and a sum right), so a rising maximum never rescans the row.  When the
 * row is done, cell / l * exp(ref - m) is its weight, folded into the task's grid row.
 * A row's cells cost POOL_ROWS x gc numbers of scratch; the Lq x Lk matrix is never held.
 *
 * Arithmetic is in the job's precision (attention_pool_impl.inc is instantiated for both),
 * as the kernels compute the output, with each row's maximum and sum kept in double.  The
 * exponentials of the scores are attention_exp.c's vector ones; those of the cells are the
 * kernel path's (attention_fused.h), which takes -Inf.  The
 * causal mask ends each row's keys at its own position, and key tiles past a row group's
 * last query are not computed.
 */
#include "attention_pool.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "attention_exp.h"
#include "attention_floats.h"
#include "attention_fused.h"
#include "core/compute.h"
#include "core/mem.h"

/* Queries and keys per score tile: 64 x 512 doubles is 256 KiB, which stays in L2. */
#define POOL_ROWS 64
#define POOL_KEYS 512
/* Grid rows per task are chosen so that a task has at least this many queries. */
#define POOL_TASK_ROWS 256

void attention_pool_window(const attn_pool *pool, size_t lq, size_t lk, size_t *q0, size_t *q1,
                           size_t *k0, size_t *k1)
{
    *q0 = pool->q_start;
    *q1 = pool->q_end != 0 ? pool->q_end : lq;
    *k0 = pool->k_start;
    *k1 = pool->k_end != 0 ? pool->k_end : lk;
}

void attention_pool_grid(const attn_pool *pool, size_t lq, size_t lk, size_t *br, size_t *bc,
                         size_t *gr, size_t *gc)
{
    size_t q0, q1, k0, k1;
    attention_pool_window(pool, lq, lk, &q0, &q1, &k0, &k1);
    size_t nq = q1 - q0, nk = k1 - k0;
    *br = (nq + pool->rows - 1) / pool->rows;
    *bc = (nk + pool->cols - 1) / pool->cols;
    *gr = (nq + *br - 1) / *br;
    *gc = (nk + *bc - 1) / *bc;
}

size_t attention_pool_cells(const attn_pool *pool, const attn_job *job)
{
    size_t br, bc, gr, gc;
    attention_pool_grid(pool, job->lq, job->lk, &br, &bc, &gr, &gc);
    return job->batch * job->heads * gr * gc;
}

/* Scratch bytes per compute slot: each row's maximum and sum (double), a score tile, and
 * each row's cells of the window with their references (the job's precision). */
static size_t slot_bytes(const attn_job *job, const attn_pool *pool)
{
    size_t br, bc, gr, gc;
    attention_pool_grid(pool, job->lq, job->lk, &br, &bc, &gr, &gc);
    size_t real = job->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    return 2 * (size_t)POOL_ROWS * sizeof(double) +
           ((size_t)POOL_ROWS * POOL_KEYS + 2 * (size_t)POOL_ROWS * gc) * real;
}

size_t attention_pool_scratch_bytes(const attn_job *job)
{
    return (size_t)compute_threads() * slot_bytes(job, job->pool) +
           attention_float_qk_count(job) * sizeof(float);
}

typedef struct pool_ctx {
    const attn_job *job;
    const attn_pool *pool;
    const void *q, *k;          /* the job's precision (double or float) */
    double *out;
    size_t br, bc, gr, gc;
    size_t q0, q1, k0, k1;      /* the window */
    size_t bands;               /* row bands per (batch, head) */
    size_t band_rows;           /* grid rows per band */
    void *scratch;              /* slot_bytes() per slot */
    size_t stride;
    _Atomic int not_finite;
} pool_ctx;

#define REAL double
#define SFX d
#define GEMM cblas_dgemm
#define EXP exp
#define MAXV attention_max_d
#define MAXMV attention_max_masked_d
#define EXPV attention_exp_shift_d
#define EXPMV attention_exp_shift_masked_d
#define FUSED_EXP exp_d
#include "attention_pool_impl.inc"

#define REAL float
#define SFX f
#define GEMM cblas_sgemm
#define EXP expf
#define MAXV attention_max_f
#define MAXMV attention_max_masked_f
#define EXPV attention_exp_shift_f
#define EXPMV attention_exp_shift_masked_f
#define FUSED_EXP exp_f
#include "attention_pool_impl.inc"

int attention_pool_run(const attn_job *job, const attn_pool *pool, const double *q,
                       const double *k, double *out)
{
    pool_ctx c = {.job = job, .pool = pool, .q = q, .k = k, .out = out};
    attention_pool_grid(pool, job->lq, job->lk, &c.br, &c.bc, &c.gr, &c.gc);
    attention_pool_window(pool, job->lq, job->lk, &c.q0, &c.q1, &c.k0, &c.k1);
    c.band_rows = (POOL_TASK_ROWS + c.br - 1) / c.br;
    c.bands = (c.gr + c.band_rows - 1) / c.band_rows;
    memset(out, 0, attention_pool_cells(pool, job) * sizeof(double));
    size_t tasks = job->batch * job->heads * c.bands;
    unsigned slots = compute_threads();
    if (slots > tasks)
        slots = (unsigned)tasks;
    if (slots == 0)
        slots = 1;
    /* a float32 job is pooled in float32, from q and k as the kernels had them */
    int f32 = job->dtype == ATTN_FLOAT32;
    float *qf = NULL;
    if (f32) {
        qf = attention_floats_pair(q, job->batch * job->lq * job->dk, k,
                                   job->batch * job->lk * job->dk);
        if (qf == NULL)
            return ERR_UNAVAILABLE;
        c.q = qf;
        c.k = qf + job->batch * job->lq * job->dk;
    }
    c.stride = slot_bytes(job, pool);
    c.scratch = mem_malloc((size_t)slots * c.stride);
    if (c.scratch != NULL)
        compute_parallel(tasks, slots, f32 ? pool_task_f : pool_task_d, &c);
    int rc = c.scratch == NULL ? ERR_UNAVAILABLE : c.not_finite ? 1 : 0;
    mem_free(c.scratch);
    mem_free(qf);
    return rc;
}

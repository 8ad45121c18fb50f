/*
 * attention_pool.c - attention weights pooled into blocks without the full matrix (see
 * attention_pool.h).
 *
 * A task is one (batch, head) and a band of grid rows, so that no two tasks write the same
 * cell.  Within it, POOL_ROWS queries at a time: a first sweep over the keys, POOL_KEYS at a
 * time, finds each row's maximum score and the sum of its exponentials (as the online
 * softmax does); a second sweep computes the scores again, turns them into weights and folds
 * them into the cells.  Computing the scores twice costs a second Q Kᵀ, and saves holding a
 * row of Lk weights per query: at 32k tokens that is the difference between 128 KiB of
 * scratch per task and 8 GiB.
 *
 * Arithmetic is float64 whatever the job's precision: a float32 job's q and k arrive rounded
 * to float32, and its pooled weights are then within float32's tolerance of a float64
 * reference of those inputs.  The causal mask skips key blocks past a row band's last query.
 */
#include "attention_pool.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "compute.h"
#include "mem.h"

/* Queries and keys per score block: 64 x 512 doubles is 256 KiB, which stays in L2. */
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

/* Scratch per compute slot: a score block, a packed block of queries and one of keys, and
 * each row's maximum and sum. */
static size_t slot_numbers(const attn_job *job)
{
    size_t dh = job->dk / job->heads;
    return (size_t)POOL_ROWS * POOL_KEYS + (size_t)POOL_ROWS * dh + (size_t)POOL_KEYS * dh +
           2 * (size_t)POOL_ROWS;
}

size_t attention_pool_scratch_bytes(const attn_job *job)
{
    return (size_t)compute_threads() * slot_numbers(job) * sizeof(double);
}

typedef struct pool_ctx {
    const attn_job *job;
    const attn_pool *pool;
    const double *q, *k;
    double *out;
    size_t br, bc, gr, gc;
    size_t q0, q1, k0, k1;      /* the window */
    size_t bands;               /* row bands per (batch, head) */
    size_t band_rows;           /* grid rows per band */
    double *scratch;            /* slot_numbers() per slot */
    size_t stride;
    _Atomic int not_finite;
} pool_ctx;

/* Copies rows [r0, r0 + n) of head h of a (x dk, row-major) into dst (n x dh). */
static void pack_head(const double *a, size_t dk, size_t dh, size_t h, size_t r0, size_t n,
                      double *dst)
{
    for (size_t r = 0; r < n; r++)
        memcpy(dst + r * dh, a + (r0 + r) * dk + h * dh, dh * sizeof(double));
}

/* Scores s[i][j] = scale q_i . k_j of rows [i0, i0 + nq) and keys [j0, j0 + nk) of one
 * (batch, head), with a masked score set to -INFINITY. */
static void score_block(const pool_ctx *c, size_t b, size_t i0, size_t nq, size_t j0,
                        size_t nk, const double *qp, double *kp, size_t h, double *s)
{
    const attn_job *job = c->job;
    size_t dh = job->dk / job->heads;
    pack_head(c->k + b * job->lk * job->dk, job->dk, dh, h, j0, nk, kp);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)dh, job->scale,
                qp, (int)dh, kp, (int)dh, 0.0, s, (int)nk);
    const unsigned char *mask = NULL;
    if (job->mask != NULL)
        mask = job->mask + (job->mask_batched ? b : 0) * job->lq * job->lk;
    for (size_t r = 0; r < nq; r++) {
        size_t i = i0 + r;
        for (size_t t = 0; t < nk; t++) {
            size_t j = j0 + t;
            if ((job->causal && j > i) || (mask != NULL && !mask[i * job->lk + j]))
                s[r * nk + t] = -INFINITY;
        }
    }
}

/* Keys the rows [i0, i0 + nq) may see: all, or up to the last row's own position. */
static size_t keys_seen(const attn_job *job, size_t i0, size_t nq)
{
    size_t last = i0 + nq - 1;
    return job->causal && last + 1 < job->lk ? last + 1 : job->lk;
}

/* First sweep: each row's maximum score m[r] and the sum l[r] of exp(s - m[r]). */
static int row_stats(pool_ctx *c, size_t b, size_t h, size_t i0, size_t nq, const double *qp,
                     double *kp, double *s, double *m, double *l)
{
    for (size_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
    }
    size_t seen = keys_seen(c->job, i0, nq);
    for (size_t j0 = 0; j0 < seen; j0 += POOL_KEYS) {
        if (compute_stopped())
            return 0;
        size_t nk = seen - j0 < POOL_KEYS ? seen - j0 : POOL_KEYS;
        score_block(c, b, i0, nq, j0, nk, qp, kp, h, s);
        for (size_t r = 0; r < nq; r++) {
            const double *row = s + r * nk;
            double mx = m[r];
            for (size_t t = 0; t < nk; t++)
                mx = row[t] > mx ? row[t] : mx;
            if (isinf(mx) && mx > 0)
                return 1;
            if (mx == -INFINITY)
                continue;
            double sum = l[r] * exp(m[r] - mx);  /* exp(-inf) = 0 on the first block */
            for (size_t t = 0; t < nk; t++)
                sum += exp(row[t] - mx);
            if (!isfinite(sum))
                return 1;
            m[r] = mx;
            l[r] = sum;
        }
    }
    return 0;
}

/* Second sweep: the weights of rows [i0, i0 + nq), folded into the cells of out (this
 * (batch, head)'s gr x gc grid). */
static void fold_weights(pool_ctx *c, size_t b, size_t h, size_t i0, size_t nq,
                         const double *qp, double *kp, double *s, const double *m,
                         const double *l, double *out)
{
    int mean = c->pool->reduce == ATTN_POOL_MEAN;
    size_t seen = keys_seen(c->job, i0, nq);
    if (seen > c->k1)
        seen = c->k1;
    for (size_t j0 = c->k0; j0 < seen; j0 += POOL_KEYS) {
        if (compute_stopped())
            return;
        size_t nk = seen - j0 < POOL_KEYS ? seen - j0 : POOL_KEYS;
        score_block(c, b, i0, nq, j0, nk, qp, kp, h, s);
        for (size_t r = 0; r < nq; r++) {
            if (l[r] == 0)
                continue;                   /* a fully masked row: every weight is 0 */
            double inv = 1.0 / l[r];
            double *cells = out + ((i0 + r - c->q0) / c->br) * c->gc;
            const double *row = s + r * nk;
            for (size_t t = 0; t < nk; t++) {
                double w = exp(row[t] - m[r]) * inv;
                double *cell = cells + (j0 + t - c->k0) / c->bc;
                if (mean)
                    *cell += w;
                else if (w > *cell)
                    *cell = w;
            }
        }
    }
}

static void pool_task(void *ctx, size_t task, unsigned slot)
{
    pool_ctx *c = ctx;
    const attn_job *job = c->job;
    size_t bh = task / c->bands, band = task % c->bands;
    size_t b = bh / job->heads, h = bh % job->heads, dh = job->dk / job->heads;
    size_t g0 = band * c->band_rows;
    size_t g1 = g0 + c->band_rows < c->gr ? g0 + c->band_rows : c->gr;
    size_t q0 = c->q0 + g0 * c->br;
    size_t q1 = c->q0 + g1 * c->br < c->q1 ? c->q0 + g1 * c->br : c->q1;
    double *s = c->scratch + slot * c->stride;
    double *qp = s + (size_t)POOL_ROWS * POOL_KEYS, *kp = qp + (size_t)POOL_ROWS * dh;
    double *m = kp + (size_t)POOL_KEYS * dh, *l = m + POOL_ROWS;
    double *out = c->out + bh * c->gr * c->gc;
    for (size_t i0 = q0; i0 < q1; i0 += POOL_ROWS) {
        size_t nq = q1 - i0 < POOL_ROWS ? q1 - i0 : POOL_ROWS;
        pack_head(c->q + b * job->lq * job->dk, job->dk, dh, h, i0, nq, qp);
        if (row_stats(c, b, h, i0, nq, qp, kp, s, m, l) != 0) {
            c->not_finite = 1;
            return;
        }
        fold_weights(c, b, h, i0, nq, qp, kp, s, m, l, out);
    }
    if (c->pool->reduce != ATTN_POOL_MEAN)
        return;
    /* a mean divides by the cells of the block, masked ones included (they count as 0) */
    for (size_t g = g0; g < g1; g++) {
        size_t rows = c->q0 + (g + 1) * c->br < c->q1 ? c->br : c->q1 - c->q0 - g * c->br;
        for (size_t t = 0; t < c->gc; t++) {
            size_t cols = c->k0 + (t + 1) * c->bc < c->k1 ? c->bc : c->k1 - c->k0 - t * c->bc;
            out[g * c->gc + t] /= (double)(rows * cols);
        }
    }
}

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
    c.stride = slot_numbers(job);
    c.scratch = mem_malloc((size_t)slots * c.stride * sizeof(double));
    if (c.scratch == NULL)
        return ERR_UNAVAILABLE;
    compute_parallel(tasks, slots, pool_task, &c);
    mem_free(c.scratch);
    return c.not_finite ? 1 : 0;
}

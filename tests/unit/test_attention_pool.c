/*
 * test_attention_pool.c - pooled attention weights (server/kernel/attention_pool.c) against the
 * full matrix computed here in long double and pooled by its definition.
 *
 * Shapes land on the edges of the pool's own blocks (64 queries, 512 keys, bands of 256
 * queries) and of the grid (a side shorter than R or C, blocks that do not divide the
 * side); masks cover causal, a random mask, a fully masked row and a batched mask; max
 * and mean; serially and on a pool of three threads; with each kernel path.
 */
#include <stdint.h>
#include <stdlib.h>
#include <valgrind/valgrind.h>

#include "kernel/attention_fused.h"
#include "kernel/attention_pool.h"
#include "core/compute.h"
#include "core/mem.h"
#include "test.h"

static uint64_t pool_rng = 0x13198A2E03707344ull;

typedef struct pool_case {
    size_t batch, heads, lq, lk, dk, rows, cols;
    int causal, masked, mask_batched;
    attn_pool_reduce reduce;
    size_t q_start, q_end, k_start, k_end;  /* the window; 0 ends: the last */
} pool_case;

/* The weights of row i of (b, h), in long double, into w[0..lk). */
static void reference_row(const pool_case *pc, const attn_job *job, const double *q,
                          const double *k, size_t b, size_t h, size_t i, long double *w)
{
    size_t dh = pc->dk / pc->heads;
    long double mx = -INFINITY;
    const unsigned char *mask = job->mask ? job->mask + (job->mask_batched ? b : 0) * pc->lq * pc->lk : NULL;
    for (size_t j = 0; j < pc->lk; j++) {
        int hidden = (pc->causal && j > i) || (mask && !mask[i * pc->lk + j]);
        long double s = 0;
        for (size_t t = 0; t < dh; t++)
            s += (long double)q[(b * pc->lq + i) * pc->dk + h * dh + t] *
                 k[(b * pc->lk + j) * pc->dk + h * dh + t];
        w[j] = hidden ? -INFINITY : s * job->scale;
        if (w[j] > mx)
            mx = w[j];
    }
    long double sum = 0;
    for (size_t j = 0; j < pc->lk; j++) {
        w[j] = mx == -INFINITY ? 0 : expl(w[j] - mx);
        sum += w[j];
    }
    for (size_t j = 0; j < pc->lk; j++)
        w[j] = sum > 0 ? w[j] / sum : 0;
}

/* Runs one case and compares every cell; returns the largest difference, or -1 when the
 * pool reported an error. */
static double run_case(const pool_case *pc, int f32)
{
    attn_job job = {.batch = pc->batch, .lq = pc->lq, .lk = pc->lk, .heads = pc->heads,
                    .dk = pc->dk, .dv = pc->dk, .causal = pc->causal,
                    .scale = 1.0 / sqrt((double)(pc->dk / pc->heads)),
                    .mask_batched = pc->mask_batched,
                    .dtype = f32 ? ATTN_FLOAT32 : ATTN_FLOAT64};
    attn_pool pool = {.rows = pc->rows, .cols = pc->cols, .reduce = pc->reduce,
                      .q_start = pc->q_start, .q_end = pc->q_end, .k_start = pc->k_start,
                      .k_end = pc->k_end};
    size_t wq0, wq1, wk0, wk1;
    attention_pool_window(&pool, pc->lq, pc->lk, &wq0, &wq1, &wk0, &wk1);
    size_t nq = pc->batch * pc->lq * pc->dk, nk = pc->batch * pc->lk * pc->dk;
    double *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k);
    /* a float32 job's q and k are float32 numbers: the reference is exact for them */
    for (size_t i = 0; i < nq; i++)
        q[i] = f32 ? (float)(3 * test_uniform(&pool_rng)) : 3 * test_uniform(&pool_rng);
    for (size_t i = 0; i < nk; i++)
        k[i] = f32 ? (float)(3 * test_uniform(&pool_rng)) : 3 * test_uniform(&pool_rng);
    unsigned char *mask = NULL;
    if (pc->masked) {
        size_t n = (pc->mask_batched ? pc->batch : 1) * pc->lq * pc->lk;
        mask = malloc(n);
        for (size_t i = 0; i < n; i++)
            mask[i] = (test_next_bits(&pool_rng) & 3) != 0;
        memset(mask + 2 * pc->lk, 0, pc->lk);      /* row 2 sees nothing */
        job.mask = mask;
    }
    size_t cells = attention_pool_cells(&pool, &job);
    double *out = malloc(cells * sizeof *out);
    int rc = attention_pool_run(&job, &pool, q, k, out);
    double worst = rc == 0 ? 0 : -1;
    size_t br, bc, gr, gc;
    attention_pool_grid(&pool, pc->lq, pc->lk, &br, &bc, &gr, &gc);
    long double *w = malloc(pc->lq * pc->lk * sizeof *w);
    for (size_t b = 0; rc == 0 && b < pc->batch; b++)
        for (size_t h = 0; h < pc->heads; h++) {
            for (size_t i = 0; i < pc->lq; i++)
                reference_row(pc, &job, q, k, b, h, i, w + i * pc->lk);
            for (size_t g = 0; g < gr; g++)
                for (size_t t = 0; t < gc; t++) {
                    long double acc = 0;
                    size_t n = 0;
                    for (size_t i = wq0 + g * br; i < wq0 + (g + 1) * br && i < wq1; i++)
                        for (size_t j = wk0 + t * bc; j < wk0 + (t + 1) * bc && j < wk1; j++, n++)
                            acc = pc->reduce == ATTN_POOL_MEAN ? acc + w[i * pc->lk + j]
                                  : (w[i * pc->lk + j] > acc ? w[i * pc->lk + j] : acc);
                    if (pc->reduce == ATTN_POOL_MEAN)
                        acc /= n;
                    double got = out[((b * pc->heads + h) * gr + g) * gc + t];
                    double d = fabs(got - (double)acc);
                    if (!(d <= worst))
                        worst = isnan(d) ? INFINITY : d;
                }
        }
    free(w);
    free(out);
    free(mask);
    free(q);
    free(k);
    return worst;
}

static const pool_case POOL_CASES[] = {
    /* batch heads lq lk dk R C causal masked batched reduce */
    {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, ATTN_POOL_MAX, 0, 0, 0, 0},
    {1, 1, 17, 3, 8, 4, 4, 0, 0, 0, ATTN_POOL_MEAN, 0, 0, 0, 0},            /* C > Lk: one key a cell */
    {2, 2, 37, 53, 8, 5, 7, 1, 0, 0, ATTN_POOL_MAX, 0, 0, 0, 0},
    {2, 2, 37, 53, 8, 5, 7, 1, 0, 0, ATTN_POOL_MEAN, 0, 0, 0, 0},
    {1, 3, 130, 600, 12, 9, 11, 0, 1, 0, ATTN_POOL_MEAN, 0, 0, 0, 0},       /* past 64 rows, 512 keys */
    {2, 1, 70, 515, 4, 70, 515, 0, 1, 1, ATTN_POOL_MAX, 0, 0, 0, 0},        /* R = Lq, C = Lk: the matrix */
    {1, 2, 600, 600, 16, 7, 3, 1, 1, 0, ATTN_POOL_MAX, 0, 0, 0, 0},         /* past a band of 256 */
    {1, 1, 1000, 1000, 8, 4096, 4096, 1, 0, 0, ATTN_POOL_MEAN, 0, 0, 0, 0},
    /* windows: a zoomed view, past a key block, causal and masked */
    {2, 2, 300, 700, 8, 16, 16, 1, 1, 0, ATTN_POOL_MAX, 100, 260, 450, 690},
    {1, 1, 300, 700, 8, 7, 5, 0, 0, 0, ATTN_POOL_MEAN, 299, 0, 0, 3},
    {1, 2, 130, 130, 4, 130, 130, 1, 0, 0, ATTN_POOL_MEAN, 64, 128, 0, 129},
};

/* Every case in both precisions, on one thread and on three, with each kernel path this
 * CPU runs (the cells' exponentials are the path's).  float32 is held to 4e-6: a weight is
 * at most 1 and as good as its score, and scores here reach 25 (q and k up to 3, dh 8),
 * whose float32 ulp is 1.9e-6. */
void test_attention_pool_matches_reference(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    for (size_t p = 0; p < npaths; p++) {
        char err[128];
        ASSERT_EQ(attn_kernel_select(paths[p]->name, err, sizeof err), 0);
        for (int threads = 1; threads <= 3; threads += 2) {
            if (threads > 1)
                ASSERT_EQ(compute_init((unsigned)threads), 0);
            for (size_t c = 0; c < 2 * (sizeof POOL_CASES / sizeof POOL_CASES[0]); c++) {
                int f32 = c % 2;
                /* the 1000 x 1000 case only outside valgrind (its naive reference is a
                 * million weights a run); 600 x 600 and the windows past a key block
                 * reach the same code */
                if (RUNNING_ON_VALGRIND && POOL_CASES[c / 2].lq >= 1000)
                    continue;
                double worst = run_case(&POOL_CASES[c / 2], f32);
                if (!(worst >= 0 && worst <= (f32 ? 4e-6 : 1e-13))) {
                    if (threads > 1)
                        compute_shutdown();
                    attn_kernel_select("auto", err, sizeof err);
                    FAIL_AT("case %zu in %s on %d thread(s), path %s: largest difference %g",
                            c / 2, f32 ? "float32" : "float64", threads, paths[p]->name, worst);
                }
            }
            if (threads > 1)
                compute_shutdown();
        }
    }
    char err[128];
    ASSERT_EQ(attn_kernel_select("auto", err, sizeof err), 0);
}

void test_attention_pool_grid_sizes(void)
{
    attn_pool p = {.rows = 4096, .cols = 4096};
    size_t br, bc, gr, gc;
    attention_pool_grid(&p, 32768, 1000, &br, &bc, &gr, &gc);
    ASSERT_EQ(br, 8);
    ASSERT_EQ(gr, 4096);
    ASSERT_EQ(bc, 1);
    ASSERT_EQ(gc, 1000);
    p.rows = 3;
    p.cols = 3;
    attention_pool_grid(&p, 10, 4, &br, &bc, &gr, &gc);
    ASSERT_EQ(br, 4);                   /* ceil(10 / 3) */
    ASSERT_EQ(gr, 3);                   /* blocks of 4, 4, 2 */
    ASSERT_EQ(bc, 2);
    ASSERT_EQ(gc, 2);                   /* C = 3 asked, 2 blocks of 2 cover 4 keys */
}

void test_attention_pool_overflow_is_reported(void)
{
    attn_job job = {.batch = 1, .lq = 2, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .scale = 1};
    attn_pool pool = {.rows = 1, .cols = 1, .reduce = ATTN_POOL_MAX};
    double q[2] = {1e200, 1}, k[2] = {1e200, 1}, out[1];
    ASSERT_EQ(attention_pool_run(&job, &pool, q, k, out), 1);
}

/* attention_run with a pool and return_qk, for x with weights (projections, biases, heads,
 * causal), in both precisions: the pooled cells against the full matrix the same job
 * returns without a pool, pooled here; q against x Wq + bq computed here. */
void test_attention_pool_through_attention_run(void)
{
    enum { B = 2, L = 70, DIN = 6, DK = 8, H = 2 };
    double x[B * L * DIN], wq[DIN * DK], wk[DIN * DK], wv[DIN * DK], bq[DK];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = test_uniform(&pool_rng);
    for (size_t i = 0; i < DIN * DK; i++) {
        wq[i] = test_uniform(&pool_rng);
        wk[i] = test_uniform(&pool_rng);
        wv[i] = test_uniform(&pool_rng);
    }
    for (size_t i = 0; i < DK; i++)
        bq[i] = test_uniform(&pool_rng);
    attn_weights w = {.d_in = DIN, .d_ctx = DIN, .dk = DK, .dv = DK, .d_out = DK,
                      .wq = wq, .wk = wk, .wv = wv, .bq = bq};
    for (int f32 = 0; f32 <= 1; f32++) {
        attn_job job = {.batch = B, .lq = L, .lk = L, .heads = H, .dk = DK, .dv = DK, .x = x,
                        .weights = &w, .causal = 1, .scale = 0.5,
                        .dtype = f32 ? ATTN_FLOAT32 : ATTN_FLOAT64, .want_attention = 1};
        attn_result full, pooled;
        attn_error err;
        ASSERT_EQ(attention_run(&job, &full, &err), 0);
        attn_pool pool = {.rows = 9, .cols = 4, .reduce = ATTN_POOL_MEAN};
        job.want_attention = 0;
        job.pool = &pool;
        job.want_qk = 1;
        ASSERT_EQ(attention_run(&job, &pooled, &err), 0);
        ASSERT(pooled.attention == NULL && pooled.attention_f32 == NULL && pooled.pooled != NULL);
        size_t br, bc, gr, gc;
        attention_pool_grid(&pool, L, L, &br, &bc, &gr, &gc);
        double worst = 0, tol = f32 ? 1e-6 : 1e-13;
        for (size_t bh = 0; bh < B * H; bh++)
            for (size_t g = 0; g < gr; g++)
                for (size_t t = 0; t < gc; t++) {
                    double acc = 0;
                    size_t n = 0;
                    for (size_t i = g * br; i < (g + 1) * br && i < L; i++)
                        for (size_t j = t * bc; j < (t + 1) * bc && j < L; j++, n++)
                            acc += f32 ? full.attention_f32[(bh * L + i) * L + j]
                                       : full.attention[(bh * L + i) * L + j];
                    double d = fabs(pooled.pooled[(bh * gr + g) * gc + t] - acc / (double)n);
                    worst = d > worst ? d : worst;
                }
        double qworst = 0;
        for (size_t r = 0; r < B * L; r++)
            for (size_t c = 0; c < DK; c++) {
                double want = bq[c];
                for (size_t t = 0; t < DIN; t++)
                    want += x[r * DIN + t] * wq[t * DK + c];
                double d = fabs(pooled.q[r * DK + c] - want);
                qworst = d > qworst ? d : qworst;
            }
        /* the outputs agree too, to the precision (with the matrix asked for, the output
         * comes from another kernel, whose sums round differently) */
        double oworst = 0;
        for (size_t i = 0; i < B * L * DK; i++) {
            double d = fabs(pooled.output[i] - full.output[i]);
            oworst = d > oworst ? d : oworst;
        }
        /* without the output (skip_output): the same cells, and no output */
        attn_result bare;
        job.skip_output = 1;
        job.want_qk = 0;
        ASSERT_EQ(attention_run(&job, &bare, &err), 0);
        ASSERT(bare.output == NULL && bare.pooled != NULL && bare.q == NULL);
        ASSERT(memcmp(bare.pooled, pooled.pooled, B * H * gr * gc * sizeof(double)) == 0);
        attention_result_free(&bare);
        attention_result_free(&full);
        attention_result_free(&pooled);
        if (!(worst <= tol) || !(qworst <= (f32 ? 1e-5 : 1e-13)) || !(oworst <= (f32 ? 1e-5 : 1e-13)))
            FAIL_AT("%s: pooled cells off by %g, q by %g, output by %g", f32 ? "float32" : "float64",
                    worst, qworst, oworst);
    }
}

/* A float32 job given q, k and v as float (attn_job.q32 ..., the v2 path's binary FP32
 * tensors) pools the same cells and answers the same q and k as one given their double
 * copies: bit for bit. */
void test_attention_pool_float_inputs(void)
{
    enum { L = 50, DK = 4, H = 2 };
    double q[L * DK], k[L * DK], v[L * DK];
    float q32[L * DK], k32[L * DK], v32[L * DK];
    for (size_t i = 0; i < L * DK; i++) {
        q32[i] = (float)test_uniform(&pool_rng);
        k32[i] = (float)test_uniform(&pool_rng);
        v32[i] = (float)test_uniform(&pool_rng);
        q[i] = q32[i];
        k[i] = k32[i];
        v[i] = v32[i];
    }
    attn_pool pool = {.rows = 7, .cols = 5, .reduce = ATTN_POOL_MAX};
    attn_job job = {.batch = 1, .lq = L, .lk = L, .heads = H, .dk = DK, .dv = DK, .q = q,
                    .k = k, .v = v, .scale = 0.7, .dtype = ATTN_FLOAT32, .pool = &pool,
                    .want_qk = 1};
    attn_result from64, from32;
    attn_error err;
    ASSERT_EQ(attention_run(&job, &from64, &err), 0);
    job.q = job.k = job.v = NULL;
    job.q32 = q32;
    job.k32 = k32;
    job.v32 = v32;
    ASSERT_EQ(attention_run(&job, &from32, &err), 0);
    size_t br, bc, gr, gc;
    attention_pool_grid(&pool, L, L, &br, &bc, &gr, &gc);
    int same = 1;
    for (size_t i = 0; i < H * gr * gc; i++)
        same &= from64.pooled[i] == from32.pooled[i];
    for (size_t i = 0; i < L * DK; i++)
        same &= from64.q[i] == from32.q[i] && from64.k[i] == from32.k[i] &&
                from64.output[i] == from32.output[i];
    attention_result_free(&from64);
    attention_result_free(&from32);
    ASSERT(same);
}

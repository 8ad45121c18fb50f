/*
 * attention.c - attention_run and its helpers.
 *
 * The kernels live in attention_kernels.inc and are instantiated for double
 * and float.  A float64 job runs on the caller's arrays directly; a float32
 * job takes its float inputs as they are (job->q32, k32, v32) or rounds its
 * double ones to float, runs the float kernels (sgemm, expf), and keeps the
 * output as float (job->output_f32) or widens it to double, so that all
 * arithmetic is in single precision, as NumPy's float32 would do it; its
 * attention weights are formed and returned in float32.
 *
 * Weights come in either element type (weights.h).  A float32 job uses a
 * float32 set's arrays as they are and rounds a float64 set's; a float64 job
 * uses a float64 set's as they are and widens a float32 set's (exactly), so
 * that its arithmetic is in double whatever the set holds.
 *
 * The block sizes below were chosen by measurement (tests/bench); see
 * docs/performance.md.
 */
#include "attention.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "attention_exp.h"
#include "attention_extras.h"
#include "attention_floats.h"
#include "attention_reduce.h"
#include "attention_fused.h"
#include "core/compute.h"
#include "core/half.h"
#include "core/mem.h"
#ifdef ATTN_TESTING
#include "core/test_hooks.h"
#endif

/* Query rows per block, a task's rows (at most; fewer when that leaves too
 * few blocks to share among the compute threads), and keys per block.
 * Larger query blocks pack fewer copies of K for OpenBLAS, and a 512 x 256
 * block of scores (1 MiB in float64) stays within a core's L2
 * (docs/performance.md, "The kernel"). */
#define BLOCK_Q_MAX 512
#define BLOCK_Q_MIN 64
#define BLOCK_K 256
/* Blocks per compute slot the fused kernel's split aims for, at least.  With
 * one or two a slot, a slot that starts late or runs slower (woken last, a
 * busy sibling hyperthread, a lower clock) holds the whole job at its end;
 * with four, the others take up its share.  The BLAS path keeps two, as its
 * smaller blocks mean more copies of K packed by OpenBLAS. */
#define FUSED_TASKS_PER_SLOT 4
#define BLAS_TASKS_PER_SLOT 2
/* The fused kernel's last round of blocks, one a slot, runs in this many
 * pieces each (at least ATTN_FUSED_FQ_MIN rows a piece, the fewest a pass
 * over K and V pays for): a slot that runs slower than the others (a host
 * that lends its CPUs unevenly, a busy sibling hyperthread) is then waited
 * for at the end by a fraction of a block rather than by up to a whole one,
 * as in guided scheduling.  Only the last round: every piece reads all of
 * K and V again. */
#define FUSED_TAIL_SPLIT 4
/* Products this small (multiply-adds) are summed by attention_kernels.inc's
 * own loop rather than by OpenBLAS, whose every call takes a process-wide
 * lock (blas_memory_alloc): a request of a few tokens (the seed's) took
 * it 15 times.  Up to about this size the loop is as quick as OpenBLAS's
 * call; past it OpenBLAS pulls ahead (docs/performance.md). */
#define SMALL_PRODUCT_MACS 256
/* Products with this many rows of a or fewer go to GEMV a row at a time
 * (attention_kernels.inc, product): up to here that is quicker than GEMM's
 * packing, past it GEMM's reuse of each panel wins (the commit that set it
 * has the figures). */
#define GEMV_MAX_ROWS 2
/* Row chunks of a projection are at least this tall. */
#define LINEAR_MIN_ROWS 16

/* Returned by the kernels when a score overflowed to Inf (or NaN). */
#define KERNEL_NOT_FINITE 1

/* How kernel_sdpa splits a job into tasks; made by sdpa_plan_make alone, so
 * that the memory estimate and the run agree. */
typedef struct sdpa_plan {
    size_t bq, bk;              /* query rows per block; keys per block */
    size_t qblocks, blocks;     /* query blocks per (batch, head); of the job */
    /* The last tail_blocks blocks of the queue run as tail_split tasks each
     * (FUSED_TAIL_SPLIT), the others whole; tasks counts them all. */
    size_t tail_blocks, tail_split, tasks;
    size_t stride;              /* scratch numbers per slot (fused: whole cache lines) */
    unsigned slots;             /* compute slots asked for */
    /* The fused kernel (attention_fused.h) runs when sdpa_fuses says so, on K and V
     * packed for it (pack_areas). */
    int fused;
    int scratch_block;          /* BLAS path: scores go to scratch, not to the attention result */
    size_t hdv_pad;             /* packed V row */
    size_t fq;                  /* query rows per sub-block (attn_fused_block_rows) */
    size_t obuf_at;             /* where obuf and sbuf start in a slot's scratch (aligned) */
    size_t kt_size, pack_stride;/* numbers of packed K, of packed K and V, per head */
    /* Where the packed K and V lie: PACK_HEADS, in areas of pack_stride numbers one a
     * (batch, head), packed before the tasks that share them (qblocks > 1); PACK_SLOTS, in
     * such areas one a slot, where a head of one task but several sub-blocks is packed
     * whole by its task, over the slot's previous head; PACK_TILES, where a head is one
     * task of one sub-block, in room for one tile in the slot's scratch (from number
     * tile_at of the stride), into which its block packs each tile just before the tile's
     * products, each read once and from the cache. */
    enum { PACK_HEADS, PACK_SLOTS, PACK_TILES } pack;
    size_t pack_areas, tile_at;
    size_t packed;              /* numbers of the packed K and V of the job */
    /* bfloat16 products (attn_job.bf16): kt_size and pack_stride count bfloat16 numbers
     * (K by pairs of dims, ATTN_FUSED_BF16_KT), packed still counts floats; each slot's
     * scratch ends with the task's rows of q in bfloat16 (q16_rows of hdk rounded up to
     * even, whole register groups), from number q16_at of the stride. */
    size_t q16_rows, q16_at;
    /* The pack before the tasks (qblocks > 1) splits each head's keys into this many
     * pieces of whole tiles: packing in pieces keeps every slot busy when there are fewer
     * heads than slots, where one slot would pack a head while the others waited. */
    size_t pack_pieces, pack_tiles; /* pieces per head; tiles (ATTN_FUSED_BK keys) per piece */
} sdpa_plan;

/* Compute slots worth asking for a piece of work of `flops` operations. */
static unsigned slots_for(double flops)
{
    return flops < ATTENTION_SMALL_FLOPS ? 1 : compute_threads();
}

/* Whether kernel_sdpa takes the fused kernel: the attention matrix is not wanted, the
 * heads are at most ATTN_FUSED_MAX_DIM wide, and there are more than GEMV_MAX_ROWS query
 * rows.  That kernel first copies all of K and V into its packed layout, a pass over them
 * as long as the products of a row or two, and computes whole register groups of rows;
 * the BLAS path's GEMV reads them in place (one query over many keys, as a decoding step
 * that sends its own cache asks).  With bfloat16 products the fused kernel rounds q, k
 * and v itself as it packs them (attention_fused.h), so the job's inputs need no rounded
 * copy (run_float32). */
static int sdpa_fuses(const attn_job *job)
{
    size_t hdk = job->dk / job->heads, hdv = job->dv / job->heads;
    return !job->want_attention && job->lq > GEMV_MAX_ROWS && hdk <= ATTN_FUSED_MAX_DIM &&
           hdv <= ATTN_FUSED_MAX_DIM;
}

static void sdpa_plan_make(const attn_job *job, sdpa_plan *p)
{
    memset(p, 0, sizeof *p);
    double flops = 2.0 * (double)job->batch * (double)job->lq * (double)job->lk *
                   (double)(job->dk + job->dv);
    if (job->causal)
        flops /= 2;
    p->slots = slots_for(flops);
    int fused = sdpa_fuses(job);
    size_t per_slot = fused ? FUSED_TASKS_PER_SLOT : BLAS_TASKS_PER_SLOT;
    size_t bq = BLOCK_Q_MAX, heads = job->batch * job->heads;
    while (bq > BLOCK_Q_MIN && heads * ((job->lq + bq - 1) / bq) < per_slot * (size_t)p->slots)
        bq /= 2;
    /* The fused kernel takes query rows ATTN_FUSED_MR at a time and fills a
     * task's last group with copies of its last row, computed and thrown
     * away: in tasks of whole groups only a head's last task has such rows
     * (4 of every 512 at two threads, 2 of every 64 at sixteen, before). */
    if (fused)
        bq = (bq + ATTN_FUSED_MR - 1) / ATTN_FUSED_MR * ATTN_FUSED_MR;
    p->bq = job->lq < bq ? job->lq : bq;
    p->bk = job->lk < BLOCK_K ? job->lk : BLOCK_K;
    p->qblocks = (job->lq + p->bq - 1) / p->bq;
    p->blocks = p->tasks = heads * p->qblocks;
    if (p->slots > p->tasks)
        p->slots = (unsigned)p->tasks;
    if (fused) {
        size_t size = job->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
        size_t tiles = (job->lk + ATTN_FUSED_BK - 1) / ATTN_FUSED_BK;
        p->fused = 1;
        p->hdv_pad = attn_fused_vpad(job->dv / job->heads, size);
        size_t hdk = job->dk / job->heads, kt_key = job->bf16 ? ATTN_FUSED_BF16_KT(hdk) : hdk;
        p->kt_size = tiles * ATTN_FUSED_BK * kt_key;
        p->pack_stride = p->kt_size + tiles * ATTN_FUSED_BK * p->hdv_pad;
        /* A task's rows in whole register groups bound the sub-block (and its scratch). */
        size_t task_rows = (p->bq + ATTN_FUSED_MR - 1) / ATTN_FUSED_MR * ATTN_FUSED_MR;
        p->fq = attn_fused_block_rows(job->dk / job->heads, p->hdv_pad, size);
        if (p->fq > task_rows)
            p->fq = task_rows;
        p->pack = p->qblocks > 1 ? PACK_HEADS : p->fq < task_rows ? PACK_SLOTS : PACK_TILES;
        p->pack_areas = p->pack == PACK_HEADS ? heads : p->pack == PACK_SLOTS ? p->slots : 0;
        /* bfloat16: two to a float */
        p->packed = job->bf16 ? (p->pack_areas * p->pack_stride + 1) / 2
                              : p->pack_areas * p->pack_stride;
        /* run_max and run_sum, then obuf and sbuf from a cache line's start */
        size_t line = ATTN_FUSED_LINE / size;
        p->obuf_at = (2 * p->bq + line - 1) / line * line;
        p->stride = p->obuf_at + ATTN_FUSED_SCRATCH(p->fq, p->hdv_pad);
        if (p->pack == PACK_TILES) {
            p->tile_at = p->stride;
            p->stride += ATTN_FUSED_TILE(kt_key, p->hdv_pad, job->bf16);
        }
        if (job->bf16) {
            p->q16_rows = (p->bq + ATTN_FUSED_MR - 1) / ATTN_FUSED_MR * ATTN_FUSED_MR;
            p->q16_at = p->stride;
            p->stride += (p->q16_rows * kt_key + 1) / 2;
        }
        p->stride = (p->stride + line - 1) / line * line;
        p->pack_pieces = heads >= p->slots ? 1 : (p->slots + heads - 1) / heads;
        if (p->pack_pieces > tiles)
            p->pack_pieces = tiles;
        p->pack_tiles = (tiles + p->pack_pieces - 1) / p->pack_pieces;
        /* Only where K and V are packed before the tasks (qblocks > 1): a block
         * that packs its own cannot be shared. */
        size_t split = p->bq / ATTN_FUSED_FQ_MIN;
        if (split > FUSED_TAIL_SPLIT)
            split = FUSED_TAIL_SPLIT;
        if (p->qblocks > 1 && p->slots > 1 && split > 1) {
            p->tail_blocks = p->slots;
            p->tail_split = split;
            p->tasks = p->blocks + p->tail_blocks * (split - 1);
        }
        return;
    }
    /* The weights are formed in the attention result itself when it is wanted. */
    p->scratch_block = !job->want_attention;
    size_t kblocks = (job->lk + p->bk - 1) / p->bk;
    p->stride = 2 * p->bq + (p->scratch_block ? p->bq * p->bk : 0) +
                (job->want_attention ? p->bq * kblocks : 0);
}

#ifdef ATTN_TESTING
void attention_split_for_testing(const attn_job *job, size_t *blocks, size_t *tasks)
{
    sdpa_plan p;
    sdpa_plan_make(job, &p);
    *blocks = p.blocks;
    *tasks = p.tasks;
}

const char *attention_pack_for_testing(const attn_job *job)
{
    sdpa_plan p;
    sdpa_plan_make(job, &p);
    if (!p.fused)
        return "none";
    return p.pack == PACK_HEADS ? "heads" : p.pack == PACK_SLOTS ? "slots" : "tiles";
}
#endif

#define REAL double
#define SFX d
#define GEMM cblas_dgemm
#define GEMV cblas_dgemv
#define EXP exp
#define MAXV attention_max_d
#define MAXMV attention_max_masked_d
#define EXPV attention_exp_shift_d
#define EXPMV attention_exp_shift_masked_d
#define FUSED_BLOCK block_d
#define FUSED_PACK pack_d
#include "attention_kernels.inc"
#undef REAL
#undef SFX
#undef GEMM
#undef GEMV
#undef EXP
#undef MAXV
#undef MAXMV
#undef EXPV
#undef EXPMV
#undef FUSED_BLOCK
#undef FUSED_PACK

#define REAL float
#define SFX f
#define GEMM cblas_sgemm
#define GEMV cblas_sgemv
#define EXP expf
#define MAXV attention_max_f
#define MAXMV attention_max_masked_f
#define EXPV attention_exp_shift_f
#define EXPMV attention_exp_shift_masked_f
#define FUSED_BLOCK block_f
#define FUSED_PACK pack_f
#define BF16_PRODUCTS 1
#include "attention_kernels.inc"
#undef BF16_PRODUCTS
#undef REAL
#undef SFX
#undef GEMM
#undef GEMV
#undef EXP
#undef MAXV
#undef MAXMV
#undef EXPV
#undef EXPMV
#undef FUSED_BLOCK
#undef FUSED_PACK

size_t attention_output_width(const attn_job *job)
{
    return job->weights != NULL ? job->weights->d_out : job->dv;
}

double attention_job_flops(const attn_job *job)
{
    double b = (double)job->batch, lq = (double)job->lq, lk = (double)job->lk;
    double dk = (double)job->dk, dv = (double)job->dv;
    double flops = job->skip_output ? 0 : 2.0 * b * lq * lk * (dk + dv);
    if (job->pool != NULL)      /* the scores once more (attention_pool.c) */
        flops += 2.0 * b * lq * lk * dk;
    if (attention_reduce_any(job->reduce)) /* the scores once, twice for received */
        flops += 2.0 * b * lq * lk * dk * (job->reduce->received ? 2 : 1);
    if (job->causal)
        flops /= 2;
    const attn_weights *w = job->weights;
    if (w != NULL) {
        flops += 2.0 * b * lq * (double)w->d_in * dk;               /* x Wq */
        flops += 2.0 * b * lk * (double)w->d_ctx * (dk + dv);       /* x Wk, x Wv */
        if (weights_has(w, WEIGHTS_WO))
            flops += 2.0 * b * lq * dv * (double)w->d_out;          /* heads Wo */
    }
    return flops;
}

/* Counts of the numbers each stage holds, shared by the size estimate and
 * attention_run so the two cannot drift apart. */
typedef struct job_sizes {
    size_t x, context, q, k, v;          /* inputs */
    size_t weights;                      /* every weight array present, biases included */
    size_t proj;                         /* projected q, k, v */
    size_t heads_out;                    /* concatenated heads before wo */
    size_t out, attn_all;
    size_t scratch;                      /* sdpa scratch of every slot (plan.stride each) */
} job_sizes;

static int job_sizes_compute(const attn_job *job, job_sizes *s)
{
    memset(s, 0, sizeof *s);
    const attn_weights *w = job->weights;
    size_t d_out = attention_output_width(job), t;
    int bad = 0;
    bad |= mem_mul(job->batch, job->lq, d_out, &s->out);
    bad |= mem_mul(job->batch, job->heads, job->lq, &t);
    bad |= mem_mul(t, job->lk, 1, &s->attn_all);
    if (w != NULL) {
        bad |= mem_mul(job->batch, job->lq, w->d_in, &s->x);
        if (job->context != NULL)
            bad |= mem_mul(job->batch, job->lk, w->d_ctx, &s->context);
        for (int p = 0; p < WEIGHTS_COUNT; p++) {
            if (!weights_has(w, (weights_part)p))
                continue;
            bad |= mem_mul(weights_rows(w, (weights_part)p), weights_cols(w, (weights_part)p), 1,
                           &t);
            bad |= __builtin_add_overflow(s->weights, t, &s->weights);
        }
        size_t pq, pk, pv;
        bad |= mem_mul(job->batch, job->lq, job->dk, &pq);
        bad |= mem_mul(job->batch, job->lk, job->dk, &pk);
        bad |= mem_mul(job->batch, job->lk, job->dv, &pv);
        bad |= __builtin_add_overflow(pq, pk, &t);
        bad |= __builtin_add_overflow(t, pv, &s->proj);
        if (weights_has(w, WEIGHTS_WO))
            bad |= mem_mul(job->batch, job->lq, job->dv, &s->heads_out);
    } else {
        bad |= mem_mul(job->batch, job->lq, job->dk, &s->q);
        bad |= mem_mul(job->batch, job->lk, job->dk, &s->k);
        bad |= mem_mul(job->batch, job->lk, job->dv, &s->v);
    }
    return bad ? -1 : 0;
}

/* Numbers of sdpa scratch the job needs (in its precision), for every slot
 * the plan asks for, and the packed K and V of the fused kernel. */
static int scratch_numbers(const attn_job *job, size_t *n)
{
    sdpa_plan plan;
    sdpa_plan_make(job, &plan);
    return mem_mul(plan.slots, plan.stride, 1, n) ||
           __builtin_add_overflow(*n, plan.packed, n) ? -1 : 0;
}

int attention_job_bytes(const attn_job *job, size_t *bytes)
{
    job_sizes s;
    if (job_sizes_compute(job, &s) != 0 ||
        scratch_numbers(job, &s.scratch) != 0)
        return -1;
    size_t extras;
    if (attention_extras_bytes(job, &extras) != 0)
        return -1;
    size_t results = s.out + (job->want_attention ? s.attn_all : 0);
    /* the weights are copied only when the set's element type is not the job's */
    int f32_set = job->weights != NULL && weights_is_f32(job->weights);
    size_t inputs = s.x + s.context + s.q + s.k + s.v;
    size_t total, part = 0;
    int bad = 0;
    if (job->dtype == ATTN_FLOAT32) {
        /* a double output; float attention weights, and float copies of the inputs,
         * output, projections and scratch */
        size_t floats = inputs + (f32_set ? 0 : s.weights) + s.out + s.proj + s.heads_out +
                        s.scratch + (job->want_attention ? s.attn_all : 0);
        bad |= mem_mul(s.out, sizeof(double), 1, &total);
        bad |= mem_mul(floats, sizeof(float), 1, &part);
        bad |= __builtin_add_overflow(total, part, &total);
    } else {
        size_t scratch = s.proj + s.heads_out + s.scratch + (f32_set ? s.weights : 0);
        bad |= mem_mul(results + scratch, sizeof(double), 1, &total);
    }
    bad |= __builtin_add_overflow(total, extras, &total);
    if (bad)
        return -1;
    *bytes = total;
    return 0;
}

/* Returns 0 if every value of a[0..n) is finite.  x - x is 0 for a finite x and NaN
 * otherwise: one pass without a branch, which the compiler vectorises. */
static int values_finite(const double *a, size_t n)
{
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= a[i] - a[i] == 0;
    return finite ? 0 : -1;
}

/* values_finite for float. */
static int values_finite_f(const float *a, size_t n)
{
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= a[i] - a[i] == 0;
    return finite ? 0 : -1;
}

/* in32, when the job gives the input as float; else a float copy of in
 * (attention_floats_from),
 * owned by *copy for the caller to free.  With round, always a copy, rounded to
 * bfloat16. */
static const float *float_input(const float *in32, const double *in, size_t n, int round,
                                float **copy, int *fail)
{
    if (in32 != NULL && !round)
        return in32;
    if (in32 != NULL) {
        if (n > 0 && (*copy = mem_malloc(n * sizeof(float))) == NULL)
            *fail = 1;
        else if (n > 0)
            memcpy(*copy, in32, n * sizeof(float));
    } else {
        *copy = attention_floats_from(in, n, fail);
    }
    if (round && *copy != NULL)
        attention_floats_round_bf16(*copy, n);
    return *copy;
}

/* A float32 job: float copies of what the job gives in double, the kernels in float, and
 * the output kept as float (job->output_f32, into *out32) or widened into out. */
static int run_float32(const attn_job *job, const job_sizes *s, double *out, float **out32,
                       float *attn)
{
    const attn_weights *w = job->weights;
    int fail = 0, rc = ERR_UNAVAILABLE;
    float *copies[5] = {0}, *wf[WEIGHTS_COUNT] = {0}, *fout = NULL;
    float *x = attention_floats_from(job->x, s->x, &fail), *ctx = attention_floats_from(job->context, s->context, &fail);
    /* bfloat16 products round q, k and v first, but for the fused kernel, which rounds them
     * as it packs them: a serial pass over the inputs and a copy less. */
    int round = job->bf16 && !sdpa_fuses(job);
    const float *q = float_input(job->q32, job->q, s->q, round, &copies[0], &fail);
    const float *k = float_input(job->k32, job->k, s->k, round, &copies[1], &fail);
    const float *v = float_input(job->v32, job->v, s->v, round, &copies[2], &fail);
    copies[3] = x;
    copies[4] = ctx;
    /* a float32 set's arrays are used as they are; wf holds only the copies made here */
    const float *wuse[WEIGHTS_COUNT] = {0};
    for (int p = 0; w != NULL && p < WEIGHTS_COUNT; p++) {
        if (weights_is_f32(w)) {
            wuse[p] = weights_array_f32(w, (weights_part)p);
            continue;
        }
        wf[p] = attention_floats_from(weights_array(w, (weights_part)p),
                         weights_rows(w, (weights_part)p) * weights_cols(w, (weights_part)p), &fail);
        wuse[p] = wf[p];
    }
    fout = mem_malloc(s->out * sizeof(float));
    if (fail || fout == NULL)
        goto done;
    rc = kernel_run_f(job, x, ctx, q, k, v, wuse, fout, attn);
    if (rc != 0)
        goto done;
    if (out32 != NULL) {
        *out32 = fout;
        fout = NULL;
    } else {
        for (size_t i = 0; i < s->out; i++)
            out[i] = fout[i];
    }
done:
    for (int i = 0; i < 5; i++)
        mem_free(copies[i]);
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        mem_free(wf[p]);
    mem_free(fout);
    return rc;
}

/* The output (and with want_attention the weights) of job into result, its buffers
 * allocated here (the caller frees them on failure).  Returns 0, ERR_UNAVAILABLE when
 * memory ran out, or the kernels' code. */
static int run_output(const attn_job *job, const job_sizes *s, attn_result *result)
{
    int f32 = job->dtype == ATTN_FLOAT32, out32 = f32 && job->output_f32;
    if (!out32)
        result->output = mem_malloc(s->out * sizeof(double));
    /* Zeroed: the kernels add the scores to it (attention_kernels.inc, sdpa_block).  A
     * block this large comes from fresh pages that are zero already, so calloc costs
     * nothing more, where OpenBLAS would clear it first for a product that overwrites. */
    if (job->want_attention && f32)
        result->attention_f32 = mem_calloc(s->attn_all, sizeof(float));
    else if (job->want_attention)
        result->attention = mem_calloc(s->attn_all, sizeof(double));
    if ((!out32 && result->output == NULL) ||
        (job->want_attention && result->attention == NULL && result->attention_f32 == NULL))
        return ERR_UNAVAILABLE;
    /* The attention result, Lq x Lk per head, is the one large block written here. */
    if (f32)
        mem_advise_huge(result->attention_f32, s->attn_all * sizeof(float));
    else
        mem_advise_huge(result->attention, s->attn_all * sizeof(double));
    if (f32)
        return run_float32(job, s, result->output, out32 ? &result->output_f32 : NULL,
                           result->attention_f32);
    /* a float32 set is widened for a float64 job: exact, and the arithmetic stays double */
    const attn_weights *w = job->weights;
    attn_weights wide;
    memset(&wide, 0, sizeof wide);
    if (w != NULL && weights_is_f32(w)) {
        if (weights_widen(w, &wide) != 0)
            return ERR_UNAVAILABLE;
        w = &wide;
    }
    const double *wd[WEIGHTS_COUNT] = {0};
    for (int p = 0; w != NULL && p < WEIGHTS_COUNT; p++)
        wd[p] = weights_array(w, (weights_part)p);
    int rc = kernel_run_d(job, job->x, job->context, job->q, job->k, job->v, wd, result->output,
                          result->attention);
    weights_free(&wide);
    return rc;
}

int attention_project(const attn_weights *w, weights_part part, attn_dtype dtype,
                      const double *x, const float *x32, size_t rows, void *out)
{
    weights_part bias = (weights_part)(part + WEIGHTS_BQ);
    size_t d_in = weights_rows(w, part), d_out = weights_cols(w, part);
    int rc = ERR_UNAVAILABLE;
    if (dtype == ATTN_FLOAT32) {
        int fail = 0;
        float *xf = x32 != NULL ? NULL : attention_floats_from(x, rows * d_in, &fail);
        float *wf = NULL, *bf = NULL;
        const float *wu = weights_is_f32(w) ? weights_array_f32(w, part) : NULL;
        const float *bu = weights_is_f32(w) ? weights_array_f32(w, bias) : NULL;
        if (!weights_is_f32(w)) {
            wu = wf = attention_floats_from(weights_array(w, part), d_in * d_out, &fail);
            bu = bf = attention_floats_from(weights_array(w, bias), d_out, &fail);
        }
        if (!fail) {
            kernel_linear_f(rows, d_in, d_out, x32 != NULL ? x32 : xf, wu, bu, out);
            rc = compute_stopped()                    ? ERR_UNAVAILABLE
                 : values_finite_f(out, rows * d_out) == 0 ? 0
                                                      : KERNEL_NOT_FINITE;
        }
        mem_free(xf);
        mem_free(wf);
        mem_free(bf);
        return rc;
    }
    /* a float32 set: this part and its bias widened (exact), not the whole set */
    const double *wd = weights_array(w, part), *bd = weights_array(w, bias);
    double *wide = NULL, *wide_b = NULL;
    if (weights_is_f32(w)) {
        const float *wf = weights_array_f32(w, part), *bf = weights_array_f32(w, bias);
        wide = mem_malloc(d_in * d_out * sizeof(double));
        wide_b = bf != NULL ? mem_malloc(d_out * sizeof(double)) : NULL;
        if (wide == NULL || (bf != NULL && wide_b == NULL)) {
            mem_free(wide);
            mem_free(wide_b);
            return ERR_UNAVAILABLE;
        }
        for (size_t i = 0; i < d_in * d_out; i++)
            wide[i] = wf[i];
        for (size_t i = 0; bf != NULL && i < d_out; i++)
            wide_b[i] = bf[i];
        wd = wide;
        bd = wide_b;
    }
    kernel_linear_d(rows, d_in, d_out, x, wd, bd, out);
    mem_free(wide);
    mem_free(wide_b);
    return compute_stopped()                  ? ERR_UNAVAILABLE
           : values_finite(out, rows * d_out) == 0 ? 0
                                              : KERNEL_NOT_FINITE;
}

int attention_run(const attn_job *job, attn_result *result, attn_error *err)
{
    assert(job != NULL && result != NULL);
    assert(job->heads >= 1 && job->dk % job->heads == 0 && job->dv % job->heads == 0);
    assert(job->batch >= 1 && job->lq >= 1 && job->lk >= 1);
    memset(result, 0, sizeof *result);
    double started = compute_now(), waited = compute_slot_wait();
    job_sizes s;
    if (job_sizes_compute(job, &s) != 0)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The request's shapes multiply to more numbers than the server can address.");
    /* BLAS takes int dimensions. */
    size_t widest = job->lq > job->lk ? job->lq : job->lk;
    widest = widest > job->dk ? widest : job->dk;
    widest = widest > job->dv ? widest : job->dv;
    if (job->weights != NULL) {
        widest = widest > job->weights->d_in ? widest : job->weights->d_in;
        widest = widest > job->weights->d_ctx ? widest : job->weights->d_ctx;
        widest = widest > job->weights->d_out ? widest : job->weights->d_out;
    }
    if (widest > INT_MAX)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "A dimension of %zu is larger than the matrix library accepts (%d).",
                         widest, INT_MAX);
    result->d_out = attention_output_width(job);
    int rc = job->skip_output ? 0 : run_output(job, &s, result);
    if (rc == 0)
        rc = attention_extras_run(job, result);
    if (compute_stop_error(err) != 0) {
        attention_result_free(result);
        return ERR_UNAVAILABLE;
    }
    if (rc == ERR_UNAVAILABLE) {
        attention_result_free(result);
        return error_nomem(err);
    }
    /* The output alone is checked: a weight can only be non-finite through a NaN
     * score, whose NaN reaches its row's sum and so every output number of the
     * row; an overflowing row maximum is reported by the kernel itself.  Without
     * the output (skip_output) the extras check their own (attention_extras.c). */
    if (rc == KERNEL_NOT_FINITE ||
        (result->output != NULL && values_finite(result->output, s.out) != 0) ||
        (result->output_f32 != NULL && values_finite_f(result->output_f32, s.out) != 0)) {
        attention_result_free(result);
        return error_set(err, ERR_BAD_REQUEST, "not_finite", NULL,
                         "The result overflowed to infinity: the inputs are too large for %s "
                         "arithmetic; %s.", attention_precision_name(job),
                         job->dtype == ATTN_FLOAT32 ? "scale them down or use float64"
                                                    : "scale them down or lower scale");
    }
    result->compute_ms = (compute_now() - started - (compute_slot_wait() - waited)) * 1000.0;
    return 0;
}

void attention_result_free(attn_result *result)
{
    if (result == NULL)
        return;
    mem_free(result->output);
    mem_free(result->output_f32);
    mem_free(result->attention);
    mem_free(result->attention_f32);
    mem_free(result->pooled);
    mem_free(result->reduced.entropy);
    mem_free(result->reduced.max_weight);
    mem_free(result->reduced.argmax);
    mem_free(result->reduced.sink);
    mem_free(result->reduced.local);
    mem_free(result->reduced.received);
    mem_free(result->reduced.topk_weights);
    mem_free(result->reduced.topk_indices);
    mem_free(result->q);
    mem_free(result->k);
    memset(result, 0, sizeof *result);
}

void attention_blas_describe(char *config, size_t config_len, char *core, size_t core_len,
                             int *threads)
{
    snprintf(config, config_len, "%s", openblas_get_config());
    snprintf(core, core_len, "%s", openblas_get_corename());
    *threads = openblas_get_num_threads();
}

void attention_blas_set_threads(int threads)
{
    openblas_set_num_threads(threads);
}

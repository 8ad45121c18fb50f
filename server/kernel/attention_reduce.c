/*
 * attention_reduce.c - statistics of the attention weights without the full matrix (see
 * attention_reduce.h).
 *
 * K is packed once per (batch, head) as the fused kernel packs it (attention_fused.h), and
 * two sweeps go over tiles of scores (REDUCE_ROWS queries by REDUCE_KEYS keys, q read in
 * place) that the kernel path's micro-kernel forms from it (attention_reduce_vec.inc): it
 * reads K in the order it is packed, each tile of K staying in the first-level cache while
 * every group of rows passes it, where an OpenBLAS product packs both operands again at each
 * call.  Each row of a tile is then weighed in one vectorised pass: its exponentials and
 * sums.
 *
 * 1. Per task (batch, head, a band of queries), one pass over each row's keys with the online
 *    softmax: the row's maximum m and, relative to it, l = sum exp(s - m), u = sum exp(s - m)
 *    (s - m), the sink and local partial sums, and the top-k raw scores (k = 1 for max alone).
 *    When m rises, l and the partial sums scale by exp(m_old - m) and u becomes
 *    exp(m_old - m) (u + (m_old - m) l).  At the row's end the weights are exp(s - m) / l, so
 *    entropy = ln l - u / l, sink = sink / l, ..., top-k weights exp(s_t - m) / l.  Keeping u
 *    relative to m (rather than sum exp(s - m) s) keeps the entropy exact when the scores are
 *    large and the distribution peaked.  The row's m and l are kept for sweep 2.
 * 2. Only for `received`: per task (batch, head, a band of keys), every query row that sees
 *    those keys, its weights exp(s - m) / l summed down the column into the band's own part of
 *    the output.  A task owns its keys, so the sums need no partial vectors and their order
 *    is fixed: results are the same from run to run whatever the thread count.
 *
 * Arithmetic is in the job's precision (attention_reduce_impl.inc is instantiated for both),
 * as the kernels compute the output, with every sum in double (a float job's after at most
 * 64 float additions).  The scores and exponentials are the kernel path's
 * (attention_fused.h), so each --kernel path computes its own.
 */
#include "attention_reduce.h"

#include <math.h>
#include <string.h>

#include "attention_floats.h"
#include "attention_fused.h"
#include "core/compute.h"
#include "core/mem.h"

/* Queries and keys per score tile: 66 x 512 doubles is 264 KiB, which stays in L2.  The rows
 * are whole register groups of the path's micro-kernel (reduce_scores stores whole groups). */
#define REDUCE_ROWS 66
#define REDUCE_KEYS 512
/* Queries per sweep-1 task (four score tiles) and keys per sweep-2 task. */
#define REDUCE_TASK_ROWS (4 * REDUCE_ROWS)
#define REDUCE_TASK_KEYS 1024
/* Rows a float job's column sums of `received` take in float before they go into double. */
#define REDUCE_FLUSH_ROWS 16
/* The score tiles start at multiples of the packed K's tiles, and a row holds whole ones. */
_Static_assert(REDUCE_KEYS % ATTN_FUSED_BK == 0 && REDUCE_TASK_KEYS % REDUCE_KEYS == 0,
               "score tiles are whole tiles of packed K");
_Static_assert(REDUCE_ROWS % ATTN_FUSED_MR == 0, "a score tile holds its last group whole");

int attention_reduce_any(const attn_reduce *r)
{
    return r != NULL &&
           (r->entropy || r->max || r->received || r->want_sink || r->want_local || r->topk > 0);
}

/* The top-k kept per row in sweep 1: topk, or 1 for max alone. */
static size_t kept(const attn_reduce *r)
{
    return r->topk > 0 ? r->topk : r->max ? 1 : 0;
}

size_t attention_reduce_numbers(const attn_reduce *r, const attn_job *job)
{
    if (!attention_reduce_any(r))
        return 0;
    size_t rows = job->batch * job->heads * job->lq;
    size_t n = rows * ((size_t)(r->entropy != 0) + 2 * (size_t)(r->max != 0) +
                       (size_t)(r->want_sink != 0) + (size_t)(r->want_local != 0) + 2 * r->topk);
    if (r->received)
        n += job->batch * job->heads * job->lk;
    return n;
}

/* Scratch bytes per compute slot (the layout of slot_layout in attention_reduce_impl.inc):
 * per row of a tile its m, l, u, sink and local, a key tile's column sums (sweep 2) and
 * each row's top-k (a score and an index each) and count; then a score tile and one row's
 * exponentials in the job's precision. */
static size_t slot_bytes(const attn_job *job, const attn_reduce *r)
{
    size_t real = job->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    return (5 * (size_t)REDUCE_ROWS + REDUCE_KEYS) * sizeof(double) +
           (size_t)REDUCE_ROWS * kept(r) * (sizeof(double) + sizeof(int64_t)) +
           (size_t)REDUCE_ROWS * sizeof(size_t) +
           ((size_t)REDUCE_ROWS * REDUCE_KEYS + REDUCE_KEYS) * real;
}

/* Numbers of packed K per (batch, head): its keys rounded up to whole tiles. */
static size_t packed_k_numbers(const attn_job *job)
{
    return (job->lk + ATTN_FUSED_BK - 1) / ATTN_FUSED_BK * ATTN_FUSED_BK *
           (job->dk / job->heads);
}

size_t attention_reduce_scratch_bytes(const attn_job *job)
{
    const attn_reduce *r = job->reduce;
    if (!attention_reduce_any(r))
        return 0;
    /* the float copies of q and k, unless the job gives them as float (job->q32, k32) */
    int in_place = job->weights == NULL && job->q32 != NULL && job->k32 != NULL;
    unsigned slots = compute_threads() > 0 ? compute_threads() : 1;   /* as the run takes */
    size_t real = job->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    return (size_t)slots * slot_bytes(job, r) +
           2 * job->batch * job->heads * job->lq * sizeof(double) +
           job->batch * job->heads * packed_k_numbers(job) * real +
           (in_place ? 0 : attention_float_qk_count(job) * sizeof(float));
}

typedef struct reduce_ctx {
    const attn_job *job;
    const attn_reduce *r;
    const void *q, *k;          /* the job's precision (double or float) */
    attn_reduced *out;
    double *m, *l;              /* each row's final maximum and sum: batch x heads x lq */
    const attn_kernel_path *path;
    void *kt;                   /* K packed, kt_stride numbers per (batch, head) */
    size_t kt_stride;
    size_t kept;
    size_t bands;               /* sweep 1: query bands per (batch, head); sweep 2: key bands */
    void *scratch;              /* slot_bytes() per slot */
    size_t stride;
    _Atomic int not_finite;
} reduce_ctx;

#define REAL double
#define SFX d
#include "attention_reduce_impl.inc"

#define REAL float
#define SFX f
#include "attention_reduce_impl.inc"

/* Allocates the arrays r asks for; returns 0 or -1 (those allocated are freed with the
 * result). */
static int alloc_out(const attn_job *job, const attn_reduce *r, attn_reduced *o)
{
    size_t rows = job->batch * job->heads * job->lq;
    int bad = 0;
#define ALLOC(p, cond, n)                                                                       \
    do {                                                                                        \
        if (cond) {                                                                             \
            (p) = mem_malloc((n) * sizeof *(p));                                                \
            bad |= (p) == NULL;                                                                 \
        }                                                                                       \
    } while (0)
    ALLOC(o->entropy, r->entropy, rows);
    ALLOC(o->max_weight, r->max, rows);
    ALLOC(o->argmax, r->max, rows);
    ALLOC(o->sink, r->want_sink, rows);
    ALLOC(o->local, r->want_local, rows);
    ALLOC(o->topk_weights, r->topk > 0, rows * r->topk);
    ALLOC(o->topk_indices, r->topk > 0, rows * r->topk);
    ALLOC(o->received, r->received, job->batch * job->heads * job->lk);
#undef ALLOC
    return bad ? -1 : 0;
}

int attention_reduce_run(const attn_job *job, const double *q, const double *k, const float *qf,
                         const float *kf, attn_result *result)
{
    const attn_reduce *r = job->reduce;
    if (!attention_reduce_any(r))
        return 0;
    reduce_ctx c = {.job = job, .r = r, .q = q, .k = k, .out = &result->reduced,
                    .kept = kept(r), .path = attn_kernel_current(),
                    .kt_stride = packed_k_numbers(job)};
    size_t bh = job->batch * job->heads;
    int f32 = job->dtype == ATTN_FLOAT32;
    float *copies = NULL;
    int rc = ERR_UNAVAILABLE;
    if (alloc_out(job, r, &result->reduced) != 0)
        goto done;
    c.m = mem_malloc(2 * bh * job->lq * sizeof(double));
    if (c.m == NULL)
        goto done;
    c.l = c.m + bh * job->lq;
    /* a float32 job is reduced in float32, from q and k as the kernels had them */
    if (f32 && (qf == NULL || kf == NULL)) {
        copies = attention_floats_pair(q, job->batch * job->lq * job->dk, k,
                                       job->batch * job->lk * job->dk);
        if (copies == NULL)
            goto done;
        qf = copies;
        kf = copies + job->batch * job->lq * job->dk;
    }
    if (f32) {
        c.q = qf;
        c.k = kf;
    }
    c.stride = slot_bytes(job, r);
    unsigned threads = compute_threads() > 0 ? compute_threads() : 1;
    c.scratch = mem_malloc((size_t)threads * c.stride);
    /* Zeroed: the score tiles read whole tiles of K, and the pack pads only whole panels. */
    c.kt = mem_calloc(bh * c.kt_stride, f32 ? sizeof(float) : sizeof(double));
    if (c.scratch == NULL || c.kt == NULL)
        goto done;
    compute_parallel(bh, bh < threads ? (unsigned)bh : threads, f32 ? pack_task_f : pack_task_d,
                     &c);
    c.bands = (job->lq + REDUCE_TASK_ROWS - 1) / REDUCE_TASK_ROWS;
    size_t tasks = bh * c.bands;
    compute_parallel(tasks, tasks < threads ? (unsigned)tasks : threads,
                     f32 ? rows_task_f : rows_task_d, &c);
    if (!c.not_finite && r->received && !compute_stopped()) {
        c.bands = (job->lk + REDUCE_TASK_KEYS - 1) / REDUCE_TASK_KEYS;
        tasks = bh * c.bands;
        compute_parallel(tasks, tasks < threads ? (unsigned)tasks : threads,
                         f32 ? keys_task_f : keys_task_d, &c);
    }
    rc = c.not_finite ? 1 : 0;
done:
    mem_free(c.kt);
    mem_free(c.scratch);
    mem_free(c.m);
    mem_free(copies);
    return rc;
}

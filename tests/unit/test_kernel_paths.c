/*
 * test_kernel_paths.c - every path of the fused kernel (server/kernel/attention_fused.h)
 * that this CPU can run, held to the float64 reference.
 *
 * Each test runs once per available path (attn_kernel_select), through
 * attention_run with the attention matrix not wanted, so that packing, the
 * kernel and the final division are all covered: odd token counts (1, 3, 17,
 * 1000) and head dims (1, 8, 64, 100, 128, 256), several heads and batch
 * entries, lq != lk, masks with fully masked rows, causal, logits large
 * enough that the running maximum climbs tile after tile, float32 (1e-5
 * relative) and float64 (1e-12 relative), sub-blocks of 6 to 384 query
 * rows whatever the cache gives.  The polynomial exponential of each path is
 * held to exp and expf over the whole range it is used on, and the rule that
 * sizes the sub-blocks by the L2 to worked cases.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <valgrind/valgrind.h>

#include "kernel/attention.h"
#include "kernel/attention_fused.h"
#include "core/compute.h"
#include "core/test_hooks.h"
#include "ref/reference.h"
#include "test.h"

static uint64_t paths_rng = 0x13198A2E03707344ull;

#define MAX_PATHS 4     /* avx512, avx2, portable and the tests' avx512-on-avx2 */

/* The paths this CPU runs, widest first, but the bfloat16 variants: the ones to test. */
/* How many of them the next cases run, widest first (test_kernel_paths_on_pool lowers it
 * under valgrind). */
static size_t paths_limit = MAX_PATHS;

static size_t paths_available(const attn_kernel_path **paths)
{
    return test_float_paths(paths, paths_limit);
}

/* Relative error of out against ref: the largest difference over the
 * largest |ref| (1 when that is smaller), +Inf on NaN. */
static double relative_error(const double *out, const double *ref, size_t n)
{
    double big = 1;
    for (size_t i = 0; i < n; i++)
        big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    return test_max_abs_diff(out, ref, n) / big;
}

typedef struct paths_case {
    size_t batch, heads, lq, lk, hd;
    int causal;
    int masked;                 /* random mask, every 5th row fully masked */
    double logit;               /* scores reach about +-logit */
} paths_case;

/* The precisions a job is run in: float64; float32 given double inputs; float32 given
 * float inputs with a float output (attn_job.q32 ..., output_f32, as the v2 path runs
 * binary FP32 tensors). */
enum { RUN_F64, RUN_F32, RUN_F32_IN_OUT, RUN_KINDS };
static const char *const run_kind_names[RUN_KINDS] = {"float64", "float32",
                                                      "float32 in and out"};

/* job's output as double: r's, or r's float output widened into *wide. */
static const double *output_of(const attn_result *r, size_t count, double **wide)
{
    if (r->output_f32 == NULL)
        return r->output;
    *wide = malloc(count * sizeof(double));
    for (size_t i = 0; i < count; i++)
        (*wide)[i] = r->output_f32[i];
    return *wide;
}

/* Makes job a RUN_* kind; f32 holds float copies of q, k and v (q32, k32, v32). */
static void job_kind(attn_job *job, int kind, const double *const *f64, const float *const *f32)
{
    int in32 = kind == RUN_F32_IN_OUT;
    job->dtype = kind == RUN_F64 ? ATTN_FLOAT64 : ATTN_FLOAT32;
    job->q = in32 ? NULL : f64[0];
    job->k = in32 ? NULL : f64[1];
    job->v = in32 ? NULL : f64[2];
    job->q32 = in32 ? f32[0] : NULL;
    job->k32 = in32 ? f32[1] : NULL;
    job->v32 = in32 ? f32[2] : NULL;
    job->output_f32 = in32;
}

/* Runs job (output only) on every available path and compares with ref;
 * fully masked rows (every 5th when masked) must be exactly zero.  Returns
 * 0, or -1 after printing what disagreed. */
static int run_paths(const paths_case *c, attn_job *job, const double *ref)
{
    size_t nk = c->batch * c->lk * job->dk, nq = c->batch * c->lq * job->dk;
    const double *f64[3] = {job->q, job->k, job->v};
    float *f32[3] = {malloc(nq * sizeof(float)), malloc(nk * sizeof(float)),
                     malloc(nk * sizeof(float))};
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < (a ? nk : nq); i++)
            f32[a][i] = (float)f64[a][i];
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = paths_available(paths), dv = c->heads * c->hd;
    size_t count = c->batch * c->lq * dv;
    double *f32_out = malloc(count * sizeof(double));
    char err[200];
    int rc = 0;
    for (size_t p = 0; p < n && rc == 0; p++) {
        if (attn_kernel_select(paths[p]->name, err, sizeof err) != 0) {
            fprintf(stderr, "  %s\n", err);
            return -1;
        }
        for (int kind = 0; kind < RUN_KINDS && rc == 0; kind++) {
            job_kind(job, kind, f64, (const float *const *)f32);
            attn_result r;
            attn_error e;
            if (attention_run(job, &r, &e) != 0) {
                fprintf(stderr, "  %s: attention_run failed: %s\n", paths[p]->name, e.message);
                rc = -1;
                break;
            }
            double *wide = NULL;
            const double *out = output_of(&r, count, &wide);
            double tol = kind == RUN_F64 ? 1e-12 : 1e-5, error = relative_error(out, ref, count);
            int zero_ok = 1;
            for (size_t i = 2; c->masked && i < c->batch * c->lq; i += 5)
                for (size_t t = 0; t < dv; t++)
                    zero_ok &= out[i * dv + t] == 0.0;
            /* float32 from float inputs is the same computation as from their double
             * copies: the same numbers, bit for bit */
            int same = 1;
            if (kind == RUN_F32)
                memcpy(f32_out, out, count * sizeof(double));
            for (size_t i = 0; kind == RUN_F32_IN_OUT && i < count; i++)
                same &= out[i] == f32_out[i];
            if (!(error <= tol) || !zero_ok || !same ||
                (kind == RUN_F32_IN_OUT) != (r.output == NULL)) {
                fprintf(stderr, "  path %s %s: batch %zu heads %zu lq %zu lk %zu head dim %zu "
                        "causal %d masked %d logit %g: relative error %g, masked rows zero %d, "
                        "output as double %d, same as float32 from doubles %d\n",
                        paths[p]->name, run_kind_names[kind], c->batch, c->heads, c->lq, c->lk,
                        c->hd, c->causal, c->masked, c->logit, error, zero_ok, r.output != NULL,
                        same);
                rc = -1;
            }
            free(wide);
            attention_result_free(&r);
        }
    }
    job_kind(job, RUN_F64, f64, (const float *const *)f32);
    for (int a = 0; a < 3; a++)
        free(f32[a]);
    free(f32_out);
    attn_kernel_select("auto", err, sizeof err);
    return rc;
}

/* The job of case c's shape: batch, lengths, heads and their widths, causal; run_case adds
 * the inputs, the mask and the scale. */
static attn_job case_job(const paths_case *c)
{
    return (attn_job){.batch = c->batch, .lq = c->lq, .lk = c->lk, .heads = c->heads,
                      .dk = c->heads * c->hd, .dv = c->heads * c->hd, .causal = c->causal};
}

/* The inputs of one case and their reference, made once and run on every path (and, for
 * the block-rows test, at every sub-block size). */
typedef struct case_inputs {
    double *q, *k, *v, *ref, *ref_attn;
    unsigned char *mask;
    attn_job job;
} case_inputs;

static void case_free(case_inputs *in)
{
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->ref);
    free(in->ref_attn);
    free(in->mask);
}

/* Builds the inputs of c and computes the reference into *in.
 * The keys grow along the sequence so that the running maximum climbs tile
 * after tile and the sums are rescaled; scores reach about +-logit. */
static void case_build(const paths_case *c, case_inputs *in)
{
    size_t dk = c->heads * c->hd, nq = c->batch * c->lq * dk, nk = c->batch * c->lk * dk;
    double *q = malloc(nq * sizeof(double)), *k = malloc(nk * sizeof(double));
    double *v = malloc(nk * sizeof(double)), *ref = malloc(nq * sizeof(double));
    double *ref_attn = malloc(c->batch * c->heads * c->lq * c->lk * sizeof(double));
    unsigned char *mask = c->masked ? malloc(c->batch * c->lq * c->lk) : NULL;
    double amp = sqrt(c->logit) / 2;
    for (size_t i = 0; i < nq; i++)
        q[i] = test_uniform(&paths_rng) * amp;
    for (size_t b = 0; b < c->batch; b++)
        for (size_t j = 0; j < c->lk; j++)
            for (size_t t = 0; t < dk; t++)
                k[(b * c->lk + j) * dk + t] = test_uniform(&paths_rng) * amp *
                                              (0.5 + (double)j / (double)c->lk);
    for (size_t i = 0; i < nk; i++)
        v[i] = test_uniform(&paths_rng);
    for (size_t i = 0; mask != NULL && i < c->batch * c->lq; i++)
        for (size_t j = 0; j < c->lk; j++)
            mask[i * c->lk + j] = i % 5 == 2 ? 0 : test_uniform(&paths_rng) > -1.0;
    /* Inputs that float32 holds exactly, so that the float32 error is the
     * kernel's arithmetic, not the rounding of its inputs. */
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)q[i];
    for (size_t i = 0; i < nk; i++) {
        k[i] = (float)k[i];
        v[i] = (float)v[i];
    }
    double scale = 1 / sqrt((double)c->hd);
    ref_sdpa(c->batch, c->heads, c->lq, c->lk, c->hd, c->hd, q, k, v, mask, c->causal, scale,
             ref, ref_attn);
    *in = (case_inputs){q, k, v, ref, ref_attn, mask, case_job(c)};
    in->job.q = q;
    in->job.k = k;
    in->job.v = v;
    in->job.mask = mask;
    in->job.mask_batched = 1;
    in->job.scale = scale;
}

/* Builds the inputs of c, computes the reference and runs every path. */
static int run_case(const paths_case *c)
{
    case_inputs in;
    case_build(c, &in);
    int rc = run_paths(c, &in.job, in.ref);
    case_free(&in);
    return rc;
}

/* Token counts and head dims of the sweep; the (1000, 1000) pair runs at
 * the head dims of most use alone (the reference is slow). */
static const size_t sweep_tokens[] = {1, 3, 17, 1000};
static const size_t sweep_dims[] = {1, 8, 64, 100, 128, 256};
/* Under valgrind and AddressSanitizer the head dims of every shape of the kernels' loops but
 * the repeats: 1 and 8 (narrower than a vector), 100 (whole vectors and a tail) and 256
 * (whole vectors with no tail, at ATTN_FUSED_MAX_DIM, the buffers' edge); 64 and 128 are
 * whole vectors with no tail too, and the plain suite runs them for the numbers. */
static const size_t instrumented_dims[] = {1, 8, 100, 256};

static void sweep(int causal, int masked, double logit)
{
    int valgrind = RUNNING_ON_VALGRIND != 0;
#ifdef __SANITIZE_ADDRESS__
    int instrumented = 1;
#else
    int instrumented = valgrind;
#endif
    const size_t *dims = instrumented ? instrumented_dims : sweep_dims;
    size_t dim_count = instrumented ? sizeof instrumented_dims / sizeof instrumented_dims[0]
                                    : sizeof sweep_dims / sizeof sweep_dims[0];
    for (size_t d = 0; d < dim_count; d++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++) {
                size_t lq = sweep_tokens[a], lk = sweep_tokens[b], hd = dims[d];
                if (lq == 1000 && lk == 1000 && (valgrind || (hd != 64 && hd != 100)))
                    continue;
                /* Under valgrind (about 50 times slower) one long side at a time, and
                 * the widest heads only against short sequences. */
                if (valgrind && (lq + lk > 1100 || (hd > 100 && lq + lk > 40)))
                    continue;
                size_t heads = hd <= 8 ? 3 : 2, batch = lq * lk > 20000 ? 1 : 2;
                paths_case c = {batch, heads, lq, lk, hd, causal, masked, logit};
                if (run_case(&c) != 0)
                    FAIL_AT("a kernel path disagrees with the reference (see above)");
            }
}

void test_kernel_paths_plain(void)
{
    sweep(0, 0, 5);
}

void test_kernel_paths_masked(void)
{
    sweep(0, 1, 5);
}

void test_kernel_paths_causal(void)
{
    sweep(1, 0, 5);
    sweep(1, 1, 5);
}

/* Scores near +-12 on top of the climbing keys: weights that span ten
 * orders of magnitude, and running maxima that climb by more than the
 * output-only softmax's slack (ATTN_FUSED_SLACK) between tiles, unmasked
 * (whole register groups at once) and masked (row by row).  (Larger scores measure float32 itself rather than
 * the kernel: at +-25 over 1000 keys OpenBLAS's float32 products are
 * already within 1.5 of the 1e-5 bound, as the fused paths are; the
 * overflow tests take the scores to the end of the range.) */
void test_kernel_paths_large_logits(void)
{
    sweep(0, 0, 12);
    sweep(0, 1, 12);
}

/* The same on the compute pool, with several tasks per head.  In the first
 * three cases the queue's last blocks go in pieces (FUSED_TAIL_SPLIT): blocks
 * of 258 rows in pieces of 66 and a head's last block of 226 in 60 and 46;
 * causal, blocks of 132 in two pieces, handed out in reverse; and a head's
 * last block of 6 rows, whose pieces after the first are empty. */
void test_kernel_paths_on_pool(void)
{
    /* Under valgrind on the widest path only, the server's, and with heads a quarter as
     * wide: what these cases add to the sweeps and to block_rows, which run every path and
     * head dim there, is the queue's split into tasks and pieces, the same code whatever
     * the path, and a split that the head dim does not change (the first check below). */
    paths_limit = RUNNING_ON_VALGRIND ? 1 : MAX_PATHS;
    size_t narrow = RUNNING_ON_VALGRIND ? 4 : 1;
    ASSERT_EQ(compute_init(3), 0);
    struct {
        paths_case c;
        int tail;               /* the split must put the last blocks in pieces */
    } cases[] = {
        {{2, 2, 1000, 300, 64, 0, 1, 5}, 1},
        {{1, 2, 800, 800, 32, 1, 0, 5}, 1},
        {{2, 2, 780, 300, 64, 0, 0, 5}, 1},
        {{1, 2, 600, 600, 32, 1, 0, 5}, 0},
        {{3, 1, 130, 1000, 128, 1, 1, 20}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        paths_case narrowed = cases[i].c;
        narrowed.hd /= narrow;
        const paths_case *c = &narrowed;
        attn_job job = case_job(c);
        size_t blocks, tasks;
        attention_split_for_testing(&job, &blocks, &tasks);
        if ((tasks > blocks) != cases[i].tail) {
            compute_shutdown();
            paths_limit = MAX_PATHS;
            FAIL_AT("case %zu: %zu blocks run as %zu tasks", i, blocks, tasks);
        }
        if (run_case(c) != 0) {
            compute_shutdown();
            paths_limit = MAX_PATHS;
            FAIL_AT("a kernel path disagrees with the reference on the pool (see above)");
        }
    }
    compute_shutdown();
    paths_limit = MAX_PATHS;
}

/* Twelve (batch, head)s of one block each on three slots, packed by their tasks while the
 * other slots work: a tile at a time by a block of one sub-block (sdpa_plan.pack
 * PACK_TILES), and whole into the slot's area, over the previous head's there, by a block
 * of several (PACK_SLOTS, sub-blocks of one register group forced); causal, and masked
 * with fully masked rows, against the reference on every path. */
void test_kernel_paths_slot_areas(void)
{
    paths_limit = RUNNING_ON_VALGRIND ? 1 : MAX_PATHS;
    ASSERT_EQ(compute_init(3), 0);
    const struct {
        size_t rows;            /* forced sub-block rows, 0: the cache's */
        const char *pack;
        int causal;
    } runs[] = {{0, "tiles", 0}, {0, "tiles", 1}, {ATTN_FUSED_MR, "slots", 0}};
    int rc = 0;
    char why[128] = "";
    for (size_t i = 0; rc == 0 && i < sizeof runs / sizeof runs[0]; i++) {
        paths_case c = {3, 4, 40, RUNNING_ON_VALGRIND ? 300 : 1000, 64, runs[i].causal, 1, 5};
        attn_job job = case_job(&c);
        size_t blocks, tasks;
        attn_fused_rows_for_testing(runs[i].rows);
        attention_split_for_testing(&job, &blocks, &tasks);
        const char *pack = attention_pack_for_testing(&job);
        if (blocks != 12 || tasks != 12 || strcmp(pack, runs[i].pack) != 0) {
            snprintf(why, sizeof why, "run %zu: %zu blocks as %zu tasks packed by %s, not 12 by %s",
                     i, blocks, tasks, pack, runs[i].pack);
            rc = -2;
        } else {
            rc = run_case(&c);
        }
        attn_fused_rows_for_testing(0);
    }
    compute_shutdown();
    paths_limit = MAX_PATHS;
    if (rc == -2)
        FAIL_AT("%s", why);
    if (rc != 0)
        FAIL_AT("a kernel path disagrees with the reference (see above)");
}

/* Sub-blocks of one register group, of the fewest and of the most rows the
 * cache may give, and of a count the tasks' rows do not divide
 * (attn_fused_rows_for_testing), whatever this CPU's cache gives: tasks of
 * several sub-blocks shared out unevenly, a last one shorter, causal limits
 * and fully masked rows inside them, float64 and float32 on every path. */
void test_kernel_paths_block_rows(void)
{
    /* under valgrind the fewest rows and a count the tasks' rows do not divide; the plain
     * and sanitized suites run the four */
    const size_t rows[] = {ATTN_FUSED_MR, 100, ATTN_FUSED_FQ_MIN, ATTN_FUSED_FQ_MAX};
    size_t row_count = RUNNING_ON_VALGRIND ? 2 : sizeof rows / sizeof rows[0];
    paths_case cases[] = {
        {1, 2, 800, 300, 64, 0, 1, 5},
        {1, 1, 700, 400, 32, 1, 0, 5},
        {2, 1, 400, 130, 100, 1, 1, 12},
    };
    /* each case's inputs and reference once, for every sub-block size */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        case_inputs in;
        case_build(&cases[i], &in);
        for (size_t r = 0; r < row_count; r++) {
            attn_fused_rows_for_testing(rows[r]);
            int rc = run_paths(&cases[i], &in.job, in.ref);
            attn_fused_rows_for_testing(0);
            if (rc != 0) {
                case_free(&in);
                FAIL_AT("sub-blocks of %zu rows disagree with the reference (see above)",
                        rows[r]);
            }
        }
        case_free(&in);
    }
}

/* The rule that sizes the sub-blocks by the second-level cache
 * (attn_fused_rows_for_cache), on worked cases and over a range of caches and
 * heads: whole register groups within the bounds, never fewer for a larger
 * cache; and this CPU's cache as glibc reports it. */
void test_kernel_block_rows_rule(void)
{
    /* 1 MiB, float, heads of 64: 512 KiB / 512 B a row - 64 for the tile = 960, capped */
    ASSERT_EQ(attn_fused_rows_for_cache(1 << 20, 64, 64, 4), ATTN_FUSED_FQ_MAX);
    /* 1 MiB, double, heads of 128: 512 KiB / 2 KiB - 64 = 192 */
    ASSERT_EQ(attn_fused_rows_for_cache(1 << 20, 128, 128, 8), 192);
    /* 256 KiB, double, heads of 64: 128 - 64 = 64, down to whole groups: 60 */
    ASSERT_EQ(attn_fused_rows_for_cache(256 << 10, 64, 64, 8), 60);
    /* 2 MiB, double, heads of 256: 1 MiB / 4 KiB - 64 = 192 */
    ASSERT_EQ(attn_fused_rows_for_cache(2 << 20, 256, 256, 8), 192);
    /* too small a cache for the tile alone: the floor */
    ASSERT_EQ(attn_fused_rows_for_cache(32 << 10, 256, 256, 8), ATTN_FUSED_FQ_MIN);
    ASSERT_EQ(attn_fused_rows_for_cache(0, 64, 64, 4), ATTN_FUSED_FQ_MIN);
    const size_t dims[] = {1, 8, 64, 100, 128, 256};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (size_t size = 4; size <= 8; size += 4) {
            size_t pad = attn_fused_vpad(dims[d], size), last = 0;
            for (size_t l2 = 0; l2 <= (8u << 20); l2 += 24 << 10) {
                size_t r = attn_fused_rows_for_cache(l2, dims[d], pad, size);
                ASSERT_EQ(r % ATTN_FUSED_MR, 0);
                ASSERT(r >= ATTN_FUSED_FQ_MIN && r <= ATTN_FUSED_FQ_MAX);
                ASSERT(r >= last);
                last = r;
            }
        }
    int reported = -1;
    size_t l2 = attn_fused_l2_bytes(&reported);
    long cpu = sysconf(_SC_LEVEL2_CACHE_SIZE);
    ASSERT_EQ(reported, cpu > 0);
    ASSERT_EQ(l2, cpu > 0 ? (size_t)cpu : (size_t)ATTN_FUSED_L2_ASSUMED);
    ASSERT_EQ(attn_fused_block_rows(64, 64, 4), attn_fused_rows_for_cache(l2, 64, 64, 4));
}

/* Heads wider than ATTN_FUSED_MAX_DIM take the BLAS path even without the
 * attention matrix: the same answers, masks, causal and empty rows. */
void test_kernel_paths_wide_heads(void)
{
    paths_case cases[] = {
        {1, 2, 17, 300, ATTN_FUSED_MAX_DIM + 44, 0, 1, 5},
        {2, 1, 70, 33, ATTN_FUSED_MAX_DIM + 1, 1, 1, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (run_case(&cases[i]) != 0)
            FAIL_AT("wide heads disagree with the reference (see above)");
}

/* An overflowing score (float32 past 3.4e38, float64 past 1.8e308) in a late
 * tile is not_finite on every path, as is a NaN score. */
void test_kernel_paths_overflow_reported(void)
{
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = paths_available(paths), lk = 300;
    double q[24], *k = calloc(lk * 2, sizeof(double));
    for (size_t i = 0; i < 24; i++)
        q[i] = 1e200;
    double *v = calloc(lk * 2, sizeof(double));
    char why[200];
    k[2 * 250] = 1e200;                 /* Inf score in tile 3 */
    k[2 * 100] = 1e200;                 /* Inf - Inf: a NaN score in tile 1 */
    k[2 * 100 + 1] = -1e200;
    for (size_t p = 0; p < n; p++) {
        ASSERT_EQ(attn_kernel_select(paths[p]->name, why, sizeof why), 0);
        /* 12 query rows: whole register groups, which take the kernel's softmax of
         * full tiles (softmax_group); 1 row: the row by row one. */
        for (int dtype = 0; dtype < 2; dtype++)
            for (size_t c = 0; c < 4; c++) {
                size_t dk = 1 + c / 2, lq = c % 2 ? 12 : 1;
                attn_job job = {.batch = 1, .lq = lq, .lk = lk, .heads = 1, .dk = dk, .dv = 1,
                                .q = q, .k = k, .v = v, .scale = 1,
                                .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
                /* dk = 2 reads k as 300 rows of 2: rows 50 and 125 hold the big keys. */
                attn_result r;
                attn_error err;
                int rc = attention_run(&job, &r, &err);
                if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0) {
                    free(k);
                    free(v);
                    attn_kernel_select("auto", why, sizeof why);
                    FAIL_AT("path %s dtype %d dk %zu lq %zu: rc %d", paths[p]->name, dtype, dk,
                            lq, rc);
                }
            }
    }
    free(k);
    free(v);
    attn_kernel_select("auto", why, sizeof why);
}

/* A float32 output past float's range is not_finite whether it is widened or kept as
 * float (output_f32): v = 1e39 is finite in double and infinite in float. */
void test_kernel_paths_float_output_not_finite(void)
{
    double q[2] = {1, 0}, k[4] = {1, 0, 0, 1}, v[2] = {1e39, 1};
    for (int out32 = 0; out32 < 2; out32++) {
        attn_job job = {.batch = 1, .lq = 1, .lk = 2, .heads = 1, .dk = 2, .dv = 1, .q = q,
                        .k = k, .v = v, .scale = 1, .dtype = ATTN_FLOAT32,
                        .output_f32 = out32};
        attn_result r;
        attn_error err;
        int rc = attention_run(&job, &r, &err);
        if (rc == 0)
            attention_result_free(&r);
        if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0)
            FAIL_AT("output_f32 %d: rc %d", out32, rc);
    }
}

/* The polynomial exponential of every path against exp and expf over the
 * range the kernel uses it on (x <= 0): within a few units in the last
 * place down to where the result leaves the normal range, 0 below that and
 * for -Inf, NaN for NaN. */
void test_kernel_paths_exp_accuracy(void)
{
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = paths_available(paths), count = RUNNING_ON_VALGRIND ? 20000 : 400000;
    double *xd = malloc((count + 3) * sizeof(double));
    float *xf = malloc((count + 3) * sizeof(float));
    for (size_t p = 0; p < n; p++) {
        double worst_d = 0, worst_f = 0;
        for (size_t i = 0; i < count; i++) {
            /* Evenly over [-708, 0] and [-87, 0], plus a random offset. */
            double u = ((double)i + (test_uniform(&paths_rng) + 2) / 4) / (double)count;
            xd[i] = -708.0 * u;
            xf[i] = (float)(-87.0 * u);
        }
        xd[count] = xf[count] = 0;
        xd[count + 1] = xf[count + 1] = -INFINITY;
        xd[count + 2] = -800;
        xf[count + 2] = -100;
        double *yd = malloc((count + 3) * sizeof(double));
        float *yf = malloc((count + 3) * sizeof(float));
        memcpy(yd, xd, (count + 3) * sizeof(double));
        memcpy(yf, xf, (count + 3) * sizeof(float));
        paths[p]->exp_d(yd, count + 3);
        paths[p]->exp_f(yf, count + 3);
        for (size_t i = 0; i < count; i++) {
            double ed = exp(xd[i]), ef = (double)expf(xf[i]);
            double rd = fabs(yd[i] - ed) / ed, rf = fabs((double)yf[i] - ef) / ef;
            worst_d = rd > worst_d ? rd : worst_d;
            worst_f = rf > worst_f ? rf : worst_f;
        }
        int edges = yd[count] == 1 && yf[count] == 1 && yd[count + 1] == 0 &&
                    yf[count + 1] == 0 && yd[count + 2] == 0 && yf[count + 2] == 0;
        double nan_d = NAN;
        float nan_f = NAN;
        paths[p]->exp_d(&nan_d, 1);
        paths[p]->exp_f(&nan_f, 1);
        free(yd);
        free(yf);
        if (!(worst_d <= 4 * DBL_EPSILON) || !(worst_f <= 4 * FLT_EPSILON) || !edges ||
            nan_d == nan_d || nan_f == nan_f) {
            free(xd);
            free(xf);
            FAIL_AT("path %s: relative error %g (double), %g (float), edges %d, NaN kept %d %d",
                    paths[p]->name, worst_d, worst_f, edges, nan_d != nan_d, nan_f != nan_f);
        }
    }
    free(xd);
    free(xf);
}

/* Scores near the end of each precision's range, but finite, are computed,
 * not reported: the row maximum times log2(e) would overflow, so the fused
 * kernel's softmax must not form it.  6 query rows against 32 keys (a full
 * tile, the kernel's fast group softmax) and 1 row against 2 keys (the row
 * by row one), output only and with the attention matrix: every row's
 * largest score is 1.44e308 (float64) or 2.56e38 (float32), the others far
 * lower, so every output row is v of key 0.  On every path. */
void test_kernel_paths_huge_finite_scores(void)
{
    enum { LQ = 6, LK = 32 };
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = paths_available(paths);
    double q[LQ], k[LK], v[LK];
    char why[200];
    for (size_t p = 0; p < n * 2; p++) {
        int dtype = (int)(p % 2);
        ASSERT_EQ(attn_kernel_select(paths[p / 2]->name, why, sizeof why), 0);
        double big = dtype ? 1.6e19 : 1.2e154, low = dtype ? 1e19 : 8e153;
        for (int i = 0; i < LQ; i++)
            q[i] = big;
        for (int j = 0; j < LK; j++) {
            k[j] = j == 0 ? big : low;
            v[j] = j + 1;
        }
        for (int shape = 0; shape < 2; shape++)
            for (int want = 0; want < 2; want++) {
                attn_job job = {.batch = 1, .lq = shape ? 1 : LQ, .lk = shape ? 2 : LK,
                                .heads = 1, .dk = 1, .dv = 1, .q = q, .k = k, .v = v,
                                .scale = 1, .want_attention = want,
                                .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
                attn_result r;
                attn_error err;
                error_clear(&err);
                int rc = attention_run(&job, &r, &err);
                if (rc != 0) {
                    attn_kernel_select("auto", why, sizeof why);
                    FAIL_AT("path %s dtype %d shape %d attention %d: rc %d (%s)",
                            paths[p / 2]->name, dtype, shape, want, rc, err.code);
                }
                for (size_t i = 0; i < job.lq; i++)
                    if (r.output[i] != 1) {
                        double got = r.output[i];
                        attention_result_free(&r);
                        attn_kernel_select("auto", why, sizeof why);
                        FAIL_AT("path %s dtype %d shape %d attention %d: output[%zu] = %.17g, "
                                "want 1", paths[p / 2]->name, dtype, shape, want, i, got);
                    }
                attention_result_free(&r);
            }
    }
    ASSERT_EQ(attn_kernel_select("auto", why, sizeof why), 0);
}

/* The softmax's 2^x of every path against exp2 and exp2f over the range the
 * kernel uses it on (x <= ATTN_FUSED_SLACK): within a few units in the last
 * place down to where the result leaves the normal range, 0 below that and
 * for -Inf, NaN for NaN. */
void test_kernel_paths_exp2_accuracy(void)
{
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = paths_available(paths), count = RUNNING_ON_VALGRIND ? 20000 : 400000;
    double *yd = malloc((count + 3) * sizeof(double)), *xd = malloc(count * sizeof(double));
    float *yf = malloc((count + 3) * sizeof(float)), *xf = malloc(count * sizeof(float));
    for (size_t p = 0; p < n; p++) {
        double worst_d = 0, worst_f = 0;
        for (size_t i = 0; i < count; i++) {
            /* Evenly over [-1022, slack] and [-126, slack], plus a random offset. */
            double u = ((double)i + (test_uniform(&paths_rng) + 2) / 4) / (double)count;
            yd[i] = xd[i] = ATTN_FUSED_SLACK - (1022.0 + ATTN_FUSED_SLACK) * u;
            yf[i] = xf[i] = (float)(ATTN_FUSED_SLACK - (126.0 + ATTN_FUSED_SLACK) * u);
        }
        yd[count] = yf[count] = 0;
        yd[count + 1] = yf[count + 1] = -INFINITY;
        yd[count + 2] = -1100;
        yf[count + 2] = -130;
        paths[p]->exp2_d(yd, count + 3);
        paths[p]->exp2_f(yf, count + 3);
        for (size_t i = 0; i < count; i++) {
            double ed = exp2(xd[i]), ef = (double)exp2f(xf[i]);
            double rd = fabs(yd[i] - ed) / ed, rf = fabs((double)yf[i] - ef) / ef;
            worst_d = rd > worst_d ? rd : worst_d;
            worst_f = rf > worst_f ? rf : worst_f;
        }
        int edges = yd[count] == 1 && yf[count] == 1 && yd[count + 1] == 0 &&
                    yf[count + 1] == 0 && yd[count + 2] == 0 && yf[count + 2] == 0;
        double nan_d = NAN;
        float nan_f = NAN;
        paths[p]->exp2_d(&nan_d, 1);
        paths[p]->exp2_f(&nan_f, 1);
        if (!(worst_d <= 4 * DBL_EPSILON) || !(worst_f <= 4 * FLT_EPSILON) || !edges ||
            nan_d == nan_d || nan_f == nan_f) {
            free(xd);
            free(xf);
            free(yd);
            free(yf);
            FAIL_AT("path %s: relative error %g (double), %g (float), edges %d, NaN kept %d %d",
                    paths[p]->name, worst_d, worst_f, edges, nan_d != nan_d, nan_f != nan_f);
        }
        fprintf(stderr, "    path %s: 2^x within %.2g (double), %.2g (float) relative\n",
                paths[p]->name, worst_d, worst_f);
    }
    free(xd);
    free(xf);
    free(yd);
    free(yf);
}

/* The choice of path: auto, a path by name, a path this CPU cannot run and
 * an unknown name (errors that say why, the choice unchanged). */
void test_kernel_paths_select(void)
{
    /* every path, the bfloat16 variants included: auto takes the widest */
    const attn_kernel_path *paths[8];
    size_t n = attn_kernel_available(paths, 8);
    char err[200] = "";
    ASSERT(n >= 1);
    /* portable runs on every CPU: the last of the server's paths (main.c adds the tests'
     * avx512-on-avx2 and amx_bf16-model after it) */
    size_t portable = n;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(paths[i]->name, "portable"))
            portable = i;
    ASSERT(portable < n);
    for (size_t i = portable + 1; i < n; i++)
        ASSERT(!strcmp(paths[i]->name, "avx512-on-avx2") ||
               !strcmp(paths[i]->name, "amx_bf16-model"));
    ASSERT_EQ(attn_kernel_select("auto", err, sizeof err), 0);
    ASSERT(attn_kernel_current() == paths[0]);
    ASSERT_EQ(attn_kernel_select("portable", err, sizeof err), 0);
    ASSERT_STR_EQ(attn_kernel_current()->name, "portable");
    ASSERT_EQ(attn_kernel_select("sse9", err, sizeof err), -1);
    ASSERT(strstr(err, "unknown kernel path") != NULL);
    ASSERT_STR_EQ(attn_kernel_current()->name, "portable");
    if (!attn_kernel_avx512.supported()) {
        ASSERT_EQ(attn_kernel_select("avx512", err, sizeof err), -1);
        ASSERT(strstr(err, "this CPU does not have") != NULL);
    }
    ASSERT_EQ(attn_kernel_select(NULL, err, sizeof err), 0);
    ASSERT(attn_kernel_current() == paths[0]);
}

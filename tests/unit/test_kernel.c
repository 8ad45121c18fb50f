/*
 * test_kernel.c - the blocked, online-softmax kernel.
 *
 * The kernel splits the queries into blocks of 64 to 512 rows and the keys
 * into blocks of 256 (server/kernel/attention.c), skips key blocks the causal mask
 * hides, and runs the blocks on the compute pool; a block of one or two query
 * rows takes its products a row at a time (GEMV), of three or more as GEMM.
 * These tests run it against the naive float64 reference
 * (tests/ref/reference.c) on shapes chosen to land on every edge of those
 * blocks, with and without the attention matrix, serially and on a pool of
 * three threads.
 */
#include <stdint.h>
#include <stdlib.h>

#include <valgrind/valgrind.h>

#include "kernel/attention.h"
#include "core/mem.h"
#include "core/compute.h"
#include "ref/reference.h"
#include "test.h"

static uint64_t kernel_rng = 0x243F6A8885A308D3ull;

static double krnd(void)
{
    return test_uniform(&kernel_rng);
}

typedef enum {
    MASK_NONE,
    MASK_RANDOM,        /* about 3 in 4 keys allowed; rows with few keys */
    MASK_BLOCKS,        /* keys 256..511 hidden from every row (one whole key block),
                         * every 7th row fully masked, the rest random */
    MASK_KIND_COUNT
} mask_kind;

/* One (Lq, Lk) pair; see the file comment for what each is at the edge of. */
typedef struct edge_shape {
    size_t lq, lk;
} edge_shape;

static const edge_shape edge_shapes[] = {
    {1, 1}, {1, 600}, {2, 600}, {3, 600}, {600, 1}, {63, 257}, {64, 256}, {65, 255},
    {513, 513}, {512, 700}, {700, 512}, {1100, 300}, {300, 1100},
};

static unsigned char *make_mask(mask_kind kind, size_t planes, size_t lq, size_t lk)
{
    if (kind == MASK_NONE)
        return NULL;
    unsigned char *m = malloc(planes * lq * lk);
    for (size_t p = 0; p < planes; p++)
        for (size_t i = 0; i < lq; i++)
            for (size_t j = 0; j < lk; j++) {
                unsigned char allowed = krnd() > -1.0;
                if (kind == MASK_BLOCKS && ((j >= 256 && j < 512) || i % 7 == 3))
                    allowed = 0;
                m[(p * lq + i) * lk + j] = allowed;
            }
    return m;
}

/* Runs one shape in every combination of causal, mask, attention wanted and
 * dtype against ref_sdpa.  `rising` multiplies key j by 1 + 8 j / lk, so the
 * row maxima grow block after block and the online softmax must rescale.
 * Returns 0, or -1 after printing the failing combination. */
static int edge_case(size_t lq, size_t lk, int rising)
{
    const size_t batch = 2, heads = 2, hdk = 5, hdv = 3, dk = heads * hdk, dv = heads * hdv;
    double *q = malloc(batch * lq * dk * sizeof(double));
    double *k = malloc(batch * lk * dk * sizeof(double));
    double *v = malloc(batch * lk * dv * sizeof(double));
    double *ref_out = malloc(batch * lq * dv * sizeof(double));
    double *ref_attn = malloc(batch * heads * lq * lk * sizeof(double));
    unsigned char *full = malloc(batch * lq * lk);
    for (size_t i = 0; i < batch * lq * dk; i++)
        q[i] = krnd();
    for (size_t b = 0; b < batch; b++)
        for (size_t j = 0; j < lk; j++)
            for (size_t c = 0; c < dk; c++)
                k[(b * lk + j) * dk + c] = krnd() * (rising ? 1 + 8.0 * (double)j / (double)lk : 1);
    for (size_t i = 0; i < batch * lk * dv; i++)
        v[i] = krnd();
    int rc = 0;
    for (int causal = 0; causal < 2 && rc == 0; causal++)
        for (int kind = 0; kind < MASK_KIND_COUNT && rc == 0; kind++) {
            int batched = kind == MASK_RANDOM;
            size_t planes = batched ? batch : 1;
            unsigned char *mask = make_mask((mask_kind)kind, planes, lq, lk);
            for (size_t b = 0; b < batch && mask != NULL; b++)
                memcpy(full + b * lq * lk, mask + (batched ? b : 0) * lq * lk, lq * lk);
            double scale = 0.7;
            ref_sdpa(batch, heads, lq, lk, hdk, hdv, q, k, v, mask ? full : NULL, causal, scale,
                     ref_out, ref_attn);
            for (int want = 0; want < 2 && rc == 0; want++)
                for (int dtype = 0; dtype < 2 && rc == 0; dtype++) {
                    attn_job job = {.batch = batch, .lq = lq, .lk = lk, .heads = heads,
                                    .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .mask = mask,
                                    .mask_batched = batched, .causal = causal, .scale = scale,
                                    .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64,
                                    .want_attention = want};
                    attn_result r;
                    attn_error err;
                    double tol = dtype ? 2e-5 : 1e-12;
                    if (attention_run(&job, &r, &err) != 0) {
                        fprintf(stderr, "  attention_run failed: %s\n", err.message);
                        rc = -1;
                        break;
                    }
                    double e_out = test_max_abs_diff(r.output, ref_out, batch * lq * dv);
                    double e_attn = want ? test_attention_diff(&r, ref_attn,
                                                      batch * heads * lq * lk) : 0;
                    /* Fully masked rows must be exactly zero, never NaN. */
                    int zero_ok = 1;
                    if (kind == MASK_BLOCKS)
                        for (size_t b = 0; b < batch; b++)
                            for (size_t i = 3; i < lq; i += 7)
                                for (size_t c = 0; c < dv; c++)
                                    zero_ok &= r.output[(b * lq + i) * dv + c] == 0.0;
                    if (!(e_out <= tol && e_attn <= tol) || !zero_ok) {
                        fprintf(stderr, "  lq %zu lk %zu rising %d causal %d mask %d attention %d "
                                "%s: output error %g, attention error %g, masked rows zero %d\n",
                                lq, lk, rising, causal, kind, want, dtype ? "float32" : "float64",
                                e_out, e_attn, zero_ok);
                        rc = -1;
                    }
                    attention_result_free(&r);
                }
            free(mask);
        }
    free(q);
    free(k);
    free(v);
    free(ref_out);
    free(ref_attn);
    free(full);
    return rc;
}

/* Under valgrind (make test's memcheck suite, about 50 times slower) a
 * smaller set that still crosses every kind of edge once: the plain and
 * sanitized suites run them all. */
static const edge_shape valgrind_shapes[] = {{1, 1}, {2, 600}, {65, 255}, {70, 530}};

static void edge_sweep(void)
{
    const edge_shape *shapes = edge_shapes;
    size_t count = sizeof edge_shapes / sizeof edge_shapes[0];
    if (RUNNING_ON_VALGRIND) {
        shapes = valgrind_shapes;
        count = sizeof valgrind_shapes / sizeof valgrind_shapes[0];
    }
    for (size_t s = 0; s < count; s++)
        for (int rising = 0; rising < 2; rising++)
            if (edge_case(shapes[s].lq, shapes[s].lk, rising) != 0)
                FAIL_AT("the kernel disagrees with the reference (see above)");
}

void test_kernel_block_edges_serial(void)
{
    edge_sweep();
}

void test_kernel_block_edges_on_pool(void)
{
    ASSERT_EQ(compute_init(3), 0);
    ASSERT_EQ(compute_threads(), 3);
    edge_sweep();
    compute_shutdown();
    ASSERT_EQ(compute_threads(), 1);
}

/* A score that overflows in a late key block is reported, whichever path. */
void test_kernel_overflow_in_late_block(void)
{
    size_t lk = 600;
    double q[1] = {1e200}, *k = calloc(lk, sizeof(double)), *v = calloc(lk, sizeof(double));
    k[550] = 1e200;
    for (int want = 0; want < 2; want++)
        for (int dtype = 0; dtype < 2; dtype++) {
            attn_job job = {.batch = 1, .lq = 1, .lk = lk, .heads = 1, .dk = 1, .dv = 1,
                            .q = q, .k = k, .v = v, .scale = 1, .want_attention = want,
                            .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
            attn_result r;
            attn_error err;
            int rc = attention_run(&job, &r, &err);
            if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0) {
                free(k);
                free(v);
                FAIL_AT("attention %d dtype %d: rc %d, code %s", want, dtype, rc, err.code);
            }
        }
    free(k);
    free(v);
}

/* A NaN score (Inf - Inf in q . k) beside finite ones is reported too, with
 * or without the attention matrix: it reaches the row's sum and its output. */
void test_kernel_nan_score_reported(void)
{
    /* In each precision's range: the products overflow, the scores do not. */
    double q64[2] = {1e200, 1e200}, k64[4] = {1, 0, 1e200, -1e200};
    double q32[2] = {3e38, 3e38}, k32[4] = {1e-30, 0, 3e38, -3e38}, v[2] = {1, 2};
    for (int want = 0; want < 2; want++)
        for (int dtype = 0; dtype < 2; dtype++) {
            attn_job job = {.batch = 1, .lq = 1, .lk = 2, .heads = 1, .dk = 2, .dv = 1,
                            .q = dtype ? q32 : q64, .k = dtype ? k32 : k64, .v = v,
                            .scale = dtype ? 1e-3 : 1e-300, .want_attention = want,
                            .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
            attn_result r;
            attn_error err;
            int rc = attention_run(&job, &r, &err);
            if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0)
                FAIL_AT("attention %d dtype %d: rc %d, code %s", want, dtype, rc, err.code);
        }
}

/* Runs job in float64 and, with both_dtypes, float32, with and without the
 * attention matrix, and checks that every output number is `want` (as the
 * precision rounds it) to within rel relative error. */
static int run_expecting(attn_job job, int both_dtypes, const double *want, size_t n, double rel,
                         char *why, size_t why_len)
{
    for (int with = 0; with < 2; with++)
        for (int dtype = 0; dtype < 1 + both_dtypes; dtype++) {
            job.want_attention = with;
            job.dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64;
            attn_result r;
            attn_error err;
            error_clear(&err);
            int rc = attention_run(&job, &r, &err);
            if (rc != 0) {
                snprintf(why, why_len, "attention %d dtype %d: rc %d (%s)", with, dtype, rc,
                         err.code);
                return -1;
            }
            for (size_t i = 0; i < n; i++) {
                double w = dtype ? (double)(float)want[i] : want[i];
                if (!(fabs(r.output[i] - w) <= rel * fabs(w))) {
                    snprintf(why, why_len, "attention %d dtype %d: output[%zu] = %.17g, want %.17g",
                             with, dtype, i, r.output[i], w);
                    attention_result_free(&r);
                    return -1;
                }
            }
            attention_result_free(&r);
        }
    return 0;
}

/* A finite answer near the largest number of the precision is not refused:
 * the online pass sums exp(s - max) v before dividing by the sum of the
 * weights, which overflows here although the result does not. */
void test_kernel_finite_result_near_max(void)
{
    char why[256];
    /* The example of the contract: q . k = 0 for both keys, weights 1/2 each. */
    double q[1] = {0}, k[2] = {1, 1}, v64[2] = {9e307, 9e307}, v32[2] = {3e38, 3e38};
    attn_job job = {.batch = 1, .lq = 1, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .q = q, .k = k,
                    .v = v64, .scale = 1};
    double want64[1] = {9e307}, want32[1] = {3e38};
    if (run_expecting(job, 0, want64, 1, 1e-15, why, sizeof why) != 0)
        FAIL_AT("9e307: %s", why);
    job.v = v32;
    if (run_expecting(job, 1, want32, 1, 1e-6, why, sizeof why) != 0)
        FAIL_AT("3e38: %s", why);

    /* Several key blocks whose maximum rises from block to block (the
     * rescaled accumulation overflows too), a mask that hides a key of the
     * opposite sign, two heads, in float64. */
    size_t lk = 600;
    double *kk = calloc(lk * 2, sizeof(double)), *vv = calloc(lk * 2, sizeof(double));
    unsigned char *mask = calloc(2 * lk, 1);
    double qq[4] = {1e-3, 1e-3, 1e-3, 1e-3};
    if (kk == NULL || vv == NULL || mask == NULL) {
        free(kk);
        free(vv);
        free(mask);
        FAIL_AT("out of memory");
    }
    for (size_t j = 0; j < lk; j++) {
        kk[2 * j] = kk[2 * j + 1] = (double)j;      /* rising scores, both heads */
        vv[2 * j] = 1.5e308;                         /* head 0 */
        vv[2 * j + 1] = -1e308;                      /* head 1 */
        mask[j] = mask[lk + j] = 1;
    }
    vv[2 * 599] = -1.5e308;                          /* hidden from both queries */
    vv[2 * 599 + 1] = 1e308;
    mask[599] = mask[lk + 599] = 0;
    attn_job big = {.batch = 1, .lq = 2, .lk = lk, .heads = 2, .dk = 2, .dv = 2, .q = qq,
                    .k = kk, .v = vv, .mask = mask, .scale = 1};
    double want[4] = {1.5e308, -1e308, 1.5e308, -1e308};
    int rc = run_expecting(big, 0, want, 4, 1e-12, why, sizeof why);
    free(kk);
    free(vv);
    free(mask);
    if (rc != 0)
        FAIL_AT("600 keys: %s", why);
    /* Causal: query 0 sees key 0 alone, query 1 both. */
    double cq[2] = {1, 1}, ck[2] = {0, 0}, cv[2] = {1.7e308, 1.7e308};
    attn_job causal = {.batch = 1, .lq = 2, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .q = cq,
                       .k = ck, .v = cv, .scale = 1, .causal = 1};
    double cwant[2] = {1.7e308, 1.7e308};
    if (run_expecting(causal, 0, cwant, 2, 1e-15, why, sizeof why) != 0)
        FAIL_AT("causal: %s", why);
}

/* A result that really is past the range stays an error: v projected from
 * x overflows to infinity before any attention is taken. */
void test_kernel_infinite_result_still_reported(void)
{
    double x[1] = {1e200}, one[1] = {1}, big[1] = {1e200};
    attn_weights w = {.d_in = 1, .d_ctx = 1, .dk = 1, .dv = 1, .d_out = 1, .wq = one, .wk = one,
                      .wv = big};
    for (int with = 0; with < 2; with++)
        for (int dtype = 0; dtype < 2; dtype++) {
            attn_job job = {.batch = 1, .lq = 1, .lk = 1, .heads = 1, .dk = 1, .dv = 1, .x = x,
                            .weights = &w, .scale = 1e-300, .want_attention = with,
                            .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
            attn_result r;
            attn_error err;
            int rc = attention_run(&job, &r, &err);
            if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0)
                FAIL_AT("attention %d dtype %d: rc %d, code %s", with, dtype, rc, err.code);
        }
}

/* An attention result of several MiB, whose aligned part attention_run asks
 * the kernel to back with huge pages (mem_advise_huge), holds the same
 * weights as the reference in both precisions; so does a block that is too
 * small for a huge page, and the hint accepts NULL. */
void test_kernel_large_attention_result(void)
{
    const size_t lq = 1100, lk = 700, d = 3;
    double *q = malloc(lq * d * sizeof(double)), *k = malloc(lk * d * sizeof(double));
    double *v = malloc(lk * d * sizeof(double)), *ref_out = malloc(lq * d * sizeof(double));
    double *ref_attn = malloc(lq * lk * sizeof(double));
    for (size_t i = 0; i < lq * d; i++)
        q[i] = krnd();
    for (size_t i = 0; i < lk * d; i++) {
        k[i] = krnd();
        v[i] = krnd();
    }
    ref_sdpa(1, 1, lq, lk, d, d, q, k, v, NULL, 0, 0.5, ref_out, ref_attn);
    double worst[2] = {INFINITY, INFINITY};
    for (int dtype = 0; dtype < 2; dtype++) {
        attn_job job = {.batch = 1, .lq = lq, .lk = lk, .heads = 1, .dk = d, .dv = d, .q = q,
                        .k = k, .v = v, .scale = 0.5, .want_attention = 1,
                        .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
        attn_result r;
        attn_error err;
        if (attention_run(&job, &r, &err) == 0) {
            double e1 = test_max_abs_diff(r.output, ref_out, lq * d);
            double e2 = test_attention_diff(&r, ref_attn, lq * lk);
            worst[dtype] = e1 > e2 ? e1 : e2;
        }
        attention_result_free(&r);
    }
    free(q);
    free(k);
    free(v);
    free(ref_out);
    free(ref_attn);
    if (!(worst[0] <= 1e-12 && worst[1] <= 2e-5))
        FAIL_AT("float64 error %g, float32 error %g", worst[0], worst[1]);
    mem_advise_huge(NULL, 1 << 22);
    unsigned char small[64];
    mem_advise_huge(small, sizeof small);
    memset(small, 7, sizeof small);
    ASSERT(small[63] == 7);
}

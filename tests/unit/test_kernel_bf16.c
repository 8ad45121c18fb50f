/*
 * test_kernel_bf16.c - the bfloat16 products (attn_job.bf16, compute_precision bfloat16)
 * on every path of the kernel this CPU runs, held to the float64 reference within the
 * bound of docs/numbers.md ("bfloat16 products").
 *
 * The bound, per query row i: the inputs are rounded to bfloat16 (unit roundoff
 * u = 2^-9), so a score moves by at most D_i = (2u + u^2 + hdk 2^-24) scale
 * max_j sum_t |q_it k_jt|; a softmax whose scores move by at most D moves each weight by
 * a factor within e^(+-2D), and the output by at most (e^(2D) - 1) max_j |v_j|; the
 * rounding of v and of the weights P adds u max_j |v_j| each, and the float32 arithmetic
 * around them at most 1e-5 of it (the float32 kernel's own tolerance).  Every output
 * number must lie within (e^(2 D_i) - 1 + 2u + 1e-5) max_j |v_j| of the reference.  Also
 * checked: fully masked rows are zeros, the result is not simply float32's (the inputs
 * really were rounded), the attention matrix path (want_attention) and float inputs
 * (q32, v2's binary FP32) agree with the bound too, and the reductions a bfloat16 job
 * asks for are float32's.
 */
#include <stdint.h>
#include <stdlib.h>

#include <valgrind/valgrind.h>

#include "core/half.h"
#include "kernel/attention.h"
#include "kernel/attention_fused.h"
#include "kernel/attention_reduce.h"
#include "ref/reference.h"
#include "test.h"

static uint64_t bf16_rng = 0xA4093822299F31D0ull;

#define BF16_U (1.0 / 512)      /* bfloat16's unit roundoff, 2^-9 */
#define MAX_PATHS 8

typedef struct bf16_case {
    size_t batch, heads, lq, lk, hd;
    int causal, masked, want_attention, in32;
    double amp;                 /* q and k uniform in +-amp */
} bf16_case;

/* The largest error of out against ref over the bound of each row (above); the row's
 * own D from q and k. */
static double worst_over_bound(const bf16_case *c, const double *q, const double *k,
                               const double *v, const double *out, const double *ref,
                               double scale)
{
    size_t dk = c->heads * c->hd, worst_i = 0;
    double worst = 0;
    for (size_t b = 0; b < c->batch; b++)
        for (size_t h = 0; h < c->heads; h++) {
            double vmax = 0;
            for (size_t j = 0; j < c->lk; j++)
                for (size_t t = 0; t < c->hd; t++)
                    vmax = fmax(vmax, fabs(v[(b * c->lk + j) * dk + h * c->hd + t]));
            for (size_t i = 0; i < c->lq; i++) {
                const double *qi = q + (b * c->lq + i) * dk + h * c->hd;
                double big = 0;
                for (size_t j = 0; j < c->lk; j++) {
                    const double *kj = k + (b * c->lk + j) * dk + h * c->hd;
                    double s = 0;
                    for (size_t t = 0; t < c->hd; t++)
                        s += fabs(qi[t] * kj[t]);
                    big = fmax(big, s);
                }
                double d = (2 * BF16_U + BF16_U * BF16_U + (double)c->hd * 0x1p-24) * scale * big;
                double bound = (expm1(2 * d) + 2 * BF16_U + 1e-5) * vmax;
                for (size_t t = 0; t < c->hd; t++) {
                    size_t at = (b * c->lq + i) * dk + h * c->hd + t;
                    double e = fabs(out[at] - ref[at]) / bound;
                    if (!(e <= worst)) {
                        worst = e != e ? INFINITY : e;
                        worst_i = i;
                    }
                }
            }
        }
    (void)worst_i;
    return worst;
}

/* Runs c on every path this CPU has; returns 0, or -1 after saying what disagreed. */
static int run_bf16_case(const bf16_case *c)
{
    size_t dk = c->heads * c->hd, nq = c->batch * c->lq * dk, nk = c->batch * c->lk * dk;
    double *q = malloc(nq * sizeof(double)), *k = malloc(nk * sizeof(double));
    double *v = malloc(nk * sizeof(double)), *ref = malloc(nq * sizeof(double));
    double *ref_attn = malloc(c->batch * c->heads * c->lq * c->lk * sizeof(double));
    float *q32 = malloc(nq * sizeof(float)), *k32 = malloc(nk * sizeof(float));
    float *v32 = malloc(nk * sizeof(float));
    unsigned char *mask = c->masked ? malloc(c->batch * c->lq * c->lk) : NULL;
    for (size_t i = 0; i < nq; i++)
        q32[i] = (float)(q[i] = (float)(test_uniform(&bf16_rng) * c->amp));
    for (size_t i = 0; i < nk; i++) {
        k32[i] = (float)(k[i] = (float)(test_uniform(&bf16_rng) * c->amp));
        v32[i] = (float)(v[i] = (float)test_uniform(&bf16_rng));
    }
    for (size_t i = 0; mask != NULL && i < c->batch * c->lq; i++)
        for (size_t j = 0; j < c->lk; j++)
            mask[i * c->lk + j] = i % 5 == 2 ? 0 : test_uniform(&bf16_rng) > -0.5;
    double scale = 1 / sqrt((double)c->hd);
    ref_sdpa(c->batch, c->heads, c->lq, c->lk, c->hd, c->hd, q, k, v, mask, c->causal, scale,
             ref, ref_attn);
    attn_job job = {.batch = c->batch, .lq = c->lq, .lk = c->lk, .heads = c->heads, .dk = dk,
                    .dv = dk, .causal = c->causal, .mask = mask, .mask_batched = 1,
                    .scale = scale, .dtype = ATTN_FLOAT32, .want_attention = c->want_attention};
    if (c->in32) {
        job.q32 = q32;
        job.k32 = k32;
        job.v32 = v32;
    } else {
        job.q = q;
        job.k = k;
        job.v = v;
    }
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = attn_kernel_available(paths, MAX_PATHS);
    char err[200];
    int rc = 0;
    double *f32_out = malloc(nq * sizeof(double));
    for (size_t p = 0; p < n && rc == 0; p++) {
        attn_kernel_select(paths[p]->name, err, sizeof err);
        attn_result r;
        attn_error e;
        job.bf16 = 0;
        if (attention_run(&job, &r, &e) != 0) {
            fprintf(stderr, "  %s: float32 failed: %s\n", paths[p]->name, e.message);
            rc = -1;
            break;
        }
        memcpy(f32_out, r.output, nq * sizeof(double));
        attention_result_free(&r);
        job.bf16 = 1;
        if (attention_run(&job, &r, &e) != 0) {
            fprintf(stderr, "  %s: bfloat16 failed: %s\n", paths[p]->name, e.message);
            rc = -1;
            break;
        }
        double worst = worst_over_bound(c, q, k, v, r.output, ref, scale);
        int zero_ok = 1, differs = 0;
        for (size_t i = 2; c->masked && i < c->batch * c->lq; i += 5)
            for (size_t t = 0; t < dk; t++)
                zero_ok &= r.output[i * dk + t] == 0.0;
        for (size_t i = 0; i < nq; i++)
            differs |= fabs(r.output[i] - f32_out[i]) > 1e-6;
        /* a case of one key has weights of 1, which round exactly: the same as float32's
         * but for v's rounding, which a single key's v of size 1 shows */
        if (!(worst <= 1) || !zero_ok || (!differs && !c->masked)) {
            fprintf(stderr, "  path %s: batch %zu heads %zu lq %zu lk %zu hd %zu causal %d "
                    "masked %d attention %d float inputs %d amp %g: error %.3g of the bound, "
                    "masked rows zero %d, differs from float32 %d\n", paths[p]->name, c->batch,
                    c->heads, c->lq, c->lk, c->hd, c->causal, c->masked, c->want_attention,
                    c->in32, c->amp, worst, zero_ok, differs);
            rc = -1;
        }
        attention_result_free(&r);
    }
    attn_kernel_select("auto", err, sizeof err);
    free(f32_out);
    free(q);
    free(k);
    free(v);
    free(q32);
    free(k32);
    free(v32);
    free(ref);
    free(ref_attn);
    free(mask);
    return rc;
}

static const size_t bf16_tokens[] = {1, 3, 17, 300};
static const size_t bf16_dims[] = {1, 8, 63, 64, 100, 128, 256};

/* Every head dim with every pair of token counts; causal and masked as given, or with
 * mixed set, each case one of (masked), (causal), (causal and masked) in turn, so that
 * the three are swept once between them rather than three times. */
static void bf16_sweep(int causal, int masked, int mixed, int want_attention, double amp)
{
    int valgrind = RUNNING_ON_VALGRIND != 0;
    for (size_t d = 0; d < sizeof bf16_dims / sizeof bf16_dims[0]; d++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++) {
                size_t lq = bf16_tokens[a], lk = bf16_tokens[b], hd = bf16_dims[d];
                if (valgrind && (lq + lk > 320 || (hd > 64 && lq + lk > 40)))
                    continue;
                size_t turn = (a + b + d) % 3;
                bf16_case c = {lq * lk > 5000 ? 1 : 2, hd <= 8 ? 3 : 2, lq, lk, hd,
                               mixed ? turn != 0 : causal, mixed ? turn != 1 : masked,
                               want_attention, (a + b + d) % 2, amp};
                if (run_bf16_case(&c) != 0)
                    FAIL_AT("bfloat16 products past their bound (see above)");
            }
}

void test_kernel_bf16_plain(void)
{
    bf16_sweep(0, 0, 0, 0, 1.5);
}

void test_kernel_bf16_masked_causal(void)
{
    bf16_sweep(0, 0, 1, 0, 1.5);
}

/* The attention matrix path (OpenBLAS's products on inputs rounded to bfloat16, the
 * weights rounded before P.V). */
void test_kernel_bf16_with_attention(void)
{
    bf16_sweep(0, 1, 0, 1, 1.5);
}

/* Scores up to about +-40: peaked weights whose running maximum climbs. */
void test_kernel_bf16_large_logits(void)
{
    bf16_case c = {2, 2, 200, 500, 64, 0, 1, 0, 0, 2.8};
    if (run_bf16_case(&c) != 0)
        FAIL_AT("bfloat16 products past their bound at large logits (see above)");
    bf16_case causal = {1, 3, 130, 130, 32, 1, 0, 0, 1, 2.8};
    if (run_bf16_case(&causal) != 0)
        FAIL_AT("bfloat16 products past their bound at large logits, causal (see above)");
}

/* A long row: 32k keys, each row's sums over 512 tiles. */
void test_kernel_bf16_long_rows(void)
{
    size_t lk = RUNNING_ON_VALGRIND ? 4096 : 32768;
    bf16_case c = {1, 2, 7, lk, 64, 0, 0, 0, 1, 1.5};
    if (run_bf16_case(&c) != 0)
        FAIL_AT("bfloat16 products past their bound on a long row (see above)");
}

/* The reductions of a bfloat16 job are float32's (docs/numbers.md): the same numbers as
 * the float32 job's, top-k indices included. */
void test_kernel_bf16_reductions_float32(void)
{
    size_t lq = 40, lk = 90, hd = 16, heads = 2, dk = heads * hd;
    double *q = malloc(lq * dk * sizeof(double)), *k = malloc(lk * dk * sizeof(double));
    double *v = malloc(lk * dk * sizeof(double));
    for (size_t i = 0; i < lq * dk; i++)
        q[i] = test_uniform(&bf16_rng);
    for (size_t i = 0; i < lk * dk; i++) {
        k[i] = test_uniform(&bf16_rng);
        v[i] = test_uniform(&bf16_rng);
    }
    attn_reduce red = {.entropy = 1, .topk = 4};
    attn_job job = {.batch = 1, .lq = lq, .lk = lk, .heads = heads, .dk = dk, .dv = dk,
                    .q = q, .k = k, .v = v, .scale = 0.25, .dtype = ATTN_FLOAT32,
                    .reduce = &red};
    attn_result r32, rb;
    attn_error e;
    ASSERT_EQ(attention_run(&job, &r32, &e), 0);
    job.bf16 = 1;
    ASSERT_EQ(attention_run(&job, &rb, &e), 0);
    size_t rows = heads * lq;
    int same = 1;
    for (size_t i = 0; i < rows; i++)
        same &= rb.reduced.entropy[i] == r32.reduced.entropy[i];
    for (size_t i = 0; i < rows * 4; i++)
        same &= rb.reduced.topk_indices[i] == r32.reduced.topk_indices[i];
    attention_result_free(&r32);
    attention_result_free(&rb);
    free(q);
    free(k);
    free(v);
    ASSERT(same);
}

/* A float with the bits u, for the packing's special values. */
static float bf16_test_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The input numbers of the packing test: uniform, with every seventh one a number whose
 * rounding is a corner (ties either way, the largest float, which rounds to Inf, NaNs,
 * infinities, subnormals, -0). */
static float bf16_pack_input(size_t i)
{
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu,
                                       0x7fc00001u, 0x7f800001u, 0xff800000u, 0x7f800000u,
                                       0x00000001u, 0x00018000u, 0x80000000u, 0x3f80ffffu};
    if (i % 7 == 3)
        return bf16_test_bits(special[i / 7 % (sizeof special / sizeof special[0])]);
    return (float)(test_uniform(&bf16_rng) * 3);
}

/* The packed bfloat16 K and V of every path hold exactly half_bf16_from_float of each
 * number, at the places attention_fused_bf16.inc's layout gives them, zeros where it says
 * so, for heads and key counts that end inside a vector, a pair and a panel.  The panel
 * widths of a path (keys per panel of K, columns per panel of V) are read off its float
 * packing, which shares them. */
void test_kernel_bf16_pack_bits(void)
{
    const attn_kernel_path *paths[MAX_PATHS];
    size_t n = attn_kernel_available(paths, MAX_PATHS);
    static const size_t lks[] = {1, 5, 63, 64, 65, 130};
    static const size_t dims[] = {1, 7, 16, 33, 64, 100};
    enum { BK = ATTN_FUSED_BK, LKMAX = 130, DMAX = 128 };
    /* rows of a K and a V head side by side, and a gap: ld below */
    float *k = malloc(LKMAX * 2 * DMAX * sizeof(float));
    float *v = malloc(LKMAX * 2 * DMAX * sizeof(float));
    size_t tiles = (LKMAX + BK - 1) / BK, cap = tiles * BK * DMAX;
    uint16_t *kt = malloc(cap * sizeof(uint16_t)), *vp = malloc(cap * sizeof(uint16_t));
    float *ktf = malloc(cap * sizeof(float)), *vpf = malloc(cap * sizeof(float));
    size_t bad = 0, checked = 0;
    for (size_t p = 0; p < n && bad == 0; p++) {
        /* the panel widths: where key 0's dim 1 lands in the float K, key 1's column 0 in
         * the float V of a wide head */
        for (size_t i = 0; i < BK * 2; i++)
            k[i] = (float)(i + 1);
        for (size_t i = 0; i < 2 * DMAX; i++)
            v[i] = (float)(i + 1);
        paths[p]->pack_f(k, 2, v, DMAX, 2, 2, DMAX, DMAX, ktf, vpf);
        paths[p]->pack_f(k, 2, NULL, 0, BK, 2, 0, 0, ktf, NULL);
        size_t pw = 0, ow = 0;
        while (pw < BK * 2 && ktf[pw] != 2)
            pw++;
        while (ow < DMAX && vpf[ow] != DMAX + 1)
            ow++;
        ASSERT(pw < BK * 2 && BK % pw == 0 && ow < DMAX);
        for (size_t a = 0; a < sizeof lks / sizeof lks[0] && bad == 0; a++)
            for (size_t d = 0; d < sizeof dims / sizeof dims[0] && bad == 0; d++) {
                size_t lk = lks[a], hdk = dims[d], hdv = dims[(d + 1) % 6], ld = hdk + hdv + 3;
                size_t hdk2 = ATTN_FUSED_BF16_KT(hdk), hdv_pad = attn_fused_vpad(hdv, 4);
                for (size_t i = 0; i < lk * ld; i++) {
                    k[i] = bf16_pack_input(i);
                    v[i] = bf16_pack_input(i + 5);
                }
                memset(kt, 0xaa, cap * sizeof(uint16_t));
                memset(vp, 0xaa, cap * sizeof(uint16_t));
                paths[p]->pack_b(k, ld, v, ld, lk, hdk, hdv, hdv_pad, kt, vp);
                size_t keys = (lk + pw - 1) / pw * pw, rows = (lk + BK - 1) / BK * BK;
                for (size_t j = 0; j < keys; j++)
                    for (size_t t = 0; t < hdk2; t++) {
                        uint16_t want = j < lk && t < hdk ? half_bf16_from_float(k[j * ld + t])
                                                          : 0;
                        size_t at = j / pw * pw * hdk2 + t / 2 * pw * 2 + j % pw * 2 + t % 2;
                        bad += kt[at] != want;
                        checked++;
                    }
                for (size_t j = 0; j < rows; j++)
                    for (size_t c0 = 0; c0 < hdv_pad; c0 += ow) {
                        size_t w = hdv_pad - c0 < ow ? hdv_pad - c0 : ow;
                        for (size_t c = c0; c < c0 + w; c++) {
                            uint16_t want =
                                j < lk && c < hdv ? half_bf16_from_float(v[j * ld + c]) : 0;
                            size_t at = j / BK * BK * hdv_pad + BK * c0 + j % BK / 2 * w * 2 +
                                        (c - c0) * 2 + j % 2;
                            bad += vp[at] != want;
                            checked++;
                        }
                    }
                if (bad != 0)
                    fprintf(stderr, "  path %s: lk %zu hdk %zu hdv %zu: %zu numbers wrong\n",
                            paths[p]->name, lk, hdk, hdv, bad);
            }
    }
    free(k);
    free(v);
    free(kt);
    free(vp);
    free(ktf);
    free(vpf);
    ASSERT(checked > 0);
    ASSERT_EQ(bad, 0);
}

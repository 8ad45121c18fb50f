/*
 * test_attention.c - the math module against hand-computed values and the
 * naive float64 reference (tests/ref/reference.c).
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernel/attention.h"
#include "ref/reference.h"
#include "test.h"

/* A small deterministic generator, so failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rnd(void)
{
    return test_uniform(&rng_state);
}

static size_t rnd_int(size_t lo, size_t hi)
{
    return lo + (size_t)((rnd() + 2.0) / 4.0 * (double)(hi - lo + 1)) % (hi - lo + 1);
}

static double *rnd_array(size_t n)
{
    double *a = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        a[i] = rnd();
    return a;
}

void test_attention_hand_computed(void)
{
    /* q = k = I (2x2), v = [[1,2],[3,4]], scale 1: row 0 weights e/(e+1), 1/(e+1). */
    double q[] = {1, 0, 0, 1}, v[] = {1, 2, 3, 4};
    attn_job job = {.batch = 1, .lq = 2, .lk = 2, .heads = 1, .dk = 2, .dv = 2, .q = q, .k = q,
                    .v = v, .scale = 1.0, .want_attention = 1};
    attn_result r;
    attn_error err;
    ASSERT_EQ(attention_run(&job, &r, &err), 0);
    double a = exp(1.0) / (exp(1.0) + 1), b = 1 / (exp(1.0) + 1);
    ASSERT_NEAR(r.attention[0], a, 1e-15);
    ASSERT_NEAR(r.attention[1], b, 1e-15);
    ASSERT_NEAR(r.attention[2], b, 1e-15);
    ASSERT_NEAR(r.attention[3], a, 1e-15);
    ASSERT_NEAR(r.output[0], 1 * a + 3 * b, 1e-15);
    ASSERT_NEAR(r.output[1], 2 * a + 4 * b, 1e-15);
    ASSERT_NEAR(r.output[2], 1 * b + 3 * a, 1e-15);
    ASSERT_NEAR(r.output[3], 2 * b + 4 * a, 1e-15);
    ASSERT_EQ(r.d_out, 2);
    attention_result_free(&r);
}

void test_attention_causal_hand_computed(void)
{
    /* Three queries, two keys, causal: query 0 sees key 0 only; queries 1
     * and 2 see both keys with equal scores (q rows are zero). */
    double q[] = {5, 0, 0}, k[] = {1, 2}, v[] = {10, 20};
    attn_job job = {.batch = 1, .lq = 3, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .q = q, .k = k,
                    .v = v, .scale = 1.0, .causal = 1, .want_attention = 1};
    attn_result r;
    attn_error err;
    ASSERT_EQ(attention_run(&job, &r, &err), 0);
    ASSERT_NEAR(r.attention[0], 1.0, 0);
    ASSERT_NEAR(r.attention[1], 0.0, 0);
    ASSERT_NEAR(r.output[0], 10.0, 1e-15);
    ASSERT_NEAR(r.attention[2], 0.5, 1e-15);
    ASSERT_NEAR(r.output[1], 15.0, 1e-14);
    ASSERT_NEAR(r.output[2], 15.0, 1e-14);
    attention_result_free(&r);
}

void test_attention_fully_masked_row_is_zero(void)
{
    double q[] = {1, 2, 3, 4}, k[] = {1, 0, 0, 1}, v[] = {7, 8, 9, 10};
    unsigned char mask[] = {0, 0, 1, 0};
    for (int dtype = 0; dtype < 2; dtype++) {
        attn_job job = {.batch = 1, .lq = 2, .lk = 2, .heads = 1, .dk = 2, .dv = 2, .q = q,
                        .k = k, .v = v, .mask = mask, .scale = 0.5, .want_attention = 1,
                        .dtype = dtype ? ATTN_FLOAT32 : ATTN_FLOAT64};
        attn_result r;
        attn_error err;
        ASSERT_EQ(attention_run(&job, &r, &err), 0);
        /* float32 jobs return their weights in float32. */
        ASSERT((r.attention_f32 != NULL) == (dtype == 1) && (r.attention != NULL) == (dtype == 0));
        for (int i = 0; i < 2; i++) {
            ASSERT((dtype ? r.attention_f32[i] : r.attention[i]) == 0.0);
            ASSERT(r.output[i] == 0.0);
        }
        ASSERT_NEAR(dtype ? r.attention_f32[2] : r.attention[2], 1.0, 0);
        ASSERT_NEAR(r.output[2], 7.0, 0);
        ASSERT_NEAR(r.output[3], 8.0, 0);
        attention_result_free(&r);
    }
}

void test_attention_large_scores_stable(void)
{
    /* Scores near 1e6 overflow exp() unless the row maximum is subtracted. */
    double q[] = {1000}, k[] = {1000, 999}, v[] = {1, 0};
    attn_job job = {.batch = 1, .lq = 1, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .q = q, .k = k,
                    .v = v, .scale = 1.0, .want_attention = 1};
    attn_result r;
    attn_error err;
    ASSERT_EQ(attention_run(&job, &r, &err), 0);
    double w0 = 1 / (1 + exp(-1000.0));
    ASSERT_NEAR(r.attention[0], w0, 1e-15);
    ASSERT_NEAR(r.output[0], w0, 1e-15);
    attention_result_free(&r);
}

/* Runs one random q/k/v job against ref_sdpa; returns the largest error. */
static double random_case(size_t batch, size_t heads, size_t lq, size_t lk, size_t hdk, size_t hdv,
                          int causal, int mask_kind, attn_dtype dtype, int *ok)
{
    size_t dk = heads * hdk, dv = heads * hdv;
    double *q = rnd_array(batch * lq * dk), *k = rnd_array(batch * lk * dk);
    double *v = rnd_array(batch * lk * dv);
    unsigned char *mask = NULL, *full_mask = NULL;
    if (mask_kind) {
        size_t planes = mask_kind == 2 ? batch : 1;
        mask = malloc(planes * lq * lk);
        for (size_t i = 0; i < planes * lq * lk; i++)
            mask[i] = rnd() > -1.0; /* about 3 in 4 allowed, some rows fully masked */
        full_mask = malloc(batch * lq * lk);
        for (size_t b = 0; b < batch; b++)
            memcpy(full_mask + b * lq * lk, mask + (mask_kind == 2 ? b * lq * lk : 0), lq * lk);
    }
    double scale = 1.0 / sqrt((double)hdk);
    attn_job job = {.batch = batch, .lq = lq, .lk = lk, .heads = heads, .dk = dk, .dv = dv,
                    .q = q, .k = k, .v = v, .mask = mask, .mask_batched = mask_kind == 2,
                    .causal = causal, .scale = scale, .dtype = dtype, .want_attention = 1};
    double *ref_out = malloc(batch * lq * dv * sizeof(double));
    double *ref_attn = malloc(batch * heads * lq * lk * sizeof(double));
    ref_sdpa(batch, heads, lq, lk, hdk, hdv, q, k, v, full_mask, causal, scale, ref_out, ref_attn);
    attn_result r;
    attn_error err;
    double worst = INFINITY;
    *ok = attention_run(&job, &r, &err) == 0;
    if (*ok) {
        double e1 = test_max_abs_diff(r.output, ref_out, batch * lq * dv);
        double e2 = test_attention_diff(&r, ref_attn, batch * heads * lq * lk);
        worst = e1 > e2 ? e1 : e2;
        if (isnan(e1) || isnan(e2))
            worst = INFINITY;
    }
    attention_result_free(&r);
    free(q);
    free(k);
    free(v);
    free(mask);
    free(full_mask);
    free(ref_out);
    free(ref_attn);
    return worst;
}

void test_attention_random_against_reference(void)
{
    for (int trial = 0; trial < 200; trial++) {
        size_t batch = rnd_int(1, 3), heads = rnd_int(1, 4), lq = rnd_int(1, 9), lk = rnd_int(1, 9);
        size_t hdk = rnd_int(1, 7), hdv = rnd_int(1, 7);
        int causal = rnd() > 0, mask_kind = (int)rnd_int(0, 2), ok;
        double worst = random_case(batch, heads, lq, lk, hdk, hdv, causal, mask_kind,
                                   ATTN_FLOAT64, &ok);
        if (!ok || !(worst <= 1e-12))
            FAIL_AT("trial %d (batch %zu heads %zu lq %zu lk %zu dk %zu dv %zu causal %d mask %d): "
                    "error %g", trial, batch, heads, lq, lk, hdk, hdv, causal, mask_kind, worst);
    }
}

void test_attention_float32_against_reference(void)
{
    double largest = 0;
    for (int trial = 0; trial < 50; trial++) {
        size_t batch = rnd_int(1, 2), heads = rnd_int(1, 3), lq = rnd_int(1, 8), lk = rnd_int(1, 8);
        int ok;
        double worst = random_case(batch, heads, lq, lk, rnd_int(1, 6), rnd_int(1, 6), trial % 2,
                                   trial % 3, ATTN_FLOAT32, &ok);
        if (!ok || !(worst <= 1e-5))
            FAIL_AT("float32 trial %d: error %g", trial, worst);
        if (worst > largest)
            largest = worst;
    }
    /* Single precision must show: float32 rounding errors are near 1e-7. */
    if (!(largest > 1e-9))
        FAIL_AT("float32 results match float64 to %g: is it really single precision?", largest);
}

void test_attention_projections_against_reference(void)
{
    for (int trial = 0; trial < 40; trial++) {
        size_t batch = rnd_int(1, 2), heads = rnd_int(1, 3), lq = rnd_int(1, 6);
        size_t lk = trial % 2 ? rnd_int(1, 6) : lq; /* odd trials: cross-attention */
        size_t d_in = rnd_int(1, 5), d_ctx = trial % 2 ? rnd_int(1, 5) : d_in;
        size_t dk = heads * rnd_int(1, 4), dv = heads * rnd_int(1, 4);
        int with_wo = trial % 4 >= 2, with_bias = trial % 3 != 0;
        size_t d_out = with_wo ? rnd_int(1, 5) : dv;
        double *x = rnd_array(batch * lq * d_in);
        double *ctx = trial % 2 ? rnd_array(batch * lk * d_ctx) : NULL;
        attn_weights w = {.d_in = d_in, .d_ctx = d_ctx, .dk = dk, .dv = dv, .d_out = d_out,
                          .wq = rnd_array(d_in * dk), .wk = rnd_array(d_ctx * dk),
                          .wv = rnd_array(d_ctx * dv), .wo = with_wo ? rnd_array(dv * d_out) : NULL,
                          .bq = with_bias ? rnd_array(dk) : NULL,
                          .bk = with_bias ? rnd_array(dk) : NULL,
                          .bv = with_bias ? rnd_array(dv) : NULL,
                          .bo = with_wo && with_bias ? rnd_array(d_out) : NULL};
        attn_job job = {.batch = batch, .lq = lq, .lk = lk, .heads = heads, .dk = dk, .dv = dv,
                        .x = x, .context = ctx, .weights = &w, .causal = trial % 5 == 0,
                        .scale = 0.7, .want_attention = 1};
        /* The reference: project, attend, project. */
        const double *src = ctx ? ctx : x;
        double *q = malloc(batch * lq * dk * sizeof(double)), *k = malloc(batch * lk * dk * sizeof(double));
        double *v = malloc(batch * lk * dv * sizeof(double)), *heads_out = malloc(batch * lq * dv * sizeof(double));
        double *out = malloc(batch * lq * d_out * sizeof(double));
        double *attn = malloc(batch * heads * lq * lk * sizeof(double));
        ref_linear(batch * lq, d_in, dk, x, w.wq, w.bq, q);
        ref_linear(batch * lk, d_ctx, dk, src, w.wk, w.bk, k);
        ref_linear(batch * lk, d_ctx, dv, src, w.wv, w.bv, v);
        ref_sdpa(batch, heads, lq, lk, dk / heads, dv / heads, q, k, v, NULL, job.causal, 0.7,
                 heads_out, attn);
        if (with_wo)
            ref_linear(batch * lq, dv, d_out, heads_out, w.wo, w.bo, out);
        else
            memcpy(out, heads_out, batch * lq * dv * sizeof(double));
        attn_result r;
        attn_error err;
        int rc = attention_run(&job, &r, &err);
        double e1 = rc == 0 ? test_max_abs_diff(r.output, out, batch * lq * d_out) : INFINITY;
        double e2 = rc == 0 ? test_attention_diff(&r, attn, batch * heads * lq * lk) : INFINITY;
        size_t got_d_out = r.d_out;
        attention_result_free(&r);
        free(x); free(ctx); free(q); free(k); free(v); free(heads_out); free(out); free(attn);
        double *arrays[8] = {w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo};
        for (int i = 0; i < 8; i++)
            free(arrays[i]);
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(got_d_out, d_out);
        if (!(e1 <= 1e-11 && e2 <= 1e-12))
            FAIL_AT("projection trial %d: output error %g, attention error %g", trial, e1, e2);
    }
}

void test_attention_without_attention_matrix(void)
{
    double *q = rnd_array(2 * 5 * 6), *k = rnd_array(2 * 4 * 6), *v = rnd_array(2 * 4 * 4);
    attn_job job = {.batch = 2, .lq = 5, .lk = 4, .heads = 2, .dk = 6, .dv = 4, .q = q, .k = k,
                    .v = v, .scale = 0.3, .causal = 1, .want_attention = 1};
    attn_result with, without;
    attn_error err;
    int rc1 = attention_run(&job, &with, &err);
    job.want_attention = 0;
    int rc2 = attention_run(&job, &without, &err);
    /* The two take different paths (normalised weights times V, and the
     * online softmax, which normalises last), so they agree to rounding. */
    int same = rc1 == 0 && rc2 == 0 && without.attention == NULL;
    for (size_t i = 0; same && i < 2 * 5 * 4; i++)
        same = fabs(with.output[i] - without.output[i]) <= 1e-14;
    attention_result_free(&with);
    attention_result_free(&without);
    free(q);
    free(k);
    free(v);
    ASSERT(same);
}

void test_attention_overflow_is_reported(void)
{
    double q[] = {1e200, 1e200}, v[] = {1, 2};
    attn_job job = {.batch = 1, .lq = 1, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .q = q, .k = q,
                    .v = v, .scale = 1.0, .want_attention = 1};
    attn_result r;
    attn_error err;
    error_clear(&err);
    ASSERT_EQ(attention_run(&job, &r, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "not_finite");
    ASSERT(r.output == NULL && r.attention == NULL);
    /* float32 overflows far earlier: 1e30 squared is past FLT_MAX. */
    double q32[] = {1e30, 1e30};
    job.q = job.k = q32;
    job.dtype = ATTN_FLOAT32;
    ASSERT_EQ(attention_run(&job, &r, &err), ERR_BAD_REQUEST);
    job.dtype = ATTN_FLOAT64;
    ASSERT_EQ(attention_run(&job, &r, &err), 0);
    attention_result_free(&r);
}

void test_attention_job_bytes_overflow(void)
{
    attn_job job = {.batch = (size_t)1 << 40, .lq = (size_t)1 << 20, .lk = (size_t)1 << 20,
                    .heads = 1, .dk = 1, .dv = 1, .want_attention = 1};
    size_t bytes = 0;
    ASSERT_EQ(attention_job_bytes(&job, &bytes), -1);
    attn_job small = {.batch = 2, .lq = 3, .lk = 4, .heads = 1, .dk = 5, .dv = 6, .want_attention = 1};
    ASSERT_EQ(attention_job_bytes(&small, &bytes), 0);
    /* output 2*3*6 and attention 2*3*4 doubles at least */
    ASSERT(bytes >= (36 + 24) * sizeof(double));
}

/* A float32 set gives, for a job of either precision, exactly what the float64 set of the
 * same (widened) numbers gives: a float64 job widens it exactly, and a float32 job rounds
 * the float64 set to those very floats.  Output, attention and q, k after the projections
 * alike, bit for bit. */
void test_attention_float32_set_as_its_double_twin(void)
{
    for (int trial = 0; trial < 12; trial++) {
        size_t batch = rnd_int(1, 2), heads = rnd_int(1, 3), lq = rnd_int(1, 6);
        size_t lk = trial % 2 ? rnd_int(1, 6) : lq; /* odd trials: cross-attention */
        size_t d_in = rnd_int(1, 5), d_ctx = trial % 2 ? rnd_int(1, 5) : d_in;
        size_t dk = heads * rnd_int(1, 4), dv = heads * rnd_int(1, 4);
        int with_wo = trial % 4 >= 2, with_bias = trial % 3 != 0;
        attn_weights wd = {.d_in = d_in, .d_ctx = d_ctx, .dk = dk, .dv = dv,
                           .d_out = with_wo ? rnd_int(1, 5) : dv};
        attn_weights wf = wd;
        wf.elem = WEIGHTS_F32;
        for (int p = 0; p < WEIGHTS_COUNT; p++) {
            int present = p < 3 || (p == WEIGHTS_WO && with_wo) ||
                          (p != WEIGHTS_WO && with_bias && (p != WEIGHTS_BO || with_wo));
            if (!present)
                continue;
            double *a = weights_part_alloc(&wd, (weights_part)p);
            float *b = weights_part_alloc(&wf, (weights_part)p);
            ASSERT(a != NULL && b != NULL);
            size_t n = weights_rows(&wd, (weights_part)p) * weights_cols(&wd, (weights_part)p);
            for (size_t i = 0; i < n; i++) {
                b[i] = (float)rnd();
                a[i] = b[i];
            }
        }
        double *x = rnd_array(batch * lq * d_in);
        double *ctx = trial % 2 ? rnd_array(batch * lk * d_ctx) : NULL;
        int same = 1;
        for (int f32 = 0; f32 < 2; f32++) {
            attn_job job = {.batch = batch, .lq = lq, .lk = lk, .heads = heads, .dk = dk,
                            .dv = dv, .x = x, .context = ctx, .causal = trial % 5 == 0,
                            .scale = 0.7, .want_attention = 1, .want_qk = 1,
                            .dtype = f32 ? ATTN_FLOAT32 : ATTN_FLOAT64};
            attn_result rd, rf;
            attn_error err;
            job.weights = &wd;
            int rc1 = attention_run(&job, &rd, &err);
            job.weights = &wf;
            int rc2 = attention_run(&job, &rf, &err);
            size_t n_out = batch * lq * wd.d_out, n_attn = batch * heads * lq * lk;
            same = same && rc1 == 0 && rc2 == 0 &&
                   !memcmp(rd.output, rf.output, n_out * sizeof(double)) &&
                   !memcmp(rd.q, rf.q, batch * lq * dk * sizeof(double)) &&
                   !memcmp(rd.k, rf.k, batch * lk * dk * sizeof(double)) &&
                   (f32 ? !memcmp(rd.attention_f32, rf.attention_f32, n_attn * sizeof(float))
                        : !memcmp(rd.attention, rf.attention, n_attn * sizeof(double)));
            attention_result_free(&rd);
            attention_result_free(&rf);
        }
        free(x);
        free(ctx);
        weights_free(&wd);
        weights_free(&wf);
        if (!same)
            FAIL_AT("trial %d: the float32 set and its double twin disagree", trial);
    }
}

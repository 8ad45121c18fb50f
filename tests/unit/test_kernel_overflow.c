/*
 * test_kernel_overflow.c - scores that overflow to -Inf, told apart from masked keys on
 * every path: the fused kernel (output only), the online softmax (with the attention
 * matrix), the pooled weights and the reductions, each on every kernel path this CPU runs
 * (attn_kernel_select), in float64 and float32, on one thread and on three.
 *
 * q . k of 1e20 against -1e20 is -1e40, past float32's range (1e160 for float64): a row
 * whose every visible score is that is not_finite (its true weights are not 0), whereas a
 * row the mask hides whole gives zeros, and a row where only some scores overflow is
 * computed exactly, the overflowing keys weighing 0 (their true limit).  docs/numbers.md
 * says how the kernel tells the cases apart.
 */
#include <stdlib.h>

#include "core/compute.h"
#include "kernel/attention.h"
#include "kernel/attention_fused.h"
#include "kernel/attention_pool.h"
#include "kernel/attention_reduce.h"
#include "test.h"

enum { LQ = 4, LK = 300 };

/* What a job asks for: the output alone (the fused kernel), the attention matrix too (the
 * online softmax), the pooled weights alone, the reductions alone, and the output with
 * both extras. */
enum { ASK_OUTPUT, ASK_MATRIX, ASK_POOLED, ASK_REDUCED, ASK_ALL, ASKS };
static const char *const ask_names[ASKS] = {"output", "matrix", "pooled", "reduced", "all"};

typedef struct overflow_inputs {
    double q[LQ], k[LK], v[LK];
    unsigned char mask[LQ * LK];
} overflow_inputs;

/* The float64 weights of row i over the inputs as the job's precision holds them (float32
 * rounds q and k first); a score past the precision's range is -Inf, weight 0, the limit
 * of its true weight beside a finite score.  Returns 0 when the row has no weight. */
static int reference_row(const overflow_inputs *in, int f32, int causal, size_t i, double *w)
{
    double big = f32 ? 3.4028234663852886e38 : 1.7976931348623157e308, mx = -INFINITY;
    size_t seen = causal && i + 1 < LK ? i + 1 : LK;
    for (size_t j = 0; j < LK; j++) {
        double q = f32 ? (float)in->q[i] : in->q[i], k = f32 ? (float)in->k[j] : in->k[j];
        double s = q * k;
        w[j] = j < seen && in->mask[i * LK + j] && s >= -big ? s : -INFINITY;
        mx = w[j] > mx ? w[j] : mx;
    }
    if (mx == -INFINITY) {
        memset(w, 0, LK * sizeof(double));
        return 0;
    }
    double sum = 0;
    for (size_t j = 0; j < LK; j++)
        sum += w[j] = exp(w[j] - mx);
    for (size_t j = 0; j < LK; j++)
        w[j] /= sum;
    return 1;
}

/* Checks result r of a job asking `ask` against the reference rows.  Returns the largest
 * difference, relative to 1 (every number here is at most 1 or a small index). */
static double compare(const overflow_inputs *in, int f32, int causal, int ask,
                      const attn_result *r)
{
    double worst = 0, w[LK];
    for (size_t i = 0; i < LQ; i++) {
        int any = reference_row(in, f32, causal, i, w);
        double out = 0, best = -1;
        int64_t arg = -1;
        for (size_t j = 0; j < LK; j++) {
            out += w[j] * in->v[j];
            if (any && w[j] > best) {
                best = w[j];
                arg = (int64_t)j;
            }
        }
        best = any ? best : 0;
        double d = 0;
        if (ask == ASK_OUTPUT || ask == ASK_MATRIX || ask == ASK_ALL)
            d = fabs((r->output != NULL ? r->output[i] : (double)r->output_f32[i]) - out);
        worst = d > worst ? d : worst;
        for (size_t j = 0; ask == ASK_MATRIX && j < LK; j++) {
            double got = f32 ? r->attention_f32[i * LK + j] : r->attention[i * LK + j];
            d = fabs(got - w[j]);
            worst = d > worst ? d : worst;
        }
        if (ask == ASK_POOLED || ask == ASK_ALL) {
            d = fabs(r->pooled[i] - best);
            worst = d > worst ? d : worst;
        }
        if (ask == ASK_REDUCED || ask == ASK_ALL) {
            /* a tie (row 2's keys 7 and 200 score 1e-20 and 2e-20) may go either way */
            int64_t got = r->reduced.argmax[i];
            int arg_ok = got == arg ||
                         (got >= 0 && got < LK && any && fabs(w[got] - best) <= 1e-12);
            d = fabs(r->reduced.max_weight[i] - best) + (arg_ok ? 0 : 1);
            worst = d > worst ? d : worst;
        }
    }
    for (size_t j = 0; (ask == ASK_REDUCED || ask == ASK_ALL) && j < LK; j++) {
        double col = 0;
        for (size_t i = 0; i < LQ; i++) {
            reference_row(in, f32, causal, i, w);
            col += w[j];
        }
        double d = fabs(r->reduced.received[j] - col);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Runs the inputs asking `ask`; returns attention_run's code, with *r filled on success. */
static int run_ask(const overflow_inputs *in, int f32, int causal, int ask, attn_result *r,
                   attn_error *err)
{
    static const attn_pool pool = {.rows = LQ, .cols = 1, .reduce = ATTN_POOL_MAX};
    static const attn_reduce reduce = {.entropy = 1, .max = 1, .received = 1, .topk = 2};
    attn_job job = {.batch = 1, .lq = LQ, .lk = LK, .heads = 1, .dk = 1, .dv = 1,
                    .q = in->q, .k = in->k, .v = in->v, .mask = in->mask, .causal = causal,
                    .scale = 1, .dtype = f32 ? ATTN_FLOAT32 : ATTN_FLOAT64,
                    .want_attention = ask == ASK_MATRIX,
                    .skip_output = ask == ASK_POOLED || ask == ASK_REDUCED,
                    .pool = ask == ASK_POOLED || ask == ASK_ALL ? &pool : NULL,
                    .reduce = ask == ASK_REDUCED || ask == ASK_ALL ? &reduce : NULL};
    error_clear(err);
    return attention_run(&job, r, err);
}

/* The inputs of the tests: q of `big` on rows 0 and 1 and 1 on rows 2 and 3; every key
 * -big (its score overflows on the big rows), but keys 7 and 200, whose scores are 1 and 2
 * (in the first and the seventh tile, so that whole tiles between them overflow); v the
 * key's number; every key visible. */
static void inputs_fill(overflow_inputs *in, int f32)
{
    double big = f32 ? 1e20 : 1e160;
    for (size_t i = 0; i < LQ; i++)
        in->q[i] = i < 2 ? big : 1;
    for (size_t j = 0; j < LK; j++) {
        in->k[j] = -big;
        in->v[j] = (double)j;
    }
    in->k[7] = 1 / big;
    in->k[200] = 2 / big;
    memset(in->mask, 1, sizeof in->mask);
}

/* Calls check(path, f32, threads) for every path, precision and thread count; stops at the
 * first failure (test_failed set). */
static void each_setting(void (*check)(const char *path, int f32, int threads))
{
    const attn_kernel_path *paths[4];
    size_t n = test_float_paths(paths, 4);
    char why[200];
    for (size_t p = 0; p < n && !test_failed; p++) {
        if (attn_kernel_select(paths[p]->name, why, sizeof why) != 0)
            FAIL_AT("%s", why);
        for (int threads = 1; threads <= 3 && !test_failed; threads += 2) {
            if (threads > 1 && compute_init((unsigned)threads) != 0)
                FAIL_AT("compute_init(%d) failed", threads);
            for (int f32 = 0; f32 < 2 && !test_failed; f32++)
                check(paths[p]->name, f32, threads);
            if (threads > 1)
                compute_shutdown();
        }
    }
    attn_kernel_select("auto", why, sizeof why);
}

/* Rows where every visible score overflowed, in three ways: no mask (row 0), the finite
 * keys masked (row 1), and causal (row 0 sees key 0 alone, which overflows): not_finite
 * whatever is asked. */
static void check_all_overflow(const char *path, int f32, int threads)
{
    for (int way = 0; way < 3; way++)
        for (int ask = 0; ask < ASKS; ask++) {
            overflow_inputs in;
            inputs_fill(&in, f32);
            if (way == 0)
                in.k[7] = in.k[200] = -in.q[0];
            if (way == 1)
                in.mask[1 * LK + 7] = in.mask[1 * LK + 200] = 0;
            attn_result r;
            attn_error err;
            int rc = run_ask(&in, f32, way == 2, ask, &r, &err);
            if (rc == 0)
                attention_result_free(&r);
            if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0)
                FAIL_AT("path %s, %s, %d thread(s), %s, way %d: rc %d (%s), want not_finite",
                        path, f32 ? "float32" : "float64", threads, ask_names[ask], way, rc,
                        rc ? err.code : "200");
        }
}

void test_kernel_overflow_every_score_reported(void)
{
    each_setting(check_all_overflow);
}

/* Rows where only some scores overflow (rows 0 and 1: all but keys 7 and 200), beside a
 * row the mask hides whole (row 3) and one with finite scores (row 2): computed exactly,
 * the overflowing keys weighing 0 and the hidden row all zeros. */
static void check_some_overflow(const char *path, int f32, int threads)
{
    for (int ask = 0; ask < ASKS; ask++) {
        overflow_inputs in;
        inputs_fill(&in, f32);
        memset(in.mask + 3 * LK, 0, LK);
        attn_result r;
        attn_error err;
        int rc = run_ask(&in, f32, 0, ask, &r, &err);
        if (rc != 0)
            FAIL_AT("path %s, %s, %d thread(s), %s: rc %d (%s: %s)", path,
                    f32 ? "float32" : "float64", threads, ask_names[ask], rc, err.code,
                    err.message);
        double worst = compare(&in, f32, 0, ask, &r);
        attention_result_free(&r);
        if (!(worst <= (f32 ? 1e-5 : 1e-12)))
            FAIL_AT("path %s, %s, %d thread(s), %s: largest difference %g", path,
                    f32 ? "float32" : "float64", threads, ask_names[ask], worst);
    }
}

void test_kernel_overflow_some_scores_exact(void)
{
    each_setting(check_some_overflow);
}

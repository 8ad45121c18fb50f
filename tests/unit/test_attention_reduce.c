/*
 * test_attention_reduce.c - the reductions of the weights (server/kernel/attention_reduce.c)
 * through attention_run, against the full matrix computed here in long double and reduced by
 * each statistic's definition.
 *
 * Shapes land on the edges of the reductions' own blocks (66 queries, 512 keys, bands of 264
 * queries and of 1024 keys); masks cover causal, a random mask with a fully masked row and a
 * batched mask; cross-attention; both precisions, a float32 job given float inputs (reduced
 * in place) and double ones; serially and on a pool of three threads, whose answers must be
 * the same bit for bit; with each kernel path.  (tests/reductions/ checks the same against
 * NumPy through the server's v1 and v2.)
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernel/attention_fused.h"
#include "kernel/attention_reduce.h"
#include "core/compute.h"
#include "test.h"

static uint64_t reduce_rng = 0x452821E638D01377ull;

typedef struct reduce_case {
    size_t batch, heads, lq, lk, dk;
    int causal, masked, mask_batched;
    size_t sink, local, topk;
} reduce_case;

static const reduce_case REDUCE_CASES[] = {
    /* batch heads lq lk dk causal masked batched sink local topk */
    {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1},
    {2, 2, 37, 53, 8, 1, 0, 0, 3, 2, 4},
    {1, 3, 130, 600, 12, 0, 1, 0, 5, 40, 8},        /* past 66 rows and 512 keys */
    {2, 1, 70, 1100, 4, 0, 1, 1, 1, 0, 3},          /* past a band of 1024 keys */
    {1, 2, 600, 600, 16, 1, 1, 0, 4, 16, 8},        /* past two bands of 264 queries */
    {1, 1, 40, 9, 8, 1, 0, 0, 20, 100, 9},          /* cross, causal: rows past the keys */
};

/* Row i of (b, h)'s weights, in long double, into w[0..lk); returns the number of keys the
 * row may see. */
static size_t weights_row(const reduce_case *rc, const attn_job *job, const double *q,
                          const double *k, size_t b, size_t h, size_t i, long double *w,
                          int *seen)
{
    size_t dh = rc->dk / rc->heads, n = 0;
    long double mx = -INFINITY;
    const unsigned char *mask =
        job->mask ? job->mask + (job->mask_batched ? b : 0) * rc->lq * rc->lk : NULL;
    for (size_t j = 0; j < rc->lk; j++) {
        seen[j] = !((rc->causal && j > i) || (mask && !mask[i * rc->lk + j]));
        long double s = 0;
        for (size_t t = 0; t < dh; t++)
            s += (long double)q[(b * rc->lq + i) * rc->dk + h * dh + t] *
                 k[(b * rc->lk + j) * rc->dk + h * dh + t];
        w[j] = seen[j] ? s * job->scale : -INFINITY;
        n += (size_t)seen[j];
        if (w[j] > mx)
            mx = w[j];
    }
    long double sum = 0;
    for (size_t j = 0; j < rc->lk; j++) {
        w[j] = mx == -INFINITY ? 0 : expl(w[j] - mx);
        sum += w[j];
    }
    for (size_t j = 0; j < rc->lk; j++)
        w[j] = sum > 0 ? w[j] / sum : 0;
    return n;
}

static double worse(double worst, double got, long double want)
{
    double d = fabs(got - (double)want);
    return isnan(d) ? INFINITY : d > worst ? d : worst;
}

/* The largest difference of any statistic of res from the reference, or INFINITY when an
 * index differs (the random scores here have no ties). */
static double compare(const reduce_case *rc, const attn_job *job, const double *q,
                      const double *k, const attn_result *res)
{
    const attn_reduced *r = &res->reduced;
    long double *w = malloc(rc->lk * sizeof *w), *recv = calloc(rc->lk, sizeof *recv);
    int *seen = malloc(rc->lk * sizeof *seen);
    double worst = 0;
    for (size_t b = 0; b < rc->batch; b++)
        for (size_t h = 0; h < rc->heads; h++) {
            size_t bh = b * rc->heads + h;
            for (size_t j = 0; j < rc->lk; j++)
                recv[j] = 0;
            for (size_t i = 0; i < rc->lq; i++) {
                size_t n = weights_row(rc, job, q, k, b, h, i, w, seen), o = bh * rc->lq + i;
                long double ent = 0, sink = 0, local = 0;
                for (size_t j = 0; j < rc->lk; j++) {
                    ent -= w[j] > 0 ? w[j] * logl(w[j]) : 0;
                    sink += j < rc->sink ? w[j] : 0;
                    local += (j > i ? j - i : i - j) <= rc->local ? w[j] : 0;
                    recv[j] += w[j];
                }
                worst = worse(worst, r->entropy[o], ent);
                worst = worse(worst, r->sink[o], sink);
                worst = worse(worst, r->local[o], local);
                /* the top-k by selection: the largest weight of the keys not yet taken */
                for (size_t t = 0; t < rc->topk; t++) {
                    long double best = -1;
                    int64_t at = -1;
                    for (size_t j = 0; j < rc->lk; j++)
                        if (seen[j] && w[j] > best) {
                            best = w[j];
                            at = (int64_t)j;
                        }
                    if (at >= 0)
                        seen[at] = 0;
                    int64_t got = r->topk_indices[o * rc->topk + t];
                    if (got != (t < n ? at : -1))
                        worst = INFINITY;
                    worst = worse(worst, r->topk_weights[o * rc->topk + t], at >= 0 ? best : 0);
                    if (t == 0) {
                        if (r->argmax[o] != at)
                            worst = INFINITY;
                        worst = worse(worst, r->max_weight[o], at >= 0 ? best : 0);
                    }
                }
            }
            for (size_t j = 0; j < rc->lk; j++)
                worst = worse(worst, r->received[bh * rc->lk + j], recv[j]);
        }
    free(w);
    free(recv);
    free(seen);
    return worst;
}

/* Runs case rc (f32: in float32, from float inputs when f32 == 2) on `threads`; fills res.
 * Returns attention_run's status. */
static int run_case(const reduce_case *rc, int f32, double *q, double *k, double *v,
                    float *qf, float *kf, float *vf, unsigned char *mask, attn_result *res)
{
    attn_reduce red = {.entropy = 1, .max = 1, .received = 1, .want_sink = 1, .want_local = 1,
                       .sink = rc->sink, .local = rc->local, .topk = rc->topk};
    attn_job job = {.batch = rc->batch, .lq = rc->lq, .lk = rc->lk, .heads = rc->heads,
                    .dk = rc->dk, .dv = rc->dk, .causal = rc->causal,
                    .scale = 1.0 / sqrt((double)(rc->dk / rc->heads)), .mask = mask,
                    .mask_batched = rc->mask_batched,
                    .dtype = f32 ? ATTN_FLOAT32 : ATTN_FLOAT64, .reduce = &red,
                    .skip_output = 1};
    if (f32 == 2) {
        job.q32 = qf;
        job.k32 = kf;
        job.v32 = vf;
    } else {
        job.q = q;
        job.k = k;
        job.v = v;
    }
    attn_error err;
    return attention_run(&job, res, &err);
}

/* Every case in both precisions (float32 from double and from float inputs), on one thread
 * and on three (the same bits), with each kernel path.  float32 is held to 4e-6 relative to
 * the largest value (received reaches lq): scores reach 25 here, whose float32 ulp is 1.9e-6;
 * float64 to 1e-13. */
void test_attention_reduce_matches_reference(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    char err[128];
    for (size_t c = 0; c < sizeof REDUCE_CASES / sizeof REDUCE_CASES[0]; c++) {
        const reduce_case *rc = &REDUCE_CASES[c];
        size_t nq = rc->batch * rc->lq * rc->dk, nk = rc->batch * rc->lk * rc->dk;
        double *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
        float *qf = malloc(nq * sizeof *qf), *kf = malloc(nk * sizeof *kf), *vf = malloc(nk * sizeof *vf);
        for (size_t i = 0; i < nq; i++)
            q[i] = qf[i] = (float)(3 * test_uniform(&reduce_rng));
        for (size_t i = 0; i < nk; i++) {
            k[i] = kf[i] = (float)(3 * test_uniform(&reduce_rng));
            v[i] = vf[i] = (float)test_uniform(&reduce_rng);
        }
        unsigned char *mask = NULL;
        if (rc->masked) {
            size_t n = (rc->mask_batched ? rc->batch : 1) * rc->lq * rc->lk;
            mask = malloc(n);
            for (size_t i = 0; i < n; i++)
                mask[i] = (test_next_bits(&reduce_rng) & 3) != 0;
            memset(mask + 2 * rc->lk, 0, rc->lk);     /* row 2 sees nothing */
        }
        attn_job ref = {.lq = rc->lq, .lk = rc->lk, .mask = mask, .mask_batched = rc->mask_batched,
                        .scale = 1.0 / sqrt((double)(rc->dk / rc->heads))};
        for (size_t p = 0; p < npaths; p++) {
            ASSERT_EQ(attn_kernel_select(paths[p]->name, err, sizeof err), 0);
            for (int f32 = 0; f32 <= 2; f32++) {
                attn_result one, three;
                int rc1 = run_case(rc, f32, q, k, v, qf, kf, vf, mask, &one);
                ASSERT_EQ(compute_init(3), 0);
                int rc3 = run_case(rc, f32, q, k, v, qf, kf, vf, mask, &three);
                compute_shutdown();
                ASSERT_EQ(rc1, 0);
                ASSERT_EQ(rc3, 0);
                size_t rows = rc->batch * rc->heads * rc->lq;
                int same = memcmp(one.reduced.received, three.reduced.received,
                                  rc->batch * rc->heads * rc->lk * sizeof(double)) == 0 &&
                           memcmp(one.reduced.entropy, three.reduced.entropy,
                                  rows * sizeof(double)) == 0 &&
                           memcmp(one.reduced.topk_indices, three.reduced.topk_indices,
                                  rows * rc->topk * sizeof(int64_t)) == 0;
                double worst = compare(rc, &ref, q, k, &one);
                double tol = f32 ? 4e-6 * (double)rc->lq : 1e-13 * (double)rc->lq;
                attention_result_free(&one);
                attention_result_free(&three);
                if (!same || !(worst <= tol)) {
                    attn_kernel_select("auto", err, sizeof err);
                    FAIL_AT("case %zu, %s, path %s: largest difference %g%s", c,
                            f32 == 2 ? "float32 from float" : f32 ? "float32" : "float64",
                            paths[p]->name, worst, same ? "" : "; 1 and 3 threads differ");
                }
            }
        }
        free(q);
        free(k);
        free(v);
        free(qf);
        free(kf);
        free(vf);
        free(mask);
    }
    ASSERT_EQ(attn_kernel_select("auto", err, sizeof err), 0);
}

/* A score past float64's range is the kernels' 400 "not_finite", not a NaN in an answer. */
void test_attention_reduce_overflow_is_reported(void)
{
    double q[2] = {1e200, 1}, k[2] = {1e200, 1}, v[2] = {1, 1};
    attn_reduce red = {.entropy = 1};
    attn_job job = {.batch = 1, .lq = 2, .lk = 2, .heads = 1, .dk = 1, .dv = 1, .scale = 1,
                    .q = q, .k = k, .v = v, .reduce = &red, .skip_output = 1};
    attn_result res;
    attn_error err;
    ASSERT(attention_run(&job, &res, &err) != 0);
    ASSERT(strcmp(err.code, "not_finite") == 0);
}

/* Lengths that end on either side of every vector width (2 to 16 lanes) and of the blocks of
 * the helpers (64 keys of float sums, 4 vectors of the top-k search). */
static const size_t HELPER_LENGTHS[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 300, 512};
#define HELPER_MAX 512
#define HELPER_SENTINEL 12345.0

/* One row of scores for the helpers: uniform in [-20, 10], every 7th -Inf (a masked key),
 * and when `hidden` all but one -Inf (a row that sees one key of the tile). */
static void helper_row(double *s, size_t n, int hidden)
{
    for (size_t j = 0; j < n; j++) {
        s[j] = 7.5 * test_uniform(&reduce_rng) - 5;
        if (j % 7 == 3 || (hidden && j != n / 2))
            s[j] = -INFINITY;
    }
}

/* The kernel path's pass over a row of scores (reduce_weigh) and its column sums of
 * `received` (reduce_receive), in both precisions on every path, against exp in long double:
 * every length, tails included, writes the n exponentials and adds the n weights and no
 * more; a masked key weighs 0; the sums add to what l and u held. */
void test_attention_reduce_row_passes(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    double s[HELPER_MAX + 1], p[HELPER_MAX + 1], acc[HELPER_MAX + 1];
    float sf[HELPER_MAX + 1], pf[HELPER_MAX + 1], accf[HELPER_MAX + 1];
    for (size_t p_ = 0; p_ < npaths; p_++)
        for (size_t c = 0; c < sizeof HELPER_LENGTHS / sizeof HELPER_LENGTHS[0]; c++)
            for (int hidden = 0; hidden <= 1; hidden++)
                for (int f32 = 0; f32 <= 1; f32++) {
                    size_t n = HELPER_LENGTHS[c];
                    helper_row(s, n, hidden);
                    double m = -INFINITY;
                    for (size_t j = 0; j < n; j++) {
                        sf[j] = (float)s[j];
                        if (f32)
                            s[j] = sf[j];
                        m = s[j] > m ? s[j] : m;
                    }
                    if (m == -INFINITY)
                        continue;               /* no key counts: the callers stop before */
                    double l = 0.5, u = -0.25, inv = 1 / 3.0;
                    for (size_t j = 0; j <= n; j++) {
                        p[j] = acc[j] = HELPER_SENTINEL;
                        pf[j] = accf[j] = (float)HELPER_SENTINEL;
                        if (j < n)
                            acc[j] = accf[j] = (float)j;
                    }
                    if (f32) {
                        paths[p_]->reduce_weigh_f(sf, n, (float)m, pf, &l, &u);
                        paths[p_]->reduce_receive_f(sf, n, (float)m, (float)inv, accf);
                        for (size_t j = 0; j <= n; j++) {
                            p[j] = pf[j];
                            acc[j] = accf[j];
                        }
                    } else {
                        paths[p_]->reduce_weigh_d(s, n, m, p, &l, &u);
                        paths[p_]->reduce_receive_d(s, n, m, inv, acc);
                    }
                    double tol = f32 ? 4e-6 : 1e-14;
                    long double lw = 0.5L, uw = -0.25L;
                    int bad = p[n] != HELPER_SENTINEL || acc[n] != HELPER_SENTINEL;
                    for (size_t j = 0; j < n; j++) {
                        long double w = expl((long double)s[j] - (long double)m);
                        lw += w;
                        uw += s[j] == -INFINITY ? 0 : w * ((long double)s[j] - (long double)m);
                        bad |= !(fabsl(p[j] - w) <= tol * w + (f32 ? 1e-37 : 1e-300));
                        bad |= !(fabsl(acc[j] - ((long double)j + w / 3)) <=
                                 tol * ((long double)j + w / 3) + (f32 ? 1e-37 : 1e-300));
                    }
                    bad |= !(fabsl(l - lw) <= tol * lw) || !(fabsl(u - uw) <= tol * fabsl(uw));
                    if (bad)
                        FAIL_AT("path %s, %s, n %zu%s: l %.17g (want %.17Lg), u %.17g (want "
                                "%.17Lg), or a weight off, or a number past n written",
                                paths[p_]->name, f32 ? "float" : "double", n,
                                hidden ? ", one key seen" : "", l, lw, u, uw);
                }
}

/* The row maximum (reduce_max) against a plain loop at every length: -Inf among the scores,
 * all of them -Inf (a row whose keys are all masked), a NaN anywhere (taken as not finite). */
void test_attention_reduce_row_max(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    double s[HELPER_MAX];
    float sf[HELPER_MAX];
    for (size_t p = 0; p < npaths; p++)
        for (size_t c = 0; c < sizeof HELPER_LENGTHS / sizeof HELPER_LENGTHS[0]; c++)
            for (int kind = 0; kind < 3; kind++) {    /* scores, all -Inf, a NaN at the end */
                size_t n = HELPER_LENGTHS[c];
                helper_row(s, n, 0);
                double want = -INFINITY;
                for (size_t j = 0; j < n; j++) {
                    if (kind == 1)
                        s[j] = -INFINITY;
                    if (kind == 2 && j == n - 1)
                        s[j] = NAN;
                    sf[j] = (float)s[j];
                    want = s[j] > want ? s[j] : want;
                }
                double got = paths[p]->reduce_max_d(s, n), gotf = paths[p]->reduce_max_f(sf, n);
                int ok = kind == 2 ? got != got && gotf != gotf
                                   : got == want && gotf == (float)want;
                if (!ok)
                    FAIL_AT("path %s, n %zu, case %d: %g and %g, want %g", paths[p]->name, n,
                            kind, got, gotf, kind == 2 ? NAN : want);
            }
}

/* The top-k's search (reduce_above) against a plain loop, from every start, with thresholds
 * below, inside and above a row's scores, -Inf and NaN among them. */
void test_attention_reduce_above(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    double s[HELPER_MAX];
    float sf[HELPER_MAX];
    const double thresholds[] = {-INFINITY, -30, -4.9, 0, 2.4, 9.99, 20};
    for (size_t p = 0; p < npaths; p++)
        for (size_t c = 0; c < sizeof HELPER_LENGTHS / sizeof HELPER_LENGTHS[0]; c++) {
            size_t n = HELPER_LENGTHS[c];
            helper_row(s, n, 0);
            s[n / 3] = NAN;
            for (size_t j = 0; j < n; j++)
                sf[j] = (float)s[j];
            for (size_t t = 0; t < sizeof thresholds / sizeof thresholds[0]; t++)
                for (size_t from = 0; from <= n; from += 1 + from / 4) {
                    size_t want_d = from, want_f = from;
                    while (want_d < n && !(s[want_d] > thresholds[t]))
                        want_d++;
                    while (want_f < n && !(sf[want_f] > (float)thresholds[t]))
                        want_f++;
                    size_t got_d = paths[p]->reduce_above_d(s, from, n, thresholds[t]);
                    size_t got_f = paths[p]->reduce_above_f(sf, from, n, (float)thresholds[t]);
                    if (got_d != want_d || got_f != want_f)
                        FAIL_AT("path %s, n %zu, from %zu, above %g: %zu and %zu, want %zu "
                                "and %zu", paths[p]->name, n, from, thresholds[t], got_d, got_f,
                                want_d, want_f);
                }
        }
}

/* The score tiles (reduce_scores) from K packed by the path, against the dot products in
 * long double: row counts on either side of the register group, key counts on either side
 * of a packed tile, odd head dims, a tile that starts past key 0, keys past lk scoring 0;
 * the rows past those asked for up to a whole register group the same as the last row, and
 * nothing written past that group or past the keys rounded up to a tile. */
void test_attention_reduce_score_tiles(void)
{
    const attn_kernel_path *paths[4];
    size_t npaths = test_float_paths(paths, 4);
    enum { LDS = 2 * ATTN_FUSED_BK + 32, ROWS = 70, LK = ATTN_FUSED_BK * 3 / 2 + 4, DMAX = 100,
           LD = DMAX + 3 };
    const size_t dims[] = {1, 3, 8, 64, 100}, nqs[] = {1, 5, 6, 7, 13, 64},
                 nks[] = {1, 31, 32, 33, ATTN_FUSED_BK + 4};
    double *q = malloc(ROWS * LD * sizeof *q), *k = malloc(LK * LD * sizeof *k);
    float *qf = malloc(ROWS * LD * sizeof *qf), *kf = malloc(LK * LD * sizeof *kf);
    double *kt = malloc(2 * ATTN_FUSED_BK * DMAX * sizeof *kt);
    float *ktf = malloc(2 * ATTN_FUSED_BK * DMAX * sizeof *ktf);
    double *s = malloc((ROWS + 1) * LDS * sizeof *s);
    float *sf = malloc((ROWS + 1) * LDS * sizeof *sf);
    for (size_t i = 0; i < ROWS * LD; i++)
        q[i] = qf[i] = (float)test_uniform(&reduce_rng);
    for (size_t i = 0; i < LK * LD; i++)
        k[i] = kf[i] = (float)test_uniform(&reduce_rng);
    for (size_t p = 0; p < npaths; p++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t d = dims[di];
            /* zeroed first, as attention_reduce.c's K: the pack pads whole panels only */
            memset(kt, 0, 2 * ATTN_FUSED_BK * DMAX * sizeof *kt);
            memset(ktf, 0, 2 * ATTN_FUSED_BK * DMAX * sizeof *ktf);
            paths[p]->pack_d(k, LD, NULL, 0, LK, d, 0, 0, kt, NULL);
            paths[p]->pack_f(kf, LD, NULL, 0, LK, d, 0, 0, ktf, NULL);
            for (size_t a = 0; a < sizeof nqs / sizeof nqs[0]; a++)
                for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++)
                    for (size_t k0 = 0; k0 < LK; k0 += ATTN_FUSED_BK) {
                        size_t nq = nqs[a], nk = nks[b];
                        if (k0 + nk > LK)
                            continue;                   /* the callers stay within lk */
                        size_t width = (nk + ATTN_FUSED_BK - 1) / ATTN_FUSED_BK * ATTN_FUSED_BK;
                        for (size_t i = 0; i < (ROWS + 1) * LDS; i++)
                            s[i] = sf[i] = (float)HELPER_SENTINEL;
                        paths[p]->reduce_scores_d(q, LD, nq, kt, d, k0, nk, 0.5, s, LDS);
                        paths[p]->reduce_scores_f(qf, LD, nq, ktf, d, k0, nk, 0.5f, sf, LDS);
                        double worst = 0;
                        int past = 0;
                        size_t whole = (nq + ATTN_FUSED_MR - 1) / ATTN_FUSED_MR * ATTN_FUSED_MR;
                        for (size_t r = 0; r <= whole; r++)
                            for (size_t j = 0; j < LDS; j++) {
                                double got = s[r * LDS + j], gotf = sf[r * LDS + j];
                                if (r == whole || j >= width) {
                                    past |= got != HELPER_SENTINEL || gotf != HELPER_SENTINEL;
                                    continue;
                                }
                                if (r >= nq) {
                                    past |= got != s[(nq - 1) * LDS + j] ||
                                            gotf != sf[(nq - 1) * LDS + j];
                                    continue;
                                }
                                long double want = 0, mag = 0;
                                for (size_t t = 0; k0 + j < LK && t < d; t++) {
                                    long double x = (long double)q[r * LD + t] * k[(k0 + j) * LD + t];
                                    want += x;
                                    mag += fabsl(x);
                                }
                                want *= 0.5L;
                                /* a sum of d products is within d ulps of their magnitudes */
                                mag = 0.5L * mag * (long double)d + 1e-30L;
                                double e = (double)(fabsl(got - want) / (mag * DBL_EPSILON)),
                                       ef = (double)(fabsl(gotf - want) / (mag * FLT_EPSILON));
                                worst = e > worst ? e : worst;
                                worst = ef > worst ? ef : worst;
                            }
                        if (past || !(worst <= 1))
                            FAIL_AT("path %s, d %zu, %zu rows, %zu keys from %zu: error %g of "
                                    "the tolerance%s", paths[p]->name, d, nq, nk, k0, worst,
                                    past ? ", written past the tile or its group" : "");
                    }
        }
    free(q);
    free(k);
    free(qf);
    free(kf);
    free(kt);
    free(s);
    free(ktf);
    free(sf);
}

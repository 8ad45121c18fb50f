/*
 * bench_kernel.c - how fast is attention_run, measured rather than assumed.
 *
 * For a fixed list of typical shapes (sequence length L = 128, 512, 1024,
 * 64 features per head, 1 or 8 heads, batch 1 or 4, causal or not) this
 * program times attention_run in float64 and in float32, and on the smaller
 * shapes also the naive loops of tests/ref/reference.c, which it uses as the
 * oracle: a case whose result differs from the reference fails the run, since
 * a benchmark of a wrong answer is worthless.  Each timing is the median of
 * repeated runs after one warm-up run, because the machine is shared and
 * noisy.  OpenBLAS is held to one thread per product, as the server's
 * --blas-threads default does (BENCH_BLAS_THREADS overrides it).
 *
 * Output, in the directory given by --out (build/bench/results by default):
 *   kernel.tsv   one row per case and dtype: shape, median ms, repetitions,
 *                the reference's median and the largest difference from it;
 *                bench_numpy.py reads it to time NumPy on the same cases.
 *   check.tsv    and check-*.bin: inputs and outputs of a few cases, as raw
 *                little-endian doubles, from which bench_numpy.py recomputes
 *                the result with NumPy and checks that it agrees.
 * A readable table goes to stdout.  Exit status 0, or 1 when a result
 * disagrees with the reference or a run fails.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attention.h"
#include "ref/reference.h"

/* One shape to time.  Widths are per head: q and k are L x (heads*head_dim). */
typedef struct bench_case {
    size_t batch, heads, len, head_dim;
    int causal;
    int want_attention;     /* return the attention matrix (the contract's default) */
    int reference;          /* also time the naive reference and compare with it */
    int check_file;         /* write inputs and outputs for the NumPy cross-check */
} bench_case;

static const bench_case bench_cases[] = {
    {1, 1, 128, 64, 0, 1, 1, 1},
    {1, 1, 128, 64, 1, 1, 1, 0},
    {1, 8, 128, 64, 1, 1, 1, 0},
    {4, 8, 128, 64, 1, 1, 1, 1},
    {1, 1, 512, 64, 0, 1, 1, 0},
    {1, 8, 512, 64, 1, 1, 0, 0},
    {1, 8, 512, 64, 1, 0, 0, 0},
    {4, 8, 512, 64, 1, 1, 0, 0},
    {1, 1, 1024, 64, 1, 1, 0, 0},
    {1, 8, 1024, 64, 1, 1, 0, 0},
    {4, 8, 1024, 64, 1, 0, 0, 0},
};
#define CASE_COUNT (sizeof bench_cases / sizeof bench_cases[0])

/* Largest difference from the float64 reference that counts as agreement.
 * float32 rounds the inputs and computes in single precision. */
#define TOLERANCE_F64 1e-12
#define TOLERANCE_F32 1e-4

/* Repetition policy: after one warm-up run, at least min_reps runs, then more
 * until budget_s seconds of runs have passed, never more than MAX_REPS. */
#define MAX_REPS 200
typedef struct rep_policy {
    int min_reps;
    double budget_s;
} rep_policy;

static uint64_t rng_state;

/* Uniform doubles in [-2, 2) from xorshift64, reproducible from the seed. */
static double rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 4.0 - 2.0;
}

static double *rnd_array(size_t n)
{
    double *a = malloc(n * sizeof(double));
    if (a == NULL) {
        fprintf(stderr, "bench-kernel: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        a[i] = rnd();
    return a;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A timed piece of work: returns 0, or nonzero when it failed. */
typedef int (*bench_fn)(void *ctx);

/* Runs fn once untimed, then as policy says, and returns the median time of
 * one run in milliseconds with the number of timed runs in *reps.  Returns a
 * negative number when any run fails. */
static double time_median_ms(bench_fn fn, void *ctx, const rep_policy *policy, int *reps)
{
    double times[MAX_REPS];
    int n = 0;
    if (fn(ctx) != 0)
        return -1;
    double start = now_s();
    while (n < MAX_REPS && (n < policy->min_reps || now_s() - start < policy->budget_s)) {
        double t0 = now_s();
        if (fn(ctx) != 0)
            return -1;
        times[n++] = (now_s() - t0) * 1e3;
    }
    qsort(times, (size_t)n, sizeof times[0], compare_doubles);
    *reps = n;
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

/* attention_run on a job; the result of the latest run is kept for checks. */
typedef struct run_ctx {
    attn_job job;
    attn_result result;
} run_ctx;

static int run_attention(void *p)
{
    run_ctx *ctx = p;
    api_error err;
    attention_result_free(&ctx->result);
    if (attention_run(&ctx->job, &ctx->result, &err) != 0) {
        fprintf(stderr, "bench-kernel: attention_run failed: %s\n", err.message);
        return -1;
    }
    return 0;
}

/* ref_sdpa on the same inputs, into caller-owned buffers. */
typedef struct ref_ctx {
    const attn_job *job;
    double *out, *attn;
} ref_ctx;

static int run_reference(void *p)
{
    ref_ctx *ctx = p;
    const attn_job *j = ctx->job;
    ref_sdpa(j->batch, j->heads, j->lq, j->lk, j->dk / j->heads, j->dv / j->heads, j->q, j->k,
             j->v, NULL, j->causal, j->scale, ctx->out, ctx->attn);
    return 0;
}

static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= worst))
            worst = d;  /* also catches NaN */
    }
    return worst;
}

static void case_name(const bench_case *c, char *out, size_t len)
{
    snprintf(out, len, "B%zu H%zu L%zu dh%zu %s%s", c->batch, c->heads, c->len, c->head_dim,
             c->causal ? "causal" : "full", c->want_attention ? "" : " noattn");
}

/* Appends the arrays to a raw file and its description to check.tsv. */
static int write_check(const char *dir, FILE *index, const char *file_id, const char *dtype,
                       const bench_case *c, const attn_job *job, const attn_result *r)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/check-%s-%s.bin", dir, file_id, dtype);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "bench-kernel: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t nq = job->batch * job->lq * job->dk, nk = job->batch * job->lk * job->dk;
    size_t nv = job->batch * job->lk * job->dv, nout = job->batch * job->lq * job->dv;
    size_t nattn = job->batch * job->heads * job->lq * job->lk;
    int ok = fwrite(job->q, sizeof(double), nq, f) == nq &&
             fwrite(job->k, sizeof(double), nk, f) == nk &&
             fwrite(job->v, sizeof(double), nv, f) == nv &&
             fwrite(r->output, sizeof(double), nout, f) == nout &&
             fwrite(r->attention, sizeof(double), nattn, f) == nattn;
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "bench-kernel: cannot write %s\n", path);
        return -1;
    }
    /* file, dtype, batch, heads, L, head_dim, causal, scale (exact) */
    fprintf(index, "check-%s-%s.bin\t%s\t%zu\t%zu\t%zu\t%zu\t%d\t%.17g\n", file_id, dtype, dtype,
            c->batch, c->heads, c->len, c->head_dim, c->causal, job->scale);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: bench-kernel [--out DIR] [--quick]\n"
                 "  --out DIR   where kernel.tsv and the check files go (build/bench/results)\n"
                 "  --quick     fewer repetitions (a smoke test, not a measurement)\n");
}

int main(int argc, char **argv)
{
    const char *out_dir = "build/bench/results";
    rep_policy policy = {5, 0.4}, ref_policy = {3, 0.3};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_dir = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            policy = (rep_policy){1, 0};
            ref_policy = (rep_policy){1, 0};
        } else {
            usage(strcmp(argv[i], "--help") == 0 ? stdout : stderr);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    mkdir(out_dir, 0755);
    const char *threads_env = getenv("BENCH_BLAS_THREADS");
    int threads = threads_env != NULL ? atoi(threads_env) : 1;
    attention_blas_set_threads(threads > 0 ? threads : 1);
    char blas_config[200], blas_core[40];
    int blas_threads;
    attention_blas_describe(blas_config, sizeof blas_config, blas_core, sizeof blas_core,
                            &blas_threads);

    char path[1100];
    snprintf(path, sizeof path, "%s/kernel.tsv", out_dir);
    FILE *tsv = fopen(path, "w");
    snprintf(path, sizeof path, "%s/check.tsv", out_dir);
    FILE *check_index = fopen(path, "w");
    if (tsv == NULL || check_index == NULL) {
        fprintf(stderr, "bench-kernel: cannot write into %s: %s\n", out_dir, strerror(errno));
        return 1;
    }
    fprintf(tsv, "case\tdtype\tbatch\theads\tlen\thead_dim\tcausal\tattention\treps\tc_ms\t"
                 "ref_ms\tref_max_diff\n");
    printf("attention_run against the naive reference; BLAS: %s, core %s, %d thread%s\n",
           blas_config, blas_core, blas_threads, blas_threads == 1 ? "" : "s");
    printf("%-34s %-7s %5s %10s %10s %9s %10s\n", "case", "dtype", "runs", "median ms",
           "naive ms", "naive/C", "max diff");

    int failures = 0;
    for (size_t ci = 0; ci < CASE_COUNT; ci++) {
        const bench_case *c = &bench_cases[ci];
        size_t d = c->heads * c->head_dim;
        size_t n_in = c->batch * c->len * d;
        size_t n_attn = c->batch * c->heads * c->len * c->len;
        rng_state = 0x9E3779B97F4A7C15ull + ci;
        double *q = rnd_array(n_in), *k = rnd_array(n_in), *v = rnd_array(n_in);
        attn_job job = {.batch = c->batch, .lq = c->len, .lk = c->len, .heads = c->heads,
                        .dk = d, .dv = d, .q = q, .k = k, .v = v, .causal = c->causal,
                        .scale = 1.0 / sqrt((double)c->head_dim),
                        .want_attention = c->want_attention};
        char name[80], file_id[80];
        case_name(c, name, sizeof name);
        snprintf(file_id, sizeof file_id, "%zu", ci);

        /* The reference is float64 only: it is timed once per shape and is the
         * oracle for both dtypes. */
        double ref_ms = -1;
        int ref_reps = 0;
        ref_ctx ref = {&job, NULL, NULL};
        if (c->reference) {
            ref.out = malloc(n_in * sizeof(double));
            ref.attn = malloc(n_attn * sizeof(double));
            if (ref.out == NULL || ref.attn == NULL) {
                fprintf(stderr, "bench-kernel: out of memory\n");
                return 1;
            }
            ref_ms = time_median_ms(run_reference, &ref, &ref_policy, &ref_reps);
        }
        for (int dt = 0; dt < 2; dt++) {
            const char *dtype = dt == 0 ? "float64" : "float32";
            run_ctx run;
            memset(&run, 0, sizeof run);
            run.job = job;
            run.job.dtype = dt == 0 ? ATTN_FLOAT64 : ATTN_FLOAT32;
            int reps = 0;
            double ms = time_median_ms(run_attention, &run, &policy, &reps);
            if (ms < 0) {
                failures++;
                attention_result_free(&run.result);
                continue;
            }
            double diff = -1;
            if (c->reference) {
                double tol = dt == 0 ? TOLERANCE_F64 : TOLERANCE_F32;
                diff = max_abs_diff(run.result.output, ref.out, n_in);
                if (c->want_attention) {
                    double da = max_abs_diff(run.result.attention, ref.attn, n_attn);
                    if (!(da <= diff))
                        diff = da;
                }
                if (!(diff <= tol)) {
                    fprintf(stderr, "bench-kernel: %s %s differs from the reference by %g "
                                    "(tolerance %g)\n", name, dtype, diff, tol);
                    failures++;
                }
            }
            if (c->check_file) {
                /* The cross-check needs the attention matrix: a case timed
                 * without it gets one more, untimed run with it. */
                if (!c->want_attention) {
                    run.job.want_attention = 1;
                    if (run_attention(&run) != 0)
                        failures++;
                }
                if (write_check(out_dir, check_index, file_id, dtype, c, &run.job,
                                &run.result) != 0)
                    failures++;
            }
            char ref_col[32] = "-", ratio_col[32] = "-", diff_col[32] = "-";
            if (ref_ms >= 0 && dt == 0) {
                snprintf(ref_col, sizeof ref_col, "%.3f", ref_ms);
                snprintf(ratio_col, sizeof ratio_col, "%.1fx", ref_ms / ms);
            }
            if (diff >= 0)
                snprintf(diff_col, sizeof diff_col, "%.1e", diff);
            printf("%-34s %-7s %5d %10.3f %10s %9s %10s\n", name, dtype, reps, ms, ref_col,
                   ratio_col, diff_col);
            fflush(stdout);
            fprintf(tsv, "%s\t%s\t%zu\t%zu\t%zu\t%zu\t%d\t%d\t%d\t%.6f\t%s\t%s\n", name, dtype,
                    c->batch, c->heads, c->len, c->head_dim, c->causal, c->want_attention, reps,
                    ms, dt == 0 && ref_ms >= 0 ? ref_col : "-", diff_col);
            attention_result_free(&run.result);
        }
        free(ref.out);
        free(ref.attn);
        free(q);
        free(k);
        free(v);
    }
    int write_failed = fclose(tsv) != 0;
    write_failed |= fclose(check_index) != 0;
    if (write_failed) {
        fprintf(stderr, "bench-kernel: writing the results failed\n");
        failures++;
    }
    if (failures != 0)
        fprintf(stderr, "bench-kernel: %d failure(s)\n", failures);
    return failures != 0;
}

/*
 * bench_kernel.c - attention_run timed on the shapes the performance targets name.
 *
 * The headline case is one head of n = 4096 queries and keys with d = 64, in
 * float64 and in float32, timed with want_attention = 0 (the output only) and
 * separately with want_attention = 1.  A causal variant and a batch x heads
 * variant (batch 4, 8 heads, L = 512) are there for information, and so is
 * n = 4096 in float32 with compute_precision bfloat16 (attn_job.bf16).  The
 * competing implementation is NumPy (bench_numpy.py), which reads the list of
 * cases from kernel.tsv, so that the two programs cannot drift apart.
 *
 * A float32 case gives q, k and v as float and takes its output as float (job.q32, ...,
 * job.output_f32), as the v2 path runs a request of binary FP32 tensors.
 *
 * attention_run gets the compute threads the server would use: the
 * configuration is loaded exactly as the server loads it (defaults, then the
 * ATTN_* environment) and the compute pool started as main.c starts it (one
 * thread per available CPU by default, OpenBLAS at one thread per product);
 * BENCH_COMPUTE_THREADS overrides it.  Each timing is the median of
 * repeated runs after one warm-up run, because the machine is shared.
 *
 * A benchmark of a wrong answer is worthless, so for every case the inputs and
 * the result are written to check-<id>.bin (raw little-endian doubles: q, k,
 * v, output, then the first ATTN_CHECK_ROWS query rows of every head's
 * attention when the case returns it), and bench_numpy.py recomputes them with
 * NumPy on the same inputs and fails the run when they disagree.
 *
 * Output, in the directory given by --out (build/bench/results by default):
 * kernel.tsv and the check files.  A readable table goes to stdout.  Exit
 * status 0, or 1 when a run failed.
 *
 * --case runs one shape of the caller's instead of the list above, with the
 * same timing and check file: the ONNX Runtime rows (bench_ort.sh) use it.
 * Its optional last field gives the keys apart from the queries (LEN): one
 * query over a sequence's 32,768 cached keys is "...,1,64,0,0,32768"
 * (bench_sequences.py, which adds --cold: its steps find their cache out of the
 * caches, after the round's stateless requests, and --cold times each run after
 * writing more than the caches hold).
 *
 * The list first measures the machine's FMA peak (fma_peak.h) on the same
 * threads and prints each row's GFLOP/s as a share of the widest instruction
 * set's peak of its precision; --case leaves that to its caller (bench_ort.sh
 * takes the peak from bench-gemm once for all its rows).  A bfloat16 row's share
 * is of the bfloat16 peak (vdpbf16ps), where the CPU has one.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_util.h"
#include "fma_peak.h"
#include "kernel/attention.h"
#include "kernel/blas_setup.h"
#include "core/compute.h"
#include "core/mem.h"
#include "core/config.h"

extern char **environ;

/* One shape to time.  q and k are batch x len x (heads * head_dim). */
typedef struct bench_case {
    const char *id;         /* file-name-safe, unique */
    attn_dtype dtype;
    size_t batch, heads, len, head_dim;
    int causal;
    int want_attention;
    double target;          /* the target ratio NumPy/C, or 0 for none */
    size_t keys;            /* keys per query row; 0: len */
    int bf16;               /* compute_precision bfloat16 (dtype float32) */
} bench_case;

static const bench_case bench_cases[] = {
    {"n4096-f64", ATTN_FLOAT64, 1, 1, 4096, 64, 0, 0, 4, 0, 0},
    {"n4096-f64-attn", ATTN_FLOAT64, 1, 1, 4096, 64, 0, 1, 0, 0, 0},
    {"n4096-f32", ATTN_FLOAT32, 1, 1, 4096, 64, 0, 0, 4, 0, 0},
    {"n4096-f32-attn", ATTN_FLOAT32, 1, 1, 4096, 64, 0, 1, 2, 0, 0},
    {"n4096-bf16", ATTN_FLOAT32, 1, 1, 4096, 64, 0, 0, 0, 0, 1},
    {"n4096-f64-causal", ATTN_FLOAT64, 1, 1, 4096, 64, 1, 0, 0, 0, 0},
    {"b4h8n512-f64", ATTN_FLOAT64, 4, 8, 512, 64, 0, 0, 0, 0, 0},
    {"b4h8n512-f32", ATTN_FLOAT32, 4, 8, 512, 64, 0, 0, 0, 0, 0},
};
#define CASE_COUNT (sizeof bench_cases / sizeof bench_cases[0])

/* Query rows of each head's attention written for the cross-check. */
#define ATTN_CHECK_ROWS 64

#define MAX_REPS 100
typedef struct rep_policy {
    int min_reps;
    double budget_s;
    int cold;                   /* --cold: the caches emptied before each timed run */
} rep_policy;

/* What --cold writes before each timed run: more than the caches of any machine measured
 * here hold, so that the run reads its inputs from memory. */
#define COLD_BYTES ((size_t)256 << 20)
static unsigned char *cold_buffer;

/* Writes the whole of cold_buffer, with a byte that changes from call to call. */
static void caches_empty(void)
{
    static unsigned char fill;
    memset(cold_buffer, ++fill, COLD_BYTES);
}

static uint64_t rng_state;

/* Uniform doubles in [-2, 2) from xorshift64, reproducible from the seed. */
static double rnd(void)
{
    return bench_uniform(&rng_state) * 4.0 - 2.0;
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

/* a[0..n) rounded to float, in a new array. */
static float *to_floats(const double *a, size_t n)
{
    float *f = malloc(n * sizeof(float));
    if (f == NULL) {
        fprintf(stderr, "bench-kernel: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        f[i] = (float)a[i];
    return f;
}

typedef struct run_ctx {
    attn_job job;
    attn_result result;
} run_ctx;

/* attention_run on ctx->job; the result of the latest run is kept. */
static int run_attention(run_ctx *ctx)
{
    attn_error err;
    attention_result_free(&ctx->result);
    if (attention_run(&ctx->job, &ctx->result, &err) != 0) {
        fprintf(stderr, "bench-kernel: attention_run failed: %s\n", err.message);
        return -1;
    }
    return 0;
}

/* Runs once untimed, then as policy says; returns the median milliseconds of
 * one run and the number of timed runs in *reps, or -1 when a run fails. */
static double time_median_ms(run_ctx *ctx, const rep_policy *policy, int *reps)
{
    double times[MAX_REPS];
    int n = 0;
    if (run_attention(ctx) != 0)
        return -1;
    double start = now_s();
    while (n < MAX_REPS && (n < policy->min_reps || now_s() - start < policy->budget_s)) {
        if (policy->cold)
            caches_empty();
        double t0 = now_s();
        if (run_attention(ctx) != 0)
            return -1;
        times[n++] = (now_s() - t0) * 1e3;
    }
    qsort(times, (size_t)n, sizeof times[0], compare_doubles);
    *reps = n;
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

static int write_doubles(FILE *f, const double *a, size_t n)
{
    return fwrite(a, sizeof(double), n, f) == n ? 0 : -1;
}

/* a (double) or a32 (float, widened here) into f as doubles. */
static int write_either(FILE *f, const double *a, const float *a32, size_t n)
{
    if (a != NULL)
        return write_doubles(f, a, n);
    int failed = 0;
    for (size_t i = 0; i < n && !failed; i++) {
        double wide = a32[i];
        failed |= write_doubles(f, &wide, 1);
    }
    return failed;
}

/* Writes check-<id>.bin: q, k, v, output, then the first rows of attention. */
static int write_check(const char *dir, const bench_case *c, const attn_job *job,
                       const attn_result *r, size_t check_rows)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/check-%s.bin", dir, c->id);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "bench-kernel: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t n_in = job->batch * job->lq * job->dk, n_keys = job->batch * job->lk * job->dk;
    /* float32 numbers are widened here, so the file keeps one layout. */
    int failed = write_either(f, job->q, job->q32, n_in) ||
                 write_either(f, job->k, job->k32, n_keys) ||
                 write_either(f, job->v, job->v32, n_keys) ||
                 write_either(f, r->output, r->output_f32, n_in);
    for (size_t m = 0; r->attention != NULL && m < job->batch * job->heads; m++)
        failed |= write_doubles(f, r->attention + m * job->lq * job->lk, check_rows * job->lk);
    for (size_t m = 0; r->attention_f32 != NULL && m < job->batch * job->heads; m++)
        failed |= write_either(f, NULL, r->attention_f32 + m * job->lq * job->lk,
                               check_rows * job->lk);
    if (fclose(f) != 0 || failed) {
        fprintf(stderr, "bench-kernel: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* The compute threads the server would start, or BENCH_COMPUTE_THREADS. */
static int server_compute_threads(void)
{
    const char *forced = getenv("BENCH_COMPUTE_THREADS");
    if (forced != NULL && atoi(forced) > 0)
        return atoi(forced);
    server_config cfg;
    char errbuf[256];
    char *argv[] = {"attention-server", NULL};
    if (config_load(&cfg, 1, argv, environ, stderr, errbuf, sizeof errbuf) != CONFIG_OK) {
        fprintf(stderr, "bench-kernel: the server's configuration does not load: %s\n", errbuf);
        exit(1);
    }
    return cfg.compute_threads > 0 ? (int)cfg.compute_threads : (int)compute_available_cpus();
}

/* Parses --case's "ID,DTYPE,BATCH,HEADS,LEN,HEAD_DIM,CAUSAL,ATTENTION[,KEYS]"
 * into *c (DTYPE float32, bfloat16 or float64; KEYS, the keys when they are not LEN; ID
 * is borrowed from text).  0, or -1 when the text does not say all of that or
 * a size is 0. */
static int parse_case(char *text, bench_case *c)
{
    char dtype[16];
    int id_len = 0;
    memset(c, 0, sizeof *c);
    int got = sscanf(text, "%*[^,]%n,%15[^,],%zu,%zu,%zu,%zu,%d,%d,%zu", &id_len, dtype,
                     &c->batch, &c->heads, &c->len, &c->head_dim, &c->causal,
                     &c->want_attention, &c->keys);
    if (got == 7)
        c->keys = c->len;
    if ((got != 7 && got != 8) || c->batch * c->heads * c->len * c->head_dim * c->keys == 0)
        return -1;
    if (strcmp(dtype, "float32") == 0 || strcmp(dtype, "bfloat16") == 0)
        c->dtype = ATTN_FLOAT32;
    else if (strcmp(dtype, "float64") == 0)
        c->dtype = ATTN_FLOAT64;
    else
        return -1;
    c->bf16 = strcmp(dtype, "bfloat16") == 0;
    text[id_len] = '\0';
    c->id = text;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: bench-kernel [--out DIR] [--quick] [--cold] [--case SPEC]\n"
                 "  --out DIR   where kernel.tsv and the check files go (build/bench/results)\n"
                 "  --quick     one timed run per case (a smoke test, not a measurement)\n"
                 "  --cold      256 MiB written before each timed run: the inputs come from "
                 "memory, not the caches\n"
                 "  --case SPEC only this case: ID,DTYPE,BATCH,HEADS,LEN,HEAD_DIM,CAUSAL,"
                 "ATTENTION[,KEYS]\n"
                 "              (e.g. n4096-f32,float32,1,1,4096,64,0,0; KEYS: the keys when "
                 "not LEN)\n");
}

int main(int argc, char **argv)
{
    blas_setup_select(argv, 1); /* OpenBLAS as the server runs it: widest kernels, no workers */
    mem_tune_allocator();    /* and the allocator set as the server sets it */
    const char *out_dir = "build/bench/results";
    rep_policy policy = {5, 1.5, 0};
    const bench_case *cases = bench_cases;
    size_t case_count = CASE_COUNT;
    bench_case one_case;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_dir = argv[++i];
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            if (parse_case(argv[++i], &one_case) != 0) {
                fprintf(stderr, "bench-kernel: --case %s is not ID,DTYPE,BATCH,HEADS,LEN,"
                        "HEAD_DIM,CAUSAL,ATTENTION[,KEYS]\n", argv[i]);
                return 2;
            }
            cases = &one_case;
            case_count = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            policy.min_reps = 1;
            policy.budget_s = 0;
        } else if (strcmp(argv[i], "--cold") == 0) {
            policy.cold = 1;
        } else {
            usage(strcmp(argv[i], "--help") == 0 ? stdout : stderr);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (policy.cold && (cold_buffer = malloc(COLD_BYTES)) == NULL) {
        fprintf(stderr, "bench-kernel: out of memory\n");
        return 1;
    }
    mkdir(out_dir, 0755);
    int threads = server_compute_threads();
    attention_blas_set_threads(1); /* as the server runs: one BLAS thread per pool thread */
    if (compute_init((unsigned)threads) != 0) {
        fprintf(stderr, "bench-kernel: cannot start %d compute threads\n", threads);
        return 1;
    }
    /* The kernel path as the server chooses it: ATTN_KERNEL, else the widest the CPU runs. */
    char kernel_error[200];
    if (attention_kernel_select(getenv("ATTN_KERNEL"), kernel_error, sizeof kernel_error) != 0) {
        fprintf(stderr, "bench-kernel: ATTN_KERNEL: %s\n", kernel_error);
        return 2;
    }
    char blas_config[200], blas_core[40];
    int blas_threads;
    attention_blas_describe(blas_config, sizeof blas_config, blas_core, sizeof blas_core,
                            &blas_threads);

    /* The ceiling of the rows below, on their threads: the widest instruction set's. */
    fma_peak peak = {"none", 0, 0, 0};
    if (cases == bench_cases) {
        fma_peak peaks[4];
        int npeaks = fma_peak_measure(threads, policy.min_reps == 1, peaks, 4);
        if (npeaks < 0) {
            fprintf(stderr, "bench-kernel: the FMA peak's threads did not start\n");
            return 1;
        }
        if (npeaks > 0)
            peak = peaks[0];
        printf("FMA peak (%s, %d thread%s): float32 %.1f GFLOP/s, float64 %.1f GFLOP/s\n",
               peak.isa, threads, threads == 1 ? "" : "s", peak.f32, peak.f64);
        if (peak.bf16 > 0)
            printf("BF16 peak (vdpbf16ps, %d thread%s): %.1f GFLOP/s\n", threads,
                   threads == 1 ? "" : "s", peak.bf16);
        else
            printf("BF16 peak: not measured, this CPU lacks avx512_bf16\n");
    }

    char path[1100];
    snprintf(path, sizeof path, "%s/kernel.tsv", out_dir);
    FILE *tsv = fopen(path, "w");
    if (tsv == NULL) {
        fprintf(stderr, "bench-kernel: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(tsv, "id\tdtype\tbatch\theads\tlen\thead_dim\tcausal\tattention\ttarget\treps\tc_ms\t"
                 "gflop\tcheck_rows\tthreads\tcompute\n");
    printf("attention_run; kernel path %s; BLAS: %s, core %s, %d thread%s per product; "
           "%d compute thread%s as the server starts them\n", attention_kernel_path(),
           blas_config, blas_core, blas_threads, blas_threads == 1 ? "" : "s", threads,
           threads == 1 ? "" : "s");
    int l2_reported;
    size_t l2 = attention_kernel_l2_bytes(&l2_reported);
    printf("fused kernel: L2 %zu KiB (%s), so %zu query rows per sub-block at head dim 64 in "
           "float32, %zu in float64\n", l2 / 1024, l2_reported ? "as the CPU reports" : "assumed",
           attention_kernel_block_rows(64, sizeof(float)),
           attention_kernel_block_rows(64, sizeof(double)));
    printf("%-18s %5s %10s %9s %7s\n", "case", "runs", "median ms", "GFLOP/s", "% peak");

    int failures = 0;
    for (size_t ci = 0; ci < case_count; ci++) {
        const bench_case *c = &cases[ci];
        size_t d = c->heads * c->head_dim;
        size_t keys = c->keys ? c->keys : c->len;
        size_t n_in = c->batch * c->len * d, n_keys = c->batch * keys * d;
        rng_state = 0x9E3779B97F4A7C15ull + c->batch * 131 + c->len;
        double *q = rnd_array(n_in), *k = rnd_array(n_keys), *v = rnd_array(n_keys);
        run_ctx run;
        memset(&run, 0, sizeof run);
        run.job = (attn_job){.batch = c->batch, .lq = c->len, .lk = keys, .heads = c->heads,
                             .dk = d, .dv = d, .q = q, .k = k, .v = v, .causal = c->causal,
                             .scale = 1.0 / sqrt((double)c->head_dim), .dtype = c->dtype,
                             .want_attention = c->want_attention, .bf16 = c->bf16};
        /* float32 in and out, as the v2 path runs a request of binary FP32 tensors */
        float *q32 = NULL, *k32 = NULL, *v32 = NULL;
        if (c->dtype == ATTN_FLOAT32) {
            q32 = to_floats(q, n_in);
            k32 = to_floats(k, n_keys);
            v32 = to_floats(v, n_keys);
            run.job.q = run.job.k = run.job.v = NULL;
            run.job.q32 = q32;
            run.job.k32 = k32;
            run.job.v32 = v32;
            run.job.output_f32 = 1;
        }
        int reps = 0;
        double ms = time_median_ms(&run, &policy, &reps);
        /* 4 n^2 d per head: two products of 2 n^2 d each; causal counts the same. */
        double gflop = 4.0 * (double)(c->batch * c->heads) * (double)c->len * (double)keys *
                       (double)c->head_dim * 1e-9;
        size_t check_rows = c->want_attention ? (c->len < ATTN_CHECK_ROWS ? c->len
                                                                          : ATTN_CHECK_ROWS) : 0;
        if (ms < 0 || write_check(out_dir, c, &run.job, &run.result, check_rows) != 0) {
            failures++;
        } else {
            /* A causal row counts the whole n^2, so its share would be overstated: none. */
            double ceiling = c->bf16 ? peak.bf16 : c->dtype == ATTN_FLOAT32 ? peak.f32 : peak.f64;
            char share[16] = "-";
            if (ceiling > 0 && !c->causal)
                snprintf(share, sizeof share, "%.0f%%", 100 * gflop / ms * 1e3 / ceiling);
            printf("%-18s %5d %10.3f %9.1f %7s\n", c->id, reps, ms, gflop / ms * 1e3, share);
            fflush(stdout);
            fprintf(tsv, "%s\t%s\t%zu\t%zu\t%zu\t%zu\t%d\t%d\t%g\t%d\t%.6f\t%.6f\t%zu\t%d\t%s\n",
                    c->id, c->dtype == ATTN_FLOAT64 ? "float64" : "float32", c->batch, c->heads,
                    c->len, c->head_dim, c->causal, c->want_attention, c->target, reps, ms,
                    gflop, check_rows, threads, attention_precision_name(&run.job));
        }
        attention_result_free(&run.result);
        free(q);
        free(k);
        free(v);
        free(q32);
        free(k32);
        free(v32);
    }
    if (fclose(tsv) != 0) {
        fprintf(stderr, "bench-kernel: writing %s failed\n", path);
        failures++;
    }
    free(cold_buffer);
    if (failures != 0)
        fprintf(stderr, "bench-kernel: %d failure(s)\n", failures);
    return failures != 0;
}

/*
 * bench_gemm.c - the machine's ceilings for the kernel rows: the FMA peak of
 * each instruction set and precision (fma_peak.h) on the compute threads, and
 * OpenBLAS sgemm and dgemm of 4096 x 4096 x 4096 on every core, in GFLOP/s
 * (2 n^3 per product), labelled with the OpenBLAS core that ran them.
 *
 * The ONNX Runtime rows (bench_ort.sh) print each kernel's GFLOP/s as a share of
 * the widest FMA peak, measured in the same run, so that "how far from what the
 * FMA units can do" needs no number from another day; the gemm rows stay as
 * what a tuned BLAS reaches.  The kernels are the widest
 * OpenBLAS has for this CPU: blas_setup_select (server/kernel/blas_setup.c) is called
 * first, as the server calls it, and OPENBLAS_CORETYPE still overrides it.
 * This is a benchmark of the BLAS itself, hence cblas.h here and not through
 * the attention module.
 *
 * Output: "peak <isa> <threads> <float32 GFLOP/s> <float64 GFLOP/s> <bfloat16
 * GFLOP/s>" per instruction set, widest first (none on a CPU without FMA; the
 * bfloat16 figure 0 where the CPU lacks AVX512_BF16); then, unless
 * --peak-only, a line "core <name> threads <n>" and one line per precision,
 * "dgemm <GFLOP/s> <median ms> <runs>" (then sgemm).  The peak runs on the
 * compute threads the server would start (one per available CPU) or
 * BENCH_COMPUTE_THREADS, the gemm on every online core.  --quick: one timed
 * run of each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_util.h"
#include "core/compute.h"
#include "fma_peak.h"
#include "kernel/blas_setup.h"

#define GEMM_N 4096
#define MAX_REPS 20

static void gemm(int dbl, const void *a, const void *b, void *c)
{
    if (dbl)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GEMM_N, GEMM_N, GEMM_N, 1.0, a,
                    GEMM_N, b, GEMM_N, 0.0, c, GEMM_N);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GEMM_N, GEMM_N, GEMM_N, 1.0f, a,
                    GEMM_N, b, GEMM_N, 0.0f, c, GEMM_N);
}

/* Median milliseconds of one product after one warm-up: at least min_reps
 * timed runs, more while the timed runs took less than budget_s in all. */
static double time_gemm_ms(int dbl, const void *a, const void *b, void *c, int min_reps,
                           double budget_s, int *reps)
{
    double times[MAX_REPS], spent = 0;
    int n = 0;
    gemm(dbl, a, b, c);
    while (n < MAX_REPS && (n < min_reps || spent < budget_s)) {
        double t0 = now_s();
        gemm(dbl, a, b, c);
        times[n] = (now_s() - t0) * 1e3;
        spent += times[n++] * 1e-3;
    }
    qsort(times, (size_t)n, sizeof times[0], compare_doubles);
    *reps = n;
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    blas_setup_select(argv, 0); /* the sgemm rows run OpenBLAS on all cores */
    int quick = 0, peak_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--peak-only") == 0) {
            peak_only = 1;
        } else {
            fprintf(stderr, "usage: bench-gemm [--quick] [--peak-only]\n");
            return 2;
        }
    }
    const char *forced = getenv("BENCH_COMPUTE_THREADS");
    int threads = forced != NULL && atoi(forced) > 0 ? atoi(forced)
                                                      : (int)compute_available_cpus();
    fma_peak peaks[4];
    int npeaks = fma_peak_measure(threads, quick, peaks, 4);
    if (npeaks < 0) {
        fprintf(stderr, "bench-gemm: the FMA peak's threads did not start\n");
        return 1;
    }
    for (int i = 0; i < npeaks; i++)
        printf("peak %s %d %.1f %.1f %.1f\n", peaks[i].isa, threads, peaks[i].f32, peaks[i].f64,
               peaks[i].bf16);
    fflush(stdout);
    if (peak_only)
        return 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    openblas_set_num_threads(cores > 0 ? (int)cores : 1);
    size_t count = (size_t)GEMM_N * GEMM_N;
    double *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b),
           *c = malloc(count * sizeof *c);
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "bench-gemm: out of memory\n");
        return 1;
    }
    uint64_t state = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < count; i++) {
        a[i] = bench_uniform(&state) - 0.5;
        b[i] = bench_uniform(&state) - 0.5;
    }
    printf("core %s threads %d\n", openblas_get_corename(), openblas_get_num_threads());
    double flop = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N;
    /* dgemm first: the float32 copies then overwrite the doubles in place. */
    for (int dbl = 1; dbl >= 0; dbl--) {
        if (!dbl) {
            float *af = (float *)a, *bf = (float *)b;
            for (size_t i = 0; i < count; i++) { /* ascending: reads stay ahead of writes */
                af[i] = (float)a[i];
                bf[i] = (float)b[i];
            }
        }
        int reps = 0;
        double ms = time_gemm_ms(dbl, a, b, c, quick ? 1 : 3, quick ? 0 : 3.0, &reps);
        printf("%s %.1f %.3f %d\n", dbl ? "dgemm" : "sgemm", flop / ms * 1e-6, ms, reps);
        fflush(stdout);
    }
    free(a);
    free(b);
    free(c);
    return 0;
}

/*
 * fma_peak.c - the register-only FMA loops and their timing on every thread
 * (fma_peak.h).  Each loop is compiled for its own instruction set through
 * the target attribute, so this file builds with the benchmarks' ordinary
 * flags and runs a loop only where cpuid says the CPU has it.
 */
#include "fma_peak.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

/* Independent accumulators per loop: two FMA pipes of latency L keep 2 L
 * in flight, and L is 4 on Zen 4/5 and Intel's cores since Skylake; 12 leave
 * room for a slower pipe and still fit 16 registers with the two operands. */
#define PEAK_ACC 12

/* The timed runs: at least this many (the median is taken). */
#define PEAK_REPS 5

/* acc = acc * a + b on PEAK_ACC vectors, iters times; returns the sum of
 * the lanes so that the compiler cannot drop the work.  a slightly below 1
 * and b small keep every value normal (no overflow, no subnormal slowdown). */
#define PEAK_LOOP(NAME, TARGET, VT, SET1, OPERAND, FMA, REAL)                                     \
    __attribute__((target(TARGET), noinline)) static double NAME(long iters)                      \
    {                                                                                             \
        VT acc[PEAK_ACC], a = OPERAND((REAL)0.9999), b = OPERAND((REAL)1e-3);                     \
        for (int i = 0; i < PEAK_ACC; i++)                                                        \
            acc[i] = SET1((REAL)i);                                                               \
        for (long it = 0; it < iters; it++) {                                                     \
            _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_ACC; i++)                           \
                acc[i] = FMA(acc[i], a, b);                                                       \
        }                                                                                         \
        REAL lanes[sizeof(VT) / sizeof(REAL)];                                                    \
        double sum = 0;                                                                           \
        for (int i = 0; i < PEAK_ACC; i++) {                                                      \
            __builtin_memcpy(lanes, &acc[i], sizeof lanes);                                       \
            for (unsigned j = 0; j < sizeof lanes / sizeof lanes[0]; j++)                         \
                sum += lanes[j];                                                                  \
        }                                                                                         \
        return sum;                                                                               \
    }

PEAK_LOOP(loop_avx512_f32, "avx512f", __m512, _mm512_set1_ps, _mm512_set1_ps, _mm512_fmadd_ps,
          float)
PEAK_LOOP(loop_avx512_f64, "avx512f", __m512d, _mm512_set1_pd, _mm512_set1_pd, _mm512_fmadd_pd,
          double)
PEAK_LOOP(loop_avx2_f32, "avx2,fma", __m256, _mm256_set1_ps, _mm256_set1_ps, _mm256_fmadd_ps, float)
PEAK_LOOP(loop_avx2_f64, "avx2,fma", __m256d, _mm256_set1_pd, _mm256_set1_pd, _mm256_fmadd_pd,
          double)

/* The bfloat16 loop: acc += a0 b0 + a1 b1 per float lane (vdpbf16ps), a and b 32 bfloat16
 * numbers each, so 64 FLOPs an instruction (2 per bfloat16 pair, counted as 32 lanes).  acc
 * grows by 2e-3 a step, so it stays finite and normal. */
#define BF16_PAIRS(x) ((__m512)_mm512_cvtne2ps_pbh(_mm512_set1_ps(x), _mm512_set1_ps(x)))
#define BF16_DOT(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
PEAK_LOOP(loop_avx512_bf16, "avx512f,avx512bf16", __m512, _mm512_set1_ps, BF16_PAIRS, BF16_DOT,
          float)

typedef struct peak_loop {
    const char *isa;
    int supported;
    double (*loop[3])(long iters);  /* float32, float64, bfloat16 (NULL: none) */
    int lanes[3];
} peak_loop;

typedef struct peak_run {
    pthread_barrier_t *start;
    double (*loop)(long iters);
    long iters;
    double t0, t1, sink;
} peak_run;

static void *peak_thread(void *arg)
{
    peak_run *r = arg;
    pthread_barrier_wait(r->start);
    r->t0 = now_s();
    r->sink = r->loop(r->iters);
    r->t1 = now_s();
    return NULL;
}

/* One run of loop on every thread; GFLOP/s, or -1 when a thread did not start. */
static double run_once(double (*loop)(long), long iters, int lanes, int threads, peak_run *runs,
                       pthread_t *ids)
{
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, (unsigned)threads) != 0)
        return -1;
    int started = 0;
    for (int t = 0; t < threads; t++)
        runs[t] = (peak_run){.start = &start, .loop = loop, .iters = iters};
    /* thread 0 is this one, so that the barrier needs no thread beyond `threads` */
    for (int t = 1; t < threads; t++, started++)
        if (pthread_create(&ids[t], NULL, peak_thread, &runs[t]) != 0)
            break;
    if (started != threads - 1) {
        /* the barrier would never open for the threads started: nothing to return to */
        fprintf(stderr, "fma_peak: cannot start %d threads\n", threads);
        exit(1);
    }
    peak_thread(&runs[0]);
    double first = runs[0].t0, last = runs[0].t1;
    for (int t = 1; t < threads; t++) {
        pthread_join(ids[t], NULL);
        first = runs[t].t0 < first ? runs[t].t0 : first;
        last = runs[t].t1 > last ? runs[t].t1 : last;
    }
    pthread_barrier_destroy(&start);
    double flop = 2.0 * PEAK_ACC * (double)lanes * (double)iters * threads;
    return flop / (last - first) * 1e-9;
}

int fma_peak_measure(int threads, int quick, fma_peak *out, int max)
{
    __builtin_cpu_init();
    peak_loop loops[] = {
        {"avx512", __builtin_cpu_supports("avx512f"),
         {loop_avx512_f32, loop_avx512_f64,
          __builtin_cpu_supports("avx512bf16") ? loop_avx512_bf16 : NULL}, {16, 8, 32}},
        {"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
         {loop_avx2_f32, loop_avx2_f64, NULL}, {8, 4, 0}},
    };
    if (threads < 1)
        threads = 1;
    peak_run *runs = calloc((size_t)threads, sizeof *runs);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    if (runs == NULL || ids == NULL) {
        free(runs);
        free(ids);
        return -1;
    }
    int n = 0;
    for (size_t l = 0; l < sizeof loops / sizeof loops[0] && n < max; l++) {
        if (!loops[l].supported)
            continue;
        double gflops[3] = {0, 0, 0};
        for (int p = 0; p < 3 && loops[l].loop[p] != NULL; p++) {
            /* Iterations for about 50 ms a run (5 ms with quick), from a first short run. */
            double t0 = now_s();
            loops[l].loop[p](1L << 16);
            double per_iter = (now_s() - t0) / (double)(1L << 16);
            long iters = (long)((quick ? 0.005 : 0.05) / (per_iter > 0 ? per_iter : 1e-9));
            iters = iters < (1L << 16) ? (1L << 16) : iters;
            double rates[PEAK_REPS];
            int reps = quick ? 3 : PEAK_REPS;
            for (int r = 0; r < reps; r++) {
                rates[r] = run_once(loops[l].loop[p], iters, loops[l].lanes[p], threads, runs, ids);
                if (rates[r] < 0) {
                    free(runs);
                    free(ids);
                    return -1;
                }
            }
            qsort(rates, (size_t)reps, sizeof rates[0], compare_doubles);
            gflops[p] = reps % 2 ? rates[reps / 2] : (rates[reps / 2 - 1] + rates[reps / 2]) / 2;
        }
        out[n++] = (fma_peak){.isa = loops[l].isa, .f32 = gflops[0], .f64 = gflops[1],
                              .bf16 = gflops[2]};
    }
    free(runs);
    free(ids);
    return n;
}

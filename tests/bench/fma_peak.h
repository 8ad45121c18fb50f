/*
 * fma_peak.h - the machine's FMA peak, measured: the ceiling the kernel rows of
 * the benchmarks are printed against (bench_gemm.c prints it for bench_ort.sh;
 * bench_kernel.c prints its own rows as a share of it).
 *
 * For each instruction set with FMA that the CPU runs (avx512: 512-bit
 * vectors; avx2: 256-bit), and each precision, every thread runs the same
 * loop of fused multiply-adds on registers only (no load, no store): enough
 * independent accumulators that two FMA pipes of up to 6 cycles' latency
 * never wait.  The peak is all the threads' FLOPs (2 per lane per FMA) over
 * the time from their common start to the last one's end, the median of
 * repeated runs.  No memory is touched, so this is the arithmetic limit of
 * the cores as the scheduler gives them to us, at the clock the vector width
 * runs at.  Where the CPU has AVX512_BF16, the avx512 entry also measures the
 * bfloat16 peak: the same loop of vdpbf16ps (a pair of bfloat16 products summed
 * into each float lane), the ceiling of compute_precision bfloat16.
 */
#ifndef BENCH_FMA_PEAK_H
#define BENCH_FMA_PEAK_H

/* One instruction set's peak on a number of threads, in GFLOP/s. */
typedef struct fma_peak {
    const char *isa;         /* "avx512" or "avx2" */
    double f32, f64;         /* GFLOP/s, every thread together */
    double bf16;             /* vdpbf16ps (avx512 with AVX512_BF16), 2 FLOPs per bfloat16
                              * pair; 0 where the CPU lacks it */
} fma_peak;

/* Measures the instruction sets this CPU runs, widest first, into out (at
 * most max of them) on `threads` threads; quick: three short runs each (a
 * smoke test).  Returns how many were measured (0 on a CPU without FMA), or
 * -1 when the threads could not be started. */
int fma_peak_measure(int threads, int quick, fma_peak *out, int max);

#endif

/*
 * kernel_avx512_on_avx2.c - the avx512 path of the fused kernel at its own
 * widths (16 floats or 8 doubles a vector, the tiles of
 * server/kernel/attention_fused_avx512.c, which this includes) compiled for
 * AVX2 + FMA, so that the unit tests run that path's source, every loop and
 * tail that depends on the width, on a CPU without AVX-512.  GCC splits
 * each 64-byte vector into two of AVX2's; what this checks is the source at
 * those widths, not AVX-512's code generation.  main.c adds it to the paths
 * (attn_kernel_add_for_testing) as "avx512-on-avx2"; the server has no
 * such path.  Built with the fused kernel's flags (Makefile).
 */
#define PATH avx512_on_avx2
#define PATH_NAME "avx512-on-avx2"
#define PATH_TARGET "avx2,fma"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#include "kernel/attention_fused_avx512.c"

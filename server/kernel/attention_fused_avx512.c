/*
 * attention_fused_avx512.c - the fused attention kernel for AVX-512F, 16 floats or 8 doubles a
 * vector; 32 registers hold a 6 x 4 tile: score tiles (a panel of 4 vectors of keys) and output
 * chunks are 6 x 4 in both precisions.
 * Compiled with its own flags (Makefile: EXTRA_attention_fused_avx512).
 */
#define VBYTES 64
#define SV_D 4
#define SV_F 4
#define OV 4
/* The unit tests' avx512-on-avx2 (tests/unit/kernel_avx512_on_avx2.c) includes this file with a
 * name and instruction sets of its own, so that it runs these widths and no copy of them. */
#ifndef PATH
#define PATH avx512
#define PATH_NAME "avx512"
#define PATH_TARGET "avx512f,fma"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f"))
#endif
#include "attention_fused_path.inc"

/*
 * attention_fused_avx512.c - the fused attention kernel for AVX-512F, 16 floats or 8 doubles a
 * vector; 32 registers hold a 6 x 4 tile.
 * Compiled with its own flags (Makefile: EXTRA_attention_fused_avx512).
 */
#define VBYTES 64
#define PATH avx512
#define PATH_NAME "avx512"
#define SV 2
#define OV 4
#define PATH_TARGET "avx512f,fma"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f"))
#include "attention_fused_path.inc"

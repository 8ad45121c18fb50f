/*
 * attention_fused_avx512.c - the fused attention kernel for AVX-512F, 16 floats or 8 doubles a
 * vector; 32 registers hold a 6 x 4 tile.  Score tiles are 6 x 4 in double and 6 x 2 in
 * float, where 6 x 4 (a panel of 64 keys) made batches of short heads slower.
 * Compiled with its own flags (Makefile: EXTRA_attention_fused_avx512).
 */
#define VBYTES 64
#define PATH avx512
#define PATH_NAME "avx512"
#define SV_D 4
#define SV_F 2
#define OV 4
#define PATH_TARGET "avx512f,fma"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f"))
#include "attention_fused_path.inc"

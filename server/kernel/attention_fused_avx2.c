/*
 * attention_fused_avx2.c - the fused attention kernel for AVX2 and FMA, 8 floats or 4 doubles a
 * vector; 16 registers hold a 6 x 2 tile.
 * Compiled with its own flags (Makefile: EXTRA_attention_fused_avx2).
 */
#define VBYTES 32
#define PATH avx2
#define PATH_NAME "avx2"
#define SV_D 2
#define SV_F 2
#define OV 2
#define PATH_TARGET "avx2,fma"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#include "attention_fused_path.inc"

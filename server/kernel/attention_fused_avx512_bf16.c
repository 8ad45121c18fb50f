/*
 * attention_fused_avx512_bf16.c - the avx512 path (attention_fused_avx512.c, at its widths)
 * built with AVX512_BF16 too, so that a request's bfloat16 products take vdpbf16ps
 * (attention_fused_bf16.inc): two products of a pair of bfloat16 numbers per float lane
 * and instruction, where the avx512 path widens them to float.  Its float and double
 * kernels are the avx512 path's.  Compiled with its own flags (Makefile:
 * EXTRA_attention_fused_avx512_bf16).
 */
#define PATH avx512_bf16
#define PATH_NAME "avx512_bf16"
#define PATH_BF16_VARIANT 1
#define PATH_TARGET "avx512f,fma,avx512bf16"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
#include "attention_fused_avx512.c"

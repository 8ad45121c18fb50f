/*
 * attention_fused_amx.c - the avx512_bf16 path (attention_fused_avx512_bf16.c) whose
 * bfloat16 products run on AMX-BF16 tiles where the head dims are a multiple of 32
 * (attention_fused_bf16.inc, ATTN_FUSED_AMX).  Run only where the CPU has the tiles and
 * Linux has granted this process their state (attn_fused_amx_usable); elsewhere the
 * auto choice falls back to the next path, and forcing it stops start-up.  Compiled with
 * its own flags (Makefile: EXTRA_attention_fused_amx).
 */
#define ATTN_FUSED_AMX 1
#define PATH_BF16_VARIANT 1
/* The unit tests' amx_bf16-model (tests/unit/kernel_amx_model.c) includes this file with a
 * name, instruction sets and tiles of its own: a software model of them. */
#ifndef PATH
#define PATH amx_bf16
#define PATH_NAME "amx_bf16"
#define PATH_TARGET "avx512f,fma,avx512bf16,amx-tile,amx-bf16"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f") && \
                        __builtin_cpu_supports("avx512bf16") && attn_fused_amx_usable())
#endif
#include "attention_fused_avx512.c"

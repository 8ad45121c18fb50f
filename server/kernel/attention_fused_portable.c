/*
 * attention_fused_portable.c - the fused attention kernel for baseline x86-64 (SSE2), 4 floats
 * or 2 doubles a vector, no FMA; the path every x86-64 runs.
 * Compiled with its own flags (Makefile: EXTRA_attention_fused_portable).
 */
#define VBYTES 16
#define PATH portable
#define PATH_NAME "portable"
#define SV_D 2
#define SV_F 2
#define OV 2
#define PATH_SUPPORTED (1)
#include "attention_fused_path.inc"

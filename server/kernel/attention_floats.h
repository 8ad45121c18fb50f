/*
 * attention_floats.h - float copies of double arrays, for the float32 jobs: attention.c
 * rounds the inputs and weights a job gives in double, the pooled weights and the
 * reductions round q and k.  A leaf of the kernel: it calls nothing else in kernel/, so
 * every file of the folder may call it without a circle.
 */
#ifndef ATTN_ATTENTION_FLOATS_H
#define ATTN_ATTENTION_FLOATS_H

#include <stddef.h>

/* A float copy of a[0..n), each number rounded to nearest; freed with mem_free.  NULL for
 * a NULL a or n == 0 (*fail untouched), or NULL with *fail set to 1 when memory ran out. */
float *attention_floats_from(const double *a, size_t n, int *fail);

/* One block of float copies: a[0..na) and then b[0..nb), rounded to nearest; freed with
 * mem_free.  NULL when memory ran out. */
float *attention_floats_pair(const double *a, size_t na, const double *b, size_t nb);

/* Rounds a[0..n) to the nearest bfloat16 numbers, ties to even (half_bf16_from_float), in
 * place, as floats: the inputs of a job that computes in bfloat16 (attn_job.bf16). */
void attention_floats_round_bf16(float *a, size_t n);

#endif

/*
 * attention_exp.h - the kernel module's own (a "private:" row of
 * server/LAYERS): the vectorised passes
 * of the softmax over one row of scores (row maximum, exponentials and
 * their sum), with and without a mask.
 *
 * attention_exp.c is compiled with -ffast-math so that GCC vectorises the
 * reductions and calls glibc's vector exp (libmvec, within 4 ulp);
 * target_clones picks AVX-512 or AVX2 at run time where the CPU has it.
 * Only finite scores may be passed to the exp functions: the callers check
 * that the row maximum is finite first.  A mask has one byte per score,
 * nonzero where the score counts.
 */
#ifndef ATTN_ATTENTION_EXP_H
#define ATTN_ATTENTION_EXP_H

#include <stddef.h>

/* The largest of x[0..n), n >= 1. */
double attention_max_d(const double *x, size_t n);
float attention_max_f(const float *x, size_t n);

/* The largest x[i] with m[i] != 0, and *any = whether there is one (the
 * value returned is meaningless when there is not). */
double attention_max_masked_d(const double *x, const unsigned char *m, size_t n, int *any);
float attention_max_masked_f(const float *x, const unsigned char *m, size_t n, int *any);

/* x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. */
double attention_exp_shift_d(double *x, size_t n, double shift);
float attention_exp_shift_f(float *x, size_t n, float shift);

/* x[i] = m[i] ? exp(x[i] - shift) : 0 for i < n; returns the sum.  Masked
 * entries may hold any value, even one whose exponential would overflow. */
double attention_exp_shift_masked_d(double *x, const unsigned char *m, size_t n, double shift);
float attention_exp_shift_masked_f(float *x, const unsigned char *m, size_t n, float shift);

#endif

/*
 * attention_exp.h - private to the attention module: exponentials of a row
 * of scores, vectorised.
 *
 * attention_exp.c is compiled with -ffast-math so that GCC may call glibc's
 * vector exp (libmvec, within 4 ulp); target_clones picks AVX2 at run time
 * where the CPU has it.  Only finite inputs may be passed: the callers check
 * that the row maximum is finite first.
 */
#ifndef ATTN_ATTENTION_EXP_H
#define ATTN_ATTENTION_EXP_H

#include <stddef.h>

/* x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. */
double attention_exp_shift_d(double *x, size_t n, double shift);
float attention_exp_shift_f(float *x, size_t n, float shift);

#endif

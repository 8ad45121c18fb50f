/*
 * attention_exp.c - vectorised exp for the softmax (see attention_exp.h).
 *
 * Nothing else belongs in this file: -ffast-math applies to all of it.
 */
#include "attention_exp.h"

#include <math.h>

/* GCC builds an AVX2 copy and picks it at run time; other compilers (clang,
 * for the fuzzer) get the portable one. */
#if defined(__GNUC__) && !defined(__clang__)
#define EXP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define EXP_CLONES
#endif

EXP_CLONES
double attention_exp_shift_d(double *x, size_t n, double shift)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = exp(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

EXP_CLONES
float attention_exp_shift_f(float *x, size_t n, float shift)
{
    float sum = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

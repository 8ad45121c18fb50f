/*
 * attention_exp.c - the vectorised softmax passes (see attention_exp.h).
 *
 * Nothing else belongs in this file: -ffast-math applies to all of it.  The
 * functions are written once as a macro and instantiated for double and
 * float.
 */
#include "attention_exp.h"

#include <float.h>
#include <math.h>

/* GCC builds AVX-512 and AVX2 copies and picks one at run time; other
 * compilers (clang, for the fuzzer) get the portable one. */
#if defined(__GNUC__) && !defined(__clang__)
#define EXP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EXP_CLONES
#endif

#define SOFTMAX_PASSES(REAL, SFX, EXPF, LOWEST)                                                    \
    EXP_CLONES                                                                                     \
    REAL attention_max_##SFX(const REAL *x, size_t n)                                              \
    {                                                                                              \
        REAL mx = x[0];                                                                            \
        for (size_t i = 1; i < n; i++)                                                             \
            mx = x[i] > mx ? x[i] : mx;                                                            \
        return mx;                                                                                 \
    }                                                                                              \
                                                                                                   \
    EXP_CLONES                                                                                     \
    REAL attention_max_masked_##SFX(const REAL *x, const unsigned char *m, size_t n, int *any)     \
    {                                                                                              \
        REAL mx = LOWEST;                                                                          \
        unsigned char seen = 0;                                                                    \
        for (size_t i = 0; i < n; i++) {                                                           \
            REAL v = m[i] ? x[i] : LOWEST;                                                         \
            mx = v > mx ? v : mx;                                                                  \
            seen |= m[i];                                                                          \
        }                                                                                          \
        *any = seen != 0;                                                                          \
        return mx;                                                                                 \
    }                                                                                              \
                                                                                                   \
    EXP_CLONES                                                                                     \
    REAL attention_exp_shift_##SFX(REAL *x, size_t n, REAL shift)                                  \
    {                                                                                              \
        REAL sum = 0;                                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            x[i] = EXPF(x[i] - shift);                                                             \
            sum += x[i];                                                                           \
        }                                                                                          \
        return sum;                                                                                \
    }                                                                                              \
                                                                                                   \
    EXP_CLONES                                                                                     \
    REAL attention_exp_shift_masked_##SFX(REAL *x, const unsigned char *m, size_t n, REAL shift)   \
    {                                                                                              \
        REAL sum = 0;                                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            /* Masked scores are replaced before exp, so they cannot overflow. */                  \
            REAL e = EXPF((m[i] ? x[i] : shift) - shift);                                          \
            x[i] = m[i] ? e : 0;                                                                   \
            sum += x[i];                                                                           \
        }                                                                                          \
        return sum;                                                                                \
    }

SOFTMAX_PASSES(double, d, exp, -DBL_MAX)
SOFTMAX_PASSES(float, f, expf, -FLT_MAX)

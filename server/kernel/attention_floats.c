/*
 * attention_floats.c - float copies of double arrays, and floats rounded to bfloat16
 * (attention_floats.h).
 *
 * Built with the full vectoriser cost model (the Makefile's EXTRA_attention_floats, as
 * attention.c, where these loops were): -O2's cheapest one leaves a loop whose trip count
 * is not known in advance scalar.  Each number is rounded on its own, so the copies are
 * the same whatever the vector width.
 */
#include "attention_floats.h"

#include "core/half.h"
#include "core/mem.h"

float *attention_floats_from(const double *a, size_t n, int *fail)
{
    if (a == NULL || n == 0)
        return NULL;
    float *f = mem_malloc(n * sizeof(float));
    if (f == NULL) {
        *fail = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        f[i] = (float)a[i];
    return f;
}

float *attention_floats_pair(const double *a, size_t na, const double *b, size_t nb)
{
    float *f = mem_malloc((na + nb) * sizeof(float));
    if (f == NULL)
        return NULL;
    for (size_t i = 0; i < na; i++)
        f[i] = (float)a[i];
    for (size_t i = 0; i < nb; i++)
        f[na + i] = (float)b[i];
    return f;
}

void attention_floats_round_bf16(float *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)half_bf16_from_float(a[i]) << 16;
        memcpy(&a[i], &u, sizeof u);
    }
}

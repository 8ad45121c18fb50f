/*
 * half.h - the two 16-bit floating-point formats of the wire: IEEE binary16
 * (FP16: 1 sign, 5 exponent, 10 fraction bits) and bfloat16 (BF16: the top
 * 16 bits of a float32, 8 exponent and 7 fraction bits), widened to float
 * and rounded from double.
 *
 * Every FP16 and BF16 number is a float32 number, so widening is exact
 * (subnormals and -0 included; NaN stays NaN, Inf stays Inf).  Narrowing
 * rounds a double straight to the nearest 16-bit number, ties to the even
 * one, as IEEE 754 and NumPy do; rounding from double and never through float
 * keeps a double from being rounded twice.  A finite number past the
 * largest finite one by half a unit or more becomes Inf: callers that must
 * not send Inf test the result with half_is_inf.  The numbers are held as
 * their bit patterns (uint16_t), which is what the wire carries.
 */
#ifndef ATTN_HALF_H
#define ATTN_HALF_H

#include <stdint.h>
#include <string.h>

/* The float of an FP16 / BF16 bit pattern: exact. */
float half_fp16_to_float(uint16_t h);
float half_bf16_to_float(uint16_t b);

/* d rounded to the nearest FP16 / BF16 number, ties to even; Inf when d is
 * infinite or rounds past the largest finite number, a quiet NaN of d's sign
 * when d is NaN. */
uint16_t half_fp16_from_double(double d);
uint16_t half_bf16_from_double(double d);

/* f rounded to the nearest FP16 / BF16 number, ties to even, as the _double
 * forms round (double)f, which is f exactly: the same result, without a branch,
 * inline for the loops over a float32 job's outputs (a call per number was most
 * of an FP16 answer's time).
 *
 * FP16 the well-known way (F. Giesen's float_to_half_fast3_rtne, its branches
 * made selects): a normal result adds the exponent's change of bias, half a unit
 * less one and the unit's parity (ties to even) and drops 13 fraction bits, the
 * carry rounding up, past 65504 into Inf; a subnormal result lets the FPU round,
 * by adding 0.5f, whose unit in the last place is FP16's least subnormal; 2^16
 * and beyond is Inf, NaN stays NaN.  BF16 is the float's top half, rounded the
 * same way. */
static inline uint16_t half_fp16_from_float(float f)
{
    uint32_t u, sub;
    float half = 0.5f, g;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    memcpy(&g, &u, sizeof g);
    g += half;
    memcpy(&sub, &g, sizeof sub);
    uint32_t normal = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;  /* (15 - 127) << 23 */
    uint32_t r = u < (113u << 23) ? sub - 0x3f000000u : normal;     /* below 2^-14 */
    r = u >= (143u << 23) ? (u > 0x7f800000u ? 0x7e00u : 0x7c00u) : r; /* 2^16 up */
    return (uint16_t)(sign | r);
}

static inline uint16_t half_bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

/* 1 when the pattern is Inf or NaN (every exponent bit set). */
static inline int half_fp16_is_nonfinite(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u;
}

static inline int half_bf16_is_nonfinite(uint16_t b)
{
    return (b & 0x7f80u) == 0x7f80u;
}

#endif

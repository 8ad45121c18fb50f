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

/* The float of an FP16 / BF16 bit pattern: exact. */
float half_fp16_to_float(uint16_t h);
float half_bf16_to_float(uint16_t b);

/* d rounded to the nearest FP16 / BF16 number, ties to even; Inf when d is
 * infinite or rounds past the largest finite number, a quiet NaN of d's sign
 * when d is NaN. */
uint16_t half_fp16_from_double(double d);
uint16_t half_bf16_from_double(double d);

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

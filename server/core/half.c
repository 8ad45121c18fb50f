/*
 * half.c - FP16 and BF16 to float and from double (see half.h).
 *
 * Both narrowings are one routine over the format's fraction width and
 * exponent bias: the double's significand (with its implicit bit) is shifted
 * right to the units of the target's last place, the part shifted out
 * decides the rounding, and a carry out of the fraction moves into the
 * exponent by plain addition, which also turns the largest finite number
 * plus a unit into Inf and the largest subnormal plus a unit into the
 * smallest normal.
 */
#include "half.h"

#include <string.h>

/* A 16-bit format: fraction bits, exponent bias, the pattern of a quiet NaN. */
typedef struct half_format {
    int fraction_bits;
    int bias;
    uint16_t quiet_nan;
} half_format;

static const half_format fp16_format = {10, 15, 0x7e00u};
static const half_format bf16_format = {7, 127, 0x7fc0u};

/* d rounded to format f, ties to even (see the file's comment). */
static uint16_t narrow(double d, const half_format *f)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    uint16_t sign = (uint16_t)(u >> 48) & 0x8000u;
    int field = (int)(u >> 52) & 0x7ff;
    uint64_t fraction = u & ((1ull << 52) - 1);
    uint16_t inf = (uint16_t)(((1u << (15 - f->fraction_bits)) - 1) << f->fraction_bits);
    if (field == 0x7ff)
        return sign | (fraction ? f->quiet_nan : inf);
    if (field == 0) /* zero or a double subnormal: far below half the least subnormal */
        return sign;
    int e = field - 1023;            /* d = 1.fraction * 2^e */
    if (e > f->bias)                 /* at least 2^(bias+1): past every finite number */
        return sign | inf;
    uint64_t m = fraction | 1ull << 52;
    int min_e = 1 - f->bias;         /* the exponent of the least normal number */
    /* Units of the last place: 2^(e - fraction_bits) for a normal result,
     * 2^(min_e - fraction_bits) for a subnormal one. */
    int shift = 52 - f->fraction_bits + (e < min_e ? min_e - e : 0);
    uint32_t base = e < min_e ? 0 : (uint32_t)(e - min_e) << f->fraction_bits;
    if (shift > 62)                  /* below a quarter of the least subnormal */
        return sign;
    uint64_t q = m >> shift, rest = m & ((1ull << shift) - 1), halfway = 1ull << (shift - 1);
    q += rest > halfway || (rest == halfway && (q & 1));
    /* q holds the implicit bit of a normal result, which base's exponent
     * (one less than the field) absorbs. */
    uint32_t bits = base + (uint32_t)q;
    if (bits >= inf)
        bits = inf;
    return sign | (uint16_t)bits;
}

uint16_t half_fp16_from_double(double d)
{
    return narrow(d, &fp16_format);
}

uint16_t half_bf16_from_double(double d)
{
    return narrow(d, &bf16_format);
}

float half_fp16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t field = (h >> 10) & 0x1fu, fraction = h & 0x3ffu, bits;
    float f;
    if (field == 0) {
        /* a subnormal: fraction units of 2^-24, exact in float */
        f = (float)fraction * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (field == 31) {
        bits = sign | 0x7f800000u | fraction << 13;
    } else {
        bits = sign | (field + 127 - 15) << 23 | fraction << 13;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

float half_bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

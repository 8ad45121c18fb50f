/*
 * numfmt.h - the shortest decimal digits of a double or a float.
 *
 * For a finite number, numfmt finds the fewest significant decimal digits
 * that read back (with strtod, strtof or any correctly rounding reader) to
 * the very same value; where several decimals have that many digits, the
 * one nearest the value (exact ties: the even one).  It gives the digits and
 * a decimal exponent, nothing more: the sign, the decimal point and how an
 * exponent is spelled are the caller's choice (the JSON writer, jsonw.c,
 * lays them out as printf's %g would).  numfmt.c explains how the digits are
 * found without a printf search.
 *
 * Both functions are pure: no allocation, no state, safe from any thread.
 */
#ifndef ATTN_NUMFMT_H
#define ATTN_NUMFMT_H

/* The most digits an answer has (17 for a double, 9 for a float). */
#define NUMFMT_DIGITS_MAX 17

/* Finds the shortest digits of |v| (the sign is ignored: read it with
 * signbit).  Writes them to `digits` as a NUL-terminated string of 1 to
 * NUMFMT_DIGITS_MAX characters, without leading or trailing zeros, and sets
 * *exp10 so that |v| reads back from that string taken as an integer times
 * 10^*exp10.  Zero gives "0" and 0.  Returns the number of digits, or -1
 * when v is not finite (then nothing is written). */
int numfmt_double(double v, char digits[NUMFMT_DIGITS_MAX + 1], int *exp10);

/* The same for a float: the shortest digits that read back to the same
 * float. */
int numfmt_float(float v, char digits[NUMFMT_DIGITS_MAX + 1], int *exp10);

#endif

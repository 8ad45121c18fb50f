/*
 * scalar.h - one field of a request as a small tagged value, whatever wire
 * brought it: a boolean, an integer, a real, a string, or what the field
 * holds instead (null, an array, an object), or nothing at all.
 *
 * A rule that reads a field (a reduction's width, the number of heads, an
 * input's datatype) is written once against this value, so that a request
 * read from JSON (json/json_in.h's json_in_scalar) and one read from a
 * protobuf message are refused with the same words.  A number is a number
 * however the wire wrote it: the rules read integers and reals alike
 * (scalar_number), as JSON reads 2 and 2.0 alike.  Strings are borrowed.
 */
#ifndef ATTN_SCALAR_H
#define ATTN_SCALAR_H

#include <stddef.h>

typedef enum scalar_kind {
    SCALAR_ABSENT,              /* the field is not there */
    SCALAR_NULL,
    SCALAR_BOOL,
    SCALAR_INTEGER,
    SCALAR_REAL,
    SCALAR_STRING,
    SCALAR_ARRAY,               /* size: its entries (the entries are the wire's business) */
    SCALAR_OBJECT               /* size: its members */
} scalar_kind;

typedef struct scalar {
    scalar_kind kind;
    int boolean;
    long long integer;
    double real;
    const char *string;         /* borrowed, NUL-terminated */
    size_t size;                /* a string's bytes, an array's entries, an object's members */
} scalar;

/* Values made in one step; s is borrowed. */
static inline scalar scalar_bool(int b) { return (scalar){.kind = SCALAR_BOOL, .boolean = b != 0}; }
static inline scalar scalar_integer(long long i) { return (scalar){.kind = SCALAR_INTEGER, .integer = i}; }
static inline scalar scalar_real(double r) { return (scalar){.kind = SCALAR_REAL, .real = r}; }
scalar scalar_string(const char *s);

/* "an object", "an array", "a string", "a number", "a boolean", "null" (and
 * "nothing" for an absent field): what v is, for messages.  The words are
 * json_in_kind's, so that a rule says the same of a field from any wire. */
const char *scalar_kind_words(const scalar *v);

/* Whether v is a number (an integer or a real), and its value as a double (0
 * for anything else, as jansson's json_number_value). */
int scalar_is_number(const scalar *v);
double scalar_number(const scalar *v);

/* 1 when v is a number whose value is a whole number in [lo, hi], setting
 * *out to it; 0 otherwise (*out unchanged).  What json_in_whole is for JSON. */
int scalar_whole(const scalar *v, double lo, double hi, double *out);

#endif

/*
 * scalar.c - the tagged value of one request field (scalar.h): its words
 * and its number.
 */
#include "scalar.h"

#include <math.h>
#include <string.h>

scalar scalar_string(const char *s)
{
    return (scalar){.kind = SCALAR_STRING, .string = s, .size = strlen(s)};
}

const char *scalar_kind_words(const scalar *v)
{
    switch (v->kind) {
    case SCALAR_OBJECT: return "an object";
    case SCALAR_ARRAY: return "an array";
    case SCALAR_STRING: return "a string";
    case SCALAR_INTEGER:
    case SCALAR_REAL: return "a number";
    case SCALAR_BOOL: return "a boolean";
    case SCALAR_NULL: return "null";
    default: return "nothing";
    }
}

int scalar_is_number(const scalar *v)
{
    return v->kind == SCALAR_INTEGER || v->kind == SCALAR_REAL;
}

double scalar_number(const scalar *v)
{
    return v->kind == SCALAR_INTEGER ? (double)v->integer : v->kind == SCALAR_REAL ? v->real : 0;
}

int scalar_whole(const scalar *v, double lo, double hi, double *out)
{
    if (!scalar_is_number(v))
        return 0;
    double x = scalar_number(v);
    if (!(x >= lo && x <= hi) || x != floor(x))
        return 0;
    *out = x;
    return 1;
}

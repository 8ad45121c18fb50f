/*
 * json_fast.h - parsing a request body with jansson, its arrays of numbers
 * excepted.
 *
 * jansson turns every number of a body into a tree node (a lexer copy, a
 * strtod, a node, an array slot), which costs about a quarter of a
 * microsecond per number; a 512 x 64 matrix is 32,768 of them.
 * json_fast_load reads the same text in two steps: a scanner of ours walks
 * its structure, and every member that `field` names whose value is a
 * rectangular array of JSON numbers (nested 1 to JSON_FAST_MAX_DEPTH deep,
 * no empty level) is converted straight into a row-major array of doubles;
 * everything else, with an empty array `[]` standing in for each such
 * value, is parsed by jansson as before.  The decoders ask json_fast_get
 * whether a value they are given stands for numbers read that way.
 *
 * The result is the one jansson alone would give: the same tree (but for
 * the stand-ins), the same doubles (each number is converted exactly as
 * jansson converts it, by strtod, or by an exact shortcut for short
 * numbers that gives the same double), and, for a text that is not valid
 * JSON, jansson's own error for the original text: on any doubt (invalid
 * JSON, a number past the range of a double, a path the scanner cannot
 * follow) the whole text is simply given to jansson.  A value that is not
 * such an array (strings, booleans, ragged or empty rows) is left to
 * jansson too, so every error about it keeps its wording.
 *
 * The numbers live in the calling thread's JSON arena (mem.h): the fast
 * path is taken only while one is open, and a stand-in's numbers are found
 * only until that arena ends.
 */
#ifndef ATTN_JSON_FAST_H
#define ATTN_JSON_FAST_H

#include <jansson.h>
#include <stddef.h>

/* The deepest nesting read into numbers (a batch of matrices is 3). */
#define JSON_FAST_MAX_DEPTH 4

/* Arrays of fewer numbers than this are left to jansson: for them the
 * detour would cost more than it saves (test builds change it with
 * json_fast_set_min_numbers, test_hooks.h). */
#define JSON_FAST_MIN_NUMBERS 8

/* Numbers read without jansson, standing in the tree as an empty array. */
typedef struct json_fast_array {
    const json_t *stand_in;         /* the empty array in the tree (borrowed) */
    int depth;                      /* 1 for a flat array, 2 for a matrix, ... */
    size_t dims[JSON_FAST_MAX_DEPTH]; /* the length of each level, outermost first */
    size_t count;                   /* the product of dims */
    const double *data;             /* count numbers, row-major, in the arena */
} json_fast_array;

/* Says whether the member called name[0..len) (its bytes in the text; a
 * name written with escapes is never asked about) holds numbers to read. */
typedef int (*json_fast_field)(const char *name, size_t len);

/* Parses text[0..len) as json_loadb(text, len, flags, error) would, except
 * that members for which field says 1 (NULL: none) holding an array of
 * numbers are read as described above.  Only with JSON_DECODE_INT_AS_REAL
 * in flags (without it jansson makes integers of some numbers, which a
 * double cannot stand for); else this is json_loadb.  Returns a new reference, or NULL
 * with *error filled exactly as json_loadb fills it. */
json_t *json_fast_load(const char *text, size_t len, size_t flags, json_fast_field field,
                       json_error_t *error);

/* The numbers v stands for, when v is a stand-in made by the latest
 * json_fast_load of this thread within the arena still open; else NULL. */
const json_fast_array *json_fast_get(const json_t *v);

/* The numbers of a as an ordinary jansson value (nested arrays of reals),
 * for code that needs the tree itself (the error paths of the decoders, so
 * that a message about a fast array reads as it would without this
 * module).  Returns a new reference, or NULL when memory runs out. */
json_t *json_fast_materialize(const json_fast_array *a);

#endif

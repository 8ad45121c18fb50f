/*
 * json_in.h - reading numbers and small fields out of a parsed JSON body.
 *
 * The decoders of every resource (v1's attention_json, the request
 * module's weights_json, v2's v2_tensor and v2_infer) use these to
 * turn jansson values into dense row-major arrays of doubles, with the
 * limits of the server and the path of the field at fault in every error
 * ("q", "q[1]", "weights.wq[0][2]").  Functions here fail with the project's
 * error convention (error.h): 400 for a value of the wrong type or shape,
 * 413 past the element budget, 503 when memory runs out.  jansson values are
 * always borrowed.
 */
#ifndef ATTN_JSON_IN_H
#define ATTN_JSON_IN_H

#include <jansson.h>
#include <stddef.h>

#include "core/error.h"
#include "core/scalar.h"
#include "json_fast.h"

/* The flags every body is parsed with: duplicate keys are an error, and
 * every number is a double (JSON has one kind of number, so 9223372036854775808
 * is the number 9223372036854775808.0, not an integer too big for jansson).
 * Fields that must be whole numbers check the double's value. */
#define JSON_IN_PARSE_FLAGS (JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL)

/* The numbers a request may hold, and how many it holds so far. */
typedef struct json_in_budget {
    size_t max_elements;
    size_t *elements;       /* running count, increased by each successful decode */
} json_in_budget;

/* A matrix as decoded: rank 2 (batch = 1) or 3, batch x rows x cols numbers,
 * row-major. */
typedef struct json_in_tensor {
    int rank;
    size_t batch, rows, cols;
    double *data;
} json_in_tensor;

/* What the elements of a matrix must be. */
typedef enum {
    JSON_IN_NUMBER,         /* finite numbers */
    JSON_IN_MASK            /* true/false or 1/0, stored as 1.0/0.0 */
} json_in_elem;

/* Parses text[0..len) as JSON.  Returns a new reference that the caller
 * drops with json_decref, or NULL with err filled: 400 "invalid_json" for an
 * empty body, bad JSON or a number past the range of a double (the message
 * has jansson's words and the place), or 503 when memory runs out.
 * tensor_field (or NULL) names the members that hold matrices: while the
 * thread's JSON arena is open (mem.h), their numbers are
 * read without jansson (json_fast.h), and json_in_tensor_decode and
 * json_in_vector_decode find them there; the result is the same. */
json_t *json_in_parse(const char *text, size_t len, json_fast_field tensor_field,
                      attn_error *err);

/* "an object", "an array", "a string", "a number", "a boolean" or "null":
 * what a value is, for messages.  Returns a static string. */
const char *json_in_kind(const json_t *v);

/* Returns 1 when v is a JSON number whose value is a whole number in [lo, hi],
 * setting *out to it; 0 otherwise (*out unchanged).  Bodies are parsed with
 * integers as reals (json_in_parse), so this is how an integer field is read:
 * 2 and 2.0 are the same number, and 2.5 is not whole. */
int json_in_whole(const json_t *v, double lo, double hi, double *out);

/* v as the tagged value the rules read (core/scalar.h): SCALAR_ABSENT for
 * NULL (a member not there), a string borrowed from v.  A number is a real
 * or an integer as jansson holds it. */
scalar json_in_scalar(const json_t *v);

/* Decodes v, a matrix (or with max_rank 3 a batch of matrices), named path
 * in errors.  Every row must have the same length and every element be of
 * `kind`.  The numbers are counted against budget (413 past it, before any
 * allocation).  With transpose, every matrix is transposed (rows <-> cols).
 * On success t->data is the caller's, freed with mem_free; on failure t is
 * zeroed and *budget->elements may have grown. */
int json_in_tensor_decode(const json_in_budget *budget, const json_t *v, const char *path,
                          int max_rank, json_in_elem kind, int transpose, json_in_tensor *t,
                          attn_error *err);

/* Decodes v, a flat array of at least one number (a bias), named path in
 * errors, counted against budget.  On success *out is an array of *len
 * doubles that the caller frees with mem_free; on failure *out is NULL and
 * *len 0. */
int json_in_vector_decode(const json_in_budget *budget, const json_t *v, const char *path,
                          double **out, size_t *len, attn_error *err);

/* Reads the optional boolean member `name` of root into *out (def when
 * absent).  Fails with 400 "wrong_type" for anything but true or false. */
int json_in_bool(const json_t *root, const char *name, int def, int *out, attn_error *err);

/* Reads the optional string member `name` of root, which must be one of
 * values[0..count), into *out as its index (def when absent).  Fails with
 * 400 "wrong_type" or "invalid_value", the message listing the values. */
int json_in_enum(const json_t *root, const char *name, const char *const *values, int count,
                 int def, int *out, attn_error *err);

/* Fails with 400 "unknown_field" on the first member of obj whose name is
 * not in known[0..count); the field is prefix.name ("" prefix: name alone),
 * and the message suggests the nearest known name when one is close. */
int json_in_check_fields(const json_t *obj, const char *prefix, const char *const *known,
                         size_t count, attn_error *err);

#endif

/*
 * api_infer.h - a v2 inference request as its fields, whatever wire brought
 * it: the neutral request that v2's JSON parser fills from an HTTP body and
 * a front-end with the fields in hand (gRPC) fills in one step.
 *
 * v2's rules (v2/v2_infer.c, v2/v2_tensor.c) read only this, so both wires
 * are refused with the same words.  Each field is a tagged value
 * (core/scalar.h) that says what the wire held, also when it is not what
 * the rule wants (a string where a number goes, an array where an object
 * goes): the words of a refusal depend on it.  A front-end that cannot
 * hold a wrong kind in a field (protobuf's typed fields) fills the kind the
 * rule wants.  Everything here is borrowed from the wire's own form (the
 * parsed JSON tree, the unpacked message), which must outlive the request.
 */
#ifndef ATTN_API_INFER_H
#define ATTN_API_INFER_H

#include <stddef.h>

#include "core/scalar.h"

#define API_INFER_MAX_OUTPUTS 17 /* as many as v2 has (v2_internal.h) */
#define API_INFER_MAX_INPUTS 6   /* as many input names as v2's models take (v2_infer.c) */
#define API_INFER_MAX_RANK 4

/* One request parameter (a member of "parameters"). */
typedef struct api_infer_param {
    const char *key;
    scalar value;
} api_infer_param;

/* One input, before its numbers are read. */
typedef struct api_infer_input {
    scalar self;                /* SCALAR_OBJECT, or what the entry is instead */
    scalar name, datatype;      /* strings, or what they are instead */
    scalar shape;               /* SCALAR_ARRAY of size the rank, or what it is instead */
    scalar dims[API_INFER_MAX_RANK];            /* the first dimensions */
    scalar parameters;          /* SCALAR_OBJECT or absent, or what it is instead */
    scalar binary_data_size;    /* the byte count of its binary data, or absent */
    /* Where its binary bytes are, when the front-end holds each input's bytes
     * apart (gRPC's raw contents, each where protobuf-c unpacked it): bytes
     * NULL, they are the next binary_data_size bytes of the body's binary
     * section, in input order. */
    const unsigned char *bytes;
    scalar data;                /* JSON "data": SCALAR_ARRAY, absent, or what instead */
    const struct json_t *data_json; /* with data an array: the numbers, borrowed */
} api_infer_input;

/* One requested output. */
typedef struct api_infer_output {
    scalar self;                /* SCALAR_OBJECT, or what the entry is instead */
    scalar name;
    scalar parameters;          /* SCALAR_OBJECT or absent, or what it is instead */
    scalar binary_data;         /* a boolean, or absent */
} api_infer_output;

/* The request.  inputs holds the first n_inputs entries of the wire's
 * (inputs.size of them in all): v2 refuses a request by its seventh input at
 * the latest (no model takes more names than API_INFER_MAX_INPUTS), so no
 * more are kept.  outputs likewise (more than API_INFER_MAX_OUTPUTS are
 * refused before any is read). */
typedef struct api_infer_request {
    scalar self;                /* SCALAR_OBJECT, or what the header is instead */
    scalar id;                  /* a string, or absent */
    scalar parameters;          /* SCALAR_OBJECT or absent, or what it is instead */
    const api_infer_param *params;      /* its members, borrowed; the last of a key counts */
    size_t n_params;
    scalar inputs;              /* SCALAR_ARRAY of size the inputs, absent, or what instead */
    api_infer_input input[API_INFER_MAX_INPUTS + 1];
    size_t n_inputs;
    scalar outputs;             /* SCALAR_ARRAY of size the outputs, absent, or what instead */
    api_infer_output output[API_INFER_MAX_OUTPUTS];
    size_t n_outputs;
} api_infer_request;

/* The value of parameter key of r (the last one of that key), or NULL when
 * r has none. */
const scalar *api_infer_param_get(const api_infer_request *r, const char *key);

#endif

/*
 * attention_json.h - POST /v1/attention in JSON: the request decoded into an
 * attention job, and the result encoded into the answer.
 *
 * attention_json_decode checks every field of the request against the
 * contract (types, shapes, enums, limits) before it allocates the arrays it
 * copies numbers into, and fails with the first problem it meets, naming the
 * field.  It normalises what the user sent: tokens become rows whatever the
 * layout, and weights become in_out form whatever weights_layout, so the
 * math sees one form.  This module knows JSON but nothing of HTTP.
 */
#ifndef ATTN_ATTENTION_JSON_H
#define ATTN_ATTENTION_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "error.h"
#include "jsonw.h"
#include "weights.h"

typedef struct attention_json_limits {
    size_t max_elements;    /* most numbers in the request */
} attention_json_limits;

/* A decoded request.  Its arrays are owned by it and freed by
 * attention_json_free; job points into them (and at `weights`, or at a
 * stored set the caller binds with attention_json_bind_weights). */
typedef struct attention_json_request {
    attn_job job;
    int batched;            /* the inputs had a leading batch axis */
    int heads_given;        /* the request named heads (attention gets a head axis) */
    int columns;            /* layout "columns" */
    int out_in;             /* weights_layout "out_in" */
    int weights_layout_given; /* the request named weights_layout */
    int scale_given;        /* the request set scale (else weights_default_scale) */
    size_t x_width;         /* features per token of x (projection mode) */
    size_t ctx_width;       /* features per token of context, or of x */
    double *x, *context, *q, *k, *v;
    unsigned char *mask;
    attn_weights weights;   /* inline weights, owned; all NULL otherwise */
    int has_inline_weights;
    char weights_name[WEIGHTS_NAME_MAX + 1]; /* "" unless weights named a stored set */
    uint64_t weights_generation; /* the generation of that set the request needs; 0: any */
    size_t input_elements;  /* numbers in the request */
} attention_json_request;

/* 1 when the member called name[0..len) of a request holds a matrix (q, k,
 * v, x, context, mask, or a weight array): what json_in_parse is given for
 * a request body. */
int attention_json_tensor_field(const char *name, size_t len);

/* Decodes root (borrowed) into req.  Returns 0, or a negative ERR_* code
 * with err filled (400 for invalid requests, 413 past limits->max_elements,
 * 503 when memory runs out); on failure req holds nothing (freeing it is
 * harmless).  On success the caller frees req with attention_json_free.
 * With inline weights the job is ready to run; with a named set
 * (weights_name non-empty) the caller must attention_json_bind_weights
 * first. */
int attention_json_decode(const json_t *root, const attention_json_limits *limits,
                          attention_json_request *req, attn_error *err);

/* Checks that weights w fit the request's x/context and heads, and points
 * the job at w (borrowed: it must outlive the job) with dk and dv, and the
 * default scale unless the request set one.  `named` says the weights came
 * from a stored set (messages then blame x rather than the weights).
 * Returns 0 or ERR_BAD_REQUEST with err filled; req is unchanged on
 * failure. */
int attention_json_bind_weights(attention_json_request *req, const attn_weights *w, int named,
                                attn_error *err);

/* Frees what req owns (req may be NULL) and zeroes it. */
void attention_json_free(attention_json_request *req);

/* Numbers the answer will carry (output, plus attention when asked for), or
 * SIZE_MAX when that count overflows. */
size_t attention_json_result_elements(const attention_json_request *req);

/* Appends the 200 answer for req and its result (both borrowed) to w:
 * output and attention in the contract's shapes (output in the request's
 * layout), and a "meta" object with the shapes, dtype, scale and
 * compute_ms. */
void attention_json_encode(const attention_json_request *req, const attn_result *result,
                           double compute_ms, jw_buf *w);

#endif

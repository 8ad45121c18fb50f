/*
 * request.h - turning a JSON request into an attention job, and a result
 * back into the JSON response.
 *
 * request_decode checks every field of POST /v1/attention against the
 * contract (types, shapes, enums, limits) before it allocates the arrays it
 * copies numbers into, and fails with the first problem it meets, naming the
 * field.  It normalises what the user sent: tokens become rows whatever the
 * layout, and weights become (d_in x d_out) whatever weights_layout, so the
 * math sees one form.  This module knows JSON but nothing of HTTP.
 */
#ifndef ATTN_REQUEST_H
#define ATTN_REQUEST_H

#include <jansson.h>
#include <stddef.h>

#include "attention.h"
#include "error.h"
#include "jsonw.h"
#include "store.h"

#define REQUEST_NAME_MAX 64

typedef struct request_limits {
    size_t max_elements;    /* most numbers in the request, and in the response */
} request_limits;

/* A decoded request.  All arrays are owned by it and freed by request_free;
 * job points into them (and at `weights`, or at a stored set the caller
 * binds with request_bind_weights). */
typedef struct attn_request {
    attn_job job;
    int batched;            /* the inputs had a leading batch axis */
    int heads_given;        /* the request named heads (attention gets a head axis) */
    int columns;            /* layout "columns" */
    int out_in;             /* weights_layout "out_in" */
    int weights_layout_given; /* the request named weights_layout */
    int scale_given;        /* the request set scale (else 1/sqrt(dk per head)) */
    size_t x_width;         /* features per token of x (projection mode) */
    size_t ctx_width;       /* features per token of context, or of x */
    double *x, *context, *q, *k, *v;
    unsigned char *mask;
    attn_weights weights;   /* inline weights, owned; all NULL otherwise */
    int has_inline_weights;
    char weights_name[REQUEST_NAME_MAX + 1]; /* "" unless weights named a stored set */
    size_t input_elements;  /* numbers in the request */
} attn_request;

/* Decodes root into req.  Returns 0, or a negative ERR_* code with err filled
 * (400 for invalid requests, 413 past limits->max_elements, 503 when memory
 * runs out); on failure req holds nothing and needs no request_free.  With
 * inline weights, the job is ready to run; with a named set (weights_name
 * non-empty) the caller must request_bind_weights first. */
int request_decode(const json_t *root, const request_limits *limits, attn_request *req,
                   attn_error *err);

/* Checks that weights w fit the request's x/context and heads, and points the
 * job at w (borrowed: it must outlive the job).  `named` says the weights
 * came from a stored set (messages then blame x rather than the weights).
 * Returns 0 or ERR_BAD_REQUEST with err filled; req is unchanged on failure. */
int request_bind_weights(attn_request *req, const attn_weights *w, int named, attn_error *err);

/* Frees what req owns (req may be NULL) and zeroes it. */
void request_free(attn_request *req);

/* Decodes a weights object {"wq","wk","wv", optional "bq","bk","bv","wo","bo"}
 * whose matrices are (d_in x d_out), or (d_out x d_in) when out_in, into w
 * (in_out form, arrays owned by w: free with request_weights_free).  `path`
 * prefixes field names in errors ("weights"; "" for none).  When x_width is
 * not 0, wq must take x_width inputs and wk/wv ctx_width (the width of the
 * tokens named ctx_name).  Adds the numbers it read to *elements and fails
 * with 413 when that passes max_elements.  On failure w is left empty. */
int request_decode_weights(const json_t *obj, const char *path, int out_in, size_t x_width,
                           size_t ctx_width, const char *ctx_name, size_t max_elements,
                           size_t *elements, attn_weights *w, attn_error *err);

/* Frees the arrays of w (which may be NULL) and zeroes it. */
void request_weights_free(attn_weights *w);

/* Returns 1 if name is a valid weight-set name: 1-64 of A-Z a-z 0-9 . _ - */
int request_valid_name(const char *name);

/* Numbers the response will carry (output plus attention when asked for). */
size_t request_result_elements(const attn_request *req);

/* Appends the 200 response body for req and its result to w: output and
 * attention in the contract's shapes (output in the request's layout), and a
 * "meta" object with the shapes, dtype, scale and compute_ms. */
void request_encode_response(const attn_request *req, const attn_result *result,
                             double compute_ms, jw_buf *w);

/* Decodes the body of PUT /v1/weight-sets/{name}: the weights members
 * (as in request_decode_weights, field names without prefix) plus optional
 * "weights_layout" and "heads", which must divide dk and dv.  On success w
 * owns its arrays (in_out form).  On failure w is empty. */
int request_decode_weight_set(const json_t *root, size_t max_elements, attn_weights *w,
                              size_t *heads, int *out_in, attn_error *err);

/* Appends a JSON object describing set: name, heads, weights_layout, the
 * shape of each matrix as uploaded, size_bytes and stored_at; with
 * with_arrays, also every array exactly as uploaded (same layout, every
 * double printed so that it reads back bit for bit). */
void request_encode_weight_set(const weight_set *set, int with_arrays, jw_buf *w);

#endif

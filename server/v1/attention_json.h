/*
 * attention_json.h - POST /v1/attention in JSON: the request decoded into an
 * attention job, and the result encoded into the answer.
 *
 * attention_json_decode checks every field of the request against the
 * contract (types, enums, limits) before it allocates the arrays it copies
 * numbers into, and fails with the first problem it meets, naming the
 * field; the rules between the matrices are attention_request's.  It
 * normalises what the user sent: tokens become rows whatever the layout,
 * and weights become in_out form whatever weights_layout, so the math sees
 * one form.  This module knows JSON but nothing of HTTP.
 */
#ifndef ATTN_ATTENTION_JSON_H
#define ATTN_ATTENTION_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel/attention.h"
#include "request/attention_request.h"
#include "core/error.h"
#include "json/jsonw.h"
#include "kernel/weights.h"

typedef struct attention_json_limits {
    size_t max_elements;    /* most numbers in the request */
} attention_json_limits;

/* 1 when the member called name[0..len) of a request holds a matrix (q, k,
 * v, x, context, mask, or a weight array): what json_in_parse is given for
 * a request body. */
int attention_json_tensor_field(const char *name, size_t len);

/* Decodes root (borrowed) into req.  Returns 0, or a negative ERR_* code
 * with err filled (400 for invalid requests, 413 past limits->max_elements,
 * 503 when memory runs out); on failure req holds nothing (freeing it is
 * harmless).  On success the caller frees req with attention_request_free.
 * With inline weights the job is ready to run; with a named set
 * (weights_name non-empty) the caller must attention_request_bind_set
 * first. */
int attention_json_decode(const json_t *root, const attention_json_limits *limits,
                          attention_request *req, attn_error *err);

/* Appends the 200 answer for req and its result (both borrowed) to w:
 * output and attention in the contract's shapes (output in the request's
 * layout), and a "meta" object with the shapes, dtype, scale and
 * compute_ms. */
void attention_json_encode(const attention_request *req, const attn_result *result,
                           double compute_ms, jw_buf *w);

#endif

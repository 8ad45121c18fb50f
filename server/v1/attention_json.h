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
#include "request/sequence_step.h"
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
 * first.  seq receives the request's "sequence" (and reductions.received_total)
 * by request/sequence_step.h's rules; the step itself is the caller's. */
int attention_json_decode(const json_t *root, const attention_json_limits *limits,
                          attention_request *req, sequence_ask *seq, attn_error *err);

/* What a sequence's step adds to the answer (request/sequence_step.h). */
typedef struct attention_json_sequence {
    const sequence_ask *ask;
    const sequence_step *step;
} attention_json_sequence;

/* Appends the 200 answer for req and its result (both borrowed) to w:
 * output and attention in the contract's shapes (output in the request's
 * layout), and a "meta" object with the shapes, dtype, scale and
 * compute_ms; in a sequence's step (seq non-NULL) also "sequence" with its id
 * and length, and reductions.received_total when asked. */
void attention_json_encode(const attention_request *req, const attn_result *result,
                           double compute_ms, const attention_json_sequence *seq, jw_buf *w);

#endif

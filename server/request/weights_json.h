/*
 * weights_json.h - weights in JSON: the weights object inside a request, the
 * body of PUT /v1/weight-sets/{name}, and a stored set as GET, the list and
 * the answer to a PUT show it.
 *
 * Matrices arrive in the layout the client chose (weights_layout in_out:
 * W is d_in x d_out; out_in: d_out x d_in) and are always held in in_out
 * form (weights.h); encoding turns them back into the layout they came in.
 * jansson values are borrowed; errors follow error.h.
 */
#ifndef ATTN_WEIGHTS_JSON_H
#define ATTN_WEIGHTS_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "core/error.h"
#include "json/json_in.h"
#include "json/jsonw.h"
#include "store/store.h"
#include "kernel/weights.h"

/* The token matrices weights are applied to, when the request gives them:
 * wq must take x_width inputs and wk/wv ctx_width (the width of the tokens
 * named ctx_name, "x" or "context").  x_width 0: not known, not checked. */
typedef struct weights_json_tokens {
    size_t x_width;
    size_t ctx_width;
    const char *ctx_name;
} weights_json_tokens;

/* Decodes a weights object {"wq", "wk", "wv", and optionally "bq", "bk",
 * "bv", "wo", "bo"} into w (in_out form) and checks the shapes against each
 * other and against tokens.  out_in says how the matrices are written.
 * `path` prefixes field names in errors ("weights"; "" for none).  The
 * numbers count against budget.  On success w owns its arrays, which the
 * caller frees with weights_free; on failure w is zeroed. */
int weights_json_decode(const json_t *obj, const char *path, int out_in,
                        const weights_json_tokens *tokens, const json_in_budget *budget,
                        attn_weights *w, attn_error *err);

/* Reads the optional "heads" member of root into *heads: 0 when absent (or
 * null, when allow_null), else a whole number >= 1 (400 "wrong_type" or
 * "invalid_value" otherwise).  Whether it divides dk and dv is checked by
 * weights_check_heads once those are known. */
int weights_json_decode_heads(const json_t *root, int allow_null, size_t *heads, attn_error *err);

/* The rule of weights_json_decode_heads on the value of "heads" as any wire
 * gives it (SCALAR_ABSENT when absent), with the same words. */
int weights_json_heads_value(const scalar *v, int allow_null, size_t *heads, attn_error *err);

/* Decodes the body of PUT /v1/weight-sets/{name}: the members of a weights
 * object (field names without prefix), optional "weights_layout" and
 * "heads" (which must divide dk and dv), and the read-only members GET adds
 * (dtype among them: a set sent as JSON is always float64), which are
 * ignored so that what GET returns can be PUT back.  On success w
 * owns its arrays (free with weights_free), *heads is 0 when none was given
 * and *out_in is the layout; on failure w is zeroed. */
int weights_json_decode_set(const json_t *root, size_t max_elements, attn_weights *w,
                            size_t *heads, int *out_in, attn_error *err);

/* Appends a JSON object describing set (borrowed) to w.  Without
 * with_arrays it is the summary of the list and of the answer to a PUT:
 * name, heads (null when the set has none), weights_layout, dtype
 * ("float64" or "float32", the element type the set holds), the shape of
 * each array as uploaded, parameters, size_bytes, stored_at and generation.  With
 * with_arrays it is the answer of GET /v1/weight-sets/{name}: the same, but
 * heads only when the set has it, and every array exactly as uploaded (same
 * layout, every number printed so that it reads back bit for bit: a float32
 * set's widened to double, which reads back as that double and, rounded,
 * as the same float). */
void weights_json_encode_set(const weight_set *set, int with_arrays, jw_buf *w);

#endif

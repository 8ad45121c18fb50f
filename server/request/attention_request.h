/*
 * attention_request.h - one attention request, whatever wire format it came
 * in: the job's shapes, every rule those shapes, the heads, the mask and the
 * scale obey (each with its message), the binding of weights or of a stored
 * weight set, and the size of the result.
 *
 * A decoder (attention_json for POST /v1/attention, v2_infer for the
 * inference protocol) reads its wire format and tells this module what it
 * found: each input as an attention_input (its name, its place in the
 * request, its rank and sizes), the scale, the heads.  Every rule between
 * inputs is checked here and nowhere else, so one fault gives the same words
 * on every route.  The decoder only chooses the places: the error's field is
 * "k" on v1 and "inputs[1].shape" on v2 (whose error body puts the field
 * before the words when they do not name it).  Knows no JSON and no HTTP.
 *
 * Functions return 0, or a negative ERR_* code with err filled (error.h);
 * a failed call leaves the request as it was, apart from what the
 * description of the function says it sets first.
 */
#ifndef ATTN_ATTENTION_REQUEST_H
#define ATTN_ATTENTION_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "kernel/attention.h"
#include "kernel/attention_pool.h"
#include "kernel/attention_reduce.h"
#include "core/error.h"
#include "core/scalar.h"
#include "kernel/weights.h"

/* Longest place of an input a decoder gives ("inputs[12].shape"). */
/* The model every server has whatever its store holds: the attention of
 * inline inputs (and inline weights).  Its statistics count every request
 * that names no stored set; v2 serves it under this name, and a stored set
 * of the same name is hidden there. */
#define ATTENTION_MODEL_BUILTIN "attention"

#define ATTENTION_FIELD_MAX 48

/* One token matrix (q, k, v, x, context) or the mask, as its decoder found
 * it, before or after its numbers are read. */
typedef struct attention_input {
    const char *name;       /* "q", "k", "v", "x", "context", "mask": how messages call it */
    const char *field;      /* where a fault in it is, in the wire's terms (borrowed) */
    int rank;               /* 2, or 3 with a leading batch axis */
    size_t batch;           /* 1 when rank is 2 */
    size_t tokens;          /* one per token (the mask: one per query) */
    size_t features;        /* per token (the mask: one per key) */
} attention_input;

/* A request.  Its arrays are owned by it and freed by attention_request_free;
 * job points into them (and at `weights`, or at a stored set the caller
 * binds with attention_request_bind_set). */
typedef struct attention_request {
    attn_job job;
    int batched;            /* the inputs had a leading batch axis */
    int heads_given;        /* the request named heads (attention gets a head axis) */
    int columns;            /* tokens are columns (v1 layout "columns"); v2 never */
    int out_in;             /* weights written out_in (v1 weights_layout) */
    int weights_layout_given; /* the request named weights_layout */
    int scale_given;        /* the request set scale (else weights_default_scale) */
    size_t x_width;         /* features per token of x (projection mode) */
    size_t ctx_width;       /* features per token of context, or of x */
    int has_context;        /* keys and values come from context, not from x */
    double *x, *context, *q, *k, *v;
    float *q32, *k32, *v32;  /* a float32 job's q, k, v given as float (job.q32, ...) */
    unsigned char *mask;
    attn_weights weights;   /* inline weights, owned; all NULL otherwise */
    attn_pool pool;         /* the pooling asked for; job.pool points here when it was */
    const char *pool_queries_field, *pool_keys_field; /* where its window was given */
    attn_reduce reduce;     /* the reductions asked for; job.reduce points here when any was */
    char reduce_topk_field[ATTENTION_FIELD_MAX]; /* where topk was given */
    int has_inline_weights;
    char weights_name[WEIGHTS_NAME_MAX + 1]; /* "" unless the request names a stored set */
    uint64_t weights_generation; /* the generation of that set the request needs; 0: any */
    size_t input_elements;  /* numbers in the request */
    /* Places of faults found once the inputs are known (the error's field). */
    const char *heads_field;                /* "heads"; v2: "parameters.heads" */
    char x_field[ATTENTION_FIELD_MAX];      /* "x"; v2: "inputs[0].shape" */
    char ctx_field[ATTENTION_FIELD_MAX];    /* "context", or x's place without one */
} attention_request;

/* Zeroes req and sets the places to v1's names ("heads", "x", "context"). */
void attention_request_init(attention_request *req);

/* Frees what req owns (req may be NULL) and zeroes it. */
void attention_request_free(attention_request *req);

/* Sets the scale the request gave, at `field`.  not_number is NULL when the
 * wire held a number (value), else what it held ("a string"): 400
 * "wrong_type".  A value that is not finite and > 0 is 400 "invalid_value". */
int attention_request_set_scale(attention_request *req, const char *not_number, double value,
                                const char *field, attn_error *err);

/* Sets the precision the job computes in from compute_precision, given at `field`: value
 * the string the wire held, or NULL with not_string what it held instead ("a number":
 * 400 "wrong_type"); "float64", "float32" or "bfloat16" (attn_job.bf16, a float32 job
 * with bfloat16 products), anything else 400 "invalid_value".  Called after the
 * precision the inputs imply (v1's dtype, v2's datatype) is set, which it overrides;
 * not called when the field is absent.  The job is unchanged on failure. */
int attention_request_set_precision(attention_request *req, const char *not_string,
                                    const char *value, const char *field, attn_error *err);

/* Reads one side of the pooled attention (rows or cols), given at `field`, into *out:
 * not_number as for attention_request_set_scale (400 "wrong_type"); a value that is not a
 * whole number from 1 to ATTN_POOL_MAX_SIDE is 400 "invalid_value". */
int attention_request_pool_side(const char *not_number, double value, const char *field,
                                size_t *out, attn_error *err);

/* Asks for the attention pooled (rows x cols cells, reduce): job.pool points at req->pool,
 * and the full matrix is not formed (job.want_attention = 0). */
void attention_request_set_pool(attention_request *req, size_t rows, size_t cols,
                                attn_pool_reduce reduce);

/* Checks the pool's window against the job's shapes (after shape_qkv or shape_x): each
 * range [start, end) within the queries or keys and not empty, else 400 "invalid_value" at
 * pool_queries_field or pool_keys_field.  Nothing to check without a pool. */
int attention_request_check_pool(const attention_request *req, attn_error *err);

/* Reads the reduction `key` (attention_reduce.h) given as v (a field of any wire) at `field` ("reductions.topk" on
 * v1, "parameters.topk" on v2) into req->reduce, pointing job.reduce there: entropy, max and
 * received take true or false; sink and local a whole number >= 0; topk a whole number >= 1
 * (at most the keys: attention_request_check_reduce, once they are known).  Returns 0, 400
 * "wrong_type" or "invalid_value" at field, or 1 when key names no reduction (the caller
 * decides what that is). */
int attention_request_reduce_param(attention_request *req, const char *key, const scalar *v,
                                   const char *field, attn_error *err);

/* Checks the reductions against the job's shapes: topk at most the keys, else 400
 * "invalid_value" at reduce_topk_field.  Nothing to check without them. */
int attention_request_check_reduce(const attention_request *req, attn_error *err);

/* Checks that input t has the rank and batch of ref (the first input): 400
 * "shape_mismatch" at t->field otherwise. */
int attention_request_check_batch(const attention_input *t, const attention_input *ref,
                                  attn_error *err);

/* Shapes the job from q, k and v (in[0..2]): their batches agree, k is as
 * wide as q (dk), v has a row per key, heads divide dk and dv; sets batch,
 * lq, lk, dk, dv, batched and the default scale unless one was set. */
int attention_request_shape_qkv(attention_request *req, const attention_input in[3],
                                attn_error *err);

/* Shapes the job from x and the optional context (NULL: self-attention):
 * their batches agree; sets batch, lq, lk, batched, the widths weights must
 * take, and the places of x and context for attention_request_bind_*. */
int attention_request_shape_x(attention_request *req, const attention_input *x,
                              const attention_input *context, attn_error *err);

/* Checks the mask against the job's shapes (after shape_qkv or shape_x):
 * 3-D only with batched inputs and then of their batch, Lq x Lk always;
 * sets mask_batched.  The caller points job.mask at the numbers. */
int attention_request_shape_mask(attention_request *req, const attention_input *mask,
                                 attn_error *err);

/* Checks that weights w fit x/context and the heads, and points the job at
 * w (borrowed: it must outlive the job) with dk and dv, and the default
 * scale unless the request set one.  `named` says w is a stored set
 * (messages then blame x rather than the weights).  req is unchanged on
 * failure. */
int attention_request_bind_weights(attention_request *req, const attn_weights *w, int named,
                                   attn_error *err);

/* Binds the stored set `name` (weights w, stored heads, 0 for none; all
 * borrowed for the job's life): heads given by the request must equal the
 * stored ones (400 "conflicting_fields"), else the stored heads are taken;
 * then as attention_request_bind_weights. */
int attention_request_bind_set(attention_request *req, const char *name, const attn_weights *w,
                               size_t heads, attn_error *err);

/* Numbers the answer will carry (output, plus attention, pooled or not, the reductions, and
 * q and k when asked for), or SIZE_MAX when that count overflows. */
size_t attention_request_result_elements(const attention_request *req);

#endif

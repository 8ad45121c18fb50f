/*
 * weights.h - the projection weights of attention, and the rules about them.
 *
 * A set of weights is eight arrays: four matrices (wq wk wv wo) and their
 * biases (bq bk bv bo).  They are listed once, in weights_parts, with the
 * dimensions each takes, and every module that walks over them (decoding,
 * encoding, the store's file format, the float32 conversion of the math)
 * walks that table in its order.  The same goes for the few rules that
 * concern weights wherever they come from: heads must divide dk and dv, the
 * default scale is 1/sqrt(dk per head), and a stored set's name is 1 to 64
 * of A-Z a-z 0-9 . _ -.
 *
 * A set holds its numbers in one element type: float64 (the double arrays
 * wq ... bo; weights given inline or as JSON, and checkpoints of F64
 * tensors) or float32 (the float arrays f32[]; checkpoints of F32, F16 or
 * BF16 tensors, kept at their own precision rather than widened).  The
 * arrays of the other type are all NULL.  Code that does not care which
 * walks the parts with weights_has, weights_data and weights_elem_size;
 * code that does asks weights_is_f32.
 *
 * This module knows nothing of JSON, HTTP or files.
 */
#ifndef ATTN_WEIGHTS_H
#define ATTN_WEIGHTS_H

#include <stddef.h>

#include "core/error.h"

/* The longest weight-set name. */
#define WEIGHTS_NAME_MAX 64

/* The eight arrays, in the order of weights_parts (also the order of the
 * store's file format). */
typedef enum {
    WEIGHTS_WQ, WEIGHTS_WK, WEIGHTS_WV, WEIGHTS_WO,
    WEIGHTS_BQ, WEIGHTS_BK, WEIGHTS_BV, WEIGHTS_BO,
    WEIGHTS_COUNT
} weights_part;

/* The element type of a set's arrays.  Zero (a struct zeroed or made with
 * designated initializers) is float64. */
typedef enum { WEIGHTS_F64 = 0, WEIGHTS_F32 = 1 } weights_elem;

/* Projection weights in in_out form: W is (d_in x d_out), y = x W + b.
 * A missing optional part has a NULL pointer.  Used both for weights given
 * inline in a request and for stored weight sets; the struct does not say who
 * owns the arrays (see the owner's header). */
typedef struct attn_weights {
    weights_elem elem;  /* which arrays hold the numbers: wq ... bo, or f32[] */
    size_t d_in;        /* rows of wq (width of x) */
    size_t d_ctx;       /* rows of wk and wv (width of context, or of x) */
    size_t dk;          /* columns of wq and wk (all heads together) */
    size_t dv;          /* columns of wv (all heads together) */
    size_t d_out;       /* columns of wo; equals dv when wo is absent */
    double *wq, *wk, *wv, *wo;
    double *bq, *bk, *bv, *bo;
    float *f32[WEIGHTS_COUNT];      /* elem WEIGHTS_F32: the parts, indexed by weights_part */
} attn_weights;

/* A dimension of attn_weights. */
typedef enum { WEIGHTS_D_IN, WEIGHTS_D_CTX, WEIGHTS_DK, WEIGHTS_DV, WEIGHTS_D_OUT } weights_dim;

typedef struct weights_part_info {
    const char *name;       /* "wq", ... as in requests and answers */
    int is_matrix;          /* 1: a matrix; 0: a bias (a vector) */
    int required;           /* wq, wk and wv must be given */
    weights_dim rows;       /* a matrix's rows in in_out form (its inputs); unused for a bias */
    weights_dim cols;       /* a matrix's columns (its outputs), or a bias's length */
    weights_part matrix;    /* a bias: the matrix whose outputs it shifts; a matrix: itself */
} weights_part_info;

extern const weights_part_info weights_parts[WEIGHTS_COUNT];

/* 1 when name[0..len) is the name of one of the eight parts ("wq", ...):
 * the members of a weights object whose numbers json_in reads fast. */
int weights_part_named(const char *name, size_t len);

/* The value of dimension d of w. */
size_t weights_dim_of(const attn_weights *w, weights_dim d);

/* Rows and columns of part p in in_out form (a bias has 1 row). */
size_t weights_rows(const attn_weights *w, weights_part p);
size_t weights_cols(const attn_weights *w, weights_part p);

/* The slot of part p in w: where its array pointer lives (NULL if absent).
 * weights_slot and weights_array are the double arrays (all NULL in a
 * float32 set), weights_slot_f32 and weights_array_f32 the float ones. */
double **weights_slot(attn_weights *w, weights_part p);
const double *weights_array(const attn_weights *w, weights_part p);
float **weights_slot_f32(attn_weights *w, weights_part p);
const float *weights_array_f32(const attn_weights *w, weights_part p);

/* 1 when w holds float32 arrays. */
int weights_is_f32(const attn_weights *w);
/* Bytes of one number of w: 8 or 4. */
size_t weights_elem_size(const attn_weights *w);
/* The name of w's element type as the API shows it: "float64" or "float32". */
const char *weights_elem_name(const attn_weights *w);
/* 1 when part p is present in w, whatever its type. */
int weights_has(const attn_weights *w, weights_part p);
/* Part p's array in w's element type (borrowed), or NULL when absent. */
const void *weights_data(const attn_weights *w, weights_part p);
/* Element i of part p (present), widened exactly to double. */
double weights_get(const attn_weights *w, weights_part p, size_t i);
/* Allocates part p of w (rows x cols numbers of w->elem, uninitialised)
 * with mem_malloc into its slot, which must be empty.  Returns the array,
 * or NULL when memory runs out or the size overflows (w unchanged). */
void *weights_part_alloc(attn_weights *w, weights_part p);

/* Fills out with double arrays (new, freed with weights_free) holding the
 * numbers of w widened exactly, the dimensions copied, elem float64.  For a
 * float64 w the arrays are copies.  Returns 0, or -1 when memory runs out
 * (out then holds nothing). */
int weights_widen(const attn_weights *w, attn_weights *out);
/* Fills out with a copy of w, arrays and element type alike (freed with
 * weights_free).  Returns 0, or -1 when memory runs out (out holds
 * nothing). */
int weights_copy(const attn_weights *w, attn_weights *out);

/* Frees the arrays of w (of either type) with mem_free (w may be NULL) and
 * zeroes it. */
void weights_free(attn_weights *w);

/* Checks that heads (>= 1) divides dk and dv.  Returns 0, or ERR_BAD_REQUEST
 * with err (which may be NULL) filled: code "shape_mismatch", field "heads". */
int weights_check_heads(size_t heads, size_t dk, size_t dv, attn_error *err);

/* The default scale of q k^T: 1/sqrt(dk / heads), dk being all heads together. */
double weights_default_scale(size_t dk, size_t heads);

/* Returns 1 if name is a valid weight-set name: 1 to WEIGHTS_NAME_MAX of
 * A-Z a-z 0-9 . _ -, other than "." and "..", and 0 otherwise.  The one name
 * rule: the store's files, the paths, the bodies and the checkpoints' layer
 * names all go through it. */
int weights_valid_name(const char *name);

/* weights_valid_name with the one wording of its refusal: returns 0 for a
 * valid name, else ERR_BAD_REQUEST with err filled (code "invalid_value", the
 * field given, a message that quotes the name and states the rule). */
int weights_check_name(const char *name, const char *field, attn_error *err);

#endif

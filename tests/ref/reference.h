/*
 * reference.h - a naive float64 reference for scaled dot-product attention.
 *
 * These functions are the oracle that the integration runner (tests/integration/itest.c)
 * and the C unit tests compare the server against. They are written as plain loops, in
 * the order a textbook states the formulas, so that they can be checked by reading them;
 * speed does not matter. They know nothing of JSON, HTTP or BLAS and need only <stddef.h>
 * and the C math library (link with -lm).
 *
 * Ownership: the caller owns every buffer. No function here allocates, frees or keeps a
 * pointer after it returns. Input buffers are only read; output buffers must not overlap
 * the inputs and are completely overwritten. All matrices are dense and row-major.
 */
#ifndef REFERENCE_H
#define REFERENCE_H

#include <stddef.h>

/*
 * Returns the default softmax scale 1/sqrt(dk), where dk is the key width of one head.
 * dk must be at least 1.
 */
double ref_default_scale(size_t dk);

/*
 * Computes y = x·w + b for every row of x.
 *   x: rows x d_in, w: d_in x d_out (row-major, "in_out"), b: NULL or d_out values,
 *   y: rows x d_out, written in full.
 * The function cannot fail.
 */
void ref_linear(size_t rows, size_t d_in, size_t d_out, const double *x, const double *w,
                const double *b, double *y);

/*
 * Computes multi-head scaled dot-product attention for every batch entry and head.
 *   q:    batch x lq x (heads*dk)   head h owns columns [h*dk, (h+1)*dk)
 *   k:    batch x lk x (heads*dk)
 *   v:    batch x lk x (heads*dv)   head h owns columns [h*dv, (h+1)*dv)
 *   mask: NULL, or batch x lq x lk bytes; nonzero means query i may attend to key j.
 *         (A 2-D mask must be repeated for every batch entry by the caller.)
 *   causal: when nonzero, query i may attend only to keys j <= i (top-left aligned,
 *         also when lq != lk). It combines with mask by logical AND.
 *   scale: multiplies q·k before the softmax (see ref_default_scale).
 *   out:  batch x lq x (heads*dv), written in full; the heads are concatenated.
 *   attn: batch x heads x lq x lk, written in full; the softmax weights.
 * The softmax of each query row subtracts the maximum score over the allowed keys before
 * exponentiating. A query row with no allowed key gets zeros in both attn and out, never
 * NaN. dk may be 0 only if the caller wants all scores to be 0. The function cannot fail.
 */
void ref_sdpa(size_t batch, size_t heads, size_t lq, size_t lk, size_t dk, size_t dv,
              const double *q, const double *k, const double *v, const unsigned char *mask,
              int causal, double scale, double *out, double *attn);

#endif /* REFERENCE_H */

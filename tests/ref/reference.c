/*
 * reference.c - the naive float64 attention reference described in reference.h.
 *
 * Every quantity is computed straight from its definition with nested loops:
 *   scores[i][j] = scale * sum_c q[i][c] * k[j][c]          (per batch entry and head)
 *   attn[i][j]   = exp(scores[i][j] - m_i) / sum_j' exp(scores[i][j'] - m_i)
 *                  over the allowed keys j, where m_i is the largest allowed score,
 *                  and 0 for keys that are not allowed
 *   out[i][c]    = sum_j attn[i][j] * v[j][c]
 * Nothing here is clever on purpose: this file is the yardstick for the fast code.
 */
#include "reference.h"

#include <assert.h>
#include <math.h>

double ref_default_scale(size_t dk)
{
    assert(dk >= 1);
    return 1.0 / sqrt((double)dk);
}

void ref_linear(size_t rows, size_t d_in, size_t d_out, const double *x, const double *w,
                const double *b, double *y)
{
    assert(x != NULL && w != NULL && y != NULL);
    for (size_t r = 0; r < rows; r++) {
        for (size_t o = 0; o < d_out; o++) {
            double sum = (b != NULL) ? b[o] : 0.0;
            for (size_t i = 0; i < d_in; i++)
                sum += x[r * d_in + i] * w[i * d_out + o];
            y[r * d_out + o] = sum;
        }
    }
}

/* Tells whether query i may attend to key j in batch entry n. */
static int ref_allowed(const unsigned char *mask, int causal, size_t lq, size_t lk,
                       size_t n, size_t i, size_t j)
{
    if (causal && j > i)
        return 0;
    if (mask != NULL && mask[(n * lq + i) * lk + j] == 0)
        return 0;
    return 1;
}

void ref_sdpa(size_t batch, size_t heads, size_t lq, size_t lk, size_t dk, size_t dv,
              const double *q, const double *k, const double *v, const unsigned char *mask,
              int causal, double scale, double *out, double *attn)
{
    assert(q != NULL && k != NULL && v != NULL && out != NULL && attn != NULL);
    const size_t qk_width = heads * dk; /* row width of q and k */
    const size_t v_width = heads * dv;  /* row width of v and out */

    for (size_t n = 0; n < batch; n++) {
        for (size_t h = 0; h < heads; h++) {
            for (size_t i = 0; i < lq; i++) {
                double *weights = &attn[((n * heads + h) * lq + i) * lk];
                const double *q_row = &q[(n * lq + i) * qk_width + h * dk];

                /* First the raw scores, and the largest one among the allowed keys. */
                int any_allowed = 0;
                double max_score = 0.0;
                for (size_t j = 0; j < lk; j++) {
                    const double *k_row = &k[(n * lk + j) * qk_width + h * dk];
                    double dot = 0.0;
                    for (size_t c = 0; c < dk; c++)
                        dot += q_row[c] * k_row[c];
                    weights[j] = scale * dot;
                    if (ref_allowed(mask, causal, lq, lk, n, i, j)) {
                        if (!any_allowed || weights[j] > max_score)
                            max_score = weights[j];
                        any_allowed = 1;
                    }
                }

                /* Then the softmax over the allowed keys; the others get weight 0. */
                double total = 0.0;
                for (size_t j = 0; j < lk; j++) {
                    if (any_allowed && ref_allowed(mask, causal, lq, lk, n, i, j))
                        weights[j] = exp(weights[j] - max_score);
                    else
                        weights[j] = 0.0;
                    total += weights[j];
                }
                for (size_t j = 0; j < lk; j++)
                    weights[j] = any_allowed ? weights[j] / total : 0.0;

                /* Finally the weighted sum of the value rows (zeros when nothing is allowed). */
                double *out_row = &out[(n * lq + i) * v_width + h * dv];
                for (size_t c = 0; c < dv; c++) {
                    double sum = 0.0;
                    for (size_t j = 0; j < lk; j++)
                        sum += weights[j] * v[(n * lk + j) * v_width + h * dv + c];
                    out_row[c] = sum;
                }
            }
        }
    }
}

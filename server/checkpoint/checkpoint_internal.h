/*
 * checkpoint_internal.h - what the two halves of checkpoint extraction share;
 * not for the rest of the server, which sees only checkpoint.h.
 *
 *   checkpoint.c       the presets: a plan per layer (which tensor holds
 *                      each part, in which layout and slice), checked and
 *                      counted before anything is allocated
 *   checkpoint_fill.c  the copying: each planned part into its array, in
 *                      (in, out) form, on the compute pool, giving the
 *                      body's pages back as they are read
 */
#ifndef ATTN_CHECKPOINT_INTERNAL_H
#define ATTN_CHECKPOINT_INTERNAL_H

#include <stddef.h>

#include "checkpoint.h"
#include "kernel/weights.h"

#define CKPT_NAME_MAX 512

/* Where one part comes from. */
typedef struct part_source {
    char name[CKPT_NAME_MAX];   /* "" when the part is not wanted */
    int required;
    int out_in;                 /* the tensor is (out, in) */
    size_t parts, index;        /* the part is outputs [index, index + 1) * n / parts */
} part_source;

typedef struct layer_plan {
    long index;                 /* the layer, or -1 */
    part_source src[WEIGHTS_COUNT];
    const st_tensor *t[WEIGHTS_COUNT];
    attn_weights dims;          /* dimensions and element type only; no arrays */
} layer_plan;

/* Fills out (n layers) from plans: each out[i].w gets plans[i]'s dimensions and, part after
 * part, its arrays; on failure those allocated stay there, to be freed with it.  With
 * release_body, a part that alone reads its bytes of the body gives them back to the kernel
 * as it reads them. */
int checkpoint_fill(const layer_plan *plans, size_t n, int release_body, ckpt_layer *out,
                    attn_error *err);

#endif

/*
 * checkpoint.h - attention weights taken out of a model checkpoint.
 *
 * A checkpoint (a parsed safetensors file) names its tensors after the
 * model that saved it.  A preset says which tensors hold the projections
 * and how they are laid out:
 *   torch_mha  nn.MultiheadAttention: in_proj_weight (3E x E, q k v
 *              stacked by rows) and in_proj_bias, or q/k/v_proj_weight;
 *              out_proj.weight and out_proj.bias; (out, in).
 *   hf_bert    ...encoder.layer.{N}.attention.self.{query,key,value} and
 *              ...attention.output.dense, {weight,bias}; (out, in).
 *   gpt2       ...h.{N}.attn.c_attn (E x 3E, q k v side by side) and
 *              ...h.{N}.attn.c_proj, {weight,bias}; (in, out).
 *   names      an explicit tensor name per part, in either layout.
 * Whatever comes before the names (a model's "bert." or "encoder.attn.")
 * is accepted when only one such prefix is in the file.  Matrices are
 * turned into the project's (in, out) form (weights.h).  A layer whose
 * tensors are all F32, F16 or BF16 becomes float32 weights (F32 numbers
 * copied bit for bit, the halves widened exactly); a layer with an F64
 * tensor float64 weights.
 *
 * This module knows nothing of HTTP; errors follow error.h.
 */
#ifndef ATTN_CHECKPOINT_H
#define ATTN_CHECKPOINT_H

#include <stddef.h>

#include "core/error.h"
#include "safetensors.h"
#include "kernel/weights.h"

typedef enum { CKPT_TORCH_MHA, CKPT_HF_BERT, CKPT_GPT2, CKPT_NAMES } ckpt_preset;

/* layer: this many means "every layer of the file". */
#define CKPT_LAYER_ALL (-2L)
/* layer: none asked for. */
#define CKPT_LAYER_NONE (-1L)

typedef struct ckpt_request {
    ckpt_preset preset;
    long layer;                         /* >= 0, CKPT_LAYER_ALL or CKPT_LAYER_NONE */
    const char *names[WEIGHTS_COUNT];   /* preset names: each part's tensor or NULL (borrowed) */
    int names_out_in;                   /* preset names: matrices are (out, in) */
    size_t max_elements;                /* numbers of all layers together, at most */
    /* The file's buffer is the caller's to spoil: the pages of a tensor read by one part
     * alone are given back to the kernel as they are read (mem_release), and read as
     * zeros afterwards. */
    int release_body;
} ckpt_request;

/* One layer's weights: index is the layer number, or -1 for a file (or a
 * preset) without layers. */
typedef struct ckpt_layer {
    long index;
    attn_weights w;                     /* owned: arrays freed by checkpoint_layers_free */
} ckpt_layer;

/* The longest safetensors header a checkpoint may have.  jansson makes an
 * object of a few hundred bytes per tensor, so a header is refused before
 * it is parsed when it lists far more tensors than any preset reads from a
 * real model: the presets read at most eight tensors a layer, and the
 * largest model their layered patterns name, GPT-2 XL (48 layers, 628
 * tensors with its feed-forward and norm tensors), has a header of 58,652
 * bytes, about 93 bytes a tensor; this is some 11,000 such tensors, 17
 * times that. */
#define CKPT_MAX_HEADER_BYTES ((size_t)1 << 20)

/* Refuses buf[0..len) when its safetensors header is longer than
 * CKPT_MAX_HEADER_BYTES, read from the length word alone (a length past the
 * body is left to safetensors_parse, as a damaged file): returns 0, or
 * ERR_TOO_LARGE ("header_too_large", field "body") with err filled. */
int checkpoint_header_admit(const void *buf, size_t len, attn_error *err);

/* The preset named name into *preset.  Returns 0, or ERR_BAD_REQUEST
 * ("invalid_value", field "preset") with err filled. */
int checkpoint_preset_parse(const char *name, ckpt_preset *preset, attn_error *err);

/* The layers rq asks for, read from f (borrowed) into a new array *layers of
 * *count, which the caller frees with checkpoint_layers_free.  A request
 * without a layer takes the file's only layer (a file of several layers is
 * 400, field "layer").  Before any array is allocated the numbers of all
 * layers are counted against rq->max_elements (413) and reserve (when not
 * NULL) is called once with the bytes the arrays will take, each layer's in
 * its element type: a non-zero
 * return stops the call with the error reserve filled.  What reserve took
 * is the caller's to give back, whatever this returns.  Returns 0, or a negative ERR_* code with err filled (400 for a
 * file that lacks a tensor, holds an ambiguous prefix, a shape that does not
 * fit, or a value that is not finite); *layers is then NULL. */
int checkpoint_extract(const st_file *f, const ckpt_request *rq,
                       int (*reserve)(size_t bytes, void *ctx, attn_error *err), void *ctx,
                       ckpt_layer **layers, size_t *count, attn_error *err);

/* Frees layers[0..count) and their arrays (NULL is fine). */
void checkpoint_layers_free(ckpt_layer *layers, size_t count);

#endif

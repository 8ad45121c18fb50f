/*
 * v2_tensor.h - tensors of the Open Inference Protocol v2: the framing of a
 * body (a JSON header, then raw tensor bytes) and the decoding and encoding
 * of one tensor, whether its numbers are JSON `data` or binary bytes.
 *
 * The binary tensor data extension puts the length of the JSON header in the
 * Inference-Header-Content-Length request header; every input whose
 * parameters carry `binary_data_size` has that many little-endian,
 * row-major bytes after the header, in input order.  Binary numbers are
 * copied straight from those bytes into the arrays the math reads: they never
 * become JSON numbers.  This module knows JSON (the header) but not HTTP.
 */
#ifndef ATTN_V2_TENSOR_H
#define ATTN_V2_TENSOR_H

#include <jansson.h>
#include <stddef.h>

#include "core/error.h"
#include "json/jsonw.h"
#include "message/api_message.h"

#define V2_MAX_RANK 4

/* FP16 and BF16 numbers are read as float32 (exactly) and computed as float32. */
typedef enum v2_datatype { V2_FP32, V2_FP64, V2_BOOL, V2_FP16, V2_BF16 } v2_datatype;

/* A body split into its JSON header and its binary section.  Every pointer
 * borrows from the body handed to v2_body_split. */
typedef struct v2_body {
    const char *json;
    size_t json_len;
    const unsigned char *bin;
    size_t bin_len;
    size_t bin_used;        /* bytes of bin claimed by inputs so far */
} v2_body;

/* One input as described by its fields (api_infer_input), before its
 * numbers are read.  `data` and `bytes` borrow from the parsed header and
 * from the body (or where the front-end holds the input's bytes). */
typedef struct v2_tensor {
    char name[32];
    size_t index;           /* position in "inputs" (for error paths) */
    v2_datatype datatype;
    size_t rank;
    size_t dims[V2_MAX_RANK];
    size_t count;           /* product of dims */
    const json_t *data;     /* JSON data, or NULL when binary */
    const unsigned char *bytes; /* binary data (count * element size bytes), or NULL */
} v2_tensor;

/* Splits body (len bytes, borrowed) at header_length, the length of its JSON
 * part as the front-end read it from Inference-Header-Content-Length (not
 * stated: the whole body is JSON).  Returns 0, or ERR_BAD_REQUEST with err
 * naming the header when it is not a decimal integer or points past the body. */
int v2_body_split(const char *body, size_t len, api_length header_length, v2_body *out,
                  attn_error *err);

/* Checks that the inputs claimed every byte of the binary section.  Returns 0
 * or ERR_BAD_REQUEST. */
int v2_body_check_consumed(const v2_body *body, attn_error *err);

/* Bytes of one element of datatype t: 4, 8, 1 or 2. */
size_t v2_datatype_size(v2_datatype t);

/* The protocol's name of t ("FP32", "FP64", "BOOL", "FP16", "BF16"). */
const char *v2_datatype_name(v2_datatype t);

/* The float datatype named s (FP32, FP64, FP16, BF16) into *t; 0, or -1 when
 * s names none of them. */
int v2_datatype_float(const char *s, v2_datatype *t);

/* Fills out with what the JSON object input (borrowed: out borrows from
 * it) holds in each field v2_tensor_describe reads, whatever their kinds:
 * the HTTP body's side of a request's inputs (api_infer.h). */
void v2_tensor_input_from_json(const json_t *input, api_infer_input *out);

/* Describes inputs[index] (the fields `input`, from any wire) into t: its
 * name, a datatype among FP32, FP64, FP16, BF16 and BOOL, a shape of 1 to
 * V2_MAX_RANK dimensions each >= 1, and where its numbers are.  With
 * parameters.binary_data_size the size must equal the shape times the
 * element size, and the bytes are input->bytes or else the next bytes of
 * body, claimed for it.  Adds the element
 * count to *elements and fails with ERR_TOO_LARGE past max_elements (before
 * anything is allocated).  Returns 0, or a negative ERR_* code with err
 * naming the field (inputs[i].shape, inputs[i].datatype, ...). */
int v2_tensor_describe(const api_infer_input *input, size_t index, v2_body *body,
                       size_t max_elements, size_t *elements, v2_tensor *t, attn_error *err);

/* 1 when the member called name[0..len) holds a tensor's JSON numbers
 * ("data"): what json_fast_load is given for a v2 header. */
int v2_tensor_data_field(const char *name, size_t len);

/* Reads the numbers of t (FP32, FP64, FP16 or BF16) into out (t->count doubles,
 * caller's buffer): JSON data flat in row-major order or nested as the shape says,
 * rounded to nearest even for FP16 and BF16 (a number that rounds to Inf is
 * refused); binary bytes as little-endian IEEE numbers, 16-bit ones widened
 * exactly.  NaN and Inf are refused.  Returns 0 or ERR_BAD_REQUEST naming the
 * element; out is then partly written. */
int v2_tensor_read_numbers(const v2_tensor *t, double *out, attn_error *err);

/* Reads the numbers of t, binary FP32, FP16 or BF16 data (t->bytes set), into out
 * (t->count floats, caller's buffer): FP32 as they are, FP16 and BF16 widened
 * exactly; what a float32 job computes on, with no double in between.  NaN and Inf
 * are refused as by v2_tensor_read_numbers. */
int v2_tensor_read_floats(const v2_tensor *t, float *out, attn_error *err);

/* The numbers of t, binary FP32 data, read where they are: *view is t->bytes
 * itself when the machine is little-endian and the bytes lie on a float's
 * alignment (http_body.c places a v2 body so that its binary section starts on
 * a cache line), after the same refusal of NaN and Inf; otherwise *view is
 * NULL, nothing is read, and the caller copies with v2_tensor_read_floats.
 * The view lives as long as the body.  Returns 0 or ERR_BAD_REQUEST. */
int v2_tensor_view_floats(const v2_tensor *t, const float **view, attn_error *err);

/* Reads the booleans of t (BOOL) into out (t->count bytes of 0 or 1).  JSON
 * data holds true/false; binary data one byte per element, 0 or 1.  Returns 0
 * or ERR_BAD_REQUEST naming the element. */
int v2_tensor_read_bools(const v2_tensor *t, unsigned char *out, attn_error *err);

/* The numbers of one float output, to be written in a datatype the request
 * chose: n of them, held as float (f32) or as double (f64; f32 NULL).  Every
 * float output of an answer is written through the two writers below, so
 * that each datatype is encoded in one place.  Borrowed. */
typedef struct v2_numbers {
    const float *f32;
    const double *f64;
    size_t n;
} v2_numbers;

/* x's number i, as a double (exact). */
double v2_numbers_get(const v2_numbers *x, size_t i);

/* Writes x's numbers at dst as little-endian t (FP32, FP64, FP16 or BF16),
 * rounded to nearest even where t is narrower (room for x->n *
 * v2_datatype_size(t) bytes).  Float numbers written as FP32 are their own
 * bytes.  Returns the index of the first number that is finite but became Inf
 * in t (past FP16's 65504, BF16's or FP32's largest), or x->n when none did:
 * bytes with such a number are not to be sent. */
size_t v2_numbers_write_binary(unsigned char *dst, const v2_numbers *x, v2_datatype t);

/* Appends x's numbers to w as a flat JSON array: each rounded to t as
 * v2_numbers_write_binary rounds it, in the shortest form that reads back to
 * the same number of t (FP64: the same double; the others: the same float,
 * which is the same 16-bit number).  Returns as v2_numbers_write_binary does
 * (the text is then not to be sent). */
size_t v2_numbers_write_json(jw_buf *w, const v2_numbers *x, v2_datatype t);

#endif

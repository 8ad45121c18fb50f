/*
 * safetensors.h - reading and writing the safetensors file format.
 *
 * A safetensors file is an 8-byte little-endian header length n, n bytes of
 * a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}}
 * with an optional "__metadata__" object of strings, then the data: every
 * tensor row-major and little-endian at [begin, end) of the bytes that
 * follow the header.  Parsing checks every rule the format sets (the header
 * inside the body, a JSON object, a known dtype, shape x dtype size equal to
 * the span, spans inside the data and not overlapping) and keeps pointers
 * into the caller's buffer, so a file is read once and never copied whole.
 * F64, F32, F16 and BF16 tensors can be read; all of them widen to double
 * exactly.  The writer makes files of F64 and F32 tensors.
 *
 * This module knows nothing of HTTP or of weights; errors follow error.h
 * (400 "invalid_safetensors" or "unsupported_dtype", field "body").
 */
#ifndef ATTN_SAFETENSORS_H
#define ATTN_SAFETENSORS_H

#include <stddef.h>

#include "core/error.h"

/* The most dimensions a tensor may have here. */
#define SAFETENSORS_MAX_DIMS 8u

typedef enum { SAFETENSORS_F64, SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16 } st_dtype;

typedef struct st_tensor {
    const char *name;               /* borrowed from the st_file's header */
    st_dtype dtype;
    size_t ndim;
    size_t shape[SAFETENSORS_MAX_DIMS];
    size_t count;                   /* elements: the product of shape */
    const unsigned char *data;      /* borrowed from the parsed buffer */
} st_tensor;

typedef struct st_file {
    st_tensor *tensors;             /* sorted by name; owned */
    size_t count;
    void *header;                   /* the parsed JSON header (owns the names) */
} st_file;

/* Parses buf[0..len) (borrowed: the tensors point into it, so it must
 * outlive *f).  Returns 0 with *f filled, which the caller frees with
 * safetensors_free, or ERR_BAD_REQUEST (a fault of the file, named in the
 * message) or ERR_UNAVAILABLE (out of memory) with err filled and *f zeroed. */
int safetensors_parse(const void *buf, size_t len, st_file *f, attn_error *err);

/* The header length that buf[0..len) declares in its first 8 bytes, or 0
 * when it has fewer: what a caller may check before anything is parsed. */
unsigned long long safetensors_header_length(const void *buf, size_t len);

/* Frees what safetensors_parse made (f may be NULL) and zeroes it. */
void safetensors_free(st_file *f);

/* The tensor named name (borrowed), or NULL. */
const st_tensor *safetensors_find(const st_file *f, const char *name);

/* Bytes of one element of t. */
size_t safetensors_elem_size(const st_tensor *t);

/* Element i (row-major) of t, widened exactly to double. */
double safetensors_get(const st_tensor *t, size_t i);

/* One tensor to write, F64 from data or F32 from data_f32 (the other NULL): a
 * vector (rows 0) or a matrix. */
typedef struct st_out {
    const char *name;
    size_t rows, cols;              /* rows 0: a vector of cols elements */
    const double *data;             /* borrowed: an F64 tensor */
    const float *data_f32;          /* borrowed: an F32 tensor, when data is NULL */
} st_out;

/* Writes tensors[0..count) as a safetensors file, with __metadata__
 * holding the pairs meta[0..2*meta_count) (key, value, key, value...).
 * Returns the file, which the caller frees with mem_free, with *len its
 * size, or NULL when memory runs out or the size overflows. */
unsigned char *safetensors_write(const st_out *tensors, size_t count, const char *const *meta,
                                 size_t meta_count, size_t *len);

#endif

/*
 * v2_tensor.c - framing of v2 bodies and decoding/encoding of one tensor.
 *
 * A tensor is described first (name, datatype, shape, where its numbers are)
 * without reading a number, so the caller can check shapes against each
 * other and against the limits before it allocates.  Binary numbers are then
 * read as little-endian IEEE numbers and checked to be finite: copied, or,
 * for FP32 bytes on a float's alignment, used where they are in the body.
 * FP16 and BF16 numbers are widened to float (core/half.h), exactly; JSON
 * numbers of an FP16 or BF16 input are rounded to the datatype first, as if
 * the client had converted them.
 *
 * Outputs are written by one encoder (v2_numbers_*) for every datatype,
 * whether the numbers are held as float or as double.
 */
#include "v2_tensor.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "json/json_in.h"
#include "core/mem.h"

int v2_body_split(const char *body, size_t len, api_length header_length, v2_body *out,
                  attn_error *err)
{
    memset(out, 0, sizeof *out);
    out->json = body;
    out->json_len = len;
    if (header_length.stated == 0)
        return 0;
    unsigned long long n = header_length.bytes;
    if (header_length.stated < 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "Inference-Header-Content-Length",
                         "The header Inference-Header-Content-Length is not a decimal integer; "
                         "it must be the byte length of the JSON part of the body.");
    if (n > len)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "Inference-Header-Content-Length",
                         "The header Inference-Header-Content-Length says the JSON part has %llu "
                         "bytes but the whole body has only %zu.", n, len);
    out->json_len = (size_t)n;
    out->bin = (const unsigned char *)body + n;
    out->bin_len = len - (size_t)n;
    return 0;
}

int v2_body_check_consumed(const v2_body *body, attn_error *err)
{
    if (body->bin_used != body->bin_len)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "Inference-Header-Content-Length",
                         "The body has %zu bytes after the JSON part (Inference-Header-Content-"
                         "Length) but the inputs' parameters.binary_data_size add up to %zu; "
                         "they must be equal.", body->bin_len, body->bin_used);
    return 0;
}

/* The datatypes this server reads and writes, by v2_datatype. */
static const struct {
    const char *name;
    size_t size;
} datatypes[] = {[V2_FP32] = {"FP32", 4}, [V2_FP64] = {"FP64", 8}, [V2_BOOL] = {"BOOL", 1},
                 [V2_FP16] = {"FP16", 2}, [V2_BF16] = {"BF16", 2}};

size_t v2_datatype_size(v2_datatype t)
{
    return datatypes[t].size;
}

const char *v2_datatype_name(v2_datatype t)
{
    return datatypes[t].name;
}

int v2_datatype_float(const char *s, v2_datatype *t)
{
    static const v2_datatype floats[] = {V2_FP32, V2_FP64, V2_FP16, V2_BF16};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (strcmp(s, datatypes[floats[i]].name) == 0) {
            *t = floats[i];
            return 0;
        }
    return -1;
}

/* Datatypes the protocol defines that this server does not take as input. */
static int is_protocol_datatype(const char *s)
{
    static const char *const known[] = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                        "INT32", "INT64", "BYTES"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(s, known[i]) == 0)
            return 1;
    return 0;
}

/* "inputs[INDEX]" followed by what (e.g. ".name", or "" for the input itself) in field, which
 * it returns: for the error paths only.  Formatting every input's field names before any
 * check, as this file once did, cost a tenth of a small request's instructions. */
static const char *input_field(char *field, size_t len, size_t index, const char *what)
{
    snprintf(field, len, "inputs[%zu]%s", index, what);
    return field;
}

/* Reads parameters.binary_data_size of input (absent: *present = 0). */
static int read_binary_size(const api_infer_input *input, size_t index, int *present,
                            size_t *size, attn_error *err)
{
    char field[64];
    *present = 0;
    if (input->parameters.kind == SCALAR_ABSENT)
        return 0;
    if (input->parameters.kind != SCALAR_OBJECT)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                         input_field(field, sizeof field, index, ".parameters"),
                         "%s must be an object.", field);
    if (input->binary_data_size.kind == SCALAR_ABSENT)
        return 0;
    double bytes;
    if (!scalar_whole(&input->binary_data_size, 0, 9007199254740992.0, &bytes))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                         input_field(field, sizeof field, index, ".parameters.binary_data_size"),
                         "%s must be a non-negative integer (the byte count of the input's "
                         "binary data).", field);
    *present = 1;
    *size = (size_t)bytes;
    return 0;
}

/* The name of the input: 1 to sizeof t->name - 1 characters. */
static int describe_name(const api_infer_input *input, v2_tensor *t, attn_error *err)
{
    char field[64];
    const scalar *name = &input->name;
    if (name->kind != SCALAR_STRING || name->size == 0 || name->size >= sizeof t->name)
        return error_set(err, ERR_BAD_REQUEST,
                         name->kind == SCALAR_ABSENT ? "missing_field" : "wrong_type",
                         input_field(field, sizeof field, t->index, ".name"),
                         "%s must be the input's name, a string of 1 to %zu characters.", field,
                         sizeof t->name - 1);
    memcpy(t->name, name->string, name->size + 1);
    return 0;
}

/* The datatype: FP32, FP64, FP16, BF16 or BOOL. */
static int describe_datatype(const api_infer_input *input, v2_tensor *t, attn_error *err)
{
    char field[64];
    const scalar *dt = &input->datatype;
    if (dt->kind != SCALAR_STRING)
        return error_set(err, ERR_BAD_REQUEST,
                         dt->kind == SCALAR_ABSENT ? "missing_field" : "wrong_type",
                         input_field(field, sizeof field, t->index, ".datatype"),
                         "%s (input \"%s\") must be a string: FP32, FP64, FP16, BF16 or BOOL.",
                         field, t->name);
    const char *dts = dt->string;
    if (strcmp(dts, "BOOL") == 0)
        t->datatype = V2_BOOL;
    else if (v2_datatype_float(dts, &t->datatype) != 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                         input_field(field, sizeof field, t->index, ".datatype"),
                         "%s (input \"%s\") is \"%.20s\", %s; this server takes FP32, FP64, "
                         "FP16, BF16 and BOOL.", field, t->name, dts,
                         is_protocol_datatype(dts) ? "which this server does not take"
                                                   : "which is not a datatype of the protocol");
    return 0;
}

/* The shape: 1 to V2_MAX_RANK dimensions, each >= 1; its element count,
 * added to *elements, must stay within max_elements. */
static int describe_shape(const api_infer_input *input, size_t max_elements, size_t *elements,
                          v2_tensor *t, attn_error *err)
{
    char field[64];
    const scalar *shape = &input->shape;
    if (shape->kind != SCALAR_ARRAY)
        return error_set(err, ERR_BAD_REQUEST,
                         shape->kind == SCALAR_ABSENT ? "missing_field" : "wrong_type",
                         input_field(field, sizeof field, t->index, ".shape"),
                         "%s (input \"%s\") must be an array of dimensions.", field, t->name);
    size_t rank = shape->size;
    if (rank < 1 || rank > V2_MAX_RANK)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape",
                         input_field(field, sizeof field, t->index, ".shape"),
                         "%s (input \"%s\") has %zu dimensions; it must have 1 to %d.", field,
                         t->name, rank, V2_MAX_RANK);
    t->rank = rank;
    size_t count = 1;
    for (size_t i = 0; i < rank; i++) {
        double dv;
        if (!scalar_whole(&input->dims[i], 1, HUGE_VAL, &dv))
            return error_set(err, ERR_BAD_REQUEST, "invalid_shape",
                             input_field(field, sizeof field, t->index, ".shape"),
                             "%s[%zu] (input \"%s\") must be an integer >= 1.", field, i, t->name);
        /* A dimension past what size_t holds makes the count too large. */
        size_t v = dv < 18446744073709549568.0 ? (size_t)dv : SIZE_MAX;
        if (v == SIZE_MAX || mem_mul(count, v, 1, &count) != 0)
            count = SIZE_MAX;
        t->dims[i] = v;
    }
    t->count = count;
    if (count > max_elements || *elements + count > max_elements)
        return error_set(err, ERR_TOO_LARGE, "request_too_large",
                         input_field(field, sizeof field, t->index, ".shape"),
                         "The inputs hold more than the server's limit of %zu numbers "
                         "(--max-elements) once %s (input \"%s\") is counted; send fewer tokens.",
                         max_elements, field, t->name);
    *elements += count;
    return 0;
}

/* Claims the `size` bytes of t's binary data, which must be what its shape
 * and datatype need: where the input says they are, or the next bytes of the
 * binary section. */
static int claim_binary(const api_infer_input *input, size_t size, v2_body *body, v2_tensor *t,
                        attn_error *err)
{
    char field[64];
    if (input->data.kind != SCALAR_ABSENT)
        return error_set(err, ERR_BAD_REQUEST, "conflicting_fields",
                         input_field(field, sizeof field, t->index, ".data"),
                         "Input \"%s\" has both data and parameters.binary_data_size; give "
                         "its numbers one way.", t->name);
    size_t want = t->count * v2_datatype_size(t->datatype);
    if (size != want)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         input_field(field, sizeof field, t->index, ".parameters.binary_data_size"),
                         "%s of input \"%s\" is %zu but its shape and datatype %s need %zu "
                         "bytes.", field, t->name, size, v2_datatype_name(t->datatype), want);
    if (input->bytes != NULL) { /* the front-end holds them apart, size of them */
        t->bytes = input->bytes;
        return 0;
    }
    size_t left = body->bin_len - body->bin_used;
    if (size > left)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         input_field(field, sizeof field, t->index, ".parameters.binary_data_size"),
                         "%s of input \"%s\" is %zu but only %zu bytes of binary data are "
                         "left after the JSON part and the inputs before it.", field, t->name,
                         size, left);
    t->bytes = body->bin + body->bin_used;
    body->bin_used += size;
    return 0;
}

/* Where the numbers are: binary bytes (parameters.binary_data_size) or a
 * JSON array "data". */
static int describe_data(const api_infer_input *input, v2_body *body, v2_tensor *t,
                         attn_error *err)
{
    char field[64];
    int binary;
    size_t size = 0;
    int rc = read_binary_size(input, t->index, &binary, &size, err);
    if (rc != 0)
        return rc;
    if (binary)
        return claim_binary(input, size, body, t, err);
    if (input->data.kind == SCALAR_ABSENT)
        return error_set(err, ERR_BAD_REQUEST, "missing_field",
                         input_field(field, sizeof field, t->index, ".data"),
                         "Input \"%s\" has neither data nor parameters.binary_data_size.", t->name);
    if (input->data.kind != SCALAR_ARRAY || input->data_json == NULL)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                         input_field(field, sizeof field, t->index, ".data"),
                         "%s (input \"%s\") must be an array, flat in row-major order or nested "
                         "as the shape says.", field, t->name);
    t->data = input->data_json;
    return 0;
}

/* The member key of obj, or absent when obj is no object. */
static scalar member_of(const json_t *obj, const char *key)
{
    return json_in_scalar(json_is_object(obj) ? json_object_get(obj, key) : NULL);
}

void v2_tensor_input_from_json(const json_t *in, api_infer_input *t)
{
    memset(t, 0, sizeof *t);
    t->self = json_in_scalar(in);
    t->name = member_of(in, "name");
    t->datatype = member_of(in, "datatype");
    const json_t *shape = json_is_object(in) ? json_object_get(in, "shape") : NULL;
    t->shape = json_in_scalar(shape);
    for (size_t d = 0; d < API_INFER_MAX_RANK && d < json_array_size(shape); d++)
        t->dims[d] = json_in_scalar(json_array_get(shape, d));
    const json_t *params = json_is_object(in) ? json_object_get(in, "parameters") : NULL;
    t->parameters = json_in_scalar(params);
    t->binary_data_size = member_of(params, "binary_data_size");
    const json_t *data = json_is_object(in) ? json_object_get(in, "data") : NULL;
    t->data = json_in_scalar(data);
    t->data_json = data;
}

int v2_tensor_describe(const api_infer_input *input, size_t index, v2_body *body,
                       size_t max_elements, size_t *elements, v2_tensor *t, attn_error *err)
{
    memset(t, 0, sizeof *t);
    t->index = index;
    if (input->self.kind != SCALAR_OBJECT) {
        char field[64];
        snprintf(field, sizeof field, "inputs[%zu]", index);
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", field,
                         "%s must be an object with name, shape, datatype and data.", field);
    }
    int rc;
    if ((rc = describe_name(input, t, err)) != 0 || (rc = describe_datatype(input, t, err)) != 0 ||
        (rc = describe_shape(input, max_elements, elements, t, err)) != 0)
        return rc;
    return describe_data(input, body, t, err);
}

/* "inputs[INDEX].data[i][j]..." for the element at idx[0..depth) in field (len bytes), which
 * it returns: for the error paths only, as input_field. */
static const char *data_field(char *field, size_t len, size_t index, const size_t *idx,
                              size_t depth)
{
    int used = snprintf(field, len, "inputs[%zu].data", index);
    for (size_t d = 0; d < depth && used > 0 && (size_t)used < len; d++)
        used += snprintf(field + used, len - (size_t)used, "[%zu]", idx[d]);
    return field;
}

/* One JSON element, at idx[0..depth) of the data, into num[pos] (FP) or flag[pos] (BOOL). */
static int read_leaf(const v2_tensor *t, const json_t *v, size_t pos, double *num,
                     unsigned char *flag, const size_t *idx, size_t depth, attn_error *err)
{
    char field[128];
    if (t->datatype == V2_BOOL) {
        if (json_is_boolean(v)) {
            flag[pos] = json_is_true(v);
            return 0;
        }
        return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                         data_field(field, sizeof field, t->index, idx, depth),
                         "%s (input \"%s\", BOOL) must be true or false.", field, t->name);
    }
    if (json_is_number(v)) {
        num[pos] = json_number_value(v);
        return 0;
    }
    return error_set(err, ERR_BAD_REQUEST, "wrong_type",
                     data_field(field, sizeof field, t->index, idx, depth),
                     "%s (input \"%s\", %s) must be a number.", field, t->name,
                     v2_datatype_name(t->datatype));
}

/* Walks nested JSON data at depth `depth` (idx[0..depth) the indices that led here),
 * checking each level against the shape, writing leaves in row-major order at *pos. */
static int read_nested(const v2_tensor *t, const json_t *v, size_t depth, size_t *idx,
                       size_t *pos, double *num, unsigned char *flag, attn_error *err)
{
    if (depth == t->rank) {
        int rc = read_leaf(t, v, *pos, num, flag, idx, depth, err);
        (*pos)++;
        return rc;
    }
    if (!json_is_array(v) || json_array_size(v) != t->dims[depth]) {
        char field[128];
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch",
                         data_field(field, sizeof field, t->index, idx, depth),
                         "%s (input \"%s\") must be an array of %zu (its shape says so), or the "
                         "data must be flat with %zu elements.", field, t->name, t->dims[depth],
                         t->count);
    }
    for (size_t i = 0; i < t->dims[depth]; i++) {
        idx[depth] = i;
        int rc = read_nested(t, json_array_get(v, i), depth + 1, idx, pos, num, flag, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int v2_tensor_data_field(const char *name, size_t len)
{
    return len == 4 && memcmp(name, "data", 4) == 0;
}

/* JSON data, flat or nested, into num (FP) or flag (BOOL). */
static int read_json(const v2_tensor *t, double *num, unsigned char *flag, attn_error *err)
{
    const json_t *d = t->data;
    const json_fast_array *a = json_fast_get(d);
    json_t *tree = NULL;
    if (a != NULL) {
        /* Read without jansson (json_fast.h): copied when it is flat or
         * nested as the shape says; else decoded from the tree, for its error. */
        int fits = num != NULL && (a->depth == 1 || a->depth == (int)t->rank) &&
                   a->count == t->count;
        for (size_t i = 0; fits && a->depth > 1 && i < t->rank; i++)
            fits = a->dims[i] == t->dims[i];
        if (fits) {
            memcpy(num, a->data, a->count * sizeof(double));
            return 0;
        }
        if ((tree = json_fast_materialize(a)) == NULL)
            return error_nomem(err);
        d = tree;
    }
    size_t n = json_array_size(d);
    if (n == t->count && (n == 0 || !json_is_array(json_array_get(d, 0)))) {
        for (size_t i = 0; i < n; i++) {
            int rc = read_leaf(t, json_array_get(d, i), i, num, flag, &i, 1, err);
            if (rc != 0) {
                json_decref(tree);
                return rc;
            }
        }
        json_decref(tree);
        return 0;
    }
    size_t pos = 0, idx[V2_MAX_RANK];
    int rc = read_nested(t, d, 0, idx, &pos, num, flag, err);
    json_decref(tree);
    return rc;
}

static inline uint32_t load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t load_le64(const unsigned char *p)
{
    return (uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32;
}

static int not_finite(const v2_tensor *t, size_t i, attn_error *err)
{
    char field[64];
    snprintf(field, sizeof field, "inputs[%zu]", t->index);
    return error_set(err, ERR_BAD_REQUEST, "not_finite", field,
                     "%s (input \"%s\") holds %s at element %zu of its binary data; every number "
                     "must be finite.", field, t->name, "NaN or Inf", i);
}

/* Binary numbers as the machine holds them.  On a little-endian machine the
 * bytes are the numbers: they are copied (or used where they are, by
 * v2_tensor_view_floats) 16 bytes at a time, and the test for Inf and NaN is
 * one OR over the lot, so that the first such number is looked for only when
 * there is one.  (Per-number compares, as before, are a loop GCC's -O2 leaves
 * scalar.)  Elsewhere the numbers are assembled byte by byte. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define V2_HOST_LE 1
typedef uint64_t v2_u64x2 __attribute__((vector_size(16)));
#else
#define V2_HOST_LE 0
#endif

/* Inf and NaN have every exponent bit set, and (bits & exponent) + one unit of the
 * exponent carries into the sign bit exactly then.  A 64-bit word holds one FP64 or two
 * FP32 numbers; each FP32 half carries into its own sign bit (0x7f800000 + 0x00800000 is
 * 0x80000000: nothing carries out), so one test serves a word of either width. */
typedef struct fp_bits {
    uint64_t exponent, unit, sign;
} fp_bits;
static const fp_bits fp32_bits = {0x7f8000007f800000ull, 0x0080000000800000ull,
                                  0x8000000080000000ull};
static const fp_bits fp64_bits = {0x7ff0000000000000ull, 0x0010000000000000ull,
                                  0x8000000000000000ull};

/* The sign bits of b set where the numbers in w are Inf or NaN. */
static inline uint64_t fp_nonfinite(uint64_t w, const fp_bits *b)
{
    return ((w & b->exponent) + b->unit) & b->sign;
}

/* Copies the n numbers of `size` bytes (4: FP32, 8: FP64) at p, little-endian, into out
 * in the machine's order (NULL: only tests them); 1 when every one is finite. */
static int copy_finite(void *out, const unsigned char *p, size_t n, size_t size)
{
    const fp_bits *b = size == 4 ? &fp32_bits : &fp64_bits;
    unsigned char *o = out;
    size_t bytes = n * size, i = 0;
    uint64_t bad = 0;
#if V2_HOST_LE
    v2_u64x2 acc = {0};
    for (; i + sizeof acc <= bytes; i += sizeof acc) {
        v2_u64x2 w;
        memcpy(&w, p + i, sizeof w);
        acc |= (w & b->exponent) + b->unit;
        if (o != NULL)
            memcpy(o + i, &w, sizeof w);
    }
    bad = (acc[0] | acc[1]) & b->sign;
#endif
    for (; i < bytes; i += size) {  /* the rest, a number at a time */
        uint32_t u32 = size == 4 ? load_le32(p + i) : 0;
        uint64_t u = size == 4 ? u32 : load_le64(p + i);
        bad |= fp_nonfinite(u, b);
        if (o != NULL && size == 4)
            memcpy(o + i, &u32, sizeof u32);
        else if (o != NULL)
            memcpy(o + i, &u, sizeof u);
    }
    return bad == 0;
}

/* The first element of t's binary numbers that is NaN or Inf, as its error. */
static int first_not_finite(const v2_tensor *t, attn_error *err)
{
    int fp32 = t->datatype == V2_FP32;
    for (size_t i = 0; i < t->count; i++) {
        uint64_t u = fp32 ? load_le32(t->bytes + 4 * i) : load_le64(t->bytes + 8 * i);
        if (fp_nonfinite(u, fp32 ? &fp32_bits : &fp64_bits))
            return not_finite(t, i, err);
    }
    assert(!"first_not_finite: every number is finite");
    return not_finite(t, 0, err);
}

static inline uint16_t load_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* The float of a 16-bit pattern of datatype t (FP16 or BF16). */
static inline float widen16(uint16_t u, v2_datatype t)
{
    return t == V2_FP16 ? half_fp16_to_float(u) : half_bf16_to_float(u);
}

static inline int nonfinite16(uint16_t u, v2_datatype t)
{
    return t == V2_FP16 ? half_fp16_is_nonfinite(u) : half_bf16_is_nonfinite(u);
}

/* d rounded to t (FP16 or BF16), nearest even. */
static inline uint16_t narrow16(double d, v2_datatype t)
{
    return t == V2_FP16 ? half_fp16_from_double(d) : half_bf16_from_double(d);
}

/* Binary FP16 or BF16 numbers of t widened into out (float, or double when
 * out64 is set); NaN and Inf refused. */
static int read_binary16(const v2_tensor *t, float *out32, double *out64, attn_error *err)
{
    for (size_t i = 0; i < t->count; i++) {
        uint16_t u = load_le16(t->bytes + 2 * i);
        if (nonfinite16(u, t->datatype))
            return not_finite(t, i, err);
        if (out32 != NULL)
            out32[i] = widen16(u, t->datatype);
        else
            out64[i] = widen16(u, t->datatype);
    }
    return 0;
}

/* JSON numbers of an FP16 or BF16 input rounded to it, as the client's own
 * conversion would; one that rounds to Inf is refused, naming its element. */
static int round_json16(const v2_tensor *t, double *out, attn_error *err)
{
    for (size_t i = 0; i < t->count; i++) {
        uint16_t u = narrow16(out[i], t->datatype);
        if (nonfinite16(u, t->datatype)) {
            char field[64];
            snprintf(field, sizeof field, "inputs[%zu].data", t->index);
            return error_set(err, ERR_BAD_REQUEST, "not_finite", field,
                             "%s (input \"%s\", %s) holds %.17g at element %zu (row-major), "
                             "which rounds to Inf in %s; every number must be finite.", field,
                             t->name, v2_datatype_name(t->datatype), out[i], i,
                             v2_datatype_name(t->datatype));
        }
        out[i] = widen16(u, t->datatype);
    }
    return 0;
}

int v2_tensor_read_numbers(const v2_tensor *t, double *out, attn_error *err)
{
    if (t->bytes == NULL) {
        int rc = read_json(t, out, NULL, err);
        if (rc != 0 || (t->datatype != V2_FP16 && t->datatype != V2_BF16))
            return rc;
        return round_json16(t, out, err);
    }
    const unsigned char *p = t->bytes;
    size_t n = t->count;
    if (t->datatype == V2_FP64)
        return copy_finite(out, p, n, 8) ? 0 : first_not_finite(t, err);
    if (t->datatype != V2_FP32)
        return read_binary16(t, NULL, out, err);
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = load_le32(p + 4 * i);
        float f;
        memcpy(&f, &u, sizeof f);
        bad |= fp_nonfinite(u, &fp32_bits);
        out[i] = f;
    }
    return bad != 0 ? first_not_finite(t, err) : 0;
}

int v2_tensor_read_floats(const v2_tensor *t, float *out, attn_error *err)
{
    assert(t->bytes != NULL && t->datatype != V2_FP64 && t->datatype != V2_BOOL);
    if (t->datatype != V2_FP32)
        return read_binary16(t, out, NULL, err);
    return copy_finite(out, t->bytes, t->count, 4) ? 0 : first_not_finite(t, err);
}

int v2_tensor_view_floats(const v2_tensor *t, const float **view, attn_error *err)
{
    assert(t->bytes != NULL && t->datatype == V2_FP32);
    *view = NULL;
    if (!V2_HOST_LE || (uintptr_t)t->bytes % _Alignof(float) != 0)
        return 0;
    if (!copy_finite(NULL, t->bytes, t->count, 4))
        return first_not_finite(t, err);
    *view = (const float *)(const void *)t->bytes;
    return 0;
}

int v2_tensor_read_bools(const v2_tensor *t, unsigned char *out, attn_error *err)
{
    if (t->bytes == NULL)
        return read_json(t, NULL, out, err);
    for (size_t i = 0; i < t->count; i++) {
        if (t->bytes[i] > 1) {
            char field[64];
            snprintf(field, sizeof field, "inputs[%zu]", t->index);
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                             "%s (input \"%s\", BOOL) has the byte %u at element %zu of its "
                             "binary data; BOOL elements are one byte, 0 or 1.", field, t->name,
                             t->bytes[i], i);
        }
        out[i] = t->bytes[i];
    }
    return 0;
}

static inline void store_le32(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static inline void store_le64(unsigned char *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    for (int b = 0; b < 8; b++)
        p[b] = (unsigned char)(u >> (8 * b));
}

double v2_numbers_get(const v2_numbers *x, size_t i)
{
    return x->f32 != NULL ? x->f32[i] : x->f64[i];
}

/* x's number i rounded to t (FP16 or BF16), nearest even: a float straight from
 * float (several times faster than through double, and the same result). */
static inline uint16_t narrow16_at(const v2_numbers *x, size_t i, v2_datatype t)
{
    if (x->f32 != NULL)
        return t == V2_FP16 ? half_fp16_from_float(x->f32[i]) : half_bf16_from_float(x->f32[i]);
    return narrow16(x->f64[i], t);
}

/* x's number i as datatype t writes it, as a double: FP32 and the 16-bit
 * types rounded (nearest even), FP64 as it is.  Inf where a finite number
 * rounds past t's largest. */
static inline double encoded(const v2_numbers *x, size_t i, v2_datatype t)
{
    switch (t) {
    case V2_FP32:
        return x->f32 != NULL ? x->f32[i] : (float)x->f64[i];
    case V2_FP16:
    case V2_BF16:
        return widen16(narrow16_at(x, i, t), t);
    default:
        return v2_numbers_get(x, i);
    }
}

/* 1 when x's number i, finite, became Inf in t (it was past t's largest finite number
 * by half a unit or more); enc is its encoding as a double. */
static inline int overflowed(const v2_numbers *x, size_t i, double enc)
{
    return isinf(enc) && isfinite(v2_numbers_get(x, i));
}

size_t v2_numbers_write_binary(unsigned char *dst, const v2_numbers *x, v2_datatype t)
{
    size_t n = x->n, first = n;
    switch (t) {
    case V2_FP32:
        for (size_t i = 0; i < n; i++) {
            float f = (float)encoded(x, i, t);
            if (first == n && overflowed(x, i, f))
                first = i;
            store_le32(dst + 4 * i, f);
        }
        break;
    case V2_FP16:
    case V2_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t u = narrow16_at(x, i, t);
            if (first == n && nonfinite16(u, t) && isfinite(v2_numbers_get(x, i)))
                first = i;
            dst[2 * i] = (unsigned char)u;
            dst[2 * i + 1] = (unsigned char)(u >> 8);
        }
        break;
    default:
        for (size_t i = 0; i < n; i++)
            store_le64(dst + 8 * i, v2_numbers_get(x, i));
    }
    return first;
}

size_t v2_numbers_write_json(jw_buf *w, const v2_numbers *x, v2_datatype t)
{
    size_t first = x->n;
    jw_char(w, '[');
    for (size_t i = 0; i < x->n; i++) {
        if (i)
            jw_char(w, ',');
        /* every FP32, FP16 and BF16 number is a float: the shortest text of that
         * float reads back to it, and to the same 16-bit number */
        double enc = encoded(x, i, t);
        if (first == x->n && overflowed(x, i, enc)) {
            first = i;
            enc = 0; /* Inf has no JSON form; the caller drops the text */
        }
        if (t == V2_FP64)
            jw_double(w, enc);
        else
            jw_float(w, enc);
    }
    jw_char(w, ']');
    return first;
}

/*
 * safetensors.c - the safetensors parser and writer (see safetensors.h).
 *
 * The header is parsed with jansson; each entry is checked on its own
 * (dtype, shape, offsets, size), then the spans are sorted by their start
 * to find overlaps in one pass.  Values are assembled from bytes, so the
 * code does not depend on the host's byte order.
 */
#include "safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "json/jsonw.h"
#include "core/mem.h"

/* Dtypes of the format this server cannot use, named so that the error
 * says "unsupported" rather than "unknown". */
static const char *const UNSUPPORTED_DTYPES[] = {
    "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F8_E4M3", "F8_E5M2",
    "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64",
};

static const struct { const char *name; st_dtype dtype; size_t size; } DTYPES[] = {
    {"F64", SAFETENSORS_F64, 8}, {"F32", SAFETENSORS_F32, 4},
    {"F16", SAFETENSORS_F16, 2}, {"BF16", SAFETENSORS_BF16, 2},
};

/* A fault of the file: 400 invalid_safetensors on the body. */
#define BAD(err, ...) error_set(err, ERR_BAD_REQUEST, "invalid_safetensors", "body", __VA_ARGS__)

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Reads a JSON whole number >= 0 that fits size_t; -1 when v is not one. */
static int json_size(const json_t *v, size_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (size_t)json_integer_value(v);
    return 0;
}

/* Fills t's dtype from the header entry's "dtype". */
static int read_dtype(const json_t *entry, st_tensor *t, size_t *size, attn_error *err)
{
    const char *dtype = json_string_value(json_object_get(entry, "dtype"));
    if (dtype == NULL)
        return BAD(err, "Tensor \"%.80s\" has no \"dtype\" string in the header.",
                   t->name);
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (!strcmp(dtype, DTYPES[i].name)) {
            t->dtype = DTYPES[i].dtype;
            *size = DTYPES[i].size;
            return 0;
        }
    int known = 0;
    for (size_t i = 0; i < sizeof UNSUPPORTED_DTYPES / sizeof UNSUPPORTED_DTYPES[0]; i++)
        known |= !strcmp(dtype, UNSUPPORTED_DTYPES[i]);
    return error_set(err, ERR_BAD_REQUEST, "unsupported_dtype", "body",
                     "Tensor \"%.80s\" has dtype \"%.20s\", %s; weights must be F64, F32, F16 or "
                     "BF16.", t->name, dtype, known ? "which this server does not read"
                                                    : "which the format does not define");
}

/* Checks one header entry and fills t from it; data_len is the size of the
 * data part, data its start.  *begin and *end receive the span. */
static int read_entry(const json_t *entry, const unsigned char *data, size_t data_len,
                      st_tensor *t, size_t *begin, size_t *end, attn_error *err)
{
    if (!json_is_object(entry))
        return BAD(err, "Header entry \"%.80s\" is not an object.", t->name);
    size_t elem = 0;
    int rc = read_dtype(entry, t, &elem, err);
    if (rc != 0)
        return rc;
    const json_t *shape = json_object_get(entry, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return BAD(err, "Tensor \"%.80s\" needs a \"shape\" array of at most %zu whole "
                   "numbers.", t->name, (size_t)SAFETENSORS_MAX_DIMS);
    t->ndim = json_array_size(shape);
    t->count = 1;
    for (size_t d = 0; d < t->ndim; d++) {
        if (json_size(json_array_get(shape, d), &t->shape[d]) != 0 ||
            mem_mul(t->count, t->shape[d], 1, &t->count) != 0)
            return BAD(err, "Tensor \"%.80s\": dimension %zu of its shape is not a whole number "
                       ">= 0, or the shape is too large.", t->name, d);
    }
    const json_t *offs = json_object_get(entry, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        json_size(json_array_get(offs, 0), begin) != 0 ||
        json_size(json_array_get(offs, 1), end) != 0 || *begin > *end)
        return BAD(err, "Tensor \"%.80s\" needs \"data_offsets\" [begin, end] with 0 <= begin "
                   "<= end.", t->name);
    if (*end > data_len)
        return BAD(err, "Tensor \"%.80s\" ends at byte %zu of the data, which has only %zu "
                   "bytes: the file is truncated or its offsets are wrong.", t->name, *end,
                   data_len);
    size_t bytes;
    if (mem_mul(t->count, elem, 1, &bytes) != 0 || bytes != *end - *begin)
        return BAD(err, "Tensor \"%.80s\": its shape and dtype make %zu bytes but its "
                   "data_offsets span %zu.", t->name, bytes, *end - *begin);
    t->data = data + *begin;
    return 0;
}

typedef struct span { size_t begin, end; const char *name; } span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* Checks that no two non-empty spans share a byte. */
static int check_overlaps(span *spans, size_t n, attn_error *err)
{
    qsort(spans, n, sizeof *spans, span_cmp);
    size_t reach = 0;
    const char *last = NULL;
    for (size_t i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end)
            continue;
        if (last != NULL && spans[i].begin < reach)
            return error_set(err, ERR_BAD_REQUEST, "invalid_safetensors", "body",
                             "The data of tensors \"%.80s\" and \"%.80s\" overlap.", last,
                             spans[i].name);
        reach = spans[i].end;
        last = spans[i].name;
    }
    return 0;
}

/* Reads every tensor entry of the header object into f (header is f's). */
static int read_entries(json_t *header, const unsigned char *data, size_t data_len, st_file *f,
                        attn_error *err)
{
    size_t n = json_object_size(header);
    f->tensors = mem_calloc(n ? n : 1, sizeof *f->tensors);
    span *spans = mem_calloc(n ? n : 1, sizeof *spans);
    if (f->tensors == NULL || spans == NULL) {
        mem_free(spans);
        return error_nomem(err);
    }
    const char *key;
    json_t *value;
    int rc = 0;
    json_object_foreach(header, key, value) {
        if (!strcmp(key, "__metadata__")) {
            const char *mkey;
            json_t *mval;
            if (!json_is_object(value))
                rc = BAD(err, "\"__metadata__\" must be an object of strings.");
            else
                json_object_foreach(value, mkey, mval) {
                    if (rc == 0 && !json_is_string(mval))
                        rc = BAD(err, "\"__metadata__\" member \"%.80s\" is not a string.",
                                 mkey);
                }
            if (rc != 0)
                break;
            continue;
        }
        st_tensor *t = &f->tensors[f->count];
        t->name = key;
        span *s = &spans[f->count];
        s->name = key;
        if ((rc = read_entry(value, data, data_len, t, &s->begin, &s->end, err)) != 0)
            break;
        f->count++;
    }
    if (rc == 0)
        rc = check_overlaps(spans, f->count, err);
    mem_free(spans);
    if (rc == 0)
        qsort(f->tensors, f->count, sizeof *f->tensors, tensor_cmp);
    return rc;
}

int safetensors_parse(const void *buf, size_t len, st_file *f, attn_error *err)
{
    memset(f, 0, sizeof *f);
    const unsigned char *bytes = buf;
    if (len < 8)
        return BAD(err, "The body has %zu bytes, fewer than the 8 of a safetensors header "
                   "length.", len);
    uint64_t n = read_le64(bytes);
    if (n > len - 8)
        return error_set(err, ERR_BAD_REQUEST, "invalid_safetensors", "body",
                         "The header length is %llu bytes, past the end of the body (%zu bytes "
                         "follow it): the file is truncated or not safetensors.",
                         (unsigned long long)n, len - 8);
    json_error_t jerr;
    memset(&jerr, 0, sizeof jerr); /* not always filled when allocation fails */
    json_t *header = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    /* jansson leaves the text empty when it fails to allocate before it
     * starts reading. */
    if (header == NULL && (json_error_code(&jerr) == json_error_out_of_memory || !jerr.text[0]))
        return error_nomem(err);
    if (header == NULL)
        return error_set(err, ERR_BAD_REQUEST, "invalid_safetensors", "body",
                         "The safetensors header is not JSON (%.200s, at byte %d of it).",
                         jerr.text, jerr.position);
    if (!json_is_object(header)) {
        json_decref(header);
        return BAD(err, "The safetensors header is JSON but not an object.");
    }
    f->header = header;
    int rc = read_entries(header, bytes + 8 + n, len - 8 - (size_t)n, f, err);
    if (rc != 0)
        safetensors_free(f);
    return rc;
}

unsigned long long safetensors_header_length(const void *buf, size_t len)
{
    return len < 8 ? 0 : (unsigned long long)read_le64(buf);
}

void safetensors_free(st_file *f)
{
    if (f == NULL)
        return;
    mem_free(f->tensors);
    json_decref(f->header);
    memset(f, 0, sizeof *f);
}

const st_tensor *safetensors_find(const st_file *f, const char *name)
{
    st_tensor key;
    key.name = name;
    return bsearch(&key, f->tensors, f->count, sizeof *f->tensors, tensor_cmp);
}

size_t safetensors_elem_size(const st_tensor *t)
{
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (DTYPES[i].dtype == t->dtype)
            return DTYPES[i].size;
    return 0;
}

double safetensors_get(const st_tensor *t, size_t i)
{
    const unsigned char *p;
    switch (t->dtype) {
    case SAFETENSORS_F64: {
        p = t->data + i * 8;
        uint64_t bits = read_le64(p);
        double v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    case SAFETENSORS_F32: {
        p = t->data + i * 4;
        uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                        (uint32_t)p[3] << 24;
        float v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    case SAFETENSORS_BF16:
        p = t->data + i * 2;
        return half_bf16_to_float((uint16_t)(p[0] | p[1] << 8));
    default:
        p = t->data + i * 2;
        return half_fp16_to_float((uint16_t)(p[0] | p[1] << 8));
    }
}

static size_t out_elem_size(const st_out *t)
{
    return t->data != NULL ? 8 : 4;
}

/* Writes the header object of the tensors and metadata into w. */
static void write_header(jw_buf *w, const st_out *tensors, size_t count, const char *const *meta,
                         size_t meta_count)
{
    jw_char(w, '{');
    if (meta_count > 0) {
        jw_raw(w, "\"__metadata__\":{");
        for (size_t i = 0; i < meta_count; i++) {
            if (i)
                jw_char(w, ',');
            jw_string(w, meta[2 * i]);
            jw_char(w, ':');
            jw_string(w, meta[2 * i + 1]);
        }
        jw_char(w, '}');
    }
    size_t offset = 0;
    for (size_t i = 0; i < count; i++) {
        const st_out *t = &tensors[i];
        size_t n = (t->rows ? t->rows : 1) * t->cols;
        if (i || meta_count)
            jw_char(w, ',');
        jw_string(w, t->name);
        jw_raw(w, ":{\"dtype\":");
        jw_raw(w, t->data != NULL ? "\"F64\"" : "\"F32\"");
        jw_raw(w, ",\"shape\":[");
        if (t->rows) {
            jw_size(w, t->rows);
            jw_char(w, ',');
        }
        jw_size(w, t->cols);
        jw_raw(w, "],\"data_offsets\":[");
        jw_size(w, offset);
        jw_char(w, ',');
        offset += n * out_elem_size(t);
        jw_size(w, offset);
        jw_raw(w, "]}");
    }
    jw_char(w, '}');
    /* The data starts 8-byte aligned, as the format's own writer pads it. */
    while ((w->len + 8) % 8 != 0)
        jw_char(w, ' ');
}

unsigned char *safetensors_write(const st_out *tensors, size_t count, const char *const *meta,
                                 size_t meta_count, size_t *len)
{
    size_t data_len = 0;
    for (size_t i = 0; i < count; i++) {
        size_t n;
        if (mem_mul(tensors[i].rows ? tensors[i].rows : 1, tensors[i].cols,
                    out_elem_size(&tensors[i]), &n) != 0 ||
            data_len + n < data_len)
            return NULL;
        data_len += n;
    }
    jw_buf w;
    jw_init(&w, 256 + count * 128);
    write_header(&w, tensors, count, meta, meta_count);
    size_t header_len;
    char *header = jw_finish(&w, &header_len);
    if (header == NULL || header_len + 8 + data_len < data_len) {
        mem_free(header);
        return NULL;
    }
    unsigned char *out = mem_malloc(8 + header_len + data_len);
    if (out != NULL) {
        for (int b = 0; b < 8; b++)
            out[b] = (unsigned char)((uint64_t)header_len >> (8 * b));
        memcpy(out + 8, header, header_len);
        unsigned char *p = out + 8 + header_len;
        for (size_t i = 0; i < count; i++) {
            size_t n = (tensors[i].rows ? tensors[i].rows : 1) * tensors[i].cols;
            for (size_t k = 0; tensors[i].data != NULL && k < n; k++, p += 8) {
                uint64_t bits;
                memcpy(&bits, &tensors[i].data[k], sizeof bits);
                for (int b = 0; b < 8; b++)
                    p[b] = (unsigned char)(bits >> (8 * b));
            }
            for (size_t k = 0; tensors[i].data == NULL && k < n; k++, p += 4) {
                uint32_t bits;
                memcpy(&bits, &tensors[i].data_f32[k], sizeof bits);
                for (int b = 0; b < 4; b++)
                    p[b] = (unsigned char)(bits >> (8 * b));
            }
        }
        *len = 8 + header_len + data_len;
    }
    mem_free(header);
    return out;
}

/*
 * test_v2_tensor.c - the v2 body framing and the tensor codec (v2_tensor.h).
 *
 * The framing: where the JSON header ends, what a bad
 * Inference-Header-Content-Length gets, and that the inputs must claim the
 * binary section exactly.  The tensors: descriptions and their size checks,
 * binary numbers read bit for bit in little-endian order, NaN and Inf
 * refused with the element named, BOOL as one byte 0 or 1, the writers
 * against the readers, and out-of-memory in the whole decode-and-answer path
 * through mem.h's failure injection.
 */
#include <jansson.h>
#include <stdlib.h>

#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"
#include "v2/v2_tensor.h"
#include "core/half.h"

/* Little-endian bytes of floats and doubles, written byte by byte so the test
 * does not depend on the machine's order. */
static void put_f32(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    for (int b = 0; b < 4; b++)
        p[b] = (unsigned char)(u >> (8 * b));
}

static void put_f64(unsigned char *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    for (int b = 0; b < 8; b++)
        p[b] = (unsigned char)(u >> (8 * b));
}

/* Parses the JSON text of one input object (borrowed by the caller until
 * json_decref). */
static json_t *input(const char *text)
{
    json_error_t jerr;
    return json_loads(text, 0, &jerr);
}

/* v2_tensor_describe of the JSON object in, read as an HTTP body's input is. */
static int describe(const json_t *in, size_t index, v2_body *b, size_t max_elements,
                    size_t *elements, v2_tensor *t, attn_error *err)
{
    api_infer_input fields;
    v2_tensor_input_from_json(in, &fields);
    return v2_tensor_describe(&fields, index, b, max_elements, elements, t, err);
}

void test_v2_tensor_framing_split(void)
{
    const char body[] = "{\"inputs\":[]}ABCDEFGH";
    size_t len = sizeof body - 1, json_len = 13;
    v2_body b;
    attn_error err;
    /* Without the header the whole body is JSON. */
    ASSERT_EQ(v2_body_split(body, len, api_length_parse(NULL), &b, &err), 0);
    ASSERT(b.json == body && b.json_len == len && b.bin_len == 0);
    ASSERT_EQ(v2_body_check_consumed(&b, &err), 0);
    /* With it, the JSON part and the binary section; blanks around are fine. */
    ASSERT_EQ(v2_body_split(body, len, api_length_parse(" 13\t"), &b, &err), 0);
    ASSERT_EQ(b.json_len, json_len);
    ASSERT(b.bin == (const unsigned char *)body + json_len);
    ASSERT_EQ(b.bin_len, 8);
    ASSERT_EQ(b.bin_used, 0);
    /* The whole body may be JSON (length equal to the body). */
    ASSERT_EQ(v2_body_split(body, len, api_length_parse("21"), &b, &err), 0);
    ASSERT_EQ(b.bin_len, 0);
    /* Refused: past the body, not a number, a sign, trailing text, empty. */
    const char *bad[] = {"22", "abc", "-1", "+3", "13x", "", "1 3", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        error_clear(&err);
        if (v2_body_split(body, len, api_length_parse(bad[i]), &b, &err) != ERR_BAD_REQUEST)
            FAIL_AT("header \"%s\" was accepted", bad[i]);
        ASSERT_STR_EQ(err.field, "Inference-Header-Content-Length");
    }
    /* The inputs must claim every binary byte, no fewer. */
    ASSERT_EQ(v2_body_split(body, len, api_length_parse("13"), &b, &err), 0);
    b.bin_used = 4;
    ASSERT_EQ(v2_body_check_consumed(&b, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "Inference-Header-Content-Length");
    b.bin_used = 8;
    ASSERT_EQ(v2_body_check_consumed(&b, &err), 0);
}

/* binary_data_size: a size that fits is claimed from the binary section; one that
 * disagrees with shape x datatype, or that is past the bytes left, is refused. */
void test_v2_tensor_size_checks(void)
{
    unsigned char bytes[64] = {0};
    v2_body b = {.json = "", .json_len = 0, .bin = bytes, .bin_len = 24, .bin_used = 0};
    v2_tensor t;
    attn_error err;
    size_t elements = 0;
    /* 2 x 3 FP32 is 24 bytes: claimed from the binary section. */
    json_t *in = input("{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2,3],"
                       "\"parameters\":{\"binary_data_size\":24}}");
    ASSERT(in != NULL);
    int rc = describe(in, 0, &b, 100, &elements, &t, &err);
    json_decref(in);
    ASSERT_EQ(rc, 0);
    ASSERT_STR_EQ(t.name, "q");
    ASSERT_EQ(t.datatype, V2_FP32);
    ASSERT_EQ(t.rank, 2);
    ASSERT_EQ(t.count, 6);
    ASSERT(t.bytes == bytes && t.data == NULL);
    ASSERT_EQ(b.bin_used, 24);
    ASSERT_EQ(elements, 6);

    /* A size that disagrees with shape x datatype (FP64 needs 48). */
    b.bin_used = 0;
    in = input("{\"name\":\"k\",\"datatype\":\"FP64\",\"shape\":[2,3],"
               "\"parameters\":{\"binary_data_size\":24}}");
    rc = describe(in, 1, &b, 100, &elements, &t, &err);
    json_decref(in);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "shape_mismatch");
    ASSERT_STR_EQ(err.field, "inputs[1].parameters.binary_data_size");
    ASSERT_EQ(b.bin_used, 0);

    /* A right size with too few bytes left after the inputs before it. */
    b.bin_used = 8;
    in = input("{\"name\":\"v\",\"datatype\":\"FP32\",\"shape\":[6],"
               "\"parameters\":{\"binary_data_size\":24}}");
    rc = describe(in, 2, &b, 100, &elements, &t, &err);
    json_decref(in);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "inputs[2].parameters.binary_data_size");
    ASSERT_EQ(b.bin_used, 8);
}

/* An input whose bytes the front-end holds apart (a gRPC request's raw contents): taken
 * where they lie, with its size checked against the shape, and nothing claimed from the
 * body's binary section. */
void test_v2_tensor_parts(void)
{
    unsigned char a[24] = {0};
    v2_body b = {.json = ""};
    v2_tensor t;
    attn_error err;
    size_t elements = 0;
    api_infer_input in = {.self = {.kind = SCALAR_OBJECT}, .name = scalar_string("q"),
                          .datatype = scalar_string("FP32"),
                          .shape = {.kind = SCALAR_ARRAY, .size = 2},
                          .dims = {scalar_integer(2), scalar_integer(3)},
                          .parameters = {.kind = SCALAR_OBJECT, .size = 1},
                          .binary_data_size = scalar_integer(24), .bytes = a};
    ASSERT_EQ(v2_tensor_describe(&in, 0, &b, 100, &elements, &t, &err), 0);
    ASSERT(t.bytes == a);
    ASSERT_EQ(b.bin_used, 0);
    ASSERT_EQ(v2_body_check_consumed(&b, &err), 0);
    /* 24 bytes for a shape that needs 8: refused in the words of a JSON body's. */
    in.dims[0] = scalar_integer(1), in.dims[1] = scalar_integer(2);
    ASSERT_EQ(v2_tensor_describe(&in, 1, &b, 100, &elements, &t, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "shape_mismatch");
    ASSERT_STR_EQ(err.field, "inputs[1].parameters.binary_data_size");
}

/* Inputs refused while they are described: the code and field of each error, and the
 * element budget counted over inputs. */
void test_v2_tensor_describe_errors(void)
{
    unsigned char bytes[64] = {0};
    v2_tensor t;
    attn_error err;
    json_t *in;
    int rc;
    struct {
        const char *json;
        int rc;
        const char *code, *field;
    } cases[] = {
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2],\"data\":[1,2],"
         "\"parameters\":{\"binary_data_size\":8}}", ERR_BAD_REQUEST, "conflicting_fields",
         "inputs[0].data"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2],"
         "\"parameters\":{\"binary_data_size\":-8}}", ERR_BAD_REQUEST, "wrong_type",
         "inputs[0].parameters.binary_data_size"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2],\"parameters\":[]}",
         ERR_BAD_REQUEST, "wrong_type", "inputs[0].parameters"},
        {"{\"name\":\"q\",\"datatype\":\"INT32\",\"shape\":[2],\"data\":[1,2]}", ERR_BAD_REQUEST,
         "invalid_value", "inputs[0].datatype"},
        {"{\"name\":\"q\",\"datatype\":\"FP128\",\"shape\":[2],\"data\":[1,2]}", ERR_BAD_REQUEST,
         "invalid_value", "inputs[0].datatype"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[],\"data\":[]}", ERR_BAD_REQUEST,
         "invalid_shape", "inputs[0].shape"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[1,1,1,1,1],\"data\":[1]}",
         ERR_BAD_REQUEST, "invalid_shape", "inputs[0].shape"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2,0],\"data\":[]}", ERR_BAD_REQUEST,
         "invalid_shape", "inputs[0].shape"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[-1,2],\"data\":[]}", ERR_BAD_REQUEST,
         "invalid_shape", "inputs[0].shape"},
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[2]}", ERR_BAD_REQUEST,
         "missing_field", "inputs[0].data"},
        {"{\"datatype\":\"FP32\",\"shape\":[2],\"data\":[1,2]}", ERR_BAD_REQUEST,
         "missing_field", "inputs[0].name"},
        /* 11 x 10 numbers are past a limit of 100, before anything is read. */
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[11,10],\"data\":[]}", ERR_TOO_LARGE,
         "request_too_large", "inputs[0].shape"},
        /* Dimensions whose product overflows size_t are too large, not wrapped. */
        {"{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[4294967296,4294967296,16],"
         "\"data\":[]}", ERR_TOO_LARGE, "request_too_large", "inputs[0].shape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        v2_body fresh = {.json = "", .bin = bytes, .bin_len = 64};
        size_t counted = 0;
        error_clear(&err);
        in = input(cases[i].json);
        ASSERT(in != NULL);
        rc = describe(in, 0, &fresh, 100, &counted, &t, &err);
        json_decref(in);
        if (rc != cases[i].rc || strcmp(err.code, cases[i].code) != 0 ||
            strcmp(err.field, cases[i].field) != 0)
            FAIL_AT("case %zu: rc %d code \"%s\" field \"%s\"; want %d \"%s\" \"%s\"", i, rc,
                    err.code, err.field, cases[i].rc, cases[i].code, cases[i].field);
    }
    /* The element budget counts over inputs. */
    size_t counted = 95;
    v2_body fresh = {.json = "", .bin = bytes, .bin_len = 64};
    in = input("{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[6],\"data\":[1,2,3,4,5,6]}");
    rc = describe(in, 3, &fresh, 100, &counted, &t, &err);
    json_decref(in);
    ASSERT_EQ(rc, ERR_TOO_LARGE);
    ASSERT_EQ(counted, 95);
}

void test_v2_tensor_binary_reads(void)
{
    /* Values whose every bit matters: random doubles, and their float roundings. */
    uint64_t state = 0x9e3779b97f4a7c15ull;
    enum { N = 37 };
    double want[N];
    unsigned char bytes64[8 * N], bytes32[4 * N + 1];
    for (int i = 0; i < N; i++) {
        want[i] = test_uniform(&state) * (i % 3 == 0 ? 1e-30 : i % 3 == 1 ? 1.0 : 1e30);
        put_f64(bytes64 + 8 * i, want[i]);
        /* Misaligned on purpose: binary sections start wherever the JSON ends. */
        put_f32(bytes32 + 1 + 4 * i, (float)want[i]);
    }
    want[0] = -0.0;
    put_f64(bytes64, -0.0);
    double out[N];
    attn_error err;
    v2_tensor t = {.name = "q", .datatype = V2_FP64, .rank = 1, .dims = {N}, .count = N,
                   .bytes = bytes64};
    ASSERT_EQ(v2_tensor_read_numbers(&t, out, &err), 0);
    for (int i = 0; i < N; i++)
        if (memcmp(&out[i], &want[i], sizeof out[i]) != 0)
            FAIL_AT("FP64 element %d: %.17g, want %.17g", i, out[i], want[i]);
    t.datatype = V2_FP32;
    t.bytes = bytes32 + 1;
    ASSERT_EQ(v2_tensor_read_numbers(&t, out, &err), 0);
    for (int i = 1; i < N; i++)
        if (out[i] != (double)(float)want[i])
            FAIL_AT("FP32 element %d: %.9g, want %.9g", i, out[i], (double)(float)want[i]);

    /* JSON data, flat and nested, land in the same row-major order. */
    const char *forms[] = {"[1,2,3,4,5,6]", "[[1,2,3],[4,5,6]]"};
    for (int f = 0; f < 2; f++) {
        json_error_t jerr;
        json_t *data = json_loads(forms[f], 0, &jerr);
        v2_tensor j = {.name = "q", .datatype = V2_FP32, .rank = 2, .dims = {2, 3}, .count = 6,
                       .data = data};
        double got[6];
        ASSERT_EQ(v2_tensor_read_numbers(&j, got, &err), 0);
        json_decref(data);
        for (int i = 0; i < 6; i++)
            ASSERT_EQ(got[i], i + 1);
    }
    /* Nested data that disagrees with the shape names the level. */
    json_error_t jerr;
    json_t *data = json_loads("[[1,2],[3,4],[5,6]]", 0, &jerr);
    v2_tensor j = {.name = "q", .index = 2, .datatype = V2_FP32, .rank = 2, .dims = {2, 3},
                   .count = 6, .data = data};
    double got[6];
    int rc = v2_tensor_read_numbers(&j, got, &err);
    json_decref(data);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "shape_mismatch");
    ASSERT_STR_EQ(err.field, "inputs[2].data");
    /* A string among numbers names its element. */
    data = json_loads("[[1,2,3],[4,\"5\",6]]", 0, &jerr);
    j.data = data;
    rc = v2_tensor_read_numbers(&j, got, &err);
    json_decref(data);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "inputs[2].data[1][1]");
}

void test_v2_tensor_nan_inf_refused(void)
{
    const double specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    attn_error err;
    for (int dt = 0; dt < 2; dt++)
        for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++)
            for (size_t at = 0; at < 5; at += 2) {
                unsigned char bytes[8 * 5];
                for (size_t i = 0; i < 5; i++) {
                    double v = i == at ? specials[s] : 0.25 * (double)i;
                    if (dt)
                        put_f64(bytes + 8 * i, v);
                    else
                        put_f32(bytes + 4 * i, (float)v);
                }
                v2_tensor t = {.name = "k", .index = 1, .datatype = dt ? V2_FP64 : V2_FP32,
                               .rank = 1, .dims = {5}, .count = 5, .bytes = bytes};
                double out[5];
                error_clear(&err);
                int rc = v2_tensor_read_numbers(&t, out, &err);
                char where[40];
                snprintf(where, sizeof where, "element %zu", at);
                if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0 ||
                    strcmp(err.field, "inputs[1]") != 0 || strstr(err.message, where) == NULL)
                    FAIL_AT("%s special %zu at %zu: rc %d code \"%s\" message \"%s\"",
                            dt ? "FP64" : "FP32", s, at, rc, err.code, err.message);
            }
    /* The largest finite numbers are not refused. */
    unsigned char bytes[12];
    put_f32(bytes, 3.4028234663852886e38f);
    put_f64(bytes + 4, 1.7976931348623157e308);
    v2_tensor t32 = {.name = "q", .datatype = V2_FP32, .rank = 1, .dims = {1}, .count = 1,
                     .bytes = bytes};
    v2_tensor t64 = {.name = "q", .datatype = V2_FP64, .rank = 1, .dims = {1}, .count = 1,
                     .bytes = bytes + 4};
    double out;
    ASSERT_EQ(v2_tensor_read_numbers(&t32, &out, &err), 0);
    ASSERT_EQ(v2_tensor_read_numbers(&t64, &out, &err), 0);
    ASSERT(out == 1.7976931348623157e308);
}

/* The readers that take 16 bytes at a time (v2_tensor.c) find a NaN or an Inf
 * in every lane and in the scalar tail, for every reader of binary numbers:
 * read_numbers (FP32 and FP64), read_floats and view_floats. */
void test_v2_tensor_not_finite_every_position(void)
{
    const double specials[] = {NAN, INFINITY, -INFINITY};
    enum { N = 11 };
    _Alignas(64) unsigned char bytes[8 * N];
    attn_error err;
    for (size_t n = 1; n <= N; n++)
        for (size_t at = 0; at < n; at++)
            for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++)
                for (int reader = 0; reader < 4; reader++) {
                    int fp64 = reader == 1;
                    for (size_t i = 0; i < n; i++) {
                        double v = i == at ? specials[s] : 3.0e38 * (i % 2 ? -1 : 1);
                        if (fp64)
                            put_f64(bytes + 8 * i, i == at ? v : 1.7e308);
                        else
                            put_f32(bytes + 4 * i, (float)v);
                    }
                    v2_tensor t = {.name = "v", .index = 2, .datatype = fp64 ? V2_FP64 : V2_FP32,
                                   .rank = 1, .dims = {n}, .count = n, .bytes = bytes};
                    double out64[N];
                    float out32[N];
                    const float *view = NULL;
                    error_clear(&err);
                    int rc = reader < 2  ? v2_tensor_read_numbers(&t, out64, &err)
                             : reader == 2 ? v2_tensor_read_floats(&t, out32, &err)
                                           : v2_tensor_view_floats(&t, &view, &err);
                    char where[40];
                    snprintf(where, sizeof where, "element %zu ", at);
                    if (rc != ERR_BAD_REQUEST || strcmp(err.code, "not_finite") != 0 ||
                        strcmp(err.field, "inputs[2]") != 0 || strstr(err.message, where) == NULL ||
                        view != NULL)
                        FAIL_AT("reader %d, %zu numbers, special %zu at %zu: rc %d code \"%s\" "
                                "message \"%s\"", reader, n, s, at, rc, err.code, err.message);
                }
}

/* FP32 bytes on a float's alignment are read where they are (view_floats
 * returns them, bit for bit what read_floats copies); anywhere else the view
 * is NULL, nothing is read, and the copy gives the same numbers. */
void test_v2_tensor_fp32_in_place(void)
{
    enum { N = 21 };
    _Alignas(64) unsigned char bytes[4 * N + 4];
    uint64_t state = 0x2545f4914f6cdd1dull;
    attn_error err;
    for (size_t offset = 0; offset < 4; offset++) {
        unsigned char *p = bytes + offset;
        float want[N];
        for (size_t i = 0; i < N; i++) {
            want[i] = (float)(test_uniform(&state) * (i % 4 == 0 ? 1e-40 : i % 4 == 1 ? 1 : 1e30));
            put_f32(p + 4 * i, want[i]);
        }
        want[3] = -0.0f;
        put_f32(p + 12, -0.0f);
        v2_tensor t = {.name = "q", .datatype = V2_FP32, .rank = 1, .dims = {N}, .count = N,
                       .bytes = p};
        const float *view = (const float *)1;
        ASSERT_EQ(v2_tensor_view_floats(&t, &view, &err), 0);
        if (offset == 0)
            ASSERT(view == (const float *)(const void *)p);
        else
            ASSERT(view == NULL);
        float copy[N];
        ASSERT_EQ(v2_tensor_read_floats(&t, copy, &err), 0);
        for (size_t i = 0; i < N; i++) {
            if (memcmp(&copy[i], &want[i], sizeof want[i]) != 0)
                FAIL_AT("offset %zu, copied element %zu: %.9g, want %.9g", offset, i, copy[i],
                        want[i]);
            if (view != NULL && memcmp(&view[i], &want[i], sizeof want[i]) != 0)
                FAIL_AT("viewed element %zu: %.9g, want %.9g", i, view[i], want[i]);
        }
    }
}

void test_v2_tensor_bool_bytes(void)
{
    const unsigned char bytes[] = {1, 0, 0, 1, 1, 0};
    unsigned char out[6];
    attn_error err;
    v2_tensor t = {.name = "mask", .index = 3, .datatype = V2_BOOL, .rank = 2, .dims = {2, 3},
                   .count = 6, .bytes = bytes};
    ASSERT_EQ(v2_datatype_size(V2_BOOL), 1);
    ASSERT_EQ(v2_tensor_read_bools(&t, out, &err), 0);
    ASSERT(memcmp(out, bytes, 6) == 0);
    /* Any byte but 0 and 1 is refused, with its element. */
    const unsigned char bad[] = {1, 0, 2, 1, 1, 0};
    t.bytes = bad;
    ASSERT_EQ(v2_tensor_read_bools(&t, out, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "inputs[3]");
    ASSERT(strstr(err.message, "element 2") != NULL);
    const unsigned char high[] = {0xff};
    v2_tensor one = {.name = "mask", .datatype = V2_BOOL, .rank = 1, .dims = {1}, .count = 1,
                     .bytes = high};
    ASSERT_EQ(v2_tensor_read_bools(&one, out, &err), ERR_BAD_REQUEST);
    /* JSON booleans, and a number where a boolean belongs. */
    json_error_t jerr;
    json_t *data = json_loads("[[true,false,false],[true,true,false]]", 0, &jerr);
    t.bytes = NULL;
    t.data = data;
    memset(out, 7, sizeof out);
    int rc = v2_tensor_read_bools(&t, out, &err);
    json_decref(data);
    ASSERT_EQ(rc, 0);
    ASSERT(memcmp(out, bytes, 6) == 0);
    data = json_loads("[1,0,0,1,1,0]", 0, &jerr);
    t.data = data;
    rc = v2_tensor_read_bools(&t, out, &err);
    json_decref(data);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "inputs[3].data[0]");
}

void test_v2_tensor_writers_round_trip(void)
{
    uint64_t state = 0x1234567887654321ull;
    enum { N = 50 };
    double src[N];
    float src32[N];
    for (int i = 0; i < N; i++) {
        src[i] = test_uniform(&state);
        src32[i] = (float)test_uniform(&state);
    }
    unsigned char bytes[8 * N];
    double back[N];
    attn_error err;
    static const v2_datatype types[] = {V2_FP32, V2_FP64, V2_FP16, V2_BF16};
    for (int dt = 0; dt < 4; dt++) {
        /* from double and from float: read back as the datatype rounds them */
        for (int held32 = 0; held32 < 2; held32++) {
            v2_datatype type = types[dt];
            v2_numbers x = {held32 ? src32 : NULL, held32 ? NULL : src, N};
            v2_numbers_write_binary(bytes, &x, type);
            v2_tensor t = {.name = "o", .datatype = type, .rank = 1, .dims = {N}, .count = N,
                           .bytes = bytes};
            ASSERT_EQ(v2_tensor_read_numbers(&t, back, &err), 0);
            for (int i = 0; i < N; i++) {
                double v = held32 ? src32[i] : src[i];
                double want = type == V2_FP64   ? v
                              : type == V2_FP32 ? (double)(float)v
                              : type == V2_FP16 ? half_fp16_to_float(half_fp16_from_double(v))
                                                : half_bf16_to_float(half_bf16_from_double(v));
                if (back[i] != want)
                    FAIL_AT("%s from %s, element %d: %.17g, want %.17g",
                            v2_datatype_name(type), held32 ? "float" : "double", i, back[i],
                            want);
            }
        }
    }
    /* float32 weights go out as their own bytes. */
    v2_numbers_write_binary(bytes, &(v2_numbers){src32, NULL, N}, V2_FP32);
    for (int i = 0; i < N; i++) {
        unsigned char want[4];
        put_f32(want, src32[i]);
        ASSERT(memcmp(bytes + 4 * i, want, 4) == 0);
    }
    /* JSON: every number reads back to the same value in its datatype. */
    for (int form = 0; form < 5; form++) {
        v2_datatype type = form == 4 ? V2_FP32 : types[form];
        v2_numbers x = {form == 4 ? src32 : NULL, form == 4 ? NULL : src, N};
        jw_buf w;
        jw_init(&w, 0);
        v2_numbers_write_json(&w, &x, type);
        size_t len;
        char *text = jw_finish(&w, &len);
        ASSERT(text != NULL);
        json_error_t jerr;
        json_t *arr = json_loadb(text, len, 0, &jerr);
        mem_free(text);
        ASSERT(arr != NULL && json_array_size(arr) == N);
        int same = 1;
        for (int i = 0; i < N; i++) {
            double v = json_number_value(json_array_get(arr, (size_t)i));
            double s = v2_numbers_get(&x, (size_t)i);
            if (type == V2_FP64)
                same &= v == s;
            else if (type == V2_FP32)
                same &= (float)v == (float)s;
            else if (type == V2_FP16)
                same &= half_fp16_from_double(v) == half_fp16_from_double(s);
            else
                same &= half_bf16_from_double(v) == half_bf16_from_double(s);
        }
        json_decref(arr);
        if (!same)
            FAIL_AT("form %d: a number did not read back", form);
    }
}

void test_v2_tensor_half_inputs(void)
{
    /* binary FP16 and BF16: widened exactly, NaN and Inf refused naming the element */
    unsigned char bytes[8] = {0x01, 0x00, 0x00, 0x80, 0xff, 0x7b, 0x00, 0x3c};
    v2_tensor t = {.name = "k", .index = 1, .datatype = V2_FP16, .rank = 1, .dims = {4},
                   .count = 4, .bytes = bytes};
    double out[4];
    float out32[4];
    attn_error err;
    ASSERT_EQ(v2_tensor_read_numbers(&t, out, &err), 0);
    ASSERT(out[0] == 0x1p-24 && out[1] == 0.0 && signbit(out[1]) && out[2] == 65504.0 &&
           out[3] == 1.0);
    ASSERT_EQ(v2_tensor_read_floats(&t, out32, &err), 0);
    ASSERT(out32[0] == 0x1p-24f && signbit(out32[1]) && out32[2] == 65504.0f);
    t.datatype = V2_BF16;
    ASSERT_EQ(v2_tensor_read_floats(&t, out32, &err), 0);
    ASSERT(out32[0] == 0x1p-133f && out32[2] == 0x1.fep120f && out32[3] == 0x1p-7f);
    for (int dt = 0; dt < 2; dt++) {
        unsigned char bad[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        /* Inf, then NaN, at element 2 */
        for (int nan = 0; nan < 2; nan++) {
            bad[4] = dt ? (nan ? 0xc1 : 0x80) : (nan ? 0x01 : 0x00);
            bad[5] = dt ? 0x7f : (nan ? 0x7e : 0x7c);
            v2_tensor b = {.name = "q", .index = 0, .datatype = dt ? V2_BF16 : V2_FP16,
                           .rank = 1, .dims = {4}, .count = 4, .bytes = bad};
            error_clear(&err);
            ASSERT_EQ(v2_tensor_read_numbers(&b, out, &err), ERR_BAD_REQUEST);
            ASSERT_STR_EQ(err.field, "inputs[0]");
            ASSERT(strstr(err.message, "element 2") != NULL);
            error_clear(&err);
            ASSERT_EQ(v2_tensor_read_floats(&b, out32, &err), ERR_BAD_REQUEST);
            ASSERT(strstr(err.message, "NaN or Inf") != NULL);
        }
    }
    /* JSON numbers rounded to the datatype; one that rounds to Inf refused */
    json_t *data = json_pack("[f, f, f, f]", 0.1, 65519.0, -0x1p-25, 1.0 + 0x1p-11);
    v2_tensor j = {.name = "v", .index = 2, .datatype = V2_FP16, .rank = 1, .dims = {4},
                   .count = 4, .data = data};
    ASSERT_EQ(v2_tensor_read_numbers(&j, out, &err), 0);
    ASSERT(out[0] == half_fp16_to_float(0x2e66) && out[1] == 65504.0 && out[2] == 0.0 &&
           signbit(out[2]) && out[3] == 1.0);
    json_array_set_new(data, 1, json_real(65520.0));
    error_clear(&err);
    ASSERT_EQ(v2_tensor_read_numbers(&j, out, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "inputs[2].data");
    ASSERT(strstr(err.message, "element 1") != NULL && strstr(err.message, "FP16") != NULL);
    j.datatype = V2_BF16;
    json_array_set_new(data, 1, json_real(3.4e38));
    error_clear(&err);
    ASSERT_EQ(v2_tensor_read_numbers(&j, out, &err), ERR_BAD_REQUEST);
    json_array_set_new(data, 1, json_real(65520.0));
    ASSERT_EQ(v2_tensor_read_numbers(&j, out, &err), 0);
    ASSERT(out[1] == 65536.0 && out[0] == half_bf16_to_float(0x3dcd));
    json_decref(data);
    /* the encoder reports what would round to Inf, and only that */
    double big[3] = {1.0, 65504.0, 65520.0};
    unsigned char buf[24];
    v2_numbers x = {NULL, big, 3};
    ASSERT_EQ(v2_numbers_write_binary(buf, &x, V2_FP16), 2);
    ASSERT_EQ(v2_numbers_write_binary(buf, &x, V2_BF16), 3);
    float big32[3] = {1.0f, 65520.0f, 1e38f};
    v2_numbers x32 = {big32, NULL, 3};
    ASSERT_EQ(v2_numbers_write_binary(buf, &x32, V2_FP16), 1);
    ASSERT_EQ(v2_numbers_write_binary(buf, &x32, V2_BF16), 3);
    x.n = 2;
    ASSERT_EQ(v2_numbers_write_binary(buf, &x, V2_FP16), 2);
    double huge[2] = {1.0, 1e300};
    v2_numbers h = {NULL, huge, 2};
    ASSERT_EQ(v2_numbers_write_binary(buf, &h, V2_FP32), 1);
    ASSERT_EQ(v2_numbers_write_binary(buf, &h, V2_FP64), 2);
    jw_buf w;
    jw_init(&w, 0);
    ASSERT_EQ(v2_numbers_write_json(&w, &h, V2_FP32), 1);
    jw_discard(&w);
    jw_init(&w, 0);
    ASSERT_EQ(v2_numbers_write_json(&w, &x32, V2_FP16), 1);
    jw_discard(&w);
}

/* The whole v2 path of one request body, as v2_infer.c runs it: split, parse the
 * header, describe and read every input into buffers from mem_malloc, and
 * answer them as JSON.  Returns 0 or the failing step's code. */
static int decode_and_answer(const char *body, size_t len, const char *header_length,
                             attn_error *err)
{
    v2_body b;
    int rc = v2_body_split(body, len, api_length_parse(header_length), &b, err);
    if (rc != 0)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb(b.json, b.json_len, 0, &jerr);
    if (root == NULL)
        return error_nomem(err);
    const json_t *inputs = json_object_get(root, "inputs");
    jw_buf w;
    jw_init(&w, 0);
    size_t elements = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(inputs); i++) {
        v2_tensor t;
        rc = describe(json_array_get(inputs, i), i, &b, 1000, &elements, &t, err);
        if (rc != 0)
            break;
        double *num = mem_malloc(t.count * sizeof(double));
        if (num == NULL) {
            rc = error_nomem(err);
            break;
        }
        rc = v2_tensor_read_numbers(&t, num, err);
        if (rc == 0)
            v2_numbers_write_json(&w, &(v2_numbers){NULL, num, t.count}, t.datatype);
        mem_free(num);
    }
    if (rc == 0)
        rc = v2_body_check_consumed(&b, err);
    json_decref(root);
    size_t out_len;
    char *text = jw_finish(&w, &out_len);
    if (rc == 0 && text == NULL)
        rc = error_nomem(err);
    mem_free(text);
    return rc;
}

void test_v2_tensor_out_of_memory(void)
{
    char body[512];
    unsigned char tail[8 * 4 + 4 * 3];
    for (int i = 0; i < 4; i++)
        put_f64(tail + 8 * i, 0.5 * i - 1);
    for (int i = 0; i < 3; i++)
        put_f32(tail + 32 + 4 * i, 2.0f * (float)i);
    int header = snprintf(body, sizeof body,
                          "{\"inputs\":[{\"name\":\"q\",\"datatype\":\"FP64\",\"shape\":[2,2],"
                          "\"parameters\":{\"binary_data_size\":32}},{\"name\":\"k\",\"datatype\":"
                          "\"FP32\",\"shape\":[3],\"parameters\":{\"binary_data_size\":12}},"
                          "{\"name\":\"v\",\"datatype\":\"FP32\",\"shape\":[2,1],\"data\":"
                          "[[1.5],[2.5]]}]}");
    memcpy(body + header, tail, sizeof tail);
    size_t len = (size_t)header + sizeof tail;
    char header_length[24];
    snprintf(header_length, sizeof header_length, "%d", header);
    attn_error err;
    ASSERT_EQ(decode_and_answer(body, len, header_length, &err), 0);
    long n;
    for (n = 0; n < 10000; n++) {
        error_clear(&err);
        mem_fail_after(n);
        int rc = decode_and_answer(body, len, header_length, &err);
        long failures = mem_failures(), live = mem_fail_live();
        mem_fail_reset();
        if (rc == 0 && failures == 0)
            break;
        if (rc != ERR_UNAVAILABLE)
            FAIL_AT("allocation %ld failed: got %d (%s: %s)", n, rc, err.code, err.message);
        ASSERT_STR_EQ(err.code, "overloaded");
        if (live != 0)
            FAIL_AT("allocation %ld failed: %ld blocks left allocated", n, live);
    }
    if (n < 3)
        FAIL_AT("only %ld allocations: is failure injection reaching the code?", n);
    /* The binary numbers themselves need no allocation: describing and reading
     * them succeed with every allocation refused. */
    v2_body b;
    ASSERT_EQ(v2_body_split(body, len, api_length_parse(header_length), &b, &err), 0);
    json_error_t jerr;
    json_t *in = json_loads("{\"name\":\"q\",\"datatype\":\"FP64\",\"shape\":[2,2],"
                            "\"parameters\":{\"binary_data_size\":32}}", 0, &jerr);
    ASSERT(in != NULL);
    v2_tensor t;
    size_t elements = 0;
    double out[4];
    mem_fail_after(0);
    int rc = describe(in, 0, &b, 100, &elements, &t, &err);
    if (rc == 0)
        rc = v2_tensor_read_numbers(&t, out, &err);
    long failures = mem_failures();
    mem_fail_reset();
    json_decref(in);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(failures, 0);
    ASSERT(out[0] == -1 && out[3] == 0.5);
}

/*
 * test_json_in.c - reading matrices, vectors and small fields out of JSON.
 */
#include <jansson.h>

#include "json/json_in.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* Parses text as the server does; NULL (reported) when it does not parse. */
static json_t *parse(const char *text)
{
    attn_error err;
    json_t *v = json_in_parse(text, strlen(text), NULL, &err);
    if (v == NULL)
        fprintf(stderr, "  test JSON does not parse: %s\n", err.message);
    return v;
}

void test_json_in_parse(void)
{
    attn_error err;
    error_clear(&err);
    ASSERT(json_in_parse("", 0, NULL, &err) == NULL);
    ASSERT_EQ(err.kind, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_json");
    ASSERT(json_in_parse("{\"a\":1,\"a\":2}", 13, NULL, &err) == NULL);
    ASSERT_STR_EQ(err.code, "invalid_json");
    ASSERT(strstr(err.message, "line 1") != NULL);
    json_t *v = json_in_parse("{\"a\":[1]}", 9, NULL, &err);
    ASSERT(json_is_object(v));
    json_decref(v);
    mem_fail_after(0);
    v = json_in_parse("{\"a\":[1]}", 9, NULL, &err);
    mem_fail_reset();
    ASSERT(v == NULL);
    ASSERT_EQ(err.kind, ERR_UNAVAILABLE);
}

void test_json_in_tensor_shapes_and_paths(void)
{
    size_t elements = 0;
    json_in_budget budget = {100, &elements};
    json_in_tensor t;
    attn_error err;
    json_t *v = parse("[[1,2,3],[4,5,6]]");
    ASSERT(v != NULL);
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "q", 3, JSON_IN_NUMBER, 0, &t, &err), 0);
    ASSERT_EQ(t.rank, 2);
    ASSERT_EQ(t.batch, 1);
    ASSERT_EQ(t.rows, 2);
    ASSERT_EQ(t.cols, 3);
    ASSERT_NEAR(t.data[4], 5, 0);
    ASSERT_EQ(elements, 6);
    mem_free(t.data);
    /* Transposed: 3 x 2, column 0 of the input is row 0. */
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "q", 3, JSON_IN_NUMBER, 1, &t, &err), 0);
    ASSERT_EQ(t.rows, 3);
    ASSERT_NEAR(t.data[1], 4, 0);
    ASSERT_NEAR(t.data[2], 2, 0);
    mem_free(t.data);
    /* A batch where rank 2 is the most allowed. */
    json_decref(v);
    v = parse("[[[1]],[[2]]]");
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "weights.wq", 2, JSON_IN_NUMBER, 0, &t, &err),
              ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_shape");
    ASSERT_STR_EQ(err.field, "weights.wq");
    ASSERT(t.data == NULL);
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "x", 3, JSON_IN_NUMBER, 0, &t, &err), 0);
    ASSERT_EQ(t.rank, 3);
    ASSERT_EQ(t.batch, 2);
    mem_free(t.data);
    json_decref(v);
    /* The path of a bad element in a batch. */
    v = parse("[[[1,2]],[[3,\"4\"]]]");
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "k", 3, JSON_IN_NUMBER, 0, &t, &err),
              ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "wrong_type");
    ASSERT_STR_EQ(err.field, "k[1][0][1]");
    json_decref(v);
    /* Masks: booleans and 0/1 only. */
    v = parse("[[true,0],[1,false]]");
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "mask", 3, JSON_IN_MASK, 0, &t, &err), 0);
    ASSERT_NEAR(t.data[0], 1, 0);
    ASSERT_NEAR(t.data[3], 0, 0);
    mem_free(t.data);
    json_decref(v);
    v = parse("[[0.5]]");
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "mask", 3, JSON_IN_MASK, 0, &t, &err),
              ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_value");
    ASSERT_STR_EQ(err.field, "mask[0][0]");
    json_decref(v);
}

void test_json_in_vector_and_budget(void)
{
    size_t elements = 0;
    json_in_budget budget = {5, &elements};
    attn_error err;
    double *data;
    size_t len;
    json_t *v = parse("[1,2,3]");
    ASSERT_EQ(json_in_vector_decode(&budget, v, "weights.bq", &data, &len, &err), 0);
    ASSERT_EQ(len, 3);
    ASSERT_NEAR(data[2], 3, 0);
    ASSERT_EQ(elements, 3);
    mem_free(data);
    /* 3 more would make 6 > 5: refused before allocating, nothing counted. */
    ASSERT_EQ(json_in_vector_decode(&budget, v, "weights.bk", &data, &len, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "request_too_large");
    ASSERT_STR_EQ(err.field, "weights.bk");
    ASSERT(data == NULL);
    ASSERT_EQ(len, 0);
    ASSERT_EQ(elements, 3);
    json_in_tensor t;
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "q", 3, JSON_IN_NUMBER, 0, &t, &err),
              ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_shape");
    json_decref(v);
    v = parse("[[1,2,3]]");
    ASSERT_EQ(json_in_tensor_decode(&budget, v, "q", 3, JSON_IN_NUMBER, 0, &t, &err),
              ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.field, "q");
    ASSERT_EQ(json_in_vector_decode(&budget, v, "b", &data, &len, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_shape");
    json_decref(v);
}

void test_json_in_fields_and_scalars(void)
{
    static const char *const known[] = {"causal", "dtype"};
    static const char *const dtypes[] = {"float64", "float32"};
    attn_error err;
    json_t *v = parse("{\"causal\":true,\"dtype\":\"float32\"}");
    ASSERT_EQ(json_in_check_fields(v, "", known, 2, &err), 0);
    int b, e;
    ASSERT_EQ(json_in_bool(v, "causal", 0, &b, &err), 0);
    ASSERT_EQ(b, 1);
    ASSERT_EQ(json_in_bool(v, "absent", 1, &b, &err), 0);
    ASSERT_EQ(b, 1);
    ASSERT_EQ(json_in_enum(v, "dtype", dtypes, 2, 0, &e, &err), 0);
    ASSERT_EQ(e, 1);
    ASSERT_EQ(json_in_bool(v, "dtype", 0, &b, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "wrong_type");
    json_decref(v);
    v = parse("{\"casual\":true,\"dtype\":\"float16\"}");
    ASSERT_EQ(json_in_check_fields(v, "weights", known, 2, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "unknown_field");
    ASSERT_STR_EQ(err.field, "weights.casual");
    ASSERT(strstr(err.message, "Did you mean \"causal\"?") != NULL);
    ASSERT_EQ(json_in_enum(v, "dtype", dtypes, 2, 0, &e, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_value");
    ASSERT(strstr(err.message, "\"float64\" or \"float32\"") != NULL);
    json_decref(v);
}

/* JSON has one kind of number: an integer of 2^63 or more, or of 30 digits,
 * is the same number as its ".0" spelling, not "too big". */
void test_json_in_big_integers_are_numbers(void)
{
    static const char *const bodies[] = {"[[9223372036854775808, 1]]",
                                         "[[9223372036854775808.0, 1]]",
                                         "[[123456789012345678901234567890, 1]]",
                                         "[[-123456789012345678901234567890, 1]]"};
    static const double want[] = {9223372036854775808.0, 9223372036854775808.0,
                                  123456789012345678901234567890.0,
                                  -123456789012345678901234567890.0};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        attn_error err;
        error_clear(&err);
        json_t *v = json_in_parse(bodies[i], strlen(bodies[i]), NULL, &err);
        if (v == NULL)
            FAIL_AT("%s: %s %s", bodies[i], err.code, err.message);
        size_t elements = 0;
        json_in_budget budget = {100, &elements};
        json_in_tensor t;
        int rc = json_in_tensor_decode(&budget, v, "q", 3, JSON_IN_NUMBER, 0, &t, &err);
        json_decref(v);
        ASSERT_EQ(rc, 0);
        double got = t.data[0];
        mem_free(t.data);
        ASSERT_NEAR(got, want[i], 0);
    }
    /* Past the range of a double it is still an error, and says so. */
    attn_error err;
    ASSERT(json_in_parse("[[1e400]]", 9, NULL, &err) == NULL);
    ASSERT_STR_EQ(err.code, "invalid_json");
}

/* json_in_whole reads integer fields of bodies parsed with integers as reals:
 * 2 and 2.0 alike, never 2.5, a string, or a value outside the bounds. */
void test_json_in_whole_numbers(void)
{
    json_t *as_int = json_integer(2), *as_real = json_real(2.0), *half = json_real(2.5);
    json_t *text = json_string("2"), *big = json_real(1e300);
    double out = -1;
    ASSERT_EQ(json_in_whole(as_int, 1, 10, &out), 1);
    ASSERT(out == 2.0);
    out = -1;
    ASSERT_EQ(json_in_whole(as_real, 1, 10, &out), 1);
    ASSERT(out == 2.0);
    out = -1;
    ASSERT_EQ(json_in_whole(half, 1, 10, &out), 0);
    ASSERT_EQ(json_in_whole(text, 1, 10, &out), 0);
    ASSERT_EQ(json_in_whole(as_int, 3, 10, &out), 0);
    ASSERT_EQ(json_in_whole(big, 1, 10, &out), 0);
    ASSERT(out == -1);
    ASSERT_EQ(json_in_whole(big, 1, HUGE_VAL, &out), 1);
    ASSERT(out == 1e300);
    json_decref(as_int);
    json_decref(as_real);
    json_decref(half);
    json_decref(text);
    json_decref(big);
}

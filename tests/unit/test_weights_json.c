/*
 * test_weights_json.c - weights objects, PUT bodies and stored sets in JSON.
 */
#include <jansson.h>

#include "json/json_in.h"
#include "core/mem.h"
#include "test.h"
#include "request/attention_request.h"
#include "request/weights_json.h"

/* Parses text as the server does. */
static json_t *parse(const char *text)
{
    attn_error err;
    return json_in_parse(text, strlen(text), NULL, &err);
}

void test_weights_json_decode_out_in(void)
{
    attn_error err;
    json_t *v = parse("{\"wq\":[[1,2,3],[4,5,6]],\"wk\":[[1,2,3],[4,5,6]],\"wv\":[[1,2,3]],"
                      "\"bq\":[1,2],\"wo\":[[1]],\"bo\":[0.5]}");
    ASSERT(v != NULL);
    size_t elements = 0;
    json_in_budget budget = {1000, &elements};
    weights_json_tokens tokens = {3, 3, "x"};
    attn_weights w;
    ASSERT_EQ(weights_json_decode(v, "weights", 1, &tokens, &budget, &w, &err), 0);
    ASSERT_EQ(w.d_in, 3);
    ASSERT_EQ(w.d_ctx, 3);
    ASSERT_EQ(w.dk, 2);
    ASSERT_EQ(w.dv, 1);
    ASSERT_EQ(w.d_out, 1);
    ASSERT_EQ(elements, 6 + 6 + 3 + 2 + 1 + 1);
    /* in_out wq is (3 x 2): row 0 = [1, 4] */
    ASSERT_NEAR(w.wq[0], 1, 0);
    ASSERT_NEAR(w.wq[1], 4, 0);
    ASSERT_NEAR(w.wq[2], 2, 0);
    ASSERT(w.bk == NULL && w.bv == NULL);
    ASSERT_NEAR(w.bo[0], 0.5, 0);
    weights_free(&w);
    /* The same object against tokens of width 2: wq is blamed first. */
    tokens.x_width = tokens.ctx_width = 2;
    ASSERT_EQ(weights_json_decode(v, "weights", 1, &tokens, &budget, &w, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "shape_mismatch");
    ASSERT_STR_EQ(err.field, "weights.wq");
    ASSERT(w.wq == NULL && w.bq == NULL);
    json_decref(v);
}

/* Decodes a PUT body, stores it in a set, encodes the set with its arrays
 * and decodes that again: the same numbers, layout and heads come back. */
void test_weights_json_set_round_trip(void)
{
    static const char body[] =
        "{\"wq\":[[0.1,2],[3,4],[5,6]],\"wk\":[[1,0],[0,1],[1,1]],\"wv\":[[1,2],[3,4],[5,6]],"
        "\"bv\":[1e-300,-2,-0.0],\"wo\":[[1,2,3],[4,5,6]],\"weights_layout\":\"out_in\","
        "\"heads\":3}";
    attn_error err;
    json_t *v = parse(body);
    ASSERT(v != NULL);
    attn_weights w;
    size_t heads;
    int out_in;
    ASSERT_EQ(weights_json_decode_set(v, 1000, &w, &heads, &out_in, &err), 0);
    json_decref(v);
    ASSERT_EQ(heads, 3);
    ASSERT_EQ(out_in, 1);
    ASSERT_EQ(w.d_in, 2);   /* out_in: wq is d_out x d_in = 3 x 2 */
    ASSERT_EQ(w.dk, 3);
    ASSERT_EQ(w.d_out, 2);  /* wo is d_out x dv = 2 x 3 out_in */
    weight_set *set = weightset_new("rt", &w, heads, out_in);
    ASSERT(set != NULL);
    jw_buf jw;
    jw_init(&jw, 0);
    weights_json_encode_set(set, 1, &jw);
    char *text = jw_finish(&jw, NULL);
    ASSERT(text != NULL);
    json_t *got = json_in_parse(text, strlen(text), NULL, &err);
    mem_free(text);
    ASSERT(got != NULL);
    attn_weights back;
    size_t heads2;
    int out_in2;
    int rc = weights_json_decode_set(got, 1000, &back, &heads2, &out_in2, &err);
    json_t *shapes = json_object_get(got, "shapes");
    json_t *wq_shape = json_object_get(shapes, "wq");
    size_t wq_rows = (size_t)json_number_value(json_array_get(wq_shape, 0));
    double parameters = json_number_value(json_object_get(got, "parameters"));
    json_decref(got);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(heads2, 3);
    ASSERT_EQ(out_in2, 1);
    ASSERT_EQ(wq_rows, 3);
    ASSERT_NEAR(parameters, 6 + 6 + 6 + 3 + 6, 0);
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        const double *a = weights_array(&set->w, (weights_part)p);
        const double *b = weights_array(&back, (weights_part)p);
        ASSERT((a == NULL) == (b == NULL));
        size_t n = weights_rows(&back, (weights_part)p) * weights_cols(&back, (weights_part)p);
        if (a != NULL && memcmp(a, b, n * sizeof(double)) != 0)
            FAIL_AT("%s differs after the round trip", weights_parts[p].name);
    }
    weights_free(&back);
    weightset_release(set);
    /* heads must divide dk and dv. */
    v = parse("{\"wq\":[[1,2]],\"wk\":[[1,2]],\"wv\":[[1]],\"heads\":2}");
    ASSERT(v != NULL);
    rc = weights_json_decode_set(v, 1000, &w, &heads, &out_in, &err);
    json_decref(v);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "heads");
    ASSERT(w.wq == NULL);
}

/* A field's rule says the same words whatever wire gave the value: heads and a reduction
 * read from JSON (integers parsed as reals) and from tagged values as a protobuf message
 * gives them (an int64, a string). */
void test_weights_json_scalar_same_words(void)
{
    attn_error a, b;
    size_t heads;
    json_t *root = json_loads("{\"heads\": \"4\"}", 0, NULL);
    ASSERT(root != NULL);
    error_clear(&a);
    error_clear(&b);
    ASSERT_EQ(weights_json_decode_heads(root, 0, &heads, &a), ERR_BAD_REQUEST);
    json_decref(root);
    scalar s = scalar_string("4");
    ASSERT_EQ(weights_json_heads_value(&s, 0, &heads, &b), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(a.message, b.message);
    ASSERT_STR_EQ(a.code, b.code);
    /* 0.0 from JSON and the integer 0: both "0" in the words */
    attention_request ra, rb;
    attention_request_init(&ra);
    attention_request_init(&rb);
    json_t *zero = json_real(0);
    scalar jz = json_in_scalar(zero), iz = scalar_integer(0);
    ASSERT_EQ(attention_request_reduce_param(&ra, "topk", &jz, "parameters.topk", &a),
              ERR_BAD_REQUEST);
    ASSERT_EQ(attention_request_reduce_param(&rb, "topk", &iz, "parameters.topk", &b),
              ERR_BAD_REQUEST);
    json_decref(zero);
    ASSERT_STR_EQ(a.message, b.message);
    ASSERT_STR_EQ(a.message, "parameters.topk is 0; it must be a whole number from 1 to the "
                             "number of keys.");
    /* a string where a boolean goes */
    s = scalar_string("yes");
    ASSERT_EQ(attention_request_reduce_param(&ra, "entropy", &s, "parameters.entropy", &a),
              ERR_BAD_REQUEST);
    ASSERT_STR_EQ(a.message, "parameters.entropy is a string; it must be true or false.");
    attention_request_free(&ra);
    attention_request_free(&rb);
}

/*
 * itest_named.c - attention with a stored weight set must equal the same request with
 * the weights inline, for a table of set and request shapes.
 */
#include "itest.h"

/* A stored set and a request that names it. Zero means absent / default. */
struct named_case {
    const char *name;              /* test name; the set is stored as "named-NAME" */
    size_t d_in, d_ctx, dk, dv;    /* d_ctx 0: self-attention (d_ctx = d_in) */
    size_t d_out;                  /* 0: no wo */
    int biases, bo, out_in;        /* bq/bk/bv, bo, weights_layout out_in */
    size_t set_heads;              /* heads stored with the set */
    size_t request_heads;          /* heads named in the request */
    int request_layout;            /* the request repeats the set's weights_layout */
    size_t lq, lk;                 /* tokens of x and of context (lk 0: no context) */
    size_t batch;                  /* 0: 2-D input */
    int causal, columns, no_attention;
};

static const struct named_case g_named_cases[] = {
    {.name = "plain-wo-bo", .d_in = 5, .dk = 4, .dv = 3, .d_out = 6, .biases = 1, .bo = 1, .lq = 4},
    {.name = "set-heads", .d_in = 6, .dk = 4, .dv = 6, .set_heads = 2, .lq = 3},
    {.name = "set-heads-repeated-in-request", .d_in = 3, .dk = 6, .dv = 3, .set_heads = 3, .request_heads = 3,
     .lq = 2},
    {.name = "out-in", .d_in = 3, .dk = 5, .dv = 2, .d_out = 4, .out_in = 1, .biases = 1, .lq = 4},
    {.name = "out-in-layout-repeated", .d_in = 4, .dk = 2, .dv = 3, .out_in = 1, .request_layout = 1, .lq = 3},
    {.name = "context", .d_in = 3, .d_ctx = 5, .dk = 4, .dv = 4, .biases = 1, .lq = 2, .lk = 6},
    {.name = "context-request-heads", .d_in = 3, .d_ctx = 5, .dk = 4, .dv = 4, .request_heads = 2, .lq = 3,
     .lk = 4},
    {.name = "batched-causal-columns-out-in-heads", .d_in = 4, .dk = 4, .dv = 2, .d_out = 3, .bo = 1, .out_in = 1,
     .set_heads = 2, .lq = 3, .batch = 2, .causal = 1, .columns = 1},
    {.name = "context-batched-no-attention", .d_in = 2, .d_ctx = 3, .dk = 2, .dv = 5, .biases = 1, .lq = 3,
     .lk = 2, .batch = 3, .no_attention = 1},
};

/* Runs one named case: PUT the set, POST by name and inline, compare; DELETE the set. */
static void run_named_case(const struct named_case *nc, size_t index)
{
    struct test t;
    struct server *s;
    char test_name[256], set_name[128], path[256];
    snprintf(test_name, sizeof test_name, "named/%s", nc->name);
    snprintf(set_name, sizeof set_name, "named-%s", nc->name);
    snprintf(path, sizeof path, "/v1/weight-sets/%s", set_name);
    if (!test_start(&t, SERVER_DEFAULT, &s, test_name))
        return;
    uint64_t rng = RANDOM_SEED + 104729u * (uint64_t)(index + 1);
    const size_t d_ctx = nc->d_ctx ? nc->d_ctx : nc->d_in, batch = nc->batch ? nc->batch : 1;
    const int batched = nc->batch > 0;
    json_t *set = random_weight_set(&rng, nc->d_in, d_ctx, nc->dk, nc->dv, nc->d_out, nc->biases, nc->bo, nc->out_in,
                                    nc->set_heads);
    json_t *named = json_object(), *inline_req;
    double *x = random_values(&rng, batch * nc->lq * nc->d_in, 1.0, 0);
    json_object_set_new(named, "x", json_tensor(x, batch, nc->lq, nc->d_in, batched, nc->columns));
    free(x);
    if (nc->lk > 0) {
        double *c = random_values(&rng, batch * nc->lk * d_ctx, 1.0, 0);
        json_object_set_new(named, "context", json_tensor(c, batch, nc->lk, d_ctx, batched, nc->columns));
        free(c);
    }
    if (nc->causal)
        json_object_set_new(named, "causal", json_true());
    if (nc->columns)
        json_object_set_new(named, "layout", json_string("columns"));
    if (nc->no_attention)
        json_object_set_new(named, "return_attention", json_false());
    if (nc->request_heads)
        json_object_set_new(named, "heads", json_integer((json_int_t)nc->request_heads));
    if (nc->request_layout)
        json_object_set_new(named, "weights_layout", json_string(nc->out_in ? "out_in" : "in_out"));
    inline_req = json_deep_copy(named);
    json_object_set_new(named, "weights", json_string(set_name));
    json_object_set_new(inline_req, "weights", weights_of(set));
    if (nc->out_in)
        json_object_set_new(inline_req, "weights_layout", json_string("out_in"));
    if (nc->set_heads && !nc->request_heads)
        json_object_set_new(inline_req, "heads", json_integer((json_int_t)nc->set_heads));

    struct client_response r_named = {0}, r_inline = {0};
    json_t *b_named = NULL, *b_inline = NULL;
    json_decref(put_set(&t, s, set_name, set, 201));
    if (t.failed)
        goto done;
    http_post_json(s, "/v1/attention", named, &r_named);
    http_post_json(s, "/v1/attention", inline_req, &r_inline);
    if (!expect_status(&t, &r_named, 200) || !expect_status(&t, &r_inline, 200))
        goto done;
    b_named = response_json(&r_named);
    b_inline = response_json(&r_inline);
    expect_same_answer(&t, b_named, b_inline);
    size_t heads = nc->request_heads ? nc->request_heads : nc->set_heads;
    if (heads > 0) {
        /* The heads axis must be there even though the request did not name heads. */
        const json_t *meta_heads = json_object_get(json_object_get(b_named, "meta"), "heads");
        expect_true(&t, json_integer_value(meta_heads) == (json_int_t)heads, "meta.heads is not %zu", heads);
        const json_t *a = json_object_get(b_named, "attention");
        if (batched)
            a = json_array_get(a, 0);
        if (!nc->no_attention)
            expect_true(&t, json_array_size(a) == heads && json_is_array(json_array_get(json_array_get(a, 0), 0)),
                        "attention has no heads axis of %zu", heads);
    }
done:
    if (t.failed) {
        char snippet[400];
        body_snippet(r_named.body ? r_named.body : "", r_named.body_len, snippet, sizeof snippet);
        test_detail(&t, "    by-name answer: %s", snippet);
    }
    struct client_response r;
    http_simple(s, "DELETE", path, &r);
    client_response_free(&r);
    json_decref(b_named);
    json_decref(b_inline);
    client_response_free(&r_named);
    client_response_free(&r_inline);
    json_decref(set);
    json_decref(named);
    json_decref(inline_req);
    test_end(&t);
}

/* The cases above, then a set replaced and deleted under the same name. */
void run_named_attention_tests(const struct itest_paths *paths)
{
    (void)paths;
    for (size_t i = 0; i < sizeof g_named_cases / sizeof g_named_cases[0]; i++)
        run_named_case(&g_named_cases[i], i);

    struct test t;
    struct server *s;
    struct client_response r;
    static const char x_request[] = "{\"x\": [[1, 2], [3, -1]], \"weights\": \"named-lifecycle\"}";
    if (test_start(&t, SERVER_DEFAULT, &s, "named/follows-replace-and-delete")) {
        /* Two sets of the same shapes with different numbers: the answer must follow the PUTs. */
        static const char set_a[] = "{\"wq\": [[1, 0], [0, 1]], \"wk\": [[1, 0], [0, 1]], \"wv\": [[1, 2], [3, 4]]}";
        static const char set_b[] = "{\"wq\": [[0, 1], [1, 0]], \"wk\": [[2, 0], [0, 2]], \"wv\": [[-1, 0], [0, -1]]}";
        json_t *answers[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            json_decref(put_set_text(&t, s, "named-lifecycle", i ? set_b : set_a, i ? 200 : 201));
            http_text(s, "POST", "/v1/attention", x_request, &r);
            if (expect_status(&t, &r, 200))
                answers[i] = response_json(&r);
            client_response_free(&r);
            /* The same request with the set inline. */
            json_t *req = json_from_text(x_request), *w = json_from_text(i ? set_b : set_a);
            json_object_set_new(req, "weights", w);
            http_post_json(s, "/v1/attention", req, &r);
            json_decref(req);
            json_t *want = response_json(&r);
            if (expect_status(&t, &r, 200) && answers[i] != NULL)
                expect_same_answer(&t, answers[i], want);
            json_decref(want);
            client_response_free(&r);
        }
        char path[64] = "output", why[512];
        expect_true(&t, answers[0] && answers[1] && !json_numbers_close(json_object_get(answers[1], "output"),
                                                                         json_object_get(answers[0], "output"), 1e-9,
                                                                         0, path, sizeof path, why, sizeof why),
                    "the answer did not change when the set was replaced");
        http_simple(s, "DELETE", "/v1/weight-sets/named-lifecycle", &r);
        expect_status(&t, &r, 204);
        client_response_free(&r);
        http_text(s, "POST", "/v1/attention", x_request, &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "weights");
        client_response_free(&r);
        json_decref(answers[0]);
        json_decref(answers[1]);
        test_end(&t);
    }
}

/*
 * test_attention_json.c - the POST /v1/attention decoder and the answer encoder.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>

#include "core/sizing.h"
#include "v1/attention_json.h"
#include "core/config.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "integration/case_body.h"
#include "test.h"

/* Parses text[0..len) as the server does and decodes it; a body that does
 * not parse returns the parser's error (err filled). */
static int decode_bytes(const char *text, size_t len, size_t max_elements,
                        attention_request *req, attn_error *err)
{
    error_clear(err);
    memset(req, 0, sizeof *req);
    json_t *root = json_in_parse(text, len, NULL, err);
    if (root == NULL)
        return err->kind;
    attention_json_limits limits = {max_elements};
    sequence_ask seq_ask;
    int rc = attention_json_decode(root, &limits, req, &seq_ask, err);
    json_decref(root);
    return rc;
}

static int decode_text(const char *text, size_t max_elements, attention_request *req,
                       attn_error *err)
{
    return decode_bytes(text, strlen(text), max_elements, req, err);
}

void test_attention_json_qkv_shapes_and_scale(void)
{
    attention_request req;
    attn_error err;
    ASSERT_EQ(decode_text("{\"q\":[[1,2,3,4]],\"k\":[[1,2,3,4],[5,6,7,8]],"
                          "\"v\":[[1,2],[3,4]],\"heads\":2,\"causal\":true}", 1000, &req, &err), 0);
    ASSERT_EQ(req.job.lq, 1);
    ASSERT_EQ(req.job.lk, 2);
    ASSERT_EQ(req.job.dk, 4);
    ASSERT_EQ(req.job.dv, 2);
    ASSERT_EQ(req.job.heads, 2);
    ASSERT_EQ(req.job.causal, 1);
    ASSERT_EQ(req.batched, 0);
    ASSERT_EQ(req.input_elements, 4 + 8 + 4);
    ASSERT_NEAR(req.job.scale, 1 / sqrt(2.0), 1e-16);
    ASSERT_NEAR(req.job.k[5], 6, 0);
    attention_request_free(&req);
    ASSERT_EQ(decode_text("{\"q\":[[[1]],[[2]]],\"k\":[[[1]],[[2]]],\"v\":[[[1]],[[2]]],"
                          "\"scale\":2.5,\"dtype\":\"float32\"}", 1000, &req, &err), 0);
    ASSERT_EQ(req.batched, 1);
    ASSERT_EQ(req.job.batch, 2);
    ASSERT_NEAR(req.job.scale, 2.5, 0);
    ASSERT_EQ(req.job.dtype, ATTN_FLOAT32);
    attention_request_free(&req);
}

void test_attention_json_columns_layout_transposes(void)
{
    attention_request req;
    attn_error err;
    /* q given as 2 features x 3 tokens. */
    ASSERT_EQ(decode_text("{\"q\":[[1,2,3],[4,5,6]],\"k\":[[1,2],[3,4]],\"v\":[[1,2],[3,4]],"
                          "\"layout\":\"columns\"}", 1000, &req, &err), 0);
    ASSERT_EQ(req.job.lq, 3);
    ASSERT_EQ(req.job.dk, 2);
    ASSERT_NEAR(req.job.q[0], 1, 0);
    ASSERT_NEAR(req.job.q[1], 4, 0);
    ASSERT_NEAR(req.job.q[2], 2, 0);
    attention_request_free(&req);
    /* In columns layout, q has 2 rows (features) but k has 3: the message says rows
     * hold the features. */
    ASSERT_EQ(decode_text("{\"q\":[[1],[2]],\"k\":[[1],[2],[3]],\"v\":[[1]],"
                          "\"layout\":\"columns\"}", 1000, &req, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "k");
    ASSERT(strstr(err.message, "k has 3 features per token (its rows) but q has 2") != NULL);
}

void test_attention_json_out_in_weights_transpose(void)
{
    attention_request req;
    attn_error err;
    /* x: 1 token of width 3; wq out_in is (2 x 3). */
    ASSERT_EQ(decode_text("{\"x\":[[1,2,3]],\"weights_layout\":\"out_in\",\"weights\":{"
                          "\"wq\":[[1,2,3],[4,5,6]],\"wk\":[[1,2,3],[4,5,6]],\"wv\":[[1,2,3]],"
                          "\"bq\":[1,2],\"wo\":[[1]],\"bo\":[0.5]}}", 1000, &req, &err), 0);
    ASSERT_EQ(req.job.dk, 2);
    ASSERT_EQ(req.job.dv, 1);
    ASSERT_EQ(req.weights.d_in, 3);
    ASSERT_EQ(req.weights.d_out, 1);
    /* in_out wq is (3 x 2): row 0 = [1, 4] */
    ASSERT_NEAR(req.weights.wq[0], 1, 0);
    ASSERT_NEAR(req.weights.wq[1], 4, 0);
    ASSERT_NEAR(req.weights.wq[2], 2, 0);
    ASSERT(req.job.weights == &req.weights);
    ASSERT_NEAR(req.job.scale, 1 / sqrt(2.0), 1e-16);
    attention_request_free(&req);
}

void test_attention_json_mask_forms(void)
{
    attention_request req;
    attn_error err;
    ASSERT_EQ(decode_text("{\"q\":[[1],[2]],\"k\":[[1],[2]],\"v\":[[1],[2]],"
                          "\"mask\":[[true,false],[1,0.0]]}", 1000, &req, &err), 0);
    ASSERT(req.job.mask != NULL);
    ASSERT_EQ(req.job.mask[0], 1);
    ASSERT_EQ(req.job.mask[1], 0);
    ASSERT_EQ(req.job.mask[2], 1);
    ASSERT_EQ(req.job.mask[3], 0);
    ASSERT_EQ(req.job.mask_batched, 0);
    attention_request_free(&req);
    ASSERT_EQ(decode_text("{\"q\":[[[1]],[[2]]],\"k\":[[[1]],[[2]]],\"v\":[[[1]],[[2]]],"
                          "\"mask\":[[[true]],[[false]]]}", 1000, &req, &err), 0);
    ASSERT_EQ(req.job.mask_batched, 1);
    ASSERT_EQ(req.job.mask[1], 0);
    attention_request_free(&req);
}

void test_attention_json_named_weights(void)
{
    attention_request req;
    attn_error err;
    ASSERT_EQ(decode_text("{\"x\":[[1,2]],\"weights\":\"encoder.v1\"}", 1000, &req, &err), 0);
    ASSERT_STR_EQ(req.weights_name, "encoder.v1");
    ASSERT(req.job.weights == NULL);
    attn_weights w = {.d_in = 2, .d_ctx = 2, .dk = 4, .dv = 3, .d_out = 3};
    req.job.heads = 2;
    ASSERT_EQ(attention_request_bind_weights(&req, &w, 1, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "heads");
    req.job.heads = 1;
    w.d_in = 5;
    ASSERT_EQ(attention_request_bind_weights(&req, &w, 1, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "x");
    w.d_in = 2;
    ASSERT_EQ(attention_request_bind_weights(&req, &w, 1, &err), 0);
    ASSERT(req.job.weights == &w);
    ASSERT_NEAR(req.job.scale, 0.5, 0);
    attention_request_free(&req);
}

/* ---- the integration cases, through the decoder ------------------------- */

/* The unit tests run from the repository root (make test, tests/run.sh). */
#define CASES_DIR "tests/integration/cases"

/* What the decoder (and, for a request it accepts, the computation) says
 * about one case.  Returns 1 when the case was checked, 0 when it needs what
 * only the server has (a stored weight set); on a wrong answer writes why. */
static int check_case(const json_t *c, size_t max_elements, char *why, size_t why_len)
{
    const json_t *expect = json_object_get(c, "expect");
    const json_t *raw = json_object_get(c, "raw_body");
    const char *want_code = json_string_value(json_object_get(expect, "code"));
    const json_t *want_field = json_object_get(expect, "field");
    attention_request req;
    attn_error err;
    int rc;
    if (raw != NULL) {
        rc = decode_bytes(json_string_value(raw), json_string_length(raw), max_elements, &req,
                          &err);
    } else {
        json_t *body = case_body_expand(json_object_get(c, "body"));
        char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(body);
        rc = decode_text(text ? text : "", max_elements, &req, &err);
        mem_free(text);
    }
    if (rc == 0 && req.weights_name[0] != '\0') {
        attention_request_free(&req);
        return 0;
    }
    if (rc == 0) {
        attn_result r;
        rc = attention_run(&req.job, &r, &err);
        if (rc == 0)
            attention_result_free(&r);
        attention_request_free(&req);
    }
    *why = '\0';
    if (rc != ERR_BAD_REQUEST)
        snprintf(why, why_len, "got %d (%s), expected a 400", rc, rc ? err.code : "accepted");
    else if (want_code != NULL && strcmp(err.code, want_code) != 0)
        snprintf(why, why_len, "code %s (%s), expected %s", err.code, err.message, want_code);
    else if (json_is_string(want_field) && strcmp(err.field, json_string_value(want_field)) != 0)
        snprintf(why, why_len, "field \"%s\", expected \"%s\"", err.field,
                 json_string_value(want_field));
    else if (json_is_null(want_field) && err.field[0] != '\0')
        snprintf(why, why_len, "field \"%s\", expected none", err.field);
    else if (strlen(err.message) < 20)
        snprintf(why, why_len, "message too short: \"%s\"", err.message);
    return 1;
}

/* Every invalid POST /v1/attention of the integration case files
 * (tests/integration/cases/README.md) that the decoder can judge alone: the
 * default server, no extra headers or padding, not a raw request, status 400.  Each must fail
 * with the case's code and field, here as over HTTP. */
void test_attention_json_integration_cases(void)
{
    server_config cfg;
    char errbuf[128];
    char *argv[] = {"unit-tests", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(&cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(&cfg, 1, "cores"); /* as main.c does */
    DIR *d = opendir(CASES_DIR);
    if (d == NULL)
        FAIL_AT("cannot open %s (run the unit tests from the repository root)", CASES_DIR);
    struct dirent *e;
    size_t checked = 0, needs_store = 0, failed = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CASES_DIR, e->d_name);
        json_error_t jerr;
        json_t *cases = json_load_file(path, JSON_ALLOW_NUL, &jerr);
        if (!json_is_array(cases)) {
            fprintf(stderr, "  %s: not an array of cases (%s)\n", path, jerr.text);
            failed++;
            json_decref(cases);
            continue;
        }
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const char *method = json_string_value(json_object_get(c, "method"));
            const char *cpath = json_string_value(json_object_get(c, "path"));
            const char *server = json_string_value(json_object_get(c, "server"));
            const json_t *status = json_object_get(json_object_get(c, "expect"), "status");
            if ((method != NULL && strcmp(method, "POST") != 0) ||
                (cpath != NULL && strcmp(cpath, "/v1/attention") != 0) ||
                (server != NULL && strcmp(server, "default") != 0) ||
                json_object_get(c, "headers") != NULL || json_object_get(c, "pad_to_bytes") != NULL ||
                json_object_get(c, "raw_request") != NULL ||
                json_number_value(status) != 400)
                continue;
            char why[600];
            if (!check_case(c, cfg.max_elements, why, sizeof why)) {
                needs_store++;
                continue;
            }
            checked++;
            if (why[0] != '\0') {
                fprintf(stderr, "  %s %s: %s\n", e->d_name,
                        json_string_value(json_object_get(c, "name")), why);
                failed++;
            }
        }
        json_decref(cases);
    }
    closedir(d);
    if (failed != 0)
        FAIL_AT("%zu of %zu cases answered differently by the decoder", failed, checked);
    if (checked < 100)
        FAIL_AT("only %zu cases checked (%zu need a stored set): are the case files there?",
                checked, needs_store);
}

/* Invalid requests whose field the case files do not check, or that they
 * do not hold. */
typedef struct bad_case {
    const char *json;
    const char *code;
    const char *field;
} bad_case;

#define QKV "\"q\":[[1,2]],\"k\":[[1,2]],\"v\":[[1]]"
#define X_WEIGHTS(wq, wk, wv) \
    "\"x\":[[1,2]],\"weights\":{\"wq\":" wq ",\"wk\":" wk ",\"wv\":" wv "}"

static const bad_case bad_cases[] = {
    {"{}", "missing_field", "q"},
    {"{\"q\":[[1,2],3],\"k\":[[1,2]],\"v\":[[1]]}", "ragged_matrix", "q[1]"},
    {"{\"q\":[[]],\"k\":[[1,2]],\"v\":[[1]]}", "invalid_shape", "q"},
    {"{\"q\":[[[1,2]]],\"k\":[[1,2]],\"v\":[[1]]}", "shape_mismatch", "k"},
    {"{" QKV ",\"heads\":2}", "shape_mismatch", "heads"},
    {"{" QKV ",\"x\":[[1]]}", "conflicting_fields", "x"},
    {"{" QKV ",\"weights\":{}}", "conflicting_fields", "weights"},
    {"{" X_WEIGHTS("[[1],[1]]", "[[1],[1]]", "[[1]]") "}", "shape_mismatch", "weights.wv"},
    {"{\"context\":[[1,2,3]]," X_WEIGHTS("[[1],[1]]", "[[1],[1]]", "[[1],[1]]") "}",
     "shape_mismatch", "weights.wk"},
    {"{\"context\":[[[1,2]]]," X_WEIGHTS("[[1],[1]]", "[[1],[1]]", "[[1],[1]]") "}",
     "shape_mismatch", "context"},
};

void test_attention_json_invalid_cases(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        attention_request req;
        attn_error err;
        int rc = decode_text(c->json, 1000, &req, &err);
        if (rc == 0)
            attention_request_free(&req);
        if (rc != ERR_BAD_REQUEST || strcmp(err.code, c->code) != 0 ||
            strcmp(err.field, c->field) != 0)
            FAIL_AT("case %zu %s: got %d %s field \"%s\" (%s), want 400 %s field \"%s\"", i,
                    c->json, rc, err.code, err.field, err.message, c->code, c->field);
        if (strlen(err.message) < 20)
            FAIL_AT("case %zu: message too short: \"%s\"", i, err.message);
    }
    /* The message names the problem in the user's terms (the case files
     * check codes and fields, not words). */
    attention_request req;
    attn_error err;
    decode_text("{\"q\":[[1,2,3,4]],\"k\":[[1,2,3]],\"v\":[[1]]}", 1000, &req, &err);
    ASSERT_STR_EQ(err.message, "k has 3 features per token (its columns) but q has 4 (both must "
                               "be dk).");
    decode_text("{" QKV ",\"casual\":true}", 1000, &req, &err);
    ASSERT(strstr(err.message, "Did you mean \"causal\"?") != NULL);
}

void test_attention_json_element_limit(void)
{
    attention_request req;
    attn_error err;
    /* 4 + 4 + 4 numbers: 12 fit, 11 do not. */
    const char *body = "{\"q\":[[1,2],[3,4]],\"k\":[[1,2],[3,4]],\"v\":[[1,2],[3,4]]}";
    ASSERT_EQ(decode_text(body, 12, &req, &err), 0);
    attention_request_free(&req);
    ASSERT_EQ(decode_text(body, 11, &req, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "request_too_large");
    ASSERT_STR_EQ(err.field, "v");
}

void test_attention_json_response_shapes(void)
{
    attention_request req;
    attn_error err;
    /* batch 2, heads 2, lq 3, lk 1, columns layout: output comes back dv x lq. */
    ASSERT_EQ(decode_text("{\"q\":[[[1,2,3],[4,5,6]],[[1,2,3],[4,5,6]]],"
                          "\"k\":[[[1],[2]],[[3],[4]]],\"v\":[[[1],[2]],[[3],[4]]],"
                          "\"heads\":2,\"layout\":\"columns\"}", 1000, &req, &err), 0);
    attn_result r;
    ASSERT_EQ(attention_run(&req.job, &r, &err), 0);
    jw_buf w;
    jw_init(&w, 0);
    attention_json_encode(&req, &r, 1.5, NULL, &w);
    attention_result_free(&r);
    attention_request_free(&req);
    char *text = jw_finish(&w, NULL);
    ASSERT(text != NULL);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    mem_free(text);
    ASSERT(root != NULL);
    json_t *out = json_object_get(root, "output"), *attn = json_object_get(root, "attention");
    int ok = json_array_size(out) == 2 && json_array_size(json_array_get(out, 0)) == 2 &&
             json_array_size(json_array_get(json_array_get(out, 0), 0)) == 3 &&
             json_array_size(attn) == 2 && json_array_size(json_array_get(attn, 0)) == 2 &&
             json_array_size(json_array_get(json_array_get(attn, 0), 0)) == 3 &&
             json_array_size(json_array_get(json_array_get(json_array_get(attn, 0), 0), 0)) == 1;
    /* With a single key every weight is exactly 1. */
    double w000 = json_number_value(json_array_get(json_array_get(json_array_get(json_array_get(attn, 1), 1), 2), 0));
    json_t *meta = json_object_get(root, "meta");
    int heads = (int)json_integer_value(json_object_get(meta, "heads"));
    int batch = (int)json_integer_value(json_object_get(meta, "batch"));
    json_decref(root);
    ASSERT(ok);
    ASSERT_NEAR(w000, 1.0, 0);
    ASSERT_EQ(heads, 2);
    ASSERT_EQ(batch, 2);
}

/* Integer-valued fields take any spelling of a whole number, and numbers
 * past 2^63 are numbers. */
void test_attention_json_big_integers(void)
{
    attention_request req;
    attn_error err;
    ASSERT_EQ(decode_text("{\"q\":[[9223372036854775808,0]],\"k\":[[1,0]],"
                          "\"v\":[[123456789012345678901234567890,0]],\"heads\":2}", 1000, &req,
                          &err), 0);
    ASSERT_NEAR(req.job.q[0], 9223372036854775808.0, 0);
    ASSERT_NEAR(req.job.v[0], 123456789012345678901234567890.0, 0);
    ASSERT_EQ(req.job.heads, 2);
    attention_request_free(&req);
    ASSERT_EQ(decode_text("{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1,1]],\"heads\":2.0}", 1000,
                          &req, &err), 0);
    ASSERT_EQ(req.job.heads, 2);
    attention_request_free(&req);
    ASSERT_EQ(decode_text("{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1,1]],\"heads\":2.5}", 1000,
                          &req, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_value");
    ASSERT_STR_EQ(err.field, "heads");
    ASSERT_EQ(decode_text("{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1,1]],"
                          "\"heads\":9223372036854775808}", 1000, &req, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "invalid_value");
    ASSERT_STR_EQ(err.field, "heads");
}

/* Decodes body, computes and encodes the answer; returns the parsed answer
 * (caller drops it) or NULL with err filled. */
static json_t *answer_of(const char *body, attn_error *err)
{
    attention_request req;
    if (decode_text(body, 1000, &req, err) != 0)
        return NULL;
    attn_result r;
    int rc = attention_run(&req.job, &r, err);
    json_t *answer = NULL;
    if (rc == 0) {
        jw_buf w;
        jw_init(&w, 0);
        attention_json_encode(&req, &r, 0.0, NULL, &w);
        attention_result_free(&r);
        char *text = jw_finish(&w, NULL);
        answer = text ? json_in_parse(text, strlen(text), NULL, err) : NULL;
        mem_free(text);
    }
    attention_request_free(&req);
    return answer;
}

/* Through the decoder and encoder: answers near the largest number of each
 * precision come back, with and without the attention matrix. */
void test_attention_json_finite_near_max(void)
{
    static const char *const bodies[] = {
        "{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[9e307],[9e307]]}",
        "{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[9e307],[9e307]],\"return_attention\":false}",
        "{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[3e38],[3e38]],\"dtype\":\"float32\"}",
        "{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[3e38],[3e38]],\"dtype\":\"float32\","
        "\"return_attention\":false}"};
    /* float32 answers are printed with the fewest digits that give the float. */
    static const double want[] = {9e307, 9e307, 3e38, 3e38};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        attn_error err;
        error_clear(&err);
        json_t *answer = answer_of(bodies[i], &err);
        if (answer == NULL)
            FAIL_AT("%s: %s (%s)", bodies[i], err.code, err.message);
        json_t *out = json_array_get(json_array_get(json_object_get(answer, "output"), 0), 0);
        double got = json_number_value(out);
        int is_number = json_is_number(out);
        int has_attention = json_object_get(answer, "attention") != NULL;
        double a0 = json_number_value(
            json_array_get(json_array_get(json_object_get(answer, "attention"), 0), 0));
        json_decref(answer);
        ASSERT(is_number);
        ASSERT_NEAR(got, want[i], 0);
        if (i >= 2)
            ASSERT((float)got == 3e38f);
        ASSERT_EQ(has_attention, i % 2 == 0);
        if (has_attention)
            ASSERT_NEAR(a0, 0.5, 0);
    }
    /* float32 cannot hold 4e38: that answer is not finite. */
    attn_error err;
    ASSERT(answer_of("{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[4e38],[4e38]],\"dtype\":\"float32\"}",
                     &err) == NULL);
    ASSERT_STR_EQ(err.code, "not_finite");
}

/*
 * test_request_faults.c - one fault, the same words on v1 and v2.
 *
 * Each case is a request with one fault between its inputs (shapes, heads,
 * scale, mask), written once as shapes.  It is sent to the v1 decoder as a
 * POST /v1/attention body and to the v2 handler as an inference request for
 * the built-in model; both must state the fault in the same words, v1 with
 * the member as the error's field, v2 with the input's place before them.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sizing.h"
#include "v1/attention_json.h"
#include "core/config.h"
#include "json/json_in.h"
#include "test.h"
#include "v2/v2.h"

typedef struct fault_case {
    const char *about;
    const char *q, *k, *v, *mask; /* shapes as JSON arrays; mask NULL for none */
    const char *params;     /* JSON object: v1 members, v2 "parameters" */
    const char *v1_field;   /* the error's field on v1 */
    const char *v2_place;   /* what v2 puts before the words ("" for nothing) */
    const char *words;      /* the message, the same on both */
} fault_case;

static const fault_case fault_cases[] = {
    {"k narrower than q", "[1,4]", "[1,3]", "[1,1]", NULL, "{}", "k", "inputs[1].shape: ",
     "k has 3 features per token (its columns) but q has 4 (both must be dk)."},
    {"v with more tokens than k", "[2,2]", "[2,2]", "[3,2]", NULL, "{}", "v", "inputs[2].shape: ",
     "v has 3 tokens (its rows) but k has 2 (both must be Lk, one per key)."},
    {"k without the batch axis of q", "[1,1,2]", "[1,2]", "[1,1,2]", NULL, "{}", "k",
     "inputs[1].shape: ", "k is 2-D but q is 3-D; give all inputs a leading batch axis, or none."},
    {"v with another batch", "[2,1,2]", "[2,1,2]", "[1,1,2]", NULL, "{}", "v",
     "inputs[2].shape: ", "v has a batch of 1 but q has 2; batch sizes must agree."},
    {"heads that do not divide dk", "[1,4]", "[1,4]", "[1,3]", NULL, "{\"heads\":3}", "heads",
     "parameters.heads: ", "heads = 3 does not divide dk = 4 (the width of queries and keys); "
     "choose a divisor of 4."},
    {"heads that do not divide dv", "[1,4]", "[1,4]", "[1,3]", NULL, "{\"heads\":2}", "heads",
     "parameters.heads: ", "heads = 2 does not divide dv = 3 (the width of values); choose a "
     "divisor of 3."},
    {"heads zero", "[1,2]", "[1,2]", "[1,2]", NULL, "{\"heads\":0}", "heads", "parameters.heads: ",
     "heads is 0; it must be a whole number >= 1 that divides dk and dv."},
    {"scale negative", "[1,2]", "[1,2]", "[1,2]", NULL, "{\"scale\":-1}", "scale",
     "parameters.scale: ", "scale is -1; it must be a number > 0 (it multiplies q k^T)."},
    {"scale a string", "[1,2]", "[1,2]", "[1,2]", NULL, "{\"scale\":\"big\"}", "scale",
     "parameters.scale: ", "scale is a string; it must be a number > 0."},
    {"mask of the wrong shape", "[2,2]", "[3,2]", "[3,2]", "[2,2]", "{}", "mask",
     "inputs[3].shape: ", "mask is 2 x 2 but it must be Lq x Lk = 2 x 3 (one row per query, one "
     "column per key, whatever the layout)."},
    {"batched mask, unbatched inputs", "[2,2]", "[2,2]", "[2,2]", "[1,2,2]", "{}", "mask",
     "inputs[3].shape: ", "mask is 3-D but the inputs have no batch axis; give mask as Lq x Lk "
     "= 2 x 2."},
    {"mask of another batch", "[2,1,2]", "[2,1,2]", "[2,1,2]", "[3,1,1]", "{}", "mask",
     "inputs[3].shape: ", "mask has a batch of 3 but the inputs have 2."},
};

/* A nested JSON array of the given shape, every element `one`. */
static json_t *nested(const json_t *shape, size_t axis, json_t *one)
{
    if (axis == json_array_size(shape))
        return json_incref(one);
    json_t *a = json_array();
    size_t n = (size_t)json_integer_value(json_array_get(shape, axis));
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, nested(shape, axis + 1, one));
    return a;
}

/* The v1 body of c: q, k, v (and mask) nested, with the params as members. */
static char *v1_body(const fault_case *c)
{
    const char *names[4] = {"q", "k", "v", "mask"};
    const char *shapes[4] = {c->q, c->k, c->v, c->mask};
    json_t *root = json_loads(c->params, 0, NULL);
    for (int i = 0; i < 4 && shapes[i] != NULL; i++) {
        json_t *shape = json_loads(shapes[i], 0, NULL);
        json_t *one = i == 3 ? json_true() : json_integer(1);
        json_object_set_new(root, names[i], nested(shape, 0, one));
        json_decref(one);
        json_decref(shape);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

/* The v2 header of c: inputs q, k, v (and mask) with flat data. */
static char *v2_body(const fault_case *c)
{
    const char *names[4] = {"q", "k", "v", "mask"};
    const char *shapes[4] = {c->q, c->k, c->v, c->mask};
    json_t *inputs = json_array();
    for (int i = 0; i < 4 && shapes[i] != NULL; i++) {
        json_t *shape = json_loads(shapes[i], 0, NULL), *data = json_array();
        size_t n = 1;
        for (size_t d = 0; d < json_array_size(shape); d++)
            n *= (size_t)json_integer_value(json_array_get(shape, d));
        for (size_t j = 0; j < n; j++)
            json_array_append_new(data, i == 3 ? json_true() : json_integer(1));
        json_array_append_new(inputs, json_pack("{s:s,s:o,s:s,s:o}", "name", names[i], "shape",
                                                shape, "datatype", i == 3 ? "BOOL" : "FP64",
                                                "data", data));
    }
    json_t *root = json_pack("{s:o,s:o}", "inputs", inputs, "parameters",
                             json_loads(c->params, 0, NULL));
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

/* Sends c to the v1 decoder; fills err with its fault. */
static int v1_fault(const fault_case *c, attn_error *err)
{
    char *body = v1_body(c);
    json_t *root = json_in_parse(body, strlen(body), attention_json_tensor_field, err);
    free(body);
    if (root == NULL)
        return -1;
    attention_request req;
    attention_json_limits limits = {100000};
    sequence_ask seq_ask;
    int rc = attention_json_decode(root, &limits, &req, &seq_ask, err);
    json_decref(root);
    if (rc == 0)
        attention_request_free(&req);
    return rc;
}

/* Sends c to the v2 handler; copies its error sentence to text. */
static int v2_fault(const fault_case *c, const server_config *cfg, char *text, size_t cap)
{
    char *body = v2_body(c);
    route_args args;
    api_request req = {.method = "POST", .path = "/v2/models/attention/infer", .body = body,
                       .body_len = strlen(body)};
    req.route = route_find(req.path, &args);
    req.args = &args;
    api_response resp;
    memset(&resp, 0, sizeof resp);
    resp.route = ROUTE_V2_INFER;        /* as api_handle sets it: errors in v2's form */
    api_env env = {cfg, NULL, 0};
    v2_handle_infer(&req, &env, &resp);
    free(body);
    json_t *answer = json_loadb(resp.body, resp.body_len, 0, NULL);
    const char *sentence = json_string_value(json_object_get(answer, "error"));
    snprintf(text, cap, "%s", sentence != NULL ? sentence : "");
    json_decref(answer);
    int status = resp.status;
    api_response_free(&resp);
    return status;
}

void test_request_faults_same_words(void)
{
    server_config cfg;
    char errbuf[128];
    char *argv[] = {"unit-tests", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(&cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(&cfg, 1, "cores"); /* as main.c does */
    for (size_t i = 0; i < sizeof fault_cases / sizeof fault_cases[0]; i++) {
        const fault_case *c = &fault_cases[i];
        attn_error err;
        error_clear(&err);
        char want[512], got[512];
        if (v1_fault(c, &err) != ERR_BAD_REQUEST || strcmp(err.field, c->v1_field) != 0 ||
            strcmp(err.message, c->words) != 0)
            FAIL_AT("%s, v1: field \"%s\", \"%s\"; want field \"%s\", \"%s\"", c->about,
                    err.field, err.message, c->v1_field, c->words);
        snprintf(want, sizeof want, "%s%s", c->v2_place, c->words);
        int status = v2_fault(c, &cfg, got, sizeof got);
        if (status != 400 || strcmp(got, want) != 0)
            FAIL_AT("%s, v2: %d \"%s\"; want 400 \"%s\"", c->about, status, got, want);
    }
}

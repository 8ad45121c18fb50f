/*
 * test_oom.c - every allocation failure is handled cleanly.
 *
 * As SQLite's malloc tests do, these fail the Nth allocation for N = 0, 1,
 * 2, ... until the operation succeeds, and check each time that it failed
 * with the out-of-memory answer and without a crash.  Leaks are caught by the
 * sanitizer build (LeakSanitizer) and valgrind, which run this same binary.
 */
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/sizing.h"
#include "router/api.h"
#include "core/mem.h"
#include "v1/attention_json.h"
#include "test.h"
#include "core/test_hooks.h"

static const char *const oom_body =
    "{\"x\":[[[1,2],[3,4],[5,6]],[[1,0],[0,1],[1,1]]],\"context\":[[[1,2],[3,4]],[[1,1],[2,2]]],"
    "\"heads\":2,\"causal\":true,\"mask\":[[1,1],[0,1],[1,0]],\"weights\":{"
    "\"wq\":[[1,2,3,4],[5,6,7,8]],\"wk\":[[1,0,1,0],[0,1,0,1]],\"wv\":[[1,2],[3,4]],"
    "\"bq\":[1,1,1,1],\"bv\":[0.5,0.5],\"wo\":[[1,2,3],[4,5,6]],\"bo\":[1,2,3]},"
    "\"dtype\":\"%s\"}";

/* Decodes, runs and encodes body; returns 0, or the failing step's code. */
static int full_pipeline(const char *body, attn_error *err)
{
    json_error_t jerr;
    json_t *root = json_loads(body, 0, &jerr);
    if (root == NULL)
        return error_nomem(err);
    attention_request req;
    attention_json_limits limits = {100000};
    sequence_ask seq_ask;
    int rc = attention_json_decode(root, &limits, &req, &seq_ask, err);
    json_decref(root);
    if (rc != 0)
        return rc;
    attn_result result;
    rc = attention_run(&req.job, &result, err);
    if (rc == 0) {
        jw_buf w;
        jw_init(&w, 16);
        attention_json_encode(&req, &result, 0.0, NULL, &w);
        char *text = jw_finish(&w, NULL);
        if (text == NULL)
            rc = error_nomem(err);
        mem_free(text);
        attention_result_free(&result);
    }
    attention_request_free(&req);
    return rc;
}

void test_oom_decode_run_encode(void)
{
    for (int dtype = 0; dtype < 2; dtype++) {
        char body[1024];
        snprintf(body, sizeof body, oom_body, dtype ? "float32" : "float64");
        attn_error err;
        ASSERT_EQ(full_pipeline(body, &err), 0);
        long n;
        for (n = 0; n < 10000; n++) {
            error_clear(&err);
            mem_fail_after(n);
            int rc = full_pipeline(body, &err);
            long failures = mem_failures();
            mem_fail_reset();
            if (rc == 0 && failures == 0)
                break;
            if (rc != ERR_UNAVAILABLE)
                FAIL_AT("dtype %d, allocation %ld failed: got %d (%s: %s)", dtype, n, rc, err.code,
                        err.message);
            ASSERT_STR_EQ(err.code, "overloaded");
        }
        if (n < 10)
            FAIL_AT("only %ld allocations: is failure injection reaching the code?", n);
    }
}

void test_oom_api_handle(void)
{
    server_config cfg;
    char errbuf[128];
    char *argv[] = {"attention-server", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(&cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(&cfg, 1, "cores"); /* as main.c does */
    char dir[] = "/tmp/attn-unit-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s", dir);
    attn_error err;
    ASSERT_EQ(api_init(&cfg, &err), 0);
    char body[1024];
    snprintf(body, sizeof body, oom_body, "float64");
    /* One stored set, so that listing has something to allocate for. */
    static const char set_body[] = "{\"wq\":[[1]],\"wk\":[[1]],\"wv\":[[1]]}";
    api_request put = {.method = "PUT", .path = "/v1/weight-sets/s", .body = set_body, .body_len = strlen(set_body)};
    api_response put_resp;
    api_handle(&put, &put_resp);
    ASSERT_EQ(put_resp.status, 201);
    api_response_free(&put_resp);
    static const struct { const char *method, *path; int ok; } calls[] = {
        {"POST", "/v1/attention", 200}, {"GET", "/v1/info", 200}, {"GET", "/metrics", 200},
        {"GET", "/nowhere", 404}, {"PUT", "/v1/attention", 405}, {"GET", "/v1/weight-sets", 200},
        {"GET", "/v1/weight-sets/s", 200}};
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        api_request req = {.method = calls[c].method, .path = calls[c].path, .body = body,
                           .body_len = strlen(body)};
        long n;
        for (n = 0; n < 10000; n++) {
            api_response resp;
            mem_fail_after(n);
            api_handle(&req, &resp);
            long failures = mem_failures();
            mem_fail_reset();
            int status = resp.status;
            int has_body = resp.body != NULL && resp.body_len > 0;
            api_response_free(&resp);
            if (!has_body)
                FAIL_AT("%s %s, allocation %ld: empty body", calls[c].method, calls[c].path, n);
            if (failures == 0) {
                ASSERT_EQ(status, calls[c].ok);
                break;
            }
            if (status != 503 && status != calls[c].ok)
                FAIL_AT("%s %s, allocation %ld failed: status %d", calls[c].method, calls[c].path,
                        n, status);
        }
    }
    api_request del = {.method = "DELETE", .path = "/v1/weight-sets/s"};
    api_handle(&del, &put_resp);
    ASSERT_EQ(put_resp.status, 204);
    api_response_free(&put_resp);
    api_shutdown();
    rmdir(dir);
}

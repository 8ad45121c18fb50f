/*
 * test_viz.c - the visualizer's routes through api_handle: the page, its
 * files, the golden examples and the redirect from /, and the example list
 * when memory runs out.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/sizing.h"
#include "router/api.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"
#include "viz/viz.h"

/* Starts the API on an empty temporary data directory (dir receives its path). */
static int viz_api_start(char *dir)
{
    server_config cfg;
    char errbuf[128];
    char *argv[] = {"attention-server", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(&cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(&cfg, 1, "cores"); /* as main.c does */
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s", dir);
    static server_config kept;
    kept = cfg;
    attn_error err;
    return api_init(&kept, &err);
}

static void get(const char *method, const char *path, api_response *resp)
{
    api_request req = {.method = method, .path = path};
    api_handle(&req, resp);
}

void test_viz_routes(void)
{
    char dir[] = "/tmp/attn-viz-XXXXXX";
    ASSERT_EQ(viz_api_start(dir), 0);
    api_response resp;

    get("GET", "/", &resp);
    ASSERT_EQ(resp.status, 302);
    ASSERT_STR_EQ(resp.location, "/viz");
    api_response_free(&resp);

    get("GET", "/viz", &resp);
    ASSERT_EQ(resp.status, 200);
    ASSERT_STR_EQ(resp.content_type, "text/html; charset=utf-8");
    ASSERT(resp.body_len > 100 && strncmp(resp.body, "<!doctype html>", 15) == 0);
    ASSERT(strstr(resp.body, "src=\"/viz/viz.js\"") != NULL);
    api_response_free(&resp);

    static const struct { const char *path, *type; } files[] = {
        {"/viz/viz.js", "text/javascript; charset=utf-8"},
        {"/viz/viz.css", "text/css; charset=utf-8"},
        {"/viz/index.html", "text/html; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        get("HEAD", files[i].path, &resp);
        ASSERT_EQ(resp.status, 200);
        ASSERT_STR_EQ(resp.content_type, files[i].type);
        ASSERT_EQ(resp.body_len, viz_find(files[i].path + 5)->size);
        api_response_free(&resp);
    }

    /* Every example listed is served, and is a golden case: a request and what to expect. */
    get("GET", "/viz/examples/", &resp);
    ASSERT_EQ(resp.status, 200);
    json_error_t jerr;
    json_t *list = json_loadb(resp.body, resp.body_len, 0, &jerr);
    api_response_free(&resp);
    ASSERT(list != NULL);
    json_t *examples = json_object_get(list, "examples");
    ASSERT(json_array_size(examples) > 0);
    size_t i;
    json_t *e;
    json_array_foreach(examples, i, e) {
        const char *url = json_string_value(json_object_get(e, "url"));
        char want[160];
        snprintf(want, sizeof want, "/viz/examples/%s.json",
                 json_string_value(json_object_get(e, "name")));
        if (url == NULL || strcmp(url, want) != 0) {
            json_decref(list);
            FAIL_AT("example %zu: url %s, expected %s", i, url ? url : "(none)", want);
        }
        get("GET", url, &resp);
        json_t *ex = resp.status == 200 ? json_loadb(resp.body, resp.body_len, 0, &jerr) : NULL;
        api_response_free(&resp);
        int ok = ex != NULL && json_is_object(json_object_get(ex, "request")) &&
                 json_is_object(json_object_get(ex, "expect"));
        json_decref(ex);
        if (!ok) {
            json_decref(list);
            FAIL_AT("%s is not served as a golden case", url);
        }
    }
    json_decref(list);

    get("GET", "/viz/nothing.js", &resp);
    ASSERT_EQ(resp.status, 404);
    ASSERT(strstr(resp.body, "\"not_found\"") != NULL);
    api_response_free(&resp);
    get("GET", "/vizz", &resp);
    ASSERT_EQ(resp.status, 404);
    api_response_free(&resp);
    get("POST", "/viz", &resp);
    ASSERT_EQ(resp.status, 405);
    api_response_free(&resp);

    ASSERT_STR_EQ(viz_content_type("a.png"), "image/png");
    ASSERT_STR_EQ(viz_content_type("README"), "application/octet-stream");
    ASSERT(viz_find("") == viz_find("index.html") && viz_find("") != NULL);
    api_shutdown();
    rmdir(dir);
}

/* The example list is the one file built per request: each allocation it
 * makes fails in turn, and the answer is then a 503 error body, never a crash. */
void test_viz_examples_out_of_memory(void)
{
    char dir[] = "/tmp/attn-viz-XXXXXX";
    ASSERT_EQ(viz_api_start(dir), 0);
    long n;
    for (n = 0; n < 1000; n++) {
        api_response resp;
        mem_fail_after(n);
        get("GET", "/viz/examples/", &resp);
        long failures = mem_failures();
        mem_fail_reset();
        int status = resp.status, has_body = resp.body != NULL && resp.body_len > 0;
        api_response_free(&resp);
        if (!has_body)
            FAIL_AT("allocation %ld: empty body", n);
        if (failures == 0) {
            ASSERT_EQ(status, 200);
            break;
        }
        if (status != 503)
            FAIL_AT("allocation %ld failed: status %d", n, status);
    }
    ASSERT(n > 0 && n < 1000);
    api_shutdown();
    rmdir(dir);
}

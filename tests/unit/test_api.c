/*
 * test_api.c - routing and the weight-set handlers, through api_handle.
 */
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "api.h"
#include "json_in.h"
#include "mem.h"
#include "test.h"

/* Starts the handlers on an empty data directory dir (a mkdtemp template). */
static int api_start(server_config *cfg, char *dir)
{
    char errbuf[128];
    char *argv[] = {"attention-server", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", dir);
    attn_error err;
    return api_init(cfg, &err);
}

/* Answers method path body; returns the status and, when body_out is not
 * NULL, the parsed body (caller drops it). */
static int call(const char *method, const char *path, const char *body, json_t **body_out)
{
    api_request req = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
    api_response resp;
    api_handle(&req, &resp);
    int status = resp.status;
    if (body_out != NULL) {
        attn_error err;
        *body_out = resp.body_len ? json_in_parse(resp.body, resp.body_len, &err) : NULL;
    }
    api_response_free(&resp);
    return status;
}

static const char *error_code(const json_t *body)
{
    return json_string_value(json_object_get(json_object_get(body, "error"), "code"));
}

/* A path with more segments below /v1/weight-sets/ is no endpoint; a PUT
 * there names a set that cannot exist, which is an invalid name. */
void test_api_weight_set_paths(void)
{
    static const char *const paths[] = {"/v1/weight-sets/a/b", "/v1/weight-sets/a/",
                                        "/v1/weight-sets//a"};
    static const char *const methods[] = {"GET", "DELETE", "HEAD", "PUT"};
    const char *allow = "";
    server_config cfg;
    char dir[] = "/tmp/attn-api-XXXXXX";
    ASSERT_EQ(api_start(&cfg, dir), 0);
    int failed = 0;
    for (size_t p = 0; p < 3 && !failed; p++) {
        if (api_route(paths[p], &allow) != ROUTE_OTHER || allow != NULL) {
            fprintf(stderr, "  %s is routed\n", paths[p]);
            failed = 1;
        }
        for (size_t m = 0; m < 4 && !failed; m++) {
            json_t *body;
            int status = call(methods[m], paths[p], "{\"wq\":[[1]],\"wk\":[[1]],\"wv\":[[1]]}",
                              &body);
            const char *code = error_code(body);
            int put = m == 3;
            if (status != (put ? 400 : 404) || code == NULL ||
                strcmp(code, put ? "invalid_value" : "not_found") != 0) {
                fprintf(stderr, "  %s %s: %d %s\n", methods[m], paths[p], status,
                        code ? code : "(no code)");
                failed = 1;
            }
            json_decref(body);
        }
    }
    /* One segment is still a name, valid or not. */
    int bad_name = call("GET", "/v1/weight-sets/a:b", NULL, NULL);
    int unknown = call("GET", "/v1/weight-sets/ab", NULL, NULL);
    api_shutdown();
    rmdir(dir);
    ASSERT(!failed);
    ASSERT_EQ(bad_name, 400);
    ASSERT_EQ(unknown, 404);
}

/* GET /v1/weight-sets/{name} has "heads" only when the set was stored with
 * it; the list and the answer to PUT always have it (null for none). */
void test_api_weight_set_heads(void)
{
    server_config cfg;
    char dir[] = "/tmp/attn-api-XXXXXX";
    ASSERT_EQ(api_start(&cfg, dir), 0);
    json_t *put_none, *put_two, *get_none, *get_two, *list;
    int s1 = call("PUT", "/v1/weight-sets/none", "{\"wq\":[[1,2]],\"wk\":[[1,2]],\"wv\":[[1,2]]}",
                  &put_none);
    int s2 = call("PUT", "/v1/weight-sets/two",
                  "{\"wq\":[[1,2]],\"wk\":[[1,2]],\"wv\":[[1,2]],\"heads\":2}", &put_two);
    int s3 = call("GET", "/v1/weight-sets/none", NULL, &get_none);
    int s4 = call("GET", "/v1/weight-sets/two", NULL, &get_two);
    int s5 = call("GET", "/v1/weight-sets", NULL, &list);
    /* What GET answers can be PUT back unchanged. */
    char *again = get_none ? json_dumps(get_none, JSON_COMPACT) : NULL;
    int s6 = again ? call("PUT", "/v1/weight-sets/none", again, NULL) : 0;
    mem_free(again);
    call("DELETE", "/v1/weight-sets/none", NULL, NULL);
    call("DELETE", "/v1/weight-sets/two", NULL, NULL);
    api_shutdown();
    rmdir(dir);
    const json_t *none_entry = json_array_get(json_object_get(list, "weight_sets"), 0);
    int ok_put = json_is_null(json_object_get(put_none, "heads")) &&
                 json_number_value(json_object_get(put_two, "heads")) == 2;
    int get_none_has = json_object_get(get_none, "heads") != NULL;
    double get_two_heads = json_number_value(json_object_get(get_two, "heads"));
    int list_null = json_is_null(json_object_get(none_entry, "heads"));
    const char *list_name = json_string_value(json_object_get(none_entry, "name"));
    int list_is_none = list_name != NULL && strcmp(list_name, "none") == 0;
    json_decref(put_none);
    json_decref(put_two);
    json_decref(get_none);
    json_decref(get_two);
    json_decref(list);
    ASSERT_EQ(s1, 201);
    ASSERT_EQ(s2, 201);
    ASSERT_EQ(s3, 200);
    ASSERT_EQ(s4, 200);
    ASSERT_EQ(s5, 200);
    ASSERT_EQ(s6, 200);
    ASSERT(ok_put);
    ASSERT(!get_none_has);
    ASSERT_NEAR(get_two_heads, 2, 0);
    ASSERT(list_is_none);
    ASSERT(list_null);
}

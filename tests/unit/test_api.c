/*
 * test_api.c - routing and the weight-set handlers, through api_handle.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/sizing.h"
#include "router/api.h"
#include "json/json_fast.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "route/route.h"
#include "test.h"
#include "core/test_hooks.h"

/* Starts the handlers on an empty data directory dir (a mkdtemp template). */
static int api_start(server_config *cfg, char *dir)
{
    char errbuf[128];
    char *argv[] = {"attention-server", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(cfg, 1, "cores"); /* as main.c does */
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
        *body_out = resp.body_len ? json_in_parse(resp.body, resp.body_len, NULL, &err) : NULL;
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
    server_config cfg;
    char dir[] = "/tmp/attn-api-XXXXXX";
    ASSERT_EQ(api_start(&cfg, dir), 0);
    int failed = 0;
    for (size_t p = 0; p < 3 && !failed; p++) {
        const route *r = route_find(paths[p], NULL);
        if (r->id != ROUTE_OTHER || r->allow != NULL) {
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

/* ---- numbers read fast (json_fast) against jansson alone ----------------- */

/* Drops every "compute_ms" member of v (a timing, the one thing two answers
 * to one request may differ in). */
static void drop_timings(json_t *v)
{
    if (json_is_object(v)) {
        json_object_del(v, "compute_ms");
        const char *key;
        json_t *m;
        json_object_foreach(v, key, m)
            drop_timings(m);
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            drop_timings(json_array_get(v, i));
    }
}

/* Replaces every {"$matrix": [d1, ...]} inside v by nested arrays of 1s of
 * that shape (the case files' shorthand); returns v or its replacement. */
static json_t *expand_matrices(json_t *v)
{
    json_t *dims = json_is_object(v) ? json_object_get(v, "$matrix") : NULL;
    if (dims != NULL) {
        json_t *out = json_real(1);
        for (size_t i = json_array_size(dims); i-- > 0;) {
            json_t *arr = json_array();
            for (size_t k = 0; k < (size_t)json_number_value(json_array_get(dims, i)); k++)
                json_array_append(arr, out);
            json_decref(out);
            out = arr;
        }
        json_decref(v);
        return out;
    }
    if (json_is_object(v)) {
        const char *key;
        json_t *m;
        void *tmp;
        json_object_foreach_safe(v, tmp, key, m)
            json_object_set_new(v, key, expand_matrices(json_incref(m)));
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            json_array_set_new(v, i, expand_matrices(json_incref(json_array_get(v, i))));
    }
    return v;
}

/* Answers one request with every array of numbers read fast, then with none,
 * and says how the two answers differ ("" when they do not). */
static void both_ways(const char *method, const char *path, const char *body, size_t len,
                      char *why, size_t cap)
{
    int status[2];
    json_t *answer[2];
    for (int pass = 0; pass < 2; pass++) {
        json_fast_set_min_numbers(pass == 0 ? 1 : SIZE_MAX);
        api_request req = {.method = method, .path = path, .body = body, .body_len = len};
        api_response resp;
        api_handle(&req, &resp);
        json_error_t jerr;
        status[pass] = resp.status;
        answer[pass] = resp.body_len ? json_loadb(resp.body, resp.body_len, 0, &jerr) : NULL;
        drop_timings(answer[pass]);
        api_response_free(&resp);
    }
    json_fast_set_min_numbers(0);
    why[0] = '\0';
    int put = strcmp(method, "PUT") == 0;
    if (status[0] != status[1] && !(put && status[0] / 100 == 2 && status[1] / 100 == 2))
        snprintf(why, cap, "status %d read fast, %d without", status[0], status[1]);
    else if (!(put && status[0] / 100 == 2) &&
             !((answer[0] == NULL && answer[1] == NULL) || json_equal(answer[0], answer[1]))) {
        char *a = answer[0] ? json_dumps(answer[0], JSON_COMPACT) : NULL;
        char *b = answer[1] ? json_dumps(answer[1], JSON_COMPACT) : NULL;
        snprintf(why, cap, "answers differ: %.150s / %.150s", a ? a : "(none)", b ? b : "(none)");
        free(a);
        free(b);
    }
    json_decref(answer[0]);
    json_decref(answer[1]);
}

/* The requests compared by both_ways so far, those answered differently (the first five
 * are shown), and the last difference. */
struct both_counts {
    size_t compared, differ;
    char why[400];
};

/* Every POST or PUT of the integration case files that the default server takes. */
static void both_ways_case_files(struct both_counts *n)
{
    DIR *d = opendir("tests/integration/cases");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char file[512];
        snprintf(file, sizeof file, "tests/integration/cases/%s", e->d_name);
        json_error_t jerr;
        json_t *cases = json_load_file(file, 0, &jerr);
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const char *method = json_string_value(json_object_get(c, "method"));
            const char *path = json_string_value(json_object_get(c, "path"));
            const char *server = json_string_value(json_object_get(c, "server"));
            json_t *body = json_object_get(c, "body");
            const char *raw = json_string_value(json_object_get(c, "raw_body"));
            method = method ? method : "POST";
            path = path ? path : "/v1/attention";
            if ((server != NULL && strcmp(server, "default") != 0) ||
                (strcmp(method, "POST") != 0 && strcmp(method, "PUT") != 0) ||
                (body == NULL && raw == NULL))
                continue;
            char *text = raw ? strdup(raw) : NULL;
            if (text == NULL) {
                json_t *full = expand_matrices(json_deep_copy(body));
                text = json_dumps(full, JSON_COMPACT | JSON_ENCODE_ANY);
                json_decref(full);
            }
            both_ways(method, path, text, strlen(text), n->why, sizeof n->why);
            n->compared++;
            if (n->why[0] && n->differ++ < 5)
                fprintf(stderr, "  %s %s: %s\n", e->d_name,
                        json_string_value(json_object_get(c, "name")), n->why);
            free(text);
        }
        json_decref(cases);
    }
    if (d != NULL)
        closedir(d);
}

/* The request of every fixture. */
static void both_ways_fixtures(struct both_counts *n)
{
    struct dirent *e;
    DIR *d = opendir("tests/fixtures");
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char file[512];
        snprintf(file, sizeof file, "tests/fixtures/%s", e->d_name);
        json_error_t jerr;
        json_t *fixture = json_load_file(file, 0, &jerr);
        char *text = json_dumps(json_object_get(fixture, "request"), JSON_COMPACT);
        if (text != NULL) {
            both_ways("POST", "/v1/attention", text, strlen(text), n->why, sizeof n->why);
            n->compared++;
            if (n->why[0] && n->differ++ < 5)
                fprintf(stderr, "  fixture %s: %s\n", e->d_name, n->why);
        }
        free(text);
        json_decref(fixture);
    }
    if (d != NULL)
        closedir(d);
}

/* v2 requests with JSON data flat, nested, of the wrong shape or type, for each datatype. */
static void both_ways_v2_data(struct both_counts *n)
{
    static const char *const datas[] = {
        "[1,2,3,4,5,6]", "[[1,2,3],[4,5,6]]", "[[1,2],[3,4],[5,6]]", "[[1,2,3],[4,5]]",
        "[1,2,3,4,5]", "[[[1,2,3],[4,5,6]]]", "[[1,2,3],[4,5,1e400]]", "[1,2,3,4,5,\"6\"]",
        "[[1,2,3],[4,5,6]] ", "[[0.1,2e-3,-0,7,5,6]]", "[[true,false,true],[1,0,1]]",
    };
    static const char *const types[] = {"FP64", "FP32", "BOOL"};
    for (size_t i = 0; i < sizeof datas / sizeof datas[0]; i++)
        for (size_t t = 0; t < 3; t++) {
            char text[1024];
            int len = snprintf(text, sizeof text,
                             "{\"inputs\":[{\"name\":\"q\",\"shape\":[2,3],\"datatype\":\"%s\","
                             "\"data\":%s},{\"name\":\"k\",\"shape\":[2,3],\"datatype\":\"%s\","
                             "\"data\":[1,2,3,4,5,6]},{\"name\":\"v\",\"shape\":[2,3],"
                             "\"datatype\":\"%s\",\"data\":%s}%s]}",
                             types[t], datas[i], t == 2 ? "FP64" : types[t],
                             t == 2 ? "FP64" : types[t], datas[i],
                             t == 2 ? ",{\"name\":\"mask\",\"shape\":[2,2],\"datatype\":\"BOOL\","
                                      "\"data\":[true,true,false,true]}" : "");
            both_ways("POST", "/v2/models/attention/infer", text, (size_t)len, n->why, sizeof n->why);
            n->compared++;
            if (n->why[0] && n->differ++ < 5)
                fprintf(stderr, "  v2 %s %s: %s\n", types[t], datas[i], n->why);
        }
}

/* Every request of the integration case files and of the fixtures that the
 * default server takes, and v2 requests with JSON data of every shape,
 * answered with their arrays read by json_fast and by jansson alone: the
 * same status and, but for timings, the same body. */
void test_api_fast_numbers_answer_as_jansson(void)
{
    server_config cfg;
    char dir[] = "/tmp/attn-api-XXXXXX";
    ASSERT_EQ(api_start(&cfg, dir), 0);
    struct both_counts counts = {0, 0, ""}, *n = &counts;
    both_ways_case_files(n);
    both_ways_fixtures(n);
    both_ways_v2_data(n);
    /* The sets the PUT cases stored go the way they came. */
    json_t *list = NULL;
    call("GET", "/v1/weight-sets", NULL, &list);
    const json_t *sets = json_object_get(list, "weight_sets");
    for (size_t i = 0; i < json_array_size(sets); i++) {
        char path[160];
        snprintf(path, sizeof path, "/v1/weight-sets/%s",
                 json_string_value(json_object_get(json_array_get(sets, i), "name")));
        call("DELETE", path, NULL, NULL);
    }
    json_decref(list);
    api_shutdown();
    if (rmdir(dir) != 0)
        fprintf(stderr, "  %s is not empty after the test\n", dir);
    if (n->differ)
        FAIL_AT("%zu of %zu requests answered differently with numbers read fast", n->differ, n->compared);
    ASSERT(n->compared > 150);
}

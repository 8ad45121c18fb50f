/*
 * itest_weight_sets.c - weight sets over HTTP where one request and its answer are not
 * enough: numbers that come back bit for bit in the layout they were sent, summaries
 * checked against the file on disk and the clock, replacement, the sorted list, and
 * DELETE removing the file. The steps build on each other. HEAD, names, 405s and preflights are
 * cases/weight_set_routes.json.
 */
#include "itest.h"

/* What the steps share: the sets sent, the answer to the replacing PUT, the data directory. */
struct crud {
    json_t *awkward, *replacement, *out_in, *put_summary;
    const char *data_dir;
};

/* weight-sets/put-new-201: a new set answers 201, its Location and its summary. */
static void step_put_new_201(struct crud *c)
{
    struct test t;
    struct server *s;
    struct client_response r;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/put-new-201", &report)) {
        http_text(s, "PUT", "/v1/weight-sets/crud.Set_1", g_awkward_set, &r);
        if (expect_status(&t, &r, 201)) {
            const char *location = client_header(&r, "Location");
            size_t n = location ? strlen(location) : 0, m = strlen("/v1/weight-sets/crud.Set_1");
            expect_true(&t, location != NULL && n >= m && strcmp(location + n - m, "/v1/weight-sets/crud.Set_1") == 0 &&
                                (n == m || strncmp(location, s->base_url, n - m) == 0),
                        "Location is %s, expected /v1/weight-sets/crud.Set_1", location ? location : "missing");
            expect_header_contains(&t, &r, "Content-Type", "application/json");
            json_t *body = response_json(&r);
            expect_set_summary(&t, body, "crud.Set_1", c->awkward, c->data_dir);
            json_decref(body);
        }
        client_response_free(&r);
        step_end(&t, report);
    }
}

/* weight-sets/put-replace-200: replacing answers 200; stored_at never goes back. */
static void step_put_replace_200(struct crud *c)
{
    struct test t;
    struct server *s;
    struct client_response r;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/put-replace-200", &report)) {
        json_t *before = get_set(&t, s, "crud.Set_1", 200);
        http_text(s, "PUT", "/v1/weight-sets/crud.Set_1", g_replacement_set, &r);
        if (expect_status(&t, &r, 200)) {
            c->put_summary = response_json(&r);
            expect_set_summary(&t, c->put_summary, "crud.Set_1", c->replacement, c->data_dir);
            double was = parse_utc_time(json_string_value(json_object_get(before, "stored_at")));
            double now = parse_utc_time(json_string_value(json_object_get(c->put_summary, "stored_at")));
            expect_true(&t, was < 0 || now >= was, "stored_at went back in time on replacement");
        }
        json_decref(before);
        client_response_free(&r);
        step_end(&t, report);
    }
}

/* weight-sets/out-in-round-trip: a set sent as out_in comes back as sent. */
static void step_out_in_round_trip(struct crud *c)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/out-in-round-trip", &report)) {
        json_t *summary = put_set_text(&t, s, "crud-outin", g_out_in_set, 201);
        if (summary != NULL) {
            expect_set_summary(&t, summary, "crud-outin", c->out_in, c->data_dir);
            expect_stored_set(&t, s, "crud-outin", c->out_in);
        }
        json_decref(summary);
        step_end(&t, report);
    }
}

/* -0.0 is a double of its own; "-0" reads back as the integer 0 in most JSON parsers. */
static void step_negative_zero_round_trip(void)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/negative-zero-round-trip", &report)) {
        static const char text[] = "{\"wq\": [[-0.0, 0.0]], \"wk\": [[1, 2]], \"wv\": [[-0.0]], \"bq\": [-0.0, 1]}";
        json_t *sent = json_from_text(text);
        json_t *summary = put_set_text(&t, s, "crud-negzero", text, 201);
        json_t *body = summary ? get_set(&t, s, "crud-negzero", 200) : NULL;
        if (body != NULL) {
            expect_set_body(&t, body, sent);
            char *got = json_dumps(json_object_get(body, "wq"), JSON_COMPACT);
            test_detail(&t, "    GET answered wq = %s", got ? got : "?");
            free(got);
        }
        json_decref(sent);
        json_decref(summary);
        json_decref(body);
        step_end(&t, report);
    }
}

/* api/openapi.yaml: GET returns the set "in the form PUT accepts, so that the body can be
 * sent back unchanged". */
static void step_get_body_put_back_unchanged(struct crud *c)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/get-body-put-back-unchanged", &report)) {
        json_t *body = get_set(&t, s, "crud-outin", 200);
        json_t *summary = body ? put_set(&t, s, "crud-outin-copy", body, 201) : NULL;
        if (summary != NULL)
            expect_stored_set(&t, s, "crud-outin-copy", c->out_in);
        json_decref(body);
        json_decref(summary);
        step_end(&t, report);
    }
}

/* weight-sets/list: every entry has its fields, sorted by name, summaries as PUT answered. */
static void step_list(struct crud *c)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/list", &report)) {
        static const char *const extra[] = {"Zeta", "alpha", "m.id-1_x", "0-first"};
        json_t *tiny = json_from_text(g_tiny_set);
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
            json_decref(put_set_text(&t, s, extra[i], g_tiny_set, 201));
        json_t *list = get_set_list(&t, s);
        for (size_t i = 0; list != NULL && i < json_array_size(list); i++) {
            const json_t *e = json_array_get(list, i);
            static const char *const keys[] = {"name", "shapes", "weights_layout", "heads", "parameters",
                                               "size_bytes", "stored_at"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                expect_true(&t, json_object_get(e, keys[k]) != NULL, "list entry %zu has no %s", i, keys[k]);
            if (i > 0) {
                const char *a = json_string_value(json_object_get(json_array_get(list, i - 1), "name"));
                const char *b = json_string_value(json_object_get(e, "name"));
                expect_true(&t, a && b && strcmp(a, b) < 0, "the list is not sorted by name: \"%s\" before \"%s\"",
                            a ? a : "?", b ? b : "?");
            }
        }
        for (size_t i = 0; list != NULL && i < sizeof extra / sizeof extra[0]; i++) {
            const json_t *e = list_find(list, extra[i]);
            if (expect_true(&t, e != NULL, "the list lacks %s", extra[i]))
                expect_set_summary(&t, e, extra[i], tiny, c->data_dir);
        }
        const json_t *e = list ? list_find(list, "crud.Set_1") : NULL;
        if (list != NULL && expect_true(&t, e != NULL, "the list lacks crud.Set_1") && c->put_summary != NULL)
            expect_same(&t, e, c->put_summary, 0, "the list entry of crud.Set_1 against the PUT answer");
        json_decref(list);
        json_decref(tiny);
        step_end(&t, report);
    }
}

/* weight-sets/delete-then-404: DELETE removes the file; GET and DELETE then answer 404. */
static void step_delete_then_404(struct crud *c)
{
    struct test t;
    struct server *s;
    struct client_response r;
    int report;
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/delete-then-404", &report)) {
        char path[PATH_MAX];
        set_file_path(path, sizeof path, c->data_dir, "crud.Set_1");
        expect_true(&t, file_size(path) > 0, "%s does not exist before the DELETE", path);
        http_simple(s, "DELETE", "/v1/weight-sets/crud.Set_1", &r);
        if (expect_status(&t, &r, 204))
            expect_true(&t, r.body_len == 0, "the 204 has a body of %zu bytes", r.body_len);
        client_response_free(&r);
        expect_true(&t, file_size(path) < 0, "%s is still there after the DELETE", path);
        http_simple(s, "GET", "/v1/weight-sets/crud.Set_1", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "name");
        client_response_free(&r);
        http_simple(s, "DELETE", "/v1/weight-sets/crud.Set_1", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "name");
        client_response_free(&r);
        json_t *list = get_set_list(&t, s);
        expect_true(&t, list == NULL || list_find(list, "crud.Set_1") == NULL, "the list still has crud.Set_1");
        json_decref(list);
        step_end(&t, report);
    }
}

/*
 * PUT (new and replacing), GET bit for bit in the layout sent, the list, DELETE and
 * the 404s after it, on the default server.
 */
void run_weight_set_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {
        "weight-sets/put-new-201",
        "weight-sets/get-bit-for-bit",
        "weight-sets/put-replace-200",
        "weight-sets/get-after-replace",
        "weight-sets/out-in-round-trip",
        "weight-sets/negative-zero-round-trip",
        "weight-sets/get-body-put-back-unchanged",
        "weight-sets/list",
        "weight-sets/delete-then-404",
        NULL};
    if (!any_selected(names))
        return;
    struct crud c = {json_from_text(g_awkward_set), json_from_text(g_replacement_set),
                     json_from_text(g_out_in_set), NULL, g_servers[SERVER_DEFAULT].data_dir};
    step_put_new_201(&c);
    step_expect_stored_set("weight-sets/get-bit-for-bit", SERVER_DEFAULT, "crud.Set_1", c.awkward);
    step_put_replace_200(&c);
    step_expect_stored_set("weight-sets/get-after-replace", SERVER_DEFAULT, "crud.Set_1", c.replacement);
    step_out_in_round_trip(&c);
    step_negative_zero_round_trip();
    step_get_body_put_back_unchanged(&c);
    step_list(&c);
    step_delete_then_404(&c);

    json_decref(c.put_summary);
    json_decref(c.awkward);
    json_decref(c.replacement);
    json_decref(c.out_in);
}

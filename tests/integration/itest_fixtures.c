/*
 * itest_fixtures.c - the golden fixtures (the *.json files of --fixtures, normally
 * tests/fixtures): each request is POSTed to the default server and the answer compared
 * element by element with the fixture's, within its tolerance; a fixture that expects an
 * error has its status and code checked.
 */
#include "itest.h"

/*
 * POSTs each fixture's request and checks the status and, for a 200, every element of
 * "output" and "attention" that the fixture gives, within the fixture's tolerance.
 * A fixture that expects an error with expect.code has its error code checked instead.
 */
void run_fixture_tests(const struct itest_paths *paths)
{
    const char *dir = paths->fixtures;
    struct test t;
    size_t count;
    char **files = list_test_files(dir, "fixtures/present", "fixtures", &count);
    for (size_t i = 0; i < count; i++) {
        const char *file = files[i];
        if (!test_begin(&t, "fixture/%.*s", (int)(strlen(file) - 5), file))
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        json_error_t error;
        json_t *fixture = json_load_file(path, 0, &error);
        json_t *expect = json_object_get(fixture, "expect");
        json_t *request = json_object_get(fixture, "request");
        struct server *s = NULL;
        json_t *body = NULL;
        struct client_response r = {0};
        if (!expect_true(&t, fixture != NULL, "%s:%d: %s", path, error.line, error.text) ||
            !expect_true(&t, json_is_object(request) && json_is_object(expect) &&
                                 json_is_integer(json_object_get(expect, "status")),
                         "fixture lacks request, expect or expect.status") ||
            (s = test_server(&t, SERVER_DEFAULT)) == NULL)
            goto next;
        http_post_json(s, "/v1/attention", request, &r);
        int want_status = (int)json_integer_value(json_object_get(expect, "status"));
        if (!expect_status(&t, &r, want_status))
            goto next;
        body = response_json(&r);
        if (!expect_true(&t, json_is_object(body), "response body is not a JSON object"))
            goto next;
        if (want_status == 200) {
            const json_t *tol_json = json_object_get(expect, "tolerance");
            double tolerance = json_is_number(tol_json) ? json_number_value(tol_json) : FLOAT64_TOLERANCE;
            if (json_object_get(expect, "output") != NULL)
                expect_close(&t, body, "output", json_object_get(expect, "output"), tolerance, 0.0);
            if (json_object_get(expect, "attention") != NULL)
                expect_close(&t, body, "attention", json_object_get(expect, "attention"), tolerance, 0.0);
        } else if (json_is_string(json_object_get(expect, "code"))) {
            const char *want = json_string_value(json_object_get(expect, "code"));
            const char *got = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
            expect_true(&t, got != NULL && strcmp(got, want) == 0, "error code %s, expected %s",
                        got != NULL ? got : "(none)", want);
        }
    next:
        json_decref(body);
        json_decref(fixture);
        client_response_free(&r);
        test_end(&t);
    }
    free_name_list(files);
}

/*
 * itest_cases.c - the data-driven runner. Every *.json file in the --cases directory is an array
 * of cases, each one request and what its answer must be; the format is described in
 * cases/README.md. A file's cases run in order (a case may rely on a weight set that an
 * earlier case of the same file stored), and after each file every server it used must
 * still serve. Everything that one request and its answer can say is written as a case
 * rather than as C.
 */
#include "itest.h"

/* Returns a new array of the shape in dims (from axis on) filled with the integer 1. */
static json_t *filled_array(const json_t *dims, size_t axis)
{
    if (axis == json_array_size(dims))
        return json_integer(1);
    json_t *a = json_array();
    json_int_t n = json_integer_value(json_array_get(dims, axis));
    for (json_int_t i = 0; i < n; i++)
        json_array_append_new(a, filled_array(dims, axis + 1));
    return a;
}

/*
 * Returns a new deep copy of v in which every object {"$matrix": [d1, d2, ...]} is
 * replaced by an array of that shape filled with 1s, so that case files can ask for
 * large requests without spelling them out.
 */
static json_t *expand_body(const json_t *v)
{
    if (json_is_object(v)) {
        const json_t *dims = json_object_get(v, "$matrix");
        if (json_object_size(v) == 1 && json_is_array(dims))
            return filled_array(dims, 0);
        json_t *copy = json_object();
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)v, key, member)
            json_object_set_new(copy, key, expand_body(member));
        return copy;
    }
    if (json_is_array(v)) {
        json_t *copy = json_array();
        for (size_t i = 0; i < json_array_size(v); i++)
            json_array_append_new(copy, expand_body(json_array_get(v, i)));
        return copy;
    }
    return json_deep_copy(v);
}

/* Returns the name of the first key of obj that is not in the NULL-terminated list. */
static const char *unknown_key(const json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)obj, key, member) {
        (void)member;
        size_t i = 0;
        while (allowed[i] != NULL && strcmp(allowed[i], key) != 0)
            i++;
        if (allowed[i] == NULL)
            return key;
    }
    return NULL;
}

/* Runs one case object from a case file; name_prefix is "cases/FILE". */
static void run_case(const char *name_prefix, size_t index, const json_t *c, int *servers_used)
{
    static const char *const case_keys[] = {"name", "about", "method", "path", "body", "raw_body", "headers",
                                            "server", "pad_to_bytes", "expect", NULL};
    static const char *const expect_keys[] = {"status", "code", "field", "header_contains", NULL};
    struct test t;
    const char *name = json_string_value(json_object_get(c, "name"));
    char fallback[32];
    snprintf(fallback, sizeof fallback, "#%zu", index);
    if (!test_begin(&t, "%s/%s", name_prefix, name != NULL ? name : fallback))
        return;

    const json_t *expect = json_object_get(c, "expect");
    const char *method = json_string_value(json_object_get(c, "method"));
    const char *path = json_string_value(json_object_get(c, "path"));
    const char *server_name = json_string_value(json_object_get(c, "server"));
    const json_t *headers = json_object_get(c, "headers");
    const json_t *raw = json_object_get(c, "raw_body");
    const json_t *body_json = json_object_get(c, "body");
    const json_t *pad = json_object_get(c, "pad_to_bytes");
    enum server_id id = SERVER_DEFAULT;
    char *body = NULL;
    size_t body_len = 0;
    json_t *response = NULL;
    struct client_response r = {0};
    struct server *s;
    const char *bad_case_key = json_is_object(c) ? unknown_key(c, case_keys) : NULL;
    const char *bad_expect_key = json_is_object(expect) ? unknown_key(expect, expect_keys) : NULL;

    /* A typo in a case file must not silently weaken the test, so the files are strict. */
    if (!expect_true(&t, json_is_object(c) && name != NULL, "malformed case: not an object with a \"name\"") ||
        !expect_true(&t, bad_case_key == NULL, "malformed case: unknown key \"%s\"", bad_case_key) ||
        !expect_true(&t, json_is_object(expect) && json_is_integer(json_object_get(expect, "status")),
                     "malformed case: expect.status missing") ||
        !expect_true(&t, bad_expect_key == NULL, "malformed case: unknown key \"expect.%s\"", bad_expect_key) ||
        !expect_true(&t, !(raw != NULL && body_json != NULL), "malformed case: both body and raw_body") ||
        !expect_true(&t, raw == NULL || json_is_string(raw), "malformed case: raw_body is not a string") ||
        !expect_true(&t, headers == NULL || json_is_object(headers), "malformed case: headers is not an object"))
        goto done;
    if (server_name != NULL && strcmp(server_name, "small-limits") == 0)
        id = SERVER_SMALL_LIMITS;
    else if (!expect_true(&t, server_name == NULL || strcmp(server_name, "default") == 0,
                          "malformed case: unknown server \"%s\"", server_name))
        goto done;
    *servers_used |= 1 << id;

    /* Assemble the body: JSON (with $matrix expanded), or raw bytes, then optional padding. */
    if (body_json != NULL) {
        json_t *expanded = expand_body(body_json);
        body = json_dumps(expanded, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(expanded);
        body_len = strlen(body);
    } else if (raw != NULL) {
        body_len = json_string_length(raw);
        body = client_xcalloc(body_len + 1, 1);
        memcpy(body, json_string_value(raw), body_len);
    }
    if (json_is_integer(pad) && body != NULL && (size_t)json_integer_value(pad) > body_len) {
        size_t want = (size_t)json_integer_value(pad);
        char *padded = client_xcalloc(want + 1, 1);
        memcpy(padded, body, body_len);
        memset(padded + body_len, ' ', want - body_len); /* whitespace keeps the JSON valid */
        free(body);
        body = padded;
        body_len = want;
    }

    struct client_request rq = {
        .method = method != NULL ? method : "POST",
        .path = path != NULL ? path : "/v1/attention",
        .body = body,
        .body_len = body_len,
    };
    char header_lines[CLIENT_MAX_EXTRA_HEADERS][512];
    size_t header_count = 0;
    const char *hname;
    json_t *hvalue;
    json_object_foreach((json_t *)headers, hname, hvalue) {
        if (header_count < CLIENT_MAX_EXTRA_HEADERS && json_is_string(hvalue)) {
            snprintf(header_lines[header_count], sizeof header_lines[0], "%s: %s", hname, json_string_value(hvalue));
            rq.headers[header_count] = header_lines[header_count];
            header_count++;
        }
    }

    if ((s = test_server(&t, id)) == NULL)
        goto done;
    http_call(s, &rq, &r);
    int want_status = (int)json_integer_value(json_object_get(expect, "status"));
    if (!expect_status(&t, &r, want_status))
        goto done;
    expect_true(&t, client_header(&r, "Access-Control-Allow-Origin") != NULL, "no Access-Control-Allow-Origin header");

    const json_t *contains = json_object_get(expect, "header_contains");
    const char *cname;
    json_t *cvalue;
    json_object_foreach((json_t *)contains, cname, cvalue)
        expect_header_contains(&t, &r, cname, json_string_value(cvalue) != NULL ? json_string_value(cvalue) : "");

    if (want_status >= 400) {
        expect_header_contains(&t, &r, "Content-Type", "application/json");
        const json_t *error = expect_error_body(&t, &r, &response);
        if (error == NULL)
            goto done;
        const char *got_code = json_string_value(json_object_get(error, "code"));
        const char *want_code = json_string_value(json_object_get(expect, "code"));
        if (want_code != NULL)
            expect_true(&t, strcmp(got_code, want_code) == 0, "error code \"%s\", expected \"%s\"", got_code,
                        want_code);
        const json_t *want_field = json_object_get(expect, "field");
        const json_t *got_field = json_object_get(error, "field");
        if (json_is_null(want_field))
            expect_true(&t, got_field == NULL, "error.field is \"%s\", expected no field",
                        json_string_value(got_field));
        else if (json_is_string(want_field))
            expect_true(&t, got_field != NULL && strcmp(json_string_value(got_field),
                                                        json_string_value(want_field)) == 0,
                        "error.field is %s%s%s, expected \"%s\"", got_field ? "\"" : "",
                        got_field ? json_string_value(got_field) : "absent", got_field ? "\"" : "",
                        json_string_value(want_field));
    }
    if (t.failed) {
        char snippet[400];
        body_snippet(r.body, r.body_len, snippet, sizeof snippet);
        test_detail(&t, "    response body: %s", snippet);
    }
done:
    json_decref(response);
    free(body);
    client_response_free(&r);
    test_end(&t);
}

/*
 * Runs every case file in dir. Each file is an array of cases (see the README beside the
 * files); after each file, every server it used must still serve.
 */
void run_case_tests(const struct itest_paths *paths)
{
    const char *dir = paths->cases;
    struct test t;
    size_t count;
    char **files = list_test_files(dir, "cases/present", "case files", &count);
    for (size_t i = 0; i < count; i++) {
        char prefix[300], path[PATH_MAX];
        snprintf(prefix, sizeof prefix, "cases/%.*s", (int)(strlen(files[i]) - 5), files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        json_error_t error;
        json_t *cases = json_load_file(path, JSON_ALLOW_NUL, &error);
        if (!json_is_array(cases)) {
            if (test_begin(&t, "%s/load", prefix)) {
                expect_true(&t, 0, "%s:%d: %s", path, error.line, cases == NULL ? error.text : "not an array");
                test_end(&t);
            }
            json_decref(cases);
            continue;
        }
        int servers_used = 0;
        for (size_t j = 0; j < json_array_size(cases); j++)
            run_case(prefix, j, json_array_get(cases, j), &servers_used);
        for (int id = 0; id < SERVER_COUNT; id++)
            if (servers_used & (1 << id))
                check_still_serving(prefix, (enum server_id)id);
        json_decref(cases);
    }
    free_name_list(files);
}

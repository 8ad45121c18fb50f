/*
 * itest_cases.c - the data-driven runner. Every *.json file in the --cases directory is an array
 * of cases, each one request and what its answer must be; the format is described in
 * cases/README.md. A file's cases run in order (a case may rely on a weight set that an
 * earlier case of the same file stored), and after each file every server it used must
 * still serve. Everything that one request and its answer can say is written as a case
 * rather than as C.
 */
#include "itest.h"
#include "case_body.h"

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

/* Returns the value at a dotted path in v ("error.code", "shapes.wq.0": a segment of
 * digits indexes an array), borrowed, or NULL when there is none. */
static const json_t *json_at_path(const json_t *v, const char *path)
{
    char segment[256];
    while (v != NULL && *path != '\0') {
        size_t n = strcspn(path, ".");
        snprintf(segment, sizeof segment, "%.*s", (int)n, path);
        path += n + (path[n] == '.');
        if (json_is_array(v) && segment[0] != '\0' && strspn(segment, "0123456789") == strlen(segment))
            v = json_array_get(v, (size_t)strtoull(segment, NULL, 10));
        else
            v = json_object_get(v, segment);
    }
    return v;
}

/* Returns 1 when status is want (an integer) or one of want (an array of integers). */
static int status_accepted(const json_t *want, int status)
{
    if (json_is_integer(want))
        return json_integer_value(want) == status;
    for (size_t i = 0; i < json_array_size(want); i++)
        if (json_integer_value(json_array_get(want, i)) == status)
            return 1;
    return 0;
}

/* Returns 1 when v is a string, or a non-empty array of strings. */
static int strings_or_string(const json_t *v)
{
    if (json_is_string(v))
        return 1;
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_string(json_array_get(v, i)))
            return 0;
    return json_array_size(v) > 0;
}

/* Returns 1 when every member of obj is a string or an array of strings (NULL: no object). */
static int header_object_valid(const json_t *obj)
{
    if (obj == NULL)
        return 1;
    if (!json_is_object(obj))
        return 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value)
        if (!strings_or_string(value))
            return 0;
    return 1;
}

/* Returns 1 when v, a raw_request, is a string or an array of pieces: strings and
 * {"$repeat": [string, count]}. */
static int raw_request_valid(const json_t *v)
{
    if (json_is_string(v))
        return 1;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *piece = json_array_get(v, i);
        const json_t *repeat = json_object_get(piece, "$repeat");
        if (!json_is_string(piece) &&
            !(json_object_size(piece) == 1 && json_array_size(repeat) == 2 &&
              json_is_string(json_array_get(repeat, 0)) && json_integer_value(json_array_get(repeat, 1)) > 0))
            return 0;
    }
    return json_array_size(v) > 0;
}

/* The bytes of a well-formed raw_request (the caller frees them), its pieces joined and each
 * {"$repeat": [text, count]} written count times; *len is their number. */
static char *raw_request_bytes(const json_t *v, size_t *len)
{
    size_t count = json_is_string(v) ? 1 : json_array_size(v), used = 0, cap = 256;
    char *out = client_xcalloc(cap, 1);
    for (size_t i = 0; i < count; i++) {
        const json_t *piece = json_is_string(v) ? v : json_array_get(v, i);
        const json_t *repeat = json_object_get(piece, "$repeat");
        const json_t *text = repeat != NULL ? json_array_get(repeat, 0) : piece;
        size_t times = repeat != NULL ? (size_t)json_integer_value(json_array_get(repeat, 1)) : 1;
        size_t n = json_string_length(text);
        for (size_t k = 0; k < times; k++) {
            if (used + n + 1 > cap) {
                cap = 2 * (used + n + 1);
                out = client_xrealloc(out, cap);
            }
            memcpy(out + used, json_string_value(text), n);
            used += n;
        }
    }
    out[used] = '\0';
    *len = used;
    return out;
}

/* The method and the request target of case c: its "method" and "path" (POST and
 * /v1/attention when it names none), or those of its raw_request's request line. */
static void case_request_line(const json_t *c, char *method, size_t method_cap, char *path, size_t path_cap)
{
    const json_t *raw = json_object_get(c, "raw_request");
    const char *m = json_string_value(json_object_get(c, "method"));
    const char *p = json_string_value(json_object_get(c, "path"));
    snprintf(method, method_cap, "%s", m != NULL ? m : "POST");
    snprintf(path, path_cap, "%s", p != NULL ? p : "/v1/attention");
    if (raw != NULL) {
        const char *line = json_string_value(json_is_string(raw) ? raw : json_array_get(raw, 0));
        line = line != NULL ? line : "";
        size_t m_len = strcspn(line, " \r\n");
        const char *target = line + m_len + (line[m_len] == ' ');
        snprintf(method, method_cap, "%.*s", (int)m_len, line);
        snprintf(path, path_cap, "%.*s", (int)strcspn(target, " \r\n"), target);
    }
}

/*
 * Checks the form of case c before anything is sent: only known keys, the required ones,
 * and values of the right types. A typo in a case file must not silently weaken a test,
 * so the files are strict. Returns 1 when the case is well formed.
 */
static int case_well_formed(struct test *t, const json_t *c)
{
    static const char *const case_keys[] = {"name", "about", "method", "path", "request_target", "body", "raw_body",
                                            "body_file", "headers", "server", "pad_to_bytes", "raw_request", "expect",
                                            NULL};
    static const char *const expect_keys[] = {"status", "code", "field", "header_contains", "header_equals",
                                              "header_lacks", "headers_present", "json", "body_empty", "set_file",
                                              "store_unchanged", "error_contains", "answers", "connection_closed",
                                              NULL};
    /* A raw request is the whole of what is sent: nothing else may describe it. */
    static const char *const not_with_raw[] = {"method", "path", "request_target", "body", "raw_body", "body_file",
                                               "headers", "pad_to_bytes", NULL};
    const json_t *expect = json_object_get(c, "expect");
    const json_t *status = json_object_get(expect, "status");
    const char *bad_case_key = json_is_object(c) ? unknown_key(c, case_keys) : NULL;
    const char *bad_expect_key = json_is_object(expect) ? unknown_key(expect, expect_keys) : NULL;
    int bodies = (json_object_get(c, "body") != NULL) + (json_object_get(c, "raw_body") != NULL) +
                 (json_object_get(c, "body_file") != NULL);
    const json_t *raw = json_object_get(c, "raw_body"), *file = json_object_get(c, "body_file");
    const json_t *headers = json_object_get(c, "headers"), *present = json_object_get(expect, "headers_present");
    const json_t *members = json_object_get(expect, "json"), *set_file = json_object_get(expect, "set_file");
    const json_t *raw_request = json_object_get(c, "raw_request");
    const char *beside_raw = NULL;
    for (size_t i = 0; raw_request != NULL && beside_raw == NULL && not_with_raw[i] != NULL; i++)
        if (json_object_get(c, not_with_raw[i]) != NULL)
            beside_raw = not_with_raw[i];
    const json_t *answers = json_object_get(expect, "answers"), *closed = json_object_get(expect, "connection_closed");
    char method[16], path[64];
    /* v2 errors are the protocol's {"error": "text"}: no code or field to compare, and
     * error_contains only there. */
    case_request_line(c, method, sizeof method, path, sizeof path);
    int v2 = strncmp(path, "/v2", 3) == 0;
    const json_t *contains = json_object_get(expect, "error_contains");
    return expect_true(t, json_is_object(c) && json_is_string(json_object_get(c, "name")),
                       "malformed case: not an object with a \"name\"") &&
           expect_true(t, bad_case_key == NULL, "malformed case: unknown key \"%s\"", bad_case_key) &&
           expect_true(t, json_is_object(expect) && (json_is_integer(status) ||
                                                     (json_array_size(status) > 0 &&
                                                      json_is_integer(json_array_get(status, 0)))),
                       "malformed case: expect.status missing") &&
           expect_true(t, bad_expect_key == NULL, "malformed case: unknown key \"expect.%s\"", bad_expect_key) &&
           expect_true(t, bodies <= 1, "malformed case: more than one of body, raw_body and body_file") &&
           expect_true(t, raw == NULL || json_is_string(raw), "malformed case: raw_body is not a string") &&
           expect_true(t, file == NULL || json_is_string(file), "malformed case: body_file is not a string") &&
           expect_true(t, headers == NULL || json_is_object(headers), "malformed case: headers is not an object") &&
           expect_true(t, header_object_valid(json_object_get(expect, "header_contains")) &&
                              header_object_valid(json_object_get(expect, "header_equals")) &&
                              header_object_valid(json_object_get(expect, "header_lacks")),
                       "malformed case: an expect.header_* member is not an object of strings") &&
           expect_true(t, present == NULL || strings_or_string(present),
                       "malformed case: expect.headers_present is not an array of names") &&
           expect_true(t, members == NULL || json_is_object(members), "malformed case: expect.json is not an object") &&
           expect_true(t, set_file == NULL || json_is_string(set_file), "malformed case: expect.set_file is not a string") &&
           expect_true(t, contains == NULL || (v2 && json_is_string(contains)),
                       "malformed case: expect.error_contains is for a /v2 path, and a string") &&
           expect_true(t, !v2 || (json_object_get(expect, "code") == NULL && json_object_get(expect, "field") == NULL),
                       "malformed case: a /v2 error has no code or field (use expect.error_contains)") &&
           expect_true(t, raw_request == NULL || raw_request_valid(raw_request),
                       "malformed case: raw_request is not a string or an array of strings and "
                       "{\"$repeat\": [string, count]}") &&
           expect_true(t, beside_raw == NULL, "malformed case: %s beside raw_request", beside_raw) &&
           expect_true(t, (answers == NULL && closed == NULL) || raw_request != NULL,
                       "malformed case: expect.answers and expect.connection_closed are for a raw_request") &&
           expect_true(t, answers == NULL || json_is_integer(answers), "malformed case: expect.answers is not an integer") &&
           expect_true(t, closed == NULL || json_is_boolean(closed),
                       "malformed case: expect.connection_closed is not true or false");
}

/* The server a case names: "default" when it names none; returns -1 for an unknown name. */
static int case_server(const char *name)
{
    if (name == NULL)
        return SERVER_DEFAULT;
    for (int id = 0; id < SERVER_COUNT; id++)
        if (strcmp(name, g_server_kinds[id].label) == 0)
            return id;
    return -1;
}

/*
 * Assembles the body of case c: JSON (with $matrix expanded), raw bytes, or the bytes of
 * body_file (relative to dir), then optional padding. Returns 0 with *body (NULL when the
 * case has none; the caller frees it) and *len set, or -1 when body_file cannot be read.
 */
static int case_body(const json_t *c, const char *dir, char **body, size_t *len)
{
    const json_t *body_json = json_object_get(c, "body"), *raw = json_object_get(c, "raw_body");
    const char *file = json_string_value(json_object_get(c, "body_file"));
    const json_t *pad = json_object_get(c, "pad_to_bytes");
    *body = NULL;
    *len = 0;
    if (body_json != NULL) {
        json_t *expanded = case_body_expand(body_json);
        *body = json_dumps(expanded, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(expanded);
        *len = strlen(*body);
    } else if (raw != NULL) {
        *len = json_string_length(raw);
        *body = client_xcalloc(*len + 1, 1);
        memcpy(*body, json_string_value(raw), *len);
    } else if (file != NULL) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%.2000s/%.1000s", dir, file);
        if ((*body = client_read_file(path, len)) == NULL)
            return -1;
    }
    if (json_is_integer(pad) && *body != NULL && (size_t)json_integer_value(pad) > *len) {
        size_t want = (size_t)json_integer_value(pad);
        char *padded = client_xcalloc(want + 1, 1);
        memcpy(padded, *body, *len);
        memset(padded + *len, ' ', want - *len); /* whitespace keeps the JSON valid */
        free(*body);
        *body = padded;
        *len = want;
    }
    return 0;
}

/* Calls check(t, r, header, text) for every text of every header of the expect object obj. */
static void each_header_text(struct test *t, const struct client_response *r, const json_t *obj,
                             int (*check)(struct test *, const struct client_response *, const char *, const char *))
{
    const char *name;
    json_t *value;
    json_object_foreach((json_t *)obj, name, value) {
        if (json_is_string(value))
            check(t, r, name, json_string_value(value));
        for (size_t i = 0; i < json_array_size(value); i++)
            check(t, r, name, json_string_value(json_array_get(value, i)));
    }
}

/* Checks that header name, when present, does not contain text (case-sensitive). */
static int expect_header_lacks(struct test *t, const struct client_response *r, const char *name, const char *text)
{
    const char *value = client_header(r, name);
    return expect_true(t, value == NULL || strstr(value, text) == NULL, "%s lists %s: %s", name, text, value);
}

/* Checks the error body of r against expect.code and expect.field; *response receives
 * the parsed body (the caller releases it). */
static void expect_case_error(struct test *t, const struct client_response *r, const json_t *expect,
                              json_t **response)
{
    expect_header_contains(t, r, "Content-Type", "application/json");
    const json_t *error = expect_error_body(t, r, response);
    if (error == NULL)
        return;
    const char *got_code = json_string_value(json_object_get(error, "code"));
    const char *want_code = json_string_value(json_object_get(expect, "code"));
    if (want_code != NULL)
        expect_true(t, strcmp(got_code, want_code) == 0, "error code \"%s\", expected \"%s\"", got_code, want_code);
    const json_t *want_field = json_object_get(expect, "field");
    const json_t *got_field = json_object_get(error, "field");
    if (json_is_null(want_field))
        expect_true(t, got_field == NULL, "error.field is \"%s\", expected no field", json_string_value(got_field));
    else if (json_is_string(want_field))
        expect_true(t, got_field != NULL && strcmp(json_string_value(got_field), json_string_value(want_field)) == 0,
                    "error.field is %s%s%s, expected \"%s\"", got_field ? "\"" : "",
                    got_field ? json_string_value(got_field) : "absent", got_field ? "\"" : "",
                    json_string_value(want_field));
}

/* Checks the error body of an answer to a /v2 path: the protocol's {"error": "text"}, a
 * non-empty text that contains expect.error_contains when given. */
static void expect_case_v2_error(struct test *t, const struct client_response *r, const json_t *expect,
                                 json_t **response)
{
    expect_header_contains(t, r, "Content-Type", "application/json");
    *response = response_json(r);
    const char *text = json_string_value(json_object_get(*response, "error"));
    if (!expect_true(t, text != NULL && text[0] != '\0', "the body is not {\"error\": non-empty string}"))
        return;
    const char *want = json_string_value(json_object_get(expect, "error_contains"));
    if (want != NULL)
        expect_true(t, strstr(text, want) != NULL, "the error \"%s\" does not contain \"%s\"", text, want);
}

/* Checks every member of expect.json against the body of r, compared by value. */
static void expect_case_members(struct test *t, const struct client_response *r, const json_t *members,
                                json_t **response)
{
    if (*response == NULL)
        *response = response_json(r);
    if (!expect_true(t, *response != NULL, "the body is not JSON"))
        return;
    const char *path;
    json_t *want;
    json_object_foreach((json_t *)members, path, want) {
        char where[512], why[1024];
        snprintf(where, sizeof where, "%s", path);
        int same = json_same(json_at_path(*response, path), want, 0, where, sizeof where, why, sizeof why);
        expect_true(t, same, "body member %s", why);
    }
}

/* The name of the set a request path is about ("/v1/weight-sets/NAME"), or NULL. */
static const char *set_name_of(const char *path)
{
    static const char prefix[] = "/v1/weight-sets/";
    if (path == NULL || strncmp(path, prefix, sizeof prefix - 1) != 0 || path[sizeof prefix - 1] == '\0')
        return NULL;
    return path + sizeof prefix - 1;
}

/* Checks that the body of r is the weight set in the file set_file (relative to dir),
 * every number bit for bit, as expect_set_body defines. */
static void expect_case_set_file(struct test *t, const struct client_response *r, const char *dir,
                                 const char *set_file, json_t **response)
{
    char path[PATH_MAX];
    json_error_t error;
    snprintf(path, sizeof path, "%.2000s/%.1000s", dir, set_file);
    json_t *sent = json_load_file(path, 0, &error);
    if (*response == NULL)
        *response = response_json(r);
    if (expect_true(t, sent != NULL, "cannot read set_file %s: %s", path, error.text))
        expect_set_body(t, *response, sent);
    json_decref(sent);
}

/*
 * Runs one case object from a case file in dir; name_prefix is "cases/FILE". The case
 * runs whenever its file was selected, since a later case may rely on what it stored, but
 * is reported only when --filter selects its own name.
 */
static void run_case(const char *name_prefix, const char *dir, size_t index, const json_t *c, int *servers_used)
{
    struct test t;
    const char *name = json_string_value(json_object_get(c, "name"));
    char fallback[32];
    snprintf(fallback, sizeof fallback, "#%zu", index);
    int report = test_begin(&t, "%s/%s", name_prefix, name != NULL ? name : fallback);

    const json_t *expect = json_object_get(c, "expect");
    const char *method = json_string_value(json_object_get(c, "method"));
    const char *server_name = json_string_value(json_object_get(c, "server"));
    int id = case_server(server_name);
    const json_t *raw_request = json_object_get(c, "raw_request");
    char *body = NULL, *raw = NULL, raw_method[16], raw_target[1024];
    size_t body_len = 0, raw_len = 0;
    int answers = 0, closed = 0;
    json_t *response = NULL;
    struct client_response r = {0};
    struct server *s;

    if (!case_well_formed(&t, c) ||
        !expect_true(&t, id >= 0, "malformed case: unknown server \"%s\"", server_name) ||
        !expect_true(&t, case_body(c, dir, &body, &body_len) == 0, "cannot read body_file %s/%s", dir,
                     json_string_value(json_object_get(c, "body_file"))))
        goto done;
    *servers_used |= 1 << id;

    struct client_request rq = {
        .method = method != NULL ? method : "POST",
        .path = json_object_get(c, "path") ? json_string_value(json_object_get(c, "path")) : "/v1/attention",
        .request_target = json_string_value(json_object_get(c, "request_target")),
        .body = body,
        .body_len = body_len,
    };
    if (raw_request != NULL) {
        raw = raw_request_bytes(raw_request, &raw_len);
        case_request_line(c, raw_method, sizeof raw_method, raw_target, sizeof raw_target);
        rq.method = raw_method;
        rq.path = raw_target;
    }
    char header_lines[CLIENT_MAX_EXTRA_HEADERS][512];
    size_t header_count = 0;
    const char *hname;
    json_t *hvalue;
    json_object_foreach(json_object_get(c, "headers"), hname, hvalue) {
        if (header_count < CLIENT_MAX_EXTRA_HEADERS && json_is_string(hvalue)) {
            snprintf(header_lines[header_count], sizeof header_lines[0], "%s: %s", hname, json_string_value(hvalue));
            rq.headers[header_count] = header_lines[header_count];
            header_count++;
        }
    }

    if ((s = test_server(&t, (enum server_id)id)) == NULL)
        goto done;
    struct store_snapshot before = {0};
    int check_store = json_is_true(json_object_get(expect, "store_unchanged"));
    if (check_store)
        store_snapshot_take(&t, s, raw == NULL ? set_name_of(rq.path) : NULL, &before);
    if (raw != NULL)
        client_raw_call(s->port, raw, raw_len, 3.0, &r, &answers, &closed);
    else
        http_call(s, &rq, &r);
    if (check_store) {
        expect_store_unchanged(&t, s, &before);
        store_snapshot_free(&before);
    }
    const json_t *want_status = json_object_get(expect, "status");
    int first_status = (int)json_integer_value(json_is_array(want_status) ? json_array_get(want_status, 0)
                                                                          : want_status);
    if (!status_accepted(want_status, r.status)) {
        expect_status(&t, &r, first_status);
        if (json_is_array(want_status))
            test_detail(&t, "    (the case also accepts the other statuses of its list)");
        goto done;
    }
    expect_true(&t, client_header(&r, "Access-Control-Allow-Origin") != NULL, "no Access-Control-Allow-Origin header");
    each_header_text(&t, &r, json_object_get(expect, "header_contains"), expect_header_contains);
    each_header_text(&t, &r, json_object_get(expect, "header_equals"), expect_header_equals);
    each_header_text(&t, &r, json_object_get(expect, "header_lacks"), expect_header_lacks);
    const json_t *present = json_object_get(expect, "headers_present");
    for (size_t i = 0; i < (json_is_string(present) ? 1 : json_array_size(present)); i++) {
        const char *header = json_is_string(present) ? json_string_value(present)
                                                     : json_string_value(json_array_get(present, i));
        expect_true(&t, client_header(&r, header) != NULL, "no %s header", header);
    }
    const json_t *want_answers = json_object_get(expect, "answers"), *want_closed = json_object_get(expect, "connection_closed");
    if (want_answers != NULL)
        expect_true(&t, answers == json_integer_value(want_answers), "%d answers on the connection, expected %lld", answers,
                    (long long)json_integer_value(want_answers));
    if (want_closed != NULL)
        expect_true(&t, closed == json_is_true(want_closed), "the server %s the connection after its answer",
                    closed ? "closed" : "did not close");
    if (json_is_true(json_object_get(expect, "body_empty")))
        expect_true(&t, r.body_len == 0, "the %d answer has a body of %zu bytes", r.status, r.body_len);

    /* A HEAD answer has no body to check. */
    if (r.status >= 400 && strcmp(rq.method, "HEAD") != 0) {
        if (strncmp(rq.path, "/v2", 3) == 0)
            expect_case_v2_error(&t, &r, expect, &response);
        else
            expect_case_error(&t, &r, expect, &response);
    }
    if (json_object_get(expect, "json") != NULL)
        expect_case_members(&t, &r, json_object_get(expect, "json"), &response);
    if (json_object_get(expect, "set_file") != NULL)
        expect_case_set_file(&t, &r, dir, json_string_value(json_object_get(expect, "set_file")), &response);
    if (t.failed) {
        char snippet[400];
        body_snippet(r.body, r.body_len, snippet, sizeof snippet);
        test_detail(&t, "    response body: %s", snippet);
    }
done:
    json_decref(response);
    free(body);
    free(raw);
    client_response_free(&r);
    if (report)
        test_end(&t);
}

/* Returns 1 when --filter selects a case of the file (or its still-serving checks). */
static int file_selected(const char *prefix, const json_t *cases)
{
    char name[600];
    const char *one[] = {name, NULL};
    snprintf(name, sizeof name, "%s/still-serving/", prefix);
    if (any_selected(one))
        return 1;
    for (size_t j = 0; j < json_array_size(cases); j++) {
        const char *case_name = json_string_value(json_object_get(json_array_get(cases, j), "name"));
        snprintf(name, sizeof name, "%s/%s", prefix, case_name != NULL ? case_name : "");
        if (any_selected(one))
            return 1;
    }
    return 0;
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
        for (size_t j = 0; file_selected(prefix, cases) && j < json_array_size(cases); j++)
            run_case(prefix, dir, j, json_array_get(cases, j), &servers_used);
        for (int id = 0; id < SERVER_COUNT; id++)
            if (servers_used & (1 << id))
                check_still_serving(prefix, (enum server_id)id);
        json_decref(cases);
    }
    free_name_list(files);
}

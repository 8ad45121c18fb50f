/*
 * itest_expect.c - HTTP and expectations for the integration runner: requests sent to a
 * struct server through client.c, checks of status, headers, error bodies and JSON values
 * (by value, by bits, within a tolerance), and builders of JSON matrices from arrays.
 */
#include "itest.h"

/* The request and response types, and the curl machinery, are client.h's; these wrappers
 * send to a struct server and keep the request files in the temporary directory. */

void http_call(const struct server *s, const struct client_request *rq, struct client_response *r)
{
    client_http_call(s->base_url, g_tmpdir, rq, r);
}

void http_simple(const struct server *s, const char *method, const char *path, struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path};
    http_call(s, &rq, r);
}

void http_post_json(const struct server *s, const char *path, const json_t *body, struct client_response *r)
{
    char *text = json_dumps(body, JSON_COMPACT);
    struct client_request rq = {.method = "POST", .path = path, .body = text, .body_len = strlen(text)};
    http_call(s, &rq, r);
    free(text);
}

void http_text(const struct server *s, const char *method, const char *path, const char *text,
               struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path, .body = text, .body_len = text ? strlen(text) : 0};
    http_call(s, &rq, r);
}

json_t *response_json(const struct client_response *r)
{
    return json_loadb(r->body, r->body_len, 0, NULL);
}

int expect_status(struct test *t, const struct client_response *r, int want)
{
    int ok;
    if (r->status == 0)
        ok = expect_true(t, 0, "no HTTP response (%s)", r->transport_error);
    else
        ok = expect_true(t, r->status == want, "status %d, expected %d", r->status, want);
    if (!ok && r->body_len > 0) {
        char snippet[400];
        body_snippet(r->body, r->body_len, snippet, sizeof snippet);
        test_detail(t, "    response body: %s", snippet);
    }
    return ok;
}

int expect_header_contains(struct test *t, const struct client_response *r, const char *name, const char *want)
{
    const char *value = client_header(r, name);
    if (!expect_true(t, value != NULL, "no %s header", name))
        return 0;
    return expect_true(t, find_case_insensitive(value, want) != NULL, "%s is \"%s\", expected it to contain \"%s\"",
                       name, value, want);
}

int expect_header_equals(struct test *t, const struct client_response *r, const char *name, const char *want)
{
    const char *value = client_header(r, name);
    if (!expect_true(t, value != NULL, "no %s header", name))
        return 0;
    return expect_true(t, strcmp(value, want) == 0, "%s is \"%s\", expected \"%s\"", name, value, want);
}

/* ------------------------------------------------------------------------------------ */
/* JSON helpers: comparison and construction                                             */
/* ------------------------------------------------------------------------------------ */

int json_numbers_close(const json_t *got, const json_t *want, double abs_tol, double rel_tol, char *path,
                       size_t path_cap, char *why, size_t why_cap)
{
    if (json_is_array(want)) {
        if (!json_is_array(got)) {
            snprintf(why, why_cap, "%s is %s, expected an array of %zu", path,
                     got == NULL ? "missing" : json_is_number(got) ? "a number" : "not an array",
                     json_array_size(want));
            return 0;
        }
        if (json_array_size(got) != json_array_size(want)) {
            snprintf(why, why_cap, "%s has %zu elements, expected %zu", path, json_array_size(got),
                     json_array_size(want));
            return 0;
        }
        size_t base = strlen(path);
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + base, path_cap - base, "[%zu]", i);
            if (!json_numbers_close(json_array_get(got, i), json_array_get(want, i), abs_tol, rel_tol, path,
                                    path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (!json_is_number(want)) {
        snprintf(why, why_cap, "the expectation at %s is not a number or an array", path);
        return 0;
    }
    if (!json_is_number(got)) {
        snprintf(why, why_cap, "%s is %s, expected the number %.17g", path,
                 got == NULL ? "missing" : json_is_array(got) ? "an array (extra dimension)" : "not a number",
                 json_number_value(want));
        return 0;
    }
    double g = json_number_value(got), w = json_number_value(want);
    double allowed = abs_tol + rel_tol * fabs(w);
    if (!(fabs(g - w) <= allowed)) {
        snprintf(why, why_cap, "%s is %.17g, expected %.17g (difference %.3g > tolerance %.3g)", path, g, w,
                 fabs(g - w), allowed);
        return 0;
    }
    return 1;
}

int expect_close(struct test *t, const json_t *response, const char *key, const json_t *want, double abs_tol,
                 double rel_tol)
{
    char path[512], why[1024];
    snprintf(path, sizeof path, "%s", key);
    int ok = json_numbers_close(json_object_get(response, key), want, abs_tol, rel_tol, path, sizeof path, why,
                                sizeof why);
    return expect_true(t, ok, "%s", why);
}

json_t *json_matrix(const double *a, size_t rows, size_t cols, int transpose)
{
    size_t out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
    json_t *m = json_array();
    for (size_t r = 0; r < out_rows; r++) {
        json_t *row = json_array();
        for (size_t c = 0; c < out_cols; c++)
            json_array_append_new(row, json_real(transpose ? a[c * cols + r] : a[r * cols + c]));
        json_array_append_new(m, row);
    }
    return m;
}

json_t *json_tensor(const double *a, size_t batch, size_t rows, size_t cols, int batched, int transpose)
{
    if (!batched)
        return json_matrix(a, rows, cols, transpose);
    json_t *t = json_array();
    for (size_t n = 0; n < batch; n++)
        json_array_append_new(t, json_matrix(a + n * rows * cols, rows, cols, transpose));
    return t;
}

json_t *json_attention(const double *attn, size_t batch, size_t heads, size_t lq, size_t lk, int batched,
                       int has_heads)
{
    json_t *per_batch = json_array();
    for (size_t n = 0; n < batch; n++) {
        json_t *per_head = json_array();
        for (size_t h = 0; h < heads; h++)
            json_array_append_new(per_head, json_matrix(attn + (n * heads + h) * lq * lk, lq, lk, 0));
        if (has_heads) {
            json_array_append_new(per_batch, per_head);
        } else {
            json_array_append(per_batch, json_array_get(per_head, 0));
            json_decref(per_head);
        }
    }
    if (batched)
        return per_batch;
    json_t *first = json_incref(json_array_get(per_batch, 0));
    json_decref(per_batch);
    return first;
}

json_t *json_mask(const unsigned char *m, size_t count, size_t lq, size_t lk, int as_3d, int numeric)
{
    json_t *all = json_array();
    for (size_t n = 0; n < count; n++) {
        json_t *matrix = json_array();
        for (size_t i = 0; i < lq; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < lk; j++) {
                int allowed = m[(n * lq + i) * lk + j] != 0;
                json_array_append_new(row, numeric ? json_integer(allowed) : json_boolean(allowed));
            }
            json_array_append_new(matrix, row);
        }
        json_array_append_new(all, matrix);
    }
    if (as_3d)
        return all;
    json_t *first = json_incref(json_array_get(all, 0));
    json_decref(all);
    return first;
}

const json_t *expect_error_body(struct test *t, const struct client_response *r, json_t **body_out)
{
    *body_out = response_json(r);
    const json_t *error = json_object_get(*body_out, "error");
    const json_t *code = json_object_get(error, "code");
    const json_t *message = json_object_get(error, "message");
    const json_t *field = json_object_get(error, "field");
    if (!expect_true(t, json_is_object(*body_out), "error body is not a JSON object") ||
        !expect_true(t, json_is_object(error), "error body has no \"error\" object") ||
        !expect_true(t, json_is_string(code) && json_string_length(code) > 0, "error.code is not a non-empty string") ||
        !expect_true(t, json_is_string(message) && json_string_length(message) > 0,
                     "error.message is not a non-empty string") ||
        !expect_true(t, field == NULL || json_is_string(field), "error.field is present but not a string"))
        return NULL;
    return error;
}

int expect_json_integer(struct test *t, const json_t *obj, const char *path, const char *key, long long want)
{
    const json_t *v = json_object_get(obj, key);
    if (!expect_true(t, json_is_integer(v), "%s.%s is %s, expected the integer %lld", path, key,
                     v == NULL ? "missing" : "not an integer", want))
        return 0;
    return expect_true(t, json_integer_value(v) == want, "%s.%s is %lld, expected %lld", path, key,
                       (long long)json_integer_value(v), want);
}

double rng_uniform(uint64_t *state)
{
    return (double)(client_rng_next(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

double *random_values(uint64_t *state, size_t n, double magnitude, int float32)
{
    double *a = client_xcalloc(n, sizeof *a);
    for (size_t i = 0; i < n; i++) {
        a[i] = magnitude * rng_uniform(state);
        if (float32)
            a[i] = (double)(float)a[i];
    }
    return a;
}

int json_has_shape(const json_t *v, const size_t *dims, size_t rank, char *path, size_t cap, char *why,
                   size_t why_cap)
{
    if (rank == 0) {
        if (json_is_number(v))
            return 1;
        snprintf(why, why_cap, "%s is not a number", path);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) != dims[0]) {
        snprintf(why, why_cap, "%s is %s of %zu, expected %zu entries", path, json_is_array(v) ? "an array" : "not an array",
                 json_array_size(v), dims[0]);
        return 0;
    }
    size_t base = strlen(path);
    for (size_t i = 0; i < dims[0]; i++) {
        snprintf(path + base, cap - base, "[%zu]", i);
        if (!json_has_shape(json_array_get(v, i), dims + 1, rank - 1, path, cap, why, why_cap))
            return 0;
    }
    path[base] = '\0';
    return 1;
}

int expect_error(struct test *t, const struct client_response *r, int status, const char *code,
                 const char *field)
{
    if (!expect_status(t, r, status))
        return 0;
    json_t *body = NULL;
    const json_t *error = expect_error_body(t, r, &body);
    int ok = error != NULL;
    if (ok) {
        const char *got = json_string_value(json_object_get(error, "code"));
        const char *got_field = json_string_value(json_object_get(error, "field"));
        ok = expect_true(t, strcmp(got, code) == 0, "error code \"%s\", expected \"%s\"", got, code);
        if (ok && field != NULL && field[0] == '\0')
            ok = expect_true(t, got_field == NULL, "error.field is \"%s\", expected none", got_field);
        else if (ok && field != NULL)
            ok = expect_true(t, got_field != NULL && strcmp(got_field, field) == 0, "error.field is %s%s%s, expected \"%s\"",
                             got_field ? "\"" : "", got_field ? got_field : "absent", got_field ? "\"" : "", field);
    }
    if (!ok) {
        char snippet[400];
        body_snippet(r->body, r->body_len, snippet, sizeof snippet);
        test_detail(t, "    response body: %s", snippet);
    }
    json_decref(body);
    return ok;
}

static uint64_t double_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

int json_same(const json_t *got, const json_t *want, int bits, char *path, size_t path_cap, char *why,
              size_t why_cap)
{
    size_t base = strlen(path);
    if (got == NULL) {
        snprintf(why, why_cap, "%s is missing", path[0] ? path : "the value");
        return 0;
    }
    if (json_is_number(want)) {
        if (!json_is_number(got)) {
            snprintf(why, why_cap, "%s is not a number, expected %.17g", path, json_number_value(want));
            return 0;
        }
        double g = json_number_value(got), w = json_number_value(want);
        if (bits ? double_bits(g) != double_bits(w) : g != w) {
            snprintf(why, why_cap, "%s is %.17g (bits %016llx), expected %.17g (bits %016llx)", path, g,
                     (unsigned long long)double_bits(g), w, (unsigned long long)double_bits(w));
            return 0;
        }
        return 1;
    }
    if (json_is_array(want)) {
        if (!json_is_array(got) || json_array_size(got) != json_array_size(want)) {
            snprintf(why, why_cap, "%s is %s of %zu, expected an array of %zu", path,
                     json_is_array(got) ? "an array" : "not an array", json_array_size(got), json_array_size(want));
            return 0;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + base, path_cap - base, "[%zu]", i);
            if (!json_same(json_array_get(got, i), json_array_get(want, i), bits, path, path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (json_is_object(want)) {
        if (!json_is_object(got)) {
            snprintf(why, why_cap, "%s is not an object", path[0] ? path : "the value");
            return 0;
        }
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)got, key, member) {
            (void)member;
            if (json_object_get(want, key) == NULL) {
                snprintf(why, why_cap, "%s%s%s is not expected", path, path[0] ? "." : "", key);
                return 0;
            }
        }
        json_object_foreach((json_t *)want, key, member) {
            snprintf(path + base, path_cap - base, "%s%s", base ? "." : "", key);
            if (!json_same(json_object_get(got, key), member, bits, path, path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (json_is_string(want)) {
        if (!json_is_string(got) || strcmp(json_string_value(got), json_string_value(want)) != 0) {
            snprintf(why, why_cap, "%s is %s%s%s, expected \"%s\"", path, json_is_string(got) ? "\"" : "",
                     json_is_string(got) ? json_string_value(got) : "not a string", json_is_string(got) ? "\"" : "",
                     json_string_value(want));
            return 0;
        }
        return 1;
    }
    if (json_typeof(got) != json_typeof(want)) {
        snprintf(why, why_cap, "%s differs (true/false/null)", path);
        return 0;
    }
    return 1;
}

int expect_same(struct test *t, const json_t *got, const json_t *want, int bits, const char *what)
{
    char path[512] = "", why[1024];
    int ok = json_same(got, want, bits, path, sizeof path, why, sizeof why);
    return expect_true(t, ok, "%s: %s", what, why);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

double parse_utc_time(const char *text)
{
    int y, mo, d, h, mi, n = 0;
    double sec;
    if (text == NULL || strlen(text) < 20 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != 't') ||
        sscanf(text, "%4d-%2d-%2d%*c%2d:%2d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6)
        return -1;
    const char *zone = text + n;
    if (strcmp(zone, "Z") != 0 && strcmp(zone, "z") != 0 && strcmp(zone, "+00:00") != 0)
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec < 0 || sec >= 61)
        return -1;
    return (double)days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
}

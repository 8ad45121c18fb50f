/*
 * itest_sets.c - weight-set helpers shared by the groups that store sets: PUT/GET/list
 * wrappers, checks of a summary and of a stored set, the files of the store on disk,
 * random sets, and the sets with awkward numbers that several groups send.
 */
#include "itest.h"

/* The members of a weight set that hold numbers, in the order of the file format. */
const char *const g_set_members[8] = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"};

/* Joins a NULL-terminated name list into "a b c" for messages (static buffer). */
static const char *names_joined(char **names)
{
    static char text[2048];
    text[0] = '\0';
    for (size_t i = 0; names != NULL && names[i] != NULL; i++) {
        size_t used = strlen(text);
        snprintf(text + used, sizeof text - used, "%s%s", i ? " " : "", names[i]);
    }
    return text;
}

void expect_dir_unchanged(struct test *t, const char *dir, char **before)
{
    size_t count;
    char **now = dir_entries(dir, &count);
    int same = now != NULL && before != NULL;
    size_t i = 0;
    for (; same && before[i] != NULL; i++)
        same = now[i] != NULL && strcmp(now[i], before[i]) == 0;
    same = same && now[i] == NULL;
    if (!same) {
        char was[2048];
        snprintf(was, sizeof was, "%s", names_joined(before));
        expect_true(t, 0, "the data directory changed: it held [%s], now [%s]", was, names_joined(now));
    }
    for (size_t j = 0; now != NULL && now[j] != NULL; j++)
        expect_true(t, strncmp(now[j], ".tmp", 4) != 0, "a temporary file %s was left in the data directory", now[j]);
    free_name_list(now);
}

long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

void set_file_path(char *out, size_t cap, const char *data_dir, const char *name)
{
    snprintf(out, cap, "%.1000s/%.200s.wset", data_dir, name);
}

/*
 * Returns a new object with the shape of every numeric member of set as it was written,
 * {"wq": [rows, cols], "bq": [len], ...}, and counts its numbers into *parameters.
 */
static json_t *set_shapes(const json_t *set, long long *parameters)
{
    json_t *shapes = json_object();
    *parameters = 0;
    for (int i = 0; i < 8; i++) {
        const json_t *m = json_object_get(set, g_set_members[i]);
        if (m == NULL)
            continue;
        json_t *shape = json_array();
        size_t rows = json_array_size(m);
        if (json_is_array(json_array_get(m, 0))) {
            size_t cols = json_array_size(json_array_get(m, 0));
            json_array_append_new(shape, json_integer((json_int_t)rows));
            json_array_append_new(shape, json_integer((json_int_t)cols));
            *parameters += (long long)(rows * cols);
        } else {
            json_array_append_new(shape, json_integer((json_int_t)rows));
            *parameters += (long long)rows;
        }
        json_object_set_new(shapes, g_set_members[i], shape);
    }
    return shapes;
}

void expect_set_summary(struct test *t, const json_t *summary, const char *name, const json_t *sent,
                        const char *data_dir)
{
    if (!expect_true(t, json_is_object(summary), "the summary is not a JSON object"))
        return;
    const char *got_name = json_string_value(json_object_get(summary, "name"));
    expect_true(t, got_name != NULL && strcmp(got_name, name) == 0, "name is %s, expected \"%s\"",
                got_name ? got_name : "(missing)", name);
    const char *layout = json_string_value(json_object_get(sent, "weights_layout"));
    const char *want_layout = layout ? layout : "in_out";
    const char *got_layout = json_string_value(json_object_get(summary, "weights_layout"));
    expect_true(t, got_layout != NULL && strcmp(got_layout, want_layout) == 0, "weights_layout is %s, expected %s",
                got_layout ? got_layout : "(missing)", want_layout);
    /* a set sent as JSON is always float64 (only a float32 checkpoint makes a float32 set) */
    const char *dtype = json_string_value(json_object_get(summary, "dtype"));
    expect_true(t, dtype != NULL && strcmp(dtype, "float64") == 0, "dtype is %s, expected float64",
                dtype ? dtype : "(missing)");
    const json_t *heads = json_object_get(summary, "heads");
    const json_t *sent_heads = json_object_get(sent, "heads");
    if (sent_heads != NULL)
        expect_true(t, json_is_integer(heads) && json_integer_value(heads) == json_integer_value(sent_heads),
                    "heads is not %lld", (long long)json_integer_value(sent_heads));
    else
        expect_true(t, json_is_null(heads), "heads is %s, expected null", heads ? "not null" : "missing");
    long long parameters;
    json_t *shapes = set_shapes(sent, &parameters);
    expect_same(t, json_object_get(summary, "shapes"), shapes, 0, "shapes");
    json_decref(shapes);
    const json_t *params = json_object_get(summary, "parameters");
    expect_true(t, json_is_integer(params) && json_integer_value(params) == parameters,
                "parameters is %lld, expected %lld", (long long)json_integer_value(params), parameters);
    const json_t *size = json_object_get(summary, "size_bytes");
    if (expect_true(t, json_is_integer(size) && json_integer_value(size) > 0, "size_bytes is not a positive integer") &&
        data_dir != NULL) {
        char path[PATH_MAX];
        set_file_path(path, sizeof path, data_dir, name);
        long long on_disk = file_size(path);
        expect_true(t, on_disk == json_integer_value(size), "size_bytes is %lld but %s has %lld bytes",
                    (long long)json_integer_value(size), path, on_disk);
    }
    const char *stored_at = json_string_value(json_object_get(summary, "stored_at"));
    double when = parse_utc_time(stored_at);
    if (expect_true(t, when >= 0, "stored_at is %s, not an RFC 3339 UTC time", stored_at ? stored_at : "(missing)"))
        expect_true(t, fabs(when - (double)time(NULL)) < 120, "stored_at %s is not within two minutes of now",
                    stored_at);
}

void expect_set_body(struct test *t, const json_t *got, const json_t *sent)
{
    if (!expect_true(t, json_is_object(got), "the body is not a JSON object"))
        return;
    for (int i = 0; i < 8; i++) {
        const json_t *want = json_object_get(sent, g_set_members[i]);
        const json_t *have = json_object_get(got, g_set_members[i]);
        if (want == NULL) {
            expect_true(t, have == NULL, "%s is in the answer but was not stored", g_set_members[i]);
            continue;
        }
        expect_same(t, have, want, 1, g_set_members[i]);
    }
    const char *layout = json_string_value(json_object_get(sent, "weights_layout"));
    const char *got_layout = json_string_value(json_object_get(got, "weights_layout"));
    if (layout != NULL || got_layout != NULL)
        expect_true(t, got_layout != NULL && strcmp(got_layout, layout ? layout : "in_out") == 0,
                    "weights_layout is %s, expected %s", got_layout ? got_layout : "(missing)",
                    layout ? layout : "in_out");
    const json_t *heads = json_object_get(got, "heads"), *sent_heads = json_object_get(sent, "heads");
    if (sent_heads != NULL)
        expect_true(t, json_is_integer(heads) && json_integer_value(heads) == json_integer_value(sent_heads),
                    "heads is not %lld", (long long)json_integer_value(sent_heads));
    else
        expect_true(t, heads == NULL || json_is_null(heads), "heads is given although the set was stored without");
}

json_t *json_from_text(const char *text)
{
    json_error_t error;
    json_t *v = json_loads(text, 0, &error);
    if (v == NULL) {
        fprintf(stderr, "itest: bad built-in JSON at line %d: %s\n", error.line, error.text);
        exit(2);
    }
    return v;
}

json_t *get_set_list(struct test *t, const struct server *s)
{
    struct client_response r;
    http_simple(s, "GET", "/v1/weight-sets", &r);
    json_t *list = NULL;
    if (expect_status(t, &r, 200)) {
        json_t *body = response_json(&r);
        const json_t *sets = json_object_get(body, "weight_sets");
        if (expect_true(t, json_is_array(sets), "the list has no weight_sets array"))
            list = json_incref((json_t *)sets);
        json_decref(body);
    }
    client_response_free(&r);
    return list;
}

const json_t *list_find(const json_t *list, const char *name)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(list, i), "name"));
        if (n != NULL && strcmp(n, name) == 0)
            return json_array_get(list, i);
    }
    return NULL;
}

json_t *put_set_text(struct test *t, const struct server *s, const char *name, const char *text, int want)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/weight-sets/%s", name);
    struct client_response r;
    http_text(s, "PUT", path, text, &r);
    json_t *body = NULL;
    if (expect_status(t, &r, want)) {
        body = response_json(&r);
        expect_true(t, json_is_object(body), "the answer to PUT %s is not a JSON object", path);
    } else {
        test_detail(t, "    (PUT %s)", path);
    }
    client_response_free(&r);
    return body;
}

json_t *put_set(struct test *t, const struct server *s, const char *name, const json_t *set, int want)
{
    char *text = json_dumps(set, JSON_COMPACT);
    json_t *body = put_set_text(t, s, name, text, want);
    free(text);
    return body;
}

json_t *get_set(struct test *t, const struct server *s, const char *name, int want)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/weight-sets/%s", name);
    struct client_response r;
    http_simple(s, "GET", path, &r);
    json_t *body = NULL;
    if (want >= 400) {
        expect_error(t, &r, want, "unknown_weight_set", NULL);
    } else if (expect_status(t, &r, want)) {
        body = response_json(&r);
        if (!expect_true(t, json_is_object(body), "the answer to GET %s is not a JSON object", path)) {
            char snippet[400];
            body_snippet(r.body, r.body_len, snippet, sizeof snippet);
            test_detail(t, "    response body: %s", snippet);
        }
    }
    client_response_free(&r);
    return body;
}

void expect_stored_set(struct test *t, const struct server *s, const char *name, const json_t *sent)
{
    json_t *body = get_set(t, s, name, 200);
    if (body != NULL)
        expect_set_body(t, body, sent);
    json_decref(body);
}

void step_expect_stored_set(const char *name, enum server_id id, const char *set_name, const json_t *sent)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, id, &s, name, &report)) {
        expect_stored_set(&t, s, set_name, sent);
        step_end(&t, report);
    }
}

/* Returns a new JSON array of n numbers. */
static json_t *json_vector(const double *a, size_t n)
{
    json_t *v = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(v, json_real(a[i]));
    return v;
}

json_t *random_weight_set(uint64_t *rng, size_t d_in, size_t d_ctx, size_t dk, size_t dv, size_t d_out,
                          int biases, int bo, int out_in, size_t heads)
{
    const size_t rows[4] = {d_in, d_ctx, d_ctx, dv}, cols[4] = {dk, dk, dv, d_out};
    json_t *set = json_object();
    for (int i = 0; i < 4; i++) {
        if (cols[i] == 0)
            continue;
        double *w = random_values(rng, rows[i] * cols[i], 1.0 / sqrt((double)rows[i]), 0);
        json_object_set_new(set, g_set_members[i], json_matrix(w, rows[i], cols[i], out_in));
        free(w);
        if ((i < 3 && biases) || (i == 3 && bo)) {
            double *b = random_values(rng, cols[i], 0.5, 0);
            json_object_set_new(set, g_set_members[i + 4], json_vector(b, cols[i]));
            free(b);
        }
    }
    if (out_in)
        json_object_set_new(set, "weights_layout", json_string("out_in"));
    if (heads > 0)
        json_object_set_new(set, "heads", json_integer((json_int_t)heads));
    return set;
}

json_t *weights_of(const json_t *set)
{
    json_t *w = json_object();
    for (int i = 0; i < 8; i++)
        if (json_object_get(set, g_set_members[i]) != NULL)
            json_object_set(w, g_set_members[i], json_object_get(set, g_set_members[i]));
    return w;
}

void expect_same_answer(struct test *t, const json_t *named, const json_t *inline_body)
{
    char path[512], why[1024];
    static const char *const keys[] = {"output", "attention"};
    for (int k = 0; k < 2; k++) {
        const json_t *want = json_object_get(inline_body, keys[k]);
        if (want == NULL) {
            expect_true(t, json_object_get(named, keys[k]) == NULL, "%s is present by name but not inline", keys[k]);
            continue;
        }
        snprintf(path, sizeof path, "%s", keys[k]);
        expect_true(t, json_numbers_close(json_object_get(named, keys[k]), want, 1e-12, 0.0, path, sizeof path, why,
                                          sizeof why),
                    "by name vs inline: %s", why);
    }
    static const char *const meta_keys[] = {"heads", "batch", "lq", "lk", "dk", "dv", "d_out", "dtype"};
    const json_t *meta = json_object_get(named, "meta"), *want_meta = json_object_get(inline_body, "meta");
    for (size_t i = 0; want_meta != NULL && i < sizeof meta_keys / sizeof meta_keys[0]; i++) {
        snprintf(path, sizeof path, "meta.%s", meta_keys[i]);
        expect_true(t, json_same(json_object_get(meta, meta_keys[i]), json_object_get(want_meta, meta_keys[i]), 0,
                                 path, sizeof path, why, sizeof why),
                    "by name vs inline: %s", why);
    }
}

/* Numbers that a careless formatter or parser would not bring back bit for bit: 0.1, the
 * double nearest 1/3, subnormals down to 5e-324, the largest double, 0.1 + 0.2, ... */
const char g_awkward_set[] =
    "{\"wq\": [[0.1, 0.3333333333333333, 1e-300], [-2.5e300, 5e-324, 2.2250738585072014e-308]],"
    " \"wk\": [[1.7976931348623157e308, -1e-320, 0.30000000000000004], [123456789.12345679, -7, 1e22]],"
    " \"wv\": [[0.1, 0.2], [0.7, -0.9999999999999999]],"
    " \"wo\": [[0.5], [-0.25]],"
    " \"bq\": [1e-7, -3.0000000000000004, 6.02214076e23], \"bk\": [0, 1, 2], \"bv\": [4.9e-324, 1.1],"
    " \"bo\": [2.718281828459045]}";

/* What replaces it: other shapes (d_in 1, d_ctx 2), heads, and only some biases. */
const char g_replacement_set[] =
    "{\"heads\": 2, \"wq\": [[0.30000000000000004, -1e-310, 3.141592653589793, 1e300]],"
    " \"wk\": [[2, 4, 8, 16], [0.1, 0.2, 0.3, 0.4]],"
    " \"wv\": [[1.0000000000000002, 0.9999999999999998], [-4.440892098500626e-16, 1e-5]],"
    " \"bk\": [0.5, 0.25, 0.125, 0.0625]}";

/* An out_in set (PyTorch's d_out x d_in) with rectangular matrices, so that a transpose
 * anywhere shows: wq 4x3 (dk 4, d_in 3), wv 2x3 (dv 2), wo 5x2 (d_out 5), two heads. */
const char g_out_in_set[] =
    "{\"weights_layout\": \"out_in\", \"heads\": 2,"
    " \"wq\": [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [1e-300, -1e300, 5e-324]],"
    " \"wk\": [[-0.1, 0.3333333333333333, 2.5], [0.6666666666666666, -1.5, 0.125], [3, 1e-10, -2e-10],"
    " [0.01, 0.02, 0.03]],"
    " \"wv\": [[1.1, 2.2, 3.3], [-4.4, 5.5, -6.6]],"
    " \"wo\": [[0.5, -0.5], [0.25, 0.75], [1e-3, 1e3], [-0.2, 0.2], [7, 8]],"
    " \"bq\": [0.1, 0.2, 0.3, 0.4], \"bv\": [-1e-200, 1e200], \"bo\": [1, 2, 3, 4, 5]}";

/* A tiny set for names and lists. */
const char g_tiny_set[] = "{\"wq\": [[1, 0], [0, 1]], \"wk\": [[1, 2], [3, 4]], \"wv\": [[0.5], [0.25]]}";

/* The list as "name@stored_at/size_bytes ..." (the caller frees it). */
static char *list_fingerprint(struct test *t, const struct server *s)
{
    json_t *list = get_set_list(t, s);
    size_t cap = 64 + json_array_size(list) * 128, used = 0;
    char *text = client_xcalloc(cap, 1);
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        used += (size_t)snprintf(text + used, cap - used, "%s@%s/%lld ", json_string_value(json_object_get(e, "name")),
                                 json_string_value(json_object_get(e, "stored_at")),
                                 (long long)json_integer_value(json_object_get(e, "size_bytes")));
    }
    json_decref(list);
    return text;
}

void store_snapshot_take(struct test *t, const struct server *s, const char *name, struct store_snapshot *snap)
{
    size_t count;
    memset(snap, 0, sizeof *snap);
    snap->entries = dir_entries(s->data_dir, &count);
    snap->list = list_fingerprint(t, s);
    if (name != NULL) {
        set_file_path(snap->path, sizeof snap->path, s->data_dir, name);
        snap->file = client_read_file(snap->path, &snap->file_len);
    }
}

void expect_store_unchanged(struct test *t, const struct server *s, struct store_snapshot *snap)
{
    char *list_after = list_fingerprint(t, s);
    expect_true(t, strcmp(snap->list, list_after) == 0, "the list changed: [%s] became [%s]", snap->list, list_after);
    expect_dir_unchanged(t, s->data_dir, snap->entries);
    if (snap->path[0] != '\0') {
        size_t len_after = 0;
        char *file_after = client_read_file(snap->path, &len_after);
        expect_true(t, (snap->file == NULL) == (file_after == NULL) &&
                           (snap->file == NULL ||
                            (snap->file_len == len_after && memcmp(snap->file, file_after, len_after) == 0)),
                    "%s changed although the request was refused", snap->path);
        free(file_after);
    }
    free(list_after);
}

void store_snapshot_free(struct store_snapshot *snap)
{
    free(snap->file);
    free(snap->list);
    free_name_list(snap->entries);
    memset(snap, 0, sizeof *snap);
}

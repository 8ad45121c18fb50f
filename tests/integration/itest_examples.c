/*
 * itest_examples.c - the API examples (api/examples): each *.request.json is answered 200 with
 * the shapes api/openapi.yaml describes, the seed examples are the fixtures' requests,
 * and every fixture has an example.
 */
#include "itest.h"

/* Sizes of a 2-D matrix (or of the first matrix of a 3-D array) as rows and columns. */
static void matrix_size(const json_t *m, int batched, size_t *rows, size_t *cols)
{
    if (batched)
        m = json_array_get(m, 0);
    *rows = json_array_size(m);
    *cols = json_array_size(json_array_get(m, 0));
}

/* Checks that every innermost row of an attention array holds numbers in [0, 1] that sum
 * to 1 (or are all 0: a fully masked row). Returns 1, or 0 with the row in why. */
static int attention_rows_valid(const json_t *a, double tol, char *path, size_t cap, char *why, size_t why_cap)
{
    size_t base = strlen(path);
    if (json_is_array(json_array_get(a, 0))) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            snprintf(path + base, cap - base, "[%zu]", i);
            if (!attention_rows_valid(json_array_get(a, i), tol, path, cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    double sum = 0;
    for (size_t j = 0; j < json_array_size(a); j++) {
        double p = json_number_value(json_array_get(a, j));
        if (!(p >= 0 && p <= 1 + tol)) {
            snprintf(why, why_cap, "%s[%zu] is %.17g, not a probability", path, j, p);
            return 0;
        }
        sum += p;
    }
    if (!(fabs(sum - 1) <= tol || sum == 0)) {
        snprintf(why, why_cap, "%s sums to %.17g, not 1 (nor 0 for a fully masked row)", path, sum);
        return 0;
    }
    return 1;
}

/*
 * Checks an attention answer against the shapes the contract gives for its request:
 * output Lq x d_out (d_out x Lq with layout columns) with the batch axis of the input,
 * attention [batch][heads][Lq][Lk] with the batch axis only for batched input and the
 * heads axis only when the request (or the stored set it names, described by
 * set_summary) has heads, each row a probability distribution; no attention when
 * return_attention is false.
 */
static void expect_contract_shapes(struct test *t, const json_t *req, const json_t *resp, const json_t *set_summary)
{
    const json_t *x = json_object_get(req, "x"), *context = json_object_get(req, "context");
    const json_t *main_in = x ? x : json_object_get(req, "q");
    const json_t *kv = x ? (context ? context : x) : json_object_get(req, "k");
    const json_t *weights = json_object_get(req, "weights");
    const char *layout = json_string_value(json_object_get(req, "layout"));
    const char *dtype = json_string_value(json_object_get(req, "dtype"));
    const int columns = layout != NULL && strcmp(layout, "columns") == 0;
    const int batched = json_is_array(json_array_get(json_array_get(main_in, 0), 0));
    size_t rows, cols, lq, lk, d_out = 0, heads = 0, batch = batched ? json_array_size(main_in) : 1;
    matrix_size(main_in, batched, &rows, &cols);
    lq = columns ? cols : rows;
    matrix_size(kv, batched, &rows, &cols);
    lk = columns ? cols : rows;
    if (x == NULL) {
        matrix_size(json_object_get(req, "v"), batched, &rows, &cols);
        d_out = columns ? rows : cols;
    } else if (json_is_object(weights)) {
        const char *wl = json_string_value(json_object_get(req, "weights_layout"));
        const json_t *w = json_object_get(weights, "wo") ? json_object_get(weights, "wo") : json_object_get(weights, "wv");
        matrix_size(w, 0, &rows, &cols);
        d_out = wl != NULL && strcmp(wl, "out_in") == 0 ? rows : cols;
    } else {
        const json_t *shapes = json_object_get(set_summary, "shapes");
        const json_t *w = json_object_get(shapes, "wo") ? json_object_get(shapes, "wo") : json_object_get(shapes, "wv");
        const char *wl = json_string_value(json_object_get(set_summary, "weights_layout"));
        d_out = (size_t)json_integer_value(json_array_get(w, wl != NULL && strcmp(wl, "out_in") == 0 ? 0 : 1));
        heads = (size_t)json_integer_value(json_object_get(set_summary, "heads"));
    }
    if (json_is_integer(json_object_get(req, "heads")))
        heads = (size_t)json_integer_value(json_object_get(req, "heads"));

    size_t dims[4], rank = 0;
    char path[512], why[1024];
    if (batched)
        dims[rank++] = batch;
    dims[rank++] = columns ? d_out : lq;
    dims[rank++] = columns ? lq : d_out;
    snprintf(path, sizeof path, "output");
    expect_true(t, json_has_shape(json_object_get(resp, "output"), dims, rank, path, sizeof path, why, sizeof why),
                "%s (expected %s%zu x %zu)", why, batched ? "batch x " : "", dims[rank - 2], dims[rank - 1]);
    const json_t *attention = json_object_get(resp, "attention");
    if (json_is_false(json_object_get(req, "return_attention"))) {
        expect_true(t, attention == NULL, "attention is present although return_attention is false");
        return;
    }
    rank = 0;
    if (batched)
        dims[rank++] = batch;
    if (heads > 0)
        dims[rank++] = heads;
    dims[rank++] = lq;
    dims[rank++] = lk;
    snprintf(path, sizeof path, "attention");
    if (expect_true(t, json_has_shape(attention, dims, rank, path, sizeof path, why, sizeof why),
                    "%s (expected %s%s%zu x %zu)", why, batched ? "batch x " : "", heads ? "heads x " : "", lq, lk)) {
        snprintf(path, sizeof path, "attention");
        double tol = dtype != NULL && strcmp(dtype, "float32") == 0 ? 1e-5 : 1e-9;
        expect_true(t, attention_rows_valid(attention, tol, path, sizeof path, why, sizeof why), "%s", why);
    }
}

/* Returns 1 when name ends with suffix. */
static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), m = strlen(suffix);
    return n >= m && strcmp(name + n - m, suffix) == 0;
}

/*
 * Every api/examples/NAME.request.json: the seed ones must be the request of the fixture
 * NAME (as JSON values), every fixture must have one, and each must be answered 200 with
 * the shapes of the contract (after storing the weight set an example names from
 * api/examples/SET.weight-set.json).
 */
void run_example_tests(const struct itest_paths *paths)
{
    const char *dir = paths->examples, *fixture_dir = paths->fixtures;
    struct test t;
    struct server *s;
    size_t count, fixture_count;
    char **files = dir_entries(dir, &count), **fixtures = list_json_files(fixture_dir, &fixture_count);
    size_t examples = 0;
    for (size_t i = 0; i < count; i++)
        examples += ends_with(files[i], ".request.json");
    if (test_begin(&t, "examples/present")) {
        expect_true(&t, examples > 0, "no *.request.json in %s (run from the repository root, or give --examples)", dir);
        test_end(&t);
    }
    if (test_begin(&t, "examples/one-per-fixture")) {
        for (size_t i = 0; i < fixture_count; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%.*s.request.json", dir, (int)(strlen(fixtures[i]) - 5), fixtures[i]);
            expect_true(&t, access(path, R_OK) == 0, "fixture %s has no example %s", fixtures[i], path);
        }
        test_end(&t);
    }
    for (size_t i = 0; i < count; i++) {
        if (!ends_with(files[i], ".request.json"))
            continue;
        char test_name[300], stem[256], path[PATH_MAX];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(files[i]) - strlen(".request.json")), files[i]);
        snprintf(test_name, sizeof test_name, "examples/%s", stem);
        if (!test_start(&t, SERVER_DEFAULT, &s, test_name))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        json_error_t error;
        json_t *req = json_load_file(path, 0, &error), *set_summary = NULL, *body = NULL;
        struct client_response r = {0};
        if (!expect_true(&t, json_is_object(req), "%s:%d: %s", path, error.line, req ? "not an object" : error.text))
            goto next;
        if (strncmp(stem, "seed", 4) == 0) {
            snprintf(path, sizeof path, "%.3000s/%s.json", fixture_dir, stem);
            json_t *fixture = json_load_file(path, 0, &error);
            if (expect_true(&t, fixture != NULL, "no fixture %s for this example", path))
                expect_same(&t, req, json_object_get(fixture, "request"), 0, "the example against the fixture's request");
            json_decref(fixture);
        }
        const char *set_name = json_string_value(json_object_get(req, "weights"));
        if (set_name != NULL) {
            snprintf(path, sizeof path, "%s/%s.weight-set.json", dir, set_name);
            size_t len;
            char *text = client_read_file(path, &len);
            if (!expect_true(&t, text != NULL, "the example names the set \"%s\" but there is no %s", set_name, path))
                goto next;
            char url[256];
            snprintf(url, sizeof url, "/v1/weight-sets/%s", set_name);
            http_text(s, "PUT", url, text, &r);
            free(text);
            if (r.status != 200)
                expect_status(&t, &r, 201);
            set_summary = response_json(&r);
            client_response_free(&r);
            if (t.failed)
                goto next;
        }
        http_post_json(s, "/v1/attention", req, &r);
        if (!expect_status(&t, &r, 200))
            goto next;
        body = response_json(&r);
        if (expect_true(&t, json_is_object(body), "the answer is not a JSON object"))
            expect_contract_shapes(&t, req, body, set_summary);
    next:
        json_decref(req);
        json_decref(set_summary);
        json_decref(body);
        client_response_free(&r);
        test_end(&t);
    }
    free_name_list(files);
    free_name_list(fixtures);
}

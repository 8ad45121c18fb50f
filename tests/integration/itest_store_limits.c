/*
 * itest_store_limits.c - the limits of the store on a server with a small one: 413
 * weight_set_too_large and store_full, with nothing written (the list, the data
 * directory and the old file unchanged), and room again after a replacement or DELETE.
 */
#include "itest.h"

/*
 * Returns the text of a set with d_in = d_ctx = 5 and dk = dv = n, no biases: 15 n
 * numbers, so README's file is 80 + 8 (name of at most 8 characters) + 120 n + 8 bytes:
 * n = 13 takes 1656, n = 14 1776, n = 17 2136 (over the 2048 of the small-store server),
 * n = 1 216. seed varies the numbers.
 */
static char *sized_set_text(size_t n, unsigned seed)
{
    uint64_t rng = RANDOM_SEED + seed;
    json_t *set = random_weight_set(&rng, 5, 5, n, n, 0, 0, 0, 0, 0);
    char *text = json_dumps(set, JSON_COMPACT);
    json_decref(set);
    return text;
}

/* The list as "name@stored_at ..." for comparing before and after a refused PUT. */
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

/*
 * PUTs text as name on the small-store server and expects 413 with code, and that
 * nothing changed: the list (names, times, sizes), the data directory's entries (no new
 * file, no temporary file) and, when name exists, its file byte for byte.
 */
static void expect_refused_put(struct test *t, const struct server *s, const char *name, const char *text,
                               const char *code)
{
    size_t count, len_before = 0, len_after = 0;
    char **entries = dir_entries(s->data_dir, &count);
    char *list_before = list_fingerprint(t, s), path[PATH_MAX], url[256];
    set_file_path(path, sizeof path, s->data_dir, name);
    char *file_before = client_read_file(path, &len_before);
    snprintf(url, sizeof url, "/v1/weight-sets/%s", name);
    struct client_response r;
    http_text(s, "PUT", url, text, &r);
    expect_error(t, &r, 413, code, NULL);
    client_response_free(&r);
    char *list_after = list_fingerprint(t, s);
    expect_true(t, strcmp(list_before, list_after) == 0, "the list changed: [%s] became [%s]", list_before, list_after);
    expect_dir_unchanged(t, s->data_dir, entries);
    char *file_after = client_read_file(path, &len_after);
    expect_true(t, (file_before == NULL) == (file_after == NULL) &&
                       (file_before == NULL || (len_before == len_after && memcmp(file_before, file_after, len_after) == 0)),
                "%s changed although the PUT was refused", path);
    free(file_before);
    free(file_after);
    free(list_before);
    free(list_after);
    free_name_list(entries);
}

void run_store_limit_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {
        "store-limits/set-too-large",
        "store-limits/two-sets-fit",
        "store-limits/store-full-new-set",
        "store-limits/store-full-replacement-keeps-old",
        "store-limits/same-size-replacement-fits",
        "store-limits/room-after-delete",
        NULL};
    if (!any_selected(names))
        return;
    int report;

    struct test t;
    struct server *s;
    struct client_response r;
    char *n13a = sized_set_text(13, 1), *n13b = sized_set_text(13, 2), *n13c = sized_set_text(13, 3);
    char *n14 = sized_set_text(14, 4), *n17 = sized_set_text(17, 5), *n1 = sized_set_text(1, 6);

    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/set-too-large", &report)) {
        expect_refused_put(&t, s, "big", n17, "weight_set_too_large");
        json_decref(get_set(&t, s, "big", 404));
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/two-sets-fit", &report)) {
        json_t *a = put_set_text(&t, s, "s1", n13a, 201), *b = put_set_text(&t, s, "s2", n13b, 201);
        long long size = json_integer_value(json_object_get(a, "size_bytes"));
        expect_true(&t, a == NULL || size == 1656, "a set of 195 numbers named s1 takes %lld bytes, README's format "
                    "says 1656 (the limits of this group assume it)", size);
        json_decref(a);
        json_decref(b);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/store-full-new-set", &report)) {
        expect_refused_put(&t, s, "s3", n1, "store_full");
        json_decref(get_set(&t, s, "s3", 404));
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/store-full-replacement-keeps-old", &report)) {
        expect_refused_put(&t, s, "s1", n14, "store_full");
        json_t *sent = json_from_text(n13a);
        expect_stored_set(&t, s, "s1", sent);
        json_decref(sent);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/same-size-replacement-fits", &report)) {
        /* Replacing frees the old file's bytes: 1656 - 1656 + 1656 stays within 3400. */
        json_decref(put_set_text(&t, s, "s1", n13c, 200));
        json_t *sent = json_from_text(n13c);
        expect_stored_set(&t, s, "s1", sent);
        json_decref(sent);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_SMALL_STORE, &s, "store-limits/room-after-delete", &report)) {
        http_simple(s, "DELETE", "/v1/weight-sets/s2", &r);
        expect_status(&t, &r, 204);
        client_response_free(&r);
        json_decref(put_set_text(&t, s, "s3", n1, 201));
        step_end(&t, report);
    }
    free(n13a);
    free(n13b);
    free(n13c);
    free(n14);
    free(n17);
    free(n1);
}

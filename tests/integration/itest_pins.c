/*
 * itest_pins.c - requests pinned to a generation (If-Match, weights_generation) that can
 * never be served end with a definite answer, and cost no directory scan.
 *
 * Two servers, A and B, share one data directory with a background sync interval of an
 * hour, so that within the test a set B writes reaches A only when A rescans because a
 * request made it.  That makes the rescans visible without a clock: after requests on A
 * that must not rescan, a set B wrote is still missing from A's list.
 */
#include "itest.h"

/* The generation in the answer to a PUT (its "generation" member), or 0. */
static long long put_generation(struct test *t, const struct server *s, const char *name)
{
    json_t *answer = put_set_text(t, s, name, g_tiny_set, 201);
    long long g = json_integer_value(json_object_get(answer, "generation"));
    json_decref(answer);
    expect_true(t, g > 0, "the PUT of %s gave no generation", name);
    return g;
}

/* GET /v1/weight-sets/NAME with If-Match: "GEN"; the caller frees r. */
static void get_pinned(const struct server *s, const char *name, long long gen,
                       struct client_response *r)
{
    char path[160], header[64];
    snprintf(path, sizeof path, "/v1/weight-sets/%s", name);
    snprintf(header, sizeof header, "If-Match: \"%lld\"", gen);
    struct client_request rq = {.method = "GET", .path = path, .headers = {header}};
    http_call(s, &rq, r);
}

/* POST /v1/attention on the set NAME pinned to GEN; the caller frees r. */
static void attention_pinned(const struct server *s, const char *name, long long gen,
                             struct client_response *r)
{
    char body[256];
    snprintf(body, sizeof body, "{\"x\": [[1, 1]], \"weights\": \"%s\", \"weights_generation\": %lld}",
             name, gen);
    http_text(s, "POST", "/v1/attention", body, r);
}

/* Whether A's list names the set name (a failure is recorded in t). */
static int listed(struct test *t, const struct server *s, const char *name)
{
    json_t *list = get_set_list(t, s);
    int found = list != NULL && list_find(list, name) != NULL;
    json_decref(list);
    return found;
}

void run_pin_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {
        "pins/deleted-set-is-404", "pins/no-rescan-per-request", "pins/never-stored-generation-412",
        "pins/new-generation-on-disk-served", NULL};
    if (!any_selected(names))
        return;
    static const char *const slow_sync[] = {"--store-sync-interval", "3600000", NULL};
    static const struct server_kind kind_a = {"pins-a", slow_sync, g_no_strings};
    static const struct server_kind kind_b = {"pins-b", slow_sync, g_no_strings};
    struct server a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.kind = &kind_a;
    b.kind = &kind_b;
    snprintf(a.data_dir, sizeof a.data_dir, "%s/data-pins", g_tmpdir);
    snprintf(b.data_dir, sizeof b.data_dir, "%s", a.data_dir);
    if (server_start(&a) != 0)
        return;
    if (server_start(&b) != 0) {
        server_stop(&a);
        return;
    }
    struct test t;
    struct client_response r;

    /* A stores "gone", then deletes it: a pin on it is answered 404 at once, every time,
     * and never "retry". */
    long long gone = 0;
    if (test_begin(&t, "pins/deleted-set-is-404")) {
        gone = put_generation(&t, &a, "gone");
        http_simple(&a, "DELETE", "/v1/weight-sets/gone", &r);
        expect_status(&t, &r, 204);
        client_response_free(&r);
        for (int i = 0; i < 3; i++) {
            get_pinned(&a, "gone", gone, &r);
            expect_error(&t, &r, 404, "unknown_weight_set", NULL);
            expect_true(&t, client_header(&r, "Retry-After") == NULL, "a 404 with Retry-After");
            client_response_free(&r);
            attention_pinned(&a, "gone", gone, &r);
            expect_error(&t, &r, 404, "unknown_weight_set", "weights_generation");
            client_response_free(&r);
        }
        test_end(&t);
    }

    /* B writes "other"; 50 pinned requests on A for the deleted set (and for an unknown
     * name) read no directory: "other" is still unknown to A afterwards. */
    long long other = 0;
    if (test_begin(&t, "pins/no-rescan-per-request")) {
        other = put_generation(&t, &b, "other");
        for (int i = 0; i < 50 && !t.failed; i++) {
            get_pinned(&a, "gone", gone > 0 ? gone : 1, &r);
            expect_status(&t, &r, 404);
            client_response_free(&r);
            attention_pinned(&a, "never-there", 12345, &r);
            expect_status(&t, &r, 404);
            client_response_free(&r);
        }
        expect_true(&t, !listed(&t, &a, "other"),
                    "A rescanned its directory for pins that could not be served: it lists "
                    "the set B wrote");
        test_end(&t);
    }

    /* A pin on a generation that was never stored, above the one in the directory, is a
     * failed precondition, not "retry". */
    if (test_begin(&t, "pins/never-stored-generation-412")) {
        long long g = put_generation(&t, &a, "moved");
        get_pinned(&a, "moved", g + 1000, &r);
        expect_error(&t, &r, 412, "generation_mismatch", NULL);
        client_response_free(&r);
        attention_pinned(&a, "moved", g + 1000, &r);
        expect_error(&t, &r, 412, "generation_mismatch", "weights_generation");
        client_response_free(&r);
        test_end(&t);
    }

    /* Read-your-writes still holds: a pin on the generation B wrote makes A load it. */
    if (test_begin(&t, "pins/new-generation-on-disk-served")) {
        get_pinned(&a, "other", other, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        expect_true(&t, listed(&t, &a, "other"), "A does not list the set it just served");
        test_end(&t);
    }
    server_stop(&b);
    server_stop(&a);
}

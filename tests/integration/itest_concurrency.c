/*
 * itest_concurrency.c - concurrency smoke test: many copies of the largest fixture at once,
 * mixed with garbage, for a few rounds; every answer must be the right one.
 */
#include "itest.h"

#define CONCURRENT_VALID 8
#define CONCURRENT_GARBAGE 2
#define CONCURRENT_ROUNDS 3

/*
 * Sends CONCURRENT_VALID copies of the largest 200-fixture at once, while other curl
 * processes send garbage, for a few rounds. Every valid request must get the fixture's
 * answer and every garbage request a 400 invalid_json.
 */
void run_concurrency_tests(const struct itest_paths *paths)
{
    const char *fixture_dir = paths->fixtures;
    static const char *const garbage[CONCURRENT_GARBAGE] = {"{\"q\": [[1, 2], [3", "\x01\x02 not json at all"};
    struct test t;
    size_t count;
    char **files = list_json_files(fixture_dir, &count);
    json_t *chosen = NULL;
    size_t chosen_size = 0;

    /* Choose the fixture with the biggest request among those that expect 200. */
    for (size_t i = 0; i < count; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", fixture_dir, files[i]);
        json_t *f = json_load_file(path, 0, NULL);
        json_t *expect = json_object_get(f, "expect");
        char *text = json_dumps(json_object_get(f, "request"), JSON_COMPACT);
        if (text != NULL && json_integer_value(json_object_get(expect, "status")) == 200 &&
            json_object_get(expect, "output") != NULL && strlen(text) > chosen_size) {
            json_decref(chosen);
            chosen = json_incref(f);
            chosen_size = strlen(text);
        }
        free(text);
        json_decref(f);
    }
    free_name_list(files);

    char *request_text = chosen != NULL ? json_dumps(json_object_get(chosen, "request"), JSON_COMPACT) : NULL;
    const json_t *expect = json_object_get(chosen, "expect");
    const json_t *tol_json = json_object_get(expect, "tolerance");
    double tolerance = json_is_number(tol_json) ? json_number_value(tol_json) : FLOAT64_TOLERANCE;

    for (int round = 1; round <= CONCURRENT_ROUNDS; round++) {
        if (!test_begin(&t, "concurrency/round-%d", round))
            continue;
        struct server *s = NULL;
        if (!expect_true(&t, request_text != NULL, "no fixture with status 200 and an output to send") ||
            (s = test_server(&t, SERVER_DEFAULT)) == NULL) {
            test_end(&t);
            continue;
        }
        struct client_pending pending[CONCURRENT_VALID + CONCURRENT_GARBAGE];
        for (int i = 0; i < CONCURRENT_VALID + CONCURRENT_GARBAGE; i++) {
            /* Interleave the garbage among the valid requests. */
            int is_garbage = i % 5 == 2;
            const char *text = is_garbage ? garbage[(i / 5) % CONCURRENT_GARBAGE] : request_text;
            struct client_request rq = {.method = "POST", .path = "/v1/attention", .body = text,
                                        .body_len = strlen(text)};
            client_http_start(s->base_url, g_tmpdir, &rq, &pending[i]);
        }
        for (int i = 0; i < CONCURRENT_VALID + CONCURRENT_GARBAGE; i++) {
            int is_garbage = i % 5 == 2;
            struct client_response r;
            client_http_finish(&pending[i], &r);
            json_t *body = response_json(&r);
            char why[1024] = "";
            if (r.status != (is_garbage ? 400 : 200)) {
                snprintf(why, sizeof why, "status %d (%s)", r.status, r.transport_error);
            } else if (is_garbage) {
                const char *code = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
                if (code == NULL || strcmp(code, "invalid_json") != 0)
                    snprintf(why, sizeof why, "error code %s, expected invalid_json", code ? code : "(none)");
            } else {
                char path[64];
                const char *keys[] = {"output", "attention"};
                for (int k = 0; k < 2 && why[0] == '\0'; k++) {
                    const json_t *want = json_object_get(expect, keys[k]);
                    snprintf(path, sizeof path, "%s", keys[k]);
                    if (want != NULL)
                        json_numbers_close(json_object_get(body, keys[k]), want, tolerance, 0.0, path, sizeof path,
                                           why, sizeof why);
                }
            }
            expect_true(&t, why[0] == '\0', "%s client %d: %s", is_garbage ? "garbage" : "valid", i, why);
            json_decref(body);
            client_response_free(&r);
        }
        test_end(&t);
    }
    check_still_serving("concurrency", SERVER_DEFAULT);
    free(request_text);
    json_decref(chosen);
}

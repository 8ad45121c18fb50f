/*
 * itest_replace.c - attention by name while another client replaces and deletes the set:
 * every answer must be that of one whole set, never a mix, and the server must not fail.
 */
#include "itest.h"

#define REPLACE_READERS 8
#define REPLACE_WRITES 12    /* PUTs after the first, alternating B, A, B, ... */
#define REPLACE_DELETE_AT 6 /* before this write: DELETE the set, then PUT it again (201) */

/* Returns 1 when an answer's output and attention are within 1e-12 of want's. */
static int answer_matches(const json_t *got, const json_t *want)
{
    char path[512], why[1024];
    static const char *const keys[] = {"output", "attention"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s", keys[k]);
        if (!json_numbers_close(json_object_get(got, keys[k]), json_object_get(want, keys[k]), 1e-12, 0.0, path,
                                sizeof path, why, sizeof why))
            return 0;
    }
    return 1;
}

/* One client's request in flight: its curl and when it started. */
struct timed_request {
    struct client_pending p;
    double started;
    int active;
    int op; /* writer: index of the operation */
};

/*
 * REPLACE_READERS clients send attention requests that name the set "replace-target"
 * while another replaces it, alternating versions A and B, and once deletes and re-creates
 * it. Every answer must be exactly A's or B's (a request holds one version), or a 404
 * unknown_weight_set from a request that overlapped the deleted window.
 */
void run_replace_concurrency_tests(const struct itest_paths *paths)
{
    (void)paths;
    struct test t;
    struct server *s;
    if (!test_start(&t, SERVER_DEFAULT, &s, "replace-concurrency/answers-are-version-a-or-b"))
        return;
    uint64_t rng = RANDOM_SEED + 31337u;
    json_t *versions[2];
    char *set_text[2];
    for (int v = 0; v < 2; v++) {
        versions[v] = random_weight_set(&rng, 48, 48, 48, 48, 48, 1, 1, 0, 4);
        set_text[v] = json_dumps(versions[v], JSON_COMPACT);
    }
    double *x = random_values(&rng, 16 * 48, 1.0, 0);
    json_t *req = json_object();
    json_object_set_new(req, "x", json_matrix(x, 16, 48, 0));
    free(x);
    json_t *want[2] = {NULL, NULL};
    for (int v = 0; v < 2; v++) {
        json_t *inline_req = json_deep_copy(req);
        json_object_set_new(inline_req, "weights", weights_of(versions[v]));
        json_object_set_new(inline_req, "heads", json_integer(4));
        struct client_response r;
        http_post_json(s, "/v1/attention", inline_req, &r);
        if (expect_status(&t, &r, 200))
            want[v] = response_json(&r);
        client_response_free(&r);
        json_decref(inline_req);
    }
    json_object_set_new(req, "weights", json_string("replace-target"));
    char *named_text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    expect_true(&t, want[0] == NULL || want[1] == NULL || !answer_matches(want[0], want[1]),
                "versions A and B give the same answer, so the test could not tell them apart");
    json_decref(put_set_text(&t, s, "replace-target", set_text[0], 201));
    if (t.failed)
        goto done;

    /* The writer's operations: PUT B, PUT A, ..., with a DELETE and a re-creating PUT A. */
    struct { const char *method; int version; int want; } ops[REPLACE_WRITES + 2];
    size_t op_count = 0;
    for (int i = 0; i < REPLACE_WRITES; i++) {
        if (i == REPLACE_DELETE_AT) {
            ops[op_count].method = "DELETE", ops[op_count].version = -1, ops[op_count++].want = 204;
            ops[op_count].method = "PUT", ops[op_count].version = 0, ops[op_count++].want = 201;
        }
        ops[op_count].method = "PUT", ops[op_count].version = (i % 2 == 0), ops[op_count++].want = 200;
    }
    struct timed_request readers[REPLACE_READERS], writer;
    memset(readers, 0, sizeof readers);
    memset(&writer, 0, sizeof writer);
    size_t next_op = 0, answers[2] = {0, 0}, not_found = 0, total = 0;
    double delete_started = -1, recreated = -1;
    struct client_request named_rq = {.method = "POST", .path = "/v1/attention", .body = named_text,
                                      .body_len = strlen(named_text)};
    for (;;) {
        int busy = 0, progressed = 0;
        if (!writer.active && next_op < op_count) {
            struct client_request rq = {.method = ops[next_op].method, .path = "/v1/weight-sets/replace-target"};
            if (ops[next_op].version >= 0) {
                rq.body = set_text[ops[next_op].version];
                rq.body_len = strlen(rq.body);
            }
            writer.started = client_now_seconds();
            writer.op = (int)next_op++;
            if (ops[writer.op].version < 0)
                delete_started = writer.started;
            client_http_start(s->base_url, g_tmpdir, &rq, &writer.p);
            writer.active = 1;
        }
        if (writer.active && client_http_done(&writer.p)) {
            struct client_response r;
            client_http_finish(&writer.p, &r);
            writer.active = 0;
            progressed = 1;
            expect_true(&t, r.status == ops[writer.op].want, "writer %s #%d: status %d, expected %d (%s)",
                        ops[writer.op].method, writer.op, r.status, ops[writer.op].want, r.transport_error);
            if (ops[writer.op].want == 201 && writer.op > 0)
                recreated = client_now_seconds();
            client_response_free(&r);
        }
        int writing = writer.active || next_op < op_count;
        for (int i = 0; i < REPLACE_READERS; i++) {
            struct timed_request *rd = &readers[i];
            if (rd->active && client_http_done(&rd->p)) {
                struct client_response r;
                client_http_finish(&rd->p, &r);
                double ended = client_now_seconds();
                rd->active = 0;
                progressed = 1;
                total++;
                json_t *body = response_json(&r);
                if (r.status == 200) {
                    int a = want[0] && answer_matches(body, want[0]), b = want[1] && answer_matches(body, want[1]);
                    answers[0] += (size_t)a;
                    answers[1] += (size_t)b;
                    if (!expect_true(&t, a || b, "reader %d: an answer that is neither version A's nor B's", i)) {
                        char snippet[400];
                        body_snippet(r.body, r.body_len, snippet, sizeof snippet);
                        test_detail(&t, "    answer: %s", snippet);
                    }
                } else if (r.status == 404) {
                    const char *code = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
                    int in_window = delete_started >= 0 && ended >= delete_started &&
                                    (recreated < 0 || rd->started <= recreated);
                    not_found++;
                    expect_true(&t, code != NULL && strcmp(code, "unknown_weight_set") == 0 && in_window,
                                "reader %d: 404 %s %s the deleted window", i, code ? code : "(no code)",
                                in_window ? "within" : "outside");
                } else {
                    expect_true(&t, 0, "reader %d: status %d (%s)", i, r.status, r.transport_error);
                }
                json_decref(body);
                client_response_free(&r);
            }
            if (!rd->active && writing) {
                rd->started = client_now_seconds();
                client_http_start(s->base_url, g_tmpdir, &named_rq, &rd->p);
                rd->active = 1;
            }
            busy |= rd->active;
        }
        if (!busy && !writing && !writer.active)
            break;
        if (!progressed)
            client_sleep_ms(1);
    }
    test_detail(&t, "    %zu answers: %zu of version A, %zu of version B, %zu 404 in the deleted window", total,
                answers[0], answers[1], not_found);
    expect_true(&t, answers[0] > 0 && answers[1] > 0,
                "only %zu answers of A and %zu of B: the replacements were not seen", answers[0], answers[1]);
done:
    if (t.failed)
        detail_stderr_tail(&t, s, 10);
    test_end(&t);
    free(named_text);
    for (int v = 0; v < 2; v++) {
        json_decref(versions[v]);
        json_decref(want[v]);
        free(set_text[v]);
    }
    check_still_serving("replace-concurrency", SERVER_DEFAULT);
}

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

/* One run of the test: the two versions, the answers they give inline, the writer's
 * operations and what the readers saw. */
struct replace_run {
    json_t *versions[2];
    char *set_text[2];
    json_t *want[2];
    char *named_text;
    struct { const char *method; int version; int want; } ops[REPLACE_WRITES + 2];
    size_t op_count, next_op;
    size_t answers[2], not_found, total;
    double delete_started, recreated;
};

/* Makes versions A and B, asks for each one's answer with the weights inline, and stores A
 * as "replace-target"; fills the writer's operations: PUT B, PUT A, ..., with a DELETE and
 * a re-creating PUT A. */
static void replace_prepare(struct test *t, const struct server *s, struct replace_run *run)
{
    uint64_t rng = RANDOM_SEED + 31337u;
    for (int v = 0; v < 2; v++) {
        run->versions[v] = random_weight_set(&rng, 48, 48, 48, 48, 48, 1, 1, 0, 4);
        run->set_text[v] = json_dumps(run->versions[v], JSON_COMPACT);
    }
    double *x = random_values(&rng, 16 * 48, 1.0, 0);
    json_t *req = json_object();
    json_object_set_new(req, "x", json_matrix(x, 16, 48, 0));
    free(x);
    for (int v = 0; v < 2; v++) {
        json_t *inline_req = json_deep_copy(req);
        json_object_set_new(inline_req, "weights", weights_of(run->versions[v]));
        json_object_set_new(inline_req, "heads", json_integer(4));
        struct client_response r;
        http_post_json(s, "/v1/attention", inline_req, &r);
        if (expect_status(t, &r, 200))
            run->want[v] = response_json(&r);
        client_response_free(&r);
        json_decref(inline_req);
    }
    json_object_set_new(req, "weights", json_string("replace-target"));
    run->named_text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    expect_true(t, run->want[0] == NULL || run->want[1] == NULL || !answer_matches(run->want[0], run->want[1]),
                "versions A and B give the same answer, so the test could not tell them apart");
    json_decref(put_set_text(t, s, "replace-target", run->set_text[0], 201));

    for (int i = 0; i < REPLACE_WRITES; i++) {
        size_t n = run->op_count;
        if (i == REPLACE_DELETE_AT) {
            run->ops[n].method = "DELETE", run->ops[n].version = -1, run->ops[n].want = 204, n++;
            run->ops[n].method = "PUT", run->ops[n].version = 0, run->ops[n].want = 201, n++;
        }
        run->ops[n].method = "PUT", run->ops[n].version = (i % 2 == 0), run->ops[n].want = 200, n++;
        run->op_count = n;
    }
}

/* The writer: starts the next operation when none is running, checks the status of the
 * one that ended.  Returns 1 when an operation ended. */
static int replace_writer(struct test *t, const struct server *s, struct replace_run *run,
                          struct timed_request *writer)
{
    if (!writer->active && run->next_op < run->op_count) {
        struct client_request rq = {.method = run->ops[run->next_op].method, .path = "/v1/weight-sets/replace-target"};
        if (run->ops[run->next_op].version >= 0) {
            rq.body = run->set_text[run->ops[run->next_op].version];
            rq.body_len = strlen(rq.body);
        }
        writer->started = client_now_seconds();
        writer->op = (int)run->next_op++;
        if (run->ops[writer->op].version < 0)
            run->delete_started = writer->started;
        client_http_start(s->base_url, g_tmpdir, &rq, &writer->p);
        writer->active = 1;
    }
    if (!writer->active || !client_http_done(&writer->p))
        return 0;
    struct client_response r;
    client_http_finish(&writer->p, &r);
    writer->active = 0;
    expect_true(t, r.status == run->ops[writer->op].want, "writer %s #%d: status %d, expected %d (%s)",
                run->ops[writer->op].method, writer->op, r.status, run->ops[writer->op].want, r.transport_error);
    if (run->ops[writer->op].want == 201 && writer->op > 0)
        run->recreated = client_now_seconds();
    client_response_free(&r);
    return 1;
}

/* Checks the answer of reader i that ended: exactly A's or B's, or a 404
 * unknown_weight_set for a request that overlapped the deleted window. */
static void replace_reader_answer(struct test *t, struct replace_run *run, struct timed_request *rd, int i)
{
    struct client_response r;
    client_http_finish(&rd->p, &r);
    double ended = client_now_seconds();
    rd->active = 0;
    run->total++;
    json_t *body = response_json(&r);
    if (r.status == 200) {
        int a = run->want[0] && answer_matches(body, run->want[0]);
        int b = run->want[1] && answer_matches(body, run->want[1]);
        run->answers[0] += (size_t)a;
        run->answers[1] += (size_t)b;
        if (!expect_true(t, a || b, "reader %d: an answer that is neither version A's nor B's", i)) {
            char snippet[400];
            body_snippet(r.body, r.body_len, snippet, sizeof snippet);
            test_detail(t, "    answer: %s", snippet);
        }
    } else if (r.status == 404) {
        const char *code = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
        int in_window = run->delete_started >= 0 && ended >= run->delete_started &&
                        (run->recreated < 0 || rd->started <= run->recreated);
        run->not_found++;
        expect_true(t, code != NULL && strcmp(code, "unknown_weight_set") == 0 && in_window,
                    "reader %d: 404 %s %s the deleted window", i, code ? code : "(no code)",
                    in_window ? "within" : "outside");
    } else {
        expect_true(t, 0, "reader %d: status %d (%s)", i, r.status, r.transport_error);
    }
    json_decref(body);
    client_response_free(&r);
}

/*
 * REPLACE_READERS clients send attention requests that name the set "replace-target"
 * while another replaces it, alternating versions A and B, and once deletes and re-creates
 * it. Every answer must be exactly A's or B's (a request holds one version), or a 404
 * unknown_weight_set from a request that overlapped the deleted window.
 */
void run_replace_concurrency_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {"replace-concurrency/answers-are-version-a-or-b",
                                        "replace-concurrency/still-serving/default", NULL};
    if (!any_selected(names))
        return;
    /* Whatever --filter says: still-serving checks the server after this load. */
    struct test t;
    struct server *s;
    int report;
    if (!step_start(&t, SERVER_DEFAULT, &s, "replace-concurrency/answers-are-version-a-or-b", &report))
        return;
    struct replace_run run;
    memset(&run, 0, sizeof run);
    run.delete_started = -1, run.recreated = -1;
    replace_prepare(&t, s, &run);
    if (t.failed)
        goto done;

    struct timed_request readers[REPLACE_READERS], writer;
    memset(readers, 0, sizeof readers);
    memset(&writer, 0, sizeof writer);
    struct client_request named_rq = {.method = "POST", .path = "/v1/attention", .body = run.named_text,
                                      .body_len = strlen(run.named_text)};
    for (;;) {
        int busy = 0, progressed = replace_writer(&t, s, &run, &writer);
        int writing = writer.active || run.next_op < run.op_count;
        for (int i = 0; i < REPLACE_READERS; i++) {
            struct timed_request *rd = &readers[i];
            if (rd->active && client_http_done(&rd->p)) {
                replace_reader_answer(&t, &run, rd, i);
                progressed = 1;
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
    test_detail(&t, "    %zu answers: %zu of version A, %zu of version B, %zu 404 in the deleted window", run.total,
                run.answers[0], run.answers[1], run.not_found);
    expect_true(&t, run.answers[0] > 0 && run.answers[1] > 0,
                "only %zu answers of A and %zu of B: the replacements were not seen", run.answers[0], run.answers[1]);
done:
    if (t.failed)
        detail_stderr_tail(&t, s, 10);
    step_end(&t, report);
    free(run.named_text);
    for (int v = 0; v < 2; v++) {
        json_decref(run.versions[v]);
        json_decref(run.want[v]);
        free(run.set_text[v]);
    }
    check_still_serving("replace-concurrency", SERVER_DEFAULT);
}

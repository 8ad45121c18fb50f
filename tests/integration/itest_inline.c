/*
 * itest_inline.c - small requests answered on the I/O thread that read them
 * (--inline-max-bytes): the same answers as through a worker, byte for byte; a small body
 * whose work is not small (a stored set with wide projections, a large attention matrix)
 * still goes to a worker; the body-size threshold and its environment variable; the
 * option's bounds.  Where a request was answered is read from /metrics
 * (attn_http_dispatch_total{path="inline|worker|deferred"}), never from timing.
 */
#include "itest.h"

#include <fcntl.h>

/* The wide stored set: x of WIDE_TOKENS x WIDE_IN projected to dk = dv = WIDE_OUT takes
 * 2 * 16 * 64 * 1024 * 3 = 6.3 MFLOP of projections, over the 4 MFLOP an I/O thread may
 * spend, from a body of about 1.2 KB. */
#define WIDE_TOKENS 16
#define WIDE_IN 64
#define WIDE_OUT 1024
/* The answer-heavy request: q, k, v of ANSWER_L x 1 (under 4 KB of body, 0.4 MFLOP) with
 * the attention matrix, 90,000 numbers to write. */
#define ANSWER_L 300

enum { PATH_INLINE, PATH_WORKER, PATH_DEFERRED, PATH_COUNT };
static const char *const path_labels[PATH_COUNT] = {"inline", "worker", "deferred"};

/* Reads the three attn_http_dispatch_total counters of s into counts (-1: missing). */
static void read_dispatch(const struct server *s, long long counts[PATH_COUNT])
{
    struct client_response r;
    http_simple(s, "GET", "/metrics", &r);
    for (int p = 0; p < PATH_COUNT; p++) {
        char key[96];
        snprintf(key, sizeof key, "attn_http_dispatch_total{path=\"%s\"} ", path_labels[p]);
        const char *at = r.status == 200 ? strstr(r.body, key) : NULL;
        counts[p] = at != NULL ? strtoll(at + strlen(key), NULL, 10) : -1;
    }
    client_response_free(&r);
}

/* Reads the counters once their sum has reached total: a request is counted when
 * libmicrohttpd reports it complete, which may come just after its client has the answer.
 * At most 100 reads, 20 ms apart. */
static void wait_dispatch(const struct server *s, long long total, long long counts[PATH_COUNT])
{
    for (int i = 0; i < 100; i++) {
        read_dispatch(s, counts);
        if (counts[0] < 0 || counts[0] + counts[1] + counts[2] >= total)
            return;
        client_sleep_ms(20);
    }
}

/* Checks the counters of s against inline, worker and deferred counts. */
static void expect_dispatch(struct test *t, const struct server *s, long long want_inline,
                            long long want_worker, long long want_deferred)
{
    long long got[PATH_COUNT];
    wait_dispatch(s, want_inline + want_worker + want_deferred, got);
    expect_true(t, got[PATH_INLINE] == want_inline && got[PATH_WORKER] == want_worker &&
                   got[PATH_DEFERRED] == want_deferred,
                "attn_http_dispatch_total on server %s: inline %lld, worker %lld, deferred %lld; "
                "expected %lld, %lld, %lld", s->kind->label, got[PATH_INLINE], got[PATH_WORKER],
                got[PATH_DEFERRED], want_inline, want_worker, want_deferred);
}

/* Replaces the number after every "compute_ms": (a measured time) with 0 so that two
 * answers can be compared byte for byte. */
static void blank_compute_ms(struct client_response *r)
{
    static const char key[] = "\"compute_ms\":";
    for (char *at = strstr(r->body, key); at != NULL; at = strstr(at, key)) {
        at += strlen(key);
        size_t n = strspn(at, "0123456789.eE+-");
        if (n == 0)
            continue;
        *at = '0';
        memmove(at + 1, at + n, r->body_len - (size_t)(at + n - r->body) + 1);
        r->body_len -= n - 1;
    }
}

/* POSTs body to path on s, with an optional header. */
static void post(const struct server *s, const char *path, const char *body, size_t len,
                 const char *header, struct client_response *r)
{
    struct client_request rq = {.method = "POST", .path = path, .body = body, .body_len = len};
    rq.headers[0] = header;
    http_call(s, &rq, r);
}

/* The request of the fixture seed000_encoder (about 1.2 KB), compact; NULL when unreadable. */
static char *seed_request(const char *fixtures)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/seed000_encoder.json", fixtures);
    json_error_t jerr;
    json_t *fixture = json_load_file(path, 0, &jerr);
    char *text = fixture != NULL ? json_dumps(json_object_get(fixture, "request"), JSON_COMPACT) : NULL;
    json_decref(fixture);
    return text;
}

/* A weight set of WIDE_IN x WIDE_OUT matrices of ones, as JSON text (the caller frees it). */
static char *wide_set_text(void)
{
    size_t row = 2 + 2 * WIDE_OUT, cap = 3 * (4 + WIDE_IN * (row + 1)) + 64, used = 0;
    char *text = client_xcalloc(cap, 1);
    static const char *const names[3] = {"wq", "wk", "wv"};
    used += (size_t)snprintf(text + used, cap - used, "{");
    for (int m = 0; m < 3; m++) {
        used += (size_t)snprintf(text + used, cap - used, "%s\"%s\":[", m ? "," : "", names[m]);
        for (size_t i = 0; i < WIDE_IN; i++) {
            text[used++] = i ? ',' : '[';
            if (i)
                text[used++] = '[';
            for (size_t j = 0; j < WIDE_OUT; j++) {
                text[used++] = j ? ',' : '1';
                if (j)
                    text[used++] = '1';
            }
            text[used++] = ']';
        }
        text[used++] = ']';
    }
    snprintf(text + used, cap - used, "}");
    return text;
}

/* x of WIDE_TOKENS x WIDE_IN, every number 1, naming the set "wide". */
static char *wide_request_text(void)
{
    size_t cap = WIDE_TOKENS * (WIDE_IN * 2 + 4) + 128, used = 0;
    char *text = client_xcalloc(cap, 1);
    used += (size_t)snprintf(text, cap, "{\"x\":[");
    for (size_t i = 0; i < WIDE_TOKENS; i++) {
        used += (size_t)snprintf(text + used, cap - used, "%s[", i ? "," : "");
        for (size_t j = 0; j < WIDE_IN; j++)
            used += (size_t)snprintf(text + used, cap - used, "%s1", j ? "," : "");
        used += (size_t)snprintf(text + used, cap - used, "]");
    }
    snprintf(text + used, cap - used, "],\"weights\":\"wide\",\"return_attention\":false}");
    return text;
}

/* q, k and v of ANSWER_L x 1 with the attention matrix. */
static char *answer_heavy_text(void)
{
    size_t cap = 3 * ANSWER_L * 8 + 128, used = 0;
    char *text = client_xcalloc(cap, 1);
    static const char *const names[3] = {"q", "k", "v"};
    used += (size_t)snprintf(text, cap, "{");
    for (int m = 0; m < 3; m++) {
        used += (size_t)snprintf(text + used, cap - used, "%s\"%s\":[", m ? "," : "", names[m]);
        for (size_t i = 0; i < ANSWER_L; i++)
            used += (size_t)snprintf(text + used, cap - used, "%s[%zu]", i ? "," : "", i % 7);
        used += (size_t)snprintf(text + used, cap - used, "]");
    }
    snprintf(text + used, cap - used, ",\"return_attention\":true}");
    return text;
}

/* Runs the server binary with one setting of the inline threshold (a flag when flag is
 * set, else the environment variable) followed by --help, and returns its exit status:
 * 0 when the value is accepted, 2 when it is refused; -1 when it could not run. */
static int config_status(const char *value, int flag)
{
    char env_entry[128];
    snprintf(env_entry, sizeof env_entry, "ATTN_INLINE_MAX_BYTES=%s", value);
    char *envp[] = {flag ? NULL : env_entry, NULL};
    const char *argv_flag[] = {g_server_path, "--inline-max-bytes", value, "--help", NULL};
    const char *argv_env[] = {g_server_path, "--help", NULL};
    return run_quietly(flag ? argv_flag : argv_env, envp, 30);
}

static void bounds_tests(void)
{
    static const struct { const char *value; int flag; int want; } cases[] = {
        {"0", 1, 0},     {"4K", 1, 0},     {"64K", 1, 0},   {"65537", 1, 2},
        {"-1", 1, 2},    {"lots", 1, 2},   {"64K", 0, 0},   {"65537", 0, 2},
    };
    struct test t;
    if (!test_begin(&t, "inline/option-bounds"))
        return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = config_status(cases[i].value, cases[i].flag);
        expect_true(&t, got == cases[i].want, "%s %s: exit status %d, expected %d (0 accepted, 2 refused)",
                    cases[i].flag ? "--inline-max-bytes" : "ATTN_INLINE_MAX_BYTES=", cases[i].value, got,
                    cases[i].want);
    }
    test_end(&t);
}

/* inline/same-answers: small requests, valid and not, v1 and v2, answered alike by a
 * server that answers them on its I/O thread (on) and one that never does (off).  It runs
 * whenever these servers do: the counts of the later tests include its requests.  Returns
 * the number of small requests sent to each. */
static size_t same_answers(struct server *on, struct server *off, const char *seed)
{
    struct test t;
    struct client_response r, r2;

    /* Small requests, valid and not, v1 and v2, answered alike by both servers. */
    const char *v2_body =
        "{\"inputs\":[{\"name\":\"q\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,0,0,1]},"
        "{\"name\":\"k\",\"shape\":[3,2],\"datatype\":\"FP64\",\"data\":[1,0,0,1,1,1]},"
        "{\"name\":\"v\",\"shape\":[3,3],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5,6,7,8,9]}]}";
    const char *v2_ok =
        "{\"inputs\":[{\"name\":\"q\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,0,0,1]},"
        "{\"name\":\"k\",\"shape\":[3,2],\"datatype\":\"FP32\",\"data\":[1,0,0,1,1,1]},"
        "{\"name\":\"v\",\"shape\":[3,3],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5,6,7,8,9]}]}";
    const struct { const char *path; const char *body; const char *header; int status; } small_requests[] = {
        {"/v1/attention", g_tiny_request, NULL, 200},
        {"/v1/attention", seed != NULL ? seed : g_tiny_request, NULL, 200},
        {"/v1/attention",
         "{\"q\":[[1,0,0,1],[0,1,1,0],[1,1,0,0]],\"k\":[[1,0,0,1],[0,1,1,0],[1,1,0,0]],"
         "\"v\":[[1,2],[3,4],[5,6]],\"heads\":2,\"causal\":true,\"dtype\":\"float32\"}", NULL, 200},
        {"/v1/attention", "{\"x\":[[1,2],[3,4]],\"weights\":\"tiny\"}", NULL, 200},
        {"/v1/attention", "{\"x\":[[1,2],[3,4]],\"weights\":\"missing\"}", NULL, 404},
        {"/v1/attention", "{\"q\":", NULL, 400},
        {"/v1/attention", "{\"q\":[[1,0]],\"k\":[[1,0,0]],\"v\":[[1]]}", NULL, 400},
        {"/v1/attention", g_tiny_request, "X-Deadline-Ms: 60000", 200},
        {"/v2/models/attention/infer", v2_ok, NULL, 200},
        {"/v2/models/attention/infer", v2_body, NULL, 400},
        {"/v2/models/tiny/infer",
         "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]}]}", NULL, 200},
    };
    size_t n_small = sizeof small_requests / sizeof small_requests[0];
    test_begin(&t, "inline/same-answers");
    {
        json_decref(put_set_text(&t, on, "tiny", g_tiny_set, 201));
        json_decref(put_set_text(&t, off, "tiny", g_tiny_set, 201));
        for (size_t i = 0; i < n_small && !t.failed; i++) {
            const char *body = small_requests[i].body;
            post(on, small_requests[i].path, body, strlen(body), small_requests[i].header, &r);
            post(off, small_requests[i].path, body, strlen(body), small_requests[i].header, &r2);
            blank_compute_ms(&r);
            blank_compute_ms(&r2);
            const char *type = client_header(&r, "Content-Type"), *type2 = client_header(&r2, "Content-Type");
            expect_true(&t, r.status == small_requests[i].status && r2.status == r.status,
                        "request %zu to %s: status %d inline, %d through a worker; expected %d", i,
                        small_requests[i].path, r.status, r2.status, small_requests[i].status);
            expect_true(&t, type != NULL && type2 != NULL && !strcmp(type, type2),
                        "request %zu: Content-Type %s inline, %s through a worker", i, type ? type : "none",
                        type2 ? type2 : "none");
            if (!expect_true(&t, r.body_len == r2.body_len && !memcmp(r.body, r2.body, r.body_len),
                             "request %zu to %s: the answers differ", i, small_requests[i].path)) {
                char a[400], b[400];
                body_snippet(r.body, r.body_len, a, sizeof a);
                body_snippet(r2.body, r2.body_len, b, sizeof b);
                test_detail(&t, "    inline: %s\n    worker: %s", a, b);
            }
            client_response_free(&r);
            client_response_free(&r2);
        }
        test_end(&t);
    }
    return n_small;
}

/* inline/counted-inline: the dispatch counts of both servers after same_answers. */
static void counted_inline(struct server *on, struct server *off, size_t n_small)
{
    struct test t;

    /* Every small request above was answered by the I/O thread on one server and by a
     * worker on the other; the PUT of the set went to a worker on both. */
    if (test_begin(&t, "inline/counted-inline")) {
        expect_dispatch(&t, on, (long long)n_small, 1, 0);
        expect_dispatch(&t, off, 0, (long long)n_small + 1, 0);
        test_end(&t);
    }

}

/* inline/wide-set-deferred: runs whenever the servers do, as later counts include it. */
static void wide_set_deferred(struct server *on, size_t n_small)
{
    struct test t;
    struct client_response r;

    /* A small body naming a set whose projections are wide: computed by a worker, in v1
     * and in v2, with the right answer. */
    test_begin(&t, "inline/wide-set-deferred");
    {
        char *set_text = wide_set_text();
        json_decref(put_set_text(&t, on, "wide", set_text, 201));
        free(set_text);
        char *req = wide_request_text();
        expect_true(&t, strlen(req) <= 4096, "the wide request has %zu bytes, over the 4 KB default",
                    strlen(req));
        post(on, "/v1/attention", req, strlen(req), NULL, &r);
        if (expect_status(&t, &r, 200)) {
            json_t *body = response_json(&r);
            size_t dims[2] = {WIDE_TOKENS, WIDE_OUT};
            char path[256] = "output", why[512];
            expect_true(&t, json_has_shape(json_object_get(body, "output"), dims, 2, path, sizeof path, why,
                                           sizeof why), "%s", why);
            /* Every value of v is 64 (a row of 64 ones times a column of ones), and the
             * output averages them. */
            const json_t *first = json_array_get(json_array_get(json_object_get(body, "output"), 0), 0);
            expect_true(&t, fabs(json_number_value(first) - 64.0) < 1e-9, "output[0][0] is %.17g, not 64",
                        json_number_value(first));
            json_decref(body);
        }
        client_response_free(&r);
        free(req);
        char v2[WIDE_TOKENS * WIDE_IN * 3 + 256];
        size_t used = (size_t)snprintf(v2, sizeof v2, "{\"inputs\":[{\"name\":\"x\",\"shape\":[%d,%d],"
                                       "\"datatype\":\"FP64\",\"data\":[", WIDE_TOKENS, WIDE_IN);
        for (size_t i = 0; i < WIDE_TOKENS * WIDE_IN; i++)
            used += (size_t)snprintf(v2 + used, sizeof v2 - used, "%s1", i ? "," : "");
        snprintf(v2 + used, sizeof v2 - used, "]}],\"outputs\":[{\"name\":\"output\"}]}");
        post(on, "/v2/models/wide/infer", v2, strlen(v2), NULL, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        /* So far: the small requests inline, the two PUTs by a worker, these two deferred. */
        expect_dispatch(&t, on, (long long)n_small, 2, 2);
        test_end(&t);
    }

}

/* inline/answer-heavy-deferred. */
static void answer_heavy_deferred(struct server *on, struct server *off, size_t n_small)
{
    struct test t;
    struct client_response r, r2;

    /* Little arithmetic but 90,000 numbers to write: a worker's. */
    if (test_begin(&t, "inline/answer-heavy-deferred")) {
        char *req = answer_heavy_text();
        expect_true(&t, strlen(req) <= 4096, "the request has %zu bytes, over the 4 KB default", strlen(req));
        post(on, "/v1/attention", req, strlen(req), NULL, &r);
        post(off, "/v1/attention", req, strlen(req), NULL, &r2);
        if (expect_status(&t, &r, 200)) {
            blank_compute_ms(&r);
            blank_compute_ms(&r2);
            expect_true(&t, r.body_len == r2.body_len && !memcmp(r.body, r2.body, r.body_len),
                        "the answer differs from the one of the server with --inline-max-bytes 0");
        }
        client_response_free(&r);
        client_response_free(&r2);
        free(req);
        expect_dispatch(&t, on, (long long)n_small, 2, 3);
        test_end(&t);
    }

}

/* inline/threshold-from-env, on a server of its own (ATTN_INLINE_MAX_BYTES=200). */
static void threshold_from_env(void)
{
    if (!harness_selected("inline/threshold-from-env"))
        return;
    static const char *const small_env[] = {"ATTN_INLINE_MAX_BYTES=200", NULL};
    static const struct server_kind small_kind = {"inline-200", g_no_strings, small_env};
    struct server small;
    memset(&small, 0, sizeof small);
    small.kind = &small_kind;
    if (server_start(&small) != 0)
        return;
    struct test t;
    struct client_response r;

    /* ATTN_INLINE_MAX_BYTES=200: a 57-byte body is answered inline, the same padded to 300
     * bytes is not even tried there. */
    if (test_begin(&t, "inline/threshold-from-env")) {
        char padded[301];
        memset(padded, ' ', 300);
        padded[300] = '\0';
        memcpy(padded, g_tiny_request, strlen(g_tiny_request));
        post(&small, "/v1/attention", g_tiny_request, strlen(g_tiny_request), NULL, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        expect_dispatch(&t, &small, 1, 0, 0);
        post(&small, "/v1/attention", padded, 300, NULL, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        expect_dispatch(&t, &small, 1, 1, 0);
        test_end(&t);
    }
    server_stop(&small);
}

void run_inline_tests(const struct itest_paths *paths)
{
    bounds_tests();
    threshold_from_env();
    static const char *const names[] = {"inline/same-answers", "inline/counted-inline",
                                        "inline/wide-set-deferred", "inline/answer-heavy-deferred",
                                        NULL};
    if (!any_selected(names))
        return;
    static const char *const off_args[] = {"--inline-max-bytes", "0", NULL};
    static const struct server_kind on_kind = {"inline-on", g_no_strings, g_no_strings};
    static const struct server_kind off_kind = {"inline-off", off_args, g_no_strings};
    struct server on, off;
    memset(&on, 0, sizeof on);
    memset(&off, 0, sizeof off);
    on.kind = &on_kind;
    off.kind = &off_kind;
    int up = server_start(&on) == 0;
    up &= server_start(&off) == 0;
    if (!up) {
        if (on.running) server_stop(&on);
        if (off.running) server_stop(&off);
        return;
    }
    char *seed = seed_request(paths->fixtures);
    size_t n_small = same_answers(&on, &off, seed);
    counted_inline(&on, &off, n_small);
    wide_set_deferred(&on, n_small);
    answer_heavy_deferred(&on, &off, n_small);
    free(seed);
    server_stop(&on);
    server_stop(&off);
}

/*
 * sharetest.c - several servers on one shared weight-set directory.
 *
 * Starts three attention servers (A, B, C) on one data directory with a short
 * --store-sync-interval, as replicas behind a balancer share one volume, and
 * checks what the shared store promises:
 *
 *   visible       a PUT on A is usable by name on B and C within the interval plus
 *                 a margin; GET answers the same bytes on all three; lists agree
 *   delete        a DELETE on B makes all three answer 404
 *   read-your-writes  attention on B naming the generation a PUT on A answered
 *                 never computes with the old set (If-Match on GET likewise)
 *   concurrent    A and B PUT versions of the same names for --writer-seconds
 *                 while readers on C check that every answer is one whole version;
 *                 at the end all three hold identical sets
 *   crash         writers on A and B are killed with SIGKILL at random moments and
 *                 restarted: every acknowledged set is present and identical
 *                 everywhere, no torn set is served, nothing is quarantined, and
 *                 a restart removes only temporary files of a dead process
 *   volume-lost   the directory is swapped away: /readyz answers 503 after three
 *                 intervals, /metrics counts sync errors, and both recover when
 *                 the directory is back
 *
 * Output: "ok NAME" or "FAIL NAME" (with indented details) per test, then
 * "N passed, N failed".  Every wait is bounded.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "integration/itest.h"

#define REPLICAS 3
#define INTERVAL_MS 200
#define MARGIN_MS 1500
#define NAMES 3

static char g_data_dir[300];

/* One of the servers on the shared directory; the harness's server with a letter. */
struct replica {
    char label;
    struct server srv;
    struct server_kind kind;
    char name[2];
};
static struct replica g_rep[REPLICAS];

/* ---- results ------------------------------------------------------------- */

static char g_detail[8192];
static size_t g_detail_len;
static pthread_mutex_t g_detail_lock = PTHREAD_MUTEX_INITIALIZER;

static void detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void detail(const char *fmt, ...)
{
    pthread_mutex_lock(&g_detail_lock);
    if (g_detail_len + 200 < sizeof g_detail) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(g_detail + g_detail_len, sizeof g_detail - g_detail_len, fmt, ap);
        va_end(ap);
        if (n > 0)
            g_detail_len += (size_t)n < sizeof g_detail - g_detail_len ? (size_t)n : 0;
        if (g_detail_len + 1 < sizeof g_detail)
            g_detail[g_detail_len++] = '\n';
        g_detail[g_detail_len] = '\0';
    }
    pthread_mutex_unlock(&g_detail_lock);
}

/* Reports the test name with the detail() lines gathered since the last report. */
static void report(const char *name, int ok)
{
    struct test t;
    test_begin(&t, "%s", name);
    expect_true(&t, ok, "see the lines below");
    char *line = strtok(g_detail, "\n");
    for (int n = 0; line != NULL && n < 30; n++, line = strtok(NULL, "\n"))
        test_detail(&t, "    %s", line);
    test_end(&t);
    g_detail_len = 0;
    g_detail[0] = '\0';
}

/* ---- servers ------------------------------------------------------------- */

/* Starts replica r on the shared directory (itest_server.c reports
 * "server/LETTER/start"); after a kill, the same stderr file goes on. */
static int replica_start(struct replica *r)
{
    static char interval[16];
    snprintf(interval, sizeof interval, "%d", INTERVAL_MS);
    static const char *args[] = {"--quiet", "--store-sync-interval", interval, NULL};
    r->name[0] = r->label;
    r->kind = (struct server_kind){r->name, args, g_no_strings};
    r->srv.kind = &r->kind;
    snprintf(r->srv.data_dir, sizeof r->srv.data_dir, "%s", g_data_dir);
    if (server_start(&r->srv) != 0) {
        detail("replica %c did not start: %s (see %s)", r->label, r->srv.start_error, r->srv.stderr_path);
        return -1;
    }
    r->srv.append_stderr = 1;
    return 0;
}

/* Kills replica r with SIGKILL, as a crash would. */
static void replica_kill(struct replica *r)
{
    if (r->srv.running) {
        client_kill_and_reap(r->srv.pid, NULL);
        close(r->srv.stdout_fd);
        r->srv.stdout_fd = -1;
        r->srv.running = 0;
    }
}

/* ---- HTTP ---------------------------------------------------------------- */

/* One request to replica r; work is a directory of the calling thread. */
static void call(const struct replica *r, const char *work, const char *method, const char *path,
                 const char *body, const char *header, struct client_response *out)
{
    struct client_request rq;
    memset(&rq, 0, sizeof rq);
    rq.method = method;
    rq.path = path;
    rq.body = body;
    rq.body_len = body ? strlen(body) : 0;
    rq.headers[0] = header;
    memset(out, 0, sizeof *out);
    client_http_call(r->srv.base_url, work, &rq, out);
}

/* The body of a set whose wq, wk and wv (2 x 2) all hold value. */
static void set_body(char *out, size_t len, long value)
{
    snprintf(out, len,
             "{\"wq\": [[%ld, %ld], [%ld, %ld]], \"wk\": [[%ld, %ld], [%ld, %ld]], "
             "\"wv\": [[%ld, %ld], [%ld, %ld]]}",
             value, value, value, value, value, value, value, value, value, value, value, value);
}

/* PUTs name = value on r.  Returns the generation the answer gives, 0 when the
 * PUT failed (status in *status). */
static long long put_shared_set(const struct replica *r, const char *work, const char *name, long value,
                         int *status)
{
    char body[512], path[128];
    set_body(body, sizeof body, value);
    snprintf(path, sizeof path, "/v1/weight-sets/%s", name);
    struct client_response resp;
    call(r, work, "PUT", path, body, NULL, &resp);
    long long gen = 0;
    *status = resp.status;
    if (resp.status == 200 || resp.status == 201) {
        json_t *j = json_loads(resp.body, 0, NULL);
        json_t *g = json_object_get(j, "generation");
        gen = json_is_integer(g) ? (long long)json_integer_value(g) : 0;
        const char *etag = client_header(&resp, "ETag");
        char want[40];
        snprintf(want, sizeof want, "\"%lld\"", gen);
        if (etag == NULL || strcmp(etag, want) != 0) {
            detail("PUT %s on %c: ETag %s, generation field %lld", name, r->label,
                   etag ? etag : "(none)", gen);
            gen = 0;
        }
        json_decref(j);
    }
    client_response_free(&resp);
    return gen;
}

/* Checks that a GET answer holds one whole version: every number of wq, wk
 * and wv is the same.  Returns that value, or -1 (with a detail) if not. */
static long whole_version(const char *body, const char *where)
{
    json_t *j = json_loads(body, 0, NULL);
    double first = NAN;
    int ok = j != NULL;
    static const char *const parts[] = {"wq", "wk", "wv"};
    for (int p = 0; ok && p < 3; p++) {
        json_t *m = json_object_get(j, parts[p]);
        ok = json_array_size(m) == 2;
        for (size_t i = 0; ok && i < 2; i++) {
            json_t *row = json_array_get(m, i);
            ok = json_array_size(row) == 2;
            for (size_t k = 0; ok && k < 2; k++) {
                double v = json_number_value(json_array_get(row, k));
                if (isnan(first))
                    first = v;
                ok = v == first;
            }
        }
    }
    json_decref(j);
    if (!ok) {
        detail("%s: not one whole version: %.300s", where, body);
        return -1;
    }
    return (long)first;
}

/* Attention with x = [[1, 1]] on the named set: the output is [2v, 2v] for
 * the set of value v.  Returns v, -1 on a torn answer (detail), or -2 when
 * the answer is not 200 (*status says which). */
static long attention_value(const struct replica *r, const char *work, const char *name,
                            long long generation, int *status)
{
    char body[256];
    if (generation > 0)
        snprintf(body, sizeof body, "{\"x\": [[1, 1]], \"weights\": \"%s\", "
                 "\"weights_generation\": %lld, \"return_attention\": false}", name, generation);
    else
        snprintf(body, sizeof body, "{\"x\": [[1, 1]], \"weights\": \"%s\", "
                 "\"return_attention\": false}", name);
    struct client_response resp;
    call(r, work, "POST", "/v1/attention", body, NULL, &resp);
    *status = resp.status;
    long v = -2;
    if (resp.status == 200) {
        json_t *j = json_loads(resp.body, 0, NULL);
        json_t *out = json_array_get(json_object_get(j, "output"), 0);
        double a = json_number_value(json_array_get(out, 0));
        double b = json_number_value(json_array_get(out, 1));
        if (json_array_size(out) != 2 || a != b || a != floor(a) || ((long)a) % 2 != 0) {
            detail("attention on %c naming %s: not one whole version: %.300s", r->label, name,
                   resp.body);
            v = -1;
        } else {
            v = (long)a / 2;
        }
        json_decref(j);
    }
    client_response_free(&resp);
    return v;
}

/* The status and body of GET path on r (body NULL unless 200; caller frees). */
static int get(const struct replica *r, const char *work, const char *path, const char *header,
               char **body)
{
    struct client_response resp;
    call(r, work, "GET", path, NULL, header, &resp);
    int status = resp.status;
    *body = status == 200 ? strdup(resp.body) : NULL;
    client_response_free(&resp);
    return status;
}

/* Waits (at most ms) until every replica answers GET path with status.
 * Returns the milliseconds it took, or -1. */
static long wait_all_status(const char *work, const char *path, int status, long ms)
{
    double start = client_now_seconds();
    while ((client_now_seconds() - start) * 1000 < ms) {
        int all = 1;
        for (int i = 0; i < REPLICAS && all; i++) {
            char *body;
            all = get(&g_rep[i], work, path, NULL, &body) == status;
            free(body);
        }
        if (all)
            return (long)((client_now_seconds() - start) * 1000);
        client_sleep_ms(20);
    }
    return -1;
}

/* Waits (at most ms) until every replica answers GET path with the same
 * 200 body.  Returns 1 if so; otherwise 0 with the differences in details. */
static int wait_identical(const char *work, const char *path, long ms)
{
    double start = client_now_seconds();
    char *bodies[REPLICAS] = {NULL};
    int same = 0;
    while (!same && (client_now_seconds() - start) * 1000 < ms) {
        same = 1;
        for (int i = 0; i < REPLICAS; i++) {
            free(bodies[i]);
            get(&g_rep[i], work, path, NULL, &bodies[i]);
            same = same && bodies[i] != NULL && (i == 0 || !strcmp(bodies[i], bodies[0]));
        }
        if (!same)
            client_sleep_ms(50);
    }
    if (!same)
        for (int i = 0; i < REPLICAS; i++)
            detail("%c answers GET %s: %.200s", g_rep[i].label, path,
                   bodies[i] ? bodies[i] : "(not 200)");
    for (int i = 0; i < REPLICAS; i++)
        free(bodies[i]);
    return same;
}

/* ---- the tests ----------------------------------------------------------- */

static void test_visible(const char *work)
{
    int status, ok = 1;
    long long gen = put_shared_set(&g_rep[0], work, "shared", 3, &status);
    if (gen <= 0) {
        detail("PUT on A answered %d", status);
        report("visible", 0);
        return;
    }
    long took = wait_all_status(work, "/v1/weight-sets/shared", 200, INTERVAL_MS + MARGIN_MS);
    if (took < 0) {
        detail("B and C do not have the set %d ms after the PUT on A", INTERVAL_MS + MARGIN_MS);
        ok = 0;
    }
    for (int i = 1; i < REPLICAS && ok; i++) {
        long v = attention_value(&g_rep[i], work, "shared", 0, &status);
        if (v != 3) {
            detail("attention naming the set on %c: status %d, value %ld", g_rep[i].label, status, v);
            ok = 0;
        }
    }
    ok = ok && wait_identical(work, "/v1/weight-sets/shared", MARGIN_MS);
    ok = ok && wait_identical(work, "/v1/weight-sets", MARGIN_MS);
    /* GET carries the ETag of the generation the PUT answered. */
    struct client_response resp;
    call(&g_rep[2], work, "GET", "/v1/weight-sets/shared", NULL, NULL, &resp);
    char want[40];
    snprintf(want, sizeof want, "\"%lld\"", gen);
    const char *etag = client_header(&resp, "ETag");
    if (etag == NULL || strcmp(etag, want) != 0) {
        detail("GET on C: ETag %s, expected %s", etag ? etag : "(none)", want);
        ok = 0;
    }
    client_response_free(&resp);
    report("visible", ok);
}

static void test_delete(const char *work)
{
    struct client_response resp;
    call(&g_rep[1], work, "DELETE", "/v1/weight-sets/shared", NULL, NULL, &resp);
    int ok = resp.status == 204;
    if (!ok)
        detail("DELETE on B answered %d", resp.status);
    client_response_free(&resp);
    if (ok && wait_all_status(work, "/v1/weight-sets/shared", 404, INTERVAL_MS + MARGIN_MS) < 0) {
        detail("not every replica answers 404 %d ms after the DELETE", INTERVAL_MS + MARGIN_MS);
        ok = 0;
    }
    ok = ok && wait_identical(work, "/v1/weight-sets", MARGIN_MS);
    report("delete", ok);
}

static void test_read_your_writes(const char *work)
{
    int ok = 1, status, retried = 0;
    for (long round = 1; round <= 15 && ok; round++) {
        long long gen = put_shared_set(&g_rep[0], work, "ryw", 100 + round, &status);
        if (gen <= 0) {
            detail("round %ld: PUT on A answered %d", round, status);
            ok = 0;
            break;
        }
        /* At once on B, naming the generation: the new set or a 503, never
         * the old one. */
        long v = -2;
        for (int tries = 0; tries < 20; tries++) {
            v = attention_value(&g_rep[1], work, "ryw", gen, &status);
            if (status != 503)
                break;
            retried++;
            client_sleep_ms(50);
        }
        if (v != 100 + round) {
            detail("round %ld: attention on B naming generation %lld: status %d, value %ld "
                   "(expected %ld)", round, gen, status, v, 100 + round);
            ok = 0;
        }
        char header[64], *body = NULL;
        snprintf(header, sizeof header, "If-Match: \"%lld\"", gen);
        int st = get(&g_rep[2], work, "/v1/weight-sets/ryw", header, &body);
        if (st != 200 || whole_version(body, "GET on C with If-Match") != 100 + round) {
            detail("round %ld: GET on C with %s: status %d", round, header, st);
            ok = 0;
        }
        free(body);
        /* A generation that was replaced is a failed precondition. */
        if (round > 1) {
            snprintf(header, sizeof header, "If-Match: \"%lld\"", gen - 1);
            st = get(&g_rep[2], work, "/v1/weight-sets/ryw", header, &body);
            free(body);
            if (st != 412) {
                detail("round %ld: GET on C with an older generation answered %d, not 412", round, st);
                ok = 0;
            }
        }
    }
    if (retried)
        printf("# read-your-writes: %d answer(s) were 503 before the replica caught up\n", retried);
    report("read-your-writes", ok);
}

/* ---- concurrent writers -------------------------------------------------- */

struct writer {
    int replica;
    const char *prefix;     /* names prefix0 .. prefix2 */
    long base;              /* values written: base, base + 2, ... (A odd, B even) */
    double until;
    long puts, failures;
    long last[NAMES];       /* the last acknowledged value per name */
    long long last_gen[NAMES];
    char work[300];
};

struct reader {
    int replica;
    double until;
    long checks, torn, errors;
    char work[300];
};

static volatile int g_stop_writers;

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    long value = w->base;
    while (!g_stop_writers && client_now_seconds() < w->until) {
        for (int n = 0; n < NAMES && !g_stop_writers; n++) {
            char name[16];
            snprintf(name, sizeof name, "%s%d", w->prefix, n);
            int status;
            long long gen = put_shared_set(&g_rep[w->replica], w->work, name, value, &status);
            w->puts++;
            if (gen > 0) {
                w->last[n] = value;
                w->last_gen[n] = gen;
            } else {
                w->failures++;
            }
            value += 2;
        }
    }
    return NULL;
}

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    for (long i = 0; client_now_seconds() < rd->until; i++) {
        char name[16], path[64];
        snprintf(name, sizeof name, "%s%ld", i % 4 < 2 ? "cw" : (i % 4 == 2 ? "crA" : "crB"),
                 (i / 4) % NAMES);
        int status;
        if (i % 2 == 0) {
            long v = attention_value(&g_rep[rd->replica], rd->work, name, 0, &status);
            if (v == -1)
                rd->torn++;
            else if (v < 0 && status != 404)
                rd->errors++;
        } else {
            char *body = NULL;
            snprintf(path, sizeof path, "/v1/weight-sets/%s", name);
            status = get(&g_rep[rd->replica], rd->work, path, NULL, &body);
            if (status == 200 && whole_version(body, "GET during the writes") < 0)
                rd->torn++;
            else if (status != 200 && status != 404)
                rd->errors++;
            free(body);
        }
        rd->checks++;
    }
    return NULL;
}

static void make_work(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "%s/work-%s", g_tmpdir, tag);
    mkdir(out, 0700);
}

static void test_concurrent(const char *work, double seconds)
{
    struct writer w[2];
    struct reader rd[2];
    pthread_t wt[2], rt[2];
    double until = client_now_seconds() + seconds;
    g_stop_writers = 0;
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].replica = i;
        w[i].prefix = "cw";
        w[i].base = 1001 + i;   /* A writes odd values, B even ones */
        w[i].until = until;
        make_work(w[i].work, sizeof w[i].work, i ? "wb" : "wa");
        memset(&rd[i], 0, sizeof rd[i]);
        rd[i].replica = 2;
        rd[i].until = until;
        make_work(rd[i].work, sizeof rd[i].work, i ? "r1" : "r0");
    }
    for (int i = 0; i < 2; i++) {
        pthread_create(&wt[i], NULL, writer_main, &w[i]);
        pthread_create(&rt[i], NULL, reader_main, &rd[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(wt[i], NULL);
        pthread_join(rt[i], NULL);
    }
    int ok = 1;
    long checks = rd[0].checks + rd[1].checks, torn = rd[0].torn + rd[1].torn;
    long errors = rd[0].errors + rd[1].errors;
    printf("# concurrent: %ld + %ld PUTs, %ld checks on C\n", w[0].puts, w[1].puts, checks);
    if (torn || errors || w[0].failures || w[1].failures || checks < 20) {
        detail("%ld torn answers, %ld errors, %ld and %ld failed PUTs, %ld checks", torn, errors,
               w[0].failures, w[1].failures, checks);
        ok = 0;
    }
    /* The end: all three hold the same bytes, one of the two last writes. */
    for (int n = 0; n < NAMES && ok; n++) {
        char path[64], *body = NULL;
        snprintf(path, sizeof path, "/v1/weight-sets/cw%d", n);
        ok = wait_identical(work, path, INTERVAL_MS + MARGIN_MS);
        if (ok && get(&g_rep[0], work, path, NULL, &body) == 200) {
            long v = whole_version(body, "GET at the end");
            if (v != w[0].last[n] && v != w[1].last[n]) {
                detail("cw%d holds %ld; the last acknowledged writes were %ld (A) and %ld (B)", n,
                       v, w[0].last[n], w[1].last[n]);
                ok = 0;
            }
        }
        free(body);
    }
    ok = ok && wait_identical(work, "/v1/weight-sets", MARGIN_MS);
    report("concurrent-writers", ok);
}

/* ---- crashes ------------------------------------------------------------- */

/* Checks the "store: removed" lines of a replica's log: each removed temporary
 * file must be one of a process that was dead (one of killed[]).  Returns 1 if so. */
static int removals_only_of_dead(const struct replica *r, const pid_t *killed, size_t n_killed)
{
    size_t len;
    char *log = client_read_file(r->srv.stderr_path, &len);
    if (log == NULL)
        return 1;
    int ok = 1;
    for (char *p = strstr(log, "store: removed "); p != NULL; p = strstr(p + 1, "store: removed ")) {
        char *tmp = strstr(p, "/.tmp.");
        char *eol = strchr(p, '\n');
        if (tmp == NULL || (eol != NULL && tmp > eol))
            continue;
        char *dot = strchr(tmp + 6, '.');
        long pid = dot ? strtol(dot + 1, NULL, 10) : -1;
        int dead = 0;
        for (size_t i = 0; i < n_killed; i++)
            dead = dead || killed[i] == (pid_t)pid;
        if (!dead) {
            detail("replica %c removed %.*s, of pid %ld that it did not know dead", r->label,
                   (int)(eol ? eol - p : 80), p, pid);
            ok = 0;
        }
    }
    free(log);
    return ok;
}

/* Each writer has names of its own here, so that its acknowledged writes of a name are
 * ordered: the newest must survive.  What was acknowledged, per writer and name. */
struct acked_writes {
    long version[2][NAMES];
    long long gen[2][NAMES];
};

/* One round: two writers and a reader for 1.5 s, one or both writers' servers killed at a
 * random moment mid-writes and started again.  Returns 0 when a server did not restart. */
static int crash_round(int round, uint64_t *seed, struct reader *rd, struct acked_writes *acked, pid_t *killed,
                       size_t *n_killed)
{
    int ok = 1;
    struct writer w[2];
    pthread_t wt[2], rt;
    double until = client_now_seconds() + 1.5;
    g_stop_writers = 0;
    rd->until = until;
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].replica = i;
        w[i].prefix = i ? "crB" : "crA";
        w[i].base = 100001 + 100000L * round;
        w[i].until = until;
        make_work(w[i].work, sizeof w[i].work, i ? "crash-b" : "crash-a");
        pthread_create(&wt[i], NULL, writer_main, &w[i]);
    }
    pthread_create(&rt, NULL, reader_main, rd);
    /* Kill one or both writers' servers at a random moment mid-writes. */
    client_sleep_ms(150 + (long)(client_rng_next(seed) % 900));
    int which = (int)(client_rng_next(seed) % 3); /* 0: A, 1: B, 2: both */
    for (int i = 0; i < 2; i++)
        if ((which == 2 || which == i) && *n_killed < 64) {
            killed[(*n_killed)++] = g_rep[i].srv.pid;
            kill(g_rep[i].srv.pid, SIGKILL);
        }
    g_stop_writers = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(wt[i], NULL);
    pthread_join(rt, NULL);
    for (int i = 0; i < 2; i++) {
        if (which != 2 && which != i)
            continue;
        replica_kill(&g_rep[i]);
        if (replica_start(&g_rep[i]) != 0)
            ok = 0;
    }
    for (int n = 0; n < NAMES; n++)
        for (int i = 0; i < 2; i++)
            if (w[i].last_gen[n] > 0) {
                acked->gen[i][n] = w[i].last_gen[n];
                acked->version[i][n] = w[i].last[n];
            }
    return ok;
}

/* Every acknowledged set is there, identical everywhere, and at least as new as the
 * newest acknowledged write of its name.  Returns 1 when so. */
static int crash_acknowledged_survive(const char *work, const struct acked_writes *acked)
{
    int ok = 1;
    long present = 0;
    for (int k = 0; k < 2 * NAMES && ok; k++) {
        int i = k / NAMES, n = k % NAMES;
        if (acked->gen[i][n] == 0)
            continue;
        char path[64], *body = NULL;
        snprintf(path, sizeof path, "/v1/weight-sets/cr%c%d", i ? 'B' : 'A', n);
        ok = wait_identical(work, path, INTERVAL_MS + MARGIN_MS);
        if (ok && get(&g_rep[0], work, path, NULL, &body) == 200) {
            json_t *j = json_loads(body, 0, NULL);
            long long gen = json_integer_value(json_object_get(j, "generation"));
            json_decref(j);
            long v = whole_version(body, "after the crashes");
            /* An unacknowledged later write may have landed before the kill. */
            if (v < acked->version[i][n] || gen < acked->gen[i][n]) {
                detail("%s holds %ld at generation %lld, older than the acknowledged %ld at %lld",
                       path, v, gen, acked->version[i][n], acked->gen[i][n]);
                ok = 0;
            }
            present++;
        }
        free(body);
    }
    if (present == 0) {
        detail("no write was acknowledged at all");
        ok = 0;
    }
    return ok;
}

static void test_crash(const char *work, uint64_t seed)
{
    int ok = 1;
    pid_t killed[64];
    size_t n_killed = 0;
    struct reader rd;
    memset(&rd, 0, sizeof rd);
    rd.replica = 2;
    make_work(rd.work, sizeof rd.work, "crash-r");
    struct acked_writes acked;
    memset(&acked, 0, sizeof acked);
    for (int round = 0; round < 6 && ok; round++)
        ok = crash_round(round, &seed, &rd, &acked, killed, &n_killed);
    if (rd.torn) {
        detail("%ld torn answers on C", rd.torn);
        ok = 0;
    }
    ok = ok && crash_acknowledged_survive(work, &acked);
    char qdir[400];
    snprintf(qdir, sizeof qdir, "%s/quarantine", g_data_dir);
    struct stat st;
    if (stat(qdir, &st) == 0) {
        detail("%s exists: a torn or damaged file was found", qdir);
        ok = 0;
    }
    for (int i = 0; i < REPLICAS; i++)
        ok = removals_only_of_dead(&g_rep[i], killed, n_killed) && ok;
    report("crash", ok);
}

/* ---- the volume going away ----------------------------------------------- */

static int readyz(const char *work)
{
    char *body;
    int st = get(&g_rep[0], work, "/readyz", NULL, &body);
    free(body);
    return st;
}

static void test_volume_lost(const char *work)
{
    int ok = 1;
    char away[400];
    snprintf(away, sizeof away, "%s.away", g_data_dir);
    if (readyz(work) != 200) {
        detail("/readyz is not 200 before the volume goes");
        ok = 0;
    }
    if (rename(g_data_dir, away) != 0) {
        detail("rename %s: %s", g_data_dir, strerror(errno));
        report("volume-lost", 0);
        return;
    }
    double gone = client_now_seconds();
    long ms = -1;
    while ((client_now_seconds() - gone) * 1000 < 3 * INTERVAL_MS + MARGIN_MS + 1000) {
        if (readyz(work) == 503) {
            ms = (long)((client_now_seconds() - gone) * 1000);
            break;
        }
        client_sleep_ms(20);
    }
    if (ms < 0) {
        detail("/readyz still answers 200 %d ms after the directory went away",
               3 * INTERVAL_MS + MARGIN_MS + 1000);
        ok = 0;
    } else if (ms < 2 * INTERVAL_MS - 100) {
        /* The last good scan was at most one interval (and a scan) before the
         * directory went: 503 comes between two and three intervals after. */
        detail("/readyz went 503 after %ld ms, too soon for three intervals since the last "
               "good scan (%d ms each)", ms, INTERVAL_MS);
        ok = 0;
    }
    char *metrics = NULL;
    get(&g_rep[0], work, "/metrics", NULL, &metrics);
    if (metrics == NULL || strstr(metrics, "attn_store_sync_errors_total ") == NULL ||
        strstr(metrics, "attn_store_sync_errors_total 0\n") != NULL ||
        strstr(metrics, "attn_store_last_sync_age_seconds ") == NULL) {
        detail("/metrics does not count the failed syncs");
        ok = 0;
    }
    free(metrics);
    /* Sets already loaded are still served meanwhile. */
    int status;
    if (attention_value(&g_rep[0], work, "cw0", 0, &status) < 0) {
        detail("attention naming cw0 while the volume is away: %d", status);
        ok = 0;
    }
    if (rename(away, g_data_dir) != 0) {
        detail("rename back: %s", strerror(errno));
        ok = 0;
    }
    double back = client_now_seconds();
    ms = -1;
    while ((client_now_seconds() - back) * 1000 < 2 * INTERVAL_MS + MARGIN_MS) {
        if (readyz(work) == 200) {
            ms = (long)((client_now_seconds() - back) * 1000);
            break;
        }
        client_sleep_ms(20);
    }
    if (ms < 0) {
        detail("/readyz does not recover after the directory is back");
        ok = 0;
    }
    report("volume-lost", ok);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s --server PATH [--writer-seconds N] [--seed N] [--keep] [--filter SUBSTR]\n"
            "  the tests: visible, delete, read-your-writes, concurrent-writers, crash, volume-lost;\n"
            "  --filter runs only those whose name contains SUBSTR\n",
            argv0);
    exit(2);
}

int main(int argc, char **argv)
{
    double writer_seconds = 30;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    int keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server") && i + 1 < argc)
            g_server_path = argv[++i];
        else if (!strcmp(argv[i], "--writer-seconds") && i + 1 < argc)
            writer_seconds = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            harness_add_filter(argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else
            usage(argv[0]);
    }
    if (g_server_path == NULL || !(writer_seconds > 0 && writer_seconds <= 600))
        usage(argv[0]);
    if (access(g_server_path, X_OK) != 0) {
        fprintf(stderr, "sharetest: %s is not executable\n", g_server_path);
        return 2;
    }
    if (harness_start("sharetest", NULL) != 0)
        return 2;
    snprintf(g_data_dir, sizeof g_data_dir, "%s/data", g_tmpdir);
    mkdir(g_data_dir, 0755);
    printf("# seed %llu, server %s, directory %s, sync every %d ms\n", (unsigned long long)seed,
           g_server_path, g_tmpdir, INTERVAL_MS);
    /* The servers start only when --filter selects a test. */
    static const char *const names[] = {"three-servers-start", "visible", "delete", "read-your-writes",
                                        "concurrent-writers", "crash", "volume-lost", NULL};
    if (!any_selected(names))
        return harness_finish(keep);
    int started = 1;
    for (int i = 0; i < REPLICAS; i++) {
        g_rep[i].label = (char)('A' + i);
        started = started && replica_start(&g_rep[i]) == 0;
    }
    report("three-servers-start", started);
    if (started) {
        char work[300];
        make_work(work, sizeof work, "main");
        /* Each test is one group of steps: one that --filter leaves out is not run. */
        if (harness_selected("visible"))
            test_visible(work);
        if (harness_selected("delete"))
            test_delete(work);
        if (harness_selected("read-your-writes"))
            test_read_your_writes(work);
        if (harness_selected("concurrent-writers"))
            test_concurrent(work, writer_seconds);
        if (harness_selected("crash"))
            test_crash(work, seed);
        if (harness_selected("volume-lost"))
            test_volume_lost(work);
    }
    for (int i = 0; i < REPLICAS; i++)
        if (g_rep[i].srv.running)
            server_stop(&g_rep[i].srv);
    return harness_finish(keep);
}

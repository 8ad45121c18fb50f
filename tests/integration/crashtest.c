/*
 * crashtest.c - stored weight sets survive kill -9 at any moment.
 *
 * The contract says: "Stored sets live in a data directory and survive a restart and a
 * crash (kill -9 at any moment): a set is either wholly there or not at all, never
 * half-written."  This program holds the server to it.  In a fresh temporary data
 * directory it starts the real server (--port 0 --quiet --data-dir DIR), and while a
 * client loop PUTs hundreds of distinct weight sets (and replaces some of them), a killer
 * thread sends SIGKILL to the server every 20-300 ms (during a start only when the start
 * before it got as far as its banner, so that a start slower than the killer's interval,
 * as on a loaded machine, still comes through).  Whenever the server is dead the
 * client starts a new one on the same directory and either retries the PUT it had under
 * way or moves on.  Every PUT answered 200 or 201 is recorded with its exact content (a
 * seed from which the body is made again, byte for byte).
 *
 * Checked along the way: every restart leaves no ".tmp.*" file and no quarantine/
 * entry (a torn file would be quarantined); the server never dies without our kill;
 * a live server never drops a request; a replacement of an acknowledged set is never
 * answered 201 (which would mean the set was lost).  Checked at the end, after one last
 * clean restart: GET /v1/weight-sets lists every acknowledged set (and nothing that was
 * never sent); GET of each set returns every number bit for bit as parsed by jansson
 * from the JSON text that was sent (the acknowledged version, or a later one whose
 * answer the kill swallowed); attention with "weights": NAME matches the naive reference
 * for a few sets; the server exits 0 on SIGTERM and its stderr has no sanitizer report.
 *
 * HTTP goes through the curl command-line tool (fork/exec, no shell), and only to
 * 127.0.0.1; spawning the server, reading its banner and the curl client are client.c's.
 * The counting, the report of each check, --filter and the temporary directory are the
 * integration harness's (itest.h).  The server's start and stop stay here, not in
 * itest_server.c, because they are this test's subject: a killer thread SIGKILLs the
 * server at any moment, also during its start, under a lock shared with the start.
 *
 * Output: "ok NAME" or "FAIL NAME: why" per check, "# ..." lines of statistics, then
 * "N passed, N failed".  Exit status 0 when nothing failed, 1 otherwise, 2 on usage.
 *
 * Build: make build/crashtest
 * Run:   build/crashtest --server build/attention-server [--puts 500] [--seed N] [--filter SUBSTR]
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "itest.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Seconds to wait for the "listening on" line, and for the exit after SIGTERM. */
#define CRASH_STARTUP_TIMEOUT_S 20.0
#define CRASH_SHUTDOWN_TIMEOUT_S 20.0
/* The PUT phase stops here whatever happened, so that a hung server cannot hold the run.
 * It is a bound, not a speed test: at a load of 18 on 2 cores only 305 of the 500 sets
 * were sent in 90 s (the bound before), and puts/all-sent failed for it. */
#define PUT_PHASE_LIMIT_S 300.0
/* Bounds on the loops: restarts in all, and failed starts in a row (the killer spoils at
 * most one start in a row, so a third failure is the server's). */
#define MAX_RESTARTS 5000
#define MAX_FAILED_STARTS_IN_A_ROW 3
/* Attempts of one version of a set before the client gives up on it. */
#define MAX_ATTEMPTS 4
/* Versions of one name (its first PUT and its replacements, retries not counted). */
#define MAX_VERSIONS 16
/* Sets checked with an attention request at the end. */
#define ATTENTION_CHECKS 6

/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                        */
/* ------------------------------------------------------------------------------------ */

/* Uniform in [lo, hi]. */
static size_t rng_range(uint64_t *state, size_t lo, size_t hi)
{
    return lo + (size_t)(client_rng_next(state) % (hi - lo + 1));
}

/* Uniform in (-1, 1). */
static double rng_unit(uint64_t *state)
{
    return ((double)(client_rng_next(state) >> 11) / 9007199254740992.0) * 2.0 - 1.0;
}

/* A growing text buffer. */
typedef struct text {
    char *p;
    size_t len, cap;
} text;

static void text_add(text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (t->len + n + 1 > cap)
            cap *= 2;
        t->p = client_xrealloc(t->p, cap);
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

static void text_str(text *t, const char *s)
{
    text_add(t, s, strlen(s));
}

/* Entries of dir whose names start with prefix; -1 when dir does not exist. */
static long count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            !strncmp(e->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------------------------ */
/* Weight sets made from a seed                                                         */
/* ------------------------------------------------------------------------------------ */

static const char *const g_array_names[8] = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"};

/* What a seed makes: the shapes (in_out terms), which arrays, heads, layout. */
typedef struct set_meta {
    size_t d_in, d_ctx, dk, dv, d_out;
    int has[8];     /* in the order of g_array_names */
    size_t heads;   /* 0: not sent */
    int layout;     /* 0: not sent (in_out), 1: "in_out" sent, 2: "out_in" sent */
    int tame;       /* only numbers of moderate size (usable for attention) */
    size_t numbers; /* numbers in the body */
} set_meta;

/* Appends one number as JSON text, in one of several spellings.  Tame numbers lie in
 * [-3, 3]; wild ones are any finite double, with extremes, subnormals and signed zeros
 * often.  (The server reads every number as a double, so "-0" is -0.0 like "-0.0";
 * the sent bodies are parsed here with JSON_DECODE_INT_AS_REAL to read them the same way.) */
static void add_number(text *t, uint64_t *state, int tame)
{
    static const char *const extremes[] = {
        "1.7976931348623157e308", "-1.7976931348623157E+308", "2.2250738585072014e-308",
        "4.9406564584124654e-324", "-5e-324", "1e-310", "123456789012345678e-20",
        "9007199254740993", "0.1", "-0.30000000000000004", "1e22", "6.02214076e23",
        "-0.0", "-0", "-0e0", "0.0"};
    char buf[64];
    uint64_t r = client_rng_next(state);
    double u = rng_unit(state);
    switch (r % (tame ? 7 : 9)) {
    case 0:
        snprintf(buf, sizeof buf, "%.17g", u);
        break;
    case 1:
        snprintf(buf, sizeof buf, "%.3f", (double)(long)(u * 1000) / 1000.0);
        break;
    case 2:
        snprintf(buf, sizeof buf, "%d", (int)((r >> 8) % 7) - 3);
        break;
    case 3:
        snprintf(buf, sizeof buf, "%.6e", u);
        break;
    case 4:
        snprintf(buf, sizeof buf, "%.15g", u * 2.5);
        break;
    case 5:
        snprintf(buf, sizeof buf, "%.16g", u / 7.0);
        break;
    case 6:
        snprintf(buf, sizeof buf, "%s", r & 0x100 ? "-0.0" : "-0");
        break;
    case 7:
        snprintf(buf, sizeof buf, "%s", extremes[(r >> 9) % (sizeof extremes / sizeof extremes[0])]);
        break;
    default: {
        uint64_t bits = client_rng_next(state);
        if (((bits >> 52) & 0x7FF) == 0x7FF)
            bits &= ~(1ull << 62);
        double v;
        memcpy(&v, &bits, sizeof v);
        snprintf(buf, sizeof buf, "%.17g", v);
        if (strcmp(buf, "-0") == 0)
            snprintf(buf, sizeof buf, "-0.0"); /* keep the sign: this one is a real */
    }
    }
    text_str(t, buf);
}

static void add_matrix(text *t, uint64_t *state, int tame, size_t rows, size_t cols)
{
    text_add(t, "[", 1);
    for (size_t r = 0; r < rows; r++) {
        text_add(t, r ? ",[" : "[", r ? 2 : 1);
        for (size_t c = 0; c < cols; c++) {
            if (c)
                text_add(t, ",", 1);
            add_number(t, state, tame);
        }
        text_add(t, "]", 1);
    }
    text_add(t, "]", 1);
}

/* Largest h of {8, 4, 2, 1} that divides both a and b. */
static size_t common_heads(size_t a, size_t b, uint64_t *state)
{
    static const size_t options[] = {8, 4, 3, 2, 1};
    size_t start = rng_range(state, 0, 4);
    for (size_t i = start; i < 5; i++)
        if (a % options[i] == 0 && b % options[i] == 0)
            return options[i];
    return 1;
}

/* Makes the PUT body of the set of seed into t (replacing its content) and fills meta.
 * The same seed always gives the same bytes. */
static void make_set(uint64_t seed, text *t, set_meta *m)
{
    uint64_t state = seed;
    memset(m, 0, sizeof *m);
    t->len = 0;
    size_t klass = rng_range(&state, 0, 99), lo, hi;
    if (klass < 68) {
        lo = 1, hi = 16;
    } else if (klass < 88) {
        lo = 17, hi = 63;
    } else {
        lo = 64, hi = 256; /* big enough that a kill often lands mid-write */
    }
    m->d_in = rng_range(&state, lo, hi);
    m->d_ctx = rng_range(&state, 0, 2) == 0 ? rng_range(&state, lo, hi) : m->d_in;
    m->dk = rng_range(&state, lo, hi);
    m->dv = rng_range(&state, 0, 1) ? m->dk : rng_range(&state, lo, hi);
    m->has[0] = m->has[1] = m->has[2] = 1;
    m->has[3] = rng_range(&state, 0, 9) < 3;
    m->d_out = m->has[3] ? rng_range(&state, 1, hi > 64 ? 64 : hi) : m->dv;
    m->has[4] = rng_range(&state, 0, 1);
    m->has[5] = rng_range(&state, 0, 1);
    m->has[6] = rng_range(&state, 0, 1);
    m->has[7] = m->has[3] && rng_range(&state, 0, 1);
    m->heads = rng_range(&state, 0, 9) < 3 ? common_heads(m->dk, m->dv, &state) : 0;
    size_t lay = rng_range(&state, 0, 9);
    m->layout = lay < 3 ? 2 : lay < 5 ? 1 : 0;
    m->tame = rng_range(&state, 0, 9) < 6;
    int out_in = m->layout == 2;
    size_t rows[4] = {m->d_in, m->d_ctx, m->d_ctx, m->dv};
    size_t cols[4] = {m->dk, m->dk, m->dv, m->d_out};
    size_t lens[4] = {m->dk, m->dk, m->dv, m->d_out};
    /* Members in a shuffled order: the server must not care. */
    int order[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 7; i > 0; i--) {
        int j = (int)rng_range(&state, 0, (size_t)i), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    text_add(t, "{", 1);
    int first = 1;
    for (int k = 0; k < 8; k++) {
        int i = order[k];
        if (!m->has[i])
            continue;
        text_str(t, first ? "\"" : ",\"");
        first = 0;
        text_str(t, g_array_names[i]);
        text_str(t, "\":");
        if (i < 4) {
            add_matrix(t, &state, m->tame, out_in ? cols[i] : rows[i], out_in ? rows[i] : cols[i]);
            m->numbers += rows[i] * cols[i];
        } else {
            text_add(t, "[", 1);
            for (size_t j = 0; j < lens[i - 4]; j++) {
                if (j)
                    text_add(t, ",", 1);
                add_number(t, &state, m->tame);
            }
            text_add(t, "]", 1);
            m->numbers += lens[i - 4];
        }
    }
    if (m->layout) {
        text_str(t, m->layout == 2 ? ",\"weights_layout\":\"out_in\"" : ",\"weights_layout\":\"in_out\"");
    }
    if (m->heads) {
        char buf[40];
        snprintf(buf, sizeof buf, ",\"heads\":%zu", m->heads);
        text_str(t, buf);
    }
    text_add(t, "}", 1);
}

/* ------------------------------------------------------------------------------------ */
/* The server, its restarts, and the killer                                             */
/* ------------------------------------------------------------------------------------ */

static char g_data_dir[300];
static char g_stderr_path[300];

/* Shared with the killer thread, under g_lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t g_pid;          /* the server process, 0 when none */
static int g_pid_killed;     /* the killer has sent SIGKILL to g_pid */
static int g_killer_stop;
static int g_put_in_flight;  /* the client is waiting for a PUT */
static int g_starting;       /* the server has not printed its banner yet */
static int g_start_kill_spent; /* a start was killed; no more until a start completes */
static long g_kills, g_kills_in_put, g_kills_in_start;

static char g_base_url[64];  /* "http://127.0.0.1:PORT" of the running server */
static int g_stdout_fd = -1; /* its stdout pipe */

/* Statistics and failures noticed along the way. */
static long g_starts, g_failed_starts, g_tmp_leftovers_seen, g_restart_tmp_failures,
    g_restart_quarantine_failures, g_unexpected_deaths, g_live_errors;
static char g_first_death[512], g_first_live_error[512], g_first_restart_problem[512];
static char g_last_exit[64]; /* how the last reaped server ended */

/* Sends SIGKILL every 20-300 ms to whatever server is running, except to a starting
 * server when the previous start was killed too: a start takes 0.1-0.4 s with a few hundred
 * sets (more under ASan on a loaded machine), so without that rule every start could be
 * killed and the test would measure the machine's speed instead of the store. */
static void *killer_main(void *arg)
{
    uint64_t state = *(uint64_t *)arg;
    for (;;) {
        client_sleep_ms((long)rng_range(&state, 20, 300));
        pthread_mutex_lock(&g_lock);
        if (g_killer_stop) {
            pthread_mutex_unlock(&g_lock);
            break;
        }
        if (g_pid > 0 && !g_pid_killed && !(g_starting && g_start_kill_spent)) {
            kill(g_pid, SIGKILL);
            g_pid_killed = 1;
            g_kills++;
            if (g_put_in_flight)
                g_kills_in_put++;
            if (g_starting) {
                g_kills_in_start++;
                g_start_kill_spent = 1;
            }
        }
        pthread_mutex_unlock(&g_lock);
    }
    return NULL;
}

/* Reaps the server if it has exited (wait: block until it does).  Returns 1 when it is
 * gone (and notes an exit that was not our SIGKILL), 0 while it still runs. */
static int server_reap(int wait)
{
    pthread_mutex_lock(&g_lock);
    if (g_pid <= 0) {
        pthread_mutex_unlock(&g_lock);
        return 1;
    }
    int status = 0;
    pid_t r;
    while ((r = waitpid(g_pid, &status, wait ? 0 : WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == 0) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    snprintf(g_last_exit, sizeof g_last_exit, "%s %d",
             WIFSIGNALED(status) ? "died of signal" : "exited with status",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    int ours = g_pid_killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!ours) {
        if (g_unexpected_deaths++ == 0)
            snprintf(g_first_death, sizeof g_first_death, "server pid %ld %s %d without our kill",
                     (long)g_pid, WIFSIGNALED(status) ? "died of signal" : "exited with status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    g_pid = 0;
    g_pid_killed = 0;
    pthread_mutex_unlock(&g_lock);
    if (g_stdout_fd >= 0) {
        close(g_stdout_fd);
        g_stdout_fd = -1;
    }
    return 1;
}

/* Waits up to ms for the server to die; returns 1 if it did (and was reaped). */
static int server_wait_dead(long ms)
{
    for (long waited = 0; waited <= ms; waited += 10) {
        if (server_reap(0))
            return 1;
        client_sleep_ms(10);
    }
    return 0;
}

/* Checks the data directory right after a server came up: the start-up removed every
 * leftover temporary file and found no torn set to quarantine. */
static void check_directory_after_start(void)
{
    char qdir[400];
    snprintf(qdir, sizeof qdir, "%s/quarantine", g_data_dir);
    static long quarantined_before;
    long tmp = count_entries(g_data_dir, ".tmp.");
    long now_quarantined = count_entries(qdir, "");
    long quarantined = now_quarantined - quarantined_before;
    if (now_quarantined > quarantined_before)
        quarantined_before = now_quarantined;
    if (tmp != 0) {
        if (g_restart_tmp_failures++ == 0 && !g_first_restart_problem[0])
            snprintf(g_first_restart_problem, sizeof g_first_restart_problem,
                     "%ld .tmp.* file(s) in the data directory after start %ld", tmp, g_starts);
    }
    if (quarantined > 0) {
        if (g_restart_quarantine_failures++ == 0 && !g_first_restart_problem[0])
            snprintf(g_first_restart_problem, sizeof g_first_restart_problem,
                     "%ld new file(s) in quarantine/ after start %ld (a torn or damaged set)",
                     quarantined, g_starts);
    }
}

/* Starts a server on a new free port.  Returns 0 when it printed its banner, -1 when it
 * died first (killed during its start, most likely). */
static int server_start_once(void)
{
    /* Evidence that kills land mid-write: temporary files left by the last server. */
    g_tmp_leftovers_seen += count_entries(g_data_dir, ".tmp.") > 0;
    const char *argv[] = {g_server_path, "--port", "0", "--host", "127.0.0.1", "--quiet",
                          "--data-dir", g_data_dir, NULL};
    char why[1024];
    /* Under the lock, so that the killer never sees a started server without its pid. */
    pthread_mutex_lock(&g_lock);
    pid_t pid = client_spawn_server(argv, NULL, g_stderr_path, 1, &g_stdout_fd, why, sizeof why);
    if (pid < 0) {
        pthread_mutex_unlock(&g_lock);
        fprintf(stderr, "crashtest: %s\n", why);
        exit(2);
    }
    g_pid = pid;
    g_pid_killed = 0;
    g_starting = 1;
    g_starts++;
    pthread_mutex_unlock(&g_lock);
    /* The port, or 0 when the server closed stdout first (it died), the time ran out, or the
     * line is not "listening on http://127.0.0.1:PORT". */
    static const char local[] = "http://127.0.0.1:";
    int port = client_read_banner(g_stdout_fd, CRASH_STARTUP_TIMEOUT_S, g_base_url, sizeof g_base_url,
                                  NULL, why, sizeof why);
    if (port < 0 || strncmp(g_base_url, local, sizeof local - 1) != 0)
        port = 0;
    pthread_mutex_lock(&g_lock);
    g_starting = 0;
    if (port != 0)
        g_start_kill_spent = 0;
    pthread_mutex_unlock(&g_lock);
    if (port == 0) {
        /* Died before its banner, or hangs: make sure it is gone. */
        pthread_mutex_lock(&g_lock);
        int killed_by_us = g_pid_killed;
        if (!killed_by_us && g_pid > 0) {
            kill(g_pid, SIGKILL);
            g_pid_killed = 1;
        }
        pthread_mutex_unlock(&g_lock);
        server_reap(1);
        g_failed_starts++;
        if (!killed_by_us && g_unexpected_deaths++ == 0)
            snprintf(g_first_death, sizeof g_first_death,
                     "start %ld: no \"listening on\" line without our kill; it %s (see %s)",
                     g_starts, g_last_exit, g_stderr_path);
        return -1;
    }
    check_directory_after_start();
    return 0;
}

/* Starts a server, retrying while the killer kills it during its start.  Exits the
 * program when starting fails too often. */
static void crash_server_start(void)
{
    for (int tries = 0;; tries++) {
        if (g_starts >= MAX_RESTARTS || tries >= MAX_FAILED_STARTS_IN_A_ROW) {
            test_check(0, "server/start", "%ld starts, %d failed in a row; giving up (%s; stderr: %s)",
                   g_starts, tries, g_first_death[0] ? g_first_death : "killed each time",
                   g_stderr_path);
            exit(harness_finish(1));
        }
        if (server_start_once() == 0)
            return;
    }
}

/* Stops the server with SIGTERM; returns its exit status text in why and 1 when it
 * exited 0 within CRASH_SHUTDOWN_TIMEOUT_S. */
static int server_stop_gracefully(char *why, size_t why_len)
{
    pthread_mutex_lock(&g_lock);
    pid_t pid = g_pid;
    pthread_mutex_unlock(&g_lock);
    if (pid <= 0) {
        snprintf(why, why_len, "no server running");
        return 0;
    }
    kill(pid, SIGTERM);
    int status = 0;
    int r = client_wait_exit(pid, CRASH_SHUTDOWN_TIMEOUT_S, &status);
    if (r == 0)
        snprintf(why, why_len, "still running %.0f s after SIGTERM", CRASH_SHUTDOWN_TIMEOUT_S);
    pthread_mutex_lock(&g_lock);
    g_pid = 0;
    pthread_mutex_unlock(&g_lock);
    if (g_stdout_fd >= 0) {
        close(g_stdout_fd);
        g_stdout_fd = -1;
    }
    if (r == 0)
        return 0;
    if (WIFSIGNALED(status)) {
        snprintf(why, why_len, "killed by signal %d", WTERMSIG(status));
        return 0;
    }
    snprintf(why, why_len, "exit status %d", WEXITSTATUS(status));
    return WEXITSTATUS(status) == 0;
}

/* ------------------------------------------------------------------------------------ */
/* HTTP through curl                                                                    */
/* ------------------------------------------------------------------------------------ */

/* One exchange with the running server: method to path with body (body_len bytes; NULL
 * for none), its files in g_tmpdir.  Fills r, which the caller frees with
 * client_response_free.  Returns the HTTP status, or 0 when no response came (curl failed;
 * r->transport_error says how).  Ends the program when curl cannot be run at all. */
static int http(const char *method, const char *path, const char *body, size_t body_len,
                struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path, .body = body, .body_len = body_len};
    client_http_call(g_base_url, g_tmpdir, &rq, r);
    if (r->curl_exit < 0 || r->curl_exit == 126 || r->curl_exit == 127) {
        fprintf(stderr, "crashtest: cannot run curl: %s\n", r->transport_error);
        exit(2);
    }
    return r->curl_exit == 0 ? r->status : 0;
}

/* Like http(), but against a server that must stay up: a failed exchange on a live server
 * is noted, and a dead server is restarted (this happens only while the killer runs).
 * Returns the status, or 0 when the server died during the exchange. */
static int http_or_restart(const char *method, const char *path, const char *body, size_t body_len,
                           struct client_response *r)
{
    int status = http(method, path, body, body_len, r);
    if (status != 0)
        return status;
    /* No answer: the server died (our kill), or something is wrong with it. */
    if (server_wait_dead(2000)) {
        crash_server_start();
        return 0;
    }
    if (g_live_errors++ == 0)
        snprintf(g_first_live_error, sizeof g_first_live_error,
                 "%s %s: %.300s while the server was alive", method, path, r->transport_error);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* The record of what was sent and acknowledged                                         */
/* ------------------------------------------------------------------------------------ */

typedef struct name_record {
    char name[72];
    uint64_t seeds[MAX_VERSIONS]; /* versions in the order they were first sent */
    int versions;
    int acked;                    /* index of the last acknowledged version, -1: none */
    int stored;                   /* the version the final GET matched, -1: none (yet) */
    int final_checked;
} name_record;

static name_record *g_names;
static size_t g_name_count;

/* A name of 1-64 characters of A-Z a-z 0-9 . _ - that starts with the index (so it is
 * distinct) and goes on with random characters. */
static void make_name(size_t index, uint64_t *state, char *out, size_t cap)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
    int n = snprintf(out, cap, "s%05zu", index);
    size_t extra = rng_range(state, 0, 9) == 0 ? 64 - (size_t)n : rng_range(state, 0, 12);
    for (size_t i = 0; i < extra && (size_t)n + 1 < cap; i++)
        out[n++] = alphabet[rng_range(state, 0, sizeof alphabet - 2)];
    out[n] = '\0';
}

/* ------------------------------------------------------------------------------------ */
/* The PUT phase                                                                        */
/* ------------------------------------------------------------------------------------ */

static long g_put_attempts, g_put_acks, g_put_unanswered, g_replacements, g_bad_status,
    g_created_mismatch, g_given_up;
static char g_first_bad_status[600], g_first_created_mismatch[300];

/* Sends version v of record r until it is acknowledged, or gives up on it (after a kill,
 * with some probability, or after MAX_ATTEMPTS). */
static void put_version(name_record *r, int v, uint64_t *state, text *body)
{
    set_meta meta;
    make_set(r->seeds[v], body, &meta);
    char path[128];
    snprintf(path, sizeof path, "/v1/weight-sets/%s", r->name);
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        int earlier_unanswered = attempt > 0;
        pthread_mutex_lock(&g_lock);
        g_put_in_flight = 1;
        pthread_mutex_unlock(&g_lock);
        g_put_attempts++;
        struct client_response resp;
        int status = http_or_restart("PUT", path, body->p, body->len, &resp);
        pthread_mutex_lock(&g_lock);
        g_put_in_flight = 0;
        pthread_mutex_unlock(&g_lock);
        if (status != 0 && status != 200 && status != 201 && g_bad_status++ == 0)
            snprintf(g_first_bad_status, sizeof g_first_bad_status, "PUT %s: status %d: %.400s",
                     r->name, status, resp.body);
        client_response_free(&resp);
        if (status == 200 || status == 201) {
            g_put_acks++;
            /* 201 for a name with an acknowledged version: that version was lost.  200 for
             * a name never sent before: a set came from nowhere. */
            int lost = status == 201 && r->acked >= 0;
            int phantom = status == 200 && v == 0 && !earlier_unanswered;
            if ((lost || phantom) && g_created_mismatch++ == 0)
                snprintf(g_first_created_mismatch, sizeof g_first_created_mismatch,
                         "PUT %s (version %d) answered %d: %s", r->name, v, status,
                         lost ? "an acknowledged version was lost" : "the name existed before");
            r->acked = v;
            return;
        }
        if (status != 0)
            return; /* answered neither 200/201 nor at all: noted above */
        g_put_unanswered++;
        /* The server was killed under this PUT (and has been restarted): retry two
         * times out of three, else move on with the version unacknowledged. */
        if (rng_range(state, 0, 2) == 0)
            break;
    }
    g_given_up++;
}

/* Runs the PUT phase: `puts` new names, plus replacements of acknowledged ones. */
static void put_phase(size_t puts, uint64_t *state)
{
    text body = {0};
    double deadline = client_now_seconds() + PUT_PHASE_LIMIT_S;
    while (g_name_count < puts && client_now_seconds() < deadline) {
        name_record *r;
        int v;
        if (g_name_count > 10 && rng_range(state, 0, 7) == 0) {
            /* Replace an acknowledged set (of an earlier name) with a new version. */
            r = &g_names[rng_range(state, 0, g_name_count - 1)];
            if (r->acked < 0 || r->versions >= MAX_VERSIONS)
                continue;
            v = r->versions++;
            r->seeds[v] = client_rng_next(state);
            g_replacements++;
        } else {
            r = &g_names[g_name_count];
            make_name(g_name_count, state, r->name, sizeof r->name);
            g_name_count++;
            r->acked = -1;
            r->stored = -1;
            v = r->versions++;
            r->seeds[v] = client_rng_next(state);
        }
        put_version(r, v, state, &body);
    }
    free(body.p);
}

/* ------------------------------------------------------------------------------------ */
/* The final checks                                                                     */
/* ------------------------------------------------------------------------------------ */

/* Compares two JSON values: same structure, every number the same double bit for bit.
 * Writes the first difference into why (at path). */
static int same_numbers(const json_t *got, const json_t *want, char *path, size_t path_len,
                        char *why, size_t why_len)
{
    if (json_is_array(want)) {
        if (!json_is_array(got) || json_array_size(got) != json_array_size(want)) {
            snprintf(why, why_len, "%s: %s of %zu where %zu were sent", path,
                     json_is_array(got) ? "array" : "not an array",
                     json_is_array(got) ? json_array_size(got) : 0, json_array_size(want));
            return 0;
        }
        size_t base = strlen(path);
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + base, path_len - base, "[%zu]", i);
            if (!same_numbers(json_array_get(got, i), json_array_get(want, i), path, path_len,
                              why, why_len))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (!json_is_number(got)) {
        snprintf(why, why_len, "%s: not a number", path);
        return 0;
    }
    double a = json_number_value(got), b = json_number_value(want);
    if (memcmp(&a, &b, sizeof a) != 0) {
        snprintf(why, why_len, "%s: got %.17g, sent %.17g", path, a, b);
        return 0;
    }
    return 1;
}

/* Checks a GET response body against the set of seed.  Returns 1 if it matches. */
static int matches_seed(const json_t *got, const char *name, uint64_t seed, text *scratch,
                        char *why, size_t why_len)
{
    set_meta meta;
    make_set(seed, scratch, &meta);
    json_error_t jerr;
    json_t *sent = json_loadb(scratch->p, scratch->len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (sent == NULL) {
        snprintf(why, why_len, "the test's own body does not parse: %s", jerr.text);
        return 0;
    }
    int ok = 1;
    const json_t *jname = json_object_get(got, "name");
    const json_t *jheads = json_object_get(got, "heads");
    const char *layout = json_string_value(json_object_get(got, "weights_layout"));
    if (!json_is_string(jname) || strcmp(json_string_value(jname), name) != 0) {
        snprintf(why, why_len, "name is not %s", name);
        ok = 0;
    } else if (meta.heads ? !(json_is_integer(jheads) &&
                              (size_t)json_integer_value(jheads) == meta.heads)
                          : jheads != NULL) {
        snprintf(why, why_len, "heads differ (sent %zu)", meta.heads);
        ok = 0;
    } else if (layout == NULL || strcmp(layout, meta.layout == 2 ? "out_in" : "in_out") != 0) {
        snprintf(why, why_len, "weights_layout is %s", layout ? layout : "(missing)");
        ok = 0;
    }
    for (int i = 0; i < 8 && ok; i++) {
        const json_t *g = json_object_get(got, g_array_names[i]);
        const json_t *w = json_object_get(sent, g_array_names[i]);
        if ((g == NULL) != (w == NULL)) {
            snprintf(why, why_len, "%s is %s", g_array_names[i], g ? "extra" : "missing");
            ok = 0;
            break;
        }
        char path[64];
        snprintf(path, sizeof path, "%s", g_array_names[i]);
        if (w != NULL && !same_numbers(g, w, path, sizeof path, why, why_len))
            ok = 0;
    }
    json_decref(sent);
    return ok;
}

static name_record *find_record(const char *name)
{
    for (size_t i = 0; i < g_name_count; i++)
        if (strcmp(g_names[i].name, name) == 0)
            return &g_names[i];
    return NULL;
}

/* GET /v1/weight-sets: every acknowledged name listed, nothing never sent. */
static void check_list(void)
{
    struct client_response resp;
    int status = http_or_restart("GET", "/v1/weight-sets", NULL, 0, &resp);
    json_t *root = json_loadb(resp.body, resp.body_len, 0, NULL);
    client_response_free(&resp);
    const json_t *sets = json_object_get(root, "weight_sets");
    if (status != 200 || !json_is_array(sets)) {
        test_check(0, "final/list", "GET /v1/weight-sets: status %d, no weight_sets array", status);
        json_decref(root);
        return;
    }
    for (size_t i = 0; i < g_name_count; i++)
        g_names[i].final_checked = 0;
    long unknown = 0, duplicates = 0, missing = 0, extra_unacked = 0;
    char first[300] = "";
    for (size_t i = 0; i < json_array_size(sets); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(sets, i), "name"));
        name_record *r = name ? find_record(name) : NULL;
        if (r == NULL) {
            if (unknown++ == 0 && !first[0])
                snprintf(first, sizeof first, "listed a set never sent: %.100s",
                         name ? name : "(no name)");
            continue;
        }
        if (r->final_checked++ > 0 && duplicates++ == 0 && !first[0])
            snprintf(first, sizeof first, "%s listed twice", r->name);
        if (r->acked < 0)
            extra_unacked++;
    }
    for (size_t i = 0; i < g_name_count; i++) {
        if (g_names[i].acked >= 0 && !g_names[i].final_checked) {
            if (missing++ == 0 && !first[0])
                snprintf(first, sizeof first, "acknowledged set %s is not listed", g_names[i].name);
        }
    }
    const json_t *count = json_object_get(root, "count");
    if (json_is_integer(count) && (size_t)json_integer_value(count) != json_array_size(sets) &&
        !first[0])
        snprintf(first, sizeof first, "count %lld but %zu listed",
                 (long long)json_integer_value(count), json_array_size(sets));
    test_check(!first[0], "final/list", "%s (%ld missing, %ld never sent, %ld duplicates)", first,
           missing, unknown, duplicates);
    printf("# listed %zu sets: every acknowledged one, plus %ld whose PUT was never answered\n",
           json_array_size(sets), extra_unacked);
    json_decref(root);
}

/* GET of every name: the numbers of the acknowledged version (or of a later one that was
 * sent but not answered), or, for a name never acknowledged, 404 or one sent version. */
static void check_every_set(void)
{
    text scratch = {0};
    long bad = 0, checked = 0;
    char first[700] = "";
    for (size_t i = 0; i < g_name_count; i++) {
        name_record *r = &g_names[i];
        char path[128];
        snprintf(path, sizeof path, "/v1/weight-sets/%s", r->name);
        struct client_response resp;
        int status = http_or_restart("GET", path, NULL, 0, &resp);
        char why[500] = "";
        if (status == 404) {
            if (r->acked >= 0)
                snprintf(why, sizeof why, "404 for an acknowledged set");
        } else if (status != 200) {
            snprintf(why, sizeof why, "status %d", status);
        } else {
            json_error_t jerr;
            json_t *got = json_loadb(resp.body, resp.body_len, 0, &jerr);
            int from = r->acked >= 0 ? r->acked : 0, match = 0;
            char mismatch[400];
            snprintf(mismatch, sizeof mismatch, "the response is not JSON: %s", jerr.text);
            for (int v = r->versions - 1; got != NULL && v >= from && !match; v--) {
                match = matches_seed(got, r->name, r->seeds[v], &scratch, mismatch,
                                     sizeof mismatch);
                if (match)
                    r->stored = v;
            }
            if (!match)
                snprintf(why, sizeof why, "matches no acceptable version (%d..%d); vs the "
                         "newest: %s", from, r->versions - 1, mismatch);
            json_decref(got);
            checked++;
        }
        client_response_free(&resp);
        if (why[0] && bad++ == 0)
            snprintf(first, sizeof first, "%s: %s", r->name, why);
    }
    free(scratch.p);
    test_check(bad == 0, "final/get-bit-exact", "%ld of %zu sets wrong; first: %s", bad, g_name_count,
           first);
    printf("# compared %ld stored sets number by number\n", checked);
}

/* in_out matrix (rows x cols) of a JSON matrix that was sent as given (transposed when
 * the set is out_in). */
static double *matrix_in_out(const json_t *m, int out_in, size_t rows, size_t cols)
{
    double *a = client_xcalloc(rows * cols, sizeof *a);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            const json_t *e = out_in ? json_array_get(json_array_get(m, c), r)
                                     : json_array_get(json_array_get(m, r), c);
            a[r * cols + c] = json_number_value(e);
        }
    return a;
}

static double *vector_of(const json_t *v, size_t n)
{
    if (v == NULL)
        return NULL;
    double *a = client_xcalloc(n, sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i] = json_number_value(json_array_get(v, i));
    return a;
}

static json_t *json_rows(const double *a, size_t rows, size_t cols)
{
    json_t *m = json_array();
    for (size_t r = 0; r < rows; r++) {
        json_t *row = json_array();
        for (size_t c = 0; c < cols; c++)
            json_array_append_new(row, json_real(a[r * cols + c]));
        json_array_append_new(m, row);
    }
    return m;
}

/* POST /v1/attention with "weights": NAME for set r, and compares the output with the
 * naive reference.  The version is the one the final GET found: a replacement whose PUT
 * the server committed but could not answer (killed) is newer than the acknowledged one.
 * Returns 1 if it matches. */
static int check_attention_one(name_record *r, uint64_t *state, char *why, size_t why_len)
{
    text t = {0};
    set_meta m;
    make_set(r->seeds[r->stored], &t, &m);
    json_t *sent = json_loadb(t.p, t.len, JSON_DECODE_INT_AS_REAL, NULL);
    free(t.p);
    if (sent == NULL) {
        snprintf(why, why_len, "the test's own body does not parse");
        return 0;
    }
    int out_in = m.layout == 2;
    size_t lq = rng_range(state, 1, 5), lk = rng_range(state, 1, 6);
    int with_context = m.d_ctx != m.d_in || rng_range(state, 0, 1);
    if (!with_context)
        lk = lq;
    double *x = client_xcalloc(lq * m.d_in, sizeof *x);
    double *ctx = client_xcalloc(lk * m.d_ctx, sizeof *ctx);
    for (size_t i = 0; i < lq * m.d_in; i++)
        x[i] = rng_unit(state);
    for (size_t i = 0; i < lk * m.d_ctx; i++)
        ctx[i] = with_context ? rng_unit(state) : x[i];
    double *wq = matrix_in_out(json_object_get(sent, "wq"), out_in, m.d_in, m.dk);
    double *wk = matrix_in_out(json_object_get(sent, "wk"), out_in, m.d_ctx, m.dk);
    double *wv = matrix_in_out(json_object_get(sent, "wv"), out_in, m.d_ctx, m.dv);
    double *wo = m.has[3] ? matrix_in_out(json_object_get(sent, "wo"), out_in, m.dv, m.d_out) : NULL;
    double *bq = vector_of(json_object_get(sent, "bq"), m.dk);
    double *bk = vector_of(json_object_get(sent, "bk"), m.dk);
    double *bv = vector_of(json_object_get(sent, "bv"), m.dv);
    double *bo = vector_of(json_object_get(sent, "bo"), m.d_out);
    double *q = client_xcalloc(lq * m.dk, sizeof *q), *k = client_xcalloc(lk * m.dk, sizeof *k);
    double *v = client_xcalloc(lk * m.dv, sizeof *v), *o = client_xcalloc(lq * m.dv, sizeof *o);
    double *att = client_xcalloc((m.heads ? m.heads : 1) * lq * lk, sizeof *att);
    double *out = client_xcalloc(lq * m.d_out, sizeof *out);
    ref_linear(lq, m.d_in, m.dk, x, wq, bq, q);
    ref_linear(lk, m.d_ctx, m.dk, ctx, wk, bk, k);
    ref_linear(lk, m.d_ctx, m.dv, ctx, wv, bv, v);
    size_t h = m.heads ? m.heads : 1;
    ref_sdpa(1, h, lq, lk, m.dk / h, m.dv / h, q, k, v, NULL, 0, ref_default_scale(m.dk / h), o, att);
    if (wo != NULL)
        ref_linear(lq, m.dv, m.d_out, o, wo, bo, out);
    else
        memcpy(out, o, lq * m.dv * sizeof *out);

    json_t *req = json_object();
    json_object_set_new(req, "x", json_rows(x, lq, m.d_in));
    if (with_context)
        json_object_set_new(req, "context", json_rows(ctx, lk, m.d_ctx));
    json_object_set_new(req, "weights", json_string(r->name));
    char *text_req = json_dumps(req, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(req);
    struct client_response resp;
    int status = http_or_restart("POST", "/v1/attention", text_req, strlen(text_req), &resp);
    free(text_req);
    json_t *got = json_loadb(resp.body, resp.body_len, 0, NULL);
    int ok = 1;
    const json_t *output = json_object_get(got, "output");
    if (status != 200 || !json_is_array(output) || json_array_size(output) != lq) {
        snprintf(why, why_len, "%s: status %d, %.300s", r->name, status, resp.body);
        ok = 0;
    }
    for (size_t i = 0; ok && i < lq; i++) {
        const json_t *row = json_array_get(output, i);
        if (json_array_size(row) != m.d_out) {
            snprintf(why, why_len, "%s: output row %zu has %zu numbers, expected %zu", r->name, i,
                     json_array_size(row), m.d_out);
            ok = 0;
        }
        for (size_t c = 0; ok && c < m.d_out; c++) {
            double a = json_number_value(json_array_get(row, c)), b = out[i * m.d_out + c];
            if (!(fabs(a - b) <= 1e-7 + 1e-7 * fabs(b))) {
                snprintf(why, why_len, "%s: output[%zu][%zu] = %.17g, reference %.17g", r->name, i,
                         c, a, b);
                ok = 0;
            }
        }
    }
    client_response_free(&resp);
    json_decref(got);
    json_decref(sent);
    double *all[] = {x, ctx, wq, wk, wv, wo, bq, bk, bv, bo, q, k, v, o, att, out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    return ok;
}

/* Attention by name for a few acknowledged sets of moderate numbers (in the version the
 * final GET found): a small one, one with heads, one out_in, one with wo, and the biggest. */
static void check_attention(uint64_t *state)
{
    name_record *picks[ATTENTION_CHECKS];
    size_t n = 0, biggest_numbers = 0;
    name_record *biggest = NULL;
    for (size_t i = 0; i < g_name_count; i++) {
        name_record *r = &g_names[i];
        if (r->acked < 0 || r->stored < 0)
            continue;
        text t = {0};
        set_meta m;
        make_set(r->seeds[r->stored], &t, &m);
        free(t.p);
        if (!m.tame)
            continue;
        if (m.numbers > biggest_numbers) {
            biggest_numbers = m.numbers;
            biggest = r;
        }
        int wanted = (n == 0) || (n == 1 && m.heads > 1) || (n == 2 && m.layout == 2) ||
                     (n == 3 && m.has[3]) || (n == 4 && m.d_ctx != m.d_in);
        if (wanted && n < ATTENTION_CHECKS - 1)
            picks[n++] = r;
    }
    if (biggest != NULL)
        picks[n++] = biggest;
    int with_heads = 0, with_out_in = 0, with_wo = 0, with_cross = 0;
    for (size_t i = 0; i < n; i++) {
        text t = {0};
        set_meta m;
        make_set(picks[i]->seeds[picks[i]->stored], &t, &m);
        free(t.p);
        with_heads += m.heads > 1;
        with_out_in += m.layout == 2;
        with_wo += m.has[3];
        with_cross += m.d_ctx != m.d_in;
    }
    printf("# attention by name on %zu sets: %d with heads, %d out_in, %d with wo, %d with "
           "d_ctx != d_in; the largest has %zu numbers\n", n, with_heads, with_out_in, with_wo,
           with_cross, biggest_numbers);
    long bad = 0;
    char first[600] = "";
    for (size_t i = 0; i < n; i++) {
        char why[500];
        if (!check_attention_one(picks[i], state, why, sizeof why) && bad++ == 0)
            snprintf(first, sizeof first, "%s", why);
    }
    test_check(n > 0 && bad == 0, "final/attention-by-name", "%ld of %zu wrong%s%s", bad, n,
           first[0] ? "; first: " : "", first);
}

/* ------------------------------------------------------------------------------------ */
/* main                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* The checks of the phase of PUTs under kills. */
static void check_put_phase(size_t puts)
{
    test_check(g_name_count == puts, "puts/all-sent", "only %zu of %zu sets sent in %.0f s",
           g_name_count, puts, PUT_PHASE_LIMIT_S);
    test_check(g_kills >= 5 && g_kills_in_put >= 1, "kills/landed",
           "only %ld kills (%ld during a PUT): the test did not exercise crashes", g_kills,
           g_kills_in_put);
    test_check(g_bad_status == 0, "puts/status", "%ld PUTs answered neither 200/201 nor at all; "
           "first: %s", g_bad_status, g_first_bad_status);
    test_check(g_created_mismatch == 0, "puts/created-flag", "%ld; first: %s", g_created_mismatch,
           g_first_created_mismatch);
    test_check(g_restart_tmp_failures == 0 && g_restart_quarantine_failures == 0,
           "restarts/clean-directory", "%ld with .tmp files, %ld with quarantined files; first: %s",
           g_restart_tmp_failures, g_restart_quarantine_failures, g_first_restart_problem);
}

/* The final/... checks, when --filter selects one of them: one last clean restart (the
 * server that runs is stopped with SIGTERM), then the store is verified. */
static void final_phase(uint64_t *state)
{
    static const char *const final_names[] = {"final/start", "final/no-tmp-files", "final/quarantine-empty",
                                              "final/list", "final/get-bit-exact", "final/attention-by-name",
                                              "final/sigterm-exit-0", NULL};
    char why[200];
    pthread_mutex_lock(&g_lock);
    int last_killed = g_pid_killed;
    pthread_mutex_unlock(&g_lock);
    if (last_killed) {
        server_reap(1);
    } else if (server_reap(0) == 0) {
        int ok = server_stop_gracefully(why, sizeof why);
        test_check(ok, "server/sigterm-after-crashes", "%s", why);
    }
    if (!any_selected(final_names))
        return;
    long tmp_before = count_entries(g_data_dir, ".tmp.");
    if (server_start_once() != 0) {
        test_check(0, "final/start", "the server did not start for the final check (%s)",
               g_first_death);
    } else {
        char qdir[400];
        snprintf(qdir, sizeof qdir, "%s/quarantine", g_data_dir);
        long tmp_after = count_entries(g_data_dir, ".tmp.");
        long quarantined = count_entries(qdir, "");
        test_check(tmp_after == 0, "final/no-tmp-files", "%ld .tmp.* files after the restart (%ld before)",
               tmp_after, tmp_before);
        test_check(quarantined <= 0, "final/quarantine-empty", "%ld file(s) in quarantine/",
               quarantined);
        check_list();
        check_every_set();
        check_attention(state);
        int ok = server_stop_gracefully(why, sizeof why);
        test_check(ok, "final/sigterm-exit-0", "%s", why);
    }
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s --server PATH [--puts N] [--seed N] [--keep] [--filter SUBSTR]\n"
            "  one scenario: a run does all of it when --filter selects one of its checks\n"
            "  (the final verification only for a final/... check) and reports only the\n"
            "  checks whose name contains SUBSTR\n",
            argv0);
    exit(2);
}

int main(int argc, char **argv)
{
    size_t puts = 500;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    int keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server") && i + 1 < argc)
            g_server_path = argv[++i];
        else if (!strcmp(argv[i], "--puts") && i + 1 < argc)
            puts = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            harness_add_filter(argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else
            usage(argv[0]);
    }
    if (g_server_path == NULL || puts == 0 || puts > 100000)
        usage(argv[0]);
    if (access(g_server_path, X_OK) != 0) {
        fprintf(stderr, "crashtest: %s is not executable\n", g_server_path);
        return 2;
    }
    if (harness_start("crashtest", NULL) != 0)
        return 2;
    /* One scenario, which every check needs: it runs when --filter selects one of them. */
    static const char *const names[] = {"puts/all-sent", "kills/landed", "puts/status", "puts/created-flag",
                                        "restarts/clean-directory", "final/start", "final/no-tmp-files",
                                        "final/quarantine-empty", "final/list", "final/get-bit-exact",
                                        "final/attention-by-name", "final/sigterm-exit-0",
                                        "server/sigterm-after-crashes", "server/answers-while-alive",
                                        "server/no-unexpected-deaths", "server/no-sanitizer-reports", NULL};
    if (!any_selected(names))
        return harness_finish(keep);
    snprintf(g_data_dir, sizeof g_data_dir, "%s/data", g_tmpdir);
    snprintf(g_stderr_path, sizeof g_stderr_path, "%s/server.stderr", g_tmpdir);
    g_names = calloc(puts, sizeof *g_names);
    if (g_names == NULL)
        return 2;
    printf("# seed %llu, %zu new sets, server %s, directory %s\n", (unsigned long long)seed, puts,
           g_server_path, g_tmpdir);
    double started = client_now_seconds();

    uint64_t state = seed, killer_seed = client_rng_next(&state);
    crash_server_start();
    pthread_t killer;
    if (pthread_create(&killer, NULL, killer_main, &killer_seed) != 0) {
        fprintf(stderr, "crashtest: cannot start the killer thread\n");
        return 2;
    }
    put_phase(puts, &state);
    pthread_mutex_lock(&g_lock);
    g_killer_stop = 1;
    pthread_mutex_unlock(&g_lock);
    pthread_join(killer, NULL);
    double put_seconds = client_now_seconds() - started;

    long acked_names = 0;
    for (size_t i = 0; i < g_name_count; i++)
        acked_names += g_names[i].acked >= 0;
    printf("# %.1f s: %ld PUTs sent, %ld acknowledged, %ld unanswered (server killed), "
           "%ld replacements, %ld versions given up\n",
           put_seconds, g_put_attempts, g_put_acks, g_put_unanswered, g_replacements, g_given_up);
    printf("# %ld kills (%ld during a PUT, %ld during start-up), %ld starts, "
           "%ld restarts found .tmp leftovers to clean\n",
           g_kills, g_kills_in_put, g_kills_in_start, g_starts, g_tmp_leftovers_seen);
    printf("# %zu names sent, %ld acknowledged\n", g_name_count, acked_names);

    check_put_phase(puts);
    final_phase(&state);
    test_check(g_live_errors == 0, "server/answers-while-alive", "%ld request(s) failed on a live "
           "server; first: %s", g_live_errors, g_first_live_error);
    test_check(g_unexpected_deaths == 0, "server/no-unexpected-deaths", "%ld; first: %s",
           g_unexpected_deaths, g_first_death);
    char first[400];
    long reports = client_count_sanitizer_lines(g_stderr_path, first, sizeof first);
    test_check(reports == 0, "server/no-sanitizer-reports", "%ld line(s); first: %s", reports, first);
    printf("# total %.1f s\n", client_now_seconds() - started);

    free(g_names);
    return harness_finish(keep);
}

/*
 * itest.c - the integration runner: it starts the real attention-server binary on free
 * loopback ports and holds it to the wire contract (shared/CONTRACT.md) and the design
 * decisions (DESIGN.md) over HTTP.
 *
 * Every HTTP call is made by the curl command-line tool, started with fork/exec and an
 * argument vector (never through a shell), so that what is tested is exactly what a user
 * with curl would see. Request bodies go to curl through temporary files, and curl writes
 * the status, the headers and the body to temporary files that this program reads back.
 * Starting the server, reading its banner and the curl client are client.c's, shared with
 * crashtest.c.
 *
 * The tests come in groups, one static function each:
 *   a. fixtures    - every golden case in --fixtures DIR, compared element by element;
 *   b. cases       - data-driven invalid requests from the *.json files in --cases DIR
 *                    (among them the weight-set PUT errors, names, 405s and by-name errors);
 *   c. protocol    - health, readiness, info, metrics, CORS, methods and headers;
 *   d. random      - randomized requests compared with the naive reference (tests/ref);
 *   e. concurrency - parallel valid requests mixed with garbage;
 *   f. weight-sets - PUT/GET/list/HEAD/DELETE, numbers bit for bit, layouts, names, 405s;
 *   g. named       - attention with a stored set equals the same request with the weights inline;
 *   h. store-limits - 413 weight_set_too_large and store_full, with nothing written;
 *   i. examples    - api/examples (--examples DIR) against the fixtures and the contract's shapes;
 *   j. replace-concurrency - clients use a set while another replaces and deletes it;
 *   k. restart     - sets survive SIGTERM and a new start; damaged files are quarantined;
 *   l. drain       - SIGTERM while a request computes and another uploads.
 * Servers are started on demand: "default" (only --port 0 --host 127.0.0.1),
 * "small-limits" (--max-body 4K --max-elements 1000), "cors" (a configured CORS origin,
 * two BLAS threads and a mix of flags and environment variables) and "small-store"
 * (--max-set-bytes 2K --max-store-bytes 3400); groups k and l start and stop their own
 * ("restart-1", "restart-2" on one data directory, and "drain"). Every server gets its own
 * --data-dir in the temporary directory, never the checkout's. At the end each one gets
 * SIGTERM and must exit 0 within 15 s with no sanitizer report on its stderr; these
 * "server/..." checks run for every server that was started, whatever --filter says.
 * The runner removes ATTN_* variables from the servers' environment, so the defaults it
 * expects hold whatever the caller's environment says.
 *
 * Output: one line per test, "ok   NAME" or "FAIL NAME: reason", then "N passed, N failed".
 * The exit status is 0 when nothing failed, 1 when something did, 2 on a usage error.
 *
 * Build: cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
 *          tests/integration/itest.c tests/integration/client.c tests/ref/reference.c \
 *          -ljansson -lm -o build/itest
 * Run:   build/itest --server build/attention-server --fixtures tests/fixtures \
 *                    --cases tests/integration/cases [--examples api/examples] [--filter SUBSTR]
 * Steps of groups f and h build on each other, so they all run when --filter selects any.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "../ref/reference.h"
#include "client.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

extern char **environ;

/* Seconds to wait for the "listening on" line, and for the exit after SIGTERM. */
#define STARTUP_TIMEOUT_S 10.0
#define SHUTDOWN_TIMEOUT_S 15.0
/* Tolerance for float64 results of the randomized tests, and for float32 ones. */
#define FLOAT64_TOLERANCE 1e-9
#define FLOAT32_TOLERANCE 1e-4
/* The seed of the randomized tests; fixed so that every run sends the same requests. */
#define RANDOM_SEED 20240607u

/* ------------------------------------------------------------------------------------ */
/* Test bookkeeping                                                                      */
/* ------------------------------------------------------------------------------------ */

static int g_passed;
static int g_failed;
static const char *g_filter; /* --filter SUBSTR, or NULL for every test */

/*
 * One named test. A test starts with test_begin, records its first failed expectation
 * with expect_true (later ones are ignored, so the reason names the root cause), may add
 * lines of context with test_detail, and ends with test_end, which prints and counts it.
 */
struct test {
    char name[256];
    int failed;
    char reason[2048];
    char detail[8192]; /* extra lines printed under a failure, e.g. the response body */
};

/* Starts test t named by the format; returns 0 when --filter leaves it out. */
__attribute__((format(printf, 2, 3)))
static int test_begin(struct test *t, const char *fmt, ...)
{
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return g_filter == NULL || strstr(t->name, g_filter) != NULL;
}

/* Records a failure with the formatted reason unless cond holds; returns cond. */
__attribute__((format(printf, 3, 4)))
static int expect_true(struct test *t, int cond, const char *fmt, ...)
{
    if (cond)
        return 1;
    if (!t->failed) {
        t->failed = 1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->reason, sizeof t->reason, fmt, ap);
        va_end(ap);
    }
    return 0;
}

/* Appends one line of context that is printed only if the test fails. */
__attribute__((format(printf, 2, 3)))
static void test_detail(struct test *t, const char *fmt, ...)
{
    size_t used = strlen(t->detail);
    if (used + 2 >= sizeof t->detail)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->detail + used, sizeof t->detail - used - 1, fmt, ap);
    va_end(ap);
    used = strlen(t->detail);
    t->detail[used] = '\n';
    t->detail[used + 1] = '\0';
}

/* Prints the verdict of t and counts it. */
static void test_end(struct test *t)
{
    if (t->failed) {
        printf("FAIL %s: %s\n", t->name, t->reason);
        if (t->detail[0] != '\0')
            printf("%s", t->detail);
        g_failed++;
    } else {
        printf("ok   %s\n", t->name);
        g_passed++;
    }
    fflush(stdout);
}

/* ------------------------------------------------------------------------------------ */
/* Small utilities                                                                       */
/* ------------------------------------------------------------------------------------ */

/* Private directory for bodies, headers and server logs; kept short so paths built
 * from it always fit in PATH_MAX. */
static char g_tmpdir[256];

/* Case-insensitive substring search (strcasestr is not POSIX). */
static const char *find_case_insensitive(const char *haystack, const char *needle)
{
    size_t n = strlen(needle);
    for (; *haystack != '\0'; haystack++)
        if (strncasecmp(haystack, needle, n) == 0)
            return haystack;
    return n == 0 ? haystack : NULL;
}

/* Copies up to 300 bytes of a body into out as one printable line, for failure reports. */
static void body_snippet(const char *body, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    while (len > 0 && (body[len - 1] == '\n' || body[len - 1] == '\r' || body[len - 1] == ' '))
        len--;
    for (size_t i = 0; i < len && n + 4 < cap && i < 300; i++) {
        unsigned char c = (unsigned char)body[i];
        out[n++] = (c >= 32 && c < 127) ? (char)c : '.';
    }
    if (len > 300 && n + 4 < cap) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

/* Returns the sorted entries of dir (without . and ..), NULL-terminated; NULL when unreadable. */
static char **dir_entries(const char *dir, size_t *count)
{
    *count = 0;
    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, NULL, alphasort);
    if (n < 0)
        return NULL;
    char **names = client_xcalloc((size_t)n + 1, sizeof *names);
    for (int i = 0; i < n; i++) {
        if (strcmp(entries[i]->d_name, ".") != 0 && strcmp(entries[i]->d_name, "..") != 0) {
            names[*count] = client_xcalloc(strlen(entries[i]->d_name) + 1, 1);
            strcpy(names[*count], entries[i]->d_name);
            (*count)++;
        }
        free(entries[i]);
    }
    free(entries);
    return names;
}

/* Returns the names of the *.json files in dir, sorted, as a NULL-terminated array. */
static char **list_json_files(const char *dir, size_t *count)
{
    char **names = dir_entries(dir, count);
    size_t kept = 0;
    for (size_t i = 0; names != NULL && names[i] != NULL; i++) {
        size_t len = strlen(names[i]);
        if (len > 5 && strcmp(names[i] + len - 5, ".json") == 0)
            names[kept++] = names[i];
        else
            free(names[i]);
    }
    if (names != NULL)
        names[kept] = NULL;
    *count = kept;
    return names;
}

static void free_name_list(char **names)
{
    if (names == NULL)
        return;
    for (size_t i = 0; names[i] != NULL; i++)
        free(names[i]);
    free(names);
}

/* ------------------------------------------------------------------------------------ */
/* The server processes                                                                  */
/* ------------------------------------------------------------------------------------ */

enum server_id { SERVER_DEFAULT, SERVER_SMALL_LIMITS, SERVER_CORS, SERVER_SMALL_STORE, SERVER_COUNT };

/* How one kind of server is started: extra flags and extra environment. */
struct server_kind {
    const char *label;
    const char *const *args; /* NULL-terminated, appended after --port 0 --host 127.0.0.1 */
    const char *const *env;  /* NULL-terminated "NAME=value" strings */
};

static const char *const g_no_strings[] = {NULL};
static const char *const g_small_args[] = {"--max-body", "4K", "--max-elements", "1000", NULL};
/* The CORS server also shows that flags override the environment and that the
 * environment is read at all: max_elements comes from ATTN_MAX_ELEMENTS, max_body from
 * the flag although ATTN_MAX_BODY says otherwise. */
static const char *const g_cors_args[] = {"--cors-origin", "https://viz.example",
                                          "--compute-threads", "3", "--max-body", "8K", NULL};
static const char *const g_cors_env[] = {"ATTN_MAX_ELEMENTS=12345", "ATTN_MAX_BODY=1K", NULL};
/* The small-store server holds at most 2 KiB per weight set and 3400 bytes in all (see
 * run_store_limit_tests for the arithmetic of the file sizes). */
static const char *const g_small_store_args[] = {"--max-set-bytes", "2K", "--max-store-bytes", "3400", NULL};

static const struct server_kind g_server_kinds[SERVER_COUNT] = {
    [SERVER_DEFAULT] = {"default", g_no_strings, g_no_strings},
    [SERVER_SMALL_LIMITS] = {"small-limits", g_small_args, g_no_strings},
    [SERVER_CORS] = {"cors", g_cors_args, g_cors_env},
    [SERVER_SMALL_STORE] = {"small-store", g_small_store_args, g_no_strings},
};

/* What the info test expects of each kind: body limit, element limit, compute threads
 * (0: one per available CPU, as the server reports them). */
static const long long g_expected_max_body[SERVER_COUNT] = {64LL << 20, 4096, 8192, 64LL << 20};
static const long long g_expected_max_elements[SERVER_COUNT] = {8LL << 20, 1000, 12345, 8LL << 20};
static const long long g_expected_compute_threads[SERVER_COUNT] = {0, 0, 3, 0};
static const char *const g_expected_origin[SERVER_COUNT] = {"*", "*", "https://viz.example", "*"};

struct server {
    const struct server_kind *kind;
    int attempted;           /* a start was tried (servers start on first use) */
    int running;             /* pid is our live child */
    pid_t pid;
    int stdout_fd;           /* read end of the server's stdout, or -1 */
    size_t extra_stdout;     /* bytes seen on stdout after the first line */
    char stderr_path[PATH_MAX];
    char data_dir[512];      /* --data-dir; "" means data-LABEL in the temporary directory */
    char base_url[512];      /* "http://HOST:PORT" from the banner */
    char start_error[1024];
};

static const char *g_server_path;
static struct server g_servers[SERVER_COUNT];

/* Prints the last `lines` lines of a server's stderr into the test's detail. */
static void detail_stderr_tail(struct test *t, const struct server *s, int lines)
{
    size_t len;
    char *text = client_read_file(s->stderr_path, &len);
    if (text == NULL) {
        test_detail(t, "    (no stderr file %s)", s->stderr_path);
        return;
    }
    size_t start = len;
    int seen = 0;
    while (start > 0) {
        if (text[start - 1] == '\n' && start != len && ++seen > lines)
            break;
        start--;
    }
    test_detail(t, "    --- stderr of server %s (%s), last lines ---", s->kind->label, s->stderr_path);
    char *line = text + start;
    while (line < text + len) {
        char *end = strchr(line, '\n');
        if (end != NULL)
            *end = '\0';
        test_detail(t, "    | %.300s", line);
        if (end == NULL)
            break;
        line = end + 1;
    }
    free(text);
}

/*
 * Builds the server's environment: ours minus every ATTN_* variable (so that the
 * caller's environment cannot change what the tests expect), plus the kind's own.
 * The caller frees the returned array (the strings are borrowed).
 */
static char **server_environment(const struct server_kind *kind)
{
    size_t n = 0, extra = 0;
    while (environ[n] != NULL)
        n++;
    while (kind->env[extra] != NULL)
        extra++;
    char **envp = client_xcalloc(n + extra + 1, sizeof *envp);
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ATTN_", 5) != 0)
            envp[used++] = environ[i];
    for (size_t i = 0; i < extra; i++)
        envp[used++] = (char *)kind->env[i];
    return envp;
}

/* Kills a server that failed to start properly and reaps it. */
static void server_abandon(struct server *s)
{
    if (s->running) {
        client_kill_and_reap(s->pid, NULL);
        s->running = 0;
    }
    if (s->stdout_fd >= 0) {
        close(s->stdout_fd);
        s->stdout_fd = -1;
    }
}

/*
 * Starts the server of the given kind: stdin from /dev/null, stdout to a pipe that we
 * read the banner from, stderr to a file in the temporary directory. Reports the start as
 * the test "server/LABEL/start". Returns 0 when the server is up.
 */
static int server_start(struct server *s)
{
    const struct server_kind *kind = s->kind;
    struct test t;
    test_begin(&t, "server/%s/start", kind->label);
    s->attempted = 1;
    s->stdout_fd = -1;
    snprintf(s->stderr_path, sizeof s->stderr_path, "%s/server-%s.stderr", g_tmpdir, kind->label);
    /* Every server gets a data directory of its own inside the temporary directory, so
     * that no test reads or writes the weight sets of the checkout (./data). */
    if (s->data_dir[0] == '\0')
        snprintf(s->data_dir, sizeof s->data_dir, "%s/data-%s", g_tmpdir, kind->label);

    const char *argv[32];
    size_t argc = 0;
    argv[argc++] = g_server_path;
    argv[argc++] = "--port";
    argv[argc++] = "0";
    argv[argc++] = "--host";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "--data-dir";
    argv[argc++] = s->data_dir;
    for (size_t i = 0; kind->args[i] != NULL && argc < 31; i++)
        argv[argc++] = kind->args[i];
    argv[argc] = NULL;

    char **envp = server_environment(kind);
    pid_t pid = client_spawn_server(argv, envp, s->stderr_path, 0, &s->stdout_fd, s->start_error,
                                    sizeof s->start_error);
    free(envp);
    if (pid < 0) {
        expect_true(&t, 0, "%s", s->start_error);
        test_end(&t);
        return -1;
    }
    s->pid = pid;
    s->running = 1;
    if (client_read_banner(s->stdout_fd, STARTUP_TIMEOUT_S, s->base_url, sizeof s->base_url, &s->extra_stdout,
                           s->start_error, sizeof s->start_error) < 0) {
        server_abandon(s);
        expect_true(&t, 0, "%s", s->start_error);
        detail_stderr_tail(&t, s, 30);
        test_end(&t);
        return -1;
    }
    test_end(&t);
    return 0;
}

/* Returns the running server of that kind, starting it on first use; NULL if it is down. */
static struct server *server_get(enum server_id id)
{
    struct server *s = &g_servers[id];
    s->kind = &g_server_kinds[id];
    if (!s->attempted)
        server_start(s);
    return s->running ? s : NULL;
}

/* Like server_get, but records a failure in t when the server is not running. */
static struct server *test_server(struct test *t, enum server_id id)
{
    struct server *s = server_get(id);
    expect_true(t, s != NULL, "server %s is not running: %s", g_server_kinds[id].label,
                g_servers[id].start_error);
    return s;
}

/*
 * Starts the test t named name on server id: returns 1 when the test is selected and the
 * server runs (*s is set; the caller ends the test), 0 when --filter leaves it out or the
 * server is down (then the failure has already been reported).
 */
static int test_start(struct test *t, enum server_id id, struct server **s, const char *name)
{
    if (!test_begin(t, "%s", name))
        return 0;
    if ((*s = test_server(t, id)) == NULL) {
        test_end(t);
        return 0;
    }
    return 1;
}

/*
 * Waits for a server that was sent SIGTERM and reports three tests: it exits with status
 * 0 within SHUTDOWN_TIMEOUT_S, its stderr has no sanitizer report, and its stdout held
 * exactly the one banner line.
 */
static void server_wait_exit(struct server *s)
{
    struct test t;
    const char *label = s->kind->label;

    test_begin(&t, "server/%s/exit-status-after-sigterm", label);
    int status = 0;
    int done = client_wait_exit(s->pid, SHUTDOWN_TIMEOUT_S, &status);
    if (done == 0) {
        expect_true(&t, 0, "still running %.0f s after SIGTERM (killed it)", SHUTDOWN_TIMEOUT_S);
    } else if (done < 0) {
        expect_true(&t, 0, "waitpid failed: %s", strerror(errno));
    } else if (WIFSIGNALED(status)) {
        expect_true(&t, 0, "killed by signal %d", WTERMSIG(status));
    } else {
        expect_true(&t, WIFEXITED(status) && WEXITSTATUS(status) == 0, "exited with status %d, expected 0",
                    WEXITSTATUS(status));
    }
    s->running = 0;
    if (t.failed)
        detail_stderr_tail(&t, s, 30);
    test_end(&t);

    test_begin(&t, "server/%s/no-sanitizer-reports", label);
    char first[512];
    int reports = client_count_sanitizer_lines(s->stderr_path, first, sizeof first);
    if (!expect_true(&t, reports == 0, "%d sanitizer line(s) on stderr, first: %s", reports, first))
        detail_stderr_tail(&t, s, 40);
    test_end(&t);

    /* The process is gone, so reading its stdout pipe ends at EOF. */
    test_begin(&t, "server/%s/stdout-is-one-line", label);
    size_t extra = s->extra_stdout;
    char buf[512];
    for (;;) {
        struct pollfd pfd = {s->stdout_fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            break;
        ssize_t got = read(s->stdout_fd, buf, sizeof buf);
        if (got <= 0)
            break;
        extra += (size_t)got;
    }
    close(s->stdout_fd);
    s->stdout_fd = -1;
    expect_true(&t, extra == 0, "%zu byte(s) on stdout after the \"listening on\" line (logs belong on stderr)",
                extra);
    test_end(&t);
}

/* Stops a server with SIGTERM and reports the three tests of server_wait_exit. */
static void server_stop(struct server *s)
{
    kill(s->pid, SIGTERM);
    server_wait_exit(s);
}

/* ------------------------------------------------------------------------------------ */
/* HTTP through the curl command-line tool                                               */
/* ------------------------------------------------------------------------------------ */

/* The request and response types, and the curl machinery, are client.h's; these wrappers
 * send to a struct server and keep the request files in the temporary directory. */

/* Sends one request and waits for the response (which the caller frees). */
static void http_call(const struct server *s, const struct client_request *rq, struct client_response *r)
{
    client_http_call(s->base_url, g_tmpdir, rq, r);
}

/* Sends a request without a body. */
static void http_simple(const struct server *s, const char *method, const char *path, struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path};
    http_call(s, &rq, r);
}

/* POSTs a JSON value (serialized compactly; jansson prints reals round-trippably). */
static void http_post_json(const struct server *s, const char *path, const json_t *body, struct client_response *r)
{
    char *text = json_dumps(body, JSON_COMPACT);
    struct client_request rq = {.method = "POST", .path = path, .body = text, .body_len = strlen(text)};
    http_call(s, &rq, r);
    free(text);
}

/* Sends method to path with text as the body (NULL: no body); the caller frees r. */
static void http_text(const struct server *s, const char *method, const char *path, const char *text,
                      struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path, .body = text, .body_len = text ? strlen(text) : 0};
    http_call(s, &rq, r);
}

/* Parses a response body as JSON; returns a new reference or NULL. */
static json_t *response_json(const struct client_response *r)
{
    return json_loadb(r->body, r->body_len, 0, NULL);
}

/* Checks the status of r and, on a mismatch, shows the response body as context. */
static int expect_status(struct test *t, const struct client_response *r, int want)
{
    int ok;
    if (r->status == 0)
        ok = expect_true(t, 0, "no HTTP response (%s)", r->transport_error);
    else
        ok = expect_true(t, r->status == want, "status %d, expected %d", r->status, want);
    if (!ok && r->body_len > 0) {
        char snippet[400];
        body_snippet(r->body, r->body_len, snippet, sizeof snippet);
        test_detail(t, "    response body: %s", snippet);
    }
    return ok;
}

/* Checks that header name is present and contains want (case-insensitive). */
static int expect_header_contains(struct test *t, const struct client_response *r, const char *name, const char *want)
{
    const char *value = client_header(r, name);
    if (!expect_true(t, value != NULL, "no %s header", name))
        return 0;
    return expect_true(t, find_case_insensitive(value, want) != NULL, "%s is \"%s\", expected it to contain \"%s\"",
                       name, value, want);
}

/* Checks that header name is present with exactly the value want. */
static int expect_header_equals(struct test *t, const struct client_response *r, const char *name, const char *want)
{
    const char *value = client_header(r, name);
    if (!expect_true(t, value != NULL, "no %s header", name))
        return 0;
    return expect_true(t, strcmp(value, want) == 0, "%s is \"%s\", expected \"%s\"", name, value, want);
}

/* ------------------------------------------------------------------------------------ */
/* JSON helpers: comparison and construction                                             */
/* ------------------------------------------------------------------------------------ */

/*
 * Compares got with want element by element: at every depth both must be arrays of the
 * same length, and at the leaves both must be numbers with
 * |got - want| <= abs_tol + rel_tol * |want|. path (a buffer of path_cap bytes holding
 * the position so far, e.g. "output[2]") is extended in place and restored. Returns 1 on
 * a match; otherwise 0 with the first difference described in why.
 */
static int json_numbers_close(const json_t *got, const json_t *want, double abs_tol, double rel_tol, char *path,
                              size_t path_cap, char *why, size_t why_cap)
{
    if (json_is_array(want)) {
        if (!json_is_array(got)) {
            snprintf(why, why_cap, "%s is %s, expected an array of %zu", path,
                     got == NULL ? "missing" : json_is_number(got) ? "a number" : "not an array",
                     json_array_size(want));
            return 0;
        }
        if (json_array_size(got) != json_array_size(want)) {
            snprintf(why, why_cap, "%s has %zu elements, expected %zu", path, json_array_size(got),
                     json_array_size(want));
            return 0;
        }
        size_t base = strlen(path);
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + base, path_cap - base, "[%zu]", i);
            if (!json_numbers_close(json_array_get(got, i), json_array_get(want, i), abs_tol, rel_tol, path,
                                    path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (!json_is_number(want)) {
        snprintf(why, why_cap, "the expectation at %s is not a number or an array", path);
        return 0;
    }
    if (!json_is_number(got)) {
        snprintf(why, why_cap, "%s is %s, expected the number %.17g", path,
                 got == NULL ? "missing" : json_is_array(got) ? "an array (extra dimension)" : "not a number",
                 json_number_value(want));
        return 0;
    }
    double g = json_number_value(got), w = json_number_value(want);
    double allowed = abs_tol + rel_tol * fabs(w);
    if (!(fabs(g - w) <= allowed)) {
        snprintf(why, why_cap, "%s is %.17g, expected %.17g (difference %.3g > tolerance %.3g)", path, g, w,
                 fabs(g - w), allowed);
        return 0;
    }
    return 1;
}

/* Compares the member `key` of a response object with an expected value; records in t. */
static int expect_close(struct test *t, const json_t *response, const char *key, const json_t *want, double abs_tol,
                        double rel_tol)
{
    char path[512], why[1024];
    snprintf(path, sizeof path, "%s", key);
    int ok = json_numbers_close(json_object_get(response, key), want, abs_tol, rel_tol, path, sizeof path, why,
                                sizeof why);
    return expect_true(t, ok, "%s", why);
}

/* Returns a new JSON matrix of a rows x cols row-major array, or of its transpose. */
static json_t *json_matrix(const double *a, size_t rows, size_t cols, int transpose)
{
    size_t out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
    json_t *m = json_array();
    for (size_t r = 0; r < out_rows; r++) {
        json_t *row = json_array();
        for (size_t c = 0; c < out_cols; c++)
            json_array_append_new(row, json_real(transpose ? a[c * cols + r] : a[r * cols + c]));
        json_array_append_new(m, row);
    }
    return m;
}

/*
 * Returns a new JSON value for `batch` consecutive rows x cols matrices: a 3-D array when
 * batched, else the single 2-D matrix. With transpose each matrix is sent transposed.
 */
static json_t *json_tensor(const double *a, size_t batch, size_t rows, size_t cols, int batched, int transpose)
{
    if (!batched)
        return json_matrix(a, rows, cols, transpose);
    json_t *t = json_array();
    for (size_t n = 0; n < batch; n++)
        json_array_append_new(t, json_matrix(a + n * rows * cols, rows, cols, transpose));
    return t;
}

/*
 * Returns a new JSON value for a batch x heads x lq x lk attention array with the axes
 * the contract asks for: the batch axis only when batched, the heads axis only when the
 * request named heads.
 */
static json_t *json_attention(const double *attn, size_t batch, size_t heads, size_t lq, size_t lk, int batched,
                              int has_heads)
{
    json_t *per_batch = json_array();
    for (size_t n = 0; n < batch; n++) {
        json_t *per_head = json_array();
        for (size_t h = 0; h < heads; h++)
            json_array_append_new(per_head, json_matrix(attn + (n * heads + h) * lq * lk, lq, lk, 0));
        if (has_heads) {
            json_array_append_new(per_batch, per_head);
        } else {
            json_array_append(per_batch, json_array_get(per_head, 0));
            json_decref(per_head);
        }
    }
    if (batched)
        return per_batch;
    json_t *first = json_incref(json_array_get(per_batch, 0));
    json_decref(per_batch);
    return first;
}

/* Returns a new JSON mask (count matrices of lq x lk; 3-D when as_3d) of booleans or 0/1. */
static json_t *json_mask(const unsigned char *m, size_t count, size_t lq, size_t lk, int as_3d, int numeric)
{
    json_t *all = json_array();
    for (size_t n = 0; n < count; n++) {
        json_t *matrix = json_array();
        for (size_t i = 0; i < lq; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < lk; j++) {
                int allowed = m[(n * lq + i) * lk + j] != 0;
                json_array_append_new(row, numeric ? json_integer(allowed) : json_boolean(allowed));
            }
            json_array_append_new(matrix, row);
        }
        json_array_append_new(all, matrix);
    }
    if (as_3d)
        return all;
    json_t *first = json_incref(json_array_get(all, 0));
    json_decref(all);
    return first;
}

/* ------------------------------------------------------------------------------------ */
/* Group a: the golden fixtures                                                          */
/* ------------------------------------------------------------------------------------ */

/*
 * Lists the *.json files of dir (see list_json_files; the caller frees the list with
 * free_name_list) and reports the test test_name: dir must hold at least one such file,
 * "no *.json WHAT in DIR" otherwise.
 */
static char **list_test_files(const char *dir, const char *test_name, const char *what, size_t *count)
{
    struct test t;
    char **files = list_json_files(dir, count);
    if (test_begin(&t, "%s", test_name)) {
        expect_true(&t, files != NULL && *count > 0, "no *.json %s in %s", what, dir);
        test_end(&t);
    }
    return files;
}

/*
 * POSTs each fixture's request and checks the status and, for a 200, every element of
 * "output" and "attention" that the fixture gives, within the fixture's tolerance.
 * A fixture that expects an error with expect.code has its error code checked instead.
 */
static void run_fixture_tests(const char *dir)
{
    struct test t;
    size_t count;
    char **files = list_test_files(dir, "fixtures/present", "fixtures", &count);
    for (size_t i = 0; i < count; i++) {
        const char *file = files[i];
        if (!test_begin(&t, "fixture/%.*s", (int)(strlen(file) - 5), file))
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        json_error_t error;
        json_t *fixture = json_load_file(path, 0, &error);
        json_t *expect = json_object_get(fixture, "expect");
        json_t *request = json_object_get(fixture, "request");
        struct server *s = NULL;
        json_t *body = NULL;
        struct client_response r = {0};
        if (!expect_true(&t, fixture != NULL, "%s:%d: %s", path, error.line, error.text) ||
            !expect_true(&t, json_is_object(request) && json_is_object(expect) &&
                                 json_is_integer(json_object_get(expect, "status")),
                         "fixture lacks request, expect or expect.status") ||
            (s = test_server(&t, SERVER_DEFAULT)) == NULL)
            goto next;
        http_post_json(s, "/v1/attention", request, &r);
        int want_status = (int)json_integer_value(json_object_get(expect, "status"));
        if (!expect_status(&t, &r, want_status))
            goto next;
        body = response_json(&r);
        if (!expect_true(&t, json_is_object(body), "response body is not a JSON object"))
            goto next;
        if (want_status == 200) {
            const json_t *tol_json = json_object_get(expect, "tolerance");
            double tolerance = json_is_number(tol_json) ? json_number_value(tol_json) : FLOAT64_TOLERANCE;
            if (json_object_get(expect, "output") != NULL)
                expect_close(&t, body, "output", json_object_get(expect, "output"), tolerance, 0.0);
            if (json_object_get(expect, "attention") != NULL)
                expect_close(&t, body, "attention", json_object_get(expect, "attention"), tolerance, 0.0);
        } else if (json_is_string(json_object_get(expect, "code"))) {
            const char *want = json_string_value(json_object_get(expect, "code"));
            const char *got = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
            expect_true(&t, got != NULL && strcmp(got, want) == 0, "error code %s, expected %s",
                        got != NULL ? got : "(none)", want);
        }
    next:
        json_decref(body);
        json_decref(fixture);
        client_response_free(&r);
        test_end(&t);
    }
    free_name_list(files);
}

/* ------------------------------------------------------------------------------------ */
/* Group b: data-driven error cases                                                      */
/* ------------------------------------------------------------------------------------ */

/* Returns a new array of the shape in dims (from axis on) filled with the integer 1. */
static json_t *filled_array(const json_t *dims, size_t axis)
{
    if (axis == json_array_size(dims))
        return json_integer(1);
    json_t *a = json_array();
    json_int_t n = json_integer_value(json_array_get(dims, axis));
    for (json_int_t i = 0; i < n; i++)
        json_array_append_new(a, filled_array(dims, axis + 1));
    return a;
}

/*
 * Returns a new deep copy of v in which every object {"$matrix": [d1, d2, ...]} is
 * replaced by an array of that shape filled with 1s, so that case files can ask for
 * large requests without spelling them out.
 */
static json_t *expand_body(const json_t *v)
{
    if (json_is_object(v)) {
        const json_t *dims = json_object_get(v, "$matrix");
        if (json_object_size(v) == 1 && json_is_array(dims))
            return filled_array(dims, 0);
        json_t *copy = json_object();
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)v, key, member)
            json_object_set_new(copy, key, expand_body(member));
        return copy;
    }
    if (json_is_array(v)) {
        json_t *copy = json_array();
        for (size_t i = 0; i < json_array_size(v); i++)
            json_array_append_new(copy, expand_body(json_array_get(v, i)));
        return copy;
    }
    return json_deep_copy(v);
}

/* Returns the name of the first key of obj that is not in the NULL-terminated list. */
static const char *unknown_key(const json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)obj, key, member) {
        (void)member;
        size_t i = 0;
        while (allowed[i] != NULL && strcmp(allowed[i], key) != 0)
            i++;
        if (allowed[i] == NULL)
            return key;
    }
    return NULL;
}

/*
 * Checks that r is an error response as the contract defines it: a JSON object
 * {"error": {"code", "message", "field"?}} with a non-empty code and message and, when
 * present, a string field. Returns the error object (borrowed from *body_out, which the
 * caller releases), or NULL after recording the failure.
 */
static const json_t *expect_error_body(struct test *t, const struct client_response *r, json_t **body_out)
{
    *body_out = response_json(r);
    const json_t *error = json_object_get(*body_out, "error");
    const json_t *code = json_object_get(error, "code");
    const json_t *message = json_object_get(error, "message");
    const json_t *field = json_object_get(error, "field");
    if (!expect_true(t, json_is_object(*body_out), "error body is not a JSON object") ||
        !expect_true(t, json_is_object(error), "error body has no \"error\" object") ||
        !expect_true(t, json_is_string(code) && json_string_length(code) > 0, "error.code is not a non-empty string") ||
        !expect_true(t, json_is_string(message) && json_string_length(message) > 0,
                     "error.message is not a non-empty string") ||
        !expect_true(t, field == NULL || json_is_string(field), "error.field is present but not a string"))
        return NULL;
    return error;
}

/* Runs one case object from a case file; name_prefix is "cases/FILE". */
static void run_case(const char *name_prefix, size_t index, const json_t *c, int *servers_used)
{
    static const char *const case_keys[] = {"name", "about", "method", "path", "body", "raw_body", "headers",
                                            "server", "pad_to_bytes", "expect", NULL};
    static const char *const expect_keys[] = {"status", "code", "field", "header_contains", NULL};
    struct test t;
    const char *name = json_string_value(json_object_get(c, "name"));
    char fallback[32];
    snprintf(fallback, sizeof fallback, "#%zu", index);
    if (!test_begin(&t, "%s/%s", name_prefix, name != NULL ? name : fallback))
        return;

    const json_t *expect = json_object_get(c, "expect");
    const char *method = json_string_value(json_object_get(c, "method"));
    const char *path = json_string_value(json_object_get(c, "path"));
    const char *server_name = json_string_value(json_object_get(c, "server"));
    const json_t *headers = json_object_get(c, "headers");
    const json_t *raw = json_object_get(c, "raw_body");
    const json_t *body_json = json_object_get(c, "body");
    const json_t *pad = json_object_get(c, "pad_to_bytes");
    enum server_id id = SERVER_DEFAULT;
    char *body = NULL;
    size_t body_len = 0;
    json_t *response = NULL;
    struct client_response r = {0};
    struct server *s;
    const char *bad_case_key = json_is_object(c) ? unknown_key(c, case_keys) : NULL;
    const char *bad_expect_key = json_is_object(expect) ? unknown_key(expect, expect_keys) : NULL;

    /* A typo in a case file must not silently weaken the test, so the files are strict. */
    if (!expect_true(&t, json_is_object(c) && name != NULL, "malformed case: not an object with a \"name\"") ||
        !expect_true(&t, bad_case_key == NULL, "malformed case: unknown key \"%s\"", bad_case_key) ||
        !expect_true(&t, json_is_object(expect) && json_is_integer(json_object_get(expect, "status")),
                     "malformed case: expect.status missing") ||
        !expect_true(&t, bad_expect_key == NULL, "malformed case: unknown key \"expect.%s\"", bad_expect_key) ||
        !expect_true(&t, !(raw != NULL && body_json != NULL), "malformed case: both body and raw_body") ||
        !expect_true(&t, raw == NULL || json_is_string(raw), "malformed case: raw_body is not a string") ||
        !expect_true(&t, headers == NULL || json_is_object(headers), "malformed case: headers is not an object"))
        goto done;
    if (server_name != NULL && strcmp(server_name, "small-limits") == 0)
        id = SERVER_SMALL_LIMITS;
    else if (!expect_true(&t, server_name == NULL || strcmp(server_name, "default") == 0,
                          "malformed case: unknown server \"%s\"", server_name))
        goto done;
    *servers_used |= 1 << id;

    /* Assemble the body: JSON (with $matrix expanded), or raw bytes, then optional padding. */
    if (body_json != NULL) {
        json_t *expanded = expand_body(body_json);
        body = json_dumps(expanded, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(expanded);
        body_len = strlen(body);
    } else if (raw != NULL) {
        body_len = json_string_length(raw);
        body = client_xcalloc(body_len + 1, 1);
        memcpy(body, json_string_value(raw), body_len);
    }
    if (json_is_integer(pad) && body != NULL && (size_t)json_integer_value(pad) > body_len) {
        size_t want = (size_t)json_integer_value(pad);
        char *padded = client_xcalloc(want + 1, 1);
        memcpy(padded, body, body_len);
        memset(padded + body_len, ' ', want - body_len); /* whitespace keeps the JSON valid */
        free(body);
        body = padded;
        body_len = want;
    }

    struct client_request rq = {
        .method = method != NULL ? method : "POST",
        .path = path != NULL ? path : "/v1/attention",
        .body = body,
        .body_len = body_len,
    };
    char header_lines[CLIENT_MAX_EXTRA_HEADERS][512];
    size_t header_count = 0;
    const char *hname;
    json_t *hvalue;
    json_object_foreach((json_t *)headers, hname, hvalue) {
        if (header_count < CLIENT_MAX_EXTRA_HEADERS && json_is_string(hvalue)) {
            snprintf(header_lines[header_count], sizeof header_lines[0], "%s: %s", hname, json_string_value(hvalue));
            rq.headers[header_count] = header_lines[header_count];
            header_count++;
        }
    }

    if ((s = test_server(&t, id)) == NULL)
        goto done;
    http_call(s, &rq, &r);
    int want_status = (int)json_integer_value(json_object_get(expect, "status"));
    if (!expect_status(&t, &r, want_status))
        goto done;
    expect_true(&t, client_header(&r, "Access-Control-Allow-Origin") != NULL, "no Access-Control-Allow-Origin header");

    const json_t *contains = json_object_get(expect, "header_contains");
    const char *cname;
    json_t *cvalue;
    json_object_foreach((json_t *)contains, cname, cvalue)
        expect_header_contains(&t, &r, cname, json_string_value(cvalue) != NULL ? json_string_value(cvalue) : "");

    if (want_status >= 400) {
        expect_header_contains(&t, &r, "Content-Type", "application/json");
        const json_t *error = expect_error_body(&t, &r, &response);
        if (error == NULL)
            goto done;
        const char *got_code = json_string_value(json_object_get(error, "code"));
        const char *want_code = json_string_value(json_object_get(expect, "code"));
        if (want_code != NULL)
            expect_true(&t, strcmp(got_code, want_code) == 0, "error code \"%s\", expected \"%s\"", got_code,
                        want_code);
        const json_t *want_field = json_object_get(expect, "field");
        const json_t *got_field = json_object_get(error, "field");
        if (json_is_null(want_field))
            expect_true(&t, got_field == NULL, "error.field is \"%s\", expected no field",
                        json_string_value(got_field));
        else if (json_is_string(want_field))
            expect_true(&t, got_field != NULL && strcmp(json_string_value(got_field),
                                                        json_string_value(want_field)) == 0,
                        "error.field is %s%s%s, expected \"%s\"", got_field ? "\"" : "",
                        got_field ? json_string_value(got_field) : "absent", got_field ? "\"" : "",
                        json_string_value(want_field));
    }
    if (t.failed) {
        char snippet[400];
        body_snippet(r.body, r.body_len, snippet, sizeof snippet);
        test_detail(&t, "    response body: %s", snippet);
    }
done:
    json_decref(response);
    free(body);
    client_response_free(&r);
    test_end(&t);
}

/* A tiny valid request used to show that a server still computes after bad input. */
static const char g_tiny_request[] = "{\"q\":[[1,0],[0,1]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]]}";

/* Checks that server id still answers GET /healthz with 200 and a tiny POST with 200. */
static void check_still_serving(const char *name_prefix, enum server_id id)
{
    struct test t;
    if (!test_begin(&t, "%s/still-serving/%s", name_prefix, g_server_kinds[id].label))
        return;
    struct server *s = test_server(&t, id);
    if (s != NULL) {
        struct client_response r;
        http_simple(s, "GET", "/healthz", &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        http_text(s, "POST", "/v1/attention", g_tiny_request, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
    }
    test_end(&t);
}

/*
 * Runs every case file in dir. Each file is an array of cases (see the README beside the
 * files); after each file, every server it used must still serve.
 */
static void run_case_tests(const char *dir)
{
    struct test t;
    size_t count;
    char **files = list_test_files(dir, "cases/present", "case files", &count);
    for (size_t i = 0; i < count; i++) {
        char prefix[300], path[PATH_MAX];
        snprintf(prefix, sizeof prefix, "cases/%.*s", (int)(strlen(files[i]) - 5), files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        json_error_t error;
        json_t *cases = json_load_file(path, JSON_ALLOW_NUL, &error);
        if (!json_is_array(cases)) {
            if (test_begin(&t, "%s/load", prefix)) {
                expect_true(&t, 0, "%s:%d: %s", path, error.line, cases == NULL ? error.text : "not an array");
                test_end(&t);
            }
            json_decref(cases);
            continue;
        }
        int servers_used = 0;
        for (size_t j = 0; j < json_array_size(cases); j++)
            run_case(prefix, j, json_array_get(cases, j), &servers_used);
        for (int id = 0; id < SERVER_COUNT; id++)
            if (servers_used & (1 << id))
                check_still_serving(prefix, (enum server_id)id);
        json_decref(cases);
    }
    free_name_list(files);
}

/* ------------------------------------------------------------------------------------ */
/* Group c: protocol                                                                     */
/* ------------------------------------------------------------------------------------ */

/* Checks that a JSON member is an integer equal to want. */
static int expect_json_integer(struct test *t, const json_t *obj, const char *path, const char *key, long long want)
{
    const json_t *v = json_object_get(obj, key);
    if (!expect_true(t, json_is_integer(v), "%s.%s is %s, expected the integer %lld", path, key,
                     v == NULL ? "missing" : "not an integer", want))
        return 0;
    return expect_true(t, json_integer_value(v) == want, "%s.%s is %lld, expected %lld", path, key,
                       (long long)json_integer_value(v), want);
}

/* GET /v1/info on server id and check the values it was started with. */
static void check_info(enum server_id id)
{
    struct test t;
    if (!test_begin(&t, "protocol/info/%s", g_server_kinds[id].label))
        return;
    struct server *s = test_server(&t, id);
    struct client_response r = {0};
    json_t *body = NULL;
    if (s == NULL)
        goto done;
    http_simple(s, "GET", "/v1/info", &r);
    if (!expect_status(&t, &r, 200))
        goto done;
    body = response_json(&r);
    const json_t *blas = json_object_get(body, "blas");
    const json_t *limits = json_object_get(body, "limits");
    const json_t *compute = json_object_get(body, "compute");
    const json_t *version = json_object_get(body, "version");
    const json_t *dtypes = json_object_get(body, "dtypes");
    int has64 = 0, has32 = 0;
    for (size_t i = 0; i < json_array_size(dtypes); i++) {
        const char *d = json_string_value(json_array_get(dtypes, i));
        has64 |= d != NULL && strcmp(d, "float64") == 0;
        has32 |= d != NULL && strcmp(d, "float32") == 0;
    }
    if (!expect_true(&t, json_is_object(body), "body is not a JSON object") ||
        !expect_true(&t, json_is_string(version) && json_string_length(version) > 0, "version is not a non-empty string") ||
        !expect_true(&t, json_is_object(blas), "no blas object") ||
        !expect_true(&t, json_is_object(limits), "no limits object") ||
        !expect_true(&t, json_is_object(compute), "no compute object"))
        goto done;
    /* OpenBLAS runs each product on one thread; the compute pool supplies the parallelism. */
    expect_json_integer(&t, blas, "blas", "threads", 1);
    json_int_t cpus = json_integer_value(json_object_get(compute, "available_cpus"));
    expect_true(&t, cpus >= 1, "compute.available_cpus is not a positive integer");
    expect_json_integer(&t, compute, "compute", "threads",
                        g_expected_compute_threads[id] ? g_expected_compute_threads[id] : cpus);
    expect_json_integer(&t, limits, "limits", "max_body_bytes", g_expected_max_body[id]);
    expect_json_integer(&t, limits, "limits", "max_elements", g_expected_max_elements[id]);
    expect_true(&t, has64 && has32, "dtypes does not list both float64 and float32");
done:
    json_decref(body);
    client_response_free(&r);
    test_end(&t);
}

/* Sends a CORS preflight for path and checks the answer; allow_method must be listed. */
static void check_preflight(const char *name, enum server_id id, const char *path, const char *request_target,
                            const char *allow_method)
{
    struct test t;
    struct server *s;
    if (!test_start(&t, id, &s, name))
        return;
    struct client_request rq = {.method = "OPTIONS", .path = path, .request_target = request_target};
    rq.headers[0] = "Origin: https://viz.example";
    rq.headers[1] = "Access-Control-Request-Method: POST";
    rq.headers[2] = "Access-Control-Request-Headers: content-type";
    struct client_response r;
    http_call(s, &rq, &r);
    if (r.status != 204)
        expect_status(&t, &r, 200); /* 204 is what DESIGN.md says; 200 is tolerated */
    expect_header_equals(&t, &r, "Access-Control-Allow-Origin", g_expected_origin[id]);
    expect_header_contains(&t, &r, "Access-Control-Allow-Methods", allow_method);
    expect_true(&t, client_header(&r, "Access-Control-Allow-Headers") != NULL, "no Access-Control-Allow-Headers");
    expect_true(&t, client_header(&r, "Access-Control-Max-Age") != NULL, "no Access-Control-Max-Age");
    client_response_free(&r);
    test_end(&t);
}

/* Sends one request and checks status and the exact Access-Control-Allow-Origin value. */
static void check_cors_origin(const char *name, enum server_id id, const char *method, const char *path,
                              const char *body, int want_status)
{
    struct test t;
    struct server *s;
    if (!test_start(&t, id, &s, name))
        return;
    struct client_request rq = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
    rq.headers[0] = "Origin: https://viz.example";
    struct client_response r;
    http_call(s, &rq, &r);
    expect_status(&t, &r, want_status);
    expect_header_equals(&t, &r, "Access-Control-Allow-Origin", g_expected_origin[id]);
    client_response_free(&r);
    test_end(&t);
}

/* GETs path and checks a 200 JSON answer whose "status" member is want_status_text. */
static void check_status_endpoint(const char *name, const char *path, const char *want_status_text)
{
    struct test t;
    struct server *s;
    if (!test_start(&t, SERVER_DEFAULT, &s, name))
        return;
    struct client_response r;
    http_simple(s, "GET", path, &r);
    if (expect_status(&t, &r, 200)) {
        json_t *body = response_json(&r);
        const char *status = json_string_value(json_object_get(body, "status"));
        expect_true(&t, status != NULL && strcmp(status, want_status_text) == 0,
                    "body \"status\" is %s, expected \"%s\"", status ? status : "(missing)", want_status_text);
        expect_header_contains(&t, &r, "Content-Type", "application/json");
        json_decref(body);
    }
    client_response_free(&r);
    test_end(&t);
}

/*
 * Health, readiness, info, metrics, HEAD, CORS (preflight, on every kind of response,
 * with a configured origin) and the Allow header of 405 answers.
 */
static void run_protocol_tests(void)
{
    struct test t;
    struct client_response r;
    struct server *s;

    check_status_endpoint("protocol/healthz", "/healthz", "ok");
    check_status_endpoint("protocol/readyz", "/readyz", "ready");

    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/head-healthz")) {
        http_simple(s, "HEAD", "/healthz", &r);
        expect_status(&t, &r, 200);
        expect_true(&t, client_header(&r, "Access-Control-Allow-Origin") != NULL,
                    "no Access-Control-Allow-Origin header");
        client_response_free(&r);
        test_end(&t);
    }

    check_info(SERVER_DEFAULT);
    check_info(SERVER_SMALL_LIMITS);
    check_info(SERVER_CORS);

    /* Metrics come after some traffic, so the request counter must have a 200 in it. */
    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/metrics")) {
        static const char *const names[] = {"attn_http_requests_total", "attn_http_request_duration_seconds",
                                            "attn_http_request_bytes_total", "attn_http_response_bytes_total",
                                            "attn_http_inflight_requests"};
        http_simple(s, "GET", "/metrics", &r);
        if (expect_status(&t, &r, 200)) {
            expect_header_contains(&t, &r, "Content-Type", "text/plain");
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                expect_true(&t, strstr(r.body, names[i]) != NULL, "no %s in the metrics text", names[i]);
            /* Some line attn_http_requests_total{...code="200"...} N must have N >= 1. */
            int counted = 0;
            for (const char *line = r.body; line != NULL && *line != '\0';) {
                const char *end = strchr(line, '\n');
                size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
                char buf[512];
                snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
                const char *close = strrchr(buf, '}');
                if (strncmp(buf, "attn_http_requests_total{", 25) == 0 && strstr(buf, "code=\"200\"") != NULL &&
                    close != NULL && strtod(close + 1, NULL) >= 1.0)
                    counted = 1;
                line = end != NULL ? end + 1 : NULL;
            }
            expect_true(&t, counted, "no attn_http_requests_total{...code=\"200\"...} line with a count >= 1");
        }
        client_response_free(&r);
        test_end(&t);
    }

    check_preflight("protocol/preflight/attention", SERVER_DEFAULT, "/v1/attention", NULL, "POST");
    check_preflight("protocol/preflight/healthz", SERVER_DEFAULT, "/healthz", NULL, "GET");
    check_preflight("protocol/preflight/asterisk", SERVER_DEFAULT, "/", "*", "POST");
    check_preflight("protocol/preflight/configured-origin", SERVER_CORS, "/v1/attention", NULL, "POST");

    check_cors_origin("protocol/cors/200", SERVER_DEFAULT, "POST", "/v1/attention", g_tiny_request, 200);
    check_cors_origin("protocol/cors/400", SERVER_DEFAULT, "POST", "/v1/attention", "{\"q\":", 400);
    check_cors_origin("protocol/cors/404", SERVER_DEFAULT, "GET", "/no/such/path", NULL, 404);
    check_cors_origin("protocol/cors/405", SERVER_DEFAULT, "GET", "/v1/attention", NULL, 405);
    check_cors_origin("protocol/cors/configured-origin-200", SERVER_CORS, "GET", "/healthz", NULL, 200);
    check_cors_origin("protocol/cors/configured-origin-attention", SERVER_CORS, "POST", "/v1/attention",
                      g_tiny_request, 200);
    check_cors_origin("protocol/cors/configured-origin-400", SERVER_CORS, "POST", "/v1/attention", "[]", 400);
    check_cors_origin("protocol/cors/configured-origin-404", SERVER_CORS, "GET", "/nothing", NULL, 404);

    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/405-allow/attention")) {
        http_simple(s, "GET", "/v1/attention", &r);
        expect_status(&t, &r, 405);
        expect_header_contains(&t, &r, "Allow", "POST");
        expect_header_contains(&t, &r, "Allow", "OPTIONS");
        client_response_free(&r);
        test_end(&t);
    }
    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/405-allow/healthz")) {
        http_simple(s, "POST", "/healthz", &r);
        expect_status(&t, &r, 405);
        expect_header_contains(&t, &r, "Allow", "GET");
        client_response_free(&r);
        test_end(&t);
    }
    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/attention-content-type")) {
        http_text(s, "POST", "/v1/attention", g_tiny_request, &r);
        expect_status(&t, &r, 200);
        expect_header_contains(&t, &r, "Content-Type", "application/json");
        client_response_free(&r);
        test_end(&t);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Group d: randomized requests against the reference                                    */
/* ------------------------------------------------------------------------------------ */

enum input_mode { INPUT_QKV, INPUT_X, INPUT_X_CONTEXT };

/*
 * One randomized request. Zero means "absent / default" for every member, so the table
 * below names only what a case varies. Widths dk and dv are per head.
 */
struct random_case {
    const char *name;
    enum input_mode mode; /* q/k/v given directly, x with weights, or x and context */
    size_t batch;         /* 0: 2-D input; n >= 1: 3-D input with n batch entries */
    size_t heads;         /* 0: no "heads" field (and no head axis in attention) */
    size_t lq, lk;        /* lk is ignored for INPUT_X (self-attention: lk = lq) */
    size_t dk, dv;
    size_t d_model;       /* width of x */
    size_t d_context;     /* width of context */
    size_t d_out;         /* 0: no wo; else wo is (heads*dv x d_out) */
    int biases;           /* send bq, bk, bv */
    int bo;               /* send bo (needs d_out) */
    int causal;
    int mask_rank;        /* 0: no mask; 2: one Lq x Lk mask; 3: one per batch entry */
    int mask_numeric;     /* send the mask as 0/1 instead of false/true */
    size_t blocked_row;   /* 1-based query row whose mask is all false; 0: none */
    double scale;         /* 0: default 1/sqrt(dk) */
    double magnitude;     /* spread of q/k/v/x/context values; 0 means 1 */
    int columns;          /* layout "columns" */
    int out_in;           /* weights_layout "out_in" */
    int float32;          /* dtype "float32" */
    int no_attention;     /* return_attention false */
    int explicit_defaults; /* spell out causal/layout/dtype/return_attention defaults */
};

static const struct random_case g_random_cases[] = {
    {.name = "qkv-square", .lq = 3, .lk = 3, .dk = 4, .dv = 4},
    {.name = "qkv-lq-ne-lk-dv-ne-dk", .lq = 2, .lk = 5, .dk = 3, .dv = 6},
    {.name = "qkv-single-token", .lq = 1, .lk = 1, .dk = 1, .dv = 1},
    {.name = "qkv-one-query-many-keys", .lq = 1, .lk = 7, .dk = 5, .dv = 2},
    {.name = "qkv-explicit-defaults", .lq = 3, .lk = 4, .dk = 2, .dv = 3, .explicit_defaults = 1},
    {.name = "heads-2", .heads = 2, .lq = 4, .lk = 4, .dk = 4, .dv = 4},
    {.name = "heads-1-keeps-head-axis", .heads = 1, .lq = 3, .lk = 2, .dk = 3, .dv = 2},
    {.name = "heads-4-dv-ne-dk", .heads = 4, .lq = 3, .lk = 5, .dk = 2, .dv = 3},
    {.name = "batched-2", .batch = 2, .lq = 3, .lk = 4, .dk = 3, .dv = 2},
    {.name = "batched-1-keeps-batch-axis", .batch = 1, .lq = 2, .lk = 2, .dk = 2, .dv = 2},
    {.name = "batched-3-heads-2", .batch = 3, .heads = 2, .lq = 2, .lk = 3, .dk = 2, .dv = 2},
    {.name = "causal-square", .causal = 1, .lq = 4, .lk = 4, .dk = 3, .dv = 3},
    {.name = "causal-lq-lt-lk", .causal = 1, .lq = 3, .lk = 5, .dk = 2, .dv = 4},
    {.name = "causal-lq-gt-lk", .causal = 1, .lq = 5, .lk = 3, .dk = 2, .dv = 2},
    {.name = "causal-batched-heads", .causal = 1, .batch = 2, .heads = 2, .lq = 4, .lk = 4, .dk = 2, .dv = 3},
    {.name = "mask-2d", .mask_rank = 2, .lq = 4, .lk = 5, .dk = 3, .dv = 2},
    {.name = "mask-2d-numeric", .mask_rank = 2, .mask_numeric = 1, .lq = 3, .lk = 3, .dk = 2, .dv = 2},
    {.name = "mask-2d-broadcast-over-batch", .mask_rank = 2, .batch = 3, .lq = 3, .lk = 4, .dk = 2, .dv = 2},
    {.name = "mask-3d-batched", .mask_rank = 3, .batch = 2, .lq = 3, .lk = 4, .dk = 2, .dv = 3},
    {.name = "mask-2d-and-causal", .mask_rank = 2, .causal = 1, .lq = 5, .lk = 5, .dk = 3, .dv = 2},
    {.name = "mask-3d-causal-heads", .mask_rank = 3, .causal = 1, .batch = 2, .heads = 2, .lq = 4, .lk = 6,
     .dk = 2, .dv = 2},
    {.name = "fully-masked-row", .mask_rank = 2, .blocked_row = 2, .lq = 3, .lk = 4, .dk = 2, .dv = 3},
    {.name = "fully-masked-row-causal-heads-batched", .mask_rank = 3, .blocked_row = 1, .causal = 1, .batch = 2,
     .heads = 2, .lq = 3, .lk = 3, .dk = 2, .dv = 2},
    {.name = "scale-custom", .scale = 0.3, .lq = 3, .lk = 4, .dk = 4, .dv = 2},
    {.name = "scale-large-logits-stable", .scale = 50, .magnitude = 3, .lq = 4, .lk = 4, .dk = 8, .dv = 2},
    {.name = "x-self-explicit-defaults", .mode = INPUT_X, .lq = 4, .d_model = 5, .dk = 3, .dv = 4,
     .explicit_defaults = 1},
    {.name = "x-biases-heads", .mode = INPUT_X, .biases = 1, .heads = 2, .lq = 3, .d_model = 4, .dk = 2, .dv = 3},
    {.name = "x-wo-bo-heads", .mode = INPUT_X, .biases = 1, .heads = 3, .d_out = 5, .bo = 1, .lq = 4, .d_model = 6,
     .dk = 2, .dv = 2},
    {.name = "x-wo-without-bo", .mode = INPUT_X, .d_out = 3, .lq = 3, .d_model = 4, .dk = 4, .dv = 2},
    {.name = "x-batched-causal-heads", .mode = INPUT_X, .batch = 2, .heads = 2, .causal = 1, .biases = 1, .lq = 4,
     .d_model = 3, .dk = 2, .dv = 2},
    {.name = "context-cross-attention", .mode = INPUT_X_CONTEXT, .biases = 1, .lq = 3, .lk = 6, .d_model = 4,
     .d_context = 5, .dk = 3, .dv = 2},
    {.name = "context-batched-heads-wo-causal", .mode = INPUT_X_CONTEXT, .batch = 2, .heads = 2, .causal = 1,
     .lq = 2, .lk = 4, .d_model = 3, .d_context = 2, .dk = 2, .dv = 3, .d_out = 4, .bo = 1},
    {.name = "layout-columns-qkv", .columns = 1, .lq = 3, .lk = 5, .dk = 4, .dv = 2},
    {.name = "layout-columns-batched-heads-mask", .columns = 1, .batch = 2, .heads = 2, .mask_rank = 3, .lq = 3,
     .lk = 4, .dk = 2, .dv = 3},
    {.name = "layout-columns-x-context", .mode = INPUT_X_CONTEXT, .columns = 1, .biases = 1, .lq = 2, .lk = 5,
     .d_model = 3, .d_context = 4, .dk = 2, .dv = 3},
    {.name = "weights-out-in", .mode = INPUT_X, .out_in = 1, .biases = 1, .lq = 4, .d_model = 3, .dk = 5, .dv = 2},
    {.name = "weights-out-in-columns-wo", .mode = INPUT_X, .out_in = 1, .columns = 1, .heads = 2, .d_out = 3,
     .bo = 1, .lq = 3, .d_model = 5, .dk = 2, .dv = 2},
    {.name = "float32-qkv", .float32 = 1, .lq = 4, .lk = 3, .dk = 5, .dv = 3},
    {.name = "float32-x-heads-causal-mask", .float32 = 1, .mode = INPUT_X, .heads = 2, .causal = 1, .biases = 1,
     .mask_rank = 2, .lq = 4, .d_model = 4, .dk = 3, .dv = 2},
    {.name = "no-attention", .no_attention = 1, .lq = 3, .lk = 4, .dk = 2, .dv = 2},
    {.name = "no-attention-batched-heads", .no_attention = 1, .batch = 2, .heads = 2, .lq = 2, .lk = 3, .dk = 2,
     .dv = 2},
};

/* Returns a uniform number in [-1, 1). */
static double rng_uniform(uint64_t *state)
{
    return (double)(client_rng_next(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

/* Fills n values uniform in [-magnitude, magnitude), rounded to float when float32. */
static double *random_values(uint64_t *state, size_t n, double magnitude, int float32)
{
    double *a = client_xcalloc(n, sizeof *a);
    for (size_t i = 0; i < n; i++) {
        a[i] = magnitude * rng_uniform(state);
        if (float32)
            a[i] = (double)(float)a[i];
    }
    return a;
}

/* Everything a randomized case allocates, so that one loop frees it. */
struct case_buffers {
    double *x, *context, *q, *k, *v, *w[4], *b[4], *out, *attn, *final;
    unsigned char *mask;
};

static void case_buffers_free(struct case_buffers *cb)
{
    free(cb->x);
    free(cb->context);
    free(cb->q);
    free(cb->k);
    free(cb->v);
    for (int i = 0; i < 4; i++) {
        free(cb->w[i]);
        free(cb->b[i]);
    }
    free(cb->out);
    free(cb->attn);
    free(cb->final);
    free(cb->mask);
}

/* Checks a meta member that must be the integer want, or null when want is -1. */
static void expect_meta(struct test *t, const json_t *meta, const char *key, long long want)
{
    const json_t *v = json_object_get(meta, key);
    if (want < 0)
        expect_true(t, json_is_null(v), "meta.%s should be null", key);
    else
        expect_json_integer(t, meta, "meta", key, want);
}

/* Checks that a JSON row exists and holds only exact zeros. */
static void expect_zero_row(struct test *t, const json_t *row, const char *what, size_t n, size_t h, size_t i)
{
    int ok = json_is_array(row) && json_array_size(row) > 0;
    for (size_t j = 0; ok && j < json_array_size(row); j++)
        ok = json_is_number(json_array_get(row, j)) && json_number_value(json_array_get(row, j)) == 0.0;
    expect_true(t, ok, "fully masked query row %zu (batch entry %zu, head %zu) of %s is not all zeros", i, n, h,
                what);
}

/*
 * Checks, independently of the reference, that query row i is zero in the output and
 * in the attention of every batch entry and head. Valid for layout "rows" without wo
 * (with wo the row would be bo, in columns layout it is a column).
 */
static void expect_masked_row_zero(struct test *t, const json_t *body, size_t i, int batched, int has_heads)
{
    const json_t *out = json_object_get(body, "output");
    const json_t *attn = json_object_get(body, "attention");
    size_t batch = batched ? json_array_size(out) : 1;
    for (size_t n = 0; n < batch; n++) {
        const json_t *out_n = batched ? json_array_get(out, n) : out;
        const json_t *attn_n = batched ? json_array_get(attn, n) : attn;
        expect_zero_row(t, json_array_get(out_n, i), "output", n, 0, i);
        size_t heads = has_heads ? json_array_size(attn_n) : 1;
        for (size_t h = 0; h < heads; h++) {
            const json_t *attn_h = has_heads ? json_array_get(attn_n, h) : attn_n;
            expect_zero_row(t, json_array_get(attn_h, i), "attention", n, h, i);
        }
    }
}

/*
 * Builds the request of one random case together with the answer the reference gives,
 * sends it, and reports two tests: "random/NAME" (status, output, attention and its
 * shape) and "random/NAME/meta" (the meta block of DESIGN.md).
 */
static void run_random_case(const struct random_case *rc, size_t index)
{
    struct test t;
    if (!test_begin(&t, "random/%s", rc->name))
        return;

    uint64_t rng = RANDOM_SEED + 7919u * (uint64_t)index;
    const int batched = rc->batch > 0;
    const size_t batch = batched ? rc->batch : 1;
    const size_t heads = rc->heads > 0 ? rc->heads : 1;
    const size_t lq = rc->lq;
    const size_t lk = rc->mode == INPUT_X ? rc->lq : rc->lk;
    const size_t qk_width = heads * rc->dk, v_width = heads * rc->dv;
    const size_t d_final = rc->d_out > 0 ? rc->d_out : v_width;
    const double magnitude = rc->magnitude > 0 ? rc->magnitude : 1.0;
    const double scale = rc->scale > 0 ? rc->scale : ref_default_scale(rc->dk);
    const int f32 = rc->float32;
    struct case_buffers cb = {0};
    json_t *req = json_object();
    json_t *want_output = NULL, *want_attention = NULL, *body = NULL;
    struct client_response r = {0};
    struct server *s;

    /* Inputs: q/k/v directly, or x (and context) projected by the weights. */
    if (rc->mode == INPUT_QKV) {
        cb.q = random_values(&rng, batch * lq * qk_width, magnitude, f32);
        cb.k = random_values(&rng, batch * lk * qk_width, magnitude, f32);
        cb.v = random_values(&rng, batch * lk * v_width, magnitude, f32);
        json_object_set_new(req, "q", json_tensor(cb.q, batch, lq, qk_width, batched, rc->columns));
        json_object_set_new(req, "k", json_tensor(cb.k, batch, lk, qk_width, batched, rc->columns));
        json_object_set_new(req, "v", json_tensor(cb.v, batch, lk, v_width, batched, rc->columns));
    } else {
        static const char *const wname[4] = {"wq", "wk", "wv", "wo"};
        static const char *const bname[4] = {"bq", "bk", "bv", "bo"};
        const int has_context = rc->mode == INPUT_X_CONTEXT;
        const size_t d_source = has_context ? rc->d_context : rc->d_model; /* where k and v come from */
        const size_t w_rows[4] = {rc->d_model, d_source, d_source, v_width};
        const size_t w_cols[4] = {qk_width, qk_width, v_width, rc->d_out};
        const int has_bias[4] = {rc->biases, rc->biases, rc->biases, rc->bo};
        cb.x = random_values(&rng, batch * lq * rc->d_model, magnitude, f32);
        json_object_set_new(req, "x", json_tensor(cb.x, batch, lq, rc->d_model, batched, rc->columns));
        const double *source = cb.x;
        if (has_context) {
            cb.context = random_values(&rng, batch * lk * rc->d_context, magnitude, f32);
            json_object_set_new(req, "context",
                                json_tensor(cb.context, batch, lk, rc->d_context, batched, rc->columns));
            source = cb.context;
        }
        json_t *weights = json_object();
        for (int i = 0; i < 4; i++) {
            if (w_cols[i] == 0)
                continue; /* no wo */
            /* Weights are kept (d_in x d_out) here and sent transposed for "out_in". */
            cb.w[i] = random_values(&rng, w_rows[i] * w_cols[i], 1.0 / sqrt((double)w_rows[i]), f32);
            json_object_set_new(weights, wname[i], json_matrix(cb.w[i], w_rows[i], w_cols[i], rc->out_in));
            if (has_bias[i]) {
                cb.b[i] = random_values(&rng, w_cols[i], 0.5, f32);
                json_t *bias = json_array();
                for (size_t c = 0; c < w_cols[i]; c++)
                    json_array_append_new(bias, json_real(cb.b[i][c]));
                json_object_set_new(weights, bname[i], bias);
            }
        }
        json_object_set_new(req, "weights", weights);
        /* The projections are row-wise, so all batch entries go through one call. */
        cb.q = client_xcalloc(batch * lq * qk_width, sizeof(double));
        cb.k = client_xcalloc(batch * lk * qk_width, sizeof(double));
        cb.v = client_xcalloc(batch * lk * v_width, sizeof(double));
        ref_linear(batch * lq, rc->d_model, qk_width, cb.x, cb.w[0], cb.b[0], cb.q);
        ref_linear(batch * lk, d_source, qk_width, source, cb.w[1], cb.b[1], cb.k);
        ref_linear(batch * lk, d_source, v_width, source, cb.w[2], cb.b[2], cb.v);
    }

    /* Options. */
    if (rc->heads > 0)
        json_object_set_new(req, "heads", json_integer((json_int_t)rc->heads));
    if (rc->causal || rc->explicit_defaults)
        json_object_set_new(req, "causal", json_boolean(rc->causal));
    if (rc->scale > 0)
        json_object_set_new(req, "scale", json_real(rc->scale));
    if (rc->columns || rc->explicit_defaults)
        json_object_set_new(req, "layout", json_string(rc->columns ? "columns" : "rows"));
    if (rc->mode != INPUT_QKV && (rc->out_in || rc->explicit_defaults))
        json_object_set_new(req, "weights_layout", json_string(rc->out_in ? "out_in" : "in_out"));
    if (rc->float32 || rc->explicit_defaults)
        json_object_set_new(req, "dtype", json_string(rc->float32 ? "float32" : "float64"));
    if (rc->no_attention || rc->explicit_defaults)
        json_object_set_new(req, "return_attention", json_boolean(!rc->no_attention));
    if (rc->mask_rank > 0) {
        /* A 2-D mask is drawn once and repeated for the reference, as the server broadcasts it. */
        size_t drawn = rc->mask_rank == 3 ? batch : 1;
        cb.mask = client_xcalloc(batch * lq * lk, 1);
        for (size_t n = 0; n < drawn; n++)
            for (size_t e = 0; e < lq * lk; e++)
                cb.mask[n * lq * lk + e] = rng_uniform(&rng) < 0.4; /* about 70% allowed */
        if (rc->blocked_row > 0)
            for (size_t n = 0; n < drawn; n++)
                memset(&cb.mask[(n * lq + rc->blocked_row - 1) * lk], 0, lk);
        for (size_t n = drawn; n < batch; n++)
            memcpy(&cb.mask[n * lq * lk], cb.mask, lq * lk);
        json_object_set_new(req, "mask", json_mask(cb.mask, drawn, lq, lk, rc->mask_rank == 3, rc->mask_numeric));
    }

    /* The reference answer, shaped as the contract says. */
    cb.out = client_xcalloc(batch * lq * v_width, sizeof(double));
    cb.attn = client_xcalloc(batch * heads * lq * lk, sizeof(double));
    ref_sdpa(batch, heads, lq, lk, rc->dk, rc->dv, cb.q, cb.k, cb.v, cb.mask, rc->causal, scale, cb.out, cb.attn);
    const double *final = cb.out;
    if (rc->d_out > 0) {
        cb.final = client_xcalloc(batch * lq * rc->d_out, sizeof(double));
        ref_linear(batch * lq, v_width, rc->d_out, cb.out, cb.w[3], cb.b[3], cb.final);
        final = cb.final;
    }
    want_output = json_tensor(final, batch, lq, d_final, batched, rc->columns);
    want_attention = json_attention(cb.attn, batch, heads, lq, lk, batched, rc->heads > 0);

    double abs_tol = f32 ? FLOAT32_TOLERANCE : FLOAT64_TOLERANCE;
    double rel_tol = f32 ? FLOAT32_TOLERANCE : 0.0;
    if ((s = test_server(&t, SERVER_DEFAULT)) == NULL)
        goto done;
    http_post_json(s, "/v1/attention", req, &r);
    if (!expect_status(&t, &r, 200))
        goto done;
    body = response_json(&r);
    if (!expect_true(&t, json_is_object(body), "response is not a JSON object"))
        goto done;
    expect_close(&t, body, "output", want_output, abs_tol, rel_tol);
    if (rc->no_attention)
        expect_true(&t, json_object_get(body, "attention") == NULL,
                    "\"attention\" is present although return_attention was false");
    else
        expect_close(&t, body, "attention", want_attention, abs_tol, rel_tol);
    if (rc->blocked_row > 0 && !rc->columns && rc->d_out == 0 && !rc->no_attention)
        expect_masked_row_zero(&t, body, rc->blocked_row - 1, batched, rc->heads > 0);
done:
    test_end(&t);

    /* The meta block, as a separate test so that a meta slip does not hide the math. */
    if (body != NULL && test_begin(&t, "random/%s/meta", rc->name)) {
        const json_t *meta = json_object_get(body, "meta");
        if (expect_true(&t, json_is_object(meta), "no meta object")) {
            const char *dtype = json_string_value(json_object_get(meta, "dtype"));
            const char *want_dtype = f32 ? "float32" : "float64";
            expect_true(&t, dtype != NULL && strcmp(dtype, want_dtype) == 0, "meta.dtype is %s, expected %s",
                        dtype ? dtype : "(missing)", want_dtype);
            expect_meta(&t, meta, "batch", batched ? (long long)batch : -1);
            expect_meta(&t, meta, "heads", rc->heads > 0 ? (long long)heads : -1);
            expect_meta(&t, meta, "lq", (long long)lq);
            expect_meta(&t, meta, "lk", (long long)lk);
            expect_meta(&t, meta, "dk", (long long)rc->dk);
            expect_meta(&t, meta, "dv", (long long)rc->dv);
            expect_meta(&t, meta, "d_out", (long long)d_final);
            const json_t *got_scale = json_object_get(meta, "scale");
            expect_true(&t, json_is_number(got_scale) &&
                                fabs(json_number_value(got_scale) - scale) <= (f32 ? 1e-6 : 1e-12) * scale,
                        "meta.scale is %.17g, expected %.17g", json_number_value(got_scale), scale);
        }
        test_end(&t);
    }

    json_decref(req);
    json_decref(want_output);
    json_decref(want_attention);
    json_decref(body);
    client_response_free(&r);
    case_buffers_free(&cb);
}

/* Runs every case of the table above. */
static void run_random_tests(void)
{
    for (size_t i = 0; i < sizeof g_random_cases / sizeof g_random_cases[0]; i++)
        run_random_case(&g_random_cases[i], i);
}

/* ------------------------------------------------------------------------------------ */
/* Group e: concurrency smoke test                                                       */
/* ------------------------------------------------------------------------------------ */

#define CONCURRENT_VALID 8
#define CONCURRENT_GARBAGE 2
#define CONCURRENT_ROUNDS 3

/*
 * Sends CONCURRENT_VALID copies of the largest 200-fixture at once, while other curl
 * processes send garbage, for a few rounds. Every valid request must get the fixture's
 * answer and every garbage request a 400 invalid_json.
 */
static void run_concurrency_tests(const char *fixture_dir)
{
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

/* ------------------------------------------------------------------------------------ */
/* Helpers of the weight-set groups                                                      */
/* ------------------------------------------------------------------------------------ */

/* The members of a weight set that hold numbers, in the order of the file format. */
static const char *const g_set_members[8] = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"};

/*
 * Starts a step of a sequence of tests that build on each other (a set stored by one is
 * read by the next): like test_start, but the step runs whenever the server is up, even
 * when --filter leaves its report out, so that later steps find what it made. *report
 * says whether step_end prints it.
 */
static int step_start(struct test *t, enum server_id id, struct server **s, const char *name, int *report)
{
    *report = test_begin(t, "%s", name);
    if ((*s = server_get(id)) != NULL)
        return 1;
    if (*report) {
        test_server(t, id);
        test_end(t);
    }
    return 0;
}

static void step_end(struct test *t, int report)
{
    if (report)
        test_end(t);
}

/* Returns 1 when --filter selects any of the NULL-terminated test names. */
static int any_selected(const char *const *names)
{
    for (size_t i = 0; names[i] != NULL; i++)
        if (g_filter == NULL || strstr(names[i], g_filter) != NULL)
            return 1;
    return 0;
}

/*
 * Checks that r is an error answer with this status and code. field: NULL leaves
 * error.field unchecked, "" requires it to be absent, anything else must equal it.
 * Returns 1 when everything holds.
 */
static int expect_error(struct test *t, const struct client_response *r, int status, const char *code,
                        const char *field)
{
    if (!expect_status(t, r, status))
        return 0;
    json_t *body = NULL;
    const json_t *error = expect_error_body(t, r, &body);
    int ok = error != NULL;
    if (ok) {
        const char *got = json_string_value(json_object_get(error, "code"));
        const char *got_field = json_string_value(json_object_get(error, "field"));
        ok = expect_true(t, strcmp(got, code) == 0, "error code \"%s\", expected \"%s\"", got, code);
        if (ok && field != NULL && field[0] == '\0')
            ok = expect_true(t, got_field == NULL, "error.field is \"%s\", expected none", got_field);
        else if (ok && field != NULL)
            ok = expect_true(t, got_field != NULL && strcmp(got_field, field) == 0, "error.field is %s%s%s, expected \"%s\"",
                             got_field ? "\"" : "", got_field ? got_field : "absent", got_field ? "\"" : "", field);
    }
    if (!ok) {
        char snippet[400];
        body_snippet(r->body, r->body_len, snippet, sizeof snippet);
        test_detail(t, "    response body: %s", snippet);
    }
    json_decref(body);
    return ok;
}

static uint64_t double_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/*
 * Compares got with want: objects member by member (the same members both ways), arrays
 * element by element, strings, booleans and null by value, and numbers by the bits of
 * their doubles when bits is set, else by value (so 1 equals 1.0). path (a buffer of
 * path_cap bytes, the position so far) is extended in place and restored. Returns 1 when
 * equal; otherwise 0 with the first difference in why.
 */
static int json_same(const json_t *got, const json_t *want, int bits, char *path, size_t path_cap, char *why,
                     size_t why_cap)
{
    size_t base = strlen(path);
    if (got == NULL) {
        snprintf(why, why_cap, "%s is missing", path[0] ? path : "the value");
        return 0;
    }
    if (json_is_number(want)) {
        if (!json_is_number(got)) {
            snprintf(why, why_cap, "%s is not a number, expected %.17g", path, json_number_value(want));
            return 0;
        }
        double g = json_number_value(got), w = json_number_value(want);
        if (bits ? double_bits(g) != double_bits(w) : g != w) {
            snprintf(why, why_cap, "%s is %.17g (bits %016llx), expected %.17g (bits %016llx)", path, g,
                     (unsigned long long)double_bits(g), w, (unsigned long long)double_bits(w));
            return 0;
        }
        return 1;
    }
    if (json_is_array(want)) {
        if (!json_is_array(got) || json_array_size(got) != json_array_size(want)) {
            snprintf(why, why_cap, "%s is %s of %zu, expected an array of %zu", path,
                     json_is_array(got) ? "an array" : "not an array", json_array_size(got), json_array_size(want));
            return 0;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + base, path_cap - base, "[%zu]", i);
            if (!json_same(json_array_get(got, i), json_array_get(want, i), bits, path, path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (json_is_object(want)) {
        if (!json_is_object(got)) {
            snprintf(why, why_cap, "%s is not an object", path[0] ? path : "the value");
            return 0;
        }
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)got, key, member) {
            (void)member;
            if (json_object_get(want, key) == NULL) {
                snprintf(why, why_cap, "%s%s%s is not expected", path, path[0] ? "." : "", key);
                return 0;
            }
        }
        json_object_foreach((json_t *)want, key, member) {
            snprintf(path + base, path_cap - base, "%s%s", base ? "." : "", key);
            if (!json_same(json_object_get(got, key), member, bits, path, path_cap, why, why_cap))
                return 0;
        }
        path[base] = '\0';
        return 1;
    }
    if (json_is_string(want)) {
        if (!json_is_string(got) || strcmp(json_string_value(got), json_string_value(want)) != 0) {
            snprintf(why, why_cap, "%s is %s%s%s, expected \"%s\"", path, json_is_string(got) ? "\"" : "",
                     json_is_string(got) ? json_string_value(got) : "not a string", json_is_string(got) ? "\"" : "",
                     json_string_value(want));
            return 0;
        }
        return 1;
    }
    if (json_typeof(got) != json_typeof(want)) {
        snprintf(why, why_cap, "%s differs (true/false/null)", path);
        return 0;
    }
    return 1;
}

/* json_same from the root, recording a difference in t; what names the two values. */
static int expect_same(struct test *t, const json_t *got, const json_t *want, int bits, const char *what)
{
    char path[512] = "", why[1024];
    int ok = json_same(got, want, bits, path, sizeof path, why, sizeof why);
    return expect_true(t, ok, "%s: %s", what, why);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

/* Parses an RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SS[.frac]Z" (or +00:00); returns Unix
 * seconds, or -1 when the text is not such a time. */
static double parse_utc_time(const char *text)
{
    int y, mo, d, h, mi, n = 0;
    double sec;
    if (text == NULL || strlen(text) < 20 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != 't') ||
        sscanf(text, "%4d-%2d-%2d%*c%2d:%2d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6)
        return -1;
    const char *zone = text + n;
    if (strcmp(zone, "Z") != 0 && strcmp(zone, "z") != 0 && strcmp(zone, "+00:00") != 0)
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec < 0 || sec >= 61)
        return -1;
    return (double)days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
}

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

/* Checks that dir holds exactly the entries it held before (a snapshot from dir_entries). */
static void expect_dir_unchanged(struct test *t, const char *dir, char **before)
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

/* Returns the size of a file, or -1 when it does not exist. */
static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* The path of a set's file as README documents it: DATA_DIR/NAME.wset. */
static void set_file_path(char *out, size_t cap, const char *data_dir, const char *name)
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

/*
 * Checks a weight-set summary (the answer to a PUT, or an entry of the list) against the
 * set that was sent under name: name, weights_layout, heads (null when the set has none),
 * shapes as written, parameters, size_bytes (the size of NAME.wset in data_dir, when
 * data_dir is not NULL) and stored_at (RFC 3339 UTC, within two minutes of now).
 */
static void expect_set_summary(struct test *t, const json_t *summary, const char *name, const json_t *sent,
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

/*
 * Checks the body of GET /v1/weight-sets/NAME against the set that was PUT: the same
 * numeric members, each number bit for bit and in the shape it was sent (so an out_in set
 * comes back out_in), weights_layout as sent (in_out when the PUT had none), and heads as
 * sent (absent or null when the PUT had none).
 */
static void expect_set_body(struct test *t, const json_t *got, const json_t *sent)
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

/* Parses JSON text that this program wrote (aborts on a typo, which is a bug here). */
static json_t *json_from_text(const char *text)
{
    json_error_t error;
    json_t *v = json_loads(text, 0, &error);
    if (v == NULL) {
        fprintf(stderr, "itest: bad built-in JSON at line %d: %s\n", error.line, error.text);
        exit(2);
    }
    return v;
}

/* GETs the list and returns its weight_sets array (a new reference), or NULL after
 * recording the failure in t. */
static json_t *get_set_list(struct test *t, const struct server *s)
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

/* Returns the entry named name of a weight_sets array (borrowed), or NULL. */
static const json_t *list_find(const json_t *list, const char *name)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(list, i), "name"));
        if (n != NULL && strcmp(n, name) == 0)
            return json_array_get(list, i);
    }
    return NULL;
}

/* PUTs a set given as JSON text and checks the status; returns the parsed answer (new
 * reference) or NULL. */
static json_t *put_set_text(struct test *t, const struct server *s, const char *name, const char *text, int want)
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

/* Like put_set_text for a JSON value. */
static json_t *put_set(struct test *t, const struct server *s, const char *name, const json_t *set, int want)
{
    char *text = json_dumps(set, JSON_COMPACT);
    json_t *body = put_set_text(t, s, name, text, want);
    free(text);
    return body;
}

/* GETs a set; returns the body (new reference) when the status is want (200), else NULL. */
static json_t *get_set(struct test *t, const struct server *s, const char *name, int want)
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

/* GETs the set name (expecting 200) and checks it against sent with expect_set_body. */
static void expect_stored_set(struct test *t, const struct server *s, const char *name, const json_t *sent)
{
    json_t *body = get_set(t, s, name, 200);
    if (body != NULL)
        expect_set_body(t, body, sent);
    json_decref(body);
}

/* Checks that r is a 405 method_not_allowed error whose Allow header lists every method of
 * allowed (NULL-terminated) but not method, the one that was refused. */
static void expect_method_not_allowed(struct test *t, const struct client_response *r, const char *method,
                                      const char *const *allowed)
{
    if (!expect_error(t, r, 405, "method_not_allowed", NULL))
        return;
    for (size_t i = 0; allowed[i] != NULL; i++)
        expect_header_contains(t, r, "Allow", allowed[i]);
    const char *allow = client_header(r, "Allow");
    expect_true(t, allow == NULL || strstr(allow, method) == NULL, "Allow lists %s: %s", method, allow);
}

/* The step name on server id that only GETs the set set_name and checks it against sent. */
static void step_expect_stored_set(const char *name, enum server_id id, const char *set_name, const json_t *sent)
{
    struct test t;
    struct server *s;
    int report;
    if (step_start(&t, id, &s, name, &report)) {
        expect_stored_set(&t, s, set_name, sent);
        step_end(&t, report);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Group f: weight sets over HTTP                                                        */
/* ------------------------------------------------------------------------------------ */

/* Numbers that a careless formatter or parser would not bring back bit for bit: 0.1, the
 * double nearest 1/3, subnormals down to 5e-324, the largest double, 0.1 + 0.2, ... */
static const char g_awkward_set[] =
    "{\"wq\": [[0.1, 0.3333333333333333, 1e-300], [-2.5e300, 5e-324, 2.2250738585072014e-308]],"
    " \"wk\": [[1.7976931348623157e308, -1e-320, 0.30000000000000004], [123456789.12345679, -7, 1e22]],"
    " \"wv\": [[0.1, 0.2], [0.7, -0.9999999999999999]],"
    " \"wo\": [[0.5], [-0.25]],"
    " \"bq\": [1e-7, -3.0000000000000004, 6.02214076e23], \"bk\": [0, 1, 2], \"bv\": [4.9e-324, 1.1],"
    " \"bo\": [2.718281828459045]}";

/* What replaces it: other shapes (d_in 1, d_ctx 2), heads, and only some biases. */
static const char g_replacement_set[] =
    "{\"heads\": 2, \"wq\": [[0.30000000000000004, -1e-310, 3.141592653589793, 1e300]],"
    " \"wk\": [[2, 4, 8, 16], [0.1, 0.2, 0.3, 0.4]],"
    " \"wv\": [[1.0000000000000002, 0.9999999999999998], [-4.440892098500626e-16, 1e-5]],"
    " \"bk\": [0.5, 0.25, 0.125, 0.0625]}";

/* An out_in set (PyTorch's d_out x d_in) with rectangular matrices, so that a transpose
 * anywhere shows: wq 4x3 (dk 4, d_in 3), wv 2x3 (dv 2), wo 5x2 (d_out 5), two heads. */
static const char g_out_in_set[] =
    "{\"weights_layout\": \"out_in\", \"heads\": 2,"
    " \"wq\": [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [1e-300, -1e300, 5e-324]],"
    " \"wk\": [[-0.1, 0.3333333333333333, 2.5], [0.6666666666666666, -1.5, 0.125], [3, 1e-10, -2e-10],"
    " [0.01, 0.02, 0.03]],"
    " \"wv\": [[1.1, 2.2, 3.3], [-4.4, 5.5, -6.6]],"
    " \"wo\": [[0.5, -0.5], [0.25, 0.75], [1e-3, 1e3], [-0.2, 0.2], [7, 8]],"
    " \"bq\": [0.1, 0.2, 0.3, 0.4], \"bv\": [-1e-200, 1e200], \"bo\": [1, 2, 3, 4, 5]}";

/* A tiny set for names and lists. */
static const char g_tiny_set[] = "{\"wq\": [[1, 0], [0, 1]], \"wk\": [[1, 2], [3, 4]], \"wv\": [[0.5], [0.25]]}";

/* A 65-character name (one too many) and a 64-character one (the longest allowed). */
#define NAME_64 "abcdefghij-ABCDEFGHIJ_0123456789.abcdefghij-ABCDEFGHIJ_012345678"
#define NAME_65 NAME_64 "x"

/*
 * PUT (new and replacing), GET bit for bit in the layout sent, the list, HEAD, DELETE and
 * the 404s after it, names, 405s and preflights, on the default server.
 */
static void run_weight_set_tests(void)
{
    static const char *const names[] = {
        "weight-sets/put-new-201",
        "weight-sets/get-bit-for-bit",
        "weight-sets/put-replace-200",
        "weight-sets/get-after-replace",
        "weight-sets/out-in-round-trip",
        "weight-sets/negative-zero-round-trip",
        "weight-sets/get-body-put-back-unchanged",
        "weight-sets/list",
        "weight-sets/head",
        "weight-sets/delete-then-404",
        "weight-sets/name-too-long-not-stored",
        "weight-sets/name-64-characters",
        "weight-sets/405-post-on-set",
        "weight-sets/405-put-on-list",
        "weight-sets/preflight/put",
        "weight-sets/preflight/delete",
        "weight-sets/preflight/list",
        NULL};
    if (!any_selected(names))
        return;
    int report;

    struct test t;
    struct server *s;
    struct client_response r;
    json_t *awkward = json_from_text(g_awkward_set);
    json_t *replacement = json_from_text(g_replacement_set);
    json_t *out_in = json_from_text(g_out_in_set);
    json_t *put_summary = NULL;
    const char *data_dir = g_servers[SERVER_DEFAULT].data_dir;

    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/put-new-201", &report)) {
        http_text(s, "PUT", "/v1/weight-sets/crud.Set_1", g_awkward_set, &r);
        if (expect_status(&t, &r, 201)) {
            const char *location = client_header(&r, "Location");
            size_t n = location ? strlen(location) : 0, m = strlen("/v1/weight-sets/crud.Set_1");
            expect_true(&t, location != NULL && n >= m && strcmp(location + n - m, "/v1/weight-sets/crud.Set_1") == 0 &&
                                (n == m || strncmp(location, s->base_url, n - m) == 0),
                        "Location is %s, expected /v1/weight-sets/crud.Set_1", location ? location : "missing");
            expect_header_contains(&t, &r, "Content-Type", "application/json");
            json_t *body = response_json(&r);
            expect_set_summary(&t, body, "crud.Set_1", awkward, data_dir);
            json_decref(body);
        }
        client_response_free(&r);
        step_end(&t, report);
    }
    step_expect_stored_set("weight-sets/get-bit-for-bit", SERVER_DEFAULT, "crud.Set_1", awkward);
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/put-replace-200", &report)) {
        json_t *before = get_set(&t, s, "crud.Set_1", 200);
        http_text(s, "PUT", "/v1/weight-sets/crud.Set_1", g_replacement_set, &r);
        if (expect_status(&t, &r, 200)) {
            put_summary = response_json(&r);
            expect_set_summary(&t, put_summary, "crud.Set_1", replacement, data_dir);
            double was = parse_utc_time(json_string_value(json_object_get(before, "stored_at")));
            double now = parse_utc_time(json_string_value(json_object_get(put_summary, "stored_at")));
            expect_true(&t, was < 0 || now >= was, "stored_at went back in time on replacement");
        }
        json_decref(before);
        client_response_free(&r);
        step_end(&t, report);
    }
    step_expect_stored_set("weight-sets/get-after-replace", SERVER_DEFAULT, "crud.Set_1", replacement);
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/out-in-round-trip", &report)) {
        json_t *summary = put_set_text(&t, s, "crud-outin", g_out_in_set, 201);
        if (summary != NULL) {
            expect_set_summary(&t, summary, "crud-outin", out_in, data_dir);
            expect_stored_set(&t, s, "crud-outin", out_in);
        }
        json_decref(summary);
        step_end(&t, report);
    }
    /* -0.0 is a double of its own; "-0" reads back as the integer 0 in most JSON parsers. */
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/negative-zero-round-trip", &report)) {
        static const char text[] = "{\"wq\": [[-0.0, 0.0]], \"wk\": [[1, 2]], \"wv\": [[-0.0]], \"bq\": [-0.0, 1]}";
        json_t *sent = json_from_text(text);
        json_t *summary = put_set_text(&t, s, "crud-negzero", text, 201);
        json_t *body = summary ? get_set(&t, s, "crud-negzero", 200) : NULL;
        if (body != NULL) {
            expect_set_body(&t, body, sent);
            char *got = json_dumps(json_object_get(body, "wq"), JSON_COMPACT);
            test_detail(&t, "    GET answered wq = %s", got ? got : "?");
            free(got);
        }
        json_decref(sent);
        json_decref(summary);
        json_decref(body);
        step_end(&t, report);
    }
    /* api/openapi.yaml: GET returns the set "in the form PUT accepts, so that the body can be
     * sent back unchanged". */
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/get-body-put-back-unchanged", &report)) {
        json_t *body = get_set(&t, s, "crud-outin", 200);
        json_t *summary = body ? put_set(&t, s, "crud-outin-copy", body, 201) : NULL;
        if (summary != NULL)
            expect_stored_set(&t, s, "crud-outin-copy", out_in);
        json_decref(body);
        json_decref(summary);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/list", &report)) {
        static const char *const extra[] = {"Zeta", "alpha", "m.id-1_x", "0-first"};
        json_t *tiny = json_from_text(g_tiny_set);
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
            json_decref(put_set_text(&t, s, extra[i], g_tiny_set, 201));
        json_t *list = get_set_list(&t, s);
        for (size_t i = 0; list != NULL && i < json_array_size(list); i++) {
            const json_t *e = json_array_get(list, i);
            static const char *const keys[] = {"name", "shapes", "weights_layout", "heads", "parameters",
                                               "size_bytes", "stored_at"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                expect_true(&t, json_object_get(e, keys[k]) != NULL, "list entry %zu has no %s", i, keys[k]);
            if (i > 0) {
                const char *a = json_string_value(json_object_get(json_array_get(list, i - 1), "name"));
                const char *b = json_string_value(json_object_get(e, "name"));
                expect_true(&t, a && b && strcmp(a, b) < 0, "the list is not sorted by name: \"%s\" before \"%s\"",
                            a ? a : "?", b ? b : "?");
            }
        }
        for (size_t i = 0; list != NULL && i < sizeof extra / sizeof extra[0]; i++) {
            const json_t *e = list_find(list, extra[i]);
            if (expect_true(&t, e != NULL, "the list lacks %s", extra[i]))
                expect_set_summary(&t, e, extra[i], tiny, data_dir);
        }
        const json_t *e = list ? list_find(list, "crud.Set_1") : NULL;
        if (list != NULL && expect_true(&t, e != NULL, "the list lacks crud.Set_1") && put_summary != NULL)
            expect_same(&t, e, put_summary, 0, "the list entry of crud.Set_1 against the PUT answer");
        json_decref(list);
        json_decref(tiny);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/head", &report)) {
        http_simple(s, "HEAD", "/v1/weight-sets/crud.Set_1", &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
        http_simple(s, "HEAD", "/v1/weight-sets/no-such-set", &r);
        expect_status(&t, &r, 404);
        client_response_free(&r);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/delete-then-404", &report)) {
        char path[PATH_MAX];
        set_file_path(path, sizeof path, data_dir, "crud.Set_1");
        expect_true(&t, file_size(path) > 0, "%s does not exist before the DELETE", path);
        http_simple(s, "DELETE", "/v1/weight-sets/crud.Set_1", &r);
        if (expect_status(&t, &r, 204))
            expect_true(&t, r.body_len == 0, "the 204 has a body of %zu bytes", r.body_len);
        client_response_free(&r);
        expect_true(&t, file_size(path) < 0, "%s is still there after the DELETE", path);
        http_simple(s, "GET", "/v1/weight-sets/crud.Set_1", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "name");
        client_response_free(&r);
        http_simple(s, "DELETE", "/v1/weight-sets/crud.Set_1", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "name");
        client_response_free(&r);
        json_t *list = get_set_list(&t, s);
        expect_true(&t, list == NULL || list_find(list, "crud.Set_1") == NULL, "the list still has crud.Set_1");
        json_decref(list);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/name-too-long-not-stored", &report)) {
        json_t *before = get_set_list(&t, s);
        http_text(s, "PUT", "/v1/weight-sets/" NAME_65, g_tiny_set, &r);
        expect_error(&t, &r, 400, "invalid_value", "name");
        client_response_free(&r);
        json_t *after = get_set_list(&t, s);
        expect_true(&t, json_array_size(before) == json_array_size(after), "the list grew from %zu to %zu sets",
                    json_array_size(before), json_array_size(after));
        json_decref(before);
        json_decref(after);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/name-64-characters", &report)) {
        json_decref(put_set_text(&t, s, NAME_64, g_tiny_set, 201));
        json_decref(get_set(&t, s, NAME_64, 200));
        http_simple(s, "DELETE", "/v1/weight-sets/" NAME_64, &r);
        expect_status(&t, &r, 204);
        client_response_free(&r);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/405-post-on-set", &report)) {
        static const char *const allowed[] = {"GET", "PUT", "DELETE", NULL};
        http_text(s, "POST", "/v1/weight-sets/crud-outin", g_tiny_set, &r);
        expect_method_not_allowed(&t, &r, "POST", allowed);
        client_response_free(&r);
        step_end(&t, report);
    }
    if (step_start(&t, SERVER_DEFAULT, &s, "weight-sets/405-put-on-list", &report)) {
        static const char *const allowed[] = {"GET", NULL};
        http_text(s, "PUT", "/v1/weight-sets", g_tiny_set, &r);
        expect_method_not_allowed(&t, &r, "PUT", allowed);
        client_response_free(&r);
        step_end(&t, report);
    }
    check_preflight("weight-sets/preflight/put", SERVER_DEFAULT, "/v1/weight-sets/crud-outin", NULL, "PUT");
    check_preflight("weight-sets/preflight/delete", SERVER_DEFAULT, "/v1/weight-sets/crud-outin", NULL, "DELETE");
    check_preflight("weight-sets/preflight/list", SERVER_DEFAULT, "/v1/weight-sets", NULL, "GET");

    json_decref(put_summary);
    json_decref(awkward);
    json_decref(replacement);
    json_decref(out_in);
}

/* ------------------------------------------------------------------------------------ */
/* Group g: attention with a stored weight set                                           */
/* ------------------------------------------------------------------------------------ */

/* A stored set and a request that names it. Zero means absent / default. */
struct named_case {
    const char *name;              /* test name; the set is stored as "named-NAME" */
    size_t d_in, d_ctx, dk, dv;    /* d_ctx 0: self-attention (d_ctx = d_in) */
    size_t d_out;                  /* 0: no wo */
    int biases, bo, out_in;        /* bq/bk/bv, bo, weights_layout out_in */
    size_t set_heads;              /* heads stored with the set */
    size_t request_heads;          /* heads named in the request */
    int request_layout;            /* the request repeats the set's weights_layout */
    size_t lq, lk;                 /* tokens of x and of context (lk 0: no context) */
    size_t batch;                  /* 0: 2-D input */
    int causal, columns, no_attention;
};

static const struct named_case g_named_cases[] = {
    {.name = "plain-wo-bo", .d_in = 5, .dk = 4, .dv = 3, .d_out = 6, .biases = 1, .bo = 1, .lq = 4},
    {.name = "set-heads", .d_in = 6, .dk = 4, .dv = 6, .set_heads = 2, .lq = 3},
    {.name = "set-heads-repeated-in-request", .d_in = 3, .dk = 6, .dv = 3, .set_heads = 3, .request_heads = 3,
     .lq = 2},
    {.name = "out-in", .d_in = 3, .dk = 5, .dv = 2, .d_out = 4, .out_in = 1, .biases = 1, .lq = 4},
    {.name = "out-in-layout-repeated", .d_in = 4, .dk = 2, .dv = 3, .out_in = 1, .request_layout = 1, .lq = 3},
    {.name = "context", .d_in = 3, .d_ctx = 5, .dk = 4, .dv = 4, .biases = 1, .lq = 2, .lk = 6},
    {.name = "context-request-heads", .d_in = 3, .d_ctx = 5, .dk = 4, .dv = 4, .request_heads = 2, .lq = 3,
     .lk = 4},
    {.name = "batched-causal-columns-out-in-heads", .d_in = 4, .dk = 4, .dv = 2, .d_out = 3, .bo = 1, .out_in = 1,
     .set_heads = 2, .lq = 3, .batch = 2, .causal = 1, .columns = 1},
    {.name = "context-batched-no-attention", .d_in = 2, .d_ctx = 3, .dk = 2, .dv = 5, .biases = 1, .lq = 3,
     .lk = 2, .batch = 3, .no_attention = 1},
};

/* Returns a new JSON array of n numbers. */
static json_t *json_vector(const double *a, size_t n)
{
    json_t *v = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(v, json_real(a[i]));
    return v;
}

/*
 * Returns a new weight set of random numbers with these widths: the weights members
 * (matrices written d_in x d_out, or transposed for out_in), plus weights_layout and
 * heads when set_heads / out_in ask for them.
 */
static json_t *random_weight_set(uint64_t *rng, size_t d_in, size_t d_ctx, size_t dk, size_t dv, size_t d_out,
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

/* Returns a new copy of a set's numeric members only (what a request's "weights" holds). */
static json_t *weights_of(const json_t *set)
{
    json_t *w = json_object();
    for (int i = 0; i < 8; i++)
        if (json_object_get(set, g_set_members[i]) != NULL)
            json_object_set(w, g_set_members[i], json_object_get(set, g_set_members[i]));
    return w;
}

/*
 * Compares the answer to a request that names a set with the answer to the same request
 * with the weights inline: output and attention within 1e-12 (the same arithmetic should
 * give the same doubles), and the meta block's shape members.
 */
static void expect_same_answer(struct test *t, const json_t *named, const json_t *inline_body)
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

/* Runs one named case: PUT the set, POST by name and inline, compare; DELETE the set. */
static void run_named_case(const struct named_case *nc, size_t index)
{
    struct test t;
    struct server *s;
    char test_name[256], set_name[128], path[256];
    snprintf(test_name, sizeof test_name, "named/%s", nc->name);
    snprintf(set_name, sizeof set_name, "named-%s", nc->name);
    snprintf(path, sizeof path, "/v1/weight-sets/%s", set_name);
    if (!test_start(&t, SERVER_DEFAULT, &s, test_name))
        return;
    uint64_t rng = RANDOM_SEED + 104729u * (uint64_t)(index + 1);
    const size_t d_ctx = nc->d_ctx ? nc->d_ctx : nc->d_in, batch = nc->batch ? nc->batch : 1;
    const int batched = nc->batch > 0;
    json_t *set = random_weight_set(&rng, nc->d_in, d_ctx, nc->dk, nc->dv, nc->d_out, nc->biases, nc->bo, nc->out_in,
                                    nc->set_heads);
    json_t *named = json_object(), *inline_req;
    double *x = random_values(&rng, batch * nc->lq * nc->d_in, 1.0, 0);
    json_object_set_new(named, "x", json_tensor(x, batch, nc->lq, nc->d_in, batched, nc->columns));
    free(x);
    if (nc->lk > 0) {
        double *c = random_values(&rng, batch * nc->lk * d_ctx, 1.0, 0);
        json_object_set_new(named, "context", json_tensor(c, batch, nc->lk, d_ctx, batched, nc->columns));
        free(c);
    }
    if (nc->causal)
        json_object_set_new(named, "causal", json_true());
    if (nc->columns)
        json_object_set_new(named, "layout", json_string("columns"));
    if (nc->no_attention)
        json_object_set_new(named, "return_attention", json_false());
    if (nc->request_heads)
        json_object_set_new(named, "heads", json_integer((json_int_t)nc->request_heads));
    if (nc->request_layout)
        json_object_set_new(named, "weights_layout", json_string(nc->out_in ? "out_in" : "in_out"));
    inline_req = json_deep_copy(named);
    json_object_set_new(named, "weights", json_string(set_name));
    json_object_set_new(inline_req, "weights", weights_of(set));
    if (nc->out_in)
        json_object_set_new(inline_req, "weights_layout", json_string("out_in"));
    if (nc->set_heads && !nc->request_heads)
        json_object_set_new(inline_req, "heads", json_integer((json_int_t)nc->set_heads));

    struct client_response r_named = {0}, r_inline = {0};
    json_t *b_named = NULL, *b_inline = NULL;
    json_decref(put_set(&t, s, set_name, set, 201));
    if (t.failed)
        goto done;
    http_post_json(s, "/v1/attention", named, &r_named);
    http_post_json(s, "/v1/attention", inline_req, &r_inline);
    if (!expect_status(&t, &r_named, 200) || !expect_status(&t, &r_inline, 200))
        goto done;
    b_named = response_json(&r_named);
    b_inline = response_json(&r_inline);
    expect_same_answer(&t, b_named, b_inline);
    size_t heads = nc->request_heads ? nc->request_heads : nc->set_heads;
    if (heads > 0) {
        /* The heads axis must be there even though the request did not name heads. */
        const json_t *meta_heads = json_object_get(json_object_get(b_named, "meta"), "heads");
        expect_true(&t, json_integer_value(meta_heads) == (json_int_t)heads, "meta.heads is not %zu", heads);
        const json_t *a = json_object_get(b_named, "attention");
        if (batched)
            a = json_array_get(a, 0);
        if (!nc->no_attention)
            expect_true(&t, json_array_size(a) == heads && json_is_array(json_array_get(json_array_get(a, 0), 0)),
                        "attention has no heads axis of %zu", heads);
    }
done:
    if (t.failed) {
        char snippet[400];
        body_snippet(r_named.body ? r_named.body : "", r_named.body_len, snippet, sizeof snippet);
        test_detail(&t, "    by-name answer: %s", snippet);
    }
    struct client_response r;
    http_simple(s, "DELETE", path, &r);
    client_response_free(&r);
    json_decref(b_named);
    json_decref(b_inline);
    client_response_free(&r_named);
    client_response_free(&r_inline);
    json_decref(set);
    json_decref(named);
    json_decref(inline_req);
    test_end(&t);
}

/* The cases above, then a set replaced and deleted under the same name. */
static void run_named_attention_tests(void)
{
    for (size_t i = 0; i < sizeof g_named_cases / sizeof g_named_cases[0]; i++)
        run_named_case(&g_named_cases[i], i);

    struct test t;
    struct server *s;
    struct client_response r;
    static const char x_request[] = "{\"x\": [[1, 2], [3, -1]], \"weights\": \"named-lifecycle\"}";
    if (test_start(&t, SERVER_DEFAULT, &s, "named/follows-replace-and-delete")) {
        /* Two sets of the same shapes with different numbers: the answer must follow the PUTs. */
        static const char set_a[] = "{\"wq\": [[1, 0], [0, 1]], \"wk\": [[1, 0], [0, 1]], \"wv\": [[1, 2], [3, 4]]}";
        static const char set_b[] = "{\"wq\": [[0, 1], [1, 0]], \"wk\": [[2, 0], [0, 2]], \"wv\": [[-1, 0], [0, -1]]}";
        json_t *answers[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            json_decref(put_set_text(&t, s, "named-lifecycle", i ? set_b : set_a, i ? 200 : 201));
            http_text(s, "POST", "/v1/attention", x_request, &r);
            if (expect_status(&t, &r, 200))
                answers[i] = response_json(&r);
            client_response_free(&r);
            /* The same request with the set inline. */
            json_t *req = json_from_text(x_request), *w = json_from_text(i ? set_b : set_a);
            json_object_set_new(req, "weights", w);
            http_post_json(s, "/v1/attention", req, &r);
            json_decref(req);
            json_t *want = response_json(&r);
            if (expect_status(&t, &r, 200) && answers[i] != NULL)
                expect_same_answer(&t, answers[i], want);
            json_decref(want);
            client_response_free(&r);
        }
        char path[64] = "output", why[512];
        expect_true(&t, answers[0] && answers[1] && !json_numbers_close(json_object_get(answers[1], "output"),
                                                                         json_object_get(answers[0], "output"), 1e-9,
                                                                         0, path, sizeof path, why, sizeof why),
                    "the answer did not change when the set was replaced");
        http_simple(s, "DELETE", "/v1/weight-sets/named-lifecycle", &r);
        expect_status(&t, &r, 204);
        client_response_free(&r);
        http_text(s, "POST", "/v1/attention", x_request, &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "weights");
        client_response_free(&r);
        json_decref(answers[0]);
        json_decref(answers[1]);
        test_end(&t);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Group h: the limits of the store (413 weight_set_too_large and store_full)            */
/* ------------------------------------------------------------------------------------ */

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

static void run_store_limit_tests(void)
{
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

/* ------------------------------------------------------------------------------------ */
/* Group i: the API examples                                                             */
/* ------------------------------------------------------------------------------------ */

/* Sizes of a 2-D matrix (or of the first matrix of a 3-D array) as rows and columns. */
static void matrix_size(const json_t *m, int batched, size_t *rows, size_t *cols)
{
    if (batched)
        m = json_array_get(m, 0);
    *rows = json_array_size(m);
    *cols = json_array_size(json_array_get(m, 0));
}

/*
 * Checks that v is a nested array of exactly the shape dims (every row of it, not only
 * the first) with numbers at the leaves. Returns 1, or 0 with the difference in why.
 */
static int json_has_shape(const json_t *v, const size_t *dims, size_t rank, char *path, size_t cap, char *why,
                          size_t why_cap)
{
    if (rank == 0) {
        if (json_is_number(v))
            return 1;
        snprintf(why, why_cap, "%s is not a number", path);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) != dims[0]) {
        snprintf(why, why_cap, "%s is %s of %zu, expected %zu entries", path, json_is_array(v) ? "an array" : "not an array",
                 json_array_size(v), dims[0]);
        return 0;
    }
    size_t base = strlen(path);
    for (size_t i = 0; i < dims[0]; i++) {
        snprintf(path + base, cap - base, "[%zu]", i);
        if (!json_has_shape(json_array_get(v, i), dims + 1, rank - 1, path, cap, why, why_cap))
            return 0;
    }
    path[base] = '\0';
    return 1;
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
static void run_example_tests(const char *dir, const char *fixture_dir)
{
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

/* ------------------------------------------------------------------------------------ */
/* Group j: attention by name while the set is replaced and deleted                      */
/* ------------------------------------------------------------------------------------ */

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
static void run_replace_concurrency_tests(void)
{
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

/* ------------------------------------------------------------------------------------ */
/* Group k: persistence across a restart, and damaged files                              */
/* ------------------------------------------------------------------------------------ */

/* Copies a file; returns 0 or -1. */
static int copy_file(const char *from, const char *to)
{
    size_t len;
    char *data = client_read_file(from, &len);
    int rc = data != NULL ? client_write_file(to, data, len) : -1;
    free(data);
    return rc;
}

/* Flips one bit of the byte at offset of a file; returns 0 or -1. */
static int flip_byte(const char *path, long long offset)
{
    size_t len;
    char *data = client_read_file(path, &len);
    if (data == NULL || offset < 0 || (size_t)offset >= len) {
        free(data);
        return -1;
    }
    data[offset] ^= 0x10;
    int rc = client_write_file(path, data, len);
    free(data);
    return rc;
}

/* Returns 1 when dir has an entry that begins with prefix. */
static int dir_has_prefix(const char *dir, const char *prefix)
{
    size_t count;
    char **names = dir_entries(dir, &count);
    int found = 0;
    for (size_t i = 0; i < count && !found; i++)
        found = strncmp(names[i], prefix, strlen(prefix)) == 0;
    free_name_list(names);
    return found;
}

/* The sets stored before the restart and kept, and those whose files are damaged. */
static const char *const g_kept_sets[] = {"keep-plain", "keep-outin", "keep-random"};
static const char *const g_damaged_files[] = {"victim-flip.wset", "victim-trunc.wset", "victim-header.wset",
                                              "garbage.wset", "impostor.wset"};
#define KEEP_COUNT (sizeof g_kept_sets / sizeof g_kept_sets[0])
#define DAMAGED_COUNT (sizeof g_damaged_files / sizeof g_damaged_files[0])

/*
 * Stores sets, stops the server with SIGTERM, damages some files in its data directory
 * (a flipped byte, a truncated file, a cut header, text, a file whose name does not match
 * the set inside) and leaves an interrupted write (.tmp.*), then starts a server on the
 * same directory: the kept sets must be there bit for bit and usable by name, the damaged
 * ones not served and moved to quarantine/, and the leftover removed.
 */
static void run_restart_tests(void)
{
    static const char *const names[] = {
        "server/restart-1", "server/restart-2", "restart/stored-before", "restart/damage-files",
        "restart/sets-identical", "restart/usable-by-name", "restart/damaged-not-served",
        "restart/damaged-quarantined", "restart/interrupted-write-removed",
        "restart/name-starting-with-.tmp-survives", "restart/damaged-name-reusable", NULL};
    if (!any_selected(names))
        return;
    static const struct server_kind kind1 = {"restart-1", g_no_strings, g_no_strings};
    static const struct server_kind kind2 = {"restart-2", g_no_strings, g_no_strings};
    struct server first, second;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    first.kind = &kind1;
    second.kind = &kind2;
    snprintf(first.data_dir, sizeof first.data_dir, "%s/data-restart", g_tmpdir);
    snprintf(second.data_dir, sizeof second.data_dir, "%s", first.data_dir);
    const char *dir = first.data_dir;
    struct test t;
    struct client_response r;
    json_t *saved[KEEP_COUNT] = {NULL}, *named_req = NULL, *named_answer = NULL;
    int dot_tmp_stored = 0;

    if (server_start(&first) != 0)
        return;
    uint64_t rng = RANDOM_SEED + 4242u;
    json_t *random_set = random_weight_set(&rng, 4, 4, 4, 4, 3, 1, 1, 0, 2);
    char *random_text = json_dumps(random_set, JSON_COMPACT);
    const char *texts[KEEP_COUNT] = {g_awkward_set, g_out_in_set, random_text};
    int selected = test_begin(&t, "restart/stored-before");
    for (size_t i = 0; i < KEEP_COUNT; i++) {
        json_decref(put_set_text(&t, &first, g_kept_sets[i], texts[i], 201));
        saved[i] = get_set(&t, &first, g_kept_sets[i], 200);
    }
    static const char *const victims[] = {"victim-flip", "victim-trunc", "victim-header"};
    for (size_t i = 0; i < 3; i++)
        json_decref(put_set_text(&t, &first, victims[i], random_text, 201));
    /* A name that begins like the store's temporary files. */
    http_text(&first, "PUT", "/v1/weight-sets/.tmp.keep", g_tiny_set, &r);
    dot_tmp_stored = r.status == 201;
    expect_true(&t, r.status == 201 || r.status == 400, "PUT .tmp.keep: status %d, expected 201 or 400", r.status);
    client_response_free(&r);
    named_req = json_object();
    double *x = random_values(&rng, 5 * 4, 1.0, 0);
    json_object_set_new(named_req, "x", json_matrix(x, 5, 4, 0));
    json_object_set_new(named_req, "weights", json_string("keep-random"));
    free(x);
    http_post_json(&first, "/v1/attention", named_req, &r);
    if (expect_status(&t, &r, 200))
        named_answer = response_json(&r);
    client_response_free(&r);
    if (selected)
        test_end(&t);
    server_stop(&first);

    /* Damage files while no server runs. */
    selected = test_begin(&t, "restart/damage-files");
    char path[PATH_MAX], other[PATH_MAX];
    snprintf(path, sizeof path, "%s/victim-flip.wset", dir);
    long long size = file_size(path);
    expect_true(&t, size > 16 && flip_byte(path, size / 2) == 0, "cannot flip a byte of %s", path);
    snprintf(path, sizeof path, "%s/victim-trunc.wset", dir);
    size = file_size(path);
    expect_true(&t, size > 16 && truncate(path, (off_t)(size - 8)) == 0, "cannot truncate %s", path);
    snprintf(path, sizeof path, "%s/victim-header.wset", dir);
    expect_true(&t, truncate(path, 40) == 0, "cannot truncate %s", path);
    snprintf(path, sizeof path, "%s/garbage.wset", dir);
    expect_true(&t, client_write_file(path, "not a weight set\n", 17) == 0, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/keep-random.wset", dir);
    snprintf(other, sizeof other, "%s/impostor.wset", dir);
    expect_true(&t, copy_file(path, other) == 0, "cannot copy %s to %s", path, other);
    snprintf(path, sizeof path, "%s/.tmp.keep-random.99999.1", dir);
    expect_true(&t, client_write_file(path, "ATTNWSET half", 13) == 0, "cannot write %s", path);
    if (selected)
        test_end(&t);

    if (server_start(&second) != 0)
        goto out;
    struct server *s = &second;
    if (test_begin(&t, "restart/sets-identical")) {
        /* Exactly the kept sets (and .tmp.keep, whose fate its own test reports). */
        json_t *list = get_set_list(&t, s);
        for (size_t i = 0; i < json_array_size(list); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(list, i), "name"));
            int known = name != NULL && strcmp(name, ".tmp.keep") == 0;
            for (size_t k = 0; k < KEEP_COUNT && !known; k++)
                known = name != NULL && strcmp(name, g_kept_sets[k]) == 0;
            expect_true(&t, known, "the list has %s, which was not stored or is damaged", name ? name : "(no name)");
        }
        for (size_t i = 0; i < KEEP_COUNT; i++) {
            expect_true(&t, list_find(list, g_kept_sets[i]) != NULL, "the list lacks %s", g_kept_sets[i]);
            json_t *body = get_set(&t, s, g_kept_sets[i], 200);
            if (body != NULL && saved[i] != NULL)
                expect_same(&t, body, saved[i], 1, g_kept_sets[i]);
            json_decref(body);
        }
        json_decref(list);
        test_end(&t);
    }
    if (test_begin(&t, "restart/usable-by-name")) {
        http_post_json(s, "/v1/attention", named_req, &r);
        if (expect_status(&t, &r, 200) && expect_true(&t, named_answer != NULL, "no answer before the restart")) {
            json_t *body = response_json(&r);
            expect_same_answer(&t, body, named_answer);
            json_decref(body);
        }
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-not-served")) {
        for (size_t i = 0; i < DAMAGED_COUNT; i++) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(strlen(g_damaged_files[i]) - 5), g_damaged_files[i]);
            json_decref(get_set(&t, s, name, 404));
        }
        http_text(s, "POST", "/v1/attention", "{\"x\": [[1, 2, 3, 4]], \"weights\": \"victim-flip\"}", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "weights");
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-quarantined")) {
        char qdir[PATH_MAX];
        snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
        for (size_t i = 0; i < DAMAGED_COUNT; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, g_damaged_files[i]);
            expect_true(&t, file_size(path) < 0, "%s is still in the data directory", g_damaged_files[i]);
            expect_true(&t, dir_has_prefix(qdir, g_damaged_files[i]), "%s is not in %s", g_damaged_files[i], qdir);
        }
        test_end(&t);
    }
    if (test_begin(&t, "restart/interrupted-write-removed")) {
        snprintf(path, sizeof path, "%s/.tmp.keep-random.99999.1", dir);
        expect_true(&t, file_size(path) < 0, "the leftover %s is still there", path);
        test_end(&t);
    }
    if (test_begin(&t, "restart/name-starting-with-.tmp-survives")) {
        /* Either the name is refused (400), or a 201 means it is on disk and stays. */
        if (dot_tmp_stored) {
            json_t *sent = json_from_text(g_tiny_set), *body = get_set(&t, s, ".tmp.keep", 200);
            if (body != NULL)
                expect_set_body(&t, body, sent);
            else
                test_detail(&t, "    PUT /v1/weight-sets/.tmp.keep answered 201 before the restart");
            json_decref(sent);
            json_decref(body);
        }
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-name-reusable")) {
        json_decref(put_set_text(&t, s, "victim-flip", g_tiny_set, 201));
        json_decref(get_set(&t, s, "victim-flip", 200));
        test_end(&t);
    }
    server_stop(&second);
out:
    for (size_t i = 0; i < KEEP_COUNT; i++)
        json_decref(saved[i]);
    json_decref(named_req);
    json_decref(named_answer);
    json_decref(random_set);
    free(random_text);
}

/* ------------------------------------------------------------------------------------ */
/* Group l: draining on SIGTERM                                                          */
/* ------------------------------------------------------------------------------------ */

/* The slow request: 4 x 2000 tokens of width 8 projected to dk = 512 (about 16 GFLOP of
 * QK^T, about a second on one core) and dv = 64, without the attention matrix. Its answer
 * (512000 numbers, about 10 MB) is more than the kernel buffers of a loopback connection
 * hold, and its client reads at most 16 MB/s, so the answer is still being sent for a
 * few hundred milliseconds after the computation ends. */
#define DRAIN_BATCH 4
#define DRAIN_TOKENS 2000
#define DRAIN_DV 64
/* The projection width sets how long the slow request computes (L^2 * DK) without making
 * its answer larger: long enough that it is still running 0.4 s after it was sent (about
 * 1 s on the 2-core machine; with 512 it took 0.3 s once the JSON writer got faster). */
#define DRAIN_DK 2048

/* Returns the text of the slow request; numbers are multiples of 1/8 so the body stays short. */
static char *drain_request_text(void)
{
    uint64_t rng = RANDOM_SEED + 777u;
    json_t *req = json_object(), *x = json_array(), *w = json_object();
    for (size_t b = 0; b < DRAIN_BATCH; b++) {
        json_t *m = json_array();
        for (size_t i = 0; i < DRAIN_TOKENS; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < 8; j++)
                json_array_append_new(row, json_real((double)(client_rng_next(&rng) % 17) / 8.0 - 1.0));
            json_array_append_new(m, row);
        }
        json_array_append_new(x, m);
    }
    const size_t widths[3] = {DRAIN_DK, DRAIN_DK, DRAIN_DV};
    for (int k = 0; k < 3; k++) {
        json_t *m = json_array();
        for (size_t i = 0; i < 8; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < widths[k]; j++)
                json_array_append_new(row, json_real((double)(client_rng_next(&rng) % 17) / 64.0 - 0.125));
            json_array_append_new(m, row);
        }
        json_object_set_new(w, g_set_members[k], m);
    }
    json_object_set_new(req, "x", x);
    json_object_set_new(req, "weights", w);
    json_object_set_new(req, "return_attention", json_false());
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return text;
}

/*
 * A raw HTTP/1.1 client over one TCP connection, for the one request of the drain test
 * that needs what curl cannot do: a small receive buffer, and reading that starts late
 * and goes slowly, so that the server is still sending the answer long after it computed
 * it (whatever the loopback buffers of the machine hold).
 */

/* Connects to the server with a receive buffer of rcvbuf bytes; returns the socket or -1. */
static int raw_connect(const struct server *s, int rcvbuf, char *why, size_t cap)
{
    const char *colon = strrchr(s->base_url, ':');
    int port = colon != NULL ? atoi(colon + 1) : 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(why, cap, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf); /* before connect: sets the window */
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(why, cap, "connect to port %d: %s", port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends a POST with body over fd (Connection: close); returns 0 or -1. */
static int raw_post(int fd, const char *path, const char *body, size_t len)
{
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n", path, len);
    const char *parts[2] = {head, body};
    size_t sizes[2] = {(size_t)n, len};
    for (int i = 0; i < 2; i++) {
        size_t done = 0;
        while (done < sizes[i]) {
            ssize_t w = write(fd, parts[i] + done, sizes[i] - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return -1;
            done += (size_t)w;
        }
    }
    return 0;
}

/* Returns 1 when fd has bytes (or EOF) to read now. */
static int raw_readable(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, 0) > 0;
}

/*
 * Reads the answer from fd at most rate bytes per second until the connection closes or
 * Content-Length bytes of body arrived (at most timeout_s), and fills r like
 * client_http_finish; a body shorter than its Content-Length is a transport error.
 */
static void raw_read_response(int fd, double rate, double timeout_s, struct client_response *r)
{
    memset(r, 0, sizeof *r);
    size_t cap = 1 << 20, used = 0, header_len = 0;
    long long content_length = -1;
    char *buf = client_xcalloc(cap, 1);
    double start = client_now_seconds(), first_byte = -1;
    for (;;) {
        if (header_len > 0 && content_length >= 0 && used - header_len >= (size_t)content_length)
            break;
        double left = start + timeout_s - client_now_seconds();
        struct pollfd pfd = {fd, POLLIN, 0};
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) {
            snprintf(r->transport_error, sizeof r->transport_error, "no complete answer within %.0f s", timeout_s);
            break;
        }
        if (used + 65536 + 1 > cap) {
            cap *= 2;
            buf = client_xrealloc(buf, cap);
        }
        ssize_t got = read(fd, buf + used, 65536);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got < 0)
                snprintf(r->transport_error, sizeof r->transport_error, "read: %s", strerror(errno));
            break;
        }
        used += (size_t)got;
        buf[used] = '\0';
        if (header_len == 0) {
            char *end = strstr(buf, "\r\n\r\n");
            if (end != NULL) {
                header_len = (size_t)(end + 4 - buf);
                r->status = strncmp(buf, "HTTP/1.", 7) == 0 ? atoi(buf + 9) : 0;
                char *headers = client_xcalloc(header_len + 1, 1);
                memcpy(headers, buf, header_len);
                client_parse_headers(headers, r);
                free(headers);
                const char *length = client_header(r, "Content-Length");
                content_length = length != NULL ? atoll(length) : -1;
            }
        }
        /* Keep to the rate from the first byte on: the bytes so far may not have taken less
         * than used / rate. */
        if (first_byte < 0)
            first_byte = client_now_seconds();
        double ahead = (double)used / rate - (client_now_seconds() - first_byte);
        if (ahead > 0)
            client_sleep_ms((long)(ahead * 1000));
    }
    size_t body_len = header_len > 0 ? used - header_len : 0;
    if (r->transport_error[0] == '\0' && header_len == 0)
        snprintf(r->transport_error, sizeof r->transport_error, "the connection closed after %zu bytes, before "
                 "the end of the headers", used);
    else if (r->transport_error[0] == '\0' && content_length >= 0 && body_len < (size_t)content_length)
        snprintf(r->transport_error, sizeof r->transport_error, "the connection closed after %zu of the %lld "
                 "bytes of the body", body_len, content_length);
    r->body = client_xcalloc(body_len + 1, 1);
    memcpy(r->body, buf + header_len, body_len);
    r->body_len = body_len;
    free(buf);
}

/*
 * A server with --shutdown-grace 5 gets SIGTERM while one request computes (its client
 * has a small receive buffer and reads slowly, so the 10 MB answer takes a while to send)
 * and another is still uploading its body. While it drains, /readyz, new attention
 * requests and writes must get 503 shutting_down with Retry-After, and /healthz 200; the
 * computing request must get its whole 200 answer, the uploading one an answer (200 or
 * 503), not a dropped connection; then the process exits 0.
 */
static void run_drain_tests(void)
{
    static const char *const names[] = {
        "server/drain", "drain/in-flight-at-sigterm", "drain/readyz-503", "drain/new-attention-503",
        "drain/put-503", "drain/healthz-200", "drain/in-flight-completes", "drain/uploading-request-answered", NULL};
    if (!any_selected(names))
        return;
    static const char *const args[] = {"--shutdown-grace", "5", NULL};
    static const struct server_kind kind = {"drain", args, g_no_strings};
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.kind = &kind;
    if (server_start(&srv) != 0)
        return;
    struct server *s = &srv;
    struct test t;
    struct client_response r;
    char why[256] = "";

    char *slow_text = drain_request_text();
    size_t upload_len = 400 * 1024;
    char *upload_text = client_xcalloc(upload_len + 1, 1);
    memset(upload_text, ' ', upload_len);
    memcpy(upload_text, g_tiny_request, strlen(g_tiny_request));
    static const char *const slow_writer[] = {"--limit-rate", "200K", NULL};
    struct client_request upload_rq = {.method = "POST", .path = "/v1/attention", .body = upload_text,
                                       .body_len = upload_len, .curl_args = slow_writer};
    struct client_pending upload;
    int slow_fd = raw_connect(s, 32 * 1024, why, sizeof why);
    int slow_sent = slow_fd >= 0 && raw_post(slow_fd, "/v1/attention", slow_text, strlen(slow_text)) == 0;
    client_http_start(s->base_url, g_tmpdir, &upload_rq, &upload);
    client_sleep_ms(400);

    if (test_begin(&t, "drain/in-flight-at-sigterm")) {
        if (expect_true(&t, slow_sent, "could not send the slow request: %s", why[0] ? why : strerror(errno)))
            expect_true(&t, !raw_readable(slow_fd), "the slow request was answered within 0.4 s, before SIGTERM; "
                        "make it slower");
        expect_true(&t, !client_http_done(&upload), "the slowly uploading request ended within 0.4 s, before SIGTERM");
        test_end(&t);
    }
    kill(s->pid, SIGTERM);
    double signalled = client_now_seconds();

    if (test_begin(&t, "drain/readyz-503")) {
        for (;;) {
            http_simple(s, "GET", "/readyz", &r);
            int in_flight = slow_sent && !raw_readable(slow_fd);
            if (r.status == 503) {
                expect_error(&t, &r, 503, "shutting_down", "");
                expect_true(&t, client_header(&r, "Retry-After") != NULL, "no Retry-After header");
                client_response_free(&r);
                break;
            }
            if (r.status == 200 && in_flight && client_now_seconds() - signalled < 0.2) {
                client_response_free(&r); /* the signal may not have been handled yet */
                client_sleep_ms(20);
                continue;
            }
            if (in_flight)
                expect_true(&t, 0, "/readyz answered %d (%s) while draining with a request in flight", r.status,
                            r.transport_error);
            else
                test_detail(&t, "    the in-flight request ended before /readyz could be asked");
            client_response_free(&r);
            break;
        }
        test_end(&t);
    }
    if (test_begin(&t, "drain/new-attention-503")) {
        http_text(s, "POST", "/v1/attention", g_tiny_request, &r);
        if (r.status != 0 || !raw_readable(slow_fd)) {
            expect_error(&t, &r, 503, "shutting_down", NULL);
            expect_true(&t, client_header(&r, "Retry-After") != NULL, "no Retry-After header");
        }
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "drain/put-503")) {
        http_text(s, "PUT", "/v1/weight-sets/drained", g_tiny_set, &r);
        if (r.status != 0 || !raw_readable(slow_fd))
            expect_error(&t, &r, 503, "shutting_down", NULL);
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "drain/healthz-200")) {
        http_simple(s, "GET", "/healthz", &r);
        if (r.status != 0 || !raw_readable(slow_fd))
            expect_status(&t, &r, 200);
        client_response_free(&r);
        test_end(&t);
    }
    /* Read the slow answer at 16 MB/s: about 0.7 s for its 11 MB. */
    memset(&r, 0, sizeof r);
    if (slow_sent)
        raw_read_response(slow_fd, 16e6, 20.0, &r);
    if (test_begin(&t, "drain/in-flight-completes")) {
        if (expect_true(&t, slow_sent, "the slow request was not sent") &&
            expect_true(&t, r.transport_error[0] == '\0', "the in-flight request was cut: %s (status %d)",
                        r.transport_error, r.status) &&
            expect_status(&t, &r, 200)) {
            json_t *body = response_json(&r);
            size_t dims[3] = {DRAIN_BATCH, DRAIN_TOKENS, DRAIN_DV};
            char path[512] = "output", shape_why[1024];
            expect_true(&t, json_has_shape(json_object_get(body, "output"), dims, 3, path, sizeof path, shape_why,
                                           sizeof shape_why),
                        "%s", shape_why);
            json_decref(body);
        }
        test_end(&t);
    }
    client_response_free(&r);
    if (slow_fd >= 0)
        close(slow_fd);
    client_http_finish(&upload, &r);
    if (test_begin(&t, "drain/uploading-request-answered")) {
        if (expect_true(&t, r.transport_error[0] == '\0' && r.status != 0,
                        "the request that was still uploading got no answer: %s", r.transport_error) &&
            r.status != 200)
            expect_error(&t, &r, 503, "shutting_down", NULL);
        test_end(&t);
    }
    client_response_free(&r);
    server_wait_exit(s);
    free(slow_text);
    free(upload_text);
}

/* ------------------------------------------------------------------------------------ */
/* Main                                                                                  */
/* ------------------------------------------------------------------------------------ */

static void usage(FILE *to, const char *argv0)
{
    fprintf(to,
            "usage: %s --server PATH --fixtures DIR --cases DIR [--examples DIR] [--filter SUBSTR]\n"
            "  Starts the attention server at PATH on free loopback ports and runs the\n"
            "  integration tests; --filter runs only tests whose name contains SUBSTR.\n"
            "  --examples is the directory of the API examples (default: api/examples).\n",
            argv0);
}

int main(int argc, char **argv)
{
    client_set_program_name("itest");
    const char *fixtures = NULL, *cases = NULL, *examples = "api/examples";
    for (int i = 1; i < argc; i += 2) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout, argv[0]);
            return 0;
        } else if (strcmp(argv[i], "--server") == 0 && value != NULL) {
            g_server_path = value;
        } else if (strcmp(argv[i], "--fixtures") == 0 && value != NULL) {
            fixtures = value;
        } else if (strcmp(argv[i], "--cases") == 0 && value != NULL) {
            cases = value;
        } else if (strcmp(argv[i], "--examples") == 0 && value != NULL) {
            examples = value;
        } else if (strcmp(argv[i], "--filter") == 0 && value != NULL) {
            g_filter = value;
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (g_server_path == NULL || fixtures == NULL || cases == NULL) {
        usage(stderr, argv[0]);
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    if (client_make_temp_dir(g_tmpdir, sizeof g_tmpdir, NULL, "itest.") != 0) {
        fprintf(stderr, "itest: cannot create a temporary directory: %s\n", strerror(errno));
        return 2;
    }
    if (access(g_server_path, X_OK) != 0)
        fprintf(stderr, "itest: warning: %s is not an executable file\n", g_server_path);

    run_fixture_tests(fixtures);
    run_case_tests(cases);
    run_protocol_tests();
    run_random_tests();
    run_concurrency_tests(fixtures);
    run_weight_set_tests();
    run_named_attention_tests();
    run_store_limit_tests();
    run_example_tests(examples, fixtures);
    run_replace_concurrency_tests();

    for (int id = 0; id < SERVER_COUNT; id++)
        if (g_servers[id].running)
            server_stop(&g_servers[id]);

    /* These start and stop servers of their own. */
    run_restart_tests();
    run_drain_tests();

    printf("%d passed, %d failed\n", g_passed, g_failed);
    if (g_failed > 0)
        fprintf(stderr, "itest: kept server logs in %s\n", g_tmpdir);
    else
        client_remove_tree(g_tmpdir); /* it holds only files this program created */
    return g_failed > 0 ? 1 : 0;
}

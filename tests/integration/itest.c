/*
 * itest.c - the integration runner: it starts the real attention-server binary on free
 * loopback ports and holds it to the wire contract (shared/CONTRACT.md) and the design
 * decisions (DESIGN.md) over HTTP.
 *
 * Every HTTP call is made by the curl command-line tool, started with fork/exec and an
 * argument vector (never through a shell), so that what is tested is exactly what a user
 * with curl would see. Request bodies go to curl through temporary files, and curl writes
 * the status, the headers and the body to temporary files that this program reads back.
 *
 * The tests come in five groups, one static function each:
 *   a. fixtures    - every golden case in --fixtures DIR, compared element by element;
 *   b. cases       - data-driven invalid requests from the *.json files in --cases DIR;
 *   c. protocol    - health, readiness, info, metrics, CORS, methods and headers;
 *   d. random      - randomized requests compared with the naive reference (tests/ref);
 *   e. concurrency - parallel valid requests mixed with garbage.
 * Up to three servers are started on demand: "default" (only --port 0 --host 127.0.0.1),
 * "small-limits" (--max-body 4K --max-elements 1000) and "cors" (a configured CORS origin,
 * two BLAS threads and a mix of flags and environment variables). At the end each one gets
 * SIGTERM and must exit 0 within 15 s with no sanitizer report on its stderr; these
 * "server/..." checks run for every server that was started, whatever --filter says.
 * The runner removes ATTN_* variables from the servers' environment, so the defaults it
 * expects hold whatever the caller's environment says.
 *
 * Output: one line per test, "ok   NAME" or "FAIL NAME: reason", then "N passed, N failed".
 * The exit status is 0 when nothing failed, 1 when something did, 2 on a usage error.
 *
 * Build: cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
 *          tests/integration/itest.c tests/ref/reference.c -ljansson -lm -o build/itest
 * Run:   build/itest --server build/attention-server --fixtures ../shared/fixtures \
 *                    --cases tests/integration/cases [--filter SUBSTR]
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "../ref/reference.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

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

static void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "itest: out of memory\n");
        exit(2);
    }
    return p;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/*
 * Reads a whole file into a new NUL-terminated buffer that the caller frees.
 * Returns NULL (and sets *len to 0) when the file cannot be read.
 */
static char *read_whole_file(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, used = 0;
    char *buf = xcalloc(cap, 1);
    for (;;) {
        if (used + 1 >= cap) {
            cap *= 2;
            char *bigger = realloc(buf, cap);
            if (bigger == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = bigger;
        }
        size_t got = fread(buf + used, 1, cap - used - 1, f);
        used += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[used] = '\0';
    *len = used;
    return buf;
}

/* Writes len bytes to path, replacing the file; returns 0 or -1. */
static int write_whole_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

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

/* Returns the names of the *.json files in dir, sorted, as a NULL-terminated array. */
static char **list_json_files(const char *dir, size_t *count)
{
    *count = 0;
    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, NULL, alphasort);
    if (n < 0)
        return NULL;
    char **names = xcalloc((size_t)n + 1, sizeof *names);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(entries[i]->d_name);
        if (len > 5 && strcmp(entries[i]->d_name + len - 5, ".json") == 0) {
            names[*count] = xcalloc(len + 1, 1);
            memcpy(names[*count], entries[i]->d_name, len + 1);
            (*count)++;
        }
        free(entries[i]);
    }
    free(entries);
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

enum server_id { SERVER_DEFAULT, SERVER_SMALL_LIMITS, SERVER_CORS, SERVER_COUNT };

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
                                          "--blas-threads", "2", "--max-body", "8K", NULL};
static const char *const g_cors_env[] = {"ATTN_MAX_ELEMENTS=12345", "ATTN_MAX_BODY=1K", NULL};

static const struct server_kind g_server_kinds[SERVER_COUNT] = {
    [SERVER_DEFAULT] = {"default", g_no_strings, g_no_strings},
    [SERVER_SMALL_LIMITS] = {"small-limits", g_small_args, g_no_strings},
    [SERVER_CORS] = {"cors", g_cors_args, g_cors_env},
};

/* What the info test expects of each kind: body limit, element limit, BLAS threads. */
static const long long g_expected_max_body[SERVER_COUNT] = {64LL << 20, 4096, 8192};
static const long long g_expected_max_elements[SERVER_COUNT] = {8LL << 20, 1000, 12345};
static const long long g_expected_blas_threads[SERVER_COUNT] = {1, 1, 2};
static const char *const g_expected_origin[SERVER_COUNT] = {"*", "*", "https://viz.example"};

struct server {
    const struct server_kind *kind;
    int attempted;           /* a start was tried (servers start on first use) */
    int running;             /* pid is our live child */
    pid_t pid;
    int stdout_fd;           /* read end of the server's stdout, or -1 */
    size_t extra_stdout;     /* bytes seen on stdout after the first line */
    char stderr_path[PATH_MAX];
    char base_url[512];      /* "http://HOST:PORT" from the banner */
    char start_error[1024];
};

static const char *g_server_path;
static struct server g_servers[SERVER_COUNT];

/* Prints the last `lines` lines of a server's stderr into the test's detail. */
static void detail_stderr_tail(struct test *t, const struct server *s, int lines)
{
    size_t len;
    char *text = read_whole_file(s->stderr_path, &len);
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
    char **envp = xcalloc(n + extra + 1, sizeof *envp);
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ATTN_", 5) != 0)
            envp[used++] = environ[i];
    for (size_t i = 0; i < extra; i++)
        envp[used++] = (char *)kind->env[i];
    return envp;
}

/*
 * Waits for the first line on the server's stdout, at most STARTUP_TIMEOUT_S, and takes
 * the base URL from "listening on http://HOST:PORT". Returns 0, or -1 with s->start_error.
 */
static int server_read_banner(struct server *s)
{
    char line[512];
    size_t len = 0;
    double deadline = now_seconds() + STARTUP_TIMEOUT_S;
    char *newline = NULL;
    while (newline == NULL) {
        double left = deadline - now_seconds();
        if (left <= 0) {
            snprintf(s->start_error, sizeof s->start_error,
                     "no \"listening on\" line on stdout within %.0f s", STARTUP_TIMEOUT_S);
            return -1;
        }
        struct pollfd pfd = {s->stdout_fd, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            continue; /* the deadline check above reports the timeout */
        ssize_t got = read(s->stdout_fd, line + len, sizeof line - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            snprintf(s->start_error, sizeof s->start_error,
                     "stdout closed before a \"listening on\" line (the server exited?); got \"%.*s\"",
                     (int)len, line);
            return -1;
        }
        len += (size_t)got;
        line[len] = '\0';
        newline = strchr(line, '\n');
        if (newline == NULL && len == sizeof line - 1) {
            snprintf(s->start_error, sizeof s->start_error, "first stdout line is too long");
            return -1;
        }
    }
    s->extra_stdout = len - (size_t)(newline + 1 - line);
    *newline = '\0';
    if (newline > line && newline[-1] == '\r')
        newline[-1] = '\0';

    static const char prefix[] = "listening on http://";
    const char *colon = strrchr(line, ':');
    long port = 0;
    if (strncmp(line, prefix, sizeof prefix - 1) == 0 && colon != NULL &&
        colon > line + sizeof prefix - 1) {
        char *end;
        port = strtol(colon + 1, &end, 10);
        if (*end != '\0')
            port = 0;
    }
    if (port <= 0 || port > 65535 || strlen(line + 13) >= sizeof s->base_url) {
        snprintf(s->start_error, sizeof s->start_error,
                 "first stdout line is \"%.200s\", expected \"listening on http://HOST:PORT\" with a real port",
                 line);
        return -1;
    }
    snprintf(s->base_url, sizeof s->base_url, "%s", line + 13);
    return 0;
}

/* Kills a server that failed to start properly and reaps it. */
static void server_abandon(struct server *s)
{
    if (s->running) {
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
            ;
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

    const char *argv[32];
    size_t argc = 0;
    argv[argc++] = g_server_path;
    argv[argc++] = "--port";
    argv[argc++] = "0";
    argv[argc++] = "--host";
    argv[argc++] = "127.0.0.1";
    for (size_t i = 0; kind->args[i] != NULL && argc < 31; i++)
        argv[argc++] = kind->args[i];
    argv[argc] = NULL;

    int pipe_fds[2];
    int err_fd = open(s->stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (err_fd < 0 || pipe(pipe_fds) != 0) {
        snprintf(s->start_error, sizeof s->start_error, "cannot set up stdio: %s", strerror(errno));
        if (err_fd >= 0)
            close(err_fd);
        expect_true(&t, 0, "%s", s->start_error);
        test_end(&t);
        return -1;
    }
    fcntl(pipe_fds[0], F_SETFD, FD_CLOEXEC);
    char **envp = server_environment(kind);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0)
            dup2(null_fd, STDIN_FILENO);
        dup2(pipe_fds[1], STDOUT_FILENO);
        dup2(err_fd, STDERR_FILENO);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed runner */
#endif
        execve(g_server_path, (char *const *)argv, envp);
        fprintf(stderr, "itest: cannot execute %s: %s\n", g_server_path, strerror(errno));
        _exit(127);
    }
    free(envp);
    close(pipe_fds[1]);
    close(err_fd);
    if (pid < 0) {
        close(pipe_fds[0]);
        snprintf(s->start_error, sizeof s->start_error, "fork failed: %s", strerror(errno));
        expect_true(&t, 0, "%s", s->start_error);
        test_end(&t);
        return -1;
    }
    s->pid = pid;
    s->running = 1;
    s->stdout_fd = pipe_fds[0];
    if (server_read_banner(s) != 0) {
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

/* Scans a server's stderr for sanitizer reports; returns how many lines match. */
static int count_sanitizer_lines(const struct server *s, char *first, size_t cap)
{
    static const char *const patterns[] = {"AddressSanitizer", "LeakSanitizer", "runtime error:",
                                           "ThreadSanitizer", "MemorySanitizer"};
    size_t len;
    char *text = read_whole_file(s->stderr_path, &len);
    int count = 0;
    first[0] = '\0';
    if (text == NULL)
        return 0;
    char *line = text;
    while (line < text + len) {
        char *end = strchr(line, '\n');
        if (end != NULL)
            *end = '\0';
        for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
            if (strstr(line, patterns[i]) != NULL) {
                if (count++ == 0)
                    snprintf(first, cap, "%.300s", line);
                break;
            }
        }
        if (end == NULL)
            break;
        line = end + 1;
    }
    free(text);
    return count;
}

/*
 * Stops a server with SIGTERM and reports three tests: it exits with status 0 within
 * SHUTDOWN_TIMEOUT_S, its stderr has no sanitizer report, and its stdout held exactly
 * the one banner line.
 */
static void server_stop(struct server *s)
{
    struct test t;
    const char *label = s->kind->label;

    test_begin(&t, "server/%s/exit-status-after-sigterm", label);
    kill(s->pid, SIGTERM);
    double deadline = now_seconds() + SHUTDOWN_TIMEOUT_S;
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(s->pid, &status, WNOHANG)) == 0 && now_seconds() < deadline)
        sleep_ms(20);
    if (done == 0) {
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
            ;
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
    int reports = count_sanitizer_lines(s, first, sizeof first);
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

/* ------------------------------------------------------------------------------------ */
/* HTTP through the curl command-line tool                                               */
/* ------------------------------------------------------------------------------------ */

#define HTTP_MAX_EXTRA_HEADERS 16
#define HTTP_MAX_RESPONSE_HEADERS 64

/* One request. Strings are borrowed; body may hold NUL bytes (body_len counts them). */
struct http_request {
    const char *method;         /* "GET", "POST", "HEAD", "OPTIONS", ... */
    const char *path;           /* appended to the server's base URL, e.g. "/v1/attention" */
    const char *request_target; /* NULL, or a literal request target such as "*" */
    const char *body;           /* NULL for no body at all; "" with body_len 0 for an empty one */
    size_t body_len;
    const char *headers[HTTP_MAX_EXTRA_HEADERS + 1]; /* "Name: value", NULL-terminated */
};

/* One response; everything in it is owned and freed by http_response_free. */
struct http_response {
    int status; /* the HTTP status, or 0 when no response arrived */
    char *body; /* NUL-terminated (the NUL is not counted in body_len) */
    size_t body_len;
    size_t header_count;
    char *header_names[HTTP_MAX_RESPONSE_HEADERS];
    char *header_values[HTTP_MAX_RESPONSE_HEADERS];
    char transport_error[512]; /* curl's complaint, empty when curl exited 0 */
};

/* A request in flight: the curl process and the stem of its temporary files. */
struct http_pending {
    pid_t pid; /* -1 when curl could not be started */
    int is_head;
    char stem[sizeof g_tmpdir + 32];
    char start_error[512];
};

static unsigned g_request_counter;

static void http_response_free(struct http_response *r)
{
    free(r->body);
    for (size_t i = 0; i < r->header_count; i++) {
        free(r->header_names[i]);
        free(r->header_values[i]);
    }
    memset(r, 0, sizeof *r);
}

/* Returns the value of the named response header (case-insensitive), or NULL. */
static const char *http_header(const struct http_response *r, const char *name)
{
    for (size_t i = 0; i < r->header_count; i++)
        if (strcasecmp(r->header_names[i], name) == 0)
            return r->header_values[i];
    return NULL;
}

/*
 * Parses curl's header dump. It may hold several responses (a 100 Continue, say);
 * only the last block counts, so the list restarts at every status line.
 */
static void http_parse_headers(char *text, struct http_response *r)
{
    char *line = text;
    while (line != NULL && *line != '\0') {
        char *end = strchr(line, '\n');
        if (end != NULL)
            *end = '\0';
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\r')
            line[--len] = '\0';
        if (strncmp(line, "HTTP/", 5) == 0) {
            for (size_t i = 0; i < r->header_count; i++) {
                free(r->header_names[i]);
                free(r->header_values[i]);
            }
            r->header_count = 0;
        } else {
            char *colon = strchr(line, ':');
            if (colon != NULL && r->header_count < HTTP_MAX_RESPONSE_HEADERS) {
                *colon = '\0';
                char *value = colon + 1;
                while (*value == ' ' || *value == '\t')
                    value++;
                size_t i = r->header_count++;
                r->header_names[i] = xcalloc(strlen(line) + 1, 1);
                strcpy(r->header_names[i], line);
                r->header_values[i] = xcalloc(strlen(value) + 1, 1);
                strcpy(r->header_values[i], value);
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
}

/*
 * Starts curl for one request without waiting for it. The body goes through a file
 * (--data-binary @file keeps every byte). A JSON Content-Type is added to requests with
 * a body unless the request names its own, and "Expect:" turns off 100-continue.
 * Always fills p; on failure p->pid is -1 and http_finish reports p->start_error.
 */
static void http_start(const struct server *s, const struct http_request *rq, struct http_pending *p)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->is_head = strcmp(rq->method, "HEAD") == 0;
    snprintf(p->stem, sizeof p->stem, "%s/req-%u", g_tmpdir, ++g_request_counter);

    char in_path[PATH_MAX], out_path[PATH_MAX], hdr_path[PATH_MAX], code_path[PATH_MAX],
        err_path[PATH_MAX], data_arg[PATH_MAX + 1], url[1024];
    snprintf(in_path, sizeof in_path, "%s.in", p->stem);
    snprintf(out_path, sizeof out_path, "%s.out", p->stem);
    snprintf(hdr_path, sizeof hdr_path, "%s.hdr", p->stem);
    snprintf(code_path, sizeof code_path, "%s.code", p->stem);
    snprintf(err_path, sizeof err_path, "%s.err", p->stem);
    snprintf(data_arg, sizeof data_arg, "@%s", in_path);
    snprintf(url, sizeof url, "%s%s", s->base_url, rq->request_target != NULL ? "/" : rq->path);

    if (rq->body != NULL && write_whole_file(in_path, rq->body, rq->body_len) != 0) {
        snprintf(p->start_error, sizeof p->start_error, "cannot write %.400s", in_path);
        return;
    }

    const char *argv[64];
    size_t argc = 0;
    int has_content_type = 0;
    argv[argc++] = "curl";
    argv[argc++] = "--silent";
    argv[argc++] = "--show-error";
    argv[argc++] = "--max-time";
    argv[argc++] = "60";
    argv[argc++] = "--connect-timeout";
    argv[argc++] = "5";
    argv[argc++] = "--output";
    argv[argc++] = out_path;
    argv[argc++] = "--dump-header";
    argv[argc++] = hdr_path;
    argv[argc++] = "--write-out";
    argv[argc++] = "%{http_code}";
    if (p->is_head) {
        argv[argc++] = "--head";
    } else {
        argv[argc++] = "--request";
        argv[argc++] = rq->method;
    }
    if (rq->request_target != NULL) {
        argv[argc++] = "--request-target";
        argv[argc++] = rq->request_target;
    }
    for (size_t i = 0; i < HTTP_MAX_EXTRA_HEADERS && rq->headers[i] != NULL; i++) {
        argv[argc++] = "--header";
        argv[argc++] = rq->headers[i];
        if (strncasecmp(rq->headers[i], "Content-Type:", 13) == 0)
            has_content_type = 1;
    }
    if (rq->body != NULL) {
        if (!has_content_type) {
            argv[argc++] = "--header";
            argv[argc++] = "Content-Type: application/json";
        }
        argv[argc++] = "--header";
        argv[argc++] = "Expect:";
        argv[argc++] = "--data-binary";
        argv[argc++] = data_arg;
    }
    argv[argc++] = url;
    argv[argc] = NULL;

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDONLY);
        int code_fd = open(code_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (null_fd < 0 || code_fd < 0 || err_fd < 0)
            _exit(126);
        dup2(null_fd, STDIN_FILENO);
        dup2(code_fd, STDOUT_FILENO);
        dup2(err_fd, STDERR_FILENO);
        execvp("curl", (char *const *)argv);
        fprintf(stderr, "cannot execute curl: %s\n", strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        snprintf(p->start_error, sizeof p->start_error, "fork failed: %s", strerror(errno));
        return;
    }
    p->pid = pid;
}

/* Waits for the curl process of p, fills r (which the caller frees) and removes the files. */
static void http_finish(struct http_pending *p, struct http_response *r)
{
    memset(r, 0, sizeof *r);
    static const char *const suffixes[] = {".in", ".out", ".hdr", ".code", ".err"};
    char path[PATH_MAX];
    size_t len;

    if (p->pid < 0) {
        snprintf(r->transport_error, sizeof r->transport_error, "%s", p->start_error);
        r->body = xcalloc(1, 1);
        return;
    }
    int status = 0;
    while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
        ;
    int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    snprintf(path, sizeof path, "%s.code", p->stem);
    char *code = read_whole_file(path, &len);
    r->status = code != NULL ? atoi(code) : 0;
    free(code);

    if (exit_code != 0) {
        snprintf(path, sizeof path, "%s.err", p->stem);
        char *err = read_whole_file(path, &len);
        if (err != NULL && len > 0 && err[len - 1] == '\n')
            err[len - 1] = '\0';
        snprintf(r->transport_error, sizeof r->transport_error, "curl exited with %d: %.400s", exit_code,
                 err != NULL ? err : "");
        free(err);
    }

    snprintf(path, sizeof path, "%s.out", p->stem);
    r->body = read_whole_file(path, &r->body_len);
    if (r->body == NULL || p->is_head) {
        /* With --head, curl writes the headers where the body would go. */
        free(r->body);
        r->body = xcalloc(1, 1);
        r->body_len = 0;
    }
    snprintf(path, sizeof path, "%s.hdr", p->stem);
    char *headers = read_whole_file(path, &len);
    if (headers != NULL)
        http_parse_headers(headers, r);
    free(headers);

    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(path, sizeof path, "%s%s", p->stem, suffixes[i]);
        unlink(path);
    }
}

/* Sends one request and waits for the response (which the caller frees). */
static void http_call(const struct server *s, const struct http_request *rq, struct http_response *r)
{
    struct http_pending p;
    http_start(s, rq, &p);
    http_finish(&p, r);
}

/* Sends a request without a body. */
static void http_simple(const struct server *s, const char *method, const char *path, struct http_response *r)
{
    struct http_request rq = {.method = method, .path = path};
    http_call(s, &rq, r);
}

/* POSTs a JSON value (serialized compactly; jansson prints reals round-trippably). */
static void http_post_json(const struct server *s, const char *path, const json_t *body, struct http_response *r)
{
    char *text = json_dumps(body, JSON_COMPACT);
    struct http_request rq = {.method = "POST", .path = path, .body = text, .body_len = strlen(text)};
    http_call(s, &rq, r);
    free(text);
}

/* Parses a response body as JSON; returns a new reference or NULL. */
static json_t *response_json(const struct http_response *r)
{
    return json_loadb(r->body, r->body_len, 0, NULL);
}

/* Checks the status of r and, on a mismatch, shows the response body as context. */
static int expect_status(struct test *t, const struct http_response *r, int want)
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
static int expect_header_contains(struct test *t, const struct http_response *r, const char *name, const char *want)
{
    const char *value = http_header(r, name);
    if (!expect_true(t, value != NULL, "no %s header", name))
        return 0;
    return expect_true(t, find_case_insensitive(value, want) != NULL, "%s is \"%s\", expected it to contain \"%s\"",
                       name, value, want);
}

/* Checks that header name is present with exactly the value want. */
static int expect_header_equals(struct test *t, const struct http_response *r, const char *name, const char *want)
{
    const char *value = http_header(r, name);
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
 * POSTs each fixture's request and checks the status and, for a 200, every element of
 * "output" and "attention" that the fixture gives, within the fixture's tolerance.
 * A fixture that expects an error with expect.code has its error code checked instead.
 */
static void run_fixture_tests(const char *dir)
{
    struct test t;
    size_t count;
    char **files = list_json_files(dir, &count);
    if (test_begin(&t, "fixtures/present")) {
        expect_true(&t, files != NULL && count > 0, "no *.json fixtures in %s", dir);
        test_end(&t);
    }
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
        struct http_response r = {0};
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
        http_response_free(&r);
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
static const json_t *expect_error_body(struct test *t, const struct http_response *r, json_t **body_out)
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
    struct http_response r = {0};
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
        body = xcalloc(body_len + 1, 1);
        memcpy(body, json_string_value(raw), body_len);
    }
    if (json_is_integer(pad) && body != NULL && (size_t)json_integer_value(pad) > body_len) {
        size_t want = (size_t)json_integer_value(pad);
        char *padded = xcalloc(want + 1, 1);
        memcpy(padded, body, body_len);
        memset(padded + body_len, ' ', want - body_len); /* whitespace keeps the JSON valid */
        free(body);
        body = padded;
        body_len = want;
    }

    struct http_request rq = {
        .method = method != NULL ? method : "POST",
        .path = path != NULL ? path : "/v1/attention",
        .body = body,
        .body_len = body_len,
    };
    char header_lines[HTTP_MAX_EXTRA_HEADERS][512];
    size_t header_count = 0;
    const char *hname;
    json_t *hvalue;
    json_object_foreach((json_t *)headers, hname, hvalue) {
        if (header_count < HTTP_MAX_EXTRA_HEADERS && json_is_string(hvalue)) {
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
    expect_true(&t, http_header(&r, "Access-Control-Allow-Origin") != NULL, "no Access-Control-Allow-Origin header");

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
    http_response_free(&r);
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
        struct http_response r;
        http_simple(s, "GET", "/healthz", &r);
        expect_status(&t, &r, 200);
        http_response_free(&r);
        struct http_request rq = {.method = "POST", .path = "/v1/attention", .body = g_tiny_request,
                                  .body_len = strlen(g_tiny_request)};
        http_call(s, &rq, &r);
        expect_status(&t, &r, 200);
        http_response_free(&r);
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
    char **files = list_json_files(dir, &count);
    if (test_begin(&t, "cases/present")) {
        expect_true(&t, files != NULL && count > 0, "no *.json case files in %s", dir);
        test_end(&t);
    }
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
    struct http_response r = {0};
    json_t *body = NULL;
    if (s == NULL)
        goto done;
    http_simple(s, "GET", "/v1/info", &r);
    if (!expect_status(&t, &r, 200))
        goto done;
    body = response_json(&r);
    const json_t *blas = json_object_get(body, "blas");
    const json_t *limits = json_object_get(body, "limits");
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
        !expect_true(&t, json_is_object(limits), "no limits object"))
        goto done;
    expect_json_integer(&t, blas, "blas", "threads", g_expected_blas_threads[id]);
    expect_json_integer(&t, limits, "limits", "max_body_bytes", g_expected_max_body[id]);
    expect_json_integer(&t, limits, "limits", "max_elements", g_expected_max_elements[id]);
    expect_true(&t, has64 && has32, "dtypes does not list both float64 and float32");
done:
    json_decref(body);
    http_response_free(&r);
    test_end(&t);
}

/* Sends a CORS preflight for path and checks the answer; allow_method must be listed. */
static void check_preflight(const char *name, enum server_id id, const char *path, const char *request_target,
                            const char *allow_method)
{
    struct test t;
    if (!test_begin(&t, "%s", name))
        return;
    struct server *s = test_server(&t, id);
    if (s != NULL) {
        struct http_request rq = {.method = "OPTIONS", .path = path, .request_target = request_target};
        rq.headers[0] = "Origin: https://viz.example";
        rq.headers[1] = "Access-Control-Request-Method: POST";
        rq.headers[2] = "Access-Control-Request-Headers: content-type";
        struct http_response r;
        http_call(s, &rq, &r);
        if (r.status != 204)
            expect_status(&t, &r, 200); /* 204 is what DESIGN.md says; 200 is tolerated */
        expect_header_equals(&t, &r, "Access-Control-Allow-Origin", g_expected_origin[id]);
        expect_header_contains(&t, &r, "Access-Control-Allow-Methods", allow_method);
        expect_true(&t, http_header(&r, "Access-Control-Allow-Headers") != NULL, "no Access-Control-Allow-Headers");
        expect_true(&t, http_header(&r, "Access-Control-Max-Age") != NULL, "no Access-Control-Max-Age");
        http_response_free(&r);
    }
    test_end(&t);
}

/* Sends one request and checks status and the exact Access-Control-Allow-Origin value. */
static void check_cors_origin(const char *name, enum server_id id, const char *method, const char *path,
                              const char *body, int want_status)
{
    struct test t;
    if (!test_begin(&t, "%s", name))
        return;
    struct server *s = test_server(&t, id);
    if (s != NULL) {
        struct http_request rq = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
        rq.headers[0] = "Origin: https://viz.example";
        struct http_response r;
        http_call(s, &rq, &r);
        expect_status(&t, &r, want_status);
        expect_header_equals(&t, &r, "Access-Control-Allow-Origin", g_expected_origin[id]);
        http_response_free(&r);
    }
    test_end(&t);
}

/* GETs path and checks a 200 JSON answer whose "status" member is want_status_text. */
static void check_status_endpoint(const char *name, const char *path, const char *want_status_text)
{
    struct test t;
    if (!test_begin(&t, "%s", name))
        return;
    struct server *s = test_server(&t, SERVER_DEFAULT);
    if (s != NULL) {
        struct http_response r;
        http_simple(s, "GET", path, &r);
        if (expect_status(&t, &r, 200)) {
            json_t *body = response_json(&r);
            const char *status = json_string_value(json_object_get(body, "status"));
            expect_true(&t, status != NULL && strcmp(status, want_status_text) == 0,
                        "body \"status\" is %s, expected \"%s\"", status ? status : "(missing)", want_status_text);
            expect_header_contains(&t, &r, "Content-Type", "application/json");
            json_decref(body);
        }
        http_response_free(&r);
    }
    test_end(&t);
}

/*
 * Health, readiness, info, metrics, HEAD, CORS (preflight, on every kind of response,
 * with a configured origin) and the Allow header of 405 answers.
 */
static void run_protocol_tests(void)
{
    struct test t;
    struct http_response r;
    struct server *s;

    check_status_endpoint("protocol/healthz", "/healthz", "ok");
    check_status_endpoint("protocol/readyz", "/readyz", "ready");

    if (test_begin(&t, "protocol/head-healthz")) {
        if ((s = test_server(&t, SERVER_DEFAULT)) != NULL) {
            http_simple(s, "HEAD", "/healthz", &r);
            expect_status(&t, &r, 200);
            expect_true(&t, http_header(&r, "Access-Control-Allow-Origin") != NULL,
                        "no Access-Control-Allow-Origin header");
            http_response_free(&r);
        }
        test_end(&t);
    }

    check_info(SERVER_DEFAULT);
    check_info(SERVER_SMALL_LIMITS);
    check_info(SERVER_CORS);

    /* Metrics come after some traffic, so the request counter must have a 200 in it. */
    if (test_begin(&t, "protocol/metrics")) {
        if ((s = test_server(&t, SERVER_DEFAULT)) != NULL) {
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
            http_response_free(&r);
        }
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

    if (test_begin(&t, "protocol/405-allow/attention")) {
        if ((s = test_server(&t, SERVER_DEFAULT)) != NULL) {
            http_simple(s, "GET", "/v1/attention", &r);
            expect_status(&t, &r, 405);
            expect_header_contains(&t, &r, "Allow", "POST");
            expect_header_contains(&t, &r, "Allow", "OPTIONS");
            http_response_free(&r);
        }
        test_end(&t);
    }
    if (test_begin(&t, "protocol/405-allow/healthz")) {
        if ((s = test_server(&t, SERVER_DEFAULT)) != NULL) {
            http_simple(s, "POST", "/healthz", &r);
            expect_status(&t, &r, 405);
            expect_header_contains(&t, &r, "Allow", "GET");
            http_response_free(&r);
        }
        test_end(&t);
    }
    if (test_begin(&t, "protocol/attention-content-type")) {
        if ((s = test_server(&t, SERVER_DEFAULT)) != NULL) {
            struct http_request rq = {.method = "POST", .path = "/v1/attention", .body = g_tiny_request,
                                      .body_len = strlen(g_tiny_request)};
            http_call(s, &rq, &r);
            expect_status(&t, &r, 200);
            expect_header_contains(&t, &r, "Content-Type", "application/json");
            http_response_free(&r);
        }
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

/* splitmix64: a small, well-mixed generator; one state per case keeps cases independent. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Returns a uniform number in [-1, 1). */
static double rng_uniform(uint64_t *state)
{
    return (double)(rng_next(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

/* Fills n values uniform in [-magnitude, magnitude), rounded to float when float32. */
static double *random_values(uint64_t *state, size_t n, double magnitude, int float32)
{
    double *a = xcalloc(n, sizeof *a);
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
    struct http_response r = {0};
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
        cb.q = xcalloc(batch * lq * qk_width, sizeof(double));
        cb.k = xcalloc(batch * lk * qk_width, sizeof(double));
        cb.v = xcalloc(batch * lk * v_width, sizeof(double));
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
        cb.mask = xcalloc(batch * lq * lk, 1);
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
    cb.out = xcalloc(batch * lq * v_width, sizeof(double));
    cb.attn = xcalloc(batch * heads * lq * lk, sizeof(double));
    ref_sdpa(batch, heads, lq, lk, rc->dk, rc->dv, cb.q, cb.k, cb.v, cb.mask, rc->causal, scale, cb.out, cb.attn);
    const double *final = cb.out;
    if (rc->d_out > 0) {
        cb.final = xcalloc(batch * lq * rc->d_out, sizeof(double));
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
    http_response_free(&r);
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
        struct http_pending pending[CONCURRENT_VALID + CONCURRENT_GARBAGE];
        for (int i = 0; i < CONCURRENT_VALID + CONCURRENT_GARBAGE; i++) {
            /* Interleave the garbage among the valid requests. */
            int is_garbage = i % 5 == 2;
            const char *text = is_garbage ? garbage[(i / 5) % CONCURRENT_GARBAGE] : request_text;
            struct http_request rq = {.method = "POST", .path = "/v1/attention", .body = text,
                                      .body_len = strlen(text)};
            http_start(s, &rq, &pending[i]);
        }
        for (int i = 0; i < CONCURRENT_VALID + CONCURRENT_GARBAGE; i++) {
            int is_garbage = i % 5 == 2;
            struct http_response r;
            http_finish(&pending[i], &r);
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
            http_response_free(&r);
        }
        test_end(&t);
    }
    check_still_serving("concurrency", SERVER_DEFAULT);
    free(request_text);
    json_decref(chosen);
}

/* ------------------------------------------------------------------------------------ */
/* Main                                                                                  */
/* ------------------------------------------------------------------------------------ */

static void usage(FILE *to, const char *argv0)
{
    fprintf(to,
            "usage: %s --server PATH --fixtures DIR --cases DIR [--filter SUBSTR]\n"
            "  Starts the attention server at PATH on free loopback ports and runs the\n"
            "  integration tests; --filter runs only tests whose name contains SUBSTR.\n",
            argv0);
}

/* Removes the temporary directory, which holds only files this program created. */
static void remove_tmpdir(void)
{
    DIR *d = opendir(g_tmpdir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[sizeof g_tmpdir + 300];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%.280s", g_tmpdir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(g_tmpdir);
}

int main(int argc, char **argv)
{
    const char *fixtures = NULL, *cases = NULL;
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
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0' || strlen(tmp) > 200)
        tmp = "/tmp";
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/itest.XXXXXX", tmp);
    if (mkdtemp(g_tmpdir) == NULL) {
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

    for (int id = 0; id < SERVER_COUNT; id++)
        if (g_servers[id].running)
            server_stop(&g_servers[id]);

    printf("%d passed, %d failed\n", g_passed, g_failed);
    if (g_failed > 0)
        fprintf(stderr, "itest: kept server logs in %s\n", g_tmpdir);
    else
        remove_tmpdir();
    return g_failed > 0 ? 1 : 0;
}

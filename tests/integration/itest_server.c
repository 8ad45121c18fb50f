/*
 * itest_server.c - the server processes of the integration runner: the kinds of server
 * (flags and environment), starting one on a free loopback port and reading its banner,
 * stopping it with SIGTERM and checking how it exited, and the still-serving check.
 */
#include "itest.h"

#include <fcntl.h>

extern char **environ;

const char *const g_no_strings[] = {NULL};
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

const struct server_kind g_server_kinds[SERVER_COUNT] = {
    [SERVER_DEFAULT] = {"default", g_no_strings, g_no_strings},
    [SERVER_SMALL_LIMITS] = {"small-limits", g_small_args, g_no_strings},
    [SERVER_CORS] = {"cors", g_cors_args, g_cors_env},
    [SERVER_SMALL_STORE] = {"small-store", g_small_store_args, g_no_strings},
};

/* What the info test expects of each kind: body limit, element limit, compute threads
 * (0: one per available CPU, as the server reports them). */
const long long g_expected_max_body[SERVER_COUNT] = {64LL << 20, 4096, 8192, 64LL << 20};
const long long g_expected_max_elements[SERVER_COUNT] = {8LL << 20, 1000, 12345, 8LL << 20};
const long long g_expected_compute_threads[SERVER_COUNT] = {0, 0, 3, 0};

const char *g_server_path;
struct server g_servers[SERVER_COUNT];

void detail_stderr_tail(struct test *t, const struct server *s, int lines)
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
 * ATTN_KERNEL alone is passed on: it forces the attention kernel's instruction set, which
 * must not change any answer, and tests/run.sh runs suites with each path forced.  Every
 * server gets ATTN_GRPC_PORT=0: these suites speak HTTP, and no two servers (nor one of the
 * user's) may contend for gRPC's default port (tests/grpc/ tests gRPC).
 * The caller frees the returned array (the strings are borrowed).
 */
static char **server_environment(const struct server_kind *kind)
{
    size_t n = 0, extra = 0;
    while (environ[n] != NULL)
        n++;
    while (kind->env[extra] != NULL)
        extra++;
    char **envp = client_xcalloc(n + extra + 2, sizeof *envp);
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ATTN_", 5) != 0 || strncmp(environ[i], "ATTN_KERNEL=", 12) == 0)
            envp[used++] = environ[i];
    envp[used++] = (char *)"ATTN_GRPC_PORT=0";
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

int server_start(struct server *s)
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
    pid_t pid = client_spawn_server(argv, envp, s->stderr_path, s->append_stderr, &s->stdout_fd, s->start_error,
                                    sizeof s->start_error);
    free(envp);
    if (pid < 0) {
        expect_true(&t, 0, "%s", s->start_error);
        test_end(&t);
        return -1;
    }
    s->pid = pid;
    s->running = 1;
    s->port = client_read_banner(s->stdout_fd, STARTUP_TIMEOUT_S, s->base_url, sizeof s->base_url,
                                 &s->extra_stdout, s->start_error, sizeof s->start_error);
    if (s->port < 0) {
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

struct server *test_server(struct test *t, enum server_id id)
{
    struct server *s = server_get(id);
    expect_true(t, s != NULL, "server %s is not running: %s", g_server_kinds[id].label,
                g_servers[id].start_error);
    return s;
}

int test_start(struct test *t, enum server_id id, struct server **s, const char *name)
{
    if (!test_begin(t, "%s", name))
        return 0;
    if ((*s = test_server(t, id)) == NULL) {
        test_end(t);
        return 0;
    }
    return 1;
}

int server_wait_exit(struct server *s)
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
    } else if (!s->any_exit_status) {
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
    return done == 1;
}

int server_stop(struct server *s)
{
    kill(s->pid, SIGTERM);
    return server_wait_exit(s);
}

/* A tiny valid request used to show that a server still computes after bad input. */
const char g_tiny_request[] = "{\"q\":[[1,0],[0,1]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]]}";

void check_still_serving(const char *name_prefix, enum server_id id)
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

int step_start(struct test *t, enum server_id id, struct server **s, const char *name, int *report)
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

void step_end(struct test *t, int report)
{
    if (report)
        test_end(t);
}

int run_quietly(const char *const *argv, char *const *envp, double timeout_s)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        if (envp != NULL)
            execve(argv[0], (char *const *)argv, envp);
        else
            execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (client_wait_exit(pid, timeout_s, &status) != 1 || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

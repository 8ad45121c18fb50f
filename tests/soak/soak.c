/*
 * soak.c - the server under steady load, three times over (`make soak`).
 *
 * Starts the server (client.h), then three runs of --seconds each (60 by default) at
 * --connections keep-alive connections (256 by default), one client thread each, sending
 * small and medium attention bodies in turn.  Checks that every answer is 200 or the
 * documented 503 with Retry-After, that the server's resident memory grows by less than 5%
 * from the end of the second run to the end of the third (the first warms the allocator
 * and the caches), and that its open file descriptors after each run are the same (every
 * connection is closed before they are counted).  Loopback only; ends with
 * "N passed, N failed".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "integration/client.h"
#include "integration/rawhttp.h"

static int g_port;
static double g_until;
static char *g_bodies[2];
static size_t g_body_len[2];
static atomic_long g_ok, g_busy, g_errors;
static char g_first_error[512];
static pthread_mutex_t g_error_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_error(const char *fmt, int status, const char *body)
{
    atomic_fetch_add(&g_errors, 1);
    pthread_mutex_lock(&g_error_lock);
    if (g_first_error[0] == '\0')
        snprintf(g_first_error, sizeof g_first_error, fmt, status, body ? body : "");
    pthread_mutex_unlock(&g_error_lock);
}

/* One client: requests on a keep-alive connection until the run ends. */
static void *client_main(void *arg)
{
    long id = (long)(intptr_t)arg;
    int fd = -1;
    for (long i = id; client_now_seconds() < g_until; i++) {
        if (fd < 0 && (fd = rawhttp_connect_from("127.0.0.1", g_port)) < 0) {
            note_error("cannot connect (%d)%s", 0, NULL);
            client_sleep_ms(100);
            continue;
        }
        int which = (int)(i % 4 == 3); /* one medium body in four */
        char head[256];
        int n = snprintf(head, sizeof head, "POST /v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                         g_body_len[which]);
        rawhttp_answer a;
        if (rawhttp_send_all(fd, head, (size_t)n) != 0 ||
            rawhttp_send_all(fd, g_bodies[which], g_body_len[which]) != 0 ||
            rawhttp_read_answer(fd, 60.0, &a) != 0) {
            note_error("no answer on a kept-alive connection (%d)%s", 0, NULL);
            close(fd);
            fd = -1;
            continue;
        }
        if (a.status == 200)
            atomic_fetch_add(&g_ok, 1);
        else if (a.status == 503 && strcasestr(a.head, "\r\nRetry-After:") != NULL)
            atomic_fetch_add(&g_busy, 1);
        else
            note_error("status %d: %.300s", a.status, a.body);
        if (strcasestr(a.head, "\r\nConnection: close") != NULL) {
            close(fd);
            fd = -1;
        }
        rawhttp_answer_free(&a);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static long proc_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return kib;
}

static long proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* An attention body of l rows of width d for q, k and v. */
static char *make_body(size_t l, size_t d, size_t *len)
{
    size_t cap = 3 * l * (d * 8 + 4) + 64, n = 0;
    char *b = client_xcalloc(cap, 1);
    n += (size_t)sprintf(b, "{\"return_attention\":false");
    static const char *const names[3] = {"q", "k", "v"};
    for (int m = 0; m < 3; m++) {
        n += (size_t)sprintf(b + n, ",\"%s\":[", names[m]);
        for (size_t i = 0; i < l; i++) {
            b[n++] = '[';
            for (size_t j = 0; j < d; j++)
                n += (size_t)sprintf(b + n, "%s%.2f", j ? "," : "", (double)((i * 7 + j * 3 + (size_t)m) % 19) / 10 - 0.9);
            n += (size_t)sprintf(b + n, "]%s", i + 1 < l ? "," : "");
        }
        b[n++] = ']';
    }
    b[n++] = '}';
    *len = n;
    return b;
}

/* One run: `connections` clients for `seconds`; then the server's RSS and open
 * descriptors.  Reports soak/run-N-no-errors; returns 1 when it passed. */
static int soak_run(int run, pid_t pid, pthread_t *threads, long connections, long seconds, long *rss, long *fds)
{
    atomic_store(&g_ok, 0);
    atomic_store(&g_busy, 0);
    atomic_store(&g_errors, 0);
    g_first_error[0] = '\0';
    g_until = client_now_seconds() + (double)seconds;
    long started = 0;
    for (long c = 0; c < connections; c++)
        if (pthread_create(&threads[c], NULL, client_main, (void *)(intptr_t)c) == 0)
            started++;
        else
            break;
    for (long c = 0; c < started; c++)
        pthread_join(threads[c], NULL);
    client_sleep_ms(500); /* the server sees the closes */
    *rss = proc_rss_kib(pid);
    *fds = proc_fds(pid);
    long errors = atomic_load(&g_errors);
    printf("run %d: %ld ok, %ld documented 503, %ld errors; %.0f answers/s; RSS %ld KiB, "
           "%ld fds\n", run + 1, atomic_load(&g_ok), atomic_load(&g_busy), errors,
           (double)(atomic_load(&g_ok) + atomic_load(&g_busy)) / (double)seconds, *rss,
           *fds);
    int ok = errors == 0 && started == connections && atomic_load(&g_ok) > 0;
    if (ok)
        printf("ok   soak/run-%d-no-errors\n", run + 1);
    else
        printf("FAIL soak/run-%d-no-errors: %ld errors, %ld of %ld clients; first: %s\n",
               run + 1, errors, started, connections, g_first_error);
    fflush(stdout);
    return ok;
}

/* soak/rss-growth-under-5% and soak/fds-flat, from what the three runs left; adds to
 * the counts. */
static void soak_leaks(const long *rss, const long *fds, int *passed, int *failed)
{
    if (rss[1] > 0 && rss[2] <= rss[1] + rss[1] / 20) {
        (*passed)++;
        printf("ok   soak/rss-growth-under-5%%\n");
    } else {
        (*failed)++;
        printf("FAIL soak/rss-growth-under-5%%: %ld KiB after run 2, %ld KiB after run 3\n",
               rss[1], rss[2]);
    }
    if (fds[0] > 0 && fds[0] == fds[1] && fds[1] == fds[2]) {
        (*passed)++;
        printf("ok   soak/fds-flat\n");
    } else {
        (*failed)++;
        printf("FAIL soak/fds-flat: %ld, %ld, %ld open descriptors after the runs\n", fds[0],
               fds[1], fds[2]);
    }
}

int main(int argc, char **argv)
{
    client_set_program_name("soak");
    const char *server_path = NULL;
    long seconds = 60, connections = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--server"))
            server_path = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--connections"))
            connections = atol(argv[i + 1]);
    }
    if (server_path == NULL || seconds < 1 || seconds > 3600 || connections < 1 ||
        connections > 4096) {
        fprintf(stderr, "usage: soak --server PATH [--seconds 1..3600] [--connections 1..4096]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char tmp[256], data[300], err_path[300], why[256], url[64];
    if (client_make_temp_dir(tmp, sizeof tmp, NULL, "soak") != 0)
        return 2;
    snprintf(data, sizeof data, "%s/data", tmp);
    snprintf(err_path, sizeof err_path, "%s/server.err", tmp);
    const char *args[] = {server_path, "--port", "0", "--data-dir", data, "--quiet", NULL};
    int out_fd;
    pid_t pid = client_spawn_server(args, NULL, err_path, 0, &out_fd, why, sizeof why);
    if (pid < 0 || (g_port = client_read_banner(out_fd, 20.0, url, sizeof url, NULL, why,
                                                sizeof why)) < 0) {
        printf("FAIL soak/start: %s\n0 passed, 1 failed\n", why);
        return 1;
    }
    g_bodies[0] = make_body(4, 8, &g_body_len[0]);       /* small: about 0.4 KB */
    g_bodies[1] = make_body(128, 64, &g_body_len[1]);    /* medium: about 100 KB */
    int passed = 0, failed = 0;
    long rss[3] = {0}, fds[3] = {0};
    pthread_t *threads = client_xcalloc((size_t)connections, sizeof *threads);
    for (int run = 0; run < 3; run++) {
        if (soak_run(run, pid, threads, connections, seconds, &rss[run], &fds[run]))
            passed++;
        else
            failed++;
    }
    soak_leaks(rss, fds, &passed, &failed);
    kill(pid, SIGTERM);
    int status = 0;
    int exited = client_wait_exit(pid, 30.0, &status);
    if (exited == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        passed++;
        printf("ok   soak/clean-exit\n");
    } else {
        failed++;
        printf("FAIL soak/clean-exit: the server did not exit 0 within 30 s of SIGTERM\n");
    }
    close(out_fd);
    free(threads);
    free(g_bodies[0]);
    free(g_bodies[1]);
    if (failed == 0)
        client_remove_tree(tmp);
    else
        printf("soak: kept the server's stderr in %s\n", err_path);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

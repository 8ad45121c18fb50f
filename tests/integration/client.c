/*
 * client.c - the client side shared by the integration programs: the server as a child
 * process, HTTP through curl, and small file, time and random-number helpers. See
 * client.h for the contract of each function.
 *
 * The module's only state is the program name for messages and the counter that names
 * the files of each request, so its functions are meant for one thread; client_sleep_ms
 * and client_rng_next touch nothing but their arguments and may be called from any (as
 * crashtest's killer thread does).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

static const char *g_program_name = "client";
static unsigned g_request_counter;

/* ------------------------------------------------------------------------------------ */
/* Small utilities                                                                       */
/* ------------------------------------------------------------------------------------ */

void client_set_program_name(const char *name)
{
    g_program_name = name;
}

/* Ends the program after a failed allocation. */
static void out_of_memory(void)
{
    fprintf(stderr, "%s: out of memory\n", g_program_name);
    exit(2);
}

void *client_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL)
        out_of_memory();
    return p;
}

void *client_xrealloc(void *p, size_t size)
{
    void *bigger = realloc(p, size);
    if (bigger == NULL)
        out_of_memory();
    return bigger;
}

double client_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void client_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

uint64_t client_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------------------------------ */
/* Files and directories                                                                 */
/* ------------------------------------------------------------------------------------ */

char *client_read_file(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, used = 0;
    char *buf = client_xcalloc(cap, 1);
    for (;;) {
        if (used + 1 >= cap) {
            cap *= 2;
            buf = client_xrealloc(buf, cap);
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

int client_write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

int client_make_temp_dir(char *out, size_t cap, const char *parent, const char *prefix)
{
    if (parent == NULL) {
        parent = getenv("TMPDIR");
        if (parent == NULL || parent[0] == '\0' || strlen(parent) > 200)
            parent = "/tmp";
    }
    snprintf(out, cap, "%s/%sXXXXXX", parent, prefix);
    return mkdtemp(out) != NULL ? 0 : -1;
}

void client_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            client_remove_tree(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int client_count_sanitizer_lines(const char *path, char *first, size_t cap)
{
    static const char *const patterns[] = {"AddressSanitizer", "LeakSanitizer", "runtime error:",
                                           "ThreadSanitizer", "MemorySanitizer"};
    size_t len;
    char *text = client_read_file(path, &len);
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

/* ------------------------------------------------------------------------------------ */
/* The server process                                                                    */
/* ------------------------------------------------------------------------------------ */

pid_t client_spawn_server(const char *const *argv, char *const *envp, const char *stderr_path, int append,
                          int *stdout_fd, char *why, size_t why_cap)
{
    int pipe_fds[2];
    int err_fd = open(stderr_path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0600);
    if (err_fd < 0 || pipe(pipe_fds) != 0) {
        snprintf(why, why_cap, "cannot set up stdio: %s", strerror(errno));
        if (err_fd >= 0)
            close(err_fd);
        return -1;
    }
    fcntl(pipe_fds[0], F_SETFD, FD_CLOEXEC);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0)
            dup2(null_fd, STDIN_FILENO);
        dup2(pipe_fds[1], STDOUT_FILENO);
        dup2(err_fd, STDERR_FILENO);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test program */
#endif
        execve(argv[0], (char *const *)argv, envp != NULL ? envp : environ);
        fprintf(stderr, "%s: cannot execute %s: %s\n", g_program_name, argv[0], strerror(errno));
        _exit(127);
    }
    int fork_errno = errno;
    close(pipe_fds[1]);
    close(err_fd);
    if (pid < 0) {
        close(pipe_fds[0]);
        snprintf(why, why_cap, "fork failed: %s", strerror(fork_errno));
        return -1;
    }
    *stdout_fd = pipe_fds[0];
    return pid;
}

int client_read_banner(int fd, double timeout_s, char *base_url, size_t url_cap, size_t *extra, char *why,
                       size_t why_cap)
{
    char line[512];
    size_t len = 0;
    double deadline = client_now_seconds() + timeout_s;
    char *newline = NULL;
    while (newline == NULL) {
        double left = deadline - client_now_seconds();
        if (left <= 0) {
            snprintf(why, why_cap, "no \"listening on\" line on stdout within %.0f s", timeout_s);
            return -1;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            continue; /* the deadline check above reports the timeout */
        ssize_t got = read(fd, line + len, sizeof line - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            snprintf(why, why_cap,
                     "stdout closed before a \"listening on\" line (the server exited?); got \"%.*s\"",
                     (int)len, line);
            return -1;
        }
        len += (size_t)got;
        line[len] = '\0';
        newline = strchr(line, '\n');
        if (newline == NULL && len == sizeof line - 1) {
            snprintf(why, why_cap, "first stdout line is too long");
            return -1;
        }
    }
    if (extra != NULL)
        *extra = len - (size_t)(newline + 1 - line);
    *newline = '\0';
    if (newline > line && newline[-1] == '\r')
        newline[-1] = '\0';

    /* "https://" when the server was started with --tls-cert. */
    static const char prefix[] = "listening on http://";
    static const char tls_prefix[] = "listening on https://";
    size_t prefix_len = strncmp(line, tls_prefix, sizeof tls_prefix - 1) == 0 ? sizeof tls_prefix - 1
                                                                              : sizeof prefix - 1;
    const char *colon = strrchr(line, ':');
    long port = 0;
    if ((strncmp(line, prefix, sizeof prefix - 1) == 0 || prefix_len == sizeof tls_prefix - 1) &&
        colon != NULL && colon > line + prefix_len) {
        char *end;
        port = strtol(colon + 1, &end, 10);
        if (*end != '\0')
            port = 0;
    }
    if (port <= 0 || port > 65535 || strlen(line + 13) >= url_cap) {
        snprintf(why, why_cap,
                 "first stdout line is \"%.200s\", expected \"listening on http://HOST:PORT\" with a real port",
                 line);
        return -1;
    }
    snprintf(base_url, url_cap, "%s", line + 13);
    return (int)port;
}

int client_wait_exit(pid_t pid, double timeout_s, int *status)
{
    double deadline = client_now_seconds() + timeout_s;
    pid_t done = 0;
    while ((done = waitpid(pid, status, WNOHANG)) == 0 && client_now_seconds() < deadline)
        client_sleep_ms(20);
    if (done == 0) {
        client_kill_and_reap(pid, status);
        return 0;
    }
    return done < 0 ? -1 : 1;
}

void client_kill_and_reap(pid_t pid, int *status)
{
    kill(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------------------------ */
/* HTTP through the curl command-line tool                                               */
/* ------------------------------------------------------------------------------------ */

/* Frees the parsed headers of r and empties the list. */
static void free_headers(struct client_response *r)
{
    for (size_t i = 0; i < r->header_count; i++) {
        free(r->header_names[i]);
        free(r->header_values[i]);
    }
    r->header_count = 0;
}

void client_response_free(struct client_response *r)
{
    free(r->body);
    free_headers(r);
    memset(r, 0, sizeof *r);
}

const char *client_header(const struct client_response *r, const char *name)
{
    for (size_t i = 0; i < r->header_count; i++)
        if (strcasecmp(r->header_names[i], name) == 0)
            return r->header_values[i];
    return NULL;
}

void client_parse_headers(char *text, struct client_response *r)
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
            free_headers(r);
        } else {
            char *colon = strchr(line, ':');
            if (colon != NULL && r->header_count < CLIENT_MAX_RESPONSE_HEADERS) {
                *colon = '\0';
                char *value = colon + 1;
                while (*value == ' ' || *value == '\t')
                    value++;
                size_t i = r->header_count++;
                r->header_names[i] = client_xcalloc(strlen(line) + 1, 1);
                strcpy(r->header_names[i], line);
                r->header_values[i] = client_xcalloc(strlen(value) + 1, 1);
                strcpy(r->header_values[i], value);
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
}

/* Appends the pair "--header", header to the argument vector of curl. */
static void add_header(const char **argv, size_t *argc, const char *header)
{
    argv[(*argc)++] = "--header";
    argv[(*argc)++] = header;
}

void client_http_start(const char *base_url, const char *work_dir, const struct client_request *rq,
                       struct client_pending *p)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->is_head = strcmp(rq->method, "HEAD") == 0;
    snprintf(p->stem, sizeof p->stem, "%.255s/req-%u", work_dir, ++g_request_counter);

    char in_path[PATH_MAX], out_path[PATH_MAX], hdr_path[PATH_MAX], code_path[PATH_MAX],
        err_path[PATH_MAX], data_arg[PATH_MAX + 1], url[1024];
    snprintf(in_path, sizeof in_path, "%s.in", p->stem);
    snprintf(out_path, sizeof out_path, "%s.out", p->stem);
    snprintf(hdr_path, sizeof hdr_path, "%s.hdr", p->stem);
    snprintf(code_path, sizeof code_path, "%s.code", p->stem);
    snprintf(err_path, sizeof err_path, "%s.err", p->stem);
    snprintf(data_arg, sizeof data_arg, "@%s", in_path);
    snprintf(url, sizeof url, "%s%s", base_url, rq->request_target != NULL ? "/" : rq->path);

    if (rq->body != NULL && client_write_file(in_path, rq->body, rq->body_len) != 0) {
        snprintf(p->start_error, sizeof p->start_error, "cannot write %.400s", in_path);
        return;
    }

    static const char *const fixed_args[] = {"curl", "--silent", "--show-error", "--max-time", "60",
                                             "--connect-timeout", "5", NULL};
    const char *argv[96];
    size_t argc = 0;
    int has_content_type = 0, has_expect = 0;
    for (size_t i = 0; fixed_args[i] != NULL; i++)
        argv[argc++] = fixed_args[i];
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
    for (size_t i = 0; rq->curl_args != NULL && rq->curl_args[i] != NULL && argc < 40; i++)
        argv[argc++] = rq->curl_args[i];
    for (size_t i = 0; i < CLIENT_MAX_EXTRA_HEADERS && rq->headers[i] != NULL; i++) {
        add_header(argv, &argc, rq->headers[i]);
        if (strncasecmp(rq->headers[i], "Content-Type:", 13) == 0)
            has_content_type = 1;
        if (strncasecmp(rq->headers[i], "Expect:", 7) == 0)
            has_expect = 1;
    }
    if (rq->body != NULL) {
        if (!has_content_type)
            add_header(argv, &argc, "Content-Type: application/json");
        /* curl waits for "100 Continue" before a large body unless told not to: the
         * tests send at once, as most clients do, unless a test asks for Expect itself. */
        if (!has_expect)
            add_header(argv, &argc, "Expect:");
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

int client_http_done(struct client_pending *p)
{
    if (p->pid < 0 || p->reaped)
        return 1;
    int status = 0;
    pid_t done = waitpid(p->pid, &status, WNOHANG);
    if (done == p->pid) {
        p->reaped = 1;
        p->wait_status = status;
    }
    return p->reaped;
}

void client_http_finish(struct client_pending *p, struct client_response *r)
{
    memset(r, 0, sizeof *r);
    static const char *const suffixes[] = {".in", ".out", ".hdr", ".code", ".err"};
    char path[PATH_MAX];
    size_t len;

    if (p->pid < 0) {
        snprintf(r->transport_error, sizeof r->transport_error, "%s", p->start_error);
        r->curl_exit = -1;
        r->body = client_xcalloc(1, 1);
        return;
    }
    int status = p->wait_status;
    if (!p->reaped)
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
            ;
    r->curl_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    snprintf(path, sizeof path, "%s.code", p->stem);
    char *code = client_read_file(path, &len);
    r->status = code != NULL ? atoi(code) : 0;
    free(code);

    if (r->curl_exit != 0) {
        snprintf(path, sizeof path, "%s.err", p->stem);
        char *err = client_read_file(path, &len);
        if (err != NULL && len > 0 && err[len - 1] == '\n')
            err[len - 1] = '\0';
        snprintf(r->transport_error, sizeof r->transport_error, "curl exited with %d: %.400s", r->curl_exit,
                 err != NULL ? err : "");
        free(err);
    }

    snprintf(path, sizeof path, "%s.out", p->stem);
    r->body = client_read_file(path, &r->body_len);
    if (r->body == NULL || p->is_head) {
        /* With --head, curl writes the headers where the body would go. */
        free(r->body);
        r->body = client_xcalloc(1, 1);
        r->body_len = 0;
    }
    snprintf(path, sizeof path, "%s.hdr", p->stem);
    char *headers = client_read_file(path, &len);
    if (headers != NULL)
        client_parse_headers(headers, r);
    free(headers);

    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(path, sizeof path, "%s%s", p->stem, suffixes[i]);
        unlink(path);
    }
}

void client_http_call(const char *base_url, const char *work_dir, const struct client_request *rq,
                      struct client_response *r)
{
    struct client_pending p;
    client_http_start(base_url, work_dir, rq, &p);
    client_http_finish(&p, r);
}

char *client_raw_exchange(int port, const char *data, size_t len, double timeout_s, size_t *out_len,
                          int *closed)
{
    *out_len = 0;
    *closed = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return NULL;
    }
    size_t sent = 0;
    while (sent < len) {
        ssize_t n = send(fd, data + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may close early; read what it said */
        sent += (size_t)n;
    }
    size_t cap = 4096, used = 0;
    char *buf = client_xcalloc(cap, 1);
    double deadline = client_now_seconds() + timeout_s;
    for (;;) {
        double left = deadline - client_now_seconds();
        if (left <= 0)
            break;
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            break;
        if (used + 1 >= cap) {
            cap *= 2;
            buf = client_xrealloc(buf, cap);
        }
        ssize_t n = recv(fd, buf + used, cap - used - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *closed = 1; /* orderly close, or a reset after the answer */
            break;
        }
        used += (size_t)n;
    }
    close(fd);
    buf[used] = '\0';
    *out_len = used;
    return buf;
}

void client_raw_call(int port, const char *data, size_t len, double timeout_s, struct client_response *r,
                     int *answers, int *closed)
{
    size_t got;
    memset(r, 0, sizeof *r);
    *answers = 0;
    char *text = client_raw_exchange(port, data, len, timeout_s, &got, closed);
    if (text == NULL) {
        snprintf(r->transport_error, sizeof r->transport_error, "cannot connect to 127.0.0.1:%d", port);
        r->body = client_xcalloc(1, 1);
        return;
    }
    for (const char *p = text; (p = strstr(p, "HTTP/1.1 ")) != NULL; p += 9)
        if (p == text || p[-1] == '\n')
            (*answers)++;
    if (strncmp(text, "HTTP/1.1 ", 9) == 0)
        r->status = atoi(text + 9);
    char *end = strstr(text, "\r\n\r\n");
    const char *body = end != NULL ? end + 4 : text + got;
    size_t body_len = (size_t)(text + got - body);
    if (end != NULL) {
        *end = '\0';
        client_parse_headers(text, r);
        const char *length = client_header(r, "Content-Length");
        if (length != NULL && strtoull(length, NULL, 10) < body_len)
            body_len = (size_t)strtoull(length, NULL, 10);
    }
    r->body = client_xcalloc(body_len + 1, 1);
    memcpy(r->body, body, body_len);
    r->body_len = body_len;
    free(text);
}

/*
 * rawhttp.c - HTTP/1.1 over plain sockets for the tests that must control every byte
 * (see rawhttp.h).
 */
#define _GNU_SOURCE
#include "integration/rawhttp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "integration/client.h"

/* A TCP connection from source address `from` ("127.0.0.1") to the server;
 * -1 when it cannot be made. */
int rawhttp_connect_from(const char *from, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
        connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int rawhttp_send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads one answer from fd within timeout_s: the head, then Content-Length
 * bytes of body.  Returns 0 with a->status set, or -1. */
int rawhttp_read_answer(int fd, double timeout_s, rawhttp_answer *a)
{
    memset(a, 0, sizeof *a);
    size_t cap = 8192, len = 0;
    char *buf = client_xcalloc(cap, 1);
    double deadline = client_now_seconds() + timeout_s;
    size_t head_end = 0, need = 0;
    for (;;) {
        if (head_end == 0) {
            char *p = memmem(buf, len, "\r\n\r\n", 4);
            if (p != NULL) {
                head_end = (size_t)(p - buf) + 4;
                const char *cl = strcasestr(buf, "\r\nContent-Length:");
                size_t body = cl != NULL && cl < p ? strtoul(cl + 17, NULL, 10) : 0;
                need = head_end + body;
            }
        }
        if (head_end != 0 && len >= need)
            break;
        double left = deadline - client_now_seconds();
        if (left <= 0)
            goto fail;
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        if (len + 4096 > cap) {
            cap *= 2;
            buf = client_xrealloc(buf, cap);
        }
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        if (n <= 0)
            goto fail;
        len += (size_t)n;
        buf[len] = '\0';
    }
    snprintf(a->head, sizeof a->head, "%.*s", (int)head_end, buf);
    sscanf(buf, "HTTP/1.%*d %d", &a->status);
    a->body_len = need - head_end;
    a->body = client_xcalloc(a->body_len + 1, 1);
    memcpy(a->body, buf + head_end, a->body_len);
    free(buf);
    return a->status > 0 ? 0 : -1;
fail:
    free(buf);
    return -1;
}

/* One request on a new connection from 127.0.0.1; the answer in *a. */
int rawhttp_roundtrip(int port, const char *method, const char *path, const char *extra_headers,
                     const char *body, size_t body_len, double timeout_s, rawhttp_answer *a)
{
    memset(a, 0, sizeof *a);
    int fd = rawhttp_connect_from("127.0.0.1", port);
    if (fd < 0)
        return -1;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra_headers ? extra_headers : "", body_len);
    int rc = rawhttp_send_all(fd, head, (size_t)n);
    if (rc == 0 && body_len > 0)
        rc = rawhttp_send_all(fd, body, body_len);
    if (rc == 0)
        rc = rawhttp_read_answer(fd, timeout_s, a);
    close(fd);
    return rc;
}

void rawhttp_answer_free(rawhttp_answer *a)
{
    free(a->body);
    a->body = NULL;
}


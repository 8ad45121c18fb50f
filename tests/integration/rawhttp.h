/*
 * rawhttp.h - HTTP/1.1 over plain sockets, for the tests that must control every byte:
 * the source address of a connection (127.0.0.2 and up), headers sent one byte at a time,
 * a body held back or abandoned half-way.  hostile.c and the soak test use it; curl
 * (client.h) serves the ordinary integration tests.  Loopback only.
 */
#ifndef RAWHTTP_H
#define RAWHTTP_H

#include <stddef.h>

/* One answer: the status (0 when none came complete), the head, and the body (malloc'd,
 * NUL-terminated; the caller frees it with rawhttp_answer_free). */
typedef struct rawhttp_answer {
    int status;
    char head[2048];
    char *body;
    size_t body_len;
} rawhttp_answer;

/* A TCP connection from source address `from` ("127.0.0.2") to 127.0.0.1:port, with
 * TCP_NODELAY; the caller closes it.  Returns the descriptor, or -1. */
int rawhttp_connect_from(const char *from, int port);

/* Sends all of data (no SIGPIPE).  Returns 0, or -1 when the connection failed. */
int rawhttp_send_all(int fd, const char *data, size_t len);

/* Reads one answer (head, then Content-Length bytes) within timeout_s.  Returns 0 with
 * a filled, or -1 (a->body is then NULL). */
int rawhttp_read_answer(int fd, double timeout_s, rawhttp_answer *a);

/* One request on a new connection from 127.0.0.1 ("Connection: close"); extra_headers is
 * NULL or complete "Name: value\r\n" lines.  Returns 0 with the answer in *a, or -1. */
int rawhttp_roundtrip(int port, const char *method, const char *path, const char *extra_headers,
                      const char *body, size_t body_len, double timeout_s, rawhttp_answer *a);

/* Frees a's body (a itself is the caller's). */
void rawhttp_answer_free(rawhttp_answer *a);

#endif

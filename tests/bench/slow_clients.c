/*
 * slow_clients.c - holds slow connections open against a server, for the benchmark of
 * throughput beside them (bench_http.sh).
 *
 *   slow-clients --port P [--connections 1000] [--seconds 30]
 *
 * Opens the connections from 127.0.0.2 and up (100 per address), each sending a request
 * head one byte every second or so and never finishing it, as a slow-header attacker
 * does; a connection the server closes is opened again, so that about --connections stay
 * open for --seconds.  Prints how many were open at the end and how many the server
 * closed.  Loopback only.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <errno.h>

#include "integration/client.h"
#include "integration/rawhttp.h"

static int open_one(int port, int i)
{
    char from[32];
    snprintf(from, sizeof from, "127.0.0.%d", 2 + i / 100);
    int fd = rawhttp_connect_from(from, port);
    if (fd >= 0)
        rawhttp_send_all(fd, "GET /healthz HTTP/1.1\r\nHo", 25);
    return fd;
}

int main(int argc, char **argv)
{
    client_set_program_name("slow-clients");
    int port = 0;
    long connections = 1000, seconds = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port"))
            port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--connections"))
            connections = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atol(argv[i + 1]);
    }
    if (port <= 0 || connections < 1 || connections > 20000 || seconds < 1 || seconds > 3600) {
        fprintf(stderr, "usage: slow-clients --port P [--connections N] [--seconds S]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int *fds = client_xcalloc((size_t)connections, sizeof *fds);
    for (long i = 0; i < connections; i++)
        fds[i] = open_one(port, (int)i);
    long reopened = 0;
    double until = client_now_seconds() + (double)seconds;
    while (client_now_seconds() < until) {
        for (long i = 0; i < connections; i++) {
            char buf[512];
            ssize_t n = fds[i] >= 0 ? recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) : 0;
            int gone = fds[i] < 0 || n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
            if (!gone && rawhttp_send_all(fds[i], "x", 1) != 0)
                gone = 1;
            if (gone) {
                if (fds[i] >= 0)
                    close(fds[i]);
                fds[i] = open_one(port, (int)i);
                reopened++;
            }
        }
        client_sleep_ms(1000);
    }
    long open_now = 0;
    for (long i = 0; i < connections; i++)
        if (fds[i] >= 0) {
            open_now++;
            close(fds[i]);
        }
    printf("slow-clients: %ld open at the end, %ld reopened after the server closed them\n",
           open_now, reopened);
    free(fds);
    return 0;
}

/*
 * main.c - start-up and shutdown of attention-server.
 *
 * Loads the configuration, starts the HTTP server, prints the address it
 * listens on, and waits for a signal.  SIGTERM, SIGINT, SIGQUIT and SIGHUP
 * (the terminal went away) drain: /readyz turns 503, new attention requests
 * get 503, computations under way get up to --shutdown-grace seconds to
 * finish, then the server stops and exits 0.  SIGUSR1 prints one status line
 * (open connections, requests and computations under way) to stderr and
 * changes nothing.  The server logs to stderr only, so there is no log file
 * for SIGHUP to reopen.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "attention.h"
#include "compute.h"
#include "config.h"
#include "http.h"
#include "mem.h"
#include "metrics.h"

extern char **environ;

static pthread_t main_thread;

/* Runs only in a thread that does not block the signal: one that a library
 * started before main (OpenBLAS starts its threads from a constructor).
 * Without it the default action would end the process with no drain; with
 * it the signal is sent on to the main thread, where sigwait takes it. */
static void forward_to_main(int sig)
{
    pthread_kill(main_thread, sig);
}

int main(int argc, char **argv)
{
    server_config cfg;
    char errbuf[512];
    int rc = config_load(&cfg, argc, argv, environ, stdout, errbuf, sizeof errbuf);
    if (rc == CONFIG_EXIT_HELP)
        return 0;
    if (rc != CONFIG_OK) {
        fprintf(stderr, "attention-server: %s\n", errbuf);
        return 2;
    }
    mem_install_jansson();

    /* Signals are taken by sigwait in this thread only; the server's threads
     * inherit the blocked mask. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGQUIT);
    sigaddset(&stop_signals, SIGHUP);
    sigaddset(&stop_signals, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    main_thread = pthread_self();
    struct sigaction forward;
    memset(&forward, 0, sizeof forward);
    forward.sa_handler = forward_to_main;
    sigfillset(&forward.sa_mask);
    forward.sa_flags = SA_RESTART;
    const int handled[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1};
    for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
        sigaction(handled[i], &forward, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* The compute pool is the server's only parallelism: OpenBLAS runs each
     * product on one thread, or every pool thread would start BLAS threads of
     * its own and oversubscribe the cores.  Set here, beside the pool's size,
     * so that the pool needs to know nothing of BLAS.  After the mask, so that
     * the pool's threads inherit it. */
    attention_blas_set_threads(1);
    unsigned cpus = compute_available_cpus();
    unsigned threads = cfg.compute_threads > 0 ? (unsigned)cfg.compute_threads : cpus;
    if (compute_init(threads) != 0) {
        fprintf(stderr, "attention-server: cannot start %u compute threads\n", threads);
        return 1;
    }
    fprintf(stderr, "attention-server: %u compute thread%s (%u CPU%s available)\n", threads,
            threads == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s");

    attn_error err;
    error_clear(&err);
    if (api_init(&cfg, &err) != 0) {
        fprintf(stderr, "attention-server: %s\n", err.message);
        compute_shutdown();
        return 1;
    }
    http_server *server = http_start(&cfg, &err);
    if (server == NULL) {
        fprintf(stderr, "attention-server: %s\n", err.message);
        api_shutdown();
        compute_shutdown();
        return 1;
    }
    const char *host = cfg.host;
    int v6 = strchr(host, ':') != NULL;
    printf("listening on http%s://%s%s%s:%u\n", cfg.tls_cert[0] ? "s" : "", v6 ? "[" : "", host,
           v6 ? "]" : "", http_port(server));
    fflush(stdout);

    int sig = 0;
    for (;;) {
        if (sigwait(&stop_signals, &sig) != 0)
            continue;
        if (sig != SIGUSR1)
            break;
        fprintf(stderr, "attention-server: status: %u connections, %ld requests, %ld computing\n",
                http_connections(server), metrics_inflight(), api_busy());
    }
    fprintf(stderr, "attention-server: %s received, draining\n",
            sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGQUIT ? "SIGQUIT"
                                                                                  : "SIGHUP");
    api_set_draining(1);
    struct timespec pause = {0, 20 * 1000 * 1000};
    /* Wait for computations and for every request between its first byte and
     * its last (uploads still arriving, answers still being sent). */
    for (long waited_ms = 0; (api_busy() > 0 || metrics_inflight() > 0) &&
                             waited_ms < cfg.shutdown_grace * 1000; waited_ms += 20)
        nanosleep(&pause, NULL);
    http_stop(server);
    api_shutdown();
    compute_shutdown();
    fprintf(stderr, "attention-server: stopped\n");
    return 0;
}

/*
 * main.c - start-up and shutdown of attention-server.
 *
 * Loads the configuration, starts the HTTP server, prints the address it
 * listens on, and waits for a signal.  SIGTERM, SIGINT, SIGQUIT and SIGHUP
 * (the terminal went away) drain: /readyz turns 503, new attention requests
 * get 503, requests under way get the --shutdown-grace seconds to finish; in
 * its last tenth (at most its last 500 ms) the computations still running are
 * stopped (they end within one block of keys and answer 503), then the server
 * stops and the process exits 0.  A watchdog ends the process with status 1
 * when the grace has passed all the same (a step that cannot be interrupted,
 * such as parsing a very large body), so the process never outlives the
 * grace.  SIGUSR1 prints one status line (open connections, requests and
 * computations under way) to stderr and changes nothing.  The server logs to
 * stderr only, so there is no log file for SIGHUP to reopen.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "router/api.h"
#include "kernel/attention.h"
#include "kernel/blas_setup.h"
#include "core/budget.h"
#include "core/budget_client.h"
#include "core/compute.h"
#include "core/config.h"
#include "core/conn_ledger.h"
#include "core/sizing.h"
#include "work/work_queue.h"
#include "grpc/grpc_front.h"
#include "http/http.h"
#include "core/mem.h"
#include "metrics/metrics.h"
#include "sequence/sequence.h"

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

/* Raises the soft limit on open files to the hard one, as far as the process
 * may: every connection is a descriptor.  Returns the soft limit now. */
/* Descriptors kept for everything but connections: the listeners, the store's
 * files and directories, gRPC's and libmicrohttpd's own (epoll, wake-ups), logs. */
#define FILES_SPARE 64

static rlim_t raise_file_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t soft = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = soft;
    }
    return rl.rlim_cur;
}

static long watchdog_grace_ms;

/* Ends the process when the shutdown grace is over, whatever still runs. */
static void *watchdog_main(void *arg)
{
    (void)arg;
    struct timespec pause = {watchdog_grace_ms / 1000, (watchdog_grace_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    static const char msg[] = "attention-server: shutdown grace over, exiting now\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
        /* nothing more to do: the exit below is what matters */
    }
    _exit(1);
}

/* Applies the memory budget: --max-memory, else 3/4 of the memory limit. */
static void budget_start(const server_config *cfg)
{
    size_t budget = cfg->max_memory != 0 ? cfg->max_memory : budget_default_limit();
    budget_init(budget);
    budget_client_init(cfg->max_memory_share);
    fprintf(stderr, "attention-server: memory budget %zu MiB%s\n", budget >> 20,
            cfg->max_memory != 0 ? "" : " (3/4 of the memory limit)");
}

/* The sequences' limits, and the thread that expires idle ones. */
static void sequences_start(const server_config *cfg)
{
    sequence_limits limits = {(size_t)cfg->max_sequences, (double)cfg->sequence_idle_timeout,
                              cfg->max_sequence_keys};
    sequence_init(&limits);
    if (sequence_sweeper_start() != 0)
        fprintf(stderr, "attention-server: no thread to expire idle sequences; they stay until "
                        "ended or started over\n");
}

/* Blocks the stop signals and SIGUSR1 in this thread, so that only sigwait
 * takes them and the server's threads inherit the blocked mask, and sends
 * those that reach another thread on to this one (forward_to_main). */
static void signals_take(sigset_t *signals)
{
    static const int handled[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1};
    sigemptyset(signals);
    for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
        sigaddset(signals, handled[i]);
    pthread_sigmask(SIG_BLOCK, signals, NULL);
    main_thread = pthread_self();
    struct sigaction forward;
    memset(&forward, 0, sizeof forward);
    forward.sa_handler = forward_to_main;
    sigfillset(&forward.sa_mask);
    forward.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
        sigaction(handled[i], &forward, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Starts the compute pool (--compute-threads, resolved by sizing_resolve).
 * Returns 0, or -1 with the reason printed. */
static int compute_start(const server_config *cfg)
{
    /* The compute pool is the server's only parallelism: OpenBLAS runs each
     * product on one thread, or every pool thread would start BLAS threads of
     * its own and oversubscribe the cores.  Set here, beside the pool's size,
     * so that the pool needs to know nothing of BLAS.  After the signal mask,
     * so that the pool's threads inherit it. */
    attention_blas_set_threads(1);
    const server_sizing *sz = sizing_get();
    unsigned threads = (unsigned)cfg->compute_threads;
    if (compute_init(threads) != 0) {
        fprintf(stderr, "attention-server: cannot start %u compute threads\n", threads);
        return -1;
    }
    fprintf(stderr, "attention-server: %u CPU%s available (%s); %u compute thread%s (%s), "
            "%ld I/O threads (%s), --max-inflight %ld (%s)\n", sz->cpus, sz->cpus == 1 ? "" : "s",
            sz->cpus_source, threads, threads == 1 ? "" : "s", sz->compute_threads.source,
            sz->io_threads.value, sz->io_threads.source, sz->max_inflight.value,
            sz->max_inflight.source);
    char blas_config[256], blas_core[64];
    int blas_threads;
    attention_blas_describe(blas_config, sizeof blas_config, blas_core, sizeof blas_core,
                            &blas_threads);
    fprintf(stderr, "attention-server: OpenBLAS core %s (%s)\n", blas_core,
            blas_setup_chosen_by());
    fprintf(stderr, "attention-server: attention kernel %s\n", attention_kernel_path());
    return 0;
}

/* Opens the store and starts HTTP.  Returns the server, or NULL with the
 * reason printed and nothing left running but the compute pool. */
static http_server *serving_start(const server_config *cfg)
{
    attn_error err;
    error_clear(&err);
    if (api_init(cfg, &err) != 0) {
        fprintf(stderr, "attention-server: %s\n", err.message);
        return NULL;
    }
    http_server *server = http_start(cfg, &err);
    if (server == NULL) {
        fprintf(stderr, "attention-server: %s\n", err.message);
        api_shutdown();
        return NULL;
    }
    const char *host = cfg->host;
    int v6 = strchr(host, ':') != NULL;
    printf("listening on http%s://%s%s%s:%u\n", cfg->tls_cert[0] ? "s" : "", v6 ? "[" : "",
           host, v6 ? "]" : "", http_port(server));
    fflush(stdout);
    return server;
}

/* Waits for a stop signal, answering SIGUSR1 with a status line meanwhile;
 * returns the stop signal. */
static int stop_signal_wait(const sigset_t *signals, const http_server *server)
{
    int sig = 0;
    for (;;) {
        if (sigwait(signals, &sig) != 0)
            continue;
        if (sig != SIGUSR1)
            return sig;
        fprintf(stderr, "attention-server: status: %u connections, %ld requests, %ld computing\n",
                http_connections(server), metrics_inflight(), api_busy());
    }
}

/* Drains within --shutdown-grace: new work is refused, and the loop waits
 * for computations and for every request between its first byte and its
 * last (uploads still arriving, answers still being sent).  In the last
 * tenth of the grace (at most its last 500 ms) computations still running
 * are stopped, so that their answers (503) can go out; the last twentieth
 * (at most 150 ms) is for closing.  The watchdog ends the process if the
 * grace passes all the same.  Live sequences hold the drain too, up to the
 * grace: their steps are still answered, only new starts are refused. */
static void drain(const server_config *cfg)
{
    api_set_draining(1);
    watchdog_grace_ms = cfg->shutdown_grace * 1000;
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, watchdog_main, NULL) == 0)
        pthread_detach(watchdog);
    long grace_ms = cfg->shutdown_grace * 1000;
    long stop_compute_ms = grace_ms - (grace_ms / 10 < 500 ? grace_ms / 10 : 500);
    long close_ms = grace_ms - (grace_ms / 20 < 150 ? grace_ms / 20 : 150);
    double start = compute_now();
    struct timespec pause = {0, 20 * 1000 * 1000};
    for (;;) {
        long waited_ms = (long)((compute_now() - start) * 1000.0);
        /* a live sequence's steps are served while it drains (sequence_step_draining) */
        if ((api_busy() == 0 && metrics_inflight() == 0 && sequence_live() == 0) ||
            waited_ms >= close_ms)
            break;
        if (waited_ms >= stop_compute_ms)
            compute_stop_all(1);
        nanosleep(&pause, NULL);
    }
    compute_stop_all(1);
}

/* Starts the gRPC front-end beside HTTP unless --grpc-port is 0; prints where
 * it listens (and sets cfg->grpc_port to it).  Returns 0 with *out set (NULL
 * when off), or -1 with the reason printed. */
static int grpc_serving_start(server_config *cfg, grpc_front **out)
{
    *out = NULL;
    if (cfg->grpc_port == 0)
        return 0;
    attn_error err;
    error_clear(&err);
    grpc_front *front = grpc_front_start(cfg, &err);
    if (front == NULL) {
        fprintf(stderr, "attention-server: %s\n", err.message);
        return -1;
    }
    int v6 = strchr(cfg->host, ':') != NULL;
    printf("listening on grpc%s://%s%s%s:%d\n", cfg->tls_cert[0] ? "s" : "", v6 ? "[" : "",
           cfg->host, v6 ? "]" : "", grpc_front_port(front));
    fflush(stdout);
    cfg->grpc_port = grpc_front_port(front); /* the one chosen for -1, for /v1/info */
    *out = front;
    return 0;
}

int main(int argc, char **argv)
{
    server_config cfg;
    char errbuf[512];
    blas_setup_select(argv, 0); /* may run the server again: before anything else happens */
    int rc = config_load(&cfg, argc, argv, environ, stdout, errbuf, sizeof errbuf);
    if (rc == CONFIG_EXIT_HELP)
        return 0;
    if (rc != CONFIG_OK) {
        fprintf(stderr, "attention-server: %s\n", errbuf);
        return 2;
    }
    if (attention_kernel_select(cfg.kernel, errbuf, sizeof errbuf) != 0) {
        fprintf(stderr, "attention-server: --kernel: %s\n", errbuf);
        return 2;
    }
    /* The settings that follow the machine, before anything is sized by them. */
    sizing_resolve(&cfg, compute_available_cpus(), compute_cpus_source());
    mem_install_jansson();
    mem_tune_allocator();
    /* Both listeners' connections count against one cap (core/conn_ledger.h), held
     * below the descriptor limit with room for the store, the logs and the
     * listeners' own, so that a flood of idle connections is refused at accept and
     * never takes the descriptors that uploads, probes and the store need. */
    rlim_t files = raise_file_limit();
    long max_open = cfg.max_connections;
    if (files != 0 && files != RLIM_INFINITY && (rlim_t)cfg.max_connections + FILES_SPARE > files) {
        max_open = files > FILES_SPARE * 2 ? (long)(files - FILES_SPARE) : (long)(files / 2);
        fprintf(stderr, "attention-server: at most %lu files may be open; %ld connections "
                "(HTTP and gRPC together) will be accepted, not --max-connections %ld\n",
                (unsigned long)files, max_open, cfg.max_connections);
    }
    conn_ledger_init(max_open, cfg.max_connections_per_ip);
    budget_start(&cfg);
    sigset_t signals;
    signals_take(&signals);
    sequences_start(&cfg);
    if (compute_start(&cfg) != 0)
        return 1;
    /* the one queue of work for --max-inflight workers, which both front-ends feed */
    if (work_queue_start(cfg.max_inflight, cfg.queue_wait_ms) != 0) {
        fprintf(stderr, "attention-server: cannot start the worker threads\n");
        sequence_shutdown();
        compute_shutdown();
        return 1;
    }
    http_server *server = serving_start(&cfg);
    if (server == NULL) {
        work_queue_stop();
        sequence_shutdown();
        compute_shutdown();
        return 1;
    }
    grpc_front *grpc = NULL;
    if (grpc_serving_start(&cfg, &grpc) != 0) {
        http_stop(server);
        work_queue_stop();
        api_shutdown();
        sequence_shutdown();
        compute_shutdown();
        return 1;
    }
    int sig = stop_signal_wait(&signals, server);
    fprintf(stderr, "attention-server: %s received, draining\n",
            sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGQUIT ? "SIGQUIT"
                                                                                  : "SIGHUP");
    drain(&cfg);
    grpc_front_stop(grpc);
    http_stop(server);
    work_queue_stop();
    api_shutdown();
    sequence_shutdown();
    compute_shutdown();
    fprintf(stderr, "attention-server: stopped\n");
    return 0;
}

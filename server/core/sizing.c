/*
 * sizing.c - the settings that follow the machine (sizing.h).
 *
 * The rules, and why:
 *   compute threads  one per CPU: the compute pool is the only arithmetic,
 *                    so more would only take turns on the cores;
 *   I/O threads      one per CPU, at least SIZING_IO_THREADS_MIN: they never
 *                    wait, so one per core keeps every core's sockets served;
 *   max inflight     SIZING_INFLIGHT_PER_CPU workers per CPU, at least
 *                    SIZING_INFLIGHT_MIN: a worker spends part of a request
 *                    parsing and writing numbers outside the compute slots, so
 *                    several per core keep the slots busy while others parse
 *                    (docs/performance.md has the measurements).
 */
#include "sizing.h"

static server_sizing chosen;

/* The value of the setting name (already in *value) and its source: the
 * flag or the environment when one set it to non-zero, else rule(cpus). */
static sizing_choice choose(const server_config *cfg, const char *name, long value, long automatic,
                            const char *cpus_source)
{
    if (value != 0) {
        config_origin from = config_source(cfg, name);
        return (sizing_choice){value, from == CONFIG_FROM_FLAG  ? "flag"
                                      : from == CONFIG_FROM_ENV ? "env"
                                                                : "default"};
    }
    return (sizing_choice){automatic, cpus_source};
}

void sizing_resolve(server_config *cfg, unsigned cpus, const char *cpus_source)
{
    if (cpus == 0)
        cpus = 1;
    long n = (long)cpus;
    long io = n < SIZING_IO_THREADS_MIN ? SIZING_IO_THREADS_MIN : n;
    long inflight = n * SIZING_INFLIGHT_PER_CPU;
    if (inflight < SIZING_INFLIGHT_MIN)
        inflight = SIZING_INFLIGHT_MIN;
    if (inflight > 4096)
        inflight = 4096;  /* the table's bound on --max-inflight */
    chosen.cpus = cpus;
    chosen.cpus_source = cpus_source;
    chosen.compute_threads = choose(cfg, "compute-threads", cfg->compute_threads, n, cpus_source);
    chosen.io_threads = choose(cfg, "io-threads", cfg->io_threads, io, cpus_source);
    chosen.max_inflight = choose(cfg, "max-inflight", cfg->max_inflight, inflight, cpus_source);
    cfg->compute_threads = chosen.compute_threads.value;
    cfg->io_threads = chosen.io_threads.value;
    cfg->max_inflight = chosen.max_inflight.value;
}

const server_sizing *sizing_get(void)
{
    return &chosen;
}

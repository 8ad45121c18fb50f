/*
 * sizing.h - the settings that follow the machine: how many threads compute,
 * serve sockets and work on requests when no flag or variable says.
 *
 * --compute-threads, --io-threads and --max-inflight default to 0, "follow
 * the CPUs this process may use" (compute_available_cpus: the affinity mask,
 * lowered to a cgroup CPU quota).  sizing_resolve turns each 0 into its
 * number once at start-up and remembers why, so that /v1/info can say where
 * every value came from: "flag", "env", "cores" or "cgroup".
 */
#ifndef ATTN_SIZING_H
#define ATTN_SIZING_H

#include "config.h"

/* One setting as chosen: its value and where it came from ("flag", "env",
 * "cores", "cgroup"; static strings). */
typedef struct sizing_choice {
    long value;
    const char *source;
} sizing_choice;

typedef struct server_sizing {
    unsigned cpus;              /* compute_available_cpus() at start-up */
    const char *cpus_source;    /* "cores" or "cgroup" */
    sizing_choice compute_threads, io_threads, max_inflight;
} server_sizing;

/* The rules for a setting left at 0, from the available CPUs. */
#define SIZING_IO_THREADS_MIN 2         /* so one busy socket never holds up the rest */
#define SIZING_INFLIGHT_PER_CPU 4
#define SIZING_INFLIGHT_MIN 8

/* Replaces each of cfg's compute_threads, io_threads and max_inflight that
 * is 0 by its number for cpus available CPUs (cpus_source: what set that
 * number), and records every value with its source for sizing_get.  Never
 * fails. */
void sizing_resolve(server_config *cfg, unsigned cpus, const char *cpus_source);

/* What the last sizing_resolve chose (zeros before any call); borrowed. */
const server_sizing *sizing_get(void);

#endif

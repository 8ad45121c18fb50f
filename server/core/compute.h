/*
 * compute.h - the compute pool: how many threads do arithmetic at once.
 *
 * The server's I/O threads (http.c) only move bytes, but up to --max-inflight
 * workers (http_queue.c), and an I/O thread answering a small request itself,
 * may want to compute at the same moment.  If each product also ran on
 * several OpenBLAS threads, two large requests on a 2-core machine would
 * start four or more busy threads and slow each other down.  Instead, the
 * math library is held to one thread per product (main.c sets that through
 * attention_blas_set_threads, beside starting this pool, which knows nothing
 * of BLAS), and this pool hands out "compute slots": at most
 * compute_threads() threads, the requests' own threads and the pool's
 * helpers together, compute at any time.
 *
 * A request splits its work into independent tasks and calls
 * compute_parallel.  The calling thread waits for one slot, then takes as
 * many more as are free right now (up to what the request asked for), and
 * lends them to helper threads that run tasks beside it.  A small request
 * asks for one slot and runs entirely on its own thread, with no hand-off
 * (an I/O thread takes that slot with compute_slot_try_hold, never waiting); a
 * large one on an idle server gets every core; under load, each request gets
 * what is free, and helpers give their slot back as soon as the tasks run
 * out, so a finishing request makes room for the next at once.
 *
 * Without compute_init (unit tests, benchmarks that do not call it), every
 * call runs its tasks serially on the caller's thread.
 *
 * Stopping.  A request's thread binds a compute_token (compute_bind) that
 * carries its deadline and a flag another thread may raise (the client went
 * away, the server shuts down).  compute_parallel hands the caller's token
 * to its helpers, so compute_stopped() answers the same on every thread of
 * one request; the kernels ask it between blocks of keys and tasks are
 * skipped once it is set, so a stopped computation ends within one block.
 */
#ifndef ATTN_COMPUTE_H
#define ATTN_COMPUTE_H

#include <stddef.h>
#include <time.h>

struct attn_error;

/* A task: runs task number `task` of the caller's job; `slot` (0 for the
 * calling thread, 1..slots-1 for helpers) tells a task which of the
 * caller's per-thread scratch buffers it may use.  Tasks of one call run
 * concurrently and must not write the same memory. */
typedef void (*compute_task_fn)(void *ctx, size_t task, unsigned slot);

/* Why a computation was stopped (compute_stopped). */
enum {
    COMPUTE_RUNNING = 0,
    COMPUTE_DEADLINE = 1,       /* past the token's deadline */
    COMPUTE_CLIENT_GONE = 2,    /* the client closed its connection */
    COMPUTE_SHUTDOWN = 3        /* compute_stop_all: the server is stopping */
};

/* The stop state of one request: a deadline on the monotonic clock (0: none)
 * and a reason another thread may set with compute_token_stop. */
typedef struct compute_token {
    double deadline;            /* seconds of compute_now(), 0 for none */
    _Atomic int reason;         /* COMPUTE_RUNNING, or why it was stopped */
} compute_token;

/* Seconds of the monotonic clock: the server's one reading of it, so that
 * times taken in any module (a request's phases, the queue, the store's
 * syncs, the metrics' ages) compare.  gRPC's deadlines alone are gRPC's
 * gpr clock, converted where they are read. */
double compute_now(void);

/* The wall-clock time ms milliseconds from now, as pthread_cond_timedwait
 * takes it (CLOCK_REALTIME, the condition variables' default clock): the
 * one place the server's threads compute when a timed wait ends. */
struct timespec compute_wake_after(long ms);

/* Makes token (borrowed; NULL unbinds) the calling thread's token until the
 * next call.  It must stay valid while bound. */
void compute_bind(compute_token *token);

/* Sets the reason of token (first reason wins); safe from any thread. */
void compute_token_stop(compute_token *token, int reason);

/* Stops every computation, bound or not yet started, until
 * compute_stop_all(0): used while the server shuts down. */
void compute_stop_all(int stop);

/* Why the calling thread's computation should stop (COMPUTE_* above), or
 * COMPUTE_RUNNING.  Cheap: one atomic load and, with a deadline, a clock
 * read. */
int compute_stopped(void);

/* When compute_stopped() is set, fills err with the JSON error for it (503
 * "deadline_exceeded", "client_closed" or "shutting_down", each with its own
 * words) and returns ERR_UNAVAILABLE; otherwise returns 0 and leaves err. */
int compute_stop_error(struct attn_error *err);

/* Starts the pool with `threads` compute slots (threads - 1 helper threads);
 * its two small arrays are allocated through mem.h and freed by
 * compute_shutdown.  Returns 0, or -1 if memory ran out or a thread could
 * not be started (then nothing is left running or allocated, and
 * compute_parallel runs serially). */
int compute_init(unsigned threads);

/* Stops the helper threads; compute_parallel runs serially afterwards.
 * No call may be in progress. */
void compute_shutdown(void);

/* Slots of the pool (1 without compute_init). */
unsigned compute_threads(void);

/* The number of CPUs this process may use: its affinity mask, lowered to
 * the cgroup CPU quota where one is set (v2 cpu.max, or v1
 * cpu.cfs_quota_us), as in a container with a CPU limit; at least 1. */
unsigned compute_available_cpus(void);

/* What set compute_available_cpus: "cgroup" when the cgroup CPU quota
 * lowered it, else "cores" (the CPUs of the affinity mask).  A static string. */
const char *compute_cpus_source(void);

/* Runs fn(ctx, t, slot) for every t in [0, tasks) on at most `max_slots`
 * threads (the caller's included; 0 counts as 1), and returns when all have
 * finished.  Tasks are handed out in increasing order of t.  Blocks while
 * every slot is taken.  Once compute_stopped() is set, tasks not yet begun
 * are skipped (the caller's outputs are then incomplete and must be
 * discarded). */
void compute_parallel(size_t tasks, unsigned max_slots, compute_task_fn fn, void *ctx);

/* Seconds the calling thread has spent, over its life, waiting in
 * compute_parallel for its first slot while others held them all: the part
 * of a computation's time that is queueing, not arithmetic. */
double compute_slot_wait(void);

/* For a thread that must never wait (an I/O thread answering a small
 * request itself): takes one slot if one is free right now and no other
 * caller is waiting for one, and keeps it for the calling thread, whose
 * compute_parallel calls then run on it without waiting, until
 * compute_slot_release.  Returns 0 when the slot is held, -1 when none was
 * free (nothing held).  Without compute_init it always succeeds. */
int compute_slot_try_hold(void);

/* Gives back the slot compute_slot_try_hold took (nothing when none is held). */
void compute_slot_release(void);

/* How the slots are used now: *busy taken (by callers and their helpers),
 * *waiting callers waiting for their first one, *slots in all.  A snapshot
 * for /metrics; without compute_init: 0, 0 and 1. */
void compute_slot_usage(unsigned *busy, unsigned *waiting, unsigned *slots);

#endif

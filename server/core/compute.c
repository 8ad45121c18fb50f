/*
 * compute.c - the compute pool (see compute.h).
 *
 * One mutex guards a small queue of hand-offs to helper threads and the
 * waits for a slot.  A hand-off lends one slot to a helper, which runs
 * tasks of the caller's job until none are left and then gives the slot
 * back.  The counts of free slots and of waiting callers are atomic, and a
 * slot is only ever taken by a compare-and-swap that finds it free
 * (take_slots), so that a small request's thread holds and gives back its
 * slot without the mutex: only a release that finds a caller waiting takes
 * it, to wake that caller.  Tasks are claimed with an atomic counter, so
 * the caller and its helpers share them dynamically: a slow task does not
 * hold up the rest.  A caller whose tasks have run out spins a short while
 * for its helpers before it sleeps until the last one signals
 * (COMPUTE_JOIN_SPIN_S).
 *
 * The caller's compute_token travels with the job, and each helper binds it
 * while it runs the job's tasks, so a request's deadline and stop flag hold
 * on every thread that works for it.
 */
#define _GNU_SOURCE
#include "compute.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "error.h"
#include "mem.h"

static _Thread_local compute_token *bound_token;
static _Thread_local int held_slot;     /* compute_slot_try_hold succeeded */
static _Thread_local double slot_wait;  /* seconds this thread waited for a first slot */
static atomic_int stop_all;

double compute_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct timespec compute_wake_after(long ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = until.tv_nsec + (long long)(ms % 1000) * 1000000;
    until.tv_sec += ms / 1000 + (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    return until;
}

void compute_bind(compute_token *token)
{
    bound_token = token;
}

void compute_token_stop(compute_token *token, int reason)
{
    int running = COMPUTE_RUNNING;
    atomic_compare_exchange_strong(&token->reason, &running, reason);
}

void compute_stop_all(int stop)
{
    atomic_store(&stop_all, stop);
}

int compute_stopped(void)
{
    if (atomic_load_explicit(&stop_all, memory_order_relaxed))
        return COMPUTE_SHUTDOWN;
    compute_token *t = bound_token;
    if (t == NULL)
        return COMPUTE_RUNNING;
    int reason = atomic_load_explicit(&t->reason, memory_order_relaxed);
    if (reason != COMPUTE_RUNNING)
        return reason;
    if (t->deadline > 0 && compute_now() > t->deadline) {
        compute_token_stop(t, COMPUTE_DEADLINE);
        return atomic_load(&t->reason);
    }
    return COMPUTE_RUNNING;
}

int compute_stop_error(attn_error *err)
{
    switch (compute_stopped()) {
    case COMPUTE_DEADLINE:
        return error_set(err, ERR_UNAVAILABLE, "deadline_exceeded", NULL,
                         "The request did not finish within its deadline (--deadline, or the "
                         "lower X-Deadline-Ms of the request); send less work or allow more "
                         "time.");
    case COMPUTE_CLIENT_GONE:
        return error_set(err, ERR_UNAVAILABLE, "client_closed", NULL,
                         "The client closed its connection; the computation was stopped.");
    case COMPUTE_SHUTDOWN:
        return error_set(err, ERR_UNAVAILABLE, "shutting_down", NULL,
                         "The server is shutting down; the computation was stopped. Retry on "
                         "another instance.");
    default:
        return 0;
    }
}

typedef struct compute_job {
    compute_task_fn fn;
    void *ctx;
    size_t tasks;
    atomic_size_t next;         /* next task to claim */
    compute_token *token;       /* the caller's, bound by each helper */
    atomic_uint helpers;        /* helpers still working on it; lowered under the lock, as
                                 * the helper's last touch of the job */
} compute_job;

/* How long a caller that has run out of tasks spins (reading job.helpers)
 * before it sleeps on pool.done, in seconds.  Its helpers are usually close
 * behind it, and waking a thread that sleeps takes longer than such a gap,
 * most of all on a VM's idle vCPU; every compute_parallel with helpers ends
 * in this join (a fused request's two: the pack, then the tasks).  Bounded,
 * so that a helper far behind leaves the caller's core to other threads. */
#define COMPUTE_JOIN_SPIN_S 200e-6

/* One step of a spin: tells the core that this is a wait loop. */
static inline void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct handoff {
    compute_job *job;
    unsigned slot;
} handoff;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t slot_free;   /* free_slots went up */
    pthread_cond_t work;        /* a hand-off was queued, or stopping */
    pthread_cond_t done;        /* a helper finished its part of some job */
    unsigned slots;
    atomic_uint free_slots;
    atomic_uint waiting;        /* callers waiting for their first slot */
    pthread_t *threads;
    unsigned thread_count;
    handoff *queue;             /* ring of `slots` entries */
    unsigned head, queued;
    int running, stopping;
} pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .slot_free = PTHREAD_COND_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .slots = 1,
};

/* Takes up to `want` free slots; returns how many it took. */
static unsigned take_slots(unsigned want)
{
    unsigned free_now = atomic_load(&pool.free_slots);
    for (;;) {
        unsigned take = want < free_now ? want : free_now;
        if (take == 0 ||
            atomic_compare_exchange_weak(&pool.free_slots, &free_now, free_now - take))
            return take;
    }
}

/* Gives back one slot, and wakes the callers waiting for one, if any
 * (locked: the caller holds pool.lock).  A waiter counts itself before it
 * looks for a free slot, and this adds the slot before it looks for
 * waiters, so one of the two sees the other. */
static void give_slot(int locked)
{
    atomic_fetch_add(&pool.free_slots, 1);
    if (locked) {
        pthread_cond_broadcast(&pool.slot_free);
    } else if (atomic_load(&pool.waiting) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.slot_free);
        pthread_mutex_unlock(&pool.lock);
    }
}

static void run_tasks(compute_job *job, unsigned slot)
{
    for (;;) {
        if (compute_stopped())
            return;
        size_t t = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (t >= job->tasks)
            return;
        job->fn(job->ctx, t, slot);
    }
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.queued == 0 && !pool.stopping)
            pthread_cond_wait(&pool.work, &pool.lock);
        if (pool.queued == 0)
            break;
        handoff h = pool.queue[pool.head];
        pool.head = (pool.head + 1) % pool.slots;
        pool.queued--;
        pthread_mutex_unlock(&pool.lock);

        compute_bind(h.job->token);
        run_tasks(h.job, h.slot);
        compute_bind(NULL);

        pthread_mutex_lock(&pool.lock);
        give_slot(1);
        if (atomic_fetch_sub(&h.job->helpers, 1) == 1)
            pthread_cond_broadcast(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

int compute_init(unsigned threads)
{
    if (threads < 1)
        threads = 1;
    pool.threads = mem_calloc(threads, sizeof *pool.threads);
    pool.queue = mem_calloc(threads, sizeof *pool.queue);
    if (pool.threads == NULL || pool.queue == NULL) {
        mem_free(pool.threads);
        mem_free(pool.queue);
        pool.threads = NULL;
        pool.queue = NULL;
        return -1;
    }
    pool.slots = threads;
    atomic_store(&pool.free_slots, threads);
    pool.head = pool.queued = 0;
    pool.stopping = 0;
    pool.thread_count = 0;
    for (unsigned i = 0; i + 1 < threads; i++) {
        if (pthread_create(&pool.threads[i], NULL, helper_main, NULL) != 0) {
            compute_shutdown();
            return -1;
        }
        pool.thread_count++;
    }
    pool.running = 1;
    return 0;
}

void compute_shutdown(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stopping = 1;
    pool.running = 0;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.lock);
    for (unsigned i = 0; i < pool.thread_count; i++)
        pthread_join(pool.threads[i], NULL);
    mem_free(pool.threads);
    mem_free(pool.queue);
    pool.threads = NULL;
    pool.queue = NULL;
    pool.thread_count = 0;
    pool.slots = 1;
    atomic_store(&pool.free_slots, 1);
}

unsigned compute_threads(void)
{
    return pool.running ? pool.slots : 1;
}

/* Reads one number from a file of cgroup v1; 0 when it is missing or not
 * positive (-1 means "no quota" there). */
static long cgroup_v1_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    long v = 0;
    if (fscanf(f, "%ld", &v) != 1 || v < 0)
        v = 0;
    fclose(f);
    return v;
}

/* The CPU quota of the process's cgroup, rounded up to whole CPUs; 0 when
 * there is none.  cgroup v2 has /sys/fs/cgroup/cpu.max ("QUOTA PERIOD" or
 * "max PERIOD"); v1, which Docker and podman still use on hosts with hybrid
 * cgroups, has cpu.cfs_quota_us and cpu.cfs_period_us under the cpu
 * controller. */
static unsigned cgroup_cpu_quota(void)
{
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f == NULL) {
        static const char *const dirs[] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
            char path[96];
            snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dirs[i]);
            long quota = cgroup_v1_number(path);
            snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dirs[i]);
            long period = cgroup_v1_number(path);
            if (quota > 0 && period > 0)
                return (unsigned)((quota + period - 1) / period);
        }
        return 0;
    }
    char quota[32] = "";
    unsigned long period = 0;
    int n = fscanf(f, "%31s %lu", quota, &period);
    fclose(f);
    if (n != 2 || period == 0)
        return 0;
    char *end;
    unsigned long q = strtoul(quota, &end, 10);
    if (*end != '\0' || q == 0)
        return 0;       /* "max": no quota */
    return (unsigned)((q + period - 1) / period);
}

/* The CPUs this process may use, and in *by_cgroup whether the cgroup quota
 * is what set the number. */
static unsigned available_cpus(int *by_cgroup)
{
    unsigned cpus = 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        cpus = (unsigned)CPU_COUNT(&set);
    unsigned quota = cgroup_cpu_quota();
    *by_cgroup = quota > 0 && quota < cpus;
    if (*by_cgroup)
        cpus = quota;
    return cpus;
}

unsigned compute_available_cpus(void)
{
    int by_cgroup;
    return available_cpus(&by_cgroup);
}

const char *compute_cpus_source(void)
{
    int by_cgroup;
    available_cpus(&by_cgroup);
    return by_cgroup ? "cgroup" : "cores";
}

double compute_slot_wait(void)
{
    return slot_wait;
}

void compute_parallel(size_t tasks, unsigned max_slots, compute_task_fn fn, void *ctx)
{
    if (tasks == 0)
        return;
    compute_job job = {.fn = fn, .ctx = ctx, .tasks = tasks, .token = bound_token};
    atomic_init(&job.next, 0);
    atomic_init(&job.helpers, 0);
    /* A caller that holds its slot already and can lend none needs nothing
     * of the pool: a small request's products run here without its lock,
     * which every thread that computes would otherwise take twice a call. */
    if (!pool.running || (held_slot && (max_slots <= 1 || tasks == 1))) {
        run_tasks(&job, 0);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    if (!held_slot) {
        /* The clock is read only when the caller has to wait. */
        double waited_from = atomic_load(&pool.free_slots) == 0 ? compute_now() : 0;
        atomic_fetch_add(&pool.waiting, 1);
        while (take_slots(1) == 0)
            pthread_cond_wait(&pool.slot_free, &pool.lock);
        atomic_fetch_sub(&pool.waiting, 1);
        if (waited_from > 0)
            slot_wait += compute_now() - waited_from;
    }
    unsigned extra = max_slots > 1 ? max_slots - 1 : 0;
    if (extra > tasks - 1)
        extra = (unsigned)(tasks - 1);
    extra = take_slots(extra);
    atomic_store(&job.helpers, extra);
    for (unsigned i = 0; i < extra; i++) {
        pool.queue[(pool.head + pool.queued) % pool.slots] = (handoff){&job, i + 1};
        pool.queued++;
    }
    if (extra == 1)
        pthread_cond_signal(&pool.work);
    else if (extra > 1)
        pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.lock);

    run_tasks(&job, 0);

    if (atomic_load(&job.helpers) > 0) {
        double until = compute_now() + COMPUTE_JOIN_SPIN_S;
        while (atomic_load(&job.helpers) > 0 && compute_now() < until)
            spin_pause();
    }
    pthread_mutex_lock(&pool.lock);
    while (atomic_load(&job.helpers) > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    if (!held_slot)
        give_slot(1);
    pthread_mutex_unlock(&pool.lock);
}

int compute_slot_try_hold(void)
{
    if (held_slot)
        return 0;
    if (!pool.running) {
        held_slot = 1;
        return 0;
    }
    /* Never ahead of a caller already waiting: it would wait on and on. */
    int ok = atomic_load(&pool.waiting) == 0 && take_slots(1) == 1;
    held_slot = ok;
    return ok ? 0 : -1;
}

void compute_slot_release(void)
{
    if (!held_slot)
        return;
    held_slot = 0;
    if (!pool.running)
        return;
    give_slot(0);
}

void compute_slot_usage(unsigned *busy, unsigned *waiting, unsigned *slots)
{
    /* Both counts are atomic and change without the pool's lock (take_slots,
     * give_slot), so taking it here would make the snapshot no truer. */
    *slots = pool.slots;
    *busy = pool.slots - atomic_load(&pool.free_slots);
    *waiting = atomic_load(&pool.waiting);
}

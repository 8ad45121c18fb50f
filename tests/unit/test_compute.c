/*
 * test_compute.c - the compute pool.
 *
 * Several caller threads share a small pool at once: every task runs once,
 * slots stay below what each caller asked for, and no more threads compute
 * at the same moment than the pool has slots; small requests holding a
 * slot of their own beside them, and a slot given back by one, wake a
 * caller that waits for it.  Starting the pool when
 * memory runs out fails cleanly, leaving nothing allocated and the pool
 * serial.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "core/compute.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* The compute pool runs every task once, hands out slots below max_slots,
 * and never lets more threads compute at once than it has slots, however
 * many callers ask at the same time. */
typedef struct pool_probe {
    atomic_int *runs;           /* per task */
    atomic_int active, peak, bad_slot;
    unsigned max_slots;
    int early;                  /* compute_parallel returned before every task had ended */
} pool_probe;

static void probe_task(void *arg, size_t task, unsigned slot)
{
    pool_probe *p = arg;
    int now = atomic_fetch_add(&p->active, 1) + 1;
    int peak = atomic_load(&p->peak);
    while (now > peak && !atomic_compare_exchange_weak(&p->peak, &peak, now))
        ;
    if (slot >= p->max_slots)
        atomic_store(&p->bad_slot, 1);
    atomic_fetch_add(&p->runs[task], 1);
    for (volatile int spin = 0; spin < 20000; spin++)
        ;
    atomic_fetch_sub(&p->active, 1);
}

typedef struct caller_arg {
    pool_probe *probe;
    size_t tasks;
} caller_arg;

/* One caller's tasks, then whether every one of them had ended when
 * compute_parallel returned (the join waits for its helpers). */
static void *caller_main(void *arg)
{
    caller_arg *c = arg;
    compute_parallel(c->tasks, c->probe->max_slots, probe_task, c->probe);
    for (size_t t = 0; t < c->tasks; t++)
        if (atomic_load(&c->probe->runs[t]) != 1)
            c->probe->early = 1;
    if (atomic_load(&c->probe->active) != 0)
        c->probe->early = 1;
    return NULL;
}

void test_compute_pool_runs_each_task_once(void)
{
    enum { CALLERS = 4, TASKS = 200, SLOTS = 3 };
    ASSERT_EQ(compute_init(SLOTS), 0);
    static atomic_int runs[CALLERS][TASKS];
    pool_probe probe[CALLERS];
    pthread_t threads[CALLERS];
    caller_arg args[CALLERS];
    for (int c = 0; c < CALLERS; c++) {
        for (int t = 0; t < TASKS; t++)
            atomic_init(&runs[c][t], 0);
        probe[c] = (pool_probe){.runs = runs[c], .max_slots = c == 0 ? 1 : SLOTS};
        atomic_init(&probe[c].active, 0);
        atomic_init(&probe[c].peak, 0);
        atomic_init(&probe[c].bad_slot, 0);
        args[c] = (caller_arg){&probe[c], TASKS};
        pthread_create(&threads[c], NULL, caller_main, &args[c]);
    }
    for (int c = 0; c < CALLERS; c++)
        pthread_join(threads[c], NULL);
    compute_shutdown();
    for (int c = 0; c < CALLERS; c++) {
        for (int t = 0; t < TASKS; t++)
            if (atomic_load(&runs[c][t]) != 1)
                FAIL_AT("caller %d task %d ran %d times", c, t, atomic_load(&runs[c][t]));
        ASSERT(!atomic_load(&probe[c].bad_slot));
        if (probe[c].early)
            FAIL_AT("caller %d: compute_parallel returned before its tasks had ended", c);
        ASSERT(atomic_load(&probe[c].peak) <= (int)probe[c].max_slots);
    }
    /* Caller 0 asked for one slot: its tasks ran one at a time. */
    ASSERT_EQ(atomic_load(&probe[0].peak), 1);
}

/* Across callers, no more threads compute at once than the pool has slots. */
static atomic_int global_active, global_peak;

static void global_task(void *arg, size_t task, unsigned slot)
{
    (void)arg;
    (void)task;
    (void)slot;
    int now = atomic_fetch_add(&global_active, 1) + 1;
    int peak = atomic_load(&global_peak);
    while (now > peak && !atomic_compare_exchange_weak(&global_peak, &peak, now))
        ;
    for (volatile int spin = 0; spin < 20000; spin++)
        ;
    atomic_fetch_sub(&global_active, 1);
}

static void *global_caller(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20; i++)
        compute_parallel(16, 8, global_task, NULL);
    return NULL;
}

void test_compute_pool_bounds_threads(void)
{
    enum { CALLERS = 6, SLOTS = 2 };
    ASSERT_EQ(compute_init(SLOTS), 0);
    atomic_init(&global_active, 0);
    atomic_init(&global_peak, 0);
    pthread_t threads[CALLERS];
    for (int c = 0; c < CALLERS; c++)
        pthread_create(&threads[c], NULL, global_caller, NULL);
    for (int c = 0; c < CALLERS; c++)
        pthread_join(threads[c], NULL);
    compute_shutdown();
    ASSERT(atomic_load(&global_peak) >= 1);
    if (atomic_load(&global_peak) > SLOTS)
        FAIL_AT("%d threads computed at once with %d slots", atomic_load(&global_peak), SLOTS);
}

/* Small requests' threads (compute_slot_try_hold, their one task on that
 * slot, compute_slot_release: no lock unless someone waits) beside large
 * ones that wait for a first slot and lend the rest: every task runs, no
 * more threads compute at once than there are slots, every slot comes back,
 * and no waiter sleeps through a slot given back (the run ends in time). */
static atomic_int mixed_tasks, mixed_done;

static void mixed_task(void *arg, size_t task, unsigned slot)
{
    (void)task;
    (void)slot;
    atomic_fetch_add(&mixed_tasks, 1);
    global_task(arg, task, slot);
}

/* Holds a slot MIXED_HOLDS times.  try_hold refuses while a large caller
 * waits, which may be all the while the large callers run (as under ASan on
 * a busy machine), so it asks until it has them all: once the large callers
 * are done nobody waits; the attempts are bounded all the same, and the
 * test's own clock bounds the time. */
enum { MIXED_HOLDS = 200 };

static void *mixed_small(void *arg)
{
    atomic_int *held = arg;
    for (long tries = 0, mine = 0; mine < MIXED_HOLDS && tries < 100000000; tries++) {
        if (compute_slot_try_hold() != 0) {
            sched_yield();
            continue;
        }
        mine++;
        atomic_fetch_add(held, 1);
        compute_parallel(1, 1, mixed_task, NULL);
        compute_slot_release();
    }
    atomic_fetch_add(&mixed_done, 1);
    return NULL;
}

static void *mixed_large(void *arg)
{
    (void)arg;
    for (int i = 0; i < 40; i++)
        compute_parallel(8, 4, mixed_task, NULL);
    atomic_fetch_add(&mixed_done, 1);
    return NULL;
}

void test_compute_pool_small_beside_large(void)
{
    enum { SMALL = 3, LARGE = 3, SLOTS = 2 };
    ASSERT_EQ(compute_init(SLOTS), 0);
    atomic_init(&global_active, 0);
    atomic_init(&global_peak, 0);
    atomic_init(&mixed_tasks, 0);
    atomic_init(&mixed_done, 0);
    atomic_int held;
    atomic_init(&held, 0);
    pthread_t threads[SMALL + LARGE];
    for (int c = 0; c < SMALL + LARGE; c++)
        pthread_create(&threads[c], NULL, c < SMALL ? mixed_small : mixed_large, &held);
    /* A lost wake-up leaves a caller asleep for good: give up after 60 s
     * (the run takes well under one) rather than hang the suite. */
    for (int waited = 0; atomic_load(&mixed_done) < SMALL + LARGE; waited++) {
        if (waited == 6000)
            FAIL_AT("%d of %d callers finished in 60 s: one waits for a slot that came back",
                    atomic_load(&mixed_done), SMALL + LARGE);
        struct timespec tick = {0, 10000000};
        nanosleep(&tick, NULL);
    }
    for (int c = 0; c < SMALL + LARGE; c++)
        pthread_join(threads[c], NULL);
    unsigned busy, waiting, slots;
    compute_slot_usage(&busy, &waiting, &slots);
    compute_shutdown();
    ASSERT_EQ(atomic_load(&mixed_tasks), atomic_load(&held) + LARGE * 40 * 8);
    ASSERT_EQ(atomic_load(&held), SMALL * MIXED_HOLDS);
    ASSERT(atomic_load(&global_peak) >= 1);
    if (atomic_load(&global_peak) > SLOTS)
        FAIL_AT("%d threads computed at once with %d slots", atomic_load(&global_peak), SLOTS);
    ASSERT_EQ(busy, 0u);
    ASSERT_EQ(waiting, 0u);
    ASSERT_EQ(slots, (unsigned)SLOTS);
}

/* A caller waiting for the only slot is woken when a small request's
 * thread gives that slot back, with no other release to wake it. */
static void *waiting_caller(void *arg)
{
    compute_parallel(1, 1, mixed_task, NULL);
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

void test_compute_pool_release_wakes_waiter(void)
{
    ASSERT_EQ(compute_init(1), 0);
    atomic_init(&mixed_tasks, 0);
    ASSERT_EQ(compute_slot_try_hold(), 0);
    atomic_int finished;
    atomic_init(&finished, 0);
    pthread_t t;
    pthread_create(&t, NULL, waiting_caller, &finished);
    unsigned busy = 0, waiting = 0, slots = 0;
    struct timespec tick = {0, 1000000};
    for (int i = 0; i < 10000 && waiting == 0; i++) {
        nanosleep(&tick, NULL);
        compute_slot_usage(&busy, &waiting, &slots);
    }
    ASSERT_EQ(waiting, 1u);
    ASSERT_EQ(atomic_load(&mixed_tasks), 0);
    compute_slot_release();
    for (int i = 0; i < 10000 && !atomic_load(&finished); i++)
        nanosleep(&tick, NULL);
    if (!atomic_load(&finished))
        FAIL_AT("the waiting caller still sleeps 10 s after the slot came back");
    pthread_join(t, NULL);
    compute_shutdown();
    ASSERT_EQ(atomic_load(&mixed_tasks), 1);
}

/* The join: compute_parallel returns only once its helpers' tasks have ended,
 * whether a helper ends within the caller's spin (50 us) or long after it
 * (5 ms, past COMPUTE_JOIN_SPIN_S).  The caller's own task takes 1 ms, so
 * that the helper, woken meanwhile, takes the other task; if it wakes later
 * than that, the caller runs both and the join has nothing to wait for. */
typedef struct join_probe {
    long helper_us;             /* how long a task on a helper's slot takes */
    atomic_int ended;           /* tasks that have ended */
} join_probe;

static void join_task(void *arg, size_t task, unsigned slot)
{
    (void)task;
    join_probe *j = arg;
    long us = slot == 0 ? 1000 : j->helper_us;
    struct timespec d = {0, us * 1000};
    nanosleep(&d, NULL);
    atomic_fetch_add(&j->ended, 1);
}

void test_compute_pool_join_waits_for_helpers(void)
{
    ASSERT_EQ(compute_init(2), 0);
    const long helper_us[] = {50, 5000};
    for (int round = 0; round < 20; round++) {
        join_probe j = {.helper_us = helper_us[round % 2]};
        atomic_init(&j.ended, 0);
        compute_parallel(2, 2, join_task, &j);
        int ended = atomic_load(&j.ended);
        if (ended != 2) {
            compute_shutdown();
            FAIL_AT("round %d (helper tasks of %ld us): compute_parallel returned with %d of 2 "
                    "tasks ended", round, j.helper_us, ended);
        }
    }
    compute_shutdown();
}

/* A task for the out-of-memory test: counts the tasks it ran. */
static void count_task(void *arg, size_t task, unsigned slot)
{
    (void)task;
    (void)slot;
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* Fails the pool's Nth allocation for N = 0, 1, 2, ... until compute_init
 * succeeds: each failure returns -1 with nothing left allocated or running,
 * and the pool still runs work serially; the start that succeeds gives the
 * asked-for slots and is undone by compute_shutdown. */
void test_compute_pool_start_out_of_memory(void)
{
    enum { SLOTS = 3, TASKS = 10 };
    long n = 0;
    for (;; n++) {
        ASSERT(n < 100);
        mem_fail_after(n);
        int rc = compute_init(SLOTS);
        if (rc == 0)
            break;
        long refused = mem_failures(), live = mem_fail_live();
        mem_fail_reset();
        ASSERT_EQ(rc, -1);
        ASSERT(refused > 0);
        if (live != 0)
            FAIL_AT("start failed at allocation %ld leaving %ld blocks allocated", n, live);
        ASSERT_EQ(compute_threads(), 1);
        atomic_int runs;
        atomic_init(&runs, 0);
        compute_parallel(TASKS, SLOTS, count_task, &runs);
        ASSERT_EQ(atomic_load(&runs), TASKS);
    }
    ASSERT_EQ(mem_failures(), 0);
    ASSERT(mem_fail_live() > 0);  /* the started pool holds its arrays */
    ASSERT_EQ(compute_threads(), SLOTS);
    atomic_int runs;
    atomic_init(&runs, 0);
    compute_parallel(TASKS, SLOTS, count_task, &runs);
    compute_shutdown();
    long live = mem_fail_live();
    mem_fail_reset();
    ASSERT_EQ(atomic_load(&runs), TASKS);
    ASSERT_EQ(live, 0);
    ASSERT_EQ(compute_threads(), 1);
    ASSERT(n >= 1); /* at least the first allocation was failed */
}

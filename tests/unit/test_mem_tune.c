/*
 * test_mem_tune.c - the allocator settings of mem_tune_allocator (mem.h).
 *
 * Its arena limit is what spares a fresh server's workers from faulting in
 * a heap each: once it is set, threads that allocate at the same time make
 * no more arenas than there are CPUs.  glibc's malloc_info lists the arenas.
 *
 * glibc fixes its limit for good once a process has more than eight arenas,
 * as the server never has when it calls mem_tune_allocator at start-up; the
 * test is first in test.h for the same reason.  Under valgrind the
 * threads' blocks come from its allocator and no glibc arena appears
 * either way; AddressSanitizer's mallopt refuses every setting, so there
 * the test has nothing to check.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "test.h"

/* More than glibc's default of eight arenas a core would allow on two. */
#define TUNE_THREADS 24

/* The arenas malloc_info lists ("<heap nr=..."), or -1 when it cannot say. */
static int arenas_now(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return -1;
    int rc = malloc_info(0, f);
    fclose(f);
    int n = 0;
    for (const char *p = text; rc == 0 && p != NULL && (p = strstr(p, "<heap nr=")) != NULL; p++)
        n++;
    free(text);
    return rc == 0 ? n : -1;
}

typedef struct tune_thread_arg {
    pthread_barrier_t *all_hold;
    void **block;               /* where the block goes: kept where the compiler sees it used */
} tune_thread_arg;

static void *tune_thread(void *arg)
{
    tune_thread_arg *t = arg;
    *t->block = malloc(1 << 16);
    pthread_barrier_wait(t->all_hold); /* every thread holds its block at the same time */
    free(*t->block);
    return NULL;
}

void test_mem_tune_arena_limit(void)
{
#ifdef __SANITIZE_ADDRESS__
    return; /* AddressSanitizer's mallopt does nothing and says so */
#endif
    if (getenv("GLIBC_TUNABLES") != NULL || getenv("MALLOC_ARENA_MAX") != NULL)
        return; /* the operator's settings win (mem.h): nothing of ours to check */
    int before = arenas_now();
    ASSERT(before >= 1 && before <= 8);
    ASSERT_EQ(mem_tune_allocator(), 1);
    pthread_barrier_t all_hold;
    pthread_t threads[TUNE_THREADS];
    void *blocks[TUNE_THREADS];
    tune_thread_arg args[TUNE_THREADS];
    ASSERT_EQ(pthread_barrier_init(&all_hold, NULL, TUNE_THREADS), 0);
    for (int i = 0; i < TUNE_THREADS; i++) {
        args[i] = (tune_thread_arg){&all_hold, &blocks[i]};
        ASSERT_EQ(pthread_create(&threads[i], NULL, tune_thread, &args[i]), 0);
    }
    for (int i = 0; i < TUNE_THREADS; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&all_hold);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int after = arenas_now(), most = before > cpus ? before : (int)cpus;
    if (after < before || after > most)
        FAIL_AT("%d arenas after %d threads allocated at once (%d before, %ld CPUs)", after,
                TUNE_THREADS, before, cpus);
}

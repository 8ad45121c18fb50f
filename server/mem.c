/*
 * mem.c - allocation wrappers with failure injection for tests.
 *
 * In production the countdown is negative and the wrappers cost one relaxed
 * atomic load.  Tests set a countdown with mem_fail_after(n); the (n+1)th
 * allocation and all after it return NULL, which lets a test walk n = 0, 1,
 * 2, ... through a code path as SQLite's malloc tests do.
 */
#include "mem.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown = -1;
static atomic_long fail_count = 0;

static int mem_should_fail(void)
{
    long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (n < 0)
        return 0;
    for (;;) {
        if (n == 0) {
            atomic_fetch_add(&fail_count, 1);
            return 1;
        }
        if (atomic_compare_exchange_weak(&fail_countdown, &n, n - 1))
            return 0;
        if (n < 0)
            return 0;
    }
}

void *mem_malloc(size_t size)
{
    if (mem_should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *mem_calloc(size_t count, size_t size)
{
    if (mem_should_fail())
        return NULL;
    if (count == 0 || size == 0)
        count = size = 1;
    return calloc(count, size);
}

void *mem_realloc(void *ptr, size_t size)
{
    if (mem_should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
}

void mem_free(void *ptr)
{
    free(ptr);
}

char *mem_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy = mem_malloc(n);
    if (copy != NULL)
        memcpy(copy, s, n);
    return copy;
}

int mem_mul(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
        return -1;
    *out = abc;
    return 0;
}

void mem_install_jansson(void)
{
    json_set_alloc_funcs(mem_malloc, mem_free);
}

void mem_fail_after(long n)
{
    atomic_store(&fail_count, 0);
    atomic_store(&fail_countdown, n);
}

void mem_fail_reset(void)
{
    atomic_store(&fail_countdown, -1);
}

long mem_failures(void)
{
    return atomic_load(&fail_count);
}

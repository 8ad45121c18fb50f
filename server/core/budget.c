/*
 * budget.c - the process memory budget (see budget.h).
 *
 * One atomic counter of reserved bytes; a reservation is a compare-and-swap
 * loop that adds only when the sum stays within the limit, so concurrent
 * reservations can never overshoot it together.
 */
#include "budget.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_size_t reserved;
static size_t limit_bytes;

void budget_init(size_t limit)
{
    limit_bytes = limit;
    atomic_store(&reserved, 0);
}

int budget_reserve(size_t bytes)
{
    size_t now = atomic_load(&reserved);
    for (;;) {
        if (limit_bytes != 0 && (bytes > limit_bytes || now > limit_bytes - bytes))
            return -1;
        if (atomic_compare_exchange_weak(&reserved, &now, now + bytes))
            return 0;
    }
}

void budget_release(size_t bytes)
{
    atomic_fetch_sub(&reserved, bytes);
}

int budget_could_fit(size_t bytes)
{
    return limit_bytes == 0 || bytes <= limit_bytes;
}

size_t budget_limit(void)
{
    return limit_bytes;
}

/* Reads one unsigned number from path; 0 when missing, "max", or malformed. */
static size_t read_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char text[64] = "";
    size_t value = 0;
    if (fgets(text, sizeof text, f) != NULL) {
        char *end;
        unsigned long long v = strtoull(text, &end, 10);
        if (end != text && (*end == '\n' || *end == '\0') && v <= SIZE_MAX)
            value = (size_t)v;
    }
    fclose(f);
    return value;
}

size_t budget_memory_available(void)
{
    size_t physical = 0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        physical = (size_t)pages * (size_t)page;
    /* v2 writes "max" when unlimited; v1 writes a huge number instead. */
    size_t cgroup = read_number("/sys/fs/cgroup/memory.max");
    if (cgroup == 0)
        cgroup = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (cgroup != 0 && (physical == 0 || cgroup < physical))
        return cgroup;
    return physical;
}

size_t budget_default_limit(void)
{
    return budget_memory_available() / 4 * 3;
}

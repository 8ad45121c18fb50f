/*
 * mem.c - the allocation wrappers, and their failure injection in test builds.
 *
 * Test builds (-DATTN_TESTING, test_hooks.h) can make allocations fail: a
 * test sets a countdown with mem_fail_after(n); the (n+1)th allocation and
 * all after it return NULL, which lets a test walk n = 0, 1, 2, ... through
 * a code path as SQLite's malloc tests do.  While a
 * countdown is set, the wrappers also count the blocks allocated and freed,
 * so that the test can check that a failed call left nothing allocated.
 * The server is built without any of this: the wrappers are the C library's.
 *
 * jansson allocates through these wrappers too, or, while the calling thread
 * has its JSON arena open, from the arena's blocks: a request's parse tree is
 * thousands of small nodes that all die together, so they are carved from a
 * few large blocks and given back at once.
 */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE (Linux) */
#include "mem.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Freed heap is kept up to this much (mem_tune_allocator). */
#define MEM_TRIM_THRESHOLD ((size_t)128 << 20)
/* Arenas at most: one a CPU, as many as there are threads that can run at once. */
#define MEM_ARENA_MAX 64

#ifdef ATTN_TESTING
#include "test_hooks.h"

static atomic_long fail_countdown = -1;
static atomic_long fail_count = 0;
static atomic_long fail_live = 0;   /* blocks allocated minus freed while injecting */

static int mem_injecting(void)
{
    return atomic_load_explicit(&fail_countdown, memory_order_relaxed) >= 0;
}

/* Counts a block allocated (delta 1) or freed (-1) while failures are being
 * injected, for mem_fail_live. */
static void *mem_counted(void *ptr, long delta)
{
    if (ptr != NULL && mem_injecting())
        atomic_fetch_add(&fail_live, delta);
    return ptr;
}

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
#else
/* The server is built without failure injection: nothing fails on purpose
 * and nothing is counted. */
static int mem_should_fail(void)
{
    return 0;
}

static void *mem_counted(void *ptr, long delta)
{
    (void)delta;
    return ptr;
}
#endif

/* The huge-page advice of mem.h's large blocks. */
static void *mem_large(void *ptr, size_t size)
{
    if (ptr != NULL && size >= MEM_MMAP_THRESHOLD)
        mem_advise_huge(ptr, size);
    return ptr;
}

void *mem_malloc(size_t size)
{
    if (mem_should_fail())
        return NULL;
    return mem_counted(mem_large(malloc(size ? size : 1), size), 1);
}

void *mem_calloc(size_t count, size_t size)
{
    if (mem_should_fail())
        return NULL;
    if (count == 0 || size == 0)
        count = size = 1;
    /* calloc has checked count x size for overflow when it returns a block */
    return mem_counted(mem_large(calloc(count, size), count * size), 1);
}

void *mem_realloc(void *ptr, size_t size)
{
    if (mem_should_fail())
        return NULL;
    void *moved = mem_large(realloc(ptr, size ? size : 1), size);
    return ptr == NULL ? mem_counted(moved, 1) : moved;
}

void *mem_aligned(size_t align, size_t size)
{
    if (mem_should_fail())
        return NULL;
    void *ptr = NULL;
    if (posix_memalign(&ptr, align, size ? size : 1) != 0)
        return NULL;
    return mem_counted(mem_large(ptr, size), 1);
}

void mem_free(void *ptr)
{
    mem_counted(ptr, -1);
    free(ptr);
}

int mem_mul(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
        return -1;
    *out = abc;
    return 0;
}

/* One block of a JSON arena; its numbers follow the header. */
typedef struct arena_block {
    struct arena_block *next;   /* the block before (older, smaller) */
    size_t size, used;
} arena_block;

#define ARENA_ALIGN 16
#define ARENA_HEADER ((sizeof(arena_block) + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1))
#define ARENA_FIRST_BLOCK ((size_t)64 << 10)
#define ARENA_LARGEST_BLOCK ((size_t)64 << 20)

static _Thread_local int arena_open;
static _Thread_local arena_block *arena_newest;
static _Thread_local unsigned long arena_epoch;

/* size bytes from the open arena, or NULL when memory runs out. */
static void *arena_take(size_t size)
{
    if (size > SIZE_MAX - ARENA_HEADER - ARENA_ALIGN)
        return NULL;
    size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    arena_block *b = arena_newest;
    if (b == NULL || b->size - b->used < size) {
        /* Each block twice the one before: few blocks, whatever the body. */
        size_t want = b == NULL ? ARENA_FIRST_BLOCK : b->size * 2;
        if (want > ARENA_LARGEST_BLOCK)
            want = ARENA_LARGEST_BLOCK;
        if (want < size)
            want = size;
        arena_block *nb = mem_malloc(ARENA_HEADER + want);
        if (nb == NULL)
            return NULL;
        nb->next = b;
        nb->size = want;
        nb->used = 0;
        arena_newest = b = nb;
    }
    void *p = (char *)b + ARENA_HEADER + b->used;
    b->used += size;
    return p;
}

static void *json_alloc(size_t size)
{
    if (!arena_open)
        return mem_malloc(size);
    if (size > ARENA_LARGEST_BLOCK)
        return NULL;    /* no JSON body under the server's limits needs it */
    return arena_take(size);
}

void *mem_json_arena_alloc(size_t size)
{
    return arena_open ? arena_take(size) : NULL;
}

unsigned long mem_json_arena_epoch(void)
{
    return arena_open ? arena_epoch : 0;
}

/* Frees of arena memory are nothing; anything else (taken before the arena
 * opened) goes back to mem_free.  The newest blocks, the largest, come first. */
static void json_release(void *ptr)
{
    if (ptr == NULL)
        return;
    if (arena_open)
        for (arena_block *b = arena_newest; b != NULL; b = b->next) {
            const char *data = (const char *)b + ARENA_HEADER;
            if ((const char *)ptr >= data && (const char *)ptr < data + b->size)
                return;
        }
    mem_free(ptr);
}

void mem_install_jansson(void)
{
    json_set_alloc_funcs(json_alloc, json_release);
}

void mem_json_arena_begin(void)
{
    arena_newest = NULL;
    arena_open = 1;
    if (++arena_epoch == 0)
        arena_epoch = 1;
}

void mem_json_arena_end(void)
{
    arena_open = 0;
    while (arena_newest != NULL) {
        arena_block *older = arena_newest->next;
        mem_free(arena_newest);
        arena_newest = older;
    }
}

#ifdef ATTN_TESTING
void mem_fail_after(long n)
{
    atomic_store(&fail_count, 0);
    atomic_store(&fail_live, 0);
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

long mem_fail_live(void)
{
    return atomic_load(&fail_live);
}
#endif

void mem_advise_huge(void *ptr, size_t size)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = ((uintptr_t)ptr + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)ptr + size) & ~(huge - 1);
    if (ptr != NULL && end > start)
        (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)ptr;
    (void)size;
#endif
}

/* The whole pages strictly inside [ptr, ptr + size) as [*start, *end); returns the page
 * size, or 0 when there is none (ptr NULL, or no whole page inside). */
static uintptr_t pages_inside(const void *ptr, size_t size, uintptr_t *start, uintptr_t *end)
{
    long sys_page = sysconf(_SC_PAGESIZE);
    uintptr_t page = sys_page > 0 ? (uintptr_t)sys_page : 4096;
    *start = ((uintptr_t)ptr + page - 1) & ~(page - 1);
    *end = ((uintptr_t)ptr + size) & ~(page - 1);
    return ptr != NULL && *end > *start ? page : 0;
}

/* One share of mem_populate's range, populated by one thread; rc 0 or -1. */
typedef struct populate_span {
    uintptr_t start, end;
    int rc;
} populate_span;

static void *populate_span_run(void *arg)
{
    populate_span *s = arg;
#ifdef MADV_POPULATE_WRITE
    s->rc = s->end > s->start &&
                    madvise((void *)s->start, s->end - s->start, MADV_POPULATE_WRITE) != 0
                ? -1 : 0;
#else
    s->rc = -1;
    errno = EINVAL; /* as a kernel without it answers */
#endif
    return NULL;
}

int mem_populate(void *ptr, size_t size)
{
    uintptr_t start, end, page = pages_inside(ptr, size, &start, &end);
    if (page == 0)
        return 0;
    uintptr_t middle = start + ((end - start) / 2 & ~(page - 1));
    populate_span halves[2] = {{start, middle, 0}, {middle, end, 0}};
    pthread_t helper;
    int two = end - start >= MEM_POPULATE_SPLIT &&
              pthread_create(&helper, NULL, populate_span_run, &halves[1]) == 0;
    if (!two)
        halves[0].end = end;
    populate_span_run(&halves[0]);
    if (two)
        pthread_join(helper, NULL);
    return halves[0].rc != 0 || (two && halves[1].rc != 0) ? -1 : 0;
}

void mem_release(const void *ptr, size_t size)
{
    uintptr_t start, end;
    if (pages_inside(ptr, size, &start, &end) != 0)
        (void)madvise((void *)start, end - start, MADV_DONTNEED);
}

/* What the allocator kept resident beyond its live bytes at start-up (mem_tune_allocator),
 * and whether a trim is running. */
static atomic_size_t kept_at_start;
static pthread_mutex_t trim_lock = PTHREAD_MUTEX_INITIALIZER;

/* Resident bytes of this process from /proc/self/statm, or 0 when it cannot be read. */
static size_t resident_bytes(void)
{
    char text[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    unsigned long long size = 0, resident = 0;
    if (sscanf(text, "%llu %llu", &size, &resident) != 2)
        return 0;
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Resident bytes that are not the allocator's live blocks: freed memory it keeps, plus
 * what is not the allocator's at all (code, stacks, libraries' own mappings). */
static size_t kept_bytes(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    size_t rss = resident_bytes();
    struct mallinfo2 mi = mallinfo2();
    size_t live = mi.uordblks + mi.hblkhd;
    return rss > live ? rss - live : 0;
#else
    return 0;
#endif
}

void mem_give_back(void)
{
    /* One at a time, each looking after the last trim: a request that ends during a trim
     * may have freed its memory after that trim looked. */
    pthread_mutex_lock(&trim_lock);
    if (kept_bytes() > atomic_load(&kept_at_start) + MEM_TRIM_THRESHOLD)
        malloc_trim(0);
    pthread_mutex_unlock(&trim_lock);
}

int mem_tune_allocator(void)
{
    atomic_store(&kept_at_start, kept_bytes());
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables != NULL && strstr(tunables, "glibc.malloc.") != NULL)
        return 0;
#ifdef M_MMAP_THRESHOLD
    if (mallopt(M_MMAP_THRESHOLD, MEM_MMAP_THRESHOLD) != 1 ||
        mallopt(M_TRIM_THRESHOLD, MEM_TRIM_THRESHOLD) != 1)
        return 0;
    if (getenv("MALLOC_ARENA_MAX") != NULL)     /* the operator's, read by glibc itself */
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return mallopt(M_ARENA_MAX, cpus < 1 ? 1 : cpus > MEM_ARENA_MAX ? MEM_ARENA_MAX : (int)cpus);
#else
    return 0;
#endif
}

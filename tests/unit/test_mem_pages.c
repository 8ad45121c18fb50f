/*
 * test_mem_pages.c - mem_populate (mem.h): the pages of a buffer made
 * resident ahead of its writes.
 *
 * The pages strictly inside the range must be resident afterwards (mincore
 * says so), on one thread below MEM_POPULATE_SPLIT and on two from it, and
 * what the buffer held must be unchanged: populating may never write.  A
 * kernel without MADV_POPULATE_WRITE (before Linux 5.14) makes mem_populate
 * answer -1 with EINVAL, and then only the contents are checked.
 *
 * And the huge-page advice of the allocation wrappers: a block of MEM_MMAP_THRESHOLD bytes
 * or more from each of them lies in a mapping that /proc/self/smaps flags "hg"
 * (MADV_HUGEPAGE), where the kernel has transparent huge pages at all.
 */
#define _DEFAULT_SOURCE /* mincore, MAP_ANONYMOUS */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/mem.h"
#include "test.h"

/* Pages [first, last] of the mapping at base that are resident. */
static size_t resident_pages(unsigned char *base, size_t first, size_t last, size_t page)
{
    unsigned char vec[8192];
    size_t pages = last + 1;
    if (pages > sizeof vec || mincore(base, pages * page, vec) != 0)
        return (size_t)-1;
    size_t n = 0;
    for (size_t i = first; i <= last; i++)
        n += vec[i] & 1;
    return n;
}

/* Maps `pages` fresh pages, marks three bytes, populates [base + 1, end - 1) and checks. */
static void populate_and_check(size_t pages)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = pages * page;
    unsigned char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                               -1, 0);
    ASSERT(base != MAP_FAILED);
#ifdef MADV_NOHUGEPAGE
    /* so that a mark faults in its own page alone, also where huge pages are always on */
    (void)madvise(base, size, MADV_NOHUGEPAGE);
#endif
    size_t marks[3] = {5, size / 2 + 17, size - 3};
    for (int i = 0; i < 3; i++)
        base[marks[i]] = (unsigned char)(0xA0 + i);
    /* untouched pages of a fresh private mapping are not resident */
    ASSERT(resident_pages(base, 1, pages - 2, page) <= 1);
    errno = 0;
    int rc = mem_populate(base + 1, size - 2);
    if (rc == 0) {
        ASSERT_EQ(resident_pages(base, 1, pages - 2, page), pages - 2);
    } else {
        ASSERT_EQ(rc, -1);
        ASSERT_EQ(errno, EINVAL);
    }
    for (size_t i = 0, m = 0; i < size; i++) {
        unsigned char want = m < 3 && i == marks[m] ? (unsigned char)(0xA0 + m++) : 0;
        if (base[i] != want)
            FAIL_AT("byte %zu holds %u after mem_populate, not %u", i, base[i], want);
    }
    munmap(base, size);
}

void test_mem_populate_resident_unchanged(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    populate_and_check(16);                                 /* one thread */
    populate_and_check(MEM_POPULATE_SPLIT / page + 64);     /* two */
    ASSERT_EQ(mem_populate(NULL, 1 << 20), 0);
    unsigned char small[16];
    ASSERT_EQ(mem_populate(small, sizeof small), 0);       /* no whole page inside: nothing */
}

/* Whether the VmFlags of the mapping that holds addr (/proc/self/smaps) list `flag`: 1 or
 * 0, or -1 when no mapping holds it or smaps cannot be read. */
static int mapping_flagged(const void *addr, const char *flag)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL)
        return -1;
    char line[512];
    int inside = 0, found = -1;
    uintptr_t at = (uintptr_t)addr;
    while (found < 0 && fgets(line, sizeof line, f) != NULL) {
        unsigned long long lo, hi;
        char dash;
        if (sscanf(line, "%llx%c%llx ", &lo, &dash, &hi) == 3 && dash == '-') {
            inside = at >= lo && at < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            found = 0;
            for (char *w = strtok(line + 8, " \n"); w != NULL; w = strtok(NULL, " \n"))
                found |= strcmp(w, flag) == 0;
        }
    }
    fclose(f);
    return found;
}

void test_mem_large_blocks_huge(void)
{
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        return;                         /* no transparent huge pages: no advice to see */
    size_t size = MEM_MMAP_THRESHOLD + ((size_t)4 << 20), huge = (size_t)2 << 20;
    void *blocks[4] = {mem_malloc(size), mem_calloc(size / 8, 8), mem_aligned(64, size),
                       mem_realloc(NULL, size)};
    for (int i = 0; i < 4; i++) {
        ASSERT(blocks[i] != NULL);
        /* a byte of the block's first whole 2 MiB, which the advice covers */
        uintptr_t inside = ((uintptr_t)blocks[i] + 2 * huge - 1) & ~(uintptr_t)(huge - 1);
        int flagged = mapping_flagged((const void *)inside, "hg");
        if (flagged != 1)
            FAIL_AT("block %d of %zu bytes: smaps says %d for its huge-page advice", i, size,
                    flagged);
    }
    for (int i = 0; i < 4; i++)
        mem_free(blocks[i]);
}

/*
 * test_mem_pages.c - mem_populate (mem.h): the pages of a buffer made
 * resident ahead of its writes.
 *
 * The pages strictly inside the range must be resident afterwards (mincore
 * says so), on one thread below MEM_POPULATE_SPLIT and on two from it, and
 * what the buffer held must be unchanged: populating may never write.  A
 * kernel without MADV_POPULATE_WRITE (before Linux 5.14) makes mem_populate
 * answer -1 with EINVAL, and then only the contents are checked.
 */
#define _DEFAULT_SOURCE /* mincore, MAP_ANONYMOUS */
#include <errno.h>
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

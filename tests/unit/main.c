/*
 * main.c - runs every unit test listed in test.h.
 *
 * Usage: unit-tests [--queue FILE] [--filter SUBSTR | SUBSTR]  (runs only the tests whose
 * name contains SUBSTR; none matching: "0 passed, 0 failed").  With --queue, processes given
 * the same FILE (empty at first) run the list between them: each takes the next test of the
 * list from a counter in FILE (under a lock), so every test runs once and a slow one keeps
 * one process while the others go on (tests/unit/shards.sh runs two, or more).
 * With UNIT_CPU_PATHS_ONLY set in the environment, the kernel tests run only
 * the paths the server has, not the tests' avx512-on-avx2 and amx_bf16-model.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernel/attention_fused.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* kernel_avx512_on_avx2.c: the avx512 path's source at its widths, for AVX2;
 * kernel_amx_model.c: the amx_bf16 path's source on a model of the tiles. */
extern const attn_kernel_path attn_kernel_avx512_on_avx2;
extern const attn_kernel_path attn_kernel_amx_bf16_model;

int test_failed;

typedef struct unit_test {
    const char *name;
    void (*run)(void);
} unit_test;

#define LIST_TEST(name) {#name, test_##name},
static const unit_test all_tests[] = {UNIT_TESTS(LIST_TEST)};

/* The index of the next test for this process from the queue file fd (a decimal counter,
 * empty meaning 0, moved on under an fcntl lock); SIZE_MAX when the file fails. */
static size_t queue_next(int fd)
{
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLKW, &lock) != 0)
        return SIZE_MAX;
    char text[32] = {0};
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    size_t next = got > 0 ? (size_t)strtoull(text, NULL, 10) : 0;
    int len = snprintf(text, sizeof text, "%zu\n", next + 1);
    int ok = got >= 0 && pwrite(fd, text, (size_t)len, 0) == len;
    lock.l_type = F_UNLCK;
    fcntl(fd, F_SETLK, &lock);
    return ok ? next : SIZE_MAX;
}

int main(int argc, char **argv)
{
    mem_install_jansson();
    /* UNIT_CPU_PATHS_ONLY: only the paths the server has (tests/run.sh's valgrind suite,
     * where the extra paths would add minutes; the asan suite runs them). */
    if (getenv("UNIT_CPU_PATHS_ONLY") == NULL) {
        attn_kernel_add_for_testing(&attn_kernel_avx512_on_avx2);
        attn_kernel_add_for_testing(&attn_kernel_amx_bf16_model);
    }
    const char *filter = NULL, *queue = NULL;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (strcmp(argv[i], "--queue") == 0 && i + 1 < argc && queue == NULL)
            queue = argv[++i];
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc && filter == NULL)
            filter = argv[++i];
        else if (strncmp(argv[i], "--", 2) != 0 && filter == NULL)
            filter = argv[i];
        else
            bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: %s [--queue FILE] [--filter SUBSTR | SUBSTR]\n", argv[0]);
        return 2;
    }
    int queue_fd = queue != NULL ? open(queue, O_RDWR) : -1;
    if (queue != NULL && queue_fd < 0) {
        fprintf(stderr, "%s: cannot open the queue file %s\n", argv[0], queue);
        return 2;
    }
    const size_t count = sizeof all_tests / sizeof all_tests[0];
    int passed = 0, failed = 0;
    for (size_t i = 0;; i++) {
        if (queue_fd >= 0 && (i = queue_next(queue_fd)) == SIZE_MAX) {
            printf("FAIL --queue %s: the file could not be locked, read or written\n", queue);
            failed++;
            break;
        }
        if (i >= count)
            break;
        if (filter != NULL && strstr(all_tests[i].name, filter) == NULL)
            continue;
        test_failed = 0;
        all_tests[i].run();
        mem_fail_reset();
        if (test_failed) {
            printf("FAIL %s\n", all_tests[i].name);
            failed++;
        } else {
            printf("ok   %s\n", all_tests[i].name);
            passed++;
        }
        fflush(stdout);
    }
    if (queue_fd >= 0)
        close(queue_fd);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

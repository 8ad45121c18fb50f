/*
 * main.c - runs every unit test listed in test.h.
 *
 * Usage: unit-tests [--shard K/N] [--filter SUBSTR | SUBSTR]  (runs only the tests whose name
 * contains SUBSTR; none matching: "0 passed, 0 failed").  --shard K/N runs only every Nth test
 * of the list, from the Kth (0 <= K < N), so that N processes run the list between them:
 * tests/unit/valgrind_shards.sh runs two under valgrind at once.
 * With UNIT_CPU_PATHS_ONLY set in the environment, the kernel tests run only
 * the paths the server has, not the tests' avx512-on-avx2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/attention_fused.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* kernel_avx512_on_avx2.c: the avx512 path's source at its widths, for AVX2. */
extern const attn_kernel_path attn_kernel_avx512_on_avx2;

int test_failed;

typedef struct unit_test {
    const char *name;
    void (*run)(void);
} unit_test;

#define LIST_TEST(name) {#name, test_##name},
static const unit_test all_tests[] = {UNIT_TESTS(LIST_TEST)};

int main(int argc, char **argv)
{
    mem_install_jansson();
    /* UNIT_CPU_PATHS_ONLY: only the paths the server has (tests/run.sh's valgrind suite,
     * where the extra path would add minutes; the asan suite runs it). */
    if (getenv("UNIT_CPU_PATHS_ONLY") == NULL)
        attn_kernel_add_for_testing(&attn_kernel_avx512_on_avx2);
    const char *filter = NULL;
    unsigned shard = 0, shards = 1;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        char end;
        if (strcmp(argv[i], "--shard") == 0 && i + 1 < argc)
            bad = sscanf(argv[++i], "%u/%u%c", &shard, &shards, &end) != 2 || shards == 0 || shard >= shards;
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc && filter == NULL)
            filter = argv[++i];
        else if (strncmp(argv[i], "--", 2) != 0 && filter == NULL)
            filter = argv[i];
        else
            bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: %s [--shard K/N] [--filter SUBSTR | SUBSTR]\n", argv[0]);
        return 2;
    }
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof all_tests / sizeof all_tests[0]; i++) {
        if ((filter != NULL && strstr(all_tests[i].name, filter) == NULL) || i % shards != shard)
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
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

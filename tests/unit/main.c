/*
 * main.c - runs every unit test listed in test.h.
 *
 * Usage: unit-tests [SUBSTRING]  (runs only tests whose name contains it).
 */
#include <stdio.h>
#include <string.h>

#include "mem.h"
#include "test.h"
#include "test_hooks.h"

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
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof all_tests / sizeof all_tests[0]; i++) {
        if (argc > 1 && strstr(all_tests[i].name, argv[1]) == NULL)
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

/*
 * fuzz_json_fast.c - libFuzzer harness: json_fast_load against json_loadb.
 *
 * Every input is parsed by jansson alone and by json_fast_load (every array
 * of numbers, however short, read fast, under names that stand for the
 * members the server reads fast); the two must give the same tree, the same
 * doubles bit for bit, or the same error at the same place
 * (tests/unit/json_fast_check.h).  A difference aborts, and is a finding,
 * as is any sanitizer report.  Build and run with `make fuzz`.
 */
#include <stdlib.h>

#include "json_fast_check.h"
#include "core/test_hooks.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* Short names, so that the fuzzer finds them: q, k, v, x, data, mask, wq, bq. */
static int fuzz_field(const char *name, size_t len)
{
    static const char *const names[] = {"q", "k", "v", "x", "data", "mask", "wq", "bq"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0)
            return 1;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mem_install_jansson();
    json_fast_set_min_numbers(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    int parsed;
    size_t fast = 0;
    if (!json_fast_check((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL,
                         fuzz_field, &parsed, &fast))
        abort();
    return 0;
}

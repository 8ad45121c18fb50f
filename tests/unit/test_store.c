/*
 * test_store.c - opening a store: with the nth allocation failing (store.c).
 * The helpers are store_fixture.c's.
 *
 * Failure injection: store_fail_io_after(n) fails the nth file-system step of
 * a put or delete, and mem_fail_after(n) the nth allocation; the tests walk
 * n = 0, 1, 2, ... until the operation succeeds and check each time that it
 * failed cleanly (an error, no temporary file, memory and disk as before).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"
#include "store/store.h"
#include "store_fixture.h"
#include "test.h"
#include "core/test_hooks.h"

/* store_open with the nth allocation failing must not lose data: it either
 * fails as a whole or loads every set, and never moves a good file to
 * quarantine/ because memory ran out. */
static void body_oom_open(const char *dir)
{
    static const set_shape shape = {3, 2, 2, 2, 2, HAS_ALL};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    for (int i = 0; i < 20; i++) {  /* more than the first table's 16 slots */
        char name[16];
        snprintf(name, sizeof name, "set%02d", i);
        ASSERT_EQ(store_put(store, set_make(name, &shape, 100 + (uint64_t)i, 0, 0), NULL, &err), 0);
    }
    close_store(store);
    long n;
    for (n = 0; n < 10000; n++) {
        mem_fail_after(n);
        store = open_store(dir, &roomy, &err, NULL, 0);
        long failures = mem_failures();
        mem_fail_reset();
        long in_quarantine = count_entries(dir, "quarantine");
        long files = count_entries(dir, "set");
        size_t count = 0;
        if (store != NULL) {
            weight_set **list = NULL;
            if (store_list(store, &list, &count, &err) != 0)
                FAIL_AT("allocation %ld: store_list failed after a successful open", n);
            store_list_free(list, count);
        } else if (err.kind != ERR_UNAVAILABLE) {
            FAIL_AT("allocation %ld: store_open failed with %d (%s), expected out of memory", n,
                    err.kind, err.code);
        }
        close_store(store);
        if (in_quarantine != 0 || files != 20)
            FAIL_AT("allocation %ld failed: %ld of 20 files left, quarantine/ %s", n, files,
                    in_quarantine ? "created" : "absent");
        if (store != NULL && count != 20)
            FAIL_AT("allocation %ld failed: store_open succeeded with %zu of 20 sets", n, count);
        if (failures == 0)
            break;
    }
    if (n < 20)
        FAIL_AT("only %ld allocations: is failure injection reaching the store?", n);
    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    for (int i = 0; i < 20; i++) {
        char name[16];
        snprintf(name, sizeof name, "set%02d", i);
        weight_set *got = store_get(store, name);
        ASSERT_SET(got, name, &shape, 100 + (uint64_t)i, 0, 0);
        weightset_release(got);
    }
    close_store(store);
}

void test_store_open_out_of_memory(void)
{
    in_temp_dir(body_oom_open);
}

/*
 * test_store_sync.c - stores sharing one directory (store_sync.c): two stores, the
 * background sync, large sets written by two threads.
 * The helpers are store_fixture.c's.
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

/* ---- two stores on one directory ------------------------------------------ */

/* What one server writes, replaces and deletes, another sees after
 * store_sync; references held across the swap keep their numbers; the
 * generation grows with each write, whichever store wrote before. */
static void body_two_stores(const char *dir)
{
    static const set_shape shape = {3, 2, 2, 2, 2, HAS_ALL};
    attn_error err;
    weight_store *a = open_store(dir, &roomy, &err, NULL, 0);
    weight_store *b = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(a != NULL && b != NULL);
    weight_set *first = set_make("s", &shape, 1, 0, 0);
    weightset_retain(first);
    ASSERT_EQ(store_put(a, first, NULL, &err), 0);
    ASSERT(store_get(b, "s") == NULL);
    ASSERT_EQ(store_sync(b, &err), 0);
    weight_set *seen = store_get(b, "s");
    ASSERT_SET(seen, "s", &shape, 1, 0, 0);
    ASSERT_EQ(seen->generation, first->generation);
    /* B replaces it: a generation above A's, and A follows. */
    weight_set *second = set_make("s", &shape, 2, 0, 0);
    weightset_retain(second);
    ASSERT_EQ(store_put(b, second, NULL, &err), 0);
    ASSERT(second->generation > first->generation);
    ASSERT_EQ(store_sync(a, &err), 0);
    weight_set *now = store_get(a, "s");
    ASSERT_SET(now, "s", &shape, 2, 0, 0);
    ASSERT_EQ(now->generation, second->generation);
    weightset_release(now);
    /* The reference taken before the swap still holds the old numbers. */
    ASSERT_SET(seen, "s", &shape, 1, 0, 0);
    weightset_release(seen);
    /* A scan with nothing new changes nothing. */
    weight_set *before = store_get(a, "s");
    ASSERT_EQ(store_sync(a, &err), 0);
    now = store_get(a, "s");
    ASSERT(now == before);
    weightset_release(now);
    weightset_release(before);
    /* Deleted on A: gone from B after its scan. */
    ASSERT_EQ(store_delete(a, "s", &err), 0);
    ASSERT_EQ(store_sync(b, &err), 0);
    ASSERT(store_get(b, "s") == NULL);
    ASSERT_EQ(store_total_bytes(b), 0);
    /* A put over a set another store wrote but this one has not loaded is a
     * replacement, not a creation. */
    ASSERT_EQ(store_put(a, set_make("u", &shape, 5, 0, 0), NULL, &err), 0);
    int created = -1;
    ASSERT_EQ(store_put(b, set_make("u", &shape, 6, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 0);
    ASSERT_EQ(store_delete(b, "u", &err), 0);
    /* A delete of a set another store wrote but this one has not loaded. */
    ASSERT_EQ(store_put(a, set_make("t", &shape, 3, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_delete(b, "t", &err), 0);
    ASSERT_EQ(file_size(dir, "t.wset"), -1);
    weightset_release(first);
    weightset_release(second);
    close_store(a);
    close_store(b);
}

void test_store_two_stores_one_directory(void)
{
    in_temp_dir(body_two_stores);
}

/* The background sync picks up another store's write on its own, and the
 * status reports the scans. */
static void body_background_sync(const char *dir)
{
    static const set_shape shape = {3, 2, 2, 2, 2, 0};
    attn_error err;
    weight_store *a = open_store(dir, &roomy, &err, NULL, 0);
    weight_store *b = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(a != NULL && b != NULL);
    ASSERT_EQ(store_sync_start(b, 20, &err), 0);
    ASSERT_EQ(store_put(a, set_make("bg", &shape, 4, 0, 0), NULL, &err), 0);
    weight_set *got = NULL;
    for (int i = 0; i < 200 && got == NULL; i++) {
        struct timespec pause = {0, 10 * 1000000L};
        nanosleep(&pause, NULL);
        got = store_get(b, "bg");
    }
    ASSERT_SET(got, "bg", &shape, 4, 0, 0);
    weightset_release(got);
    store_status st;
    store_get_status(b, &st);
    ASSERT(st.syncs >= 1);
    ASSERT_EQ(st.sets, 1);
    ASSERT_EQ(st.interval_ms, 20);
    ASSERT(st.last_ok_age_ms >= 0 && st.last_ok_age_ms < 5000);
    close_store(a);
    close_store(b);
}

void test_store_background_sync(void)
{
    in_temp_dir(body_background_sync);
}

/* A set past 32 MiB is written by two threads (store_io.c): its file is what one writer would
 * write (size, and every number after a restart), and a fault in any of its chunks fails the
 * put with nothing left behind, then the put succeeds. */
static void body_large_two_writers(const char *dir)
{
    static const set_shape shape = {1536, 1536, 1536, 1536, 1536, HAS_ALL};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    size_t numbers = 0;
    for (int i = 0; i < 8; i++)
        numbers += array_len(&shape, i);
    size_t size = 96 + 8 + numbers * 4 + 8;
    ASSERT(size > ((size_t)32 << 20));
    /* steps: open, then chunks (the header, 2 per matrix, the biases, the checksum) */
    for (int n = 1; n <= 13; n += 4) {
        error_clear(&err);
        store_fail_io_after(n);
        int rc = store_put(store, set_make_f32("big", &shape, 5), NULL, &err);
        store_fail_io_after(-1);
        if (rc == 0 || count_entries(dir, ".tmp.") != 0 || file_size(dir, "big.wset") >= 0)
            FAIL_AT("a fault at step %d: put %d, %ld temporary files left", n, rc,
                    count_entries(dir, ".tmp."));
        weight_set *none = store_get(store, "big");
        ASSERT(none == NULL);
    }
    ASSERT_EQ(store_put(store, set_make_f32("big", &shape, 5), NULL, &err), 0);
    ASSERT_EQ(file_size(dir, "big.wset"), (long long)size);
    close_store(store);
    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    weight_set *got = store_get(store, "big");
    ASSERT(set_matches_f32(got, &shape, 5));
    weightset_release(got);
    close_store(store);
}

void test_store_large_two_writers(void)
{
    in_temp_dir(body_large_two_writers);
}

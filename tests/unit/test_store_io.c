/*
 * test_store_io.c - the store's file-system steps (store_io.c): temporary names and their
 * clean-up at start-up, and the nth step of a put or delete failing.
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

/* This host's name as the store writes it into temporary file names. */
static void my_host(char *out, size_t len)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t j = 0;
    for (size_t i = 0; host[i] && j + 1 < len; i++) {
        char c = host[i];
        out[j++] = (isalnum((unsigned char)c) || c == '-') ? c : '-';
    }
    out[j] = '\0';
}

/* A pid that no process has: the highest of a few tries that kill reports
 * as absent. */
static long dead_pid(void)
{
    for (long pid = 4000000; pid > 1000; pid -= 7919)
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            return pid;
    return -1;
}

static void body_tmp_leftovers(const char *dir)
{
    static const set_shape shape = {3, 3, 3, 3, 3, 0};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("a", &shape, 1, 0, 0), NULL, &err), 0);
    close_store(store);
    unsigned char *good;
    size_t len;
    ASSERT_EQ(read_file(dir, "a.wset", &good, &len), 0);
    char host[64], crashed1[128], crashed2[128], mine[128], live[128], other[128], old[128];
    my_host(host, sizeof host);
    long dead = dead_pid();
    ASSERT(dead > 0);
    snprintf(crashed1, sizeof crashed1, ".tmp.%s.%ld.1", host, dead);
    snprintf(crashed2, sizeof crashed2, ".tmp.%s.%ld.2", host, dead);
    snprintf(mine, sizeof mine, ".tmp.%s.%ld.3", host, (long)getpid());
    /* A live process on this host (our parent) and another host: writes in
     * progress of other servers sharing the directory. */
    snprintf(live, sizeof live, ".tmp.%s.%ld.4", host, (long)getppid());
    snprintf(other, sizeof other, ".tmp.elsewhere-7.%ld.5", (long)getpid());
    snprintf(old, sizeof old, ".tmp.elsewhere-8.%ld.6", (long)getpid());
    /* What a crash leaves: half a new version of a, a whole new set b that was
     * never renamed, and an empty file; and the others' files. */
    int ok = write_file(dir, crashed1, good, len / 2) == 0 &&
             write_file(dir, crashed2, good, len) == 0 && write_file(dir, mine, "", 0) == 0 &&
             write_file(dir, live, good, len / 3) == 0 && write_file(dir, other, good, len) == 0 &&
             write_file(dir, old, good, len) == 0;
    free(good);
    ASSERT(ok);
    /* The abandoned one is two hours old; the limit is one. */
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, old);
    struct timespec past[2];
    clock_gettime(CLOCK_REALTIME, &past[0]);
    past[0].tv_sec -= 7200;
    past[1] = past[0];
    ASSERT_EQ(utimensat(AT_FDCWD, path, past, 0), 0);
    ASSERT_EQ(count_entries(dir, ".tmp."), 6);
    store_limits limits = roomy;
    limits.temp_max_age_s = 3600;
    store = open_store(dir, &limits, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(count_entries(dir, ".tmp."), 2);
    ASSERT(file_size(dir, live) >= 0);
    ASSERT(file_size(dir, other) >= 0);
    ASSERT_EQ(count_entries(dir, "quarantine"), 0);
    weight_set *got = store_get(store, "a");
    ASSERT_SET(got, "a", &shape, 1, 0, 0);
    weightset_release(got);
    ASSERT(store_get(store, "b") == NULL);
    ASSERT(store_get(store, "c") == NULL);
    ASSERT_EQ(count_entries(dir, ""), 3);
    close_store(store);
    /* With no age limit, other servers' files are never removed. */
    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(count_entries(dir, ".tmp."), 2);
    close_store(store);
}

/* Temporary names carry host, pid and counter, and only such names parse. */
void test_store_tmp_names(void)
{
    char host[64];
    long pid = 0;
    ASSERT_EQ(store_tmp_name_parse(".tmp.web-1.42.7", host, sizeof host, &pid), 0);
    ASSERT_STR_EQ(host, "web-1");
    ASSERT_EQ(pid, 42);
    ASSERT_EQ(store_tmp_name_parse(".tmp.a.123.1", host, sizeof host, &pid), 0);
    ASSERT_EQ(store_tmp_name_parse(".tmp.web-1.42", host, sizeof host, &pid), -1);
    ASSERT_EQ(store_tmp_name_parse(".tmp.web-1.x.7", host, sizeof host, &pid), -1);
    ASSERT_EQ(store_tmp_name_parse(".tmp..42.7", host, sizeof host, &pid), -1);
    ASSERT_EQ(store_tmp_name_parse(".tmp.h.42.7.wset", host, sizeof host, &pid), -1);
    ASSERT_EQ(store_tmp_name_parse("a.wset", host, sizeof host, &pid), -1);
}

void test_store_removes_tmp_leftovers(void)
{
    in_temp_dir(body_tmp_leftovers);
}

/* ---- injected I/O faults ------------------------------------------------- */

/* Opens a second store on dir and checks that name holds the set made from
 * seed (or that there is no such set when seed is 0).  Returns 1 if so. */
static int on_disk(const char *dir, const char *name, const set_shape *shape, uint64_t seed,
                   size_t heads, int out_in, char *why, size_t why_len)
{
    attn_error err;
    weight_store *again = open_store(dir, &roomy, &err, NULL, 0);
    if (again == NULL) {
        snprintf(why, why_len, "reopen failed: %.200s", err.message);
        return 0;
    }
    weight_set *got = store_get(again, name);
    int ok;
    if (seed == 0) {
        ok = got == NULL;
        if (!ok)
            snprintf(why, why_len, "%s is on disk but should not be", name);
    } else {
        ok = set_matches(got, name, shape, seed, heads, out_in, why, why_len);
    }
    weightset_release(got);
    close_store(again);
    return ok;
}

/* Walks the fault through every step of putting name (new version: shape
 * `next`, seed 2) over the old version (shape `prev`, seed prev_seed; none
 * when prev_seed is 0).  Sets *steps to the number of steps that failed, or
 * -1 when the walk itself failed. */
static void walk_put_faults(const char *dir, const char *name, uint64_t prev_seed, long *steps)
{
    static const set_shape prev = {4, 4, 4, 4, 4, HAS_BQ}, next = {6, 5, 4, 2, 3, HAS_ALL};
    static const set_shape bystander = {2, 2, 2, 2, 2, 0};
    attn_error err;
    char why[256];
    *steps = -1;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("bystander", &bystander, 7, 0, 0), NULL, &err), 0);
    if (prev_seed != 0)
        ASSERT_EQ(store_put(store, set_make(name, &prev, prev_seed, 1, 0), NULL, &err), 0);
    size_t total = store_total_bytes(store);
    int n;
    for (n = 0; n < 100; n++) {
        weight_set *set = set_make(name, &next, 2, 2, 1);
        ASSERT(set != NULL);
        error_clear(&err);
        int created = -1;
        store_fail_io_after(n);
        int rc = store_put(store, set, &created, &err);
        store_fail_io_after(-1);
        if (rc == 0) {
            ASSERT_EQ(created, prev_seed == 0);
            break;
        }
        if (rc != ERR_INTERNAL && rc != ERR_UNAVAILABLE)
            FAIL_AT("step %d: store_put returned %d (%s)", n, rc, err.code);
        if (err.code[0] == '\0' || err.message[0] == '\0')
            FAIL_AT("step %d: the error is not filled in", n);
        if (count_entries(dir, ".tmp.") != 0)
            FAIL_AT("step %d: a .tmp file was left behind", n);
        weight_set *now = store_get(store, name);
        int old_in_memory = prev_seed ? set_matches(now, name, &prev, prev_seed, 1, 0, why, sizeof why)
                                      : now == NULL;
        int new_in_memory = set_matches(now, name, &next, 2, 2, 1, why, sizeof why);
        weightset_release(now);
        int old_on_disk = on_disk(dir, name, &prev, prev_seed, 1, 0, why, sizeof why);
        int new_on_disk = on_disk(dir, name, &next, 2, 2, 1, why, sizeof why);
        /* The one documented exception (store.h, store_put): when only the
         * final fsync of the directory fails, the file has been renamed into
         * place and the table follows it; the client is told to retry.  It is
         * the last step, so the next n succeeds. */
        int last_step_exception = new_in_memory && new_on_disk;
        if (!(old_in_memory && old_on_disk) && !last_step_exception)
            FAIL_AT("step %d (%s): the old version is not intact (memory %d, disk %d)", n,
                    err.message, old_in_memory, old_on_disk);
        if (last_step_exception) {
            /* Check that it was the last step indeed. */
            weight_set *again = set_make(name, &next, 2, 2, 1);
            store_fail_io_after(n + 1);
            rc = store_put(store, again, &created, &err);
            store_fail_io_after(-1);
            if (rc != 0)
                FAIL_AT("step %d: the new version is in place after a failure that was not at the "
                        "last step (%s)", n, err.message);
            n++;
            break;
        }
        if (store_total_bytes(store) != total)
            FAIL_AT("step %d: total_bytes changed from %zu to %zu", n, total,
                    store_total_bytes(store));
        weight_set *by = store_get(store, "bystander");
        int by_ok = set_matches(by, "bystander", &bystander, 7, 0, 0, why, sizeof why);
        weightset_release(by);
        if (!by_ok)
            FAIL_AT("step %d: %s", n, why);
    }
    /* open, a write for the header, each of 8 arrays and the checksum, fsync,
     * rename, directory fsync: 14 steps. */
    if (n < 5)
        FAIL_AT("only %d failing steps: is the fault injection reaching the store?", n);
    weight_set *now = store_get(store, name);
    ASSERT_SET(now, name, &next, 2, 2, 1);
    weightset_release(now);
    ASSERT_EQ(store_total_bytes(store), total - (prev_seed ? file_size_of(name, &prev) : 0) +
                                            file_size_of(name, &next));
    close_store(store);
    if (!on_disk(dir, name, &next, 2, 2, 1, why, sizeof why))
        FAIL_AT("after the successful put: %s", why);
    ASSERT_EQ(count_entries(dir, ".tmp."), 0);
    *steps = n;
}

static void body_put_faults(const char *dir)
{
    long replace_steps, create_steps;
    walk_put_faults(dir, "replaced", 1, &replace_steps);
    ASSERT(replace_steps > 0);
    walk_put_faults(dir, "created", 0, &create_steps);
    ASSERT(create_steps > 0);
    ASSERT_EQ(replace_steps, create_steps);
}

void test_store_put_io_faults(void)
{
    in_temp_dir(body_put_faults);
}

/* A delete that fails must leave memory and disk agreeing: either the set is
 * still served and still on disk (what store.h promises: "Nothing was
 * changed"), or it is gone from both. */
static void body_delete_faults(const char *dir)
{
    static const set_shape shape = {2, 2, 2, 2, 2, 0};
    attn_error err;
    char why[256];
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    for (int n = 0; n < 10; n++) {
        ASSERT_EQ(store_put(store, set_make("d", &shape, 3, 0, 0), NULL, &err), 0);
        error_clear(&err);
        store_fail_io_after(n);
        int rc = store_delete(store, "d", &err);
        store_fail_io_after(-1);
        if (rc == 0)
            break;
        ASSERT(rc == ERR_INTERNAL || rc == ERR_UNAVAILABLE);
        ASSERT(err.code[0] != '\0');
        weight_set *now = store_get(store, "d");
        int in_memory = now != NULL;
        weightset_release(now);
        int on_disk_still = file_size(dir, "d.wset") >= 0;
        if (in_memory != on_disk_still)
            FAIL_AT("fault at step %d of a delete (%s): the set is %s memory but %s disk", n,
                    err.message, in_memory ? "in" : "not in", on_disk_still ? "on" : "not on");
        if (on_disk_still && !on_disk(dir, "d", &shape, 3, 0, 0, why, sizeof why))
            FAIL_AT("step %d: %s", n, why);
    }
    close_store(store);
}

void test_store_delete_io_faults(void)
{
    in_temp_dir(body_delete_faults);
}

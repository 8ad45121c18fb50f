/*
 * test_store_quarantine.c - bad set files (store_quarantine.c): skipped at start-up,
 * quarantined only when the same damage stays.
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

/* ---- bad files at start-up ----------------------------------------------- */

/* Writes to dir/file a copy of the set file good (whose name field, at
 * offset 80, is 5 bytes long) with inner_name in that field, one byte flipped
 * at offset (none when offset < 0), and cut bytes cut from the end. */
static int write_damaged(const char *dir, const char *file, const unsigned char *good, size_t len,
                         const char *inner_name, long offset, size_t cut)
{
    unsigned char *copy = malloc(len);
    if (copy == NULL)
        return -1;
    memcpy(copy, good, len);
    memcpy(copy + 80, inner_name, 5);
    if (offset >= 0)
        copy[offset] ^= 0x40;
    int rc = write_file(dir, file, copy, len - cut);
    free(copy);
    return rc;
}

/* Returns 1 if dir/quarantine holds exactly one entry for file, of size size. */
static int quarantined(const char *dir, const char *file, long long size)
{
    char qdir[1024], prefix[256];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    snprintf(prefix, sizeof prefix, "%s.", file);
    DIR *d = opendir(qdir);
    if (d == NULL)
        return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && file_size(qdir, e->d_name) == size)
            found++;
    closedir(d);
    return found == 1;
}

/* Copies of model.wset, each with its own name inside (all 5 letters long, so the layout
 * is the same) and damaged in one way. */
static const struct damage {
    const char *file, *inner_name;
    long offset; /* byte to flip; -2: the middle one; -1: none */
    size_t cut;  /* bytes cut from the end */
} g_damages[] = {
    {"model.wset", "model", -2, 0}, /* a bit flipped in the middle of the numbers */
    {"magic.wset", "magic", 0, 0},  /* in the magic */
    {"dimen.wset", "dimen", 40, 0}, /* in a dimension */
    {"check.wset", "check", -3, 0}, /* in the checksum itself (last byte) */
    {"trunc.wset", "trunc", -1, 8}, /* the last 8 bytes cut */
    {"other.wset", "model", -1, 0}, /* a good file under the wrong name */
};
#define N_DAMAGES (sizeof g_damages / sizeof g_damages[0])
#define GARBAGE_LEN 1000

static const set_shape g_quarantine_shape = {6, 5, 4, 4, 3, HAS_ALL};

/* The file name longer than 64 the quarantine test writes. */
static void too_long_name(char *out, size_t cap)
{
    snprintf(out, cap, "%sX.wset", long_name);
}

/* Fills dir: two good sets, the damaged copies of a third (*model_len: its length),
 * garbage, a file shorter than a header, a name longer than 64, and files that are not
 * sets at all. */
static void quarantine_write_files(const char *dir, size_t *model_len)
{
    const set_shape *shape = &g_quarantine_shape;
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("good1", shape, 1, 2, 0), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("good2", shape, 2, 0, 1), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("model", shape, 3, 0, 0), NULL, &err), 0);
    close_store(store);

    unsigned char *model;
    size_t len;
    ASSERT_EQ(read_file(dir, "model.wset", &model, &len), 0);
    ASSERT_EQ(len, file_size_of("model", shape));
    *model_len = len;
    for (size_t i = 0; i < N_DAMAGES; i++) {
        long offset = g_damages[i].offset == -2   ? (long)(len / 2)
                      : g_damages[i].offset == -3 ? (long)len - 1
                                                  : g_damages[i].offset;
        ASSERT_EQ(write_damaged(dir, g_damages[i].file, model, len, g_damages[i].inner_name, offset,
                                g_damages[i].cut), 0);
    }
    free(model);
    unsigned char garbage[GARBAGE_LEN];
    uint64_t state = 42;
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (unsigned char)splitmix(&state);
    ASSERT_EQ(write_file(dir, "garbage.wset", garbage, sizeof garbage), 0);
    ASSERT_EQ(write_file(dir, "tiny.wset", "ATTNWSET", 8), 0);
    char too_long[100];
    too_long_name(too_long, sizeof too_long);
    ASSERT_EQ(write_file(dir, too_long, garbage, 100), 0);
    /* Files that are not sets at all are left alone. */
    ASSERT_EQ(write_file(dir, "README.txt", "notes", 5), 0);
    ASSERT_EQ(write_file(dir, ".wset", "x", 1), 0);
}

/* At start-up only the two good sets load; nothing is moved aside yet. */
static void quarantine_start_up_skips(const char *dir, weight_store *store, const char *log)
{
    const set_shape *shape = &g_quarantine_shape;
    attn_error err;
    ASSERT(strstr(log, "2 weight set(s) loaded") != NULL);
    weight_set *got = store_get(store, "good1");
    ASSERT_SET(got, "good1", shape, 1, 2, 0);
    weightset_release(got);
    got = store_get(store, "good2");
    ASSERT_SET(got, "good2", shape, 2, 0, 1);
    weightset_release(got);
    size_t count = 0;
    weight_set **list = NULL;
    ASSERT_EQ(store_list(store, &list, &count, &err), 0);
    store_list_free(list, count);
    ASSERT_EQ(count, 2);
    ASSERT_EQ(store_total_bytes(store), 2 * file_size_of("good1", shape));
    /* Start-up only skips and reports: a damaged file is moved aside when a
     * later scan finds it still damaged (here at once: quarantine_after_ms
     * is 0), so one that another server is replacing is left alone. */
    char qdir[1024];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    ASSERT(count_entries(qdir, "") <= 0);
    ASSERT_EQ(file_size(dir, "garbage.wset"), (long long)GARBAGE_LEN);
}

/* A scan moves every damaged file, intact, to quarantine/ and the log names each; the
 * files that are not sets stay. */
static void quarantine_scan_moves_damaged(const char *dir, weight_store *store, const char *log, size_t len)
{
    attn_error err;
    char qdir[1024];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    ASSERT_EQ(store_sync(store, &err), 0);
    for (size_t i = 0; i < N_DAMAGES; i++) {
        const char *file = g_damages[i].file;
        if (!quarantined(dir, file, (long long)(len - g_damages[i].cut)))
            FAIL_AT("%s was not moved to quarantine/ intact", file);
        if (file_size(dir, file) != -1)
            FAIL_AT("%s is still in the data directory", file);
        if (strstr(log, file) == NULL)
            FAIL_AT("the log does not name %s:\n%s", file, log);
    }
    ASSERT(strstr(log, "checksum") != NULL);
    ASSERT(strstr(log, "not a weight-set file") != NULL);
    ASSERT(strstr(log, "truncated") != NULL);
    ASSERT(strstr(log, "does not match") != NULL);
    char too_long[100];
    too_long_name(too_long, sizeof too_long);
    ASSERT(quarantined(dir, "garbage.wset", GARBAGE_LEN));
    ASSERT(quarantined(dir, "tiny.wset", 8));
    ASSERT(quarantined(dir, too_long, 100));
    ASSERT_EQ(file_size(dir, "README.txt"), 5);
    ASSERT_EQ(file_size(dir, ".wset"), 1);
    ASSERT_EQ(count_entries(qdir, ""), (long)N_DAMAGES + 3);
    ASSERT(store_get(store, "model") == NULL);
    ASSERT(store_get(store, "other") == NULL);
}

static void body_quarantine(const char *dir)
{
    const set_shape *shape = &g_quarantine_shape;
    attn_error err;
    size_t len = 0;
    quarantine_write_files(dir, &len);
    if (test_failed)
        return;

    char log[8192];
    weight_store *store = open_store(dir, &roomy, &err, log, sizeof log);
    ASSERT(store != NULL);
    quarantine_start_up_skips(dir, store, log);
    if (test_failed)
        return;
    quarantine_scan_moves_damaged(dir, store, log, len);
    if (test_failed)
        return;
    /* The name of a quarantined file can be stored again. */
    int created = -1;
    ASSERT_EQ(store_put(store, set_make("model", shape, 9, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 1);
    close_store(store);

    /* Opening again finds nothing new to complain about. */
    char qdir[1024];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    store = open_store(dir, &roomy, &err, log, sizeof log);
    ASSERT(store != NULL);
    ASSERT(strstr(log, "3 weight set(s) loaded") != NULL);
    ASSERT(strstr(log, "(0 skipped)") != NULL);
    ASSERT_EQ(count_entries(qdir, ""), (long)N_DAMAGES + 3);
    weight_set *got = store_get(store, "model");
    ASSERT_SET(got, "model", shape, 9, 0, 0);
    weightset_release(got);
    close_store(store);
}

void test_store_quarantines_bad_files(void)
{
    in_temp_dir(body_quarantine);
}

/* A damaged file is skipped and reported, but quarantined only once it has
 * stayed damaged for quarantine_after_ms; replaced by a good file in the
 * meantime, it loads and nothing is moved aside. */
static void body_damage_settles(const char *dir)
{
    static const set_shape shape = {3, 2, 2, 2, 2, 0};
    attn_error err;
    store_limits patient = roomy;
    patient.quarantine_after_ms = 300;
    weight_store *a = open_store(dir, &patient, &err, NULL, 0);
    ASSERT(a != NULL);
    ASSERT_EQ(store_put(a, set_make("d", &shape, 1, 0, 0), NULL, &err), 0);
    unsigned char *good;
    size_t len;
    ASSERT_EQ(read_file(dir, "d.wset", &good, &len), 0);
    int ok = write_file(dir, "e.wset", good, len / 2) == 0; /* torn, named e */
    ASSERT(ok);
    char qdir[1024];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    ASSERT_EQ(store_sync(a, &err), 0);
    ASSERT_EQ(store_sync(a, &err), 0);
    ASSERT(store_get(a, "e") == NULL);
    ASSERT(count_entries(qdir, "") <= 0);
    ASSERT_EQ(file_size(dir, "e.wset"), (long long)(len / 2));
    /* Becomes a good file (here: d's bytes under d's name) before the time. */
    ok = write_file(dir, "e.wset", good, len / 2 + 1) == 0; /* changed, still bad */
    ASSERT(ok);
    struct timespec pause = {0, 350 * 1000000L};
    nanosleep(&pause, NULL);
    ASSERT_EQ(store_sync(a, &err), 0);   /* a new identity: the clock starts again */
    ASSERT(count_entries(qdir, "") <= 0);
    nanosleep(&pause, NULL);
    ASSERT_EQ(store_sync(a, &err), 0);   /* unchanged and still bad: moved aside */
    ASSERT_EQ(count_entries(qdir, "e.wset"), 1);
    ASSERT_EQ(file_size(dir, "e.wset"), -1);
    weight_set *d = store_get(a, "d");
    ASSERT_SET(d, "d", &shape, 1, 0, 0);
    weightset_release(d);
    free(good);
    close_store(a);
}

void test_store_damage_quarantined_when_it_stays(void)
{
    in_temp_dir(body_damage_settles);
}

/*
 * test_store_table.c - the store's table (store_table.c): put, reopen, replace, delete,
 * references that outlive them, a deleted set's metrics series, the limits, allocation
 * failures and concurrent readers.
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
#include "metrics/metrics.h"
#include "store/store.h"
#include "store_fixture.h"
#include "test.h"
#include "core/test_hooks.h"

/* ---- put, reopen, replace, delete ---------------------------------------- */


static const struct stored_case {
    const char *name;
    set_shape shape;
    size_t heads;
    int out_in;
} stored_cases[] = {
    {"full", {5, 3, 4, 6, 7, HAS_ALL}, 2, 1},
    {"minimal", {1, 1, 1, 1, 1, 0}, 0, 0},
    {"wo-no-bo_bk.only", {3, 2, 2, 4, 1, HAS_WO | HAS_BK}, 0, 1},
    {"x", {8, 8, 8, 8, 8, HAS_BQ | HAS_BV}, 4, 0},
    {long_name, {2, 3, 6, 3, 2, HAS_WO | HAS_BO}, 3, 0},
};
#define STORED_CASES (sizeof stored_cases / sizeof stored_cases[0])

static void body_put_reopen(const char *dir)
{
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_total_bytes(store), 0);
    size_t total = 0;
    int64_t stored_at[STORED_CASES];
    for (size_t i = 0; i < STORED_CASES; i++) {
        const struct stored_case *c = &stored_cases[i];
        weight_set *set = set_make(c->name, &c->shape, 100 + i, c->heads, c->out_in);
        ASSERT(set != NULL);
        int created = -1;
        ASSERT_EQ(store_put(store, set, &created, &err), 0);
        ASSERT_EQ(created, 1);
        char file[100];
        snprintf(file, sizeof file, "%s.wset", c->name);
        size_t size = file_size_of(c->name, &c->shape);
        ASSERT_EQ(file_size(dir, file), size);
        total += size;
        ASSERT_EQ(store_total_bytes(store), total);
        weight_set *got = store_get(store, c->name);
        ASSERT_SET(got, c->name, &c->shape, 100 + i, c->heads, c->out_in);
        ASSERT_EQ(got->size_bytes, size);
        ASSERT(got->stored_at_ms > 1500000000000LL);
        stored_at[i] = got->stored_at_ms;
        weightset_release(got);
    }
    ASSERT_EQ(count_entries(dir, ".tmp."), 0);
    close_store(store);

    char log[4096];
    store = open_store(dir, &roomy, &err, log, sizeof log);
    ASSERT(store != NULL);
    ASSERT(strstr(log, "5 weight set(s) loaded") != NULL);
    ASSERT_EQ(store_total_bytes(store), total);
    for (size_t i = 0; i < STORED_CASES; i++) {
        const struct stored_case *c = &stored_cases[i];
        weight_set *got = store_get(store, c->name);
        ASSERT_SET(got, c->name, &c->shape, 100 + i, c->heads, c->out_in);
        ASSERT_EQ(got->stored_at_ms, stored_at[i]);
        ASSERT_EQ(got->size_bytes, file_size_of(c->name, &c->shape));
        weightset_release(got);
    }
    ASSERT(store_get(store, "nothing") == NULL);
    size_t count = 0;
    weight_set **list = NULL;
    ASSERT_EQ(store_list(store, &list, &count, &err), 0);
    ASSERT_EQ(count, STORED_CASES);
    for (size_t i = 1; i < count; i++)
        ASSERT(strcmp(list[i - 1]->name, list[i]->name) < 0);
    store_list_free(list, count);
    ASSERT_EQ(count_entries(dir, "quarantine"), 0);
    close_store(store);
}

void test_store_put_reopen_bit_exact(void)
{
    in_temp_dir(body_put_reopen);
}

static void body_replace(const char *dir)
{
    static const set_shape small = {2, 2, 2, 2, 2, 0}, big = {6, 4, 6, 3, 5, HAS_ALL};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    int created = -1;
    ASSERT_EQ(store_put(store, set_make("other", &small, 1, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 1);
    ASSERT_EQ(store_put(store, set_make("w", &small, 2, 1, 0), &created, &err), 0);
    ASSERT_EQ(created, 1);
    size_t other = file_size_of("other", &small);
    ASSERT_EQ(store_total_bytes(store), other + file_size_of("w", &small));
    created = -1;
    ASSERT_EQ(store_put(store, set_make("w", &big, 3, 3, 1), &created, &err), 0);
    ASSERT_EQ(created, 0);
    ASSERT_EQ(store_total_bytes(store), other + file_size_of("w", &big));
    ASSERT_EQ(file_size(dir, "w.wset"), file_size_of("w", &big));
    weight_set *got = store_get(store, "w");
    ASSERT_SET(got, "w", &big, 3, 3, 1);
    ASSERT_EQ(got->size_bytes, file_size_of("w", &big));
    weightset_release(got);
    /* And back to the small one: the total shrinks again. */
    ASSERT_EQ(store_put(store, set_make("w", &small, 4, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 0);
    ASSERT_EQ(store_total_bytes(store), other + file_size_of("w", &small));
    size_t count = 0;
    weight_set **list = NULL;
    ASSERT_EQ(store_list(store, &list, &count, &err), 0);
    ASSERT_EQ(count, 2);
    store_list_free(list, count);
    close_store(store);

    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    got = store_get(store, "w");
    ASSERT_SET(got, "w", &small, 4, 0, 0);
    weightset_release(got);
    ASSERT_EQ(store_total_bytes(store), other + file_size_of("w", &small));
    ASSERT_EQ(count_entries(dir, ""), 2);
    close_store(store);
}

void test_store_replace(void)
{
    in_temp_dir(body_replace);
}

static void body_delete(const char *dir)
{
    static const set_shape shape = {3, 3, 2, 2, 2, HAS_BQ};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("a", &shape, 1, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("b", &shape, 2, 0, 0), NULL, &err), 0);
    ASSERT_EQ(file_size(dir, "a.wset"), file_size_of("a", &shape));
    error_clear(&err);
    ASSERT_EQ(store_delete(store, "a", &err), 0);
    ASSERT(store_get(store, "a") == NULL);
    ASSERT_EQ(file_size(dir, "a.wset"), -1);
    ASSERT_EQ(store_total_bytes(store), file_size_of("b", &shape));
    error_clear(&err);
    ASSERT_EQ(store_delete(store, "a", &err), ERR_NOT_FOUND);
    ASSERT_EQ(error_http_status(err.kind), 404);
    ASSERT_STR_EQ(err.code, "unknown_weight_set");
    ASSERT_EQ(store_delete(store, "never-there", &err), ERR_NOT_FOUND);
    weight_set *b = store_get(store, "b");
    ASSERT_SET(b, "b", &shape, 2, 0, 0);
    weightset_release(b);
    close_store(store);

    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT(store_get(store, "a") == NULL);
    b = store_get(store, "b");
    ASSERT_SET(b, "b", &shape, 2, 0, 0);
    weightset_release(b);
    /* A name can be used again after its deletion, as a new set. */
    int created = -1;
    ASSERT_EQ(store_put(store, set_make("a", &shape, 3, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 1);
    ASSERT_EQ(store_delete(store, "a", &err), 0);
    ASSERT_EQ(store_delete(store, "b", &err), 0);
    ASSERT_EQ(store_total_bytes(store), 0);
    ASSERT_EQ(count_entries(dir, ""), 0);
    size_t count = 99;
    weight_set **list = NULL;
    ASSERT_EQ(store_list(store, &list, &count, &err), 0);
    ASSERT(list == NULL);
    ASSERT_EQ(count, 0);
    close_store(store);
}

void test_store_delete(void)
{
    in_temp_dir(body_delete);
}

/* A reference keeps its numbers through a replace, a delete and the close of
 * the store (run this under the sanitizer build to catch a use after free). */
static void body_reference(const char *dir)
{
    static const set_shape v1 = {4, 4, 4, 4, 4, HAS_ALL}, v2 = {2, 3, 2, 2, 1, HAS_WO};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("r", &v1, 11, 2, 1), NULL, &err), 0);
    weight_set *old = store_get(store, "r");
    ASSERT_SET(old, "r", &v1, 11, 2, 1);
    int created = -1;
    ASSERT_EQ(store_put(store, set_make("r", &v2, 12, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 0);
    ASSERT_SET(old, "r", &v1, 11, 2, 1);
    weight_set *second = store_get(store, "r");
    ASSERT_SET(second, "r", &v2, 12, 0, 0);
    ASSERT_EQ(store_delete(store, "r", &err), 0);
    ASSERT(store_get(store, "r") == NULL);
    ASSERT_SET(old, "r", &v1, 11, 2, 1);
    ASSERT_SET(second, "r", &v2, 12, 0, 0);
    /* A listed set too stays valid after the store is gone. */
    ASSERT_EQ(store_put(store, set_make("s", &v1, 13, 0, 0), NULL, &err), 0);
    size_t count = 0;
    weight_set **list = NULL;
    ASSERT_EQ(store_list(store, &list, &count, &err), 0);
    ASSERT_EQ(count, 1);
    close_store(store);
    ASSERT_SET(old, "r", &v1, 11, 2, 1);
    ASSERT_SET(second, "r", &v2, 12, 0, 0);
    ASSERT_SET(list[0], "s", &v1, 13, 0, 0);
    store_list_free(list, count);
    weightset_release(old);
    weightset_release(second);
    weightset_release(NULL);
}

void test_store_reference_outlives_replace_and_delete(void)
{
    in_temp_dir(body_reference);
}

/* Whether /metrics holds a series of the model name. */
static int metrics_has_model(const char *name)
{
    size_t len = 0;
    char *page = metrics_render(&len);
    char label[96];
    snprintf(label, sizeof label, "model=\"%s\"", name);
    int found = page != NULL && strstr(page, label) != NULL;
    mem_free(page);
    return found;
}

/* A deleted set's series of /metrics go when its last reference does: a
 * request still computing with it (a reference taken before the delete)
 * counts itself into the series, and only its release drops them; a set
 * made of the same name meanwhile keeps them. */
static void body_delete_releases_metrics(const char *dir)
{
    static const set_shape shape = {2, 2, 2, 2, 2, HAS_ALL};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("gone-m", &shape, 5, 0, 0), NULL, &err), 0);
    weight_set *running = store_get(store, "gone-m");
    ASSERT(running != NULL);
    metrics_attention_observe("gone-m", "http", 0, 0.001, 10);
    ASSERT(metrics_has_model("gone-m"));
    ASSERT_EQ(store_delete(store, "gone-m", &err), 0);
    ASSERT(metrics_has_model("gone-m"));    /* the request still holds the set */
    metrics_attention_observe("gone-m", "http", 0, 0.001, 10);
    weightset_release(running);
    ASSERT(!metrics_has_model("gone-m"));
    /* a set of the name made again gets its series again, and a replace keeps them */
    ASSERT_EQ(store_put(store, set_make("gone-m", &shape, 6, 0, 0), NULL, &err), 0);
    metrics_attention_observe("gone-m", "http", 0, 0.001, 10);
    ASSERT_EQ(store_put(store, set_make("gone-m", &shape, 7, 0, 0), NULL, &err), 0);
    ASSERT(metrics_has_model("gone-m"));
    ASSERT_EQ(store_delete(store, "gone-m", &err), 0);
    ASSERT(!metrics_has_model("gone-m"));
    close_store(store);
}

void test_store_delete_releases_metrics(void)
{
    in_temp_dir(body_delete_releases_metrics);
}

/* ---- limits -------------------------------------------------------------- */

static void body_limits(const char *dir)
{
    static const set_shape one = {4, 4, 4, 4, 4, 0};   /* 88 + 8 + 384 + 8 = 488 bytes */
    static const set_shape two = {8, 8, 8, 8, 8, 0};   /* 88 + 8 + 1536 + 8 = 1640 bytes */
    size_t small = file_size_of("a", &one), large = file_size_of("a", &two);
    ASSERT_EQ(small, 488);
    ASSERT_EQ(large, 1640);
    /* One set may take up to `large` bytes; all together three small ones. */
    store_limits limits = {large, 3 * small, 0, 0};
    attn_error err;
    weight_store *store = open_store(dir, &limits, &err, NULL, 0);
    ASSERT(store != NULL);
    error_clear(&err);
    ASSERT_EQ(store_put(store, set_make("big", &two, 1, 0, 0), NULL, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "store_full");  /* 1632 > 1440 in total */
    ASSERT_EQ(error_http_status(err.kind), 413);
    static const set_shape three = {8, 8, 8, 8, 8, HAS_BQ}; /* 64 bytes over `large` */
    error_clear(&err);
    ASSERT_EQ(store_put(store, set_make("bigger", &three, 1, 0, 0), NULL, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "weight_set_too_large");
    ASSERT_EQ(count_entries(dir, ""), 0);
    ASSERT_EQ(store_total_bytes(store), 0);
    ASSERT(store_get(store, "big") == NULL);
    ASSERT(store_get(store, "bigger") == NULL);

    /* Exactly at the total limit is allowed; one byte more is not. */
    ASSERT_EQ(store_put(store, set_make("a", &one, 1, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("b", &one, 2, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("c", &one, 3, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_total_bytes(store), 3 * small);
    static const set_shape tiny = {1, 1, 1, 1, 1, 0};
    error_clear(&err);
    ASSERT_EQ(store_put(store, set_make("d", &tiny, 4, 0, 0), NULL, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "store_full");
    ASSERT(store_get(store, "d") == NULL);
    ASSERT_EQ(file_size(dir, "d.wset"), -1);
    ASSERT_EQ(count_entries(dir, ".tmp."), 0);
    ASSERT_EQ(store_total_bytes(store), 3 * small);
    /* A replacement counts only the difference: same size fits, bigger not. */
    int created = -1;
    ASSERT_EQ(store_put(store, set_make("a", &one, 5, 0, 0), &created, &err), 0);
    ASSERT_EQ(created, 0);
    error_clear(&err);
    ASSERT_EQ(store_put(store, set_make("a", &two, 6, 0, 0), &created, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "store_full");
    weight_set *a = store_get(store, "a");
    ASSERT_SET(a, "a", &one, 5, 0, 0);
    weightset_release(a);
    /* After a delete there is room again. */
    ASSERT_EQ(store_delete(store, "b", &err), 0);
    ASSERT_EQ(store_put(store, set_make("d", &tiny, 4, 0, 0), NULL, &err), 0);
    ASSERT_EQ(count_entries(dir, ""), 3);
    close_store(store);

    /* Nothing that was refused reached the disk. */
    store = open_store(dir, &limits, &err, NULL, 0);
    ASSERT(store != NULL);
    a = store_get(store, "a");
    ASSERT_SET(a, "a", &one, 5, 0, 0);
    weightset_release(a);
    ASSERT(store_get(store, "big") == NULL);
    ASSERT(store_get(store, "bigger") == NULL);
    ASSERT(store_get(store, "b") == NULL);
    ASSERT_EQ(store_total_bytes(store), 2 * small + file_size_of("d", &tiny));
    close_store(store);
}

void test_store_limits(void)
{
    in_temp_dir(body_limits);
}

/* The exact-size boundary of a single set. */
static void body_set_limit_boundary(const char *dir)
{
    static const set_shape one = {4, 4, 4, 4, 4, 0};
    size_t size = file_size_of("a", &one);
    store_limits limits = {size, (size_t)1 << 20, 0, 0};
    attn_error err;
    weight_store *store = open_store(dir, &limits, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("a", &one, 1, 0, 0), NULL, &err), 0);
    limits.max_set_bytes = size - 1;
    close_store(store);
    store = open_store(dir, &limits, &err, NULL, 0);
    ASSERT(store != NULL);
    error_clear(&err);
    ASSERT_EQ(store_put(store, set_make("b", &one, 2, 0, 0), NULL, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "weight_set_too_large");
    ASSERT_EQ(file_size(dir, "b.wset"), -1);
    ASSERT_EQ(count_entries(dir, ".tmp."), 0);
    close_store(store);
}

void test_store_set_limit_boundary(void)
{
    in_temp_dir(body_set_limit_boundary);
}

/* ---- allocation failures ------------------------------------------------- */

static void body_oom_put(const char *dir)
{
    static const set_shape shape = {3, 3, 3, 3, 3, HAS_BV};
    attn_error err;
    char why[256];
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    /* weightset_new takes the arrays of w whether it succeeds or fails: on
     * failure it has freed them (a leak here shows under ASan and valgrind)
     * and w is empty. */
    attn_weights w;
    ASSERT_EQ(weights_make(&shape, 1, &w), 0);
    mem_fail_after(0);
    weight_set *none = weightset_new("w", &w, 0, 0);
    mem_fail_reset();
    ASSERT(none == NULL);
    ASSERT(w.wq == NULL && w.bv == NULL && w.d_in == 0);
    ASSERT_EQ(weights_make(&shape, 1, &w), 0);
    weight_set *set = weightset_new("w", &w, 0, 0);
    ASSERT(set != NULL);
    ASSERT(w.wq == NULL && w.bv == NULL);
    weightset_release(set);

    /* A new name (the table grows) and then a replacement, each with the nth
     * allocation failing. */
    const char *names[] = {"first", "first", "second"};
    uint64_t seeds[] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        long n;
        for (n = 0; n < 100; n++) {
            set = set_make(names[k], &shape, seeds[k], 0, 0);
            ASSERT(set != NULL);
            error_clear(&err);
            int created = -1;
            mem_fail_after(n);
            int rc = store_put(store, set, &created, &err);
            long failures = mem_failures();
            mem_fail_reset();
            if (rc == 0) {
                ASSERT_EQ(created, k != 1);
                break;
            }
            if (rc != ERR_UNAVAILABLE || failures == 0)
                FAIL_AT("%s, allocation %ld: rc %d (%s), %ld failures", names[k], n, rc, err.code,
                        failures);
            ASSERT_STR_EQ(err.code, "overloaded");
            ASSERT_EQ(count_entries(dir, ".tmp."), 0);
            weight_set *now = store_get(store, names[k]);
            int unchanged = k == 1 ? set_matches(now, "first", &shape, 1, 0, 0, why, sizeof why)
                                   : now == NULL;
            weightset_release(now);
            if (!unchanged)
                FAIL_AT("%s, allocation %ld: the store changed", names[k], n);
        }
        weight_set *now = store_get(store, names[k]);
        ASSERT_SET(now, names[k], &shape, seeds[k], 0, 0);
        weightset_release(now);
    }
    close_store(store);
}

void test_store_put_out_of_memory(void)
{
    in_temp_dir(body_oom_put);
}

/* ---- concurrency --------------------------------------------------------- */

/* Readers take references while the main thread replaces the set: every
 * version they see must be whole (all its numbers equal its version). */
typedef struct reader_state {
    weight_store *store;
    int stop;
    long seen, torn;
} reader_state;

static void *reader_main(void *arg)
{
    reader_state *st = arg;
    while (!__atomic_load_n(&st->stop, __ATOMIC_SEQ_CST)) {
        weight_set *set = store_get(st->store, "c");
        if (set == NULL)
            continue;
        const attn_weights *w = &set->w;
        double v = w->wq[0];
        int whole = w->d_in == 2 + (size_t)v % 7 && w->dv == w->d_in;
        for (size_t i = 0; i < w->d_in * w->dk; i++)
            whole &= w->wq[i] == v;
        for (size_t i = 0; i < w->d_ctx * w->dv; i++)
            whole &= w->wv[i] == v;
        weightset_release(set);
        __atomic_add_fetch(&st->seen, 1, __ATOMIC_SEQ_CST);
        if (!whole)
            __atomic_add_fetch(&st->torn, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static weight_set *constant_set(size_t version)
{
    size_t d = 2 + version % 7;
    attn_weights w;
    memset(&w, 0, sizeof w);
    w.d_in = w.d_ctx = w.dk = w.dv = w.d_out = d;
    w.wq = mem_malloc(d * d * sizeof(double));
    w.wk = mem_malloc(d * d * sizeof(double));
    w.wv = mem_malloc(d * d * sizeof(double));
    for (size_t i = 0; i < d * d; i++)
        w.wq[i] = w.wk[i] = w.wv[i] = (double)version;
    return weightset_new("c", &w, 0, 0);
}

static void body_concurrent(const char *dir)
{
    attn_error err;
    reader_state st = {0};
    st.store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(st.store != NULL);
    pthread_t readers[3];
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(pthread_create(&readers[i], NULL, reader_main, &st), 0);
    int failed_puts = 0;
    for (size_t version = 1; version <= 40; version++) {
        weight_set *set = constant_set(version);
        if (store_put(st.store, set, NULL, &err) != 0)
            failed_puts++;
        if (version % 10 == 0 && store_delete(st.store, "c", &err) != 0)
            failed_puts++;
    }
    __atomic_store_n(&st.stop, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 3; i++)
        pthread_join(readers[i], NULL);
    close_store(st.store);
    ASSERT_EQ(failed_puts, 0);
    ASSERT_EQ(st.torn, 0);
    ASSERT(st.seen > 0);
}

void test_store_concurrent_readers(void)
{
    in_temp_dir(body_concurrent);
}

/* Out of memory while listing is an error, never an empty list: with two
 * sets stored, each allocation store_list makes fails in turn. */
static void body_list_out_of_memory(const char *dir)
{
    static const set_shape shape = {2, 2, 2, 2, 2, 0};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("a", &shape, 1, 0, 0), NULL, &err), 0);
    ASSERT_EQ(store_put(store, set_make("b", &shape, 2, 0, 0), NULL, &err), 0);
    long n;
    for (n = 0; n < 100; n++) {
        weight_set **list = (weight_set **)&err; /* anything but NULL */
        size_t count = 99;
        error_clear(&err);
        mem_fail_after(n);
        int rc = store_list(store, &list, &count, &err);
        long failures = mem_failures();
        mem_fail_reset();
        if (failures == 0) {
            ASSERT_EQ(rc, 0);
            ASSERT_EQ(count, 2);
            ASSERT_STR_EQ(list[0]->name, "a");
            store_list_free(list, count);
            break;
        }
        ASSERT_EQ(rc, ERR_UNAVAILABLE);
        ASSERT_STR_EQ(err.code, "overloaded");
        ASSERT(list == NULL);
        ASSERT_EQ(count, 0);
    }
    if (n < 1)
        FAIL_AT("store_list made no allocation: is failure injection reaching it?");
    /* The sets hold no reference left over from a failed list: each is
     * freed by its delete (a leak would show under ASan and valgrind). */
    ASSERT_EQ(store_delete(store, "a", &err), 0);
    ASSERT_EQ(store_delete(store, "b", &err), 0);
    close_store(store);
}

void test_store_list_out_of_memory(void)
{
    in_temp_dir(body_list_out_of_memory);
}

/*
 * test_store.c - the weight-set store: files, durability, reference counts.
 *
 * Every test runs in a fresh mkdtemp directory under /tmp that is removed at
 * the end, whatever happened.  Sets are filled from a seed, so a test can make
 * the numbers it expects a second time and compare every double bit for bit
 * (memcmp, so -0.0, subnormals and DBL_MAX count as well).  The store's
 * start-up messages go to stderr; the tests capture them in a temporary file
 * so that the output stays readable and so that they can check what was said.
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
#include "test.h"
#include "core/test_hooks.h"

/* Limits far above anything these tests store. */
static const store_limits roomy = {(size_t)1 << 30, (size_t)1 << 31, 0, 0};

/* ---- making and checking sets ------------------------------------------ */

/* Which arrays a set has, in the store's order, and its dimensions. */
enum { HAS_WO = 1u << 3, HAS_BQ = 1u << 4, HAS_BK = 1u << 5, HAS_BV = 1u << 6, HAS_BO = 1u << 7 };
#define HAS_ALL (HAS_WO | HAS_BQ | HAS_BK | HAS_BV | HAS_BO)

typedef struct set_shape {
    size_t d_in, d_ctx, dk, dv, d_out; /* d_out is ignored (= dv) without wo */
    unsigned optional;                 /* HAS_* bits */
} set_shape;

static uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Any finite double, with the awkward ones (signed zero, subnormals, the
 * extremes) much more often than chance would give. */
static double awkward_double(uint64_t *state)
{
    static const double special[] = {-0.0, 0.0, DBL_TRUE_MIN, -DBL_TRUE_MIN, DBL_MIN / 3,
                                     DBL_MAX, -DBL_MAX, DBL_MIN, 1.0, -1.0, 0.1, 1e-300};
    uint64_t r = splitmix(state);
    if (r % 8 == 0)
        return special[(r >> 8) % (sizeof special / sizeof special[0])];
    uint64_t bits = splitmix(state);
    if (((bits >> 52) & 0x7FF) == 0x7FF)
        bits &= ~(1ull << 62); /* Inf or NaN: make it an ordinary large number */
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static size_t array_len(const set_shape *s, int i)
{
    size_t d_out = (s->optional & HAS_WO) ? s->d_out : s->dv;
    switch (i) {
    case 0: return s->d_in * s->dk;
    case 1: return s->d_ctx * s->dk;
    case 2: return s->d_ctx * s->dv;
    case 3: return s->dv * d_out;
    case 4: case 5: return s->dk;
    case 6: return s->dv;
    default: return d_out;
    }
}

static int array_present(const set_shape *s, int i)
{
    return i < 3 || (s->optional & (1u << i)) != 0;
}

/* Fills w with arrays of shape s made from seed (mem_malloc'ed, as the store
 * expects).  Returns 0, or -1 when memory runs out (w then empty). */
static int weights_make(const set_shape *s, uint64_t seed, attn_weights *w)
{
    memset(w, 0, sizeof *w);
    w->d_in = s->d_in;
    w->d_ctx = s->d_ctx;
    w->dk = s->dk;
    w->dv = s->dv;
    w->d_out = (s->optional & HAS_WO) ? s->d_out : s->dv;
    uint64_t state = seed;
    for (int i = 0; i < 8; i++) {
        if (!array_present(s, i))
            continue;
        size_t n = array_len(s, i);
        double *a = mem_malloc(n * sizeof *a);
        if (a == NULL) {
            weights_free(w);
            return -1;
        }
        for (size_t j = 0; j < n; j++)
            a[j] = awkward_double(&state);
        *weights_slot(w, (weights_part)i) = a;
    }
    return 0;
}

/* A new set named name with the numbers of seed; NULL only when out of memory. */
static weight_set *set_make(const char *name, const set_shape *s, uint64_t seed, size_t heads,
                            int out_in)
{
    attn_weights w;
    if (weights_make(s, seed, &w) != 0)
        return NULL;
    return weightset_new(name, &w, heads, out_in);
}

/* Bytes of the file of a set named name with shape s (the format in store_format.c). */
static size_t file_size_of(const char *name, const set_shape *s)
{
    size_t size = 88 + ((strlen(name) + 7) & ~(size_t)7) + 8;
    for (int i = 0; i < 8; i++)
        if (array_present(s, i))
            size += array_len(s, i) * sizeof(double);
    return size;
}

/* Returns 1 if set holds exactly (every bit) the set made from s, seed,
 * heads and out_in under name; otherwise 0 with the first difference in why. */
static int set_matches(const weight_set *set, const char *name, const set_shape *s, uint64_t seed,
                       size_t heads, int out_in, char *why, size_t why_len)
{
    if (set == NULL) {
        snprintf(why, why_len, "set %s is missing", name);
        return 0;
    }
    attn_weights want;
    if (weights_make(s, seed, &want) != 0) {
        snprintf(why, why_len, "out of memory in the test");
        return 0;
    }
    int ok = 0;
    const attn_weights *got = &set->w;
    if (strcmp(set->name, name) != 0) {
        snprintf(why, why_len, "name %s, expected %s", set->name, name);
    } else if (set->heads != heads || set->out_in != out_in) {
        snprintf(why, why_len, "%s: heads %zu out_in %d, expected %zu and %d", name, set->heads,
                 set->out_in, heads, out_in);
    } else if (got->d_in != want.d_in || got->d_ctx != want.d_ctx || got->dk != want.dk ||
               got->dv != want.dv || got->d_out != want.d_out) {
        snprintf(why, why_len, "%s: dimensions %zu %zu %zu %zu %zu, expected %zu %zu %zu %zu %zu",
                 name, got->d_in, got->d_ctx, got->dk, got->dv, got->d_out, want.d_in, want.d_ctx,
                 want.dk, want.dv, want.d_out);
    } else {
        ok = 1;
        for (int i = 0; i < WEIGHTS_COUNT && ok; i++) {
            const double *a = weights_array(got, (weights_part)i);
            const double *b = weights_array(&want, (weights_part)i);
            if ((a == NULL) != (b == NULL)) {
                snprintf(why, why_len, "%s: array %d is %s", name, i, a ? "extra" : "missing");
                ok = 0;
            } else if (a != NULL && memcmp(a, b, array_len(s, i) * sizeof(double)) != 0) {
                snprintf(why, why_len, "%s: array %d differs in its bits", name, i);
                ok = 0;
            }
        }
    }
    weights_free(&want);
    return ok;
}

/* ASSERT-style check of set_matches. */
#define ASSERT_SET(set, name, shape, seed, heads, out_in)                                 \
    do {                                                                                    \
        char why_[256];                                                                     \
        if (!set_matches((set), (name), (shape), (seed), (heads), (out_in), why_, sizeof why_)) \
            FAIL_AT("%s", why_);                                                            \
    } while (0)

/* ---- the directory ------------------------------------------------------- */

/* Removes dir and everything in it (two levels are all the store makes, but
 * this goes as deep as it must). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char path[2048];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(path);
            else
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Number of entries of dir whose names start with prefix ("" for all); -1
 * when dir does not exist. */
static long count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            !strncmp(e->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

/* Size of dir/file, or -1 when it does not exist. */
static long long file_size(const char *dir, const char *file)
{
    char path[2048];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int read_file(const char *dir, const char *file, unsigned char **data, size_t *len)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(*data, 1, n > 0 ? (size_t)n : 0, f);
    fclose(f);
    return *len == (size_t)n ? 0 : -1;
}

static int write_file(const char *dir, const char *file, const void *data, size_t len)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t done = fwrite(data, 1, len, f);
    return fclose(f) == 0 && done == len ? 0 : -1;
}

/* Stores a test opened and has not closed yet: in_temp_dir closes them when
 * a failed assert returned early, so that a failure is not also a leak. */
static weight_store *open_stores[8];

static void track_store(weight_store *store, int open)
{
    for (size_t i = 0; i < sizeof open_stores / sizeof open_stores[0]; i++) {
        if (open && open_stores[i] == NULL) {
            open_stores[i] = store;
            return;
        }
        if (!open && open_stores[i] == store) {
            open_stores[i] = NULL;
            return;
        }
    }
}

static void close_store(weight_store *store)
{
    if (store != NULL)
        track_store(store, 0);
    store_close(store);
}

/* Opens the store at dir with its stderr messages captured into log (when
 * log is not NULL; they are dropped otherwise).  Close with close_store. */
static weight_store *open_store(const char *dir, const store_limits *limits, attn_error *err,
                                char *log, size_t log_len)
{
    FILE *capture = tmpfile();
    int saved = dup(STDERR_FILENO);
    fflush(stderr);
    if (capture != NULL && saved >= 0)
        dup2(fileno(capture), STDERR_FILENO);
    error_clear(err);
    weight_store *store = store_open(dir, limits, err);
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, STDERR_FILENO);
        close(saved);
    }
    if (log != NULL) {
        log[0] = '\0';
        if (capture != NULL) {
            rewind(capture);
            size_t n = fread(log, 1, log_len - 1, capture);
            log[n] = '\0';
        }
    }
    if (capture != NULL)
        fclose(capture);
    if (store != NULL)
        track_store(store, 1);
    return store;
}

/* Runs body in a fresh temporary directory and removes the directory after,
 * also when body failed; failure injection is turned off either way. */
static void in_temp_dir(void (*body)(const char *dir))
{
    char dir[] = "/tmp/attn-store-test-XXXXXX";
    if (mkdtemp(dir) == NULL)
        FAIL_AT("mkdtemp: %s", strerror(errno));
    body(dir);
    store_fail_io_after(-1);
    mem_fail_reset();
    for (size_t i = 0; i < sizeof open_stores / sizeof open_stores[0]; i++)
        close_store(open_stores[i]);
    remove_tree(dir);
}

/* ---- put, reopen, replace, delete ---------------------------------------- */

static const char long_name[] = "L234567890123456789012345678901234567890123456789012345678901234";

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

/* Flipping bit 0, 3 or 6 of any byte of a small set file is caught: no such
 * file is ever loaded, and each is moved aside. */
static void body_every_flip(const char *dir)
{
    static const set_shape shape = {2, 1, 2, 1, 1, HAS_BQ};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("f", &shape, 5, 0, 0), NULL, &err), 0);
    close_store(store);
    unsigned char *good;
    size_t len;
    ASSERT_EQ(read_file(dir, "f.wset", &good, &len), 0);
    for (size_t offset = 0; offset < len; offset++) {
        for (int bit = 0; bit < 8; bit += 3) {
            good[offset] ^= (unsigned char)(1u << bit);
            int written = write_file(dir, "f.wset", good, len);
            good[offset] ^= (unsigned char)(1u << bit);
            if (written != 0) {
                free(good);
                FAIL_AT("cannot write f.wset");
            }
            store = open_store(dir, &roomy, &err, NULL, 0);
            weight_set *got = store ? store_get(store, "f") : NULL;
            if (store != NULL)
                store_sync(store, &err); /* still damaged: moved aside */
            close_store(store);
            if (got != NULL) {
                weightset_release(got);
                free(good);
                FAIL_AT("a file with bit %d of byte %zu flipped was loaded", bit, offset);
            }
            if (file_size(dir, "f.wset") != -1) {
                free(good);
                FAIL_AT("the damaged file (byte %zu) was not moved aside", offset);
            }
        }
    }
    free(good);
}

void test_store_every_byte_flip_is_rejected(void)
{
    in_temp_dir(body_every_flip);
}

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

/* ---- float32 sets and the version-3 format ------------------------------- */

/* Any finite float, the awkward ones (signed zero, subnormals, the extremes)
 * often. */
static float awkward_float(uint64_t *state)
{
    static const float special[] = {-0.0f, 0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN / 3,
                                    FLT_MAX, -FLT_MAX, FLT_MIN, 1.0f, -1.0f, 0.1f, 1e-30f};
    uint64_t r = splitmix(state);
    if (r % 8 == 0)
        return special[(r >> 8) % (sizeof special / sizeof special[0])];
    uint32_t bits = (uint32_t)splitmix(state);
    if (((bits >> 23) & 0xFF) == 0xFF)
        bits &= ~(1u << 30); /* Inf or NaN: make it an ordinary large number */
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* A new float32 set of shape s from seed; NULL only when out of memory. */
static weight_set *set_make_f32(const char *name, const set_shape *s, uint64_t seed)
{
    attn_weights w;
    memset(&w, 0, sizeof w);
    w.elem = WEIGHTS_F32;
    w.d_in = s->d_in;
    w.d_ctx = s->d_ctx;
    w.dk = s->dk;
    w.dv = s->dv;
    w.d_out = (s->optional & HAS_WO) ? s->d_out : s->dv;
    uint64_t state = seed;
    for (int i = 0; i < 8; i++) {
        if (!array_present(s, i))
            continue;
        float *a = weights_part_alloc(&w, (weights_part)i);
        if (a == NULL) {
            weights_free(&w);
            return NULL;
        }
        for (size_t j = 0; j < array_len(s, i); j++)
            a[j] = awkward_float(&state);
    }
    return weightset_new(name, &w, 0, 0);
}

/* 1 when set is the float32 set set_make_f32 makes from s and seed, bit for bit. */
static int set_matches_f32(const weight_set *set, const set_shape *s, uint64_t seed)
{
    weight_set *want = set_make_f32("want", s, seed);
    int ok = set != NULL && want != NULL && weights_is_f32(&set->w) &&
             set->w.d_in == want->w.d_in && set->w.d_out == want->w.d_out;
    for (int i = 0; ok && i < WEIGHTS_COUNT; i++) {
        const float *a = weights_array_f32(&set->w, (weights_part)i);
        const float *b = weights_array_f32(&want->w, (weights_part)i);
        ok = (a == NULL) == (b == NULL) && weights_array(&set->w, (weights_part)i) == NULL &&
             (a == NULL || memcmp(a, b, array_len(s, i) * sizeof(float)) == 0);
    }
    weightset_release(want);
    return ok;
}

/* The format's checksum (store_format.c), for files the tests make. */
static uint64_t test_checksum(const unsigned char *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        h ^= word;
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    while (n-- > 0) {
        h ^= *p++;
        h *= 0x100000001B3ull;
    }
    return h;
}

/* Sets the last 8 bytes of a file's bytes to the checksum of the others. */
static void reseal(unsigned char *file, size_t len)
{
    uint64_t h = test_checksum(file, len - 8);
    memcpy(file + len - 8, &h, 8);
}

static uint32_t file_u32(const unsigned char *file, size_t at)
{
    uint32_t v;
    memcpy(&v, file + at, 4);
    return v;
}

static void body_float32_round_trip(const char *dir)
{
    static const set_shape shape = {5, 3, 4, 6, 7, HAS_ALL};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make_f32("f32", &shape, 41), NULL, &err), 0);
    /* 96 bytes of header, the name padded to 8, 4 bytes a number, the checksum */
    size_t numbers = 0;
    for (int i = 0; i < 8; i++)
        numbers += array_len(&shape, i);
    size_t size = 96 + 8 + numbers * 4 + 8;
    ASSERT_EQ(file_size(dir, "f32.wset"), (long long)size);
    ASSERT_EQ(store_total_bytes(store), size);
    weight_set *got = store_get(store, "f32");
    ASSERT(set_matches_f32(got, &shape, 41));
    ASSERT_EQ(got->size_bytes, size);
    weightset_release(got);
    close_store(store);
    unsigned char *file;
    size_t len;
    ASSERT_EQ(read_file(dir, "f32.wset", &file, &len), 0);
    ASSERT_EQ(file_u32(file, 8), 3);       /* version 3 */
    ASSERT_EQ(file_u32(file, 88), 1);      /* float32 */
    free(file);
    /* and from the file, after a restart */
    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    got = store_get(store, "f32");
    ASSERT(set_matches_f32(got, &shape, 41));
    ASSERT_STR_EQ(weights_elem_name(&got->w), "float32");
    weightset_release(got);
    close_store(store);
}

void test_store_float32_round_trip(void)
{
    in_temp_dir(body_float32_round_trip);
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

/* A float64 set is still written as version 2 (what servers of earlier
 * releases read), and a version-2 file loads as a float64 set. */
static void body_version2_loads(const char *dir)
{
    static const set_shape shape = {3, 2, 2, 4, 1, HAS_WO | HAS_BK};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make("d", &shape, 7, 2, 1), NULL, &err), 0);
    close_store(store);
    unsigned char *file;
    size_t len;
    ASSERT_EQ(read_file(dir, "d.wset", &file, &len), 0);
    ASSERT_EQ(file_u32(file, 8), 2);
    ASSERT_EQ(len, file_size_of("d", &shape));
    free(file);
    store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    weight_set *got = store_get(store, "d");
    ASSERT_SET(got, "d", &shape, 7, 2, 1);
    ASSERT(got != NULL && !weights_is_f32(&got->w));
    weightset_release(got);
    close_store(store);
}

void test_store_version2_file_loads(void)
{
    in_temp_dir(body_version2_loads);
}

/* Writes file (len bytes, a copy of which is changed by change) as f.wset,
 * opens a store on dir and syncs once.  Returns 1 when the set f loaded;
 * the log of the opening goes to log. */
static int load_changed(const char *dir, const unsigned char *good, size_t len,
                        void (*change)(unsigned char *file, size_t len, size_t arg), size_t arg,
                        char *log, size_t log_len)
{
    unsigned char *copy = malloc(len);
    if (copy == NULL)
        return -1;
    memcpy(copy, good, len);
    change(copy, len, arg);
    int written = write_file(dir, "f.wset", copy, len);
    free(copy);
    if (written != 0)
        return -1;
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, log, log_len);
    weight_set *got = store ? store_get(store, "f") : NULL;
    if (store != NULL)
        store_sync(store, &err);
    close_store(store);
    weightset_release(got);
    return got != NULL;
}

static void flip_byte(unsigned char *file, size_t len, size_t arg)
{
    (void)len;
    file[arg / 8] ^= (unsigned char)(1u << (arg % 8));
}

static void set_elem_2(unsigned char *file, size_t len, size_t arg)
{
    (void)arg;
    file[88] = 2;   /* neither float64 nor float32 */
    reseal(file, len);
}

static void set_version(unsigned char *file, size_t len, size_t version)
{
    uint32_t v = (uint32_t)version;
    memcpy(file + 8, &v, 4);
    reseal(file, len);
}

static void set_version_unsealed(unsigned char *file, size_t len, size_t version)
{
    (void)len;
    uint32_t v = (uint32_t)version;
    memcpy(file + 8, &v, 4);
}

/* Every flipped bit (0, 3 and 6 of each byte) of a version-3 file is caught
 * and the file moved aside; so is an element type that is neither, with a
 * checksum that matches.  A file of a later version whose checksum matches
 * is not loaded but left where it is: another server's, not damage. */
static void body_float32_damage(const char *dir)
{
    static const set_shape shape = {2, 1, 2, 1, 1, HAS_BQ};
    attn_error err;
    weight_store *store = open_store(dir, &roomy, &err, NULL, 0);
    ASSERT(store != NULL);
    ASSERT_EQ(store_put(store, set_make_f32("f", &shape, 5), NULL, &err), 0);
    close_store(store);
    unsigned char *good;
    size_t len;
    ASSERT_EQ(read_file(dir, "f.wset", &good, &len), 0);
    char log[4096];
    for (size_t offset = 0; offset < len; offset++)
        for (int bit = 0; bit < 8; bit += 3) {
            int loaded = load_changed(dir, good, len, flip_byte, offset * 8 + (size_t)bit, NULL, 0);
            if (loaded != 0 || file_size(dir, "f.wset") != -1) {
                free(good);
                FAIL_AT("bit %d of byte %zu flipped: %s", bit, offset,
                        loaded ? "loaded" : "not moved aside");
            }
        }
    int loaded = load_changed(dir, good, len, set_elem_2, 0, log, sizeof log);
    ASSERT_EQ(loaded, 0);
    ASSERT(strstr(log, "out of range") != NULL);
    ASSERT_EQ(file_size(dir, "f.wset"), -1);
    loaded = load_changed(dir, good, len, set_version, 4, log, sizeof log);
    ASSERT_EQ(loaded, 0);
    ASSERT(strstr(log, "newer server") != NULL);
    ASSERT_EQ(file_size(dir, "f.wset"), (long long)len);
    /* the same version with a checksum that does not match is damage */
    loaded = load_changed(dir, good, len, set_version_unsealed, 4, log, sizeof log);
    free(good);
    ASSERT_EQ(loaded, 0);
    ASSERT(strstr(log, "does not match") != NULL);
    ASSERT_EQ(file_size(dir, "f.wset"), -1);
}

void test_store_float32_damage_refused(void)
{
    in_temp_dir(body_float32_damage);
}

/*
 * store_fixture.c - the helpers of the store's unit tests (store_fixture.h).
 *
 * Every test runs in a fresh mkdtemp directory under /tmp that is removed at
 * the end, whatever happened.  Sets are filled from a seed, so a test can make
 * the numbers it expects a second time and compare every double bit for bit
 * (memcmp, so -0.0, subnormals and DBL_MAX count as well).  The store's
 * start-up messages go to stderr; the tests capture them in a temporary file
 * so that the output stays readable and so that they can check what was said.
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

const store_limits roomy = {(size_t)1 << 30, (size_t)1 << 31, 0, 0};

const char long_name[] = "L234567890123456789012345678901234567890123456789012345678901234";

/* ---- making and checking sets ------------------------------------------ */


uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Any finite double, with the awkward ones (signed zero, subnormals, the
 * extremes) much more often than chance would give. */
double awkward_double(uint64_t *state)
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

size_t array_len(const set_shape *s, int i)
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

int array_present(const set_shape *s, int i)
{
    return i < 3 || (s->optional & (1u << i)) != 0;
}

/* Fills w with arrays of shape s made from seed (mem_malloc'ed, as the store
 * expects).  Returns 0, or -1 when memory runs out (w then empty). */
int weights_make(const set_shape *s, uint64_t seed, attn_weights *w)
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
weight_set *set_make(const char *name, const set_shape *s, uint64_t seed, size_t heads,
                            int out_in)
{
    attn_weights w;
    if (weights_make(s, seed, &w) != 0)
        return NULL;
    return weightset_new(name, &w, heads, out_in);
}

/* Bytes of the file of a set named name with shape s (the format in store_format.c). */
size_t file_size_of(const char *name, const set_shape *s)
{
    size_t size = 88 + ((strlen(name) + 7) & ~(size_t)7) + 8;
    for (int i = 0; i < 8; i++)
        if (array_present(s, i))
            size += array_len(s, i) * sizeof(double);
    return size;
}

/* Returns 1 if set holds exactly (every bit) the set made from s, seed,
 * heads and out_in under name; otherwise 0 with the first difference in why. */
int set_matches(const weight_set *set, const char *name, const set_shape *s, uint64_t seed,
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


/* ---- the directory ------------------------------------------------------- */

/* Removes dir and everything in it (two levels are all the store makes, but
 * this goes as deep as it must). */
void remove_tree(const char *dir)
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
long count_entries(const char *dir, const char *prefix)
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
long long file_size(const char *dir, const char *file)
{
    char path[2048];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

int read_file(const char *dir, const char *file, unsigned char **data, size_t *len)
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

int write_file(const char *dir, const char *file, const void *data, size_t len)
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

void close_store(weight_store *store)
{
    if (store != NULL)
        track_store(store, 0);
    store_close(store);
}

/* Opens the store at dir with its stderr messages captured into log (when
 * log is not NULL; they are dropped otherwise).  Close with close_store. */
weight_store *open_store(const char *dir, const store_limits *limits, attn_error *err,
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
void in_temp_dir(void (*body)(const char *dir))
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

/* Any finite float, the awkward ones (signed zero, subnormals, the extremes)
 * often. */
float awkward_float(uint64_t *state)
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
weight_set *set_make_f32(const char *name, const set_shape *s, uint64_t seed)
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
int set_matches_f32(const weight_set *set, const set_shape *s, uint64_t seed)
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

/*
 * test_store_format.c - the weight-set file format (store_format.c): every flipped byte
 * refused, float32 sets and version 3, version 2 files still read, damage to a float32 file
 * refused.
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

/* ---- float32 sets and the version-3 format ------------------------------- */

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

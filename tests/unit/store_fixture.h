/*
 * store_fixture.h - what the store's unit tests share: sets made from a seed and compared bit
 * for bit, a fresh temporary directory per test, and stores opened with their start-up
 * messages captured. One test file per file of server/store/ (test_store.c for store.c,
 * test_store_format.c, test_store_io.c, test_store_quarantine.c, test_store_sync.c,
 * test_store_table.c) includes it; nothing else does, so the helpers keep the short names
 * the tests have always read. store_fixture.c says what each promises.
 */
#ifndef STORE_FIXTURE_H
#define STORE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "store/store.h"
#include "test.h"

/* Limits far above anything these tests store. */
extern const store_limits roomy;

/* A set name of the longest length allowed (WEIGHTS_NAME_MAX). */
extern const char long_name[];

/* Which arrays a set has, in the store's order, and its dimensions. */
enum { HAS_WO = 1u << 3, HAS_BQ = 1u << 4, HAS_BK = 1u << 5, HAS_BV = 1u << 6, HAS_BO = 1u << 7 };
#define HAS_ALL (HAS_WO | HAS_BQ | HAS_BK | HAS_BV | HAS_BO)

typedef struct set_shape {
    size_t d_in, d_ctx, dk, dv, d_out; /* d_out is ignored (= dv) without wo */
    unsigned optional;                 /* HAS_* bits */
} set_shape;

uint64_t splitmix(uint64_t *state);
double awkward_double(uint64_t *state);
size_t array_len(const set_shape *s, int i);
int array_present(const set_shape *s, int i);
int weights_make(const set_shape *s, uint64_t seed, attn_weights *w);
weight_set *set_make(const char *name, const set_shape *s, uint64_t seed, size_t heads, int out_in);
size_t file_size_of(const char *name, const set_shape *s);
int set_matches(const weight_set *set, const char *name, const set_shape *s, uint64_t seed, size_t heads,
                int out_in, char *why, size_t why_len);
void remove_tree(const char *dir);
long count_entries(const char *dir, const char *prefix);
long long file_size(const char *dir, const char *file);
int read_file(const char *dir, const char *file, unsigned char **data, size_t *len);
int write_file(const char *dir, const char *file, const void *data, size_t len);
void close_store(weight_store *store);
weight_store *open_store(const char *dir, const store_limits *limits, attn_error *err, char *log,
                          size_t log_len);
void in_temp_dir(void (*body)(const char *dir));
float awkward_float(uint64_t *state);
weight_set *set_make_f32(const char *name, const set_shape *s, uint64_t seed);
int set_matches_f32(const weight_set *set, const set_shape *s, uint64_t seed);

/* ASSERT-style check of set_matches. */
#define ASSERT_SET(set, name, shape, seed, heads, out_in)                                 \
    do {                                                                                    \
        char why_[256];                                                                     \
        if (!set_matches((set), (name), (shape), (seed), (heads), (out_in), why_, sizeof why_)) \
            FAIL_AT("%s", why_);                                                            \
    } while (0)

#endif

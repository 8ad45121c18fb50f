/*
 * test_hooks.h - hooks that exist only in test builds.
 *
 * The unit tests and the fuzzers link a test build of the library, whose
 * modules that define hooks (the Makefile's HOOKED) are compiled again with
 * -DATTN_TESTING (TEST_LIB_OBJS); the server is built without it, so none
 * of these is in build/attention-server and the code paths they reach cost
 * nothing there.  Each hook is defined beside the code it steers, and a
 * module that defines one is listed in HOOKED (else the unit tests fail to
 * link).
 */
#ifndef ATTN_TEST_HOOKS_H
#define ATTN_TEST_HOOKS_H

#ifndef ATTN_TESTING
#error "test_hooks.h is for test builds only (compile with -DATTN_TESTING)"
#endif

#include <stddef.h>

#include "error.h"

/* mem.c: after n more successful allocations every allocation fails, until
 * mem_fail_reset().  n < 0 disables failure injection.  Thread-safe. */
void mem_fail_after(long n);
void mem_fail_reset(void);
/* Number of allocations refused since the last mem_fail_after/reset. */
long mem_failures(void);
/* Blocks allocated minus blocks freed since the last mem_fail_after, counted
 * only while failures are being injected: 0 after a failed call that freed
 * everything it allocated (if the test freed nothing allocated before). */
long mem_fail_live(void);

/* store_io.c: make the nth file-system step of the next writes and deletes
 * fail with EIO (0 = the first step; -1 turns failure injection off).  The
 * steps are open, each write, fsync, rename, unlink and directory fsync. */
void store_fail_io_after(int n);

/* store.c: a store on the backend given (store_internal.h's store_backend), as
 * store_open opens one on a directory, for the unit tests of what lies above
 * the backend (a put's conditional writes, which no real server in the tests
 * refuses with 412). */
struct store_backend;
struct store_limits;
struct weight_store *store_open_on_backend(const struct store_backend *backend,
                                           const struct store_limits *limits, attn_error *err);

/* attention_fused.c: one more path of the fused kernel, listed after the
 * others (attn_kernel_available, attn_kernel_select), for the unit tests
 * only; before any kernel runs.  Two at most: a third is not added. */
struct attn_kernel_path;
void attn_kernel_add_for_testing(const struct attn_kernel_path *path);

/* attention_fused.c: the fused kernel takes sub-blocks of this many query
 * rows (rounded up to whole register groups, at most ATTN_FUSED_FQ_MAX)
 * whatever the cache; 0 goes back to the rows the cache gives. */
void attn_fused_rows_for_testing(size_t rows);

/* attention.c: how the job's query rows are split for the compute pool: its
 * blocks, and the tasks they run as (more than the blocks when the last ones
 * go in pieces, FUSED_TAIL_SPLIT). */
struct attn_job;
void attention_split_for_testing(const struct attn_job *job, size_t *blocks, size_t *tasks);

/* attention.c: where the fused kernel's packed K and V lie for the job: "heads" (packed
 * before the tasks), "slots" (a task packs its head whole), "tiles" (a block packs its
 * head a tile at a time), or "none" (the job does not take the fused kernel). */
const char *attention_pack_for_testing(const struct attn_job *job);

/* json_fast.c: arrays of at least n numbers (1: every one) are read fast
 * from now on, in every thread; 0 restores JSON_FAST_MIN_NUMBERS. */
void json_fast_set_min_numbers(size_t n);

#endif

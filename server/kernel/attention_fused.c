/*
 * attention_fused.c - which path of the fused kernel runs (attention_fused.h).
 *
 * The paths are listed widest first; the automatic choice is the first this
 * CPU can run (cpuid, through __builtin_cpu_supports, which also checks that
 * the operating system saves the wide registers).  The choice is made once,
 * at start-up, before any request is computed; the unit tests change it
 * between tests to run every path, and add two the server does not have
 * (tests/unit/kernel_avx512_on_avx2.c and kernel_amx_model.c).  Also the rows
 * per sub-block, from the CPU's second-level cache, and whether the AMX tiles
 * may be used.
 */
#define _DEFAULT_SOURCE /* syscall, for arch_prctl (Linux) */
#include "attention_fused.h"

#include "attention.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef ATTN_TESTING
#include "core/test_hooks.h"
#endif

static const attn_kernel_path *all_paths[] = {
    &attn_kernel_amx_bf16,
    &attn_kernel_avx512_bf16,
    &attn_kernel_avx512,
    &attn_kernel_avx2,
    &attn_kernel_portable,
#ifdef ATTN_TESTING
    NULL,   /* two paths only the unit tests run (attn_kernel_add_for_testing) */
    NULL,
#endif
};
#define PATH_SLOTS (sizeof all_paths / sizeof all_paths[0])

/* The paths: all_paths up to its first NULL. */
static size_t path_count(void)
{
    size_t n = 0;
    while (n < PATH_SLOTS && all_paths[n] != NULL)
        n++;
    return n;
}

#ifdef ATTN_TESTING
void attn_kernel_add_for_testing(const attn_kernel_path *path)
{
    size_t n = path_count();
    if (n < PATH_SLOTS)
        all_paths[n] = path;
}
#endif

static _Atomic(const attn_kernel_path *) chosen;

static const attn_kernel_path *auto_path(void)
{
    __builtin_cpu_init();
    for (size_t i = 0; i < path_count(); i++)
        if (all_paths[i]->supported())
            return all_paths[i];
    return &attn_kernel_portable;
}

int attn_kernel_select(const char *name, char *err, size_t errlen)
{
    if (name == NULL || !strcmp(name, "auto") || !strcmp(name, "")) {
        atomic_store(&chosen, auto_path());
        return 0;
    }
    __builtin_cpu_init();
    for (size_t i = 0; i < path_count(); i++) {
        if (strcmp(all_paths[i]->name, name) != 0)
            continue;
        if (!all_paths[i]->supported()) {
            char names[96] = "";
            for (size_t j = 0; j < path_count(); j++)
                if (all_paths[j]->supported())
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                             names[0] ? ", " : "", all_paths[j]->name);
            snprintf(err, errlen,
                     "kernel path \"%s\" needs instructions this CPU does not have; "
                     "it runs auto, %s", name, names);
            return -1;
        }
        atomic_store(&chosen, all_paths[i]);
        return 0;
    }
    snprintf(err, errlen, "unknown kernel path \"%s\" (auto, amx_bf16, avx512_bf16, avx512, avx2 or portable)", name);
    return -1;
}

const attn_kernel_path *attn_kernel_current(void)
{
    const attn_kernel_path *p = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (p == NULL) {
        /* Every thread that gets here computes the same answer. */
        p = auto_path();
        atomic_store(&chosen, p);
    }
    return p;
}

size_t attn_kernel_available(const attn_kernel_path **paths, size_t max)
{
    size_t n = 0;
    __builtin_cpu_init();
    for (size_t i = 0; i < path_count(); i++)
        if (n < max && all_paths[i]->supported())
            paths[n++] = all_paths[i];
    return n;
}

/* Linux's request for a process's permission to use an extended state component
 * (asm/prctl.h), and the component of the AMX tiles' data (XFEATURE_XTILEDATA). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 1 usable, 2 not, 0 not asked yet. */
static _Atomic int amx_state;

static int amx_ask(void)
{
    unsigned a, b, c, d;
    /* cpuid 7.0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; 1: ECX bit 27 OSXSAVE */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & 1u << 22) || !(d & 1u << 24))
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & 1u << 27))
        return 0;
    /* XCR0 bits 17 and 18: the operating system saves the tile configuration and data */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 3u << 17) != 3u << 17)
        return 0;
    /* Linux arms the tiles per process, on request; a kernel without the request (before
     * 5.16) or one that refuses it leaves them off, and the first tile instruction would
     * fault. */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int attn_fused_amx_usable(void)
{
    int state = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (state == 0) {
        /* Every thread that gets here asks the same; granting twice is harmless. */
        state = amx_ask() ? 1 : 2;
        atomic_store_explicit(&amx_state, state, memory_order_relaxed);
    }
    return state == 1;
}

size_t attn_fused_rows_for_cache(size_t l2, size_t hdk, size_t hdv_pad, size_t size)
{
    size_t row = (hdk + hdv_pad) * size, fit = row > 0 ? l2 / 2 / row : ATTN_FUSED_FQ_MAX;
    size_t rows = fit > ATTN_FUSED_BK ? (fit - ATTN_FUSED_BK) / ATTN_FUSED_MR * ATTN_FUSED_MR : 0;
    return rows < ATTN_FUSED_FQ_MIN ? ATTN_FUSED_FQ_MIN
                                    : rows > ATTN_FUSED_FQ_MAX ? ATTN_FUSED_FQ_MAX : rows;
}

/* The L2 in bytes shifted left by one, with 1 in bit 0 when the CPU
 * reported it; 0 until asked. */
static _Atomic size_t l2_known;

size_t attn_fused_l2_bytes(int *reported)
{
    size_t known = atomic_load_explicit(&l2_known, memory_order_relaxed);
    if (known == 0) {
        /* Every thread that gets here computes the same answer. */
        long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
        known = bytes > 0 ? (size_t)bytes << 1 | 1 : (size_t)ATTN_FUSED_L2_ASSUMED << 1;
        atomic_store_explicit(&l2_known, known, memory_order_relaxed);
    }
    if (reported != NULL)
        *reported = known & 1;
    return known >> 1;
}

#ifdef ATTN_TESTING
static _Atomic size_t rows_forced;

void attn_fused_rows_for_testing(size_t rows)
{
    atomic_store(&rows_forced, rows);
}
#endif

size_t attn_fused_block_rows(size_t hdk, size_t hdv_pad, size_t size)
{
#ifdef ATTN_TESTING
    size_t forced = atomic_load(&rows_forced);
    if (forced != 0) {
        forced = (forced + ATTN_FUSED_MR - 1) / ATTN_FUSED_MR * ATTN_FUSED_MR;
        return forced < ATTN_FUSED_FQ_MAX ? forced : ATTN_FUSED_FQ_MAX;
    }
#endif
    return attn_fused_rows_for_cache(attn_fused_l2_bytes(NULL), hdk, hdv_pad, size);
}

/* The module's public face (attention.h): names only. */
int attention_kernel_select(const char *name, char *err, size_t errlen)
{
    return attn_kernel_select(name, err, errlen);
}

const char *attention_kernel_path(void)
{
    return attn_kernel_current()->name;
}

size_t attention_kernel_available(const char **names, size_t max)
{
    const attn_kernel_path *paths[PATH_SLOTS];
    size_t n = attn_kernel_available(paths, PATH_SLOTS);
    for (size_t i = 0; i < n && i < max; i++)
        names[i] = paths[i]->name;
    return n < max ? n : max;
}

size_t attention_kernel_l2_bytes(int *reported)
{
    return attn_fused_l2_bytes(reported);
}

size_t attention_kernel_block_rows(size_t head_dim, size_t size)
{
    return attn_fused_block_rows(head_dim, attn_fused_vpad(head_dim, size), size);
}

/*
 * test_mem.c - the JSON arena of mem.h, and its aligned blocks.
 *
 * While a thread's arena is open, jansson's nodes come from a few large
 * blocks: a tree of thousands of numbers must parse within a handful of
 * mem_malloc calls, give every block back at mem_json_arena_end, fail
 * cleanly when a block cannot be had, and leave memory jansson took before
 * the arena opened to mem_free.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* "[0.5,1.5,...]" of n numbers; the caller frees it with free. */
static char *number_array(size_t n)
{
    char *text = malloc(n * 8 + 3);
    size_t len = 0;
    text[len++] = '[';
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, "%s%zu.5", i ? "," : "", i % 1000);
    text[len++] = ']';
    text[len] = '\0';
    return text;
}

/* Parses text and sums its numbers; returns -1 when the parse fails. */
static double parse_and_sum(const char *text)
{
    json_error_t jerr;
    json_t *tree = json_loads(text, 0, &jerr);
    if (tree == NULL)
        return -1;
    double sum = 0;
    for (size_t i = 0; i < json_array_size(tree); i++)
        sum += json_number_value(json_array_get(tree, i));
    json_decref(tree);
    return sum;
}

void test_mem_json_arena_few_blocks(void)
{
    const size_t n = 20000;
    char *text = number_array(n);
    double want = 0;
    for (size_t i = 0; i < n; i++)
        want += (double)(i % 1000) + 0.5;
    /* Without the arena, 20 allocations are far too few for 20000 nodes. */
    mem_fail_after(20);
    double without = parse_and_sum(text);
    mem_fail_reset();
    /* With it, they are plenty, and every block is given back at the end. */
    mem_fail_after(20);
    mem_json_arena_begin();
    double with = parse_and_sum(text);
    mem_json_arena_end();
    long failures = mem_failures(), live = mem_fail_live();
    mem_fail_reset();
    free(text);
    ASSERT(without == -1);
    ASSERT(with == want);
    ASSERT_EQ(failures, 0);
    ASSERT_EQ(live, 0);
}

void test_mem_json_arena_out_of_memory(void)
{
    char *text = number_array(30000);
    long n;
    for (n = 0; n < 100; n++) {
        mem_fail_after(n);
        mem_json_arena_begin();
        double sum = parse_and_sum(text);
        mem_json_arena_end();
        long failures = mem_failures(), live = mem_fail_live();
        mem_fail_reset();
        if (live != 0) {
            free(text);
            FAIL_AT("allocation %ld failed: %ld blocks left allocated", n, live);
        }
        if (failures == 0) {
            ASSERT(sum > 0);
            break;
        }
        if (sum != -1) {
            free(text);
            FAIL_AT("allocation %ld failed but the parse succeeded", n);
        }
    }
    free(text);
    if (n < 2)
        FAIL_AT("only %ld blocks: is the arena growing?", n);
}

void test_mem_json_arena_earlier_memory_freed(void)
{
    /* Counting starts here: a value made before the arena, released inside it,
     * goes back to mem_free; values made inside are given back with the arena. */
    mem_fail_after(1000);
    json_t *before = json_pack("{s:[f,f],s:s}", "a", 1.5, 2.5, "b", "text");
    ASSERT(before != NULL);
    ASSERT(mem_fail_live() > 0);
    mem_json_arena_begin();
    json_t *inside = json_pack("[s,s]", "one", "two");
    json_decref(before);
    json_decref(inside);
    mem_json_arena_end();
    long live = mem_fail_live();
    mem_fail_reset();
    ASSERT(inside != NULL);
    ASSERT_EQ(live, 0);
    /* After the arena, jansson allocates as before. */
    json_t *after = json_string("after");
    ASSERT(after != NULL);
    json_decref(after);
}

/* mem_aligned's blocks start at a multiple of the alignment asked for, whatever the
 * size (the fused kernel's scratch is kilobytes to megabytes), are counted like
 * mem_malloc's, and fail when failures are injected. */
void test_mem_aligned_blocks(void)
{
    static const size_t sizes[] = {0, 1, 24, 4096, 1 << 20, 5 << 20};
    mem_fail_after(1000);
    int misaligned = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t align = sizeof(void *); align <= 4096; align *= 4) {
            unsigned char *p = mem_aligned(align, sizes[i]);
            ASSERT(p != NULL);
            misaligned += (uintptr_t)p % align != 0;
            memset(p, 0xa5, sizes[i]);
            mem_free(p);
        }
    long live = mem_fail_live();
    mem_fail_reset();
    ASSERT_EQ(misaligned, 0);
    ASSERT_EQ(live, 0);
    mem_fail_after(1);
    void *first = mem_aligned(64, 100), *second = mem_aligned(64, 100);
    live = mem_fail_live();
    mem_free(first);
    mem_fail_reset();
    ASSERT(first != NULL);
    ASSERT(second == NULL);
    ASSERT_EQ(live, 1);
}

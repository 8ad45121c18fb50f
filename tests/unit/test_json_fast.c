/*
 * test_json_fast.c - json_fast_load against json_loadb: the same tree, the
 * same doubles bit for bit, the same error for the same text.
 *
 * Bodies are generated from a seed (matrices of many shapes, numbers written
 * in every form the grammar allows, members that are and are not read fast,
 * values that only look like arrays of numbers), then mutated byte by byte
 * so that most are no longer valid JSON; every one is parsed both ways.
 */
#include <jansson.h>
#include <stdlib.h>

#include <valgrind/valgrind.h>

#include "json/json_fast.h"
#include "json_fast_check.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* ---- generating bodies -------------------------------------------------- */

typedef struct text {
    char *s;
    size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->s = realloc(t->s, t->cap);
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void puts_(text *t, const char *s)
{
    put(t, s, strlen(s));
}

static unsigned pick(uint64_t *rng, unsigned n)
{
    return (unsigned)(test_next_bits(rng) % n);
}

static void blank(text *t, uint64_t *rng)
{
    static const char *const blanks[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    puts_(t, blanks[pick(rng, 7)]);
}

/* One number, in one of many forms (a few of them past a double's range). */
static void number(text *t, uint64_t *rng)
{
    char buf[64];
    double x = test_uniform(rng);
    switch (pick(rng, 16)) {
    case 0: snprintf(buf, sizeof buf, "%d", (int)pick(rng, 2000) - 1000); break;
    case 1: snprintf(buf, sizeof buf, "%.17g", x); break;
    case 2: snprintf(buf, sizeof buf, "%.15g", x * 1e6); break;
    case 3: snprintf(buf, sizeof buf, "%.16g", x); break;
    case 4: snprintf(buf, sizeof buf, "%.3f", x); break;
    case 5: snprintf(buf, sizeof buf, "%.6e", x); break;
    case 6: snprintf(buf, sizeof buf, "%.17E", x * 1e-300); break;
    case 7: snprintf(buf, sizeof buf, "%.17g", x * 1e300); break;
    case 8: {
        static const char *const odd[] = {"-0", "0", "0.0", "-0.0e0", "1e22", "1e23", "9007199254740993",
                                          "123456789012345678901234567890", "0.000000000000000000001",
                                          "4.9e-324", "2.4703282292062328e-324", "1.7976931348623157e308",
                                          "1e-400", "1E+2", "1e-22", "5e-23", "0.1", "100000000000000000000000",
                                          "1.00000000000000000000000000000001"};
        snprintf(buf, sizeof buf, "%s", odd[pick(rng, sizeof odd / sizeof odd[0])]);
        break;
    }
    case 9:
        /* Past the range: jansson refuses these, so json_fast must too. */
        snprintf(buf, sizeof buf, pick(rng, 400) == 0 ? "1e400" : "%.0f", (double)pick(rng, 100));
        break;
    case 10: snprintf(buf, sizeof buf, "%llu", (unsigned long long)(test_next_bits(rng) >> 1)); break;
    case 11: snprintf(buf, sizeof buf, "-%.12g", fabs(x) * 1e-10); break;
    default: snprintf(buf, sizeof buf, "%.9g", x); break;
    }
    puts_(t, buf);
}

/* A value that is mostly an array of numbers: dims from the seed, now and
 * then ragged, empty, too deep, or with a non-number inside. */
static void numbers(text *t, uint64_t *rng, int depth, const size_t *dims, int spoil)
{
    puts_(t, "[");
    blank(t, rng);
    size_t n = dims[0];
    if (spoil && pick(rng, 40) == 0)
        n = n > 1 ? n - 1 : 0;  /* ragged or empty */
    for (size_t i = 0; i < n; i++) {
        if (i)
            puts_(t, pick(rng, 6) ? "," : " ,\n");
        if (depth > 1) {
            numbers(t, rng, depth - 1, dims + 1, spoil);
        } else if (spoil && pick(rng, 400) == 0) {
            static const char *const not_numbers[] = {"true", "null", "\"1\"", "[1]", "{}", "[]"};
            puts_(t, not_numbers[pick(rng, 6)]);
        } else {
            number(t, rng);
        }
        blank(t, rng);
    }
    puts_(t, "]");
}

static void value(text *t, uint64_t *rng, int nesting);

static void member(text *t, uint64_t *rng, const char *name, int nesting)
{
    puts_(t, "\"");
    puts_(t, name);
    puts_(t, "\"");
    blank(t, rng);
    puts_(t, ":");
    blank(t, rng);
    value(t, rng, nesting);
}

static void value(text *t, uint64_t *rng, int nesting)
{
    unsigned kind = nesting > 3 ? 4 + pick(rng, 4) : pick(rng, 8);
    if (kind <= 2) {
        size_t dims[5];
        int depth = 1 + (int)pick(rng, 5);
        for (int i = 0; i < depth; i++)
            dims[i] = 1 + pick(rng, i == depth - 1 ? 12 : 4);
        numbers(t, rng, depth, dims, 1);
    } else if (kind == 3) {
        /* An object of members, some read fast and some not. */
        static const char *const names[] = {"q", "k", "v", "data", "x", "shape", "weights",
                                            "inputs", "\\u0071", "mask", "q\\\"", "name"};
        puts_(t, "{");
        unsigned n = pick(rng, 5), first = pick(rng, sizeof names / sizeof names[0]);
        /* Distinct names, but for a duplicate now and then (jansson refuses those). */
        for (unsigned i = 0; i < n; i++) {
            if (i)
                puts_(t, ",");
            blank(t, rng);
            unsigned k = pick(rng, 50) == 0 ? first : first + i;
            member(t, rng, names[k % (sizeof names / sizeof names[0])], nesting + 1);
        }
        puts_(t, "}");
    } else if (kind == 4) {
        puts_(t, "[");
        unsigned n = pick(rng, 3);
        for (unsigned i = 0; i < n; i++) {
            if (i)
                puts_(t, ",");
            value(t, rng, nesting + 1);
        }
        puts_(t, "]");
    } else {
        static const char *const scalars[] = {"true", "false", "null", "\"s\"", "\"a]b[\"",
                                              "\"\\\"[1,2]\"", "12", "-1.5e3"};
        puts_(t, scalars[pick(rng, sizeof scalars / sizeof scalars[0])]);
    }
}

static void body(text *t, uint64_t *rng)
{
    static const char *const names[] = {"q", "k", "v", "x", "context", "mask", "data", "wq",
                                        "bq", "inputs", "shape", "scale", "\\u0071"};
    t->len = 0;
    blank(t, rng);
    puts_(t, "{");
    unsigned n = 1 + pick(rng, 6), first = pick(rng, sizeof names / sizeof names[0]);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            puts_(t, ",");
        blank(t, rng);
        unsigned k = pick(rng, 50) == 0 ? first : first + i;
        member(t, rng, names[k % (sizeof names / sizeof names[0])], 0);
    }
    puts_(t, "}");
    blank(t, rng);
}

/* ---- comparing ---------------------------------------------------------- */

static int read_everywhere(const char *name, size_t len)
{
    static const char *const fields[] = {"q", "k", "v", "x", "context", "mask", "data", "wq", "bq"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strlen(fields[i]) == len && memcmp(fields[i], name, len) == 0)
            return 1;
    return 0;
}

typedef struct tally {
    size_t valid, invalid, fast, mismatches;
} tally;

/* Parses s both ways and compares; prints the first few mismatches. */
static void compare(const char *s, size_t len, size_t flags, tally *c)
{
    int parsed;
    int same = json_fast_check(s, len, flags, read_everywhere, &parsed, &c->fast);
    if (parsed)
        c->valid++;
    else
        c->invalid++;
    if (!same && c->mismatches++ < 3)
        fprintf(stderr, "  differs from json_loadb: %.300s\n", s);
}

void test_json_fast_matches_jansson(void)
{
    uint64_t rng = 0x6a736f6e66617374ull;
    text t = {0};
    tally c = {0};
    /* Under valgrind the first quarter: memcheck's view of the reader needs no more, and
     * the plain and sanitized suites compare all of them. */
    int bodies = RUNNING_ON_VALGRIND ? 1000 : 4000;
    json_fast_set_min_numbers(1);
    for (int i = 0; i < bodies; i++) {
        body(&t, &rng);
        compare(t.s, t.len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &c);
        compare(t.s, t.len, 0, &c);
    }
    json_fast_set_min_numbers(0);
    free(t.s);
    printf("  %zu valid, %zu invalid, %zu arrays read fast\n", c.valid, c.invalid, c.fast);
    if (c.mismatches)
        FAIL_AT("%zu of %zu bodies parsed differently", c.mismatches, c.valid + c.invalid);
    /* The generator must exercise both sides, or the comparison proves little. */
    ASSERT(c.fast > (size_t)bodies * 3 / 8);
    ASSERT(c.valid > (size_t)bodies * 3 / 4);
    ASSERT(c.invalid > (size_t)bodies / 8);
}

void test_json_fast_mutated_bodies(void)
{
    static const char bytes[] = "[]{},:\"\\0123456789-+.eE \n\tatn";
    uint64_t rng = 0x6d75746174656421ull;
    text t = {0};
    tally c = {0};
    json_fast_set_min_numbers(1);
    for (int i = 0; i < 3000; i++) {
        body(&t, &rng);
        int edits = 1 + (int)pick(&rng, 3);
        for (int e = 0; e < edits && t.len > 1; e++) {
            size_t at = pick(&rng, (unsigned)t.len);
            switch (pick(&rng, 3)) {
            case 0: t.s[at] = bytes[pick(&rng, sizeof bytes - 1)]; break;
            case 1: memmove(t.s + at, t.s + at + 1, t.len - at); t.len--; break;
            default:
                put(&t, "x", 1);
                memmove(t.s + at + 1, t.s + at, t.len - at - 1);
                t.s[at] = bytes[pick(&rng, sizeof bytes - 1)];
            }
        }
        compare(t.s, t.len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &c);
    }
    json_fast_set_min_numbers(0);
    free(t.s);
    printf("  %zu valid, %zu invalid, %zu arrays read fast\n", c.valid, c.invalid, c.fast);
    if (c.mismatches)
        FAIL_AT("%zu of %zu mutated bodies parsed differently", c.mismatches, c.valid + c.invalid);
    ASSERT(c.fast > 250);
    ASSERT(c.valid > 300);
    ASSERT(c.invalid > 1000);
}

void test_json_fast_numbers_exact(void)
{
    /* Short numbers take the exact shortcut, long ones strtod: both must give
     * strtod's double, compared over every form below and random digits. */
    uint64_t rng = 0x6e756d6265727321ull;
    text t = {0};
    size_t checked = 0;
    for (int i = 0; i < 20000; i++) {
        char buf[64], d[24];
        unsigned digits = 1 + pick(&rng, 19);
        snprintf(d, sizeof d, "%019llu",
                 (unsigned long long)(test_next_bits(&rng) % 10000000000000000000ull));
        const char *p = d + (19 - digits);
        unsigned point = pick(&rng, digits + 1);   /* digits before the point */
        size_t n = 0;
        if (pick(&rng, 2))
            buf[n++] = '-';
        unsigned skip = 0;
        while (skip + 1 < point && p[skip] == '0')
            skip++;                 /* no leading zeros in the integer part */
        if (point == 0)
            buf[n++] = '0';
        for (unsigned k = skip; k < point; k++)
            buf[n++] = p[k];
        if (point < digits) {
            buf[n++] = '.';
            for (unsigned k = point; k < digits; k++)
                buf[n++] = p[k];
        }
        buf[n] = '\0';
        if (pick(&rng, 2))
            snprintf(buf + n, sizeof buf - n, "e%d", (int)pick(&rng, 61) - 30);
        t.len = 0;
        puts_(&t, "{\"q\":[");
        puts_(&t, buf);
        puts_(&t, "]}");
        json_error_t err;
        mem_json_arena_begin();
        json_fast_set_min_numbers(1);
        json_t *got = json_fast_load(t.s, t.len, JSON_DECODE_INT_AS_REAL, read_everywhere, &err);
        json_fast_set_min_numbers(0);
        const json_fast_array *a = got ? json_fast_get(json_object_get(got, "q")) : NULL;
        double want = strtod(buf, NULL);
        int ok = a != NULL && a->count == 1 && same_double(a->data[0], want);
        json_decref(got);
        mem_json_arena_end();
        if (!ok) {
            free(t.s);
            FAIL_AT("%s: not read as strtod reads it (%.17g)", buf, want);
        }
        checked++;
    }
    free(t.s);
    ASSERT(checked > 10000);
}

void test_json_fast_stand_ins_end_with_the_arena(void)
{
    const char *s = "{\"q\":[[1,2,3,4],[5,6,7,8]],\"name\":\"q\"}";
    json_error_t err;
    /* Without an arena, nothing is read fast. */
    json_t *plain = json_fast_load(s, strlen(s), JSON_DECODE_INT_AS_REAL, read_everywhere, &err);
    ASSERT(plain != NULL);
    ASSERT(json_array_size(json_object_get(plain, "q")) == 2);
    ASSERT(json_fast_get(json_object_get(plain, "q")) == NULL);
    json_decref(plain);

    mem_json_arena_begin();
    json_t *root = json_fast_load(s, strlen(s), JSON_DECODE_INT_AS_REAL, read_everywhere, &err);
    ASSERT(root != NULL);
    const json_t *q = json_object_get(root, "q");
    const json_fast_array *a = json_fast_get(q);
    ASSERT(a != NULL);
    ASSERT_EQ(a->depth, 2);
    ASSERT_EQ(a->dims[0], 2);
    ASSERT_EQ(a->dims[1], 4);
    ASSERT_EQ(a->count, 8);
    ASSERT(a->data[7] == 8.0);
    ASSERT(json_array_size(q) == 0);
    /* Materialized, the tree is what jansson alone gives. */
    json_t *m = json_fast_materialize(a);
    json_t *ref = json_loads("[[1.0,2.0,3.0,4.0],[5.0,6.0,7.0,8.0]]", 0, &err);
    int same = json_equal(m, ref);
    json_decref(m);
    json_decref(ref);
    json_decref(root);
    mem_json_arena_end();
    ASSERT(same);
    /* A later arena does not see the stand-ins of an earlier one. */
    mem_json_arena_begin();
    ASSERT(json_fast_get(q) == NULL);
    mem_json_arena_end();
}

void test_json_fast_out_of_memory(void)
{
    /* Every allocation failing in turn: a result or a clean NULL, never a
     * leak, and once memory is back the same text parses. */
    const char *s = "{\"q\":[[1.5,2,3,4],[5,6,7,8]],\"k\":[[1,2,3,4],[5,6,7,8]],\"name\":\"x\"}";
    json_fast_set_min_numbers(1);
    int parsed = 0;
    for (long n = 0; n < 64; n++) {
        mem_fail_after(n);
        mem_json_arena_begin();
        json_error_t err;
        json_t *root = json_fast_load(s, strlen(s), JSON_DECODE_INT_AS_REAL, read_everywhere, &err);
        const json_fast_array *a = root ? json_fast_get(json_object_get(root, "q")) : NULL;
        if (root != NULL && a == NULL && json_array_size(json_object_get(root, "q")) != 2) {
            json_decref(root);
            mem_json_arena_end();
            mem_fail_reset();
            json_fast_set_min_numbers(0);
            FAIL_AT("after %ld allocations: q is neither read fast nor in the tree", n);
        }
        parsed += root != NULL;
        json_decref(root);
        mem_json_arena_end();
        long live = mem_fail_live();
        mem_fail_reset();
        if (live != 0) {
            json_fast_set_min_numbers(0);
            FAIL_AT("after %ld allocations: %ld blocks not freed", n, live);
        }
    }
    json_fast_set_min_numbers(0);
    ASSERT(parsed > 0);
}

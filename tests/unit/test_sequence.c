/*
 * test_sequence.c - the table of sequences (sequence/sequence.h): ids, turns,
 * the limits, the cache's growth and commit, the totals, the memory budget
 * and the expiry of idle sequences.  The numbers of a step through the
 * kernel are the `sequences` suite's (tests/sequences/).
 */
#include "test.h"

#include "core/budget.h"
#include "core/compute.h"
#include "sequence/sequence.h"

static const sequence_shape shape_f64 = {ATTN_FLOAT64, 2, 4, 6, 1, 0.5, "attention", 0, {SEQUENCE_POLICY_FULL, 0, 0, 0, 0, 0, 0}};

static sequence_id number_id(uint64_t n)
{
    sequence_id id;
    memset(&id, 0, sizeof id);
    id.number = n;
    return id;
}

static sequence_id string_id(const char *s)
{
    sequence_id id;
    memset(&id, 0, sizeof id);
    id.is_string = 1;
    snprintf(id.string, sizeof id.string, "%s", s);
    return id;
}

static void start_table(size_t max_sequences, size_t max_keys)
{
    sequence_limits limits = {max_sequences, 10, max_keys};
    budget_init(0);
    sequence_init(&limits);
}

void test_sequence_ids_and_limits(void)
{
    start_table(2, 100);
    attn_error err;
    sequence *s = NULL;
    sequence_id seven = number_id(7), seven_text = string_id("7"), other = number_id(8);
    ASSERT_EQ(sequence_acquire(&seven, 0, &shape_f64, "id", &s, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "sequence_unknown");
    ASSERT_STR_EQ(err.field, "id");
    ASSERT(strstr(err.message, "sequence 7") != NULL);
    ASSERT(s == NULL);
    ASSERT_EQ(sequence_acquire(&seven, 1, &shape_f64, "id", &s, &err), 0);
    sequence_release(s, 0);
    /* the number 7 and the string "7" are two sequences */
    ASSERT_EQ(sequence_acquire(&seven_text, 0, &shape_f64, "id", &s, &err), ERR_BAD_REQUEST);
    ASSERT_EQ(sequence_acquire(&seven_text, 1, &shape_f64, "id", &s, &err), 0);
    sequence_release(s, 0);
    ASSERT_EQ(sequence_acquire(&other, 1, &shape_f64, "id", &s, &err), ERR_TOO_MANY);
    ASSERT_STR_EQ(err.code, "too_many_sequences");
    /* a start on a live id is no new sequence, and empties it */
    ASSERT_EQ(sequence_acquire(&seven, 1, &shape_f64, "id", &s, &err), 0);
    ASSERT_EQ(sequence_reserve(s, 3, &err), 0);
    sequence_commit(s, 3, NULL, NULL);
    sequence_release(s, 0);
    ASSERT_EQ(sequence_acquire(&seven, 1, &shape_f64, "id", &s, &err), 0);
    ASSERT_EQ(sequence_length(s), 0);
    sequence_release(s, 1);     /* its end */
    ASSERT_EQ(sequence_acquire(&seven, 0, &shape_f64, "id", &s, &err), ERR_BAD_REQUEST);
    ASSERT_EQ(sequence_acquire(&other, 1, &shape_f64, "id", &s, &err), 0);
    sequence_release(s, 0);
    sequence_shutdown();
}

void test_sequence_cache_and_totals(void)
{
    start_table(4, 40);
    attn_error err;
    sequence *s = NULL;
    sequence_id id = number_id(1);
    ASSERT_EQ(sequence_acquire(&id, 1, &shape_f64, "id", &s, &err), 0);
    /* 3 keys of 2 heads: keys and values written past the length, then committed */
    for (size_t step = 0; step < 12; step++) {
        size_t n = sequence_length(s);
        ASSERT_EQ(n, step * 3);
        ASSERT_EQ(sequence_reserve(s, 3, &err), 0);
        double *k = sequence_keys(s), *v = sequence_values(s);
        for (size_t j = n; j < n + 3; j++) {
            for (size_t c = 0; c < 4; c++)
                k[j * 4 + c] = (double)(j * 10 + c);
            for (size_t c = 0; c < 6; c++)
                v[j * 6 + c] = -(double)(j * 10 + c);
        }
        /* every key so far receives 1 from head 0 and its position from head 1 */
        double received[2 * 40];
        for (size_t j = 0; j < n + 3; j++) {
            received[j] = 1;
            received[(n + 3) + j] = (double)j;
        }
        sequence_commit(s, 3, received, NULL);
    }
    /* the committed rows survived every growth */
    const double *k = sequence_keys(s), *v = sequence_values(s);
    for (size_t j = 0; j < 36; j++) {
        ASSERT_NEAR(k[j * 4 + 3], j * 10 + 3, 0);
        ASSERT_NEAR(v[j * 6 + 5], -(double)(j * 10 + 5), 0);
    }
    double totals[2 * 36];
    sequence_received_total(s, totals, 36);
    for (size_t j = 0; j < 36; j++) {
        double steps_seen = 12 - j / 3;      /* the steps from the one that brought key j */
        ASSERT_NEAR(totals[j], steps_seen, 0);
        ASSERT_NEAR(totals[36 + j], steps_seen * j, 0);
    }
    /* past --max-sequence-keys: refused, the length unchanged */
    ASSERT_EQ(sequence_reserve(s, 5, &err), ERR_TOO_LARGE);
    ASSERT_STR_EQ(err.code, "sequence_too_long");
    ASSERT_EQ(sequence_length(s), 36);
    /* a reserve without a commit (a step that failed) leaves the length */
    ASSERT_EQ(sequence_reserve(s, 4, &err), 0);
    ASSERT_EQ(sequence_length(s), 36);
    sequence_release(s, 1);
    sequence_shutdown();
}

void test_sequence_memory_budget(void)
{
    sequence_limits limits = {4, 10, 1000};
    budget_init(64 * 1024);
    sequence_init(&limits);
    attn_error err;
    sequence *s = NULL;
    sequence_id id = number_id(3);
    sequence_shape wide = {ATTN_FLOAT64, 1, 64, 64, 0, 0.125, "attention", 0, {SEQUENCE_POLICY_FULL, 0, 0, 0, 0, 0, 0}};
    ASSERT_EQ(sequence_key_bytes(&wide), 64 * 8 * 2 + 8);
    ASSERT_EQ(sequence_acquire(&id, 1, &wide, "id", &s, &err), 0);
    /* 20 keys: room for 32, 33,024 bytes out of the 64 KiB budget */
    ASSERT_EQ(sequence_reserve(s, 20, &err), 0);
    sequence_commit(s, 20, NULL, NULL);
    ASSERT_EQ(budget_reserve(40000), -1);
    /* growing to 64 keys does not fit beside what is held: 503; the sequence as it was */
    ASSERT_EQ(sequence_reserve(s, 20, &err), ERR_UNAVAILABLE);
    ASSERT_STR_EQ(err.code, "overloaded");
    ASSERT_EQ(sequence_length(s), 20);
    /* its end hands the cache's memory back */
    sequence_release(s, 1);
    ASSERT_EQ(budget_reserve(60000), 0);
    budget_release(60000);
    sequence_shutdown();
    budget_init(0);
}

void test_sequence_idle_expiry(void)
{
    start_table(4, 100);
    attn_error err;
    sequence *s = NULL, *held = NULL;
    sequence_id idle = number_id(1), busy = number_id(2);
    ASSERT_EQ(sequence_acquire(&idle, 1, &shape_f64, "id", &s, &err), 0);
    ASSERT_EQ(sequence_reserve(s, 2, &err), 0);
    sequence_commit(s, 2, NULL, NULL);
    sequence_release(s, 0);
    ASSERT_EQ(sequence_acquire(&busy, 1, &shape_f64, "id", &held, &err), 0);
    double now = compute_now();
    ASSERT_EQ(sequence_sweep(now + 5), 0);           /* within the timeout */
    /* past it: the idle one goes, the one a step holds stays */
    ASSERT_EQ(sequence_sweep(now + 11), 1);
    ASSERT_EQ(sequence_acquire(&idle, 0, &shape_f64, "id", &s, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "sequence_unknown");
    sequence_release(held, 0);
    ASSERT_EQ(sequence_acquire(&busy, 0, &shape_f64, "id", &held, &err), 0);
    sequence_release(held, 0);
    sequence_shutdown();
}

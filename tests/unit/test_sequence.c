/*
 * test_sequence.c - the table of sequences (sequence/sequence.h): ids, turns,
 * the limits, the cache's growth and commit, the totals, the memory budget,
 * the expiry of idle sequences, and the cache policies' rules and trim.  The
 * numbers of a step through the kernel are the `sequences` and `policies`
 * suites' (tests/sequences/).
 */
#include "test.h"

#include "core/budget.h"
#include "core/compute.h"
#include "sequence/sequence.h"

static const sequence_shape shape_f64 = {ATTN_FLOAT64, 2, 4, 6, 1, 0.5, "attention", 0,
                                         {SEQUENCE_POLICY_FULL, 0, 0, 0, 0, 0, 0}};

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
    sequence_shape wide = {ATTN_FLOAT64, 1, 64, 64, 0, 0.125, "attention", 0,
                           {SEQUENCE_POLICY_FULL, 0, 0, 0, 0, 0, 0}};
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

/* policy.h's rules on positions and scores, without a cache. */
void test_sequence_policy_rules(void)
{
    unsigned char keep[2 * 12];
    int64_t pos[2 * 12];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 12; j++)
            pos[h * 12 + j] = j < 4 ? j : j + 10;       /* 0..3, then 14..21 */
    /* window: the first 2 positions and the last 5 of 22 appended */
    sequence_policy window = {SEQUENCE_POLICY_WINDOW, 2, 5, 0, 0, 0, 0};
    ASSERT_EQ(sequence_policy_keep(&window, 2, 12, pos, 22, NULL, 0, 0, keep), 7);
    for (int j = 0; j < 12; j++)
        ASSERT_EQ(keep[12 + j], pos[j] < 2 || pos[j] >= 17);
    /* h2o: budget 5, the last 2 rows kept, of the others the 3 highest; ties: the earlier */
    double s[2 * 12] = {5, 1, 9, 3, 3, 7, 3, 0, 2, 8, 0, 0,     /* head 0 */
                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};   /* head 1: all tied */
    sequence_policy h2o = {SEQUENCE_POLICY_H2O, 0, 0, 5, 2, 0, 0};
    ASSERT_EQ(sequence_policy_keep(&h2o, 2, 12, pos, 22, s, 0, 0, keep), 5);
    const unsigned char want0[12] = {0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1};
    const unsigned char want1[12] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1};
    ASSERT(memcmp(keep, want0, 12) == 0);
    ASSERT(memcmp(keep + 12, want1, 12) == 0);
    /* the scan (few evictions) and the sort (many) choose alike, ties included */
    double t[2 * 6] = {4, 2, 2, 7, 2, 0, 2, 2, 2, 2, 2, 2};
    int64_t p6[2 * 6] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
    sequence_policy one = {SEQUENCE_POLICY_H2O, 0, 0, 5, 1, 0, 0};
    ASSERT_EQ(sequence_policy_keep(&one, 2, 6, p6, 6, t, 0, 0, keep), 5);
    const unsigned char scan0[6] = {1, 1, 1, 1, 0, 1}, scan1[6] = {1, 1, 1, 1, 0, 1};
    ASSERT(memcmp(keep, scan0, 6) == 0);
    ASSERT(memcmp(keep + 6, scan1, 6) == 0);
    sequence_policy many = {SEQUENCE_POLICY_H2O, 0, 0, 2, 1, 0, 0};
    ASSERT_EQ(sequence_policy_keep(&many, 2, 6, p6, 6, t, 0, 0, keep), 2);
    const unsigned char sort0[6] = {0, 0, 0, 1, 0, 1}, sort1[6] = {1, 0, 0, 0, 0, 1};
    ASSERT(memcmp(keep, sort0, 6) == 0);
    ASSERT(memcmp(keep + 6, sort1, 6) == 0);
    /* snapkv's prompt of 6: window 2 (positions 4, 5), budget 3: one candidate of 0..3 by
     * its score max-pooled over 3; then later steps keep it and the newest 2 */
    double obs[6] = {0, 0, 0, 5, 9, 9};
    sequence_policy snap = {SEQUENCE_POLICY_SNAPKV, 0, 2, 3, 0, 3, 0};
    int64_t b = sequence_policy_snap_boundary(&snap, 6);
    ASSERT_EQ(b, 4);
    ASSERT_EQ(sequence_policy_keep(&snap, 1, 6, p6, 6, obs, 1, b, keep), 3);
    /* pooled: 0, 0, 5, 5 (the window's keys are not candidates): position 2 wins the tie */
    const unsigned char snap0[6] = {0, 0, 1, 0, 1, 1};
    ASSERT(memcmp(keep, snap0, 6) == 0);
    int64_t later[4] = {2, 4, 5, 6};
    ASSERT_EQ(sequence_policy_keep(&snap, 1, 4, later, 7, NULL, 0, b, keep), 3);
    const unsigned char snap1[4] = {1, 0, 1, 1};
    ASSERT(memcmp(keep, snap1, 4) == 0);
    /* scores needed and absent */
    ASSERT_EQ(sequence_policy_keep(&h2o, 2, 12, pos, 22, NULL, 0, 0, keep), SIZE_MAX);
}

/* A trim through sequence_commit: each head keeps its own keys, moved down in order, with
 * their totals and positions; the full cache beside keeps every key. */
void test_sequence_policy_trim(void)
{
    start_table(4, 100);
    attn_error err;
    sequence *s = NULL;
    sequence_id id = number_id(9);
    sequence_shape sh = shape_f64;              /* 2 heads: dk 4 (2 each), dv 6 (3 each) */
    sh.policy = (sequence_policy){SEQUENCE_POLICY_H2O, 0, 0, 3, 1, 0, 1};
    ASSERT_EQ(sequence_acquire(&id, 1, &sh, "id", &s, &err), 0);
    ASSERT_EQ(sequence_reserve(s, 5, &err), 0);
    double *k = sequence_keys(s), *v = sequence_values(s);
    double *fk = sequence_full_keys(s), *fv = sequence_full_values(s);
    ASSERT(fk != NULL && fv != NULL);
    for (int j = 0; j < 5; j++) {
        for (int c = 0; c < 4; c++)
            k[j * 4 + c] = fk[j * 4 + c] = 10 * j + c;
        for (int c = 0; c < 6; c++)
            v[j * 6 + c] = fv[j * 6 + c] = 100 * j + c;
    }
    double received[2 * 5] = {1, 2, 3, 4, 5, 5, 4, 3, 2, 1};
    unsigned char keep[2 * 5] = {0, 0, 1, 1, 1, 1, 1, 0, 0, 1};
    sequence_commit(s, 5, received, keep);
    ASSERT_EQ(sequence_length(s), 3);
    ASSERT_EQ(sequence_full_length(s), 5);
    ASSERT_EQ(sequence_appended(s), 5);
    int64_t pos[2 * 4];
    sequence_positions(s, 1, pos);                  /* the kept ones, then the next */
    const int64_t want_pos[8] = {2, 3, 4, 5, 0, 1, 4, 5};
    ASSERT(memcmp(pos, want_pos, sizeof pos) == 0);
    /* head 0's columns hold keys 2, 3, 4; head 1's keys 0, 1, 4 */
    for (int j = 0; j < 3; j++) {
        ASSERT_EQ(k[j * 4 + 0], 10 * want_pos[j]);
        ASSERT_EQ(k[j * 4 + 3], 10 * want_pos[4 + j] + 3);
        ASSERT_EQ(v[j * 6 + 2], 100 * want_pos[j] + 2);
        ASSERT_EQ(v[j * 6 + 5], 100 * want_pos[4 + j] + 5);
    }
    double totals[2 * 3];
    sequence_received_total(s, totals, 3);
    const double want_totals[6] = {3, 4, 5, 5, 4, 1};
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(totals[i], want_totals[i]);
    ASSERT_EQ(fk[4 * 4 + 1], 41);
    sequence_release(s, 1);
    sequence_shutdown();
    budget_init(0);
}

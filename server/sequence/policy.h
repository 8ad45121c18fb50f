/*
 * policy.h - which keys a sequence's cache keeps after a step: the eviction
 * policies chosen at a sequence's start (StreamingLLM's sinks and window,
 * H2O's heavy hitters, SnapKV's observation window), as rules on positions
 * and scores, free of the cache's arrays.
 *
 * A policy decides per head over the n keys a step's queries saw (the cache
 * as the previous step left it, then the step's own keys), each with its
 * position (keys ever appended before it: positions ascend along the rows
 * and the step's keys are the last), and marks the keys that stay.  Every
 * head keeps as many keys as the others, so the cache stays one row a key.
 * docs/contract.md ("Cache policies") states the same rules for users.
 */
#ifndef ATTN_SEQUENCE_POLICY_H
#define ATTN_SEQUENCE_POLICY_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SEQUENCE_POLICY_FULL = 0,   /* nothing evicted */
    SEQUENCE_POLICY_WINDOW,     /* the first `sink` keys and the last `window` */
    SEQUENCE_POLICY_H2O,        /* the last `recent`, the rest of `budget` by received_total */
    SEQUENCE_POLICY_SNAPKV,     /* chosen from the prompt's last `window` queries, + window */
    SEQUENCE_POLICY_COUNT
} sequence_policy_kind;

/* A policy and its sizes (those of another policy are 0). */
typedef struct sequence_policy {
    sequence_policy_kind kind;
    size_t sink, window, budget, recent, pool;
    int compare_full;           /* a full cache is kept beside, to measure the policy's damage */
} sequence_policy;

/* The policies' names as the wire gives them ("full", "window", "h2o", "snapkv"). */
extern const char *const sequence_policy_names[SEQUENCE_POLICY_COUNT];

/* Whether the policy ever evicts (every one but full). */
int sequence_policy_evicts(const sequence_policy *p);

/* SnapKV: positions below this stay for good once the prompt of n keys was trimmed (the
 * prompt's keys before its observation window). */
int64_t sequence_policy_snap_boundary(const sequence_policy *p, size_t prompt_keys);

/* Marks in keep ([head][key], heads x n) the keys that stay after a step.
 * positions: [head][key], ascending in each head; appended: keys ever appended, the
 * step's included.  scores ([head][key]): H2O's received_total after the step;
 * SnapKV's prompt (prompt non-zero): the observation window's attention summed over its
 * queries (pooled here); NULL for the others.  snap_boundary: SnapKV's after the prompt.
 * Returns the keys each head keeps, or SIZE_MAX when scores are needed and absent or
 * memory ran out. */
size_t sequence_policy_keep(const sequence_policy *p, size_t heads, size_t n,
                            const int64_t *positions, int64_t appended, const double *scores,
                            int prompt, int64_t snap_boundary, unsigned char *keep);

#endif

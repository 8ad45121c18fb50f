/*
 * policy.c - the eviction policies' rules: which keys stay after a step.
 *
 * Ties are broken towards the earlier position, so that a rule gives one
 * answer whatever order a sort would leave equal scores in.  A step that
 * brings one key past the budget evicts one, the usual case of a
 * generation: then the key to go is found by a scan (O(n)) rather than a
 * sort.
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

const char *const sequence_policy_names[SEQUENCE_POLICY_COUNT] = {"full", "window", "h2o",
                                                                  "snapkv"};

/* Evictions up to which the keys to go are found by scans rather than a sort. */
#define POLICY_SCAN_EVICTIONS 4

int sequence_policy_evicts(const sequence_policy *p)
{
    return p->kind != SEQUENCE_POLICY_FULL;
}

int64_t sequence_policy_snap_boundary(const sequence_policy *p, size_t prompt_keys)
{
    return prompt_keys > p->window ? (int64_t)(prompt_keys - p->window) : 0;
}

typedef struct scored {
    double score;
    size_t at;
} scored;

/* Higher scores first; of equal ones, the earlier position. */
static int by_score(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Marks in keep the `want` of the c candidates with the highest scores (ties: the
 * earlier stays), the others 0.  Returns 0 or -1 (out of memory). */
static int keep_top(const double *s, size_t c, size_t want, unsigned char *keep)
{
    if (want >= c) {
        memset(keep, 1, c);
        return 0;
    }
    if (c - want <= POLICY_SCAN_EVICTIONS) {
        memset(keep, 1, c);
        for (size_t e = 0; e < c - want; e++) {
            size_t low = SIZE_MAX;
            for (size_t j = 0; j < c; j++)      /* <=: of equal ones the later goes */
                if (keep[j] && (low == SIZE_MAX || s[j] <= s[low]))
                    low = j;
            keep[low] = 0;
        }
        return 0;
    }
    scored *order = mem_malloc(c * sizeof *order);
    if (order == NULL)
        return -1;
    for (size_t j = 0; j < c; j++)
        order[j] = (scored){s[j], j};
    qsort(order, c, sizeof *order, by_score);
    memset(keep, 0, c);
    for (size_t r = 0; r < want; r++)
        keep[order[r].at] = 1;
    mem_free(order);
    return 0;
}

/* SnapKV's pooling: each of the c scores replaced by the largest within pool/2 of it
 * (among the c). */
static void max_pool(const double *s, size_t c, size_t pool, double *out)
{
    size_t half = pool / 2;
    for (size_t j = 0; j < c; j++) {
        size_t from = j > half ? j - half : 0, to = j + half < c ? j + half : c - 1;
        double m = s[from];
        for (size_t i = from + 1; i <= to; i++)
            m = s[i] > m ? s[i] : m;
        out[j] = m;
    }
}

size_t sequence_policy_keep(const sequence_policy *p, size_t heads, size_t n,
                            const int64_t *positions, int64_t appended, const double *scores,
                            int prompt, int64_t snap_boundary, unsigned char *keep)
{
    double *pooled = NULL;
    if (p->kind == SEQUENCE_POLICY_H2O || (p->kind == SEQUENCE_POLICY_SNAPKV && prompt)) {
        if (scores == NULL)
            return SIZE_MAX;
        if (p->kind == SEQUENCE_POLICY_SNAPKV && (pooled = mem_malloc(n ? n * sizeof *pooled
                                                                        : 1)) == NULL)
            return SIZE_MAX;
    }
    size_t kept = SIZE_MAX;
    for (size_t h = 0; h < heads; h++) {
        const int64_t *pos = positions + h * n;
        unsigned char *k = keep + h * n;
        const double *s = scores != NULL ? scores + h * n : NULL;
        switch (p->kind) {
        case SEQUENCE_POLICY_FULL:
            memset(k, 1, n);
            break;
        case SEQUENCE_POLICY_WINDOW:
            for (size_t j = 0; j < n; j++)
                k[j] = pos[j] < (int64_t)p->sink || pos[j] >= appended - (int64_t)p->window;
            break;
        case SEQUENCE_POLICY_H2O: {
            /* the last `recent` keys are the last rows: a key is never evicted while recent */
            size_t recent = n < p->recent ? n : p->recent, c = n - recent;
            memset(k + c, 1, recent);
            if (keep_top(s, c, n > p->budget ? p->budget - p->recent : c, k) != 0)
                goto fail;
            break;
        }
        case SEQUENCE_POLICY_SNAPKV:
            if (prompt) {
                /* the candidates are the keys before the observation window */
                size_t c = 0;
                while (c < n && pos[c] < snap_boundary)
                    c++;
                memset(k + c, 1, n - c);
                if (c > 0) {
                    max_pool(s, c, p->pool, pooled);
                    if (keep_top(pooled, c, p->budget - p->window, k) != 0)
                        goto fail;
                }
            } else {
                for (size_t j = 0; j < n; j++)
                    k[j] = pos[j] < snap_boundary || pos[j] >= appended - (int64_t)p->window;
            }
            break;
        default:
            goto fail;
        }
        size_t count = 0;
        for (size_t j = 0; j < n; j++)
            count += k[j];
        if (kept != SIZE_MAX && count != kept)
            goto fail;                  /* the rules keep as many in every head */
        kept = count;
    }
    mem_free(pooled);
    return heads > 0 ? kept : 0;
fail:
    mem_free(pooled);
    return SIZE_MAX;
}

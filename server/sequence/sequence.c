/*
 * sequence.c - the table of live sequences, their caches, turns and expiry.
 *
 * One mutex guards the table and every sequence's turn counters; a step
 * holds no lock while it computes, only its turn.  Turns are tickets: a
 * step takes the next ticket of its sequence and waits (on the table's
 * condition variable) until that ticket is served, so the steps of a
 * sequence run in the order they arrived at the table, not in whatever
 * order a mutex would wake them.  A sequence removed from the table (ended,
 * expired, or a start that failed) is freed by the last step that holds or
 * waits for it; a step that finds it removed when its turn comes answers
 * sequence_unknown.  A start on a live id keeps the object and empties it in
 * its turn, so the steps already waiting stay in order behind it.
 *
 * A cache grows by doubling its room (at most to --max-sequence-keys), so
 * appending a key costs O(d) amortised, and every byte of room is reserved
 * in the memory budget before it is allocated.  The attention totals (and
 * the positions, under a policy) are kept [key][head], so that growing
 * moves nothing but the copy.  A policy's trim (policy.h) moves each head's
 * kept keys down its own columns, in place; the full cache kept beside for
 * compare_full only grows.
 */
#include "sequence.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/budget.h"
#include "core/compute.h"
#include "core/mem.h"
#include "metrics/metrics.h"

/* Keys and values, and for the policy's cache their totals and positions. */
typedef struct kv_cache {
    size_t length, room;        /* keys committed; keys the arrays hold */
    void *keys, *values;        /* room x dk and room x dv, float or double */
    double *received;           /* room x heads, [key][head]; the full cache: NULL */
    int64_t *positions;         /* room x heads, [key][head], under an evicting policy */
} kv_cache;

struct sequence {
    sequence_id id;
    sequence_shape shape;
    kv_cache cache;             /* what the steps' queries see */
    kv_cache full;              /* every key, beside an evicting policy's with compare_full */
    int64_t appended;           /* keys ever committed: the next key's position */
    int64_t snap_boundary;      /* SnapKV's, set by the prompt's commit */
    size_t reserved;            /* bytes reserved in the budget for the arrays */
    unsigned long next_ticket, serving;
    int users;                  /* steps holding or waiting for a turn */
    int removed;                /* out of the table: freed by its last user */
    double idle_since;          /* compute_now() when its last step ended */
    sequence *next;             /* the table's list */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t turn;        /* a turn was served, or a sequence removed */
    pthread_cond_t wake;        /* the sweeper's */
    sequence_limits limits;
    sequence *head;
    size_t live;
    int sweeper_running, stopping;
    pthread_t sweeper;
} table = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
           {1024, 300, 1 << 20}, NULL, 0, 0, 0, 0};

size_t sequence_full_key_bytes(const sequence_shape *shape)
{
    size_t esize = shape->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    return (shape->dk + shape->dv) * esize;
}

size_t sequence_key_bytes(const sequence_shape *shape)
{
    return sequence_full_key_bytes(shape) + shape->heads * sizeof(double) +
           (sequence_policy_evicts(&shape->policy) ? shape->heads * sizeof(int64_t) : 0);
}

/* Whether s keeps a full cache beside its policy's. */
static int has_full(const sequence *s)
{
    return sequence_policy_evicts(&s->shape.policy) && s->shape.policy.compare_full;
}

static int same_id(const sequence_id *a, const sequence_id *b)
{
    return a->is_string == b->is_string &&
           (a->is_string ? strcmp(a->string, b->string) == 0 : a->number == b->number);
}

void sequence_id_words(const sequence_id *id, char *buf, size_t len)
{
    if (id->is_string)
        snprintf(buf, len, "\"%s\"", id->string);
    else
        snprintf(buf, len, "%llu", (unsigned long long)id->number);
}

/* Frees the arrays of s and hands back their reservation; the metrics
 * follow.  With the table lock held or with s out of every other hand. */
static void empty_cache(sequence *s)
{
    metrics_sequence_bytes(-(long long)(s->cache.length * sequence_key_bytes(&s->shape) +
                                        s->full.length * sequence_full_key_bytes(&s->shape)));
    kv_cache *caches[2] = {&s->cache, &s->full};
    for (int i = 0; i < 2; i++) {
        mem_free(caches[i]->keys);
        mem_free(caches[i]->values);
        mem_free(caches[i]->received);
        mem_free(caches[i]->positions);
        memset(caches[i], 0, sizeof *caches[i]);
    }
    budget_release(s->reserved);
    s->reserved = 0;
    s->appended = s->snap_boundary = 0;
}

/* Takes s out of the table (lock held); its last user frees it. */
static void unlink_locked(sequence *s)
{
    for (sequence **p = &table.head; *p != NULL; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    s->removed = 1;
    table.live--;
    metrics_sequences_live(-1);
    pthread_cond_broadcast(&table.turn);
}

static void free_sequence(sequence *s)
{
    empty_cache(s);
    mem_free(s);
}

size_t sequence_live(void)
{
    pthread_mutex_lock(&table.lock);
    size_t n = table.live;
    pthread_mutex_unlock(&table.lock);
    return n;
}

void sequence_init(const sequence_limits *limits)
{
    sequence_shutdown();
    pthread_mutex_lock(&table.lock);
    table.limits = *limits;
    pthread_mutex_unlock(&table.lock);
}

void sequence_shutdown(void)
{
    pthread_mutex_lock(&table.lock);
    int running = table.sweeper_running;
    table.stopping = 1;
    pthread_cond_broadcast(&table.wake);
    pthread_mutex_unlock(&table.lock);
    if (running)
        pthread_join(table.sweeper, NULL);
    pthread_mutex_lock(&table.lock);
    table.sweeper_running = 0;
    table.stopping = 0;
    /* no step runs any more: every sequence is the table's alone */
    while (table.head != NULL) {
        sequence *s = table.head;
        unlink_locked(s);
        free_sequence(s);
    }
    pthread_mutex_unlock(&table.lock);
}

size_t sequence_sweep(double now)
{
    size_t dropped = 0;
    pthread_mutex_lock(&table.lock);
    sequence **p = &table.head;
    while (*p != NULL) {
        sequence *s = *p;
        if (s->users == 0 && now - s->idle_since >= table.limits.idle_timeout) {
            unlink_locked(s);       /* moves *p on */
            free_sequence(s);
            metrics_sequence_dropped(METRICS_SEQ_IDLE);
            dropped++;
        } else {
            p = &s->next;
        }
    }
    pthread_mutex_unlock(&table.lock);
    return dropped;
}

static void *sweeper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&table.lock);
    while (!table.stopping) {
        /* a tenth of the timeout, between 50 ms and 1 s */
        double wait = table.limits.idle_timeout / 10;
        wait = wait < 0.05 ? 0.05 : wait > 1 ? 1 : wait;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + (long)(wait * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&table.wake, &table.lock, &until);
        if (table.stopping)
            break;
        pthread_mutex_unlock(&table.lock);
        sequence_sweep(compute_now());
        pthread_mutex_lock(&table.lock);
    }
    pthread_mutex_unlock(&table.lock);
    return NULL;
}

int sequence_sweeper_start(void)
{
    pthread_mutex_lock(&table.lock);
    int rc = table.sweeper_running ? 0 : pthread_create(&table.sweeper, NULL, sweeper_main, NULL);
    if (rc == 0)
        table.sweeper_running = 1;
    pthread_mutex_unlock(&table.lock);
    return rc == 0 ? 0 : -1;
}

static sequence *find_locked(const sequence_id *id)
{
    for (sequence *s = table.head; s != NULL; s = s->next)
        if (same_id(&s->id, id))
            return s;
    return NULL;
}

static int unknown(const sequence_id *id, const char *field, attn_error *err)
{
    char words[SEQUENCE_ID_MAX + 8];
    sequence_id_words(id, words, sizeof words);
    return error_set(err, ERR_BAD_REQUEST, "sequence_unknown", field,
                     "The server holds no sequence %s: it was never started, it ended, it was "
                     "idle past --sequence-idle-timeout, or the server restarted; start it again "
                     "with sequence_start and send its keys from the first.", words);
}

int sequence_acquire(const sequence_id *id, int start, const sequence_shape *shape,
                     const char *id_field, sequence **out, attn_error *err)
{
    *out = NULL;
    pthread_mutex_lock(&table.lock);
    sequence *s = find_locked(id);
    if (s == NULL && !start) {
        pthread_mutex_unlock(&table.lock);
        return unknown(id, id_field, err);
    }
    if (s == NULL) {
        if (table.live >= table.limits.max_sequences) {
            size_t max = table.limits.max_sequences;
            pthread_mutex_unlock(&table.lock);
            metrics_sequence_refused(METRICS_SEQ_LIMIT_SEQUENCES);
            return error_set(err, ERR_TOO_MANY, "too_many_sequences", id_field,
                             "The server holds %zu sequences, its limit (--max-sequences); "
                             "end one with sequence_end, or retry once idle ones expire.", max);
        }
        s = mem_calloc(1, sizeof *s);
        if (s == NULL) {
            pthread_mutex_unlock(&table.lock);
            return error_nomem(err);
        }
        s->id = *id;
        s->shape = *shape;
        s->next = table.head;
        table.head = s;
        table.live++;
        metrics_sequences_live(1);
    }
    unsigned long ticket = s->next_ticket++;
    s->users++;
    while (s->serving != ticket && !s->removed)
        pthread_cond_wait(&table.turn, &table.lock);
    if (s->removed) {
        /* ended or expired while this step waited: it is as if it came after */
        s->serving++;
        int last = --s->users == 0;
        pthread_cond_broadcast(&table.turn);
        pthread_mutex_unlock(&table.lock);
        if (last)
            free_sequence(s);
        return unknown(id, id_field, err);
    }
    if (start && (s->cache.length > 0 || s->cache.room > 0 || s->full.room > 0)) {
        /* started over: the cache goes, the new shape holds */
        empty_cache(s);
        metrics_sequence_dropped(METRICS_SEQ_RESTARTED);
    }
    if (start)
        s->shape = *shape;
    pthread_mutex_unlock(&table.lock);
    *out = s;
    return 0;
}

void sequence_release(sequence *s, int drop)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&table.lock);
    if (drop && !s->removed)
        unlink_locked(s);
    s->serving++;
    s->idle_since = compute_now();
    int last = --s->users == 0 && s->removed;
    pthread_cond_broadcast(&table.turn);
    pthread_mutex_unlock(&table.lock);
    if (last)
        free_sequence(s);
}

const sequence_shape *sequence_shape_of(const sequence *s)
{
    return &s->shape;
}

size_t sequence_length(const sequence *s)
{
    return s->cache.length;
}

int64_t sequence_appended(const sequence *s)
{
    return s->appended;
}

size_t sequence_full_length(const sequence *s)
{
    return s->full.length;
}

int64_t sequence_snap_boundary(const sequence *s)
{
    return s->snap_boundary;
}

/* Grows an array of `room` rows of `row` bytes to `grown` rows, keeping
 * the first `used`.  Returns 0 or -1 (the array unchanged). */
static int grow(void **a, size_t used, size_t row, size_t grown)
{
    void *p = mem_malloc(grown * row);
    if (p == NULL)
        return -1;
    if (used > 0)
        memcpy(p, *a, used * row);
    mem_free(*a);
    *a = p;
    return 0;
}

/* Grows c to `room` keys (the arrays of s's shape it has: totals and positions where
 * `scored`), keeping what is committed.  Returns 0, or -1 with c as it was: an array
 * that grew before another failed keeps its larger room unused (and uncounted) until
 * the sequence goes, every array still holding the committed keys. */
static int grow_cache(kv_cache *c, const sequence_shape *sh, int scored, size_t room)
{
    size_t esize = sh->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    int rc = grow(&c->keys, c->length, sh->dk * esize, room);
    if (rc == 0)
        rc = grow(&c->values, c->length, sh->dv * esize, room);
    if (rc == 0 && scored)
        rc = grow((void **)&c->received, c->length, sh->heads * sizeof(double), room);
    if (rc == 0 && scored && sequence_policy_evicts(&sh->policy))
        rc = grow((void **)&c->positions, c->length, sh->heads * sizeof(int64_t), room);
    if (rc == 0)
        c->room = room;
    return rc;
}

/* The room that holds need keys: the old room doubled as often as it takes, at most max. */
static size_t room_for(size_t room, size_t need, size_t max)
{
    room = room < 16 ? 16 : room;
    while (room < need)
        room = room > max / 2 ? max : room * 2;
    return room;
}

/* Grows c (scored: the policy's cache) to hold need keys, the growth reserved in the
 * budget first.  Returns 0 or a negative ERR_* code with err filled, c as it was. */
static int reserve_cache(sequence *s, kv_cache *c, int scored, size_t need, attn_error *err)
{
    if (need <= c->room)
        return 0;
    size_t room = room_for(c->room, need, table.limits.max_keys);
    size_t more = (room - c->room) * (scored ? sequence_key_bytes(&s->shape)
                                             : sequence_full_key_bytes(&s->shape));
    if (budget_reserve(more) != 0) {
        int later = budget_could_fit(more);
        metrics_sequence_refused(METRICS_SEQ_LIMIT_MEMORY);
        return error_set(err, later ? ERR_UNAVAILABLE : ERR_TOO_LARGE,
                         later ? "overloaded" : "request_too_large", NULL,
                         "Growing the sequence's %scache to %zu keys needs %zu MiB more, more "
                         "than the server's memory budget (--max-memory) %s.",
                         scored ? "" : "full ", room, more >> 20,
                         later ? "has free now; retry shortly" : "holds");
    }
    if (grow_cache(c, &s->shape, scored, room) != 0) {
        budget_release(more);
        return error_nomem(err);
    }
    s->reserved += more;
    return 0;
}

int sequence_reserve(sequence *s, size_t t, attn_error *err)
{
    size_t max = table.limits.max_keys;
    int full = has_full(s);
    size_t longest = full ? s->full.length : s->cache.length;
    if (t > max || longest > max - t) {
        metrics_sequence_refused(METRICS_SEQ_LIMIT_KEYS);
        return error_set(err, ERR_TOO_LARGE, "sequence_too_long", NULL,
                         "The sequence would %s %zu keys, more than the server's limit of %zu "
                         "(--max-sequence-keys); end it, or start it again with fewer.",
                         full ? "hold (in its full cache, for compare_full)" : "cache",
                         longest + (t > max ? max : t), max);
    }
    int rc = reserve_cache(s, &s->cache, 1, s->cache.length + t, err);
    if (rc == 0 && full)
        rc = reserve_cache(s, &s->full, 0, s->full.length + t, err);
    return rc;
}

void *sequence_keys(sequence *s)
{
    return s->cache.keys;
}

void *sequence_values(sequence *s)
{
    return s->cache.values;
}

void *sequence_full_keys(sequence *s)
{
    return has_full(s) ? s->full.keys : NULL;
}

void *sequence_full_values(sequence *s)
{
    return has_full(s) ? s->full.values : NULL;
}

void sequence_positions(const sequence *s, size_t t, int64_t *out)
{
    size_t h = s->shape.heads, len = s->cache.length, n = len + t;
    for (size_t c = 0; c < h; c++) {
        for (size_t j = 0; j < len; j++)
            out[c * n + j] = s->cache.positions != NULL ? s->cache.positions[j * h + c]
                                                        : (int64_t)j;
        for (size_t j = 0; j < t; j++)
            out[c * n + len + j] = s->appended + (int64_t)j;
    }
}

/* Keeps in each head's columns of c only the keys keep marks ([head][key], n keys),
 * moved down in order; returns how many stay. */
static size_t trim(kv_cache *c, const sequence_shape *sh, size_t n, const unsigned char *keep)
{
    size_t esize = sh->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    size_t h = sh->heads, kw = sh->dk / h * esize, vw = sh->dv / h * esize, kept = 0;
    unsigned char *keys = c->keys, *values = c->values;
    for (size_t head = 0; head < h; head++) {
        size_t to = 0;
        for (size_t j = 0; j < n; j++) {
            if (!keep[head * n + j])
                continue;
            if (to != j) {
                memcpy(keys + to * sh->dk * esize + head * kw,
                       keys + j * sh->dk * esize + head * kw, kw);
                memcpy(values + to * sh->dv * esize + head * vw,
                       values + j * sh->dv * esize + head * vw, vw);
                c->received[to * h + head] = c->received[j * h + head];
                c->positions[to * h + head] = c->positions[j * h + head];
            }
            to++;
        }
        kept = to;
    }
    return kept;
}

void sequence_commit(sequence *s, size_t t, const double *received, const unsigned char *keep)
{
    kv_cache *c = &s->cache;
    size_t h = s->shape.heads, n = c->length + t;
    for (size_t j = c->length; j < n; j++)
        for (size_t head = 0; head < h; head++) {
            c->received[j * h + head] = 0;
            if (c->positions != NULL)
                c->positions[j * h + head] = s->appended + (int64_t)(j - c->length);
        }
    if (received != NULL)
        for (size_t head = 0; head < h; head++)
            for (size_t j = 0; j < n; j++)
                c->received[j * h + head] += received[head * n + j];
    if (s->appended == 0 && s->shape.policy.kind == SEQUENCE_POLICY_SNAPKV)
        s->snap_boundary = sequence_policy_snap_boundary(&s->shape.policy, n);
    s->appended += (int64_t)t;
    size_t before = c->length;
    c->length = keep != NULL && c->positions != NULL ? trim(c, &s->shape, n, keep) : n;
    if (has_full(s))
        s->full.length += t;
    metrics_sequence_bytes(((long long)c->length - (long long)before) *
                               (long long)sequence_key_bytes(&s->shape) +
                           (has_full(s) ? (long long)(t * sequence_full_key_bytes(&s->shape))
                                        : 0));
    if (n > c->length)
        metrics_sequence_evicted(n - c->length);
    metrics_sequence_step();
}

void sequence_received_total(const sequence *s, double *out, size_t stride)
{
    size_t h = s->shape.heads, n = s->cache.length;
    for (size_t c = 0; c < h; c++)
        for (size_t j = 0; j < n; j++)
            out[c * stride + j] = s->cache.received[j * h + c];
}

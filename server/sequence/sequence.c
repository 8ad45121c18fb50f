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
 * in the memory budget before it is allocated.  The attention totals are
 * kept [key][head], so that growing moves nothing but the realloc's copy.
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

struct sequence {
    sequence_id id;
    sequence_shape shape;
    size_t length, room;        /* keys committed; keys the arrays hold */
    void *keys, *values;        /* room x dk and room x dv, float or double */
    double *received;           /* room x heads, [key][head] */
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

size_t sequence_key_bytes(const sequence_shape *shape)
{
    size_t esize = shape->dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    return (shape->dk + shape->dv) * esize + shape->heads * sizeof(double);
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
    mem_free(s->keys);
    mem_free(s->values);
    mem_free(s->received);
    s->keys = s->values = NULL;
    s->received = NULL;
    metrics_sequence_bytes(-(long long)(s->length * sequence_key_bytes(&s->shape)));
    budget_release(s->reserved);
    s->reserved = 0;
    s->length = s->room = 0;
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
    if (start && (s->length > 0 || s->room > 0)) {
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
    return s->length;
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

int sequence_reserve(sequence *s, size_t t, attn_error *err)
{
    size_t max = table.limits.max_keys;
    if (t > max || s->length > max - t) {
        metrics_sequence_refused(METRICS_SEQ_LIMIT_KEYS);
        return error_set(err, ERR_TOO_LARGE, "sequence_too_long", NULL,
                         "The sequence would cache %zu keys, more than the server's limit of %zu "
                         "(--max-sequence-keys); end it, or start it again with fewer.",
                         s->length + (t > max ? max : t), max);
    }
    size_t need = s->length + t;
    if (need <= s->room)
        return 0;
    size_t room = s->room < 16 ? 16 : s->room;
    while (room < need)
        room = room > max / 2 ? max : room * 2;
    size_t per_key = sequence_key_bytes(&s->shape);
    size_t more = (room - s->room) * per_key;
    if (budget_reserve(more) != 0) {
        int later = budget_could_fit(more);
        metrics_sequence_refused(METRICS_SEQ_LIMIT_MEMORY);
        return error_set(err, later ? ERR_UNAVAILABLE : ERR_TOO_LARGE,
                         later ? "overloaded" : "request_too_large", NULL,
                         "Growing the sequence's cache to %zu keys needs %zu MiB more, more than "
                         "the server's memory budget (--max-memory) %s.", room, more >> 20,
                         later ? "has free now; retry shortly" : "holds");
    }
    size_t esize = s->shape.dtype == ATTN_FLOAT32 ? sizeof(float) : sizeof(double);
    /* each array keeps what is committed; rows past it are the step's to write */
    void *keys = s->keys, *values = s->values, *received = s->received;
    int rc = grow(&keys, s->length, s->shape.dk * esize, room);
    if (rc == 0)
        rc = grow(&values, s->length, s->shape.dv * esize, room);
    if (rc == 0)
        rc = grow(&received, s->length, s->shape.heads * sizeof(double), room);
    s->keys = keys;
    s->values = values;
    s->received = received;
    if (rc != 0) {
        /* an array that grew before another failed keeps its room unused (and
         * uncounted) until the sequence goes: every array still holds the
         * committed keys, and the room stays what all of them have */
        budget_release(more);
        return error_nomem(err);
    }
    s->room = room;
    s->reserved += more;
    return 0;
}

void *sequence_keys(sequence *s)
{
    return s->keys;
}

void *sequence_values(sequence *s)
{
    return s->values;
}

void sequence_commit(sequence *s, size_t t, const double *received)
{
    size_t h = s->shape.heads, n = s->length + t;
    for (size_t j = s->length; j < n; j++)
        for (size_t c = 0; c < h; c++)
            s->received[j * h + c] = 0;
    if (received != NULL)
        for (size_t c = 0; c < h; c++)
            for (size_t j = 0; j < n; j++)
                s->received[j * h + c] += received[c * n + j];
    s->length = n;
    metrics_sequence_bytes((long long)(t * sequence_key_bytes(&s->shape)));
    metrics_sequence_step();
}

void sequence_received_total(const sequence *s, double *out, size_t stride)
{
    size_t h = s->shape.heads, n = s->length;
    for (size_t c = 0; c < h; c++)
        for (size_t j = 0; j < n; j++)
            out[c * stride + j] = s->received[j * h + c];
}

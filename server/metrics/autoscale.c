/*
 * autoscale.c - the signals an autoscaler follows: how long attention
 * requests wait, how long they compute, how large they are, and how busy
 * the compute slots and the queues are now.
 *
 * Histograms (labels model and protocol):
 *   attention_queue_wait_seconds   waiting for a worker and for a first
 *                                  compute slot
 *   attention_compute_seconds      the computation's own time
 *   attention_request_size_bytes   the request's body as received
 * Gauges:
 *   attention_compute_slots_busy       compute slots taken now
 *   attention_requests_queued          requests waiting for a worker or for a
 *                                      first compute slot
 *   attention_estimated_wait_seconds   how long a request arriving now would
 *                                      wait (estimate_wait below)
 *
 * A request is counted when its handler ends (metrics_attention_observe),
 * whichever protocol brought it.  The (model, protocol) pairs live in a small
 * table; past AUTOSCALE_SERIES pairs new ones count under the model
 * "_other", so a client naming many sets cannot grow the page without
 * bound, and a model's pairs leave it when its last weight set is gone
 * (model_holds.c), so that deleted sets do not fill it.  One mutex guards
 * the table and the completion counters.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/compute.h"
#include "metrics.h"
#include "metrics_internal.h"

#define AUTOSCALE_SERIES 64

/* Seconds: from half a millisecond to a minute (a request waits at most
 * --queue-wait-ms for a worker and computes at most --deadline). */
static const double time_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                     0.25,   0.5,   1,      2.5,   5,    10,    30,    60};
#define TIME_BUCKETS (sizeof time_bounds / sizeof time_bounds[0])
/* Bytes: powers of four from 256 B to 256 MiB. */
static const double size_bounds[] = {256,     1024,     4096,      16384,     65536,     262144,
                                     1048576, 4194304,  16777216,  67108864,  268435456};
#define SIZE_BUCKETS (sizeof size_bounds / sizeof size_bounds[0])

typedef struct histogram {
    unsigned long buckets[TIME_BUCKETS + 1]; /* the larger of the two sets, +Inf last */
    double sum;
    unsigned long count;
} histogram;

typedef struct series {
    char model[72];             /* a set name is at most 64 bytes (weights.h) */
    char protocol[16];
    histogram queue_wait, compute, size;
} series;

static pthread_mutex_t autoscale_lock = PTHREAD_MUTEX_INITIALIZER;
static series table[AUTOSCALE_SERIES];
static size_t table_used;
/* Computations finished in the current whole second of the monotonic clock
 * and in the one before: the rate at which a queue drains. */
static long done_second;
static unsigned long done_now, done_before;
static double compute_ewma;  /* seconds, of recent computations */
static atomic_long queued_for_worker;

static void histogram_add(histogram *h, const double *bounds, size_t n, double v)
{
    size_t b = 0;
    while (b < n && v > bounds[b])
        b++;
    h->buckets[b]++;
    h->sum += v;
    h->count++;
}

/* The series of (model, protocol), made when new; the "_other" series of
 * the protocol when the table is full (the table's last place is kept for
 * it). */
static series *series_find(const char *model, const char *protocol)
{
    for (size_t i = 0; i < table_used; i++)
        if (!strcmp(table[i].model, model) && !strcmp(table[i].protocol, protocol))
            return &table[i];
    if (table_used + 1 >= AUTOSCALE_SERIES && strcmp(model, "_other") != 0)
        return series_find("_other", protocol);
    if (table_used == AUTOSCALE_SERIES)
        return &table[AUTOSCALE_SERIES - 1];
    series *s = &table[table_used++];
    snprintf(s->model, sizeof s->model, "%s", model);
    snprintf(s->protocol, sizeof s->protocol, "%s", protocol);
    return s;
}

void autoscale_forget(const char *name)
{
    pthread_mutex_lock(&autoscale_lock);
    size_t kept = 0;
    for (size_t i = 0; i < table_used; i++)
        if (strcmp(table[i].model, name) != 0)
            table[kept++] = table[i];
    memset(&table[kept], 0, (table_used - kept) * sizeof table[0]);
    table_used = kept;
    pthread_mutex_unlock(&autoscale_lock);
}

void metrics_attention_observe(const char *model, const char *protocol, double queue_wait,
                               double compute, size_t request_bytes)
{
    if (model == NULL || model[0] == '\0')
        model = "_unknown";
    if (protocol == NULL || protocol[0] == '\0')
        protocol = "unknown";
    double now = compute_now();
    pthread_mutex_lock(&autoscale_lock);
    series *s = series_find(model, protocol);
    histogram_add(&s->queue_wait, time_bounds, TIME_BUCKETS, queue_wait > 0 ? queue_wait : 0);
    histogram_add(&s->size, size_bounds, SIZE_BUCKETS, (double)request_bytes);
    if (compute >= 0) {
        histogram_add(&s->compute, time_bounds, TIME_BUCKETS, compute);
        long second = (long)now;
        if (second != done_second) {
            done_before = second == done_second + 1 ? done_now : 0;
            done_now = 0;
            done_second = second;
        }
        done_now++;
        compute_ewma = compute_ewma == 0 ? compute : 0.8 * compute_ewma + 0.2 * compute;
    }
    pthread_mutex_unlock(&autoscale_lock);
}

void metrics_queue_add(int delta)
{
    atomic_fetch_add(&queued_for_worker, delta);
}

/* How long a request arriving now would wait before it computes: the
 * requests ahead of it (those queued, and one more when every compute slot
 * is taken) divided by the rate at which computations finished over the
 * last one to two seconds.  When none finished in that time (computations
 * longer than that), the requests ahead times the recent mean computation
 * time: as if they ran one after another, an upper estimate.  Under
 * autoscale_lock. */
static double estimate_wait(unsigned long queued, unsigned busy, unsigned slots, double now)
{
    unsigned long ahead = queued + (busy >= slots ? 1 : 0);
    if (ahead == 0)
        return 0;
    long second = (long)now;
    double elapsed = now - (double)second; /* into the current second */
    unsigned long done = 0;
    if (second == done_second)
        done = done_now + done_before;
    else if (second == done_second + 1)
        done = done_now;
    double window = second == done_second ? 1.0 + elapsed : elapsed;
    if (done > 0 && window > 0.05)
        return (double)ahead * window / (double)done;
    return (double)ahead * compute_ewma;
}

static void put_labels(jw_buf *w, const series *s)
{
    jw_raw(w, "{model=\"");
    jw_raw(w, s->model);    /* set names and protocols need no escaping (weights.h) */
    jw_raw(w, "\",protocol=\"");
    jw_raw(w, s->protocol);
    jw_char(w, '"');
}

static void render_histogram(jw_buf *w, const char *name, const char *help, size_t which,
                             const double *bounds, size_t n)
{
    jw_raw(w, "# HELP ");
    jw_raw(w, name);
    jw_char(w, ' ');
    jw_raw(w, help);
    jw_raw(w, "\n# TYPE ");
    jw_raw(w, name);
    jw_raw(w, " histogram\n");
    for (size_t i = 0; i < table_used; i++) {
        const series *s = &table[i];
        const histogram *h = which == 0 ? &s->queue_wait : which == 1 ? &s->compute : &s->size;
        unsigned long cumulative = 0;
        for (size_t b = 0; b <= n; b++) {
            cumulative += h->buckets[b];
            jw_raw(w, name);
            jw_raw(w, "_bucket");
            put_labels(w, s);
            jw_raw(w, ",le=\"");
            if (b < n)
                jw_double(w, bounds[b]);
            else
                jw_raw(w, "+Inf");
            jw_raw(w, "\"} ");
            jw_size(w, cumulative);
            jw_char(w, '\n');
        }
        jw_raw(w, name);
        jw_raw(w, "_sum");
        put_labels(w, s);
        jw_raw(w, "} ");
        jw_double(w, h->sum);
        jw_char(w, '\n');
        jw_raw(w, name);
        jw_raw(w, "_count");
        put_labels(w, s);
        jw_raw(w, "} ");
        jw_size(w, h->count);
        jw_char(w, '\n');
    }
}

void autoscale_render(jw_buf *w)
{
    unsigned busy, waiting, slots;
    compute_slot_usage(&busy, &waiting, &slots);
    long q = atomic_load(&queued_for_worker);
    unsigned long queued = (q > 0 ? (unsigned long)q : 0) + waiting;
    double now = compute_now();
    pthread_mutex_lock(&autoscale_lock);
    render_histogram(w, "attention_queue_wait_seconds",
                     "Time attention requests waited for a worker and for a first compute slot.",
                     0, time_bounds, TIME_BUCKETS);
    render_histogram(w, "attention_compute_seconds",
                     "Time attention requests computed, without the waits.", 1, time_bounds,
                     TIME_BUCKETS);
    render_histogram(w, "attention_request_size_bytes",
                     "Bodies of attention requests, in bytes as received.", 2, size_bounds,
                     SIZE_BUCKETS);
    double wait = estimate_wait(queued, busy, slots, now);
    pthread_mutex_unlock(&autoscale_lock);
    jw_raw(w, "# HELP attention_compute_slots_busy Compute slots taken now, of "
              "--compute-threads.\n# TYPE attention_compute_slots_busy gauge\n"
              "attention_compute_slots_busy ");
    jw_size(w, busy);
    jw_raw(w, "\n# HELP attention_compute_slots Compute slots in all (--compute-threads).\n"
              "# TYPE attention_compute_slots gauge\nattention_compute_slots ");
    jw_size(w, slots);
    jw_raw(w, "\n# HELP attention_requests_queued Requests waiting for a worker or for a first "
              "compute slot now.\n# TYPE attention_requests_queued gauge\n"
              "attention_requests_queued ");
    jw_size(w, queued);
    jw_raw(w, "\n# HELP attention_estimated_wait_seconds Estimated wait of a request arriving "
              "now: the requests ahead of it over the recent rate of finished computations.\n"
              "# TYPE attention_estimated_wait_seconds gauge\nattention_estimated_wait_seconds ");
    jw_double(w, wait);
    jw_char(w, '\n');
}

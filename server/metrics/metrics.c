/*
 * metrics.c - counters behind GET /metrics.
 *
 * One mutex guards fixed-size tables (requests by route and status code,
 * a latency histogram by route, byte totals) and the store's last sync;
 * the requests in flight, the answering paths and the slow closes are
 * atomic counters.  Observation is a few additions, cheap next to any
 * request's work.
 */
#include "metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/compute.h"
#include "json/jsonw.h"
#include "metrics_internal.h"

#define STATUS_SLOTS 600

static const double bucket_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                       0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define BUCKETS (sizeof bucket_bounds / sizeof bucket_bounds[0])

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long requests[ROUTE_COUNT][STATUS_SLOTS];
static unsigned long buckets[ROUTE_COUNT][BUCKETS + 1];
static double duration_sum[ROUTE_COUNT];
static unsigned long duration_count[ROUTE_COUNT];
static unsigned long long bytes_in_total, bytes_out_total;
static atomic_long inflight;
static atomic_long grpc_inflight;
static atomic_long grpc_watches;
static atomic_ulong path_counts[PATH_COUNT];
static atomic_ulong slow_closed;
static atomic_ulong static_compressed;
static const char *const path_labels[PATH_COUNT] = {"inline", "worker", "deferred"};
static int store_observed;
static double store_last_ok;        /* monotonic seconds */
static size_t store_sets, store_bytes;
static unsigned long long store_sync_errors, store_syncs;

static atomic_long seq_live;
static atomic_llong seq_bytes;
static atomic_ulong seq_steps, seq_evicted;
static atomic_ulong seq_dropped[METRICS_SEQ_DROP_COUNT];
static atomic_ulong seq_refused[METRICS_SEQ_LIMIT_COUNT];
static const char *const seq_drop_labels[METRICS_SEQ_DROP_COUNT] = {"idle_timeout", "restarted"};
static const char *const seq_limit_labels[METRICS_SEQ_LIMIT_COUNT] = {
    "max_sequences", "max_sequence_keys", "memory"};

void metrics_sequences_live(long delta)
{
    atomic_fetch_add(&seq_live, delta);
}

void metrics_sequence_bytes(long long delta)
{
    atomic_fetch_add(&seq_bytes, delta);
}

void metrics_sequence_step(void)
{
    atomic_fetch_add(&seq_steps, 1);
}

void metrics_sequence_evicted(size_t keys)
{
    atomic_fetch_add(&seq_evicted, keys);
}

void metrics_sequence_dropped(metrics_seq_drop why)
{
    atomic_fetch_add(&seq_dropped[why], 1);
}

void metrics_sequence_refused(metrics_seq_limit which)
{
    atomic_fetch_add(&seq_refused[which], 1);
}

static void put_ulong(jw_buf *w, unsigned long long v);

/* One sample a label of a counter: head is the series' name and its label's opening. */
static void put_labelled(jw_buf *w, const char *head, const char *const *labels,
                         atomic_ulong *counts, int n)
{
    for (int i = 0; i < n; i++) {
        jw_raw(w, head);
        jw_raw(w, labels[i]);
        jw_raw(w, "\"} ");
        put_ulong(w, atomic_load(&counts[i]));
    }
}

/* The sequences' series. */
static void render_sequences(jw_buf *w)
{
    jw_raw(w, "\n# HELP attn_sequences_live Sequences whose key/value cache the server holds.\n"
              "# TYPE attn_sequences_live gauge\nattn_sequences_live ");
    put_ulong(w, (unsigned long long)atomic_load(&seq_live));
    jw_raw(w, "\n# HELP attn_sequence_cached_bytes Bytes the sequences' cached keys hold "
              "(keys, values and attention totals).\n# TYPE attn_sequence_cached_bytes gauge\n"
              "attn_sequence_cached_bytes ");
    put_ulong(w, (unsigned long long)atomic_load(&seq_bytes));
    jw_raw(w, "\n# HELP attn_sequence_steps_total Sequence steps computed and kept.\n"
              "# TYPE attn_sequence_steps_total counter\nattn_sequence_steps_total ");
    put_ulong(w, atomic_load(&seq_steps));
    jw_raw(w, "\n# HELP attn_sequence_evicted_keys_total Keys the sequences' cache policies "
              "evicted (a key counts once in all its heads).\n"
              "# TYPE attn_sequence_evicted_keys_total counter\nattn_sequence_evicted_keys_total ");
    put_ulong(w, atomic_load(&seq_evicted));
    jw_raw(w, "\n# HELP attn_sequences_dropped_total Sequences dropped without sequence_end: "
              "idle past --sequence-idle-timeout, or emptied by a sequence_start on their id.\n"
              "# TYPE attn_sequences_dropped_total counter");
    put_labelled(w, "\nattn_sequences_dropped_total{reason=\"", seq_drop_labels, seq_dropped,
                 METRICS_SEQ_DROP_COUNT);
    jw_raw(w, "\n# HELP attn_sequence_refusals_total Sequence steps refused by a limit.\n"
              "# TYPE attn_sequence_refusals_total counter");
    put_labelled(w, "\nattn_sequence_refusals_total{limit=\"", seq_limit_labels, seq_refused,
                 METRICS_SEQ_LIMIT_COUNT);
}

void metrics_store_observe(int ok, size_t sets, size_t bytes)
{
    double now = compute_now();
    pthread_mutex_lock(&metrics_lock);
    store_observed = 1;
    if (ok) {
        store_last_ok = now;
        store_syncs++;
    } else {
        store_sync_errors++;
    }
    store_sets = sets;
    store_bytes = bytes;
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_observe(route_id id, int status, double seconds, size_t bytes_in,
                     size_t bytes_out)
{
    if (id >= ROUTE_COUNT)
        id = ROUTE_OTHER;
    if (status < 0 || status >= STATUS_SLOTS)
        status = 0;
    pthread_mutex_lock(&metrics_lock);
    requests[id][status]++;
    size_t b = 0;
    while (b < BUCKETS && seconds > bucket_bounds[b])
        b++;
    buckets[id][b]++;
    duration_sum[id] += seconds;
    duration_count[id]++;
    bytes_in_total += bytes_in;
    bytes_out_total += bytes_out;
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_path_observe(metrics_path path)
{
    if (path < PATH_COUNT)
        atomic_fetch_add(&path_counts[path], 1);
}

void metrics_inflight_add(int delta)
{
    atomic_fetch_add(&inflight, delta);
}

void metrics_grpc_inflight_add(int delta)
{
    atomic_fetch_add(&grpc_inflight, delta);
    atomic_fetch_add(&inflight, delta);
}

void metrics_grpc_watches_add(int delta)
{
    atomic_fetch_add(&grpc_watches, delta);
}

long metrics_inflight(void)
{
    return atomic_load(&inflight);
}

void metrics_slow_closed_add(void)
{
    atomic_fetch_add(&slow_closed, 1);
}

void metrics_static_compressed_add(void)
{
    atomic_fetch_add(&static_compressed, 1);
}

static void put_ulong(jw_buf *w, unsigned long long v)
{
    jw_size(w, (size_t)v);
}

char *metrics_render(size_t *len)
{
    jw_buf w;
    jw_init(&w, 4096);
    pthread_mutex_lock(&metrics_lock);
    jw_raw(&w, "# HELP attn_http_requests_total HTTP requests answered, by route and status.\n"
               "# TYPE attn_http_requests_total counter\n");
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int s = 0; s < STATUS_SLOTS; s++)
            if (requests[r][s]) {
                jw_raw(&w, "attn_http_requests_total{route=\"");
                jw_raw(&w, route_label((route_id)r));
                jw_raw(&w, "\",code=\"");
                jw_size(&w, (size_t)s);
                jw_raw(&w, "\"} ");
                put_ulong(&w, requests[r][s]);
                jw_char(&w, '\n');
            }
    jw_raw(&w, "# HELP attn_http_request_duration_seconds Time from first byte to answer.\n"
               "# TYPE attn_http_request_duration_seconds histogram\n");
    for (int r = 0; r < ROUTE_COUNT; r++) {
        if (!duration_count[r])
            continue;
        unsigned long cumulative = 0;
        for (size_t b = 0; b <= BUCKETS; b++) {
            cumulative += buckets[r][b];
            jw_raw(&w, "attn_http_request_duration_seconds_bucket{route=\"");
            jw_raw(&w, route_label((route_id)r));
            jw_raw(&w, "\",le=\"");
            if (b < BUCKETS)
                jw_double(&w, bucket_bounds[b]);
            else
                jw_raw(&w, "+Inf");
            jw_raw(&w, "\"} ");
            put_ulong(&w, cumulative);
            jw_char(&w, '\n');
        }
        jw_raw(&w, "attn_http_request_duration_seconds_sum{route=\"");
        jw_raw(&w, route_label((route_id)r));
        jw_raw(&w, "\"} ");
        jw_double(&w, duration_sum[r]);
        jw_raw(&w, "\nattn_http_request_duration_seconds_count{route=\"");
        jw_raw(&w, route_label((route_id)r));
        jw_raw(&w, "\"} ");
        put_ulong(&w, duration_count[r]);
        jw_char(&w, '\n');
    }
    jw_raw(&w, "# HELP attn_http_request_bytes_total Request body bytes received.\n"
               "# TYPE attn_http_request_bytes_total counter\nattn_http_request_bytes_total ");
    put_ulong(&w, bytes_in_total);
    jw_raw(&w, "\n# HELP attn_http_response_bytes_total Response body bytes sent.\n"
               "# TYPE attn_http_response_bytes_total counter\nattn_http_response_bytes_total ");
    put_ulong(&w, bytes_out_total);
    if (store_observed) {
        jw_raw(&w, "\n# HELP attn_store_last_sync_age_seconds Seconds since the weight-set "
                   "store (the data directory or the bucket) was last scanned successfully.\n"
                   "# TYPE attn_store_last_sync_age_seconds gauge\nattn_store_last_sync_age_seconds ");
        jw_double(&w, compute_now() - store_last_ok);
        jw_raw(&w, "\n# HELP attn_store_sets Weight sets loaded.\n"
                   "# TYPE attn_store_sets gauge\nattn_store_sets ");
        jw_size(&w, store_sets);
        jw_raw(&w, "\n# HELP attn_store_bytes Bytes of the weight-set files loaded.\n"
                   "# TYPE attn_store_bytes gauge\nattn_store_bytes ");
        jw_size(&w, store_bytes);
        jw_raw(&w, "\n# HELP attn_store_sync_errors_total Scans of the weight-set store "
                   "that failed.\n# TYPE attn_store_sync_errors_total counter\n"
                   "attn_store_sync_errors_total ");
        put_ulong(&w, store_sync_errors);
        jw_raw(&w, "\n# HELP attn_store_syncs_total Scans of the weight-set store that "
                   "worked (each a listing request with --store-url).\n"
                   "# TYPE attn_store_syncs_total counter\nattn_store_syncs_total ");
        put_ulong(&w, store_syncs);
    }
    pthread_mutex_unlock(&metrics_lock);
    render_sequences(&w);
    jw_raw(&w, "\n# HELP attn_http_dispatch_total Requests with work to do, by where they were "
               "answered: inline (on the I/O thread that read them), worker, or deferred (to a "
               "worker, after the I/O thread found them not small).\n"
               "# TYPE attn_http_dispatch_total counter");
    for (int p = 0; p < PATH_COUNT; p++) {
        jw_raw(&w, "\nattn_http_dispatch_total{path=\"");
        jw_raw(&w, path_labels[p]);
        jw_raw(&w, "\"} ");
        put_ulong(&w, atomic_load(&path_counts[p]));
    }
    jw_raw(&w, "\n# HELP attn_http_inflight_requests Requests being received or answered now.\n"
               "# TYPE attn_http_inflight_requests gauge\nattn_http_inflight_requests ");
    long now = metrics_inflight();
    jw_size(&w, now > 0 ? (size_t)now : 0);
    jw_raw(&w, "\n# HELP attn_grpc_inflight_calls gRPC inferences received and not yet "
               "answered.\n# TYPE attn_grpc_inflight_calls gauge\nattn_grpc_inflight_calls ");
    long calls = atomic_load(&grpc_inflight);
    jw_size(&w, calls > 0 ? (size_t)calls : 0);
    jw_raw(&w, "\n# HELP attn_grpc_health_watches grpc.health.v1 Health/Watch calls open now.\n"
               "# TYPE attn_grpc_health_watches gauge\nattn_grpc_health_watches ");
    long watches = atomic_load(&grpc_watches);
    jw_size(&w, watches > 0 ? (size_t)watches : 0);
    jw_raw(&w, "\n# HELP attn_http_slow_connections_closed_total Connections closed for delivering "
               "their headers or body too slowly (--header-timeout, --min-body-rate).\n"
               "# TYPE attn_http_slow_connections_closed_total counter\n"
               "attn_http_slow_connections_closed_total ");
    put_ulong(&w, atomic_load(&slow_closed));
    jw_raw(&w, "\n# HELP attn_http_static_compressions_total Static bodies (the visualizer's "
               "files) compressed for answers; each is compressed once per coding and kept.\n"
               "# TYPE attn_http_static_compressions_total counter\n"
               "attn_http_static_compressions_total ");
    put_ulong(&w, atomic_load(&static_compressed));
    jw_char(&w, '\n');
    autoscale_render(&w);
    return jw_finish(&w, len);
}

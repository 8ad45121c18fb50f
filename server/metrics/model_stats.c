/*
 * model_stats.c - the table of per-model statistics (see model_stats.h);
 * an entry is dropped when its model's last weight set is (model_holds.c).
 */
#include "model_stats.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "metrics_internal.h"

typedef struct entry {
    char *name;
    model_stats stats;
} entry;

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static size_t entry_count, entry_cap;

/* The entry of name, made when absent; NULL when memory runs out.  Called
 * under stats_lock. */
static model_stats *find(const char *name, int create)
{
    for (size_t i = 0; i < entry_count; i++)
        if (!strcmp(entries[i].name, name))
            return &entries[i].stats;
    if (!create)
        return NULL;
    if (entry_count == entry_cap) {
        size_t cap = entry_cap ? 2 * entry_cap : 16;
        entry *grown = mem_realloc(entries, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        entries = grown;
        entry_cap = cap;
    }
    size_t len = strlen(name) + 1;
    char *copy = mem_malloc(len);
    if (copy == NULL)
        return NULL;
    memcpy(copy, name, len);
    entries[entry_count].name = copy;
    memset(&entries[entry_count].stats, 0, sizeof entries[entry_count].stats);
    return &entries[entry_count++].stats;
}

static void add(model_stats_timing *t, double seconds)
{
    t->count++;
    t->ns += seconds > 0 ? (uint64_t)(seconds * 1e9 + 0.5) : 0;
}

void model_stats_computed(model_stats_sample *s, double start, double ran, double compute_ms)
{
    s->infer = compute_ms / 1000.0;
    double wait = ran - start - s->infer;
    if (wait > 0)
        s->queue += wait;
}

void model_stats_success(const char *model, const model_stats_sample *s)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    pthread_mutex_lock(&stats_lock);
    model_stats *m = find(model, 1);
    if (m != NULL) {
        m->last_inference_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
        m->inference_count += s->batch;
        m->execution_count++;
        add(&m->success, s->queue + s->input + s->infer + s->output);
        add(&m->queue, s->queue);
        add(&m->compute_input, s->input);
        add(&m->compute_infer, s->infer);
        add(&m->compute_output, s->output);
    }
    pthread_mutex_unlock(&stats_lock);
}

void model_stats_failure(const char *model, double seconds)
{
    pthread_mutex_lock(&stats_lock);
    model_stats *m = find(model, 1);
    if (m != NULL)
        add(&m->fail, seconds);
    pthread_mutex_unlock(&stats_lock);
}

void model_stats_forget(const char *name)
{
    pthread_mutex_lock(&stats_lock);
    for (size_t i = 0; i < entry_count; i++)
        if (!strcmp(entries[i].name, name)) {
            mem_free(entries[i].name);
            entries[i] = entries[--entry_count];
            break;
        }
    pthread_mutex_unlock(&stats_lock);
}

void model_stats_get(const char *model, model_stats *out)
{
    pthread_mutex_lock(&stats_lock);
    model_stats *m = find(model, 0);
    if (m != NULL)
        *out = *m;
    else
        memset(out, 0, sizeof *out);
    pthread_mutex_unlock(&stats_lock);
}

/*
 * v2_stats.c - Triton's statistics and repository index (see v2_stats.h).
 */
#include "v2_stats.h"

#include "v2_internal.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "message/answer.h"
#include "json/jsonw.h"
#include "metrics/model_stats.h"
#include "request/attention_request.h"
#include "store/store.h"

static void write_u64(jw_buf *w, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    jw_raw(w, text);
}

static void write_timing(jw_buf *w, const char *name, const model_stats_timing *t)
{
    jw_char(w, '"');
    jw_raw(w, name);
    jw_raw(w, "\":{\"count\":");
    write_u64(w, t->count);
    jw_raw(w, ",\"ns\":");
    write_u64(w, t->ns);
    jw_char(w, '}');
}

/* One entry of model_stats.  The models take no batch dimension
 * (max_batch_size 0 in their config), so, as Triton does for such models,
 * every execution is listed under batch size 1; there is no response cache,
 * so cache_hit and cache_miss stay 0. */
static void write_model(jw_buf *w, const api_meta_model *m)
{
    const model_stats *s = &m->stats;
    static const model_stats_timing none = {0, 0};
    jw_raw(w, "{\"name\":");
    jw_string(w, m->name);
    jw_raw(w, ",\"version\":\"" V2_MODEL_VERSION "\",\"last_inference\":");
    write_u64(w, s->last_inference_ms);
    jw_raw(w, ",\"inference_count\":");
    write_u64(w, s->inference_count);
    jw_raw(w, ",\"execution_count\":");
    write_u64(w, s->execution_count);
    jw_raw(w, ",\"inference_stats\":{");
    write_timing(w, "success", &s->success);
    jw_char(w, ',');
    write_timing(w, "fail", &s->fail);
    jw_char(w, ',');
    write_timing(w, "queue", &s->queue);
    jw_char(w, ',');
    write_timing(w, "compute_input", &s->compute_input);
    jw_char(w, ',');
    write_timing(w, "compute_infer", &s->compute_infer);
    jw_char(w, ',');
    write_timing(w, "compute_output", &s->compute_output);
    jw_char(w, ',');
    write_timing(w, "cache_hit", &none);
    jw_char(w, ',');
    write_timing(w, "cache_miss", &none);
    jw_raw(w, "},\"batch_stats\":[");
    if (s->execution_count > 0) {
        jw_raw(w, "{\"batch_size\":1,");
        write_timing(w, "compute_input", &s->compute_input);
        jw_char(w, ',');
        write_timing(w, "compute_infer", &s->compute_infer);
        jw_char(w, ',');
        write_timing(w, "compute_output", &s->compute_output);
        jw_char(w, '}');
    }
    jw_raw(w, "]}");
}

static void write_index_entry(jw_buf *w, const api_meta_model *m)
{
    jw_raw(w, "{\"name\":");
    jw_string(w, m->name);
    jw_raw(w, ",\"version\":\"" V2_MODEL_VERSION "\",\"state\":\"READY\",\"reason\":\"\"}");
}

/* Lists into a the one model named (model not NULL) or "attention" and every stored
 * set, each with its statistics when stats.  Returns 0, or -1 when memory runs out. */
static int list_models(const char *model, int stats, const api_env *env, api_meta_answer *a)
{
    weight_set **sets = NULL;
    size_t count = 0;
    attn_error err;
    if (model == NULL && store_list(env->store, &sets, &count, &err) != 0)
        return -1;
    a->models = mem_malloc((count + 1) * sizeof *a->models);
    if (a->models == NULL) {
        store_list_free(sets, count);
        return -1;
    }
    const char *first = model != NULL ? model : ATTENTION_MODEL_BUILTIN;
    snprintf(a->models[0].name, sizeof a->models[0].name, "%s", first);
    a->n_models = 1;
    for (size_t i = 0; i < count; i++)
        if (strcmp(sets[i]->name, ATTENTION_MODEL_BUILTIN) != 0) /* hidden by the built-in */
            snprintf(a->models[a->n_models++].name, sizeof a->models[0].name, "%s",
                     sets[i]->name);
    store_list_free(sets, count);
    for (size_t i = 0; stats && i < a->n_models; i++)
        model_stats_get(a->models[i].name, &a->models[i].stats);
    return 0;
}

/* Answers the list of kind (API_META_STATS: one model, or every model when model is
 * NULL; API_META_INDEX: every model) into resp->meta, and its JSON body, open, each model
 * written by each, close, unless the front-end writes its own (fields_only). */
static void answer_models(const api_request *req, api_meta_kind kind, const char *model,
                          const char *open, void (*each)(jw_buf *, const api_meta_model *),
                          const char *close, const api_env *env, api_response *resp)
{
    api_meta_answer *a = &resp->meta;
    if (list_models(model, kind == API_META_STATS, env, a) != 0) {
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    a->kind = kind;
    a->model_version = V2_MODEL_VERSION;
    if (req->fields_only) {
        resp->status = 200;
        return;
    }
    jw_buf w;
    jw_init(&w, 1024);
    jw_raw(&w, open);
    for (size_t i = 0; i < a->n_models; i++) {
        if (i)
            jw_char(&w, ',');
        each(&w, &a->models[i]);
    }
    jw_raw(&w, close);
    /* the list was for the body: an HTTP answer holds nothing beside it */
    mem_free(a->models);
    a->models = NULL;
    a->n_models = 0;
    answer_jw(resp, 200, &w);
}

void v2_stats_answer(const api_request *req, const char *model, const api_env *env,
                     api_response *resp)
{
    answer_models(req, API_META_STATS, model, "{\"model_stats\":[", write_model, "]}", env,
                  resp);
}

void v2_repository_index(const api_request *req, const api_env *env, api_response *resp)
{
    answer_models(req, API_META_INDEX, NULL, "[", write_index_entry, "]", env, resp);
}

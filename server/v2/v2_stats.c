/*
 * v2_stats.c - Triton's statistics and repository index (see v2_stats.h).
 */
#include "v2_stats.h"

#include <stdio.h>
#include <string.h>

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
static void write_model(jw_buf *w, const char *name)
{
    model_stats s;
    model_stats_get(name, &s);
    static const model_stats_timing none = {0, 0};
    jw_raw(w, "{\"name\":");
    jw_string(w, name);
    jw_raw(w, ",\"version\":\"1\",\"last_inference\":");
    write_u64(w, s.last_inference_ms);
    jw_raw(w, ",\"inference_count\":");
    write_u64(w, s.inference_count);
    jw_raw(w, ",\"execution_count\":");
    write_u64(w, s.execution_count);
    jw_raw(w, ",\"inference_stats\":{");
    write_timing(w, "success", &s.success);
    jw_char(w, ',');
    write_timing(w, "fail", &s.fail);
    jw_char(w, ',');
    write_timing(w, "queue", &s.queue);
    jw_char(w, ',');
    write_timing(w, "compute_input", &s.compute_input);
    jw_char(w, ',');
    write_timing(w, "compute_infer", &s.compute_infer);
    jw_char(w, ',');
    write_timing(w, "compute_output", &s.compute_output);
    jw_char(w, ',');
    write_timing(w, "cache_hit", &none);
    jw_char(w, ',');
    write_timing(w, "cache_miss", &none);
    jw_raw(w, "},\"batch_stats\":[");
    if (s.execution_count > 0) {
        jw_raw(w, "{\"batch_size\":1,");
        write_timing(w, "compute_input", &s.compute_input);
        jw_char(w, ',');
        write_timing(w, "compute_infer", &s.compute_infer);
        jw_char(w, ',');
        write_timing(w, "compute_output", &s.compute_output);
        jw_char(w, '}');
    }
    jw_raw(w, "]}");
}

/* Writes "attention" and every stored set through each(w, name), separated
 * by commas.  Returns 0, or -1 when memory runs out. */
static int each_model(const api_env *env, jw_buf *w, void (*each)(jw_buf *, const char *))
{
    weight_set **sets = NULL;
    size_t count = 0;
    attn_error err;
    if (store_list(env->store, &sets, &count, &err) != 0)
        return -1;
    each(w, ATTENTION_MODEL_BUILTIN);
    for (size_t i = 0; i < count; i++) {
        if (!strcmp(sets[i]->name, ATTENTION_MODEL_BUILTIN))
            continue; /* hidden by the built-in model */
        jw_char(w, ',');
        each(w, sets[i]->name);
    }
    store_list_free(sets, count);
    return 0;
}

/* Answers open, then one model (model not NULL) or every model written by
 * each, then close. */
static void answer_models(const char *open, const char *model,
                          void (*each)(jw_buf *, const char *), const char *close,
                          const api_env *env, api_response *resp)
{
    jw_buf w;
    jw_init(&w, 1024);
    jw_raw(&w, open);
    if (model != NULL) {
        each(&w, model);
    } else if (each_model(env, &w, each) != 0) {
        jw_discard(&w);
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    jw_raw(&w, close);
    answer_jw(resp, 200, &w);
}

void v2_stats_answer(const char *model, const api_env *env, api_response *resp)
{
    answer_models("{\"model_stats\":[", model, write_model, "]}\n", env, resp);
}

static void write_index_entry(jw_buf *w, const char *name)
{
    jw_raw(w, "{\"name\":");
    jw_string(w, name);
    jw_raw(w, ",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"}");
}

void v2_repository_index(const api_env *env, api_response *resp)
{
    answer_models("[", NULL, write_index_entry, "]\n", env, resp);
}

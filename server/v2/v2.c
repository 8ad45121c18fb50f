/*
 * v2.c - the models of the Open Inference Protocol v2 and the answers that
 * are not inference: server and model metadata, liveness, readiness, the
 * model configuration, and the repository's load and unload.
 *
 * A model is either the built-in "attention" (q, k, v, optional mask) or a
 * stored weight set (x, optional context and mask), held by reference for
 * the whole request.  Inference itself is v2_infer.c (the request) and
 * v2_answer.c (the answer).
 */
#include "v2_internal.h"

#include <stdio.h>
#include <string.h>

#include "message/answer.h"
#include "v2_stats.h"
#include "core/version.h"
#include "kernel/weights.h"

#define V2_PLATFORM "attention-server"
/* The float datatypes of the numeric inputs and of parameters.output_datatype
 * (v2_datatype_float); a tensor's metadata declares FP32, the first. */
#define V2_FLOAT_DATATYPES "FP32,FP64,FP16,BF16"


/* ---- models ------------------------------------------------------------ */

int v2_model_open(const api_env *env, const route_args *args, v2_model *m, attn_error *err)
{
    memset(m, 0, sizeof *m);
    if (args->version[0] && strcmp(args->version, V2_MODEL_VERSION) != 0)
        return error_set(err, ERR_NOT_FOUND, "unknown_version", "version",
                         "Model \"%.64s\" has no version \"%.32s\"; its only version is \"%s\".",
                         args->model, args->version, V2_MODEL_VERSION);
    if (!strcmp(args->model, ATTENTION_MODEL_BUILTIN)) {
        m->name = ATTENTION_MODEL_BUILTIN;
        return 0;
    }
    if (weights_valid_name(args->model))
        m->set = store_get(env->store, args->model);
    if (m->set == NULL)
        return error_set(err, ERR_NOT_FOUND, "unknown_model", "model",
                         "There is no model \"%.64s\": the models are \"attention\" and the "
                         "stored weight sets (GET /v1/weight-sets).", args->model);
    m->name = m->set->name;
    return 0;
}

void v2_model_close(v2_model *m)
{
    weightset_release(m->set);
    m->set = NULL;
}

/* The reductions of the weights (kernel/attention_reduce.h), answered when the request's
 * parameters ask for them: per query (received: per key), top-k k per query; with the head
 * axis `heads` in front when a set has one (0: none); then a sequence's outputs.  Written
 * from out[n]; returns the new count. */
static size_t reduction_tensors(api_meta_tensor *out, size_t n, long heads)
{
    static const char *const names[] = {"entropy", "max_weight", "argmax", "received",
                                        "sink", "local", "topk_indices", "topk_weights"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *type = !strcmp(names[i], "argmax") || !strcmp(names[i], "topk_indices")
                               ? "INT64" : "FP32";
        int topk = !strncmp(names[i], "topk", 4);
        api_meta_tensor t = {names[i], type, 1 + topk, {-1, -1, 0}, 0};
        if (heads > 0) {
            t.rank++;
            t.dims[0] = heads;
        }
        out[n++] = t;
    }
    /* a sequence's step (request/sequence_step.h): the totals per cached key, the length;
     * under a cache policy the kept keys' positions, with compare_full per query the weight
     * the full cache puts on the evicted keys and the output's error */
    static const char *const seq_names[] = {"received_total", "kept_positions", "lost_mass",
                                            "output_error"};
    for (size_t i = 0; i < sizeof seq_names / sizeof seq_names[0]; i++) {
        api_meta_tensor t = {seq_names[i], i == 1 ? "INT64" : "FP32", 1, {-1, 0, 0}, 0};
        if (heads > 0)
            t = (api_meta_tensor){seq_names[i], t.datatype, 2, {heads, -1, 0}, 0};
        out[n++] = t;
        if (i == 0)
            out[n++] = (api_meta_tensor){"length", "INT64", 1, {1, 0, 0}, 0};
    }
    return n;
}

/* The inputs and outputs of m, as metadata and config describe them. */
static size_t model_tensors(const v2_model *m, api_meta_tensor *in, size_t *n_in,
                            api_meta_tensor *out)
{
    if (m->set == NULL) {
        static const char *const names[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++)
            in[i] = (api_meta_tensor){names[i], "FP32", 2, {-1, -1, 0}, 0};
        in[3] = (api_meta_tensor){"mask", "BOOL", 2, {-1, -1, 0}, 1};
        *n_in = 4;
        out[0] = (api_meta_tensor){"output", "FP32", 2, {-1, -1, 0}, 0};
        out[1] = (api_meta_tensor){"attention", "FP32", 2, {-1, -1, 0}, 0};
        return reduction_tensors(out, 2, 0);
    }
    const attn_weights *w = &m->set->w;
    in[0] = (api_meta_tensor){"x", "FP32", 2, {-1, (long)w->d_in, 0}, 0};
    in[1] = (api_meta_tensor){"context", "FP32", 2, {-1, (long)w->d_ctx, 0}, 1};
    in[2] = (api_meta_tensor){"mask", "BOOL", 2, {-1, -1, 0}, 1};
    *n_in = 3;
    out[0] = (api_meta_tensor){"output", "FP32", 2, {-1, (long)w->d_out, 0}, 0};
    if (m->set->heads > 0)
        out[1] = (api_meta_tensor){"attention", "FP32", 3, {(long)m->set->heads, -1, -1}, 0};
    else
        out[1] = (api_meta_tensor){"attention", "FP32", 2, {-1, -1, 0}, 0};
    return reduction_tensors(out, 2, (long)m->set->heads);
}

static void write_dims(jw_buf *w, const api_meta_tensor *t)
{
    jw_char(w, '[');
    for (int i = 0; i < t->rank; i++) {
        char num[24];
        snprintf(num, sizeof num, "%s%ld", i ? "," : "", t->dims[i]);
        jw_raw(w, num);
    }
    jw_char(w, ']');
}

static void write_meta_tensors(jw_buf *w, const api_meta_tensor *t, size_t n)
{
    jw_char(w, '[');
    for (size_t i = 0; i < n; i++) {
        jw_raw(w, i ? ",{\"name\":" : "{\"name\":");
        jw_string(w, t[i].name);
        jw_raw(w, ",\"datatype\":");
        jw_string(w, t[i].datatype);
        jw_raw(w, ",\"shape\":");
        write_dims(w, &t[i]);
        jw_char(w, '}');
    }
    jw_char(w, ']');
}

static void write_config_tensors(jw_buf *w, const api_meta_tensor *t, size_t n)
{
    jw_char(w, '[');
    for (size_t i = 0; i < n; i++) {
        jw_raw(w, i ? ",{\"name\":" : "{\"name\":");
        jw_string(w, t[i].name);
        jw_raw(w, ",\"data_type\":");
        jw_string(w, api_meta_config_type(t[i].datatype));
        jw_raw(w, ",\"dims\":");
        write_dims(w, &t[i]);
        if (t[i].optional)
            jw_raw(w, ",\"optional\":true");
        jw_char(w, '}');
    }
    jw_char(w, ']');
}

/* Opens the model the path names into m; answers the 404 into resp and
 * returns -1 when there is none. */
static int open_or_answer(const api_request *req, const api_env *env, v2_model *m,
                          api_response *resp)
{
    attn_error err;
    if (v2_model_open(env, req->args, m, &err) == 0)
        return 0;
    answer_error(resp, &err);
    return -1;
}

/* The model's metadata (config 0) or its Triton-style configuration (1):
 * its fields in resp->meta, and the JSON body written from them unless the
 * front-end writes its own (fields_only). */
static void answer_model(const api_request *req, const api_env *env, int config,
                         api_response *resp)
{
    v2_model m;
    if (open_or_answer(req, env, &m, resp) != 0)
        return;
    api_meta_answer *a = &resp->meta;
    a->kind = config ? API_META_CONFIG : API_META_MODEL;
    snprintf(a->name, sizeof a->name, "%s", m.name);
    a->platform = V2_PLATFORM;
    a->model_version = V2_MODEL_VERSION;
    a->n_outputs = model_tensors(&m, a->inputs, &a->n_inputs, a->outputs);
    a->input_datatypes = a->output_datatypes = V2_FLOAT_DATATYPES;
    v2_model_close(&m);
    if (req->fields_only) {
        resp->status = 200;
        return;
    }
    jw_buf w;
    jw_init(&w, 1024);
    jw_raw(&w, "{\"name\":");
    jw_string(&w, a->name);
    if (config) {
        jw_raw(&w, ",\"platform\":");
        jw_string(&w, a->platform);
        jw_raw(&w, ",\"max_batch_size\":0,\"input\":");
        write_config_tensors(&w, a->inputs, a->n_inputs);
        jw_raw(&w, ",\"output\":");
        write_config_tensors(&w, a->outputs, a->n_outputs);
        /* Triton's free-form parameters: what a tensor's one data_type cannot say */
        jw_raw(&w, ",\"parameters\":{\"input_datatypes\":{\"string_value\":");
        jw_string(&w, a->input_datatypes);
        jw_raw(&w, "},\"output_datatypes\":{\"string_value\":");
        jw_string(&w, a->output_datatypes);
        jw_raw(&w, "}}");
    } else {
        jw_raw(&w, ",\"versions\":[");
        jw_string(&w, a->model_version);
        jw_raw(&w, "],\"platform\":");
        jw_string(&w, a->platform);
        jw_raw(&w, ",\"inputs\":");
        write_meta_tensors(&w, a->inputs, a->n_inputs);
        jw_raw(&w, ",\"outputs\":");
        write_meta_tensors(&w, a->outputs, a->n_outputs);
    }
    jw_raw(&w, "}");
    answer_jw(resp, 200, &w);
}

void v2_handle_model(const api_request *req, const api_env *env, api_response *resp)
{
    answer_model(req, env, 0, resp);
}

void v2_handle_config(const api_request *req, const api_env *env, api_response *resp)
{
    answer_model(req, env, 1, resp);
}

void v2_handle_model_ready(const api_request *req, const api_env *env, api_response *resp)
{
    v2_model m;
    if (open_or_answer(req, env, &m, resp) != 0)
        return;
    if (env->draining) {
        v2_model_close(&m);
        answer_draining(resp);
        return;
    }
    jw_buf w;
    jw_init(&w, 64 + strlen(m.name));
    jw_raw(&w, "{\"name\":");
    jw_string(&w, m.name);
    jw_raw(&w, ",\"ready\":true}");
    v2_model_close(&m);
    answer_jw(resp, 200, &w);
}

void v2_handle_server(const api_request *req, const api_env *env, api_response *resp)
{
    (void)env;
    static const char *const extensions[] = {"binary_tensor_data", "statistics",
                                             "model_repository", "sequence",
                                             "sequence(string_id)"};
    api_meta_answer *a = &resp->meta;
    a->kind = API_META_SERVER;
    snprintf(a->name, sizeof a->name, "%s", V2_PLATFORM);
    a->version = ATTN_VERSION;
    a->extensions = extensions;
    a->n_extensions = sizeof extensions / sizeof extensions[0];
    if (req->fields_only) {
        resp->status = 200;
        return;
    }
    jw_buf w;
    jw_init(&w, 256);
    jw_raw(&w, "{\"name\":");
    jw_string(&w, a->name);
    jw_raw(&w, ",\"version\":");
    jw_string(&w, a->version);
    jw_raw(&w, ",\"extensions\":[");
    for (size_t i = 0; i < a->n_extensions; i++) {
        if (i)
            jw_char(&w, ',');
        jw_string(&w, a->extensions[i]);
    }
    jw_raw(&w, "]}");
    answer_jw(resp, 200, &w);
}

void v2_handle_live(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    (void)env;
    answer_static(resp, 200, "{\"live\":true}\n");
}

void v2_handle_ready(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    if (!env->draining) {
        answer_static(resp, 200, "{\"ready\":true}\n");
        return;
    }
    /* the protocol's readiness body, with the draining sentence of every route */
    resp->retry_after = ANSWER_DRAINING_RETRY_AFTER;
    answer_static(resp, 503, "{\"ready\":false,\"error\":\"The server is shutting down and "
                             "takes no new work; retry on another instance.\"}\n");
}

void v2_handle_stats(const api_request *req, const api_env *env, api_response *resp)
{
    if (req->args->model[0] == '\0') {     /* /v2/models/stats: every model */
        v2_stats_answer(req, NULL, env, resp);
        return;
    }
    v2_model m;
    if (open_or_answer(req, env, &m, resp) != 0)
        return;
    v2_stats_answer(req, m.name, env, resp);
    v2_model_close(&m);
}

void v2_handle_repository_index(const api_request *req, const api_env *env, api_response *resp)
{
    v2_repository_index(req, env, resp);
}

void v2_handle_repository_control(const api_request *req, const api_env *env,
                                  api_response *resp)
{
    (void)env;
    attn_error err;
    error_set(&err, ERR_BAD_REQUEST, "invalid_value", "model",
              "This server's models are \"attention\" and its stored weight sets, "
              "always loaded: store one with PUT /v1/weight-sets/%.64s and remove it "
              "with DELETE.", req->args->model);
    answer_error(resp, &err);
}

/*
 * v2.c - the routes of the Open Inference Protocol v2, its models, and the
 * answers that are not inference: server and model metadata, liveness,
 * readiness and the model configuration.
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


/* Copies one path segment (up to '/' or the end) into out; returns its end or NULL
 * when it is empty or does not fit. */
static const char *take_segment(const char *p, char *out, size_t cap)
{
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= cap)
        return NULL;
    memcpy(out, p, n);
    out[n] = '\0';
    return p + n;
}

int v2_parse_path(const char *path, v2_path *out)
{
    memset(out, 0, sizeof *out);
    if (!strcmp(path, "/v2") || !strcmp(path, "/v2/")) {
        out->kind = V2P_SERVER;
        return 1;
    }
    if (!strcmp(path, "/v2/health/live")) {
        out->kind = V2P_LIVE;
        return 1;
    }
    if (!strcmp(path, "/v2/health/ready")) {
        out->kind = V2P_READY;
        return 1;
    }
    if (!strcmp(path, "/v2/models/stats")) {
        out->kind = V2P_STATS_ALL;
        return 1;
    }
    if (!strcmp(path, "/v2/repository/index")) {
        out->kind = V2P_REPO_INDEX;
        return 1;
    }
    static const char repo[] = "/v2/repository/models/";
    if (!strncmp(path, repo, sizeof repo - 1)) {
        const char *p = take_segment(path + sizeof repo - 1, out->model, sizeof out->model);
        out->kind = V2P_REPO_CONTROL;
        return p != NULL && (!strcmp(p, "/load") || !strcmp(p, "/unload"));
    }
    static const char prefix[] = "/v2/models/";
    if (strncmp(path, prefix, sizeof prefix - 1) != 0)
        return 0;
    const char *p = take_segment(path + sizeof prefix - 1, out->model, sizeof out->model);
    if (p == NULL)
        return 0;
    if (!strncmp(p, "/versions/", 10)) {
        p = take_segment(p + 10, out->version, sizeof out->version);
        if (p == NULL)
            return 0;
    }
    if (*p == '\0')
        out->kind = V2P_MODEL;
    else if (!strcmp(p, "/ready"))
        out->kind = V2P_MODEL_READY;
    else if (!strcmp(p, "/config"))
        out->kind = V2P_CONFIG;
    else if (!strcmp(p, "/infer"))
        out->kind = V2P_INFER;
    else if (!strcmp(p, "/stats"))
        out->kind = V2P_STATS;
    else
        return 0;
    return 1;
}

int v2_route(const char *path, int *infer)
{
    v2_path vp;
    if (!v2_parse_path(path, &vp))
        return 0;
    /* The repository's paths and /v2/models/stats have rows of their own in
     * route.c, before the rows that ask here. */
    *infer = vp.kind == V2P_INFER;
    return 1;
}

/* ---- models ------------------------------------------------------------ */

int v2_model_open(const v2_env *env, const v2_path *vp, v2_model *m, attn_error *err)
{
    memset(m, 0, sizeof *m);
    if (vp->version[0] && strcmp(vp->version, V2_MODEL_VERSION) != 0)
        return error_set(err, ERR_NOT_FOUND, "unknown_version", "version",
                         "Model \"%.64s\" has no version \"%.32s\"; its only version is \"%s\".",
                         vp->model, vp->version, V2_MODEL_VERSION);
    if (!strcmp(vp->model, V2_ATTENTION_MODEL)) {
        m->name = V2_ATTENTION_MODEL;
        return 0;
    }
    if (weights_valid_name(vp->model))
        m->set = store_get(env->store, vp->model);
    if (m->set == NULL)
        return error_set(err, ERR_NOT_FOUND, "unknown_model", "model",
                         "There is no model \"%.64s\": the models are \"attention\" and the "
                         "stored weight sets (GET /v1/weight-sets).", vp->model);
    m->name = m->set->name;
    return 0;
}

void v2_model_close(v2_model *m)
{
    weightset_release(m->set);
    m->set = NULL;
}

/* One tensor of the model's metadata: dims[i] < 0 is variable. */
typedef struct v2_meta_tensor {
    const char *name;
    const char *datatype;
    int rank;
    long dims[3];
    int optional;
} v2_meta_tensor;

/* The inputs and outputs of m, as metadata and config describe them. */
static size_t model_tensors(const v2_model *m, v2_meta_tensor *in, size_t *n_in,
                            v2_meta_tensor *out)
{
    if (m->set == NULL) {
        static const char *const names[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++)
            in[i] = (v2_meta_tensor){names[i], "FP32", 2, {-1, -1, 0}, 0};
        in[3] = (v2_meta_tensor){"mask", "BOOL", 2, {-1, -1, 0}, 1};
        *n_in = 4;
        out[0] = (v2_meta_tensor){"output", "FP32", 2, {-1, -1, 0}, 0};
        out[1] = (v2_meta_tensor){"attention", "FP32", 2, {-1, -1, 0}, 0};
        return 2;
    }
    const attn_weights *w = &m->set->w;
    in[0] = (v2_meta_tensor){"x", "FP32", 2, {-1, (long)w->d_in, 0}, 0};
    in[1] = (v2_meta_tensor){"context", "FP32", 2, {-1, (long)w->d_ctx, 0}, 1};
    in[2] = (v2_meta_tensor){"mask", "BOOL", 2, {-1, -1, 0}, 1};
    *n_in = 3;
    out[0] = (v2_meta_tensor){"output", "FP32", 2, {-1, (long)w->d_out, 0}, 0};
    if (m->set->heads > 0)
        out[1] = (v2_meta_tensor){"attention", "FP32", 3, {(long)m->set->heads, -1, -1}, 0};
    else
        out[1] = (v2_meta_tensor){"attention", "FP32", 2, {-1, -1, 0}, 0};
    return 2;
}

static void write_dims(jw_buf *w, const v2_meta_tensor *t)
{
    jw_char(w, '[');
    for (int i = 0; i < t->rank; i++) {
        char num[24];
        snprintf(num, sizeof num, "%s%ld", i ? "," : "", t->dims[i]);
        jw_raw(w, num);
    }
    jw_char(w, ']');
}

static void write_meta_tensors(jw_buf *w, const v2_meta_tensor *t, size_t n)
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

static void write_config_tensors(jw_buf *w, const v2_meta_tensor *t, size_t n)
{
    jw_char(w, '[');
    for (size_t i = 0; i < n; i++) {
        jw_raw(w, i ? ",{\"name\":" : "{\"name\":");
        jw_string(w, t[i].name);
        jw_raw(w, ",\"data_type\":");
        jw_raw(w, !strcmp(t[i].datatype, "BOOL") ? "\"TYPE_BOOL\"" : "\"TYPE_FP32\"");
        jw_raw(w, ",\"dims\":");
        write_dims(w, &t[i]);
        if (t[i].optional)
            jw_raw(w, ",\"optional\":true");
        jw_char(w, '}');
    }
    jw_char(w, ']');
}

/* GET /v2/models/{m}, /ready and /config. */
static void handle_model(const v2_path *vp, const v2_env *env, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    v2_model m;
    if (v2_model_open(env, vp, &m, &err) != 0) {
        answer_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 1024);
    if (vp->kind == V2P_MODEL_READY) {
        if (env->draining) {
            v2_model_close(&m);
            jw_discard(&w);
            answer_draining(resp);
            return;
        }
        jw_raw(&w, "{\"name\":");
        jw_string(&w, m.name);
        jw_raw(&w, ",\"ready\":true}\n");
        v2_model_close(&m);
        answer_jw(resp, 200, &w);
        return;
    }
    v2_meta_tensor in[4], out[2];
    size_t n_in, n_out = model_tensors(&m, in, &n_in, out);
    jw_raw(&w, "{\"name\":");
    jw_string(&w, m.name);
    if (vp->kind == V2P_CONFIG) {
        jw_raw(&w, ",\"platform\":\"" V2_PLATFORM "\",\"max_batch_size\":0,\"input\":");
        write_config_tensors(&w, in, n_in);
        jw_raw(&w, ",\"output\":");
        write_config_tensors(&w, out, n_out);
    } else {
        jw_raw(&w, ",\"versions\":[\"" V2_MODEL_VERSION "\"],\"platform\":\"" V2_PLATFORM
                   "\",\"inputs\":");
        write_meta_tensors(&w, in, n_in);
        jw_raw(&w, ",\"outputs\":");
        write_meta_tensors(&w, out, n_out);
    }
    jw_raw(&w, "}\n");
    v2_model_close(&m);
    answer_jw(resp, 200, &w);
}

void v2_handle_get(const api_request *req, const v2_env *env, api_response *resp)
{
    v2_path vp;
    attn_error err;
    error_clear(&err);
    if (!v2_parse_path(req->path, &vp)) {
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL, "There is no endpoint %.200s.",
                  req->path);
        answer_error(resp, &err);
        return;
    }
    jw_buf w;
    switch (vp.kind) {
    case V2P_SERVER:
        jw_init(&w, 256);
        jw_raw(&w, "{\"name\":\"attention-server\",\"version\":");
        jw_string(&w, ATTN_VERSION);
        jw_raw(&w, ",\"extensions\":[\"binary_tensor_data\",\"statistics\","
                   "\"model_repository\"]}\n");
        answer_jw(resp, 200, &w);
        return;
    case V2P_LIVE:
        resp->status = 200;
        resp->body = "{\"live\":true}\n";
        break;
    case V2P_READY:
        if (env->draining) {
            /* the protocol's readiness body, with the draining sentence of every route */
            resp->status = 503;
            resp->retry_after = ANSWER_DRAINING_RETRY_AFTER;
            resp->body = "{\"ready\":false,\"error\":\"The server is shutting down and takes "
                         "no new work; retry on another instance.\"}\n";
        } else {
            resp->status = 200;
            resp->body = "{\"ready\":true}\n";
        }
        break;
    case V2P_STATS_ALL:
        v2_stats_answer(NULL, env, resp);
        return;
    case V2P_STATS: {
        v2_model m;
        if (v2_model_open(env, &vp, &m, &err) != 0) {
            answer_error(resp, &err);
            return;
        }
        v2_stats_answer(m.name, env, resp);
        v2_model_close(&m);
        return;
    }
    default:
        handle_model(&vp, env, resp);
        return;
    }
    resp->body_len = strlen(resp->body);
    resp->body_static = 1;
    resp->content_type = "application/json";
}

void v2_handle_repository(const api_request *req, const v2_env *env, api_response *resp)
{
    v2_path vp;
    attn_error err;
    error_clear(&err);
    if (!v2_parse_path(req->path, &vp) ||
        (vp.kind != V2P_REPO_INDEX && vp.kind != V2P_REPO_CONTROL))
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL, "There is no endpoint %.200s.",
                  req->path);
    else if (vp.kind == V2P_REPO_CONTROL)
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "model",
                  "This server's models are \"attention\" and its stored weight sets, "
                  "always loaded: store one with PUT /v1/weight-sets/%.64s and remove it "
                  "with DELETE.", vp.model);
    if (err.kind != 0) {
        answer_error(resp, &err);
        return;
    }
    v2_repository_index(env, resp);
}

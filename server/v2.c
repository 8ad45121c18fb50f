/*
 * v2.c - the routes and handlers of the Open Inference Protocol v2.
 *
 * A model is either the built-in "attention" (q, k, v, optional mask) or a
 * stored weight set (x, optional context and mask), held by reference for
 * the whole request.  Inference runs in the order v1 does: every input is
 * described and the shapes checked against each other and against the
 * element and memory limits before any array is allocated; then the numbers
 * are read (binary bytes copied straight into the arrays), the header's JSON
 * tree is freed, and the math runs.  Outputs are answered as JSON `data` or,
 * when asked, as binary bytes after the JSON header.
 */
#include "v2.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "admission.h"
#include "attention.h"
#include "attention_json.h"
#include "json_in.h"
#include "jsonw.h"
#include "mem.h"
#include "v2_tensor.h"
#include "version.h"
#include "weights.h"

#define V2_MODEL_VERSION "1"
#define V2_PLATFORM "attention-server"

/* Bytes a JSON-encoded output number takes at most, as on v1. */
#define V2_JSON_BYTES_PER_NUMBER 26

enum v2_kind { V2P_SERVER, V2P_LIVE, V2P_READY, V2P_MODEL, V2P_MODEL_READY, V2P_CONFIG, V2P_INFER };

typedef struct v2_path {
    enum v2_kind kind;
    char model[200];
    char version[40];       /* "" when the path names none */
} v2_path;

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

static int parse_path(const char *path, v2_path *out)
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
    else
        return 0;
    return 1;
}

int v2_route(const char *path, int *infer)
{
    v2_path vp;
    if (!parse_path(path, &vp))
        return 0;
    *infer = vp.kind == V2P_INFER;
    return 1;
}

void v2_respond_error(api_response *resp, const attn_error *err)
{
    jw_buf w;
    char text[sizeof err->field + sizeof err->message + 4];
    if (err->field[0] && strstr(err->message, err->field) == NULL)
        snprintf(text, sizeof text, "%s: %s", err->field, err->message);
    else
        snprintf(text, sizeof text, "%s", err->message);
    jw_init(&w, 64 + strlen(text));
    jw_raw(&w, "{\"error\":");
    jw_string(&w, text);
    jw_raw(&w, "}\n");
    api_response_free(resp);
    resp->status = error_http_status(err->kind);
    resp->content_type = "application/json";
    resp->inference_header_length = 0;
    if (err->kind == ERR_UNAVAILABLE && resp->retry_after == 0)
        resp->retry_after = 1;
    resp->body = jw_finish(&w, &resp->body_len);
    resp->body_static = 0;
    if (resp->body == NULL) {
        static const char nomem[] = "{\"error\":\"The server ran out of memory; retry later.\"}\n";
        resp->status = 503;
        resp->retry_after = 1;
        resp->body = (char *)nomem;
        resp->body_len = sizeof nomem - 1;
        resp->body_static = 1;
    }
}

/* Fills resp with the JSON built in w (consumed), or the out-of-memory error. */
static void respond_jw(api_response *resp, int status, jw_buf *w)
{
    resp->body = jw_finish(w, &resp->body_len);
    if (resp->body == NULL) {
        attn_error err;
        error_nomem(&err);
        v2_respond_error(resp, &err);
        return;
    }
    resp->body_static = 0;
    resp->status = status;
    resp->content_type = "application/json";
}

/* ---- models ------------------------------------------------------------ */

/* A model resolved from the path: the built-in attention, or a stored set
 * (a reference the caller drops with model_close). */
typedef struct v2_model {
    const char *name;
    weight_set *set;        /* NULL for the built-in model */
} v2_model;

static int model_open(const v2_env *env, const v2_path *vp, v2_model *m, attn_error *err)
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

static void model_close(v2_model *m)
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
    if (model_open(env, vp, &m, &err) != 0) {
        v2_respond_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 1024);
    if (vp->kind == V2P_MODEL_READY) {
        if (env->draining) {
            model_close(&m);
            jw_discard(&w);
            resp->retry_after = 5;
            error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL,
                      "The server is shutting down and takes no new work.");
            v2_respond_error(resp, &err);
            return;
        }
        jw_raw(&w, "{\"name\":");
        jw_string(&w, m.name);
        jw_raw(&w, ",\"ready\":true}\n");
        model_close(&m);
        respond_jw(resp, 200, &w);
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
    model_close(&m);
    respond_jw(resp, 200, &w);
}

void v2_handle_get(const api_request *req, const v2_env *env, api_response *resp)
{
    v2_path vp;
    attn_error err;
    error_clear(&err);
    if (!parse_path(req->path, &vp)) {
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL, "There is no endpoint %.200s.",
                  req->path);
        v2_respond_error(resp, &err);
        return;
    }
    jw_buf w;
    switch (vp.kind) {
    case V2P_SERVER:
        jw_init(&w, 256);
        jw_raw(&w, "{\"name\":\"attention-server\",\"version\":");
        jw_string(&w, ATTN_VERSION);
        jw_raw(&w, ",\"extensions\":[\"binary_tensor_data\"]}\n");
        respond_jw(resp, 200, &w);
        return;
    case V2P_LIVE:
        resp->status = 200;
        resp->body = "{\"live\":true}\n";
        break;
    case V2P_READY:
        if (env->draining) {
            resp->status = 503;
            resp->retry_after = 5;
            resp->body = "{\"ready\":false,\"error\":\"The server is shutting down and takes "
                         "no new work.\"}\n";
        } else {
            resp->status = 200;
            resp->body = "{\"ready\":true}\n";
        }
        break;
    default:
        handle_model(&vp, env, resp);
        return;
    }
    resp->body_len = strlen(resp->body);
    resp->body_static = 1;
    resp->content_type = "application/json";
}

/* ---- inference --------------------------------------------------------- */

enum { OUT_OUTPUT, OUT_ATTENTION, OUT_COUNT };
static const char *const output_names[OUT_COUNT] = {"output", "attention"};

/* The outputs asked for, in the order asked. */
typedef struct v2_outputs {
    size_t n;
    int which[OUT_COUNT];
    int binary[OUT_COUNT];
} v2_outputs;

/* Reads a boolean of obj (absent: def) named by path in errors. */
static int get_bool(const json_t *obj, const char *key, const char *path, int def, int *out,
                    attn_error *err)
{
    const json_t *v = json_object_get(obj, key);
    *out = def;
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", path, "%s is %s; it must be true or "
                         "false.", path, json_in_kind(v));
    *out = json_is_true(v);
    return 0;
}

static int decode_outputs(const json_t *root, int binary_default, v2_outputs *o,
                          attn_error *err)
{
    memset(o, 0, sizeof *o);
    const json_t *outs = json_object_get(root, "outputs");
    if (outs == NULL) {
        o->n = 2;
        o->which[0] = OUT_OUTPUT;
        o->which[1] = OUT_ATTENTION;
        o->binary[0] = o->binary[1] = binary_default;
        return 0;
    }
    if (!json_is_array(outs) || json_array_size(outs) == 0 || json_array_size(outs) > OUT_COUNT)
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "outputs",
                         "outputs must be an array of 1 or 2 objects naming \"output\" and/or "
                         "\"attention\".");
    for (size_t i = 0; i < json_array_size(outs); i++) {
        const json_t *e = json_array_get(outs, i);
        char field[64];
        snprintf(field, sizeof field, "outputs[%zu].name", i);
        const json_t *name = json_is_object(e) ? json_object_get(e, "name") : NULL;
        const char *s = json_is_string(name) ? json_string_value(name) : "";
        int which = !strcmp(s, "output") ? OUT_OUTPUT : !strcmp(s, "attention") ? OUT_ATTENTION : -1;
        if (which < 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                             "%s must be \"output\" or \"attention\" (got %s%.40s%s).", field,
                             json_is_string(name) ? "\"" : "", json_is_string(name) ? s :
                             name ? json_in_kind(name) : "nothing", json_is_string(name) ? "\"" : "");
        for (size_t j = 0; j < o->n; j++)
            if (o->which[j] == which)
                return error_set(err, ERR_BAD_REQUEST, "invalid_value", field,
                                 "%s names \"%s\" a second time.", field, s);
        int binary = binary_default;
        const json_t *params = json_object_get(e, "parameters");
        snprintf(field, sizeof field, "outputs[%zu].parameters", i);
        if (params != NULL && !json_is_object(params))
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", field, "%s must be an object.",
                             field);
        if (params != NULL) {
            snprintf(field, sizeof field, "outputs[%zu].parameters.binary_data", i);
            int rc = get_bool(params, "binary_data", field, binary_default, &binary, err);
            if (rc != 0)
                return rc;
        }
        o->which[o->n] = which;
        o->binary[o->n] = binary;
        o->n++;
    }
    return 0;
}

/* The request-level parameters: causal, scale, heads, binary_data_output. */
static int decode_parameters(const json_t *root, attention_json_request *ar, size_t *heads,
                             int *binary_output, attn_error *err)
{
    *heads = 0;
    *binary_output = 0;
    const json_t *p = json_object_get(root, "parameters");
    if (p == NULL)
        return 0;
    if (!json_is_object(p))
        return error_set(err, ERR_BAD_REQUEST, "wrong_type", "parameters",
                         "parameters is %s; it must be an object.", json_in_kind(p));
    int rc, causal;
    if ((rc = get_bool(p, "causal", "parameters.causal", 0, &causal, err)) != 0 ||
        (rc = get_bool(p, "binary_data_output", "parameters.binary_data_output", 0, binary_output,
                       err)) != 0)
        return rc;
    ar->job.causal = causal;
    const json_t *h = json_object_get(p, "heads");
    if (h != NULL) {
        double hv;
        if (!json_in_whole(h, 1, 65536, &hv))
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", "parameters.heads",
                             "parameters.heads must be an integer from 1 to 65536 that divides "
                             "the widths of the queries and values.");
        *heads = (size_t)hv;
    }
    const json_t *s = json_object_get(p, "scale");
    if (s != NULL) {
        double v = json_is_number(s) ? json_number_value(s) : -1;
        if (!(v > 0) || !isfinite(v))
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", "parameters.scale",
                             "parameters.scale must be a number > 0 (it multiplies q k^T).");
        ar->job.scale = v;
        ar->scale_given = 1;
    }
    return 0;
}

/* The inputs of a model, by slot. */
enum { IN_Q, IN_K, IN_V, IN_X, IN_CONTEXT, IN_MASK, IN_COUNT };
static const char *const input_names[IN_COUNT] = {"q", "k", "v", "x", "context", "mask"};

static int input_slot(int builtin, const char *name)
{
    static const int builtin_slots[] = {IN_Q, IN_K, IN_V, IN_MASK};
    static const int set_slots[] = {IN_X, IN_CONTEXT, IN_MASK};
    const int *slots = builtin ? builtin_slots : set_slots;
    size_t n = builtin ? 4 : 3;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, input_names[slots[i]]))
            return slots[i];
    return -1;
}

static char *field_of(const v2_tensor *t, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "inputs[%zu].%s", t->index, what);
    return buf;
}

/* Checks a numeric input's rank against the reference input's. */
static int check_numeric(const v2_tensor *t, const v2_tensor *ref, attn_error *err)
{
    char f[64];
    if (t->datatype == V2_BOOL)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field_of(t, "datatype", f, sizeof f),
                         "%s of input \"%s\" is BOOL; it must be FP32 or FP64.", f, t->name);
    if (t->rank != 2 && t->rank != 3)
        return error_set(err, ERR_BAD_REQUEST, "invalid_shape", field_of(t, "shape", f, sizeof f),
                         "%s of input \"%s\" has %zu dimensions; it must be [L, d] or [B, L, d].",
                         f, t->name, t->rank);
    if (ref == NULL || ref == t)
        return 0;
    if (t->datatype != ref->datatype)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", field_of(t, "datatype", f, sizeof f),
                         "%s of input \"%s\" is %s but input \"%s\" is %s; numeric inputs share "
                         "one datatype.", f, t->name, v2_datatype_name(t->datatype), ref->name,
                         v2_datatype_name(ref->datatype));
    if (t->rank != ref->rank)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", field_of(t, "shape", f, sizeof f),
                         "%s of input \"%s\" has %zu dimensions but input \"%s\" has %zu; give all "
                         "inputs a leading batch axis, or none.", f, t->name, t->rank, ref->name,
                         ref->rank);
    if (t->rank == 3 && t->dims[0] != ref->dims[0])
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", field_of(t, "shape", f, sizeof f),
                         "%s of input \"%s\" has a batch of %zu but input \"%s\" has %zu.", f,
                         t->name, t->dims[0], ref->name, ref->dims[0]);
    return 0;
}

/* Rows and width of a numeric input (its last two dimensions). */
static size_t rows_of(const v2_tensor *t) { return t->dims[t->rank - 2]; }
static size_t width_of(const v2_tensor *t) { return t->dims[t->rank - 1]; }

/* Allocates and reads a numeric input. */
static int read_input(const v2_tensor *t, double **out, attn_error *err)
{
    *out = mem_malloc(t->count * sizeof(double));
    if (*out == NULL)
        return error_nomem(err);
    return v2_tensor_read_numbers(t, *out, err);
}

/* Everything one inference request holds while it runs. */
typedef struct v2_infer {
    v2_model model;
    json_t *root;
    attention_json_request ar;
    v2_tensor in[IN_COUNT];
    int have[IN_COUNT];
    v2_datatype dtype;
    v2_outputs outs;
    char id[256];
    int has_id;
} v2_infer;

/* Describes the inputs and checks shapes and parameters into st->ar (no
 * array allocated yet). */
static int infer_describe(v2_infer *st, const v2_env *env, v2_body *body, attn_error *err)
{
    attention_json_request *ar = &st->ar;
    attn_job *job = &ar->job;
    int builtin = st->model.set == NULL;
    int rc;
    const json_t *root = st->root;
    if (!json_is_object(root))
        return error_set(err, ERR_BAD_REQUEST, "invalid_json", NULL,
                         "The JSON header is %s; it must be an object with \"inputs\".",
                         json_in_kind(root));
    const json_t *id = json_object_get(root, "id");
    if (id != NULL) {
        if (!json_is_string(id) || json_string_length(id) >= sizeof st->id)
            return error_set(err, ERR_BAD_REQUEST, "wrong_type", "id",
                             "id must be a string of at most %zu bytes.", sizeof st->id - 1);
        snprintf(st->id, sizeof st->id, "%s", json_string_value(id));
        st->has_id = 1;
    }
    size_t heads;
    int binary_output;
    if ((rc = decode_parameters(root, ar, &heads, &binary_output, err)) != 0 ||
        (rc = decode_outputs(root, binary_output, &st->outs, err)) != 0)
        return rc;
    const json_t *inputs = json_object_get(root, "inputs");
    if (!json_is_array(inputs) || json_array_size(inputs) == 0)
        return error_set(err, ERR_BAD_REQUEST, inputs ? "wrong_type" : "missing_field", "inputs",
                         "inputs must be a non-empty array; model \"%s\" takes %s.",
                         st->model.name, builtin ? "q, k, v and optionally mask"
                                                 : "x, and optionally context and mask");
    for (size_t i = 0; i < json_array_size(inputs); i++) {
        v2_tensor t;
        if ((rc = v2_tensor_describe(json_array_get(inputs, i), i, body, env->cfg->max_elements,
                                     &ar->input_elements, &t, err)) != 0)
            return rc;
        int slot = input_slot(builtin, t.name);
        char f[64];
        snprintf(f, sizeof f, "inputs[%zu].name", i);
        if (slot < 0)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", f,
                             "%s is \"%s\", which model \"%s\" does not take; its inputs are %s.",
                             f, t.name, st->model.name,
                             builtin ? "q, k, v and mask" : "x, context and mask");
        if (st->have[slot])
            return error_set(err, ERR_BAD_REQUEST, "invalid_value", f,
                             "%s names input \"%s\" a second time.", f, t.name);
        st->in[slot] = t;
        st->have[slot] = 1;
    }
    if ((rc = v2_body_check_consumed(body, err)) != 0)
        return rc;

    /* The numeric inputs, against the first one. */
    static const int builtin_req[] = {IN_Q, IN_K, IN_V};
    static const int set_req[] = {IN_X};
    const int *req_slots = builtin ? builtin_req : set_req;
    size_t n_req = builtin ? 3 : 1;
    for (size_t i = 0; i < n_req; i++)
        if (!st->have[req_slots[i]])
            return error_set(err, ERR_BAD_REQUEST, "missing_field", "inputs",
                             "inputs has no \"%s\"; model \"%s\" needs %s.",
                             input_names[req_slots[i]], st->model.name,
                             builtin ? "q, k and v" : "x");
    const v2_tensor *ref = &st->in[req_slots[0]];
    for (int s = 0; s < IN_MASK; s++)
        if (st->have[s] && (rc = check_numeric(&st->in[s], ref, err)) != 0)
            return rc;
    st->dtype = ref->datatype;
    job->dtype = ref->datatype == V2_FP32 ? ATTN_FLOAT32 : ATTN_FLOAT64;
    ar->batched = ref->rank == 3;
    job->batch = ar->batched ? ref->dims[0] : 1;
    job->want_attention = 0;
    for (size_t i = 0; i < st->outs.n; i++)
        job->want_attention |= st->outs.which[i] == OUT_ATTENTION;
    ar->heads_given = heads != 0;
    job->heads = heads ? heads : 1;
    char f[64];
    if (builtin) {
        const v2_tensor *q = &st->in[IN_Q], *k = &st->in[IN_K], *v = &st->in[IN_V];
        if (width_of(k) != width_of(q))
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", field_of(k, "shape", f, sizeof f),
                             "%s: k has %zu features per token but q has %zu (both must be dk).",
                             f, width_of(k), width_of(q));
        if (rows_of(v) != rows_of(k))
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", field_of(v, "shape", f, sizeof f),
                             "%s: v has %zu tokens but k has %zu (both must be Lk, one per key).",
                             f, rows_of(v), rows_of(k));
        job->lq = rows_of(q);
        job->lk = rows_of(k);
        job->dk = width_of(q);
        job->dv = width_of(v);
        if (weights_check_heads(job->heads, job->dk, job->dv, err) != 0) {
            snprintf(err->field, sizeof err->field, "parameters.heads");
            return err->kind;
        }
        if (!ar->scale_given)
            job->scale = weights_default_scale(job->dk, job->heads);
    } else {
        const weight_set *set = st->model.set;
        const v2_tensor *x = &st->in[IN_X];
        job->lq = job->lk = rows_of(x);
        ar->x_width = ar->ctx_width = width_of(x);
        if (st->have[IN_CONTEXT]) {
            job->lk = rows_of(&st->in[IN_CONTEXT]);
            ar->ctx_width = width_of(&st->in[IN_CONTEXT]);
        }
        snprintf(ar->weights_name, sizeof ar->weights_name, "%s", set->name);
        if (ar->heads_given && set->heads != 0 && job->heads != set->heads)
            return error_set(err, ERR_BAD_REQUEST, "conflicting_fields", "parameters.heads",
                             "parameters.heads is %zu but model \"%s\" was stored with heads = "
                             "%zu; leave heads out to use the stored value.", job->heads,
                             set->name, set->heads);
        if (!ar->heads_given && set->heads != 0) {
            job->heads = set->heads;
            ar->heads_given = 1;
        }
    }
    if (st->have[IN_MASK]) {
        const v2_tensor *m = &st->in[IN_MASK];
        field_of(m, "shape", f, sizeof f);
        if (m->datatype != V2_BOOL)
            return error_set(err, ERR_BAD_REQUEST, "invalid_value",
                             field_of(m, "datatype", f, sizeof f),
                             "%s of input \"mask\" is %s; it must be BOOL.", f,
                             v2_datatype_name(m->datatype));
        if (m->rank != 2 && m->rank != 3)
            return error_set(err, ERR_BAD_REQUEST, "invalid_shape", f,
                             "%s of input \"mask\" has %zu dimensions; it must be [Lq, Lk] or "
                             "[B, Lq, Lk].", f, m->rank);
        if (m->rank == 3 && (!ar->batched || m->dims[0] != job->batch))
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", f,
                             "%s of input \"mask\" has a batch axis of %zu but the inputs have %s "
                             "%zu.", f, m->dims[0], ar->batched ? "a batch of" : "no batch axis,",
                             ar->batched ? job->batch : (size_t)0);
        if (rows_of(m) != job->lq || width_of(m) != job->lk)
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", f,
                             "%s of input \"mask\" is %zu x %zu but it must be Lq x Lk = %zu x %zu.",
                             f, rows_of(m), width_of(m), job->lq, job->lk);
        job->mask_batched = m->rank == 3;
    }
    return 0;
}

/* Reads every input's numbers into arrays owned by st->ar. */
static int infer_read(v2_infer *st, attn_error *err)
{
    attention_json_request *ar = &st->ar;
    attn_job *job = &ar->job;
    int rc;
    if (st->model.set == NULL) {
        if ((rc = read_input(&st->in[IN_Q], &ar->q, err)) != 0 ||
            (rc = read_input(&st->in[IN_K], &ar->k, err)) != 0 ||
            (rc = read_input(&st->in[IN_V], &ar->v, err)) != 0)
            return rc;
        job->q = ar->q;
        job->k = ar->k;
        job->v = ar->v;
    } else {
        if ((rc = read_input(&st->in[IN_X], &ar->x, err)) != 0)
            return rc;
        job->x = ar->x;
        if (st->have[IN_CONTEXT]) {
            if ((rc = read_input(&st->in[IN_CONTEXT], &ar->context, err)) != 0)
                return rc;
            job->context = ar->context;
        }
    }
    if (st->have[IN_MASK]) {
        ar->mask = mem_malloc(st->in[IN_MASK].count);
        if (ar->mask == NULL)
            return error_nomem(err);
        if ((rc = v2_tensor_read_bools(&st->in[IN_MASK], ar->mask, err)) != 0)
            return rc;
        job->mask = ar->mask;
    }
    return 0;
}

/* Shape of an output as written in the answer. */
static size_t output_shape(const attention_json_request *ar, const attn_result *res, int which,
                           size_t dims[4])
{
    const attn_job *j = &ar->job;
    size_t r = 0;
    if (ar->batched)
        dims[r++] = j->batch;
    if (which == OUT_OUTPUT) {
        dims[r++] = j->lq;
        dims[r++] = res->d_out;
    } else {
        if (ar->heads_given)
            dims[r++] = j->heads;
        dims[r++] = j->lq;
        dims[r++] = j->lk;
    }
    return r;
}

/* Writes the answer: the JSON header, then the binary outputs if any. */
static void infer_respond(v2_infer *st, const attn_result *res, double ms, size_t hint,
                          api_response *resp)
{
    const attention_json_request *ar = &st->ar;
    jw_buf w;
    jw_init(&w, hint + 512);
    jw_raw(&w, "{\"model_name\":");
    jw_string(&w, st->model.name);
    jw_raw(&w, ",\"model_version\":\"" V2_MODEL_VERSION "\"");
    if (st->has_id) {
        jw_raw(&w, ",\"id\":");
        jw_string(&w, st->id);
    }
    jw_raw(&w, ",\"parameters\":{\"scale\":");
    jw_double(&w, ar->job.scale);
    jw_raw(&w, ",\"heads\":");
    jw_size(&w, ar->job.heads);
    jw_raw(&w, ",\"compute_ms\":");
    jw_double(&w, round(ms * 1000) / 1000);
    jw_raw(&w, "},\"outputs\":[");
    size_t bin_bytes = 0, esize = v2_datatype_size(st->dtype);
    size_t counts[OUT_COUNT];
    for (size_t i = 0; i < st->outs.n; i++) {
        int which = st->outs.which[i];
        size_t dims[4], rank = output_shape(ar, res, which, dims), n = 1;
        for (size_t d = 0; d < rank; d++)
            n *= dims[d];
        counts[i] = n;
        jw_raw(&w, i ? ",{\"name\":" : "{\"name\":");
        jw_string(&w, output_names[which]);
        jw_raw(&w, ",\"datatype\":");
        jw_string(&w, v2_datatype_name(st->dtype));
        jw_raw(&w, ",\"shape\":[");
        for (size_t d = 0; d < rank; d++) {
            if (d)
                jw_char(&w, ',');
            jw_size(&w, dims[d]);
        }
        jw_char(&w, ']');
        const double *src = which == OUT_OUTPUT ? res->output : res->attention;
        const float *src_f32 = which == OUT_OUTPUT ? NULL : res->attention_f32;
        if (st->outs.binary[i]) {
            jw_raw(&w, ",\"parameters\":{\"binary_data_size\":");
            jw_size(&w, n * esize);
            jw_char(&w, '}');
            bin_bytes += n * esize;
        } else {
            jw_raw(&w, ",\"data\":");
            if (src_f32 != NULL)
                v2_tensor_write_json_f32(&w, src_f32, n);
            else
                v2_tensor_write_json(&w, src, n, st->dtype);
        }
        jw_char(&w, '}');
    }
    jw_raw(&w, "]}");
    if (bin_bytes == 0) {
        respond_jw(resp, 200, &w);
        return;
    }
    size_t header_len;
    char *header = jw_finish(&w, &header_len);
    char *body = header ? mem_malloc(header_len + bin_bytes) : NULL;
    if (body == NULL) {
        mem_free(header);
        attn_error err;
        error_nomem(&err);
        v2_respond_error(resp, &err);
        return;
    }
    memcpy(body, header, header_len);
    mem_free(header);
    unsigned char *p = (unsigned char *)body + header_len;
    for (size_t i = 0; i < st->outs.n; i++) {
        if (!st->outs.binary[i])
            continue;
        if (st->outs.which[i] == OUT_OUTPUT)
            v2_tensor_write_binary(p, res->output, counts[i], st->dtype);
        else if (res->attention_f32 != NULL)
            v2_tensor_write_binary_f32(p, res->attention_f32, counts[i]);
        else
            v2_tensor_write_binary(p, res->attention, counts[i], st->dtype);
        p += counts[i] * esize;
    }
    resp->status = 200;
    resp->body = body;
    resp->body_len = header_len + bin_bytes;
    resp->body_static = 0;
    resp->content_type = "application/octet-stream";
    resp->inference_header_length = header_len;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void v2_handle_infer(const api_request *req, const v2_env *env, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    v2_path vp;
    v2_infer st;
    memset(&st, 0, sizeof st);
    size_t reserved_bytes = 0;
    int arena = 0;          /* the JSON arena is open (mem.h) */
    int rc = parse_path(req->path, &vp) ? 0 :
             error_set(&err, ERR_NOT_FOUND, "not_found", NULL, "There is no endpoint %.200s.",
                       req->path);
    if (rc == 0)
        rc = model_open(env, &vp, &st.model, &err);
    if (rc != 0) {
        v2_respond_error(resp, &err);
        return;
    }
    v2_body body;
    if ((rc = v2_body_split(req->body, req->body_len, req->inference_header_length, &body,
                            &err)) != 0)
        goto fail;
    if (body.json_len == 0) {
        rc = error_set(&err, ERR_BAD_REQUEST, "invalid_json", NULL,
                       "The JSON header is empty; send an object with \"inputs\".");
        goto fail;
    }
    json_error_t jerr;
    memset(&jerr, 0, sizeof jerr);
    /* The header's tree lives until the inputs are read: it is made in the arena. */
    mem_json_arena_begin();
    arena = 1;
    /* Integers as reals, as on v1: a JSON number is a number however it is
     * written (json_in_whole reads the integer fields). */
    st.root = json_fast_load(body.json, body.json_len,
                             JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL,
                             v2_tensor_data_field, &jerr);
    if (st.root == NULL) {
        if (json_error_code(&jerr) == json_error_out_of_memory || jerr.text[0] == '\0')
            rc = error_nomem(&err);
        else if (json_error_code(&jerr) == json_error_stack_overflow)
            /* Nesting is the fault whatever the framing, so no hint about it. */
            rc = error_set(&err, ERR_BAD_REQUEST, "invalid_json", NULL,
                           "The JSON header nests arrays or objects too deeply: %s (line %d, "
                           "column %d); a tensor has at most a few dimensions.",
                           jerr.text, jerr.line, jerr.column);
        else
            rc = error_set(&err, ERR_BAD_REQUEST, "invalid_json", NULL,
                           "The JSON header is not valid JSON: %s (line %d, column %d)%s.",
                           jerr.text, jerr.line, jerr.column,
                           req->inference_header_length ? "" : "; a body with binary tensors "
                           "needs the header Inference-Header-Content-Length");
        goto fail;
    }
    if ((rc = infer_describe(&st, env, &body, &err)) != 0)
        goto fail;
    if (st.model.set != NULL &&
        (rc = attention_json_bind_weights(&st.ar, &st.model.set->w, 1, &err)) != 0)
        goto fail;
    int any_json = 0;
    for (size_t i = 0; i < st.outs.n; i++)
        any_json |= !st.outs.binary[i];
    size_t result_elements = attention_json_result_elements(&st.ar), response_bytes = 0;
    if (req->io_thread && (rc = admission_io_thread_fits(&st.ar.job, result_elements)) != 0)
        goto fail;
    if ((rc = admission_admit(env->cfg, &st.ar.job, result_elements,
                            any_json ? V2_JSON_BYTES_PER_NUMBER : v2_datatype_size(st.dtype),
                            "ask only for the output \"output\"", &response_bytes,
                            &reserved_bytes, &err)) != 0)
        goto fail;
    rc = infer_read(&st, &err);
    json_decref(st.root);
    st.root = NULL;
    mem_json_arena_end();
    arena = 0;
    if (rc != 0)
        goto fail;
    attn_result result;
    double start = now_seconds();
    rc = admission_run(&st.ar.job, req->io_thread, &result, &err);
    double ms = (now_seconds() - start) * 1000.0;
    if (rc != 0)
        goto fail;
    infer_respond(&st, &result, ms, any_json ? response_bytes / 2 : 0, resp);
    attention_result_free(&result);
    admission_release(reserved_bytes);
    attention_json_free(&st.ar);
    model_close(&st.model);
    return;
fail:
    admission_release(reserved_bytes);
    json_decref(st.root);
    if (arena)
        mem_json_arena_end();
    attention_json_free(&st.ar);
    model_close(&st.model);
    if (rc == ADMISSION_DEFER)
        resp->deferred = 1; /* for a worker */
    else
        v2_respond_error(resp, &err);
}

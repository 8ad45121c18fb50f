/*
 * v1_checkpoint.c - PUT and GET of weight sets as safetensors files (see
 * v1_checkpoint.h).
 *
 * A PUT reads the query (preset, heads, layer, and for preset=names the
 * tensor of each part), parses the body in place (safetensors.h), takes
 * the layers out (checkpoint.h) after reserving their arrays in the memory
 * budget, and stores each as a set.  With several layers a failed store
 * puts back what the earlier ones replaced (or deletes what they created),
 * so that none of the new sets remains.  A GET answers the set's numbers in
 * its own element type: F32 tensors for a float32 set, F64 for a float64 one.
 */
#include "v1_checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message/answer.h"
#include "core/budget.h"
#include "checkpoint/checkpoint.h"
#include "json/jsonw.h"
#include "core/mem.h"
#include "checkpoint/safetensors.h"
#include "request/weights_json.h"

static const char *query(const api_request *req, const char *key)
{
    return req->query_arg != NULL ? req->query_arg(req->query_ctx, key) : NULL;
}

int v1_checkpoint_format(const api_request *req, attn_error *err)
{
    const char *format = query(req, "format");
    if (format == NULL || !strcmp(format, "json"))
        return 0;
    if (!strcmp(format, "safetensors"))
        return 1;
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", "format",
                     "format must be json or safetensors, not \"%.40s\".", format);
}

/* A whole number >= min from text; -1 when it is not one. */
static long parse_count(const char *text, long min)
{
    char *end;
    long v = strtol(text, &end, 10);
    return end == text || *end != '\0' || text[0] == '-' || text[0] == '+' || v < min ? -1 : v;
}

/* Reads preset, heads, layer and the names of preset=names from the query. */
static int read_query(const api_request *req, ckpt_request *rq, size_t *heads, attn_error *err)
{
    const char *preset = query(req, "preset"), *h = query(req, "heads"), *layer = query(req, "layer");
    if (preset == NULL)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "preset",
                         "A safetensors upload needs preset=torch_mha, hf_bert, gpt2 or names.");
    if (checkpoint_preset_parse(preset, &rq->preset, err) != 0)
        return ERR_BAD_REQUEST;
    long heads_given = h != NULL ? parse_count(h, 1) : 0;
    if (heads_given < 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "heads",
                         "heads must be a whole number >= 1.");
    *heads = (size_t)heads_given;
    rq->layer = CKPT_LAYER_NONE;
    if (layer != NULL && !strcmp(layer, "all"))
        rq->layer = CKPT_LAYER_ALL;
    else if (layer != NULL && (rq->layer = parse_count(layer, 0)) < 0)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "layer",
                         "layer must be a layer number (0, 1, ...) or all.");
    const char *layout = query(req, "layout");
    rq->names_out_in = layout == NULL || !strcmp(layout, "out_in");
    if (layout != NULL && strcmp(layout, "out_in") && strcmp(layout, "in_out"))
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "layout",
                         "layout must be out_in (PyTorch's nn.Linear) or in_out.");
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        rq->names[p] = query(req, weights_parts[p].name);
    return 0;
}

/* checkpoint_extract's reserve: the arrays in the process memory budget. */
static int reserve_arrays(size_t bytes, void *ctx, attn_error *err)
{
    if (budget_reserve(bytes) == 0) {
        *(size_t *)ctx = bytes;
        return 0;
    }
    if (!budget_could_fit(bytes))
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The weights take %zu MiB, more than the server's whole "
                         "memory budget (--max-memory).", bytes >> 20);
    return error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                     "The server's memory budget (--max-memory) is taken by other requests now; "
                     "retry shortly.");
}

/* Undoes the stores of sets[0..n): puts back old[i], with its generation,
 * where it was replaced, deletes the new set where it was created.  Best
 * effort: it reports nothing, as the request fails anyway. */
static void roll_back(weight_store *store, weight_set **sets, weight_set **old, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        attn_error ignored;
        if (old[i] == NULL) {
            store_delete(store, sets[i]->name, &ignored);
        } else {
            weightset_retain(old[i]); /* store_restore takes one reference */
            store_restore(store, old[i], &ignored);
        }
    }
}

/* Makes the sets of layers (their arrays taken) named name or name.N. */
static int make_sets(const char *name, ckpt_layer *layers, size_t n, int all, size_t heads,
                     weight_set **sets, attn_error *err)
{
    for (size_t i = 0; i < n; i++) {
        char set_name[WEIGHTS_NAME_MAX + 32];
        if (all)
            snprintf(set_name, sizeof set_name, "%s.%ld", name, layers[i].index);
        else
            snprintf(set_name, sizeof set_name, "%s", name);
        /* name is valid; with layer=all, name.N may be too long */
        int rc = weights_check_name(set_name, "name", err);
        if (rc != 0)
            return rc;
        if (heads != 0 && weights_check_heads(heads, layers[i].w.dk, layers[i].w.dv, err) != 0)
            return ERR_BAD_REQUEST;
        sets[i] = weightset_new(set_name, &layers[i].w, heads, 0);
        if (sets[i] == NULL)
            return error_nomem(err);
    }
    return 0;
}

/* Stores sets[0..n), all or none; *created says whether every one was new. */
static int store_all(weight_store *store, weight_set **sets, size_t n, int *all_created,
                     attn_error *err)
{
    weight_set **old = mem_calloc(n, sizeof *old);
    if (old == NULL)
        return error_nomem(err);
    *all_created = 1;
    int rc = 0;
    size_t done = 0;
    for (; done < n && rc == 0; done++) {
        old[done] = store_get(store, sets[done]->name);
        int created = 0;
        weightset_retain(sets[done]); /* store_put takes one reference */
        rc = store_put(store, sets[done], &created, err);
        *all_created &= created;
    }
    if (rc != 0)
        roll_back(store, sets, old, done - 1);
    for (size_t i = 0; i < done; i++)
        weightset_release(old[i]);
    mem_free(old);
    return rc;
}

/* The answer to a stored PUT. */
static void respond_stored(weight_set **sets, size_t n, int all, int created, api_response *resp)
{
    jw_buf w;
    jw_init(&w, 512 * n);
    if (all)
        jw_raw(&w, "{\"weight_sets\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            jw_char(&w, ',');
        weights_json_encode_set(sets[i], 0, &w);
    }
    if (all) {
        jw_raw(&w, "],\"count\":");
        jw_size(&w, n);
        jw_char(&w, '}');
    } else {
        snprintf(resp->etag, sizeof resp->etag, "\"%llu\"",
                 (unsigned long long)sets[0]->generation);
        if (created)
            snprintf(resp->location, sizeof resp->location, "/v1/weight-sets/%s", sets[0]->name);
    }
    answer_jw(resp, created ? 201 : 200, &w);
}

void v1_checkpoint_put(const api_request *req, const char *name, const server_config *cfg,
                        weight_store *store, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    /* the body is read once, here: its pages go back to the kernel as the arrays fill */
    ckpt_request rq = {.max_elements = cfg->max_elements, .release_body = 1};
    size_t heads = 0, reserved = 0, n = 0;
    st_file file = {0};
    ckpt_layer *layers = NULL;
    weight_set **sets = NULL;
    int created = 0;
    int rc = read_query(req, &rq, &heads, &err);
    if (rc == 0)
        rc = checkpoint_header_admit(req->body, req->body_len, &err);
    if (rc == 0)
        rc = safetensors_parse(req->body, req->body_len, &file, &err);
    if (rc == 0)
        rc = checkpoint_extract(&file, &rq, reserve_arrays, &reserved, &layers, &n, &err);
    safetensors_free(&file);
    if (rc == 0 && (sets = mem_calloc(n, sizeof *sets)) == NULL)
        rc = error_nomem(&err);
    if (rc == 0)
        rc = make_sets(name, layers, n, rq.layer == CKPT_LAYER_ALL, heads, sets, &err);
    if (rc == 0)
        rc = store_all(store, sets, n, &created, &err);
    if (rc == 0)
        respond_stored(sets, n, rq.layer == CKPT_LAYER_ALL, created, resp);
    else
        answer_error(resp, &err);
    for (size_t i = 0; sets != NULL && i < n; i++)
        weightset_release(sets[i]);
    mem_free(sets);
    checkpoint_layers_free(layers, n);
    budget_release(reserved);
}

void v1_checkpoint_get(const weight_set *set, api_response *resp)
{
    static const weights_part order[] = {WEIGHTS_WQ, WEIGHTS_WK, WEIGHTS_WV, WEIGHTS_BQ,
                                         WEIGHTS_BK, WEIGHTS_BV, WEIGHTS_WO, WEIGHTS_BO};
    st_out out[WEIGHTS_COUNT];
    size_t n = 0;
    for (size_t i = 0; i < WEIGHTS_COUNT; i++) {
        weights_part p = order[i];
        if (!weights_has(&set->w, p))
            continue;
        out[n++] = (st_out){weights_parts[p].name,
                            weights_parts[p].is_matrix ? weights_rows(&set->w, p) : 0,
                            weights_cols(&set->w, p), weights_array(&set->w, p),
                            weights_array_f32(&set->w, p)};
    }
    char heads[32];
    snprintf(heads, sizeof heads, "%zu", set->heads);
    const char *meta[] = {"layout", "in_out", "heads", heads};
    size_t len = 0;
    unsigned char *file = safetensors_write(out, n, meta, set->heads ? 2 : 1, &len);
    if (file == NULL) {
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    snprintf(resp->etag, sizeof resp->etag, "\"%llu\"", (unsigned long long)set->generation);
    resp->status = 200;
    resp->body = (char *)file;
    resp->body_len = len;
    resp->content_type = "application/octet-stream";
}

/*
 * v1_sets.c - the weight-set resource: GET /v1/weight-sets (the list), and
 * GET, HEAD, PUT and DELETE of /v1/weight-sets/{name}, with If-Match and
 * ETag carrying a set's generation.
 *
 * Every replica reads one shared directory (store.h); a request that names a
 * generation this replica has not seen yet makes it read that set's file in
 * the directory, and rescan the directory when the file holds that
 * generation, rather than answer from a stale view.  A request with
 * ?format=safetensors reads or writes the set as a safetensors file: this
 * file hands it to v1_checkpoint.c once the name and If-Match are checked.
 * A PUT one segment deeper (the route table's ENDPOINT_V1_SET_BELOW) named
 * a set with a slash in its name, and is refused as such.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message/answer.h"
#include "v1.h"
#include "v1_checkpoint.h"
#include "v1_private.h"
#include "json/json_in.h"
#include "core/mem.h"
#include "store/store.h"
#include "kernel/weights.h"
#include "request/weights_json.h"

#define SETS_PREFIX "/v1/weight-sets/"   /* of a new set's Location */

void v1_sets_list(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    weight_store *store = env->store;
    size_t count = 0;
    weight_set **sets = NULL;
    attn_error err;
    if (store_list(store, &sets, &count, &err) != 0) {
        answer_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 256 + count * 256);
    jw_raw(&w, "{\"weight_sets\":[");
    for (size_t i = 0; i < count; i++) {
        if (i)
            jw_char(&w, ',');
        weights_json_encode_set(sets[i], 0, &w);
    }
    jw_raw(&w, "],\"count\":");
    jw_size(&w, count);
    jw_raw(&w, ",\"total_bytes\":");
    jw_size(&w, store_total_bytes(store));
    jw_raw(&w, "}");
    store_list_free(sets, count);
    answer_jw(resp, 200, &w);
}

/* Parses an If-Match value: "*", or one quoted or bare generation (a list
 * of several is taken as its first entry).  Returns the generation, 0 for
 * "*" (any), or -1 when it is not one. */
static long long if_match_generation(const char *value)
{
    while (*value == ' ' || *value == '\t')
        value++;
    if (value[0] == '*')
        return 0;
    if (value[0] == 'W' && value[1] == '/')
        value += 2;
    if (*value == '"')
        value++;
    char *end;
    long long g = strtoll(value, &end, 10);
    if (end == value || g < 1)
        return -1;
    return g;
}

weight_set *v1_sets_get_generation(weight_store *store, const char *name, uint64_t want,
                                   const char *field, int *retry_after, attn_error *err)
{
    weight_set *set = store_get(store, name);
    if (set != NULL && (want == 0 || set->generation == want))
        return set;
    uint64_t on_disk = 0;
    if (set == NULL || set->generation < want) {
        /* The shared directory may hold what this table lacks: its file's
         * header says, and a rescan follows only when it holds what was asked. */
        attn_error sync_err;
        error_clear(&sync_err);
        weightset_release(set);
        store_sync_for_pin(store, name, want, &on_disk, &sync_err);
        set = store_get(store, name);
        if (set != NULL && (want == 0 || set->generation == want))
            return set;
    }
    uint64_t held = set != NULL ? set->generation : 0;
    weightset_release(set);
    if (want != 0 && held > want) {
        error_set(err, ERR_PRECONDITION, "generation_mismatch", field,
                  "The weight set \"%s\" is at generation %llu, past %llu: it was replaced since.",
                  name, (unsigned long long)held, (unsigned long long)want);
    } else if (want != 0 && on_disk == want) {
        /* The file is there but not loaded yet: a rescan is limited per name
         * and generation (STORE_PIN_SYNC_MIN_MS), or the file is damaged (it is
         * then quarantined, and the answer becomes a 404). */
        *retry_after = 1;
        error_set(err, ERR_UNAVAILABLE, "generation_not_here_yet", field,
                  "This replica does not yet have generation %llu of the weight set \"%s\"; "
                  "retry shortly.", (unsigned long long)want, name);
    } else if (want != 0 && on_disk != 0) {
        error_set(err, ERR_PRECONDITION, "generation_mismatch", field,
                  "The weight set \"%s\" is at generation %llu in the data directory, not %llu: "
                  "%s.", name, (unsigned long long)on_disk, (unsigned long long)want,
                  on_disk > want ? "it was replaced since" : "that generation was never stored");
    } else if (want != 0) {
        error_set(err, ERR_NOT_FOUND, "unknown_weight_set", field,
                  "There is no stored weight set named \"%s\": generation %llu was deleted, or "
                  "never stored.", name, (unsigned long long)want);
    } else {
        error_set(err, ERR_NOT_FOUND, "unknown_weight_set", field,
                  "There is no stored weight set named \"%s\".", name);
    }
    return NULL;
}

/* Sets the ETag of resp to the generation of set. */
static void set_etag(api_response *resp, const weight_set *set)
{
    snprintf(resp->etag, sizeof resp->etag, "\"%llu\"", (unsigned long long)set->generation);
}

/* GET and HEAD: checked (a reference, taken) is the set If-Match was checked
 * on, or NULL when there was no If-Match; the set is answered as JSON, or as
 * a safetensors file. */
static void get_set(weight_store *store, const char *name, weight_set *checked, int safetensors,
                    api_response *resp)
{
    weight_set *set = checked != NULL ? checked : store_get(store, name);
    if (set == NULL) {
        attn_error err;
        error_set(&err, ERR_NOT_FOUND, "unknown_weight_set", "name",
                  "There is no stored weight set named \"%s\".", name);
        answer_error(resp, &err);
        return;
    }
    if (safetensors) {
        v1_checkpoint_get(set, resp);
        weightset_release(set);
        return;
    }
    jw_buf w;
    jw_init(&w, set->size_bytes / weights_elem_size(&set->w) * 3 * 8 + 1024);
    weights_json_encode_set(set, 1, &w);
    set_etag(resp, set);
    weightset_release(set);
    answer_jw(resp, 200, &w);
}

/* Decodes the body of a PUT into a new set called name.  Returns it (the
 * caller releases it), or NULL with err filled. */
static weight_set *decode_set(const api_request *req, const server_config *cfg, const char *name,
                              attn_error *err)
{
    mem_json_arena_begin();
    json_t *root = json_in_parse(req->body, req->body_len, weights_part_named, err);
    if (root == NULL) {
        mem_json_arena_end();
        return NULL;
    }
    attn_weights wts;
    size_t heads;
    int out_in;
    int rc = weights_json_decode_set(root, cfg->max_elements, &wts, &heads, &out_in,
                                     err);
    json_decref(root);
    mem_json_arena_end();
    if (rc != 0)
        return NULL;
    weight_set *set = weightset_new(name, &wts, heads, out_in);
    if (set == NULL)
        error_nomem(err);
    return set;
}

/* PUT: 201 with Location for a new name, 200 for a replacement. */
static void put_set(const api_request *req, const api_env *env, const char *name,
                    api_response *resp)
{
    attn_error err;
    error_clear(&err);
    weight_set *set = decode_set(req, env->cfg, name, &err);
    if (set == NULL) {
        answer_error(resp, &err);
        return;
    }
    weightset_retain(set); /* ours, for the answer; store_put takes the other */
    int created = 0;
    if (store_put(env->store, set, &created, &err) != 0) {
        weightset_release(set);
        answer_error(resp, &err);
        return;
    }
    jw_buf w;
    jw_init(&w, 512);
    weights_json_encode_set(set, 0, &w);
    set_etag(resp, set);
    weightset_release(set);
    if (created)
        snprintf(resp->location, sizeof resp->location, "%s%s", SETS_PREFIX, name);
    answer_jw(resp, created ? 201 : 200, &w);
}

/* Checks the name and If-Match of a request on the set called name.
 * Returns 0 with *checked the set the precondition held on (a reference;
 * NULL without If-Match or for a PUT), or -1 with resp answered. */
static int check_request(const api_request *req, weight_store *store, const char *name,
                         weight_set **checked, api_response *resp)
{
    attn_error err;
    error_clear(&err);
    *checked = NULL;
    long long want = 0;
    if (weights_check_name(name, "name", &err) == 0 && req->if_match != NULL &&
        (want = if_match_generation(req->if_match)) < 0)
        error_set(&err, ERR_BAD_REQUEST, "invalid_value", "If-Match",
                  "If-Match must be * or the ETag a PUT or GET of the set answered, such as "
                  "\"1700000000000000\".");
    else if (err.kind == 0 && req->if_match != NULL && strcmp(req->method, "PUT") != 0)
        /* The precondition holds on this replica's view, fresh from the
         * shared directory when it does not match at first; GET answers the
         * very set it was checked on. */
        *checked = v1_sets_get_generation(store, name, (uint64_t)want, NULL, &resp->retry_after,
                                          &err);
    if (err.kind == 0)
        return 0;
    answer_error(resp, &err);
    return -1;
}

/* Answers GET, HEAD, PUT and DELETE of the set called name. */
static void handle_named(const api_request *req, const api_env *env, const char *name,
                         api_response *resp)
{
    weight_set *checked;
    if (check_request(req, env->store, name, &checked, resp) != 0)
        return;
    attn_error err;
    error_clear(&err);
    int safetensors = v1_checkpoint_format(req, &err);
    if (safetensors < 0) {
        weightset_release(checked);
        answer_error(resp, &err);
        return;
    }
    if (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD")) {
        get_set(env->store, name, checked, safetensors, resp);
        return;
    }
    weightset_release(checked);
    if (!strcmp(req->method, "DELETE")) {
        if (store_delete(env->store, name, &err) != 0)
            answer_error(resp, &err);
        else
            answer_static(resp, 204, "");
        return;
    }
    if (safetensors)
        v1_checkpoint_put(req, name, env->cfg, env->store, resp);
    else
        put_set(req, env, name, resp);
}

void v1_set_handle(const api_request *req, const api_env *env, api_response *resp)
{
    handle_named(req, env, req->args->name, resp);
}

void v1_set_below_handle(const api_request *req, const api_env *env, api_response *resp)
{
    const char *name = req->args->name;     /* the rest of the path, slashes included */
    if (strcmp(req->method, "PUT") != 0 || *name == '\0')
        answer_not_found(resp, req->path);
    else
        handle_named(req, env, name, resp);                 /* an invalid name: 400 */
}

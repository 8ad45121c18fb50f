/*
 * v2_request.c - the JSON header of a v2 inference body read into the
 * neutral request (message/api_infer.h), which v2's rules then read
 * whatever the wire.
 *
 * Nothing is refused here: each field is noted as what the JSON holds
 * (json_in_scalar), also when it is the wrong kind, so that the rules find
 * the fault in their own order and say it in their own words.  Only the
 * members the rules read are noted, and the strings and the numbers of
 * "data" stay in the tree.
 */
#include "v2_internal.h"

#include <jansson.h>
#include <string.h>

#include "core/mem.h"
#include "json/json_in.h"

/* The member key of obj, or absent when obj is no object. */
static scalar member(const json_t *obj, const char *key)
{
    return json_in_scalar(json_is_object(obj) ? json_object_get(obj, key) : NULL);
}

static void read_output(const json_t *out, api_infer_output *o)
{
    o->self = json_in_scalar(out);
    o->name = member(out, "name");
    const json_t *params = json_is_object(out) ? json_object_get(out, "parameters") : NULL;
    o->parameters = json_in_scalar(params);
    o->binary_data = member(params, "binary_data");
}

int v2_request_from_json(const json_t *root, api_infer_request *r, api_infer_param **params,
                         attn_error *err)
{
    memset(r, 0, sizeof *r);
    *params = NULL;
    r->self = json_in_scalar(root);
    r->id = member(root, "id");
    const json_t *p = json_is_object(root) ? json_object_get(root, "parameters") : NULL;
    r->parameters = json_in_scalar(p);
    if (json_is_object(p) && json_object_size(p) != 0) {
        *params = mem_malloc(json_object_size(p) * sizeof **params);
        if (*params == NULL)
            return error_nomem(err);
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)p, key, v)
            (*params)[r->n_params++] = (api_infer_param){key, json_in_scalar(v)};
        r->params = *params;
    }
    const json_t *inputs = json_is_object(root) ? json_object_get(root, "inputs") : NULL;
    r->inputs = json_in_scalar(inputs);
    for (size_t i = 0; i < json_array_size(inputs) && i < API_INFER_MAX_INPUTS + 1; i++)
        v2_tensor_input_from_json(json_array_get(inputs, i), &r->input[r->n_inputs++]);
    const json_t *outputs = json_is_object(root) ? json_object_get(root, "outputs") : NULL;
    r->outputs = json_in_scalar(outputs);
    for (size_t i = 0; i < json_array_size(outputs) && i < API_INFER_MAX_OUTPUTS; i++)
        read_output(json_array_get(outputs, i), &r->output[r->n_outputs++]);
    return 0;
}

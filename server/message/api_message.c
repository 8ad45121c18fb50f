/*
 * api_message.c - a byte length read from a request's text, what a handler
 * notes in an answer beside its body, freeing an answer, and a parameter of a
 * neutral inference request.
 */
#include "api_message.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

api_length api_length_parse(const char *text)
{
    api_length n = {.stated = 0, .bytes = 0};
    if (text == NULL)
        return n;
    n.stated = -1;
    const char *p = text;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p < '0' || *p > '9')
        return n;
    char *end;
    unsigned long long bytes = strtoull(p, &end, 10); /* past ULLONG_MAX: ULLONG_MAX */
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end != '\0')
        return n;
    n.stated = 1;
    n.bytes = bytes;
    return n;
}

void api_response_free(api_response *resp)
{
    if (resp == NULL)
        return;
    if (!resp->body_static)
        mem_free(resp->body);
    mem_free(resp->meta.models);
    resp->meta.models = NULL;
    resp->meta.n_models = 0;
    resp->body = NULL;
    resp->body_len = 0;
    resp->body_static = 0;
}

void api_response_phase(api_response *resp, api_phase phase, double seconds)
{
    if (phase >= API_PHASE_COUNT)
        return;
    resp->phases_timed |= 1u << phase;
    resp->phase_seconds[phase] = seconds > 0 ? seconds : 0;
}

void api_response_model(api_response *resp, const char *model)
{
    snprintf(resp->model, sizeof resp->model, "%s", model != NULL ? model : "");
}

const scalar *api_infer_param_get(const api_infer_request *r, const char *key)
{
    for (size_t i = r->n_params; i-- > 0;)
        if (!strcmp(r->params[i].key, key))
            return &r->params[i].value;
    return NULL;
}

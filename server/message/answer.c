/*
 * answer.c - the bodies every handler answers with: JSON, the two forms of
 * error body (chosen by the route's id), the 404 of no endpoint, the
 * draining 503; and what an attention handler notes beside its body.
 *
 * Every JSON body ends with a newline, success and error alike, so that an
 * answer printed by curl ends its line before the next output or the prompt.
 * The JSON part of a binary v2 answer is no body of its own and gets none
 * (v2_answer.c): Inference-Header-Content-Length counts its bytes exactly.
 */
#include "answer.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "metrics/metrics.h"
#include "route/route.h"

void answer_static(api_response *resp, int status, const char *body)
{
    resp->status = status;
    resp->body = (char *)body;
    resp->body_len = strlen(body);
    resp->body_static = 1;
    resp->content_type = "application/json";
}

void answer_jw(api_response *resp, int status, jw_buf *w)
{
    jw_char(w, '\n');
    resp->body = jw_finish(w, &resp->body_len);
    if (resp->body == NULL) {
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    resp->body_static = 0;
    resp->status = status;
    resp->content_type = "application/json";
}

void answer_json(api_response *resp, int status, json_t *value)
{
    const size_t flags = JSON_INDENT(2) | JSON_REAL_PRECISION(17);
    size_t len = value ? json_dumpb(value, NULL, 0, flags) : 0;
    char *text = len > 0 ? mem_malloc(len + 1) : NULL;
    if (text != NULL && json_dumpb(value, text, len, flags) != len) {
        mem_free(text);
        text = NULL;
    }
    json_decref(value);
    if (text == NULL) {
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    text[len] = '\n';
    resp->body = text;
    resp->body_len = len + 1;
    resp->body_static = 0;
    resp->status = status;
    resp->content_type = "application/json";
}

/* v1: {"error":{"code":...,"message":...,"field":...}}, the field only when
 * one member is at fault. */
static void write_v1_error(jw_buf *w, const attn_error *err)
{
    jw_init(w, 256 + strlen(err->message));
    jw_raw(w, "{\"error\":{\"code\":");
    jw_string(w, err->code);
    jw_raw(w, ",\"message\":");
    jw_string(w, err->message);
    if (err->field[0]) {
        jw_raw(w, ",\"field\":");
        jw_string(w, err->field);
    }
    jw_raw(w, "}}\n");
}

/* The sentence of err in the route's form (v2: the field put before the
 * sentence when the sentence does not name it; v1: the message alone) into
 * text (cap bytes). */
static void error_sentence(const attn_error *err, int v2, char *text, size_t cap)
{
    if (v2 && err->field[0] && strstr(err->message, err->field) == NULL)
        snprintf(text, cap, "%s: %s", err->field, err->message);
    else
        snprintf(text, cap, "%s", err->message);
}

/* v2: {"error":"sentence"}, the sentence as error_sentence makes it. */
static void write_v2_error(jw_buf *w, const char *text)
{
    jw_init(w, 64 + strlen(text));
    jw_raw(w, "{\"error\":");
    jw_string(w, text);
    jw_raw(w, "}\n");
}

void answer_error(api_response *resp, const attn_error *err)
{
    int v2 = route_error_form(resp->route) == ROUTE_ERRORS_V2;
    _Static_assert(sizeof resp->error >= sizeof err->field + sizeof err->message + 4,
                   "an error's sentence fits");
    error_sentence(err, v2, resp->error, sizeof resp->error);
    jw_buf w;
    if (v2)
        write_v2_error(&w, resp->error);
    else
        write_v1_error(&w, err);
    api_response_free(resp);
    resp->status = error_http_status(err->kind);
    resp->content_type = "application/json";
    resp->inference_header_length = 0;
    /* a server that drains is gone for longer than a busy one */
    if (resp->retry_after == 0 && !strcmp(err->code, "shutting_down"))
        resp->retry_after = ANSWER_DRAINING_RETRY_AFTER;
    if ((err->kind == ERR_UNAVAILABLE || err->kind == ERR_TOO_MANY) && resp->retry_after == 0)
        resp->retry_after = 1;
    resp->body = jw_finish(&w, &resp->body_len);
    resp->body_static = 0;
    if (resp->body == NULL) {
        resp->retry_after = 1;
        snprintf(resp->error, sizeof resp->error, "The server ran out of memory; retry later.");
        answer_static(resp, 503, v2 ? "{\"error\":\"The server ran out of memory; retry later.\"}\n"
                                    : "{\"error\":{\"code\":\"overloaded\",\"message\":\"The "
                                      "server ran out of memory; retry later.\"}}\n");
    }
}

void answer_not_found(api_response *resp, const char *path)
{
    attn_error err;
    error_set(&err, ERR_NOT_FOUND, "not_found", NULL,
              "There is no endpoint %.200s; see GET /v1/info and the API description.", path);
    answer_error(resp, &err);
}

void answer_draining_error(attn_error *err)
{
    error_set(err, ERR_UNAVAILABLE, "shutting_down", NULL,
              "The server is shutting down and takes no new work; retry on another instance.");
}

void answer_draining(api_response *resp)
{
    attn_error err;
    answer_draining_error(&err);
    resp->retry_after = ANSWER_DRAINING_RETRY_AFTER;
    answer_error(resp, &err);
}

void answer_note_attention(api_response *resp, const api_request *req, const char *model,
                           const model_stats_sample *sample, int computed, double handled)
{
    api_response_model(resp, model);
    if (sample->queue > 0)
        api_response_phase(resp, API_PHASE_QUEUE, sample->queue);
    double compute = -1;
    if (computed) {
        api_response_phase(resp, API_PHASE_PARSE, sample->input);
        compute = sample->infer;
        api_response_phase(resp, API_PHASE_COMPUTE, compute);
        api_response_phase(resp, API_PHASE_ENCODE, sample->output);
    } else if (sample->input > 0) {
        api_response_phase(resp, API_PHASE_PARSE, sample->input);
        api_response_phase(resp, API_PHASE_COMPUTE, handled - sample->input);
    } else {
        api_response_phase(resp, API_PHASE_PARSE, handled);
    }
    metrics_attention_observe(model, req->protocol, sample->queue, compute, req->body_len);
}

/*
 * answer.h - filling an api_response: a JSON body, an error body, the
 * draining 503, what an attention request's handler learned of it.
 *
 * The handlers answer through these, so that an out-of-memory
 * while writing an answer, the shape of an error body and the Retry-After of
 * a 503 are decided here once.  The error body takes the form of the route
 * the response belongs to (resp->route, route.h): v1's {"error":{"code",
 * "message","field"}} or the Open Inference Protocol's {"error":"sentence"}.
 */
#ifndef ATTN_ANSWER_H
#define ATTN_ANSWER_H

#include <jansson.h>

#include "api_message.h"
#include "core/error.h"
#include "json/jsonw.h"
#include "metrics/model_stats.h"

/* Seconds a client is told to wait (Retry-After) before it retries a server
 * that is shutting down: long enough for a balancer to notice /readyz. */
#define ANSWER_DRAINING_RETRY_AFTER 5

/* Answers status with body, a string literal (not copied, never freed);
 * "" for an answer without a body. */
void answer_static(api_response *resp, int status, const char *body);

/* Answers status with the JSON text written into w and a newline, consuming
 * w; when w ran out of memory, answers the out-of-memory error instead. */
void answer_jw(api_response *resp, int status, jw_buf *w);

/* Answers status with value (stolen; NULL, as from a failed json_pack, gives
 * the out-of-memory error) serialised with two-space indentation and a
 * newline. */
void answer_json(api_response *resp, int status, json_t *value);

/* Replaces the body of resp (freeing it) with the error body for err
 * (borrowed) in the form of resp->route, and sets the status from err->kind;
 * a 503 without a Retry-After gets Retry-After: 1.  When memory runs out
 * here, the answer is a static 503 "overloaded". */
void answer_error(api_response *resp, const attn_error *err);

/* Answers the 404 of a path that is no endpoint (borrowed, named in the
 * sentence). */
void answer_not_found(api_response *resp, const char *path);

/* Fills err with the 503 shutting_down error of a server that drains. */
void answer_draining_error(attn_error *err);

/* Answers the 503 shutting_down of a server that drains, with
 * Retry-After: ANSWER_DRAINING_RETRY_AFTER. */
void answer_draining(api_response *resp);

/* Notes what an attention handler learned of its request, whichever wire
 * brought it: in resp, the model (borrowed, copied) and the phases that
 * happened, for Server-Timing and the access log; in the metrics, the
 * autoscaling signals under req's protocol (metrics_attention_observe).
 * sample holds the phases (model_stats.h); computed says the computation
 * ran to its end (sample then has all four); otherwise the request failed
 * after handled seconds in the handler: that time is its parsing, or past
 * sample->input its (stopped) computation. */
void answer_note_attention(api_response *resp, const api_request *req, const char *model,
                           const model_stats_sample *sample, int computed, double handled);

#endif

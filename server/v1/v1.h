/*
 * v1.h - the handlers of the v1 routes: attention, the weight-set resource,
 * the probes, /v1/info and /metrics.
 *
 * The router (router/api.c) calls them through its table, each for one
 * endpoint of the route table (route/route.h), after it has checked the
 * method, refused what draining refuses and taken the --max-inflight slot
 * of a computation.  Each answers into resp and always fills it.  v1 speaks
 * JSON (attention_json.h, request/weights_json.h) and, for weight sets,
 * safetensors (v1_checkpoint.h); the computation itself is the
 * protocol-neutral request (request/attention_request.h).
 */
#ifndef ATTN_V1_H
#define ATTN_V1_H

#include "message/api_message.h"

/* v1_attention.c: POST /v1/attention. */
void v1_attention_handle(const api_request *req, const api_env *env, api_response *resp);

/* v1_sets.c: GET /v1/weight-sets; GET, HEAD, PUT and DELETE of
 * /v1/weight-sets/{name}; and a path below a set, which is no endpoint
 * (404) but for a PUT, whose name (with a slash, a/b or a%2Fb decoded) is
 * refused 400 invalid_value. */
void v1_sets_list(const api_request *req, const api_env *env, api_response *resp);
void v1_set_handle(const api_request *req, const api_env *env, api_response *resp);
void v1_set_below_handle(const api_request *req, const api_env *env, api_response *resp);

/* v1_info.c: GET /healthz, /readyz, /v1/info and /metrics. */
void v1_probe_healthz(const api_request *req, const api_env *env, api_response *resp);
void v1_probe_readyz(const api_request *req, const api_env *env, api_response *resp);
void v1_info_handle(const api_request *req, const api_env *env, api_response *resp);
void v1_metrics_handle(const api_request *req, const api_env *env, api_response *resp);

#endif

/*
 * api_private.h - what the router (api.c) shares with the handlers of each
 * resource, and the handlers the route table (route.c) names.
 *
 * Each handler answers one route into resp and always fills it; api_handle
 * has already checked the method, refused what draining refuses and taken the
 * --max-inflight slot of a computation (route.h says which route is which).
 */
#ifndef ATTN_API_PRIVATE_H
#define ATTN_API_PRIVATE_H

#include <stdint.h>

#include "message/api_message.h"
#include "core/config.h"
#include "store/store.h"

/* The configuration api_init was given (borrowed for the server's life). */
const server_config *api_config(void);

/* The weight-set store api_init opened. */
weight_store *api_weight_store(void);

/* 1 while the server drains (api_set_draining), else 0. */
int api_is_draining(void);

/* api_attention.c: POST /v1/attention. */
void api_attention_handle(const api_request *req, api_response *resp);

/* api_sets.c: GET /v1/weight-sets, and GET, HEAD, PUT, DELETE of
 * /v1/weight-sets/{name}. */
void api_sets_list(const api_request *req, api_response *resp);
void api_set_handle(const api_request *req, api_response *resp);

/* api_sets.c: a PUT below /v1/weight-sets/ with a slash in the name (a/b, or
 * a%2Fb decoded): 1 when req is one, answered 400 invalid_value (PUT chooses
 * the name, and this one is invalid), else 0 and resp untouched. */
int api_sets_put_bad_name(const api_request *req, api_response *resp);

/* api_sets.c: the set named name at generation want (0: any); when this
 * replica's copy is not that generation it rescans the shared directory at
 * once.  Returns a reference (the caller releases it), or NULL with err
 * filled, naming field: 404 when there is no such set, 503 with
 * *retry_after set when this replica has not caught up with a newer write,
 * 412 when the set has moved past want. */
weight_set *api_sets_get_generation(const char *name, uint64_t want, const char *field,
                                    int *retry_after, attn_error *err);

/* api_info.c: GET /healthz, /readyz, /v1/info and /metrics. */
void api_probe_healthz(const api_request *req, api_response *resp);
void api_probe_readyz(const api_request *req, api_response *resp);
void api_info_handle(const api_request *req, api_response *resp);
void api_metrics_handle(const api_request *req, api_response *resp);

/* api_viz.c: GET / (a redirect to the page), /viz and /viz/NAME. */
void api_viz_handle(const api_request *req, api_response *resp);

/* api_v2.c: the v2 metadata routes and inference (v2.h). */
void api_v2_get(const api_request *req, api_response *resp);
void api_v2_infer(const api_request *req, api_response *resp);
void api_v2_repository(const api_request *req, api_response *resp);

/* api.c: every path no route matches (404). */
void api_not_found(const api_request *req, api_response *resp);

#endif

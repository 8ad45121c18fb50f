/*
 * v2.h - the Open Inference Protocol v2 (KServe / Triton HTTP) beside v1.
 *
 * Routes under /v2: server and model metadata, liveness and readiness, a
 * minimal Triton-style model configuration, Triton's statistics and model
 * repository, and inference.  Two kinds of model answer: the built-in
 * "attention" (inputs q, k, v and an optional mask) and every stored weight
 * set by its name (input x, optional context and mask).  The datatype of the
 * inputs (FP32 or FP64) decides the precision of the computation.  Errors
 * take the protocol's form {"error": "sentence"}, and the sentence names the
 * field at fault.  The route table (route/route.h) holds the paths and
 * captures the model and version; the router (router/api.c) calls these
 * handlers for the v2 endpoints and admits inference under the same limits
 * and draining rules as v1.
 */
#ifndef ATTN_V2_H
#define ATTN_V2_H

#include "message/api_message.h"

/* The handlers of the v2 endpoints (route/route.h), one each, as the
 * router's table names them.  Each answers into resp, which api_handle has
 * zeroed and given its route, and always fills it; a model's name and
 * version come from req->args. */
void v2_handle_server(const api_request *req, const api_env *env, api_response *resp);
void v2_handle_live(const api_request *req, const api_env *env, api_response *resp);
/* 503 with the protocol's readiness body while the server drains. */
void v2_handle_ready(const api_request *req, const api_env *env, api_response *resp);
/* Model metadata, readiness (503 while draining) and the Triton-style
 * configuration; 404 for an unknown model or version. */
void v2_handle_model(const api_request *req, const api_env *env, api_response *resp);
void v2_handle_model_ready(const api_request *req, const api_env *env, api_response *resp);
void v2_handle_config(const api_request *req, const api_env *env, api_response *resp);
/* Triton's statistics: of every model (/v2/models/stats, no model captured)
 * or of the model named. */
void v2_handle_stats(const api_request *req, const api_env *env, api_response *resp);

/* Answers POST .../infer into resp; the caller has admitted the request (not
 * draining, under --max-inflight).  Decodes the JSON header and any binary
 * tensors, checks shapes and the element and memory limits, computes, and
 * answers in JSON or, for outputs asked in binary, with
 * resp->inference_header_length set.  Always fills resp. */
void v2_handle_infer(const api_request *req, const api_env *env, api_response *resp);

/* POST /v2/repository/index (every model, READY) and POST
 * /v2/repository/models/{m}/load or /unload (an error that says how to store
 * or delete a set: the models are always loaded). */
void v2_handle_repository_index(const api_request *req, const api_env *env, api_response *resp);
void v2_handle_repository_control(const api_request *req, const api_env *env,
                                  api_response *resp);

#endif

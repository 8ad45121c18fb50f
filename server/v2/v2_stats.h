/*
 * v2_stats.h - the statistics and model repository extensions of the v2
 * protocol, in Triton's shapes.
 *
 * GET /v2/models/stats and GET /v2/models/{m}[/versions/1]/stats answer
 * {"model_stats": [...]} from model_stats.h; POST /v2/repository/index
 * lists "attention" and every stored set as READY.  The models of this
 * server are its weight sets, so loading and unloading through the
 * repository extension answer an error that says how to store or delete
 * one.  v2.c routes here.
 */
#ifndef ATTN_V2_STATS_H
#define ATTN_V2_STATS_H

#include "message/api_message.h"
#include "v2.h"

/* Answers the statistics of model (borrowed, known to exist), or of every
 * model when model is NULL, into resp: resp->meta, and the JSON body
 * unless req->fields_only. */
void v2_stats_answer(const api_request *req, const char *model, const api_env *env,
                     api_response *resp);

/* Answers POST /v2/repository/index into resp, as v2_stats_answer does. */
void v2_repository_index(const api_request *req, const api_env *env, api_response *resp);

#endif

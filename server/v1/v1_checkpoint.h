/*
 * v1_checkpoint.h - weight sets as safetensors files over HTTP.
 *
 * PUT /v1/weight-sets/{name}?format=safetensors&preset=P&heads=H[&layer=N|all]
 * stores the attention weights of a checkpoint (checkpoint.h) like any
 * other set; with layer=all every layer N becomes the set {name}.N, all of
 * them or none.  GET /v1/weight-sets/{name}?format=safetensors answers the
 * stored set as an F64 safetensors file.  The body limit is --max-body, as
 * for a JSON upload.  The weight-set handler (v1_sets.c) asks
 * v1_checkpoint_format whether a request is for this module and hands it
 * over.
 */
#ifndef ATTN_V1_CHECKPOINT_H
#define ATTN_V1_CHECKPOINT_H

#include "message/api_message.h"
#include "core/config.h"
#include "core/error.h"
#include "store/store.h"

/* The format= a weight-set request asks for: 1 for safetensors, 0 for JSON
 * (absent or "json"), or ERR_BAD_REQUEST with err filled (field "format"). */
int v1_checkpoint_format(const api_request *req, attn_error *err);

/* Answers a PUT of a safetensors body under name (valid, borrowed) into
 * resp: 201 when every set it stores is new, else 200, with the summary
 * of the set (or, for layer=all, {"weight_sets": [...], "count": n}). */
void v1_checkpoint_put(const api_request *req, const char *name, const server_config *cfg,
                        weight_store *store, api_response *resp);

/* Answers set (borrowed) as a safetensors file into resp (200), or the
 * out-of-memory error. */
void v1_checkpoint_get(const weight_set *set, api_response *resp);

#endif

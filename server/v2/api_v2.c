/*
 * api_v2.c - the v2 routes (v2.h) given what they borrow from the router:
 * the configuration, the weight-set store and the draining flag.
 */
#include "router/api_private.h"
#include "v2.h"

void api_v2_get(const api_request *req, api_response *resp)
{
    v2_env env = {api_config(), api_weight_store(), api_is_draining()};
    v2_handle_get(req, &env, resp);
}

void api_v2_infer(const api_request *req, api_response *resp)
{
    v2_env env = {api_config(), api_weight_store(), api_is_draining()};
    v2_handle_infer(req, &env, resp);
}

void api_v2_repository(const api_request *req, api_response *resp)
{
    v2_env env = {api_config(), api_weight_store(), api_is_draining()};
    v2_handle_repository(req, &env, resp);
}

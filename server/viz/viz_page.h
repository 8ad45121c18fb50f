/*
 * viz_page.h - the handler of the visualizer's routes: GET / (a redirect to
 * the page), GET /viz (the page) and GET /viz/NAME (its files and the golden
 * examples under /viz/examples/), all built into the binary (viz.h).
 */
#ifndef ATTN_VIZ_PAGE_H
#define ATTN_VIZ_PAGE_H

#include "message/api_message.h"

/* Answers a GET of the visualizer's routes (the router's ENDPOINT_VIZ) into
 * resp; always fills it. */
void viz_page_handle(const api_request *req, const api_env *env, api_response *resp);

#endif

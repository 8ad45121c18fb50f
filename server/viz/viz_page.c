/*
 * viz_page.c - the visualizer's routes: GET / (a redirect to the page),
 * GET /viz (the page) and GET /viz/NAME (its files, and the golden examples
 * under /viz/examples/), all built into the binary (viz.h).
 */
#include <stdio.h>
#include <string.h>

#include "message/answer.h"
#include "viz.h"
#include "viz_page.h"

#define VIZ_PREFIX "/viz/"

void viz_page_handle(const api_request *req, const api_env *env, api_response *resp)
{
    (void)env;
    const char *path = req->path;
    attn_error err;
    if (!strcmp(path, "/")) {
        snprintf(resp->location, sizeof resp->location, "/viz");
        answer_static(resp, 302, "");
        return;
    }
    const char *name = !strcmp(path, "/viz") ? "" : path + strlen(VIZ_PREFIX);
    if (!strcmp(name, "examples/") || !strcmp(name, "examples")) {
        resp->body = viz_examples_json(&resp->body_len);
        if (resp->body == NULL) {
            error_nomem(&err);
            answer_error(resp, &err);
            return;
        }
        resp->status = 200;
        resp->content_type = "application/json";
        return;
    }
    const viz_asset *asset = viz_find(name);
    if (asset == NULL) {
        error_set(&err, ERR_NOT_FOUND, "not_found", NULL,
                  "The visualizer has no file %.200s; the page is GET /viz.", path);
        answer_error(resp, &err);
        return;
    }
    resp->status = 200;
    resp->body = (char *)asset->data;
    resp->body_len = asset->size;
    resp->body_static = 1;
    resp->content_type = viz_content_type(asset->name);
}

/*
 * v1_info.c - what the server says of itself: GET /healthz and /readyz (the
 * probes), /v1/info (version, build, BLAS, limits) and /metrics.
 */
#include <jansson.h>

#include "message/answer.h"
#include "kernel/attention.h"
#include "kernel/blas_setup.h"
#include "core/compute.h"
#include "core/sizing.h"
#include "metrics/metrics.h"
#include "store/store.h"
#include "core/version.h"
#include "v1.h"

void v1_probe_healthz(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    (void)env;
    answer_static(resp, 200, "{\"status\":\"ok\"}\n");
}

/* Not ready while draining, nor when the shared weight-set directory has
 * been unreadable for three sync intervals: this replica may serve stale
 * sets then. */
void v1_probe_readyz(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    if (env->draining) {
        answer_draining(resp);
        return;
    }
    store_status st;
    store_get_status(env->store, &st);
    if (st.interval_ms > 0 && (st.last_ok_age_ms < 0 || st.last_ok_age_ms > 3LL * st.interval_ms)) {
        attn_error err;
        resp->retry_after = (int)(st.interval_ms / 1000) + 1;
        store_info where;
        store_get_info(env->store, &where);
        error_set(&err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                  "The weight-set store %s has not been read for %lld ms (more than "
                  "three --store-sync-interval); sets written elsewhere may be missing here.",
                  where.location, st.last_ok_age_ms);
        answer_error(resp, &err);
        return;
    }
    answer_static(resp, 200, "{\"status\":\"ready\"}\n");
}

/* The settings that follow the machine, each with its value and where it
 * came from ("flag", "env", "cores", "cgroup"), as sizing_resolve chose them. */
static json_t *sizing_json(void)
{
    const server_sizing *sz = sizing_get();
    return json_pack("{s:i, s:s, s:{s:I, s:s}, s:{s:I, s:s}, s:{s:I, s:s}}",
                     "cpus", (int)sz->cpus, "cpus_source", sz->cpus_source ? sz->cpus_source : "",
                     "compute_threads", "value", (json_int_t)sz->compute_threads.value, "source",
                     sz->compute_threads.source ? sz->compute_threads.source : "",
                     "io_threads", "value", (json_int_t)sz->io_threads.value, "source",
                     sz->io_threads.source ? sz->io_threads.source : "",
                     "max_inflight", "value", (json_int_t)sz->max_inflight.value, "source",
                     sz->max_inflight.source ? sz->max_inflight.source : "");
}

void v1_info_handle(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    const server_config *cfg = env->cfg;
    char config[256], core[64];
    int threads;
    attention_blas_describe(config, sizeof config, core, sizeof core, &threads);
    const char *paths[8];
    size_t path_count = attention_kernel_available(paths, 8);
    json_t *available = json_array();
    for (size_t i = 0; i < path_count; i++)
        json_array_append_new(available, json_string(paths[i]));
    int l2_reported;
    size_t l2 = attention_kernel_l2_bytes(&l2_reported);
    json_t *block_rows = json_pack("{s:I, s:I}", "float32",
                                   (json_int_t)attention_kernel_block_rows(64, sizeof(float)),
                                   "float64",
                                   (json_int_t)attention_kernel_block_rows(64, sizeof(double)));
    json_t *info = json_pack(
        "{s:s, s:s, s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s, s:s, s:i}, s:{s:i, s:i}, "
        "s:{s:s, s:o, s:I, s:s, s:o}, s:[s, s], "
        "s:{s:I, s:I, s:I, s:I, s:I}, s:{s:I}}",
        "name", "attention-server", "version", ATTN_VERSION, "contract", "v1",
        "build", "commit", ATTN_BUILD_COMMIT, "date", ATTN_BUILD_DATE, "compiler", __VERSION__,
        "blas", "library", "OpenBLAS", "config", config, "core", core,
        "core_chosen_by", blas_setup_chosen_by(), "threads", threads,
        "compute", "threads", (int)compute_threads(), "available_cpus", (int)compute_available_cpus(),
        "kernel", "path", attention_kernel_path(), "available", available,
        "l2_cache_bytes", (json_int_t)l2, "l2_cache_source", l2_reported ? "cpu" : "assumed",
        "block_rows_head_dim_64", block_rows,
        "dtypes", "float64", "float32",
        "limits", "max_body_bytes", (json_int_t)cfg->max_body,
        "max_elements", (json_int_t)cfg->max_elements,
        "max_request_memory_bytes", (json_int_t)cfg->max_request_memory,
        "max_inflight", (json_int_t)cfg->max_inflight,
        "max_connections", (json_int_t)cfg->max_connections,
        "grpc", "port", (json_int_t)(cfg->grpc_port > 0 ? cfg->grpc_port : 0));
    json_object_set_new(info, "sizing", sizing_json());
    store_info where;
    store_get_info(env->store, &where);
    json_object_set_new(info, "store",
                        json_pack("{s:s, s:s, s:s}", "backend", where.backend, "location",
                                  where.location, "conditional_writes",
                                  where.conditional_writes));
    answer_json(resp, 200, info);
}

void v1_metrics_handle(const api_request *req, const api_env *env, api_response *resp)
{
    (void)req;
    (void)env;
    resp->body = metrics_render(&resp->body_len);
    if (resp->body == NULL) {
        attn_error err;
        error_nomem(&err);
        answer_error(resp, &err);
        return;
    }
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

/*
 * itest_protocol.c - what one request and its answer cannot say about the protocol:
 * GET /v1/info against the flags and environment each server was started with (the
 * compute threads depend on the CPUs the server reports), and /metrics counting the
 * traffic of the earlier groups. Health, readiness, CORS and the Allow header of 405
 * answers are cases/protocol.json.
 */
#include <strings.h>
#include <unistd.h>

#include "itest.h"

/* blas.core is the widest OpenBLAS has for this CPU, unless the operator chose one with
 * OPENBLAS_CORETYPE (server/kernel/blas_setup.c); blas.core_chosen_by says which happened. */
static void check_blas_core(struct test *t, const json_t *blas)
{
    const char *core = json_string_value(json_object_get(blas, "core"));
    const char *by = json_string_value(json_object_get(blas, "core_chosen_by"));
    if (!expect_true(t, core != NULL && by != NULL, "blas.core or blas.core_chosen_by is missing"))
        return;
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    if (getenv("OPENBLAS_CORETYPE") != NULL)
        expect_true(t, strcmp(by, "OPENBLAS_CORETYPE set by the operator") == 0,
                    "OPENBLAS_CORETYPE is set, yet blas.core_chosen_by is \"%s\"", by);
    else if (avx512)
        expect_true(t, strncasecmp(core, "SkylakeX", 8) == 0 || strncasecmp(core, "Cooperlake", 10) == 0 ||
                           strncasecmp(core, "SapphireRapids", 14) == 0,
                    "the CPU has AVX-512, yet OpenBLAS runs core %s (%s)", core, by);
    else
        expect_true(t, strcmp(by, "as OpenBLAS detected it") == 0,
                    "no AVX-512 and no OPENBLAS_CORETYPE, yet blas.core_chosen_by is \"%s\"", by);
}

/* GET /v1/info on server id and check the values it was started with. */
static void check_info(enum server_id id)
{
    struct test t;
    if (!test_begin(&t, "protocol/info/%s", g_server_kinds[id].label))
        return;
    struct server *s = test_server(&t, id);
    struct client_response r = {0};
    json_t *body = NULL;
    if (s == NULL)
        goto done;
    http_simple(s, "GET", "/v1/info", &r);
    if (!expect_status(&t, &r, 200))
        goto done;
    body = response_json(&r);
    const json_t *blas = json_object_get(body, "blas");
    const json_t *limits = json_object_get(body, "limits");
    const json_t *compute = json_object_get(body, "compute");
    const json_t *version = json_object_get(body, "version");
    const json_t *dtypes = json_object_get(body, "dtypes");
    int has64 = 0, has32 = 0;
    for (size_t i = 0; i < json_array_size(dtypes); i++) {
        const char *d = json_string_value(json_array_get(dtypes, i));
        has64 |= d != NULL && strcmp(d, "float64") == 0;
        has32 |= d != NULL && strcmp(d, "float32") == 0;
    }
    if (!expect_true(&t, json_is_object(body), "body is not a JSON object") ||
        !expect_true(&t, json_is_string(version) && json_string_length(version) > 0, "version is not a non-empty string") ||
        !expect_true(&t, json_is_object(blas), "no blas object") ||
        !expect_true(&t, json_is_object(limits), "no limits object") ||
        !expect_true(&t, json_is_object(compute), "no compute object"))
        goto done;
    /* OpenBLAS runs each product on one thread; the compute pool supplies the parallelism. */
    expect_json_integer(&t, blas, "blas", "threads", 1);
    check_blas_core(&t, blas);
    json_int_t cpus = json_integer_value(json_object_get(compute, "available_cpus"));
    expect_true(&t, cpus >= 1, "compute.available_cpus is not a positive integer");
    expect_json_integer(&t, compute, "compute", "threads",
                        g_expected_compute_threads[id] ? g_expected_compute_threads[id] : cpus);
    expect_json_integer(&t, limits, "limits", "max_body_bytes", g_expected_max_body[id]);
    expect_json_integer(&t, limits, "limits", "max_elements", g_expected_max_elements[id]);
    expect_true(&t, has64 && has32, "dtypes does not list both float64 and float32");
    /* The kernel's blocks follow this CPU's L2 as glibc reports it (256 KiB assumed without). */
    const json_t *kernel = json_object_get(body, "kernel");
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    expect_json_integer(&t, kernel, "kernel", "l2_cache_bytes", l2 > 0 ? l2 : 256 * 1024);
    const char *source = json_string_value(json_object_get(kernel, "l2_cache_source"));
    expect_true(&t, source != NULL && strcmp(source, l2 > 0 ? "cpu" : "assumed") == 0,
                "kernel.l2_cache_source does not say where the L2 size came from");
    const json_t *rows = json_object_get(kernel, "block_rows_head_dim_64");
    for (int p = 0; p < 2; p++) {
        json_int_t n = json_integer_value(json_object_get(rows, p ? "float64" : "float32"));
        expect_true(&t, n >= 48 && n <= 384 && n % 6 == 0,
                    "kernel.block_rows_head_dim_64 is not whole groups of 6 rows in [48, 384]");
    }
done:
    json_decref(body);
    client_response_free(&r);
    test_end(&t);
}

/* The value of an unlabelled counter in the /metrics text of s, or -1 when it is absent. */
static double metric_value(const struct server *s, const char *name)
{
    struct client_response r;
    http_simple(s, "GET", "/metrics", &r);
    double v = -1;
    size_t n = strlen(name);
    for (const char *line = r.status == 200 ? r.body : NULL; line != NULL && *line;) {
        if (strncmp(line, name, n) == 0 && line[n] == ' ')
            v = strtod(line + n + 1, NULL);
        const char *end = strchr(line, '\n');
        line = end != NULL ? end + 1 : NULL;
    }
    client_response_free(&r);
    return v;
}

/* A visualizer file is the same bytes on every request: compressed once per coding and kept,
 * which attn_http_static_compressions_total shows (the first request may compress it, the
 * next five must not). */
static void check_static_compressed_once(void)
{
    struct test t;
    struct server *s;
    if (!test_start(&t, SERVER_DEFAULT, &s, "protocol/viz-asset-compressed-once"))
        return;
    struct client_request rq = {.method = "GET", .path = "/viz/viz.js",
                                .headers = {"Accept-Encoding: gzip"}};
    struct client_response r;
    http_call(s, &rq, &r);
    expect_status(&t, &r, 200);
    expect_header_equals(&t, &r, "Content-Encoding", "gzip");
    client_response_free(&r);
    double before = metric_value(s, "attn_http_static_compressions_total");
    expect_true(&t, before >= 1, "attn_http_static_compressions_total is %.0f after a gzip'd "
                "/viz/viz.js (-1: absent)", before);
    for (int i = 0; i < 5; i++) {
        http_call(s, &rq, &r);
        expect_status(&t, &r, 200);
        client_response_free(&r);
    }
    double after = metric_value(s, "attn_http_static_compressions_total");
    expect_true(&t, after == before, "five more requests compressed %.0f times", after - before);
    test_end(&t);
}

/* /v1/info on three kinds of server, then /metrics after the traffic of the earlier groups. */
void run_protocol_tests(const struct itest_paths *paths)
{
    (void)paths;
    struct test t;
    struct client_response r;
    struct server *s;

    check_info(SERVER_DEFAULT);
    check_info(SERVER_SMALL_LIMITS);
    check_info(SERVER_CORS);
    check_static_compressed_once();

    /* Metrics come after some traffic, so the request counter must have a 200 in it. */
    if (test_start(&t, SERVER_DEFAULT, &s, "protocol/metrics")) {
        static const char *const names[] = {"attn_http_requests_total", "attn_http_request_duration_seconds",
                                            "attn_http_request_bytes_total", "attn_http_response_bytes_total",
                                            "attn_http_inflight_requests",
                                            "attn_http_slow_connections_closed_total",
                                            "attn_http_static_compressions_total"};
        http_simple(s, "GET", "/metrics", &r);
        if (expect_status(&t, &r, 200)) {
            expect_header_contains(&t, &r, "Content-Type", "text/plain");
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                expect_true(&t, strstr(r.body, names[i]) != NULL, "no %s in the metrics text", names[i]);
            /* Some line attn_http_requests_total{...code="200"...} N must have N >= 1. */
            int counted = 0;
            for (const char *line = r.body; line != NULL && *line != '\0';) {
                const char *end = strchr(line, '\n');
                size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
                char buf[512];
                snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
                const char *close = strrchr(buf, '}');
                if (strncmp(buf, "attn_http_requests_total{", 25) == 0 && strstr(buf, "code=\"200\"") != NULL &&
                    close != NULL && strtod(close + 1, NULL) >= 1.0)
                    counted = 1;
                line = end != NULL ? end + 1 : NULL;
            }
            expect_true(&t, counted, "no attn_http_requests_total{...code=\"200\"...} line with a count >= 1");
        }
        client_response_free(&r);
        test_end(&t);
    }
}

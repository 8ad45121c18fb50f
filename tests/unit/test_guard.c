/*
 * test_guard.c - the checks before routing: tokens, CORS origins, Host,
 * framing, control bytes in paths, and failing allocations in guard_new.
 */
#include <stdlib.h>

#include "core/sizing.h"
#include "guard/guard.h"
#include "core/mem.h"
#include "route/route.h"
#include "test.h"
#include "core/test_hooks.h"

#define TOKEN_A "tok-aaaaaaaaaaaaaaaaaaaa"
#define TOKEN_B "tok-bbbbbbbbbbbbbbbbbbbb"

/* Defaults of the configuration table, as a server started without flags. */
static void base_config(server_config *cfg)
{
    char errbuf[256];
    char *argv[] = {"attention-server", NULL};
    FILE *sink = fopen("/dev/null", "w");
    config_load(cfg, 1, argv, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(cfg, 1, "cores"); /* as main.c does */
}

/* Runs guard_check on a request with the given header lines ("Name", "value"
 * pairs, NULL-terminated); returns the ERR_* code. */
static int check(const guard *g, const char *method, const char *path, const char *const *pairs,
                 guard_verdict *v, attn_error *err)
{
    guard_header headers[16];
    size_t n = 0;
    for (; pairs[2 * n] != NULL; n++)
        headers[n] = (guard_header){pairs[2 * n], pairs[2 * n + 1]};
    guard_request rq = {.method = method, .path = path, .version = "HTTP/1.1", .headers = headers,
                        .header_count = n, .probe = route_find(path, NULL)->probe};
    return guard_check(g, &rq, v, err);
}

void test_guard_auth_writes(void)
{
    server_config cfg;
    base_config(&cfg);
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, " %s , %s ", TOKEN_A, TOKEN_B);
    cfg.auth_writes = 1;
    attn_error err;
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    guard_verdict v;
    const char *none[] = {"Host", "localhost:8080", NULL};
    const char *good_b[] = {"Host", "localhost", "Authorization", "Bearer " TOKEN_B, NULL};
    const char *lower[] = {"Host", "localhost", "Authorization", "bearer  " TOKEN_A " ", NULL};
    const char *wrong[] = {"Host", "localhost", "Authorization", "Bearer " TOKEN_A "x", NULL};
    const char *prefix[] = {"Host", "localhost", "Authorization", "Bearer tok-aaaa", NULL};
    const char *basic[] = {"Host", "localhost", "Authorization", "Basic " TOKEN_A, NULL};
    const char *empty[] = {"Host", "localhost", "Authorization", "Bearer ", NULL};
    ASSERT_EQ(check(g, "GET", "/v1/weight-sets/a", none, &v, &err), 0);
    ASSERT_EQ(check(g, "POST", "/v1/attention", none, &v, &err), 0);
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/a", none, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(error_http_status(err.kind), 401);
    ASSERT_STR_EQ(err.code, "unauthorized");
    ASSERT_STR_EQ(v.www_authenticate, "Bearer realm=\"attention-server\"");
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/a", wrong, &v, &err), ERR_UNAUTHORIZED);
    ASSERT(strstr(v.www_authenticate, "invalid_token") != NULL);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/a", prefix, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/a", basic, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/a", empty, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/a", good_b, &v, &err), 0);
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/a", lower, &v, &err), 0);
    ASSERT_EQ(check(g, "OPTIONS", "/v1/weight-sets/a", none, &v, &err), 0);
    guard_free(g);
}

void test_guard_auth_all_spares_probes(void)
{
    server_config cfg;
    base_config(&cfg);
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "%s", TOKEN_A);
    cfg.auth_all = 1;
    attn_error err;
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    guard_verdict v;
    const char *none[] = {"Host", "127.0.0.1:9", NULL};
    const char *good[] = {"Host", "127.0.0.1:9", "Authorization", "Bearer " TOKEN_A, NULL};
    ASSERT_EQ(check(g, "GET", "/healthz", none, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/readyz", none, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/v2/health/live", none, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/metrics", none, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "GET", "/v1/info", none, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "POST", "/v1/attention", none, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "GET", "/healthzz", none, &v, &err), ERR_UNAUTHORIZED);
    ASSERT_EQ(check(g, "POST", "/v1/attention", good, &v, &err), 0);
    guard_free(g);
}

void test_guard_token_settings(void)
{
    server_config cfg;
    attn_error err;
    base_config(&cfg);
    cfg.auth_writes = 1;
    ASSERT(guard_new(&cfg, &err) == NULL); /* protection without a token */
    ASSERT(strstr(err.message, "ATTN_AUTH_TOKENS") != NULL);
    base_config(&cfg);
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "%s", TOKEN_A);
    ASSERT(guard_new(&cfg, &err) == NULL); /* a token that protects nothing */
    cfg.auth_all = 1;
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "short");
    ASSERT(guard_new(&cfg, &err) == NULL);
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "has space in it, long enough");
    ASSERT(guard_new(&cfg, &err) == NULL);

    /* A token file: comments and blank lines skipped. */
    char path[] = "/tmp/test-guard-tokens-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# tokens\n\n%s\n  %s  \n", TOKEN_A, TOKEN_B);
    fclose(f);
    base_config(&cfg);
    cfg.auth_all = 1;
    snprintf(cfg.auth_token_file, sizeof cfg.auth_token_file, "%s", path);
    guard *g = guard_new(&cfg, &err);
    remove(path);
    ASSERT(g != NULL);
    guard_verdict v;
    const char *b[] = {"Host", "localhost", "Authorization", "Bearer " TOKEN_B, NULL};
    const char *comment[] = {"Host", "localhost", "Authorization", "Bearer # tokens", NULL};
    ASSERT_EQ(check(g, "GET", "/v1/info", b, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/v1/info", comment, &v, &err), ERR_UNAUTHORIZED);
    guard_free(g);
    snprintf(cfg.auth_token_file, sizeof cfg.auth_token_file, "%s", path); /* now gone */
    ASSERT(guard_new(&cfg, &err) == NULL);
    ASSERT_STR_EQ(err.code, "bad_config");
}

void test_guard_cors_origins(void)
{
    server_config cfg;
    attn_error err;
    int vary;
    base_config(&cfg);
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    ASSERT_STR_EQ(guard_cors_origin(g, "https://a.example", &vary), "*");
    ASSERT_EQ(vary, 0);
    guard_free(g);

    snprintf(cfg.cors_origin, sizeof cfg.cors_origin, "https://a.example, http://b.example:8000/");
    g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    ASSERT_STR_EQ(guard_cors_origin(g, "https://a.example", &vary), "https://a.example");
    ASSERT_EQ(vary, 1);
    ASSERT_STR_EQ(guard_cors_origin(g, "http://b.example:8000", &vary), "http://b.example:8000");
    ASSERT(guard_cors_origin(g, "https://a.example, http://b.example:8000", &vary) == NULL);
    ASSERT(guard_cors_origin(g, "https://evil.example", &vary) == NULL);
    ASSERT_EQ(vary, 1);
    ASSERT(guard_cors_origin(g, NULL, &vary) == NULL);
    guard_free(g);

    const char *off[] = {"", "off", "none", " , "};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        snprintf(cfg.cors_origin, sizeof cfg.cors_origin, "%s", off[i]);
        g = guard_new(&cfg, &err);
        ASSERT(g != NULL);
        ASSERT(guard_cors_origin(g, "https://a.example", &vary) == NULL);
        ASSERT_EQ(vary, 0);
        guard_free(g);
    }
    snprintf(cfg.cors_origin, sizeof cfg.cors_origin, "viz.example");
    ASSERT(guard_new(&cfg, &err) == NULL);
    ASSERT(strstr(err.message, "scheme://") != NULL);
}

/* At the defaults (--cors-origin *, no tokens) a page of a foreign origin may
 * read and compute but not write; its own page, a listed origin, a request
 * without Origin and any request when writes need a token may. */
void test_guard_cross_origin_writes(void)
{
    server_config cfg;
    attn_error err;
    guard_verdict v;
    base_config(&cfg);
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *evil[] = {"Host", "localhost:8080", "Origin", "https://evil.example", NULL};
    const char *own[] = {"Host", "localhost:8080", "Origin", "http://localhost:8080", NULL};
    const char *other_port[] = {"Host", "localhost:8080", "Origin", "http://localhost:8081", NULL};
    const char *null_origin[] = {"Host", "localhost:8080", "Origin", "null", NULL};
    const char *none[] = {"Host", "localhost:8080", NULL};
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/x", evil, &v, &err), ERR_FORBIDDEN);
    ASSERT_STR_EQ(err.code, "cross_origin_write");
    ASSERT(strstr(err.message, "--cors-write-origins") != NULL);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", evil, &v, &err), ERR_FORBIDDEN);
    ASSERT_EQ(check(g, "PATCH", "/v1/weight-sets/x", evil, &v, &err), ERR_FORBIDDEN);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", other_port, &v, &err), ERR_FORBIDDEN);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", null_origin, &v, &err), ERR_FORBIDDEN);
    ASSERT_EQ(check(g, "GET", "/v1/weight-sets/x", evil, &v, &err), 0);
    ASSERT_EQ(check(g, "POST", "/v1/attention", evil, &v, &err), 0);
    ASSERT_EQ(check(g, "OPTIONS", "/v1/weight-sets/x", evil, &v, &err), 0);
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/x", own, &v, &err), 0);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", none, &v, &err), 0);
    /* The preflight tells a foreign page only the methods it may use. */
    char buf[64];
    const char *set = "GET, HEAD, PUT, DELETE, OPTIONS";
    ASSERT_STR_EQ(guard_cors_methods(g, set, "https://evil.example", "localhost:8080", buf,
                                     sizeof buf), "GET, HEAD, OPTIONS");
    ASSERT_STR_EQ(guard_cors_methods(g, set, "http://localhost:8080", "localhost:8080", buf,
                                     sizeof buf), set);
    ASSERT_STR_EQ(guard_cors_methods(g, "POST, OPTIONS", "https://evil.example", "localhost",
                                     buf, sizeof buf), "POST, OPTIONS");
    guard_free(g);

    snprintf(cfg.cors_write_origins, sizeof cfg.cors_write_origins,
             " https://admin.example/ , http://tool.example:9000");
    g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *admin[] = {"Host", "localhost:8080", "Origin", "https://ADMIN.example", NULL};
    const char *tool[] = {"Host", "localhost:8080", "Origin", "http://tool.example:9000", NULL};
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/x", admin, &v, &err), 0);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", tool, &v, &err), 0);
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/x", evil, &v, &err), ERR_FORBIDDEN);
    ASSERT_STR_EQ(guard_cors_methods(g, set, "http://tool.example:9000", "localhost:8080", buf,
                                     sizeof buf), set);
    guard_free(g);

    cfg.cors_write_origins[0] = '\0';
    cfg.auth_writes = 1;
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "%s", TOKEN_A);
    g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *evil_token[] = {"Host", "localhost:8080", "Origin", "https://evil.example",
                                "Authorization", "Bearer " TOKEN_A, NULL};
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/x", evil_token, &v, &err), 0);
    ASSERT_EQ(check(g, "PUT", "/v1/weight-sets/x", evil, &v, &err), ERR_UNAUTHORIZED);
    guard_free(g);
}

void test_guard_cors_write_settings(void)
{
    server_config cfg;
    attn_error err;
    base_config(&cfg);
    ASSERT_STR_EQ(cfg.cors_write_origins, "");
    snprintf(cfg.cors_write_origins, sizeof cfg.cors_write_origins, "https://a.example, admin");
    ASSERT(guard_new(&cfg, &err) == NULL);
    ASSERT_STR_EQ(err.code, "bad_config");
    ASSERT_STR_EQ(err.field, "cors_write_origins");
    snprintf(cfg.cors_write_origins, sizeof cfg.cors_write_origins, "https://");
    ASSERT(guard_new(&cfg, &err) == NULL);
}

void test_guard_host_allow_list(void)
{
    server_config cfg;
    attn_error err;
    guard_verdict v;
    base_config(&cfg); /* --host 127.0.0.1: checked by default */
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *ok[] = {"localhost", "LOCALHOST:8080", "127.0.0.1", "127.0.0.1:1", "[::1]",
                        "[::1]:8080"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const char *h[] = {"Host", ok[i], NULL};
        ASSERT_EQ(check(g, "GET", "/healthz", h, &v, &err), 0);
    }
    const char *bad[] = {"evil.example", "evil.example:8080", "localhost.evil.example",
                         "127.0.0.1.nip.io", "::1", "localhost:", "localhost:80x", "[::1]x",
                         "", "127.0.0.2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *h[] = {"Host", bad[i], NULL};
        ASSERT_EQ(check(g, "GET", "/healthz", h, &v, &err), ERR_BAD_REQUEST);
        ASSERT_STR_EQ(err.code, "host_not_allowed");
    }
    const char *missing[] = {NULL};
    ASSERT_EQ(check(g, "GET", "/healthz", missing, &v, &err), ERR_BAD_REQUEST);
    const char *two[] = {"Host", "localhost", "Host", "evil.example", NULL};
    ASSERT_EQ(check(g, "GET", "/healthz", two, &v, &err), ERR_BAD_REQUEST);
    guard_free(g);

    /* Not loopback: any Host, unless a list is given. */
    snprintf(cfg.host, sizeof cfg.host, "0.0.0.0");
    g = guard_new(&cfg, &err);
    const char *any[] = {"Host", "evil.example", NULL};
    ASSERT_EQ(check(g, "GET", "/healthz", any, &v, &err), 0);
    guard_free(g);
    snprintf(cfg.allowed_hosts, sizeof cfg.allowed_hosts, "api.example, .svc.cluster.local");
    g = guard_new(&cfg, &err);
    const char *api[] = {"Host", "API.example:443", NULL};
    const char *svc[] = {"Host", "attention.default.svc.cluster.local:8080", NULL};
    const char *bare[] = {"Host", "svc.cluster.local", NULL};
    const char *near[] = {"Host", "evilsvc.cluster.local", NULL};
    ASSERT_EQ(check(g, "GET", "/healthz", api, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/healthz", svc, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/healthz", bare, &v, &err), 0);
    ASSERT_EQ(check(g, "GET", "/healthz", near, &v, &err), ERR_BAD_REQUEST);
    ASSERT_EQ(check(g, "GET", "/healthz", any, &v, &err), ERR_BAD_REQUEST);
    guard_free(g);
    /* "*" turns the check off, also on loopback. */
    snprintf(cfg.host, sizeof cfg.host, "::1");
    snprintf(cfg.allowed_hosts, sizeof cfg.allowed_hosts, "*");
    g = guard_new(&cfg, &err);
    ASSERT_EQ(check(g, "GET", "/healthz", any, &v, &err), 0);
    guard_free(g);

    ASSERT_EQ(guard_is_loopback("127.0.0.1"), 1);
    ASSERT_EQ(guard_is_loopback("127.1.2.3"), 1);
    ASSERT_EQ(guard_is_loopback("::1"), 1);
    ASSERT_EQ(guard_is_loopback("localhost"), 1);
    ASSERT_EQ(guard_is_loopback("0.0.0.0"), 0);
    ASSERT_EQ(guard_is_loopback("::"), 0);
    ASSERT_EQ(guard_is_loopback("127.0.0.1.example"), 0);
    ASSERT_EQ(guard_is_loopback("10.0.0.1"), 0);
}

void test_guard_framing(void)
{
    server_config cfg;
    attn_error err;
    guard_verdict v;
    base_config(&cfg);
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *one[] = {"Host", "localhost", "Content-Length", "12", NULL};
    const char *chunked[] = {"Host", "localhost", "Transfer-Encoding", "Chunked", NULL};
    const char *v2[] = {"Host", "localhost", "Inference-Header-Content-Length", "2", NULL};
    ASSERT_EQ(check(g, "POST", "/v1/attention", one, &v, &err), 0);
    ASSERT_EQ(check(g, "POST", "/v2/models/attention/infer", v2, &v, &err), 0);
    ASSERT_EQ(check(g, "POST", "/v1/attention", chunked, &v, &err), 0);
    const char *const bad[][7] = {
        {"Host", "localhost", "Content-Length", "12", "Content-Length", "12", NULL},
        {"Host", "localhost", "Content-Length", "12", "content-length", "13", NULL},
        {"Host", "localhost", "Transfer-Encoding", "chunked", "Content-Length", "5", NULL},
        {"Host", "localhost", "Transfer-Encoding", "gzip, chunked", NULL},
        {"Host", "localhost", "Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked", NULL},
        {"Host", "localhost", "Content-Length", "+12", NULL},
        {"Host", "localhost", "Inference-Header-Content-Length", "2",
         "inference-header-content-length", "3", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(check(g, "POST", "/v1/attention", bad[i], &v, &err), ERR_BAD_REQUEST);
        ASSERT_STR_EQ(err.code, "ambiguous_framing");
        ASSERT_EQ(v.close, 1);
    }
    /* Framing is judged before the Host: a smuggling attempt is never routed. */
    const char *evil[] = {"Host", "evil", "Transfer-Encoding", "chunked", "Content-Length", "5", NULL};
    ASSERT_EQ(check(g, "POST", "/v1/attention", evil, &v, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "ambiguous_framing");
    guard_header h = {"Transfer-Encoding", "chunked"};
    guard_header host = {"Host", "localhost"};
    guard_header hs[2] = {host, h};
    guard_request old = {.method = "POST", .path = "/v1/attention", .version = "HTTP/1.0",
                         .headers = hs, .header_count = 2};
    ASSERT_EQ(guard_check(g, &old, &v, &err), ERR_BAD_REQUEST);

    /* Sizes: 414 and 431 as JSON errors. */
    char *path = malloc(GUARD_MAX_TARGET + 2);
    ASSERT(path != NULL);
    memset(path, 'a', GUARD_MAX_TARGET + 1);
    path[0] = '/';
    path[GUARD_MAX_TARGET + 1] = '\0';
    const char *host_only[] = {"Host", "localhost", NULL};
    int rc = check(g, "GET", path, host_only, &v, &err);
    path[GUARD_MAX_TARGET] = '\0';
    int rc_at_limit = check(g, "GET", path, host_only, &v, &err);
    const char *big[] = {"Host", "localhost", "X-Big", path, "X-Big2", path, NULL};
    int rc_headers = check(g, "GET", "/healthz", big, &v, &err);
    free(path);
    ASSERT_EQ(rc, ERR_URI_TOO_LONG);
    ASSERT_EQ(error_http_status(rc), 414);
    ASSERT_EQ(rc_at_limit, 0);
    ASSERT_EQ(rc_headers, ERR_HEADERS_TOO_LARGE);
    ASSERT_EQ(error_http_status(rc_headers), 431);
    guard_header many[GUARD_MAX_HEADERS];
    for (size_t i = 0; i < GUARD_MAX_HEADERS; i++)
        many[i] = host;
    guard_request flood = {.method = "GET", .path = "/healthz", .version = "HTTP/1.1",
                           .headers = many, .header_count = GUARD_MAX_HEADERS + 1};
    ASSERT_EQ(guard_check(g, &flood, &v, &err), ERR_HEADERS_TOO_LARGE);
    guard_free(g);
}

void test_guard_control_bytes_in_path(void)
{
    char path[] = "/v1/weight-sets/prod%00junk";
    ASSERT_EQ(guard_unescape(path), strlen("/v1/weight-sets/prod") + 5);
    ASSERT_EQ((unsigned char)path[20], 0x7f);
    ASSERT_STR_EQ(path + 21, "junk");
    char plain[] = "/v1/weight-sets/a%2Eb%2ec%zz%4";
    guard_unescape(plain);
    ASSERT_STR_EQ(plain, "/v1/weight-sets/a.b.c%zz%4");

    server_config cfg;
    attn_error err;
    guard_verdict v;
    base_config(&cfg);
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    const char *h[] = {"Host", "localhost", NULL};
    const char *bad[] = {"/v1/weight-sets/prod\x7fjunk", "/v1/weight-sets/a\nb",
                         "/v1/weight-sets/\x01", "/v1/weight-sets/a\tb"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(check(g, "DELETE", bad[i], h, &v, &err), ERR_BAD_REQUEST);
        ASSERT_STR_EQ(err.code, "invalid_path");
    }
    ASSERT_EQ(check(g, "DELETE", "/v1/weight-sets/caf\xc3\xa9", h, &v, &err), 0);
    guard_free(g);
}

void test_guard_new_out_of_memory(void)
{
    server_config cfg;
    base_config(&cfg);
    snprintf(cfg.auth_tokens, sizeof cfg.auth_tokens, "%s,%s", TOKEN_A, TOKEN_B);
    snprintf(cfg.cors_origin, sizeof cfg.cors_origin, "https://a.example,https://b.example");
    cfg.auth_all = 1;
    attn_error err;
    for (long n = 0;; n++) {
        mem_fail_after(n);
        guard *g = guard_new(&cfg, &err);
        long live = mem_fail_live();
        long failures = mem_failures();
        guard_free(g);
        mem_fail_reset();
        if (failures == 0) {
            ASSERT(g != NULL);
            break;
        }
        ASSERT(g == NULL);
        ASSERT_EQ(live, 0);
        ASSERT_EQ(err.kind, ERR_UNAVAILABLE);
        ASSERT(n < 100);
    }
}

/* The whole target counts against GUARD_MAX_TARGET; a query parameter given twice (in
 * any case) or too many parameters are refused, naming the parameter. */
void test_guard_query(void)
{
    server_config cfg;
    attn_error err;
    guard_verdict v;
    base_config(&cfg);
    guard *g = guard_new(&cfg, &err);
    ASSERT(g != NULL);
    guard_header host = {"Host", "localhost"};
    guard_request rq = {.method = "GET", .path = "/healthz", .version = "HTTP/1.1",
                        .headers = &host, .header_count = 1,
                        .target_bytes = GUARD_MAX_TARGET + 1};
    ASSERT_EQ(guard_check(g, &rq, &v, &err), ERR_URI_TOO_LONG);
    rq.target_bytes = GUARD_MAX_TARGET;
    ASSERT_EQ(guard_check(g, &rq, &v, &err), 0);

    guard_header args[GUARD_MAX_ARGS] = {{"format", "safetensors"}, {"preset", "torch_mha"},
                                         {"Preset", "evil"}};
    rq.method = "PUT";
    rq.path = "/v1/weight-sets/a";
    rq.args = args;
    rq.arg_count = 2;
    ASSERT_EQ(guard_check(g, &rq, &v, &err), 0);
    rq.arg_count = 3;
    ASSERT_EQ(guard_check(g, &rq, &v, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "duplicate_parameter");
    ASSERT_STR_EQ(err.field, "Preset");
    for (size_t i = 0; i < GUARD_MAX_ARGS; i++)
        args[i] = (guard_header){i % 2 ? "b" : "a", ""};
    rq.arg_count = 2;
    ASSERT_EQ(guard_check(g, &rq, &v, &err), 0);
    rq.arg_count = GUARD_MAX_ARGS + 1;
    ASSERT_EQ(guard_check(g, &rq, &v, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "too_many_parameters");

    const char *twice[] = {"Host", "localhost", "Content-Encoding", "gzip", "content-encoding",
                           "gzip", NULL};
    ASSERT_EQ(check(g, "POST", "/v1/attention", twice, &v, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "ambiguous_framing");
    ASSERT_STR_EQ(err.field, "Content-Encoding");
    ASSERT_EQ(v.close, 1);
    guard_free(g);
}

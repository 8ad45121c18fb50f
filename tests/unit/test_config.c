/*
 * test_config.c - the configuration table: defaults, environment, flags.
 */
#include <stdlib.h>

#include "core/config.h"
#include "core/sizing.h"
#include "test.h"

static int load(server_config *cfg, char **argv, char **envp, char *errbuf, size_t errlen)
{
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    FILE *sink = fopen("/dev/null", "w");
    int rc = config_load(cfg, argc, argv, envp, sink, errbuf, errlen);
    fclose(sink);
    return rc;
}

void test_config_defaults(void)
{
    server_config cfg;
    char err[256];
    char *argv[] = {"attention-server", NULL};
    ASSERT_EQ(load(&cfg, argv, NULL, err, sizeof err), CONFIG_OK);
    ASSERT_STR_EQ(cfg.host, "127.0.0.1");
    ASSERT_EQ(cfg.port, 8080);
    ASSERT_STR_EQ(cfg.cors_origin, "*");
    ASSERT_EQ(cfg.max_body, 64u << 20);
    ASSERT_EQ(cfg.max_elements, 8u << 20);
    ASSERT_EQ(cfg.max_request_memory, 1u << 30);
    ASSERT_EQ(cfg.max_inflight, 0); /* follows the CPUs: sizing_resolve */
    ASSERT_STR_EQ(cfg.log_format, "text");
    ASSERT_EQ(cfg.compute_threads, 0);
    ASSERT_EQ(cfg.quiet, 0);
}

void test_config_env_and_flags(void)
{
    server_config cfg;
    char err[256];
    char *envp[] = {"ATTN_PORT=9000", "ATTN_HOST=0.0.0.0", "ATTN_MAX_BODY=1K", "OTHER=1",
                    "ATTN_QUIET=yes", NULL};
    char *argv[] = {"attention-server", NULL};
    ASSERT_EQ(load(&cfg, argv, envp, err, sizeof err), CONFIG_OK);
    ASSERT_EQ(cfg.port, 9000);
    ASSERT_STR_EQ(cfg.host, "0.0.0.0");
    ASSERT_EQ(cfg.max_body, 1024);
    ASSERT_EQ(cfg.quiet, 1);
    /* Flags win over the environment, in both spellings. */
    char *argv2[] = {"attention-server", "--port", "7000", "--cors-origin=https://viz.example",
                     "--quiet=false", NULL};
    ASSERT_EQ(load(&cfg, argv2, envp, err, sizeof err), CONFIG_OK);
    ASSERT_EQ(cfg.port, 7000);
    ASSERT_STR_EQ(cfg.cors_origin, "https://viz.example");
    ASSERT_EQ(cfg.quiet, 0);
    char *argv3[] = {"attention-server", "--help", NULL};
    ASSERT_EQ(load(&cfg, argv3, NULL, err, sizeof err), CONFIG_EXIT_HELP);
}

void test_config_rejects_bad_values(void)
{
    static const char *const bad[][3] = {
        {"--port", "70000", "--port must be between 0 and 65535"},
        {"--port", "80x", "--port must be a whole number"},
        {"--max-body", "lots", "--max-body must be a size"},
        {"--max-inflight", "-1", "--max-inflight must be between 0"},
        {"--log-format", "xml", "--log-format must be text or json"},
        {"--quiet=maybe", NULL, "--quiet must be true or false"},
        {"--no-such-flag", NULL, "unknown option \"--no-such-flag\""},
        {"--host", "", "--host must not be empty"},
        {"stray", NULL, "unexpected argument"},
        {"--port", NULL, "--port needs a value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        server_config cfg;
        char err[256] = "";
        char *argv[] = {"attention-server", (char *)bad[i][0], (char *)bad[i][1], NULL};
        int rc = load(&cfg, argv, NULL, err, sizeof err);
        if (rc != CONFIG_ERROR || strstr(err, bad[i][2]) == NULL)
            FAIL_AT("%s %s: rc %d, message \"%s\", want \"%s\"", bad[i][0],
                    bad[i][1] ? bad[i][1] : "", rc, err, bad[i][2]);
    }
    server_config cfg;
    char err[256] = "";
    char *envp[] = {"ATTN_TIMEOUT=-3", NULL};
    char *argv[] = {"attention-server", NULL};
    ASSERT_EQ(load(&cfg, argv, envp, err, sizeof err), CONFIG_ERROR);
    ASSERT(strstr(err, "ATTN_TIMEOUT") != NULL);
}

void test_config_sizes(void)
{
    size_t n = 0;
    ASSERT_EQ(config_parse_size("4096", &n), 0);
    ASSERT_EQ(n, 4096);
    ASSERT_EQ(config_parse_size("64M", &n), 0);
    ASSERT_EQ(n, 64u << 20);
    ASSERT_EQ(config_parse_size("2GiB", &n), 0);
    ASSERT_EQ(n, 2ull << 30);
    ASSERT_EQ(config_parse_size("8Ki", &n), 0);
    ASSERT_EQ(n, 8192);
    ASSERT_EQ(config_parse_size("", &n), -1);
    ASSERT_EQ(config_parse_size("-1", &n), -1);
    ASSERT_EQ(config_parse_size("12Q", &n), -1);
    ASSERT_EQ(config_parse_size("99999999999999999999", &n), -1);
    ASSERT_EQ(config_parse_size("99999999999T", &n), -1);
}

void test_config_help_lists_every_option(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    config_print_help(out, "attention-server");
    fclose(out);
    static const char *const expected[] = {
        "--host", "ATTN_HOST", "--port", "ATTN_PORT", "--cors-origin", "--max-body",
        "--max-elements", "--max-request-memory", "--max-inflight", "--max-connections",
        "--timeout", "--compute-threads", "--shutdown-grace", "--data-dir", "--quiet", "default 8080",
        "--allowed-hosts", "--auth-tokens", "ATTN_AUTH_TOKENS", "--auth-token-file", "--auth-writes",
        "--auth-all", "--tls-cert", "--tls-key",
        "--max-memory", "ATTN_MAX_MEMORY", "--max-connections-per-ip", "--header-timeout",
        "--min-body-rate", "--deadline", "--queue-wait-ms", "--io-threads", "--log-format",
        "ATTN_LOG_FORMAT"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        if (strstr(text, expected[i]) == NULL) {
            free(text);
            FAIL_AT("--help does not mention %s", expected[i]);
        }
    free(text);
}

/* Settings that may be empty (off) take an empty value; the others do not. */
void test_config_empty_values(void)
{
    server_config cfg;
    char err[256];
    char *argv[] = {"attention-server", "--cors-origin", "", "--auth-writes", NULL};
    char *envp[] = {"ATTN_CORS_ORIGIN=https://a.example,https://b.example", "ATTN_AUTH_TOKENS=",
                    NULL};
    ASSERT_EQ(load(&cfg, argv, envp, err, sizeof err), CONFIG_OK);
    ASSERT_STR_EQ(cfg.cors_origin, "");
    ASSERT_STR_EQ(cfg.auth_tokens, "");
    ASSERT_EQ(cfg.auth_writes, 1);
    ASSERT_EQ(cfg.auth_all, 0);
    ASSERT_STR_EQ(cfg.allowed_hosts, "");
    ASSERT_STR_EQ(cfg.tls_cert, "");
    char *argv2[] = {"attention-server", NULL};
    ASSERT_EQ(load(&cfg, argv2, envp, err, sizeof err), CONFIG_OK);
    ASSERT_STR_EQ(cfg.cors_origin, "https://a.example,https://b.example");
    char *argv3[] = {"attention-server", "--data-dir", "", NULL};
    ASSERT_EQ(load(&cfg, argv3, NULL, err, sizeof err), CONFIG_ERROR);
}

/* Where each value came from, and the settings that follow the CPUs: a 0
 * becomes the rule's number with the CPUs' source, a value given keeps its
 * own source. */
void test_config_sizing(void)
{
    server_config cfg;
    char err[256];
    char *envp[] = {"ATTN_IO_THREADS=3", NULL};
    char *argv[] = {"attention-server", "--compute-threads", "5", NULL};
    ASSERT_EQ(load(&cfg, argv, envp, err, sizeof err), CONFIG_OK);
    ASSERT_EQ(config_source(&cfg, "compute-threads"), CONFIG_FROM_FLAG);
    ASSERT_EQ(config_source(&cfg, "io-threads"), CONFIG_FROM_ENV);
    ASSERT_EQ(config_source(&cfg, "max-inflight"), CONFIG_FROM_DEFAULT);
    sizing_resolve(&cfg, 16, "cgroup");
    const server_sizing *sz = sizing_get();
    ASSERT_EQ(cfg.compute_threads, 5);
    ASSERT_STR_EQ(sz->compute_threads.source, "flag");
    ASSERT_EQ(cfg.io_threads, 3);
    ASSERT_STR_EQ(sz->io_threads.source, "env");
    ASSERT_EQ(cfg.max_inflight, 16 * SIZING_INFLIGHT_PER_CPU);
    ASSERT_STR_EQ(sz->max_inflight.source, "cgroup");
    ASSERT_EQ(sz->cpus, 16);
    /* On one CPU every rule's floor holds. */
    char *argv1[] = {"attention-server", NULL};
    ASSERT_EQ(load(&cfg, argv1, NULL, err, sizeof err), CONFIG_OK);
    sizing_resolve(&cfg, 1, "cores");
    ASSERT_EQ(cfg.compute_threads, 1);
    ASSERT_EQ(cfg.io_threads, SIZING_IO_THREADS_MIN);
    ASSERT_EQ(cfg.max_inflight, SIZING_INFLIGHT_MIN);
    ASSERT_STR_EQ(sizing_get()->max_inflight.source, "cores");
}

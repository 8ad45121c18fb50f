/*
 * config.c - the configuration table and its loader.
 *
 * Settings are descriptors (name, environment variable, type, default, bounds,
 * help) pointing at a field of server_config by offset, as Redis's config.c
 * does; parsing, validation and help all walk this one table, so a setting is
 * added in one place.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"

/* OPT_TEXT is a string that may be empty (a setting that is off). */
typedef enum { OPT_STRING, OPT_TEXT, OPT_LONG, OPT_SIZE, OPT_BOOL } opt_type;

typedef struct config_option {
    const char *name;       /* flag without the leading "--" */
    const char *env;        /* environment variable */
    opt_type type;
    size_t offset;          /* into server_config */
    size_t length;          /* buffer size for OPT_STRING */
    const char *def;        /* default, in the same syntax as the flag */
    double min, max;        /* bounds for numbers */
    const char *help;
} config_option;

#define OFF(f) offsetof(server_config, f)
#define LEN(f) sizeof(((server_config *)0)->f)

static const config_option config_table[] = {
    {"host", "ATTN_HOST", OPT_STRING, OFF(host), LEN(host), "127.0.0.1", 0, 0,
     "address to listen on (0.0.0.0 or :: inside a container)"},
    {"port", "ATTN_PORT", OPT_LONG, OFF(port), 0, "8080", 0, 65535,
     "TCP port; 0 picks a free one (printed on stdout)"},
    {"grpc-port", "ATTN_GRPC_PORT", OPT_LONG, OFF(grpc_port), 0, "8001", -1, 65535,
     "TCP port of the gRPC front-end (the Open Inference Protocol, on the same --host); "
     "0 turns it off, -1 picks a free one (printed on stdout)"},
    {"cors-origin", "ATTN_CORS_ORIGIN", OPT_TEXT, OFF(cors_origin), LEN(cors_origin), "*", 0, 0,
     "origins browsers may call from: * for any, a comma-separated list (the matching one is "
     "echoed), or \"\" / off for no CORS headers"},
    {"cors-write-origins", "ATTN_CORS_WRITE_ORIGINS", OPT_TEXT, OFF(cors_write_origins),
     LEN(cors_write_origins), "", 0, 0,
     "origins whose pages may also PUT and DELETE (comma-separated); others get 403 unless "
     "--auth-writes or --auth-all asks for tokens"},
    {"max-body", "ATTN_MAX_BODY", OPT_SIZE, OFF(max_body), 0, "64M", 16, (double)(1ULL << 40),
     "largest request body in bytes (K, M, G suffixes, 1024-based); 413 past it"},
    {"max-elements", "ATTN_MAX_ELEMENTS", OPT_SIZE, OFF(max_elements), 0, "8M", 1, (double)(1ULL << 40),
     "most numbers in one request, and in one response; 413 past it"},
    {"max-request-memory", "ATTN_MAX_REQUEST_MEMORY", OPT_SIZE, OFF(max_request_memory), 0, "1G",
     1024, (double)(1ULL << 44),
     "most working memory one attention request may need; 413 past it"},
    {"max-inflight", "ATTN_MAX_INFLIGHT", OPT_LONG, OFF(max_inflight), 0, "0", 0, 4096,
     "requests with a body worked on at once; more wait up to --queue-wait-ms, then 503; "
     "0: four per available CPU, at least 8"},
    {"queue-wait-ms", "ATTN_QUEUE_WAIT_MS", OPT_LONG, OFF(queue_wait_ms), 0, "2000", 0, 600000,
     "milliseconds a request waits for a free --max-inflight place before 503 with Retry-After"},
    {"deadline", "ATTN_DEADLINE", OPT_LONG, OFF(deadline), 0, "60", 1, 86400,
     "seconds a request may wait and compute before 503 deadline_exceeded (header "
     "X-Deadline-Ms may lower it)"},
    {"max-memory", "ATTN_MAX_MEMORY", OPT_SIZE, OFF(max_memory), 0, "0", 0, (double)(1ULL << 50),
     "memory budget of the whole process (bodies, parsing, computations); 503 or 413 past "
     "it; 0: 3/4 of the cgroup memory limit, else of physical memory"},
    {"max-memory-share", "ATTN_MAX_MEMORY_SHARE", OPT_LONG, OFF(max_memory_share), 0, "50", 1,
     100, "percent of --max-memory that the bodies one client address is sending may hold; "
     "a body past it is answered 503 (413 at its headers when it could never fit)"},
    {"max-connections", "ATTN_MAX_CONNECTIONS", OPT_LONG, OFF(max_connections), 0, "8192", 1,
     1000000, "open connections at once, HTTP's and gRPC's together (the file descriptor "
     "limit is raised to fit)"},
    {"max-connections-per-ip", "ATTN_MAX_CONNECTIONS_PER_IP", OPT_LONG,
     OFF(max_connections_per_ip), 0, "512", 0, 1000000,
     "open connections from one client address, HTTP's and gRPC's together; 0: no cap"},
    {"grpc-max-streams", "ATTN_GRPC_MAX_STREAMS", OPT_LONG, OFF(grpc_max_streams), 0, "256", 1,
     1000000, "gRPC calls open at once on one connection (HTTP/2's MAX_CONCURRENT_STREAMS)"},
    {"header-timeout", "ATTN_HEADER_TIMEOUT", OPT_LONG, OFF(header_timeout), 0, "10", 1, 3600,
     "seconds a connection has to deliver a request's headers, from its opening or from the "
     "previous answer"},
    {"min-body-rate", "ATTN_MIN_BODY_RATE", OPT_SIZE, OFF(min_body_rate), 0, "1K", 0,
     (double)(1ULL << 40),
     "bytes per second a body must average once --header-timeout seconds have passed; 0: none"},
    {"io-threads", "ATTN_IO_THREADS", OPT_LONG, OFF(io_threads), 0, "0", 0, 256,
     "threads serving the sockets (epoll); 0: one per available CPU, at least 2"},
    {"inline-max-bytes", "ATTN_INLINE_MAX_BYTES", OPT_SIZE, OFF(inline_max_bytes), 0, "4K", 0,
     65536,
     "a POST to /v1/attention or a v2 infer route with a body up to this size is answered on "
     "the I/O thread that read it when its work is small (below about 4 MFLOP) and a compute "
     "thread is free, without a hand-off to a worker; 0: never"},
    {"timeout", "ATTN_TIMEOUT", OPT_LONG, OFF(timeout), 0, "30", 1, 3600,
     "seconds an idle connection is kept"},
    {"compute-threads", "ATTN_COMPUTE_THREADS", OPT_LONG, OFF(compute_threads), 0, "0", 0, 1024,
     "threads that compute at once, over all requests; 0: one per available CPU"},
    {"kernel", "ATTN_KERNEL", OPT_STRING, OFF(kernel), LEN(kernel), "auto", 0, 0,
     "instruction set of the attention kernel: auto (the widest this CPU runs), amx_bf16, "
     "avx512_bf16, avx512, avx2 or portable (the _bf16 paths differ in compute_precision "
     "bfloat16 only); a path the CPU cannot run stops the server at start-up"},
    {"shutdown-grace", "ATTN_SHUTDOWN_GRACE", OPT_LONG, OFF(shutdown_grace), 0, "10", 0, 3600,
     "seconds in-flight requests may finish after SIGTERM"},
    {"max-sequences", "ATTN_MAX_SEQUENCES", OPT_LONG, OFF(max_sequences), 0, "1024", 0, 1000000,
     "sequences (Triton's sequence_id) whose key/value cache the server holds at once; a "
     "sequence_start past it is 429; 0 turns sequences off"},
    {"sequence-idle-timeout", "ATTN_SEQUENCE_IDLE_TIMEOUT", OPT_LONG, OFF(sequence_idle_timeout),
     0, "300", 1, 86400,
     "seconds a sequence may go without a step before it is dropped and its memory returned"},
    {"max-sequence-keys", "ATTN_MAX_SEQUENCE_KEYS", OPT_SIZE, OFF(max_sequence_keys), 0, "1M", 1,
     (double)(1ULL << 32), "keys one sequence may cache (K, M suffixes, 1024-based); 413 past it"},
    {"data-dir", "ATTN_DATA_DIR", OPT_STRING, OFF(data_dir), LEN(data_dir), "data", 0, 0,
     "directory of stored weight sets (created if missing)"},
    {"max-set-bytes", "ATTN_MAX_SET_BYTES", OPT_SIZE, OFF(max_set_bytes), 0, "512M", 1024,
     (double)(1ULL << 44), "largest stored weight set, in bytes of its file; 413 past it"},
    {"max-store-bytes", "ATTN_MAX_STORE_BYTES", OPT_SIZE, OFF(max_store_bytes), 0, "4G", 1024,
     (double)(1ULL << 50), "all stored weight sets together; 413 past it"},
    {"store-sync-interval", "ATTN_STORE_SYNC_INTERVAL", OPT_LONG, OFF(store_sync_interval), 0,
     "1000", 10, 3600000,
     "milliseconds between rescans of --data-dir for sets other replicas wrote or deleted "
     "(with --store-url, 5000 unless given: each rescan is a listing request); "
     "/readyz answers 503 when three intervals pass without a good rescan"},
    {"store-temp-max-age", "ATTN_STORE_TEMP_MAX_AGE", OPT_LONG, OFF(store_temp_max_age), 0,
     "3600", 0, 31536000,
     "seconds after which another server's temporary file in --data-dir counts as abandoned "
     "and is removed at start-up; 0: never"},
    {"store-url", "ATTN_STORE_URL", OPT_TEXT, OFF(store_url), LEN(store_url), "", 0, 0,
     "s3://BUCKET or s3://BUCKET/PREFIX: keep the weight sets in an S3-compatible object store "
     "(one object PREFIX/NAME.wset a set) instead of --data-dir; credentials from "
     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN) or a credentials file "
     "(AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE), never from a flag"},
    {"s3-endpoint", "ATTN_S3_ENDPOINT", OPT_TEXT, OFF(s3_endpoint), LEN(s3_endpoint), "", 0, 0,
     "http(s)://HOST:PORT of a self-hosted S3 store (MinIO, radosgw, Swift), addressed "
     "path-style; empty: AWS S3 in --s3-region"},
    {"s3-region", "ATTN_S3_REGION", OPT_STRING, OFF(s3_region), LEN(s3_region), "us-east-1", 0,
     0, "the region requests are signed for (AWS Signature Version 4)"},
    {"s3-ca-file", "ATTN_S3_CA_FILE", OPT_TEXT, OFF(s3_ca_file), LEN(s3_ca_file), "", 0, 0,
     "PEM file of the certificate authorities an https --s3-endpoint is checked against; "
     "empty: the system's"},
    {"quiet", "ATTN_QUIET", OPT_BOOL, OFF(quiet), 0, "false", 0, 1,
     "no access log on stderr"},
    {"log-format", "ATTN_LOG_FORMAT", OPT_STRING, OFF(log_format), LEN(log_format), "text", 0,
     0, "access log on stderr: text (one line of words) or json (one JSON object a line)"},
    {"allowed-hosts", "ATTN_ALLOWED_HOSTS", OPT_TEXT, OFF(allowed_hosts), LEN(allowed_hosts), "", 0, 0,
     "Host header values answered (comma-separated, port ignored, .example.com for a domain); "
     "empty: localhost, 127.0.0.1, [::1] on a loopback --host, any otherwise; * for any"},
    {"auth-tokens", "ATTN_AUTH_TOKENS", OPT_TEXT, OFF(auth_tokens), LEN(auth_tokens), "", 0, 0,
     "comma-separated bearer tokens (prefer the environment to the flag)"},
    {"auth-token-file", "ATTN_AUTH_TOKEN_FILE", OPT_TEXT, OFF(auth_token_file),
     LEN(auth_token_file), "", 0, 0, "file of bearer tokens, one a line (# starts a comment)"},
    {"auth-writes", "ATTN_AUTH_WRITES", OPT_BOOL, OFF(auth_writes), 0, "false", 0, 1,
     "PUT and DELETE need Authorization: Bearer TOKEN; 401 otherwise"},
    {"auth-all", "ATTN_AUTH_ALL", OPT_BOOL, OFF(auth_all), 0, "false", 0, 1,
     "every route but /healthz and /readyz needs a token; 401 otherwise"},
    {"tls-cert", "ATTN_TLS_CERT", OPT_TEXT, OFF(tls_cert), LEN(tls_cert), "", 0, 0,
     "PEM certificate (chain) file: serve HTTPS instead of HTTP (with --tls-key)"},
    {"tls-key", "ATTN_TLS_KEY", OPT_TEXT, OFF(tls_key), LEN(tls_key), "", 0, 0,
     "PEM private key file of --tls-cert"},
};

#define CONFIG_COUNT (sizeof config_table / sizeof config_table[0])

_Static_assert(CONFIG_COUNT <= sizeof(((server_config *)0)->sources),
               "server_config.sources has a place for every row of the table");

config_origin config_source(const server_config *cfg, const char *name)
{
    for (size_t i = 0; i < CONFIG_COUNT; i++)
        if (!strcmp(config_table[i].name, name))
            return (config_origin)cfg->sources[i];
    return CONFIG_FROM_DEFAULT;
}

int config_parse_size(const char *text, size_t *out)
{
    if (text == NULL || *text == '\0' || *text == '-' || *text == '+')
        return -1;
    errno = 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift != 0 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    if (shift != 0 && value > (ULLONG_MAX >> shift))
        return -1;
    value <<= shift;
    if (value > SIZE_MAX)
        return -1;
    *out = (size_t)value;
    return 0;
}

static int config_fail(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int config_fail(char *errbuf, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
    return CONFIG_ERROR;
}

/* Parses `value` for option `opt` into cfg; `source` names where it came
 * from ("--port" or "ATTN_PORT") for the message.  Leaves cfg untouched on
 * error. */
static int config_apply(server_config *cfg, const config_option *opt, const char *value,
                        const char *source, char *errbuf, size_t errlen)
{
    char *field = (char *)cfg + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
    case OPT_TEXT:
        if (strlen(value) >= opt->length)
            return config_fail(errbuf, errlen, "%s is too long (at most %zu characters)",
                               source, opt->length - 1);
        if (*value == '\0' && opt->type == OPT_STRING)
            return config_fail(errbuf, errlen, "%s must not be empty", source);
        memcpy(field, value, strlen(value) + 1);
        return CONFIG_OK;
    case OPT_LONG: {
        errno = 0;
        char *end;
        long n = strtol(value, &end, 10);
        if (errno != 0 || end == value || *end != '\0')
            return config_fail(errbuf, errlen, "%s must be a whole number, not \"%s\"", source, value);
        if ((double)n < opt->min || (double)n > opt->max)
            return config_fail(errbuf, errlen, "%s must be between %.0f and %.0f, not %ld",
                               source, opt->min, opt->max, n);
        *(long *)field = n;
        return CONFIG_OK;
    }
    case OPT_SIZE: {
        size_t n;
        if (config_parse_size(value, &n) != 0)
            return config_fail(errbuf, errlen,
                               "%s must be a size such as 4096, 64K, 16M or 1G, not \"%s\"",
                               source, value);
        if ((double)n < opt->min || (double)n > opt->max)
            return config_fail(errbuf, errlen, "%s must be between %.0f and %.0f, not %zu",
                               source, opt->min, opt->max, n);
        *(size_t *)field = n;
        return CONFIG_OK;
    }
    case OPT_BOOL:
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on"))
            *(long *)field = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off"))
            *(long *)field = 0;
        else
            return config_fail(errbuf, errlen, "%s must be true or false, not \"%s\"", source, value);
        return CONFIG_OK;
    }
    return config_fail(errbuf, errlen, "internal: unknown option type for %s", source);
}

static const char *config_env_lookup(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

void config_print_help(FILE *out, const char *argv0)
{
    fprintf(out,
            "Usage: %s [OPTIONS]\n"
            "Serves scaled dot-product attention over HTTP (contract v1).\n\n"
            "Every option can also be set by its environment variable; the flag wins.\n\n",
            argv0);
    for (size_t i = 0; i < CONFIG_COUNT; i++) {
        const config_option *opt = &config_table[i];
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s", opt->name,
                 opt->type == OPT_STRING || opt->type == OPT_TEXT ? " TEXT" : opt->type == OPT_SIZE ? " SIZE"
                 : opt->type == OPT_BOOL ? "[=BOOL]" : " N");
        fprintf(out, "  %-32s %s\n  %-32s env %s, default %s\n", flag, opt->help, "",
                opt->env, opt->def[0] != '\0' ? opt->def : "empty");
    }
    fprintf(out, "  %-32s %s\n  %-32s %s\n", "--help", "print this help and exit",
            "--version", "print the version and exit");
}

int config_load(server_config *cfg, int argc, char **argv, char **envp,
                FILE *out, char *errbuf, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < CONFIG_COUNT; i++) {
        const config_option *opt = &config_table[i];
        char source[80];
        snprintf(source, sizeof source, "default of --%s", opt->name);
        if (config_apply(cfg, opt, opt->def, source, errbuf, errlen) != CONFIG_OK)
            return CONFIG_ERROR;
    }
    for (size_t i = 0; i < CONFIG_COUNT; i++) {
        const char *value = config_env_lookup(envp, config_table[i].env);
        if (value != NULL &&
            config_apply(cfg, &config_table[i], value, config_table[i].env, errbuf, errlen) != CONFIG_OK)
            return CONFIG_ERROR;
        if (value != NULL)
            cfg->sources[i] = CONFIG_FROM_ENV;
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            config_print_help(out, argv[0]);
            return CONFIG_EXIT_HELP;
        }
        if (!strcmp(arg, "--version")) {
            fprintf(out, "attention-server %s\n", ATTN_VERSION);
            return CONFIG_EXIT_HELP;
        }
        if (strncmp(arg, "--", 2) != 0)
            return config_fail(errbuf, errlen, "unexpected argument \"%s\" (see --help)", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const config_option *opt = NULL;
        for (size_t i = 0; i < CONFIG_COUNT; i++)
            if (strlen(config_table[i].name) == name_len &&
                strncmp(config_table[i].name, name, name_len) == 0)
                opt = &config_table[i];
        if (opt == NULL)
            return config_fail(errbuf, errlen, "unknown option \"%.*s\" (see --help)",
                               (int)(name_len + 2), arg);
        const char *value;
        if (eq != NULL)
            value = eq + 1;
        else if (opt->type == OPT_BOOL)
            value = "true";
        else if (a + 1 < argc)
            value = argv[++a];
        else
            return config_fail(errbuf, errlen, "option --%s needs a value", opt->name);
        char source[80];
        snprintf(source, sizeof source, "--%s", opt->name);
        if (config_apply(cfg, opt, value, source, errbuf, errlen) != CONFIG_OK)
            return CONFIG_ERROR;
        cfg->sources[opt - config_table] = CONFIG_FROM_FLAG;
    }
    if (strcmp(cfg->log_format, "text") != 0 && strcmp(cfg->log_format, "json") != 0)
        return config_fail(errbuf, errlen, "--log-format must be text or json, not \"%s\"",
                           cfg->log_format);
    return CONFIG_OK;
}

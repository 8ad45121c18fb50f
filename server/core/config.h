/*
 * config.h - the server's settings, declared once in a table.
 *
 * Each setting has a flag, an environment variable, a default, bounds and a
 * help line (config.c).  config_load applies the defaults, then the
 * environment, then the command line, validating every value against the
 * table; --help text is generated from the same table.
 */
#ifndef ATTN_CONFIG_H
#define ATTN_CONFIG_H

#include <stddef.h>
#include <stdio.h>

typedef struct server_config {
    char host[256];
    long port;
    long grpc_port;             /* gRPC (grpc/grpc_front.h); 0: off, -1: a free one */
    char cors_origin[1024];     /* "*", a comma-separated list, or ""/off */
    char cors_write_origins[1024]; /* origins whose pages may PUT and DELETE (cors.c) */
    size_t max_body;            /* bytes */
    size_t max_elements;        /* numbers per request and per response */
    size_t max_request_memory;  /* bytes of working memory per request */
    long max_inflight;
    long max_connections;
    long timeout;               /* seconds */
    long compute_threads;       /* 0: one per available CPU */
    char kernel[16];            /* attention kernel path: auto, amx_bf16, avx512_bf16, avx512,
                                 * avx2, portable */
    long shutdown_grace;        /* seconds */
    long max_sequences;         /* live sequences (sequence/sequence.h); 0: none */
    long sequence_idle_timeout; /* seconds */
    size_t max_sequence_keys;   /* keys one sequence may cache */
    char data_dir[1024];
    size_t max_set_bytes;       /* one stored weight set */
    size_t max_store_bytes;     /* all stored weight sets */
    long store_sync_interval;   /* milliseconds between rescans of data_dir or the bucket */
    long store_temp_max_age;    /* seconds after which anyone's temporary file is abandoned */
    char store_url[600];        /* "s3://BUCKET[/PREFIX]": sets in an object store; "": data_dir */
    char s3_endpoint[512];      /* "": AWS; else path-style requests to this URL */
    char s3_region[64];
    char s3_ca_file[1024];      /* "": the system's certificates */
    long quiet;                 /* 1: no access log */
    /* Who may reach the server (guard.c) and over what (http.c). */
    char allowed_hosts[1024];   /* Host allow-list; "" automatic, "*" any */
    char auth_tokens[4096];     /* comma-separated bearer tokens */
    char auth_token_file[1024]; /* file of bearer tokens, one a line */
    long auth_writes;           /* 1: PUT and DELETE need a token */
    long auth_all;              /* 1: every route but the probes needs one */
    char tls_cert[1024];        /* PEM certificate chain; "" for plain HTTP */
    char tls_key[1024];         /* PEM private key */
    size_t max_memory;          /* process memory budget, bytes; 0: from the memory limit */
    long max_memory_share;      /* percent of it one client address may hold for bodies */
    long max_connections_per_ip;/* 0: no per-address cap */
    long grpc_max_streams;      /* gRPC calls open at once on one connection */
    long header_timeout;        /* seconds to deliver a request's headers */
    size_t min_body_rate;       /* bytes per second a body must average; 0: no floor */
    long deadline;              /* seconds a request may take from admission to answer */
    long queue_wait_ms;         /* how long a request waits for a free worker */
    long io_threads;            /* threads polling the sockets; 0: one per available CPU */
    size_t inline_max_bytes;    /* bodies up to this size may be answered on the I/O thread; 0: never */
    char log_format[8];         /* access log: "text" or "json" */
    /* Where each setting's value came from (config_source), by row of the table. */
    unsigned char sources[64];
} server_config;

/* Where a setting's value came from. */
typedef enum config_origin {
    CONFIG_FROM_DEFAULT = 0,    /* the table's default */
    CONFIG_FROM_ENV,            /* its environment variable */
    CONFIG_FROM_FLAG            /* its command-line flag */
} config_origin;

enum {
    CONFIG_OK = 0,
    CONFIG_EXIT_HELP = 1,       /* --help or --version was printed: exit 0 */
    CONFIG_ERROR = -1           /* message in errbuf: exit 2 */
};

/* Fills cfg from the defaults, then from environ-style `envp` (may be NULL),
 * then from argv.  Returns CONFIG_OK, CONFIG_EXIT_HELP after printing help or
 * the version to `out`, or CONFIG_ERROR with a message in errbuf.  On error
 * cfg holds a mix of values and must not be used. */
int config_load(server_config *cfg, int argc, char **argv, char **envp,
                FILE *out, char *errbuf, size_t errlen);

/* Where the value of the setting whose flag is name (without "--") came
 * from in cfg, as config_load filled it; CONFIG_FROM_DEFAULT for a name the
 * table does not have. */
config_origin config_source(const server_config *cfg, const char *name);

/* Writes the generated --help text. */
void config_print_help(FILE *out, const char *argv0);

/* Parses a size such as "64M", "1G", "4096", "8Ki" (1024-based suffixes
 * K, M, G, T with optional "i"/"iB"/"B").  Returns 0, or -1 if malformed or
 * overflowing. */
int config_parse_size(const char *text, size_t *out);

#endif

/*
 * guard.c - the checks every request passes before it is routed.
 *
 * The settings (tokens, origins, hosts) are parsed once into lists by
 * guard_new; guard_check then only reads them, so one guard serves every
 * connection thread without locks.  The checks run cheapest and most
 * fundamental first: framing (whether the bytes on the wire mean one request
 * or could mean two), sizes, Host, the path's bytes, a write from a foreign
 * web page (cors.c), and last the token, so that a client without a token
 * still learns that its request was malformed.
 */
#include "guard.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cors.h"
#include "core/mem.h"

/* A list of short strings parsed from a setting; owned by the guard. */
typedef struct guard_list {
    char **items;
    size_t count;
} guard_list;

enum { CORS_OFF, CORS_ANY, CORS_LIST };

struct guard {
    guard_list tokens;
    int auth_writes, auth_all;
    int cors_mode;
    guard_list origins;
    cors_policy writes;         /* which pages may write (cors.h) */
    int host_check;
    guard_list hosts;           /* lower case, IPv6 without brackets */
};

static void list_free(guard_list *list)
{
    for (size_t i = 0; i < list->count; i++)
        mem_free(list->items[i]);
    mem_free(list->items);
    list->items = NULL;
    list->count = 0;
}

/* Appends the n bytes at s to list.  Returns 0, or -1 when out of memory
 * (list unchanged). */
static int list_add(guard_list *list, const char *s, size_t n)
{
    char *copy = mem_malloc(n + 1);
    if (copy == NULL)
        return -1;
    memcpy(copy, s, n);
    copy[n] = '\0';
    char **items = mem_realloc(list->items, (list->count + 1) * sizeof *items);
    if (items == NULL) {
        mem_free(copy);
        return -1;
    }
    items[list->count++] = copy;
    list->items = items;
    return 0;
}

/* Splits text at commas and newlines into list, trimming blanks around each
 * item and skipping empty items and lines that start with '#'.  Returns 0, or
 * -1 when out of memory (items added so far stay in list). */
static int list_split(guard_list *list, const char *text)
{
    const char *p = text;
    while (*p != '\0') {
        size_t n = strcspn(p, ",\n");
        const char *start = p, *end = p + n;
        while (start < end && isspace((unsigned char)*start))
            start++;
        while (end > start && isspace((unsigned char)end[-1]))
            end--;
        if (end > start && *start != '#' && list_add(list, start, (size_t)(end - start)) != 0)
            return -1;
        p += n;
        if (*p != '\0')
            p++;
    }
    return 0;
}

static int list_contains_case(const guard_list *list, const char *s)
{
    for (size_t i = 0; i < list->count; i++)
        if (strcasecmp(list->items[i], s) == 0)
            return 1;
    return 0;
}

/* Reads the whole file at path into a new NUL-terminated buffer the caller
 * frees with mem_free.  Returns NULL with err filled when it cannot. */
static char *read_small_file(const char *path, const char *field, attn_error *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        error_set(err, ERR_INTERNAL, "bad_config", field, "Cannot read %s \"%s\": %s.", field,
                  path, strerror(errno));
        return NULL;
    }
    size_t len = 0, cap = 4096;
    char *buf = mem_malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
        if (len + 1 == cap) {
            if (cap >= (1u << 20)) {
                mem_free(buf);
                fclose(f);
                error_set(err, ERR_INTERNAL, "bad_config", field, "%s \"%s\" is over 1 MiB.",
                          field, path);
                return NULL;
            }
            char *bigger = mem_realloc(buf, cap * 2);
            if (bigger == NULL) {
                mem_free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (buf == NULL) {
        error_nomem(err);
        return NULL;
    }
    if (failed) {
        mem_free(buf);
        error_set(err, ERR_INTERNAL, "bad_config", field, "Cannot read %s \"%s\".", field, path);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* Tokens are token68 (RFC 7235) without the padding subtleties, and long
 * enough that guessing is hopeless. */
static int token_valid(const char *t)
{
    if (strlen(t) < 16)
        return 0;
    for (const char *p = t; *p; p++)
        if (!isalnum((unsigned char)*p) && strchr("-._~+/=", *p) == NULL)
            return 0;
    return 1;
}

/* Lower-cases s and drops the brackets around an IPv6 address. */
static void host_normalize(char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        memmove(s, s + 1, n - 2);
        s[n - 2] = '\0';
    }
    for (char *p = s; *p; p++)
        *p = (char)tolower((unsigned char)*p);
}

int guard_is_loopback(const char *host)
{
    if (strcasecmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
        strcmp(host, "[::1]") == 0)
        return 1;
    unsigned a, b, c, d;
    char tail;
    return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a == 127 && b < 256 &&
           c < 256 && d < 256;
}

guard *guard_new(const server_config *cfg, attn_error *err)
{
    guard *g = mem_calloc(1, sizeof *g);
    if (g == NULL) {
        error_nomem(err);
        return NULL;
    }
    g->auth_writes = cfg->auth_writes != 0;
    g->auth_all = cfg->auth_all != 0;
    if (list_split(&g->tokens, cfg->auth_tokens) != 0)
        goto nomem;
    if (cfg->auth_token_file[0] != '\0') {
        char *text = read_small_file(cfg->auth_token_file, "auth_token_file", err);
        if (text == NULL)
            goto fail;
        int rc = list_split(&g->tokens, text);
        memset(text, 0, strlen(text));
        mem_free(text);
        if (rc != 0)
            goto nomem;
    }
    for (size_t i = 0; i < g->tokens.count; i++)
        if (!token_valid(g->tokens.items[i])) {
            error_set(err, ERR_INTERNAL, "bad_config", "auth_tokens",
                      "Bearer token number %zu is not usable: a token has at least 16 characters, "
                      "all of A-Z a-z 0-9 - . _ ~ + / = (openssl rand -hex 32 makes one).", i + 1);
            goto fail;
        }
    if ((g->auth_writes || g->auth_all) && g->tokens.count == 0) {
        error_set(err, ERR_INTERNAL, "bad_config", "auth_tokens",
                  "--auth-writes and --auth-all need bearer tokens: set ATTN_AUTH_TOKENS or "
                  "--auth-token-file.");
        goto fail;
    }
    if (!g->auth_writes && !g->auth_all && g->tokens.count > 0) {
        error_set(err, ERR_INTERNAL, "bad_config", "auth_tokens",
                  "Bearer tokens are set but protect nothing: add --auth-writes (PUT and DELETE) "
                  "or --auth-all (every route but the probes).");
        goto fail;
    }

    if (cors_policy_init(&g->writes, cfg, err) != 0)
        goto fail;
    if (cfg->cors_origin[0] == '\0' || strcasecmp(cfg->cors_origin, "off") == 0 ||
        strcasecmp(cfg->cors_origin, "none") == 0) {
        g->cors_mode = CORS_OFF;
    } else {
        if (list_split(&g->origins, cfg->cors_origin) != 0)
            goto nomem;
        g->cors_mode = g->origins.count == 0 ? CORS_OFF : CORS_LIST;
        for (size_t i = 0; i < g->origins.count; i++) {
            char *o = g->origins.items[i];
            size_t n = strlen(o);
            if (strcmp(o, "*") == 0) {
                g->cors_mode = CORS_ANY;
                continue;
            }
            if (n > 0 && o[n - 1] == '/')
                o[n - 1] = '\0';
            if (strncasecmp(o, "http://", 7) != 0 && strncasecmp(o, "https://", 8) != 0) {
                error_set(err, ERR_INTERNAL, "bad_config", "cors_origin",
                          "--cors-origin \"%.200s\" is not an origin: write scheme://host[:port], "
                          "such as https://viz.example, or * for any.", o);
                goto fail;
            }
        }
    }

    if (cfg->allowed_hosts[0] != '\0') {
        if (list_split(&g->hosts, cfg->allowed_hosts) != 0)
            goto nomem;
        g->host_check = !list_contains_case(&g->hosts, "*") && g->hosts.count > 0;
    } else if (guard_is_loopback(cfg->host)) {
        /* A page from any web site can make a browser connect to a name that
         * resolves to 127.0.0.1; only the Host header tells such a request
         * from the developer's own. */
        if (list_split(&g->hosts, "localhost,127.0.0.1,[::1]") != 0 ||
            list_add(&g->hosts, cfg->host, strlen(cfg->host)) != 0)
            goto nomem;
        g->host_check = 1;
    }
    for (size_t i = 0; i < g->hosts.count; i++)
        host_normalize(g->hosts.items[i]);
    return g;

nomem:
    error_nomem(err);
fail:
    guard_free(g);
    return NULL;
}

void guard_free(guard *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->tokens.count; i++)
        memset(g->tokens.items[i], 0, strlen(g->tokens.items[i]));
    list_free(&g->tokens);
    list_free(&g->origins);
    list_free(&g->hosts);
    mem_free(g);
}

const char *guard_cors_origin(const guard *g, const char *origin, int *vary)
{
    *vary = 0;
    if (g->cors_mode == CORS_OFF)
        return NULL;
    if (g->cors_mode == CORS_ANY)
        return "*";
    *vary = 1;
    if (origin == NULL)
        return NULL;
    for (size_t i = 0; i < g->origins.count; i++)
        if (strcasecmp(g->origins.items[i], origin) == 0)
            return origin;
    return NULL;
}

const char *guard_cors_methods(const guard *g, const char *allow, const char *origin,
                               const char *host, char *buf, size_t n)
{
    return cors_preflight_methods(&g->writes, allow, origin, host, buf, n);
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t guard_unescape(char *s)
{
    char *out = s;
    for (const char *in = s; *in != '\0'; in++) {
        int hi, lo;
        if (in[0] == '%' && (hi = hex_value((unsigned char)in[1])) >= 0 &&
            (lo = hex_value((unsigned char)in[2])) >= 0) {
            int c = hi * 16 + lo;
            *out++ = (char)(c == 0 ? 0x7f : c);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return (size_t)(out - s);
}

/* Compares the n given bytes with token in time that depends on the length
 * of the configured token only: every byte is looked at, with no early exit. */
static int token_equal(const char *given, size_t n, const char *token)
{
    size_t len = strlen(token);
    volatile unsigned char diff = (unsigned char)(n != len);
    for (size_t i = 0; i < len; i++)
        diff |= (unsigned char)(token[i] ^ (i < n ? given[i] : 0));
    return diff == 0;
}

/* 1 when the Authorization value carries one of the tokens; every token is
 * compared, whichever matches. */
static int token_accepted(const guard *g, const char *authorization)
{
    if (authorization == NULL || strncasecmp(authorization, "Bearer", 6) != 0 ||
        (authorization[6] != ' ' && authorization[6] != '\t'))
        return 0;
    const char *t = authorization + 6;
    while (*t == ' ' || *t == '\t')
        t++;
    size_t n = strlen(t);
    while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\t'))
        n--;
    int accepted = 0;
    for (size_t i = 0; i < g->tokens.count; i++)
        accepted |= token_equal(t, n, g->tokens.items[i]);
    return accepted && n > 0;
}

/* Checks the Host value against the allow-list: the port, if any, is
 * dropped, and an IPv6 literal must be in brackets. */
static int host_allowed(const guard *g, const char *value)
{
    char host[256];
    size_t n = strlen(value);
    if (n == 0 || n >= sizeof host)
        return 0;
    const char *end;
    if (value[0] == '[') {
        const char *close = strchr(value, ']');
        if (close == NULL)
            return 0;
        end = close + 1;
    } else {
        end = strchr(value, ':');
        if (end == NULL)
            end = value + n;
    }
    if (*end == ':') {
        if (end[1] == '\0')
            return 0;
        for (const char *p = end + 1; *p; p++)
            if (!isdigit((unsigned char)*p))
                return 0;
    } else if (*end != '\0') {
        return 0;
    }
    memcpy(host, value, (size_t)(end - value));
    host[end - value] = '\0';
    host_normalize(host);
    for (size_t i = 0; i < g->hosts.count; i++) {
        const char *allowed = g->hosts.items[i];
        if (strcmp(allowed, host) == 0)
            return 1;
        /* ".example.com" allows example.com and every name below it. */
        size_t a = strlen(allowed), h = strlen(host);
        if (allowed[0] == '.' && (strcmp(allowed + 1, host) == 0 ||
                                  (h > a && strcmp(host + h - a, allowed) == 0)))
            return 1;
    }
    return 0;
}

/* Content-Length must be digits only. */
static int digits_only(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

static int framing_error(guard_verdict *v, attn_error *err, const char *fmt, const char *what)
{
    v->close = 1;
    return error_set(err, ERR_BAD_REQUEST, "ambiguous_framing", NULL, fmt, what);
}

/* What guard_check reads of the headers, in one pass. */
typedef struct header_scan {
    size_t lengths, encodings, content_encodings, hosts, inference_lengths, header_bytes;
    const char *length, *encoding, *host, *authorization, *origin;
} header_scan;

static void scan_headers(const guard_request *rq, header_scan *s)
{
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < rq->header_count; i++) {
        const guard_header *h = &rq->headers[i];
        s->header_bytes += strlen(h->name) + strlen(h->value) + 4;
        if (strcasecmp(h->name, "Content-Length") == 0) {
            s->lengths++;
            s->length = h->value;
        } else if (strcasecmp(h->name, "Transfer-Encoding") == 0) {
            s->encodings++;
            s->encoding = h->value;
        } else if (strcasecmp(h->name, "Host") == 0) {
            s->hosts++;
            s->host = h->value;
        } else if (strcasecmp(h->name, "Authorization") == 0 && s->authorization == NULL) {
            s->authorization = h->value;
        } else if (strcasecmp(h->name, "Origin") == 0 && s->origin == NULL) {
            s->origin = h->value;
        } else if (strcasecmp(h->name, "Inference-Header-Content-Length") == 0) {
            s->inference_lengths++;
        } else if (strcasecmp(h->name, "Content-Encoding") == 0) {
            s->content_encodings++;
        }
    }
}

/* Framing: a proxy in front and this server must agree on where the body ends, or the rest
 * of it is read as a second, unchecked request.  Returns 0 or framing_error's code. */
static int check_framing(const guard_request *rq, const header_scan *s, guard_verdict *v,
                         attn_error *err)
{
    if (s->lengths > 1)
        return framing_error(v, err, "The request has %s Content-Length headers; send one.",
                             "several");
    if (s->encodings > 0 && s->lengths > 0)
        return framing_error(v, err, "The request has both %s and Content-Length; send one.",
                             "Transfer-Encoding");
    if (s->encodings > 1 || (s->encoding != NULL && strcasecmp(s->encoding, "chunked") != 0))
        return framing_error(v, err,
                             "Transfer-Encoding must be %s, given once, and nothing else.",
                             "chunked");
    if (s->encoding != NULL && rq->version != NULL && strcmp(rq->version, "HTTP/1.0") == 0)
        return framing_error(v, err, "%s is not HTTP/1.0; use Content-Length.",
                             "Transfer-Encoding");
    if (s->length != NULL && !digits_only(s->length))
        return framing_error(v, err, "%s must be a number of bytes.", "Content-Length");
    /* The v2 body's own framing: which bytes are its JSON header. */
    if (s->inference_lengths > 1)
        return framing_error(v, err, "The request has several %s headers; send one.",
                             "Inference-Header-Content-Length");
    /* Content-Encoding says which bytes the body holds as much as Content-Length says how
     * many: a proxy that reads the other header would check a different body. */
    if (s->content_encodings > 1) {
        v->close = 1;
        return error_set(err, ERR_BAD_REQUEST, "ambiguous_framing", "Content-Encoding",
                         "The request has several Content-Encoding headers; send one.");
    }
    return 0;
}

/* The query's parameters: each at most once (which of two would count is a guess, and a
 * proxy or a log may guess the other way), and at most GUARD_MAX_ARGS of them.  Names
 * compare without case, as libmicrohttpd looks them up.  Returns 0 or ERR_BAD_REQUEST. */
static int check_args(const guard_request *rq, attn_error *err)
{
    if (rq->arg_count > GUARD_MAX_ARGS)
        return error_set(err, ERR_BAD_REQUEST, "too_many_parameters", NULL,
                         "The query has %zu parameters; the server reads at most %d.",
                         rq->arg_count, GUARD_MAX_ARGS);
    for (size_t i = 0; i < rq->arg_count; i++)
        for (size_t j = 0; j < i; j++)
            if (strcasecmp(rq->args[i].name, rq->args[j].name) == 0)
                return error_set(err, ERR_BAD_REQUEST, "duplicate_parameter", rq->args[i].name,
                                 "The query gives %.100s more than once; give it once.",
                                 rq->args[i].name);
    return 0;
}

int guard_check(const guard *g, const guard_request *rq, guard_verdict *v, attn_error *err)
{
    memset(v, 0, sizeof *v);
    if (rq->header_count > GUARD_MAX_HEADERS) {
        v->close = 1;
        return error_set(err, ERR_HEADERS_TOO_LARGE, "headers_too_large", NULL,
                         "The request has %zu header lines; the server reads at most %d.",
                         rq->header_count, GUARD_MAX_HEADERS);
    }
    header_scan hs;
    scan_headers(rq, &hs);
    int rc = check_framing(rq, &hs, v, err);
    if (rc != 0)
        return rc;
    const char *length = hs.length, *encoding = hs.encoding, *host = hs.host;
    const char *authorization = hs.authorization, *origin = hs.origin;
    size_t header_bytes = hs.header_bytes, hosts = hs.hosts;

    size_t target_bytes = rq->target_bytes != 0 ? rq->target_bytes : strlen(rq->path);
    if (target_bytes > GUARD_MAX_TARGET) {
        v->close = 1;
        return error_set(err, ERR_URI_TOO_LONG, "uri_too_long", NULL,
                         "The request target has %zu bytes; the server reads at most %d.",
                         target_bytes, GUARD_MAX_TARGET);
    }
    if (header_bytes > GUARD_MAX_HEADER_BYTES) {
        v->close = 1;
        return error_set(err, ERR_HEADERS_TOO_LARGE, "headers_too_large", NULL,
                         "The headers take %zu bytes; the server reads at most %d.",
                         header_bytes, GUARD_MAX_HEADER_BYTES);
    }
    /* A refused request with a body is not read further: its connection is
     * closed after the answer. */
    int has_body = encoding != NULL || (length != NULL && strcmp(length, "0") != 0);

    if (g->host_check && (hosts != 1 || !host_allowed(g, host))) {
        v->close = has_body;
        return error_set(err, ERR_BAD_REQUEST, "host_not_allowed", NULL,
                         "The Host header \"%.100s\" is not one this server answers to (see "
                         "--allowed-hosts).", hosts == 1 ? host : hosts == 0 ? "" : "several");
    }
    for (const unsigned char *p = (const unsigned char *)rq->path; *p; p++)
        if (*p < 0x20 || *p == 0x7f) {
            v->close = has_body;
            return error_set(err, ERR_BAD_REQUEST, "invalid_path", NULL,
                             "The path holds a control character (such as %%00) at byte %zu; "
                             "no name may contain one.", (size_t)(p - (const unsigned char *)rq->path));
        }
    if (check_args(rq, err) != 0) {
        v->close = has_body;
        return err->kind;
    }

    if (cors_check(&g->writes, rq->method, origin, host, err) != 0) {
        v->close = has_body;
        return err->kind;
    }
    int is_write = strcmp(rq->method, "PUT") == 0 || strcmp(rq->method, "DELETE") == 0;
    int needs_token = strcmp(rq->method, "OPTIONS") != 0 && !rq->probe;
    if (guard_token_check(g, authorization, needs_token, is_write, err) != 0) {
        v->close = has_body;
        snprintf(v->www_authenticate, sizeof v->www_authenticate,
                 authorization == NULL ? "Bearer realm=\"attention-server\""
                                       : "Bearer realm=\"attention-server\", error=\"invalid_token\"");
        return err->kind;
    }
    return 0;
}

int guard_token_check(const guard *g, const char *authorization, int may_need, int is_write,
                      attn_error *err)
{
    int needs_token = may_need && (g->auth_all || (g->auth_writes && is_write));
    if (needs_token && !token_accepted(g, authorization))
        return error_set(err, ERR_UNAUTHORIZED, "unauthorized", NULL, "%s",
                         authorization == NULL
                             ? "This route needs a bearer token: send Authorization: Bearer TOKEN."
                             : "The bearer token was not accepted.");
    return 0;
}

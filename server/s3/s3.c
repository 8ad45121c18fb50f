/*
 * s3.c - the S3 requests: URLs, signing, conditions and answers (s3.h has the contract).
 *
 * Each request is one libcurl easy handle made for it; the handles share one connection
 * cache, DNS cache and TLS session cache (a CURLSH), so a sync's requests reuse their
 * connection.  libcurl signs with SigV4 over the headers this file adds; two things it does
 * not do in Debian's 7.88 are done here: x-amz-content-sha256 carries the payload's real
 * SHA-256 (Swift refuses a request without it), and the query string is sorted and
 * percent-encoded before it is signed, since curl signs it as written.
 *
 * Answers are read with limits: a GET's body stops at the caller's maximum, and an error's
 * body (an XML document whose Code names the failure, read by s3_xml.c) at 64 KiB, so a
 * store that misbehaves cannot make the server hold more than it asked for.  A connection
 * that sends nothing for S3_STALL_S seconds is given up.
 */
#include "s3.h"
#include "s3_internal.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/mem.h"

/* The longest a connection may take to open, and to stay silent, before the request fails. */
#define S3_CONNECT_TIMEOUT_MS 5000L
#define S3_STALL_S 30L
/* The most of an error answer's body that is read for its Code. */
#define S3_ERROR_BODY_MAX ((size_t)64 << 10)

struct s3_client {
    s3_config cfg;
    char where[700];
    char key_id[256], secret[256], token[2048];
    char sigv4[128];            /* "aws:amz:REGION:s3" */
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_ready;

static void curl_start(void)
{
    curl_ready = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
    (void)h;
    (void)access;
    pthread_mutex_lock(&((s3_client *)arg)->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
    (void)h;
    pthread_mutex_unlock(&((s3_client *)arg)->share_locks[data]);
}

int s3_parse_url(const char *url, s3_config *cfg, attn_error *err)
{
    const char *scheme = "s3://";
    if (strncmp(url, scheme, strlen(scheme)) != 0)
        return error_set(err, ERR_BAD_REQUEST, "bad_store_url", "store-url",
                         "--store-url must be s3://BUCKET or s3://BUCKET/PREFIX.");
    const char *b = url + strlen(scheme), *slash = strchr(b, '/');
    size_t blen = slash != NULL ? (size_t)(slash - b) : strlen(b);
    int ok = blen >= 3 && blen < sizeof cfg->bucket;
    for (size_t i = 0; ok && i < blen; i++)
        ok = (b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
             b[i] == '.';
    if (!ok)
        return error_set(err, ERR_BAD_REQUEST, "bad_store_url", "store-url",
                         "The bucket of --store-url must be 3 to 63 of a-z 0-9 . -.");
    const char *p = slash != NULL ? slash + 1 : "";
    size_t plen = strlen(p);
    while (plen > 0 && p[plen - 1] == '/')
        plen--;
    if (plen >= sizeof cfg->prefix)
        return error_set(err, ERR_BAD_REQUEST, "bad_store_url", "store-url",
                         "The prefix of --store-url is longer than %zu bytes.",
                         sizeof cfg->prefix - 1);
    memcpy(cfg->bucket, b, blen);
    cfg->bucket[blen] = '\0';
    memcpy(cfg->prefix, p, plen);
    cfg->prefix[plen] = '\0';
    return 0;
}

s3_client *s3_open(const s3_config *cfg, attn_error *err)
{
    pthread_once(&curl_once, curl_start);
    if (!curl_ready) {
        error_set(err, ERR_INTERNAL, "store_unreachable", NULL, "libcurl could not start.");
        return NULL;
    }
    if (cfg->endpoint[0] != '\0' && strncmp(cfg->endpoint, "http://", 7) != 0 &&
        strncmp(cfg->endpoint, "https://", 8) != 0) {
        error_set(err, ERR_BAD_REQUEST, "bad_store_url", "s3-endpoint",
                  "--s3-endpoint must be an http:// or https:// URL.");
        return NULL;
    }
    s3_client *c = mem_calloc(1, sizeof *c);
    if (c == NULL) {
        error_nomem(err);
        return NULL;
    }
    c->cfg = *cfg;
    if (s3_credentials_load(c->key_id, sizeof c->key_id, c->secret, sizeof c->secret, c->token,
                            sizeof c->token, err) != 0) {
        mem_free(c);
        return NULL;
    }
    size_t n = strlen(c->cfg.endpoint);
    while (n > 0 && c->cfg.endpoint[n - 1] == '/')
        c->cfg.endpoint[--n] = '\0';
    if (n > 0)
        snprintf(c->where, sizeof c->where, "%s/%s", c->cfg.endpoint, c->cfg.bucket);
    else
        snprintf(c->where, sizeof c->where, "https://%s.s3.%s.amazonaws.com", c->cfg.bucket,
                 c->cfg.region);
    snprintf(c->sigv4, sizeof c->sigv4, "aws:amz:%s:s3", c->cfg.region);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&c->share_locks[i], NULL);
    c->share = curl_share_init();
    if (c->share != NULL) {
        curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, share_lock);
        curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
        curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    }
    return c;
}

void s3_close(s3_client *c)
{
    if (c == NULL)
        return;
    if (c->share != NULL)
        curl_share_cleanup(c->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&c->share_locks[i]);
    /* the secret does not outlive the client in freed memory */
    memset(c->secret, 0, sizeof c->secret);
    memset(c->token, 0, sizeof c->token);
    mem_free(c);
}

const char *s3_where(const s3_client *c)
{
    return c->where;
}

void s3_body_free(s3_body *b)
{
    if (b == NULL)
        return;
    mem_free(b->data);
    b->data = NULL;
    b->len = 0;
}

/* Appends s percent-encoded to out (at *at, of cap bytes): every byte but A-Z a-z 0-9
 * - . _ ~, and '/' too unless keep_slash.  -1 when out is too small. */
static int encode_into(char *out, size_t cap, size_t *at, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' ||
                    *p == '~' || (keep_slash && *p == '/');
        if (*at + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[(*at)++] = (char)*p;
        } else {
            out[(*at)++] = '%';
            out[(*at)++] = hex[*p >> 4];
            out[(*at)++] = hex[*p & 15];
        }
    }
    out[*at] = '\0';
    return 0;
}

/* The URL of key (NULL: the bucket itself) with query (already encoded and sorted, or
 * NULL).  -1 when it does not fit. */
static int url_of(const s3_client *c, const char *key, const char *query, char *out, size_t cap)
{
    int n = c->cfg.endpoint[0] != '\0'
                ? snprintf(out, cap, "%s/%s/", c->cfg.endpoint, c->cfg.bucket)
                : snprintf(out, cap, "https://%s.s3.%s.amazonaws.com/", c->cfg.bucket,
                           c->cfg.region);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    size_t at = (size_t)n;
    if (key != NULL && encode_into(out, cap, &at, key, 1) != 0)
        return -1;
    if (query != NULL) {
        int m = snprintf(out + at, cap - at, "?%s", query);
        if (m < 0 || (size_t)m >= cap - at)
            return -1;
    }
    return 0;
}

/* ---- one request ---- */

typedef struct exchange {
    /* the body to send, as pieces, and where the sending is */
    const s3_piece *pieces;
    size_t piece_count, piece, offset;
    /* what came back */
    long status;
    s3_object obj;
    int have_length;
    unsigned char *body;
    size_t body_len, body_cap, body_max;
    int body_over;              /* more came than body_max */
} exchange;

static size_t on_header(char *line, size_t size, size_t count, void *arg)
{
    exchange *x = arg;
    size_t n = size * count;
    char *colon = memchr(line, ':', n);
    if (colon == NULL)
        return n;
    size_t name_len = (size_t)(colon - line);
    const char *v = colon + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
        end--;
    size_t vlen = (size_t)(end - v);
    char value[128];
    if (vlen >= sizeof value)
        return n;
    memcpy(value, v, vlen);
    value[vlen] = '\0';
    if (name_len == 4 && strncasecmp(line, "ETag", 4) == 0 && vlen < sizeof x->obj.etag)
        memcpy(x->obj.etag, value, vlen + 1);
    else if (name_len == 14 && strncasecmp(line, "Content-Length", 14) == 0) {
        x->obj.size = strtoull(value, NULL, 10);
        x->have_length = 1;
    } else if (name_len == 26 && strncasecmp(line, "x-amz-meta-attn-generation", 26) == 0)
        x->obj.generation = strtoull(value, NULL, 10);
    return n;
}

static size_t on_body(char *data, size_t size, size_t count, void *arg)
{
    exchange *x = arg;
    size_t n = size * count;
    if (x->body_len + n > x->body_max) {
        x->body_over = 1;
        return 0;               /* stops the transfer: CURLE_WRITE_ERROR */
    }
    if (x->body_len + n > x->body_cap) {
        /* the announced length at once, so a large object is not copied as it doubles */
        size_t cap = x->body_cap     ? x->body_cap
                     : x->have_length && x->obj.size > 0 && x->obj.size <= x->body_max
                         ? (size_t)x->obj.size
                         : 16384;
        while (cap < x->body_len + n)
            cap *= 2;
        if (cap > x->body_max)
            cap = x->body_max;
        unsigned char *grown = mem_realloc(x->body, cap);
        if (grown == NULL)
            return 0;
        x->body = grown;
        x->body_cap = cap;
    }
    memcpy(x->body + x->body_len, data, n);
    x->body_len += n;
    return n;
}

static size_t on_send(char *buf, size_t size, size_t count, void *arg)
{
    exchange *x = arg;
    size_t room = size * count, done = 0;
    while (done < room && x->piece < x->piece_count) {
        const s3_piece *p = &x->pieces[x->piece];
        size_t take = p->len - x->offset < room - done ? p->len - x->offset : room - done;
        memcpy(buf + done, (const char *)p->data + x->offset, take);
        done += take;
        x->offset += take;
        if (x->offset == p->len) {
            x->piece++;
            x->offset = 0;
        }
    }
    return done;
}

/* The hex SHA-256 of the pieces into out (65 bytes).  -1 when libcrypto fails. */
static int sha256_hex(const s3_piece *pieces, size_t n, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_DigestUpdate(ctx, pieces[i].data, pieces[i].len) == 1;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &md_len) == 1 && md_len == 32;
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; ok && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return ok ? 0 : -1;
}

/* The SHA-256 of no bytes: every request without a body. */
static const char EMPTY_SHA256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

typedef struct request {
    const char *method;         /* "GET", "HEAD", "PUT", "DELETE" */
    const char *key;            /* NULL: the bucket */
    const char *query;          /* encoded and sorted, or NULL */
    const char *headers[6];     /* extra headers, NULL-terminated */
    const s3_piece *pieces;     /* PUT's body */
    size_t piece_count;
    size_t body_max;            /* the most of a 2xx body kept */
} request;

/* Fills err for a request that failed: the endpoint, what was asked, the status and the
 * S3 error code of the answer (or libcurl's reason). */
static int request_failed(const s3_client *c, const request *r, const exchange *x,
                          const char *curl_reason, attn_error *err)
{
    char code[64] = "", message[256] = "";
    if (x->body != NULL && x->body_len > 0)
        s3_xml_error(x->body, x->body_len, code, sizeof code, message, sizeof message);
    const char *target = r->key != NULL ? r->key : "(bucket)";
    if (curl_reason != NULL)
        return error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                         "The object store %s did not answer %s %s: %s.", c->where, r->method,
                         target, curl_reason);
    return error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                     "The object store %s answered %s %s with %ld %s%s%s.", c->where, r->method,
                     target, x->status, code[0] ? code : "(no S3 error code)",
                     message[0] ? ": " : "", message);
}

/* Makes request r.  Returns 0 with x filled (any status: the caller reads x->status), or
 * ERR_UNAVAILABLE with err filled when no answer came.  x->body is the caller's to free. */
static int perform(s3_client *c, const request *r, exchange *x, attn_error *err)
{
    char url[2048], sha_header[100];
    if (url_of(c, r->key, r->query, url, sizeof url) != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL, "An object key is too long.");
    char sha[65];
    if (r->piece_count > 0 ? sha256_hex(r->pieces, r->piece_count, sha) != 0
                           : (memcpy(sha, EMPTY_SHA256, sizeof sha), 0) != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL, "SHA-256 failed (libcrypto).");
    snprintf(sha_header, sizeof sha_header, "x-amz-content-sha256: %s", sha);
    CURL *h = curl_easy_init();
    if (h == NULL)
        return error_nomem(err);
    struct curl_slist *hdrs = NULL, *grown;
    int nomem = 0;
#define ADD_HEADER(text)                                \
    do {                                                \
        grown = curl_slist_append(hdrs, (text));        \
        if (grown == NULL)                              \
            nomem = 1;                                  \
        else                                            \
            hdrs = grown;                               \
    } while (0)
    /* No "Expect:" to turn off 100-continue: curl 7.88 would sign the header it then leaves
     * out, and the store refuses the signature.  Every header added here is signed. */
    ADD_HEADER(sha_header);
    char token_header[2100];
    if (c->token[0] != '\0') {
        snprintf(token_header, sizeof token_header, "x-amz-security-token: %s", c->token);
        ADD_HEADER(token_header);
    }
    for (size_t i = 0; i < sizeof r->headers / sizeof r->headers[0] && r->headers[i]; i++)
        ADD_HEADER(r->headers[i]);
#undef ADD_HEADER
    if (nomem) {
        curl_slist_free_all(hdrs);
        curl_easy_cleanup(h);
        return error_nomem(err);
    }
    x->pieces = r->pieces;
    x->piece_count = r->piece_count;
    x->body_max = r->body_max > S3_ERROR_BODY_MAX ? r->body_max : S3_ERROR_BODY_MAX;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_SHARE, c->share);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, c->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, c->key_id);
    curl_easy_setopt(h, CURLOPT_PASSWORD, c->secret);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, S3_CONNECT_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, S3_STALL_S);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    if (c->cfg.ca_file[0] != '\0')
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cfg.ca_file);
    if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "PUT") == 0) {
        curl_off_t len = 0;
        for (size_t i = 0; i < r->piece_count; i++)
            len += (curl_off_t)r->pieces[i].len;
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, len);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &x->status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    if (rc == CURLE_WRITE_ERROR && x->body_over)
        return error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                         "The object store %s sent more than %zu bytes for %s %s.", c->where,
                         x->body_max, r->method, r->key != NULL ? r->key : "(bucket)");
    if (rc != CURLE_OK)
        return request_failed(c, r, x, curl_easy_strerror(rc), err);
    return 0;
}

/* Maps a finished exchange's status to the outcome of s3.h, filling err on failure. */
static int outcome(const s3_client *c, const request *r, const exchange *x, attn_error *err)
{
    if (x->status >= 200 && x->status < 300)
        return 0;
    if (x->status == 404) {
        char code[64] = "";
        if (x->body != NULL)
            s3_xml_error(x->body, x->body_len, code, sizeof code, NULL, 0);
        /* a missing bucket is a store that is not there, not a missing object */
        if (strcmp(code, "NoSuchBucket") != 0)
            return S3_MISSING;
    }
    if (x->status == 412 || x->status == 304)
        return S3_CONFLICT;
    if (x->status == 501)
        return S3_UNSUPPORTED;
    return request_failed(c, r, x, NULL, err);
}

int s3_head(s3_client *c, const char *key, s3_object *obj, attn_error *err)
{
    request r = {.method = "HEAD", .key = key};
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0) {
        rc = outcome(c, &r, &x, err);
        if (rc == S3_CONFLICT)      /* HEAD has no condition: a 412 means something else */
            rc = request_failed(c, &r, &x, NULL, err);
    }
    if (rc == 0)
        *obj = x.obj;
    mem_free(x.body);
    return rc;
}

int s3_get(s3_client *c, const char *key, const char *if_match, size_t max_bytes, s3_body *body,
           s3_object *obj, attn_error *err)
{
    char cond[120];
    request r = {.method = "GET", .key = key, .body_max = max_bytes};
    if (if_match != NULL) {
        snprintf(cond, sizeof cond, "If-Match: %s", if_match);
        r.headers[0] = cond;
    }
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0)
        rc = outcome(c, &r, &x, err);
    if (rc == 0 && x.have_length && x.obj.size != x.body_len)
        rc = error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                       "The object store %s sent %zu bytes of %s where it announced %llu.",
                       c->where, x.body_len, key, (unsigned long long)x.obj.size);
    if (rc != 0) {
        mem_free(x.body);
        return rc;
    }
    x.obj.size = x.body_len;
    *obj = x.obj;
    body->data = x.body;
    body->len = x.body_len;
    return 0;
}

int s3_get_range(s3_client *c, const char *key, size_t n, s3_body *body, s3_object *obj,
                 attn_error *err)
{
    char range[64];
    snprintf(range, sizeof range, "Range: bytes=0-%zu", n > 0 ? n - 1 : 0);
    request r = {.method = "GET", .key = key, .headers = {range}, .body_max = n};
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0)
        rc = outcome(c, &r, &x, err);
    if (rc != 0) {
        mem_free(x.body);
        return rc;
    }
    *obj = x.obj;
    body->data = x.body;
    body->len = x.body_len;
    return 0;
}

int s3_put(s3_client *c, const char *key, const s3_piece *pieces, size_t n, uint64_t generation,
           s3_condition cond, const char *etag, s3_object *obj, attn_error *err)
{
    char meta[80], condition[120];
    snprintf(meta, sizeof meta, "x-amz-meta-attn-generation: %llu", (unsigned long long)generation);
    request r = {.method = "PUT", .key = key, .pieces = pieces, .piece_count = n};
    r.headers[0] = meta;
    r.headers[1] = "Content-Type: application/octet-stream";
    if (cond == S3_IF_ABSENT) {
        r.headers[2] = "If-None-Match: *";
    } else if (cond == S3_IF_MATCH) {
        snprintf(condition, sizeof condition, "If-Match: %s", etag);
        r.headers[2] = condition;
    }
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0)
        rc = outcome(c, &r, &x, err);
    if (rc == S3_MISSING)       /* a PUT of a key cannot miss it: the bucket is not there */
        rc = request_failed(c, &r, &x, NULL, err);
    if (rc == 0 && obj != NULL) {
        *obj = x.obj;
        obj->generation = generation;
        obj->size = 0;
        for (size_t i = 0; i < n; i++)
            obj->size += pieces[i].len;
    }
    mem_free(x.body);
    return rc;
}

int s3_delete(s3_client *c, const char *key, attn_error *err)
{
    request r = {.method = "DELETE", .key = key};
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0)
        rc = outcome(c, &r, &x, err);
    mem_free(x.body);
    return rc == S3_MISSING ? 0 : rc;
}

int s3_copy(s3_client *c, const char *from_key, const char *to_key, s3_object *obj,
            attn_error *err)
{
    /* Unconditional: curl 7.88 orders the signed headers by "name:value", which puts
     * x-amz-copy-source-if-match before x-amz-copy-source where SigV4 wants them by name,
     * and the store refuses the signature.  The caller compares the copy's ETag instead. */
    char source[1400];
    size_t at = (size_t)snprintf(source, sizeof source, "x-amz-copy-source: /%s/", c->cfg.bucket);
    if (at >= sizeof source || encode_into(source, sizeof source, &at, from_key, 1) != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL, "An object key is too long.");
    request r = {.method = "PUT", .key = to_key, .headers = {source}};
    exchange x = {0};
    int rc = perform(c, &r, &x, err);
    if (rc == 0)
        rc = outcome(c, &r, &x, err);
    /* a copy can answer 200 with an error document in its body */
    char code[64] = "";
    if (rc == 0 && x.body != NULL && s3_xml_error(x.body, x.body_len, code, sizeof code, NULL, 0) &&
        code[0] != '\0')
        rc = request_failed(c, &r, &x, NULL, err);
    mem_free(x.body);
    if (rc == 0)
        rc = s3_head(c, to_key, obj, err);
    return rc;
}

int s3_list(s3_client *c, const char *prefix, int (*each)(void *arg, const s3_entry *e), void *arg,
            unsigned long *requests, attn_error *err)
{
    char token[1024] = "", query[3200];
    for (;;) {
        /* the parameters sorted by name, each percent-encoded: what SigV4 signs */
        size_t at = 0;
        query[0] = '\0';
        if (token[0] != '\0') {
            at = (size_t)snprintf(query, sizeof query, "continuation-token=");
            if (encode_into(query, sizeof query, &at, token, 0) != 0)
                return error_set(err, ERR_INTERNAL, "internal", NULL,
                                 "A listing's continuation token is too long.");
            query[at++] = '&';
        }
        at += (size_t)snprintf(query + at, sizeof query - at, "delimiter=%%2F&list-type=2&prefix=");
        if (encode_into(query, sizeof query, &at, prefix, 0) != 0)
            return error_set(err, ERR_INTERNAL, "internal", NULL, "The prefix is too long.");
        request r = {.method = "GET", .query = query, .body_max = (size_t)16 << 20};
        exchange x = {0};
        int rc = perform(c, &r, &x, err);
        if (requests != NULL)
            (*requests)++;
        if (rc == 0)
            rc = outcome(c, &r, &x, err);
        if (rc == S3_MISSING || rc == S3_CONFLICT || rc == S3_UNSUPPORTED)
            rc = request_failed(c, &r, &x, NULL, err);
        int truncated = 0;
        if (rc == 0) {
            token[0] = '\0';
            rc = s3_xml_list(x.body, x.body_len, each, arg, &truncated, token, sizeof token);
            if (rc == S3_XML_BAD)
                rc = error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                               "The object store %s answered a listing with a document that is "
                               "not a ListObjectsV2 result.", c->where);
            /* any other code is each's, which filled its own error */
        }
        mem_free(x.body);
        if (rc != 0)
            return rc;
        if (!truncated)
            return 0;
        if (token[0] == '\0')
            return error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                             "The object store %s said a listing goes on but gave no "
                             "continuation token.", c->where);
    }
}

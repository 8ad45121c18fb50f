/*
 * s3.h - a small client of the S3 object API (AWS S3 and the stores that speak it: MinIO,
 * Ceph's radosgw, Swift's s3api), over libcurl, for the weight-set store's object backend
 * (store/store_s3.c).
 *
 * It does what that backend needs and no more: HEAD, GET, PUT (optionally conditional),
 * DELETE and server-side COPY of one object, and ListObjectsV2 of a prefix, page by page.
 * Requests are signed with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4); the
 * payload's SHA-256 (x-amz-content-sha256, which Debian's curl 7.88 leaves to the caller)
 * is computed here.  The credentials come from the environment (AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or a credentials file (AWS_SHARED_CREDENTIALS_FILE,
 * else ~/.aws/credentials; profile AWS_PROFILE, else "default"), never from flags, and are
 * never written to a log or an error message.
 *
 * Every request answers 0, one of the S3_* outcomes below, or ERR_UNAVAILABLE with err
 * filled (code "store_unreachable"): the message names the endpoint, the request, the
 * HTTP status and the S3 error code (SignatureDoesNotMatch, NoSuchBucket,
 * RequestTimeTooSkewed, ...) or libcurl's reason.  The client is safe to use from any
 * number of threads at once.
 */
#ifndef ATTN_S3_H
#define ATTN_S3_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Outcomes of a request that are not failures of the store (positive: not ERR_*). */
#define S3_MISSING 1     /* 404: no such object */
#define S3_CONFLICT 2    /* 412: a condition (If-Match, If-None-Match) did not hold */
#define S3_UNSUPPORTED 3 /* 501: the store does not implement what the request asked */

typedef struct s3_config {
    char bucket[64];
    char prefix[512];       /* without a trailing '/'; "" for the bucket's top */
    char endpoint[512];     /* "http(s)://host:port": path-style requests to ENDPOINT/BUCKET/KEY;
                             * "": AWS, https://BUCKET.s3.REGION.amazonaws.com/KEY */
    char region[64];
    char ca_file[1024];     /* "": the system's certificates */
} s3_config;

/* Parses "s3://BUCKET[/PREFIX]" into cfg->bucket and cfg->prefix (other fields untouched).
 * Returns 0, or ERR_BAD_REQUEST with err naming the field "store-url". */
int s3_parse_url(const char *url, s3_config *cfg, attn_error *err);

typedef struct s3_client s3_client;

/* A client for cfg (copied), with the credentials read now.  Returns it (free with
 * s3_close), or NULL with err filled when the credentials are missing or unreadable,
 * the endpoint is not http(s), or memory runs out. */
s3_client *s3_open(const s3_config *cfg, attn_error *err);
void s3_close(s3_client *c);

/* "ENDPOINT/BUCKET" (or the AWS host and bucket): how messages name the store. */
const char *s3_where(const s3_client *c);

/* What a HEAD, GET or PUT learnt of one object. */
typedef struct s3_object {
    char etag[80];          /* as the store sent it, quotes included */
    uint64_t size;
    uint64_t generation;    /* x-amz-meta-attn-generation; 0 when absent */
} s3_object;

/* A body held in memory (s3_get); free data with s3_body_free. */
typedef struct s3_body {
    unsigned char *data;
    size_t len;
} s3_body;
void s3_body_free(s3_body *b);

/* HEAD key: 0 with *obj filled, or S3_MISSING. */
int s3_head(s3_client *c, const char *key, s3_object *obj, attn_error *err);

/* GET key into *body (at most max_bytes; a larger object fails) with *obj filled; with
 * if_match (not NULL), only that ETag's version: S3_CONFLICT when it was replaced. */
int s3_get(s3_client *c, const char *key, const char *if_match, size_t max_bytes, s3_body *body,
           s3_object *obj, attn_error *err);

/* GET the first n bytes of key (a Range request) into *body: 0, or S3_MISSING. */
int s3_get_range(s3_client *c, const char *key, size_t n, s3_body *body, s3_object *obj,
                 attn_error *err);

/* One run of a PUT's body; the body is the runs in order. */
typedef struct s3_piece {
    const void *data;
    size_t len;
} s3_piece;

/* How a PUT is made conditional. */
typedef enum s3_condition {
    S3_ANY = 0,             /* unconditional: the last write wins */
    S3_IF_ABSENT,           /* If-None-Match: *  (a new name) */
    S3_IF_MATCH             /* If-Match: etag    (the version that was read) */
} s3_condition;

/* PUT key with the body pieces[0..n), whose user metadata attn-generation is generation,
 * in one signed request.  0 with obj->etag the new version's; S3_CONFLICT when the
 * condition did not hold; S3_UNSUPPORTED when the store answers 501 to the condition
 * (nothing was written). */
int s3_put(s3_client *c, const char *key, const s3_piece *pieces, size_t n, uint64_t generation,
           s3_condition cond, const char *etag, s3_object *obj, attn_error *err);

/* DELETE key: 0 (also when it was not there: S3 answers 204 either way). */
int s3_delete(s3_client *c, const char *key, attn_error *err);

/* Server-side copy of from_key to to_key: 0 with *obj the copy's (its ETag tells which
 * version was copied), S3_MISSING when from_key is not there. */
int s3_copy(s3_client *c, const char *from_key, const char *to_key, s3_object *obj,
            attn_error *err);

/* One object of a listing. */
typedef struct s3_entry {
    const char *key;        /* the full key */
    const char *etag;
    uint64_t size;
} s3_entry;

/* Calls each(arg, entry) for every object directly under prefix (keys in "prefix/x/..."
 * are not listed: the delimiter is '/'), one ListObjectsV2 page of up to 1000 at a time.
 * each returns 0 to go on, or a negative ERR_* code that stops the listing and is
 * returned as it is (err is then left alone: each reports through arg).  *requests counts
 * the pages asked for. */
int s3_list(s3_client *c, const char *prefix, int (*each)(void *arg, const s3_entry *e), void *arg,
            unsigned long *requests, attn_error *err);

#endif

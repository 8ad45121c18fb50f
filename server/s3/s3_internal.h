/*
 * s3_internal.h - what the files of the S3 client share; the rest of the server sees s3.h.
 *
 *   s3.c        the requests: URLs, signing, conditions, answers
 *   s3_xml.c    the XML the store answers with (a listing's page, an error's Code), read
 *               with expat
 *   s3_cred.c   the credentials, from the environment or a credentials file
 */
#ifndef ATTN_S3_INTERNAL_H
#define ATTN_S3_INTERNAL_H

#include <stddef.h>

#include "s3.h"

/* What s3_xml_list answers for a document that is not a ListObjectsV2 result. */
#define S3_XML_BAD 100

/* Reads one ListObjectsV2 page: calls each(arg, entry) for every Contents, sets
 * *truncated from IsTruncated and copies NextContinuationToken into token (token_len
 * bytes; "" when there is none).  Returns 0, S3_XML_BAD, or each's negative code (the
 * reading stops there). */
int s3_xml_list(const unsigned char *xml, size_t len, int (*each)(void *arg, const s3_entry *e),
                void *arg, int *truncated, char *token, size_t token_len);

/* Reads an S3 error document (<Error><Code>..</Code><Message>..</Message></Error>) into
 * code and message (either may be NULL).  Returns 1 when it was one, else 0 (both "" then). */
int s3_xml_error(const unsigned char *xml, size_t len, char *code, size_t code_len, char *message,
                 size_t message_len);

/* The credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN when
 * set) from the environment; else the profile AWS_PROFILE (or "default") of the file
 * AWS_SHARED_CREDENTIALS_FILE (or $HOME/.aws/credentials).  Returns 0, or ERR_INTERNAL
 * with err saying where it looked (never a secret). */
int s3_credentials_load(char *key_id, size_t key_len, char *secret, size_t secret_len, char *token,
                        size_t token_len, attn_error *err);

#endif

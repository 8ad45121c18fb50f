/*
 * s3_xml.c - the XML documents an S3 store answers with, read with expat: a ListObjectsV2
 * page (each Contents' Key, ETag and Size; IsTruncated; NextContinuationToken) and an
 * error (its Code and Message).  Only those elements are looked at, by their place in
 * the document; anything else is skipped, and a document that is not well-formed is
 * refused whole.
 */
#include "s3_internal.h"

#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

/* The longest text of one element that is kept (a key is at most 1024 bytes in S3). */
#define XML_TEXT_MAX 1100

typedef struct reader {
    XML_Parser parser;
    int depth;
    int in_contents;            /* depth of the Contents element being read, or 0 */
    char text[XML_TEXT_MAX + 1];
    size_t text_len;
    int text_over;
    /* the entry being read */
    char key[XML_TEXT_MAX + 1], etag[128];
    uint64_t size;
    int (*each)(void *arg, const s3_entry *e);
    void *arg;
    int each_rc;
    int truncated, is_list;
    char *token;
    size_t token_len;
    /* an error document */
    int is_error;
    char code[64], message[256];
} reader;

static void on_start(void *arg, const XML_Char *name, const XML_Char **attrs)
{
    (void)attrs;
    reader *r = arg;
    r->depth++;
    r->text_len = 0;
    r->text_over = 0;
    if (r->depth == 1) {
        r->is_list = strcmp(name, "ListBucketResult") == 0;
        r->is_error = strcmp(name, "Error") == 0;
    }
    if (r->depth == 2 && r->is_list && strcmp(name, "Contents") == 0) {
        r->in_contents = 1;
        r->key[0] = r->etag[0] = '\0';
        r->size = 0;
    }
}

static void on_text(void *arg, const XML_Char *s, int len)
{
    reader *r = arg;
    if (r->text_len + (size_t)len > XML_TEXT_MAX) {
        r->text_over = 1;
        return;
    }
    memcpy(r->text + r->text_len, s, (size_t)len);
    r->text_len += (size_t)len;
}

static void copy_text(const reader *r, char *out, size_t len)
{
    size_t n = r->text_len < len - 1 ? r->text_len : len - 1;
    memcpy(out, r->text, n);
    out[n] = '\0';
}

static void on_end(void *arg, const XML_Char *name)
{
    reader *r = arg;
    r->text[r->text_len] = '\0';
    if (r->is_list && r->in_contents && r->depth == 3) {
        if (strcmp(name, "Key") == 0 && !r->text_over)
            copy_text(r, r->key, sizeof r->key);
        else if (strcmp(name, "ETag") == 0)
            copy_text(r, r->etag, sizeof r->etag);
        else if (strcmp(name, "Size") == 0)
            r->size = strtoull(r->text, NULL, 10);
    } else if (r->is_list && r->in_contents && r->depth == 2) {
        r->in_contents = 0;
        if (r->key[0] != '\0' && r->each != NULL && r->each_rc == 0) {
            s3_entry e = {r->key, r->etag, r->size};
            r->each_rc = r->each(r->arg, &e);
            if (r->each_rc != 0)
                XML_StopParser(r->parser, XML_FALSE);
        }
    } else if (r->is_list && r->depth == 2) {
        if (strcmp(name, "IsTruncated") == 0)
            r->truncated = strcmp(r->text, "true") == 0;
        else if (strcmp(name, "NextContinuationToken") == 0 && r->token != NULL)
            copy_text(r, r->token, r->token_len);
    } else if (r->is_error && r->depth == 2) {
        if (strcmp(name, "Code") == 0)
            copy_text(r, r->code, sizeof r->code);
        else if (strcmp(name, "Message") == 0)
            copy_text(r, r->message, sizeof r->message);
    }
    r->text_len = 0;
    r->depth--;
}

/* Parses the document into r.  1 when it is well-formed (or each stopped it), else 0. */
static int read_document(reader *r, const unsigned char *xml, size_t len)
{
    r->parser = XML_ParserCreate(NULL);
    if (r->parser == NULL)
        return 0;
    XML_SetUserData(r->parser, r);
    XML_SetElementHandler(r->parser, on_start, on_end);
    XML_SetCharacterDataHandler(r->parser, on_text);
    int ok = len <= (size_t)0x7fffffff &&
             XML_Parse(r->parser, (const char *)xml, (int)len, XML_TRUE) != XML_STATUS_ERROR;
    XML_ParserFree(r->parser);
    return ok || r->each_rc != 0;
}

int s3_xml_list(const unsigned char *xml, size_t len, int (*each)(void *arg, const s3_entry *e),
                void *arg, int *truncated, char *token, size_t token_len)
{
    reader *r = mem_calloc(1, sizeof *r);
    if (r == NULL)
        return S3_XML_BAD;
    r->each = each;
    r->arg = arg;
    r->token = token;
    r->token_len = token_len;
    if (token_len > 0)
        token[0] = '\0';
    int ok = read_document(r, xml, len);
    int rc = r->each_rc != 0 ? r->each_rc : ok && r->is_list ? 0 : S3_XML_BAD;
    *truncated = r->truncated;
    mem_free(r);
    return rc;
}

int s3_xml_error(const unsigned char *xml, size_t len, char *code, size_t code_len, char *message,
                 size_t message_len)
{
    if (code != NULL && code_len > 0)
        code[0] = '\0';
    if (message != NULL && message_len > 0)
        message[0] = '\0';
    reader *r = mem_calloc(1, sizeof *r);
    if (r == NULL)
        return 0;
    int ok = read_document(r, xml, len) && r->is_error;
    if (ok && code != NULL && code_len > 0)
        snprintf(code, code_len, "%s", r->code);
    if (ok && message != NULL && message_len > 0)
        snprintf(message, message_len, "%s", r->message);
    mem_free(r);
    return ok;
}

/*
 * test_s3.c - the S3 client's pieces that need no server (server/s3/): --store-url's
 * parsing, the XML the store answers with (a ListObjectsV2 page, an error document, and
 * what is not one), and where the credentials come from.  The requests themselves are
 * tested against a real S3 server by the s3-store suite (tests/s3/).
 */
#include <stdlib.h>
#include <unistd.h>

#include "s3/s3.h"
#include "s3/s3_internal.h"
#include "test.h"

void test_s3_parse_url(void)
{
    s3_config cfg = {0};
    attn_error err;
    ASSERT_EQ(s3_parse_url("s3://weights/prod/sets/", &cfg, &err), 0);
    ASSERT_STR_EQ(cfg.bucket, "weights");
    ASSERT_STR_EQ(cfg.prefix, "prod/sets");
    ASSERT_EQ(s3_parse_url("s3://weights", &cfg, &err), 0);
    ASSERT_STR_EQ(cfg.bucket, "weights");
    ASSERT_STR_EQ(cfg.prefix, "");
    const char *bad[] = {"weights/prod", "http://weights", "s3://", "s3://ab", "s3://Upper/x",
                         "s3://under_score", "s3:///prefix"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT(s3_parse_url(bad[i], &cfg, &err) == ERR_BAD_REQUEST);
        ASSERT_STR_EQ(err.field, "store-url");
    }
}

typedef struct seen_objects {
    char keys[4][64], etags[4][64];
    uint64_t sizes[4];
    int count, stop_at;
} seen_objects;

static int note_object(void *arg, const s3_entry *e)
{
    seen_objects *s = arg;
    if (s->count == s->stop_at)
        return ERR_UNAVAILABLE;
    if (s->count < 4) {
        snprintf(s->keys[s->count], sizeof s->keys[0], "%s", e->key);
        snprintf(s->etags[s->count], sizeof s->etags[0], "%s", e->etag);
        s->sizes[s->count] = e->size;
    }
    s->count++;
    return 0;
}

static const char LIST_PAGE[] =
    "<?xml version='1.0' encoding='UTF-8'?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Name>bkt</Name><Prefix>sets/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>"
    "<Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>"
    "<Contents><Key>sets/a.wset</Key><LastModified>2026-12-02T12:00:00.000Z</LastModified>"
    "<ETag>&quot;0123abcd&quot;</ETag><Size>248</Size><StorageClass>STANDARD</StorageClass>"
    "</Contents>"
    "<Contents><Key>sets/b &amp; c.wset</Key><ETag>\"ffee-2\"</ETag><Size>1048576</Size>"
    "</Contents>"
    "<CommonPrefixes><Prefix>sets/quarantine/</Prefix></CommonPrefixes>"
    "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
    "</ListBucketResult>";

void test_s3_xml_list(void)
{
    seen_objects s = {.stop_at = -1};
    int truncated = 0;
    char token[128];
    ASSERT_EQ(s3_xml_list((const unsigned char *)LIST_PAGE, strlen(LIST_PAGE), note_object, &s,
                          &truncated, token, sizeof token), 0);
    ASSERT_EQ(s.count, 2);
    ASSERT_STR_EQ(s.keys[0], "sets/a.wset");
    ASSERT_STR_EQ(s.etags[0], "\"0123abcd\"");
    ASSERT_EQ(s.sizes[0], 248);
    ASSERT_STR_EQ(s.keys[1], "sets/b & c.wset");
    ASSERT_EQ(s.sizes[1], 1048576);
    ASSERT_EQ(truncated, 1);
    ASSERT_STR_EQ(token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");

    /* the callback's code stops the reading and comes back as it is */
    seen_objects stop = {.stop_at = 1};
    ASSERT_EQ(s3_xml_list((const unsigned char *)LIST_PAGE, strlen(LIST_PAGE), note_object, &stop,
                          &truncated, token, sizeof token), ERR_UNAVAILABLE);
    ASSERT_EQ(stop.count, 1);

    /* a last page, an error document, a torn page and no XML at all */
    const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
    seen_objects none = {.stop_at = -1};
    ASSERT_EQ(s3_xml_list((const unsigned char *)last, strlen(last), note_object, &none,
                          &truncated, token, sizeof token), 0);
    ASSERT_EQ(truncated, 0);
    ASSERT_STR_EQ(token, "");
    const char *not_list[] = {"<Error><Code>AccessDenied</Code></Error>",
                              "<ListBucketResult><Contents><Key>x.wset</Key>", "not xml", ""};
    for (size_t i = 0; i < sizeof not_list / sizeof not_list[0]; i++)
        ASSERT_EQ(s3_xml_list((const unsigned char *)not_list[i], strlen(not_list[i]),
                              note_object, &none, &truncated, token, sizeof token), S3_XML_BAD);
}

void test_s3_xml_error(void)
{
    const char *doc = "<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>SignatureDoesNotMatch"
                      "</Code><Message>The request signature we calculated does not match."
                      "</Message><RequestId>tx1</RequestId></Error>";
    char code[64], message[256];
    ASSERT_EQ(s3_xml_error((const unsigned char *)doc, strlen(doc), code, sizeof code, message,
                           sizeof message), 1);
    ASSERT_STR_EQ(code, "SignatureDoesNotMatch");
    ASSERT_STR_EQ(message, "The request signature we calculated does not match.");
    ASSERT_EQ(s3_xml_error((const unsigned char *)LIST_PAGE, strlen(LIST_PAGE), code, sizeof code,
                           NULL, 0), 0);
    ASSERT_STR_EQ(code, "");
    ASSERT_EQ(s3_xml_error((const unsigned char *)"<Error><Code>", 13, code, sizeof code, NULL, 0),
              0);
}

/* Sets name to value (NULL: unset) and returns its old value, copied (free it). */
static char *swap_env(const char *name, const char *value)
{
    const char *old = getenv(name);
    char *kept = old != NULL ? strdup(old) : NULL;
    if (value != NULL)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return kept;
}

void test_s3_credentials(void)
{
    const char *names[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "HOME"};
    char *saved[6];
    for (int i = 0; i < 6; i++)
        saved[i] = swap_env(names[i], NULL);
    char id[64], secret[64], token[64], path[] = "/tmp/attn-s3-cred-XXXXXX";
    attn_error err;
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f != NULL) {
        fputs("# a comment\n[default]\naws_access_key_id = DEFAULTID\n"
              "aws_secret_access_key=defaultsecret\n\n[attn]\n aws_access_key_id = test:tester \n"
              "aws_secret_access_key = testing\naws_session_token = tok\n", f);
        fclose(f);
    }
    int ok = f != NULL;
    /* the environment first */
    setenv("AWS_ACCESS_KEY_ID", "ENVID", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
    ok = ok && s3_credentials_load(id, sizeof id, secret, sizeof secret, token, sizeof token, &err) == 0 &&
         strcmp(id, "ENVID") == 0 && strcmp(secret, "envsecret") == 0 && token[0] == '\0';
    /* then the file's profile, default or named */
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    ok = ok && s3_credentials_load(id, sizeof id, secret, sizeof secret, token, sizeof token, &err) == 0 &&
         strcmp(id, "DEFAULTID") == 0 && strcmp(secret, "defaultsecret") == 0;
    setenv("AWS_PROFILE", "attn", 1);
    ok = ok && s3_credentials_load(id, sizeof id, secret, sizeof secret, token, sizeof token, &err) == 0 &&
         strcmp(id, "test:tester") == 0 && strcmp(secret, "testing") == 0 && strcmp(token, "tok") == 0;
    /* a profile that is not there: refused, naming the file and profile, never a secret */
    setenv("AWS_PROFILE", "absent", 1);
    int refused = s3_credentials_load(id, sizeof id, secret, sizeof secret, token, sizeof token,
                                      &err) == ERR_INTERNAL;
    int named = strstr(err.message, path) != NULL && strstr(err.message, "[absent]") != NULL &&
                strstr(err.message, "testing") == NULL;
    unlink(path);
    for (int i = 0; i < 6; i++) {
        free(swap_env(names[i], saved[i]));
        free(saved[i]);
    }
    ASSERT(ok);
    ASSERT(refused);
    ASSERT(named);
}

/*
 * s3_cred.c - where the S3 credentials come from: the environment, as every AWS tool reads
 * it (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), or the shared
 * credentials file those tools write (a Kubernetes Secret mounted as a file works too).
 * Never from a flag: a command line is visible to every process on the machine.
 *
 * The file is the AWS format: "[profile]" sections of "name = value" lines, '#' or ';'
 * comments.  Only the three names above are read (aws_access_key_id, aws_secret_access_key,
 * aws_session_token); nothing read here is ever printed.
 */
#include "s3_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies s into out (len bytes); -1 when it does not fit or is empty. */
static int take(const char *s, char *out, size_t len)
{
    size_t n = strlen(s);
    if (n == 0 || n >= len)
        return -1;
    memcpy(out, s, n + 1);
    return 0;
}

/* s with the blanks at both ends cut off (in place). */
static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Reads the profile of the credentials file at path.  0 when it gave a key id and a
 * secret; 1 when the file or the profile is not there; -1 when a value is too long. */
static int read_file(const char *path, const char *profile, char *key_id, size_t key_len,
                     char *secret, size_t secret_len, char *token, size_t token_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1;
    char line[4096];
    int in_profile = 0, bad = 0;
    key_id[0] = secret[0] = token[0] = '\0';
    while (fgets(line, sizeof line, f) != NULL) {
        char *s = trim(line);
        if (*s == '#' || *s == ';' || *s == '\0')
            continue;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (end != NULL)
                *end = '\0';
            in_profile = strcmp(trim(s + 1), profile) == 0;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in_profile || eq == NULL)
            continue;
        *eq = '\0';
        char *name = trim(s), *value = trim(eq + 1);
        if (strcmp(name, "aws_access_key_id") == 0)
            bad |= take(value, key_id, key_len) != 0;
        else if (strcmp(name, "aws_secret_access_key") == 0)
            bad |= take(value, secret, secret_len) != 0;
        else if (strcmp(name, "aws_session_token") == 0)
            bad |= take(value, token, token_len) != 0;
    }
    fclose(f);
    memset(line, 0, sizeof line);
    if (bad)
        return -1;
    return key_id[0] != '\0' && secret[0] != '\0' ? 0 : 1;
}

int s3_credentials_load(char *key_id, size_t key_len, char *secret, size_t secret_len, char *token,
                        size_t token_len, attn_error *err)
{
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *key = getenv("AWS_SECRET_ACCESS_KEY");
    const char *session = getenv("AWS_SESSION_TOKEN");
    token[0] = '\0';
    if (id != NULL && key != NULL && *id != '\0' && *key != '\0') {
        if (take(id, key_id, key_len) != 0 || take(key, secret, secret_len) != 0 ||
            (session != NULL && *session != '\0' && take(session, token, token_len) != 0))
            return error_set(err, ERR_INTERNAL, "bad_credentials", NULL,
                             "An AWS_* credential in the environment is too long.");
        return 0;
    }
    char path[1024];
    const char *file = getenv("AWS_SHARED_CREDENTIALS_FILE"), *home = getenv("HOME");
    const char *profile = getenv("AWS_PROFILE");
    if (profile == NULL || *profile == '\0')
        profile = "default";
    if (file != NULL && *file != '\0')
        snprintf(path, sizeof path, "%s", file);
    else
        snprintf(path, sizeof path, "%s/.aws/credentials", home != NULL ? home : "");
    int rc = read_file(path, profile, key_id, key_len, secret, secret_len, token, token_len);
    if (rc == 0)
        return 0;
    if (rc < 0)
        return error_set(err, ERR_INTERNAL, "bad_credentials", NULL,
                         "A value of profile [%s] in %s is too long.", profile, path);
    return error_set(err, ERR_INTERNAL, "bad_credentials", NULL,
                     "No S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
                     "a credentials file (AWS_SHARED_CREDENTIALS_FILE, else %s) with "
                     "aws_access_key_id and aws_secret_access_key in profile [%s].", path,
                     profile);
}

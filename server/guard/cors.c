/*
 * cors.c - which web pages may change the server's state (see cors.h).
 *
 * Pure functions of the request's method, Origin and Host and of the
 * settings copied by cors_policy_init, so the unit tests need no socket and
 * every I/O thread reads the policy without locks.
 */
#include "cors.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The part of an origin after "http://" or "https://", or NULL when it has
 * neither scheme ("null", a file: page, garbage). */
static const char *origin_authority(const char *origin)
{
    if (strncasecmp(origin, "http://", 7) == 0)
        return origin + 7;
    if (strncasecmp(origin, "https://", 8) == 0)
        return origin + 8;
    return NULL;
}

/* 1 when the comma-separated list holds origin (case-insensitive, blanks
 * around an item and one trailing '/' ignored). */
static int list_holds(const char *list, const char *origin)
{
    size_t want = strlen(origin);
    for (const char *p = list; *p != '\0';) {
        size_t n = strcspn(p, ",");
        const char *start = p, *end = p + n;
        while (start < end && (*start == ' ' || *start == '\t'))
            start++;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (end > start && end[-1] == '/')
            end--;
        if ((size_t)(end - start) == want && strncasecmp(start, origin, want) == 0)
            return 1;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

int cors_policy_init(cors_policy *p, const server_config *cfg, attn_error *err)
{
    memset(p, 0, sizeof *p);
    snprintf(p->write_origins, sizeof p->write_origins, "%s", cfg->cors_write_origins);
    p->writes_need_token = cfg->auth_writes != 0 || cfg->auth_all != 0;
    for (const char *q = p->write_origins; *q != '\0';) {
        size_t n = strcspn(q, ",");
        char item[1024];
        snprintf(item, sizeof item, "%.*s", (int)n, q);
        char *start = item, *end = item + strlen(item);
        while (*start == ' ' || *start == '\t')
            start++;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        const char *authority = origin_authority(start);
        if (*start != '\0' && (authority == NULL || *authority == '\0'))
            return error_set(err, ERR_INTERNAL, "bad_config", "cors_write_origins",
                             "--cors-write-origins \"%.200s\" is not an origin: write "
                             "scheme://host[:port], such as https://admin.example.", start);
        q += n;
        if (*q == ',')
            q++;
    }
    return 0;
}

int cors_is_write(const char *method)
{
    return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 &&
           strcmp(method, "OPTIONS") != 0 && strcmp(method, "POST") != 0;
}

int cors_may_write(const cors_policy *p, const char *origin, const char *host)
{
    if (origin == NULL || p->writes_need_token)
        return 1;
    const char *authority = origin_authority(origin);
    /* The server's own page: its origin's host and port are the Host the
     * browser connected to.  (A page on a rebound name passes this too; the
     * Host allow-list is what stops it, see guard.h.) */
    if (authority != NULL && host != NULL && *authority != '\0' &&
        strcasecmp(authority, host) == 0)
        return 1;
    return list_holds(p->write_origins, origin);
}

int cors_check(const cors_policy *p, const char *method, const char *origin, const char *host,
               attn_error *err)
{
    if (!cors_is_write(method) || cors_may_write(p, origin, host))
        return 0;
    return error_set(err, ERR_FORBIDDEN, "cross_origin_write", NULL,
                     "A page of origin \"%.100s\" may not %.10s here: list it in "
                     "--cors-write-origins, or turn on --auth-writes and send a token.",
                     origin, method);
}

const char *cors_preflight_methods(const cors_policy *p, const char *allow, const char *origin,
                                   const char *host, char *buf, size_t n)
{
    if (allow == NULL || cors_may_write(p, origin, host) || n == 0)
        return allow;
    /* Keep the methods of allow ("GET, HEAD, PUT, DELETE, OPTIONS") that
     * are not writes. */
    size_t used = 0;
    buf[0] = '\0';
    for (const char *q = allow; *q != '\0';) {
        size_t len = strcspn(q, ", ");
        char method[16];
        snprintf(method, sizeof method, "%.*s", (int)len, q);
        if (len > 0 && !cors_is_write(method) && used + len + 3 <= n)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : "", method);
        q += len;
        while (*q == ',' || *q == ' ')
            q++;
    }
    return buf;
}

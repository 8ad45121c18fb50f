/*
 * hostile_json.c - the hostile suite's json-memory group: bodies whose JSON tree is far
 * larger than their text.
 *
 * jansson makes 208 bytes of an empty object, the 2 bytes "{}": a body of many of them
 * needs some 80 bytes a byte once parsed, three times the 25 a byte that its length alone
 * reserves.  The server counts a body's brackets and commas as it arrives and reserves for
 * them too (server/http/http_body.c, docs/security.md), so such a body is refused while it
 * arrives, with the cause in the message, instead of being parsed past --max-memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integration/hostile.h"
#include "integration/itest.h"
#include "integration/rawhttp.h"

/* The budget and what the process holds beside it at rest (the program, OpenBLAS and
 * libmicrohttpd's buffers: some 20 to 30 MiB) with allocator slack, as the memory group
 * allows. */
#define JSON_BUDGET_MIB 256
#define JSON_MARGIN_MIB 96
/* A body of this many "{}" is 5.1 MB: 122 MiB at 25 a byte, within one address's half of
 * the budget (so not refused at its headers), but its tree alone is some 380 MiB, which
 * the server used to parse (a peak of 397 MiB). */
#define JSON_MANY_CONTAINERS 1700000
/* A body of this many is 60 KB, its tree about 5 MiB: answered as any request is. */
#define JSON_FEW_CONTAINERS 20000

/* {"inputs":[{},{},...]} with `count` empty objects; the caller frees it. */
static char *containers_body(size_t count, size_t *len)
{
    char *b = client_xcalloc(3 * count + 32, 1);
    size_t n = (size_t)sprintf(b, "{\"inputs\":[");
    for (size_t i = 0; i < count; i++) {
        if (i)
            b[n++] = ',';
        b[n++] = '{';
        b[n++] = '}';
    }
    n += (size_t)sprintf(b + n, "]}");
    *len = n;
    return b;
}

/* POSTs a body of `count` empty objects to /v1/attention; fills a. */
static int post_containers(const struct server *s, size_t count, rawhttp_answer *a)
{
    size_t len;
    char *body = containers_body(count, &len);
    int rc = rawhttp_roundtrip(s->port, "POST", "/v1/attention", NULL, body, len, 60.0, a);
    free(body);
    return rc;
}

void hostile_json_memory(void)
{
    char budget[16];
    snprintf(budget, sizeof budget, "%dM", JSON_BUDGET_MIB);
    const char *const flags[] = {"--quiet", "--max-memory", budget, NULL};
    struct server s;
    struct server_kind kind;
    if (hostile_server_start(&s, &kind, "json-memory", flags) != 0)
        return;
    rawhttp_answer a;
    memset(&a, 0, sizeof a);
    /* A few containers are parsed and judged as any body is: "inputs" is no field. */
    int rc = post_containers(&s, JSON_FEW_CONTAINERS, &a);
    test_check(rc == 0 && a.status == 400 && a.body != NULL &&
                   strstr(a.body, "\"unknown_field\"") != NULL,
               "json-memory/small-containers-answered", "status %d, body %.300s", a.status,
               a.body != NULL ? a.body : "(none)");
    rawhttp_answer_free(&a);

    memset(&a, 0, sizeof a);
    rc = post_containers(&s, JSON_MANY_CONTAINERS, &a);
    test_check(rc == 0 && a.status == 413 && a.body != NULL &&
                   strstr(a.body, "\"body_too_large\"") != NULL &&
                   strstr(a.body, "objects and arrays") != NULL,
               "json-memory/containers-413", "status %d for %d empty objects, body %.400s",
               a.status, JSON_MANY_CONTAINERS, a.body != NULL ? a.body : "(none)");
    rawhttp_answer_free(&a);

    long peak = hostile_status_kib(s.pid, "VmHWM");
    test_check(peak > 0 && peak < (JSON_BUDGET_MIB + JSON_MARGIN_MIB) * 1024L,
               "json-memory/peak-rss-under-budget", "peak RSS %ld KiB, budget %d MiB + %d MiB margin",
               peak, JSON_BUDGET_MIB, JSON_MARGIN_MIB);

    static const char normal[] =
        "{\"q\":[[1,0],[0,1]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]]}";
    memset(&a, 0, sizeof a);
    rc = rawhttp_roundtrip(s.port, "POST", "/v1/attention", NULL, normal, sizeof normal - 1, 10.0,
                           &a);
    test_check(rc == 0 && a.status == 200, "json-memory/normal-request-after", "status %d",
               a.status);
    rawhttp_answer_free(&a);
    server_stop(&s);
}

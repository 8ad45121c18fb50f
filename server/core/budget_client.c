/*
 * budget_client.c - each client address's share of the memory budget (see
 * budget_client.h).
 *
 * A hash table of records keyed by address, under one mutex.  It is taken a
 * few times per request (a body reserves in doubling steps, see
 * server/http/http_body.c), so one lock is cheap enough; the process budget is still the
 * atomic counter of budget.c.  A record lives while a connection refers to it or it holds
 * bytes, so the table never has more records than open connections.
 */
#include "budget_client.h"

#include <netinet/in.h>
#include <pthread.h>
#include <string.h>

#include "addr_key.h"
#include "budget.h"
#include "mem.h"

#define CLIENT_BUCKETS 1024

struct budget_client {
    budget_client *next;        /* in its bucket */
    unsigned char key[16];      /* IPv4 address, or the /64 of an IPv6 one */
    size_t key_len;
    long refs;                  /* connections that hold it */
    size_t held;                /* bytes reserved for it */
};

static pthread_mutex_t clients_lock = PTHREAD_MUTEX_INITIALIZER;
static budget_client *buckets[CLIENT_BUCKETS];
static size_t cap_bytes;

void budget_client_init(long percent)
{
    size_t limit = budget_limit();
    if (percent < 1)
        percent = 1;
    if (percent > 100)
        percent = 100;
    cap_bytes = limit == 0 ? 0 : limit / 100 * (size_t)percent + limit % 100 * (size_t)percent / 100;
    pthread_mutex_lock(&clients_lock);
    memset(buckets, 0, sizeof buckets);
    pthread_mutex_unlock(&clients_lock);
}

size_t budget_client_cap(void)
{
    return cap_bytes;
}

/* An IPv6 client is its /64 (budget_client.h). */
#define CLIENT_V6_BYTES 8

static size_t client_key(const struct sockaddr *addr, unsigned char key[16])
{
    return addr_key(addr, CLIENT_V6_BYTES, key);
}

static size_t bucket_of(const unsigned char *key, size_t len)
{
    return addr_key_bucket(key, len, CLIENT_BUCKETS);
}

budget_client *budget_client_get(const struct sockaddr *addr)
{
    unsigned char key[16];
    size_t len = client_key(addr, key);
    size_t b = bucket_of(key, len);
    pthread_mutex_lock(&clients_lock);
    budget_client *c = buckets[b];
    while (c != NULL && (c->key_len != len || memcmp(c->key, key, len) != 0))
        c = c->next;
    if (c == NULL && (c = mem_calloc(1, sizeof *c)) != NULL) {
        memcpy(c->key, key, len);
        c->key_len = len;
        c->next = buckets[b];
        buckets[b] = c;
    }
    if (c != NULL)
        c->refs++;
    pthread_mutex_unlock(&clients_lock);
    return c;
}

/* Unlinks and frees c when nothing refers to it and it holds nothing
 * (under clients_lock). */
static void client_drop_if_idle(budget_client *c)
{
    if (c->refs > 0 || c->held > 0)
        return;
    budget_client **link = &buckets[bucket_of(c->key, c->key_len)];
    while (*link != c)
        link = &(*link)->next;
    *link = c->next;
    mem_free(c);
}

void budget_client_put(budget_client *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&clients_lock);
    c->refs--;
    client_drop_if_idle(c);
    pthread_mutex_unlock(&clients_lock);
}

int budget_client_reserve(budget_client *c, size_t bytes)
{
    if (c == NULL)
        return budget_reserve(bytes);
    int rc = -1;
    pthread_mutex_lock(&clients_lock);
    if ((cap_bytes == 0 || (bytes <= cap_bytes && c->held <= cap_bytes - bytes)) &&
        budget_reserve(bytes) == 0) {
        c->held += bytes;
        rc = 0;
    }
    pthread_mutex_unlock(&clients_lock);
    return rc;
}

void budget_client_release(budget_client *c, size_t bytes)
{
    if (c == NULL) {
        budget_release(bytes);
        return;
    }
    pthread_mutex_lock(&clients_lock);
    c->held -= bytes;
    budget_release(bytes);
    client_drop_if_idle(c);
    pthread_mutex_unlock(&clients_lock);
}

size_t budget_client_held(const budget_client *c)
{
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&clients_lock);
    size_t held = c->held;
    pthread_mutex_unlock(&clients_lock);
    return held;
}

/*
 * conn_ledger.c - the connections open on every listener (conn_ledger.h).
 *
 * A hash table of per-address counts under one mutex, taken once when a
 * connection opens and once when it closes: cheap beside the accept itself.
 * A record lives while its address has a connection open, so the table never
 * holds more records than open connections.
 */
#include "conn_ledger.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "addr_key.h"

#define LEDGER_BUCKETS 1024

typedef struct ledger_entry {
    struct ledger_entry *next;
    unsigned char key[16];
    size_t key_len;
    long open;
} ledger_entry;

static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static ledger_entry *buckets[LEDGER_BUCKETS];
static long open_total, cap_total = 1, cap_address;

/* The key of addr: the whole IPv6 address, as libmicrohttpd's own per-address
 * cap counts it (addr_key.h). */
static size_t address_key(const struct sockaddr *addr, unsigned char key[16])
{
    return addr_key(addr, 16, key);
}

static size_t bucket_of(const unsigned char *key, size_t len)
{
    return addr_key_bucket(key, len, LEDGER_BUCKETS);
}

/* The record of key, or NULL; under ledger_lock. */
static ledger_entry **find(const unsigned char *key, size_t len)
{
    ledger_entry **at = &buckets[bucket_of(key, len)];
    while (*at != NULL && ((*at)->key_len != len || memcmp((*at)->key, key, len) != 0))
        at = &(*at)->next;
    return at;
}

void conn_ledger_init(long max_total, long max_per_address)
{
    pthread_mutex_lock(&ledger_lock);
    for (size_t b = 0; b < LEDGER_BUCKETS; b++)
        while (buckets[b] != NULL) {
            ledger_entry *e = buckets[b];
            buckets[b] = e->next;
            free(e);
        }
    open_total = 0;
    cap_total = max_total < 1 ? 1 : max_total;
    cap_address = max_per_address < 0 ? 0 : max_per_address;
    pthread_mutex_unlock(&ledger_lock);
}

/* Whether one more connection from key fits; under ledger_lock. */
static int fits(const unsigned char *key, size_t len)
{
    if (open_total >= cap_total)
        return 0;
    if (cap_address == 0 || len == 0)
        return 1;
    ledger_entry *e = *find(key, len);
    return e == NULL || e->open < cap_address;
}

int conn_ledger_admits(const struct sockaddr *addr)
{
    unsigned char key[16];
    size_t len = address_key(addr, key);
    pthread_mutex_lock(&ledger_lock);
    int ok = fits(key, len);
    pthread_mutex_unlock(&ledger_lock);
    return ok;
}

int conn_ledger_enter(const struct sockaddr *addr, int check_caps)
{
    unsigned char key[16];
    size_t len = address_key(addr, key);
    int rc = 0;
    pthread_mutex_lock(&ledger_lock);
    if (check_caps && !fits(key, len)) {
        rc = -1;
    } else {
        open_total++;
        if (len != 0) {
            ledger_entry **at = find(key, len);
            if (*at == NULL && (*at = calloc(1, sizeof **at)) != NULL) {
                memcpy((*at)->key, key, len);
                (*at)->key_len = len;
            }
            if (*at != NULL) /* out of memory: the total still counts it */
                (*at)->open++;
        }
    }
    pthread_mutex_unlock(&ledger_lock);
    return rc;
}

void conn_ledger_leave(const struct sockaddr *addr)
{
    unsigned char key[16];
    size_t len = address_key(addr, key);
    pthread_mutex_lock(&ledger_lock);
    if (open_total > 0)
        open_total--;
    if (len != 0) {
        ledger_entry **at = find(key, len);
        if (*at != NULL && --(*at)->open <= 0) {
            ledger_entry *e = *at;
            *at = e->next;
            free(e);
        }
    }
    pthread_mutex_unlock(&ledger_lock);
}

long conn_ledger_open(void)
{
    pthread_mutex_lock(&ledger_lock);
    long n = open_total;
    pthread_mutex_unlock(&ledger_lock);
    return n;
}

long conn_ledger_open_from(const struct sockaddr *addr)
{
    unsigned char key[16];
    size_t len = address_key(addr, key);
    pthread_mutex_lock(&ledger_lock);
    ledger_entry *e = len != 0 ? *find(key, len) : NULL;
    long n = e != NULL ? e->open : 0;
    pthread_mutex_unlock(&ledger_lock);
    return n;
}

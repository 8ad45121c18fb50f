/*
 * addr_key.c - a client address as a table's key (addr_key.h).
 */
#include "addr_key.h"

#include <netinet/in.h>
#include <string.h>

size_t addr_key(const struct sockaddr *addr, size_t v6_bytes, unsigned char key[16])
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (addr != NULL && addr->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)(const void *)addr)->sin_addr, 4);
        return 4;
    }
    if (addr != NULL && addr->sa_family == AF_INET6) {
        const unsigned char *a =
            ((const struct sockaddr_in6 *)(const void *)addr)->sin6_addr.s6_addr;
        if (memcmp(a, mapped, sizeof mapped) == 0) {
            memcpy(key, a + 12, 4);
            return 4;
        }
        size_t n = v6_bytes < 16 ? v6_bytes : 16;
        memcpy(key, a, n);
        return n;
    }
    return 0;
}

size_t addr_key_bucket(const unsigned char *key, size_t len, size_t buckets)
{
    size_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ key[i]) * 16777619u;
    return h % buckets;
}

/*
 * addr_key.h - a client address as the key of a table of clients: what the
 * memory share (budget_client.c) and the connection ledger (conn_ledger.c)
 * both count by.
 *
 * An IPv4 address is its 4 bytes, also when mapped into IPv6 (::ffff:a.b.c.d),
 * so that a client is one client whichever socket family accepted it; an IPv6
 * address is its first v6_bytes bytes (8: its /64, 16: the whole address).
 */
#ifndef ATTN_ADDR_KEY_H
#define ATTN_ADDR_KEY_H

#include <stddef.h>
#include <sys/socket.h>

/* Writes the key of addr into key and returns its length: 4 for IPv4,
 * v6_bytes (at most 16) for IPv6, 0 for NULL or another family. */
size_t addr_key(const struct sockaddr *addr, size_t v6_bytes, unsigned char key[16]);

/* The FNV-1a hash of a key of len bytes, modulo buckets. */
size_t addr_key_bucket(const unsigned char *key, size_t len, size_t buckets);

#endif

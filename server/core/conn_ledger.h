/*
 * conn_ledger.h - the connections open on every listener, counted together.
 *
 * --max-connections caps the connections of the whole server and
 * --max-connections-per-ip those of one client address, whichever transport
 * they came in by: HTTP (libmicrohttpd) and gRPC both ask here before they take
 * a connection and tell here when it ends, so a client cannot double its
 * share by opening the other port.  An address is the IPv4 address, or the
 * whole IPv6 address (an IPv4-mapped one counts as IPv4), as libmicrohttpd's
 * own per-address cap counts them.
 */
#ifndef ATTN_CONN_LEDGER_H
#define ATTN_CONN_LEDGER_H

#include <sys/socket.h>

/* Sets the caps (max_total >= 1; max_per_address 0: none) and forgets every
 * connection.  Call before any listener starts. */
void conn_ledger_init(long max_total, long max_per_address);

/* 1 when a connection from addr may be taken now (both caps have room),
 * else 0.  NULL addr: the total cap only.  Thread-safe. */
int conn_ledger_admits(const struct sockaddr *addr);

/* Counts a connection from addr taken (after conn_ledger_admits, or by a
 * listener that checked its own way): returns 0, or -1 when it would pass a
 * cap, counting nothing then (check_caps 0: counted whatever the caps say,
 * for a connection already accepted).  Thread-safe. */
int conn_ledger_enter(const struct sockaddr *addr, int check_caps);

/* Counts the end of a connection that conn_ledger_enter counted. */
void conn_ledger_leave(const struct sockaddr *addr);

/* Connections open now, and those of addr. */
long conn_ledger_open(void);
long conn_ledger_open_from(const struct sockaddr *addr);

#endif

/*
 * budget_client.h - each client address's share of the memory budget.
 *
 * The process budget (budget.h) keeps all requests together within
 * --max-memory; this keeps one client from holding most of it.  Memory a
 * request's body needs is reserved through the client address that sends
 * it, and an address may hold at most --max-memory-share percent of the
 * budget at once, whatever number of connections it opens: a client that
 * announces large bodies and sends them slowly can pin its own share, never
 * the rest.  An IPv6 client is its /64, since one host commonly has the
 * whole prefix to pick addresses from.  The share covers bodies as they
 * arrive; computations reserve in the process budget only (admission.h),
 * as they are bounded by --max-inflight and run for bodies already paid for.
 */
#ifndef ATTN_BUDGET_CLIENT_H
#define ATTN_BUDGET_CLIENT_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct budget_client budget_client;

/* Sets each address's share to `percent` (1..100) of budget_limit(), and
 * forgets every client.  Call after budget_init, before any thread uses
 * this module. */
void budget_client_init(long percent);

/* The most one client may hold, in bytes (0: unlimited, as the budget). */
size_t budget_client_cap(void);

/* The record of the client at addr (NULL: unknown address, one record
 * shared by all such), made on first use; each call must be matched by a
 * budget_client_put.  Returns NULL when out of memory; every function below
 * accepts NULL and then applies the process budget alone.  Thread-safe. */
budget_client *budget_client_get(const struct sockaddr *addr);

/* Drops a reference taken by budget_client_get; the record goes when no
 * connection refers to it and it holds nothing.  NULL is fine. */
void budget_client_put(budget_client *c);

/* Reserves `bytes` for client c: in its share, then in the process budget.
 * Returns 0, or -1 when either is full (nothing is reserved then).
 * Thread-safe. */
int budget_client_reserve(budget_client *c, size_t bytes);

/* Gives back `bytes` that budget_client_reserve reserved for c. */
void budget_client_release(budget_client *c, size_t bytes);

/* Bytes client c holds now. */
size_t budget_client_held(const budget_client *c);

#endif

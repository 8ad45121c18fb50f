/*
 * budget.h - one memory budget for the whole process.
 *
 * Per-request limits (--max-body, --max-request-memory) bound one request;
 * this bounds all of them together.  Work that will hold memory reserves its
 * estimate here before it takes any (a body before it is read, a
 * computation before its buffers are allocated) and releases the same amount
 * when it is done.  A reservation that does not fit now is refused at once,
 * so the caller answers 503 with Retry-After instead of growing the process;
 * one larger than the whole budget can never fit, and is 413.
 *
 * The budget counts reservations, not the bytes malloc hands out: it is an
 * admission rule, cheap enough for every request (one atomic compare and
 * swap).  budget_default_limit says how large it is when not configured.
 */
#ifndef ATTN_BUDGET_H
#define ATTN_BUDGET_H

#include <stddef.h>

/* Sets the budget to `limit` bytes (0: unlimited) and forgets every
 * reservation.  Call before any thread reserves. */
void budget_init(size_t limit);

/* Reserves `bytes`.  Returns 0, or -1 when they do not fit beside what is
 * reserved now (nothing is reserved then).  Thread-safe. */
int budget_reserve(size_t bytes);

/* Gives back `bytes` reserved earlier.  Thread-safe. */
void budget_release(size_t bytes);

/* 1 when `bytes` could be reserved on an otherwise idle server (so that a
 * refusal is worth retrying), else 0. */
int budget_could_fit(size_t bytes);

/* The limit (0: unlimited). */
size_t budget_limit(void);

/* The memory this process may use: the limit of its cgroup (v2 memory.max,
 * or v1 memory.limit_in_bytes) when one is set, else the machine's physical
 * memory; 0 when neither can be read. */
size_t budget_memory_available(void);

/* The default budget: three quarters of budget_memory_available(), leaving
 * the rest for what the budget does not count (the program, the libraries'
 * buffers, stored weight sets, allocator slack); 0 (unlimited) when the
 * memory available is unknown. */
size_t budget_default_limit(void);

#endif

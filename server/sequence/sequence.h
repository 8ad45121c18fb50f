/*
 * sequence.h - the key/value caches the server holds for sequences (Triton's
 * sequence extension): a table of live sequences by id, each with its keys,
 * values and the attention each key has received so far, the limits on them,
 * and their expiry.
 *
 * A step of a sequence takes its turn (sequence_acquire), grows and fills the
 * cache past its length, and only once the step's computation worked makes
 * the new keys part of the sequence (sequence_commit): a step refused on the
 * way leaves the sequence as it was.  Steps of one sequence run one at a
 * time in the order they took their turn; other sequences run in parallel.
 * Knows the kernel's precisions and nothing of requests or wires
 * (request/sequence_step.h joins a request to its sequence).
 *
 * Functions returning int return 0, or a negative ERR_* code with err filled
 * (error.h).  All are thread-safe.
 */
#ifndef ATTN_SEQUENCE_H
#define ATTN_SEQUENCE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernel/attention.h"
#include "policy.h"

/* Longest string id, in bytes (Triton's sequence(string_id)). */
#define SEQUENCE_ID_MAX 128

/* A sequence's id: a number (1 ...) or a string; the number 7 and the string
 * "7" are two sequences. */
typedef struct sequence_id {
    int is_string;
    uint64_t number;
    char string[SEQUENCE_ID_MAX + 1];
} sequence_id;

/* What a sequence keeps fixed from its start. */
typedef struct sequence_shape {
    attn_dtype dtype;           /* float32 caches hold float, float64 double */
    size_t heads, dk, dv;       /* dk, dv: all heads together */
    int heads_axis;             /* the start named heads: the answers have a head axis */
    double scale;
    char model[WEIGHTS_NAME_MAX + 1]; /* the model it runs on: "attention" or a stored set */
    uint64_t generation;        /* the stored set's generation at the start; 0: none */
    sequence_policy policy;     /* what the cache keeps (policy.h) */
} sequence_shape;

typedef struct sequence_limits {
    size_t max_sequences;       /* live at once */
    double idle_timeout;        /* seconds without a step before a sequence is dropped */
    size_t max_keys;            /* keys one sequence may cache */
} sequence_limits;

typedef struct sequence sequence;

/* Sets the limits and empties the table.  Call before any other function. */
void sequence_init(const sequence_limits *limits);

/* Sequences live now. */
size_t sequence_live(void);

/* Drops every sequence (stopping the sweeper first). */
void sequence_shutdown(void);

/* Starts the thread that drops idle sequences (twice a timeout at the latest
 * after their last step, usually within a tenth of it).  Returns 0 or -1. */
int sequence_sweeper_start(void);

/* Drops every sequence idle since before now - idle_timeout (seconds on
 * compute_now's clock) that no step holds or waits for; returns how many.
 * The sweeper calls it; tests call it with a chosen clock. */
size_t sequence_sweep(double now);

/* Writes id as the words of a message: 7, or "seven" quoted. */
void sequence_id_words(const sequence_id *id, char *buf, size_t len);

/* Takes the turn of sequence id for one step and sets *out.  start: the
 * sequence is made (or, live, started over: emptied, shape replaced) with
 * `shape`; a new one past --max-sequences is 429 too_many_sequences.
 * Without start, an id the table does not hold (or one that ended or
 * expired while the step waited) is 400 sequence_unknown at id_field.
 * Waits while another step of the sequence holds it; never call it on a
 * thread that must not wait.  The caller ends the turn with
 * sequence_release, whatever happens. */
int sequence_acquire(const sequence_id *id, int start, const sequence_shape *shape,
                     const char *id_field, sequence **out, attn_error *err);

/* Ends the turn of s.  drop: the sequence is removed (its end, or a start
 * that failed); otherwise its idle clock starts now. */
void sequence_release(sequence *s, int drop);

const sequence_shape *sequence_shape_of(const sequence *s);

/* Keys cached (committed steps only; under a policy, those it kept). */
size_t sequence_length(const sequence *s);

/* Keys ever appended (committed steps only): the position the next one takes. */
int64_t sequence_appended(const sequence *s);

/* Under an evicting policy, the keys the full cache holds beside (with
 * compare_full: every key appended, by position), else 0. */
size_t sequence_full_length(const sequence *s);

/* SnapKV: the positions below which the keys chosen from the prompt stay
 * (policy.h); 0 before the prompt and under other policies. */
int64_t sequence_snap_boundary(const sequence *s);

/* Makes room for t keys past the length (and past the full cache's, when it
 * has one): 413 sequence_too_long past --max-sequence-keys; the growth
 * reserved in the memory budget (503 overloaded when it does not fit now,
 * 413 request_too_large when it never could).  The lengths are unchanged. */
int sequence_reserve(sequence *s, size_t t, attn_error *err);

/* The cache: keys length x dk and values length x dv, row-major, as float
 * (float32 sequences) or double; room for the keys sequence_reserve made
 * past the length.  Under a policy, row j of head h (its dk / heads
 * columns) is the key of position sequence_positions's [h][j]: each head
 * keeps its own keys.  Valid during the turn, until the next reserve. */
void *sequence_keys(sequence *s);
void *sequence_values(sequence *s);

/* The full cache beside (sequence_full_length), laid out as the cache and
 * with the same room; NULL without one. */
void *sequence_full_keys(sequence *s);
void *sequence_full_values(sequence *s);

/* The positions of the cached keys and of t keys past them (the step's, the
 * next positions) into out, [head][key], heads x (length + t). */
void sequence_positions(const sequence *s, size_t t, int64_t *out);

/* Makes t keys written past the length (and past the full cache's) part of
 * the sequence, adding each head's weights received (heads x (length + t),
 * [head][key], NULL: none) to the keys' running totals; then, keep non-NULL
 * ([head][key], as many kept in every head: policy.h), only the keys it
 * marks stay, in order. */
void sequence_commit(sequence *s, size_t t, const double *received, const unsigned char *keep);

/* The totals received by every key into out, [head][key], a head's row
 * every `stride` numbers (stride >= the length). */
void sequence_received_total(const sequence *s, double *out, size_t stride);

/* Bytes one cached key takes (its key, its value, its totals and, under an
 * evicting policy, its positions); and one key of the full cache beside. */
size_t sequence_key_bytes(const sequence_shape *shape);
size_t sequence_full_key_bytes(const sequence_shape *shape);

#endif

/*
 * sequence_step.h - one request as a step of a sequence (sequence/sequence.h):
 * what the request asks of its sequence, whatever wire it came on, the rules
 * of a step, the job pointed at the sequence's cache, and what the answer
 * adds (length, received_total).
 *
 * A decoder fills a sequence_ask (the id and flags, with their places in its
 * wire's terms), then the handler calls, in order:
 *   sequence_step_begin   after the request is described, before admission:
 *                         takes the sequence's turn (may wait) and shapes the
 *                         job over the whole cache;
 *   sequence_step_load    after the numbers are read: appends the request's
 *                         keys and values past the cache's length and points
 *                         the job at the cache;
 *   sequence_step_answer  after the computation worked: the answer's numbers
 *                         (length, received_total);
 *   sequence_step_commit  once the answer is made: the keys become part of
 *                         the sequence, the totals grow;
 *   sequence_step_finish  always: ends the turn.
 * A step that fails anywhere before its commit leaves the sequence as it was
 * (a failed start leaves no sequence).
 *
 * A start may choose a cache policy (sequence/policy.h) that trims the
 * cache after every step; the answer then says which positions stay and,
 * with compare_full, what the trim cost against a full cache kept beside.
 *
 * Inside a sequence, causal is on unless the request says false, aligned
 * bottom-right: of a step with m queries and n keys after it, query i sees
 * the keys j <= n - m + i (the queries are the sequence's last m positions),
 * which is the prefix plus the step's keys up to its own position when the
 * step brings as many keys as queries.
 *
 * Functions returning int return 0, or a negative ERR_* code with err filled.
 */
#ifndef ATTN_SEQUENCE_STEP_H
#define ATTN_SEQUENCE_STEP_H

#include <stddef.h>

#include "attention_request.h"
#include "core/error.h"
#include "core/scalar.h"
#include "sequence/sequence.h"

/* The parameters of a cache policy, as a start gives them (v2 parameters, members of
 * v1's "sequence"): cache_policy, cache_sink, cache_window, cache_budget, cache_recent,
 * cache_pool, compare_full. */
#define SEQUENCE_POLICY_PARAMS 7
extern const char *const sequence_policy_params[SEQUENCE_POLICY_PARAMS];

/* What a request asks of a sequence, and where the wire put each field
 * (v2: "parameters.sequence_id", "inputs[1].shape", ...; v1: "sequence.id",
 * "k", ...): the words of every refusal name them. */
typedef struct sequence_ask {
    int in_sequence;            /* a non-zero id was given */
    sequence_id id;
    int start, end;
    int causal_given;           /* the request set causal (else on, in a sequence) */
    int received_total;         /* the answer carries received_total */
    int received_asked;         /* the request asked for the received reduction itself */
    const char *id_field, *start_field, *end_field, *received_total_field;
    const char *heads_field, *scale_field, *dtype_field, *mask_field, *context_field;
    const char *q_field, *k_field, *v_field;
    sequence_policy policy;     /* a start's cache policy; sequence_ask_check fills defaults */
    unsigned policy_given;      /* bit i: sequence_policy_params[i] was given */
    const char *policy_prefix;  /* where the wire puts them: "parameters." or "sequence." */
} sequence_ask;

/* The model a step runs on, and what the request has beside its tokens. */
typedef struct sequence_model {
    const char *name;           /* ATTENTION_MODEL_BUILTIN, or the stored set's name */
    uint64_t generation;        /* the stored set's generation; 0 for the built-in model */
    int has_mask, has_context, inline_weights;
} sequence_model;

/* A step under way. */
typedef struct sequence_step {
    sequence *seq;              /* NULL: not in a sequence, or not taken yet */
    size_t before, added;       /* keys cached before the step; keys it brings */
    unsigned char *mask;        /* the bottom-right causal mask, when one is needed */
    const attn_weights *weights; /* a stored set's model: its weights (borrowed) */
    void *q;                    /* then the step's queries, projected (float or double) */
    double *output;             /* and its output through wo, when the set has one */
    float *output_f32;
    size_t rows;                /* the step's queries */
    int causal;                 /* the bottom-right causal rule holds */
    int received_from_matrix;   /* the weights received come from the matrix's columns */
    int attention_asked;        /* the request asked for the matrix itself */
    size_t mask_reserved;       /* its bytes in the memory budget */
    int committed;
    int64_t length;             /* the answer's length: keys after the step (and its trim) */
    double *received_total;     /* the answer's totals, heads x length, or NULL */
    int64_t *kept_positions;    /* under an evicting policy: the kept keys' positions,
                                 * heads x length, ascending in each head; else NULL */
    double *lost_mass;          /* with compare_full, heads x rows: the full cache's */
    double *output_error;       /* attention on the evicted keys, and the output's error */
    unsigned char *keep;        /* the trim the commit makes, heads x (before + added) */
    double *received;           /* the step's weights received, heads x length */
    int received_owned;         /* received is the step's to free (not the result's) */
} sequence_step;

/* Reads the id as a wire gave it (v NULL or absent: none) at field: a whole
 * number 1 .. 2^53 or a string of 1 .. SEQUENCE_ID_MAX bytes; 0 and "" are
 * no sequence, as Triton's clients send when none is asked.  400
 * "wrong_type" or "invalid_value" otherwise. */
int sequence_ask_id(sequence_ask *a, const scalar *v, const char *field, attn_error *err);

/* Reads the cache policy's parameter `key` given as v at a->policy_prefix + key into a
 * (cache_policy: a policy's name; compare_full: true or false; the sizes: whole numbers,
 * cache_sink and cache_recent from 0, the others from 1).  Returns 0, 400 "wrong_type" or
 * "invalid_value" naming it, or 1 when key names no policy parameter. */
int sequence_ask_policy(sequence_ask *a, const char *key, const scalar *v, attn_error *err);

/* While the server drains (draining non-zero), what a request of an attention route
 * gets: a step of a live sequence goes on (the drain waits for the sequences, up to
 * --shutdown-grace), anything else is refused, a sequence_start included: 503
 * "shutting_down" in err, returned; 0 to go on. */
int sequence_step_draining(const sequence_ask *a, int draining, attn_error *err);

/* The refusal of a mask input in a sequence (400 "conflicting_fields" at a->mask_field),
 * for a decoder that meets the mask before the step is shaped. */
int sequence_step_no_mask(const sequence_ask *a, attn_error *err);

/* Checks what the flags need once all are read: start or end needs an id
 * (400 "missing_field" at id_field), received_total needs a sequence (400
 * "conflicting_fields" at received_total_field); a policy's parameters need a
 * start, belong to the policy named (400 "conflicting_fields" naming one),
 * its required sizes are given (400 "missing_field") and agree (400
 * "invalid_value" at cache_budget, cache_pool); the defaults are filled. */
int sequence_ask_check(sequence_ask *a, attn_error *err);

/* Takes the turn of the sequence a asks for and shapes ar's job (described,
 * its numbers not read; with a stored set, bound to it) over the cache: the
 * rules of a step (one batch row; no mask input; with a stored set, x alone,
 * no context; no inline weights), the start's model, heads, widths,
 * precision and scale (400 "conflicting_fields" at their places), lk the
 * keys after the step, the causal rule, and the reductions' received (for
 * the totals) and query position.  Whether the request named heads decides,
 * at the start, the answers' head axis for the sequence's life.  Without a
 * sequence it does nothing.  May wait for the sequence's other steps.  The
 * caller checks the pool's window and top-k after it, against the keys after
 * the step (attention_request_check_pool, _check_reduce). */
int sequence_step_begin(attention_request *ar, const sequence_ask *a, const sequence_model *model,
                        sequence_step *st, attn_error *err);

/* Numbers the step adds to the answer (received_total, kept_positions, lost_mass,
 * output_error), for the limits; after sequence_step_begin. */
size_t sequence_step_extra_elements(const attention_request *ar, const sequence_ask *a,
                                    const sequence_step *st);

/* Appends the request's k and v (ar's arrays, as read; with a stored set, x
 * projected through wk and wv, and q through wq) past the cache's length,
 * growing it (the limits of sequence_reserve), builds the causal mask when
 * the rule needs one, and points the job at them (a job of q, k and v: the
 * output projection is sequence_step_answer's). */
int sequence_step_load(attention_request *ar, sequence_step *st, attn_error *err);

/* After the computation worked: with compare_full, runs the step's queries
 * over the full cache too (st->lost_mass, st->output_error); decides the
 * policy's trim (st->keep, st->kept_positions); with a stored set that has
 * wo, puts the output through it (result's output replaced); fills
 * st->length (the keys after the step and its trim) and, asked,
 * st->received_total (the totals with this step's weights, of the keys that
 * stay), and keeps the step's weights received for the commit, taking them
 * out of result unless the request asked for the received reduction itself. */
int sequence_step_answer(attention_request *ar, const sequence_ask *a, sequence_step *st,
                         attn_result *result, attn_error *err);

/* Once the answer is made: the step's keys become part of the sequence, its
 * weights are added to the totals, and the policy's trim is made. */
void sequence_step_commit(sequence_step *st);

/* Ends the turn (st may be empty): drops the sequence after its end, or
 * after a start that did not commit; frees what st holds. */
void sequence_step_finish(const sequence_ask *a, sequence_step *st);

#endif

/*
 * v1_private.h - what the files of the v1 module share, and nobody else
 * includes: the look-up of a stored set at a generation, which both the
 * weight-set resource (If-Match) and attention (weights_generation) make.
 */
#ifndef ATTN_V1_PRIVATE_H
#define ATTN_V1_PRIVATE_H

#include <stdint.h>

#include "core/error.h"
#include "store/store.h"

/* v1_sets.c: the set named name in store at generation want (0: any); when
 * this replica's copy is not that generation it reads the set's file in the
 * shared directory, and rescans only when the file holds what was asked
 * (store_sync_for_pin).  Returns a reference (the caller releases it), or
 * NULL with err filled, naming field: 404 when there is no such set (deleted,
 * or never stored), 412 when the set has moved past want or want was never
 * stored, 503 with *retry_after set only when the file holds want and this
 * replica has not loaded it yet. */
weight_set *v1_sets_get_generation(weight_store *store, const char *name, uint64_t want,
                                   const char *field, int *retry_after, attn_error *err);

#endif

/*
 * store_quarantine.c - stored sets that fail to load.
 *
 * A damaged set (truncated, altered, or with a name that is not a valid set
 * name) is skipped by the scan and reported once.  It is set aside by the
 * backend (quarantine/ of the directory, PREFIX/quarantine/ of the bucket)
 * only when a later scan finds the very same version (same identity,
 * file_sig) still damaged after limits.quarantine_after_ms: a file that
 * another server is about to replace is left alone, and a good version is
 * never quarantined because of a passing failure.
 */
#include "store_internal.h"

#include <stdio.h>
#include <string.h>

int store_quarantine_note(weight_store *store, suspect_list *found, const char *file,
                          const file_sig *sig, const char *why, int initial)
{
    int64_t now = store_monotonic_ms(), first = now;
    for (size_t i = 0; i < store->suspect_count; i++)
        if (!strcmp(store->suspects[i].file, file) && store_sig_equal(&store->suspects[i].sig, sig))
            first = store->suspects[i].first_ms;
    if (first == now)
        fprintf(stderr, "store: skipping %s/%s: %s (moved to quarantine/ if it stays so)\n",
                store->dir, file, why);
    if (!initial && now - first >= store->limits.quarantine_after_ms &&
        store->backend->set_aside(store, file, sig) == 0) {
        __atomic_add_fetch(&store->quarantined, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (store_grow((void **)&found->items, &found->cap, found->count, sizeof *found->items))
        return -1;
    suspect *s = &found->items[found->count++];
    snprintf(s->file, sizeof s->file, "%s", file);
    s->sig = *sig;
    s->first_ms = first;
    return 0;
}

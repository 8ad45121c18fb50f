/*
 * store_quarantine.c - set files that fail to load.
 *
 * A damaged file (truncated, altered, or with a name that is not a valid
 * set name) is skipped by the scan and reported once.  It is moved aside
 * into quarantine/ only when a later scan finds the very same file (same
 * identity, file_sig) still damaged after limits.quarantine_after_ms: a
 * file that another server is about to replace is left alone, and a good
 * file is never quarantined because of a passing failure.
 */
#include "store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Moves the damaged file aside into quarantine/ so it is kept for inspection
 * but never loaded again, provided it is still the version sig describes.
 * Another server may rename a good version into place at any moment: if the
 * file moved aside turns out not to be the damaged one, it is linked back
 * (link never replaces a newer file) and nothing is lost. */
static int quarantine(weight_store *store, const char *file, const file_sig *sig)
{
    char qdir[1100], from[1400], to[1500];
    snprintf(qdir, sizeof qdir, "%s/quarantine", store->dir);
    mkdir(qdir, 0755);
    snprintf(from, sizeof from, "%s/%s", store->dir, file);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(to, sizeof to, "%s/%s.%s.%lld%09ld", qdir, file, store->host, (long long)now.tv_sec,
             now.tv_nsec);
    struct stat st;
    file_sig moved;
    if (rename(from, to) != 0) {
        if (errno != ENOENT)
            fprintf(stderr, "store: could not move %s aside: %s\n", from, strerror(errno));
        return -1;
    }
    if (stat(to, &st) == 0 && (store_sig_of(&st, &moved), !store_sig_equal(&moved, sig))) {
        if (link(to, from) == 0 || errno == EEXIST)
            unlink(to);
        return -1;
    }
    fprintf(stderr, "store: %s stayed damaged: moved to %s\n", from, to);
    __atomic_add_fetch(&store->quarantined, 1, __ATOMIC_SEQ_CST);
    return 0;
}

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
        quarantine(store, file, sig) == 0)
        return 0;
    if (store_grow((void **)&found->items, &found->cap, found->count, sizeof *found->items))
        return -1;
    suspect *s = &found->items[found->count++];
    snprintf(s->file, sizeof s->file, "%s", file);
    s->sig = *sig;
    s->first_ms = first;
    return 0;
}

/*
 * test_store_backend.c - what the store does above its backend (store_backend in
 * store_internal.h), on a fake backend that keeps one object in memory and answers writes
 * as a store with conditional writes does: a write over a version that is no longer the
 * one in place is refused (STORE_CONFLICT), as a 412 refuses it.  The s3-store suite runs
 * the real object backend against Swift, which has no conditional writes, so these are
 * the tests of a put that loses the race to another server's write.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/test_hooks.h"
#include "store/store_internal.h"
#include "store_fixture.h"

/* The fake store's one object, and what the backend was asked. */
static struct {
    int exists;
    uint64_t generation;
    int version;            /* its ETag: a count of the writes that landed */
    int rival_writes;       /* writes of another server still to land first */
    int not_synced;         /* answer STORE_NOT_SYNCED to the next good write */
    int writes, heads;
} fake;

static int fake_list(weight_store *store,
                     int (*each)(weight_store *, void *, const store_entry *, attn_error *),
                     void *arg, file_sig *listing, int *settled, attn_error *err)
{
    (void)store, (void)each, (void)arg, (void)err;
    memset(listing, 0, sizeof *listing);
    *settled = 0;
    return 0;
}

static int fake_load(weight_store *store, const store_entry *e, const char *name,
                     store_loaded *out, char *why, size_t why_len, int *nomem, int *newer,
                     int *gone, attn_error *err)
{
    (void)store, (void)e, (void)name, (void)out, (void)why, (void)why_len, (void)err;
    *nomem = *newer = 0;
    *gone = 1;
    return -1;
}

static int fake_head(weight_store *store, const char *name, int with_generation,
                     store_version *v, attn_error *err)
{
    (void)store, (void)name, (void)with_generation, (void)err;
    fake.heads++;
    memset(v, 0, sizeof *v);
    v->exists = fake.exists;
    v->generation = fake.exists ? fake.generation : 0;
    snprintf(v->sig.etag, sizeof v->sig.etag, "%d", fake.version);
    return 0;
}

static int fake_write(weight_store *store, const weight_set *set, const store_version *over,
                      file_sig *sig, attn_error *err)
{
    (void)store;
    fake.writes++;
    /* If-Match / If-None-Match: only over the version in place */
    if (over->exists != fake.exists || atoi(over->sig.etag) != fake.version)
        return STORE_CONFLICT;
    if (fake.rival_writes > 0) {
        /* another server's write lands between our HEAD and our PUT */
        fake.rival_writes--;
        fake.exists = 1;
        fake.generation = set->generation + 5;
        fake.version++;
        return STORE_CONFLICT;
    }
    fake.exists = 1;
    fake.generation = set->generation;
    fake.version++;
    memset(sig, 0, sizeof *sig);
    snprintf(sig->etag, sizeof sig->etag, "%d", fake.version);
    if (fake.not_synced) {
        fake.not_synced = 0;
        error_set(err, ERR_INTERNAL, "internal", NULL, "written, not synced");
        return STORE_NOT_SYNCED;
    }
    return 0;
}

static int fake_remove(weight_store *store, const char *name, attn_error *err)
{
    (void)store, (void)name, (void)err;
    fake.exists = 0;
    fake.version++;
    return 0;
}

static int fake_set_aside(weight_store *store, const char *file, const file_sig *sig)
{
    (void)store, (void)file, (void)sig;
    return -1;
}

static void fake_close(weight_store *store)
{
    (void)store;
}

static const store_backend fake_backend = {
    .kind = "fake",
    .list = fake_list,
    .load = fake_load,
    .head = fake_head,
    .write = fake_write,
    .remove = fake_remove,
    .set_aside = fake_set_aside,
    .close = fake_close,
};

static const set_shape small = {3, 3, 2, 2, 2, 0};

/* A put that loses the race to other servers' writes reads the version in place again and
 * writes over it with a generation above theirs. */
void test_store_backend_put_after_conflicts(void)
{
    memset(&fake, 0, sizeof fake);
    attn_error err;
    weight_store *store = store_open_on_backend(&fake_backend, &roomy, &err);
    ASSERT(store != NULL);
    fake.rival_writes = 3;
    int created = -1;
    int rc = store_put(store, set_make("w", &small, 1, 0, 0), &created, &err);
    weight_set *got = store_get(store, "w");
    uint64_t generation = got != NULL ? got->generation : 0;
    weightset_release(got);
    store_close(store);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(fake.writes, 4);
    ASSERT_EQ(fake.heads, 4);
    ASSERT_EQ(created, 0);          /* a rival's version was there by the last HEAD */
    ASSERT(generation != 0 && generation == fake.generation);
    ASSERT_EQ(fake.version, 4);     /* three rivals' writes, then ours */
}

/* Past STORE_PUT_ATTEMPTS lost races the client is told to retry, and nothing changed. */
void test_store_backend_put_gives_up(void)
{
    memset(&fake, 0, sizeof fake);
    attn_error err;
    weight_store *store = store_open_on_backend(&fake_backend, &roomy, &err);
    ASSERT(store != NULL);
    fake.rival_writes = 1000;
    int rc = store_put(store, set_make("w", &small, 2, 0, 0), NULL, &err);
    weight_set *got = store_get(store, "w");
    weightset_release(got);
    size_t bytes = store_total_bytes(store);
    store_close(store);
    ASSERT_EQ(rc, ERR_UNAVAILABLE);
    ASSERT_STR_EQ(err.code, "store_busy");
    ASSERT_EQ(fake.writes, 8);
    ASSERT(got == NULL);
    ASSERT_EQ(bytes, 0);
}

/* A write the backend made but could not make durable: the error goes to the client, and
 * the table follows the store. */
void test_store_backend_put_not_synced(void)
{
    memset(&fake, 0, sizeof fake);
    attn_error err;
    weight_store *store = store_open_on_backend(&fake_backend, &roomy, &err);
    ASSERT(store != NULL);
    fake.not_synced = 1;
    int rc = store_put(store, set_make("w", &small, 3, 0, 0), NULL, &err);
    weight_set *got = store_get(store, "w");
    int held = got != NULL;
    weightset_release(got);
    store_info info;
    store_get_info(store, &info);
    int fake_kind = strcmp(info.backend, "fake") == 0 &&
                    strcmp(info.conditional_writes, "not_needed") == 0;
    store_close(store);
    ASSERT_EQ(rc, ERR_INTERNAL);
    ASSERT(held);
    ASSERT(fake_kind);
}

/*
 * store_s3.c - the object-store backend: each set is one object PREFIX/NAME.wset in a
 * bucket of an S3-compatible store, holding exactly the bytes of the directory backend's
 * file (header, arrays, checksum), with the generation also in the user metadata
 * attn-generation so that a HEAD tells it without a download.  A version's identity is
 * its ETag (and size).
 *
 * Writing: one PUT of the whole object, which S3 makes visible whole or not at all, so a
 * reader gets the old or the new version, never a mix.  Where the store has conditional
 * writes (AWS S3, recent MinIO) the PUT is made only over the version the table's put
 * read (If-Match: its ETag, or If-None-Match: * for a new name), and a 412 sends the put
 * back to read again (STORE_CONFLICT), so that concurrent PUTs of one name on several
 * replicas get increasing generations.  A store that answers 501 to the condition (Swift's
 * s3api) is said so once on stderr and in /v1/info, and from then on the last write wins,
 * as rename does on a shared directory.
 *
 * Reading: a listing (ListObjectsV2, one request per 1,000 sets) gives every object's
 * ETag, so an unchanged set costs nothing more; a changed one is fetched with If-Match
 * its listed ETag (a version replaced meanwhile is left to the next scan), several at a
 * time (s3b_list), checked whole by store_io_load from memory, and only then swapped in.
 * The object's bytes and the decoded arrays are both held while it loads.
 *
 * Quarantine: a damaged object is copied to PREFIX/quarantine/NAME.wset.HOST.TIME (the
 * copy is dropped again when its ETag shows another version was copied), and deleted if a
 * HEAD then still shows the damaged version.  S3 has no conditional DELETE: a good version written between that HEAD and
 * the DELETE would be lost, a window of one round trip that only a damaged object opens.
 */
#include "store_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"

/* Whether the store does conditional writes: not known until the first PUT. */
enum { COND_UNKNOWN = 0, COND_SUPPORTED = 1, COND_NOT_SUPPORTED = 2 };

struct store_s3 {
    s3_client *client;
    char prefix[520];       /* "PREFIX/", or "" for the bucket's top */
    int conditional;        /* COND_*, atomic */
};

int store_s3_open(weight_store *store, const s3_config *cfg, attn_error *err)
{
    store_s3 *s = mem_calloc(1, sizeof *s);
    if (s == NULL)
        return error_nomem(err);
    s->client = s3_open(cfg, err);
    if (s->client == NULL) {
        mem_free(s);
        return err->kind;
    }
    if (cfg->prefix[0] != '\0')
        snprintf(s->prefix, sizeof s->prefix, "%s/", cfg->prefix);
    snprintf(store->dir, sizeof store->dir, "s3://%s%s%s", cfg->bucket,
             cfg->prefix[0] ? "/" : "", cfg->prefix);
    store->s3 = s;
    return 0;
}

/* The key of file (NAME.wset, or a quarantine name) under the prefix. */
static void key_of(const weight_store *store, const char *file, char *out, size_t len)
{
    snprintf(out, len, "%s%s", store->s3->prefix, file);
}

/* An object's identity: its ETag without the quotes, and its size. */
static void sig_of(const char *etag, uint64_t size, file_sig *sig)
{
    memset(sig, 0, sizeof *sig);
    size_t n = strlen(etag);
    if (n >= 2 && etag[0] == '"' && etag[n - 1] == '"')
        snprintf(sig->etag, sizeof sig->etag, "%.*s", (int)(n - 2), etag + 1);
    else
        snprintf(sig->etag, sizeof sig->etag, "%s", etag);
    sig->size = (int64_t)size;
}

/* sig's ETag as the store wants it back in a condition: quoted. */
static void quoted_etag(const file_sig *sig, char *out, size_t len)
{
    snprintf(out, len, "\"%s\"", sig->etag);
}

/* A listing is read whole first (the keys, ETags and sizes: a few hundred bytes a set), and
 * the versions the scan will read (store_scan_wants) are then fetched PREFETCH_OBJECTS at a
 * time, each on a thread of its own, before the scan reads them in the listing's order: a
 * start-up with many sets waits for the store's round trips side by side rather than one
 * after another.
 * A batch stops at PREFETCH_BYTES, so that the bytes held at once stay bounded (a larger
 * object is fetched alone, as load would). */
#define PREFETCH_OBJECTS 8
#define PREFETCH_BYTES ((uint64_t)64 << 20)

typedef struct listed {
    char *file;             /* NAME.wset (owned) */
    file_sig sig;
} listed;

typedef struct list_ctx {
    weight_store *store;
    listed *items;
    size_t count, cap;
    int nomem;
} list_ctx;

static int list_object(void *arg, const s3_entry *o)
{
    list_ctx *l = arg;
    size_t plen = strlen(l->store->s3->prefix), n = strlen(o->key);
    const char *file = o->key + plen;
    if (n < plen + 6 || strcmp(o->key + n - 5, ".wset") != 0 || strchr(file, '/') != NULL)
        return 0;
    char *copy = mem_malloc(strlen(file) + 1);
    if (copy == NULL || store_grow((void **)&l->items, &l->cap, l->count, sizeof *l->items)) {
        mem_free(copy);
        l->nomem = 1;
        return ERR_UNAVAILABLE;
    }
    memcpy(copy, file, strlen(file) + 1);
    l->items[l->count].file = copy;
    sig_of(o->etag, o->size, &l->items[l->count].sig);
    l->count++;
    return 0;
}

/* One object of a batch, fetched on a thread of its own. */
typedef struct prefetch {
    weight_store *store;
    const listed *item;
    s3_body body;
    store_span span;
    int ok;
    pthread_t thread;
    int started;
} prefetch;

static void *prefetch_main(void *arg)
{
    prefetch *p = arg;
    char key[1200], etag[90];
    key_of(p->store, p->item->file, key, sizeof key);
    quoted_etag(&p->item->sig, etag, sizeof etag);
    s3_object obj;
    attn_error err;
    /* any failure is left to load, which asks again and reports it */
    p->ok = s3_get(p->store->s3->client, key, etag, p->store->limits.max_set_bytes, &p->body,
                   &obj, &err) == 0;
    p->span = (store_span){p->body.data, p->body.len};
    return NULL;
}

static int s3b_list(weight_store *store,
                    int (*each)(weight_store *, void *, const store_entry *, attn_error *),
                    void *arg, file_sig *listing, int *settled, attn_error *err)
{
    memset(listing, 0, sizeof *listing);
    *settled = 0;
    list_ctx l = {.store = store};
    int rc = s3_list(store->s3->client, store->s3->prefix, list_object, &l, NULL, err);
    if (rc != 0 && l.nomem)
        rc = error_nomem(err);
    prefetch batch[PREFETCH_OBJECTS];
    for (size_t at = 0; rc == 0 && at < l.count;) {
        /* the next batch: up to PREFETCH_OBJECTS versions the table lacks, within bytes */
        size_t end = at, n = 0;
        uint64_t bytes = 0;
        while (end < l.count && n < PREFETCH_OBJECTS) {
            const listed *it = &l.items[end];
            store_entry probe = {.file = it->file, .sig = it->sig, .fd = -1};
            int need = (uint64_t)it->sig.size <= store->limits.max_set_bytes &&
                       store_scan_wants(arg, &probe);
            if (need && n > 0 && bytes + (uint64_t)it->sig.size > PREFETCH_BYTES)
                break;
            if (need) {
                batch[n] = (prefetch){.store = store, .item = it};
                bytes += (uint64_t)it->sig.size;
                n++;
            }
            end++;
        }
        for (size_t k = 0; k < n; k++)
            batch[k].started = pthread_create(&batch[k].thread, NULL, prefetch_main,
                                              &batch[k]) == 0;
        for (size_t k = 0; k < n; k++)
            if (batch[k].started)
                pthread_join(batch[k].thread, NULL);
        for (size_t k = 0; rc == 0 && at < end; at++) {
            store_entry e = {.file = l.items[at].file, .sig = l.items[at].sig, .fd = -1};
            if (k < n && batch[k].item == &l.items[at]) {
                e.bytes = batch[k].ok ? &batch[k].span : NULL;
                k++;
            }
            rc = each(store, arg, &e, err);
        }
        for (size_t k = 0; k < n; k++)
            s3_body_free(&batch[k].body);
    }
    for (size_t i = 0; i < l.count; i++)
        mem_free(l.items[i].file);
    mem_free(l.items);
    return rc;
}

static int s3b_load(weight_store *store, const store_entry *e, const char *name,
                    store_loaded *out, char *why, size_t why_len, int *nomem, int *newer,
                    int *gone, attn_error *err)
{
    *nomem = *newer = *gone = 0;
    memset(out, 0, sizeof *out);
    if ((uint64_t)e->sig.size > store->limits.max_set_bytes) {
        /* this replica's limit, not damage: another may take it */
        *newer = 1;
        snprintf(why, why_len, "%lld bytes, more than --max-set-bytes (%zu) here",
                 (long long)e->sig.size, store->limits.max_set_bytes);
        return -1;
    }
    s3_body body = {0};
    store_span span;
    int rc;
    if (e->bytes != NULL) {
        span = *e->bytes;       /* prefetched by s3b_list */
    } else {
        char key[1200], etag[90];
        key_of(store, e->file, key, sizeof key);
        quoted_etag(&e->sig, etag, sizeof etag);
        s3_object obj;
        rc = s3_get(store->s3->client, key, etag, store->limits.max_set_bytes, &body, &obj, err);
        if (rc == S3_MISSING || rc == S3_CONFLICT) {
            *gone = 1;
            return -1;
        }
        if (rc != 0)
            return STORE_LOAD_FAILED; /* the store, not the set: never quarantined for it */
        span = (store_span){body.data, body.len};
    }
    store_source src;
    store_source_mem(&span, &src);
    rc = store_io_load(&src, name, out, why, why_len, nomem, newer);
    s3_body_free(&body);
    if (rc != 0)
        return -1;
    out->sig = e->sig;
    return 0;
}

/* The generation in the header of key's object, by a ranged GET of its first bytes: for
 * an object written without the metadata (by another tool).  0 with *generation 0 when
 * there is none, or an ERR_* code with err filled when the store failed. */
static int header_generation(weight_store *store, const char *key, uint64_t *generation,
                             attn_error *err)
{
    s3_body body = {0};
    s3_object obj;
    int rc = s3_get_range(store->s3->client, key, STORE_FORMAT_HEAD_MAX, &body, &obj, err);
    *generation = rc == 0 ? store_format_generation(body.data, body.len) : 0;
    s3_body_free(&body);
    return rc < 0 ? rc : 0;   /* gone meanwhile: no generation */
}

static int s3b_head(weight_store *store, const char *name, int with_generation, store_version *v,
                    attn_error *err)
{
    char file[WEIGHTS_NAME_MAX + 8], key[1200];
    snprintf(file, sizeof file, "%s.wset", name);
    key_of(store, file, key, sizeof key);
    memset(v, 0, sizeof *v);
    s3_object obj;
    int rc = s3_head(store->s3->client, key, &obj, err);
    if (rc == S3_MISSING)
        return 0;
    if (rc != 0)
        return rc;
    v->exists = 1;
    sig_of(obj.etag, obj.size, &v->sig);
    v->generation = obj.generation;
    if (with_generation && obj.generation == 0)
        return header_generation(store, key, &v->generation, err);
    return 0;
}

static int s3b_write(weight_store *store, const weight_set *set, const store_version *over,
                     file_sig *sig, attn_error *err)
{
    store_encoding enc;
    if (store_format_encode(set, &enc) != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL,
                         "The weight set could not be encoded. Nothing was changed.");
    unsigned char tail[STORE_CHECKSUM_BYTES];
    store_format_put_checksum(tail, store_format_checksum_runs(enc.runs, enc.count));
    s3_piece pieces[WEIGHTS_COUNT + 2];
    for (size_t i = 0; i < enc.count; i++)
        pieces[i] = (s3_piece){enc.runs[i].data, enc.runs[i].len};
    pieces[enc.count] = (s3_piece){tail, sizeof tail};
    char file[WEIGHTS_NAME_MAX + 8], key[1200], etag[90];
    snprintf(file, sizeof file, "%s.wset", set->name);
    key_of(store, file, key, sizeof key);
    int known = __atomic_load_n(&store->s3->conditional, __ATOMIC_SEQ_CST);
    s3_condition cond = known == COND_NOT_SUPPORTED ? S3_ANY
                        : over->exists             ? S3_IF_MATCH
                                                   : S3_IF_ABSENT;
    quoted_etag(&over->sig, etag, sizeof etag);
    s3_object obj;
    int rc = s3_put(store->s3->client, key, pieces, enc.count + 1, set->generation, cond, etag,
                    &obj, err);
    if (rc == S3_UNSUPPORTED && cond != S3_ANY) {
        int expected = COND_UNKNOWN;
        if (__atomic_compare_exchange_n(&store->s3->conditional, &expected, COND_NOT_SUPPORTED,
                                        0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            fprintf(stderr, "store: the object store %s does not do conditional writes (501): "
                            "the last write of a name wins\n", s3_where(store->s3->client));
        __atomic_store_n(&store->s3->conditional, COND_NOT_SUPPORTED, __ATOMIC_SEQ_CST);
        cond = S3_ANY;
        rc = s3_put(store->s3->client, key, pieces, enc.count + 1, set->generation, cond, NULL,
                    &obj, err);
    }
    if (rc == S3_CONFLICT && cond != S3_ANY) {
        __atomic_store_n(&store->s3->conditional, COND_SUPPORTED, __ATOMIC_SEQ_CST);
        return STORE_CONFLICT;
    }
    if (rc != 0)
        return rc < 0 ? rc
                      : error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                                  "The object store %s refused the PUT of %s.",
                                  s3_where(store->s3->client), key);
    if (cond != S3_ANY)
        __atomic_store_n(&store->s3->conditional, COND_SUPPORTED, __ATOMIC_SEQ_CST);
    sig_of(obj.etag, obj.size, sig);
    return 0;
}

static int s3b_remove(weight_store *store, const char *name, attn_error *err)
{
    char file[WEIGHTS_NAME_MAX + 8], key[1200];
    snprintf(file, sizeof file, "%s.wset", name);
    key_of(store, file, key, sizeof key);
    int rc = s3_delete(store->s3->client, key, err);
    if (rc > 0)
        return error_set(err, ERR_UNAVAILABLE, "store_unreachable", NULL,
                         "The object store %s refused the DELETE of %s.",
                         s3_where(store->s3->client), key);
    return rc;
}

static int s3b_set_aside(weight_store *store, const char *file, const file_sig *sig)
{
    char from[1200], to[1300], aside[600];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    key_of(store, file, from, sizeof from);
    snprintf(aside, sizeof aside, "quarantine/%s.%s.%lld%09ld", file, store->host,
             (long long)now.tv_sec, now.tv_nsec);
    key_of(store, aside, to, sizeof to);
    attn_error err;
    s3_object obj;
    file_sig copied, still;
    int rc = s3_copy(store->s3->client, from, to, &obj, &err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "store: could not copy %s aside: %s\n", from, err.message);
        return -1;
    }
    sig_of(obj.etag, obj.size, &copied);
    if (!store_sig_equal(&copied, sig)) {
        /* another version came in before the copy: it is not the damaged one */
        s3_delete(store->s3->client, to, &err);
        return -1;
    }
    if (s3_head(store->s3->client, from, &obj, &err) != 0)
        return -1;
    sig_of(obj.etag, obj.size, &still);
    if (!store_sig_equal(&still, sig) || s3_delete(store->s3->client, from, &err) != 0)
        return -1;
    fprintf(stderr, "store: %s/%s stayed damaged: moved to %s\n", store->dir, file, to);
    return 0;
}

static const char *s3b_conditional_writes(weight_store *store)
{
    switch (__atomic_load_n(&store->s3->conditional, __ATOMIC_SEQ_CST)) {
    case COND_SUPPORTED:
        return "supported";
    case COND_NOT_SUPPORTED:
        return "not_supported";
    default:
        return "unknown";
    }
}

static void s3b_close(weight_store *store)
{
    if (store->s3 == NULL)
        return;
    s3_close(store->s3->client);
    mem_free(store->s3);
    store->s3 = NULL;
}

const store_backend store_s3_backend = {
    .kind = "s3",
    .recheck_before_apply = 0,
    .list = s3b_list,
    .unchanged = NULL,
    .load = s3b_load,
    .head = s3b_head,
    .write = s3b_write,
    .remove = s3b_remove,
    .set_aside = s3b_set_aside,
    .conditional_writes = s3b_conditional_writes,
    .close = s3b_close,
};

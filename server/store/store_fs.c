/*
 * store_fs.c - the directory backend: each set is one file NAME.wset in the data
 * directory, written by store_io.c's durable steps (temporary file, fsync, rename, fsync of
 * the directory), so that after a crash a set is either wholly there or not at all.
 *
 * Listing opens every set file before looking at it: opening makes an NFS client
 * revalidate what it cached (close-to-open), and the open file is what load then reads, so
 * the identity compared and the bytes loaded are the same version.
 *
 * The listing's identity is the directory's own (device, inode, size, mtime in nanoseconds,
 * from an fstat of the opened directory), taken before the entries are read: adding,
 * renaming or removing an entry, which is how every server publishes and deletes a set,
 * changes the directory's mtime, so the background sync reads no entry while it is the
 * same (store_sync.c).  It is trusted only once its mtime is STORE_DIR_SETTLE_MS older than
 * this host's clock: a change made within the same timestamp tick as an earlier one (coarse
 * file-system clocks, another replica's write landing just after our look) leaves the mtime
 * as it was.  The margin also absorbs a small skew between this clock and a file server's.
 * inotify is not used: it does not see other NFS clients' writes, which is the case that
 * matters.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How old the directory's mtime must be before its identity is trusted to
 * change with the next entry (see the top of the file). */
#define STORE_DIR_SETTLE_MS 2000

int store_fs_open(weight_store *store, const char *dir, attn_error *err)
{
    if (strlen(dir) == 0 || strlen(dir) >= 1000)
        return error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                         "The data directory must be a path of 1 to 999 characters.");
    if (store_io_make_dirs(dir) != 0)
        return error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                         "Cannot create the data directory %s: %s.", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (d == NULL)
        return error_set(err, ERR_INTERNAL, "bad_data_dir", "data-dir",
                         "Cannot read the data directory %s: %s.", dir, strerror(errno));
    closedir(d);
    snprintf(store->dir, sizeof store->dir, "%s", dir);
    store_io_clean_temporaries(store);
    return 0;
}

/* Fills err for a data directory that cannot be read (errnum) and returns
 * its kind: the one wording of store_unreachable. */
static int dir_unreachable(const weight_store *store, int errnum, attn_error *err)
{
    return error_set(err, ERR_INTERNAL, "store_unreachable", NULL,
                     "Cannot read the data directory %s: %s.", store->dir, strerror(errnum));
}

/* Opens the data directory and fills *sig with its identity.  Returns the
 * descriptor, or -1 with err filled ("store_unreachable"). */
static int open_directory(weight_store *store, file_sig *sig, attn_error *err)
{
    /* Opening first makes an NFS client revalidate what it cached, as for
     * the files. */
    int fd = open(store->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        store_sig_of(&st, sig);
        return fd;
    }
    int saved = errno;
    if (fd >= 0)
        close(fd);
    dir_unreachable(store, saved, err);
    return -1;
}

/* Whether a directory identity can be trusted to change with the next
 * entry: its mtime is STORE_DIR_SETTLE_MS behind the clock (not ahead). */
static int dir_sig_settled(const file_sig *sig)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    return now_ns - sig->mtime_ns > (int64_t)STORE_DIR_SETTLE_MS * 1000000;
}

/* One directory entry NAME.wset: opened, its identity read, handed to each. */
static int list_file(weight_store *store, const char *file,
                     int (*each)(weight_store *, void *, const store_entry *, attn_error *),
                     void *arg, attn_error *err)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", store->dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    store_entry e = {.file = file, .fd = fd};
    if (fd < 0 || fstat(fd, &st) != 0) {
        int saved = errno;
        if (fd >= 0)
            close(fd);
        if (saved == ENOENT)
            return 0; /* gone since the listing: a delete, not damage */
        fprintf(stderr, "store: cannot read %s: %s\n", path, strerror(saved));
        e.fd = -1;
        e.unreadable = 1;
        return each(store, arg, &e, err);
    }
    store_sig_of(&st, &e.sig);
    int rc = each(store, arg, &e, err);
    close(fd);
    return rc;
}

static int fs_list(weight_store *store,
                   int (*each)(weight_store *, void *, const store_entry *, attn_error *),
                   void *arg, file_sig *listing, int *settled, attn_error *err)
{
    int fd = open_directory(store, listing, err);
    if (fd < 0)
        return err->kind;
    *settled = dir_sig_settled(listing);
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        int saved = errno;
        close(fd);
        return dir_unreachable(store, saved, err);
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".wset") == 0)
            rc = list_file(store, e->d_name, each, arg, err);
    }
    closedir(d);
    return rc;
}

static int fs_unchanged(weight_store *store, const file_sig *listing, attn_error *err)
{
    file_sig now;
    int fd = open_directory(store, &now, err);
    if (fd < 0)
        return err->kind;
    close(fd);
    return store_sig_equal(&now, listing);
}

static int fs_load(weight_store *store, const store_entry *e, const char *name,
                   store_loaded *out, char *why, size_t why_len, int *nomem, int *newer, int *gone,
                   attn_error *err)
{
    (void)store;
    (void)err;  /* a file open on a descriptor either reads or is damaged */
    *gone = 0;
    int fd = e->fd;
    store_source src;
    if (store_source_fd(&fd, &src) != 0) {
        *nomem = *newer = 0;
        memset(out, 0, sizeof *out);
        snprintf(why, why_len, "shorter than a header (truncated)");
        return -1;
    }
    if (store_io_load(&src, name, out, why, why_len, nomem, newer) != 0)
        return -1;
    out->sig = e->sig;
    return 0;
}

static int fs_head(weight_store *store, const char *name, int with_generation, store_version *v,
                   attn_error *err)
{
    char path[1400];
    store_path_of(store, name, path, sizeof path);
    struct stat st;
    memset(v, 0, sizeof *v);
    if (stat(path, &st) == 0) {
        v->exists = 1;
        store_sig_of(&st, &v->sig);
    } else if (errno != ENOENT) {
        return error_set(err, ERR_INTERNAL, "store_unreachable", NULL, "Cannot read %s: %s.",
                         path, strerror(errno));
    }
    if (with_generation)
        v->generation = store_io_generation(path);
    return 0;
}

static int fs_write(weight_store *store, const weight_set *set, const store_version *over,
                    file_sig *sig, attn_error *err)
{
    (void)over;   /* rename replaces whatever is there: the last write wins */
    char final[1400];
    store_path_of(store, set->name, final, sizeof final);
    if (store_io_write_set(store, set, final, sig) != 0) {
        /* A full disk or quota is the operator's to fix, not a fault of the
         * server: its own code and status (507), so that a client or a
         * balancer can tell it from a bug. */
        int full = errno == ENOSPC || errno == EDQUOT;
        return error_set(err, full ? ERR_NO_SPACE : ERR_INTERNAL,
                         full ? "insufficient_storage" : "internal", NULL,
                         "The weight set could not be stored: %s. Nothing was changed.",
                         strerror(errno));
    }
    if (store_io_fsync_dir(store->dir) != 0) {
        /* The new file is in place but the rename may not survive a crash:
         * report failure so the client retries; the in-memory table follows
         * the file, which is what a restart would most likely see. */
        error_set(err, ERR_INTERNAL, "internal", NULL,
                  "The weight set was written but the directory could not be synced (%s); "
                  "retry the upload.", strerror(errno));
        return STORE_NOT_SYNCED;
    }
    return 0;
}

static int fs_remove(weight_store *store, const char *name, attn_error *err)
{
    char path[1400];
    store_path_of(store, name, path, sizeof path);
    if (store_io_unlink(path) != 0)
        return error_set(err, ERR_INTERNAL, "internal", NULL,
                         "The weight set could not be deleted: %s. Nothing was changed.",
                         strerror(errno));
    if (store_io_fsync_dir(store->dir) != 0) {
        /* The file is gone; as in store_put, the table follows the file. */
        error_set(err, ERR_INTERNAL, "internal", NULL,
                  "The weight set was deleted but the directory could not be synced (%s).",
                  strerror(errno));
        return STORE_NOT_SYNCED;
    }
    return 0;
}

/* Moves the damaged file aside into quarantine/ so it is kept for inspection
 * but never loaded again, provided it is still the version sig describes.
 * Another server may rename a good version into place at any moment: if the
 * file moved aside turns out not to be the damaged one, it is linked back
 * (link never replaces a newer file) and nothing is lost. */
static int fs_set_aside(weight_store *store, const char *file, const file_sig *sig)
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
    return 0;
}

static void fs_close(weight_store *store)
{
    (void)store;
}

const store_backend store_fs_backend = {
    .kind = "directory",
    .recheck_before_apply = 1,
    .list = fs_list,
    .unchanged = fs_unchanged,
    .load = fs_load,
    .head = fs_head,
    .write = fs_write,
    .remove = fs_remove,
    .set_aside = fs_set_aside,
    .conditional_writes = NULL,
    .close = fs_close,
};

/*
 * bench_store_load.c - loading a large weight set: the store's binary file
 * against the same set as JSON.
 *
 * One weight set with a 4096 x 4096 wq (128 MiB of doubles) and small wk/wv
 * (8 x 4096 and 8 x 64: a cross-attention set with a narrow context) is
 * written twice: by store_put, in the store's binary format, and as a JSON
 * object {"wq","wk","wv"} with every double printed with 17 significant
 * digits.  Then each is loaded several times, as the server would:
 *   binary: store_open on a directory holding only that file (header checks,
 *           read, checksum), then store_get;
 *   JSON:   json_load_file (jansson, allocating through mem_* as the server
 *           does), weights_json_decode_set (shape checks, conversion to
 *           in_out double arrays), json_decref.
 * Every load is checked to give back the original doubles bit for bit.
 * Both files were just written, so both loads read from the page cache: the
 * comparison is of parsing and checking work, not of the disk.
 *
 * Usage: bench-store-load [--n N] [--dir DIR] [--out FILE] [--reps-bin R]
 *        [--reps-json R] [--keep]
 * Prints a table; --out also writes it as TSV for tests/bench/run.sh.  Exit status
 * 0, or 1 when a load fails or gives back different numbers.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "kernel/attention.h"
#include "core/error.h"
#include "core/mem.h"
#include "request/weights_json.h"
#include "store/store.h"

#define SET_NAME "big"
#define CTX_ROWS 8
#define DV 64
#define MAX_REPS 50

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

/* Uniform doubles in [-1, 1) with all 53 bits random, so that printing them
 * takes the full 17 digits. */
static double rnd(void)
{
    return bench_uniform(&rng_state) * 2.0 - 1.0;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], compare_doubles);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double *random_matrix(size_t n)
{
    double *a = mem_malloc(n * sizeof(double));
    if (a == NULL) {
        fprintf(stderr, "bench-store-load: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        a[i] = rnd();
    return a;
}

static double *copy_of(const double *a, size_t n)
{
    double *c = malloc(n * sizeof(double));
    if (c == NULL) {
        fprintf(stderr, "bench-store-load: out of memory\n");
        exit(1);
    }
    memcpy(c, a, n * sizeof(double));
    return c;
}

/* Returns 1 when w holds exactly the dimensions and bits of the originals. */
static int same_weights(const attn_weights *w, const attn_weights *orig)
{
    if (w->d_in != orig->d_in || w->d_ctx != orig->d_ctx || w->dk != orig->dk ||
        w->dv != orig->dv || w->d_out != orig->d_out || w->wo != NULL || w->bq != NULL ||
        w->bk != NULL || w->bv != NULL || w->bo != NULL)
        return 0;
    return memcmp(w->wq, orig->wq, w->d_in * w->dk * sizeof(double)) == 0 &&
           memcmp(w->wk, orig->wk, w->d_ctx * w->dk * sizeof(double)) == 0 &&
           memcmp(w->wv, orig->wv, w->d_ctx * w->dv * sizeof(double)) == 0;
}

static void json_write_matrix(FILE *f, const double *a, size_t rows, size_t cols)
{
    fputc('[', f);
    for (size_t r = 0; r < rows; r++) {
        fputs(r ? ",\n[" : "\n[", f);
        for (size_t c = 0; c < cols; c++)
            fprintf(f, c ? ",%.17g" : "%.17g", a[r * cols + c]);
        fputc(']', f);
    }
    fputc(']', f);
}

/* Writes w as a weight-set JSON body (in_out layout).  Returns 0 or -1. */
static int json_write_set(const char *path, const attn_weights *w)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    static char buffer[1 << 20];
    setvbuf(f, buffer, _IOFBF, sizeof buffer);
    fputs("{\"wq\":", f);
    json_write_matrix(f, w->wq, w->d_in, w->dk);
    fputs(",\n\"wk\":", f);
    json_write_matrix(f, w->wk, w->d_ctx, w->dk);
    fputs(",\n\"wv\":", f);
    json_write_matrix(f, w->wv, w->d_ctx, w->dv);
    fputs("}\n", f);
    int failed = ferror(f);
    return (fclose(f) != 0 || failed) ? -1 : 0;
}

static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* store_open reports every load on stderr; these hide it while timing. */
static int saved_stderr = -1;

static void stderr_off(void)
{
    fflush(stderr);
    saved_stderr = dup(2);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
        dup2(null, 2);
        close(null);
    }
}

static void stderr_on(void)
{
    fflush(stderr);
    if (saved_stderr >= 0) {
        dup2(saved_stderr, 2);
        close(saved_stderr);
        saved_stderr = -1;
    }
}

static int parse_count(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: bench-store-load [--n N] [--dir DIR] [--out FILE] [--reps-bin R] "
                 "[--reps-json R] [--keep]\n"
                 "  --n N          wq is N x N (default 4096)\n"
                 "  --dir DIR      scratch directory (default build/bench/store-load)\n"
                 "  --out FILE     also write the results as TSV\n"
                 "  --reps-bin R   binary loads to time (default 7)\n"
                 "  --reps-json R  JSON loads to time (default 3)\n"
                 "  --keep         leave the files in DIR\n");
}

int main(int argc, char **argv)
{
    long n = 4096, reps_bin = 7, reps_json = 3;
    const char *dir = "build/bench/store-load", *out_path = NULL;
    int keep = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--n") == 0 && val)
            bad = parse_count(argv[++i], 1, 1 << 16, &n);
        else if (strcmp(a, "--reps-bin") == 0 && val)
            bad = parse_count(argv[++i], 1, MAX_REPS, &reps_bin);
        else if (strcmp(a, "--reps-json") == 0 && val)
            bad = parse_count(argv[++i], 1, MAX_REPS, &reps_json);
        else if (strcmp(a, "--dir") == 0 && val)
            dir = argv[++i];
        else if (strcmp(a, "--out") == 0 && val)
            out_path = argv[++i];
        else if (strcmp(a, "--keep") == 0)
            keep = 1;
        else if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else
            bad = 1;
        if (bad) {
            usage(stderr);
            return 2;
        }
    }
    mem_install_jansson();

    char store_dir[1100], json_path[1100], wset_path[1200];
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    snprintf(json_path, sizeof json_path, "%s/%s.json", dir, SET_NAME);
    snprintf(wset_path, sizeof wset_path, "%s/%s.wset", store_dir, SET_NAME);
    mkdir(dir, 0755);
    mkdir(store_dir, 0755);

    /* The set, and untouched copies of its arrays to check loads against. */
    attn_weights w = {.d_in = (size_t)n, .d_ctx = CTX_ROWS, .dk = (size_t)n, .dv = DV,
                      .d_out = DV};
    w.wq = random_matrix(w.d_in * w.dk);
    w.wk = random_matrix(w.d_ctx * w.dk);
    w.wv = random_matrix(w.d_ctx * w.dv);
    attn_weights orig = w;
    orig.wq = copy_of(w.wq, w.d_in * w.dk);
    orig.wk = copy_of(w.wk, w.d_ctx * w.dk);
    orig.wv = copy_of(w.wv, w.d_ctx * w.dv);
    size_t numbers = w.d_in * w.dk + w.d_ctx * (w.dk + w.dv);

    /* Write both files (timed once, for information). */
    attn_error err;
    store_limits limits = {SIZE_MAX / 2, SIZE_MAX / 2, 0, 0};
    stderr_off();
    weight_store *store = store_open(store_dir, &limits, &err);
    stderr_on();
    if (store == NULL) {
        fprintf(stderr, "bench-store-load: %s\n", err.message);
        return 1;
    }
    double t0 = now_s();
    if (json_write_set(json_path, &w) != 0) {
        fprintf(stderr, "bench-store-load: cannot write %s: %s\n", json_path, strerror(errno));
        return 1;
    }
    double json_write_ms = (now_s() - t0) * 1e3;
    weight_set *set = weightset_new(SET_NAME, &w, 0, 0);
    int created;
    t0 = now_s();
    if (set == NULL || store_put(store, set, &created, &err) != 0) {
        fprintf(stderr, "bench-store-load: store_put failed: %s\n", set ? err.message : "no memory");
        return 1;
    }
    double bin_write_ms = (now_s() - t0) * 1e3;
    store_close(store);
    long long bin_size = file_size(wset_path), json_size = file_size(json_path);
    printf("weight set: wq %zu x %zu, wk %d x %zu, wv %d x %d: %zu doubles (%.1f MiB in memory)\n",
           orig.d_in, orig.dk, CTX_ROWS, orig.dk, CTX_ROWS, DV, numbers,
           (double)numbers * 8 / (1 << 20));
    printf("written: binary %lld bytes in %.0f ms (store_put, with fsync); "
           "JSON %lld bytes in %.0f ms (fprintf %%.17g, no fsync)\n",
           bin_size, bin_write_ms, json_size, json_write_ms);
    fflush(stdout);

    int failures = 0;
    double bin_ms[MAX_REPS];
    for (long r = 0; r < reps_bin; r++) {
        stderr_off();
        t0 = now_s();
        store = store_open(store_dir, &limits, &err);
        weight_set *got = store ? store_get(store, SET_NAME) : NULL;
        bin_ms[r] = (now_s() - t0) * 1e3;
        stderr_on();
        if (got == NULL || !same_weights(&got->w, &orig)) {
            fprintf(stderr, "bench-store-load: binary load %ld %s\n", r,
                    got ? "gave back different numbers" : "failed");
            failures++;
        }
        weightset_release(got);
        store_close(store);
    }

    double parse_ms[MAX_REPS], convert_ms[MAX_REPS], free_ms[MAX_REPS], json_ms[MAX_REPS];
    for (long r = 0; r < reps_json; r++) {
        json_error_t jerr;
        attn_weights got;
        size_t heads;
        int out_in;
        t0 = now_s();
        json_t *root = json_load_file(json_path, 0, &jerr);
        double t1 = now_s();
        int rc = root ? weights_json_decode_set(root, SIZE_MAX, &got, &heads, &out_in, &err)
                      : -1;
        double t2 = now_s();
        json_decref(root);
        double t3 = now_s();
        parse_ms[r] = (t1 - t0) * 1e3;
        convert_ms[r] = (t2 - t1) * 1e3;
        free_ms[r] = (t3 - t2) * 1e3;
        json_ms[r] = (t3 - t0) * 1e3;
        if (root == NULL || rc != 0) {
            fprintf(stderr, "bench-store-load: JSON load %ld failed: %s\n", r,
                    root ? err.message : jerr.text);
            failures++;
            continue;
        }
        if (!same_weights(&got, &orig) || heads != 0 || out_in != 0) {
            fprintf(stderr, "bench-store-load: JSON load %ld gave back different numbers\n", r);
            failures++;
        }
        weights_free(&got);
    }

    double bin_med = median(bin_ms, (int)reps_bin), json_med = median(json_ms, (int)reps_json);
    double parse_med = median(parse_ms, (int)reps_json);
    double convert_med = median(convert_ms, (int)reps_json);
    double free_med = median(free_ms, (int)reps_json);
    const char *identical = failures ? "NO" : "yes";
    printf("%-46s %14s %5s %11s %10s\n", "load", "bytes on disk", "runs", "median ms",
           "identical");
    printf("%-46s %14lld %5ld %11.1f %10s\n", "binary .wset (store_open + store_get)", bin_size,
           reps_bin, bin_med, identical);
    printf("%-46s %14lld %5ld %11.1f %10s\n", "JSON %.17g (parse + convert + free)", json_size,
           reps_json, json_med, identical);
    printf("%-46s %14s %5s %11.1f\n", "  of which json_load_file", "", "", parse_med);
    printf("%-46s %14s %5s %11.1f\n", "  of which weights_json_decode_set", "", "",
           convert_med);
    printf("%-46s %14s %5s %11.1f\n", "  of which json_decref", "", "", free_med);
    printf("JSON / binary: %.1fx the bytes, %.1fx the load time\n",
           (double)json_size / (double)bin_size, json_med / bin_med);

    if (out_path != NULL) {
        FILE *f = fopen(out_path, "w");
        if (f == NULL) {
            fprintf(stderr, "bench-store-load: cannot write %s\n", out_path);
            failures++;
        } else {
            fprintf(f, "format\tbytes\treps\tmedian_ms\tparse_ms\tconvert_ms\tfree_ms\t"
                       "identical\tshape\n");
            fprintf(f, "binary\t%lld\t%ld\t%.3f\t-\t-\t-\t%s\twq %zux%zu\n", bin_size, reps_bin,
                    bin_med, identical, orig.d_in, orig.dk);
            fprintf(f, "json\t%lld\t%ld\t%.3f\t%.3f\t%.3f\t%.3f\t%s\twq %zux%zu\n", json_size,
                    reps_json, json_med, parse_med, convert_med, free_med, identical, orig.d_in,
                    orig.dk);
            if (fclose(f) != 0)
                failures++;
        }
    }
    if (!keep) {
        unlink(wset_path);
        unlink(json_path);
        rmdir(store_dir);
        rmdir(dir);
    }
    free(orig.wq);
    free(orig.wk);
    free(orig.wv);
    return failures != 0;
}

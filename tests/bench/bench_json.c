/*
 * bench_json.c - writing a 512 x 512 attention matrix as JSON: server/jsonw
 * against jansson, in nanoseconds per number.
 *
 * The matrix holds softmax rows (positive, summing to 1, most digits
 * significant), as an attention answer does.  Timed, each as the median of
 * repeated runs after one warm-up run:
 *   jw_double            the server's writer, shortest round-trip digits;
 *   json_dumps 17        jansson's json_dumps with JSON_REAL_PRECISION(17) (the
 *                        shortest precision that round-trips every double) of
 *                        the matrix already built as json_t arrays;
 *   json_dumps default   the same with jansson's default precision;
 *   build + json_dumps   building the json_t arrays too (json_real per
 *                        number), the whole cost of answering through jansson;
 *   jw_float             the float32 answer: shortest digits that read back
 *                        to the same float, against json_dumps with
 *                        JSON_REAL_PRECISION(9) of the float values;
 *   json_loadb           reading the jw_double text back with jansson (the
 *                        server reads requests with it), for reference;
 *   v2 binary read       the input side of a v2 request: q, k, v of 512 x 64
 *                        (numbers of six decimals, as the HTTP benchmark
 *                        sends) as a binary body (FP64, and FP32), framed,
 *                        described and read into doubles by v2_tensor, against
 *                        the same request with JSON `data` read by the same
 *                        functions through jansson (in the JSON arena, as the
 *                        server parses, and with a malloc per node), in
 *                        nanoseconds per input number.  Both must give the
 *                        same doubles.
 * Every writer's text is read back with jansson and must give the same
 * doubles (floats for the float32 pair), bit for bit: a fast writer of wrong
 * digits fails the run.
 *
 * Usage: bench-json [--out DIR] [--quick]; writes DIR/table-json.tsv (rows of
 * the summary table) and DIR/checks-json.tsv, and prints a table.  Exit
 * status 0, or 1 when a check failed.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_util.h"
#include "json/json_fast.h"
#include "json/jsonw.h"
#include "core/mem.h"
#include "v2/v2_tensor.h"

#define ROWS 512
#define COLS 512
#define COUNT ((size_t)ROWS * COLS)
#define MAX_REPS 200

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static double rnd01(void)
{
    return bench_uniform(&rng_state);
}

typedef struct bench {
    const double *m;        /* ROWS x COLS */
    json_t *tree;           /* the same as json_t arrays, for json_dumps */
    size_t flags;           /* json_dumps flags */
    int as_float;           /* jw_float rather than jw_double */
    char *text;             /* the latest text, for the check (owned) */
    size_t len;
    const char *header_length; /* v2 reads: Inference-Header-Content-Length, or NULL */
    double *read_out;       /* v2 reads: READ_COUNT numbers */
    int mode;               /* v2 reads: READ_MALLOC, READ_ARENA or READ_FAST */
} bench;

typedef int (*bench_fn)(bench *b);

static void keep_text(bench *b, char *text, size_t len, int from_jansson)
{
    if (b->text != NULL)
        free(b->text);
    if (text == NULL) {
        b->text = NULL;
        return;
    }
    if (!from_jansson) {
        /* jw_finish's buffer is freed with mem_free; keep a malloc copy. */
        char *copy = malloc(len + 1);
        if (copy != NULL)
            memcpy(copy, text, len + 1);
        mem_free(text);
        text = copy;
    }
    b->text = text;
    b->len = len;
}

static int run_jw(bench *b)
{
    jw_buf w;
    jw_init(&w, COUNT * 24);
    jw_char(&w, '[');
    for (size_t i = 0; i < ROWS; i++) {
        if (i)
            jw_char(&w, ',');
        jw_char(&w, '[');
        for (size_t j = 0; j < COLS; j++) {
            if (j)
                jw_char(&w, ',');
            if (b->as_float)
                jw_float(&w, b->m[i * COLS + j]);
            else
                jw_double(&w, b->m[i * COLS + j]);
        }
        jw_char(&w, ']');
    }
    jw_char(&w, ']');
    size_t len;
    char *text = jw_finish(&w, &len);
    keep_text(b, text, len, 0);
    return text == NULL ? -1 : 0;
}

static json_t *build_tree(const double *m)
{
    json_t *rows = json_array();
    for (size_t i = 0; rows != NULL && i < ROWS; i++) {
        json_t *row = json_array();
        for (size_t j = 0; row != NULL && j < COLS; j++)
            if (json_array_append_new(row, json_real(m[i * COLS + j])) != 0) {
                json_decref(row);
                row = NULL;
            }
        if (json_array_append_new(rows, row) != 0) {
            json_decref(rows);
            rows = NULL;
        }
    }
    return rows;
}

static int run_dumps(bench *b)
{
    char *text = json_dumps(b->tree, b->flags);
    keep_text(b, text, text ? strlen(text) : 0, 1);
    return text == NULL ? -1 : 0;
}

static int run_build_dumps(bench *b)
{
    json_t *tree = build_tree(b->m);
    if (tree == NULL)
        return -1;
    char *text = json_dumps(tree, b->flags);
    json_decref(tree);
    keep_text(b, text, text ? strlen(text) : 0, 1);
    return text == NULL ? -1 : 0;
}

static int run_loadb(bench *b)
{
    json_error_t error;
    json_t *tree = json_loadb(b->text, b->len, 0, &error);
    if (tree == NULL)
        return -1;
    json_decref(tree);
    return 0;
}

/* The v2 request of the read benchmark: 3 inputs of READ_ROWS x READ_COLS. */
#define READ_ROWS 512
#define READ_COLS 64
#define READ_INPUTS 3
#define READ_COUNT ((size_t)READ_INPUTS * READ_ROWS * READ_COLS)

/* Reads every input of the v2 body b->text as the server does: split at the
 * header length, parse the JSON header, describe each input, read its numbers
 * into b->read_out, check that the binary section was claimed exactly. */
/* How run_v2_read parses the JSON header: jansson with a malloc per node,
 * jansson in the JSON arena, or as the server does (json_fast in the arena:
 * `data` arrays read without jansson). */
enum { READ_MALLOC, READ_ARENA, READ_FAST };

static int run_v2_read(bench *b)
{
    v2_body body;
    attn_error err;
    if (v2_body_split(b->text, b->len, api_length_parse(b->header_length), &body, &err) != 0)
        return -1;
    json_error_t jerr;
    const size_t flags = JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL;
    if (b->mode != READ_MALLOC)
        mem_json_arena_begin();
    json_t *root = b->mode == READ_FAST
                       ? json_fast_load(body.json, body.json_len, flags, v2_tensor_data_field, &jerr)
                       : json_loadb(body.json, body.json_len, flags, &jerr);
    if (root == NULL) {
        if (b->mode != READ_MALLOC)
            mem_json_arena_end();
        return -1;
    }
    const json_t *inputs = json_object_get(root, "inputs");
    size_t elements = 0;
    int rc = json_array_size(inputs) == READ_INPUTS ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < READ_INPUTS; i++) {
        v2_tensor t;
        api_infer_input input;
        v2_tensor_input_from_json(json_array_get(inputs, i), &input);
        rc = v2_tensor_describe(&input, i, &body, READ_COUNT, &elements, &t, &err);
        if (rc == 0)
            rc = v2_tensor_read_numbers(&t, b->read_out + i * READ_ROWS * READ_COLS, &err);
    }
    if (rc == 0)
        rc = v2_body_check_consumed(&body, &err);
    json_decref(root);
    if (b->mode != READ_MALLOC)
        mem_json_arena_end();
    return rc;
}

/* Builds the v2 request of values[READ_COUNT]: JSON data (datatype FP64), or
 * binary bytes of datatype dt after the header (whose length goes to hlen).
 * Returns a malloc'd body and its length in *len, or NULL. */
static char *v2_request(const double *values, int binary, v2_datatype dt, size_t *len,
                        char *hlen, size_t hlen_size)
{
    static const char *const names[READ_INPUTS] = {"q", "k", "v"};
    size_t per = (size_t)READ_ROWS * READ_COLS, esize = v2_datatype_size(dt);
    jw_buf w;
    jw_init(&w, binary ? 1024 : READ_COUNT * 12);
    jw_raw(&w, "{\"inputs\":[");
    for (size_t i = 0; i < READ_INPUTS; i++) {
        jw_raw(&w, i ? ",{\"name\":" : "{\"name\":");
        jw_string(&w, names[i]);
        jw_raw(&w, ",\"datatype\":");
        jw_string(&w, v2_datatype_name(dt));
        jw_raw(&w, ",\"shape\":[");
        jw_size(&w, READ_ROWS);
        jw_char(&w, ',');
        jw_size(&w, READ_COLS);
        jw_char(&w, ']');
        if (binary) {
            jw_raw(&w, ",\"parameters\":{\"binary_data_size\":");
            jw_size(&w, per * esize);
            jw_char(&w, '}');
        } else {
            jw_raw(&w, ",\"data\":");
            v2_numbers x = {NULL, values + i * per, per};
            v2_numbers_write_json(&w, &x, dt);
        }
        jw_char(&w, '}');
    }
    jw_raw(&w, "]}");
    size_t header_len;
    char *header = jw_finish(&w, &header_len);
    if (header == NULL)
        return NULL;
    size_t bin = binary ? READ_COUNT * esize : 0;
    char *body = malloc(header_len + bin + 1);
    if (body != NULL) {
        memcpy(body, header, header_len);
        if (binary)
            v2_numbers_write_binary((unsigned char *)body + header_len,
                                    &(v2_numbers){NULL, values, READ_COUNT}, dt);
        body[header_len + bin] = '\0';
        *len = header_len + bin;
        snprintf(hlen, hlen_size, "%zu", header_len);
    }
    mem_free(header);
    return body;
}

/* Median seconds of one run of fn; -1 when a run fails. */
static double time_median(bench_fn fn, bench *b, int min_reps, double budget_s)
{
    double times[MAX_REPS];
    int n = 0;
    if (fn(b) != 0)
        return -1;
    double start = now_s();
    while (n < MAX_REPS && (n < min_reps || now_s() - start < budget_s)) {
        double t0 = now_s();
        if (fn(b) != 0)
            return -1;
        times[n++] = now_s() - t0;
    }
    qsort(times, (size_t)n, sizeof times[0], compare_doubles);
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

/* Reads text back with jansson; returns the count of numbers that differ from
 * m (as floats when as_float), or -1 when it does not parse as ROWS x COLS. */
static long check_text(const char *text, size_t len, const double *m, int as_float)
{
    json_error_t error;
    json_t *tree = json_loadb(text, len, 0, &error);
    if (tree == NULL || json_array_size(tree) != ROWS) {
        json_decref(tree);
        return -1;
    }
    long bad = 0;
    for (size_t i = 0; i < ROWS; i++) {
        json_t *row = json_array_get(tree, i);
        if (json_array_size(row) != COLS) {
            json_decref(tree);
            return -1;
        }
        for (size_t j = 0; j < COLS; j++) {
            double got = json_number_value(json_array_get(row, j));
            double want = m[i * COLS + j];
            if (as_float ? (float)got != (float)want : memcmp(&got, &want, sizeof got) != 0)
                bad++;
        }
    }
    json_decref(tree);
    return bad;
}

int main(int argc, char **argv)
{
    const char *out_dir = "build/bench/results";
    int min_reps = 5;
    double budget = 1.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_dir = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            min_reps = 1;
            budget = 0;
        } else {
            fprintf(stderr, "usage: bench-json [--out DIR] [--quick]\n");
            return 2;
        }
    }
    mkdir(out_dir, 0755);

    /* Softmax rows of scores uniform in [-4, 4): attention-like values. */
    double *m = malloc(COUNT * sizeof(double)), *mf = malloc(COUNT * sizeof(double));
    if (m == NULL || mf == NULL)
        return 1;
    for (size_t i = 0; i < ROWS; i++) {
        double sum = 0;
        for (size_t j = 0; j < COLS; j++)
            sum += m[i * COLS + j] = exp(rnd01() * 8 - 4);
        for (size_t j = 0; j < COLS; j++) {
            m[i * COLS + j] /= sum;
            mf[i * COLS + j] = (double)(float)m[i * COLS + j];
        }
    }
    json_t *tree = build_tree(m), *tree_f = build_tree(mf);
    if (tree == NULL || tree_f == NULL)
        return 1;

    struct {
        const char *name, *peer_of;     /* peer_of: the ours row it is compared with */
        bench_fn fn;
        const double *m;
        json_t *tree;
        size_t flags;
        int as_float;
        double s;
        long bad;
    } runs[] = {
        {"jw_double", NULL, run_jw, m, NULL, 0, 0, 0, 0},
        {"json_dumps, JSON_REAL_PRECISION(17)", "jw_double", run_dumps, m, tree,
         JSON_COMPACT | JSON_REAL_PRECISION(17), 0, 0, 0},
        {"json_dumps, default precision", "jw_double", run_dumps, m, tree, JSON_COMPACT, 0, 0,
         0},
        {"json_real per number + json_dumps(17)", "jw_double", run_build_dumps, m, NULL,
         JSON_COMPACT | JSON_REAL_PRECISION(17), 0, 0, 0},
        {"jw_float", NULL, run_jw, mf, NULL, 0, 1, 0, 0},
        {"json_dumps, JSON_REAL_PRECISION(9)", "jw_float", run_dumps, mf, tree_f,
         JSON_COMPACT | JSON_REAL_PRECISION(9), 1, 0, 0},
    };
    size_t nruns = sizeof runs / sizeof runs[0];
    int failed = 0;
    char path[1100];
    snprintf(path, sizeof path, "%s/checks-json.tsv", out_dir);
    FILE *checks = fopen(path, "w");
    snprintf(path, sizeof path, "%s/table-json.tsv", out_dir);
    FILE *table = fopen(path, "w");
    if (checks == NULL || table == NULL) {
        fprintf(stderr, "bench-json: cannot write into %s: %s\n", out_dir, strerror(errno));
        return 1;
    }
    char *jw_text = NULL;
    size_t jw_len = 0;
    printf("JSON of a %d x %d softmax matrix (%zu numbers)\n", ROWS, COLS, COUNT);
    printf("%-40s %10s %12s %12s %s\n", "writer", "ms", "ns/number", "bytes", "round trip");
    for (size_t r = 0; r < nruns; r++) {
        bench b = {runs[r].m, runs[r].tree, runs[r].flags, runs[r].as_float, NULL, 0, NULL, NULL, 0};
        runs[r].s = time_median(runs[r].fn, &b, min_reps, budget);
        runs[r].bad = b.text ? check_text(b.text, b.len, runs[r].m, runs[r].as_float) : -1;
        /* jansson at 9 digits round-trips floats, not doubles; the check above
         * compares as floats there, as for jw_float. */
        int ok = runs[r].s > 0 && runs[r].bad == 0;
        failed |= !ok;
        printf("%-40s %10.3f %12.1f %12zu %s\n", runs[r].name, runs[r].s * 1e3,
               runs[r].s * 1e9 / (double)COUNT, b.len, ok ? "exact" : "FAILED");
        fprintf(checks, "json: text read back with jansson\t%s\t%s\t%ld differ\t0\t%s\n",
                runs[r].name, runs[r].as_float ? "float32" : "float64", runs[r].bad,
                ok ? "ok" : "FAILED");
        if (r == 0) {
            jw_text = b.text;
            jw_len = b.len;
        } else {
            free(b.text);
        }
    }
    for (size_t r = 0; r < nruns; r++) {
        if (runs[r].peer_of == NULL)
            continue;
        size_t o = 0;
        while (strcmp(runs[o].name, runs[r].peer_of) != 0)
            o++;
        double ours = runs[o].s * 1e9 / (double)COUNT, peer = runs[r].s * 1e9 / (double)COUNT;
        int headline = r == 1 || r == 5;
        fprintf(table, "json\tJSON write 512x512 %s: %s vs %s\t%.1f\t%.1f\tns\t%s\t\t%.1f / %.1f"
                       "\t\t\n", runs[r].as_float ? "float32" : "float64", runs[o].name,
                runs[r].name, ours, peer, headline ? "3" : "", ours, peer);
    }
    bench rb = {m, NULL, 0, 0, jw_text, jw_len, NULL, NULL, 0};
    double read_s = time_median(run_loadb, &rb, min_reps, budget);
    printf("%-40s %10.3f %12.1f %12zu\n", "json_loadb (read, for reference)", read_s * 1e3,
           read_s * 1e9 / (double)COUNT, jw_len);
    fprintf(table, "json\tJSON read 512x512 float64: json_loadb (reference)\t%.1f\t\tns\t\t\t%.1f"
                   "\t\tjansson reads requests\n", read_s * 1e9 / (double)COUNT,
            read_s * 1e9 / (double)COUNT);
    free(jw_text);

    /* Reading a request's numbers: v2 binary against JSON data, the same doubles.
     * jansson allocates as in the server from here on (mem.h, its JSON arena). */
    mem_install_jansson();
    double *values = malloc(READ_COUNT * sizeof(double));
    double *from_json = malloc(READ_COUNT * sizeof(double));
    double *from_bin = malloc(READ_COUNT * sizeof(double));
    double *from_jansson = malloc(READ_COUNT * sizeof(double));
    if (values == NULL || from_json == NULL || from_bin == NULL || from_jansson == NULL)
        return 1;
    for (size_t i = 0; i < READ_COUNT; i++)
        values[i] = round((rnd01() * 2 - 1) * 1e6) / 1e6;
    printf("\nv2 request of %d inputs of %d x %d (%zu numbers): reading them\n", READ_INPUTS,
           READ_ROWS, READ_COLS, READ_COUNT);
    printf("%-40s %10s %12s %12s %s\n", "reader", "ms", "ns/number", "bytes", "same doubles");
    /* Three sets: FP64 and FP32 numbers of six decimals, and FP64 numbers
     * with every digit significant (17 of them, the worst case of strtod). */
    double *full = malloc(READ_COUNT * sizeof(double));
    if (full == NULL)
        return 1;
    for (size_t i = 0; i < READ_COUNT; i++)
        full[i] = rnd01() * 2 - 1;
    for (int set = 0; set < 3; set++) {
        v2_datatype type = set == 1 ? V2_FP32 : V2_FP64;
        double *want = set == 2 ? full : values;
        double *rounded = NULL;
        if (type == V2_FP32) {
            rounded = malloc(READ_COUNT * sizeof(double));
            if (rounded == NULL)
                return 1;
            for (size_t i = 0; i < READ_COUNT; i++)
                rounded[i] = (float)values[i];
            want = rounded;
        }
        char hlen[32];
        size_t json_len = 0, bin_len = 0;
        char *json_body = v2_request(want, 0, type, &json_len, hlen, sizeof hlen);
        char *bin_body = v2_request(want, 1, type, &bin_len, hlen, sizeof hlen);
        bench fb = {NULL, NULL, 0, 0, json_body, json_len, NULL, from_json, READ_FAST};
        bench ab = {NULL, NULL, 0, 0, json_body, json_len, NULL, from_jansson, READ_ARENA};
        bench mb = {NULL, NULL, 0, 0, json_body, json_len, NULL, from_jansson, READ_MALLOC};
        bench bb = {NULL, NULL, 0, 0, bin_body, bin_len, hlen, from_bin, READ_MALLOC};
        double malloc_s = json_body ? time_median(run_v2_read, &mb, min_reps, budget) : -1;
        double arena_s = json_body ? time_median(run_v2_read, &ab, min_reps, budget) : -1;
        double fast_s = json_body ? time_median(run_v2_read, &fb, min_reps, budget) : -1;
        double bin_s = bin_body ? time_median(run_v2_read, &bb, min_reps, budget) : -1;
        /* FP32 JSON data holds the float's shortest digits, which read back as a
         * double that rounds to the float (the computation rounds it so).  The
         * fast reader must give jansson's doubles bit for bit. */
        long differ = 0;
        for (size_t i = 0; i < READ_COUNT; i++)
            differ += memcmp(&from_bin[i], &want[i], sizeof(double)) != 0 ||
                      memcmp(&from_json[i], &from_jansson[i], sizeof(double)) != 0 ||
                      (type == V2_FP32 ? (float)from_json[i] != (float)want[i]
                                       : memcmp(&from_json[i], &want[i], sizeof(double)) != 0);
        int ok = fast_s > 0 && arena_s > 0 && malloc_s > 0 && bin_s > 0 && differ == 0;
        failed |= !ok;
        const char *tname = v2_datatype_name(type);
        const char *digits = set == 2 ? ", 17 digits" : "";
        double n = (double)READ_COUNT;
        printf("%-44s %10.3f %12.2f %12zu %s\n", set == 1 ? "v2 binary FP32" : "v2 binary FP64",
               bin_s * 1e3, bin_s * 1e9 / n, bin_len, ok ? "yes" : "NO");
        printf("v2 JSON data %s%-26s %10.3f %12.2f %12zu %s\n", tname,
               set == 2 ? " 17 digits (server)" : " (server, json_fast)", fast_s * 1e3,
               fast_s * 1e9 / n, json_len, ok ? "yes" : "NO");
        printf("v2 JSON data %s%-26s %10.3f %12.2f %12zu\n", tname, " (jansson, arena)",
               arena_s * 1e3, arena_s * 1e9 / n, json_len);
        printf("v2 JSON data %s%-26s %10.3f %12.2f %12zu\n", tname, " (jansson, malloc)",
               malloc_s * 1e3, malloc_s * 1e9 / n, json_len);
        fprintf(checks, "json: v2 binary, JSON read fast and by jansson give the same numbers\t"
                        "read 3x512x64%s\t%s\t%ld differ\t0\t%s\n", digits, tname, differ,
                ok ? "ok" : "FAILED");
        if (set < 2)
            fprintf(table, "json\tv2 read q,k,v 3x512x64 %s per input number: binary vs JSON data"
                           "\t%.2f\t%.1f\tns\t<5 ns\t\t%.2f / %.1f\t\t%zu vs %zu bytes\n", tname,
                    bin_s * 1e9 / n, fast_s * 1e9 / n, bin_s * 1e9 / n, fast_s * 1e9 / n, bin_len,
                    json_len);
        fprintf(table, "json\tv2 read q,k,v 3x512x64 %s%s per input number: JSON data as the server "
                       "reads it (json_fast) vs jansson\t%.1f\t%.1f\tns\t%s\t\t%.1f / %.1f\t\t"
                       "jansson: %.1f ns with a malloc per node\n", tname, digits, fast_s * 1e9 / n,
                arena_s * 1e9 / n, set < 2 ? "<250 ns" : "", fast_s * 1e9 / n, arena_s * 1e9 / n,
                malloc_s * 1e9 / n);
        free(json_body);
        free(bin_body);
        free(rounded);
    }
    free(full);
    free(values);
    free(from_json);
    free(from_bin);
    free(from_jansson);
    failed |= fclose(checks) != 0;
    failed |= fclose(table) != 0;
    json_decref(tree);
    json_decref(tree_f);
    free(m);
    free(mf);
    if (failed)
        fprintf(stderr, "bench-json: a writer failed or did not round-trip\n");
    return failed;
}

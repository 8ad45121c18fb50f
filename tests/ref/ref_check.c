/*
 * ref_check.c - checks the naive attention reference (reference.c) itself.
 *
 * The integration runner and the unit tests trust reference.c as their oracle, so the
 * oracle gets its own test: it must reproduce the golden fixtures in tests/fixtures
 * (values computed outside this project) and it must have the properties that follow
 * from the definition (rows sum to one, masked keys get zero weight, a fully masked row
 * is all zeros, heads and batch entries are independent, large scores do not overflow).
 *
 * Build: cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
 *          tests/ref/ref_check.c tests/ref/reference.c -ljansson -lm -o build/ref_check
 * Run:   build/ref_check tests/fixtures [--filter SUBSTR]
 * --filter runs only the checks whose name (e.g. "fixture/seed001_causal",
 * "property/large-scores-stable") contains SUBSTR.
 * It prints "ok   NAME" or "FAIL NAME: reason" per check, then "N passed, N failed".
 */
#include "reference.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_passed;
static int g_failed;
static const char *g_filter; /* --filter SUBSTR, or NULL for every check */

/* Returns 1 when --filter selects the check of that name. */
static int selected(const char *name)
{
    return g_filter == NULL || strstr(name, g_filter) != NULL;
}

/* Records one check: prints ok or FAIL with the printf-style reason. */
__attribute__((format(printf, 3, 4)))
static void check_report(const char *name, int ok, const char *fmt, ...)
{
    if (ok) {
        printf("ok   %s\n", name);
        g_passed++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    g_failed++;
}

/* A dense row-major matrix that this file owns. */
struct matrix {
    size_t rows;
    size_t cols;
    double *data;
};

static void matrix_free(struct matrix *m)
{
    free(m->data);
    m->data = NULL;
    m->rows = m->cols = 0;
}

/*
 * Reads a JSON 2-D array of numbers into *m (transposed when transpose is nonzero).
 * Returns 0, or -1 when the value is not a non-empty rectangular matrix of numbers.
 * On failure *m is left empty.
 */
static int matrix_from_json(const json_t *j, int transpose, struct matrix *m)
{
    m->rows = m->cols = 0;
    m->data = NULL;
    if (!json_is_array(j) || json_array_size(j) == 0 || !json_is_array(json_array_get(j, 0)))
        return -1;
    size_t rows = json_array_size(j);
    size_t cols = json_array_size(json_array_get(j, 0));
    if (cols == 0)
        return -1;
    double *data = calloc(rows * cols, sizeof *data);
    if (data == NULL)
        return -1;
    for (size_t r = 0; r < rows; r++) {
        const json_t *row = json_array_get(j, r);
        if (!json_is_array(row) || json_array_size(row) != cols) {
            free(data);
            return -1;
        }
        for (size_t c = 0; c < cols; c++) {
            const json_t *e = json_array_get(row, c);
            if (!json_is_number(e)) {
                free(data);
                return -1;
            }
            if (transpose)
                data[c * rows + r] = json_number_value(e);
            else
                data[r * cols + c] = json_number_value(e);
        }
    }
    m->rows = transpose ? cols : rows;
    m->cols = transpose ? rows : cols;
    m->data = data;
    return 0;
}

/* Reads a flat JSON array of numbers of exactly n elements; returns 0 or -1. */
static int vector_from_json(const json_t *j, size_t n, double **out)
{
    *out = NULL;
    if (!json_is_array(j) || json_array_size(j) != n)
        return -1;
    double *data = calloc(n, sizeof *data);
    if (data == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!json_is_number(json_array_get(j, i))) {
            free(data);
            return -1;
        }
        data[i] = json_number_value(json_array_get(j, i));
    }
    *out = data;
    return 0;
}

/*
 * Compares a row-major rows x cols array (read transposed when transpose is nonzero,
 * so that got[c][r] is compared) with the JSON 2-D array want. Returns the largest
 * absolute difference, or INFINITY when the shapes differ.
 */
static double max_difference(const double *got, size_t rows, size_t cols, int transpose,
                             const json_t *want)
{
    struct matrix w;
    if (matrix_from_json(want, transpose, &w) != 0)
        return INFINITY;
    double worst = 0.0;
    if (w.rows != rows || w.cols != cols) {
        worst = INFINITY;
    } else {
        for (size_t i = 0; i < rows * cols; i++) {
            double d = fabs(got[i] - w.data[i]);
            if (!(d <= worst))
                worst = d; /* NaN propagates as a failure */
        }
    }
    matrix_free(&w);
    return worst;
}

/*
 * Computes the answer to one fixture request with the reference and compares it with
 * the fixture's expectation. Only the single-head, unbatched requests that the golden
 * fixtures use are supported; anything else is reported as a failure of this checker.
 */
/* What check_fixture works on: q, k and v (read, or projected from x), the weights and biases. */
struct fixture_work {
    struct matrix q, k, v, x, w[4];
    double *bias[4];
};

static void fixture_work_free(struct fixture_work *fw)
{
    matrix_free(&fw->q);
    matrix_free(&fw->k);
    matrix_free(&fw->v);
    matrix_free(&fw->x);
    for (int i = 0; i < 4; i++) {
        matrix_free(&fw->w[i]);
        free(fw->bias[i]);
        fw->bias[i] = NULL;
    }
}

/*
 * Fills fw->q, fw->k and fw->v from the request: read as they are, or x projected with
 * the weights (out_in weights turned into in_out first); wo and bo are read into fw->w[3]
 * and fw->bias[3].  Returns NULL, or what the checker cannot interpret.
 */
static const char *fixture_inputs(const json_t *req, int columns, struct fixture_work *fw)
{
    const json_t *weights = json_object_get(req, "weights");
    const char *wlayout = json_string_value(json_object_get(req, "weights_layout"));
    int out_in = wlayout != NULL && strcmp(wlayout, "out_in") == 0;
    if (weights == NULL) {
        if (matrix_from_json(json_object_get(req, "q"), columns, &fw->q) != 0 ||
            matrix_from_json(json_object_get(req, "k"), columns, &fw->k) != 0 ||
            matrix_from_json(json_object_get(req, "v"), columns, &fw->v) != 0)
            return "q, k or v is not a matrix";
        return NULL;
    }
    static const char *const wname[4] = {"wq", "wk", "wv", "wo"};
    static const char *const bname[4] = {"bq", "bk", "bv", "bo"};
    struct matrix *x = &fw->x;
    if (matrix_from_json(json_object_get(req, "x"), columns, x) != 0)
        return "x is not a matrix";
    for (int i = 0; i < 4; i++) {
        const json_t *wj = json_object_get(weights, wname[i]);
        if (wj == NULL) {
            if (i < 3)
                return "weights lack wq, wk or wv";
            continue;
        }
        if (matrix_from_json(wj, out_in, &fw->w[i]) != 0)
            return "a weight is not a matrix";
        const json_t *bj = json_object_get(weights, bname[i]);
        if (bj != NULL && vector_from_json(bj, fw->w[i].cols, &fw->bias[i]) != 0)
            return "a bias is not a vector of the weight's output width";
    }
    struct matrix *dest[3] = {&fw->q, &fw->k, &fw->v};
    for (int i = 0; i < 3; i++) {
        if (fw->w[i].rows != x->cols)
            return "a weight does not fit x";
        dest[i]->rows = x->rows;
        dest[i]->cols = fw->w[i].cols;
        dest[i]->data = calloc(x->rows * fw->w[i].cols, sizeof(double));
        if (dest[i]->data == NULL)
            return "out of memory";
        ref_linear(x->rows, x->cols, fw->w[i].cols, x->data, fw->w[i].data, fw->bias[i], dest[i]->data);
    }
    return NULL;
}

static void check_fixture(const char *name, const json_t *fixture)
{
    const json_t *req = json_object_get(fixture, "request");
    const json_t *expect = json_object_get(fixture, "expect");
    const char *layout = json_string_value(json_object_get(req, "layout"));
    int columns = layout != NULL && strcmp(layout, "columns") == 0;
    int causal = json_is_true(json_object_get(req, "causal"));
    double tolerance = json_number_value(json_object_get(expect, "tolerance"));
    struct fixture_work fw = {0};
    struct matrix *q = &fw.q, *k = &fw.k, *v = &fw.v, *wo = &fw.w[3];
    double *out = NULL, *attn = NULL, *projected = NULL;
    const char *problem = NULL;

    if (json_object_get(req, "heads") != NULL || json_object_get(req, "mask") != NULL ||
        json_object_get(req, "context") != NULL) {
        problem = "fixture uses heads/mask/context, which this checker does not interpret";
        goto done;
    }
    problem = fixture_inputs(req, columns, &fw);
    if (problem != NULL)
        goto done;
    if (q->cols != k->cols || k->rows != v->rows) {
        problem = "q, k and v do not fit together";
        goto done;
    }
    const json_t *scale_json = json_object_get(req, "scale");
    double scale = scale_json != NULL ? json_number_value(scale_json) : ref_default_scale(q->cols);
    out = calloc(q->rows * v->cols, sizeof *out);
    attn = calloc(q->rows * k->rows, sizeof *attn);
    if (out == NULL || attn == NULL) {
        problem = "out of memory";
        goto done;
    }
    ref_sdpa(1, 1, q->rows, k->rows, q->cols, v->cols, q->data, k->data, v->data, NULL, causal, scale,
             out, attn);
    size_t out_cols = v->cols;
    if (wo->data != NULL) {
        if (wo->rows != v->cols) {
            problem = "wo does not fit the values";
            goto done;
        }
        projected = calloc(q->rows * wo->cols, sizeof *projected);
        if (projected == NULL) {
            problem = "out of memory";
            goto done;
        }
        ref_linear(q->rows, v->cols, wo->cols, out, wo->data, fw.bias[3], projected);
        free(out);
        out = projected;
        projected = NULL;
        out_cols = wo->cols;
    }

    double out_diff = max_difference(out, q->rows, out_cols, columns, json_object_get(expect, "output"));
    double attn_diff = max_difference(attn, q->rows, k->rows, 0, json_object_get(expect, "attention"));
    check_report(name, out_diff <= tolerance && attn_diff <= tolerance,
                 "largest difference: output %g, attention %g (tolerance %g)", out_diff,
                 attn_diff, tolerance);
done:
    if (problem != NULL)
        check_report(name, 0, "%s", problem);
    fixture_work_free(&fw);
    free(out);
    free(attn);
    free(projected);
}

/* Runs check_fixture on every *.json file in dir, in name order. */
static void check_fixture_dir(const char *dir)
{
    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, NULL, alphasort);
    if (n < 0) {
        if (selected("fixtures/readable"))
            check_report("fixtures/readable", 0, "cannot read directory %s", dir);
        return;
    }
    int seen = 0;
    for (int i = 0; i < n; i++) {
        const char *file = entries[i]->d_name;
        size_t len = strlen(file);
        if (len > 5 && strcmp(file + len - 5, ".json") == 0) {
            char path[4096], name[512];
            snprintf(path, sizeof path, "%s/%s", dir, file);
            snprintf(name, sizeof name, "fixture/%.*s", (int)(len - 5), file);
            seen++;
            if (!selected(name)) {
                free(entries[i]);
                continue;
            }
            json_error_t error;
            json_t *fixture = json_load_file(path, 0, &error);
            if (fixture == NULL)
                check_report(name, 0, "%s:%d: %s", path, error.line, error.text);
            else
                check_fixture(name, fixture);
            json_decref(fixture);
        }
        free(entries[i]);
    }
    free(entries);
    if (selected("fixtures/present"))
        check_report("fixtures/present", seen > 0, "no *.json files in %s", dir);
}

/* A small deterministic generator of numbers in [-1, 1). */
static double next_uniform(unsigned long long *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill_uniform(double *a, size_t n, double magnitude, unsigned long long *state)
{
    for (size_t i = 0; i < n; i++)
        a[i] = magnitude * next_uniform(state);
}

/* The example worked by hand: weights e/(e+1) and 1/(e+1). */
static void check_hand_example(void)
{
    const double q[] = {1, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, 4};
    double out[2], attn[2];
    ref_sdpa(1, 1, 1, 2, 2, 2, q, k, v, NULL, 0, 1.0, out, attn);
    double e = exp(1.0);
    double w0 = e / (e + 1), w1 = 1 / (e + 1);
    int ok = fabs(attn[0] - w0) < 1e-15 && fabs(attn[1] - w1) < 1e-15 &&
             fabs(out[0] - (w0 * 1 + w1 * 3)) < 1e-15 && fabs(out[1] - (w0 * 2 + w1 * 4)) < 1e-15;
    check_report("property/hand-example", ok, "attn = [%.17g, %.17g], out = [%.17g, %.17g]",
                 attn[0], attn[1], out[0], out[1]);
}

/* The linear map worked by hand. */
static void check_linear_hand_example(void)
{
    const double x[] = {1, 2, 3, 4, 5, 6}; /* 2 x 3 */
    const double w[] = {1, 0, 0, 1, 1, 1}; /* 3 x 2 */
    const double b[] = {10, 20};
    double y[4];
    ref_linear(2, 3, 2, x, w, b, y);
    check_report("property/linear-hand-example",
                 y[0] == 14 && y[1] == 25 && y[2] == 20 && y[3] == 31,
                 "y = [[%g, %g], [%g, %g]], expected [[14, 25], [20, 31]]", y[0], y[1], y[2], y[3]);
}

/*
 * Checks, on random inputs with causal masking and a partial mask: each attention row
 * sums to one (or is all zeros when fully masked), forbidden keys get exactly zero, and
 * a fully masked row gives zero output.
 */
static void check_rows_and_masks(void)
{
    enum { LQ = 5, LK = 4, DK = 3, DV = 2 };
    unsigned long long state = 42;
    double q[LQ * DK], k[LK * DK], v[LK * DV], out[LQ * DV], attn[LQ * LK];
    unsigned char mask[LQ * LK];
    fill_uniform(q, LQ * DK, 1.0, &state);
    fill_uniform(k, LK * DK, 1.0, &state);
    fill_uniform(v, LK * DV, 1.0, &state);
    for (size_t i = 0; i < LQ * LK; i++)
        mask[i] = (i % 3) != 1;
    mask[0] = 0; /* with causal, query 0 may see only key 0: now it sees nothing */

    ref_sdpa(1, 1, LQ, LK, DK, DV, q, k, v, mask, 1, 0.7, out, attn);
    int ok = 1;
    char why[256] = "";
    for (size_t i = 0; i < LQ && ok; i++) {
        double total = 0.0;
        int any = 0;
        for (size_t j = 0; j < LK; j++) {
            int allowed = j <= i && mask[i * LK + j];
            any |= allowed;
            if (!allowed && attn[i * LK + j] != 0.0) {
                ok = 0;
                snprintf(why, sizeof why, "attn[%zu][%zu] = %g but the key is masked", i, j,
                         attn[i * LK + j]);
            }
            total += attn[i * LK + j];
        }
        if (ok && any && fabs(total - 1.0) > 1e-14) {
            ok = 0;
            snprintf(why, sizeof why, "row %zu sums to %.17g", i, total);
        }
        if (ok && !any && (total != 0.0 || out[i * DV] != 0.0 || out[i * DV + 1] != 0.0)) {
            ok = 0;
            snprintf(why, sizeof why, "fully masked row %zu is not all zeros", i);
        }
    }
    check_report("property/rows-sum-to-one-and-masks", ok, "%s", why);
}

/* Checks that two heads and two batch entries equal four separate single-head calls. */
static void check_heads_and_batch_independent(void)
{
    enum { B = 2, H = 2, LQ = 3, LK = 4, DK = 2, DV = 3 };
    unsigned long long state = 7;
    double q[B * LQ * H * DK], k[B * LK * H * DK], v[B * LK * H * DV];
    double out[B * LQ * H * DV], attn[B * H * LQ * LK];
    fill_uniform(q, sizeof q / sizeof q[0], 1.5, &state);
    fill_uniform(k, sizeof k / sizeof k[0], 1.5, &state);
    fill_uniform(v, sizeof v / sizeof v[0], 1.5, &state);
    ref_sdpa(B, H, LQ, LK, DK, DV, q, k, v, NULL, 1, 0.5, out, attn);

    double worst = 0.0;
    for (size_t n = 0; n < B; n++) {
        for (size_t h = 0; h < H; h++) {
            double q1[LQ * DK], k1[LK * DK], v1[LK * DV], out1[LQ * DV], attn1[LQ * LK];
            for (size_t i = 0; i < LQ; i++)
                for (size_t c = 0; c < DK; c++)
                    q1[i * DK + c] = q[(n * LQ + i) * H * DK + h * DK + c];
            for (size_t j = 0; j < LK; j++) {
                for (size_t c = 0; c < DK; c++)
                    k1[j * DK + c] = k[(n * LK + j) * H * DK + h * DK + c];
                for (size_t c = 0; c < DV; c++)
                    v1[j * DV + c] = v[(n * LK + j) * H * DV + h * DV + c];
            }
            ref_sdpa(1, 1, LQ, LK, DK, DV, q1, k1, v1, NULL, 1, 0.5, out1, attn1);
            for (size_t i = 0; i < LQ; i++) {
                for (size_t j = 0; j < LK; j++)
                    worst = fmax(worst, fabs(attn1[i * LK + j] - attn[((n * H + h) * LQ + i) * LK + j]));
                for (size_t c = 0; c < DV; c++)
                    worst = fmax(worst, fabs(out1[i * DV + c] - out[(n * LQ + i) * H * DV + h * DV + c]));
            }
        }
    }
    check_report("property/heads-and-batch-independent", worst == 0.0,
                 "largest difference from separate calls: %g", worst);
}

/* Checks that scores far beyond exp's range still give finite, normalised weights. */
static void check_large_scores(void)
{
    const double q[] = {1000, -1000}, k[] = {1, 0, 0.5, 0, -1, 0}, v[] = {1, 2, 3};
    double out[2], attn[3];
    ref_sdpa(1, 1, 1, 3, 2, 1, q, k, v, NULL, 0, 10.0, out, attn);
    int ok = isfinite(out[0]) && attn[0] == 1.0 && attn[1] == 0.0 && attn[2] == 0.0 && out[0] == 1.0;
    check_report("property/large-scores-stable", ok, "attn = [%g, %g, %g], out = %g", attn[0],
                 attn[1], attn[2], out[0]);
}

/* The property checks, each reporting the one check it is named after. */
static const struct {
    const char *name;
    void (*run)(void);
} g_properties[] = {
    {"property/hand-example", check_hand_example},
    {"property/linear-hand-example", check_linear_hand_example},
    {"property/rows-sum-to-one-and-masks", check_rows_and_masks},
    {"property/heads-and-batch-independent", check_heads_and_batch_independent},
    {"property/large-scores-stable", check_large_scores},
};

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int usage_error = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            g_filter = argv[++i];
        else if (dir == NULL && strncmp(argv[i], "--", 2) != 0)
            dir = argv[i];
        else
            usage_error = 1;
    }
    if (dir == NULL || usage_error) {
        fprintf(stderr, "usage: %s FIXTURE_DIR [--filter SUBSTR]\n", argv[0]);
        return 2;
    }
    check_fixture_dir(dir);
    for (size_t i = 0; i < sizeof g_properties / sizeof g_properties[0]; i++)
        if (selected(g_properties[i].name))
            g_properties[i].run();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed > 0 ? 1 : 0;
}

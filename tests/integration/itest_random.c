/*
 * itest_random.c - randomized requests compared with the naive reference implementation
 * (tests/ref/reference.c): one table of case shapes, values from a fixed seed, every
 * element of output and attention checked, and the meta block of each answer.
 */
#include "itest.h"

enum input_mode { INPUT_QKV, INPUT_X, INPUT_X_CONTEXT };

/*
 * One randomized request. Zero means "absent / default" for every member, so the table
 * below names only what a case varies. Widths dk and dv are per head.
 */
struct random_case {
    const char *name;
    enum input_mode mode; /* q/k/v given directly, x with weights, or x and context */
    size_t batch;         /* 0: 2-D input; n >= 1: 3-D input with n batch entries */
    size_t heads;         /* 0: no "heads" field (and no head axis in attention) */
    size_t lq, lk;        /* lk is ignored for INPUT_X (self-attention: lk = lq) */
    size_t dk, dv;
    size_t d_model;       /* width of x */
    size_t d_context;     /* width of context */
    size_t d_out;         /* 0: no wo; else wo is (heads*dv x d_out) */
    int biases;           /* send bq, bk, bv */
    int bo;               /* send bo (needs d_out) */
    int causal;
    int mask_rank;        /* 0: no mask; 2: one Lq x Lk mask; 3: one per batch entry */
    int mask_numeric;     /* send the mask as 0/1 instead of false/true */
    size_t blocked_row;   /* 1-based query row whose mask is all false; 0: none */
    double scale;         /* 0: default 1/sqrt(dk) */
    double magnitude;     /* spread of q/k/v/x/context values; 0 means 1 */
    int columns;          /* layout "columns" */
    int out_in;           /* weights_layout "out_in" */
    int float32;          /* dtype "float32" */
    int no_attention;     /* return_attention false */
    int explicit_defaults; /* spell out causal/layout/dtype/return_attention defaults */
};

static const struct random_case g_random_cases[] = {
    {.name = "qkv-square", .lq = 3, .lk = 3, .dk = 4, .dv = 4},
    {.name = "qkv-lq-ne-lk-dv-ne-dk", .lq = 2, .lk = 5, .dk = 3, .dv = 6},
    {.name = "qkv-single-token", .lq = 1, .lk = 1, .dk = 1, .dv = 1},
    {.name = "qkv-one-query-many-keys", .lq = 1, .lk = 7, .dk = 5, .dv = 2},
    {.name = "qkv-explicit-defaults", .lq = 3, .lk = 4, .dk = 2, .dv = 3, .explicit_defaults = 1},
    {.name = "heads-2", .heads = 2, .lq = 4, .lk = 4, .dk = 4, .dv = 4},
    {.name = "heads-1-keeps-head-axis", .heads = 1, .lq = 3, .lk = 2, .dk = 3, .dv = 2},
    {.name = "heads-4-dv-ne-dk", .heads = 4, .lq = 3, .lk = 5, .dk = 2, .dv = 3},
    {.name = "batched-2", .batch = 2, .lq = 3, .lk = 4, .dk = 3, .dv = 2},
    {.name = "batched-1-keeps-batch-axis", .batch = 1, .lq = 2, .lk = 2, .dk = 2, .dv = 2},
    {.name = "batched-3-heads-2", .batch = 3, .heads = 2, .lq = 2, .lk = 3, .dk = 2, .dv = 2},
    {.name = "causal-square", .causal = 1, .lq = 4, .lk = 4, .dk = 3, .dv = 3},
    {.name = "causal-lq-lt-lk", .causal = 1, .lq = 3, .lk = 5, .dk = 2, .dv = 4},
    {.name = "causal-lq-gt-lk", .causal = 1, .lq = 5, .lk = 3, .dk = 2, .dv = 2},
    {.name = "causal-batched-heads", .causal = 1, .batch = 2, .heads = 2, .lq = 4, .lk = 4, .dk = 2, .dv = 3},
    {.name = "mask-2d", .mask_rank = 2, .lq = 4, .lk = 5, .dk = 3, .dv = 2},
    {.name = "mask-2d-numeric", .mask_rank = 2, .mask_numeric = 1, .lq = 3, .lk = 3, .dk = 2, .dv = 2},
    {.name = "mask-2d-broadcast-over-batch", .mask_rank = 2, .batch = 3, .lq = 3, .lk = 4, .dk = 2, .dv = 2},
    {.name = "mask-3d-batched", .mask_rank = 3, .batch = 2, .lq = 3, .lk = 4, .dk = 2, .dv = 3},
    {.name = "mask-2d-and-causal", .mask_rank = 2, .causal = 1, .lq = 5, .lk = 5, .dk = 3, .dv = 2},
    {.name = "mask-3d-causal-heads", .mask_rank = 3, .causal = 1, .batch = 2, .heads = 2, .lq = 4, .lk = 6,
     .dk = 2, .dv = 2},
    {.name = "fully-masked-row", .mask_rank = 2, .blocked_row = 2, .lq = 3, .lk = 4, .dk = 2, .dv = 3},
    {.name = "fully-masked-row-causal-heads-batched", .mask_rank = 3, .blocked_row = 1, .causal = 1, .batch = 2,
     .heads = 2, .lq = 3, .lk = 3, .dk = 2, .dv = 2},
    {.name = "scale-custom", .scale = 0.3, .lq = 3, .lk = 4, .dk = 4, .dv = 2},
    {.name = "scale-large-logits-stable", .scale = 50, .magnitude = 3, .lq = 4, .lk = 4, .dk = 8, .dv = 2},
    {.name = "x-self-explicit-defaults", .mode = INPUT_X, .lq = 4, .d_model = 5, .dk = 3, .dv = 4,
     .explicit_defaults = 1},
    {.name = "x-biases-heads", .mode = INPUT_X, .biases = 1, .heads = 2, .lq = 3, .d_model = 4, .dk = 2, .dv = 3},
    {.name = "x-wo-bo-heads", .mode = INPUT_X, .biases = 1, .heads = 3, .d_out = 5, .bo = 1, .lq = 4, .d_model = 6,
     .dk = 2, .dv = 2},
    {.name = "x-wo-without-bo", .mode = INPUT_X, .d_out = 3, .lq = 3, .d_model = 4, .dk = 4, .dv = 2},
    {.name = "x-batched-causal-heads", .mode = INPUT_X, .batch = 2, .heads = 2, .causal = 1, .biases = 1, .lq = 4,
     .d_model = 3, .dk = 2, .dv = 2},
    {.name = "context-cross-attention", .mode = INPUT_X_CONTEXT, .biases = 1, .lq = 3, .lk = 6, .d_model = 4,
     .d_context = 5, .dk = 3, .dv = 2},
    {.name = "context-batched-heads-wo-causal", .mode = INPUT_X_CONTEXT, .batch = 2, .heads = 2, .causal = 1,
     .lq = 2, .lk = 4, .d_model = 3, .d_context = 2, .dk = 2, .dv = 3, .d_out = 4, .bo = 1},
    {.name = "layout-columns-qkv", .columns = 1, .lq = 3, .lk = 5, .dk = 4, .dv = 2},
    {.name = "layout-columns-batched-heads-mask", .columns = 1, .batch = 2, .heads = 2, .mask_rank = 3, .lq = 3,
     .lk = 4, .dk = 2, .dv = 3},
    {.name = "layout-columns-x-context", .mode = INPUT_X_CONTEXT, .columns = 1, .biases = 1, .lq = 2, .lk = 5,
     .d_model = 3, .d_context = 4, .dk = 2, .dv = 3},
    {.name = "weights-out-in", .mode = INPUT_X, .out_in = 1, .biases = 1, .lq = 4, .d_model = 3, .dk = 5, .dv = 2},
    {.name = "weights-out-in-columns-wo", .mode = INPUT_X, .out_in = 1, .columns = 1, .heads = 2, .d_out = 3,
     .bo = 1, .lq = 3, .d_model = 5, .dk = 2, .dv = 2},
    {.name = "float32-qkv", .float32 = 1, .lq = 4, .lk = 3, .dk = 5, .dv = 3},
    {.name = "float32-x-heads-causal-mask", .float32 = 1, .mode = INPUT_X, .heads = 2, .causal = 1, .biases = 1,
     .mask_rank = 2, .lq = 4, .d_model = 4, .dk = 3, .dv = 2},
    {.name = "no-attention", .no_attention = 1, .lq = 3, .lk = 4, .dk = 2, .dv = 2},
    {.name = "no-attention-batched-heads", .no_attention = 1, .batch = 2, .heads = 2, .lq = 2, .lk = 3, .dk = 2,
     .dv = 2},
};

/* Everything a randomized case allocates, so that one loop frees it. */
struct case_buffers {
    double *x, *context, *q, *k, *v, *w[4], *b[4], *out, *attn, *final;
    unsigned char *mask;
};

static void case_buffers_free(struct case_buffers *cb)
{
    free(cb->x);
    free(cb->context);
    free(cb->q);
    free(cb->k);
    free(cb->v);
    for (int i = 0; i < 4; i++) {
        free(cb->w[i]);
        free(cb->b[i]);
    }
    free(cb->out);
    free(cb->attn);
    free(cb->final);
    free(cb->mask);
}

/* Checks a meta member that must be the integer want, or null when want is -1. */
static void expect_meta(struct test *t, const json_t *meta, const char *key, long long want)
{
    const json_t *v = json_object_get(meta, key);
    if (want < 0)
        expect_true(t, json_is_null(v), "meta.%s should be null", key);
    else
        expect_json_integer(t, meta, "meta", key, want);
}

/* Checks that a JSON row exists and holds only exact zeros. */
static void expect_zero_row(struct test *t, const json_t *row, const char *what, size_t n, size_t h, size_t i)
{
    int ok = json_is_array(row) && json_array_size(row) > 0;
    for (size_t j = 0; ok && j < json_array_size(row); j++)
        ok = json_is_number(json_array_get(row, j)) && json_number_value(json_array_get(row, j)) == 0.0;
    expect_true(t, ok, "fully masked query row %zu (batch entry %zu, head %zu) of %s is not all zeros", i, n, h,
                what);
}

/*
 * Checks, independently of the reference, that query row i is zero in the output and
 * in the attention of every batch entry and head. Valid for layout "rows" without wo
 * (with wo the row would be bo, in columns layout it is a column).
 */
static void expect_masked_row_zero(struct test *t, const json_t *body, size_t i, int batched, int has_heads)
{
    const json_t *out = json_object_get(body, "output");
    const json_t *attn = json_object_get(body, "attention");
    size_t batch = batched ? json_array_size(out) : 1;
    for (size_t n = 0; n < batch; n++) {
        const json_t *out_n = batched ? json_array_get(out, n) : out;
        const json_t *attn_n = batched ? json_array_get(attn, n) : attn;
        expect_zero_row(t, json_array_get(out_n, i), "output", n, 0, i);
        size_t heads = has_heads ? json_array_size(attn_n) : 1;
        for (size_t h = 0; h < heads; h++) {
            const json_t *attn_h = has_heads ? json_array_get(attn_n, h) : attn_n;
            expect_zero_row(t, json_array_get(attn_h, i), "attention", n, h, i);
        }
    }
}

/* The sizes and options of one random case, worked out from its table entry. */
struct case_shape {
    int batched, f32;
    size_t batch, heads, lq, lk, qk_width, v_width, d_final;
    double magnitude, scale;
};

static struct case_shape case_shape_of(const struct random_case *rc)
{
    struct case_shape sz;
    sz.batched = rc->batch > 0;
    sz.batch = sz.batched ? rc->batch : 1;
    sz.heads = rc->heads > 0 ? rc->heads : 1;
    sz.lq = rc->lq;
    sz.lk = rc->mode == INPUT_X ? rc->lq : rc->lk;
    sz.qk_width = sz.heads * rc->dk, sz.v_width = sz.heads * rc->dv;
    sz.d_final = rc->d_out > 0 ? rc->d_out : sz.v_width;
    sz.magnitude = rc->magnitude > 0 ? rc->magnitude : 1.0;
    sz.scale = rc->scale > 0 ? rc->scale : ref_default_scale(rc->dk);
    sz.f32 = rc->float32;
    return sz;
}

/* The inputs of the request: q/k/v directly, or x (and context) projected by the weights
 * (then cb's q, k and v are the reference's projections). */
static void random_inputs(const struct random_case *rc, const struct case_shape *sz, uint64_t *rng,
                          struct case_buffers *cb, json_t *req)
{
    if (rc->mode == INPUT_QKV) {
        cb->q = random_values(rng, sz->batch * sz->lq * sz->qk_width, sz->magnitude, sz->f32);
        cb->k = random_values(rng, sz->batch * sz->lk * sz->qk_width, sz->magnitude, sz->f32);
        cb->v = random_values(rng, sz->batch * sz->lk * sz->v_width, sz->magnitude, sz->f32);
        json_object_set_new(req, "q", json_tensor(cb->q, sz->batch, sz->lq, sz->qk_width, sz->batched, rc->columns));
        json_object_set_new(req, "k", json_tensor(cb->k, sz->batch, sz->lk, sz->qk_width, sz->batched, rc->columns));
        json_object_set_new(req, "v", json_tensor(cb->v, sz->batch, sz->lk, sz->v_width, sz->batched, rc->columns));
        return;
    }
        static const char *const wname[4] = {"wq", "wk", "wv", "wo"};
    static const char *const bname[4] = {"bq", "bk", "bv", "bo"};
    const int has_context = rc->mode == INPUT_X_CONTEXT;
    const size_t d_source = has_context ? rc->d_context : rc->d_model; /* where k and v come from */
    const size_t w_rows[4] = {rc->d_model, d_source, d_source, sz->v_width};
    const size_t w_cols[4] = {sz->qk_width, sz->qk_width, sz->v_width, rc->d_out};
    const int has_bias[4] = {rc->biases, rc->biases, rc->biases, rc->bo};
    cb->x = random_values(rng, sz->batch * sz->lq * rc->d_model, sz->magnitude, sz->f32);
    json_object_set_new(req, "x", json_tensor(cb->x, sz->batch, sz->lq, rc->d_model, sz->batched, rc->columns));
    const double *source = cb->x;
    if (has_context) {
        cb->context = random_values(rng, sz->batch * sz->lk * rc->d_context, sz->magnitude, sz->f32);
        json_object_set_new(req, "context",
                            json_tensor(cb->context, sz->batch, sz->lk, rc->d_context, sz->batched, rc->columns));
        source = cb->context;
    }
    json_t *weights = json_object();
    for (int i = 0; i < 4; i++) {
        if (w_cols[i] == 0)
            continue; /* no wo */
        /* Weights are kept (d_in x d_out) here and sent transposed for "out_in". */
        cb->w[i] = random_values(rng, w_rows[i] * w_cols[i], 1.0 / sqrt((double)w_rows[i]), sz->f32);
        json_object_set_new(weights, wname[i], json_matrix(cb->w[i], w_rows[i], w_cols[i], rc->out_in));
        if (has_bias[i]) {
            cb->b[i] = random_values(rng, w_cols[i], 0.5, sz->f32);
            json_t *bias = json_array();
            for (size_t c = 0; c < w_cols[i]; c++)
                json_array_append_new(bias, json_real(cb->b[i][c]));
            json_object_set_new(weights, bname[i], bias);
        }
    }
    json_object_set_new(req, "weights", weights);
    /* The projections are row-wise, so all batch entries go through one call. */
    cb->q = client_xcalloc(sz->batch * sz->lq * sz->qk_width, sizeof(double));
    cb->k = client_xcalloc(sz->batch * sz->lk * sz->qk_width, sizeof(double));
    cb->v = client_xcalloc(sz->batch * sz->lk * sz->v_width, sizeof(double));
    ref_linear(sz->batch * sz->lq, rc->d_model, sz->qk_width, cb->x, cb->w[0], cb->b[0], cb->q);
    ref_linear(sz->batch * sz->lk, d_source, sz->qk_width, source, cb->w[1], cb->b[1], cb->k);
    ref_linear(sz->batch * sz->lk, d_source, sz->v_width, source, cb->w[2], cb->b[2], cb->v);
}

/* The options of the request, and its mask (drawn from rng). */
static void random_options(const struct random_case *rc, const struct case_shape *sz, uint64_t *rng,
                           struct case_buffers *cb, json_t *req)
{
    /* Options. */
    if (rc->heads > 0)
        json_object_set_new(req, "heads", json_integer((json_int_t)rc->heads));
    if (rc->causal || rc->explicit_defaults)
        json_object_set_new(req, "causal", json_boolean(rc->causal));
    if (rc->scale > 0)
        json_object_set_new(req, "scale", json_real(rc->scale));
    if (rc->columns || rc->explicit_defaults)
        json_object_set_new(req, "layout", json_string(rc->columns ? "columns" : "rows"));
    if (rc->mode != INPUT_QKV && (rc->out_in || rc->explicit_defaults))
        json_object_set_new(req, "weights_layout", json_string(rc->out_in ? "out_in" : "in_out"));
    if (rc->float32 || rc->explicit_defaults)
        json_object_set_new(req, "dtype", json_string(rc->float32 ? "float32" : "float64"));
    if (rc->no_attention || rc->explicit_defaults)
        json_object_set_new(req, "return_attention", json_boolean(!rc->no_attention));
    if (rc->mask_rank > 0) {
        /* A 2-D mask is drawn once and repeated for the reference, as the server broadcasts it. */
        size_t drawn = rc->mask_rank == 3 ? sz->batch : 1;
        cb->mask = client_xcalloc(sz->batch * sz->lq * sz->lk, 1);
        for (size_t n = 0; n < drawn; n++)
            for (size_t e = 0; e < sz->lq * sz->lk; e++)
                cb->mask[n * sz->lq * sz->lk + e] = rng_uniform(rng) < 0.4; /* about 70% allowed */
        if (rc->blocked_row > 0)
            for (size_t n = 0; n < drawn; n++)
                memset(&cb->mask[(n * sz->lq + rc->blocked_row - 1) * sz->lk], 0, sz->lk);
        for (size_t n = drawn; n < sz->batch; n++)
            memcpy(&cb->mask[n * sz->lq * sz->lk], cb->mask, sz->lq * sz->lk);
        json_object_set_new(req, "mask", json_mask(cb->mask, drawn, sz->lq, sz->lk, rc->mask_rank == 3, rc->mask_numeric));
    }

}

/* The test random/NAME/meta: the meta block of the answer body. */
static void random_meta(const struct random_case *rc, const struct case_shape *sz, const json_t *body)
{
    struct test t;
    if (!test_begin(&t, "random/%s/meta", rc->name))
        return;
    const json_t *meta = json_object_get(body, "meta");
    if (expect_true(&t, json_is_object(meta), "no meta object")) {
        const char *dtype = json_string_value(json_object_get(meta, "dtype"));
        const char *want_dtype = sz->f32 ? "float32" : "float64";
        expect_true(&t, dtype != NULL && strcmp(dtype, want_dtype) == 0, "meta.dtype is %s, expected %s",
                    dtype ? dtype : "(missing)", want_dtype);
        expect_meta(&t, meta, "batch", sz->batched ? (long long)sz->batch : -1);
        expect_meta(&t, meta, "heads", rc->heads > 0 ? (long long)sz->heads : -1);
        expect_meta(&t, meta, "lq", (long long)sz->lq);
        expect_meta(&t, meta, "lk", (long long)sz->lk);
        expect_meta(&t, meta, "dk", (long long)rc->dk);
        expect_meta(&t, meta, "dv", (long long)rc->dv);
        expect_meta(&t, meta, "d_out", (long long)sz->d_final);
        const json_t *got_scale = json_object_get(meta, "scale");
        expect_true(&t, json_is_number(got_scale) &&
                            fabs(json_number_value(got_scale) - sz->scale) <= (sz->f32 ? 1e-6 : 1e-12) * sz->scale,
                    "meta.scale is %.17g, expected %.17g", json_number_value(got_scale), sz->scale);
    }
    test_end(&t);
}

/*
 * Builds the request of one random case together with the answer the reference gives,
 * sends it, and reports two tests: "random/NAME" (status, output, attention and its
 * shape) and "random/NAME/meta" (the meta block that api/openapi.yaml describes).
 */
static void run_random_case(const struct random_case *rc, size_t index)
{
    struct test t;
    if (!test_begin(&t, "random/%s", rc->name))
        return;

    uint64_t rng = RANDOM_SEED + 7919u * (uint64_t)index;
    const struct case_shape shape = case_shape_of(rc), *sz = &shape;
    struct case_buffers cb = {0};
    json_t *req = json_object();
    json_t *want_output = NULL, *want_attention = NULL, *body = NULL;
    struct client_response r = {0};
    struct server *s;
    random_inputs(rc, sz, &rng, &cb, req);
    random_options(rc, sz, &rng, &cb, req);

    /* The reference answer, shaped as the contract says. */
    cb.out = client_xcalloc(sz->batch * sz->lq * sz->v_width, sizeof(double));
    cb.attn = client_xcalloc(sz->batch * sz->heads * sz->lq * sz->lk, sizeof(double));
    ref_sdpa(sz->batch, sz->heads, sz->lq, sz->lk, rc->dk, rc->dv, cb.q, cb.k, cb.v, cb.mask, rc->causal, sz->scale, cb.out, cb.attn);
    const double *final = cb.out;
    if (rc->d_out > 0) {
        cb.final = client_xcalloc(sz->batch * sz->lq * rc->d_out, sizeof(double));
        ref_linear(sz->batch * sz->lq, sz->v_width, rc->d_out, cb.out, cb.w[3], cb.b[3], cb.final);
        final = cb.final;
    }
    want_output = json_tensor(final, sz->batch, sz->lq, sz->d_final, sz->batched, rc->columns);
    want_attention = json_attention(cb.attn, sz->batch, sz->heads, sz->lq, sz->lk, sz->batched, rc->heads > 0);

    double abs_tol = sz->f32 ? FLOAT32_TOLERANCE : FLOAT64_TOLERANCE;
    double rel_tol = sz->f32 ? FLOAT32_TOLERANCE : 0.0;
    if ((s = test_server(&t, SERVER_DEFAULT)) == NULL)
        goto done;
    http_post_json(s, "/v1/attention", req, &r);
    if (!expect_status(&t, &r, 200))
        goto done;
    body = response_json(&r);
    if (!expect_true(&t, json_is_object(body), "response is not a JSON object"))
        goto done;
    expect_close(&t, body, "output", want_output, abs_tol, rel_tol);
    if (rc->no_attention)
        expect_true(&t, json_object_get(body, "attention") == NULL,
                    "\"attention\" is present although return_attention was false");
    else
        expect_close(&t, body, "attention", want_attention, abs_tol, rel_tol);
    if (rc->blocked_row > 0 && !rc->columns && rc->d_out == 0 && !rc->no_attention)
        expect_masked_row_zero(&t, body, rc->blocked_row - 1, sz->batched, rc->heads > 0);
done:
    test_end(&t);

    /* The meta block, as a separate test so that a meta slip does not hide the math. */
    if (body != NULL)
        random_meta(rc, sz, body);

    json_decref(req);
    json_decref(want_output);
    json_decref(want_attention);
    json_decref(body);
    client_response_free(&r);
    case_buffers_free(&cb);
}

/* Runs every case of the table above. */
void run_random_tests(const struct itest_paths *paths)
{
    (void)paths;
    for (size_t i = 0; i < sizeof g_random_cases / sizeof g_random_cases[0]; i++)
        run_random_case(&g_random_cases[i], i);
}

/*
 * test_checkpoint.c - the presets on small checkpoints written with the F64
 * writer: slicing and transposing, prefixes, layers, and the errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "core/compute.h"
#include "core/mem.h"
#include "checkpoint/safetensors.h"
#include "test.h"
#include "core/test_hooks.h"

/* Element k of a test tensor: distinct for every tensor and position. */
static double val(int tensor, size_t k)
{
    return tensor * 1000.0 + (double)k;
}

/* A checkpoint of the tensors named names[i] with shapes rows[i] x cols[i]
 * (rows 0: a vector), each filled by val(i, k).  Parses it into *f; the
 * caller frees f and the returned buffer. */
static unsigned char *make_ckpt(const char *const *names, const size_t *rows, const size_t *cols,
                                size_t n, st_file *f)
{
    st_out out[16] = {{0}};
    double *data[16] = {0};
    for (size_t i = 0; i < n; i++) {
        size_t count = (rows[i] ? rows[i] : 1) * cols[i];
        data[i] = malloc(count * sizeof(double));
        for (size_t k = 0; k < count; k++)
            data[i][k] = val((int)i, k);
        out[i] = (st_out){names[i], rows[i], cols[i], data[i], NULL};
    }
    size_t len;
    unsigned char *file = safetensors_write(out, n, NULL, 0, &len);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    attn_error err;
    if (file == NULL || safetensors_parse(file, len, f, &err) != 0) {
        mem_free(file);
        return NULL;
    }
    return file;
}

static int extract(const st_file *f, ckpt_preset preset, long layer, ckpt_layer **layers,
                   size_t *count, attn_error *err)
{
    ckpt_request rq = {.preset = preset, .layer = layer, .max_elements = 1000000};
    error_clear(err);
    return checkpoint_extract(f, &rq, NULL, NULL, layers, count, err);
}

void test_checkpoint_torch_mha_stacked(void)
{
    /* E = 2: in_proj_weight 6 x 2 (out, in), q rows 0-1, k 2-3, v 4-5. */
    const char *names[] = {"enc.attn.in_proj_weight", "enc.attn.in_proj_bias",
                           "enc.attn.out_proj.weight", "enc.attn.out_proj.bias", "enc.other"};
    const size_t rows[] = {6, 0, 2, 0, 0}, cols[] = {2, 6, 2, 2, 3};
    st_file f;
    unsigned char *file = make_ckpt(names, rows, cols, 5, &f);
    ASSERT(file != NULL);
    ckpt_layer *l = NULL;
    size_t n = 0;
    attn_error err;
    int rc = extract(&f, CKPT_TORCH_MHA, CKPT_LAYER_NONE, &l, &n, &err);
    int ok = rc == 0 && n == 1 && l[0].index == -1 && l[0].w.d_in == 2 && l[0].w.dk == 2 &&
             l[0].w.d_ctx == 2 && l[0].w.d_out == 2;
    /* wk (in, out)[i][j] = in_proj_weight[2 + j][i]; bv[j] = in_proj_bias[4 + j];
     * wo[i][j] = out_proj.weight[j][i]. */
    for (size_t i = 0; ok && i < 2; i++)
        for (size_t j = 0; j < 2; j++)
            ok = ok && l[0].w.wk[i * 2 + j] == val(0, (2 + j) * 2 + i) &&
                 l[0].w.wo[i * 2 + j] == val(2, j * 2 + i) && l[0].w.bv[j] == val(1, 4 + j) &&
                 l[0].w.bo[j] == val(3, j);
    checkpoint_layers_free(l, n);
    safetensors_free(&f);
    mem_free(file);
    if (rc != 0)
        FAIL_AT("%s", err.message);
    ASSERT(ok);
}

void test_checkpoint_gpt2_layers(void)
{
    /* E = 2, two layers; c_attn 2 x 6 (in, out): q columns 0-1, k 2-3, v 4-5. */
    const char *names[] = {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                           "transformer.h.0.attn.c_proj.weight", "transformer.h.1.attn.c_attn.weight",
                           "transformer.h.1.attn.c_proj.weight", "transformer.wte.weight"};
    const size_t rows[] = {2, 0, 2, 2, 2, 4}, cols[] = {6, 6, 2, 6, 2, 2};
    st_file f;
    unsigned char *file = make_ckpt(names, rows, cols, 6, &f);
    ASSERT(file != NULL);
    ckpt_layer *l = NULL;
    size_t n = 0;
    attn_error err;
    /* Two layers and none asked for: field layer. */
    ASSERT_EQ(extract(&f, CKPT_GPT2, CKPT_LAYER_NONE, &l, &n, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "layer");
    ASSERT_EQ(extract(&f, CKPT_GPT2, 7, &l, &n, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.field, "layer");
    ASSERT(l == NULL);
    int rc = extract(&f, CKPT_GPT2, CKPT_LAYER_ALL, &l, &n, &err);
    int ok = rc == 0 && n == 2 && l[0].index == 0 && l[1].index == 1 && l[0].w.bq != NULL &&
             l[1].w.bq == NULL && l[1].w.bo == NULL;
    for (size_t i = 0; ok && i < 2; i++)
        for (size_t j = 0; j < 2; j++)
            ok = l[0].w.wv[i * 2 + j] == val(0, i * 6 + 4 + j) &&
                 l[1].w.wq[i * 2 + j] == val(3, i * 6 + j) && l[0].w.bk[j] == val(1, 2 + j) &&
                 l[1].w.wo[i * 2 + j] == val(4, i * 2 + j);
    checkpoint_layers_free(l, n);
    safetensors_free(&f);
    mem_free(file);
    if (rc != 0)
        FAIL_AT("%s", err.message);
    ASSERT(ok);
}

void test_checkpoint_bert_errors(void)
{
    /* Layer 0 lacks its value.weight; two prefixes hold layer 1. */
    const char *names[] = {"bert.encoder.layer.0.attention.self.query.weight",
                           "bert.encoder.layer.0.attention.self.key.weight",
                           "bert.encoder.layer.0.attention.output.dense.weight",
                           "other.encoder.layer.1.attention.self.query.weight"};
    const size_t rows[] = {2, 2, 2, 2}, cols[] = {2, 2, 2, 2};
    st_file f;
    unsigned char *file = make_ckpt(names, rows, cols, 4, &f);
    ASSERT(file != NULL);
    ckpt_layer *l = NULL;
    size_t n = 0;
    attn_error err;
    int ambiguous = extract(&f, CKPT_HF_BERT, 0, &l, &n, &err) == ERR_BAD_REQUEST &&
                    !strcmp(err.code, "ambiguous_prefix") && strstr(err.message, "\"bert.\"") &&
                    strstr(err.message, "\"other.\"");
    safetensors_free(&f);
    mem_free(file);
    ASSERT(ambiguous);
    file = make_ckpt(names, rows, cols, 3, &f);
    ASSERT(file != NULL);
    int missing = extract(&f, CKPT_HF_BERT, CKPT_LAYER_NONE, &l, &n, &err) == ERR_BAD_REQUEST &&
                  !strcmp(err.code, "missing_tensor") &&
                  strstr(err.message, "bert.encoder.layer.0.attention.self.value.weight");
    int no_mha = extract(&f, CKPT_TORCH_MHA, CKPT_LAYER_NONE, &l, &n, &err) == ERR_BAD_REQUEST &&
                 strstr(err.message, "out_proj.weight");
    safetensors_free(&f);
    mem_free(file);
    ASSERT(missing);
    ASSERT(no_mha);
    ASSERT(l == NULL);
}

void test_checkpoint_names_and_limits(void)
{
    /* names: (out, in) wq 3 x 2 means d_in 2, dk 3; wk and wv 3 x 4 (d_ctx 4). */
    const char *names[] = {"a", "b", "c", "d"};
    const size_t rows[] = {3, 3, 3, 3}, cols[] = {2, 4, 4, 5};
    st_file f;
    unsigned char *file = make_ckpt(names, rows, cols, 4, &f);
    ASSERT(file != NULL);
    ckpt_request rq = {.preset = CKPT_NAMES, .layer = CKPT_LAYER_NONE, .max_elements = 100,
                       .names = {"a", "b", "c"}, .names_out_in = 1};
    ckpt_layer *l = NULL;
    size_t n = 0;
    attn_error err;
    int rc = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err);
    int ok = rc == 0 && l[0].w.d_in == 2 && l[0].w.d_ctx == 4 && l[0].w.dk == 3 &&
             l[0].w.wo == NULL && l[0].w.wq[1 * 3 + 2] == val(0, 2 * 2 + 1);
    checkpoint_layers_free(l, n);
    rq.max_elements = 29; /* 6 + 12 + 12 numbers */
    int too_many = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err) == ERR_TOO_LARGE;
    rq.max_elements = 100;
    rq.names[WEIGHTS_WO] = "d"; /* 3 x 5 (out, in): 5 inputs, but dv is 3 */
    int mismatch = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err) == ERR_BAD_REQUEST &&
                   !strcmp(err.code, "shape_mismatch") && strstr(err.message, "\"d\"");
    rq.names[WEIGHTS_WO] = "zz";
    int missing = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err) == ERR_BAD_REQUEST &&
                  strstr(err.message, "\"zz\"");
    rq.names[WEIGHTS_WO] = NULL;
    rq.names[WEIGHTS_WK] = NULL;
    int no_wk = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err) == ERR_BAD_REQUEST &&
                !strcmp(err.field, "wk");
    safetensors_free(&f);
    mem_free(file);
    if (rc != 0)
        FAIL_AT("%s", err.message);
    ASSERT(ok);
    ASSERT(too_many);
    ASSERT(mismatch);
    ASSERT(missing);
    ASSERT(no_wk);
}

void test_checkpoint_out_of_memory(void)
{
    const char *names[] = {"in_proj_weight", "out_proj.weight"};
    const size_t rows[] = {6, 2}, cols[] = {2, 2};
    st_file f;
    unsigned char *file = make_ckpt(names, rows, cols, 2, &f);
    ASSERT(file != NULL);
    int clean = 1;
    for (long k = 0; clean; k++) {
        ckpt_layer *l = NULL;
        size_t n = 0;
        attn_error err;
        mem_fail_after(k);
        int rc = extract(&f, CKPT_TORCH_MHA, CKPT_LAYER_NONE, &l, &n, &err);
        long failures = mem_failures();
        checkpoint_layers_free(l, n);
        long live = mem_fail_live();
        mem_fail_reset();
        if (failures == 0)
            break;
        clean = rc == ERR_UNAVAILABLE && l == NULL && live == 0 && k < 100;
    }
    safetensors_free(&f);
    mem_free(file);
    ASSERT(clean);
}

/* checkpoint_extract's reserve, recording the bytes asked for. */
static int record_reserve(size_t bytes, void *ctx, attn_error *err)
{
    (void)err;
    *(size_t *)ctx = bytes;
    return 0;
}

/* torch_mha of E = 2 from F32 tensors (with f64_bias, in_proj_bias is F64):
 * a float32 set whose numbers are the file's bit for bit, its arrays reserved
 * at 4 bytes a number; with one F64 tensor a float64 set at 8. */
static void run_f32_case(int f64_bias)
{
    static const float w_in[12] = {0.1f, -0.2f, 0.3f, 1e-30f, -0.0f, 3.4e38f,
                                   7.0f, 8.5f, -9.25f, 1.0f / 3, 2.0f / 3, 5e-45f};
    static const float w_out[4] = {0.5f, -0.25f, 0.125f, 1.1f};
    static const double b_in[6] = {1, 2, 3, 4, 5, 6};
    static const float b_in_f[6] = {1, 2, 3, 4, 5, 6};
    st_out out[3] = {{"in_proj_weight", 6, 2, NULL, w_in},
                     {"out_proj.weight", 2, 2, NULL, w_out},
                     {"in_proj_bias", 0, 6, f64_bias ? b_in : NULL, f64_bias ? NULL : b_in_f}};
    size_t len, reserved = 0, n = 0;
    unsigned char *file = safetensors_write(out, 3, NULL, 0, &len);
    ASSERT(file != NULL);
    st_file f;
    attn_error err;
    ASSERT_EQ(safetensors_parse(file, len, &f, &err), 0);
    ckpt_request rq = {.preset = CKPT_TORCH_MHA, .layer = CKPT_LAYER_NONE, .max_elements = 100};
    ckpt_layer *l = NULL;
    int rc = checkpoint_extract(&f, &rq, record_reserve, &reserved, &l, &n, &err);
    int ok = rc == 0 && n == 1 && weights_is_f32(&l[0].w) == !f64_bias &&
             reserved == (12 + 4 + 6) * (f64_bias ? 8u : 4u);
    /* wq (in, out)[i][j] = in_proj_weight[j][i], compared bit for bit */
    for (size_t i = 0; ok && i < 2; i++)
        for (size_t j = 0; ok && j < 2; j++) {
            float want = w_in[j * 2 + i];
            if (f64_bias) {
                ok = l[0].w.wq[i * 2 + j] == (double)want && l[0].w.f32[WEIGHTS_WQ] == NULL;
            } else {
                float got = l[0].w.f32[WEIGHTS_WQ][i * 2 + j];
                ok = memcmp(&got, &want, 4) == 0 && l[0].w.wq == NULL &&
                     l[0].w.f32[WEIGHTS_WO][i * 2 + j] == w_out[j * 2 + i] &&
                     l[0].w.f32[WEIGHTS_BV][j] == b_in_f[4 + j];
            }
        }
    checkpoint_layers_free(l, n);
    safetensors_free(&f);
    mem_free(file);
    ASSERT(ok);
}

void test_checkpoint_float32_tensors(void)
{
    run_f32_case(0);
    run_f32_case(1);
    /* a NaN in an F32 tensor is named with its element, as in any other */
    float w_in[12] = {0};
    w_in[7] = 0.0f / 0.0f;
    const float w_out[4] = {0};
    st_out out[2] = {{"in_proj_weight", 6, 2, NULL, w_in}, {"out_proj.weight", 2, 2, NULL, w_out}};
    size_t len, n = 0;
    unsigned char *file = safetensors_write(out, 2, NULL, 0, &len);
    ASSERT(file != NULL);
    st_file f;
    attn_error err;
    ASSERT_EQ(safetensors_parse(file, len, &f, &err), 0);
    ckpt_layer *l = NULL;
    int rc = extract(&f, CKPT_TORCH_MHA, CKPT_LAYER_NONE, &l, &n, &err);
    safetensors_free(&f);
    mem_free(file);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "not_finite");
    ASSERT(strstr(err.message, "\"in_proj_weight\"") != NULL);
    ASSERT(strstr(err.message, "element 7") != NULL);
    ASSERT(l == NULL);
    /* and in an (in, out) tensor, read by rows: the first bad element in the file's order */
    float m[6] = {1, 2, 3, 4, 0, 6};
    m[4] = 1.0f / 0.0f;
    m[5] = 0.0f / 0.0f;
    st_out one[1] = {{"m", 2, 3, NULL, m}};
    file = safetensors_write(one, 1, NULL, 0, &len);
    ASSERT(file != NULL);
    ASSERT_EQ(safetensors_parse(file, len, &f, &err), 0);
    ckpt_request rq = {.preset = CKPT_NAMES, .layer = CKPT_LAYER_NONE, .max_elements = 100,
                       .names = {"m", "m", "m"}};
    rc = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err);
    safetensors_free(&f);
    mem_free(file);
    ASSERT_EQ(rc, ERR_BAD_REQUEST);
    ASSERT(strstr(err.message, "an infinity at element 4") != NULL);
}

/* torch_mha of E x E float32 parts in spans on a pool of two slots (checkpoint.c,
 * fill_part): for E = 256 and 200 (not a multiple of a span), every number of every part
 * is the file's, given back or not; with a bad number in each span of wk, the one named is
 * the first in the file (the first span's), and with one in the second span alone, that
 * one. */
static void run_spans_case(size_t e, int release)
{
    size_t len, n = 0;
    float *w_in = malloc(3 * e * e * sizeof *w_in), *w_out = malloc(e * e * sizeof *w_out);
    ASSERT(w_in != NULL && w_out != NULL);
    for (size_t k = 0; k < 3 * e * e; k++)
        w_in[k] = (float)k * 0.5f;
    for (size_t k = 0; k < e * e; k++)
        w_out[k] = -(float)k;
    st_out out[2] = {{"in_proj_weight", 3 * e, e, NULL, w_in}, {"out_proj.weight", e, e, NULL, w_out}};
    unsigned char *file = safetensors_write(out, 2, NULL, 0, &len);
    free(w_in);
    free(w_out);
    ASSERT(file != NULL);
    st_file f;
    attn_error err;
    ASSERT_EQ(safetensors_parse(file, len, &f, &err), 0);
    ckpt_request rq = {.preset = CKPT_TORCH_MHA, .layer = CKPT_LAYER_NONE,
                       .max_elements = 10000000, .release_body = release};
    ckpt_layer *l = NULL;
    int rc = checkpoint_extract(&f, &rq, NULL, NULL, &l, &n, &err);
    int ok = rc == 0 && n == 1 && l[0].w.elem == WEIGHTS_F32;
    /* the file's numbers are computed again: with release, its pages are given back */
    for (size_t i = 0; ok && i < e; i++)
        for (size_t j = 0; j < e; j++)
            ok = ok && l[0].w.f32[WEIGHTS_WQ][i * e + j] == (float)(j * e + i) * 0.5f &&
                 l[0].w.f32[WEIGHTS_WV][i * e + j] == (float)((2 * e + j) * e + i) * 0.5f &&
                 l[0].w.f32[WEIGHTS_WO][i * e + j] == -(float)(j * e + i);
    checkpoint_layers_free(l, n);
    safetensors_free(&f);
    mem_free(file);
    ASSERT(ok);
}

static int spans_bad_at(size_t e, const size_t *bad, size_t nbad, attn_error *err)
{
    size_t len, n = 0;
    float *w_in = calloc(3 * e * e, sizeof *w_in), *w_out = calloc(e * e, sizeof *w_out);
    if (w_in == NULL || w_out == NULL)
        return -1;
    for (size_t k = 0; k < nbad; k++)
        w_in[bad[k]] = 0.0f / 0.0f;
    st_out out[2] = {{"in_proj_weight", 3 * e, e, NULL, w_in}, {"out_proj.weight", e, e, NULL, w_out}};
    unsigned char *file = safetensors_write(out, 2, NULL, 0, &len);
    free(w_in);
    free(w_out);
    st_file f;
    if (file == NULL || safetensors_parse(file, len, &f, err) != 0)
        return -1;
    ckpt_layer *l = NULL;
    int rc = extract(&f, CKPT_TORCH_MHA, CKPT_LAYER_NONE, &l, &n, err);
    checkpoint_layers_free(l, n);
    safetensors_free(&f);
    mem_free(file);
    return rc;
}

void test_checkpoint_spans_on_pool(void)
{
    ASSERT_EQ(compute_init(2), 0);
    run_spans_case(256, 0);
    run_spans_case(256, 1);
    run_spans_case(200, 1);
    /* wk is rows [256, 512) of in_proj_weight: its spans are rows 256-383 and 384-511 */
    const size_t e = 256, first = (e + 10) * e + 3, second = (e + 200) * e + 7;
    size_t both[2] = {second, first};
    attn_error err;
    int rc_both = spans_bad_at(e, both, 2, &err);
    char msg_both[sizeof err.message];
    memcpy(msg_both, err.message, sizeof msg_both);
    int rc_second = spans_bad_at(e, &both[0], 1, &err);
    compute_shutdown();
    char want[64];
    ASSERT_EQ(rc_both, ERR_BAD_REQUEST);
    snprintf(want, sizeof want, "NaN at element %zu;", first);
    ASSERT(strstr(msg_both, want) != NULL);
    ASSERT_EQ(rc_second, ERR_BAD_REQUEST);
    snprintf(want, sizeof want, "NaN at element %zu;", second);
    ASSERT(strstr(err.message, want) != NULL);
}

/* A header longer than CKPT_MAX_HEADER_BYTES is refused from its length word alone; one
 * at the limit, or a length past the body (a damaged file, for safetensors_parse to name),
 * is let through. */
void test_checkpoint_header_admit(void)
{
    size_t len = 8 + CKPT_MAX_HEADER_BYTES + 16;
    unsigned char *buf = calloc(1, len);
    ASSERT(buf != NULL);
    attn_error err;
    unsigned long long lengths[] = {CKPT_MAX_HEADER_BYTES, CKPT_MAX_HEADER_BYTES + 1, 1ull << 40};
    int want[] = {0, ERR_TOO_LARGE, 0};
    for (size_t i = 0; i < 3; i++) {
        for (int b = 0; b < 8; b++)
            buf[b] = (unsigned char)(lengths[i] >> (8 * b));
        error_clear(&err);
        ASSERT_EQ(checkpoint_header_admit(buf, len, &err), want[i]);
        if (want[i] != 0) {
            ASSERT_STR_EQ(err.code, "header_too_large");
            ASSERT_STR_EQ(err.field, "body");
        }
    }
    ASSERT_EQ(checkpoint_header_admit(buf, 7, &err), 0);
    free(buf);
}

/*
 * v2test.c - the Open Inference Protocol v2 over the wire: it starts the real server on
 * free loopback ports and checks every v2 endpoint, both kinds of model (the
 * built-in "attention" and a stored weight set) with JSON data (flat and nested) and with
 * binary tensors both ways, against the v1 answer for the same numbers and against the
 * float64 reference (tests/ref), then the framing errors of binary bodies, the limits,
 * /metrics and draining.  What one request and its answer can say (health, readiness, the
 * 404s and 405, the CORS preflight, the errors of JSON bodies) is case data instead:
 * tests/integration/cases/v2.json, run by itest.  Servers, counting and --filter are the
 * integration harness's (itest.h).
 *
 * The binary requests are built as the protocol text describes them, which is also what
 * the Triton Python HTTP client (tritonclient.http) sends: the JSON header, then each
 * binary input's raw little-endian row-major bytes in input order, the header's length
 * in Inference-Header-Content-Length and each input's byte count in
 * parameters.binary_data_size. The client library itself is not used, so that the suite
 * needs nothing beyond curl and jansson.
 *
 * Output: "ok   NAME" or "FAIL NAME: reason" per test, then "N passed, N failed".
 * Run:   build/v2test --server build/attention-server [--filter SUBSTR]
 */
#include "itest.h"

/* ---- servers --------------------------------------------------------------------------- */

/* The kinds of server this suite starts (itest_server.c starts and stops them). */
static const char *const g_default_args[] = {"--quiet", NULL};
static const char *const g_small_limits_args[] = {"--quiet", "--max-body", "8K", "--max-elements", "1000", NULL};
static const char *const g_small_memory_args[] = {"--quiet", "--max-request-memory", "1M", NULL};
static const char *const g_small_budget_args[] = {"--quiet", "--max-memory", "48M", NULL};
/* The drain test's grace is far longer than its upload and computation take on a busy
 * machine: it checks what is answered while draining, not how fast. */
static const char *const g_drain_args[] = {"--quiet", "--shutdown-grace", "60", NULL};
static const struct server_kind g_default_kind = {"default", g_default_args, g_no_strings};
static const struct server_kind g_small_limits_kind = {"small-limits", g_small_limits_args, g_no_strings};
static const struct server_kind g_small_memory_kind = {"small-memory", g_small_memory_args, g_no_strings};
static const struct server_kind g_small_budget_kind = {"small-budget", g_small_budget_args, g_no_strings};
static const struct server_kind g_drain_kind = {"drain", g_drain_args, g_no_strings};

/* Starts a server of that kind; reports "server/LABEL/start". Returns 0 when it is up. */
static int v2_server_start(struct server *s, const struct server_kind *kind)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return server_start(s);
}

/* ---- requests -------------------------------------------------------------------------- */

static void call(const struct server *s, const char *method, const char *path, const char *body, size_t len,
                 const char *header_length, struct client_response *r)
{
    struct client_request rq = {.method = method, .path = path, .body = body, .body_len = len};
    char h[96];
    if (header_length != NULL) {
        snprintf(h, sizeof h, "Inference-Header-Content-Length: %s", header_length);
        rq.headers[0] = h;
        rq.headers[1] = "Content-Type: application/octet-stream";
    }
    client_http_call(s->base_url, g_tmpdir, &rq, r);
}

static void get(const struct server *s, const char *path, struct client_response *r)
{
    call(s, "GET", path, NULL, 0, NULL, r);
}

/* A JSON header (stolen) followed by binary bytes: the body of a binary request. */
struct body {
    char *data;
    size_t len, json_len;
};

static void body_start(struct body *b, json_t *header)
{
    char *text = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    b->json_len = b->len = strlen(text);
    b->data = text;
}

static void body_append(struct body *b, const void *bytes, size_t n)
{
    b->data = client_xrealloc(b->data, b->len + n + 1);
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
}

/* POSTs b to path, with Inference-Header-Content-Length when binary (b has bytes after
 * its JSON or force_header). */
static void post_body(const struct server *s, const char *path, const struct body *b, int force_header,
                      struct client_response *r)
{
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", b->json_len);
    call(s, "POST", path, b->data, b->len, b->len > b->json_len || force_header ? hl : NULL, r);
}

/* Little-endian bytes of n numbers as FP32 or FP64. */
static void put_numbers(struct body *b, const double *x, size_t n, int fp32)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char p[8];
        if (fp32) {
            float f = (float)x[i];
            uint32_t u;
            memcpy(&u, &f, 4);
            for (int k = 0; k < 4; k++)
                p[k] = (unsigned char)(u >> (8 * k));
        } else {
            uint64_t u;
            memcpy(&u, &x[i], 8);
            for (int k = 0; k < 8; k++)
                p[k] = (unsigned char)(u >> (8 * k));
        }
        body_append(b, p, fp32 ? 4 : 8);
    }
}

static json_t *shape_json(const size_t *dims, size_t rank)
{
    json_t *a = json_array();
    for (size_t i = 0; i < rank; i++)
        json_array_append_new(a, json_integer((json_int_t)dims[i]));
    return a;
}

/* Nested JSON arrays of x with the given shape (depth-first). */
static json_t *nested(const double *x, const size_t *dims, size_t rank, size_t *pos, int as_bool)
{
    json_t *a = json_array();
    for (size_t i = 0; i < dims[0]; i++) {
        if (rank == 1)
            json_array_append_new(a, as_bool ? json_boolean(x[(*pos)++] != 0) : json_real(x[(*pos)++]));
        else
            json_array_append_new(a, nested(x, dims + 1, rank - 1, pos, as_bool));
    }
    return a;
}

enum encoding { ENC_FLAT, ENC_NESTED, ENC_BINARY };
static const char *const enc_names[] = {"json-flat", "json-nested", "binary"};

/* One input of a request being built. */
struct input {
    const char *name;
    const double *x;
    size_t dims[3];
    size_t rank;
    int is_bool;
};

static size_t count_of(const size_t *dims, size_t rank)
{
    size_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

/* Builds an infer body for inputs in the given encoding and datatype. params and outputs
 * (may be NULL) are stolen. */
static void build_infer(struct body *b, const struct input *in, size_t n_in, enum encoding enc, int fp32,
                        json_t *params, json_t *outputs)
{
    json_t *hdr = json_object(), *inputs = json_array();
    for (size_t i = 0; i < n_in; i++) {
        json_t *o = json_object();
        size_t n = count_of(in[i].dims, in[i].rank);
        json_object_set_new(o, "name", json_string(in[i].name));
        json_object_set_new(o, "shape", shape_json(in[i].dims, in[i].rank));
        json_object_set_new(o, "datatype", json_string(in[i].is_bool ? "BOOL" : fp32 ? "FP32" : "FP64"));
        if (enc == ENC_BINARY) {
            size_t size = n * (in[i].is_bool ? 1 : fp32 ? 4 : 8);
            json_object_set_new(o, "parameters", json_pack("{s:I}", "binary_data_size", (json_int_t)size));
        } else if (enc == ENC_NESTED) {
            size_t pos = 0;
            json_object_set_new(o, "data", nested(in[i].x, in[i].dims, in[i].rank, &pos, in[i].is_bool));
        } else {
            size_t flat[1] = {n}, pos = 0;
            json_object_set_new(o, "data", nested(in[i].x, flat, 1, &pos, in[i].is_bool));
        }
        json_array_append_new(inputs, o);
    }
    json_object_set_new(hdr, "id", json_string("v2test"));
    json_object_set_new(hdr, "inputs", inputs);
    if (params != NULL)
        json_object_set_new(hdr, "parameters", params);
    if (outputs != NULL)
        json_object_set_new(hdr, "outputs", outputs);
    body_start(b, hdr);
    if (enc != ENC_BINARY)
        return;
    for (size_t i = 0; i < n_in; i++) {
        size_t n = count_of(in[i].dims, in[i].rank);
        if (in[i].is_bool) {
            for (size_t j = 0; j < n; j++) {
                unsigned char c = in[i].x[j] != 0;
                body_append(b, &c, 1);
            }
        } else {
            put_numbers(b, in[i].x, n, fp32);
        }
    }
}

/* An answer split into its JSON header and its binary section. */
struct answer {
    json_t *header;
    const unsigned char *bin;
    size_t bin_len;
};

static int answer_parse(struct test *t, const struct client_response *r, struct answer *a)
{
    memset(a, 0, sizeof *a);
    if (!expect_true(t, r->status == 200, "status %d: %.300s", r->status, r->body))
        return -1;
    const char *hl = client_header(r, "Inference-Header-Content-Length");
    size_t json_len = hl ? strtoull(hl, NULL, 10) : r->body_len;
    if (!expect_true(t, json_len <= r->body_len, "Inference-Header-Content-Length %zu past the body", json_len))
        return -1;
    a->header = json_loadb(r->body, json_len, 0, NULL);
    a->bin = (const unsigned char *)r->body + json_len;
    a->bin_len = r->body_len - json_len;
    if (hl != NULL)
        expect_true(t, strstr(client_header(r, "Content-Type") ? client_header(r, "Content-Type") : "",
                         "application/octet-stream") != NULL, "binary answer without octet-stream type");
    return expect_true(t, a->header != NULL, "answer header is not JSON: %.200s", r->body) ? 0 : -1;
}

/* Reads output `name` of a (JSON data or binary) into a new array of its element count,
 * checking its datatype and shape; NULL (with a failure) when absent or wrong. */
static double *answer_output(struct test *t, const struct answer *a, const char *name, int fp32,
                             const size_t *dims, size_t rank)
{
    json_t *outs = json_object_get(a->header, "outputs");
    size_t offset = 0, n = count_of(dims, rank);
    for (size_t i = 0; i < json_array_size(outs); i++) {
        json_t *o = json_array_get(outs, i);
        json_t *bs = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
        size_t size = bs ? (size_t)json_integer_value(bs) : 0;
        if (strcmp(json_string_value(json_object_get(o, "name")) ?: "", name) != 0) {
            offset += size;
            continue;
        }
        const char *dt = json_string_value(json_object_get(o, "datatype"));
        if (!expect_true(t, dt && !strcmp(dt, fp32 ? "FP32" : "FP64"), "output %s datatype %s", name, dt ? dt : "?"))
            return NULL;
        json_t *shape = json_object_get(o, "shape");
        int shape_ok = json_array_size(shape) == rank;
        for (size_t d = 0; shape_ok && d < rank; d++)
            shape_ok = (size_t)json_integer_value(json_array_get(shape, d)) == dims[d];
        if (!expect_true(t, shape_ok, "output %s has the wrong shape", name))
            return NULL;
        double *x = client_xcalloc(n, sizeof *x);
        if (bs != NULL) {
            if (!expect_true(t, size == n * (fp32 ? 4 : 8) && offset + size <= a->bin_len,
                        "output %s: binary_data_size %zu for %zu elements", name, size, n)) {
                free(x);
                return NULL;
            }
            const unsigned char *p = a->bin + offset;
            for (size_t j = 0; j < n; j++) {
                if (fp32) {
                    uint32_t u = 0;
                    for (int k = 0; k < 4; k++)
                        u |= (uint32_t)p[4 * j + k] << (8 * k);
                    float f;
                    memcpy(&f, &u, 4);
                    x[j] = f;
                } else {
                    uint64_t u = 0;
                    for (int k = 0; k < 8; k++)
                        u |= (uint64_t)p[8 * j + k] << (8 * k);
                    memcpy(&x[j], &u, 8);
                }
            }
            return x;
        }
        json_t *data = json_object_get(o, "data");
        if (!expect_true(t, json_array_size(data) == n, "output %s: data has %zu elements, want %zu", name,
                    json_array_size(data), n)) {
            free(x);
            return NULL;
        }
        for (size_t j = 0; j < n; j++)
            x[j] = json_number_value(json_array_get(data, j));
        return x;
    }
    expect_true(t, 0, "no output %s in the answer", name);
    return NULL;
}

/* Flattens a v1 answer member (nested arrays) into x (n elements). */
static int flatten(const json_t *v, double *x, size_t n, size_t *pos)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (flatten(json_array_get(v, i), x, n, pos) != 0)
                return -1;
        return 0;
    }
    if (!json_is_number(v) || *pos >= n)
        return -1;
    x[(*pos)++] = json_number_value(v);
    return 0;
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* Checks an error answer: the status, {"error": string} naming `field`. */
static void expect_v2_error(struct test *t, const struct client_response *r, int status, const char *field)
{
    expect_true(t, r->status == status, "status %d, want %d: %.300s", r->status, status, r->body);
    json_t *b = json_loadb(r->body, r->body_len, 0, NULL);
    json_t *e = json_object_get(b, "error");
    if (expect_true(t, json_is_string(e), "no {\"error\": string} body: %.300s", r->body) && field != NULL)
        expect_true(t, strstr(json_string_value(e), field) != NULL, "error does not name %s: %s", field,
               json_string_value(e));
    json_decref(b);
}

/* ---- data ------------------------------------------------------------------------------ */

static uint64_t g_rng = 20240607u;

/* Values that are exact in float32, so FP32 and FP64 requests carry the same numbers. */
static double *v2_random_values(size_t n, double scale)
{
    double *x = client_xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (double)(float)(((double)(client_rng_next(&g_rng) >> 11) / 9007199254740992.0 * 2 - 1) * scale);
    return x;
}

/* A v1 request body member: nested arrays of x with the given shape. */
static json_t *v1_tensor(const double *x, const size_t *dims, size_t rank)
{
    size_t pos = 0;
    return nested(x, dims, rank, &pos, 0);
}

/* ---- endpoints ------------------------------------------------------------------------- */

static json_t *get_json(struct test *t, const struct server *s, const char *path, int status)
{
    struct client_response r;
    get(s, path, &r);
    expect_true(t, r.status == status, "GET %s: status %d, want %d: %.200s", path, r.status, status, r.body);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    expect_true(t, j != NULL, "GET %s: body is not JSON", path);
    client_response_free(&r);
    return j;
}

/* Finds the metadata tensor named name in array a. */
static json_t *meta_find(json_t *a, const char *name)
{
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(a, i), "name")) ?: "", name))
            return json_array_get(a, i);
    return NULL;
}

static const char *const g_endpoint_names[] = {
    "endpoint/server-metadata /v2", "endpoint/server-metadata /v2/",
    "endpoint/model-metadata /v2/models/attention", "endpoint/model-metadata /v2/models/attention/versions/1",
    "endpoint/model-config", NULL};

static void run_endpoint_tests(const struct server *s)
{
    if (!any_selected(g_endpoint_names))
        return;
    struct test t;
    json_t *j;
    const char *server_paths[] = {"/v2", "/v2/"};
    for (int i = 0; i < 2; i++) {
        test_begin(&t, "endpoint/server-metadata %s", server_paths[i]);
        j = get_json(&t, s, server_paths[i], 200);
        json_t *ext = json_object_get(j, "extensions");
        int found = 0;
        for (size_t k = 0; k < json_array_size(ext); k++)
            found |= !strcmp(json_string_value(json_array_get(ext, k)) ?: "", "binary_tensor_data");
        expect_true(&t, json_is_string(json_object_get(j, "name")) && json_is_string(json_object_get(j, "version")),
               "name or version missing");
        expect_true(&t, found, "extensions lack binary_tensor_data");
        json_decref(j);
        test_end(&t);
    }
    const char *meta_paths[] = {"/v2/models/attention", "/v2/models/attention/versions/1"};
    for (int i = 0; i < 2; i++) {
        test_begin(&t, "endpoint/model-metadata %s", meta_paths[i]);
        j = get_json(&t, s, meta_paths[i], 200);
        expect_true(&t, !strcmp(json_string_value(json_object_get(j, "name")) ?: "", "attention"), "name");
        expect_true(&t, json_is_string(json_object_get(j, "platform")), "no platform");
        const char *ins[] = {"q", "k", "v", "mask"};
        for (int k = 0; k < 4; k++) {
            json_t *m = meta_find(json_object_get(j, "inputs"), ins[k]);
            expect_true(&t, m != NULL, "input %s missing", ins[k]);
            json_t *shape = json_object_get(m, "shape");
            expect_true(&t, json_array_size(shape) == 2 && json_integer_value(json_array_get(shape, 0)) == -1,
                   "input %s: shape not variable", ins[k]);
        }
        expect_true(&t, meta_find(json_object_get(j, "outputs"), "output") &&
                       meta_find(json_object_get(j, "outputs"), "attention"), "outputs missing");
        json_decref(j);
        test_end(&t);
    }
    test_begin(&t, "endpoint/model-config");
    j = get_json(&t, s, "/v2/models/attention/versions/1/config", 200);
    expect_true(&t, json_integer_value(json_object_get(j, "max_batch_size")) == 0 &&
                   json_is_integer(json_object_get(j, "max_batch_size")), "max_batch_size");
    /* output, attention, the eight reductions of the weights (kernel/attention_reduce.h), and
     * a sequence's received_total, length, kept_positions, lost_mass and output_error */
    expect_true(&t, json_array_size(json_object_get(j, "input")) == 4 && json_array_size(json_object_get(j, "output")) == 15,
           "input/output lists");
    json_decref(j);
    test_end(&t);
}

/* ---- inference against v1 and the reference --------------------------------------------- */

/* One attention case: shapes, heads, mask, causal. */
struct attn_case {
    const char *label;
    size_t batch;       /* 0: no batch axis */
    size_t lq, lk, dk, dv, heads;
    int mask, causal;
    int mask_first;     /* the mask is the first input, so binary q, k, v follow its bytes */
};

static const struct attn_case g_cases[] = {
    {"plain", 0, 5, 7, 4, 3, 0, 0, 0, 0},
    {"batched-heads-mask", 2, 4, 6, 6, 4, 2, 1, 0, 0},
    {"causal-scale", 0, 6, 6, 8, 8, 4, 0, 1, 0},
    /* 35 mask bytes first: binary FP32 q, k and v lie off a float's alignment, where the
     * server copies them; in the cases above they follow the header, which the server
     * places on a cache line and reads them where they are (v2_tensor_view_floats). */
    {"mask-first", 0, 5, 7, 4, 3, 0, 1, 0, 1},
};

/* Compares got with v1's member (nested) and with the reference; FP32 tolerances are
 * those of float32 arithmetic. */
static void compare_all(struct test *t, const char *what, const double *got, const json_t *v1_member,
                        const double *ref, size_t n, int fp32)
{
    double *v1 = client_xcalloc(n, sizeof *v1);
    size_t pos = 0;
    if (expect_true(t, flatten(v1_member, v1, n, &pos) == 0 && pos == n, "v1 %s has not %zu numbers", what, n)) {
        double d = max_diff(got, v1, n);
        expect_true(t, d <= (fp32 ? 1e-6 : 1e-12), "%s differs from v1's by %g", what, d);
    }
    double dr = max_diff(got, ref, n);
    expect_true(t, dr <= (fp32 ? 1e-4 : 1e-9), "%s differs from the reference by %g", what, dr);
    free(v1);
}

/* The name of the test of one attention case, precision, encoding and answer kind. */
static void attention_test_name(char *name, size_t cap, const struct attn_case *ac, int fp32, int enc,
                                int bin_out)
{
    snprintf(name, cap, "infer/attention/%s/%s/%s/%s", ac->label, fp32 ? "FP32" : "FP64", enc_names[enc],
             bin_out ? "binary-out" : "json-out");
}

/* Returns 1 when --filter selects a test of case ac in that precision. */
static int attention_case_selected(const struct attn_case *ac, int fp32)
{
    char name[256];
    for (int enc = ENC_FLAT; enc <= ENC_BINARY; enc++)
        for (int bin_out = 0; bin_out <= 1; bin_out++) {
            attention_test_name(name, sizeof name, ac, fp32, enc, bin_out);
            if (harness_selected(name))
                return 1;
        }
    return 0;
}

/* One case's numbers, as sent, and the reference's answer for them. */
struct attn_data {
    double *q, *k, *v, *mask, *ref_out, *ref_attn;
    unsigned char *mask_b;
    double scale;
    size_t n_out, n_attn;
    struct input in[4];     /* q, k, v, mask */
    struct input sent[4];   /* the inputs in the order they are sent */
    size_t n_in;
    size_t md[3];
    size_t out_dims[3], out_rank, attn_d[4], attn_rank;
    const size_t *out_d;
};

/* Makes case ac's random q, k, v and mask, the reference's output and attention, and the
 * shapes of the inputs and of the expected answer. */
static void attention_case_prepare(const struct attn_case *ac, struct attn_data *d)
{
    size_t B = ac->batch ? ac->batch : 1, H = ac->heads ? ac->heads : 1;
    d->q = v2_random_values(B * ac->lq * ac->dk, 1.5), d->k = v2_random_values(B * ac->lk * ac->dk, 1.5);
    d->v = v2_random_values(B * ac->lk * ac->dv, 2.0);
    d->mask = client_xcalloc(ac->lq * ac->lk, sizeof *d->mask);
    d->mask_b = client_xcalloc(B * ac->lq * ac->lk, 1);
    for (size_t i = 0; i < ac->lq * ac->lk; i++)
        d->mask[i] = ac->mask ? (i % 3 != 1) : 1;
    for (size_t b = 0; b < B; b++)
        for (size_t i = 0; i < ac->lq * ac->lk; i++)
            d->mask_b[b * ac->lq * ac->lk + i] = d->mask[i] != 0;
    d->scale = ac->causal ? 0.25 : ref_default_scale(ac->dk / H);
    d->n_out = B * ac->lq * ac->dv, d->n_attn = B * H * ac->lq * ac->lk;
    d->ref_out = client_xcalloc(d->n_out, sizeof(double)), d->ref_attn = client_xcalloc(d->n_attn, sizeof(double));
    ref_sdpa(B, H, ac->lq, ac->lk, ac->dk / H, ac->dv / H, d->q, d->k, d->v, d->mask_b, ac->causal, d->scale,
             d->ref_out, d->ref_attn);

    size_t off = ac->batch ? 0 : 1;
    size_t qd[3] = {B, ac->lq, ac->dk}, kd[3] = {B, ac->lk, ac->dk}, vd[3] = {B, ac->lk, ac->dv};
    d->md[0] = ac->lq, d->md[1] = ac->lk, d->md[2] = 0;
    struct input in[4] = {{"q", d->q, {0}, 3 - off, 0}, {"k", d->k, {0}, 3 - off, 0}, {"v", d->v, {0}, 3 - off, 0},
                          {"mask", d->mask, {0}, 2, 1}};
    memcpy(in[0].dims, qd + off, (3 - off) * sizeof(size_t));
    memcpy(in[1].dims, kd + off, (3 - off) * sizeof(size_t));
    memcpy(in[2].dims, vd + off, (3 - off) * sizeof(size_t));
    memcpy(in[3].dims, d->md, 2 * sizeof(size_t));
    memcpy(d->in, in, sizeof in);
    d->n_in = ac->mask ? 4 : 3;
    for (size_t i = 0; i < d->n_in; i++)
        d->sent[i] = d->in[ac->mask_first ? (i + d->n_in - 1) % d->n_in : i];

    d->out_dims[0] = B, d->out_dims[1] = ac->lq, d->out_dims[2] = ac->dv;
    d->out_rank = 3 - off;
    d->out_d = d->out_dims + off;
    d->attn_rank = 4 - off - (ac->heads ? 0 : 1);
    size_t r = 0;
    if (ac->batch)
        d->attn_d[r++] = B;
    if (ac->heads)
        d->attn_d[r++] = H;
    d->attn_d[r++] = ac->lq;
    d->attn_d[r++] = ac->lk;
}

/* Asks v1 for the same numbers in that precision; the caller frees r1. */
static json_t *attention_case_v1(const struct server *s, const struct attn_case *ac, const struct attn_data *d,
                                 int fp32, struct client_response *r1)
{
    json_t *v1req = json_object();
    json_object_set_new(v1req, "q", v1_tensor(d->q, d->in[0].dims, d->in[0].rank));
    json_object_set_new(v1req, "k", v1_tensor(d->k, d->in[1].dims, d->in[1].rank));
    json_object_set_new(v1req, "v", v1_tensor(d->v, d->in[2].dims, d->in[2].rank));
    if (ac->mask)
        json_object_set_new(v1req, "mask", v1_tensor(d->mask, d->md, 2));
    if (ac->heads)
        json_object_set_new(v1req, "heads", json_integer((json_int_t)ac->heads));
    if (ac->causal) {
        json_object_set_new(v1req, "causal", json_true());
        json_object_set_new(v1req, "scale", json_real(d->scale));
    }
    json_object_set_new(v1req, "dtype", json_string(fp32 ? "float32" : "float64"));
    char *text = json_dumps(v1req, JSON_COMPACT);
    json_decref(v1req);
    call(s, "POST", "/v1/attention", text, strlen(text), NULL, r1);
    free(text);
    return json_loadb(r1->body, r1->body_len, 0, NULL);
}

/* The test infer/attention/CASE/PRECISION/ENCODING/ANSWER: v2's answer equals v1's (r1,
 * v1) and the reference's. */
static void attention_case_check(const struct server *s, const struct attn_case *ac, const struct attn_data *d,
                                 int fp32, int enc, int bin_out, const struct client_response *r1, const json_t *v1)
{
    struct test t;
    char name[256];
    attention_test_name(name, sizeof name, ac, fp32, enc, bin_out);
    if (!test_begin(&t, "%s", name))
        return;
    expect_true(&t, r1->status == 200, "v1 answered %d: %.200s", r1->status, r1->body);
    json_t *params = json_object();
    if (ac->heads)
        json_object_set_new(params, "heads", json_integer((json_int_t)ac->heads));
    if (ac->causal) {
        json_object_set_new(params, "causal", json_true());
        json_object_set_new(params, "scale", json_real(d->scale));
    }
    json_t *outputs = NULL;
    if (bin_out && enc == ENC_FLAT)
        json_object_set_new(params, "binary_data_output", json_true());
    else
        outputs = json_pack("[{s:s, s:{s:b}}, {s:s, s:{s:b}}]", "name", "attention", "parameters",
                            "binary_data", bin_out, "name", "output", "parameters", "binary_data", bin_out);
    struct body b;
    build_infer(&b, d->sent, d->n_in, (enum encoding)enc, fp32, params, outputs);
    struct client_response r2;
    post_body(s, "/v2/models/attention/infer", &b, 0, &r2);
    free(b.data);
    struct answer a;
    if (answer_parse(&t, &r2, &a) == 0) {
        expect_true(&t, !strcmp(json_string_value(json_object_get(a.header, "model_name")) ?: "", "attention"),
                    "model_name");
        expect_true(&t, !strcmp(json_string_value(json_object_get(a.header, "id")) ?: "", "v2test"),
                    "id not echoed");
        expect_true(&t, (client_header(&r2, "Inference-Header-Content-Length") != NULL) == bin_out,
                    "Inference-Header-Content-Length %s", bin_out ? "missing" : "present");
        double *o = answer_output(&t, &a, "output", fp32, d->out_d, d->out_rank);
        double *at = answer_output(&t, &a, "attention", fp32, d->attn_d, d->attn_rank);
        if (o)
            compare_all(&t, "output", o, json_object_get(v1, "output"), d->ref_out, d->n_out, fp32);
        if (at)
            compare_all(&t, "attention", at, json_object_get(v1, "attention"), d->ref_attn, d->n_attn, fp32);
        free(o);
        free(at);
        json_decref(a.header);
    }
    client_response_free(&r2);
    test_end(&t);
}

/* The tests infer/attention/CASE/...: every encoding and answer kind of one case, in both
 * precisions, against v1's answer for the same numbers and the reference. */
static void run_attention_case(const struct server *s, const struct attn_case *ac)
{
    if (!attention_case_selected(ac, 0) && !attention_case_selected(ac, 1))
        return;
    struct attn_data d;
    attention_case_prepare(ac, &d);
    for (int fp32 = 0; fp32 <= 1; fp32++) {
        if (!attention_case_selected(ac, fp32))
            continue;
        struct client_response r1;
        json_t *v1 = attention_case_v1(s, ac, &d, fp32, &r1);
        for (int enc = ENC_FLAT; enc <= ENC_BINARY; enc++)
            for (int bin_out = 0; bin_out <= 1; bin_out++)
                attention_case_check(s, ac, &d, fp32, enc, bin_out, &r1, v1);
        json_decref(v1);
        client_response_free(&r1);
    }
    free(d.q), free(d.k), free(d.v), free(d.mask), free(d.mask_b), free(d.ref_out), free(d.ref_attn);
}

/* Only the output named: no attention in the answer. */
static void run_outputs_only_output_test(const struct server *s)
{
    struct test t;
    if (!test_begin(&t, "infer/attention/outputs-only-output"))
        return;
    double *q = v2_random_values(6, 1);
    struct input in[3] = {{"q", q, {3, 2}, 2, 0}, {"k", q, {3, 2}, 2, 0}, {"v", q, {3, 2}, 2, 0}};
    struct body b;
    build_infer(&b, in, 3, ENC_BINARY, 1, NULL, json_pack("[{s:s}]", "name", "output"));
    struct client_response r;
    post_body(s, "/v2/models/attention/infer", &b, 0, &r);
    free(b.data);
    struct answer a;
    if (answer_parse(&t, &r, &a) == 0) {
        json_t *outs = json_object_get(a.header, "outputs");
        expect_true(&t, json_array_size(outs) == 1 &&
                       !strcmp(json_string_value(json_object_get(json_array_get(outs, 0), "name")) ?: "", "output"),
               "outputs: %.200s", r.body);
        json_decref(a.header);
    }
    client_response_free(&r);
    free(q);
    test_end(&t);
}

/* JSON numbers are numbers however they are written: an integer past 2^63 in data, and
 * shape and heads written as 2.0, give the answer the same values give written otherwise. */
static void run_integers_of_any_size_test(const struct server *s)
{
    struct test t;
    struct client_response r;
    if (!test_begin(&t, "infer/attention/integers-of-any-size"))
        return;
    static const char big[] =
        "{\"inputs\":[{\"name\":\"q\",\"shape\":[1,1],\"datatype\":\"FP64\",\"data\":[0]},"
        "{\"name\":\"k\",\"shape\":[2.0,1],\"datatype\":\"FP64\",\"data\":[1,1]},"
        "{\"name\":\"v\",\"shape\":[2,1],\"datatype\":\"FP64\","
        "\"data\":[9223372036854775808,123456789012345678901234567890]}],"
        "\"parameters\":{\"heads\":1.0}}";
    call(s, "POST", "/v2/models/attention/infer", big, strlen(big), NULL, &r);
    json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    json_t *out = NULL;
    for (size_t i = 0; j != NULL && i < json_array_size(json_object_get(j, "outputs")); i++) {
        json_t *o = json_array_get(json_object_get(j, "outputs"), i);
        if (!strcmp(json_string_value(json_object_get(o, "name")) ?: "", "output"))
            out = json_object_get(o, "data");
    }
    double want = (9223372036854775808.0 + 123456789012345678901234567890.0) / 2;
    double got = out != NULL ? json_number_value(json_array_get(out, 0)) : NAN;
    expect_true(&t, r.status == 200 && fabs(got - want) <= 1e-12 * want, "status %d, output %.17g, want %.17g: %.200s",
           r.status, got, want, r.body ? r.body : "");
    json_decref(j);
    client_response_free(&r);
    test_end(&t);
}

/* Returns 1 when --filter chooses a test of the infer/attention group. */
static int attention_tests_chosen(void)
{
    for (size_t c = 0; c < sizeof g_cases / sizeof g_cases[0]; c++)
        if (attention_case_selected(&g_cases[c], 0) || attention_case_selected(&g_cases[c], 1))
            return 1;
    return harness_selected("infer/attention/outputs-only-output") ||
           harness_selected("infer/attention/integers-of-any-size");
}

static void run_attention_tests(const struct server *s)
{
    for (size_t c = 0; c < sizeof g_cases / sizeof g_cases[0]; c++)
        run_attention_case(s, &g_cases[c]);
    run_outputs_only_output_test(s);
    run_integers_of_any_size_test(s);
}

/* ---- a stored weight set as a model ---------------------------------------------------- */

#define SET_DIN 5
#define SET_DCTX 3
#define SET_DK 4
#define SET_DV 6
#define SET_DOUT 2
#define SET_HEADS 2

/* The weights of the set "crossA" and an input batch: x (2 x 4 x SET_DIN) attends to
 * context (2 x 5 x SET_DCTX). */
struct set_weights {
    double *wq, *wk, *wv, *wo, *bo;
    double *xv, *cv;
};
#define SET_B 2
#define SET_LQ 4
#define SET_LK 5

/* weight-set/put: stores crossA through v1.  It runs whenever the group does: the other
 * tests of the group read or infer with the set. */
static void weight_set_put(const struct server *s, struct set_weights *w)
{
    struct test t;
    w->wq = v2_random_values(SET_DIN * SET_DK, 0.7), w->wk = v2_random_values(SET_DCTX * SET_DK, 0.7);
    w->wv = v2_random_values(SET_DCTX * SET_DV, 0.7), w->wo = v2_random_values(SET_DV * SET_DOUT, 0.7);
    w->bo = v2_random_values(SET_DOUT, 0.5);
    size_t dq[2] = {SET_DIN, SET_DK}, dkk[2] = {SET_DCTX, SET_DK}, dvv[2] = {SET_DCTX, SET_DV},
           doo[2] = {SET_DV, SET_DOUT}, db[1] = {SET_DOUT};
    json_t *set = json_object();
    json_object_set_new(set, "wq", v1_tensor(w->wq, dq, 2));
    json_object_set_new(set, "wk", v1_tensor(w->wk, dkk, 2));
    json_object_set_new(set, "wv", v1_tensor(w->wv, dvv, 2));
    json_object_set_new(set, "wo", v1_tensor(w->wo, doo, 2));
    json_object_set_new(set, "bo", v1_tensor(w->bo, db, 1));
    json_object_set_new(set, "heads", json_integer(SET_HEADS));
    char *text = json_dumps(set, JSON_COMPACT);
    json_decref(set);
    struct client_response r;
    test_begin(&t, "weight-set/put");
    call(s, "PUT", "/v1/weight-sets/crossA", text, strlen(text), NULL, &r);
    expect_true(&t, r.status == 201 || r.status == 200, "PUT answered %d: %.200s", r.status, r.body);
    client_response_free(&r);
    free(text);
    test_end(&t);
    w->xv = v2_random_values(SET_B * SET_LQ * SET_DIN, 1);
    w->cv = v2_random_values(SET_B * SET_LK * SET_DCTX, 1);
}

/* weight-set/metadata-widths and weight-set/ready-and-config: the set as a v2 model. */
static void weight_set_metadata(const struct server *s)
{
    struct test t;
    test_begin(&t, "weight-set/metadata-widths");
    json_t *j = get_json(&t, s, "/v2/models/crossA", 200);
    json_t *x = meta_find(json_object_get(j, "inputs"), "x");
    json_t *ctx = meta_find(json_object_get(j, "inputs"), "context");
    json_t *out = meta_find(json_object_get(j, "outputs"), "output");
    json_t *att = meta_find(json_object_get(j, "outputs"), "attention");
    expect_true(&t, json_integer_value(json_array_get(json_object_get(x, "shape"), 1)) == SET_DIN, "x width");
    expect_true(&t, json_integer_value(json_array_get(json_object_get(ctx, "shape"), 1)) == SET_DCTX, "context width");
    expect_true(&t, json_integer_value(json_array_get(json_object_get(out, "shape"), 1)) == SET_DOUT, "output width");
    expect_true(&t, json_integer_value(json_array_get(json_object_get(att, "shape"), 0)) == SET_HEADS, "attention heads");
    json_decref(j);
    test_end(&t);
    test_begin(&t, "weight-set/ready-and-config");
    j = get_json(&t, s, "/v2/models/crossA/ready", 200);
    json_decref(j);
    j = get_json(&t, s, "/v2/models/crossA/config", 200);
    expect_true(&t, json_array_size(json_object_get(j, "input")) == 3, "config inputs");
    json_decref(j);
    test_end(&t);
}

/* infer/weight-set/PRECISION/ENCODING: the set by name over v2 equals v1's answer and the
 * reference (the projections, attention and output projection computed here). */
static void weight_set_infer(const struct server *s, const struct set_weights *w)
{
    struct test t;
    struct client_response r;
    size_t B = SET_B, LQ = SET_LQ, LK = SET_LK;
    const double *xv = w->xv, *cv = w->cv;
    double *Q = client_xcalloc(B * LQ * SET_DK, sizeof(double)), *K = client_xcalloc(B * LK * SET_DK, sizeof(double));
    double *V = client_xcalloc(B * LK * SET_DV, sizeof(double)), *O = client_xcalloc(B * LQ * SET_DV, sizeof(double));
    double *A = client_xcalloc(B * SET_HEADS * LQ * LK, sizeof(double));
    double *Y = client_xcalloc(B * LQ * SET_DOUT, sizeof(double));
    ref_linear(B * LQ, SET_DIN, SET_DK, xv, w->wq, NULL, Q);
    ref_linear(B * LK, SET_DCTX, SET_DK, cv, w->wk, NULL, K);
    ref_linear(B * LK, SET_DCTX, SET_DV, cv, w->wv, NULL, V);
    ref_sdpa(B, SET_HEADS, LQ, LK, SET_DK / SET_HEADS, SET_DV / SET_HEADS, Q, K, V, NULL, 0,
             ref_default_scale(SET_DK / SET_HEADS), O, A);
    ref_linear(B * LQ, SET_DV, SET_DOUT, O, w->wo, w->bo, Y);
    size_t xd[3] = {B, LQ, SET_DIN}, cd[3] = {B, LK, SET_DCTX};
    for (int fp32 = 0; fp32 <= 1; fp32++) {
        json_t *v1req = json_pack("{s:o, s:o, s:s, s:s}", "x", v1_tensor(xv, xd, 3), "context", v1_tensor(cv, cd, 3),
                                  "weights", "crossA", "dtype", fp32 ? "float32" : "float64");
        char *text = json_dumps(v1req, JSON_COMPACT);
        json_decref(v1req);
        struct client_response r1;
        call(s, "POST", "/v1/attention", text, strlen(text), NULL, &r1);
        free(text);
        json_t *v1 = json_loadb(r1.body, r1.body_len, 0, NULL);
        for (int enc = ENC_FLAT; enc <= ENC_BINARY; enc++) {
            test_begin(&t, "infer/weight-set/%s/%s", fp32 ? "FP32" : "FP64", enc_names[enc]);
            expect_true(&t, r1.status == 200, "v1 answered %d: %.200s", r1.status, r1.body);
            struct input in[2] = {{"x", xv, {B, LQ, SET_DIN}, 3, 0}, {"context", cv, {B, LK, SET_DCTX}, 3, 0}};
            struct body b;
            build_infer(&b, in, 2, (enum encoding)enc, fp32, json_pack("{s:b}", "binary_data_output", enc == ENC_BINARY),
                        NULL);
            post_body(s, "/v2/models/crossA/versions/1/infer", &b, 0, &r);
            free(b.data);
            struct answer a;
            if (answer_parse(&t, &r, &a) == 0) {
                size_t od[3] = {B, LQ, SET_DOUT}, ad[4] = {B, SET_HEADS, LQ, LK};
                double *o = answer_output(&t, &a, "output", fp32, od, 3);
                double *at = answer_output(&t, &a, "attention", fp32, ad, 4);
                if (o)
                    compare_all(&t, "output", o, json_object_get(v1, "output"), Y, B * LQ * SET_DOUT, fp32);
                if (at)
                    compare_all(&t, "attention", at, json_object_get(v1, "attention"), A, B * SET_HEADS * LQ * LK,
                                fp32);
                free(o);
                free(at);
                json_decref(a.header);
            }
            client_response_free(&r);
            test_end(&t);
        }
        json_decref(v1);
        client_response_free(&r1);
    }
    free(Q), free(K), free(V), free(O), free(A), free(Y);
}

/* infer/weight-set/wrong-width-400 and heads-conflict-400: what the set fixes is checked. */
static void weight_set_refusals(const struct server *s, const struct set_weights *w)
{
    struct test t;
    struct client_response r;
    test_begin(&t, "infer/weight-set/wrong-width-400");
    struct input bad[1] = {{"x", w->xv, {SET_LQ, SET_DIN - 1}, 2, 0}};
    struct body b;
    build_infer(&b, bad, 1, ENC_BINARY, 1, NULL, NULL);
    post_body(s, "/v2/models/crossA/infer", &b, 0, &r);
    free(b.data);
    expect_v2_error(&t, &r, 400, "x");
    client_response_free(&r);
    test_end(&t);
    test_begin(&t, "infer/weight-set/heads-conflict-400");
    struct input ok1[1] = {{"x", w->xv, {SET_LQ, SET_DIN}, 2, 0}};
    build_infer(&b, ok1, 1, ENC_BINARY, 1, json_pack("{s:i}", "heads", 1), NULL);
    post_body(s, "/v2/models/crossA/infer", &b, 0, &r);
    free(b.data);
    expect_v2_error(&t, &r, 400, "parameters.heads");
    client_response_free(&r);
    test_end(&t);
}

/* The names of the weight-set group's tests. */
static const char *const g_weight_set_names[] = {
    "weight-set/put", "weight-set/metadata-widths", "weight-set/ready-and-config",
    "infer/weight-set/FP64/json-flat", "infer/weight-set/FP64/json-nested", "infer/weight-set/FP64/binary",
    "infer/weight-set/FP32/json-flat", "infer/weight-set/FP32/json-nested", "infer/weight-set/FP32/binary",
    "infer/weight-set/wrong-width-400", "infer/weight-set/heads-conflict-400", NULL};

static void run_v2_weight_set_tests(const struct server *s)
{
    if (!any_selected(g_weight_set_names))
        return;
    struct set_weights w;
    weight_set_put(s, &w);
    weight_set_metadata(s);
    weight_set_infer(s, &w);
    weight_set_refusals(s, &w);
    free(w.wq), free(w.wk), free(w.wv), free(w.wo), free(w.bo), free(w.xv), free(w.cv);
}

/* ---- framing errors -------------------------------------------------------------------- */

/* A valid 2 x 2 FP32 q/k/v binary body to damage; the JSON header comes from hdr. */
static void framing_body(struct body *b, json_t *hdr, int n_inputs_bytes)
{
    body_start(b, hdr);
    double one[4] = {1, 0, 0, 1};
    for (int i = 0; i < n_inputs_bytes; i++)
        put_numbers(b, one, 4, 1);
}

static json_t *qkv_header(const char *dtype_v, int size_q, const char *shape_k)
{
    json_t *shape_k_json = json_loads(shape_k, 0, NULL);
    return json_pack("{s:[{s:s,s:[i,i],s:s,s:{s:i}},{s:s,s:o,s:s,s:{s:i}},{s:s,s:[i,i],s:s,s:{s:i}}]}",
                     "inputs", "name", "q", "shape", 2, 2, "datatype", "FP32", "parameters", "binary_data_size", size_q,
                     "name", "k", "shape", shape_k_json, "datatype", "FP32", "parameters", "binary_data_size", 16,
                     "name", "v", "shape", 2, 2, "datatype", dtype_v, "parameters", "binary_data_size", 16);
}

static void framing_case(const struct server *s, const char *name, struct body *b, const char *header_length,
                         int status, const char *field)
{
    struct test t;
    struct client_response r;
    test_begin(&t, "framing/%s", name);
    call(s, "POST", "/v2/models/attention/infer", b->data, b->len, header_length, &r);
    expect_v2_error(&t, &r, status, field);
    client_response_free(&r);
    free(b->data);
    /* The server goes on serving. */
    get(s, "/v2/health/live", &r);
    expect_true(&t, r.status == 200, "server no longer serves after the error (status %d)", r.status);
    client_response_free(&r);
    test_end(&t);
}

static const char *const g_framing_names[] = {
    "framing/header-length-past-body",
    "framing/header-length-not-a-number",
    "framing/sizes-short-of-body",
    "framing/sizes-past-body",
    "framing/size-disagrees-with-shape",
    "framing/size-disagrees-with-datatype",
    "framing/size-disagrees-with-fp16",
    "framing/unknown-datatype",
    "framing/unsupported-datatype",
    "framing/shape-does-not-fit",
    "framing/shape-zero-dimension",
    "framing/shape-too-many-dimensions",
    "framing/shape-negative",
    "framing/nan-in-binary",
    "framing/inf-in-binary",
    "framing/binary-without-header",
    "framing/bool-byte-not-0-or-1",
    "framing/deep-nesting-names-nesting", NULL};

static void run_framing_tests(const struct server *s)
{
    if (!any_selected(g_framing_names))
        return;
    struct body b;
    char hl[32];
    framing_body(&b, qkv_header("FP32", 16, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.len + 1);
    framing_case(s, "header-length-past-body", &b, hl, 400, "Inference-Header-Content-Length");
    framing_body(&b, qkv_header("FP32", 16, "[2,2]"), 3);
    framing_case(s, "header-length-not-a-number", &b, "12x", 400, "Inference-Header-Content-Length");
    framing_body(&b, qkv_header("FP32", 16, "[2,2]"), 3);
    body_append(&b, "\0\0\0\0", 4);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "sizes-short-of-body", &b, hl, 400, "binary_data_size");
    framing_body(&b, qkv_header("FP32", 16, "[2,2]"), 2);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "sizes-past-body", &b, hl, 400, "binary_data_size");
    framing_body(&b, qkv_header("FP32", 12, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "size-disagrees-with-shape", &b, hl, 400, "inputs[0].parameters.binary_data_size");
    framing_body(&b, qkv_header("FP64", 16, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "size-disagrees-with-datatype", &b, hl, 400, "inputs[2].parameters.binary_data_size");
    /* FP16 numbers are 2 bytes: the 16 bytes of an FP32 2x2 are too many */
    framing_body(&b, qkv_header("FP16", 16, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "size-disagrees-with-fp16", &b, hl, 400, "inputs[2].parameters.binary_data_size");
    framing_body(&b, qkv_header("FP17", 16, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "unknown-datatype", &b, hl, 400, "inputs[2].datatype");
    framing_body(&b, qkv_header("INT32", 16, "[2,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "unsupported-datatype", &b, hl, 400, "inputs[2].datatype");
    framing_body(&b, qkv_header("FP32", 16, "[1,4]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "shape-does-not-fit", &b, hl, 400, "inputs[1].shape");
    framing_body(&b, qkv_header("FP32", 16, "[2,0,2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "shape-zero-dimension", &b, hl, 400, "inputs[1].shape");
    framing_body(&b, qkv_header("FP32", 16, "[1,1,1,1,1]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "shape-too-many-dimensions", &b, hl, 400, "inputs[1].shape");
    framing_body(&b, qkv_header("FP32", 16, "[2,-2]"), 3);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "shape-negative", &b, hl, 400, "inputs[1].shape");

    double nan_v[4] = {1, NAN, 0, 1}, inf_v[4] = {1, 0, INFINITY, 1}, one[4] = {1, 0, 0, 1};
    body_start(&b, qkv_header("FP32", 16, "[2,2]"));
    put_numbers(&b, one, 4, 1), put_numbers(&b, nan_v, 4, 1), put_numbers(&b, one, 4, 1);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "nan-in-binary", &b, hl, 400, "inputs[1]");
    json_t *h64 = json_pack("{s:[{s:s,s:[i,i],s:s,s:{s:i}},{s:s,s:[i,i],s:s,s:{s:i}},{s:s,s:[i,i],s:s,s:{s:i}}]}",
                            "inputs", "name", "q", "shape", 2, 2, "datatype", "FP64", "parameters", "binary_data_size",
                            32, "name", "k", "shape", 2, 2, "datatype", "FP64", "parameters", "binary_data_size", 32,
                            "name", "v", "shape", 2, 2, "datatype", "FP64", "parameters", "binary_data_size", 32);
    body_start(&b, h64);
    put_numbers(&b, one, 4, 0), put_numbers(&b, one, 4, 0), put_numbers(&b, inf_v, 4, 0);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "inf-in-binary", &b, hl, 400, "inputs[2]");

    /* A binary body sent without the header: its JSON part is followed by bytes. */
    framing_body(&b, qkv_header("FP32", 16, "[2,2]"), 3);
    framing_case(s, "binary-without-header", &b, NULL, 400, "Inference-Header-Content-Length");

    /* BOOL bytes other than 0 and 1. */
    json_t *hm = json_pack("{s:[{s:s,s:[i,i],s:s,s:[i]},{s:s,s:[i,i],s:s,s:[i]},{s:s,s:[i,i],s:s,s:[i]},"
                           "{s:s,s:[i,i],s:s,s:{s:i}}]}",
                           "inputs", "name", "q", "shape", 1, 1, "datatype", "FP64", "data", 1, "name", "k", "shape",
                           1, 1, "datatype", "FP64", "data", 1, "name", "v", "shape", 1, 1, "datatype", "FP64", "data",
                           1, "name", "mask", "shape", 1, 1, "datatype", "BOOL", "parameters", "binary_data_size", 1);
    body_start(&b, hm);
    body_append(&b, "\x02", 1);
    snprintf(hl, sizeof hl, "%zu", b.json_len);
    framing_case(s, "bool-byte-not-0-or-1", &b, hl, 400, "inputs[3]");
    /* JSON nested past the parser's depth: the error names the nesting, not the
     * binary framing (the body is all JSON; the header would change nothing). */
    struct test t;
    struct client_response r;
    test_begin(&t, "framing/deep-nesting-names-nesting");
    enum { DEPTH = 3000 };
    char *deep = client_xcalloc(2 * DEPTH + 16, 1);
    size_t n = (size_t)sprintf(deep, "{\"inputs\":");
    memset(deep + n, '[', DEPTH);
    memset(deep + n + DEPTH, ']', DEPTH);
    deep[n + 2 * DEPTH] = '}';
    call(s, "POST", "/v2/models/attention/infer", deep, n + 2 * DEPTH + 1, NULL, &r);
    expect_v2_error(&t, &r, 400, "nests");
    expect_true(&t, r.body != NULL && strstr(r.body, "Inference-Header-Content-Length") == NULL,
                "the error talks about the binary framing: %.300s", r.body);
    client_response_free(&r);
    free(deep);
    test_end(&t);
}

/* ---- limits, metrics, draining ----------------------------------------------------------- */

/* --max-body and --max-elements: the limits/max-... and answer-elements tests. */
static void size_limits(void)
{
    static const char *const names[] = {"limits/max-elements-413", "limits/max-body-413",
                                        "limits/answer-elements-413", NULL};
    if (!any_selected(names))
        return;
    struct server s;
    if (v2_server_start(&s, &g_small_limits_kind) != 0)
        return;
    struct test t;
    struct client_response r;
    double *x = v2_random_values(1200, 1);
    struct input in[3] = {{"q", x, {600, 1}, 2, 0}, {"k", x, {600, 1}, 2, 0}, {"v", x, {1, 1}, 2, 0}};
    struct body b;
    test_begin(&t, "limits/max-elements-413");
    build_infer(&b, in, 3, ENC_BINARY, 1, NULL, NULL);
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_v2_error(&t, &r, 413, "max-elements");
    client_response_free(&r);
    free(b.data);
    test_end(&t);
    test_begin(&t, "limits/max-body-413");
    struct input big[3] = {{"q", x, {400, 1}, 2, 0}, {"k", x, {400, 1}, 2, 0}, {"v", x, {400, 1}, 2, 0}};
    build_infer(&b, big, 3, ENC_BINARY, 0, NULL, NULL);
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_v2_error(&t, &r, 413, "max-body");
    client_response_free(&r);
    free(b.data);
    test_end(&t);
    test_begin(&t, "limits/answer-elements-413");
    struct input sq[3] = {{"q", x, {40, 1}, 2, 0}, {"k", x, {40, 1}, 2, 0}, {"v", x, {40, 1}, 2, 0}};
    build_infer(&b, sq, 3, ENC_BINARY, 1, NULL, NULL);
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_v2_error(&t, &r, 413, "max-elements");
    client_response_free(&r);
    free(b.data);
    test_end(&t);
    server_stop(&s);
    free(x);
}

/* --max-request-memory: the limits/request-memory-... tests. */
static void request_memory_limits(void)
{
    static const char *const names[] = {"limits/request-memory-413",
                                        "limits/request-memory-ok-without-attention", NULL};
    if (!any_selected(names))
        return;
    struct server s;
    if (v2_server_start(&s, &g_small_memory_kind) != 0)
        return;
    struct test t;
    struct client_response r;
    double *x = v2_random_values(1200, 1);
    struct body b;
    test_begin(&t, "limits/request-memory-413");
    struct input wide[3] = {{"q", x, {300, 1}, 2, 0}, {"k", x, {300, 1}, 2, 0}, {"v", x, {300, 1}, 2, 0}};
    build_infer(&b, wide, 3, ENC_BINARY, 1, NULL, NULL);
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_v2_error(&t, &r, 413, "max-request-memory");
    client_response_free(&r);
    test_end(&t);
    test_begin(&t, "limits/request-memory-ok-without-attention");
    free(b.data);
    build_infer(&b, wide, 3, ENC_BINARY, 1, NULL, json_pack("[{s:s}]", "name", "output"));
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_true(&t, r.status == 200, "status %d: %.200s", r.status, r.body);
    client_response_free(&r);
    free(b.data);
    test_end(&t);
    server_stop(&s);
    free(x);
}

/* --max-memory: the limits/budget-counts-... tests. */
static void memory_budget_limits(void)
{
    static const char *const names[] = {"limits/budget-counts-binary-tensors-once",
                                        "limits/budget-counts-v1-body-as-json", NULL};
    if (!any_selected(names))
        return;
    struct server s;
    struct test t;
    struct client_response r;
    struct body b;
    /* The memory budget counts a binary body as what it is: its JSON header may become a
     * tree 25 times its size, its tensors only their arrays.  3 MiB of FP64 q, k and v
     * once needed a reservation of 75 MiB, past a 48 MiB budget (413 at the headers); now
     * about 9.  The same body to v1, which parses a body whole as JSON whatever its
     * headers, still needs the 75. */
    if (v2_server_start(&s, &g_small_budget_kind) != 0)
        return;
    double *y = v2_random_values(3 * 512 * 256, 1);
    struct input mib[3] = {{"q", y, {512, 256}, 2, 0}, {"k", y + 512 * 256, {512, 256}, 2, 0},
                           {"v", y + 2 * 512 * 256, {512, 256}, 2, 0}};
    test_begin(&t, "limits/budget-counts-binary-tensors-once");
    build_infer(&b, mib, 3, ENC_BINARY, 0, NULL, json_pack("[{s:s}]", "name", "output"));
    post_body(&s, "/v2/models/attention/infer", &b, 0, &r);
    expect_true(&t, r.status == 200, "status %d: %.300s", r.status, r.body);
    client_response_free(&r);
    test_end(&t);
    test_begin(&t, "limits/budget-counts-v1-body-as-json");
    /* The server refuses this body at its headers and closes the connection: a client
     * still sending the 3 MiB may meet a broken pipe and never read the 413.
     * "Expect: 100-continue" makes curl wait for the verdict before it sends the body, as
     * a client should for a body it may not be allowed to send. */
    char hl_header[64];
    snprintf(hl_header, sizeof hl_header, "Inference-Header-Content-Length: %zu", b.json_len);
    struct client_request rq = {.method = "POST", .path = "/v1/attention", .body = b.data, .body_len = b.len,
                                .headers = {hl_header, "Content-Type: application/octet-stream",
                                            "Expect: 100-continue"}};
    client_http_call(s.base_url, g_tmpdir, &rq, &r);
    expect_true(&t, r.status == 413 && strstr(r.body, "body_too_large") != NULL,
                "status %d: %.300s%s", r.status, r.body, r.transport_error);
    client_response_free(&r);
    test_end(&t);
    free(b.data);
    free(y);
    server_stop(&s);
}

static void run_limit_tests(void)
{
    size_limits();
    request_memory_limits();
    memory_budget_limits();
}

static void run_metrics_test(const struct server *s)
{
    struct test t;
    struct client_response r;
    if (!test_begin(&t, "metrics/v2-routes"))
        return;
    /* The counts this test looks for, made here whatever else ran: a metadata request, an
     * inference answered 200 and one refused with 400. */
    get(s, "/v2", &r);
    client_response_free(&r);
    double x[4] = {0.5, -1, 2, 0.25};
    struct input in[3] = {{"q", x, {2, 2}, 2, 0}, {"k", x, {2, 2}, 2, 0}, {"v", x, {2, 2}, 2, 0}};
    struct body b;
    build_infer(&b, in, 3, ENC_BINARY, 1, NULL, NULL);
    post_body(s, "/v2/models/attention/infer", &b, 0, &r);
    client_response_free(&r);
    free(b.data);
    struct input bad[2] = {{"q", x, {2, 2}, 2, 0}, {"k", x, {2, 2}, 2, 0}};
    build_infer(&b, bad, 2, ENC_BINARY, 1, NULL, NULL);
    post_body(s, "/v2/models/attention/infer", &b, 0, &r);
    client_response_free(&r);
    free(b.data);
    get(s, "/metrics", &r);
    expect_true(&t, r.status == 200, "status %d", r.status);
    expect_true(&t, strstr(r.body, "route=\"/v2/models/{model}/infer\",code=\"200\"") != NULL,
           "no 200 count for the infer route");
    expect_true(&t, strstr(r.body, "route=\"/v2/models/{model}/infer\",code=\"400\"") != NULL,
           "no 400 count for the infer route");
    expect_true(&t, strstr(r.body, "route=\"/v2\",code=\"200\"") != NULL, "no count for the v2 metadata routes");
    client_response_free(&r);
    test_end(&t);
}

/* SIGTERM while a slow upload is still arriving: v2 readiness and inference answer 503
 * with the protocol's error body, liveness 200. */
static void run_drain_test(void)
{
    static const char *const names[] = {"drain/v2-ready-503", "drain/v2-infer-503", "drain/v2-live-200", NULL};
    if (!any_selected(names))
        return;
    struct server s;
    if (v2_server_start(&s, &g_drain_kind) != 0)
        return;
    size_t len = 300 * 1024;
    char *upload = client_xcalloc(len + 1, 1);
    memset(upload, ' ', len);
    static const char *const slow[] = {"--limit-rate", "200K", NULL};
    struct client_request rq = {.method = "POST", .path = "/v1/attention", .body = upload, .body_len = len,
                                .curl_args = slow};
    struct client_pending p;
    client_http_start(s.base_url, g_tmpdir, &rq, &p);
    /* SIGTERM once the server holds the upload (a server with nothing in flight exits at
     * once): /metrics counts it beside the metrics request itself.  Asked for at most 10 s:
     * a loaded machine may start curl late. */
    struct client_response r;
    double by = client_now_seconds() + 10.0;
    for (;;) {
        get(&s, "/metrics", &r);
        const char *at = r.body != NULL ? strstr(r.body, "\nattn_http_inflight_requests ") : NULL;
        long inflight = at != NULL ? strtol(at + 29, NULL, 10) : 0;
        client_response_free(&r);
        if (inflight >= 2 || client_now_seconds() > by)
            break;
        client_sleep_ms(20);
    }
    kill(s.pid, SIGTERM);
    struct test t;
    test_begin(&t, "drain/v2-ready-503");
    /* Readiness turns 503 once the signal is handled: asked until then, for
     * at most 3 s (the slow upload keeps the server draining for longer). */
    double until = client_now_seconds() + 3.0;
    for (;;) {
        get(&s, "/v2/health/ready", &r);
        if (r.status != 200 || client_now_seconds() > until)
            break;
        client_response_free(&r);
        client_sleep_ms(20);
    }
    expect_true(&t, r.status == 503, "status %d: %.200s", r.status, r.body);
    client_response_free(&r);
    get(&s, "/v2/models/attention/ready", &r);
    expect_v2_error(&t, &r, 503, NULL);
    client_response_free(&r);
    test_end(&t);
    test_begin(&t, "drain/v2-infer-503");
    const char *body = "{\"inputs\":[{\"name\":\"q\",\"shape\":[1,1],\"datatype\":\"FP64\",\"data\":[1]},"
                       "{\"name\":\"k\",\"shape\":[1,1],\"datatype\":\"FP64\",\"data\":[1]},"
                       "{\"name\":\"v\",\"shape\":[1,1],\"datatype\":\"FP64\",\"data\":[1]}]}";
    call(&s, "POST", "/v2/models/attention/infer", body, strlen(body), NULL, &r);
    expect_v2_error(&t, &r, 503, NULL);
    expect_true(&t, client_header(&r, "Retry-After") != NULL, "no Retry-After");
    client_response_free(&r);
    test_end(&t);
    test_begin(&t, "drain/v2-live-200");
    get(&s, "/v2/health/live", &r);
    expect_true(&t, r.status == 200, "status %d", r.status);
    client_response_free(&r);
    test_end(&t);
    client_http_finish(&p, &r);
    client_response_free(&r);
    free(upload);
    server_wait_exit(&s); /* SIGTERM was sent above */
}

static void usage(FILE *to, const char *argv0)
{
    fprintf(to,
            "usage: %s --server PATH [--filter SUBSTR]\n"
            "  Starts the attention server at PATH on free loopback ports and checks its v2\n"
            "  protocol; --filter reports only the tests whose name contains SUBSTR.\n",
            argv0);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i += 2) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout, argv[0]);
            return 0;
        } else if (strcmp(argv[i], "--server") == 0 && value != NULL) {
            g_server_path = value;
        } else if (strcmp(argv[i], "--filter") == 0 && value != NULL) {
            harness_add_filter(value);
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (g_server_path == NULL) {
        usage(stderr, argv[0]);
        return 2;
    }
    if (harness_start("v2test", NULL) != 0)
        return 2;
    /* The default server runs the groups before limits and drain; it starts only when
     * --filter chooses one of their tests. */
    int default_chosen = any_selected(g_endpoint_names) || attention_tests_chosen() ||
                         any_selected(g_weight_set_names) || any_selected(g_framing_names) ||
                         harness_selected("metrics/v2-routes");
    struct server s;
    if (default_chosen && v2_server_start(&s, &g_default_kind) == 0) {
        run_endpoint_tests(&s);
        run_attention_tests(&s);
        run_v2_weight_set_tests(&s);
        run_framing_tests(&s);
        run_metrics_test(&s);
        server_stop(&s);
    }
    run_limit_tests();
    run_drain_test();
    return harness_finish(0);
}

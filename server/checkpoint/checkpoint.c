/*
 * checkpoint.c - presets that find attention weights in a checkpoint (see
 * checkpoint.h).
 *
 * Every preset comes down to one plan per layer: for each of the eight
 * parts, the tensor that holds it, its layout, and which slice of its
 * outputs is the part (q, k and v share one tensor in torch_mha and gpt2).
 * All plans are checked and their numbers counted before the first array
 * is allocated, so a bad file or an oversized one costs no memory, and a
 * request for every layer gets all of them or an error.
 *
 * A layer whose tensors are all F32, F16 or BF16 becomes a float32 set (F32
 * copied bit for bit, the halves widened exactly); one with any F64 tensor
 * a float64 set, so that no number is ever rounded.  The copying itself is
 * checkpoint_fill.c's.
 */
#include "checkpoint.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"
#include "core/mem.h"

/* How a preset with layers names its anchor tensor: prefix + stem + N + tail. */
typedef struct layer_pattern { const char *stem, *tail; } layer_pattern;

static const layer_pattern BERT_PATTERN = {"encoder.layer.", ".attention.self.query.weight"};
static const layer_pattern GPT2_PATTERN = {"h.", ".attn.c_attn.weight"};
static const char *const MHA_ANCHOR = "out_proj.weight";

int checkpoint_header_admit(const void *buf, size_t len, attn_error *err)
{
    unsigned long long n = safetensors_header_length(buf, len);
    /* A length past the body is a damaged file, which safetensors_parse names as such. */
    if (n <= CKPT_MAX_HEADER_BYTES || n > len - 8)
        return 0;
    return error_set(err, ERR_TOO_LARGE, "header_too_large", "body",
                     "The safetensors header takes %llu bytes; the server reads at most %zu "
                     "(a model's header takes about 100 bytes a tensor).", n,
                     CKPT_MAX_HEADER_BYTES);
}

int checkpoint_preset_parse(const char *name, ckpt_preset *preset, attn_error *err)
{
    static const struct { const char *name; ckpt_preset preset; } presets[] = {
        {"torch_mha", CKPT_TORCH_MHA}, {"hf_bert", CKPT_HF_BERT},
        {"gpt2", CKPT_GPT2},           {"names", CKPT_NAMES},
    };
    for (size_t i = 0; name != NULL && i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            *preset = presets[i].preset;
            return 0;
        }
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", "preset",
                     "preset must be torch_mha, hf_bert, gpt2 or names%s%.60s%s.",
                     name ? " (not \"" : "", name ? name : "", name ? "\")" : "");
}

/* Sets one source: name = prefix + suffix (formatted). */
static void source_set(part_source *s, int required, int out_in, size_t parts, size_t index,
                       const char *prefix, const char *fmt, long layer)
{
    char suffix[CKPT_NAME_MAX];
    snprintf(suffix, sizeof suffix, fmt, layer);
    snprintf(s->name, sizeof s->name, "%s%s", prefix, suffix);
    s->required = required;
    s->out_in = out_in;
    s->parts = parts;
    s->index = index;
}

static void plan_torch_mha(const st_file *f, const char *p, part_source *s)
{
    char probe[CKPT_NAME_MAX];
    snprintf(probe, sizeof probe, "%sin_proj_weight", p);
    int stacked = safetensors_find(f, probe) != NULL;
    snprintf(probe, sizeof probe, "%sq_proj_weight", p);
    if (!stacked && safetensors_find(f, probe) != NULL) {
        source_set(&s[WEIGHTS_WQ], 1, 1, 1, 0, p, "q_proj_weight", 0);
        source_set(&s[WEIGHTS_WK], 1, 1, 1, 0, p, "k_proj_weight", 0);
        source_set(&s[WEIGHTS_WV], 1, 1, 1, 0, p, "v_proj_weight", 0);
    } else {
        for (size_t i = 0; i < 3; i++)
            source_set(&s[WEIGHTS_WQ + i], 1, 1, 3, i, p, "in_proj_weight", 0);
    }
    for (size_t i = 0; i < 3; i++)
        source_set(&s[WEIGHTS_BQ + i], 0, 1, 3, i, p, "in_proj_bias", 0);
    source_set(&s[WEIGHTS_WO], 1, 1, 1, 0, p, "out_proj.weight", 0);
    source_set(&s[WEIGHTS_BO], 0, 1, 1, 0, p, "out_proj.bias", 0);
}

static void plan_bert(const char *p, long n, part_source *s)
{
    static const char *const which[3] = {"query", "key", "value"};
    char fmt[128];
    for (size_t i = 0; i < 3; i++) {
        snprintf(fmt, sizeof fmt, "encoder.layer.%%ld.attention.self.%s.weight", which[i]);
        source_set(&s[WEIGHTS_WQ + i], 1, 1, 1, 0, p, fmt, n);
        snprintf(fmt, sizeof fmt, "encoder.layer.%%ld.attention.self.%s.bias", which[i]);
        source_set(&s[WEIGHTS_BQ + i], 0, 1, 1, 0, p, fmt, n);
    }
    source_set(&s[WEIGHTS_WO], 1, 1, 1, 0, p, "encoder.layer.%ld.attention.output.dense.weight", n);
    source_set(&s[WEIGHTS_BO], 0, 1, 1, 0, p, "encoder.layer.%ld.attention.output.dense.bias", n);
}

static void plan_gpt2(const char *p, long n, part_source *s)
{
    for (size_t i = 0; i < 3; i++) {
        source_set(&s[WEIGHTS_WQ + i], 1, 0, 3, i, p, "h.%ld.attn.c_attn.weight", n);
        source_set(&s[WEIGHTS_BQ + i], 0, 0, 3, i, p, "h.%ld.attn.c_attn.bias", n);
    }
    source_set(&s[WEIGHTS_WO], 1, 0, 1, 0, p, "h.%ld.attn.c_proj.weight", n);
    source_set(&s[WEIGHTS_BO], 0, 0, 1, 0, p, "h.%ld.attn.c_proj.bias", n);
}

static void plan_names(const ckpt_request *rq, part_source *s)
{
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        if (rq->names[p] == NULL)
            continue;
        source_set(&s[p], 1, rq->names_out_in, 1, 0, "", "", 0);
        snprintf(s[p].name, sizeof s[p].name, "%s", rq->names[p]);
    }
}

/* If name is prefix + pattern (a layer number in the middle), stores the
 * prefix's length and the number; returns 1, else 0. */
static int match_layer(const char *name, const layer_pattern *pat, size_t *prefix_len, long *n)
{
    size_t len = strlen(name), tail = strlen(pat->tail), stem = strlen(pat->stem);
    if (len < tail + stem + 1 || strcmp(name + len - tail, pat->tail) != 0)
        return 0;
    size_t end = len - tail, start = end;
    while (start > 0 && isdigit((unsigned char)name[start - 1]))
        start--;
    if (start == end || end - start > 6 || start < stem ||
        strncmp(name + start - stem, pat->stem, stem) != 0)
        return 0;
    size_t plen = start - stem;
    if (plen > 0 && name[plen - 1] != '.')
        return 0;
    *prefix_len = plen;
    *n = strtol(name + start, NULL, 10);
    return 1;
}

/* The file's prefixes and layers for a preset: fills prefix (one) and the
 * sorted distinct layer numbers (caller frees *layers with mem_free; none
 * for torch_mha).  Returns 0, or 400 with the anchor missing or several
 * prefixes listed. */
static int find_prefix(const st_file *f, ckpt_preset preset, char *prefix, long **layers,
                       size_t *nlayers, attn_error *err)
{
    const layer_pattern *pat = preset == CKPT_HF_BERT ? &BERT_PATTERN : &GPT2_PATTERN;
    char others[300] = "";
    size_t found = 0;
    *layers = mem_calloc(f->count ? f->count : 1, sizeof **layers);
    *nlayers = 0;
    if (*layers == NULL)
        return error_nomem(err);
    for (size_t i = 0; i < f->count; i++) {
        const char *name = f->tensors[i].name;
        size_t plen, len = strlen(name), alen = strlen(MHA_ANCHOR);
        long n = -1;
        if (preset == CKPT_TORCH_MHA) {
            if (len < alen || strcmp(name + len - alen, MHA_ANCHOR) != 0 ||
                (len > alen && name[len - alen - 1] != '.'))
                continue;
            plen = len - alen;
        } else if (!match_layer(name, pat, &plen, &n)) {
            continue;
        }
        if (plen >= CKPT_NAME_MAX / 2)
            continue;
        char quoted[CKPT_NAME_MAX / 2 + 8];
        snprintf(quoted, sizeof quoted, ", \"%.*s\"", (int)plen, name);
        if (found == 0)
            snprintf(prefix, CKPT_NAME_MAX / 2, "%.*s", (int)plen, name);
        else if ((strlen(prefix) != plen || strncmp(prefix, name, plen)) && !strstr(others, quoted))
            snprintf(others + strlen(others), sizeof others - strlen(others), "%s", quoted);
        found++;
        if (n >= 0)
            (*layers)[(*nlayers)++] = n;
    }
    if (found == 0)
        return error_set(err, ERR_BAD_REQUEST, "missing_tensor", "body",
                         "The file has no tensor named like \"%s%s\", which the preset needs.",
                         preset == CKPT_TORCH_MHA ? "" : pat->stem,
                         preset == CKPT_TORCH_MHA ? MHA_ANCHOR
                         : preset == CKPT_HF_BERT ? "{N}.attention.self.query.weight"
                                                  : "{N}.attn.c_attn.weight");
    if (others[0])
        return error_set(err, ERR_BAD_REQUEST, "ambiguous_prefix", "body",
                         "The file holds the weights under several prefixes: \"%s\"%s; use "
                         "preset=names to say which tensors to take.", prefix, others);
    return 0;
}

static int long_cmp(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Chooses the layers rq asks for among the file's (sorted, made distinct in
 * place).  *first and *last index into layers. */
static int choose_layers(const ckpt_request *rq, long *layers, size_t *n, size_t *first,
                         size_t *last, attn_error *err)
{
    qsort(layers, *n, sizeof *layers, long_cmp);
    size_t k = 0;
    for (size_t i = 0; i < *n; i++)
        if (k == 0 || layers[k - 1] != layers[i])
            layers[k++] = layers[i];
    *n = k;
    if (rq->layer == CKPT_LAYER_ALL) {
        *first = 0;
        *last = k - 1;
        return 0;
    }
    for (size_t i = 0; i < k; i++)
        if (layers[i] == rq->layer || (rq->layer == CKPT_LAYER_NONE && k == 1)) {
            *first = *last = i;
            return 0;
        }
    if (rq->layer == CKPT_LAYER_NONE)
        return error_set(err, ERR_BAD_REQUEST, "missing_field", "layer",
                         "The file has %zu layers (%ld to %ld): give layer=N for one of them "
                         "or layer=all.", k, layers[0], layers[k - 1]);
    return error_set(err, ERR_BAD_REQUEST, "invalid_value", "layer",
                     "The file has no layer %ld; it has %zu (%ld to %ld).", rq->layer, k,
                     layers[0], layers[k - 1]);
}

/* Rows (inputs) and columns (outputs of this part) of source s's tensor t. */
static int source_shape(const part_source *s, const st_tensor *t, int is_matrix, size_t *rows,
                        size_t *cols, attn_error *err)
{
    if ((size_t)(is_matrix ? 2 : 1) != t->ndim)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "body",
                         "Tensor \"%.200s\" has %zu dimensions; it must have %d.", s->name,
                         t->ndim, is_matrix ? 2 : 1);
    size_t outs = is_matrix ? t->shape[s->out_in ? 0 : 1] : t->shape[0];
    if (outs % s->parts != 0)
        return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "body",
                         "Tensor \"%.200s\" has %zu outputs, which do not split into q, k and v "
                         "evenly.", s->name, outs);
    *rows = is_matrix ? t->shape[s->out_in ? 1 : 0] : 1;
    *cols = outs / s->parts;
    return 0;
}

/* Finds the tensors of plan and the dimensions they imply, and checks that
 * every part fits them. */
static int plan_check(const st_file *f, layer_plan *plan, attn_error *err)
{
    size_t rows[WEIGHTS_COUNT] = {0}, cols[WEIGHTS_COUNT] = {0};
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        part_source *s = &plan->src[p];
        if (!s->name[0])
            continue;
        plan->t[p] = safetensors_find(f, s->name);
        if (plan->t[p] == NULL && s->required)
            return error_set(err, ERR_BAD_REQUEST, "missing_tensor", "body",
                             "The file has no tensor \"%.200s\", which the preset needs.",
                             s->name);
        if (plan->t[p] != NULL &&
            source_shape(s, plan->t[p], weights_parts[p].is_matrix, &rows[p], &cols[p], err))
            return ERR_BAD_REQUEST;
    }
    attn_weights *d = &plan->dims;
    d->d_in = rows[WEIGHTS_WQ];
    d->dk = cols[WEIGHTS_WQ];
    d->d_ctx = rows[WEIGHTS_WK];
    d->dv = cols[WEIGHTS_WV];
    d->d_out = plan->t[WEIGHTS_WO] ? cols[WEIGHTS_WO] : d->dv;
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        if (plan->t[p] != NULL &&
            (rows[p] != weights_rows(d, (weights_part)p) ||
             cols[p] != weights_cols(d, (weights_part)p) || rows[p] == 0 || cols[p] == 0))
            return error_set(err, ERR_BAD_REQUEST, "shape_mismatch", "body",
                             "Tensor \"%.200s\" gives %s as %zu x %zu, which does not fit the "
                             "others (d_in %zu, d_ctx %zu, dk %zu, dv %zu, d_out %zu).",
                             plan->src[p].name, weights_parts[p].name, rows[p], cols[p], d->d_in,
                             d->d_ctx, d->dk, d->dv, d->d_out);
    d->elem = WEIGHTS_F32;
    for (int p = 0; p < WEIGHTS_COUNT; p++)
        if (plan->t[p] != NULL && plan->t[p]->dtype == SAFETENSORS_F64)
            d->elem = WEIGHTS_F64;
    return 0;
}

/* Builds the plans of the layers rq asks for into a new array. */
static int make_plans(const st_file *f, const ckpt_request *rq, layer_plan **plans, size_t *count,
                      attn_error *err)
{
    char prefix[CKPT_NAME_MAX / 2] = "";
    long *layers = NULL;
    size_t nlayers = 0, first = 0, last = 0;
    int layered = rq->preset == CKPT_HF_BERT || rq->preset == CKPT_GPT2, rc = 0;
    if (!layered && rq->layer != CKPT_LAYER_NONE)
        return error_set(err, ERR_BAD_REQUEST, "invalid_value", "layer",
                         "This preset takes no layer: the file holds one attention module.");
    for (int p = WEIGHTS_WQ; rq->preset == CKPT_NAMES && p <= WEIGHTS_WV; p++)
        if (rq->names[p] == NULL)
            return error_set(err, ERR_BAD_REQUEST, "missing_field", weights_parts[p].name,
                             "preset=names needs %s=TENSOR, the name of the tensor that holds "
                             "it.", weights_parts[p].name);
    if (rq->preset != CKPT_NAMES)
        rc = find_prefix(f, rq->preset, prefix, &layers, &nlayers, err);
    if (rc == 0 && layered)
        rc = choose_layers(rq, layers, &nlayers, &first, &last, err);
    size_t n = layered ? last - first + 1 : 1;
    *plans = rc == 0 ? mem_calloc(n, sizeof **plans) : NULL;
    if (rc == 0 && *plans == NULL)
        rc = error_nomem(err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        layer_plan *plan = &(*plans)[i];
        plan->index = layered ? layers[first + i] : -1;
        if (rq->preset == CKPT_TORCH_MHA)
            plan_torch_mha(f, prefix, plan->src);
        else if (rq->preset == CKPT_HF_BERT)
            plan_bert(prefix, plan->index, plan->src);
        else if (rq->preset == CKPT_GPT2)
            plan_gpt2(prefix, plan->index, plan->src);
        else
            plan_names(rq, plan->src);
        rc = plan_check(f, plan, err);
    }
    mem_free(layers);
    if (rc != 0) {
        mem_free(*plans);
        *plans = NULL;
        return rc;
    }
    *count = n;
    return 0;
}

/* Numbers the plans need together, and their bytes in each plan's element type; 413 over
 * rq->max_elements. */
static int plans_count(const layer_plan *plans, size_t n, size_t max, size_t *total,
                       size_t *bytes, attn_error *err)
{
    *total = 0;
    *bytes = 0;
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < WEIGHTS_COUNT; p++)
            if (plans[i].t[p] != NULL) {
                size_t k = weights_rows(&plans[i].dims, (weights_part)p) *
                           weights_cols(&plans[i].dims, (weights_part)p);
                *total += k;
                *bytes += k * weights_elem_size(&plans[i].dims);
            }
    if (*total > max)
        return error_set(err, ERR_TOO_LARGE, "request_too_large", NULL,
                         "The weights asked for hold %zu numbers, more than the server's "
                         "limit of %zu (--max-elements).", *total, max);
    return 0;
}

int checkpoint_extract(const st_file *f, const ckpt_request *rq,
                       int (*reserve)(size_t bytes, void *ctx, attn_error *err), void *ctx,
                       ckpt_layer **layers, size_t *count, attn_error *err)
{
    *layers = NULL;
    *count = 0;
    layer_plan *plans;
    size_t n, total, bytes;
    int rc = make_plans(f, rq, &plans, &n, err);
    if (rc != 0)
        return rc;
    rc = plans_count(plans, n, rq->max_elements, &total, &bytes, err);
    if (rc == 0 && reserve != NULL)
        rc = reserve(bytes, ctx, err);
    ckpt_layer *out = rc == 0 ? mem_calloc(n, sizeof *out) : NULL;
    if (rc == 0 && out == NULL)
        rc = error_nomem(err);
    if (rc == 0)
        rc = checkpoint_fill(plans, n, rq->release_body, out, err);
    mem_free(plans);
    if (rc != 0) {
        checkpoint_layers_free(out, n);
        return rc;
    }
    *layers = out;
    *count = n;
    return 0;
}

void checkpoint_layers_free(ckpt_layer *layers, size_t count)
{
    if (layers == NULL)
        return;
    for (size_t i = 0; i < count; i++)
        weights_free(&layers[i].w);
    mem_free(layers);
}

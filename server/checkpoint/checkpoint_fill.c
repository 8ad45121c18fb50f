/*
 * checkpoint_fill.c - copying the parts a plan names out of a checkpoint
 * into weight arrays (see checkpoint_internal.h).
 *
 * An (out, in) tensor is transposed into the project's (in, out) form in
 * blocks of FILL_BLOCK source rows; an (in, out) one is copied by rows.
 * Every number is checked finite, and a bad one is named by its place in
 * the file.  A part is split into spans of its lines, which the compute
 * pool copies side by side; parts go one after the other, so that no more
 * of the body and the arrays is held at once than one thread would hold.
 */
#include "checkpoint_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "core/compute.h"
#include "core/mem.h"

/* Source rows copied between two gives-back of the body (mem_release): about a MiB. */
#define FILL_RELEASE_BYTES ((size_t)1 << 20)
/* Source rows of an (out, in) tensor read together: the reads go down FILL_BLOCK rows at
 * once and the writes along a row of the (in, out) copy, both in whole cache lines. */
#define FILL_BLOCK 16
/* F32 numbers in a cache line, and how far ahead along its rows a block's reads are
 * prefetched.  The transpose of an F32 tensor waits on memory: the hardware does not
 * prefetch its FILL_BLOCK streams of 4 bytes a step, so they are prefetched here, and the
 * lines of the copy are written whole with streaming stores (fill_line), so that no line is
 * read before it is written (docs/performance.md has the measurements). */
#define FILL_LINE 16
#define FILL_AHEAD 64

/* What a part has read of its tensor and not yet given back to the kernel (plan_fill). */
typedef struct fill_release {
    const unsigned char *base;  /* the first byte the part reads */
    size_t since;               /* bytes read since the last give-back */
    size_t done;                /* bytes from base given back so far */
} fill_release;

/* Records that the part has read [0, upto) from base; past FILL_RELEASE_BYTES since the last
 * time, or at its end (last), gives back what is new.  mem_release keeps the pages an end
 * cuts through, so each give-back starts 64 KiB (the largest common page) before the last
 * one's end: those bytes are read already, and no page is left behind. */
static void fill_read(fill_release *r, size_t bytes, size_t upto, int last)
{
    r->since += bytes;
    if (r->since < FILL_RELEASE_BYTES && !last)
        return;
    size_t from = r->done > ((size_t)64 << 10) ? r->done - ((size_t)64 << 10) : 0;
    mem_release(r->base + from, upto - from);
    r->done = upto;
    r->since = 0;
}

static int fill_not_finite(const part_source *s, double v, size_t at, attn_error *err)
{
    return error_set(err, ERR_BAD_REQUEST, "not_finite", "body",
                     "Tensor \"%.200s\" holds %s at element %zu; weights must be finite.",
                     s->name, isnan(v) ? "NaN" : "an infinity", at);
}

/* Element at of part p's tensor, checked finite, into a[i]: a double array, or a float
 * one when f32 (the tensor is then F16 or BF16, widened exactly; F32 goes to fill_f32). */
static inline int fill_get(const part_source *s, const st_tensor *t, size_t at, void *a,
                           size_t i, int f32, attn_error *err)
{
    if (f32) {
        float v = (float)safetensors_get(t, at);
        ((float *)a)[i] = v;
        return isfinite(v) ? 0 : fill_not_finite(s, v, at, err);
    }
    double v = safetensors_get(t, at);
    ((double *)a)[i] = v;
    return isfinite(v) ? 0 : fill_not_finite(s, v, at, err);
}

/* Index of the first of the n F32 numbers at p that is not finite, or n. */
static size_t first_not_finite_f32(const unsigned char *p, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {    /* no early exit, so that it vectorises */
        uint32_t bits;
        memcpy(&bits, p + 4 * i, 4);
        bad |= (bits & 0x7F800000u) == 0x7F800000u;
    }
    for (size_t i = 0; bad && i < n; i++) {
        uint32_t bits;
        memcpy(&bits, p + 4 * i, 4);
        if ((bits & 0x7F800000u) == 0x7F800000u)
            return i;
    }
    return n;
}

/* Writes n numbers of line to dst: a whole aligned line of FILL_BLOCK with streaming stores,
 * which do not read the destination's cache line first (fill_f32 writes each line once). */
static inline void fill_line(float *dst, const uint32_t *line, size_t n)
{
#ifdef __SSE2__
    if (n == FILL_BLOCK && ((uintptr_t)dst & 15) == 0) {
        for (size_t k = 0; k < FILL_BLOCK; k += 4)
            _mm_stream_si128((__m128i *)(dst + k), _mm_loadu_si128((const __m128i *)(line + k)));
        return;
    }
#endif
    memcpy(dst, line, n * 4);
}

/* plan_fill for an F32 tensor into a float32 array a: the numbers copied bit for bit, each
 * block checked finite while it is copied, and only a bad one searched again in the order it
 * lies in the file (so that the element named is the first bad one, as plan_fill's). */
static int fill_f32(const part_source *s, const st_tensor *t, size_t rows, size_t cols,
                    size_t from, size_t to, float *a, int release, attn_error *err)
{
    size_t outs = cols * s->parts, first = s->index * cols;
    if (s->out_in) {
        /* source rows [first + from, first + to), each `rows` long */
        const unsigned char *start = t->data + (first + from) * rows * 4;
        fill_release rel = {start, 0, 0};
        for (size_t j0 = from; j0 < to; j0 += FILL_BLOCK) {
            size_t jn = to - j0 < FILL_BLOCK ? to - j0 : FILL_BLOCK;
            const unsigned char *block = t->data + (first + j0) * rows * 4;
            uint32_t any_bad = 0;
            for (size_t i = 0; i < rows; i++) {
                if (i % FILL_LINE == 0 && i + FILL_AHEAD < rows)
                    for (size_t jj = 0; jj < jn; jj++)
                        __builtin_prefetch(block + (jj * rows + i + FILL_AHEAD) * 4);
                uint32_t line[FILL_BLOCK];
                for (size_t jj = 0; jj < jn; jj++) {
                    uint32_t bits;
                    memcpy(&bits, block + (jj * rows + i) * 4, 4);
                    any_bad |= (bits & 0x7F800000u) == 0x7F800000u;
                    line[jj] = bits;
                }
                fill_line(&a[i * cols + j0], line, jn);
            }
            if (any_bad) {
                size_t bad = first_not_finite_f32(block, jn * rows);
                float v;
                memcpy(&v, block + 4 * bad, 4);
                return fill_not_finite(s, v, (first + j0) * rows + bad, err);
            }
            if (release)
                fill_read(&rel, jn * rows * 4, (j0 + jn - from) * rows * 4, j0 + jn == to);
        }
        return 0;
    }
    /* columns [first, first + cols) of source rows [from, to) */
    fill_release rel = {t->data + from * outs * 4, 0, 0};
    for (size_t i = from; i < to; i++) {
        const unsigned char *run = t->data + (i * outs + first) * 4;
        size_t bad = first_not_finite_f32(run, cols);
        if (bad < cols) {
            float v;
            memcpy(&v, run + 4 * bad, 4);
            return fill_not_finite(s, v, i * outs + first + bad, err);
        }
        memcpy(a + i * cols, run, cols * 4);
        if (release)
            fill_read(&rel, outs * 4, (i + 1 - from) * outs * 4, i + 1 == to);
    }
    return 0;
}

/* The lines of part p: the unit plan_fill's spans count in, its tensor's rows that hold the
 * part.  For an (out, in) tensor they are the part's columns in (in, out) form; for an
 * (in, out) one, its rows. */
static size_t part_lines(const layer_plan *plan, int p)
{
    return plan->src[p].out_in ? weights_cols(&plan->dims, (weights_part)p)
                               : weights_rows(&plan->dims, (weights_part)p);
}

/* Copies lines [from, to) of part p of plan (part_lines; from a multiple of FILL_BLOCK) into
 * its array of w (allocated, of w's element type) in (in, out) form, reading the tensor's
 * bytes for them front to back.  With release, the part is the only reader of those bytes
 * of the body, which are given back to the kernel as they are read: a checkpoint of several
 * hundred MB is then never held both as the file and as its numbers. */
static int plan_fill(const layer_plan *plan, int p, size_t from, size_t to, int release,
                     attn_weights *w, attn_error *err)
{
    const part_source *s = &plan->src[p];
    const st_tensor *t = plan->t[p];
    size_t rows = weights_rows(&plan->dims, (weights_part)p);
    size_t cols = weights_cols(&plan->dims, (weights_part)p);
    size_t outs = cols * s->parts, first = s->index * cols, esize = safetensors_elem_size(t);
    int f32 = weights_is_f32(w);
    void *a = f32 ? (void *)*weights_slot_f32(w, (weights_part)p)
                  : (void *)*weights_slot(w, (weights_part)p);
    int rc = 0;
    if (f32 && t->dtype == SAFETENSORS_F32)
        return fill_f32(s, t, rows, cols, from, to, a, release, err);
    if (s->out_in) {
        /* source rows [first + from, first + to), each `rows` long */
        fill_release rel = {t->data + (first + from) * rows * esize, 0, 0};
        for (size_t j0 = from; rc == 0 && j0 < to; j0 += FILL_BLOCK) {
            size_t jn = to - j0 < FILL_BLOCK ? to - j0 : FILL_BLOCK;
            for (size_t i = 0; rc == 0 && i < rows; i++)
                for (size_t jj = 0; rc == 0 && jj < jn; jj++)
                    rc = fill_get(s, t, (first + j0 + jj) * rows + i, a, i * cols + j0 + jj, f32,
                                  err);
            if (release && rc == 0)
                fill_read(&rel, jn * rows * esize, (j0 + jn - from) * rows * esize,
                          j0 + jn == to);
        }
    } else {
        /* columns [first, first + cols) of source rows [from, to) */
        fill_release rel = {t->data + from * outs * esize, 0, 0};
        for (size_t i = from; rc == 0 && i < to; i++) {
            for (size_t j = 0; rc == 0 && j < cols; j++)
                rc = fill_get(s, t, i * outs + first + j, a, i * cols + j, f32, err);
            if (release && rc == 0)
                fill_read(&rel, outs * esize, (i + 1 - from) * outs * esize, i + 1 == to);
        }
    }
    return rc; /* on failure the part stays in w, freed with it */
}

/* 1 when part p of plans[i] is the only reader of its bytes of its tensor, so that
 * plan_fill may give them back as it reads them: no other part of any plan reads the same
 * rows.  Parts split along the columns (gpt2's c_attn) share every row; one tensor named
 * for two parts (preset=names) is read twice; neither is released.  Biases are small and
 * are never released. */
static int sole_reader(const layer_plan *plans, size_t n, size_t i, int p)
{
    const part_source *s = &plans[i].src[p];
    if (!weights_parts[p].is_matrix || (!s->out_in && s->parts > 1))
        return 0;
    for (size_t k = 0; k < n; k++)
        for (int q = 0; q < WEIGHTS_COUNT; q++) {
            const part_source *o = &plans[k].src[q];
            if ((k != i || q != p) && plans[k].t[q] == plans[i].t[p] &&
                !(o->out_in && s->out_in && o->parts == s->parts && o->index != s->index))
                return 0;
        }
    return 1;
}

/* A part is copied in at most FILL_SPANS_MAX spans of its lines, each a task of the compute
 * pool; a matrix of fewer than FILL_SPAN_MIN lines a span is copied whole. */
#define FILL_SPANS_MAX 16
#define FILL_SPAN_MIN (4 * FILL_BLOCK)

/* One part being copied (checkpoint_fill), and how each of its spans went. */
typedef struct fill_job {
    const layer_plan *plan;
    int part, release;
    attn_weights *w;
    size_t lines, span;         /* span: lines per task, a multiple of FILL_BLOCK */
    struct {
        int rc, done;
        attn_error err;
    } spans[FILL_SPANS_MAX];
} fill_job;

static void fill_task(void *ctx, size_t task, unsigned slot)
{
    (void)slot;
    fill_job *job = ctx;
    size_t from = task * job->span, to = from + job->span < job->lines ? from + job->span
                                                                       : job->lines;
    job->spans[task].rc = plan_fill(job->plan, job->part, from, to, job->release, job->w,
                                    &job->spans[task].err);
#ifdef __SSE2__
    _mm_sfence(); /* fill_line's streaming stores are done before the span is reported */
#endif
    job->spans[task].done = 1;
}

/* Copies part p of plan into its array of w, in spans of its lines on the compute pool.  One
 * part at a time, so that no more is held at once than a single thread would hold: the array
 * of a part read from an (out, in) tensor is touched whole by its first block, and only its
 * own source is given back as it goes.  A failure is the one a single thread would meet
 * first: in the lowest span. */
static int fill_part(const layer_plan *plan, int p, int release, attn_weights *w,
                     attn_error *err)
{
    fill_job job = {.plan = plan, .part = p, .release = release, .w = w,
                    .lines = part_lines(plan, p)};
    unsigned threads = compute_threads();
    size_t spans = threads < FILL_SPANS_MAX ? threads : FILL_SPANS_MAX;
    if (!weights_parts[p].is_matrix || job.lines < spans * FILL_SPAN_MIN)
        spans = 1;
    job.span = (job.lines + spans - 1) / spans;
    job.span = (job.span + FILL_BLOCK - 1) / FILL_BLOCK * FILL_BLOCK;
    spans = (job.lines + job.span - 1) / job.span;
    compute_parallel(spans, threads, fill_task, &job);
    for (size_t k = 0; k < spans; k++) {
        if (!job.spans[k].done)
            return compute_stop_error(err);
        if (job.spans[k].rc != 0) {
            if (err != NULL)
                *err = job.spans[k].err;
            return job.spans[k].rc;
        }
    }
    return 0;
}

int checkpoint_fill(const layer_plan *plans, size_t n, int release_body, ckpt_layer *out,
                    attn_error *err)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        out[i].index = plans[i].index;
        out[i].w = plans[i].dims;
        for (int p = 0; rc == 0 && p < WEIGHTS_COUNT; p++) {
            if (plans[i].t[p] == NULL)
                continue;
            void *a = weights_part_alloc(&out[i].w, (weights_part)p);
            if (a == NULL)
                return error_nomem(err);
            /* written once, front to back or in row blocks: a fault per 2 MiB, not 4 KiB */
            mem_advise_huge(a, weights_rows(&plans[i].dims, (weights_part)p) *
                                   weights_cols(&plans[i].dims, (weights_part)p) *
                                   weights_elem_size(&plans[i].dims));
            rc = fill_part(&plans[i], p, release_body && sole_reader(plans, n, i, p),
                           &out[i].w, err);
        }
    }
    return rc;
}

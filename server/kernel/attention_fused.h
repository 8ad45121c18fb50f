/*
 * attention_fused.h - the kernel module's own (a "private:" row of
 * server/LAYERS; the unit tests use it too): the fused attention kernel for
 * the case where the attention matrix is not returned, in one copy per
 * instruction set ("path"), and the choice of path.
 *
 * The kernel is FlashAttention-2's loop on the CPU.  For a block of query
 * rows of one (batch, head) it walks the keys a tile of ATTN_FUSED_BK at a
 * time.  For each group of ATTN_FUSED_MR rows it forms the tile of scores in
 * registers (Q.K^T against K packed transposed), applies mask and causal
 * limit and updates the running maximum and sum of each row (the online
 * softmax, exponentials as 2^x by a polynomial in registers, log2(e) folded
 * into the FMA that subtracts the row maximum); then, group after group, it
 * adds P.V to the rows' output, rescaled when the maximum rose.  The
 * weights pass through ATTN_FUSED_BK numbers of scratch a row (sbuf), one
 * tile's; nothing of size Lq x Lk is ever written.  Key tiles past the
 * causal limit of every row of a group are not computed.
 *
 * K and V are packed once per (batch, head) per request, by the path
 * itself (attn_kernel_path.pack_*, called from attention_kernels.inc) in
 * panels the micro-kernels read in order, or, where a block of one
 * sub-block holds a whole head, by the block a tile at a time just before
 * the tile's products, into room for one tile (attn_fused_*.tile):
 *   kt: ATTN_FUSED_BK x hdk numbers per tile of ATTN_FUSED_BK keys (K
 *       transposed, by panels of keys), keys past lk zero to a whole
 *       panel, the rest of the last tile not written (the kernel scores
 *       only the vectors a short tile has);
 *   vp: ATTN_FUSED_BK x hdv_pad numbers per tile (hdv rounded up to
 *       ATTN_FUSED_VPAD_BYTES, by panels of columns), the padding columns
 *       zero, no rows past lk (P.V reads none).
 *
 * Paths: "amx_bf16" (AVX-512 with AMX-BF16 tiles), "avx512_bf16" (AVX-512 with
 * AVX512_BF16's vdpbf16ps), "avx512" (AVX-512F), "avx2" (AVX2 + FMA) and
 * "portable" (baseline x86-64, SSE2).  One source (attention_fused_impl.inc) is
 * compiled once per path with that path's -m flags (Makefile); the choice is made
 * once, at start-up, from cpuid, and may be forced (--kernel, ATTN_KERNEL).  The
 * two _bf16 paths differ from avx512 only in the bfloat16 products of a request
 * that asks for them (compute_precision bfloat16: block_b, pack_b); every path
 * has those products, the others by widening bfloat16 to float with shifts, with
 * the same rounding of the inputs and of the weights
 * (attention_fused_bf16.inc), so that every CPU answers within the bound of
 * docs/numbers.md.
 */
#ifndef ATTN_ATTENTION_FUSED_H
#define ATTN_ATTENTION_FUSED_H

#include <stddef.h>
#include <stdint.h>

/* Keys per tile, query rows per register group, and the alignment of a
 * packed V row.  A tile's softmax bookkeeping (the rows' maxima, the
 * rescaling of their output, the accumulators' loads and stores) is paid
 * once per tile, so wider tiles pay it less often; but a request's keys are
 * padded to whole tiles, and a tile's K (16 KiB at head dim 64 in float) is
 * read again by each row group of the block as it scores, then its V as it
 * adds, from L1 or L2.  The choice of 64 is measured in docs/performance.md
 * ("Against ONNX Runtime").  These three fix the packed layout and the
 * register tiles, so they are constants; the rows per sub-block below follow
 * the CPU's caches. */
#define ATTN_FUSED_BK 64
#define ATTN_FUSED_MR 6
#define ATTN_FUSED_VPAD_BYTES 64

/* The alignment of each slot's scratch (obuf and sbuf, loaded and stored
 * whole vectors at a time), in bytes: a cache line, so that no vector of the
 * widest path (64 bytes) spans two lines; the allocator's alignment is only
 * 16.  The packed K and V stay where the allocator puts them: aligned as well,
 * they made long rows slower (the commit that chose this has the figures). */
#define ATTN_FUSED_LINE 64

/* The bounds of the query rows per sub-block, the rows whose output
 * accumulates in scratch while every key tile passes over them: K and V
 * stream in from beyond the second-level cache once per sub-block, so more
 * rows mean less of that traffic, as long as the rows' q and output stay in
 * L2 beside the tile (attn_fused_rows_for_cache says how many do).  A
 * multiple of ATTN_FUSED_MR each; the kernel keeps one vector of sums per
 * row on its stack, so the largest is bounded. */
#define ATTN_FUSED_FQ_MIN 48
#define ATTN_FUSED_FQ_MAX 384
_Static_assert(ATTN_FUSED_FQ_MIN % ATTN_FUSED_MR == 0 && ATTN_FUSED_FQ_MAX % ATTN_FUSED_MR == 0,
               "sub-blocks of whole register groups");

/* The second-level cache assumed when the CPU reports none (bytes): that
 * of Intel's cores from Haswell to Skylake, the smallest of the common
 * x86-64 cores with AVX2, so that a guess errs toward sub-blocks that fit. */
#define ATTN_FUSED_L2_ASSUMED (256 * 1024)

/* How far, in powers of two, a row's weights may rise above 1 before the
 * output-only softmax moves the row's running maximum (softmax_group): a
 * tile whose scores top the running maximum by less keeps it, and its
 * weights 2^((s - max) log2 e) come out above 1 but at most 2^SLACK, so the
 * row's sum and output need no rescaling.  Past a row's first tiles few
 * scores top it by that much, so the maximum across a tile's lanes, the
 * factor exp(old - new) and the branch that picks them are skipped on
 * almost every tile (FlashAttention-4's rescaling threshold).  The result
 * is the same softmax: every weight of a row is taken against the same
 * shift, and the division by their sum removes it.  The cost is range:
 * sums and outputs up to 2^SLACK larger, far inside float's. */
#define ATTN_FUSED_SLACK 8

/* Keys between two asks whether the request was stopped (compute_stopped: a
 * clock read when it has a deadline): the BLAS path's key block.  Asked at
 * every tile, the clock reads were a visible share of a server's time; 256
 * keys of a sub-block of at most ATTN_FUSED_FQ_MAX rows are at most some
 * 25 MFLOP at head dim 64, a fraction of a millisecond, so a stop is still
 * seen at once. */
#define ATTN_FUSED_STOP_KEYS 256
_Static_assert(ATTN_FUSED_STOP_KEYS % ATTN_FUSED_BK == 0, "the asks fall on tile starts");

/* Heads wider than this (in q/k or in v) take the BLAS path instead: a tile
 * of K that wide no longer stays in a core's cache while every row group
 * of a block passes over it, where OpenBLAS's products block the head
 * dimension too.  The unit tests reach it (head dims up to 256). */
#define ATTN_FUSED_MAX_DIM 256

/* One block of query rows [i0, i0 + nq) of one (batch, head), in precision
 * REAL.  The kernel leaves in out the rows' output, already divided by their
 * sums (sum over keys of exp(s - run_max) v, over run_sum; zeros for a row
 * that no key reached), in run_max the shift the weights were taken against
 * (the row maximum, or less by at most ATTN_FUSED_SLACK ln 2; -Inf when no
 * key counts) and in run_sum the sum; attention_kernels.inc computes again
 * the rows that overflowed on the way. */
#define ATTN_FUSED_ARGS(REAL, SFX, BF16_FIELDS)                                                    \
    typedef struct attn_fused_##SFX {                                                              \
        size_t nq, i0;              /* rows, and the query index of the first */                   \
        const REAL *q;              /* row i0 of this head's q; rows ldq apart */                  \
        size_t ldq;                                                                                \
        const REAL *kt, *vp;        /* this head's packed K and V (above), or NULL with tile */    \
        /* With kt NULL: this head's row 0 of K and V, rows ldk and ldv apart, which the     */    \
        /* block packs a tile at a time into tile (ATTN_FUSED_TILE numbers) just before     */    \
        /* each tile's products, so that the packed copy stays in the cache.                */    \
        const REAL *k, *v;                                                                         \
        size_t ldk, ldv;                                                                           \
        REAL *tile;                                                                                \
        size_t lk, hdk, hdv, hdv_pad;                                                              \
        const unsigned char *mask;  /* row i0 of the mask plane (rows lk apart), or NULL */        \
        int causal;                                                                                \
        REAL scale;                                                                                \
        REAL *out;                  /* row i0 of this head's output; rows ldo apart */             \
        size_t ldo;                                                                                \
        REAL *run_max, *run_sum;    /* nq each */                                                  \
        size_t fq;                  /* rows per sub-block: a multiple of MR, <= FQ_MAX */          \
        REAL *obuf;                 /* fq x hdv_pad scratch */                                     \
        REAL *sbuf;                 /* fq x ATTN_FUSED_BK scratch: one tile's weights */           \
        BF16_FIELDS                                                                                \
    } attn_fused_##SFX;

/* The bfloat16 products (block_b, pack_b) take a float block whose q, kt and vp are
 * bfloat16 instead (attention_fused_bf16.inc): q16 row i0 of this head's q rounded to
 * bfloat16, rows ldq16 apart, each row hdk rounded up to even numbers (the last one zero
 * for an odd hdk), and as many rows past nq as make whole register groups, zero; kt16
 * and vp16 packed by pack_b, or NULL with tile, which then holds pack_b's layout.  The
 * float kernel (block_f) ignores them. */
ATTN_FUSED_ARGS(double, d, )
ATTN_FUSED_ARGS(float, f, const uint16_t *q16; size_t ldq16; const uint16_t *kt16; const uint16_t *vp16;)

/* What a block reports (attn_kernel_path.block_d and block_f). */
#define ATTN_FUSED_NOT_FINITE 1
#define ATTN_FUSED_ROW_OVERFLOW 2

/* Numbers of `size` bytes one packed tile of K and V takes (attn_fused_*.tile): for
 * bfloat16 products (bf16), pack_b's layout in halves of a float each.  Whole cache
 * lines, as kt_key and hdv_pad rows of ATTN_FUSED_BK numbers are. */
#define ATTN_FUSED_TILE(kt_key, hdv_pad, bf16)                                                     \
    ((bf16) ? ((kt_key) + (hdv_pad)) * ATTN_FUSED_BK / 2 : ((kt_key) + (hdv_pad)) * ATTN_FUSED_BK)

/* Scratch numbers one call needs in obuf and sbuf together: whole cache lines
 * (hdv_pad and ATTN_FUSED_BK numbers are), so that sbuf after obuf is aligned too. */
#define ATTN_FUSED_SCRATCH(fq, hdv_pad) ((fq) * (hdv_pad) + (fq) * ATTN_FUSED_BK)

/* Query rows per sub-block for a second-level cache of l2 bytes, heads of
 * hdk (q, k) and hdv_pad (packed v) numbers of `size` bytes: as many rows as
 * fit, with their q and output, in half of L2 beside one key tile's K and V
 * (the other half left to the tiles streaming through and to the rest of
 * the process), in whole register groups, within [ATTN_FUSED_FQ_MIN,
 * ATTN_FUSED_FQ_MAX].  The rows' weights of a tile (sbuf) are not counted:
 * each is written and read back once per tile, and counting them gave fewer
 * rows and slower blocks.  The one rule; attn_fused_block_rows applies it to
 * this CPU. */
size_t attn_fused_rows_for_cache(size_t l2, size_t hdk, size_t hdv_pad, size_t size);

/* This CPU's second-level cache in bytes, as glibc reads it from cpuid;
 * ATTN_FUSED_L2_ASSUMED where it reports none (*reported 0 then, else 1;
 * reported may be NULL). */
size_t attn_fused_l2_bytes(int *reported);

/* attn_fused_rows_for_cache on this CPU's L2 (or the rows the unit tests
 * force: attn_fused_rows_for_testing). */
size_t attn_fused_block_rows(size_t hdk, size_t hdv_pad, size_t size);

/* hdv rounded up to whole packed rows for numbers of `size` bytes. */
static inline size_t attn_fused_vpad(size_t hdv, size_t size)
{
    size_t per = ATTN_FUSED_VPAD_BYTES / size;
    return (hdv + per - 1) / per * per;
}

/* One instruction-set path of the kernel. */
typedef struct attn_kernel_path {
    const char *name;
    int (*supported)(void);                         /* can this CPU run it */
    /* 1: its float and double kernels are another path's source (avx512's) built with a
     * bfloat16 instruction set too, so it differs in compute_precision bfloat16 only; the
     * tests of the float kernels leave it to that path. */
    int bf16_variant;
    /* The block described by a; returns ATTN_FUSED_NOT_FINITE when a row
     * maximum was not finite (an overflowing score: not_finite), plus
     * ATTN_FUSED_ROW_OVERFLOW when an output row came out not finite (to be
     * computed again), else 0.  Returns early, leaving the block incomplete,
     * once compute_stopped() is set. */
    int (*block_d)(const attn_fused_d *a);
    int (*block_f)(const attn_fused_f *a);
    /* Packs K and V of one (batch, head) in this path's layout (the sizes
     * above): k and v are its row 0, rows ldk and ldv apart; with vp NULL,
     * K alone (v unused). */
    void (*pack_d)(const double *k, size_t ldk, const double *v, size_t ldv, size_t lk,
                   size_t hdk, size_t hdv, size_t hdv_pad, double *kt, double *vp);
    void (*pack_f)(const float *k, size_t ldk, const float *v, size_t ldv, size_t lk,
                   size_t hdk, size_t hdv, size_t hdv_pad, float *kt, float *vp);
    /* The bfloat16 products (compute_precision bfloat16): block_f's block and result
     * with Q.K^T and P.V as products of bfloat16 numbers summed in float (the softmax
     * in float, as block_f's), on a->q16, kt16 and vp16.  pack_b packs K and V as
     * pack_f does, each number rounded to bfloat16 (ties to even), K by pairs of dims
     * (ATTN_FUSED_BF16_KT) and V by pairs of keys, V's rows zero from lk to the end of
     * its tile. */
    int (*block_b)(const attn_fused_f *a);
    void (*pack_b)(const float *k, size_t ldk, const float *v, size_t ldv, size_t lk,
                   size_t hdk, size_t hdv, size_t hdv_pad, uint16_t *kt, uint16_t *vp);
    /* x[i] = exp(x[i]) by the kernel's polynomial, for x[i] <= 0 (or -Inf);
     * exposed so that tests can hold it to exp and expf (the softmax itself
     * takes exp2 below, on the same polynomial). */
    void (*exp_d)(double *x, size_t n);
    void (*exp_f)(float *x, size_t n);
    /* x[i] = 2^x[i] as the softmax takes it (a polynomial; in double on
     * AVX-512, a table of 16 and a shorter one), for x[i] <= 0 (or -Inf), 0
     * below 2^-1022 (double) and 2^-126 (float); for the tests, as exp_*. */
    void (*exp2_d)(double *x, size_t n);
    void (*exp2_f)(float *x, size_t n);
    /* The reductions of the weights (attention_reduce.c, attention_reduce_vec.inc) on this
     * path's vectors.  reduce_scores: s (rows lds apart) = scale * q . k for nq query rows q
     * (ldq apart) against the keys [k0, k0 + nk) of kt, K packed by pack_* (vp NULL packs K
     * alone) into kt zeroed first, k0 a multiple of ATTN_FUSED_BK; writes nk rounded up to
     * ATTN_FUSED_BK scores a row (keys past lk score 0), which lds must hold, and nq rounded
     * up to ATTN_FUSED_MR rows (those past nq repeat row nq - 1), which s must hold. */
    void (*reduce_scores_d)(const double *q, size_t ldq, size_t nq, const double *kt,
                            size_t hdk, size_t k0, size_t nk, double scale, double *s,
                            size_t lds);
    void (*reduce_scores_f)(const float *q, size_t ldq, size_t nq, const float *kt, size_t hdk,
                            size_t k0, size_t nk, float scale, float *s, size_t lds);
    /* One row of n scores against its finite maximum m: p[j] = exp(s[j] - m) (0 for -Inf),
     * *l += sum p[j], *u += sum p[j] (s[j] - m); the sums kept in double (in float for at
     * most 64 keys at a time: within 1e-6 relative). */
    void (*reduce_weigh_d)(const double *s, size_t n, double m, double *p, double *l,
                           double *u);
    void (*reduce_weigh_f)(const float *s, size_t n, float m, float *p, double *l, double *u);
    /* acc[j] += exp(s[j] - m) * inv for one row of n scores (-Inf adds 0). */
    void (*reduce_receive_d)(const double *s, size_t n, double m, double inv, double *acc);
    void (*reduce_receive_f)(const float *s, size_t n, float m, float inv, float *acc);
    /* The largest of s[0..n), n >= 1; -Inf when all are, NaN when one is NaN. */
    double (*reduce_max_d)(const double *s, size_t n);
    float (*reduce_max_f)(const float *s, size_t n);
    /* The first j in [from, n) with s[j] > thr, or n (a NaN score is never above). */
    size_t (*reduce_above_d)(const double *s, size_t from, size_t n, double thr);
    size_t (*reduce_above_f)(const float *s, size_t from, size_t n, float thr);
} attn_kernel_path;

/* Numbers of packed bfloat16 K per key for heads of hdk: pack_b's pairs of dims. */
#define ATTN_FUSED_BF16_KT(hdk) (((hdk) + 1) / 2 * 2)

extern const attn_kernel_path attn_kernel_amx_bf16, attn_kernel_avx512_bf16, attn_kernel_avx512,
    attn_kernel_avx2, attn_kernel_portable;

/* Whether this CPU has AMX-BF16 tiles and Linux lets this process use them: cpuid, the
 * operating system's saving of the tile state (XCR0) and the permission asked once with
 * arch_prctl(ARCH_REQ_XCOMP_PERM).  0 where any is missing or refused: the amx_bf16 path
 * is then not run, and the auto choice falls back to the next path. */
int attn_fused_amx_usable(void);

/* Chooses the path: "auto" or NULL for the widest this CPU runs, or a path
 * by name.  Returns 0, or -1 with a message in err (unknown name, or a path
 * this CPU cannot run), the choice unchanged. */
int attn_kernel_select(const char *name, char *err, size_t errlen);

/* The path in use (the auto choice until attn_kernel_select succeeds). */
const attn_kernel_path *attn_kernel_current(void);

/* The paths this CPU can run, widest first; returns how many (at most max). */
size_t attn_kernel_available(const attn_kernel_path **paths, size_t max);

#endif

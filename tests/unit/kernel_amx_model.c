/*
 * kernel_amx_model.c - the amx_bf16 path of the fused kernel
 * (server/kernel/attention_fused_amx.c, which this includes) run on a software model
 * of the AMX tiles, so that the unit tests hold that path's source to the reference on
 * any CPU with AVX512_BF16: its tile shapes, strides and layout, every tile instruction
 * it issues and on which thread.  main.c adds it to the paths as "amx_bf16-model"; the
 * server has no such path.  What the model cannot check is the hardware's side: the
 * instructions' encoding, Linux's permission request (attention_fused.c) and the speed.
 *
 * The model follows the operations and faults of Intel's Software Developer's Manual
 * (vol. 2: LDTILECFG, TILERELEASE, TILEZERO, TILELOADD, TILESTORED, TDPBF16PS), as far
 * as the path can meet them: the tiles and their configuration are the thread's; an
 * instruction the hardware would fault on (no configuration, a tile left unconfigured,
 * shapes that do not make a product, registers not distinct) stops the process with
 * what was wrong, as the fault would.  A load reads, and a store writes, rows x colsb
 * bytes at base + row x stride, so that AddressSanitizer (unit-asan) sees every byte the
 * hardware would touch.  TDPBF16PS's arithmetic is the manual's: per output number, the
 * even and the odd products of the pairs summed apart over k by float FMAs, then both
 * added to the sum in the tile; denormal inputs read as zero and denormal results
 * flushed.  Built with the flags of the avx512_bf16 path (Makefile).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AMX_TILES 8
#define AMX_ROWS 16             /* palette 1: 16 rows of at most 64 bytes a tile */
#define AMX_COLSB 64

typedef struct amx_model_state {
    int configured;
    uint8_t rows[AMX_TILES];
    uint16_t colsb[AMX_TILES];
    unsigned char data[AMX_TILES][AMX_ROWS][AMX_COLSB];
} amx_model_state;

static _Thread_local amx_model_state amx;

static void amx_fault(const char *what, int tile)
{
    fprintf(stderr, "amx model: %s (tmm%d); the hardware would fault here\n", what, tile);
    abort();
}

/* A tile an instruction names: configured on this thread, and with a shape. */
static void amx_check(int t, const char *op)
{
    if (!amx.configured)
        amx_fault(op, t);
    if (t < 0 || t >= AMX_TILES || amx.rows[t] == 0)
        amx_fault("a tile the configuration leaves empty", t);
}

static void amx_model_loadconfig(const void *config)
{
    const unsigned char *c = config;
    uint16_t colsb[16];
    memcpy(colsb, c + 16, sizeof colsb);
    if (c[0] > 1)
        amx_fault("LDTILECFG: a palette other than 0 and 1", -1);
    for (int i = 2; i < 16; i++)
        if (c[i] != 0)
            amx_fault("LDTILECFG: reserved bytes not zero", -1);
    memset(&amx, 0, sizeof amx);
    if (c[0] == 0)
        return;     /* palette 0: the initial state, nothing configured */
    for (int t = 0; t < 16; t++) {
        uint8_t rows = c[48 + t];
        /* a tile has both rows and bytes a row or neither; those past the eight, neither */
        if ((rows == 0) != (colsb[t] == 0) || rows > AMX_ROWS || colsb[t] > AMX_COLSB ||
            (t >= AMX_TILES && rows != 0))
            amx_fault("LDTILECFG: a tile's rows or bytes a row out of range", t);
        if (t < AMX_TILES) {
            amx.rows[t] = rows;
            amx.colsb[t] = colsb[t];
        }
    }
    amx.configured = 1;
}

static void amx_model_release(void)
{
    memset(&amx, 0, sizeof amx);
}

static void amx_model_zero(int t)
{
    amx_check(t, "TILEZERO without a tile configuration");
    memset(amx.data[t], 0, sizeof amx.data[t]);
}

static void amx_model_loadd(int t, const void *base, long stride)
{
    amx_check(t, "TILELOADD without a tile configuration");
    memset(amx.data[t], 0, sizeof amx.data[t]);
    for (int r = 0; r < amx.rows[t]; r++)
        memcpy(amx.data[t][r], (const unsigned char *)base + r * stride, amx.colsb[t]);
}

static void amx_model_stored(int t, void *base, long stride)
{
    amx_check(t, "TILESTORED without a tile configuration");
    for (int r = 0; r < amx.rows[t]; r++)
        memcpy((unsigned char *)base + r * stride, amx.data[t][r], amx.colsb[t]);
}

/* A float with denormals read as zero, as the tiles read them (and write them). */
static float amx_daz(float x)
{
    return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x;
}

static float amx_bf16(const unsigned char *row, int i)
{
    uint16_t h;
    memcpy(&h, row + 2 * i, sizeof h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return amx_daz(f);
}

static void amx_model_dpbf16ps(int dst, int a, int b)
{
    amx_check(dst, "TDPBF16PS without a tile configuration");
    amx_check(a, "TDPBF16PS without a tile configuration");
    amx_check(b, "TDPBF16PS without a tile configuration");
    if (dst == a || dst == b || a == b)
        amx_fault("TDPBF16PS: registers not distinct", dst);
    if (amx.rows[a] != amx.rows[dst] || amx.colsb[a] / 4 != amx.rows[b] ||
        amx.colsb[b] != amx.colsb[dst] || amx.colsb[dst] % 4 != 0 || amx.colsb[a] % 4 != 0)
        amx_fault("TDPBF16PS: shapes that make no product", dst);
    for (int m = 0; m < amx.rows[dst]; m++)
        for (int n = 0; n < amx.colsb[dst] / 4; n++) {
            float even = 0, odd = 0, sum;
            for (int k = 0; k < amx.colsb[a] / 4; k++) {
                even = amx_daz(fmaf(amx_bf16(amx.data[a][m], 2 * k),
                                    amx_bf16(amx.data[b][k], 2 * n), even));
                odd = amx_daz(fmaf(amx_bf16(amx.data[a][m], 2 * k + 1),
                                   amx_bf16(amx.data[b][k], 2 * n + 1), odd));
            }
            memcpy(&sum, amx.data[dst][m] + 4 * n, sizeof sum);
            sum = amx_daz(amx_daz(amx_daz(sum) + even) + odd);
            memcpy(amx.data[dst][m] + 4 * n, &sum, sizeof sum);
        }
}

/* The intrinsics the path calls, on the model: <immintrin.h> defines the tile
 * operations as macros and the configuration's as inline functions, both replaced
 * here for what follows. */
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) amx_model_loadconfig(config)
#define _tile_release() amx_model_release()
#define _tile_zero(t) amx_model_zero(t)
#define _tile_loadd(t, base, stride) amx_model_loadd(t, base, stride)
#define _tile_stored(t, base, stride) amx_model_stored(t, base, stride)
#define _tile_dpbf16ps(dst, a, b) amx_model_dpbf16ps(dst, a, b)

#define PATH amx_bf16_model
#define PATH_NAME "amx_bf16-model"
#define PATH_TARGET "avx512f,fma,avx512bf16"
#define PATH_SUPPORTED (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
#include "kernel/attention_fused_amx.c"

/*
 * test_compress.c - gzip and deflate bodies: round trips, the header values,
 * a bomb stopped by the sink, damaged and cut-short streams, out of memory.
 */
#include <stdlib.h>
#include <string.h>

#include "http/compress.h"
#include "core/mem.h"
#include "test.h"
#include "core/test_hooks.h"

/* A sink that gathers up to cap bytes and stops past them. */
typedef struct gather { char *data; size_t len, cap; } gather;

static int gather_sink(void *ctx, const char *data, size_t n)
{
    gather *g = ctx;
    if (g->len + n > g->cap)
        return 7;
    memcpy(g->data + g->len, data, n);
    g->len += n;
    return 0;
}

/* Inflates in[0..n) fed in pieces of `step` bytes; returns the last code. */
static int inflate_all(compress_kind kind, const char *in, size_t n, size_t step, gather *g,
                       int *done)
{
    compress_inflater *inf = compress_inflater_new(kind);
    if (inf == NULL)
        return COMPRESS_NOMEM;
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += step)
        rc = compress_inflate(inf, in + at, at + step > n ? n - at : step, gather_sink, g);
    *done = compress_inflater_done(inf);
    compress_inflater_free(inf);
    return rc;
}

void test_compress_round_trips(void)
{
    static char text[50000];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = "0123456789,.[] e-"[(i * 7 + i / 13) % 17];
    static char back[sizeof text];
    for (int k = COMPRESS_GZIP; k <= COMPRESS_DEFLATE; k++) {
        size_t len = 0;
        char *z = compress_deflate((compress_kind)k, text, sizeof text, &len);
        ASSERT(z != NULL && len < sizeof text);
        gather g = {back, 0, sizeof back};
        int done = 0;
        int rc = inflate_all((compress_kind)k, z, len, 100, &g, &done);
        /* cut short: no error, but not done */
        gather cut = {back, 0, sizeof back};
        int cut_done = 1;
        int cut_rc = inflate_all((compress_kind)k, z, len - 3, 1000, &cut, &cut_done);
        mem_free(z);
        ASSERT_EQ(rc, 0);
        ASSERT(done);
        ASSERT_EQ(g.len, sizeof text);
        ASSERT(memcmp(back, text, sizeof text) == 0);
        ASSERT_EQ(cut_rc, 0);
        ASSERT(!cut_done);
    }
}

/* Past COMPRESS_SPLIT_FROM the two halves deflated apart make one stream of either framing,
 * whose check value (gzip's crc32 and length, zlib's adler32) the inflater verifies; an odd
 * size puts the halves' seam mid-line.  Memory failures at every step end in NULL, with
 * nothing left allocated. */
void test_compress_split_round_trips(void)
{
    size_t n = COMPRESS_SPLIT_FROM + 12345;
    char *text = malloc(n), *back = malloc(n);
    ASSERT(text != NULL && back != NULL);
    for (size_t i = 0; i < n; i++)
        text[i] = "0123456789,.[] e-"[(i * 7 + i / 13 + i / 4099) % 17];
    for (int k = COMPRESS_GZIP; k <= COMPRESS_DEFLATE; k++) {
        size_t len = 0;
        char *z = compress_deflate((compress_kind)k, text, n, &len);
        gather g = {back, 0, n};
        int done = 0, rc = z != NULL ? inflate_all((compress_kind)k, z, len, 65536, &g, &done) : -1;
        mem_free(z);
        if (!(z != NULL && len < n / 2 && rc == 0 && done && g.len == n &&
              memcmp(back, text, n) == 0))
            FAIL_AT("%s: %zu bytes, inflated %d (done %d) to %zu",
                    compress_name((compress_kind)k), len, rc, done, g.len);
    }
    for (long fail = 0;; fail++) {
        mem_fail_after(fail);
        size_t len = 0;
        char *z = compress_deflate(COMPRESS_DEFLATE, text, n, &len);
        mem_free(z);
        long failures = mem_failures(), live = mem_fail_live();
        mem_fail_reset();
        ASSERT_EQ(live, 0);
        if (failures == 0) {
            ASSERT(z != NULL);
            break;
        }
        ASSERT(z == NULL);
        ASSERT(fail < 100);
    }
    free(text);
    free(back);
}

void test_compress_bomb_and_damage(void)
{
    /* 8 MiB of zeros deflate to a few KiB; the sink stops at 64 KiB. */
    size_t big = (size_t)8 << 20, len = 0;
    char *zeros = calloc(1, big);
    ASSERT(zeros != NULL);
    char *z = compress_deflate(COMPRESS_GZIP, zeros, big, &len);
    free(zeros);
    ASSERT(z != NULL && len < 65536);
    static char small[65536];
    gather g = {small, 0, sizeof small};
    int done;
    int rc = inflate_all(COMPRESS_GZIP, z, len, len, &g, &done);
    z[len / 2] ^= 0x55; /* damage the middle */
    gather g2 = {small, 0, sizeof small};
    int rc2 = inflate_all(COMPRESS_GZIP, z + 10, len - 10, len, &g2, &done);
    mem_free(z);
    ASSERT_EQ(rc, 7);
    ASSERT(g.len <= sizeof small);
    ASSERT(rc2 == COMPRESS_CORRUPT || rc2 == 7);
    gather g3 = {small, 0, sizeof small};
    ASSERT_EQ(inflate_all(COMPRESS_GZIP, "not gzip at all", 15, 15, &g3, &done), COMPRESS_CORRUPT);
}

void test_compress_gzip_members(void)
{
    /* Two gzip members one after the other inflate to both texts; a zlib stream
     * followed by a second one is refused. */
    size_t la = 0, lb = 0;
    char *a = compress_deflate(COMPRESS_GZIP, "hello, ", 7, &la);
    char *b = compress_deflate(COMPRESS_GZIP, "world", 5, &lb);
    ASSERT(a != NULL && b != NULL);
    char *both = malloc(la + lb);
    ASSERT(both != NULL);
    memcpy(both, a, la);
    memcpy(both + la, b, lb);
    char out[32];
    int done;
    for (size_t step = 1; step <= la + lb; step += 5) {
        gather g = {out, 0, sizeof out};
        ASSERT_EQ(inflate_all(COMPRESS_GZIP, both, la + lb, step, &g, &done), 0);
        ASSERT(done);
        ASSERT_EQ(g.len, 12);
        ASSERT(memcmp(out, "hello, world", 12) == 0);
    }
    gather g = {out, 0, sizeof out};
    ASSERT_EQ(inflate_all(COMPRESS_GZIP, both, la + lb - 2, la + lb, &g, &done), 0);
    ASSERT(!done); /* the second member is cut */
    mem_free(a);
    mem_free(b);
    size_t room = la + lb;
    a = compress_deflate(COMPRESS_DEFLATE, "hello", 5, &la);
    ASSERT(a != NULL && 2 * la <= room);
    memcpy(both, a, la);
    memcpy(both + la, a, la);
    gather g2 = {out, 0, sizeof out};
    ASSERT_EQ(inflate_all(COMPRESS_DEFLATE, both, 2 * la, 2 * la, &g2, &done), COMPRESS_CORRUPT);
    mem_free(a);
    free(both);
}

void test_compress_raw_deflate_accepted(void)
{
    /* A raw deflate stream (no zlib header) of "hello": one stored block. */
    const char raw[] = {0x01, 0x05, 0x00, (char)0xfa, (char)0xff, 'h', 'e', 'l', 'l', 'o'};
    char out[16];
    gather g = {out, 0, sizeof out};
    int done;
    ASSERT_EQ(inflate_all(COMPRESS_DEFLATE, raw, sizeof raw, sizeof raw, &g, &done), 0);
    ASSERT(done);
    ASSERT_EQ(g.len, 5);
    ASSERT(memcmp(out, "hello", 5) == 0);
}

void test_compress_header_values(void)
{
    compress_kind k;
    ASSERT(compress_encoding_parse(NULL, &k) == 0 && k == COMPRESS_NONE);
    ASSERT(compress_encoding_parse("identity", &k) == 0 && k == COMPRESS_NONE);
    ASSERT(compress_encoding_parse("GZIP", &k) == 0 && k == COMPRESS_GZIP);
    ASSERT(compress_encoding_parse("deflate", &k) == 0 && k == COMPRESS_DEFLATE);
    ASSERT_EQ(compress_encoding_parse("br", &k), -1);
    ASSERT_EQ(compress_encoding_parse("gzip, br", &k), -1);
    ASSERT_EQ(compress_accepted(NULL), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("br"), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("deflate, gzip;q=0.5"), COMPRESS_DEFLATE);
    ASSERT_EQ(compress_accepted("deflate;q=1, gzip;q=0.001"), COMPRESS_DEFLATE);
    ASSERT_EQ(compress_accepted("gzip, deflate"), COMPRESS_GZIP);
    ASSERT_EQ(compress_accepted("deflate;q=0.5, gzip;q=0.5"), COMPRESS_GZIP);
    ASSERT_EQ(compress_accepted("gzip;q=0, deflate"), COMPRESS_DEFLATE);
    ASSERT_EQ(compress_accepted("*"), COMPRESS_GZIP);
    /* A coding's own q=0 forbids it whatever "*" allows, in either order. */
    ASSERT_EQ(compress_accepted("gzip;q=0, *"), COMPRESS_DEFLATE);
    ASSERT_EQ(compress_accepted("*, gzip;q=0"), COMPRESS_DEFLATE);
    ASSERT_EQ(compress_accepted("gzip;q=0, deflate;q=0, *"), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("*;q=0"), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("identity"), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("identity;q=1, gzip;q=0.5"), COMPRESS_NONE);
    ASSERT_EQ(compress_accepted("identity;q=0.5, gzip"), COMPRESS_GZIP);
    ASSERT_STR_EQ(compress_name(COMPRESS_DEFLATE), "deflate");
}

void test_compress_out_of_memory(void)
{
    static char text[4000];
    memset(text, 'a', sizeof text);
    for (long n = 0;; n++) {
        mem_fail_after(n);
        size_t len = 0;
        char *z = compress_deflate(COMPRESS_GZIP, text, sizeof text, &len);
        int rc = -1, done = 0;
        char out[sizeof text];
        gather g = {out, 0, sizeof out};
        if (z != NULL)
            rc = inflate_all(COMPRESS_GZIP, z, len, len, &g, &done);
        mem_free(z);
        long failures = mem_failures(), live = mem_fail_live();
        mem_fail_reset();
        ASSERT_EQ(live, 0);
        if (failures == 0) {
            ASSERT(rc == 0 && done && g.len == sizeof text);
            break;
        }
        ASSERT(z == NULL || rc == COMPRESS_NOMEM);
        ASSERT(n < 100);
    }
}

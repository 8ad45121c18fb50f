/*
 * test_safetensors.c - the safetensors parser on good and bad files, the
 * exact widening of F16 and BF16, and the F64 writer read back.
 */
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "checkpoint/safetensors.h"
#include "test.h"
#include "core/test_hooks.h"

/* Builds a file from a header text and raw data bytes into buf (which holds
 * cap bytes); returns its length.  The header length written is
 * header_len_override when it is not 0. */
static size_t make_file(unsigned char *buf, size_t cap, const char *header, const void *data,
                        size_t data_len, unsigned long long header_len_override)
{
    size_t n = strlen(header);
    unsigned long long stated = header_len_override ? header_len_override : n;
    if (8 + n + data_len > cap)
        return 0;
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)(stated >> (8 * b));
    memcpy(buf + 8, header, n);
    if (data_len)
        memcpy(buf + 8 + n, data, data_len);
    return 8 + n + data_len;
}

/* Parses a file made of header and data and expects it refused with code
 * and a message containing needle. */
static int refused(const char *header, const void *data, size_t data_len,
                   unsigned long long stated, size_t cut, const char *code, const char *needle)
{
    unsigned char buf[1024];
    size_t len = make_file(buf, sizeof buf, header, data, data_len, stated);
    st_file f;
    attn_error err;
    error_clear(&err);
    int rc = safetensors_parse(buf, len - cut, &f, &err);
    int ok = rc == ERR_BAD_REQUEST && !strcmp(err.code, code) && strstr(err.message, needle) &&
             !strcmp(err.field, "body") && f.tensors == NULL;
    if (!ok)
        fprintf(stderr, "  header %s: rc %d code %s message %s\n", header, rc, err.code,
                err.message);
    safetensors_free(&f);
    return ok;
}

void test_safetensors_good_file(void)
{
    /* Two F32 values, then one F64, with metadata and padding spaces. */
    unsigned char data[16];
    float a = 1.5f, b = -0.25f;
    double c = 3.0;
    memcpy(data, &a, 4);
    memcpy(data + 4, &b, 4);
    memcpy(data + 8, &c, 8);
    const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
                         "\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[8,16]}}   ";
    unsigned char buf[512];
    size_t len = make_file(buf, sizeof buf, header, data, sizeof data, 0);
    st_file f;
    attn_error err;
    ASSERT_EQ(safetensors_parse(buf, len, &f, &err), 0);
    ASSERT_EQ(f.count, 2);
    const st_tensor *w = safetensors_find(&f, "w");
    const st_tensor *s = safetensors_find(&f, "a");
    ASSERT(w != NULL && s != NULL && safetensors_find(&f, "__metadata__") == NULL);
    ASSERT_EQ(w->ndim, 2);
    ASSERT_EQ(w->shape[1], 2);
    ASSERT_EQ(w->count, 2);
    ASSERT(safetensors_get(w, 0) == 1.5 && safetensors_get(w, 1) == -0.25);
    ASSERT_EQ(s->ndim, 0);
    ASSERT(safetensors_get(s, 0) == 3.0);
    safetensors_free(&f);
    safetensors_free(&f); /* a freed file may be freed again */
}

void test_safetensors_bad_files(void)
{
    const unsigned char zeros[16] = {0};
    const char *one = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    /* Truncated: fewer than 8 bytes, and the data cut short. */
    ASSERT(refused("{}", NULL, 0, 0, 5, "invalid_safetensors", "fewer than the 8"));
    ASSERT(refused(one, zeros, 8, 0, 3, "invalid_safetensors", "truncated"));
    ASSERT(refused(one, zeros, 8, 1000, 0, "invalid_safetensors", "past the end of the body"));
    ASSERT(refused("{\"w\": [1,", zeros, 8, 0, 0, "invalid_safetensors", "not JSON"));
    ASSERT(refused("[1, 2]", NULL, 0, 0, 0, "invalid_safetensors", "not an object"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", zeros,
                   8, 0, 0, "invalid_safetensors", "only 8 bytes"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", zeros, 16,
                   0, 0, "invalid_safetensors", "make 12 bytes but its data_offsets span 8"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   zeros, 16, 0, 0, "invalid_safetensors", "overlap"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", zeros, 8,
                   0, 0, "invalid_safetensors", "begin"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", zeros, 8,
                   0, 0, "invalid_safetensors", "dimension 0"));
    ASSERT(refused("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", zeros, 8,
                   0, 0, "unsupported_dtype", "does not read"));
    ASSERT(refused("{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,8]}}", zeros, 8,
                   0, 0, "unsupported_dtype", "does not define"));
    ASSERT(refused("{\"__metadata__\":{\"n\":1}}", NULL, 0, 0, 0, "invalid_safetensors",
                   "not a string"));
    ASSERT(refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   zeros, 8, 0, 0, "invalid_safetensors", "not JSON"));
}

void test_safetensors_half_widening(void)
{
    /* F16: 1.0, -2.0, smallest subnormal 2^-24, largest 65504, 1/3 rounded;
     * BF16: 1.0, -2.0 and 0x3eab (the top half of float 1/3). */
    const unsigned char f16[] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b, 0x55, 0x35};
    const unsigned char bf16[] = {0x80, 0x3f, 0x00, 0xc0, 0xab, 0x3e};
    unsigned char data[16];
    memcpy(data, f16, sizeof f16);
    memcpy(data + 10, bf16, sizeof bf16);
    const char *header = "{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[10,16]}}";
    unsigned char buf[256];
    size_t len = make_file(buf, sizeof buf, header, data, sizeof data, 0);
    st_file f;
    attn_error err;
    ASSERT_EQ(safetensors_parse(buf, len, &f, &err), 0);
    const st_tensor *h = safetensors_find(&f, "h"), *b = safetensors_find(&f, "b");
    ASSERT(h != NULL && b != NULL);
    ASSERT(safetensors_get(h, 0) == 1.0 && safetensors_get(h, 1) == -2.0);
    ASSERT(safetensors_get(h, 2) == ldexp(1.0, -24));
    ASSERT(safetensors_get(h, 3) == 65504.0);
    ASSERT(safetensors_get(h, 4) == 1365.0 / 4096.0); /* 0x3555: 1.0101010101b x 2^-2 */
    ASSERT(safetensors_get(b, 0) == 1.0 && safetensors_get(b, 1) == -2.0);
    uint32_t bits = 0x3eab0000u;
    float third;
    memcpy(&third, &bits, 4);
    ASSERT(safetensors_get(b, 2) == (double)third);
    safetensors_free(&f);
}

void test_safetensors_write_read_back(void)
{
    double m[6] = {0.1, -1e-300, 3.0, 1.0 / 3.0, 2.5e10, -0.0}, v[2] = {7.0, -8.5};
    st_out out[] = {{"wq", 2, 3, m, NULL}, {"bq", 0, 2, v, NULL}};
    const char *meta[] = {"heads", "2", "layout", "in_out"};
    size_t len = 0;
    unsigned char *file = safetensors_write(out, 2, meta, 2, &len);
    ASSERT(file != NULL);
    uint64_t header_len = 0;
    for (int b = 7; b >= 0; b--)
        header_len = header_len << 8 | file[b];
    ASSERT_EQ((8 + header_len) % 8, 0);
    st_file f;
    attn_error err;
    int rc = safetensors_parse(file, len, &f, &err);
    if (rc != 0)
        mem_free(file);
    ASSERT_EQ(rc, 0);
    const st_tensor *wq = safetensors_find(&f, "wq"), *bq = safetensors_find(&f, "bq");
    int same = wq != NULL && bq != NULL && wq->ndim == 2 && wq->shape[0] == 2 &&
               wq->shape[1] == 3 && bq->ndim == 1 && bq->shape[0] == 2;
    for (size_t i = 0; same && i < 6; i++)
        same = memcmp(&m[i], &(double){safetensors_get(wq, i)}, 8) == 0;
    for (size_t i = 0; same && i < 2; i++)
        same = safetensors_get(bq, i) == v[i];
    safetensors_free(&f);
    mem_free(file);
    ASSERT(same);
}

void test_safetensors_out_of_memory(void)
{
    const char *header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    const unsigned char zeros[8] = {0};
    unsigned char buf[256];
    size_t len = make_file(buf, sizeof buf, header, zeros, 8, 0);
    for (long n = 0;; n++) {
        mem_fail_after(n);
        st_file f;
        attn_error err;
        int rc = safetensors_parse(buf, len, &f, &err);
        long failures = mem_failures(), live = mem_fail_live();
        safetensors_free(&f);
        mem_fail_reset();
        if (failures == 0) {
            ASSERT_EQ(rc, 0);
            break;
        }
        /* jansson reports some failed allocations inside its lexer as a
         * syntax error, which the server cannot tell from one. */
        if (rc != ERR_UNAVAILABLE && !(rc == ERR_BAD_REQUEST && strstr(err.message, "not JSON")))
            FAIL_AT("after %ld allocations: %s", n, err.message);
        ASSERT_EQ(live, 0);
        ASSERT(n < 100);
    }
}

/*
 * fuzz_api.c - libFuzzer harness for everything a request body reaches.
 *
 * Each input is split at its first byte: modulo 8, 0-3 choose the endpoint
 * (attention, PUT of a weight set, GET and DELETE of it), 4-7 v2 inference (model
 * "attention" or the set "fz", each with and without binary tensors); the
 * rest is the body.  For the binary framing the next two bytes give the
 * Inference-Header-Content-Length (little-endian), so the JSON header, the
 * binary_data_size fields and the raw bytes after them are all fuzzed.  The
 * first byte's bit 3 makes every array of numbers be read by json_fast, not only long
 * ones, and its bit 4 answers as an I/O thread would first (a request it
 * defers is answered again as by a worker).  Its bit 5 makes the PUT and the GET
 * of the set ?format=safetensors: the PUT's body is then a checkpoint file read
 * with the preset of bits 6-7 (torch_mha, hf_bert, gpt2, names) and the heads,
 * layer and layout of the next byte (safetensors_query), so the file format's
 * reader, the presets' name matching and the copy into arrays are fuzzed too.  The
 * server's own api_handle runs it with small limits, so the decoder, the
 * limit checks, the math and the store all see hostile input.  Build and run
 * with `make fuzz` (clang, ASan + UBSan); a crash, a leak or a sanitizer
 * report is a finding.  Every answer must be a JSON body with a status the
 * contract allows.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/sizing.h"
#include "router/api.h"
#include "core/config.h"
#include "json/json_fast.h"
#include "core/mem.h"
#include "checkpoint/safetensors.h"
#include "core/test_hooks.h"

static server_config fuzz_cfg;

/* The store's directory, made by LLVMFuzzerInitialize, is emptied and removed when a
 * run ends by exit() (its time or run count reached; the store keeps only flat files
 * there).  A finding ends by a signal and leaves it, beside the input that made it. */
static void remove_data_dir(void)
{
    DIR *d = opendir(fuzz_cfg.data_dir);
    if (d == NULL)
        return;
    int fd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            (void)unlinkat(fd, e->d_name, 0);
    closedir(d);
    (void)rmdir(fuzz_cfg.data_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char errbuf[256];
    char *args[] = {"fuzz", "--max-elements", "4096", "--max-request-memory", "16M",
                    "--max-set-bytes", "64K", "--max-store-bytes", "1M", NULL};
    FILE *sink = fopen("/dev/null", "w");
    int rc = config_load(&fuzz_cfg, 9, args, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    sizing_resolve(&fuzz_cfg, 1, "cores"); /* as main.c does */
    char dir[] = "/tmp/attn-fuzz-XXXXXX";
    if (rc != CONFIG_OK || mkdtemp(dir) == NULL)
        abort();
    snprintf(fuzz_cfg.data_dir, sizeof fuzz_cfg.data_dir, "%s", dir);
    atexit(remove_data_dir);
    mem_install_jansson();
    attn_error err;
    if (api_init(&fuzz_cfg, &err) != 0)
        abort();
    return 0;
}

/* The query of a safetensors request: ?format=safetensors and, for a PUT, the
 * arguments safetensors_query chose. */
typedef struct fuzz_query {
    const char *keys[12], *values[12];
    int n;
} fuzz_query;

static const char *fuzz_query_arg(const void *ctx, const char *key)
{
    const fuzz_query *q = ctx;
    for (int i = 0; i < q->n; i++)
        if (!strcmp(q->keys[i], key))
            return q->values[i];
    return NULL;
}

static void query_add(fuzz_query *q, const char *key, const char *value)
{
    q->keys[q->n] = key;
    q->values[q->n++] = value;
}

/* A PUT's preset from bits 6-7 of the first byte; heads (1 to 4), layer (none,
 * all, 0 or 1) and layout (out_in or in_out, for names) from the byte after it. */
static void safetensors_query(fuzz_query *q, unsigned char first, unsigned char args)
{
    static const char *const presets[] = {"torch_mha", "hf_bert", "gpt2", "names"};
    static const char *const heads[] = {"1", "2", "3", "4"};
    static const char *const layers[] = {NULL, "all", "0", "1"};
    query_add(q, "preset", presets[first >> 6]);
    query_add(q, "heads", heads[args & 3]);
    if (layers[(args >> 2) & 3] != NULL)
        query_add(q, "layer", layers[(args >> 2) & 3]);
    if (first >> 6 == 3) {
        query_add(q, "layout", args & 16 ? "in_out" : "out_in");
        query_add(q, "wq", "q.weight");
        query_add(q, "wk", "k.weight");
        query_add(q, "wv", "v.weight");
        query_add(q, "wo", "o.weight");
        query_add(q, "bq", "q.bias");
    }
}

/* A stored set answered as a file must be one the server's own reader takes
 * (a lack of memory there is not the file's fault). */
static int is_safetensors(const char *body, size_t len)
{
    st_file file;
    attn_error err;
    int rc = safetensors_parse(body, len, &file, &err);
    safetensors_free(&file);
    return rc != ERR_BAD_REQUEST;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static const char *const methods[] = {"POST", "PUT", "GET", "DELETE", "POST", "POST", "POST", "POST"};
    static const char *const paths[] = {"/v1/attention", "/v1/weight-sets/fz", "/v1/weight-sets/fz",
                                        "/v1/weight-sets/fz", "/v2/models/attention/infer",
                                        "/v2/models/attention/infer", "/v2/models/fz/infer",
                                        "/v2/models/fz/versions/1/infer"};
    if (size == 0)
        return 0;
    int which = data[0] % 8;
    /* Bit 3 of the first byte: every array of numbers read fast (json_fast.h),
     * so the decoders see both kinds of array whatever their length.  Bit 4:
     * answered as on an I/O thread first, and by a "worker" when deferred. */
    json_fast_set_min_numbers(data[0] & 8 ? 1 : 0);
    api_request req = {.method = methods[which], .path = paths[which],
                       .body = (const char *)data + 1, .body_len = size - 1,
                       .io_thread = (data[0] & 16) != 0};
    char header_length[16];
    if ((which == 5 || which == 7) && size >= 3) {
        snprintf(header_length, sizeof header_length, "%u", (unsigned)(data[1] | data[2] << 8));
        req.body = (const char *)data + 3;
        req.body_len = size - 3;
        req.inference_header_length = api_length_parse(header_length);
    }
    /* Bit 5: the set as a safetensors file (a PUT's body after its argument byte). */
    fuzz_query query = {.n = 0};
    int safetensors = (data[0] & 32) && (which == 1 || which == 2) && size >= 2;
    if (safetensors) {
        query_add(&query, "format", "safetensors");
        if (which == 1) {
            safetensors_query(&query, data[0], data[1]);
            req.body = (const char *)data + 2;
            req.body_len = size - 2;
        }
        req.query_arg = fuzz_query_arg;
        req.query_ctx = &query;
    }
    api_response resp;
    api_handle(&req, &resp);
    if (resp.deferred) {
        api_response_free(&resp);
        req.io_thread = 0;
        api_handle(&req, &resp);
        if (resp.deferred)
            abort();
    }
    int s = resp.status;
    if (!(s == 200 || s == 201 || s == 204 || s == 400 || s == 404 || s == 413 || s == 503))
        abort();
    /* A GET of the set as safetensors answers the file; every other answer is JSON. */
    if (safetensors && which == 2 && s == 200) {
        if (!is_safetensors(resp.body, resp.body_len))
            abort();
    } else if (s != 204 && (resp.body == NULL || resp.body[0] != '{')) {
        abort();
    }
    api_response_free(&resp);
    return 0;
}

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
 * defers is answered again as by a worker).  The
 * server's own api_handle runs it with small limits, so the decoder, the
 * limit checks, the math and the store all see hostile input.  Build and run
 * with `make fuzz` (clang, ASan + UBSan); a crash, a leak or a sanitizer
 * report is a finding.  Every answer must be a JSON body with a status the
 * contract allows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "config.h"
#include "json_fast.h"
#include "mem.h"
#include "test_hooks.h"

static server_config fuzz_cfg;

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
    char dir[] = "/tmp/attn-fuzz-XXXXXX";
    if (rc != CONFIG_OK || mkdtemp(dir) == NULL)
        abort();
    snprintf(fuzz_cfg.data_dir, sizeof fuzz_cfg.data_dir, "%s", dir);
    mem_install_jansson();
    attn_error err;
    if (api_init(&fuzz_cfg, &err) != 0)
        abort();
    return 0;
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
    api_request req = {methods[which], paths[which], (const char *)data + 1, size - 1, NULL, NULL,
                       (data[0] & 16) != 0, NULL};
    char header_length[16];
    if ((which == 5 || which == 7) && size >= 3) {
        snprintf(header_length, sizeof header_length, "%u", (unsigned)(data[1] | data[2] << 8));
        req.body = (const char *)data + 3;
        req.body_len = size - 3;
        req.inference_header_length = header_length;
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
    if (s != 204 && (resp.body == NULL || resp.body[0] != '{'))
        abort();
    api_response_free(&resp);
    return 0;
}

/*
 * fuzz_grpc.c - libFuzzer on the gRPC front-end's ModelInfer: the bytes of a
 * request message decoded by protobuf-c, turned into the body of the HTTP v2
 * twin, answered by the router (the real one, over a store in a temporary
 * directory), and the answer built as a ModelInferResponse and as a stream's
 * answer.  Any crash, leak or sanitizer report is a finding; so is an answer
 * that says OK with bytes protobuf-c cannot read back, and an unpacking whose
 * counting allocator (grpc_unpack.c) hands out more than its cap or does not
 * get back every byte it handed out.
 *
 *   make fuzz          (this target runs after fuzz-api, for FUZZ_SECONDS)
 */
#include <dirent.h>
#include <inference.pb-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/mem.h"
#include "grpc/grpc_private.h"
#include "router/api.h"

static server_config fuzz_cfg;

/* The store's directory is emptied and removed at exit. */
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
    char *args[] = {"fuzz", "--max-elements", "4096", "--max-request-memory", "16M", NULL};
    FILE *sink = fopen("/dev/null", "w");
    int rc = config_load(&fuzz_cfg, 5, args, NULL, sink, errbuf, sizeof errbuf);
    fclose(sink);
    char dir[] = "/tmp/attn-fuzz-grpc-XXXXXX";
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

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    /* the decoder alone, under a cap that the larger inputs pass */
    static const grpc_unpack_limit limits[] = {{"inputs", API_INFER_MAX_INPUTS},
                                               {"outputs", API_INFER_MAX_OUTPUTS}};
    grpc_unpack_budget b;
    grpc_unpack_budget_init(&b, 2 * size + 256);
    grpc_answer a;
    memset(&a, 0, sizeof a);
    ProtobufCMessage *m = grpc_unpack(&inference__model_infer_request__descriptor, data, size,
                                      limits, 2, &b, &a);
    if (b.used > b.cap || (m == NULL) == (a.code == GRPC_STATUS_OK) ||
        (b.refused && a.code != GRPC_STATUS_RESOURCE_EXHAUSTED))
        abort();
    if (m != NULL)
        protobuf_c_message_free_unpacked(m, &b.allocator);
    if (b.live != 0)
        abort();
    grpc_infer_answer(data, size, grpc_infer_unpack_bound(size), 0, 0, 0, &a);
    if (a.code == GRPC_STATUS_OK) {
        Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, a.len,
                                                                                  a.bytes);
        if (r == NULL)
            abort();
        inference__model_infer_response__free_unpacked(r, NULL);
    }
    free(a.bytes);
    /* the same request in a stream: a response inside the stream's, or its error */
    grpc_infer_answer(data, size, grpc_infer_unpack_bound(size), 0, 0, 1, &a);
    grpc_infer_stream_error(&a);
    if (a.code != GRPC_STATUS_OK || a.bytes == NULL)
        abort();
    Inference__ModelStreamInferResponse *w =
        inference__model_stream_infer_response__unpack(NULL, a.len, a.bytes);
    if (w == NULL)
        abort();
    inference__model_stream_infer_response__free_unpacked(w, NULL);
    free(a.bytes);
    return 0;
}

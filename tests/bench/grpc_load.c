/*
 * grpc_load.c - a load client on gRPC's C core for the server's ModelInfer:
 * the gRPC counterpart of wrk in the HTTP benchmarks.
 *
 * Builds one ModelInferRequest for the model "attention" (q of Lq x d, k and
 * v of Lk x d, FP32 as raw_input_contents, the outputs named by --outputs),
 * then keeps --concurrency calls in flight on one shared channel for
 * --seconds (and at most --max-calls calls in all), each started again as
 * soon as it ends, from --threads client threads (default 1) that each drive
 * their share on a completion queue of their own, and prints one line:
 *
 *   GRPC calls=N seconds=S rps=R mean_ms=M p50_ms=P p99_ms=Q compute_ms=C failed=F
 *        client_cpu_s=U
 *
 * client_cpu_s is the CPU time this client spent (user and system): on one
 * machine it is taken from the server, as wrk's is in the HTTP runs.
 * compute_ms is the mean of the server's own compute_ms (the kernel's time,
 * from the response's parameters), so mean_ms / compute_ms is what the
 * protocol costs around the computation.  Any call that is not OK counts in
 * failed (and the exit status is 1).
 *
 * Two options let a benchmark send HTTP the same bytes and check the answers:
 * --write-v2 FILE writes the same q, k, v and outputs as a binary HTTP v2
 * request (the JSON header, then the little-endian bytes; FILE.hlen holds the
 * header's length for Inference-Header-Content-Length), and --save-output FILE
 * writes the raw_output_contents of the first answered call, one after another.
 *
 *   grpc-load --target 127.0.0.1:8001 --lq 4096 --lk 4096 --d 64 --concurrency 1 --seconds 5
 */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <inference.pb-c.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct load {
    grpc_channel *channel;
    unsigned char *msg;
    size_t msg_len;
    double until;               /* monotonic seconds */
    long max_calls;
    pthread_mutex_t lock;
    long started, calls, failed;
    double *lat;                /* seconds of each call */
    double compute_ms;          /* sum */
    const char *save_output;    /* --save-output, until the first answer is saved */
} load;

/* What one client thread is given: the load and its share of the calls in flight. */
typedef struct client_arg {
    load *L;
    long calls;
} client_arg;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes res's raw outputs to --save-output's file the first time it is
 * called with one set; returns -1 when the file cannot be written. */
static int save_output(load *L, const Inference__ModelInferResponse *res)
{
    pthread_mutex_lock(&L->lock);
    const char *path = L->save_output;
    L->save_output = NULL;
    pthread_mutex_unlock(&L->lock);
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "wb");
    int bad = f == NULL;
    for (size_t i = 0; !bad && i < res->n_raw_output_contents; i++)
        bad = fwrite(res->raw_output_contents[i].data, 1, res->raw_output_contents[i].len, f) !=
              res->raw_output_contents[i].len;
    if (f != NULL && fclose(f) != 0)
        bad = 1;
    if (bad)
        fprintf(stderr, "grpc-load: cannot write %s\n", path);
    return bad ? -1 : 0;
}

/* One call in flight: its ops' buffers, kept until it completes. */
typedef struct slot {
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array initial, trailing;
    grpc_status_code status;
    grpc_slice details;
    double started;
} slot;

/* Starts s's next call on cq; returns 0, or -1 when it could not start. */
static int call_start(load *L, grpc_completion_queue *cq, slot *s)
{
    grpc_slice method = grpc_slice_from_static_string("/inference.GRPCInferenceService/ModelInfer");
    s->started = now();
    s->call = grpc_channel_create_call(L->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_slice body = grpc_slice_from_static_buffer(L->msg, L->msg_len);
    s->send = grpc_raw_byte_buffer_create(&body, 1);
    s->recv = NULL;
    grpc_metadata_array_init(&s->initial);
    grpc_metadata_array_init(&s->trailing);
    s->status = GRPC_STATUS_UNKNOWN;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->trailing;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->details;
    if (grpc_call_start_batch(s->call, ops, 6, s, NULL) == GRPC_CALL_OK)
        return 0;
    grpc_byte_buffer_destroy(s->send);
    grpc_metadata_array_destroy(&s->initial);
    grpc_metadata_array_destroy(&s->trailing);
    grpc_call_unref(s->call);
    return -1;
}

/* Ends s's call, which completed with success; returns its latency in
 * seconds, or -1 when it failed.  *compute_ms gets the server's compute_ms. */
static double call_end(load *L, slot *s, int success, double *compute_ms)
{
    double t = now() - s->started;
    int ok = success && s->status == GRPC_STATUS_OK && s->recv != NULL;
    grpc_slice_unref(s->details);
    *compute_ms = 0;
    if (ok) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, s->recv);
        grpc_slice bytes = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        Inference__ModelInferResponse *res = inference__model_infer_response__unpack(
            NULL, GRPC_SLICE_LENGTH(bytes), GRPC_SLICE_START_PTR(bytes));
        ok = res != NULL && res->n_raw_output_contents == res->n_outputs;
        if (ok)
            ok = save_output(L, res) == 0;
        for (size_t i = 0; res != NULL && i < res->n_parameters; i++)
            if (!strcmp(res->parameters[i]->key, "compute_ms") && res->parameters[i]->value)
                *compute_ms = res->parameters[i]->value->double_param;
        if (res != NULL)
            inference__model_infer_response__free_unpacked(res, NULL);
        grpc_slice_unref(bytes);
    }
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    grpc_byte_buffer_destroy(s->send);
    grpc_metadata_array_destroy(&s->initial);
    grpc_metadata_array_destroy(&s->trailing);
    grpc_call_unref(s->call);
    return ok ? t : -1;
}

/* Whether another call may start (time and --max-calls left); counts it when
 * so, in L->started. */
static int may_start(load *L)
{
    pthread_mutex_lock(&L->lock);
    int go = now() < L->until && L->started < L->max_calls;
    if (go)
        L->started++;
    pthread_mutex_unlock(&L->lock);
    return go;
}

/* One client thread: its share of the calls in flight on one completion
 * queue, each started again as soon as it ends, until time or --max-calls
 * runs out and the last one has ended.  One thread driving many calls is
 * how gRPC's own benchmarks load a server: a thread per call would spend the
 * machine's cores (the server's, on one machine) on switching threads. */
static void *client(void *arg)
{
    load *L = ((client_arg *)arg)->L;
    long n = ((client_arg *)arg)->calls;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    slot *slots = calloc((size_t)n, sizeof *slots);
    long open = 0;
    for (long i = 0; i < n && may_start(L); i++) {
        if (call_start(L, cq, &slots[i]) == 0) {
            open++;
        } else {
            pthread_mutex_lock(&L->lock);
            L->failed++;
            pthread_mutex_unlock(&L->lock);
        }
    }
    while (open > 0) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        slot *s = ev.tag;
        double cms, t = call_end(L, s, ev.success, &cms);
        open--;
        pthread_mutex_lock(&L->lock);
        if (t < 0) {
            L->failed++;
        } else if (L->calls < L->max_calls) {
            L->lat[L->calls++] = t;
            L->compute_ms += cms;
        }
        pthread_mutex_unlock(&L->lock);
        if (may_start(L)) {
            if (call_start(L, cq, s) == 0) {
                open++;
            } else {
                pthread_mutex_lock(&L->lock);
                L->failed++;
                pthread_mutex_unlock(&L->lock);
            }
        }
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_past(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    free(slots);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Writes r as a binary HTTP v2 request to path (the header built by jansson,
 * then the raw contents in input order) and its header's length to path.hlen.
 * Returns -1 on failure. */
static int write_v2(const char *path, const Inference__ModelInferRequest *r)
{
    json_t *inputs = json_array(), *outputs = json_array();
    for (size_t i = 0; i < r->n_inputs; i++) {
        json_t *shape = json_array();
        for (size_t j = 0; j < r->inputs[i]->n_shape; j++)
            json_array_append_new(shape, json_integer(r->inputs[i]->shape[j]));
        json_array_append_new(inputs, json_pack("{s:s, s:o, s:s, s:{s:I}}", "name",
                                                r->inputs[i]->name, "shape", shape, "datatype",
                                                r->inputs[i]->datatype, "parameters",
                                                "binary_data_size",
                                                (json_int_t)r->raw_input_contents[i].len));
    }
    for (size_t i = 0; i < r->n_outputs; i++)
        json_array_append_new(outputs, json_pack("{s:s, s:{s:b}}", "name", r->outputs[i]->name,
                                                 "parameters", "binary_data", 1));
    json_t *h = json_pack("{s:o, s:o}", "inputs", inputs, "outputs", outputs);
    char *header = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    char hlen_path[4096];
    FILE *f = header ? fopen(path, "wb") : NULL;
    int bad = f == NULL || fputs(header, f) == EOF;
    for (size_t i = 0; !bad && i < r->n_raw_input_contents; i++)
        bad = fwrite(r->raw_input_contents[i].data, 1, r->raw_input_contents[i].len, f) !=
              r->raw_input_contents[i].len;
    if (f != NULL && fclose(f) != 0)
        bad = 1;
    if (!bad && (size_t)snprintf(hlen_path, sizeof hlen_path, "%s.hlen", path) < sizeof hlen_path) {
        f = fopen(hlen_path, "w");
        bad = f == NULL || fprintf(f, "%zu\n", strlen(header)) < 0;
        if (f != NULL && fclose(f) != 0)
            bad = 1;
    } else {
        bad = 1;
    }
    if (bad)
        fprintf(stderr, "grpc-load: cannot write %s\n", path);
    free(header);
    return bad ? -1 : 0;
}

/* The request: q (lq x d), k and v (lk x d) of FP32 numbers in [-1, 1); also
 * written as a binary HTTP v2 request to v2_path unless it is NULL (*len is 0
 * when that fails). */
static unsigned char *build_request(size_t lq, size_t lk, size_t d, const char *outputs,
                                    const char *v2_path, size_t *len)
{
    Inference__ModelInferRequest r = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor t[3], *tp[3];
    int64_t shapes[3][2] = {{(int64_t)lq, (int64_t)d}, {(int64_t)lk, (int64_t)d},
                            {(int64_t)lk, (int64_t)d}};
    static char *names[3] = {"q", "k", "v"};
    ProtobufCBinaryData raw[3];
    unsigned seed = 1;
    for (int i = 0; i < 3; i++) {
        inference__model_infer_request__infer_input_tensor__init(&t[i]);
        t[i].name = names[i];
        t[i].datatype = "FP32";
        t[i].n_shape = 2;
        t[i].shape = shapes[i];
        tp[i] = &t[i];
        size_t n = (size_t)shapes[i][0] * d;
        float *f = malloc(n * sizeof *f);
        for (size_t j = 0; j < n; j++) {
            seed = seed * 1103515245u + 12345u;
            f[j] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
        }
        raw[i].data = (uint8_t *)f;
        raw[i].len = n * sizeof *f;
    }
    r.model_name = "attention";
    r.n_inputs = 3;
    r.inputs = tp;
    r.n_raw_input_contents = 3;
    r.raw_input_contents = raw;
    Inference__ModelInferRequest__InferRequestedOutputTensor o[2], *op[2];
    char buf[64];
    snprintf(buf, sizeof buf, "%s", outputs);
    for (char *s = strtok(buf, ","); s != NULL && r.n_outputs < 2; s = strtok(NULL, ",")) {
        inference__model_infer_request__infer_requested_output_tensor__init(&o[r.n_outputs]);
        o[r.n_outputs].name = s;
        op[r.n_outputs] = &o[r.n_outputs];
        r.n_outputs++;
    }
    r.outputs = op;
    *len = protobuf_c_message_get_packed_size(&r.base);
    unsigned char *msg = malloc(*len);
    protobuf_c_message_pack(&r.base, msg);
    if (v2_path != NULL && write_v2(v2_path, &r) != 0)
        *len = 0;
    for (int i = 0; i < 3; i++)
        free(raw[i].data);
    return msg;
}

int main(int argc, char **argv)
{
    const char *target = "127.0.0.1:8001", *outputs = "output,attention";
    const char *v2_path = NULL, *save_path = NULL;
    size_t lq = 4, lk = 4, d = 4;
    long conc = 1, threads = 1, max_calls = 1000000;
    double seconds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--target")) target = argv[i + 1];
        else if (!strcmp(argv[i], "--lq")) lq = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--lk")) lk = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--d")) d = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--outputs")) outputs = argv[i + 1];
        else if (!strcmp(argv[i], "--concurrency")) conc = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads")) threads = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds")) seconds = strtod(argv[i + 1], NULL);
        else if (!strcmp(argv[i], "--max-calls")) max_calls = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--write-v2")) v2_path = argv[i + 1];
        else if (!strcmp(argv[i], "--save-output")) save_path = argv[i + 1];
        else {
            fprintf(stderr, "grpc-load: unknown option %s (see the top of grpc_load.c)\n", argv[i]);
            return 2;
        }
    }
    if (conc < 1 || conc > 1024 || threads < 1 || threads > conc || max_calls < 1 || lq == 0 ||
        lk == 0 || d == 0) {
        fprintf(stderr, "grpc-load: bad --concurrency, --threads, --max-calls or shape\n");
        return 2;
    }
    grpc_init();
    load L;
    memset(&L, 0, sizeof L);
    pthread_mutex_init(&L.lock, NULL);
    L.msg = build_request(lq, lk, d, outputs, v2_path, &L.msg_len);
    if (L.msg_len == 0)
        return 1;
    L.save_output = save_path;
    L.max_calls = max_calls;
    L.lat = malloc((size_t)max_calls * sizeof *L.lat);
    grpc_arg arg = {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = -1}};
    grpc_channel_args args = {1, &arg};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    L.channel = grpc_channel_create(target, creds, &args);
    grpc_channel_credentials_release(creds);
    pthread_t th[1024];
    client_arg ca[1024];
    double start = now();
    L.until = start + seconds;
    for (long i = 0; i < threads; i++) {
        ca[i] = (client_arg){&L, conc / threads + (i < conc % threads)};
        pthread_create(&th[i], NULL, client, &ca[i]);
    }
    for (long i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double elapsed = now() - start;
    qsort(L.lat, (size_t)L.calls, sizeof *L.lat, cmp);
    double sum = 0;
    for (long i = 0; i < L.calls; i++)
        sum += L.lat[i];
    long n = L.calls;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    printf("GRPC calls=%ld seconds=%.3f rps=%.1f mean_ms=%.3f p50_ms=%.3f p99_ms=%.3f "
           "compute_ms=%.3f failed=%ld client_cpu_s=%.3f\n", n, elapsed, (double)n / elapsed,
           n ? 1000 * sum / (double)n : 0, n ? 1000 * L.lat[n / 2] : 0,
           n ? 1000 * L.lat[(size_t)((double)(n - 1) * 0.99)] : 0,
           n ? L.compute_ms / (double)n : 0, L.failed, cpu);
    grpc_channel_destroy(L.channel);
    free(L.lat);
    free(L.msg);
    grpc_shutdown();
    return L.failed != 0 || n == 0;
}

/*
 * test_grpc_unpack.c - a gRPC request message read under bounds
 * (server/grpc/grpc_unpack.c): the counting allocator's cap, strings with a
 * NUL byte refused by the field that holds them, too many inputs refused
 * before anything is unpacked, and out of memory at every allocation.
 */
#include <inference.pb-c.h>
#include <stdlib.h>
#include <string.h>

#include "core/test_hooks.h"
#include "grpc/grpc_private.h"
#include "test.h"

static const grpc_unpack_limit limits[] = {{"inputs", API_INFER_MAX_INPUTS},
                                           {"outputs", API_INFER_MAX_OUTPUTS}};

/* A ModelInferRequest of model name, n_inputs inputs (the second one named
 * name1), each of rank dims, and a string parameter key = value, packed into
 * a new buffer (*len bytes, free()). */
static unsigned char *request_bytes(const char *name, size_t n_inputs, size_t dims,
                                    const char *name1, const char *key, const char *value,
                                    size_t *len)
{
    Inference__ModelInferRequest q = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor t[8], *tp[8];
    int64_t *shape = calloc(dims, sizeof *shape);
    for (size_t d = 0; d < dims; d++)
        shape[d] = 1;
    for (size_t i = 0; i < n_inputs; i++) {
        inference__model_infer_request__infer_input_tensor__init(&t[i]);
        t[i].name = i == 1 ? (char *)name1 : "q";
        t[i].datatype = "FP32";
        t[i].shape = shape;
        t[i].n_shape = dims;
        tp[i] = &t[i];
    }
    Inference__InferParameter p = INFERENCE__INFER_PARAMETER__INIT;
    p.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    p.string_param = (char *)value;
    Inference__ModelInferRequest__ParametersEntry e =
        INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT;
    e.key = (char *)key;
    e.value = &p;
    Inference__ModelInferRequest__ParametersEntry *ep = &e;
    q.model_name = (char *)name;
    q.inputs = tp;
    q.n_inputs = n_inputs;
    q.parameters = &ep;
    q.n_parameters = 1;
    *len = inference__model_infer_request__get_packed_size(&q);
    unsigned char *buf = malloc(*len);
    inference__model_infer_request__pack(&q, buf);
    free(shape);
    return buf;
}

/* The first '#' of buf becomes a NUL byte: a string the wire says is longer
 * than its C string. */
static void plant_nul(unsigned char *buf, size_t len)
{
    unsigned char *at = memchr(buf, '#', len);
    if (at != NULL)
        *at = '\0';
}

/* Unpacks buf under cap; returns the answer's code and fills *used. */
static int unpack_code(const unsigned char *buf, size_t len, size_t cap, size_t *used,
                       grpc_answer *out)
{
    grpc_unpack_budget b;
    grpc_unpack_budget_init(&b, cap);
    memset(out, 0, sizeof *out);
    ProtobufCMessage *m = grpc_unpack(&inference__model_infer_request__descriptor, buf, len,
                                      limits, 2, &b, out);
    *used = b.used;
    if (m != NULL)
        protobuf_c_message_free_unpacked(m, &b.allocator);
    return b.live == 0 ? (int)out->code : -1; /* -1: the allocator lost track */
}

/* The cap counts every byte protobuf-c asks for: the exact count passes,
 * one byte less is RESOURCE_EXHAUSTED naming the limit, and whatever was
 * unpacked before the refusal is freed. */
void test_grpc_unpack_cap(void)
{
    size_t len, used, again;
    unsigned char *buf = request_bytes("attention", 3, 4000, "k", "causal", "x", &len);
    grpc_answer a;
    ASSERT_EQ(unpack_code(buf, len, 0, &used, &a), GRPC_STATUS_OK);
    /* a packed int64 of one byte a dimension unpacks to eight */
    ASSERT(used >= 3 * 4000 * sizeof(int64_t));
    ASSERT(used > len);
    ASSERT_EQ(unpack_code(buf, len, used, &again, &a), GRPC_STATUS_OK);
    ASSERT_EQ(again, used);
    ASSERT_EQ(unpack_code(buf, len, used - 1, &again, &a), GRPC_STATUS_RESOURCE_EXHAUSTED);
    char words[64];
    snprintf(words, sizeof words, "more than %zu bytes once unpacked", used - 1);
    ASSERT(strstr(a.message, words) != NULL);
    ASSERT_EQ(unpack_code(buf, len, 1, &again, &a), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT(again <= 1);
    ASSERT_EQ(grpc_infer_unpack_bound(0), 65536);
    free(buf);
}

/* A NUL byte inside any string is refused, naming the field, before
 * anything is unpacked. */
void test_grpc_unpack_nul_in_strings(void)
{
    static const struct {
        const char *name, *name1, *key, *value, *field;
    } cases[] = {
        {"attention#junk", "k", "causal", "x", "model_name holds a NUL byte"},
        {"attention", "k#", "causal", "x", "inputs[1].name holds a NUL byte"},
        {"attention", "k", "cau#sal", "x", "parameters[0].key holds a NUL byte"},
        {"attention", "k", "causal", "#", "parameters[0].value.string_param holds a NUL byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len, used;
        unsigned char *buf = request_bytes(cases[i].name, 3, 2, cases[i].name1, cases[i].key,
                                           cases[i].value, &len);
        plant_nul(buf, len);
        grpc_answer a;
        ASSERT_EQ(unpack_code(buf, len, 0, &used, &a), GRPC_STATUS_INVALID_ARGUMENT);
        ASSERT_EQ(used, 0);
        if (strstr(a.message, cases[i].field) == NULL)
            FAIL_AT("case %zu: \"%s\" does not say \"%s\"", i, a.message, cases[i].field);
        free(buf);
    }
    /* the same strings without the NUL pass */
    size_t len, used;
    unsigned char *buf = request_bytes("attention", 3, 2, "k", "causal", "x", &len);
    grpc_answer a;
    ASSERT_EQ(unpack_code(buf, len, 0, &used, &a), GRPC_STATUS_OK);
    free(buf);
}

/* More inputs than v2 takes: refused, naming the field, before one is
 * unpacked; bytes that are no message are INVALID_ARGUMENT. */
void test_grpc_unpack_too_many_inputs(void)
{
    size_t len, used;
    unsigned char *buf = request_bytes("attention", API_INFER_MAX_INPUTS + 1, 2, "k", "a", "b",
                                       &len);
    grpc_answer a;
    ASSERT_EQ(unpack_code(buf, len, 0, &used, &a), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(used, 0);
    ASSERT(strstr(a.message, "inputs has more than 6 entries") != NULL);
    free(buf);
    buf = request_bytes("attention", API_INFER_MAX_INPUTS, 2, "k", "a", "b", &len);
    ASSERT_EQ(unpack_code(buf, len, 0, &used, &a), GRPC_STATUS_OK);
    free(buf);
    static const unsigned char garbage[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f};
    ASSERT_EQ(unpack_code(garbage, sizeof garbage, 0, &used, &a), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT(strstr(a.message, "not a ModelInferRequest") != NULL);
}

/* Out of memory at each allocation in turn: RESOURCE_EXHAUSTED, nothing
 * left allocated, until the unpacking succeeds. */
void test_grpc_unpack_out_of_memory(void)
{
    size_t len, used;
    unsigned char *buf = request_bytes("attention", 3, 3, "k", "causal", "x", &len);
    grpc_answer a;
    for (long n = 0;; n++) {
        mem_fail_after(n);
        int code = unpack_code(buf, len, 0, &used, &a);
        long live = mem_fail_live(), failures = mem_failures();
        mem_fail_reset();
        ASSERT_EQ(live, 0);
        if (failures == 0) {
            ASSERT_EQ(code, GRPC_STATUS_OK);
            break;
        }
        ASSERT_EQ(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
        ASSERT(strstr(a.message, "ran out of memory") != NULL);
        ASSERT(n < 1000);
    }
    free(buf);
}

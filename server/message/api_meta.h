/*
 * api_meta.h - the answers about the server and its models as fields,
 * whatever wire carries them: the server's metadata, a model's metadata
 * and its Triton-style configuration, the models' statistics and the
 * repository's index.
 *
 * v2's handlers fill these (api_response.meta) and write the JSON body from
 * them; a front-end that packs messages of its own (gRPC, with
 * api_request.fields_only) reads them instead, so that neither parses the
 * other's text and both say the same.  Strings are static or borrowed from
 * the answer itself.
 */
#ifndef ATTN_API_META_H
#define ATTN_API_META_H

#include <stddef.h>
#include <string.h>

#include "metrics/model_stats.h"

#define API_META_MAX_INPUTS 4
#define API_META_MAX_OUTPUTS 15
#define API_META_MAX_RANK 3

/* One tensor a model takes or answers: dims[i] < 0 is variable. */
typedef struct api_meta_tensor {
    const char *name;
    const char *datatype;       /* the protocol's: "FP32", "BOOL", "INT64" */
    int rank;
    long dims[API_META_MAX_RANK];
    int optional;
} api_meta_tensor;

typedef enum api_meta_kind {
    API_META_NONE,              /* not an answer of this kind */
    API_META_SERVER,            /* GET /v2 */
    API_META_MODEL,             /* GET /v2/models/{m} */
    API_META_CONFIG,            /* GET /v2/models/{m}/config */
    API_META_STATS,             /* GET /v2/models[/{m}]/stats */
    API_META_INDEX              /* POST /v2/repository/index (each READY) */
} api_meta_kind;

/* One model of a list: its name, and for API_META_STATS its statistics. */
typedef struct api_meta_model {
    char name[72];
    model_stats stats;
} api_meta_model;

typedef struct api_meta_answer {
    api_meta_kind kind;
    char name[72];              /* the server's or the model's (a set name is at most 64 bytes) */
    const char *version;        /* API_META_SERVER: the release */
    const char *const *extensions;      /* API_META_SERVER */
    size_t n_extensions;
    const char *platform;       /* a model's */
    const char *model_version;  /* its one version (every model's, for a list) */
    int max_batch_size;         /* API_META_CONFIG */
    size_t n_inputs, n_outputs;
    api_meta_tensor inputs[API_META_MAX_INPUTS];
    api_meta_tensor outputs[API_META_MAX_OUTPUTS];
    /* API_META_CONFIG's free-form parameters: the datatypes a tensor's one
     * data_type cannot say, as "FP32,FP64,..." */
    const char *input_datatypes, *output_datatypes;
    /* API_META_STATS and API_META_INDEX with api_request.fields_only: the
     * models, owned (api_response_free); an answer with a body holds none */
    api_meta_model *models;
    size_t n_models;
} api_meta_answer;

/* The configuration's data_type of a tensor of datatype ("TYPE_BOOL",
 * "TYPE_INT64", "TYPE_FP32" for the float ones): the one mapping both wires
 * use. */
static inline const char *api_meta_config_type(const char *datatype)
{
    return !strcmp(datatype, "BOOL")    ? "TYPE_BOOL"
           : !strcmp(datatype, "INT64") ? "TYPE_INT64"
                                        : "TYPE_FP32";
}

#endif

/*
 * test.h - the unit-test harness: typed asserts and the list of tests.
 *
 * As in libuv's test/task.h, an assert prints both sides and the place, marks
 * the running test failed, and returns from it.  Every test is listed once,
 * in UNIT_TESTS below; main.c runs them in that order and prints
 * "N passed, N failed".
 */
#ifndef UNIT_TEST_H
#define UNIT_TEST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernel/attention.h"
#include "kernel/attention_fused.h"

extern int test_failed;

/* The kernel paths this CPU runs whose float and double kernels are their own, widest
 * first, at most max: the paths the tests of those kernels hold to the reference.  The
 * bfloat16 variants (attn_kernel_path.bf16_variant) are the avx512 path's float code
 * again; the bfloat16 tests (test_kernel_bf16.c) take every path. */
static inline size_t test_float_paths(const attn_kernel_path **paths, size_t max)
{
    const attn_kernel_path *all[8];
    size_t n = attn_kernel_available(all, 8), kept = 0;
    for (size_t i = 0; i < n && kept < max; i++)
        if (!all[i]->bf16_variant)
            paths[kept++] = all[i];
    return kept;
}

#define FAIL_AT(...)                                                        \
    do {                                                                    \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                   \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
        test_failed = 1;                                                    \
        return;                                                             \
    } while (0)

#define ASSERT(cond)                                                        \
    do { if (!(cond)) FAIL_AT("assertion failed: %s", #cond); } while (0)

#define ASSERT_EQ(a, b)                                                     \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ != b_) FAIL_AT("%s == %s: %lld != %lld", #a, #b, a_, b_);    \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                 \
    do {                                                                    \
        const char *a_ = (a), *b_ = (b);                                    \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                \
            FAIL_AT("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)", \
                    b_ ? b_ : "(null)");                                    \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                              \
    do {                                                                    \
        double a_ = (a), b_ = (b);                                          \
        if (!(fabs(a_ - b_) <= (tol)))                                      \
            FAIL_AT("%s ~ %s: %.17g vs %.17g (tolerance %g)", #a, #b, a_, b_, (double)(tol)); \
    } while (0)

/* The next 64 random bits of a xorshift64 generator, so that failures
 * reproduce from the state a test starts with. */
static inline uint64_t test_next_bits(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* A uniform double in [-2, 2), every bit of the significand random. */
static inline double test_uniform(uint64_t *state)
{
    return (double)(test_next_bits(state) >> 11) / (double)(1ull << 53) * 4.0 - 2.0;
}

/* The largest |a[i] - b[i]|, or +Inf as soon as either side holds a NaN. */
static inline double test_max_abs_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (d != d)
            return INFINITY;
        if (d > worst)
            worst = d;
    }
    return worst;
}

/* The largest |weight - ref[i]| over the n attention weights of r, in
 * whichever precision the job formed them (+Inf when there are none). */
static inline double test_attention_diff(const attn_result *r, const double *ref, size_t n)
{
    if (r->attention != NULL)
        return test_max_abs_diff(r->attention, ref, n);
    if (r->attention_f32 == NULL)
        return INFINITY;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)r->attention_f32[i] - ref[i]);
        if (d != d)
            return INFINITY;
        if (d > worst)
            worst = d;
    }
    return worst;
}

/* Every unit test, in the order they run (mem_tune_arena_limit first: see
 * test_mem_tune.c). */
#define UNIT_TESTS(X)                       \
    X(mem_tune_arena_limit)                 \
    X(attention_hand_computed)              \
    X(attention_causal_hand_computed)       \
    X(attention_fully_masked_row_is_zero)   \
    X(attention_large_scores_stable)        \
    X(attention_random_against_reference)   \
    X(attention_projections_against_reference) \
    X(attention_float32_set_as_its_double_twin) \
    X(attention_float32_against_reference)  \
    X(attention_without_attention_matrix)   \
    X(attention_overflow_is_reported)       \
    X(attention_job_bytes_overflow)         \
    X(kernel_block_edges_serial)            \
    X(kernel_block_edges_on_pool)           \
    X(kernel_overflow_in_late_block)        \
    X(kernel_nan_score_reported)            \
    X(kernel_finite_result_near_max)        \
    X(kernel_infinite_result_still_reported) \
    X(kernel_large_attention_result)        \
    X(kernel_paths_select)                  \
    X(kernel_paths_exp_accuracy)            \
    X(kernel_paths_exp2_accuracy)           \
    X(kernel_paths_huge_finite_scores)      \
    X(kernel_paths_plain)                   \
    X(kernel_paths_masked)                  \
    X(kernel_paths_causal)                  \
    X(kernel_paths_large_logits)            \
    X(kernel_paths_on_pool)                 \
    X(kernel_paths_slot_areas)              \
    X(kernel_paths_overflow_reported)       \
    X(kernel_bf16_plain)                    \
    X(kernel_bf16_masked_causal)            \
    X(kernel_bf16_with_attention)           \
    X(kernel_bf16_large_logits)             \
    X(kernel_bf16_long_rows)                \
    X(kernel_bf16_reductions_float32)       \
    X(kernel_bf16_pack_bits)                \
    X(kernel_overflow_every_score_reported) \
    X(kernel_overflow_some_scores_exact)    \
    X(kernel_paths_float_output_not_finite) \
    X(kernel_paths_wide_heads)              \
    X(kernel_paths_block_rows)              \
    X(kernel_block_rows_rule)               \
    X(compute_pool_runs_each_task_once)     \
    X(compute_pool_bounds_threads)          \
    X(compute_pool_small_beside_large)      \
    X(compute_pool_release_wakes_waiter)    \
    X(compute_pool_join_waits_for_helpers)  \
    X(compute_pool_start_out_of_memory)     \
    X(jsonw_numbers_round_trip)             \
    X(jsonw_matches_printf_shortest)        \
    X(jsonw_strings_escaped)                \
    X(jsonw_strings_utf8)                   \
    X(jsonw_double_random_bits)             \
    X(jsonw_float_random_bits)              \
    X(jsonw_attention_like_values)          \
    X(jsonw_edge_values)                    \
    X(jsonw_ties_and_format)                \
    X(numfmt_double_random_bits)            \
    X(numfmt_float_random_bits)             \
    X(numfmt_attention_like_values)         \
    X(numfmt_edge_values)                   \
    X(numfmt_ties_to_even)                  \
    X(numfmt_pow10_table_matches_definition) \
    X(numfmt_pow10_exponent_formula)        \
    X(json_in_parse)                        \
    X(json_in_tensor_shapes_and_paths)      \
    X(json_in_vector_and_budget)            \
    X(json_in_fields_and_scalars)           \
    X(json_in_big_integers_are_numbers)     \
    X(json_in_whole_numbers)                \
    X(json_fast_matches_jansson)            \
    X(json_fast_mutated_bodies)             \
    X(json_fast_numbers_exact)              \
    X(json_fast_stand_ins_end_with_the_arena) \
    X(json_fast_out_of_memory)              \
    X(weights_table_matches_struct)         \
    X(weights_rules)                        \
    X(weights_json_decode_out_in)           \
    X(weights_json_set_round_trip)          \
    X(weights_json_scalar_same_words)       \
    X(attention_json_qkv_shapes_and_scale)  \
    X(attention_json_columns_layout_transposes) \
    X(attention_json_out_in_weights_transpose) \
    X(attention_json_mask_forms)            \
    X(attention_json_named_weights)         \
    X(attention_json_integration_cases)     \
    X(attention_json_invalid_cases)         \
    X(attention_json_element_limit)         \
    X(attention_json_response_shapes)       \
    X(attention_json_big_integers)          \
    X(attention_json_finite_near_max)       \
    X(request_faults_same_words)            \
    X(config_defaults)                      \
    X(config_env_and_flags)                 \
    X(config_rejects_bad_values)            \
    X(config_sizes)                         \
    X(config_sizing)                        \
    X(config_help_lists_every_option)       \
    X(api_weight_set_paths)                 \
    X(route_table_rows)                     \
    X(route_find_paths)                     \
    X(route_methods_and_cost)               \
    X(route_every_endpoint_handled)         \
    X(route_captures)                       \
    X(route_body_placement)                 \
    X(api_weight_set_heads)                 \
    X(api_fast_numbers_answer_as_jansson)   \
    X(config_empty_values)                  \
    X(guard_auth_writes)                    \
    X(guard_auth_all_spares_probes)         \
    X(guard_token_settings)                 \
    X(guard_cors_origins)                   \
    X(budget_client_share)                  \
    X(conn_ledger_caps)                     \
    X(work_queue_order_and_words)           \
    X(budget_client_keys)                   \
    X(guard_cross_origin_writes)            \
    X(guard_cors_write_settings)            \
    X(guard_host_allow_list)                \
    X(guard_framing)                        \
    X(guard_control_bytes_in_path)          \
    X(guard_query)                          \
    X(guard_new_out_of_memory)              \
    X(oom_decode_run_encode)                \
    X(oom_api_handle)                       \
    X(mem_json_arena_few_blocks)            \
    X(mem_aligned_blocks)                   \
    X(mem_json_arena_out_of_memory)         \
    X(mem_json_arena_earlier_memory_freed)  \
    X(mem_populate_resident_unchanged)      \
    X(mem_large_blocks_huge)                \
    X(v2_tensor_framing_split)              \
    X(v2_tensor_size_checks)                \
    X(v2_tensor_parts)                      \
    X(v2_tensor_describe_errors)            \
    X(v2_tensor_binary_reads)               \
    X(v2_tensor_nan_inf_refused)            \
    X(v2_tensor_not_finite_every_position)  \
    X(v2_tensor_fp32_in_place)              \
    X(v2_tensor_bool_bytes)                 \
    X(v2_tensor_writers_round_trip)         \
    X(v2_tensor_half_inputs)                \
    X(half_widen_every_pattern)             \
    X(half_round_edges)                     \
    X(half_round_random)                    \
    X(half_from_float_as_from_double)       \
    X(v2_tensor_out_of_memory)              \
    X(grpc_unpack_cap)                      \
    X(grpc_unpack_nul_in_strings)           \
    X(grpc_unpack_too_many_inputs)          \
    X(grpc_unpack_out_of_memory)            \
    X(store_open_out_of_memory)             \
    X(store_put_reopen_bit_exact)           \
    X(store_replace)                        \
    X(store_delete)                         \
    X(store_reference_outlives_replace_and_delete) \
    X(store_delete_releases_metrics)        \
    X(store_limits)                         \
    X(store_set_limit_boundary)             \
    X(store_put_out_of_memory)              \
    X(store_list_out_of_memory)             \
    X(store_concurrent_readers)             \
    X(store_every_byte_flip_is_rejected)    \
    X(store_float32_round_trip)             \
    X(store_version2_file_loads)            \
    X(store_float32_damage_refused)         \
    X(store_tmp_names)                      \
    X(store_backend_put_after_conflicts)    \
    X(store_backend_put_gives_up)           \
    X(store_backend_put_not_synced)         \
    X(s3_parse_url)                         \
    X(s3_xml_list)                          \
    X(s3_xml_error)                         \
    X(s3_credentials)                       \
    X(store_removes_tmp_leftovers)          \
    X(store_put_io_faults)                  \
    X(store_delete_io_faults)               \
    X(store_quarantines_bad_files)          \
    X(store_damage_quarantined_when_it_stays) \
    X(store_two_stores_one_directory)       \
    X(store_background_sync)                \
    X(store_large_two_writers)              \
    X(safetensors_good_file)            \
    X(safetensors_bad_files)            \
    X(safetensors_half_widening)        \
    X(safetensors_write_read_back)      \
    X(safetensors_out_of_memory)        \
    X(checkpoint_torch_mha_stacked)     \
    X(checkpoint_gpt2_layers)           \
    X(checkpoint_bert_errors)           \
    X(checkpoint_header_admit)          \
    X(checkpoint_names_and_limits)      \
    X(checkpoint_float32_tensors)       \
    X(checkpoint_spans_on_pool)         \
    X(checkpoint_out_of_memory)         \
    X(compress_round_trips)                 \
    X(compress_split_round_trips)           \
    X(compress_bomb_and_damage)         \
    X(compress_gzip_members)            \
    X(compress_raw_deflate_accepted)    \
    X(compress_header_values)           \
    X(compress_out_of_memory)           \
    X(viz_routes)                       \
    X(viz_examples_out_of_memory)       \
    X(attention_pool_matches_reference) \
    X(attention_pool_grid_sizes)        \
    X(attention_pool_overflow_is_reported) \
    X(attention_pool_through_attention_run) \
    X(attention_pool_float_inputs)     \
    X(attention_reduce_matches_reference) \
    X(attention_reduce_overflow_is_reported) \
    X(attention_reduce_row_passes)      \
    X(attention_reduce_score_tiles)     \
    X(attention_reduce_row_max)         \
    X(attention_reduce_above)           \
    X(sequence_ids_and_limits)          \
    X(sequence_cache_and_totals)        \
    X(sequence_memory_budget)           \
    X(sequence_idle_expiry)             \
    X(sequence_policy_rules)            \
    X(sequence_policy_trim)

#define DECLARE_TEST(name) void test_##name(void);
UNIT_TESTS(DECLARE_TEST)

#endif

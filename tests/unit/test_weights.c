/*
 * test_weights.c - the table of weight arrays and the rules about weights.
 */
#include "core/mem.h"
#include "test.h"
#include "kernel/weights.h"

void test_weights_table_matches_struct(void)
{
    attn_weights w = {.d_in = 2, .d_ctx = 3, .dk = 4, .dv = 5, .d_out = 6};
    double *all[WEIGHTS_COUNT] = {0};
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        all[p] = mem_calloc(weights_rows(&w, (weights_part)p) * weights_cols(&w, (weights_part)p),
                            sizeof(double));
        ASSERT(all[p] != NULL);
        *weights_slot(&w, (weights_part)p) = all[p];
    }
    /* Each slot is its own member, in table order. */
    ASSERT(w.wq == all[WEIGHTS_WQ] && w.wk == all[WEIGHTS_WK] && w.wv == all[WEIGHTS_WV] &&
           w.wo == all[WEIGHTS_WO] && w.bq == all[WEIGHTS_BQ] && w.bk == all[WEIGHTS_BK] &&
           w.bv == all[WEIGHTS_BV] && w.bo == all[WEIGHTS_BO]);
    ASSERT_STR_EQ(weights_parts[WEIGHTS_WO].name, "wo");
    ASSERT_STR_EQ(weights_parts[WEIGHTS_BV].name, "bv");
    /* Shapes in in_out form. */
    ASSERT_EQ(weights_rows(&w, WEIGHTS_WQ), 2);
    ASSERT_EQ(weights_cols(&w, WEIGHTS_WQ), 4);
    ASSERT_EQ(weights_rows(&w, WEIGHTS_WV), 3);
    ASSERT_EQ(weights_cols(&w, WEIGHTS_WV), 5);
    ASSERT_EQ(weights_rows(&w, WEIGHTS_WO), 5);
    ASSERT_EQ(weights_cols(&w, WEIGHTS_WO), 6);
    ASSERT_EQ(weights_rows(&w, WEIGHTS_BK), 1);
    ASSERT_EQ(weights_cols(&w, WEIGHTS_BK), 4);
    ASSERT_EQ(weights_cols(&w, WEIGHTS_BO), 6);
    for (int p = 0; p < WEIGHTS_COUNT; p++) {
        ASSERT_EQ(weights_parts[p].required, p <= WEIGHTS_WV);
        ASSERT_EQ(weights_parts[p].is_matrix, p <= WEIGHTS_WO);
        /* A bias has the width of its matrix's outputs. */
        ASSERT_EQ(weights_parts[p].cols, weights_parts[weights_parts[p].matrix].cols);
    }
    weights_free(&w);
    ASSERT(w.wq == NULL && w.bo == NULL && w.dk == 0);
    weights_free(NULL);
}

void test_weights_rules(void)
{
    attn_error err;
    ASSERT_EQ(weights_check_heads(2, 4, 6, &err), 0);
    ASSERT_EQ(weights_check_heads(3, 4, 6, &err), ERR_BAD_REQUEST);
    ASSERT_STR_EQ(err.code, "shape_mismatch");
    ASSERT_STR_EQ(err.field, "heads");
    ASSERT(strstr(err.message, "dk = 4") != NULL);
    ASSERT_EQ(weights_check_heads(2, 4, 3, &err), ERR_BAD_REQUEST);
    ASSERT(strstr(err.message, "dv = 3") != NULL);
    ASSERT_EQ(weights_check_heads(2, 4, 3, NULL), ERR_BAD_REQUEST);
    ASSERT_NEAR(weights_default_scale(8, 2), 0.5, 0);
    ASSERT_NEAR(weights_default_scale(2, 1), 1 / sqrt(2.0), 1e-16);
    ASSERT(weights_valid_name("a"));
    ASSERT(weights_valid_name("encoder.v1_A-9"));
    ASSERT(weights_valid_name("0123456789012345678901234567890123456789012345678901234567890123"));
    ASSERT(!weights_valid_name(""));
    ASSERT(!weights_valid_name("a/b"));
    ASSERT(!weights_valid_name("."));
    ASSERT(!weights_valid_name(".."));
    ASSERT(weights_valid_name("..."));
    ASSERT(weights_valid_name(".a"));
    ASSERT(!weights_valid_name("a b"));
    ASSERT(!weights_valid_name("caf\xc3\xa9"));
    ASSERT(!weights_valid_name("0123456789012345678901234567890123456789012345678901234567890123X"));
}

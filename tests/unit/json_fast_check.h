/*
 * json_fast_check.h - json_fast_load against json_loadb on one text, for the
 * unit tests and the fuzz target: the same tree (each stand-in compared with
 * the arrays jansson built in its place), every double bit for bit, and for
 * a text jansson refuses the same error, place included.
 */
#ifndef TESTS_JSON_FAST_CHECK_H
#define TESTS_JSON_FAST_CHECK_H

#include <jansson.h>
#include <string.h>

#include "json/json_fast.h"
#include "core/mem.h"

static inline int same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Whether ref (from jansson alone) is level `level` of a at a->data[*pos...]. */
static inline int same_as_fast(const json_fast_array *a, int level, size_t *pos, const json_t *ref)
{
    if (!json_is_array(ref) || json_array_size(ref) != a->dims[level])
        return 0;
    for (size_t i = 0; i < a->dims[level]; i++) {
        const json_t *e = json_array_get(ref, i);
        if (level + 1 < a->depth) {
            if (!same_as_fast(a, level + 1, pos, e))
                return 0;
        } else if (!json_is_real(e) || !same_double(json_real_value(e), a->data[(*pos)++])) {
            return 0;
        }
    }
    return 1;
}

/* Whether the tree got (from json_fast_load) is the tree ref, numbers bit
 * for bit; *fast counts the stand-ins met. */
static inline int same_tree(const json_t *got, const json_t *ref, size_t *fast)
{
    const json_fast_array *a = json_fast_get(got);
    if (a != NULL) {
        size_t pos = 0;
        ++*fast;
        return same_as_fast(a, 0, &pos, ref) && pos == a->count;
    }
    if (json_typeof(got) != json_typeof(ref))
        return 0;
    switch (json_typeof(got)) {
    case JSON_OBJECT: {
        if (json_object_size(got) != json_object_size(ref))
            return 0;
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)got, key, v) {
            const json_t *r = json_object_get(ref, key);
            if (r == NULL || !same_tree(v, r, fast))
                return 0;
        }
        return 1;
    }
    case JSON_ARRAY:
        if (json_array_size(got) != json_array_size(ref))
            return 0;
        for (size_t i = 0; i < json_array_size(got); i++)
            if (!same_tree(json_array_get(got, i), json_array_get(ref, i), fast))
                return 0;
        return 1;
    case JSON_REAL:
        return same_double(json_real_value(got), json_real_value(ref));
    default:
        return json_equal((json_t *)got, (json_t *)ref);
    }
}

/* Parses s[0..len) with json_loadb and, in a JSON arena, with
 * json_fast_load(field); returns 1 when both give the same result.  Sets
 * *parsed to whether jansson parsed it, and adds the stand-ins met to *fast. */
static inline int json_fast_check(const char *s, size_t len, size_t flags, json_fast_field field,
                                  int *parsed, size_t *fast)
{
    json_error_t ref_err, got_err;
    memset(&ref_err, 0, sizeof ref_err);
    memset(&got_err, 0, sizeof got_err);
    json_t *ref = json_loadb(s, len, flags, &ref_err);
    mem_json_arena_begin();
    json_t *got = json_fast_load(s, len, flags, field, &got_err);
    int same;
    if (ref == NULL || got == NULL)
        same = ref == NULL && got == NULL && strcmp(ref_err.text, got_err.text) == 0 &&
               ref_err.line == got_err.line && ref_err.column == got_err.column &&
               ref_err.position == got_err.position;
    else
        same = same_tree(got, ref, fast);
    *parsed = ref != NULL;
    json_decref(got);
    mem_json_arena_end();
    json_decref(ref);
    return same;
}

#endif

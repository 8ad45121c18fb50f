/*
 * case_body.c - the "$matrix" shorthand of the integration case files, expanded: one
 * function for the integration runner and the unit test that read the same files.
 */
#include "case_body.h"

/* Returns a new array of the shape in dims (from axis on) filled with the integer 1. */
static json_t *filled_array(const json_t *dims, size_t axis)
{
    if (axis == json_array_size(dims))
        return json_integer(1);
    json_t *a = json_array();
    json_int_t n = json_integer_value(json_array_get(dims, axis));
    for (json_int_t i = 0; i < n; i++)
        json_array_append_new(a, filled_array(dims, axis + 1));
    return a;
}

json_t *case_body_expand(const json_t *v)
{
    if (json_is_object(v)) {
        const json_t *dims = json_object_get(v, "$matrix");
        if (json_object_size(v) == 1 && json_is_array(dims))
            return filled_array(dims, 0);
        json_t *copy = json_object();
        const char *key;
        json_t *member;
        json_object_foreach((json_t *)v, key, member)
            json_object_set_new(copy, key, case_body_expand(member));
        return copy;
    }
    if (json_is_array(v)) {
        json_t *copy = json_array();
        for (size_t i = 0; i < json_array_size(v); i++)
            json_array_append_new(copy, case_body_expand(json_array_get(v, i)));
        return copy;
    }
    return json_deep_copy(v);
}

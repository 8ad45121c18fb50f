/*
 * case_body.h - the bodies of the integration case files (cases/README.md), as both of their
 * readers need them: the integration runner (itest_cases.c), which sends them, and the unit
 * test that hands the invalid ones to the request decoder (tests/unit/test_attention_json.c).
 */
#ifndef CASE_BODY_H
#define CASE_BODY_H

#include <jansson.h>

/*
 * Returns a new deep copy of v (the caller releases it) in which every object
 * {"$matrix": [d1, d2, ...]} is an array of that shape filled with the integer 1, so that a
 * case file can ask for a large request without spelling it out.
 */
json_t *case_body_expand(const json_t *v);

#endif

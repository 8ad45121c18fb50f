/*
 * json_fast.c - parsing a request body with jansson, its arrays of numbers
 * excepted (see json_fast.h).
 *
 * One walk over the text follows its structure (objects, arrays, where
 * strings begin and end) without judging the tokens between: jansson judges
 * those later, on the same bytes.  At a member that `field` names whose value
 * opens an array, a cheap first look checks that the array holds nothing but
 * number characters, brackets, commas and blanks and bounds its count of
 * numbers; a second pass reads it strictly by the JSON grammar into doubles,
 * checking that it is rectangular.  Any surprise in the structure gives the
 * whole text to jansson; an array that turns out not to be one of numbers is
 * left in the text for jansson.  The text with each array read replaced by
 * `[]` (the skeleton) is then parsed by jansson, and each stand-in found by
 * the path that led to it.
 */
#include "json_fast.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"

/* Deeper structures than this are left to jansson whole. */
#define SCAN_MAX_DEPTH 64

/* One step of the path from the root to a value. */
typedef struct path_step {
    const char *key;        /* a member's name in the text (no escapes), or NULL */
    size_t key_len;
    size_t index;           /* an array element's index, when key is NULL */
} path_step;

/* An array read into numbers, before and after the skeleton is parsed. */
typedef struct found {
    json_fast_array a;
    size_t start, end;      /* its bytes in the text: [start, end) */
    path_step *path;        /* in the arena; depth steps */
    int path_depth;
} found;

typedef struct scanner {
    const char *text, *p, *end;
    json_fast_field field;
    path_step path[SCAN_MAX_DEPTH];
    int depth;
    int escaped;            /* a key on the current path has an escape */
    found *found;
    size_t found_count, found_cap;
    int give_up;            /* leave the whole text to jansson */
} scanner;

#ifdef ATTN_TESTING
#include "core/test_hooks.h"

static _Atomic size_t min_numbers = JSON_FAST_MIN_NUMBERS;

void json_fast_set_min_numbers(size_t n)
{
    atomic_store(&min_numbers, n ? n : JSON_FAST_MIN_NUMBERS);
}

#define MIN_NUMBERS atomic_load_explicit(&min_numbers, memory_order_relaxed)
#else
#define MIN_NUMBERS ((size_t)JSON_FAST_MIN_NUMBERS)
#endif

/* The arrays of the latest json_fast_load on this thread, and its arena. */
static _Thread_local found *registry;
static _Thread_local size_t registry_count;
static _Thread_local unsigned long registry_epoch;

/* ---- numbers ----------------------------------------------------------- */

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* 10^0 .. 10^22, every one exact in a double. */
static const double exact_pow10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* Reads one JSON number at *pp (strictly: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?)
 * into *out and moves *pp past it.  Returns 1, 0 when the text there is not
 * a JSON number, or -1 when it is one past the range of a double (which
 * jansson refuses).  The value is strtod's, as jansson's is (the server runs
 * in the C locale); when the number has at most 15 significant digits and
 * a decimal exponent within 22, digits * 10^e or digits / 10^-e is one
 * correctly rounded operation on exact operands, the same double, sooner. */
static int read_number(const char **pp, const char *end, double *out)
{
    const char *s = *pp, *p = s;
    int negative = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || !is_digit(*p))
        return 0;
    uint64_t digits = 0;
    int significant = 0;    /* digits counted into `digits`, from the first non-zero */
    long exp10 = 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && is_digit(*p)) {
            if (significant < 19) {
                digits = digits * 10 + (uint64_t)(*p - '0');
                significant++;
            } else {
                significant++;
                exp10++;
            }
            p++;
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return 0;
        while (p < end && is_digit(*p)) {
            if (digits == 0 && *p == '0') {
                exp10--;            /* a leading zero of the fraction */
            } else if (significant < 19) {
                digits = digits * 10 + (uint64_t)(*p - '0');
                significant++;
                exp10--;
            } else {
                significant++;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return 0;
        long e = 0;
        while (p < end && is_digit(*p)) {
            if (e < 100000)
                e = e * 10 + (*p - '0');
            p++;
        }
        exp10 += eneg ? -e : e;
    }
    *pp = p;
    if (digits == 0) {
        *out = negative ? -0.0 : 0.0;
        return 1;
    }
    if (significant <= 15 && exp10 >= -22 && exp10 <= 22) {
        double v = (double)digits;
        v = exp10 >= 0 ? v * exact_pow10[exp10] : v / exact_pow10[-exp10];
        *out = negative ? -v : v;
        return 1;
    }
    /* strtod stops where the grammar above stopped: the next byte is a
     * comma, a bracket or a blank. */
    char *stop;
    errno = 0;
    double v = strtod(s, &stop);
    if (stop != p)
        return 0;
    if (isinf(v))
        return -1;
    *out = v;
    return 1;
}

/* Looks at the array opening at p: returns an upper bound of the numbers it
 * holds and sets *close past its last bracket, or returns 0 when it holds
 * anything but number characters, brackets, commas and blanks (or is not
 * closed). */
static size_t count_bound(const char *p, const char *end, const char **close)
{
    static const unsigned char allowed[256] = {
        ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1,
        ['7'] = 1, ['8'] = 1, ['9'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['e'] = 1,
        ['E'] = 1, [','] = 1, ['['] = 1, [']'] = 1, [' '] = 1, ['\t'] = 1, ['\r'] = 1,
        ['\n'] = 1,
    };
    size_t commas = 0;
    int depth = 0;
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (!allowed[c])
            return 0;
        if (c == ',') {
            commas++;
        } else if (c == '[') {
            depth++;
        } else if (c == ']' && --depth == 0) {
            *close = p + 1;
            return commas + 1;
        }
    }
    return 0;
}

/* Reads the array at p (ending before close) into a->data, which has room
 * for bound numbers.  Returns 1 when it is a rectangular array of numbers,
 * 1 to JSON_FAST_MAX_DEPTH deep with no empty level; 0 when it is anything
 * else; -1 for a number past the range of a double. */
static int read_array(const char *p, const char *close, double *data, size_t bound,
                      json_fast_array *a)
{
    size_t count[JSON_FAST_MAX_DEPTH];
    size_t dims[JSON_FAST_MAX_DEPTH] = {0};
    int level = 0, leaf = 0;    /* leaf: the level numbers sit at (1-based), 0 unknown */
    size_t n = 0;
    for (;;) {
        /* At an opening bracket. */
        if (level == JSON_FAST_MAX_DEPTH || (leaf != 0 && level >= leaf))
            return 0;
        count[level++] = 0;
        p++;
        while (p < close && is_ws(*p))
            p++;
        if (p < close && *p == '[')
            continue;
        if (p < close && *p == ']')
            return 0;   /* an empty level */
        for (;;) {
            /* At a number, at `level`. */
            if (leaf == 0)
                leaf = level;
            else if (leaf != level)
                return 0;
            if (n == bound)
                return 0;
            int rc = read_number(&p, close, &data[n]);
            if (rc != 1)
                return rc;
            n++;
            count[level - 1]++;
            for (;;) {
                /* After an element of the array at `level`. */
                while (p < close && is_ws(*p))
                    p++;
                if (p < close && *p == ',') {
                    p++;
                    while (p < close && is_ws(*p))
                        p++;
                    break;
                }
                if (p >= close || *p != ']')
                    return 0;
                p++;
                size_t len = count[level - 1];
                if (dims[level - 1] == 0)
                    dims[level - 1] = len;
                else if (dims[level - 1] != len)
                    return 0;
                if (--level == 0) {
                    if (p != close)
                        return 0;
                    a->depth = leaf;
                    memcpy(a->dims, dims, sizeof dims);
                    a->count = n;
                    a->data = data;
                    return 1;
                }
                count[level - 1]++;
            }
            if (p < close && *p == '[')
                break;  /* the next element opens an array */
        }
    }
}

/* ---- the structure ----------------------------------------------------- */

static void skip_ws(scanner *sc)
{
    while (sc->p < sc->end && is_ws(*sc->p))
        sc->p++;
}

/* Moves past the string opening at sc->p; sets *escaped when it holds a
 * backslash.  Its bytes are jansson's to judge. */
static void skip_string(scanner *sc, int *escaped)
{
    const char *p = sc->p + 1;
    while (p < sc->end) {
        if (*p == '"') {
            sc->p = p + 1;
            return;
        }
        if (*p == '\\') {
            *escaped = 1;
            p++;
        }
        p++;
    }
    sc->give_up = 1;
}

static int wanted(const scanner *sc, const char *key, size_t len)
{
    return sc->field != NULL && !sc->escaped && sc->field(key, len);
}

/* Tries to read the array at sc->p, the value of a wanted member, into
 * numbers.  Returns 1 when it did (sc->p is then past it), 0 when the array
 * is to be scanned as any other value. */
static int try_numbers(scanner *sc)
{
    const char *close = NULL;
    size_t bound = count_bound(sc->p, sc->end, &close);
    if (bound < MIN_NUMBERS)
        return 0;
    double *data = bound > SIZE_MAX / sizeof(double)
                       ? NULL : mem_json_arena_alloc(bound * sizeof(double));
    if (data == NULL) {
        sc->give_up = 1;    /* jansson will meet the same shortage of memory, or not */
        return 0;
    }
    json_fast_array a;
    memset(&a, 0, sizeof a);
    int rc = read_array(sc->p, close, data, bound, &a);
    if (rc < 0)
        sc->give_up = 1;
    if (rc != 1)
        return 0;
    if (sc->found_count == sc->found_cap) {
        size_t cap = sc->found_cap ? 2 * sc->found_cap : 8;
        found *grown = mem_json_arena_alloc(cap * sizeof *grown);
        if (grown == NULL) {
            sc->give_up = 1;
            return 0;
        }
        if (sc->found_count)
            memcpy(grown, sc->found, sc->found_count * sizeof *grown);
        sc->found = grown;
        sc->found_cap = cap;
    }
    path_step *path = mem_json_arena_alloc((size_t)sc->depth * sizeof *path);
    if (path == NULL) {
        sc->give_up = 1;
        return 0;
    }
    memcpy(path, sc->path, (size_t)sc->depth * sizeof *path);
    found *f = &sc->found[sc->found_count++];
    f->a = a;
    f->start = (size_t)(sc->p - sc->text);
    f->end = (size_t)(close - sc->text);
    f->path = path;
    f->path_depth = sc->depth;
    sc->p = close;
    return 1;
}

static void scan_value(scanner *sc, int numbers_wanted);

static void scan_container(scanner *sc, char closing)
{
    if (sc->depth == SCAN_MAX_DEPTH) {
        sc->give_up = 1;
        return;
    }
    int escaped_before = sc->escaped;
    path_step *step = &sc->path[sc->depth++];
    sc->p++;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == closing) {
        sc->p++;
        sc->depth--;
        return;
    }
    for (size_t index = 0; !sc->give_up; index++) {
        int numbers_wanted = 0;
        if (closing == '}') {
            if (sc->p >= sc->end || *sc->p != '"') {
                sc->give_up = 1;
                return;
            }
            const char *key = sc->p + 1;
            int escaped = 0;
            skip_string(sc, &escaped);
            if (sc->give_up)
                return;
            step->key = key;
            step->key_len = (size_t)(sc->p - 1 - key);
            sc->escaped = escaped_before || escaped;
            numbers_wanted = wanted(sc, step->key, step->key_len);
            skip_ws(sc);
            if (sc->p >= sc->end || *sc->p != ':') {
                sc->give_up = 1;
                return;
            }
            sc->p++;
            skip_ws(sc);
        } else {
            step->key = NULL;
            step->key_len = 0;
            step->index = index;
        }
        scan_value(sc, numbers_wanted);
        sc->escaped = escaped_before;
        if (sc->give_up)
            return;
        skip_ws(sc);
        if (sc->p < sc->end && *sc->p == ',') {
            sc->p++;
            skip_ws(sc);
            continue;
        }
        if (sc->p < sc->end && *sc->p == closing) {
            sc->p++;
            sc->depth--;
            return;
        }
        sc->give_up = 1;
    }
}

static void scan_value(scanner *sc, int numbers_wanted)
{
    if (sc->p >= sc->end) {
        sc->give_up = 1;
        return;
    }
    char c = *sc->p;
    if (c == '{') {
        scan_container(sc, '}');
    } else if (c == '[') {
        if (!(numbers_wanted && try_numbers(sc)) && !sc->give_up)
            scan_container(sc, ']');
    } else if (c == '"') {
        int escaped = 0;
        skip_string(sc, &escaped);
    } else {
        /* A number or a literal: its bytes are jansson's to judge. */
        const char *start = sc->p;
        while (sc->p < sc->end && (is_digit(*sc->p) || (*sc->p >= 'a' && *sc->p <= 'z') ||
                                   (*sc->p >= 'A' && *sc->p <= 'Z') || *sc->p == '+' ||
                                   *sc->p == '-' || *sc->p == '.'))
            sc->p++;
        if (sc->p == start)
            sc->give_up = 1;
    }
}

/* ---- the skeleton ------------------------------------------------------ */

/* The value the path of f leads to in root, or NULL. */
static json_t *follow(json_t *root, const found *f)
{
    json_t *v = root;
    for (int i = 0; i < f->path_depth && v != NULL; i++) {
        const path_step *s = &f->path[i];
        v = s->key != NULL ? (json_is_object(v) ? json_object_getn(v, s->key, s->key_len) : NULL)
                           : json_array_get(v, s->index);
    }
    return v;
}

json_t *json_fast_load(const char *text, size_t len, size_t flags, json_fast_field field,
                       json_error_t *error)
{
    registry = NULL;
    registry_count = 0;
    registry_epoch = 0;
    unsigned long epoch = mem_json_arena_epoch();
    if (epoch == 0 || field == NULL || len == 0 || !(flags & JSON_DECODE_INT_AS_REAL))
        return json_loadb(text, len, flags, error);
    scanner sc;
    memset(&sc, 0, sizeof sc);
    sc.text = sc.p = text;
    sc.end = text + len;
    sc.field = field;
    skip_ws(&sc);
    scan_value(&sc, 0);
    if (sc.give_up || sc.found_count == 0)
        return json_loadb(text, len, flags, error);

    size_t removed = 0;
    for (size_t i = 0; i < sc.found_count; i++)
        removed += sc.found[i].end - sc.found[i].start - 2;
    size_t skeleton_len = len - removed;
    char *skeleton = mem_json_arena_alloc(skeleton_len);
    if (skeleton == NULL)
        return json_loadb(text, len, flags, error);
    size_t at = 0, from = 0;
    for (size_t i = 0; i < sc.found_count; i++) {
        memcpy(skeleton + at, text + from, sc.found[i].start - from);
        at += sc.found[i].start - from;
        skeleton[at++] = '[';
        skeleton[at++] = ']';
        from = sc.found[i].end;
    }
    memcpy(skeleton + at, text + from, len - from);

    json_t *root = json_loadb(skeleton, skeleton_len, flags, error);
    if (root == NULL)   /* its error, with the original's places */
        return json_loadb(text, len, flags, error);
    for (size_t i = 0; i < sc.found_count; i++) {
        json_t *v = follow(root, &sc.found[i]);
        if (v == NULL || !json_is_array(v) || json_array_size(v) != 0) {
            json_decref(root);
            return json_loadb(text, len, flags, error);
        }
        sc.found[i].a.stand_in = v;
    }
    registry = sc.found;
    registry_count = sc.found_count;
    registry_epoch = epoch;
    return root;
}

const json_fast_array *json_fast_get(const json_t *v)
{
    /* Only pointers are compared: v is not looked at, and the registry only
     * while its arena is the one open. */
    if (registry_count == 0 || v == NULL || registry_epoch != mem_json_arena_epoch())
        return NULL;
    /* From the last: of two members of one name (when duplicates are
     * allowed) the tree keeps the last, and both lead to its stand-in. */
    for (size_t i = registry_count; i-- > 0;)
        if (registry[i].a.stand_in == v)
            return &registry[i].a;
    return NULL;
}

/* Builds level `level` of a at data[*pos...]. */
static json_t *materialize_level(const json_fast_array *a, int level, size_t *pos)
{
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (size_t i = 0; i < a->dims[level]; i++) {
        json_t *e = level + 1 == a->depth ? json_real(a->data[(*pos)++])
                                          : materialize_level(a, level + 1, pos);
        if (e == NULL || json_array_append_new(arr, e) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

json_t *json_fast_materialize(const json_fast_array *a)
{
    size_t pos = 0;
    return materialize_level(a, 0, &pos);
}

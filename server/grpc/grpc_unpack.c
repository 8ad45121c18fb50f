/*
 * grpc_unpack.c - a request message read off the wire under bounds: the
 * bytes protobuf-c's unpacked form may take, the number of entries of a
 * repeated field, and strings that hold a NUL byte.
 *
 * protobuf-c unpacks a whole message before anyone can look at it, and its
 * unpacked form can be several times the wire's size (a packed int64 of one
 * byte becomes eight, a bool four), so it is unpacked through an allocator
 * that counts the bytes it hands out and refuses the one that would pass the
 * caller's cap: the call is then answered RESOURCE_EXHAUSTED, not a process
 * that grew.
 *
 * protobuf-c hands strings over as C strings and drops their length, so a
 * name "attention\0junk" would be read as "attention".  The lengths are on
 * the wire only, so before unpacking, the message's bytes are walked once
 * under its descriptor (the one protoc-c generated, so the walk follows the
 * .proto file and needs no table of its own): every length-delimited field
 * the descriptor says is a string is searched for a NUL, every one that is a
 * message is walked in turn, the rest (bytes, packed numbers, unknown
 * fields) skipped.  Comparing strlen with a length recorded by the
 * allocator would also work, but would rely on how protobuf-c sizes its
 * string allocations; the wire is what the client sent.  The same walk
 * counts the top-level repeated fields the caller bounds, so that a request
 * with ten thousand inputs is refused before one of them is unpacked.
 */
#include "grpc_private.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"

/* The walk's nesting of messages; inference.proto nests three deep. */
#define WALK_MAX_DEPTH 8
/* Each allocation carries its size before it, on malloc's alignment. */
#define UNPACK_HEADER 16

static void *budget_alloc(void *data, size_t size)
{
    grpc_unpack_budget *b = data;
    if (size > SIZE_MAX - UNPACK_HEADER ||
        (b->cap != 0 && (size > b->cap || b->used > b->cap - size))) {
        b->refused = 1;
        return NULL;
    }
    unsigned char *p = mem_malloc(size + UNPACK_HEADER);
    if (p == NULL) {
        b->failed = 1;
        return NULL;
    }
    memcpy(p, &size, sizeof size);
    b->used += size;
    b->live += size;
    return p + UNPACK_HEADER;
}

static void budget_free(void *data, void *ptr)
{
    grpc_unpack_budget *b = data;
    if (ptr == NULL)
        return;
    unsigned char *p = (unsigned char *)ptr - UNPACK_HEADER;
    size_t size;
    memcpy(&size, p, sizeof size);
    b->live -= size;
    mem_free(p);
}

void grpc_unpack_budget_init(grpc_unpack_budget *b, size_t cap)
{
    memset(b, 0, sizeof *b);
    b->cap = cap;
    b->allocator.alloc = budget_alloc;
    b->allocator.free = budget_free;
    b->allocator.allocator_data = b;
}

/* Reads a varint at *p (before end) into *v; returns 0, or -1 when the
 * bytes end first or it runs past ten bytes. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t byte = *(*p)++;
        *v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80))
            return 0;
    }
    return -1;
}

/* What the walk found: 0 nothing, or one of these with field set. */
enum { WALK_OK, WALK_MALFORMED, WALK_NUL, WALK_TOO_MANY };

typedef struct walk {
    const grpc_unpack_limit *limits;    /* of the top level's repeated fields */
    size_t n_limits;
    char field[160];                    /* the field at fault */
    size_t count;                       /* WALK_TOO_MANY: its limit */
} walk;

/* A message the walk is inside: the field of its parent that holds it and
 * its entry there; the path is written out only for an error. */
typedef struct walk_frame {
    const struct walk_frame *parent;        /* NULL at the top */
    const ProtobufCFieldDescriptor *field;
    size_t index;
} walk_frame;

/* Writes the path of field f (entry index) inside frame into w->field:
 * "inputs[1].name", "parameters[0].value.string_param". */
static void walk_name(walk *w, const walk_frame *frame, const ProtobufCFieldDescriptor *f,
                      size_t index)
{
    if (frame != NULL) {
        walk_name(w, frame->parent, frame->field, frame->index);
    } else {
        w->field[0] = '\0';
    }
    size_t used = strlen(w->field);
    const char *dot = used ? "." : "";
    if (f->label == PROTOBUF_C_LABEL_REPEATED)
        snprintf(w->field + used, sizeof w->field - used, "%s%s[%zu]", dot, f->name, index);
    else
        snprintf(w->field + used, sizeof w->field - used, "%s%s", dot, f->name);
}

/* Walks the message of descriptor d in [p, end), inside frame (NULL at the
 * top). */
static int walk_message(walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, const walk_frame *frame, int depth)
{
    size_t seen[32];                    /* entries of each repeated field, by index */
    size_t n_seen = d->n_fields < 32 ? d->n_fields : 32;
    memset(seen, 0, n_seen * sizeof seen[0]);
    while (p < end) {
        uint64_t key, n;
        if (read_varint(&p, end, &key) != 0 || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
            return WALK_MALFORMED;
        unsigned wire = (unsigned)(key & 7);
        switch (wire) {
        case 0:
            if (read_varint(&p, end, &n) != 0)
                return WALK_MALFORMED;
            continue;
        case 1:
        case 5:
            if ((size_t)(end - p) < (wire == 1 ? 8u : 4u))
                return WALK_MALFORMED;
            p += wire == 1 ? 8 : 4;
            continue;
        case 2:
            break;
        default:
            return WALK_MALFORMED;
        }
        if (read_varint(&p, end, &n) != 0 || n > (uint64_t)(end - p))
            return WALK_MALFORMED;
        const uint8_t *value = p;
        p += n;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        if (f == NULL || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                          depth != 0))
            continue;
        size_t fi = (size_t)(f - d->fields);
        size_t index = fi < n_seen ? seen[fi]++ : 0;
        if (depth == 0)
            for (size_t i = 0; i < w->n_limits; i++)
                if (index >= w->limits[i].max && !strcmp(w->limits[i].field, f->name)) {
                    snprintf(w->field, sizeof w->field, "%s", f->name);
                    w->count = w->limits[i].max;
                    return WALK_TOO_MANY;
                }
        if (f->type == PROTOBUF_C_TYPE_STRING && memchr(value, 0, (size_t)n) != NULL) {
            walk_name(w, frame, f, index);
            return WALK_NUL;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth + 1 >= WALK_MAX_DEPTH)
                return WALK_MALFORMED;
            walk_frame inner = {frame, f, index};
            int rc = walk_message(w, f->descriptor, value, value + n, &inner, depth + 1);
            if (rc != WALK_OK)
                return rc;
        }
    }
    return WALK_OK;
}

ProtobufCMessage *grpc_unpack(const ProtobufCMessageDescriptor *d, const unsigned char *in,
                              size_t len, const grpc_unpack_limit *limits, size_t n_limits,
                              grpc_unpack_budget *budget, grpc_answer *out)
{
    walk w = {limits, n_limits, "", 0};
    /* the short name: "ModelInferRequest" of "inference.ModelInferRequest" */
    const char *name = d->short_name;
    int rc = walk_message(&w, d, in, in + len, NULL, 0);
    if (rc == WALK_NUL) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "%s holds a NUL byte; a string may not (it would be cut there).",
                          w.field);
        return NULL;
    }
    if (rc == WALK_TOO_MANY) {
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT,
                          "%s has more than %zu entries; the models take at most %zu.", w.field,
                          w.count, w.count);
        return NULL;
    }
    ProtobufCMessage *m =
        rc == WALK_OK ? protobuf_c_message_unpack(d, &budget->allocator, len, in) : NULL;
    if (m != NULL)
        return m;
    if (budget->refused)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The request needs more than %zu bytes once unpacked, the limit of "
                          "this call's memory; send fewer or smaller tensors.", budget->cap);
    else if (budget->failed)
        grpc_answer_error(out, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "The server ran out of memory; retry later.");
    else
        grpc_answer_error(out, GRPC_STATUS_INVALID_ARGUMENT, "The request is not a %s.", name);
    return NULL;
}

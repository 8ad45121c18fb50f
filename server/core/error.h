/*
 * error.h - the one error convention of the server.
 *
 * Every fallible function returns 0 on success or a negative ERR_* code, and
 * fills a caller-owned attn_error with a snake_case code the client sees, the
 * path of the field at fault (empty when no single field is), and a sentence
 * the user can act on.  answer_error (server/message/answer.c) turns the
 * struct into the error body of its route's form (v1's {"error": {"code",
 * "message", "field"}}, v2's {"error": "sentence"}) and the ERR_* code into
 * a status with error_http_status(), the one table from codes to statuses.
 *
 * Ownership follows one rule in every header of the server.  A function
 * that takes ownership of an argument takes it whether it succeeds or fails
 * (it frees it on failure); every other pointer argument is borrowed.  A
 * result the caller must free names, in its header comment, the function
 * that frees it; every free function accepts NULL.  A failed call leaves
 * borrowed inputs unchanged.
 */
#ifndef ATTN_ERROR_H
#define ATTN_ERROR_H

#include <stddef.h>

enum {
    ERR_OK = 0,
    ERR_BAD_REQUEST = -1,   /* 400: not JSON, not a valid request */
    ERR_NOT_FOUND = -2,     /* 404: unknown path or weight set */
    ERR_METHOD = -3,        /* 405: known path, wrong method */
    ERR_TOO_LARGE = -4,     /* 413: body or result over the limits */
    ERR_UNAVAILABLE = -5,   /* 503: overloaded, out of memory, draining */
    ERR_INTERNAL = -6,      /* 500: a bug or an I/O failure of the server */
    ERR_UNAUTHORIZED = -7,  /* 401: a bearer token is needed and missing or wrong */
    ERR_URI_TOO_LONG = -8,  /* 414: the request target is over the limit */
    ERR_HEADERS_TOO_LARGE = -9, /* 431: the header block is over the limit */
    ERR_PRECONDITION = -10, /* 412: an If-Match or generation no longer holds */
    ERR_FORBIDDEN = -11,    /* 403: understood, allowed to nobody in this position */
    ERR_UNSUPPORTED_MEDIA = -12, /* 415: a Content-Encoding the server does not read */
    ERR_NO_SPACE = -13,     /* 507: the disk or the quota is full; nothing was written */
    ERR_TOO_MANY = -14      /* 429: a count the server keeps is at its limit (sequences) */
};

typedef struct attn_error {
    int kind;               /* one of the ERR_* values above: what went wrong */
    char code[40];          /* snake_case code, e.g. "shape_mismatch" */
    char field[128];        /* path such as "weights.wq" or "q[2][1]"; "" if none */
    char message[400];      /* one or two sentences in the user's terms */
} attn_error;

/* Fills err (which may be NULL) and returns kind, so callers can write
 * `return error_set(err, ERR_BAD_REQUEST, "wrong_type", "q", "...")`.
 * field may be NULL or "" when no single field is at fault. */
int error_set(attn_error *err, int kind, const char *code,
              const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Shorthand for the out-of-memory answer (503, code "overloaded"). */
int error_nomem(attn_error *err);

/* Resets err (which may be NULL) to "no error". */
void error_clear(attn_error *err);

/* Maps an ERR_* code to its HTTP status (ERR_OK gives 200). */
int error_http_status(int kind);

#endif

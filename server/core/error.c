/*
 * error.c - filling attn_error and mapping error codes to HTTP statuses.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int error_set(attn_error *err, int kind, const char *code,
              const char *field, const char *fmt, ...)
{
    if (err == NULL)
        return kind;
    err->kind = kind;
    snprintf(err->code, sizeof err->code, "%s", code ? code : "error");
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return kind;
}

int error_nomem(attn_error *err)
{
    return error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                     "The server ran out of memory for this request; retry later or send a smaller one.");
}

void error_clear(attn_error *err)
{
    if (err == NULL)
        return;
    memset(err, 0, sizeof *err);
}

int error_http_status(int kind)
{
    switch (kind) {
    case ERR_OK: return 200;
    case ERR_BAD_REQUEST: return 400;
    case ERR_NOT_FOUND: return 404;
    case ERR_METHOD: return 405;
    case ERR_TOO_LARGE: return 413;
    case ERR_UNAVAILABLE: return 503;
    case ERR_UNAUTHORIZED: return 401;
    case ERR_URI_TOO_LONG: return 414;
    case ERR_HEADERS_TOO_LARGE: return 431;
    case ERR_PRECONDITION: return 412;
    case ERR_FORBIDDEN: return 403;
    case ERR_UNSUPPORTED_MEDIA: return 415;
    case ERR_NO_SPACE: return 507;
    case ERR_TOO_MANY: return 429;
    default: return 500;
    }
}

/*
 * error.c - filling api_error and mapping error codes to HTTP statuses.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int error_set(api_error *err, int status_code, const char *code,
              const char *field, const char *fmt, ...)
{
    if (err == NULL)
        return status_code;
    err->status_code = status_code;
    snprintf(err->code, sizeof err->code, "%s", code ? code : "error");
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status_code;
}

int error_nomem(api_error *err)
{
    return error_set(err, ERR_UNAVAILABLE, "overloaded", NULL,
                     "The server ran out of memory for this request; retry later or send a smaller one.");
}

void error_clear(api_error *err)
{
    if (err == NULL)
        return;
    memset(err, 0, sizeof *err);
}

int error_http_status(int status_code)
{
    switch (status_code) {
    case ERR_OK: return 200;
    case ERR_BAD_REQUEST: return 400;
    case ERR_NOT_FOUND: return 404;
    case ERR_METHOD: return 405;
    case ERR_TOO_LARGE: return 413;
    case ERR_UNAVAILABLE: return 503;
    default: return 500;
    }
}

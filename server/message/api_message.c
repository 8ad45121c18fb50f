/*
 * api_message.c - freeing an answer.
 */
#include "api_message.h"

#include "core/mem.h"

void api_response_free(api_response *resp)
{
    if (resp == NULL)
        return;
    if (!resp->body_static)
        mem_free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
    resp->body_static = 0;
}

/*
 * utf8.h - well-formed UTF-8 (Unicode's table 3-7: no overlong form, no
 * surrogate, nothing past U+10FFFF), the one rule for the server's text: what
 * the JSON writer passes through (json/jsonw.c) and what a gRPC string must be
 * to say what its HTTP twin's JSON could (grpc/grpc_infer.c).
 */
#ifndef ATTN_UTF8_H
#define ATTN_UTF8_H

/* Bytes of the well-formed sequence at p (1 to 4), or 0 when the byte at p
 * does not start one.  Reads no further than the first byte that does not
 * fit, so a NUL ends it. */
int utf8_length(const unsigned char *p);

/* 1 when the NUL-terminated s is well-formed UTF-8, else 0. */
int utf8_valid(const char *s);

#endif

/*
 * utf8.c - well-formed UTF-8 (utf8.h).
 */
#include "utf8.h"

int utf8_length(const unsigned char *p)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xbf;
    int n;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

int utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p != 0;) {
        int n = utf8_length(p);
        if (n == 0)
            return 0;
        p += n;
    }
    return 1;
}

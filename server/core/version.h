/*
 * version.h - the release number; the build stamps commit and date with -D.
 */
#ifndef ATTN_VERSION_H
#define ATTN_VERSION_H

#define ATTN_VERSION "1.0.0"
#ifndef ATTN_BUILD_COMMIT
#define ATTN_BUILD_COMMIT "unknown"
#endif
#ifndef ATTN_BUILD_DATE
#define ATTN_BUILD_DATE "unknown"
#endif

#endif

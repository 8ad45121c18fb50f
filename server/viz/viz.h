/*
 * viz.h - the attention visualizer's files, built into the binary.
 *
 * The page (every .html, .css and .js of server/viz/page/: index.html, its
 * style sheet and its scripts) and the golden examples
 * (tests/fixtures/NAME.json, served as examples/NAME.json) are turned into
 * byte arrays at build time by server/viz/viz_embed.c, so the server and its
 * container image serve exactly the files of the repository, offline.  This
 * module finds them by path and lists the examples; its routes are answered
 * by viz_page.c (viz_page.h).
 */
#ifndef ATTN_VIZ_H
#define ATTN_VIZ_H

#include <stddef.h>

typedef struct viz_asset {
    const char *name;           /* path under /viz/, e.g. "viz.js", "examples/seed004_toy.json" */
    const unsigned char *data;  /* static; followed by a NUL not counted in size */
    size_t size;
} viz_asset;

/* Defined by the generated source (build/gen/viz_assets.c). */
extern const viz_asset viz_assets[];
extern const size_t viz_asset_count;

/* The embedded file named name (a path under /viz/, without the leading
 * slash; "" means the page itself, index.html), or NULL when there is none.
 * The result is static: never freed. */
const viz_asset *viz_find(const char *name);

/* The Content-Type for a file name, from its extension (static string;
 * "application/octet-stream" for an unknown one). */
const char *viz_content_type(const char *name);

/* The list of golden examples as JSON, {"examples":[{"name":..,"url":..},..]},
 * sorted as embedded.  Returns text the caller frees with mem_free, and its
 * length in *len, or NULL when out of memory. */
char *viz_examples_json(size_t *len);

#endif

/*
 * viz.c - finding the visualizer's embedded files (see viz.h).
 *
 * There are a handful of files, so a linear search is all it takes; the
 * examples are the files under "examples/", listed by name without ".json".
 */
#include "viz.h"

#include <string.h>

#include "json/jsonw.h"

static const char EXAMPLES_PREFIX[] = "examples/";

const viz_asset *viz_find(const char *name)
{
    if (name[0] == '\0')
        name = "index.html";
    for (size_t i = 0; i < viz_asset_count; i++)
        if (strcmp(viz_assets[i].name, name) == 0)
            return &viz_assets[i];
    return NULL;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

const char *viz_content_type(const char *name)
{
    static const struct { const char *ext, *type; } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".json", "application/json"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (ends_with(name, types[i].ext))
            return types[i].type;
    return "application/octet-stream";
}

char *viz_examples_json(size_t *len)
{
    jw_buf w;
    jw_init(&w, 1024);
    jw_raw(&w, "{\"examples\":[");
    int first = 1;
    size_t plen = strlen(EXAMPLES_PREFIX);
    for (size_t i = 0; i < viz_asset_count; i++) {
        const char *name = viz_assets[i].name;
        if (strncmp(name, EXAMPLES_PREFIX, plen) != 0 || !ends_with(name, ".json"))
            continue;
        char example[128];
        size_t n = strlen(name) - plen - strlen(".json");
        if (n >= sizeof example)
            continue;
        memcpy(example, name + plen, n);
        example[n] = '\0';
        jw_raw(&w, first ? "{\"name\":" : ",{\"name\":");
        jw_string(&w, example);
        jw_raw(&w, ",\"url\":");
        char url[160];
        memcpy(url, "/viz/", 5);
        memcpy(url + 5, name, strlen(name) + 1);
        jw_string(&w, url);
        jw_raw(&w, "}");
        first = 0;
    }
    jw_raw(&w, "]}\n");
    return jw_finish(&w, len);
}

/* ui.h - the dashboard's files (ui/), built into the binary by
 * cmake/embed.cmake, and their serving at /ui/ (ui.c). */
#ifndef BEANGATE_GATEWAY_UI_H
#define BEANGATE_GATEWAY_UI_H

#include <stddef.h>

/* One file of ui/. */
struct gw_asset {
    const char *name;             /* "app.js": the path after /ui/ */
    const char *content_type;     /* "text/javascript; charset=utf-8" */
    const unsigned char *bytes;
    size_t len;
    const char *etag;             /* strong, quoted: "\"<32 hex of SHA-256>\"" */
};

/* The table, sorted by name (generated: ui_assets.c). */
extern const struct gw_asset gw_ui_assets[];
extern const size_t gw_ui_assets_count;

/* The asset named name ("" is index.html). NULL if there is none. */
const struct gw_asset *gw_ui_find(const char *name);
/* Nonzero if an If-None-Match value (may be NULL) matches etag: "*", or
 * one entry of its comma-separated list equal to etag, with or without a
 * W/ prefix (the weak comparison RFC 9110 asks for on If-None-Match). */
int gw_ui_etag_matches(const char *if_none_match, const char *etag);

#endif

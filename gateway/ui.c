/* ui.c - the dashboard's handlers: GET /ui redirects to /ui/, and GET
 * /ui/ and /ui/{asset} answer a file of ui/ from the table built into the
 * binary (ui.h), with a strong ETag (If-None-Match: 304), Cache-Control:
 * no-cache (the browser asks again on each load and gets a 304 while the
 * binary is the same), and headers that keep the page from running
 * anything but its own files: a strict Content-Security-Policy (no inline
 * script or style, no string to HTML: Trusted Types), nosniff, no
 * referrer, no framing. The files hold no data, so their rows need no
 * bearer token (GW_AUTH_PUBLIC); the page's API calls do. A handler like
 * routes.c's: it answers through request.c and reply.c. */
#include <string.h>

#include "gateway.h"

const struct gw_asset *gw_ui_find(const char *name)
{
    if (!*name) name = "index.html";
    for (size_t i = 0; i < gw_ui_assets_count; i++)
        if (strcmp(gw_ui_assets[i].name, name) == 0) return &gw_ui_assets[i];
    return NULL;
}

int gw_ui_etag_matches(const char *if_none_match, const char *etag)
{
    if (!if_none_match) return 0;
    size_t want = strlen(etag);
    const char *p = if_none_match;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) return 0;
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n == 1 && *p == '*') return 1;
        if (n >= 2 && p[0] == 'W' && p[1] == '/') p += 2, n -= 2;
        if (n == want && memcmp(p, etag, n) == 0) return 1;
        if (!end) return 0;
        p = end + 1;
    }
}

/* Sent with every file and every 304, after the ETag. */
static const struct gw_header security_headers[] = {
    {"Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
     "require-trusted-types-for 'script'; trusted-types 'none'"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"X-Frame-Options", "DENY"},
    {"Cache-Control", "no-cache"},
};
#define SECURITY_HEADERS (sizeof security_headers / sizeof security_headers[0])

/* GET /ui: to /ui/, relative, so that it also works behind a proxy that
 * adds a prefix. */
int gw_handle_ui_redirect(struct gw_request *r)
{
    return gw_reply_bytes(r->conn, 301, "", 0, 0, NULL, "Location", "ui/");
}

/* GET /ui/ (index.html) and /ui/{asset}: the file, or 304 when the
 * browser's copy is current. */
int gw_handle_ui_file(struct gw_request *r)
{
    const struct gw_asset *a = gw_ui_find(r->match.nseg == 2 ? r->match.seg[1] : "");
    if (!a) return gw_reply_problem(r->conn, 404, "NOT_FOUND", "no such file of the dashboard");
    struct gw_header h[1 + SECURITY_HEADERS] = {{"ETag", a->etag}};
    memcpy(h + 1, security_headers, sizeof security_headers);
    if (gw_ui_etag_matches(gw_request_header(r, "If-None-Match"), a->etag))
        return gw_reply_static(r->conn, 304, "", 0, NULL, h, 1 + SECURITY_HEADERS);
    return gw_reply_static(r->conn, 200, a->bytes, a->len, a->content_type, h, 1 + SECURITY_HEADERS);
}

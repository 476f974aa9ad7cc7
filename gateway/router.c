/* router.c - the HTTP route table and URL matching, without libmicrohttpd
 * so that it can be unit-tested. */
#include <stdio.h>
#include <string.h>

#include "gateway.h"

/* Path patterns: "*" matches one segment. `methods` lists what is allowed.
 * (tests/http/test_http.py reads this table to compare it with
 * openapi/openapi.yaml.) */
static const struct route {
    const char *pattern;
    const char *methods;
    enum gw_route_id id;
} routes[] = {
    {"/stats", "GET", R_STATS},
    {"/tubes", "GET", R_TUBES},
    {"/tubes/*", "GET", R_TUBE},
    {"/tubes/*/jobs", "POST", R_TUBE_JOBS},
    {"/tubes/*/jobs/batch", "POST", R_TUBE_BATCH},
    {"/tubes/*/reservations", "POST", R_TUBE_RESERVE},
    {"/tubes/*/kick", "POST", R_TUBE_KICK},
    {"/tubes/*/pause", "POST", R_TUBE_PAUSE},
    {"/tubes/*/ready", "GET", R_TUBE_PEEK},
    {"/tubes/*/delayed", "GET", R_TUBE_PEEK},
    {"/tubes/*/buried", "GET", R_TUBE_PEEK},
    {"/reservations", "POST", R_RESERVE},
    {"/jobs/*", "GET, DELETE", R_JOB},
    {"/jobs/*/body", "GET", R_JOB_BODY},
    {"/jobs/*/release", "POST", R_JOB_ACTION},
    {"/jobs/*/bury", "POST", R_JOB_ACTION},
    {"/jobs/*/touch", "POST", R_JOB_ACTION},
    {"/jobs/*/kick", "POST", R_JOB_ACTION},
    {"/jobs/*/reservations", "POST", R_JOB_RESERVE},
    {"/openapi.yaml", "GET", R_OPENAPI},
    {"/livez", "GET", R_LIVEZ},
    {"/readyz", "GET", R_READYZ},
    {"/metrics", "GET", R_METRICS},
};

/* Split url into at most GW_MAX_SEGMENTS segments in buf, each with its %2F
 * decoded; returns the count, or -1 if there are more, one is empty, or url
 * does not start with '/'. */
static int split_path(const char *url, char *buf, size_t size, char *seg[GW_MAX_SEGMENTS])
{
    if (strlen(url) >= size || url[0] != '/') return -1;
    strcpy(buf, url);
    int n = 0;
    char *p = buf + 1;
    if (!*p) return 0;
    for (;;) {
        if (n == GW_MAX_SEGMENTS) return -1;
        seg[n++] = p;
        char *slash = strchr(p, '/');
        if (!slash) break;
        *slash = '\0';
        p = slash + 1;
        if (!*p) break; /* a trailing slash is allowed */
    }
    for (int i = 0; i < n; i++) {
        if (!*seg[i]) return -1;
        gw_decode_slashes(seg[i]);
    }
    return n;
}

/* Nonzero if the segments match the pattern. */
static int pattern_matches(const char *pattern, char *seg[], int n)
{
    char buf[64];
    char *pseg[GW_MAX_SEGMENTS];
    int pn = split_path(pattern, buf, sizeof buf, pseg);
    if (pn != n) return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(pseg[i], "*") != 0 && strcmp(pseg[i], seg[i]) != 0) return 0;
    return 1;
}

/* Nonzero if method is one of the comma-separated list, or HEAD where GET
 * is: HEAD is GET without the body, on every route that has GET. */
static int method_allowed(const char *methods, const char *method)
{
    if (strcmp(method, "HEAD") == 0) method = "GET";
    size_t n = strlen(method);
    for (const char *p = methods; (p = strstr(p, method)); p += n)
        if ((p == methods || p[-1] == ' ') && (p[n] == '\0' || p[n] == ',')) return 1;
    return 0;
}

enum gw_method gw_method_of(const char *method)
{
    static const struct { const char *name; enum gw_method m; } known[] = {
        {"GET", GW_GET}, {"HEAD", GW_HEAD}, {"POST", GW_POST}, {"DELETE", GW_DELETE},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(method, known[i].name) == 0) return known[i].m;
    return GW_OTHER;
}

/* The Allow header of route i: its methods, with HEAD after GET. */
static const char *route_allow(size_t i)
{
    static char allow[sizeof routes / sizeof routes[0]][32];
    if (allow[i][0]) return allow[i];
    size_t o = 0;
    for (const char *p = routes[i].methods; *p;) {
        size_t n = strcspn(p, ",");
        int is_get = n == 3 && memcmp(p, "GET", 3) == 0;
        o += (size_t)snprintf(allow[i] + o, sizeof allow[i] - o, "%s%.*s%s", o ? ", " : "", (int)n, p,
                              is_get ? ", HEAD" : "");
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    return allow[i];
}

int gw_match_route(const char *method, const char *url, struct gw_match *m)
{
    memset(m, 0, sizeof *m);
    int n = split_path(url, m->buf, sizeof m->buf, m->seg);
    if (n < 0) return 404;
    m->nseg = n;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!pattern_matches(routes[i].pattern, m->seg, n)) continue;
        m->id = routes[i].id;
        m->index = (int)i;
        m->allow = route_allow(i);
        m->method = gw_method_of(method);
        return method_allowed(routes[i].methods, method) ? 0 : 405;
    }
    return 404;
}

int gw_route_count(void) { return (int)(sizeof routes / sizeof routes[0]); }

const char *gw_route_methods(int i)
{
    return i >= 0 && i < gw_route_count() ? routes[i].methods : NULL;
}

/* The pattern with each "*" named as in openapi.yaml: {tube} after
 * "tubes", {id} after "jobs". */
static void name_pattern(const char *pattern, char *out, size_t size)
{
    char buf[64];
    char *seg[GW_MAX_SEGMENTS];
    int n = split_path(pattern, buf, sizeof buf, seg);
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n && o < size; i++) {
        const char *name = seg[i];
        if (strcmp(name, "*") == 0)
            name = i > 0 && strcmp(seg[i - 1], "tubes") == 0 ? "{tube}"
                 : i > 0 && strcmp(seg[i - 1], "jobs") == 0 ? "{id}" : "{x}";
        o += (size_t)snprintf(out + o, size - o, "/%s", name);
    }
    if (n <= 0) snprintf(out, size, "%s", pattern);
}

const char *gw_route_pattern(int i)
{
    static char names[sizeof routes / sizeof routes[0]][64];
    if (i < 0 || i >= gw_route_count()) return NULL;
    if (!names[i][0]) name_pattern(routes[i].pattern, names[i], sizeof names[i]);
    return names[i];
}

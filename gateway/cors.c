/* cors.c - the web origins whose pages may call the gateway from a browser
 * (--http-cors-origins): a list of exact origins, checked once at start.
 * Calls no other gateway file. No wildcard: with the gateway open (no
 * bearer tokens) a `*` would let every page a user visits read and change
 * the queue. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway.h"

struct gw_cors {
    char *text;                   /* the list, its commas made NULs */
    const char *origin[GW_CORS_ORIGINS_MAX];
    size_t count;
};

size_t gw_host_span(const char *s, size_t n)
{
    size_t i = 0;
    if (n && s[0] == '[') {
        while (++i < n && s[i] != ']')
            if (!strchr("0123456789abcdefABCDEF:.", s[i])) return 0;
        return i == n || i == 1 ? 0 : i + 1;
    }
    while (i < n && (s[i] == '-' || s[i] == '.' || (s[i] >= '0' && s[i] <= '9') ||
                     ((s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'z')))
        i++;
    return i;
}

/* Why origin[0..n) is not "http(s)://HOST[:PORT]", or NULL if it is. HOST
 * is a name of letters, digits, '-' and '.', or an [IPv6] address. */
static const char *origin_why(const char *origin, size_t n)
{
    if (n == 1 && origin[0] == '*')
        return "'*' is refused: name each origin (with '*' every web page could call the gateway)";
    if (n > GW_CORS_ORIGIN_MAX) return "an origin is longer than 256 bytes";
    size_t i = n >= 7 && strncasecmp(origin, "http://", 7) == 0    ? 7
             : n >= 8 && strncasecmp(origin, "https://", 8) == 0 ? 8 : 0;
    if (!i) return "an origin must start with http:// or https://";
    size_t host = gw_host_span(origin + i, n - i);
    if (!host) return i < n && origin[i] == '[' ? "a bad [IPv6] address in an origin" : "an origin has no host";
    i += host;
    if (i < n && origin[i] == ':') {
        uint64_t port;
        if (bg_parse_u64(origin + i + 1, n - i - 1, 65535, &port) != 0 || port == 0 || n - i - 1 > 5)
            return "an origin's port must be 1 to 65535";
        i = n;
    }
    if (i < n) return "an origin is scheme://host[:port], with no path (not even '/')";
    return NULL;
}

/* Parse list into c (NULL: only check it). NULL, or why it is refused. */
static const char *parse(const char *list, struct gw_cors *c)
{
    size_t count = 0;
    for (const char *p = list;; ) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        const char *why = origin_why(p, n);
        if (why) return why;
        if (count == GW_CORS_ORIGINS_MAX) return "more than 64 origins";
        if (c) c->origin[c->count++] = p;
        count++;
        if (!comma) break;
        p = comma + 1;
    }
    return NULL;
}

const char *gw_cors_check(const char *list)
{
    return parse(list, NULL);
}

struct gw_cors *gw_cors_new(const char *list)
{
    struct gw_cors *c = calloc(1, sizeof *c);
    if (!c || !(c->text = strdup(list)) || parse(c->text, c) != NULL) {
        gw_cors_free(c);
        return NULL;
    }
    for (char *comma; (comma = strchr(c->text, ','));) *comma = '\0';
    return c;
}

void gw_cors_free(struct gw_cors *c)
{
    if (!c) return;
    free(c->text);
    free(c);
}

int gw_cors_allows(const struct gw_cors *c, const char *origin)
{
    for (size_t i = 0; c && origin && i < c->count; i++)
        if (strcasecmp(c->origin[i], origin) == 0) return 1;
    return 0;
}

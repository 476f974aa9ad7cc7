/* guard.c - what a web page in a browser must not make the gateway do,
 * checked for every request before its token and its body (docs/security.md):
 *
 * - Host (RFC 9112 section 3.2): an HTTP/1.1 request carries exactly one,
 *   an HTTP/1.0 request at most one; else 400.
 * - DNS rebinding: a page of attacker.example that points its name at
 *   127.0.0.1 reaches a loopback gateway as the same origin, but its Host
 *   still names attacker.example. On a loopback bind only the loopback
 *   names (localhost, 127.0.0.1, [::1], any port) and the names of
 *   --http-allowed-hosts are served; any other Host gets 421. On any other
 *   bind, every Host is served unless --http-allowed-hosts is given (then:
 *   those names and the loopback ones): the gateway cannot know the names
 *   it is reached by (addresses, DNS names, a proxy's).
 * - Cross-site state changes: a request other than GET, HEAD and OPTIONS
 *   that a browser marks as sent by another site (Sec-Fetch-Site other than
 *   same-origin or none), or, from a browser without Sec-Fetch-Site, whose
 *   Origin is not the gateway's own (scheme://Host), gets 403, unless its
 *   Origin is one of --http-cors-origins. A request with neither header
 *   (curl, services, workers) is not a browser's and passes. The rule of
 *   Go 1.25's net/http CrossOriginProtection.
 *
 * Below http.c; above request.c (the headers) and cors.c. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway.h"

struct gw_hosts {
    int any;                      /* every Host is served */
    char *text;                   /* the list, its commas made NULs */
    const char *name[GW_ALLOWED_HOSTS_MAX];
    size_t count;
};

/* The names a loopback gateway always serves. */
static const char *const loopback_names[] = {"localhost", "127.0.0.1", "[::1]"};

/* Parse list into h (NULL: only check it). NULL, or why it is refused. */
static const char *parse(const char *list, struct gw_hosts *h)
{
    size_t count = 0;
    for (const char *p = list;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n > GW_ALLOWED_HOST_MAX) return "a host name is longer than 253 bytes";
        if (!n || gw_host_span(p, n) != n)
            return "each allowed host is a name (letters, digits, '-', '.') or an [IPv6] "
                   "address, without a port";
        if (count == GW_ALLOWED_HOSTS_MAX) return "more than 64 allowed hosts";
        if (h) h->name[h->count++] = p;
        count++;
        if (!comma) break;
        p = comma + 1;
    }
    return NULL;
}

const char *gw_hosts_check(const char *list) { return parse(list, NULL); }

int gw_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

struct gw_hosts *gw_hosts_new(const char *list, int loopback)
{
    struct gw_hosts *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->any = !loopback && !list;
    if (list && (!(h->text = strdup(list)) || parse(h->text, h) != NULL)) {
        gw_hosts_free(h);
        return NULL;
    }
    for (char *comma; h->text && (comma = strchr(h->text, ','));) *comma = '\0';
    return h;
}

void gw_hosts_free(struct gw_hosts *h)
{
    if (!h) return;
    free(h->text);
    free(h);
}

/* Nonzero if name[0..n) is one of the n names of list, in any case. */
static int listed(const char *const *list, size_t count, const char *name, size_t n)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(list[i]) == n && strncasecmp(list[i], name, n) == 0) return 1;
    return 0;
}

int gw_hosts_allow(const struct gw_hosts *h, const char *host)
{
    if (h->any || !host) return 1; /* no Host: HTTP/1.0, and not a browser's */
    size_t len = strlen(host), n = gw_host_span(host, len);
    if (!n) return 0;
    /* a port after the name: ':' and 1 to 5 digits, whichever */
    if (n < len && (host[n] != ':' || len - n - 1 < 1 || len - n - 1 > 5 ||
                    bg_digits_span(host + n + 1, len - n - 1) != len - n - 1))
        return 0;
    return listed(loopback_names, sizeof loopback_names / sizeof loopback_names[0], host, n) ||
           listed(h->name, h->count, host, n);
}

/* Nonzero if origin is the gateway's own as the request reached it:
 * http:// or https:// and then its Host, in any case. */
static int own_origin(const char *origin, const char *host)
{
    size_t skip = strncasecmp(origin, "http://", 7) == 0    ? 7
                : strncasecmp(origin, "https://", 8) == 0 ? 8 : 0;
    return skip && host && strcasecmp(origin + skip, host) == 0;
}

/* Nonzero if a browser marks r as sent by a page of another origin that
 * --http-cors-origins does not list. */
static int cross_site(struct gw_request *r)
{
    const char *site = gw_request_header(r, "Sec-Fetch-Site");
    const char *origin = gw_request_header(r, "Origin");
    if (site && (strcasecmp(site, "same-origin") == 0 || strcasecmp(site, "none") == 0)) return 0;
    if (!site && !origin) return 0; /* not a browser's request, or one of the same origin */
    if (!site && own_origin(origin, gw_request_header(r, "Host"))) return 0;
    return !gw_cors_allows(r->gw->cors, origin);
}

unsigned gw_guard_check(struct gw_request *r, const char *version, const struct gw_framing *f,
                        struct gw_problem *p)
{
    static const struct gw_problem host_count = {
        0, 400, "BAD_FORMAT", "an HTTP/1.1 request carries exactly one Host header, HTTP/1.0 at most one"};
    static const struct gw_problem host_refused = {
        0, 421, "HOST_NOT_ALLOWED",
        "this server does not answer to the name in the Host header: on a loopback address it "
        "answers to localhost, 127.0.0.1 and [::1], and to the names of --http-allowed-hosts"};
    static const struct gw_problem site_refused = {
        0, 403, "ORIGIN_NOT_ALLOWED",
        "a page of another site or origin may not change the queue from a browser: its origin "
        "is not in --http-cors-origins"};
    unsigned hosts = f->hosts;
    int http11 = version && strcmp(version, "HTTP/1.1") == 0;
    const struct gw_problem *found = NULL;
    if (hosts > 1 || (http11 && hosts == 0)) found = &host_count;
    else if (!gw_hosts_allow(r->gw->hosts, gw_request_header(r, "Host"))) found = &host_refused;
    else if (r->match.method != GW_GET && r->match.method != GW_HEAD &&
             r->match.method != GW_OPTIONS && cross_site(r))
        found = &site_refused;
    if (!found) return 0;
    *p = *found;
    return p->status;
}

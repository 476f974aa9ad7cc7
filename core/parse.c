/* parse.c - the one reader of decimal numbers. Every number a client or an
 * operator sends goes through bg_parse_u64; a protocol whose reference is
 * lenient (beanstalkd's leading spaces, gearmand's atoi) finds its digits
 * first and then calls it. And the one test for a line of HTTP sent to a
 * port that is not HTTP's (bg_line_is_http). */
#include <string.h>
#include <strings.h>

#include "core.h"

int bg_parse_u64(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0) return BG_BAD_FORMAT;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9) return BG_BAD_FORMAT;
        if (v > max / 10 || (v == max / 10 && d > max % 10)) return BG_BAD_FORMAT;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

size_t bg_digits_span(const char *s, size_t len)
{
    size_t n = 0;
    while (n < len && s[n] >= '0' && s[n] <= '9') n++;
    return n;
}

/* Nonzero if c may be in an HTTP method (a token, RFC 9110 section 5.6.2). */
static int tchar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

int bg_line_is_http(const char *line, size_t len)
{
    if (len >= 5 && strncasecmp(line, "Host:", 5) == 0) return 1;
    /* METHOD SP request-target SP HTTP/1.x, the version last */
    size_t m = 0;
    while (m < len && tchar(line[m])) m++;
    if (m == 0 || m == len || line[m] != ' ') return 0;
    static const char version[] = " HTTP/1.";
    size_t v = sizeof version - 1;
    if (len < m + 1 + 1 + v + 1) return 0;
    const char *tail = line + len - v - 1;
    if (memcmp(tail, version, v) != 0 || tail[v] < '0' || tail[v] > '9') return 0;
    for (const char *t = line + m + 1; t < tail; t++)
        if (*t == ' ') return 0; /* the target is one word */
    return 1;
}

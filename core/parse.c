/* parse.c - the one reader of decimal numbers. Every number a client or an
 * operator sends goes through bg_parse_u64; a protocol whose reference is
 * lenient (beanstalkd's leading spaces, gearmand's atoi) finds its digits
 * first and then calls it. */
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

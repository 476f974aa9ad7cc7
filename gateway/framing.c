/* framing.c - how a request says where its body ends, judged once for
 * every request: the first head of a connection as raw bytes, before
 * libmicrohttpd reads it (admit.c), and every request's header fields as
 * libmicrohttpd parsed them (http.c). A leaf: no I/O, no other gateway file.
 *
 * The rules (RFC 9112 sections 2.2, 5.2, 6.1 and 6.3): Content-Length is
 * decimal digits; several Content-Length fields must agree; Content-Length
 * with Transfer-Encoding is refused (a proxy in front and this server could
 * frame the body differently: request smuggling); the only transfer coding
 * is chunked; a header line that starts with a space or tab (obsolete line
 * folding) or has no name, a space before its colon or no colon is refused.
 * The Host fields are counted on the way, for guard.c (RFC 9112 section 3.2).
 */
#include <string.h>
#include <strings.h>

#include "gateway.h"

/* The problems a framing check finds, by status. */
static const struct gw_problem length_bad = {0, 400, "BAD_FORMAT",
                                             "Content-Length must be decimal digits"};
static const struct gw_problem length_conflict = {
    0, 400, "BAD_FORMAT", "Content-Length is given more than once with different values"};
static const struct gw_problem length_huge = {0, 413, "JOB_TOO_BIG",
                                              "the body is larger than the limit"};
static const struct gw_problem length_and_coding = {
    0, 400, "BAD_FORMAT", "Content-Length and Transfer-Encoding must not come together"};
static const struct gw_problem coding_unknown = {
    0, 501, "NOT_IMPLEMENTED", "the only transfer coding accepted is chunked"};
static const struct gw_problem line_bad = {0, 400, "BAD_FORMAT", "the request line is malformed"};
static const struct gw_problem version_bad = {
    0, 505, "HTTP_VERSION_NOT_SUPPORTED", "only HTTP/1.0 and HTTP/1.1 are served"};
static const struct gw_problem folded = {
    0, 400, "BAD_FORMAT", "a header line starts with a space or tab (obsolete line folding)"};
static const struct gw_problem field_bad = {
    0, 400, "BAD_FORMAT", "a header line has no name, a space before its colon, or no colon"};
const struct gw_problem gw_too_many_fields = {0, 431, "HEADERS_TOO_LARGE",
                                              "the request has too many header fields"};

/* s[0..n) without the spaces and tabs at both ends. */
static const char *trim_ows(const char *s, size_t *n)
{
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t')) (*n)--;
    while (*n && (*s == ' ' || *s == '\t')) s++, (*n)--;
    return s;
}

static int name_is(const char *name, size_t n, const char *want)
{
    return n == strlen(want) && strncasecmp(name, want, n) == 0;
}

void gw_framing_field(struct gw_framing *f, const char *name, size_t name_len, const char *value,
                      size_t value_len)
{
    value = trim_ows(value, &value_len);
    if (name_is(name, name_len, "Content-Length")) {
        uint64_t v = 0;
        size_t digits = bg_digits_span(value, value_len);
        if (digits == 0 || digits != value_len) f->length_bad = 1;
        else if (bg_parse_u64(value, value_len, UINT64_MAX, &v) != 0) f->length_huge = 1;
        else if (f->lengths && v != f->length) f->length_conflict = 1;
        if (!f->lengths) f->length = v;
        f->lengths++;
    } else if (name_is(name, name_len, "Transfer-Encoding")) {
        f->chunked = f->codings == 0 && value_len == 7 && strncasecmp(value, "chunked", 7) == 0;
        f->codings++;
    } else if (name_is(name, name_len, "Host")) {
        f->hosts++;
    }
}

unsigned gw_framing_verdict(const struct gw_framing *f, struct gw_problem *p)
{
    const struct gw_problem *found = NULL;
    if (f->lengths && f->codings) found = &length_and_coding;
    else if (f->length_bad) found = &length_bad;
    else if (f->length_conflict) found = &length_conflict;
    else if (f->length_huge) found = &length_huge;
    else if (f->codings && !f->chunked) found = &coding_unknown;
    if (!found) return 0;
    *p = *found;
    return p->status;
}

size_t gw_head_end(const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n && (buf[i] == '\r' || buf[i] == '\n')) i++; /* empty lines before a request */
    for (; i < n; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < n && buf[i + 1] == '\n') return i + 2;
        if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* The next line of head[*at..len) without its CR LF (or LF): its length,
 * *line its start; *at moves past it. */
static size_t next_line(const char *head, size_t len, size_t *at, const char **line)
{
    const char *start = head + *at;
    const char *lf = memchr(start, '\n', len - *at);
    size_t n = lf ? (size_t)(lf - start) : len - *at;
    *at += n + (lf != NULL);
    if (n && start[n - 1] == '\r') n--;
    *line = start;
    return n;
}

/* A token character of a header name (RFC 9110 section 5.6.2). */
static int tchar(unsigned char ch)
{
    return (ch > ' ' && ch < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", ch));
}

/* The request line: METHOD SP TARGET SP HTTP/1.x. 0, or the status. */
static unsigned request_line(const char *s, size_t n, struct gw_problem *p)
{
    const char *sp1 = memchr(s, ' ', n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - s)) : NULL;
    if (!sp1 || sp1 == s || !sp2 || sp2 == sp1 + 1) {
        *p = line_bad;
        return p->status;
    }
    const char *version = sp2 + 1;
    size_t vlen = n - (size_t)(version - s);
    if (vlen < 5 || memcmp(version, "HTTP/", 5) != 0 || memchr(version, ' ', vlen)) {
        *p = line_bad;
        return p->status;
    }
    if (vlen != 8 || version[5] != '1' || version[6] != '.' || version[7] < '0' || version[7] > '1') {
        *p = version_bad;
        return p->status;
    }
    return 0;
}

unsigned gw_head_check(const char *head, size_t len, unsigned max_fields, struct gw_problem *p)
{
    size_t at = 0;
    const char *line;
    size_t n;
    while (at < len && (head[at] == '\r' || head[at] == '\n')) at++;
    n = next_line(head, len, &at, &line);
    unsigned status = request_line(line, n, p);
    if (status) return status;
    struct gw_framing f = {0};
    unsigned fields = 0;
    while (at < len) {
        n = next_line(head, len, &at, &line);
        if (n == 0) break; /* the blank line: the end of the head */
        if (line[0] == ' ' || line[0] == '\t') {
            *p = folded;
            return p->status;
        }
        const char *colon = memchr(line, ':', n);
        size_t name_len = colon ? (size_t)(colon - line) : 0;
        for (size_t i = 0; i < name_len; i++)
            if (!tchar((unsigned char)line[i])) name_len = 0;
        if (name_len == 0) {
            *p = field_bad;
            return p->status;
        }
        if (++fields > max_fields) {
            *p = gw_too_many_fields;
            return p->status;
        }
        gw_framing_field(&f, line, name_len, colon + 1, n - name_len - 1);
    }
    return gw_framing_verdict(&f, p);
}

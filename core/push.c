/* push.c - the pure parts of push delivery (server/push.c does the I/O):
 * the subscription syntax and its URL, the retry policy (what an attempt's
 * answer means, the backoff with jitter, Retry-After), the rate limiter,
 * and the bounded table of each job's last delivery failure. No clock is
 * read here: times are parameters. */
#include <stdio.h>
#include <string.h>

#include "core.h"

/* ---- subscription lists and specs --------------------------------------- */

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

int bg_push_list_next(const char *s, size_t len, size_t *pos, char *out, size_t out_size,
                      unsigned *line)
{
    size_t o = 0, i = *pos;
    int words = 0;
    while (i < len) {
        char ch = s[i];
        if (ch == '\n') {
            if (words) break; /* left for the next call: *line stays the spec's */
            i++;
            (*line)++;
            continue;
        }
        if (is_space(ch)) {
            i++;
            continue;
        }
        size_t w = i;
        while (i < len && !is_space(s[i]) && s[i] != '\n') i++;
        if (s[w] == '#') { /* a comment: to the end of the line */
            while (i < len && s[i] != '\n') i++;
            continue;
        }
        if (i - w == 1 && s[w] == ';') {
            if (words) break;
            continue;
        }
        if (o + (words ? 1 : 0) + (i - w) + 1 > out_size) return BG_BAD_FORMAT;
        if (words) out[o++] = ' ';
        memcpy(out + o, s + w, i - w);
        o += i - w;
        words++;
    }
    *pos = i;
    if (!words) return 0;
    out[o] = '\0';
    return 1;
}

/* Copy why into out (at most size - 1 bytes). */
static int refuse(char *out, size_t size, const char *why)
{
    size_t n = strlen(why);
    if (n >= size) n = size ? size - 1 : 0;
    if (size) {
        memcpy(out, why, n);
        out[n] = '\0';
    }
    return BG_BAD_FORMAT;
}

static int lower(char ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

/* Nonzero if s[0..n) starts with the lowercase ASCII prefix p, in any case. */
static int has_prefix_nocase(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    if (n < k) return 0;
    for (size_t i = 0; i < k; i++)
        if (lower(s[i]) != p[i]) return 0;
    return 1;
}

static int host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.';
}

int bg_push_url_parse(const char *url, struct bg_push_spec *out, char *why, size_t why_size)
{
    size_t n = strlen(url);
    if (n > BG_PUSH_URL_MAX) return refuse(why, why_size, "url longer than 2048 bytes");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= ' ' || (unsigned char)url[i] >= 0x7f)
            return refuse(why, why_size, "url has a byte that is not visible ASCII");
    int tls = has_prefix_nocase(url, n, "https://");
    if (!tls && !has_prefix_nocase(url, n, "http://"))
        return refuse(why, why_size, "url must start with http:// or https://");
    if (memchr(url, '#', n)) return refuse(why, why_size, "url must not have a #fragment");
    const char *a = url + (tls ? 8 : 7);
    size_t alen = strcspn(a, "/?");
    if (memchr(a, '@', alen)) return refuse(why, why_size, "url must not have a user or password (user@host)");
    const char *host = a, *port = NULL;
    size_t hlen;
    if (alen && a[0] == '[') {
        const char *close = memchr(a, ']', alen);
        if (!close) return refuse(why, why_size, "url has an IPv6 address without its closing ]");
        host = a + 1;
        hlen = (size_t)(close - host);
        for (size_t i = 0; i < hlen; i++) {
            char ch = host[i];
            if (!((ch >= '0' && ch <= '9') || (lower(ch) >= 'a' && lower(ch) <= 'f') || ch == ':' || ch == '.'))
                return refuse(why, why_size, "url has a bad IPv6 address");
        }
        const char *after = close + 1;
        if (after < a + alen) {
            if (*after != ':') return refuse(why, why_size, "url has bytes after the IPv6 address");
            port = after + 1;
        }
    } else {
        const char *colon = memchr(a, ':', alen);
        hlen = colon ? (size_t)(colon - a) : alen;
        if (colon) port = colon + 1;
        for (size_t i = 0; i < hlen; i++)
            if (!host_char(host[i])) return refuse(why, why_size, "url has a bad host name");
    }
    if (hlen == 0) return refuse(why, why_size, "url has no host");
    if (hlen >= sizeof out->host) return refuse(why, why_size, "url host is too long");
    uint64_t p = tls ? 443 : 80;
    if (port && bg_parse_u64(port, (size_t)(a + alen - port), 65535, &p) != 0)
        return refuse(why, why_size, "url port must be a number from 1 to 65535");
    if (p == 0) return refuse(why, why_size, "url port must be a number from 1 to 65535");
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    out->port = (uint16_t)p;
    out->tls = tls;
    const char *rest = a + alen;
    if (*rest == '/') snprintf(out->path, sizeof out->path, "%s", rest);
    else snprintf(out->path, sizeof out->path, "/%s", rest); /* "" or "?query" */
    snprintf(out->url, sizeof out->url, "%s", url);
    return 0;
}

/* Parse "N/s", "N/m" or "N/h": the count and the period in ns. */
static int parse_rate(const char *v, struct bg_push_spec *out)
{
    const char *slash = strchr(v, '/');
    uint64_t n;
    if (!slash || bg_parse_u64(v, (size_t)(slash - v), BG_PUSH_RATE_MAX, &n) != 0 || n == 0) return -1;
    const char *unit = slash + 1;
    bg_time per = strcmp(unit, "s") == 0 ? BG_SECOND
                : strcmp(unit, "m") == 0 ? 60 * BG_SECOND
                : strcmp(unit, "h") == 0 ? 3600 * BG_SECOND : 0;
    if (!per) return -1;
    out->rate_count = (uint32_t)n;
    out->rate_period = per;
    return 0;
}

/* A number from lo to hi: 0, or -1. */
static int parse_range(const char *v, size_t n, uint64_t lo, uint64_t hi, uint32_t *out)
{
    uint64_t x;
    if (bg_parse_u64(v, n, hi, &x) != 0 || x < lo) return -1;
    *out = (uint32_t)x;
    return 0;
}

void bg_push_spec_defaults(struct bg_push_spec *s)
{
    memset(s, 0, sizeof *s);
    s->concurrency = BG_PUSH_DEFAULT_CONCURRENCY;
    s->timeout_s = BG_PUSH_DEFAULT_TIMEOUT;
    s->attempts = BG_PUSH_DEFAULT_ATTEMPTS;
    s->backoff_min_s = BG_PUSH_DEFAULT_BACKOFF_MIN;
    s->backoff_max_s = BG_PUSH_DEFAULT_BACKOFF_MAX;
}

int bg_push_spec_parse(const char *text, struct bg_push_spec *out, char *why, size_t why_size)
{
    static const char *const keys[] = {"tube", "url", "concurrency", "rate", "timeout", "attempts",
                                       "backoff", "secret-file", "ca-file", "cert-file", "key-file"};
    enum { K_TUBE, K_URL, K_CONCURRENCY, K_RATE, K_TIMEOUT, K_ATTEMPTS, K_BACKOFF, K_SECRET,
           K_CA, K_CERT, K_KEY, K_COUNT };
    int seen[K_COUNT] = {0};
    char msg[160];
    bg_push_spec_defaults(out);
    const char *p = text;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        size_t wlen = strcspn(p, " ");
        const char *eq = memchr(p, '=', wlen);
        if (!eq) {
            snprintf(msg, sizeof msg, "'%.*s' is not key=value", (int)(wlen > 60 ? 60 : wlen), p);
            return refuse(why, why_size, msg);
        }
        size_t klen = (size_t)(eq - p);
        const char *v = eq + 1;
        size_t vlen = wlen - klen - 1;
        int k = 0;
        while (k < K_COUNT && !(strlen(keys[k]) == klen && memcmp(keys[k], p, klen) == 0)) k++;
        if (k == K_COUNT) {
            snprintf(msg, sizeof msg,
                     "unknown key '%.*s' (known: tube url concurrency rate timeout attempts backoff "
                     "secret-file ca-file cert-file key-file)", (int)(klen > 40 ? 40 : klen), p);
            return refuse(why, why_size, msg);
        }
        if (seen[k]++) {
            snprintf(msg, sizeof msg, "key '%s' given twice", keys[k]);
            return refuse(why, why_size, msg);
        }
        char value[BG_PUSH_URL_MAX + 2];
        if (vlen >= sizeof value) return refuse(why, why_size, "a value is too long");
        memcpy(value, v, vlen);
        value[vlen] = '\0';
        int bad = 0;
        switch (k) {
        case K_TUBE:
            if (!bg_tube_name_valid(value, vlen))
                return refuse(why, why_size, "tube: not a valid tube name (1-200 bytes of "
                                             "A-Za-z0-9-+/;.$_() not starting with '-')");
            memcpy(out->tube, value, vlen + 1);
            break;
        case K_URL:
            if (bg_push_url_parse(value, out, msg, sizeof msg) != 0) return refuse(why, why_size, msg);
            break;
        case K_CONCURRENCY:
            bad = parse_range(value, vlen, 1, BG_PUSH_CONCURRENCY_MAX, &out->concurrency);
            if (bad) return refuse(why, why_size, "concurrency: a number from 1 to 1024");
            break;
        case K_RATE:
            if (parse_rate(value, out) != 0)
                return refuse(why, why_size, "rate: N/s, N/m or N/h with N from 1 to 1000000");
            break;
        case K_TIMEOUT:
            bad = parse_range(value, vlen, 1, BG_PUSH_TIMEOUT_MAX, &out->timeout_s);
            if (bad) return refuse(why, why_size, "timeout: seconds from 1 to 86400");
            break;
        case K_ATTEMPTS:
            bad = parse_range(value, vlen, 1, BG_PUSH_ATTEMPTS_MAX, &out->attempts);
            if (bad) return refuse(why, why_size, "attempts: a number from 1 to 1000000");
            break;
        case K_BACKOFF: {
            const char *dots = strstr(value, "..");
            if (!dots || parse_range(value, (size_t)(dots - value), 1, BG_PUSH_BACKOFF_MAX, &out->backoff_min_s) ||
                parse_range(dots + 2, strlen(dots + 2), 1, BG_PUSH_BACKOFF_MAX, &out->backoff_max_s) ||
                out->backoff_min_s > out->backoff_max_s)
                return refuse(why, why_size, "backoff: MIN..MAX in seconds, 1 <= MIN <= MAX <= 604800");
            break;
        }
        case K_SECRET:
            if (vlen == 0 || vlen >= sizeof out->secret_file)
                return refuse(why, why_size, "secret-file: a path of 1 to 1023 bytes");
            memcpy(out->secret_file, value, vlen + 1);
            break;
        case K_CA:
        case K_CERT:
        case K_KEY: {
            char *dst = k == K_CA ? out->ca_file : k == K_CERT ? out->cert_file : out->key_file;
            if (vlen == 0 || vlen >= sizeof out->ca_file) {
                snprintf(msg, sizeof msg, "%s: a path of 1 to 1023 bytes", keys[k]);
                return refuse(why, why_size, msg);
            }
            memcpy(dst, value, vlen + 1);
            break;
        }
        }
        p += wlen;
    }
    if (!seen[K_TUBE]) return refuse(why, why_size, "tube= is missing");
    if (!seen[K_URL]) return refuse(why, why_size, "url= is missing");
    if (!out->tls && (seen[K_CA] || seen[K_CERT] || seen[K_KEY]))
        return refuse(why, why_size, "ca-file, cert-file and key-file need an https:// url");
    if (seen[K_CERT] != seen[K_KEY])
        return refuse(why, why_size, "cert-file and key-file go together (a client certificate and its key)");
    return 0;
}

/* ---- the retry policy --------------------------------------------------- */

static const char *const reason_names[BG_PUSH_REASON_COUNT] = {
    [BG_PUSH_DELIVERED] = "delivered",
    [BG_PUSH_RETRY_AFTER] = "retry_after",
    [BG_PUSH_HTTP_429] = "http_429",
    [BG_PUSH_HTTP_5XX] = "http_5xx",
    [BG_PUSH_TIMEOUT] = "timeout",
    [BG_PUSH_CONNECT_FAILED] = "connect_failed",
    [BG_PUSH_CONNECTION_ERROR] = "connection_error",
    [BG_PUSH_BAD_STATUS] = "bad_status",
    [BG_PUSH_TLS_FAILED] = "tls_error",
    [BG_PUSH_HTTP_3XX] = "http_3xx",
    [BG_PUSH_HTTP_4XX] = "http_4xx",
    [BG_PUSH_ATTEMPTS_EXHAUSTED] = "attempts_exhausted",
    [BG_PUSH_SHUTDOWN] = "shutdown",
};

const char *bg_push_reason_name(enum bg_push_reason r)
{
    return (unsigned)r < BG_PUSH_REASON_COUNT ? reason_names[r] : "unknown";
}

enum bg_push_reason bg_push_classify(unsigned status, int has_retry_after, enum bg_push_failure failure)
{
    if (status == 0) {
        switch (failure) {
        case BG_PUSH_FAIL_TIMEOUT: return BG_PUSH_TIMEOUT;
        case BG_PUSH_FAIL_CONNECT: return BG_PUSH_CONNECT_FAILED;
        case BG_PUSH_FAIL_TLS: return BG_PUSH_TLS_FAILED;
        case BG_PUSH_FAIL_NONE:
        case BG_PUSH_FAIL_CONNECTION: return BG_PUSH_CONNECTION_ERROR;
        }
        return BG_PUSH_CONNECTION_ERROR;
    }
    if (status >= 200 && status <= 299) return BG_PUSH_DELIVERED;
    if (has_retry_after) return BG_PUSH_RETRY_AFTER;
    if (status == 429) return BG_PUSH_HTTP_429;
    if (status >= 500 && status <= 599) return BG_PUSH_HTTP_5XX;
    if (status >= 300 && status <= 399) return BG_PUSH_HTTP_3XX;
    if (status >= 400 && status <= 499) return BG_PUSH_HTTP_4XX;
    return BG_PUSH_BAD_STATUS;
}

enum bg_push_action bg_push_action_of(enum bg_push_reason r, uint32_t attempt, uint32_t max_attempts)
{
    switch (r) {
    case BG_PUSH_DELIVERED: return BG_PUSH_DELETE;
    case BG_PUSH_HTTP_3XX:
    case BG_PUSH_HTTP_4XX:
    case BG_PUSH_ATTEMPTS_EXHAUSTED: return BG_PUSH_BURY;
    case BG_PUSH_SHUTDOWN: return BG_PUSH_RELEASE;
    default: return attempt >= max_attempts ? BG_PUSH_BURY : BG_PUSH_RELEASE;
    }
}

uint32_t bg_push_backoff(uint32_t min_s, uint32_t max_s, uint32_t attempt, uint64_t random)
{
    if (max_s < min_s) max_s = min_s;
    uint64_t cap = min_s;
    for (uint32_t i = 1; i < attempt && cap < max_s; i++) cap *= 2;
    if (cap > max_s) cap = max_s;
    uint64_t span = cap - min_s + 1;
    return (uint32_t)(min_s + random % span);
}

uint32_t bg_push_retry_delay(uint64_t retry_after_s, uint32_t min_s, uint32_t max_s)
{
    if (retry_after_s < min_s) return min_s;
    if (retry_after_s > max_s) return max_s;
    return (uint32_t)retry_after_s;
}

/* ---- Retry-After -------------------------------------------------------- */

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* n digits at *p as a number (advancing *p); -1 if they are not digits. */
static int64_t digits(const char **p, int n)
{
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        if ((*p)[i] < '0' || (*p)[i] > '9') return -1;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    return v;
}

/* Nonzero if *p starts with lit (advancing *p past it). */
static int lit(const char **p, const char *s)
{
    size_t n = strlen(s);
    if (strncmp(*p, s, n) != 0) return 0;
    *p += n;
    return 1;
}

/* A month name ("Jan") at *p: 1-12, or 0. */
static unsigned month(const char **p)
{
    static const char names[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    for (unsigned m = 0; m < 12; m++)
        if (strncmp(*p, names + 3 * m, 3) == 0) {
            *p += 3;
            return m + 1;
        }
    return 0;
}

/* "HH:MM:SS" at *p: seconds of the day, or -1. */
static int64_t clock_time(const char **p)
{
    int64_t h = digits(p, 2);
    if (h < 0 || h > 23 || !lit(p, ":")) return -1;
    int64_t mi = digits(p, 2);
    if (mi < 0 || mi > 59 || !lit(p, ":")) return -1;
    int64_t s = digits(p, 2);
    if (s < 0 || s > 60) return -1;
    return h * 3600 + mi * 60 + s;
}

int bg_http_date_parse(const char *v, int64_t *out)
{
    static const char *const wkday[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
    static const char *const weekday[] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                          "Friday", "Saturday", "Sunday"};
    const char *p = v;
    int64_t day, year, secs;
    unsigned m;
    int k;
    for (k = 0; k < 7; k++)
        if (lit(&p, weekday[k]) || lit(&p, wkday[k])) break;
    if (k == 7) return BG_BAD_FORMAT;
    if (lit(&p, ", ")) {
        if (p[2] == ' ') { /* IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT */
            if ((day = digits(&p, 2)) < 0 || !lit(&p, " ") || !(m = month(&p)) || !lit(&p, " ") ||
                (year = digits(&p, 4)) < 0 || !lit(&p, " ") || (secs = clock_time(&p)) < 0 ||
                !lit(&p, " GMT"))
                return BG_BAD_FORMAT;
        } else { /* RFC 850: Sunday, 06-Nov-94 08:49:37 GMT */
            if ((day = digits(&p, 2)) < 0 || !lit(&p, "-") || !(m = month(&p)) || !lit(&p, "-") ||
                (year = digits(&p, 2)) < 0 || !lit(&p, " ") || (secs = clock_time(&p)) < 0 ||
                !lit(&p, " GMT"))
                return BG_BAD_FORMAT;
            year += year < 70 ? 2000 : 1900; /* a two-digit year: the nearest century */
        }
    } else if (lit(&p, " ")) { /* asctime: Sun Nov  6 08:49:37 1994 */
        if (!(m = month(&p)) || !lit(&p, " ")) return BG_BAD_FORMAT;
        if (*p == ' ') p++, day = digits(&p, 1);
        else day = digits(&p, 2);
        if (day < 0 || !lit(&p, " ") || (secs = clock_time(&p)) < 0 || !lit(&p, " ") ||
            (year = digits(&p, 4)) < 0)
            return BG_BAD_FORMAT;
    } else {
        return BG_BAD_FORMAT;
    }
    if (*p || day < 1 || day > 31) return BG_BAD_FORMAT;
    *out = days_from_civil(year, m, (unsigned)day) * 86400 + secs;
    return 0;
}

int bg_push_retry_after(const char *v, int64_t now_wall_s, uint64_t *delay_s)
{
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (n == 0) return BG_BAD_FORMAT;
    if (v[0] >= '0' && v[0] <= '9') {
        /* delta-seconds; a huge one is capped later anyway */
        size_t d = bg_digits_span(v, n);
        if (d != n) return BG_BAD_FORMAT;
        if (bg_parse_u64(v, n, UINT64_MAX, delay_s) != 0) *delay_s = UINT64_MAX;
        return 0;
    }
    char copy[64];
    if (n >= sizeof copy) return BG_BAD_FORMAT;
    memcpy(copy, v, n);
    copy[n] = '\0';
    int64_t at;
    if (bg_http_date_parse(copy, &at) != 0) return BG_BAD_FORMAT;
    *delay_s = at > now_wall_s ? (uint64_t)(at - now_wall_s) : 0;
    return 0;
}

/* ---- the rate limiter (GCRA) ------------------------------------------- */

void bg_rate_init(struct bg_rate *r, uint32_t count, bg_time period)
{
    memset(r, 0, sizeof *r);
    if (!count || !period) return; /* unlimited */
    r->interval = period / count;
    if (!r->interval) r->interval = 1;
    uint64_t per_second = (uint64_t)count * BG_SECOND / period; /* one second's worth */
    r->burst = per_second > 1 ? (per_second - 1) * r->interval : 0;
}

bg_time bg_rate_ready_at(const struct bg_rate *r, bg_time now)
{
    if (!r->interval) return now;
    bg_time earliest = r->tat > r->burst ? r->tat - r->burst : 0;
    return earliest > now ? earliest : now;
}

void bg_rate_take(struct bg_rate *r, bg_time now)
{
    if (!r->interval) return;
    r->tat = (r->tat > now ? r->tat : now) + r->interval;
}

/* ---- the table of last failures ---------------------------------------- */

#define NONE UINT32_MAX

static uint32_t failure_bucket(const struct bg_push_failures *t, uint64_t id)
{
    return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> (64 - t->bucket_bits));
}

void bg_push_failures_init(struct bg_push_failures *t, uint32_t limit)
{
    memset(t, 0, sizeof *t);
    t->limit = limit ? limit : 1;
    t->free_head = t->newest = t->oldest = NONE;
}

void bg_push_failures_free(struct bg_push_failures *t)
{
    bg_free(t->slots);
    bg_free(t->buckets);
    uint32_t limit = t->limit;
    bg_push_failures_init(t, limit);
}

/* Find id's slot index; NONE if absent. */
static uint32_t failure_find(const struct bg_push_failures *t, uint64_t id)
{
    if (!t->buckets) return NONE;
    for (uint32_t i = t->buckets[failure_bucket(t, id)]; i != NONE; i = t->slots[i].hash_next)
        if (t->slots[i].rec.job_id == id) return i;
    return NONE;
}

/* Unlink slot i from the age list. */
static void age_unlink(struct bg_push_failures *t, uint32_t i)
{
    struct bg_push_failure_slot *s = &t->slots[i];
    if (s->older != NONE) t->slots[s->older].newer = s->newer; else t->oldest = s->newer;
    if (s->newer != NONE) t->slots[s->newer].older = s->older; else t->newest = s->older;
}

/* Make slot i the newest. */
static void age_push(struct bg_push_failures *t, uint32_t i)
{
    struct bg_push_failure_slot *s = &t->slots[i];
    s->newer = NONE;
    s->older = t->newest;
    if (t->newest != NONE) t->slots[t->newest].newer = i; else t->oldest = i;
    t->newest = i;
}

/* Remove slot i from its hash chain and the age list; free it. */
static void failure_drop(struct bg_push_failures *t, uint32_t i)
{
    uint32_t *link = &t->buckets[failure_bucket(t, t->slots[i].rec.job_id)];
    while (*link != i) link = &t->slots[*link].hash_next;
    *link = t->slots[i].hash_next;
    age_unlink(t, i);
    t->slots[i].hash_next = t->free_head;
    t->slots[i].rec.job_id = 0;
    t->free_head = i;
    t->count--;
}

/* Double the table (up to the limit): more slots, rehashed buckets. */
static int failures_grow(struct bg_push_failures *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : 64;
    if (cap > t->limit) cap = t->limit;
    unsigned bits = 1;
    while ((1u << bits) < cap) bits++;
    struct bg_push_failure_slot *slots = bg_realloc(t->slots, (size_t)cap * sizeof *slots);
    if (!slots) return BG_OUT_OF_MEMORY;
    t->slots = slots;
    uint32_t *buckets = bg_malloc(((size_t)1 << bits) * sizeof *buckets);
    if (!buckets) return BG_OUT_OF_MEMORY;
    bg_free(t->buckets);
    t->buckets = buckets;
    t->bucket_bits = bits;
    for (size_t b = 0; b < ((size_t)1 << bits); b++) buckets[b] = NONE;
    for (uint32_t i = 0; i < t->cap; i++) { /* rehash the live slots */
        if (!slots[i].rec.job_id) continue;
        uint32_t b = failure_bucket(t, slots[i].rec.job_id);
        slots[i].hash_next = buckets[b];
        buckets[b] = i;
    }
    for (uint32_t i = cap; i-- > t->cap;) { /* the new slots are free */
        slots[i].rec.job_id = 0;
        slots[i].hash_next = t->free_head;
        t->free_head = i;
    }
    t->cap = cap;
    return 0;
}

int bg_push_failures_set(struct bg_push_failures *t, const struct bg_push_failure_rec *rec)
{
    if (!rec->job_id) return BG_BAD_FORMAT;
    uint32_t i = failure_find(t, rec->job_id);
    if (i != NONE) {
        t->slots[i].rec = *rec;
        age_unlink(t, i);
        age_push(t, i);
        return 0;
    }
    if (t->free_head == NONE && t->cap < t->limit && failures_grow(t) != 0) {
        if (!t->cap) return BG_OUT_OF_MEMORY;
    }
    if (t->free_head == NONE) { /* full: the oldest record goes */
        failure_drop(t, t->oldest);
        t->evicted++;
    }
    i = t->free_head;
    t->free_head = t->slots[i].hash_next;
    t->slots[i].rec = *rec;
    uint32_t b = failure_bucket(t, rec->job_id);
    t->slots[i].hash_next = t->buckets[b];
    t->buckets[b] = i;
    age_push(t, i);
    t->count++;
    return 0;
}

const struct bg_push_failure_rec *bg_push_failures_get(const struct bg_push_failures *t, uint64_t id)
{
    uint32_t i = failure_find(t, id);
    return i == NONE ? NULL : &t->slots[i].rec;
}

void bg_push_failures_remove(struct bg_push_failures *t, uint64_t id)
{
    uint32_t i = failure_find(t, id);
    if (i != NONE) failure_drop(t, i);
}

void bg_push_failures_each(const struct bg_push_failures *t,
                           void (*fn)(void *ctx, const struct bg_push_failure_rec *rec), void *ctx)
{
    for (uint32_t i = t->oldest; i != NONE; i = t->slots[i].newer) fn(ctx, &t->slots[i].rec);
}

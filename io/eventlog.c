/* eventlog.c - key=value event lines on stderr (see eventlog.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eventlog.h"

#define LOG_LINE_MAX 4096
#define LOG_STR_SLOTS 8
#define LOG_STR_SIZE 512

static int max_level = BG_LOG_WARN;

void log_set_verbosity(int verbose)
{
    max_level = verbose <= 0 ? BG_LOG_WARN : verbose == 1 ? BG_LOG_INFO : BG_LOG_DEBUG;
}

int log_enabled(enum bg_log_level level) { return (int)level <= max_level; }

static const char *level_name(enum bg_log_level level)
{
    switch (level) {
    case BG_LOG_ERROR: return "error";
    case BG_LOG_WARN: return "warn";
    case BG_LOG_INFO: return "info";
    case BG_LOG_DEBUG: return "debug";
    }
    return "info";
}

/* Nonzero if s can be written without quotes. */
static int plain_word(const char *s)
{
    if (!*s) return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p >= 0x7f || *p == '"' || *p == '=' || *p == '\\') return 0;
    return 1;
}

const char *log_str(const char *s)
{
    static __thread char ring[LOG_STR_SLOTS][LOG_STR_SIZE];
    static __thread unsigned next;
    if (!s) return "-";
    if (plain_word(s) && strlen(s) < LOG_STR_SIZE) return s;
    char *out = ring[next++ % LOG_STR_SLOTS];
    size_t o = 0;
    const size_t room = LOG_STR_SIZE - 6; /* closing quote, "...", NUL */
    out[o++] = '"';
    const unsigned char *p = (const unsigned char *)s;
    for (; *p && o < room; p++) {
        unsigned char ch = *p;
        const char *esc = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n"
                        : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : NULL;
        if (esc) {
            if (o + 2 > room) break;
            memcpy(out + o, esc, 2);
            o += 2;
        } else if (ch < ' ' || ch == 0x7f) {
            if (o + 4 > room) break;
            snprintf(out + o, 5, "\\x%02x", ch);
            o += 4;
        } else {
            out[o++] = (char)ch;
        }
    }
    if (*p) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

int log_limit_pass(struct log_limit *l, unsigned long long now, unsigned long long interval,
                   unsigned long long *held_back)
{
    if (now < l->next_at) {
        l->held_back++;
        return 0;
    }
    *held_back = l->held_back;
    l->held_back = 0;
    l->next_at = now + interval;
    return 1;
}

void log_event(enum bg_log_level level, const char *event, const char *fmt, ...)
{
    if (!log_enabled(level)) return;
    int saved_errno = errno;
    char line[LOG_LINE_MAX];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "ts=%Y-%m-%dT%H:%M:%S", &tm);
    int w = snprintf(line + n, sizeof line - n, ".%03ldZ level=%s event=%s", ts.tv_nsec / 1000000,
                     level_name(level), event);
    if (w > 0) n += (size_t)w;
    if (n < sizeof line && fmt && *fmt) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        w = vsnprintf(line + n, sizeof line - n, fmt, ap);
        va_end(ap);
        if (w > 0) n += (size_t)w;
    }
    if (n >= sizeof line - 1) { /* cut: mark it */
        n = sizeof line - 5;
        memcpy(line + n, "...", 3);
        n += 3;
    }
    line[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t k = write(STDERR_FILENO, line + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    errno = saved_errno;
}

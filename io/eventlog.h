/* eventlog.h - one line per event on stderr, as key=value pairs:
 *
 *   ts=2025-01-31T12:00:00.123Z level=info event=listening addr=127.0.0.1 port=11300
 *
 * The level is chosen by the -V count: 0 writes errors and warnings only,
 * 1 adds info, 2 or more adds debug. Each line is written with one write(),
 * so lines from different threads do not mix.
 *
 * fmt is printf-like and gives the pairs after `event=`. A value that may
 * hold spaces, quotes, '=' or control bytes (paths, addresses, messages from
 * libraries) must go through log_str(), which quotes and escapes it. */
#ifndef BEANGATE_LOG_H
#define BEANGATE_LOG_H

enum bg_log_level {
    BG_LOG_ERROR = 0,
    BG_LOG_WARN = 1,
    BG_LOG_INFO = 2,
    BG_LOG_DEBUG = 3,
};

/* Set the level from the -V count (0: warn, 1: info, 2+: debug). */
void log_set_verbosity(int verbose);
/* Nonzero if events of this level are written. */
int log_enabled(enum bg_log_level level);
/* Write one event line if its level is enabled. fmt may be NULL or "". */
void log_event(enum bg_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* At most one line per interval for one kind of event (an accept that
 * fails at the open-file limit, connections refused by a limit): a client
 * must not be able to fill the log. */
struct log_limit {
    unsigned long long next_at;     /* no line before this (ns, the caller's clock) */
    unsigned long long held_back;   /* events not written since the last line */
};
/* 1 if a line may be written at `now` (ns): *held_back gets how many
 * events were not written since the last line; else 0 (this one is
 * counted). */
int log_limit_pass(struct log_limit *l, unsigned long long now, unsigned long long interval,
                   unsigned long long *held_back);

/* s as a logfmt value: as is when it is a plain word, otherwise in double
 * quotes with \" \\ \n \r \t and \xHH escapes. NULL gives "-". The result
 * lives in a per-thread ring of 8 buffers of 512 bytes (longer values are
 * cut and end in "..."), so at most 8 may be used in one log_event call. */
const char *log_str(const char *s);

#endif

/* codec.c - the beanstalk wire protocol: framing, one command table,
 * parse-then-execute, and reply bytes appended to the session's output.
 *
 * Replies reproduce Debian's beanstalkd 1.12 byte for byte, malformed input
 * included. Where the reference's behaviour comes from how it happens to be
 * written (prefix matching, strtoul/strtol), the quirk is reproduced here on
 * purpose and marked "reference:".
 */
#include <stdio.h>
#include <string.h>

#include "core.h"


/* ---- replies ----------------------------------------------------------- */

const char *bg_outcome_word(int outcome)
{
    switch (outcome) {
    case BG_OK: return "OK";
    case BG_NOT_FOUND: return "NOT_FOUND";
    case BG_BAD_FORMAT: return "BAD_FORMAT";
    case BG_JOB_TOO_BIG: return "JOB_TOO_BIG";
    case BG_DRAINING: return "DRAINING";
    case BG_DEADLINE_SOON: return "DEADLINE_SOON";
    case BG_TIMED_OUT: return "TIMED_OUT";
    case BG_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case BG_EXPECTED_CRLF: return "EXPECTED_CRLF";
    case BG_UNKNOWN_COMMAND: return "UNKNOWN_COMMAND";
    case BG_NOT_IGNORED: return "NOT_IGNORED";
    case BG_BURIED: return "BURIED";
    case BG_LOG_UNAVAILABLE: return "LOG_UNAVAILABLE";
    case BG_TORN: return "TORN";
    case BG_CORRUPT: return "CORRUPT";
    case BG_IO_ERROR: return "IO_ERROR";
    case BG_MEMORY_CEILING: return "OUT_OF_MEMORY"; /* beanstalk's word for a refused put */
    case BG_PERMISSION_DENIED: return "PERMISSION_DENIED";
    default: return "INTERNAL_ERROR";
    }
}

/* Append bytes to the output; if even that fails, close the session. */
static void out_append(struct bg_session *s, const void *bytes, size_t n)
{
    if (bg_buf_append(&s->stream.out, bytes, n) != 0) s->stream.closing = 1;
}

static void reply_text(struct bg_session *s, const char *text)
{
    out_append(s, text, strlen(text));
}

static void reply_word(struct bg_session *s, int outcome)
{
    const char *w = bg_outcome_word(outcome);
    size_t n = strlen(w);
    char *tail = bg_buf_reserve(&s->stream.out, n + 2);
    if (!tail) {
        s->stream.closing = 1;
        return;
    }
    memcpy(tail, w, n);
    memcpy(tail + n, "\r\n", 2);
    s->stream.out.len += n + 2;
}

/* Write v in decimal at p; returns the end. */
static char *put_decimal(char *p, uint64_t v)
{
    char digits[20];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n) *p++ = digits[--n];
    return p;
}

/* "<word> <a>[ <b>]\r\n", then `extra` bytes of body: one reserve, no printf
 * (the hot path of put and reserve). */
static void reply_numbers(struct bg_session *s, const char *word, size_t word_len, uint64_t a,
                          int with_b, uint64_t b, const char *extra, size_t extra_len)
{
    char *p = bg_buf_reserve(&s->stream.out, word_len + 44 + extra_len);
    if (!p) {
        s->stream.closing = 1;
        return;
    }
    char *start = p;
    memcpy(p, word, word_len);
    p += word_len;
    *p++ = ' ';
    p = put_decimal(p, a);
    if (with_b) {
        *p++ = ' ';
        p = put_decimal(p, b);
    }
    *p++ = '\r';
    *p++ = '\n';
    if (extra_len) memcpy(p, extra, extra_len);
    s->stream.out.len += (size_t)(p - start) + extra_len;
}

/* "<word> <id> <bytes>\r\n<body>\r\n" */
static void reply_job(struct bg_session *s, const char *word, const struct bg_job *j)
{
    bg_engine_show_job(s->client.engine, j);
    reply_numbers(s, word, strlen(word), j->id, 1, j->body_size - 2, j->body, j->body_size);
}

/* ---- number parsing (reference semantics) ------------------------------ */

/* The digits at p (a NUL-terminated line) as a number up to max, read by
 * bg_parse_u64; *end is set after them. BG_BAD_FORMAT if there is no digit
 * or the number is above max. */
static int read_digits(const char *p, uint64_t max, const char **end, uint64_t *out)
{
    size_t n = bg_digits_span(p, strlen(p));
    if (bg_parse_u64(p, n, max, out) != 0) return BG_BAD_FORMAT;
    *end = p + n;
    return 0;
}

/* An unsigned number after any spaces, no sign. With end == NULL the number
 * must end the line. */
static int read_uint(const char *p, const char **end, uint64_t max, uint64_t *out)
{
    while (*p == ' ') p++;
    const char *stop;
    if (read_digits(p, max, &stop, out) != 0) return BG_BAD_FORMAT;
    if (!end && *stop != '\0') return BG_BAD_FORMAT;
    if (end) *end = stop;
    return 0;
}

static int is_c_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

/* reference: strtoul/strtol rules - leading white space, an optional sign,
 * digits; no digits gives 0 with *end == p; overflow fails. A minus sign
 * negates in unsigned arithmetic. `is_signed` selects long range. */
static int read_c_number(const char *p, const char **end, int is_signed, uint64_t *out)
{
    const char *start = p;
    while (is_c_space(*p)) p++;
    int negative = 0;
    if (*p == '+' || *p == '-') negative = *p++ == '-';
    if (!(*p >= '0' && *p <= '9')) {
        *end = start;
        *out = 0;
        return 0;
    }
    uint64_t max = is_signed ? (uint64_t)INT64_MAX + (negative ? 1 : 0) : UINT64_MAX;
    uint64_t v;
    if (read_digits(p, max, end, &v) != 0) return BG_BAD_FORMAT;
    *out = negative ? (uint64_t)0 - v : v;
    return 0;
}

/* reference: a tube name is the rest of the line and must be valid whole. */
static int read_whole_name(const char *p, const char **name)
{
    if (!bg_tube_name_valid(p, strlen(p))) return BG_BAD_FORMAT;
    *name = p;
    return 0;
}

/* ---- the command table ------------------------------------------------- */

enum arg_shape {
    ARGS_NONE,     /* the line must be exactly the command name */
    ARGS_ID,       /* <id> */
    ARGS_NAME,     /* <tube>, the whole rest of the line */
    ARGS_PUT,      /* <pri> <delay> <ttr> <bytes> */
    ARGS_RELEASE,  /* <id> <pri> <delay> */
    ARGS_BURY,     /* <id> <pri> */
    ARGS_KICK,     /* <bound> */
    ARGS_TIMEOUT,  /* <seconds> */
    ARGS_PAUSE,    /* <tube> <delay> */
};

/* What a command acts on, for the scope check (check_scope): the one place
 * that says which command needs which kind on which tube. */
enum scope_target {
    ON_NOTHING,    /* needs nothing (quit, ignore, list-tube-used, list-tubes-watched;
                    * list-tubes shows only the tubes the scope sees) */
    ON_USED,       /* the used tube */
    ON_NAMED,      /* the tube named in the command */
    ON_NAMED_USE,  /* use: produce or read on the named tube */
    ON_JOB,        /* the job's tube; a job the scope cannot see is NOT_FOUND */
    ON_JOB_DELETE, /* delete: consume if this session reserved the job, else manage */
    ON_WATCHED,    /* every watched tube (reserve skips none silently) */
    ON_SOME,       /* some tube (the server-wide stats) */
};

/* A parsed command: what the execute step needs. */
struct request {
    enum bg_cmd cmd;
    uint64_t id, bytes, count;
    uint32_t pri, delay, ttr;
    int64_t timeout;
    const char *name;
    int bad_after_count;  /* reference: BAD_FORMAT, but the command is counted
                           * (put with trailing bytes, pause-tube with a
                           * name it cannot use) */
    int denied;           /* put: the scope refused it (answered after the body) */
};

typedef void (*execute_fn)(struct bg_session *s, const struct request *r, bg_time now);

struct command {
    const char *match;  /* reference: matched as a prefix, in table order */
    uint8_t match_len;
    enum bg_cmd cmd;
    enum arg_shape shape;
    execute_fn execute;
    enum scope_target target;
    enum bg_scope_kind kind;  /* what the target needs (ON_NOTHING, ON_NAMED_USE,
                               * ON_JOB_DELETE: unused) */
};

static void exec_put(struct bg_session *s, const struct request *r, bg_time now);
static void exec_peek(struct bg_session *s, const struct request *r, bg_time now);
static void exec_peek_state(struct bg_session *s, const struct request *r, bg_time now);
static void exec_reserve(struct bg_session *s, const struct request *r, bg_time now);
static void exec_reserve_job(struct bg_session *s, const struct request *r, bg_time now);
static void exec_delete(struct bg_session *s, const struct request *r, bg_time now);
static void exec_release(struct bg_session *s, const struct request *r, bg_time now);
static void exec_bury(struct bg_session *s, const struct request *r, bg_time now);
static void exec_kick(struct bg_session *s, const struct request *r, bg_time now);
static void exec_kick_job(struct bg_session *s, const struct request *r, bg_time now);
static void exec_touch(struct bg_session *s, const struct request *r, bg_time now);
static void exec_stats(struct bg_session *s, const struct request *r, bg_time now);
static void exec_stats_job(struct bg_session *s, const struct request *r, bg_time now);
static void exec_stats_tube(struct bg_session *s, const struct request *r, bg_time now);
static void exec_use(struct bg_session *s, const struct request *r, bg_time now);
static void exec_watch(struct bg_session *s, const struct request *r, bg_time now);
static void exec_ignore(struct bg_session *s, const struct request *r, bg_time now);
static void exec_list_tubes(struct bg_session *s, const struct request *r, bg_time now);
static void exec_list_tube_used(struct bg_session *s, const struct request *r, bg_time now);
static void exec_quit(struct bg_session *s, const struct request *r, bg_time now);
static void exec_pause_tube(struct bg_session *s, const struct request *r, bg_time now);

/* reference: the order decides which prefix wins ("reserve-job " before
 * "reserve", "kick-job " before "kick ", "stats-tube " before "stats"). */
static const struct command commands[] = {
    {"put ", 4, BG_CMD_PUT, ARGS_PUT, exec_put, ON_USED, BG_SCOPE_PRODUCE},
    {"peek ", 5, BG_CMD_PEEK, ARGS_ID, exec_peek, ON_JOB, BG_SCOPE_READ},
    {"peek-ready", 10, BG_CMD_PEEK_READY, ARGS_NONE, exec_peek_state, ON_USED, BG_SCOPE_READ},
    {"peek-delayed", 12, BG_CMD_PEEK_DELAYED, ARGS_NONE, exec_peek_state, ON_USED, BG_SCOPE_READ},
    {"peek-buried", 11, BG_CMD_PEEK_BURIED, ARGS_NONE, exec_peek_state, ON_USED, BG_SCOPE_READ},
    {"reserve-with-timeout ", 21, BG_CMD_RESERVE_WITH_TIMEOUT, ARGS_TIMEOUT, exec_reserve,
     ON_WATCHED, BG_SCOPE_CONSUME},
    {"reserve-job ", 12, BG_CMD_RESERVE_JOB, ARGS_ID, exec_reserve_job, ON_JOB, BG_SCOPE_CONSUME},
    {"reserve", 7, BG_CMD_RESERVE, ARGS_NONE, exec_reserve, ON_WATCHED, BG_SCOPE_CONSUME},
    {"delete ", 7, BG_CMD_DELETE, ARGS_ID, exec_delete, ON_JOB_DELETE, BG_SCOPE_MANAGE},
    {"release ", 8, BG_CMD_RELEASE, ARGS_RELEASE, exec_release, ON_JOB, BG_SCOPE_CONSUME},
    {"bury ", 5, BG_CMD_BURY, ARGS_BURY, exec_bury, ON_JOB, BG_SCOPE_CONSUME},
    {"kick-job ", 9, BG_CMD_KICK_JOB, ARGS_ID, exec_kick_job, ON_JOB, BG_SCOPE_MANAGE},
    {"kick ", 5, BG_CMD_KICK, ARGS_KICK, exec_kick, ON_USED, BG_SCOPE_MANAGE},
    {"touch ", 6, BG_CMD_TOUCH, ARGS_ID, exec_touch, ON_JOB, BG_SCOPE_CONSUME},
    {"stats-job ", 10, BG_CMD_STATS_JOB, ARGS_ID, exec_stats_job, ON_JOB, BG_SCOPE_READ},
    {"stats-tube ", 11, BG_CMD_STATS_TUBE, ARGS_NAME, exec_stats_tube, ON_NAMED, BG_SCOPE_READ},
    {"stats", 5, BG_CMD_STATS, ARGS_NONE, exec_stats, ON_SOME, BG_SCOPE_READ},
    {"use ", 4, BG_CMD_USE, ARGS_NAME, exec_use, ON_NAMED_USE, BG_SCOPE_PRODUCE},
    {"watch ", 6, BG_CMD_WATCH, ARGS_NAME, exec_watch, ON_NAMED, BG_SCOPE_CONSUME},
    {"ignore ", 7, BG_CMD_IGNORE, ARGS_NAME, exec_ignore, ON_NOTHING, BG_SCOPE_READ},
    {"list-tubes-watched", 18, BG_CMD_LIST_TUBES_WATCHED, ARGS_NONE, exec_list_tubes, ON_NOTHING, BG_SCOPE_READ},
    {"list-tube-used", 14, BG_CMD_LIST_TUBE_USED, ARGS_NONE, exec_list_tube_used, ON_NOTHING, BG_SCOPE_READ},
    {"list-tubes", 10, BG_CMD_LIST_TUBES, ARGS_NONE, exec_list_tubes, ON_NOTHING, BG_SCOPE_READ},
    {"quit", 4, BG_CMD_QUIT, ARGS_NONE, exec_quit, ON_NOTHING, BG_SCOPE_READ},
    {"pause-tube", 10, BG_CMD_PAUSE_TUBE, ARGS_PAUSE, exec_pause_tube, ON_NAMED, BG_SCOPE_MANAGE},
};

/* The table entry whose prefix the line starts with, or NULL. */
static const struct command *command_lookup(const char *line)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const struct command *c = &commands[i];
        if (line[0] == c->match[0] && strncmp(line, c->match, c->match_len) == 0) return c;
    }
    return NULL;
}

/* Parse the arguments of `line` (NUL-terminated, len bytes) for command c.
 * 0 or BG_BAD_FORMAT. */
static int parse_args(const struct command *c, const char *line, size_t len, struct request *r)
{
    const char *p = line + c->match_len;
    const char *end;
    uint64_t v;
    memset(r, 0, sizeof *r);
    r->cmd = c->cmd;
    switch (c->shape) {
    case ARGS_NONE:
        /* reference: quit ignores what follows; the others reject it */
        return c->cmd == BG_CMD_QUIT || len == c->match_len ? 0 : BG_BAD_FORMAT;
    case ARGS_ID:
        return read_uint(p, NULL, UINT64_MAX, &r->id);
    case ARGS_NAME:
        return read_whole_name(p, &r->name);
    case ARGS_PUT:
        if (read_uint(p, &p, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->pri = (uint32_t)v;
        if (read_uint(p, &p, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->delay = (uint32_t)v;
        if (read_uint(p, &p, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->ttr = (uint32_t)v;
        if (read_uint(p, &end, UINT32_MAX, &r->bytes) != 0) return BG_BAD_FORMAT;
        r->bad_after_count = *end != '\0';
        return 0;
    case ARGS_RELEASE:
        if (read_uint(p, &p, UINT64_MAX, &r->id) != 0) return BG_BAD_FORMAT;
        if (read_uint(p, &p, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->pri = (uint32_t)v;
        if (read_uint(p, NULL, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->delay = (uint32_t)v;
        return 0;
    case ARGS_BURY:
        if (read_uint(p, &p, UINT64_MAX, &r->id) != 0) return BG_BAD_FORMAT;
        if (read_uint(p, NULL, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->pri = (uint32_t)v;
        return 0;
    case ARGS_KICK:
        if (read_c_number(p, &end, 0, &v) != 0 || end == p) return BG_BAD_FORMAT;
        r->count = (uint32_t)v; /* reference: the bound is an unsigned int */
        return 0;
    case ARGS_TIMEOUT:
        if (read_c_number(p, &end, 1, &v) != 0) return BG_BAD_FORMAT;
        r->timeout = (int32_t)(uint32_t)v; /* reference: stored in an int */
        return 0;
    case ARGS_PAUSE: {
        /* reference: spaces, then the longest run of name characters */
        while (*p == ' ') p++;
        const char *q = p;
        while (*q && bg_tube_name_char(*q)) q++;
        if (read_uint(q, NULL, UINT32_MAX, &v) != 0) return BG_BAD_FORMAT;
        r->delay = (uint32_t)v;
        r->bad_after_count = !bg_tube_name_valid(p, (size_t)(q - p));
        ((char *)q)[0] = '\0'; /* the line is our own copy */
        r->name = p;
        return 0;
    }
    }
    return BG_BAD_FORMAT;
}

/* A line of HTTP came (bg_line_is_http): a browser's request (a page's form
 * or fetch aimed at this port), whose body would run as commands. Close
 * the session, running nothing more; count and report it. Not the
 * reference's: it answers UNKNOWN_COMMAND and goes on (docs/protocol.md). */
static void close_cross_protocol(struct bg_session *s)
{
    s->stream.closing = 1;
    s->client.engine->stat.cross_protocol_closed++;
    if (s->io && s->io->cross_protocol) s->io->cross_protocol(s);
}

/* ---- scopes ------------------------------------------------------------ */

/* Whether the session's scope allows command c with arguments r (after
 * bg_engine_catch_up: a job's reserver is current): 0, or BG_NOT_FOUND (a
 * job whose tube the scope cannot see), or BG_PERMISSION_DENIED with what
 * it needs ("consume:emails") in required. Unscoped sessions: always 0. */
static int check_scope(const struct bg_session *s, const struct command *c, const struct request *r,
                       char required[BG_SCOPE_REQUIRED_MAX])
{
    const struct bg_scope *scope = s->scope;
    if (!scope || r->bad_after_count) return 0; /* BAD_FORMAT comes first, and changes nothing */
    enum bg_scope_kind kind = c->kind;
    const char *tube = NULL;
    switch (c->target) {
    case ON_NOTHING:
        return 0;
    case ON_USED:
        tube = s->client.use->name;
        break;
    case ON_NAMED:
        tube = r->name;
        break;
    case ON_NAMED_USE:
        if (bg_scope_allows(scope, BG_SCOPE_READ, r->name, strlen(r->name))) return 0;
        tube = r->name;
        break;
    case ON_JOB:
    case ON_JOB_DELETE: {
        const struct bg_job *j = bg_job_find(s->client.engine, r->id);
        if (!j) return 0; /* the command answers NOT_FOUND itself */
        tube = j->tube->name;
        if (!bg_scope_sees(scope, tube, strlen(tube))) return BG_NOT_FOUND;
        if (c->target == ON_JOB_DELETE)
            kind = bg_job_reserver(j) == &s->client ? BG_SCOPE_CONSUME : BG_SCOPE_MANAGE;
        break;
    }
    case ON_WATCHED:
        for (uint32_t i = 0; i < s->client.watch_len; i++) {
            const char *w = s->client.watch_tube[i]->name;
            if (!bg_scope_allows(scope, kind, w, strlen(w))) {
                bg_scope_required(kind, w, strlen(w), required);
                return BG_PERMISSION_DENIED;
            }
        }
        return 0;
    case ON_SOME:
        if (bg_scope_allows_some(scope, kind)) return 0;
        bg_scope_required(kind, "*", 1, required);
        return BG_PERMISSION_DENIED;
    }
    if (bg_scope_allows(scope, kind, tube, strlen(tube))) return 0;
    bg_scope_required(kind, tube, strlen(tube), required);
    return BG_PERMISSION_DENIED;
}

/* Answer a refusal of check_scope and count it. */
static void reply_refusal(struct bg_session *s, int outcome, const char *required)
{
    s->client.engine->stat.permission_denied++;
    if (outcome != BG_PERMISSION_DENIED) {
        reply_word(s, outcome);
        return;
    }
    if (bg_buf_printf(&s->stream.out, "PERMISSION_DENIED %s\r\n", required) != 0) s->stream.closing = 1;
}

/* Parse and execute one command line of len bytes (CRLF excluded). */
static void run_line(struct bg_session *s, const char *bytes, size_t len, bg_time now)
{
    char line[BG_LINE_MAX];
    memcpy(line, bytes, len);
    line[len] = '\0';
    if (memchr(line, '\0', len)) { /* reference: NUL in a line */
        reply_word(s, BG_BAD_FORMAT);
        return;
    }
    const struct command *c = command_lookup(line);
    if (!c && bg_line_is_http(line, len)) {
        close_cross_protocol(s);
        return;
    }
    if (!c) {
        reply_word(s, BG_UNKNOWN_COMMAND);
        return;
    }
    struct request r;
    if (parse_args(c, line, len, &r) != 0) {
        reply_word(s, BG_BAD_FORMAT);
        return;
    }
    struct bg_engine *e = s->client.engine;
    bg_count_cmd(e, c->cmd, 1); /* reference: counted once parsed */
    /* the command sees every deadline up to `now` as passed, whether or
     * not the loop's timer ran first (peek and stats read state directly) */
    bg_engine_catch_up(e, now);
    char required[BG_SCOPE_REQUIRED_MAX];
    int refused = check_scope(s, c, &r, required);
    if (refused && c->shape == ARGS_PUT) {
        r.denied = 1; /* exec_put answers after the body, as JOB_TOO_BIG is */
    } else if (refused) {
        reply_refusal(s, refused, required);
        return;
    }
    c->execute(s, &r, now);
}

/* ---- execute ----------------------------------------------------------- */

/* Discard n bytes of input, then answer `outcome`. */
static void skip_then_reply(struct bg_session *s, uint64_t n, int outcome)
{
    s->state = BG_SKIP_BYTES;
    s->skip_left = n;
    s->skip_reply = outcome;
}

static void exec_put(struct bg_session *s, const struct request *r, bg_time now)
{
    struct bg_engine *e = s->client.engine;
    if (r->bytes > e->max_job_size) {
        skip_then_reply(s, r->bytes + 2, BG_JOB_TOO_BIG); /* reference: wraps */
        return;
    }
    if (r->bad_after_count) {
        reply_word(s, BG_BAD_FORMAT);
        return;
    }
    if (r->denied) {
        skip_then_reply(s, r->bytes + 2, BG_PERMISSION_DENIED);
        return;
    }
    bg_client_mark_producer(&s->client);
    s->in_job = bg_job_new(e, r->pri, r->delay, r->ttr, (uint32_t)r->bytes + 2, now);
    if (!s->in_job) {
        skip_then_reply(s, r->bytes + 2, BG_OUT_OF_MEMORY);
        return;
    }
    s->in_job_read = 0;
    s->state = BG_WANT_BODY;
}

/* The body of in_job is complete: check the trailer and enter the job. */
static void finish_put(struct bg_session *s, bg_time now)
{
    struct bg_job *j = s->in_job;
    s->in_job = NULL;
    s->state = BG_WANT_COMMAND;
    if (memcmp(j->body + j->body_size - 2, "\r\n", 2) != 0) {
        bg_job_discard(s->client.engine, j);
        reply_word(s, BG_EXPECTED_CRLF);
        return;
    }
    uint64_t id = j->id;
    int r = bg_put(&s->client, s->client.use, j, now);
    if (r == 0) {
        reply_numbers(s, "INSERTED", 8, id, 0, 0, NULL, 0);
        return;
    }
    /* reference: a put its binlog cannot take (walresvput fails in prot.c's
     * enqueue_incoming_job) is answered OUT_OF_MEMORY */
    reply_word(s, r == BG_LOG_UNAVAILABLE ? BG_OUT_OF_MEMORY : r);
}

static void exec_peek(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    struct bg_job *j = bg_job_find(s->client.engine, r->id);
    if (!j) reply_word(s, BG_NOT_FOUND);
    else reply_job(s, "FOUND", j);
}

static void exec_peek_state(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    struct bg_tube *t = s->client.use;
    struct bg_job *j = bg_peek(t, r->cmd == BG_CMD_PEEK_READY ? BG_JOB_READY
                                : r->cmd == BG_CMD_PEEK_DELAYED ? BG_JOB_DELAYED : BG_JOB_BURIED);
    if (!j) reply_word(s, BG_NOT_FOUND);
    else reply_job(s, "FOUND", j);
}

static void exec_reserve(struct bg_session *s, const struct request *r, bg_time now)
{
    struct bg_job *j = NULL;
    int64_t timeout = r->cmd == BG_CMD_RESERVE ? -1 : r->timeout;
    int outcome = bg_reserve(&s->client, timeout, now, &j);
    if (outcome == 0) reply_job(s, "RESERVED", j);
    else if (outcome == BG_WOULD_BLOCK) s->stream.blocked = 1;
    else reply_word(s, outcome);
}

static void exec_reserve_job(struct bg_session *s, const struct request *r, bg_time now)
{
    struct bg_job *j = NULL;
    int outcome = bg_reserve_job(&s->client, r->id, now, &j);
    if (outcome == 0) reply_job(s, "RESERVED", j);
    else reply_word(s, outcome);
}

static void exec_delete(struct bg_session *s, const struct request *r, bg_time now)
{
    int outcome = bg_delete(&s->client, r->id, now);
    if (outcome == 0) reply_text(s, "DELETED\r\n");
    else reply_word(s, outcome);
}

static void exec_release(struct bg_session *s, const struct request *r, bg_time now)
{
    int outcome = bg_release(&s->client, r->id, r->pri, r->delay, now);
    if (outcome == 0) reply_text(s, "RELEASED\r\n");
    else reply_word(s, outcome);
}

static void exec_bury(struct bg_session *s, const struct request *r, bg_time now)
{
    int outcome = bg_bury(&s->client, r->id, r->pri, now);
    reply_word(s, outcome == 0 ? BG_BURIED : outcome);
}

static void exec_kick(struct bg_session *s, const struct request *r, bg_time now)
{
    uint64_t n = bg_kick(s->client.engine, s->client.use, r->count, now);
    if (bg_buf_printf(&s->stream.out, "KICKED %llu\r\n", (unsigned long long)n) != 0)
        s->stream.closing = 1;
}

static void exec_kick_job(struct bg_session *s, const struct request *r, bg_time now)
{
    int outcome = bg_kick_job(s->client.engine, r->id, now);
    if (outcome == 0) reply_text(s, "KICKED\r\n");
    else reply_word(s, outcome);
}

static void exec_touch(struct bg_session *s, const struct request *r, bg_time now)
{
    int outcome = bg_touch(&s->client, r->id, now);
    if (outcome == 0) reply_text(s, "TOUCHED\r\n");
    else reply_word(s, outcome);
}

static void exec_stats(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)r;
    (void)now;
    struct bg_process_info pi;
    memset(&pi, 0, sizeof pi);
    if (s->io && s->io->process_info) s->io->process_info(s, &pi);
    if (bg_render_stats(&s->stream.out, s->client.engine, &pi) != 0) s->stream.closing = 1;
}

static void exec_stats_job(struct bg_session *s, const struct request *r, bg_time now)
{
    struct bg_job *j = bg_job_find(s->client.engine, r->id);
    if (!j) {
        reply_word(s, BG_NOT_FOUND);
        return;
    }
    struct bg_stats_job sj;
    bg_engine_show_job(s->client.engine, j);
    bg_stats_job(s->client.engine, j, now, &sj);
    if (bg_render_stats_job(&s->stream.out, &sj) != 0) s->stream.closing = 1;
}

static void exec_stats_tube(struct bg_session *s, const struct request *r, bg_time now)
{
    struct bg_tube *t = bg_tube_find(s->client.engine, r->name);
    if (!t) {
        reply_word(s, BG_NOT_FOUND);
        return;
    }
    struct bg_stats_tube st;
    bg_stats_tube(t, now, &st);
    if (bg_render_stats_tube(&s->stream.out, &st) != 0) s->stream.closing = 1;
}

static void exec_use(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    int outcome = bg_client_use(&s->client, r->name);
    if (outcome != 0) reply_word(s, outcome);
    else if (bg_buf_printf(&s->stream.out, "USING %s\r\n", s->client.use->name) != 0)
        s->stream.closing = 1;
}

/* "WATCHING n" or the outcome's word. */
static void reply_watching(struct bg_session *s, int outcome, uint32_t count)
{
    if (outcome != 0) reply_word(s, outcome);
    else if (bg_buf_printf(&s->stream.out, "WATCHING %u\r\n", count) != 0)
        s->stream.closing = 1;
}

static void exec_watch(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    uint32_t count = 0;
    int outcome = bg_client_watch(&s->client, r->name, &count);
    reply_watching(s, outcome, count);
}

static void exec_ignore(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    uint32_t count = 0;
    int outcome = bg_client_ignore(&s->client, r->name, &count);
    reply_watching(s, outcome, count);
}

/* Whether list-tubes shows tube t: every tube, or those the scope sees. */
static int listed(const struct bg_session *s, int watched, const struct bg_tube *t)
{
    return watched || !s->scope || bg_scope_sees(s->scope, t->name, strlen(t->name));
}

/* "OK n" + a YAML list of tube names, either all tubes (that the scope
 * sees) or the watched ones. */
static void exec_list_tubes(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)now;
    struct bg_engine *e = s->client.engine;
    int watched = r->cmd == BG_CMD_LIST_TUBES_WATCHED;
    uint32_t n = watched ? s->client.watch_len : e->tube_count;
    size_t bytes = 4; /* "---\n" */
    for (uint32_t i = 0; i < n; i++) {
        const struct bg_tube *t = watched ? s->client.watch[i]->tube : e->tube_list[i];
        if (listed(s, watched, t)) bytes += strlen(t->name) + 3;
    }
    char head[32];
    int head_len = snprintf(head, sizeof head, "OK %zu\r\n", bytes);
    if (!bg_stream_may_reply(&s->stream, (uint64_t)head_len + bytes + 2)) {
        reply_word(s, BG_OUT_OF_MEMORY);
        return;
    }
    int rc = bg_buf_append(&s->stream.out, head, (size_t)head_len);
    if (rc == 0) rc = bg_buf_append(&s->stream.out, "---\n", 4);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const struct bg_tube *t = watched ? s->client.watch[i]->tube : e->tube_list[i];
        if (listed(s, watched, t)) rc = bg_buf_printf(&s->stream.out, "- %s\n", t->name);
    }
    if (rc == 0) rc = bg_buf_append(&s->stream.out, "\r\n", 2);
    if (rc != 0) s->stream.closing = 1;
}

static void exec_list_tube_used(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)r;
    (void)now;
    if (bg_buf_printf(&s->stream.out, "USING %s\r\n", s->client.use->name) != 0)
        s->stream.closing = 1;
}

static void exec_quit(struct bg_session *s, const struct request *r, bg_time now)
{
    (void)r;
    (void)now;
    s->stream.closing = 1;
}

static void exec_pause_tube(struct bg_session *s, const struct request *r, bg_time now)
{
    if (r->bad_after_count) {
        reply_word(s, BG_BAD_FORMAT);
        return;
    }
    int outcome = bg_pause_tube(s->client.engine, r->name, r->delay, now);
    if (outcome == 0) reply_text(s, "PAUSED\r\n");
    else reply_word(s, outcome);
}

/* ---- the session: framing state machine -------------------------------- */

static void session_job_reserved(struct bg_client *c, struct bg_job *j)
{
    struct bg_session *s = container_of(c, struct bg_session, client);
    s->stream.blocked = 0;
    reply_job(s, "RESERVED", j);
    bg_stream_wake(&s->stream);
}

static void session_wait_ended(struct bg_client *c, int outcome)
{
    struct bg_session *s = container_of(c, struct bg_session, client);
    s->stream.blocked = 0;
    reply_word(s, outcome);
    bg_stream_wake(&s->stream);
}

static const struct bg_client_ops session_client_ops = {
    .job_reserved = session_job_reserved,
    .wait_ended = session_wait_ended,
};

int bg_session_init(struct bg_engine *e, struct bg_session *s,
                    const struct bg_session_io *io, void *io_owner)
{
    memset(s, 0, sizeof *s);
    s->io = io;
    s->io_owner = io_owner;
    s->state = BG_WANT_COMMAND;
    return bg_client_init(e, &s->client, &session_client_ops, s);
}

void bg_session_close(struct bg_session *s, bg_time now)
{
    if (s->in_job) bg_job_discard(s->client.engine, s->in_job);
    s->in_job = NULL;
    bg_client_close(&s->client, now);
    bg_buf_free(&s->stream.out);
}

void bg_session_peer_eof(struct bg_session *s, bg_time now)
{
    if (!s->stream.blocked) return;
    /* a wait whose end has passed ends as the timer would have ended it
     * (DEADLINE_SOON, or a job that fell due): through session_wait_ended */
    bg_engine_catch_up(s->client.engine, now);
    if (!s->stream.blocked) return;
    bg_client_stop_waiting(&s->client);
    s->stream.blocked = 0;
    reply_word(s, BG_TIMED_OUT);
}

/* Offset just past the line end in in[0..len), or 0 if there is none yet.
 * reference: only the first CR counts; a CR not followed by LF hides any
 * later CRLF in the window until the window is full. */
static size_t find_line_end(const char *in, size_t len)
{
    if (len < 2) return 0;
    const char *cr = memchr(in, '\r', len - 1);
    return cr && cr[1] == '\n' ? (size_t)(cr - in) + 2 : 0;
}

static size_t feed_requests(struct bg_session *s, const char *in, size_t len, bg_time now)
{
    size_t used = 0;
    for (;;) {
        if (s->stream.blocked || s->stream.closing) return used;
        if (s->stream.out_limit && s->stream.out.len >= s->stream.out_limit) return used;
        const char *p = in + used;
        size_t avail = len - used;
        /* reference: a line is looked for in a window of BG_LINE_MAX bytes */
        size_t window = avail < BG_LINE_MAX ? avail : BG_LINE_MAX;
        switch (s->state) {
        case BG_WANT_COMMAND: {
            size_t n = find_line_end(p, window);
            if (n) {
                used += n;
                run_line(s, p, n - 2, now);
                continue;
            }
            if (avail < BG_LINE_MAX) return used;
            /* too long: drop this window; a Host line made long by a long
             * name closes as a short one does */
            if (bg_line_is_http(p, BG_LINE_MAX)) {
                close_cross_protocol(s);
                return used;
            }
            used += BG_LINE_MAX;
            s->state = BG_WANT_ENDLINE;
            continue;
        }
        case BG_WANT_ENDLINE: {
            size_t n = find_line_end(p, window);
            if (n) {
                used += n;
                s->state = BG_WANT_COMMAND;
                reply_word(s, BG_BAD_FORMAT);
                continue;
            }
            if (avail < BG_LINE_MAX) return used;
            used += BG_LINE_MAX;
            continue;
        }
        case BG_WANT_BODY: {
            struct bg_job *j = s->in_job;
            size_t need = j->body_size - s->in_job_read;
            size_t n = avail < need ? avail : need;
            memcpy(j->body + s->in_job_read, p, n);
            s->in_job_read += (uint32_t)n;
            used += n;
            if (s->in_job_read < j->body_size) return used;
            finish_put(s, now);
            continue;
        }
        case BG_SKIP_BYTES: {
            uint64_t n = avail < s->skip_left ? avail : s->skip_left;
            s->skip_left -= n;
            used += n;
            if (s->skip_left) return used;
            s->state = BG_WANT_COMMAND;
            if (s->skip_reply == BG_PERMISSION_DENIED) { /* a put the scope refused */
                char required[BG_SCOPE_REQUIRED_MAX];
                const char *use = s->client.use->name;
                bg_scope_required(BG_SCOPE_PRODUCE, use, strlen(use), required);
                reply_refusal(s, BG_PERMISSION_DENIED, required);
            } else {
                reply_word(s, s->skip_reply);
            }
            continue;
        }
        default:
            return used;
        }
    }
}

size_t bg_session_feed(struct bg_session *s, const char *in, size_t len, bg_time now)
{
    size_t used = feed_requests(s, in, len, now);
    /* for the request deadline: a body arrives as it comes, an over-long
     * line is being thrown away */
    s->stream.phase = s->state == BG_WANT_BODY || s->state == BG_SKIP_BYTES ? BG_PHASE_BODY
                    : s->state == BG_WANT_ENDLINE ? BG_PHASE_HEADER : BG_PHASE_NONE;
    return used;
}

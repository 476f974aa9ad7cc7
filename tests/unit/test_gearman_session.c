/* test_gearman_session.c - the Gearman session on the engine
 * (core/gearman_session.c), with injected time and no sockets: sessions are
 * fed request bytes and their streams' output is read back as packets or
 * admin text. Malformed requests and admin lines are tables, one row a
 * case; the protocol's flows (submit, grab, results, unique ids, sleep,
 * maxqueue, cancel, disconnects, the sweep, the hooks) are tests of their
 * own. After every step the engine's counts must add up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gearman.h"

#define T0 ((bg_time)1000 * BG_SECOND)
#define SESSIONS 4
#define MAX_PACKET (BG_JOB_SIZE_DEFAULT + 4096)

struct world {
    struct bg_engine e;
    struct gm_server g;
    struct gm_session s[SESSIONS];
    int open[SESSIONS];
    int woken[SESSIONS];           /* output_ready calls */
    uint64_t wall_s;               /* the injected wall clock */
    int stops_now, stops_graceful, bad_requests;
    const char *last_bad_code;
    bg_time now;
    /* the engine's journal hook, as a log would see it */
    int saved, saved_ttr;
};

static struct world *W; /* the hooks' world */

static const char *hook_verbosity(void *ctx) { (void)ctx; return "INFO"; }
static uint64_t hook_wall_s(void *ctx) { return ((struct world *)ctx)->wall_s; }
static void hook_stop(void *ctx, enum gm_stop how)
{
    struct world *w = ctx;
    if (how == GM_STOP_NOW) w->stops_now++; else w->stops_graceful++;
}
static void hook_bad_request(void *ctx, const struct gm_session *s, const char *code)
{
    (void)s;
    struct world *w = ctx;
    w->bad_requests++;
    w->last_bad_code = code;
}

static void journal_saved(void *ctx, const struct bg_job *j, int with_body)
{
    struct world *w = ctx;
    if (!with_body) {
        w->saved++;
        w->saved_ttr = (int)j->ttr_s;
    }
}
static void journal_deleted(void *ctx, uint64_t id) { (void)ctx, (void)id; }
static void journal_paused(void *ctx, const struct bg_tube *t) { (void)ctx, (void)t; }
static const struct bg_journal_ops journal = {journal_saved, journal_deleted, journal_paused, NULL};

static void output_ready(struct bg_stream *st)
{
    for (int i = 0; i < SESSIONS; i++)
        if (st == &W->s[i].stream) W->woken[i]++;
}

/* The counts the engine keeps must match its structures. */
static void check_counts(const struct world *w)
{
    const struct bg_engine *e = &w->e;
    const char *broken;
    if (bg_engine_audit(e, &broken) != 0) fail_msg("engine audit: %s", broken);
    uint64_t sleeping = 0, reserved = 0;
    for (int i = 0; i < SESSIONS; i++)
        if (w->open[i]) {
            sleeping += w->s[i].sleeping;
            reserved += w->s[i].client.reserved.len;
        }
    assert_int_equal(e->waiting, sleeping);
    assert_true(reserved <= e->reserved_count);
}

static void open_session(struct world *w, int i)
{
    char addr[24];
    snprintf(addr, sizeof addr, "127.0.0.%d", i + 1);
    assert_int_equal(gm_session_init(&w->g, &w->s[i], 10 + i, addr), 0);
    w->s[i].stream.output_ready = output_ready;
    w->s[i].stream.out_limit = 4u << 20;
    w->s[i].stream.out_max = 64u << 20;
    w->open[i] = 1;
}

static void close_session(struct world *w, int i)
{
    gm_session_close(&w->s[i], w->now);
    w->open[i] = 0;
    check_counts(w);
}

static int setup(void **state)
{
    struct world *w = calloc(1, sizeof *w);
    W = w;
    w->now = T0;
    w->wall_s = 1700000000;
    static const uint64_t key[2] = {1, 2};
    if (bg_engine_init(&w->e, BG_JOB_SIZE_DEFAULT, NULL) != 0) return -1;
    w->e.journal = &journal;
    w->e.journal_ctx = w;
    struct gm_hooks hooks = {w, 4242, "host", hook_verbosity, hook_wall_s, hook_stop, hook_bad_request, NULL};
    if (gm_server_init(&w->g, &w->e, &hooks, MAX_PACKET, 1, key) != 0) return -1;
    for (int i = 0; i < SESSIONS; i++) open_session(w, i);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    struct world *w = *state;
    for (int i = 0; i < SESSIONS; i++)
        if (w->open[i]) close_session(w, i);
    gm_server_destroy(&w->g, w->now);
    bg_engine_destroy(&w->e);
    free(w);
    return 0;
}

/* ---- feeding and reading back ------------------------------------------- */

/* Feed raw bytes to session i; every byte must be consumed. */
static void feed_raw(struct world *w, int i, const char *bytes, size_t n)
{
    assert_int_equal(gm_session_feed(&w->s[i], bytes, n, w->now), n);
    check_counts(w);
}

/* Send a request of type t with n string arguments (the last may be given
 * with an explicit length through send_data). */
static void send_args(struct world *w, int i, uint32_t t, uint32_t n, const char *const *arg, const uint32_t *len)
{
    struct bg_buf b = {0};
    assert_int_equal(gm_encode_request(&b, t, n, arg, len), 0);
    feed_raw(w, i, bg_buf_head(&b), b.len);
    bg_buf_free(&b);
}

static void send_req(struct world *w, int i, uint32_t t, uint32_t n, ...)
{
    const char *arg[GM_ARGS_MAX];
    uint32_t len[GM_ARGS_MAX];
    va_list ap;
    va_start(ap, n);
    for (uint32_t k = 0; k < n; k++) {
        arg[k] = va_arg(ap, const char *);
        len[k] = (uint32_t)strlen(arg[k]);
    }
    va_end(ap);
    send_args(w, i, t, n, arg, len);
}

/* One response packet taken from the front of session i's output. */
struct reply {
    uint32_t type, nargs;
    char arg[GM_ARGS_MAX][256];
    uint32_t arg_len[GM_ARGS_MAX];
};

/* Take the next response packet of session i, expecting type t with n
 * arguments. */
static struct reply take(struct world *w, int i, uint32_t t, uint32_t n)
{
    struct bg_buf *out = &w->s[i].stream.out;
    struct reply r;
    memset(&r, 0, sizeof r);
    if (out->len < GM_HEADER_SIZE) fail_msg("session %d: no packet (want type %u)", i, t);
    const unsigned char *h = (const unsigned char *)bg_buf_head(out);
    assert_memory_equal(h, "\0RES", 4);
    r.type = (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 | (uint32_t)h[6] << 8 | h[7];
    uint32_t size = (uint32_t)h[8] << 24 | (uint32_t)h[9] << 16 | (uint32_t)h[10] << 8 | h[11];
    assert_true(out->len >= GM_HEADER_SIZE + size);
    if (r.type != t) fail_msg("session %d: packet type %u (%s), want %u (%s)", i, r.type,
                              gm_type_name(r.type), t, gm_type_name(t));
    const char *p = (const char *)h + GM_HEADER_SIZE, *end = p + size;
    for (uint32_t k = 0; k < n; k++) {
        const char *stop = k + 1 < n ? memchr(p, '\0', (size_t)(end - p)) : end;
        assert_non_null(stop);
        r.arg_len[k] = (uint32_t)(stop - p);
        assert_true(r.arg_len[k] < sizeof r.arg[k]);
        memcpy(r.arg[k], p, r.arg_len[k]);
        p = stop + (k + 1 < n);
    }
    r.nargs = n;
    bg_buf_consume(out, GM_HEADER_SIZE + size);
    return r;
}

/* Session i has no output left. */
static void nothing(struct world *w, int i)
{
    if (w->s[i].stream.out.len)
        fail_msg("session %d: %zu unexpected bytes of output", i, w->s[i].stream.out.len);
}

/* The whole admin text of session i, which must be `want`; consumed. */
static void admin_expect(struct world *w, int i, const char *line, const char *want)
{
    bg_buf_clear(&w->s[i].stream.out);
    feed_raw(w, i, line, strlen(line));
    struct bg_buf *out = &w->s[i].stream.out;
    if (out->len != strlen(want) || memcmp(bg_buf_head(out), want, out->len) != 0)
        fail_msg("admin %s got \"%.*s\", want \"%s\"", line, (int)out->len, bg_buf_head(out), want);
    bg_buf_clear(out);
}

/* SUBMIT_JOB-like request from client i; returns the handle. */
static struct reply submit(struct world *w, int i, uint32_t type, const char *fn, const char *unique,
                           const char *data)
{
    send_req(w, i, type, 3, fn, unique, data);
    return take(w, i, GM_JOB_CREATED, 1);
}

/* Session i, a worker, says CAN_DO fn and GRAB_JOB: the JOB_ASSIGN it must
 * get (arg 0 the handle, 1 the function, 2 the data). */
static struct reply grab_as_worker(struct world *w, int i, const char *fn)
{
    send_req(w, i, GM_CAN_DO, 1, fn);
    send_req(w, i, GM_GRAB_JOB, 0);
    return take(w, i, GM_JOB_ASSIGN, 3);
}

/* ---- the flows ----------------------------------------------------------- */

static void test_submit_grab_complete(void **state)
{
    struct world *w = *state;
    struct reply h = submit(w, 0, GM_SUBMIT_JOB, "reverse", "", "hello");
    assert_string_equal(h.arg[0], "H:host:1");
    assert_int_equal(w->e.ready_count, 1);
    struct reply a = grab_as_worker(w, 1, "reverse");
    assert_string_equal(a.arg[0], "H:host:1");
    assert_string_equal(a.arg[1], "reverse");
    assert_string_equal(a.arg[2], "hello");
    assert_int_equal(w->e.reserved_count, 1);
    send_req(w, 1, GM_WORK_DATA, 2, "H:host:1", "part");
    struct reply d = take(w, 0, GM_WORK_DATA, 2);
    assert_string_equal(d.arg[1], "part");
    send_req(w, 1, GM_WORK_COMPLETE, 2, "H:host:1", "olleh");
    struct reply c = take(w, 0, GM_WORK_COMPLETE, 2);
    assert_string_equal(c.arg[0], "H:host:1");
    assert_string_equal(c.arg[1], "olleh");
    assert_true(w->woken[0] >= 2);
    assert_int_equal(w->e.job_count, 0);
    nothing(w, 0);
    nothing(w, 1);
    /* the job is gone: a second result is refused */
    send_req(w, 1, GM_WORK_COMPLETE, 2, "H:host:1", "again");
    struct reply e = take(w, 1, GM_ERROR, 2);
    assert_string_equal(e.arg[0], "JOB_NOT_FOUND");
    assert_int_equal(w->e.stat.cmd[BG_CMD_PUT], 1);
    assert_int_equal(w->e.stat.cmd[BG_CMD_DELETE], 2);
}

static void test_background_priorities(void **state)
{
    struct world *w = *state;
    submit(w, 0, GM_SUBMIT_JOB_LOW_BG, "f", "", "low");
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "normal");
    submit(w, 0, GM_SUBMIT_JOB_HIGH_BG, "f", "", "high");
    send_req(w, 1, GM_CAN_DO, 1, "f");
    const char *want[] = {"high", "normal", "low"};
    for (int k = 0; k < 3; k++) {
        send_req(w, 1, GM_GRAB_JOB, 0);
        struct reply a = take(w, 1, GM_JOB_ASSIGN, 3);
        assert_string_equal(a.arg[2], want[k]);
        send_req(w, 1, GM_WORK_COMPLETE, 2, a.arg[0], "");
    }
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_NO_JOB, 0);
    nothing(w, 0); /* background: nobody listens */
}

static void test_work_fail_and_exception(void **state)
{
    struct world *w = *state;
    send_req(w, 2, GM_OPTION_REQ, 1, "exceptions");
    struct reply o = take(w, 2, GM_OPTION_RES, 1);
    assert_string_equal(o.arg[0], "exceptions");
    submit(w, 0, GM_SUBMIT_JOB, "f", "u1", "x");
    submit(w, 2, GM_SUBMIT_JOB, "f", "u1", "x"); /* same unique: listens too */
    struct reply a = grab_as_worker(w, 1, "f");
    send_req(w, 1, GM_WORK_EXCEPTION, 2, a.arg[0], "boom");
    struct reply f = take(w, 0, GM_WORK_FAIL, 2);   /* without the option: a fail */
    assert_int_equal(f.arg_len[1], 0);
    struct reply x = take(w, 2, GM_WORK_EXCEPTION, 2);
    assert_string_equal(x.arg[1], "boom");
    assert_int_equal(w->e.job_count, 0);
    submit(w, 0, GM_SUBMIT_JOB, "f", "", "y");
    send_req(w, 1, GM_GRAB_JOB, 0);
    a = take(w, 1, GM_JOB_ASSIGN, 3);
    send_req(w, 1, GM_WORK_FAIL, 1, a.arg[0]);
    take(w, 0, GM_WORK_FAIL, 1);
    assert_int_equal(w->e.job_count, 0);
}

static void test_unique_coalescing(void **state)
{
    struct world *w = *state;
    struct reply h1 = submit(w, 0, GM_SUBMIT_JOB, "f", "same", "a");
    struct reply h2 = submit(w, 2, GM_SUBMIT_JOB, "f", "same", "b");
    struct reply h3 = submit(w, 3, GM_SUBMIT_JOB_BG, "f", "same", "c");
    assert_string_equal(h1.arg[0], h2.arg[0]);
    assert_string_equal(h1.arg[0], h3.arg[0]);
    assert_int_equal(w->e.job_count, 1);
    send_req(w, 3, GM_GET_STATUS_UNIQUE, 1, "same");
    struct reply st = take(w, 3, GM_STATUS_RES_UNIQUE, 6);
    assert_string_equal(st.arg[1], "1");
    assert_string_equal(st.arg[5], "2"); /* two foreground clients wait */
    /* the same unique id in another function is another job */
    struct reply other = submit(w, 3, GM_SUBMIT_JOB_BG, "g", "same", "d");
    assert_string_not_equal(other.arg[0], h1.arg[0]);
    assert_int_equal(w->e.job_count, 2);
    send_req(w, 1, GM_CAN_DO, 1, "f");
    send_req(w, 1, GM_GRAB_JOB_UNIQ, 0);
    struct reply a = take(w, 1, GM_JOB_ASSIGN_UNIQ, 4);
    assert_string_equal(a.arg[2], "same");
    assert_string_equal(a.arg[3], "a");
    send_req(w, 1, GM_WORK_STATUS, 3, a.arg[0], "1", "2");
    take(w, 0, GM_WORK_STATUS, 3);
    take(w, 2, GM_WORK_STATUS, 3);
    send_req(w, 3, GM_GET_STATUS, 1, a.arg[0]);
    st = take(w, 3, GM_STATUS_RES, 5);
    assert_string_equal(st.arg[2], "1"); /* running */
    assert_string_equal(st.arg[3], "1");
    assert_string_equal(st.arg[4], "2");
    send_req(w, 1, GM_WORK_COMPLETE, 2, a.arg[0], "done");
    take(w, 0, GM_WORK_COMPLETE, 2);
    take(w, 2, GM_WORK_COMPLETE, 2);
    /* done: the unique id names a new job again */
    struct reply h4 = submit(w, 0, GM_SUBMIT_JOB_BG, "f", "same", "e");
    assert_string_not_equal(h4.arg[0], h1.arg[0]);
}

static void test_pre_sleep_noop(void **state)
{
    struct world *w = *state;
    send_req(w, 1, GM_CAN_DO, 1, "f");
    send_req(w, 1, GM_PRE_SLEEP, 0);
    nothing(w, 1);
    assert_int_equal(w->e.waiting, 1); /* a sleeping worker counts as waiting */
    int woken = w->woken[1];
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "x");
    take(w, 1, GM_NOOP, 0);
    assert_int_equal(w->woken[1], woken + 1);
    assert_int_equal(w->e.waiting, 0);
    assert_int_equal(w->e.ready_count, 1); /* the NOOP does not take the job */
    /* a job already there: NOOP at once */
    send_req(w, 1, GM_PRE_SLEEP, 0);
    take(w, 1, GM_NOOP, 0);
    /* a job in a function it cannot do does not wake it */
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_JOB_ASSIGN, 3);
    send_req(w, 1, GM_PRE_SLEEP, 0);
    submit(w, 0, GM_SUBMIT_JOB_BG, "other", "", "y");
    nothing(w, 1);
    assert_int_equal(w->e.waiting, 1);
    /* CAN_DO of a function with a job wakes it */
    send_req(w, 1, GM_CAN_DO, 1, "other");
    take(w, 1, GM_NOOP, 0);
    /* closing a sleeping worker stops its waiting */
    send_req(w, 2, GM_CAN_DO, 1, "zzz");
    send_req(w, 2, GM_PRE_SLEEP, 0);
    assert_int_equal(w->e.waiting, 1);
    close_session(w, 2);
    assert_int_equal(w->e.waiting, 0);
}

static void test_admin_status_and_workers(void **state)
{
    struct world *w = *state;
    send_req(w, 1, GM_SET_CLIENT_ID, 1, "w1");
    send_req(w, 1, GM_CAN_DO, 1, "f");
    send_req(w, 1, GM_CAN_DO, 1, "g h"); /* encoded as a tube, shown decoded */
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "1");
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "2");
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_JOB_ASSIGN, 3);
    admin_expect(w, 3, "status\n", "g h\t0\t0\t1\nf\t2\t1\t1\n.\n");
    admin_expect(w, 3, "workers\n",
                 "13 127.0.0.4 - :\n12 127.0.0.3 - :\n11 127.0.0.2 w1 : g h f\n10 127.0.0.1 - :\n.\n");
    admin_expect(w, 3, "show jobs\n", ".\n");
    admin_expect(w, 3, "getpid\n", "OK 4242\n");
    admin_expect(w, 3, "verbose\n", "OK INFO\n");
    admin_expect(w, 3, "version\n", "OK " BEANGATE_VERSION "\n");
}

/* A listing (status, workers) over BG_REPLY_SMALL that does not fit the
 * reply budget beside what is held is taken back for an error line: one
 * of exactly the room left goes, one byte more is refused (and counted);
 * small answers always go. */
static void test_admin_listing_budget(void **state)
{
    struct world *w = *state;
    char fn[200];
    for (int i = 0; i < 100; i++) { /* 100 functions of 190 bytes: listings of about 19 KB */
        snprintf(fn, sizeof fn, "f%03d%0186d", i, 0);
        send_req(w, 1, GM_CAN_DO, 1, fn);
    }
    struct bg_buf *out = &w->s[0].stream.out;
    bg_buf_clear(out);
    feed_raw(w, 0, "status\n", 7);
    size_t whole = out->len;
    assert_true(whole > BG_REPLY_SMALL);
    struct bg_reply_budget b = {.max = 1u << 20};
    w->s[0].stream.budget = &b;
    b.held = b.max - whole; /* exactly the room left */
    bg_buf_clear(out);
    feed_raw(w, 0, "status\n", 7);
    assert_int_equal(out->len, whole);
    assert_memory_equal(bg_buf_head(out) + whole - 2, ".\n", 2);
    b.held++; /* one byte short */
    const char *refusal = "ERR OUT_OF_MEMORY the+server+holds+as+many+unsent+replies+as+it+may\r\n";
    admin_expect(w, 0, "status\n", refusal);
    b.held = b.max; /* full: every listing over BG_REPLY_SMALL is refused */
    admin_expect(w, 0, "workers\n", refusal);
    assert_int_equal(b.refused, 2);
    admin_expect(w, 0, "getpid\n", "OK 4242\n");
    w->s[0].stream.budget = NULL;
}

/* One admin line and the whole answer (gearmand 1.1.20's, where it has one). */
static const struct admin_case {
    const char *line, *want;
} admin_cases[] = {
    {"show\n", "ERR UNKNOWN_COMMAND Unknown+server+commandshow\r\n"},
    {"show jobs x\n", "ERR UNKNOWN_SHOW_ARGUMENTS\r\n"},
    {"show things\n", "ERR UNKNOWN_SHOW_ARGUMENTS\r\n"},
    {"cancel\n", "ERR UNKNOWN_COMMAND Unknown+server+commandcancel\r\n"},
    {"cancel job\n", "ERR UNKNOWN_COMMAND Unknown+server+commandcancel\r\n"},
    {"cancel x y\n", "ERR UNKNOWN_ERROR\r\n"},
    {"cancel job H:host:99\n", "ERR UNKNOWN_JOB\r\n"},
    {"maxqueue\n", "ERR INVALID_ARGUMENTS An+incomplete+set+of+arguments+was+sent+to+this+command+maxqueue\r\n"},
    {"maxqueue f 3\n", "OK\r\n"},
    {"shutdown now\n", "ERR UNKNOWN_COMMAND Unknown+server+commandshutdown\r\n"},
    {"frobnicate\n", "ERR UNKNOWN_COMMAND Unknown+server+commandfrobnicate\r\n"},
    {"STATUS\r\n", "f\t0\t0\t0\n.\n"}, /* maxqueue made f known */
    {"show unique jobs\n", ".\n"},
};

static void test_admin_lines(void **state)
{
    struct world *w = *state;
    for (size_t i = 0; i < sizeof admin_cases / sizeof admin_cases[0]; i++)
        admin_expect(w, 0, admin_cases[i].line, admin_cases[i].want);
    assert_int_equal(w->stops_now + w->stops_graceful, 0);
}

/* Malformed requests: the ERROR code, and whether the session goes on. */
static const struct bad_case {
    const char *name;
    const char *bytes;
    size_t len;
    const char *code;
    int stays_open;
} bad_cases[] = {
    {"response magic", "\0RES\0\0\0\x10\0\0\0\0", 12, "INVALID_MAGIC", 0},
    {"response type", "\0REQ\0\0\0\x06\0\0\0\0", 12, "INVALID_COMMAND", 0},
    {"too big", "\0REQ\0\0\0\x10\x7f\xff\xff\xff", 12, "ARGUMENT_TOO_LARGE", 0},
    {"too few arguments", "\0REQ\0\0\0\x07\0\0\0\x02" "fn", 14, "INVALID_PACKET", 0},
    /* SUBMIT_JOB_BG "f", a unique id of 65 bytes, "d" */
    {"unique too long", "\0REQ\0\0\0\x12\0\0\0\x45" "f\0" "0123456789012345678901234567890123456789012345678901234567890123" "4\0" "d",
     12 + 0x45, "ARGUMENT_TOO_LARGE", 1},
};

static void test_malformed_requests(void **state)
{
    struct world *w = *state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        int k = (int)(i % SESSIONS);
        if (!w->open[k]) open_session(w, k);
        bg_buf_clear(&w->s[k].stream.out);
        size_t used = gm_session_feed(&w->s[k], c->bytes, c->len, w->now);
        struct reply e = take(w, k, GM_ERROR, 2);
        if (strcmp(e.arg[0], c->code) != 0) fail_msg("%s: code %s, want %s", c->name, e.arg[0], c->code);
        assert_string_equal(w->last_bad_code, c->code);
        assert_int_equal(w->s[k].stream.closing, !c->stays_open);
        if (c->stays_open) {
            assert_int_equal(used, c->len);
            send_req(w, k, GM_ECHO_REQ, 1, "still here");
            take(w, k, GM_ECHO_RES, 1);
        }
        close_session(w, k);
    }
    assert_int_equal(w->bad_requests, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    assert_int_equal(w->e.connections, 0); /* sessions do not count connections */
}

static void test_maxqueue(void **state)
{
    struct world *w = *state;
    admin_expect(w, 3, "maxqueue f 2\n", "OK\r\n");
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "1");
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "2");
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", "3");
    struct reply e = take(w, 0, GM_ERROR, 2);
    assert_string_equal(e.arg[0], "QUEUE_ERROR");
    assert_int_equal(w->e.job_count, 2);
    admin_expect(w, 3, "maxqueue f\n", "OK\r\n"); /* no limit */
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "3");
}

static void test_cancel_job(void **state)
{
    struct world *w = *state;
    struct reply h = submit(w, 0, GM_SUBMIT_JOB, "f", "", "x");
    char line[300];
    snprintf(line, sizeof line, "cancel job %s\n", h.arg[0]);
    admin_expect(w, 3, line, "OK\r\n");
    take(w, 0, GM_WORK_FAIL, 1);
    assert_int_equal(w->e.job_count, 0);
    assert_int_equal(w->e.stat.cmd[BG_CMD_DELETE], 1);
    /* a running job cannot be cancelled */
    h = submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "y");
    grab_as_worker(w, 1, "f");
    snprintf(line, sizeof line, "cancel job %s\n", h.arg[0]);
    admin_expect(w, 3, line, "ERR UNKNOWN_JOB\r\n");
}

static void test_worker_disconnect_requeues(void **state)
{
    struct world *w = *state;
    struct reply h = submit(w, 0, GM_SUBMIT_JOB, "f", "", "x");
    grab_as_worker(w, 1, "f");
    send_req(w, 1, GM_WORK_STATUS, 3, h.arg[0], "5", "10");
    take(w, 0, GM_WORK_STATUS, 3);
    close_session(w, 1);
    assert_int_equal(w->e.ready_count, 1);
    send_req(w, 0, GM_GET_STATUS, 1, h.arg[0]);
    struct reply st = take(w, 0, GM_STATUS_RES, 5);
    assert_string_equal(st.arg[1], "1");
    assert_string_equal(st.arg[2], "0");
    assert_string_equal(st.arg[3], "0"); /* progress starts again */
    grab_as_worker(w, 2, "f");
    send_req(w, 2, GM_WORK_COMPLETE, 2, h.arg[0], "ok");
    take(w, 0, GM_WORK_COMPLETE, 2);
}

static void test_client_disconnect(void **state)
{
    struct world *w = *state;
    submit(w, 0, GM_SUBMIT_JOB, "f", "", "queued");
    submit(w, 0, GM_SUBMIT_JOB, "f", "", "running");
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "background");
    struct reply a = grab_as_worker(w, 1, "f");
    assert_string_equal(a.arg[2], "queued");
    /* the client goes: its queued foreground job goes too, the running one
     * and the background one stay */
    close_session(w, 0);
    assert_int_equal(w->e.job_count, 2);
    send_req(w, 1, GM_WORK_COMPLETE, 2, a.arg[0], "nobody hears");
    send_req(w, 1, GM_GRAB_JOB, 0);
    a = take(w, 1, GM_JOB_ASSIGN, 3);
    assert_string_equal(a.arg[2], "background");
    assert_int_equal(w->e.job_count, 1);
}

static void test_sweep_fails_jobs_deleted_elsewhere(void **state)
{
    struct world *w = *state;
    struct reply h = submit(w, 0, GM_SUBMIT_JOB, "f", "", "x");
    struct bg_client other;
    assert_int_equal(bg_client_init(&w->e, &other, &bg_client_ops_never_wait, NULL), 0);
    uint64_t id = strtoull(h.arg[0] + 7, NULL, 10);
    assert_int_equal(bg_delete(&other, id, w->now), 0); /* over beanstalk, say */
    assert_int_equal(gm_server_sweep(&w->g, 1u << 20), 0);
    struct reply f = take(w, 0, GM_WORK_FAIL, 1);
    assert_string_equal(f.arg[0], h.arg[0]);
    assert_int_equal(w->g.by_id.count, 0);
    /* a sweep step looks at `budget` buckets only, and goes round */
    for (int k = 0; k < 100; k++) submit(w, 0, GM_SUBMIT_JOB, "f", "", "y");
    while (w->e.job_count) {
        struct bg_job *j = NULL;
        for (size_t b = 0; !j; b++) j = w->e.jobs[b];
        assert_int_equal(bg_delete(&other, j->id, w->now), 0);
    }
    size_t buckets = w->g.by_id.mask + 1, steps = 0;
    while (w->g.by_id.count) {
        gm_server_sweep(&w->g, 4);
        assert_true(++steps <= buckets / 4 + 1);
    }
    for (int k = 0; k < 100; k++) take(w, 0, GM_WORK_FAIL, 1);
    nothing(w, 0);
    bg_client_close(&other, w->now);
}

static void test_can_do_timeout_is_the_ttr(void **state)
{
    struct world *w = *state;
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "x");
    send_req(w, 1, GM_CAN_DO_TIMEOUT, 2, "f", "5");
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_JOB_ASSIGN, 3);
    struct bg_job *j = bg_job_find(&w->e, 1);
    assert_int_equal(j->ttr_s, 5);
    assert_int_equal(bg_job_deadline(j), w->now + 5 * BG_SECOND);
    assert_int_equal(w->saved_ttr, 5); /* the change reached the log */
    /* the TTR ends: the job is ready again, the worker's result refused */
    w->now += 5 * BG_SECOND;
    send_req(w, 1, GM_WORK_COMPLETE, 2, "H:host:1", "late");
    struct reply e = take(w, 1, GM_ERROR, 2);
    assert_string_equal(e.arg[0], "JOB_NOT_FOUND");
    assert_int_equal(w->e.ready_count, 1);
    assert_int_equal(bg_job_timeouts(j), 1);
}

static void test_submit_job_epoch_is_a_delay(void **state)
{
    struct world *w = *state;
    char when[32];
    snprintf(when, sizeof when, "%llu", (unsigned long long)(w->wall_s + 30));
    send_req(w, 0, GM_SUBMIT_JOB_EPOCH, 4, "f", "", when, "later");
    take(w, 0, GM_JOB_CREATED, 1);
    assert_int_equal(w->e.delayed_count, 1);
    assert_int_equal(bg_job_delay(bg_job_find(&w->e, 1)), 30);
    send_req(w, 0, GM_SUBMIT_JOB_EPOCH, 4, "f", "", "12", "past");
    take(w, 0, GM_JOB_CREATED, 1);
    assert_int_equal(w->e.ready_count, 1);
}

/* Numbers are strict (issue 13): gearmand's atoi makes "abc" delay 0 and
 * "maxqueue f -1" OK; beangate answers an error and changes nothing. */
static void test_numbers_are_strict(void **state)
{
    struct world *w = *state;
    static const char *const bad_epochs[] = {"abc", "", "-5", "+5", " 5", "5x", "18446744073709551616",
                                             "99999999999999999999999"};
    for (size_t k = 0; k < sizeof bad_epochs / sizeof bad_epochs[0]; k++) {
        send_req(w, 0, GM_SUBMIT_JOB_EPOCH, 4, "f", "", bad_epochs[k], "data");
        struct reply r = take(w, 0, GM_ERROR, 2);
        if (strcmp(r.arg[0], "INVALID_ARGUMENT") != 0) fail_msg("epoch \"%s\": %s", bad_epochs[k], r.arg[0]);
        assert_non_null(strstr(r.arg[1], "SUBMIT_JOB_EPOCH"));
        nothing(w, 0);
    }
    assert_int_equal(w->e.job_count, 0);
    /* the largest number is taken: a delay cut to the longest the engine keeps */
    send_req(w, 0, GM_SUBMIT_JOB_EPOCH, 4, "f", "", "18446744073709551615", "far");
    take(w, 0, GM_JOB_CREATED, 1);
    assert_int_equal(bg_job_delay(bg_job_find(&w->e, 1)), UINT32_MAX);
    static const char *const bad_timeouts[] = {"abc", "", "-1", "4294967296", "10s"};
    for (size_t k = 0; k < sizeof bad_timeouts / sizeof bad_timeouts[0]; k++) {
        send_req(w, 1, GM_CAN_DO_TIMEOUT, 2, "f", bad_timeouts[k]);
        struct reply r = take(w, 1, GM_ERROR, 2);
        if (strcmp(r.arg[0], "INVALID_ARGUMENT") != 0) fail_msg("timeout \"%s\": %s", bad_timeouts[k], r.arg[0]);
    }
    assert_int_equal(w->s[1].ability_count, 0);
    send_req(w, 1, GM_CAN_DO_TIMEOUT, 2, "f", "4294967295");
    nothing(w, 1);
    assert_int_equal(w->s[1].ability_count, 1);
    admin_expect(w, 2, "maxqueue f -1\n",
                 "ERR INVALID_ARGUMENTS maxqueue+takes+sizes+from+0+to+4294967295,+digits+only,+not+-1\r\n");
    admin_expect(w, 2, "maxqueue f abc\n",
                 "ERR INVALID_ARGUMENTS maxqueue+takes+sizes+from+0+to+4294967295,+digits+only,+not+abc\r\n");
    admin_expect(w, 2, "maxqueue f 1 2x\n",
                 "ERR INVALID_ARGUMENTS maxqueue+takes+sizes+from+0+to+4294967295,+digits+only,+not+2x\r\n");
    admin_expect(w, 2, "maxqueue f 4294967296\n",
                 "ERR INVALID_ARGUMENTS maxqueue+takes+sizes+from+0+to+4294967295,+digits+only,+not+4294967296\r\n");
    admin_expect(w, 2, "maxqueue f 1\n", "OK\r\n");
    /* the limit is 1 and one job is queued: the next submit is refused */
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", "x");
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "QUEUE_ERROR");
}

/* The job-memory ceiling: an ERROR packet OUT_OF_MEMORY that names it. */
static void test_submit_over_memory_ceiling(void **state)
{
    struct world *w = *state;
    w->e.max_job_memory = BG_JOB_MEMORY(3);
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "x");
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", "");
    struct reply r = take(w, 0, GM_ERROR, 2);
    assert_string_equal(r.arg[0], "OUT_OF_MEMORY");
    assert_non_null(strstr(r.arg[1], "--max-job-memory"));
    assert_int_equal(w->e.job_count, 1);
}

/* The phase the request deadline reads: a packet whose header is in is
 * a body in progress; a partial header or admin line is not. */
static void test_feed_phase(void **state)
{
    struct world *w = *state;
    struct bg_buf b = {0};
    const char *arg[3] = {"f", "", "some data"};
    uint32_t len[3] = {1, 0, 9};
    assert_int_equal(gm_encode_request(&b, GM_SUBMIT_JOB_BG, 3, arg, len), 0);
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), 5, w->now), 0);
    assert_int_equal(w->s[0].stream.phase, BG_PHASE_NONE);
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), GM_HEADER_SIZE + 3, w->now), 0);
    assert_int_equal(w->s[0].stream.phase, BG_PHASE_BODY);
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), b.len, w->now), b.len);
    assert_int_equal(w->s[0].stream.phase, BG_PHASE_NONE);
    assert_int_equal(gm_session_feed(&w->s[0], "stat", 4, w->now), 0);
    assert_int_equal(w->s[0].stream.phase, BG_PHASE_NONE);
    bg_buf_free(&b);
    take(w, 0, GM_JOB_CREATED, 1);
}

static void test_refusals(void **state)
{
    struct world *w = *state;
    send_req(w, 0, GM_SUBMIT_JOB_SCHED, 8, "f", "", "1", "2", "3", "4", "5", "d");
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "NOT_SUPPORTED");
    send_req(w, 0, GM_OPTION_REQ, 1, "frobs");
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "UNKNOWN_OPTION");
    send_req(w, 0, GM_CAN_DO, 1, "");
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "INVALID_FUNCTION_NAME");
    /* bigger than -z */
    char *big = malloc(BG_JOB_SIZE_DEFAULT + 2);
    memset(big, 'x', BG_JOB_SIZE_DEFAULT + 1);
    big[BG_JOB_SIZE_DEFAULT + 1] = '\0';
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", big);
    free(big);
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "JOB_TOO_BIG");
    /* the log cannot write: an ERROR with a code of its own */
    w->e.journal_broken = 1;
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", "x");
    struct reply lu = take(w, 0, GM_ERROR, 2);
    assert_string_equal(lu.arg[0], "LOG_UNAVAILABLE");
    assert_non_null(strstr(lu.arg[1], "write-ahead log"));
    w->e.journal_broken = 0;
    bg_engine_drain(&w->e);
    send_req(w, 0, GM_SUBMIT_JOB_BG, 3, "f", "", "x");
    assert_string_equal(take(w, 0, GM_ERROR, 2).arg[0], "DRAINING");
    assert_int_equal(w->e.job_count, 0);
}

static void test_shutdown(void **state)
{
    struct world *w = *state;
    submit(w, 0, GM_SUBMIT_JOB_BG, "f", "", "x");
    grab_as_worker(w, 1, "f");
    admin_expect(w, 3, "shutdown graceful\n", "OK\n");
    assert_int_equal(w->stops_graceful, 1);
    assert_int_equal(w->e.draining, 1);
    assert_int_equal(gm_server_sweep(&w->g, 1024), 0); /* a worker holds a job */
    send_req(w, 1, GM_WORK_COMPLETE, 2, "H:host:1", "");
    assert_int_equal(gm_server_sweep(&w->g, 1024), 1);
    admin_expect(w, 3, "shutdown\n", "OK\n");
    assert_int_equal(w->stops_now, 1);
}

static void test_output_limit_overflows(void **state)
{
    struct world *w = *state;
    w->s[0].stream.out_max = 64;
    submit(w, 0, GM_SUBMIT_JOB, "f", "", "x");
    grab_as_worker(w, 1, "f");
    for (int k = 0; k < 10; k++) send_req(w, 1, GM_WORK_DATA, 2, "H:host:1", "0123456789abcdef");
    assert_int_equal(w->s[0].stream.overflow, 1);
    assert_true(w->s[0].stream.out.len <= 64 + GM_HEADER_SIZE + 32);
}

static void test_feed_stops_at_out_limit_and_partial_input(void **state)
{
    struct world *w = *state;
    struct bg_buf b = {0};
    const char *arg[1] = {"ping"};
    uint32_t len[1] = {4};
    for (int k = 0; k < 3; k++) assert_int_equal(gm_encode_request(&b, GM_ECHO_REQ, 1, arg, len), 0);
    size_t one = b.len / 3;
    w->s[0].stream.out_limit = 1; /* one reply fills it */
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), b.len, w->now), one);
    take(w, 0, GM_ECHO_RES, 1);
    w->s[0].stream.out_limit = 4u << 20;
    /* a packet cut short waits for its bytes */
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), one - 1, w->now), 0);
    assert_int_equal(gm_session_feed(&w->s[0], bg_buf_head(&b), 2 * one, w->now), 2 * one);
    take(w, 0, GM_ECHO_RES, 1);
    take(w, 0, GM_ECHO_RES, 1);
    bg_buf_free(&b);
}

/* ---- scopes (issue 23): each rule refusing and allowing ------------------ */

/* Give session i the grants of one access-file line (freed by the caller
 * with bg_scopes_free); NULL grants: bg_scope_nothing(). */
static struct bg_scopes *scope_session(struct world *w, int i, const char *grants)
{
    if (!grants) {
        w->s[i].scope = bg_scope_nothing();
        return NULL;
    }
    char line[256], err[128];
    snprintf(line, sizeof line, "token %s\n", grants);
    struct bg_scopes *sc;
    if (bg_scopes_parse(&sc, line, strlen(line), err, sizeof err) != 0) fail_msg("%s", err);
    w->s[i].scope = bg_scopes_token_scope(sc, 0);
    return sc;
}

/* Session i's next packet is the ERROR PERMISSION_DENIED naming `required`. */
static void take_denied(struct world *w, int i, const char *required)
{
    struct reply e = take(w, i, GM_ERROR, 2);
    assert_string_equal(e.arg[0], "PERMISSION_DENIED");
    assert_string_equal(e.arg[1], required);
}

static void test_scope_submit(void **state)
{
    struct world *w = *state;
    struct bg_scopes *sc = scope_session(w, 0, "produce:emails,jobs-*");
    static const uint32_t types[] = {GM_SUBMIT_JOB, GM_SUBMIT_JOB_BG, GM_SUBMIT_JOB_HIGH, GM_SUBMIT_JOB_HIGH_BG,
                                     GM_SUBMIT_JOB_LOW, GM_SUBMIT_JOB_LOW_BG};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        send_req(w, 0, types[k], 3, "sms", "", "x");
        take_denied(w, 0, "produce:sms");
    }
    send_req(w, 0, GM_SUBMIT_JOB_EPOCH, 4, "sms", "", "1700000000", "x");
    take_denied(w, 0, "produce:sms");
    /* a unique id already queued is not a way around it */
    submit(w, 1, GM_SUBMIT_JOB_BG, "sms", "u", "x");
    send_req(w, 0, GM_SUBMIT_JOB, 3, "sms", "u", "x");
    take_denied(w, 0, "produce:sms");
    assert_int_equal(w->e.job_count, 1);
    assert_int_equal(w->e.stat.permission_denied, 8);
    submit(w, 0, GM_SUBMIT_JOB_BG, "emails", "", "x");
    submit(w, 0, GM_SUBMIT_JOB, "jobs-eu", "", "x");
    assert_int_equal(w->e.job_count, 3);
    nothing(w, 0);
    /* the unscoped session is not affected */
    submit(w, 1, GM_SUBMIT_JOB_BG, "other", "", "x");
    assert_int_equal(w->e.stat.permission_denied, 8);
    bg_scopes_free(sc);
}

static void test_scope_can_do(void **state)
{
    struct world *w = *state;
    struct bg_scopes *sc = scope_session(w, 1, "consume:emails");
    submit(w, 0, GM_SUBMIT_JOB_BG, "sms", "", "s");
    submit(w, 0, GM_SUBMIT_JOB_BG, "emails", "", "e");
    send_req(w, 1, GM_CAN_DO, 1, "sms");
    take_denied(w, 1, "consume:sms");
    send_req(w, 1, GM_CAN_DO_TIMEOUT, 2, "sms", "10");
    take_denied(w, 1, "consume:sms");
    assert_int_equal(w->s[1].ability_count, 0);
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_NO_JOB, 0);
    struct reply a = grab_as_worker(w, 1, "emails");
    assert_string_equal(a.arg[1], "emails");
    send_req(w, 1, GM_WORK_COMPLETE, 2, a.arg[0], "done"); /* its own job: no check */
    send_req(w, 1, GM_GRAB_JOB, 0);
    take(w, 1, GM_NO_JOB, 0);
    nothing(w, 1);
    assert_int_equal(w->e.stat.permission_denied, 2);
    assert_int_equal(w->e.job_count, 1);
    bg_scopes_free(sc);
}

static void test_scope_get_status(void **state)
{
    struct world *w = *state;
    struct bg_scopes *sc = scope_session(w, 2, "consume:emails read:reports");
    struct reply e = submit(w, 0, GM_SUBMIT_JOB_BG, "emails", "ue", "x");
    struct reply r = submit(w, 0, GM_SUBMIT_JOB_BG, "reports", "ur", "x");
    struct reply o = submit(w, 0, GM_SUBMIT_JOB_BG, "other", "uo", "x");
    send_req(w, 2, GM_GET_STATUS, 1, e.arg[0]);
    take_denied(w, 2, "read:emails");
    send_req(w, 2, GM_GET_STATUS_UNIQUE, 1, "ue");
    take_denied(w, 2, "read:emails");
    send_req(w, 2, GM_GET_STATUS, 1, r.arg[0]);
    struct reply st = take(w, 2, GM_STATUS_RES, 5);
    assert_string_equal(st.arg[1], "1");
    send_req(w, 2, GM_GET_STATUS_UNIQUE, 1, "ur");
    st = take(w, 2, GM_STATUS_RES_UNIQUE, 6);
    assert_string_equal(st.arg[1], "1");
    /* a job of a tube the scope cannot see is unknown to it */
    send_req(w, 2, GM_GET_STATUS, 1, o.arg[0]);
    st = take(w, 2, GM_STATUS_RES, 5);
    assert_string_equal(st.arg[1], "0");
    send_req(w, 2, GM_GET_STATUS_UNIQUE, 1, "uo");
    st = take(w, 2, GM_STATUS_RES_UNIQUE, 6);
    assert_string_equal(st.arg[1], "0");
    nothing(w, 2);
    assert_int_equal(w->e.stat.permission_denied, 2);
    bg_scopes_free(sc);
}

static void test_scope_admin(void **state)
{
    struct world *w = *state;
    struct bg_scopes *sc = scope_session(w, 3, "read:emails consume:emails");
    send_req(w, 1, GM_CAN_DO, 1, "emails");
    send_req(w, 1, GM_CAN_DO, 1, "sms");
    send_req(w, 2, GM_CAN_DO, 1, "sms");
    struct reply e = submit(w, 0, GM_SUBMIT_JOB, "emails", "", "x");
    struct reply s = submit(w, 0, GM_SUBMIT_JOB, "sms", "", "x");
    /* listings: only what the scope sees */
    admin_expect(w, 3, "status\n", "emails\t1\t0\t1\n.\n");
    admin_expect(w, 3, "workers\n", "11 127.0.0.2 - : emails\n.\n");
    char want[320];
    snprintf(want, sizeof want, "%s\t0\t0\t1\n.\n", e.arg[0]);
    admin_expect(w, 3, "show jobs\n", want);
    admin_expect(w, 3, "version\n", "OK " BEANGATE_VERSION "\n");
    /* manage: maxqueue, cancel job; shutdown only unscoped */
    admin_expect(w, 3, "maxqueue emails 5\n", "ERR PERMISSION_DENIED manage:emails\r\n");
    snprintf(want, sizeof want, "cancel job %s\n", e.arg[0]);
    admin_expect(w, 3, want, "ERR PERMISSION_DENIED manage:emails\r\n");
    snprintf(want, sizeof want, "cancel job %s\n", s.arg[0]);
    admin_expect(w, 3, want, "ERR UNKNOWN_JOB\r\n");
    admin_expect(w, 3, "shutdown\n", "ERR PERMISSION_DENIED manage:*\r\n");
    assert_int_equal(w->stops_now, 0);
    assert_int_equal(w->e.job_count, 2);
    assert_int_equal(w->e.stat.permission_denied, 4);
    /* the unscoped view is whole */
    admin_expect(w, 0, "status\n", "sms\t1\t0\t2\nemails\t1\t0\t1\n.\n");
    /* with no scope at all (a certificate no line matches): nothing */
    w->s[3].scope = bg_scope_nothing();
    admin_expect(w, 3, "version\n", "ERR PERMISSION_DENIED read:*\r\n");
    admin_expect(w, 3, "status\n", "ERR PERMISSION_DENIED read:*\r\n");
    bg_scopes_free(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_submit_grab_complete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_background_priorities, setup, teardown),
        cmocka_unit_test_setup_teardown(test_work_fail_and_exception, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unique_coalescing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pre_sleep_noop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_status_and_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_listing_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxqueue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_disconnect_requeues, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_disconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep_fails_jobs_deleted_elsewhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_can_do_timeout_is_the_ttr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_job_epoch_is_a_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_numbers_are_strict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_over_memory_ceiling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_feed_phase, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output_limit_overflows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_feed_stops_at_out_limit_and_partial_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scope_submit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scope_can_do, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scope_get_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scope_admin, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

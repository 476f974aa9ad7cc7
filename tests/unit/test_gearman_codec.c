/* test_gearman_codec.c - the Gearman wire codec (core/gearman.c), driven by
 * tables as jansson's test suites are: one row per case, every row run as
 * its own cmocka test (named after the row).
 *
 *   valid requests   every request type, parsed whole, parsed from every
 *                    shorter prefix (0: more bytes needed), back to back
 *                    with another packet, and re-encoded byte for byte
 *   malformed        each error, with what gearmand 1.1.20 does with the same
 *                    bytes, as measured (see below)
 *   admin lines      gearmand's word splitting, case, "\r\n", limits
 *   names            function name <-> tube name
 *
 * What Debian's gearmand 1.1.20 does with malformed input, measured on a
 * loopback port with a python3 socket script (each row below repeats the
 * finding for its bytes; "then ECHO" means an ECHO_REQ was sent right after,
 * to see whether the connection survived):
 *   "\0RES" magic      ERROR INVALID_MAGIC "Request magic expected"; the
 *                      connection stays open and the next packet is served.
 *   other magic "\0REX" closed at once, no reply.
 *   "XREQ..."          a first byte other than NUL is a text admin line:
 *                      gearmand waits for "\n" (our server dispatches on the
 *                      first byte the same way; the binary parser says
 *                      GM_FAULT_MAGIC).
 *   type 0, 43, 1000   closed at once, no reply.
 *   types 5 (unused), 6 NOOP, 8 JOB_CREATED, 19 ERROR (response types), and
 *   24 ALL_YOURS, 35 SUBMIT_JOB_SCHED (requests gearmand does not serve):
 *                      ERROR INVALID_COMMAND "Command not expected"; open.
 *   fewer NULs than the type needs (SUBMIT_JOB "fn" or "fn\0uniq",
 *   WORK_COMPLETE "H:x:1", SUBMIT_JOB_EPOCH with 2, SUBMIT_REDUCE_JOB with 3):
 *                      gearmand searches for the NUL past the packet's end,
 *                      in the bytes of the next packet: alone it waits
 *                      forever; with an ECHO after it, it closes (or, for
 *                      WORK_STATUS, hangs) - no reply either way. We answer
 *                      GM_FAULT_ARGS at once instead (documented difference).
 *   size 0x7fffffff, 0xffffffff, 64 MiB+1: gearmand has no limit and waits
 *                      for the bytes; we answer GM_FAULT_TOO_BIG from the header.
 *   unique of 65 bytes (SUBMIT_JOB, SUBMIT_JOB_BG): ERROR ARGUMENT_TOO_LARGE
 *                      "Unique value too large"; open. 64 bytes: accepted.
 *   function name of 513 bytes (SUBMIT_JOB, CAN_DO): accepted by gearmand;
 *                      we refuse it (GM_FAULT_FIELD: over GEARMAN_FUNCTION_MAX_SIZE).
 *   GET_STATUS handle of 65 bytes: no reply at all, open. We: GM_FAULT_FIELD.
 *   SET_CLIENT_ID of 65 bytes: accepted. We: GM_FAULT_FIELD.
 *   OPTION_REQ of 65 bytes: ERROR UNKNOWN_OPTION (as any unknown option).
 *                      We: GM_FAULT_FIELD.
 *   a type without arguments with a body (GRAB_JOB "junk"): body ignored,
 *                      NO_JOB answered. We ignore it too.
 *   the last argument runs to the packet's end and may hold NULs, for every
 *   type: CAN_DO "a\0b" registers "a\0b", OPTION_REQ "exceptions\0x" is
 *   answered OPTION_RES "exceptions\0x", ECHO_REQ "a\0b\0" echoes 4 bytes.
 *   SUBMIT_REDUCE_JOB(_BACKGROUND) needs four NULs (function, unique, reducer,
 *   aggregator, data): "f\0u\0r\0a\0d" is accepted, "f\0u\0r\0d" waits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gearman.h"

/* Table rows leave their trailing fields out: they are zero. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* ---- byte strings built from parts -------------------------------------- */

/* `n` bytes at p, `times` times over (0 counts as 1). */
struct part {
    const char *p;
    uint32_t n, times;
};
#define P(s) {s, sizeof(s) - 1, 1}
#define REP(s, k) {s, sizeof(s) - 1, k}
#define PARTS_MAX 6

static void append_parts(struct bg_buf *b, const struct part *parts, size_t count)
{
    for (size_t i = 0; i < count && parts[i].p; i++)
        for (uint32_t k = 0; k < (parts[i].times ? parts[i].times : 1) && parts[i].n; k++)
            assert_int_equal(bg_buf_append(b, parts[i].p, parts[i].n), 0);
}

static size_t parts_len(const struct part *parts, size_t count)
{
    size_t n = 0;
    for (size_t i = 0; i < count && parts[i].p; i++)
        n += (size_t)parts[i].n * (parts[i].times ? parts[i].times : 1);
    return n;
}

/* Nonzero if bytes p[0..n) equal what a part describes. */
static int part_equal(const struct part *want, const char *p, size_t n)
{
    uint32_t times = want->times ? want->times : 1;
    if (n != (size_t)want->n * times) return 0;
    for (uint32_t k = 0; k < times; k++)
        if (want->n && memcmp(p + (size_t)k * want->n, want->p, want->n) != 0) return 0;
    return 1;
}

static void put_be32(struct bg_buf *b, uint32_t v)
{
    char x[4] = {(char)(v >> 24), (char)(v >> 16), (char)(v >> 8), (char)v};
    assert_int_equal(bg_buf_append(b, x, 4), 0);
}

/* A copy of b's bytes in a heap block of exactly that size, so that ASan
 * sees any read past the end. */
static char *exact_copy(const char *p, size_t n)
{
    char *c = malloc(n ? n : 1);
    assert_non_null(c);
    if (n) memcpy(c, p, n);
    return c;
}

/* ---- packet tables ------------------------------------------------------ */

#define NO_SIZE (-1) /* size field = the body's length */
#define MAX_SIZE (1u << 20)

struct packet_case {
    const char *name;
    const char *magic;          /* 4 bytes */
    uint32_t type;
    int64_t size;               /* NO_SIZE: the body's length */
    struct part body[PARTS_MAX];
    int want;                   /* 0: valid; else the fault (BG_BAD_FORMAT) */
    uint32_t nargs;             /* valid: the arguments expected */
    struct part args[GM_ARGS_MAX];
    int body_ignored;           /* valid: encoding the args gives no body */
    uint32_t max_size;          /* 0: MAX_SIZE */
};

#define REQ "\0REQ"

/* Every request type, each field at its limit, data holding NULs. */
static const struct packet_case valid_cases[] = {
    {"CAN_DO", REQ, GM_CAN_DO, NO_SIZE, {P("reverse")}, 0, 1, {P("reverse")}},
    {"CAN_DO fn 512", REQ, GM_CAN_DO, NO_SIZE, {REP("f", 512)}, 0, 1, {REP("f", 512)}},
    {"CAN_DO empty (gearmand accepts)", REQ, GM_CAN_DO, NO_SIZE, {{0}}, 0, 1, {P("")}},
    /* gearmand: the last argument runs to the end; CAN_DO "a\0b" registers "a\0b" */
    {"CAN_DO fn with NUL", REQ, GM_CAN_DO, NO_SIZE, {P("a\0b")}, 0, 1, {P("a\0b")}},
    {"CANT_DO", REQ, GM_CANT_DO, NO_SIZE, {P("reverse")}, 0, 1, {P("reverse")}},
    {"RESET_ABILITIES", REQ, GM_RESET_ABILITIES, NO_SIZE, {{0}}, 0, 0, {{0}}},
    {"PRE_SLEEP", REQ, GM_PRE_SLEEP, NO_SIZE, {{0}}, 0, 0, {{0}}},
    {"SUBMIT_JOB", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("reverse\0u1\0hello")}, 0, 3,
     {P("reverse"), P("u1"), P("hello")}},
    {"SUBMIT_JOB empty unique and data", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("fn\0\0")}, 0, 3,
     {P("fn"), P(""), P("")}},
    {"SUBMIT_JOB data with NULs", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("fn\0u\0\0a\0\0b\0")}, 0, 3,
     {P("fn"), P("u"), P("\0a\0\0b\0")}},
    {"SUBMIT_JOB fn 512 unique 64", REQ, GM_SUBMIT_JOB, NO_SIZE,
     {REP("f", 512), P("\0"), REP("u", 64), P("\0data")}, 0, 3,
     {REP("f", 512), REP("u", 64), P("data")}},
    {"SUBMIT_JOB_BG", REQ, GM_SUBMIT_JOB_BG, NO_SIZE, {P("f\0u\0d")}, 0, 3, {P("f"), P("u"), P("d")}},
    {"SUBMIT_JOB_HIGH", REQ, GM_SUBMIT_JOB_HIGH, NO_SIZE, {P("f\0u\0d")}, 0, 3, {P("f"), P("u"), P("d")}},
    {"SUBMIT_JOB_HIGH_BG", REQ, GM_SUBMIT_JOB_HIGH_BG, NO_SIZE, {P("f\0u\0d")}, 0, 3, {P("f"), P("u"), P("d")}},
    {"SUBMIT_JOB_LOW", REQ, GM_SUBMIT_JOB_LOW, NO_SIZE, {P("f\0u\0d")}, 0, 3, {P("f"), P("u"), P("d")}},
    {"SUBMIT_JOB_LOW_BG", REQ, GM_SUBMIT_JOB_LOW_BG, NO_SIZE, {P("f\0u\0d")}, 0, 3, {P("f"), P("u"), P("d")}},
    {"GRAB_JOB", REQ, GM_GRAB_JOB, NO_SIZE, {{0}}, 0, 0, {{0}}},
    /* gearmand: answers NO_JOB, the body is ignored */
    {"GRAB_JOB with a body (ignored)", REQ, GM_GRAB_JOB, NO_SIZE, {P("junk\0")}, 0, 0, {{0}}, 1},
    {"GRAB_JOB_UNIQ", REQ, GM_GRAB_JOB_UNIQ, NO_SIZE, {{0}}, 0, 0, {{0}}},
    {"GRAB_JOB_ALL", REQ, GM_GRAB_JOB_ALL, NO_SIZE, {{0}}, 0, 0, {{0}}},
    {"WORK_STATUS", REQ, GM_WORK_STATUS, NO_SIZE, {P("H:x:1\0" "50\0" "100")}, 0, 3,
     {P("H:x:1"), P("50"), P("100")}},
    {"WORK_COMPLETE", REQ, GM_WORK_COMPLETE, NO_SIZE, {P("H:x:1\0olleh")}, 0, 2, {P("H:x:1"), P("olleh")}},
    {"WORK_COMPLETE handle 64", REQ, GM_WORK_COMPLETE, NO_SIZE, {REP("H", 64), P("\0r")}, 0, 2,
     {REP("H", 64), P("r")}},
    {"WORK_FAIL", REQ, GM_WORK_FAIL, NO_SIZE, {P("H:x:1")}, 0, 1, {P("H:x:1")}},
    {"GET_STATUS", REQ, GM_GET_STATUS, NO_SIZE, {P("H:x:1")}, 0, 1, {P("H:x:1")}},
    {"GET_STATUS handle 64", REQ, GM_GET_STATUS, NO_SIZE, {REP("H", 64)}, 0, 1, {REP("H", 64)}},
    {"ECHO_REQ", REQ, GM_ECHO_REQ, NO_SIZE, {P("ping")}, 0, 1, {P("ping")}},
    {"ECHO_REQ empty", REQ, GM_ECHO_REQ, NO_SIZE, {{0}}, 0, 1, {P("")}},
    /* gearmand: echoes all four bytes */
    {"ECHO_REQ with NULs", REQ, GM_ECHO_REQ, NO_SIZE, {P("a\0b\0")}, 0, 1, {P("a\0b\0")}},
    {"SET_CLIENT_ID", REQ, GM_SET_CLIENT_ID, NO_SIZE, {P("client-7")}, 0, 1, {P("client-7")}},
    {"SET_CLIENT_ID 64", REQ, GM_SET_CLIENT_ID, NO_SIZE, {REP("c", 64)}, 0, 1, {REP("c", 64)}},
    {"CAN_DO_TIMEOUT", REQ, GM_CAN_DO_TIMEOUT, NO_SIZE, {P("reverse\0" "30")}, 0, 2, {P("reverse"), P("30")}},
    {"ALL_YOURS", REQ, GM_ALL_YOURS, NO_SIZE, {{0}}, 0, 0, {{0}}},
    {"WORK_EXCEPTION", REQ, GM_WORK_EXCEPTION, NO_SIZE, {P("H:x:1\0boom")}, 0, 2, {P("H:x:1"), P("boom")}},
    {"OPTION_REQ", REQ, GM_OPTION_REQ, NO_SIZE, {P("exceptions")}, 0, 1, {P("exceptions")}},
    {"OPTION_REQ 64", REQ, GM_OPTION_REQ, NO_SIZE, {REP("o", 64)}, 0, 1, {REP("o", 64)}},
    {"WORK_DATA", REQ, GM_WORK_DATA, NO_SIZE, {P("H:x:1\0\0\0")}, 0, 2, {P("H:x:1"), P("\0\0")}},
    {"WORK_WARNING", REQ, GM_WORK_WARNING, NO_SIZE, {P("H:x:1\0careful")}, 0, 2, {P("H:x:1"), P("careful")}},
    {"SUBMIT_JOB_SCHED", REQ, GM_SUBMIT_JOB_SCHED, NO_SIZE, {P("f\0u\0" "1\0" "2\0" "3\0" "4\0" "5\0d")}, 0, 8,
     {P("f"), P("u"), P("1"), P("2"), P("3"), P("4"), P("5"), P("d")}},
    {"SUBMIT_JOB_EPOCH", REQ, GM_SUBMIT_JOB_EPOCH, NO_SIZE, {P("f\0u\0" "1700000000\0data")}, 0, 4,
     {P("f"), P("u"), P("1700000000"), P("data")}},
    /* gearmand: accepted with four NULs (JOB_CREATED) */
    {"SUBMIT_REDUCE_JOB", REQ, GM_SUBMIT_REDUCE_JOB, NO_SIZE, {P("f\0u\0r\0a\0d")}, 0, 5,
     {P("f"), P("u"), P("r"), P("a"), P("d")}},
    {"SUBMIT_REDUCE_JOB_BACKGROUND", REQ, GM_SUBMIT_REDUCE_JOB_BACKGROUND, NO_SIZE,
     {P("f\0u\0r\0a\0d\0d")}, 0, 5, {P("f"), P("u"), P("r"), P("a"), P("d\0d")}},
    {"GET_STATUS_UNIQUE", REQ, GM_GET_STATUS_UNIQUE, NO_SIZE, {P("u1")}, 0, 1, {P("u1")}},
    {"GET_STATUS_UNIQUE 64", REQ, GM_GET_STATUS_UNIQUE, NO_SIZE, {REP("u", 64)}, 0, 1, {REP("u", 64)}},
    {"size exactly max_size", REQ, GM_ECHO_REQ, NO_SIZE, {REP("e", 100)}, 0, 1, {REP("e", 100)}, 0, 100},
};

/* Every malformed form. The comment on each: what gearmand 1.1.20 does. */
static const struct packet_case malformed_cases[] = {
    /* gearmand: ERROR INVALID_MAGIC "Request magic expected", stays open */
    {"magic \\0RES", "\0RES", GM_ECHO_REQ, NO_SIZE, {P("x")}, GM_FAULT_MAGIC},
    /* gearmand: a text admin line (waits for "\n") */
    {"magic XREQ", "XREQ", GM_ECHO_REQ, NO_SIZE, {P("x")}, GM_FAULT_MAGIC},
    /* gearmand: closes, no reply */
    {"magic \\0REX", "\0REX", GM_ECHO_REQ, NO_SIZE, {P("x")}, GM_FAULT_MAGIC},
    {"magic all NUL", "\0\0\0\0", GM_ECHO_REQ, NO_SIZE, {P("x")}, GM_FAULT_MAGIC},
    /* gearmand: closes, no reply */
    {"type 0", REQ, 0, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 43", REQ, 43, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 1000", REQ, 1000, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 0xffffffff", REQ, UINT32_MAX, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    /* gearmand: ERROR INVALID_COMMAND "Command not expected", stays open */
    {"type 5 (unused)", REQ, 5, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 6 NOOP", REQ, GM_NOOP, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 8 JOB_CREATED", REQ, GM_JOB_CREATED, NO_SIZE, {P("H:x:1")}, GM_FAULT_TYPE},
    {"type 10 NO_JOB", REQ, GM_NO_JOB, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 11 JOB_ASSIGN", REQ, GM_JOB_ASSIGN, NO_SIZE, {P("H\0f\0d")}, GM_FAULT_TYPE},
    {"type 17 ECHO_RES", REQ, GM_ECHO_RES, NO_SIZE, {P("x")}, GM_FAULT_TYPE},
    {"type 19 ERROR", REQ, GM_ERROR, NO_SIZE, {P("a\0b")}, GM_FAULT_TYPE},
    {"type 20 STATUS_RES", REQ, GM_STATUS_RES, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 27 OPTION_RES", REQ, GM_OPTION_RES, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 31 JOB_ASSIGN_UNIQ", REQ, GM_JOB_ASSIGN_UNIQ, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 40 JOB_ASSIGN_ALL", REQ, GM_JOB_ASSIGN_ALL, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    {"type 42 STATUS_RES_UNIQUE", REQ, GM_STATUS_RES_UNIQUE, NO_SIZE, {{0}}, GM_FAULT_TYPE},
    /* gearmand: no limit; it waits for the bytes, no reply */
    {"size over max_size", REQ, GM_ECHO_REQ, NO_SIZE, {REP("e", 101)}, GM_FAULT_TOO_BIG, 0, {{0}}, 0, 100},
    {"size 0x7fffffff", REQ, GM_ECHO_REQ, 0x7fffffffu, {{0}}, GM_FAULT_TOO_BIG},
    {"size 0xffffffff", REQ, GM_ECHO_REQ, 0xffffffffu, {{0}}, GM_FAULT_TOO_BIG},
    {"size 0xffffffff, max UINT32_MAX", REQ, GM_ECHO_REQ, 0xffffffffu, {{0}}, GM_FAULT_TOO_BIG, 0, {{0}}, 0, UINT32_MAX},
    {"size 64 MiB + 1", REQ, GM_SUBMIT_JOB, (64u << 20) + 1, {{0}}, GM_FAULT_TOO_BIG},
    /* gearmand: looks for the NUL in the next packet's bytes: waits, or
     * closes when more bytes follow; never a reply */
    {"SUBMIT_JOB no NUL", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("fn")}, GM_FAULT_ARGS},
    {"SUBMIT_JOB one NUL", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("fn\0uniq")}, GM_FAULT_ARGS},
    {"SUBMIT_JOB empty", REQ, GM_SUBMIT_JOB, NO_SIZE, {{0}}, GM_FAULT_ARGS},
    {"SUBMIT_JOB_LOW_BG one NUL", REQ, GM_SUBMIT_JOB_LOW_BG, NO_SIZE, {P("f\0d")}, GM_FAULT_ARGS},
    {"WORK_COMPLETE no NUL", REQ, GM_WORK_COMPLETE, NO_SIZE, {P("H:x:1")}, GM_FAULT_ARGS},
    {"WORK_DATA empty", REQ, GM_WORK_DATA, NO_SIZE, {{0}}, GM_FAULT_ARGS},
    /* gearmand: hangs (reads the next packet as the denominator) */
    {"WORK_STATUS one NUL", REQ, GM_WORK_STATUS, NO_SIZE, {P("H:x:1\0" "1")}, GM_FAULT_ARGS},
    {"WORK_EXCEPTION no NUL", REQ, GM_WORK_EXCEPTION, NO_SIZE, {P("H:x:1")}, GM_FAULT_ARGS},
    {"WORK_WARNING no NUL", REQ, GM_WORK_WARNING, NO_SIZE, {P("H:x:1")}, GM_FAULT_ARGS},
    {"CAN_DO_TIMEOUT no NUL", REQ, GM_CAN_DO_TIMEOUT, NO_SIZE, {P("f")}, GM_FAULT_ARGS},
    {"SUBMIT_JOB_SCHED six NULs", REQ, GM_SUBMIT_JOB_SCHED, NO_SIZE, {P("f\0u\0" "1\0" "2\0" "3\0" "4\0" "d")}, GM_FAULT_ARGS},
    /* gearmand: closes */
    {"SUBMIT_JOB_EPOCH two NULs", REQ, GM_SUBMIT_JOB_EPOCH, NO_SIZE, {P("f\0u\0d")}, GM_FAULT_ARGS},
    /* gearmand: waits for a fourth NUL (closes when bytes follow) */
    {"SUBMIT_REDUCE_JOB three NULs", REQ, GM_SUBMIT_REDUCE_JOB, NO_SIZE, {P("f\0u\0r\0d")}, GM_FAULT_ARGS},
    {"SUBMIT_REDUCE_JOB_BACKGROUND three NULs", REQ, GM_SUBMIT_REDUCE_JOB_BACKGROUND, NO_SIZE,
     {P("f\0u\0r\0d")}, GM_FAULT_ARGS},
    /* gearmand: accepts (JOB_CREATED); over GEARMAN_FUNCTION_MAX_SIZE for us */
    {"SUBMIT_JOB fn 513", REQ, GM_SUBMIT_JOB, NO_SIZE, {REP("f", 513), P("\0\0d")}, GM_FAULT_FIELD},
    /* gearmand: accepts */
    {"CAN_DO fn 513", REQ, GM_CAN_DO, NO_SIZE, {REP("f", 513)}, GM_FAULT_FIELD},
    {"CANT_DO fn 513", REQ, GM_CANT_DO, NO_SIZE, {REP("f", 513)}, GM_FAULT_FIELD},
    {"CAN_DO_TIMEOUT fn 513", REQ, GM_CAN_DO_TIMEOUT, NO_SIZE, {REP("f", 513), P("\0" "10")}, GM_FAULT_FIELD},
    /* gearmand: ERROR ARGUMENT_TOO_LARGE "Unique value too large", stays open */
    {"SUBMIT_JOB unique 65", REQ, GM_SUBMIT_JOB, NO_SIZE, {P("f\0"), REP("u", 65), P("\0d")}, GM_FAULT_FIELD},
    {"SUBMIT_JOB_BG unique 65", REQ, GM_SUBMIT_JOB_BG, NO_SIZE, {P("f\0"), REP("u", 65), P("\0d")}, GM_FAULT_FIELD},
    {"SUBMIT_JOB_EPOCH unique 65", REQ, GM_SUBMIT_JOB_EPOCH, NO_SIZE, {P("f\0"), REP("u", 65), P("\0" "1\0d")}, GM_FAULT_FIELD},
    {"SUBMIT_REDUCE_JOB reducer 513", REQ, GM_SUBMIT_REDUCE_JOB, NO_SIZE, {P("f\0u\0"), REP("r", 513), P("\0a\0d")}, GM_FAULT_FIELD},
    {"GET_STATUS_UNIQUE unique 65", REQ, GM_GET_STATUS_UNIQUE, NO_SIZE, {REP("u", 65)}, GM_FAULT_FIELD},
    /* gearmand: no reply at all, stays open */
    {"GET_STATUS handle 65", REQ, GM_GET_STATUS, NO_SIZE, {REP("H", 65)}, GM_FAULT_FIELD},
    /* gearmand: JOB_NOT_FOUND for an unknown handle, whatever its length */
    {"WORK_COMPLETE handle 65", REQ, GM_WORK_COMPLETE, NO_SIZE, {REP("H", 65), P("\0r")}, GM_FAULT_FIELD},
    {"WORK_FAIL handle 65", REQ, GM_WORK_FAIL, NO_SIZE, {REP("H", 65)}, GM_FAULT_FIELD},
    {"WORK_STATUS handle 65", REQ, GM_WORK_STATUS, NO_SIZE, {REP("H", 65), P("\0" "1\0" "2")}, GM_FAULT_FIELD},
    {"WORK_DATA handle 65", REQ, GM_WORK_DATA, NO_SIZE, {REP("H", 65), P("\0d")}, GM_FAULT_FIELD},
    /* gearmand: accepts */
    {"SET_CLIENT_ID 65", REQ, GM_SET_CLIENT_ID, NO_SIZE, {REP("c", 65)}, GM_FAULT_FIELD},
    /* gearmand: ERROR UNKNOWN_OPTION, as for any option it does not know */
    {"OPTION_REQ 65", REQ, GM_OPTION_REQ, NO_SIZE, {REP("o", 65)}, GM_FAULT_FIELD},
};

/* The packet a case describes, header included. */
static struct bg_buf build_packet(const struct packet_case *c)
{
    struct bg_buf b = {0};
    size_t body = parts_len(c->body, PARTS_MAX);
    assert_int_equal(bg_buf_append(&b, c->magic, 4), 0);
    put_be32(&b, c->type);
    put_be32(&b, c->size == NO_SIZE ? (uint32_t)body : (uint32_t)c->size);
    append_parts(&b, c->body, PARTS_MAX);
    return b;
}

static uint32_t max_size_of(const struct packet_case *c)
{
    return c->max_size ? c->max_size : MAX_SIZE;
}

static void assert_packet(const struct packet_case *c, const struct gm_packet *p, const char *buf)
{
    assert_int_equal(p->type, c->type);
    assert_int_equal(p->size, parts_len(c->body, PARTS_MAX));
    assert_int_equal(p->nargs, c->nargs);
    for (uint32_t i = 0; i < c->nargs; i++) {
        /* zero-copy: every argument points into the parsed bytes */
        assert_true(p->arg[i] >= buf + GM_HEADER_SIZE);
        assert_true(p->arg[i] + p->arg_len[i] <= buf + GM_HEADER_SIZE + p->size);
        if (!part_equal(&c->args[i], p->arg[i], p->arg_len[i]))
            fail_msg("%s: argument %u differs (length %u)", c->name, i, p->arg_len[i]);
    }
}

/* A valid request: whole, every prefix, back to back, re-encoded. */
static void test_valid_request(void **state)
{
    const struct packet_case *c = *state;
    struct bg_buf b = build_packet(c);
    const char *bytes = bg_buf_head(&b);
    size_t n = b.len;
    struct gm_packet p;

    assert_int_equal(gm_request_nargs(c->type), (int)c->nargs);
    char *whole = exact_copy(bytes, n);
    assert_int_equal(gm_parse_request(whole, n, max_size_of(c), &p), (int)n);
    assert_packet(c, &p, whole);
    free(whole);

    /* split anywhere: nothing until the last byte is there */
    for (size_t k = 0; k < n; k++) {
        char *prefix = exact_copy(bytes, k);
        int r = gm_parse_request(prefix, k, max_size_of(c), &p);
        free(prefix);
        if (r != 0) fail_msg("%s: prefix of %zu/%zu bytes gave %d", c->name, k, n, r);
    }

    /* followed by another packet: only this one is used */
    struct bg_buf two = {0};
    assert_int_equal(bg_buf_append(&two, bytes, n), 0);
    assert_int_equal(bg_buf_append(&two, "\0REQ\0\0\0\x10\0\0\0\x02hi", 14), 0);
    assert_int_equal(gm_parse_request(bg_buf_head(&two), two.len, max_size_of(c), &p), (int)n);
    assert_packet(c, &p, bg_buf_head(&two));
    assert_int_equal(gm_parse_request(bg_buf_head(&two) + n, two.len - n, max_size_of(c), &p), 14);
    assert_int_equal(p.type, GM_ECHO_REQ);
    assert_int_equal(p.nargs, 1);
    assert_memory_equal(p.arg[0], "hi", 2);
    bg_buf_free(&two);

    /* encoding the arguments gives the same bytes back */
    struct bg_buf args = {0}, enc = {0};
    const char *argp[GM_ARGS_MAX];
    uint32_t argl[GM_ARGS_MAX];
    size_t offs[GM_ARGS_MAX];
    for (uint32_t i = 0; i < c->nargs; i++) {
        offs[i] = args.len;
        argl[i] = (uint32_t)parts_len(&c->args[i], 1);
        append_parts(&args, &c->args[i], 1);
    }
    for (uint32_t i = 0; i < c->nargs; i++) argp[i] = args.data ? bg_buf_head(&args) + offs[i] : "";
    assert_int_equal(gm_encode_request(&enc, c->type, c->nargs, argp, argl), 0);
    if (c->body_ignored) {
        assert_int_equal(enc.len, GM_HEADER_SIZE);
        assert_memory_equal(bg_buf_head(&enc), bytes, 8);
    } else {
        assert_int_equal(enc.len, n);
        assert_memory_equal(bg_buf_head(&enc), bytes, n);
    }
    bg_buf_free(&args);
    bg_buf_free(&enc);
    bg_buf_free(&b);
}

/* A malformed packet: its error, reported as soon as the bytes show it, and
 * the header's fields left in *p. */
static void test_malformed_request(void **state)
{
    const struct packet_case *c = *state;
    struct bg_buf b = build_packet(c);
    const char *bytes = bg_buf_head(&b);
    size_t n = b.len;
    struct gm_packet p;
    int header_error = c->want == GM_FAULT_MAGIC || c->want == GM_FAULT_TYPE || c->want == GM_FAULT_TOO_BIG;

    char *whole = exact_copy(bytes, n);
    assert_int_equal(gm_parse_request(whole, n, max_size_of(c), &p), BG_BAD_FORMAT);
    assert_int_equal(p.fault, c->want);
    assert_int_equal(p.type, c->type);
    assert_int_equal(p.size, c->size == NO_SIZE ? parts_len(c->body, PARTS_MAX) : (size_t)c->size);
    free(whole);

    /* header faults show at 12 bytes; argument faults need the whole packet */
    for (size_t k = 0; k < n; k++) {
        char *prefix = exact_copy(bytes, k);
        int r = gm_parse_request(prefix, k, max_size_of(c), &p);
        free(prefix);
        int want = k >= GM_HEADER_SIZE && header_error ? BG_BAD_FORMAT : 0;
        if (r != want) fail_msg("%s: prefix of %zu/%zu bytes gave %d, want %d", c->name, k, n, r, want);
        if (r) assert_int_equal(p.fault, c->want);
    }
    bg_buf_free(&b);
}

/* gm_request_nargs and gm_type_name over every number, against the list in
 * the brief (gearman.org numbering); response-only types are BG_BAD_FORMAT. */
static void test_type_table(void **state)
{
    (void)state;
    static const int want_nargs[GM_TYPE_LAST + 2] = {
        [0] = BG_BAD_FORMAT, [GM_CAN_DO] = 1, [GM_CANT_DO] = 1, [GM_RESET_ABILITIES] = 0,
        [GM_PRE_SLEEP] = 0, [5] = BG_BAD_FORMAT, [GM_NOOP] = BG_BAD_FORMAT, [GM_SUBMIT_JOB] = 3,
        [GM_JOB_CREATED] = BG_BAD_FORMAT, [GM_GRAB_JOB] = 0, [GM_NO_JOB] = BG_BAD_FORMAT,
        [GM_JOB_ASSIGN] = BG_BAD_FORMAT, [GM_WORK_STATUS] = 3, [GM_WORK_COMPLETE] = 2,
        [GM_WORK_FAIL] = 1, [GM_GET_STATUS] = 1, [GM_ECHO_REQ] = 1, [GM_ECHO_RES] = BG_BAD_FORMAT,
        [GM_SUBMIT_JOB_BG] = 3, [GM_ERROR] = BG_BAD_FORMAT, [GM_STATUS_RES] = BG_BAD_FORMAT,
        [GM_SUBMIT_JOB_HIGH] = 3, [GM_SET_CLIENT_ID] = 1, [GM_CAN_DO_TIMEOUT] = 2,
        [GM_ALL_YOURS] = 0, [GM_WORK_EXCEPTION] = 2, [GM_OPTION_REQ] = 1,
        [GM_OPTION_RES] = BG_BAD_FORMAT, [GM_WORK_DATA] = 2, [GM_WORK_WARNING] = 2,
        [GM_GRAB_JOB_UNIQ] = 0, [GM_JOB_ASSIGN_UNIQ] = BG_BAD_FORMAT, [GM_SUBMIT_JOB_HIGH_BG] = 3,
        [GM_SUBMIT_JOB_LOW] = 3, [GM_SUBMIT_JOB_LOW_BG] = 3, [GM_SUBMIT_JOB_SCHED] = 8,
        [GM_SUBMIT_JOB_EPOCH] = 4,
        /* gearmand: function, unique, reducer, aggregator, data */
        [GM_SUBMIT_REDUCE_JOB] = 5, [GM_SUBMIT_REDUCE_JOB_BACKGROUND] = 5,
        [GM_GRAB_JOB_ALL] = 0, [GM_JOB_ASSIGN_ALL] = BG_BAD_FORMAT, [GM_GET_STATUS_UNIQUE] = 1,
        [GM_STATUS_RES_UNIQUE] = BG_BAD_FORMAT, [GM_TYPE_LAST + 1] = BG_BAD_FORMAT,
    };
    for (uint32_t t = 0; t <= GM_TYPE_LAST + 1; t++) {
        if (gm_request_nargs(t) != want_nargs[t])
            fail_msg("type %u: nargs %d, want %d", t, gm_request_nargs(t), want_nargs[t]);
        int named = t != 0 && t != 5 && t <= GM_TYPE_LAST;
        assert_int_equal(gm_type_name(t) != NULL, named);
    }
    assert_int_equal(gm_request_nargs(UINT32_MAX), BG_BAD_FORMAT);
    assert_null(gm_type_name(UINT32_MAX));
    assert_string_equal(gm_type_name(GM_SUBMIT_JOB), "SUBMIT_JOB");
    assert_string_equal(gm_type_name(GM_JOB_CREATED), "JOB_CREATED");
    assert_string_equal(gm_type_name(GM_SUBMIT_REDUCE_JOB_BACKGROUND), "SUBMIT_REDUCE_JOB_BACKGROUND");
    assert_string_equal(gm_type_name(GM_STATUS_RES_UNIQUE), "STATUS_RES_UNIQUE");
    assert_string_equal(gm_type_name(GM_CAN_DO), "CAN_DO");
    assert_string_equal(gm_type_name(GM_ECHO_RES), "ECHO_RES");
}

/* Responses encode to the exact bytes gearmand sends (as captured). */
static void test_encode_response(void **state)
{
    (void)state;
    static const struct {
        uint32_t type, n;
        const char *arg[6];
        uint32_t len[6];
        const char *want;
        size_t want_len;
    } cases[] = {
        {GM_JOB_CREATED, 1, {"H:vm:1"}, {6}, "\0RES\0\0\0\x08\0\0\0\x06H:vm:1", 18},
        {GM_NO_JOB, 0, {0}, {0}, "\0RES\0\0\0\x0a\0\0\0\0", 12},
        {GM_ECHO_RES, 1, {"a\0b\0"}, {4}, "\0RES\0\0\0\x11\0\0\0\x04" "a\0b\0", 16},
        {GM_ERROR, 2, {"INVALID_MAGIC", "Request magic expected"}, {13, 22},
         "\0RES\0\0\0\x13\0\0\0\x24INVALID_MAGIC\0Request magic expected", 48},
        {GM_STATUS_RES, 5, {"H:vm:1", "1", "0", "0", "0"}, {6, 1, 1, 1, 1},
         "\0RES\0\0\0\x14\0\0\0\x0eH:vm:1\0" "1\0" "0\0" "0\0" "0", 26},
        {GM_STATUS_RES_UNIQUE, 6, {"", "0", "0", "0", "0", "0"}, {0, 1, 1, 1, 1, 1},
         "\0RES\0\0\0\x2a\0\0\0\x0a\0" "0\0" "0\0" "0\0" "0\0" "0", 22},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_buf out = {0};
        assert_int_equal(gm_encode_response(&out, cases[i].type, cases[i].n, cases[i].arg, cases[i].len), 0);
        assert_int_equal(out.len, cases[i].want_len);
        assert_memory_equal(bg_buf_head(&out), cases[i].want, cases[i].want_len);
        bg_buf_free(&out);
    }
    /* appends after what is there; out of memory is reported */
    struct bg_buf out = {0};
    const char *a[1] = {"x"};
    uint32_t l[1] = {1};
    assert_int_equal(bg_buf_append(&out, "abc", 3), 0);
    assert_int_equal(gm_encode_response(&out, GM_ECHO_RES, 1, a, l), 0);
    assert_int_equal(out.len, 3 + 13);
    assert_memory_equal(bg_buf_head(&out), "abc\0RES\0\0\0\x11\0\0\0\x01x", 16);
    bg_buf_free(&out);
    bg_alloc_fail_after(1);
    assert_int_equal(gm_encode_response(&out, GM_ECHO_RES, 1, a, l), BG_OUT_OF_MEMORY);
    bg_alloc_fail_after(0);
    assert_int_equal(out.len, 0);
    bg_buf_free(&out);
}

/* Every request survives encode -> parse with arbitrary argument bytes. */
static void test_encode_parse_round_trip(void **state)
{
    (void)state;
    char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i;
    for (uint32_t t = 0, start = 0; t <= GM_TYPE_LAST; t++, start = (start + 64) % 256) {
        int n = gm_request_nargs(t);
        if (n < 0) continue;
        const char *arg[GM_ARGS_MAX];
        uint32_t len[GM_ARGS_MAX];
        for (int i = 0; i < n; i++) {
            /* NUL-free bytes for separated arguments, any 64 for the last
             * (64: within every field limit) */
            arg[i] = i + 1 < n ? bytes + 1 + i : bytes + start;
            len[i] = i + 1 < n ? (uint32_t)(16 + i) : 64;
        }
        struct bg_buf out = {0};
        assert_int_equal(gm_encode_request(&out, t, (uint32_t)n, arg, len), 0);
        struct gm_packet p;
        assert_int_equal(gm_parse_request(bg_buf_head(&out), out.len, MAX_SIZE, &p), (int)out.len);
        assert_int_equal(p.type, t);
        assert_int_equal(p.nargs, (uint32_t)n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(p.arg_len[i], len[i]);
            assert_memory_equal(p.arg[i], arg[i], len[i]);
        }
        bg_buf_free(&out);
    }
}

static void test_error_text(void **state)
{
    (void)state;
    static const struct {
        int err;
        const char *code, *text;
    } cases[] = {
        {GM_FAULT_MAGIC, "INVALID_MAGIC", "Request magic expected"},  /* gearmand's words */
        {GM_FAULT_TYPE, "INVALID_COMMAND", "Command not expected"},   /* gearmand's words */
        {GM_FAULT_ARGS, "INVALID_PACKET", "Packet has too few arguments"},
        {GM_FAULT_TOO_BIG, "ARGUMENT_TOO_LARGE", "Packet too large"},
        {GM_FAULT_FIELD, "ARGUMENT_TOO_LARGE", "Argument too large"}, /* gearmand's code */
        {0, "UNKNOWN_ERROR", "Unknown error"},
        {-1, "UNKNOWN_ERROR", "Unknown error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *code = NULL, *text = NULL;
        gm_error_text(cases[i].err, &code, &text);
        assert_string_equal(code, cases[i].code);
        assert_string_equal(text, cases[i].text);
    }
}

/* ---- admin lines --------------------------------------------------------- */

#define WORDS_MAX 4
struct admin_case {
    const char *name;
    struct part in[PARTS_MAX];
    int want;                   /* bytes used, 0, or minus the fault (BG_BAD_FORMAT) */
    int cmd;
    struct part word;
    uint32_t nargs;
    struct part args[WORDS_MAX];
};

#define LINE(s) {P(s)}
#define USED(s) ((int)sizeof(s) - 1)

/* The comment on a row: what gearmand 1.1.20 answered to that line. */
static const struct admin_case admin_cases[] = {
    {"status LF", LINE("status\n"), 7, GM_ADMIN_STATUS, P("status"), 0, {{0}}},
    {"status CRLF", LINE("status\r\n"), 8, GM_ADMIN_STATUS, P("status"), 0, {{0}}},
    /* gearmand: case does not matter */
    {"STATUS", LINE("STATUS\n"), 7, GM_ADMIN_STATUS, P("STATUS"), 0, {{0}}},
    /* gearmand: status, the trailing spaces make one empty word */
    {"status trailing spaces", LINE("status   \n"), 10, GM_ADMIN_STATUS, P("status"), 1, {P("")}},
    {"status trailing space CRLF", LINE("status  \r\n"), 10, GM_ADMIN_STATUS, P("status"), 1, {P("")}},
    /* gearmand: status (extra words ignored) */
    {"status extra", LINE("status extra\n"), 13, GM_ADMIN_STATUS, P("status"), 1, {P("extra")}},
    /* gearmand: status with five words; a sixth closes the connection */
    {"status five words", LINE("status a b c d\n"), 15, GM_ADMIN_STATUS, P("status"), 4,
     {P("a"), P("b"), P("c"), P("d")}},
    {"status six words", LINE("status a b c d e\n"), -GM_FAULT_ARGS},
    {"version five words and a trailing space", LINE("version a b c d \n"), -GM_FAULT_ARGS},
    {"maxqueue six words", LINE("maxqueue f 1 2 3 4\n"), -GM_FAULT_ARGS},
    /* gearmand: ERR UNKNOWN_COMMAND Unknown+server+command (empty word) */
    {"empty LF", LINE("\n"), 1, GM_ADMIN_UNKNOWN, P(""), 0, {{0}}},
    {"empty CRLF", LINE("\r\n"), 2, GM_ADMIN_UNKNOWN, P(""), 0, {{0}}},
    {"spaces only", LINE("   \n"), 4, GM_ADMIN_UNKNOWN, P(""), 1, {P("")}},
    {"leading spaces", LINE("  status\n"), 9, GM_ADMIN_UNKNOWN, P(""), 1, {P("status")}},
    /* gearmand: ERR UNKNOWN_COMMAND ...\tstatus - a tab is part of a word */
    {"tab status", LINE("\tstatus\n"), 8, GM_ADMIN_UNKNOWN, P("\tstatus"), 0, {{0}}},
    {"status tab", LINE("status\t\n"), 8, GM_ADMIN_UNKNOWN, P("status\t"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_COMMAND ...status\r - only one "\r" goes */
    {"status CR CR LF", LINE("status\r\r\n"), 9, GM_ADMIN_UNKNOWN, P("status\r"), 0, {{0}}},
    {"CR inside", LINE("ver\rsion\n"), 9, GM_ADMIN_UNKNOWN, P("ver\rsion"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_COMMAND ...sta (it stops at the NUL; we keep the bytes) */
    {"NUL inside", LINE("sta\0tus\n"), 8, GM_ADMIN_UNKNOWN, P("sta\0tus"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_COMMAND ...stat / ...statusx: no prefixes */
    {"prefix stat", LINE("stat\n"), 5, GM_ADMIN_UNKNOWN, P("stat"), 0, {{0}}},
    {"statusx", LINE("statusx\n"), 8, GM_ADMIN_UNKNOWN, P("statusx"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_COMMAND ...foo */
    {"unknown with args", LINE("foo bar baz\n"), 12, GM_ADMIN_UNKNOWN, P("foo"), 2, {P("bar"), P("baz")}},
    {"workers", LINE("workers\n"), 8, GM_ADMIN_WORKERS, P("workers"), 0, {{0}}},
    {"version", LINE("version\r\n"), 9, GM_ADMIN_VERSION, P("version"), 0, {{0}}},
    {"getpid", LINE("getpid\n"), 7, GM_ADMIN_GETPID, P("getpid"), 0, {{0}}},
    {"verbose", LINE("verbose\n"), 8, GM_ADMIN_VERBOSE, P("verbose"), 0, {{0}}},
    {"shutdown", LINE("shutdown\n"), 9, GM_ADMIN_SHUTDOWN, P("shutdown"), 0, {{0}}},
    {"shutdown graceful", LINE("shutdown graceful\n"), 18, GM_ADMIN_SHUTDOWN, P("shutdown"), 1, {P("graceful")}},
    /* gearmand: ERR UNKNOWN_COMMAND ...shutdown */
    {"shutdown x", LINE("shutdown x\n"), 11, GM_ADMIN_SHUTDOWN, P("shutdown"), 1, {P("x")}},
    /* gearmand: ERR INVALID_ARGUMENTS An+incomplete+set+...+maxqueue */
    {"maxqueue alone", LINE("maxqueue\n"), 9, GM_ADMIN_MAXQUEUE, P("maxqueue"), 0, {{0}}},
    /* gearmand: OK */
    {"maxqueue f", LINE("maxqueue f\n"), 11, GM_ADMIN_MAXQUEUE, P("maxqueue"), 1, {P("f")}},
    {"maxqueue f 10", LINE("maxqueue f 10\r\n"), 15, GM_ADMIN_MAXQUEUE, P("maxqueue"), 2, {P("f"), P("10")}},
    {"maxqueue f 1 2 3", LINE("maxqueue f 1 2 3\n"), 17, GM_ADMIN_MAXQUEUE, P("maxqueue"), 4,
     {P("f"), P("1"), P("2"), P("3")}},
    {"show jobs", LINE("show jobs\n"), 10, GM_ADMIN_SHOW_JOBS, P("show"), 0, {{0}}},
    {"show  jobs (two spaces)", LINE("show  jobs\n"), 11, GM_ADMIN_SHOW_JOBS, P("show"), 0, {{0}}},
    {"SHOW JOBS", LINE("SHOW JOBS\r\n"), 11, GM_ADMIN_SHOW_JOBS, P("SHOW"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_SHOW_ARGUMENTS */
    {"show jobs trailing space", LINE("show jobs \n"), 11, GM_ADMIN_SHOW_JOBS, P("show"), 1, {P("")}},
    {"show jobs x", LINE("show jobs x\n"), 12, GM_ADMIN_SHOW_JOBS, P("show"), 1, {P("x")}},
    {"show unique jobs", LINE("show unique jobs\n"), 17, GM_ADMIN_SHOW_UNIQUE_JOBS, P("show"), 0, {{0}}},
    {"Show  Unique   Jobs", LINE("Show  Unique   Jobs\n"), 20, GM_ADMIN_SHOW_UNIQUE_JOBS, P("Show"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_SHOW_ARGUMENTS */
    {"show unique jobs x", LINE("show unique jobs x\n"), 19, GM_ADMIN_SHOW_UNIQUE_JOBS, P("show"), 1, {P("x")}},
    {"show unique", LINE("show unique\n"), 12, GM_ADMIN_UNKNOWN, P("show"), 1, {P("unique")}},
    {"show foo", LINE("show foo\n"), 9, GM_ADMIN_UNKNOWN, P("show"), 1, {P("foo")}},
    /* gearmand: ERR UNKNOWN_COMMAND ...show */
    {"show", LINE("show\n"), 5, GM_ADMIN_UNKNOWN, P("show"), 0, {{0}}},
    /* gearmand: ERR UNKNOWN_JOB for a handle it does not know */
    {"cancel job", LINE("cancel job H:x:1\n"), 17, GM_ADMIN_CANCEL_JOB, P("cancel"), 1, {P("H:x:1")}},
    {"CANCEL JOB", LINE("CANCEL JOB H:x:1\r\n"), 18, GM_ADMIN_CANCEL_JOB, P("CANCEL"), 1, {P("H:x:1")}},
    {"cancel job two spaces", LINE("cancel job  \n"), 13, GM_ADMIN_CANCEL_JOB, P("cancel"), 1, {P("")}},
    /* gearmand: ERR UNKNOWN_COMMAND ...cancel */
    {"cancel job, no handle", LINE("cancel job\n"), 11, GM_ADMIN_CANCEL_JOB, P("cancel"), 0, {{0}}},
    {"cancel", LINE("cancel\n"), 7, GM_ADMIN_UNKNOWN, P("cancel"), 0, {{0}}},
    {"cancel x", LINE("cancel x\n"), 9, GM_ADMIN_UNKNOWN, P("cancel"), 1, {P("x")}},
    /* gearmand: ERR UNKNOWN_ERROR */
    {"cancel foo H", LINE("cancel foo H:x:1\n"), 17, GM_ADMIN_UNKNOWN, P("cancel"), 2, {P("foo"), P("H:x:1")}},
    {"cancel job H extra", LINE("cancel job H:x:1 extra\n"), 23, GM_ADMIN_CANCEL_JOB, P("cancel"), 2,
     {P("H:x:1"), P("extra")}},
    /* two lines: one at a time */
    {"two lines", LINE("version\ngetpid\n"), 8, GM_ADMIN_VERSION, P("version"), 0, {{0}}},
    /* gearmand: waits */
    {"no LF yet", LINE("status"), 0},
    {"bare CR", LINE("status\r"), 0},
    {"nothing", {{0}}, 0},
    /* gearmand: no limit (a 5000-byte line is answered UNKNOWN_COMMAND) */
    {"4095 bytes and LF", {REP("x", 4095), P("\n")}, 4096, GM_ADMIN_UNKNOWN, REP("x", 4095), 0, {{0}}},
    {"4096 bytes, no LF", {REP("x", 4096)}, -GM_FAULT_TOO_BIG},
    {"4096 bytes and LF", {REP("x", 4096), P("\n")}, -GM_FAULT_TOO_BIG},
    {"4095 bytes, no LF", {REP("x", 4095)}, 0},
    {"status and 4089 spaces", {P("status"), REP(" ", 4089), P("\n")}, 4096, GM_ADMIN_STATUS, P("status"), 1, {P("")}},
};

static void test_admin_line(void **state)
{
    const struct admin_case *c = *state;
    struct bg_buf b = {0};
    append_parts(&b, c->in, PARTS_MAX);
    char *in = exact_copy(b.data ? bg_buf_head(&b) : "", b.len);
    struct gm_admin_line line;
    memset(&line, 0x5a, sizeof line);
    int r = gm_admin_parse(in, b.len, &line);
    assert_int_equal(r, c->want >= 0 ? c->want : BG_BAD_FORMAT);
    if (r < 0) assert_int_equal(line.fault, -c->want);
    if (r > 0) {
        assert_int_equal(line.cmd, c->cmd);
        assert_true(line.word >= in && line.word + line.word_len <= in + r);
        if (!part_equal(&c->word, line.word, line.word_len))
            fail_msg("%s: word is \"%.*s\"", c->name, (int)line.word_len, line.word);
        assert_int_equal(line.nargs, c->nargs);
        for (uint32_t i = 0; i < c->nargs; i++) {
            assert_true(line.arg[i] >= in && line.arg[i] + line.arg_len[i] <= in + r);
            if (!part_equal(&c->args[i], line.arg[i], line.arg_len[i]))
                fail_msg("%s: arg %u is \"%.*s\"", c->name, i, (int)line.arg_len[i], line.arg[i]);
        }
        /* every prefix without the "\n" waits */
        for (int k = 0; k < r; k++) {
            char *prefix = exact_copy(in, (size_t)k);
            int pr = gm_admin_parse(prefix, (size_t)k, &line);
            free(prefix);
            if (pr != 0) fail_msg("%s: prefix of %d bytes gave %d", c->name, k, pr);
        }
    }
    free(in);
    bg_buf_free(&b);
}

/* ---- function names <-> tubes ------------------------------------------- */

struct name_case {
    const char *name;
    struct part fn[PARTS_MAX];
    int want;                   /* tube length or BG_BAD_FORMAT */
    struct part tube[PARTS_MAX];
};

static const struct name_case name_cases[] = {
    {"plain kept", {P("reverse")}, 7, {P("reverse")}},
    {"every tube char kept", {P("Az09+/;._()-")}, 12, {P("Az09+/;._()-")}},
    {"200 bytes kept", {REP("a", 200)}, 200, {REP("a", 200)}},
    {"201 bytes", {REP("a", 201)}, BG_BAD_FORMAT},
    {"empty", {{0}}, BG_BAD_FORMAT},
    {"dollar", {P("a$b")}, 5, {P("a$24b")}},
    {"only dollar", {P("$")}, 3, {P("$24")}},
    {"dollar looking like an escape", {P("$41")}, 5, {P("$2441")}},
    {"leading dash", {P("-x")}, 4, {P("$2Dx")}},
    {"inner dash kept", {P("x-y")}, 3, {P("x-y")}},
    {"leading dash and space", {P("-a b")}, 8, {P("$2Da$20b")}},
    {"space", {P("hello world")}, 13, {P("hello$20world")}},
    {"colon and star", {P("ns:job*")}, 11, {P("ns$3Ajob$2A")}},
    {"NUL", {P("a\0b")}, 5, {P("a$00b")}},
    {"high bytes", {P("\xff\x80")}, 6, {P("$FF$80")}},
    {"66 escapes fit", {REP(" ", 66)}, 198, {REP("$20", 66)}},
    {"67 escapes do not", {REP(" ", 67)}, BG_BAD_FORMAT},
    {"198 plain and one escape", {REP("a", 198), P(" ")}, BG_BAD_FORMAT},
    {"197 plain and one escape", {REP("a", 197), P(" ")}, 200, {REP("a", 197), P("$20")}},
    {"512 bytes", {REP("f", 512)}, BG_BAD_FORMAT},
};

static void test_name_mapping(void **state)
{
    const struct name_case *c = *state;
    struct bg_buf fn = {0}, want = {0};
    append_parts(&fn, c->fn, PARTS_MAX);
    append_parts(&want, c->tube, PARTS_MAX);
    char *in = exact_copy(fn.data ? bg_buf_head(&fn) : "", fn.len);
    char tube[BG_TUBE_NAME_MAX + 1];
    int r = gm_function_to_tube(in, fn.len, tube);
    assert_int_equal(r, c->want);
    if (r > 0) {
        assert_int_equal((size_t)r, want.len);
        assert_memory_equal(tube, bg_buf_head(&want), want.len);
        assert_int_equal(tube[r], '\0');
        assert_true(bg_tube_name_valid(tube, (size_t)r));
        char back[BG_TUBE_NAME_MAX + 1];
        assert_int_equal(gm_tube_to_function(tube, back, sizeof back), (int)fn.len);
        assert_memory_equal(back, in, fn.len);
        assert_int_equal(back[fn.len], '\0');
    }
    free(in);
    bg_buf_free(&fn);
    bg_buf_free(&want);
}

/* Every byte 0x00-0xff, alone, first, inside and last, round-trips through a
 * valid tube name; a name already valid (without '$') is unchanged. */
static void test_name_every_byte(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        char fns[4][4] = {{(char)b}, {(char)b, 'x'}, {'x', (char)b, 'y'}, {'x', (char)b}};
        size_t lens[4] = {1, 2, 3, 2};
        for (int k = 0; k < 4; k++) {
            char tube[BG_TUBE_NAME_MAX + 1], back[BG_TUBE_NAME_MAX + 1];
            int r = gm_function_to_tube(fns[k], lens[k], tube);
            if (r <= 0) fail_msg("byte 0x%02x form %d: %d", b, k, r);
            assert_true(bg_tube_name_valid(tube, (size_t)r));
            assert_int_equal(strlen(tube), (size_t)r);
            int kept = bg_tube_name_valid(fns[k], lens[k]) && b != '$';
            assert_int_equal(kept, (size_t)r == lens[k] && memcmp(tube, fns[k], lens[k]) == 0);
            assert_int_equal(gm_tube_to_function(tube, back, sizeof back), (int)lens[k]);
            assert_memory_equal(back, fns[k], lens[k]);
        }
    }
    /* all 256 bytes in one name: too long (3 bytes for most) */
    char all[256];
    for (int b = 0; b < 256; b++) all[b] = (char)b;
    char tube[BG_TUBE_NAME_MAX + 1];
    assert_int_equal(gm_function_to_tube(all, 256, tube), BG_BAD_FORMAT);
    /* 64 bytes of every kind: each fits and round-trips */
    for (int start = 0; start < 256; start += 64) {
        char back[BG_TUBE_NAME_MAX + 1];
        int r = gm_function_to_tube(all + start, 64, tube);
        assert_true(r > 0); /* 64 escapes are 192 bytes: always fits */
        assert_int_equal(gm_tube_to_function(tube, back, sizeof back), 64);
        assert_memory_equal(back, all + start, 64);
    }
}

/* Decoding tube names that no function name produced. */
static void test_tube_to_function(void **state)
{
    (void)state;
    static const struct {
        const char *tube;
        int want;
        const char *fn;
        size_t out_cap;
    } cases[] = {
        {"default", 7, "default", 64},
        {"a$", 2, "a$", 64},                 /* '$' at the end: kept */
        {"a$4", 3, "a$4", 64},               /* one digit: kept */
        {"a$4G", 4, "a$4G", 64},             /* not hex: kept */
        {"a$G4", 4, "a$G4", 64},
        {"$2d$2D", 2, "--", 64},             /* either case */
        {"$$41", 2, "$A", 64},               /* the first '$' has no digits */
        {"$00", 1, "", 64},                  /* a NUL byte (length says so) */
        {"abc", 3, "abc", 4},                /* exactly fits with the NUL */
        {"abc", BG_BAD_FORMAT, NULL, 3},         /* no room for the NUL */
        {"$41$42", 2, "AB", 3},
        {"$41$42", BG_BAD_FORMAT, NULL, 2},
        {"", 0, "", 1},
        {"", BG_BAD_FORMAT, NULL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[64];
        memset(out, 0x5a, sizeof out);
        int r = gm_tube_to_function(cases[i].tube, out, cases[i].out_cap);
        if (r != cases[i].want) fail_msg("\"%s\" cap %zu: %d", cases[i].tube, cases[i].out_cap, r);
        if (r >= 0) {
            assert_memory_equal(out, cases[i].fn, (size_t)r);
            assert_int_equal(out[r], '\0');
        }
        /* nothing written past out_cap */
        for (size_t k = cases[i].out_cap; k < sizeof out; k++) assert_int_equal(out[k], 0x5a);
    }
}

/* ---- the cmd-* counters --------------------------------------------------- */

/* Which beanstalk command each request type counts as (docs/operations.md,
 * "Command counters"); every type not listed counts as none. */
static void test_request_command(void **state)
{
    (void)state;
    static const struct { uint32_t type; int cmd; } counted[] = {
        {GM_SUBMIT_JOB, BG_CMD_PUT}, {GM_SUBMIT_JOB_BG, BG_CMD_PUT},
        {GM_SUBMIT_JOB_HIGH, BG_CMD_PUT}, {GM_SUBMIT_JOB_HIGH_BG, BG_CMD_PUT},
        {GM_SUBMIT_JOB_LOW, BG_CMD_PUT}, {GM_SUBMIT_JOB_LOW_BG, BG_CMD_PUT},
        {GM_SUBMIT_JOB_EPOCH, BG_CMD_PUT},
        {GM_GRAB_JOB, BG_CMD_RESERVE_WITH_TIMEOUT}, {GM_GRAB_JOB_UNIQ, BG_CMD_RESERVE_WITH_TIMEOUT},
        {GM_GRAB_JOB_ALL, BG_CMD_RESERVE_WITH_TIMEOUT},
        {GM_WORK_COMPLETE, BG_CMD_DELETE}, {GM_WORK_FAIL, BG_CMD_DELETE},
        {GM_WORK_EXCEPTION, BG_CMD_DELETE},
        {GM_CAN_DO, BG_CMD_WATCH}, {GM_CAN_DO_TIMEOUT, BG_CMD_WATCH}, {GM_CANT_DO, BG_CMD_IGNORE},
        {GM_GET_STATUS, BG_CMD_STATS_JOB}, {GM_GET_STATUS_UNIQUE, BG_CMD_STATS_JOB},
    };
    for (uint32_t t = 0; t <= GM_TYPE_LAST + 1; t++) {
        int want = -1;
        for (size_t i = 0; i < sizeof counted / sizeof counted[0]; i++)
            if (counted[i].type == t) want = counted[i].cmd;
        if (gm_request_command(t) != want)
            fail_msg("type %u (%s): command %d, want %d", t, gm_type_name(t) ? gm_type_name(t) : "?",
                     gm_request_command(t), want);
    }
    assert_int_equal(gm_admin_command(GM_ADMIN_CANCEL_JOB), BG_CMD_DELETE);
    for (int c = GM_ADMIN_STATUS; c <= GM_ADMIN_UNKNOWN; c++)
        if (c != GM_ADMIN_CANCEL_JOB) assert_int_equal(gm_admin_command(c), -1);
}

/* ---- the run: one cmocka test per table row ------------------------------ */

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int main(void)
{
    size_t n = COUNT(valid_cases) + COUNT(malformed_cases) + COUNT(admin_cases) +
               COUNT(name_cases) + 9;
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    char (*names)[128] = calloc(n, sizeof *names);
    assert_non_null(tests);
    assert_non_null(names);
    size_t k = 0;
#define ROWS(table, prefix, fn)                                                   \
    for (size_t i = 0; i < COUNT(table); i++, k++) {                              \
        snprintf(names[k], sizeof names[k], "%s: %s", prefix, table[i].name);    \
        tests[k] = (struct CMUnitTest){names[k], fn, NULL, NULL, (void *)&table[i]}; \
    }
    ROWS(valid_cases, "valid", test_valid_request);
    ROWS(malformed_cases, "malformed", test_malformed_request);
    ROWS(admin_cases, "admin", test_admin_line);
    ROWS(name_cases, "name", test_name_mapping);
#undef ROWS
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_type_table);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_encode_response);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_encode_parse_round_trip);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_error_text);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_name_every_byte);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_tube_to_function);
    tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_request_command);
    int failed = _cmocka_run_group_tests("gearman_codec", tests, k, NULL, NULL);
    free(tests);
    free(names);
    return failed;
}

/* test_codec_scope.c - the beanstalk session under a scope (core/codec.c's
 * check_scope, issue 23). One case a row: an unscoped session sets the
 * engine up, a session with the row's grants sends its bytes and must get
 * exactly the expected replies (fed whole and a byte at a time), then the
 * unscoped session checks that a refusal changed nothing. Refusals are
 * counted in stat.permission_denied. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"

#define CASE_TIME ((bg_time)1000 * BG_SECOND)
#define NOTHING "(nothing)" /* grants: bg_scope_nothing() */
#define UNSCOPED "(unscoped)" /* grants: a NULL scope */

struct scope_case {
    const char *grants;     /* of one token line, or NOTHING, UNSCOPED */
    const char *setup;      /* sent by the unscoped session first */
    const char *input;      /* sent by the scoped session */
    const char *expected;   /* its replies */
    const char *check;      /* then sent by the unscoped session (or NULL) */
    const char *check_expected;
    uint64_t refusals;      /* stat.permission_denied at the end */
};

#define JOB_IN(tube) "use " tube "\r\nput 0 0 60 2\r\nhi\r\n"

static const struct scope_case cases[] = {
    /* put: produce on the used tube; the body of a refused put is skipped */
    {"produce:emails", "", "put 0 0 10 5\r\nhello\r\nuse emails\r\nput 0 0 10 5\r\nhello\r\n",
     "PERMISSION_DENIED produce:default\r\nUSING emails\r\nINSERTED 1\r\n",
     "peek 1\r\npeek-ready\r\n", "FOUND 1 5\r\nhello\r\nNOT_FOUND\r\n", 1},
    {"produce:emails", "", "put 0 0 10 5 x\r\n", "BAD_FORMAT\r\n", NULL, NULL, 0},
    /* use: produce or read */
    {"produce:emails", "", "use sms\r\nlist-tube-used\r\n",
     "PERMISSION_DENIED produce:sms\r\nUSING default\r\n", NULL, NULL, 1},
    {"read:stats-*", "", "use stats-daily\r\nput 0 0 10 2\r\nhi\r\npeek-ready\r\n",
     "USING stats-daily\r\nPERMISSION_DENIED produce:stats-daily\r\nNOT_FOUND\r\n",
     "list-tubes\r\n", "OK 28\r\n---\n- default\n- stats-daily\n\r\n", 1},
    /* watch: consume; reserve refused while a watched tube is outside */
    {"consume:emails", "", "watch sms\r\nwatch emails\r\nreserve-with-timeout 0\r\nreserve\r\n"
                           "ignore default\r\nreserve-with-timeout 0\r\nlist-tubes-watched\r\n",
     "PERMISSION_DENIED consume:sms\r\nWATCHING 2\r\nPERMISSION_DENIED consume:default\r\n"
     "PERMISSION_DENIED consume:default\r\nWATCHING 1\r\nTIMED_OUT\r\nOK 13\r\n---\n- emails\n\r\n",
     NULL, NULL, 3},
    /* a job this session reserved: delete, release, bury, touch need consume */
    {"consume:emails", JOB_IN("emails"),
     "watch emails\r\nignore default\r\nreserve-with-timeout 0\r\ntouch 1\r\nrelease 1 0 0\r\n"
     "reserve-with-timeout 0\r\nbury 1 0\r\nkick-job 1\r\n",
     "WATCHING 2\r\nWATCHING 1\r\nRESERVED 1 2\r\nhi\r\nTOUCHED\r\nRELEASED\r\nRESERVED 1 2\r\nhi\r\n"
     "BURIED\r\nPERMISSION_DENIED manage:emails\r\n",
     "peek-buried\r\n", "FOUND 1 2\r\nhi\r\n", 1},
    {"consume:emails", JOB_IN("emails"),
     "watch emails\r\nignore default\r\nreserve-with-timeout 0\r\ndelete 1\r\n",
     "WATCHING 2\r\nWATCHING 1\r\nRESERVED 1 2\r\nhi\r\nDELETED\r\n", "peek 1\r\n", "NOT_FOUND\r\n", 0},
    /* delete of a job it did not reserve: manage */
    {"consume:emails", JOB_IN("emails"), "delete 1\r\n", "PERMISSION_DENIED manage:emails\r\n",
     "peek 1\r\n", "FOUND 1 2\r\nhi\r\n", 1},
    {"manage:emails", JOB_IN("emails"), "delete 1\r\n", "DELETED\r\n", "peek 1\r\n", "NOT_FOUND\r\n", 0},
    /* release, bury, touch, reserve-job: consume */
    {"read:emails", JOB_IN("emails"), "release 1 0 0\r\nbury 1 0\r\ntouch 1\r\nreserve-job 1\r\n",
     "PERMISSION_DENIED consume:emails\r\nPERMISSION_DENIED consume:emails\r\n"
     "PERMISSION_DENIED consume:emails\r\nPERMISSION_DENIED consume:emails\r\n",
     "peek-ready\r\n", "FOUND 1 2\r\nhi\r\n", 4},
    {"consume:emails", JOB_IN("emails"), "reserve-job 1\r\n", "RESERVED 1 2\r\nhi\r\n", NULL, NULL, 0},
    /* a job whose tube the scope cannot see does not exist for it */
    {"*:emails", JOB_IN("sms"), "peek 1\r\nstats-job 1\r\ndelete 1\r\nkick-job 1\r\nreserve-job 1\r\n"
                                "touch 1\r\npeek 2\r\n",
     "NOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\n",
     "peek-ready\r\n", "FOUND 1 2\r\nhi\r\n", 6},
    /* peek, stats-job, peek-*: read */
    {"consume:emails", JOB_IN("emails"), "peek 1\r\nstats-job 1\r\n",
     "PERMISSION_DENIED read:emails\r\nPERMISSION_DENIED read:emails\r\n", NULL, NULL, 2},
    {"read:emails", JOB_IN("emails"), "peek 1\r\nuse emails\r\npeek-ready\r\npeek-delayed\r\n",
     "FOUND 1 2\r\nhi\r\nUSING emails\r\nFOUND 1 2\r\nhi\r\nNOT_FOUND\r\n", NULL, NULL, 0},
    {"produce:default", "", "peek-ready\r\npeek-delayed\r\npeek-buried\r\n",
     "PERMISSION_DENIED read:default\r\nPERMISSION_DENIED read:default\r\nPERMISSION_DENIED read:default\r\n",
     NULL, NULL, 3},
    /* kick, kick-job, pause-tube: manage */
    {"produce,read:emails", JOB_IN("emails"), "use emails\r\nkick 10\r\nkick-job 1\r\npause-tube emails 10\r\n",
     "USING emails\r\nPERMISSION_DENIED manage:emails\r\nPERMISSION_DENIED manage:emails\r\n"
     "PERMISSION_DENIED manage:emails\r\n",
     "stats-tube emails\r\n", NULL, 3},
    {"read:emails", "", "pause-tube -x 10\r\npause-tube  10\r\n", "BAD_FORMAT\r\nBAD_FORMAT\r\n", NULL, NULL, 0},
    {"manage,read:emails", JOB_IN("emails"), "use emails\r\nkick 10\r\npause-tube emails 0\r\n",
     "USING emails\r\nKICKED 0\r\nPAUSED\r\n", NULL, NULL, 0},
    /* stats-tube: read, asked before the tube is looked up */
    {"produce:emails", JOB_IN("emails"), "stats-tube emails\r\nstats-tube nosuch\r\n",
     "PERMISSION_DENIED read:emails\r\nPERMISSION_DENIED read:nosuch\r\n", NULL, NULL, 2},
    {"read:*", "", "stats-tube nosuch\r\n", "NOT_FOUND\r\n", NULL, NULL, 0},
    /* stats: read on some tube */
    {"produce:emails consume:emails", "", "stats\r\n", "PERMISSION_DENIED read:*\r\n", NULL, NULL, 1},
    /* list-tubes: only what the scope sees; list-tubes-watched: its own */
    {"consume:emails-* produce:sms", JOB_IN("emails") JOB_IN("emails-eu") JOB_IN("sms") JOB_IN("other"),
     "list-tubes\r\nlist-tubes-watched\r\n",
     "OK 22\r\n---\n- emails-eu\n- sms\n\r\nOK 14\r\n---\n- default\n\r\n", NULL, NULL, 0},
    /* a certificate no identity line matches: nothing at all */
    {NOTHING, JOB_IN("emails"),
     "list-tubes\r\nput 0 0 10 1\r\nx\r\nuse emails\r\nwatch emails\r\nreserve-with-timeout 0\r\n"
     "peek 1\r\ndelete 1\r\nstats\r\nstats-tube emails\r\nlist-tube-used\r\nquit\r\n",
     "OK 4\r\n---\n\r\nPERMISSION_DENIED produce:default\r\nPERMISSION_DENIED produce:emails\r\n"
     "PERMISSION_DENIED consume:emails\r\nPERMISSION_DENIED consume:default\r\nNOT_FOUND\r\n"
     "NOT_FOUND\r\nPERMISSION_DENIED read:*\r\nPERMISSION_DENIED read:emails\r\nUSING default\r\n",
     "peek 1\r\n", "FOUND 1 2\r\nhi\r\n", 8},
    /* unscoped: the reference's behaviour */
    {UNSCOPED, JOB_IN("sms"), "put 0 0 10 2\r\nhi\r\ndelete 1\r\nstats-tube nosuch\r\n",
     "INSERTED 2\r\nDELETED\r\nNOT_FOUND\r\n", NULL, NULL, 0},
    /* grants of every kind on every tube are the same as unscoped */
    {"*:*", JOB_IN("sms"), "put 0 0 10 2\r\nhi\r\ndelete 1\r\nkick 1\r\n",
     "INSERTED 2\r\nDELETED\r\nKICKED 0\r\n", NULL, NULL, 0},
};

/* Feed in[0..len) to s, `step` bytes at a time (0: whole), keeping what is
 * not consumed as the server does. */
static void feed(struct bg_session *s, const char *in, size_t len, size_t step)
{
    struct bg_buf pending = {0};
    size_t sent = 0;
    while (sent < len && !s->stream.closing) {
        size_t n = step && len - sent > step ? step : len - sent;
        assert_int_equal(bg_buf_append(&pending, in + sent, n), 0);
        sent += n;
        size_t used = bg_session_feed(s, bg_buf_head(&pending), pending.len, CASE_TIME);
        bg_buf_consume(&pending, used);
    }
    bg_buf_free(&pending);
}

/* Take what s answered so far as a C string (the caller frees it). */
static char *take_output(struct bg_session *s)
{
    size_t n = s->stream.out.len;
    char *out = malloc(n + 1);
    assert_non_null(out);
    if (n) memcpy(out, bg_buf_head(&s->stream.out), n);
    out[n] = '\0';
    bg_buf_consume(&s->stream.out, n);
    return out;
}

static void expect_output(struct bg_session *s, const char *expected, size_t i, size_t step, const char *who)
{
    char *got = take_output(s);
    if (expected && strcmp(got, expected) != 0)
        fail_msg("case %zu (step %zu), %s:\n got      \"%s\"\n expected \"%s\"", i, step, who, got, expected);
    free(got);
}

static void run_case(size_t i, size_t step)
{
    const struct scope_case *c = &cases[i];
    struct bg_scopes *sc = NULL;
    const struct bg_scope *scope = NULL;
    if (strcmp(c->grants, NOTHING) == 0) {
        scope = bg_scope_nothing();
    } else if (strcmp(c->grants, UNSCOPED) != 0) {
        char line[512], err[128];
        snprintf(line, sizeof line, "token-%zu %s\n", i, c->grants);
        if (bg_scopes_parse(&sc, line, strlen(line), err, sizeof err) != 0) fail_msg("case %zu: %s", i, err);
        scope = bg_scopes_token_scope(sc, 0);
        assert_non_null(scope);
    }
    struct bg_engine e;
    struct bg_session admin, scoped;
    assert_int_equal(bg_engine_init(&e, BG_JOB_SIZE_DEFAULT, NULL), 0);
    assert_int_equal(bg_session_init(&e, &admin, NULL, NULL), 0);
    assert_int_equal(bg_session_init(&e, &scoped, NULL, NULL), 0);
    scoped.scope = scope;
    feed(&admin, c->setup, strlen(c->setup), 0);
    free(take_output(&admin));
    feed(&scoped, c->input, strlen(c->input), step);
    expect_output(&scoped, c->expected, i, step, "the scoped session");
    if (c->check) {
        feed(&admin, c->check, strlen(c->check), 0);
        expect_output(&admin, c->check_expected, i, step, "the check");
    }
    if (e.stat.permission_denied != c->refusals)
        fail_msg("case %zu (step %zu): %llu refusals counted, expected %llu", i, step,
                 (unsigned long long)e.stat.permission_denied, (unsigned long long)c->refusals);
    const char *broken;
    if (bg_engine_audit(&e, &broken) != 0) fail_msg("case %zu: engine audit: %s", i, broken);
    bg_session_close(&scoped, CASE_TIME);
    bg_session_close(&admin, CASE_TIME);
    bg_engine_destroy(&e);
    bg_scopes_free(sc);
}

static void test_scope_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(i, 0);
        run_case(i, 1);
        run_case(i, 7);
    }
}

/* A refused pause-tube leaves the tube unpaused (the case above checks
 * only that the reply is a refusal; here the state). */
static void test_refusal_changes_nothing(void **state)
{
    (void)state;
    struct bg_scopes *sc;
    char err[128];
    const char *line = "tok read:emails\n";
    assert_int_equal(bg_scopes_parse(&sc, line, strlen(line), err, sizeof err), 0);
    struct bg_engine e;
    struct bg_session admin, scoped;
    assert_int_equal(bg_engine_init(&e, BG_JOB_SIZE_DEFAULT, NULL), 0);
    assert_int_equal(bg_session_init(&e, &admin, NULL, NULL), 0);
    assert_int_equal(bg_session_init(&e, &scoped, NULL, NULL), 0);
    scoped.scope = bg_scopes_token_scope(sc, 0);
    const char *setup = JOB_IN("emails") "put 0 0 60 2\r\nhi\r\nwatch emails\r\nreserve-with-timeout 0\r\n";
    feed(&admin, setup, strlen(setup), 0);
    free(take_output(&admin));
    uint64_t jobs = e.stat.total_jobs;
    const char *in = "pause-tube emails 100\r\ndelete 1\r\nkick-job 1\r\nuse emails\r\nkick 5\r\n";
    feed(&scoped, in, strlen(in), 0);
    free(take_output(&scoped));
    struct bg_tube *t = bg_tube_find(&e, "emails");
    assert_non_null(t);
    struct bg_stats_tube st;
    bg_stats_tube(t, CASE_TIME, &st);
    assert_int_equal(st.pause_s, 0);
    assert_int_equal(st.cmd_pause, 0);
    assert_int_equal(st.reserved, 1);
    assert_int_equal(st.ready, 1);
    assert_int_equal(e.stat.total_jobs, jobs);
    assert_int_equal(e.stat.permission_denied, 4);
    bg_session_close(&scoped, CASE_TIME);
    bg_session_close(&admin, CASE_TIME);
    bg_engine_destroy(&e);
    bg_scopes_free(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scope_cases),
        cmocka_unit_test(test_refusal_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_wal.c - when a reply may go (io/wal.c): positions and holds, on a
 * real log in a temporary directory (the loop is this test's own event
 * base: nothing is written until the test hands the log its batch). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../io/wal.h"
#include "tempdir.h"

#define T0 ((bg_time)1000 * BG_SECOND)

struct log_world {
    char dir[40];
    struct event_base *base;
    struct bg_engine engine;
    struct bg_client client;
    struct wal *wal;
};

static void open_world(struct log_world *w, int fsync_ms)
{
    memset(w, 0, sizeof *w);
    tempdir_make(w->dir, sizeof w->dir, "wal");
    w->base = event_base_new();
    assert_non_null(w->base);
    assert_int_equal(bg_engine_init(&w->engine, 1000, NULL), 0);
    struct wal_config cfg = {.dir = w->dir, .fsync_ms = fsync_ms, .segment_size = 1 << 20};
    assert_int_equal(wal_open(&w->wal, &cfg, &w->engine, w->base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w->engine, &w->client, &bg_client_ops_never_wait, NULL), 0);
}

static void close_world(struct log_world *w)
{
    bg_client_close(&w->client, T0);
    wal_close(w->wal);
    bg_engine_destroy(&w->engine);
    event_base_free(w->base);
    tempdir_remove(w->dir);
}

/* Put a job (its records appended); the id. */
static uint64_t put(struct log_world *w)
{
    uint64_t id;
    assert_int_equal(bg_put_copy(&w->client, "t", 0, 0, 60, "x", 1, T0, &id), 0);
    return id;
}

/* The log position a put's reply depends on (engine->reply_pos, zeroed
 * first as a front-end does). */
static uint64_t put_position(struct log_world *w, uint64_t *id)
{
    w->engine.reply_pos = 0;
    uint64_t got = put(w);
    if (id) *id = got;
    return w->engine.reply_pos;
}

/* The position a reply showing job id depends on. */
static uint64_t show_position(struct log_world *w, uint64_t id)
{
    w->engine.reply_pos = 0;
    struct bg_job *j = bg_job_find(&w->engine, id);
    assert_non_null(j);
    bg_engine_show_job(&w->engine, j);
    return w->engine.reply_pos;
}

/* Which holds were called back, in order. */
static struct {
    struct wal_hold *called[8];
    int n;
} calls;

static void durable(struct wal_hold *h) { calls.called[calls.n++] = h; }

/* Hand the log its batch and run the loop until the flusher reports. */
static void flush(struct log_world *w)
{
    wal_kick(w->wal);
    assert_int_equal(event_base_loop(w->base, EVLOOP_ONCE), 0);
}

/* -f 0: each put carries a later position; holds are called back in
 * position order once it is on disk, a hold taken back is not called, a
 * position already on disk is called back at once. */
static void test_holds_in_position_order(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 0);
    memset(&calls, 0, sizeof calls);
    struct wal_hold h1 = {0}, h2 = {0}, h3 = {0}, h4 = {0};
    uint64_t m1 = put_position(&w, NULL);
    uint64_t m2 = put_position(&w, NULL);
    assert_true(0 < m1 && m1 < m2);
    assert_false(wal_reply_may_go(w.wal, m1));
    wal_hold(w.wal, &h2, m2, durable);
    wal_hold(w.wal, &h1, m1, durable); /* a lower position queued later goes first */
    wal_hold(w.wal, &h3, m2, durable);
    wal_unhold(w.wal, &h3);            /* its reply went away */
    wal_unhold(w.wal, &h3);            /* twice is harmless */
    assert_int_equal(calls.n, 0);
    flush(&w);
    assert_true(wal_reply_may_go(w.wal, m2));
    assert_int_equal(calls.n, 2);
    assert_ptr_equal(calls.called[0], &h1);
    assert_ptr_equal(calls.called[1], &h2);
    wal_hold(w.wal, &h4, m1, durable); /* on disk already */
    assert_int_equal(calls.n, 3);
    assert_ptr_equal(calls.called[2], &h4);
    close_world(&w);
}

/* -f 0: a reply that only shows a job (RESERVED, FOUND) depends on the
 * job's put while that is not on disk, and on nothing once it is; a delete
 * depends on its own record. */
static void test_showing_a_job_waits_for_its_put(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 0);
    uint64_t id;
    uint64_t put_pos = put_position(&w, &id);
    uint64_t shown = show_position(&w, id);
    assert_true(shown >= put_pos);
    assert_false(wal_reply_may_go(w.wal, shown));
    flush(&w);
    assert_true(wal_reply_may_go(w.wal, shown));
    assert_int_equal(show_position(&w, id), 0);
    w.engine.reply_pos = 0;
    assert_int_equal(bg_delete(&w.client, id, T0), 0);
    assert_true(w.engine.reply_pos > put_pos);
    assert_false(wal_reply_may_go(w.wal, w.engine.reply_pos));
    close_world(&w);
}

/* -f 50: replies do not wait for their records, except for an id beyond
 * the logged id floor (the first put after a start); without a log
 * nothing waits. */
static void test_only_new_ids_wait_with_fsync_interval(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 50);
    uint64_t id;
    uint64_t first = put_position(&w, &id);
    assert_true(first > 0); /* its id is beyond the floor the log holds */
    assert_false(wal_reply_may_go(w.wal, first));
    assert_int_equal(show_position(&w, id), first);
    flush(&w);              /* the first batch after a start is synced */
    assert_true(wal_reply_may_go(w.wal, first));
    assert_int_equal(put_position(&w, NULL), 0);
    assert_int_equal(show_position(&w, id), 0);
    w.engine.reply_pos = 0;
    assert_int_equal(bg_delete(&w.client, id, T0), 0);
    assert_int_equal(w.engine.reply_pos, 0);
    assert_true(wal_reply_may_go(NULL, 5));
    close_world(&w);
}

/* Ids never come back: the log holds an id floor ahead of the ids given
 * out, so a start continues above every id a reply may have shown, even
 * one whose put a machine crash lost (replies with -f N > 0 do not wait
 * for the put). */
static void test_ids_continue_above_the_floor(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 50);
    uint64_t id = put(&w);
    flush(&w);
    bg_client_close(&w.client, T0);
    wal_close(w.wal);
    bg_engine_destroy(&w.engine);
    assert_int_equal(bg_engine_init(&w.engine, 1000, NULL), 0);
    struct wal_config cfg = {.dir = w.dir, .fsync_ms = 50, .segment_size = 1 << 20};
    assert_int_equal(wal_open(&w.wal, &cfg, &w.engine, w.base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w.engine, &w.client, &bg_client_ops_never_wait, NULL), 0);
    assert_true(put(&w) > id + (1u << 19)); /* above the floor, not id + 1 */
    close_world(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holds_in_position_order),
        cmocka_unit_test(test_showing_a_job_waits_for_its_put),
        cmocka_unit_test(test_only_new_ids_wait_with_fsync_interval),
        cmocka_unit_test(test_ids_continue_above_the_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

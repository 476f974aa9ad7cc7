/* test_wal.c - durable acknowledgement in io/wal.c: marks and holds, on a
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

/* Put a job: one record appended. */
static void put(struct log_world *w)
{
    uint64_t id;
    assert_int_equal(bg_put_copy(&w->client, "t", 0, 0, 60, "x", 1, T0, &id), 0);
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

/* -f 0: each put moves the mark; holds are called back in mark order once
 * their mark is on disk, a hold taken back is not called, a mark already on
 * disk is called back at once. */
static void test_holds_in_mark_order(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 0);
    memset(&calls, 0, sizeof calls);
    struct wal_hold h1 = {0}, h2 = {0}, h3 = {0}, h4 = {0};
    uint64_t m0 = wal_mark(w.wal);
    put(&w);
    uint64_t m1 = wal_mark(w.wal);
    put(&w);
    uint64_t m2 = wal_mark(w.wal);
    assert_true(m0 < m1 && m1 < m2);
    assert_false(wal_reached(w.wal, m1));
    wal_hold(w.wal, &h2, m2, durable);
    wal_hold(w.wal, &h1, m1, durable); /* a lower mark queued later goes first */
    wal_hold(w.wal, &h3, m2, durable);
    wal_unhold(w.wal, &h3);            /* its reply went away */
    wal_unhold(w.wal, &h3);            /* twice is harmless */
    assert_int_equal(calls.n, 0);
    flush(&w);
    assert_true(wal_reached(w.wal, m2));
    assert_int_equal(calls.n, 2);
    assert_ptr_equal(calls.called[0], &h1);
    assert_ptr_equal(calls.called[1], &h2);
    wal_hold(w.wal, &h4, m1, durable); /* on disk already */
    assert_int_equal(calls.n, 3);
    assert_ptr_equal(calls.called[2], &h4);
    close_world(&w);
}

/* Replies wait only with -f 0: otherwise the mark is 0; without a log too. */
static void test_no_mark_without_durable_replies(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 50);
    put(&w);
    assert_int_equal(wal_mark(w.wal), 0);
    assert_int_equal(wal_mark(NULL), 0);
    assert_true(wal_reached(NULL, 5));
    close_world(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holds_in_mark_order),
        cmocka_unit_test(test_no_mark_without_durable_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

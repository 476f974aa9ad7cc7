/* test_history.c - cmocka unit tests of the server's history and the
 * tubes' rates (core/history.c), on injected time: nothing sleeps.
 *
 *   test_history                 the tests
 *   test_history --bench TUBES   the cost of one tube sweep and of the rates
 *                                of every tube with TUBES tubes, and the
 *                                bytes a tube takes (docs/performance.md)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core.h"

#define T0 (1000 * BG_SECOND + BG_SECOND / 3) /* an arbitrary start, inside a second */
#define SEC(s) ((bg_time)(s) * BG_SECOND)

/* A reading with counters put, reserve, delete and every gauge g. */
static struct bg_history_reading reading(uint64_t put, uint64_t reserve, uint64_t del, uint64_t g)
{
    struct bg_history_reading r;
    r.v[BG_HISTORY_PUT] = put;
    r.v[BG_HISTORY_RESERVE] = reserve;
    r.v[BG_HISTORY_DELETE] = del;
    for (int s = BG_HISTORY_COUNTERS; s < BG_HISTORY_SERIES; s++) r.v[s] = g + (uint64_t)s;
    return r;
}

static struct bg_history *new_history(void)
{
    struct bg_history *h = malloc(sizeof *h);
    assert_non_null(h);
    return h;
}

static uint64_t series[BG_HISTORY_SAMPLES];

static void test_fresh_history_is_empty_and_fills_a_second_at_a_time(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(100, 50, 10, 7);
    bg_history_init(h, &r, T0);
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), 0);
    /* later in the same second: nothing */
    r = reading(105, 50, 10, 7);
    assert_int_equal(bg_history_sample(h, &r, T0 + BG_SECOND / 2), 0);
    assert_int_equal(h->count, 0);
    /* the next second: one sample of what changed since the start */
    r = reading(112, 53, 11, 8);
    bg_time next = T0 - T0 % BG_SECOND + BG_SECOND + BG_SECOND / 100;
    assert_int_equal(bg_history_sample(h, &r, next), 1);
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), 1);
    assert_int_equal(series[0], 12);
    bg_history_series(h, BG_HISTORY_RESERVE, series);
    assert_int_equal(series[0], 3);
    bg_history_series(h, BG_HISTORY_DELETE, series);
    assert_int_equal(series[0], 1);
    bg_history_series(h, BG_HISTORY_READY, series);
    assert_int_equal(series[0], 8 + BG_HISTORY_READY);
    bg_history_series(h, BG_HISTORY_CONNECTIONS, series);
    assert_int_equal(series[0], 8 + BG_HISTORY_CONNECTIONS);
    assert_int_equal(h->second, next / BG_SECOND);
    /* a timer that fires twice in one second adds nothing the second time */
    assert_int_equal(bg_history_sample(h, &r, next + BG_SECOND / 2), 0);
    /* time that goes back (it cannot, but) adds nothing */
    assert_int_equal(bg_history_sample(h, &r, T0), 0);
    assert_int_equal(h->count, 1);
    free(h);
}

static void test_rates_are_counter_deltas_oldest_first(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(0, 0, 0, 0);
    bg_history_init(h, &r, T0);
    uint64_t put = 0;
    for (uint64_t s = 1; s <= 10; s++) {
        put += s * 10; /* 10, 20, ... 100 puts in second s */
        r = reading(put, put / 2, put / 5, s);
        assert_int_equal(bg_history_sample(h, &r, T0 + SEC(s)), 1);
    }
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), 10);
    for (uint64_t i = 0; i < 10; i++) assert_int_equal(series[i], (i + 1) * 10);
    bg_history_series(h, BG_HISTORY_BURIED, series);
    for (uint64_t i = 0; i < 10; i++) assert_int_equal(series[i], i + 1 + BG_HISTORY_BURIED);
    free(h);
}

static void test_a_counter_that_wraps_gives_the_right_rate(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(UINT64_MAX - 2, 0, 0, 0);
    bg_history_init(h, &r, T0);
    r = reading(4, 0, 0, 0); /* 7 more, across 2^64 */
    bg_history_sample(h, &r, T0 + SEC(1));
    bg_history_series(h, BG_HISTORY_PUT, series);
    assert_int_equal(series[0], 7);
    free(h);
}

static void test_the_ring_wraps_and_keeps_the_newest_900(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(0, 0, 0, 0);
    bg_history_init(h, &r, T0);
    uint64_t put = 0;
    const uint64_t seconds = BG_HISTORY_SAMPLES * 2 + 37;
    for (uint64_t s = 1; s <= seconds; s++) {
        put += s; /* s puts in second s */
        r = reading(put, 0, 0, s);
        bg_history_sample(h, &r, T0 + SEC(s));
        uint32_t want = s < BG_HISTORY_SAMPLES ? (uint32_t)s : BG_HISTORY_SAMPLES;
        assert_int_equal(h->count, want);
    }
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), BG_HISTORY_SAMPLES);
    for (uint64_t i = 0; i < BG_HISTORY_SAMPLES; i++)
        assert_int_equal(series[i], seconds - BG_HISTORY_SAMPLES + 1 + i);
    bg_history_series(h, BG_HISTORY_READY, series);
    assert_int_equal(series[BG_HISTORY_SAMPLES - 1], seconds + BG_HISTORY_READY);
    free(h);
}

/* The loop stalled: the growth over the gap is spread evenly over its
 * seconds in whole numbers (the newest get the remainder), its sum is
 * exact, and every missed second gets the gauges read at its end. */
static void test_a_stalled_loop_spreads_the_gap_evenly(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(1000, 0, 0, 1);
    bg_history_init(h, &r, T0);
    r = reading(1005, 0, 0, 1);
    bg_history_sample(h, &r, T0 + SEC(1)); /* 5 */
    r = reading(1005 + 23, 6, 0, 9);
    assert_int_equal(bg_history_sample(h, &r, T0 + SEC(5)), 4); /* 4 s at once: 23 puts, 6 reserves */
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), 5);
    uint64_t want_put[] = {5, 5, 6, 6, 6};
    for (int i = 0; i < 5; i++) assert_int_equal(series[i], want_put[i]);
    bg_history_series(h, BG_HISTORY_RESERVE, series);
    uint64_t want_reserve[] = {0, 1, 1, 2, 2};
    for (int i = 0; i < 5; i++) assert_int_equal(series[i], want_reserve[i]);
    bg_history_series(h, BG_HISTORY_READY, series);
    assert_int_equal(series[0], 1 + BG_HISTORY_READY);
    for (int i = 1; i < 5; i++) assert_int_equal(series[i], 9 + BG_HISTORY_READY);
    assert_int_equal(h->second, (T0 + SEC(5)) / BG_SECOND);
    free(h);
}

/* A gap longer than the ring (a machine that slept) fills it whole with
 * the gap's even share, and the next second carries on from there. */
static void test_a_gap_longer_than_the_ring_fills_it(void **state)
{
    (void)state;
    struct bg_history *h = new_history();
    struct bg_history_reading r = reading(0, 0, 0, 0);
    bg_history_init(h, &r, T0);
    r = reading(3, 0, 0, 0);
    bg_history_sample(h, &r, T0 + SEC(1));
    const uint64_t gap = 3600;
    r = reading(3 + gap * 2 + 100, 0, 0, 5); /* 2 a second, 100 more spread over the newest */
    assert_int_equal(bg_history_sample(h, &r, T0 + SEC(1 + gap)), BG_HISTORY_SAMPLES);
    assert_int_equal(bg_history_series(h, BG_HISTORY_PUT, series), BG_HISTORY_SAMPLES);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < BG_HISTORY_SAMPLES; i++) {
        assert_int_equal(series[i], i < BG_HISTORY_SAMPLES - 100 ? 2 : 3);
        sum += series[i];
    }
    assert_int_equal(sum, BG_HISTORY_SAMPLES * 2 + 100);
    r = reading(3 + gap * 2 + 100 + 9, 0, 0, 5);
    assert_int_equal(bg_history_sample(h, &r, T0 + SEC(2 + gap)), 1);
    bg_history_series(h, BG_HISTORY_PUT, series);
    assert_int_equal(series[BG_HISTORY_SAMPLES - 1], 9);
    free(h);
}

/* ---- the tubes' rates ----------------------------------------------------- */

struct rig {
    struct bg_engine engine;
    struct bg_client client;
    struct bg_history history;
};

static struct rig *new_rig(void)
{
    struct rig *g = calloc(1, sizeof *g);
    assert_non_null(g);
    assert_int_equal(bg_engine_init(&g->engine, 65535, NULL), 0);
    assert_int_equal(bg_client_init(&g->engine, &g->client, &bg_client_ops_never_wait, g), 0);
    return g;
}

static void free_rig(struct rig *g)
{
    bg_client_close(&g->client, T0);
    bg_engine_destroy(&g->engine);
    free(g);
}

static void put_n(struct rig *g, const char *tube, int n, bg_time now)
{
    for (int i = 0; i < n; i++) {
        uint64_t id;
        assert_int_equal(bg_put_copy(&g->client, tube, 0, 0, 60, "x", 1, now, &id), 0);
    }
}

static void delete_ready(struct rig *g, const char *tube, int n, bg_time now)
{
    struct bg_tube *t = bg_tube_find(&g->engine, tube);
    assert_non_null(t);
    for (int i = 0; i < n; i++) {
        struct bg_job *j = bg_peek(t, BG_JOB_READY);
        assert_non_null(j);
        assert_int_equal(bg_delete(&g->client, j->id, now), 0);
    }
}

static void rates_of(struct rig *g, const char *tube, bg_time now, double *put, double *del)
{
    struct bg_tube *t = bg_tube_find(&g->engine, tube);
    assert_non_null(t);
    bg_tube_rates(&g->history, t, now, put, del);
}

static void start_history(struct rig *g, bg_time now)
{
    struct bg_history_reading r;
    bg_history_read_engine(&g->engine, 0, &r);
    bg_history_init(&g->history, &r, now);
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, now), 1);
}

static void test_tube_rates_count_since_the_sweep_before_the_latest(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    put_n(g, "a", 40, T0); /* before the start: not in any rate */
    start_history(g, T0);
    double put, del;
    rates_of(g, "a", T0 + SEC(1), &put, &del);
    assert_true(put == 0 && del == 0);
    /* 30 puts and 10 deletes a second after the start: over the 5 s the
     * start counts as quiet, and the 1 s since */
    put_n(g, "a", 30, T0 + SEC(1));
    delete_ready(g, "a", 10, T0 + SEC(1));
    rates_of(g, "a", T0 + SEC(1), &put, &del);
    assert_float_equal(put, 30.0 / 6, 1e-9);
    assert_float_equal(del, 10.0 / 6, 1e-9);
    /* no sweep before 5 seconds of the clock began */
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(4)), 0);
    bg_time s1 = T0 + SEC(5);
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, s1), 1);
    rates_of(g, "a", s1 + SEC(2), &put, &del);
    assert_float_equal(put, 30.0 / 7, 1e-9); /* since T0 (the sweep before the latest) */
    bg_time s2 = s1 + SEC(5);
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, s2), 1);
    put_n(g, "a", 20, s2 + SEC(1));
    rates_of(g, "a", s2 + SEC(3), &put, &del);
    assert_float_equal(put, 20.0 / 8, 1e-9); /* since s1: the puts before it are out */
    assert_float_equal(del, 0, 1e-9);
    bg_time s3 = s2 + SEC(5);
    bg_history_sweep_tubes(&g->history, &g->engine, s3);
    bg_history_sweep_tubes(&g->history, &g->engine, s3 + SEC(5));
    rates_of(g, "a", s3 + SEC(6), &put, &del);
    assert_true(put == 0 && del == 0); /* idle for two sweeps */
    free_rig(g);
}

/* A tube made after the latest sweep, and one made between the last two,
 * had nothing before: their first puts count from the sweep before the
 * latest, like every other tube's, so a page shows them at once. */
static void test_a_new_tube_has_rates_at_once(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    start_history(g, T0);
    bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(5));
    put_n(g, "fresh", 12, T0 + SEC(6)); /* made after the latest sweep */
    double put, del;
    rates_of(g, "fresh", T0 + SEC(6), &put, &del);
    assert_float_equal(put, 12.0 / 6, 1e-9);
    bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(10)); /* it was made between the last two */
    rates_of(g, "fresh", T0 + SEC(11), &put, &del);
    assert_float_equal(put, 12.0 / 6, 1e-9); /* since T0 + 5 */
    rates_of(g, "default", T0 + SEC(11), &put, &del);
    assert_true(put == 0 && del == 0); /* an idle tube */
    free_rig(g);
}

/* A sweep that comes late (the loop stalled) still divides by the time
 * that really passed. */
static void test_a_late_sweep_divides_by_the_real_time(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    start_history(g, T0);
    bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(5));
    put_n(g, "a", 60, T0 + SEC(6));
    bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(17)); /* 12 s late */
    double put, del;
    rates_of(g, "a", T0 + SEC(20), &put, &del);
    assert_float_equal(put, 60.0 / 15, 1e-9);
    free_rig(g);
}

/* The low 32 bits of a counter are enough: a tube's counter across 2^32. */
static void test_tube_counters_across_2_to_the_32(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    put_n(g, "a", 1, T0);
    struct bg_tube *t = bg_tube_find(&g->engine, "a");
    t->stat.total_jobs = UINT32_MAX - 1;
    start_history(g, T0);
    t->stat.total_jobs += 10;
    double put, del;
    bg_tube_rates(&g->history, t, T0 + SEC(5), &put, &del);
    assert_float_equal(put, 1.0, 1e-9);
    free_rig(g);
}

static void test_no_rates_before_the_first_sweep(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    put_n(g, "a", 5, T0);
    memset(&g->history, 0, sizeof g->history);
    double put = -1, del = -1;
    rates_of(g, "a", T0 + SEC(1), &put, &del);
    assert_true(put == 0 && del == 0);
    free_rig(g);
}

/* ---- a sweep in steps ---------------------------------------------------- */

#define MS(n) ((bg_time)(n) * 1000000)

/* Tubes "<prefix><i>" for i in [0, n), each made by a put at now. */
static void make_tubes(struct rig *g, const char *prefix, uint32_t n, bg_time now)
{
    char name[32];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s%u", prefix, i);
        put_n(g, name, 1, now);
    }
}

/* The number i of tube "<prefix><i>", or -1 for another tube. */
static long tube_number(const struct bg_tube *t, const char *prefix)
{
    size_t len = strlen(prefix);
    return strncmp(t->name, prefix, len) == 0 ? strtol(t->name + len, NULL, 10) : -1;
}

/* For each tube "<prefix><i>" that sweep `sweep` has noted and noted_at[i]
 * does not have yet, noted_at[i] = at. Returns how many tubes (of any
 * name) the sweep has noted. */
static uint32_t record_noted(const struct rig *g, const char *prefix, uint32_t sweep, bg_time at,
                             bg_time *noted_at)
{
    uint32_t noted = 0;
    for (uint32_t k = 0; k < g->engine.tube_count; k++) {
        const struct bg_tube *t = g->engine.tube_list[k];
        if (t->rate_marks.sweep != sweep) continue;
        noted++;
        long i = tube_number(t, prefix);
        if (i >= 0 && noted_at[i] == 0) noted_at[i] = at;
    }
    return noted;
}

/* `puts` over the seconds from `since` to `now`, as a rate must be (to the
 * microsecond the marks keep: these tests' times are whole microseconds). */
static void check_rate(double rate, uint32_t puts, bg_time since, bg_time now)
{
    double want = puts / ((double)(now - since) / (double)BG_SECOND);
    assert_float_equal(rate, want, 1e-12 * (want > 1 ? want : 1));
}

enum { STEPPED_TUBES = 10 * BG_HISTORY_SWEEP_STEP + 123 };

/* 10 steps and a bit: each step notes BG_HISTORY_SWEEP_STEP tubes; each
 * tube's two marks are taken by the same step of two sweeps that start 5 s
 * apart (so 5 s apart but for the steps' different pace); every rate is
 * exact over its tube's own window, in the middle of a sweep as after it. */
static void test_a_sweep_goes_in_steps_and_its_rates_are_exact(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    const uint32_t n = STEPPED_TUBES, all = n + 1; /* and "default" */
    const uint32_t steps = (all + BG_HISTORY_SWEEP_STEP - 1) / BG_HISTORY_SWEEP_STEP;
    bg_time *noted1 = calloc(n, sizeof *noted1), *noted2 = calloc(n, sizeof *noted2);
    assert_true(noted1 && noted2);
    make_tubes(g, "t", n, T0 - SEC(1));
    /* sweep 1 at T0, a step a millisecond */
    struct bg_history_reading r;
    bg_history_read_engine(&g->engine, 0, &r);
    bg_history_init(&g->history, &r, T0);
    for (uint32_t k = 0; k < steps; k++) {
        assert_true(k == 0 || bg_history_sweeping(&g->history));
        assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, T0 + MS(k)), 1);
        uint32_t noted = record_noted(g, "t", 1, T0 + MS(k), noted1);
        assert_int_equal(noted, (k + 1) * BG_HISTORY_SWEEP_STEP < all ? (k + 1) * BG_HISTORY_SWEEP_STEP : all);
        if (k == 0) { /* a tube the first sweep has not come to has no rates yet */
            double put = -1, del = -1;
            rates_of(g, "t0", T0 + MS(k), &put, &del);
            assert_true(put == 0 && del == 0);
        }
    }
    assert_false(bg_history_sweeping(&g->history));
    for (uint32_t i = 0; i < n; i++) assert_true(noted1[i] != 0);
    /* i % 7 puts into tube i between the sweeps */
    char name[32];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "t%u", i);
        put_n(g, name, (int)(i % 7), T0 + SEC(2));
    }
    /* sweep 2 at T0 + 5 s, a step every 3 ms; rates checked in its middle */
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, T0 + SEC(4)), 0);
    const bg_time s2 = T0 + SEC(5);
    for (uint32_t k = 0; k < steps; k++) {
        bg_time now = s2 + MS(3 * k);
        assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, now), 1);
        record_noted(g, "t", 2, now, noted2);
        if (k != steps / 2) continue;
        for (uint32_t i = 0; i < n; i++) {
            snprintf(name, sizeof name, "t%u", i);
            double put, del;
            rates_of(g, name, now + MS(1), &put, &del);
            /* noted by sweep 2: since its sweep-1 mark; not yet: since 5 s before it */
            check_rate(put, i % 7, noted2[i] ? noted1[i] : noted1[i] - SEC(5), now + MS(1));
            assert_true(del == 0);
        }
    }
    assert_false(bg_history_sweeping(&g->history));
    for (uint32_t i = 0; i < n; i++) {
        bg_time step = (noted1[i] - T0) / MS(1);
        assert_true(noted2[i] - noted1[i] == SEC(5) + step * MS(2)); /* same step, 5 s apart */
        snprintf(name, sizeof name, "t%u", i);
        double put, del;
        rates_of(g, name, T0 + SEC(6), &put, &del);
        check_rate(put, i % 7, noted1[i], T0 + SEC(6));
    }
    /* a tube made after the sweeps counts from the start of the one before the latest */
    put_n(g, "late", 3, T0 + SEC(6));
    double put, del;
    rates_of(g, "late", T0 + SEC(7), &put, &del);
    check_rate(put, 3, T0, T0 + SEC(7));
    free(noted1);
    free(noted2);
    free_rig(g);
}

/* Tube "<prefix><i>", which must exist. */
static struct bg_tube *tube_named(struct rig *g, const char *prefix, uint32_t i)
{
    char name[32];
    snprintf(name, sizeof name, "%s%u", prefix, i);
    struct bg_tube *t = bg_tube_find(&g->engine, name);
    assert_non_null(t);
    return t;
}

/* Free the tube in tube_list[slot] (it has ready jobs and nothing else);
 * its number if it was "<prefix><i>", else -1. */
static long free_tube_at(struct rig *g, uint32_t slot, const char *prefix, bg_time now)
{
    struct bg_tube *t = g->engine.tube_list[slot];
    long i = tube_number(t, prefix);
    char name[sizeof t->name];
    memcpy(name, t->name, sizeof name);
    for (uint64_t jobs = bg_tube_index(t, BG_JOB_READY)->len; jobs > 0; jobs--)
        assert_int_equal(bg_delete(&g->client, bg_peek(t, BG_JOB_READY)->id, now), 0);
    assert_null(bg_tube_find(&g->engine, name));
    return i;
}

/* Tubes freed in the middle of a sweep move the list's last tube into their
 * slot, above the walk or below it; tubes made in the middle of it go to the
 * end. Every tube alive at the sweep's start is still noted, once (a tube
 * noted and then moved below the walk keeps its mark), and every rate,
 * of old and new tubes, is exact. */
static void test_tubes_freed_and_made_during_a_sweep(void **state)
{
    (void)state;
    struct rig *g = new_rig();
    const uint32_t n = 6 * BG_HISTORY_SWEEP_STEP + 50, made = 500;
    bg_time *noted2 = calloc(n, sizeof *noted2), *noted2_new = calloc(made, sizeof *noted2_new);
    char *freed = calloc(n, 1);
    assert_true(noted2 && noted2_new && freed);
    make_tubes(g, "t", n, T0 - SEC(1));
    start_history(g, T0);
    while (bg_history_sweeping(&g->history)) bg_history_sweep_tubes(&g->history, &g->engine, T0);
    char name[32];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "t%u", i);
        put_n(g, name, (int)(i % 5), T0 + SEC(2));
    }
    /* sweep 2: two steps, a millisecond apart */
    const bg_time s2 = T0 + SEC(5);
    uint32_t k = 0;
    for (; k < 2; k++) {
        assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, s2 + MS(k)), 1);
        record_noted(g, "t", 2, s2 + MS(k), noted2);
    }
    uint32_t left = g->history.sweep_left;
    assert_true(left > 0 && g->engine.tube_count - left == 2 * BG_HISTORY_SWEEP_STEP);
    /* between the turns: 100 noted tubes freed (above the walk); 200 tubes
     * the walk has not come to freed, the walk's next one first (the list's
     * last tubes, noted ones, move below the walk); 500 tubes made (at the
     * end); 100 more below the walk freed (new tubes move below it) */
    const bg_time mid = s2 + MS(1) + MS(1) / 2;
    for (uint32_t j = 0; j < 100; j++) {
        long i = free_tube_at(g, left + 7 * j, "t", mid);
        assert_true(i >= 0 && noted2[i] != 0);
        freed[i] = 1;
    }
    for (uint32_t j = 0; j < 300; j++) {
        if (j == 200) {
            make_tubes(g, "n", made, mid);
            put_n(g, "n0", 1, mid); /* n0 has 2 puts, the others 1 */
        }
        long i = free_tube_at(g, j == 0 ? left - 1 : 13 * j, "t", mid);
        assert_true(i >= 0 && noted2[i] == 0 && !freed[i]);
        freed[i] = 1;
    }
    const char *broken = NULL;
    assert_int_equal(bg_engine_audit(&g->engine, &broken), 0);
    /* the rest of the sweep, a step a millisecond */
    for (; bg_history_sweeping(&g->history); k++) {
        assert_true(k < 10);
        assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, s2 + MS(k)), 1);
        record_noted(g, "t", 2, s2 + MS(k), noted2);
        record_noted(g, "n", 2, s2 + MS(k), noted2_new);
    }
    uint32_t new_noted = 0;
    for (uint32_t i = 0; i < made; i++) new_noted += noted2_new[i] != 0;
    assert_true(new_noted > 0 && new_noted < made); /* some moved below the walk, some not */
    const bg_time now = T0 + SEC(7);
    for (uint32_t i = 0; i < n; i++) {
        if (freed[i]) continue;
        struct bg_tube *t = tube_named(g, "t", i);
        assert_int_equal(t->rate_marks.sweep, 2);
        assert_true(noted2[i] != 0);
        assert_int_equal(t->rate_marks.at_us[1], (noted2[i] - s2) / 1000); /* noted once */
        double put, del;
        bg_tube_rates(&g->history, t, now, &put, &del);
        check_rate(put, i % 5, T0, now); /* since its sweep-1 mark, at T0 */
        assert_true(del == 0);
    }
    /* a new tube counts from 0 at sweep 1's start, noted by sweep 2 or not */
    for (uint32_t i = 0; i < made; i++) {
        double put, del;
        bg_tube_rates(&g->history, tube_named(g, "n", i), now, &put, &del);
        check_rate(put, i == 0 ? 2 : 1, T0, now);
    }
    /* sweep 3 notes the new tubes sweep 2 did not: from 0 at sweep 2's start */
    const bg_time s3 = T0 + SEC(10);
    while (bg_history_sweep_tubes(&g->history, &g->engine, s3) && bg_history_sweeping(&g->history)) {}
    for (uint32_t i = 0; i < made; i++) {
        double put, del;
        bg_tube_rates(&g->history, tube_named(g, "n", i), s3 + SEC(1), &put, &del);
        if (noted2_new[i]) check_rate(put, 0, noted2_new[i], s3 + SEC(1));
        else check_rate(put, i == 0 ? 2 : 1, s2, s3 + SEC(1));
    }
    /* sweep 4: after its first step, the list's last tubes freed, more of
     * them than the walk has left above it: the walk goes on below */
    const bg_time s4 = T0 + SEC(15);
    assert_int_equal(bg_history_sweep_tubes(&g->history, &g->engine, s4), 1);
    const uint32_t before = g->engine.tube_count;
    left = g->history.sweep_left;
    for (uint32_t j = 0; j < before - left + 10; j++) {
        long i = free_tube_at(g, g->engine.tube_count - 1, "t", s4);
        if (i >= 0) freed[i] = 1;
    }
    assert_true(g->engine.tube_count < g->history.sweep_left);
    while (bg_history_sweeping(&g->history)) bg_history_sweep_tubes(&g->history, &g->engine, s4 + MS(1));
    for (uint32_t k4 = 0; k4 < g->engine.tube_count; k4++) {
        const struct bg_tube_rate_marks *m = &g->engine.tube_list[k4]->rate_marks;
        assert_int_equal(m->sweep, 4);
        assert_int_equal(m->at_us[1], 1000); /* the step after the frees */
    }
    assert_int_equal(bg_engine_audit(&g->engine, &broken), 0);
    free(noted2);
    free(noted2_new);
    free(freed);
    free_rig(g);
}

/* ---- --bench ----------------------------------------------------------------- */

/* This thread's CPU time in ns: what a step costs, apart from the time the
 * shared machine gives to others in the middle of it. */
static double clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* TUBES tubes with a job each; the medians of 21 sweeps (all their steps,
 * and the longest step of each) and of 21 rate readings of every tube, and
 * one history sample. */
static int bench(uint32_t tubes)
{
    struct rig *g = new_rig();
    char name[32];
    for (uint32_t i = 0; i < tubes; i++) {
        snprintf(name, sizeof name, "tube-%u", i);
        uint64_t id;
        if (bg_put_copy(&g->client, name, 0, 0, 60, "x", 1, T0, &id) != 0) return 1;
    }
    start_history(g, T0);
    while (bg_history_sweeping(&g->history)) bg_history_sweep_tubes(&g->history, &g->engine, T0);
    enum { RUNS = 21 };
    double sweep[RUNS], step[RUNS], rates[RUNS], sample[RUNS];
    uint32_t steps = 0;
    bg_time now = T0;
    volatile double sink = 0;
    for (int run = 0; run < RUNS; run++) {
        now += SEC(BG_HISTORY_SWEEP_S);
        sweep[run] = step[run] = 0;
        steps = 0;
        do {
            double t0 = clock_ns();
            if (bg_history_sweep_tubes(&g->history, &g->engine, now) != 1) return 1;
            double took = clock_ns() - t0;
            sweep[run] += took;
            if (took > step[run]) step[run] = took;
            steps++;
        } while (bg_history_sweeping(&g->history));
        double t1 = clock_ns();
        for (uint32_t i = 0; i < g->engine.tube_count; i++) {
            double p, d;
            bg_tube_rates(&g->history, g->engine.tube_list[i], now + SEC(1), &p, &d);
            sink += p + d;
        }
        double t2 = clock_ns();
        struct bg_history_reading r;
        bg_history_read_engine(&g->engine, 0, &r);
        bg_history_sample(&g->history, &r, now);
        double t3 = clock_ns();
        rates[run] = t2 - t1;
        sample[run] = t3 - t2;
    }
    qsort(sweep, RUNS, sizeof *sweep, cmp_double);
    qsort(step, RUNS, sizeof *step, cmp_double);
    qsort(rates, RUNS, sizeof *rates, cmp_double);
    qsort(sample, RUNS, sizeof *sample, cmp_double);
    uint32_t n = g->engine.tube_count;
    printf("tubes %u: sweep of every tube %.0f us (%.1f ns a tube, every %d s) in %u steps of %d tubes, "
           "longest step %.0f us (worst of %d: %.0f us); rates of every tube %.0f us, one history "
           "sample %.0f ns (medians of %d)\n",
           n, sweep[RUNS / 2] / 1e3, sweep[RUNS / 2] / n, BG_HISTORY_SWEEP_S, steps, BG_HISTORY_SWEEP_STEP,
           step[RUNS / 2] / 1e3, RUNS, step[RUNS - 1] / 1e3, rates[RUNS / 2] / 1e3, sample[RUNS / 2], RUNS);
    printf("memory: history %zu bytes once; a tube's rate marks %zu bytes (struct bg_tube %zu bytes)\n",
           sizeof(struct bg_history), sizeof(struct bg_tube_rate_marks), sizeof(struct bg_tube));
    free_rig(g);
    return sink < 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench((uint32_t)strtoul(argv[2], NULL, 10));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_history_is_empty_and_fills_a_second_at_a_time),
        cmocka_unit_test(test_rates_are_counter_deltas_oldest_first),
        cmocka_unit_test(test_a_counter_that_wraps_gives_the_right_rate),
        cmocka_unit_test(test_the_ring_wraps_and_keeps_the_newest_900),
        cmocka_unit_test(test_a_stalled_loop_spreads_the_gap_evenly),
        cmocka_unit_test(test_a_gap_longer_than_the_ring_fills_it),
        cmocka_unit_test(test_tube_rates_count_since_the_sweep_before_the_latest),
        cmocka_unit_test(test_a_new_tube_has_rates_at_once),
        cmocka_unit_test(test_a_late_sweep_divides_by_the_real_time),
        cmocka_unit_test(test_tube_counters_across_2_to_the_32),
        cmocka_unit_test(test_no_rates_before_the_first_sweep),
        cmocka_unit_test(test_a_sweep_goes_in_steps_and_its_rates_are_exact),
        cmocka_unit_test(test_tubes_freed_and_made_during_a_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_engine.c - cmocka unit tests of the engine API (core/engine.c).
 *
 * Time is only ever injected through `now`; nothing sleeps. Clients are
 * fakes: a struct fake_client embeds struct bg_client and its ops record
 * what the engine did asynchronously (job delivered, wait ended), so tests
 * assert on deliveries after bg_put / bg_engine_tick / bg_client_close.
 *
 * check_engine() is a full structural audit of the engine (every job in
 * exactly the structure its state names, counters equal sums, heaps
 * ordered, waiting sets consistent); most tests end with it and the stress
 * test runs it after every random step.
 */
#define _GNU_SOURCE /* memmem */
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

#define T0 (1000 * BG_SECOND) /* an arbitrary, nonzero start time */
#define SEC(s) ((bg_time)(s) * BG_SECOND)
#define MSEC(ms) ((bg_time)(ms) * (BG_SECOND / 1000))
#define NEVER UINT64_MAX
#define NO_SLOT UINT32_MAX
#define MAX_JOB_SIZE 65535

/* ---- fake clients ------------------------------------------------------ */

#define EVENT_LOG 64

struct fake_client {
    struct bg_client client;
    int open;                      /* bg_client_init succeeded, not closed */
    int waiting;                   /* the test's view: reserve said WOULD_BLOCK */
    size_t delivered_count;        /* job_reserved callbacks */
    uint64_t delivered[EVENT_LOG]; /* their job ids (first EVENT_LOG) */
    size_t ended_count;            /* wait_ended callbacks */
    int ended[EVENT_LOG];          /* their outcomes (first EVENT_LOG) */
    int gone;                      /* fake_alive answers 0 (a peer that left) */
    size_t alive_asked;            /* fake_alive calls */
};

static void fake_job_reserved(struct bg_client *c, struct bg_job *j)
{
    struct fake_client *fc = c->owner;
    assert_ptr_equal(&fc->client, c);
    assert_true(fc->waiting);
    assert_false(c->waiting);
    assert_int_equal(j->state, BG_JOB_RESERVED);
    assert_ptr_equal(bg_job_reserver(j), c);
    if (fc->delivered_count < EVENT_LOG) fc->delivered[fc->delivered_count] = j->id;
    fc->delivered_count++;
    fc->waiting = 0;
}

static void fake_wait_ended(struct bg_client *c, int outcome)
{
    struct fake_client *fc = c->owner;
    assert_true(fc->waiting);
    assert_false(c->waiting);
    assert_true(outcome == BG_TIMED_OUT || outcome == BG_DEADLINE_SOON);
    if (fc->ended_count < EVENT_LOG) fc->ended[fc->ended_count] = outcome;
    fc->ended_count++;
    fc->waiting = 0;
}

static const struct bg_client_ops fake_ops = {
    .job_reserved = fake_job_reserved,
    .wait_ended = fake_wait_ended,
};

/* The optional op: the engine asks it before handing a job over. It must
 * be asked only of a waiting client. */
static int fake_alive(struct bg_client *c)
{
    struct fake_client *fc = c->owner;
    assert_true(c->waiting);
    fc->alive_asked++;
    return !fc->gone;
}

static const struct bg_client_ops fake_ops_alive = {
    .job_reserved = fake_job_reserved,
    .wait_ended = fake_wait_ended,
    .alive = fake_alive,
};

static int fake_open(struct bg_engine *e, struct fake_client *fc)
{
    memset(fc, 0, sizeof *fc);
    int r = bg_client_init(e, &fc->client, &fake_ops, fc);
    fc->open = r == 0;
    return r;
}

static void fake_close(struct fake_client *fc, bg_time now)
{
    if (!fc->open) return;
    bg_client_close(&fc->client, now);
    fc->open = 0;
    fc->waiting = 0;
}

/* ---- fixture: an engine and a few clients ------------------------------ */

#define WORLD_CLIENTS 6

struct world {
    struct bg_engine engine;
    struct fake_client fc[WORLD_CLIENTS];
};

static int world_setup(void **state)
{
    struct world *w = calloc(1, sizeof *w);
    if (!w || bg_engine_init(&w->engine, MAX_JOB_SIZE, NULL) != 0) return -1;
    for (int i = 0; i < WORLD_CLIENTS; i++)
        if (fake_open(&w->engine, &w->fc[i]) != 0) return -1;
    *state = w;
    return 0;
}

static int world_teardown(void **state)
{
    struct world *w = *state;
    bg_alloc_fail_after(0);
    for (int i = 0; i < WORLD_CLIENTS; i++) fake_close(&w->fc[i], T0);
    bg_engine_destroy(&w->engine);
    free(w);
    return 0;
}

/* ---- helpers ----------------------------------------------------------- */

/* A job with body `body` + CRLF, not yet in the engine; NULL on OOM. */
static struct bg_job *make_job(struct bg_engine *e, const char *body, uint32_t pri,
                               uint32_t delay_s, uint32_t ttr_s, bg_time now)
{
    size_t n = strlen(body);
    struct bg_job *j = bg_job_new(e, pri, delay_s, ttr_s, (uint32_t)n + 2, now);
    if (!j) return NULL;
    memcpy(j->body, body, n);
    memcpy(j->body + n, "\r\n", 2);
    return j;
}

/* Put a job into fc's used tube; asserts success and returns its id. */
static uint64_t put_job(struct fake_client *fc, const char *body, uint32_t pri,
                        uint32_t delay_s, uint32_t ttr_s, bg_time now)
{
    struct bg_job *j = make_job(fc->client.engine, body, pri, delay_s, ttr_s, now);
    assert_non_null(j);
    uint64_t id = j->id;
    assert_int_equal(bg_put(&fc->client, fc->client.use, j, now), BG_OK);
    return id;
}

/* bg_reserve that keeps the fake's view of waiting in step. */
static int reserve(struct fake_client *fc, int64_t timeout_s, bg_time now, struct bg_job **out)
{
    struct bg_job *dummy = NULL;
    int r = bg_reserve(&fc->client, timeout_s, now, out ? out : &dummy);
    if (r == BG_WOULD_BLOCK) fc->waiting = 1;
    return r;
}

/* Reserve immediately; asserts a job was handed over and returns its id. */
static uint64_t reserve_now(struct fake_client *fc, bg_time now)
{
    struct bg_job *j = NULL;
    assert_int_equal(reserve(fc, 0, now, &j), BG_OK);
    assert_non_null(j);
    return j->id;
}

static void assert_body(const struct bg_job *j, const char *body)
{
    size_t n = strlen(body);
    assert_int_equal(j->body_size, n + 2);
    assert_memory_equal(j->body, body, n);
    assert_memory_equal(j->body + n, "\r\n", 2);
}

static struct bg_job *find(struct world *w, uint64_t id)
{
    return bg_job_find(&w->engine, id);
}

static int state_of(struct world *w, uint64_t id)
{
    struct bg_job *j = find(w, id);
    assert_non_null(j);
    return j->state;
}

static struct bg_stats_tube tube_stats(struct world *w, const char *name, bg_time now)
{
    struct bg_stats_tube st;
    struct bg_tube *t = bg_tube_find(&w->engine, name);
    assert_non_null(t);
    bg_stats_tube(t, now, &st);
    return st;
}

static uint32_t watch(struct fake_client *fc, const char *name)
{
    uint32_t count = 0;
    assert_int_equal(bg_client_watch(&fc->client, name, &count), BG_OK);
    return count;
}

static uint32_t ignore(struct fake_client *fc, const char *name)
{
    uint32_t count = 0;
    assert_int_equal(bg_client_ignore(&fc->client, name, &count), BG_OK);
    return count;
}

/* ---- the structural audit ---------------------------------------------- */

static long audit_step = -1; /* stress step number, for failure messages */

#define AUDIT(cond)                                                              \
    do {                                                                         \
        if (!(cond))                                                             \
            fail_msg("engine invariant broken (step %ld): %s [line %d]",         \
                     audit_step, #cond, __LINE__);                               \
    } while (0)

static int ready_before(const struct bg_job *a, const struct bg_job *b)
{
    return a->pri != b->pri ? a->pri < b->pri : a->id < b->id;
}

static int deadline_before(const struct bg_job *a, const struct bg_job *b)
{
    bg_time x = bg_job_deadline(a), y = bg_job_deadline(b);
    return x != y ? x < y : a->id < b->id;
}

/* Every item of h (side records) sits at the slot it records, belongs to
 * a job that has it, and no child beats its parent. */
static void audit_job_heap(const struct bg_heap *h, size_t slot_offset,
                           int (*before)(const struct bg_job *, const struct bg_job *))
{
    AUDIT(h->len <= h->cap);
    for (uint32_t i = 0; i < h->len; i++) {
        const struct bg_job_more *m = h->items[i];
        AUDIT(m->job && m->job->more == m);
        AUDIT(*(const uint32_t *)((const char *)m + slot_offset) == i);
        if (i > 0) AUDIT(!before(m->job, ((const struct bg_job_more *)h->items[(i - 1) / 2])->job));
    }
}

/* Nonzero if tube t's listing of `state` has j: the job right after the
 * position just before j's (ids are integers, so {key, id - 1}). */
static int indexed(const struct bg_tube *t, enum bg_job_state state, struct bg_job *j)
{
    struct bg_job_cursor before = bg_job_cursor_of(j), cur;
    before.id--;
    cur = before;
    struct bg_job *got = NULL;
    return bg_tube_jobs(t, state, &cur, &got, 1) == 1 && got == j;
}

/* The whole listing of t's jobs in `state` is in strictly increasing
 * order (`before`, read from the jobs) and as long as the count. */
static void audit_listing(const struct bg_tube *t, enum bg_job_state state,
                          int (*before)(const struct bg_job *, const struct bg_job *))
{
    struct bg_job_cursor cur = {0, 0};
    struct bg_job *page[64], *prev = NULL;
    uint64_t n = 0;
    size_t k;
    while ((k = bg_tube_jobs(t, state, &cur, page, 64)) > 0) {
        for (size_t i = 0; i < k; i++, n++) {
            AUDIT(page[i]->state == state && page[i]->tube == t);
            if (prev) AUDIT(before(prev, page[i]));
            prev = page[i];
        }
    }
    AUDIT(n == bg_tube_index(t, state)->len);
}

static int id_before(const struct bg_job *a, const struct bg_job *b) { return a->id < b->id; }

static int list_contains(const struct bg_job *head, const struct bg_job *j)
{
    for (; head; head = head->next)
        if (head == j) return 1;
    return 0;
}

/* Length of a doubly linked job list, checking its back links and tail. */
static uint64_t audit_list(const struct bg_job *head, const struct bg_job *tail)
{
    uint64_t n = 0;
    const struct bg_job *prev = NULL;
    for (const struct bg_job *j = head; j; prev = j, j = j->next, n++) AUDIT(j->prev == prev);
    AUDIT(prev == tail);
    return n;
}

static bg_time expected_wake(const struct bg_client *c)
{
    bg_time wake = c->wait_deadline;
    for (const struct bg_job *j = c->reserved_head; j; j = j->next) {
        bg_time soon = bg_job_deadline(j) > BG_DEADLINE_MARGIN ? bg_job_deadline(j) - BG_DEADLINE_MARGIN : 0;
        if (soon < wake) wake = soon;
    }
    return wake;
}

struct tally {
    uint64_t ready, urgent, delayed, reserved, buried, jobs;
};

/* Audit the whole engine. `fcs` must be every client attached to it.
 * `dispatch_invariant`: also require that no unpaused tube has both ready
 * jobs and waiters (the engine may give that up only when out of memory). */
static void check_engine_ex(struct bg_engine *e, struct fake_client *fcs, size_t nfc,
                            int dispatch_invariant)
{
    struct tally *per_tube = calloc(e->tube_count ? e->tube_count : 1, sizeof *per_tube);
    struct tally all = {0};
    assert_non_null(per_tube);
    const char *broken; /* core's own audit agrees (it also wants the matching invariant) */
    if (dispatch_invariant && bg_engine_audit(e, &broken) != 0)
        fail_msg("bg_engine_audit (step %ld): %s", audit_step, broken);

    /* tubes: list, hash table, indices */
    AUDIT(e->tube_count <= e->tube_list_cap || e->tube_count == 0);
    AUDIT(bg_tube_find(e, "default") == e->default_tube);
    for (uint32_t i = 0; i < e->tube_count; i++) {
        struct bg_tube *t = e->tube_list[i];
        AUDIT(t->list_index == i);
        AUDIT(bg_tube_find(e, t->name) == t);
    }

    /* jobs: walk the id table */
    uint64_t jobs = 0;
    AUDIT(e->job_count < e->jobs_mask + 1); /* an empty slot ends every probe */
    for (size_t b = 0; b <= e->jobs_mask; b++) {
        struct bg_job *j = e->jobs[b];
        if (j) {
            jobs++;
            AUDIT(bg_job_find(e, j->id) == j);
            AUDIT(j->id < e->next_id);
            AUDIT(j->ttr_s >= 1);
            struct bg_tube *t = j->tube;
            AUDIT(t && t->list_index < e->tube_count && e->tube_list[t->list_index] == t);
            struct tally *tt = &per_tube[t->list_index];
            tt->jobs++;
            switch (j->state) {
            case BG_JOB_READY:
                AUDIT(indexed(t, BG_JOB_READY, j));
                AUDIT(bg_job_reserver(j) == NULL);
                tt->ready++;
                if (j->pri < BG_URGENT_PRIORITY) tt->urgent++;
                break;
            case BG_JOB_DELAYED:
                AUDIT(indexed(t, BG_JOB_DELAYED, j));
                AUDIT(j->more != NULL);
                AUDIT(j->more->timer_slot < e->job_timers.len && e->job_timers.items[j->more->timer_slot] == j->more);
                AUDIT(j->more->reserver == NULL);
                tt->delayed++;
                break;
            case BG_JOB_RESERVED: {
                AUDIT(j->more != NULL);
                struct bg_client *c = j->more->reserver;
                AUDIT(c != NULL);
                AUDIT(j->more->reserver_slot < c->reserved.len && c->reserved.items[j->more->reserver_slot] == j->more);
                AUDIT(j->more->timer_slot < e->job_timers.len && e->job_timers.items[j->more->timer_slot] == j->more);
                AUDIT(list_contains(c->reserved_head, j));
                AUDIT(indexed(t, BG_JOB_RESERVED, j));
                tt->reserved++;
                break;
            }
            case BG_JOB_BURIED:
                AUDIT(indexed(t, BG_JOB_BURIED, j));
                AUDIT(j->more != NULL && j->more->reserver == NULL);
                tt->buried++;
                break;
            default:
                AUDIT(!"job in an unknown state");
            }
        }
    }
    AUDIT(jobs == e->job_count);

    /* per tube: counters equal what the jobs say; waiting sets consistent */
    uint64_t paused = 0, waiting_slots = 0;
    for (uint32_t i = 0; i < e->tube_count; i++) {
        struct bg_tube *t = e->tube_list[i];
        struct tally *tt = &per_tube[i];
        AUDIT(t->ready.len == tt->ready);
        AUDIT(t->urgent_count == tt->urgent);
        AUDIT(t->delayed.len == tt->delayed);
        AUDIT(t->reserved.len == tt->reserved);
        AUDIT(t->buried.len == tt->buried);
        AUDIT(t->refs == t->using_count + t->watching_count + tt->jobs + (t == e->default_tube));
        audit_listing(t, BG_JOB_READY, ready_before);
        audit_listing(t, BG_JOB_RESERVED, id_before);
        audit_listing(t, BG_JOB_BURIED, deadline_before); /* burial numbers */
        {   /* the cached top key that reserve scans */
            const struct bg_job *top = t->pause_ns ? NULL : bg_peek(t, BG_JOB_READY);
            AUDIT(t->ready_top_pri == (top ? top->pri : UINT32_MAX));
            AUDIT(t->ready_top_id == (top ? top->id : UINT64_MAX));
        }
        audit_listing(t, BG_JOB_DELAYED, deadline_before);
        for (uint32_t k = 0; k < t->waiting_len; k++) {
            struct bg_watch *w = t->waiting[k];
            AUDIT(w->tube == t && w->wait_index == k && w->client->waiting);
        }
        waiting_slots += t->waiting_len;
        if (t->pause_ns) {
            paused++;
            AUDIT(t->timer_slot < e->tube_timers.len && e->tube_timers.items[t->timer_slot] == t);
        } else {
            AUDIT(t->timer_slot == NO_SLOT);
            if (dispatch_invariant) AUDIT(!(t->ready.len && t->waiting_len));
        }
        all.ready += tt->ready;
        all.urgent += tt->urgent;
        all.delayed += tt->delayed;
        all.reserved += tt->reserved;
        all.buried += tt->buried;
    }
    AUDIT(e->ready_count == all.ready);
    AUDIT(e->urgent_count == all.urgent);
    AUDIT(e->delayed_count == all.delayed);
    AUDIT(e->reserved_count == all.reserved);
    AUDIT(e->buried_count == all.buried);
    AUDIT(e->job_timers.len == all.delayed + all.reserved);
    audit_job_heap(&e->job_timers, offsetof(struct bg_job_more, timer_slot), deadline_before);
    AUDIT(e->tube_timers.len == paused);
    for (uint32_t k = 1; k < e->tube_timers.len; k++) {
        const struct bg_tube *t = e->tube_timers.items[k], *parent = e->tube_timers.items[(k - 1) / 2];
        AUDIT(t->unpause_at >= parent->unpause_at);
    }

    /* clients */
    uint64_t open = 0, waiting = 0, timed = 0, watch_slots = 0;
    for (size_t i = 0; i < nfc; i++) {
        struct fake_client *fc = &fcs[i];
        if (!fc->open) continue;
        struct bg_client *c = &fc->client;
        open++;
        AUDIT(c->engine == e && c->use && c->watch_len >= 1);
        AUDIT(c->waiting == fc->waiting);
        for (uint32_t k = 0; k < c->watch_len; k++) {
            struct bg_watch *w = c->watch[k];
            AUDIT(w->client == c);
            AUDIT(c->watch_tube[k] == w->tube);
            if (c->waiting)
                AUDIT(w->wait_index < w->tube->waiting_len && w->tube->waiting[w->wait_index] == w);
            else
                AUDIT(w->wait_index == NO_SLOT);
        }
        uint64_t held = audit_list(c->reserved_head, c->reserved_tail);
        AUDIT(held == c->reserved.len);
        for (const struct bg_job *j = c->reserved_head; j; j = j->next)
            AUDIT(j->state == BG_JOB_RESERVED && bg_job_reserver(j) == c);
        audit_job_heap(&c->reserved, offsetof(struct bg_job_more, reserver_slot), deadline_before);
        if (c->waiting) {
            waiting++;
            watch_slots += c->watch_len;
            AUDIT(c->wake_at == expected_wake(c));
            if (c->wake_at != NEVER) {
                timed++;
                AUDIT(c->timer_slot < e->client_timers.len && e->client_timers.items[c->timer_slot] == c);
            } else {
                AUDIT(c->timer_slot == NO_SLOT);
            }
        } else {
            AUDIT(c->timer_slot == NO_SLOT);
        }
    }
    AUDIT(e->clients == open);
    AUDIT(e->waiting == waiting);
    AUDIT(waiting_slots == watch_slots);
    AUDIT(e->client_timers.len == timed);
    /* the catch-up's one compare is safe: due_at never exceeds a deadline */
    AUDIT(e->due_at <= bg_engine_next_deadline(e));
    for (uint32_t k = 1; k < e->client_timers.len; k++) {
        const struct bg_client *c = e->client_timers.items[k], *parent = e->client_timers.items[(k - 1) / 2];
        AUDIT(c->wake_at >= parent->wake_at);
    }
    free(per_tube);
}

static void check_engine(struct bg_engine *e, struct fake_client *fcs, size_t nfc)
{
    check_engine_ex(e, fcs, nfc, 1);
}

static void check_world(struct world *w)
{
    check_engine(&w->engine, w->fc, WORLD_CLIENTS);
}

/* ======================================================================= */
/* priorities                                                              */
/* ======================================================================= */

/* Reserve hands out the lowest pri first, and FIFO (by id) within a pri. */
static void test_priority_order_and_fifo_within_priority(void **state)
{
    struct world *w = *state;
    static const struct {
        const char *body;
        uint32_t pri;
    } puts[] = {
        {"a", 10}, {"b", 5}, {"c", 10}, {"d", 2000}, {"e", 5}, {"f", 0}, {"g", UINT32_MAX},
    };
    static const char *const expected_order[] = {"f", "b", "e", "a", "c", "d", "g"};
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];

    for (size_t i = 0; i < sizeof puts / sizeof puts[0]; i++)
        put_job(producer, puts[i].body, puts[i].pri, 0, 60, T0);
    uint64_t last_id_per_pri = 0;
    uint32_t last_pri = 0;
    for (size_t i = 0; i < sizeof expected_order / sizeof expected_order[0]; i++) {
        struct bg_job *j = NULL;
        assert_int_equal(reserve(worker, 0, T0, &j), BG_OK);
        assert_body(j, expected_order[i]);
        assert_true(j->pri >= last_pri);
        if (j->pri == last_pri && i > 0) assert_true(j->id > last_id_per_pri);
        last_pri = j->pri;
        last_id_per_pri = j->id;
    }
    assert_int_equal(reserve(worker, 0, T0, NULL), BG_TIMED_OUT);
    assert_int_equal(w->engine.reserved_count, 7);
    check_world(w);
}

/* pri < 1024 counts as urgent, in the engine and in the tube's stats, and
 * only while the job is ready. */
static void test_urgent_counts(void **state)
{
    struct world *w = *state;
    static const struct {
        uint32_t pri;
        int urgent;
    } cases[] = {
        {0, 1}, {1, 1}, {1023, 1}, {1024, 0}, {1025, 0}, {UINT32_MAX, 0},
    };
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    assert_int_equal(bg_client_use(&producer->client, "urgent"), BG_OK);
    assert_int_equal(watch(worker, "urgent"), 2);

    uint64_t urgent = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        put_job(producer, "x", cases[i].pri, 0, 60, T0);
        urgent += cases[i].urgent;
        assert_int_equal(w->engine.urgent_count, urgent);
        assert_int_equal(tube_stats(w, "urgent", T0).urgent, urgent);
    }
    assert_int_equal(tube_stats(w, "default", T0).urgent, 0);

    /* reserving the pri-0 job removes it from the urgent count */
    uint64_t id = reserve_now(worker, T0);
    assert_int_equal(find(w, id)->pri, 0);
    assert_int_equal(w->engine.urgent_count, urgent - 1);
    assert_int_equal(tube_stats(w, "urgent", T0).urgent, urgent - 1);
    /* released with a non-urgent pri it stays out of the count */
    assert_int_equal(bg_release(&worker->client, id, 5000, 0, T0), BG_OK);
    assert_int_equal(w->engine.urgent_count, urgent - 1);
    /* reserved again (pri 1 is next) and buried with an urgent pri: buried
     * jobs are not counted as urgent */
    id = reserve_now(worker, T0);
    assert_int_equal(find(w, id)->pri, 1);
    assert_int_equal(bg_bury(&worker->client, id, 0, T0), BG_OK);
    assert_int_equal(w->engine.urgent_count, urgent - 2);
    assert_int_equal(tube_stats(w, "urgent", T0).urgent, urgent - 2);
    /* kicked back to ready with pri 0: counted again */
    assert_int_equal(bg_kick_job(&w->engine, id, T0), BG_OK);
    assert_int_equal(w->engine.urgent_count, urgent - 1);
    check_world(w);
}

/* ======================================================================= */
/* TTR                                                                     */
/* ======================================================================= */

/* A reserved job with ttr 2 is back to ready exactly when its TTR ends,
 * counting a timeout on the job and in the engine. */
static void test_ttr_expiry_returns_job_to_ready(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t id = put_job(producer, "ttr", 100, 0, 2, T0);
    assert_int_equal(reserve_now(worker, T0), id);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(2));

    bg_engine_tick(&w->engine, T0 + MSEC(1900));
    assert_int_equal(state_of(w, id), BG_JOB_RESERVED);
    assert_int_equal(bg_job_timeouts(find(w, id)), 0);
    bg_engine_tick(&w->engine, T0 + SEC(2) - 1);
    assert_int_equal(state_of(w, id), BG_JOB_RESERVED);

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(2)), NEVER);
    struct bg_job *j = find(w, id);
    assert_int_equal(j->state, BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(j), 1);
    assert_int_equal(j->pri, 100);
    assert_null(bg_job_reserver(j));
    assert_int_equal(w->engine.stat.job_timeouts, 1);
    assert_int_equal(w->engine.reserved_count, 0);
    assert_int_equal(w->engine.ready_count, 1);
    assert_null(worker->client.reserved_head);
    check_world(w);
}

/* ttr 0 is raised to 1 s: the job times out 1 s after the reserve. */
static void test_ttr_zero_is_one_second(void **state)
{
    struct world *w = *state;
    uint64_t id = put_job(&w->fc[0], "ttr0", 1, 0, 0, T0);
    assert_int_equal(find(w, id)->ttr_s, 1);
    assert_int_equal(reserve_now(&w->fc[1], T0), id);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(1));
    bg_engine_tick(&w->engine, T0 + SEC(1) - 1);
    assert_int_equal(state_of(w, id), BG_JOB_RESERVED);
    bg_engine_tick(&w->engine, T0 + SEC(1));
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(find(w, id)), 1);
    check_world(w);
}

/* A timed-out job goes to a waiting client straight away. */
static void test_ttr_expiry_hands_job_to_waiter(void **state)
{
    struct world *w = *state;
    struct fake_client *holder = &w->fc[1], *waiter = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "again", 1, 0, 3, T0);
    assert_int_equal(reserve_now(holder, T0), id);
    assert_int_equal(reserve(waiter, -1, T0, NULL), BG_WOULD_BLOCK);
    bg_engine_tick(&w->engine, T0 + SEC(3));
    assert_int_equal(waiter->delivered_count, 1);
    assert_int_equal(waiter->delivered[0], id);
    assert_ptr_equal(bg_job_reserver(find(w, id)), &waiter->client);
    assert_int_equal(bg_job_reserves(find(w, id)), 2);
    assert_int_equal(bg_job_timeouts(find(w, id)), 1);
    assert_int_equal(bg_job_deadline(find(w, id)), T0 + SEC(6));
    check_world(w);
}

/* ======================================================================= */
/* DEADLINE_SOON                                                           */
/* ======================================================================= */

/* A client holding a job within 1 s of its TTR gets DEADLINE_SOON from
 * reserve when nothing is ready, but the ready job when there is one. */
static void test_reserve_deadline_soon(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t held = put_job(producer, "held", 1, 0, 2, T0);
    assert_int_equal(reserve_now(worker, T0), held);

    /* 1.5 s in: the TTR ends in 0.5 s, inside the 1 s margin */
    assert_int_equal(reserve(worker, -1, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    assert_int_equal(reserve(worker, 0, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    assert_int_equal(reserve(worker, 10, T0 + SEC(1), NULL), BG_DEADLINE_SOON);
    assert_false(worker->client.waiting);
    assert_int_equal(w->engine.waiting, 0);

    /* with a ready job in a watched tube the job wins */
    uint64_t ready = put_job(producer, "ready", 1, 0, 60, T0 + MSEC(1500));
    assert_int_equal(reserve_now(worker, T0 + MSEC(1500)), ready);

    /* a ready job in an unwatched tube does not count */
    assert_int_equal(bg_client_use(&producer->client, "elsewhere"), BG_OK);
    put_job(producer, "unwatched", 1, 0, 60, T0 + MSEC(1500));
    assert_int_equal(reserve(worker, -1, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    check_world(w);
}

/* Before the margin a holder may wait normally. When its only watched
 * ready job is in a paused tube, the reference lets it wait and its next
 * tick ends the wait with DEADLINE_SOON, whatever the timeout, 0 included
 * (recorded: codec case deadline-soon-paused-tube-rwt-0). That wait's wake
 * time has already passed, so it counts as passed now: DEADLINE_SOON at
 * once, and no wait is left due. */
static void test_reserve_deadline_soon_edges(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t held = put_job(producer, "held", 1, 0, 2, T0);
    assert_int_equal(reserve_now(worker, T0), held);

    /* 0.999 s in: not yet within the margin */
    assert_int_equal(reserve(worker, 0, T0 + SEC(1) - 1, NULL), BG_TIMED_OUT);

    /* a ready job in a paused watched tube: DEADLINE_SOON for any timeout */
    put_job(producer, "paused", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 60, T0), BG_OK);
    assert_int_equal(reserve(worker, -1, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    assert_int_equal(reserve(worker, 5, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    assert_int_equal(reserve(worker, 0, T0 + MSEC(1500), NULL), BG_DEADLINE_SOON);
    assert_false(worker->client.waiting);
    assert_true(bg_engine_next_deadline(&w->engine) > T0 + MSEC(1500));
    check_world(w);
}

/* A client already waiting gets wait_ended(DEADLINE_SOON) when the tick
 * reaches its job's deadline minus 1 s; the job stays reserved. */
static void test_waiting_client_woken_with_deadline_soon(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t held = put_job(&w->fc[0], "held", 1, 0, 2, T0);
    assert_int_equal(reserve_now(worker, T0), held);

    assert_int_equal(reserve(worker, -1, T0 + MSEC(500), NULL), BG_WOULD_BLOCK);
    assert_int_equal(w->engine.waiting, 1);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(1));

    bg_engine_tick(&w->engine, T0 + SEC(1) - 1);
    assert_int_equal(worker->ended_count, 0);
    assert_true(worker->client.waiting);

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(1)), T0 + SEC(2));
    assert_int_equal(worker->ended_count, 1);
    assert_int_equal(worker->ended[0], BG_DEADLINE_SOON);
    assert_int_equal(worker->delivered_count, 0);
    assert_false(worker->client.waiting);
    assert_int_equal(w->engine.waiting, 0);
    assert_int_equal(tube_stats(w, "default", T0 + SEC(1)).waiting, 0);
    assert_int_equal(state_of(w, held), BG_JOB_RESERVED);
    check_world(w);
}

/* A waiter with a reserve timeout shorter than its margin times out first
 * (TIMED_OUT), and touching the held job moves the DEADLINE_SOON wake. */
static void test_waiting_wake_is_min_of_timeout_and_margin(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t held = put_job(&w->fc[0], "held", 1, 0, 10, T0);
    assert_int_equal(reserve_now(worker, T0), held);

    assert_int_equal(reserve(worker, 3, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(3));
    bg_engine_tick(&w->engine, T0 + SEC(3));
    assert_int_equal(worker->ended_count, 1);
    assert_int_equal(worker->ended[0], BG_TIMED_OUT);

    assert_int_equal(reserve(worker, 100, T0 + SEC(3), NULL), BG_WOULD_BLOCK);
    assert_int_equal(worker->client.wake_at, T0 + SEC(9));
    check_world(w);
}

/* ======================================================================= */
/* reserve-with-timeout                                                    */
/* ======================================================================= */

/* Timeout 0 answers TIMED_OUT at once and registers no waiter. */
static void test_reserve_timeout_zero(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    assert_int_equal(reserve(worker, 0, T0, NULL), BG_TIMED_OUT);
    assert_false(worker->client.waiting);
    assert_int_equal(w->engine.waiting, 0);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 0);
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    assert_int_equal(w->engine.workers, 1); /* reserve marks a worker */
    check_world(w);
}

/* Timeout 5 waits; the engine's next deadline is the timeout, and the tick
 * at +5 s (not before) ends the wait with TIMED_OUT. */
static void test_reserve_timeout_expires_on_tick(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    assert_int_equal(reserve(worker, 5, T0, NULL), BG_WOULD_BLOCK);
    assert_true(worker->client.waiting);
    assert_int_equal(w->engine.waiting, 1);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 1);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(5));

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(5) - 1), T0 + SEC(5));
    assert_int_equal(worker->ended_count, 0);

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(5)), NEVER);
    assert_int_equal(worker->ended_count, 1);
    assert_int_equal(worker->ended[0], BG_TIMED_OUT);
    assert_int_equal(w->engine.waiting, 0);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 0);

    /* a later tick does not report it again */
    bg_engine_tick(&w->engine, T0 + SEC(50));
    assert_int_equal(worker->ended_count, 1);
    check_world(w);
}

/* A job put while a client waits with a timeout is delivered and cancels
 * the timeout; a negative timeout waits with no deadline at all. */
static void test_reserve_wait_ends_with_job(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1], *forever = &w->fc[2];
    assert_int_equal(watch(forever, "other"), 2);
    assert_int_equal(ignore(forever, "default"), 1);
    assert_int_equal(reserve(forever, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);

    assert_int_equal(reserve(worker, 5, T0, NULL), BG_WOULD_BLOCK);
    uint64_t id = put_job(&w->fc[0], "job", 1, 0, 60, T0 + SEC(1));
    assert_int_equal(worker->delivered_count, 1);
    assert_int_equal(worker->delivered[0], id);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(61)); /* its TTR */
    bg_engine_tick(&w->engine, T0 + SEC(5));
    assert_int_equal(worker->ended_count, 0);
    assert_true(forever->client.waiting);
    check_world(w);
}

/* When a delayed job becomes ready at the very instant a waiter's timeout
 * ends, the tick hands the waiter the job (jobs are processed before wait
 * timeouts, as in the reference's tick) and ends no wait. */
static void test_tick_job_beats_timeout_at_same_instant(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t id = put_job(&w->fc[0], "due", 1, 5, 60, T0);
    assert_int_equal(reserve(worker, 5, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(5));
    bg_engine_tick(&w->engine, T0 + SEC(5));
    assert_int_equal(worker->delivered_count, 1);
    assert_int_equal(worker->delivered[0], id);
    assert_int_equal(worker->ended_count, 0);
    check_world(w);
}

/* One late tick does everything that fell due meanwhile, in one call. */
static void test_late_tick_catches_up(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *holder = &w->fc[1], *waiter = &w->fc[2];
    uint64_t held = put_job(producer, "held", 1, 0, 2, T0);
    assert_int_equal(reserve_now(holder, T0), held);
    uint64_t delayed = put_job(producer, "delayed", 5, 3, 60, T0);
    assert_int_equal(bg_client_use(&producer->client, "paused"), BG_OK);
    uint64_t in_paused = put_job(producer, "paused", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "paused", 4, T0), BG_OK);
    watch(waiter, "elsewhere");
    ignore(waiter, "default");
    assert_int_equal(reserve(waiter, 6, T0, NULL), BG_WOULD_BLOCK);

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(100)), NEVER);
    assert_int_equal(state_of(w, held), BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(find(w, held)), 1);
    assert_int_equal(state_of(w, delayed), BG_JOB_READY);
    assert_int_equal(state_of(w, in_paused), BG_JOB_READY);
    assert_int_equal(bg_tube_find(&w->engine, "paused")->pause_ns, 0);
    assert_int_equal(waiter->ended_count, 1);
    assert_int_equal(waiter->ended[0], BG_TIMED_OUT);
    check_world(w);
}

/* ======================================================================= */
/* delays                                                                  */
/* ======================================================================= */

/* A job put with delay 10 is delayed, cannot be reserved, and becomes
 * ready at the tick at +10 s. */
static void test_delayed_job_ready_after_delay(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t id = put_job(&w->fc[0], "later", 1, 10, 60, T0);
    assert_int_equal(state_of(w, id), BG_JOB_DELAYED);
    assert_int_equal(w->engine.delayed_count, 1);
    assert_int_equal(w->engine.ready_count, 0);
    assert_int_equal(tube_stats(w, "default", T0).delayed, 1);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(10));

    struct bg_stats_job sj;
    bg_stats_job(&w->engine, find(w, id), T0 + SEC(4), &sj);
    assert_string_equal(sj.state, "delayed");
    assert_int_equal(sj.delay_s, 10);
    assert_int_equal(sj.time_left_s, 6);

    assert_int_equal(reserve(worker, 0, T0 + SEC(9), NULL), BG_TIMED_OUT);
    bg_engine_tick(&w->engine, T0 + SEC(10) - 1);
    assert_int_equal(state_of(w, id), BG_JOB_DELAYED);

    assert_int_equal(bg_engine_tick(&w->engine, T0 + SEC(10)), NEVER);
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(w->engine.delayed_count, 0);
    assert_int_equal(w->engine.ready_count, 1);
    assert_int_equal(reserve_now(worker, T0 + SEC(10)), id);
    check_world(w);
}

/* A delayed job that becomes ready goes straight to a waiting client. */
static void test_delayed_job_delivered_to_waiter(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t id = put_job(&w->fc[0], "later", 1, 10, 60, T0);
    assert_int_equal(reserve(worker, -1, T0, NULL), BG_WOULD_BLOCK);
    bg_engine_tick(&w->engine, T0 + SEC(9));
    assert_int_equal(worker->delivered_count, 0);
    bg_engine_tick(&w->engine, T0 + SEC(10));
    assert_int_equal(worker->delivered_count, 1);
    assert_int_equal(worker->delivered[0], id);
    assert_int_equal(state_of(w, id), BG_JOB_RESERVED);
    assert_int_equal(bg_job_deadline(find(w, id)), T0 + SEC(70));
    check_world(w);
}

/* The delayed heap (what peek-delayed shows) is ordered by ready time, then
 * id; several delayed jobs due at one tick all become ready. */
static void test_delayed_order_by_deadline(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0];
    static const uint32_t delays[] = {30, 10, 20, 10, 5};
    uint64_t ids[5];
    for (size_t i = 0; i < 5; i++) ids[i] = put_job(producer, "d", 1, delays[i], 60, T0);
    /* the soonest ready time first; equal times by id */
    static const size_t expected_peek[] = {4, 1, 3, 2, 0};
    struct bg_tube *t = producer->client.use;
    for (size_t k = 0; k < 5; k++) {
        struct bg_job *peek = bg_peek(t, BG_JOB_DELAYED);
        assert_non_null(peek);
        assert_int_equal(peek->id, ids[expected_peek[k]]);
        assert_int_equal(bg_engine_next_deadline(&w->engine), bg_job_deadline(peek));
        assert_int_equal(bg_delete(&producer->client, peek->id, T0), BG_OK);
    }
    assert_null(bg_peek(t, BG_JOB_DELAYED));

    /* due together: one tick promotes all of them */
    for (size_t i = 0; i < 3; i++) put_job(producer, "d", 1, 2, 60, T0);
    put_job(producer, "d", 1, 3, 60, T0);
    bg_engine_tick(&w->engine, T0 + SEC(2));
    assert_int_equal(w->engine.ready_count, 3);
    assert_int_equal(w->engine.delayed_count, 1);
    check_world(w);
}

/* ======================================================================= */
/* pause                                                                   */
/* ======================================================================= */

/* A paused tube holds its ready job back from reserve; the tick at +5 s
 * unpauses it and delivers the job to the waiter. */
static void test_pause_holds_ready_job_until_unpause(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t id = put_job(producer, "held back", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 5, T0), BG_OK);

    struct bg_stats_tube st = tube_stats(w, "default", T0 + SEC(1));
    assert_int_equal(st.pause_s, 5);
    assert_int_equal(st.pause_left_s, 4);
    assert_int_equal(st.cmd_pause, 1);

    assert_int_equal(reserve(worker, 0, T0, NULL), BG_TIMED_OUT);
    assert_int_equal(reserve(worker, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(5));

    /* a put into the paused tube does not wake the waiter either */
    uint64_t second = put_job(producer, "also held", 2, 0, 60, T0 + SEC(1));
    assert_int_equal(worker->delivered_count, 0);

    bg_engine_tick(&w->engine, T0 + SEC(5) - 1);
    assert_int_equal(worker->delivered_count, 0);
    bg_engine_tick(&w->engine, T0 + SEC(5));
    assert_int_equal(worker->delivered_count, 1);
    assert_int_equal(worker->delivered[0], id);
    assert_int_equal(state_of(w, second), BG_JOB_READY);
    st = tube_stats(w, "default", T0 + SEC(5));
    assert_int_equal(st.pause_s, 0);
    assert_int_equal(st.pause_left_s, 0);
    check_world(w);
}

/* pause-tube of a tube that does not exist is NOT_FOUND and creates none. */
static void test_pause_missing_tube(void **state)
{
    struct world *w = *state;
    uint32_t tubes = w->engine.tube_count;
    assert_int_equal(bg_pause_tube(&w->engine, "no-such-tube", 5, T0), BG_NOT_FOUND);
    assert_null(bg_tube_find(&w->engine, "no-such-tube"));
    assert_int_equal(w->engine.tube_count, tubes);
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    check_world(w);
}

/* pause 0 ends the pause at once (the reference pauses for 1 ns, over by
 * its next command), serving the tube's waiters then and there; stats show
 * pause 0 and the pause counts. Pausing again replaces the deadline. */
static void test_pause_zero_and_repause(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t id = put_job(&w->fc[0], "p0", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 100, T0), BG_OK);
    assert_int_equal(reserve(worker, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 0, T0 + SEC(1)), BG_OK);
    assert_int_equal(worker->delivered_count, 1); /* no tick needed */
    assert_int_equal(worker->delivered[0], id);
    struct bg_stats_tube st = tube_stats(w, "default", T0 + SEC(1));
    assert_int_equal(st.pause_s, 0);
    assert_int_equal(st.pause_left_s, 0);
    assert_int_equal(st.cmd_pause, 2);
    assert_int_equal(w->engine.tube_timers.len, 0);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(61)); /* the TTR only */

    /* re-pausing moves the unpause time rather than adding a second timer */
    assert_int_equal(bg_pause_tube(&w->engine, "default", 10, T0 + SEC(1)), BG_OK);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 3, T0 + SEC(2)), BG_OK);
    assert_int_equal(w->engine.tube_timers.len, 1);
    assert_int_equal(tube_stats(w, "default", T0).cmd_pause, 4);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(5));
    check_world(w);
}

/* ======================================================================= */
/* kick                                                                    */
/* ======================================================================= */

/* Reserve the next job as `worker` and bury it with pri `pri`. */
static uint64_t reserve_and_bury(struct fake_client *worker, uint32_t pri, bg_time now)
{
    uint64_t id = reserve_now(worker, now);
    assert_int_equal(bg_bury(&worker->client, id, pri, now), BG_OK);
    return id;
}

/* kick takes buried jobs first, oldest burial first, bounded by n; only
 * when none is buried does it take delayed jobs, soonest first. */
static void test_kick_buried_then_delayed(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    struct bg_tube *t = producer->client.use;
    uint64_t b[3];
    for (int i = 0; i < 3; i++) put_job(producer, "b", 10 + i, 0, 60, T0);
    /* bury order (the FIFO) differs from id order: 1st reserve is b pri 10 */
    for (int i = 0; i < 3; i++) b[i] = reserve_and_bury(worker, 0, T0);
    uint64_t late = put_job(producer, "late", 1, 30, 60, T0);
    uint64_t soon = put_job(producer, "soon", 1, 10, 60, T0);

    static const struct {
        uint64_t n, kicked;
        uint64_t buried_after, delayed_after;
    } steps[] = {
        {0, 0, 3, 2}, /* n = 0 kicks nothing */
        {2, 2, 1, 2}, /* two buried; delayed untouched */
        {5, 1, 0, 2}, /* the last buried; still no delayed while buried existed */
        {1, 1, 0, 1}, /* now delayed, the soonest */
        {5, 1, 0, 0},
        {5, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        assert_int_equal(bg_kick(&w->engine, t, steps[i].n, T0), steps[i].kicked);
        assert_int_equal(t->buried.len, steps[i].buried_after);
        assert_int_equal(t->delayed.len, steps[i].delayed_after);
        if (i == 1) {
            assert_int_equal(state_of(w, b[0]), BG_JOB_READY);
            assert_int_equal(state_of(w, b[1]), BG_JOB_READY);
            assert_int_equal(state_of(w, b[2]), BG_JOB_BURIED);
        }
        if (i == 3) {
            assert_int_equal(state_of(w, soon), BG_JOB_READY);
            assert_int_equal(state_of(w, late), BG_JOB_DELAYED);
        }
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(bg_job_kicks(find(w, b[i])), 1);
        assert_int_equal(bg_job_buries(find(w, b[i])), 1);
        assert_int_equal(find(w, b[i])->pri, 0);
    }
    assert_int_equal(bg_job_kicks(find(w, soon)), 1);
    assert_int_equal(bg_job_kicks(find(w, late)), 1);
    assert_int_equal(w->engine.ready_count, 5);
    check_world(w);
}

/* Kicking only touches the given tube, and a kicked job goes to a waiter. */
static void test_kick_is_per_tube_and_dispatches(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1], *waiter = &w->fc[2];
    put_job(producer, "x", 1, 0, 60, T0);
    uint64_t id = reserve_and_bury(worker, 1, T0);
    struct bg_tube *other = NULL;
    assert_int_equal(bg_client_use(&producer->client, "kick-other"), BG_OK);
    other = producer->client.use;
    assert_int_equal(bg_kick(&w->engine, other, 10, T0), 0);
    assert_int_equal(state_of(w, id), BG_JOB_BURIED);

    assert_int_equal(reserve(waiter, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_kick(&w->engine, w->engine.default_tube, 10, T0), 1);
    assert_int_equal(waiter->delivered_count, 1);
    assert_int_equal(waiter->delivered[0], id);
    check_world(w);
}

/* kick-job: buried and delayed jobs kick; ready, reserved and missing ids
 * are NOT_FOUND and change nothing. */
static void test_kick_job_by_state(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    put_job(producer, "buried", 1, 0, 60, T0);
    uint64_t buried = reserve_and_bury(worker, 1, T0);
    uint64_t reserved = put_job(producer, "reserved", 2, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), reserved);
    uint64_t delayed = put_job(producer, "delayed", 3, 100, 60, T0);
    uint64_t ready = put_job(producer, "ready", 4, 0, 60, T0);

    static const struct {
        int which; /* index into ids[] below; 4 = missing */
        int outcome, state_after;
    } cases[] = {
        {0, BG_OK, BG_JOB_READY},
        {1, BG_OK, BG_JOB_READY},
        {2, BG_NOT_FOUND, BG_JOB_READY},
        {3, BG_NOT_FOUND, BG_JOB_RESERVED},
        {4, BG_NOT_FOUND, -1},
    };
    uint64_t ids[5] = {buried, delayed, ready, reserved, 999999};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t id = ids[cases[i].which];
        assert_int_equal(bg_kick_job(&w->engine, id, T0), cases[i].outcome);
        if (cases[i].state_after >= 0) assert_int_equal(state_of(w, id), cases[i].state_after);
        else assert_null(find(w, id));
    }
    assert_int_equal(bg_job_kicks(find(w, buried)), 1);
    assert_int_equal(bg_job_kicks(find(w, delayed)), 1);
    assert_int_equal(bg_job_kicks(find(w, ready)), 0);
    assert_int_equal(bg_job_kicks(find(w, reserved)), 0);
    check_world(w);
}

/* Making a job ready never allocates (a tube's index is threaded through
 * its jobs, core/tree.c): while every allocation fails, kick and kick-job
 * still make the jobs ready, each counted once. */
static void test_kick_when_allocations_fail(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    struct bg_tube *t = producer->client.use;
    for (uint32_t i = 0; i < 10; i++) put_job(producer, "fill", i, 0, 60, T0);
    uint64_t b1 = reserve_and_bury(worker, 100, T0);
    uint64_t b2 = reserve_and_bury(worker, 100, T0);
    uint64_t b3 = reserve_and_bury(worker, 100, T0);
    bg_alloc_fail_after(1);
    assert_int_equal(bg_kick(e, t, 2, T0), 2);
    assert_int_equal(bg_kick_job(e, b3, T0), BG_OK);
    bg_alloc_fail_after(0);
    assert_int_equal(t->buried.len, 0);
    assert_int_equal(bg_job_kicks(find(w, b1)), 1);
    assert_int_equal(bg_job_kicks(find(w, b2)), 1);
    assert_int_equal(state_of(w, b3), BG_JOB_READY);
    check_world(w);
}

/* ======================================================================= */
/* tube lifetime                                                           */
/* ======================================================================= */

/* A tube exists while a client uses or watches it or it holds jobs, and is
 * freed as soon as none of that is true. */
static void test_tube_lifetime(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *b = &w->fc[1];
    struct bg_engine *e = &w->engine;

    /* use */
    assert_int_equal(bg_client_use(&a->client, "used"), BG_OK);
    assert_non_null(bg_tube_find(e, "used"));
    assert_int_equal(tube_stats(w, "used", T0).using, 1);
    assert_int_equal(bg_client_use(&b->client, "used"), BG_OK);
    assert_int_equal(tube_stats(w, "used", T0).using, 2);
    assert_int_equal(bg_client_use(&a->client, "default"), BG_OK);
    assert_non_null(bg_tube_find(e, "used"));
    assert_int_equal(bg_client_use(&b->client, "default"), BG_OK);
    assert_null(bg_tube_find(e, "used"));

    /* watch */
    assert_int_equal(watch(a, "watched"), 2);
    assert_int_equal(tube_stats(w, "watched", T0).watching, 1);
    assert_int_equal(ignore(a, "watched"), 1);
    assert_null(bg_tube_find(e, "watched"));
    /* ignoring a tube one does not watch neither creates nor fails */
    assert_int_equal(ignore(a, "never"), 1);
    assert_null(bg_tube_find(e, "never"));

    /* jobs keep a tube alive after its last user left */
    assert_int_equal(bg_client_use(&a->client, "jobs"), BG_OK);
    uint64_t id = put_job(a, "keep", 1, 5, 60, T0);
    assert_int_equal(bg_client_use(&a->client, "default"), BG_OK);
    assert_non_null(bg_tube_find(e, "jobs"));
    assert_int_equal(bg_delete(&a->client, id, T0), BG_OK);
    assert_null(bg_tube_find(e, "jobs"));

    /* a reserved job keeps its tube alive too */
    assert_int_equal(bg_client_use(&a->client, "res"), BG_OK);
    assert_int_equal(watch(b, "res"), 2);
    id = put_job(a, "r", 1, 0, 60, T0);
    assert_int_equal(reserve_now(b, T0), id);
    assert_int_equal(bg_client_use(&a->client, "default"), BG_OK);
    assert_int_equal(ignore(b, "res"), 1);
    assert_non_null(bg_tube_find(e, "res"));
    assert_int_equal(bg_delete(&b->client, id, T0), BG_OK);
    assert_null(bg_tube_find(e, "res"));

    /* closing a client drops its use and watches */
    assert_int_equal(bg_client_use(&a->client, "closing-use"), BG_OK);
    assert_int_equal(watch(a, "closing-watch"), 2);
    fake_close(a, T0);
    assert_null(bg_tube_find(e, "closing-use"));
    assert_null(bg_tube_find(e, "closing-watch"));
    assert_int_equal(e->tube_count, 1);
    check_world(w);
}

/* "default" exists with no client and no job; it cannot be the last tube
 * ignored, and is kept even when nobody watches or uses it. */
static void test_default_tube_always_exists(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    uint32_t count = 0;
    assert_int_equal(bg_client_ignore(&w->fc[0].client, "default", &count), BG_NOT_IGNORED);
    for (int i = 0; i < WORLD_CLIENTS; i++) {
        assert_int_equal(watch(&w->fc[i], "elsewhere"), 2);
        assert_int_equal(ignore(&w->fc[i], "default"), 1);
        assert_int_equal(bg_client_use(&w->fc[i].client, "elsewhere"), BG_OK);
    }
    struct bg_stats_tube st = tube_stats(w, "default", T0);
    assert_int_equal(st.using, 0);
    assert_int_equal(st.watching, 0);
    assert_ptr_equal(bg_tube_find(e, "default"), e->default_tube);
    for (int i = 0; i < WORLD_CLIENTS; i++) fake_close(&w->fc[i], T0);
    assert_ptr_equal(bg_tube_find(e, "default"), e->default_tube);
    assert_int_equal(e->tube_count, 1);
    assert_ptr_equal(e->tube_list[0], e->default_tube);
    check_world(w);
}

static void assert_tube_list(struct bg_engine *e, const char *const *names, uint32_t n)
{
    assert_int_equal(e->tube_count, n);
    for (uint32_t i = 0; i < n; i++) {
        assert_string_equal(e->tube_list[i]->name, names[i]);
        assert_int_equal(e->tube_list[i]->list_index, i);
    }
}

/* The tube list keeps creation order until a tube is freed; then the last
 * tube moves into the freed slot (swap-remove), as the reference's set does.
 * Observed: [default a b c] -a -> [default c b]; +d -> [default c b d];
 * -c -> [default d b]; -b (last slot, nothing moves) -> [default d]. */
static void test_tube_list_order_after_removal(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *a = &w->fc[0];
    assert_int_equal(watch(a, "a"), 2);
    assert_int_equal(watch(a, "b"), 3);
    assert_int_equal(watch(a, "c"), 4);
    assert_tube_list(e, (const char *const[]){"default", "a", "b", "c"}, 4);

    ignore(a, "a");
    assert_tube_list(e, (const char *const[]){"default", "c", "b"}, 3);
    watch(a, "d");
    assert_tube_list(e, (const char *const[]){"default", "c", "b", "d"}, 4);
    ignore(a, "c");
    assert_tube_list(e, (const char *const[]){"default", "d", "b"}, 3);
    ignore(a, "b"); /* the last slot: nothing moves */
    assert_tube_list(e, (const char *const[]){"default", "d"}, 2);
    check_world(w);
}

/* A paused tube freed before its pause ends leaves no timer behind: the
 * tick at the old unpause time touches nothing (ASan would see a UAF). */
static void test_paused_tube_freed_while_paused(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0];
    assert_int_equal(bg_client_use(&a->client, "ephemeral"), BG_OK);
    assert_int_equal(bg_pause_tube(&w->engine, "ephemeral", 5, T0), BG_OK);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 9, T0), BG_OK);
    assert_int_equal(w->engine.tube_timers.len, 2);
    assert_int_equal(bg_client_use(&a->client, "default"), BG_OK);
    assert_null(bg_tube_find(&w->engine, "ephemeral"));
    assert_int_equal(w->engine.tube_timers.len, 1);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(9));
    check_world(w);
    bg_engine_tick(&w->engine, T0 + SEC(10));
    assert_int_equal(w->engine.tube_timers.len, 0);
    check_world(w);
}

/* Hundreds of tubes: the name table grows (also when that growth fails)
 * and every tube stays findable; freeing them all leaves only default. */
static void test_many_tubes(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *a = &w->fc[0];
    enum { N = 300 };
    char name[32];
    size_t table = e->tubes_mask + 1;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "tube-%d", i);
        uint32_t count = 0;
        if (e->tube_count == table) {
            /* the tube that overflows the table: fail each of the watch's
             * allocations in turn; each failure is clean or tolerated */
            for (uint64_t nth = 1;; nth++) {
                bg_alloc_fail_after(nth);
                int r = bg_client_watch(&a->client, name, &count);
                bg_alloc_fail_after(0);
                check_world(w);
                if (r == BG_OK) break;
                assert_int_equal(r, BG_OUT_OF_MEMORY);
                assert_null(bg_tube_find(e, name));
            }
        } else {
            assert_int_equal(bg_client_watch(&a->client, name, &count), BG_OK);
        }
        assert_int_equal(count, (uint32_t)i + 2);
    }
    assert_true(e->tubes_mask + 1 > table);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "tube-%d", i);
        struct bg_tube *t = bg_tube_find(e, name);
        assert_non_null(t);
        assert_string_equal(t->name, name);
    }
    check_world(w);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "tube-%d", i);
        ignore(a, name);
        assert_null(bg_tube_find(e, name));
    }
    assert_int_equal(e->tube_count, 1);
    check_world(w);
}

/* ======================================================================= */
/* waiters                                                                 */
/* ======================================================================= */

/* A client waiting on t1 and t2 is served by a put into t2 and leaves the
 * waiting set of every tube it watched. */
static void test_waiter_on_two_tubes(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *producer = &w->fc[1];
    struct bg_engine *e = &w->engine;
    watch(a, "t1");
    watch(a, "t2");
    assert_int_equal(reserve(a, -1, T0, NULL), BG_WOULD_BLOCK);
    struct bg_tube *t1 = bg_tube_find(e, "t1"), *t2 = bg_tube_find(e, "t2");
    assert_int_equal(t1->waiting_len, 1);
    assert_int_equal(t2->waiting_len, 1);
    assert_int_equal(e->default_tube->waiting_len, 1);
    assert_int_equal(e->waiting, 1);

    assert_int_equal(bg_client_use(&producer->client, "t2"), BG_OK);
    uint64_t id = put_job(producer, "for a", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count, 1);
    assert_int_equal(a->delivered[0], id);
    assert_int_equal(t1->waiting_len, 0);
    assert_int_equal(t2->waiting_len, 0);
    assert_int_equal(e->default_tube->waiting_len, 0);
    assert_int_equal(e->waiting, 0);
    assert_false(a->client.waiting);

    /* a second put does not reach A, which is no longer waiting */
    uint64_t second = put_job(producer, "nobody", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count, 1);
    assert_int_equal(state_of(w, second), BG_JOB_READY);
    check_world(w);
}

/* Two waiters on one tube and two puts: each waiter gets a different job,
 * the first waiter the first job (the reference's waiting-set order). */
static void test_two_waiters_two_jobs(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *b = &w->fc[1], *producer = &w->fc[2];
    assert_int_equal(reserve(a, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(reserve(b, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 2);

    uint64_t first = put_job(producer, "1", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count + b->delivered_count, 1);
    uint64_t second = put_job(producer, "2", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count, 1);
    assert_int_equal(b->delivered_count, 1);
    assert_int_not_equal(a->delivered[0], b->delivered[0]);
    assert_int_equal(a->delivered[0], first);
    assert_int_equal(b->delivered[0], second);
    assert_ptr_equal(bg_job_reserver(find(w, first)), &a->client);
    assert_ptr_equal(bg_job_reserver(find(w, second)), &b->client);
    check_world(w);
}

/* Waiters are served in the reference's multiset order: a round-robin
 * cursor over a swap-removed array. Four waiters [A B C D] get four puts in
 * the order A, B, D, C. An immediate reserve from a fresh tube leaves its
 * cursor at 1, so three waiters [A B C] are then served B, A, C. */
static void test_waiters_served_in_reference_order(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0];
    struct fake_client *order[4] = {&w->fc[1], &w->fc[2], &w->fc[3], &w->fc[4]};
    static const size_t served_4[] = {0, 1, 3, 2};
    for (size_t i = 0; i < 4; i++) assert_int_equal(reserve(order[i], -1, T0, NULL), BG_WOULD_BLOCK);
    for (size_t k = 0; k < 4; k++) {
        uint64_t id = put_job(producer, "rr", 1, 0, 60, T0);
        struct fake_client *fc = order[served_4[k]];
        assert_int_equal(fc->delivered_count, 1);
        assert_int_equal(fc->delivered[0], id);
    }
    for (size_t i = 0; i < 4; i++) assert_int_equal(bg_delete(&order[i]->client, order[i]->delivered[0], T0), BG_OK);

    /* in a fresh tube (cursor 0), an immediate reserve leaves the cursor at 1 */
    assert_int_equal(bg_client_use(&producer->client, "rr-fresh"), BG_OK);
    for (size_t i = 0; i < 3; i++) watch(order[i], "rr-fresh");
    watch(&w->fc[5], "rr-fresh");
    put_job(producer, "now", 1, 0, 60, T0);
    reserve_now(&w->fc[5], T0);
    static const size_t served_3[] = {1, 0, 2};
    for (size_t i = 0; i < 3; i++) assert_int_equal(reserve(order[i], -1, T0, NULL), BG_WOULD_BLOCK);
    for (size_t k = 0; k < 3; k++) {
        uint64_t id = put_job(producer, "rr", 1, 0, 60, T0);
        struct fake_client *fc = order[served_3[k]];
        assert_int_equal(fc->delivered_count, 2);
        assert_int_equal(fc->delivered[1], id);
    }
    check_world(w);
}

/* A put into a tube nobody watches wakes nobody. */
static void test_put_into_unwatched_tube_wakes_nobody(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *b = &w->fc[1], *producer = &w->fc[2];
    watch(b, "b-only");
    assert_int_equal(reserve(a, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(reserve(b, 30, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_client_use(&producer->client, "lonely"), BG_OK);
    uint64_t id = put_job(producer, "unseen", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count, 0);
    assert_int_equal(b->delivered_count, 0);
    assert_true(a->client.waiting);
    assert_true(b->client.waiting);
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(w->engine.waiting, 2);
    check_world(w);
}

/* A client that stops waiting (hang-up) leaves every waiting set, gets no
 * callback, and later puts do not reach it. */
static void test_stop_waiting(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *producer = &w->fc[1];
    watch(a, "s1");
    assert_int_equal(reserve(a, 5, T0, NULL), BG_WOULD_BLOCK);
    bg_client_stop_waiting(&a->client);
    a->waiting = 0;
    assert_int_equal(w->engine.waiting, 0);
    assert_int_equal(bg_tube_find(&w->engine, "s1")->waiting_len, 0);
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    put_job(producer, "x", 1, 0, 60, T0);
    bg_engine_tick(&w->engine, T0 + SEC(10));
    assert_int_equal(a->delivered_count, 0);
    assert_int_equal(a->ended_count, 0);
    check_world(w);
}

/* A waiter whose peer is gone (ops->alive says 0) is never handed a job:
 * when a job comes, it stops waiting (wait_ended TIMED_OUT, out of every
 * waiting set) and the job goes to the next live waiter in the reference
 * order, or stays ready if none is left. Waiters without the op are never
 * asked. */
static void test_dead_waiter_is_skipped(void **state)
{
    struct world *w = *state;
    struct fake_client *a = &w->fc[0], *b = &w->fc[1], *c = &w->fc[2], *producer = &w->fc[3];
    struct fake_client *plain = &w->fc[4];
    a->client.ops = b->client.ops = c->client.ops = &fake_ops_alive;
    watch(a, "other");  /* a also waits on a second tube */
    assert_int_equal(reserve(a, 30, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(reserve(b, 30, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(reserve(c, 30, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 3);
    a->gone = 1;                        /* first in line, and gone */

    uint64_t first = put_job(producer, "1", 1, 0, 60, T0);
    assert_int_equal(a->delivered_count, 0);
    assert_int_equal(a->ended_count, 1);
    assert_int_equal(a->ended[0], BG_TIMED_OUT);
    assert_false(a->client.waiting);
    assert_int_equal(tube_stats(w, "other", T0).waiting, 0);
    /* a left the set as a hang-up does (swap-remove): [c b], cursor at c */
    assert_int_equal(c->delivered_count, 1);
    assert_int_equal(c->delivered[0], first);
    assert_int_equal(b->delivered_count, 0);
    assert_int_equal(bg_job_reserves(find(w, first)), 1);
    assert_int_equal(w->engine.waiting, 1);
    check_world(w);

    b->gone = 1;                        /* the last waiter leaves too */
    uint64_t second = put_job(producer, "2", 1, 0, 60, T0);
    assert_int_equal(b->delivered_count, 0);
    assert_int_equal(b->ended_count, 1);
    assert_int_equal(state_of(w, second), BG_JOB_READY);
    assert_int_equal(bg_job_reserves(find(w, second)), 0);
    assert_int_equal(w->engine.waiting, 0);
    assert_int_equal(tube_stats(w, "default", T0).waiting, 0);
    assert_int_equal(bg_engine_next_deadline(&w->engine), bg_job_deadline(find(w, first)));
    check_world(w);

    /* a waiter without the op still gets the next job; the ready one goes
     * to it at once, and nobody is asked */
    size_t asked = a->alive_asked + b->alive_asked + c->alive_asked;
    assert_int_equal(reserve(plain, 30, T0, NULL), BG_OK);
    assert_int_equal(reserve(plain, 30, T0, NULL), BG_WOULD_BLOCK);
    uint64_t third = put_job(producer, "3", 1, 0, 60, T0);
    assert_int_equal(plain->delivered_count, 1);
    assert_int_equal(plain->delivered[0], third);
    assert_int_equal(a->alive_asked + b->alive_asked + c->alive_asked, asked);
    check_world(w);
}

/* ======================================================================= */
/* client close                                                            */
/* ======================================================================= */

/* Closing a client returns its reserved jobs to ready with their priority,
 * not counted as timeouts. */
static void test_close_returns_reserved_jobs(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t x = put_job(producer, "x", 5, 0, 60, T0);
    uint64_t y = put_job(producer, "y", 7, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), x);
    assert_int_equal(reserve_now(worker, T0), y);
    assert_int_equal(w->engine.reserved_count, 2);

    fake_close(worker, T0 + SEC(1));
    assert_int_equal(state_of(w, x), BG_JOB_READY);
    assert_int_equal(state_of(w, y), BG_JOB_READY);
    assert_int_equal(find(w, x)->pri, 5);
    assert_int_equal(find(w, y)->pri, 7);
    assert_int_equal(bg_job_timeouts(find(w, x)), 0);
    assert_int_equal(w->engine.stat.job_timeouts, 0);
    assert_int_equal(w->engine.reserved_count, 0);
    assert_int_equal(w->engine.ready_count, 2);
    assert_int_equal(tube_stats(w, "default", T0).reserved, 0);
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    check_world(w);
}

/* A job freed by a closing client goes to a waiting client at once. */
static void test_close_hands_job_to_waiter(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1], *waiter = &w->fc[2];
    uint64_t x = put_job(producer, "x", 5, 0, 60, T0);
    uint64_t y = put_job(producer, "y", 7, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), x);
    assert_int_equal(reserve_now(worker, T0), y);
    assert_int_equal(reserve(waiter, -1, T0, NULL), BG_WOULD_BLOCK);
    fake_close(worker, T0);
    assert_int_equal(waiter->delivered_count, 1);
    assert_int_equal(waiter->delivered[0], x); /* returned in reservation order */
    assert_int_equal(state_of(w, y), BG_JOB_READY);
    check_world(w);
}

/* Closing a waiting client removes it from the waiting sets silently. */
static void test_close_while_waiting(void **state)
{
    struct world *w = *state;
    struct fake_client *waiter = &w->fc[2];
    watch(waiter, "cw");
    assert_int_equal(reserve(waiter, 5, T0, NULL), BG_WOULD_BLOCK);
    fake_close(waiter, T0);
    assert_int_equal(w->engine.waiting, 0);
    assert_null(bg_tube_find(&w->engine, "cw"));
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    bg_engine_tick(&w->engine, T0 + SEC(5));
    assert_int_equal(waiter->ended_count, 0);
    check_world(w);
}

/* ======================================================================= */
/* delete, release, bury, touch, reserve-job                               */
/* ======================================================================= */

/* delete works on one's own reserved job and on ready, delayed and buried
 * jobs; another client's reservation and unknown ids are NOT_FOUND. Only
 * successful deletes count in the tube's cmd-delete. */
static void test_delete_by_state(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *me = &w->fc[1], *other = &w->fc[2];
    uint64_t mine = put_job(producer, "mine", 1, 0, 60, T0);
    assert_int_equal(reserve_now(me, T0), mine);
    uint64_t theirs = put_job(producer, "theirs", 2, 0, 60, T0);
    assert_int_equal(reserve_now(other, T0), theirs);
    put_job(producer, "to bury", 3, 0, 60, T0);
    uint64_t buried = reserve_and_bury(other, 3, T0);
    uint64_t delayed = put_job(producer, "delayed", 4, 50, 60, T0);
    uint64_t ready = put_job(producer, "ready", 5, 0, 60, T0);

    static const struct {
        int which; /* index into ids[] */
        int outcome;
    } cases[] = {
        {1, BG_NOT_FOUND}, /* another client's reservation */
        {0, BG_OK},
        {2, BG_OK},
        {3, BG_OK},
        {4, BG_OK},
        {5, BG_NOT_FOUND}, /* never existed */
        {0, BG_NOT_FOUND}, /* already deleted */
    };
    uint64_t ids[6] = {mine, theirs, buried, delayed, ready, 424242};
    uint64_t deleted = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t id = ids[cases[i].which];
        assert_int_equal(bg_delete(&me->client, id, T0), cases[i].outcome);
        if (cases[i].outcome == BG_OK) {
            deleted++;
            assert_null(find(w, id));
        }
        assert_int_equal(tube_stats(w, "default", T0).cmd_delete, deleted);
    }
    assert_int_equal(state_of(w, theirs), BG_JOB_RESERVED);
    assert_int_equal(w->engine.job_count, 1);
    assert_int_equal(w->engine.ready_count + w->engine.delayed_count + w->engine.buried_count, 0);
    assert_int_equal(w->engine.reserved_count, 1);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(60)); /* theirs' TTR only */
    check_world(w);
}

/* release with a delay makes the job delayed with the new pri, counts a
 * release, and the job becomes ready when the delay ends. */
static void test_release_with_delay(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1], *other = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "rel", 5, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), id);
    assert_int_equal(bg_release(&other->client, id, 1, 0, T0), BG_NOT_FOUND);
    assert_int_equal(bg_release(&worker->client, 777, 1, 0, T0), BG_NOT_FOUND);

    assert_int_equal(bg_release(&worker->client, id, 99, 5, T0 + SEC(1)), BG_OK);
    struct bg_job *j = find(w, id);
    assert_int_equal(j->state, BG_JOB_DELAYED);
    assert_int_equal(j->pri, 99);
    assert_int_equal(bg_job_releases(j), 1);
    assert_int_equal(bg_job_deadline(j), T0 + SEC(6));
    assert_int_equal(w->engine.reserved_count, 0);
    assert_int_equal(w->engine.delayed_count, 1);
    assert_null(worker->client.reserved_head);
    struct bg_stats_job sj;
    bg_stats_job(&w->engine, j, T0 + SEC(1), &sj);
    assert_string_equal(sj.state, "delayed");
    assert_int_equal(sj.delay_s, 5);
    assert_int_equal(sj.releases, 1);
    assert_int_equal(sj.time_left_s, 5);
    /* released twice is NOT_FOUND: it is no longer reserved */
    assert_int_equal(bg_release(&worker->client, id, 1, 0, T0 + SEC(1)), BG_NOT_FOUND);

    bg_engine_tick(&w->engine, T0 + SEC(6));
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(find(w, id)), 0);
    check_world(w);
}

/* release without delay makes the job ready and serves a waiter. */
static void test_release_to_waiter(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1], *waiter = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "rel", 5, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), id);
    assert_int_equal(reserve(waiter, -1, T0, NULL), BG_WOULD_BLOCK);
    assert_int_equal(bg_release(&worker->client, id, 2000, 0, T0), BG_OK);
    assert_int_equal(waiter->delivered_count, 1);
    assert_int_equal(waiter->delivered[0], id);
    assert_int_equal(find(w, id)->pri, 2000);
    assert_int_equal(bg_job_reserves(find(w, id)), 2);
    check_world(w);
}

/* bury moves one's own reserved job to the buried list with the new pri. */
static void test_bury(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1], *other = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "bury me", 5, 0, 60, T0);
    assert_int_equal(reserve_now(worker, T0), id);
    assert_int_equal(bg_bury(&other->client, id, 1, T0), BG_NOT_FOUND);
    assert_int_equal(bg_bury(&worker->client, id, 42, T0), BG_OK);
    struct bg_job *j = find(w, id);
    assert_int_equal(j->state, BG_JOB_BURIED);
    assert_int_equal(j->pri, 42);
    assert_int_equal(bg_job_buries(j), 1);
    assert_ptr_equal(bg_peek(w->engine.default_tube, BG_JOB_BURIED), j); /* peek-buried */
    assert_int_equal(w->engine.buried_count, 1);
    assert_int_equal(tube_stats(w, "default", T0).buried, 1);
    assert_int_equal(bg_bury(&worker->client, id, 1, T0), BG_NOT_FOUND); /* not reserved */
    assert_int_equal(bg_engine_next_deadline(&w->engine), NEVER);
    check_world(w);
}

/* touch restarts the TTR from now: the engine's next deadline moves and
 * the job survives the old deadline. */
static void test_touch_extends_deadline(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1], *other = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "touch", 5, 0, 10, T0);
    assert_int_equal(reserve_now(worker, T0), id);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(10));

    assert_int_equal(bg_touch(&other->client, id, T0 + SEC(4)), BG_NOT_FOUND);
    assert_int_equal(bg_touch(&worker->client, id, T0 + SEC(4)), BG_OK);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(14));
    bg_engine_tick(&w->engine, T0 + SEC(10));
    assert_int_equal(state_of(w, id), BG_JOB_RESERVED);
    assert_int_equal(w->engine.stat.job_timeouts, 0);
    bg_engine_tick(&w->engine, T0 + SEC(14));
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(find(w, id)), 1);
    assert_int_equal(bg_touch(&worker->client, id, T0 + SEC(14)), BG_NOT_FOUND);
    check_world(w);
}

/* touch also moves a waiting holder's DEADLINE_SOON wake time. */
static void test_touch_moves_deadline_soon_wake(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t first = put_job(&w->fc[0], "a", 1, 0, 10, T0);
    uint64_t second = put_job(&w->fc[0], "b", 1, 0, 20, T0);
    assert_int_equal(reserve_now(worker, T0), first);
    assert_int_equal(reserve_now(worker, T0), second);
    assert_int_equal(bg_touch(&worker->client, first, T0 + SEC(5)), BG_OK); /* now ends at 15 */
    assert_int_equal(reserve(worker, -1, T0 + SEC(5), NULL), BG_WOULD_BLOCK);
    assert_int_equal(worker->client.wake_at, T0 + SEC(14));
    bg_engine_tick(&w->engine, T0 + SEC(14));
    assert_int_equal(worker->ended_count, 1);
    assert_int_equal(worker->ended[0], BG_DEADLINE_SOON);
    check_world(w);
}

/* reserve-job takes a ready, delayed or buried job by id; a reserved one
 * (even one's own) or a missing id is NOT_FOUND. */
static void test_reserve_job_by_state(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *me = &w->fc[1], *other = &w->fc[2];
    put_job(producer, "buried", 0, 0, 60, T0);
    uint64_t buried = reserve_and_bury(other, 1, T0);
    uint64_t ready = put_job(producer, "ready", 1, 0, 60, T0);
    uint64_t delayed = put_job(producer, "delayed", 1, 100, 7, T0);
    uint64_t theirs = put_job(producer, "theirs", 1, 0, 60, T0);
    struct bg_job *taken = NULL;
    assert_int_equal(bg_reserve_job(&other->client, theirs, T0, &taken), BG_OK);
    assert_ptr_equal(taken, find(w, theirs));

    static const struct {
        int which; /* index into ids[] */
        int outcome;
    } cases[] = {
        {0, BG_OK},        /* ready */
        {1, BG_OK},        /* delayed */
        {2, BG_OK},        /* buried */
        {3, BG_NOT_FOUND}, /* reserved by another */
        {0, BG_NOT_FOUND}, /* reserved by me */
        {4, BG_NOT_FOUND}, /* missing */
    };
    uint64_t ids[5] = {ready, delayed, buried, theirs, 31337};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_job *j = NULL;
        uint64_t id = ids[cases[i].which];
        assert_int_equal(bg_reserve_job(&me->client, id, T0 + SEC(1), &j), cases[i].outcome);
        if (cases[i].outcome == BG_OK) {
            assert_non_null(j);
            assert_int_equal(j->id, id);
            assert_int_equal(j->state, BG_JOB_RESERVED);
            assert_ptr_equal(bg_job_reserver(j), &me->client);
            assert_int_equal(bg_job_deadline(j), T0 + SEC(1) + SEC(j->ttr_s));
        }
    }
    assert_ptr_equal(bg_job_reserver(find(w, theirs)), &other->client);
    assert_int_equal(w->engine.delayed_count, 0);
    assert_int_equal(w->engine.buried_count, 0);
    assert_int_equal(w->engine.reserved_count, 4);
    assert_int_equal(me->client.reserved.len, 3);
    assert_int_equal(w->engine.workers, 2);
    check_world(w);
}

/* ======================================================================= */
/* time: every entry point first does what fell due (issue 11, defect 3)   */
/* ======================================================================= */
/* In these tests a deadline passes and no bg_engine_tick runs before the
 * next call, as when the loop reads a command before its timer fires. The
 * call must see the deadline as passed. */

/* The defect: pause-tube T 0, then reserve-with-timeout 0 at the same
 * `now` (both commands in one read) hands out T's ready job. */
static void test_catch_up_pause_zero_then_reserve(void **state)
{
    struct world *w = *state;
    struct fake_client *worker = &w->fc[1];
    uint64_t id = put_job(&w->fc[0], "p0", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 0, T0), BG_OK);
    assert_int_equal(reserve_now(worker, T0), id);
    /* the same after a long pause that pause 0 cuts short */
    uint64_t id2 = put_job(&w->fc[0], "p100", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 100, T0), BG_OK);
    assert_int_equal(reserve(worker, 0, T0, NULL), BG_TIMED_OUT);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 0, T0), BG_OK);
    assert_int_equal(reserve_now(worker, T0), id2);
    check_world(w);
}

/* A pause whose end has passed is over for the next call. */
static void test_catch_up_pause_ended_without_tick(void **state)
{
    struct world *w = *state;
    uint64_t id = put_job(&w->fc[0], "held", 1, 0, 60, T0);
    assert_int_equal(bg_pause_tube(&w->engine, "default", 5, T0), BG_OK);
    assert_int_equal(reserve(&w->fc[1], 0, T0 + SEC(5) - 1, NULL), BG_TIMED_OUT);
    assert_int_equal(reserve_now(&w->fc[1], T0 + SEC(5)), id);
    assert_int_equal(bg_tube_find(&w->engine, "default")->pause_ns, 0);
    check_world(w);
}

/* A delayed job whose delay has passed is ready: reservable, no longer
 * kickable (kick counts nothing, kick-job is NOT_FOUND), as after a tick. */
static void test_catch_up_delayed_job_due_without_tick(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0];
    uint64_t a = put_job(producer, "a", 1, 1, 60, T0);
    uint64_t b = put_job(producer, "b", 2, 1, 60, T0);
    assert_int_equal(bg_kick(&w->engine, producer->client.use, 10, T0 + SEC(1)), 0);
    assert_int_equal(bg_kick_job(&w->engine, b, T0 + SEC(1)), BG_NOT_FOUND);
    assert_int_equal(bg_job_kicks(find(w, a)), 0);
    assert_int_equal(bg_job_kicks(find(w, b)), 0);
    assert_int_equal(w->engine.delayed_count, 0);
    assert_int_equal(reserve_now(&w->fc[1], T0 + SEC(1)), a);

    /* c, due at +3 s with pri 1, beats b (pri 2), ready since +1 s */
    uint64_t c = put_job(producer, "c", 1, 2, 60, T0 + SEC(1));
    assert_int_equal(reserve_now(&w->fc[2], T0 + SEC(3)), c);
    assert_int_equal(reserve_now(&w->fc[2], T0 + SEC(3)), b);
    check_world(w);
}

/* A reservation whose TTR has passed is over: its old owner can no longer
 * touch, release or bury it (NOT_FOUND), the timeout is counted, and the
 * job is ready for anyone; delete then deletes a ready job. */
static void test_catch_up_ttr_ended_without_tick(void **state)
{
    struct world *w = *state;
    struct fake_client *owner = &w->fc[1], *other = &w->fc[2];
    uint64_t id = put_job(&w->fc[0], "ttr", 1, 0, 2, T0);
    assert_int_equal(reserve_now(owner, T0), id);
    bg_time late = T0 + SEC(2);
    assert_int_equal(bg_touch(&owner->client, id, late), BG_NOT_FOUND);
    assert_int_equal(bg_release(&owner->client, id, 5, 0, late), BG_NOT_FOUND);
    assert_int_equal(bg_bury(&owner->client, id, 5, late), BG_NOT_FOUND);
    struct bg_job *j = find(w, id);
    assert_int_equal(j->state, BG_JOB_READY);
    assert_int_equal(bg_job_timeouts(j), 1);
    assert_int_equal(w->engine.stat.job_timeouts, 1);
    assert_null(owner->client.reserved_head);

    /* one nanosecond earlier it was still the owner's */
    uint64_t id2 = put_job(&w->fc[0], "ttr2", 9, 0, 2, late);
    assert_int_equal(reserve_now(other, late), id); /* the expired job first */
    assert_int_equal(reserve_now(owner, late), id2);
    assert_int_equal(bg_touch(&owner->client, id2, late + SEC(2) - 1), BG_OK);
    assert_int_equal(bg_delete(&other->client, id, late + SEC(2)), BG_OK);
    assert_int_equal(bg_delete(&owner->client, id2, late + SEC(4) - 1), BG_OK);
    check_world(w);
}

/* A waiter whose timeout has passed times out; a put at that moment does
 * not hand it the job, which stays ready. */
static void test_catch_up_waiter_timed_out_before_put(void **state)
{
    struct world *w = *state;
    struct fake_client *waiter = &w->fc[1];
    assert_int_equal(reserve(waiter, 1, T0, NULL), BG_WOULD_BLOCK);
    uint64_t id = put_job(&w->fc[0], "late", 1, 0, 60, T0 + SEC(1));
    assert_int_equal(waiter->ended_count, 1);
    assert_int_equal(waiter->ended[0], BG_TIMED_OUT);
    assert_int_equal(waiter->delivered_count, 0);
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    assert_int_equal(w->engine.waiting, 0);
    check_world(w);
}

/* A client closing after its job's TTR passed: the job timed out (counted),
 * as if the tick had run first; its other job just goes back. */
static void test_catch_up_close_counts_expired_ttr(void **state)
{
    struct world *w = *state;
    struct fake_client *owner = &w->fc[1];
    uint64_t short_ttr = put_job(&w->fc[0], "short", 1, 0, 1, T0);
    uint64_t long_ttr = put_job(&w->fc[0], "long", 2, 0, 60, T0);
    assert_int_equal(reserve_now(owner, T0), short_ttr);
    assert_int_equal(reserve_now(owner, T0), long_ttr);
    fake_close(owner, T0 + SEC(1));
    assert_int_equal(bg_job_timeouts(find(w, short_ttr)), 1);
    assert_int_equal(bg_job_timeouts(find(w, long_ttr)), 0);
    assert_int_equal(w->engine.stat.job_timeouts, 1);
    assert_int_equal(w->engine.ready_count, 2);
    check_world(w);
}

/* The catch-up is one compare while nothing is due: due_at is a lower
 * bound of the deadlines, lowered by every new deadline and made exact
 * only by a tick. A deadline removed early leaves due_at low (no tick runs
 * before it); the first call at or after it ticks once and makes it exact. */
static void test_catch_up_due_at_bound(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0];
    assert_int_equal(w->engine.due_at, NEVER);
    uint64_t id = put_job(producer, "d", 1, 10, 60, T0);
    assert_int_equal(w->engine.due_at, T0 + SEC(10));
    put_job(producer, "later", 1, 20, 60, T0);
    assert_int_equal(w->engine.due_at, T0 + SEC(10));
    assert_int_equal(bg_delete(&producer->client, id, T0 + SEC(1)), BG_OK);
    assert_int_equal(bg_engine_next_deadline(&w->engine), T0 + SEC(20));
    /* before due_at: no tick, so the stale bound stays as it is */
    assert_int_equal(reserve(&w->fc[1], 0, T0 + SEC(10) - 1, NULL), BG_TIMED_OUT);
    assert_int_equal(w->engine.due_at, T0 + SEC(10));
    /* at due_at: one tick finds nothing due and makes the bound exact */
    assert_int_equal(reserve(&w->fc[1], 0, T0 + SEC(10), NULL), BG_TIMED_OUT);
    assert_int_equal(w->engine.due_at, T0 + SEC(20));
    /* a reservation, a pause and a waiter lower it too */
    uint64_t r = put_job(producer, "r", 1, 0, 5, T0 + SEC(10));
    assert_int_equal(reserve_now(&w->fc[1], T0 + SEC(10)), r);
    assert_int_equal(w->engine.due_at, T0 + SEC(15));
    assert_int_equal(bg_pause_tube(&w->engine, "default", 3, T0 + SEC(10)), BG_OK);
    assert_int_equal(w->engine.due_at, T0 + SEC(13));
    assert_int_equal(reserve(&w->fc[2], 1, T0 + SEC(10), NULL), BG_WOULD_BLOCK);
    assert_int_equal(w->engine.due_at, T0 + SEC(11));
    check_world(w);
}

/* ---- the same through the beanstalk codec: one `now` per read ---------- */

struct session_rig {
    struct bg_engine e;
    struct bg_session a, b;
};

static void rig_open(struct session_rig *r)
{
    assert_int_equal(bg_engine_init(&r->e, MAX_JOB_SIZE, NULL), BG_OK);
    assert_int_equal(bg_session_init(&r->e, &r->a, NULL, NULL), BG_OK);
    assert_int_equal(bg_session_init(&r->e, &r->b, NULL, NULL), BG_OK);
}

static void rig_close(struct session_rig *r, bg_time now)
{
    bg_session_close(&r->a, now);
    bg_session_close(&r->b, now);
    bg_engine_destroy(&r->e);
}

/* Feed `in` whole to s at `now` (no tick) and check the replies it added. */
static void feed_expect(struct bg_session *s, const char *in, bg_time now, const char *want)
{
    bg_buf_clear(&s->stream.out);
    size_t n = strlen(in);
    assert_int_equal(bg_session_feed(s, in, n, now), n);
    size_t wn = strlen(want);
    if (s->stream.out.len != wn || (wn && memcmp(bg_buf_head(&s->stream.out), want, wn) != 0))
        fail_msg("after %s\ngot  %.*s\nwant %s", in, (int)s->stream.out.len, s->stream.out.len ? bg_buf_head(&s->stream.out) : "", want);
}

/* Feed a stats command to s at `now`; its reply must contain `line`. */
static void expect_stat_line(struct bg_session *s, const char *cmd, bg_time now, const char *line)
{
    bg_buf_clear(&s->stream.out);
    assert_int_equal(bg_session_feed(s, cmd, strlen(cmd), now), strlen(cmd));
    if (!memmem(bg_buf_head(&s->stream.out), s->stream.out.len, line, strlen(line)))
        fail_msg("no \"%s\" in %.*s", line, (int)s->stream.out.len, bg_buf_head(&s->stream.out));
}

/* list-tubes and list-tubes-watched answer OUT_OF_MEMORY when their reply
 * is over BG_REPLY_SMALL and does not fit the stream's reply budget beside
 * what is held: a reply of exactly the room left goes, one byte more is
 * refused (and counted); a small reply always goes. */
static void test_session_reply_budget(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    char cmd[300], want[32];
    for (int i = 0; i < 100; i++) { /* 100 tubes of 200-byte names: a listing of about 20 KB */
        snprintf(cmd, sizeof cmd, "watch t%03d%0196d\r\n", i, 0);
        snprintf(want, sizeof want, "WATCHING %d\r\n", i + 2);
        feed_expect(&r.a, cmd, T0, want);
    }
    bg_buf_clear(&r.a.stream.out);
    assert_int_equal(bg_session_feed(&r.a, "list-tubes\r\n", 12, T0), 12);
    size_t whole = r.a.stream.out.len;
    assert_true(whole > BG_REPLY_SMALL);
    assert_memory_equal(bg_buf_head(&r.a.stream.out), "OK ", 3);
    struct bg_reply_budget b = {.max = 1u << 20};
    r.a.stream.budget = &b;
    b.held = b.max - whole; /* exactly the room left */
    bg_buf_clear(&r.a.stream.out);
    assert_int_equal(bg_session_feed(&r.a, "list-tubes\r\n", 12, T0), 12);
    assert_int_equal(r.a.stream.out.len, whole);
    assert_int_equal(b.refused, 0);
    b.held++; /* one byte short */
    feed_expect(&r.a, "list-tubes\r\n", T0, "OUT_OF_MEMORY\r\n");
    feed_expect(&r.a, "list-tubes-watched\r\n", T0, "OUT_OF_MEMORY\r\n");
    assert_int_equal(b.refused, 2);
    b.held = 0; /* nothing held: a reply larger than the whole budget goes */
    b.max = whole - 1;
    bg_buf_clear(&r.a.stream.out);
    assert_int_equal(bg_session_feed(&r.a, "list-tubes\r\n", 12, T0), 12);
    assert_int_equal(r.a.stream.out.len, whole);
    b.held = b.max * 2; /* far over: small replies still go */
    r.b.stream.budget = &b;
    feed_expect(&r.a, "list-tube-used\r\n", T0, "USING default\r\n");
    feed_expect(&r.b, "list-tubes-watched\r\n", T0, "OK 14\r\n---\n- default\n\r\n");
    assert_int_equal(b.refused, 2);
    r.a.stream.budget = r.b.stream.budget = NULL;
    rig_close(&r, T0);
}

/* bg_buf_shrink cuts a buffer that uses a quarter of its room or less to
 * twice what it uses (at least BG_BUF_KEEP), keeps its bytes, leaves a
 * fuller or small one alone, and frees an empty one. */
static void test_buf_shrink(void **state)
{
    (void)state;
    struct bg_buf b = {0};
    char chunk[1000];
    for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (char)('a' + i % 26);
    for (int i = 0; i < 1000; i++) assert_int_equal(bg_buf_append(&b, chunk, sizeof chunk), 0);
    size_t big = b.cap;
    assert_true(big >= 1000000);
    bg_buf_consume(&b, 1000000 - 300000); /* 300,000 left: more than a quarter */
    bg_buf_shrink(&b);
    assert_int_equal(b.cap, big);
    bg_buf_consume(&b, 300000 - 10000); /* 10,000 left */
    bg_buf_shrink(&b);
    assert_int_equal(b.cap, 20000);
    assert_int_equal(b.len, 10000);
    assert_int_equal(b.start, 0);
    assert_memory_equal(bg_buf_head(&b), chunk, 1000); /* 990,000 consumed: a multiple of 1000 */
    bg_buf_consume(&b, 9990); /* 10 left: cut to BG_BUF_KEEP */
    bg_buf_shrink(&b);
    assert_int_equal(b.cap, BG_BUF_KEEP);
    assert_memory_equal(bg_buf_head(&b), chunk + 990, 10);
    bg_buf_shrink(&b); /* small: left alone */
    assert_int_equal(b.cap, BG_BUF_KEEP);
    bg_buf_consume(&b, 10);
    bg_buf_shrink(&b); /* empty: freed */
    assert_null(b.data);
    assert_int_equal(b.cap, 0);
}

/* A client watches at most BG_WATCH_MAX tubes: the next new one answers
 * OUT_OF_MEMORY and makes no tube; watching one it has, or a new one after
 * an ignore, still works. */
static void test_session_watch_limit(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    char cmd[64], want[32];
    for (int i = 1; i < BG_WATCH_MAX; i++) { /* default is the first */
        snprintf(cmd, sizeof cmd, "watch w%d\r\n", i);
        snprintf(want, sizeof want, "WATCHING %d\r\n", i + 1);
        feed_expect(&r.a, cmd, T0, want);
    }
    uint32_t tubes = r.e.tube_count;
    feed_expect(&r.a, "watch one-too-many\r\n", T0, "OUT_OF_MEMORY\r\n");
    assert_null(bg_tube_find(&r.e, "one-too-many"));
    assert_int_equal(r.e.tube_count, tubes);
    snprintf(want, sizeof want, "WATCHING %d\r\n", BG_WATCH_MAX);
    feed_expect(&r.a, "watch w7\r\n", T0, want);
    snprintf(want, sizeof want, "WATCHING %d\r\n", BG_WATCH_MAX - 1);
    feed_expect(&r.a, "ignore w7\r\n", T0, want);
    snprintf(want, sizeof want, "WATCHING %d\r\n", BG_WATCH_MAX);
    feed_expect(&r.a, "watch one-too-many\r\n", T0, want);
    feed_expect(&r.b, "watch w7\r\n", T0, "WATCHING 2\r\n"); /* another client is not limited by it */
    rig_close(&r, T0);
}

/* Both commands in one read, so one `now`: the job is handed out. */
static void test_session_pause_zero_then_reserve_one_read(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    feed_expect(&r.a, "put 0 0 60 1\r\nx\r\n", T0, "INSERTED 1\r\n");
    feed_expect(&r.a, "pause-tube default 0\r\nreserve-with-timeout 0\r\n", T0,
                "PAUSED\r\nRESERVED 1 1\r\nx\r\n");
    rig_close(&r, T0);
}

/* peek-delayed, peek-ready, stats-tube and stats-job read the engine
 * directly: after the delay passed they show the job ready, no tick run. */
static void test_session_reads_after_delay_passed(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    feed_expect(&r.a, "put 0 1 60 1\r\nx\r\n", T0, "INSERTED 1\r\n");
    expect_stat_line(&r.b, "stats-tube default\r\n", T0 + SEC(1), "\ncurrent-jobs-delayed: 0\n");
    expect_stat_line(&r.b, "stats-tube default\r\n", T0 + SEC(1), "\ncurrent-jobs-ready: 1\n");
    expect_stat_line(&r.b, "stats-job 1\r\n", T0 + SEC(1), "\nstate: ready\n");
    expect_stat_line(&r.b, "stats\r\n", T0 + SEC(1), "\ncurrent-jobs-delayed: 0\n");
    feed_expect(&r.b, "peek-delayed\r\n", T0 + SEC(1), "NOT_FOUND\r\n");
    feed_expect(&r.b, "peek-ready\r\n", T0 + SEC(1), "FOUND 1 1\r\nx\r\n");
    rig_close(&r, T0 + SEC(1));
}

/* stats-job after the TTR passed: ready, one timeout; touch is NOT_FOUND. */
static void test_session_reads_after_ttr_passed(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    feed_expect(&r.a, "put 0 0 1 1\r\nx\r\nreserve\r\n", T0, "INSERTED 1\r\nRESERVED 1 1\r\nx\r\n");
    expect_stat_line(&r.b, "stats-job 1\r\n", T0 + SEC(1), "\nstate: ready\n");
    expect_stat_line(&r.b, "stats-job 1\r\n", T0 + SEC(1), "\ntimeouts: 1\n");
    feed_expect(&r.a, "touch 1\r\n", T0 + SEC(1), "NOT_FOUND\r\n");
    rig_close(&r, T0 + SEC(1));
}

/* A waiting session whose peer half-closes after its wait's end passed
 * (here the DEADLINE_SOON wake of its held job) gets that end, not the
 * TIMED_OUT a half-close gives: its own wait ends inside its own call. */
static void test_session_peer_eof_after_wake_passed(void **state)
{
    (void)state;
    struct session_rig r;
    rig_open(&r);
    feed_expect(&r.a, "put 0 0 2 1\r\nx\r\nreserve\r\n", T0, "INSERTED 1\r\nRESERVED 1 1\r\nx\r\n");
    feed_expect(&r.a, "reserve-with-timeout 10\r\n", T0 + MSEC(500), "");
    assert_int_equal(r.a.stream.blocked, 1);
    bg_session_peer_eof(&r.a, T0 + MSEC(1500));
    assert_int_equal(r.a.stream.blocked, 0);
    assert_int_equal(r.a.stream.out.len, strlen("DEADLINE_SOON\r\n"));
    assert_memory_equal(bg_buf_head(&r.a.stream.out), "DEADLINE_SOON\r\n", r.a.stream.out.len);
    assert_int_equal(r.e.waiting, 0);
    /* a half-close before that: TIMED_OUT, as before */
    feed_expect(&r.b, "reserve-with-timeout 10\r\n", T0 + MSEC(1500), "");
    bg_session_peer_eof(&r.b, T0 + MSEC(1600));
    assert_int_equal(r.b.stream.out.len, strlen("TIMED_OUT\r\n"));
    assert_memory_equal(bg_buf_head(&r.b.stream.out), "TIMED_OUT\r\n", r.b.stream.out.len);
    rig_close(&r, T0 + SEC(2));
}

/* ======================================================================= */
/* draining and allocation failure                                         */
/* total_jobs_reserved and total_jobs_deleted count every reservation
 * (reserve, reserve-job, a waiter served by a put, a job reserved again
 * after its TTR) and every delete, whoever does it; a refused delete, and
 * a reservation handed to another client (the HTTP long-poll's), count
 * nothing. */
static void test_jobs_reserved_and_deleted(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *a = &w->fc[0], *b = &w->fc[1];
    assert_int_equal(e->stat.total_jobs_reserved, 0);
    assert_int_equal(e->stat.total_jobs_deleted, 0);
    uint64_t j1 = put_job(a, "one", 1, 0, 1, T0);
    uint64_t j2 = put_job(a, "two", 2, 0, 60, T0);
    assert_int_equal(reserve_now(b, T0), j1);
    struct bg_job *got = NULL;
    assert_int_equal(bg_reserve_job(&a->client, j2, T0, &got), BG_OK);
    assert_int_equal(e->stat.total_jobs_reserved, 2);
    assert_int_equal(bg_delete(&a->client, j1, T0), BG_NOT_FOUND); /* b's reservation */
    assert_int_equal(e->stat.total_jobs_deleted, 0);
    bg_engine_tick(e, T0 + SEC(2)); /* j1's TTR ends */
    assert_int_equal(reserve_now(a, T0 + SEC(2)), j1);
    assert_int_equal(e->stat.total_jobs_reserved, 3);
    assert_int_equal(reserve(b, -1, T0 + SEC(2), NULL), BG_WOULD_BLOCK);
    uint64_t j3 = put_job(a, "three", 1, 0, 60, T0 + SEC(2)); /* b's wait takes it */
    assert_int_equal(bg_job_reserver(find(w, j3)), &b->client);
    assert_int_equal(e->stat.total_jobs_reserved, 4);
    assert_int_equal(bg_heap_reserve(&a->client.reserved, a->client.reserved.len + 1), 0);
    bg_reservation_transfer(find(w, j3), &a->client);
    assert_int_equal(bg_job_reserver(find(w, j3)), &a->client);
    assert_int_equal(e->stat.total_jobs_reserved, 4);
    assert_int_equal(bg_delete(&a->client, j1, T0 + SEC(2)), BG_OK);
    assert_int_equal(bg_delete(&a->client, j2, T0 + SEC(2)), BG_OK);
    assert_int_equal(bg_delete(&a->client, j3, T0 + SEC(2)), BG_OK);
    assert_int_equal(e->stat.total_jobs_deleted, 3);
    /* the engine's entry points count no request: each front-end does that */
    assert_int_equal(e->stat.cmd[BG_CMD_RESERVE] + e->stat.cmd[BG_CMD_RESERVE_JOB] + e->stat.cmd[BG_CMD_DELETE], 0);
    check_world(w);
}

/* ======================================================================= */

/* While draining, put is refused with DRAINING and the job is freed (the
 * ASan build reports a leak otherwise); nothing is counted. */
/* A put while the log cannot write is refused with its own outcome (not
 * OUT_OF_MEMORY: HTTP says 503 LOG_UNAVAILABLE); the beanstalk codec keeps
 * the reference's OUT_OF_MEMORY. */
static void test_put_while_log_unavailable(void **state)
{
    struct world *w = *state;
    w->engine.journal_broken = 1;
    struct bg_job *j = make_job(&w->engine, "x", 0, 0, 60, T0);
    assert_non_null(j);
    assert_int_equal(bg_put(&w->fc[0].client, w->fc[0].client.use, j, T0), BG_LOG_UNAVAILABLE);
    uint64_t id;
    assert_int_equal(bg_put_copy(&w->fc[0].client, "t", 0, 0, 60, "x", 1, T0, &id), BG_LOG_UNAVAILABLE);
    assert_int_equal(w->engine.job_count, 0);
    struct bg_session s;
    assert_int_equal(bg_session_init(&w->engine, &s, NULL, NULL), BG_OK);
    const char put[] = "put 0 0 60 1\r\nx\r\n";
    assert_int_equal(bg_session_feed(&s, put, sizeof put - 1, T0), sizeof put - 1);
    assert_int_equal(s.stream.out.len, strlen("OUT_OF_MEMORY\r\n"));
    assert_memory_equal(bg_buf_head(&s.stream.out), "OUT_OF_MEMORY\r\n", s.stream.out.len);
    bg_session_close(&s, T0);
    w->engine.journal_broken = 0;
    put_job(&w->fc[0], "y", 0, 0, 60, T0);
}

/* ---- the job-memory ceiling (--max-job-memory) --------------------------- */

/* A session's reply, as a string (the test's own copy), then cleared. */
static const char *session_reply(struct bg_session *s)
{
    static char text[256];
    size_t n = s->stream.out.len < sizeof text - 1 ? s->stream.out.len : sizeof text - 1;
    memcpy(text, bg_buf_head(&s->stream.out), n);
    text[n] = '\0';
    bg_buf_clear(&s->stream.out);
    return text;
}

/* Each job counts its 64-byte core record and its body (CRLF included); a put
 * that lands exactly on the ceiling is taken, one byte over is refused, for
 * bg_put_copy (HTTP, Gearman) and the beanstalk session alike; a delete
 * makes room again. */
static void test_job_memory_ceiling_exact(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct bg_client *c = &w->fc[0].client;
    assert_int_equal(BG_JOB_MEMORY(12), 76);
    e->max_job_memory = 3 * BG_JOB_MEMORY(12);
    uint64_t a, b, id;
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "0123456789", 10, T0, &a), BG_OK);
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "0123456789", 10, T0, &b), BG_OK);
    assert_int_equal(e->job_memory, 2 * BG_JOB_MEMORY(12));
    /* one byte over: refused, nothing taken, no id used up */
    uint64_t next_id = e->next_id;
    assert_int_equal(bg_engine_job_fits(e, 13), 0);
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "0123456789x", 11, T0, &id), BG_MEMORY_CEILING);
    assert_null(bg_job_new(e, 0, 0, 60, 13, T0));
    assert_int_equal(e->next_id, next_id);
    assert_int_equal(e->job_count, 2);
    assert_int_equal(bg_engine_memory_full(e), 0);
    /* exactly at the ceiling: taken; now not even an empty job fits */
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "0123456789", 10, T0, &id), BG_OK);
    assert_int_equal(e->job_memory, e->max_job_memory);
    assert_int_equal(bg_engine_memory_full(e), 1);
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "", 0, T0, &id), BG_MEMORY_CEILING);
    /* beanstalk: OUT_OF_MEMORY after the body, which is read and dropped */
    struct bg_session s;
    assert_int_equal(bg_session_init(e, &s, NULL, NULL), BG_OK);
    const char put[] = "put 0 0 60 1\r\nx\r\nlist-tube-used\r\n";
    assert_int_equal(bg_session_feed(&s, put, sizeof put - 1, T0), sizeof put - 1);
    assert_string_equal(session_reply(&s), "OUT_OF_MEMORY\r\nUSING default\r\n");
    /* a delete makes room again */
    assert_int_equal(bg_delete(c, a, T0), BG_OK);
    assert_int_equal(e->job_memory, 2 * BG_JOB_MEMORY(12));
    assert_int_equal(bg_engine_memory_full(e), 0);
    const char put10[] = "put 0 0 60 10\r\n0123456789\r\n";
    assert_int_equal(bg_session_feed(&s, put10, sizeof put10 - 1, T0), sizeof put10 - 1);
    assert_int_equal(strncmp(session_reply(&s), "INSERTED ", 9), 0);
    assert_int_equal(e->job_memory, e->max_job_memory);
    bg_session_close(&s, T0);
    check_world(w);
}

/* A put whose body is still arriving holds its job's memory already (a
 * slow client cannot get around the ceiling); closing gives it back. */
static void test_job_memory_counts_bodies_in_flight(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    e->max_job_memory = BG_JOB_MEMORY(102) + BG_JOB_MEMORY(2) - 1;
    struct bg_session s1, s2;
    assert_int_equal(bg_session_init(e, &s1, NULL, NULL), BG_OK);
    assert_int_equal(bg_session_init(e, &s2, NULL, NULL), BG_OK);
    const char head[] = "put 0 0 60 100\r\nabc";
    assert_int_equal(bg_session_feed(&s1, head, sizeof head - 1, T0), sizeof head - 1);
    assert_int_equal(s1.stream.phase, BG_PHASE_BODY);
    assert_int_equal(e->job_memory, BG_JOB_MEMORY(102));
    assert_int_equal(e->job_count, 0);
    /* the other connection's empty job would go one byte over */
    const char put0[] = "put 0 0 60 0\r\n\r\n";
    assert_int_equal(bg_session_feed(&s2, put0, sizeof put0 - 1, T0), sizeof put0 - 1);
    assert_string_equal(session_reply(&s2), "OUT_OF_MEMORY\r\n");
    assert_int_equal(s2.stream.phase, BG_PHASE_NONE);
    bg_session_close(&s1, T0);
    assert_int_equal(e->job_memory, 0);
    assert_int_equal(bg_session_feed(&s2, put0, sizeof put0 - 1, T0), sizeof put0 - 1);
    assert_int_equal(strncmp(session_reply(&s2), "INSERTED ", 9), 0);
    bg_session_close(&s2, T0);
    check_world(w);
}

/* Jobs restored from the log are all kept, even above the ceiling; puts
 * are refused until deletes bring the total below it. */
static void test_job_memory_restore_over_ceiling(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    e->max_job_memory = 2 * BG_JOB_MEMORY(8);
    for (uint64_t id = 1; id <= 4; id++) {
        struct bg_journal_job r = {.id = id, .tube = "t", .state = BG_JOB_READY, .ttr_s = 60,
                                   .body_len = 8, .body = "stored\r\n"};
        assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    }
    bg_engine_restore_finish(e);
    assert_int_equal(e->job_count, 4);
    assert_int_equal(e->job_memory, 4 * BG_JOB_MEMORY(8));
    assert_int_equal(bg_engine_memory_full(e), 1);
    uint64_t id;
    assert_int_equal(bg_put_copy(&w->fc[0].client, "t", 0, 0, 60, "x", 1, T0, &id), BG_MEMORY_CEILING);
    for (uint64_t k = 1; k <= 2; k++) assert_int_equal(bg_delete(&w->fc[0].client, k, T0), BG_OK);
    assert_int_equal(bg_engine_memory_full(e), 1); /* exactly at it: still no room */
    assert_int_equal(bg_delete(&w->fc[0].client, 3, T0), BG_OK);
    assert_int_equal(bg_engine_memory_full(e), 0);
    assert_int_equal(bg_put_copy(&w->fc[0].client, "t", 0, 0, 60, "stored", 6, T0, &id), BG_OK);
    assert_int_equal(id, 5);
    check_world(w);
}

/* ---- entry points for front-ends that keep state beside the queue ------- */

/* The log's view: the last update record of a job. */
static struct {
    int updates, deletes;
    uint64_t id, deleted_id;
    uint32_t ttr_s;
} logged;

static void log_saved(void *ctx, const struct bg_job *j, int with_body)
{
    (void)ctx;
    if (with_body) return;
    logged.updates++;
    logged.id = j->id;
    logged.ttr_s = j->ttr_s;
}
static void log_deleted(void *ctx, uint64_t id)
{
    (void)ctx;
    logged.deletes++;
    logged.deleted_id = id;
}
static void log_paused(void *ctx, const struct bg_tube *t) { (void)ctx, (void)t; }
static const struct bg_journal_ops test_log = {log_saved, log_deleted, log_paused, NULL};

/* bg_set_ttr: the new TTR runs from now and reaches the log (a Gearman
 * CAN_DO_TIMEOUT); only the reserver may set it. */
static void test_set_ttr_is_logged(void **state)
{
    struct world *w = *state;
    memset(&logged, 0, sizeof logged);
    w->engine.journal = &test_log;
    uint64_t id = put_job(&w->fc[0], "x", 0, 0, 60, T0);
    assert_int_equal(reserve_now(&w->fc[1], T0), id);
    assert_int_equal(bg_set_ttr(&w->fc[2].client, id, 5, T0), BG_NOT_FOUND);
    assert_int_equal(logged.updates, 0);
    assert_int_equal(bg_set_ttr(&w->fc[1].client, id, 5, T0 + SEC(1)), BG_OK);
    assert_int_equal(find(w, id)->ttr_s, 5);
    assert_int_equal(bg_job_deadline(find(w, id)), T0 + SEC(6));
    assert_int_equal(logged.updates, 1);
    assert_int_equal(logged.id, id);
    assert_int_equal(logged.ttr_s, 5);
    assert_int_equal(bg_set_ttr(&w->fc[1].client, id, 0, T0 + SEC(1)), BG_OK);
    assert_int_equal(find(w, id)->ttr_s, 1); /* 0 counts as 1, as for put */
    bg_engine_tick(&w->engine, T0 + SEC(2));
    assert_int_equal(state_of(w, id), BG_JOB_READY);
    w->engine.journal = NULL;
    check_engine(&w->engine, w->fc, WORLD_CLIENTS);
}

/* A sleeping client counts as waiting until it wakes or closes. */
static void test_sleeping_counts_as_waiting(void **state)
{
    struct world *w = *state;
    bg_client_set_sleeping(&w->fc[0].client, 1);
    bg_client_set_sleeping(&w->fc[0].client, 1); /* once */
    bg_client_set_sleeping(&w->fc[1].client, 1);
    assert_int_equal(w->engine.waiting, 2);
    bg_client_set_sleeping(&w->fc[0].client, 0);
    assert_int_equal(w->engine.waiting, 1);
    fake_close(&w->fc[1], T0);
    assert_int_equal(w->engine.waiting, 0);
    bg_engine_connection_opened(&w->engine);
    bg_engine_connection_opened(&w->engine);
    bg_engine_connection_closed(&w->engine);
    assert_int_equal(w->engine.connections, 1);
    assert_int_equal(w->engine.stat.total_connections, 2);
}

/* bg_peek shows what peek-ready, -delayed and -buried show; bg_engine_job_ids
 * lists every job once. */
static void test_peek_and_job_ids(void **state)
{
    struct world *w = *state;
    struct bg_tube *t = w->engine.default_tube;
    assert_null(bg_peek(t, BG_JOB_READY));
    uint64_t late = put_job(&w->fc[0], "late", 10, 0, 60, T0);
    uint64_t urgent = put_job(&w->fc[0], "urgent", 1, 0, 60, T0);
    uint64_t d20 = put_job(&w->fc[0], "d20", 0, 20, 60, T0);
    uint64_t d10 = put_job(&w->fc[0], "d10", 0, 10, 60, T0);
    assert_int_equal(bg_peek(t, BG_JOB_READY)->id, urgent);
    assert_int_equal(bg_peek(t, BG_JOB_DELAYED)->id, d10);
    assert_null(bg_peek(t, BG_JOB_BURIED));
    assert_int_equal(reserve_now(&w->fc[1], T0), urgent);
    assert_int_equal(bg_bury(&w->fc[1].client, urgent, 5, T0), BG_OK);
    assert_int_equal(reserve_now(&w->fc[1], T0), late);
    assert_int_equal(bg_bury(&w->fc[1].client, late, 5, T0), BG_OK);
    assert_int_equal(bg_peek(t, BG_JOB_BURIED)->id, urgent); /* the oldest buried */
    assert_null(bg_peek(t, BG_JOB_RESERVED));
    uint64_t ids[8] = {0};
    assert_int_equal(bg_engine_job_ids(&w->engine, ids), 4);
    uint64_t sum = 0;
    for (int i = 0; i < 4; i++) sum += ids[i];
    assert_int_equal(sum, late + urgent + d20 + d10);
}

/* The longest chain of e's tube-name table. */
static size_t longest_tube_chain(const struct bg_engine *e)
{
    size_t longest = 0;
    for (size_t b = 0; b <= e->tubes_mask; b++) {
        size_t n = 0;
        for (const struct bg_tube *t = e->tubes[b]; t; t = t->hash_next) n++;
        if (n > longest) longest = n;
    }
    return longest;
}

/* The tube-name table is keyed: names that all share a bucket under one
 * key (found by trying names, as an attacker who knew the key could) spread
 * out under another key. */
static void test_tube_table_is_keyed(void **state)
{
    (void)state;
    enum { NAMES = 12 };
    static const uint64_t key_a[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    static const uint64_t key_b[2] = {0x1111111111111111ull, 0x2222222222222222ull};
    char names[NAMES][16];
    int found = 0;
    for (unsigned i = 0; found < NAMES; i++) { /* the default table has 64 buckets */
        char name[16];
        snprintf(name, sizeof name, "t%u", i);
        if ((bg_siphash(key_a, name, strlen(name)) & 63) == 5) snprintf(names[found++], sizeof names[0], "%s", name);
    }
    const uint64_t *keys[2] = {key_a, key_b};
    size_t longest[2];
    for (int k = 0; k < 2; k++) {
        struct bg_engine e;
        struct bg_client c;
        assert_int_equal(bg_engine_init(&e, MAX_JOB_SIZE, keys[k]), BG_OK);
        assert_int_equal(bg_client_init(&e, &c, &bg_client_ops_never_wait, NULL), BG_OK);
        uint32_t count;
        for (int i = 0; i < NAMES; i++) assert_int_equal(bg_client_watch(&c, names[i], &count), BG_OK);
        assert_int_equal(e.tubes_mask, 63); /* 13 tubes: the table has not grown */
        longest[k] = longest_tube_chain(&e);
        for (int i = 0; i < NAMES; i++) assert_non_null(bg_tube_find(&e, names[i]));
        bg_client_close(&c, T0);
        bg_engine_destroy(&e);
    }
    assert_true(longest[0] >= NAMES); /* all in bucket 5 under key A */
    assert_true(longest[1] < 4);      /* under key B they spread */
}

/* The audit in core sees what it is meant to see. */
static void test_engine_audit_finds_breakage(void **state)
{
    struct world *w = *state;
    const char *broken;
    put_job(&w->fc[0], "a", 5, 0, 60, T0);
    put_job(&w->fc[0], "b", 5, 10, 60, T0);
    assert_int_equal(bg_engine_audit(&w->engine, &broken), BG_OK);
    w->engine.ready_count++;
    assert_int_equal(bg_engine_audit(&w->engine, &broken), BG_INTERNAL_ERROR);
    assert_string_equal(broken, "ready_count is off");
    w->engine.ready_count--;
    bg_time due = w->engine.due_at;
    w->engine.due_at = T0 + SEC(11);
    assert_int_equal(bg_engine_audit(&w->engine, &broken), BG_INTERNAL_ERROR);
    assert_string_equal(broken, "due_at is later than a deadline");
    w->engine.due_at = due;
    assert_int_equal(bg_engine_audit(&w->engine, &broken), BG_OK);
}

static void test_put_while_draining(void **state)
{
    struct world *w = *state;
    struct fake_client *producer = &w->fc[0], *waiter = &w->fc[1];
    assert_int_equal(reserve(waiter, -1, T0, NULL), BG_WOULD_BLOCK);
    w->engine.draining = 1;
    struct bg_job *j = make_job(&w->engine, "drained", 1, 0, 60, T0);
    assert_non_null(j);
    assert_int_equal(bg_put(&producer->client, producer->client.use, j, T0), BG_DRAINING);
    assert_int_equal(w->engine.job_count, 0);
    assert_int_equal(w->engine.stat.total_jobs, 0);
    assert_int_equal(tube_stats(w, "default", T0).total_jobs, 0);
    assert_int_equal(w->engine.ready_count, 0);
    assert_int_equal(waiter->delivered_count, 0);
    check_world(w);
}

/* bg_job_new returns NULL when an allocation fails and leaves the engine
 * as it was: no id consumed, no job counted. */
static void test_job_new_out_of_memory(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    for (uint64_t nth = 1; nth <= 2; nth++) {
        uint64_t next_id = e->next_id;
        size_t jobs = e->job_count;
        bg_alloc_fail_after(nth);
        struct bg_job *j = make_job(e, "oom", 1, 0, 60, T0);
        bg_alloc_fail_after(0);
        if (j) {
            /* the nth allocation was not needed (timer room already there) */
            assert_true(nth > 1);
            bg_job_discard(&w->engine, j);
            continue;
        }
        assert_int_equal(e->next_id, next_id);
        assert_int_equal(e->job_count, jobs);
        check_world(w);
    }
    uint64_t id = put_job(&w->fc[0], "fine", 1, 0, 60, T0);
    assert_int_equal(id, 1);
    check_world(w);
}

/* Several jobs can be created before any is put (each session reads its
 * own body). A reservation the engine reports as made must still be on the
 * TTR timer when growing the timer heap fails. */
static void test_reserve_oom_keeps_ttr_timer(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0], *a = &w->fc[1], *b = &w->fc[2];
    enum { N = 9 }; /* one more than the timer heap's first capacity */
    struct bg_job *pending[N];
    for (int i = 0; i < N; i++) pending[i] = make_job(e, "p", 1, 0, 5, T0);
    for (int i = 0; i < N; i++) {
        assert_non_null(pending[i]);
        assert_int_equal(bg_put(&producer->client, producer->client.use, pending[i], T0), BG_OK);
    }
    for (int i = 0; i < N - 1; i++) reserve_now(a, T0);
    struct bg_job *j = NULL;
    /* allocation 1 grows b's own reserved heap; 2 would grow the timers */
    bg_alloc_fail_after(2);
    int r = reserve(b, 0, T0, &j);
    bg_alloc_fail_after(0);
    if (r == BG_OK) {
        assert_non_null(j);
        assert_int_equal(j->state, BG_JOB_RESERVED);
        assert_non_null(j->more);
        assert_true(j->more->timer_slot < e->job_timers.len);
        assert_ptr_equal(e->job_timers.items[j->more->timer_slot], j->more);
    } else {
        assert_int_equal(r, BG_OUT_OF_MEMORY);
    }
    check_world(w);
    /* every reservation times out at its TTR */
    bg_engine_tick(e, T0 + SEC(5));
    assert_int_equal(e->reserved_count, 0);
    assert_int_equal(e->ready_count, N);
    assert_int_equal(e->stat.job_timeouts, r == BG_OK ? N : N - 1);
    check_world(w);
}

/* A side record counts against the job-memory ceiling from when it is
 * made (the first reserve here), but a reserve is never refused for the
 * ceiling; the record stays with the job through a release and goes with
 * it on delete. */
static void test_job_memory_counts_side_records(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    assert_int_equal(BG_JOB_MORE_MEMORY, 80);
    e->max_job_memory = BG_JOB_MEMORY(3); /* one ready job of 1 byte */
    uint64_t id = put_job(producer, "a", 0, 0, 60, T0);
    assert_null(bg_job_find(e, id)->more); /* ready: the core record only */
    assert_int_equal(e->job_memory, BG_JOB_MEMORY(3));
    assert_int_equal(bg_engine_memory_full(e), 1);
    assert_int_equal(reserve_now(worker, T0), id); /* over the ceiling: counted, not refused */
    assert_int_equal(e->job_memory, BG_JOB_MEMORY(3) + BG_JOB_MORE_MEMORY);
    check_world(w);
    assert_int_equal(bg_release(&worker->client, id, 0, 0, T0), BG_OK);
    struct bg_job *j = bg_job_find(e, id);
    assert_non_null(j->more);
    assert_int_equal(bg_job_reserves(j), 1);
    assert_int_equal(bg_job_releases(j), 1);
    assert_int_equal(e->job_memory, BG_JOB_MEMORY(3) + BG_JOB_MORE_MEMORY);
    assert_int_equal(bg_delete(&producer->client, id, T0), BG_OK);
    assert_int_equal(e->job_memory, 0);
    check_world(w);
}

/* A put with a delay needs its job's side record before it is answered:
 * when that allocation fails the put is refused (OUT_OF_MEMORY) and nothing
 * is taken, no id used up. */
static void test_delayed_put_side_record_oom(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct bg_client *c = &w->fc[0].client;
    uint64_t id;
    assert_int_equal(bg_put_copy(c, "t", 0, 0, 60, "ready", 5, T0, &id), BG_OK);
    assert_null(e->free_more);
    uint64_t next_id = e->next_id, memory = e->job_memory;
    /* allocation 1 is the job, 2 its side record; 3 would be none */
    for (uint64_t nth = 1; nth <= 2; nth++) {
        bg_alloc_fail_after(nth);
        assert_int_equal(bg_put_copy(c, "t", 0, 10, 60, "later", 5, T0, &id), BG_OUT_OF_MEMORY);
        bg_alloc_fail_after(0);
        assert_int_equal(e->next_id, next_id);
        assert_int_equal(e->job_count, 1);
        assert_int_equal(e->job_memory, memory);
        check_world(w);
    }
    bg_alloc_fail_after(3);
    assert_int_equal(bg_put_copy(c, "t", 0, 10, 60, "later", 5, T0, &id), BG_OK);
    bg_alloc_fail_after(0);
    struct bg_job *j = bg_job_find(e, id);
    assert_int_equal(j->state, BG_JOB_DELAYED);
    assert_non_null(j->more);
    assert_int_equal(bg_job_delay(j), 10);
    assert_int_equal(e->job_memory, memory + BG_JOB_MEMORY(7) + BG_JOB_MORE_MEMORY);
    check_world(w);
}

/* Reserving a job without a side record takes the spare made beforehand:
 * the reserve allocates nothing at the moment it takes the job. When the
 * spare cannot be made, the reserve fails before it takes anything. */
static void test_reserve_uses_spare(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0], *worker = &w->fc[1];
    uint64_t a = put_job(producer, "a", 1, 0, 60, T0);
    uint64_t b = put_job(producer, "b", 1, 0, 60, T0);
    assert_null(e->free_more);
    /* allocation 1 grows the worker's reserved heap, 2 is the spare */
    struct bg_job *j = NULL;
    bg_alloc_fail_after(2);
    assert_int_equal(reserve(worker, 0, T0, &j), BG_OUT_OF_MEMORY);
    bg_alloc_fail_after(0);
    assert_int_equal(bg_job_find(e, a)->state, BG_JOB_READY);
    assert_null(bg_job_find(e, a)->more);
    assert_int_equal(e->reserved_count, 0);
    check_world(w);
    assert_int_equal(reserve_now(worker, T0), a);
    assert_non_null(bg_job_find(e, a)->more);
    assert_int_equal(e->free_more_count, 0);
    /* a's side record is the spare once a is deleted */
    assert_int_equal(bg_delete(&worker->client, a, T0), BG_OK);
    assert_int_equal(e->free_more_count, 1);
    bg_alloc_fail_after(1); /* any allocation now fails */
    assert_int_equal(reserve(worker, 0, T0, &j), BG_OK);
    bg_alloc_fail_after(0);
    assert_int_equal(j->id, b);
    assert_non_null(j->more);
    assert_ptr_equal(j->more->job, j);
    assert_int_equal(bg_job_reserves(j), 1);
    assert_int_equal(e->free_more_count, 0);
    check_world(w);
    /* the TTR still ends the reservation */
    bg_engine_tick(e, T0 + SEC(60));
    assert_int_equal(bg_job_timeouts(j), 1);
    assert_int_equal(j->state, BG_JOB_READY);
    check_world(w);
}

/* Restoring a job that needs a side record (buried, delayed, or with a
 * counter) fails cleanly when that allocation fails, and so does an update
 * that buries a restored ready job without one: the job stays as it was. */
static void test_restore_side_record_oom(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct bg_journal_job ready = {.id = 1, .tube = "t", .state = BG_JOB_READY, .ttr_s = 60,
                                   .body_len = 3, .body = "x\r\n"};
    assert_int_equal(bg_engine_restore_job(e, &ready, T0, T0, T0), BG_OK);
    assert_null(bg_job_find(e, 1)->more); /* ready, no counter: none */
    struct bg_journal_job buried = ready;
    buried.id = 7;
    buried.state = BG_JOB_BURIED;
    buried.buries = 1;
    uint64_t memory = e->job_memory;
    bg_alloc_fail_after(2); /* 1: the job, 2: its side record */
    assert_int_equal(bg_engine_restore_job(e, &buried, T0, T0, T0), BG_OUT_OF_MEMORY);
    bg_alloc_fail_after(0);
    assert_null(bg_job_find(e, 7));
    assert_int_equal(e->job_count, 1);
    assert_int_equal(e->job_memory, memory);
    check_world(w);
    struct bg_journal_job update = ready;
    update.state = BG_JOB_BURIED;
    update.buries = 1;
    bg_alloc_fail_after(1); /* its side record */
    assert_int_equal(bg_engine_restore_update(e, &update, T0, T0), BG_OUT_OF_MEMORY);
    bg_alloc_fail_after(0);
    assert_int_equal(bg_job_find(e, 1)->state, BG_JOB_READY);
    assert_int_equal(e->ready_count, 1);
    check_world(w);
    /* with memory: both restored; a ready job with a counter has one too */
    assert_int_equal(bg_engine_restore_job(e, &buried, T0, T0, T0), BG_OK);
    assert_int_equal(bg_engine_restore_update(e, &update, T0, T0), BG_OK);
    struct bg_journal_job counted = ready;
    counted.id = 9;
    counted.reserves = 3;
    assert_int_equal(bg_engine_restore_job(e, &counted, T0, T0, T0), BG_OK);
    assert_int_equal(bg_job_reserves(bg_job_find(e, 9)), 3);
    assert_int_equal(bg_job_buries(bg_job_find(e, 7)), 1);
    assert_int_equal(bg_job_find(e, 1)->state, BG_JOB_BURIED);
    assert_int_equal(e->job_memory, 3 * (BG_JOB_MEMORY(3) + BG_JOB_MORE_MEMORY));
    check_world(w);
}

/* The job allocator: every size class up to BG_SLAB_MAX and beyond, several
 * arenas per class, slots reused after a free, no slot handed out twice,
 * and a counted (injectable) failure per job allocation. */
static void test_job_allocator(void **state)
{
    (void)state;
    enum { N = 30000 }; /* 216-byte slots: more than three 2 MiB arenas */
    static unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = bg_job_alloc(216);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % 8, 0);
        memset(p[i], i & 0xff, 216);
    }
    for (int i = 0; i < N; i += 2) bg_job_free_sized(p[i], 216);
    for (int i = 0; i < N; i += 2) {
        p[i] = bg_job_alloc(210); /* same class */
        assert_non_null(p[i]);
        memset(p[i], i & 0xff, 210);
    }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 210; k++) assert_int_equal(p[i][k], i & 0xff);
    for (int i = 0; i < N; i++) bg_job_free_sized(p[i], (i % 2) ? 216 : 210);

    /* one of every size, 1 to BG_SLAB_MAX + 100, all alive at once */
    enum { M = BG_SLAB_MAX + 100 };
    static unsigned char *q[M + 1];
    for (int n = 1; n <= M; n++) {
        q[n] = bg_job_alloc((size_t)n);
        assert_non_null(q[n]);
        memset(q[n], n & 0xff, (size_t)n);
    }
    for (int n = 1; n <= M; n++)
        for (int k = 0; k < n; k += 7) assert_int_equal(q[n][k], n & 0xff);
    for (int n = 1; n <= M; n++) bg_job_free_sized(q[n], (size_t)n);

    bg_alloc_fail_after(1);
    assert_null(bg_job_alloc(216));
    void *ok = bg_job_alloc(216);
    assert_non_null(ok);
    bg_job_free_sized(ok, 216);
    bg_alloc_fail_after(0);
}

/* When the id table cannot grow, the job is still stored and findable. */
static void test_job_table_grow_failure(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0];
    size_t slots = e->jobs_mask + 1;
    /* fill to the growth threshold (7/8): the next job asks to grow */
    while (e->job_count < slots / 8 * 7) put_job(producer, "fill", 1, 0, 60, T0);
    assert_int_equal(e->jobs_mask + 1, slots);
    struct bg_job *j = make_job(e, "overflow", 1, 0, 60, T0);
    assert_non_null(j);
    uint64_t id = j->id;
    bg_alloc_fail_after(1);
    int r = bg_put(&producer->client, producer->client.use, j, T0);
    bg_alloc_fail_after(0);
    assert_int_equal(r, BG_OK);
    assert_int_equal(e->jobs_mask + 1, slots); /* did not grow */
    assert_non_null(bg_job_find(e, id));
    check_world(w);
    put_job(producer, "grows now", 1, 0, 60, T0);
    assert_int_equal(e->jobs_mask + 1, 2 * slots);
    for (uint64_t k = 1; k <= id + 1; k++) assert_non_null(bg_job_find(e, k));
    check_world(w);
}

/* The id table keeps an empty slot: while it cannot grow it takes jobs up
 * to one slot short of full, then a put gets BG_OUT_OF_MEMORY and stores
 * nothing; once memory is back the table grows and the put is taken. */
static void test_job_table_full_refuses(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0];
    size_t slots = e->jobs_mask + 1;
    while (e->job_count < slots / 8 * 7) put_job(producer, "fill", 1, 0, 60, T0);
    while (e->job_count < slots - 1) { /* every growth fails */
        struct bg_job *j = make_job(e, "no growth", 1, 0, 60, T0);
        assert_non_null(j);
        bg_alloc_fail_after(1);
        assert_int_equal(bg_put(&producer->client, producer->client.use, j, T0), BG_OK);
        bg_alloc_fail_after(0);
    }
    assert_int_equal(e->jobs_mask + 1, slots);
    check_world(w);
    struct bg_job *j = make_job(e, "refused", 1, 0, 60, T0);
    assert_non_null(j);
    uint64_t id = j->id;
    bg_alloc_fail_after(1);
    assert_int_equal(bg_put(&producer->client, producer->client.use, j, T0), BG_OUT_OF_MEMORY);
    bg_alloc_fail_after(0);
    assert_null(bg_job_find(e, id));
    assert_int_equal(e->job_count, slots - 1);
    check_world(w);
    put_job(producer, "taken", 1, 0, 60, T0);
    assert_int_equal(e->jobs_mask + 1, 2 * slots);
    assert_int_equal(e->job_count, slots);
    check_world(w);
}

/* A scripted session of every kind of call, tolerant of any call failing
 * for lack of memory. Audits the engine after every step. */
static void oom_script(void)
{
    struct bg_engine e;
    enum { NFC = 3 };
    struct fake_client fc[NFC];
    memset(fc, 0, sizeof fc);
    bg_time now = T0;
    if (bg_engine_init(&e, MAX_JOB_SIZE, NULL) != 0) return;
#define STEP() check_engine_ex(&e, fc, NFC, 0)
    for (int i = 0; i < NFC; i++) fake_open(&e, &fc[i]);
    STEP();
    uint32_t count;
    if (fc[0].open) bg_client_use(&fc[0].client, "oom-a");
    if (fc[1].open) {
        bg_client_watch(&fc[1].client, "oom-a", &count);
        bg_client_watch(&fc[1].client, "oom-b", &count);
    }
    if (fc[2].open) bg_client_watch(&fc[2].client, "oom-b", &count);
    STEP();
    for (int k = 0; k < 12 && fc[0].open; k++) {
        struct bg_job *j = make_job(&e, "job", (uint32_t)k * 300, k % 3 == 0 ? 1 : 0, 2, now);
        if (!j) continue;
        int r = bg_put(&fc[0].client, fc[0].client.use, j, now);
        assert_true(r == BG_OK || r == BG_OUT_OF_MEMORY);
        STEP();
    }
    if (fc[1].open) {
        for (int k = 0; k < 9; k++) {
            int r = reserve(&fc[1], 0, now, NULL);
            assert_true(r == BG_OK || r == BG_OUT_OF_MEMORY || r == BG_TIMED_OUT);
        }
    }
    STEP();
    if (fc[2].open) reserve(&fc[2], 5, now, NULL);
    STEP();
    if (fc[0].open && bg_client_use(&fc[0].client, "oom-b") == 0) {
        struct bg_job *j = make_job(&e, "to b", 1, 0, 2, now);
        if (j) bg_put(&fc[0].client, fc[0].client.use, j, now);
    }
    STEP();
    for (int k = 0; k < 10; k++) {
        char name[16];
        snprintf(name, sizeof name, "oom-p%d", k);
        if (fc[2].open && !fc[2].waiting) bg_client_watch(&fc[2].client, name, &count);
        bg_pause_tube(&e, name, 1, now);
        STEP();
    }
    bg_pause_tube(&e, "oom-a", 2, now);
    if (fc[1].open) reserve(&fc[1], -1, now, NULL);
    if (fc[2].open && !fc[2].waiting) reserve(&fc[2], 3, now, NULL);
    STEP();
    now += SEC(1);
    bg_engine_tick(&e, now);
    STEP();
    for (int i = 0; i < NFC; i++) {
        if (!fc[i].open || fc[i].waiting) continue;
        struct bg_client *c = &fc[i].client;
        int n = 0;
        while (c->reserved_head && n < 4) {
            uint64_t id = c->reserved_head->id;
            switch (n++ % 4) {
            case 0: bg_release(c, id, 10, 1, now); break;
            case 1: bg_bury(c, id, 3, now); break;
            case 2: bg_touch(c, id, now); bg_release(c, id, 5, 0, now); break;
            case 3: bg_delete(c, id, now); break;
            }
            STEP();
        }
    }
    struct bg_tube *a = bg_tube_find(&e, "oom-a");
    if (a) bg_kick(&e, a, 10, now);
    STEP();
    now += SEC(3);
    bg_engine_tick(&e, now);
    STEP();
    for (int i = 0; i < NFC; i++) {
        if (fc[i].open && !fc[i].waiting) {
            struct bg_job *j = NULL;
            reserve(&fc[i], 0, now, &j);
            if (j) bg_reserve_job(&fc[i].client, j->id, now, &j);
        }
        STEP();
    }
    for (int i = 0; i < NFC; i++) {
        fake_close(&fc[i], now);
        STEP();
    }
    now += SEC(10);
    bg_engine_tick(&e, now);
    STEP();
#undef STEP
    bg_engine_destroy(&e);
}

/* Nonzero if an injected failure is still pending (was not reached). */
static int fault_still_pending(uint64_t nth)
{
    for (uint64_t i = 0; i < nth; i++) {
        void *p = bg_malloc(1);
        if (!p) return 1;
        bg_free(p);
    }
    return 0;
}

/* Failing each allocation of a full scripted session in turn never
 * crashes, leaks (ASan) or breaks the engine's bookkeeping. */
static void test_oom_every_allocation(void **state)
{
    (void)state;
    uint64_t nth;
    for (nth = 1; nth < 100000; nth++) {
        bg_alloc_fail_after(nth);
        oom_script();
        if (fault_still_pending(nth)) break; /* the script needed < nth allocations */
    }
    bg_alloc_fail_after(0);
    assert_true(nth > 50); /* the script really did allocate; the sweep ran */
    print_message("    oom sweep: failed each of %llu allocations in turn\n",
                  (unsigned long long)(nth - 1));
}

/* ======================================================================= */
/* randomized stress with a full audit after every step                    */
/* ======================================================================= */

static uint64_t prng_state;

static uint64_t prng(void) /* xorshift64* */
{
    prng_state ^= prng_state >> 12;
    prng_state ^= prng_state << 25;
    prng_state ^= prng_state >> 27;
    return prng_state * 0x2545F4914F6CDD1Dull;
}

static uint64_t pick(uint64_t n) { return prng() % n; }

enum stress_op {
    OP_PUT, OP_RESERVE, OP_RESERVE_JOB, OP_DELETE, OP_RELEASE, OP_BURY, OP_TOUCH,
    OP_KICK, OP_KICK_JOB, OP_PAUSE, OP_USE, OP_WATCH, OP_IGNORE, OP_TICK, OP_RECONNECT,
    OP_ADVANCE, OP_COUNT
};
static const unsigned stress_weight[OP_COUNT] = {
    [OP_PUT] = 22, [OP_RESERVE] = 16, [OP_RESERVE_JOB] = 3, [OP_DELETE] = 8,
    [OP_RELEASE] = 6, [OP_BURY] = 4, [OP_TOUCH] = 3, [OP_KICK] = 3, [OP_KICK_JOB] = 2,
    [OP_PAUSE] = 1, [OP_USE] = 4, [OP_WATCH] = 4, [OP_IGNORE] = 3, [OP_TICK] = 14,
    [OP_RECONNECT] = 1, [OP_ADVANCE] = 6,
};
static const char *const stress_tubes[] = {"default", "s1", "s2", "s3", "s4"};
static const uint32_t stress_pris[] = {0, 1, 1023, 1024, 5000, UINT32_MAX};

struct stress {
    struct bg_engine engine;
    enum { SC = 6 } n;
    struct fake_client fc[6];
    uint64_t ids[1024];
    size_t nids;
    bg_time now;
    uint64_t delivered, ended; /* callbacks seen by clients since closed */
    uint64_t late_calls;       /* calls made with deadlines passed, no tick run */
};

/* Live-job cap, alternating every 500 steps between a sparse phase (clients
 * run dry and wait, so deliveries and wait endings happen) and a busy one
 * (deep heaps, many buried/delayed jobs). */
static size_t stress_max_jobs(long step) { return (step / 500) % 2 ? 60 : 3; }

static void untrack(struct stress *s, uint64_t id)
{
    for (size_t i = 0; i < s->nids; i++) {
        if (s->ids[i] == id) {
            s->ids[i] = s->ids[--s->nids];
            return;
        }
    }
    fail_msg("step %ld: deleted id %llu was not tracked", audit_step, (unsigned long long)id);
}

static uint64_t random_id(struct stress *s)
{
    if (s->nids == 0 || pick(10) == 0) return s->engine.next_id + pick(3); /* unknown */
    return s->ids[pick(s->nids)];
}

/* A random client able to issue a command (open and not blocked). */
static struct fake_client *random_idle_client(struct stress *s)
{
    size_t start = pick(SC);
    for (size_t k = 0; k < SC; k++) {
        struct fake_client *fc = &s->fc[(start + k) % SC];
        if (fc->open && !fc->waiting) return fc;
    }
    return NULL;
}

/* The job a reserve by c must return now: min (pri, id) over the ready jobs
 * of its watched, unpaused tubes; computed without the engine's helpers. */
static struct bg_job *model_best_ready(struct bg_client *c)
{
    struct bg_job *best = NULL;
    for (uint32_t i = 0; i < c->watch_len; i++) {
        struct bg_tube *t = c->watch[i]->tube;
        if (t->pause_ns) continue;
        const struct bg_engine *e = c->engine;
        for (size_t b = 0; b <= e->jobs_mask; b++) {
            struct bg_job *j = e->jobs[b];
            if (j && j->tube == t && j->state == BG_JOB_READY && (!best || ready_before(j, best))) best = j;
        }
    }
    return best;
}

/* Nonzero if a reservation of c ends within the margin. */
static int model_deadline_soon(struct bg_client *c, bg_time now)
{
    for (const struct bg_job *j = c->reserved_head; j; j = j->next)
        if (now + BG_DEADLINE_MARGIN >= bg_job_deadline(j)) return 1;
    return 0;
}

static void stress_step(struct stress *s)
{
    struct bg_engine *e = &s->engine;
    unsigned total = 0, roll;
    for (int i = 0; i < OP_COUNT; i++) total += stress_weight[i];
    roll = (unsigned)pick(total);
    int op = 0;
    while (roll >= stress_weight[op]) roll -= stress_weight[op++];

    struct fake_client *fc = random_idle_client(s);
    if (!fc && op != OP_RECONNECT) op = OP_TICK; /* everyone blocks: let time pass */
    if (op == OP_PUT && s->nids >= stress_max_jobs(audit_step)) op = OP_DELETE;
    /* After OP_ADVANCE, deadlines may have passed with no tick: the next
     * call must catch up before it acts, so the model (which reads the
     * state before the call) only predicts outcomes while nothing is due;
     * otherwise only the audit and "nothing due is left" are checked. */
    int settled = bg_engine_next_deadline(e) > s->now;
    int caught_up = 1; /* the op called an entry point that catches up */
#define EXPECT(got, want)                                  \
    do {                                                   \
        uint64_t got_ = (uint64_t)(got); /* always run */  \
        if (settled) assert_int_equal(got_, (want));       \
    } while (0)

    switch (op) {
    case OP_PUT: {
        static const uint32_t delays[] = {0, 0, 0, 1, 2};
        static const uint32_t ttrs[] = {0, 1, 2, 5};
        struct bg_job *j = make_job(e, "stress", stress_pris[pick(6)], delays[pick(5)], ttrs[pick(4)], s->now);
        assert_non_null(j);
        uint64_t id = j->id;
        assert_int_equal(bg_put(&fc->client, fc->client.use, j, s->now), BG_OK);
        s->ids[s->nids++] = id;
        break;
    }
    case OP_RESERVE: {
        static const int64_t timeouts[] = {-1, 0, 0, 1, 3};
        int64_t timeout = timeouts[pick(5)];
        int soon = model_deadline_soon(&fc->client, s->now);
        struct bg_job *expected = model_best_ready(&fc->client);
        struct bg_job *j = NULL;
        int r = reserve(fc, timeout, s->now, &j);
        int want = expected ? BG_OK : soon ? BG_DEADLINE_SOON : timeout == 0 ? BG_TIMED_OUT : BG_WOULD_BLOCK;
        EXPECT(r, want);
        if (settled && r == BG_OK) assert_ptr_equal(j, expected);
        break;
    }
    case OP_RESERVE_JOB: {
        uint64_t id = random_id(s);
        struct bg_job *j = bg_job_find(e, id), *out = NULL;
        int want = j && j->state != BG_JOB_RESERVED ? BG_OK : BG_NOT_FOUND;
        int r = bg_reserve_job(&fc->client, id, s->now, &out);
        EXPECT(r, want);
        if (r == BG_OK) assert_ptr_equal(bg_job_reserver(out), &fc->client);
        break;
    }
    case OP_DELETE: {
        uint64_t id = fc->client.reserved_head && pick(2) ? fc->client.reserved_head->id : random_id(s);
        struct bg_job *j = bg_job_find(e, id);
        int want = j && !(j->state == BG_JOB_RESERVED && bg_job_reserver(j) != &fc->client) ? BG_OK : BG_NOT_FOUND;
        int r = bg_delete(&fc->client, id, s->now);
        EXPECT(r, want);
        if (r == BG_OK) untrack(s, id);
        break;
    }
    case OP_RELEASE: case OP_BURY: case OP_TOUCH: {
        uint64_t id = fc->client.reserved_head && pick(4) ? fc->client.reserved_head->id : random_id(s);
        struct bg_job *j = bg_job_find(e, id);
        int mine = j && j->state == BG_JOB_RESERVED && bg_job_reserver(j) == &fc->client;
        uint32_t pri = stress_pris[pick(6)], delay = (uint32_t)pick(3);
        int r = op == OP_RELEASE ? bg_release(&fc->client, id, pri, delay, s->now)
              : op == OP_BURY ? bg_bury(&fc->client, id, pri, s->now)
              : bg_touch(&fc->client, id, s->now);
        EXPECT(r, mine ? BG_OK : BG_NOT_FOUND);
        if (r != BG_OK) break;
        if (op == OP_RELEASE && delay) assert_int_equal(j->state, BG_JOB_DELAYED);
        if (op == OP_RELEASE && !delay) assert_true(j->state == BG_JOB_READY || bg_job_reserver(j) != &fc->client);
        if (op == OP_BURY) assert_int_equal(j->state, BG_JOB_BURIED);
        if (op == OP_TOUCH) assert_int_equal(bg_job_deadline(j), s->now + SEC(j->ttr_s));
        if (op != OP_TOUCH) assert_int_equal(j->pri, pri);
        break;
    }
    case OP_KICK: {
        struct bg_tube *t = bg_tube_find(e, stress_tubes[pick(5)]);
        if (!t) {
            caught_up = 0;
            break;
        }
        uint64_t n = pick(4);
        uint64_t buried = t->buried.len, delayed = t->delayed.len;
        uint64_t want = buried ? (n < buried ? n : buried) : (n < delayed ? n : delayed);
        EXPECT(bg_kick(e, t, n, s->now), want);
        break;
    }
    case OP_KICK_JOB: {
        uint64_t id = random_id(s);
        struct bg_job *j = bg_job_find(e, id);
        int want = j && (j->state == BG_JOB_BURIED || j->state == BG_JOB_DELAYED) ? BG_OK : BG_NOT_FOUND;
        EXPECT(bg_kick_job(e, id, s->now), want);
        break;
    }
    case OP_PAUSE: {
        const char *name = pick(6) ? stress_tubes[pick(5)] : "s-missing";
        int want = bg_tube_find(e, name) ? BG_OK : BG_NOT_FOUND;
        assert_int_equal(bg_pause_tube(e, name, (uint32_t)pick(4), s->now), want);
        break;
    }
    case OP_USE:
        caught_up = 0;
        assert_int_equal(bg_client_use(&fc->client, stress_tubes[pick(5)]), BG_OK);
        assert_int_equal(fc->client.use->using_count >= 1, 1);
        break;
    case OP_WATCH: {
        caught_up = 0;
        uint32_t count;
        assert_int_equal(bg_client_watch(&fc->client, stress_tubes[pick(5)], &count), BG_OK);
        assert_int_equal(count, fc->client.watch_len);
        break;
    }
    case OP_IGNORE: {
        caught_up = 0;
        const char *name = stress_tubes[pick(5)];
        int watching = 0;
        for (uint32_t i = 0; i < fc->client.watch_len; i++)
            watching |= strcmp(fc->client.watch[i]->tube->name, name) == 0;
        uint32_t before = fc->client.watch_len, count = 0;
        int want = watching && before == 1 ? BG_NOT_IGNORED : BG_OK;
        assert_int_equal(bg_client_ignore(&fc->client, name, &count), want);
        if (want == BG_OK) assert_int_equal(count, before - (uint32_t)watching);
        break;
    }
    case OP_TICK: {
        s->now += MSEC(pick(2500));
        bg_time next = bg_engine_tick(e, s->now);
        assert_int_equal(next, bg_engine_next_deadline(e));
        assert_true(next > s->now); /* nothing due is left behind */
        break;
    }
    case OP_RECONNECT: {
        struct fake_client *victim = &s->fc[pick(SC)];
        s->delivered += victim->delivered_count;
        s->ended += victim->ended_count;
        caught_up = victim->open;
        fake_close(victim, s->now);
        assert_int_equal(fake_open(e, victim), BG_OK);
        break;
    }
    case OP_ADVANCE: /* time passes, but the loop's timer has not run yet */
        caught_up = 0;
        s->now += MSEC(pick(2500));
        break;
    }
#undef EXPECT
    /* whatever the op was, it left nothing due at `now` behind it */
    if (caught_up) assert_true(bg_engine_next_deadline(e) > s->now);
    if (caught_up && !settled) s->late_calls++;
}

/* Thousands of random calls over several clients and tubes, with a seeded
 * PRNG; after each one the engine passes the full audit (counts equal sums
 * over tubes, every job where its state says, no unpaused tube with both
 * ready jobs and waiters) and each outcome matches a simple model. */
static void test_stress_random_operations(void **state)
{
    (void)state;
    static const uint64_t seeds[] = {0x5EED, 0xBEA57A1C, 42};
    for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
        struct stress *s = calloc(1, sizeof *s);
        assert_non_null(s);
        prng_state = seeds[si];
        s->now = T0;
        assert_int_equal(bg_engine_init(&s->engine, MAX_JOB_SIZE, NULL), BG_OK);
        /* the last seed runs as instance 2 of 5: the audit after each step
         * checks that every id is of that class */
        if (si == 2) assert_int_equal(bg_engine_set_shard(&s->engine, 2, 5), BG_OK);
        for (int i = 0; i < SC; i++) assert_int_equal(fake_open(&s->engine, &s->fc[i]), BG_OK);
        for (audit_step = 0; audit_step < 10000; audit_step++) {
            stress_step(s);
            check_engine(&s->engine, s->fc, SC);
            for (size_t i = 0; i < s->nids; i++) assert_non_null(bg_job_find(&s->engine, s->ids[i]));
            assert_int_equal(s->engine.job_count, s->nids);
        }
        uint64_t delivered = s->delivered, ended = s->ended;
        for (int i = 0; i < SC; i++) {
            delivered += s->fc[i].delivered_count;
            ended += s->fc[i].ended_count;
        }
        print_message("    seed %#llx: %llu deliveries, %llu wait endings, %llu timeouts, %zu jobs left, "
                      "%llu calls caught up\n",
                      (unsigned long long)seeds[si], (unsigned long long)delivered,
                      (unsigned long long)ended, (unsigned long long)s->engine.stat.job_timeouts, s->nids,
                      (unsigned long long)s->late_calls);
        /* the run exercised asynchronous deliveries and wait endings */
        assert_true(delivered > 100);
        assert_true(ended > 50);
        assert_true(s->engine.stat.job_timeouts > 0);
        assert_true(s->late_calls > 100); /* calls did meet passed deadlines */
        audit_step = -1;
        for (int i = 0; i < SC; i++) fake_close(&s->fc[i], s->now);
        check_engine(&s->engine, s->fc, SC);
        bg_engine_destroy(&s->engine);
        free(s);
    }
}

/* ======================================================================= */
/* shards: instance K of N owns the ids that are K modulo N                 */
/* ======================================================================= */

/* Instance K of N gives out K, K+N, K+2N, ... (N, 2N, ... for K = 0: id 0
 * never exists), through puts, a delayed job coming due and a job taken
 * back from a closed client; 0 of 1 is beanstalkd's 1, 2, 3. */
static void test_shard_ids_are_of_the_class(void **state)
{
    (void)state;
    static const uint32_t shards[][2] = {{0, 1}, {0, 3}, {1, 3}, {2, 3}, {4, 7}, {1023, 1024}};
    for (size_t s = 0; s < sizeof shards / sizeof shards[0]; s++) {
        uint32_t k = shards[s][0], n = shards[s][1];
        struct bg_engine e;
        struct fake_client fc[2];
        assert_int_equal(bg_engine_init(&e, MAX_JOB_SIZE, NULL), BG_OK);
        assert_int_equal(bg_engine_set_shard(&e, k, n), BG_OK);
        assert_int_equal(bg_engine_last_id(&e), 0); /* none given out yet */
        assert_int_equal(fake_open(&e, &fc[0]), BG_OK);
        assert_int_equal(fake_open(&e, &fc[1]), BG_OK);
        uint64_t want = k ? k : n, ids[6];
        ids[0] = put_job(&fc[0], "a", 5, 0, 60, T0);
        ids[1] = put_job(&fc[0], "b", 5, 2, 60, T0);        /* delayed 2 s */
        assert_int_equal(reserve_now(&fc[1], T0), ids[0]);
        fake_close(&fc[1], T0 + SEC(1));                    /* a is ready again */
        bg_engine_tick(&e, T0 + SEC(2));                    /* b is due */
        for (int i = 2; i < 6; i++) ids[i] = put_job(&fc[0], "c", 5, 0, 60, T0 + SEC(3));
        for (int i = 0; i < 6; i++) {
            assert_int_equal(ids[i], want + (uint64_t)i * n);
            assert_int_equal(bg_shard_of_id(ids[i], n), k);
            assert_true(ids[i] > 0);
        }
        assert_int_equal(bg_engine_last_id(&e), ids[5]);
        assert_int_equal(e.ready_count, 6);
        uint64_t first;
        assert_int_equal(bg_engine_foreign_jobs(&e, &first), 0);
        assert_int_equal(first, 0);
        check_engine(&e, fc, 1);
        fake_close(&fc[0], T0 + SEC(3));
        bg_engine_destroy(&e);
    }
}

/* The setting is checked: N from 1 to BG_SHARD_COUNT_MAX, K below N; a
 * refused one changes nothing. */
static void test_shard_setting_checked(void **state)
{
    struct world *w = *state;
    static const uint32_t bad[][2] = {{0, 0}, {3, 3}, {4, 3}, {0, BG_SHARD_COUNT_MAX + 1},
                                      {UINT32_MAX, UINT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(bg_engine_set_shard(&w->engine, bad[i][0], bad[i][1]), BG_BAD_FORMAT);
        assert_int_equal(w->engine.shard_index, 0);
        assert_int_equal(w->engine.shard_count, 1);
        assert_int_equal(w->engine.next_id, 1);
    }
    assert_int_equal(bg_engine_set_shard(&w->engine, BG_SHARD_COUNT_MAX - 1, BG_SHARD_COUNT_MAX), BG_OK);
    assert_int_equal(w->engine.next_id, BG_SHARD_COUNT_MAX - 1);
    assert_int_equal(bg_engine_set_shard(&w->engine, 0, 1), BG_OK);
    check_world(w);
}

/* The id table under a shard class (ids 5 apart) through three growths,
 * out-of-order deletes and ids that wrap around the table: every job stays
 * findable, no deleted one is. */
static void test_job_table_sharded_deletes(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *producer = &w->fc[0];
    assert_int_equal(bg_engine_set_shard(e, 2, 5), BG_OK);
    enum { N = 5000 };
    static uint64_t ids[N];
    for (size_t i = 0; i < N; i++) ids[i] = put_job(producer, "x", 1, 0, 60, T0);
    assert_true(e->jobs_mask + 1 >= 8192);
    for (size_t i = 0; i < N; i += 3) assert_int_equal(bg_delete(&producer->client, ids[i], T0), BG_OK);
    for (size_t k = 0; k < N; k += 7) {
        size_t i = N - 1 - k;
        if (i % 3) assert_int_equal(bg_delete(&producer->client, ids[i], T0), BG_OK);
    }
    check_world(w);
    /* ids run past the table's size while the kept jobs stay: new jobs
     * share home slots with old ones and deletes shift them back */
    size_t slots = e->jobs_mask + 1;
    enum { M = 2000 };
    static uint64_t more[M];
    for (int round = 0; round < 4; round++) {
        for (size_t i = 0; i < M; i++) more[i] = put_job(producer, "y", 1, 0, 60, T0);
        check_world(w);
        for (size_t i = 0; i < M; i += 2) assert_int_equal(bg_delete(&producer->client, more[i], T0), BG_OK);
        check_world(w);
        for (size_t i = 1; i < M; i += 2) assert_int_equal(bg_delete(&producer->client, more[i], T0), BG_OK);
        check_world(w);
    }
    assert_int_equal(e->jobs_mask + 1, slots);
    for (size_t i = 0; i < N; i++) {
        int deleted = i % 3 == 0 || (N - 1 - i) % 7 == 0;
        assert_int_equal(bg_job_find(e, ids[i]) != NULL, !deleted);
    }
}

/* Restoring from a log keeps the class: next_id goes to the smallest id of
 * the class above every id a record named, of any class (ids are never
 * reused); a job of another class is counted as foreign, and the audit
 * calls it broken. */
static void test_shard_restore_keeps_the_class(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    assert_int_equal(bg_engine_set_shard(e, 1, 3), BG_OK);
    assert_int_equal(e->next_id, 1);
    struct bg_journal_job r = {.id = 7, .tube = "t", .state = BG_JOB_READY, .pri = 5, .ttr_s = 60,
                               .body_len = 3, .body = "x\r\n"};
    assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    assert_int_equal(e->next_id, 10);
    bg_engine_restore_delete(e, 20);        /* of class 2: the next id of ours above it is 22 */
    assert_int_equal(e->next_id, 22);
    bg_engine_restore_delete(e, 4);         /* below: nothing moves */
    assert_int_equal(e->next_id, 22);
    bg_engine_id_seen(e, 22);
    assert_int_equal(e->next_id, 25);
    assert_int_equal(bg_engine_last_id(e), 22);
    assert_int_equal(put_job(&w->fc[0], "after", 5, 0, 60, T0), 25);
    uint64_t first;
    assert_int_equal(bg_engine_foreign_jobs(e, &first), 0);
    check_world(w);
    /* a log written by another shard: ids 8 and 5 are class 2 */
    r.id = 8;
    assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    r.id = 5;
    assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    assert_int_equal(bg_engine_foreign_jobs(e, &first), 2);
    assert_int_equal(first, 5);
    const char *broken;
    assert_int_equal(bg_engine_audit(e, &broken), BG_INTERNAL_ERROR);
    assert_string_equal(broken, "a job id of another shard's class");
    bg_engine_restore_delete(e, 5);
    bg_engine_restore_delete(e, 8);
    assert_int_equal(bg_engine_foreign_jobs(e, &first), 0);
    assert_int_equal(bg_engine_audit(e, &broken), BG_OK);
}

/* CRC-32 bit by bit (reflected, polynomial 0xEDB88320): the definition,
 * to check the table-driven bg_crc32 against. */
static uint32_t crc32_by_bits(const char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= (unsigned char)p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (c & 1 ? 0xEDB88320u : 0);
    }
    return ~c;
}

/* The tube rule is CRC-32 (the check value of "123456789" is the published
 * 0xCBF43926) mod N, for every byte a tube name may hold. */
static void test_shard_of_tube_is_crc32_mod_n(void **state)
{
    (void)state;
    assert_int_equal(bg_crc32("123456789", 9), 0xCBF43926u);
    assert_int_equal(bg_crc32("", 0), 0);
    static const char *const names[] = {"default", "emails", "a/b", "x(1);$y", "+-._", "tube-99"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len = strlen(names[i]);
        uint32_t crc = crc32_by_bits(names[i], len);
        assert_int_equal(bg_crc32(names[i], len), crc);
        for (uint32_t n = 1; n <= 7; n++) assert_int_equal(bg_shard_of_tube(names[i], len, n), crc % n);
        assert_int_equal(bg_shard_of_tube(names[i], len, 1), 0);
    }
    /* 300 tubes spread over 3 shards, none empty */
    uint32_t per[3] = {0};
    char name[16];
    for (int i = 0; i < 300; i++) {
        int len = snprintf(name, sizeof name, "tube-%d", i);
        per[bg_shard_of_tube(name, (size_t)len, 3)]++;
    }
    for (int k = 0; k < 3; k++) assert_true(per[k] > 50);
}

/* ======================================================================= */
/* browsing a tube's jobs and bulk actions (issue 26)                      */
/* ======================================================================= */

/* The jobs of tube t in `state`, found from the job table alone and
 * sorted by (key, id) with the key read as bg_job_cursor documents it:
 * the model the engine's ordered listing must match. Returns how many. */
static size_t model_tube_jobs(const struct bg_engine *e, const struct bg_tube *t,
                              enum bg_job_state state, struct bg_job **out)
{
    size_t n = 0;
    for (size_t b = 0; b <= e->jobs_mask; b++) {
        struct bg_job *j = e->jobs[b];
        if (!j || j->tube != t || j->state != state) continue;
        size_t i = n++;
        struct bg_job_cursor k = bg_job_cursor_of(j);
        for (; i > 0; i--) { /* insertion sort: small lists */
            struct bg_job_cursor p = bg_job_cursor_of(out[i - 1]);
            if (p.key < k.key || (p.key == k.key && p.id < k.id)) break;
            out[i] = out[i - 1];
        }
        out[i] = j;
    }
    return n;
}

/* Page through t's jobs in `state`, `page` at a time, and check the
 * concatenation against the model; returns how many were listed. */
static size_t check_listing(const struct bg_engine *e, const struct bg_tube *t,
                            enum bg_job_state state, size_t page)
{
    size_t total = e->job_count;
    struct bg_job **want = calloc(total + 1, sizeof *want);
    struct bg_job **got = calloc(total + page + 1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    size_t n = model_tube_jobs(e, t, state, want), listed = 0;
    struct bg_job_cursor cur = {0, 0};
    for (;;) {
        size_t k = bg_tube_jobs(t, state, &cur, got + listed, page);
        assert_true(k <= page);
        if (k) {
            struct bg_job_cursor last = bg_job_cursor_of(got[listed + k - 1]);
            assert_int_equal(cur.key, last.key);
            assert_int_equal(cur.id, last.id);
        }
        listed += k;
        assert_true(listed <= n);
        if (k < page) break;
    }
    assert_int_equal(listed, n);
    for (size_t i = 0; i < n; i++) assert_ptr_equal(got[i], want[i]);
    free(want);
    free(got);
    return n;
}

/* Ids of a listing of up to 16 jobs after *cur, as a 0-terminated array. */
static void list_ids(const struct bg_tube *t, enum bg_job_state state, struct bg_job_cursor *cur,
                     size_t max, uint64_t ids[17])
{
    struct bg_job *js[16];
    size_t n = bg_tube_jobs(t, state, cur, js, max);
    for (size_t i = 0; i < n; i++) ids[i] = js[i]->id;
    ids[n] = 0;
}

#define ASSERT_IDS(ids, ...)                                                  \
    do {                                                                      \
        const uint64_t want_[] = {__VA_ARGS__, 0};                           \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)         \
            assert_int_equal((ids)[i_], want_[i_]);                           \
    } while (0)

/* Each state lists in its serving order: ready by (priority, id), delayed
 * by deadline, buried by burial (not id), reserved by id; across pages. */
static void test_browse_order_per_state(void **state)
{
    struct world *w = *state;
    struct fake_client *p = &w->fc[0], *c = &w->fc[1];
    struct bg_tube *t = w->engine.default_tube;
    uint64_t r1 = put_job(p, "r1", 5, 0, 60, T0);
    uint64_t r2 = put_job(p, "r2", 1, 0, 60, T0);
    uint64_t r3 = put_job(p, "r3", 5, 0, 60, T0);
    uint64_t r4 = put_job(p, "r4", 0, 0, 60, T0);
    uint64_t d1 = put_job(p, "d1", 0, 30, 60, T0);
    uint64_t d2 = put_job(p, "d2", 9, 10, 60, T0);
    uint64_t d3 = put_job(p, "d3", 0, 10, 60, T0);
    uint64_t ids[17];
    struct bg_job_cursor cur = {0, 0};
    list_ids(t, BG_JOB_READY, &cur, 3, ids);
    ASSERT_IDS(ids, r4, r2, r1);
    list_ids(t, BG_JOB_READY, &cur, 3, ids);
    ASSERT_IDS(ids, r3);
    list_ids(t, BG_JOB_READY, &cur, 3, ids); /* the end: nothing, cursor kept */
    assert_int_equal(ids[0], 0);
    assert_int_equal(cur.key, 5);
    assert_int_equal(cur.id, r3);
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_DELAYED, &cur, 16, ids);
    ASSERT_IDS(ids, d2, d3, d1);
    /* reserve r4, r2, r1, r3 (serving order); bury r1 then r4 then r3 */
    for (int i = 0; i < 4; i++) reserve_now(c, T0);
    assert_int_equal(bg_bury(&c->client, r1, 7, T0), BG_OK);
    assert_int_equal(bg_bury(&c->client, r4, 7, T0), BG_OK);
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_RESERVED, &cur, 16, ids);
    ASSERT_IDS(ids, r2, r3);
    assert_int_equal(bg_bury(&c->client, r3, 7, T0), BG_OK);
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_BURIED, &cur, 2, ids);
    ASSERT_IDS(ids, r1, r4);
    list_ids(t, BG_JOB_BURIED, &cur, 2, ids);
    ASSERT_IDS(ids, r3);
    /* kicked and buried again: it goes to the end of the burial order */
    assert_int_equal(bg_kick_job(&w->engine, r1, T0), BG_OK);
    assert_int_equal(reserve_now(c, T0), r1);
    assert_int_equal(bg_bury(&c->client, r1, 7, T0), BG_OK);
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_BURIED, &cur, 16, ids);
    ASSERT_IDS(ids, r4, r3, r1);
    /* max 0 lists nothing and leaves the cursor */
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_BURIED, &cur, 0, ids);
    assert_int_equal(ids[0], 0);
    assert_int_equal(cur.id, 0);
    check_world(w);
}

/* A cursor stays valid as jobs come and go: its own job deleted or
 * reserved, jobs added before it (not shown) and after it (shown). */
static void test_browse_cursor_survives_changes(void **state)
{
    struct world *w = *state;
    struct fake_client *p = &w->fc[0];
    struct bg_tube *t = w->engine.default_tube;
    uint64_t a = put_job(p, "a", 10, 0, 60, T0);
    uint64_t b = put_job(p, "b", 20, 0, 60, T0);
    uint64_t c = put_job(p, "c", 30, 0, 60, T0);
    uint64_t ids[17];
    struct bg_job_cursor cur = {0, 0};
    list_ids(t, BG_JOB_READY, &cur, 2, ids);
    ASSERT_IDS(ids, a, b);
    assert_int_equal(bg_delete(&p->client, b, T0), BG_OK); /* the cursor's own job */
    uint64_t before = put_job(p, "before", 15, 0, 60, T0);
    uint64_t tie = put_job(p, "tie", 20, 0, 60, T0); /* same priority, later id */
    uint64_t after = put_job(p, "after", 25, 0, 60, T0);
    list_ids(t, BG_JOB_READY, &cur, 16, ids);
    ASSERT_IDS(ids, tie, after, c);
    (void)before;
    /* bg_job_cursor_of: resume right after a given job */
    cur = bg_job_cursor_of(find(w, before));
    list_ids(t, BG_JOB_READY, &cur, 1, ids);
    ASSERT_IDS(ids, tie);
    /* a delayed cursor past a job that became ready */
    uint64_t d1 = put_job(p, "d1", 0, 1, 60, T0);
    uint64_t d2 = put_job(p, "d2", 0, 2, 60, T0);
    uint64_t d3 = put_job(p, "d3", 0, 3, 60, T0);
    cur = (struct bg_job_cursor){0, 0};
    list_ids(t, BG_JOB_DELAYED, &cur, 1, ids);
    ASSERT_IDS(ids, d1);
    bg_engine_tick(&w->engine, T0 + SEC(1));
    assert_int_equal(state_of(w, d1), BG_JOB_READY);
    list_ids(t, BG_JOB_DELAYED, &cur, 16, ids);
    ASSERT_IDS(ids, d2, d3);
    check_world(w);
}

/* Bulk kick and delete: serving order, max respected, logged, counted;
 * states that do not apply do nothing; a tube emptied by a bulk delete
 * that nothing else refers to is gone. */
static void test_bulk_kick_and_delete(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *p = &w->fc[0], *c = &w->fc[1];
    struct bg_tube *t = e->default_tube;
    uint64_t id[6];
    for (int i = 0; i < 6; i++) id[i] = put_job(p, "x", 6 - i, 0, 60, T0); /* reversed priorities */
    for (int i = 0; i < 6; i++) reserve_now(c, T0); /* in serving order: id[5] first */
    for (int i = 0; i < 6; i++) assert_int_equal(bg_bury(&c->client, id[i], 6 - (uint32_t)i, T0), BG_OK);
    memset(&logged, 0, sizeof logged);
    e->journal = &test_log;
    assert_int_equal(bg_kick_state(e, t, BG_JOB_RESERVED, 10, T0), 0);
    assert_int_equal(bg_kick_state(e, t, BG_JOB_READY, 10, T0), 0);
    assert_int_equal(bg_kick_state(e, t, BG_JOB_BURIED, 2, T0), 2); /* the oldest burials */
    assert_int_equal(state_of(w, id[0]), BG_JOB_READY);
    assert_int_equal(state_of(w, id[1]), BG_JOB_READY);
    assert_int_equal(state_of(w, id[2]), BG_JOB_BURIED);
    assert_int_equal(bg_job_kicks(find(w, id[0])), 1);
    assert_int_equal(logged.updates, 2);
    assert_int_equal(logged.id, id[1]);
    uint64_t deleted = e->stat.total_jobs_deleted, cmd_delete = t->stat.cmd_delete;
    assert_int_equal(bg_delete_state(e, t, BG_JOB_RESERVED, 10, T0), 0);
    assert_int_equal(bg_delete_state(e, t, BG_JOB_BURIED, 3, T0), 3);
    assert_int_equal(logged.deletes, 3);
    assert_int_equal(logged.deleted_id, id[4]);
    assert_null(find(w, id[2]));
    assert_non_null(find(w, id[5]));
    assert_int_equal(bg_delete_state(e, t, BG_JOB_BURIED, UINT64_MAX, T0), 1);
    assert_int_equal(bg_delete_state(e, t, BG_JOB_BURIED, UINT64_MAX, T0), 0);
    assert_int_equal(t->buried.len, 0);
    assert_int_equal(bg_delete_state(e, t, BG_JOB_READY, 1, T0), 1); /* id[1]: priority 5 */
    assert_null(find(w, id[1]));
    assert_non_null(find(w, id[0]));
    assert_int_equal(e->stat.total_jobs_deleted, deleted + 5);
    assert_int_equal(t->stat.cmd_delete, cmd_delete + 5);
    assert_int_equal(logged.deletes, 5);
    /* delayed: kick in deadline order, then delete the rest */
    uint64_t d1 = put_job(p, "d", 0, 20, 60, T0), d2 = put_job(p, "d", 0, 10, 60, T0);
    uint64_t d3 = put_job(p, "d", 0, 30, 60, T0);
    assert_int_equal(bg_kick_state(e, t, BG_JOB_DELAYED, 1, T0), 1);
    assert_int_equal(state_of(w, d2), BG_JOB_READY);
    assert_int_equal(bg_delete_state(e, t, BG_JOB_DELAYED, 1, T0), 1);
    assert_null(find(w, d1));
    assert_int_equal(state_of(w, d3), BG_JOB_DELAYED);
    /* bg_kick keeps beanstalk's rule: buried first, else delayed */
    assert_int_equal(bg_kick(e, t, 5, T0), 1);
    assert_int_equal(state_of(w, d3), BG_JOB_READY);
    /* a tube that only its jobs keep: the bulk delete that empties it frees it */
    struct bg_job *j = make_job(e, "g", 0, 0, 60, T0);
    assert_non_null(j);
    assert_int_equal(bg_put_named(&p->client, "gone", j, T0), BG_OK);
    struct bg_tube *gone = bg_tube_find(e, "gone");
    assert_non_null(gone);
    assert_int_equal(bg_delete_state(e, gone, BG_JOB_READY, 100, T0), 1);
    assert_null(bg_tube_find(e, "gone"));
    e->journal = NULL;
    check_world(w);
}

/* Random puts, reserves, releases, buries, kicks, deletes and bulk steps
 * over a few tubes; after each burst every state's listing, paged at
 * random sizes, matches the model and the audit passes. */
static void test_browse_matches_model(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    static const char *tubes[] = {"default", "b1", "b2"};
    prng_state = 0xB40453;
    bg_time now = T0;
    size_t seen[BG_JOB_BURIED + 1] = {0};
    for (int round = 0; round < 200; round++) {
        for (int k = 0; k < 20; k++) {
            struct fake_client *fc = &w->fc[pick(3)];
            struct bg_tube *t = bg_tube_find(e, tubes[pick(3)]);
            switch (pick(8)) {
            case 0:
            case 1: {
                struct bg_job *j = make_job(e, "m", (uint32_t)pick(4), pick(3) ? 0 : (uint32_t)pick(5), 5, now);
                assert_non_null(j);
                assert_int_equal(bg_put_named(&fc->client, tubes[pick(3)], j, now) >= BG_BURIED, 1);
                break;
            }
            case 2: {
                struct bg_job *j = NULL;
                int r = pick(2) ? bg_reserve_job(&fc->client, 1 + pick(e->next_id), now, &j)
                                : reserve(fc, 0, now, &j);
                if (r == BG_OK && pick(2))
                    bg_bury(&fc->client, j->id, (uint32_t)pick(4), now);
                break;
            }
            case 3: {
                struct bg_job *j = fc->client.reserved_head;
                if (j) bg_release(&fc->client, j->id, (uint32_t)pick(4), pick(2) ? 0 : 2, now);
                break;
            }
            case 4:
                bg_delete(&fc->client, 1 + pick(e->next_id), now);
                break;
            case 5:
                if (t) bg_kick_state(e, t, pick(2) ? BG_JOB_BURIED : BG_JOB_DELAYED, pick(4), now);
                break;
            case 6:
                if (t && !pick(4)) bg_delete_state(e, t, (enum bg_job_state)pick(4), pick(3), now);
                break;
            case 7:
                now += MSEC(pick(1500));
                bg_engine_tick(e, now);
                break;
            }
        }
        for (int ti = 0; ti < 3; ti++) {
            struct bg_tube *t = bg_tube_find(e, tubes[ti]);
            if (!t) continue;
            for (int s = BG_JOB_READY; s <= BG_JOB_BURIED; s++)
                seen[s] += check_listing(e, t, (enum bg_job_state)s, 1 + pick(5));
        }
        check_world(w);
    }
    print_message("    listed %zu ready, %zu delayed, %zu reserved, %zu buried\n", seen[0], seen[1], seen[2], seen[3]);
    for (int s = BG_JOB_READY; s <= BG_JOB_BURIED; s++) assert_true(seen[s] > 100); /* every state was listed */
}

static int job_cursor_less(const void *a, const void *b)
{
    struct bg_job_cursor x = bg_job_key(*(struct bg_job *const *)a, BG_ORDER_PRIORITY);
    struct bg_job_cursor y = bg_job_key(*(struct bg_job *const *)b, BG_ORDER_PRIORITY);
    if (x.key != y.key) return x.key < y.key ? -1 : 1;
    return x.id < y.id ? -1 : x.id > y.id;
}

/* tree.c alone, at a size where balance matters: 20,000 jobs inserted
 * with few distinct priorities (long runs of equal keys, ascending ids,
 * as puts make them) and removed at random; after each phase the
 * audit passes and listing from random cursors matches a sorted model. */
static void test_tree_random(void **state)
{
    (void)state;
    enum { N = 20000 };
    struct bg_job *jobs = calloc(N, sizeof *jobs), **sorted = calloc(N, sizeof *sorted);
    struct bg_job *page[37];
    assert_non_null(jobs);
    assert_non_null(sorted);
    struct bg_tree t;
    bg_tree_init(&t, BG_ORDER_PRIORITY, 0);
    prng_state = 0x7EE;
    for (size_t i = 0; i < N; i++) {
        jobs[i].id = i + 1;
        jobs[i].pri = (uint32_t)pick(4) * 1000;
        jobs[i].state = BG_JOB_READY;
        bg_tree_insert(&t, &jobs[i]);
    }
    uint8_t *in = calloc(N, 1);
    assert_non_null(in);
    memset(in, 1, N);
    const char *broken;
    for (int phase = 0; phase < 6; phase++) {
        for (size_t k = 0; k < N / 4; k++) { /* remove some, put some back */
            size_t i = pick(N);
            if (in[i]) {
                assert_ptr_equal(bg_tree_remove(&t, bg_tree_key(&t, &jobs[i])), &jobs[i]);
                assert_null(bg_tree_remove(&t, bg_tree_key(&t, &jobs[i]))); /* gone */
            } else {
                bg_tree_insert(&t, &jobs[i]);
            }
            in[i] ^= 1;
        }
        assert_int_equal(bg_tree_audit(&t, NULL, NULL, &broken), BG_OK);
        size_t n = 0;
        for (size_t i = 0; i < N; i++)
            if (in[i]) sorted[n++] = &jobs[i];
        qsort(sorted, n, sizeof *sorted, job_cursor_less);
        assert_int_equal(t.len, n);
        assert_ptr_equal(bg_tree_first(&t), n ? sorted[0] : NULL);
        for (int q = 0; q < 50; q++) { /* a cursor at a job, or between jobs */
            size_t at = pick(n + 1);
            struct bg_job_cursor c = at ? bg_job_key(sorted[at - 1], BG_ORDER_PRIORITY) : (struct bg_job_cursor){0, 0};
            if (at && pick(2) && !(at < n && sorted[at]->pri == c.key && sorted[at]->id == c.id + 1))
                c.id++; /* just past it: where a deleted job would have been */
            size_t got = bg_tree_after(&t, c, page, 37);
            size_t want = n - at < 37 ? n - at : 37;
            assert_int_equal(got, want);
            for (size_t i = 0; i < got; i++) assert_ptr_equal(page[i], sorted[at + i]);
        }
    }
    free(in);
    free(sorted);
    free(jobs);
}

static double clock_ms(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
static double thread_ms(void) { return clock_ms(CLOCK_THREAD_CPUTIME_ID); }
static double wall_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

/* Bulk steps cost O(max log n): deleting 1,000,000 buried jobs 1,000 at a
 * time, no step takes long (the HTTP layer runs one per loop turn). */
static void test_bulk_delete_steps_are_short(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    struct fake_client *p = &w->fc[0];
    const uint64_t n = getenv("BG_BULK_JOBS") ? strtoull(getenv("BG_BULK_JOBS"), NULL, 10) : 1000000;
    assert_int_equal(bg_client_use(&p->client, "bulk"), BG_OK);
    struct bg_tube *t = bg_tube_find(e, "bulk");
    /* buried straight from the log, as a restore would: no client holds them */
    for (uint64_t i = 0; i < n; i++) {
        struct bg_journal_job r = {.id = i + 1, .tube = "bulk", .state = BG_JOB_BURIED, .ttr_s = 60,
                                   .body_len = 3, .body = "x\r\n"};
        assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    }
    assert_int_equal(t->buried.len, n);
    /* CPU time of this thread: a loaded machine's preemptions are not
     * the engine's cost (the wall time is printed beside it) */
    double worst = 0, total = 0, wall = 0;
    uint64_t steps = 0, deleted = 0, got;
    double page_ms = thread_ms();
    struct bg_job *first_page[10];
    struct bg_job_cursor cur = {0, 0};
    assert_int_equal(bg_tube_jobs(t, BG_JOB_BURIED, &cur, first_page, 10), n < 10 ? n : 10);
    page_ms = thread_ms() - page_ms;
    do {
        double at = thread_ms(), wall_at = wall_ms();
        got = bg_delete_state(e, t, BG_JOB_BURIED, 1000, T0);
        double ms = thread_ms() - at;
        wall += wall_ms() - wall_at;
        if (ms > worst) worst = ms;
        total += ms;
        deleted += got;
        steps++;
    } while (got);
    assert_int_equal(deleted, n);
    assert_int_equal(e->job_count, 0);
    double mean = total / (double)(steps > 1 ? steps - 1 : 1);
    print_message("    %llu buried jobs: first page %.3f ms; deleted in %llu steps of 1000: "
                  "CPU mean %.3f ms, worst %.3f ms; wall mean %.3f ms\n",
                  (unsigned long long)n, page_ms, (unsigned long long)steps - 1, mean, worst,
                  wall / (double)(steps > 1 ? steps - 1 : 1));
    /* a step that walked the tube would cost milliseconds each; the bounds
     * are loose for a sanitizer build */
    assert_true(mean < 2.0);
    assert_true(worst < 20.0);
    check_world(w);
}

/* Restoring from the log keeps the burial order (the log's order), and a
 * restored job buried again by an update goes to the end of it. */
static void test_restore_keeps_burial_order(void **state)
{
    struct world *w = *state;
    struct bg_engine *e = &w->engine;
    static const uint64_t ids[] = {9, 4, 7};
    for (size_t i = 0; i < 3; i++) {
        struct bg_journal_job r = {.id = ids[i], .tube = "rb", .state = BG_JOB_BURIED, .ttr_s = 60,
                                   .body_len = 3, .body = "x\r\n"};
        assert_int_equal(bg_engine_restore_job(e, &r, T0, T0, T0), BG_OK);
    }
    struct bg_journal_job again = {.id = 9, .tube = "rb", .state = BG_JOB_BURIED, .ttr_s = 60};
    assert_int_equal(bg_engine_restore_update(e, &again, T0, T0), BG_OK);
    bg_engine_restore_finish(e);
    uint64_t got[17];
    struct bg_job_cursor cur = {0, 0};
    list_ids(bg_tube_find(e, "rb"), BG_JOB_BURIED, &cur, 16, got);
    ASSERT_IDS(got, 4, 7, 9);
    check_world(w);
}

/* An engine destroyed while a client still holds a reservation frees the
 * reserved index's records too (ASan's leak check would say otherwise). */
static void test_destroy_with_reservations(void **state)
{
    (void)state;
    struct bg_engine e;
    struct fake_client fc;
    assert_int_equal(bg_engine_init(&e, MAX_JOB_SIZE, NULL), BG_OK);
    assert_int_equal(fake_open(&e, &fc), BG_OK);
    for (int i = 0; i < 3; i++) put_job(&fc, "held", 0, 0, 60, T0);
    for (int i = 0; i < 3; i++) reserve_now(&fc, T0);
    assert_int_equal(fc.client.engine->tube_list[0]->reserved.len, 3);
    bg_engine_destroy(&e);
    /* the client's own memory, which bg_client_close would have freed */
    for (uint32_t i = 0; i < fc.client.watch_len; i++) bg_free(fc.client.watch[i]);
    bg_free(fc.client.watch);
    bg_free(fc.client.watch_tube);
    bg_heap_free(&fc.client.reserved);
}

/* Appends (a put's new id at a priority already there) walk from the
 * tree's finger: long runs of them, a FIFO (remove the first, append), and
 * removals and inserts elsewhere in between (which reset the finger) keep
 * the tree sound and in order. */
static void test_tree_appends(void **state)
{
    (void)state;
    enum { M = 60000 };
    struct bg_job *jobs = calloc(M, sizeof *jobs);
    uint8_t *in = calloc(M, 1);
    assert_non_null(jobs);
    assert_non_null(in);
    struct bg_tree t;
    bg_tree_init(&t, BG_ORDER_PRIORITY, 0);
    prng_state = 0xF1F0;
    const char *broken;
    size_t next = 0, head = 0;
    for (size_t i = 0; i < M; i++) {
        jobs[i].id = i + 1;
        jobs[i].pri = 7;
        jobs[i].state = BG_JOB_READY;
    }
    for (int step = 0; next < M; step++) {
        if (step < 30000 || pick(3)) { /* append */
            bg_tree_insert(&t, &jobs[next]);
            in[next++] = 1;
        } else if (pick(2)) { /* FIFO: take the first */
            while (!in[head]) head++;
            assert_ptr_equal(bg_tree_first(&t), &jobs[head]);
            assert_ptr_equal(bg_tree_remove(&t, bg_tree_key(&t, &jobs[head])), &jobs[head]);
            in[head] = 0;
        } else { /* anywhere: remove one, or put back a removed one */
            size_t i = pick(next);
            if (in[i]) assert_ptr_equal(bg_tree_remove(&t, bg_tree_key(&t, &jobs[i])), &jobs[i]);
            else bg_tree_insert(&t, &jobs[i]);
            in[i] ^= 1;
            if (in[i] && i < head) head = i; /* the first again */
        }
        if (step % 997 == 0) assert_int_equal(bg_tree_audit(&t, NULL, NULL, &broken), BG_OK);
    }
    assert_int_equal(bg_tree_audit(&t, NULL, NULL, &broken), BG_OK);
    struct bg_job *page[100];
    struct bg_job_cursor c = {0, 0};
    size_t listed = 0, got;
    uint64_t last_id = 0;
    while ((got = bg_tree_after(&t, c, page, 100)) > 0) {
        for (size_t i = 0; i < got; i++) {
            assert_true(page[i]->id > last_id);
            assert_true(in[page[i]->id - 1]);
            last_id = page[i]->id;
        }
        listed += got;
        c = bg_tree_key(&t, page[got - 1]);
    }
    assert_int_equal(listed, t.len);
    free(in);
    free(jobs);
}

/* ======================================================================= */

#define ENGINE_TEST(fn) cmocka_unit_test_setup_teardown(fn, world_setup, world_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        ENGINE_TEST(test_priority_order_and_fifo_within_priority),
        ENGINE_TEST(test_urgent_counts),
        ENGINE_TEST(test_ttr_expiry_returns_job_to_ready),
        ENGINE_TEST(test_ttr_zero_is_one_second),
        ENGINE_TEST(test_ttr_expiry_hands_job_to_waiter),
        ENGINE_TEST(test_reserve_deadline_soon),
        ENGINE_TEST(test_reserve_deadline_soon_edges),
        ENGINE_TEST(test_waiting_client_woken_with_deadline_soon),
        ENGINE_TEST(test_waiting_wake_is_min_of_timeout_and_margin),
        ENGINE_TEST(test_reserve_timeout_zero),
        ENGINE_TEST(test_reserve_timeout_expires_on_tick),
        ENGINE_TEST(test_reserve_wait_ends_with_job),
        ENGINE_TEST(test_tick_job_beats_timeout_at_same_instant),
        ENGINE_TEST(test_late_tick_catches_up),
        ENGINE_TEST(test_delayed_job_ready_after_delay),
        ENGINE_TEST(test_delayed_job_delivered_to_waiter),
        ENGINE_TEST(test_delayed_order_by_deadline),
        ENGINE_TEST(test_pause_holds_ready_job_until_unpause),
        ENGINE_TEST(test_pause_missing_tube),
        ENGINE_TEST(test_pause_zero_and_repause),
        ENGINE_TEST(test_kick_buried_then_delayed),
        ENGINE_TEST(test_kick_is_per_tube_and_dispatches),
        ENGINE_TEST(test_kick_job_by_state),
        ENGINE_TEST(test_kick_when_allocations_fail),
        ENGINE_TEST(test_tube_lifetime),
        ENGINE_TEST(test_default_tube_always_exists),
        ENGINE_TEST(test_tube_list_order_after_removal),
        ENGINE_TEST(test_paused_tube_freed_while_paused),
        ENGINE_TEST(test_many_tubes),
        ENGINE_TEST(test_waiter_on_two_tubes),
        ENGINE_TEST(test_two_waiters_two_jobs),
        ENGINE_TEST(test_waiters_served_in_reference_order),
        ENGINE_TEST(test_put_into_unwatched_tube_wakes_nobody),
        ENGINE_TEST(test_stop_waiting),
        ENGINE_TEST(test_dead_waiter_is_skipped),
        ENGINE_TEST(test_close_returns_reserved_jobs),
        ENGINE_TEST(test_close_hands_job_to_waiter),
        ENGINE_TEST(test_close_while_waiting),
        ENGINE_TEST(test_delete_by_state),
        ENGINE_TEST(test_release_with_delay),
        ENGINE_TEST(test_release_to_waiter),
        ENGINE_TEST(test_bury),
        ENGINE_TEST(test_touch_extends_deadline),
        ENGINE_TEST(test_touch_moves_deadline_soon_wake),
        ENGINE_TEST(test_reserve_job_by_state),
        ENGINE_TEST(test_catch_up_pause_zero_then_reserve),
        ENGINE_TEST(test_catch_up_pause_ended_without_tick),
        ENGINE_TEST(test_catch_up_delayed_job_due_without_tick),
        ENGINE_TEST(test_catch_up_ttr_ended_without_tick),
        ENGINE_TEST(test_catch_up_waiter_timed_out_before_put),
        ENGINE_TEST(test_catch_up_close_counts_expired_ttr),
        ENGINE_TEST(test_catch_up_due_at_bound),
        ENGINE_TEST(test_put_while_log_unavailable),
        ENGINE_TEST(test_job_memory_ceiling_exact),
        ENGINE_TEST(test_job_memory_counts_bodies_in_flight),
        ENGINE_TEST(test_job_memory_restore_over_ceiling),
        ENGINE_TEST(test_set_ttr_is_logged),
        ENGINE_TEST(test_browse_order_per_state),
        ENGINE_TEST(test_browse_cursor_survives_changes),
        ENGINE_TEST(test_bulk_kick_and_delete),
        ENGINE_TEST(test_browse_matches_model),
        cmocka_unit_test(test_tree_random),
        cmocka_unit_test(test_tree_appends),
        ENGINE_TEST(test_bulk_delete_steps_are_short),
        ENGINE_TEST(test_restore_keeps_burial_order),
        cmocka_unit_test(test_destroy_with_reservations),
        ENGINE_TEST(test_sleeping_counts_as_waiting),
        ENGINE_TEST(test_engine_audit_finds_breakage),
        ENGINE_TEST(test_peek_and_job_ids),
        cmocka_unit_test(test_shard_ids_are_of_the_class),
        ENGINE_TEST(test_shard_setting_checked),
        ENGINE_TEST(test_shard_restore_keeps_the_class),
        cmocka_unit_test(test_shard_of_tube_is_crc32_mod_n),
        cmocka_unit_test(test_tube_table_is_keyed),
        cmocka_unit_test(test_session_pause_zero_then_reserve_one_read),
        cmocka_unit_test(test_session_reply_budget),
        cmocka_unit_test(test_session_watch_limit),
        cmocka_unit_test(test_buf_shrink),
        cmocka_unit_test(test_session_reads_after_delay_passed),
        cmocka_unit_test(test_session_reads_after_ttr_passed),
        cmocka_unit_test(test_session_peer_eof_after_wake_passed),
        ENGINE_TEST(test_jobs_reserved_and_deleted),
        ENGINE_TEST(test_put_while_draining),
        ENGINE_TEST(test_job_new_out_of_memory),
        ENGINE_TEST(test_reserve_oom_keeps_ttr_timer),
        ENGINE_TEST(test_job_memory_counts_side_records),
        ENGINE_TEST(test_delayed_put_side_record_oom),
        ENGINE_TEST(test_reserve_uses_spare),
        ENGINE_TEST(test_restore_side_record_oom),
        ENGINE_TEST(test_job_table_grow_failure),
        ENGINE_TEST(test_job_table_full_refuses),
        ENGINE_TEST(test_job_table_sharded_deletes),
        cmocka_unit_test(test_oom_every_allocation),
        cmocka_unit_test(test_job_allocator),
        cmocka_unit_test(test_stress_random_operations),
    };
    const char *filter = getenv("ENGINE_TEST_FILTER"); /* e.g. "*stress*" */
    if (filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}

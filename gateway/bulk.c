/* bulk.c - a bulk kick or delete of one tube's jobs (issue 26), in bounded
 * steps so that the loop never stalls: a million buried jobs deleted at
 * once would hold every other client for a second. The running actions
 * share one budget a loop turn, GW_BULK_STEP_NS of engine work (issue 27:
 * each had its own, so N at once held the loop N ms a turn): one timer
 * runs the turn's steps, the actions in a ring served round robin from
 * the one after the last stepped, until the budget is spent; then a zero
 * timer lets the loop poll sockets and run everything else before the
 * next turn (libevent polls before it runs expired timers). An action
 * that starts while none runs takes its first step in its request's
 * dispatch, which comes before the timer in the same turn: that step's
 * time counts against the turn, whose budget starts again once the timer
 * ran. (Without a timer the budget is not started again, so a dispatch
 * step may find less than a turn's: never more.) A request is
 * suspended between steps as a long-poll is (request.c), so the same
 * watch ends it when its client leaves and the stop sequence resumes it.
 * What each step did is in the log as it goes; the answer depends on the
 * highest log position its steps reached (gw_bulk.mark), so it leaves
 * only once the log holds all of it (the reply rule, http.c).
 *
 * With a log, a step's records (a delete record per job, thousands a ms)
 * come far faster than the flusher writes and syncs them, and another
 * client's record appended meanwhile goes out behind all of them: a
 * durable put would wait for the whole backlog. So a turn's steps act on
 * GW_BULK_LOG_STEP_JOBS jobs at most, all actions together, and the next
 * turn waits until the log has written everything up to the last step's
 * newest record (wal_progress): at most one turn's records are ever ahead
 * of another client's. While the log is failing (it writes nothing; puts
 * are refused) the steps do not wait for it; the reply rule still holds
 * the answer. */
#include <string.h>
#include <time.h>

#include "gateway.h"
#include "../io/eventlog.h"

static const char *const action_names[] = {"kick", "delete"};

/* Act on up to max jobs of tube t: how many were kicked or deleted. t may
 * be freed by a delete of its last jobs. */
static uint64_t engine_call(struct gw_request *r, struct bg_tube *t, uint64_t max, bg_time now)
{
    struct bg_engine *e = r->gw->engine;
    enum bg_job_state state = (enum bg_job_state)r->bulk.state;
    if (r->bulk.action == GW_BULK_KICK) return bg_kick_state(e, t, state, max, now);
    uint64_t n = bg_delete_state(e, t, state, max, now);
    bg_count_cmd(e, BG_CMD_DELETE, n); /* each job is what one delete would do */
    return n;
}

/* The CPU time this thread has used, in ns: a step's own cost, apart from
 * the time the kernel gave other processes meanwhile (debug log only). */
static bg_time thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (bg_time)ts.tv_sec * BG_SECOND + (bg_time)ts.tv_nsec;
}

/* Nonzero while this turn's budget has time (and, with a log, jobs) left. */
static int turn_budget_left(const struct gateway *gw)
{
    const struct gw_bulk_turns *bt = &gw->bulk;
    return bt->spent < GW_BULK_STEP_NS && (!gw->cfg.wal || bt->jobs < GW_BULK_LOG_STEP_JOBS);
}

/* One step of r: engine calls of b->chunk jobs until the turn's budget is
 * spent (at least one call) or r has nothing left; what it took counts
 * against the turn. The chunk is halved after a call that took more than
 * a quarter of the budget and doubled after one that took less than a
 * sixteenth, so that a step overruns by a fraction of the budget however
 * slow or fast the engine is for this state. */
static void step(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    struct gw_bulk_turns *bt = &gw->bulk;
    struct gw_bulk *b = &r->bulk;
    struct bg_engine *e = gw->engine;
    uint64_t outer_pos = e->reply_pos; /* a request's, when the first step runs in its dispatch */
    e->reply_pos = 0;
    bg_time start = gw->now(), now = start, cpu_start = thread_cpu_ns();
    uint64_t jobs_left = gw->cfg.wal ? GW_BULK_LOG_STEP_JOBS - bt->jobs : UINT64_MAX; /* a log record per job */
    while (b->left > 0 && jobs_left > 0) {
        struct bg_tube *t = bg_tube_find(e, r->match.seg[1]);
        uint64_t want = b->left < b->chunk ? b->left : b->chunk;
        if (want > jobs_left) want = jobs_left;
        jobs_left -= want;
        bt->jobs += want;
        uint64_t n = t ? engine_call(r, t, want, now) : 0;
        b->done += n;
        b->left -= n;
        if (n < want) b->left = 0; /* the state has no more jobs (or the tube is gone) */
        bg_time after = gw->now();
        bg_time took = after - now;
        if (took > GW_BULK_STEP_NS / 4 && b->chunk > GW_BULK_CHUNK_MIN) b->chunk /= 2;
        else if (took < GW_BULK_STEP_NS / 16 && b->chunk < GW_BULK_CHUNK_MAX) b->chunk *= 2;
        now = after;
        if (bt->spent + (now - start) >= GW_BULK_STEP_NS) break;
    }
    bt->spent += now - start;
    if (e->reply_pos > b->mark) b->mark = e->reply_pos;
    if (outer_pos > e->reply_pos) e->reply_pos = outer_pos;
    bt->log_pos = wal_progress(gw->cfg.wal).appended;
    b->steps++;
    if (now - start > b->longest_step) b->longest_step = now - start;
    bg_time cpu = thread_cpu_ns() - cpu_start;
    if (cpu > b->longest_step_cpu) b->longest_step_cpu = cpu;
}

/* Arm the next turn's steps for the next loop turn, or `wait` ns later. */
static void schedule(struct gateway *gw, bg_time wait)
{
    struct timeval tv = {(time_t)(wait / BG_SECOND), (suseconds_t)(wait % BG_SECOND / 1000)};
    evtimer_add(gw->bulk.ev, &tv);
}

/* Nonzero when the next turn's steps may run: no log, the log is failing,
 * or it has written every record up to the last step's newest. The time
 * the steps waited for it counts for every running action. */
static int log_caught_up(struct gateway *gw)
{
    struct gw_bulk_turns *bt = &gw->bulk;
    int ready = gw->engine->journal_broken || wal_progress(gw->cfg.wal).written >= bt->log_pos;
    if (ready && bt->waiting_since) {
        bg_time waited = gw->now() - bt->waiting_since;
        struct gw_request *r = bt->next_up;
        for (unsigned i = 0; i < bt->running; i++, r = r->bulk.next_running) r->bulk.log_waited += waited;
        bt->waiting_since = 0;
    } else if (!ready && !bt->waiting_since) {
        bt->waiting_since = gw->now();
    }
    return ready;
}

/* Take r out of the ring of running actions (if it is in it); the timer
 * goes with the last. */
static void leave_ring(struct gw_request *r)
{
    struct gw_bulk_turns *bt = &r->gw->bulk;
    struct gw_bulk *b = &r->bulk;
    if (!b->running) return;
    b->running = 0;
    if (--bt->running == 0) {
        bt->next_up = NULL;
        event_free(bt->ev);
        bt->ev = NULL;
        bt->waiting_since = 0;
        return;
    }
    b->prev_running->bulk.next_running = b->next_running;
    b->next_running->bulk.prev_running = b->prev_running;
    if (bt->next_up == r) bt->next_up = b->next_running;
}

/* Nonzero while r's client is there. The peer watch (request.c) ends a
 * request whose client left; where it stopped watching, ask the socket
 * every GW_BULK_PEER_CHECK_STEPS steps. */
static int client_stays(struct gw_request *r)
{
    if (r->peer_ev || r->bulk.steps % GW_BULK_PEER_CHECK_STEPS != 0 || gw_peer_alive(r)) return 1;
    log_event(BG_LOG_INFO, "http_bulk_abandoned", "action=%s done=%llu left=%llu",
              action_names[r->bulk.action], (unsigned long long)r->bulk.done,
              (unsigned long long)r->bulk.left);
    return 0;
}

/* A loop turn's steps: the running actions from bt->next_up on, one step
 * each, until the turn's budget is spent; the next turn starts after the
 * last one stepped. An action that finished, or whose client left, leaves
 * the ring and its request is resumed (its handler answers). */
static void turn_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gateway *gw = arg;
    struct gw_bulk_turns *bt = &gw->bulk;
    if (gw->stopping) return; /* the stop sequence resumes every action */
    if (!log_caught_up(gw)) {
        schedule(gw, GW_BULK_LOG_POLL_NS);
        return;
    }
    unsigned count = bt->running;
    bg_time turn_cpu = thread_cpu_ns();
    for (unsigned i = 0; i < count && bt->running > 0 && turn_budget_left(gw); i++) {
        struct gw_request *r = bt->next_up;
        bt->next_up = r->bulk.next_running;
        if (!r->listed) continue; /* resumed already (its client left): its handler ends it */
        if (client_stays(r)) {
            step(r);
            if (gw->after_run) gw->after_run(gw->after_run_arg); /* kicked jobs, deadlines; hands the records on */
            if (r->bulk.left > 0) continue;
        }
        leave_ring(r);
        gw_unlist(r);
        gw_wake(r);
    }
    turn_cpu = thread_cpu_ns() - turn_cpu; /* what the turn held the loop, every action's steps */
    struct gw_request *r = bt->next_up;
    for (unsigned i = 0; i < bt->running; i++, r = r->bulk.next_running)
        if (turn_cpu > r->bulk.longest_turn_cpu) r->bulk.longest_turn_cpu = turn_cpu;
    bt->spent = 0; /* the next turn's budget */
    bt->jobs = 0;
    if (bt->running > 0) schedule(gw, 0);
}

/* Put r into the ring of running actions, last in the round (just before
 * next_up), making the turn timer if it is the first. 0, or -1 (no
 * memory). */
static int join_ring(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    struct gw_bulk_turns *bt = &gw->bulk;
    struct gw_bulk *b = &r->bulk;
    if (bt->running == 0) {
        bt->ev = evtimer_new(gw->base, turn_cb, gw);
        if (!bt->ev) return -1;
        b->next_running = b->prev_running = r;
        bt->next_up = r;
        schedule(gw, 0);
    } else {
        struct gw_request *first = bt->next_up, *last = first->bulk.prev_running;
        b->next_running = first;
        b->prev_running = last;
        last->bulk.next_running = r;
        first->bulk.prev_running = r;
    }
    b->running = 1;
    bt->running++;
    return 0;
}

int gw_bulk_start(struct gw_request *r, enum gw_bulk_action action, enum bg_job_state state,
                  uint64_t bound)
{
    struct gw_bulk *b = &r->bulk;
    memset(b, 0, sizeof *b);
    b->active = 1;
    b->action = (uint8_t)action;
    b->state = (uint8_t)state;
    b->chunk = GW_BULK_CHUNK_FIRST;
    b->left = bound;
    if (b->left == 0) return 1;
    struct gateway *gw = r->gw;
    if (gw->bulk.running == 0 && turn_budget_left(gw) && log_caught_up(gw)) {
        step(r); /* the only one: its first step now, in this turn's budget */
        if (b->left == 0) return 1;
    }
    if (join_ring(r) != 0) return 1; /* no memory for the next steps: answer what was done */
    gw_suspend(r);
    return 0;
}

void gw_bulk_end(struct gw_request *r)
{
    struct gw_bulk *b = &r->bulk;
    leave_ring(r);
    if (b->active && b->steps)
        log_event(BG_LOG_DEBUG, "http_bulk_steps",
                  "action=%s done=%llu left=%llu steps=%u longest_step_us=%llu longest_step_cpu_us=%llu "
                  "longest_turn_cpu_us=%llu log_wait_us=%llu",
                  action_names[b->action], (unsigned long long)b->done, (unsigned long long)b->left, b->steps,
                  (unsigned long long)(b->longest_step / 1000), (unsigned long long)(b->longest_step_cpu / 1000),
                  (unsigned long long)(b->longest_turn_cpu / 1000), (unsigned long long)(b->log_waited / 1000));
    b->steps = 0; /* logged once */
}

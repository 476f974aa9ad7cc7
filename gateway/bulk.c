/* bulk.c - a bulk kick or delete of one tube's jobs (issue 26), in bounded
 * steps so that the loop never stalls: a million buried jobs deleted at
 * once would hold every other client for a second. Each loop turn runs one
 * step of about GW_BULK_STEP_NS of engine work, then lets the loop poll
 * sockets and run everything else before the next (a zero timer: libevent
 * polls before it runs expired timers). The request is suspended between
 * steps as a long-poll is (request.c), so the same watch ends it when its
 * client leaves and the stop sequence resumes it. What each step did is in
 * the log as it goes; the answer depends on the highest log position the
 * steps reached (gw_bulk.mark), so it leaves only once the log holds all of
 * it (the reply rule, http.c). */
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

/* One step: engine calls of b->chunk jobs until GW_BULK_STEP_NS passed or
 * nothing is left. The chunk is halved after a call that took more than a
 * quarter of the step and doubled after one that took less than a sixteenth,
 * so that a step overruns its time by a fraction of it however slow or fast
 * the engine is for this state. */
static void step(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    struct gw_bulk *b = &r->bulk;
    struct bg_engine *e = gw->engine;
    uint64_t outer_pos = e->reply_pos; /* a request's, when the first step runs in its dispatch */
    e->reply_pos = 0;
    bg_time start = gw->now(), now = start, cpu_start = thread_cpu_ns();
    while (b->left > 0) {
        struct bg_tube *t = bg_tube_find(e, r->match.seg[1]);
        uint64_t want = b->left < b->chunk ? b->left : b->chunk;
        uint64_t n = t ? engine_call(r, t, want, now) : 0;
        b->done += n;
        b->left -= n;
        if (n < want) b->left = 0; /* the state has no more jobs (or the tube is gone) */
        bg_time after = gw->now();
        bg_time took = after - now;
        if (took > GW_BULK_STEP_NS / 4 && b->chunk > GW_BULK_CHUNK_MIN) b->chunk /= 2;
        else if (took < GW_BULK_STEP_NS / 16 && b->chunk < GW_BULK_CHUNK_MAX) b->chunk *= 2;
        now = after;
        if (now - start >= GW_BULK_STEP_NS) break;
    }
    if (e->reply_pos > b->mark) b->mark = e->reply_pos;
    if (outer_pos > e->reply_pos) e->reply_pos = outer_pos;
    b->steps++;
    if (now - start > b->longest_step) b->longest_step = now - start;
    bg_time cpu = thread_cpu_ns() - cpu_start;
    if (cpu > b->longest_step_cpu) b->longest_step_cpu = cpu;
}

/* Arm the next step for the next loop turn. 0, or -1 (no memory). */
static int schedule(struct gw_request *r)
{
    struct gw_bulk *b = &r->bulk;
    static const struct timeval zero = {0, 0};
    return b->step_ev && evtimer_add(b->step_ev, &zero) == 0 ? 0 : -1;
}

/* The next step of a suspended bulk action: run it, then arm the next or
 * resume the request. It stops (the request resumed, b->left > 0) when the
 * client has left; the stop sequence resumed it already. */
static void step_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_request *r = arg;
    struct gateway *gw = r->gw;
    if (!r->listed || gw->stopping) return; /* resumed: its handler ends it */
    if (!gw_peer_alive(r)) {
        log_event(BG_LOG_INFO, "http_bulk_abandoned", "action=%s done=%llu left=%llu",
                  action_names[r->bulk.action], (unsigned long long)r->bulk.done,
                  (unsigned long long)r->bulk.left);
        gw_unlist(r);
        gw_wake(r);
        return;
    }
    step(r);
    if (gw->after_run) gw->after_run(gw->after_run_arg); /* kicked jobs, deadlines */
    if (r->bulk.left > 0 && schedule(r) == 0) return;
    gw_unlist(r);
    gw_wake(r);
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
    step(r);
    if (b->left == 0) return 1;
    b->step_ev = evtimer_new(r->gw->base, step_cb, r);
    if (schedule(r) != 0) { /* no memory for the next steps: answer what was done */
        gw_bulk_end(r);
        return 1;
    }
    gw_suspend(r);
    return 0;
}

void gw_bulk_end(struct gw_request *r)
{
    struct gw_bulk *b = &r->bulk;
    if (b->step_ev) event_free(b->step_ev);
    b->step_ev = NULL;
    if (b->active && b->steps)
        log_event(BG_LOG_DEBUG, "http_bulk_steps",
                  "action=%s done=%llu left=%llu steps=%u longest_step_us=%llu longest_step_cpu_us=%llu",
                  action_names[b->action], (unsigned long long)b->done, (unsigned long long)b->left, b->steps,
                  (unsigned long long)(b->longest_step / 1000), (unsigned long long)(b->longest_step_cpu / 1000));
    b->steps = 0; /* logged once */
}

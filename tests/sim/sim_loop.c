/* sim_loop.c - io/loop.h for the simulator: the clocks are simulated time
 * (sim_clock.h), so the log sees the time only the simulator moves. The
 * rest of loop.h is here for the linker's sake; the simulator drives the
 * engine itself and never runs a loop. */
#include <stdlib.h>
#include <time.h>

#include "../../io/loop.h"
#include "sim_clock.h"

static struct {
    bg_time now;
    uint64_t wall;
    struct event_base *base;
} clock_state;

void sim_clock_reset(bg_time now, uint64_t wall, struct event_base *base)
{
    clock_state.now = now;
    clock_state.wall = wall;
    clock_state.base = base;
}

void sim_clock_advance(bg_time ns)
{
    clock_state.now += ns;
    clock_state.wall += ns;
}

bg_time loop_now(void) { return clock_state.now; }
uint64_t loop_wall_now(void) { return clock_state.wall; }
struct event_base *loop_base(void) { return clock_state.base; }

int loop_init(struct bg_engine *e)
{
    (void)e;
    return 0;
}

void loop_engine_changed(void) {}
void loop_set_changed_hook(void (*fn)(void *arg), void *arg) { (void)fn, (void)arg; }

/* Nothing defers in the simulator: a task runs at once. */
void loop_defer(struct loop_task *t) { t->run(t); }
void loop_cancel(struct loop_task *t) { (void)t; }
int loop_run(void) { return 0; }
void loop_stop(void) {}
void loop_free(void) {}

/* ---- the log's timers on simulated time ---- */

#define SIM_TIMERS_MAX 16

static struct {
    struct event *ev;
    bg_time at;
} timers[SIM_TIMERS_MAX];

int __real_event_add(struct event *ev, const struct timeval *tv);
int __real_event_del(struct event *ev);
void __real_event_free(struct event *ev);

static void timer_forget(struct event *ev)
{
    for (int i = 0; i < SIM_TIMERS_MAX; i++)
        if (timers[i].ev == ev) timers[i].ev = NULL;
}

int __wrap_event_add(struct event *ev, const struct timeval *tv)
{
    if (!tv) return __real_event_add(ev, tv);
    timer_forget(ev);
    for (int i = 0; i < SIM_TIMERS_MAX; i++)
        if (!timers[i].ev) {
            timers[i].ev = ev;
            timers[i].at = clock_state.now + (bg_time)tv->tv_sec * BG_SECOND + (bg_time)tv->tv_usec * 1000;
            return 0;
        }
    abort(); /* more timers than the log has */
}

int __wrap_event_del(struct event *ev)
{
    timer_forget(ev);
    return __real_event_del(ev);
}

void __wrap_event_free(struct event *ev)
{
    timer_forget(ev);
    __real_event_free(ev);
}

bg_time sim_timers_next(void)
{
    bg_time next = UINT64_MAX;
    for (int i = 0; i < SIM_TIMERS_MAX; i++)
        if (timers[i].ev && timers[i].at < next) next = timers[i].at;
    return next;
}

int sim_timers_run(void)
{
    int ran = 0;
    for (int i = 0; i < SIM_TIMERS_MAX; i++) {
        struct event *ev = timers[i].ev;
        if (!ev || timers[i].at > clock_state.now) continue;
        timers[i].ev = NULL;
        event_callback_fn fn = event_get_callback(ev);
        fn(event_get_fd(ev), EV_TIMEOUT, event_get_callback_arg(ev));
        if (++ran == 100) break; /* a timer that re-arms itself at once */
        i = -1; /* the callback may have armed timers again */
    }
    return ran;
}

/* The log sleeps (wal_finish waiting for a retry's time) on simulated time:
 * the sleep moves the clock and returns at once (--wrap=nanosleep). */
int __wrap_nanosleep(const struct timespec *req, struct timespec *rem)
{
    (void)rem;
    sim_clock_advance((bg_time)req->tv_sec * BG_SECOND + (bg_time)req->tv_nsec);
    return 0;
}

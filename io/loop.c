/* loop.c - the event base, the clocks, the engine timer and deferred tasks
 * (see loop.h). */
#include <time.h>

#include "loop.h"

static struct {
    struct event_base *base;
    struct bg_engine *engine;
    struct event *timer;         /* armed at the engine's next deadline */
    bg_time timer_at;            /* where it is armed; UINT64_MAX: not armed */
    struct event *deferred_ev;   /* runs the deferred tasks */
    struct loop_task *head, *tail;
    void (*changed_hook)(void *arg);
    void *changed_arg;
} loop;

bg_time loop_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (bg_time)ts.tv_sec * BG_SECOND + (bg_time)ts.tv_nsec;
}

uint64_t loop_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * BG_SECOND + (uint64_t)ts.tv_nsec;
}

struct event_base *loop_base(void) { return loop.base; }

void loop_set_changed_hook(void (*fn)(void *arg), void *arg)
{
    loop.changed_hook = fn;
    loop.changed_arg = arg;
}

void loop_engine_changed(void)
{
    if (loop.changed_hook) loop.changed_hook(loop.changed_arg);
    bg_time next = bg_engine_next_deadline(loop.engine);
    if (next == loop.timer_at) return;
    loop.timer_at = next;
    if (next == UINT64_MAX) {
        event_del(loop.timer);
        return;
    }
    bg_time now = loop_now();
    bg_time wait = next > now ? next - now : 0;
    struct timeval tv = {(time_t)(wait / BG_SECOND), (suseconds_t)(wait % BG_SECOND / 1000)};
    if (wait > 0 && tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
    evtimer_add(loop.timer, &tv);
}

void loop_defer(struct loop_task *t)
{
    if (t->queued) return;
    t->queued = 1;
    t->next = NULL;
    t->prev = loop.tail;
    if (loop.tail) loop.tail->next = t; else loop.head = t;
    loop.tail = t;
    event_active(loop.deferred_ev, EV_READ, 0);
}

void loop_cancel(struct loop_task *t)
{
    if (!t->queued) return;
    if (t->prev) t->prev->next = t->next; else loop.head = t->next;
    if (t->next) t->next->prev = t->prev; else loop.tail = t->prev;
    t->prev = t->next = NULL;
    t->queued = 0;
}

/* Run every deferred task, those queued meanwhile included. */
static void run_deferred(void)
{
    struct loop_task *t;
    while ((t = loop.head)) {
        loop_cancel(t);
        t->run(t);
    }
}

static void deferred_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    run_deferred();
    loop_engine_changed();
}

/* The engine's deadline came: do what is due, then answer whoever it woke
 * in this same callback. */
static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    loop.timer_at = UINT64_MAX; /* fired: nothing armed */
    bg_engine_tick(loop.engine, loop_now());
    run_deferred();
    loop_engine_changed();
}

int loop_init(struct bg_engine *e)
{
    loop.engine = e;
    loop.timer_at = UINT64_MAX;
    loop.base = event_base_new();
    if (!loop.base) return BG_IO_ERROR;
    loop.timer = evtimer_new(loop.base, timer_cb, NULL);
    loop.deferred_ev = event_new(loop.base, -1, 0, deferred_cb, NULL);
    if (!loop.timer || !loop.deferred_ev) return BG_IO_ERROR;
    return 0;
}

int loop_run(void) { return event_base_dispatch(loop.base) < 0 ? BG_IO_ERROR : 0; }

void loop_stop(void) { event_base_loopbreak(loop.base); }

void loop_free(void)
{
    if (loop.timer) event_free(loop.timer);
    if (loop.deferred_ev) event_free(loop.deferred_ev);
    if (loop.base) event_base_free(loop.base);
    loop.timer = loop.deferred_ev = NULL;
    loop.base = NULL;
}

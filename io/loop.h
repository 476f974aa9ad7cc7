/* loop.h - the one event loop of the process, and the engine's one timer.
 *
 * The loop owns the libevent event_base, reads the clocks, keeps the engine
 * timer armed at the engine's next deadline, and runs deferred tasks (the
 * connections that got output from outside their own callback) after the
 * callback that queued them. Front-ends and io/conn.c call it; it calls no
 * front-end: whoever changes the engine calls loop_engine_changed() before
 * its callback returns.
 *
 * There is one loop per process, so these are plain functions over module
 * state (loop_init once, on the loop thread; nothing here is thread-safe).
 */
#ifndef BEANGATE_LOOP_H
#define BEANGATE_LOOP_H

#include <event2/event.h>

#include "../core/core.h"

/* Create the event base and the engine timer for engine e.
 * 0, or BG_IO_ERROR (libevent could not start). */
int loop_init(struct bg_engine *e);
/* The event base (NULL before loop_init). */
struct event_base *loop_base(void);
/* Monotonic nanoseconds: the `now` every engine call takes. */
bg_time loop_now(void);
/* Wall-clock nanoseconds since the epoch (the log, SUBMIT_JOB_EPOCH). */
uint64_t loop_wall_now(void);

/* The engine may have changed: run the changed hook (the write-ahead log
 * takes this turn's records), then re-arm the engine timer if the engine's
 * next deadline moved. Every callback that touched the engine ends with it. */
void loop_engine_changed(void);
/* Set the hook loop_engine_changed runs first (NULL: none). */
void loop_set_changed_hook(void (*fn)(void *arg), void *arg);

/* A task to run after the current callback, on the loop thread. Embed it;
 * `run` is called once per loop_defer, however often it was deferred. */
struct loop_task {
    void (*run)(struct loop_task *t);
    struct loop_task *prev, *next;
    uint8_t queued;
};
/* Queue t (a no-op if it is queued already). Tasks run in the order they
 * were queued; a task may queue others, which run in the same pass. */
void loop_defer(struct loop_task *t);
/* Take t off the queue if it is on it (its owner is going away). */
void loop_cancel(struct loop_task *t);

/* Run until loop_stop. 0, or BG_IO_ERROR. */
int loop_run(void);
/* Leave loop_run after the current callback. */
void loop_stop(void);
/* Free the timer and the event base (after loop_run returned). */
void loop_free(void);

#endif

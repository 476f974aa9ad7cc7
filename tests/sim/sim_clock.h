/* sim_clock.h - simulated time (tests/sim/sim_loop.c): the clocks io/loop.h
 * gives the log run on these instead of the machine's, and only the
 * simulator moves them. */
#ifndef BEANGATE_SIM_CLOCK_H
#define BEANGATE_SIM_CLOCK_H

#include <event2/event.h>

#include "../../core/core.h"

/* Start the clocks at `now` (monotonic) and `wall` (epoch nanoseconds),
 * with the event base loop_base() answers (NULL: none). */
void sim_clock_reset(bg_time now, uint64_t wall, struct event_base *base);
/* Move both clocks forward by ns. */
void sim_clock_advance(bg_time ns);
/* The log's sleeps (nanosleep, --wrap) move the simulated clock instead. */
/* The log's timers (evtimer_add) run on simulated time: the simulator is
 * linked with -Wl,--wrap=event_add,--wrap=event_del,--wrap=event_free, so a
 * timer is kept here and its callback is called by sim_timers_run once the
 * clock reaches it. Run every timer due by now; returns how many ran. */
int sim_timers_run(void);
/* The earliest timer's time, or UINT64_MAX if none is armed. */
bg_time sim_timers_next(void);

#endif

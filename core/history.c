/* history.c - the server's last minutes (GET /stats/history) and each
 * tube's put and delete rates (GET /tubes/{tube}, GET /stats/tubes).
 *
 * The history is a ring of BG_HISTORY_SAMPLES samples, one per monotonic
 * second, in memory fixed when it is made. A tube's rates come from its
 * counters and the times the last two tube sweeps noted them. A sweep
 * starts every BG_HISTORY_SWEEP_S seconds and goes over all tubes in steps
 * of BG_HISTORY_SWEEP_STEP, one a loop turn: 28 bytes a tube, and nothing
 * on the path of a put or a delete. Pure: time is a parameter.
 *
 * A sweep walks tube_list from its end down to slot 0. The engine appends
 * a tube it makes (above the walk: the next sweep notes it) and frees one
 * by moving the list's last tube into its slot: below the walk that is a
 * tube already noted or made since (noted now: no harm) or the walk's next
 * one; above, nothing the walk still has to visit. So every tube alive at
 * the start is visited, and a tube's `sweep` says whether it was noted. */
#include <string.h>

#include "core.h"

const char *const bg_history_series_names[BG_HISTORY_SERIES] = {
    "put", "reserve", "delete", "ready", "reserved", "delayed", "buried", "connections",
};

void bg_history_init(struct bg_history *h, const struct bg_history_reading *r, bg_time now)
{
    memset(h, 0, sizeof *h);
    h->second = now / BG_SECOND;
    memcpy(h->totals, r->v, sizeof h->totals);
    h->newest = BG_HISTORY_SAMPLES - 1; /* the first sample goes to slot 0 */
}

uint32_t bg_history_sample(struct bg_history *h, const struct bg_history_reading *r, bg_time now)
{
    uint64_t second = now / BG_SECOND;
    if (second <= h->second) return 0;
    uint64_t gap = second - h->second;
    /* only the newest BG_HISTORY_SAMPLES seconds of a longer gap are kept */
    uint64_t first = gap > BG_HISTORY_SAMPLES ? gap - BG_HISTORY_SAMPLES + 1 : 1;
    uint64_t growth[BG_HISTORY_COUNTERS];
    for (int c = 0; c < BG_HISTORY_COUNTERS; c++) {
        growth[c] = r->v[c] - h->totals[c]; /* modulo 2^64: right across a wrap */
        h->totals[c] = r->v[c];
    }
    for (uint64_t i = first; i <= gap; i++) { /* second h->second + i */
        h->newest = (h->newest + 1) % BG_HISTORY_SAMPLES;
        uint64_t *slot = h->ring[h->newest];
        for (int c = 0; c < BG_HISTORY_COUNTERS; c++) {
            /* gap shares of growth/gap; the last growth%gap seconds get one more */
            uint64_t share = growth[c] / gap, extra = growth[c] % gap;
            slot[c] = share + (i > gap - extra ? 1 : 0);
        }
        for (int s = BG_HISTORY_COUNTERS; s < BG_HISTORY_SERIES; s++) slot[s] = r->v[s];
        if (h->count < BG_HISTORY_SAMPLES) h->count++;
    }
    h->second = second;
    return (uint32_t)(gap - first + 1);
}

uint32_t bg_history_series(const struct bg_history *h, enum bg_history_series s, uint64_t *out)
{
    uint32_t oldest = (h->newest + BG_HISTORY_SAMPLES + 1 - h->count) % BG_HISTORY_SAMPLES;
    for (uint32_t i = 0; i < h->count; i++) out[i] = h->ring[(oldest + i) % BG_HISTORY_SAMPLES][s];
    return h->count;
}

void bg_history_read_engine(const struct bg_engine *e, uint64_t other_connections,
                            struct bg_history_reading *out)
{
    out->v[BG_HISTORY_PUT] = e->stat.total_jobs;
    out->v[BG_HISTORY_RESERVE] = e->stat.total_jobs_reserved;
    out->v[BG_HISTORY_DELETE] = e->stat.total_jobs_deleted;
    out->v[BG_HISTORY_READY] = e->ready_count;
    out->v[BG_HISTORY_RESERVED] = e->reserved_count;
    out->v[BG_HISTORY_DELAYED] = e->delayed_count;
    out->v[BG_HISTORY_BURIED] = e->buried_count;
    out->v[BG_HISTORY_CONNECTIONS] = e->connections + other_connections;
}

/* Microseconds from `from` to `to` (to >= from), UINT32_MAX at most (71
 * minutes: a sweep longer than that gives wrong rates). */
static uint32_t us_between(bg_time from, bg_time to)
{
    bg_time us = (to - from) / 1000;
    return us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

/* Start sweep number h->sweep + 1 at now over e's tubes. */
static void sweep_start(struct bg_history *h, const struct bg_engine *e, bg_time now)
{
    if (++h->sweep == 0) h->sweep = 1; /* 0 means "never swept" (after 680 years) */
    h->sweep_at[h->sweep & 3] = now;
    if (h->sweep == 1) { /* sweep 0: the quiet BG_HISTORY_SWEEP_S seconds before */
        const bg_time before = (bg_time)BG_HISTORY_SWEEP_S * BG_SECOND;
        h->sweep_at[0] = now > before ? now - before : 0;
    }
    h->sweep_left = e->tube_count;
}

/* Note tube t's counters at now, in the sweep under way (started at start). */
static void note_tube(const struct bg_history *h, struct bg_tube *t, bg_time start, bg_time now)
{
    struct bg_tube_rate_marks *m = &t->rate_marks;
    uint32_t put = (uint32_t)t->stat.total_jobs, del = (uint32_t)t->stat.cmd_delete;
    uint32_t at = us_between(start, now);
    if (m->sweep != 0 && m->sweep == h->sweep - 1) { /* noted by the sweep before */
        m->put[0] = m->put[1];
        m->del[0] = m->del[1];
        m->at_us[0] = m->at_us[1];
    } else if (h->sweep == 1) { /* as if nothing changed in the seconds before */
        m->put[0] = put;
        m->del[0] = del;
        m->at_us[0] = at; /* now - BG_HISTORY_SWEEP_S, after sweep 0's start */
    } else { /* made since the sweep before started: it had done nothing then */
        m->put[0] = m->del[0] = 0;
        m->at_us[0] = 0;
    }
    m->put[1] = put;
    m->del[1] = del;
    m->at_us[1] = at;
    m->sweep = h->sweep;
}

int bg_history_sweep_tubes(struct bg_history *h, struct bg_engine *e, bg_time now)
{
    if (h->sweep_left == 0) {
        if (h->sweep != 0 && now / BG_SECOND < h->sweep_at[h->sweep & 3] / BG_SECOND + BG_HISTORY_SWEEP_S)
            return 0;
        sweep_start(h, e, now);
    }
    if (h->sweep_left > e->tube_count) h->sweep_left = e->tube_count; /* tubes freed since */
    bg_time start = h->sweep_at[h->sweep & 3];
    uint32_t end = h->sweep_left > BG_HISTORY_SWEEP_STEP ? h->sweep_left - BG_HISTORY_SWEEP_STEP : 0;
    while (h->sweep_left > end) {
        struct bg_tube *t = e->tube_list[--h->sweep_left];
        /* one moved here from the end after this sweep noted it keeps its marks */
        if (t->rate_marks.sweep != h->sweep) note_tube(h, t, start, now);
    }
    return 1;
}

int bg_history_sweeping(const struct bg_history *h)
{
    return h->sweep_left != 0;
}

void bg_tube_rates(const struct bg_history *h, const struct bg_tube *t, bg_time now,
                   double *put, double *del)
{
    *put = *del = 0;
    const struct bg_tube_rate_marks *m = &t->rate_marks;
    bg_time since;
    uint32_t puts = (uint32_t)t->stat.total_jobs, dels = (uint32_t)t->stat.cmd_delete;
    if (m->sweep != 0) { /* since its mark [0] */
        since = h->sweep_at[(m->sweep - 1) & 3] + (bg_time)m->at_us[0] * 1000;
        /* low 32 bits, modulo 2^32: right while a tube does fewer than 2^32 in 10 s */
        puts -= m->put[0];
        dels -= m->del[0];
    } else if (h->sweep >= 2 || (h->sweep == 1 && h->sweep_left == 0)) {
        /* not noted yet, so made after the sweep before the latest started
         * (every tube alive at a sweep's start is noted before the next
         * starts), with nothing before */
        since = h->sweep_at[(h->sweep - 1) & 3];
    } else {
        return; /* no sweep yet, or the first has not come to it */
    }
    if (now <= since) return;
    double seconds = (double)(now - since) / (double)BG_SECOND;
    *put = puts / seconds;
    *del = dels / seconds;
}

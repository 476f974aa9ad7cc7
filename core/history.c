/* history.c - the server's last minutes (GET /stats/history) and each
 * tube's put and delete rates (GET /tubes/{tube}, GET /stats/tubes).
 *
 * The history is a ring of BG_HISTORY_SAMPLES samples, one per monotonic
 * second, in memory fixed when it is made. A tube's rates come from its
 * counters noted at the last two tube sweeps, which run every
 * BG_HISTORY_SWEEP_S seconds over all tubes: 20 bytes a tube, and nothing
 * on the path of a put or a delete. Pure: time is a parameter. */
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

int bg_history_sweep_tubes(struct bg_history *h, struct bg_engine *e, bg_time now)
{
    int first = h->sweep == 0;
    if (!first && now / BG_SECOND < h->sweep_at[h->sweep & 1] / BG_SECOND + BG_HISTORY_SWEEP_S)
        return 0;
    uint32_t previous = h->sweep++;
    if (h->sweep == 0) h->sweep = 1; /* 0 means "never swept" (after 680 years) */
    h->sweep_at[h->sweep & 1] = now;
    if (first) {
        const bg_time before = (bg_time)BG_HISTORY_SWEEP_S * BG_SECOND;
        h->sweep_at[(h->sweep - 1) & 1] = now > before ? now - before : 0;
    }
    for (uint32_t i = 0; i < e->tube_count; i++) {
        struct bg_tube *t = e->tube_list[i];
        struct bg_tube_rate_marks *m = &t->rate_marks;
        uint32_t put = (uint32_t)t->stat.total_jobs, del = (uint32_t)t->stat.cmd_delete;
        if (first) { /* as if nothing changed in the seconds before */
            m->put[0] = put;
            m->del[0] = del;
        } else if (m->sweep == previous) {
            m->put[0] = m->put[1];
            m->del[0] = m->del[1];
        } else { /* made since the last sweep: it had done nothing before */
            m->put[0] = m->del[0] = 0;
        }
        m->put[1] = put;
        m->del[1] = del;
        m->sweep = h->sweep;
    }
    return 1;
}

void bg_tube_rates(const struct bg_history *h, const struct bg_tube *t, bg_time now,
                   double *put, double *del)
{
    *put = *del = 0;
    if (h->sweep == 0) return;
    bg_time since = h->sweep_at[(h->sweep - 1) & 1];
    if (now <= since) return;
    const struct bg_tube_rate_marks *m = &t->rate_marks;
    int seen = m->sweep == h->sweep; /* else made since the latest sweep: 0 before */
    /* low 32 bits, modulo 2^32: right while a tube does fewer than 2^32 in 10 s */
    uint32_t puts = (uint32_t)t->stat.total_jobs - (seen ? m->put[0] : 0);
    uint32_t dels = (uint32_t)t->stat.cmd_delete - (seen ? m->del[0] : 0);
    double seconds = (double)(now - since) / (double)BG_SECOND;
    *put = puts / seconds;
    *del = dels / seconds;
}

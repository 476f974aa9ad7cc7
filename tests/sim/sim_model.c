/* sim_model.c - the simulator's expectations (sim_model.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_model.h"

void model_init(struct model *m) { memset(m, 0, sizeof *m); }

void model_free(struct model *m)
{
    free(m->base);
    free(m->log);
    memset(m, 0, sizeof *m);
}

uint64_t model_body_hash(const char *body, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)body[i]) * 0x100000001b3ull;
    return h;
}

/* Room for ids up to id in an expect array. */
static struct expect *expect_room(struct expect *a, size_t *cap, uint64_t id)
{
    if (id < *cap) return a;
    size_t n = *cap ? *cap : 256;
    while (n <= id) n *= 2;
    a = realloc(a, n * sizeof *a);
    if (!a) abort();
    memset(a + *cap, 0, (n - *cap) * sizeof *a);
    *cap = n;
    return a;
}

size_t model_note(struct model *m, const struct change *c)
{
    if (m->nlog == m->log_cap) {
        m->log_cap = m->log_cap ? m->log_cap * 2 : 1024;
        m->log = realloc(m->log, m->log_cap * sizeof *m->log);
        if (!m->log) abort();
    }
    m->log[m->nlog] = *c;
    m->log[m->nlog].acked = 0;
    m->log[m->nlog].has_mark = 0;
    if (c->kind == CH_PUT && c->id > m->max_known) m->max_known = c->id;
    return m->nlog++;
}

void model_set_mark(struct model *m, size_t from, uint64_t mark)
{
    for (size_t i = from; i < m->nlog; i++)
        if (!m->log[i].has_mark) {
            m->log[i].mark = mark;
            m->log[i].has_mark = 1;
        }
}

void model_ack(struct model *m, int (*may_go)(void *ctx, uint64_t mark), void *ctx)
{
    for (size_t i = 0; i < m->nlog; i++) {
        struct change *c = &m->log[i];
        if (c->acked || !c->has_mark || c->mark == MODEL_NO_REPLY || !may_go(ctx, c->mark)) continue;
        c->acked = 1;
        if (c->kind == CH_SHOWN && c->id > m->max_shown) m->max_shown = c->id;
    }
}

/* The expectations now: the base with the change log applied. */
static struct expect *expectations(const struct model *m, size_t *cap)
{
    *cap = m->base_cap;
    struct expect *x = malloc((*cap ? *cap : 1) * sizeof *x);
    if (!x) abort();
    if (*cap) memcpy(x, m->base, *cap * sizeof *x);
    for (size_t i = 0; i < m->nlog; i++) {
        const struct change *c = &m->log[i];
        if (c->kind == CH_SHOWN) continue;
        x = expect_room(x, cap, c->id);
        struct expect *e = &x[c->id];
        if (c->kind == CH_PUT) {
            e->known = 1;
            e->body_hash = c->body_hash;
            e->body_len = c->body_len;
            memcpy(e->tube, c->tube, sizeof e->tube);
        }
        if (c->acked) { /* everything before it is on disk too */
            e->acked = 1;
            e->present = c->kind != CH_DELETE;
            e->buried = c->state == BG_JOB_BURIED;
            e->pri = c->pri;
            e->later_delete = 0;
            e->later_count = 0;
            continue;
        }
        if (c->kind == CH_DELETE) e->later_delete = 1;
        else if (e->later_count < sizeof e->later_pri / sizeof e->later_pri[0]) e->later_pri[e->later_count] = c->pri;
        if (e->later_count < 255) e->later_count++;
    }
    return x;
}

static int pri_allowed(const struct expect *e, uint32_t pri)
{
    if (!e->acked || e->pri == pri) return 1;
    size_t n = sizeof e->later_pri / sizeof e->later_pri[0];
    if (e->later_count > n) return 1; /* too many to know */
    for (size_t i = 0; i < e->later_count; i++)
        if (e->later_pri[i] == pri) return 1;
    return 0;
}

int model_check(struct model *m, struct bg_engine *e, char *why, size_t why_size)
{
    size_t cap;
    struct expect *x = expectations(m, &cap);
    int bad = 0;
    size_t n = e->job_count;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    bg_engine_job_ids(e, ids);
    for (size_t i = 0; i < n && !bad; i++) {
        uint64_t id = ids[i];
        struct bg_job *j = bg_job_find(e, id);
        const struct expect *ex = id < cap ? &x[id] : NULL;
        if (!ex || !ex->known) {
            snprintf(why, why_size, "job %llu is there, but no put of this run made it", (unsigned long long)id);
            bad = 1;
        } else if (ex->acked && !ex->present) {
            snprintf(why, why_size, "job %llu is back, but its delete was acknowledged", (unsigned long long)id);
            bad = 1;
        } else if (model_body_hash(j->body, j->body_size) != ex->body_hash || j->body_size != ex->body_len) {
            snprintf(why, why_size, "job %llu has another body (%u bytes, expected %u)", (unsigned long long)id,
                     j->body_size, ex->body_len);
            bad = 1;
        } else if (strncmp(j->tube->name, ex->tube, sizeof ex->tube) != 0) {
            snprintf(why, why_size, "job %llu is in tube %s, expected %s", (unsigned long long)id, j->tube->name,
                     ex->tube);
            bad = 1;
        } else if (!pri_allowed(ex, j->pri)) {
            snprintf(why, why_size, "job %llu has priority %u, acknowledged %u", (unsigned long long)id, j->pri,
                     ex->pri);
            bad = 1;
        } else if (ex->acked && !ex->later_count && ex->buried != (j->state == BG_JOB_BURIED)) {
            snprintf(why, why_size, "job %llu is %sburied, acknowledged %sburied", (unsigned long long)id,
                     j->state == BG_JOB_BURIED ? "" : "not ", ex->buried ? "" : "not ");
            bad = 1;
        }
    }
    for (uint64_t id = 1; id < cap && !bad; id++) {
        const struct expect *ex = &x[id];
        if (ex->acked && ex->present && !ex->later_delete && !bg_job_find(e, id)) {
            snprintf(why, why_size, "job %llu is lost: its put%s was acknowledged", (unsigned long long)id,
                     ex->later_count ? " (or a later change)" : "");
            bad = 1;
        }
    }
    if (!bad && e->next_id <= m->max_shown) {
        snprintf(why, why_size, "id reuse: the next id is %llu, but a reply showed id %llu",
                 (unsigned long long)e->next_id, (unsigned long long)m->max_shown);
        bad = 1;
    }
    free(ids);
    free(x);
    return bad ? -1 : 0;
}

void model_rebase(struct model *m, struct bg_engine *e)
{
    size_t cap;
    struct expect *x = expectations(m, &cap);
    /* what is gone now stays gone: as if its delete was acknowledged */
    for (size_t id = 1; id < cap; id++) {
        if (id >= e->next_id) { /* never shown, never on disk: given out again */
            memset(&x[id], 0, sizeof x[id]);
            continue;
        }
        if (!x[id].known) continue;
        x[id].acked = 1;
        x[id].present = 0;
        x[id].later_count = 0;
        x[id].later_delete = 0;
    }
    size_t n = e->job_count;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    bg_engine_job_ids(e, ids);
    for (size_t i = 0; i < n; i++) {
        struct bg_job *j = bg_job_find(e, ids[i]);
        x = expect_room(x, &cap, j->id);
        struct expect *ex = &x[j->id];
        memset(ex, 0, sizeof *ex);
        ex->known = ex->acked = ex->present = 1;
        ex->buried = j->state == BG_JOB_BURIED;
        ex->pri = j->pri;
        ex->body_hash = model_body_hash(j->body, j->body_size);
        ex->body_len = j->body_size;
        snprintf(ex->tube, sizeof ex->tube, "%s", j->tube->name);
        if (j->id > m->max_known) m->max_known = j->id;
    }
    free(ids);
    free(m->base);
    m->base = x;
    m->base_cap = cap;
    m->nlog = 0;
}

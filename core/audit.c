/* audit.c - the engine's structure, checked from scratch (for fuzzers and
 * tests; it walks everything, so never on a hot path). */
#include <stddef.h>

#include "core.h"

#define CHECK(cond, what)      \
    do {                       \
        if (!(cond)) {         \
            *broken = (what);  \
            return BG_INTERNAL_ERROR; \
        }                      \
    } while (0)

/* Every job of heap h records its slot, and none comes before its parent
 * in the heap's own order. */
static int heap_sound(const struct bg_heap *h, size_t slot_offset, const char **broken)
{
    CHECK(h->len <= h->cap, "a heap holds more than its room");
    for (uint32_t i = 0; i < h->len; i++) {
        const void *item = h->items[i];
        CHECK(*(const uint32_t *)((const char *)item + slot_offset) == i, "a heap item's slot is wrong");
        CHECK(i == 0 || !h->less(item, h->items[(i - 1) / 2]), "a heap item comes before its parent");
    }
    return 0;
}

/* What an index of tube t for jobs in `state` may hold. */
struct index_visit {
    const struct bg_tube *tube;
    enum bg_job_state state;
};

/* A job of an index belongs there: its tube and state, and for a buried
 * job a burial number the tube gave out. */
static int in_state_of_tube(const struct bg_job *j, void *arg)
{
    const struct index_visit *v = arg;
    if (j->tube != v->tube || j->state != v->state) return BG_INTERNAL_ERROR;
    if (j->state == BG_JOB_BURIED && (j->more->deadline_at < 1 || j->more->deadline_at > v->tube->burials))
        return BG_INTERNAL_ERROR;
    return 0;
}

/* Counts one tube's jobs by state, from the job table. */
struct state_counts {
    uint64_t by_state[BG_JOB_BURIED + 1], urgent;
};

int bg_engine_audit(const struct bg_engine *e, const char **broken)
{
    static const char *none = "";
    *broken = none;
    struct state_counts total = {{0}, 0};
    uint64_t jobs = 0, memory = 0;
    for (size_t b = 0; b <= e->jobs_mask; b++) {
        const struct bg_job *j = e->jobs[b];
        if (!j) continue;
        jobs++;
        CHECK(bg_job_find(e, j->id) == j, "a job the id table cannot find (probe order broken)");
        memory += BG_JOB_MEMORY(j->body_size) + (j->more ? BG_JOB_MORE_MEMORY : 0);
        CHECK(j->id < e->next_id, "a job id was never given out");
        CHECK(bg_shard_of_id(j->id, e->shard_count) == e->shard_index,
              "a job id of another shard's class");
        CHECK(j->state <= BG_JOB_BURIED, "a job in no state");
        CHECK(j->tube->list_index < e->tube_count && e->tube_list[j->tube->list_index] == j->tube,
              "a job's tube is not in the tube list");
        /* a job that was reserved, delayed or buried has a side record,
         * which points back at it */
        CHECK(j->state == BG_JOB_READY || j->more, "a job that is not ready has no side record");
        CHECK(!j->more || j->more->job == j, "a side record points at another job");
        CHECK((j->state == BG_JOB_RESERVED) == (bg_job_reserver(j) != NULL), "a job's reserver does not fit its state");
        total.by_state[j->state]++;
        if (j->state == BG_JOB_READY && j->pri < BG_URGENT_PRIORITY) total.urgent++;
    }
    CHECK(jobs == e->job_count, "job_count is not the number of jobs");
    CHECK(e->job_count < e->jobs_mask + 1, "the id table has no empty slot");
    CHECK(e->shard_count >= 1 && e->shard_index < e->shard_count &&
              bg_shard_of_id(e->next_id, e->shard_count) == e->shard_index,
          "the next id is not of this shard's class");
    /* jobs whose body is still arriving count too, so at least the table's */
    CHECK(e->job_memory >= memory, "job_memory is below what the jobs hold");
    CHECK(e->ready_count == total.by_state[BG_JOB_READY], "ready_count is off");
    CHECK(e->delayed_count == total.by_state[BG_JOB_DELAYED], "delayed_count is off");
    CHECK(e->reserved_count == total.by_state[BG_JOB_RESERVED], "reserved_count is off");
    CHECK(e->buried_count == total.by_state[BG_JOB_BURIED], "buried_count is off");
    CHECK(e->urgent_count == total.urgent, "urgent_count is off");

    uint64_t ready = 0, delayed = 0, reserved = 0, buried = 0, paused = 0;
    for (uint32_t i = 0; i < e->tube_count; i++) {
        const struct bg_tube *t = e->tube_list[i];
        CHECK(t->list_index == i, "a tube's list index is wrong");
        CHECK(bg_tube_find((struct bg_engine *)e, t->name) == t, "a tube is not found by its name");
        for (int st = BG_JOB_READY; st <= BG_JOB_BURIED; st++) {
            struct index_visit v = {t, (enum bg_job_state)st};
            if (bg_tree_audit(bg_tube_index(t, v.state), in_state_of_tube, &v, broken) != 0)
                return BG_INTERNAL_ERROR;
        }
        const struct bg_job *top = t->pause_ns ? NULL : bg_tree_first(&t->ready);
        CHECK(t->ready_top_id == (top ? top->id : UINT64_MAX), "a tube's cached top is stale");
        /* the matching invariant: a ready job and a waiter never meet in an
         * unpaused tube */
        CHECK(t->pause_ns || !(t->ready.len && t->waiting_len), "an unpaused tube has a ready job and a waiter");
        for (uint32_t k = 0; k < t->waiting_len; k++)
            CHECK(t->waiting[k]->wait_index == k && t->waiting[k]->client->waiting, "a waiting set entry is stale");
        ready += t->ready.len;
        delayed += t->delayed.len;
        reserved += t->reserved.len;
        buried += t->buried.len;
        paused += t->pause_ns != 0;
    }
    CHECK(ready == e->ready_count && delayed == e->delayed_count, "tube indexes disagree with the counts");
    CHECK(reserved == e->reserved_count && buried == e->buried_count, "tube counts disagree with the engine's");
    CHECK(e->job_timers.len == delayed + reserved, "a delayed or reserved job is not on the timer heap");
    CHECK(e->tube_timers.len == paused, "a paused tube is not on the timer heap");
    uint32_t spares = 0;
    for (const struct bg_job_more *m = e->free_more; m && spares <= e->free_more_count; m = m->left) spares++;
    CHECK(spares == e->free_more_count, "free_more_count is not the number of spare side records");
    if (heap_sound(&e->job_timers, offsetof(struct bg_job_more, timer_slot), broken) ||
        heap_sound(&e->tube_timers, offsetof(struct bg_tube, timer_slot), broken) ||
        heap_sound(&e->client_timers, offsetof(struct bg_client, timer_slot), broken))
        return BG_INTERNAL_ERROR;
    CHECK(e->due_at <= bg_engine_next_deadline(e), "due_at is later than a deadline");
    return 0;
}

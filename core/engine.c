/* engine.c - jobs, tubes, clients and time: the queue itself.
 *
 * Invariant kept after every entry point: no unpaused tube has both a ready
 * job and a waiting client. So when a job becomes ready, only its own tube
 * needs matching (dispatch), and nothing ever scans all tubes.
 *
 * Time: every entry point that takes `now` first does whatever fell due by
 * `now` (bg_engine_catch_up), so its answer is the same whether or not the
 * loop's timer ran bg_engine_tick before it (see core.h, "Time").
 */
#include <string.h>

#include "core.h"

#define NO_SLOT UINT32_MAX
#define NEVER UINT64_MAX

/* ---- ordering functions for the heaps ---------------------------------- */

/* Side records (delayed and reserved jobs) by (deadline, id). */
static int job_deadline_less(const void *a, const void *b)
{
    const struct bg_job_more *x = a, *y = b;
    if (x->deadline_at != y->deadline_at) return x->deadline_at < y->deadline_at;
    return x->job->id < y->job->id;
}

static int tube_unpause_less(const void *a, const void *b)
{
    return ((const struct bg_tube *)a)->unpause_at < ((const struct bg_tube *)b)->unpause_at;
}

static int client_wake_less(const void *a, const void *b)
{
    return ((const struct bg_client *)a)->wake_at < ((const struct bg_client *)b)->wake_at;
}

/* docs/operations.md gives what a job counts against --max-job-memory */
_Static_assert(sizeof(struct bg_job) == 64, "a job's core record is 64 bytes (docs/operations.md)");
_Static_assert(sizeof(struct bg_job_more) == 80, "a job's side record is 80 bytes (docs/operations.md)");

/* A job's memory from bg_job_alloc, counted in e->job_memory; NULL: none. */
static struct bg_job *job_mem_alloc(struct bg_engine *e, uint32_t body_size)
{
    struct bg_job *j = bg_job_alloc(BG_JOB_MEMORY(body_size));
    if (j) e->job_memory += BG_JOB_MEMORY(body_size);
    return j;
}

/* ---- side records (struct bg_job_more) ---------------------------------- */

/* Side records kept for reuse at most (the spare and the ones of deleted
 * jobs). */
#define FREE_MORE_MAX 1024

/* Make sure a spare side record is at hand: 0 or BG_OUT_OF_MEMORY. Side
 * records come from the job allocator (a slab slot of 80 bytes, no
 * header). */
static int more_spare(struct bg_engine *e)
{
    if (e->free_more) return 0;
    struct bg_job_more *m = bg_job_alloc(sizeof *m);
    if (!m) return BG_OUT_OF_MEMORY;
    m->left = NULL;
    e->free_more = m;
    e->free_more_count++;
    return 0;
}

/* Give j (without one) the spare side record, counted in job_memory but
 * never refused for the ceiling. A spare exists (more_spare). */
static struct bg_job_more *more_attach(struct bg_engine *e, struct bg_job *j)
{
    struct bg_job_more *m = e->free_more;
    e->free_more = m->left;
    e->free_more_count--;
    memset(m, 0, sizeof *m);
    m->job = j;
    m->timer_slot = m->reserver_slot = NO_SLOT;
    j->more = m;
    e->job_memory += BG_JOB_MORE_MEMORY;
    return m;
}

/* j's side record, made now if it has none: NULL if out of memory. */
static struct bg_job_more *more_of(struct bg_engine *e, struct bg_job *j)
{
    if (j->more) return j->more;
    return more_spare(e) == 0 ? more_attach(e, j) : NULL;
}

/* Give a job's memory back, its side record's too (it came from
 * job_mem_alloc). */
static inline void job_mem_free(struct bg_engine *e, struct bg_job *j)
{
    struct bg_job_more *m = j->more;
    if (m) {
        e->job_memory -= BG_JOB_MORE_MEMORY;
        if (e->free_more_count >= FREE_MORE_MAX) {
            bg_job_free_sized(m, sizeof *m);
        } else {
            m->left = e->free_more;
            e->free_more = m;
            e->free_more_count++;
        }
    }
    e->job_memory -= BG_JOB_MEMORY(j->body_size);
    bg_job_free_sized(j, BG_JOB_MEMORY(j->body_size));
}

/* now + s seconds, saturating instead of wrapping. */
static bg_time add_seconds(bg_time now, uint64_t s)
{
    if (s > (NEVER - now) / BG_SECOND) return NEVER - 1;
    return now + s * BG_SECOND;
}

/* ---- the timer heaps ---------------------------------------------------- */

/* Push onto one of the engine's three timer heaps an item due at `at`, and
 * keep due_at a lower bound of every deadline. 0 or BG_OUT_OF_MEMORY. */
static int timer_push(struct bg_engine *e, struct bg_heap *h, void *item, bg_time at)
{
    if (bg_heap_push(h, item) != 0) return BG_OUT_OF_MEMORY;
    if (at < e->due_at) e->due_at = at;
    return 0;
}

static inline int job_timer_push(struct bg_engine *e, struct bg_job_more *m)
{
    return timer_push(e, &e->job_timers, m, m->deadline_at);
}

/* ---- job table --------------------------------------------------------- */

/* The id table is open addressing with Robin Hood linear probing over
 * pointers: a job carries no link, and a slot costs 8 bytes. A job's home
 * slot is about its id's ordinal in the shard's class (id / shard_count,
 * as a multiply by jobs_scale = 2^64 / shard_count: no divide), masked.
 * Ids are handed out in order and jobs mostly leave in about that order, so
 * the live jobs fill consecutive slots: a put writes the slot next to the
 * previous one, a find hits its home, and a fresh table's pages are
 * touched only as ids reach them (grown tables come from calloc). Robin Hood order
 * (along a run of occupied slots the homes never decrease, cyclically) lets
 * a find stop at the first job that is nearer its home than the probe is,
 * and a removal stop at the first job that sits at its home. The table
 * grows at 7/8 full; it always keeps an empty slot (job_table_room). */
static inline size_t id_home(const struct bg_engine *e, uint64_t id)
{
    uint64_t ordinal = (uint64_t)(((unsigned __int128)id * e->jobs_scale) >> 64);
    return (size_t)ordinal & e->jobs_mask;
}

/* How far slot i is past the home of the job in it. */
static inline size_t probe_distance(const struct bg_engine *e, size_t i, const struct bg_job *j)
{
    return (i - id_home(e, j->id)) & e->jobs_mask;
}

struct bg_job *bg_job_find(const struct bg_engine *e, uint64_t id)
{
    size_t i = id_home(e, id);
    for (size_t d = 0;; d++, i = (i + 1) & e->jobs_mask) {
        struct bg_job *j = e->jobs[i];
        if (!j || probe_distance(e, i, j) < d) return NULL;
        if (j->id == id) return j;
    }
}

size_t bg_engine_job_ids(const struct bg_engine *e, uint64_t *ids)
{
    size_t n = 0;
    for (size_t b = 0; b <= e->jobs_mask; b++)
        if (e->jobs[b]) ids[n++] = e->jobs[b]->id;
    return n;
}

/* Put j into the table (which has an empty slot), Robin Hood order. */
static void job_table_place(struct bg_engine *e, struct bg_job *j)
{
    size_t i = id_home(e, j->id);
    for (size_t d = 0;; d++, i = (i + 1) & e->jobs_mask) {
        struct bg_job *cur = e->jobs[i];
        if (!cur) {
            e->jobs[i] = j;
            return;
        }
        size_t cur_d = probe_distance(e, i, cur);
        if (cur_d < d) { /* cur is nearer home than j: j takes its slot */
            e->jobs[i] = j;
            j = cur;
            d = cur_d;
        }
    }
}

/* Double the job table (and adopt the shard count's scale); on allocation
 * failure keep the old one. */
static int job_table_grow(struct bg_engine *e)
{
    size_t n = (e->jobs_mask + 1) * 2;
    struct bg_job **old = e->jobs;
    size_t old_n = e->jobs_mask + 1;
    struct bg_job **t = bg_calloc(n, sizeof *t);
    if (!t) return BG_OUT_OF_MEMORY;
    e->jobs = t;
    e->jobs_mask = n - 1;
    e->jobs_scale = UINT64_MAX / e->shard_count;
    for (size_t i = 0; i < old_n; i++)
        if (old[i]) job_table_place(e, old[i]);
    bg_free(old);
    return 0;
}

/* Make sure one more job leaves the table an empty slot: 0, or
 * BG_OUT_OF_MEMORY if that needs a bigger table and there is no memory. */
static int job_table_room(struct bg_engine *e)
{
    if (e->job_count + 2 <= e->jobs_mask + 1) return 0;
    return job_table_grow(e);
}

/* Enter j into tube t (a reference) and the job table (job_table_room
 * was asked first). */
static void job_table_insert(struct bg_engine *e, struct bg_job *j, struct bg_tube *t)
{
    j->tube = t;
    t->refs++; /* the job's reference to its tube */
    job_table_place(e, j);
    /* past 7/8 full, grow; if that fails the table still has room */
    if (++e->job_count > (e->jobs_mask + 1) / 8 * 7) job_table_grow(e);
}

/* Take j out of the table; the jobs after it that are past their home
 * move back one slot. */
static void job_table_remove(struct bg_engine *e, struct bg_job *j)
{
    size_t i = id_home(e, j->id);
    while (e->jobs[i] != j) i = (i + 1) & e->jobs_mask;
    for (;;) {
        size_t next = (i + 1) & e->jobs_mask;
        struct bg_job *k = e->jobs[next];
        if (!k || probe_distance(e, next, k) == 0) break;
        e->jobs[i] = k;
        i = next;
    }
    e->jobs[i] = NULL;
    e->job_count--;
}

/* ---- tubes ------------------------------------------------------------- */

/* Tube names are chosen by clients: the table is hashed under the key the
 * engine was given, so nobody can pick names that share a bucket. */
static size_t name_bucket(const struct bg_engine *e, const char *name)
{
    return (size_t)bg_siphash(e->hash_key, name, strlen(name)) & e->tubes_mask;
}

int bg_tube_name_char(char ch)
{
    static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                             "0123456789-+/;.$_()";
    return ch && memchr(ok, ch, sizeof ok - 1) != NULL;
}

int bg_tube_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > BG_TUBE_NAME_MAX || name[0] == '-') return 0;
    for (size_t i = 0; i < len; i++)
        if (!bg_tube_name_char(name[i])) return 0;
    return 1;
}

struct bg_tube *bg_tube_find(struct bg_engine *e, const char *name)
{
    struct bg_tube *t = e->tubes[name_bucket(e, name)];
    while (t && strcmp(t->name, name) != 0) t = t->hash_next;
    return t;
}

static void tube_table_grow(struct bg_engine *e)
{
    size_t n = (e->tubes_mask + 1) * 2;
    struct bg_tube **t = bg_malloc(n * sizeof *t);
    if (!t) return;
    memset(t, 0, n * sizeof *t);
    bg_free(e->tubes);
    e->tubes = t;
    e->tubes_mask = n - 1;
    for (uint32_t i = 0; i < e->tube_count; i++) {
        struct bg_tube *tube = e->tube_list[i];
        size_t b = name_bucket(e, tube->name);
        tube->hash_next = t[b];
        t[b] = tube;
    }
}

/* Find or create tube `name` (valid, NUL-terminated). NULL: out of memory. */
static struct bg_tube *tube_get(struct bg_engine *e, const char *name)
{
    struct bg_tube *t = bg_tube_find(e, name);
    if (t) return t;
    if (e->tube_count == e->tube_list_cap) {
        uint32_t cap = e->tube_list_cap ? e->tube_list_cap * 2 : 16;
        struct bg_tube **list = bg_realloc(e->tube_list, cap * sizeof *list);
        if (!list) return NULL;
        e->tube_list = list;
        e->tube_list_cap = cap;
    }
    t = bg_malloc(sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    strncpy(t->name, name, BG_TUBE_NAME_MAX);
    t->timer_slot = NO_SLOT;
    t->ready_top_pri = UINT32_MAX;
    t->ready_top_id = UINT64_MAX;
    bg_tree_init(&t->ready, BG_ORDER_PRIORITY, 0);
    bg_tree_init(&t->delayed, BG_ORDER_DEADLINE, 0);
    bg_tree_init(&t->buried, BG_ORDER_DEADLINE, 0);
    bg_tree_init(&t->reserved, BG_ORDER_ID, 1);
    t->list_index = e->tube_count;
    e->tube_list[e->tube_count++] = t;
    size_t b = name_bucket(e, name);
    t->hash_next = e->tubes[b];
    e->tubes[b] = t;
    if (e->tube_count > e->tubes_mask + 1) tube_table_grow(e);
    return t;
}

static void tube_destroy(struct bg_engine *e, struct bg_tube *t)
{
    struct bg_tube **p = &e->tubes[name_bucket(e, t->name)];
    while (*p != t) p = &(*p)->hash_next;
    *p = t->hash_next;
    /* swap-remove from the list, as the reference's set does */
    uint32_t i = t->list_index;
    e->tube_list[i] = e->tube_list[--e->tube_count];
    e->tube_list[i]->list_index = i;
    if (t->timer_slot != NO_SLOT) bg_heap_remove(&e->tube_timers, t->timer_slot);
    bg_free(t->waiting);
    bg_free(t);
}

static inline void tube_ref(struct bg_tube *t) { t->refs++; }

/* Drop a reference; the tube is freed when nothing refers to it. */
static void tube_unref(struct bg_engine *e, struct bg_tube *t)
{
    if (--t->refs == 0) tube_destroy(e, t);
}

static inline int tube_paused(const struct bg_tube *t) { return t->pause_ns != 0; }

struct bg_job *bg_peek(const struct bg_tube *t, enum bg_job_state state)
{
    switch (state) {
    case BG_JOB_READY: return bg_tree_first(&t->ready);
    case BG_JOB_DELAYED: return bg_tree_first(&t->delayed);
    case BG_JOB_BURIED: return bg_tree_first(&t->buried);
    default: return NULL;
    }
}

const struct bg_tree *bg_tube_index(const struct bg_tube *t, enum bg_job_state state)
{
    switch (state) {
    case BG_JOB_READY: return &t->ready;
    case BG_JOB_DELAYED: return &t->delayed;
    case BG_JOB_BURIED: return &t->buried;
    default: return &t->reserved;
    }
}

/* ---- browsing a tube's jobs (bg_tube_jobs) ------------------------------ */

struct bg_job_cursor bg_job_cursor_of(const struct bg_job *j)
{
    return bg_job_key(j, (enum bg_tree_order)bg_tube_index(j->tube, (enum bg_job_state)j->state)->order);
}

size_t bg_tube_jobs(const struct bg_tube *t, enum bg_job_state state,
                    struct bg_job_cursor *cursor, struct bg_job **out, size_t max)
{
    size_t n = bg_tree_after(bg_tube_index(t, state), *cursor, out, max);
    if (n) *cursor = bg_job_cursor_of(out[n - 1]);
    return n;
}

/* Refresh t's cached ready top key after its ready index or pause changed. */
static void tube_top_update(struct bg_tube *t)
{
    const struct bg_job *j = tube_paused(t) ? NULL : bg_tree_first(&t->ready);
    t->ready_top_pri = j ? j->pri : UINT32_MAX;
    t->ready_top_id = j ? j->id : UINT64_MAX;
}

/* ---- waiting sets (the reference's multiset order, kept exactly) -------- */

static int tube_wait_add(struct bg_tube *t, struct bg_watch *w)
{
    if (t->waiting_len == t->waiting_cap) {
        uint32_t cap = t->waiting_cap ? t->waiting_cap * 2 : 4;
        struct bg_watch **a = bg_realloc(t->waiting, cap * sizeof *a);
        if (!a) return BG_OUT_OF_MEMORY;
        t->waiting = a;
        t->waiting_cap = cap;
    }
    w->wait_index = t->waiting_len;
    t->waiting[t->waiting_len++] = w;
    return 0;
}

static void tube_wait_remove_at(struct bg_tube *t, uint32_t i)
{
    t->waiting[i]->wait_index = NO_SLOT;
    t->waiting[i] = t->waiting[--t->waiting_len];
    if (i < t->waiting_len) t->waiting[i]->wait_index = i;
}

/* Take the next waiter round-robin. Requires waiting_len > 0. */
static struct bg_watch *tube_wait_take(struct bg_tube *t)
{
    t->waiting_cursor %= t->waiting_len;
    struct bg_watch *w = t->waiting[t->waiting_cursor];
    tube_wait_remove_at(t, t->waiting_cursor);
    t->waiting_cursor++;
    return w;
}

/* ---- clients: timers and waiting --------------------------------------- */

static bg_time client_wake_time(const struct bg_client *c)
{
    bg_time wake = c->wait_deadline;
    const struct bg_job_more *soonest = bg_heap_min(&c->reserved);
    if (soonest) {
        bg_time soon = soonest->deadline_at > BG_DEADLINE_MARGIN
                           ? soonest->deadline_at - BG_DEADLINE_MARGIN : 0;
        if (soon < wake) wake = soon;
    }
    return wake;
}

/* Re-file a waiting client in the timer heap after its deadlines changed. */
static void client_reschedule(struct bg_client *c)
{
    struct bg_engine *e = c->engine;
    if (c->timer_slot != NO_SLOT) bg_heap_remove(&e->client_timers, c->timer_slot);
    c->timer_slot = NO_SLOT;
    if (!c->waiting) return;
    c->wake_at = client_wake_time(c);
    if (c->wake_at != NEVER) timer_push(e, &e->client_timers, c, c->wake_at); /* room reserved at init */
}

void bg_client_stop_waiting(struct bg_client *c)
{
    if (!c->waiting) return;
    for (uint32_t i = 0; i < c->watch_len; i++) {
        struct bg_watch *w = c->watch[i];
        if (w->wait_index != NO_SLOT) tube_wait_remove_at(w->tube, w->wait_index);
    }
    c->waiting = 0;
    c->engine->waiting--;
    client_reschedule(c);
}

/* Put c in the waiting set of every watched tube. */
static int client_start_waiting(struct bg_client *c, bg_time deadline, bg_time now)
{
    for (uint32_t i = 0; i < c->watch_len; i++) {
        if (tube_wait_add(c->watch[i]->tube, c->watch[i]) != 0) {
            for (uint32_t k = 0; k < i; k++)
                tube_wait_remove_at(c->watch[k]->tube, c->watch[k]->wait_index);
            return BG_OUT_OF_MEMORY;
        }
    }
    c->waiting = 1;
    c->wait_started = now;
    c->wait_deadline = deadline;
    c->engine->waiting++;
    client_reschedule(c);
    return 0;
}

/* Nonzero if c's soonest reservation is within the safety margin. */
static int client_deadline_soon(const struct bg_client *c, bg_time now)
{
    const struct bg_job_more *m = bg_heap_min(&c->reserved);
    return m && now + BG_DEADLINE_MARGIN >= m->deadline_at;
}

/* ---- moving jobs between states ---------------------------------------- */

static void count_ready(struct bg_engine *e, struct bg_job *j, int delta)
{
    e->ready_count += delta;
    if (j->pri < BG_URGENT_PRIORITY) {
        e->urgent_count += delta;
        j->tube->urgent_count += delta;
    }
}

/* Make sure c can take one more reservation without allocating: room in
 * its heap and a spare side record (for a job that has none yet). 0 or
 * BG_OUT_OF_MEMORY. */
static int reservation_room(struct bg_client *c)
{
    if (bg_heap_reserve(&c->reserved, c->reserved.len + 1) != 0) return BG_OUT_OF_MEMORY;
    return more_spare(c->engine);
}

/* Take j out of whatever structure its state puts it in. */
static void job_unlink(struct bg_engine *e, struct bg_job *j)
{
    struct bg_tube *t = j->tube;
    switch (j->state) {
    case BG_JOB_READY: {
        int was_first = t->ready.first == j;
        bg_tree_remove(&t->ready, bg_tree_key(&t->ready, j));
        if (was_first) tube_top_update(t);
        count_ready(e, j, -1);
        break;
    }
    case BG_JOB_DELAYED:
        bg_tree_remove(&t->delayed, bg_tree_key(&t->delayed, j));
        bg_heap_remove(&e->job_timers, j->more->timer_slot);
        e->delayed_count--;
        break;
    case BG_JOB_RESERVED: {
        struct bg_job_more *m = j->more;
        struct bg_client *c = m->reserver;
        bg_heap_remove(&c->reserved, m->reserver_slot);
        bg_heap_remove(&e->job_timers, m->timer_slot);
        if (j->prev) j->prev->next = j->next; else c->reserved_head = j->next;
        if (j->next) j->next->prev = j->prev; else c->reserved_tail = j->prev;
        m->reserver = NULL;
        e->reserved_count--;
        bg_tree_remove(&t->reserved, (struct bg_job_cursor){0, j->id});
        client_reschedule(c);
        break;
    }
    case BG_JOB_BURIED:
        bg_tree_remove(&t->buried, bg_tree_key(&t->buried, j));
        e->buried_count--;
        break;
    }
    j->prev = j->next = NULL;
}

/* Bury j, which has a side record (it was reserved, or restored buried). */
static void job_bury(struct bg_engine *e, struct bg_job *j)
{
    struct bg_tube *t = j->tube;
    j->state = BG_JOB_BURIED;
    j->more->deadline_at = ++t->burials; /* the buried order's key (bg_job_cursor) */
    bg_tree_insert(&t->buried, j);
    e->buried_count++;
}

static void job_reserve(struct bg_client *c, struct bg_job *j, bg_time now);

/* Nonzero if waiter c can still take a job. A client whose ops say its
 * peer is gone stops waiting here (wait_ended BG_TIMED_OUT), so it leaves
 * every waiting set and the job goes to the next waiter or stays ready. */
static int waiter_alive(struct bg_client *c)
{
    if (!c->ops->alive || c->ops->alive(c)) return 1;
    bg_client_stop_waiting(c);
    c->ops->wait_ended(c, BG_TIMED_OUT);
    return 0;
}

/* Hand ready jobs of t to its waiters while both exist and t is unpaused. */
static void tube_dispatch(struct bg_engine *e, struct bg_tube *t, bg_time now)
{
    while (!tube_paused(t) && t->ready.len && t->waiting_len) {
        t->waiting_cursor %= t->waiting_len;
        /* a dead waiter leaves the set as a hang-up does (swap-remove at
         * the cursor), and the cursor names the next candidate */
        if (!waiter_alive(t->waiting[t->waiting_cursor]->client)) continue;
        struct bg_watch *w = tube_wait_take(t);
        struct bg_client *c = w->client;
        if (reservation_room(c) != 0) {
            tube_wait_add(t, w); /* cannot fail: a slot was just freed */
            return;
        }
        struct bg_job *j = bg_tree_first(&t->ready);
        job_unlink(e, j);
        bg_client_stop_waiting(c);
        job_reserve(c, j, now);
        c->ops->job_reserved(c, j);
    }
    /* jobs stay ready with no waiter to take them: tell the front-end that
     * wants to know (Gearman wakes its sleeping workers) */
    if (e->job_ready && t->ready.len && !tube_paused(t)) e->job_ready(e->job_ready_ctx, t);
}

/* Make j ready (now) or delayed until `ready_at` (then j has a side
 * record: put, release and restore see to it). Never fails: the timer heap
 * keeps room for every job (bg_put, bg_engine_restore_job), and the
 * indexes never allocate. No waiter is served here. */
static void job_queue(struct bg_engine *e, struct bg_job *j, bg_time ready_at, bg_time now)
{
    struct bg_tube *t = j->tube;
    if (ready_at > now) {
        j->more->deadline_at = ready_at;
        bg_tree_insert(&t->delayed, j);
        job_timer_push(e, j->more); /* room kept per job */
        j->state = BG_JOB_DELAYED;
        e->delayed_count++;
        return;
    }
    bg_tree_insert(&t->ready, j);
    if (t->ready.first == j) tube_top_update(t);
    j->state = BG_JOB_READY;
    count_ready(e, j, +1);
}

/* Make j ready (delay 0) or delayed; then match waiters. */
static void job_enqueue(struct bg_engine *e, struct bg_job *j, uint32_t delay_s, bg_time now)
{
    if (delay_s) {
        job_queue(e, j, add_seconds(now, delay_s), now);
        return;
    }
    job_queue(e, j, now, now);
    tube_dispatch(e, j->tube, now);
}

/* Reserve j for c: never fails or allocates (reservation_room was asked:
 * a job without a side record takes the spare). */
static void job_reserve(struct bg_client *c, struct bg_job *j, bg_time now)
{
    struct bg_engine *e = c->engine;
    struct bg_job_more *m = j->more ? j->more : more_attach(e, j);
    m->deadline_at = add_seconds(now, j->ttr_s);
    j->state = BG_JOB_RESERVED;
    m->reserver = c;
    m->reserves++;
    e->stat.total_jobs_reserved++;
    bg_heap_push(&c->reserved, m);   /* room reserved by callers (reservation_room) */
    job_timer_push(e, m);            /* room reserved per job at creation */
    bg_tree_insert(&j->tube->reserved, m);
    j->next = NULL;
    j->prev = c->reserved_tail;
    if (c->reserved_tail) c->reserved_tail->next = j; else c->reserved_head = j;
    c->reserved_tail = j;
    e->reserved_count++;
    client_reschedule(c);
}

static void job_free(struct bg_engine *e, struct bg_job *j)
{
    job_table_remove(e, j);
    tube_unref(e, j->tube);
    job_mem_free(e, j);
}

/* Tell the log about a saved job, if there is a log. */
static void journal_saved(struct bg_engine *e, const struct bg_job *j, int with_body)
{
    if (e->journal) e->journal->job_saved(e->journal_ctx, j, with_body);
}

/* ---- engine lifetime --------------------------------------------------- */

int bg_engine_init(struct bg_engine *e, uint32_t max_job_size, const uint64_t hash_key[2])
{
    memset(e, 0, sizeof *e);
    if (hash_key) e->hash_key[0] = hash_key[0], e->hash_key[1] = hash_key[1];
    e->next_id = 1;
    e->shard_count = 1;
    e->due_at = NEVER;
    e->max_job_size = max_job_size;
    e->jobs_mask = 1023;
    e->jobs_scale = UINT64_MAX;
    e->jobs = bg_calloc(e->jobs_mask + 1, sizeof *e->jobs);
    e->tubes_mask = 63;
    e->tubes = bg_malloc((e->tubes_mask + 1) * sizeof *e->tubes);
    if (!e->jobs || !e->tubes) goto fail;
    memset(e->tubes, 0, (e->tubes_mask + 1) * sizeof *e->tubes);
    bg_heap_init(&e->job_timers, job_deadline_less, offsetof(struct bg_job_more, timer_slot));
    bg_heap_init(&e->tube_timers, tube_unpause_less, offsetof(struct bg_tube, timer_slot));
    bg_heap_init(&e->client_timers, client_wake_less, offsetof(struct bg_client, timer_slot));
    e->default_tube = tube_get(e, "default");
    if (!e->default_tube) goto fail;
    tube_ref(e->default_tube); /* default always exists */
    return 0;
fail:
    bg_free(e->jobs);
    bg_free(e->tubes);
    bg_free(e->tube_list);
    return BG_OUT_OF_MEMORY;
}

void bg_engine_destroy(struct bg_engine *e)
{
    for (size_t i = 0; i <= e->jobs_mask; i++)
        if (e->jobs[i]) job_mem_free(e, e->jobs[i]);
    while (e->tube_count) {
        struct bg_tube *t = e->tube_list[e->tube_count - 1];
        t->timer_slot = NO_SLOT;
        tube_destroy(e, t);
    }
    bg_free(e->jobs);
    bg_free(e->tubes);
    bg_free(e->tube_list);
    bg_heap_free(&e->job_timers);
    bg_heap_free(&e->tube_timers);
    bg_heap_free(&e->client_timers);
    bg_clients_free(e);
    while (e->free_more) {
        struct bg_job_more *m = e->free_more;
        e->free_more = m->left;
        bg_job_free_sized(m, sizeof *m);
    }
}

/* ---- clients ----------------------------------------------------------- */

/* Append a watch of tube t to c. */
static int client_add_watch(struct bg_client *c, struct bg_tube *t)
{
    if (c->watch_len == c->watch_cap) {
        uint32_t cap = c->watch_cap ? c->watch_cap * 2 : 4;
        struct bg_watch **a = bg_realloc(c->watch, cap * sizeof *a);
        if (!a) return BG_OUT_OF_MEMORY;
        c->watch = a; /* bigger than watch_cap says until both have grown */
        struct bg_tube **ts = bg_realloc(c->watch_tube, cap * sizeof *ts);
        if (!ts) return BG_OUT_OF_MEMORY;
        c->watch_tube = ts;
        c->watch_cap = cap;
    }
    struct bg_watch *w = bg_malloc(sizeof *w);
    if (!w) return BG_OUT_OF_MEMORY;
    w->tube = t;
    w->client = c;
    w->wait_index = NO_SLOT;
    c->watch_tube[c->watch_len] = t;
    c->watch[c->watch_len++] = w;
    tube_ref(t);
    t->watching_count++;
    return 0;
}

/* Remove the watch at index i of c (swap-remove, as the reference does). */
static void client_remove_watch(struct bg_client *c, uint32_t i)
{
    struct bg_watch *w = c->watch[i];
    c->watch[i] = c->watch[--c->watch_len];
    c->watch_tube[i] = c->watch_tube[c->watch_len];
    w->tube->watching_count--;
    tube_unref(c->engine, w->tube);
    bg_free(w);
}

static void never_reserved(struct bg_client *c, struct bg_job *j) { (void)c, (void)j; }
static void never_ended(struct bg_client *c, int outcome) { (void)c, (void)outcome; }
const struct bg_client_ops bg_client_ops_never_wait = {never_reserved, never_ended, NULL};

int bg_client_init(struct bg_engine *e, struct bg_client *c,
                   const struct bg_client_ops *ops, void *owner)
{
    int r = bg_client_init_bare(e, c, ops, owner);
    if (r != 0) return r;
    if (client_add_watch(c, e->default_tube) != 0) {
        bg_client_close(c, 0);
        return BG_OUT_OF_MEMORY;
    }
    c->use = e->default_tube;
    tube_ref(c->use);
    c->use->using_count++;
    return 0;
}

int bg_client_init_bare(struct bg_engine *e, struct bg_client *c,
                        const struct bg_client_ops *ops, void *owner)
{
    memset(c, 0, sizeof *c);
    c->engine = e;
    c->ops = ops;
    c->owner = owner;
    c->timer_slot = NO_SLOT;
    c->wait_deadline = NEVER;
    bg_heap_init(&c->reserved, job_deadline_less, offsetof(struct bg_job_more, reserver_slot));
    if (bg_heap_reserve(&e->client_timers, (uint32_t)e->clients + 1) != 0) return BG_OUT_OF_MEMORY;
    e->clients++;
    return 0;
}

void bg_client_close(struct bg_client *c, bg_time now)
{
    struct bg_engine *e = c->engine;
    bg_client_unlist(c);        /* gone from GET /clients */
    bg_client_stop_waiting(c);  /* first: the catch-up must not end c's own wait */
    bg_engine_catch_up(e, now); /* TTRs that ended count as timeouts */
    while (c->reserved_head) {
        struct bg_job *j = c->reserved_head;
        job_unlink(e, j);
        job_enqueue(e, j, 0, now);
    }
    /* reference: the watch set is cleared by removing its first entry over
     * and over (the last moves into its slot): tubes that die here leave
     * the tube list in that order */
    while (c->watch_len) client_remove_watch(c, 0);
    bg_free(c->watch);
    c->watch = NULL;
    bg_free(c->watch_tube);
    c->watch_tube = NULL;
    c->watch_cap = 0;
    if (c->use) {
        c->use->using_count--;
        tube_unref(e, c->use);
        c->use = NULL;
    }
    bg_heap_free(&c->reserved);
    bg_client_set_sleeping(c, 0);
    if (c->is_producer) e->producers--;
    if (c->is_worker) e->workers--;
    e->clients--;
}

void bg_client_set_sleeping(struct bg_client *c, int sleeping)
{
    if (!c->sleeping == !sleeping) return;
    c->sleeping = sleeping != 0;
    if (sleeping) c->engine->waiting++;
    else c->engine->waiting--;
}

void bg_engine_drain(struct bg_engine *e) { e->draining = 1; }

void bg_engine_connection_opened(struct bg_engine *e)
{
    e->connections++;
    e->stat.total_connections++;
}

void bg_engine_connection_closed(struct bg_engine *e) { e->connections--; }

void bg_client_mark_producer(struct bg_client *c)
{
    if (!c->is_producer) {
        c->is_producer = 1;
        c->engine->producers++;
    }
}

void bg_client_mark_worker(struct bg_client *c)
{
    if (!c->is_worker) {
        c->is_worker = 1;
        c->engine->workers++;
    }
}

int bg_client_use(struct bg_client *c, const char *name)
{
    struct bg_tube *t = tube_get(c->engine, name);
    if (!t) return BG_OUT_OF_MEMORY;
    tube_ref(t);
    t->using_count++;
    c->use->using_count--;
    tube_unref(c->engine, c->use);
    c->use = t;
    return 0;
}

/* Index of the watch of tube `name` in c, or -1. */
static long client_find_watch(const struct bg_client *c, const char *name)
{
    /* the tube by its name's hash, then c's contiguous tube pointers: no
     * name compared per watch (a client may watch BG_WATCH_MAX) */
    const struct bg_tube *t = bg_tube_find(c->engine, name);
    for (uint32_t i = 0; t && i < c->watch_len; i++)
        if (c->watch_tube[i] == t) return i;
    return -1;
}

int bg_client_watch(struct bg_client *c, const char *name, uint32_t *count)
{
    if (client_find_watch(c, name) < 0) {
        if (c->watch_len >= BG_WATCH_MAX) return BG_OUT_OF_MEMORY;
        struct bg_tube *t = tube_get(c->engine, name);
        if (!t) return BG_OUT_OF_MEMORY;
        tube_ref(t); /* hold it while the watch is added */
        int r = client_add_watch(c, t);
        tube_unref(c->engine, t);
        if (r != 0) return r;
    }
    *count = c->watch_len;
    return 0;
}

int bg_client_ignore(struct bg_client *c, const char *name, uint32_t *count)
{
    long i = client_find_watch(c, name);
    if (i >= 0) {
        if (c->watch_len < 2) return BG_NOT_IGNORED;
        client_remove_watch(c, (uint32_t)i);
    }
    *count = c->watch_len;
    return 0;
}

int bg_client_unwatch(struct bg_client *c, const char *name)
{
    long i = client_find_watch(c, name);
    if (i < 0) return BG_NOT_FOUND;
    client_remove_watch(c, (uint32_t)i);
    return 0;
}

/* ---- shards: which ids (and, for the gateway, which tubes) are ours ----- */

/* The smallest id of e's class above `after` (UINT64_MAX if none is left). */
static uint64_t class_id_above(const struct bg_engine *e, uint64_t after)
{
    uint64_t n = e->shard_count, k = e->shard_index;
    if (after < k) return k; /* (k == 0 never gets here: after >= 0 = k) */
    uint64_t steps = (after - k) / n + 1;
    if (steps > (UINT64_MAX - k) / n) return UINT64_MAX;
    return k + steps * n;
}

int bg_engine_set_shard(struct bg_engine *e, uint32_t index, uint32_t count)
{
    if (count == 0 || count > BG_SHARD_COUNT_MAX || index >= count) return BG_BAD_FORMAT;
    e->shard_index = index;
    e->shard_count = count;
    if (e->job_count == 0) e->jobs_scale = UINT64_MAX / count; /* else the next growth adopts it */
    /* ids below next_id may have been given out: start above them */
    e->next_id = class_id_above(e, e->next_id - 1);
    return 0;
}

uint32_t bg_shard_of_tube(const char *name, size_t len, uint32_t count)
{
    return bg_crc32(name, len) % count;
}

void bg_engine_id_seen(struct bg_engine *e, uint64_t id)
{
    if (id >= e->next_id) e->next_id = class_id_above(e, id);
}

uint64_t bg_engine_last_id(const struct bg_engine *e)
{
    return e->next_id > e->shard_count ? e->next_id - e->shard_count : 0;
}

size_t bg_engine_foreign_jobs(const struct bg_engine *e, uint64_t *first)
{
    size_t n = 0;
    *first = 0;
    for (size_t b = 0; b <= e->jobs_mask; b++) {
        const struct bg_job *j = e->jobs[b];
        if (j && bg_shard_of_id(j->id, e->shard_count) != e->shard_index) {
            if (!n || j->id < *first) *first = j->id;
            n++;
        }
    }
    return n;
}

/* ---- jobs -------------------------------------------------------------- */

struct bg_job *bg_job_new(struct bg_engine *e, uint32_t pri, uint32_t delay_s,
                          uint32_t ttr_s, uint32_t body_size, bg_time now)
{
    /* every job may sit in the timer heap: keep room for all of them */
    if (!bg_engine_job_fits(e, body_size)) return NULL;
    if (bg_heap_reserve(&e->job_timers, (uint32_t)e->job_count + 1) != 0) return NULL;
    struct bg_job *j = job_mem_alloc(e, body_size);
    if (!j) return NULL;
    memset(j, 0, sizeof *j);
    j->body_size = body_size;
    if (delay_s) { /* it will be delayed: its side record now, before any reply */
        if (!more_of(e, j)) {
            job_mem_free(e, j);
            return NULL;
        }
        j->more->delay_s = delay_s;
    }
    j->id = e->next_id;
    e->next_id += e->shard_count; /* the next id of this shard's class */
    j->pri = pri;
    j->ttr_s = ttr_s ? ttr_s : 1;
    j->created_at = now;
    return j;
}

void bg_job_discard(struct bg_engine *e, struct bg_job *j) { if (j) job_mem_free(e, j); }

int bg_engine_job_fits(const struct bg_engine *e, uint32_t body_size)
{
    uint64_t need = BG_JOB_MEMORY(body_size);
    return !e->max_job_memory ||
           (e->job_memory <= e->max_job_memory && need <= e->max_job_memory - e->job_memory);
}

int bg_engine_memory_full(const struct bg_engine *e) { return !bg_engine_job_fits(e, 2); }

int bg_put(struct bg_client *c, struct bg_tube *t, struct bg_job *j, bg_time now)
{
    struct bg_engine *e = c->engine;
    bg_engine_catch_up(e, now); /* a waiter whose timeout passed must not get the job */
    if (e->draining || e->journal_broken) {
        job_mem_free(e, j);
        return e->draining ? BG_DRAINING : BG_LOG_UNAVAILABLE;
    }
    /* Room in the timer heap for every job in the engine, this one included:
     * job_reserve pushes without checking. bg_job_new's reservation is not
     * enough when several jobs are made before any is put. */
    if (bg_heap_reserve(&e->job_timers, (uint32_t)e->job_count + 1) != 0 || job_table_room(e) != 0) {
        job_mem_free(e, j);
        return BG_OUT_OF_MEMORY;
    }
    job_table_insert(e, j, t);
    e->stat.total_jobs++;
    t->stat.total_jobs++;
    job_enqueue(e, j, bg_job_delay(j), now);
    journal_saved(e, j, 1);
    return 0;
}

int bg_put_named(struct bg_client *c, const char *tube, struct bg_job *j, bg_time now)
{
    struct bg_tube *t = tube_get(c->engine, tube);
    if (!t) {
        job_mem_free(c->engine, j);
        return BG_OUT_OF_MEMORY;
    }
    tube_ref(t); /* keep a new tube alive even if the put fails */
    int r = bg_put(c, t, j, now);
    tube_unref(c->engine, t);
    return r;
}

int bg_put_copy(struct bg_client *c, const char *tube, uint32_t pri, uint32_t delay_s, uint32_t ttr_s,
                const void *body, uint32_t len, bg_time now, uint64_t *id)
{
    if (!bg_engine_job_fits(c->engine, len + 2)) return BG_MEMORY_CEILING;
    struct bg_job *j = bg_job_new(c->engine, pri, delay_s, ttr_s, len + 2, now);
    if (!j) return BG_OUT_OF_MEMORY;
    if (len) memcpy(j->body, body, len);
    memcpy(j->body + len, "\r\n", 2);
    *id = j->id;
    return bg_put_named(c, tube, j, now);
}

void bg_reservation_transfer(struct bg_job *j, struct bg_client *to)
{
    struct bg_job_more *m = j->more;
    struct bg_client *from = m->reserver;
    if (from == to) return;
    bg_heap_remove(&from->reserved, m->reserver_slot);
    if (j->prev) j->prev->next = j->next; else from->reserved_head = j->next;
    if (j->next) j->next->prev = j->prev; else from->reserved_tail = j->prev;
    client_reschedule(from);
    if (bg_heap_push(&to->reserved, m) != 0) {
        bg_heap_push(&from->reserved, m); /* slot just freed: cannot fail */
        to = from;
    }
    m->reserver = to;
    j->next = NULL;
    j->prev = to->reserved_tail;
    if (to->reserved_tail) to->reserved_tail->next = j; else to->reserved_head = j;
    to->reserved_tail = j;
    client_reschedule(to);
}

/* The smallest (pri, id) ready job over c's watched, unpaused tubes. The
 * scan reads one contiguous array and the first bytes of each tube (the
 * cached top key), and touches no job but the winner. */
static struct bg_job *client_best_ready(const struct bg_client *c)
{
    struct bg_tube *const *ts = c->watch_tube;
    struct bg_tube *best = NULL;
    uint32_t best_pri = UINT32_MAX;
    uint64_t best_id = UINT64_MAX; /* no job has this id: "none" */
    for (uint32_t i = 0, n = c->watch_len; i < n; i++) {
        struct bg_tube *t = ts[i];
        uint32_t pri = t->ready_top_pri;
        uint64_t id = t->ready_top_id;
        if (pri < best_pri || (pri == best_pri && id < best_id)) {
            best = t;
            best_pri = pri;
            best_id = id;
        }
    }
    return best ? bg_tree_first(&best->ready) : NULL;
}

int bg_reserve(struct bg_client *c, int64_t timeout_s, bg_time now, struct bg_job **out)
{
    struct bg_engine *e = c->engine;
    bg_engine_catch_up(e, now);
    bg_client_mark_worker(c);
    struct bg_job *j = client_best_ready(c);
    if (j) {
        if (reservation_room(c) != 0) return BG_OUT_OF_MEMORY;
        j->tube->waiting_cursor = 1; /* the reference took us from its waiting set */
        job_unlink(e, j);
        job_reserve(c, j, now);
        *out = j;
        return 0;
    }
    /* Within the margin, a wait would be due at once: it ends here. (The
     * reference checks before looking for a job, unless a watched tube has
     * a ready job, paused or not; then it waits and its next tick ends the
     * wait with DEADLINE_SOON, even for timeout 0.) */
    if (client_deadline_soon(c, now)) return BG_DEADLINE_SOON;
    if (timeout_s == 0) return BG_TIMED_OUT;
    bg_time deadline = timeout_s < 0 ? NEVER : add_seconds(now, (uint64_t)timeout_s);
    int r = client_start_waiting(c, deadline, now);
    return r ? r : BG_WOULD_BLOCK;
}

int bg_reserve_job(struct bg_client *c, uint64_t id, bg_time now, struct bg_job **out)
{
    bg_engine_catch_up(c->engine, now);
    struct bg_job *j = bg_job_find(c->engine, id);
    if (!j || j->state == BG_JOB_RESERVED) return BG_NOT_FOUND;
    if (reservation_room(c) != 0) return BG_OUT_OF_MEMORY;
    job_unlink(c->engine, j);
    bg_client_mark_worker(c);
    job_reserve(c, j, now);
    *out = j;
    return 0;
}

/* j if it is reserved by c, else NULL. */
static struct bg_job *reserved_by(struct bg_client *c, uint64_t id)
{
    struct bg_job *j = bg_job_find(c->engine, id);
    return j && j->state == BG_JOB_RESERVED && j->more->reserver == c ? j : NULL;
}

/* Delete j: counted, logged, freed (and its tube with it if that was the
 * tube's last reference). */
static void job_delete(struct bg_engine *e, struct bg_job *j)
{
    j->tube->stat.cmd_delete++;
    e->stat.total_jobs_deleted++;
    job_unlink(e, j);
    if (e->journal) e->journal->job_deleted(e->journal_ctx, j->id);
    job_free(e, j);
}

int bg_delete(struct bg_client *c, uint64_t id, bg_time now)
{
    struct bg_engine *e = c->engine;
    bg_engine_catch_up(e, now);
    struct bg_job *j = bg_job_find(e, id);
    if (!j || (j->state == BG_JOB_RESERVED && j->more->reserver != c)) return BG_NOT_FOUND;
    job_delete(e, j);
    return 0;
}

int bg_release(struct bg_client *c, uint64_t id, uint32_t pri, uint32_t delay_s, bg_time now)
{
    bg_engine_catch_up(c->engine, now);
    struct bg_job *j = reserved_by(c, id);
    if (!j) return BG_NOT_FOUND;
    job_unlink(c->engine, j);
    j->pri = pri;
    j->more->delay_s = delay_s; /* reserved: it has a side record */
    j->more->releases++;
    job_enqueue(c->engine, j, delay_s, now);
    journal_saved(c->engine, j, 0);
    return 0;
}

int bg_bury(struct bg_client *c, uint64_t id, uint32_t pri, bg_time now)
{
    bg_engine_catch_up(c->engine, now);
    struct bg_job *j = reserved_by(c, id);
    if (!j) return BG_NOT_FOUND;
    job_unlink(c->engine, j);
    j->pri = pri;
    j->more->buries++;
    job_bury(c->engine, j);
    journal_saved(c->engine, j, 0);
    return 0;
}

int bg_touch(struct bg_client *c, uint64_t id, bg_time now)
{
    struct bg_engine *e = c->engine;
    bg_engine_catch_up(e, now); /* a job whose TTR ended is no longer c's to touch */
    struct bg_job *j = reserved_by(c, id);
    if (!j) return BG_NOT_FOUND;
    struct bg_job_more *m = j->more;
    bg_heap_remove(&c->reserved, m->reserver_slot);
    bg_heap_remove(&e->job_timers, m->timer_slot);
    m->deadline_at = add_seconds(now, j->ttr_s);
    bg_heap_push(&c->reserved, m);   /* slots just freed */
    job_timer_push(e, m);
    client_reschedule(c);
    return 0;
}

int bg_set_ttr(struct bg_client *c, uint64_t id, uint32_t ttr_s, bg_time now)
{
    bg_engine_catch_up(c->engine, now);
    struct bg_job *j = reserved_by(c, id);
    if (!j) return BG_NOT_FOUND;
    j->ttr_s = ttr_s ? ttr_s : 1;
    bg_touch(c, id, now);        /* its reservation runs from now */
    journal_saved(c->engine, j, 0);
    return 0;
}

/* Move a buried or delayed job to ready (which cannot fail: the ready
 * index never allocates), counting and logging a kick. */
static void job_kick(struct bg_engine *e, struct bg_job *j, bg_time now)
{
    job_unlink(e, j);
    j->more->kicks++; /* buried or delayed: it has a side record */
    job_enqueue(e, j, 0, now);
    journal_saved(e, j, 0);
}

uint64_t bg_kick(struct bg_engine *e, struct bg_tube *t, uint64_t n, bg_time now)
{
    return bg_kick_state(e, t, t->buried.len ? BG_JOB_BURIED : BG_JOB_DELAYED, n, now);
}

uint64_t bg_kick_state(struct bg_engine *e, struct bg_tube *t, enum bg_job_state state,
                       uint64_t max, bg_time now)
{
    bg_engine_catch_up(e, now); /* delayed jobs that are due are ready, not kickable */
    if (state != BG_JOB_BURIED && state != BG_JOB_DELAYED) return 0;
    uint64_t i = 0;
    struct bg_job *j;
    for (; i < max && (j = bg_peek(t, state)); i++) job_kick(e, j, now);
    return i;
}

uint64_t bg_delete_state(struct bg_engine *e, struct bg_tube *t, enum bg_job_state state,
                         uint64_t max, bg_time now)
{
    bg_engine_catch_up(e, now);
    if (state == BG_JOB_RESERVED) return 0;
    tube_ref(t); /* t outlives its last job until the loop ends */
    uint64_t i = 0;
    struct bg_job *j;
    for (; i < max && (j = bg_peek(t, state)); i++) job_delete(e, j);
    tube_unref(e, t);
    return i;
}

int bg_kick_job(struct bg_engine *e, uint64_t id, bg_time now)
{
    bg_engine_catch_up(e, now);
    struct bg_job *j = bg_job_find(e, id);
    if (!j || (j->state != BG_JOB_BURIED && j->state != BG_JOB_DELAYED)) return BG_NOT_FOUND;
    job_kick(e, j, now);
    return 0;
}

/* End t's pause (its timer, if any, is already gone) and serve its waiters. */
static void tube_unpause(struct bg_engine *e, struct bg_tube *t, bg_time now)
{
    t->pause_ns = 0;
    tube_top_update(t);
    tube_dispatch(e, t, now);
}

int bg_pause_tube(struct bg_engine *e, const char *name, uint32_t delay_s, bg_time now)
{
    bg_engine_catch_up(e, now);
    struct bg_tube *t = bg_tube_find(e, name);
    if (!t) return BG_NOT_FOUND;
    if (t->timer_slot != NO_SLOT) bg_heap_remove(&e->tube_timers, t->timer_slot);
    t->timer_slot = NO_SLOT;
    t->stat.cmd_pause++;
    t->unpause_at = add_seconds(now, delay_s);
    if (delay_s == 0) {
        /* reference: pause 0 pauses for 1 ns, which has passed by the time
         * its next command runs; here the next command may run at this very
         * `now`, so the pause ends at once (and so does any earlier one) */
        tube_unpause(e, t, now);
        if (e->journal) e->journal->tube_paused(e->journal_ctx, t); /* logs the end */
        return 0;
    }
    t->pause_ns = (bg_time)delay_s * BG_SECOND;
    if (timer_push(e, &e->tube_timers, t, t->unpause_at) != 0) {
        t->pause_ns = 0; /* cannot schedule the end: do not pause at all */
        tube_top_update(t);
        return BG_OUT_OF_MEMORY;
    }
    tube_top_update(t);
    if (e->journal) e->journal->tube_paused(e->journal_ctx, t);
    return 0;
}

/* ---- restoring from the log -------------------------------------------- */

void bg_journal_job_of(const struct bg_job *j, struct bg_journal_job *out)
{
    memset(out, 0, sizeof *out);
    out->id = j->id;
    out->tube = j->tube->name;
    out->pri = j->pri;
    out->state = j->state == BG_JOB_RESERVED ? BG_JOB_READY : j->state;
    out->delay_s = bg_job_delay(j);
    out->ttr_s = j->ttr_s;
    out->reserves = bg_job_reserves(j);
    out->timeouts = bg_job_timeouts(j);
    out->releases = bg_job_releases(j);
    out->buries = bg_job_buries(j);
    out->kicks = bg_job_kicks(j);
    out->body_len = j->body_size;
    out->body = j->body;
}

/* Place a restored job in the structure of state r->state. */
static void restore_place(struct bg_engine *e, struct bg_job *j, const struct bg_journal_job *r,
                          bg_time deadline_mono, bg_time now)
{
    if (r->state == BG_JOB_BURIED) job_bury(e, j);
    else job_queue(e, j, r->state == BG_JOB_DELAYED ? deadline_mono : now, now);
}

/* Nonzero if a job restored as r needs a side record: it is not ready,
 * or it has a delay or a counter that is not 0. */
static int restore_needs_more(const struct bg_journal_job *r)
{
    return r->state != BG_JOB_READY || r->delay_s || r->reserves || r->timeouts || r->releases || r->buries ||
           r->kicks;
}

/* Copy the logged fields that an update may change (j has a side record
 * if restore_needs_more(r)). */
static void restore_fields(struct bg_job *j, const struct bg_journal_job *r)
{
    j->pri = r->pri;
    j->ttr_s = r->ttr_s ? r->ttr_s : 1;
    struct bg_job_more *m = j->more;
    if (!m) return;
    m->delay_s = r->delay_s;
    m->reserves = r->reserves;
    m->timeouts = r->timeouts;
    m->releases = r->releases;
    m->buries = r->buries;
    m->kicks = r->kicks;
}

int bg_engine_restore_job(struct bg_engine *e, const struct bg_journal_job *r,
                          bg_time deadline_mono, bg_time created_mono, bg_time now)
{
    bg_engine_restore_delete(e, r->id);
    if (bg_heap_reserve(&e->job_timers, (uint32_t)e->job_count + 1) != 0 || job_table_room(e) != 0)
        return BG_OUT_OF_MEMORY;
    struct bg_tube *t = tube_get(e, r->tube);
    if (!t) return BG_OUT_OF_MEMORY;
    struct bg_job *j = job_mem_alloc(e, r->body_len); /* counted, never refused */
    if (!j) {
        tube_ref(t);
        tube_unref(e, t); /* frees a tube made for nothing */
        return BG_OUT_OF_MEMORY;
    }
    memset(j, 0, sizeof *j);
    j->body_size = r->body_len;
    if (restore_needs_more(r) && !more_of(e, j)) {
        job_mem_free(e, j);
        tube_ref(t);
        tube_unref(e, t);
        return BG_OUT_OF_MEMORY;
    }
    j->id = r->id;
    memcpy(j->body, r->body, r->body_len);
    j->created_at = created_mono;
    restore_fields(j, r);
    job_table_insert(e, j, t);
    bg_engine_id_seen(e, j->id);
    restore_place(e, j, r, deadline_mono, now);
    return 0;
}

int bg_engine_restore_update(struct bg_engine *e, const struct bg_journal_job *r,
                             bg_time deadline_mono, bg_time now)
{
    struct bg_job *j = bg_job_find(e, r->id);
    if (!j) return BG_NOT_FOUND;
    if (restore_needs_more(r) && !more_of(e, j)) return BG_OUT_OF_MEMORY; /* j is as it was */
    job_unlink(e, j);
    restore_fields(j, r);
    restore_place(e, j, r, deadline_mono, now);
    return 0;
}

void bg_engine_restore_delete(struct bg_engine *e, uint64_t id)
{
    bg_engine_id_seen(e, id); /* ids are never reused */
    struct bg_job *j = bg_job_find(e, id);
    if (!j) return;
    job_unlink(e, j);
    job_free(e, j);
}

int bg_engine_restore_pause(struct bg_engine *e, const char *tube, uint32_t pause_s,
                            bg_time unpause_mono, bg_time now)
{
    struct bg_tube *t = tube_get(e, tube); /* jobs may come after the pause */
    if (!t) return BG_OUT_OF_MEMORY;
    if (t->timer_slot != NO_SLOT) bg_heap_remove(&e->tube_timers, t->timer_slot);
    t->timer_slot = NO_SLOT;
    if (unpause_mono <= now) { /* the pause ended (or was ended) */
        t->pause_ns = 0;
        tube_top_update(t);
        return 0;
    }
    t->pause_ns = pause_s ? (bg_time)pause_s * BG_SECOND : 1;
    t->unpause_at = unpause_mono;
    if (timer_push(e, &e->tube_timers, t, t->unpause_at) != 0) {
        t->pause_ns = 0;
        tube_top_update(t);
        return BG_OUT_OF_MEMORY;
    }
    tube_top_update(t);
    return 0;
}

void bg_engine_restore_finish(struct bg_engine *e)
{
    /* a pause record may have made a tube that no job ever used */
    for (uint32_t i = e->tube_count; i-- > 0;) {
        struct bg_tube *t = e->tube_list[i];
        if (t->refs == 0) tube_destroy(e, t);
    }
}

/* ---- time -------------------------------------------------------------- */

bg_time bg_engine_next_deadline(const struct bg_engine *e)
{
    bg_time next = NEVER;
    const struct bg_job_more *m = bg_heap_min(&e->job_timers);
    const struct bg_tube *t = bg_heap_min(&e->tube_timers);
    const struct bg_client *c = bg_heap_min(&e->client_timers);
    if (m && m->deadline_at < next) next = m->deadline_at;
    if (t && t->unpause_at < next) next = t->unpause_at;
    if (c && c->wake_at < next) next = c->wake_at;
    return next;
}

bg_time bg_engine_tick(struct bg_engine *e, bg_time now)
{
    struct bg_job_more *m;
    while ((m = bg_heap_min(&e->job_timers)) && m->deadline_at <= now) {
        struct bg_job *j = m->job;
        if (j->state == BG_JOB_RESERVED) {
            e->stat.job_timeouts++;
            m->timeouts++;
        }
        job_unlink(e, j);
        job_enqueue(e, j, 0, now);
    }
    struct bg_tube *t;
    while ((t = bg_heap_min(&e->tube_timers)) && t->unpause_at <= now) {
        bg_heap_remove(&e->tube_timers, 0);
        t->timer_slot = NO_SLOT;
        tube_unpause(e, t, now);
    }
    struct bg_client *c;
    while ((c = bg_heap_min(&e->client_timers)) && c->wake_at <= now) {
        int outcome = client_deadline_soon(c, now) ? BG_DEADLINE_SOON : BG_TIMED_OUT;
        bg_client_stop_waiting(c);
        c->ops->wait_ended(c, outcome);
    }
    /* the loops above re-read each heap's top, so a callback that calls
     * back into the engine (and catches up itself) leaves them correct */
    e->due_at = bg_engine_next_deadline(e);
    return e->due_at;
}

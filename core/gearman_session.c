/* gearman_session.c - the Gearman protocol on the engine, pure: sessions
 * fed bytes append reply bytes (core/gearman.h, "gearman_session.c").
 *
 * A function is a tube; a submitted job is a beanstalk job in that tube; a
 * worker is an engine client that watches the tubes of its abilities. What
 * gearmand keeps beside the queue (foreground listeners, unique ids,
 * WORK_STATUS numbers) lives here, in a table of records by job id, only
 * for the jobs that need one. Where gearmand 1.1.20 behaves in a way we keep
 * on purpose, the comment says "gearmand:" (tests/gearman/FACTS.md).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "gearman.h"

/* ---- the state kept beside the queue ----------------------------------- */

/* One job that has Gearman state: listeners, a unique id or a status. */
struct gm_record {
    uint64_t id;
    struct gm_record *id_next, *unique_next;
    struct gm_session **listeners; /* foreground clients waiting for results */
    uint32_t listener_count, listener_cap;
    char tube[BG_TUBE_NAME_MAX + 1];
    char unique[GM_UNIQUE_MAX + 1];
    char numerator[24], denominator[24]; /* the last WORK_STATUS */
    uint8_t foreground;
};

/* A function seen over Gearman (for `status`), by tube name. */
struct gm_function {
    struct gm_function *next;      /* hash chain */
    struct gm_function *list_next; /* newest first */
    uint32_t max_queue;            /* maxqueue; 0: no limit */
    char tube[];
};

static void *zalloc(size_t n)
{
    void *p = bg_malloc(n);
    if (p) memset(p, 0, n);
    return p;
}

static uint64_t hash_text(const struct gm_server *g, const char *s, size_t n)
{
    return bg_siphash(g->hash_key, s, n);
}

/* Grow table t to hold one more record; 0 or BG_OUT_OF_MEMORY. `by_unique`
 * says which chain the table uses. */
static int table_grow(struct gm_server *g, struct gm_table *t, int by_unique)
{
    if (t->slot && t->count < t->mask + 1) return 0;
    size_t n = t->slot ? (t->mask + 1) * 2 : 64;
    struct gm_record **slot = zalloc(n * sizeof *slot);
    if (!slot) return BG_OUT_OF_MEMORY;
    for (size_t i = 0; t->slot && i <= t->mask; i++) {
        struct gm_record *r = t->slot[i], *next;
        for (; r; r = next) {
            next = by_unique ? r->unique_next : r->id_next;
            uint64_t h = by_unique ? hash_text(g, r->unique, strlen(r->unique)) : bg_hash_id(r->id);
            struct gm_record **head = &slot[h & (n - 1)];
            if (by_unique) r->unique_next = *head; else r->id_next = *head;
            *head = r;
        }
    }
    bg_free(t->slot);
    t->slot = slot;
    t->mask = n - 1;
    return 0;
}

/* The record of job id, or NULL. */
static struct gm_record *record_find(struct gm_server *g, uint64_t id)
{
    if (!g->by_id.slot) return NULL;
    struct gm_record *r = g->by_id.slot[bg_hash_id(id) & g->by_id.mask];
    while (r && r->id != id) r = r->id_next;
    return r;
}

/* The record of the job with this tube and unique id, or NULL. */
static struct gm_record *record_find_unique(struct gm_server *g, const char *tube, const char *unique,
                                            size_t unique_len)
{
    if (!g->by_unique.slot) return NULL;
    struct gm_record *r = g->by_unique.slot[hash_text(g, unique, unique_len) & g->by_unique.mask];
    for (; r; r = r->unique_next)
        if (strlen(r->unique) == unique_len && memcmp(r->unique, unique, unique_len) == 0 &&
            (!tube || strcmp(r->tube, tube) == 0))
            return r;
    return NULL;
}

/* A new record for job id in tube (with unique id, may be empty). NULL:
 * out of memory. */
static struct gm_record *record_add(struct gm_server *g, uint64_t id, const char *tube,
                                    const char *unique, size_t unique_len)
{
    if (table_grow(g, &g->by_id, 0) != 0 || table_grow(g, &g->by_unique, 1) != 0) return NULL;
    struct gm_record *r = zalloc(sizeof *r);
    if (!r) return NULL;
    r->id = id;
    snprintf(r->tube, sizeof r->tube, "%s", tube);
    memcpy(r->unique, unique, unique_len);
    strcpy(r->numerator, "0");
    strcpy(r->denominator, "0");
    struct gm_record **head = &g->by_id.slot[bg_hash_id(id) & g->by_id.mask];
    r->id_next = *head;
    *head = r;
    g->by_id.count++;
    if (unique_len) {
        head = &g->by_unique.slot[hash_text(g, unique, unique_len) & g->by_unique.mask];
        r->unique_next = *head;
        *head = r;
        g->by_unique.count++;
    }
    return r;
}

/* Drop id from s's listening list (the record is going away). */
static void session_forget_listening(struct gm_session *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->listening_count; i++)
        if (s->listening[i] == id) {
            s->listening[i] = s->listening[--s->listening_count];
            return;
        }
}

/* Unlink and free record r; its listeners stop listening. */
static void record_remove(struct gm_server *g, struct gm_record *r)
{
    struct gm_record **p = &g->by_id.slot[bg_hash_id(r->id) & g->by_id.mask];
    while (*p != r) p = &(*p)->id_next;
    *p = r->id_next;
    g->by_id.count--;
    if (r->unique[0]) {
        p = &g->by_unique.slot[hash_text(g, r->unique, strlen(r->unique)) & g->by_unique.mask];
        while (*p != r) p = &(*p)->unique_next;
        *p = r->unique_next;
        g->by_unique.count--;
    }
    for (uint32_t i = 0; i < r->listener_count; i++) session_forget_listening(r->listeners[i], r->id);
    bg_free(r->listeners);
    bg_free(r);
}

/* Add s as a listener of r (once). 0 or BG_OUT_OF_MEMORY. */
static int record_listen(struct gm_record *r, struct gm_session *s)
{
    for (uint32_t i = 0; i < r->listener_count; i++)
        if (r->listeners[i] == s) return 0;
    if (r->listener_count == r->listener_cap) {
        uint32_t n = r->listener_cap ? r->listener_cap * 2 : 2;
        struct gm_session **l = bg_realloc(r->listeners, n * sizeof *l);
        if (!l) return BG_OUT_OF_MEMORY;
        r->listeners = l, r->listener_cap = n;
    }
    if (s->listening_count == s->listening_cap) {
        uint32_t n = s->listening_cap ? s->listening_cap * 2 : 4;
        uint64_t *l = bg_realloc(s->listening, n * sizeof *l);
        if (!l) return BG_OUT_OF_MEMORY;
        s->listening = l, s->listening_cap = n;
    }
    r->listeners[r->listener_count++] = s;
    s->listening[s->listening_count++] = r->id;
    r->foreground = 1;
    return 0;
}

/* ---- functions seen ----------------------------------------------------- */

/* Forget functions whose tube is gone (no jobs, no watchers) and that
 * have no queue limit: the list must not grow with every name a client
 * ever sent. */
static void function_prune(struct gm_server *g)
{
    struct gm_function **p = &g->function_list;
    while (*p) {
        struct gm_function *f = *p;
        if (f->max_queue || bg_tube_find(g->engine, f->tube)) {
            p = &f->list_next;
            continue;
        }
        *p = f->list_next;
        struct gm_function **h = &g->functions[hash_text(g, f->tube, strlen(f->tube)) & g->functions_mask];
        while (*h != f) h = &(*h)->next;
        *h = f->next;
        g->function_count--;
        bg_free(f);
    }
}

/* The entry of tube in the function list, added if `add`; NULL if absent,
 * out of memory, or the list is full (GM_FUNCTIONS_MAX functions that
 * still have a tube: the function works, `status` does not list it). */
static struct gm_function *function_get(struct gm_server *g, const char *tube, int add)
{
    size_t len = strlen(tube);
    uint64_t h = hash_text(g, tube, len);
    if (g->functions) {
        for (struct gm_function *f = g->functions[h & g->functions_mask]; f; f = f->next)
            if (strcmp(f->tube, tube) == 0) return f;
    }
    if (!add) return NULL;
    if (g->function_count >= GM_FUNCTIONS_MAX) function_prune(g);
    if (g->function_count >= GM_FUNCTIONS_MAX) return NULL;
    if (!g->functions || g->function_count > g->functions_mask) {
        size_t n = g->functions ? (g->functions_mask + 1) * 2 : 64;
        struct gm_function **t = zalloc(n * sizeof *t);
        if (!t) return NULL;
        for (struct gm_function *f = g->function_list; f; f = f->list_next) {
            uint64_t fh = hash_text(g, f->tube, strlen(f->tube));
            f->next = t[fh & (n - 1)];
            t[fh & (n - 1)] = f;
        }
        bg_free(g->functions);
        g->functions = t;
        g->functions_mask = n - 1;
    }
    struct gm_function *f = zalloc(sizeof *f + len + 1);
    if (!f) return NULL;
    memcpy(f->tube, tube, len + 1);
    f->next = g->functions[h & g->functions_mask];
    g->functions[h & g->functions_mask] = f;
    f->list_next = g->function_list; /* gearmand lists the newest first */
    g->function_list = f;
    g->function_count++;
    return f;
}

/* ---- output ------------------------------------------------------------ */

/* Append a response packet of type t with n arguments to s's output. A
 * session's own requests stop at its stream's out_limit, but results other
 * sessions send it do not: past out_max it overflows (and is dropped). */
static void reply(struct gm_session *s, uint32_t t, uint32_t n, const char *const *arg,
                  const uint32_t *len)
{
    struct bg_stream *st = &s->stream;
    if (st->overflow) return;
    if (st->out_max && st->out.len > st->out_max) {
        st->overflow = 1;
        bg_stream_wake(st);
        return;
    }
    if (gm_encode_response(&st->out, t, n, arg, len) != 0) st->closing = 1;
}

/* Append a response whose arguments are NUL-terminated strings. */
static void reply_strings(struct gm_session *s, uint32_t t, uint32_t n, ...)
{
    const char *arg[GM_ARGS_MAX];
    uint32_t len[GM_ARGS_MAX];
    va_list ap;
    va_start(ap, n);
    for (uint32_t i = 0; i < n; i++) {
        arg[i] = va_arg(ap, const char *);
        len[i] = (uint32_t)strlen(arg[i]);
    }
    va_end(ap);
    reply(s, t, n, arg, len);
}

/* An ERROR packet (code, text); the connection stays open. */
static void reply_error(struct gm_session *s, const char *code, const char *text)
{
    reply_strings(s, GM_ERROR, 2, code, text);
}

/* Append admin text to s's output; a session that cannot take it closes. */
static void admin_text(struct gm_session *s, const char *text, size_t n)
{
    if (bg_buf_append(&s->stream.out, text, n) != 0) s->stream.closing = 1;
}

static void admin_printf(struct gm_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void admin_printf(struct gm_session *s, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    admin_text(s, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* ---- scopes ------------------------------------------------------------ */

/* Whether s's scope allows `kind` on `tube` (a function's tube). If not, the
 * refusal is answered, an ERROR packet (or, for an admin line, a text line)
 * PERMISSION_DENIED "<kind>:<tube>", and counted. */
static int permitted(struct gm_session *s, enum bg_scope_kind kind, const char *tube, int admin)
{
    if (bg_scope_allows(s->scope, kind, tube, strlen(tube))) return 1;
    char required[BG_SCOPE_REQUIRED_MAX];
    bg_scope_required(kind, tube, strlen(tube), required);
    s->g->engine->stat.permission_denied++;
    if (admin) admin_printf(s, "ERR PERMISSION_DENIED %s\r\n", required);
    else reply_error(s, "PERMISSION_DENIED", required);
    return 0;
}

/* Whether s's scope allows `kind` on some tube (the admin lines, which
 * then show only what the scope sees); if not, "ERR PERMISSION_DENIED
 * <kind>:*", counted. */
static int permitted_some(struct gm_session *s, enum bg_scope_kind kind)
{
    if (bg_scope_allows_some(s->scope, kind)) return 1;
    s->g->engine->stat.permission_denied++;
    admin_printf(s, "ERR PERMISSION_DENIED %s:*\r\n", bg_scope_kind_name(kind));
    return 0;
}

/* Whether s's scope sees tube (listings leave out the others). */
static int sees(const struct gm_session *s, const char *tube)
{
    return bg_scope_sees(s->scope, tube, strlen(tube));
}

/* The job handle of job id, in out. */
static void job_handle(const struct gm_server *g, uint64_t id, char out[GM_HANDLE_MAX + 1])
{
    snprintf(out, GM_HANDLE_MAX + 1, "H:%.32s:%llu", g->hooks.hostname, (unsigned long long)id);
}

/* The job id named by a handle "H:host:ID" (the digits after its last
 * colon), or 0 when it names none. */
static uint64_t handle_id(const char *h, uint32_t len)
{
    const char *colon = NULL;
    for (uint32_t i = 0; i < len; i++)
        if (h[i] == ':') colon = h + i;
    if (!colon) return 0;
    uint64_t id;
    size_t n = (size_t)(h + len - (colon + 1));
    if (n > 20) return 0; /* longer than any id, leading zeros or not */
    return bg_parse_u64(colon + 1, n, UINT64_MAX, &id) == 0 ? id : 0;
}

/* Number arguments (SUBMIT_JOB_EPOCH's time, CAN_DO_TIMEOUT's seconds,
 * maxqueue's sizes) are read by bg_parse_u64: digits only, within range.
 * gearmand reads them with atoi (anything else is 0, overflow undefined);
 * beangate answers an error instead (docs/gearman.md). */

/* The job's data (its body without the stored CRLF). */
static uint32_t job_data_len(const struct bg_job *j) { return j->body_size - 2; }

/* ---- workers ----------------------------------------------------------- */

static long ability_find(const struct gm_session *s, const char *tube)
{
    for (uint32_t i = 0; i < s->ability_count; i++)
        if (strcmp(s->abilities[i].tube, tube) == 0) return (long)i;
    return -1;
}

/* Nonzero if one of s's functions has a job to take now. */
static int has_ready_job(const struct gm_session *s)
{
    for (uint32_t i = 0; i < s->ability_count; i++) {
        const struct bg_tube *t = s->abilities[i].tube_ptr;
        if (t->ready.len && !t->pause_ns) return 1;
    }
    return 0;
}

/* Take s off the sleepers list (it grabbed, was woken or is closing). */
static void unsleep(struct gm_session *s)
{
    if (!s->sleeping) return;
    struct gm_server *g = s->g;
    if (s->sleep_prev) s->sleep_prev->sleep_next = s->sleep_next; else g->sleepers = s->sleep_next;
    if (s->sleep_next) s->sleep_next->sleep_prev = s->sleep_prev;
    s->sleep_prev = s->sleep_next = NULL;
    s->sleeping = 0;
    bg_client_set_sleeping(&s->client, 0);
}

/* Wake a sleeping worker: one NOOP. The job stays queued (as in gearmand):
 * the worker's GRAB_JOB takes whatever is best then. */
static void wake(struct gm_session *s)
{
    unsleep(s);
    reply(s, GM_NOOP, 0, NULL, NULL);
    bg_stream_wake(&s->stream);
}

/* PRE_SLEEP: NOOP at once if a job is waiting, else sleep until one is. */
static void pre_sleep(struct gm_session *s)
{
    if (s->sleeping) return;
    if (has_ready_job(s)) {
        reply(s, GM_NOOP, 0, NULL, NULL);
        return;
    }
    struct gm_server *g = s->g;
    s->sleeping = 1;
    s->sleep_prev = NULL;
    s->sleep_next = g->sleepers;
    if (g->sleepers) g->sleepers->sleep_prev = s;
    g->sleepers = s;
    bg_client_set_sleeping(&s->client, 1); /* counts in current-waiting */
}

/* The engine's job_ready hook: tube t has jobs nobody took. Wake the
 * sleeping workers that can do them. Runs inside engine calls: it only
 * appends NOOPs. */
static void engine_job_ready(void *ctx, struct bg_tube *t)
{
    struct gm_server *g = ctx;
    struct gm_session *s = g->sleepers, *next;
    for (; s; s = next) {
        next = s->sleep_next;
        for (uint32_t i = 0; i < s->ability_count; i++)
            if (s->abilities[i].tube_ptr == t) {
                wake(s);
                break;
            }
    }
}

/* CAN_DO / CAN_DO_TIMEOUT: watch the function's tube. */
static void can_do(struct gm_session *s, const char *fn, uint32_t fn_len, uint32_t timeout_s)
{
    char tube[BG_TUBE_NAME_MAX + 1];
    if (gm_function_to_tube(fn, fn_len, tube) < 0) {
        reply_error(s, "INVALID_FUNCTION_NAME", "function name is empty or too long");
        return;
    }
    if (!permitted(s, BG_SCOPE_CONSUME, tube, 0)) return;
    long i = ability_find(s, tube);
    if (i >= 0) {
        s->abilities[i].timeout_s = timeout_s;
        return;
    }
    if (s->ability_count == s->ability_cap) {
        uint32_t n = s->ability_cap ? s->ability_cap * 2 : 4;
        if (n > GM_ABILITIES_MAX) {
            reply_error(s, "TOO_MANY_ABILITIES", "a worker may register at most 4096 functions");
            return;
        }
        struct gm_ability *a = bg_realloc(s->abilities, n * sizeof *a);
        if (!a) {
            s->stream.closing = 1;
            return;
        }
        s->abilities = a, s->ability_cap = n;
    }
    uint32_t count;
    function_get(s->g, tube, 1); /* for `status`; a full list does not stop a worker */
    if (bg_client_watch(&s->client, tube, &count) != 0) {
        s->stream.closing = 1;
        return;
    }
    struct gm_ability *a = &s->abilities[s->ability_count++];
    memcpy(a->tube, tube, sizeof a->tube);
    a->tube_ptr = bg_tube_find(s->g->engine, tube); /* alive while watched */
    a->timeout_s = timeout_s;
    bg_client_mark_worker(&s->client);
    if (s->sleeping && has_ready_job(s)) wake(s);
}

/* Forget ability i (CANT_DO, RESET_ABILITIES). */
static void drop_ability(struct gm_session *s, uint32_t i)
{
    bg_client_unwatch(&s->client, s->abilities[i].tube);
    s->ability_count--;
    memmove(&s->abilities[i], &s->abilities[i + 1], (s->ability_count - i) * sizeof s->abilities[0]);
}

/* Hand job j (reserved by s) to the worker: JOB_ASSIGN for GRAB_JOB,
 * JOB_ASSIGN_UNIQ for GRAB_JOB_UNIQ and (as gearmand answers the stock
 * `gearman -w` worker) for GRAB_JOB_ALL. */
static void assign(struct gm_session *s, struct bg_job *j, uint32_t grab, bg_time now)
{
    long i = ability_find(s, j->tube->name);
    if (i >= 0 && s->abilities[i].timeout_s)
        bg_set_ttr(&s->client, j->id, s->abilities[i].timeout_s, now); /* CAN_DO_TIMEOUT is the TTR */
    char handle[GM_HANDLE_MAX + 1], fn[GM_FUNCTION_MAX + 1];
    job_handle(s->g, j->id, handle);
    int fn_len = gm_tube_to_function(j->tube->name, fn, sizeof fn);
    if (fn_len < 0) fn_len = 0;
    struct gm_record *r = record_find(s->g, j->id);
    const char *unique = r ? r->unique : "";
    const char *arg[4];
    uint32_t len[4], n = 0;
    arg[n] = handle, len[n++] = (uint32_t)strlen(handle);
    arg[n] = fn, len[n++] = (uint32_t)fn_len;
    uint32_t type = GM_JOB_ASSIGN;
    if (grab == GM_GRAB_JOB_UNIQ || grab == GM_GRAB_JOB_ALL) {
        arg[n] = unique, len[n++] = (uint32_t)strlen(unique);
        type = GM_JOB_ASSIGN_UNIQ;
    }
    arg[n] = j->body, len[n++] = job_data_len(j);
    bg_engine_show_job(s->g->engine, j);
    reply(s, type, n, arg, len);
}

/* GRAB_JOB, GRAB_JOB_UNIQ, GRAB_JOB_ALL. */
static void grab(struct gm_session *s, uint32_t type, bg_time now)
{
    unsleep(s);
    struct bg_job *j = NULL;
    /* BG_TIMED_OUT, or BG_DEADLINE_SOON (a job it holds is about to time
     * out): NO_JOB */
    if (s->ability_count && bg_reserve(&s->client, 0, now, &j) != 0) j = NULL;
    if (!j) {
        reply(s, GM_NO_JOB, 0, NULL, NULL);
        return;
    }
    assign(s, j, type, now);
}

/* Send packet type t with args to every listener of record r (WORK_*). */
static void forward(struct gm_record *r, uint32_t t, const struct gm_packet *p)
{
    for (uint32_t i = 0; i < r->listener_count; i++) {
        struct gm_session *l = r->listeners[i];
        if (t == GM_WORK_EXCEPTION && !l->exceptions) continue;
        reply(l, t, p->nargs, p->arg, p->arg_len);
        bg_stream_wake(&l->stream);
    }
}

/* WORK_DATA, WORK_WARNING, WORK_STATUS, WORK_COMPLETE, WORK_FAIL,
 * WORK_EXCEPTION from the worker holding the job. */
static void work_result(struct gm_session *s, const struct gm_packet *p, bg_time now)
{
    struct gm_server *g = s->g;
    uint64_t id = handle_id(p->arg[0], p->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(g->engine, id) : NULL;
    if (!j || bg_job_reserver(j) != &s->client) {
        reply_error(s, "JOB_NOT_FOUND", "Job given in work result not found");
        return;
    }
    struct gm_record *r = record_find(g, id);
    if (p->type == GM_WORK_STATUS) {
        if (!r && !(r = record_add(g, id, j->tube->name, "", 0))) {
            s->stream.closing = 1;
            return;
        }
        snprintf(r->numerator, sizeof r->numerator, "%.*s", (int)p->arg_len[1], p->arg[1]);
        snprintf(r->denominator, sizeof r->denominator, "%.*s", (int)p->arg_len[2], p->arg[2]);
    }
    if (r) forward(r, p->type, p);
    int ends = p->type == GM_WORK_COMPLETE || p->type == GM_WORK_FAIL ||
               p->type == GM_WORK_EXCEPTION;
    if (!ends) return;
    if (p->type == GM_WORK_EXCEPTION && r) {
        /* clients without the "exceptions" option learn of it as a fail;
         * gearmand's WORK_FAIL then carries an empty second argument */
        struct gm_packet fail = {.type = GM_WORK_FAIL, .nargs = 2};
        fail.arg[0] = p->arg[0], fail.arg_len[0] = p->arg_len[0];
        fail.arg[1] = "", fail.arg_len[1] = 0;
        for (uint32_t i = 0; i < r->listener_count; i++) {
            struct gm_session *l = r->listeners[i];
            if (l->exceptions) continue;
            reply(l, GM_WORK_FAIL, fail.nargs, fail.arg, fail.arg_len);
            bg_stream_wake(&l->stream);
        }
    }
    if (r) record_remove(g, r);
    bg_delete(&s->client, id, now);
}

/* ---- clients ----------------------------------------------------------- */

/* The beanstalk priority of a submit type: HIGH 512, NORMAL 1024, LOW 2048. */
static uint32_t submit_priority(uint32_t t)
{
    switch (t) {
    case GM_SUBMIT_JOB_HIGH: case GM_SUBMIT_JOB_HIGH_BG: return 512;
    case GM_SUBMIT_JOB_LOW: case GM_SUBMIT_JOB_LOW_BG: return 2048;
    default: return 1024;
    }
}

static int submit_is_foreground(uint32_t t)
{
    return t == GM_SUBMIT_JOB || t == GM_SUBMIT_JOB_HIGH || t == GM_SUBMIT_JOB_LOW;
}

/* Count a tube's jobs that are not done: ready, delayed, reserved, buried. */
static uint64_t tube_job_total(const struct bg_tube *t)
{
    return (uint64_t)t->ready.len + t->delayed.len + t->reserved.len + t->buried.len;
}

/* The ERROR code of a put the engine refused. */
static const char *put_error_code(int outcome)
{
    switch (outcome) {
    case BG_DRAINING: return "DRAINING";
    case BG_LOG_UNAVAILABLE: return "LOG_UNAVAILABLE";
    case BG_MEMORY_CEILING: return "OUT_OF_MEMORY";
    default: return "MEMORY_ALLOCATION_FAILURE";
    }
}

/* SUBMIT_JOB and its variants, SUBMIT_JOB_EPOCH. */
static void submit(struct gm_session *s, const struct gm_packet *p, bg_time now)
{
    struct gm_server *g = s->g;
    struct bg_engine *e = g->engine;
    char tube[BG_TUBE_NAME_MAX + 1], handle[GM_HANDLE_MAX + 1];
    if (gm_function_to_tube(p->arg[0], p->arg_len[0], tube) < 0) {
        reply_error(s, "INVALID_FUNCTION_NAME", "function name is empty or too long");
        return;
    }
    if (!permitted(s, BG_SCOPE_PRODUCE, tube, 0)) return;
    const char *unique = p->arg[1];
    uint32_t unique_len = p->arg_len[1];
    int fg = submit_is_foreground(p->type);
    /* a unique id already queued or running names the same job */
    if (unique_len) {
        struct gm_record *r = record_find_unique(g, tube, unique, unique_len);
        if (r && !bg_job_find(e, r->id)) {
            record_remove(g, r); /* ended outside Gearman */
            r = NULL;
        }
        if (r) {
            if (fg && record_listen(r, s) != 0) {
                s->stream.closing = 1;
                return;
            }
            job_handle(g, r->id, handle);
            reply_strings(s, GM_JOB_CREATED, 1, handle);
            return;
        }
    }
    struct gm_function *f = function_get(g, tube, 1);
    if (f && f->max_queue) {
        struct bg_tube *t = bg_tube_find(e, tube);
        if (t && tube_job_total(t) >= f->max_queue) {
            reply_error(s, "QUEUE_ERROR", "Job queue is full");
            return;
        }
    }
    const char *data = p->arg[p->nargs - 1];
    uint32_t data_len = p->arg_len[p->nargs - 1];
    if (data_len > e->max_job_size) {
        reply_error(s, "JOB_TOO_BIG", "the workload is over the server's -z limit");
        return;
    }
    uint32_t delay = 0;
    if (p->type == GM_SUBMIT_JOB_EPOCH) {
        uint64_t epoch;
        if (bg_parse_u64(p->arg[2], p->arg_len[2], UINT64_MAX, &epoch) != 0) {
            reply_error(s, "INVALID_ARGUMENT",
                        "SUBMIT_JOB_EPOCH needs the time as decimal Unix seconds (digits only, at most 18446744073709551615)");
            return;
        }
        uint64_t wall = g->hooks.wall_s(g->hooks.ctx);
        if (epoch > wall) {
            uint64_t d = epoch - wall;
            delay = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        }
    }
    if (e->draining) {
        reply_error(s, "DRAINING", "the server is draining and takes no new jobs");
        return;
    }
    uint64_t id;
    bg_client_mark_producer(&s->client);
    int rc = bg_put_copy(&s->client, tube, submit_priority(p->type), delay, GM_SUBMIT_TTR, data, data_len,
                         now, &id);
    if (rc != 0) {
        reply_error(s, put_error_code(rc),
                    rc == BG_LOG_UNAVAILABLE ? "the write-ahead log cannot write: no job is taken until it can"
                    : rc == BG_MEMORY_CEILING ? "the jobs held reach the server's job-memory ceiling "
                                                "(--max-job-memory): no job is taken until some are done"
                    : bg_outcome_word(rc));
        return;
    }
    if (fg || unique_len) {
        struct gm_record *r = record_add(g, id, tube, unique, unique_len);
        if (!r || (fg && record_listen(r, s) != 0)) {
            s->stream.closing = 1;
            return;
        }
    }
    job_handle(g, id, handle);
    reply_strings(s, GM_JOB_CREATED, 1, handle);
}

/* GET_STATUS: STATUS_RES handle, known, running, numerator, denominator. */
static void get_status(struct gm_session *s, const struct gm_packet *p)
{
    struct gm_server *g = s->g;
    uint64_t id = handle_id(p->arg[0], p->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(g->engine, id) : NULL;
    if (j && !sees(s, j->tube->name)) j = NULL; /* not there for this scope */
    if (j && !permitted(s, BG_SCOPE_READ, j->tube->name, 0)) return;
    struct gm_record *r = j ? record_find(g, id) : NULL;
    const char *arg[5] = {p->arg[0], j ? "1" : "0", j && j->state == BG_JOB_RESERVED ? "1" : "0",
                          r ? r->numerator : "0", r ? r->denominator : "0"};
    uint32_t len[5] = {p->arg_len[0], 1, 1, (uint32_t)strlen(arg[3]), (uint32_t)strlen(arg[4])};
    reply(s, GM_STATUS_RES, 5, arg, len);
}

/* GET_STATUS_UNIQUE: STATUS_RES_UNIQUE unique, known, running, numerator,
 * denominator, waiting clients. */
static void get_status_unique(struct gm_session *s, const struct gm_packet *p)
{
    struct gm_server *g = s->g;
    struct gm_record *r = record_find_unique(g, NULL, p->arg[0], p->arg_len[0]);
    struct bg_job *j = r ? bg_job_find(g->engine, r->id) : NULL;
    if (j && !sees(s, j->tube->name)) j = NULL; /* not there for this scope */
    if (j && !permitted(s, BG_SCOPE_READ, j->tube->name, 0)) return;
    char waiting[16];
    snprintf(waiting, sizeof waiting, "%u", j ? r->listener_count : 0);
    const char *arg[6] = {p->arg[0], j ? "1" : "0", j && j->state == BG_JOB_RESERVED ? "1" : "0",
                          j ? r->numerator : "0", j ? r->denominator : "0", waiting};
    uint32_t len[6] = {p->arg_len[0], 1, 1, (uint32_t)strlen(arg[3]), (uint32_t)strlen(arg[4]),
                       (uint32_t)strlen(waiting)};
    reply(s, GM_STATUS_RES_UNIQUE, 6, arg, len);
}

/* Run one parsed request. */
static void run_packet(struct gm_session *s, const struct gm_packet *p, bg_time now)
{
    int cmd = gm_request_command(p->type);
    if (cmd >= 0) bg_count_cmd(s->g->engine, (enum bg_cmd)cmd, 1);
    switch (p->type) {
    case GM_CAN_DO: can_do(s, p->arg[0], p->arg_len[0], 0); break;
    case GM_CAN_DO_TIMEOUT: {
        uint64_t timeout;
        if (bg_parse_u64(p->arg[1], p->arg_len[1], UINT32_MAX, &timeout) != 0)
            reply_error(s, "INVALID_ARGUMENT",
                        "CAN_DO_TIMEOUT needs the timeout as decimal seconds (digits only, at most 4294967295)");
        else
            can_do(s, p->arg[0], p->arg_len[0], (uint32_t)timeout);
        break;
    }
    case GM_CANT_DO: {
        char tube[BG_TUBE_NAME_MAX + 1];
        if (gm_function_to_tube(p->arg[0], p->arg_len[0], tube) < 0) break;
        long i = ability_find(s, tube);
        if (i >= 0) drop_ability(s, (uint32_t)i);
        break;
    }
    case GM_RESET_ABILITIES:
        while (s->ability_count) drop_ability(s, s->ability_count - 1);
        break;
    case GM_PRE_SLEEP: pre_sleep(s); break;
    case GM_GRAB_JOB: case GM_GRAB_JOB_UNIQ: case GM_GRAB_JOB_ALL: grab(s, p->type, now); break;
    case GM_WORK_DATA: case GM_WORK_WARNING: case GM_WORK_STATUS: case GM_WORK_COMPLETE:
    case GM_WORK_FAIL: case GM_WORK_EXCEPTION:
        work_result(s, p, now);
        break;
    case GM_SUBMIT_JOB: case GM_SUBMIT_JOB_BG: case GM_SUBMIT_JOB_HIGH: case GM_SUBMIT_JOB_HIGH_BG:
    case GM_SUBMIT_JOB_LOW: case GM_SUBMIT_JOB_LOW_BG: case GM_SUBMIT_JOB_EPOCH:
        submit(s, p, now);
        break;
    case GM_SUBMIT_JOB_SCHED:
        reply_error(s, "NOT_SUPPORTED", "SUBMIT_JOB_SCHED is not supported; use SUBMIT_JOB_EPOCH");
        break;
    case GM_SUBMIT_REDUCE_JOB: case GM_SUBMIT_REDUCE_JOB_BACKGROUND:
        reply_error(s, "NOT_SUPPORTED", "map/reduce jobs are not supported");
        break;
    case GM_GET_STATUS: get_status(s, p); break;
    case GM_GET_STATUS_UNIQUE: get_status_unique(s, p); break;
    case GM_ECHO_REQ: reply(s, GM_ECHO_RES, 1, p->arg, p->arg_len); break;
    case GM_OPTION_REQ:
        if (p->arg_len[0] == 10 && memcmp(p->arg[0], "exceptions", 10) == 0) {
            s->exceptions = 1;
            reply(s, GM_OPTION_RES, 1, p->arg, p->arg_len);
        } else {
            reply_error(s, "UNKNOWN_OPTION", "Server does not recognize given option");
        }
        break;
    case GM_SET_CLIENT_ID:
        snprintf(s->client_id, sizeof s->client_id, "%.*s", (int)p->arg_len[0], p->arg[0]);
        break;
    case GM_ALL_YOURS: break; /* a hint for gearmand's own scheduling */
    default: break;
    }
}

/* ---- the admin protocol ------------------------------------------------- */

/* Append function name of `tube` (decoded) to s's output. */
static void admin_function(struct gm_session *s, const char *tube)
{
    char fn[GM_FUNCTION_MAX + 1];
    int fn_len = gm_tube_to_function(tube, fn, sizeof fn);
    if (fn_len >= 0) admin_text(s, fn, (size_t)fn_len);
}

/* `status`: every function seen over Gearman, and every tube holding
 * jobs (put over beanstalk or HTTP, or recovered from the log), newest
 * first. */
static void admin_status(struct gm_session *s)
{
    struct gm_server *g = s->g;
    struct bg_engine *e = g->engine;
    for (uint32_t i = 0; i < e->tube_count; i++)
        if (tube_job_total(e->tube_list[i])) function_get(g, e->tube_list[i]->name, 1);
    for (struct gm_function *f = g->function_list; f; f = f->list_next) {
        if (!sees(s, f->tube)) continue;
        struct bg_tube *t = bg_tube_find(e, f->tube);
        uint64_t workers = 0;
        for (struct gm_session *w = g->sessions; w; w = w->next)
            if (ability_find(w, f->tube) >= 0) workers++;
        admin_function(s, f->tube);
        admin_printf(s, "\t%llu\t%llu\t%llu\n", (unsigned long long)(t ? tube_job_total(t) : 0),
                     (unsigned long long)(t ? t->reserved.len : 0), (unsigned long long)workers);
    }
    admin_text(s, ".\n", 2);
}

/* Whether `workers` shows connection w to s: every one, or under a scope
 * those with a function the scope sees (and only those functions). */
static int worker_shown(const struct gm_session *s, const struct gm_session *w)
{
    if (!s->scope) return 1;
    for (uint32_t i = 0; i < w->ability_count; i++)
        if (sees(s, w->abilities[i].tube)) return 1;
    return 0;
}

static void admin_workers(struct gm_session *s)
{
    for (struct gm_session *w = s->g->sessions; w; w = w->next) {
        if (!worker_shown(s, w)) continue;
        admin_printf(s, "%d %s %s :", w->peer_fd, w->peer, w->client_id[0] ? w->client_id : "-");
        for (uint32_t i = w->ability_count; i-- > 0;) { /* newest first, as gearmand */
            if (!sees(s, w->abilities[i].tube)) continue;
            admin_text(s, " ", 1);
            admin_function(s, w->abilities[i].tube);
        }
        admin_text(s, "\n", 1);
    }
    admin_text(s, ".\n", 2);
}

/* "show jobs": one line per job with Gearman state: handle, retries (0),
 * ignore (0), queued (1 unless running). "show unique jobs": their
 * unique ids. */
static void admin_show_jobs(struct gm_session *s, int unique)
{
    struct gm_server *g = s->g;
    for (size_t i = 0; g->by_id.slot && i <= g->by_id.mask; i++)
        for (struct gm_record *r = g->by_id.slot[i]; r; r = r->id_next) {
            struct bg_job *j = bg_job_find(g->engine, r->id);
            if (!j || !sees(s, j->tube->name)) continue;
            if (unique) {
                if (r->unique[0]) admin_printf(s, "%s\n", r->unique);
                continue;
            }
            char handle[GM_HANDLE_MAX + 1];
            job_handle(g, r->id, handle);
            admin_printf(s, "%s\t0\t0\t%d\n", handle, j->state != BG_JOB_RESERVED);
        }
    admin_text(s, ".\n", 2);
}

/* gearmand's error line: spaces in the text become '+'. */
static void admin_error(struct gm_session *s, const char *code, const char *text, const char *word,
                        uint32_t word_len)
{
    admin_printf(s, "ERR %s ", code);
    for (const char *p = text; *p; p++) admin_text(s, *p == ' ' ? "+" : p, 1);
    if (word) admin_text(s, word, word_len);
    admin_text(s, "\r\n", 2);
}

static void admin_maxqueue(struct gm_session *s, const struct gm_admin_line *l)
{
    if (l->nargs < 1) {
        admin_error(s, "INVALID_ARGUMENTS",
                    "An incomplete set of arguments was sent to this command ", "maxqueue", 8);
        return;
    }
    uint64_t max[GM_ADMIN_ARGS_MAX] = {0};
    for (uint32_t i = 1; i < l->nargs; i++)
        if (bg_parse_u64(l->arg[i], l->arg_len[i], UINT32_MAX, &max[i]) != 0) {
            admin_error(s, "INVALID_ARGUMENTS", "maxqueue takes sizes from 0 to 4294967295, digits only, not ",
                        l->arg[i], l->arg_len[i]);
            return;
        }
    char tube[BG_TUBE_NAME_MAX + 1];
    struct gm_function *f = NULL;
    int tube_len = gm_function_to_tube(l->arg[0], l->arg_len[0], tube);
    if (tube_len >= 0 && !permitted(s, BG_SCOPE_MANAGE, tube, 1)) return;
    if (tube_len >= 0) f = function_get(s->g, tube, 1);
    if (!f) {
        admin_error(s, "INVALID_ARGUMENTS", "function name is empty or too long, or too many functions", NULL, 0);
        return;
    }
    f->max_queue = (uint32_t)max[1]; /* the first size, for every priority; none: no limit */
    admin_text(s, "OK\r\n", 4);
}

/* "cancel job HANDLE": a job not yet running is deleted (its foreground
 * clients get WORK_FAIL); "ERR UNKNOWN_JOB" otherwise. */
static void admin_cancel_job(struct gm_session *s, const struct gm_admin_line *l, bg_time now)
{
    struct gm_server *g = s->g;
    uint64_t id = handle_id(l->arg[0], l->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(g->engine, id) : NULL;
    if (j && !sees(s, j->tube->name)) {
        s->g->engine->stat.permission_denied++; /* not there for this scope */
        j = NULL;
    }
    if (!j || j->state == BG_JOB_RESERVED) {
        admin_text(s, "ERR UNKNOWN_JOB\r\n", 17);
        return;
    }
    if (!permitted(s, BG_SCOPE_MANAGE, j->tube->name, 1)) return;
    struct gm_record *r = record_find(g, id);
    if (r) {
        struct gm_packet fail = {.type = GM_WORK_FAIL, .nargs = 1};
        fail.arg[0] = l->arg[0], fail.arg_len[0] = l->arg_len[0];
        forward(r, GM_WORK_FAIL, &fail);
        record_remove(g, r);
    }
    bg_delete(&g->holder, id, now);
    admin_text(s, "OK\r\n", 4);
}

/* `shutdown [graceful]` (only with admin_shutdown). */
static void admin_shutdown(struct gm_session *s, const struct gm_admin_line *l)
{
    struct gm_server *g = s->g;
    admin_text(s, "OK\n", 3);
    if (l->nargs == 0) {
        g->hooks.stop(g->hooks.ctx, GM_STOP_NOW);
        return;
    }
    /* graceful: take no new jobs or Gearman connections; stop once no
     * Gearman worker holds a job (the sweep checks) */
    g->graceful = 1;
    bg_engine_drain(g->engine);
    g->hooks.stop(g->hooks.ctx, GM_STOP_GRACEFUL);
}

/* Answer one admin line; the forms gearmand rejects by their argument
 * count are listed above gm_admin_parse (core/gearman.h). */
static void run_admin(struct gm_session *s, const struct gm_admin_line *l, bg_time now)
{
    struct gm_server *g = s->g;
    int word_is_show = l->word_len == 4 && strncasecmp(l->word, "show", 4) == 0;
    int word_is_cancel = l->word_len == 6 && strncasecmp(l->word, "cancel", 6) == 0;
    if (((l->cmd == GM_ADMIN_SHOW_JOBS || l->cmd == GM_ADMIN_SHOW_UNIQUE_JOBS) && l->nargs) ||
        (l->cmd == GM_ADMIN_UNKNOWN && word_is_show && l->nargs)) {
        admin_text(s, "ERR UNKNOWN_SHOW_ARGUMENTS\r\n", 28);
        return;
    }
    if ((l->cmd == GM_ADMIN_CANCEL_JOB && l->nargs > 1) ||
        (l->cmd == GM_ADMIN_UNKNOWN && word_is_cancel && l->nargs >= 2)) {
        admin_text(s, "ERR UNKNOWN_ERROR\r\n", 19);
        return;
    }
    /* without --gearman-admin-shutdown, `shutdown` in every form is unknown,
     * as in gearmand 1.1.20 (built without it): the Gearman port has no
     * authentication, and the command would stop every protocol */
    if ((l->cmd == GM_ADMIN_CANCEL_JOB && l->nargs == 0) ||
        (l->cmd == GM_ADMIN_SHUTDOWN && !g->admin_shutdown) ||
        (l->cmd == GM_ADMIN_SHUTDOWN && l->nargs &&
         !(l->arg_len[0] == 8 && strncasecmp(l->arg[0], "graceful", 8) == 0))) {
        admin_error(s, "UNKNOWN_COMMAND", "Unknown server command", l->word, l->word_len);
        return;
    }
    int cmd = gm_admin_command(l->cmd);
    if (cmd >= 0) bg_count_cmd(g->engine, (enum bg_cmd)cmd, 1);
    /* under a scope: every admin line needs read on some tube, and
     * `shutdown` (which stops every protocol) is for unscoped sessions */
    if (s->scope && l->cmd == GM_ADMIN_SHUTDOWN) {
        g->engine->stat.permission_denied++;
        admin_printf(s, "ERR PERMISSION_DENIED manage:*\r\n");
        return;
    }
    if (s->scope && l->cmd != GM_ADMIN_UNKNOWN && !permitted_some(s, BG_SCOPE_READ)) return;
    size_t before = s->stream.out.len;
    switch (l->cmd) {
    case GM_ADMIN_STATUS: admin_status(s); break;
    case GM_ADMIN_WORKERS: admin_workers(s); break;
    case GM_ADMIN_VERSION: admin_printf(s, "OK %s\n", BEANGATE_VERSION); break;
    case GM_ADMIN_GETPID: admin_printf(s, "OK %ld\n", g->hooks.pid); break;
    case GM_ADMIN_MAXQUEUE: admin_maxqueue(s, l); break;
    case GM_ADMIN_SHOW_JOBS: admin_show_jobs(s, 0); break;
    case GM_ADMIN_SHOW_UNIQUE_JOBS: admin_show_jobs(s, 1); break;
    case GM_ADMIN_CANCEL_JOB: admin_cancel_job(s, l, now); break;
    case GM_ADMIN_VERBOSE: admin_printf(s, "OK %s\n", g->hooks.verbosity(g->hooks.ctx)); break;
    case GM_ADMIN_SHUTDOWN: admin_shutdown(s, l); break;
    default:
        admin_error(s, "UNKNOWN_COMMAND", "Unknown server command", l->word, l->word_len);
        break;
    }
    /* an answer (status, workers, show jobs and show unique jobs are the
     * ones that grow) larger than the replies' budget allows now is taken
     * back for an error line; the connection layer gives the room back */
    size_t made = s->stream.out.len - before;
    if (s->stream.budget && !bg_reply_fits(s->stream.budget, before, made)) {
        s->stream.out.len = before;
        admin_error(s, "OUT_OF_MEMORY", "the server holds as many unsent replies as it may", NULL, 0);
    }
}

/* ---- sessions ----------------------------------------------------------- */

size_t gm_session_feed(struct gm_session *s, const char *in, size_t len, bg_time now)
{
    struct gm_server *g = s->g;
    struct bg_stream *st = &s->stream;
    size_t off = 0;
    while (!st->closing && off < len && !(st->out_limit && st->out.len >= st->out_limit)) {
        const char *data = in + off;
        size_t avail = len - off;
        int used;
        if (data[0] != '\0') {
            struct gm_admin_line line;
            used = gm_admin_parse(data, avail, &line);
            if (used == 0) break;
            if (used < 0) {
                admin_error(s, "BAD_LINE", line.fault == GM_FAULT_ARGS ? "too many words" : "line over 4096 bytes",
                            NULL, 0);
                st->closing = 1;
                break;
            }
            size_t line_len = (size_t)used - 1;
            if (line_len && data[line_len - 1] == '\r') line_len--;
            if (bg_line_is_http(data, line_len)) {
                /* a browser's request (docs/gearman.md): nothing of it runs */
                g->engine->stat.cross_protocol_closed++;
                if (g->hooks.cross_protocol) g->hooks.cross_protocol(g->hooks.ctx, s);
                st->closing = 1;
                break;
            }
            bg_engine_catch_up(g->engine, now); /* reads job states */
            run_admin(s, &line, now);
        } else {
            struct gm_packet p;
            used = gm_parse_request(data, avail, g->max_packet, &p);
            if (used == 0) break;
            if (used < 0) {
                const char *code, *text;
                gm_error_text(p.fault, &code, &text);
                reply_error(s, code, text);
                if (g->hooks.bad_request) g->hooks.bad_request(g->hooks.ctx, s, code);
                if (p.fault == GM_FAULT_FIELD) {
                    /* framing is intact (gearmand too answers and goes on):
                     * skip this packet */
                    off += GM_HEADER_SIZE + p.size;
                    continue;
                }
                st->closing = 1;
                break;
            }
            bg_engine_catch_up(g->engine, now); /* reads job states */
            run_packet(s, &p, now);
        }
        off += (size_t)used;
    }
    /* for the request deadline: a packet whose header is in arrives as it
     * comes (its arguments may be a large workload); an admin line or a
     * packet header must arrive whole in time */
    st->phase = len - off >= GM_HEADER_SIZE && in[off] == '\0' ? BG_PHASE_BODY : BG_PHASE_NONE;
    return off;
}

void gm_session_refuse(struct gm_session *s, const char *code, const char *text)
{
    reply_error(s, code, text);
    s->stream.closing = 1;
}

int gm_session_init(struct gm_server *g, struct gm_session *s, int peer_fd, const char *peer_addr)
{
    memset(s, 0, sizeof *s);
    int r = bg_client_init_bare(g->engine, &s->client, &bg_client_ops_never_wait, s);
    if (r != 0) return r;
    s->g = g;
    s->peer_fd = peer_fd;
    snprintf(s->peer, sizeof s->peer, "%s", peer_addr);
    s->next = g->sessions;
    if (g->sessions) g->sessions->prev = s;
    g->sessions = s;
    return 0;
}

void gm_session_close(struct gm_session *s, bg_time now)
{
    struct gm_server *g = s->g;
    if (s->prev) s->prev->next = s->next; else g->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    /* stop listening; a foreground job nobody waits for any more is
     * dropped unless a worker runs it */
    while (s->listening_count) {
        uint64_t id = s->listening[--s->listening_count];
        struct gm_record *r = record_find(g, id);
        if (!r) continue;
        for (uint32_t i = 0; i < r->listener_count; i++)
            if (r->listeners[i] == s) {
                r->listeners[i] = r->listeners[--r->listener_count];
                break;
            }
        if (r->listener_count == 0 && r->foreground) {
            struct bg_job *j = bg_job_find(g->engine, id);
            if (j && j->state != BG_JOB_RESERVED) {
                bg_delete(&g->holder, id, now);
                record_remove(g, r);
            }
        }
    }
    /* the engine gives reserved jobs back as the client closes; their
     * progress starts again, as in gearmand */
    for (struct bg_job *j = s->client.reserved_head; j; j = j->next) {
        struct gm_record *r = record_find(g, j->id);
        if (r) strcpy(r->numerator, "0"), strcpy(r->denominator, "0");
    }
    unsleep(s);
    bg_client_close(&s->client, now);
    bg_buf_free(&s->stream.out);
    bg_free(s->abilities);
    bg_free(s->listening);
    s->abilities = NULL;
    s->listening = NULL;
}

/* ---- the server ---------------------------------------------------------- */

int gm_server_init(struct gm_server *g, struct bg_engine *e, const struct gm_hooks *hooks,
                   uint32_t max_packet, int admin_shutdown, const uint64_t hash_key[2])
{
    memset(g, 0, sizeof *g);
    g->engine = e;
    g->hooks = *hooks;
    g->hash_key[0] = hash_key[0];
    g->hash_key[1] = hash_key[1];
    g->max_packet = max_packet;
    g->admin_shutdown = admin_shutdown != 0;
    int r = bg_client_init_bare(e, &g->holder, &bg_client_ops_never_wait, NULL);
    if (r != 0) return r;
    e->job_ready = engine_job_ready;
    e->job_ready_ctx = g;
    return 0;
}

void gm_server_destroy(struct gm_server *g, bg_time now)
{
    if (g->engine->job_ready_ctx == g) {
        g->engine->job_ready = NULL;
        g->engine->job_ready_ctx = NULL;
    }
    for (size_t i = 0; g->by_id.slot && i <= g->by_id.mask; i++)
        while (g->by_id.slot[i]) record_remove(g, g->by_id.slot[i]);
    bg_free(g->by_id.slot);
    bg_free(g->by_unique.slot);
    while (g->function_list) {
        struct gm_function *f = g->function_list;
        g->function_list = f->list_next;
        bg_free(f);
    }
    bg_free(g->functions);
    bg_client_close(&g->holder, now);
}

int gm_server_sweep(struct gm_server *g, size_t budget)
{
    struct bg_engine *e = g->engine;
    for (size_t step = 0; g->by_id.slot && step < budget && step <= g->by_id.mask; step++) {
        size_t i = g->sweep_cursor++ & g->by_id.mask;
        struct gm_record *r = g->by_id.slot[i], *next;
        for (; r; r = next) {
            next = r->id_next;
            if (bg_job_find(e, r->id)) continue;
            char handle[GM_HANDLE_MAX + 1];
            job_handle(g, r->id, handle);
            for (uint32_t k = 0; k < r->listener_count; k++) {
                reply_strings(r->listeners[k], GM_WORK_FAIL, 1, handle);
                bg_stream_wake(&r->listeners[k]->stream);
            }
            record_remove(g, r);
        }
    }
    if (!g->graceful) return 0;
    struct gm_session *s = g->sessions;
    while (s && s->client.reserved.len == 0) s = s->next;
    return s == NULL;
}

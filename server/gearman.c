/* gearman.c - the Gearman front-end: a third protocol on the same engine.
 *
 * A function is a tube (core/gearman.h encodes names that are not tube
 * names). A submitted job is a beanstalk job in that tube; a worker is an
 * engine client that watches the tubes of its abilities. What gearmand
 * keeps beside the queue (foreground listeners, unique ids, WORK_STATUS
 * numbers) lives here, in a table of records by job id, only for the jobs
 * that need one. Handlers only append to output buffers; gm_flush writes.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server.h"
#include "../io/listen.h"
#include "../io/loop.h"
#include "../io/wal.h"
#include "../io/eventlog.h"
#include "../core/gearman.h"

#define GM_READ_CHUNK 65536
#define GM_IN_SLACK 4096               /* header + function + unique + NULs */
#define GM_OUT_HARD_LIMIT (64u << 20)  /* results for a client that does not read */
#define GM_FUNCTIONS_MAX 65536         /* functions listed by `status` */
#define GM_SWEEP_MS 100                /* a sweep step runs this often */
#define GM_SWEEP_BUCKETS 1024          /* record buckets looked at per step */

/* ---- the state kept beside the queue ----------------------------------- */

struct gm_conn;

/* One job that has Gearman state: listeners, a unique id or a status. */
struct gm_record {
    uint64_t id;
    struct gm_record *id_next, *unique_next;
    struct gm_conn **listeners;    /* foreground clients waiting for results */
    uint32_t listener_count, listener_cap;
    char tube[BG_TUBE_NAME_MAX + 1];
    char unique[GM_UNIQUE_MAX + 1];
    char numerator[24], denominator[24]; /* the last WORK_STATUS */
    uint8_t foreground;
};

/* A hash table of records, chained through one of their next pointers. */
struct gm_table {
    struct gm_record **slot;
    size_t mask, count;
};

/* A worker ability: the tube of a CAN_DO, and its CAN_DO_TIMEOUT. */
struct gm_ability {
    char tube[BG_TUBE_NAME_MAX + 1];
    struct bg_tube *tube_ptr;      /* the tube, alive while the worker watches it */
    uint32_t timeout_s;
};

struct gm_conn {
    struct gearman *g;
    int fd;
    struct event *read_ev, *write_ev;
    struct bg_buf in, out;
    struct gm_conn *prev, *next;   /* g->conns */
    struct loop_task woken;        /* output came from outside its callback */
    struct bg_client client;       /* the engine's view: bare, watches abilities */
    struct gm_ability *abilities;
    uint32_t ability_count, ability_cap;
    uint64_t *listening;           /* ids of the records this client listens to */
    uint32_t listening_count, listening_cap;
    struct gm_conn *sleep_prev, *sleep_next; /* g->sleepers, while sleeping */
    uint64_t mark;                 /* output waits until the log holds this */
    struct wal_hold hold;          /* queued at the log while held */
    uint8_t held;
    char peer[INET6_ADDRSTRLEN];
    char client_id[GM_CLIENT_ID_MAX + 1];
    uint8_t sleeping, exceptions, peer_eof, closing, read_paused;
    uint8_t overflow;              /* over GM_OUT_HARD_LIMIT: dropped on its next run */
};

/* A function seen over Gearman (for `status`), by tube name. */
struct gm_function {
    struct gm_function *next;      /* hash chain */
    struct gm_function *list_next; /* newest first */
    uint32_t max_queue;            /* maxqueue; 0: no limit */
    char tube[];
};

struct gearman {
    struct server *srv;
    int listen_fd;
    struct event *listen_ev, *sweep_ev;
    struct gm_conn *conns;
    struct gm_conn *sleepers;      /* workers after PRE_SLEEP, not yet woken */
    struct bg_client holder;       /* deletes jobs whose clients all left */
    struct gm_table by_id, by_unique;
    struct gm_function **functions; /* hash of gm_function by tube */
    size_t functions_mask, function_count;
    struct gm_function *function_list; /* newest first */
    uint32_t max_packet;           /* largest request size accepted */
    size_t sweep_cursor;           /* next record bucket the sweep looks at */
    uint8_t graceful;              /* `shutdown graceful`: stop when workers are done */
    uint8_t admin_shutdown;        /* --gearman-admin-shutdown: `shutdown` is a command */
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_id(uint64_t id) { return id * 0x9E3779B97F4A7C15ull; }

/* Grow table t to hold one more record; 0 or BG_OUT_OF_MEMORY. `by_unique`
 * says which chain the table uses. */
static int table_grow(struct gm_table *t, int by_unique)
{
    if (t->slot && t->count < t->mask + 1) return 0;
    size_t n = t->slot ? (t->mask + 1) * 2 : 64;
    struct gm_record **slot = calloc(n, sizeof *slot);
    if (!slot) return BG_OUT_OF_MEMORY;
    for (size_t i = 0; t->slot && i <= t->mask; i++) {
        struct gm_record *r = t->slot[i], *next;
        for (; r; r = next) {
            next = by_unique ? r->unique_next : r->id_next;
            uint64_t h = by_unique ? hash_bytes(r->unique, strlen(r->unique)) : hash_id(r->id);
            struct gm_record **head = &slot[h & (n - 1)];
            if (by_unique) r->unique_next = *head; else r->id_next = *head;
            *head = r;
        }
    }
    free(t->slot);
    t->slot = slot;
    t->mask = n - 1;
    return 0;
}

/* The record of job id, or NULL. */
static struct gm_record *record_find(struct gearman *g, uint64_t id)
{
    if (!g->by_id.slot) return NULL;
    struct gm_record *r = g->by_id.slot[hash_id(id) & g->by_id.mask];
    while (r && r->id != id) r = r->id_next;
    return r;
}

/* The record of the job with this tube and unique id, or NULL. */
static struct gm_record *record_find_unique(struct gearman *g, const char *tube, const char *unique,
                                            size_t unique_len)
{
    if (!g->by_unique.slot) return NULL;
    struct gm_record *r = g->by_unique.slot[hash_bytes(unique, unique_len) & g->by_unique.mask];
    for (; r; r = r->unique_next)
        if (strlen(r->unique) == unique_len && memcmp(r->unique, unique, unique_len) == 0 &&
            (!tube || strcmp(r->tube, tube) == 0))
            return r;
    return NULL;
}

/* A new record for job id in tube (with unique id, may be empty). NULL:
 * out of memory. */
static struct gm_record *record_add(struct gearman *g, uint64_t id, const char *tube,
                                    const char *unique, size_t unique_len)
{
    if (table_grow(&g->by_id, 0) != 0 || table_grow(&g->by_unique, 1) != 0) return NULL;
    struct gm_record *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = id;
    snprintf(r->tube, sizeof r->tube, "%s", tube);
    memcpy(r->unique, unique, unique_len);
    strcpy(r->numerator, "0");
    strcpy(r->denominator, "0");
    struct gm_record **head = &g->by_id.slot[hash_id(id) & g->by_id.mask];
    r->id_next = *head;
    *head = r;
    g->by_id.count++;
    if (unique_len) {
        head = &g->by_unique.slot[hash_bytes(unique, unique_len) & g->by_unique.mask];
        r->unique_next = *head;
        *head = r;
        g->by_unique.count++;
    }
    return r;
}

static void conn_forget_listening(struct gm_conn *c, uint64_t id);

/* Unlink and free record r; its listeners stop listening. */
static void record_remove(struct gearman *g, struct gm_record *r)
{
    struct gm_record **p = &g->by_id.slot[hash_id(r->id) & g->by_id.mask];
    while (*p != r) p = &(*p)->id_next;
    *p = r->id_next;
    g->by_id.count--;
    if (r->unique[0]) {
        p = &g->by_unique.slot[hash_bytes(r->unique, strlen(r->unique)) & g->by_unique.mask];
        while (*p != r) p = &(*p)->unique_next;
        *p = r->unique_next;
        g->by_unique.count--;
    }
    for (uint32_t i = 0; i < r->listener_count; i++) conn_forget_listening(r->listeners[i], r->id);
    free(r->listeners);
    free(r);
}

/* Add c as a listener of r (once). 0 or BG_OUT_OF_MEMORY. */
static int record_listen(struct gm_record *r, struct gm_conn *c)
{
    for (uint32_t i = 0; i < r->listener_count; i++)
        if (r->listeners[i] == c) return 0;
    if (r->listener_count == r->listener_cap) {
        uint32_t n = r->listener_cap ? r->listener_cap * 2 : 2;
        struct gm_conn **l = realloc(r->listeners, n * sizeof *l);
        if (!l) return BG_OUT_OF_MEMORY;
        r->listeners = l, r->listener_cap = n;
    }
    if (c->listening_count == c->listening_cap) {
        uint32_t n = c->listening_cap ? c->listening_cap * 2 : 4;
        uint64_t *l = realloc(c->listening, n * sizeof *l);
        if (!l) return BG_OUT_OF_MEMORY;
        c->listening = l, c->listening_cap = n;
    }
    r->listeners[r->listener_count++] = c;
    c->listening[c->listening_count++] = r->id;
    r->foreground = 1;
    return 0;
}

/* Drop id from c's listening list (the record is going away). */
static void conn_forget_listening(struct gm_conn *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->listening_count; i++)
        if (c->listening[i] == id) {
            c->listening[i] = c->listening[--c->listening_count];
            return;
        }
}

/* ---- functions seen ----------------------------------------------------- */

/* Forget functions whose tube is gone (no jobs, no watchers) and that
 * have no queue limit: the list must not grow with every name a client
 * ever sent. */
static void function_prune(struct gearman *g)
{
    struct gm_function **p = &g->function_list;
    while (*p) {
        struct gm_function *f = *p;
        if (f->max_queue || bg_tube_find(&g->srv->engine, f->tube)) {
            p = &f->list_next;
            continue;
        }
        *p = f->list_next;
        struct gm_function **h = &g->functions[hash_bytes(f->tube, strlen(f->tube)) & g->functions_mask];
        while (*h != f) h = &(*h)->next;
        *h = f->next;
        g->function_count--;
        free(f);
    }
}

/* The entry of tube in the function list, added if `add`; NULL if absent,
 * out of memory, or the list is full (GM_FUNCTIONS_MAX functions that
 * still have a tube: the function works, `status` does not list it). */
static struct gm_function *function_get(struct gearman *g, const char *tube, int add)
{
    size_t len = strlen(tube);
    uint64_t h = hash_bytes(tube, len);
    if (g->functions) {
        for (struct gm_function *f = g->functions[h & g->functions_mask]; f; f = f->next)
            if (strcmp(f->tube, tube) == 0) return f;
    }
    if (!add) return NULL;
    if (g->function_count >= GM_FUNCTIONS_MAX) function_prune(g);
    if (g->function_count >= GM_FUNCTIONS_MAX) return NULL;
    if (!g->functions || g->function_count > g->functions_mask) {
        size_t n = g->functions ? (g->functions_mask + 1) * 2 : 64;
        struct gm_function **t = calloc(n, sizeof *t);
        if (!t) return NULL;
        for (struct gm_function *f = g->function_list; f; f = f->list_next) {
            uint64_t fh = hash_bytes(f->tube, strlen(f->tube));
            f->next = t[fh & (n - 1)];
            t[fh & (n - 1)] = f;
        }
        free(g->functions);
        g->functions = t;
        g->functions_mask = n - 1;
    }
    struct gm_function *f = calloc(1, sizeof *f + len + 1);
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

static void conn_wake(struct gm_conn *c) { loop_defer(&c->woken); }

/* Append a response packet of type t with n arguments to c's output. A
 * connection's own requests stop at CONN_OUT_HIGH_WATER, but results other
 * connections send it do not: past GM_OUT_HARD_LIMIT it is dropped. */
static void reply(struct gm_conn *c, uint32_t t, uint32_t n, const char *const *arg,
                  const uint32_t *len)
{
    if (c->overflow) return;
    if (c->out.len > GM_OUT_HARD_LIMIT) {
        c->overflow = 1;
        conn_wake(c);
        return;
    }
    if (gm_encode_response(&c->out, t, n, arg, len) != 0) c->closing = 1;
}

/* Append a response whose arguments are NUL-terminated strings. */
static void reply_strings(struct gm_conn *c, uint32_t t, uint32_t n, ...)
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
    reply(c, t, n, arg, len);
}

/* An ERROR packet (code, text); the connection stays open. */
static void reply_error(struct gm_conn *c, const char *code, const char *text)
{
    reply_strings(c, GM_ERROR, 2, code, text);
}

/* The job handle of job id, in out. */
static void job_handle(struct gearman *g, uint64_t id, char out[GM_HANDLE_MAX + 1])
{
    snprintf(out, GM_HANDLE_MAX + 1, "H:%.32s:%llu", g->srv->hostname, (unsigned long long)id);
}

/* The job id named by a handle "H:host:ID", or 0 when it names none. */
static uint64_t handle_id(const char *h, uint32_t len)
{
    const char *colon = NULL;
    for (uint32_t i = 0; i < len; i++)
        if (h[i] == ':') colon = h + i;
    if (!colon || colon + 1 == h + len || len - (uint32_t)(colon + 1 - h) > 20) return 0;
    uint64_t id = 0;
    for (const char *p = colon + 1; p < h + len; p++) {
        if (*p < '0' || *p > '9') return 0;
        uint64_t next = id * 10 + (uint64_t)(*p - '0');
        if (next < id) return 0;
        id = next;
    }
    return id;
}

/* The leading decimal digits of s[0..len) (gearmand reads numbers with
 * atoi-like leniency: no digits is 0), at most `max`. */
static uint64_t leading_number(const char *s, uint32_t len, uint64_t max)
{
    uint64_t v = 0;
    for (uint32_t i = 0; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > max) return max;
    }
    return v;
}

/* The job's data (its body without the stored CRLF). */
static uint32_t job_data_len(const struct bg_job *j) { return j->body_size - 2; }

/* ---- workers ----------------------------------------------------------- */

static long ability_find(struct gm_conn *c, const char *tube)
{
    for (uint32_t i = 0; i < c->ability_count; i++)
        if (strcmp(c->abilities[i].tube, tube) == 0) return (long)i;
    return -1;
}

/* Nonzero if one of c's functions has a job to take now. */
static int has_ready_job(const struct gm_conn *c)
{
    for (uint32_t i = 0; i < c->ability_count; i++) {
        const struct bg_tube *t = c->abilities[i].tube_ptr;
        if (t->ready.len && !t->pause_ns) return 1;
    }
    return 0;
}

/* Take c off the sleepers list (it grabbed, was woken or is closing). */
static void unsleep(struct gm_conn *c)
{
    if (!c->sleeping) return;
    struct gearman *g = c->g;
    if (c->sleep_prev) c->sleep_prev->sleep_next = c->sleep_next; else g->sleepers = c->sleep_next;
    if (c->sleep_next) c->sleep_next->sleep_prev = c->sleep_prev;
    c->sleep_prev = c->sleep_next = NULL;
    c->sleeping = 0;
    g->srv->engine.waiting--; /* it counted in current-waiting */
}

/* Wake a sleeping worker: one NOOP. The job stays queued (as in gearmand):
 * the worker's GRAB_JOB takes whatever is best then. */
static void wake(struct gm_conn *c)
{
    unsleep(c);
    reply(c, GM_NOOP, 0, NULL, NULL);
    conn_wake(c);
}

/* PRE_SLEEP: NOOP at once if a job is waiting, else sleep until one is. */
static void pre_sleep(struct gm_conn *c)
{
    if (c->sleeping) return;
    if (has_ready_job(c)) {
        reply(c, GM_NOOP, 0, NULL, NULL);
        return;
    }
    struct gearman *g = c->g;
    c->sleeping = 1;
    c->sleep_prev = NULL;
    c->sleep_next = g->sleepers;
    if (g->sleepers) g->sleepers->sleep_prev = c;
    g->sleepers = c;
    g->srv->engine.waiting++;
}

/* The engine's job_ready hook: tube t has jobs nobody took. Wake the
 * sleeping workers that can do them. Runs inside engine calls: it only
 * appends NOOPs. */
static void engine_job_ready(void *ctx, struct bg_tube *t)
{
    struct gearman *g = ctx;
    struct gm_conn *c = g->sleepers, *next;
    for (; c; c = next) {
        next = c->sleep_next;
        for (uint32_t i = 0; i < c->ability_count; i++)
            if (c->abilities[i].tube_ptr == t) {
                wake(c);
                break;
            }
    }
}

/* CAN_DO / CAN_DO_TIMEOUT: watch the function's tube. */
static void can_do(struct gm_conn *c, const char *fn, uint32_t fn_len, uint32_t timeout_s)
{
    char tube[BG_TUBE_NAME_MAX + 1];
    if (gm_function_to_tube(fn, fn_len, tube) < 0) {
        reply_error(c, "INVALID_FUNCTION_NAME", "function name is empty or too long");
        return;
    }
    long i = ability_find(c, tube);
    if (i >= 0) {
        c->abilities[i].timeout_s = timeout_s;
        return;
    }
    if (c->ability_count == c->ability_cap) {
        uint32_t n = c->ability_cap ? c->ability_cap * 2 : 4;
        if (n > 4096) {
            reply_error(c, "TOO_MANY_ABILITIES", "a worker may register at most 4096 functions");
            return;
        }
        struct gm_ability *a = realloc(c->abilities, n * sizeof *a);
        if (!a) {
            c->closing = 1;
            return;
        }
        c->abilities = a, c->ability_cap = n;
    }
    uint32_t count;
    function_get(c->g, tube, 1); /* for `status`; a full list does not stop a worker */
    if (bg_client_watch(&c->client, tube, &count) != 0) {
        c->closing = 1;
        return;
    }
    struct gm_ability *a = &c->abilities[c->ability_count++];
    memcpy(a->tube, tube, sizeof a->tube);
    a->tube_ptr = bg_tube_find(&c->g->srv->engine, tube); /* alive while watched */
    a->timeout_s = timeout_s;
    bg_client_mark_worker(&c->client);
    if (c->sleeping && has_ready_job(c)) wake(c);
}

/* Forget ability i (CANT_DO, RESET_ABILITIES). */
static void drop_ability(struct gm_conn *c, uint32_t i)
{
    bg_client_unwatch(&c->client, c->abilities[i].tube);
    c->ability_count--;
    memmove(&c->abilities[i], &c->abilities[i + 1], (c->ability_count - i) * sizeof c->abilities[0]);
}

/* Hand job j (reserved by c) to the worker: JOB_ASSIGN for GRAB_JOB,
 * JOB_ASSIGN_UNIQ for GRAB_JOB_UNIQ and (as gearmand answers the stock
 * `gearman -w` worker) for GRAB_JOB_ALL. */
static void assign(struct gm_conn *c, struct bg_job *j, uint32_t grab, bg_time now)
{
    long i = ability_find(c, j->tube->name);
    if (i >= 0 && c->abilities[i].timeout_s) {
        j->ttr_s = c->abilities[i].timeout_s; /* CAN_DO_TIMEOUT is the TTR */
        bg_touch(&c->client, j->id, now);
    }
    char handle[GM_HANDLE_MAX + 1], fn[GM_FUNCTION_MAX + 1];
    job_handle(c->g, j->id, handle);
    int fn_len = gm_tube_to_function(j->tube->name, fn, sizeof fn);
    if (fn_len < 0) fn_len = 0;
    struct gm_record *r = record_find(c->g, j->id);
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
    reply(c, type, n, arg, len);
}

/* GRAB_JOB, GRAB_JOB_UNIQ, GRAB_JOB_ALL. */
static void grab(struct gm_conn *c, uint32_t type, bg_time now)
{
    unsleep(c);
    struct bg_job *j = NULL;
    /* BG_TIMED_OUT, or BG_DEADLINE_SOON (a job it holds is about to time
     * out): NO_JOB */
    if (c->ability_count && bg_reserve(&c->client, 0, now, &j) != 0) j = NULL;
    if (!j) {
        reply(c, GM_NO_JOB, 0, NULL, NULL);
        return;
    }
    assign(c, j, type, now);
}

/* Send packet type t with args to every listener of record r (WORK_*). */
static void forward(struct gm_record *r, uint32_t t, const struct gm_packet *p)
{
    for (uint32_t i = 0; i < r->listener_count; i++) {
        struct gm_conn *l = r->listeners[i];
        if (t == GM_WORK_EXCEPTION && !l->exceptions) continue;
        reply(l, t, p->nargs, p->arg, p->arg_len);
        conn_wake(l);
    }
}

/* WORK_DATA, WORK_WARNING, WORK_STATUS, WORK_COMPLETE, WORK_FAIL,
 * WORK_EXCEPTION from the worker holding the job. */
static void work_result(struct gm_conn *c, const struct gm_packet *p, bg_time now)
{
    struct gearman *g = c->g;
    uint64_t id = handle_id(p->arg[0], p->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(&g->srv->engine, id) : NULL;
    if (!j || j->reserver != &c->client) {
        reply_error(c, "JOB_NOT_FOUND", "Job given in work result not found");
        return;
    }
    struct gm_record *r = record_find(g, id);
    if (p->type == GM_WORK_STATUS) {
        if (!r && !(r = record_add(g, id, j->tube->name, "", 0))) {
            c->closing = 1;
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
            struct gm_conn *l = r->listeners[i];
            if (l->exceptions) continue;
            reply(l, GM_WORK_FAIL, fail.nargs, fail.arg, fail.arg_len);
            conn_wake(l);
        }
    }
    if (r) record_remove(g, r);
    bg_delete(&c->client, id, now);
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

/* Jobs submitted over Gearman have no TTR in gearmand; a day stands in
 * unless the worker's CAN_DO_TIMEOUT says otherwise. */
#define GM_SUBMIT_TTR 86400

/* Count a tube's jobs that are not done: ready, delayed, reserved, buried. */
static uint64_t tube_job_total(const struct bg_tube *t)
{
    return (uint64_t)t->ready.len + t->delayed.len + t->reserved_count + t->buried_count;
}

/* SUBMIT_JOB and its variants, SUBMIT_JOB_EPOCH. */
static void submit(struct gm_conn *c, const struct gm_packet *p, bg_time now)
{
    struct gearman *g = c->g;
    struct bg_engine *e = &g->srv->engine;
    char tube[BG_TUBE_NAME_MAX + 1], handle[GM_HANDLE_MAX + 1];
    if (gm_function_to_tube(p->arg[0], p->arg_len[0], tube) < 0) {
        reply_error(c, "INVALID_FUNCTION_NAME", "function name is empty or too long");
        return;
    }
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
            if (fg && record_listen(r, c) != 0) {
                c->closing = 1;
                return;
            }
            job_handle(g, r->id, handle);
            reply_strings(c, GM_JOB_CREATED, 1, handle);
            return;
        }
    }
    struct gm_function *f = function_get(g, tube, 1);
    if (f && f->max_queue) {
        struct bg_tube *t = bg_tube_find(e, tube);
        if (t && tube_job_total(t) >= f->max_queue) {
            reply_error(c, "QUEUE_ERROR", "Job queue is full");
            return;
        }
    }
    const char *data = p->arg[p->nargs - 1];
    uint32_t data_len = p->arg_len[p->nargs - 1];
    if (data_len > e->max_job_size) {
        reply_error(c, "JOB_TOO_BIG", "the workload is over the server's -z limit");
        return;
    }
    uint32_t delay = 0;
    if (p->type == GM_SUBMIT_JOB_EPOCH) {
        uint64_t epoch = leading_number(p->arg[2], p->arg_len[2], UINT64_MAX / 10);
        time_t wall = time(NULL);
        if (epoch > (uint64_t)wall) {
            uint64_t d = epoch - (uint64_t)wall;
            delay = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        }
    }
    if (e->draining) {
        reply_error(c, "DRAINING", "the server is draining and takes no new jobs");
        return;
    }
    uint64_t id;
    bg_client_mark_producer(&c->client);
    int rc = bg_put_copy(&c->client, tube, submit_priority(p->type), delay, GM_SUBMIT_TTR, data, data_len,
                         now, &id);
    if (rc != 0 && rc != BG_BURIED) {
        reply_error(c, rc == BG_DRAINING ? "DRAINING" : "MEMORY_ALLOCATION_FAILURE", bg_outcome_word(rc));
        return;
    }
    if (fg || unique_len) {
        struct gm_record *r = record_add(g, id, tube, unique, unique_len);
        if (!r || (fg && record_listen(r, c) != 0)) {
            c->closing = 1;
            return;
        }
    }
    job_handle(g, id, handle);
    reply_strings(c, GM_JOB_CREATED, 1, handle);
}

/* GET_STATUS: STATUS_RES handle, known, running, numerator, denominator. */
static void get_status(struct gm_conn *c, const struct gm_packet *p)
{
    struct gearman *g = c->g;
    uint64_t id = handle_id(p->arg[0], p->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(&g->srv->engine, id) : NULL;
    struct gm_record *r = j ? record_find(g, id) : NULL;
    const char *arg[5] = {p->arg[0], j ? "1" : "0", j && j->state == BG_JOB_RESERVED ? "1" : "0",
                          r ? r->numerator : "0", r ? r->denominator : "0"};
    uint32_t len[5] = {p->arg_len[0], 1, 1, (uint32_t)strlen(arg[3]), (uint32_t)strlen(arg[4])};
    reply(c, GM_STATUS_RES, 5, arg, len);
}

/* GET_STATUS_UNIQUE: STATUS_RES_UNIQUE unique, known, running, numerator,
 * denominator, waiting clients. */
static void get_status_unique(struct gm_conn *c, const struct gm_packet *p)
{
    struct gearman *g = c->g;
    struct gm_record *r = record_find_unique(g, NULL, p->arg[0], p->arg_len[0]);
    struct bg_job *j = r ? bg_job_find(&g->srv->engine, r->id) : NULL;
    char waiting[16];
    snprintf(waiting, sizeof waiting, "%u", j ? r->listener_count : 0);
    const char *arg[6] = {p->arg[0], j ? "1" : "0", j && j->state == BG_JOB_RESERVED ? "1" : "0",
                          j ? r->numerator : "0", j ? r->denominator : "0", waiting};
    uint32_t len[6] = {p->arg_len[0], 1, 1, (uint32_t)strlen(arg[3]), (uint32_t)strlen(arg[4]),
                       (uint32_t)strlen(waiting)};
    reply(c, GM_STATUS_RES_UNIQUE, 6, arg, len);
}

/* Run one parsed request. */
static void run_packet(struct gm_conn *c, const struct gm_packet *p, bg_time now)
{
    int cmd = gm_request_command(p->type);
    if (cmd >= 0) bg_count_cmd(&c->g->srv->engine, (enum bg_cmd)cmd, 1);
    switch (p->type) {
    case GM_CAN_DO: can_do(c, p->arg[0], p->arg_len[0], 0); break;
    case GM_CAN_DO_TIMEOUT:
        can_do(c, p->arg[0], p->arg_len[0], (uint32_t)leading_number(p->arg[1], p->arg_len[1], UINT32_MAX));
        break;
    case GM_CANT_DO: {
        char tube[BG_TUBE_NAME_MAX + 1];
        if (gm_function_to_tube(p->arg[0], p->arg_len[0], tube) < 0) break;
        long i = ability_find(c, tube);
        if (i >= 0) drop_ability(c, (uint32_t)i);
        break;
    }
    case GM_RESET_ABILITIES:
        while (c->ability_count) drop_ability(c, c->ability_count - 1);
        break;
    case GM_PRE_SLEEP: pre_sleep(c); break;
    case GM_GRAB_JOB: case GM_GRAB_JOB_UNIQ: case GM_GRAB_JOB_ALL: grab(c, p->type, now); break;
    case GM_WORK_DATA: case GM_WORK_WARNING: case GM_WORK_STATUS: case GM_WORK_COMPLETE:
    case GM_WORK_FAIL: case GM_WORK_EXCEPTION:
        work_result(c, p, now);
        break;
    case GM_SUBMIT_JOB: case GM_SUBMIT_JOB_BG: case GM_SUBMIT_JOB_HIGH: case GM_SUBMIT_JOB_HIGH_BG:
    case GM_SUBMIT_JOB_LOW: case GM_SUBMIT_JOB_LOW_BG: case GM_SUBMIT_JOB_EPOCH:
        submit(c, p, now);
        break;
    case GM_SUBMIT_JOB_SCHED:
        reply_error(c, "NOT_SUPPORTED", "SUBMIT_JOB_SCHED is not supported; use SUBMIT_JOB_EPOCH");
        break;
    case GM_SUBMIT_REDUCE_JOB: case GM_SUBMIT_REDUCE_JOB_BACKGROUND:
        reply_error(c, "NOT_SUPPORTED", "map/reduce jobs are not supported");
        break;
    case GM_GET_STATUS: get_status(c, p); break;
    case GM_GET_STATUS_UNIQUE: get_status_unique(c, p); break;
    case GM_ECHO_REQ: reply(c, GM_ECHO_RES, 1, p->arg, p->arg_len); break;
    case GM_OPTION_REQ:
        if (p->arg_len[0] == 10 && memcmp(p->arg[0], "exceptions", 10) == 0) {
            c->exceptions = 1;
            reply(c, GM_OPTION_RES, 1, p->arg, p->arg_len);
        } else {
            reply_error(c, "UNKNOWN_OPTION", "Server does not recognize given option");
        }
        break;
    case GM_SET_CLIENT_ID:
        snprintf(c->client_id, sizeof c->client_id, "%.*s", (int)p->arg_len[0], p->arg[0]);
        break;
    case GM_ALL_YOURS: break; /* a hint for gearmand's own scheduling */
    default: break;
    }
}

/* ---- the admin protocol ------------------------------------------------- */

/* `status`: every function seen over Gearman, and every tube holding
 * jobs (put over beanstalk or HTTP, or recovered from the log), newest
 * first. */
static void admin_status(struct gm_conn *c)
{
    struct gearman *g = c->g;
    struct bg_engine *e = &g->srv->engine;
    for (uint32_t i = 0; i < e->tube_count; i++)
        if (tube_job_total(e->tube_list[i])) function_get(g, e->tube_list[i]->name, 1);
    for (struct gm_function *f = g->function_list; f; f = f->list_next) {
        struct bg_tube *t = bg_tube_find(e, f->tube);
        uint64_t workers = 0;
        for (struct gm_conn *w = g->conns; w; w = w->next)
            if (ability_find(w, f->tube) >= 0) workers++;
        char fn[GM_FUNCTION_MAX + 1];
        int fn_len = gm_tube_to_function(f->tube, fn, sizeof fn);
        if (fn_len < 0) continue;
        bg_buf_append(&c->out, fn, (size_t)fn_len);
        bg_buf_printf(&c->out, "\t%llu\t%llu\t%llu\n",
                      (unsigned long long)(t ? tube_job_total(t) : 0),
                      (unsigned long long)(t ? t->reserved_count : 0), (unsigned long long)workers);
    }
    bg_buf_append(&c->out, ".\n", 2);
}

static void admin_workers(struct gm_conn *c)
{
    for (struct gm_conn *w = c->g->conns; w; w = w->next) {
        bg_buf_printf(&c->out, "%d %s %s :", w->fd, w->peer, w->client_id[0] ? w->client_id : "-");
        for (uint32_t i = w->ability_count; i-- > 0;) { /* newest first, as gearmand */
            char fn[GM_FUNCTION_MAX + 1];
            int fn_len = gm_tube_to_function(w->abilities[i].tube, fn, sizeof fn);
            if (fn_len < 0) continue;
            bg_buf_append(&c->out, " ", 1);
            bg_buf_append(&c->out, fn, (size_t)fn_len);
        }
        bg_buf_append(&c->out, "\n", 1);
    }
    bg_buf_append(&c->out, ".\n", 2);
}

/* "show jobs": one line per job with Gearman state: handle, retries (0),
 * ignore (0), queued (1 unless running). */
static void admin_show_jobs(struct gm_conn *c, int unique)
{
    struct gearman *g = c->g;
    for (size_t i = 0; g->by_id.slot && i <= g->by_id.mask; i++)
        for (struct gm_record *r = g->by_id.slot[i]; r; r = r->id_next) {
            struct bg_job *j = bg_job_find(&g->srv->engine, r->id);
            if (!j) continue;
            if (unique) {
                if (r->unique[0]) bg_buf_printf(&c->out, "%s\n", r->unique);
                continue;
            }
            char handle[GM_HANDLE_MAX + 1];
            job_handle(g, r->id, handle);
            bg_buf_printf(&c->out, "%s\t0\t0\t%d\n", handle, j->state != BG_JOB_RESERVED);
        }
    bg_buf_append(&c->out, ".\n", 2);
}

/* gearmand's error line: spaces in the text become '+'. */
static void admin_error(struct gm_conn *c, const char *code, const char *text, const char *word,
                        uint32_t word_len)
{
    bg_buf_printf(&c->out, "ERR %s ", code);
    for (const char *p = text; *p; p++) bg_buf_append(&c->out, *p == ' ' ? "+" : p, 1);
    if (word) bg_buf_append(&c->out, word, word_len);
    bg_buf_append(&c->out, "\r\n", 2);
}

static void admin_maxqueue(struct gm_conn *c, const struct gm_admin_line *l)
{
    if (l->nargs < 1) {
        admin_error(c, "INVALID_ARGUMENTS",
                    "An incomplete set of arguments was sent to this command ", "maxqueue", 8);
        return;
    }
    char tube[BG_TUBE_NAME_MAX + 1];
    struct gm_function *f = NULL;
    if (gm_function_to_tube(l->arg[0], l->arg_len[0], tube) >= 0) f = function_get(c->g, tube, 1);
    if (!f) {
        admin_error(c, "INVALID_ARGUMENTS", "function name is empty or too long, or too many functions", NULL, 0);
        return;
    }
    f->max_queue = l->nargs >= 2 ? (uint32_t)leading_number(l->arg[1], l->arg_len[1], UINT32_MAX) : 0;
    bg_buf_append(&c->out, "OK\r\n", 4);
}

/* "cancel job HANDLE": a job not yet running is deleted (its foreground
 * clients get WORK_FAIL); "ERR UNKNOWN_JOB" otherwise. */
static void admin_cancel_job(struct gm_conn *c, const struct gm_admin_line *l, bg_time now)
{
    struct gearman *g = c->g;
    uint64_t id = handle_id(l->arg[0], l->arg_len[0]);
    struct bg_job *j = id ? bg_job_find(&g->srv->engine, id) : NULL;
    if (!j || j->state == BG_JOB_RESERVED) {
        bg_buf_append(&c->out, "ERR UNKNOWN_JOB\r\n", 17);
        return;
    }
    struct gm_record *r = record_find(g, id);
    if (r) {
        struct gm_packet fail = {.type = GM_WORK_FAIL, .nargs = 1};
        fail.arg[0] = l->arg[0], fail.arg_len[0] = l->arg_len[0];
        forward(r, GM_WORK_FAIL, &fail);
        record_remove(g, r);
    }
    bg_delete(&g->holder, id, now);
    bg_buf_append(&c->out, "OK\r\n", 4);
}

/* Answer one admin line; the forms gearmand rejects by their argument
 * count are listed above gm_admin_parse (core/gearman.h). */
static void run_admin(struct gm_conn *c, const struct gm_admin_line *l, bg_time now)
{
    int word_is_show = l->word_len == 4 && strncasecmp(l->word, "show", 4) == 0;
    int word_is_cancel = l->word_len == 6 && strncasecmp(l->word, "cancel", 6) == 0;
    if (((l->cmd == GM_ADMIN_SHOW_JOBS || l->cmd == GM_ADMIN_SHOW_UNIQUE_JOBS) && l->nargs) ||
        (l->cmd == GM_ADMIN_UNKNOWN && word_is_show && l->nargs)) {
        bg_buf_append(&c->out, "ERR UNKNOWN_SHOW_ARGUMENTS\r\n", 28);
        return;
    }
    if ((l->cmd == GM_ADMIN_CANCEL_JOB && l->nargs > 1) ||
        (l->cmd == GM_ADMIN_UNKNOWN && word_is_cancel && l->nargs >= 2)) {
        bg_buf_append(&c->out, "ERR UNKNOWN_ERROR\r\n", 19);
        return;
    }
    /* without --gearman-admin-shutdown, `shutdown` in every form is unknown,
     * as in gearmand 1.1.20 (built without it): the Gearman port has no
     * authentication, and the command would stop every protocol */
    if ((l->cmd == GM_ADMIN_CANCEL_JOB && l->nargs == 0) ||
        (l->cmd == GM_ADMIN_SHUTDOWN && !c->g->admin_shutdown) ||
        (l->cmd == GM_ADMIN_SHUTDOWN && l->nargs &&
         !(l->arg_len[0] == 8 && strncasecmp(l->arg[0], "graceful", 8) == 0))) {
        admin_error(c, "UNKNOWN_COMMAND", "Unknown server command", l->word, l->word_len);
        return;
    }
    int cmd = gm_admin_command(l->cmd);
    if (cmd >= 0) bg_count_cmd(&c->g->srv->engine, (enum bg_cmd)cmd, 1);
    switch (l->cmd) {
    case GM_ADMIN_STATUS: admin_status(c); break;
    case GM_ADMIN_WORKERS: admin_workers(c); break;
    case GM_ADMIN_VERSION: bg_buf_printf(&c->out, "OK %s\n", BEANGATE_VERSION); break;
    case GM_ADMIN_GETPID: bg_buf_printf(&c->out, "OK %ld\n", (long)getpid()); break;
    case GM_ADMIN_MAXQUEUE: admin_maxqueue(c, l); break;
    case GM_ADMIN_SHOW_JOBS: admin_show_jobs(c, 0); break;
    case GM_ADMIN_SHOW_UNIQUE_JOBS: admin_show_jobs(c, 1); break;
    case GM_ADMIN_CANCEL_JOB: admin_cancel_job(c, l, now); break;
    case GM_ADMIN_VERBOSE:
        bg_buf_printf(&c->out, "OK %s\n", log_enabled(BG_LOG_DEBUG) ? "DEBUG"
                                          : log_enabled(BG_LOG_INFO) ? "INFO" : "WARNING");
        break;
    case GM_ADMIN_SHUTDOWN:
        bg_buf_append(&c->out, "OK\n", 3);
        if (l->nargs == 0) {
            log_event(BG_LOG_INFO, "shutdown", "by=gearman_admin");
            loop_stop();
            break;
        }
        /* graceful: take no new jobs or Gearman connections; stop once no
         * Gearman worker holds a job (the sweep checks) */
        log_event(BG_LOG_INFO, "shutdown", "by=gearman_admin mode=graceful");
        c->g->graceful = 1;
        c->g->srv->engine.draining = 1;
        if (c->g->listen_ev) event_del(c->g->listen_ev);
        break;
    default:
        admin_error(c, "UNKNOWN_COMMAND", "Unknown server command", l->word, l->word_len);
        break;
    }
}

/* ---- connections --------------------------------------------------------- */

static void conn_free(struct gm_conn *c)
{
    struct gearman *g = c->g;
    bg_time now = loop_now();
    /* first, while c is still on the woken list: the engine calls below
     * catch up with due deadlines, and a job that becomes ready wakes the
     * sleeping workers, c among them; that must happen before c leaves
     * the list, or the list would keep a freed c */
    bg_engine_catch_up(&g->srv->engine, now);
    loop_cancel(&c->woken);
    if (c->prev) c->prev->next = c->next; else g->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    /* stop listening; a foreground job nobody waits for any more is
     * dropped unless a worker runs it */
    while (c->listening_count) {
        uint64_t id = c->listening[--c->listening_count];
        struct gm_record *r = record_find(g, id);
        if (!r) continue;
        for (uint32_t i = 0; i < r->listener_count; i++)
            if (r->listeners[i] == c) {
                r->listeners[i] = r->listeners[--r->listener_count];
                break;
            }
        if (r->listener_count == 0 && r->foreground) {
            struct bg_job *j = bg_job_find(&g->srv->engine, id);
            if (j && j->state != BG_JOB_RESERVED) {
                bg_delete(&g->holder, id, now);
                record_remove(g, r);
            }
        }
    }
    /* the engine gives reserved jobs back as the client closes; their
     * progress starts again, as in gearmand */
    for (struct bg_job *j = c->client.reserved_head; j; j = j->next) {
        struct gm_record *r = record_find(g, j->id);
        if (r) strcpy(r->numerator, "0"), strcpy(r->denominator, "0");
    }
    unsleep(c);
    if (c->held) wal_unhold(g->srv->wal, &c->hold);
    bg_client_close(&c->client, now);
    g->srv->engine.connections--;
    event_free(c->read_ev);
    event_free(c->write_ev);
    close(c->fd);
    bg_buf_free(&c->in);
    bg_buf_free(&c->out);
    free(c->abilities);
    free(c->listening);
    free(c);
}

/* The log holds what c's output reports: let it go. */
static void conn_durable(struct wal_hold *h)
{
    struct gm_conn *c = (struct gm_conn *)((char *)h - offsetof(struct gm_conn, hold));
    c->held = 0;
    conn_wake(c);
}

/* Write what the socket takes. 0, or -1 when the peer is gone. */
static int conn_flush(struct gm_conn *c)
{
    if (c->held) return 0;
    if (!wal_reached(c->g->srv->wal, c->mark)) { /* -f 0: not on disk yet */
        c->held = 1;
        wal_hold(c->g->srv->wal, &c->hold, c->mark, conn_durable);
        if (c->held) return 0;
    }
    return net_write_out(c->fd, &c->out, c->write_ev);
}

/* Execute every complete request or admin line in c->in (until the output
 * is over the high-water mark), then write. Frees c and returns -1 when
 * the connection is over. */
static int conn_run(struct gm_conn *c)
{
    struct gearman *g = c->g;
    if (c->overflow) {
        log_event(BG_LOG_WARN, "gearman_dropped", "fd=%d peer=%s reason=output_limit", c->fd, c->peer);
        conn_free(c);
        return -1;
    }
    uint64_t before = wal_mark(g->srv->wal);
    bg_time now = loop_now();
    size_t off = 0;
    while (!c->closing && off < c->in.len && c->out.len < CONN_OUT_HIGH_WATER) {
        const char *data = bg_buf_head(&c->in) + off;
        size_t len = c->in.len - off;
        int used;
        if (data[0] != '\0') {
            struct gm_admin_line line;
            used = gm_admin_parse(data, len, &line);
            if (used == 0) break;
            if (used < 0) {
                admin_error(c, "BAD_LINE", used == GM_EARGS ? "too many words" : "line over 4096 bytes",
                            NULL, 0);
                c->closing = 1;
                break;
            }
            bg_engine_catch_up(&g->srv->engine, now); /* reads job states */
            run_admin(c, &line, now);
        } else {
            struct gm_packet p;
            used = gm_parse_request(data, len, g->max_packet, &p);
            if (used == 0) break;
            if (used < 0) {
                const char *code, *text;
                gm_error_text(used, &code, &text);
                reply_error(c, code, text);
                log_event(BG_LOG_DEBUG, "gearman_bad_packet", "fd=%d code=%s", c->fd, code);
                if (used == GM_EFIELD) {
                    /* framing is intact (gearmand too answers and goes on):
                     * skip this packet */
                    off += GM_HEADER_SIZE + p.size;
                    continue;
                }
                c->closing = 1;
                break;
            }
            bg_engine_catch_up(&g->srv->engine, now); /* reads job states */
            run_packet(c, &p, now);
        }
        off += (size_t)used;
    }
    bg_buf_consume(&c->in, off);
    uint64_t mark = wal_mark(g->srv->wal);
    if (mark > before) c->mark = mark;
    if (conn_flush(c) != 0) {
        conn_free(c);
        return -1;
    }
    if ((c->closing || c->peer_eof) && c->out.len == 0) {
        conn_free(c);
        return -1;
    }
    /* backpressure: a peer that does not read is not served; input is
     * bounded by one packet (the parser says when a size is too big) */
    int pause = c->closing || c->peer_eof || c->out.len >= CONN_OUT_HIGH_WATER ||
                c->in.len >= (size_t)g->max_packet + GM_HEADER_SIZE + GM_READ_CHUNK;
    if (pause && !c->read_paused) event_del(c->read_ev);
    if (!pause && c->read_paused) event_add(c->read_ev, NULL);
    c->read_paused = (uint8_t)pause;
    return 0;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gm_conn *c = arg;
    if (net_read_in(fd, &c->in, GM_READ_CHUNK, &c->peer_eof) != 0) {
        conn_free(c);
        loop_engine_changed();
        return;
    }
    conn_run(c);
    loop_engine_changed();
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_run(arg);
    loop_engine_changed();
}

static void conn_woken(struct loop_task *t)
{
    conn_run((struct gm_conn *)((char *)t - offsetof(struct gm_conn, woken)));
}

/* Every GM_SWEEP_MS: look at the next GM_SWEEP_BUCKETS buckets of records
 * (a bounded step, however many there are), fail foreground jobs that
 * ended outside Gearman (a beanstalk or HTTP delete) and drop records of
 * jobs that are gone. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gearman *g = arg;
    struct bg_engine *e = &g->srv->engine;
    for (size_t step = 0; g->by_id.slot && step < GM_SWEEP_BUCKETS && step <= g->by_id.mask; step++) {
        size_t i = g->sweep_cursor++ & g->by_id.mask;
        struct gm_record *r = g->by_id.slot[i], *next;
        for (; r; r = next) {
            next = r->id_next;
            if (bg_job_find(e, r->id)) continue;
            char handle[GM_HANDLE_MAX + 1];
            job_handle(g, r->id, handle);
            for (uint32_t k = 0; k < r->listener_count; k++) {
                reply_strings(r->listeners[k], GM_WORK_FAIL, 1, handle);
                conn_wake(r->listeners[k]);
            }
            record_remove(g, r);
        }
    }
    if (g->graceful) {
        struct gm_conn *c = g->conns;
        while (c && c->client.reserved.len == 0) c = c->next;
        if (!c) loop_stop();
    }
    loop_engine_changed();
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct gearman *g = arg;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage sa;
        socklen_t sa_len = sizeof sa;
        int fd = accept(lfd, (struct sockaddr *)&sa, &sa_len);
        if (fd < 0) return;
        evutil_make_socket_nonblocking(fd);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct gm_conn *c = calloc(1, sizeof *c);
        if (!c || bg_client_init_bare(&g->srv->engine, &c->client, &bg_client_ops_never_wait, c) != 0) {
            free(c);
            close(fd);
            continue;
        }
        c->g = g;
        c->fd = fd;
        c->woken.run = conn_woken;
        g->srv->engine.connections++; /* beanstalk's stats count every connection */
        g->srv->engine.stat.total_connections++;
        if (sa.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, c->peer, sizeof c->peer);
        else if (sa.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, c->peer, sizeof c->peer);
        else
            strcpy(c->peer, "-");
        c->read_ev = event_new(g->srv->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
        c->write_ev = event_new(g->srv->base, fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
        c->next = g->conns;
        if (g->conns) g->conns->prev = c;
        g->conns = c;
        event_add(c->read_ev, NULL);
        log_event(BG_LOG_DEBUG, "gearman_accepted", "fd=%d peer=%s", fd, c->peer);
    }
}

/* ---- the listener ------------------------------------------------------- */

int gearman_listen_fd(const struct gearman *g) { return g->listen_fd; }

struct gearman *gearman_start(struct server *srv, const struct server_config *cfg)
{
    struct gearman *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->srv = srv;
    g->listen_fd = -1;
    g->admin_shutdown = cfg->gearman_admin_shutdown != 0;
    g->max_packet = srv->engine.max_job_size + GM_IN_SLACK;
    if (bg_client_init_bare(&srv->engine, &g->holder, &bg_client_ops_never_wait, NULL) != 0) {
        free(g);
        return NULL;
    }
    g->listen_fd = listen_tcp(cfg->gearman_listen, cfg->gearman_port);
    if (g->listen_fd < 0) {
        gearman_stop(g);
        return NULL;
    }
    evutil_make_socket_nonblocking(g->listen_fd);
    srv->engine.job_ready = engine_job_ready;
    srv->engine.job_ready_ctx = g;
    g->listen_ev = event_new(srv->base, g->listen_fd, EV_READ | EV_PERSIST, accept_cb, g);
    g->sweep_ev = event_new(srv->base, -1, EV_PERSIST, sweep_cb, g);
    struct timeval every = {GM_SWEEP_MS / 1000, (GM_SWEEP_MS % 1000) * 1000};
    event_add(g->listen_ev, NULL);
    event_add(g->sweep_ev, &every);
    log_event(BG_LOG_INFO, "listening", "protocol=gearman addr=%s port=%s",
              log_str(cfg->gearman_listen), log_str(cfg->gearman_port));
    return g;
}

void gearman_stop(struct gearman *g)
{
    if (!g) return;
    if (g->srv->engine.job_ready_ctx == g) g->srv->engine.job_ready = NULL;
    if (g->listen_ev) event_free(g->listen_ev);
    if (g->listen_fd >= 0) close(g->listen_fd);
    while (g->conns) {
        conn_flush(g->conns);
        conn_free(g->conns);
    }
    for (size_t i = 0; g->by_id.slot && i <= g->by_id.mask; i++)
        while (g->by_id.slot[i]) record_remove(g, g->by_id.slot[i]);
    free(g->by_id.slot);
    free(g->by_unique.slot);
    while (g->function_list) {
        struct gm_function *f = g->function_list;
        g->function_list = f->list_next;
        free(f);
    }
    free(g->functions);
    if (g->sweep_ev) event_free(g->sweep_ev);
    bg_client_close(&g->holder, loop_now());
    free(g);
}

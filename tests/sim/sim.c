/* sim.c - the deterministic fault simulator of the write-ahead log (issue
 * 21; docs/durability.md, "Fault simulator").
 *
 * One process, one thread, simulated time: the engine (core/), a few
 * client sessions, and the log (io/wal.c, synchronous: no flusher thread)
 * on the fault-injecting storage (storage_fault.c). A seed chooses a
 * workload (puts, reserves, deletes, releases with delays, buries, kicks,
 * touches, TTR expiries and delays coming due as time moves, pauses,
 * compaction through a small segment size) and a fault schedule (failed
 * and short writes, failed syncs, failed directory calls, slow syncs,
 * crashes of the process or the machine at any call). After every crash a
 * fresh engine recovers from what the storage kept and sim_model.c checks
 * it against what was acknowledged. The same seed gives the same run.
 *
 *   sim                     the named cases, then seeds for the time budget
 *                           (BEANGATE_SIM_SECONDS, default 60; 15 under ASan)
 *   sim --seed N [-v]       one seed (-v: every step and log line)
 *   sim --seeds N [--start S]  N seeds from S
 *   sim --minutes M [--start S] seeds for M minutes
 *   sim --crash-points N [--start S]  crash-point enumeration of N seeds
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../io/loop.h"
#include "../../io/wal.h"
#include "sim_clock.h"
#include "sim_log.h"
#include "sim_model.h"
#include "storage_fault.h"

#define SIM_CLIENTS 3
#define SIM_TUBES 3
#define T0 ((bg_time)1000 * BG_SECOND)
#define WALL0 ((uint64_t)1700000000 * BG_SECOND)

/* ---- the fault schedule of a seed ---- */

struct schedule {
    struct fault_rates rates;
    uint32_t crash_ppm;        /* per step: the machine or the process stops */
    uint32_t slow_sync_ppm;    /* per step: the flusher's step comes late */
    uint32_t steps;
    uint64_t segment_size;
    enum crash_keep keep;      /* what a machine crash keeps of unsynced writes */
    uint8_t process_crashes;   /* crashes keep everything written (the page cache) */
    uint8_t churn;             /* phases of deletes after phases of puts: compaction */
    uint8_t graceful_stops;    /* some crashes are graceful stops instead (their own rng) */
    uint8_t sessions;          /* beanstalk sessions through the codec take part (their own rng) */
    uint8_t recovery_crashes;  /* the machine stops during a recovery too (their own rng) */
};

/* A seed's schedule: some seeds run without faults, some with a few, some
 * with many; crashes in most. */
static void schedule_of(uint64_t seed, struct schedule *s)
{
    struct sim_rng r = {seed * 0x2545F4914F6CDD1Dull + 1};
    memset(s, 0, sizeof *s);
    s->steps = 200 + (uint32_t)rng_below(&r, 400);
    static const uint64_t sizes[] = {512, 1024, 2048, 4096, 4096, 8192, 16384, 1 << 20};
    s->segment_size = sizes[rng_below(&r, 8)];
    unsigned level = (unsigned)rng_below(&r, 4); /* 0: none, 3: many */
    uint32_t base = level == 0 ? 0 : level == 1 ? 2000 : level == 2 ? 10000 : 40000;
    if (base) {
        if (rng_below(&r, 2)) s->rates.pwrite = base;
        if (rng_below(&r, 2)) s->rates.short_write = base;
        if (rng_below(&r, 2)) s->rates.sync = base;
        if (rng_below(&r, 3) == 0) s->rates.sync_dir = base;
        if (rng_below(&r, 3) == 0) s->rates.create = base;
        if (rng_below(&r, 4) == 0) s->rates.rename = s->rates.unlink = s->rates.truncate = base;
    }
    s->crash_ppm = rng_below(&r, 5) ? 3000 + (uint32_t)rng_below(&r, 20000) : 0;
    s->slow_sync_ppm = rng_below(&r, 2) ? (uint32_t)rng_below(&r, 200000) : 0;
    s->keep = (enum crash_keep)rng_below(&r, 5);
    s->process_crashes = rng_below(&r, 4) == 0;
    s->churn = rng_below(&r, 2);
    s->graceful_stops = rng_below(&r, 2);
    s->sessions = rng_below(&r, 3) != 0;
    s->recovery_crashes = rng_below(&r, 3) == 0;
}

static const char *const keep_names[] = {"none", "all", "prefix", "subset", "random"};

/* ---- the world: engine, clients, log ---- */

struct sim_client {
    struct bg_client c;
    uint64_t mark;             /* the mark this session's replies wait for */
};

/* A beanstalk session through the codec (core/codec.c), as io/conn.c runs
 * one: its replies wait in stream.out until the reply rule lets them go,
 * and only then are they read (the ids they show count as shown then). */
struct sim_session {
    struct bg_session sess;
    struct sim *sim;
    uint64_t mark;
};
#define SIM_SESSIONS 2

struct sim {
    uint64_t seed;
    struct sim_rng rng;
    struct sim_rng stop_rng;   /* graceful stops: apart, so that seeds without them run as before */
    struct sim_rng session_rng; /* the beanstalk sessions' commands: likewise */
    struct sim_rng recovery_rng; /* crashes during a recovery: likewise */
    struct schedule sch;
    struct storage *st;
    struct event_base *base;
    struct bg_engine engine;
    struct sim_client clients[SIM_CLIENTS];
    struct sim_session sessions[SIM_SESSIONS];
    struct wal *wal;
    int up;                    /* engine and log are open */
    struct model model;
    bg_time flusher_late_until; /* a slow sync: the flusher's step waits */
    int verbose;
    uint64_t step, crashes, recoveries, puts;
    uint64_t migrated;         /* records compaction wrote again */
    char why[512];
};

/* ---- THE REPLY RULE: the one place this simulator decides when a reply
 * may go (the -f 0 rule), as io/conn.c does: a command starts with the
 * engine's reply_pos at 0; what it changed or showed raises it (the log's
 * hooks, bg_engine_show_job); a session's replies depend on the highest
 * position any of its commands reached, and go once wal_reply_may_go says
 * the log keeps it. ---- */

static void reply_rule_before_command(struct sim *s) { s->engine.reply_pos = 0; }

/* Also for output that came outside a session's own command (a wait that
 * ended), as io/conn.c's stream_output_ready. */
static void reply_rule_after_command(struct sim *s, uint64_t *session_mark)
{
    if (s->engine.reply_pos > *session_mark) *session_mark = s->engine.reply_pos;
}

static int reply_may_go(void *ctx, uint64_t mark)
{
    struct sim *s = ctx;
    return wal_reply_may_go(s->wal, mark);
}

/* ---- the engine's records, noted on their way to the log ---- */

static void note_job(struct sim *s, const struct bg_job *j, int kind)
{
    struct change c = {.id = j->id, .kind = (uint8_t)kind, .pri = j->pri, .state = j->state};
    if (kind == CH_PUT) {
        c.body_hash = model_body_hash(j->body, j->body_size);
        c.body_len = j->body_size;
        snprintf(c.tube, sizeof c.tube, "%s", j->tube->name);
    }
    model_note(&s->model, &c);
}

static void hook_job_saved(void *ctx, const struct bg_job *j, int with_body)
{
    struct sim *s = ctx;
    note_job(s, j, with_body ? CH_PUT : CH_UPDATE);
    wal_journal_ops.job_saved(s->wal, j, with_body);
}

static void hook_job_deleted(void *ctx, uint64_t id)
{
    struct sim *s = ctx;
    struct change c = {.id = id, .kind = CH_DELETE};
    model_note(&s->model, &c);
    wal_journal_ops.job_deleted(s->wal, id);
}

static void hook_tube_paused(void *ctx, const struct bg_tube *t)
{
    struct sim *s = ctx;
    wal_journal_ops.tube_paused(s->wal, t);
}

static void hook_job_shown(void *ctx, uint64_t id)
{
    struct sim *s = ctx;
    wal_journal_ops.job_shown(s->wal, id);
}

static const struct bg_journal_ops sim_journal_ops = {
    .job_saved = hook_job_saved, .job_deleted = hook_job_deleted, .tube_paused = hook_tube_paused,
    .job_shown = hook_job_shown,
};

static const char *const tube_names[SIM_TUBES] = {"default", "t1", "t2"};

static uint64_t any_job(struct sim *s, struct sim_rng *rng);

/* ---- beanstalk sessions through the codec ---- */

static void session_output_ready(struct bg_stream *st)
{
    struct sim_session *ss = st->owner;
    reply_rule_after_command(ss->sim, &ss->mark);
}

/* Feed one command's bytes; its changes wait for the session's mark. */
static void session_feed(struct sim *s, struct sim_session *ss, const char *text, size_t len)
{
    reply_rule_before_command(s);
    size_t from = s->model.nlog;
    size_t used = bg_session_feed(&ss->sess, text, len, loop_now());
    if (used != len) abort(); /* the simulator only sends whole commands to a session that is not blocked */
    reply_rule_after_command(s, &ss->mark);
    model_set_mark(&s->model, from, ss->mark);
}

static void session_open(struct sim *s, struct sim_session *ss)
{
    if (bg_session_init(&s->engine, &ss->sess, NULL, NULL) != 0) abort();
    ss->sim = s;
    ss->mark = 0;
    ss->sess.stream.owner = ss;
    ss->sess.stream.output_ready = session_output_ready;
    static const char watch[] = "watch t1\r\nwatch t2\r\n";
    session_feed(s, ss, watch, sizeof watch - 1);
}

/* The id after word in a reply line ("INSERTED 5"), or 0. */
static uint64_t reply_id(const char *line, size_t len, const char *word)
{
    size_t n = strlen(word);
    if (len <= n || memcmp(line, word, n) != 0) return 0;
    uint64_t id = 0;
    for (size_t i = n; i < len && line[i] >= '0' && line[i] <= '9'; i++) id = id * 10 + (uint64_t)(line[i] - '0');
    return id;
}

/* The replies may go: the client reads them; the ids they show are shown. */
static void session_deliver(struct sim *s, struct sim_session *ss)
{
    struct bg_buf *out = &ss->sess.stream.out;
    if (!out->len || !reply_may_go(s, ss->mark)) return;
    const char *p = bg_buf_head(out), *end = p + out->len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) abort(); /* replies are whole lines */
        size_t len = (size_t)(eol - p);
        uint64_t id = reply_id(p, len, "INSERTED ");
        if (!id) id = reply_id(p, len, "BURIED ");
        uint64_t rid = reply_id(p, len, "RESERVED ");
        p = eol + 1;
        if (rid) { /* RESERVED id bytes: the body follows */
            id = rid;
            const char *sp = memchr(p - len - 1 + 9, ' ', len - 9);
            uint64_t bytes = sp ? strtoull(sp + 1, NULL, 10) : 0;
            p += bytes + 2;
        }
        if (id > s->model.max_shown) s->model.max_shown = id;
    }
    bg_buf_clear(out);
}

/* One command of a beanstalk session, as text. */
static void session_command(struct sim *s, struct sim_session *ss)
{
    char cmd[2300];
    int n = 0;
    unsigned op = (unsigned)rng_below(&s->session_rng, 100);
    struct bg_job *mine = ss->sess.client.reserved_head;
    uint64_t id = mine && rng_below(&s->session_rng, 3) ? mine->id : any_job(s, &s->session_rng);
    if (op < 35) {
        uint32_t len = (uint32_t)(1 + rng_below(&s->session_rng, 200));
        const char *tube = tube_names[rng_below(&s->session_rng, SIM_TUBES)];
        n = snprintf(cmd, sizeof cmd, "use %s\r\nput %u %u %u %u\r\n", tube, (unsigned)rng_below(&s->session_rng, 4) * 100,
                     rng_below(&s->session_rng, 5) ? 0u : (unsigned)(1 + rng_below(&s->session_rng, 4)),
                     (unsigned)(1 + rng_below(&s->session_rng, 10)), len);
        for (uint32_t i = 0; i < len; i++) cmd[n++] = (char)('A' + rng_below(&s->session_rng, 26));
        cmd[n++] = '\r';
        cmd[n++] = '\n';
    } else if (op < 55) {
        /* now and then a reserve that waits: a later put or a delay hands it a job */
        n = snprintf(cmd, sizeof cmd, "reserve-with-timeout %u\r\n",
                     rng_below(&s->session_rng, 4) ? 0u : (unsigned)(1 + rng_below(&s->session_rng, 3)));
    } else if (op < 70) {
        n = snprintf(cmd, sizeof cmd, "delete %llu\r\n", (unsigned long long)id);
    } else if (op < 78) {
        n = snprintf(cmd, sizeof cmd, "release %llu %u %u\r\n", (unsigned long long)id,
                     (unsigned)rng_below(&s->session_rng, 4) * 100, rng_below(&s->session_rng, 3) ? 0u : 1u);
    } else if (op < 84) {
        n = snprintf(cmd, sizeof cmd, "bury %llu %u\r\n", (unsigned long long)id, (unsigned)rng_below(&s->session_rng, 4) * 100);
    } else if (op < 90) {
        n = rng_below(&s->session_rng, 2) ? snprintf(cmd, sizeof cmd, "kick-job %llu\r\n", (unsigned long long)id)
                                  : snprintf(cmd, sizeof cmd, "use %s\r\nkick %u\r\n",
                                             tube_names[rng_below(&s->session_rng, SIM_TUBES)], (unsigned)(1 + rng_below(&s->session_rng, 4)));
    } else if (op < 96) {
        n = snprintf(cmd, sizeof cmd, "touch %llu\r\n", (unsigned long long)id);
    } else {
        n = snprintf(cmd, sizeof cmd, "pause-tube %s %u\r\n", tube_names[rng_below(&s->session_rng, SIM_TUBES)],
                     (unsigned)rng_below(&s->session_rng, 3));
    }
    if (s->verbose) printf("  step %llu session %d: %.*s\n", (unsigned long long)s->step, (int)(ss - s->sessions),
                           (int)strcspn(cmd, "\r"), cmd);
    session_feed(s, ss, cmd, (size_t)n);
}

/* Open the log on the storage and a fresh engine; check it against the
 * model if this is a recovery. 0, or -1 with s->why. */
static int world_open(struct sim *s, int recovery)
{
    struct wal_config cfg = {0};
    cfg.dir = "sim";
    cfg.fsync_ms = 0;
    cfg.segment_size = s->sch.segment_size;
    cfg.storage = s->st;
    cfg.synchronous = 1;
    int r;
    for (;;) {
        if (bg_engine_init(&s->engine, 1 << 16, NULL) != 0) abort();
        sim_log_clear();
        /* the machine may stop again while the start recovers (cutting a
         * torn tail, dropping superseded segments, making the new one) */
        int again = recovery && s->sch.recovery_crashes && rng_below(&s->recovery_rng, 2);
        if (again) fault_storage_crash_at(s->st, fault_storage_ops(s->st) + 1 + rng_below(&s->recovery_rng, 6));
        r = wal_open(&s->wal, &cfg, &s->engine, s->base, loop_now(), loop_wall_now());
        if (!again || !fault_storage_halted(s->st)) {
            fault_storage_crash_at(s->st, 0);
            break;
        }
        if (r == 0) wal_close(s->wal);
        bg_engine_destroy(&s->engine);
        fault_storage_crash(s->st, s->sch.keep, -1);
        s->crashes++;
        if (s->verbose) printf("  crash (machine) during recovery\n");
    }
    if (r == BG_IO_ERROR) {
        /* a call failed while opening: the operator starts it again (the
         * process stopped; what it wrote is still in the page cache) */
        bg_engine_destroy(&s->engine);
        fault_storage_crash(s->st, KEEP_ALL, 0);
        struct fault_rates none = {0};
        fault_storage_set_rates(s->st, &none);
        if (bg_engine_init(&s->engine, 1 << 16, NULL) != 0) abort();
        sim_log_clear();
        r = wal_open(&s->wal, &cfg, &s->engine, s->base, loop_now(), loop_wall_now());
        fault_storage_set_rates(s->st, &s->sch.rates);
    }
    if (r != 0) {
        snprintf(s->why, sizeof s->why, "the log was refused at %s (%s)%s", recovery ? "recovery" : "start",
                 bg_outcome_word(r),
                 sim_log_saw("wal_refused") || sim_log_saw("wal_damaged") || sim_log_saw("wal_open_failed")
                     ? ", with a report" : ", WITHOUT a report");
        bg_engine_destroy(&s->engine);
        s->wal = NULL;
        return -1;
    }
    if (recovery) {
        const char *broken;
        int bad = bg_engine_audit(&s->engine, &broken) != 0;
        if (bad) snprintf(s->why, sizeof s->why, "the recovered engine is inconsistent: %s", broken);
        else bad = model_check(&s->model, &s->engine, s->why, sizeof s->why) != 0;
        if (bad) { /* the run ends here: free what the start made */
            fault_storage_halt(s->st);
            wal_close(s->wal);
            bg_engine_destroy(&s->engine);
            s->wal = NULL;
            return -1;
        }
        s->recoveries++;
    }
    model_rebase(&s->model, &s->engine);
    s->engine.journal = &sim_journal_ops;
    s->engine.journal_ctx = s;
    for (int i = 0; i < SIM_CLIENTS; i++) {
        struct sim_client *c = &s->clients[i];
        memset(c, 0, sizeof *c);
        if (bg_client_init(&s->engine, &c->c, &bg_client_ops_never_wait, NULL) != 0) abort();
        for (int t = 1; t < SIM_TUBES; t++) {
            uint32_t count;
            if (bg_client_watch(&c->c, tube_names[t], &count) != 0) abort();
        }
    }
    for (int i = 0; i < SIM_SESSIONS; i++) session_open(s, &s->sessions[i]);
    s->up = 1;
    s->flusher_late_until = 0;
    return 0;
}

/* The process is gone: nothing of it runs any more (its memory is freed
 * without another call to the storage, which is halted). */
static void world_drop(struct sim *s)
{
    if (!s->up) return;
    struct bg_process_info pi;
    memset(&pi, 0, sizeof pi);
    wal_stats(s->wal, &pi);
    s->migrated += pi.binlog_migrated;
    fault_storage_halt(s->st);
    s->engine.journal = NULL;
    for (int i = 0; i < SIM_SESSIONS; i++) bg_session_close(&s->sessions[i].sess, loop_now());
    for (int i = 0; i < SIM_CLIENTS; i++) bg_client_close(&s->clients[i].c, loop_now());
    wal_close(s->wal);
    bg_engine_destroy(&s->engine);
    s->wal = NULL;
    s->up = 0;
}

/* The log's part of a loop turn: hand on what was appended and, unless a
 * slow sync holds the flusher back, let it write and sync; run the log's
 * timers that are due; let the replies go that may. */
static void log_turn(struct sim *s)
{
    wal_kick(s->wal);
    if (loop_now() >= s->flusher_late_until) {
        for (int i = 0; i < 8 && !fault_storage_halted(s->st); i++) wal_run_flusher(s->wal);
        if (rng_ppm(&s->rng, s->sch.slow_sync_ppm))
            s->flusher_late_until = loop_now() + (1 + rng_below(&s->rng, 800)) * 1000000ull;
    }
    sim_timers_run();
    model_ack(&s->model, reply_may_go, s);
    for (int i = 0; i < SIM_SESSIONS; i++) session_deliver(s, &s->sessions[i]);
}

/* ---- the workload ---- */

static struct sim_client *pick_client(struct sim *s) { return &s->clients[rng_below(&s->rng, SIM_CLIENTS)]; }

/* A job c has reserved, or 0. */
static uint64_t reserved_job(struct sim *s, struct sim_client *c)
{
    size_t n = 0;
    for (struct bg_job *j = c->c.reserved_head; j; j = j->next) n++;
    if (!n) return 0;
    size_t k = (size_t)rng_below(&s->rng, n);
    struct bg_job *j = c->c.reserved_head;
    while (k--) j = j->next;
    return j->id;
}

/* Any job of the engine, or 0. */
static uint64_t any_job(struct sim *s, struct sim_rng *rng)
{
    size_t n = s->engine.job_count;
    if (!n) return 0;
    uint64_t *ids = malloc(n * sizeof *ids);
    if (!ids) abort();
    bg_engine_job_ids(&s->engine, ids);
    uint64_t id = ids[rng_below(rng, n)];
    free(ids);
    return id;
}

static void note_shown(struct sim *s, uint64_t id)
{
    struct change c = {.id = id, .kind = CH_SHOWN};
    model_note(&s->model, &c);
}

/* One command of a client; its changes wait for its reply's mark. */
static void command(struct sim *s)
{
    if (s->sch.sessions && rng_below(&s->session_rng, 5) < 2) {
        struct sim_session *ss = &s->sessions[rng_below(&s->session_rng, SIM_SESSIONS)];
        if (!ss->sess.stream.blocked) session_command(s, ss);
        return;
    }
    struct sim_client *c = pick_client(s);
    bg_time now = loop_now();
    reply_rule_before_command(s);
    size_t from = s->model.nlog;
    unsigned op = (unsigned)rng_below(&s->rng, 100);
    if (s->sch.churn && (s->step / 80) % 2 && rng_below(&s->rng, 2)) op = 54; /* a phase of deletes */
    int needs_reservation = (op >= 70 && op < 84) || (op >= 90 && op < 96); /* release, bury, touch */
    if (needs_reservation && !c->c.reserved_head) op = 34; /* nothing reserved: reserve first */
    const char *what = "";
    uint64_t id = 0;
    int r = 0;
    if (op < 34) {
        char body[2048];
        uint32_t len = (uint32_t)(rng_below(&s->rng, 8) ? 1 + rng_below(&s->rng, 120) : 1 + rng_below(&s->rng, sizeof body));
        for (uint32_t i = 0; i < len; i++) body[i] = (char)('a' + rng_below(&s->rng, 26));
        uint32_t pri = (uint32_t)rng_below(&s->rng, 4) * 100;
        uint32_t delay = rng_below(&s->rng, 5) == 0 ? (uint32_t)(1 + rng_below(&s->rng, 5)) : 0;
        uint32_t ttr = (uint32_t)(1 + rng_below(&s->rng, 10));
        r = bg_put_copy(&c->c, tube_names[rng_below(&s->rng, SIM_TUBES)], pri, delay, ttr, body, len, now, &id);
        what = "put";
        s->puts++;
        if (r == 0) note_shown(s, id);
    } else if (op < 54) {
        struct bg_job *j = NULL;
        r = bg_reserve(&c->c, 0, now, &j);
        what = "reserve";
        if (r == 0) {
            id = j->id;
            bg_engine_show_job(&s->engine, j); /* RESERVED shows it */
            note_shown(s, id);
        }
    } else if (op < 70) {
        id = rng_below(&s->rng, 2) ? reserved_job(s, c) : any_job(s, &s->rng);
        r = bg_delete(&c->c, id, now);
        what = "delete";
    } else if (op < 78) {
        id = reserved_job(s, c);
        uint32_t delay = rng_below(&s->rng, 3) == 0 ? (uint32_t)(1 + rng_below(&s->rng, 3)) : 0;
        r = bg_release(&c->c, id, (uint32_t)rng_below(&s->rng, 4) * 100, delay, now);
        what = "release";
    } else if (op < 84) {
        id = reserved_job(s, c);
        r = bg_bury(&c->c, id, (uint32_t)rng_below(&s->rng, 4) * 100, now);
        what = "bury";
    } else if (op < 90) {
        if (rng_below(&s->rng, 2)) {
            struct bg_tube *t = bg_tube_find(&s->engine, tube_names[rng_below(&s->rng, SIM_TUBES)]);
            r = t ? (int)bg_kick(&s->engine, t, 1 + rng_below(&s->rng, 5), now) : 0;
        } else {
            id = any_job(s, &s->rng);
            r = bg_kick_job(&s->engine, id, now);
        }
        what = "kick";
    } else if (op < 96) {
        id = reserved_job(s, c);
        r = bg_touch(&c->c, id, now);
        what = "touch";
    } else {
        r = bg_pause_tube(&s->engine, tube_names[rng_below(&s->rng, SIM_TUBES)], (uint32_t)rng_below(&s->rng, 4), now);
        what = "pause-tube";
    }
    reply_rule_after_command(s, &c->mark);
    model_set_mark(&s->model, from, c->mark);
    if (s->verbose)
        printf("  step %llu t=%.3f client %d %s id=%llu -> %d mark=%llu\n", (unsigned long long)s->step,
               (double)(now - T0) / 1e9, (int)(c - s->clients), what, (unsigned long long)id, r,
               (unsigned long long)c->mark);
}

/* Time passes: delays end, TTRs run out, pauses end (their records have
 * no reply). */
static void time_passes(struct sim *s)
{
    uint64_t k = rng_below(&s->rng, 100);
    bg_time d = k < 70 ? rng_below(&s->rng, 50) * 1000000ull
              : k < 95 ? rng_below(&s->rng, 2000) * 1000000ull
                       : (1 + rng_below(&s->rng, 12)) * BG_SECOND;
    sim_clock_advance(d);
    size_t from = s->model.nlog;
    bg_engine_tick(&s->engine, loop_now());
    model_set_mark(&s->model, from, MODEL_NO_REPLY);
}

/* A crash: the process stops (all it wrote survives) or the machine does
 * (unsynced writes as the schedule keeps them); then a start recovers. */
static int crash_and_recover(struct sim *s, int machine)
{
    world_drop(s);
    fault_storage_crash(s->st, machine ? s->sch.keep : KEEP_ALL, -1);
    s->crashes++;
    sim_clock_advance((1 + rng_below(&s->rng, 3000)) * 1000000ull);
    if (s->verbose) printf("  crash (%s) at step %llu\n", machine ? "machine" : "process", (unsigned long long)s->step);
    return world_open(s, 1);
}

/* A graceful stop (SIGTERM, server_stop): the log finishes within a
 * deadline, the replies whose position it kept go, the process exits (what
 * it wrote survives), a start recovers. When the log says it kept
 * everything, every command that changed something has been answered (a
 * client never retries a change that was kept: defect 6). */
static int stop_and_restart(struct sim *s)
{
    int r = wal_finish(s->wal, loop_now() + 5 * BG_SECOND);
    model_ack(&s->model, reply_may_go, s);
    if (s->verbose) printf("  graceful stop at step %llu: wal_finish %d\n", (unsigned long long)s->step, r);
    for (size_t i = 0; r == 0 && i < s->model.nlog; i++) {
        const struct change *c = &s->model.log[i];
        if (c->kind != CH_SHOWN && c->has_mark && c->mark != MODEL_NO_REPLY && !c->acked) {
            snprintf(s->why, sizeof s->why, "a graceful stop kept job %llu's change but did not answer it",
                     (unsigned long long)c->id);
            return -1;
        }
    }
    world_drop(s);
    fault_storage_crash(s->st, KEEP_ALL, 0);
    s->crashes++;
    return world_open(s, 1);
}

/* ---- one seed ---- */

enum run_outcome { RUN_PASS, RUN_FAIL };

struct run_options {
    uint64_t crash_at;         /* crash-point enumeration: the machine stops before this call */
    enum crash_keep keep;      /* ... and keeps this of unsynced writes */
    long keep_k;               /* KEEP_PREFIX: how many */
    uint32_t steps;            /* 0: the schedule's */
    int no_faults;
};

static void sim_free(struct sim *s)
{
    world_drop(s);
    s->st->ops->destroy(s->st);
    event_base_free(s->base);
    model_free(&s->model);
}

static int run_seed(uint64_t seed, const struct run_options *o, int verbose, struct sim *s)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->verbose = verbose;
    s->rng.state = seed;
    s->stop_rng.state = ~seed;
    s->session_rng.state = seed ^ 0x5e55105e55105e55ull;
    s->recovery_rng.state = seed ^ 0x4ec04e4ec04e4ec0ull;
    schedule_of(seed, &s->sch);
    if (o->steps) s->sch.steps = o->steps;
    if (o->no_faults) {
        memset(&s->sch.rates, 0, sizeof s->sch.rates);
        s->sch.crash_ppm = s->sch.slow_sync_ppm = s->sch.graceful_stops = s->sch.recovery_crashes = 0;
    }
    s->base = event_base_new();
    if (!s->base) abort();
    sim_clock_reset(T0, WALL0, s->base);
    sim_log_echo(verbose);
    s->st = fault_storage_new(seed);
    fault_storage_trace(s->st, verbose);
    model_init(&s->model);
    int rc = RUN_PASS;
    if (world_open(s, 0) != 0) {
        rc = RUN_FAIL;
        goto out;
    }
    fault_storage_set_rates(s->st, &s->sch.rates);
    if (o->crash_at) fault_storage_crash_at(s->st, o->crash_at);
    for (s->step = 0; s->step < s->sch.steps; s->step++) {
        time_passes(s);
        command(s);
        log_turn(s);
        if (o->crash_at) {
            if (fault_storage_halted(s->st)) break;
            continue;
        }
        if (fault_storage_halted(s->st) || rng_ppm(&s->rng, s->sch.crash_ppm)) {
            if (s->sch.graceful_stops && !fault_storage_halted(s->st) && rng_below(&s->stop_rng, 3) == 0) {
                if (stop_and_restart(s) != 0) {
                    rc = RUN_FAIL;
                    goto out;
                }
                continue;
            }
            int machine = !s->sch.process_crashes || rng_below(&s->rng, 2);
            if (rng_below(&s->rng, 3) == 0 && !fault_storage_halted(s->st)) {
                /* in the middle of the next calls instead */
                fault_storage_crash_at(s->st, fault_storage_ops(s->st) + 1 + rng_below(&s->rng, 4));
                continue;
            }
            if (crash_and_recover(s, machine) != 0) {
                rc = RUN_FAIL;
                goto out;
            }
        }
    }
    /* every run ends with a crash of the machine and a check */
    world_drop(s);
    fault_storage_crash(s->st, o->crash_at ? o->keep : s->sch.keep, o->crash_at ? o->keep_k : -1);
    s->crashes++;
    if (world_open(s, 1) != 0) rc = RUN_FAIL;
out:
    return rc;
}

/* The kinds of failure, for the summary of a run. */
static const char *const failure_kinds[] = {
    "refused", "lost", "is back", "id reuse", "priority", "buried", "body", "tube", "no put", "inconsistent",
};
#define FAILURE_KINDS (sizeof failure_kinds / sizeof failure_kinds[0])
static uint64_t failures_by_kind[FAILURE_KINDS + 1];

static void count_failure(const char *why)
{
    size_t k = 0;
    while (k < FAILURE_KINDS && !strstr(why, failure_kinds[k])) k++;
    failures_by_kind[k]++;
}

static void print_failure_kinds(void)
{
    int any = 0;
    for (size_t k = 0; k <= FAILURE_KINDS; k++)
        if (failures_by_kind[k]) {
            printf("%s%s=%llu", any ? " " : "failures by kind: ", k < FAILURE_KINDS ? failure_kinds[k] : "other",
                   (unsigned long long)failures_by_kind[k]);
            any = 1;
        }
    if (any) printf("\n");
}

/* Run a seed and say so if it fails (with the command that replays it). */
static int run_and_report(uint64_t seed, const struct run_options *o, int verbose, const char *name)
{
    struct sim s;
    int rc = run_seed(seed, o, verbose, &s);
    if (rc != RUN_PASS) {
        printf("FAIL seed %llu%s%s: %s (step %llu, crashes %llu)\n", (unsigned long long)seed, name ? " " : "",
               name ? name : "", s.why, (unsigned long long)s.step, (unsigned long long)s.crashes);
        count_failure(s.why);
        static unsigned detailed; /* the first failures in full; then a line each */
        int detail = verbose || detailed++ < 20;
        struct fault_counts fc;
        fault_storage_counts(s.st, &fc);
        if (detail) printf("  faults: %llu calls failed, %llu short writes, %llu syncs failed\n", (unsigned long long)fc.failed,
               (unsigned long long)fc.short_writes, (unsigned long long)fc.sync_failed);
        const struct schedule *h = &s.sch;
        if (detail) printf("  schedule: keep=%s process_crashes=%d graceful_stops=%d sessions=%d recovery_crashes=%d crash_ppm=%u slow_sync_ppm=%u segment_size=%llu "
               "faults_ppm: create=%u pwrite=%u short=%u sync=%u sync_dir=%u rename/unlink/truncate=%u\n",
               keep_names[h->keep], h->process_crashes, h->graceful_stops, h->sessions, h->recovery_crashes, h->crash_ppm, h->slow_sync_ppm,
               (unsigned long long)h->segment_size, h->rates.create, h->rates.pwrite, h->rates.short_write,
               h->rates.sync, h->rates.sync_dir, h->rates.rename);
        if (detail && !verbose) sim_log_print();
        if (o->crash_at)
            printf("  replay: build/tests/sim/sim --seed %llu --crash-at %llu --keep %d --keep-k %ld\n",
                   (unsigned long long)seed, (unsigned long long)o->crash_at, (int)o->keep, o->keep_k);
        else
            printf("  replay: build/tests/sim/sim --seed %llu\n", (unsigned long long)seed);
    } else if (verbose) {
        printf("PASS seed %llu: steps %u, puts %llu, crashes %llu, recoveries %llu, records compacted %llu\n",
               (unsigned long long)seed, s.sch.steps, (unsigned long long)s.puts, (unsigned long long)s.crashes,
               (unsigned long long)s.recoveries, (unsigned long long)s.migrated);
    }
    sim_free(&s);
    return rc;
}

/* ---- crash-point enumeration ---- */

#define CRASH_POINT_STEPS 120 /* a workload short enough to stop at each of its calls */

/* Run seed's workload (short, no faults) once to count its storage calls;
 * then for every call k, run it again with the machine stopping before
 * call k, and recover keeping none, all, each prefix and some subsets of
 * the unsynced writes. Returns the failures. */
static int crash_points(uint64_t seed, uint32_t steps, uint64_t *runs)
{
    struct run_options o = {.steps = steps, .no_faults = 1};
    struct sim s;
    run_seed(seed, &o, 0, &s);
    uint64_t calls = fault_storage_ops(s.st);
    sim_free(&s);
    int failures = 0;
    for (uint64_t k = 1; k <= calls && failures < 3; k++) {
        enum crash_keep kinds[] = {KEEP_NONE, KEEP_ALL, KEEP_PREFIX, KEEP_PREFIX, KEEP_PREFIX, KEEP_SUBSET, KEEP_SUBSET};
        long ks[] = {0, 0, 0, 1, 2, -1, -1};
        for (size_t v = 0; v < sizeof kinds / sizeof kinds[0]; v++) {
            o.crash_at = k;
            o.keep = kinds[v];
            o.keep_k = ks[v];
            (*runs)++;
            if (run_and_report(seed, &o, 0, "crash-point") != RUN_PASS) failures++;
        }
    }
    return failures;
}

/* ---- named cases: seeds that once found a defect (regressions) ----
 * A seed stands for its case only while the workload it draws stays the
 * same: whatever draws more from s->rng changes every seed. Features added
 * later draw from their own rng and are switched on by the schedule's last
 * draws, so that a seed without them runs as before (the cases below have
 * them off, or not before the failure). Each case failed on the code
 * before its fix, and passes after. */

struct sim_case {
    const char *name;
    uint64_t seed;
    const char *what;
};

static const struct sim_case regression_cases[] = {
    /* a write fails while a start cuts the torn tail of the newest segment:
     * recover() refused the log as damaged (BG_CORRUPT, "wal_refused")
     * instead of failing the start as an I/O error that a restart clears */
    {"torn-tail-cut-io-error", 2230, "a failed cut of a torn tail is an I/O error, not damage"},
    /* defect 1: wal_mark answered 0 while the log had failed, so a DELETED
     * went at once; the machine stopped; the job was back */
    {"delete-acked-while-log-failed", 14521, "job 2 is back, but its delete was acknowledged"},
    /* defect 1 again: a RELEASED with a new priority, a BURIED, a BURIED
     * of a job whose put had not reached the disk */
    {"release-acked-while-log-failed", 16797, "job 1 has priority 100, acknowledged 300"},
    {"bury-acked-while-log-failed", 16131, "job 5 is not buried, acknowledged buried"},
    {"bury-acked-before-put-kept", 9133, "job 8 is lost: its put was acknowledged"},
    /* RESERVED showed a job whose put was not synced (the reserving
     * session had appended nothing, so its reply waited for nothing); the
     * machine stopped, the put was lost and its id given to the next put */
    {"reserved-before-put-kept", 7927, "id reuse: the next id is 2, but a reply showed id 2"},
    /* defect 5: a failed fdatasync forgets the new segment's header and
     * first batch; the batch is written again and synced, the header is
     * not: after a crash the segment has no header and records after it,
     * and the start is refused */
    {"header-lost-at-failed-sync", 16724, "the log was refused at recovery (CORRUPT)"},
    /* no injected fault, only a crash: the start makes segment 54 and
     * writes its header without a sync; compaction rotates at once to 55
     * and writes 55's header before 54 is synced; the machine stops: 54's
     * header is torn (13 of 16 bytes) and 55 is empty, so 54 is damage in
     * a segment that is not the newest, and the start is refused (the
     * suspected "header written before the old segment is synced") */
    {"header-before-older-segment-synced", 23535, "the log was refused at recovery (CORRUPT)"},
    /* after a failed sync, compaction_abandon dropped the snapshot end
     * record from pending without renumbering: every later batch claimed
     * one record more than it held, so a DELETED waiting for its record
     * went while the record was still in pending; the log then failed for
     * good, the machine stopped, the job was back */
    {"snapshot-end-dropped-shifts-positions", 53040, "job 97 is back, but its delete was acknowledged"},
    /* a batch of 1499 bytes at offset 3286 spans two pages; the machine
     * stops before its sync and the kernel had written only the second
     * page: zeros, then valid records. The unsynced tail of the newest
     * segment is taken for damage (readable records after the tear), and
     * the start is refused although nothing acknowledged is missing; now a
     * torn tail (an unwritten page, core/journal.c) */
    {"unsynced-pages-out-of-order", 20213, "the log was refused at recovery (CORRUPT)"},
    /* the same (a page never written back before valid records), found
     * by random runs after the merge */
    {"unsynced-pages-out-of-order-2", 33726, "the log was refused at recovery (CORRUPT)"},
    {"unsynced-pages-out-of-order-3", 43809, "the log was refused at recovery (CORRUPT)"},
    {"unsynced-pages-out-of-order-4", 48487, "the log was refused at recovery (CORRUPT)"},
    /* the same, where the lost page ends a byte into the frame of the
     * record at the stop (the rest of the frame on a page written back) */
    {"unwritten-page-ends-inside-frame", 98654, "the log was refused at recovery (CORRUPT)"},
    {NULL, 0, NULL},
};

/* Seeds that fail because of a defect not fixed yet: run, and reported as
 * expected failures (a pass is reported too: move it to the list above).
 * Each names the defect of issue 21 it shows. */
static const struct sim_case expected_to_fail[] = {
    {NULL, 0, NULL},
};

/* Nonzero if seed is on the expected_to_fail list (reported there). */
static int expected(uint64_t seed)
{
    for (const struct sim_case *c = expected_to_fail; c->name; c++)
        if (c->seed == seed) return 1;
    return 0;
}

static int sanitized(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 1;
#endif
#endif
    return 0;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* What a run did, in one number: a seed must give the same every time. */
static uint64_t run_digest(const struct sim *s)
{
    char text[700];
    snprintf(text, sizeof text, "%llu %llu %llu %llu %llu %llu %s", (unsigned long long)fault_storage_ops(s->st),
             (unsigned long long)s->step, (unsigned long long)s->crashes, (unsigned long long)s->puts,
             (unsigned long long)s->migrated, (unsigned long long)s->model.max_shown, s->why);
    return model_body_hash(text, strlen(text));
}

/* Each of a few seeds twice: the same digest, or a failure. */
static int check_determinism(void)
{
    static const uint64_t seeds[] = {1, 11, 2230, 16724};
    struct run_options o = {0};
    int failed = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        uint64_t d[2];
        for (int k = 0; k < 2; k++) {
            struct sim s;
            run_seed(seeds[i], &o, 0, &s);
            d[k] = run_digest(&s);
            sim_free(&s);
        }
        if (d[0] != d[1]) {
            printf("FAIL seed %llu: two runs differ (the simulator is not deterministic)\n",
                   (unsigned long long)seeds[i]);
            failed++;
        }
    }
    return failed;
}

static int run_cases(void)
{
    int failed = check_determinism();
    struct run_options o = {0};
    for (const struct sim_case *c = regression_cases; c->name; c++)
        if (run_and_report(c->seed, &o, 0, c->name) != RUN_PASS) failed++;
    for (const struct sim_case *c = expected_to_fail; c->name; c++) {
        struct sim s;
        int rc = run_seed(c->seed, &o, 0, &s);
        printf("%s seed %llu %s: %s\n", rc == RUN_PASS ? "NOW PASSES (move it to regression_cases)" : "expected failure",
               (unsigned long long)c->seed, c->name, rc == RUN_PASS ? c->what : s.why);
        sim_free(&s);
    }
    return failed;
}

static void usage(void)
{
    fprintf(stderr, "usage: sim [--seed N [-v]] [--seeds N | --minutes M] [--start S] [--crash-points N]\n"
                    "           [--seed N --crash-at K --keep 0-4 --keep-k K]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    uint64_t seed = 0, seeds = 0, start = 1, crash_at = 0, points = 0;
    int have_seed = 0, verbose = 0, keep = KEEP_NONE;
    long keep_k = 0;
    double minutes = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-v")) verbose = 1;
        else if (!strcmp(a, "--seed") && v) seed = strtoull(v, NULL, 10), have_seed = 1, i++;
        else if (!strcmp(a, "--seeds") && v) seeds = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--start") && v) start = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--minutes") && v) minutes = strtod(v, NULL), i++;
        else if (!strcmp(a, "--crash-points") && v) points = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--crash-at") && v) crash_at = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--keep") && v) keep = atoi(v), i++;
        else if (!strcmp(a, "--keep-k") && v) keep_k = strtol(v, NULL, 10), i++;
        else usage();
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (have_seed) {
        struct run_options o = {.crash_at = crash_at, .keep = (enum crash_keep)keep, .keep_k = keep_k};
        if (crash_at) o.steps = CRASH_POINT_STEPS, o.no_faults = 1;
        return run_and_report(seed, &o, verbose, NULL) == RUN_PASS ? 0 : 1;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (points) {
        uint64_t runs = 0;
        int failed = 0;
        for (uint64_t k = 0; k < points; k++) failed += crash_points(start + k, CRASH_POINT_STEPS, &runs);
        printf("crash points: %llu seeds, %llu crash runs, %d failed, %.1f s\n", (unsigned long long)points,
               (unsigned long long)runs, failed, seconds_since(&t0));
        print_failure_kinds();
        return failed ? 1 : 0;
    }
    int failed = 0;
    if (!seeds && !minutes) failed += run_cases();
    double budget = minutes * 60;
    if (!seeds && !minutes) {
        const char *env = getenv("BEANGATE_SIM_SECONDS");
        budget = env ? strtod(env, NULL) : sanitized() ? 15 : 60;
    }
    struct run_options o = {0};
    uint64_t n = 0;
    for (; seeds ? n < seeds : seconds_since(&t0) < budget; n++)
        if (!expected(start + n) && run_and_report(start + n, &o, 0, NULL) != RUN_PASS) failed++;
    double took = seconds_since(&t0);
    printf("sim: %llu seeds (from %llu), %d failed, %.1f s, %.0f seeds/s\n", (unsigned long long)n,
           (unsigned long long)start, failed, took, took > 0 ? (double)n / took : 0.0);
    print_failure_kinds();
    return failed ? 1 : 0;
}

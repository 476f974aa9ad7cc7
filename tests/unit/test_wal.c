/* test_wal.c - io/wal.c on a real log in a temporary directory: when a
 * reply may go (positions and holds; the loop is this test's own event
 * base: nothing is written until the test hands the log its batch), and,
 * in the synchronous mode (no flusher thread) on the disk-fault storage
 * (io/storage_faulty.h), what a failed sync, a record that could not be
 * buffered and bytes applied from a stream do to the log. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../io/loop.h"
#include "../../io/storage_faulty.h"
#include "../../io/wal.h"
#include "tempdir.h"

#define T0 ((bg_time)1000 * BG_SECOND)

struct log_world {
    char dir[40];
    struct event_base *base;
    struct bg_engine engine;
    struct bg_client client;
    struct wal *wal;
};

static void open_world(struct log_world *w, int fsync_ms)
{
    memset(w, 0, sizeof *w);
    tempdir_make(w->dir, sizeof w->dir, "wal");
    w->base = event_base_new();
    assert_non_null(w->base);
    assert_int_equal(bg_engine_init(&w->engine, 1000, NULL), 0);
    struct wal_config cfg = {.dir = w->dir, .fsync_ms = fsync_ms, .segment_size = 1 << 20};
    assert_int_equal(wal_open(&w->wal, &cfg, &w->engine, w->base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w->engine, &w->client, &bg_client_ops_never_wait, NULL), 0);
}

static void close_world(struct log_world *w)
{
    bg_client_close(&w->client, T0);
    wal_close(w->wal);
    bg_engine_destroy(&w->engine);
    event_base_free(w->base);
    tempdir_remove(w->dir);
}

/* Put a job (its records appended); the id. */
static uint64_t put(struct log_world *w)
{
    uint64_t id;
    assert_int_equal(bg_put_copy(&w->client, "t", 0, 0, 60, "x", 1, T0, &id), 0);
    return id;
}

/* The log position a put's reply depends on (engine->reply_pos, zeroed
 * first as a front-end does). */
static uint64_t put_position(struct log_world *w, uint64_t *id)
{
    w->engine.reply_pos = 0;
    uint64_t got = put(w);
    if (id) *id = got;
    return w->engine.reply_pos;
}

/* The position a reply showing job id depends on. */
static uint64_t show_position(struct log_world *w, uint64_t id)
{
    w->engine.reply_pos = 0;
    struct bg_job *j = bg_job_find(&w->engine, id);
    assert_non_null(j);
    bg_engine_show_job(&w->engine, j);
    return w->engine.reply_pos;
}

/* Which holds were called back, in order. */
static struct {
    struct wal_hold *called[8];
    int n;
} calls;

static void durable(struct wal_hold *h) { calls.called[calls.n++] = h; }

/* Hand the log its batch and run the loop until the flusher reports. */
static void flush(struct log_world *w)
{
    wal_kick(w->wal);
    assert_int_equal(event_base_loop(w->base, EVLOOP_ONCE), 0);
}

/* -f 0: each put carries a later position; holds are called back in
 * position order once it is on disk, a hold taken back is not called, a
 * position already on disk is called back at once. */
static void test_holds_in_position_order(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 0);
    memset(&calls, 0, sizeof calls);
    struct wal_hold h1 = {0}, h2 = {0}, h3 = {0}, h4 = {0};
    uint64_t m1 = put_position(&w, NULL);
    uint64_t m2 = put_position(&w, NULL);
    assert_true(0 < m1 && m1 < m2);
    assert_false(wal_reply_may_go(w.wal, m1));
    wal_hold(w.wal, &h2, m2, durable);
    wal_hold(w.wal, &h1, m1, durable); /* a lower position queued later goes first */
    wal_hold(w.wal, &h3, m2, durable);
    wal_unhold(w.wal, &h3);            /* its reply went away */
    wal_unhold(w.wal, &h3);            /* twice is harmless */
    assert_int_equal(calls.n, 0);
    flush(&w);
    assert_true(wal_reply_may_go(w.wal, m2));
    assert_int_equal(calls.n, 2);
    assert_ptr_equal(calls.called[0], &h1);
    assert_ptr_equal(calls.called[1], &h2);
    wal_hold(w.wal, &h4, m1, durable); /* on disk already */
    assert_int_equal(calls.n, 3);
    assert_ptr_equal(calls.called[2], &h4);
    close_world(&w);
}

/* -f 0: a reply that only shows a job (RESERVED, FOUND) depends on the
 * job's put while that is not on disk, and on nothing once it is; a delete
 * depends on its own record. */
static void test_showing_a_job_waits_for_its_put(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 0);
    uint64_t id;
    uint64_t put_pos = put_position(&w, &id);
    uint64_t shown = show_position(&w, id);
    assert_true(shown >= put_pos);
    assert_false(wal_reply_may_go(w.wal, shown));
    flush(&w);
    assert_true(wal_reply_may_go(w.wal, shown));
    assert_int_equal(show_position(&w, id), 0);
    w.engine.reply_pos = 0;
    assert_int_equal(bg_delete(&w.client, id, T0), 0);
    assert_true(w.engine.reply_pos > put_pos);
    assert_false(wal_reply_may_go(w.wal, w.engine.reply_pos));
    close_world(&w);
}

/* -f 50: replies do not wait for their records, except for an id beyond
 * the logged id floor (the first put after a start); without a log
 * nothing waits. */
static void test_only_new_ids_wait_with_fsync_interval(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 50);
    uint64_t id;
    uint64_t first = put_position(&w, &id);
    assert_true(first > 0); /* its id is beyond the floor the log holds */
    assert_false(wal_reply_may_go(w.wal, first));
    assert_int_equal(show_position(&w, id), first);
    flush(&w);              /* the first batch after a start is synced */
    assert_true(wal_reply_may_go(w.wal, first));
    assert_int_equal(put_position(&w, NULL), 0);
    assert_int_equal(show_position(&w, id), 0);
    w.engine.reply_pos = 0;
    assert_int_equal(bg_delete(&w.client, id, T0), 0);
    assert_int_equal(w.engine.reply_pos, 0);
    assert_true(wal_reply_may_go(NULL, 5));
    close_world(&w);
}

/* Ids never come back: the log holds an id floor ahead of the ids given
 * out, so a start continues above every id a reply may have shown, even
 * one whose put a machine crash lost (replies with -f N > 0 do not wait
 * for the put). */
static void test_ids_continue_above_the_floor(void **state)
{
    (void)state;
    struct log_world w;
    open_world(&w, 50);
    uint64_t id = put(&w);
    flush(&w);
    bg_client_close(&w.client, T0);
    wal_close(w.wal);
    bg_engine_destroy(&w.engine);
    assert_int_equal(bg_engine_init(&w.engine, 1000, NULL), 0);
    struct wal_config cfg = {.dir = w.dir, .fsync_ms = 50, .segment_size = 1 << 20};
    assert_int_equal(wal_open(&w.wal, &cfg, &w.engine, w.base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w.engine, &w.client, &bg_client_ops_never_wait, NULL), 0);
    assert_true(put(&w) > id + (1u << 19)); /* above the floor, not id + 1 */
    close_world(&w);
}

/* ---- the synchronous mode on the disk-fault storage ---------------------- */

/* A storage that passes every call on to `inner` and notes, in order, the
 * segments created and deleted and the directory's syncs. */
struct recording {
    struct storage s;
    struct storage *inner;
    struct dir_event {
        char op;               /* 'c' created, 'u' unlinked, 'd' directory synced */
        uint64_t index;        /* the segment (c, u) */
    } events[8192];
    size_t n;
    int unlink_error;          /* nonzero: every unlink fails with it (and is noted) */
};

static struct recording *recording_of(struct storage *s) { return (struct recording *)s; }

/* Note op on the segment `name` names (none for another file). */
static void recorded(struct storage *s, char op, const char *name)
{
    struct recording *r = recording_of(s);
    unsigned long long index = 0;
    if (name && sscanf(name, "beangate.%llu.wal", &index) != 1) return;
    assert_true(r->n < sizeof r->events / sizeof r->events[0]);
    r->events[r->n].op = op;
    r->events[r->n++].index = index;
}

static int rec_create(struct storage *s, const char *name, int *h)
{
    struct storage *in = recording_of(s)->inner;
    int e = in->ops->create(in, name, h);
    if (!e) recorded(s, 'c', name);
    return e;
}
static int rec_open(struct storage *s, const char *name, int *h)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->open(in, name, h);
}
static int rec_pwrite(struct storage *s, int h, const void *p, size_t n, uint64_t off, size_t *written)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->pwrite(in, h, p, n, off, written);
}
static int rec_sync(struct storage *s, int h)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->sync(in, h);
}
static int rec_sync_dir(struct storage *s)
{
    struct storage *in = recording_of(s)->inner;
    int e = in->ops->sync_dir(in);
    if (!e) recorded(s, 'd', NULL);
    return e;
}
static int rec_truncate(struct storage *s, int h, uint64_t len)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->truncate(in, h, len);
}
static int rec_close(struct storage *s, int h)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->close(in, h);
}
static int rec_unlink(struct storage *s, const char *name)
{
    struct storage *in = recording_of(s)->inner;
    recorded(s, 'u', name);
    if (recording_of(s)->unlink_error) return recording_of(s)->unlink_error;
    return in->ops->unlink(in, name);
}
static int rec_rename(struct storage *s, const char *from, const char *to)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->rename(in, from, to);
}
static int rec_list(struct storage *s, char ***names, size_t *count)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->list(in, names, count);
}
static int rec_read_all(struct storage *s, const char *name, char **data, size_t *len)
{
    struct storage *in = recording_of(s)->inner;
    return in->ops->read_all(in, name, data, len);
}
static void rec_release(struct storage *s, char *data, size_t len)
{
    struct storage *in = recording_of(s)->inner;
    in->ops->release(in, data, len);
}
static void rec_destroy(struct storage *s)
{
    struct storage *in = recording_of(s)->inner;
    in->ops->destroy(in);
}

static const struct storage_ops recording_ops = {
    rec_create, rec_open,   rec_pwrite, rec_sync,     rec_sync_dir, rec_truncate, rec_close,
    rec_unlink, rec_rename, rec_list,   rec_read_all, rec_release,  rec_destroy,
};


/* A log in synchronous mode on the fault storage of dir (its control file
 * dir/../<dir>.faults), with its own engine. */
struct sync_world {
    char dir[40];
    char faults[64];
    struct event_base *base;
    struct bg_engine engine;
    struct bg_client client;
    struct storage *storage;
    struct wal *wal;
    int fsync_ms;              /* -f (0 unless a test sets it before sync_open) */
    struct recording *rec;     /* set before sync_open: the storage's calls are noted there */
    uint64_t put_pos;          /* the log position the last sync_put's reply depends on */
};

static void write_faults(struct sync_world *w, const char *text)
{
    FILE *f = fopen(w->faults, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    /* a new mtime even within one clock tick: the size differs, or touch */
    struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
    utimensat(AT_FDCWD, w->faults, times, 0);
}

static void sync_open(struct sync_world *w, uint64_t segment_size)
{
    memset(&w->engine, 0, sizeof w->engine);
    assert_int_equal(bg_engine_init(&w->engine, 1 << 20, NULL), 0);
    struct storage *posix;
    assert_int_equal(storage_posix_open(&posix, w->dir, 1), 0);
    assert_int_equal(storage_faulty_wrap(&w->storage, posix, w->faults), 0);
    if (w->rec) {
        w->rec->s.ops = &recording_ops;
        w->rec->inner = w->storage;
        w->storage = &w->rec->s;
    }
    struct wal_config cfg = {.dir = w->dir, .fsync_ms = w->fsync_ms, .segment_size = segment_size,
                             .storage = w->storage, .synchronous = 1};
    assert_int_equal(wal_open(&w->wal, &cfg, &w->engine, w->base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w->engine, &w->client, &bg_client_ops_never_wait, NULL), 0);
}

static void sync_close(struct sync_world *w)
{
    bg_client_close(&w->client, T0);
    wal_close(w->wal);
    w->storage->ops->destroy(w->storage);
    bg_engine_destroy(&w->engine);
}

/* A world's directory (named after `name`), control file and event base,
 * before sync_open (a test sets fsync_ms or rec in between). */
static void sync_world_begin(struct sync_world *w, const char *name)
{
    memset(w, 0, sizeof *w);
    tempdir_make(w->dir, sizeof w->dir, name);
    snprintf(w->faults, sizeof w->faults, "%s.faults", w->dir);
    write_faults(w, "");
    w->base = event_base_new();
    assert_non_null(w->base);
}

static void sync_world_make(struct sync_world *w, uint64_t segment_size)
{
    sync_world_begin(w, "walsync");
    sync_open(w, segment_size);
}

static void sync_world_free(struct sync_world *w)
{
    sync_close(w);
    event_base_free(w->base);
    tempdir_remove(w->dir);
    unlink(w->faults);
}

/* Hand on what was appended and do the flusher's work, until nothing is
 * handed on any more (at most `turns`). */
static void sync_flush(struct sync_world *w, int turns)
{
    for (int i = 0; i < turns; i++) {
        wal_kick(w->wal);
        wal_run_flusher(w->wal);
    }
}

static uint64_t sync_put(struct sync_world *w, const char *body, size_t len)
{
    uint64_t id;
    w->engine.reply_pos = 0;
    assert_int_equal(bg_put_copy(&w->client, "t", 0, 0, 60, body, len, T0, &id), 0);
    w->put_pos = w->engine.reply_pos;
    return id;
}

/* Restart: close, open again on the same directory (recovery). */
static void sync_restart(struct sync_world *w)
{
    sync_close(w);
    sync_open(w, 1 << 20);
}

/* The synchronous mode: wal_kick hands a batch on, wal_run_flusher writes
 * and syncs it on this thread and releases the holds it secured. */
static void test_synchronous_mode_runs_the_flusher_here(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 1 << 20);
    memset(&calls, 0, sizeof calls);
    sync_put(&w, "a", 1);
    uint64_t m = w.put_pos;
    struct wal_hold h = {0};
    wal_hold(w.wal, &h, m, durable);
    wal_kick(w.wal);
    assert_false(wal_reply_may_go(w.wal, m)); /* handed on, not written */
    wal_run_flusher(w.wal);
    assert_true(wal_reply_may_go(w.wal, m));
    assert_int_equal(calls.n, 1);
    wal_run_flusher(w.wal); /* nothing handed on: nothing */
    sync_world_free(&w);
}

/* -f 0: after a batch whose replies went, the next one waits for as many
 * more records as replies went (gather_done in io/wal.c): it goes as soon
 * as they are there, and short of them by its timer at the latest; after
 * a wait that came up short, the next batch does not wait. */
static void test_next_batch_gathers_the_answered_peers(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 1 << 20);
    memset(&calls, 0, sizeof calls);
    struct wal_hold h[2] = {{0}};
    sync_put(&w, "a", 1);
    for (int i = 0; i < 2; i++) wal_hold(w.wal, &h[i], w.put_pos, durable);
    sync_flush(&w, 1);
    assert_int_equal(calls.n, 2); /* two replies went: the next batch gathers two records */
    sync_put(&w, "b", 1);
    sync_put(&w, "c", 1);
    sync_flush(&w, 1); /* both there: handed on and written at once */
    assert_true(wal_reply_may_go(w.wal, w.put_pos));
    for (int i = 0; i < 2; i++) wal_hold(w.wal, &h[i], w.put_pos + 1, durable);
    sync_put(&w, "d", 1);
    sync_flush(&w, 1);
    assert_int_equal(calls.n, 4);
    sync_put(&w, "e", 1); /* one of two: the gather timer hands it on */
    wal_kick(w.wal);      /* as the loop does after every callback */
    for (int turn = 0; turn < 100 && !wal_reply_may_go(w.wal, w.put_pos); turn++) {
        event_base_loop(w.base, EVLOOP_ONCE);
        wal_run_flusher(w.wal);
    }
    assert_true(wal_reply_may_go(w.wal, w.put_pos));
    /* that wait came up short: after the next batch's replies nothing waits */
    for (int i = 0; i < 2; i++) wal_hold(w.wal, &h[i], w.put_pos + 1, durable);
    sync_put(&w, "f", 1);
    sync_flush(&w, 1);
    assert_int_equal(calls.n, 6);
    sync_put(&w, "g", 1);
    sync_flush(&w, 1);
    assert_true(wal_reply_may_go(w.wal, w.put_pos));
    sync_world_free(&w);
}

/* fsyncgate: a failed sync (whose bytes the fault storage then zeroes, as
 * a kernel may drop them) makes the log write everything since the last
 * good sync again into a fresh segment; the mark is reached only once
 * that is synced, and a restart reads every job. */
static void test_failed_sync_rewrites_into_fresh_segment(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 1 << 20);
    uint64_t first = sync_put(&w, "first", 5);
    sync_flush(&w, 2);
    write_faults(&w, "sync EIO once\n");
    uint64_t second = sync_put(&w, "second", 6);
    uint64_t m = w.put_pos;
    sync_flush(&w, 2);
    assert_false(wal_reply_may_go(w.wal, m));
    assert_int_equal(w.engine.journal_broken, 1);
    /* the retry comes once a second: the stop's finish waits for it */
    assert_int_equal(wal_finish(w.wal, loop_now() + 5 * BG_SECOND), 0);
    assert_true(wal_reply_may_go(w.wal, m));
    struct bg_process_info pi = {0};
    wal_stats(w.wal, &pi);
    assert_int_equal(pi.binlog_current, 2); /* 1: the one the sync failed in, cut back; 2: the rewrite */
    sync_restart(&w);
    assert_non_null(bg_job_find(&w.engine, first));
    assert_non_null(bg_job_find(&w.engine, second));
    sync_world_free(&w);
}

/* wal_progress: `appended` counts each record as it is appended (a put,
 * a delete), `written` stays where it was while a batch is only handed on
 * or its write failed, and reaches `appended` once the flusher wrote it (a
 * retry, after a failure); a NULL log is {0, 0}. What bulk.c paces its
 * steps by. */
static void test_progress_tells_the_backlog(void **state)
{
    (void)state;
    struct wal_progress none = wal_progress(NULL);
    assert_true(none.appended == 0 && none.written == 0);
    struct sync_world w;
    sync_world_make(&w, 1 << 20);
    struct wal_progress p0 = wal_progress(w.wal);
    assert_true(p0.written == p0.appended);
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) ids[i] = sync_put(&w, "x", 1);
    struct wal_progress p1 = wal_progress(w.wal);
    assert_int_equal(p1.appended - p0.appended, 3); /* -f 0: a record a put, no id floor */
    assert_int_equal(p1.written, p0.written);
    wal_kick(w.wal);
    assert_int_equal(wal_progress(w.wal).written, p0.written); /* handed on, not written */
    wal_run_flusher(w.wal);
    struct wal_progress p2 = wal_progress(w.wal);
    assert_int_equal(p2.appended, p1.appended);
    assert_int_equal(p2.written, p1.appended);
    /* deletes are records too; a failed write leaves them behind */
    write_faults(&w, "write EIO once\n");
    for (int i = 0; i < 2; i++) assert_int_equal(bg_delete(&w.client, ids[i], T0), 0);
    struct wal_progress p3 = wal_progress(w.wal);
    assert_int_equal(p3.appended - p2.appended, 2);
    sync_flush(&w, 2);
    assert_int_equal(w.engine.journal_broken, 1);
    assert_int_equal(wal_progress(w.wal).written, p2.written);
    /* the retry comes once a second: the stop's finish waits for it */
    assert_int_equal(wal_finish(w.wal, loop_now() + 5 * BG_SECOND), 0);
    struct wal_progress p4 = wal_progress(w.wal);
    assert_int_equal(p4.written, p3.appended);
    assert_int_equal(p4.appended, p3.appended);
    sync_world_free(&w);
}

/* Nonzero if dir holds the file name. */
static int file_exists(const char *dir, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* A rotation creates the new segment only once the old one is synced (the
 * flusher does both, in that order): after a failed sync of the old one the
 * new one does not exist. Before, the loop created it (header and all)
 * while the old one's last batch was not synced yet, so a machine crash
 * could leave a torn segment that is not the newest: damage. */
static void test_rotation_creates_segment_after_old_is_synced(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_begin(&w, "walrot");
    w.fsync_ms = 1000; /* -f 1000: batches are written, synced later */
    sync_open(&w, 4096);
    static char body[3000];
    memset(body, 'r', sizeof body);
    uint64_t a = sync_put(&w, body, sizeof body);
    sync_flush(&w, 1); /* written into segment 1, not synced */
    write_faults(&w, "sync EIO once\n");
    uint64_t b = sync_put(&w, body, sizeof body); /* segment 1 is full: rotation */
    sync_flush(&w, 1);
    assert_int_equal(w.engine.journal_broken, 1);
    assert_false(file_exists(w.dir, "beangate.2.wal")); /* not before segment 1 is synced */
    assert_int_equal(wal_finish(w.wal, loop_now() + 5 * BG_SECOND), 0);
    sync_restart(&w);
    assert_non_null(bg_job_find(&w.engine, a));
    assert_non_null(bg_job_find(&w.engine, b));
    sync_world_free(&w);
}

/* A record that could not be buffered (out of memory): the change is in
 * the engine but not in the log. The log stays failed until a snapshot
 * that began after it is on disk; then the job is there after a restart. */
static void test_unbuffered_record_heals_by_snapshot(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 1 << 20);
    sync_put(&w, "a", 1);
    sync_flush(&w, 2);
    /* a body bigger than the buffer holds: the record's append reallocates;
     * fail the allocations one by one until the put goes and its record not */
    static char big[200000];
    memset(big, 'b', sizeof big);
    uint64_t id = 0;
    for (uint64_t n = 1; n < 20 && !w.engine.journal_broken; n++) {
        bg_alloc_fail_after(n);
        if (bg_put_copy(&w.client, "t", 0, 0, 60, big, sizeof big, T0, &id) != 0) id = 0;
        bg_alloc_fail_after(0);
        if (!w.engine.journal_broken && id) bg_delete(&w.client, id, T0), id = 0, sync_flush(&w, 2);
    }
    assert_int_equal(w.engine.journal_broken, 1);
    assert_true(id != 0);
    sync_flush(&w, 1); /* a good batch alone does not heal it */
    sync_flush(&w, 8); /* the snapshot forced by the loss */
    assert_int_equal(w.engine.journal_broken, 0);
    sync_restart(&w);
    struct bg_job *j = bg_job_find(&w.engine, id);
    assert_non_null(j);
    assert_int_equal(j->body_size, sizeof big + 2); /* with its CRLF */
    sync_world_free(&w);
}

/* Bytes applied from a stream count for the stream, not for the
 * directory: a log that applied more than its segments hold compacts once,
 * not on every batch (defect 7: records_migrated grew while idle). */
static void test_applied_stream_bytes_do_not_compact_the_directory(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 65536);
    struct bg_buf msg = {0};
    for (uint64_t id = 1000; id < 2000; id++) { /* 1000 puts and their deletes: nothing alive */
        struct bg_journal_job r = {.id = id, .tube = "t", .ttr_s = 60, .body = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n",
                                   .body_len = 40, .state = BG_JOB_READY};
        assert_int_equal(bg_journal_encode_job(&msg, &r, 1), 0);
        assert_int_equal(bg_journal_encode_delete(&msg, id), 0);
    }
    assert_int_equal(wal_apply(w.wal, 1, bg_buf_head(&msg), msg.len), 0);
    bg_buf_free(&msg);
    sync_put(&w, "alive", 5);
    sync_flush(&w, 4);
    struct bg_process_info before = {0}, after = {0};
    wal_stats(w.wal, &before);
    for (int i = 0; i < 20; i++) {
        sync_put(&w, "more", 4);
        sync_flush(&w, 2);
    }
    wal_stats(w.wal, &after);
    assert_int_equal(after.binlog_migrated, before.binlog_migrated);
    sync_world_free(&w);
}

/* Nonzero if a segment file of dir holds a delete record of job id. */
static int log_holds_delete(const char *dir, uint64_t id)
{
    int found = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (!strstr(e->d_name, ".wal")) continue;
        char path[320];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static char data[1 << 16];
        size_t len = fread(data, 1, sizeof data, f), used;
        fclose(f);
        struct bg_journal_record rec;
        for (size_t at = BG_JOURNAL_HEADER_SIZE; at < len && !found; at += used) {
            if (bg_journal_decode(data + at, len - at, &rec, &used) != 0) break;
            found = rec.type == BG_REC_DELETE && rec.job.id == id;
        }
    }
    closedir(d);
    return found;
}

/* The segment files in dir. */
static int segment_files(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".wal") != NULL;
    closedir(d);
    return n;
}

/* Once a snapshot is on disk, the segments it superseded are deleted: by
 * the dropper thread, off the batches' path (an unlink of a big file takes
 * milliseconds that a durable put's sync would wait), here, in the
 * synchronous mode, at once; no new compaction begins before they are
 * gone, and in the end only the snapshot's segment and those after it are
 * left, and they read back. */
static void test_superseded_segments_go(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 4096);
    static const char body[200] = {0};
    uint64_t ids[100];
    for (int i = 0; i < 100; i++) {
        ids[i] = sync_put(&w, body, sizeof body);
        sync_flush(&w, 1);
    }
    int most = segment_files(w.dir);
    assert_true(most >= 5);
    for (int i = 0; i < 100; i++) assert_int_equal(bg_delete(&w.client, ids[i], T0), 0);
    int fewest = most;
    for (int turn = 0; turn < 40; turn++) {
        sync_flush(&w, 1);
        int now = segment_files(w.dir);
        if (now < fewest) fewest = now;
    }
    assert_true(fewest <= 2);
    sync_restart(&w); /* what is left reads back: no job */
    for (int i = 0; i < 100; i++) assert_null(bg_job_find(&w.engine, ids[i]));
    sync_world_free(&w);
}

/* A superseded segment whose unlink fails stays (recovery deletes it), and
 * the failure is counted where the log's counters are (wal_stats:
 * binlog_unlink_failures), one per file; ENOENT (gone already) is no
 * failure. */
static void test_failed_unlink_is_counted(void **state)
{
    (void)state;
    for (int round = 0; round < 2; round++) {
        int error = round == 0 ? EACCES : ENOENT;
        struct sync_world w;
        sync_world_begin(&w, "walunlink");
        static struct recording rec;
        memset(&rec, 0, sizeof rec);
        rec.unlink_error = error;
        w.rec = &rec;
        sync_open(&w, 4096);
        static const char body[200] = {0};
        uint64_t ids[100];
        for (int i = 0; i < 100; i++) {
            ids[i] = sync_put(&w, body, sizeof body);
            sync_flush(&w, 1);
        }
        for (int i = 0; i < 100; i++) assert_int_equal(bg_delete(&w.client, ids[i], T0), 0);
        sync_flush(&w, 40);
        uint64_t unlinks = 0;
        for (size_t u = 0; u < rec.n; u++) unlinks += rec.events[u].op == 'u';
        assert_true(unlinks >= 3); /* compaction superseded segments, and their unlinks failed */
        struct bg_process_info pi = {0};
        wal_stats(w.wal, &pi);
        assert_int_equal(pi.binlog_unlink_failures, error == ENOENT ? 0 : unlinks);
        assert_true((uint64_t)segment_files(w.dir) > unlinks); /* the files are still there */
        sync_world_free(&w);
    }
}

/* With the dropper thread, a compaction that supersedes more segments than
 * the dropper's queue holds (64): a close right after it deletes them all
 * (the dropper its queue, the close the rest), none left for the next
 * start to find. */
static void test_close_deletes_superseded_beyond_the_queue(void **state)
{
    (void)state;
    struct log_world w;
    memset(&w, 0, sizeof w);
    tempdir_make(w.dir, sizeof w.dir, "waldrop");
    w.base = event_base_new();
    assert_non_null(w.base);
    assert_int_equal(bg_engine_init(&w.engine, 1 << 20, NULL), 0);
    struct wal_config cfg = {.dir = w.dir, .segment_size = 4096};
    assert_int_equal(wal_open(&w.wal, &cfg, &w.engine, w.base, T0, (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init(&w.engine, &w.client, &bg_client_ops_never_wait, NULL), 0);
    static char body[1200];
    memset(body, 'd', sizeof body);
    uint64_t ids[600];
    for (int i = 0; i < 600; i++) { /* three to a batch, a batch to a segment */
        assert_int_equal(bg_put_copy(&w.client, "t", 0, 0, 60, body, sizeof body, T0, &ids[i]), 0);
        if (i % 3 == 2) flush(&w);
    }
    assert_true(segment_files(w.dir) > 2 * 64 + 2); /* more than the queue and a finish's kick take */
    for (int i = 0; i < 600; i++) assert_int_equal(bg_delete(&w.client, ids[i], T0), 0);
    struct bg_process_info pi = {0};
    for (int turn = 0; turn < 100 && pi.binlog_oldest <= 1; turn++) {
        flush(&w);
        wal_stats(w.wal, &pi);
    }
    assert_true(pi.binlog_oldest > 1); /* the snapshot is on disk: the older segments go */
    bg_client_close(&w.client, T0);
    wal_close(w.wal);
    int left = segment_files(w.dir);
    if (left > 2) fail_msg("%d segment files left after the close, want the snapshot's (and the current)", left);
    bg_engine_destroy(&w.engine);
    event_base_free(w.base);
    tempdir_remove(w.dir);
}

/* With -f N > 0 a snapshot's segment is made in a batch that does not sync
 * (nor sync the directory), and the batch that completes the snapshot, a
 * later one, syncs at once, and then the older segments go. That batch
 * must sync the directory too (w->dir_unsynced): else the superseded
 * segments could be deleted while the name of the one that holds their
 * data is not durable yet, and a crash on a file system that does not
 * order metadata could lose every job. So, in the order the storage saw
 * the calls: before a segment is deleted, the directory was synced after
 * the segment that supersedes it (the lowest one above it that stays) was
 * made. */
static void test_superseded_go_after_the_snapshot_name_is_synced(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_begin(&w, "walorder");
    w.fsync_ms = 60000; /* no batch syncs by time: only the snapshot's last one, at once */
    static struct recording rec;
    memset(&rec, 0, sizeof rec);
    w.rec = &rec;
    sync_open(&w, 256 << 10);
    /* 1,500 live jobs of 1 KB (a snapshot of two 1 MiB steps, so two
     * batches) and 3,000 put and deleted: compaction is due */
    static char body[1024];
    memset(body, 'b', sizeof body);
    for (int i = 0; i < 4500; i++) {
        uint64_t id = sync_put(&w, body, sizeof body);
        if (i >= 1500) assert_int_equal(bg_delete(&w.client, id, T0), 0);
        if (i % 100 == 99) sync_flush(&w, 1);
    }
    sync_flush(&w, 20);
    size_t unlinks = 0;
    for (size_t u = 0; u < rec.n; u++) {
        if (rec.events[u].op != 'u') continue;
        unlinks++;
        uint64_t gone = rec.events[u].index, keeper = UINT64_MAX;
        for (size_t i = 0; i < rec.n; i++) { /* the lowest segment above it that is never deleted */
            int deleted = 0;
            for (size_t j = 0; j < rec.n; j++) deleted |= rec.events[j].op == 'u' && rec.events[j].index == rec.events[i].index;
            if (rec.events[i].op == 'c' && rec.events[i].index > gone && !deleted && rec.events[i].index < keeper)
                keeper = rec.events[i].index;
        }
        assert_true(keeper != UINT64_MAX);
        size_t made = rec.n;
        for (size_t i = 0; i < u; i++) if (rec.events[i].op == 'c' && rec.events[i].index == keeper) made = i;
        int synced_since = 0;
        for (size_t i = made; i < u; i++) synced_since |= rec.events[i].op == 'd';
        if (!synced_since)
            fail_msg("segment %llu deleted before the directory was synced after segment %llu (which holds its data) was made",
                     (unsigned long long)gone, (unsigned long long)keeper);
    }
    assert_true(unlinks >= 3); /* a compaction happened, and deleted what it superseded */
    sync_world_free(&w);
}

/* Kick and flush until the failed batch went again and the log is healthy
 * (its retry comes a second after the failure). */
static void sync_heal(struct sync_world *w)
{
    bg_time deadline = loop_now() + 10 * BG_SECOND;
    while (w->engine.journal_broken && loop_now() < deadline) {
        sync_flush(w, 1);
        struct timespec ts = {0, 10 * 1000 * 1000};
        if (w->engine.journal_broken) nanosleep(&ts, NULL);
    }
    assert_int_equal(w->engine.journal_broken, 0);
}

/* A failed sync abandons the snapshot being written; a complete one that
 * still waits in pending loses its end record. That record must keep its
 * number: positions are record sequences, and dropping it made every
 * batch before it claim one record more than it held, so a DELETED went
 * while its record was still in memory (sim seed 53040). */
static void test_abandoned_snapshot_keeps_positions(void **state)
{
    (void)state;
    struct sync_world w;
    sync_world_make(&w, 1024);
    static char body[1100]; /* one record a batch */
    memset(body, 'j', sizeof body);
    uint64_t first = sync_put(&w, body, sizeof body);
    for (int i = 0; i < 3; i++) sync_put(&w, body, sizeof body);
    sync_flush(&w, 8);
    write_faults(&w, "sync EIO once\n"); /* a failed sync forces a snapshot */
    sync_put(&w, body, sizeof body);
    sync_flush(&w, 1);
    write_faults(&w, "");
    sync_heal(&w);
    write_faults(&w, "sync EIO once\n"); /* snapshot 1 waits whole in pending; its first batch fails */
    sync_flush(&w, 1);
    assert_int_equal(w.engine.journal_broken, 1);
    w.engine.reply_pos = 0;
    assert_int_equal(bg_delete(&w.client, first, T0), 0);
    uint64_t p = w.engine.reply_pos;
    assert_true(p != 0);
    write_faults(&w, "");
    sync_heal(&w);
    write_faults(&w, "sync EIO once\n"); /* snapshot 2 after the delete; its end is dropped */
    sync_flush(&w, 1);
    write_faults(&w, "");
    sync_heal(&w);
    for (int turn = 0; turn < 64 && !wal_reply_may_go(w.wal, p); turn++) sync_flush(&w, 1);
    assert_true(wal_reply_may_go(w.wal, p));
    assert_true(log_holds_delete(w.dir, first)); /* the reply went: its record is on disk */
    sync_world_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holds_in_position_order),
        cmocka_unit_test(test_showing_a_job_waits_for_its_put),
        cmocka_unit_test(test_only_new_ids_wait_with_fsync_interval),
        cmocka_unit_test(test_ids_continue_above_the_floor),
        cmocka_unit_test(test_synchronous_mode_runs_the_flusher_here),
        cmocka_unit_test(test_next_batch_gathers_the_answered_peers),
        cmocka_unit_test(test_failed_sync_rewrites_into_fresh_segment),
        cmocka_unit_test(test_progress_tells_the_backlog),
        cmocka_unit_test(test_rotation_creates_segment_after_old_is_synced),
        cmocka_unit_test(test_unbuffered_record_heals_by_snapshot),
        cmocka_unit_test(test_applied_stream_bytes_do_not_compact_the_directory),
        cmocka_unit_test(test_abandoned_snapshot_keeps_positions),
        cmocka_unit_test(test_superseded_segments_go),
        cmocka_unit_test(test_failed_unlink_is_counted),
        cmocka_unit_test(test_close_deletes_superseded_beyond_the_queue),
        cmocka_unit_test(test_superseded_go_after_the_snapshot_name_is_synced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

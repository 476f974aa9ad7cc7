/* wal.c - the write-ahead log on disk.
 *
 * The loop thread appends records to `pending` (engine hooks below) and,
 * after each callback, hands them as one batch to the flusher thread, which
 * writes them and (per -f) syncs: every put of a loop turn shares one
 * fsync. An eventfd brings the result back to the loop (in the synchronous
 * mode of the simulator there is no thread: wal_run_flusher). With -f 0,
 * replies that depend on a record are held until its batch is synced (the
 * rule: wal_reply_may_go, io/wal.h; positions are record sequences). All
 * file I/O goes through struct storage (io/storage.h).
 *
 * wal_kick is a sequence of steps: a failed batch waiting for its retry
 * (once a second, alone); else what is due, the compaction step, the
 * rotation step, taking a batch, submitting it. A failed write is retried
 * in place; after a failed sync, everything since the last good sync is
 * written again into a fresh segment (rewrite_plan). With --replicate and
 * -b, the stream is the log of record and the directory a copy that a
 * failing disk drops (copy_failed) and a snapshot starts again.
 *
 * Segments are DIR/beangate.<index>.wal. When the segments hold more than
 * twice the live data (plus one segment), a snapshot of every live job is
 * written into a new segment, WAL_SNAPSHOT_STEP_BYTES of records per batch
 * (whatever the jobs' sizes: the memory it takes is one step's) so that the
 * loop never stops for long, between the records of what happens
 * meanwhile; the older segments are deleted once its end record is on
 * disk. Replayed in order, the segment gives the state: a record about a
 * job the snapshot has not reached yet is either an update or delete of an
 * unknown job (ignored) or a new job's own record, and the snapshot then
 * writes each remaining job as it is at that point. */
#include <poll.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/binlog.h"
#include "loop.h"
#include "wal.h"
#include "eventlog.h"
#include "repl.h"
#include "storage.h"
#include "storage_faulty.h"

/* A segment the flusher cuts back to what was synced of it, then closes
 * (after a failed sync: its unsynced bytes may be lost or garbage). */
struct segment_cut {
    int file;                  /* -1: none (or done) */
    uint64_t keep;             /* bytes synced; below a header: an empty segment */
};

enum wal_op { WAL_OP_NONE, WAL_OP_WRITE, WAL_OP_SYNC };

#define WAL_DROP_QUEUE 64u /* superseded segments queued for the dropper at most (the rest: later) */
/* the dropper's pause after an unlink, per MiB the file had: an unlink of a
 * 10 MB segment is journal work that a sync of the log running meanwhile
 * waits for (ext4), so a compaction's ten or twenty go 20 ms apart, not
 * back to back (bench/browse --fsync 0: the worst durable put during a
 * bulk delete 15 to 23 ms with the pause, 31 to 112 ms without) */
#define WAL_DROP_GAP_NS_PER_MIB (2 * BG_SECOND / 1000)

struct wal_batch {
    struct bg_buf data;
    uint64_t end_seq;          /* last record seq in data */
    uint64_t put_id;           /* every put up to this job id is in data or before it */
    int sync;
    /* the disk: data goes to `file` at `offset`, or with new_index into a
     * new segment the flusher starts once `file` is synced (not with -F)
     * and closed: after a crash of the machine only the newest segment may
     * end torn, and a segment's header is never on disk before the data of
     * the one before it */
    int disk;                  /* the batch has a disk part */
    int file;                  /* the current segment; -1 once closed */
    uint64_t offset;           /* its size before data */
    uint64_t new_index;        /* nonzero: start this segment, data after its header */
    int new_file;              /* its handle once created; -1 */
    int fresh;                 /* (re)create new_index on every attempt: a rewrite */
    struct segment_cut cut[2]; /* before anything else (a rewrite) */
    int sync_dir;              /* a segment was created: sync the directory */
    int error;                 /* errno of the flusher, 0 if written */
    enum wal_op failed_op;     /* what failed: a write (or create) or a sync */
    int copy_error;            /* -b with --replicate: the local copy failed (errno); the stream went on */
    /* replication (cfg.repl) */
    int repl_rc;               /* repl_append's result: 0, REPL_FENCED, REPL_STOPPED */
    uint64_t first_seq;        /* the stream sequence of data's first message */
    int snapshot_first;        /* data holds a snapshot's first records */
    uint64_t purge_before;     /* remove the stream's messages before this one (0: none) */
    int purged;                /* ... and it was done */
};

struct wal {
    struct wal_config cfg;
    struct bg_engine *engine;
    struct event_base *base;
    struct storage *storage;   /* the directory's files (NULL: no disk) */
    int own_storage;           /* opened by wal_open: destroyed by wal_close */
    struct storage *posix;     /* the real files under it, if known (wal_chown) */
    /* segments: index -> size, for [first_index, cur_index] */
    uint64_t first_index, cur_index;
    uint64_t *segment_sizes;
    size_t segment_cap;
    int cur_file;              /* the newest segment's handle, or -1 */
    uint64_t cur_synced;       /* bytes of it known synced (0: not even its header) */
    int rotate_next;           /* the next batch starts a new segment */
    /* -b with --replicate: the local copy failed; batches go to the stream
     * alone until, a second later, a snapshot into a new segment starts
     * the copy again */
    int copy_broken;
    bg_time copy_retry_at;
    /* bytes written since the last good sync (not with -F): after a failed
     * sync they are written again, into a fresh segment (fsyncgate) */
    struct bg_buf unsynced_data;
    uint64_t disk_bytes;       /* bytes in the segment files */
    uint64_t stream_bytes;     /* bytes in the stream since its last purge point */
    uint64_t live_bytes;
    /* records */
    struct bg_buf pending;
    uint64_t pending_records;  /* records in pending (the last ones appended) */
    uint64_t appended_seq, synced_seq, written_seq; /* written_seq: binlog-records-written */
    /* segments below it are superseded by a snapshot on disk: deleted by
     * the dropper thread (drop_step), as unlinking a segment of many MB
     * takes milliseconds (2 to 40 on a busy disk) that neither the loop
     * nor a batch's sync, which a durable put waits for, should wait */
    uint64_t drop_below;
    /* a segment was created since the last synced batch that synced the
     * directory: every batch syncs it (when it syncs) until one has, so a
     * synced record, or a snapshot that lets older segments go, never lies
     * in a file whose name is not yet durable */
    int dir_unsynced;
    uint64_t records_migrated;
    uint64_t torn_records;     /* dropped at recovery */
    int force_snapshot;        /* damage was accepted at start: write a snapshot */
    uint64_t *damaged_indexes; /* segments found damaged: kept when superseded */
    size_t damaged_count;
    int failed_errno;          /* last write/sync failure, 0 when healthy */
    /* the batch in w->batch failed: it goes again, alone, once a second */
    struct {
        int waiting;
        unsigned attempts;     /* its failed attempts so far */
        bg_time next_at;       /* its next attempt, not before */
    } retry;
    struct bg_log_sink_counters disk_sink, stream_sink; /* stats: per sink */
    int finishing;             /* wal_finish ran: nothing new is handed on by wal_kick */
    int sync_now;              /* the next batch syncs whatever -f says */
    /* records the engine changed that could not be buffered (out of
     * memory): the log stays failed until a snapshot that began after the
     * last of them is on disk (it writes the whole state again) */
    uint64_t records_unbuffered;
    uint64_t snap_heals;       /* records_unbuffered when the snapshot began */
    uint64_t finished_seq;     /* appended_seq when it last returned */
    /* compaction: a snapshot is written a chunk per batch; it looks at the
     * ids below the next id when it began, [snap_id_next, snap_id_end) (a
     * bounded step per batch: collecting the ids of 10^6 jobs at once took
     * 10 ms of the loop), or, when they are sparse, at the ids of the jobs
     * alive when it began (snap_ids; snap_next: the next one) */
    uint64_t compact_index;    /* segments below it go once compact_seq is safe */
    uint64_t compact_seq;      /* the snapshot's end record, once appended */
    int snapping;              /* a snapshot is being written */
    uint64_t snap_id_next, snap_id_end;
    uint64_t *snap_ids;
    size_t snap_count, snap_next;
    /* flusher thread */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct wal_batch batch;
    int busy, stop, has_work;
    int notify_fd;             /* eventfd: the flusher finished a batch (-1: synchronous) */
    int thread_started;
    int locks_made;            /* lock and cond are initialised */
    /* the dropper thread: it deletes the segment files queued here (a
     * ring, under lock), one after another, off the batches' path */
    struct {
        pthread_t thread;
        pthread_cond_t cond;   /* a name was queued, or stop */
        char names[WAL_DROP_QUEUE][64];
        uint64_t sizes[WAL_DROP_QUEUE]; /* each file's bytes */
        uint64_t queued_bytes; /* the sum of sizes over the queue */
        unsigned head, count;
        int started, stop;
        /* set by the loop (drop_step): the log grows past what the
         * disk-use bound allows while files wait, so no pauses */
        int hurry;
        uint64_t unlink_failures; /* unlinks that failed (but ENOENT), atomic */
    } dropper;
    struct event *notify_ev, *sync_timer, *retry_timer;
    bg_time last_sync;
    int unsynced;              /* bytes written but not synced */
    struct wal_hold *hold_head, *hold_tail; /* replies waiting, by position */
    /* -f 0: after a batch let replies go, the next one waits
     * (gather_done) until the peers they answered could ask again */
    struct {
        uint64_t records;      /* pending records it waits for */
        bg_time until;         /* ... at most until then (0: not waiting) */
        bg_time submitted_at;  /* when the batch in flight was handed on */
        int missed;            /* the last wait ended short of its records */
        struct event *timer;
    } gather;
    /* when a reply may go (wal_reply_may_go): positions are record
     * sequences; replies_wait: -f 0, a reply waits for what it reports */
    int replies_wait;
    uint64_t last_put_id;      /* the newest job put (appended) */
    uint64_t durable_id;       /* every put up to this id is synced */
    uint64_t id_floor;         /* ids up to it are logged as given out ... */
    uint64_t id_floor_seq;     /* ... by this record (an id floor, below) */
    uint64_t id_floor_kept;    /* ids up to it are covered by a synced floor */
    /* replication: the stream is a sink too, and without a directory the
     * only one */
    struct repl *repl;
    int writing;               /* this node logs (a standby only applies) */
    int repl_dead;             /* the stream refused an append: nothing more goes */
    uint64_t purge_seq;        /* the newest snapshot's first message */
    uint64_t purge_bytes;      /* the stream's bytes before it */
    uint64_t purge_due;        /* its snapshot is complete: purge before it */
    /* standby */
    uint64_t applied_seq;      /* the last message applied */
    uint64_t *resync_ids;      /* sorted: jobs alive when a purge overtook this standby */
    uint8_t *resync_seen;      /* ... written again since (by the snapshot, or anew) */
    size_t resync_count;
};

#define RETRY_SECONDS 1
/* Ids never come back, even after a machine crash with -f N > 0 (where
 * replies do not wait for the put): the log holds an id floor, a delete
 * record of an id WAL_ID_BLOCK above the newest put (recovery moves the
 * counter above it), renewed once puts are within half a block of it. A
 * reply showing an id above the synced floor waits for its record (after a
 * start, one sync). So after a restart with -f N > 0, ids continue above
 * the floor. With -f 0 a reply showing an id waits for its put: no floor. */
#define WAL_ID_BLOCK (1u << 20)
#define WAL_CLOSE_FINISH_SECONDS 3 /* wal_close without wal_finish: two retries */
#define WAL_UNSYNCED_MAX ((size_t)4 << 20) /* bytes kept for a rewrite before a sync is forced (-f N) */
#define WAL_GATHER_MAX (2 * BG_SECOND / 1000) /* longest wait of a batch for the peers a sync answered */
#define WAL_SNAPSHOT_STEP_BYTES ((size_t)1 << 20) /* records a snapshot writes per batch (about 1 ms) */
#define WAL_SNAPSHOT_STEP_IDS 32768u /* ids a snapshot looks up per batch (well under 1 ms) */
/* ids more than this many per live job and shard (plus a step) are sparse:
 * the snapshot collects the live jobs' ids at once instead of walking them */
#define WAL_SNAPSHOT_SPARSE 4u

/* Bytes a job's full record takes on disk (for live-data accounting). */
static uint64_t job_record_size(const struct bg_job *j)
{
    return bg_journal_job_record_size(strlen(j->tube->name), j->body_size);
}

/* ---- segments ---------------------------------------------------------- */

static void segment_name(char *out, size_t n, uint64_t index)
{
    snprintf(out, n, "beangate.%llu.wal", (unsigned long long)index);
}

/* The index of a segment's file name "beangate.<digits>.wal" (leading
 * zeros allowed: beangate.02.wal is segment 2). 0 or BG_BAD_FORMAT. */
static int segment_index(const char *name, uint64_t *index)
{
    static const char prefix[] = "beangate.", suffix[] = ".wal";
    size_t len = strlen(name), pre = sizeof prefix - 1, suf = sizeof suffix - 1;
    if (len <= pre + suf || memcmp(name, prefix, pre) != 0 || strcmp(name + len - suf, suffix) != 0)
        return BG_BAD_FORMAT;
    return bg_parse_u64(name + pre, len - pre - suf, UINT64_MAX, index);
}

static uint64_t *segment_size_at(struct wal *w, uint64_t index)
{
    size_t i = (size_t)(index - w->first_index);
    if (i >= w->segment_cap) {
        size_t cap = w->segment_cap ? w->segment_cap : 16;
        while (cap <= i) cap *= 2;
        uint64_t *a = realloc(w->segment_sizes, cap * sizeof *a);
        if (!a) return NULL;
        memset(a + w->segment_cap, 0, (cap - w->segment_cap) * sizeof *a);
        w->segment_sizes = a;
        w->segment_cap = cap;
    }
    return &w->segment_sizes[i];
}

/* Write all of n bytes at off of a file: 0 or an errno (a short write is
 * ENOSPC: the file takes no more). */
static int write_fully(struct storage *st, int file, const void *p, size_t n, uint64_t off)
{
    size_t written = 0;
    int e = st->ops->pwrite(st, file, p, n, off, &written);
    return e ? e : written < n ? ENOSPC : 0;
}

/* Create segment `index` (empty again if it exists) with its header, on
 * the storage alone (the flusher's side). 0 or an errno. */
static int segment_start(struct storage *st, uint64_t index, int *file)
{
    char name[64];
    segment_name(name, sizeof name, index);
    int e = st->ops->create(st, name, file);
    if (e) return e;
    char header[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(header);
    if ((e = write_fully(st, *file, header, sizeof header, 0)) != 0) {
        st->ops->close(st, *file);
        st->ops->unlink(st, name);
    }
    return e;
}

/* Cut a segment back to what was synced of it (at least an empty segment
 * with its header), sync it (best effort: it failed before) and close it. */
static void segment_cut_back(struct storage *st, struct segment_cut *c)
{
    if (c->file < 0) return;
    if (c->keep < BG_JOURNAL_HEADER_SIZE) {
        char header[BG_JOURNAL_HEADER_SIZE];
        bg_journal_segment_header(header);
        write_fully(st, c->file, header, sizeof header, 0);
        c->keep = BG_JOURNAL_HEADER_SIZE;
    }
    st->ops->truncate(st, c->file, c->keep);
    st->ops->sync(st, c->file);
    st->ops->close(st, c->file);
    c->file = -1;
}

/* Retire the oldest segment (its data is in later ones): forget it and
 * put its file name in `name`. 1 if the caller deletes that file; 0 if it
 * was found damaged at start and is kept, as beangate.N.wal.damaged (which
 * recovery does not read), for whoever wants to look at it. */
static int segment_retire_first(struct wal *w, char *name, size_t size)
{
    char kept[80];
    segment_name(name, size, w->first_index);
    int damaged = 0;
    for (size_t i = 0; i < w->damaged_count; i++) damaged |= w->damaged_indexes[i] == w->first_index;
    snprintf(kept, sizeof kept, "%s.damaged", name);
    int keep = damaged && w->storage->ops->rename(w->storage, name, kept) == 0;
    if (keep) log_event(BG_LOG_WARN, "wal_damaged_kept", "file=%s kept_as=%s", name, kept);
    w->disk_bytes -= w->segment_sizes[0];
    memmove(w->segment_sizes, w->segment_sizes + 1, (w->segment_cap - 1) * sizeof *w->segment_sizes);
    w->segment_sizes[w->segment_cap - 1] = 0;
    w->first_index++;
    return !keep;
}

/* Delete the superseded segment file `name` (best effort: recovery
 * deletes one left over); a failure but ENOENT is logged and counted
 * (binlog_unlink_failures). Either thread. */
static void segment_unlink(struct wal *w, const char *name)
{
    int e = w->storage->ops->unlink(w->storage, name);
    if (!e || e == ENOENT) return;
    __atomic_fetch_add(&w->dropper.unlink_failures, 1, __ATOMIC_RELAXED);
    log_event(BG_LOG_WARN, "wal_unlink_failed", "file=%s error=%s action=kept", name, log_str(strerror(e)));
}

/* Delete the segments below `index` here and now (their data is in later
 * ones). */
static void segments_drop_below(struct wal *w, uint64_t index)
{
    char name[64];
    while (w->first_index < index)
        if (segment_retire_first(w, name, sizeof name)) segment_unlink(w, name);
}

/* ---- engine hooks: append records -------------------------------------- */

/* Arm one of the log's timers (each kicks the log) to fire after `wait`. */
static void timer_in(struct event *timer, bg_time wait)
{
    if (!timer) return;
    struct timeval tv = {(time_t)(wait / BG_SECOND), (suseconds_t)(wait % BG_SECOND / 1000) + 1};
    evtimer_add(timer, &tv);
}

static void note_failure(struct wal *w, int err, const char *what)
{
    if (!w->failed_errno)
        log_event(BG_LOG_ERROR, "wal_failure", "op=%s error=%s puts=refused", what, log_str(strerror(err)));
    w->failed_errno = err;
    w->engine->journal_broken = 1;
    /* a kick in a second tries again (a failed batch: wal_kick's retry state) */
    timer_in(w->retry_timer, RETRY_SECONDS * BG_SECOND);
}

/* The position a reply showing job id depends on: none once its put is
 * synced; with -f 0 its put's record (the newest, or, while the put is
 * being made, the next: a waiting reserver gets a job before its record is
 * appended); else the id floor's record while that is not synced (while a
 * put beyond the floor is being made: the floor that follows its record). */
static uint64_t job_position(const struct wal *w, uint64_t id)
{
    if (id <= w->durable_id) return 0;
    int being_put = id > w->last_put_id;
    if (w->replies_wait) return w->appended_seq + (being_put ? 1 : 0);
    if (w->storage && w->cfg.fsync_never) return 0; /* -F: no promise */
    if (id <= w->id_floor_kept) return 0;
    if (id > w->id_floor) return w->appended_seq + (being_put ? 2 : 0);
    return w->id_floor_seq > w->synced_seq ? w->id_floor_seq : 0;
}

/* A record could not even be buffered: the log is behind; say so loudly,
 * and stay failed until a snapshot begun after it is on disk. The change it
 * was for is not in the log: its reply never goes. */
static void append_failed(struct wal *w)
{
    note_failure(w, ENOMEM, "buffer");
    w->records_unbuffered++;
    w->force_snapshot = 1;
    bg_engine_depends_on(w->engine, UINT64_MAX);
}

/* A record was appended: a reply about it waits for it with -f 0. */
static void appended(struct wal *w)
{
    w->appended_seq++;
    w->pending_records++;
    if (w->replies_wait) bg_engine_depends_on(w->engine, w->appended_seq);
}

/* Job id was just put: log a new id floor when ids come near the last. */
static void put_appended(struct wal *w, uint64_t id)
{
    w->last_put_id = id;
    /* with -f 0 a reply showing an id waits for its put anyway; -F
     * promises nothing for a machine crash */
    int floors = !w->replies_wait && !(w->storage && w->cfg.fsync_never);
    if (floors && id + WAL_ID_BLOCK / 2 > w->id_floor) {
        uint64_t floor = id + WAL_ID_BLOCK;
        if (w->id_floor_seq <= w->synced_seq) w->id_floor_kept = w->id_floor; /* the old floor still covers */
        if (bg_journal_encode_delete(&w->pending, floor) != 0) return append_failed(w);
        appended(w);
        w->id_floor = floor;
        w->id_floor_seq = w->appended_seq;
    }
    bg_engine_depends_on(w->engine, job_position(w, id));
}

static void hook_job_saved(void *ctx, const struct bg_job *j, int with_body)
{
    struct wal *w = ctx;
    struct bg_journal_job r;
    bg_journal_job_of(j, &r);
    if (r.state == BG_JOB_DELAYED) {
        bg_time now = loop_now();
        r.deadline_wall = loop_wall_now() + (bg_job_deadline(j) > now ? bg_job_deadline(j) - now : 0);
    }
    r.created_wall = loop_wall_now() - (loop_now() - j->created_at);
    if (bg_journal_encode_job(&w->pending, &r, with_body) != 0) return append_failed(w);
    appended(w);
    if (with_body) w->live_bytes += job_record_size(j);
    if (j->id > w->last_put_id) put_appended(w, j->id);
}

static void hook_job_deleted(void *ctx, uint64_t id)
{
    struct wal *w = ctx;
    struct bg_job *j = bg_job_find(w->engine, id);
    if (bg_journal_encode_delete(&w->pending, id) != 0) return append_failed(w);
    appended(w);
    if (j) w->live_bytes -= job_record_size(j);
}

static void hook_tube_paused(void *ctx, const struct bg_tube *t)
{
    struct wal *w = ctx;
    bg_time now = loop_now();
    uint64_t unpause = loop_wall_now() + (t->unpause_at > now ? t->unpause_at - now : 0);
    if (bg_journal_encode_pause(&w->pending, t->name, (uint32_t)(t->pause_ns / BG_SECOND), unpause) != 0)
        return append_failed(w);
    appended(w);
}

static void hook_job_shown(void *ctx, uint64_t id)
{
    struct wal *w = ctx;
    bg_engine_depends_on(w->engine, job_position(w, id));
}

const struct bg_journal_ops wal_journal_ops = {hook_job_saved, hook_job_deleted, hook_tube_paused,
                                               hook_job_shown};

/* ---- the flusher thread ------------------------------------------------ */

/* Note what failed in b: its op and errno (returned). */
static int batch_failed(struct wal_batch *b, enum wal_op op, int e)
{
    b->failed_op = op;
    return e;
}

/* The disk's part of a batch (the flusher's side): cut back what a failed
 * sync left (a rewrite), start a new segment if asked (the current one
 * synced and closed first), write data, sync as asked; a failed write is
 * cut off again, so that a retry starts clean. 0 or an errno. */
static int flush_to_disk(struct wal_batch *b, struct storage *st, int fsync_never)
{
    int e;
    for (int i = 0; i < 2; i++) segment_cut_back(st, &b->cut[i]);
    if (b->new_index && b->file >= 0) {
        if (!fsync_never && (e = st->ops->sync(st, b->file)) != 0) return batch_failed(b, WAL_OP_SYNC, e);
        st->ops->close(st, b->file);
        b->file = -1;
    }
    if (b->new_index && b->fresh && b->new_file >= 0) {
        st->ops->close(st, b->new_file); /* written afresh: nothing of a failed attempt is trusted */
        b->new_file = -1;
    }
    if (b->new_index && b->new_file < 0 && (e = segment_start(st, b->new_index, &b->new_file)) != 0)
        return batch_failed(b, WAL_OP_WRITE, e);
    int file = b->new_index ? b->new_file : b->file;
    uint64_t offset = b->new_index ? BG_JOURNAL_HEADER_SIZE : b->offset;
    if ((e = write_fully(st, file, bg_buf_head(&b->data), b->data.len, offset)) != 0) {
        st->ops->truncate(st, file, offset); /* best effort */
        return batch_failed(b, WAL_OP_WRITE, e);
    }
    if (b->sync && (e = st->ops->sync(st, file)) != 0) return batch_failed(b, WAL_OP_SYNC, e);
    /* a new segment's name is durable with the first synced batch after it was made (w->dir_unsynced) */
    if (b->sync_dir && b->sync && (e = st->ops->sync_dir(st)) != 0) return batch_failed(b, WAL_OP_SYNC, e);
    return 0;
}

/* The flusher's work on one batch: the disk (if any), then the stream (if
 * replicating): the batch is done when every sink has it. An errno of the
 * disk, or 0 (b->repl_rc says how the stream took it). */
static int flush_batch(struct wal_batch *b, struct storage *st, int fsync_never, struct repl *repl)
{
    b->failed_op = WAL_OP_NONE;
    b->copy_error = 0;
    if (b->disk) {
        int e = flush_to_disk(b, st, fsync_never);
        if (e && !repl) return e;
        b->copy_error = e; /* the stream is the log of record: it goes on */
    }
    if (repl) {
        b->purged = b->purge_before && repl_purge(repl, b->purge_before) == 0;
        b->repl_rc = b->data.len ? repl_append(repl, bg_buf_head(&b->data), b->data.len, &b->first_seq) : 0;
    }
    return 0;
}

static void *flusher_main(void *arg)
{
    struct wal *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->has_work && !w->stop) pthread_cond_wait(&w->cond, &w->lock);
        if (!w->has_work && w->stop) break;
        w->has_work = 0;
        pthread_mutex_unlock(&w->lock);
        w->batch.error = flush_batch(&w->batch, w->storage, w->cfg.fsync_never, w->repl);
        uint64_t one = 1;
        if (write(w->notify_fd, &one, sizeof one) != sizeof one) { /* the loop polls anyway */ }
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Hand w->batch to the flusher (synchronous: to wal_run_flusher). */
static void submit(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    w->busy = 1;
    w->has_work = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Sleep until `until` (monotonic), in steps of at most `step` ns. */
static void sleep_until(bg_time until, bg_time step)
{
    bg_time now = loop_now();
    if (now >= until) return;
    bg_time wait = until - now < step ? until - now : step;
    struct timespec ts = {(time_t)(wait / BG_SECOND), (long)(wait % BG_SECOND)};
    nanosleep(&ts, NULL);
}

/* Wait until the flusher has finished the batch submitted (synchronous:
 * do its work here), at most until `deadline` (0: no limit); the caller
 * then accounts for it (batch_done). 0, or ETIMEDOUT (still busy). */
static int flusher_wait(struct wal *w, bg_time deadline)
{
    if (!w->thread_started) {
        if (w->has_work) w->batch.error = flush_batch(&w->batch, w->storage, w->cfg.fsync_never, w->repl);
        w->has_work = 0;
        return 0;
    }
    uint64_t n;
    while (read(w->notify_fd, &n, sizeof n) != sizeof n) {
        if (deadline && loop_now() >= deadline) return ETIMEDOUT;
        sleep_until(loop_now() + 1000000, 1000000);
    }
    return 0;
}


/* Count one record appended to pending. */
static void pending_added(struct wal *w)
{
    w->appended_seq++;
    w->pending_records++;
}

/* The snapshot is done, or given up: forget its ids. */
static void snapshot_stop(struct wal *w)
{
    free(w->snap_ids);
    w->snap_ids = NULL;
    w->snapping = 0;
}

/* Nonzero while the snapshot has ids left to look at. */
static int snapshot_ids_left(const struct wal *w)
{
    return w->snap_ids ? w->snap_next < w->snap_count : w->snap_id_next < w->snap_id_end;
}

/* Append the snapshot's next jobs to pending, about WAL_SNAPSHOT_STEP_BYTES
 * of records (at least one job) and at most WAL_SNAPSHOT_STEP_IDS ids looked
 * at; after the last, the highest id, the paused tubes and the end record.
 * 0 or BG_OUT_OF_MEMORY (the snapshot then stops; older segments stay). */
static int snapshot_step(struct wal *w)
{
    struct bg_engine *e = w->engine;
    uint64_t wall = loop_wall_now();
    bg_time now = loop_now();
    size_t step_end = w->pending.len + WAL_SNAPSHOT_STEP_BYTES;
    for (unsigned looked = 0; looked < WAL_SNAPSHOT_STEP_IDS && w->pending.len < step_end && snapshot_ids_left(w);
         looked++) {
        uint64_t id = w->snap_ids ? w->snap_ids[w->snap_next++] : w->snap_id_next++;
        /* none (never put, or deleted: its delete record is in pending or
         * before); a job put after the snapshot began has its id above
         * the walk, its own record in the segment, and is not in snap_ids */
        struct bg_job *j = bg_job_find(e, id);
        if (!j) continue;
        struct bg_journal_job r;
        bg_journal_job_of(j, &r);
        if (r.state == BG_JOB_DELAYED) r.deadline_wall = wall + (bg_job_deadline(j) > now ? bg_job_deadline(j) - now : 0);
        r.created_wall = wall - (now - j->created_at);
        if (bg_journal_encode_job(&w->pending, &r, 1) != 0) return BG_OUT_OF_MEMORY;
        pending_added(w);
        w->records_migrated++;
    }
    if (snapshot_ids_left(w)) return 0;
    /* ids are never reused: a delete record of the highest id given out
     * keeps the counter above it even when that job is gone */
    uint64_t last = bg_engine_last_id(e);
    if (w->id_floor > last) last = w->id_floor; /* and the id floor */
    if (last && !bg_job_find(e, last)) {
        if (bg_journal_encode_delete(&w->pending, last) != 0) return BG_OUT_OF_MEMORY;
        pending_added(w);
    }
    for (uint32_t i = 0; i < e->tube_count; i++) {
        struct bg_tube *t = e->tube_list[i];
        if (!t->pause_ns || t->unpause_at <= now) continue;
        if (bg_journal_encode_pause(&w->pending, t->name, (uint32_t)(t->pause_ns / BG_SECOND),
                                    wall + (t->unpause_at - now)) != 0)
            return BG_OUT_OF_MEMORY;
        pending_added(w);
    }
    /* only a complete snapshot may make recovery skip the older segments
     * (they may still be on disk after a crash, with jobs deleted since) */
    if (bg_journal_encode_snapshot_end(&w->pending) != 0) return BG_OUT_OF_MEMORY;
    pending_added(w);
    snapshot_stop(w);
    w->compact_seq = w->appended_seq;
    return 0;
}

/* Begin a snapshot: the ids it looks at are those below the next id (every
 * live job's is: core/audit.c), or when they are sparse the live jobs'
 * ids, noted now; the batch starts a new segment. 0, or BG_OUT_OF_MEMORY
 * after noting the failure. */
static int snapshot_begin(struct wal *w)
{
    struct bg_engine *e = w->engine;
    w->snap_ids = NULL;
    w->snap_id_next = 1;
    w->snap_id_end = e->next_id;
    if (w->snap_id_end - 1 > (uint64_t)WAL_SNAPSHOT_SPARSE * e->shard_count * e->job_count + WAL_SNAPSHOT_STEP_IDS) {
        uint64_t *ids = malloc((e->job_count ? e->job_count : 1) * sizeof *ids);
        if (!ids) {
            note_failure(w, ENOMEM, "snapshot");
            return BG_OUT_OF_MEMORY;
        }
        w->snap_count = bg_engine_job_ids(e, ids);
        w->snap_next = 0;
        w->snap_ids = ids;
    }
    if (w->storage) w->rotate_next = 1; /* the snapshot begins a segment */
    w->snapping = 1;
    w->compact_index = w->cur_index + 1;
    w->snap_heals = w->records_unbuffered;
    w->force_snapshot = 0;
    return 0;
}

/* Nonzero while the snapshot's records are not all handed to the flusher:
 * the segment must not change under it. */
static int snapshot_in_progress(const struct wal *w)
{
    return w->snapping || (w->compact_seq && w->appended_seq - w->pending_records < w->compact_seq);
}

/* ---- handing batches on: the steps of wal_kick ----------------------- */

/* Nonzero when the next batch must be synced: without a disk always (a
 * batch is done when the stream acknowledged it); -f 0 always; -f N once N
 * ms passed since the last sync; -F never. */
static int sync_due(const struct wal *w, bg_time now)
{
    if (!w->storage) return 1;
    if (w->cfg.fsync_never) return 0;
    return w->cfg.fsync_ms == 0 || w->sync_now || now - w->last_sync >= (bg_time)w->cfg.fsync_ms * 1000000ull;
}

/* Nonzero if a batch is due now. When none is but written records wait for
 * their sync (-f N), the sync timer brings the kick when its time comes. */
static int batch_due(struct wal *w, bg_time now, int sync)
{
    if (w->pending.len || w->snapping || w->force_snapshot || (w->unsynced && sync) || w->purge_due) return 1;
    if (w->unsynced && !w->cfg.fsync_never) {
        bg_time due = w->last_sync + (bg_time)w->cfg.fsync_ms * 1000000ull;
        timer_in(w->sync_timer, due > now ? due - now : 0);
    }
    return 0;
}

/* Group commit across the replies' round trip (-f 0): after a batch's
 * replies went, the next batch waits for as many more records as replies
 * went (their peers asking again), at most as long as that batch took and
 * WAL_GATHER_MAX; so the peers answered by one sync share the next one
 * instead of splitting into two halves that alternate. A wait that ended
 * short (peers that did not ask again) makes the next batch go without
 * one. Nonzero when the batch may go now; else the gather timer brings
 * the kick at its time. */
static int gather_done(struct wal *w, bg_time now)
{
    if (!w->gather.until) return 1;
    int gathered = w->pending_records >= w->gather.records;
    if (gathered || now >= w->gather.until || w->snapping || w->force_snapshot || w->purge_due || w->sync_now) {
        w->gather.missed = !gathered && now >= w->gather.until;
        w->gather.until = 0;
        return 1;
    }
    timer_in(w->gather.timer, w->gather.until - now);
    return 0;
}

/* After a batch whose replies went (`released` of them): the next one
 * gathers their peers' next records (gather_done), unless the last wait
 * came up short. */
static void gather_begin(struct wal *w, uint64_t released)
{
    if (!released || !w->replies_wait || !w->gather.timer) return;
    if (w->gather.missed) {
        w->gather.missed = 0;
        return;
    }
    bg_time now = loop_now();
    bg_time took = now - w->gather.submitted_at;
    w->gather.records = w->pending_records + released;
    w->gather.until = now + (took < WAL_GATHER_MAX ? took : WAL_GATHER_MAX);
}

/* Nonzero while the dropper has segments left to delete. */
static int drops_pending(struct wal *w)
{
    if (!w->dropper.started) return 0;
    pthread_mutex_lock(&w->lock);
    int pending = w->dropper.count != 0;
    pthread_mutex_unlock(&w->lock);
    return pending;
}

/* Nonzero when a sink (the directory, the stream) holds more than twice
 * the live data plus a segment, or a snapshot is forced (damage accepted
 * at start, a failed sync, a record that could not be buffered). */
static int compaction_due(struct wal *w)
{
    /* not before the superseded segments are gone: the disk-use bound */
    if (w->compact_seq || w->snapping || w->first_index < w->drop_below || drops_pending(w)) return 0;
    /* each sink by its own bytes: the directory's, the stream's */
    uint64_t limit = 2 * w->live_bytes + w->cfg.segment_size;
    return w->force_snapshot || (w->storage && !w->copy_broken && w->disk_bytes > limit) ||
           (w->repl && w->stream_bytes > limit);
}

/* The compaction step of a batch: begin a snapshot if one is due, append
 * its next chunk if one is being written. 0, or BG_OUT_OF_MEMORY after
 * noting the failure (a later compaction starts over). */
static int compaction_step(struct wal *w)
{
    int begin = compaction_due(w);
    if (begin && snapshot_begin(w) != 0) return BG_OUT_OF_MEMORY;
    w->batch.snapshot_first = begin;
    if (w->snapping && snapshot_step(w) != 0) {
        snapshot_stop(w); /* a later compaction starts over */
        note_failure(w, ENOMEM, "snapshot");
        return BG_OUT_OF_MEMORY;
    }
    return 0;
}

/* The rotation step: a new segment when the pending records would make
 * the current one grow past -s (never in the middle of a snapshot, which
 * must stay in one segment). The flusher creates it. */
static void rotation_step(struct wal *w)
{
    uint64_t *size = w->storage ? segment_size_at(w, w->cur_index) : NULL;
    if (size && *size + w->pending.len > w->cfg.segment_size && *size > BG_JOURNAL_HEADER_SIZE &&
        !snapshot_in_progress(w))
        w->rotate_next = 1;
}

/* Move the records of the next batch from pending into w->batch: at most
 * about one segment, cut at a record end. 0, or BG_OUT_OF_MEMORY after
 * noting it. */
static int take_batch(struct wal *w)
{
    struct wal_batch *b = &w->batch;
    size_t take = 0;
    uint64_t records = 0;
    const char *p = bg_buf_head(&w->pending);
    while (take < w->pending.len && (take == 0 || take < w->cfg.segment_size)) {
        take += bg_journal_record_span(p + take, w->pending.len - take);
        records++;
    }
    if (bg_buf_append(&b->data, p, take) != 0) {
        note_failure(w, ENOMEM, "batch");
        return BG_OUT_OF_MEMORY;
    }
    bg_buf_consume(&w->pending, take);
    w->pending_records -= records;
    b->end_seq = w->appended_seq - w->pending_records;
    b->put_id = w->pending_records ? w->durable_id : w->last_put_id; /* cut: not known */
    b->disk = w->storage && !w->copy_broken;
    b->file = b->disk ? w->cur_file : -1;
    b->offset = b->disk ? *segment_size_at(w, w->cur_index) : 0;
    b->new_index = b->disk && (w->rotate_next || w->cur_file < 0) ? w->cur_index + 1 : 0;
    b->new_file = -1;
    b->fresh = 0;
    if (b->new_index) w->dir_unsynced = 1;
    b->sync_dir = w->dir_unsynced;
    w->rotate_next = 0;
    return 0;
}

/* Hand w->batch to the flusher (again, for a retry), synced if `sync`. */
static void submit_batch(struct wal *w, int sync)
{
    struct wal_batch *b = &w->batch;
    b->sync = sync;
    b->error = 0;
    b->repl_rc = 0;
    b->purged = 0;
    if (b->disk) w->disk_sink.attempts++;
    if (w->repl) w->stream_sink.attempts++;
    w->gather.until = 0;
    w->gather.submitted_at = loop_now();
    submit(w);
}

/* Nonzero when the failed batch may go again now; else the retry timer
 * brings the kick at its time (a failed batch goes once a second, not on
 * every loop turn). */
static int retry_due(struct wal *w, bg_time now)
{
    if (now >= w->retry.next_at) return 1;
    timer_in(w->retry_timer, w->retry.next_at - now);
    return 0;
}

/* -b with --replicate: once the copy has been dropped for a second, and no
 * snapshot is being written, start it again: a snapshot into a new
 * segment (the older segments go once it is complete). */
static void copy_restart_step(struct wal *w, bg_time now)
{
    if (!w->copy_broken) return;
    if (now < w->copy_retry_at || w->snapping || w->compact_seq) {
        timer_in(w->retry_timer, now < w->copy_retry_at ? w->copy_retry_at - now : RETRY_SECONDS * BG_SECOND);
        return;
    }
    w->copy_broken = 0;
    w->force_snapshot = 1; /* snapshot_begin starts the new segment */
}

/* The dropper's pause after an unlink of `size` bytes (under lock): until
 * the monotonic deadline (the condition's clock: a step of the wall clock
 * neither stalls nor skips it), or sooner on stop or hurry. Another return
 * of the wait than 0 or ETIMEDOUT ends the pause (no spin on it). */
static void dropper_pause(struct wal *w, uint64_t size)
{
    uint64_t gap = size * WAL_DROP_GAP_NS_PER_MIB >> 20;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)(gap / BG_SECOND);
    until.tv_nsec += (long)(gap % BG_SECOND);
    if (until.tv_nsec >= (long)BG_SECOND) until.tv_sec++, until.tv_nsec -= (long)BG_SECOND;
    while (!w->dropper.stop && !w->dropper.hurry)
        if (pthread_cond_timedwait(&w->dropper.cond, &w->lock, &until) != 0) break;
}

/* The dropper thread: delete the queued segment files, oldest first, until
 * told to stop with none left. Each leaves the queue before its pause, so
 * a compaction (compaction_due) waits for the unlinks, never for a pause.
 * The pause (WAL_DROP_GAP_NS_PER_MIB) spaces the unlinks while the log is
 * not pressed; none once told to stop, nor while hurried (drop_step).
 * Best effort: each is superseded by a snapshot on disk either way (one
 * left by a crash, a failed unlink, recovery deletes), so neither the
 * unlink nor the directory needs a sync. */
static void *dropper_main(void *arg)
{
    struct wal *w = arg;
    char name[64];
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->dropper.count && !w->dropper.stop) pthread_cond_wait(&w->dropper.cond, &w->lock);
        if (!w->dropper.count) break;
        memcpy(name, w->dropper.names[w->dropper.head], sizeof name);
        uint64_t size = w->dropper.sizes[w->dropper.head];
        pthread_mutex_unlock(&w->lock);
        segment_unlink(w, name);
        pthread_mutex_lock(&w->lock);
        w->dropper.head = (w->dropper.head + 1) % WAL_DROP_QUEUE;
        w->dropper.count--;
        w->dropper.queued_bytes -= size;
        if (!w->dropper.count) w->dropper.hurry = 0;
        dropper_pause(w, size);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Nonzero when the dropper must not pause (under lock): files wait that
 * its queue had no room for, or the log grows while superseded files
 * wait: a compaction is due by size (it waits for them), or the directory
 * (the log's files and those queued) holds more than three times the live
 * data plus two segments. */
static int drops_hurried(const struct wal *w)
{
    uint64_t segments = 2 * w->cfg.segment_size;
    return w->first_index < w->drop_below || w->disk_bytes > 2 * w->live_bytes + w->cfg.segment_size ||
           w->disk_bytes + w->dropper.queued_bytes > 3 * w->live_bytes + segments;
}

/* Retire the superseded segments (below drop_below) and have them deleted:
 * queued for the dropper thread, as many as its queue holds (the rest at a
 * later kick), or, in the synchronous mode, here and now. The order rule
 * holds: drop_below moves only once the superseding snapshot is on disk,
 * its segment's name included (batch_done, w->dir_unsynced). */
static void drop_step(struct wal *w)
{
    if (!w->storage) return;
    if (!w->dropper.started) {
        segments_drop_below(w, w->drop_below);
        return;
    }
    char name[64];
    pthread_mutex_lock(&w->lock);
    int queued = 0;
    while (w->first_index < w->drop_below && w->dropper.count < WAL_DROP_QUEUE) {
        uint64_t size = w->segment_sizes[0];
        if (!segment_retire_first(w, name, sizeof name)) continue; /* damaged: kept under another name */
        unsigned at = (w->dropper.head + w->dropper.count) % WAL_DROP_QUEUE;
        memcpy(w->dropper.names[at], name, sizeof name);
        w->dropper.sizes[at] = size;
        w->dropper.count++;
        w->dropper.queued_bytes += size;
        queued = 1;
    }
    int hurry = w->dropper.count && drops_hurried(w);
    if (queued || hurry > w->dropper.hurry) pthread_cond_signal(&w->dropper.cond);
    if (hurry) w->dropper.hurry = 1;
    pthread_mutex_unlock(&w->lock);
}

void wal_kick(struct wal *w)
{
    if (!w || w->busy || !w->writing || w->finishing) return;
    drop_step(w); /* any left over from a full queue; a hurry */
    if (w->repl_dead) return;
    bg_time now = loop_now();
    int sync = sync_due(w, now);
    struct wal_batch *b = &w->batch;
    if (w->retry.waiting) {
        /* the same batch again, alone: what was appended since waits */
        if (!retry_due(w, now)) return;
        if (b->disk) w->disk_sink.retries++;
        if (w->repl) w->stream_sink.retries++;
        submit_batch(w, !w->storage || !w->cfg.fsync_never); /* healthy again only once synced */
        return;
    }
    copy_restart_step(w, now);
    if (!batch_due(w, now, sync) || !gather_done(w, now)) return;
    bg_buf_clear(&b->data);
    b->purge_before = w->purge_due;
    compaction_step(w); /* a snapshot that cannot go now does not hold up the records */
    rotation_step(w);
    if (take_batch(w) != 0) return;
    /* the batch that completes a snapshot is synced at once: the older
     * segments can go as soon as it is on disk */
    if (w->compact_seq && b->end_seq >= w->compact_seq) sync = !w->storage || !w->cfg.fsync_never;
    submit_batch(w, sync);
}

/* Replace the snapshot end records in buf by a delete of id 0 (no job has
 * it: it replays as nothing). An abandoned snapshot must not make recovery
 * skip the segments before it; and the records keep their number, since
 * record sequences are the positions replies wait for (removing one would
 * make every later batch claim a record it does not hold: issue 21, sim
 * seed 53040). The count replaced, or -1 out of memory. */
static long snapshot_ends_replace(struct bg_buf *buf)
{
    struct bg_buf kept = {0};
    long replaced = 0;
    size_t at = 0, used;
    const char *p = bg_buf_head(buf);
    struct bg_journal_record rec;
    while (at < buf->len) {
        used = bg_journal_record_span(p + at, buf->len - at);
        int end = bg_journal_decode(p + at, buf->len - at, &rec, &used) == 0 && rec.type == BG_REC_SNAPSHOT_END;
        if (end) replaced++;
        if ((end ? bg_journal_encode_delete(&kept, 0) : bg_buf_append(&kept, p + at, used)) != 0) {
            bg_buf_free(&kept);
            return -1;
        }
        at += used;
    }
    if (!replaced) {
        bg_buf_free(&kept);
        return 0;
    }
    bg_buf_free(buf);
    *buf = kept;
    return replaced;
}

/* A snapshot cannot span the fresh segment of a rewrite: give it up (its
 * records already written stay, harmless) and take a new one later. */
static void compaction_abandon(struct wal *w)
{
    if (w->snapping || w->compact_seq) {
        if (snapshot_ends_replace(&w->batch.data) < 0 || snapshot_ends_replace(&w->pending) < 0)
            note_failure(w, ENOMEM, "snapshot_abandon");
        snapshot_stop(w);
        w->compact_seq = 0;
    }
    w->force_snapshot = 1; /* also supersedes the segment the sync failed in */
}

/* After a failed sync nothing written since the last good one counts as
 * kept: the kernel may have dropped those pages ("fsyncgate"). Turn the
 * batch into a rewrite: everything since the last good sync, then the
 * batch, into a fresh segment; the flusher first cuts the segments written
 * since back to what was synced of them. Once a batch is a rewrite, its
 * retries write the same segment afresh. */
static void rewrite_plan(struct wal *w)
{
    struct wal_batch *b = &w->batch;
    if (b->fresh) return;
    if (w->unsynced_data.len) {
        if (bg_buf_append(&w->unsynced_data, bg_buf_head(&b->data), b->data.len) != 0) {
            /* without the whole rewrite nothing may be cut: the batch goes
             * again in place, and the log stays failed until it is synced */
            note_failure(w, ENOMEM, "rewrite");
            return;
        }
        struct bg_buf all = w->unsynced_data;
        w->unsynced_data = b->data;
        b->data = all;
    }
    bg_buf_clear(&w->unsynced_data);
    uint64_t *size = segment_size_at(w, w->cur_index);
    uint64_t keep = w->cur_synced > BG_JOURNAL_HEADER_SIZE ? w->cur_synced : BG_JOURNAL_HEADER_SIZE;
    if (b->file >= 0) {
        b->cut[0] = (struct segment_cut){b->file, w->cur_synced};
        if (size && *size > keep) w->disk_bytes -= *size - keep, *size = keep;
    }
    if (b->new_file >= 0) { /* the rotation's segment exists: cut to its header */
        b->cut[1] = (struct segment_cut){b->new_file, 0};
        w->cur_index = b->new_index;
        if ((size = segment_size_at(w, w->cur_index)) != NULL) *size = BG_JOURNAL_HEADER_SIZE;
        w->disk_bytes += BG_JOURNAL_HEADER_SIZE;
    }
    w->cur_file = -1;
    w->cur_synced = 0;
    b->file = -1;
    b->new_file = -1;
    b->new_index = w->cur_index + 1;
    b->fresh = 1;
    w->dir_unsynced = 1;
    b->sync_dir = 1;
    compaction_abandon(w);
}

/* The disk's side of a finished batch: the segment it wrote, the bytes,
 * what is synced now. */
static void disk_done(struct wal *w, struct wal_batch *b)
{
    if (b->new_index) { /* a new segment (a rotation or a rewrite) exists now */
        w->cur_index = b->new_index;
        w->cur_file = b->new_file;
        w->cur_synced = 0;
        uint64_t *size = segment_size_at(w, w->cur_index);
        if (size) *size = BG_JOURNAL_HEADER_SIZE;
        w->disk_bytes += BG_JOURNAL_HEADER_SIZE;
        b->new_index = 0;
        b->new_file = -1;
        b->fresh = 0;
    }
    uint64_t *size = segment_size_at(w, w->cur_index);
    if (size) *size += b->data.len;
    w->disk_bytes += b->data.len;
    w->disk_sink.bytes += b->data.len;
    if (b->sync) {
        w->cur_synced = size ? *size : 0;
        bg_buf_clear(&w->unsynced_data);
        bg_buf_shrink(&w->unsynced_data);
    } else if (!w->cfg.fsync_never) {
        /* without a copy for a rewrite, or with a large one: sync at once */
        if (bg_buf_append(&w->unsynced_data, bg_buf_head(&b->data), b->data.len) != 0 ||
            w->unsynced_data.len >= WAL_UNSYNCED_MAX)
            w->sync_now = 1;
    }
}

/* Close every segment handle still open: the current one, and a batch's
 * that did not finish (a rotation, a rewrite); the flusher is idle. The
 * handles' fields are left as they are. */
static void segments_close_all(struct wal *w)
{
    struct storage *st = w->storage;
    struct wal_batch *b = &w->batch;
    int files[] = {w->cur_file, b->file, b->new_file, b->cut[0].file, b->cut[1].file};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int seen = 0;
        for (size_t k = 0; k < i; k++) seen |= files[k] == files[i];
        if (files[i] >= 0 && !seen) st->ops->close(st, files[i]);
    }
}

/* -b with --replicate: the batch reached the stream (the log of record)
 * but not the local copy. Drop the copy (its segments are not read at a
 * start, the stream is) and start it again later with a snapshot. */
static void copy_failed(struct wal *w, struct wal_batch *b)
{
    if (!w->copy_broken)
        log_event(BG_LOG_ERROR, "wal_copy_failed", "op=%s error=%s stream=continues",
                  b->failed_op == WAL_OP_SYNC ? "sync" : "write", log_str(strerror(b->copy_error)));
    w->disk_sink.failures++;
    w->copy_broken = 1;
    w->copy_retry_at = loop_now() + RETRY_SECONDS * BG_SECOND;
    timer_in(w->retry_timer, RETRY_SECONDS * BG_SECOND);
    segments_close_all(w);
    if (b->new_file >= 0) w->cur_index = b->new_index; /* it exists: the next one follows it */
    w->cur_file = b->file = b->new_file = b->cut[0].file = b->cut[1].file = -1;
    b->new_index = 0;
    b->fresh = 0;
    bg_buf_clear(&w->unsynced_data);
}

/* Account for a batch the flusher finished (on the loop thread, or in
 * wal_finish). Returns 0 if it was written, or the flusher's errno. */
static int batch_done(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    w->busy = 0;
    pthread_mutex_unlock(&w->lock);
    struct wal_batch *b = &w->batch;
    if (b->disk && !b->fresh) w->cur_file = b->file; /* -1 once a rotation closed it */
    if (b->error) {
        note_failure(w, b->error, b->failed_op == WAL_OP_SYNC ? "sync" : "write");
        w->disk_sink.failures++;
        if (b->failed_op == WAL_OP_SYNC && !w->cfg.fsync_never) rewrite_plan(w);
        w->retry.waiting = 1;
        w->retry.attempts++;
        w->retry.next_at = loop_now() + RETRY_SECONDS * BG_SECOND;
        return b->error;
    }
    w->retry.waiting = 0;
    w->retry.attempts = 0;
    if (w->repl && !b->repl_rc) w->stream_sink.bytes += b->data.len;
    if (b->repl_rc) {
        w->stream_sink.failures++;
        /* another node appended (repl has told the server), or stopping:
         * this batch and everything after it stay unacknowledged */
        w->repl_dead = 1;
        w->engine->journal_broken = 1;
        return EPERM;
    }
    if (b->copy_error) copy_failed(w, b);
    else if (b->disk) disk_done(w, b);
    if (w->repl) {
        if (b->purged) {
            w->stream_bytes -= w->purge_bytes < w->stream_bytes ? w->purge_bytes : w->stream_bytes;
            w->purge_due = 0;
        }
        if (b->snapshot_first && b->data.len) {
            w->purge_seq = b->first_seq;
            w->purge_bytes = w->stream_bytes;
        }
        w->stream_bytes += b->data.len;
    }
    w->written_seq = b->end_seq;
    if (b->sync && b->sync_dir && b->disk && !b->copy_error) w->dir_unsynced = 0;
    if (b->sync) {
        w->synced_seq = b->end_seq;
        if (b->put_id > w->durable_id) w->durable_id = b->put_id;
        w->last_sync = loop_now();
        w->unsynced = 0;
        w->sync_now = 0;
    } else {
        w->unsynced = 1;
    }
    bg_buf_clear(&b->data);
    /* a snapshot on disk makes the older segments useless */
    if (w->compact_seq && w->written_seq >= w->compact_seq && (b->sync || w->cfg.fsync_never)) {
        if (w->storage && !w->copy_broken) {
            w->drop_below = w->compact_index;
            drop_step(w);
        }
        if (w->repl && w->purge_seq) w->purge_due = w->purge_seq; /* the stream likewise */
        w->compact_seq = 0;
        /* the state is whole on disk again, if nothing was lost since it began */
        if (w->records_unbuffered == w->snap_heals) w->records_unbuffered = 0;
    }
    if (w->failed_errno && !w->records_unbuffered) {
        log_event(BG_LOG_WARN, "wal_recovered", "puts=accepted"); /* pairs with wal_failure: always shown */
        w->failed_errno = 0;
        w->engine->journal_broken = 0;
    }
    return 0;
}

/* ---- when a reply may go: positions and holds ---------------------------- */

int wal_reply_may_go(const struct wal *w, uint64_t pos) { return !w || pos <= w->synced_seq; }

struct wal_progress wal_progress(const struct wal *w)
{
    struct wal_progress p = {0, 0};
    if (w) p = (struct wal_progress){w->appended_seq, w->written_seq};
    return p;
}

void wal_hold(struct wal *w, struct wal_hold *h, uint64_t mark, void (*durable)(struct wal_hold *h))
{
    h->mark = mark;
    h->durable = durable;
    if (wal_reply_may_go(w, mark)) {
        durable(h);
        return;
    }
    /* by mark: almost always at the tail, as marks grow */
    struct wal_hold *after = w->hold_tail;
    while (after && after->mark > mark) after = after->prev;
    h->prev = after;
    h->next = after ? after->next : w->hold_head;
    if (h->next) h->next->prev = h; else w->hold_tail = h;
    if (after) after->next = h; else w->hold_head = h;
    h->queued = 1;
}

void wal_unhold(struct wal *w, struct wal_hold *h)
{
    if (!h->queued) return;
    if (h->prev) h->prev->next = h->next; else w->hold_head = h->next;
    if (h->next) h->next->prev = h->prev; else w->hold_tail = h->prev;
    h->prev = h->next = NULL;
    h->queued = 0;
}

/* Let every reply whose mark is on disk go, oldest first. The count let go. */
static uint64_t release_holds(struct wal *w)
{
    struct wal_hold *h;
    uint64_t released = 0;
    while ((h = w->hold_head) && h->mark <= w->synced_seq) {
        wal_unhold(w, h);
        h->durable(h);
        released++;
    }
    return released;
}

/* The loop side of a finished batch: account for it, let the replies it
 * secured go, hand on the next one. */
static void batch_complete(struct wal *w)
{
    if (batch_done(w) != 0) return; /* the retry timer is armed */
    gather_begin(w, release_holds(w));
    wal_kick(w);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t n;
    if (read(fd, &n, sizeof n) != sizeof n) return;
    batch_complete(arg);
}

void wal_run_flusher(struct wal *w)
{
    if (!w || w->thread_started || !w->has_work) return;
    flusher_wait(w, 0);
    batch_complete(w);
}

/* ---- finishing: the stop sequence's part of the log --------------------- */

/* The last record that counts as kept: synced (written, with -F). */
static uint64_t durable_seq(const struct wal *w)
{
    return w->storage && w->cfg.fsync_never ? w->written_seq : w->synced_seq;
}

/* Nonzero once everything appended is kept. */
static int all_durable(const struct wal *w)
{
    return durable_seq(w) >= w->appended_seq && !w->pending.len && !(w->unsynced && !w->cfg.fsync_never);
}

/* One turn of wal_finish: account for the batch in flight, or hand on the
 * next (or the failed one again, at its time). 0 while there is more to
 * do before `deadline`, else nonzero. */
static int finish_turn(struct wal *w, bg_time deadline)
{
    if (w->busy) {
        if (flusher_wait(w, deadline) != 0) return 1;
        if (batch_done(w) == 0) release_holds(w);
        return 0;
    }
    if (!w->writing || w->repl_dead || all_durable(w)) return 1;
    struct wal_batch *b = &w->batch;
    int sync = !w->storage || !w->cfg.fsync_never;
    if (w->retry.waiting) {
        if (loop_now() >= deadline) return 1;
        if (loop_now() < w->retry.next_at) {
            sleep_until(w->retry.next_at < deadline ? w->retry.next_at : deadline, BG_SECOND);
            return 0;
        }
        if (b->disk) w->disk_sink.retries++;
        if (w->repl) w->stream_sink.retries++;
        submit_batch(w, sync);
        return 0;
    }
    bg_buf_clear(&b->data);
    b->purge_before = 0;
    b->snapshot_first = 0;
    if (take_batch(w) != 0) return 1;
    submit_batch(w, sync);
    return 0;
}

int wal_finish(struct wal *w, bg_time deadline)
{
    if (!w) return 0;
    w->finishing = 1; /* no more compaction: only what was appended goes */
    while (finish_turn(w, deadline) == 0) {}
    if (w->storage && !w->busy) drop_step(w); /* the rest, if any */
    release_holds(w);
    w->finished_seq = w->appended_seq;
    uint64_t kept = durable_seq(w);
    if (!w->writing || (kept >= w->appended_seq && !w->records_unbuffered)) return 0;
    /* records never buffered (out of memory) count too: no snapshot wrote them */
    log_event(BG_LOG_ERROR, "wal_lost", "records=%llu error=%s flusher=%s",
              (unsigned long long)(w->appended_seq - (kept < w->appended_seq ? kept : w->appended_seq) +
                                   w->records_unbuffered),
              log_str(w->repl_dead ? "the stream refused" : w->failed_errno ? strerror(w->failed_errno)
                                                                             : "deadline passed"),
              w->busy ? "busy" : "idle");
    return BG_IO_ERROR;
}

static void timer_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    wal_kick(arg);
}

int wal_chown(struct wal *w, unsigned uid, unsigned gid)
{
    if (!w->storage) return 0;
    int dir_fd = storage_posix_dir_fd(w->posix);
    if (dir_fd < 0) {
        errno = ENOTSUP; /* not the real files */
        goto fail;
    }
    if (fchown(dir_fd, uid, gid) != 0 || fchownat(dir_fd, "lock", uid, gid, 0) != 0) goto fail;
    for (uint64_t i = w->first_index; i <= w->cur_index; i++) {
        char name[64];
        segment_name(name, sizeof name, i);
        if (fchownat(dir_fd, name, uid, gid, 0) != 0 && errno != ENOENT) goto fail;
    }
    return 0;
fail:
    log_event(BG_LOG_ERROR, "wal_chown", "dir=%s error=%s", log_str(w->cfg.dir), log_str(strerror(errno)));
    return BG_IO_ERROR;
}

void wal_stats(const struct wal *w, struct bg_process_info *pi)
{
    if (!w) return;
    pi->binlog_disk = w->disk_sink;
    pi->binlog_stream = w->stream_sink;
    if (!w->storage) return; /* replication only: no segments */
    pi->binlog_oldest = w->first_index;
    pi->binlog_current = w->cur_index;
    pi->binlog_migrated = w->records_migrated;
    pi->binlog_written = w->written_seq;
    pi->binlog_max_size = w->cfg.segment_size;
    pi->binlog_torn = w->torn_records;
    pi->binlog_unlink_failures = __atomic_load_n(&w->dropper.unlink_failures, __ATOMIC_RELAXED);
    pi->binlog_enabled = 1;
    pi->binlog_bytes = w->disk_bytes;
    pi->binlog_sync_age_ms = w->cfg.fsync_never ? -1 : (int64_t)((loop_now() - w->last_sync) / 1000000);
}

/* ---- recovery ---------------------------------------------------------- */

/* Bytes checksummed, per damaged segment, while looking for readable
 * records after the damage (docs/durability.md, "Log damage policy"). */
#define WAL_SEARCH_BUDGET ((size_t)256 << 20)

static int index_less(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Job ids noted after damage, to say which jobs are known to be lost. */
struct id_list {
    uint64_t *ids;
    size_t n, cap;
    int incomplete;            /* out of memory: the counts are lower bounds */
};

static void ids_add(struct id_list *l, uint64_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        uint64_t *a = realloc(l->ids, cap * sizeof *a);
        if (!a) {
            l->incomplete = 1;
            return;
        }
        l->ids = a;
        l->cap = cap;
    }
    l->ids[l->n++] = id;
}

static int ids_has(const struct id_list *l, uint64_t id)
{
    return l->n && bsearch(&id, l->ids, l->n, sizeof id, index_less) != NULL;
}

enum seg_status { SEG_OK, SEG_TORN, SEG_DAMAGED, SEG_MISSING, SEG_UNREADABLE, SEG_OTHER_VERSION };

/* What reading one segment found, for its log line or --check-log line. */
struct seg_report {
    uint64_t index;
    uint64_t missing;            /* SEG_MISSING: segments missing from index on */
    size_t bytes;
    uint64_t by_type[BG_REC_SNAPSHOT_END + 1];
    uint64_t jobs_put;           /* job records that made a job not alive before */
    enum seg_status status;
    int superseded;              /* before the snapshot recovery starts at */
    struct bg_journal_tail tail; /* SEG_TORN, SEG_DAMAGED: where and what */
    int error;                   /* SEG_UNREADABLE: errno */
};

/* One recovery: of a starting server, or of --check-log (read only, into a
 * scratch engine, a line per segment on stdout). */
struct recovery {
    int check;
    int copy_only;               /* replicating: the stream is the log; the
                                  * directory's segments are not read, and the
                                  * snapshot taken when this node becomes
                                  * primary supersedes them */
    int accept_damage;           /* --log-recover-damaged */
    bg_time now;
    uint64_t wall;
    uint64_t records, segments;
    uint64_t torn, damaged, missing; /* damaged: damaged or unreadable segments */
    int other_version, vanished;
    uint64_t dropped_bytes, readable_dropped, unreadable_bytes;
    int failed;                  /* out of memory: the start is refused */
    int past_damage;             /* records now follow lost ones: note unknown ids */
    /* readable records in dropped bytes, and records after the damage about
     * jobs whose put was never read */
    struct id_list dropped_puts, dropped_deletes, orphans, deleted_unknown;
    uint64_t max_unread_id;      /* highest id in those records: never given out again */
    int torn_newest;             /* the newest segment ends in a torn tail: */
    struct seg_report torn_seg;  /* where; it is cut (and said) if the start goes on */
};

/* Apply one record to the engine. 0, or BG_OUT_OF_MEMORY (said). */
static int apply_record(struct wal *w, struct recovery *rc, struct seg_report *s,
                        const struct bg_journal_record *rec)
{
    struct bg_engine *e = w->engine;
    bg_time now = rc->now;
    uint64_t wall = rc->wall;
    bg_time deadline = rec->job.deadline_wall > wall ? now + (rec->job.deadline_wall - wall) : now;
    bg_time created = rec->job.created_wall && rec->job.created_wall < wall
                          ? (now > wall - rec->job.created_wall ? now - (wall - rec->job.created_wall) : 0)
                          : now;
    switch (rec->type) {
    case BG_REC_JOB: {
        struct bg_job *old = bg_job_find(e, rec->job.id);
        if (old) w->live_bytes -= job_record_size(old);
        else s->jobs_put++;
        if (bg_engine_restore_job(e, &rec->job, deadline, created, now) != 0) {
            log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=restore error=%s", log_str(w->cfg.dir),
                      log_str("out of memory"));
            return BG_OUT_OF_MEMORY;
        }
        w->live_bytes += bg_journal_job_record_size(strlen(rec->job.tube), rec->job.body_len);
        break;
    }
    case BG_REC_UPDATE: {
        int r = bg_engine_restore_update(e, &rec->job, deadline, now);
        if (r == BG_OUT_OF_MEMORY) { /* its side record: the update cannot be applied */
            log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=restore error=%s", log_str(w->cfg.dir),
                      log_str("out of memory"));
            return BG_OUT_OF_MEMORY;
        }
        if (r != 0 && rc->past_damage) {
            ids_add(&rc->orphans, rec->job.id); /* alive, and its put is lost */
            if (rec->job.id > rc->max_unread_id) rc->max_unread_id = rec->job.id;
        }
        break;
    }
    case BG_REC_DELETE: {
        struct bg_job *j = bg_job_find(e, rec->job.id);
        if (j) w->live_bytes -= job_record_size(j);
        else if (rc->past_damage) ids_add(&rc->deleted_unknown, rec->job.id);
        bg_engine_restore_delete(e, rec->job.id);
        break;
    }
    case BG_REC_PAUSE: {
        bg_time unpause = rec->unpause_wall > wall ? now + (rec->unpause_wall - wall) : now;
        bg_engine_restore_pause(e, rec->tube, rec->pause_s, unpause, now);
        break;
    }
    }
    return 0;
}

/* bg_journal_examine's view of the readable records in dropped bytes. */
static void note_dropped(void *ctx, const struct bg_journal_record *rec)
{
    struct recovery *rc = ctx;
    if (rec->type != BG_REC_PAUSE && rec->type != BG_REC_SNAPSHOT_END && rec->job.id > rc->max_unread_id)
        rc->max_unread_id = rec->job.id;
    if (rec->type == BG_REC_JOB) ids_add(&rc->dropped_puts, rec->job.id);
    else if (rec->type == BG_REC_DELETE) ids_add(&rc->dropped_deletes, rec->job.id);
}

/* Read one segment's records in order (applying them if `apply`) up to the
 * first that cannot be read, then examine the rest: a torn tail if `newest`
 * and nothing readable follows, else damage. 0, or -1 out of memory. This
 * is the one reader of segments, for a start and for --check-log. */
static int read_segment(struct wal *w, struct recovery *rc, struct seg_report *s, const char *data,
                        size_t len, int newest, int apply)
{
    s->bytes = len;
    enum bg_journal_damage header = bg_journal_header_damage(data, len);
    if (header == BG_DAMAGE_OTHER_VERSION) {
        s->status = SEG_OTHER_VERSION;
        return 0;
    }
    size_t at = 0, used;
    if (header == BG_DAMAGE_NONE) {
        struct bg_journal_record rec;
        for (at = BG_JOURNAL_HEADER_SIZE; at < len; at += used) {
            if (bg_journal_decode(data + at, len - at, &rec, &used) != 0) break;
            s->by_type[rec.type]++;
            if (apply && apply_record(w, rc, s, &rec) != 0) return BG_OUT_OF_MEMORY;
        }
        if (at >= len) {
            s->status = SEG_OK;
            return 0;
        }
    }
    bg_journal_examine(data, len, at, WAL_SEARCH_BUDGET, &s->tail, apply ? note_dropped : NULL, rc);
    s->status = newest && bg_journal_tail_torn(&s->tail) ? SEG_TORN : SEG_DAMAGED;
    return 0;
}

/* Nonzero if the segment holds a complete snapshot (its end record). */
static int segment_has_snapshot_end(const char *data, size_t len)
{
    if (bg_journal_check_header(data, len) != 0) return 0;
    size_t at = BG_JOURNAL_HEADER_SIZE, used;
    struct bg_journal_record rec;
    while (at < len && bg_journal_decode(data + at, len - at, &rec, &used) == 0) {
        if (rec.type == BG_REC_SNAPSHOT_END) return 1;
        at += used;
    }
    return 0;
}

static const char *const seg_status_names[] = {
    [SEG_OK] = "ok", [SEG_TORN] = "torn_tail", [SEG_DAMAGED] = "damaged",
    [SEG_MISSING] = "missing", [SEG_UNREADABLE] = "unreadable", [SEG_OTHER_VERSION] = "other_version",
};

/* What is wrong with a segment, as key=value pairs (empty when nothing). */
static void describe_damage(char *out, size_t n, const struct seg_report *s)
{
    const struct bg_journal_tail *t = &s->tail;
    switch (s->status) {
    case SEG_TORN:
    case SEG_DAMAGED:
        snprintf(out, n, " damage=%s offset=%zu dropped_bytes=%zu readable_records_after=%llu%s%s",
                 bg_journal_damage_name(t->damage), t->offset, t->dropped_bytes,
                 (unsigned long long)t->readable, t->unwritten_page ? " unwritten_page=yes" : "",
                 t->search_complete ? "" : " search=incomplete");
        break;
    case SEG_MISSING:
        snprintf(out, n, " damage=missing_segment missing_segments=%llu", (unsigned long long)s->missing);
        break;
    case SEG_UNREADABLE:
        snprintf(out, n, " damage=unreadable error=%s", log_str(strerror(s->error)));
        break;
    default:
        out[0] = '\0';
    }
}

/* Say what reading a segment found: a line of --check-log on stdout, or at
 * start a log event for a segment that was not read whole. */
static void report_segment(const struct recovery *rc, const struct seg_report *s)
{
    char name[64], damage[256];
    segment_name(name, sizeof name, s->index);
    describe_damage(damage, sizeof damage, s);
    if (rc->check) {
        printf("segment index=%llu file=%s", (unsigned long long)s->index, name);
        if (s->status != SEG_MISSING && s->status != SEG_UNREADABLE) {
            uint64_t records = 0;
            for (int k = 0; k <= BG_REC_SNAPSHOT_END; k++) records += s->by_type[k];
            printf(" bytes=%zu records=%llu job=%llu update=%llu delete=%llu pause=%llu snapshot_end=%llu",
                   s->bytes, (unsigned long long)records, (unsigned long long)s->by_type[BG_REC_JOB],
                   (unsigned long long)s->by_type[BG_REC_UPDATE], (unsigned long long)s->by_type[BG_REC_DELETE],
                   (unsigned long long)s->by_type[BG_REC_PAUSE],
                   (unsigned long long)s->by_type[BG_REC_SNAPSHOT_END]);
            if (!s->superseded) printf(" jobs_put=%llu", (unsigned long long)s->jobs_put);
        }
        printf(" status=%s%s\n", s->superseded ? "superseded" : seg_status_names[s->status], damage);
        return;
    }
    switch (s->status) {
    case SEG_OK:
        return;
    case SEG_TORN: /* said once the start is decided: cut_torn_tail */
        return;
    case SEG_OTHER_VERSION:
        log_event(BG_LOG_ERROR, "wal_unknown_segment", "file=%s action=refuse_start hint=%s", name,
                  log_str("written by another beangate version: start the version that wrote it"));
        return;
    default:
        if (rc->accept_damage)
            log_event(BG_LOG_WARN, "wal_damage_dropped", "file=%s%s action=dropped", name, damage);
        else
            log_event(BG_LOG_ERROR, "wal_damaged", "file=%s%s action=refuse_start", name, damage);
    }
}

/* Count a segment that was not read whole into the recovery's totals. */
static void account_segment(struct wal *w, struct recovery *rc, const struct seg_report *s)
{
    switch (s->status) {
    case SEG_TORN:
        rc->torn++;
        w->torn_records++;
        rc->torn_newest = 1;
        rc->torn_seg = *s;
        break;
    case SEG_DAMAGED:
    case SEG_UNREADABLE: {
        int whole = s->status == SEG_UNREADABLE;
        rc->dropped_bytes += whole ? s->bytes : s->tail.dropped_bytes;
        rc->unreadable_bytes += whole ? s->bytes : s->tail.dropped_bytes - s->tail.readable_bytes;
        rc->readable_dropped += whole ? 0 : s->tail.readable;
        rc->damaged++;
        rc->past_damage = 1;
        w->torn_records++;
        break;
    }
    case SEG_MISSING:
        rc->missing += s->missing;
        rc->past_damage = 1;
        break;
    case SEG_OTHER_VERSION:
        rc->other_version = 1;
        break;
    case SEG_OK:
        break;
    }
}

/* Jobs known to be lost: put in dropped bytes or updated after the damage
 * without their put, and neither deleted since nor alive; and jobs a
 * dropped delete had removed that are alive again. */
static void count_losses(struct wal *w, struct recovery *rc, uint64_t *lost, uint64_t *back)
{
    struct id_list *lists[] = {&rc->dropped_puts, &rc->dropped_deletes, &rc->orphans, &rc->deleted_unknown};
    for (size_t k = 0; k < 4; k++)
        if (lists[k]->n) qsort(lists[k]->ids, lists[k]->n, sizeof *lists[k]->ids, index_less);
    *lost = *back = 0;
    for (size_t k = 0; k < 2; k++) {
        struct id_list *l = k ? &rc->orphans : &rc->dropped_puts;
        for (size_t i = 0; i < l->n; i++) {
            uint64_t id = l->ids[i];
            if (i && l->ids[i - 1] == id) continue;
            if (k && ids_has(&rc->dropped_puts, id)) continue; /* counted already */
            if (!ids_has(&rc->dropped_deletes, id) && !ids_has(&rc->deleted_unknown, id) &&
                !bg_job_find(w->engine, id))
                (*lost)++;
        }
    }
    for (size_t i = 0; i < rc->dropped_deletes.n; i++)
        if ((!i || rc->dropped_deletes.ids[i - 1] != rc->dropped_deletes.ids[i]) &&
            bg_job_find(w->engine, rc->dropped_deletes.ids[i]))
            (*back)++;
}

/* The end of a recovery that met damage: why the start is refused, or
 * what the start with --log-recover-damaged dropped; for --check-log, its
 * summary line. */
static void report_summary(struct wal *w, struct recovery *rc)
{
    if (!rc->check && !rc->damaged && !rc->missing) return;
    uint64_t lost, back;
    int incomplete = rc->dropped_puts.incomplete || rc->dropped_deletes.incomplete ||
                     rc->orphans.incomplete || rc->deleted_unknown.incomplete;
    count_losses(w, rc, &lost, &back);
    char unknown[160] = "";
    if (rc->missing || rc->unreadable_bytes)
        snprintf(unknown, sizeof unknown, " unknown=%s", log_str(rc->missing && rc->unreadable_bytes
                     ? "what the missing segments and the unreadable bytes held"
                     : rc->missing ? "what the missing segments held" : "what the unreadable bytes held"));
    char what[512];
    snprintf(what, sizeof what,
             "damaged_segments=%llu missing_segments=%llu dropped_bytes=%llu unreadable_bytes=%llu "
             "readable_records_dropped=%llu jobs_lost_at_least=%llu%s deleted_jobs_back=%llu%s",
             (unsigned long long)rc->damaged, (unsigned long long)rc->missing,
             (unsigned long long)rc->dropped_bytes, (unsigned long long)rc->unreadable_bytes,
             (unsigned long long)rc->readable_dropped, (unsigned long long)lost, incomplete ? "+" : "",
             (unsigned long long)back, unknown);
    int damaged = rc->damaged || rc->missing || rc->other_version;
    if (rc->check) {
        printf("summary segments=%llu records=%llu live_jobs=%zu torn_tails=%llu %s%s%s result=%s\n",
               (unsigned long long)rc->segments, (unsigned long long)rc->records, w->engine->job_count,
               (unsigned long long)rc->torn, what, rc->other_version ? " other_version=yes" : "",
               rc->vanished ? " vanished=yes" : "",
               rc->vanished ? "incomplete" : damaged ? "damaged" : rc->torn ? "torn_tail" : "clean");
        return;
    }
    if (rc->accept_damage)
        log_event(BG_LOG_WARN, "wal_recovered_damaged", "dir=%s jobs=%zu %s action=started",
                  log_str(w->cfg.dir), w->engine->job_count, what);
    else
        log_event(BG_LOG_ERROR, "wal_refused", "dir=%s %s action=refuse_start hint=%s", log_str(w->cfg.dir),
                  what, log_str("beangate --check-log DIR reports every segment; "
                                "--log-recover-damaged starts with what is readable"));
}

/* Nonzero (said) if the recovered jobs include some whose id another shard
 * owns: the log was written with another --shard (or none), and serving it
 * would break the rule that a job's id tells which instance holds it. */
static int other_shard_jobs(struct wal *w)
{
    const struct bg_engine *e = w->engine;
    uint64_t first;
    size_t n = bg_engine_foreign_jobs(e, &first);
    if (!n) return 0;
    char shard[32];
    snprintf(shard, sizeof shard, "%u/%u", e->shard_index, e->shard_count);
    log_event(BG_LOG_ERROR, "wal_shard_mismatch",
              "dir=%s shard=%s jobs=%zu first_id=%llu id_mod_n=%u action=refuse_start msg=%s", log_str(w->cfg.dir),
              shard, n, (unsigned long long)first, bg_shard_of_id(first, e->shard_count),
              log_str("the log holds jobs whose ids another shard owns: it was written with another "
                      "--shard (or none). Start it with the --shard it was written with (docs/scaling.md)"));
    return 1;
}

/* Say the newest segment's torn tail was dropped and, if the start goes on
 * (`cut`), cut it off the file so that it is never taken for damage once a
 * newer segment follows it; a segment with no header goes, and the next
 * segment takes its index. 0 or BG_IO_ERROR (said). */
static int cut_torn_tail(struct wal *w, struct recovery *rc, int cut)
{
    const struct seg_report *s = &rc->torn_seg;
    size_t offset = s->tail.offset;
    char name[64], damage[256];
    segment_name(name, sizeof name, s->index);
    describe_damage(damage, sizeof damage, s);
    log_event(BG_LOG_WARN, "wal_torn_tail", "file=%s%s action=%s", name, damage, cut ? "cut" : "kept");
    if (!cut) return 0;
    struct storage *st = w->storage;
    int ok;
    if (offset < BG_JOURNAL_HEADER_SIZE) {
        ok = (errno = st->ops->unlink(st, name)) == 0;
        if (ok) w->cur_index = s->index - 1;
    } else {
        int file;
        ok = (errno = st->ops->open(st, name, &file)) == 0;
        if (ok) {
            int e = st->ops->truncate(st, file, offset);
            if (!e) e = st->ops->sync(st, file);
            st->ops->close(st, file);
            ok = (errno = e) == 0;
        }
    }
    if (!ok) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=cut_torn_tail file=%s error=%s",
                  log_str(w->cfg.dir), name, log_str(strerror(errno)));
        return BG_IO_ERROR;
    }
    uint64_t *size = segment_size_at(w, s->index);
    if (size) {
        uint64_t left = offset < BG_JOURNAL_HEADER_SIZE ? 0 : offset;
        w->disk_bytes -= *size - left;
        *size = left;
    }
    return 0;
}

/* Remember a damaged segment: kept as beangate.N.wal.damaged, not deleted,
 * when a snapshot supersedes it. */
static void note_damaged_index(struct wal *w, uint64_t index)
{
    uint64_t *a = realloc(w->damaged_indexes, (w->damaged_count + 1) * sizeof *a);
    if (!a) return; /* then it is deleted like the others */
    w->damaged_indexes = a;
    w->damaged_indexes[w->damaged_count++] = index;
}

/* Replay every segment in index order; for --check-log (rc->check) only
 * read and report. 0, or when the start must be refused (said): BG_CORRUPT
 * for damage, BG_IO_ERROR or BG_OUT_OF_MEMORY when it could not be read. */
static int recover(struct wal *w, struct recovery *rc)
{
    struct storage *st = w->storage;
    char **names = NULL;
    size_t name_count = 0;
    int e = st->ops->list(st, &names, &name_count);
    uint64_t *indexes = e ? NULL : malloc((name_count ? name_count : 1) * sizeof *indexes);
    if (!indexes) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=list error=%s", log_str(w->cfg.dir),
                  log_str(strerror(e ? e : ENOMEM)));
        if (!e) storage_free_names(names, name_count);
        rc->failed = 1;
        return e ? BG_IO_ERROR : BG_OUT_OF_MEMORY;
    }
    size_t n = 0;
    for (size_t i = 0; i < name_count; i++)
        if (segment_index(names[i], &indexes[n]) == 0) n++;
    storage_free_names(names, name_count);
    if (n) qsort(indexes, n, sizeof *indexes, index_less);
    size_t unique = 0; /* beangate.2.wal and beangate.02.wal are one index */
    for (size_t i = 0; i < n; i++)
        if (!unique || indexes[unique - 1] != indexes[i]) indexes[unique++] = indexes[i];
    n = unique;
    /* start at the newest segment holding a complete snapshot, if any */
    size_t start = 0;
    int snapshot = 0;
    if (rc->copy_only) {
        w->first_index = n ? indexes[0] : 1;
        w->cur_index = n ? indexes[n - 1] : 0;
        free(indexes);
        return 0;
    }
    for (size_t i = n; i-- > 0 && !snapshot;) {
        char name[64];
        segment_name(name, sizeof name, indexes[i]);
        size_t len = 0;
        char *data;
        if (st->ops->read_all(st, name, &data, &len) == 0) {
            if (segment_has_snapshot_end(data, len)) start = i, snapshot = 1;
            st->ops->release(st, data, len);
        }
    }
    w->first_index = n ? indexes[start] : 1; /* segments before it are superseded */
    if (snapshot && start)
        log_event(BG_LOG_INFO, "wal_snapshot", "file=beangate.%llu.wal skipped_segments=%zu",
                  (unsigned long long)indexes[start], start);
    for (size_t i = rc->check ? 0 : start; i < n && !rc->failed; i++) {
        struct seg_report s = {.index = indexes[i], .superseded = i < start};
        /* a gap: segments between the last one read and this one are gone
         * (before a snapshot, only segment 1 may start the log) */
        uint64_t expect = i <= start ? (snapshot ? indexes[i] : 1) : indexes[i - 1] + 1;
        if (!s.superseded && indexes[i] > expect) {
            struct seg_report gap = {.index = expect, .missing = indexes[i] - expect, .status = SEG_MISSING};
            account_segment(w, rc, &gap);
            report_segment(rc, &gap);
        }
        char name[64];
        segment_name(name, sizeof name, indexes[i]);
        size_t len = 0;
        char *data;
        int read_error = st->ops->read_all(st, name, &data, &len);
        if (read_error) {
            if (read_error == ENOENT && rc->check) rc->vanished = 1; /* a running server's compaction */
            s.status = SEG_UNREADABLE;
            s.error = read_error;
        } else {
            rc->failed = read_segment(w, rc, &s, data, len, i == n - 1, !s.superseded) != 0;
            st->ops->release(st, data, len);
        }
        if (!s.superseded) {
            for (int k = 0; k <= BG_REC_SNAPSHOT_END; k++) rc->records += s.by_type[k];
            rc->segments++;
            account_segment(w, rc, &s);
            if (s.status == SEG_DAMAGED || s.status == SEG_UNREADABLE) note_damaged_index(w, s.index);
            uint64_t *size = segment_size_at(w, indexes[i]);
            if (size) *size = s.bytes;
            w->disk_bytes += s.bytes;
        }
        report_segment(rc, &s);
    }
    w->cur_index = n ? indexes[n - 1] : 0;
    bg_engine_restore_finish(w->engine);
    int refuse = rc->failed || rc->other_version || ((rc->damaged || rc->missing) && !rc->accept_damage) ||
                 (!rc->check && other_shard_jobs(w));
    /* a failed cut is an I/O error (said), not damage: a start may succeed */
    if (!rc->check && rc->torn_newest && cut_torn_tail(w, rc, !refuse) != 0) refuse = rc->failed = 1;
    report_summary(w, rc);
    if (!rc->check && !refuse) {
        if (start) { /* superseded by the snapshot */
            for (size_t i = 0; i < start; i++) {
                char name[64];
                segment_name(name, sizeof name, indexes[i]);
                st->ops->unlink(st, name);
            }
            st->ops->sync_dir(st); /* best effort: they are superseded either way */
        }
        w->force_snapshot = rc->damaged || rc->missing;
        /* ids seen only in dropped records were given out: not again */
        bg_engine_id_seen(w->engine, rc->max_unread_id);
    }
    free(indexes);
    free(rc->dropped_puts.ids);
    free(rc->dropped_deletes.ids);
    free(rc->orphans.ids);
    free(rc->deleted_unknown.ids);
    if (refuse) return rc->failed ? BG_IO_ERROR : BG_CORRUPT;
    if (!rc->check)
        log_event(BG_LOG_INFO, "wal_recovered_jobs", "jobs=%zu records=%llu segments=%zu torn=%llu",
                  w->engine->job_count, (unsigned long long)rc->records, n, (unsigned long long)w->torn_records);
    return 0;
}

/* ---- importing beanstalkd's log (docs/durability.md, "Importing
 * beanstalkd's log") ------------------------------------------------------ */

#define IMPORT_FILE "beangate.1.wal.import"       /* the import, until it commits */
#define IMPORT_MARKER "beanstalkd-import.pending" /* committed or about to: binlog.N go aside */
#define IMPORT_ASIDE_SUFFIX ".imported"
/* A test hook: the start stops (exit status 75, as a crash) right after the
 * named step of the import's commit sequence. */
#define IMPORT_STOP_ENV "BEANGATE_TEST_IMPORT_STOP"

/* The number of beanstalkd's file name "binlog.<digits>". 0 or BG_BAD_FORMAT. */
static int binlog_index(const char *name, uint64_t *index)
{
    static const char prefix[] = "binlog.";
    size_t pre = sizeof prefix - 1, len = strlen(name);
    if (len <= pre || memcmp(name, prefix, pre) != 0) return BG_BAD_FORMAT;
    return bg_parse_u64(name + pre, len - pre, UINT64_MAX, index);
}

/* What the directory holds of beanstalkd's log, read (binlog_scan). */
struct binlog_scan {
    char **names;                 /* the directory's names (storage list) */
    size_t name_count;
    uint64_t *indexes;            /* of the binlog.N files, oldest first */
    size_t count;
    char **data;                  /* their bytes (storage read_all) */
    size_t *lens;
    struct bg_binlog_file *files; /* what reading each found */
    struct bg_binlog log;         /* the jobs */
    int segments, marker;         /* beangate.N.wal files; the import's marker */
    uint64_t bytes, damaged, torn;
    uint64_t by_state[BG_BINLOG_DELAYED + 1]; /* live jobs */
    int error;                    /* an errno (or ENOMEM) when the scan failed */
    const char *failed_op;
};

static void binlog_scan_free(struct storage *st, struct binlog_scan *sc)
{
    for (size_t i = 0; i < sc->count; i++)
        if (sc->data && sc->data[i]) st->ops->release(st, sc->data[i], sc->lens[i]);
    free(sc->data);
    free(sc->lens);
    free(sc->files);
    free(sc->indexes);
    bg_binlog_free(&sc->log);
    if (sc->names) storage_free_names(sc->names, sc->name_count);
    memset(sc, 0, sizeof *sc);
}

/* List the directory and read every binlog.N file (oldest first) into sc.
 * 0, or an errno (sc->error, sc->failed_op: what failed). */
static int binlog_scan(struct storage *st, struct binlog_scan *sc)
{
    memset(sc, 0, sizeof *sc);
    bg_binlog_init(&sc->log);
    int e = st->ops->list(st, &sc->names, &sc->name_count);
    if (e) {
        sc->names = NULL;
        sc->failed_op = "list";
        return sc->error = e;
    }
    size_t n = sc->name_count ? sc->name_count : 1;
    sc->indexes = malloc(n * sizeof *sc->indexes);
    sc->data = calloc(n, sizeof *sc->data);
    sc->lens = calloc(n, sizeof *sc->lens);
    sc->files = calloc(n, sizeof *sc->files);
    if (!sc->indexes || !sc->data || !sc->lens || !sc->files) {
        sc->failed_op = "read";
        return sc->error = ENOMEM;
    }
    for (size_t i = 0; i < sc->name_count; i++) {
        uint64_t index;
        if (binlog_index(sc->names[i], &index) == 0) sc->indexes[sc->count++] = index;
        else if (segment_index(sc->names[i], &index) == 0) sc->segments = 1;
        else if (strcmp(sc->names[i], IMPORT_MARKER) == 0) sc->marker = 1;
    }
    if (sc->count) qsort(sc->indexes, sc->count, sizeof *sc->indexes, index_less);
    for (size_t i = 0; i < sc->count; i++) {
        char name[64];
        snprintf(name, sizeof name, "binlog.%llu", (unsigned long long)sc->indexes[i]);
        if ((e = st->ops->read_all(st, name, &sc->data[i], &sc->lens[i])) != 0) {
            sc->data[i] = NULL;
            sc->failed_op = "read";
            return sc->error = e;
        }
        sc->bytes += sc->lens[i];
        if (bg_binlog_read(&sc->log, sc->data[i], sc->lens[i], &sc->files[i]) != 0) {
            sc->failed_op = "read";
            return sc->error = ENOMEM;
        }
    }
    bg_binlog_classify(sc->files, sc->count);
    for (size_t i = 0; i < sc->count; i++) {
        sc->damaged += bg_binlog_damaged(&sc->files[i]) != 0;
        sc->torn += sc->files[i].torn;
    }
    for (size_t i = 0; i < sc->log.count; i++)
        if (sc->log.jobs[i].live) sc->by_state[sc->log.jobs[i].state]++;
    return 0;
}

/* Bytes dropped from a file: from where reading stopped to its last
 * nonzero byte (beanstalkd's zeros after it are no loss). */
static size_t binlog_dropped_bytes(const struct binlog_scan *sc, size_t i)
{
    const struct bg_binlog_file *f = &sc->files[i];
    if (f->damage == BG_BINLOG_OK || f->damage == BG_BINLOG_NEVER_WRITTEN) return 0;
    size_t end = sc->lens[i];
    while (end > f->offset && !sc->data[i][end - 1]) end--;
    return end - f->offset;
}

/* What is wrong with binlog file i, as key=value pairs (empty when nothing). */
static void binlog_describe(char *out, size_t n, const struct binlog_scan *sc, size_t i)
{
    const struct bg_binlog_file *f = &sc->files[i];
    if (f->damage == BG_BINLOG_OK || f->damage == BG_BINLOG_NEVER_WRITTEN) {
        out[0] = '\0';
        return;
    }
    snprintf(out, n, " damage=%s offset=%zu dropped_bytes=%zu", bg_binlog_damage_name(f->damage), f->offset,
             binlog_dropped_bytes(sc, i));
}

static const char *binlog_status(const struct bg_binlog_file *f)
{
    return f->damage == BG_BINLOG_NEVER_WRITTEN ? "never_written" : f->torn ? "torn_tail"
           : bg_binlog_damaged(f) ? "damaged" : "ok";
}

/* The log record of an imported job: a reserved job is ready again (its
 * reservation died with beanstalkd), a passed deadline leaves it delayed
 * until now (recovery makes it ready). out->tube is `tube`, the caller's
 * buffer. */
static void binlog_job_record(const struct bg_binlog_job *j, struct bg_journal_job *out,
                              char tube[BG_TUBE_NAME_MAX + 1])
{
    memset(out, 0, sizeof *out);
    out->id = j->id;
    memcpy(tube, j->tube, j->tube_len);
    tube[j->tube_len] = '\0';
    out->tube = tube;
    out->pri = j->pri;
    out->state = j->state == BG_BINLOG_BURIED ? BG_JOB_BURIED : j->state == BG_BINLOG_DELAYED ? BG_JOB_DELAYED
                                                                                             : BG_JOB_READY;
    out->delay_s = (uint32_t)((uint64_t)j->delay_ns / BG_SECOND);
    uint64_t ttr_s = (uint64_t)j->ttr_ns / BG_SECOND;
    out->ttr_s = ttr_s ? (uint32_t)ttr_s : 1; /* beanstalkd's least TTR */
    out->deadline_wall = j->state == BG_BINLOG_DELAYED && j->deadline_ns > 0 ? (uint64_t)j->deadline_ns : 0;
    out->created_wall = (uint64_t)j->created_ns;
    out->reserves = j->reserves;
    out->timeouts = j->timeouts;
    out->releases = j->releases;
    out->buries = j->buries; /* as logged: beanstalkd's replay adds one per restart */
    out->kicks = j->kicks;
    out->body_len = j->body_len;
    out->body = j->body;
}

static int binlog_job_less(const void *a, const void *b)
{
    uint64_t x = (*(const struct bg_binlog_job *const *)a)->id, y = (*(const struct bg_binlog_job *const *)b)->id;
    return x < y ? -1 : x > y;
}

/* The import's segment: a header, a JOB record per live job (by id) and,
 * when the highest id any record had is not live, a DELETE record of it
 * (recovery keeps ids above it). 0 or BG_OUT_OF_MEMORY. */
static int binlog_encode(const struct binlog_scan *sc, struct bg_buf *out)
{
    const struct bg_binlog *log = &sc->log;
    const struct bg_binlog_job **live = malloc((log->count ? log->count : 1) * sizeof *live);
    if (!live) return BG_OUT_OF_MEMORY;
    size_t n = 0;
    for (size_t i = 0; i < log->count; i++)
        if (log->jobs[i].live) live[n++] = &log->jobs[i];
    qsort(live, n, sizeof *live, binlog_job_less);
    char header[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(header);
    int r = bg_buf_append(out, header, sizeof header);
    for (size_t i = 0; i < n && r == 0; i++) {
        struct bg_journal_job rec;
        char tube[BG_TUBE_NAME_MAX + 1];
        binlog_job_record(live[i], &rec, tube);
        r = bg_journal_encode_job(out, &rec, 1);
    }
    if (r == 0 && log->max_id && !(n && live[n - 1]->id == log->max_id))
        r = bg_journal_encode_delete(out, log->max_id);
    free(live);
    return r;
}

/* The test hook: stop here if IMPORT_STOP_ENV names this step. */
static void import_step_done(const char *step)
{
    const char *stop = getenv(IMPORT_STOP_ENV);
    if (!stop || strcmp(stop, step) != 0) return;
    log_event(BG_LOG_WARN, "binlog_import_test_stop", "step=%s", step);
    fflush(stderr);
    _exit(75);
}

/* Write NAME whole (created afresh) and sync it. 0 or an errno. */
static int write_file_synced(struct storage *st, const char *name, const void *p, size_t n)
{
    int file;
    int e = st->ops->create(st, name, &file);
    if (e) return e;
    e = write_fully(st, file, p, n, 0);
    if (!e) e = st->ops->sync(st, file);
    int c = st->ops->close(st, file);
    return e ? e : c;
}

/* Nonzero if the marker's text (a name a line) lists name. */
static int marker_lists(const char *marker, size_t len, const char *name)
{
    size_t n = strlen(name);
    for (size_t at = 0; at + n <= len;) {
        const char *nl = memchr(marker + at, '\n', len - at);
        size_t line = nl ? (size_t)(nl - (marker + at)) : len - at;
        if (line == n && memcmp(marker + at, name, n) == 0) return 1;
        at += line + 1;
    }
    return 0;
}

/* Move the binlog.N files the import brought aside (binlog.N.imported, or
 * with a number after it when that name is taken: nothing is overwritten):
 * all of sc's, or (marker not NULL: its text, a name a line) only those
 * it lists; sync the directory, then drop the marker. 0 or an errno; *op
 * says what failed. */
static int binlog_move_aside(struct storage *st, const struct binlog_scan *sc, const char *marker,
                             size_t marker_len, const char **op)
{
    int e = 0;
    for (size_t i = 0; i < sc->count && !e; i++) {
        char from[64], to[96];
        snprintf(from, sizeof from, "binlog.%llu", (unsigned long long)sc->indexes[i]);
        if (marker && !marker_lists(marker, marker_len, from)) continue; /* not imported: left, then refused */
        snprintf(to, sizeof to, "%s%s", from, IMPORT_ASIDE_SUFFIX);
        for (unsigned k = 2;; k++) {
            int taken = 0;
            for (size_t m = 0; m < sc->name_count && !taken; m++) taken = strcmp(sc->names[m], to) == 0;
            if (!taken) break;
            snprintf(to, sizeof to, "%s%s.%u", from, IMPORT_ASIDE_SUFFIX, k);
        }
        *op = "move_aside";
        e = st->ops->rename(st, from, to);
    }
    if (!e && !(e = st->ops->sync_dir(st))) import_step_done("moved_aside");
    if (!e) *op = "remove_marker", e = st->ops->unlink(st, IMPORT_MARKER);
    if (!e) *op = "sync_dir", e = st->ops->sync_dir(st);
    return e;
}

/* Say each damaged or torn binlog file; 1 if the import must be refused. */
static int binlog_report_damage(const struct wal *w, const struct binlog_scan *sc)
{
    for (size_t i = 0; i < sc->count; i++) {
        char name[64], damage[160];
        snprintf(name, sizeof name, "binlog.%llu", (unsigned long long)sc->indexes[i]);
        binlog_describe(damage, sizeof damage, sc, i);
        if (sc->files[i].torn)
            log_event(BG_LOG_WARN, "binlog_torn_tail", "file=%s%s action=dropped", name, damage);
        else if (bg_binlog_damaged(&sc->files[i]) && w->cfg.recover_damaged)
            log_event(BG_LOG_WARN, "binlog_damage_dropped", "file=%s%s action=dropped", name, damage);
        else if (bg_binlog_damaged(&sc->files[i]))
            log_event(BG_LOG_ERROR, "binlog_damaged", "file=%s%s action=refuse_start", name, damage);
    }
    if (!sc->damaged || w->cfg.recover_damaged) return 0;
    log_event(BG_LOG_ERROR, "binlog_import_refused", "dir=%s damaged_files=%llu action=refuse_start hint=%s",
              log_str(w->cfg.dir), (unsigned long long)sc->damaged,
              log_str("beangate --check-log DIR reports every file; --log-recover-damaged imports what is readable"));
    return 1;
}

/* Write the import and commit it (the sequence in docs/durability.md):
 * the import file synced, the marker synced, the rename to beangate.1.wal
 * (the commit), beanstalkd's files aside, the marker gone. 0 or an errno;
 * *op says what failed. */
static int binlog_commit(struct storage *st, const struct binlog_scan *sc, const struct bg_buf *segment,
                         const char **op)
{
    *op = "write_import";
    int e = write_file_synced(st, IMPORT_FILE, bg_buf_head(segment), segment->len);
    if (e) return e;
    import_step_done("import_written");
    struct bg_buf marker = {0};
    for (size_t i = 0; i < sc->count; i++)
        if (bg_buf_printf(&marker, "binlog.%llu\n", (unsigned long long)sc->indexes[i]) != 0) {
            bg_buf_free(&marker);
            return ENOMEM;
        }
    *op = "write_marker";
    e = write_file_synced(st, IMPORT_MARKER, bg_buf_head(&marker), marker.len);
    bg_buf_free(&marker);
    if (!e) e = st->ops->sync_dir(st);
    if (e) return e;
    import_step_done("marker_written");
    *op = "commit";
    if ((e = st->ops->rename(st, IMPORT_FILE, "beangate.1.wal")) != 0 || (e = st->ops->sync_dir(st)) != 0) return e;
    import_step_done("committed");
    return binlog_move_aside(st, sc, NULL, 0, op);
}

/* Before recovery: import beanstalkd's binlog.N files of the directory
 * into beangate.1.wal when there is no beangate segment, finish an import
 * that committed, refuse a directory that holds both logs. 0, or an
 * outcome after a message (BG_CORRUPT: damage or both logs). */
static int binlog_import(struct wal *w)
{
    struct storage *st = w->storage;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct binlog_scan sc;
    const char *op = NULL;
    int e = binlog_scan(st, &sc), r = 0;
    if (e) {
        op = sc.failed_op;
        goto failed;
    }
    if (sc.marker && sc.segments) { /* committed: finish moving aside what it imported */
        char *marker;
        size_t marker_len;
        op = "read_marker";
        if ((e = st->ops->read_all(st, IMPORT_MARKER, &marker, &marker_len)) != 0) goto failed;
        e = binlog_move_aside(st, &sc, marker ? marker : "", marker_len, &op);
        st->ops->release(st, marker, marker_len);
        if (e) goto failed;
        log_event(BG_LOG_WARN, "binlog_import_finished", "dir=%s", log_str(w->cfg.dir));
        binlog_scan_free(st, &sc); /* binlog.N files it did not list make the start refused */
        return binlog_import(w);
    }
    if (sc.marker) { /* not committed: start over */
        if ((e = st->ops->unlink(st, IMPORT_MARKER)) != 0 || (e = st->ops->sync_dir(st)) != 0) {
            op = "remove_marker";
            goto failed;
        }
    }
    if (!sc.count) goto done;
    if (sc.segments) {
        log_event(BG_LOG_ERROR, "binlog_import_refused", "dir=%s binlog_files=%zu action=refuse_start msg=%s",
                  log_str(w->cfg.dir), sc.count,
                  log_str("the directory holds beangate's log (beangate.N.wal) and beanstalkd's binlog.N files: "
                          "their jobs would be ignored. Move the binlog.N files to a directory of their own "
                          "and start beangate on it to import them, or move them away"));
        r = BG_CORRUPT;
        goto done;
    }
    if (binlog_report_damage(w, &sc)) {
        r = BG_CORRUPT;
        goto done;
    }
    struct bg_buf segment = {0};
    if (binlog_encode(&sc, &segment) != 0) {
        bg_buf_free(&segment);
        op = "encode", e = ENOMEM;
        goto failed;
    }
    e = binlog_commit(st, &sc, &segment, &op);
    bg_buf_free(&segment);
    if (e) goto failed;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t ms = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
    /* at warn, so that it shows without -V: the directory changed */
    log_event(BG_LOG_WARN, "binlog_imported",
              "dir=%s files=%zu jobs=%llu ready=%llu delayed=%llu buried=%llu reserved_now_ready=%llu bytes=%llu "
              "max_id=%llu torn_tails=%llu damaged_files=%llu ms=%llu moved_aside=binlog.N%s",
              log_str(w->cfg.dir), sc.count,
              (unsigned long long)(sc.by_state[BG_BINLOG_READY] + sc.by_state[BG_BINLOG_RESERVED] +
                                   sc.by_state[BG_BINLOG_BURIED] + sc.by_state[BG_BINLOG_DELAYED]),
              (unsigned long long)sc.by_state[BG_BINLOG_READY], (unsigned long long)sc.by_state[BG_BINLOG_DELAYED],
              (unsigned long long)sc.by_state[BG_BINLOG_BURIED], (unsigned long long)sc.by_state[BG_BINLOG_RESERVED],
              (unsigned long long)sc.bytes, (unsigned long long)sc.log.max_id, (unsigned long long)sc.torn,
              (unsigned long long)sc.damaged, (unsigned long long)ms, IMPORT_ASIDE_SUFFIX);
    goto done;
failed:
    log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=binlog_import_%s error=%s", log_str(w->cfg.dir),
              op ? op : "read", log_str(strerror(e)));
    errno = e;
    r = BG_IO_ERROR;
done:;
    int err = errno;
    binlog_scan_free(st, &sc);
    errno = err;
    return r;
}

/* --check-log's part for beanstalkd's files: a line per binlog.N and one
 * for what an import would bring. WAL_CHECK_DAMAGED if a start would
 * refuse, WAL_CHECK_FAILED if they could not be read, else 0. */
static int binlog_check(struct storage *st, const char *dir)
{
    struct binlog_scan sc;
    int e = binlog_scan(st, &sc);
    if (e) {
        log_event(BG_LOG_ERROR, "check_log_failed", "dir=%s op=binlog_%s error=%s", log_str(dir), sc.failed_op,
                  log_str(strerror(e)));
        binlog_scan_free(st, &sc);
        return WAL_CHECK_FAILED;
    }
    int result = 0;
    for (size_t i = 0; i < sc.count; i++) {
        char damage[160];
        const struct bg_binlog_file *f = &sc.files[i];
        binlog_describe(damage, sizeof damage, &sc, i);
        printf("binlog file=binlog.%llu bytes=%zu version=%d records=%llu full_records=%llu jobs_made=%llu status=%s%s\n",
               (unsigned long long)sc.indexes[i], f->bytes, f->version, (unsigned long long)f->records,
               (unsigned long long)f->full_records, (unsigned long long)f->jobs_made, binlog_status(f), damage);
    }
    if (sc.count) {
        const char *import = sc.marker && sc.segments ? "committed"
                             : sc.segments            ? "refused_both_logs"
                             : sc.damaged             ? "refused_damaged"
                                                      : "would_import";
        printf("binlog_import files=%zu jobs=%llu ready=%llu delayed=%llu buried=%llu reserved_now_ready=%llu "
               "bytes=%llu max_id=%llu torn_tails=%llu damaged_files=%llu import=%s\n",
               sc.count,
               (unsigned long long)(sc.by_state[BG_BINLOG_READY] + sc.by_state[BG_BINLOG_RESERVED] +
                                    sc.by_state[BG_BINLOG_BURIED] + sc.by_state[BG_BINLOG_DELAYED]),
               (unsigned long long)sc.by_state[BG_BINLOG_READY], (unsigned long long)sc.by_state[BG_BINLOG_DELAYED],
               (unsigned long long)sc.by_state[BG_BINLOG_BURIED], (unsigned long long)sc.by_state[BG_BINLOG_RESERVED],
               (unsigned long long)sc.bytes, (unsigned long long)sc.log.max_id, (unsigned long long)sc.torn,
               (unsigned long long)sc.damaged, import);
        if (!(sc.marker && sc.segments) && (sc.segments || sc.damaged)) result = WAL_CHECK_DAMAGED;
    }
    binlog_scan_free(st, &sc);
    return result;
}

/* The storage of cfg: the one given, or the real files of cfg->dir
 * (locked), wrapped by the disk-fault test hook when its environment
 * variable is set. 0, or BG_IO_ERROR after a message. */
static int open_storage(struct wal *w, const struct wal_config *cfg)
{
    if (cfg->storage) {
        w->storage = cfg->storage;
        w->posix = cfg->storage;
        return 0;
    }
    int e = storage_posix_open(&w->storage, cfg->dir, 1);
    if (e == EWOULDBLOCK) {
        log_event(BG_LOG_ERROR, "wal_locked", "dir=%s error=\"in use by another server (lock file)\"", log_str(cfg->dir));
        return BG_IO_ERROR;
    }
    if (e) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=open error=%s", log_str(cfg->dir), log_str(strerror(e)));
        errno = e;
        return BG_IO_ERROR;
    }
    w->own_storage = 1;
    w->posix = w->storage;
    const char *faults = getenv(STORAGE_FAULTS_ENV);
    if (faults && *faults) {
        struct storage *wrapped;
        if (storage_faulty_wrap(&wrapped, w->storage, faults) != 0) {
            log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=open error=%s", log_str(cfg->dir), log_str("out of memory"));
            return BG_IO_ERROR;
        }
        w->storage = wrapped;
        log_event(BG_LOG_WARN, "wal_test_disk_faults", "control=%s", log_str(faults));
    }
    return 0;
}

/* The directory's part of wal_open: storage (locked), recover (unless
 * replicating), start a new segment. 0, or an outcome after a message. */
static int open_dir(struct wal *w, const struct wal_config *cfg, bg_time now, uint64_t wall)
{
    int r = open_storage(w, cfg);
    if (r != 0) return r;
    /* replicating, the stream is the log: the directory is not read */
    if (!cfg->repl && (r = binlog_import(w)) != 0) return r;
    struct recovery rc = {.accept_damage = cfg->recover_damaged, .copy_only = cfg->repl != NULL,
                          .now = now, .wall = wall};
    r = recover(w, &rc);
    if (r != 0) return r;
    /* new records go to a new segment: a torn tail is never appended to */
    int e = segment_start(w->storage, w->cur_index + 1, &w->cur_file);
    if (e) {
        w->cur_file = -1;
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=create_segment error=%s", log_str(cfg->dir), log_str(strerror(e)));
        errno = e;
        return BG_IO_ERROR;
    }
    w->cur_index++;
    uint64_t *size = segment_size_at(w, w->cur_index);
    if (size) *size = BG_JOURNAL_HEADER_SIZE;
    w->disk_bytes += BG_JOURNAL_HEADER_SIZE;
    if (w->first_index > w->cur_index) w->first_index = w->cur_index;
    e = w->storage->ops->sync_dir(w->storage);
    if (e) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=sync_dir error=%s", log_str(cfg->dir), log_str(strerror(e)));
        errno = e;
        return BG_IO_ERROR;
    }
    return 0;
}

/* From now on the engine's changes are logged (a server without
 * replication: at once; a standby: once it is primary). */
static void start_writing(struct wal *w)
{
    /* what is in the engine now was read from the log */
    w->last_put_id = w->durable_id = w->id_floor = w->id_floor_kept = bg_engine_last_id(w->engine);
    w->replies_wait = w->cfg.fsync_ms == 0 && (!w->storage || !w->cfg.fsync_never);
    w->engine->journal = &wal_journal_ops;
    w->engine->journal_ctx = w;
    w->writing = 1;
    /* damage was accepted, or the local copy of a replicated log starts
     * now: a snapshot supersedes what the directory holds, so that the
     * next start finds a clean log */
    if (w->force_snapshot) wal_kick(w);
}

/* wal_open's work on a zeroed w: 0, or an outcome after a message (what
 * is open then is closed by open_failed). */
static int open_into(struct wal *w, const struct wal_config *cfg, struct bg_engine *e,
                     struct event_base *base, bg_time now, uint64_t wall)
{
    w->cfg = *cfg;
    w->engine = e;
    w->base = base;
    w->repl = cfg->repl;
    w->batch.file = w->batch.new_file = w->batch.cut[0].file = w->batch.cut[1].file = -1;
    w->cur_file = w->notify_fd = -1;
    int r;
    if ((cfg->dir || cfg->storage) && (r = open_dir(w, cfg, now, wall)) != 0) return r;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    pthread_condattr_t monotonic; /* the dropper's timed pause: dropper_pause */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&w->dropper.cond, &monotonic);
    pthread_condattr_destroy(&monotonic);
    w->locks_made = 1;
    if (!cfg->synchronous) {
        w->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (w->notify_fd < 0 || pthread_create(&w->thread, NULL, flusher_main, w) != 0) {
            log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=start_flusher", log_str(cfg->dir));
            return BG_IO_ERROR;
        }
        w->thread_started = 1;
        if (w->storage && pthread_create(&w->dropper.thread, NULL, dropper_main, w) != 0) {
            log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=start_dropper", log_str(cfg->dir));
            return BG_IO_ERROR;
        }
        w->dropper.started = w->storage != NULL;
        w->notify_ev = event_new(base, w->notify_fd, EV_READ | EV_PERSIST, notify_cb, w);
        event_add(w->notify_ev, NULL);
    }
    if (base) {
        w->sync_timer = evtimer_new(base, timer_kick_cb, w);
        w->retry_timer = evtimer_new(base, timer_kick_cb, w);
        w->gather.timer = evtimer_new(base, timer_kick_cb, w);
    }
    w->last_sync = now;
    /* a standby logs nothing until it becomes primary (wal_start_writing) */
    if (!w->repl) start_writing(w);
    return 0;
}

/* Stop the flusher and the dropper threads, if they run; the dropper
 * deletes what is queued first. */
static void threads_stop(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    w->dropper.stop = 1;
    pthread_cond_signal(&w->cond);
    pthread_cond_signal(&w->dropper.cond);
    pthread_mutex_unlock(&w->lock);
    if (w->thread_started) pthread_join(w->thread, NULL);
    if (w->dropper.started) pthread_join(w->dropper.thread, NULL);
    w->thread_started = w->dropper.started = 0;
}

/* Undo what open_into did before it failed, and free w. */
static void open_failed(struct wal *w)
{
    if (w->locks_made) threads_stop(w);
    if (w->notify_fd >= 0) close(w->notify_fd);
    if (w->storage && w->cur_file >= 0) w->storage->ops->close(w->storage, w->cur_file);
    if (w->own_storage) w->storage->ops->destroy(w->storage);
    if (w->locks_made) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        pthread_cond_destroy(&w->dropper.cond);
    }
    free(w->segment_sizes);
    free(w->damaged_indexes);
    free(w);
}

int wal_open(struct wal **out, const struct wal_config *cfg, struct bg_engine *e,
             struct event_base *base, bg_time now, uint64_t wall)
{
    struct wal *w = calloc(1, sizeof *w);
    if (!w) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=open error=%s", log_str(cfg->dir),
                  log_str("out of memory"));
        return BG_IO_ERROR;
    }
    int r = open_into(w, cfg, e, base, now, wall);
    if (r != 0) {
        int err = errno;
        open_failed(w);
        errno = err;
        return r;
    }
    *out = w;
    return 0;
}

int wal_check(const char *dir)
{
    struct wal w;
    struct bg_engine e;
    memset(&w, 0, sizeof w);
    w.cfg.dir = dir;
    int err = storage_posix_open(&w.storage, dir, 0);
    if (err) {
        log_event(BG_LOG_ERROR, "check_log_failed", "dir=%s error=%s", log_str(dir), log_str(strerror(err)));
        return WAL_CHECK_FAILED;
    }
    if (bg_engine_init(&e, BG_JOB_SIZE_LIMIT, NULL) != 0) {
        log_event(BG_LOG_ERROR, "check_log_failed", "dir=%s error=%s", log_str(dir), log_str("out of memory"));
        w.storage->ops->destroy(w.storage);
        return WAL_CHECK_FAILED;
    }
    w.engine = &e;
    struct recovery rc = {.check = 1, .now = loop_now(), .wall = loop_wall_now()};
    recover(&w, &rc);
    int binlog = binlog_check(w.storage, dir);
    fflush(stdout);
    bg_engine_destroy(&e);
    free(w.segment_sizes);
    free(w.damaged_indexes);
    w.storage->ops->destroy(w.storage);
    if (rc.failed || rc.vanished) return WAL_CHECK_FAILED;
    if (binlog == WAL_CHECK_FAILED) return WAL_CHECK_FAILED;
    return rc.damaged || rc.missing || rc.other_version || binlog ? WAL_CHECK_DAMAGED : 0;
}

void wal_close(struct wal *w)
{
    if (!w) return;
    /* never drop a failed batch, nor what came after a finish, in silence */
    if (!w->finishing || w->finished_seq < w->appended_seq)
        wal_finish(w, loop_now() + WAL_CLOSE_FINISH_SECONDS * BG_SECOND);
    struct storage *st = w->storage;
    threads_stop(w);
    drop_step(w); /* those the dropper's queue had no room for: here, at once */
    w->engine->journal = NULL;
    if (w->notify_ev) event_free(w->notify_ev);
    if (w->sync_timer) event_free(w->sync_timer);
    if (w->retry_timer) event_free(w->retry_timer);
    if (w->gather.timer) event_free(w->gather.timer);
    if (w->notify_fd >= 0) close(w->notify_fd);
    if (st) {
        segments_close_all(w);
        if (w->own_storage) st->ops->destroy(st);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    pthread_cond_destroy(&w->dropper.cond);
    bg_buf_free(&w->pending);
    bg_buf_free(&w->batch.data);
    bg_buf_free(&w->unsynced_data);
    free(w->segment_sizes);
    free(w->damaged_indexes);
    snapshot_stop(w); /* an unfinished snapshot: the older segments stay */
    free(w->resync_ids);
    free(w->resync_seen);
    free(w);
}

/* ---- replication: the standby's side ------------------------------------ */

static void resync_drop(struct wal *w);

void wal_start_writing(struct wal *w, uint64_t stream_bytes)
{
    resync_drop(w);
    bg_engine_restore_finish(w->engine);
    if (w->storage) w->force_snapshot = 1;
    w->stream_bytes = stream_bytes;
    start_writing(w);
}

/* A purge overtook this standby: the messages before seq are gone, and seq
 * begins a snapshot (the primary purges only there). Note the jobs alive
 * now: any that the snapshot does not write again was deleted meanwhile. */
static int resync_begin(struct wal *w, uint64_t seq)
{
    struct bg_engine *e = w->engine;
    log_event(BG_LOG_WARN, "replication_resync", "applied_seq=%llu next_seq=%llu jobs=%zu",
              (unsigned long long)w->applied_seq, (unsigned long long)seq, e->job_count);
    resync_drop(w);
    w->resync_ids = malloc((e->job_count ? e->job_count : 1) * sizeof *w->resync_ids);
    w->resync_seen = calloc(e->job_count ? e->job_count : 1, 1);
    if (!w->resync_ids || !w->resync_seen) return BG_OUT_OF_MEMORY;
    w->resync_count = bg_engine_job_ids(e, w->resync_ids);
    qsort(w->resync_ids, w->resync_count, sizeof *w->resync_ids, index_less);
    return 0;
}

/* The snapshot is complete: forget the jobs it did not write. */
static void resync_finish(struct wal *w)
{
    size_t gone = 0;
    for (size_t i = 0; i < w->resync_count; i++) {
        if (w->resync_seen[i]) continue;
        struct bg_job *j = bg_job_find(w->engine, w->resync_ids[i]);
        if (!j) continue;
        w->live_bytes -= job_record_size(j);
        bg_engine_restore_delete(w->engine, w->resync_ids[i]);
        gone++;
    }
    log_event(BG_LOG_WARN, "replication_resynced", "seq=%llu jobs_dropped=%zu jobs=%zu",
              (unsigned long long)w->applied_seq, gone, w->engine->job_count);
    resync_drop(w);
}

static void resync_drop(struct wal *w)
{
    free(w->resync_ids);
    free(w->resync_seen);
    w->resync_ids = NULL;
    w->resync_seen = NULL;
    w->resync_count = 0;
}

int wal_apply(struct wal *w, uint64_t seq, const char *data, size_t len)
{
    if (w->applied_seq && seq != w->applied_seq + 1 && resync_begin(w, seq) != 0) {
        log_event(BG_LOG_ERROR, "replication_apply_failed", "seq=%llu error=%s", (unsigned long long)seq,
                  log_str("out of memory"));
        return BG_OUT_OF_MEMORY;
    }
    /* the same reader and the same apply_record as a start from disk */
    struct recovery rc = {.now = loop_now(), .wall = loop_wall_now()};
    struct seg_report s = {.index = seq};
    size_t at = 0, used;
    struct bg_journal_record rec;
    w->applied_seq = seq;
    while (at < len) {
        int r = bg_journal_decode(data + at, len - at, &rec, &used);
        if (r != 0) {
            log_event(BG_LOG_ERROR, "replication_apply_failed", "seq=%llu offset=%zu error=%s",
                      (unsigned long long)seq, at, bg_outcome_word(r));
            return BG_CORRUPT;
        }
        if (apply_record(w, &rc, &s, &rec) != 0) return BG_OUT_OF_MEMORY;
        if (w->resync_ids && rec.type == BG_REC_JOB) {
            uint64_t *hit = bsearch(&rec.job.id, w->resync_ids, w->resync_count, sizeof rec.job.id, index_less);
            if (hit) w->resync_seen[hit - w->resync_ids] = 1;
        }
        if (w->resync_ids && rec.type == BG_REC_SNAPSHOT_END) resync_finish(w);
        at += used;
    }
    w->stream_bytes += len;
    return 0;
}

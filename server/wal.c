/* wal.c - the write-ahead log on disk.
 *
 * The loop thread appends records to `pending` (engine hooks below) and,
 * after each callback, hands them as one batch to the flusher thread, which
 * writes them and (per -f) syncs: every put of a loop turn shares one
 * fsync. An eventfd brings the result back to the loop. With -f 0, replies
 * that depend on a record are held until its batch is synced (server/net.c).
 *
 * Segments are DIR/beangate.<index>.wal. When the segments hold more than
 * twice the live data (plus one segment), a snapshot of every live job is
 * written into a new segment, WAL_SNAPSHOT_CHUNK jobs per batch so that the
 * loop never stops for long, between the records of what happens
 * meanwhile; the older segments are deleted once its end record is on
 * disk. Replayed in order, the segment gives the state: a record about a
 * job the snapshot has not reached yet is either an update or delete of an
 * unknown job (ignored) or a new job's own record, and the snapshot then
 * writes each remaining job as it is at that point. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wal.h"
#include "log.h"

#define RETRY_SECONDS 1
#define WAL_SNAPSHOT_CHUNK 4096  /* jobs a snapshot writes per batch (a few ms) */

static bg_time mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (bg_time)ts.tv_sec * BG_SECOND + (bg_time)ts.tv_nsec;
}

static uint64_t wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * BG_SECOND + (uint64_t)ts.tv_nsec;
}

/* Bytes a job's full record takes on disk (for live-data accounting). */
static uint64_t job_record_size(const struct bg_job *j)
{
    return 9 + 60 + 1 + strlen(j->tube->name) + 4 + j->body_size;
}

/* ---- segments ---------------------------------------------------------- */

static void segment_name(char *out, size_t n, uint64_t index)
{
    snprintf(out, n, "beangate.%llu.wal", (unsigned long long)index);
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

/* Create segment `index` with its header. Returns the fd or -1. */
static int segment_create(struct wal *w, uint64_t index)
{
    char name[64];
    segment_name(name, sizeof name, index);
    int fd = openat(w->dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    char header[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(header);
    if (write(fd, header, sizeof header) != (ssize_t)sizeof header) {
        int e = errno ? errno : ENOSPC;
        close(fd);
        unlinkat(w->dir_fd, name, 0);
        errno = e;
        return -1;
    }
    uint64_t *size = segment_size_at(w, index);
    if (size) *size = BG_JOURNAL_HEADER_SIZE;
    w->total_bytes += BG_JOURNAL_HEADER_SIZE;
    return fd;
}

/* Delete the segments below `index` (their data is in later ones). */
static void segments_drop_below(struct wal *w, uint64_t index)
{
    char name[64];
    while (w->first_index < index) {
        segment_name(name, sizeof name, w->first_index);
        unlinkat(w->dir_fd, name, 0);
        w->total_bytes -= w->segment_sizes[0];
        memmove(w->segment_sizes, w->segment_sizes + 1, (w->segment_cap - 1) * sizeof *w->segment_sizes);
        w->segment_sizes[w->segment_cap - 1] = 0;
        w->first_index++;
    }
}

/* ---- engine hooks: append records -------------------------------------- */

static void note_failure(struct wal *w, int err, const char *what)
{
    if (!w->failed_errno)
        log_event(BG_LOG_ERROR, "wal_failure", "op=%s error=%s puts=refused", what, log_str(strerror(err)));
    w->failed_errno = err;
    w->engine->journal_broken = 1;
    if (w->retry_timer) {
        struct timeval tv = {RETRY_SECONDS, 0};
        evtimer_add(w->retry_timer, &tv);
    }
}

/* A record could not even be buffered: the log is behind; say so loudly. */
static void append_failed(struct wal *w)
{
    note_failure(w, ENOMEM, "buffer");
}

static void hook_job_saved(void *ctx, const struct bg_job *j, int with_body)
{
    struct wal *w = ctx;
    struct bg_journal_job r;
    bg_journal_job_of(j, &r);
    if (r.state == BG_JOB_DELAYED) {
        bg_time now = mono_now();
        r.deadline_wall = wall_now() + (j->deadline_at > now ? j->deadline_at - now : 0);
    }
    r.created_wall = wall_now() - (mono_now() - j->created_at);
    if (bg_journal_encode_job(&w->pending, &r, with_body) != 0) return append_failed(w);
    w->appended_seq++;
    w->pending_records++;
    if (with_body) w->live_bytes += job_record_size(j);
}

static void hook_job_deleted(void *ctx, uint64_t id)
{
    struct wal *w = ctx;
    struct bg_job *j = bg_job_find(w->engine, id);
    if (bg_journal_encode_delete(&w->pending, id) != 0) return append_failed(w);
    w->appended_seq++;
    w->pending_records++;
    if (j) w->live_bytes -= job_record_size(j);
}

static void hook_tube_paused(void *ctx, const struct bg_tube *t)
{
    struct wal *w = ctx;
    bg_time now = mono_now();
    uint64_t unpause = wall_now() + (t->unpause_at > now ? t->unpause_at - now : 0);
    if (bg_journal_encode_pause(&w->pending, t->name, (uint32_t)(t->pause_ns / BG_SECOND), unpause) != 0)
        return append_failed(w);
    w->appended_seq++;
    w->pending_records++;
}

const struct bg_journal_ops wal_journal_ops = {hook_job_saved, hook_job_deleted, hook_tube_paused};

/* ---- the flusher thread ------------------------------------------------ */

/* Write all of b->data at the end of b->fd; then sync as asked. On failure
 * the partial write is cut off again, so a retry starts clean. */
static int flush_batch(struct wal_batch *b, int dir_fd)
{
    const char *p = bg_buf_head(&b->data);
    size_t left = b->data.len;
    while (left) {
        ssize_t n = pwrite(b->fd, p, left, (off_t)(b->offset + (b->data.len - left)));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : ENOSPC;
            if (ftruncate(b->fd, (off_t)b->offset) != 0) { /* best effort */ }
            return e;
        }
        p += n;
        left -= (size_t)n;
    }
    if (b->sync && fdatasync(b->fd) != 0) return errno;
    if (b->close_fd >= 0) {
        if (b->sync) fdatasync(b->close_fd);
        close(b->close_fd);
        b->close_fd = -1;
    }
    if (b->sync_dir && b->sync) fsync(dir_fd);
    b->sync_dir = 0;
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
        w->batch.error = flush_batch(&w->batch, w->dir_fd);
        uint64_t one = 1;
        if (write(w->notify_fd, &one, sizeof one) != sizeof one) { /* the loop polls anyway */ }
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static void submit(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    w->busy = 1;
    w->has_work = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static int rotate(struct wal *w);

/* Count one record appended to pending. */
static void pending_added(struct wal *w)
{
    w->appended_seq++;
    w->pending_records++;
}

/* Append the next WAL_SNAPSHOT_CHUNK jobs of the snapshot to pending; after
 * the last, the highest id, the paused tubes and the end record. 0 or
 * BG_OUT_OF_MEMORY (the snapshot then stops; older segments stay). */
static int snapshot_step(struct wal *w)
{
    struct bg_engine *e = w->engine;
    uint64_t wall = wall_now();
    bg_time now = mono_now();
    size_t stop = w->snap_next + WAL_SNAPSHOT_CHUNK;
    if (stop > w->snap_count) stop = w->snap_count;
    for (; w->snap_next < stop; w->snap_next++) {
        struct bg_job *j = bg_job_find(e, w->snap_ids[w->snap_next]);
        if (!j) continue; /* deleted meanwhile: its delete record is in pending */
        struct bg_journal_job r;
        bg_journal_job_of(j, &r);
        if (r.state == BG_JOB_DELAYED) r.deadline_wall = wall + (j->deadline_at > now ? j->deadline_at - now : 0);
        r.created_wall = wall - (now - j->created_at);
        if (bg_journal_encode_job(&w->pending, &r, 1) != 0) return BG_OUT_OF_MEMORY;
        pending_added(w);
        w->records_migrated++;
    }
    if (w->snap_next < w->snap_count) return 0;
    /* ids are never reused: a delete record of the highest id given out
     * keeps the counter above it even when that job is gone */
    if (e->next_id > 1 && !bg_job_find(e, e->next_id - 1)) {
        if (bg_journal_encode_delete(&w->pending, e->next_id - 1) != 0) return BG_OUT_OF_MEMORY;
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
    free(w->snap_ids);
    w->snap_ids = NULL;
    w->compact_seq = w->appended_seq;
    return 0;
}

/* Begin a snapshot: note the ids of the live jobs, start a new segment.
 * 0, or -1 after noting the failure. */
static int snapshot_begin(struct wal *w)
{
    struct bg_engine *e = w->engine;
    uint64_t *ids = malloc((e->job_count ? e->job_count : 1) * sizeof *ids);
    if (!ids) {
        note_failure(w, ENOMEM, "snapshot");
        return -1;
    }
    size_t n = 0;
    for (size_t b = 0; b <= e->jobs_mask; b++)
        for (struct bg_job *j = e->jobs[b]; j; j = j->hash_next) ids[n++] = j->id;
    if (rotate(w) != 0) {
        free(ids);
        note_failure(w, errno, "create_segment");
        return -1;
    }
    w->snap_ids = ids;
    w->snap_count = n;
    w->snap_next = 0;
    w->compact_index = w->cur_index;
    return 0;
}

/* Nonzero while the snapshot's records are not all handed to the flusher:
 * the segment must not change under it. */
static int snapshot_in_progress(const struct wal *w)
{
    return w->snap_ids || (w->compact_seq && w->appended_seq - w->pending_records < w->compact_seq);
}

/* Start a new segment for the next batch; the old fd is closed by the
 * flusher after its last sync. 0 or -1. */
static int rotate(struct wal *w)
{
    int fd = segment_create(w, w->cur_index + 1);
    if (fd < 0) return -1;
    w->batch.close_fd = w->cur_fd;
    w->batch.sync_dir = 1;
    w->cur_fd = fd;
    w->cur_index++;
    return 0;
}

void wal_kick(struct wal *w)
{
    if (!w || w->busy) return;
    bg_time now = mono_now();
    int sync_due = w->cfg.fsync_never ? 0
                 : w->cfg.fsync_ms == 0 ? 1
                 : now - w->last_sync >= (bg_time)w->cfg.fsync_ms * 1000000ull;
    struct wal_batch *b = &w->batch;
    int retry = b->error != 0;
    if (!retry && w->pending.len == 0 && !w->snap_ids && !(w->unsynced && sync_due)) {
        if (w->unsynced && !w->cfg.fsync_never) {
            /* the tail of a burst is synced when its time comes */
            bg_time due = w->last_sync + (bg_time)w->cfg.fsync_ms * 1000000ull;
            bg_time wait = due > now ? due - now : 0;
            struct timeval tv = {(time_t)(wait / BG_SECOND), (suseconds_t)(wait % BG_SECOND / 1000) + 1};
            evtimer_add(w->sync_timer, &tv);
        }
        return;
    }
    if (!retry) {
        bg_buf_clear(&b->data);
        b->close_fd = -1;
        int compact = w->total_bytes > 2 * w->live_bytes + w->cfg.segment_size &&
                      !w->compact_seq && !w->snap_ids;
        if (compact && snapshot_begin(w) != 0) return;
        if (w->snap_ids && snapshot_step(w) != 0) {
            free(w->snap_ids); /* a later compaction starts over */
            w->snap_ids = NULL;
            note_failure(w, ENOMEM, "snapshot");
            return;
        }
        {
            uint64_t *size = segment_size_at(w, w->cur_index);
            if (size && *size + w->pending.len > w->cfg.segment_size && *size > BG_JOURNAL_HEADER_SIZE &&
                !snapshot_in_progress(w) && rotate(w) != 0) {
                note_failure(w, errno, "create_segment");
                return;
            }
            /* at most about one segment per batch, cut at a record end */
            size_t take = 0;
            uint64_t records = 0;
            const unsigned char *p = (const unsigned char *)bg_buf_head(&w->pending);
            while (take < w->pending.len && (take == 0 || take < w->cfg.segment_size)) {
                uint32_t payload = (uint32_t)p[take] | (uint32_t)p[take + 1] << 8 |
                                   (uint32_t)p[take + 2] << 16 | (uint32_t)p[take + 3] << 24;
                take += 9 + (size_t)payload;
                records++;
            }
            if (bg_buf_append(&b->data, bg_buf_head(&w->pending), take) != 0) {
                note_failure(w, ENOMEM, "batch");
                return;
            }
            bg_buf_consume(&w->pending, take);
            w->pending_records -= records;
        }
        b->fd = w->cur_fd;
        b->offset = *segment_size_at(w, w->cur_index);
        b->end_seq = w->appended_seq - w->pending_records;
        /* the batch that completes a snapshot is synced at once: the older
         * segments can go as soon as it is on disk */
        if (w->compact_seq && b->end_seq >= w->compact_seq) sync_due = !w->cfg.fsync_never;
        b->sync_dir |= w->dir_dirty;
        w->dir_dirty = 0;
    }
    /* retrying: the same batch again; what was appended since waits */
    b->sync = sync_due;
    b->error = 0;
    submit(w);
}

/* Account for a batch the flusher finished (on the loop thread, or in
 * wal_close). Returns 0 if it was written, or the flusher's errno. */
static int batch_done(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    w->busy = 0;
    pthread_mutex_unlock(&w->lock);
    struct wal_batch *b = &w->batch;
    if (b->error) {
        note_failure(w, b->error, b->sync ? "write_or_sync" : "write");
        return b->error;
    }
    if (w->failed_errno) {
        log_event(BG_LOG_WARN, "wal_recovered", "puts=accepted"); /* pairs with wal_failure: always shown */
        w->failed_errno = 0;
        w->engine->journal_broken = 0;
    }
    uint64_t *size = segment_size_at(w, w->cur_index);
    if (size && b->fd == w->cur_fd) *size += b->data.len;
    w->total_bytes += b->data.len;
    w->written_seq = b->end_seq;
    if (b->sync) {
        w->synced_seq = b->end_seq;
        w->last_sync = mono_now();
        w->unsynced = 0;
    } else {
        w->unsynced = 1;
    }
    bg_buf_clear(&b->data);
    /* a snapshot on disk makes the older segments useless */
    if (w->compact_seq && w->written_seq >= w->compact_seq && (b->sync || w->cfg.fsync_never)) {
        segments_drop_below(w, w->compact_index);
        w->compact_seq = 0;
        w->dir_dirty = 1; /* the next batch syncs the directory */
    }
    return 0;
}

/* The loop side of a finished batch. */
static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct wal *w = arg;
    uint64_t n;
    if (read(fd, &n, sizeof n) != sizeof n) return;
    if (batch_done(w) != 0) return; /* the retry timer is armed */
    if (w->on_synced) w->on_synced(w->on_synced_arg);
    wal_kick(w);
}

static void timer_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    wal_kick(arg);
}

int wal_durable(const struct wal *w)
{
    return w && w->cfg.fsync_ms == 0 && !w->cfg.fsync_never && !w->failed_errno;
}

int wal_chown(struct wal *w, unsigned uid, unsigned gid)
{
    if (fchown(w->dir_fd, uid, gid) != 0 || fchown(w->lock_fd, uid, gid) != 0) goto fail;
    for (uint64_t i = w->first_index; i <= w->cur_index; i++) {
        char name[64];
        segment_name(name, sizeof name, i);
        if (fchownat(w->dir_fd, name, uid, gid, 0) != 0 && errno != ENOENT) goto fail;
    }
    return 0;
fail:
    log_event(BG_LOG_ERROR, "wal_chown", "dir=%s error=%s", log_str(w->cfg.dir), log_str(strerror(errno)));
    return -1;
}

void wal_stats(const struct wal *w, struct bg_process_info *pi)
{
    if (!w) return;
    pi->binlog_oldest = w->first_index;
    pi->binlog_current = w->cur_index;
    pi->binlog_migrated = w->records_migrated;
    pi->binlog_written = w->written_seq;
    pi->binlog_max_size = w->cfg.segment_size;
    pi->binlog_torn = w->torn_records;
}

/* ---- recovery ---------------------------------------------------------- */

/* Map a whole file read-only (no copy through a buffer); NULL on error.
 * An empty file maps to a static empty buffer. */
static char *map_all(int dir_fd, const char *name, size_t *len)
{
    static char empty[1];
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    char *data = NULL;
    if (fstat(fd, &st) == 0) {
        *len = (size_t)st.st_size;
        if (*len == 0) data = empty;
        else {
            data = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
            if (data == MAP_FAILED) data = NULL;
            else madvise(data, *len, MADV_SEQUENTIAL);
        }
    }
    close(fd);
    return data;
}

static void unmap_all(char *data, size_t len)
{
    if (len) munmap(data, len);
}

/* Apply one segment's records to the engine. Returns records applied. */
static uint64_t replay_segment(struct wal *w, const char *name, const char *data, size_t len,
                               bg_time now, uint64_t wall)
{
    struct bg_engine *e = w->engine;
    if (bg_journal_check_header(data, len) != 0) {
        if (len >= BG_JOURNAL_HEADER_SIZE) {
            /* a whole header we cannot read: another format version (a
             * downgrade?) or not our file. Starting without its jobs would
             * lose them silently, so refuse. */
            log_event(BG_LOG_ERROR, "wal_unknown_segment", "file=%s action=refuse_start hint=%s", log_str(name),
                      log_str("written by another beangate version, or not a beangate log"));
            w->unreadable = 1;
            return 0;
        }
        /* a header torn while the segment was being created */
        log_event(BG_LOG_WARN, "wal_torn_tail", "file=%s offset=0 dropped_bytes=%zu", log_str(name), len);
        w->torn_records++;
        return 0;
    }
    size_t at = BG_JOURNAL_HEADER_SIZE, used;
    uint64_t applied = 0;
    struct bg_journal_record rec;
    while (at < len) {
        int r = bg_journal_decode(data + at, len - at, &rec, &used);
        if (r != 0) {
            log_event(BG_LOG_WARN, r == BG_JOURNAL_TORN ? "wal_torn_tail" : "wal_corrupt_record",
                      "file=%s offset=%zu dropped_bytes=%zu", log_str(name), at, len - at);
            w->torn_records++;
            break;
        }
        at += used;
        applied++;
        bg_time deadline = rec.job.deadline_wall > wall ? now + (rec.job.deadline_wall - wall) : now;
        bg_time created = rec.job.created_wall && rec.job.created_wall < wall
                              ? (now > wall - rec.job.created_wall ? now - (wall - rec.job.created_wall) : 0)
                              : now;
        switch (rec.type) {
        case BG_REC_JOB: {
            struct bg_job *old = bg_job_find(e, rec.job.id);
            if (old) w->live_bytes -= job_record_size(old);
            if (bg_engine_restore_job(e, &rec.job, deadline, created, now) != 0) return applied;
            w->live_bytes += 9 + 60 + 1 + strlen(rec.tube) + 4 + rec.job.body_len;
            break;
        }
        case BG_REC_UPDATE:
            bg_engine_restore_update(e, &rec.job, deadline, now);
            break;
        case BG_REC_DELETE: {
            struct bg_job *j = bg_job_find(e, rec.job.id);
            if (j) w->live_bytes -= job_record_size(j);
            bg_engine_restore_delete(e, rec.job.id);
            break;
        }
        case BG_REC_PAUSE: {
            bg_time unpause = rec.unpause_wall > wall ? now + (rec.unpause_wall - wall) : now;
            bg_engine_restore_pause(e, rec.tube, rec.pause_s, unpause, now);
            break;
        }
        }
    }
    return applied;
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

static int index_less(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Replay every segment in index order. 0 or -1. */
static int recover(struct wal *w, bg_time now, uint64_t wall)
{
    DIR *d = fdopendir(dup(w->dir_fd));
    if (!d) return -1;
    uint64_t *indexes = NULL;
    size_t n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        unsigned long long index;
        char tail[8];
        if (sscanf(ent->d_name, "beangate.%llu.%7s", &index, tail) != 2 || strcmp(tail, "wal") != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *a = realloc(indexes, cap * sizeof *a);
            if (!a) break;
            indexes = a;
        }
        indexes[n++] = index;
    }
    closedir(d);
    if (n) qsort(indexes, n, sizeof *indexes, index_less);
    uint64_t records = 0;
    w->first_index = n ? indexes[0] : 1;
    /* start at the newest segment holding a complete snapshot, if any */
    size_t start = 0;
    for (size_t i = n; i-- > 0 && start == 0;) {
        char name[64];
        segment_name(name, sizeof name, indexes[i]);
        size_t len = 0;
        char *data = map_all(w->dir_fd, name, &len);
        if (data && segment_has_snapshot_end(data, len)) start = i;
        if (data) unmap_all(data, len);
    }
    if (start)
        log_event(BG_LOG_INFO, "wal_snapshot", "file=beangate.%llu.wal skipped_segments=%zu",
                  (unsigned long long)indexes[start], start);
    for (size_t i = 0; i < start; i++) { /* superseded by the snapshot */
        char name[64];
        segment_name(name, sizeof name, indexes[i]);
        unlinkat(w->dir_fd, name, 0);
    }
    if (start) {
        fsync(w->dir_fd);
        w->first_index = indexes[start];
    }
    for (size_t i = start; i < n; i++) {
        char name[64];
        segment_name(name, sizeof name, indexes[i]);
        size_t len = 0;
        char *data = map_all(w->dir_fd, name, &len);
        if (!data) {
            log_event(BG_LOG_ERROR, "wal_unreadable", "file=%s error=%s", log_str(name), log_str(strerror(errno)));
            free(indexes);
            return -1;
        }
        records += replay_segment(w, name, data, len, now, wall);
        unmap_all(data, len);
        if (w->unreadable) {
            free(indexes);
            return -1;
        }
        uint64_t *size = segment_size_at(w, indexes[i]);
        if (size) *size = len;
        w->total_bytes += len;
    }
    w->cur_index = n ? indexes[n - 1] : 0;
    free(indexes);
    bg_engine_restore_finish(w->engine);
    log_event(BG_LOG_INFO, "wal_recovered_jobs", "jobs=%zu records=%llu segments=%zu torn=%llu",
              w->engine->job_count, (unsigned long long)records, n, (unsigned long long)w->torn_records);
    return 0;
}

int wal_open(struct wal *w, const struct wal_config *cfg, struct bg_engine *e,
             struct event_base *base, bg_time now, uint64_t wall)
{
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    w->engine = e;
    w->base = base;
    w->batch.close_fd = -1;
    w->cur_fd = w->lock_fd = w->notify_fd = -1;
    if (mkdir(cfg->dir, 0700) != 0 && errno != EEXIST) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=mkdir error=%s", log_str(cfg->dir), log_str(strerror(errno)));
        return -1;
    }
    w->dir_fd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->dir_fd < 0) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=open error=%s", log_str(cfg->dir), log_str(strerror(errno)));
        return -1;
    }
    w->lock_fd = openat(w->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (w->lock_fd < 0 || flock(w->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        log_event(BG_LOG_ERROR, "wal_locked", "dir=%s error=\"in use by another server (lock file)\"", log_str(cfg->dir));
        return -1;
    }
    if (recover(w, now, wall) != 0) return -1;
    /* new records go to a new segment: a torn tail is never appended to */
    w->cur_fd = segment_create(w, w->cur_index + 1);
    if (w->cur_fd < 0) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=create_segment error=%s", log_str(cfg->dir), log_str(strerror(errno)));
        return -1;
    }
    w->cur_index++;
    if (w->first_index > w->cur_index) w->first_index = w->cur_index;
    fsync(w->dir_fd);
    w->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (w->notify_fd < 0 || pthread_create(&w->thread, NULL, flusher_main, w) != 0) {
        log_event(BG_LOG_ERROR, "wal_open_failed", "dir=%s op=start_flusher", log_str(cfg->dir));
        return -1;
    }
    w->notify_ev = event_new(base, w->notify_fd, EV_READ | EV_PERSIST, notify_cb, w);
    w->sync_timer = evtimer_new(base, timer_kick_cb, w);
    w->retry_timer = evtimer_new(base, timer_kick_cb, w);
    event_add(w->notify_ev, NULL);
    w->last_sync = now;
    e->journal = &wal_journal_ops;
    e->journal_ctx = w;
    return 0;
}

void wal_close(struct wal *w)
{
    if (!w || w->dir_fd <= 0) return;
    /* finish: wait for the flusher, then write what is left, synced */
    for (int round = 0; round < 2; round++) {
        pthread_mutex_lock(&w->lock);
        int busy = w->busy;
        pthread_mutex_unlock(&w->lock);
        if (busy) {
            uint64_t n;
            struct timespec ts = {0, 1000000};
            while (read(w->notify_fd, &n, sizeof n) != sizeof n) nanosleep(&ts, NULL);
            if (batch_done(w) != 0) break; /* the disk refuses: nothing more can go */
        }
        if (round == 0 && w->pending.len) {
            bg_buf_clear(&w->batch.data);
            struct bg_buf swap = w->batch.data;
            w->batch.data = w->pending;
            w->pending = swap;
            w->pending_records = 0;
            w->batch.fd = w->cur_fd;
            w->batch.offset = *segment_size_at(w, w->cur_index);
            w->batch.end_seq = w->appended_seq;
            w->batch.sync = !w->cfg.fsync_never;
            submit(w);
        }
    }
    if (!w->cfg.fsync_never) fdatasync(w->cur_fd);
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    w->engine->journal = NULL;
    event_free(w->notify_ev);
    event_free(w->sync_timer);
    event_free(w->retry_timer);
    close(w->notify_fd);
    close(w->cur_fd);
    if (w->batch.close_fd >= 0) close(w->batch.close_fd);
    close(w->lock_fd);
    close(w->dir_fd);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    bg_buf_free(&w->pending);
    bg_buf_free(&w->batch.data);
    free(w->segment_sizes);
    free(w->snap_ids); /* an unfinished snapshot: the older segments stay */
}

/* wal.h - the write-ahead log: segment files in one directory, a single
 * flusher thread that writes and syncs batches (group commit), recovery at
 * start, and compaction. The record format is core/journal.c. */
#ifndef BEANGATE_WAL_H
#define BEANGATE_WAL_H

#include <event2/event.h>
#include <pthread.h>

#include "../core/core.h"

struct wal_config {
    const char *dir;
    int fsync_ms;              /* 0: sync every batch (durable replies); >0 at most that often */
    int fsync_never;           /* -F */
    uint64_t segment_size;     /* -s */
    int recover_damaged;       /* --log-recover-damaged: start with what is readable */
};

struct wal_batch {
    struct bg_buf data;
    int fd;                    /* where data goes */
    uint64_t offset;           /* file size before data */
    uint64_t end_seq;          /* last record seq in data */
    int sync;
    int close_fd;              /* an older segment to close, or -1 */
    int sync_close;            /* sync close_fd before writing data (not with -F) */
    int sync_dir;              /* a segment was created: sync the directory */
    int error;                 /* errno of the flusher, 0 if written */
};

struct wal {
    struct wal_config cfg;
    struct bg_engine *engine;
    struct event_base *base;
    int dir_fd, lock_fd;
    /* segments: index -> size, for [first_index, cur_index] */
    uint64_t first_index, cur_index;
    uint64_t *segment_sizes;
    size_t segment_cap;
    int cur_fd;
    uint64_t total_bytes, live_bytes;
    /* records */
    struct bg_buf pending;
    uint64_t pending_records;  /* records in pending (the last ones appended) */
    uint64_t appended_seq, synced_seq, written_seq; /* written_seq: binlog-records-written */
    int dir_dirty;             /* segments were deleted: sync the directory */
    uint64_t records_migrated;
    uint64_t torn_records;     /* dropped at recovery */
    int force_snapshot;        /* damage was accepted at start: write a snapshot */
    uint64_t *damaged_indexes; /* segments found damaged: kept when superseded */
    size_t damaged_count;
    int failed_errno;          /* last write/sync failure, 0 when healthy */
    /* compaction: a snapshot is written a chunk per batch (snap_ids: the
     * jobs alive when it began; snap_next: the next one to write) */
    uint64_t compact_index;    /* segments below it go once compact_seq is safe */
    uint64_t compact_seq;      /* the snapshot's end record, once appended */
    uint64_t *snap_ids;        /* non-NULL while a snapshot is being written */
    size_t snap_count, snap_next;
    /* flusher thread */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct wal_batch batch;
    int busy, stop, has_work;
    int notify_fd;             /* eventfd: the flusher finished a batch */
    struct event *notify_ev, *sync_timer, *retry_timer;
    bg_time last_sync;
    int unsynced;              /* bytes written but not synced */
    /* called on the loop when synced_seq moved */
    void (*on_synced)(void *arg);
    void *on_synced_arg;
};

/* Open DIR (lock, recover every segment into the engine, start the
 * flusher). 0, or -1 with a message printed: also when the log is damaged
 * (docs/durability.md, "Log damage policy") unless cfg->recover_damaged.
 * now/wall: the clocks. */
int wal_open(struct wal *w, const struct wal_config *cfg, struct bg_engine *e,
             struct event_base *base, bg_time now, uint64_t wall_now);
/* beangate --check-log DIR: read every segment as a start would, without
 * changing anything or taking the lock; print a line per segment and a
 * summary on stdout. 0 clean (or only a torn tail), WAL_CHECK_DAMAGED if a
 * start would refuse, WAL_CHECK_FAILED if the check could not be done. */
#define WAL_CHECK_DAMAGED 1
#define WAL_CHECK_FAILED 2
int wal_check(const char *dir);
/* Hand what was appended to the flusher if it is idle; call after each
 * loop callback. */
void wal_kick(struct wal *w);
/* Nonzero if replies must wait for the log (-f 0 and the log is healthy). */
int wal_durable(const struct wal *w);
/* Write what is pending, sync, stop the flusher, close files. */
void wal_close(struct wal *w);
/* Give the directory and its files to uid:gid (before dropping
 * privileges with -u). 0 or -1 with a message. */
int wal_chown(struct wal *w, unsigned uid, unsigned gid);
/* binlog-* figures for stats. */
void wal_stats(const struct wal *w, struct bg_process_info *pi);

/* The engine's hooks (engine->journal = &wal_journal_ops). */
extern const struct bg_journal_ops wal_journal_ops;

#endif

/* wal.h - the write-ahead log: segment files in one directory (through
 * io/storage.h), a single flusher thread that writes and syncs batches
 * (group commit; or none, in the synchronous mode), recovery at start,
 * compaction, and the stop's finish. The record format is core/journal.c;
 * the fault model is docs/durability.md. */
#ifndef BEANGATE_WAL_H
#define BEANGATE_WAL_H

#include <event2/event.h>

#include "../core/core.h"

struct repl;

struct wal_config {
    const char *dir;           /* NULL: no disk (only with repl) */
    int fsync_ms;              /* 0: sync every batch (durable replies); >0 at most that often */
    int fsync_never;           /* -F */
    uint64_t segment_size;     /* -s */
    int recover_damaged;       /* --log-recover-damaged: start with what is readable */
    /* --replicate (io/repl.h): the stream is a sink of every batch, and the
     * log: with it the directory is not read at start (the stream is), and
     * nothing is logged until wal_start_writing (a standby only applies) */
    struct repl *repl;
    /* the directory's files (io/storage.h); NULL: the real files of dir
     * (locked), opened and closed by the log. Given, it stays the caller's;
     * dir then only names the log in messages. */
    struct storage *storage;
    /* no flusher thread and no eventfd (the simulator, tests/sim): a batch
     * handed on by wal_kick waits until the caller runs wal_run_flusher */
    int synchronous;
};

/* The log (defined in wal.c only). */
struct wal;

/* When a reply may go: the one rule every front-end asks.
 *
 * A change carries the log position it depends on: the engine's hooks
 * note it in engine->reply_pos (core.h) as they append its records, and a
 * reply that shows a job (RESERVED, FOUND, a job's JSON, a push delivery)
 * depends on the job's put while that is not synced. A front-end zeroes
 * reply_pos before a request, reads it after, and asks wal_reply_may_go
 * before anything goes out; a reply that may not go yet is held
 * (wal_hold) and sent when `durable` runs, or, at a stop, never sent (its
 * connection closes). With -f 0 every change's reply waits for its sync,
 * also while the log is failing (it stays held until a retry gets the
 * record on disk); with -f N > 0 and -F only an id beyond the logged id
 * floor waits (ids never come back after a crash). An Idempotency-Key
 * replay carries its original's position.
 *
 * A held reply: embed it in whatever holds replies; wal_hold queues it,
 * and `durable` runs on the loop once position `mark` is kept. */
struct wal_hold {
    uint64_t mark;
    void (*durable)(struct wal_hold *h);
    struct wal_hold *prev, *next;   /* the log's holds, by mark */
    uint8_t queued;
};

/* Open DIR (lock, recover every segment into the engine, start the
 * flusher) and set *out. 0, or after a message: BG_CORRUPT when the log is
 * damaged (docs/durability.md, "Log damage policy") unless
 * cfg->recover_damaged, BG_IO_ERROR (errno set) or BG_OUT_OF_MEMORY when it
 * cannot be opened or read. now/wall: the clocks. */
int wal_open(struct wal **out, const struct wal_config *cfg, struct bg_engine *e,
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
/* Synchronous mode (cfg.synchronous) only: do the flusher's work on the
 * batch wal_kick handed on, on the calling thread, then complete it as the
 * threaded log does when the flusher reports (account for it, release the
 * holds it secured, wal_kick again). No batch handed on, or not
 * synchronous: nothing. */
void wal_run_flusher(struct wal *w);
/* Nonzero if a reply depending on log position pos may go now: the log
 * keeps everything up to pos (NULL w, or pos 0: yes). */
int wal_reply_may_go(const struct wal *w, uint64_t pos);
/* How far the log is behind, in record positions (the scale of the marks
 * above): `appended` is the newest record appended, `written` the newest
 * one every sink has taken (written; with -f 0 also synced); a record
 * appended now goes out after appended - written others. It never goes
 * backwards. NULL w: both 0. */
struct wal_progress { uint64_t appended, written; };
struct wal_progress wal_progress(const struct wal *w);
/* Call durable(h) on the loop once mark is on disk: at once if it is. Marks
 * grow, so the holds form a queue; h must not be queued already. */
void wal_hold(struct wal *w, struct wal_hold *h, uint64_t mark, void (*durable)(struct wal_hold *h));
/* Take h off the queue (its reply went away first); no-op if not queued. */
void wal_unhold(struct wal *w, struct wal_hold *h);
/* The stop sequence's part of the log: write and sync everything appended
 * (a failed batch is tried again once a second until `deadline`, a
 * monotonic loop_now() time), release the holds whose mark is reached,
 * and hand nothing new on afterwards (no compaction). 0 when everything
 * appended is kept (synced; written, with -F); else, after an error line
 * `wal_lost` with the count of records not secured, BG_IO_ERROR. NULL: 0. */
int wal_finish(struct wal *w, bg_time deadline);
/* Finish (wal_finish with a short deadline, unless it ran since the last
 * record was appended), stop the flusher, close files, free w. Holds
 * still queued are dropped without a call. NULL: nothing. */
void wal_close(struct wal *w);
/* Give the directory and its files to uid:gid (before dropping
 * privileges with -u). 0 or BG_IO_ERROR with a message. */
int wal_chown(struct wal *w, unsigned uid, unsigned gid);
/* binlog-* figures for stats. */
void wal_stats(const struct wal *w, struct bg_process_info *pi);

/* Replication, a standby: apply the records of the stream's message seq to
 * the engine (the reader and the apply of a start from disk). When seq does
 * not follow the last one applied, a purge went past this standby: the
 * jobs the snapshot at seq does not write again are dropped once its end is
 * read. 0, BG_CORRUPT (a record cannot be read) or BG_OUT_OF_MEMORY. */
int wal_apply(struct wal *w, uint64_t seq, const char *data, size_t len);
/* Replication: this node is primary now; log from here on. The local copy
 * (a directory) begins with a snapshot; without one, stream_bytes is what
 * the stream holds (for compaction). */
void wal_start_writing(struct wal *w, uint64_t stream_bytes);

/* The engine's hooks (engine->journal = &wal_journal_ops). */
extern const struct bg_journal_ops wal_journal_ops;

#endif

/* binlog.h - beanstalkd's log files (binlog.N) read, pure: bytes in, jobs
 * and a damage report out (no files; io/wal.c reads the files and imports
 * the jobs, docs/durability.md "Importing beanstalkd's log").
 *
 * Formats (x86-64 layout, little-endian), as beanstalkd's file.c writes
 * them:
 *   version 7 (beanstalkd 1.10 to 1.13)  int32 version, then records of
 *     int32 name length (0: a short record: no name, no body), the tube
 *     name, an 80-byte job record (u64 id, u32 priority, pad, i64 delay ns,
 *     i64 ttr ns, i32 body size with its CRLF, pad, i64 created ns (wall
 *     clock), i64 deadline ns (wall clock), u32 reserves, timeouts,
 *     releases, buries, kicks, u8 state, pad), then the body (full
 *     records only).
 *   version 5  the same with a 64-bit name length, a 77-byte job record
 *     and times in microseconds.
 * States: 0 deleted, 1 ready, 2 reserved, 3 buried, 4 delayed.
 *
 * Files are read oldest first into one set of jobs, as beanstalkd replays
 * them: a full record makes (or replaces) a job, a short record changes a
 * live one (or is ignored: its full record was in a file deleted since),
 * state 0 deletes it. beanstalkd fills a new file with zeros up to its
 * size: a record whose id is 0 ends a file (nothing but zeros may follow
 * it). Reading a file stops at its first bad record; its report says what
 * and where, and the rest of that file is not read. */
#ifndef BEANGATE_BINLOG_H
#define BEANGATE_BINLOG_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

enum bg_binlog_state {
    BG_BINLOG_DELETED = 0, BG_BINLOG_READY = 1, BG_BINLOG_RESERVED = 2,
    BG_BINLOG_BURIED = 3, BG_BINLOG_DELAYED = 4,
};

/* Where a file stops being readable, and why. */
enum bg_binlog_damage {
    BG_BINLOG_OK = 0,
    BG_BINLOG_NEVER_WRITTEN,   /* no version yet (empty, or zeros): created, never used */
    BG_BINLOG_TRUNCATED,       /* a record runs past the end, or its body was never
                                * written (zeros to the end of the file) */
    BG_BINLOG_BAD_VERSION,     /* neither 7 nor 5 */
    BG_BINLOG_BAD_NAME_LENGTH, /* negative, or longer than a tube name can be */
    BG_BINLOG_BAD_TUBE,        /* a name beanstalkd cannot have made */
    BG_BINLOG_BAD_STATE,       /* a state byte above 4 */
    BG_BINLOG_BAD_FIELD,       /* a negative delay or TTR, a body size under 2 */
    BG_BINLOG_BAD_BODY,        /* a body that does not end in CRLF */
    BG_BINLOG_DATA_AFTER_END,  /* bytes other than zeros after the end record */
};

/* What reading one file found. */
struct bg_binlog_file {
    int version;               /* 7 or 5; 0 when never written or bad */
    size_t bytes;
    uint64_t records;          /* records read (full and short) */
    uint64_t full_records;
    uint64_t jobs_made;        /* full records that made a job not live before */
    enum bg_binlog_damage damage;
    size_t offset;             /* where the bad record (or the bad version) starts */
    int torn;                  /* set by bg_binlog_classify: a torn tail, not damage */
};

/* A job as the files leave it. tube and body point into the caller's
 * data (a million jobs take about 100 MB here, not 300 MB). */
struct bg_binlog_job {
    uint64_t id;
    const char *tube;          /* tube_len bytes, not NUL-terminated */
    uint8_t tube_len;
    uint32_t pri;
    uint8_t state;             /* enum bg_binlog_state, never DELETED when live */
    uint8_t live;
    int64_t delay_ns, ttr_ns, created_ns, deadline_ns;
    uint32_t reserves, timeouts, releases, buries, kicks;
    uint32_t body_len;         /* including the CRLF */
    const char *body;
};

/* The jobs of the files read so far. */
struct bg_binlog {
    struct bg_binlog_job *jobs;  /* live and deleted, in the order first made */
    size_t count, cap;
    size_t *slots;               /* open addressing by id: index + 1, 0 empty */
    size_t slot_count;
    uint64_t max_id;             /* highest id of any valid record read */
};

void bg_binlog_init(struct bg_binlog *b);
void bg_binlog_free(struct bg_binlog *b);
/* Read one file's bytes (the next oldest) into b and fill *report. The
 * data must outlive b (bodies point into it). 0, or BG_OUT_OF_MEMORY (b
 * then holds what was read before the record that needed memory). */
int bg_binlog_read(struct bg_binlog *b, const char *data, size_t len, struct bg_binlog_file *report);
/* After the last file: the newest file holding records (or a truncated
 * one) may end in a torn record, the normal state after a crash: mark it
 * torn. Any other damage stays damage. */
void bg_binlog_classify(struct bg_binlog_file *files, size_t n);
/* Nonzero if the report is damage (bg_binlog_classify ran). */
int bg_binlog_damaged(const struct bg_binlog_file *f);
/* "truncated", "bad_state", ... for messages. */
const char *bg_binlog_damage_name(enum bg_binlog_damage d);
/* The job in b with this id, live or not; NULL if none was made. */
const struct bg_binlog_job *bg_binlog_find(const struct bg_binlog *b, uint64_t id);

#endif

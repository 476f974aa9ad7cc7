/* storage_fault.h - the fault-injecting storage of the simulator (issue 21):
 * io/storage.h over files kept in memory. Each file has the image every
 * read sees and a durable image (what a crash of the machine keeps for
 * sure); writes and truncations since the file's last good sync wait in
 * order for the next sync. The directory likewise: names created, renamed
 * or unlinked since the last directory sync are pending.
 *
 * A seeded schedule fails calls (EIO, ENOSPC), makes writes short, and
 * after a failed sync forgets what was pending (the kernel marked the
 * pages clean: "fsyncgate"). A crash (fault_storage_crash) keeps, per file,
 * none, all, a prefix of the pending writes (the last kept one may be
 * torn) or any subset of the pages they touched, and a prefix of the pending directory
 * changes. Every mutating call is counted (fault_storage_ops), so a run can
 * be cut at any call (fault_storage_crash_at) to enumerate crash points. */
#ifndef BEANGATE_SIM_STORAGE_FAULT_H
#define BEANGATE_SIM_STORAGE_FAULT_H

#include <stdint.h>

#include "../../io/storage.h"
#include "sim_rng.h"

/* How often each kind of call fails, in parts per million. */
struct fault_rates {
    uint32_t create, pwrite, short_write, sync, sync_dir, rename, unlink, truncate;
};

/* What a crash keeps of the writes not synced yet. */
enum crash_keep {
    KEEP_NONE,      /* every pending write is lost */
    KEEP_ALL,       /* every pending write made it */
    KEEP_PREFIX,    /* the first k of each file (the last maybe torn) */
    KEEP_SUBSET,    /* any of the 4 KiB pages they touched, in any combination
                     * (the kernel writes pages back in any order) */
    KEEP_RANDOM,    /* one of the above per file, chosen by the rng */
};

struct storage *fault_storage_new(uint64_t seed);
/* The fault rates from now on (all zero: no faults). */
void fault_storage_set_rates(struct storage *s, const struct fault_rates *r);
/* Mutating calls so far (create, pwrite, truncate, sync, sync_dir, rename,
 * unlink): the crash points of a run. */
uint64_t fault_storage_ops(const struct storage *s);
/* Crash (as the machine) right before mutating call number n (counted as
 * fault_storage_ops counts; 0: never): that call and every later one fail
 * with EIO and change nothing, until fault_storage_crash. */
void fault_storage_crash_at(struct storage *s, uint64_t n);
/* Nonzero once the crash point passed (or fault_storage_halt). */
int fault_storage_halted(const struct storage *s);
/* Print every mutating call and every crash on stdout (sim -v). */
void fault_storage_trace(struct storage *s, int on);
/* Stop the machine now: every later call fails with EIO. */
void fault_storage_halt(struct storage *s);
/* The machine restarts: per file keep what `keep` says of its pending
 * writes (k: KEEP_PREFIX's count, or -1 for a random one), keep a random
 * prefix of the pending directory changes (all with KEEP_ALL, none with
 * KEEP_NONE), close every handle, and accept calls again. Returns how many
 * pending writes there were (for enumerating prefixes). */
size_t fault_storage_crash(struct storage *s, enum crash_keep keep, long k);
/* Pending (unsynced) writes of the file with the most of them. */
size_t fault_storage_max_pending(const struct storage *s);
/* Counters for the report: calls failed, writes cut short, syncs failed. */
struct fault_counts {
    uint64_t failed, short_writes, sync_failed, pending_lost;
};
void fault_storage_counts(const struct storage *s, struct fault_counts *out);
/* Nonzero if a sync failed since the last crash: what was pending then is
 * gone from the disk while it still reads back (the log must write it
 * again before it counts). */
int fault_storage_lost_on_sync(const struct storage *s);

#endif

/* storage.h - the write-ahead log's file I/O behind one small interface,
 * so that a simulator can fail it (tests/sim): the real one works on a
 * directory of files (io/storage_posix.c); the fault-injecting one keeps
 * files in memory, with what is synced apart from what is only written, and
 * fails calls on a seeded schedule (tests/sim/storage_fault.c).
 *
 * Every call works on names inside the log's one directory and returns 0
 * or an errno value (never -1 and errno). A handle is a small integer the
 * storage gave out. No call is thread-safe against another on the same
 * handle; the log's flusher and loop never use one handle at once. */
#ifndef BEANGATE_STORAGE_H
#define BEANGATE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

struct storage;

struct storage_ops {
    /* Create NAME empty (truncating one that exists), open for writing. */
    int (*create)(struct storage *s, const char *name, int *handle);
    /* Open an existing NAME for writing (cutting a torn tail). */
    int (*open)(struct storage *s, const char *name, int *handle);
    /* Write n bytes at offset off; *written: how many went (a short write
     * returns 0 with *written < n; the caller decides). */
    int (*pwrite)(struct storage *s, int handle, const void *p, size_t n, uint64_t off, size_t *written);
    /* Make what was written to handle durable (fdatasync). After a failed
     * sync nothing written since the last good one may be trusted. */
    int (*sync)(struct storage *s, int handle);
    /* Make the directory's names durable (fsync of the directory). */
    int (*sync_dir)(struct storage *s);
    int (*truncate)(struct storage *s, int handle, uint64_t len);
    int (*close)(struct storage *s, int handle);
    int (*unlink)(struct storage *s, const char *name);
    int (*rename)(struct storage *s, const char *from, const char *to);
    /* The names in the directory: *names is one malloc'd array of *count
     * malloc'd strings (storage_free_names frees both). */
    int (*list)(struct storage *s, char ***names, size_t *count);
    /* NAME's whole content as it reads now: *data stays valid until
     * release(s, *data, *len). An empty file may give a non-NULL *data of
     * length 0. */
    int (*read_all)(struct storage *s, const char *name, char **data, size_t *len);
    void (*release)(struct storage *s, char *data, size_t len);
    /* Free s (closing what is still open). */
    void (*destroy)(struct storage *s);
};

struct storage {
    const struct storage_ops *ops;
};

/* The real files in DIR. With take_lock (a server; not --check-log):
 * make DIR if missing and take its lock file (flock LOCK_EX|LOCK_NB on
 * DIR/lock). 0; EWOULDBLOCK when another server holds the lock; another
 * errno when DIR cannot be used. */
int storage_posix_open(struct storage **out, const char *dir, int take_lock);
/* The directory's file descriptor of a posix storage (wal_chown), or -1
 * for any other storage. */
int storage_posix_dir_fd(const struct storage *s);

void storage_free_names(char **names, size_t count);

#endif

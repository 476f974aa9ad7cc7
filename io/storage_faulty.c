/* storage_faulty.c - the disk-fault test hook (storage_faulty.h): every
 * call goes to the wrapped storage unless the control file's rules make
 * it fail. The rules are read again when the file's size or mtime
 * changed, checked with one stat per call; a rule "once" fires on the
 * next matching call after it was read, then is spent. The flusher and
 * the loop call it from two threads: one mutex guards the rules. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "storage_faulty.h"

enum fault_op { FAULT_WRITE, FAULT_SYNC, FAULT_SYNC_DIR, FAULT_OPS };

struct fault_rule {
    int error;                 /* errno to return; 0: none */
    int once;                  /* the error fires once, then is spent */
    int short_write;           /* FAULT_WRITE: take half the bytes */
    long delay_ms;             /* wait before the call */
};

#define MAX_WAL_HANDLES 16    /* *.wal files open at once (the log has two or three) */

struct faulty_storage {
    struct storage base;
    struct storage *inner;
    char *control_path;
    pthread_mutex_t lock;
    struct timespec seen_mtime;
    off_t seen_size;
    int seen_exists;
    struct fault_rule rules[FAULT_OPS];
    /* the open handles of *.wal files, with how far each was written and
     * synced (a failed sync loses what lies between, as a kernel may) */
    struct wal_file {
        int handle;
        uint64_t written_end, synced_end;
    } wal_files[MAX_WAL_HANDLES];
    size_t wal_count;
};

static struct faulty_storage *faulty_of(struct storage *s) { return (struct faulty_storage *)s; }

static int errno_named(const char *word)
{
    static const struct { const char *name; int value; } names[] = {
        {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}, {"ENOMEM", ENOMEM},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(word, names[i].name) == 0) return names[i].value;
    return EIO;
}

/* Parse one line of the control file into rules; unknown lines are ignored. */
static void parse_rule(struct faulty_storage *f, char *line)
{
    char op[16] = "", what[16] = "", extra[16] = "";
    if (sscanf(line, "%15s %15s %15s", op, what, extra) < 2) return;
    enum fault_op k = strcmp(op, "write") == 0 ? FAULT_WRITE
                    : strcmp(op, "sync") == 0 ? FAULT_SYNC
                    : strcmp(op, "sync_dir") == 0 ? FAULT_SYNC_DIR : FAULT_OPS;
    if (k == FAULT_OPS) return;
    struct fault_rule *r = &f->rules[k];
    if (strcmp(what, "short") == 0) r->short_write = 1;
    else if (strcmp(what, "delay") == 0) r->delay_ms = strtol(extra, NULL, 10);
    else {
        r->error = errno_named(what);
        r->once = strcmp(extra, "once") == 0;
    }
}

/* Read the rules again if the control file changed (under f->lock). */
static void rules_refresh(struct faulty_storage *f)
{
    struct stat st;
    int exists = stat(f->control_path, &st) == 0;
    if (exists == f->seen_exists && (!exists || (st.st_size == f->seen_size &&
                                                 st.st_mtim.tv_sec == f->seen_mtime.tv_sec &&
                                                 st.st_mtim.tv_nsec == f->seen_mtime.tv_nsec)))
        return;
    f->seen_exists = exists;
    if (exists) {
        f->seen_size = st.st_size;
        f->seen_mtime = st.st_mtim;
    }
    memset(f->rules, 0, sizeof f->rules);
    FILE *in = exists ? fopen(f->control_path, "r") : NULL;
    if (!in) return;
    char line[128];
    while (fgets(line, sizeof line, in)) parse_rule(f, line);
    fclose(in);
}

/* The rule for op now (a copy; a "once" error is spent by taking it). */
static struct fault_rule rule_take(struct faulty_storage *f, enum fault_op op)
{
    pthread_mutex_lock(&f->lock);
    rules_refresh(f);
    struct fault_rule r = f->rules[op];
    if (r.once) f->rules[op].error = 0, f->rules[op].once = 0;
    pthread_mutex_unlock(&f->lock);
    if (r.delay_ms > 0) {
        struct timespec ts = {r.delay_ms / 1000, (r.delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    return r;
}

/* The *.wal file of handle (under f->lock), or NULL. */
static struct wal_file *wal_file_of(struct faulty_storage *f, int handle)
{
    for (size_t i = 0; i < f->wal_count; i++)
        if (f->wal_files[i].handle == handle) return &f->wal_files[i];
    return NULL;
}

static int handle_is_wal(struct faulty_storage *f, int handle)
{
    pthread_mutex_lock(&f->lock);
    int found = wal_file_of(f, handle) != NULL;
    pthread_mutex_unlock(&f->lock);
    return found;
}

/* Note a handle opened on name (faults apply only to *.wal files). */
static void note_handle(struct faulty_storage *f, const char *name, int handle)
{
    size_t n = strlen(name);
    if (n <= 4 || strcmp(name + n - 4, ".wal") != 0) return;
    pthread_mutex_lock(&f->lock);
    if (f->wal_count < MAX_WAL_HANDLES) f->wal_files[f->wal_count++] = (struct wal_file){handle, 0, 0};
    pthread_mutex_unlock(&f->lock);
}

static void forget_handle(struct faulty_storage *f, int handle)
{
    pthread_mutex_lock(&f->lock);
    struct wal_file *wf = wal_file_of(f, handle);
    if (wf) *wf = f->wal_files[--f->wal_count];
    pthread_mutex_unlock(&f->lock);
}

/* A *.wal file's marks (no-op for other handles): written up to `end`;
 * cut to `len` (marks_cut); synced or not (marks_synced). */
static void marks_written(struct faulty_storage *f, int handle, uint64_t end)
{
    pthread_mutex_lock(&f->lock);
    struct wal_file *wf = wal_file_of(f, handle);
    if (wf && end > wf->written_end) wf->written_end = end;
    pthread_mutex_unlock(&f->lock);
}

static void marks_cut(struct faulty_storage *f, int handle, uint64_t len)
{
    pthread_mutex_lock(&f->lock);
    struct wal_file *wf = wal_file_of(f, handle);
    if (wf) {
        if (wf->written_end > len) wf->written_end = len;
        if (wf->synced_end > len) wf->synced_end = len;
    }
    pthread_mutex_unlock(&f->lock);
}

/* The sync of handle: succeeded (synced up to what was written) or failed
 * (the bytes written since the last good sync are lost: zeroed, as pages a
 * kernel dropped after a writeback error read back after a reboot). */
static void marks_synced(struct faulty_storage *f, int handle, int failed)
{
    pthread_mutex_lock(&f->lock);
    struct wal_file *wf = wal_file_of(f, handle);
    uint64_t from = 0, to = 0;
    if (wf) {
        if (failed) from = wf->synced_end, to = wf->written_end;
        else wf->synced_end = wf->written_end;
    }
    pthread_mutex_unlock(&f->lock);
    static const char zeros[4096];
    while (from < to) {
        size_t n = to - from < sizeof zeros ? (size_t)(to - from) : sizeof zeros, written;
        if (f->inner->ops->pwrite(f->inner, handle, zeros, n, from, &written) != 0 || written == 0) break;
        from += written;
    }
}

static int faulty_create(struct storage *s, const char *name, int *handle)
{
    struct faulty_storage *f = faulty_of(s);
    int e = f->inner->ops->create(f->inner, name, handle);
    if (!e) note_handle(f, name, *handle);
    return e;
}

static int faulty_open(struct storage *s, const char *name, int *handle)
{
    struct faulty_storage *f = faulty_of(s);
    int e = f->inner->ops->open(f->inner, name, handle);
    if (!e) note_handle(f, name, *handle);
    return e;
}

static int faulty_pwrite(struct storage *s, int handle, const void *p, size_t n, uint64_t off, size_t *written)
{
    struct faulty_storage *f = faulty_of(s);
    if (handle_is_wal(f, handle)) {
        struct fault_rule r = rule_take(f, FAULT_WRITE);
        if (r.error) {
            *written = 0;
            return r.error;
        }
        if (r.short_write) n /= 2;
    }
    int e = f->inner->ops->pwrite(f->inner, handle, p, n, off, written);
    marks_written(f, handle, off + *written);
    return e;
}

static int faulty_sync(struct storage *s, int handle)
{
    struct faulty_storage *f = faulty_of(s);
    if (handle_is_wal(f, handle)) {
        struct fault_rule r = rule_take(f, FAULT_SYNC);
        if (r.error) {
            marks_synced(f, handle, 1);
            return r.error;
        }
    }
    int e = f->inner->ops->sync(f->inner, handle);
    if (!e) marks_synced(f, handle, 0);
    return e;
}

static int faulty_sync_dir(struct storage *s)
{
    struct faulty_storage *f = faulty_of(s);
    struct fault_rule r = rule_take(f, FAULT_SYNC_DIR);
    return r.error ? r.error : f->inner->ops->sync_dir(f->inner);
}

static int faulty_truncate(struct storage *s, int handle, uint64_t len)
{
    struct faulty_storage *f = faulty_of(s);
    int e = f->inner->ops->truncate(f->inner, handle, len);
    if (!e) marks_cut(f, handle, len);
    return e;
}

static int faulty_close(struct storage *s, int handle)
{
    struct faulty_storage *f = faulty_of(s);
    forget_handle(f, handle);
    return f->inner->ops->close(f->inner, handle);
}

static int faulty_unlink(struct storage *s, const char *name)
{
    struct faulty_storage *f = faulty_of(s);
    return f->inner->ops->unlink(f->inner, name);
}

static int faulty_rename(struct storage *s, const char *from, const char *to)
{
    struct faulty_storage *f = faulty_of(s);
    return f->inner->ops->rename(f->inner, from, to);
}

static int faulty_list(struct storage *s, char ***names, size_t *count)
{
    struct faulty_storage *f = faulty_of(s);
    return f->inner->ops->list(f->inner, names, count);
}

static int faulty_read_all(struct storage *s, const char *name, char **data, size_t *len)
{
    struct faulty_storage *f = faulty_of(s);
    return f->inner->ops->read_all(f->inner, name, data, len);
}

static void faulty_release(struct storage *s, char *data, size_t len)
{
    struct faulty_storage *f = faulty_of(s);
    f->inner->ops->release(f->inner, data, len);
}

static void faulty_destroy(struct storage *s)
{
    struct faulty_storage *f = faulty_of(s);
    f->inner->ops->destroy(f->inner);
    pthread_mutex_destroy(&f->lock);
    free(f->control_path);
    free(f);
}

static const struct storage_ops faulty_ops = {
    faulty_create, faulty_open, faulty_pwrite, faulty_sync, faulty_sync_dir, faulty_truncate, faulty_close,
    faulty_unlink, faulty_rename, faulty_list, faulty_read_all, faulty_release, faulty_destroy,
};

int storage_faulty_wrap(struct storage **out, struct storage *inner, const char *control_path)
{
    struct faulty_storage *f = calloc(1, sizeof *f);
    if (!f || !(f->control_path = strdup(control_path))) {
        free(f);
        return ENOMEM;
    }
    f->base.ops = &faulty_ops;
    f->inner = inner;
    pthread_mutex_init(&f->lock, NULL);
    *out = &f->base;
    return 0;
}

/* storage_fault.c - the fault-injecting storage (storage_fault.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage_fault.h"

#define SIM_PAGE 4096 /* what the kernel writes back at once */

/* A byte array that grows. */
struct bytes {
    char *data;
    size_t len, cap;
};

static void bytes_resize(struct bytes *b, size_t len)
{
    if (len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < len) cap *= 2;
        b->data = realloc(b->data, cap);
        if (!b->data) abort();
        b->cap = cap;
    }
    if (len > b->len) memset(b->data + b->len, 0, len - b->len);
    b->len = len;
}

static void bytes_write(struct bytes *b, uint64_t off, const char *p, size_t n)
{
    if (!n) return;
    if (off + n > b->len) bytes_resize(b, (size_t)(off + n));
    memcpy(b->data + off, p, n);
}

/* A write or truncation not synced yet (data NULL: truncate to off). */
struct pending_op {
    uint64_t off;
    size_t len;
    char *data;
};

struct sfile {
    char name[64];             /* the name it was made with (for the trace) */
    struct bytes cur, dur;     /* what reads see; what a crash keeps for sure */
    struct pending_op *pend;   /* since the last good sync, in order */
    size_t npend, pend_cap;
};

/* A name in the directory. */
struct entry {
    char *name;
    struct sfile *file;
};

struct names {
    struct entry *e;
    size_t n, cap;
};

/* A directory change not synced yet. */
struct dir_op {
    enum { DIR_LINK, DIR_UNLINK, DIR_RENAME } kind;
    char *name, *to;
    struct sfile *file;
};

struct fault_storage {
    struct storage base;
    struct sim_rng rng;
    struct fault_rates rates;
    struct names cur, dur;
    struct dir_op *dops;
    size_t ndops, dops_cap;
    struct sfile **files;      /* every file ever made (freed at destroy) */
    size_t nfiles, files_cap;
    struct sfile **handles;
    size_t nhandles;
    uint64_t ops, crash_at;
    int halted, lost_on_sync;
    int trace;                 /* print every mutating call */
    struct fault_counts counts;
};

static struct fault_storage *fs_of(struct storage *s) { return (struct fault_storage *)s; }

static void *grow(void *a, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return a;
    size_t c = *cap ? *cap * 2 : 8;
    while (c < need) c *= 2;
    a = realloc(a, c * size);
    if (!a) abort();
    *cap = c;
    return a;
}

static char *dup_str(const char *s)
{
    char *d = strdup(s);
    if (!d) abort();
    return d;
}

/* ---- names ---- */

static struct entry *names_find(struct names *ns, const char *name)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->e[i].name, name) == 0) return &ns->e[i];
    return NULL;
}

static void names_set(struct names *ns, const char *name, struct sfile *f)
{
    struct entry *e = names_find(ns, name);
    if (e) {
        e->file = f;
        return;
    }
    ns->e = grow(ns->e, &ns->cap, ns->n + 1, sizeof *ns->e);
    ns->e[ns->n++] = (struct entry){dup_str(name), f};
}

static void names_remove(struct names *ns, const char *name)
{
    struct entry *e = names_find(ns, name);
    if (!e) return;
    free(e->name);
    *e = ns->e[--ns->n];
}

static void names_clear(struct names *ns)
{
    for (size_t i = 0; i < ns->n; i++) free(ns->e[i].name);
    ns->n = 0;
}

static void names_copy(struct names *to, const struct names *from)
{
    names_clear(to);
    for (size_t i = 0; i < from->n; i++) names_set(to, from->e[i].name, from->e[i].file);
}

static void dir_op_apply(struct names *ns, const struct dir_op *d)
{
    switch (d->kind) {
    case DIR_LINK: names_set(ns, d->name, d->file); break;
    case DIR_UNLINK: names_remove(ns, d->name); break;
    case DIR_RENAME: {
        struct entry *e = names_find(ns, d->name);
        if (!e) break;
        struct sfile *f = e->file;
        names_remove(ns, d->name);
        names_set(ns, d->to, f);
        break;
    }
    }
}

static void dir_ops_clear(struct fault_storage *fs)
{
    for (size_t i = 0; i < fs->ndops; i++) {
        free(fs->dops[i].name);
        free(fs->dops[i].to);
    }
    fs->ndops = 0;
}

static void dir_op_add(struct fault_storage *fs, int kind, const char *name, const char *to, struct sfile *f)
{
    fs->dops = grow(fs->dops, &fs->dops_cap, fs->ndops + 1, sizeof *fs->dops);
    fs->dops[fs->ndops++] = (struct dir_op){kind, dup_str(name), to ? dup_str(to) : NULL, f};
}

/* ---- files ---- */

static struct sfile *file_new(struct fault_storage *fs)
{
    struct sfile *f = calloc(1, sizeof *f);
    if (!f) abort();
    fs->files = grow(fs->files, &fs->files_cap, fs->nfiles + 1, sizeof *fs->files);
    fs->files[fs->nfiles++] = f;
    return f;
}

static void pend_add(struct sfile *f, uint64_t off, const void *p, size_t n, int truncate)
{
    f->pend = grow(f->pend, &f->pend_cap, f->npend + 1, sizeof *f->pend);
    struct pending_op *o = &f->pend[f->npend++];
    o->off = off;
    o->len = n;
    o->data = NULL;
    if (!truncate) {
        o->data = malloc(n ? n : 1);
        if (!o->data) abort();
        if (n) memcpy(o->data, p, n);
    }
}

static void pend_apply(struct bytes *b, const struct pending_op *o, size_t bytes)
{
    if (!o->data) bytes_resize(b, (size_t)o->off);
    else bytes_write(b, o->off, o->data, bytes);
}

static void pend_clear(struct sfile *f)
{
    for (size_t i = 0; i < f->npend; i++) free(f->pend[i].data);
    f->npend = 0;
}

/* ---- the schedule ---- */

/* Count a mutating call; EIO once the crash point is passed, else 0. */
static int step(struct fault_storage *fs)
{
    if (fs->halted) return EIO;
    fs->ops++;
    if (fs->crash_at && fs->ops >= fs->crash_at) {
        fs->halted = 1;
        return EIO;
    }
    return 0;
}

/* Print call number, what, and its result when tracing. */
static int traced(struct fault_storage *fs, int e, const char *what, const char *name, uint64_t a, uint64_t b)
{
    if (fs->trace)
        printf("  storage #%llu %s %s %llu %llu -> %s\n", (unsigned long long)fs->ops, what, name ? name : "-",
               (unsigned long long)a, (unsigned long long)b, e ? strerror(e) : "ok");
    return e;
}

/* An injected failure with probability ppm: EIO or ENOSPC; else 0. */
static int injected(struct fault_storage *fs, uint32_t ppm)
{
    if (!rng_ppm(&fs->rng, ppm)) return 0;
    fs->counts.failed++;
    return rng_below(&fs->rng, 4) ? EIO : ENOSPC;
}

static struct sfile *handle_file(struct fault_storage *fs, int h)
{
    return h >= 0 && (size_t)h < fs->nhandles ? fs->handles[h] : NULL;
}

static int handle_new(struct fault_storage *fs, struct sfile *f)
{
    for (size_t i = 0; i < fs->nhandles; i++)
        if (!fs->handles[i]) {
            fs->handles[i] = f;
            return (int)i;
        }
    size_t cap = fs->nhandles;
    fs->handles = grow(fs->handles, &cap, fs->nhandles + 1, sizeof *fs->handles);
    fs->handles[fs->nhandles] = f;
    return (int)fs->nhandles++;
}

/* ---- the operations ---- */

static int op_create(struct storage *s, const char *name, int *handle)
{
    struct fault_storage *fs = fs_of(s);
    int e = step(fs);
    if (!e) e = injected(fs, fs->rates.create);
    if (e) return traced(fs, e, "create", name, 0, 0);
    traced(fs, 0, "create", name, 0, 0);
    struct entry *en = names_find(&fs->cur, name);
    struct sfile *f;
    if (en) { /* O_TRUNC of an existing file */
        f = en->file;
        bytes_resize(&f->cur, 0);
        pend_add(f, 0, NULL, 0, 1);
    } else {
        f = file_new(fs);
        snprintf(f->name, sizeof f->name, "%s", name);
        names_set(&fs->cur, name, f);
        dir_op_add(fs, DIR_LINK, name, NULL, f);
    }
    *handle = handle_new(fs, f);
    return 0;
}

static int op_open(struct storage *s, const char *name, int *handle)
{
    struct fault_storage *fs = fs_of(s);
    if (fs->halted) return EIO;
    struct entry *en = names_find(&fs->cur, name);
    if (!en) return ENOENT;
    *handle = handle_new(fs, en->file);
    return 0;
}

/* The start of a mutating call on a handle: its file, or NULL with *err
 * (EBADF, the crash point, or a failure injected with probability ppm). */
static struct sfile *call_on(struct fault_storage *fs, int handle, uint32_t ppm, int *err)
{
    struct sfile *f = handle_file(fs, handle);
    *err = !f ? EBADF : step(fs);
    if (!*err) *err = injected(fs, ppm);
    return *err ? NULL : f;
}

static int op_pwrite(struct storage *s, int handle, const void *p, size_t n, uint64_t off, size_t *written)
{
    struct fault_storage *fs = fs_of(s);
    int e;
    struct sfile *f = call_on(fs, handle, fs->rates.pwrite, &e);
    *written = 0;
    if (!f) return traced(fs, e, "pwrite", NULL, off, n);
    size_t n_go = n;
    if (n > 1 && rng_ppm(&fs->rng, fs->rates.short_write)) {
        n_go = 1 + (size_t)rng_below(&fs->rng, n - 1);
        fs->counts.short_writes++;
    }
    traced(fs, 0, "pwrite", f->name, off, n_go);
    bytes_write(&f->cur, off, p, n_go);
    pend_add(f, off, p, n_go, 0);
    *written = n_go;
    return 0;
}

static int op_truncate(struct storage *s, int handle, uint64_t len)
{
    struct fault_storage *fs = fs_of(s);
    int e;
    struct sfile *f = call_on(fs, handle, fs->rates.truncate, &e);
    if (!f) return traced(fs, e, "truncate", NULL, len, 0);
    traced(fs, 0, "truncate", f->name, len, 0);
    bytes_resize(&f->cur, (size_t)len);
    pend_add(f, len, NULL, 0, 1);
    return 0;
}

static int op_sync(struct storage *s, int handle)
{
    struct fault_storage *fs = fs_of(s);
    struct sfile *f = handle_file(fs, handle);
    if (!f) return EBADF;
    int e = step(fs);
    if (!e && rng_ppm(&fs->rng, fs->rates.sync)) {
        /* the kernel wrote some of the pages, failed on one, and marked
         * the rest clean: they read back, but no later sync writes them */
        fs->counts.failed++;
        fs->counts.sync_failed++;
        size_t keep = f->npend ? (size_t)rng_below(&fs->rng, f->npend + 1) : 0;
        for (size_t i = 0; i < keep; i++) pend_apply(&f->dur, &f->pend[i], f->pend[i].len);
        if (f->npend > keep) {
            fs->counts.pending_lost += f->npend - keep;
            fs->lost_on_sync = 1;
        }
        pend_clear(f);
        return traced(fs, EIO, "sync (forgets what was pending)", f->name, keep, 0);
    }
    traced(fs, e, "sync", f->name, f->npend, 0);
    if (e) return e;
    for (size_t i = 0; i < f->npend; i++) pend_apply(&f->dur, &f->pend[i], f->pend[i].len);
    pend_clear(f);
    return 0;
}

static int op_sync_dir(struct storage *s)
{
    struct fault_storage *fs = fs_of(s);
    int e = step(fs);
    if (!e) e = injected(fs, fs->rates.sync_dir);
    traced(fs, e, "sync_dir", NULL, fs->ndops, 0);
    if (e) return e;
    names_copy(&fs->dur, &fs->cur);
    dir_ops_clear(fs);
    return 0;
}

static int op_close(struct storage *s, int handle)
{
    struct fault_storage *fs = fs_of(s);
    if (!handle_file(fs, handle)) return EBADF;
    fs->handles[handle] = NULL;
    return 0;
}

static int op_unlink(struct storage *s, const char *name)
{
    struct fault_storage *fs = fs_of(s);
    int e = step(fs);
    if (!e) e = injected(fs, fs->rates.unlink);
    traced(fs, e, "unlink", name, 0, 0);
    if (e) return e;
    if (!names_find(&fs->cur, name)) return ENOENT;
    names_remove(&fs->cur, name);
    dir_op_add(fs, DIR_UNLINK, name, NULL, NULL);
    return 0;
}

static int op_rename(struct storage *s, const char *from, const char *to)
{
    struct fault_storage *fs = fs_of(s);
    int e = step(fs);
    if (!e) e = injected(fs, fs->rates.rename);
    traced(fs, e, "rename", from, 0, 0);
    if (e) return e;
    struct entry *en = names_find(&fs->cur, from);
    if (!en) return ENOENT;
    struct sfile *f = en->file;
    names_remove(&fs->cur, from);
    names_set(&fs->cur, to, f);
    dir_op_add(fs, DIR_RENAME, from, to, f);
    return 0;
}

static int op_list(struct storage *s, char ***names, size_t *count)
{
    struct fault_storage *fs = fs_of(s);
    if (fs->halted) return EIO;
    char **a = malloc((fs->cur.n ? fs->cur.n : 1) * sizeof *a);
    if (!a) return ENOMEM;
    for (size_t i = 0; i < fs->cur.n; i++) a[i] = dup_str(fs->cur.e[i].name);
    *names = a;
    *count = fs->cur.n;
    return 0;
}

static int op_read_all(struct storage *s, const char *name, char **data, size_t *len)
{
    struct fault_storage *fs = fs_of(s);
    if (fs->halted) return EIO;
    struct entry *en = names_find(&fs->cur, name);
    if (!en) return ENOENT;
    const struct bytes *b = &en->file->cur;
    char *d = malloc(b->len ? b->len : 1);
    if (!d) return ENOMEM;
    if (b->len) memcpy(d, b->data, b->len);
    *data = d;
    *len = b->len;
    return 0;
}

static void op_release(struct storage *s, char *data, size_t len)
{
    (void)s, (void)len;
    free(data);
}

static void op_destroy(struct storage *s)
{
    struct fault_storage *fs = fs_of(s);
    for (size_t i = 0; i < fs->nfiles; i++) {
        struct sfile *f = fs->files[i];
        pend_clear(f);
        free(f->pend);
        free(f->cur.data);
        free(f->dur.data);
        free(f);
    }
    free(fs->files);
    names_clear(&fs->cur);
    names_clear(&fs->dur);
    free(fs->cur.e);
    free(fs->dur.e);
    dir_ops_clear(fs);
    free(fs->dops);
    free(fs->handles);
    free(fs);
}

static const struct storage_ops fault_ops = {
    op_create, op_open, op_pwrite, op_sync, op_sync_dir, op_truncate, op_close,
    op_unlink, op_rename, op_list, op_read_all, op_release, op_destroy,
};

struct storage *fault_storage_new(uint64_t seed)
{
    struct fault_storage *fs = calloc(1, sizeof *fs);
    if (!fs) abort();
    fs->base.ops = &fault_ops;
    fs->rng.state = seed ^ 0x5354524147454641ull;
    return &fs->base;
}

void fault_storage_set_rates(struct storage *s, const struct fault_rates *r) { fs_of(s)->rates = *r; }

uint64_t fault_storage_ops(const struct storage *s) { return ((const struct fault_storage *)s)->ops; }

void fault_storage_crash_at(struct storage *s, uint64_t n) { fs_of(s)->crash_at = n; }

int fault_storage_halted(const struct storage *s) { return ((const struct fault_storage *)s)->halted; }

void fault_storage_halt(struct storage *s) { fs_of(s)->halted = 1; }

void fault_storage_trace(struct storage *s, int on) { fs_of(s)->trace = on; }

int fault_storage_lost_on_sync(const struct storage *s)
{
    return ((const struct fault_storage *)s)->lost_on_sync;
}

void fault_storage_counts(const struct storage *s, struct fault_counts *out)
{
    *out = ((const struct fault_storage *)s)->counts;
}

size_t fault_storage_max_pending(const struct storage *s)
{
    const struct fault_storage *fs = (const struct fault_storage *)s;
    size_t most = 0;
    for (size_t i = 0; i < fs->cur.n; i++)
        if (fs->cur.e[i].file->npend > most) most = fs->cur.e[i].file->npend;
    return most;
}

/* What survives of f's pending writes: the durable image plus those that
 * `keep` (k for KEEP_PREFIX) lets through. */
static void crash_file(struct fault_storage *fs, struct sfile *f, enum crash_keep keep, long k)
{
    size_t n = f->npend;
    if (!n) return; /* what reads see is what is on disk */
    if (keep == KEEP_RANDOM) keep = (enum crash_keep)rng_below(&fs->rng, 4);
    switch (keep) {
    case KEEP_ALL:
        for (size_t i = 0; i < n; i++) pend_apply(&f->dur, &f->pend[i], f->pend[i].len);
        break;
    case KEEP_PREFIX: {
        size_t upto = k < 0 ? (size_t)rng_below(&fs->rng, n + 1) : (size_t)k < n ? (size_t)k : n;
        for (size_t i = 0; i < upto; i++) pend_apply(&f->dur, &f->pend[i], f->pend[i].len);
        /* the next write torn: some of its bytes made it */
        if (upto < n && f->pend[upto].data && f->pend[upto].len > 1 && rng_below(&fs->rng, 2))
            pend_apply(&f->dur, &f->pend[upto], (size_t)rng_below(&fs->rng, f->pend[upto].len));
        break;
    }
    case KEEP_SUBSET: {
        /* the kernel writes pages back in any order: each page the pending
         * writes touched is either all new or all old */
        struct bytes full = {0};
        bytes_resize(&full, f->dur.len);
        if (f->dur.len) memcpy(full.data, f->dur.data, f->dur.len);
        for (size_t i = 0; i < n; i++) pend_apply(&full, &f->pend[i], f->pend[i].len);
        size_t old_len = f->dur.len, hi = full.len > old_len ? full.len : old_len, new_len = old_len;
        bytes_resize(&f->dur, hi);
        for (size_t at = 0; at < hi; at += SIM_PAGE) {
            size_t end = at + SIM_PAGE, upto = end < full.len ? end : full.len;
            if (!rng_below(&fs->rng, 2)) continue;
            if (at < upto) memcpy(f->dur.data + at, full.data + at, upto - at);
            if (upto > new_len) new_len = upto;                /* the file grew to here */
            if (full.len < old_len && full.len >= at && full.len < end) new_len = full.len; /* cut here */
        }
        bytes_resize(&f->dur, new_len);
        free(full.data);
        break;
    }
    default:
        break;
    }
    if (n) fs->counts.pending_lost += n;
    pend_clear(f);
    bytes_resize(&f->cur, 0);
    bytes_resize(&f->cur, f->dur.len);
    if (f->dur.len) memcpy(f->cur.data, f->dur.data, f->dur.len);
}

size_t fault_storage_crash(struct storage *s, enum crash_keep keep, long k)
{
    struct fault_storage *fs = fs_of(s);
    size_t pending = fault_storage_max_pending(s);
    if (fs->trace) {
        printf("  storage: machine stops; unsynced:");
        for (size_t i = 0; i < fs->nfiles; i++)
            if (fs->files[i]->npend) printf(" %s(%zu writes)", fs->files[i]->name, fs->files[i]->npend);
        printf("; directory changes %zu\n", fs->ndops);
    }
    /* the directory: a prefix of its changes since the last sync */
    size_t dkeep = keep == KEEP_ALL ? fs->ndops : keep == KEEP_NONE ? 0 : (size_t)rng_below(&fs->rng, fs->ndops + 1);
    for (size_t i = 0; i < dkeep; i++) dir_op_apply(&fs->dur, &fs->dops[i]);
    dir_ops_clear(fs);
    for (size_t i = 0; i < fs->nfiles; i++) crash_file(fs, fs->files[i], keep, k);
    names_copy(&fs->cur, &fs->dur);
    for (size_t i = 0; i < fs->nhandles; i++) fs->handles[i] = NULL;
    fs->halted = 0;
    fs->crash_at = 0;
    fs->lost_on_sync = 0;
    return pending;
}

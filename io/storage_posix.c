/* storage_posix.c - io/storage.h on the real files of one directory.
 *
 * A handle is the file's descriptor. The storage keeps the set of
 * descriptors it gave out so that destroy closes what is still open. A
 * storage opened with take_lock (a server) maps files for read_all: the
 * directory is locked, nobody changes them while they are read; without
 * it (--check-log, next to a running server that may cut a failed write
 * off a file, which would make a mapping fault) read_all copies. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage.h"

struct posix_storage {
    struct storage base;
    int dir_fd, lock_fd;
    int copy_reads;            /* read_all copies instead of mapping */
    pthread_mutex_t lock;      /* guards open_fds: the loop creates while the flusher closes */
    int *open_fds;
    size_t open_count, open_cap;
};

/* An empty file's content (never mapped, never freed). */
static char empty_content[1];

static struct posix_storage *posix_of(struct storage *s) { return (struct posix_storage *)s; }

/* Remember fd as given out. 0 or ENOMEM (fd is then closed). */
static int fd_track(struct posix_storage *p, int fd)
{
    pthread_mutex_lock(&p->lock);
    if (p->open_count == p->open_cap) {
        size_t cap = p->open_cap ? p->open_cap * 2 : 8;
        int *a = realloc(p->open_fds, cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&p->lock);
            close(fd);
            return ENOMEM;
        }
        p->open_fds = a;
        p->open_cap = cap;
    }
    p->open_fds[p->open_count++] = fd;
    pthread_mutex_unlock(&p->lock);
    return 0;
}

static void fd_untrack(struct posix_storage *p, int fd)
{
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->open_count; i++)
        if (p->open_fds[i] == fd) {
            p->open_fds[i] = p->open_fds[--p->open_count];
            break;
        }
    pthread_mutex_unlock(&p->lock);
}

static int open_flags(struct storage *s, const char *name, int flags, int *handle)
{
    struct posix_storage *p = posix_of(s);
    int fd = openat(p->dir_fd, name, flags | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    int e = fd_track(p, fd);
    if (e) return e;
    *handle = fd;
    return 0;
}

static int posix_create(struct storage *s, const char *name, int *handle)
{
    return open_flags(s, name, O_WRONLY | O_CREAT | O_TRUNC, handle);
}

static int posix_open(struct storage *s, const char *name, int *handle)
{
    return open_flags(s, name, O_WRONLY, handle);
}

/* Writes until all of p went, the file takes no more (a short write), or
 * an error (with *written what went before it). */
static int posix_pwrite(struct storage *s, int handle, const void *data, size_t n, uint64_t off, size_t *written)
{
    (void)s;
    const char *at = data;
    *written = 0;
    while (*written < n) {
        ssize_t got = pwrite(handle, at + *written, n - *written, (off_t)(off + *written));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return 0;
        *written += (size_t)got;
    }
    return 0;
}

static int posix_sync(struct storage *s, int handle)
{
    (void)s;
    return fdatasync(handle) == 0 ? 0 : errno;
}

static int posix_sync_dir(struct storage *s)
{
    return fsync(posix_of(s)->dir_fd) == 0 ? 0 : errno;
}

static int posix_truncate(struct storage *s, int handle, uint64_t len)
{
    (void)s;
    return ftruncate(handle, (off_t)len) == 0 ? 0 : errno;
}

static int posix_close(struct storage *s, int handle)
{
    fd_untrack(posix_of(s), handle);
    return close(handle) == 0 ? 0 : errno;
}

static int posix_unlink(struct storage *s, const char *name)
{
    return unlinkat(posix_of(s)->dir_fd, name, 0) == 0 ? 0 : errno;
}

static int posix_rename(struct storage *s, const char *from, const char *to)
{
    struct posix_storage *p = posix_of(s);
    return renameat(p->dir_fd, from, p->dir_fd, to) == 0 ? 0 : errno;
}

static int posix_list(struct storage *s, char ***names, size_t *count)
{
    int fd = dup(posix_of(s)->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0) close(fd);
        return e;
    }
    rewinddir(d); /* the dup shares the directory's offset */
    char **a = NULL;
    size_t n = 0, cap = 0;
    int e = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **b = realloc(a, cap * sizeof *b);
            if (!b) { e = ENOMEM; break; }
            a = b;
        }
        if (!(a[n] = strdup(ent->d_name))) { e = ENOMEM; break; }
        n++;
    }
    closedir(d);
    if (e) {
        storage_free_names(a, n);
        return e;
    }
    *names = a;
    *count = n;
    return 0;
}

/* Copy the file (it may shrink meanwhile: what is there is read). */
static int read_copy(int fd, size_t size, char **data, size_t *len)
{
    char *buf = malloc(size);
    if (!buf) return ENOMEM;
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return e;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    *data = buf;
    *len = got;
    return 0;
}

static int posix_read_all(struct storage *s, const char *name, char **data, size_t *len)
{
    struct posix_storage *p = posix_of(s);
    int fd = openat(p->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) != 0) e = errno;
    else if (st.st_size == 0) *data = empty_content, *len = 0;
    else if (p->copy_reads) e = read_copy(fd, (size_t)st.st_size, data, len);
    else {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) e = errno;
        else {
            madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
            *data = m;
            *len = (size_t)st.st_size;
        }
    }
    close(fd);
    return e;
}

static void posix_release(struct storage *s, char *data, size_t len)
{
    if (data == empty_content) return;
    if (posix_of(s)->copy_reads) free(data);
    else munmap(data, len);
}

static void posix_destroy(struct storage *s)
{
    struct posix_storage *p = posix_of(s);
    for (size_t i = 0; i < p->open_count; i++) close(p->open_fds[i]);
    free(p->open_fds);
    if (p->lock_fd >= 0) close(p->lock_fd);
    if (p->dir_fd >= 0) close(p->dir_fd);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static const struct storage_ops posix_ops = {
    posix_create, posix_open, posix_pwrite, posix_sync, posix_sync_dir, posix_truncate, posix_close,
    posix_unlink, posix_rename, posix_list, posix_read_all, posix_release, posix_destroy,
};

/* beanstalkd locks DIR/lock with fcntl (a write lock on the whole file),
 * which flock does not see: take that lock too, so that neither server
 * starts on a directory the other one uses (a running beanstalkd's files
 * are never imported). 0, EWOULDBLOCK when it is held, or an errno. */
static int beanstalkd_lock(int fd)
{
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &lk) == 0) return 0;
    return errno == EACCES || errno == EAGAIN ? EWOULDBLOCK : errno;
}

int storage_posix_open(struct storage **out, const char *dir, int take_lock)
{
    if (take_lock && mkdir(dir, 0700) != 0 && errno != EEXIST) return errno;
    struct posix_storage *p = calloc(1, sizeof *p);
    if (!p) return ENOMEM;
    p->base.ops = &posix_ops;
    p->lock_fd = -1;
    p->copy_reads = !take_lock;
    pthread_mutex_init(&p->lock, NULL);
    p->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = 0;
    if (p->dir_fd < 0) e = errno;
    else if (take_lock) {
        p->lock_fd = openat(p->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->lock_fd < 0) e = errno;
        else if (flock(p->lock_fd, LOCK_EX | LOCK_NB) != 0) e = errno == EWOULDBLOCK ? EWOULDBLOCK : errno;
        else e = beanstalkd_lock(p->lock_fd);
    }
    if (e) {
        posix_destroy(&p->base);
        return e;
    }
    *out = &p->base;
    return 0;
}

int storage_posix_dir_fd(const struct storage *s)
{
    return s && s->ops == &posix_ops ? ((const struct posix_storage *)s)->dir_fd : -1;
}

void storage_free_names(char **names, size_t count)
{
    for (size_t i = 0; i < count; i++) free(names[i]);
    free(names);
}

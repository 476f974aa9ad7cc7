/* listen.c - listening sockets (see listen.h). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../core/core.h"
#include "eventlog.h"
#include "listen.h"

#define LISTEN_BACKLOG 1024

int listen_set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 ? BG_IO_ERROR : 0;
}

int listen_unix(const char *path, const char *owner)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=\"path too long\"", log_str(path));
        errno = ENAMETOOLONG;
        return BG_IO_ERROR;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return BG_IO_ERROR;
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=\"exists and is not a socket\"", log_str(path));
            close(fd);
            errno = EEXIST;
            return BG_IO_ERROR;
        }
        unlink(path); /* a stale socket from an earlier run */
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        int err = errno;
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=%s", log_str(path), log_str(strerror(err)));
        close(fd);
        errno = err;
        return BG_IO_ERROR;
    }
    if (owner) {
        /* the socket must belong to the user we become, or it could
         * neither accept its clients' permissions nor remove the file */
        struct passwd *pw = getpwnam(owner);
        if (pw && chown(path, pw->pw_uid, pw->pw_gid) != 0)
            log_event(BG_LOG_ERROR, "chown_failed", "path=%s error=%s", log_str(path), log_str(strerror(errno)));
    }
    listen_set_nonblocking(fd);
    return fd;
}

int listen_tcp(const char *addr, const char *port)
{
    struct addrinfo hints, *res, *ai;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int r = getaddrinfo(addr, port, &hints, &res);
    if (r != 0) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s port=%s error=%s", log_str(addr), log_str(port), log_str(gai_strerror(r)));
        errno = EINVAL;
        return BG_IO_ERROR;
    }
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, LISTEN_BACKLOG) == 0) break;
        close(fd);
        fd = -1;
    }
    int err = errno;
    freeaddrinfo(res);
    if (fd < 0) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s port=%s error=%s", log_str(addr), log_str(port), log_str(strerror(err)));
        errno = err;
        return BG_IO_ERROR;
    }
    listen_set_nonblocking(fd);
    return fd;
}

int listen_inherited(void)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    uint64_t pid_n, fds_n;
    if (!pid || !fds || bg_parse_u64(pid, strlen(pid), UINT32_MAX, &pid_n) != 0 ||
        bg_parse_u64(fds, strlen(fds), UINT32_MAX, &fds_n) != 0 || pid_n != (uint64_t)getpid() || fds_n < 1)
        return BG_IO_ERROR;
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return BG_IO_ERROR;
    fcntl(3, F_SETFD, FD_CLOEXEC);
    listen_set_nonblocking(3);
    return 3;
}

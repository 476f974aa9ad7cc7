/* listen.h - listening sockets: TCP, UNIX, and the one systemd passes.
 * Each returns a non-blocking listening fd, or BG_IO_ERROR after a log line
 * that says why (errno is left set). */
#ifndef BEANGATE_LISTEN_H
#define BEANGATE_LISTEN_H

/* Bind and listen on addr:port (TCP, the first address that works). */
int listen_tcp(const char *addr, const char *port);
/* Bind and listen on the UNIX socket `path` (a stale socket file there is
 * replaced; any other file is an error). With `owner` (a user name), the
 * socket file is given to that user, who will own the process (-u). */
int listen_unix(const char *path, const char *owner);
/* The first socket systemd passed (socket activation: LISTEN_PID is us,
 * LISTEN_FDS >= 1, a stream socket at fd 3), or BG_IO_ERROR if there is
 * none (no log line: that is the normal case). */
int listen_inherited(void);
/* Make fd non-blocking: 0 or BG_IO_ERROR. */
int listen_set_nonblocking(int fd);

#endif

/* net.c - TCP and UNIX listeners, and beanstalk connections.
 *
 * A connection reads everything available, lets the codec execute every
 * complete command in it, and writes all replies in one write(). The codec
 * only appends to the output buffer; only this file touches sockets.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <pwd.h>

#include "server.h"
#include "../io/loop.h"
#include "../io/wal.h"
#include "../io/eventlog.h"

struct conn {
    struct bg_session session;   /* first: the codec's view */
    struct server *srv;
    int fd;
    struct event *read_ev, *write_ev;
    struct bg_buf in;            /* bytes not yet consumed by the codec */
    struct conn *prev, *next;    /* srv->conns */
    struct loop_task woken;      /* output came from outside its callback */
    uint64_t mark;               /* replies wait until the log holds this */
    struct wal_hold hold;        /* queued at the log while is_held */
    uint8_t peer_eof, read_paused, is_held;
};

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);
static void conn_write_cb(evutil_socket_t fd, short what, void *arg);

static int conn_run(struct conn *c);

static void conn_output_ready(struct bg_session *s) { net_conn_wake((struct conn *)s->io_owner); }

static void conn_woken(struct loop_task *t)
{
    conn_run((struct conn *)((char *)t - offsetof(struct conn, woken)));
}

static void conn_process_info(struct bg_session *s, struct bg_process_info *pi)
{
    server_process_info(((struct conn *)s->io_owner)->srv, pi);
}

static const struct bg_session_io conn_io = {
    .output_ready = conn_output_ready,
    .process_info = conn_process_info,
};

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static void conn_free(struct conn *c)
{
    struct server *srv = c->srv;
    if (c->is_held) wal_unhold(srv->wal, &c->hold);
    if (c->prev) c->prev->next = c->next; else srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    bg_session_close(&c->session, loop_now());
    loop_cancel(&c->woken); /* after the close, which may have woken c */
    event_free(c->read_ev);
    event_free(c->write_ev);
    close(c->fd);
    bg_buf_free(&c->in);
    free(c);
}

int net_write_out(int fd, struct bg_buf *out, struct event *write_ev)
{
    while (out->len) {
        ssize_t n = write(fd, bg_buf_head(out), out->len);
        if (n > 0) {
            bg_buf_consume(out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(write_ev, NULL);
            return 0;
        }
        return -1;
    }
    event_del(write_ev);
    return 0;
}

int net_read_in(int fd, struct bg_buf *in, size_t chunk, uint8_t *eof)
{
    char *tail = bg_buf_reserve(in, chunk);
    if (!tail) return -1;
    ssize_t n = read(fd, tail, chunk);
    if (n > 0) in->len += (size_t)n;
    else if (n == 0) *eof = 1;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    return 0;
}

/* The log holds what c's replies report: let them go. */
static void conn_durable(struct wal_hold *h)
{
    struct conn *c = (struct conn *)((char *)h - offsetof(struct conn, hold));
    c->is_held = 0;
    net_conn_wake(c);
}

/* Write as much output as the socket takes. 0, or -1 if the peer is gone. */
static int conn_flush(struct conn *c)
{
    struct bg_buf *out = &c->session.out;
    if (c->is_held) return 0;
    if (!wal_reached(c->srv->wal, c->mark)) {
        /* durable replies: nothing goes out before its record is on disk */
        c->is_held = 1;
        wal_hold(c->srv->wal, &c->hold, c->mark, conn_durable);
        if (c->is_held) return 0;
    }
    return net_write_out(c->fd, out, c->write_ev);
}

/* Let the codec run on buffered input, write the replies, and decide whether
 * to keep reading. Frees c and returns -1 when the connection is over. */
static int conn_run(struct conn *c)
{
    struct bg_session *s = &c->session;
    for (;;) {
        size_t used = 0;
        int woke = 0;
        if (c->in.len && s->state != BG_WAITING && s->state != BG_CLOSING) {
            uint64_t before = wal_mark(c->srv->wal);
            used = bg_session_feed(s, bg_buf_head(&c->in), c->in.len, loop_now());
            bg_buf_consume(&c->in, used);
            uint64_t mark = wal_mark(c->srv->wal);
            if (mark > before) c->mark = mark;
        }
        if (c->peer_eof && s->state == BG_WAITING) {
            bg_session_peer_eof(s, loop_now()); /* TIMED_OUT; later commands still run */
            woke = 1;
        }
        if (conn_flush(c) != 0) {
            conn_free(c);
            return -1;
        }
        /* feeding paused at the output limit and the socket took it all:
         * go on with the input already buffered */
        if (!((used || woke) && s->out.len == 0 && c->in.len)) break;
        if (c->is_held) break;
    }
    int done_reading = c->peer_eof && (s->state != BG_WAITING);
    if ((s->state == BG_CLOSING || done_reading) && s->out.len == 0) {
        conn_free(c);
        return -1;
    }
    /* backpressure: a reader that does not read stops being served */
    int pause = s->state == BG_CLOSING || c->peer_eof || s->out.len >= CONN_OUT_HIGH_WATER ||
                c->in.len >= CONN_IN_LIMIT;
    if (pause && !c->read_paused) event_del(c->read_ev);
    if (!pause && c->read_paused) event_add(c->read_ev, NULL);
    c->read_paused = (uint8_t)pause;
    return 0;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    if (net_read_in(fd, &c->in, CONN_READ_CHUNK, &c->peer_eof) != 0) {
        conn_free(c);
        loop_engine_changed();
        return;
    }
    conn_run(c);
    loop_engine_changed();
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_run(arg);
    loop_engine_changed();
}

void net_conn_wake(struct conn *c)
{
    loop_defer(&c->woken);
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct server *srv = arg;
    for (int i = 0; i < 64; i++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) return; /* EAGAIN, or a transient error such as EMFILE */
        set_nonblocking(fd);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (!c || bg_session_init(&srv->engine, &c->session, &conn_io, c) != 0) {
            free(c);
            close(fd);
            continue;
        }
        c->srv = srv;
        c->fd = fd;
        c->woken.run = conn_woken;
        c->session.out_limit = CONN_OUT_HIGH_WATER;
        c->read_ev = event_new(srv->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
        c->write_ev = event_new(srv->base, fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
        c->next = srv->conns;
        if (srv->conns) srv->conns->prev = c;
        srv->conns = c;
        event_add(c->read_ev, NULL);
        log_event(BG_LOG_DEBUG, "accepted", "fd=%d", fd);
    }
}

/* Bind and listen on a UNIX socket path. Returns the fd or -1. */
static int listen_unix(struct server *srv, const char *path, const char *cfg_user)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=\"path too long\"", log_str(path));
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=\"exists and is not a socket\"", log_str(path));
            close(fd);
            return -1;
        }
        unlink(path); /* a stale socket from an earlier run */
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s error=%s", log_str(path), log_str(strerror(errno)));
        close(fd);
        return -1;
    }
    snprintf(srv->unix_path, sizeof srv->unix_path, "%s", path);
    if (cfg_user) {
        /* the socket must belong to the user we become, or it could
         * neither accept its clients' permissions nor remove the file */
        struct passwd *pw = getpwnam(cfg_user);
        if (pw && chown(path, pw->pw_uid, pw->pw_gid) != 0)
            log_event(BG_LOG_ERROR, "chown_failed", "path=%s error=%s", log_str(path), log_str(strerror(errno)));
    }
    return fd;
}

int net_listen_tcp(const char *addr, const char *port)
{
    struct addrinfo hints, *res, *ai;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int r = getaddrinfo(addr, port, &hints, &res);
    if (r != 0) {
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s port=%s error=%s", log_str(addr), log_str(port), log_str(gai_strerror(r)));
        return -1;
    }
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        log_event(BG_LOG_ERROR, "listen_failed", "addr=%s port=%s error=%s", log_str(addr), log_str(port), log_str(strerror(errno)));
    freeaddrinfo(res);
    return fd;
}

/* The first socket systemd passed us (socket activation, the sd_listen_fds
 * protocol: LISTEN_PID is us, LISTEN_FDS >= 1, the socket is fd 3), or -1. */
static int inherited_socket(void)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (!pid || !fds || strtol(pid, NULL, 10) != (long)getpid() || strtol(fds, NULL, 10) < 1) return -1;
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return -1;
    fcntl(3, F_SETFD, FD_CLOEXEC);
    return 3;
}

int net_listen(struct server *srv, const struct server_config *cfg)
{
    int fd = inherited_socket();
    if (fd >= 0) {
        snprintf(srv->listen_desc, sizeof srv->listen_desc, "systemd-fd-3");
    } else fd = strncmp(cfg->listen_addr, "unix:", 5) == 0
                 ? listen_unix(srv, cfg->listen_addr + 5, cfg->user)
                 : net_listen_tcp(cfg->listen_addr, cfg->port);
    if (fd < 0) return -1;
    set_nonblocking(fd);
    srv->listen_fd = fd;
    srv->listen_ev = event_new(srv->base, fd, EV_READ | EV_PERSIST, accept_cb, srv);
    event_add(srv->listen_ev, NULL);
    return 0;
}

void net_shutdown(struct server *srv)
{
    /* stop accepting first, then answer every blocked reserve (TIMED_OUT,
     * as when a waiting client half-closes) and send what can be sent
     * without blocking; reserved jobs go back to ready as the connections
     * close */
    if (srv->listen_ev) event_del(srv->listen_ev);
    for (struct conn *c = srv->conns; c; c = c->next) {
        if (c->session.state == BG_WAITING) bg_session_peer_eof(&c->session, loop_now());
        if (!c->is_held) conn_flush(c);
    }
    while (srv->conns) conn_free(srv->conns);
    if (srv->listen_ev) event_free(srv->listen_ev);
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    if (srv->unix_path[0]) unlink(srv->unix_path);
}

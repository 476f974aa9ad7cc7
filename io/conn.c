/* conn.c - byte-stream connections for every TCP protocol (see conn.h).
 *
 * A connection reads what is available, lets its session execute every
 * complete request in it, and writes all replies in one write(). Sessions
 * only append to their stream's output; only this file touches the
 * sockets of connections.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "eventlog.h"
#include "listen.h"
#include "loop.h"

struct conn_server {
    const struct conn_protocol *proto;
    struct bg_engine *engine;
    struct wal *wal;
    int fd;
    struct event *accept_ev;
    struct conn *conns;          /* every open connection */
    uint64_t count;              /* how many */
};

struct conn {
    struct conn_server *cs;
    struct conn_peer peer;
    struct event *read_ev, *write_ev;
    struct bg_buf in;            /* bytes the session has not consumed */
    struct conn *prev, *next;    /* cs->conns */
    struct loop_task woken;      /* output came from outside its callback */
    uint64_t mark;               /* replies wait until the log holds this */
    struct wal_hold hold;        /* queued at the log while held */
    uint8_t peer_eof, read_paused, held;
    alignas(max_align_t) unsigned char session[]; /* starts with a struct bg_stream */
};

static struct bg_stream *stream_of(struct conn *c) { return (struct bg_stream *)c->session; }

static void conn_run(struct conn *c);

static void conn_free(struct conn *c)
{
    struct conn_server *cs = c->cs;
    /* the session first: closing it may call the engine, which may wake
     * sessions (c among them); c leaves the woken list after that */
    cs->proto->close(stream_of(c), loop_now());
    loop_cancel(&c->woken);
    wal_unhold(cs->wal, &c->hold);
    if (c->prev) c->prev->next = c->next; else cs->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    cs->count--;
    bg_engine_connection_closed(cs->engine);
    event_free(c->read_ev);
    event_free(c->write_ev);
    close(c->peer.fd);
    bg_buf_free(&c->in);
    free(c);
}

/* Write what the socket takes of out; arm the write event if some is
 * left, else disarm it. 0, or BG_IO_ERROR when the peer is gone. */
static int write_out(struct conn *c, struct bg_buf *out)
{
    while (out->len) {
        ssize_t n = write(c->peer.fd, bg_buf_head(out), out->len);
        if (n > 0) {
            bg_buf_consume(out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(c->write_ev, NULL);
            return 0;
        }
        return BG_IO_ERROR;
    }
    event_del(c->write_ev);
    return 0;
}

/* One read() onto c->in; sets peer_eof at the end of the stream. 0, or
 * BG_IO_ERROR on a read error, or BG_OUT_OF_MEMORY. */
static int read_in(struct conn *c)
{
    size_t chunk = c->cs->proto->limits.read_chunk;
    char *tail = bg_buf_reserve(&c->in, chunk);
    if (!tail) return BG_OUT_OF_MEMORY;
    ssize_t n = read(c->peer.fd, tail, chunk);
    if (n > 0) c->in.len += (size_t)n;
    else if (n == 0) c->peer_eof = 1;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return BG_IO_ERROR;
    return 0;
}

/* The log holds what c's replies report: let them go. */
static void conn_durable(struct wal_hold *h)
{
    struct conn *c = (struct conn *)((char *)h - offsetof(struct conn, hold));
    c->held = 0;
    loop_defer(&c->woken);
}

/* Write as much output as the socket takes; nothing while the replies wait
 * for the log. 0, or BG_IO_ERROR if the peer is gone. */
static int conn_flush(struct conn *c)
{
    if (c->held) return 0;
    if (!wal_reached(c->cs->wal, c->mark)) {
        /* durable replies: nothing goes out before its record is on disk */
        c->held = 1;
        wal_hold(c->cs->wal, &c->hold, c->mark, conn_durable);
        if (c->held) return 0;
    }
    return write_out(c, &stream_of(c)->out);
}

/* Let the session run on buffered input, write the replies, and decide
 * whether to keep reading. Frees c when the connection is over. */
static void conn_run(struct conn *c)
{
    const struct conn_protocol *p = c->cs->proto;
    struct bg_stream *s = stream_of(c);
    if (s->overflow) {
        char event[32];
        snprintf(event, sizeof event, "%sdropped", p->event_prefix);
        log_event(BG_LOG_WARN, event, "protocol=%s fd=%d peer=%s reason=output_limit", p->name, c->peer.fd,
                  c->peer.addr);
        conn_free(c);
        return;
    }
    for (;;) {
        size_t used = 0;
        int woke = 0;
        if (c->in.len && !s->blocked && !s->closing) {
            uint64_t before = wal_mark(c->cs->wal);
            used = p->feed(s, bg_buf_head(&c->in), c->in.len, loop_now());
            bg_buf_consume(&c->in, used);
            uint64_t mark = wal_mark(c->cs->wal);
            if (mark > before) c->mark = mark;
        }
        if (c->peer_eof && s->blocked && p->peer_eof) {
            p->peer_eof(s, loop_now()); /* e.g. TIMED_OUT; later requests still run */
            woke = 1;
        }
        if (conn_flush(c) != 0) {
            conn_free(c);
            return;
        }
        /* feeding paused at the output limit and the socket took it all:
         * go on with the input already buffered */
        if (!((used || woke) && s->out.len == 0 && c->in.len)) break;
        if (c->held) break;
    }
    int done_reading = c->peer_eof && !s->blocked;
    if ((s->closing || done_reading) && s->out.len == 0) {
        conn_free(c);
        return;
    }
    /* back-pressure: a peer that does not read its replies is not served */
    int pause = s->closing || c->peer_eof || s->out.len >= p->limits.out_limit ||
                c->in.len >= p->limits.in_limit;
    if (pause && !c->read_paused) event_del(c->read_ev);
    if (!pause && c->read_paused) event_add(c->read_ev, NULL);
    c->read_paused = (uint8_t)pause;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn *c = arg;
    if (read_in(c) != 0) conn_free(c);
    else conn_run(c);
    loop_engine_changed();
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    conn_run(arg);
    loop_engine_changed();
}

static void conn_woken(struct loop_task *t)
{
    conn_run((struct conn *)((char *)t - offsetof(struct conn, woken)));
}

static void stream_output_ready(struct bg_stream *s) { loop_defer(&((struct conn *)s->owner)->woken); }

/* The peer's address as text ("-" when it has none: a UNIX socket). */
static void peer_address(const struct sockaddr_storage *sa, char out[INET6_ADDRSTRLEN])
{
    const void *addr = sa->ss_family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                     : sa->ss_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                     : NULL;
    if (!addr || !inet_ntop(sa->ss_family, addr, out, INET6_ADDRSTRLEN)) strcpy(out, "-");
}

/* Make a connection of an accepted socket. */
static void conn_open(struct conn_server *cs, int fd, const struct sockaddr_storage *sa)
{
    const struct conn_protocol *p = cs->proto;
    listen_set_nonblocking(fd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct conn *c = calloc(1, sizeof *c + p->session_size);
    if (!c) {
        close(fd);
        return;
    }
    c->cs = cs;
    c->peer.fd = fd;
    peer_address(sa, c->peer.addr);
    struct bg_stream *s = stream_of(c);
    if (p->open(p->ctx, s, &c->peer, loop_now()) != 0) {
        free(c);
        close(fd);
        return;
    }
    s->out_limit = p->limits.out_limit;
    s->out_max = p->limits.out_max;
    s->output_ready = stream_output_ready;
    s->owner = c;
    c->woken.run = conn_woken;
    c->read_ev = event_new(loop_base(), fd, EV_READ | EV_PERSIST, conn_read_cb, c);
    c->write_ev = event_new(loop_base(), fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
    c->next = cs->conns;
    if (cs->conns) cs->conns->prev = c;
    cs->conns = c;
    cs->count++;
    bg_engine_connection_opened(cs->engine);
    event_add(c->read_ev, NULL);
    if (log_enabled(BG_LOG_DEBUG)) {
        char event[32];
        snprintf(event, sizeof event, "%saccepted", p->event_prefix);
        log_event(BG_LOG_DEBUG, event, "protocol=%s fd=%d peer=%s", p->name, fd, c->peer.addr);
    }
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    for (int i = 0; i < CONN_ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        memset(&sa, 0, sizeof sa);
        int fd = accept(lfd, (struct sockaddr *)&sa, &len);
        if (fd < 0) return; /* EAGAIN, or a transient error such as EMFILE */
        conn_open(arg, fd, &sa);
    }
}

int conn_server_start(struct conn_server **out, const struct conn_protocol *p, int fd,
                      struct bg_engine *e, struct wal *w)
{
    struct conn_server *cs = calloc(1, sizeof *cs);
    if (!cs) return BG_OUT_OF_MEMORY;
    cs->proto = p;
    cs->engine = e;
    cs->wal = w;
    cs->fd = fd;
    cs->accept_ev = event_new(loop_base(), fd, EV_READ | EV_PERSIST, accept_cb, cs);
    if (!cs->accept_ev) {
        free(cs);
        return BG_OUT_OF_MEMORY;
    }
    event_add(cs->accept_ev, NULL);
    *out = cs;
    return 0;
}

void conn_server_pause(struct conn_server *cs) { event_del(cs->accept_ev); }

int conn_server_fd(const struct conn_server *cs) { return cs->fd; }

uint64_t conn_server_count(const struct conn_server *cs) { return cs->count; }

void conn_server_stop(struct conn_server *cs)
{
    if (!cs) return;
    /* stop accepting first, then answer every blocked session (as when its
     * peer half-closes) and send what can be sent without blocking;
     * reservations go back to ready as the sessions close */
    event_del(cs->accept_ev);
    for (struct conn *c = cs->conns; c; c = c->next) {
        struct bg_stream *s = stream_of(c);
        if (s->blocked && cs->proto->peer_eof) cs->proto->peer_eof(s, loop_now());
        conn_flush(c);
    }
    while (cs->conns) conn_free(cs->conns);
    event_free(cs->accept_ev);
    close(cs->fd);
    free(cs);
}

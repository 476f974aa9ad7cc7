/* conn.c - byte-stream connections for every TCP protocol (see conn.h).
 *
 * A connection reads what is available, lets its session execute every
 * complete request in it, and writes all replies in one write(). Sessions
 * only append to their stream's output; only this file touches the
 * sockets of connections.
 *
 * Deadlines: every connection of a server that has a request deadline or
 * an idle timeout is on at most one of two queues, each ordered by
 * deadline because every deadline on it is `now + the same timeout` taken
 * when the connection moved to its tail. One timer per server is armed at
 * the earliest head; it closes what is due and re-arms itself.
 *
 * TLS (a server started with a tls_listener): a connection first does its
 * handshake (tls_handshake_cb, on the handshake queue's deadline), then the
 * protocol's session opens and everything above goes on, with
 * gnutls_record_recv / gnutls_record_send in place of read / write. The
 * plain path pays one branch on c->tls per read and per write.
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "eventlog.h"
#include "loop.h"

#define ACCEPT_PAUSE_MIN (100 * (BG_SECOND / 1000)) /* first pause at the open-file limit */
#define ACCEPT_PAUSE_MAX BG_SECOND                 /* it doubles up to this */
#define LOG_INTERVAL (10 * BG_SECOND)              /* one line per kind of event at most */
#define SHARED_OUT_KEEP (1u << 20)                 /* the reply buffer shrinks back above this */
#define TLS_HANDSHAKE_RECORD 0x16                  /* the first byte of a TLS client's first record */

/* QUEUE_HANDSHAKE: TLS connections whose handshake is not done, due after
 * the request deadline (or CONN_TLS_HANDSHAKE_TIMEOUT without one). */
enum { QUEUE_NONE, QUEUE_REQUEST, QUEUE_IDLE, QUEUE_HANDSHAKE, QUEUE_COUNT };

struct conn;

/* Connections with a deadline, the earliest first (see the top). */
struct conn_queue {
    struct conn *head, *tail;
    bg_time timeout;
};

struct conn_server {
    const struct conn_protocol *proto;
    struct bg_engine *engine;
    struct wal *wal;
    struct tls_listener *tls;    /* NULL: plain TCP */
    int fd;
    struct event *accept_ev;
    struct event *resume_ev;     /* accepting again after a pause at the fd limit */
    struct event *deadline_ev;   /* at the earliest deadline of the queues */
    bg_time deadline_at;         /* when deadline_ev fires; 0: not armed */
    bg_time accept_pause;        /* the last pause at the fd limit; 0: accepting */
    uint8_t paused;              /* conn_server_pause: no more accepts */
    struct conn_queue queues[QUEUE_COUNT];
    struct conn *conns;          /* every open connection */
    uint64_t count;              /* how many */
    struct conn_server *next_server;
    struct log_limit accept_log;
    struct log_limit tls_log;    /* TLS connections refused or failed */
};

/* How many connections come from one address (--max-connections-per-ip). */
struct addr_count {
    struct addr_count *next;
    uint32_t count;
    uint8_t len;                 /* 4 or 16 */
    uint8_t addr[16];
};

struct conn {
    struct conn_server *cs;
    struct conn_peer peer;
    struct event *read_ev, *write_ev; /* write_ev: made at the first short write */
    struct bg_buf in;            /* bytes the session has not consumed */
    struct conn *prev, *next;    /* cs->conns */
    struct conn *q_prev, *q_next; /* the deadline queue it is on */
    bg_time deadline;
    struct addr_count *addr;     /* its address's count, or NULL */
    struct loop_task woken;      /* output came from outside its callback */
    uint64_t mark;               /* the log position its output depends on (io/wal.h) */
    struct wal_hold hold;        /* queued at the log while held */
    uint8_t peer_eof, read_paused, held, queue;
    uint8_t was_read, consumed, wrote; /* this callback: bytes read, consumed, written */
    uint8_t phase;               /* the stream's phase when last scheduled */
    size_t out_counted;          /* its own output's bytes as counted in shared.replies.held */
    gnutls_session_t tls;        /* NULL: plain TCP */
    uint8_t handshaking;         /* TLS: the session is not open yet */
    uint8_t tls_resend;          /* TLS: the last send was GNUTLS_E_AGAIN: finish it first */
    uint8_t tls_first_seen;      /* TLS: the first byte began a handshake record */
    struct tls_identity *identity; /* the client certificate's names, or NULL */
    alignas(max_align_t) unsigned char session[]; /* starts with a struct bg_stream */
};

/* ---- what every listener shares ----------------------------------------- */

static struct {
    struct conn_config cfg;
    struct conn_counters counters;
    struct conn_server *servers;
    struct log_limit reason_log[CONN_REASON_COUNT];
    struct addr_count **buckets; /* keyed by bg_siphash under cfg.hash_key */
    size_t mask, addrs;
    char in[CONN_READ_CHUNK];    /* every read() lands here first */
    struct bg_buf out;           /* replies are built here while a connection has none pending */
    struct bg_reply_budget replies; /* the connections' own output, all of them (--max-reply-memory) */
} shared;

static const char *const reason_names[CONN_REASON_COUNT] = {
    "max_connections", "max_connections_per_ip", "request_timeout", "idle_timeout", "output_limit",
};

const char *conn_reason_name(enum conn_reason r) { return r < CONN_REASON_COUNT ? reason_names[r] : "-"; }

void conn_configure(const struct conn_config *cfg)
{
    shared.cfg = *cfg;
    shared.replies.max = cfg->max_reply_memory;
}

void conn_get_counters(struct conn_counters *out)
{
    *out = shared.counters;
    out->reply_memory = shared.replies.held;
    out->replies_refused = shared.replies.refused;
}

/* c's own output buffer now takes len bytes (its room, not only what is
 * unsent): bring the budget's count up to date. */
static void count_output(struct conn *c, size_t len)
{
    shared.replies.held = shared.replies.held - c->out_counted + len;
    c->out_counted = len;
}

/* Count a refusal or a close for `why`; log it (debug: each one; warn: at
 * most one line per LOG_INTERVAL and reason, with how many were not). */
static void note_limit(const struct conn_protocol *p, enum conn_reason why, int fd, const char *peer)
{
    shared.counters.closed[why]++;
    char event[40];
    snprintf(event, sizeof event, "%s%s", p->event_prefix,
             why <= CONN_MAX_PER_IP ? "refused" : "dropped");
    unsigned long long held;
    if (log_limit_pass(&shared.reason_log[why], loop_now(), LOG_INTERVAL, &held))
        log_event(BG_LOG_WARN, event, "protocol=%s reason=%s fd=%d peer=%s not_logged=%llu", p->name,
                  reason_names[why], fd, peer, held);
    else if (log_enabled(BG_LOG_DEBUG))
        log_event(BG_LOG_DEBUG, event, "protocol=%s reason=%s fd=%d peer=%s", p->name, reason_names[why],
                  fd, peer);
}

/* The address of sa as bytes (an IPv4-mapped IPv6 address as IPv4): its
 * length, or 0 when it has none (a UNIX socket). */
static size_t addr_bytes(const struct sockaddr_storage *sa, uint8_t out[16])
{
    if (sa->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 4;
    }
    if (sa->ss_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
        memcpy(out, a->s6_addr + 12, 4);
        return 4;
    }
    memcpy(out, a->s6_addr, 16);
    return 16;
}

/* The slot of addr's entry in the per-address table (*slot NULL: none). */
static struct addr_count **addr_slot(const uint8_t *addr, size_t len)
{
    struct addr_count **slot = &shared.buckets[bg_siphash(shared.cfg.hash_key, addr, len) & shared.mask];
    while (*slot && !((*slot)->len == len && memcmp((*slot)->addr, addr, len) == 0)) slot = &(*slot)->next;
    return slot;
}

/* Double the per-address table (it starts at 64 buckets). 0 or BG_OUT_OF_MEMORY. */
static int addr_table_grow(void)
{
    size_t n = shared.buckets ? (shared.mask + 1) * 2 : 64;
    struct addr_count **b = calloc(n, sizeof *b);
    if (!b) return BG_OUT_OF_MEMORY;
    struct addr_count **old = shared.buckets;
    size_t old_n = old ? shared.mask + 1 : 0;
    shared.buckets = b;
    shared.mask = n - 1;
    for (size_t i = 0; i < old_n; i++)
        for (struct addr_count *a = old[i], *next; a; a = next) {
            next = a->next;
            struct addr_count **slot = addr_slot(a->addr, a->len);
            a->next = *slot;
            *slot = a;
        }
    free(old);
    return 0;
}

/* May a connection from sa be opened? 1 (*entry: its address's count, to
 * take one of, or NULL), or 0 with *why set. */
static int admit(const struct sockaddr_storage *sa, struct addr_count **entry, enum conn_reason *why)
{
    *entry = NULL;
    *why = CONN_MAX_CONNECTIONS;
    if (shared.cfg.max_connections && shared.counters.open >= shared.cfg.max_connections) return 0;
    *why = CONN_MAX_PER_IP;
    uint8_t addr[16];
    size_t len = shared.cfg.max_per_ip ? addr_bytes(sa, addr) : 0;
    if (!len) return 1;
    if (shared.addrs >= (shared.buckets ? shared.mask + 1 : 0) && addr_table_grow() != 0 && !shared.buckets)
        return 0; /* no table at all: cannot count, so refuse */
    struct addr_count **slot = addr_slot(addr, len);
    if (!*slot) {
        struct addr_count *a = calloc(1, sizeof *a);
        if (!a) return 0;
        a->len = (uint8_t)len;
        memcpy(a->addr, addr, len);
        *slot = a;
        shared.addrs++;
    }
    if ((*slot)->count >= shared.cfg.max_per_ip) return 0;
    *entry = *slot;
    return 1;
}

/* Give back a connection's count of its address (an entry admit made for
 * a connection that was not opened has a count of 0): the entry goes with
 * the last one. NULL: nothing. */
static void addr_unref(struct addr_count *a)
{
    if (!a) return;
    if (a->count) a->count--;
    if (a->count) return;
    struct addr_count **slot = addr_slot(a->addr, a->len);
    *slot = a->next;
    free(a);
    shared.addrs--;
}

/* ---- deadlines ----------------------------------------------------------- */

static struct bg_stream *stream_of(struct conn *c) { return (struct bg_stream *)c->session; }

static void queue_leave(struct conn *c)
{
    if (c->queue == QUEUE_NONE) return;
    struct conn_queue *q = &c->cs->queues[c->queue];
    if (c->q_prev) c->q_prev->q_next = c->q_next; else q->head = c->q_next;
    if (c->q_next) c->q_next->q_prev = c->q_prev; else q->tail = c->q_prev;
    c->q_prev = c->q_next = NULL;
    c->queue = QUEUE_NONE;
}

/* Put c at the tail of queue `which`, due at now + its timeout, and make
 * sure the server's timer fires by then. */
static void queue_join(struct conn *c, int which, bg_time now)
{
    struct conn_server *cs = c->cs;
    struct conn_queue *q = &cs->queues[which];
    queue_leave(c);
    c->queue = (uint8_t)which;
    c->deadline = now + q->timeout;
    c->q_prev = q->tail;
    if (q->tail) q->tail->q_next = c; else q->head = c;
    q->tail = c;
    if (cs->deadline_at == 0 || c->deadline < cs->deadline_at) {
        bg_time in = c->deadline > now ? c->deadline - now : 0;
        struct timeval tv = {(time_t)(in / BG_SECOND), (suseconds_t)(in % BG_SECOND / 1000) + 1};
        event_add(cs->deadline_ev, &tv);
        cs->deadline_at = c->deadline;
    }
}

/* Which queue c belongs on after a callback, and move it there: a request
 * begun and not complete has a deadline; a connection with nothing to do
 * may be idle; a session that waits for the server, replies held for the
 * log and a closing connection have none. */
static void conn_schedule(struct conn *c)
{
    struct conn_server *cs = c->cs;
    const struct conn_protocol *p = cs->proto;
    struct bg_stream *s = stream_of(c);
    int was_read = c->was_read, consumed = c->consumed, active = was_read || c->wrote;
    c->was_read = c->consumed = c->wrote = 0;
    int stuck = s->out.len >= p->limits.out_limit; /* the peer does not read its replies */
    int which = QUEUE_NONE;
    if (c->held || s->closing || c->peer_eof)
        which = QUEUE_NONE;
    else if (!stuck && !s->blocked && (s->phase != BG_PHASE_NONE || c->in.len))
        which = QUEUE_REQUEST;
    else if (!s->blocked && !(p->waiting && p->waiting(s)))
        which = QUEUE_IDLE;
    if (!cs->queues[which].timeout) which = QUEUE_NONE;
    if (which == QUEUE_NONE) {
        queue_leave(c);
        return;
    }
    /* the clock starts again: entering the queue or a phase (a line that
     * turns out over-long, a body); a request completed (a new one may have
     * begun); body bytes came in; any traffic while idle. Bytes of an
     * over-long line that are thrown away do not count. */
    int phase = s->phase;
    int restart = c->queue != which || (which == QUEUE_IDLE && active) ||
                  (which == QUEUE_REQUEST && (phase != c->phase || (phase == BG_PHASE_NONE && consumed) ||
                                              (phase == BG_PHASE_BODY && (consumed || was_read))));
    c->phase = (uint8_t)phase;
    if (restart) queue_join(c, which, loop_now());
}

static void conn_drop(struct conn *c, enum conn_reason why);

/* The earliest deadline came: close what is due, re-arm for the next. */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn_server *cs = arg;
    bg_time now = loop_now();
    cs->deadline_at = 0;
    bg_time next = 0;
    for (int q = QUEUE_REQUEST; q < QUEUE_COUNT; q++) {
        struct conn *c;
        while ((c = cs->queues[q].head) && c->deadline <= now)
            conn_drop(c, q == QUEUE_IDLE ? CONN_IDLE_TIMEOUT : CONN_REQUEST_TIMEOUT);
        if (c && (!next || c->deadline < next)) next = c->deadline;
    }
    if (next) {
        bg_time in = next - now;
        struct timeval tv = {(time_t)(in / BG_SECOND), (suseconds_t)(in % BG_SECOND / 1000) + 1};
        event_add(cs->deadline_ev, &tv);
        cs->deadline_at = next;
    }
    loop_engine_changed();
}

/* ---- accepting ----------------------------------------------------------- */

/* Accept again on every server that paused at the open-file limit (a
 * descriptor was just freed). */
static void accept_resume_all(void)
{
    for (struct conn_server *cs = shared.servers; cs; cs = cs->next_server)
        if (cs->accept_pause && !cs->paused) {
            event_del(cs->resume_ev);
            event_add(cs->accept_ev, NULL);
        }
}

/* accept() failed for want of descriptors or memory: stop accepting for a
 * while (100 ms, doubling up to 1 s, or until a connection closes),
 * instead of being woken again at once for the same pending connection. */
static void accept_pause(struct conn_server *cs, int err)
{
    event_del(cs->accept_ev);
    cs->accept_pause = cs->accept_pause ? cs->accept_pause * 2 : ACCEPT_PAUSE_MIN;
    if (cs->accept_pause > ACCEPT_PAUSE_MAX) cs->accept_pause = ACCEPT_PAUSE_MAX;
    struct timeval tv = {(time_t)(cs->accept_pause / BG_SECOND),
                         (suseconds_t)(cs->accept_pause % BG_SECOND / 1000)};
    event_add(cs->resume_ev, &tv);
    shared.counters.accept_paused++;
    unsigned long long held;
    if (log_limit_pass(&cs->accept_log, loop_now(), LOG_INTERVAL, &held))
        log_event(BG_LOG_WARN, "accept_paused", "protocol=%s error=%s pause_ms=%llu not_logged=%llu "
                  "msg=\"at the open-file limit: raise it (ulimit -n, LimitNOFILE) or lower --max-connections\"",
                  cs->proto->name, log_str(strerror(err)),
                  (unsigned long long)(cs->accept_pause / (BG_SECOND / 1000)), held);
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn_server *cs = arg;
    if (!cs->paused) event_add(cs->accept_ev, NULL);
}

/* ---- a connection ------------------------------------------------------- */

static void conn_run(struct conn *c);

static void conn_free(struct conn *c)
{
    struct conn_server *cs = c->cs;
    count_output(c, 0);
    /* the session first: closing it may call the engine, which may wake
     * sessions (c among them); c leaves the woken list after that. A TLS
     * connection still in its handshake has no session yet. */
    if (!c->handshaking) cs->proto->close(stream_of(c), loop_now());
    loop_cancel(&c->woken);
    wal_unhold(cs->wal, &c->hold);
    queue_leave(c);
    if (c->prev) c->prev->next = c->next; else cs->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    cs->count--;
    shared.counters.open--;
    addr_unref(c->addr);
    bg_engine_connection_closed(cs->engine);
    event_free(c->read_ev);
    if (c->write_ev) event_free(c->write_ev);
    if (c->tls) {
        /* best effort: one try at a close_notify, never waiting */
        if (!c->handshaking) gnutls_bye(c->tls, GNUTLS_SHUT_WR);
        gnutls_deinit(c->tls);
        free(c->identity);
    }
    close(c->peer.fd);
    bg_buf_free(&c->in);
    free(c);
    accept_resume_all();
}

/* The peer went away or broke the stream: routine, logged at debug. */
static void conn_lost(struct conn *c, const char *why)
{
    if (log_enabled(BG_LOG_DEBUG)) {
        char event[32];
        snprintf(event, sizeof event, "%sclosed", c->cs->proto->event_prefix);
        log_event(BG_LOG_DEBUG, event, "protocol=%s fd=%d peer=%s reason=%s", c->cs->proto->name, c->peer.fd,
                  c->peer.addr, why);
    }
    conn_free(c);
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg);

void conn_list_client(struct bg_client *c, enum bg_client_protocol p, const struct conn_peer *peer,
                      void (*close_now)(struct bg_client *c, bg_time now), bg_time now)
{
    struct bg_client_entry *x = bg_client_list(c, p, now);
    if (!x) return;
    x->tls = peer->tls != 0;
    x->close_now = close_now;
    if (peer->port) /* a UNIX socket's peer has no address */
        snprintf(x->peer, sizeof x->peer, strchr(peer->addr, ':') ? "[%s]:%u" : "%s:%u", peer->addr,
                 (unsigned)peer->port);
}

void conn_close_stream(struct bg_stream *s)
{
    conn_lost(s->owner, "closed_by_api");
    loop_engine_changed(); /* jobs came back: waiters and timers */
}

/* gnutls_record_send as write(): bytes sent, or -1 with errno EAGAIN,
 * EINTR or EPIPE. After GNUTLS_E_AGAIN GnuTLS holds the record it made:
 * the next call finishes that one (NULL, 0) and reports its bytes, which
 * are still the head of the caller's buffer. */
static ssize_t tls_send(struct conn *c, const void *data, size_t len)
{
    ssize_t n = c->tls_resend ? gnutls_record_send(c->tls, NULL, 0) : gnutls_record_send(c->tls, data, len);
    c->tls_resend = n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED;
    if (n >= 0) return n;
    errno = n == GNUTLS_E_AGAIN ? EAGAIN : n == GNUTLS_E_INTERRUPTED ? EINTR : EPIPE;
    return -1;
}

/* gnutls_record_recv as read(): bytes, 0 at the end of the stream (a
 * close_notify, or the TCP end without one), or -1 with errno EAGAIN or
 * EINTR (try later), or EPROTO: broken, or a renegotiation (refused). */
static ssize_t tls_recv(struct conn *c, void *data, size_t len)
{
    ssize_t n = gnutls_record_recv(c->tls, data, len);
    if (n >= 0) return n;
    if (n == GNUTLS_E_PREMATURE_TERMINATION) return 0;
    errno = n == GNUTLS_E_AGAIN ? EAGAIN
          : n != GNUTLS_E_REHANDSHAKE && !gnutls_error_is_fatal((int)n) ? EINTR : EPROTO;
    if (errno == EPROTO && log_enabled(BG_LOG_DEBUG))
        log_event(BG_LOG_DEBUG, "tls_error", "protocol=%s fd=%d peer=%s error=%s", c->cs->proto->name,
                  c->peer.fd, c->peer.addr, log_str(gnutls_strerror((int)n)));
    return -1;
}

/* Write what the socket takes of out; arm the write event if some is
 * left, else disarm it. 0, or BG_IO_ERROR when the peer is gone (or the
 * write event cannot be made). */
static int write_out(struct conn *c, struct bg_buf *out)
{
    while (out->len) {
        ssize_t n = c->tls ? tls_send(c, bg_buf_head(out), out->len) : write(c->peer.fd, bg_buf_head(out), out->len);
        if (n > 0) {
            bg_buf_consume(out, (size_t)n);
            c->wrote = 1;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!c->write_ev)
                c->write_ev = event_new(loop_base(), c->peer.fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
            if (!c->write_ev) return BG_IO_ERROR;
            event_add(c->write_ev, NULL);
            return 0;
        }
        return BG_IO_ERROR;
    }
    if (c->write_ev) event_del(c->write_ev);
    return 0;
}

/* The layer closes c for `why`: the protocol's last word, what can be
 * written at once, then close. */
static void conn_drop(struct conn *c, enum conn_reason why)
{
    struct bg_stream *s = stream_of(c);
    note_limit(c->cs->proto, why, c->peer.fd, c->peer.addr);
    if (why != CONN_OUTPUT_LIMIT && c->cs->proto->limit_hit && !c->handshaking) {
        c->cs->proto->limit_hit(s, why, loop_now());
        if (!c->held) write_out(c, &s->out);
    }
    conn_free(c);
}

/* One read() into the shared buffer: how many bytes (0 at the end of the
 * stream, which sets peer_eof, or when nothing was there), or BG_IO_ERROR. */
static ssize_t read_in(struct conn *c)
{
    size_t room = sizeof shared.in;
    size_t in_max = c->cs->proto->limits.in_max;
    /* what the session does not consume is kept: never more than in_max */
    if (in_max > c->in.len && in_max - c->in.len < room) room = in_max - c->in.len;
    ssize_t n = c->tls ? tls_recv(c, shared.in, room) : read(c->peer.fd, shared.in, room);
    if (n > 0) {
        c->was_read = 1;
        return n;
    }
    if (n == 0) c->peer_eof = 1;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return BG_IO_ERROR;
    return 0;
}

/* c's output now also depends on what the engine noted for the change
 * just made (engine->reply_pos). */
static void note_position(struct conn *c)
{
    uint64_t pos = c->cs->engine->reply_pos;
    if (pos > c->mark) c->mark = pos;
}

/* Let the session run on in[0..len): the bytes consumed (none while it is
 * blocked or closing). Notes the log position its replies depend on. */
static size_t feed(struct conn *c, const char *in, size_t len)
{
    struct bg_stream *s = stream_of(c);
    if (!len || s->blocked || s->closing) return 0;
    c->cs->engine->reply_pos = 0;
    size_t used = c->cs->proto->feed(s, in, len, loop_now());
    note_position(c);
    if (used) c->consumed = 1;
    return used;
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
    if (!wal_reply_may_go(c->cs->wal, c->mark)) {
        /* durable replies: nothing goes out before its record is on disk */
        c->held = 1;
        wal_hold(c->cs->wal, &c->hold, c->mark, conn_durable);
        if (c->held) return 0;
    }
    return write_out(c, &stream_of(c)->out);
}

/* While a connection has no output pending, its replies are built in the
 * shared buffer: 1 if c now uses it (give it back with own_output). */
static int borrow_output(struct conn *c)
{
    struct bg_stream *s = stream_of(c);
    if (s->out.data) return 0;
    s->out = shared.out;
    shared.out = (struct bg_buf){0};
    return 1;
}

/* Give the shared buffer back; what the socket did not take is copied into
 * c's own buffer. 0, or BG_OUT_OF_MEMORY (replies lost: close). */
static int own_output(struct conn *c)
{
    struct bg_stream *s = stream_of(c);
    struct bg_buf own = {0};
    int rc = s->out.len ? bg_buf_append(&own, bg_buf_head(&s->out), s->out.len) : 0;
    shared.out = s->out;
    bg_buf_clear(&shared.out);
    if (shared.out.cap > SHARED_OUT_KEEP) bg_buf_free(&shared.out); /* a huge stats reply */
    s->out = own;
    return rc;
}

/* Let the session run on buffered input, write the replies, and decide
 * whether to keep reading. Frees c when the connection is over. fresh:
 * bytes just read into the shared buffer (only when c->in is empty: fed
 * from there, the rest kept in c->in), else NULL. */
static void conn_run_fresh(struct conn *c, const char *fresh, size_t fresh_len)
{
    const struct conn_protocol *p = c->cs->proto;
    struct bg_stream *s = stream_of(c);
    if (s->overflow) {
        conn_drop(c, CONN_OUTPUT_LIMIT);
        return;
    }
    int borrowed = borrow_output(c);
    if (fresh_len) {
        size_t used = feed(c, fresh, fresh_len);
        if (used < fresh_len && bg_buf_append(&c->in, fresh + used, fresh_len - used) != 0) {
            if (borrowed) own_output(c);
            conn_lost(c, "out_of_memory");
            return;
        }
    }
    int gone = 0;
    for (;;) {
        int full = s->out.len >= p->limits.out_limit; /* the feed stops at once */
        size_t used = feed(c, bg_buf_head(&c->in), c->in.len);
        bg_buf_consume(&c->in, used);
        int woke = 0;
        if (c->peer_eof && s->blocked && p->peer_eof) {
            p->peer_eof(s, loop_now()); /* e.g. TIMED_OUT; later requests still run */
            woke = 1;
        }
        if (conn_flush(c) != 0) {
            gone = 1;
            break;
        }
        /* feeding paused at the output limit and the socket took it all:
         * go on with the input already buffered */
        if (!((used || woke || full) && s->out.len == 0 && c->in.len)) break;
        if (c->held) break;
    }
    bg_buf_shrink(&c->in); /* freed once empty, cut once mostly consumed */
    if (borrowed && own_output(c) != 0) gone = 1;
    if (!borrowed) bg_buf_shrink(&s->out);
    count_output(c, s->out.cap);
    if (gone) {
        conn_lost(c, "write_failed");
        return;
    }
    int done_reading = c->peer_eof && !s->blocked;
    if ((s->closing || done_reading) && s->out.len == 0) {
        conn_lost(c, s->closing ? "quit" : "peer_closed");
        return;
    }
    /* back-pressure: a peer that does not read its replies is not served */
    int pause = s->closing || c->peer_eof || s->out.len >= p->limits.out_limit ||
                c->in.len >= p->limits.in_max;
    if (pause && !c->read_paused) event_del(c->read_ev);
    if (!pause && c->read_paused) event_add(c->read_ev, NULL);
    c->read_paused = (uint8_t)pause;
    /* bytes GnuTLS already decrypted do not make the socket readable */
    if (c->tls && !pause && gnutls_record_check_pending(c->tls)) event_active(c->read_ev, EV_READ, 0);
    conn_schedule(c);
}

static void conn_run(struct conn *c) { conn_run_fresh(c, NULL, 0); }

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn *c = arg;
    ssize_t n = read_in(c);
    if (n < 0) {
        conn_lost(c, "read_error");
    } else if (n > 0 && c->in.len) {
        if (bg_buf_append(&c->in, shared.in, (size_t)n) != 0) conn_lost(c, "out_of_memory");
        else conn_run(c);
    } else {
        conn_run_fresh(c, shared.in, (size_t)n);
    }
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

/* Output came from outside c's feed (a wait ended inside another request,
 * or on a timer): it depends on what the engine noted meanwhile. */
static void stream_output_ready(struct bg_stream *s)
{
    struct conn *c = s->owner;
    note_position(c);
    loop_defer(&c->woken);
}

void conn_peer_address(struct conn_peer *peer, const struct sockaddr *sa)
{
    int family = sa ? sa->sa_family : AF_UNSPEC;
    const void *addr = family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                     : family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                     : NULL;
    if (!addr || !inet_ntop(family, addr, peer->addr, sizeof peer->addr)) strcpy(peer->addr, "-");
    peer->port = family == AF_INET ? ntohs(((const struct sockaddr_in *)sa)->sin_port)
               : family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)sa)->sin6_port)
               : 0;
}

/* The session is open: the stream takes the layer's limits and hooks. */
static void stream_attach(struct conn *c)
{
    const struct conn_protocol *p = c->cs->proto;
    struct bg_stream *s = stream_of(c);
    s->out_limit = p->limits.out_limit;
    s->out_max = p->limits.out_max;
    if (shared.replies.max) s->budget = &shared.replies;
    s->output_ready = stream_output_ready;
    s->owner = c;
    c->woken.run = conn_woken;
}

/* A TLS connection refused or failed before its session opened: logged
 * (warn: one line per LOG_INTERVAL per server; debug: each), then closed. */
static void tls_refuse(struct conn *c, const char *reason, const char *error)
{
    const struct conn_protocol *p = c->cs->proto;
    char event[40];
    snprintf(event, sizeof event, "%stls_refused", p->event_prefix);
    unsigned long long held;
    if (log_limit_pass(&c->cs->tls_log, loop_now(), LOG_INTERVAL, &held))
        log_event(BG_LOG_WARN, event, "protocol=%s reason=%s error=%s fd=%d peer=%s not_logged=%llu", p->name,
                  reason, log_str(error), c->peer.fd, c->peer.addr, held);
    else if (log_enabled(BG_LOG_DEBUG))
        log_event(BG_LOG_DEBUG, event, "protocol=%s reason=%s error=%s fd=%d peer=%s", p->name, reason,
                  log_str(error), c->peer.fd, c->peer.addr);
    conn_free(c);
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);

/* The handshake is done: name the peer, open the session, and read as a
 * plain connection does from now on. */
static void tls_established(struct conn *c)
{
    const struct conn_protocol *p = c->cs->proto;
    /* acknowledge the client's last flight now: a client with Nagle on
     * holds its first request until then, and the kernel's delayed ACK
     * would cost it 40 ms (nothing else goes back after a TLS 1.3
     * client's Finished) */
    int one = 1;
    setsockopt(c->peer.fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    struct tls_identity id;
    tls_session_identity(c->tls, &id);
    c->peer.tls = 1; /* the session's scope: a TLS peer without a certificate is not plain TCP */
    if (id.count && (c->identity = malloc(sizeof id))) {
        *c->identity = id;
        c->peer.identity = c->identity;
    }
    if (id.count && !c->identity) {
        conn_lost(c, "out_of_memory");
        return;
    }
    if (p->open(p->ctx, stream_of(c), &c->peer, loop_now()) != 0) {
        conn_lost(c, "open_failed"); /* still handshaking: no session to close */
        return;
    }
    c->handshaking = 0;
    stream_attach(c);
    if (log_enabled(BG_LOG_DEBUG)) {
        char names[512] = ""; /* the names, space-separated (they have no spaces); cut at 511 bytes */
        size_t used = 0;
        for (size_t i = 0; i < id.count && used < sizeof names - 1; i++) {
            int n = snprintf(names + used, sizeof names - used, "%s%s", i ? " " : "", id.names[i]);
            used = n < 0 ? used : used + (size_t)n < sizeof names ? used + (size_t)n : sizeof names - 1;
        }
        log_event(BG_LOG_DEBUG, "tls_established", "protocol=%s fd=%d peer=%s version=%s names=%zu identity=%s",
                  p->name, c->peer.fd, c->peer.addr,
                  log_str(gnutls_protocol_get_name(gnutls_protocol_get_version(c->tls))), id.count,
                  log_str(id.count ? names : NULL));
    }
    event_del(c->read_ev);
    event_assign(c->read_ev, loop_base(), c->peer.fd, EV_READ | EV_PERSIST, conn_read_cb, c);
    event_add(c->read_ev, NULL);
    queue_leave(c);
    conn_run(c); /* requests that came with the handshake's last flight */
}

/* The socket of a TLS connection in its handshake is ready: the first byte
 * must begin a handshake record (else it is closed at once: plain text to
 * a TLS port), then GnuTLS goes on as far as it can. */
static void tls_handshake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    if (!c->tls_first_seen) {
        unsigned char first;
        ssize_t n = recv(fd, &first, 1, MSG_PEEK);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) {
            conn_lost(c, n == 0 ? "peer_closed" : "read_error");
            return;
        }
        if (first != TLS_HANDSHAKE_RECORD) {
            tls_refuse(c, "not_tls", "the first byte is not a TLS handshake record");
            return;
        }
        c->tls_first_seen = 1;
    }
    int r;
    do r = gnutls_handshake(c->tls);
    while (r < 0 && r != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(r));
    if (r == GNUTLS_E_AGAIN) {
        short want = gnutls_record_get_direction(c->tls) ? EV_WRITE : EV_READ;
        if (event_get_events(c->read_ev) != (want | EV_PERSIST)) {
            event_del(c->read_ev);
            event_assign(c->read_ev, loop_base(), fd, want | EV_PERSIST, tls_handshake_cb, c);
            event_add(c->read_ev, NULL);
        }
        return;
    }
    if (r < 0) {
        tls_refuse(c, "handshake_failed", gnutls_strerror(r));
        return;
    }
    tls_established(c);
    loop_engine_changed();
}

/* Make a connection of an accepted socket (non-blocking already), counted
 * in its address's entry (NULL: none). On a TLS server the session opens
 * after the handshake (tls_established). */
static void conn_open(struct conn_server *cs, int fd, const struct sockaddr_storage *sa,
                      struct addr_count *addr)
{
    const struct conn_protocol *p = cs->proto;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct conn *c = calloc(1, sizeof *c + p->session_size);
    if (!c) {
        addr_unref(addr);
        close(fd);
        return;
    }
    c->cs = cs;
    c->peer.fd = fd;
    conn_peer_address(&c->peer, (const struct sockaddr *)sa);
    struct bg_stream *s = stream_of(c);
    if (cs->tls) {
        c->handshaking = 1;
        if (tls_listener_session_new(cs->tls, &c->tls) == 0) {
            gnutls_transport_set_int(c->tls, fd);
            c->read_ev = event_new(loop_base(), fd, EV_READ | EV_PERSIST, tls_handshake_cb, c);
        }
    } else {
        c->read_ev = event_new(loop_base(), fd, EV_READ | EV_PERSIST, conn_read_cb, c);
    }
    if (!c->read_ev || (!cs->tls && p->open(p->ctx, s, &c->peer, loop_now()) != 0)) {
        if (c->read_ev) event_free(c->read_ev);
        if (c->tls) gnutls_deinit(c->tls);
        free(c);
        addr_unref(addr);
        close(fd);
        return;
    }
    if (!cs->tls) stream_attach(c);
    c->next = cs->conns;
    if (cs->conns) cs->conns->prev = c;
    cs->conns = c;
    cs->count++;
    shared.counters.open++;
    if ((c->addr = addr)) addr->count++;
    bg_engine_connection_opened(cs->engine);
    event_add(c->read_ev, NULL);
    if (cs->tls) queue_join(c, QUEUE_HANDSHAKE, loop_now()); /* the handshake's deadline */
    else conn_schedule(c); /* idle from the start */
    if (log_enabled(BG_LOG_DEBUG)) {
        char event[32];
        snprintf(event, sizeof event, "%saccepted", p->event_prefix);
        log_event(BG_LOG_DEBUG, event, "protocol=%s fd=%d peer=%s tls=%d", p->name, fd, c->peer.addr,
                  cs->tls != NULL);
    }
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct conn_server *cs = arg;
    for (int i = 0; i < CONN_ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        memset(&sa, 0, sizeof sa);
        int fd = accept4(lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                accept_pause(cs, errno);
            return; /* EAGAIN: none left; anything else: try at the next wake-up */
        }
        cs->accept_pause = 0;
        struct addr_count *addr;
        enum conn_reason why;
        if (!admit(&sa, &addr, &why)) {
            /* closed at once: beanstalk has no word for it, and beanstalkd
             * too just closes at its fixed limits */
            struct conn_peer peer;
            conn_peer_address(&peer, (const struct sockaddr *)&sa);
            note_limit(cs->proto, why, fd, peer.addr);
            close(fd);
            continue;
        }
        conn_open(cs, fd, &sa, addr);
    }
}

int conn_server_start(struct conn_server **out, const struct conn_protocol *p, int fd,
                      struct bg_engine *e, struct wal *w)
{
    return conn_server_start_tls(out, p, fd, e, w, NULL);
}

int conn_server_start_tls(struct conn_server **out, const struct conn_protocol *p, int fd,
                          struct bg_engine *e, struct wal *w, struct tls_listener *tls)
{
    struct conn_server *cs = calloc(1, sizeof *cs);
    if (!cs) return BG_OUT_OF_MEMORY;
    cs->proto = p;
    cs->engine = e;
    cs->wal = w;
    cs->tls = tls;
    cs->fd = fd;
    cs->queues[QUEUE_REQUEST].timeout = p->limits.request_timeout;
    cs->queues[QUEUE_IDLE].timeout = p->limits.idle_timeout;
    cs->queues[QUEUE_HANDSHAKE].timeout =
        p->limits.request_timeout ? p->limits.request_timeout : CONN_TLS_HANDSHAKE_TIMEOUT;
    cs->accept_ev = event_new(loop_base(), fd, EV_READ | EV_PERSIST, accept_cb, cs);
    cs->resume_ev = evtimer_new(loop_base(), resume_cb, cs);
    cs->deadline_ev = evtimer_new(loop_base(), deadline_cb, cs);
    if (!cs->accept_ev || !cs->resume_ev || !cs->deadline_ev) {
        if (cs->accept_ev) event_free(cs->accept_ev);
        if (cs->resume_ev) event_free(cs->resume_ev);
        if (cs->deadline_ev) event_free(cs->deadline_ev);
        free(cs);
        return BG_OUT_OF_MEMORY;
    }
    event_add(cs->accept_ev, NULL);
    cs->next_server = shared.servers;
    shared.servers = cs;
    *out = cs;
    return 0;
}

void conn_server_pause(struct conn_server *cs)
{
    cs->paused = 1;
    event_del(cs->accept_ev);
    event_del(cs->resume_ev);
}

int conn_server_fd(const struct conn_server *cs) { return cs->fd; }

uint64_t conn_server_count(const struct conn_server *cs) { return cs->count; }

void conn_server_stop_reading(struct conn_server *cs)
{
    if (!cs) return;
    conn_server_pause(cs);
    for (struct conn *c = cs->conns; c; c = c->next) {
        struct bg_stream *s = stream_of(c);
        if (!c->read_paused) event_del(c->read_ev);
        c->read_paused = 1;
        /* a blocked session is answered as at its peer's end of stream;
         * its reservations go back to ready as it closes */
        if (s->blocked && cs->proto->peer_eof) cs->proto->peer_eof(s, loop_now());
    }
}

/* At a stop: write c's output if the log keeps the position it depends
 * on, waiting for the socket at most until deadline; else nothing. */
static void flush_at_stop(struct conn *c, bg_time deadline)
{
    struct bg_buf *out = &stream_of(c)->out;
    if (c->handshaking || !wal_reply_may_go(c->cs->wal, c->mark)) return;
    while (out->len) {
        ssize_t n = c->tls ? tls_send(c, bg_buf_head(out), out->len) : write(c->peer.fd, bg_buf_head(out), out->len);
        if (n > 0) {
            bg_buf_consume(out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        bg_time now = loop_now();
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || now >= deadline) return;
        struct pollfd pfd = {c->peer.fd, POLLOUT, 0};
        bg_time wait_ms = (deadline - now) / 1000000 + 1;
        poll(&pfd, 1, wait_ms > 1000 ? 1000 : (int)wait_ms);
    }
}

void conn_server_stop(struct conn_server *cs, bg_time deadline)
{
    if (!cs) return;
    conn_server_stop_reading(cs); /* if the stop sequence did not already */
    for (struct conn_server **p = &shared.servers; *p; p = &(*p)->next_server)
        if (*p == cs) {
            *p = cs->next_server;
            break;
        }
    for (struct conn *c = cs->conns; c; c = c->next) flush_at_stop(c, deadline);
    while (cs->conns) conn_free(cs->conns);
    event_free(cs->accept_ev);
    event_free(cs->resume_ev);
    event_free(cs->deadline_ev);
    close(cs->fd);
    free(cs);
    if (!shared.servers) {
        bg_buf_free(&shared.out);
        free(shared.buckets);
        shared.buckets = NULL;
        shared.mask = shared.addrs = 0;
    }
}

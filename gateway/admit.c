/* admit.c - the gateway's listening socket and every connection's life
 * outside a request. libmicrohttpd runs without a listening socket of its
 * own (MHD_USE_NO_LISTEN_SOCKET): this file accepts, and a connection is
 * handed to libmicrohttpd (MHD_add_connection) once its first request head
 * is complete and sound. So the accept path is ours:
 *
 * - limits: open connections overall and per client address. At a limit,
 *   the new connection takes the slot of the one that has waited longest
 *   without a request in progress (an idle keep-alive connection, or one
 *   still sending its head): in HTTP/1.1 a server may close an idle
 *   connection at any time (RFC 9112 section 9.8), and one that has not
 *   sent its head has had its chance. Only when every connection is busy in
 *   a request is the new one refused: 503 TOO_MANY_CONNECTIONS. So clients
 *   that connect and send nothing, or a byte now and then, cannot lock
 *   others out, health checks included;
 * - a header deadline: a head must be complete within the header timeout,
 *   counted from the accept for the first request, and from the first byte
 *   of each later request of a keep-alive connection (until that byte the
 *   connection is idle: libmicrohttpd's idle timeout); else 408 and close.
 *   Later heads are libmicrohttpd's to read: the bytes of each request are
 *   counted, and a sweep (sweep_cb) finds the waiting connections that
 *   have received more, with no cost per request;
 * - the first head is judged before libmicrohttpd reads it (framing.c):
 *   malformed or conflicting framing, a version other than 1.0/1.1, a head
 *   over the size limit are answered here, as problem+json, once;
 * - at the fd limit, accept pauses (GW_ACCEPT_BACKOFF_MS) instead of
 *   spinning on a listening socket that stays readable, and says so at most
 *   once per GW_ACCEPT_LOG_INTERVAL_S.
 *
 * - parking (plain HTTP): a keep-alive connection idle for
 *   GW_PARK_AFTER_MS is taken back from libmicrohttpd (park_begin), so
 *   that it costs this record instead of libmicrohttpd's memory pool; it is
 *   then as before its first request, its next head judged here.
 *
 * Refusals answered here are written, the socket is shut for writing, and
 * what the client still sends is read and dropped for GW_LINGER_MS, so that
 * closing does not reset the answer away before the client reads it.
 *
 * Over HTTPS (cfg.tls) the head is encrypted, so this file cannot read it:
 * - the connection limits and eviction are the same; a refusal at the
 *   server's limit (503) is answered inside TLS: this file does the
 *   handshake itself (a session of the gateway's tls_listener, no client
 *   certificate asked for), sends the 503, a close_notify (best effort),
 *   shuts and lingers, all within the same GW_LINGER_MS and among the same
 *   GW_LINGERING_MAX lingering connections, and at most
 *   GW_TLS_REFUSALS_PER_S a second (a handshake is a private-key signature
 *   on the engine's loop); beyond that budget, and for a refusal at the
 *   per-address limit (the client's own quota), it is closed unanswered, as
 *   is a handshake that fails or does not end in time. A deadline before
 *   the first byte (408) closes the socket without an answer (the client
 *   has sent no handshake to answer);
 * - the first byte is looked at: a TLS handshake record (0x16) is handed
 *   to libmicrohttpd at once; anything else (plain HTTP sent to the HTTPS
 *   port) gets a plain 400 PLAIN_HTTP_TO_HTTPS_PORT and is closed;
 * - the header deadline, armed at the accept, keeps running after the
 *   hand-over and covers the handshake and the first head: a handshake that
 *   never completes, or a head that does not, is closed (no 408: nothing
 *   can be written into a TLS stream from here) when it passes. The
 *   connection stays on the waiting lists (evictable) until its first
 *   request begins;
 * - the first head is judged in the request's first call instead (http.c
 *   begin_request): its framing (framing.c, as for every later head), its
 *   size and its fields (gw_tls_head_check, 431). libmicrohttpd answers a
 *   malformed request line, a version other than 1.0/1.1 and a
 *   Content-Length that is not digits itself (its HTML answer, then a
 *   close), and takes a folded header line or a space before a colon as
 *   sound: over TLS no proxy in front reads the head (docs/security.md,
 *   HTTPS);
 * - a later head's deadline works as in plain text, counted in TLS bytes:
 *   after each request the count is taken from the kernel (as after a
 *   chunked body), and any byte received since starts the next head's
 *   deadline (a client's close_notify alert too, which then counts as a
 *   client that left during a head).
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h> /* malloc_trim */
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received */
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gateway.h"
#include "../io/eventlog.h"
#include "../io/tls.h"

/* What every response carries (reply.c, send_response), in the answers
 * written here without libmicrohttpd. */
#define GW_RAW_HEADERS "X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"
#define ACCEPT_BATCH 64           /* connections accepted per wake-up */
#define TCP_STATE_ESTABLISHED 1   /* tcpi_state: the kernel's TCP_ESTABLISHED (not in linux/tcp.h) */
#define TLS_HANDSHAKE_RECORD 0x16 /* the first byte of a TLS client's first record (RFC 8446 5.1) */

static const char *const event_names[GW_CONN_EVENTS] = {
    "connections", "address", "fd_limit", "evicted", "header_timeout", "bad_head", "client",
};

/* ---- client addresses --------------------------------------------------- */

/* The key of an address: its family, then its bytes (an IPv4-mapped IPv6
 * address is the IPv4 one). Returns the key's length. */
static size_t addr_key(const struct sockaddr_storage *ss, unsigned char key[17])
{
    if (ss->ss_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)ss)->sin_addr, 4);
        return 5;
    }
    if (ss->ss_family == AF_INET6) {
        const unsigned char *b = ((const struct sockaddr_in6 *)ss)->sin6_addr.s6_addr;
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(b, mapped, 12) == 0) {
            key[0] = 4;
            memcpy(key + 1, b + 12, 4);
            return 5;
        }
        key[0] = 6;
        memcpy(key + 1, b, 16);
        return 17;
    }
    key[0] = 0;
    return 1;
}

static size_t key_len(const unsigned char *key) { return key[0] == 4 ? 5 : key[0] == 6 ? 17 : 1; }

/* The entry of ss's address, made if there is none (one more reference).
 * NULL: out of memory. */
static struct gw_addr *addr_ref(struct gw_admit *a, const struct sockaddr_storage *ss)
{
    unsigned char key[17];
    size_t n = addr_key(ss, key);
    struct gw_addr **slot = &a->buckets[bg_siphash(a->hash_key, key, n) & (a->nbuckets - 1)];
    struct gw_addr *e;
    for (e = *slot; e; e = e->next)
        if (key_len(e->key) == n && memcmp(e->key, key, n) == 0) break;
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) return NULL;
        memcpy(e->key, key, n);
        e->next = *slot;
        *slot = e;
    }
    e->refs++;
    return e;
}

static void addr_unref(struct gw_admit *a, struct gw_addr *e)
{
    if (--e->refs) return;
    struct gw_addr **p = &a->buckets[bg_siphash(a->hash_key, e->key, key_len(e->key)) & (a->nbuckets - 1)];
    while (*p != e) p = &(*p)->next;
    *p = e->next;
    free(e);
}

/* ---- the waiting lists (oldest first): who is evicted first ------------ */

static void wait_enter(struct gw_conn *c)
{
    struct gw_admit *a = &c->gw->admit;
    if (c->waiting || !c->counted) return;
    c->waiting = 1;
    c->next = NULL;
    c->prev = a->wait_tail;
    if (a->wait_tail) a->wait_tail->next = c; else a->wait_head = c;
    a->wait_tail = c;
    struct gw_addr *e = c->addr;
    c->addr_next = NULL;
    c->addr_prev = e->wait_tail;
    if (e->wait_tail) e->wait_tail->addr_next = c; else e->wait_head = c;
    e->wait_tail = c;
}

static void wait_leave(struct gw_conn *c)
{
    struct gw_admit *a = &c->gw->admit;
    if (!c->waiting) return;
    c->waiting = 0;
    if (a->sweep_cursor == c) a->sweep_cursor = c->next;
    if (c->prev) c->prev->next = c->next; else a->wait_head = c->next;
    if (c->next) c->next->prev = c->prev; else a->wait_tail = c->prev;
    struct gw_addr *e = c->addr;
    if (c->addr_prev) c->addr_prev->addr_next = c->addr_next; else e->wait_head = c->addr_next;
    if (c->addr_next) c->addr_next->addr_prev = c->addr_prev; else e->wait_tail = c->addr_prev;
    c->prev = c->next = c->addr_prev = c->addr_next = NULL;
}

/* ---- the records ------------------------------------------------------------ */

#if defined(__SANITIZE_ADDRESS__)
#define CONN_BLOCKS 0 /* a record per allocation: ASan sees a use after its free */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONN_BLOCKS 0
#endif
#endif
#ifndef CONN_BLOCKS
#define CONN_BLOCKS 1
#endif
#define CONN_BLOCK_SLOTS 256 /* records per block (a block is above malloc's mmap threshold) */

/* A record's size with room for its two events after it. */
static size_t conn_slot_size(void)
{
    size_t head = (sizeof(struct gw_conn) + 15) & ~(size_t)15;
    return (head + 2 * event_get_struct_event_size() + 15) & ~(size_t)15;
}

/* Event storage i (0: the deadline, 1: reading) of record c. */
static struct event *conn_event(struct gw_conn *c, int i)
{
    size_t head = (sizeof(struct gw_conn) + 15) & ~(size_t)15;
    return (struct event *)((char *)c + head + (size_t)i * event_get_struct_event_size());
}

/* A zeroed record (NULL: out of memory). Records and their events come
 * from blocks of their own, apart from libmicrohttpd's allocations for each
 * connection: so the connections and pools that parking frees leave long
 * runs of free pages, which malloc_trim gives back, not holes cut by
 * records that stay (about 4.7 KB an idle connection, against 1 KB). */
static struct gw_conn *conn_alloc(struct gw_admit *a)
{
    size_t slot = conn_slot_size();
    if (!CONN_BLOCKS) return calloc(1, slot);
    if (!a->free_conns) {
        char *block = malloc(sizeof(void *) + CONN_BLOCK_SLOTS * slot + 15);
        if (!block) return NULL;
        *(void **)block = a->conn_blocks;
        a->conn_blocks = block;
        char *first = (char *)(((uintptr_t)block + sizeof(void *) + 15) & ~(uintptr_t)15);
        for (size_t i = CONN_BLOCK_SLOTS; i-- > 0;) {
            struct gw_conn *c = (struct gw_conn *)(first + i * slot);
            c->next = a->free_conns;
            a->free_conns = c;
        }
    }
    struct gw_conn *c = a->free_conns;
    a->free_conns = c->next;
    memset(c, 0, slot);
    return c;
}

static void conn_release(struct gw_admit *a, struct gw_conn *c)
{
    if (!CONN_BLOCKS) {
        free(c);
        return;
    }
    c->next = a->free_conns;
    a->free_conns = c;
}

/* ---- counting and closing ----------------------------------------------- */

static void count_open(struct gw_conn *c)
{
    c->counted = 1;
    c->gw->admit.open++;
    c->addr->count++;
}

/* c's slot is free again (it is closing). */
static void uncount(struct gw_conn *c)
{
    wait_leave(c);
    if (!c->counted) return;
    c->counted = 0;
    c->gw->admit.open--;
    c->addr->count--;
}

static void linger_leave(struct gw_conn *c)
{
    struct gw_admit *a = &c->gw->admit;
    if (!c->lingering) return;
    c->lingering = 0;
    a->lingering--;
    if (c->prev) c->prev->next = c->next; else a->linger_head = c->next;
    if (c->next) c->next->prev = c->prev;
}

/* A refused HTTPS connection's handshake, and the answer it is for. */
struct gw_tls_refusal {
    gnutls_session_t session;
    size_t len;
    char answer[]; /* the whole response, head and body */
};

static void tls_refusal_free(struct gw_conn *c)
{
    if (!c->tls_refusal) return;
    gnutls_deinit(c->tls_refusal->session);
    free(c->tls_refusal);
    c->tls_refusal = NULL;
}

/* Free c; close its socket unless libmicrohttpd owns it (or closed it). */
static void conn_free(struct gw_conn *c)
{
    struct gw_admit *a = &c->gw->admit;
    tls_refusal_free(c);
    if (c->parked) a->parked--;
    uncount(c);
    linger_leave(c);
    if (c->read_ev) event_del(c->read_ev);
    if (c->deadline_ev) event_del(c->deadline_ev);
    if (!c->mhd && c->fd >= 0) close(c->fd);
    if (c->addr) addr_unref(a, c->addr);
    conn_release(a, c);
}

/* Count event e; a refusal is logged as a warning at most once per
 * GW_ACCEPT_LOG_INTERVAL_S (with how many since the last line), the rest
 * at debug level. */
static void note(struct gateway *gw, enum gw_conn_event e, const struct gw_conn *c, const char *msg)
{
    struct gw_admit *a = &gw->admit;
    a->events[e]++;
    int refusal = e == GW_REFUSED_CONNECTIONS || e == GW_REFUSED_ADDRESS || e == GW_REFUSED_FD_LIMIT;
    if (!refusal) {
        if (log_enabled(BG_LOG_DEBUG))
            log_event(BG_LOG_DEBUG, "http_connection_closed", "reason=%s fd=%d msg=%s",
                      event_names[e], c ? c->fd : -1, log_str(msg));
        return;
    }
    a->unlogged[e]++;
    bg_time now = gw->now();
    if (a->logged_at[e] && now - a->logged_at[e] < (bg_time)GW_ACCEPT_LOG_INTERVAL_S * BG_SECOND) return;
    log_event(BG_LOG_WARN, "http_connections_refused",
              "reason=%s refused=%llu open=%llu max=%u max_per_ip=%u msg=%s", event_names[e],
              (unsigned long long)a->unlogged[e], (unsigned long long)a->open,
              gw->cfg.max_connections, gw->cfg.max_per_address, log_str(msg));
    a->logged_at[e] = now;
    a->unlogged[e] = 0;
}

void gw_conn_count(struct gateway *gw, enum gw_conn_event e) { gw->admit.events[e]++; }

static void linger_cb(evutil_socket_t fd, short what, void *arg)
{
    struct gw_conn *c = arg;
    char sink[4096];
    if (what & EV_TIMEOUT) {
        conn_free(c);
        return;
    }
    for (;;) {
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n > 0) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        conn_free(c); /* the client's end: it has read the answer */
        return;
    }
}

/* The whole answer of a refusal (head and problem+json body) into *len
 * bytes; free() it. NULL: out of memory. */
static char *refusal_answer(unsigned status, const char *code, const char *detail, size_t *len)
{
    char *text = gw_problem_text(status, code, detail);
    size_t text_len = text ? strlen(text) : 0;
    char head[320];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %u %s\r\nContent-Type: application/problem+json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n" GW_RAW_HEADERS "%s\r\n",
                     status, gw_status_title(status), text_len, status == 503 ? "Retry-After: 5\r\n" : "");
    char *answer = malloc((size_t)n + text_len);
    if (answer) {
        memcpy(answer, head, (size_t)n);
        if (text_len) memcpy(answer + n, text, text_len);
        *len = (size_t)n + text_len;
    }
    free(text);
    return answer;
}

/* c (answered, or about to be) leaves the counts and lingers for
 * GW_LINGER_MS, its socket's readiness going to on_ready; its slot is free
 * at once. 0, or -1 when it cannot linger (GW_LINGERING_MAX reached): the
 * caller closes it. */
static int linger_begin(struct gw_conn *c, event_callback_fn on_ready)
{
    struct gateway *gw = c->gw;
    struct gw_admit *a = &gw->admit;
    uncount(c);
    if (c->read_ev) event_del(c->read_ev);
    c->read_ev = NULL;
    if (a->lingering >= GW_LINGERING_MAX || !c->deadline_ev ||
        event_assign(conn_event(c, 1), gw->base, c->fd, EV_READ | EV_PERSIST, on_ready, c) != 0)
        return -1;
    c->read_ev = conn_event(c, 1);
    event_del(c->deadline_ev);
    event_assign(c->deadline_ev, gw->base, -1, 0, linger_cb, c);
    struct timeval tv = {GW_LINGER_MS / 1000, (GW_LINGER_MS % 1000) * 1000};
    event_add(c->read_ev, NULL);
    event_add(c->deadline_ev, &tv);
    c->lingering = 1;
    a->lingering++;
    c->prev = NULL;
    c->next = a->linger_head;
    if (a->linger_head) a->linger_head->prev = c;
    a->linger_head = c;
    return 0;
}

/* A refused HTTPS connection's socket is ready: the handshake goes on;
 * once it is done the answer goes out in one record, then a close_notify
 * and the shut, and the connection lingers as a plain refusal does (on
 * linger_cb, for the rest of the same GW_LINGER_MS). A failed handshake
 * closes it. */
static void tls_refusal_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_conn *c = arg;
    struct gw_tls_refusal *r = c->tls_refusal;
    int rc;
    do rc = gnutls_handshake(r->session);
    while (rc < 0 && rc != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(rc));
    if (rc == GNUTLS_E_AGAIN) {
        short want = (gnutls_record_get_direction(r->session) ? EV_WRITE : EV_READ) | EV_PERSIST;
        if (event_get_events(c->read_ev) != want) {
            event_del(c->read_ev);
            event_assign(c->read_ev, c->gw->base, fd, want, tls_refusal_cb, c);
            event_add(c->read_ev, NULL);
        }
        return;
    }
    if (rc < 0) {
        log_event(BG_LOG_DEBUG, "http_connection_closed", "reason=refusal_handshake_failed fd=%d error=%s",
                  c->fd, log_str(gnutls_strerror(rc)));
        conn_free(c);
        return;
    }
    /* a fresh socket's buffer takes a few hundred bytes at once; if not,
     * the record is finished at most once more, never waited for. The
     * close_notify is best effort, one try: if the buffer cannot take it
     * (GNUTLS_E_AGAIN) it is dropped, and the client sees the TCP end after
     * a complete answer (Content-Length, Connection: close) instead */
    ssize_t sent = gnutls_record_send(r->session, r->answer, r->len);
    if (sent == GNUTLS_E_AGAIN || sent == GNUTLS_E_INTERRUPTED) sent = gnutls_record_send(r->session, NULL, 0);
    if (sent == (ssize_t)r->len) (void)gnutls_bye(r->session, GNUTLS_SHUT_WR);
    shutdown(fd, SHUT_WR);
    tls_refusal_free(c);
    event_del(c->read_ev);
    event_assign(c->read_ev, c->gw->base, fd, EV_READ | EV_PERSIST, linger_cb, c);
    event_add(c->read_ev, NULL);
}

/* Take one of the GW_TLS_REFUSALS_PER_S handshakes a second that TLS
 * refusals may begin (a token bucket as deep as the rate): 1 if taken,
 * 0 if the budget is spent for now. */
static int tls_refusal_budget_take(struct gw_admit *a, bg_time now)
{
    const bg_time per_token = BG_SECOND / GW_TLS_REFUSALS_PER_S;
    if (now >= a->tls_refusal_filled_at + per_token) {
        uint64_t add = (now - a->tls_refusal_filled_at) / per_token;
        if (a->tls_refusal_tokens + add >= GW_TLS_REFUSALS_PER_S) {
            a->tls_refusal_tokens = GW_TLS_REFUSALS_PER_S;
            a->tls_refusal_filled_at = now;
        } else {
            a->tls_refusal_tokens += add;
            a->tls_refusal_filled_at += add * per_token;
        }
    }
    if (!a->tls_refusal_tokens) return 0;
    a->tls_refusal_tokens--;
    return 1;
}

/* Over HTTPS: answer c inside a TLS session of our own (tls_refusal_cb),
 * lingering meanwhile. 0, or -1: the caller closes c unanswered. */
static int tls_refusal_session(struct gw_conn *c, unsigned status, const char *code, const char *detail)
{
    size_t len;
    char *answer = refusal_answer(status, code, detail, &len);
    struct gw_tls_refusal *r = answer ? malloc(sizeof *r + len) : NULL;
    if (r && tls_listener_session_new(c->gw->cfg.tls, &r->session) != 0) {
        free(r);
        r = NULL;
    }
    if (!r) {
        free(answer);
        return -1;
    }
    memcpy(r->answer, answer, len);
    r->len = len;
    free(answer);
    /* a refused client is not asked for a certificate: the answer is the
     * same for everyone, and verifying would only cost more */
    gnutls_certificate_server_set_request(r->session, GNUTLS_CERT_IGNORE);
    gnutls_transport_set_int(r->session, c->fd);
    c->tls_refusal = r;
    return linger_begin(c, tls_refusal_cb);
}

/* tls_refusal_session for c if it may linger (GW_LINGERING_MAX) and the
 * handshake budget allows (tls_refusal_budget_take), both checked before
 * anything is built; counted either way. 0, or -1: the caller closes c
 * unanswered. */
static int tls_refusal_begin(struct gw_conn *c, unsigned status, const char *code, const char *detail)
{
    struct gw_admit *a = &c->gw->admit;
    int rc = a->lingering < GW_LINGERING_MAX && tls_refusal_budget_take(a, c->gw->now())
                 ? tls_refusal_session(c, status, code, detail)
                 : -1;
    if (rc == 0) a->tls_refusals_answered++;
    else a->tls_refusals_unanswered++;
    return rc;
}

/* Answer a connection libmicrohttpd does not own with a problem, shut it
 * for writing and let it linger; its slot is free at once. Over HTTPS a
 * client that waits for a handshake gets a 503 inside TLS if the server is
 * full (tls_refusal_begin), other answers not at all (closed). */
static void refuse(struct gw_conn *c, unsigned status, const char *code, const char *detail)
{
    struct gateway *gw = c->gw;
    if (gw->cfg.tls && !c->plain_text) {
        if (status != 503 || tls_refusal_begin(c, status, code, detail) != 0) conn_free(c);
        return;
    }
    char sink[4096];
    for (int i = 0; i < 16 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
    size_t len = 0;
    char *answer = refusal_answer(status, code, detail, &len);
    ssize_t sent = answer ? send(c->fd, answer, len, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
    (void)sent; /* a kernel buffer takes a few hundred bytes; else the client is gone */
    free(answer);
    shutdown(c->fd, SHUT_WR);
    if (linger_begin(c, linger_cb) != 0) conn_free(c);
}

/* Shut a connection libmicrohttpd owns: it sees the end and closes it. */
static void shut(struct gw_conn *c)
{
    uncount(c);
    if (c->read_ev) event_del(c->read_ev);
    event_del(c->deadline_ev);
    shutdown(c->fd, SHUT_RDWR);
}

/* Close the connection that has waited longest on list head `victim` (one
 * with no request in progress), to make room. 0 if there is none. */
static int evict(struct gw_conn *victim)
{
    if (!victim) return 0;
    note(victim->gw, GW_CLOSED_EVICTED, victim, "a new connection took its slot");
    if (victim->mhd) shut(victim);
    else conn_free(victim);
    return 1;
}

/* ---- the first request head --------------------------------------------- */

/* Hand c to libmicrohttpd: in plain text once its first head is complete
 * (busy until the request ends); over TLS at its first byte, with its
 * header deadline still running (head_started: the sweep leaves it be) and
 * still evictable, until its first request begins. */
static void hand_over(struct gw_conn *c)
{
    struct gateway *gw = c->gw;
    struct gw_admit *a = &gw->admit;
    event_del(c->read_ev);
    c->read_ev = NULL;
    if (gw->cfg.tls) {
        c->head_started = 1;
    } else {
        event_del(c->deadline_ev);
        wait_leave(c);
    }
    a->adding = c;
    a->adding_started = 0;
    int ok = MHD_add_connection(gw->daemon, c->fd, (struct sockaddr *)&c->sa, c->sa_len) == MHD_YES;
    a->adding = NULL;
    if (ok) { /* in plain text (MHD_USE_TURBO) it is ready to be read, not yet in the epoll set */
        event_active(gw->run_ev, EV_READ, 0);
        return;
    }
    log_event(BG_LOG_DEBUG, "http_connection_closed", "reason=add_failed fd=%d error=%s", c->fd,
              log_str(strerror(errno)));
    if (!a->adding_started) {
        c->fd = -1; /* libmicrohttpd closed it */
        conn_free(c);
    } /* else gw_conn_closed freed it */
}

/* The problem of a head over the size limit max (its detail into detail[n]). */
static void head_too_large(size_t max, char *detail, size_t n, struct gw_problem *p)
{
    snprintf(detail, n, "the request head is larger than %zu bytes", max);
    *p = (struct gw_problem){0, 431, "HEADERS_TOO_LARGE", detail};
}

unsigned gw_tls_head_check(const struct gateway *gw, size_t size, unsigned fields, char *detail, size_t n,
                           struct gw_problem *p)
{
    if (size > gw->cfg.max_header_size) head_too_large(gw->cfg.max_header_size, detail, n, p);
    else if (fields > GW_HEADER_FIELDS_MAX) *p = gw_too_many_fields;
    else return 0;
    return p->status;
}

/* Look at the bytes of c's first head without reading them; once the head
 * is complete, judge it and hand the socket over (a client that closed
 * after a whole head, a half-close, is still answered). `closed`: the
 * client's end was seen. 1 if c was dealt with (handed over, refused or
 * freed), 0 if its head is not complete yet (c untouched). */
static int first_head_step(struct gw_conn *c, int closed)
{
    struct gw_admit *a = &c->gw->admit;
    size_t max = c->gw->cfg.max_header_size;
    ssize_t n = recv(c->fd, a->peek, max + 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) {
        note(c->gw, GW_CLOSED_CLIENT, c, "closed before a request");
        conn_free(c);
        return 1;
    }
    if (c->gw->cfg.tls) {
        if ((unsigned char)a->peek[0] == TLS_HANDSHAKE_RECORD) {
            hand_over(c);
            return 1;
        }
        c->plain_text = 1;
        note(c->gw, GW_CLOSED_BAD_HEAD, c, "plain HTTP sent to the HTTPS port");
        refuse(c, 400, "PLAIN_HTTP_TO_HTTPS_PORT",
               "this port speaks HTTPS: connect with TLS (https://)");
        return 1;
    }
    size_t end = gw_head_end(a->peek, (size_t)n);
    if (end > max || (!end && (size_t)n > max)) {
        char detail[96];
        struct gw_problem p;
        head_too_large(max, detail, sizeof detail, &p);
        note(c->gw, GW_CLOSED_BAD_HEAD, c, detail);
        refuse(c, p.status, p.code, p.detail);
        return 1;
    }
    if (!end && closed) {
        note(c->gw, GW_CLOSED_CLIENT, c, "closed during its first head");
        conn_free(c);
        return 1;
    }
    if (!end) return 0;
    struct gw_problem p;
    if (gw_head_check(a->peek, end, GW_HEADER_FIELDS_MAX, &p)) {
        note(c->gw, GW_CLOSED_BAD_HEAD, c, p.detail);
        refuse(c, p.status, p.code, p.detail);
        return 1;
    }
    hand_over(c);
    return 1;
}

/* A parked connection's socket is readable: its next head began (whose
 * header deadline runs from now), or the client left (closed quietly, as
 * libmicrohttpd closes an idle connection that the client ended). 1 if a
 * head began. */
static int unpark(struct gw_conn *c)
{
    char byte;
    ssize_t n = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) {
        conn_free(c);
        return 0;
    }
    c->parked = 0;
    c->gw->admit.parked--;
    event_add(c->deadline_ev, c->gw->admit.header_tv);
    return 1;
}

/* Bytes of the first head (or a parked connection's next) arrived
 * (edge-triggered), or the client closed. */
static void pending_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct gw_conn *c = arg;
    if (c->parked && !unpark(c)) return;
    first_head_step(c, (what & EV_CLOSED) != 0);
}

/* Bytes wait in the kernel for libmicrohttpd to read: c's socket has
 * unread data. */
static int unread_bytes(const struct gw_conn *c)
{
    int unread = 0;
    return ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0;
}

/* The header deadline passed (or a lingering connection's time is up).
 * A head that became complete in this same loop turn, after the loop
 * looked for I/O, is served, not answered 408 (issue 21): the first head
 * is looked at here; for a later head, libmicrohttpd reads it, so while
 * bytes wait unread the 408 waits one loop turn (once), in which
 * libmicrohttpd reads them and a complete head cancels the deadline. */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_conn *c = arg;
    static const char detail[] = "the request head was not complete in time";
    if (c->parked) { /* the idle timeout, as libmicrohttpd's: closed quietly */
        conn_free(c);
        return;
    }
    if (!c->mhd && first_head_step(c, 0)) return;
    if (c->mhd && !c->deadline_extended && unread_bytes(c)) {
        static const struct timeval next_turn = {0, 0};
        c->deadline_extended = 1;
        event_add(c->deadline_ev, &next_turn);
        return;
    }
    note(c->gw, GW_CLOSED_HEADER_TIMEOUT, c, detail);
    if (!c->mhd) {
        refuse(c, 408, "HEADER_TIMEOUT", detail);
        return;
    }
    if (c->gw->cfg.tls) { /* libmicrohttpd's TLS stream: no plain 408 into it */
        shut(c);
        return;
    }
    /* no response is under way on it (it waits for a head): a 408, best
     * effort, then libmicrohttpd sees the end */
    char *text = gw_problem_text(408, "HEADER_TIMEOUT", detail);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/problem+json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n" GW_RAW_HEADERS "\r\n",
                     text ? strlen(text) : 0);
    struct iovec iov[2] = {{head, (size_t)n}, {text, text ? strlen(text) : 0}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)sent;
    free(text);
    shut(c);
}

/* ---- accepting ------------------------------------------------------------ */

/* Take in accepted socket fd from ss: within the limits (evicting the
 * longest waiting connection at one), or refused. */
static void admit_one(struct gateway *gw, int fd, const struct sockaddr_storage *ss, socklen_t len)
{
    struct gw_admit *a = &gw->admit;
    struct gw_conn *c = conn_alloc(a);
    if (c) c->addr = addr_ref(a, ss);
    if (!c || !c->addr) {
        if (c) conn_release(a, c);
        close(fd);
        note(gw, GW_REFUSED_FD_LIMIT, NULL, "out of memory");
        return;
    }
    c->gw = gw;
    c->fd = fd;
    c->spare_fd = -1;
    memcpy(&c->sa, ss, len);
    c->sa_len = len;
    if (evtimer_assign(conn_event(c, 0), gw->base, deadline_cb, c) == 0) c->deadline_ev = conn_event(c, 0);
    if (event_assign(conn_event(c, 1), gw->base, fd, EV_READ | EV_PERSIST | EV_ET | EV_CLOSED, pending_cb, c) == 0)
        c->read_ev = conn_event(c, 1);
    if (!c->deadline_ev || !c->read_ev) {
        conn_free(c);
        note(gw, GW_REFUSED_FD_LIMIT, NULL, "out of memory");
        return;
    }
    uint32_t per_address = gw->cfg.max_per_address;
    if (per_address && c->addr->count >= per_address && !evict(c->addr->wait_head)) {
        note(gw, GW_REFUSED_ADDRESS, c, "every connection of this address is busy in a request");
        if (gw->cfg.tls) { /* over its own quota: no handshake, none of the server's CPU for it */
            conn_free(c);
            return;
        }
        refuse(c, 503, "TOO_MANY_CONNECTIONS",
               "this client address has as many connections open as allowed, each in a request");
        return;
    }
    if (a->open >= gw->cfg.max_connections && !evict(a->wait_head)) {
        note(gw, GW_REFUSED_CONNECTIONS, c, "every connection is busy in a request");
        refuse(c, 503, "TOO_MANY_CONNECTIONS",
               "the server has as many connections open as allowed, each in a request");
        return;
    }
    count_open(c);
    wait_enter(c);
    event_add(c->deadline_ev, a->header_tv);
    event_add(c->read_ev, NULL); /* a head already there is reported at once */
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_admit *a = arg;
    event_add(a->listen_ev, NULL);
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct gateway *gw = arg;
    struct gw_admit *a = &gw->admit;
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            admit_one(gw, fd, &ss, len);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* the listening socket stays readable: pause instead of spinning */
            note(gw, GW_REFUSED_FD_LIMIT, NULL, strerror(errno));
            event_del(a->listen_ev);
            struct timeval tv = {0, GW_ACCEPT_BACKOFF_MS * 1000};
            event_add(a->backoff_ev, &tv);
        }
        break;
    }
}

/* Bytes of data the kernel has taken in on this TCP connection (its FIN,
 * which the kernel counts as one, is not data; a connection that ended by
 * a reset is one short); 0 if it cannot say. */
static uint64_t data_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    int fin = ti.tcpi_state != TCP_STATE_ESTABLISHED;
    return ti.tcpi_bytes_received - (fin && ti.tcpi_bytes_received ? 1 : 0);
}

/* Bytes the client sent past the requests begun so far: a later head,
 * read by libmicrohttpd (the socket is its too) or waiting in the kernel. */
static uint64_t later_head_bytes(const struct gw_conn *c)
{
    uint64_t now = data_received(c->fd);
    return now > c->consumed ? now - c->consumed : 0;
}

/* ---- parking: idle keep-alive connections taken back -------------------- */

/* Ask libmicrohttpd to let c go (plain HTTP, idle for GW_PARK_AFTER_MS, no
 * byte of a next head received): a second descriptor keeps the socket, and
 * a timeout of one second, long passed, has libmicrohttpd close its own
 * (without shutdown(): MHD_USE_TURBO) in its next run, before it reads
 * anything (libmicrohttpd looks at timeouts before it reads). So an idle
 * connection costs this struct and its events, not libmicrohttpd's
 * connection and its memory pool (a head's size and more, zeroed whole at
 * each request). 1 if asked (c is put on *list). */
static int park_begin(struct gw_conn *c, struct gw_conn **list)
{
    int fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return 0;
    if (MHD_set_connection_option(c->mhd, MHD_CONNECTION_OPTION_TIMEOUT, 1u) != MHD_YES) {
        close(fd);
        return 0;
    }
    c->spare_fd = fd;
    c->parking = 1;
    c->park_next = *list;
    *list = c;
    return 1;
}

/* libmicrohttpd closed its descriptor of c (being parked): c is admit.c's
 * again, waiting and evictable as before. Its next head is looked at as a
 * first head is, its header deadline from its first byte (unpark); until
 * then the idle timeout runs, from the end of its last request. */
static void park_end(struct gw_conn *c)
{
    struct gateway *gw = c->gw;
    c->parking = 0;
    c->mhd = NULL;
    c->fd = c->spare_fd;
    c->spare_fd = -1;
    bg_time idle_end = c->idle_since + (bg_time)gw->cfg.idle_timeout_s * BG_SECOND, now = gw->now();
    bg_time left = idle_end > now ? idle_end - now : 0;
    struct timeval tv = {(time_t)(left / BG_SECOND), (suseconds_t)(left % BG_SECOND / 1000)};
    if (event_assign(conn_event(c, 1), gw->base, c->fd, EV_READ | EV_PERSIST | EV_ET | EV_CLOSED, pending_cb, c) == 0)
        c->read_ev = conn_event(c, 1);
    if (!c->read_ev || event_add(c->deadline_ev, &tv) != 0 || event_add(c->read_ev, NULL) != 0) {
        conn_free(c);
        return;
    }
    c->parked = 1;
    gw->admit.parked++;
    gw->admit.parked_untrimmed++;
}

/* Run libmicrohttpd for the connections on list being parked (it closes
 * each, and gw_conn_closed parks it; a closed connection is let go in the
 * run after the one that closed it, so two runs); one it kept (bytes came, or
 * its clock says one second has not passed) keeps its idle timeout, to be
 * tried again in a later round. The memory libmicrohttpd freed goes back
 * to the system every GW_PARK_TRIM_EVERY parkings. */
static void park_finish(struct gateway *gw, struct gw_conn *list)
{
    gw->run_daemon(gw); /* marks them closed (a connection that timed out reads nothing more) */
    gw->run_daemon(gw); /* closes their descriptors */
    for (struct gw_conn *c = list, *next; c; c = next) {
        next = c->park_next;
        c->park_next = NULL;
        if (!c->parking) continue;
        MHD_set_connection_option(c->mhd, MHD_CONNECTION_OPTION_TIMEOUT, gw->cfg.idle_timeout_s);
        close(c->spare_fd);
        c->spare_fd = -1;
        c->parking = 0;
        gw->admit.sweep_watched = 1;
    }
    if (gw->admit.parked_untrimmed >= GW_PARK_TRIM_EVERY) {
        malloc_trim(0);
        gw->admit.parked_untrimmed = 0;
    }
}

/* Look at up to GW_SWEEP_BATCH waiting connections from the sweep's
 * cursor: one of libmicrohttpd's that has received bytes past its last
 * request has begun its next head, whose deadline runs from now (so from
 * its first byte, seen a sweep late at most). The rest of a round follows
 * on the next turn of the loop, so that other events are served between
 * batches; at a round's end with no connection left to watch, the sweep
 * stops until a request ends. One system call per waiting connection per
 * round, none per request. */
static void sweep_batch(struct gw_admit *a)
{
    struct gateway *gw = a->sweep_cursor ? a->sweep_cursor->gw : NULL;
    struct gw_conn *parking = NULL;
    bg_time park_before = gw ? gw->now() - (bg_time)GW_PARK_AFTER_MS * (BG_SECOND / 1000) : 0;
    int seen = 0;
    while (a->sweep_cursor && seen < GW_SWEEP_BATCH) {
        struct gw_conn *c = a->sweep_cursor;
        a->sweep_cursor = c->next;
        if (!c->mhd || c->head_started) continue;
        seen++;
        if (!later_head_bytes(c)) {
            if (gw->cfg.tls || c->idle_since > park_before || !park_begin(c, &parking))
                a->sweep_watched = 1;
            continue;
        }
        c->head_started = 1;
        c->deadline_extended = 0;
        event_add(c->deadline_ev, a->header_tv);
    }
    if (parking) park_finish(gw, parking);
    if (a->sweep_cursor) {
        static const struct timeval next_turn = {0, 0};
        event_add(a->sweep_more_ev, &next_turn);
    } else if (!a->sweep_watched) {
        event_del(a->sweep_ev);
        a->sweep_armed = 0;
    }
}

/* A round of the sweep begins (every eighth of the header timeout,
 * GW_SWEEP_MIN_MS to GW_SWEEP_MAX_MS, while it is armed), unless the last
 * one is still going. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_admit *a = arg;
    if (a->sweep_cursor) return;
    a->sweep_cursor = a->wait_head;
    a->sweep_watched = 0;
    sweep_batch(a);
}

/* The next batch of a round. */
static void sweep_more_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sweep_batch(arg);
}

/* ---- libmicrohttpd's side -------------------------------------------------- */

void gw_conn_started(struct gateway *gw, struct MHD_Connection *mhd, void **socket_context)
{
    struct gw_conn *c = gw->admit.adding;
    *socket_context = c;
    if (!c) return;
    c->mhd = mhd;
    gw->admit.adding_started = 1;
}

void gw_conn_closed(struct gateway *gw, void *socket_context)
{
    struct gw_conn *c = socket_context;
    if (!c) return;
    if (c->parking) {
        park_end(c);
        return;
    }
    /* closed by libmicrohttpd, not by us, between a later head's first byte
     * and its end: the client left (libmicrohttpd says so at debug level).
     * The sweep may not have seen the head's bytes yet; the socket is still
     * open here. */
    if (c->counted && (c->head_started || (c->waiting && later_head_bytes(c))))
        note(gw, GW_CLOSED_CLIENT, c, "closed during a later head");
    conn_free(c);
}

static struct gw_conn *conn_of(struct MHD_Connection *mhd)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mhd, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void gw_conn_request_began(struct gateway *gw, struct MHD_Connection *mhd, const struct gw_framing *f)
{
    struct gw_conn *c = conn_of(mhd);
    if (!c) return;
    wait_leave(c);
    c->head_started = 0;
    event_del(c->deadline_ev);
    const union MHD_ConnectionInfo *head =
        MHD_get_connection_info(mhd, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    /* the head from its method through its blank line (empty lines before
     * it, which a client has no reason to send, are not counted: seen as a
     * later head, they cost that client's connection a header deadline) */
    c->consumed += head ? head->header_size : 0;
    if (f->chunked || gw->cfg.tls) c->consumed_unknown = 1; /* TLS: bytes on the wire are not the head's */
    else c->consumed += f->length;
}

/* A request ended at now and the connection stays open: it waits for the next
 * head, which the sweep looks for. After a chunked body, whose bytes on
 * the wire are not known, the count is taken from the kernel: all it has
 * received less what is still unread (a next head may wait there). */
void gw_conn_request_ended(struct gateway *gw, struct MHD_Connection *mhd, bg_time now)
{
    struct gw_conn *c = conn_of(mhd);
    if (!c || !c->counted) return;
    if (c->consumed_unknown) {
        int unread = 0;
        if (ioctl(c->fd, FIONREAD, &unread) != 0 || unread < 0) unread = 0;
        uint64_t got = data_received(c->fd);
        c->consumed = (uint64_t)unread < got ? got - (uint64_t)unread : 0;
        c->consumed_unknown = 0;
    }
    c->idle_since = now;
    wait_enter(c);
    struct gw_admit *a = &gw->admit;
    if (a->sweep_ev && !a->sweep_armed && event_add(a->sweep_ev, a->sweep_tv) == 0)
        a->sweep_armed = 1; /* (no sweep once the gateway is stopping) */
}

/* ---- start and stop -------------------------------------------------------- */

int gw_admit_start(struct gateway *gw, int fd)
{
    struct gw_admit *a = &gw->admit;
    a->listen_fd = fd;
    a->nbuckets = 64;
    while (a->nbuckets < gw->cfg.max_connections && a->nbuckets < (1u << 20)) a->nbuckets *= 2;
    a->buckets = calloc(a->nbuckets, sizeof *a->buckets);
    a->peek = malloc((size_t)gw->cfg.max_header_size + 1);
    struct timeval tv = {(time_t)gw->cfg.header_timeout_s, 0};
    a->header_tv = event_base_init_common_timeout(gw->base, &tv);
    unsigned sweep_ms = gw->cfg.header_timeout_s * 1000 / 8;
    if (sweep_ms < GW_SWEEP_MIN_MS) sweep_ms = GW_SWEEP_MIN_MS;
    if (sweep_ms > GW_SWEEP_MAX_MS) sweep_ms = GW_SWEEP_MAX_MS;
    struct timeval sweep_tv = {(time_t)(sweep_ms / 1000), (suseconds_t)(sweep_ms % 1000) * 1000};
    a->sweep_tv = event_base_init_common_timeout(gw->base, &sweep_tv);
    a->sweep_ev = event_new(gw->base, -1, EV_PERSIST, sweep_cb, a);
    a->sweep_more_ev = evtimer_new(gw->base, sweep_more_cb, a);
    a->listen_ev = event_new(gw->base, fd, EV_READ | EV_PERSIST, accept_cb, gw);
    a->backoff_ev = evtimer_new(gw->base, backoff_cb, a);
    if (!a->buckets || !a->peek || !a->header_tv || !a->sweep_tv || !a->sweep_ev ||
        !a->sweep_more_ev || !a->listen_ev || !a->backoff_ev || event_add(a->listen_ev, NULL) != 0) {
        log_event(BG_LOG_ERROR, "http_setup_failed", "msg=\"cannot set up the HTTP listener\"");
        return BG_OUT_OF_MEMORY;
    }
    return 0;
}

void gw_admit_stop(struct gateway *gw)
{
    struct gw_admit *a = &gw->admit;
    if (a->listen_ev) event_free(a->listen_ev);
    if (a->backoff_ev) event_free(a->backoff_ev);
    if (a->sweep_ev) event_free(a->sweep_ev);
    if (a->sweep_more_ev) event_free(a->sweep_more_ev);
    a->listen_ev = a->backoff_ev = a->sweep_ev = a->sweep_more_ev = NULL;
    a->sweep_armed = 0;
    a->sweep_cursor = NULL;
    if (a->listen_fd >= 0) close(a->listen_fd);
    a->listen_fd = -1;
    for (struct gw_conn *c = a->wait_head, *next; c; c = next) {
        next = c->next;
        if (!c->mhd) conn_free(c);
    }
    while (a->linger_head) conn_free(a->linger_head);
}

/* Free the table and the buffer (every connection is gone). */
void gw_admit_free(struct gateway *gw)
{
    struct gw_admit *a = &gw->admit;
    free(a->buckets);
    free(a->peek);
    a->buckets = NULL;
    a->peek = NULL;
    while (a->conn_blocks) {
        void *block = a->conn_blocks;
        a->conn_blocks = *(void **)block;
        free(block);
    }
    a->free_conns = NULL;
}

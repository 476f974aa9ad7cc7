/* request.c - what the handlers ask of the request they serve: its query
 * parameters and headers, the status queued for it, and the
 * suspension of a long-poll: the list of waiting requests, the watch on
 * their sockets, the wake-up on the next loop turn. Below the handlers,
 * above reply.c; it calls no handler and nothing of http.c. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "gateway.h"
#include "../io/eventlog.h"

/* ---- the request's fields ---------------------------------------------- */

const char *gw_query(struct gw_request *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

int gw_query_u64(struct gw_request *r, const char *key, uint64_t max, uint64_t *out)
{
    const char *s = gw_query(r, key);
    if (!s) return 0;
    return bg_parse_u64(s, strlen(s), max, out) == 0 ? 0 : -1;
}

int gw_query_limit(struct gw_request *r, uint64_t max, uint64_t *limit, int *reply)
{
    if (gw_query_u64(r, "limit", max, limit) == 0 && *limit > 0) return 0;
    char detail[64];
    snprintf(detail, sizeof detail, "query parameter 'limit' must be 1 to %llu", (unsigned long long)max);
    *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
    return -1;
}

const char *gw_request_header(struct gw_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int gw_reservation_token(struct gw_request *r, const char **token)
{
    const char *header = gw_request_header(r, "X-Reservation"), *query = gw_query(r, "reservation");
    *token = header ? header : query;
    if (header && query && strcmp(header, query) != 0) {
        *token = NULL;
        return -1;
    }
    return 0;
}

int gw_request_kind(struct gw_request *r)
{
    int kind = r->match.route ? r->match.route->kind : GW_KIND_NONE;
    if (kind != GW_KIND_DELETE) return kind;
    const char *token = NULL;
    gw_reservation_token(r, &token);
    return token && *token ? BG_SCOPE_CONSUME : BG_SCOPE_MANAGE;
}

/* Queue the 403 PERMISSION_DENIED of r for `kind` on name[0..len) (the
 * scope it names), counted as a refusal; the reply's outcome. */
static int scope_refuse(struct gw_request *r, int kind, const char *name, size_t len)
{
    char required[BG_SCOPE_REQUIRED_MAX];
    if (len > BG_TUBE_NAME_MAX) len = BG_TUBE_NAME_MAX; /* a bad name: its 400 would come next */
    bg_scope_required((enum bg_scope_kind)kind, name, len, required);
    r->gw->engine->stat.permission_denied++; /* every protocol's refusals, one counter */
    return gw_reply_permission_denied(r->conn, required);
}

int gw_scope_permits(struct gw_request *r, const char *name, size_t len, int *reply)
{
    if (!r->scope) return 1; /* unscoped: no header is looked at */
    int kind = gw_request_kind(r);
    if (kind < 0 || bg_scope_allows(r->scope, (enum bg_scope_kind)kind, name, len)) return 1;
    *reply = scope_refuse(r, kind, name, len);
    return 0;
}

int gw_scope_permits_all(struct gw_request *r, int *reply)
{
    if (!r->scope) return 1;
    int kind = gw_request_kind(r);
    if (kind < 0 || bg_scope_allows_all(r->scope, (enum bg_scope_kind)kind)) return 1;
    *reply = scope_refuse(r, kind, "*", 1);
    return 0;
}

int gw_scope_sees(const struct gw_request *r, const char *name, size_t len)
{
    return !r->scope || bg_scope_sees(r->scope, name, len);
}

int gw_wants_raw(struct gw_request *r)
{
    const char *accept = gw_request_header(r, "Accept");
    return accept && strstr(accept, "application/octet-stream") && !strstr(accept, "json");
}

unsigned gw_open_connections(const struct gw_request *r) { return (unsigned)r->gw->admit.open; }

unsigned gw_queued_status(const struct gw_request *r)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    return info ? info->http_status : 0;
}

void gw_decode_segment(char *s)
{
    char *out = s;
    for (const char *in = s; *in; in++) {
        char c = in[0] == '%' && in[1] == '2' ? (char)(in[2] | 0x20) : 0;
        if (c == 'f' || c == 'e') {
            *out++ = c == 'f' ? '/' : '.';
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

/* ---- long-poll suspension ----------------------------------------------- */

/* Noticing a long-poll's client going away:
 * libmicrohttpd does not poll a suspended connection, so while a long-poll
 * waits the gateway watches its socket itself, and asks once more right
 * before the engine hands it a job (the waiter's alive op in routes.c). */

int gw_peer_alive(struct gw_request *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    int fd = ci->connect_fd;
#ifdef TCP_INFO
    /* TCP's state leaves ESTABLISHED when the peer's FIN (CLOSE_WAIT) or
     * reset (CLOSE) arrives, even behind unread pipelined bytes */
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) == 0) return ti.tcpi_state == TCP_ESTABLISHED;
#endif
    char byte;
    ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got >= 0) return got > 0; /* 0: the read end, a close */
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* The socket of a waiting long-poll became readable or closed. A close or
 * reset ends the wait (204, and libmicrohttpd then finds the close); bytes
 * are a pipelined request, left for libmicrohttpd after the answer. */
static void peer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct gw_request *r = arg;
    if (gw_peer_alive(r)) {
        /* level-triggered (no edge-triggered backend): the bytes would
         * wake us forever, so stop watching; the check before a hand-over
         * still runs */
        if ((what & EV_READ) && !(event_get_events(r->peer_ev) & EV_ET)) {
            event_free(r->peer_ev);
            r->peer_ev = NULL;
        }
        return;
    }
    log_event(BG_LOG_DEBUG, "http_longpoll_abandoned", "msg=\"the client left while it waited\"");
    if (r->waiter_active) bg_client_stop_waiting(&r->waiter);
    r->wait_outcome = BG_TIMED_OUT;
    gw_unlist(r); /* frees r->peer_ev */
    gw_wake(r);
}

/* Watch the socket of long-poll r while it is suspended: edge-triggered
 * where the loop can (one wake-up per change: data, then a close), with
 * EV_CLOSED to see a close behind unread bytes. */
static void peer_watch(struct gw_request *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    int features = event_base_get_features(r->gw->base);
    short what = EV_READ | EV_PERSIST;
    if (features & EV_FEATURE_ET) what |= EV_ET;
    if (features & EV_FEATURE_EARLY_CLOSE) what |= EV_CLOSED;
    r->peer_ev = event_new(r->gw->base, ci->connect_fd, what, peer_cb, r);
    if (r->peer_ev && event_add(r->peer_ev, NULL) != 0) {
        event_free(r->peer_ev);
        r->peer_ev = NULL;
    }
}

/* Put r on the list of waiting requests (resumed at shutdown), and watch
 * its socket. */
static void list_waiting(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    r->prev_waiting = NULL;
    r->next_waiting = gw->waiting;
    if (gw->waiting) gw->waiting->prev_waiting = r;
    gw->waiting = r;
    r->listed = 1;
    peer_watch(r);
}

void gw_suspend(struct gw_request *r)
{
    r->suspended = 1;
    list_waiting(r);
    MHD_suspend_connection(r->conn);
}

void gw_unlist(struct gw_request *r)
{
    if (!r->listed) return;
    if (r->prev_waiting) r->prev_waiting->next_waiting = r->next_waiting;
    else r->gw->waiting = r->next_waiting;
    if (r->next_waiting) r->next_waiting->prev_waiting = r->prev_waiting;
    r->listed = 0;
    if (r->peer_ev) event_free(r->peer_ev); /* before libmicrohttpd may close the socket */
    r->peer_ev = NULL;
}

void gw_give_back(struct gw_request *r, bg_time now)
{
    struct gateway *gw = r->gw;
    for (uint32_t i = 0; i < r->got; i++) {
        struct bg_job *j = bg_job_find(gw->engine, r->job_ids[i]);
        if (j && j->state == BG_JOB_RESERVED && bg_job_reserver(j) == &gw->holder &&
            bg_job_reserves(j) == r->job_reserves[i]) {
            bg_release(&gw->holder, j->id, j->pri, 0, now);
        }
    }
    r->got = 0;
}

void gw_wake(struct gw_request *r)
{
    r->next_woken = r->gw->woken;
    r->gw->woken = r;
    event_active(r->gw->run_ev, EV_READ, 0);
}


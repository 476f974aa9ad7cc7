/* http.c - libmicrohttpd in external polling mode on the libevent loop:
 * the daemon's epoll fd is one libevent event, MHD_get_timeout arms one
 * timer, and MHD_run runs on the loop thread. Request bodies are collected
 * here, with the size limit checked before any byte is read. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "gateway.h"
#include "../io/eventlog.h"

static void gw_run(struct gateway *gw);

static void epoll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_run(arg);
}

static void run_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gateway *gw = arg;
    struct gw_request *r;
    while ((r = gw->woken)) {
        gw->woken = r->next_woken;
        r->next_woken = NULL;
        if (r->suspended) {
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
    }
    gw_run(gw);
}

/* ---- noticing a long-poll's client going away ---------------------------
 * libmicrohttpd does not poll a suspended connection, so while a long-poll
 * waits the gateway watches its socket itself, and asks once more right
 * before the engine hands it a job (gw_waiter_ops.alive). */

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

void gw_list(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    r->prev_waiting = NULL;
    r->next_waiting = gw->waiting;
    if (gw->waiting) gw->waiting->prev_waiting = r;
    gw->waiting = r;
    r->listed = 1;
    peer_watch(r);
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
        if (j && j->state == BG_JOB_RESERVED && j->reserver == &gw->holder &&
            j->reserves == r->job_reserves[i]) {
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

/* Run the daemon, then re-arm its timer and the engine's. */
static void gw_run(struct gateway *gw)
{
    MHD_run(gw->daemon);
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(gw->daemon, &ms) == MHD_YES) {
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
        evtimer_add(gw->timer_ev, &tv);
    } else {
        evtimer_del(gw->timer_ev);
    }
    if (gw->after_run) gw->after_run(gw->after_run_arg);
}

enum MHD_Result gw_reply_json(struct MHD_Connection *c, unsigned status, json_t *v,
                              const char *location)
{
    return gw_reply_json_headers(c, status, v, location, NULL, NULL);
}

/* Queue len bytes of text (copied) with a Content-Type and up to two more
 * headers (a NULL name is skipped). */
static enum MHD_Result queue_text(struct MHD_Connection *c, unsigned status, const char *text,
                                  size_t len, const char *type, const char *name1,
                                  const char *value1, const char *name2, const char *value2)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    if (name1) MHD_add_response_header(resp, name1, value1);
    if (name2) MHD_add_response_header(resp, name2, value2);
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

enum MHD_Result gw_reply_json_headers(struct MHD_Connection *c, unsigned status, json_t *v,
                                      const char *location, const char *name, const char *value)
{
    char *text = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!text) return MHD_NO;
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps leaves room for the NUL we overwrite */
    enum MHD_Result ok = queue_text(c, status, text, n + 1, "application/json",
                                    location ? "Location" : NULL, location, name, value);
    free(text);
    return ok;
}

enum MHD_Result gw_reply_problem(struct MHD_Connection *c, unsigned status, const char *code,
                                 const char *detail)
{
    return gw_reply_problem_allow(c, status, code, detail, NULL);
}

enum MHD_Result gw_reply_problem_allow(struct MHD_Connection *c, unsigned status, const char *code,
                                       const char *detail, const char *allow)
{
    return gw_reply_problem_header(c, status, code, detail, allow ? "Allow" : NULL, allow);
}

enum MHD_Result gw_reply_problem_header(struct MHD_Connection *c, unsigned status,
                                        const char *code, const char *detail,
                                        const char *name, const char *value)
{
    const char *title = status == 400 ? "Bad Request" : status == 401 ? "Unauthorized"
                      : status == 404 ? "Not Found"
                      : status == 405 ? "Method Not Allowed" : status == 409 ? "Conflict"
                      : status == 413 ? "Content Too Large" : status == 422 ? "Unprocessable Content"
                      : status == 503 ? "Service Unavailable"
                      : "Internal Server Error";
    json_t *v = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "about:blank", "title", title,
                          "status", (int)status, "detail", detail, "code", code);
    char *text = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!text) return MHD_NO;
    enum MHD_Result ok = queue_text(c, status, text, strlen(text), "application/problem+json",
                                    status == 503 ? "Retry-After" : NULL, "5", name, value);
    free(text);
    return ok;
}

enum MHD_Result gw_reply_empty(struct MHD_Connection *c, unsigned status)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

unsigned gw_queued_status(const struct gw_request *r)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    return info ? info->http_status : 0;
}

/* Remember the status of the response just queued, for the metrics. */
static void note_status(struct gw_request *r)
{
    unsigned status = gw_queued_status(r);
    if (status) r->status = status;
}

/* Nonzero if the request needs a bearer token: any configured, and the
 * route is not a health check (nor /metrics without --metrics-auth). An
 * unknown path needs one too, so that it tells nothing. */
static int needs_token(const struct gateway *gw, int match_status, enum gw_route_id id)
{
    if (!gw->auth) return 0;
    if (match_status != 404) {
        if (id == R_LIVEZ || id == R_READYZ) return 0;
        if (id == R_METRICS) return gw->metrics_auth;
    }
    return 1;
}

/* First call for a request: count it, check its token and body size. */
static enum MHD_Result begin_request(struct gateway *gw, struct gw_request *r, const char *url,
                                     const char *method)
{
    struct MHD_Connection *conn = r->conn;
    struct gw_match m;
    int match_status = gw_match_route(method, url, &m);
    r->route = match_status == 404 ? -1 : m.index;
    r->method = gw_metrics_method_index(method);
    if (needs_token(gw, match_status, m.id)) {
        const char *given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        if (!gw_auth_check(gw->auth, given)) {
            r->body_too_big = 1; /* the body, if any, is not kept */
            r->responded = 1;
            log_event(BG_LOG_DEBUG, "http_unauthorized", "method=%s path=%s token=%s",
                      log_str(method), log_str(url), given ? "wrong" : "missing");
            enum MHD_Result ok = gw_reply_problem_header(
                conn, 401, "UNAUTHORIZED", "a valid bearer token is required",
                "WWW-Authenticate",
                given ? "Bearer realm=\"beangate\", error=\"invalid_token\""
                      : "Bearer realm=\"beangate\"");
            note_status(r);
            return ok;
        }
    }
    /* the size limit is checked before any of the body is read */
    uint64_t max = gw->engine->max_job_size;
    r->body_limit = strstr(url, "/batch") ? GW_BATCH_BODY_MAX : max;
    const char *len = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (len && strtoull(len, NULL, 10) > r->body_limit) {
        r->body_too_big = 1;
        r->responded = 1;
        enum MHD_Result ok = gw_reply_problem(conn, 413, "JOB_TOO_BIG", "the body is larger than the limit");
        note_status(r);
        return ok;
    }
    return MHD_YES;
}

static void request_durable(struct wal_hold *h);

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct gateway *gw = cls;
    struct gw_request *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->gw = gw;
        r->conn = conn;
        r->started = gw->now();
        gw->in_flight++;
        *con_cls = r;
        return begin_request(gw, r, url, method);
    }
    if (*upload_size) {
        if (!r->body_too_big) {
            if (r->body.len + *upload_size > r->body_limit ||
                bg_buf_append(&r->body, upload_data, *upload_size) != 0) {
                r->body_too_big = 1;
                bg_buf_free(&r->body);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->responded || r->held) return MHD_YES;
    uint64_t before = wal_mark(gw->cfg.wal);
    enum MHD_Result ok = gw_route(r, method, url);
    note_status(r);
    uint64_t mark = wal_mark(gw->cfg.wal);
    if (mark > before && ok == MHD_YES && !r->suspended) {
        /* durable acknowledgement: the queued response leaves only once
         * the records it reports are on disk */
        r->held = 1;
        r->held_prev = NULL;
        r->held_next = gw->held;
        if (gw->held) gw->held->held_prev = r;
        gw->held = r;
        MHD_suspend_connection(conn);
        wal_hold(gw->cfg.wal, &r->hold, mark, request_durable);
    }
    return ok;
}

/* The log holds what a held response reports: let it go. */
static void request_durable(struct wal_hold *h)
{
    struct gw_request *r = (struct gw_request *)((char *)h - offsetof(struct gw_request, hold));
    struct gateway *gw = r->gw;
    if (r->held_prev) r->held_prev->held_next = r->held_next; else gw->held = r->held_next;
    if (r->held_next) r->held_next->held_prev = r->held_prev;
    r->held_prev = r->held_next = NULL;
    MHD_resume_connection(r->conn);
    event_active(gw->run_ev, EV_READ, 0);
}

/* A request ended: if it reserved jobs that never reached the client,
 * put them straight back. */
static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    struct gateway *gw = cls;
    struct gw_request *r = *con_cls;
    if (!r) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) gw_give_back(r, gw->now());
    if (r->waiter_active) bg_client_close(&r->waiter, gw->now());
    bg_time now = gw->now();
    double seconds = now > r->started ? (double)(now - r->started) / 1e9 : 0.0;
    gw_metrics_observe(gw->metrics, r->route, r->method, r->status, seconds);
    gw->in_flight--;
    if (log_enabled(BG_LOG_DEBUG)) {
        const char *pattern = gw_route_pattern(r->route);
        log_event(BG_LOG_DEBUG, "http_request", "method=%s route=%s status=%u seconds=%.6f completed=%s",
                  gw_metrics_method_name(r->method), log_str(pattern ? pattern : "unmatched"),
                  r->status, seconds,
                  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "yes" : "no");
    }
    gw_unlist(r);
    bg_buf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

/* Percent-decode uri in place, except %00 and %2F. A NUL would cut the
 * path or a value short, so it stays as the three characters and fails
 * validation. An encoded '/' must not split a path: it stays encoded until
 * the router has split the path into segments (gw_decode_slashes). */
static size_t unescape_cb(void *cls, struct MHD_Connection *conn, char *uri)
{
    (void)cls;
    (void)conn;
    char *out = uri;
    for (const char *in = uri; *in; in++) {
        int hi, lo;
        if (in[0] == '%' && (hi = hex_digit(in[1])) >= 0 && (lo = hex_digit(in[2])) >= 0 &&
            (hi | lo) != 0 && hi * 16 + lo != '/') {
            *out++ = (char)(hi * 16 + lo);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return (size_t)(out - uri);
}


/* Fill key[0..n) with random bytes (a secret chosen at start). 0 or -1. */
static int random_key(void *key, size_t n)
{
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f) return -1;
    size_t got = fread(key, 1, n, f);
    fclose(f);
    return got == n ? 0 : -1;
}

/* libmicrohttpd's own error messages, as log events. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    log_event(BG_LOG_WARN, "http_server_error", "msg=%s", log_str(msg));
}

void gateway_set_ready(struct gateway *gw, int ready)
{
    if (gw) gw->ready = ready != 0;
}

/* Free what gateway_start made before its daemon. */
static void free_parts(struct gateway *gw)
{
    bg_client_close(&gw->holder, gw->now());
    gw_idempotency_free(gw->idempotency);
    gw_auth_free(gw->auth);
    gw_metrics_free(gw->metrics);
    free(gw);
}

struct gateway *gateway_start(struct event_base *base, struct bg_engine *engine,
                              const struct gateway_config *cfg, bg_time (*now)(void),
                              void (*after_run)(void *), void *after_run_arg)
{
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(cfg->listen_addr, cfg->port, &hints, &res);
    if (rc != 0) {
        log_event(BG_LOG_ERROR, "http_listen_failed", "addr=%s port=%s error=%s",
                  log_str(cfg->listen_addr), log_str(cfg->port), log_str(gai_strerror(rc)));
        return NULL;
    }
    struct gateway *gw = calloc(1, sizeof *gw);
    uint64_t idempotency_key[4];
    if (!gw || random_key(gw->key.k, sizeof gw->key.k) != 0 ||
        random_key(idempotency_key, sizeof idempotency_key) != 0 ||
        bg_client_init_bare(engine, &gw->holder, &bg_client_ops_never_wait, gw) != 0) {
        log_event(BG_LOG_ERROR, "http_setup_failed", "msg=\"cannot set up the HTTP gateway\"");
        freeaddrinfo(res);
        free(gw);
        return NULL;
    }
    gw->engine = engine;
    gw->base = base;
    gw->cfg = *cfg;
    gw->now = now;
    gw->after_run = after_run;
    gw->after_run_arg = after_run_arg;
    gw->started_at = cfg->started_at;
    gw->metrics_auth = cfg->metrics_auth;
    gw->idempotency = gw_idempotency_new(idempotency_key);
    gw->metrics = gw_metrics_new();
    if (cfg->token_count) gw->auth = gw_auth_new(cfg->tokens, cfg->token_count);
    if (!gw->idempotency || !gw->metrics || (cfg->token_count && !gw->auth)) {
        log_event(BG_LOG_ERROR, "http_setup_failed", "msg=\"cannot set up the HTTP gateway\"");
        freeaddrinfo(res);
        free_parts(gw);
        return NULL;
    }
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (res->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    gw->daemon = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, gw,
                                  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, gw, /* must be first */
                                  MHD_OPTION_SOCK_ADDR, res->ai_addr,
                                  MHD_OPTION_NOTIFY_COMPLETED, completed_cb, gw,
                                  MHD_OPTION_UNESCAPE_CALLBACK, unescape_cb, gw,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)GW_CONNECTION_LIMIT,
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)GW_IDLE_TIMEOUT_S,
                                  MHD_OPTION_END);
    freeaddrinfo(res);
    if (!gw->daemon) {
        log_event(BG_LOG_ERROR, "http_listen_failed", "addr=%s port=%s",
                  log_str(cfg->listen_addr), log_str(cfg->port));
        free_parts(gw);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(gw->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    gw->epoll_ev = event_new(base, info->epoll_fd, EV_READ | EV_PERSIST, epoll_cb, gw);
    gw->timer_ev = evtimer_new(base, epoll_cb, gw);
    gw->run_ev = event_new(base, -1, 0, run_cb, gw);
    event_add(gw->epoll_ev, NULL);
    gw_run(gw);
    log_event(BG_LOG_INFO, "http_listening", "addr=%s port=%s auth=%s tokens=%zu metrics_auth=%s",
              log_str(cfg->listen_addr), log_str(cfg->port), gw->auth ? "on" : "off",
              cfg->token_count, gw->metrics_auth ? "on" : "off");
    return gw;
}

void gateway_stop(struct gateway *gw)
{
    if (!gw) return;
    gw->ready = 0;
    /* suspended connections must be resumed before the daemon stops */
    MHD_quiesce_daemon(gw->daemon);
    for (struct gw_request *r = gw->waiting; r; r = r->next_waiting) {
        if (r->peer_ev) event_free(r->peer_ev);
        r->peer_ev = NULL;
        if (r->waiter_active) bg_client_stop_waiting(&r->waiter);
        r->wait_outcome = BG_TIMED_OUT;
        if (r->suspended) {
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
    }
    gw->woken = NULL;
    for (struct gw_request *r = gw->held; r; r = r->held_next) {
        wal_unhold(gw->cfg.wal, &r->hold);
        MHD_resume_connection(r->conn);
    }
    gw->held = NULL;
    /* let the resumed long-polls answer 204 before the daemon goes */
    struct timespec pause = {0, 2000000};
    for (int i = 0; i < 50 && gw->waiting; i++) {
        MHD_run(gw->daemon);
        nanosleep(&pause, NULL);
    }
    MHD_run(gw->daemon);
    MHD_stop_daemon(gw->daemon);
    event_free(gw->epoll_ev);
    event_free(gw->timer_ev);
    event_free(gw->run_ev);
    free_parts(gw);
}

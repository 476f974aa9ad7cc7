/* http.c - libmicrohttpd in external polling mode on the libevent loop:
 * the daemon's epoll fd is one libevent event, MHD_get_timeout arms one
 * timer, and MHD_run runs on the loop thread. The top of the gateway: the
 * request lifecycle. A request's route is matched once, on the first
 * access-handler call; its row gives the auth rule and the body limit
 * (checked before any byte of the body is read), and, once the body is in,
 * the handler. The only file that speaks MHD_Result. */
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gateway.h"
#include "../io/eventlog.h"
#include "../io/listen.h"
#include "../io/loop.h"
#include "../io/tls.h"

static void epoll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_run(arg);
}

/* Let libmicrohttpd go on with r's connection, if it is suspended. */
static void resume(struct gw_request *r)
{
    if (r->suspended) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

/* Resume every request woken since the loop's last turn and empty the
 * woken list. */
static void resume_woken(struct gateway *gw)
{
    struct gw_request *r;
    while ((r = gw->woken)) {
        gw->woken = r->next_woken;
        r->next_woken = NULL;
        resume(r);
    }
}

static void run_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gateway *gw = arg;
    resume_woken(gw);
    gw_run(gw);
}

/* Run the daemon, then re-arm its timer and the engine's. */
void gw_run(struct gateway *gw)
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

/* ---- the history (core/history.c): a sample each second ------------------ */

#define HISTORY_MARGIN_NS 10000000 /* the timer fires this long after a second began */

/* Arm the history timer for just after the next second of gw->now begins,
 * or for the next loop turn while a tube sweep is under way (its next step). */
static void history_arm(struct gateway *gw, bg_time now)
{
    bg_time wait = bg_history_sweeping(&gw->history) ? 0 : BG_SECOND - now % BG_SECOND + HISTORY_MARGIN_NS;
    struct timeval tv = {(time_t)(wait / BG_SECOND), (suseconds_t)(wait % BG_SECOND / 1000)};
    evtimer_add(gw->history_ev, &tv);
}

/* The history's reading of the engine now, HTTP connections counted. */
static void history_read(struct gateway *gw, struct bg_history_reading *out)
{
    bg_history_read_engine(gw->engine, gw->admit.open, out);
}

static void history_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gateway *gw = arg;
    bg_time now = gw->now();
    struct bg_history_reading reading;
    history_read(gw, &reading);
    bg_history_sample(&gw->history, &reading, now);
    bg_history_sweep_tubes(&gw->history, gw->engine, now);
    history_arm(gw, now);
}

/* Start the history at now and its timer. */
static void history_start(struct gateway *gw)
{
    bg_time now = gw->now();
    struct bg_history_reading reading;
    history_read(gw, &reading);
    bg_history_init(&gw->history, &reading, now);
    bg_history_sweep_tubes(&gw->history, gw->engine, now);
    gw->history_ev = evtimer_new(gw->base, history_cb, gw);
    if (gw->history_ev) history_arm(gw, now);
    else log_event(BG_LOG_ERROR, "http_history_failed", "msg=\"no history timer: rates stay 0\"");
}

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* What libmicrohttpd is told after a handler or reply function returned
 * rc: carry on, unless no response could be queued (then the connection
 * closes). */
static enum MHD_Result mhd_result(int rc)
{
    return rc == GW_NO_REPLY ? MHD_NO : MHD_YES;
}

/* Remember the status of the response just queued, for the metrics. */
static void note_status(struct gw_request *r)
{
    unsigned status = gw_queued_status(r);
    if (status) r->status = status;
}

/* Nonzero if the request needs a bearer token: any configured, and its
 * path's auth rule asks for one. An unknown path needs one too, so that it
 * tells nothing. With CORS on, OPTIONS on a known path needs none: a
 * browser sends its preflight without the Authorization header. */
static int needs_token(const struct gateway *gw, const struct gw_match *m)
{
    if (!gw->auth) return 0;
    if (!m->route) return 1;
    if (gw->cors && m->method == GW_OPTIONS) return 0;
    switch (m->route->auth) {
    case GW_AUTH_OPEN:
    case GW_AUTH_PUBLIC: return 0;
    case GW_AUTH_METRICS: return gw->metrics_auth;
    case GW_AUTH_TOKEN: break;
    }
    return 1;
}

/* The bytes of body the request's row reads at most (an unmatched request
 * reads none): never more than all bodies together may hold. */
static uint64_t body_limit(const struct gateway *gw, const struct gw_match *m)
{
    uint64_t limit = gw->engine->max_job_size;
    if (m->status == 0 && m->route->body == GW_BODY_BATCH) limit = gw_batch_body_limit(limit);
    return limit < gw->cfg.max_body_buffer ? limit : gw->cfg.max_body_buffer;
}

/* Take n more bytes of the bodies' budget (--http-max-body-buffer) for r.
 * 0, or -1 when they do not fit now. */
static int reserve_body(struct gateway *gw, struct gw_request *r, uint64_t n)
{
    if (n > gw->cfg.max_body_buffer - gw->body_buffered) return -1;
    gw->body_buffered += n;
    r->body_reserved += n;
    return 0;
}

/* Give r's part of the bodies' budget back. */
static void release_body(struct gateway *gw, struct gw_request *r)
{
    gw->body_buffered -= r->body_reserved;
    r->body_reserved = 0;
}

/* Count one framing header field (MHD_get_connection_values' iterator). */
static enum MHD_Result framing_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    (void)kind;
    struct gw_framing *f = cls;
    f->fields++;
    gw_framing_field(f, key, strlen(key), value ? value : "", value ? strlen(value) : 0);
    return MHD_YES;
}

/* Answer a problem that ends the connection (the body, if any, is not
 * read or kept). */
static enum MHD_Result refuse_request(struct gw_request *r, unsigned status, const char *code,
                                      const char *detail)
{
    r->body_too_big = 1;
    r->responded = 1;
    int rc = gw_reply_problem_header(r->conn, status, code, detail, "Connection", "close");
    note_status(r);
    return mhd_result(rc);
}

/* First call for a request (its head is in): match its route (once: later
 * calls, a resumed long-poll and a held response use r->match), check its
 * framing, its token and its body's size against the row's limit and the
 * budget of all bodies, before any byte of the body is read. */
static enum MHD_Result begin_request(struct gateway *gw, struct gw_request *r, const char *url,
                                     const char *method, const char *version)
{
    struct MHD_Connection *conn = r->conn;
    gw_match_route(method, url, &r->match);
    r->method = gw_metrics_method_index(method);
    /* framing first: a request whose body may end elsewhere for a proxy in
     * front is answered and the connection closed, whoever sends it */
    struct gw_framing f = {0};
    struct gw_problem p;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_field, &f);
    gw_conn_request_began(gw, conn, &f);
    if (gw->cfg.tls) { /* over TLS admit.c did not see the head */
        const union MHD_ConnectionInfo *head = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        char detail[96];
        if (gw_tls_head_check(gw, head ? head->header_size : 0, f.fields, detail, sizeof detail, &p))
            return refuse_request(r, p.status, p.code, p.detail);
    }
    if (gw_framing_verdict(&f, &p)) return refuse_request(r, p.status, p.code, p.detail);
    if (gw_guard_check(r, version, &f, &p)) return refuse_request(r, p.status, p.code, p.detail);
    if (needs_token(gw, &r->match)) {
        const char *given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        r->authenticated = gw_auth_check(gw->auth, given, &r->scope);
        if (!r->authenticated) {
            r->body_too_big = 1; /* the body, if any, is not kept */
            r->responded = 1;
            log_event(BG_LOG_DEBUG, "http_unauthorized", "method=%s path=%s token=%s",
                      log_str(method), log_str(url), given ? "wrong" : "missing");
            int rc = gw_reply_problem_header(
                conn, 401, "UNAUTHORIZED", "a valid bearer token is required",
                "WWW-Authenticate",
                given ? "Bearer realm=\"beangate\", error=\"invalid_token\""
                      : "Bearer realm=\"beangate\"");
            note_status(r);
            return mhd_result(rc);
        }
    }
    /* the size limit is checked before any of the body is read */
    r->body_limit = body_limit(gw, &r->match);
    r->keep_body = r->match.status == 0 && r->match.route->body != GW_BODY_NONE;
    if (f.lengths && f.length > r->body_limit) {
        r->body_too_big = 1;
        r->responded = 1;
        int rc = gw_reply_problem(conn, 413, "JOB_TOO_BIG", "the body is larger than the limit");
        note_status(r);
        return mhd_result(rc);
    }
    /* the declared body is budgeted whole now, so that the bodies being
     * read never hold more than --http-max-body-buffer together; a chunked
     * one takes its part as it arrives */
    if (r->keep_body && f.length && reserve_body(gw, r, f.length) != 0)
        return refuse_request(r, 503, "BODY_BUFFER_FULL",
                              "the server holds as many request bodies as it may: retry later");
    if (r->body_reserved && !bg_buf_reserve(&r->body, r->body_reserved)) {
        release_body(gw, r);
        return refuse_request(r, 503, "OUT_OF_MEMORY", "the server is out of memory");
    }
    return MHD_YES;
}

static void request_durable(struct wal_hold *h);

/* Count a routed request in the cmd-* counters: once (a resumed long-poll
 * is not counted again), as r->commands commands, unless it was malformed
 * (400) or over a limit (413). */
static void count_request(struct gw_request *r)
{
    if (r->counted) return;
    r->counted = 1;
    unsigned status = gw_queued_status(r);
    int cmd = r->match.route->command;
    if (cmd < 0 || status == 400 || status == 413) return;
    bg_count_cmd(r->gw->engine, (enum bg_cmd)cmd, r->commands);
}

/* OPTIONS on a path that exists, with CORS on: a preflight (Origin and
 * Access-Control-Request-Method) from an allowed origin gets 204 with the
 * Access-Control-* headers (the methods are the path's rows), one from any
 * other origin 403 ORIGIN_NOT_ALLOWED without them; a plain OPTIONS gets
 * 204 with Allow. */
static int answer_options(struct gw_request *r)
{
    const char *origin = gw_request_header(r, "Origin");
    int preflight = origin && gw_request_header(r, "Access-Control-Request-Method");
    if (preflight && !gw_cors_allows(r->gw->cors, origin))
        return gw_reply_problem(r->conn, 403, "ORIGIN_NOT_ALLOWED",
                                "this origin may not call the gateway from a browser: it is not in "
                                "--http-cors-origins");
    return gw_reply_options(r->conn, r->match.allow, preflight);
}

/* The body is in: answer 404 or 405 (or OPTIONS), or run the row's handler
 * and turn an outcome it returns into its problem. 0 or GW_NO_REPLY. */
static int dispatch(struct gw_request *r)
{
    const struct gw_match *m = &r->match;
    if (r->body_refused)
        return gw_reply_problem_header(r->conn, 503, "BODY_BUFFER_FULL",
                                       "the server holds as many request bodies as it may: retry later",
                                       "Connection", "close");
    if (m->status == 404) return gw_reply_problem(r->conn, 404, "NOT_FOUND", "no such route");
    if (m->status == 405 && r->gw->cors && m->method == GW_OPTIONS) return answer_options(r);
    if (m->status == 405) {
        char detail[96], allow[64];
        snprintf(allow, sizeof allow, "%s%s", m->allow, r->gw->cors ? ", OPTIONS" : "");
        snprintf(detail, sizeof detail, "allowed: %s", allow);
        return gw_reply_problem_header(r->conn, 405, "METHOD_NOT_ALLOWED", detail, "Allow", allow);
    }
    char detail[160];
    const char *role = m->route->auth == GW_AUTH_TOKEN ? gw_role_refusal(r->gw, detail, sizeof detail) : NULL;
    if (role) return gw_reply_problem(r->conn, 503, role, detail); /* a standby changes nothing */
    /* a scoped token and a {tube} path: the row's kind on that tube (a bad
     * name is left to the handler's 400); ?tubes= and a job's tube are
     * checked by their handlers, once they know the tubes */
    const char *tube = r->scope && m->route->tube == GW_TUBE_PATH ? m->seg[1] : NULL;
    int refused;
    if (tube && bg_tube_name_valid(tube, strlen(tube)) &&
        !gw_scope_permits(r, tube, strlen(tube), &refused))
        return refused;
    if (m->route->tube == GW_TUBE_ALL && !gw_scope_permits_all(r, &refused)) return refused;
    if (!r->counted) r->commands = 1;
    /* the handler reads job states (reservation checks, GET): bring the
     * engine up to now first, whether or not the loop's timer ran */
    r->dispatched = r->gw->now();
    bg_engine_catch_up(r->gw->engine, r->dispatched);
    /* a read changed nothing: its response may be refused for the budget */
    r->gw->responses.refusable = m->method == GW_GET || m->method == GW_HEAD;
    int rc = m->route->handler(r);
    r->gw->responses.refusable = 0;
    if (rc < 0 && rc != GW_NO_REPLY) rc = gw_reply_outcome(r->conn, rc);
    count_request(r);
    return rc;
}

#if defined(__SANITIZE_ADDRESS__)
#define GW_REUSE_REQUESTS 0 /* each freed request is freed: ASan sees a use after it */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GW_REUSE_REQUESTS 0
#endif
#endif
#ifndef GW_REUSE_REQUESTS
#define GW_REUSE_REQUESTS 1
#endif

/* A zeroed request record (NULL: out of memory): a spare one if there is.
 * The record is 2.7 KB; a calloc of it per request cost malloc a
 * consolidation of its small free chunks each time. */
static struct gw_request *request_new(struct gateway *gw)
{
    struct gw_request *r = gw->spare_requests;
    if (!r) return calloc(1, sizeof *r);
    gw->spare_requests = r->next_spare;
    gw->spare_count--;
    memset(r, 0, sizeof *r);
    return r;
}

/* Free r, or keep it for the next request. */
static void request_free(struct gateway *gw, struct gw_request *r)
{
    if (GW_REUSE_REQUESTS && gw->spare_count < GW_SPARE_REQUESTS) {
        r->next_spare = gw->spare_requests;
        gw->spare_requests = r;
        gw->spare_count++;
        return;
    }
    free(r);
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_size, void **con_cls)
{
    struct gateway *gw = cls;
    struct gw_request *r = *con_cls;
    if (!r) {
        r = request_new(gw);
        if (!r) return MHD_NO;
        r->gw = gw;
        r->conn = conn;
        r->started = gw->now();
        gw->in_flight++;
        *con_cls = r;
        return begin_request(gw, r, url, method, version);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (!r->keep_body || r->body_too_big || r->body_refused) return MHD_YES;
        if (r->body.len + n > r->body_limit) {
            r->body_too_big = 1;
        } else if (r->body.len + n > r->body_reserved &&
                   reserve_body(gw, r, r->body.len + n - r->body_reserved) != 0) {
            r->body_refused = 1; /* a chunked body past the budget */
        } else if (bg_buf_append(&r->body, upload_data, n) == 0) {
            return MHD_YES;
        } else {
            r->body_too_big = 1;
        }
        bg_buf_free(&r->body);
        release_body(gw, r);
        return MHD_YES;
    }
    if (r->responded || r->held) return MHD_YES;
    if (gw->stopping && !r->counted) { /* never dispatched: nothing done for it */
        int rc = gw_reply_problem_header(conn, 503, "SHUTTING_DOWN",
                                         "the server is stopping: nothing was done, retry",
                                         "Connection", "close");
        note_status(r);
        return mhd_result(rc);
    }
    gw->engine->reply_pos = 0;
    int rc = dispatch(r);
    note_status(r);
    uint64_t mark = gw->engine->reply_pos;
    if (rc == 0 && !r->suspended && !wal_reply_may_go(gw->cfg.wal, mark)) {
        /* the queued response leaves only once the log keeps the position
         * its change depends on (io/wal.h) */
        r->held = 1;
        r->held_prev = NULL;
        r->held_next = gw->held;
        if (gw->held) gw->held->held_prev = r;
        gw->held = r;
        MHD_suspend_connection(conn);
        wal_hold(gw->cfg.wal, &r->hold, mark, request_durable);
    }
    return mhd_result(rc);
}

/* A held response must never be sent: shut the socket's sending side, so
 * that libmicrohttpd's write fails and the connection closes unanswered. */
static void cut_off(struct gw_request *r)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
}

/* The log holds what a held response reports: let it go. */
static void request_durable(struct wal_hold *h)
{
    struct gw_request *r = (struct gw_request *)((char *)h - offsetof(struct gw_request, hold));
    struct gateway *gw = r->gw;
    if (r->held_prev) r->held_prev->held_next = r->held_next; else gw->held = r->held_next;
    if (r->held_next) r->held_next->held_prev = r->held_prev;
    r->held_prev = r->held_next = NULL;
    if (gw->stopping && !r->releasing) { /* the stop sequence runs the daemon until it is sent */
        r->releasing = 1;
        gw->releasing++;
    }
    MHD_resume_connection(r->conn);
    event_active(gw->run_ev, EV_READ, 0);
}

/* A request ended: if it reserved jobs that never reached the client,
 * put them straight back. */
static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct gateway *gw = cls;
    struct gw_request *r = *con_cls;
    if (!r) return;
    if (r->releasing) gw->releasing--;
    bg_time now = gw->now(); /* one clock reading for all below */
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) gw_give_back(r, now);
    else gw_conn_request_ended(gw, conn, now);
    if (toe == MHD_REQUEST_TERMINATED_WITH_ERROR || toe == MHD_REQUEST_TERMINATED_READ_ERROR ||
        toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT || toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED)
        gw_conn_count(gw, GW_CLOSED_CLIENT); /* the client left or stalled mid-request */
    release_body(gw, r);
    if (r->waiter_active) bg_client_close(&r->waiter, now);
    double seconds = now > r->started ? (double)(now - r->started) / 1e9 : 0.0;
    gw_metrics_observe(gw->metrics, r->match.path, r->method, r->status, seconds);
    gw->in_flight--;
    if (log_enabled(BG_LOG_DEBUG)) {
        const char *pattern = gw_route_pattern(r->match.path);
        log_event(BG_LOG_DEBUG, "http_request", "method=%s route=%s status=%u seconds=%.6f completed=%s",
                  gw_metrics_method_name(r->method), log_str(pattern ? pattern : "unmatched"),
                  r->status, seconds,
                  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "yes" : "no");
    }
    gw_bulk_end(r); /* answered otherwise (a standby's 503) or cut off mid-way */
    gw_unlist(r);
    bg_buf_free(&r->body);
    request_free(gw, r);
    *con_cls = NULL;
}

/* Percent-decode uri in place, except %00 and %2F. A NUL would cut the
 * path or a value short, so it stays as the three characters and fails
 * validation. An encoded '/' must not split a path: it stays encoded until
 * the router has split the path into segments (gw_decode_segment). */
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

/* The starts of libmicrohttpd's messages about what a client did: it left
 * mid-request, reset, or sent what libmicrohttpd refused itself. Routine
 * for a server: logged at debug level (a request it cut is counted by
 * completed_cb, a first head by admit.c). */
static const char *const client_messages[] = {
    "Connection was closed by remote side",
    "Socket has been disconnected when reading",
    "Connection socket is closed when reading",
    "Failed to send data in request",
    "Failed to send the response",
    "Failed to send the chunked response",
    "Failed to send the footers",
    "Error processing request",
    "Failed to parse `Content-Length'",
    "Too large value of 'Content-Length'",
    "Received HTTP/1.1 request without",
    "Not enough memory in pool to allocate header record",
    "Not enough memory in pool to parse cookies",
    "Too late to send an error response",
    "Too late for error response",
    "WARNING: incomplete upload processing",
    /* HTTPS: every failed handshake (a refused client certificate, a
     * client that left, or one closed at the header deadline) */
    "Error: received handshake message out of context",
};

/* libmicrohttpd's own messages, as log events: a client's doing at debug
 * level (and counted), anything else as a warning. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    for (size_t i = 0; i < sizeof client_messages / sizeof client_messages[0]; i++) {
        if (strncmp(msg, client_messages[i], strlen(client_messages[i])) != 0) continue;
        log_event(BG_LOG_DEBUG, "http_client_error", "msg=%s", log_str(msg));
        return;
    }
    log_event(BG_LOG_WARN, "http_server_error", "msg=%s", log_str(msg));
}

void gateway_set_role(struct gateway *gw, gw_role_fn state, void *arg)
{
    if (!gw) return;
    gw->role = state;
    gw->role_arg = arg;
}

static void https_adopt(struct MHD_Connection *conn);

/* libmicrohttpd's notices of connections (admit.c follows them). */
static void connection_cb(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        https_adopt(conn);
        gw_conn_started(cls, conn, socket_context);
    } else {
        gw_conn_closed(cls, *socket_context);
    }
}

void gateway_set_ready(struct gateway *gw, int ready)
{
    if (gw) gw->ready = ready != 0;
}

int gateway_listen_fd(const struct gateway *gw) { return gw ? gw->admit.listen_fd : -1; }

void gateway_set_push(struct gateway *gw, const struct gw_push_hooks *hooks)
{
    if (gw && hooks) gw->push = *hooks;
}

/* ---- HTTPS ------------------------------------------------------------------ */

/* The listener whose credentials the HTTPS daemon serves: libmicrohttpd's
 * certificate callback takes no argument of its own, and a process runs
 * one gateway. */
static struct tls_listener *https_listener;
static int https_verify_client;

/* A presented client certificate must verify against the listener's CA as
 * it is now (libmicrohttpd's own trust is the CA file read at start). */
static int https_verify_cb(gnutls_session_t session)
{
    return tls_listener_verify_client(https_listener, session);
}

/* libmicrohttpd's certificate callback (gnutls_certificate_retrieve_function2),
 * for a session https_adopt could not give the listener's credentials;
 * called in each handshake as the client's hello is read: the listener's
 * chain and key as they are now, so a reload (SIGHUP) reaches every new
 * connection. With a client CA, a presented client certificate is verified
 * in the handshake against the CA as reloaded (a bad one fails it), and with
 * verify_client one is required. MHD_OPTION_HTTPS_MEM_TRUST still gives
 * libmicrohttpd the CA read at start: the names its certificate request
 * lists (a client with one certificate sends it whatever they are). */
static int https_cert_cb(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                         const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                         gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *key)
{
    (void)req_ca_dn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    if (tls_listener_ca_pem(https_listener)) {
        gnutls_certificate_server_set_request(session, https_verify_client ? GNUTLS_CERT_REQUIRE
                                                                            : GNUTLS_CERT_REQUEST);
        gnutls_session_set_verify_function(session, https_verify_cb);
    }
    return tls_listener_current_cert(https_listener, pcert, pcert_length, key);
}

/* A new HTTPS connection, before its handshake (libmicrohttpd made its
 * session on the daemon's credentials, then tells of the connection): the
 * session takes the listener's current credentials instead, so that
 * everything a reload changes reaches it, the CA names its certificate
 * request lists included (GnuTLS takes them from the session's
 * credentials; libmicrohttpd's hold the CA read at start, and no option of
 * 0.9.75 changes them). If that fails, the daemon's credentials stay, with
 * https_cert_cb. */
static void https_adopt(struct MHD_Connection *conn)
{
    if (!https_listener) return;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info && info->tls_session) tls_listener_session_adopt(https_listener, info->tls_session);
}

/* The daemon's HTTPS options into opts (MHD_OPTION_END-terminated). */
static void https_options(struct tls_listener *l, struct MHD_OptionItem opts[4])
{
    size_t n = 0;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_CERT_CALLBACK, 0, (void *)&https_cert_cb};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0,
                                        (void *)tls_listener_priority_string(l)};
    if (tls_listener_ca_pem(l))
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, (void *)tls_listener_ca_pem(l)};
    opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

/* The request counters, labelled by the route table's patterns. */
static struct gw_metrics *new_metrics(void)
{
    int n = gw_route_count();
    const char **labels = calloc((size_t)n + 1, sizeof *labels);
    if (!labels) return NULL;
    for (int i = 0; i < n; i++) labels[i] = gw_route_pattern(i);
    struct gw_metrics *m = gw_metrics_new(labels, n);
    free(labels);
    return m;
}

/* Free what gateway_start made before its daemon. */
static void free_parts(struct gateway *gw)
{
    bg_client_close(&gw->holder, gw->now());
    gw_idempotency_free(gw->idempotency);
    gw_auth_free(gw->auth);
    gw_reply_set_cors(NULL);
    gw_reply_set_budget(NULL);
    gw_cors_free(gw->cors);
    gw_hosts_free(gw->hosts);
    gw_metrics_free(gw->metrics);
    while (gw->spare_requests) {
        struct gw_request *r = gw->spare_requests;
        gw->spare_requests = r->next_spare;
        free(r);
    }
    free(gw);
}

/* The settings left 0 take their defaults. */
static void limits_defaults(struct gateway_config *c)
{
    if (!c->max_wait_s) c->max_wait_s = GW_MAX_WAIT_DEFAULT_S;
    if (!c->max_connections) c->max_connections = GW_MAX_CONNECTIONS_DEFAULT;
    if (!c->header_timeout_s) c->header_timeout_s = GW_HEADER_TIMEOUT_DEFAULT_S;
    if (!c->idle_timeout_s) c->idle_timeout_s = GW_IDLE_TIMEOUT_DEFAULT_S;
    if (!c->max_header_size) c->max_header_size = GW_MAX_HEADER_DEFAULT;
    if (!c->max_body_buffer) c->max_body_buffer = GW_BODY_BUFFER_DEFAULT;
    if (!c->max_response_buffer) c->max_response_buffer = GW_RESPONSE_BUFFER_DEFAULT;
}

struct gateway *gateway_start(struct event_base *base, struct bg_engine *engine,
                              const struct gateway_config *cfg, bg_time (*now)(void),
                              void (*after_run)(void *), void *after_run_arg)
{
    int fd = listen_tcp(cfg->listen_addr, cfg->port);
    if (fd < 0) {
        log_event(BG_LOG_ERROR, "http_listen_failed", "addr=%s port=%s",
                  log_str(cfg->listen_addr), log_str(cfg->port));
        return NULL;
    }
    struct gateway *gw = calloc(1, sizeof *gw);
    uint64_t idempotency_key[4];
    if (!gw || random_key(gw->key.k, sizeof gw->key.k) != 0 ||
        random_key(idempotency_key, sizeof idempotency_key) != 0 ||
        random_key(gw->admit.hash_key, sizeof gw->admit.hash_key) != 0 ||
        bg_client_init_bare(engine, &gw->holder, &bg_client_ops_never_wait, gw) != 0) {
        log_event(BG_LOG_ERROR, "http_setup_failed", "msg=\"cannot set up the HTTP gateway\"");
        close(fd);
        free(gw);
        return NULL;
    }
    gw->admit.listen_fd = fd;
    gw->engine = engine;
    gw->base = base;
    gw->cfg = *cfg;
    limits_defaults(&gw->cfg);
    gw->now = now;
    gw->after_run = after_run;
    gw->run_daemon = gw_run;
    gw->after_run_arg = after_run_arg;
    gw->started_at = cfg->started_at;
    gw->metrics_auth = cfg->metrics_auth;
    gw->idempotency = gw_idempotency_new(idempotency_key);
    gw->metrics = new_metrics();
    size_t tokens = cfg->scopes ? bg_scopes_token_count(cfg->scopes) : 0;
    if (tokens) gw->auth = gw_auth_new(cfg->scopes);
    if (cfg->cors_origins) gw->cors = gw_cors_new(cfg->cors_origins);
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    int loopback = getsockname(fd, (struct sockaddr *)&bound, &bound_len) == 0 &&
                   gw_addr_is_loopback((struct sockaddr *)&bound);
    gw->hosts = gw_hosts_new(cfg->allowed_hosts, loopback);
    if (!gw->idempotency || !gw->metrics || (tokens && !gw->auth) ||
        (cfg->cors_origins && !gw->cors) || !gw->hosts) {
        log_event(BG_LOG_ERROR, "http_setup_failed", "msg=\"cannot set up the HTTP gateway\"");
        free_parts(gw);
        return NULL;
    }
    /* no listening socket of its own: admit.c accepts and hands connections
     * over. Its connection cap is only a backstop above admit.c's count
     * (connections it shut are still libmicrohttpd's until its next run);
     * its memory per connection (zeroed whole at each request, so resident
     * while the connection lives) holds a head of max_header_size bytes, its
     * header records and a response's head. */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    /* MHD_USE_TURBO in plain text: libmicrohttpd closes a connection
     * without shutdown(), so that admit.c can take an idle one back on a
     * second descriptor (parking); the last close still ends the TCP
     * connection. Over TLS a close sends its close_notify alert, so no. */
    struct MHD_OptionItem tls_opts[4] = {{MHD_OPTION_END, 0, NULL}};
    if (!cfg->tls) flags |= MHD_USE_TURBO;
    if (cfg->tls) {
        flags |= MHD_USE_TLS;
        https_listener = cfg->tls;
        https_verify_client = cfg->tls_verify_client;
        https_options(cfg->tls, tls_opts);
    }
    size_t memory = (size_t)gw->cfg.max_header_size + 8192;
    gw->daemon = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, gw,
                                  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, gw, /* must be first */
                                  MHD_OPTION_NOTIFY_COMPLETED, completed_cb, gw,
                                  MHD_OPTION_NOTIFY_CONNECTION, connection_cb, gw,
                                  MHD_OPTION_UNESCAPE_CALLBACK, unescape_cb, gw,
                                  MHD_OPTION_CONNECTION_LIMIT, 2 * gw->cfg.max_connections + 1024,
                                  MHD_OPTION_CONNECTION_TIMEOUT, gw->cfg.idle_timeout_s,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, memory,
                                  MHD_OPTION_ARRAY, tls_opts,
                                  MHD_OPTION_END);
    if (!gw->daemon || gw_admit_start(gw, fd) != 0) {
        log_event(BG_LOG_ERROR, "http_listen_failed", "addr=%s port=%s",
                  log_str(cfg->listen_addr), log_str(cfg->port));
        gw_admit_stop(gw);
        if (gw->daemon) MHD_stop_daemon(gw->daemon);
        gw_admit_free(gw);
        free_parts(gw);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(gw->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    gw->epoll_ev = event_new(base, info->epoll_fd, EV_READ | EV_PERSIST, epoll_cb, gw);
    gw->timer_ev = evtimer_new(base, epoll_cb, gw);
    gw->run_ev = event_new(base, -1, 0, run_cb, gw);
    event_add(gw->epoll_ev, NULL);
    history_start(gw);
    gw_reply_set_cors(gw->cors);
    gw->responses.count.max = gw->cfg.max_response_buffer;
    gw_reply_set_budget(&gw->responses);
    gw_run(gw);
    log_event(BG_LOG_INFO, "http_listening",
              "addr=%s port=%s auth=%s tokens=%zu metrics_auth=%s max_wait=%u cors_origins=%s max_connections=%u "
              "max_connections_per_ip=%u header_timeout=%u idle_timeout=%u max_header_size=%u "
              "max_body_buffer=%llu max_response_buffer=%llu tls=%s",
              log_str(cfg->listen_addr), log_str(cfg->port), gw->auth ? "on" : "off",
              tokens, gw->metrics_auth ? "on" : "off", gw->cfg.max_wait_s,
              log_str(cfg->cors_origins ? cfg->cors_origins : "none"),
              gw->cfg.max_connections, gw->cfg.max_per_address, gw->cfg.header_timeout_s,
              gw->cfg.idle_timeout_s, gw->cfg.max_header_size,
              (unsigned long long)gw->cfg.max_body_buffer, (unsigned long long)gw->cfg.max_response_buffer,
              !cfg->tls ? "off" : cfg->tls_verify_client ? "client_certificate_required"
              : tls_listener_ca_pem(cfg->tls) ? "client_certificate_verified" : "on");
    return gw;
}

void gateway_stop_reading(struct gateway *gw)
{
    if (!gw || gw->stopping) return;
    gw->ready = 0;
    gw->stopping = 1;
    gw_admit_stop(gw); /* no new connections */
    /* suspended connections must be resumed before the daemon stops */
    for (struct gw_request *r = gw->waiting; r; r = r->next_waiting) {
        if (r->peer_ev) event_free(r->peer_ev);
        r->peer_ev = NULL;
        if (r->waiter_active) bg_client_stop_waiting(&r->waiter);
        r->wait_outcome = BG_TIMED_OUT;
        resume(r);
    }
    /* and those woken since the loop's last turn (off the list already) */
    resume_woken(gw);
}

/* Run the daemon until every long-poll and released response is answered
 * (or cut off), or deadline passes. */
static void run_until_answered(struct gateway *gw, bg_time deadline)
{
    int epoll_fd = event_get_fd(gw->epoll_ev);
    for (;;) {
        MHD_run(gw->daemon);
        bg_time now = loop_now(); /* the real clock, whatever gw->now is */
        if ((!gw->waiting && !gw->releasing) || now >= deadline) return;
        struct pollfd pfd = {epoll_fd, POLLIN, 0};
        bg_time wait_ms = (deadline - now) / 1000000 + 1;
        poll(&pfd, 1, wait_ms > 10 ? 10 : (int)wait_ms);
    }
}

void gateway_stop(struct gateway *gw, bg_time deadline)
{
    if (!gw) return;
    gateway_stop_reading(gw); /* if the stop sequence did not already */
    /* a held response goes only if the log kept what it reports (the stop
     * sequence finished the log first); the others are cut off unsent: the
     * client sees the connection close without a status */
    for (struct gw_request *r = gw->held; r; r = r->held_next) {
        wal_unhold(gw->cfg.wal, &r->hold);
        if (!wal_reply_may_go(gw->cfg.wal, r->hold.mark)) cut_off(r);
        r->releasing = 1;
        gw->releasing++;
        MHD_resume_connection(r->conn);
    }
    gw->held = NULL;
    run_until_answered(gw, deadline);
    MHD_stop_daemon(gw->daemon);
    gw_admit_free(gw);
    event_free(gw->epoll_ev);
    event_free(gw->timer_ev);
    event_free(gw->run_ev);
    if (gw->history_ev) event_free(gw->history_ev);
    free_parts(gw);
}

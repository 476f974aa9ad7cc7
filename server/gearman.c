/* gearman.c - the Gearman listener: core/gearman_session.c plugged into the
 * connection layer (io/conn.c), the sweep timer, and what the protocol
 * asks of the process (its facts, the admin `shutdown`). */
#include <stdlib.h>
#include <unistd.h>

#include "server.h"
#include "../core/gearman.h"
#include "../io/eventlog.h"
#include "../io/listen.h"
#include "../io/loop.h"

#define GM_IN_SLACK 4096               /* header + function + unique + NULs */
#define GM_SWEEP_MS 100                /* a sweep step runs this often */
#define GM_SWEEP_BUCKETS 1024          /* record buckets looked at per step */

struct gearman {
    struct gm_server server;
    struct conn_protocol proto;
    struct conn_server *conns;
    struct conn_server *conns_tls; /* --gearman-tls-port, or NULL */
    const struct server_config *cfg; /* its scopes: the access file in force (server_peer_scope) */
    struct event *sweep_ev;
};

/* ---- what the session asks of the process -------------------------------- */

static const char *hook_verbosity(void *ctx)
{
    (void)ctx;
    return log_enabled(BG_LOG_DEBUG) ? "DEBUG" : log_enabled(BG_LOG_INFO) ? "INFO" : "WARNING";
}

static uint64_t hook_wall_s(void *ctx)
{
    (void)ctx;
    return loop_wall_now() / BG_SECOND;
}

static void hook_stop(void *ctx, enum gm_stop how)
{
    struct gearman *g = ctx;
    if (how == GM_STOP_NOW) {
        log_event(BG_LOG_INFO, "shutdown", "by=gearman_admin");
        loop_stop();
        return;
    }
    log_event(BG_LOG_INFO, "shutdown", "by=gearman_admin mode=graceful");
    conn_server_pause(g->conns); /* no new Gearman connections */
}

static void hook_bad_request(void *ctx, const struct gm_session *s, const char *code)
{
    (void)ctx;
    log_event(BG_LOG_DEBUG, "gearman_bad_packet", "fd=%d code=%s", s->peer_fd, log_str(code));
}

static void hook_cross_protocol(void *ctx, const struct gm_session *s)
{
    (void)ctx;
    server_log_cross_protocol("gearman", s->peer);
}

/* ---- the session in the connection layer ---------------------------------- */

/* DELETE /clients/{id}: the connection closes as on a hang-up. */
static void gearman_close_now(struct bg_client *c, bg_time now)
{
    (void)now;
    conn_close_stream(&container_of(c, struct gm_session, client)->stream);
}

static int gearman_open(void *ctx, struct bg_stream *s, const struct conn_peer *peer, bg_time now)
{
    struct gearman *g = ctx;
    struct gm_session *session = (struct gm_session *)s;
    int rc = gm_session_init(&g->server, session, peer->fd, peer->addr);
    session->scope = server_peer_scope(g->cfg->scopes, peer);
    if (rc == 0) conn_list_client(&session->client, BG_CLIENT_GEARMAN, peer, gearman_close_now, now);
    return rc;
}

static size_t gearman_feed(struct bg_stream *s, const char *in, size_t len, bg_time now)
{
    struct gm_session *session = (struct gm_session *)s;
    if (len) bg_client_active(&session->client, now);
    return gm_session_feed(session, in, len, now);
}

static void gearman_close(struct bg_stream *s, bg_time now) { gm_session_close((struct gm_session *)s, now); }

/* A sleeping worker, a worker holding a job and a client awaiting results
 * wait for the server: not idle. */
static int gearman_waiting(const struct bg_stream *s)
{
    const struct gm_session *g = (const struct gm_session *)s;
    return g->sleeping || g->listening_count || g->client.reserved_head;
}

/* The connection is closed for a limit: an ERROR packet says which. */
static void gearman_limit_hit(struct bg_stream *s, enum conn_reason why, bg_time now)
{
    (void)now;
    gm_session_refuse((struct gm_session *)s, why == CONN_REQUEST_TIMEOUT ? "REQUEST_TIMEOUT" : "IDLE_TIMEOUT",
                      why == CONN_REQUEST_TIMEOUT
                          ? "the request did not arrive in time (--request-timeout): closing"
                          : "the connection was idle too long (--idle-timeout): closing");
}

/* Every GM_SWEEP_MS: one bounded step of the sweep; a graceful shutdown
 * ends when it says no worker holds a job. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct gearman *g = arg;
    if (gm_server_sweep(&g->server, GM_SWEEP_BUCKETS)) loop_stop();
    loop_engine_changed();
}

/* ---- the listener ------------------------------------------------------- */

int gearman_listen_fd(const struct gearman *g) { return conn_server_fd(g->conns); }

int gearman_tls_listen_fd(const struct gearman *g) { return g->conns_tls ? conn_server_fd(g->conns_tls) : -1; }

uint64_t gearman_connections(const struct gearman *g)
{
    return g ? conn_server_count(g->conns) + (g->conns_tls ? conn_server_count(g->conns_tls) : 0) : 0;
}

struct gearman *gearman_start(struct server *srv, const struct server_config *cfg)
{
    struct gearman *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->cfg = cfg;
    struct gm_hooks hooks = {
        .ctx = g,
        .pid = (long)getpid(),
        .hostname = srv->hostname,
        .verbosity = hook_verbosity,
        .wall_s = hook_wall_s,
        .stop = hook_stop,
        .bad_request = hook_bad_request,
        .cross_protocol = hook_cross_protocol,
    };
    uint32_t max_packet = srv->engine.max_job_size + GM_IN_SLACK;
    if (gm_server_init(&g->server, &srv->engine, &hooks, max_packet, cfg->gearman_admin_shutdown,
                       srv->hash_key) != 0) {
        free(g);
        return NULL;
    }
    g->proto = (struct conn_protocol){
        .name = "gearman",
        .event_prefix = "gearman_",
        .session_size = sizeof(struct gm_session),
        /* input holds at least one packet of the largest size (the parser
         * says when a size is too big) and a read */
        .limits = server_conn_limits(cfg, (size_t)max_packet + GM_HEADER_SIZE),
        .ctx = g,
        .open = gearman_open,
        .feed = gearman_feed,
        .close = gearman_close,
        .waiting = gearman_waiting,
        .limit_hit = gearman_limit_hit,
    };
    int fd = listen_tcp(cfg->gearman_listen, cfg->gearman_port);
    if (fd < 0 || conn_server_start(&g->conns, &g->proto, fd, &srv->engine, srv->wal) != 0) {
        if (fd >= 0) close(fd);
        gm_server_destroy(&g->server, loop_now());
        free(g);
        return NULL;
    }
    if (cfg->gearman_tls_port) {
        int tls_fd = listen_tcp(cfg->gearman_listen, cfg->gearman_tls_port);
        if (tls_fd < 0 ||
            conn_server_start_tls(&g->conns_tls, &g->proto, tls_fd, &srv->engine, srv->wal, srv->tls) != 0) {
            if (tls_fd >= 0) close(tls_fd);
            conn_server_stop(g->conns, loop_now());
            gm_server_destroy(&g->server, loop_now());
            free(g);
            return NULL;
        }
        log_event(BG_LOG_INFO, "listening", "protocol=gearman tls=1 addr=%s port=%s",
                  log_str(cfg->gearman_listen), log_str(cfg->gearman_tls_port));
    }
    g->sweep_ev = event_new(loop_base(), -1, EV_PERSIST, sweep_cb, g);
    struct timeval every = {GM_SWEEP_MS / 1000, (GM_SWEEP_MS % 1000) * 1000};
    event_add(g->sweep_ev, &every);
    log_event(BG_LOG_INFO, "listening", "protocol=gearman addr=%s port=%s",
              log_str(cfg->gearman_listen), log_str(cfg->gearman_port));
    return g;
}

void gearman_stop_reading(struct gearman *g)
{
    if (!g) return;
    conn_server_stop_reading(g->conns);
    conn_server_stop_reading(g->conns_tls);
}

void gearman_stop(struct gearman *g, bg_time deadline)
{
    if (!g) return;
    conn_server_stop(g->conns, deadline);
    conn_server_stop(g->conns_tls, deadline);
    if (g->sweep_ev) event_free(g->sweep_ev);
    gm_server_destroy(&g->server, loop_now());
    free(g);
}

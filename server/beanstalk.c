/* beanstalk.c - the beanstalk listener: core/codec.c's session plugged into
 * the connection layer (io/conn.c), on the address of -l/-p, a UNIX socket
 * (-l unix:PATH) or the socket systemd passed. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "../io/conn.h"
#include "../io/eventlog.h"
#include "../io/listen.h"

static void session_process_info(struct bg_session *s, struct bg_process_info *pi)
{
    server_process_info(s->io_owner, pi);
}

static void session_cross_protocol(struct bg_session *s)
{
    (void)s;
    server_log_cross_protocol("beanstalk", NULL);
}

static const struct bg_session_io session_io = {.process_info = session_process_info,
                                                .cross_protocol = session_cross_protocol};

/* DELETE /clients/{id}: the connection closes as on a hang-up. */
static void beanstalk_close_now(struct bg_client *c, bg_time now)
{
    (void)now;
    conn_close_stream(&container_of(c, struct bg_session, client)->stream);
}

static int beanstalk_open(void *ctx, struct bg_stream *s, const struct conn_peer *peer, bg_time now)
{
    struct server *srv = ctx;
    struct bg_session *session = (struct bg_session *)s;
    int rc = bg_session_init(&srv->engine, session, &session_io, srv);
    session->scope = server_peer_scope(srv->cfg->scopes, peer);
    if (rc == 0) conn_list_client(&session->client, BG_CLIENT_BEANSTALK, peer, beanstalk_close_now, now);
    return rc;
}

static size_t beanstalk_feed(struct bg_stream *s, const char *in, size_t len, bg_time now)
{
    struct bg_session *session = (struct bg_session *)s;
    if (len) bg_client_active(&session->client, now);
    return bg_session_feed(session, in, len, now);
}

static void beanstalk_peer_eof(struct bg_stream *s, bg_time now)
{
    bg_session_peer_eof((struct bg_session *)s, now);
}

static void beanstalk_close(struct bg_stream *s, bg_time now) { bg_session_close((struct bg_session *)s, now); }

/* A connection that holds reservations is working, not idle. */
static int beanstalk_waiting(const struct bg_stream *s)
{
    return ((const struct bg_session *)s)->client.reserved_head != NULL;
}

int beanstalk_start(struct server *srv, const struct server_config *cfg)
{
    static struct conn_protocol proto = {
        .name = "beanstalk",
        .event_prefix = "",
        .session_size = sizeof(struct bg_session),
        .open = beanstalk_open,
        .feed = beanstalk_feed,
        .peer_eof = beanstalk_peer_eof,
        .close = beanstalk_close,
        .waiting = beanstalk_waiting,
        /* no limit_hit: beanstalk has no word for a closed connection */
    };
    proto.ctx = srv;
    /* a line is at most 224 bytes and a body goes straight into its job:
     * only commands sent behind a blocked reserve wait in the input */
    proto.limits = server_conn_limits(cfg, 0);
    int fd = listen_inherited();
    if (fd >= 0) {
        snprintf(srv->listen_desc, sizeof srv->listen_desc, "systemd-fd-3");
    } else if (strncmp(cfg->listen_addr, "unix:", 5) == 0) {
        fd = listen_unix(cfg->listen_addr + 5, cfg->user);
        if (fd >= 0) snprintf(srv->unix_path, sizeof srv->unix_path, "%s", cfg->listen_addr + 5);
    } else {
        fd = listen_tcp(cfg->listen_addr, cfg->port);
    }
    if (fd < 0) return BG_IO_ERROR;
    srv->listen_fd = fd;
    if (conn_server_start(&srv->beanstalk, &proto, fd, &srv->engine, srv->wal) != 0) {
        close(fd);
        return BG_OUT_OF_MEMORY;
    }
    if (!cfg->tls_port) return 0;
    /* the same protocol over TLS, beside the plain port */
    int tls_fd = listen_tcp(cfg->listen_addr, cfg->tls_port);
    if (tls_fd < 0) return BG_IO_ERROR;
    srv->tls_listen_fd = tls_fd;
    if (conn_server_start_tls(&srv->beanstalk_tls, &proto, tls_fd, &srv->engine, srv->wal, srv->tls) != 0) {
        close(tls_fd);
        return BG_OUT_OF_MEMORY;
    }
    log_event(BG_LOG_INFO, "listening", "protocol=beanstalk tls=1 addr=%s port=%s", log_str(cfg->listen_addr),
              log_str(cfg->tls_port));
    return 0;
}

void beanstalk_stop_reading(struct server *srv)
{
    conn_server_stop_reading(srv->beanstalk);
    conn_server_stop_reading(srv->beanstalk_tls);
}

void beanstalk_stop(struct server *srv, bg_time deadline)
{
    conn_server_stop(srv->beanstalk, deadline);
    srv->beanstalk = NULL;
    conn_server_stop(srv->beanstalk_tls, deadline);
    srv->beanstalk_tls = NULL;
    if (srv->unix_path[0]) unlink(srv->unix_path);
}

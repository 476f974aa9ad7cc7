/* main.c - the beangate process: flags, the loop, the timer, signals. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <pwd.h>
#include <grp.h>
#include <limits.h>
#include <netdb.h>
#include <sys/socket.h>

#include "server.h"
#include "../gateway/gateway.h"
#include "../io/loop.h"
#include "../io/wal.h"
#include "../io/repl.h"
#include "../io/eventlog.h"
#include "../io/tls.h"
#include "push.h"

void server_log_cross_protocol(const char *protocol, const char *peer)
{
    static struct log_limit limit;
    unsigned long long held = 0;
    if (!log_limit_pass(&limit, loop_now(), 10 * BG_SECOND, &held)) return;
    log_event(BG_LOG_WARN, "cross_protocol_closed",
              "protocol=%s peer=%s held_back=%llu msg=\"a line of HTTP (a web page's request?) "
              "on this port: connection closed, nothing of it run\"",
              protocol, log_str(peer), held);
}

void server_process_info(struct server *srv, struct bg_process_info *pi)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    pi->pid = (long)getpid();
    pi->utime = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    pi->stime = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    pi->uptime_s = (loop_now() - srv->started_at) / BG_SECOND;
    pi->instance_id = srv->instance_id;
    pi->hostname = srv->hostname;
    pi->os = srv->os;
    pi->platform = srv->platform;
    pi->binlog_max_size = 10485760; /* the reference's default without -b */
    pi->binlog_sync_age_ms = -1;
    pi->gearman_connections = gearman_connections(srv->gearman);
    wal_stats(srv->wal, pi);
    if (srv->repl) {
        struct repl_stats st;
        repl_get_stats(srv->repl, &st);
        pi->repl_enabled = 1;
        pi->repl_role = repl_role_name(st.role);
        pi->repl_primary = st.role == REPL_PRIMARY && srv->serving;
        pi->repl_applied_seq = st.applied_seq;
        pi->repl_published_seq = st.published_seq;
        pi->repl_stream_last_seq = st.stream_last_seq;
        pi->repl_messages_published = st.messages_published;
        pi->repl_publish_retries = st.publish_retries;
        pi->repl_purges = st.purges;
        pi->repl_lease_renewals = st.lease_renewals;
        pi->repl_lease_failures = st.lease_failures;
        pi->repl_lease_age_ms = st.lease_age_ms;
    }
}

/* Process facts for the gateway's GET /stats. */
static void gateway_process_info(void *arg, struct bg_process_info *pi)
{
    server_process_info(arg, pi);
}

/* /metrics families of the connection layer's limits and of job memory. */
static int server_metrics(void *arg, struct bg_buf *b)
{
    struct server *srv = arg;
    struct conn_counters n;
    conn_get_counters(&n);
    int rc = bg_buf_printf(b, "# HELP beangate_connections_rejected_total Beanstalk and Gearman connections "
                              "refused at accept or closed by a limit, by reason.\n"
                              "# TYPE beangate_connections_rejected_total counter\n");
    for (int r = 0; rc == 0 && r < CONN_REASON_COUNT; r++)
        rc = bg_buf_printf(b, "beangate_connections_rejected_total{reason=\"%s\"} %llu\n",
                           conn_reason_name((enum conn_reason)r), (unsigned long long)n.closed[r]);
    if (rc == 0)
        rc = bg_buf_printf(b, "# HELP beangate_accept_paused_total Times accepting paused at the open-file limit.\n"
                              "# TYPE beangate_accept_paused_total counter\n"
                              "beangate_accept_paused_total %llu\n"
                              "# HELP beangate_job_memory_bytes Bytes held by jobs (each its body + 112).\n"
                              "# TYPE beangate_job_memory_bytes gauge\n"
                              "beangate_job_memory_bytes %llu\n"
                              "# HELP beangate_max_job_memory_bytes The job-memory ceiling (--max-job-memory); 0: none.\n"
                              "# TYPE beangate_max_job_memory_bytes gauge\n"
                              "beangate_max_job_memory_bytes %llu\n"
                              "# HELP beangate_reply_memory_bytes Bytes of replies beanstalk and Gearman connections "
                              "hold unsent (large listings are refused past --max-reply-memory).\n"
                              "# TYPE beangate_reply_memory_bytes gauge\n"
                              "beangate_reply_memory_bytes %llu\n"
                              "# HELP beangate_replies_refused_total Large listings answered OUT_OF_MEMORY for "
                              "--max-reply-memory.\n"
                              "# TYPE beangate_replies_refused_total counter\n"
                              "beangate_replies_refused_total %llu\n",
                           (unsigned long long)n.accept_paused, (unsigned long long)srv->engine.job_memory,
                           (unsigned long long)srv->engine.max_job_memory, (unsigned long long)n.reply_memory,
                           (unsigned long long)n.replies_refused);
    return rc;
}

/* The gateway changed the queue: the next deadline may have moved. */
static void after_gateway_run(void *arg)
{
    (void)arg;
    loop_engine_changed();
}

/* Whatever this loop turn logged goes to the flusher. */
static void hand_log_batch(void *wal) { wal_kick(wal); }

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct server *srv = arg;
    bg_engine_drain(&srv->engine);
    log_event(BG_LOG_INFO, "draining", "puts=refused");
}

/* SIGHUP: read every TLS listener's files again (each logs how it went;
 * a listener whose new files are bad keeps its old ones), and the access
 * file (a bad one keeps the old grants). */
static void reload_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct server *srv = arg;
    tls_reload_all();
    if (server_reload_access(srv->cfg) == 0 && gateway_set_scopes(srv->gateway, srv->cfg->scopes) != 0)
        log_event(BG_LOG_ERROR, "access_reload_failed",
                  "path=%s msg=\"out of memory: the gateway keeps the old tokens\"",
                  log_str(srv->cfg->http_token_file));
}

/* Push deliveries in flight at SIGTERM have finished, or the grace ran out. */
static void push_stopped(void *arg)
{
    (void)arg;
    loop_stop();
}

/* SIGTERM, SIGINT: stop, once push deliveries in flight have finished
 * (within --push-grace); a second signal stops at once. */
static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct server *srv = arg;
    if (push_stop(srv->push, push_stopped, srv)) return;
    loop_stop();
}

/* Become `name`'s user and group, handing the log's files over first.
 * 0, or BG_IO_ERROR / BG_NOT_FOUND with a message. */
static int become_user(const char *name, struct wal *wal)
{
    struct passwd *pw = getpwnam(name);
    if (!pw) {
        log_event(BG_LOG_ERROR, "no_such_user", "user=%s", log_str(name));
        return BG_NOT_FOUND;
    }
    /* the log was opened as root: its files must be the user's, or the
     * next segment could not be created */
    if (wal && wal_chown(wal, pw->pw_uid, pw->pw_gid) != 0) return BG_IO_ERROR;
    if (setgroups(0, NULL) != 0 || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
        log_event(BG_LOG_ERROR, "become_user_failed", "user=%s error=%s", log_str(name), log_str(strerror(errno)));
        return BG_IO_ERROR;
    }
    return 0;
}

/* Fill out[0..n) (n <= 256) with random bytes from the kernel: 0, or
 * BG_IO_ERROR with errno set. */
static int random_bytes(void *out, size_t n)
{
    ssize_t got;
    do got = getrandom(out, n, 0); while (got < 0 && errno == EINTR);
    if (got == (ssize_t)n) return 0;
    if (got >= 0) errno = EIO;
    return BG_IO_ERROR;
}

/* Fill the stats facts that never change, and the process's hash key. 0,
 * or BG_IO_ERROR when no random bytes could be read (said). */
static int describe_host(struct server *srv)
{
    unsigned char raw[8];
    if (random_bytes(raw, sizeof raw) != 0 || random_bytes(srv->hash_key, sizeof srv->hash_key) != 0) {
        log_event(BG_LOG_ERROR, "no_randomness", "error=%s", log_str(strerror(errno)));
        return BG_IO_ERROR;
    }
    for (int i = 0; i < 8; i++) snprintf(srv->instance_id + 2 * i, 3, "%02x", raw[i]);
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(srv->hostname, sizeof srv->hostname, "%s", u.nodename);
        snprintf(srv->os, sizeof srv->os, "%s", u.version);
        snprintf(srv->platform, sizeof srv->platform, "%s", u.machine);
    }
    return 0;
}

/* --max-connections 0: the open-file limit less an eighth, at least 32
 * descriptors left for the log, the HTTP gateway and push (logged). */
static uint64_t max_connections(uint64_t given)
{
    if (given) return given;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
    uint64_t files = (uint64_t)rl.rlim_cur, spare = files / 8 < 32 ? 32 : files / 8;
    uint64_t n = files > spare ? files - spare : 1;
    log_event(BG_LOG_INFO, "max_connections", "value=%llu open_file_limit=%llu from=default",
              (unsigned long long)n, (unsigned long long)files);
    return n;
}

/* Ask GET /readyz over TLS on connected socket fd; the status line and what
 * follows into reply[n]. The server's certificate is not verified: this
 * asks a server of the machine whether it is ready, not who it is. 1 if an
 * answer came. */
static int readyz_over_tls(int fd, const char *request, size_t len, char *reply, size_t n)
{
    gnutls_certificate_credentials_t cred;
    gnutls_session_t s;
    if (gnutls_certificate_allocate_credentials(&cred) < 0) return 0;
    int ok = gnutls_init(&s, GNUTLS_CLIENT | GNUTLS_NO_SIGNAL) == 0;
    if (!ok) {
        gnutls_certificate_free_credentials(cred);
        return 0;
    }
    ok = gnutls_set_default_priority(s) == 0 && gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, cred) == 0;
    int r = GNUTLS_E_INTERRUPTED;
    if (ok) {
        gnutls_transport_set_int(s, fd);
        do r = gnutls_handshake(s); /* the socket's timeouts bound it */
        while (r < 0 && r != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(r));
        ok = r == 0;
    }
    if (ok) ok = gnutls_record_send(s, request, len) == (ssize_t)len;
    if (ok) ok = gnutls_record_recv(s, reply, n - 1) > 12;
    gnutls_deinit(s);
    gnutls_certificate_free_credentials(cred);
    return ok;
}

/* GET /readyz of host:port, over TLS or not: its status line and what
 * follows into reply[n] (NUL-terminated). 1 if an answer came. */
static int ask_readyz(const char *host, const char *port, int tls, char *reply, size_t n)
{
    static const char request[] = "GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n";
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    memset(reply, 0, n);
    if (getaddrinfo(host, port, &hints, &res) != 0) return 0;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    if (ok && tls) {
        ok = readyz_over_tls(fd, request, sizeof request - 1, reply, n);
    } else if (ok) {
        ok = write(fd, request, sizeof request - 1) == (ssize_t)(sizeof request - 1);
        if (ok) ok = read(fd, reply, n - 1) > 12;
    }
    if (fd >= 0) close(fd);
    return ok;
}

/* `beangate --healthcheck[=HOST:PORT]`: ask a running server's GET /readyz
 * (default 127.0.0.1 and the HTTP port of the settings, http_port) and exit
 * 0 if it answers 200, else 1. Docker's HEALTHCHECK uses this: a slim image
 * has no curl. A gateway that serves HTTPS answers a plain request with 400
 * PLAIN_HTTP_TO_HTTPS_PORT: then it is asked again over TLS (one that
 * requires client certificates cannot be asked: unhealthy). */
static int healthcheck(const char *arg, const char *http_port)
{
    char host[256] = "127.0.0.1";
    const char *port = http_port;
    if (arg && *arg) {
        const char *colon = strrchr(arg, ':');
        if (!colon || (size_t)(colon - arg) >= sizeof host) return 1;
        memcpy(host, arg, (size_t)(colon - arg));
        host[colon - arg] = '\0';
        port = colon + 1;
    }
    /* a server that closes mid-request (one that requires a client
     * certificate ends the handshake) is an answer: unhealthy, not SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    char reply[512];
    int ok = ask_readyz(host, port, 0, reply, sizeof reply);
    if (ok && strstr(reply, "PLAIN_HTTP_TO_HTTPS_PORT")) ok = ask_readyz(host, port, 1, reply, sizeof reply);
    int healthy = ok && strncmp(reply + 8, " 200", 4) == 0;
    printf("%s\n", healthy ? "healthy" : "unhealthy");
    return healthy ? 0 : 1;
}

/* "127.0.0.1:11300" or "[::1]:11300": the address a listening socket is
 * bound to (the real port, also when 0 was asked for); "?" if unknown. */
static void bound_address(int fd, char *out, size_t size)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &len) != 0 ||
        getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, size, "?");
        return;
    }
    snprintf(out, size, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* The startup block: once every listener is up, a few lines for people on
 * stdout (stderr keeps only key=value events, for machines): the version,
 * each listener, where the jobs live, where the docs are. */
static void print_startup_block(const struct server *srv, const struct server_config *cfg)
{
    char addr[NI_MAXHOST + NI_MAXSERV + 4], http[sizeof addr] = "";
    const char *scheme = cfg->http_tls || cfg->http_tls_cert ? "https" : "http";
    int client_ca = cfg->http_tls ? cfg->tls_ca != NULL : cfg->http_tls_ca != NULL;
    int verify_client = cfg->http_tls ? cfg->tls_verify_client : cfg->http_tls_verify_client;
    printf("beangate %s (beanstalkd %s protocol) is up; Ctrl-C or SIGTERM stops it\n",
           BEANGATE_VERSION, BG_VERSION);
    if (srv->unix_path[0]) {
        printf("  beanstalk  unix:%s\n", srv->unix_path);
    } else {
        bound_address(srv->listen_fd, addr, sizeof addr);
        printf("  beanstalk  %s%s\n", addr, srv->listen_desc[0] ? " (socket from systemd)" : "");
    }
    if (srv->tls_listen_fd >= 0) {
        bound_address(srv->tls_listen_fd, addr, sizeof addr);
        printf("  beanstalk  %s over TLS%s\n", addr, cfg->tls_ca ? (cfg->tls_verify_client ? ", client certificate required" : ", client certificate asked for") : "");
    }
    if (srv->gateway) {
        bound_address(gateway_listen_fd(srv->gateway), http, sizeof http);
        printf("  http       %s://%s/%s\n", scheme, http,
               verify_client ? " (client certificate required)"
               : client_ca ? " (client certificate asked for)" : "");
    } else if (cfg->http_enabled) {
        printf("  http       not started: %s:%s is in use (see the warning above)\n",
               cfg->http_listen, cfg->http_port);
    }
    if (srv->gearman) {
        bound_address(gearman_listen_fd(srv->gearman), addr, sizeof addr);
        printf("  gearman    %s%s\n", addr,
               cfg->gearman_admin_shutdown ? " (admin shutdown on)" : "");
        if (gearman_tls_listen_fd(srv->gearman) >= 0) {
            bound_address(gearman_tls_listen_fd(srv->gearman), addr, sizeof addr);
            printf("  gearman    %s over TLS\n", addr);
        }
    }
    if (cfg->replicate)
        printf("  replicated NATS JetStream stream %s at %s, %s; this node (%s) is primary\n",
               cfg->replicate_stream, cfg->replicate,
               cfg->fsync_ms == 0 && !(cfg->log_dir && cfg->fsync_never)
                   ? "replies wait for a quorum (-f 0)" : "replies do not wait for it (-f 0 makes them)",
               cfg->replicate_node_id);
    if (!cfg->log_dir) {
        if (!cfg->replicate)
            printf("  log        in memory only: jobs are lost when beangate stops (-b DIR keeps them)\n");
    } else {
        char dir[PATH_MAX];
        const char *shown = realpath(cfg->log_dir, dir) ? dir : cfg->log_dir;
        if (cfg->fsync_never)
            printf("  log        %s, never synced (-F)\n", shown);
        else if (cfg->fsync_ms == 0)
            printf("  log        %s, synced before every reply (-f 0)\n", shown);
        else
            printf("  log        %s, synced every %d ms (-f)\n", shown, cfg->fsync_ms);
    }
    if (cfg->shard_count > 1)
        printf("  shard      %u of 0..%u: job ids %u mod %u; HTTP puts and reserves tubes of CRC-32 mod %u = %u\n",
               cfg->shard_index, cfg->shard_count - 1, cfg->shard_index, cfg->shard_count,
               cfg->shard_count, cfg->shard_index);
    push_describe(srv->push, stdout);
    printf("  docs       man -l docs/beangate.1, docs/user-guide.md");
    if (srv->gateway) printf(", API: %s://%s/openapi.yaml", scheme, http);
    printf("\n");
    fflush(stdout);
}

/* The subscriptions, checked (and their secrets read) before anything starts. */
static struct push_setup push_setup;

/* Open the listeners (beanstalk, Gearman), drop privileges, start push
 * delivery and say the server is ready: at start, or once a standby of a
 * replicated log is primary. 0, or the exit status after a message. */
static int serve(struct server *srv, const struct server_config *cfg)
{
    if (beanstalk_start(srv, cfg) != 0) return 111;
    if (cfg->gearman_enabled && !(srv->gearman = gearman_start(srv, cfg))) return 111;
    /* every socket is open: privileged ports work, then privileges go */
    if (cfg->user && become_user(cfg->user, srv->wal) != 0) return 111;
    log_event(BG_LOG_INFO, "listening", "addr=%s port=%s", log_str(srv->listen_desc[0] ? srv->listen_desc : cfg->listen_addr), log_str(srv->listen_desc[0] ? "-" : cfg->port));
    if (push_setup.count) {
        srv->push = push_start(&push_setup, srv->base, &srv->engine, loop_now, after_gateway_run, srv);
        if (!srv->push) return 1;
        push_set_log(srv->push, srv->wal);
        struct gw_push_hooks hooks = {srv->push, push_subscriptions_json, push_job_error_json, push_metrics,
                                      push_owns_client};
        gateway_set_push(srv->gateway, &hooks);
    }
    push_setup_free(&push_setup); /* the secrets now live only in the keyed HMAC states */
    srv->serving = 1;
    gateway_set_ready(srv->gateway, 1); /* /readyz: 200 from now on */
    print_startup_block(srv, cfg);
    return 0;
}

/* ---- replication: the standby and the takeover -------------------------- */

/* A message of the stream, on a standby. */
static int standby_apply(void *arg, uint64_t seq, const char *data, size_t len)
{
    struct server *srv = arg;
    int rc = wal_apply(srv->wal, seq, data, len);
    loop_engine_changed();
    return rc;
}

/* This node holds the lease and has fenced the old primary: serve. */
static void became_primary(void *arg, uint64_t seq, uint64_t stream_bytes)
{
    struct server *srv = arg;
    wal_start_writing(srv->wal, stream_bytes);
    log_event(BG_LOG_WARN, "replication_serving", "node=%s seq=%llu jobs=%zu", log_str(srv->cfg->replicate_node_id),
              (unsigned long long)seq, srv->engine.job_count);
    int rc = serve(srv, srv->cfg);
    if (rc != 0) {
        srv->exit_status = rc;
        loop_stop();
    }
    loop_engine_changed();
}

/* Another node is primary, or this one cannot tell: stop at once. Replies
 * still held are never sent (the connections close), so nothing this node
 * did not get into the stream is acknowledged. */
static void lost_leadership(void *arg, const char *why)
{
    struct server *srv = arg;
    srv->engine.journal_broken = 1; /* no put from now on */
    repl_stop(srv->repl);           /* nor any append */
    log_event(BG_LOG_ERROR, "replication_lost", "node=%s why=%s action=exit status=%d",
              log_str(srv->cfg->replicate_node_id), log_str(why), SERVER_LOST_EXIT);
    srv->exit_status = SERVER_LOST_EXIT;
    srv->lost = 1;
    loop_stop();
}

/* The gateway asks: is this node serving? NULL if so, else the problem's
 * code, with the detail in out. */
static const char *replication_state(void *arg, char *out, size_t size)
{
    struct server *srv = arg;
    struct repl_stats st;
    repl_get_stats(srv->repl, &st);
    if (srv->lost || st.role == REPL_LOST) {
        snprintf(out, size, "lost leadership: another node is primary; this one stops");
        return "LOST_LEADERSHIP";
    }
    if (st.role == REPL_PRIMARY && srv->serving) return NULL;
    if (st.role == REPL_STANDBY)
        snprintf(out, size, "standby: applied the stream up to sequence %llu (last seen %llu)",
                 (unsigned long long)st.applied_seq, (unsigned long long)st.stream_last_seq);
    else
        snprintf(out, size, "taking over: applying the stream to its end (sequence %llu applied)",
                 (unsigned long long)st.applied_seq);
    return "STANDBY";
}

#define STOP_LOG_SECONDS 5     /* the log gets this long to keep what was done */
#define STOP_ANSWER_SECONDS 5  /* then the answers this long to reach slow clients */

/* The stop sequence, the one place it is written down (docs/operations.md,
 * "Stopping"), once the loop has stopped (SIGTERM/SIGINT after push's
 * grace, lost leadership, a failed takeover):
 *  1. Stop reading: no accepts, no reads; a request already read has run
 *     (the loop runs each one to its end); one the gateway has not
 *     dispatched yet gets 503 SHUTTING_DOWN; blocked reserves and
 *     long-polls are answered as timed out.
 *  2. Push deliveries still in flight go back to ready (records too).
 *  3. Finish the log (wal_finish): everything appended written, synced and
 *     in the stream, within STOP_LOG_SECONDS; if not, exit status 74
 *     (SERVER_LOG_LOST_EXIT) after a wal_lost line.
 *  4. Answer what the log kept: a reply (held or not) goes only if the log
 *     keeps the position it depends on (wal_reply_may_go), sent within
 *     STOP_ANSWER_SECONDS; every other connection closes without a reply,
 *     so a client retries only what was not kept, and nothing kept is
 *     retried (stored twice).
 *  5. Close the log (and the stream), then exit. */
static void server_stop(struct server *srv)
{
    gateway_stop_reading(srv->gateway);
    gearman_stop_reading(srv->gearman);
    beanstalk_stop_reading(srv);
    push_free(srv->push);
    srv->push = NULL;
    /* what was appended is kept, or the exit status says it was not */
    if (wal_finish(srv->wal, loop_now() + STOP_LOG_SECONDS * BG_SECOND) != 0 && srv->exit_status == 0)
        srv->exit_status = SERVER_LOG_LOST_EXIT;
    bg_time deadline = loop_now() + STOP_ANSWER_SECONDS * BG_SECOND;
    gateway_stop(srv->gateway, deadline);
    gearman_stop(srv->gearman, deadline);
    beanstalk_stop(srv, deadline);
    repl_stop_within(srv->repl, 5000); /* the last batch gets 5 s to reach the stream */
    wal_close(srv->wal);
}

/* The HTTPS gateway's own listener (--http-tls-cert; priority from
 * --tls-priority) into *out (NULL without it, or with --http-tls, which
 * takes the shared one): 0, or the usage status with why logged. */
static int open_http_tls(const struct server_config *cfg, struct tls_listener **out)
{
    *out = NULL;
    if (!cfg->http_tls_cert) return 0;
    struct tls_files f = {.cert = cfg->http_tls_cert, .key = cfg->http_tls_key, .ca = cfg->http_tls_ca,
                          .priority = cfg->tls_priority, .verify_client = cfg->http_tls_verify_client};
    char why[512];
    if (tls_listener_new(out, &f, why, sizeof why) != 0) {
        log_event(BG_LOG_ERROR, "bad_flag", "flag=--http-tls-cert msg=%s", log_str(why));
        return SERVER_USAGE_EXIT;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct server_config cfg;
    int r = server_config_parse(&cfg, argc, argv);
    if (r == 1) return 0;
    if (r != 0) return r;
    if (cfg.command == SERVER_HEALTHCHECK) return healthcheck(cfg.command_arg, cfg.http_port);
    if (cfg.command == SERVER_CHECK_LOG) return wal_check(cfg.command_arg);
    if (cfg.command == SERVER_COPY_JOBS) return copy_jobs_main(cfg.command_argc, cfg.command_argv);

    struct push_source push_sources[BG_PUSH_SUBSCRIPTIONS_MAX + 1];
    size_t push_source_count = 0;
    for (size_t i = 0; i < cfg.push_spec_count; i++)
        push_sources[push_source_count++] =
            (struct push_source){cfg.push_specs[i], cfg.push_from_env ? "BEANGATE_PUSH" : "--push"};
    if ((r = push_setup_load(&push_setup, push_sources, push_source_count, cfg.push_file,
                             cfg.push_grace_s)) != 0)
        return r;

    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a failed write, not a death */
    static struct server srv;
    srv.listen_fd = -1;
    srv.tls_listen_fd = -1;
    srv.verbose = cfg.verbose;
    srv.started_at = loop_now();
    srv.cfg = &cfg;
    if (describe_host(&srv) != 0) return 1;
    char node_id[300];
    if (cfg.replicate && !cfg.replicate_node_id) {
        snprintf(node_id, sizeof node_id, "%s-%s", srv.hostname[0] ? srv.hostname : "beangate", cfg.port);
        cfg.replicate_node_id = node_id;
    }
    if (cfg.replicate && cfg.replicate_renew_ms >= cfg.replicate_lease_ms) {
        log_event(BG_LOG_ERROR, "bad_flag", "flag=--replicate-renew-ms value=%u msg=%s", cfg.replicate_renew_ms,
                  log_str("must be less than --replicate-lease-ms"));
        return SERVER_USAGE_EXIT;
    }
    if (cfg.tls_cert) {
        /* the files are read now: a missing or bad one stops the start */
        struct tls_files files = {cfg.tls_cert, cfg.tls_key, cfg.tls_ca, cfg.tls_priority, cfg.tls_verify_client};
        char why[512];
        if (tls_listener_new(&srv.tls, &files, why, sizeof why) != 0) {
            log_event(BG_LOG_ERROR, "bad_flag", "flag=--tls-cert msg=%s", log_str(why));
            return SERVER_USAGE_EXIT;
        }
    }
    if (bg_engine_init(&srv.engine, cfg.max_job_size, srv.hash_key) != 0) {
        log_event(BG_LOG_ERROR, "out_of_memory", "at=engine_init");
        return 1;
    }
    /* before the log is read: recovered ids must be of this shard's class */
    if (bg_engine_set_shard(&srv.engine, cfg.shard_index, cfg.shard_count) != 0) return SERVER_USAGE_EXIT;
    srv.engine.max_job_memory = cfg.max_job_memory; /* before the log's jobs come back */
    struct conn_config conns = {max_connections(cfg.max_connections), cfg.max_connections_per_ip,
                                cfg.max_reply_memory, {srv.hash_key[0], srv.hash_key[1]}};
    conn_configure(&conns);
    if (loop_init(&srv.engine) != 0) {
        log_event(BG_LOG_ERROR, "event_loop_failed", NULL);
        return 1;
    }
    srv.base = loop_base();
    srv.sig_usr1 = evsignal_new(srv.base, SIGUSR1, drain_cb, &srv);
    srv.sig_term = evsignal_new(srv.base, SIGTERM, stop_cb, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, stop_cb, &srv);
    srv.sig_hup = evsignal_new(srv.base, SIGHUP, reload_cb, &srv);
    event_add(srv.sig_usr1, NULL);
    event_add(srv.sig_hup, NULL);
    event_add(srv.sig_term, NULL);
    event_add(srv.sig_int, NULL);
    if (cfg.replicate) {
        struct repl_config rcfg = {cfg.replicate, cfg.replicate_stream, cfg.replicate_node_id,
                                   cfg.replicate_lease_ms, cfg.replicate_renew_ms, cfg.replicate_replicas,
                                   bg_journal_job_record_size(BG_TUBE_NAME_MAX, cfg.max_job_size + 2)};
        struct repl_events ev = {&srv, standby_apply, became_primary, lost_leadership};
        if (repl_open(&srv.repl, &rcfg, srv.base, &ev) != 0) return 111;
    }
    if (cfg.log_dir || cfg.replicate) {
        struct wal_config wcfg = {.dir = cfg.log_dir, .fsync_ms = cfg.fsync_ms, .fsync_never = cfg.fsync_never,
                                  .segment_size = cfg.segment_size, .recover_damaged = cfg.log_recover_damaged,
                                  .repl = srv.repl};
        if (wal_open(&srv.wal, &wcfg, &srv.engine, srv.base, loop_now(), loop_wall_now()) != 0) return 111;
        loop_set_changed_hook(hand_log_batch, srv.wal);
    }

    struct tls_listener *http_tls = NULL;
    if (cfg.http_enabled && (r = open_http_tls(&cfg, &http_tls)) != 0) return r;
    if (cfg.http_enabled) {
        struct gateway_config gcfg = {
            .listen_addr = cfg.http_listen, .port = cfg.http_port, .wal = srv.wal, .log_arg = &srv,
            .scopes = cfg.scopes,
            .metrics_auth = cfg.metrics_auth, .started_at = srv.started_at,
            .process_info = gateway_process_info, .max_wait_s = (uint32_t)cfg.max_wait_s,
            .max_connections = cfg.http_max_connections,
            .max_per_address = cfg.http_max_per_address,
            .header_timeout_s = cfg.http_header_timeout_s,
            .idle_timeout_s = cfg.http_idle_timeout_s,
            .max_header_size = cfg.http_max_header_size,
            .max_body_buffer = cfg.http_max_body_buffer,
            .max_response_buffer = cfg.http_max_response_buffer,
            .cors_origins = cfg.http_cors_origins,
            .allowed_hosts = cfg.http_allowed_hosts, .extra_metrics = server_metrics,
            .tls = cfg.http_tls ? srv.tls : http_tls,
            .tls_verify_client = cfg.http_tls ? cfg.tls_verify_client : cfg.http_tls_verify_client};
        srv.gateway = gateway_start(srv.base, &srv.engine, &gcfg, loop_now, after_gateway_run, &srv);
        /* beanstalkd opens one port: a busy default HTTP port must not stop
         * a drop-in start; an address or port asked for explicitly must */
        if (!srv.gateway && cfg.http_explicit) return 111;
        if (!srv.gateway)
            log_event(BG_LOG_WARN, "http_not_started", "reason=default_port_busy port=%s beanstalk=served", log_str(cfg.http_port));
    }
    if (srv.repl) {
        /* a standby listens only on HTTP (/readyz says why it is not ready)
         * until it is primary; then serve() opens the other ports */
        gateway_set_role(srv.gateway, replication_state, &srv);
        printf("beangate %s is a standby of NATS JetStream stream %s at %s (node %s); it serves once "
               "it holds the lease\n", BEANGATE_VERSION, cfg.replicate_stream, cfg.replicate, cfg.replicate_node_id);
        fflush(stdout);
    } else if ((r = serve(&srv, &cfg)) != 0) {
        return r;
    }
    loop_run();
    server_stop(&srv);
    tls_listener_free(http_tls);
    repl_close(srv.repl);
    bg_engine_destroy(&srv.engine);
    event_free(srv.sig_usr1);
    event_free(srv.sig_term);
    event_free(srv.sig_int);
    event_free(srv.sig_hup);
    tls_listener_free(srv.tls);
    loop_free();
    return srv.exit_status;
}

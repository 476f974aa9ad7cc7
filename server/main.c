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
#include "../io/eventlog.h"
#include "push.h"

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
}

/* Process facts for the gateway's GET /stats. */
static void gateway_process_info(void *arg, struct bg_process_info *pi)
{
    server_process_info(arg, pi);
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

/* `beangate --healthcheck[=HOST:PORT]`: ask a running server's GET /readyz
 * (default 127.0.0.1 and the HTTP port of the settings, http_port) and exit
 * 0 if it answers 200, else 1. Docker's HEALTHCHECK uses this: a slim image
 * has no curl. */
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
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) return 1;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    char reply[64] = {0};
    static const char request[] = "GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (ok) ok = write(fd, request, sizeof request - 1) == (ssize_t)(sizeof request - 1);
    if (ok) ok = read(fd, reply, sizeof reply - 1) > 12;
    if (fd >= 0) close(fd);
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
    printf("beangate %s (beanstalkd %s protocol) is up; Ctrl-C or SIGTERM stops it\n",
           BEANGATE_VERSION, BG_VERSION);
    if (srv->unix_path[0]) {
        printf("  beanstalk  unix:%s\n", srv->unix_path);
    } else {
        bound_address(srv->listen_fd, addr, sizeof addr);
        printf("  beanstalk  %s%s\n", addr, srv->listen_desc[0] ? " (socket from systemd)" : "");
    }
    if (srv->gateway) {
        bound_address(gateway_listen_fd(srv->gateway), http, sizeof http);
        printf("  http       http://%s/\n", http);
    } else if (cfg->http_enabled) {
        printf("  http       not started: %s:%s is in use (see the warning above)\n",
               cfg->http_listen, cfg->http_port);
    }
    if (srv->gearman) {
        bound_address(gearman_listen_fd(srv->gearman), addr, sizeof addr);
        printf("  gearman    %s%s\n", addr,
               cfg->gearman_admin_shutdown ? " (admin shutdown on)" : "");
    }
    if (!cfg->log_dir) {
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
    push_describe(srv->push, stdout);
    printf("  docs       man -l docs/beangate.1, docs/user-guide.md");
    if (srv->gateway) printf(", API: http://%s/openapi.yaml", http);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct server_config cfg;
    int r = server_config_parse(&cfg, argc, argv);
    if (r == 1) return 0;
    if (r != 0) return r;
    if (cfg.command == SERVER_HEALTHCHECK) return healthcheck(cfg.command_arg, cfg.http_port);
    if (cfg.command == SERVER_CHECK_LOG) return wal_check(cfg.command_arg);

    /* the subscriptions are checked (and their secrets read) before anything starts */
    struct push_source push_sources[BG_PUSH_SUBSCRIPTIONS_MAX + 1];
    size_t push_source_count = 0;
    for (size_t i = 0; i < cfg.push_spec_count; i++)
        push_sources[push_source_count++] =
            (struct push_source){cfg.push_specs[i], cfg.push_from_env ? "BEANGATE_PUSH" : "--push"};
    static struct push_setup push_setup;
    if ((r = push_setup_load(&push_setup, push_sources, push_source_count, cfg.push_file,
                             cfg.push_grace_s)) != 0)
        return r;

    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a failed write, not a death */
    static struct server srv;
    srv.listen_fd = -1;
    srv.verbose = cfg.verbose;
    srv.started_at = loop_now();
    if (describe_host(&srv) != 0) return 1;
    if (bg_engine_init(&srv.engine, cfg.max_job_size, srv.hash_key) != 0) {
        log_event(BG_LOG_ERROR, "out_of_memory", "at=engine_init");
        return 1;
    }
    if (loop_init(&srv.engine) != 0) {
        log_event(BG_LOG_ERROR, "event_loop_failed", NULL);
        return 1;
    }
    srv.base = loop_base();
    srv.sig_usr1 = evsignal_new(srv.base, SIGUSR1, drain_cb, &srv);
    srv.sig_term = evsignal_new(srv.base, SIGTERM, stop_cb, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, stop_cb, &srv);
    event_add(srv.sig_usr1, NULL);
    event_add(srv.sig_term, NULL);
    event_add(srv.sig_int, NULL);
    if (cfg.log_dir) {
        struct wal_config wcfg = {cfg.log_dir, cfg.fsync_ms, cfg.fsync_never, cfg.segment_size,
                                  cfg.log_recover_damaged};
        if (wal_open(&srv.wal, &wcfg, &srv.engine, srv.base, loop_now(), loop_wall_now()) != 0) return 111;
        loop_set_changed_hook(hand_log_batch, srv.wal);
    }
    if (beanstalk_start(&srv, &cfg) != 0) return 111;

    if (cfg.http_enabled) {
        struct gateway_config gcfg = {
            .listen_addr = cfg.http_listen, .port = cfg.http_port, .wal = srv.wal, .log_arg = &srv,
            .tokens = cfg.http_tokens, .token_count = cfg.http_token_count,
            .metrics_auth = cfg.metrics_auth, .started_at = srv.started_at,
            .process_info = gateway_process_info, .max_wait_s = (uint32_t)cfg.max_wait_s,
            .max_connections = cfg.http_max_connections,
            .max_per_address = cfg.http_max_per_address,
            .header_timeout_s = cfg.http_header_timeout_s,
            .idle_timeout_s = cfg.http_idle_timeout_s,
            .max_header_size = cfg.http_max_header_size,
            .max_body_buffer = cfg.http_max_body_buffer};
        srv.gateway = gateway_start(srv.base, &srv.engine, &gcfg, loop_now, after_gateway_run, &srv);
        /* beanstalkd opens one port: a busy default HTTP port must not stop
         * a drop-in start; an address or port asked for explicitly must */
        if (!srv.gateway && cfg.http_explicit) return 111;
        if (!srv.gateway)
            log_event(BG_LOG_WARN, "http_not_started", "reason=default_port_busy port=%s beanstalk=served", log_str(cfg.http_port));
    }
    if (cfg.gearman_enabled && !(srv.gearman = gearman_start(&srv, &cfg))) return 111;
    /* every socket is open: privileged ports work, then privileges go */
    if (cfg.user && become_user(cfg.user, srv.wal) != 0) return 111;
    log_event(BG_LOG_INFO, "listening", "addr=%s port=%s", log_str(srv.listen_desc[0] ? srv.listen_desc : cfg.listen_addr), log_str(srv.listen_desc[0] ? "-" : cfg.port));

    if (push_setup.count) {
        srv.push = push_start(&push_setup, srv.base, &srv.engine, loop_now, after_gateway_run, &srv);
        if (!srv.push) return 1;
        struct gw_push_hooks hooks = {srv.push, push_subscriptions_json, push_job_error_json, push_metrics};
        gateway_set_push(srv.gateway, &hooks);
    }
    push_setup_free(&push_setup); /* the secrets now live only in the keyed HMAC states */

    gateway_set_ready(srv.gateway, 1); /* /readyz: 200 from now on */
    print_startup_block(&srv, &cfg);
    loop_run();

    push_free(srv.push); /* jobs still in flight go back to ready before the log closes */
    gateway_stop(srv.gateway);
    gearman_stop(srv.gearman);
    beanstalk_stop(&srv);
    wal_close(srv.wal);
    bg_engine_destroy(&srv.engine);
    event_free(srv.sig_usr1);
    event_free(srv.sig_term);
    event_free(srv.sig_int);
    loop_free();
    return 0;
}

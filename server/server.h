/* server.h - the beangate process: flags, the libevent loop, listeners and
 * TCP connections. Everything here is I/O around the pure core. */
#ifndef BEANGATE_SERVER_H
#define BEANGATE_SERVER_H

#include <event2/event.h>
#include <sys/utsname.h>

#include "../core/core.h"
#include "../io/conn.h"

#define SERVER_USAGE_EXIT 5      /* beanstalkd's status for a usage error */
#define SERVER_LOST_EXIT 75      /* replication: leadership lost (EX_TEMPFAIL: start again) */
#define SERVER_LOG_LOST_EXIT 74  /* a stop could not make everything appended durable (EX_IOERR) */

/* ---- config.c: flags ---------------------------------------------------- */

/* What the process does: serve, or run one command and exit. */
enum server_command {
    SERVER_RUN = 0,
    SERVER_HEALTHCHECK,          /* --healthcheck[=HOST:PORT] */
    SERVER_CHECK_LOG,            /* --check-log DIR */
    SERVER_COPY_JOBS,            /* --copy-jobs FROM TO [OPTIONS] (copy.c) */
};

/* Every setting is a flag and an environment variable BEANGATE_<NAME>,
 * declared once in config.c's table; command line > environment > default. */
struct server_config {
    enum server_command command; /* SERVER_RUN unless the first argument is a command */
    const char *command_arg;     /* its HOST:PORT or DIR, or NULL */
    int command_argc;            /* a command that takes its own arguments: those after it */
    char **command_argv;
    const char *listen_addr;     /* "127.0.0.1", or "unix:/path" */
    const char *port;            /* "11300" */
    const char *user;            /* -u, or NULL */
    uint32_t max_job_size;       /* -z */
    /* limits of the beanstalk and Gearman ports (docs/operations.md, Limits) */
    uint64_t max_connections;    /* 0: from the open-file limit (server_max_connections) */
    uint64_t max_connections_per_ip; /* 0: none */
    uint64_t request_timeout_s;  /* 0: none */
    uint64_t idle_timeout_s;     /* 0: none */
    uint64_t max_input_buffer;   /* bytes */
    uint64_t max_output_buffer;  /* bytes */
    uint64_t max_reply_memory;   /* bytes, all connections */
    uint64_t max_job_memory;     /* bytes; 0: no ceiling */
    int verbose;                 /* -V count, or BEANGATE_VERBOSE=N */
    const char *http_listen;     /* --http-listen, default 127.0.0.1 */
    const char *http_port;       /* --http-port, default 11301 */
    int http_enabled;            /* 0 with --no-http */
    int http_explicit;           /* HTTP address or port given (flag or env) */
    int max_wait_s;              /* --http-max-wait: longest long-poll, default 30 */
    uint32_t http_max_connections;   /* --http-max-connections */
    uint32_t http_max_per_address;   /* --http-max-connections-per-ip (0: none) */
    uint32_t http_header_timeout_s;  /* --http-header-timeout */
    uint32_t http_idle_timeout_s;    /* --http-idle-timeout */
    uint32_t http_max_header_size;   /* --http-max-header-size */
    uint64_t http_max_body_buffer;   /* --http-max-body-buffer */
    uint64_t http_max_response_buffer; /* --http-max-response-buffer */
    const char *http_token_file; /* --http-token-file, or NULL */
    /* bearer tokens of the token file and BEANGATE_HTTP_TOKENS; none: the
     * gateway is open. They live as long as the process (a SIGHUP that
     * reloads the file points these at the new ones). */
    const char *const *http_tokens;
    size_t http_token_count;
    /* The access file's entries (core/scope.c) and BEANGATE_HTTP_TOKENS's
     * tokens (unscoped); NULL when there is neither. Lives as long as the
     * process, as does each one a reload replaces (server_reload_access). */
    const struct bg_scopes *scopes;
    int metrics_auth;            /* --metrics-auth: /metrics needs a token too */
    const char *http_cors_origins; /* --http-cors-origins, or NULL: no CORS */
    const char *http_allowed_hosts; /* --http-allowed-hosts, or NULL: the loopback names */
    int http_tls;                /* --http-tls: HTTPS with the shared --tls-* listener */
    const char *http_tls_cert;   /* --http-tls-cert: HTTPS with a listener of its own, or NULL */
    const char *http_tls_key;    /* --http-tls-key */
    const char *http_tls_ca;     /* --http-tls-ca: client certificates' CAs, or NULL */
    int http_tls_verify_client;  /* --http-tls-verify-client */
    const char *log_dir;         /* -b, NULL: in memory only */
    int fsync_ms;                /* -f, default 50; 0: durable replies */
    int fsync_never;             /* -F */
    uint64_t segment_size;       /* -s, default 10485760 */
    int log_recover_damaged;     /* --log-recover-damaged: start on a damaged log */
    int gearman_enabled;         /* --gearman-listen or --gearman-port given */
    const char *gearman_listen;  /* default 127.0.0.1 */
    const char *gearman_port;    /* default 4730 */
    int gearman_admin_shutdown;  /* the admin `shutdown` works (default: unknown command) */
    const char *gearman_tls_port; /* --gearman-tls-port: Gearman over TLS too; NULL: none */
    /* TLS (io/tls.h; docs/security.md, TLS): the pair every listener uses
     * unless it has its own */
    const char *tls_cert;        /* --tls-cert, or NULL */
    const char *tls_key;         /* --tls-key, or NULL */
    const char *tls_ca;          /* --tls-ca: client certificates asked for; NULL: none */
    int tls_verify_client;       /* --tls-verify-client: one is required */
    const char *tls_priority;    /* --tls-priority, or NULL: TLS_DEFAULT_PRIORITY */
    const char *tls_port;        /* --tls-port: beanstalk over TLS on -l's address; NULL: none */
    /* push delivery (server/push.c parses and checks the subscriptions) */
    const char *const *push_specs; /* the --push values in order, or BEANGATE_PUSH's */
    size_t push_spec_count;
    int push_from_env;           /* push_specs is BEANGATE_PUSH (no --push was given) */
    const char *push_file;       /* --push-file or BEANGATE_PUSH_FILE, or NULL */
    uint32_t push_grace_s;       /* --push-grace, default 10 */
    /* --shard K/N: this instance is K of N (job ids are K mod N; over HTTP,
     * tubes whose CRC-32 mod N is K). "0/1" by default: not sharded */
    const char *shard;
    uint32_t shard_index, shard_count;
    /* replication through NATS JetStream (io/repl.h) */
    const char *replicate;       /* --replicate nats://h:p,...; NULL: off */
    const char *replicate_stream; /* default "beangate" */
    const char *replicate_node_id; /* default: the host name and the beanstalk port */
    uint32_t replicate_lease_ms; /* default 2000 */
    uint32_t replicate_renew_ms; /* default 500 */
    uint32_t replicate_replicas; /* default 3 */
};

/* A command given as the first argument (cfg->command) reads only the
 * setting it uses (--healthcheck: the HTTP port's default and variable).
 * Otherwise: the defaults, the environment, argv like beanstalkd, then the
 * bearer tokens. Returns 0 to run cfg->command (SERVER_RUN: the
 * server), 1 when the process should exit 0 (-h, -v), or SERVER_USAGE_EXIT
 * after printing why (and the usage for a bad flag). Sets the log level
 * (log.h) and, with -V, logs the effective configuration (never a token's
 * value). */
int server_config_parse(struct server_config *cfg, int argc, char **argv);

/* SIGHUP: read the access file (--http-token-file) again, with
 * BEANGATE_HTTP_TOKENS's tokens, by the rules of a start. 0: cfg->scopes
 * and cfg->http_tokens are the new ones (logged access_reloaded); 1: no
 * file, or the same text as before, nothing changed; -1: the file could
 * not be read or would be refused at start, the old access stays (logged
 * in one access_reload_failed line). Connections keep the scope they have
 * (docs/security.md, "Reloading the access file"). */
int server_reload_access(struct server_config *cfg);

/* The connection limits cfg gives a byte-stream protocol (beanstalk.c,
 * gearman.c); per_request_max: the most one request may need buffered
 * (Gearman: one packet of the largest size; beanstalk: 0). */
struct conn_limits server_conn_limits(const struct server_config *cfg, size_t per_request_max);

/* ---- beanstalk.c: the beanstalk listener ------------------------------ */

struct server;

/* Listen on cfg's address, a UNIX socket or the socket systemd passed, and
 * serve beanstalk on srv's engine (sets srv->listen_fd, unix_path,
 * listen_desc, beanstalk); with --tls-port, over TLS too (srv->tls;
 * sets tls_listen_fd, beanstalk_tls). 0, or BG_IO_ERROR / BG_OUT_OF_MEMORY after a
 * log line. */
int beanstalk_start(struct server *srv, const struct server_config *cfg);
/* No more accepts or reads on either beanstalk port (conn_server_stop_reading). */
void beanstalk_stop_reading(struct server *srv);
/* Send what the log kept (until deadline), close every beanstalk
 * connection and the listener (and its socket file); conn_server_stop. */
void beanstalk_stop(struct server *srv, bg_time deadline);

/* ---- gearman.c: the Gearman front-end ----------------------------------- */

struct gearman;

/* Listen on cfg's Gearman address and serve the protocol on srv's engine
 * (and over TLS with srv->tls on --gearman-tls-port). NULL (and a log
 * line) if it cannot listen. */
struct gearman *gearman_start(struct server *srv, const struct server_config *cfg);
/* No more accepts or reads (conn_server_stop_reading); NULL does nothing. */
void gearman_stop_reading(struct gearman *g);
/* Send what the log kept (until deadline), close every Gearman connection
 * and the listener; NULL does nothing. */
void gearman_stop(struct gearman *g, bg_time deadline);
/* Open Gearman connections; 0 for NULL. */
uint64_t gearman_connections(const struct gearman *g);
/* The listening socket (for the startup block's address). */
int gearman_listen_fd(const struct gearman *g);
/* The TLS listening socket, or -1 without --gearman-tls-port. */
int gearman_tls_listen_fd(const struct gearman *g);

/* ---- copy.c: --copy-jobs ------------------------------------------------ */

/* `beangate --copy-jobs FROM TO [OPTIONS]` (argv: what follows the flag):
 * copy (or with --move, move) every job of one running beanstalk server to
 * another and print the counts; the exit status (docs/migrating.md). */
int copy_jobs_main(int argc, char **argv);

/* ---- main.c: the process ----------------------------------------------- */

struct server {
    struct event_base *base;
    struct bg_engine engine;
    struct event *sig_usr1, *sig_term, *sig_int;
    int listen_fd;               /* the beanstalk listener's socket */
    struct conn_server *beanstalk;
    struct conn_server *beanstalk_tls; /* NULL without --tls-port */
    int tls_listen_fd;           /* its socket, or -1 */
    struct tls_listener *tls;    /* --tls-cert/--tls-key's credentials, or NULL */
    struct event *sig_hup;       /* SIGHUP: reload every TLS listener's files */
    char unix_path[108];
    char listen_desc[32];        /* "systemd-fd-3" when the socket was inherited */
    struct wal *wal;             /* NULL without -b */
    bg_time started_at;
    char instance_id[17];
    uint64_t hash_key[2];        /* the keyed hash of tables clients fill (random) */
    char hostname[256];
    char os[256];
    char platform[sizeof(((struct utsname *)0)->machine)];
    int verbose;
    struct gateway *gateway;     /* NULL with --no-http */
    struct gearman *gearman;     /* NULL unless --gearman-port/--gearman-listen */
    struct push *push;           /* NULL unless subscriptions are configured */
    struct repl *repl;           /* NULL without --replicate */
    int serving;                 /* the listeners are open (a standby: once primary) */
    int lost;                    /* replication: leadership lost, stopping */
    int exit_status;             /* main's status once the loop has stopped */
    struct server_config *cfg;   /* the settings (a standby's takeover; SIGHUP's access reload) */
};

/* The scope of a beanstalk or Gearman connection (core/scope.c; docs/security.md,
 * Scopes): NULL (unscoped) on plain TCP, and on every port while the access
 * file has no identity line; on a TLS listener otherwise, the first identity
 * line matching the client certificate's names, or bg_scope_nothing() for a
 * certificate no line matches and for a connection without a certificate. */
const struct bg_scope *server_peer_scope(const struct bg_scopes *sc, const struct conn_peer *peer);

/* Fill process facts for `stats`. */
void server_process_info(struct server *srv, struct bg_process_info *pi);
/* A beanstalk or Gearman connection (protocol) was closed on a line of
 * HTTP: a warning, at most one per 10 s with how many were held back
 * (peer: the client's address, or NULL). */
void server_log_cross_protocol(const char *protocol, const char *peer);

#endif

/* config.c - the settings, each declared once in one table (settings[]):
 * its flags, its environment variable BEANGATE_<NAME>, its kind of value,
 * range, default, help text and the field of struct server_config it sets.
 * The usage (-h), the defaults, the environment, the command line, the -V
 * config log line and the -VV source lines are loops over that table, so a
 * flag and its variable go through the same parser and the same range.
 * Precedence: command line > environment > default. Also reads the HTTP
 * bearer tokens (a file and BEANGATE_HTTP_TOKENS), never logging one. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "server.h"
#include "../io/eventlog.h"
#include "../gateway/gateway.h"

/* ---- the table ----------------------------------------------------------- */

enum kind {
    K_STRING,   /* any non-empty text */
    K_PORT,     /* a TCP port: digits, 0-65535, kept as text */
    K_NUMBER,   /* digits, min..max (clamped above max, or rounded up) */
    K_BOOL,     /* a flag without a value; the variable takes 1/0, true/false... */
    K_COUNT,    /* -V: each flag adds one, the variable gives the count */
    K_TOKENS,   /* BEANGATE_HTTP_TOKENS: read with the token file, never logged */
    K_STATE,    /* no flag, no variable: a field other rows set, in the log only */
    K_LIST,     /* --push: each flag adds a value (the first replaces the variable's) */
    K_ORIGINS,  /* web origins, comma-separated, checked by the gateway (gw_cors_check) */
    K_HOSTS,    /* host names, comma-separated, checked by the gateway (gw_hosts_check) */
    K_SHARD,    /* --shard K/N: the text, and shard_index, shard_count (0 <= K < N <= max) */
    K_HELP,     /* print the usage, exit 0 */
    K_VERSION,  /* print the version, exit 0 */
    K_COMMAND,  /* a command instead of a server: only as the first argument */
};

/* The C type of a field, found by the compiler (FIELD below). */
enum field_type { T_NONE, T_INT, T_U32, T_U64, T_STR };

#define FIELD(f)                                                                    \
    .offset = offsetof(struct server_config, f),                                    \
    .type = _Generic(((struct server_config *)0)->f, int: T_INT, uint32_t: T_U32,   \
                     uint64_t: T_U64, const char *: T_STR)

/* Given by flag or variable (not by default), a setting may also set another
 * int field: "--http-port" makes the HTTP address explicit, "-f" undoes "-F". */
#define ALSO(f, v) .also_offset = offsetof(struct server_config, f) + 1, .also_value = (v)

struct setting {
    char short_flag;            /* 'p', or 0 */
    const char *long_flag;      /* "--http-port", or NULL */
    const char *env;            /* "BEANGATE_HTTP_PORT", or NULL */
    const char *arg;            /* "PORT": the value's name; NULL: no value */
    enum kind kind;
    uint64_t min, max;          /* K_NUMBER, K_COUNT */
    int clamp;                  /* K_NUMBER: above max is lowered to max, with a warning */
    uint64_t round;             /* K_NUMBER: rounded up to a multiple of this */
    int invert;                 /* K_BOOL: the field is the opposite (--no-http) */
    int arg_optional;           /* K_COMMAND: the value only as --flag=VALUE */
    enum server_command command; /* K_COMMAND */
    const char *reads;          /* K_COMMAND: the key of a setting it uses (default, variable) */
    int own_args;               /* K_COMMAND: the arguments after it are its own (it parses them) */
    const char *def;            /* the default, parsed as a variable would be; NULL: none */
    const char *key;            /* key in the config log line */
    size_t offset;
    enum field_type type;
    size_t also_offset;         /* 1 + offset of an int field set with it; 0: none */
    int also_value;
    const char *help;           /* lines of the usage ('\n' between them) */
};

static const struct setting settings[] = {
    {'l', NULL, "BEANGATE_LISTEN", "ADDR", K_STRING, .def = "127.0.0.1", .key = "listen",
     FIELD(listen_addr), .help = "beanstalk address; unix:/path for a UNIX socket"},
    {'p', NULL, "BEANGATE_PORT", "PORT", K_PORT, .def = "11300", .key = "port", FIELD(port),
     .help = "beanstalk TCP port"},
    {'u', NULL, "BEANGATE_USER", "USER", K_STRING, .key = "user", FIELD(user),
     .help = "become USER and its group once the sockets are open"},
    {'z', NULL, "BEANGATE_MAX_JOB_SIZE", "BYTES", K_NUMBER, .max = BG_JOB_SIZE_LIMIT, .clamp = 1,
     .def = "65535", .key = "max_job_size", FIELD(max_job_size),
     .help = "maximum job size in bytes"},
    /* ---- limits of the beanstalk and Gearman ports (issue 13; docs/operations.md, Limits) ---- */
    {0, "--max-connections", "BEANGATE_MAX_CONNECTIONS", "N", K_NUMBER, .max = UINT32_MAX, .def = "0",
     .key = "max_connections", FIELD(max_connections),
     .help = "beanstalk and Gearman connections open at once; one more is closed\n"
             "at once. 0: the open-file limit less an eighth (at least 32 left for\n"
             "the log, HTTP and push)"},
    {0, "--max-connections-per-ip", "BEANGATE_MAX_CONNECTIONS_PER_IP", "N", K_NUMBER, .max = UINT32_MAX,
     .def = "0", .key = "max_connections_per_ip", FIELD(max_connections_per_ip),
     .help = "of those, from one client address (UNIX socket peers are not\n"
             "counted); 0: no limit"},
    {0, "--request-timeout", "BEANGATE_REQUEST_TIMEOUT", "SECONDS", K_NUMBER, .max = 86400, .def = "60",
     .key = "request_timeout", FIELD(request_timeout_s),
     .help = "a command line or Gearman packet header must be complete this long\n"
             "after its first byte, and a body must not pause longer; else the\n"
             "connection is closed. 0: no deadline"},
    {0, "--idle-timeout", "BEANGATE_IDLE_TIMEOUT", "SECONDS", K_NUMBER, .max = 31536000, .def = "0",
     .key = "idle_timeout", FIELD(idle_timeout_s),
     .help = "close a connection silent this long that waits for nothing (a\n"
             "blocked reserve, a reserved job or a sleeping worker is not idle).\n"
             "0: never, as beanstalkd"},
    {0, "--max-input-buffer", "BEANGATE_MAX_INPUT_BUFFER", "BYTES", K_NUMBER, .min = 1024,
     .max = BG_JOB_SIZE_LIMIT, .def = "65536", .key = "max_input_buffer", FIELD(max_input_buffer),
     .help = "unprocessed bytes kept per connection (commands sent behind a\n"
             "blocked reserve); reading stops there. Gearman keeps at least one\n"
             "packet of the largest size"},
    {0, "--max-output-buffer", "BEANGATE_MAX_OUTPUT_BUFFER", "BYTES", K_NUMBER, .min = 1024,
     .max = BG_JOB_SIZE_LIMIT, .def = "65536", .key = "max_output_buffer", FIELD(max_output_buffer),
     .help = "unsent reply bytes per connection; past it no more requests are read\n"
             "(one reply may go over). Gearman results for a client that does not\n"
             "read close it one largest packet beyond"},
    {0, "--max-reply-memory", "BEANGATE_MAX_REPLY_MEMORY", "BYTES", K_NUMBER, .min = 65536,
     .max = 1099511627776ull, .def = "67108864", .key = "max_reply_memory", FIELD(max_reply_memory),
     .help = "unsent reply bytes of all beanstalk and Gearman connections together;\n"
             "a list-tubes (or Gearman admin listing) reply over 16 KiB that\n"
             "does not fit gets OUT_OF_MEMORY"},
    {0, "--max-job-memory", "BEANGATE_MAX_JOB_MEMORY", "BYTES", K_NUMBER, .max = UINT64_MAX, .def = "0",
     .key = "max_job_memory", FIELD(max_job_memory),
     .help = "bytes all jobs may hold (each its body + 112); a put beyond gets\n"
             "OUT_OF_MEMORY (HTTP 503) and /readyz 503 while full. 0: no ceiling"},
    {'V', NULL, "BEANGATE_VERBOSE", "N", K_COUNT, .max = 100, .def = "0", .key = "verbose",
     FIELD(verbose),
     .help = "more messages, may be repeated: none, warnings and errors; -V, info\n"
             "(the configuration, connections); -VV, debug. The variable gives the\n"
             "count; -V on the command line replaces it"},
    {'b', NULL, "BEANGATE_BINLOG_DIR", "DIR", K_STRING, .key = "binlog_dir", FIELD(log_dir),
     .help = "write-ahead log directory (default: none, jobs in memory only)"},
    {'f', NULL, "BEANGATE_FSYNC_MS", "MS", K_NUMBER, .max = 1000000000, .def = "50",
     .key = "fsync_ms", FIELD(fsync_ms), ALSO(fsync_never, 0),
     .help = "sync the log at most once every MS milliseconds; -f0: replies wait\n"
             "for the disk. The later of -f and -F wins"},
    {'F', NULL, "BEANGATE_NO_FSYNC", NULL, K_BOOL, .def = "0", .key = "fsync_never",
     FIELD(fsync_never), .help = "never sync the log"},
    {'s', NULL, "BEANGATE_BINLOG_SIZE", "BYTES", K_NUMBER, .min = 1, .max = UINT64_MAX - 4095,
     .round = 4096, .def = "10485760", .key = "binlog_size", FIELD(segment_size),
     .help = "size of each log segment in bytes"},
    {0, "--log-recover-damaged", "BEANGATE_LOG_RECOVER_DAMAGED", NULL, K_BOOL, .def = "0",
     .key = "log_recover_damaged", FIELD(log_recover_damaged),
     .help = "start even if the log is damaged, with what is readable (logs each\n"
             "part dropped); without it a damaged log stops the start (status 111)"},
    {0, "--no-http", "BEANGATE_NO_HTTP", NULL, K_BOOL, .invert = 1, .def = "0", .key = "http",
     FIELD(http_enabled), .help = "do not start the HTTP/JSON gateway"},
    {0, "--http-listen", "BEANGATE_HTTP_LISTEN", "ADDR", K_STRING, .def = "127.0.0.1",
     .key = "http_listen", FIELD(http_listen), ALSO(http_explicit, 1),
     .help = "HTTP/JSON gateway address"},
    {0, "--http-port", "BEANGATE_HTTP_PORT", "PORT", K_PORT, .def = "11301", .key = "http_port",
     FIELD(http_port), ALSO(http_explicit, 1),
     .help = "HTTP/JSON gateway port. If the gateway cannot listen, the server\n"
             "starts without it, unless its address or port was given (status 111)"},
    {0, "--http-max-wait", "BEANGATE_HTTP_MAX_WAIT", "SECONDS", K_NUMBER, .min = 1, .max = 3600,
     .def = "30", .key = "http_max_wait", FIELD(max_wait_s),
     .help = "longest wait of an HTTP long-poll reserve; a longer timeout is cut"},
    /* HTTP limits (docs/operations.md, "Limits") */
    {0, "--http-max-connections", "BEANGATE_HTTP_MAX_CONNECTIONS", "N", K_NUMBER, .min = 1,
     .max = 1000000, .def = "1024", .key = "http_max_connections", FIELD(http_max_connections),
     .help = "HTTP connections open at most; at the limit a new one takes the slot of\n"
             "the longest idle (or still sending its head), else gets 503"},
    {0, "--http-max-connections-per-ip", "BEANGATE_HTTP_MAX_CONNECTIONS_PER_IP", "N",
     K_NUMBER, .max = 1000000, .def = "0", .key = "http_max_connections_per_ip",
     FIELD(http_max_per_address),
     .help = "HTTP connections open at most from one client address (0: no cap\n"
             "of its own); the same rule at the limit"},
    {0, "--http-header-timeout", "BEANGATE_HTTP_HEADER_TIMEOUT", "SECONDS", K_NUMBER, .min = 1,
     .max = 3600, .def = "10", .key = "http_header_timeout", FIELD(http_header_timeout_s),
     .help = "a request line and headers must be complete within this (from the\n"
             "accept, or from the first byte of a later request), else 408"},
    {0, "--http-idle-timeout", "BEANGATE_HTTP_IDLE_TIMEOUT", "SECONDS", K_NUMBER, .min = 1,
     .max = 86400, .def = "60", .key = "http_idle_timeout", FIELD(http_idle_timeout_s),
     .help = "an HTTP connection with nothing sent or received for this long is closed"},
    {0, "--http-max-header-size", "BEANGATE_HTTP_MAX_HEADER_SIZE", "BYTES", K_NUMBER,
     .min = 1024, .max = 1048576, .def = "8192", .key = "http_max_header_size",
     FIELD(http_max_header_size),
     .help = "bytes of an HTTP request line and headers at most (431 above)"},
    {0, "--http-max-body-buffer", "BEANGATE_HTTP_MAX_BODY_BUFFER", "BYTES", K_NUMBER,
     .min = 65536, .max = 1099511627776ull, .def = "67108864", .key = "http_max_body_buffer",
     FIELD(http_max_body_buffer),
     .help = "bytes of HTTP request bodies held at once, all requests together; a\n"
             "request whose body does not fit now gets 503 before it is read"},
    {0, "--http-max-response-buffer", "BEANGATE_HTTP_MAX_RESPONSE_BUFFER", "BYTES", K_NUMBER,
     .min = 65536, .max = 1099511627776ull, .def = "67108864", .key = "http_max_response_buffer",
     FIELD(http_max_response_buffer),
     .help = "bytes of HTTP responses built and not yet sent, all connections\n"
             "together; a GET or HEAD whose response (over 16 KiB) does not fit\n"
             "gets 503"},
    {0, "--http-token-file", "BEANGATE_HTTP_TOKEN_FILE", "PATH", K_STRING,
     .key = "http_token_file", FIELD(http_token_file),
     .help = "the access file: bearer tokens for the gateway and client\n"
             "certificate names, one per line, each with optional grants such as\n"
             "produce:emails (# comments; docs/security.md, Scopes)"},
    {0, NULL, "BEANGATE_HTTP_TOKENS", "T1,T2", K_TOKENS, .key = "http_tokens",
     .help = "more bearer tokens, comma-separated. With any token, every HTTP route\n"
             "but /livez and /readyz (and /metrics) needs \"Authorization: Bearer T\""},
    {0, "--metrics-auth", "BEANGATE_METRICS_AUTH", NULL, K_BOOL, .def = "0",
     .key = "metrics_auth", FIELD(metrics_auth), .help = "/metrics needs a token too"},
    {0, "--http-cors-origins", "BEANGATE_HTTP_CORS_ORIGINS", "LIST", K_ORIGINS,
     .key = "http_cors_origins", FIELD(http_cors_origins),
     .help = "let web pages of these origins call the gateway from a browser (CORS):\n"
             "comma-separated, each http(s)://HOST[:PORT], exactly as the browser\n"
             "sends it; no '*'. Default: none, no CORS headers (docs/http.md)"},
    {0, "--http-allowed-hosts", "BEANGATE_HTTP_ALLOWED_HOSTS", "LIST", K_HOSTS,
     .key = "http_allowed_hosts", FIELD(http_allowed_hosts),
     .help = "host names the gateway answers to besides localhost, 127.0.0.1 and\n"
             "[::1] (comma-separated, no port): a request whose Host names another\n"
             "gets 421 (DNS rebinding). Default: none; on an address that is not\n"
             "loopback, every name is served then (docs/security.md)"},
    /* HTTPS (docs/security.md, "HTTPS"): the gateway's port speaks TLS instead */
    {0, "--http-tls", "BEANGATE_HTTP_TLS", NULL, K_BOOL, .def = "0", .key = "http_tls", FIELD(http_tls),
     .help = "serve the HTTP gateway over HTTPS on its port with the shared TLS\n"
             "settings (--tls-cert, --tls-key, --tls-ca, --tls-verify-client)"},
    {0, "--http-tls-cert", "BEANGATE_HTTP_TLS_CERT", "FILE", K_STRING, .key = "http_tls_cert",
     FIELD(http_tls_cert),
     .help = "serve the HTTP gateway over HTTPS (TLS 1.2/1.3) on its port with this\n"
             "PEM certificate chain of its own; needs --http-tls-key. SIGHUP reloads it"},
    {0, "--http-tls-key", "BEANGATE_HTTP_TLS_KEY", "FILE", K_STRING, .key = "http_tls_key",
     FIELD(http_tls_key), .help = "the PEM private key of --http-tls-cert"},
    {0, "--http-tls-ca", "BEANGATE_HTTP_TLS_CA", "FILE", K_STRING, .key = "http_tls_ca",
     FIELD(http_tls_ca),
     .help = "PEM CAs for HTTPS client certificates: one is asked for, and one\n"
             "presented must verify against them (mutual TLS)"},
    {0, "--http-tls-verify-client", "BEANGATE_HTTP_TLS_VERIFY_CLIENT", NULL, K_BOOL, .def = "0",
     .key = "http_tls_verify_client", FIELD(http_tls_verify_client),
     .help = "with --http-tls-ca: a client without a certificate is refused"},
    {0, NULL, NULL, NULL, K_STATE, .key = "gearman", FIELD(gearman_enabled)},
    {0, "--gearman-listen", "BEANGATE_GEARMAN_LISTEN", "ADDR", K_STRING, .def = "127.0.0.1",
     .key = "gearman_listen", FIELD(gearman_listen), ALSO(gearman_enabled, 1),
     .help = "serve the Gearman protocol on ADDR; Gearman is off unless this or\n"
             "--gearman-port is given"},
    {0, "--gearman-port", "BEANGATE_GEARMAN_PORT", "PORT", K_PORT, .def = "4730",
     .key = "gearman_port", FIELD(gearman_port), ALSO(gearman_enabled, 1),
     .help = "Gearman port; giving it turns Gearman on"},
    {0, "--gearman-admin-shutdown", "BEANGATE_GEARMAN_ADMIN_SHUTDOWN", NULL, K_BOOL, .def = "0",
     .key = "gearman_admin_shutdown", FIELD(gearman_admin_shutdown),
     .help = "let the Gearman admin commands `shutdown` and `shutdown graceful` stop\n"
             "the server (off: unknown commands, as in gearmand 1.1.20); the Gearman\n"
             "port has no authentication"},
    /* ---- TLS (issue 23; io/tls.h, docs/security.md, TLS) ---- */
    {0, "--tls-cert", "BEANGATE_TLS_CERT", "FILE", K_STRING, .key = "tls_cert", FIELD(tls_cert),
     .help = "PEM certificate chain of every TLS listener without its own; read\n"
             "again at SIGHUP"},
    {0, "--tls-key", "BEANGATE_TLS_KEY", "FILE", K_STRING, .key = "tls_key", FIELD(tls_key),
     .help = "PEM private key of --tls-cert"},
    {0, "--tls-ca", "BEANGATE_TLS_CA", "FILE", K_STRING, .key = "tls_ca", FIELD(tls_ca),
     .help = "PEM CA certificates: TLS clients are asked for a certificate, which\n"
             "must verify against them (its names are the session's identity)"},
    {0, "--tls-verify-client", "BEANGATE_TLS_VERIFY_CLIENT", NULL, K_BOOL, .def = "0",
     .key = "tls_verify_client", FIELD(tls_verify_client),
     .help = "with --tls-ca: a TLS client without a certificate is refused"},
    {0, "--tls-priority", "BEANGATE_TLS_PRIORITY", "STRING", K_STRING, .key = "tls_priority",
     FIELD(tls_priority),
     .help = "GnuTLS priority string; unset: TLS 1.2 and 1.3 only,\n"
             TLS_DEFAULT_PRIORITY ". One GnuTLS refuses, or one\n"
             "enabling TLS 1.1 or older, stops the start"},
    {0, "--tls-port", "BEANGATE_TLS_PORT", "PORT", K_PORT, .key = "tls_port", FIELD(tls_port),
     .help = "serve beanstalk over TLS on this port of -l's address too (needs\n"
             "--tls-cert and --tls-key); -p stays plain TCP"},
    {0, "--gearman-tls-port", "BEANGATE_GEARMAN_TLS_PORT", "PORT", K_PORT, .key = "gearman_tls_port",
     FIELD(gearman_tls_port), ALSO(gearman_enabled, 1),
     .help = "serve Gearman over TLS on this port of --gearman-listen's address too\n"
             "(turns Gearman on; needs --tls-cert and --tls-key)"},
    {0, "--push", "BEANGATE_PUSH", "SUBSCRIPTION", K_LIST, .max = BG_PUSH_SUBSCRIPTIONS_MAX,
     .key = "push",
     .help = "deliver the jobs of a tube to an HTTP endpoint (docs/http.md, Push\n"
             "delivery): 'tube=T url=http[s]://HOST:PORT/PATH [concurrency=N] [rate=N/s]\n"
             "[timeout=S] [attempts=N] [backoff=MIN..MAX] [secret-file=PATH]\n"
             "[ca-file=PATH] [cert-file=PATH key-file=PATH]' (the last three: https\n"
             "only). In the variable, subscriptions are separated by newlines or a lone ';'"},
    {0, "--push-file", "BEANGATE_PUSH_FILE", "PATH", K_STRING, .key = "push_file", FIELD(push_file),
     .help = "push subscriptions, one per line (# comments); adds to --push"},
    {0, "--push-grace", "BEANGATE_PUSH_GRACE", "SECONDS", K_NUMBER, .max = 3600, .def = "10",
     .key = "push_grace", FIELD(push_grace_s),
     .help = "at SIGTERM, let push deliveries in flight finish for this long,\n"
             "then release their jobs"},
    {0, "--shard", "BEANGATE_SHARD", "K/N", K_SHARD, .max = BG_SHARD_COUNT_MAX, .def = "0/1",
     .key = "shard", FIELD(shard),
     .help = "this instance is K of N shards (docs/scaling.md): its job ids are\n"
             "K mod N, and its HTTP gateway takes puts and reservations only for\n"
             "tubes whose CRC-32 mod N is K (421 WRONG_SHARD for others)"},
    {0, "--replicate", "BEANGATE_REPLICATE", "URLS", K_STRING, .key = "replicate", FIELD(replicate),
     .help = "replicate the log through NATS JetStream (docs/scaling.md, High\n"
             "availability): URLS is nats://HOST:PORT[,nats://HOST:PORT...]. The node\n"
             "starts as a standby and serves once it holds the lease; with -f 0 a reply\n"
             "waits until a quorum of the stream's replicas has the change"},
    {0, "--replicate-stream", "BEANGATE_REPLICATE_STREAM", "NAME", K_STRING, .def = "beangate",
     .key = "replicate_stream", FIELD(replicate_stream),
     .help = "the JetStream stream (subject NAME.log; lease bucket NAME_lease)"},
    {0, "--replicate-node-id", "BEANGATE_REPLICATE_NODE_ID", "ID", K_STRING,
     .key = "replicate_node_id", FIELD(replicate_node_id),
     .help = "this node's name in the lease (default: the host name and the\n"
             "beanstalk port)"},
    {0, "--replicate-lease-ms", "BEANGATE_REPLICATE_LEASE_MS", "MS", K_NUMBER, .min = 100,
     .max = 600000, .def = "2000", .key = "replicate_lease_ms", FIELD(replicate_lease_ms),
     .help = "the leadership lease's time to live: a standby takes over this long\n"
             "after the primary last renewed it"},
    {0, "--replicate-renew-ms", "BEANGATE_REPLICATE_RENEW_MS", "MS", K_NUMBER, .min = 10,
     .max = 300000, .def = "500", .key = "replicate_renew_ms", FIELD(replicate_renew_ms),
     .help = "how often the primary renews the lease (less than the lease's\n"
             "time); a standby tries to take it as often, at least every 100 ms"},
    {0, "--replicate-replicas", "BEANGATE_REPLICATE_REPLICAS", "N", K_NUMBER, .min = 1, .max = 5,
     .def = "3", .key = "replicate_replicas", FIELD(replicate_replicas),
     .help = "replicas of the stream and the lease bucket when beangate creates them"},
    {'v', "--version", NULL, NULL, K_VERSION, .help = "print the version and exit"},
    {'h', "--help", NULL, NULL, K_HELP, .help = "print this help and exit"},
    {0, "--healthcheck", NULL, "HOST:PORT", K_COMMAND, .arg_optional = 1,
     .command = SERVER_HEALTHCHECK, .reads = "http_port",
     .help = "ask a running server's GET /readyz (default 127.0.0.1, port\n"
             "BEANGATE_HTTP_PORT or 11301); exit 0 if it answers 200, else 1"},
    {0, "--check-log", NULL, "DIR", K_COMMAND, .command = SERVER_CHECK_LOG,
     .help = "report each log segment's records and damage and exit (0 clean,\n"
             "1 damaged, 2 check failed); starts no server"},
    {0, "--copy-jobs", NULL, "FROM TO [OPTIONS]", K_COMMAND, .command = SERVER_COPY_JOBS, .own_args = 1,
     .help = "copy every job from the beanstalk server FROM to TO (HOST:PORT or a\n"
             "unix socket path) and report the counts; starts no server. Options:\n"
             "--move (delete each job on FROM once TO has it), --tube NAME (only\n"
             "these tubes; may be repeated), --map FILE (write FROM-id TO-id lines),\n"
             "--json (the report as JSON). Exit 0 all copied, 3 reserved jobs left\n"
             "behind, 1 stopped by an error, 5 bad usage (docs/migrating.md)"},
};

#define SETTING_COUNT (sizeof settings / sizeof settings[0])

enum source { FROM_DEFAULT, FROM_ENV, FROM_FLAG };
static const char *const source_names[] = {"default", "env", "flag"};

/* Where each setting came from (for the -VV log). */
static enum source sources[SETTING_COUNT];

static const char *const bool_words[2][4] = {{"0", "false", "no", "off"}, {"1", "true", "yes", "on"}};

/* ---- the usage ------------------------------------------------------------- */

/* The flag is followed by a value (-p PORT); -V and switches are not. */
static int takes_value(const struct setting *s)
{
    return s->arg && s->kind != K_COUNT && s->kind != K_TOKENS;
}

/* "-p PORT", "-v, --version", "--healthcheck[=HOST:PORT]" or "" into out. */
static void flag_text(const struct setting *s, char *out, size_t size)
{
    int n = 0;
    out[0] = '\0';
    if (s->short_flag) n = snprintf(out, size, "-%c", s->short_flag);
    if (s->long_flag) n += snprintf(out + n, size - n, "%s%s", n ? ", " : "", s->long_flag);
    if (takes_value(s)) snprintf(out + n, size - n, s->arg_optional ? "[=%s]" : " %s", s->arg);
}

/* " (0-65535, default 11300)", or "": what the usage adds to the help. */
static void facts_text(const struct setting *s, char *out, size_t size)
{
    char range[80] = "";
    const char *def = s->kind == K_BOOL ? NULL : s->def;
    unsigned long long min = s->min, max = s->max;
    if (s->kind == K_COMMAND)
        snprintf(range, sizeof range, "first argument only");
    else if (s->kind == K_PORT)
        snprintf(range, sizeof range, "0-65535");
    else if (s->kind == K_NUMBER && s->clamp)
        snprintf(range, sizeof range, "above %llu: %llu, with a warning", max, max);
    else if (s->kind == K_NUMBER && s->round)
        snprintf(range, sizeof range, "at least %llu, rounded up to a multiple of %llu", min,
                 (unsigned long long)s->round);
    else if (s->kind == K_LIST)
        snprintf(range, sizeof range, "may be repeated, at most %llu times", max);
    else if (s->kind == K_SHARD)
        snprintf(range, sizeof range, "N 1-%llu, K 0 to N-1", max);
    else if (s->kind == K_NUMBER || s->kind == K_COUNT)
        snprintf(range, sizeof range, "%llu-%llu", min, max);
    if (*range || def)
        snprintf(out, size, " (%s%s%s%s)", range, *range && def ? "; " : "", def ? "default " : "",
                 def ? def : "");
    else
        out[0] = '\0';
}

static void usage(FILE *f)
{
    char flags[64], facts[96];
    fprintf(f, "Use: beangate [OPTIONS]\n");
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        if (settings[i].kind != K_COMMAND) continue;
        flag_text(&settings[i], flags, sizeof flags);
        fprintf(f, "     beangate %s\n", flags);
    }
    fprintf(f,
        "\n"
        "Each option can also be set by the variable shown beside it. The command\n"
        "line wins over the environment, and the environment over the defaults.\n"
        "An empty variable counts as unset; a bad value exits with status 5, as a\n"
        "bad option does. Booleans take 1/0, true/false, yes/no or on/off.\n"
        "Short options may be grouped (-Vz 100) and take their value attached\n"
        "(-p11300); long ones take it as the next argument or after '='.\n"
        "\n");
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = &settings[i];
        if (s->kind == K_STATE) continue;
        flag_text(s, flags, sizeof flags);
        if (s->env)
            fprintf(f, " %-27s %s=%s\n", flags, s->env, s->arg ? s->arg : "1"); /* a switch */
        else
            fprintf(f, " %s\n", flags);
        size_t last = 0;        /* the length of the help's last line */
        for (const char *h = s->help;; h++) {
            last = strcspn(h, "\n");
            fprintf(f, "      %.*s", (int)last, h);
            h += last;
            if (!*h) break;
            fputc('\n', f);
        }
        facts_text(s, facts, sizeof facts);
        if (*facts && 6 + last + strlen(facts) > 78)
            fprintf(f, "\n      %s\n", facts + 1); /* on a line of their own */
        else
            fprintf(f, "%s\n", facts);
    }
    fprintf(f,
        "\n"
        "The beanstalk TCP protocol has no authentication: keep it on loopback or a\n"
        "private network.\n");
}

/* Print a usage error and return the usage exit status. */
static int usage_error(const char *what, const char *flag, const char *value)
{
    if (value)
        log_event(BG_LOG_ERROR, "bad_flag", "flag=%s value=%s msg=%s", log_str(flag),
                  log_str(value), log_str(what));
    else
        log_event(BG_LOG_ERROR, "bad_flag", "flag=%s msg=%s", log_str(flag), log_str(what));
    usage(stderr);
    return SERVER_USAGE_EXIT;
}

/* ---- one value: from a flag, a variable or the default ------------------- */

static void *field(const struct setting *s, struct server_config *cfg)
{
    return (char *)cfg + s->offset;
}

static void store(const struct setting *s, struct server_config *cfg, uint64_t v, const char *text)
{
    switch (s->type) {
    case T_INT: *(int *)field(s, cfg) = (int)v; break;
    case T_U32: *(uint32_t *)field(s, cfg) = (uint32_t)v; break;
    case T_U64: *(uint64_t *)field(s, cfg) = v; break;
    case T_STR: *(const char **)field(s, cfg) = text; break;
    case T_NONE: break;
    }
}

static uint64_t load_number(const struct setting *s, const struct server_config *cfg)
{
    const void *p = (const char *)cfg + s->offset;
    switch (s->type) {
    case T_INT: return (uint64_t)*(const int *)p;
    case T_U32: return *(const uint32_t *)p;
    case T_U64: return *(const uint64_t *)p;
    default: return 0;
    }
}

/* 1/0, true/false, yes/no, on/off (any case): 1 or 0, or -1. */
static int parse_bool(const char *s)
{
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < 4; i++)
            if (strcasecmp(s, bool_words[b][i]) == 0) return b;
    return -1;
}

/* Why a number is refused (the message lives until the next call). */
static const char *number_why(const struct setting *s)
{
    static char why[80];
    if (s->clamp) return "not a number";
    snprintf(why, sizeof why, "not a number from %llu to %llu", (unsigned long long)s->min,
             (unsigned long long)s->max);
    return why;
}

/* The values of the K_LIST row (pointers into argv or the environment). */
static const char *list_values[BG_PUSH_SUBSCRIPTIONS_MAX];

/* Parse text as s's value and store it in cfg: NULL, or why it is refused
 * (the message lives until the next call). from names the flag or variable,
 * for the warning of a clamped value. */
static const char *set_value(const struct setting *s, struct server_config *cfg, const char *text,
                             const char *from)
{
    size_t len = strlen(text);
    uint64_t v = 0;
    int b;
    switch (s->kind) {
    case K_PORT:
        if (len > 5 || bg_parse_u64(text, len, 65535, &v) != 0) return "not a port number (0-65535)";
        break;
    case K_NUMBER:
    case K_COUNT:
        if (bg_parse_u64(text, len, s->clamp ? UINT64_MAX : s->max, &v) != 0) {
            if (!s->clamp || !len || bg_digits_span(text, len) != len) return number_why(s);
            v = UINT64_MAX; /* more digits than 64 bits hold: above the maximum too */
        }
        if (v < s->min) return number_why(s);
        if (v > s->max) { /* only a clamped setting gets here (-z, as beanstalkd) */
            char event[48];
            snprintf(event, sizeof event, "%s_clamped", s->key);
            log_event(BG_LOG_WARN, event, "from=%s %s=%llu", from, s->key,
                      (unsigned long long)s->max);
            v = s->max;
        }
        if (s->round) v = (v + s->round - 1) / s->round * s->round;
        break;
    case K_BOOL:
        if ((b = parse_bool(text)) < 0) return "not a boolean (1/0, true/false, yes/no, on/off)";
        v = (uint64_t)(b ^ s->invert);
        break;
    case K_ORIGINS: {
        const char *why = gw_cors_check(text);
        if (why) return why;
        break;
    }
    case K_HOSTS: {
        const char *why = gw_hosts_check(text);
        if (why) return why;
        break;
    }
    case K_SHARD: { /* "K/N": two decimals and a slash, nothing else */
        size_t k_len = strcspn(text, "/");
        uint64_t k, n;
        if (text[k_len] != '/' || bg_parse_u64(text, k_len, UINT64_MAX, &k) != 0 ||
            bg_parse_u64(text + k_len + 1, len - k_len - 1, s->max, &n) != 0 || n == 0 || k >= n) {
            static char why[96];
            snprintf(why, sizeof why, "not K/N with N from 1 to %llu and K from 0 to N-1",
                     (unsigned long long)s->max);
            return why;
        }
        cfg->shard_index = (uint32_t)k;
        cfg->shard_count = (uint32_t)n;
        static char shown[24]; /* "02/3" is logged as "2/3" */
        snprintf(shown, sizeof shown, "%u/%u", cfg->shard_index, cfg->shard_count);
        text = shown;
        break;
    }
    case K_LIST: /* the one list, --push: its values are checked by server/push.c */
        if (cfg->push_spec_count >= s->max) return "given too many times";
        list_values[cfg->push_spec_count++] = text;
        cfg->push_specs = list_values;
        return NULL;
    default:
        break;
    }
    store(s, cfg, v, text);
    return NULL;
}

/* Set setting i from a flag or a variable: NULL, or why the value is refused. */
static const char *apply(size_t i, struct server_config *cfg, const char *text, enum source from,
                         const char *name)
{
    const struct setting *s = &settings[i];
    if (s->kind == K_LIST && from == FROM_FLAG && sources[i] != FROM_FLAG)
        cfg->push_spec_count = 0; /* the first flag replaces the variable's value */
    const char *why = set_value(s, cfg, text, name);
    if (why) return why;
    if (s->also_offset) *(int *)((char *)cfg + s->also_offset - 1) = s->also_value;
    sources[i] = from;
    if (s->kind == K_LIST) cfg->push_from_env = from == FROM_ENV;
    return NULL;
}

/* ---- the environment --------------------------------------------------- */

/* The first bad variable, reported after the flags (so -h still works). */
struct env_error {
    const char *var;
    const char *value;
    const char *why;
};

/* The variable's value, or NULL when it is unset or empty. */
static const char *env_value(const struct setting *s)
{
    const char *v = s->env ? getenv(s->env) : NULL;
    return v && *v ? v : NULL;
}

/* Apply the BEANGATE_* variables to cfg up to the first bad one (*err).
 * BEANGATE_HTTP_TOKENS is read with the token file (load_tokens). */
static void apply_env(struct server_config *cfg, struct env_error *err)
{
    for (size_t i = 0; i < SETTING_COUNT && !err->var; i++) {
        const char *v = settings[i].kind == K_TOKENS ? NULL : env_value(&settings[i]);
        const char *why = v ? apply(i, cfg, v, FROM_ENV, settings[i].env) : NULL;
        if (why) *err = (struct env_error){settings[i].env, v, why};
    }
}

/* ---- the command line -------------------------------------------------- */

/* The row of short flag c or of long flag a[0..n), or -1. */
static int find_flag(char c, const char *a, size_t n)
{
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = &settings[i];
        if (c ? s->short_flag == c
              : s->long_flag && strlen(s->long_flag) == n && strncmp(s->long_flag, a, n) == 0)
            return (int)i;
    }
    return -1;
}

/* Flag `name` of row i with its value (NULL for a switch):
 * 0, 1 (exit 0: -h, -v) or the usage exit status. */
static int apply_flag(size_t i, struct server_config *cfg, const char *name, const char *value)
{
    const struct setting *s = &settings[i];
    const char *why;
    switch (s->kind) {
    case K_HELP:
        usage(stdout);
        return 1;
    case K_VERSION:
        printf("beangate %s (beanstalkd %s protocol)\n", BEANGATE_VERSION, BG_VERSION);
        return 1;
    case K_COMMAND:
        return usage_error("must be the first argument", name, NULL);
    case K_COUNT: { /* -V: the command line's count replaces the environment's */
        int *count = field(s, cfg);
        if (sources[i] != FROM_FLAG) *count = 0, sources[i] = FROM_FLAG;
        if ((uint64_t)*count >= s->max) return usage_error("given too many times", name, NULL);
        (*count)++;
        return 0;
    }
    default:
        break;
    }
    if (takes_value(s) && (!value || !*value))
        return usage_error("flag requires an argument", name, NULL);
    /* a switch is its variable set to 1 */
    why = apply(i, cfg, value ? value : "1", FROM_FLAG, name);
    return why ? usage_error(why, name, value) : 0;
}

/* beanstalkd's short flags, grouped or not (-Vp 11300, -p11300), and long
 * flags (--http-port 8080, --http-port=8080). 0, 1 (exit 0) or the usage
 * exit status. */
static int parse_args(struct server_config *cfg, int argc, char **argv)
{
    for (int k = 1; k < argc; k++) {
        const char *a = argv[k];
        int i, rc;
        if (strncmp(a, "--", 2) == 0) {
            size_t n = strcspn(a, "=");
            if ((i = find_flag(0, a, n)) < 0) return usage_error("unknown flag", a, NULL);
            const char *value = NULL;
            if (a[n] == '=') {
                if (!takes_value(&settings[i]))
                    return usage_error("takes no value", settings[i].long_flag, a + n + 1);
                value = a + n + 1;
            } else if (takes_value(&settings[i]) && settings[i].kind != K_COMMAND) {
                value = k + 1 < argc ? argv[++k] : NULL;
            }
            if ((rc = apply_flag((size_t)i, cfg, settings[i].long_flag, value)) != 0) return rc;
            continue;
        }
        if (a[0] != '-' || a[1] == '\0') return usage_error("unknown argument", a, NULL);
        for (const char *f = a + 1; *f; f++) {
            char name[3] = {'-', *f, 0};
            if ((i = find_flag(*f, NULL, 0)) < 0) return usage_error("unknown flag", name, NULL);
            const char *value = NULL;
            int attached = 0;
            if (takes_value(&settings[i])) {
                /* the value is the rest of this word, or the next word */
                if (f[1]) value = f + 1, attached = 1;
                else if (k + 1 < argc) value = argv[++k];
            }
            if ((rc = apply_flag((size_t)i, cfg, name, value)) != 0) return rc;
            if (attached) break;
        }
    }
    return 0;
}

/* A command instead of a server (--healthcheck, --check-log DIR): only as
 * the first argument, with nothing after it; of the settings it reads only
 * the one it uses (so a bad variable of another does not matter). -1 if
 * argv[1] is none, else 0 (cfg->command set) or the usage exit status. */
static int parse_command(struct server_config *cfg, int argc, char **argv)
{
    if (argc < 2 || strncmp(argv[1], "--", 2) != 0) return -1;
    const char *a = argv[1];
    size_t n = strcspn(a, "=");
    int i = find_flag(0, a, n);
    if (i < 0 || settings[i].kind != K_COMMAND) return -1;
    const struct setting *s = &settings[i];
    if (s->own_args) {
        if (a[n] == '=') return usage_error("takes no '='", s->long_flag, a + n + 1);
        cfg->command = s->command;
        cfg->command_argc = argc - 2;
        cfg->command_argv = argv + 2;
        return 0;
    }
    const char *value = a[n] == '=' ? a + n + 1 : !s->arg_optional && argc > 2 ? argv[2] : NULL;
    int used = 1 + (a[n] != '=' && value != NULL);
    if (!s->arg_optional && (!value || !*value))
        return usage_error("flag requires an argument", s->long_flag, NULL);
    if (argc > 1 + used) return usage_error("nothing may follow", s->long_flag, argv[1 + used]);
    cfg->command = s->command;
    cfg->command_arg = value && *value ? value : NULL;
    for (size_t k = 0; k < SETTING_COUNT; k++) {
        const struct setting *r = &settings[k];
        const char *v = r->key && s->reads && strcmp(r->key, s->reads) == 0 ? env_value(r) : NULL;
        const char *why = v ? apply(k, cfg, v, FROM_ENV, r->env) : NULL;
        if (why) {
            log_event(BG_LOG_ERROR, "bad_env", "var=%s value=%s msg=%s", r->env, log_str(v), log_str(why));
            return SERVER_USAGE_EXIT;
        }
    }
    return 0;
}

/* ---- the access file and bearer tokens --------------------------------- */

/* The most an access file may hold: its lines are limited (core.h), its
 * comments are not. */
#define ACCESS_FILE_MAX (16u << 20)

/* The access file as now in force (the gateway copies its tokens; the
 * sessions keep pointers to its scopes), and the text it was parsed from
 * (a SIGHUP that finds the same text keeps it). A reload puts a new one
 * here and keeps the one it replaces on `retired` until the process ends:
 * a beanstalk or Gearman connection keeps the scope it was given at
 * connect, and an HTTP request the one its token had when it began, for
 * their whole lives, so there is no moment at which an old generation is
 * known to be unused. Each change costs the parsed file's size once. */
static struct bg_scopes *scopes;
static char *scopes_text;
static size_t scopes_text_len;
static const char *tokens[BG_SCOPE_TOKENS_MAX];
struct retired_scopes {
    struct bg_scopes *scopes;
    struct retired_scopes *next;
};
static struct retired_scopes *retired;

/* The gateway takes the same tokens (gateway/auth.c). */
_Static_assert(GW_AUTH_TOKENS_MAX >= BG_SCOPE_TOKENS_MAX && GW_AUTH_TOKEN_MAX >= BG_SCOPE_TOKEN_MAX,
               "the gateway holds every token of the access file");

/* Trim spaces and tabs at both ends of s[0..*n); returns the start. */
static char *trim(char *s, size_t *n)
{
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\r' || s[*n - 1] == '\n'))
        (*n)--;
    while (*n && (*s == ' ' || *s == '\t')) s++, (*n)--;
    return s;
}

/* Read the whole of f (at most ACCESS_FILE_MAX bytes) into *text: 0, or an
 * errno (EFBIG when larger). */
static int read_whole(FILE *f, char **text, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return ENOMEM;
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n > ACCESS_FILE_MAX) {
            free(buf);
            return EFBIG;
        }
        if (n == cap) {
            char *more = realloc(buf, cap * 2);
            if (!more) {
                free(buf);
                return ENOMEM;
            }
            buf = more, cap *= 2;
        }
    }
    if (ferror(f)) {
        int e = errno ? errno : EIO;
        free(buf);
        return e;
    }
    *text = buf, *len = n;
    return 0;
}

/* Read the access file at path into *text (malloc'd): 0, or nonzero with
 * why in why[0..whylen). Warns when every user may read it. */
static int read_access_file(const char *path, char **text, size_t *len, char *why, size_t whylen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, whylen, "%s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & S_IROTH))
        log_event(BG_LOG_WARN, "token_file_readable", "path=%s msg=\"readable by every user\"",
                  log_str(path));
    int e = read_whole(f, text, len);
    fclose(f);
    if (e) snprintf(why, whylen, "%s", e == EFBIG ? "larger than 16 MiB" : strerror(e));
    return e ? -1 : 0;
}

/* BEANGATE_HTTP_TOKENS's value: comma-separated, each an unscoped token
 * added to sc. 0, or nonzero with why in why[0..whylen). */
static int add_env_tokens(struct bg_scopes *sc, const char *value, char *why, size_t whylen)
{
    char *copy = strdup(value);
    if (!copy) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    size_t before = bg_scopes_token_count(sc);
    unsigned item = 0;
    int rc = 0;
    for (char *p = copy, *comma; p; p = comma ? comma + 1 : NULL) {
        comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char *t = trim(p, &n);
        item++;
        if (n == 0) continue;
        char reason[128];
        if (bg_scopes_add_token(sc, t, n, reason, sizeof reason) != 0) {
            snprintf(why, whylen, "item %u: %s", item, reason);
            rc = -1;
            break;
        }
    }
    free(copy);
    if (rc == 0 && bg_scopes_token_count(sc) == before) {
        snprintf(why, whylen, "no token in the value");
        rc = -1;
    }
    return rc;
}

/* Build the access in force from the file's text (NULL: no file) and the
 * variables of the K_TOKENS rows, by the rules a start applies: 0 with the
 * result in *out (NULL when there is neither), or nonzero with why (never a
 * token) in why[0..whylen), nothing kept; *bad_var names the variable
 * when it, not the file, was at fault (else NULL). */
static int build_access(const struct server_config *cfg, const char *text, size_t len, struct bg_scopes **out,
                        const char **bad_var, char *why, size_t whylen)
{
    struct bg_scopes *sc = NULL;
    *out = NULL;
    *bad_var = NULL;
    if (text) {
        int rc = bg_scopes_parse(&sc, text, len, why, whylen);
        if (rc == BG_OUT_OF_MEMORY) snprintf(why, whylen, "out of memory");
        if (rc != 0) return -1;
        /* Without a token the gateway would be open to all: refused, unless
         * there is no gateway and the file is for certificates only. */
        if (bg_scopes_token_count(sc) == 0 && (cfg->http_enabled || !bg_scopes_has_identities(sc))) {
            snprintf(why, whylen, "no token in the file: refusing an open gateway");
            bg_scopes_free(sc);
            return -1;
        }
    }
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const char *v = settings[i].kind == K_TOKENS ? env_value(&settings[i]) : NULL;
        if (!v) continue;
        if (!sc && bg_scopes_parse(&sc, "", 0, why, whylen) != 0) {
            snprintf(why, whylen, "out of memory");
            return -1;
        }
        if (add_env_tokens(sc, v, why, whylen) != 0) {
            bg_scopes_free(sc);
            *bad_var = settings[i].env;
            return -1;
        }
        sources[i] = FROM_ENV;
    }
    *out = sc;
    return 0;
}

/* Make sc (and its text, taken) the access in force: cfg's view of it, the
 * weak-token and missing-CA warnings. The one it replaces is retired. */
static void install_access(struct server_config *cfg, struct bg_scopes *sc, char *text, size_t len)
{
    if (scopes) {
        struct retired_scopes *r = malloc(sizeof *r);
        if (r) *r = (struct retired_scopes){scopes, retired}, retired = r;
        /* without memory to note it, the old one is kept unnoted: a leak
         * once, never a dangling scope */
    }
    free(scopes_text);
    scopes = sc, scopes_text = text, scopes_text_len = len;
    /* identity lines scope the TLS ports' certificates: without a CA no
     * certificate is asked for, and every TLS connection may do nothing */
    if (bg_scopes_has_identities(scopes) && !cfg->tls_ca)
        log_event(BG_LOG_WARN, "identities_without_ca",
                  "path=%s msg=\"identity lines, but no --tls-ca: TLS connections present no certificate "
                  "and may do nothing; plain TCP is not scoped\"", log_str(cfg->http_token_file));
    size_t count = bg_scopes_token_count(scopes);
    for (size_t i = 0; i < count; i++) {
        size_t n;
        tokens[i] = bg_scopes_token(scopes, i, &n);
        if (n < 16) log_event(BG_LOG_WARN, "weak_token", "length=%zu msg=\"shorter than 16 bytes\"", n);
    }
    cfg->scopes = scopes;
    cfg->http_tokens = tokens;
    cfg->http_token_count = count;
}

/* The access file, then the variable of the K_TOKENS row, at start. 0, or
 * SERVER_USAGE_EXIT after one line saying why. */
static int load_tokens(struct server_config *cfg)
{
    char why[256] = "";
    char *text = NULL;
    size_t len = 0;
    if (cfg->http_token_file && read_access_file(cfg->http_token_file, &text, &len, why, sizeof why) != 0) {
        log_event(BG_LOG_ERROR, "token_file_error", "path=%s error=%s", log_str(cfg->http_token_file),
                  log_str(why));
        return SERVER_USAGE_EXIT;
    }
    struct bg_scopes *sc;
    const char *bad_var;
    if (build_access(cfg, text, len, &sc, &bad_var, why, sizeof why) != 0) {
        if (bad_var) log_event(BG_LOG_ERROR, "bad_env", "var=%s msg=%s", bad_var, log_str(why));
        else log_event(BG_LOG_ERROR, "token_file_error", "path=%s msg=%s", log_str(cfg->http_token_file),
                       log_str(why));
        free(text);
        return SERVER_USAGE_EXIT;
    }
    if (sc) install_access(cfg, sc, text, len);
    else free(text);
    return 0;
}

int server_reload_access(struct server_config *cfg)
{
    const char *path = cfg->http_token_file;
    if (!path) return 1;
    char why[256] = "";
    char *text = NULL;
    size_t len = 0;
    struct bg_scopes *sc = NULL;
    const char *bad_var;
    if (read_access_file(path, &text, &len, why, sizeof why) != 0 ||
        build_access(cfg, text, len, &sc, &bad_var, why, sizeof why) != 0) {
        log_event(BG_LOG_ERROR, "access_reload_failed", "path=%s msg=%s kept=previous", log_str(path),
                  log_str(why));
        free(text);
        return -1;
    }
    if (len == scopes_text_len && scopes_text && memcmp(text, scopes_text, len) == 0) {
        bg_scopes_free(sc);
        free(text);
        log_event(BG_LOG_INFO, "access_unchanged", "path=%s", log_str(path));
        return 1;
    }
    install_access(cfg, sc, text, len);
    log_event(BG_LOG_INFO, "access_reloaded", "path=%s tokens=%zu identities=%s", log_str(path),
              bg_scopes_token_count(sc), bg_scopes_has_identities(sc) ? "yes" : "no");
    return 0;
}

const struct bg_scope *server_peer_scope(const struct bg_scopes *sc, const struct conn_peer *peer)
{
    if (!peer->tls || !bg_scopes_has_identities(sc)) return NULL;
    if (!peer->identity) return bg_scope_nothing();
    const char *names[TLS_IDENTITY_MAX];
    size_t n = peer->identity->count < TLS_IDENTITY_MAX ? peer->identity->count : TLS_IDENTITY_MAX;
    for (size_t i = 0; i < n; i++) names[i] = peer->identity->names[i];
    const struct bg_scope *s;
    return bg_scopes_for_identity(sc, names, n, &s) == 0 ? s : bg_scope_nothing();
}

/* ---- the effective configuration --------------------------------------- */

/* -V: one line of every setting (the number of tokens, never a token);
 * -VV: where each came from. */
static void log_config(const struct server_config *c)
{
    if (!log_enabled(BG_LOG_INFO)) return;
    char *line = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&line, &size);
    if (!m) return;
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = &settings[i];
        const void *p = (const char *)c + s->offset;
        const char *sep = ftell(m) ? " " : "";
        switch (s->kind) {
        case K_STRING:
        case K_PORT:
        case K_ORIGINS:
        case K_HOSTS:
        case K_SHARD:
            fprintf(m, "%s%s=%s", sep, s->key, log_str(*(const char *const *)p));
            break;
        case K_NUMBER:
        case K_COUNT:
            fprintf(m, "%s%s=%llu", sep, s->key, (unsigned long long)load_number(s, c));
            break;
        case K_BOOL:
        case K_STATE:
            fprintf(m, "%s%s=%s", sep, s->key, *(const int *)p ? "on" : "off");
            break;
        case K_TOKENS:
            fprintf(m, "%s%s=%zu http_auth=%s", sep, s->key, c->http_token_count,
                    c->http_token_count ? "on" : "off");
            break;
        case K_LIST:
            fprintf(m, "%s%s=%zu", sep, s->key, c->push_spec_count);
            break;
        default:
            break;
        }
    }
    if (fclose(m) == 0) log_event(BG_LOG_INFO, "config", "%s", line);
    free(line);
    for (size_t i = 0; i < SETTING_COUNT; i++)
        if (settings[i].env)
            log_event(BG_LOG_DEBUG, "config_source", "setting=%s source=%s var=%s", settings[i].key,
                      source_names[sources[i]], settings[i].env);
}

/* The TLS flags go together: a TLS port needs the pair, a required client
 * certificate a CA. 0, or SERVER_USAGE_EXIT after a message. (The files
 * themselves are read at start: tls_listener_new.) */
static int check_tls(const struct server_config *cfg)
{
    const char *flag = NULL, *why = NULL;
    if ((cfg->tls_port || cfg->gearman_tls_port) && (!cfg->tls_cert || !cfg->tls_key)) {
        flag = cfg->tls_port ? "--tls-port" : "--gearman-tls-port";
        why = "needs --tls-cert and --tls-key";
    } else if (!cfg->tls_cert != !cfg->tls_key) {
        flag = cfg->tls_cert ? "--tls-cert" : "--tls-key";
        why = "--tls-cert and --tls-key go together";
    } else if (cfg->tls_verify_client && !cfg->tls_ca) {
        flag = "--tls-verify-client";
        why = "needs --tls-ca";
    } else if (cfg->http_tls && !cfg->tls_cert) {
        flag = "--http-tls";
        why = "needs --tls-cert and --tls-key (or give the gateway its own: --http-tls-cert, --http-tls-key)";
    } else if (cfg->http_tls && cfg->http_tls_cert) {
        flag = "--http-tls";
        why = "takes the shared --tls-cert; --http-tls-cert gives the gateway its own: one or the other";
    } else if (!cfg->http_tls_cert != !cfg->http_tls_key) {
        flag = cfg->http_tls_cert ? "--http-tls-cert" : "--http-tls-key";
        why = "--http-tls-cert and --http-tls-key go together";
    } else if ((cfg->http_tls_ca || cfg->http_tls_verify_client) && !cfg->http_tls_cert) {
        flag = cfg->http_tls_ca ? "--http-tls-ca" : "--http-tls-verify-client";
        why = "needs --http-tls-cert and --http-tls-key (with --http-tls: --tls-ca, --tls-verify-client)";
    } else if (cfg->http_tls_verify_client && !cfg->http_tls_ca) {
        flag = "--http-tls-verify-client";
        why = "needs --http-tls-ca";
    } else if (cfg->tls_port && strncmp(cfg->listen_addr, "unix:", 5) == 0) {
        flag = "--tls-port";
        why = "needs a TCP address in -l";
    }
    if (!flag) return 0;
    log_event(BG_LOG_ERROR, "bad_flag", "flag=%s msg=%s", flag, log_str(why));
    return SERVER_USAGE_EXIT;
}

int server_config_parse(struct server_config *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < SETTING_COUNT; i++) {
        sources[i] = FROM_DEFAULT;
        const char *why = settings[i].def ? set_value(&settings[i], cfg, settings[i].def, "default") : NULL;
        if (why) { /* a mistake in the table above */
            log_event(BG_LOG_ERROR, "bad_default", "setting=%s msg=%s", settings[i].key, log_str(why));
            return SERVER_USAGE_EXIT;
        }
    }
    int rc = parse_command(cfg, argc, argv);
    if (rc >= 0) return rc;
    struct env_error err = {0};
    apply_env(cfg, &err);
    if ((rc = parse_args(cfg, argc, argv)) != 0) return rc;
    if (err.var) {
        log_event(BG_LOG_ERROR, "bad_env", "var=%s value=%s msg=%s", err.var, log_str(err.value),
                  log_str(err.why));
        return SERVER_USAGE_EXIT;
    }
    log_set_verbosity(cfg->verbose);
    if ((rc = load_tokens(cfg)) != 0) return rc;
    if ((rc = check_tls(cfg)) != 0) return rc;
    log_config(cfg);
    return 0;
}

struct conn_limits server_conn_limits(const struct server_config *cfg, size_t per_request_max)
{
    struct conn_limits l = {
        .in_max = (size_t)cfg->max_input_buffer,
        .out_limit = (size_t)cfg->max_output_buffer,
        .request_timeout = (bg_time)cfg->request_timeout_s * BG_SECOND,
        .idle_timeout = (bg_time)cfg->idle_timeout_s * BG_SECOND,
    };
    if (per_request_max) {
        /* a request is parsed whole: room for the largest and a read more */
        if (l.in_max < per_request_max + CONN_READ_CHUNK) l.in_max = per_request_max + CONN_READ_CHUNK;
        /* what other sessions send (results) may pass the limit by one packet */
        l.out_max = l.out_limit + per_request_max;
    }
    return l;
}

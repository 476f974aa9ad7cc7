/* config.c - the settings: beanstalkd's flags, the gateway's long flags, and
 * an environment variable BEANGATE_<NAME> for each. Precedence: command line
 * > environment > default. Also reads the HTTP bearer tokens (a file and
 * BEANGATE_HTTP_TOKENS) and logs the effective configuration with -V. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "server.h"
#include "../io/eventlog.h"
#include "../gateway/gateway.h"

/* ---- the settings ------------------------------------------------------ */

enum setting {
    S_LISTEN, S_PORT, S_USER, S_MAX_JOB_SIZE, S_VERBOSE,
    S_BINLOG_DIR, S_FSYNC_MS, S_NO_FSYNC, S_BINLOG_SIZE,
    S_LOG_RECOVER_DAMAGED,
    S_HTTP_LISTEN, S_HTTP_PORT, S_NO_HTTP, S_HTTP_TOKEN_FILE, S_HTTP_TOKENS, S_METRICS_AUTH,
    S_HTTP_MAX_WAIT,
    S_GEARMAN_LISTEN, S_GEARMAN_PORT, S_GEARMAN_ADMIN_SHUTDOWN,
    S_COUNT
};

enum source { FROM_DEFAULT, FROM_ENV, FROM_FLAG };
static const char *const source_names[] = {"default", "env", "flag"};

static const struct setting_def {
    const char *env;            /* environment variable */
    const char *flag;           /* its flag, for messages */
    const char *key;            /* key in the config log line */
} defs[S_COUNT] = {
    [S_LISTEN] = {"BEANGATE_LISTEN", "-l", "listen"},
    [S_PORT] = {"BEANGATE_PORT", "-p", "port"},
    [S_USER] = {"BEANGATE_USER", "-u", "user"},
    [S_MAX_JOB_SIZE] = {"BEANGATE_MAX_JOB_SIZE", "-z", "max_job_size"},
    [S_VERBOSE] = {"BEANGATE_VERBOSE", "-V", "verbose"},
    [S_BINLOG_DIR] = {"BEANGATE_BINLOG_DIR", "-b", "binlog_dir"},
    [S_FSYNC_MS] = {"BEANGATE_FSYNC_MS", "-f", "fsync_ms"},
    [S_NO_FSYNC] = {"BEANGATE_NO_FSYNC", "-F", "fsync_never"},
    [S_BINLOG_SIZE] = {"BEANGATE_BINLOG_SIZE", "-s", "binlog_size"},
    [S_LOG_RECOVER_DAMAGED] = {"BEANGATE_LOG_RECOVER_DAMAGED", "--log-recover-damaged", "log_recover_damaged"},
    [S_HTTP_LISTEN] = {"BEANGATE_HTTP_LISTEN", "--http-listen", "http_listen"},
    [S_HTTP_PORT] = {"BEANGATE_HTTP_PORT", "--http-port", "http_port"},
    [S_NO_HTTP] = {"BEANGATE_NO_HTTP", "--no-http", "http"},
    [S_HTTP_TOKEN_FILE] = {"BEANGATE_HTTP_TOKEN_FILE", "--http-token-file", "http_token_file"},
    [S_HTTP_TOKENS] = {"BEANGATE_HTTP_TOKENS", NULL, "http_tokens"},
    [S_METRICS_AUTH] = {"BEANGATE_METRICS_AUTH", "--metrics-auth", "metrics_auth"},
    [S_HTTP_MAX_WAIT] = {"BEANGATE_HTTP_MAX_WAIT", "--http-max-wait", "http_max_wait"},
    [S_GEARMAN_LISTEN] = {"BEANGATE_GEARMAN_LISTEN", "--gearman-listen", "gearman_listen"},
    [S_GEARMAN_PORT] = {"BEANGATE_GEARMAN_PORT", "--gearman-port", "gearman_port"},
    [S_GEARMAN_ADMIN_SHUTDOWN] = {"BEANGATE_GEARMAN_ADMIN_SHUTDOWN", "--gearman-admin-shutdown",
                                  "gearman_admin_shutdown"},
};

/* Where each setting came from (for the -VV log). */
static enum source sources[S_COUNT];

static void usage(FILE *f)
{
    fprintf(f,
        "Use: beangate [OPTIONS]\n"
        "\n"
        "Options:\n"
        " -b DIR   write-ahead log directory\n"
        " -f MS    fsync at most once every MS milliseconds (default is 50ms);\n"
        "          use -f0 for \"always fsync\" (replies wait for the disk)\n"
        " -F       never fsync\n"
        " -l ADDR  listen on address (default is 127.0.0.1; unix:/path for a UNIX socket)\n"
        " -p PORT  listen on port (default is 11300)\n"
        " -u USER  become user and group\n"
        " -z BYTES set the maximum job size in bytes (default is 65535);\n"
        "          max allowed is %d bytes\n"
        " -s BYTES set the size of each write-ahead log file (default is 10485760);\n"
        "          will be rounded up to a multiple of 4096 bytes\n"
        " -v       show version information\n"
        " -V       increase verbosity (default: warnings and errors; -V: info; -VV: debug)\n"
        " -h       show this help\n"
        " --http-listen ADDR      HTTP/JSON gateway address (default is 127.0.0.1)\n"
        " --http-port PORT        HTTP/JSON gateway port (default is 11301)\n"
        " --no-http               do not start the HTTP/JSON gateway\n"
        " --http-token-file PATH  bearer tokens for the gateway, one per line\n"
        "                         (blank lines and # comments are ignored)\n"
        " --metrics-auth          /metrics needs a token too (default: open)\n"
        " --http-max-wait SECONDS the longest a long-poll reserve waits, 1-3600\n"
        "                         (default 30; a larger timeout is taken as this)\n"
        " --gearman-listen ADDR   serve the Gearman protocol on ADDR (default\n"
        "                         127.0.0.1 once --gearman-port is given)\n"
        " --gearman-port PORT     Gearman port (usually 4730); Gearman is off\n"
        "                         unless one of these two is given\n"
        " --gearman-admin-shutdown  let the Gearman admin commands `shutdown` and\n"
        "                         `shutdown graceful` stop the server (default: off,\n"
        "                         they answer ERR UNKNOWN_COMMAND as gearmand 1.1.20;\n"
        "                         anyone who reaches the Gearman port could use them)\n"
        " --log-recover-damaged   start even if the log is damaged, with what is\n"
        "                         readable (logs each part dropped); by default a\n"
        "                         damaged log stops the start with status 111\n"
        " --check-log DIR         report each log segment's records and damage and\n"
        "                         exit (0 clean, 1 damaged, 2 check failed); must be\n"
        "                         the first argument; starts no server\n"
        " --help, --version       as -h, -v\n"
        "\n"
        "Environment: every option can also be set by a variable. The command line\n"
        "wins over the environment, and the environment over the defaults. An\n"
        "empty variable counts as unset; a bad value exits with status 5.\n"
        " BEANGATE_LISTEN=ADDR           as -l\n"
        " BEANGATE_PORT=PORT             as -p\n"
        " BEANGATE_USER=USER             as -u\n"
        " BEANGATE_MAX_JOB_SIZE=BYTES    as -z\n"
        " BEANGATE_VERBOSE=N             as -V given N times\n"
        " BEANGATE_BINLOG_DIR=DIR        as -b\n"
        " BEANGATE_FSYNC_MS=MS           as -f\n"
        " BEANGATE_NO_FSYNC=1            as -F\n"
        " BEANGATE_BINLOG_SIZE=BYTES     as -s\n"
        " BEANGATE_LOG_RECOVER_DAMAGED=1 as --log-recover-damaged\n"
        " BEANGATE_HTTP_LISTEN=ADDR      as --http-listen\n"
        " BEANGATE_HTTP_PORT=PORT        as --http-port\n"
        " BEANGATE_NO_HTTP=1             as --no-http\n"
        " BEANGATE_HTTP_TOKEN_FILE=PATH  as --http-token-file\n"
        " BEANGATE_HTTP_TOKENS=T1,T2     bearer tokens, comma-separated (in addition\n"
        "                                to those of the token file)\n"
        " BEANGATE_METRICS_AUTH=1        as --metrics-auth\n"
        " BEANGATE_HTTP_MAX_WAIT=SECONDS as --http-max-wait\n"
        " BEANGATE_GEARMAN_LISTEN=ADDR   as --gearman-listen\n"
        " BEANGATE_GEARMAN_PORT=PORT     as --gearman-port\n"
        " BEANGATE_GEARMAN_ADMIN_SHUTDOWN=1  as --gearman-admin-shutdown\n"
        "Booleans take 1/0, true/false, yes/no or on/off.\n"
        "\n"
        "When any token is configured, every HTTP route except /livez and /readyz\n"
        "(and /metrics unless --metrics-auth) needs \"Authorization: Bearer TOKEN\".\n"
        "The beanstalk TCP protocol has no authentication: keep it on loopback or a\n"
        "private network.\n",
        BG_JOB_SIZE_LIMIT);
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

/* ---- value parsers: 0, or -1 with *why set ----------------------------- */

/* A size: digits only. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s < '0' || *s > '9') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) return -1;
    *out = v;
    return 0;
}

/* A TCP port given in the environment: 0-65535. */
static int parse_port(const char *s)
{
    uint64_t v;
    return parse_size(s, &v) == 0 && v <= 65535 && strlen(s) <= 5 ? 0 : -1;
}

/* 1/0, true/false, yes/no, on/off (any case). */
static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
            *out = strcasecmp(s, yes[i]) == 0;
            return 0;
        }
    }
    return -1;
}

/* -z: clamp to the limit with a warning, as beanstalkd does. */
static uint32_t clamp_job_size(uint64_t size, const char *from)
{
    if (size <= BG_JOB_SIZE_LIMIT) return (uint32_t)size;
    log_event(BG_LOG_WARN, "max_job_size_clamped", "from=%s max_job_size=%d", from,
              BG_JOB_SIZE_LIMIT);
    return BG_JOB_SIZE_LIMIT;
}

/* -f: milliseconds, at most 1000000000. */
static int parse_fsync_ms(const char *s, int *out)
{
    uint64_t v;
    if (parse_size(s, &v) != 0 || v > 1000000000) return -1;
    *out = (int)v;
    return 0;
}

/* -s: bytes, not 0, rounded up to a multiple of 4096. */
static int parse_segment_size(const char *s, uint64_t *out)
{
    uint64_t v;
    if (parse_size(s, &v) != 0 || v == 0 || v > UINT64_MAX - 4095) return -1;
    *out = (v + 4095) / 4096 * 4096;
    return 0;
}

/* --http-max-wait: whole seconds, 1 to GW_MAX_WAIT_LIMIT_S. */
static int parse_max_wait(const char *s, uint32_t *out)
{
    uint64_t v;
    if (parse_size(s, &v) != 0 || v < 1 || v > GW_MAX_WAIT_LIMIT_S) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* ---- the environment --------------------------------------------------- */

/* The first bad variable, reported after the flags (so -h still works). */
struct env_error {
    const char *var;
    const char *value;          /* NULL: not to be printed (tokens) */
    const char *why;
};

/* The variable's value, or NULL when it is unset or empty. */
static const char *env_value(enum setting s)
{
    const char *v = getenv(defs[s].env);
    return v && *v ? v : NULL;
}

/* Apply every BEANGATE_* variable to cfg. 0, or -1 with *err set. */
static int apply_env(struct server_config *cfg, struct env_error *err)
{
    const char *v;
    uint64_t size;
    int b;
#define ENV_FAIL(s, shown, msg) \
    do { err->var = defs[s].env; err->value = (shown); err->why = (msg); return -1; } while (0)
    if ((v = env_value(S_LISTEN))) cfg->listen_addr = v, sources[S_LISTEN] = FROM_ENV;
    if ((v = env_value(S_PORT))) {
        if (parse_port(v) != 0) ENV_FAIL(S_PORT, v, "not a port number (0-65535)");
        cfg->port = v, sources[S_PORT] = FROM_ENV;
    }
    if ((v = env_value(S_USER))) cfg->user = v, sources[S_USER] = FROM_ENV;
    if ((v = env_value(S_MAX_JOB_SIZE))) {
        if (parse_size(v, &size) != 0) ENV_FAIL(S_MAX_JOB_SIZE, v, "invalid size");
        cfg->max_job_size = clamp_job_size(size, defs[S_MAX_JOB_SIZE].env);
        sources[S_MAX_JOB_SIZE] = FROM_ENV;
    }
    if ((v = env_value(S_VERBOSE))) {
        if (parse_size(v, &size) != 0 || size > 100) ENV_FAIL(S_VERBOSE, v, "not a number from 0 to 100");
        cfg->verbose = (int)size, sources[S_VERBOSE] = FROM_ENV;
    }
    if ((v = env_value(S_BINLOG_DIR))) cfg->log_dir = v, sources[S_BINLOG_DIR] = FROM_ENV;
    if ((v = env_value(S_FSYNC_MS))) {
        if (parse_fsync_ms(v, &cfg->fsync_ms) != 0) ENV_FAIL(S_FSYNC_MS, v, "invalid time");
        cfg->fsync_never = 0;
        sources[S_FSYNC_MS] = FROM_ENV;
    }
    if ((v = env_value(S_NO_FSYNC))) {
        if (parse_bool(v, &b) != 0) ENV_FAIL(S_NO_FSYNC, v, "not a boolean (1/0, true/false, yes/no, on/off)");
        cfg->fsync_never = b, sources[S_NO_FSYNC] = FROM_ENV;
    }
    if ((v = env_value(S_BINLOG_SIZE))) {
        if (parse_segment_size(v, &cfg->segment_size) != 0) ENV_FAIL(S_BINLOG_SIZE, v, "invalid size");
        sources[S_BINLOG_SIZE] = FROM_ENV;
    }
    if ((v = env_value(S_LOG_RECOVER_DAMAGED))) {
        if (parse_bool(v, &b) != 0)
            ENV_FAIL(S_LOG_RECOVER_DAMAGED, v, "not a boolean (1/0, true/false, yes/no, on/off)");
        cfg->log_recover_damaged = b, sources[S_LOG_RECOVER_DAMAGED] = FROM_ENV;
    }
    if ((v = env_value(S_HTTP_LISTEN))) {
        cfg->http_listen = v, cfg->http_explicit = 1, sources[S_HTTP_LISTEN] = FROM_ENV;
    }
    if ((v = env_value(S_HTTP_PORT))) {
        if (parse_port(v) != 0) ENV_FAIL(S_HTTP_PORT, v, "not a port number (0-65535)");
        cfg->http_port = v, cfg->http_explicit = 1, sources[S_HTTP_PORT] = FROM_ENV;
    }
    if ((v = env_value(S_NO_HTTP))) {
        if (parse_bool(v, &b) != 0) ENV_FAIL(S_NO_HTTP, v, "not a boolean (1/0, true/false, yes/no, on/off)");
        cfg->http_enabled = !b, sources[S_NO_HTTP] = FROM_ENV;
    }
    if ((v = env_value(S_HTTP_TOKEN_FILE)))
        cfg->http_token_file = v, sources[S_HTTP_TOKEN_FILE] = FROM_ENV;
    if ((v = env_value(S_METRICS_AUTH))) {
        if (parse_bool(v, &b) != 0) ENV_FAIL(S_METRICS_AUTH, v, "not a boolean (1/0, true/false, yes/no, on/off)");
        cfg->metrics_auth = b, sources[S_METRICS_AUTH] = FROM_ENV;
    }
    if ((v = env_value(S_HTTP_MAX_WAIT))) {
        if (parse_max_wait(v, &cfg->http_max_wait) != 0)
            ENV_FAIL(S_HTTP_MAX_WAIT, v, "not a number of seconds from 1 to 3600");
        sources[S_HTTP_MAX_WAIT] = FROM_ENV;
    }
    if ((v = env_value(S_GEARMAN_LISTEN)))
        cfg->gearman_listen = v, cfg->gearman_enabled = 1, sources[S_GEARMAN_LISTEN] = FROM_ENV;
    if ((v = env_value(S_GEARMAN_PORT))) {
        if (parse_port(v) != 0) ENV_FAIL(S_GEARMAN_PORT, v, "not a port number (0-65535)");
        cfg->gearman_port = v, cfg->gearman_enabled = 1, sources[S_GEARMAN_PORT] = FROM_ENV;
    }
    if ((v = env_value(S_GEARMAN_ADMIN_SHUTDOWN))) {
        if (parse_bool(v, &b) != 0)
            ENV_FAIL(S_GEARMAN_ADMIN_SHUTDOWN, v, "not a boolean (1/0, true/false, yes/no, on/off)");
        cfg->gearman_admin_shutdown = b, sources[S_GEARMAN_ADMIN_SHUTDOWN] = FROM_ENV;
    }
    /* BEANGATE_HTTP_TOKENS is read with the token file (load_tokens) */
#undef ENV_FAIL
    return 0;
}

/* ---- the command line -------------------------------------------------- */

/* One --name [value] flag at argv[*i]; 0, 1 (exit 0) or the usage exit status. */
static int parse_long_flag(struct server_config *cfg, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    static const struct { const char *name; enum setting s; } valued[] = {
        {"--http-listen", S_HTTP_LISTEN},
        {"--http-port", S_HTTP_PORT},
        {"--http-token-file", S_HTTP_TOKEN_FILE},
        {"--http-max-wait", S_HTTP_MAX_WAIT},
        {"--gearman-listen", S_GEARMAN_LISTEN},
        {"--gearman-port", S_GEARMAN_PORT},
    };
    if (strcmp(a, "--no-http") == 0) {
        cfg->http_enabled = 0;
        sources[S_NO_HTTP] = FROM_FLAG;
        return 0;
    }
    if (strcmp(a, "--log-recover-damaged") == 0) {
        cfg->log_recover_damaged = 1;
        sources[S_LOG_RECOVER_DAMAGED] = FROM_FLAG;
        return 0;
    }
    if (strcmp(a, "--metrics-auth") == 0) {
        cfg->metrics_auth = 1;
        sources[S_METRICS_AUTH] = FROM_FLAG;
        return 0;
    }
    if (strcmp(a, "--gearman-admin-shutdown") == 0) {
        cfg->gearman_admin_shutdown = 1;
        sources[S_GEARMAN_ADMIN_SHUTDOWN] = FROM_FLAG;
        return 0;
    }
    if (strcmp(a, "--help") == 0) {
        usage(stdout);
        return 1;
    }
    if (strcmp(a, "--version") == 0) {
        printf("beangate %s (beanstalkd %s protocol)\n", BEANGATE_VERSION, BG_VERSION);
        return 1;
    }
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) {
        size_t n = strlen(valued[k].name);
        if (strncmp(a, valued[k].name, n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
        const char *value = a[n] == '=' ? a + n + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
        if (!value || !*value) return usage_error("flag requires an argument", valued[k].name, NULL);
        sources[valued[k].s] = FROM_FLAG;
        switch (valued[k].s) {
        case S_HTTP_LISTEN: cfg->http_listen = value, cfg->http_explicit = 1; break;
        case S_HTTP_PORT: cfg->http_port = value, cfg->http_explicit = 1; break;
        case S_HTTP_MAX_WAIT:
            if (parse_max_wait(value, &cfg->http_max_wait) != 0)
                return usage_error("not a number of seconds from 1 to 3600", valued[k].name, value);
            break;
        case S_GEARMAN_LISTEN: cfg->gearman_listen = value, cfg->gearman_enabled = 1; break;
        case S_GEARMAN_PORT:
            if (parse_port(value) != 0) return usage_error("invalid port", valued[k].name, value);
            cfg->gearman_port = value, cfg->gearman_enabled = 1;
            break;
        default: cfg->http_token_file = value; break;
        }
        return 0;
    }
    return usage_error("unknown flag", a, NULL);
}

/* beanstalkd's short flags, bundled or not (-Vp 11300, -p11300). */
static int parse_args(struct server_config *cfg, int argc, char **argv)
{
    int verbose = 0;            /* -V on the command line replaces the environment's */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) == 0) {
            int r = parse_long_flag(cfg, argc, argv, &i);
            if (r != 0) return r;
            continue;
        }
        if (a[0] != '-' || a[1] == '\0') return usage_error("unknown argument", a, NULL);
        for (const char *f = a + 1; *f; f++) {
            char flag = *f;
            char name[3] = {'-', flag, 0};
            const char *value = NULL;
            if (strchr("lpuzbfs", flag)) {
                /* the value is the rest of this word, or the next word */
                if (f[1]) value = f + 1;
                else if (i + 1 < argc) value = argv[++i];
                else return usage_error("flag requires an argument", name, NULL);
            }
            uint64_t size;
            switch (flag) {
            case 'l': cfg->listen_addr = value, sources[S_LISTEN] = FROM_FLAG; break;
            case 'p': cfg->port = value, sources[S_PORT] = FROM_FLAG; break;
            case 'u': cfg->user = value, sources[S_USER] = FROM_FLAG; break;
            case 'z':
                if (parse_size(value, &size) != 0) return usage_error("invalid size", name, value);
                cfg->max_job_size = clamp_job_size(size, "-z");
                sources[S_MAX_JOB_SIZE] = FROM_FLAG;
                break;
            case 'b': cfg->log_dir = value, sources[S_BINLOG_DIR] = FROM_FLAG; break;
            case 'f':
                if (parse_fsync_ms(value, &cfg->fsync_ms) != 0) return usage_error("invalid time", name, value);
                cfg->fsync_never = 0; /* as beanstalkd: the later of -f and -F wins */
                sources[S_FSYNC_MS] = FROM_FLAG;
                break;
            case 'F': cfg->fsync_never = 1, sources[S_NO_FSYNC] = FROM_FLAG; break;
            case 's':
                if (parse_segment_size(value, &cfg->segment_size) != 0)
                    return usage_error("invalid size", name, value);
                sources[S_BINLOG_SIZE] = FROM_FLAG;
                break;
            case 'V': verbose++; break;
            case 'v':
                printf("beangate %s (beanstalkd %s protocol)\n", BEANGATE_VERSION, BG_VERSION);
                return 1;
            case 'h':
                usage(stdout);
                return 1;
            default:
                return usage_error("unknown flag", name, NULL);
            }
            if (value) break; /* the value used up the rest of the word */
        }
    }
    if (verbose) cfg->verbose = verbose, sources[S_VERBOSE] = FROM_FLAG;
    return 0;
}

/* ---- bearer tokens ----------------------------------------------------- */

/* Kept for the life of the process (the gateway copies them). */
static char *tokens[GW_AUTH_TOKENS_MAX];
static size_t token_count;

/* Trim spaces and tabs at both ends of s[0..*n); returns the start. */
static char *trim(char *s, size_t *n)
{
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\r' || s[*n - 1] == '\n'))
        (*n)--;
    while (*n && (*s == ' ' || *s == '\t')) s++, (*n)--;
    return s;
}

/* Add one token of n bytes. NULL, or why it was refused. */
static const char *add_token(const char *t, size_t n)
{
    if (n > GW_AUTH_TOKEN_MAX) return "token longer than 512 bytes";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] <= ' ' || (unsigned char)t[i] >= 0x7f)
            return "token has a byte that is not visible ASCII";
    if (token_count == GW_AUTH_TOKENS_MAX) return "more than 256 tokens";
    char *copy = malloc(n + 1);
    if (!copy) return "out of memory";
    memcpy(copy, t, n);
    copy[n] = '\0';
    tokens[token_count++] = copy;
    if (n < 16) log_event(BG_LOG_WARN, "weak_token", "length=%zu msg=\"shorter than 16 bytes\"", n);
    return NULL;
}

/* Read the token file: 0, or SERVER_USAGE_EXIT after a message. */
static int load_token_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        log_event(BG_LOG_ERROR, "token_file_error", "path=%s error=%s", log_str(path),
                  log_str(strerror(errno)));
        return SERVER_USAGE_EXIT;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & S_IROTH))
        log_event(BG_LOG_WARN, "token_file_readable", "path=%s msg=\"readable by every user\"",
                  log_str(path));
    size_t before = token_count;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t n = (size_t)len;
        char *t = trim(line, &n);
        if (n == 0 || t[0] == '#') continue;
        const char *why = memchr(t, '\0', n) ? "token has a NUL byte" : add_token(t, n);
        if (why) {
            log_event(BG_LOG_ERROR, "token_file_error", "path=%s line=%u msg=%s", log_str(path),
                      lineno, log_str(why));
            rc = SERVER_USAGE_EXIT;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        log_event(BG_LOG_ERROR, "token_file_error", "path=%s error=%s", log_str(path),
                  log_str(strerror(errno)));
        rc = SERVER_USAGE_EXIT;
    }
    free(line);
    fclose(f);
    if (rc == 0 && token_count == before) {
        log_event(BG_LOG_ERROR, "token_file_error",
                  "path=%s msg=\"no token in the file: refusing to start an open gateway\"",
                  log_str(path));
        rc = SERVER_USAGE_EXIT;
    }
    return rc;
}

/* BEANGATE_HTTP_TOKENS: comma-separated. 0, or SERVER_USAGE_EXIT. */
static int load_token_env(const char *value)
{
    char *copy = strdup(value);
    if (!copy) return SERVER_USAGE_EXIT;
    size_t before = token_count;
    unsigned item = 0;
    int rc = 0;
    for (char *p = copy, *comma; p; p = comma ? comma + 1 : NULL) {
        comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char *t = trim(p, &n);
        item++;
        if (n == 0) continue;
        const char *why = add_token(t, n);
        if (why) {
            log_event(BG_LOG_ERROR, "bad_env", "var=%s item=%u msg=%s", defs[S_HTTP_TOKENS].env,
                      item, log_str(why));
            rc = SERVER_USAGE_EXIT;
            break;
        }
    }
    free(copy);
    if (rc == 0 && token_count == before) {
        log_event(BG_LOG_ERROR, "bad_env", "var=%s msg=\"no token in the value\"",
                  defs[S_HTTP_TOKENS].env);
        rc = SERVER_USAGE_EXIT;
    }
    return rc;
}

static int load_tokens(struct server_config *cfg)
{
    int rc;
    if (cfg->http_token_file && (rc = load_token_file(cfg->http_token_file)) != 0) return rc;
    const char *v = env_value(S_HTTP_TOKENS);
    if (v) {
        if ((rc = load_token_env(v)) != 0) return rc;
        sources[S_HTTP_TOKENS] = FROM_ENV;
    }
    cfg->http_tokens = (const char *const *)tokens;
    cfg->http_token_count = token_count;
    return 0;
}

/* ---- the effective configuration --------------------------------------- */

static void log_config(const struct server_config *c)
{
    if (!log_enabled(BG_LOG_INFO)) return;
    log_event(BG_LOG_INFO, "config",
              "listen=%s port=%s user=%s max_job_size=%u verbose=%d binlog_dir=%s fsync_ms=%d "
              "fsync_never=%d binlog_size=%llu http=%s http_listen=%s http_port=%s "
              "http_token_file=%s http_tokens=%zu http_auth=%s metrics_auth=%s http_max_wait=%u gearman=%s "
              "gearman_listen=%s gearman_port=%s log_recover_damaged=%s gearman_admin_shutdown=%s",
              log_str(c->listen_addr), log_str(c->port), log_str(c->user), c->max_job_size,
              c->verbose, log_str(c->log_dir), c->fsync_ms, c->fsync_never,
              (unsigned long long)c->segment_size, c->http_enabled ? "on" : "off",
              log_str(c->http_listen), log_str(c->http_port), log_str(c->http_token_file),
              c->http_token_count, c->http_token_count ? "on" : "off",
              c->metrics_auth ? "on" : "off", c->http_max_wait, c->gearman_enabled ? "on" : "off",
              log_str(c->gearman_listen), log_str(c->gearman_port),
              c->log_recover_damaged ? "on" : "off", c->gearman_admin_shutdown ? "on" : "off");
    for (int s = 0; s < S_COUNT; s++)
        log_event(BG_LOG_DEBUG, "config_source", "setting=%s source=%s var=%s", defs[s].key,
                  source_names[sources[s]], defs[s].env);
}

int server_config_parse(struct server_config *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->listen_addr = "127.0.0.1";
    cfg->port = "11300";
    cfg->max_job_size = BG_JOB_SIZE_DEFAULT;
    cfg->http_listen = "127.0.0.1";
    cfg->http_port = "11301";
    cfg->http_enabled = 1;
    cfg->http_max_wait = GW_MAX_WAIT_DEFAULT_S;
    cfg->gearman_listen = "127.0.0.1";
    cfg->gearman_port = "4730";
    cfg->fsync_ms = SERVER_FSYNC_MS_DEFAULT;
    cfg->segment_size = SERVER_SEGMENT_SIZE_DEFAULT;
    for (int s = 0; s < S_COUNT; s++) sources[s] = FROM_DEFAULT;

    struct env_error err = {0};
    int env_rc = apply_env(cfg, &err);
    int rc = parse_args(cfg, argc, argv);
    if (rc != 0) return rc;
    if (env_rc != 0) {
        if (err.value)
            log_event(BG_LOG_ERROR, "bad_env", "var=%s value=%s msg=%s", err.var, log_str(err.value),
                      log_str(err.why));
        else
            log_event(BG_LOG_ERROR, "bad_env", "var=%s msg=%s", err.var, log_str(err.why));
        return SERVER_USAGE_EXIT;
    }
    log_set_verbosity(cfg->verbose);
    if ((rc = load_tokens(cfg)) != 0) return rc;
    log_config(cfg);
    return 0;
}

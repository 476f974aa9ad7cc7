/* config.c - beanstalkd-compatible command-line flags. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

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
        " -V       increase verbosity\n"
        " -h       show this help\n"
        " --http-listen ADDR  HTTP/JSON gateway address (default is 127.0.0.1)\n"
        " --http-port PORT    HTTP/JSON gateway port (default is 11301)\n"
        " --no-http           do not start the HTTP/JSON gateway\n",
        BG_JOB_SIZE_LIMIT);
}

/* Print a usage error and return the usage exit status. */
static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "beangate: %s%s\n", what, arg ? arg : "");
    usage(stderr);
    return SERVER_USAGE_EXIT;
}

/* Parse a size for -z: digits only. 0 or -1. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s < '0' || *s > '9') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) return -1;
    *out = v;
    return 0;
}

/* One --name [value] flag at argv[*i]; 0 or the usage exit status. */
static int parse_long_flag(struct server_config *cfg, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    static const char *const valued[] = {"--http-listen", "--http-port"};
    if (strcmp(a, "--no-http") == 0) {
        cfg->http_enabled = 0;
        return 0;
    }
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) {
        size_t n = strlen(valued[k]);
        if (strncmp(a, valued[k], n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
        const char *value = a[n] == '=' ? a + n + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
        if (!value || !*value) return usage_error("flag requires an argument: ", valued[k]);
        cfg->http_explicit = 1;
        if (k == 0) cfg->http_listen = value;
        else cfg->http_port = value;
        return 0;
    }
    return usage_error("unknown flag: ", a);
}

int server_config_parse(struct server_config *cfg, int argc, char **argv)
{
    cfg->listen_addr = "127.0.0.1";
    cfg->port = "11300";
    cfg->user = NULL;
    cfg->max_job_size = BG_JOB_SIZE_DEFAULT;
    cfg->verbose = 0;
    cfg->http_listen = "127.0.0.1";
    cfg->http_port = "11301";
    cfg->http_enabled = 1;
    cfg->log_dir = NULL;
    cfg->fsync_ms = 50;
    cfg->fsync_never = 0;
    cfg->segment_size = 10485760;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) == 0) {
            int r = parse_long_flag(cfg, argc, argv, &i);
            if (r != 0) return r;
            continue;
        }
        if (a[0] != '-' || a[1] == '\0') return usage_error("unknown argument: ", a);
        for (const char *f = a + 1; *f; f++) {
            char flag = *f;
            const char *value = NULL;
            if (strchr("lpuzbfs", flag)) {
                /* the value is the rest of this word, or the next word */
                if (f[1]) value = f + 1;
                else if (i + 1 < argc) value = argv[++i];
                else {
                    char name[3] = {'-', flag, 0};
                    return usage_error("flag requires an argument: ", name);
                }
            }
            uint64_t size;
            switch (flag) {
            case 'l': cfg->listen_addr = value; break;
            case 'p': cfg->port = value; break;
            case 'u': cfg->user = value; break;
            case 'z':
                if (parse_size(value, &size) != 0) return usage_error("invalid size: ", value);
                if (size > BG_JOB_SIZE_LIMIT) {
                    fprintf(stderr, "beangate: maximum job size was set to %d\n", BG_JOB_SIZE_LIMIT);
                    size = BG_JOB_SIZE_LIMIT;
                }
                cfg->max_job_size = (uint32_t)size;
                break;
            case 'b': cfg->log_dir = value; break;
            case 'f':
                if (parse_size(value, &size) != 0 || size > 1000000000) return usage_error("invalid time: ", value);
                cfg->fsync_ms = (int)size;
                break;
            case 'F': cfg->fsync_never = 1; break;
            case 's':
                if (parse_size(value, &size) != 0 || size == 0) return usage_error("invalid size: ", value);
                cfg->segment_size = (size + 4095) / 4096 * 4096;
                break;
            case 'V': cfg->verbose++; break;
            case 'v':
                printf("beangate %s (beanstalkd %s protocol)\n", BEANGATE_VERSION, BG_VERSION);
                return 1;
            case 'h':
                usage(stdout);
                return 1;
            default: {
                char name[3] = {'-', flag, 0};
                return usage_error("unknown flag: ", name);
            }
            }
            if (value) break; /* the value used up the rest of the word */
        }
    }
    return 0;
}

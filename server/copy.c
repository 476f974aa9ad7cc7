/* copy.c - `beangate --copy-jobs FROM TO [OPTIONS]`: copy or move every job
 * of one running beanstalk server to another over the beanstalk protocol,
 * and report the counts (docs/migrating.md). A one-shot tool: two
 * blocking client connections, no event loop.
 *
 * A copy (the default) leaves FROM untouched: it learns FROM's highest job
 * id with one probe job (put delayed into a private tube, deleted at once)
 * and scans the ids below it with pipelined `stats-job` + `peek`; the puts
 * on TO are pipelined too. A move (--move) takes each tube's heads with
 * `peek-ready`/`peek-delayed`/`peek-buried`, puts the job on TO and deletes
 * it on FROM only after TO acknowledged it: a stop at any point loses no
 * job and leaves at most one on both servers.
 *
 * A job keeps its tube, priority, TTR, body and state; a delayed one gets
 * its remaining delay (stats-job time-left, whole seconds). A buried job is
 * put with FROM's stats-job delay once TO acknowledged a pause of its tube
 * (so no consumer of TO can take it; a refused pause stops the copy),
 * taken with `reserve-job` (beanstalkd 1.12+), buried with its priority,
 * and the tube's pause set back to what it was; a failure between puts and
 * buries deletes the copies on TO. A
 * paused tube of FROM is paused on TO for its remaining time. Reserved jobs
 * (held by a consumer of FROM) are never copied: they are counted, stay on
 * FROM, and make the exit status 3.
 *
 * FROM and TO are HOST:PORT, tls://HOST:PORT (GnuTLS; the certificate must
 * verify against --tls-ca or the system's CAs and name HOST) or a unix
 * socket path. */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#include "server.h"

#define COPY_EXIT_OK 0
#define COPY_EXIT_ERROR 1
#define COPY_EXIT_RESERVED_LEFT 3
#define COPY_REPLY_TIMEOUT_S 60   /* a server that answers nothing this long has failed */
#define COPY_BATCH 512            /* ids scanned (and puts sent) per round trip */
#define COPY_BATCH_BYTES (16u << 20) /* ... and puts sent once their bodies reach this */
#define COPY_TUBE_MAX 200         /* beanstalkd's tube name limit */
#define COPY_TUBES_MAX 64         /* --tube given at most this often */
#define COPY_PROBE_DELAY 3600     /* the probe job waits delayed until its delete */
#define COPY_GUARD_PAUSE_S (2 * COPY_REPLY_TIMEOUT_S) /* TO's tube is paused at least this long
                                                       * while a buried job is put and buried ... */
#define COPY_SLOWEST_LINK_BPS (64u << 10) /* ... plus a second per this many bytes of the run's bodies */
#define COPY_CLEANUP_WAIT_S 10    /* how long a copy reserved by a lost connection may take to be released */
#define NS_PER_S 1000000000ull
#define TLS_SCHEME "tls://"
#define COPY_DATA_MAX ((size_t)BG_JOB_SIZE_LIMIT) /* the most a reply may announce (a body, a YAML
                                                   * document): -z's own ceiling */

enum job_state { ST_READY, ST_DELAYED, ST_BURIED, ST_RESERVED, ST_COUNT };
static const char *const state_names[ST_COUNT] = {"ready", "delayed", "buried", "reserved"};

/* One blocking beanstalk connection and its buffers. */
struct peer {
    const char *role;    /* "FROM" or "TO" */
    const char *addr;
    int fd;
    gnutls_session_t tls; /* NULL: plain TCP or a unix socket */
    char *in;            /* read bytes in[start, len) not yet consumed */
    size_t start, len, cap;
    char *out;           /* bytes to send at the next flush */
    size_t out_len, out_cap;
    char tube[COPY_TUBE_MAX + 1]; /* the tube `use`d (TO) */
};

/* One job as read from FROM. */
struct job {
    uint64_t id;
    char tube[COPY_TUBE_MAX + 1];
    enum job_state state;
    uint32_t pri;
    uint64_t ttr, time_left, delay;
    char *body;
    size_t size;
    int sent_use;        /* a `use` went before its put (its USING comes first) */
    uint64_t new_id;
    enum { PUT_NONE, PUT_SENT, PUT_INSERTED } put_stage; /* how far its put on TO got */
};

/* A copy of a buried job that may remain on TO, not buried, after a failed
 * buried run: FROM's id, TO's (0: its put's reply never came). */
struct leftover {
    uint64_t from_id, to_id;
};

/* The counts of one tube; the report's rows. */
struct tube_count {
    char name[COPY_TUBE_MAX + 1];
    uint64_t n[ST_COUNT];  /* copied per state; [ST_RESERVED]: left on FROM */
};

/* TO's pause of one tube as this run knows it: learned once (stats-tube
 * rounds the time left down, so asking again would shorten it) or set by
 * this run. */
struct to_pause {
    char tube[COPY_TUBE_MAX + 1];
    uint64_t end_ns;       /* CLOCK_MONOTONIC time the pause ends; 0: not paused */
};

/* The whole run: options, connections, counts, and why it stopped. */
struct copy {
    struct peer from, to;
    int move, json;
    const char *tubes[COPY_TUBES_MAX];
    size_t tube_count;
    FILE *map;
    const char *tls_ca, *tls_cert, *tls_key; /* --tls-ca, --tls-cert, --tls-key */
    gnutls_certificate_credentials_t tls_cred; /* made by the first tls:// peer */
    int to_has_reserve_job;
    struct tube_count *counts;
    size_t count_len, count_cap;
    uint64_t duplicated;   /* --move: taken on FROM after TO had it (on both) */
    struct to_pause *pauses;
    size_t pause_len, pause_cap;
    uint64_t pauses_copied; /* FROM's tube pauses set on TO */
    struct leftover *left;  /* copies a failed buried run could not delete on TO */
    size_t left_len;
    char left_tube[COPY_TUBE_MAX + 1]; /* their tube on TO (one run fails, then the copy stops) */
    char why[1024];        /* why it stopped; "" while all is well */
};

/* Set c->why (the first reason wins) and return -1. */
static int fail(struct copy *c, const char *fmt, ...)
{
    if (!c->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, sizeof c->why, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- the connection -------------------------------------------------------- */

/* Whether addr is tls://HOST:PORT. */
static int is_tls_addr(const char *addr)
{
    return strncmp(addr, TLS_SCHEME, strlen(TLS_SCHEME)) == 0;
}

/* The credentials every TLS peer shares: --tls-ca's CAs (else the
 * system's) and --tls-cert/--tls-key's client certificate, if given. 0 or -1. */
static int tls_credentials(struct copy *c)
{
    if (c->tls_cred) return 0;
    if (gnutls_certificate_allocate_credentials(&c->tls_cred) < 0) {
        c->tls_cred = NULL;
        return fail(c, "out of memory");
    }
    int n = c->tls_ca ? gnutls_certificate_set_x509_trust_file(c->tls_cred, c->tls_ca, GNUTLS_X509_FMT_PEM)
                      : gnutls_certificate_set_x509_system_trust(c->tls_cred);
    if (n < 0)
        return fail(c, "%s%s: %s", c->tls_ca ? "--tls-ca " : "", c->tls_ca ? c->tls_ca : "the system's CA certificates",
                    gnutls_strerror(n));
    if (n == 0)
        return fail(c, "%s%s: no CA certificate in it", c->tls_ca ? "--tls-ca " : "",
                    c->tls_ca ? c->tls_ca : "the system's CA store (--tls-ca FILE)");
    if (c->tls_cert) {
        int r = gnutls_certificate_set_x509_key_file(c->tls_cred, c->tls_cert, c->tls_key, GNUTLS_X509_FMT_PEM);
        if (r < 0) return fail(c, "--tls-cert %s, --tls-key %s: %s", c->tls_cert, c->tls_key, gnutls_strerror(r));
    }
    return 0;
}

/* Open a TLS session on p's connected socket to host, verifying that the
 * server's certificate chains to a trusted CA and names host. 0 or -1. */
static int tls_start(struct copy *c, struct peer *p, const char *host)
{
    if (tls_credentials(c) != 0) return -1;
    if (gnutls_init(&p->tls, GNUTLS_CLIENT | GNUTLS_NO_SIGNAL) < 0) {
        p->tls = NULL;
        return fail(c, "out of memory");
    }
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    if (gnutls_set_default_priority(p->tls) < 0 ||
        gnutls_credentials_set(p->tls, GNUTLS_CRD_CERTIFICATE, c->tls_cred) < 0 ||
        (!is_ip && gnutls_server_name_set(p->tls, GNUTLS_NAME_DNS, host, strlen(host)) < 0))
        return fail(c, "%s %s: cannot set up TLS", p->role, p->addr);
    gnutls_session_set_verify_cert(p->tls, host, 0);
    gnutls_transport_set_int(p->tls, p->fd);
    int r;
    do r = gnutls_handshake(p->tls); /* the socket's timeouts bound it */
    while (r < 0 && r != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(r));
    if (r == 0) return 0;
    if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        gnutls_datum_t why = {0};
        unsigned status = gnutls_session_get_verify_cert_status(p->tls);
        gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why, 0);
        size_t len = why.data ? strlen((char *)why.data) : 0;
        while (len && why.data[len - 1] == ' ') why.data[--len] = '\0';
        fail(c, "%s %s: TLS: the server's certificate is not trusted: %s%s", p->role, p->addr,
             why.data ? (const char *)why.data : "", c->tls_ca ? "" : " (--tls-ca FILE names its CA)");
        gnutls_free(why.data);
        return -1;
    }
    return fail(c, "%s %s: TLS handshake: %s", p->role, p->addr,
                r == GNUTLS_E_AGAIN ? "no answer in time" : gnutls_strerror(r));
}

/* Connect p to addr: a path (with a '/') is a unix socket, else HOST:PORT
 * ([v6]:PORT too), tls://HOST:PORT over TLS. 0, or -1 with c->why set. */
static int peer_connect(struct copy *c, struct peer *p)
{
    int tls = is_tls_addr(p->addr);
    const char *addr = tls ? p->addr + strlen(TLS_SCHEME) : p->addr;
    char host[256] = "";
    p->fd = -1;
    if (!tls && strchr(addr, '/')) {
        struct sockaddr_un sun = {.sun_family = AF_UNIX};
        if (strlen(addr) >= sizeof sun.sun_path) return fail(c, "%s %s: socket path too long", p->role, addr);
        strcpy(sun.sun_path, addr);
        p->fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (p->fd < 0 || connect(p->fd, (struct sockaddr *)&sun, sizeof sun) != 0)
            return fail(c, "%s %s: cannot connect: %s", p->role, addr, strerror(errno));
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon || colon == addr || !colon[1] || (size_t)(colon - addr) >= sizeof host)
            return fail(c, "%s %s: not HOST:PORT nor a unix socket path", p->role, addr);
        size_t n = (size_t)(colon - addr);
        if (addr[0] == '[' && n >= 2 && addr[n - 1] == ']') memcpy(host, addr + 1, n - 2), host[n - 2] = '\0';
        else memcpy(host, addr, n), host[n] = '\0';
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res, *ai;
        int rc = getaddrinfo(host, colon + 1, &hints, &res);
        if (rc != 0) return fail(c, "%s %s: %s", p->role, addr, gai_strerror(rc));
        int err = 0;
        for (ai = res; ai; ai = ai->ai_next) {
            p->fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (p->fd >= 0 && connect(p->fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            err = errno;
            if (p->fd >= 0) close(p->fd);
            p->fd = -1;
        }
        freeaddrinfo(res);
        if (p->fd < 0) return fail(c, "%s %s: cannot connect: %s", p->role, addr, strerror(err));
    }
    struct timeval tv = {.tv_sec = COPY_REPLY_TIMEOUT_S};
    setsockopt(p->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(p->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return tls ? tls_start(c, p, host) : 0;
}

/* CLOCK_MONOTONIC in nanoseconds. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* Whether a TLS call's GNUTLS_E_AGAIN is to be retried: GnuTLS returns it
 * also after a post-handshake message (a TLS 1.3 session ticket) with no
 * data, so only the socket's timeout, seen by the clock, is an answer
 * missing. */
static int tls_again(const struct peer *p, ssize_t r, uint64_t deadline)
{
    return p->tls && r == GNUTLS_E_AGAIN && now_ns() < deadline;
}

/* The reason a failed send or recv on p gives (r: its result; errno for a
 * plain one), into c->why; -1. */
static int io_failed(struct copy *c, struct peer *p, ssize_t r, const char *what)
{
    int sys = !p->tls || r == GNUTLS_E_PULL_ERROR || r == GNUTLS_E_PUSH_ERROR;
    int sys_errno = errno;
    int closed = r == 0 || (p->tls && r == GNUTLS_E_PREMATURE_TERMINATION) ||
                 (sys && (sys_errno == ECONNRESET || sys_errno == EPIPE));
    /* a TLS server that wants a client certificate it did not get closes
     * the connection or sends an alert, nothing else */
    const char *hint = p->tls && !c->tls_cert && (closed || r == GNUTLS_E_FATAL_ALERT_RECEIVED)
                           ? " (a server that wants a client certificate closes so: --tls-cert, --tls-key)"
                           : "";
    if (r == 0 || (p->tls && r == GNUTLS_E_PREMATURE_TERMINATION))
        return fail(c, "%s %s: the server closed the connection%s", p->role, p->addr, hint);
    if (p->tls ? r == GNUTLS_E_AGAIN : sys_errno == EAGAIN)
        return fail(c, "%s %s: no answer within %d s", p->role, p->addr, COPY_REPLY_TIMEOUT_S);
    if (!p->tls) return fail(c, "%s %s: %s failed: %s", p->role, p->addr, what, strerror(sys_errno));
    return fail(c, "%s %s: %s failed: %s%s%s%s%s", p->role, p->addr, what, gnutls_strerror((int)r), sys ? " (" : "",
                sys ? strerror(sys_errno) : "", sys ? ")" : "", hint);
}

/* Room for n more bytes in *buf (of *cap, *len used); 0 or -1 (no memory). */
static int reserve_bytes(char **buf, size_t *cap, size_t len, size_t n)
{
    if (*cap - len >= n) return 0;
    size_t want = *cap ? *cap : 65536;
    while (want - len < n) want *= 2;
    char *b = realloc(*buf, want);
    if (!b) return -1;
    *buf = b, *cap = want;
    return 0;
}

/* Append bytes / a formatted command to p's output; -1 (no memory). */
static int send_bytes(struct copy *c, struct peer *p, const void *data, size_t n)
{
    if (reserve_bytes(&p->out, &p->out_cap, p->out_len, n) != 0) return fail(c, "out of memory");
    memcpy(p->out + p->out_len, data, n);
    p->out_len += n;
    return 0;
}

static int send_line(struct copy *c, struct peer *p, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return send_bytes(c, p, line, (size_t)n);
}

/* Write p's output to the socket; 0 or -1. */
static int flush(struct copy *c, struct peer *p)
{
    size_t done = 0;
    uint64_t deadline = now_ns() + COPY_REPLY_TIMEOUT_S * NS_PER_S;
    while (done < p->out_len) {
        ssize_t w = p->tls ? gnutls_record_send(p->tls, p->out + done, p->out_len - done)
                           : send(p->fd, p->out + done, p->out_len - done, MSG_NOSIGNAL);
        if ((p->tls ? w == GNUTLS_E_INTERRUPTED : w < 0 && errno == EINTR) || tls_again(p, w, deadline)) continue;
        if (w <= 0) return io_failed(c, p, w, "write");
        done += (size_t)w;
    }
    p->out_len = 0;
    return 0;
}

/* Until p holds n unconsumed bytes: read more. 0 or -1. */
static int fill(struct copy *c, struct peer *p, size_t n)
{
    uint64_t deadline = now_ns() + COPY_REPLY_TIMEOUT_S * NS_PER_S;
    while (p->len - p->start < n) {
        if (p->start > 0) {
            memmove(p->in, p->in + p->start, p->len - p->start);
            p->len -= p->start, p->start = 0;
        }
        if (reserve_bytes(&p->in, &p->cap, p->len, n > 65536 ? n : 65536) != 0) return fail(c, "out of memory");
        ssize_t r = p->tls ? gnutls_record_recv(p->tls, p->in + p->len, p->cap - p->len)
                           : recv(p->fd, p->in + p->len, p->cap - p->len, 0);
        if ((p->tls ? r == GNUTLS_E_INTERRUPTED : r < 0 && errno == EINTR) || tls_again(p, r, deadline)) continue;
        if (r <= 0) return io_failed(c, p, r, "read");
        p->len += (size_t)r;
    }
    return 0;
}

/* The next reply line of p without its CRLF (valid until the next read),
 * or NULL (c->why set). */
static char *read_line(struct copy *c, struct peer *p)
{
    for (size_t scanned = 0;;) {
        char *s = p->in + p->start;
        size_t have = p->len - p->start;
        char *nl = have > scanned ? memchr(s + scanned, '\n', have - scanned) : NULL;
        if (nl) {
            if (nl == s || nl[-1] != '\r') break;
            nl[-1] = '\0';
            p->start += (size_t)(nl - s) + 1;
            return s;
        }
        if (have > 1024) break;
        scanned = have;
        if (fill(c, p, have + 1) != 0) return NULL;
    }
    fail(c, "%s %s: a reply line that is not beanstalk's", p->role, p->addr);
    return NULL;
}

/* The n-byte data (and its CRLF) that follows a reply line; a pointer valid
 * until the next read, or NULL. */
static const char *read_data(struct copy *c, struct peer *p, size_t n)
{
    if (n > COPY_DATA_MAX) {
        fail(c, "%s %s: a reply announces %zu bytes, more than %zu", p->role, p->addr, n, COPY_DATA_MAX);
        return NULL;
    }
    if (fill(c, p, n + 2) != 0) return NULL;
    const char *d = p->in + p->start;
    if (d[n] != '\r' || d[n + 1] != '\n') {
        fail(c, "%s %s: data not ended by CRLF", p->role, p->addr);
        return NULL;
    }
    p->start += n + 2;
    return d;
}

/* The data of the `OK <bytes>` reply whose line is `line` (stats-job,
 * stats-tube, list-tubes), *n its length: a pointer valid until the next
 * read, or NULL after a message naming `what`. */
static const char *read_ok_data(struct copy *c, struct peer *p, const char *line, const char *what, size_t *n)
{
    unsigned long long len;
    char tail;
    if (sscanf(line, "OK %llu%c", &len, &tail) != 1) {
        fail(c, "%s %s: %s: answered \"%s\"", p->role, p->addr, what, line);
        return NULL;
    }
    *n = (size_t)len;
    return read_data(c, p, *n);
}

/* Read one reply line and fail unless it is `want` exactly. */
static int expect(struct copy *c, struct peer *p, const char *want, const char *what)
{
    const char *line = read_line(c, p);
    if (!line) return -1;
    if (strcmp(line, want) != 0)
        return fail(c, "%s %s: %s: answered \"%s\" (expected %s)", p->role, p->addr, what, line, want);
    return 0;
}

/* The field `key` of p's stats-tube of tube (a whole number, maybe
 * negative) into *out: 1, 0 (no such tube or field; *out 0), -1. */
static int tube_stat(struct copy *c, struct peer *p, const char *tube, const char *key, int64_t *out)
{
    *out = 0;
    if (send_line(c, p, "stats-tube %s\r\n", tube) != 0 || flush(c, p) != 0) return -1;
    const char *line = read_line(c, p);
    if (!line) return -1;
    if (strcmp(line, "NOT_FOUND") == 0) return 0;
    char what[16 + COPY_TUBE_MAX];
    snprintf(what, sizeof what, "stats-tube %s", tube);
    size_t n;
    const char *yaml = read_ok_data(c, p, line, what, &n);
    if (!yaml) return -1;
    char *doc = strndup(yaml, n), pattern[64];
    if (!doc) return fail(c, "out of memory");
    snprintf(pattern, sizeof pattern, "\n%s: ", key);
    const char *at = strstr(doc, pattern);
    if (at) *out = strtoll(at + strlen(pattern), NULL, 10);
    free(doc);
    return at ? 1 : 0;
}

/* ---- reading jobs on FROM ---------------------------------------------------- */

/* The fields of a stats-job YAML document into j; 0 or -1. */
static int parse_stats_job(struct copy *c, const char *yaml, size_t n, struct job *j)
{
    char doc[2048];
    if (n >= sizeof doc) return fail(c, "FROM %s: stats-job of job %" PRIu64 " too long", c->from.addr, j->id);
    memcpy(doc, yaml, n);
    doc[n] = '\0';
    int seen = 0;
    for (char *save, *line = strtok_r(doc, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strstr(line, ": ");
        if (!colon) continue;
        *colon = '\0';
        char *v = colon + 2;
        if (strcmp(line, "tube") == 0) {
            size_t len = strlen(v);
            if (len >= 2 && v[0] == '"' && v[len - 1] == '"') v[len - 1] = '\0', v++;
            snprintf(j->tube, sizeof j->tube, "%s", v);
            seen |= 1;
        } else if (strcmp(line, "state") == 0) {
            j->state = ST_COUNT;
            for (int s = 0; s < ST_COUNT; s++)
                if (strcmp(v, state_names[s]) == 0) j->state = (enum job_state)s;
            if (j->state == ST_COUNT)
                return fail(c, "FROM %s: job %" PRIu64 " has the unknown state %s", c->from.addr, j->id, v);
            seen |= 2;
        } else if (strcmp(line, "pri") == 0) {
            j->pri = (uint32_t)strtoul(v, NULL, 10), seen |= 4;
        } else if (strcmp(line, "ttr") == 0) {
            j->ttr = strtoull(v, NULL, 10), seen |= 8;
        } else if (strcmp(line, "time-left") == 0) {
            j->time_left = strtoull(v, NULL, 10), seen |= 16;
        } else if (strcmp(line, "delay") == 0) {
            j->delay = strtoull(v, NULL, 10), seen |= 32;
        }
    }
    if (seen != 63) return fail(c, "FROM %s: stats-job of job %" PRIu64 " lacks a field", c->from.addr, j->id);
    return 0;
}

/* Read the reply to `stats-job ID`: 1 found (fields in j), 0 NOT_FOUND, -1. */
static int recv_stats_job(struct copy *c, struct job *j)
{
    const char *line = read_line(c, &c->from);
    if (!line) return -1;
    if (strcmp(line, "NOT_FOUND") == 0) return 0;
    char what[48];
    snprintf(what, sizeof what, "stats-job %" PRIu64, j->id);
    size_t n;
    const char *yaml = read_ok_data(c, &c->from, line, what, &n);
    return yaml && parse_stats_job(c, yaml, n, j) == 0 ? 1 : -1;
}

/* Read the reply to a peek: 1 found (id and a copy of the body in j),
 * 0 NOT_FOUND, -1. */
static int recv_peek(struct copy *c, struct job *j, const char *what)
{
    const char *line = read_line(c, &c->from);
    if (!line) return -1;
    if (strcmp(line, "NOT_FOUND") == 0) return 0;
    unsigned long long id, n;
    char tail;
    if (sscanf(line, "FOUND %llu %llu%c", &id, &n, &tail) != 2)
        return fail(c, "FROM %s: %s: answered \"%s\"", c->from.addr, what, line);
    const char *body = read_data(c, &c->from, (size_t)n);
    if (!body) return -1;
    free(j->body);
    j->body = malloc(n ? n : 1);
    if (!j->body) return fail(c, "out of memory (a body of %llu bytes)", n);
    memcpy(j->body, body, n);
    j->id = id, j->size = (size_t)n;
    return 1;
}

/* ---- putting jobs on TO ------------------------------------------------------- */

/* Queue `use tube` on TO unless TO uses it already: 1 queued, 0 not
 * needed, -1. */
static int send_use(struct copy *c, const char *tube)
{
    struct peer *to = &c->to;
    if (strcmp(to->tube, tube) == 0) return 0;
    snprintf(to->tube, sizeof to->tube, "%s", tube);
    return send_line(c, to, "use %s\r\n", tube) != 0 ? -1 : 1;
}

/* Read the USING reply of a send_use of tube; 0 or -1. */
static int recv_use(struct copy *c, const char *tube)
{
    char want[COPY_TUBE_MAX + 8];
    snprintf(want, sizeof want, "USING %s", tube);
    return expect(c, &c->to, want, "use");
}

/* The delay j is put with on TO. time-left is whole seconds, rounded down:
 * +1 makes a delayed job ready on TO less than a second after it would
 * have been on FROM, never before. A buried job gets FROM's delay field
 * (the protocol shows it; put is the only way to set it but for release). */
static uint64_t put_delay(const struct job *j)
{
    return j->state == ST_DELAYED ? j->time_left + 1 : j->state == ST_BURIED ? j->delay : 0;
}

/* Queue j's put on TO (a `use` first if its tube is not TO's). */
static int send_put(struct copy *c, struct job *j)
{
    struct peer *to = &c->to;
    int used = send_use(c, j->tube);
    if (used < 0) return -1;
    j->sent_use = used;
    if (send_line(c, to, "put %" PRIu32 " %" PRIu64 " %" PRIu64 " %zu\r\n", j->pri, put_delay(j), j->ttr,
                  j->size) != 0 ||
        send_bytes(c, to, j->body, j->size) != 0 || send_bytes(c, to, "\r\n", 2) != 0)
        return -1;
    j->put_stage = PUT_SENT;
    return 0;
}

/* Read the replies to j's send_put: 0 (j->new_id set); 1 TO refused it
 * (JOB_TOO_BIG: TO's -z is smaller; DRAINING; ...), the reason naming the
 * job; -1 the connection failed. */
static int recv_put(struct copy *c, struct job *j)
{
    struct peer *to = &c->to;
    if (j->sent_use && recv_use(c, j->tube) != 0) return -1;
    const char *line = read_line(c, to);
    if (!line) return -1;
    unsigned long long id;
    char tail;
    if (sscanf(line, "INSERTED %llu%c", &id, &tail) == 1) {
        j->new_id = id;
        j->put_stage = PUT_INSERTED;
        return 0;
    }
    j->put_stage = PUT_NONE;
    const char *hint = strcmp(line, "JOB_TOO_BIG") == 0 ? " (its -z, the largest job, is smaller than this body)"
                       : strcmp(line, "DRAINING") == 0  ? " (it is draining: it refuses new jobs)"
                       : strncmp(line, "BURIED", 6) == 0 ? " (out of memory: it buried the job)"
                                                         : "";
    fail(c, "TO %s refused job %" PRIu64 " of FROM (tube %s, %zu bytes): \"%s\"%s; the job stays on FROM",
         to->addr, j->id, j->tube, j->size, line, hint);
    return 1;
}

/* Ask whether TO knows reserve-job (beanstalkd 1.12+): `reserve-job 0` is
 * NOT_FOUND there, UNKNOWN_COMMAND before. 0 or -1. */
static int probe_reserve_job(struct copy *c)
{
    if (send_line(c, &c->to, "reserve-job 0\r\n") != 0 || flush(c, &c->to) != 0) return -1;
    const char *line = read_line(c, &c->to);
    if (!line) return -1;
    c->to_has_reserve_job = strcmp(line, "NOT_FOUND") == 0;
    return 0;
}

/* Queue the reserve-job + bury that make j (put delayed) buried on TO. */
static int send_bury(struct copy *c, const struct job *j)
{
    return send_line(c, &c->to, "reserve-job %" PRIu64 "\r\nbury %" PRIu64 " %" PRIu32 "\r\n", j->new_id,
                     j->new_id, j->pri);
}

static int recv_bury(struct copy *c, const struct job *j)
{
    struct peer *to = &c->to;
    const char *line = read_line(c, to);
    if (!line) return -1;
    unsigned long long id, n;
    char tail;
    if (sscanf(line, "RESERVED %llu %llu%c", &id, &n, &tail) != 2 || id != j->new_id)
        return fail(c, "TO %s: reserve-job %" PRIu64 " (job %" PRIu64 " of FROM, buried there): answered \"%s\"; "
                       "it is on TO not buried", to->addr, j->new_id, j->id, line);
    if (!read_data(c, to, (size_t)n)) return -1;
    return expect(c, to, "BURIED", "bury");
}

/* ---- the counts ------------------------------------------------------------------ */

static struct tube_count *tube_row(struct copy *c, const char *tube)
{
    for (size_t i = 0; i < c->count_len; i++)
        if (strcmp(c->counts[i].name, tube) == 0) return &c->counts[i];
    if (c->count_len == c->count_cap) {
        size_t cap = c->count_cap ? 2 * c->count_cap : 16;
        struct tube_count *t = realloc(c->counts, cap * sizeof *t);
        if (!t) return NULL;
        c->counts = t, c->count_cap = cap;
    }
    struct tube_count *row = &c->counts[c->count_len++];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "%s", tube);
    return row;
}

/* Count n jobs of tube in state s; 0 or -1. */
static int count(struct copy *c, const char *tube, enum job_state s, uint64_t n)
{
    struct tube_count *row = tube_row(c, tube);
    if (!row) return fail(c, "out of memory");
    row->n[s] += n;
    return 0;
}

/* j is on TO: count it and write its line of --map. */
static int copied(struct copy *c, const struct job *j)
{
    if (c->map) fprintf(c->map, "%" PRIu64 " %" PRIu64 "\n", j->id, j->new_id);
    return count(c, j->tube, j->state, 1);
}

/* Whether --tube lets tube through (every tube without --tube). */
static int tube_wanted(const struct copy *c, const char *tube)
{
    if (c->tube_count == 0) return 1;
    for (size_t i = 0; i < c->tube_count; i++)
        if (strcmp(c->tubes[i], tube) == 0) return 1;
    return 0;
}

/* A buried job that TO cannot bury: stop before putting it. */
static int check_buried_possible(struct copy *c, const struct job *j)
{
    if (j->state != ST_BURIED || c->to_has_reserve_job) return 0;
    return fail(c, "TO %s lacks reserve-job (beanstalkd 1.12 or later has it), so it cannot take buried "
                   "job %" PRIu64 " of FROM (tube %s) as buried; the job stays on FROM",
                c->to.addr, j->id, j->tube);
}

/* FROM's tubes (list-tubes) into a NULL-ended array of strings; NULL. */
static char **list_tubes(struct copy *c)
{
    if (send_line(c, &c->from, "list-tubes\r\n") != 0 || flush(c, &c->from) != 0) return NULL;
    const char *line = read_line(c, &c->from);
    if (!line) return NULL;
    size_t n = 0;
    const char *yaml = read_ok_data(c, &c->from, line, "list-tubes", &n);
    char *doc = yaml ? strndup(yaml, n) : NULL;
    char **names = doc ? calloc(n / 3 + 2, sizeof *names) : NULL;
    if (!names) {
        free(doc);
        if (yaml) fail(c, "out of memory");
        return NULL;
    }
    size_t k = 0;
    int ok = 1;
    for (char *save, *l = strtok_r(doc, "\n", &save); l && ok; l = strtok_r(NULL, "\n", &save))
        if (strncmp(l, "- ", 2) == 0) ok = (names[k++] = strdup(l + 2)) != NULL;
    free(doc);
    if (!ok) {
        for (size_t i = 0; names[i]; i++) free(names[i]);
        free(names);
        fail(c, "out of memory");
        return NULL;
    }
    return names;
}

/* ---- tube pauses on TO ---------------------------------------------------------- */

/* When a pause with `left` whole seconds left (stats-tube pause-time-left,
 * rounded down; 0 or less: none) ends, from now: a second later at most,
 * never sooner. 0: not paused. */
static uint64_t pause_end(int64_t left)
{
    return left > 0 ? now_ns() + ((uint64_t)left + 1) * NS_PER_S : 0;
}

/* The whole seconds until tp's pause ends (rounded up), 0 if it has. */
static uint64_t pause_left_s(const struct to_pause *tp)
{
    uint64_t now = now_ns();
    return tp->end_ns > now ? (tp->end_ns - now + NS_PER_S - 1) / NS_PER_S : 0;
}

/* TO's pause of tube: the one this run knows, else learned from TO's
 * stats-tube. NULL (c->why set). */
static struct to_pause *to_pause_of(struct copy *c, const char *tube)
{
    for (size_t i = 0; i < c->pause_len; i++)
        if (strcmp(c->pauses[i].tube, tube) == 0) return &c->pauses[i];
    int64_t left;
    if (tube_stat(c, &c->to, tube, "pause-time-left", &left) < 0) return NULL;
    if (c->pause_len == c->pause_cap) {
        size_t cap = c->pause_cap ? 2 * c->pause_cap : 16;
        struct to_pause *p = realloc(c->pauses, cap * sizeof *p);
        if (!p) {
            fail(c, "out of memory");
            return NULL;
        }
        c->pauses = p, c->pause_cap = cap;
    }
    struct to_pause *tp = &c->pauses[c->pause_len++];
    snprintf(tp->tube, sizeof tp->tube, "%s", tube);
    tp->end_ns = pause_end(left);
    return tp;
}

/* Read TO's reply to `pause-tube tube` (what: why it was sent; refused:
 * what then does not happen): 0 PAUSED, else -1 with a reason that names
 * beangate's manage scope when TO refused it so. */
static int recv_pause(struct copy *c, const char *tube, const char *what, const char *refused)
{
    const char *line = read_line(c, &c->to);
    if (!line) return -1;
    if (strcmp(line, "PAUSED") == 0) return 0;
    int denied = strncmp(line, "PERMISSION_DENIED", strlen("PERMISSION_DENIED")) == 0;
    return fail(c, "TO %s: pause-tube %s (%s): answered \"%s\"%s; %s", c->to.addr, tube, what, line,
                denied ? " (copying buried jobs and tube pauses needs pause-tube: on beangate the manage scope "
                         "for the tube, docs/security.md \"Scopes\")"
                       : "",
                refused);
}

/* Pause every wanted tube on TO that is paused on FROM, for the time it
 * has left there (rounded up), before any job is copied: TO's consumers
 * then see the tube as FROM's do. TO's connection watches the tube, so
 * that TO keeps it (and its pause) while this run lasts. */
static int copy_pauses(struct copy *c)
{
    char **tubes = list_tubes(c);
    if (!tubes) return -1;
    int rc = 0;
    for (size_t i = 0; tubes[i] && rc == 0; i++) {
        int64_t left;
        if (!tube_wanted(c, tubes[i])) continue;
        if ((rc = tube_stat(c, &c->from, tubes[i], "pause-time-left", &left) < 0 ? -1 : 0) != 0 || left <= 0)
            continue;
        struct to_pause *tp = to_pause_of(c, tubes[i]);
        if (!tp) {
            rc = -1;
            break;
        }
        tp->end_ns = pause_end(left);
        const char *line;
        unsigned watching;
        char tail;
        if ((rc = send_line(c, &c->to, "watch %s\r\npause-tube %s %" PRIu64 "\r\n", tubes[i], tubes[i],
                            pause_left_s(tp))) != 0 ||
            (rc = flush(c, &c->to)) != 0)
            break;
        if (!(line = read_line(c, &c->to))) rc = -1;
        else if (sscanf(line, "WATCHING %u%c", &watching, &tail) != 1)
            rc = fail(c, "TO %s: watch %s: answered \"%s\"", c->to.addr, tubes[i], line);
        else if ((rc = recv_pause(c, tubes[i], "FROM's pause", "the copy stops before any job")) == 0)
            c->pauses_copied++;
    }
    for (size_t i = 0; tubes[i]; i++) free(tubes[i]);
    free(tubes);
    return rc;
}

/* Whether jobs[k] belongs to the run of tube's buried jobs. */
static int in_buried_run(const struct job *j, const char *tube)
{
    return j->state == ST_BURIED && strcmp(j->tube, tube) == 0;
}

/* Close TO's connection (the jobs it reserved go back to their tube). */
static void peer_close(struct peer *p)
{
    if (p->tls) gnutls_deinit(p->tls);
    if (p->fd >= 0) close(p->fd);
    p->tls = NULL, p->fd = -1;
    p->start = p->len = p->out_len = 0;
}

/* Delete TO's job id over TO's connection: 0 gone (deleted, or not on TO),
 * -1 not deleted (c->why set). A job still reserved by the lost connection
 * is asked for again until TO released it. */
static int delete_on_to(struct copy *c, uint64_t id)
{
    uint64_t deadline = now_ns() + COPY_CLEANUP_WAIT_S * NS_PER_S;
    for (;;) {
        if (send_line(c, &c->to, "delete %" PRIu64 "\r\nstats-job %" PRIu64 "\r\n", id, id) != 0 ||
            flush(c, &c->to) != 0)
            return -1;
        const char *line = read_line(c, &c->to);
        if (!line) return -1;
        int deleted = strcmp(line, "DELETED") == 0;
        if (!deleted && strcmp(line, "NOT_FOUND") != 0)
            return fail(c, "TO %s: delete %" PRIu64 ": answered \"%s\"", c->to.addr, id, line);
        if (!(line = read_line(c, &c->to))) return -1;
        if (strcmp(line, "NOT_FOUND") == 0) return 0;
        size_t n;
        if (!read_ok_data(c, &c->to, line, "stats-job", &n)) return -1;
        if (deleted) return 0;
        if (now_ns() > deadline)
            return fail(c, "TO %s: job %" PRIu64 " stays reserved %d s after its connection was lost", c->to.addr,
                        id, COPY_CLEANUP_WAIT_S);
        struct timespec pause = {.tv_nsec = 50000000};
        nanosleep(&pause, NULL);
    }
}

/* After a failure amid a buried run of tube (jobs[k] in it with put_stage
 * set): over a new connection to TO, delete each copy TO acknowledged, so
 * that none becomes ready there when the guard pause ends, and set the
 * pause back to tp's if nothing may remain. Those it could not delete, and
 * the puts whose reply never came, go to c->left (and so to the report). */
static void undo_buried_run(struct copy *c, struct job *jobs, size_t n, const char *tube, struct to_pause *tp)
{
    char why[sizeof c->why];
    snprintf(why, sizeof why, "%s", c->why);
    c->why[0] = '\0'; /* the cleanup's own failure, then the first one back */
    peer_close(&c->to);
    snprintf(c->to.tube, sizeof c->to.tube, "default");
    int connected = peer_connect(c, &c->to) == 0;
    free(c->left);
    c->left = calloc(n, sizeof *c->left);
    c->left_len = 0;
    snprintf(c->left_tube, sizeof c->left_tube, "%s", tube);
    for (size_t k = 0; k < n && c->left; k++) {
        struct job *j = &jobs[k];
        if (!in_buried_run(j, tube) || j->put_stage == PUT_NONE) continue;
        if (j->put_stage == PUT_INSERTED && connected && delete_on_to(c, j->new_id) == 0) {
            j->put_stage = PUT_NONE;
            continue;
        }
        c->left[c->left_len++] = (struct leftover){j->id, j->put_stage == PUT_INSERTED ? j->new_id : 0};
        if (c->to.fd < 0 || c->why[0]) connected = 0; /* the cleanup's connection failed too */
    }
    if (c->left && c->left_len == 0 && connected) { /* `use` keeps the tube while it is paused */
        int used = send_use(c, tube);
        if (used >= 0 && send_line(c, &c->to, "pause-tube %s %" PRIu64 "\r\n", tube, pause_left_s(tp)) == 0 &&
            flush(c, &c->to) == 0 && (!used || recv_use(c, tube) == 0))
            recv_pause(c, tube, "its pause set back after the cleanup", "the tube stays paused on TO a while");
    }
    if (!c->left) fail(c, "out of memory");
    char cleanup[sizeof c->why];
    snprintf(cleanup, sizeof cleanup, "%s", c->why);
    snprintf(c->why, sizeof c->why, "%s", why);
    if (!c->left || c->left_len) {
        fprintf(stderr, "beangate --copy-jobs: the copies of buried jobs put on TO in tube %s could not all be "
                        "deleted (%s); they wait there, not buried, paused for %" PRIu64 " s more:\n",
                tube, cleanup[0] ? cleanup : "no reply to their put", pause_left_s(tp));
        for (size_t i = 0; c->left && i < c->left_len; i++)
            if (c->left[i].to_id)
                fprintf(stderr, "  job %" PRIu64 " of FROM: job %" PRIu64 " on TO\n", c->left[i].from_id,
                        c->left[i].to_id);
            else
                fprintf(stderr, "  job %" PRIu64 " of FROM: maybe on TO (its put was sent, no reply came)\n",
                        c->left[i].from_id);
    } else {
        fprintf(stderr, "beangate --copy-jobs: the copies of buried jobs put on TO in tube %s were deleted there "
                        "(they stay on FROM)%s%s\n", tube, cleanup[0] ? "; " : "", cleanup);
    }
}

/* The seconds TO's tube stays paused while a buried run is put and
 * buried: long enough for its bodies (bytes) on a slow link, and no less
 * than the tube's own pause (tp). */
static uint64_t guard_pause_s(const struct to_pause *tp, size_t bytes)
{
    uint64_t guard = COPY_GUARD_PAUSE_S + bytes / COPY_SLOWEST_LINK_BPS;
    return pause_left_s(tp) > guard ? pause_left_s(tp) : guard;
}

/* Put the buried jobs of tube among jobs[0..n) on TO and bury them there;
 * marks them in done[]. TO's tube is paused first (and that pause seen
 * acknowledged), so that no consumer of TO takes one while it is ready or
 * delayed (a put's delay is FROM's delay field, often 0); then its pause is
 * set back to what it was. A refused pause puts none (on beangate it needs
 * the manage scope). 0 or -1 (those TO took are buried all the same; if
 * the connection broke, undo_buried_run deletes the copies on TO). */
static int put_buried_run(struct copy *c, struct job *jobs, size_t n, const char *tube, unsigned char *done)
{
    struct peer *to = &c->to;
    struct to_pause *tp = to_pause_of(c, tube);
    if (!tp) return -1;
    size_t bytes = 0;
    for (size_t k = 0; k < n; k++)
        if (in_buried_run(&jobs[k], tube)) bytes += jobs[k].size, jobs[k].put_stage = PUT_NONE;
    int used = send_use(c, tube);
    if (used < 0 || send_line(c, to, "pause-tube %s %" PRIu64 "\r\n", tube, guard_pause_s(tp, bytes)) != 0 ||
        flush(c, to) != 0 || (used && recv_use(c, tube) != 0) ||
        recv_pause(c, tube, "the guard pause under which its buried jobs are put",
                   "its buried jobs are not put (they would be ready on TO) and stay on FROM") != 0)
        return -1;
    int rc = 0, broke = 0;
    for (size_t k = 0; k < n && !broke; k++) {
        if (!in_buried_run(&jobs[k], tube)) continue;
        done[k] = 1;
        jobs[k].new_id = 0; /* set by its INSERTED */
        broke = send_put(c, &jobs[k]) != 0;
    }
    broke = broke || flush(c, to) != 0;
    for (size_t k = 0; k < n && !broke; k++) {
        if (!in_buried_run(&jobs[k], tube)) continue;
        int put = recv_put(c, &jobs[k]);
        broke = put < 0 || (put == 0 && send_bury(c, &jobs[k]) != 0);
        if (put > 0) rc = -1; /* refused: it stays on FROM; the others go on */
    }
    broke = broke || send_line(c, to, "pause-tube %s %" PRIu64 "\r\n", tube, pause_left_s(tp)) != 0 ||
            flush(c, to) != 0;
    for (size_t k = 0; k < n && !broke; k++) {
        if (!in_buried_run(&jobs[k], tube) || jobs[k].put_stage != PUT_INSERTED) continue;
        broke = recv_bury(c, &jobs[k]) != 0 || copied(c, &jobs[k]) != 0;
        if (!broke) jobs[k].put_stage = PUT_NONE; /* buried on TO: a copy made */
    }
    if (broke) {
        undo_buried_run(c, jobs, n, tube, tp);
        return -1;
    }
    if (recv_pause(c, tube, "its pause set back", "its buried jobs are buried on TO") != 0) return -1;
    return rc;
}

/* ---- copy: scan FROM's ids ------------------------------------------------------ */

/* FROM's next job id (so every job's id is below it): put one empty job,
 * delayed, into a private tube and delete it at once. 0 or -1. */
static int next_id(struct copy *c, uint64_t *out)
{
    struct peer *from = &c->from;
    char tube[64];
    snprintf(tube, sizeof tube, "beangate-copy-probe-%ld", (long)getpid());
    if (send_line(c, from, "use %s\r\nput 4294967295 %d 1 0\r\n\r\n", tube, COPY_PROBE_DELAY) != 0 ||
        flush(c, from) != 0)
        return -1;
    char want[80];
    snprintf(want, sizeof want, "USING %s", tube);
    if (expect(c, from, want, "use of the probe tube") != 0) return -1;
    const char *line = read_line(c, from);
    if (!line) return -1;
    unsigned long long id;
    char tail;
    if (sscanf(line, "INSERTED %llu%c", &id, &tail) != 1)
        return fail(c, "FROM %s: the probe job that learns the highest id: answered \"%s\"%s", from->addr, line,
                    strcmp(line, "DRAINING") == 0 ? " (a copy needs FROM to take that one put; --move needs none)" : "");
    if (send_line(c, from, "delete %llu\r\nuse default\r\n", id) != 0 || flush(c, from) != 0 ||
        expect(c, from, "DELETED", "delete of the probe job") != 0 || expect(c, from, "USING default", "use") != 0)
        return -1;
    *out = id;
    return 0;
}

/* Put jobs[0..n) (n <= COPY_BATCH) on TO and count them: the ready and
 * delayed ones pipelined, then the buried ones a tube at a time. */
static int put_batch(struct copy *c, struct job *jobs, size_t n)
{
    unsigned char done[COPY_BATCH] = {0};
    for (size_t i = 0; i < n; i++)
        if (check_buried_possible(c, &jobs[i]) != 0 || (jobs[i].state != ST_BURIED && send_put(c, &jobs[i]) != 0))
            return -1;
    if (flush(c, &c->to) != 0) return -1;
    for (size_t i = 0; i < n; i++)
        if (jobs[i].state != ST_BURIED && (recv_put(c, &jobs[i]) != 0 || copied(c, &jobs[i]) != 0)) return -1;
    for (size_t i = 0; i < n; i++)
        if (jobs[i].state == ST_BURIED && !done[i] && put_buried_run(c, jobs, n, jobs[i].tube, done) != 0)
            return -1;
    return 0;
}

/* Copy every job of FROM (ids 1 to the probe's) to TO; FROM keeps them. */
static int copy_all(struct copy *c)
{
    uint64_t end = 0;
    if (next_id(c, &end) != 0) return -1;
    struct job *jobs = calloc(COPY_BATCH, sizeof *jobs);
    if (!jobs) return fail(c, "out of memory");
    int rc = 0;
    for (uint64_t first = 1; rc == 0 && first < end; first += COPY_BATCH) {
        size_t want = end - first < COPY_BATCH ? (size_t)(end - first) : COPY_BATCH, found = 0, bytes = 0;
        for (size_t i = 0; i < want && rc == 0; i++)
            rc = send_line(c, &c->from, "stats-job %" PRIu64 "\r\npeek %" PRIu64 "\r\n", first + i, first + i);
        if (rc != 0 || (rc = flush(c, &c->from)) != 0) break;
        for (size_t i = 0; i < want; i++) {
            struct job *j = &jobs[found];
            j->id = first + i;
            int in_stats = recv_stats_job(c, j);
            int in_peek = in_stats < 0 ? -1 : recv_peek(c, j, "peek");
            if (in_stats < 0 || in_peek < 0) {
                rc = -1;
                break;
            }
            if (!in_stats || !in_peek || !tube_wanted(c, j->tube)) continue; /* none, or gone between */
            if (j->state == ST_RESERVED) {
                if ((rc = count(c, j->tube, ST_RESERVED, 1)) != 0) break;
                continue;
            }
            bytes += jobs[found++].size;
            if (bytes >= COPY_BATCH_BYTES) { /* large bodies: put what is held before reading on */
                if ((rc = put_batch(c, jobs, found)) != 0) break;
                found = bytes = 0;
            }
        }
        if (rc == 0) rc = put_batch(c, jobs, found);
    }
    for (size_t i = 0; i < COPY_BATCH; i++) free(jobs[i].body);
    free(jobs);
    return rc;
}

/* ---- move: each tube's heads ------------------------------------------------------- */

/* Move one job j (peeked, its stats read) to TO, then delete it on FROM;
 * the command `next` (the next peek) goes with the delete, its reply left
 * unread. */
static int move_one(struct copy *c, struct job *j, const char *next)
{
    unsigned char done = 0;
    if (check_buried_possible(c, j) != 0) return -1;
    if (j->state == ST_BURIED) {
        if (put_buried_run(c, j, 1, j->tube, &done) != 0) return -1;
    } else if (send_put(c, j) != 0 || flush(c, &c->to) != 0 || recv_put(c, j) != 0 || copied(c, j) != 0) {
        return -1;
    }
    /* only now, with TO's acknowledgement, does FROM lose it */
    if (send_line(c, &c->from, "delete %" PRIu64 "\r\n%s\r\n", j->id, next) != 0 || flush(c, &c->from) != 0)
        return -1;
    const char *line = read_line(c, &c->from);
    if (!line) return -1;
    if (strcmp(line, "NOT_FOUND") == 0) {
        c->duplicated++;   /* a consumer took it meanwhile: it is on TO as well */
        fprintf(stderr, "beangate --copy-jobs: job %" PRIu64 " of FROM was reserved by a consumer while it was moved: "
                        "it is on TO (job %" PRIu64 ") too\n", j->id, j->new_id);
        return 0;
    }
    if (strcmp(line, "DELETED") != 0)
        return fail(c, "FROM %s: delete %" PRIu64 " (on TO as job %" PRIu64 "): answered \"%s\"", c->from.addr, j->id,
                    j->new_id, line);
    return 0;
}

/* Move every ready, delayed and buried job of tube, until a pass over the
 * three finds none (a delayed job may turn ready meanwhile). */
static int move_tube(struct copy *c, const char *tube)
{
    static const char *const peeks[] = {"peek-ready", "peek-delayed", "peek-buried"};
    char want[COPY_TUBE_MAX + 8];
    snprintf(want, sizeof want, "USING %s", tube);
    if (send_line(c, &c->from, "use %s\r\n", tube) != 0 || flush(c, &c->from) != 0 ||
        expect(c, &c->from, want, "use") != 0)
        return -1;
    struct job j = {0};
    int rc = 0;
    for (int moved = 1; moved && rc == 0;) {
        moved = 0;
        for (size_t k = 0; k < 3 && rc == 0; k++) {
            for (int peek_sent = 0;;) { /* move_one sends the next peek with its delete */
                if (!peek_sent &&
                    ((rc = send_line(c, &c->from, "%s\r\n", peeks[k])) != 0 || (rc = flush(c, &c->from)) != 0))
                    break;
                peek_sent = 0;
                int found = recv_peek(c, &j, peeks[k]);
                if (found <= 0) {
                    rc = found;
                    break;
                }
                if ((rc = send_line(c, &c->from, "stats-job %" PRIu64 "\r\n", j.id)) != 0 ||
                    (rc = flush(c, &c->from)) != 0)
                    break;
                int in_stats = recv_stats_job(c, &j);
                if (in_stats < 0) {
                    rc = -1;
                    break;
                }
                if (!in_stats || j.state == ST_RESERVED) continue; /* taken between the peek and the stats */
                if ((rc = move_one(c, &j, peeks[k])) != 0) break;
                moved = 1;
                peek_sent = 1;
            }
        }
    }
    free(j.body);
    return rc;
}

/* Move every job of the wanted tubes; count those left reserved on FROM. */
static int move_all(struct copy *c)
{
    char **tubes = list_tubes(c);
    if (!tubes) return -1;
    int rc = 0;
    for (size_t i = 0; tubes[i] && rc == 0; i++) {
        if (!tube_wanted(c, tubes[i])) continue;
        int64_t reserved = 0;
        if ((rc = move_tube(c, tubes[i])) == 0 &&
            (rc = tube_stat(c, &c->from, tubes[i], "current-jobs-reserved", &reserved) < 0 ? -1 : 0) == 0 &&
            reserved > 0)
            rc = count(c, tubes[i], ST_RESERVED, (uint64_t)reserved);
    }
    for (size_t i = 0; tubes[i]; i++) free(tubes[i]);
    free(tubes);
    return rc;
}

/* ---- the report ------------------------------------------------------------------- */

/* The totals per state over every tube into n. */
static void totals(const struct copy *c, uint64_t n[ST_COUNT])
{
    memset(n, 0, ST_COUNT * sizeof n[0]);
    for (size_t i = 0; i < c->count_len; i++)
        for (int s = 0; s < ST_COUNT; s++) n[s] += c->counts[i].n[s];
}

/* A JSON string of s (addresses and reasons may hold quotes). */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* The counts on stdout: a summary line and one line per tube, or JSON. */
static void report(const struct copy *c)
{
    uint64_t n[ST_COUNT];
    totals(c, n);
    uint64_t jobs = n[ST_READY] + n[ST_DELAYED] + n[ST_BURIED];
    if (c->json) {
        printf("{\"mode\":\"%s\",\"from\":", c->move ? "move" : "copy");
        json_string(stdout, c->from.addr);
        printf(",\"to\":");
        json_string(stdout, c->to.addr);
        printf(",\"jobs\":%" PRIu64, jobs);
        for (int s = 0; s < ST_COUNT; s++) printf(",\"%s\":%" PRIu64, state_names[s], n[s]);
        printf(",\"duplicated\":%" PRIu64 ",\"pauses\":%" PRIu64 ",\"tubes\":{", c->duplicated, c->pauses_copied);
        for (size_t i = 0; i < c->count_len; i++) {
            printf("%s\"%s\":{", i ? "," : "", c->counts[i].name);
            for (int s = 0; s < ST_COUNT; s++) printf("%s\"%s\":%" PRIu64, s ? "," : "", state_names[s], c->counts[i].n[s]);
            printf("}");
        }
        printf("},\"may_remain_on_to\":[");
        for (size_t i = 0; i < c->left_len; i++) {
            printf("%s{\"tube\":", i ? "," : "");
            json_string(stdout, c->left_tube);
            printf(",\"from\":%" PRIu64 ",\"to\":", c->left[i].from_id);
            if (c->left[i].to_id) printf("%" PRIu64 "}", c->left[i].to_id);
            else printf("null}");
        }
        printf("],\"error\":");
        if (c->why[0]) json_string(stdout, c->why);
        else printf("null");
        printf("}\n");
        return;
    }
    printf("%s %" PRIu64 " jobs from %s to %s: ready %" PRIu64 ", delayed %" PRIu64 ", buried %" PRIu64
           "; reserved (left on FROM) %" PRIu64 "%s\n",
           c->why[0] ? (c->move ? "stopped after moving" : "stopped after copying") : (c->move ? "moved" : "copied"),
           jobs, c->from.addr, c->to.addr, n[ST_READY], n[ST_DELAYED], n[ST_BURIED], n[ST_RESERVED],
           c->duplicated ? "; some also stayed on FROM (see above)" : "");
    for (size_t i = 0; i < c->count_len; i++)
        printf("  tube %s: ready %" PRIu64 ", delayed %" PRIu64 ", buried %" PRIu64 ", reserved %" PRIu64 "\n",
               c->counts[i].name, c->counts[i].n[ST_READY], c->counts[i].n[ST_DELAYED], c->counts[i].n[ST_BURIED],
               c->counts[i].n[ST_RESERVED]);
    if (c->pauses_copied) printf("  tube pauses copied: %" PRIu64 "\n", c->pauses_copied);
}

/* ---- the command --------------------------------------------------------------------- */

static const char copy_usage[] =
    "Use: beangate --copy-jobs FROM TO [--move] [--tube NAME]... [--map FILE] [--json]\n"
    "                          [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "  FROM, TO     HOST:PORT, tls://HOST:PORT or a unix socket path of a running\n"
    "               beanstalk server\n"
    "  --move       delete each job on FROM once TO acknowledged it\n"
    "  --tube NAME  only this tube (may be repeated)\n"
    "  --map FILE   write one line \"FROM-id TO-id\" per job copied\n"
    "  --json       print the report as one JSON object\n"
    "  --tls-ca FILE    PEM CAs that a tls:// server's certificate must chain to\n"
    "                   (default: the system's)\n"
    "  --tls-cert FILE, --tls-key FILE  a client certificate for tls:// servers\n"
    "Exit status: 0 every job copied, 3 reserved jobs left on FROM, 1 stopped by\n"
    "an error (the reason on stderr), 5 bad usage.\n";

/* A usage error: the reason and the usage on stderr; the usage exit status. */
static int copy_usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "beangate --copy-jobs: %s%s%s\n%s", what, arg ? ": " : "", arg ? arg : "", copy_usage);
    return SERVER_USAGE_EXIT;
}

/* Parse FROM TO and the options into c; 0 or the usage exit status. */
static int parse_copy_args(struct copy *c, int argc, char **argv, const char **map_path)
{
    const char *pos[2];
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--move") == 0) {
            c->move = 1;
        } else if (strcmp(a, "--json") == 0) {
            c->json = 1;
        } else if (strcmp(a, "--tube") == 0 || strcmp(a, "--map") == 0 || strcmp(a, "--tls-ca") == 0 ||
                   strcmp(a, "--tls-cert") == 0 || strcmp(a, "--tls-key") == 0) {
            if (i + 1 >= argc || !argv[i + 1][0]) return copy_usage_error("needs a value", a);
            const char *v = argv[++i];
            if (strcmp(a, "--map") == 0) {
                *map_path = v;
            } else if (strcmp(a, "--tls-ca") == 0) {
                c->tls_ca = v;
            } else if (strcmp(a, "--tls-cert") == 0) {
                c->tls_cert = v;
            } else if (strcmp(a, "--tls-key") == 0) {
                c->tls_key = v;
            } else {
                if (c->tube_count == COPY_TUBES_MAX) return copy_usage_error("--tube given too often", v);
                if (strlen(v) > COPY_TUBE_MAX) return copy_usage_error("tube name too long", v);
                c->tubes[c->tube_count++] = v;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            return copy_usage_error("unknown option", a);
        } else {
            if (npos == 2) return copy_usage_error("one FROM and one TO only", a);
            pos[npos++] = a;
        }
    }
    if (npos < 2) return copy_usage_error("FROM and TO are required", NULL);
    if (strcmp(pos[0], pos[1]) == 0) return copy_usage_error("FROM and TO are the same", pos[0]);
    if (!c->tls_cert != !c->tls_key) return copy_usage_error("--tls-cert and --tls-key go together", NULL);
    if ((c->tls_ca || c->tls_cert) && !is_tls_addr(pos[0]) && !is_tls_addr(pos[1]))
        return copy_usage_error("--tls-ca, --tls-cert and --tls-key need a tls:// FROM or TO", NULL);
    c->from = (struct peer){.role = "FROM", .addr = pos[0], .fd = -1};
    c->to = (struct peer){.role = "TO", .addr = pos[1], .fd = -1, .tube = "default"};
    return 0;
}

int copy_jobs_main(int argc, char **argv)
{
    struct copy c = {0};
    const char *map_path = NULL;
    int rc = parse_copy_args(&c, argc, argv, &map_path);
    if (rc != 0) return rc;
    if (map_path && !(c.map = fopen(map_path, "w"))) {
        fprintf(stderr, "beangate --copy-jobs: --map %s: %s\n", map_path, strerror(errno));
        return COPY_EXIT_ERROR;
    }
    int ok = peer_connect(&c, &c.from) == 0 && peer_connect(&c, &c.to) == 0 && probe_reserve_job(&c) == 0 &&
             copy_pauses(&c) == 0 && (c.move ? move_all(&c) : copy_all(&c)) == 0;
    if (c.map && fclose(c.map) != 0 && ok) ok = fail(&c, "--map %s: %s", map_path, strerror(errno)) == 0;
    report(&c);
    fflush(stdout);
    if (!ok) fprintf(stderr, "beangate --copy-jobs: stopped: %s\n", c.why);
    uint64_t n[ST_COUNT];
    totals(&c, n);
    if (ok && n[ST_RESERVED])
        fprintf(stderr, "beangate --copy-jobs: %" PRIu64 " reserved job(s) left on FROM (held by a consumer): "
                        "not copied\n", n[ST_RESERVED]);
    for (struct peer *p = &c.from; p; p = p == &c.from ? &c.to : NULL) {
        peer_close(p);
        free(p->in);
        free(p->out);
    }
    free(c.counts);
    free(c.pauses);
    free(c.left);
    if (c.tls_cred) gnutls_certificate_free_credentials(c.tls_cred);
    return !ok ? COPY_EXIT_ERROR : n[ST_RESERVED] ? COPY_EXIT_RESERVED_LEFT : COPY_EXIT_OK;
}

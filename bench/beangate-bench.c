/* beangate-bench.c - a load generator for any beanstalk server (beanstalkd,
 * beangate) and for beangate's HTTP/JSON gateway.
 *
 * One thread, one epoll loop, N non-blocking connections. Every scenario is
 * bounded: by a request count (-n), by a duration (-s), or both, and a run
 * that gets no reply for --timeout seconds fails. Any reply the scenario does
 * not expect is printed and the program exits with status 1; a server that
 * cannot be reached gives status 2.
 *
 * Scenarios (-t, comma-separated):
 *   put                  pipelined put: -c connections, -P requests in flight
 *                        per connection, -d body bytes.
 *   reserve-delete       prefill -n jobs, then pipelined
 *                        `reserve-with-timeout 0`; each RESERVED reply is
 *                        answered with `delete <id>` in the next write.
 *   cycle                unpipelined put -> reserve-with-timeout 0 -> delete
 *                        per connection; latency is the whole cycle.
 *   tubes                reserve-delete twice: one tube (baseline), then -T
 *                        tubes that all hold jobs with consumers watching -W
 *                        of them.
 *   http-put             POST /tubes/T/jobs over keep-alive, one request in
 *                        flight per connection.
 *   http-reserve-delete  prefill -n jobs over beanstalk TCP (-p), then
 *                        POST /tubes/T/reservations?timeout=0 and
 *                        DELETE /jobs/ID?reservation=TOKEN.
 *
 * --redis runs put, reserve-delete and cycle against Redis with the same
 * work per job: LPUSH; LMOVE to a processing list + LREM; LPUSH, BLMOVE, LREM.
 *
 * Latency: for pipelined scenarios, from the write that carried a request to
 * the read that brought its reply (reserve-delete: reserve sent -> DELETED
 * read). Percentiles come from a log-linear histogram (about 1.6% wide
 * buckets).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef BENCH_TLS
#include <gnutls/gnutls.h>
#endif

#define EXIT_UNEXPECTED 1
#define EXIT_CONNECT 2
#define EXIT_USAGE 64

/* ---- options ------------------------------------------------------------ */

struct opts {
    const char *host;
    const char *port;
    const char *http_port;
    int conns;
    int depth;
    int body;
    uint64_t n;        /* requests (0 = not given) */
    double seconds;    /* 0 = not given */
    int tubes;
    int watched;
    int tube_jobs;
    int http_tubes;    /* http-put: requests spread over this many tubes */
    const char *tube;
    const char *scenarios;
    double idle_timeout;
    const char *tls_ca; /* --tls: beanstalk over TLS, the server verified against this CA */
    int csv;
    int quiet;
    int redis;        /* the TCP scenarios in Redis's RESP (LPUSH, LMOVE, LREM) */
    int prefill_only; /* consuming scenarios: only put the jobs */
    int no_prefill;   /* consuming scenarios: the jobs are already there */
};

static struct opts opt = {
    .host = "127.0.0.1",
    .port = "11300",
    .http_port = "11301",
    .conns = 4,
    .depth = 64,
    .body = 100,
    .tubes = 10000,
    .watched = 100,
    .tube_jobs = 1,
    .http_tubes = 1,
    .tube = "bench",
    .scenarios = "put,reserve-delete,cycle",
    .idle_timeout = 10.0,
};

#define DEFAULT_N 100000

/* ---- small helpers ------------------------------------------------------ */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void note(const char *fmt, ...)
{
    if (opt.quiet || opt.csv) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static void die(int status, const char *fmt, ...)
{
    va_list ap;
    fputs("beangate-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

/* Print bytes with non-printables escaped, at most max of them. */
static void print_escaped(FILE *f, const char *p, size_t n, size_t max)
{
    size_t i;
    for (i = 0; i < n && i < max; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\r') fputs("\\r", f);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch == '\\') fputs("\\\\", f);
        else if (ch < 32 || ch > 126) fprintf(f, "\\x%02x", ch);
        else fputc(ch, f);
    }
    if (i < n) fprintf(f, "... (%zu bytes in all)", n);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die(EXIT_UNEXPECTED, "out of memory (%zu bytes)", n);
    return p;
}

static size_t u64_to_dec(char *out, uint64_t v)
{
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

/* Parse a decimal u64 at p (n bytes); -1 if there are no digits. */
static int parse_u64(const char *p, size_t n, uint64_t *out, size_t *used)
{
    uint64_t v = 0;
    size_t i = 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') v = v * 10 + (uint64_t)(p[i++] - '0');
    if (i == 0) return -1;
    *out = v;
    if (used) *used = i;
    return 0;
}

/* ---- byte buffer ---------------------------------------------------------- */

struct buf {
    char *p;
    size_t off, len, cap; /* bytes [off, len) are live */
};

static void buf_reserve(struct buf *b, size_t extra)
{
    if (b->off && b->off == b->len) b->off = b->len = 0;
    if (b->len + extra <= b->cap) return;
    if (b->off) { /* compact first */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + extra <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) die(EXIT_UNEXPECTED, "out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
}

static void buf_append(struct buf *b, const void *data, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_str(struct buf *b, const char *s) { buf_append(b, s, strlen(s)); }

static void buf_u64(struct buf *b, uint64_t v)
{
    buf_reserve(b, 24);
    b->len += u64_to_dec(b->p + b->len, v);
}

static size_t buf_live(const struct buf *b) { return b->len - b->off; }

/* ---- latency histogram ---------------------------------------------------- */

#define H_SUB_BITS 7
#define H_SUB (1u << H_SUB_BITS)
#define H_HALF (H_SUB / 2)
#define H_BUCKETS (H_SUB + (64 - H_SUB_BITS) * H_HALF)

struct hist {
    uint64_t count[H_BUCKETS];
    uint64_t n;
};

static inline unsigned hist_index(uint64_t v)
{
    if (v < H_SUB) return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - (H_SUB_BITS - 1);
    unsigned top = (unsigned)(v >> shift); /* in [H_HALF, H_SUB) */
    return H_SUB + (shift - 1) * H_HALF + (top - H_HALF);
}

static double hist_value(unsigned i) /* middle of bucket i, ns */
{
    if (i < H_SUB) return i;
    unsigned k = i - H_SUB;
    unsigned shift = k / H_HALF + 1;
    double top = (double)(k % H_HALF + H_HALF);
    return top * (double)(1ull << shift) + (double)(1ull << shift) / 2.0;
}

static inline void hist_add(struct hist *h, uint64_t v)
{
    h->count[hist_index(v)]++;
    h->n++;
}

/* Percentile p (0..1) in microseconds; 0 if empty. */
static double hist_pct_us(const struct hist *h, double p)
{
    if (!h->n) return 0;
    uint64_t rank = (uint64_t)(p * (double)h->n + 0.999999);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < H_BUCKETS; i++) {
        seen += h->count[i];
        if (seen >= rank) return hist_value(i) / 1000.0;
    }
    return hist_value(H_BUCKETS - 1) / 1000.0;
}

/* ---- connections and the run ---------------------------------------------- */

struct bench;
struct conn;

struct mode {
    const char *name;
    int http;
    void (*fill)(struct bench *, struct conn *);
    /* beanstalk: one reply (line without \r\n, body or NULL) */
    void (*reply)(struct bench *, struct conn *, const char *line, size_t len, const char *body,
                  size_t blen);
    /* http: one response */
    void (*http_reply)(struct bench *, struct conn *, int status, const char *body, size_t blen,
                       const char *head, size_t hlen);
    int resp; /* Redis: replies are RESP, handed to reply() (line = the type byte and its line) */
};

struct conn {
    struct bench *b;
    int fd;
    int idx;
    struct buf in, out, body;
    uint32_t outstanding; /* requests sent whose replies have not arrived */
    uint64_t *ring;       /* op start times, in request order */
    uint32_t rhead, rtail, rmask;
    int state;
    int done;
    int pollout;
    int cur_tube;   /* prefill: tube in use, -1 = none yet */
    int reconnect;  /* http: the server said Connection: close */
    void *tls;      /* --tls: its gnutls_session_t; NULL: plain */
    int tls_resend; /* the last gnutls_record_send was GNUTLS_E_AGAIN */
    uint64_t t0;
    const char *last_cmd; /* for error messages */
};

struct bench {
    const struct mode *m;
    const char *port;
    int ep;
    struct conn *conns;
    int nconns, active;
    int depth;
    uint64_t limit;    /* ops to start; UINT64_MAX = no count bound */
    uint64_t started;  /* ops started */
    uint64_t completed;
    uint64_t deadline; /* 0 = no time bound */
    int stop, dry;
    uint64_t t_start, t_last, now, last_progress;
    uint64_t timed_out, reconnects;
    struct hist *hist;
    /* put */
    char *put_block;
    size_t put_len; /* one put command */
    /* http-put: put_block holds put_count requests, request i at
     * put_at[i] .. put_at[i + 1] (one per tube, taken in turn) */
    size_t *put_at;
    int put_count;
    /* prefill plan */
    char **tube_names;
    int ntubes;
    uint64_t watched_jobs; /* jobs spread round-robin over the first `watched` tubes */
    int watched;
    int tube_jobs;
    /* --redis: the list the jobs go to, its processing list, and the prebuilt
     * take command (LMOVE or BLMOVE from one to the other) */
    const char *key;
    char *processing;
    char *take_cmd;
    /* http */
    char host_hdr[300];
    const char *http_tube;
};

static const char *conn_peer(struct bench *b)
{
    static char s[320];
    snprintf(s, sizeof s, "%s:%s", opt.host, b->port);
    return s;
}

static void unexpected(struct conn *c, const char *what, const char *p, size_t n)
{
    fprintf(stderr, "beangate-bench: %s: unexpected reply to %s on connection %d (%s): \"",
            c->b->m->name, what ? what : (c->last_cmd ? c->last_cmd : "?"), c->idx, conn_peer(c->b));
    print_escaped(stderr, p, n, 600);
    fputs("\"\n", stderr);
    exit(EXIT_UNEXPECTED);
}

static int tcp_connect(const char *host, const char *port)
{
    struct addrinfo hints, *res, *ai;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) die(EXIT_CONNECT, "cannot resolve %s port %s: %s", host, port, gai_strerror(rc));
    int fd = -1, err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        die(EXIT_CONNECT, "cannot connect to %s:%s: %s (is the server running?)", host, port,
            strerror(err));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* ---- the transport: plain, or TLS with --tls (GnuTLS) -------------------- */

#ifdef BENCH_TLS
static gnutls_certificate_credentials_t tls_cred;

/* A TLS session on c->fd (non-blocking): the handshake, waiting with poll
 * within --timeout; the server's certificate must verify against --tls's CA. */
static void tls_open(struct conn *c)
{
    gnutls_session_t s;
    if (!tls_cred) {
        if (gnutls_certificate_allocate_credentials(&tls_cred) < 0 ||
            gnutls_certificate_set_x509_trust_file(tls_cred, opt.tls_ca, GNUTLS_X509_FMT_PEM) <= 0)
            die(EXIT_USAGE, "--tls %s: no CA certificate could be read", opt.tls_ca);
    }
    if (gnutls_init(&s, GNUTLS_CLIENT | GNUTLS_NONBLOCK) < 0 || gnutls_set_default_priority(s) < 0 ||
        gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, tls_cred) < 0)
        die(EXIT_UNEXPECTED, "gnutls session setup failed");
    gnutls_session_set_verify_cert(s, NULL, 0);
    gnutls_transport_set_int(s, c->fd);
    uint64_t limit = now_ns() + (uint64_t)(opt.idle_timeout * 1e9);
    int r;
    while ((r = gnutls_handshake(s)) < 0) {
        if (gnutls_error_is_fatal(r))
            die(EXIT_CONNECT, "TLS handshake with %s:%s failed: %s", opt.host, c->b->port, gnutls_strerror(r));
        if (now_ns() > limit) die(EXIT_CONNECT, "TLS handshake with %s:%s timed out", opt.host, c->b->port);
        struct pollfd pfd = {c->fd, gnutls_record_get_direction(s) ? POLLOUT : POLLIN, 0};
        poll(&pfd, 1, 100);
    }
    c->tls = s;
}

static void tls_close(struct conn *c)
{
    if (c->tls) gnutls_deinit(c->tls);
    c->tls = NULL;
    c->tls_resend = 0;
}

/* read() and write() over the session: the same results and errno. A send
 * that got GNUTLS_E_AGAIN is finished first (GnuTLS keeps its record; its
 * bytes are still the head of the caller's buffer). */
static ssize_t tls_read(struct conn *c, void *p, size_t n)
{
    ssize_t r = gnutls_record_recv(c->tls, p, n);
    if (r >= 0) return r;
    if (r == GNUTLS_E_PREMATURE_TERMINATION) return 0;
    errno = r == GNUTLS_E_AGAIN ? EAGAIN : r == GNUTLS_E_INTERRUPTED ? EINTR : EPROTO;
    return -1;
}

static ssize_t tls_write(struct conn *c, const void *p, size_t n)
{
    ssize_t r = c->tls_resend ? gnutls_record_send(c->tls, NULL, 0) : gnutls_record_send(c->tls, p, n);
    c->tls_resend = r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED;
    if (r >= 0) return r;
    errno = r == GNUTLS_E_AGAIN ? EAGAIN : r == GNUTLS_E_INTERRUPTED ? EINTR : EPIPE;
    return -1;
}

/* Bytes GnuTLS has decrypted and not handed out: epoll will not report them. */
static int io_pending(struct conn *c) { return c->tls && gnutls_record_check_pending(c->tls) > 0; }
#else
static void tls_open(struct conn *c)
{
    (void)c;
    die(EXIT_USAGE, "--tls: this beangate-bench was built without GnuTLS (libgnutls28-dev)");
}
static void tls_close(struct conn *c) { (void)c; }
static ssize_t tls_read(struct conn *c, void *p, size_t n) { (void)c, (void)p, (void)n; return -1; }
static ssize_t tls_write(struct conn *c, const void *p, size_t n) { (void)c, (void)p, (void)n; return -1; }
static int io_pending(struct conn *c) { (void)c; return 0; }
#endif

static ssize_t io_read(struct conn *c, void *p, size_t n)
{
    return c->tls ? tls_read(c, p, n) : read(c->fd, p, n);
}

static ssize_t io_write(struct conn *c, const void *p, size_t n)
{
    return c->tls ? tls_write(c, p, n) : write(c->fd, p, n);
}

/* Connect c to the beanstalk port (or b->port), over TLS with --tls. */
static void conn_connect(struct bench *b, struct conn *c)
{
    c->fd = tcp_connect(opt.host, b->port);
    if (opt.tls_ca && !b->m->http) tls_open(c);
}

static inline void ring_push(struct conn *c, uint64_t t)
{
    if (c->rhead - c->rtail > c->rmask) die(EXIT_UNEXPECTED, "internal: request ring overflow");
    c->ring[c->rhead++ & c->rmask] = t;
}

static inline uint64_t ring_pop(struct conn *c) { return c->ring[c->rtail++ & c->rmask]; }

static void conn_open(struct bench *b, struct conn *c, int idx)
{
    memset(c, 0, sizeof *c);
    c->b = b;
    c->idx = idx;
    c->cur_tube = -1;
    conn_connect(b, c);
    uint32_t cap = 4;
    while (cap < (uint32_t)b->depth + 4) cap *= 2;
    c->ring = xmalloc(cap * sizeof *c->ring);
    c->rmask = cap - 1;
}

static void conn_free(struct conn *c)
{
    tls_close(c);
    if (c->fd >= 0) close(c->fd);
    free(c->in.p);
    free(c->out.p);
    free(c->body.p);
    free(c->ring);
}

static void ep_set(struct bench *b, struct conn *c, int op, int out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(b->ep, op, c->fd, &ev) != 0) die(EXIT_UNEXPECTED, "epoll_ctl: %s", strerror(errno));
    c->pollout = out;
}

static void conn_flush(struct bench *b, struct conn *c)
{
    while (buf_live(&c->out)) {
        ssize_t n = io_write(c, c->out.p + c->out.off, buf_live(&c->out));
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        die(EXIT_UNEXPECTED, "%s: write to %s failed on connection %d: %s", b->m->name,
            conn_peer(b), c->idx, n < 0 ? strerror(errno) : "wrote nothing");
    }
    if (c->out.off == c->out.len) c->out.off = c->out.len = 0;
    int want = buf_live(&c->out) != 0;
    if (want != c->pollout) ep_set(b, c, EPOLL_CTL_MOD, want);
}

/* Ops this connection may still start. */
static inline uint64_t quota(struct bench *b)
{
    if (b->stop || b->dry) return 0;
    return b->limit - b->started;
}

static void conn_check_done(struct bench *b, struct conn *c)
{
    if (c->done || c->outstanding || buf_live(&c->out)) return;
    c->done = 1;
    b->active--;
    epoll_ctl(b->ep, EPOLL_CTL_DEL, c->fd, NULL);
}

static void http_reconnect(struct bench *b, struct conn *c)
{
    epoll_ctl(b->ep, EPOLL_CTL_DEL, c->fd, NULL);
    tls_close(c);
    close(c->fd);
    conn_connect(b, c);
    c->in.off = c->in.len = 0;
    c->reconnect = 0;
    b->reconnects++;
    ep_set(b, c, EPOLL_CTL_ADD, 0);
}

/* Beanstalk replies with a body: RESERVED <id> <bytes>, FOUND ..., OK <bytes>. */
static int reply_has_body(const char *p, size_t n)
{
    return (n > 9 && memcmp(p, "RESERVED ", 9) == 0) || (n > 6 && memcmp(p, "FOUND ", 6) == 0) ||
           (n > 3 && memcmp(p, "OK ", 3) == 0);
}

static void parse_beanstalk(struct bench *b, struct conn *c)
{
    char *p = c->in.p + c->in.off;
    size_t avail = buf_live(&c->in);
    while (avail) {
        char *nl = memchr(p, '\n', avail);
        if (!nl) {
            if (avail > 8192) unexpected(c, NULL, p, avail);
            break;
        }
        size_t linelen = (size_t)(nl + 1 - p);
        if (linelen < 2 || nl[-1] != '\r') unexpected(c, NULL, p, linelen);
        size_t total = linelen;
        const char *body = NULL;
        size_t blen = 0;
        if (reply_has_body(p, linelen - 2)) {
            const char *sp = memrchr(p, ' ', linelen - 2);
            uint64_t bytes;
            if (!sp || parse_u64(sp + 1, (size_t)(nl - 1 - (sp + 1)), &bytes, NULL))
                unexpected(c, NULL, p, linelen);
            if (avail < linelen + bytes + 2) break;
            body = p + linelen;
            blen = (size_t)bytes;
            if (body[blen] != '\r' || body[blen + 1] != '\n') unexpected(c, NULL, p, linelen + blen + 2);
            total += blen + 2;
        }
        if (!c->outstanding) unexpected(c, "nothing (no request in flight)", p, total);
        c->outstanding--;
        b->m->reply(b, c, p, linelen - 2, body, blen);
        p += total;
        avail -= total;
    }
    c->in.off = (size_t)(p - c->in.p);
}

/* Find the value of header `name` in [h, h+n): pointer and length, or NULL. */
/* RESP replies (--redis): simple strings, integers and bulk strings, each
 * handed to m->reply with its first line (type byte included, no \r\n) and,
 * for a bulk string, its content (NULL for the null bulk string $-1). An
 * error (-ERR ...) or an array is unexpected. */
static void parse_resp(struct bench *b, struct conn *c)
{
    char *p = c->in.p + c->in.off;
    size_t avail = buf_live(&c->in);
    while (avail) {
        char *nl = memchr(p, '\n', avail);
        if (!nl) {
            if (avail > 8192) unexpected(c, NULL, p, avail);
            break;
        }
        size_t linelen = (size_t)(nl + 1 - p);
        if (linelen < 3 || nl[-1] != '\r' || !strchr("+:$", p[0])) unexpected(c, NULL, p, linelen);
        size_t total = linelen;
        const char *body = NULL;
        size_t blen = 0;
        if (p[0] == '$' && !(linelen == 5 && memcmp(p, "$-1", 3) == 0)) {
            uint64_t bytes;
            if (parse_u64(p + 1, linelen - 3, &bytes, NULL)) unexpected(c, NULL, p, linelen);
            if (avail < linelen + bytes + 2) break;
            body = p + linelen;
            blen = (size_t)bytes;
            if (body[blen] != '\r' || body[blen + 1] != '\n') unexpected(c, NULL, p, linelen + blen + 2);
            total += blen + 2;
        }
        if (!c->outstanding) unexpected(c, "nothing (no request in flight)", p, total);
        c->outstanding--;
        b->m->reply(b, c, p, linelen - 2, body, blen);
        p += total;
        avail -= total;
    }
    c->in.off = (size_t)(p - c->in.p);
}

static const char *http_header(const char *h, size_t n, const char *name, size_t *vlen)
{
    size_t nl = strlen(name);
    const char *end = h + n;
    const char *line = memchr(h, '\n', n); /* skip the status line */
    while (line && line + 1 < end) {
        line++;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ')) ve--;
            *vlen = (size_t)(ve - v);
            return v;
        }
        line = eol < end ? eol : NULL;
    }
    return NULL;
}

/* Decode a chunked body starting at p (avail bytes) into out. Returns bytes
 * consumed, 0 if incomplete, or -1 if malformed. */
static long dechunk(const char *p, size_t avail, struct buf *out)
{
    size_t off = 0;
    out->off = out->len = 0;
    for (;;) {
        const char *nl = memchr(p + off, '\n', avail - off);
        if (!nl) return 0;
        char *end;
        unsigned long sz = strtoul(p + off, &end, 16);
        if (end == p + off) return -1;
        off = (size_t)(nl + 1 - p);
        if (sz == 0) { /* trailers until an empty line */
            for (;;) {
                const char *tl = memchr(p + off, '\n', avail - off);
                if (!tl) return 0;
                size_t l = (size_t)(tl + 1 - (p + off));
                off += l;
                if (l <= 2) return (long)off;
            }
        }
        if (avail - off < sz + 2) return 0;
        buf_append(out, p + off, sz);
        off += sz + 2;
    }
}

static void parse_http(struct bench *b, struct conn *c)
{
    for (;;) {
        char *p = c->in.p + c->in.off;
        size_t avail = buf_live(&c->in);
        if (!avail) break;
        char *he = memmem(p, avail, "\r\n\r\n", 4);
        if (!he) {
            if (avail > 65536) unexpected(c, NULL, p, avail);
            break;
        }
        size_t hlen = (size_t)(he + 4 - p);
        if (hlen < 12 || memcmp(p, "HTTP/1.", 7) != 0) unexpected(c, NULL, p, hlen);
        int status = atoi(p + 9);
        size_t vlen;
        const char *v;
        size_t total = hlen;
        const char *body = p + hlen;
        size_t blen = 0;
        if (status == 204 || status == 304 || (status >= 100 && status < 200)) {
            blen = 0;
        } else if ((v = http_header(p, hlen, "Transfer-Encoding", &vlen)) && vlen >= 7 &&
                   strncasecmp(v + vlen - 7, "chunked", 7) == 0) {
            long used = dechunk(p + hlen, avail - hlen, &c->body);
            if (used < 0) unexpected(c, NULL, p, avail);
            if (used == 0) break;
            total += (size_t)used;
            body = c->body.p;
            blen = c->body.len;
        } else if ((v = http_header(p, hlen, "Content-Length", &vlen))) {
            uint64_t cl;
            if (parse_u64(v, vlen, &cl, NULL)) unexpected(c, NULL, p, hlen);
            if (avail - hlen < cl) break;
            blen = (size_t)cl;
            total += blen;
        } else {
            fprintf(stderr, "beangate-bench: response without Content-Length or chunked framing; "
                            "keep-alive needs one\n");
            unexpected(c, NULL, p, hlen);
        }
        if (status >= 100 && status < 200) { /* interim: skip */
            c->in.off += total;
            continue;
        }
        if (!c->outstanding) unexpected(c, "nothing (no request in flight)", p, total);
        if ((v = http_header(p, hlen, "Connection", &vlen)) && vlen == 5 && strncasecmp(v, "close", 5) == 0)
            c->reconnect = 1;
        c->outstanding--;
        b->m->http_reply(b, c, status, body, blen, p, hlen);
        c->in.off += total;
        if (c->reconnect) break;
    }
}

static void conn_read_once(struct bench *b, struct conn *c)
{
    buf_reserve(&c->in, 256 * 1024);
    ssize_t n = io_read(c, c->in.p + c->in.len, c->in.cap - c->in.len);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        die(EXIT_UNEXPECTED, "%s: read from %s failed on connection %d: %s", b->m->name, conn_peer(b),
            c->idx, strerror(errno));
    }
    b->now = now_ns();
    if (n == 0) {
        if (b->m->http && !c->outstanding && !buf_live(&c->in)) { /* idle keep-alive closed */
            http_reconnect(b, c);
            b->m->fill(b, c);
            conn_flush(b, c);
            conn_check_done(b, c);
            return;
        }
        if (buf_live(&c->in)) {
            fprintf(stderr, "beangate-bench: %s: connection %d closed by %s after a partial reply: \"",
                    b->m->name, c->idx, conn_peer(b));
            print_escaped(stderr, c->in.p + c->in.off, buf_live(&c->in), 600);
            fputs("\"\n", stderr);
            exit(EXIT_UNEXPECTED);
        }
        die(EXIT_UNEXPECTED, "%s: connection %d closed by %s with %u request(s) unanswered (last: %s)",
            b->m->name, c->idx, conn_peer(b), c->outstanding, c->last_cmd ? c->last_cmd : "-");
    }
    c->in.len += (size_t)n;
    uint64_t before = b->completed;
    if (b->m->http) parse_http(b, c);
    else if (b->m->resp) parse_resp(b, c);
    else parse_beanstalk(b, c);
    b->last_progress = b->now;
    if (b->completed != before) b->t_last = b->now;
    if (c->reconnect) {
        if (c->outstanding) die(EXIT_UNEXPECTED, "internal: reconnect with requests in flight");
        http_reconnect(b, c);
    }
    b->m->fill(b, c);
    conn_flush(b, c);
    conn_check_done(b, c);
}

/* c is readable: read and handle until nothing is left (over TLS, GnuTLS
 * may hold decrypted bytes that epoll does not report). */
static void conn_readable(struct bench *b, struct conn *c)
{
    do conn_read_once(b, c);
    while (!c->done && io_pending(c));
}

/* Open b->nconns connections; `setup` (if any) runs on each, synchronously. */
static void bench_open(struct bench *b, const struct mode *m, const char *port, int nconns, int depth)
{
    b->m = m;
    b->port = port;
    b->nconns = nconns;
    b->depth = depth;
    b->conns = calloc((size_t)nconns, sizeof *b->conns);
    if (!b->conns) die(EXIT_UNEXPECTED, "out of memory");
    for (int i = 0; i < nconns; i++) conn_open(b, &b->conns[i], i);
    b->ep = epoll_create1(EPOLL_CLOEXEC);
    if (b->ep < 0) die(EXIT_UNEXPECTED, "epoll_create1: %s", strerror(errno));
}

static void bench_close(struct bench *b)
{
    for (int i = 0; i < b->nconns; i++) conn_free(&b->conns[i]);
    free(b->conns);
    close(b->ep);
    b->conns = NULL;
}

/* Send cmds on c and wait (blocking, bounded) for nreplies one-line replies,
 * each starting with one of the '|'-separated words in ok. */
static void sync_cmds(struct bench *b, struct conn *c, const char *cmds, size_t len, int nreplies,
                      const char *ok)
{
    size_t sent = 0;
    int got = 0;
    uint64_t limit = now_ns() + (uint64_t)(opt.idle_timeout * 1e9);
    c->in.off = c->in.len = 0;
    while (got < nreplies) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN | (sent < len ? POLLOUT : 0)};
        int r = io_pending(c) ? 0 : poll(&pfd, 1, 100);
        if (r < 0 && errno != EINTR) die(EXIT_UNEXPECTED, "poll: %s", strerror(errno));
        if (io_pending(c)) r = 1, pfd.revents |= POLLIN;
        if (now_ns() > limit)
            die(EXIT_UNEXPECTED, "%s: no reply from %s to setup commands within %.0f s", b->m->name,
                conn_peer(b), opt.idle_timeout);
        if (r <= 0) continue;
        if ((pfd.revents & POLLOUT) && sent < len) {
            ssize_t n = io_write(c, cmds + sent, len - sent);
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                die(EXIT_UNEXPECTED, "write to %s: %s", conn_peer(b), strerror(errno));
            if (n > 0) sent += (size_t)n;
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            buf_reserve(&c->in, 65536);
            ssize_t n = io_read(c, c->in.p + c->in.len, c->in.cap - c->in.len);
            if (n == 0) die(EXIT_UNEXPECTED, "%s: %s closed the connection during setup", b->m->name, conn_peer(b));
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                die(EXIT_UNEXPECTED, "read from %s: %s", conn_peer(b), strerror(errno));
            if (n > 0) c->in.len += (size_t)n;
            char *p = c->in.p + c->in.off;
            char *nl;
            while ((nl = memchr(p, '\n', (size_t)(c->in.p + c->in.len - p)))) {
                size_t l = (size_t)(nl - p);
                int good = 0;
                for (const char *w = ok; *w;) {
                    const char *e = strchr(w, '|');
                    size_t wl = e ? (size_t)(e - w) : strlen(w);
                    if (l >= wl && memcmp(p, w, wl) == 0) good = 1;
                    w += wl + (e ? 1 : 0);
                }
                if (!good) unexpected(c, "a setup command (use/watch/ignore)", p, l + 1);
                got++;
                p = nl + 1;
            }
            c->in.off = (size_t)(p - c->in.p);
        }
    }
    c->in.off = c->in.len = 0;
}

static void setup_use(struct bench *b, struct conn *c, const char *tube)
{
    char cmd[256];
    int n = snprintf(cmd, sizeof cmd, "use %s\r\n", tube);
    sync_cmds(b, c, cmd, (size_t)n, 1, "USING ");
}

/* Watch tubes[0..n), then ignore default (unless it is one of them). */
static void setup_watch(struct bench *b, struct conn *c, char **tubes, int n)
{
    struct buf cmds = {0};
    for (int i = 0; i < n; i++) {
        buf_str(&cmds, "watch ");
        buf_str(&cmds, tubes[i]);
        buf_str(&cmds, "\r\n");
    }
    buf_str(&cmds, "ignore default\r\n");
    sync_cmds(b, c, cmds.p, cmds.len, n + 1, "WATCHING ");
    free(cmds.p);
}

/* Run the loop until every connection is done. Returns elapsed seconds. */
static double bench_run(struct bench *b, struct hist *h)
{
    b->hist = h;
    b->active = b->nconns;
    b->started = b->completed = 0;
    b->stop = b->dry = 0;
    b->t_start = b->now = b->last_progress = b->t_last = now_ns();
    b->deadline = opt.seconds > 0 ? b->t_start + (uint64_t)(opt.seconds * 1e9) : 0;
    for (int i = 0; i < b->nconns; i++) ep_set(b, &b->conns[i], EPOLL_CTL_ADD, 0);
    for (int i = 0; i < b->nconns; i++) {
        struct conn *c = &b->conns[i];
        b->m->fill(b, c);
        conn_flush(b, c);
        conn_check_done(b, c);
    }
    struct epoll_event evs[128];
    int was_stopped = 0;
    while (b->active > 0) {
        int n = epoll_wait(b->ep, evs, 128, 100);
        if (n < 0 && errno != EINTR) die(EXIT_UNEXPECTED, "epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c->done) continue;
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) conn_readable(b, c);
            else if (evs[i].events & EPOLLOUT) conn_flush(b, c);
        }
        uint64_t t = now_ns();
        if (b->deadline && t >= b->deadline) b->stop = 1;
        if ((b->stop || b->dry) && !was_stopped) {
            was_stopped = 1;
            for (int i = 0; i < b->nconns; i++) conn_check_done(b, &b->conns[i]);
        }
        if (b->active > 0 && (double)(t - b->last_progress) / 1e9 > opt.idle_timeout) {
            uint32_t waiting = 0;
            for (int i = 0; i < b->nconns; i++) waiting += b->conns[i].outstanding;
            die(EXIT_UNEXPECTED, "%s: no reply from %s for %.0f s (%u request(s) in flight, %" PRIu64
                                 " ops done); giving up",
                b->m->name, conn_peer(b), opt.idle_timeout, waiting, b->completed);
        }
    }
    uint64_t end = b->t_last > b->t_start ? b->t_last : now_ns();
    return (double)(end - b->t_start) / 1e9;
}

/* ---- scenario: put ------------------------------------------------------- */

static void put_fill(struct bench *b, struct conn *c)
{
    uint64_t k = (uint64_t)b->depth - c->outstanding, q = quota(b);
    if (k > q) k = q;
    if (!k) return;
    buf_append(&c->out, b->put_block, (size_t)k * b->put_len);
    for (uint64_t i = 0; i < k; i++) ring_push(c, b->now);
    c->outstanding += (uint32_t)k;
    b->started += k;
    c->last_cmd = "put";
}

static void put_reply(struct bench *b, struct conn *c, const char *line, size_t len, const char *body,
                      size_t blen)
{
    uint64_t t0 = ring_pop(c);
    if (len < 10 || memcmp(line, "INSERTED ", 9) != 0) unexpected(c, "put", line, len + 2);
    hist_add(b->hist, b->now - t0);
    b->completed++;
}

static const struct mode mode_put = {"put", 0, put_fill, put_reply, NULL, 0};

/* ---- prefill: pipelined use + put following a plan of tubes ---------------- */

/* Tube of the i-th prefilled job: the first b->watched_jobs go round-robin
 * over the first b->watched tubes, the rest tube_jobs per remaining tube. */
static int plan_tube(struct bench *b, uint64_t i)
{
    if (i < b->watched_jobs) return (int)(i % (uint64_t)b->watched);
    return b->watched + (int)((i - b->watched_jobs) / (uint64_t)b->tube_jobs);
}

static void prefill_fill(struct bench *b, struct conn *c)
{
    const char *put = b->put_block;
    while (c->outstanding + 2 <= (uint32_t)b->depth && quota(b)) {
        int t = plan_tube(b, b->started);
        if (t != c->cur_tube) {
            buf_str(&c->out, "use ");
            buf_str(&c->out, b->tube_names[t]);
            buf_str(&c->out, "\r\n");
            ring_push(c, b->now);
            c->outstanding++;
            c->cur_tube = t;
        }
        buf_append(&c->out, put, b->put_len);
        ring_push(c, b->now);
        c->outstanding++;
        b->started++;
    }
    c->last_cmd = "use/put (prefill)";
}

static void prefill_reply(struct bench *b, struct conn *c, const char *line, size_t len,
                          const char *body, size_t blen)
{
    ring_pop(c);
    if (len > 9 && memcmp(line, "INSERTED ", 9) == 0) {
        b->completed++;
        return;
    }
    if (len > 6 && memcmp(line, "USING ", 6) == 0) return;
    unexpected(c, "use/put (prefill)", line, len + 2);
}

static const struct mode mode_prefill = {"prefill", 0, prefill_fill, prefill_reply, NULL, 0};

static void make_put_block(struct bench *b, int copies)
{
    char head[64];
    int hl = snprintf(head, sizeof head, "put 1024 0 120 %d\r\n", opt.body);
    b->put_len = (size_t)hl + (size_t)opt.body + 2;
    free(b->put_block);
    b->put_block = xmalloc(b->put_len * (size_t)copies);
    for (int i = 0; i < copies; i++) {
        char *p = b->put_block + (size_t)i * b->put_len;
        memcpy(p, head, (size_t)hl);
        memset(p + hl, 'x', (size_t)opt.body);
        memcpy(p + hl + opt.body, "\r\n", 2);
    }
}

static const struct mode mode_redis_prefill; /* below, with the Redis scenarios */

/* Put jobs over 4 pipelined connections following the plan in b (--redis:
 * LPUSH to its first tube's list). */
static void prefill(struct bench *b, uint64_t jobs)
{
    struct bench p = *b;
    p.conns = NULL;
    p.put_block = NULL;
    bench_open(&p, opt.redis ? &mode_redis_prefill : &mode_prefill, opt.port, 4, 128);
    make_put_block(&p, 1);
    p.limit = jobs;
    struct hist *h = calloc(1, sizeof *h);
    double saved = opt.seconds;
    opt.seconds = 0; /* a prefill is bounded by its count only */
    note("  prefill: %" PRIu64 " jobs into %d tube(s)...", jobs, b->ntubes);
    double s = bench_run(&p, h);
    opt.seconds = saved;
    note(" %.2f s (%.0f puts/s)\n", s, s > 0 ? (double)p.completed / s : 0.0);
    if (p.completed != jobs)
        die(EXIT_UNEXPECTED, "prefill: %" PRIu64 " of %" PRIu64 " jobs inserted", p.completed, jobs);
    free(h);
    free(p.put_block);
    bench_close(&p);
}

/* ---- scenario: reserve-delete (pipelined) ---------------------------------- */

static void rd_fill(struct bench *b, struct conn *c)
{
    static const char cmd[] = "reserve-with-timeout 0\r\n";
    uint64_t k = (uint64_t)b->depth - c->outstanding, q = quota(b);
    if (k > q) k = q;
    for (uint64_t i = 0; i < k; i++) {
        buf_append(&c->out, cmd, sizeof cmd - 1);
        ring_push(c, b->now);
    }
    c->outstanding += (uint32_t)k;
    b->started += k;
    if (k) c->last_cmd = "reserve-with-timeout 0";
}

static void rd_reply(struct bench *b, struct conn *c, const char *line, size_t len, const char *body,
                     size_t blen)
{
    uint64_t t0 = ring_pop(c);
    if (body && len > 9 && memcmp(line, "RESERVED ", 9) == 0) {
        uint64_t id;
        if (parse_u64(line + 9, len - 9, &id, NULL)) unexpected(c, "reserve-with-timeout 0", line, len + 2);
        buf_append(&c->out, "delete ", 7);
        buf_u64(&c->out, id);
        buf_append(&c->out, "\r\n", 2);
        ring_push(c, t0); /* the op started with its reserve */
        c->outstanding++;
        c->last_cmd = "delete";
        return;
    }
    if (len == 7 && memcmp(line, "DELETED", 7) == 0) {
        hist_add(b->hist, b->now - t0);
        b->completed++;
        return;
    }
    if (len == 9 && memcmp(line, "TIMED_OUT", 9) == 0) { /* the queue ran dry */
        b->timed_out++;
        b->dry = 1;
        return;
    }
    unexpected(c, "reserve-with-timeout 0 / delete", line, len + 2);
}

static const struct mode mode_rd = {"reserve-delete", 0, rd_fill, rd_reply, NULL, 0};

/* ---- scenario: cycle (unpipelined put -> reserve -> delete) ---------------- */

enum { CY_IDLE, CY_PUT, CY_RESERVE, CY_DELETE };

static void cycle_fill(struct bench *b, struct conn *c)
{
    if (c->state != CY_IDLE || !quota(b)) return;
    buf_append(&c->out, b->put_block, b->put_len);
    c->t0 = b->now;
    c->outstanding = 1;
    c->state = CY_PUT;
    c->last_cmd = "put";
    b->started++;
}

static void cycle_reply(struct bench *b, struct conn *c, const char *line, size_t len,
                        const char *body, size_t blen)
{
    switch (c->state) {
    case CY_PUT:
        if (len < 10 || memcmp(line, "INSERTED ", 9) != 0) unexpected(c, "put", line, len + 2);
        buf_str(&c->out, "reserve-with-timeout 0\r\n");
        c->state = CY_RESERVE;
        c->last_cmd = "reserve-with-timeout 0";
        break;
    case CY_RESERVE: {
        uint64_t id;
        if (!body || len < 10 || memcmp(line, "RESERVED ", 9) != 0 ||
            parse_u64(line + 9, len - 9, &id, NULL))
            unexpected(c, "reserve-with-timeout 0 (a job was just put, so one must be ready)", line,
                       len + 2);
        buf_append(&c->out, "delete ", 7);
        buf_u64(&c->out, id);
        buf_append(&c->out, "\r\n", 2);
        c->state = CY_DELETE;
        c->last_cmd = "delete";
        break;
    }
    case CY_DELETE:
        if (len != 7 || memcmp(line, "DELETED", 7) != 0) unexpected(c, "delete", line, len + 2);
        hist_add(b->hist, b->now - c->t0);
        b->completed++;
        c->state = CY_IDLE;
        return;
    default:
        unexpected(c, "nothing", line, len + 2);
    }
    c->outstanding = 1;
}

static const struct mode mode_cycle = {"cycle", 0, cycle_fill, cycle_reply, NULL, 0};

/* ---- Redis (--redis): put, reserve-delete and cycle over RESP ----------------
 * put: LPUSH KEY BODY. reserve-delete: LMOVE KEY KEY-processing RIGHT LEFT,
 * answered with LREM KEY-processing 1 BODY (the reliable-queue pattern: a
 * taken job stays on the processing list until it is done). cycle: LPUSH,
 * BLMOVE (1 s), LREM, one at a time. A body starts with its serial number, so
 * LREM removes the job it took, as a client that stores job ids would. */

static void resp_arg(struct buf *o, const char *p, size_t n)
{
    buf_str(o, "$");
    buf_u64(o, n);
    buf_append(o, "\r\n", 2);
    buf_append(o, p, n);
    buf_append(o, "\r\n", 2);
}

/* LPUSH key BODY: opt.body bytes, the decimal serial then 'x's. */
static void resp_lpush(struct buf *o, const char *key, uint64_t serial)
{
    buf_str(o, "*3\r\n$5\r\nLPUSH\r\n");
    resp_arg(o, key, strlen(key));
    buf_str(o, "$");
    buf_u64(o, (uint64_t)opt.body);
    buf_append(o, "\r\n", 2);
    buf_reserve(o, (size_t)opt.body + 2 + 24);
    char *body = o->p + o->len;
    memset(body, 'x', (size_t)opt.body);
    char num[24];
    size_t k = u64_to_dec(num, serial);
    memcpy(body, num, k < (size_t)opt.body ? k : (size_t)opt.body);
    memcpy(body + opt.body, "\r\n", 2);
    o->len += (size_t)opt.body + 2;
}

/* LREM processing 1 BODY */
static void resp_lrem(struct bench *b, struct buf *o, const char *body, size_t blen)
{
    buf_str(o, "*4\r\n$4\r\nLREM\r\n");
    resp_arg(o, b->processing, strlen(b->processing));
    buf_str(o, "$1\r\n1\r\n");
    resp_arg(o, body, blen);
}

/* Point b at list key: its processing list and take command (BLMOVE with a
 * 1 s timeout when blocking, else LMOVE). */
static void redis_lists(struct bench *b, const char *key, int blocking)
{
    b->key = key;
    b->processing = xmalloc(strlen(key) + 12);
    sprintf(b->processing, "%s-processing", key);
    struct buf o = {0};
    buf_str(&o, blocking ? "*6\r\n$6\r\nBLMOVE\r\n" : "*5\r\n$5\r\nLMOVE\r\n");
    resp_arg(&o, key, strlen(key));
    resp_arg(&o, b->processing, strlen(b->processing));
    buf_str(&o, "$5\r\nRIGHT\r\n$4\r\nLEFT\r\n");
    if (blocking) buf_str(&o, "$1\r\n1\r\n");
    buf_append(&o, "", 1);
    b->take_cmd = o.p;
}

static void redis_lists_free(struct bench *b)
{
    free(b->processing);
    free(b->take_cmd);
}

static int resp_is_int(const char *line, size_t len) { return len >= 2 && line[0] == ':'; }

/* put: copies LPUSHes of serials 0..copies-1, all the same length. */
static void make_lpush_block(struct bench *b, int copies)
{
    struct buf o = {0};
    for (int i = 0; i < copies; i++) resp_lpush(&o, b->key, (uint64_t)i);
    b->put_block = o.p;
    b->put_len = o.len / (size_t)copies;
}

static void redis_put_reply(struct bench *b, struct conn *c, const char *line, size_t len,
                            const char *body, size_t blen)
{
    uint64_t t0 = ring_pop(c);
    if (!resp_is_int(line, len)) unexpected(c, "LPUSH", line, len + 2);
    hist_add(b->hist, b->now - t0);
    b->completed++;
}

static const struct mode mode_redis_put = {"put", 0, put_fill, redis_put_reply, NULL, 1};

static void redis_prefill_fill(struct bench *b, struct conn *c)
{
    while (c->outstanding < (uint32_t)b->depth && quota(b)) {
        resp_lpush(&c->out, b->tube_names[0], b->started++);
        ring_push(c, b->now);
        c->outstanding++;
    }
    c->last_cmd = "LPUSH (prefill)";
}

static void redis_prefill_reply(struct bench *b, struct conn *c, const char *line, size_t len,
                                const char *body, size_t blen)
{
    ring_pop(c);
    if (!resp_is_int(line, len)) unexpected(c, "LPUSH (prefill)", line, len + 2);
    b->completed++;
}

static const struct mode mode_redis_prefill = {"prefill", 0, redis_prefill_fill, redis_prefill_reply, NULL, 1};

static void redis_rd_fill(struct bench *b, struct conn *c)
{
    uint64_t k = (uint64_t)b->depth - c->outstanding, q = quota(b);
    if (k > q) k = q;
    for (uint64_t i = 0; i < k; i++) {
        buf_str(&c->out, b->take_cmd);
        ring_push(c, b->now);
    }
    c->outstanding += (uint32_t)k;
    b->started += k;
    if (k) c->last_cmd = "LMOVE";
}

static void redis_rd_reply(struct bench *b, struct conn *c, const char *line, size_t len, const char *body,
                           size_t blen)
{
    uint64_t t0 = ring_pop(c);
    if (body) { /* LMOVE brought a job: done with it */
        resp_lrem(b, &c->out, body, blen);
        ring_push(c, t0); /* the op started with its LMOVE */
        c->outstanding++;
        c->last_cmd = "LREM";
        return;
    }
    if (len == 2 && memcmp(line, ":1", 2) == 0) {
        hist_add(b->hist, b->now - t0);
        b->completed++;
        return;
    }
    if (len == 3 && memcmp(line, "$-1", 3) == 0) { /* the list ran dry */
        b->timed_out++;
        b->dry = 1;
        return;
    }
    unexpected(c, "LMOVE / LREM", line, len + 2);
}

static const struct mode mode_redis_rd = {"reserve-delete", 0, redis_rd_fill, redis_rd_reply, NULL, 1};

static void redis_cycle_fill(struct bench *b, struct conn *c)
{
    if (c->state != CY_IDLE || !quota(b)) return;
    resp_lpush(&c->out, b->key, b->started++);
    c->t0 = b->now;
    c->outstanding = 1;
    c->state = CY_PUT;
    c->last_cmd = "LPUSH";
}

static void redis_cycle_reply(struct bench *b, struct conn *c, const char *line, size_t len,
                              const char *body, size_t blen)
{
    switch (c->state) {
    case CY_PUT:
        if (!resp_is_int(line, len)) unexpected(c, "LPUSH", line, len + 2);
        buf_str(&c->out, b->take_cmd);
        c->state = CY_RESERVE;
        c->last_cmd = "BLMOVE";
        break;
    case CY_RESERVE:
        if (!body) unexpected(c, "BLMOVE (a job was just put, so one must be there)", line, len + 2);
        resp_lrem(b, &c->out, body, blen);
        c->state = CY_DELETE;
        c->last_cmd = "LREM";
        break;
    case CY_DELETE:
        if (len != 2 || memcmp(line, ":1", 2) != 0) unexpected(c, "LREM", line, len + 2);
        hist_add(b->hist, b->now - c->t0);
        b->completed++;
        c->state = CY_IDLE;
        return;
    default:
        unexpected(c, "nothing", line, len + 2);
    }
    c->outstanding = 1;
}

static const struct mode mode_redis_cycle = {"cycle", 0, redis_cycle_fill, redis_cycle_reply, NULL, 1};

/* ---- scenario: http-put ------------------------------------------------ */

static void http_put_fill(struct bench *b, struct conn *c)
{
    if (c->outstanding || !quota(b)) return;
    size_t i = (size_t)(b->started % (uint64_t)b->put_count);
    buf_append(&c->out, b->put_block + b->put_at[i], b->put_at[i + 1] - b->put_at[i]);
    ring_push(c, b->now);
    c->outstanding = 1;
    c->last_cmd = "POST /tubes/T/jobs";
    b->started++;
}

static void http_unexpected(struct conn *c, const char *what, const char *head, size_t hlen,
                            const char *body, size_t blen)
{
    fprintf(stderr, "beangate-bench: %s: unexpected response to %s on connection %d (%s):\n",
            c->b->m->name, what, c->idx, conn_peer(c->b));
    print_escaped(stderr, head, hlen, 800);
    print_escaped(stderr, body, blen, 600);
    fputc('\n', stderr);
    exit(EXIT_UNEXPECTED);
}

static void http_put_reply(struct bench *b, struct conn *c, int status, const char *body, size_t blen,
                           const char *head, size_t hlen)
{
    uint64_t t0 = ring_pop(c);
    if (status != 201) http_unexpected(c, "POST .../jobs (expected 201)", head, hlen, body, blen);
    hist_add(b->hist, b->now - t0);
    b->completed++;
}

static const struct mode mode_http_put = {"http-put", 1, http_put_fill, NULL, http_put_reply, 0};

/* ---- scenario: http-reserve-delete -------------------------------------- */

static void http_rd_fill(struct bench *b, struct conn *c)
{
    if (c->outstanding || c->state != CY_IDLE || !quota(b)) return;
    buf_str(&c->out, "POST /tubes/");
    buf_str(&c->out, b->http_tube);
    buf_str(&c->out, "/reservations?timeout=0 HTTP/1.1\r\nHost: ");
    buf_str(&c->out, b->host_hdr);
    buf_str(&c->out, "\r\nContent-Length: 0\r\n\r\n");
    c->t0 = b->now;
    c->outstanding = 1;
    c->state = CY_RESERVE;
    c->last_cmd = "POST /tubes/T/reservations?timeout=0";
    b->started++;
}

/* The value of "key":"..." or "key":123 in a flat JSON object. */
static const char *json_field(const char *body, size_t blen, const char *key, size_t *vlen)
{
    char pat[64];
    int pl = snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = memmem(body, blen, pat, (size_t)pl);
    if (!p) return NULL;
    p += pl;
    const char *end = body + blen;
    while (p < end && *p == ' ') p++;
    if (p < end && *p == '"') {
        const char *q = memchr(p + 1, '"', (size_t)(end - p - 1));
        if (!q) return NULL;
        *vlen = (size_t)(q - p - 1);
        return p + 1;
    }
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9') q++;
    *vlen = (size_t)(q - p);
    return *vlen ? p : NULL;
}

static void http_rd_reply(struct bench *b, struct conn *c, int status, const char *body, size_t blen,
                          const char *head, size_t hlen)
{
    if (c->state == CY_RESERVE) {
        if (status == 204) { /* nothing ready: the queue ran dry */
            b->timed_out++;
            b->dry = 1;
            c->state = CY_IDLE;
            return;
        }
        size_t il, tl;
        const char *id = status == 200 ? json_field(body, blen, "id", &il) : NULL;
        const char *tok = id ? json_field(body, blen, "reservation", &tl) : NULL;
        if (!tok || tl == 0 || tl > 200)
            http_unexpected(c, "POST .../reservations (expected 200 with id and reservation)", head,
                            hlen, body, blen);
        buf_str(&c->out, "DELETE /jobs/");
        buf_append(&c->out, id, il);
        buf_str(&c->out, "?reservation=");
        buf_append(&c->out, tok, tl);
        buf_str(&c->out, " HTTP/1.1\r\nHost: ");
        buf_str(&c->out, b->host_hdr);
        buf_str(&c->out, "\r\n\r\n");
        c->outstanding = 1;
        c->state = CY_DELETE;
        c->last_cmd = "DELETE /jobs/ID?reservation=TOKEN";
        return;
    }
    if (c->state == CY_DELETE) {
        if (status != 204) http_unexpected(c, "DELETE /jobs/ID (expected 204)", head, hlen, body, blen);
        hist_add(b->hist, b->now - c->t0);
        b->completed++;
        c->state = CY_IDLE;
        return;
    }
    http_unexpected(c, "nothing", head, hlen, body, blen);
}

static const struct mode mode_http_rd = {"http-reserve-delete", 1, http_rd_fill, NULL, http_rd_reply, 0};

/* ---- reporting ------------------------------------------------------------ */

static void report(const char *name, uint64_t ops, double secs, const struct hist *h)
{
    double rate = secs > 0 ? (double)ops / secs : 0;
    double p50 = hist_pct_us(h, 0.50), p99 = hist_pct_us(h, 0.99), p999 = hist_pct_us(h, 0.999);
    if (opt.csv || opt.quiet) {
        printf("%s,%" PRIu64 ",%.4f,%.0f,%.1f,%.1f,%.1f\n", name, ops, secs, rate, p50, p99, p999);
    } else {
        printf("%-22s %10" PRIu64 " ops in %8.3f s  %12.0f ops/s   latency us: p50 %.1f  p99 %.1f  p999 %.1f\n",
               name, ops, secs, rate, p50, p99, p999);
    }
    fflush(stdout);
}

static uint64_t count_bound(void)
{
    if (opt.n) return opt.n;
    return opt.seconds > 0 ? UINT64_MAX : DEFAULT_N;
}

/* Jobs to prefill for a consuming scenario: -n, or the default. */
static uint64_t prefill_count(void) { return opt.n ? opt.n : DEFAULT_N; }

static char *tube_name(const char *suffix)
{
    char *s = xmalloc(strlen(opt.tube) + strlen(suffix) + 2);
    sprintf(s, "%s%s", opt.tube, suffix);
    return s;
}

static void warn_short(const char *name, struct bench *b, uint64_t wanted)
{
    if (b->timed_out)
        fprintf(stderr, "beangate-bench: %s: the queue ran dry (%" PRIu64
                        " empty reserve replies); %" PRIu64 " of %" PRIu64 " ops done\n",
                name, b->timed_out, b->completed, wanted);
}

/* Run b to its end and print its report under name, after the warnings that
 * apply: the queue ran dry before b->limit ops, the server closed keep-alive connections. */
static void run_and_report(struct bench *b, const char *name)
{
    struct hist *h = calloc(1, sizeof *h);
    double s = bench_run(b, h);
    warn_short(name, b, b->limit);
    if (b->reconnects)
        note("  %s: the server closed keep-alive connections %" PRIu64 " times\n", name, b->reconnects);
    report(name, b->completed, s, h);
    free(h);
}

/* The plan of one tube, *tube (its tube_names points at tube), watched and
 * holding jobs jobs. */
static struct bench one_tube_plan(char **tube, uint64_t jobs)
{
    struct bench plan = {0};
    plan.tube_names = tube;
    plan.ntubes = 1;
    plan.watched = 1;
    plan.tube_jobs = 1;
    plan.watched_jobs = jobs;
    return plan;
}

static void run_put(void)
{
    struct bench b = {0};
    bench_open(&b, opt.redis ? &mode_redis_put : &mode_put, opt.port, opt.conns, opt.depth);
    if (opt.redis) {
        redis_lists(&b, opt.tube, 0);
        make_lpush_block(&b, opt.depth);
    } else {
        for (int i = 0; i < b.nconns; i++) setup_use(&b, &b.conns[i], opt.tube);
        make_put_block(&b, opt.depth);
    }
    b.limit = count_bound();
    run_and_report(&b, "put");
    free(b.put_block);
    redis_lists_free(&b);
    bench_close(&b);
}

/* Prefill per the plan in `plan`, then reserve+delete with consumers that
 * watch tubes[0..watch). */
static void run_consume(const char *name, struct bench *plan, uint64_t jobs, int watch, int conns)
{
    if (!opt.no_prefill) prefill(plan, jobs);
    if (opt.prefill_only) return;
    struct bench b = {0};
    bench_open(&b, opt.redis ? &mode_redis_rd : &mode_rd, opt.port, conns, opt.depth);
    if (opt.redis) redis_lists(&b, plan->tube_names[0], 0);
    else
        for (int i = 0; i < b.nconns; i++) setup_watch(&b, &b.conns[i], plan->tube_names, watch);
    b.limit = plan->watched_jobs;
    run_and_report(&b, name);
    redis_lists_free(&b);
    bench_close(&b);
}

static void run_reserve_delete(void)
{
    char *t = tube_name("");
    struct bench plan = one_tube_plan(&t, prefill_count());
    run_consume("reserve-delete", &plan, plan.watched_jobs, 1, opt.conns);
    free(t);
}

static void run_cycle(void)
{
    struct bench b = {0};
    bench_open(&b, opt.redis ? &mode_redis_cycle : &mode_cycle, opt.port, opt.conns, 1);
    char *t = tube_name("-cycle");
    if (opt.redis) redis_lists(&b, t, 1);
    else
        for (int i = 0; i < b.nconns; i++) {
            setup_use(&b, &b.conns[i], t);
            setup_watch(&b, &b.conns[i], &t, 1);
        }
    make_put_block(&b, 1);
    b.limit = count_bound();
    run_and_report(&b, "cycle");
    redis_lists_free(&b);
    free(t);
    free(b.put_block);
    bench_close(&b);
}

static void run_tubes(void)
{
    if (opt.watched < 1 || opt.tubes < opt.watched)
        die(EXIT_USAGE, "tubes: need 1 <= -W (%d) <= -T (%d)", opt.watched, opt.tubes);
    uint64_t jobs = prefill_count();
    char label[64];

    /* baseline: one tube holding the jobs, consumers watching it */
    char *one = tube_name("-one");
    struct bench plan = one_tube_plan(&one, jobs);
    run_consume("tubes-T1-W1", &plan, jobs, 1, opt.conns);
    free(one);

    /* T tubes, the watched W hold the consumed jobs round-robin, every other
     * tube holds --tube-jobs jobs that stay */
    struct bench many = {0};
    many.ntubes = opt.tubes;
    many.tube_names = xmalloc(sizeof(char *) * (size_t)opt.tubes);
    for (int i = 0; i < opt.tubes; i++) {
        char sfx[32];
        snprintf(sfx, sizeof sfx, "-t%05d", i);
        many.tube_names[i] = tube_name(sfx);
    }
    many.watched = opt.watched;
    many.tube_jobs = opt.tube_jobs;
    many.watched_jobs = (jobs + (uint64_t)opt.watched - 1) / (uint64_t)opt.watched * (uint64_t)opt.watched;
    uint64_t total = many.watched_jobs + (uint64_t)(opt.tubes - opt.watched) * (uint64_t)opt.tube_jobs;
    snprintf(label, sizeof label, "tubes-T%d-W%d", opt.tubes, opt.watched);
    run_consume(label, &many, total, opt.watched, opt.conns);
    for (int i = 0; i < opt.tubes; i++) free(many.tube_names[i]);
    free(many.tube_names);
}

static void http_setup(struct bench *b)
{
    if (strchr(opt.host, ':')) snprintf(b->host_hdr, sizeof b->host_hdr, "[%s]:%s", opt.host, opt.http_port);
    else snprintf(b->host_hdr, sizeof b->host_hdr, "%s:%s", opt.host, opt.http_port);
}

static void run_http_put(void)
{
    struct bench b = {0};
    bench_open(&b, &mode_http_put, opt.http_port, opt.conns, 1);
    http_setup(&b);
    char *t = tube_name("-http");
    struct buf req = {0};
    /* one request per tube: "bench-http" alone, or bench-http-0, -1, ...
     * (through a proxy in front of shards, they spread over the shards) */
    b.put_count = opt.http_tubes;
    b.put_at = xmalloc(sizeof *b.put_at * ((size_t)b.put_count + 1));
    for (int i = 0; i < b.put_count; i++) {
        b.put_at[i] = req.len;
        buf_str(&req, "POST /tubes/");
        buf_str(&req, t);
        if (b.put_count > 1) {
            buf_str(&req, "-");
            buf_u64(&req, (uint64_t)i);
        }
        buf_str(&req, "/jobs HTTP/1.1\r\nHost: ");
        buf_str(&req, b.host_hdr);
        buf_str(&req, "\r\nContent-Type: application/octet-stream\r\nContent-Length: ");
        buf_u64(&req, (uint64_t)opt.body);
        buf_str(&req, "\r\n\r\n");
        buf_reserve(&req, (size_t)opt.body);
        memset(req.p + req.len, 'x', (size_t)opt.body);
        req.len += (size_t)opt.body;
    }
    b.put_at[b.put_count] = req.len;
    b.put_block = req.p;
    b.put_len = req.len;
    b.limit = count_bound();
    run_and_report(&b, "http-put");
    free(t);
    free(req.p);
    free(b.put_at);
    bench_close(&b);
}

static void run_http_reserve_delete(void)
{
    char *t = tube_name("-httprd");
    struct bench plan = one_tube_plan(&t, prefill_count());
    if (!opt.no_prefill) {
        note("  http-reserve-delete prefills over beanstalk TCP at %s:%s\n", opt.host, opt.port);
        prefill(&plan, plan.watched_jobs);
    }
    if (opt.prefill_only) {
        free(t);
        return;
    }
    struct bench b = {0};
    bench_open(&b, &mode_http_rd, opt.http_port, opt.conns, 1);
    http_setup(&b);
    b.http_tube = t;
    b.limit = plan.watched_jobs;
    run_and_report(&b, "http-reserve-delete");
    free(t);
    bench_close(&b);
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
"Usage: beangate-bench [OPTIONS]\n"
"Load generator for beanstalk servers (beanstalkd, beangate) and beangate's HTTP gateway.\n"
"\n"
" -h HOST          server host (default 127.0.0.1)\n"
" -p PORT          beanstalk TCP port (default 11300)\n"
" --http-port PORT HTTP port for the http-* scenarios (default 11301)\n"
" -c N             connections (default 4)\n"
" -P N             pipeline depth: requests in flight per connection (default 64)\n"
" -d N             job body bytes (default 100)\n"
" -n N             requests per scenario; for reserve-delete, tubes and\n"
"                  http-reserve-delete, the jobs prefilled and consumed (default %d)\n"
" -s SECONDS       stop starting requests after SECONDS (with -n: whichever first)\n"
" -T N             tubes scenario: tubes holding jobs (default 10000)\n"
" -W N             tubes scenario: tubes the consumers watch (default 100)\n"
" --tube-jobs N    tubes scenario: jobs left in every unwatched tube (default 1)\n"
" --tube NAME      tube name prefix (default bench)\n"
" --tls CA_FILE    beanstalk over TLS (-p is then a TLS port, e.g. beangate's\n"
"                  --tls-port); the server's certificate must verify against\n"
"                  CA_FILE. Needs a build with GnuTLS\n"
" --redis          put, reserve-delete and cycle against a Redis server (-p its\n"
"                  port): LPUSH; LMOVE to NAME-processing + LREM; LPUSH, BLMOVE,\n"
"                  LREM (the list NAME, bodies starting with a serial number)\n"
" --http-tubes N   http-put: spread the puts over N tubes NAME-http-0 .. N-1 in turn\n"
"                  (default 1: the one tube NAME-http); through a proxy in front of\n"
"                  shards (docs/scaling.md) they spread over the shards\n"
" -t LIST          scenarios, comma-separated (default put,reserve-delete,cycle):\n"
"                  put reserve-delete cycle tubes http-put http-reserve-delete all\n"
" --timeout S      fail when no reply comes for S seconds (default 10)\n"
" --prefill-only   consuming scenarios: put their jobs, measure nothing\n"
" --no-prefill     consuming scenarios: consume jobs a --prefill-only run put\n"
"                  (same -n, -T, -W, --tube-jobs, --tube); for profiling\n"
" --csv            one CSV line per scenario: name,ops,seconds,ops_per_s,p50_us,p99_us,p999_us\n"
" -q, --quiet      the CSV lines only, no progress notes\n"
" --help           this help\n"
"\n"
"Exit status: 0 ok, 1 unexpected reply or lost connection, 2 cannot connect, 64 usage.\n"
"Jobs put by put, cycle's leftovers (none) and the unwatched tubes of `tubes` stay\n"
"in the server.\n",
            DEFAULT_N);
}

static long num_arg(const char *name, const char *s, long min, long max)
{
    char *end;
    double v = strtod(s, &end); /* accepts 1e6 */
    if (end == s || *end || v < (double)min || v > (double)max || v != (double)(long)v)
        die(EXIT_USAGE, "%s must be an integer in [%ld, %ld], got '%s'", name, min, max, s);
    return (long)v;
}

int main(int argc, char **argv)
{
    enum { O_HTTP_PORT = 1000, O_CSV, O_TUBE, O_TUBE_JOBS, O_TIMEOUT, O_HELP, O_PREFILL_ONLY, O_NO_PREFILL, O_TLS,
           O_HTTP_TUBES, O_REDIS };
    static const struct option longs[] = {
        {"http-port", required_argument, 0, O_HTTP_PORT},
        {"csv", no_argument, 0, O_CSV},
        {"quiet", no_argument, 0, 'q'},
        {"tube", required_argument, 0, O_TUBE},
        {"tube-jobs", required_argument, 0, O_TUBE_JOBS},
        {"http-tubes", required_argument, 0, O_HTTP_TUBES},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"help", no_argument, 0, O_HELP},
        {"prefill-only", no_argument, 0, O_PREFILL_ONLY},
        {"tls", required_argument, 0, O_TLS},
        {"no-prefill", no_argument, 0, O_NO_PREFILL},
        {"redis", no_argument, 0, O_REDIS},
        {0, 0, 0, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "h:p:c:P:d:n:s:T:W:t:q", longs, NULL)) != -1) {
        switch (ch) {
        case 'h': opt.host = optarg; break;
        case 'p': opt.port = optarg; break;
        case O_HTTP_PORT: opt.http_port = optarg; break;
        case 'c': opt.conns = (int)num_arg("-c", optarg, 1, 10000); break;
        case 'P': opt.depth = (int)num_arg("-P", optarg, 1, 100000); break;
        case 'd': opt.body = (int)num_arg("-d", optarg, 0, 1 << 30); break;
        case 'n': opt.n = (uint64_t)num_arg("-n", optarg, 1, 1L << 50); break;
        case 's': {
            char *end;
            opt.seconds = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.seconds > 0) || opt.seconds > 86400)
                die(EXIT_USAGE, "-s must be seconds in (0, 86400], got '%s'", optarg);
            break;
        }
        case 'T': opt.tubes = (int)num_arg("-T", optarg, 1, 10000000); break;
        case 'W': opt.watched = (int)num_arg("-W", optarg, 1, 10000000); break;
        case 't': opt.scenarios = optarg; break;
        case 'q': opt.quiet = 1; break;
        case O_CSV: opt.csv = 1; break;
        case O_TUBE:
            opt.tube = optarg;
            if (!*optarg || strlen(optarg) > 180) die(EXIT_USAGE, "--tube must be 1-180 bytes");
            break;
        case O_TUBE_JOBS: opt.tube_jobs = (int)num_arg("--tube-jobs", optarg, 1, 1000000); break;
        case O_HTTP_TUBES: opt.http_tubes = (int)num_arg("--http-tubes", optarg, 1, 100000); break;
        case O_TIMEOUT: {
            char *end;
            opt.idle_timeout = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.idle_timeout > 0))
                die(EXIT_USAGE, "--timeout must be positive seconds");
            break;
        }
        case O_HELP: usage(stdout); return 0;
        case O_PREFILL_ONLY: opt.prefill_only = 1; break;
        case O_TLS: opt.tls_ca = optarg; break;
        case O_NO_PREFILL: opt.no_prefill = 1; break;
        case O_REDIS: opt.redis = 1; break;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (opt.redis && opt.tls_ca) die(EXIT_USAGE, "--redis and --tls exclude each other");
    if (opt.prefill_only && opt.no_prefill) die(EXIT_USAGE, "--prefill-only and --no-prefill exclude each other");
    if (optind < argc) {
        usage(stderr);
        die(EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    }
    signal(SIGPIPE, SIG_IGN);

    /* validate the whole list before running anything */
    static const char *const known[] = {"put", "reserve-delete", "cycle", "tubes", "http-put",
                                        "http-reserve-delete"};
    const int nknown = (int)(sizeof known / sizeof known[0]);
    char *list = strdup(opt.scenarios);
    const char *todo[16];
    int ntodo = 0;
    for (char *save = NULL, *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        if (strcmp(s, "all") == 0) {
            for (int i = 0; i < nknown && ntodo < 16; i++) todo[ntodo++] = known[i];
            continue;
        }
        int ok = 0;
        for (int i = 0; i < nknown; i++)
            if (strcmp(s, known[i]) == 0) ok = 1;
        if (!ok) die(EXIT_USAGE, "unknown scenario '%s' (known: put reserve-delete cycle tubes http-put http-reserve-delete all)", s);
        if (opt.redis && strcmp(s, "put") && strcmp(s, "reserve-delete") && strcmp(s, "cycle"))
            die(EXIT_USAGE, "--redis: scenario '%s' has no Redis form (put, reserve-delete and cycle have)", s);
        if (ntodo < 16) todo[ntodo++] = s;
    }
    if (!ntodo) die(EXIT_USAGE, "no scenario given");

    if (!opt.quiet && !opt.csv) {
        printf("beangate-bench: %s:%s (http %s), -c %d -P %d -d %d, ", opt.host, opt.port,
               opt.http_port, opt.conns, opt.depth, opt.body);
        if (opt.n) printf("-n %" PRIu64 " ", opt.n);
        if (opt.seconds > 0) printf("-s %g ", opt.seconds);
        if (!opt.n && !(opt.seconds > 0)) printf("-n %d (default) ", DEFAULT_N);
        printf("\n");
    }
    for (int i = 0; i < ntodo; i++) {
        const char *s = todo[i];
        if (strcmp(s, "put") == 0) run_put();
        else if (strcmp(s, "reserve-delete") == 0) run_reserve_delete();
        else if (strcmp(s, "cycle") == 0) run_cycle();
        else if (strcmp(s, "tubes") == 0) run_tubes();
        else if (strcmp(s, "http-put") == 0) run_http_put();
        else if (strcmp(s, "http-reserve-delete") == 0) run_http_reserve_delete();
    }
    free(list);
    return 0;
}

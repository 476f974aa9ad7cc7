/* push.c - push delivery: each subscription reserves jobs from its tube and
 * POSTs them to its URL, http:// or https://, with libcurl (push.h).
 *
 * Per subscription there are two bare engine clients. The reserver watches
 * the tube and reserves while fewer than `concurrency` deliveries are in
 * flight and the rate limit allows; when nothing is ready it waits (no
 * timeout), so a put, a release coming due, a kick or the end of a pause
 * hands it the next job through the engine's job_reserved op. Each job it
 * gets moves at once to the holder, which never waits and owns every job in
 * flight: the reserver itself holds no reservation, so its reserves never
 * answer DEADLINE_SOON. (The gateway's long-polls and holder work the same
 * way.)
 *
 * The HTTP client is libcurl's multi interface on our libevent loop: curl
 * tells which sockets to watch (on_curl_socket) and when to call it back
 * (on_curl_timer); we hand it the events with curl_multi_socket_action.
 * One easy handle per slot, kept between attempts, so its connection (and
 * TLS session) is reused. libcurl rather than libevent's evhttp because
 * evhttp has no TLS without libevent_openssl and a hand-made verification
 * of the receiver's certificate and name; libcurl does both (GnuTLS, the
 * project's TLS library), for http and https alike: one client.
 *
 * An attempt's curl callbacks only record what happened; a finished
 * transfer queues the delivery on the done list, and kick_ev then deletes,
 * releases or buries the job and reserves more. So the engine is never
 * called from inside a curl callback, nor from inside the engine's op. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/util.h>
#include <nettle/hmac.h>

#include "push.h"
#include "../io/eventlog.h"

#define USAGE_EXIT 5
#define HEADERS_MAX 16384          /* bytes of a response's head */

/* Histogram bounds in seconds. */
static const double attempt_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                    0.5, 1, 2.5, 5, 10, 30, 60, 300};
static const char *const attempt_text[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
                                           "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30",
                                           "60", "300"};
static const double delivery_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                     2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400};
static const char *const delivery_text[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
                                            "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30",
                                            "60", "300", "900", "3600", "21600", "86400"};
#define ATTEMPT_BUCKETS (sizeof attempt_le / sizeof attempt_le[0])
#define DELIVERY_BUCKETS (sizeof delivery_le / sizeof delivery_le[0])

struct hist {
    uint64_t in_bucket[DELIVERY_BUCKETS]; /* not cumulative; the larger of the two sizes */
    uint64_t count;
    double sum;
};

struct sub;

#define PUSH_DETAIL_MAX 280         /* bytes of a failure's words ("tls: ...") */

/* One slot of a subscription: one connection, one attempt at a time. */
struct delivery {
    struct sub *sub;
    CURL *easy;                     /* kept between attempts: its connection is reused */
    struct curl_slist *headers;     /* the attempt's request headers */
    int in_multi;                   /* the attempt's transfer runs */
    int busy;                       /* a job is taken (in flight or done, not yet finished) */
    int done;                       /* on the done list */
    size_t head_bytes, body_bytes;  /* of the response so far */
    int head_too_big;
    char curl_error[CURL_ERROR_SIZE];
    char detail[PUSH_DETAIL_MAX];   /* a failure below HTTP in words; "" otherwise */
    uint64_t job_id;
    uint32_t reserves;              /* the job's reserves when taken: the attempt number */
    bg_time started;
    unsigned status;                /* 0: no response head */
    enum bg_push_failure failure;
    int has_retry_after;
    char retry_after[64];
    struct delivery *next_done;
    struct wal_hold hold;           /* the job waits for its put to be kept */
};

struct sub {
    struct push *push;
    uint32_t index;
    struct bg_push_spec spec;
    int signed_;
    struct hmac_sha256_ctx hmac;    /* keyed once; copied for each attempt */
    char target[BG_PUSH_URL_MAX + 300]; /* the URL curl is given, built from the parsed parts */
    struct bg_client reserver, holder;
    int clients_up;
    int waiting;                    /* the reserver waits in the engine */
    uint32_t in_flight;
    struct delivery *slots;
    struct bg_rate rate;
    struct event *rate_ev;          /* pump again when the rate allows, or after an error */
    /* figures */
    uint64_t attempts, delivered, lost;
    uint64_t retried[BG_PUSH_REASON_COUNT], buried[BG_PUSH_REASON_COUNT];
    struct hist attempt_hist, delivery_hist;
    struct bg_push_failure_rec last; /* job_id 0: no failure yet */
    char last_detail[PUSH_DETAIL_MAX]; /* last's words, when it failed below HTTP */
};

struct push {
    struct event_base *base;
    struct bg_engine *engine;
    struct wal *wal;                /* deliveries wait for it; NULL: none */
    bg_time (*now)(void);
    void (*changed)(void *);
    void *changed_arg;
    CURLM *multi;                   /* every slot's transfers */
    struct event *curl_timer;       /* when curl wants to be called back */
    int curl_up;                    /* curl_global_init was called */
    struct sub *subs;
    size_t count;
    struct bg_push_failures failures;
    struct event *kick_ev;          /* finish done deliveries, reserve more */
    struct delivery *done_head, *done_tail;
    uint64_t rng;
    int stopping;
    uint32_t grace_s;
    struct event *grace_ev;
    void (*stopped)(void *);
    void *stopped_arg;
};

/* ---- setup ------------------------------------------------------------- */

/* Report a bad subscription: origin, line (0: none) and why. */
static int setup_error(const char *origin, unsigned line, const char *spec, const char *why)
{
    if (line)
        log_event(BG_LOG_ERROR, "bad_push", "origin=%s line=%u spec=%s msg=%s", log_str(origin), line,
                  log_str(spec), log_str(why));
    else
        log_event(BG_LOG_ERROR, "bad_push", "origin=%s spec=%s msg=%s", log_str(origin), log_str(spec),
                  log_str(why));
    return USAGE_EXIT;
}

/* Read a secret file: its bytes without trailing CR/LF. 0, or an error
 * line and the usage exit status. */
static int read_secret(const char *path, const char *origin, unsigned line, const char *spec,
                       unsigned char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char why[1200];
    if (fd < 0) {
        snprintf(why, sizeof why, "secret-file %s: %s", path, strerror(errno));
        return setup_error(origin, line, spec, why);
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & S_IROTH))
        log_event(BG_LOG_WARN, "push_secret_readable", "path=%s msg=\"readable by every user\"",
                  log_str(path));
    unsigned char *buf = malloc(PUSH_SECRET_MAX + 1);
    size_t n = 0;
    ssize_t r;
    while (buf && n <= PUSH_SECRET_MAX && (r = read(fd, buf + n, PUSH_SECRET_MAX + 1 - n)) > 0) n += (size_t)r;
    close(fd);
    const char *bad = !buf ? "out of memory" : n > PUSH_SECRET_MAX ? "is longer than 4096 bytes" : NULL;
    while (!bad && n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    if (!bad && n == 0) bad = "is empty";
    if (bad) {
        free(buf);
        snprintf(why, sizeof why, "secret-file %s %s", path, bad);
        return setup_error(origin, line, spec, why);
    }
    if (n < 16)
        log_event(BG_LOG_WARN, "weak_push_secret", "path=%s length=%zu msg=\"shorter than 16 bytes\"",
                  log_str(path), n);
    *out = buf;
    *len = n;
    return 0;
}

/* Check a PEM file an https subscription names (key= says which): it must
 * be readable and hold a PEM block. 0, or an error line and the usage exit
 * status: at start, not at the first delivery. */
static int check_pem_file(const char *path, const char *key, const char *origin, unsigned line,
                          const char *spec)
{
    char why[1200], head[65536];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, sizeof why, "%s %s: %s", key, path, strerror(errno));
        return setup_error(origin, line, spec, why);
    }
    struct stat st;
    if (strcmp(key, "key-file") == 0 && fstat(fd, &st) == 0 && (st.st_mode & S_IROTH))
        log_event(BG_LOG_WARN, "push_key_readable", "path=%s msg=\"readable by every user\"", log_str(path));
    ssize_t n = read(fd, head, sizeof head - 1);
    close(fd);
    head[n > 0 ? n : 0] = '\0';
    if (n < 0 || !strstr(head, "-----BEGIN ")) {
        snprintf(why, sizeof why, "%s %s: %s", key, path, n < 0 ? strerror(errno) : "not a PEM file");
        return setup_error(origin, line, spec, why);
    }
    return 0;
}

/* Check what an https subscription needs: a libcurl that speaks TLS, and
 * its files. 0 or the usage exit status. */
static int check_tls(const struct bg_push_spec *s, const char *origin, unsigned line, const char *spec)
{
    if (!s->tls) return 0;
    if (!(curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_SSL))
        return setup_error(origin, line, spec, "https:// needs a libcurl built with TLS");
    if (s->ca_file[0] && check_pem_file(s->ca_file, "ca-file", origin, line, spec)) return USAGE_EXIT;
    if (s->cert_file[0] && check_pem_file(s->cert_file, "cert-file", origin, line, spec)) return USAGE_EXIT;
    if (s->key_file[0] && check_pem_file(s->key_file, "key-file", origin, line, spec)) return USAGE_EXIT;
    return 0;
}

/* Add every subscription of text to out. 0 or the usage exit status. */
static int setup_add_text(struct push_setup *out, const char *text, const char *origin)
{
    size_t pos = 0, len = strlen(text);
    unsigned line = 1;
    static char spec[BG_PUSH_URL_MAX + 4096];
    char why[300];
    for (;;) {
        int rc = bg_push_list_next(text, len, &pos, spec, sizeof spec, &line);
        if (rc == 0) return 0;
        if (rc < 0) return setup_error(origin, line, "-", "a subscription longer than 6 KiB");
        if (out->count == BG_PUSH_SUBSCRIPTIONS_MAX)
            return setup_error(origin, line, spec, "more than 64 subscriptions");
        struct bg_push_spec *s = &out->specs[out->count];
        if (bg_push_spec_parse(spec, s, why, sizeof why) != 0) return setup_error(origin, line, spec, why);
        for (size_t i = 0; i < out->count; i++)
            if (strcmp(out->specs[i].tube, s->tube) == 0)
                return setup_error(origin, line, spec, "a second subscription for this tube (one per tube)");
        if (check_tls(s, origin, line, spec)) return USAGE_EXIT;
        out->secrets[out->count] = NULL;
        out->secret_lens[out->count] = 0;
        if (s->secret_file[0] &&
            read_secret(s->secret_file, origin, line, spec, &out->secrets[out->count],
                        &out->secret_lens[out->count]) != 0)
            return USAGE_EXIT;
        out->count++;
    }
}

/* The whole of a file as a string (NUL-terminated); NULL after an error line. */
static char *read_text_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        log_event(BG_LOG_ERROR, "bad_push", "origin=%s msg=%s", log_str(path), log_str(strerror(errno)));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *text = malloc(cap);
    size_t r;
    while (text && (r = fread(text + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *grown = cap < (1u << 20) ? realloc(text, cap * 2) : NULL;
            if (!grown) {
                free(text);
                text = NULL;
                break;
            }
            text = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (!text) {
        log_event(BG_LOG_ERROR, "bad_push", "origin=%s msg=\"larger than 1 MiB or out of memory\"",
                  log_str(path));
        return NULL;
    }
    text[n] = '\0';
    if (memchr(text, '\0', n)) {
        free(text);
        log_event(BG_LOG_ERROR, "bad_push", "origin=%s msg=\"the file has a NUL byte\"", log_str(path));
        return NULL;
    }
    return text;
}

int push_setup_load(struct push_setup *out, const struct push_source *sources, size_t n,
                    const char *file, uint32_t grace_s)
{
    memset(out, 0, sizeof *out);
    out->grace_s = grace_s;
    out->specs = calloc(BG_PUSH_SUBSCRIPTIONS_MAX, sizeof *out->specs);
    out->secrets = calloc(BG_PUSH_SUBSCRIPTIONS_MAX, sizeof *out->secrets);
    out->secret_lens = calloc(BG_PUSH_SUBSCRIPTIONS_MAX, sizeof *out->secret_lens);
    if (!out->specs || !out->secrets || !out->secret_lens) {
        log_event(BG_LOG_ERROR, "out_of_memory", "at=push_setup");
        return USAGE_EXIT;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = setup_add_text(out, sources[i].text, sources[i].origin);
        if (rc) return rc;
    }
    if (file) {
        char *text = read_text_file(file);
        if (!text) return USAGE_EXIT;
        int rc = setup_add_text(out, text, file);
        free(text);
        if (rc) return rc;
    }
    return 0;
}

void push_setup_free(struct push_setup *s)
{
    if (s->secrets)
        for (size_t i = 0; i < s->count; i++) {
            if (s->secrets[i]) explicit_bzero(s->secrets[i], s->secret_lens[i]);
            free(s->secrets[i]);
        }
    free(s->specs);
    free(s->secrets);
    free(s->secret_lens);
    memset(s, 0, sizeof *s);
}

/* ---- small helpers ------------------------------------------------------- */

static uint64_t next_random(struct push *p)
{
    /* xorshift64*: jitter only, not secrets */
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 0x2545F4914F6CDD1Dull;
}

static int64_t wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

static struct timeval tv_of(bg_time ns)
{
    struct timeval tv = {(time_t)(ns / BG_SECOND), (suseconds_t)(ns % BG_SECOND / 1000)};
    if (ns && !tv.tv_sec && !tv.tv_usec) tv.tv_usec = 1;
    return tv;
}

static void hist_observe(struct hist *h, const double *le, size_t buckets, double seconds)
{
    if (seconds < 0) seconds = 0;
    h->count++;
    h->sum += seconds;
    for (size_t b = 0; b < buckets; b++)
        if (seconds <= le[b]) {
            h->in_bucket[b]++;
            break;
        }
}

static uint32_t total_in_flight(const struct push *p)
{
    uint32_t n = 0;
    for (size_t i = 0; i < p->count; i++) n += p->subs[i].in_flight;
    return n;
}

/* "50/s", "120/m", "5/h" for s's rate limit; "none" without one. */
static const char *rate_text(const struct sub *s, char *out, size_t size)
{
    const bg_time per = s->spec.rate_period;
    if (!s->spec.rate_count) return "none";
    snprintf(out, size, "%u/%s", s->spec.rate_count, per == BG_SECOND ? "s" : per == 60 * BG_SECOND ? "m" : "h");
    return out;
}

/* ---- libcurl on the loop ---------------------------------------------------- */

/* A socket curl asked us to watch. */
struct curl_sock {
    struct event *ev;
};

static void collect_finished(struct push *p);

static void on_socket_ready(evutil_socket_t fd, short what, void *arg)
{
    struct push *p = arg;
    int flags = ((what & EV_READ) ? CURL_CSELECT_IN : 0) | ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    int running;
    curl_multi_socket_action(p->multi, fd, flags, &running);
    collect_finished(p);
}

/* CURLMOPT_SOCKETFUNCTION: watch fd for what curl says, or stop. */
static int on_curl_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)easy;
    struct push *p = userp;
    struct curl_sock *cs = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (cs) {
            event_free(cs->ev);
            free(cs);
        }
        return 0;
    }
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs || !(cs->ev = event_new(p->base, fd, 0, on_socket_ready, p))) {
            free(cs);
            return -1; /* curl fails the transfer */
        }
        curl_multi_assign(p->multi, fd, cs);
    }
    short kind = (short)(((what & CURL_POLL_IN) ? EV_READ : 0) | ((what & CURL_POLL_OUT) ? EV_WRITE : 0) | EV_PERSIST);
    event_del(cs->ev);
    event_assign(cs->ev, p->base, fd, kind, on_socket_ready, p);
    event_add(cs->ev, NULL);
    return 0;
}

static void on_curl_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct push *p = arg;
    int running;
    curl_multi_socket_action(p->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    collect_finished(p);
}

/* CURLMOPT_TIMERFUNCTION: call curl back after timeout_ms (-1: never). */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct push *p = userp;
    if (timeout_ms < 0) {
        evtimer_del(p->curl_timer);
        return 0;
    }
    struct timeval tv = {timeout_ms / 1000, (suseconds_t)(timeout_ms % 1000) * 1000};
    evtimer_add(p->curl_timer, &tv);
    return 0;
}

/* ---- one attempt --------------------------------------------------------- */

static void kick(struct push *p) { event_active(p->kick_ev, EV_READ, 0); }

/* The attempt of d ended (its outcome is recorded): queue it for kick_cb. */
static void attempt_ended(struct delivery *d)
{
    struct push *p = d->sub->push;
    if (d->done) return;
    d->done = 1;
    d->next_done = NULL;
    if (p->done_tail) p->done_tail->next_done = d; else p->done_head = d;
    p->done_tail = d;
    kick(p);
}

/* Nonzero if s[0..n) starts with prefix p (lowercase), in any case. */
static int starts_nocase(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && strncasecmp(s, p, k) == 0;
}

/* CURLOPT_HEADERFUNCTION: one line of a response's head. The head's end
 * records the status (a final one: 1xx heads are skipped), which decides
 * whatever follows; Retry-After is kept; a head over HEADERS_MAX bytes
 * ends the attempt as a connection error. */
static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
    struct delivery *d = arg;
    size_t len = size * n;
    if (starts_nocase(line, len, "http/")) { /* a new response (after a 1xx) */
        d->head_bytes = 0;
        d->has_retry_after = 0;
    }
    d->head_bytes += len;
    if (d->head_bytes > HEADERS_MAX) {
        d->head_too_big = 1;
        return 0;
    }
    if (len <= 2 && (line[0] == '\r' || line[0] == '\n')) {
        long code = 0;
        curl_easy_getinfo(d->easy, CURLINFO_RESPONSE_CODE, &code);
        if (code >= 200) d->status = (unsigned)code;
    } else if (starts_nocase(line, len, "retry-after:") && !d->has_retry_after) {
        size_t i = 12;
        while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
        size_t end = len;
        while (end > i && (line[end - 1] == '\r' || line[end - 1] == '\n' || line[end - 1] == ' ')) end--;
        size_t vlen = end - i < sizeof d->retry_after - 1 ? end - i : sizeof d->retry_after - 1;
        memcpy(d->retry_after, line + i, vlen);
        d->retry_after[vlen] = '\0';
        d->has_retry_after = 1;
    }
    return len;
}

/* CURLOPT_WRITEFUNCTION: the response body is counted, not kept; past
 * PUSH_RESPONSE_BODY_MAX the attempt ends (its status still decides). */
static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    (void)data;
    struct delivery *d = arg;
    d->body_bytes += size * n;
    return d->body_bytes > PUSH_RESPONSE_BODY_MAX ? 0 : size * n;
}

/* What curl's result rc means for an attempt that got no status. */
static enum bg_push_failure failure_of(CURLcode rc, const struct delivery *d)
{
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: return BG_PUSH_FAIL_TIMEOUT;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST: return BG_PUSH_FAIL_CONNECT;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_USE_SSL_FAILED: return BG_PUSH_FAIL_TLS;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
        /* GnuTLS reports an alert from the receiver (a client certificate
         * it wants, or refuses) as a recv error */
        return d->sub->spec.tls && strstr(d->curl_error, "TLS") ? BG_PUSH_FAIL_TLS : BG_PUSH_FAIL_CONNECTION;
    default: return BG_PUSH_FAIL_CONNECTION;
    }
}

/* The bits of GnuTLS's gnutls_certificate_status_t that curl's GnuTLS
 * build leaves in CURLINFO_SSL_VERIFYRESULT, and what they mean. */
static const struct {
    long bit;
    const char *words;
} gnutls_status_words[] = {
    {1L << 10, "certificate has expired"},
    {1L << 9, "certificate is not yet valid"},
    {1L << 5, "certificate was revoked"},
    {1L << 6, "certificate is signed by an unknown or untrusted CA"},
    {1L << 7, "certificate's issuer is not a CA"},
    {1L << 8, "certificate uses an insecure algorithm"},
    {1L << 14, "host name mismatch"},
    {1L << 11, "certificate's signature does not verify"},
};

/* Set d->detail for a failure below HTTP: curl's words, made readable for
 * TLS ("tls: certificate has expired", "tls: host name mismatch"). */
static void describe_failure(struct delivery *d, CURLcode rc)
{
    const char *words = d->curl_error[0] ? d->curl_error : curl_easy_strerror(rc);
    if (d->failure != BG_PUSH_FAIL_TLS) {
        snprintf(d->detail, sizeof d->detail, "%s", words);
        return;
    }
    long verify = 0;
    const curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);
    if (v->ssl_version && strncmp(v->ssl_version, "GnuTLS", 6) == 0)
        curl_easy_getinfo(d->easy, CURLINFO_SSL_VERIFYRESULT, &verify);
    for (size_t i = 0; i < sizeof gnutls_status_words / sizeof gnutls_status_words[0]; i++)
        if (verify & gnutls_status_words[i].bit) {
            snprintf(d->detail, sizeof d->detail, "tls: %s", gnutls_status_words[i].words);
            return;
        }
    if (strstr(words, "does not match target host name")) words = "host name mismatch";
    snprintf(d->detail, sizeof d->detail, "tls: %s", words);
}

/* d's transfer ended with rc: record its outcome and queue it. */
static void transfer_done(struct delivery *d, CURLcode rc)
{
    struct push *p = d->sub->push;
    if (d->head_too_big) {
        d->status = 0;
        d->failure = BG_PUSH_FAIL_CONNECTION;
        snprintf(d->detail, sizeof d->detail, "response head larger than %d bytes", HEADERS_MAX);
    } else if (!d->status && rc == CURLE_OK) {
        long code = 0;
        curl_easy_getinfo(d->easy, CURLINFO_RESPONSE_CODE, &code);
        d->status = code > 0 ? (unsigned)code : 0;
        if (!d->status) d->failure = BG_PUSH_FAIL_CONNECTION;
    } else if (!d->status) {
        d->failure = failure_of(rc, d);
        describe_failure(d, rc);
    }
    curl_multi_remove_handle(p->multi, d->easy);
    d->in_multi = 0;
    curl_slist_free_all(d->headers);
    d->headers = NULL;
    attempt_ended(d);
}

/* Queue every transfer curl finished. */
static void collect_finished(struct push *p)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(p->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE) continue;
        struct delivery *d = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&d);
        if (d) transfer_done(d, m->data.result);
    }
}

/* The attempt's timeout, counted from `now`, when its request is sent: the
 * subscription's, and a margin of 1 s (half the TTR when that is shorter)
 * before the reservation's actual deadline, so that the TTR never ends
 * under an attempt. (A delivery that waited for its put's sync restarts its
 * reservation before it is sent: delivery_durable.) */
static bg_time attempt_timeout(const struct sub *s, const struct bg_job *j, bg_time now)
{
    bg_time ttr = (bg_time)(j->ttr_s ? j->ttr_s : 1) * BG_SECOND;
    bg_time margin = ttr / 2 < BG_SECOND ? ttr / 2 : BG_SECOND;
    bg_time deadline = bg_job_deadline(j);
    bg_time left = deadline > now + margin ? deadline - now - margin : 0;
    bg_time t = (bg_time)s->spec.timeout_s * BG_SECOND;
    return t < left ? t : left;
}

static void hex(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Append "name: value" to *list; 0, or -1 (out of memory: *list freed). */
static int add_header(struct curl_slist **list, const char *name, const char *value)
{
    char line[BG_TUBE_NAME_MAX + 64];
    snprintf(line, sizeof line, "%s: %s", name, value);
    struct curl_slist *grown = curl_slist_append(*list, line);
    if (!grown) {
        curl_slist_free_all(*list);
        *list = NULL;
        return -1;
    }
    *list = grown;
    return 0;
}

/* The request headers of an attempt at job j: NULL when out of memory. */
static struct curl_slist *request_headers(const struct sub *s, const struct bg_job *j)
{
    struct curl_slist *h = NULL;
    char id[24], pri[24], attempt[24], ts[24];
    size_t body_len = j->body_size - 2;
    snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
    snprintf(ts, sizeof ts, "%lld", (long long)wall_seconds());
    snprintf(pri, sizeof pri, "%u", j->pri);
    snprintf(attempt, sizeof attempt, "%u", bg_job_reserves(j));
    /* "Expect:" and "Accept:" with no value: curl sends neither */
    if (add_header(&h, "Content-Type", "application/octet-stream") || add_header(&h, "X-Beangate-Job-Id", id) ||
        add_header(&h, "X-Beangate-Tube", j->tube->name) || add_header(&h, "X-Beangate-Priority", pri) ||
        add_header(&h, "X-Beangate-Attempt", attempt) || add_header(&h, "X-Beangate-Timestamp", ts) ||
        !(h = curl_slist_append(h, "Expect:")) || !(h = curl_slist_append(h, "Accept:")))
        return NULL;
    if (s->signed_) {
        struct hmac_sha256_ctx ctx = s->hmac;
        uint8_t mac[SHA256_DIGEST_SIZE];
        char sig[3 + 2 * SHA256_DIGEST_SIZE + 1] = "v1=";
        hmac_sha256_update(&ctx, strlen(ts), (const uint8_t *)ts);
        hmac_sha256_update(&ctx, 1, (const uint8_t *)".");
        hmac_sha256_update(&ctx, strlen(id), (const uint8_t *)id);
        hmac_sha256_update(&ctx, 1, (const uint8_t *)".");
        hmac_sha256_update(&ctx, body_len, (const uint8_t *)j->body);
        hmac_sha256_digest(&ctx, sizeof mac, mac);
        hex(mac, sizeof mac, sig + 3);
        if (add_header(&h, "X-Beangate-Signature", sig)) return NULL;
    }
    return h;
}

/* Start an attempt of job j (reserved by the holder) on slot d. */
static void attempt_start(struct delivery *d, const struct bg_job *j, bg_time now)
{
    struct sub *s = d->sub;
    d->job_id = j->id;
    d->reserves = bg_job_reserves(j);
    d->status = 0;
    d->failure = BG_PUSH_FAIL_NONE;
    d->has_retry_after = 0;
    d->done = 0;
    d->started = now;
    d->head_bytes = d->body_bytes = 0;
    d->head_too_big = 0;
    d->curl_error[0] = d->detail[0] = '\0';
    s->attempts++;
    d->headers = request_headers(s, j);
    /* curl takes no timeout as none: at least 1 ms */
    long timeout_ms = (long)(attempt_timeout(s, j, now) / 1000000);
    if (timeout_ms < 1) timeout_ms = 1;
    CURL *e = d->easy;
    if (!d->headers || curl_easy_setopt(e, CURLOPT_HTTPHEADER, d->headers) != CURLE_OK ||
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(j->body_size - 2)) != CURLE_OK ||
        curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, (const char *)j->body) != CURLE_OK ||
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms) != CURLE_OK ||
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms) != CURLE_OK ||
        curl_multi_add_handle(s->push->multi, e) != CURLM_OK) {
        curl_slist_free_all(d->headers);
        d->headers = NULL;
        d->failure = BG_PUSH_FAIL_CONNECT;
        snprintf(d->detail, sizeof d->detail, "out of memory");
        attempt_ended(d);
        return;
    }
    d->in_multi = 1;
}

/* Slot d is done with its job: free it (the caller kicks to reserve more). */
static void slot_free(struct delivery *d)
{
    d->busy = 0;
    d->sub->in_flight--;
}

/* The log keeps the put of d's job now. Its reservation ran while the put
 * waited: if it is still d's, restart its TTR (the attempt gets the whole
 * TTR, as a worker that starts work late touches its job) and start the
 * attempt. If the TTR ended during the wait, the engine gave the job back
 * (its TTR expiry, the normal path: it is delivered again like any ready
 * job); no attempt was made, so nothing is counted: d is just freed. */
static void delivery_durable(struct wal_hold *h)
{
    struct delivery *d = (struct delivery *)((char *)h - offsetof(struct delivery, hold));
    struct sub *s = d->sub;
    struct bg_engine *e = s->push->engine;
    bg_time now = s->push->now();
    bg_engine_catch_up(e, now); /* a TTR that ended is seen as ended */
    struct bg_job *j = bg_job_find(e, d->job_id);
    if (j && j->state == BG_JOB_RESERVED && bg_job_reserver(j) == &s->holder && bg_job_reserves(j) == d->reserves &&
        bg_touch(&s->holder, j->id, now) == 0) {
        attempt_start(d, j, now);
        return;
    }
    log_event(BG_LOG_INFO, "push_hold_expired", "tube=%s job=%llu attempt=%u msg=\"the reservation ended "
              "while the put waited for the log; no attempt was made\"", log_str(s->spec.tube),
              (unsigned long long)d->job_id, d->reserves);
    slot_free(d);
    kick(s->push);
}

/* Take job j (just reserved by s's reserver) into a free slot and start it
 * once the log keeps its put (at once, mostly). */
static void take(struct sub *s, struct bg_job *j, bg_time now)
{
    bg_client_active(&s->reserver, now); /* a delivery begins: not idle */
    bg_reservation_transfer(j, &s->holder); /* room was reserved at start */
    bg_rate_take(&s->rate, now);
    struct delivery *d = NULL;
    for (uint32_t i = 0; i < s->spec.concurrency && !d; i++)
        if (!s->slots[i].busy) d = &s->slots[i];
    /* in_flight < concurrency when the reserver reserves: a slot is free */
    d->busy = 1;
    s->in_flight++;
    uint64_t pos = bg_engine_job_position(s->push->engine, j);
    if (wal_reply_may_go(s->push->wal, pos)) {
        attempt_start(d, j, now);
        return;
    }
    d->job_id = j->id;
    d->reserves = bg_job_reserves(j);
    d->status = 0;
    d->done = 0;
    d->started = now;
    wal_hold(s->push->wal, &d->hold, pos, delivery_durable);
}

/* ---- the reserver ----------------------------------------------------------- */

static void reserver_job_reserved(struct bg_client *c, struct bg_job *j)
{
    struct sub *s = c->owner;
    s->waiting = 0;
    take(s, j, s->push->now());
    kick(s->push); /* reserve more outside this engine call */
}

static void reserver_wait_ended(struct bg_client *c, int outcome)
{
    (void)outcome; /* it waits without a timeout and holds nothing: not expected */
    struct sub *s = c->owner;
    s->waiting = 0;
    kick(s->push);
}

static const struct bg_client_ops reserver_ops = {reserver_job_reserved, reserver_wait_ended, NULL};

/* Reserve and start jobs while s has room and the rate allows; wait in the
 * engine when nothing is ready. */
static void pump(struct sub *s, bg_time now)
{
    struct push *p = s->push;
    if (p->stopping || s->waiting || !s->clients_up) return;
    while (s->in_flight < s->spec.concurrency) {
        bg_time ready = bg_rate_ready_at(&s->rate, now);
        if (ready > now) {
            struct timeval tv = tv_of(ready - now);
            evtimer_add(s->rate_ev, &tv);
            return;
        }
        struct bg_job *j = NULL;
        int rc = bg_reserve(&s->reserver, -1, now, &j);
        if (rc == 0) {
            take(s, j, now);
            continue;
        }
        if (rc == BG_WOULD_BLOCK) {
            s->waiting = 1;
            return;
        }
        /* out of memory: try again in a second */
        log_event(BG_LOG_WARN, "push_reserve_failed", "tube=%s error=%s", log_str(s->spec.tube),
                  bg_outcome_word(rc));
        struct timeval tv = {1, 0};
        evtimer_add(s->rate_ev, &tv);
        return;
    }
}

/* ---- the end of an attempt ------------------------------------------------- */

/* Remember job's last failure for GET /jobs/{id} and the subscription's. */
static void record_failure(struct sub *s, const struct delivery *d, enum bg_push_reason reason,
                           bg_time retry_at)
{
    struct bg_push_failure_rec rec = {
        .job_id = d->job_id, .at_wall_s = wall_seconds(), .retry_at = retry_at,
        .attempt = d->reserves, .status = (uint16_t)(d->status < 1000 ? d->status : 0),
        .reason = (uint8_t)reason, .subscription = (uint8_t)s->index,
    };
    s->last = rec;
    snprintf(s->last_detail, sizeof s->last_detail, "%s", d->detail);
    bg_push_failures_set(&s->push->failures, &rec); /* best effort: out of memory keeps none */
}

/* Seconds to wait before the next attempt after a retryable failure. */
static uint32_t retry_delay(struct sub *s, const struct delivery *d)
{
    uint64_t after;
    if (d->has_retry_after && bg_push_retry_after(d->retry_after, wall_seconds(), &after) == 0)
        return bg_push_retry_delay(after, s->spec.backoff_min_s, s->spec.backoff_max_s);
    return bg_push_backoff(s->spec.backoff_min_s, s->spec.backoff_max_s, d->reserves,
                           next_random(s->push));
}

/* Delete, release or bury the job of d's attempt as its outcome says (see
 * finish, which calls it with d still taken). */
static void apply_outcome(struct sub *s, const struct delivery *d, bg_time now)
{
    struct push *p = s->push;
    struct bg_engine *e = p->engine;
    int has_ra = 0;
    uint64_t ignored;
    if (d->has_retry_after && bg_push_retry_after(d->retry_after, wall_seconds(), &ignored) == 0) has_ra = 1;
    enum bg_push_reason reason = bg_push_classify(d->status, has_ra, d->failure);
    hist_observe(&s->attempt_hist, attempt_le, ATTEMPT_BUCKETS, (double)(now - d->started) / 1e9);
    bg_engine_catch_up(e, now);
    struct bg_job *j = bg_job_find(e, d->job_id);
    if (!j || j->state != BG_JOB_RESERVED || bg_job_reserves(j) != d->reserves ||
        (bg_job_reserver(j) != &s->holder && bg_job_reserver(j) != &s->reserver)) {
        /* the engine took the reservation back (it cannot: an attempt ends
         * a margin before its reservation does, unless the loop stalled):
         * the job is not ours to touch */
        s->lost++;
        log_event(BG_LOG_WARN, "push_reservation_lost", "tube=%s job=%llu attempt=%u outcome=%s",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(reason));
        return;
    }
    struct bg_client *owner = bg_job_reserver(j);
    uint32_t pri = j->pri;
    switch (bg_push_action_of(reason, d->reserves, s->spec.attempts)) {
    case BG_PUSH_DELETE:
        hist_observe(&s->delivery_hist, delivery_le, DELIVERY_BUCKETS,
                     now > j->created_at ? (double)(now - j->created_at) / 1e9 : 0);
        bg_delete(owner, d->job_id, now);
        bg_push_failures_remove(&p->failures, d->job_id);
        s->delivered++;
        return;
    case BG_PUSH_RELEASE: {
        uint32_t delay = retry_delay(s, d);
        bg_release(owner, d->job_id, pri, delay, now);
        s->retried[reason]++;
        record_failure(s, d, reason, now + (bg_time)delay * BG_SECOND);
        /* a TLS failure is the operator's to fix: seen at the default level */
        log_event(reason == BG_PUSH_TLS_FAILED ? BG_LOG_WARN : BG_LOG_DEBUG, "push_retry",
                  "tube=%s job=%llu attempt=%u reason=%s status=%u delay=%u detail=%s",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(reason), d->status, delay, log_str(d->detail[0] ? d->detail : "-"));
        return;
    }
    case BG_PUSH_BURY: {
        enum bg_push_reason why = reason == BG_PUSH_HTTP_3XX || reason == BG_PUSH_HTTP_4XX
                                      ? reason : BG_PUSH_ATTEMPTS_EXHAUSTED;
        bg_bury(owner, d->job_id, pri, now);
        s->buried[why]++;
        record_failure(s, d, reason, 0);
        log_event(BG_LOG_WARN, "push_buried",
                  "tube=%s job=%llu attempt=%u reason=%s failure=%s status=%u detail=%s",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(why), bg_push_reason_name(reason), d->status,
                  log_str(d->detail[0] ? d->detail : "-"));
        return;
    }
    }
}

/* Act on the outcome of d's attempt on its job: delete, release or bury
 * it; the outcome applies to job d->job_id, reservation d->reserves, and
 * to nothing else. Slot d stays taken until that is done: the engine calls
 * below (the catch-up, a release with no delay) may hand the waiting
 * reserver a job, and that job must start on another slot, never on d
 * while d's outcome is still being applied (issue 21, defect 12: it did,
 * and the old attempt's 2xx deleted the new job). The reserver waits only
 * while a slot is free, so keeping d taken never leaves it without one. */
static void finish(struct delivery *d, bg_time now)
{
    struct sub *s = d->sub;
    d->done = 0;
    apply_outcome(s, d, now);
    slot_free(d);
}

/* Finish every attempt that ended, reserve more, and stop when stopping
 * and nothing is left in flight. */
static void process(struct push *p)
{
    bg_time now = p->now();
    while (p->done_head) {
        struct delivery *d = p->done_head;
        p->done_head = d->next_done;
        if (!p->done_head) p->done_tail = NULL;
        finish(d, now);
    }
    for (size_t i = 0; i < p->count; i++) pump(&p->subs[i], now);
    if (p->changed) p->changed(p->changed_arg);
    if (p->stopping && p->stopped && total_in_flight(p) == 0) {
        void (*stopped)(void *) = p->stopped;
        p->stopped = NULL;
        evtimer_del(p->grace_ev);
        stopped(p->stopped_arg);
    }
}

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    process(arg);
}

static void rate_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sub *s = arg;
    pump(s, s->push->now());
    if (s->push->changed) s->push->changed(s->push->changed_arg);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct push *p = arg;
    log_event(BG_LOG_INFO, "push_grace_over", "in_flight=%u action=release", total_in_flight(p));
    if (p->stopped) {
        void (*stopped)(void *) = p->stopped;
        p->stopped = NULL;
        stopped(p->stopped_arg);
    }
}

/* ---- lifetime ------------------------------------------------------------- */

/* A new easy handle for slot d with everything that stays the same from
 * one attempt to the next; NULL if curl refuses an option. Safety: only
 * http and https, no redirect followed, no proxy (not even one from the
 * environment), no netrc, no cookies; the receiver's certificate and host
 * name always verified (against ca_file, or the system's store). */
static CURL *slot_easy(struct delivery *d)
{
    const struct sub *s = d->sub;
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    int bad = curl_easy_setopt(e, CURLOPT_URL, s->target) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_PROXY, "") != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_NETRC, (long)CURL_NETRC_IGNORED) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_POST, 1L) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_USERAGENT, "beangate/" BEANGATE_VERSION) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)d) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_ERRORBUFFER, d->curl_error) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_HEADERDATA, d) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_WRITEDATA, d) != CURLE_OK;
    if (!bad && s->spec.tls) {
        bad = curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L) != CURLE_OK ||
              curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L) != CURLE_OK;
        if (!bad && s->spec.ca_file[0]) /* that file only, not the system's store besides */
            bad = curl_easy_setopt(e, CURLOPT_CAINFO, s->spec.ca_file) != CURLE_OK ||
                  curl_easy_setopt(e, CURLOPT_CAPATH, NULL) != CURLE_OK;
        if (!bad && s->spec.cert_file[0])
            bad = curl_easy_setopt(e, CURLOPT_SSLCERT, s->spec.cert_file) != CURLE_OK ||
                  curl_easy_setopt(e, CURLOPT_SSLKEY, s->spec.key_file) != CURLE_OK;
    }
    if (bad) {
        curl_easy_cleanup(e);
        return NULL;
    }
    return e;
}

static int sub_init(struct push *p, struct sub *s, const struct push_setup *setup, size_t i)
{
    s->push = p;
    s->index = (uint32_t)i;
    s->spec = setup->specs[i];
    if (setup->secrets[i]) {
        s->signed_ = 1;
        hmac_sha256_set_key(&s->hmac, setup->secret_lens[i], setup->secrets[i]);
    }
    int v6 = strchr(s->spec.host, ':') != NULL;
    snprintf(s->target, sizeof s->target, v6 ? "%s://[%s]:%u%s" : "%s://%s:%u%s", s->spec.tls ? "https" : "http",
             s->spec.host, s->spec.port, s->spec.path);
    bg_rate_init(&s->rate, s->spec.rate_count, s->spec.rate_period);
    s->slots = calloc(s->spec.concurrency, sizeof *s->slots);
    s->rate_ev = evtimer_new(p->base, rate_cb, s);
    if (!s->slots || !s->rate_ev) return -1;
    for (uint32_t k = 0; k < s->spec.concurrency; k++) {
        s->slots[k].sub = s;
        if (!(s->slots[k].easy = slot_easy(&s->slots[k]))) return -1;
    }
    uint32_t watching;
    if (bg_client_init_bare(p->engine, &s->reserver, &reserver_ops, s) != 0) return -1;
    if (bg_client_init_bare(p->engine, &s->holder, &bg_client_ops_never_wait, s) != 0) {
        bg_client_close(&s->reserver, p->now());
        return -1;
    }
    s->clients_up = 1;
    /* GET /clients lists the subscription, by its URL; the configuration
     * removes it, not DELETE /clients/{id} (no close_now) */
    struct bg_client_entry *listed = bg_client_list(&s->reserver, BG_CLIENT_PUSH, p->now());
    if (listed) {
        listed->name = s->spec.url;
        listed->tls = s->spec.tls != 0;
        bg_client_list_holder(&s->reserver, &s->holder);
    }
    if (bg_client_watch(&s->reserver, s->spec.tube, &watching) != 0 ||
        bg_heap_reserve(&s->holder.reserved, s->spec.concurrency) != 0)
        return -1;
    return 0;
}

/* curl's multi handle on base, driven by p's events, whose cache keeps a
 * connection for every slot (setup's concurrencies); 0 or -1. */
static int curl_start(struct push *p, const struct push_setup *setup)
{
    long slots = 0;
    for (size_t i = 0; i < setup->count; i++) slots += (long)setup->specs[i].concurrency;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return -1;
    p->curl_up = 1;
    p->multi = curl_multi_init();
    p->curl_timer = evtimer_new(p->base, on_curl_timeout, p);
    if (!p->multi || !p->curl_timer) return -1;
    return curl_multi_setopt(p->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket) != CURLM_OK ||
                   curl_multi_setopt(p->multi, CURLMOPT_SOCKETDATA, p) != CURLM_OK ||
                   curl_multi_setopt(p->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer) != CURLM_OK ||
                   curl_multi_setopt(p->multi, CURLMOPT_TIMERDATA, p) != CURLM_OK ||
                   /* the default keeps 4 per transfer running: between two
                    * attempts a slot has none, and its connection was closed */
                   curl_multi_setopt(p->multi, CURLMOPT_MAXCONNECTS, slots) != CURLM_OK
               ? -1 : 0;
}

struct push *push_start(const struct push_setup *setup, struct event_base *base,
                        struct bg_engine *engine, bg_time (*now)(void),
                        void (*changed)(void *), void *arg)
{
    if (!setup || !setup->count) return NULL;
    struct push *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->base = base;
    p->engine = engine;
    p->now = now;
    p->changed = changed;
    p->changed_arg = arg;
    p->grace_s = setup->grace_s;
    bg_push_failures_init(&p->failures, BG_PUSH_FAILURES_MAX);
    if (getrandom(&p->rng, sizeof p->rng, 0) != (ssize_t)sizeof p->rng || !p->rng)
        p->rng = (uint64_t)now() | 1;
    p->kick_ev = event_new(base, -1, 0, kick_cb, p);
    p->grace_ev = evtimer_new(base, grace_cb, p);
    p->subs = calloc(setup->count, sizeof *p->subs);
    int ok = p->kick_ev && p->grace_ev && p->subs && curl_start(p, setup) == 0;
    for (size_t i = 0; ok && i < setup->count; i++) {
        p->count = i + 1;
        ok = sub_init(p, &p->subs[i], setup, i) == 0;
    }
    if (!ok) {
        log_event(BG_LOG_ERROR, "push_not_started", "reason=out_of_memory");
        push_free(p);
        return NULL;
    }
    for (size_t i = 0; i < p->count; i++) {
        const struct sub *s = &p->subs[i];
        char rate[32];
        log_event(BG_LOG_INFO, "push_subscription", "tube=%s url=%s concurrency=%u timeout=%u attempts=%u "
                  "backoff=%u..%u rate=%s signed=%s ca_file=%s client_cert=%s", log_str(s->spec.tube),
                  log_str(s->spec.url), s->spec.concurrency, s->spec.timeout_s, s->spec.attempts,
                  s->spec.backoff_min_s, s->spec.backoff_max_s, rate_text(s, rate, sizeof rate),
                  s->signed_ ? "yes" : "no", log_str(s->spec.ca_file[0] ? s->spec.ca_file : NULL),
                  log_str(s->spec.cert_file[0] ? s->spec.cert_file : NULL));
    }
    kick(p); /* reserve on the first loop turn */
    return p;
}

void push_set_log(struct push *p, struct wal *w)
{
    if (p) p->wal = w;
}

int push_stop(struct push *p, void (*done)(void *), void *arg)
{
    if (!p || p->stopping) return 0;
    p->stopping = 1;
    for (size_t i = 0; i < p->count; i++) {
        struct sub *s = &p->subs[i];
        if (s->waiting) bg_client_stop_waiting(&s->reserver);
        s->waiting = 0;
        evtimer_del(s->rate_ev);
    }
    uint32_t n = total_in_flight(p);
    if (n == 0) return 0;
    p->stopped = done;
    p->stopped_arg = arg;
    struct timeval tv = {(time_t)p->grace_s, 0};
    evtimer_add(p->grace_ev, &tv);
    log_event(BG_LOG_INFO, "push_stopping", "in_flight=%u grace_s=%u", n, p->grace_s);
    return 1;
}

void push_free(struct push *p)
{
    if (!p) return;
    bg_time now = p->now();
    p->stopping = 1;
    p->stopped = NULL;
    /* attempts that ended and were not finished yet: finish them */
    while (p->done_head) {
        struct delivery *d = p->done_head;
        p->done_head = d->next_done;
        if (!p->done_head) p->done_tail = NULL;
        finish(d, now);
    }
    for (size_t i = 0; i < p->count; i++) {
        struct sub *s = &p->subs[i];
        for (uint32_t k = 0; s->slots && k < s->spec.concurrency; k++) {
            struct delivery *d = &s->slots[k];
            wal_unhold(p->wal, &d->hold);
            if (d->in_multi) {
                curl_multi_remove_handle(p->multi, d->easy);
                d->in_multi = 0;
            }
            curl_slist_free_all(d->headers);
            d->headers = NULL;
            if (d->busy && s->clients_up) {
                /* back to ready, its priority kept; a cut attempt never buries */
                struct bg_job *j = bg_job_find(p->engine, d->job_id);
                if (j && j->state == BG_JOB_RESERVED &&
                    (bg_job_reserver(j) == &s->holder || bg_job_reserver(j) == &s->reserver))
                    bg_release(bg_job_reserver(j), d->job_id, j->pri, 0, now);
                log_event(BG_LOG_INFO, "push_released", "tube=%s job=%llu attempt=%u reason=shutdown",
                          log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves);
                d->busy = 0;
            }
            if (d->easy) curl_easy_cleanup(d->easy);
        }
        if (s->clients_up) {
            bg_client_close(&s->reserver, now);
            bg_client_close(&s->holder, now);
        }
        if (s->rate_ev) event_free(s->rate_ev);
        free(s->slots);
        explicit_bzero(&s->hmac, sizeof s->hmac);
    }
    if (p->changed) p->changed(p->changed_arg);
    if (p->multi) curl_multi_cleanup(p->multi); /* closes the kept connections */
    if (p->curl_timer) event_free(p->curl_timer);
    if (p->curl_up) curl_global_cleanup();
    if (p->kick_ev) event_free(p->kick_ev);
    if (p->grace_ev) event_free(p->grace_ev);
    bg_push_failures_free(&p->failures);
    free(p->subs);
    free(p);
}

/* ---- what the gateway shows ---------------------------------------------- */

/* Count the jobs of each subscription that wait for a retry now: released
 * with a delay that has not passed, and still delayed. */
struct backoff_count {
    const struct push *p;
    bg_time now;
    uint64_t *counts;
};

static void count_backing_off(void *ctx, const struct bg_push_failure_rec *rec)
{
    struct backoff_count *c = ctx;
    if (!rec->retry_at || rec->retry_at <= c->now || rec->subscription >= c->p->count) return;
    const struct bg_job *j = bg_job_find(c->p->engine, rec->job_id);
    if (j && j->state == BG_JOB_DELAYED) c->counts[rec->subscription]++;
}

static void backing_off(const struct push *p, uint64_t counts[BG_PUSH_SUBSCRIPTIONS_MAX])
{
    struct backoff_count c = {p, p->now(), counts};
    memset(counts, 0, BG_PUSH_SUBSCRIPTIONS_MAX * sizeof *counts);
    bg_push_failures_each(&p->failures, count_backing_off, &c);
}

/* {job_id?, status, error, at, attempt} of a failure record. */
static json_t *failure_json(const struct bg_push_failure_rec *rec, int with_job)
{
    json_t *v = json_pack("{s:o, s:s, s:I, s:I}", "status",
                          rec->status ? json_integer(rec->status) : json_null(), "error",
                          bg_push_reason_name((enum bg_push_reason)rec->reason), "at",
                          (json_int_t)rec->at_wall_s, "attempt", (json_int_t)rec->attempt);
    if (v && with_job) json_object_set_new(v, "job_id", json_integer((json_int_t)rec->job_id));
    return v;
}

/* A subscription's last failure, with its words when it was a TLS failure
 * (the other reasons say enough; the log has their words too). */
static json_t *last_error_json(const struct sub *s)
{
    json_t *v = failure_json(&s->last, 1);
    if (v && s->last.reason == BG_PUSH_TLS_FAILED && s->last_detail[0])
        json_object_set_new(v, "detail", json_string(s->last_detail));
    return v;
}

/* {reason: count} for the reasons that can lead to action a. */
static json_t *by_reason(const uint64_t counts[BG_PUSH_REASON_COUNT], enum bg_push_action a)
{
    json_t *v = json_object();
    for (int r = 0; v && r < BG_PUSH_REASON_COUNT; r++) {
        int fits = a == BG_PUSH_BURY
                       ? r == BG_PUSH_HTTP_3XX || r == BG_PUSH_HTTP_4XX || r == BG_PUSH_ATTEMPTS_EXHAUSTED
                       : r != BG_PUSH_DELIVERED && r != BG_PUSH_HTTP_3XX && r != BG_PUSH_HTTP_4XX &&
                             r != BG_PUSH_ATTEMPTS_EXHAUSTED && r != BG_PUSH_SHUTDOWN;
        if (fits) json_object_set_new(v, bg_push_reason_name((enum bg_push_reason)r), json_integer((json_int_t)counts[r]));
    }
    return v;
}

static uint64_t sum(const uint64_t *v, size_t n)
{
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += v[i];
    return t;
}

json_t *push_subscriptions_json(void *arg)
{
    struct push *p = arg;
    json_t *list = json_array();
    if (!p || !list) return list;
    uint64_t waiting_retry[BG_PUSH_SUBSCRIPTIONS_MAX];
    backing_off(p, waiting_retry);
    for (size_t i = 0; i < p->count; i++) {
        const struct sub *s = &p->subs[i];
        char rate[32];
        json_t *v = json_pack(
            "{s:s, s:s, s:I, s:o, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:o}",
            "tube", s->spec.tube, "url", s->spec.url, "concurrency", (json_int_t)s->spec.concurrency,
            "rate", s->spec.rate_count ? json_string(rate_text(s, rate, sizeof rate)) : json_null(),
            "timeout", (json_int_t)s->spec.timeout_s, "attempts", (json_int_t)s->spec.attempts,
            "backoff_min", (json_int_t)s->spec.backoff_min_s, "backoff_max", (json_int_t)s->spec.backoff_max_s,
            "signed", s->signed_, "in_flight", (json_int_t)s->in_flight,
            "backing_off", (json_int_t)waiting_retry[i],
            "last_error", s->last.job_id ? last_error_json(s) : json_null(),
            "attempts_started", (json_int_t)s->attempts, "delivered", (json_int_t)s->delivered,
            "retried", (json_int_t)sum(s->retried, BG_PUSH_REASON_COUNT),
            "buried", (json_int_t)sum(s->buried, BG_PUSH_REASON_COUNT),
            "retried_by_reason", by_reason(s->retried, BG_PUSH_RELEASE),
            "buried_by_reason", by_reason(s->buried, BG_PUSH_BURY));
        if (v) json_object_set_new(v, "reservations_lost", json_integer((json_int_t)s->lost));
        json_array_append_new(list, v);
    }
    return list;
}

json_t *push_job_error_json(void *arg, uint64_t id)
{
    struct push *p = arg;
    const struct bg_push_failure_rec *rec = p ? bg_push_failures_get(&p->failures, id) : NULL;
    return rec ? failure_json(rec, 0) : NULL;
}

int push_owns_client(void *arg, const struct bg_client *c)
{
    struct push *p = arg;
    for (size_t i = 0; p && i < p->count; i++)
        if (c == &p->subs[i].holder || c == &p->subs[i].reserver) return 1;
    return 0;
}

/* The HELP and TYPE lines of a family. */
static int family(struct bg_buf *b, const char *name, const char *type, const char *help)
{
    return bg_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series of s (tube names need no escaping in a label). */
static int render_hist(struct bg_buf *b, const char *name, const struct sub *s, const struct hist *h,
                       const char *const *text, size_t buckets)
{
    uint64_t cumulative = 0;
    int rc = 0;
    for (size_t k = 0; rc == 0 && k <= buckets; k++) {
        cumulative += k < buckets ? h->in_bucket[k] : 0;
        rc = bg_buf_printf(b, "%s_bucket{tube=\"%s\",le=\"%s\"} %llu\n", name, s->spec.tube,
                           k < buckets ? text[k] : "+Inf",
                           (unsigned long long)(k < buckets ? cumulative : h->count));
    }
    if (rc == 0) rc = bg_buf_printf(b, "%s_sum{tube=\"%s\"} %.9f\n", name, s->spec.tube, h->sum);
    if (rc == 0)
        rc = bg_buf_printf(b, "%s_count{tube=\"%s\"} %llu\n", name, s->spec.tube, (unsigned long long)h->count);
    return rc;
}

/* The per-subscription families with one sample each: a figure of struct sub. */
enum figure { F_ATTEMPTS, F_DELIVERED, F_LOST, F_IN_FLIGHT, F_CONCURRENCY, F_BACKING_OFF };
static const struct {
    const char *name, *type, *help;
    enum figure figure;
} plain_families[] = {
    {"beangate_push_attempts_total", "counter", "Delivery attempts started, by subscription (tube).", F_ATTEMPTS},
    {"beangate_push_delivered_total", "counter", "Jobs delivered (answered 2xx) and deleted.", F_DELIVERED},
    {"beangate_push_reservations_lost_total", "counter",
     "Attempts whose reservation the engine had taken back when they ended (should stay 0).", F_LOST},
    {"beangate_push_in_flight", "gauge", "Deliveries in flight now.", F_IN_FLIGHT},
    {"beangate_push_concurrency", "gauge", "Deliveries in flight at most (the subscription's concurrency).",
     F_CONCURRENCY},
    {"beangate_push_backing_off", "gauge",
     "Jobs released after a failed attempt and waiting for their retry.", F_BACKING_OFF},
};

int push_metrics(void *arg, struct bg_buf *b)
{
    struct push *p = arg;
    if (!p) return 0;
    uint64_t waiting_retry[BG_PUSH_SUBSCRIPTIONS_MAX];
    backing_off(p, waiting_retry);
    int rc = 0;
    for (size_t f = 0; rc == 0 && f < sizeof plain_families / sizeof plain_families[0]; f++) {
        rc = family(b, plain_families[f].name, plain_families[f].type, plain_families[f].help);
        for (size_t i = 0; rc == 0 && i < p->count; i++) {
            const struct sub *s = &p->subs[i];
            uint64_t v = 0;
            switch (plain_families[f].figure) {
            case F_ATTEMPTS: v = s->attempts; break;
            case F_DELIVERED: v = s->delivered; break;
            case F_LOST: v = s->lost; break;
            case F_IN_FLIGHT: v = s->in_flight; break;
            case F_CONCURRENCY: v = s->spec.concurrency; break;
            case F_BACKING_OFF: v = waiting_retry[i]; break;
            }
            rc = bg_buf_printf(b, "%s{tube=\"%s\"} %llu\n", plain_families[f].name, s->spec.tube,
                               (unsigned long long)v);
        }
    }
    if (rc == 0)
        rc = family(b, "beangate_push_retries_total", "counter",
                    "Failed attempts whose job was released for a retry, by reason.");
    for (size_t i = 0; rc == 0 && i < p->count; i++)
        for (int r = 0; rc == 0 && r < BG_PUSH_REASON_COUNT; r++)
            if (bg_push_action_of((enum bg_push_reason)r, 0, 1) == BG_PUSH_RELEASE && r != BG_PUSH_SHUTDOWN)
                rc = bg_buf_printf(b, "beangate_push_retries_total{tube=\"%s\",reason=\"%s\"} %llu\n",
                                   p->subs[i].spec.tube, bg_push_reason_name((enum bg_push_reason)r),
                                   (unsigned long long)p->subs[i].retried[r]);
    if (rc == 0)
        rc = family(b, "beangate_push_buried_total", "counter",
                    "Jobs buried after an attempt, by reason (http_3xx, http_4xx, attempts_exhausted).");
    for (size_t i = 0; rc == 0 && i < p->count; i++)
        for (int r = 0; rc == 0 && r < BG_PUSH_REASON_COUNT; r++)
            if (r == BG_PUSH_HTTP_3XX || r == BG_PUSH_HTTP_4XX || r == BG_PUSH_ATTEMPTS_EXHAUSTED)
                rc = bg_buf_printf(b, "beangate_push_buried_total{tube=\"%s\",reason=\"%s\"} %llu\n",
                                   p->subs[i].spec.tube, bg_push_reason_name((enum bg_push_reason)r),
                                   (unsigned long long)p->subs[i].buried[r]);
    if (rc == 0)
        rc = family(b, "beangate_push_attempt_duration_seconds", "histogram",
                    "Time of one delivery attempt, from the request's start to its answer, failure or timeout.");
    for (size_t i = 0; rc == 0 && i < p->count; i++)
        rc = render_hist(b, "beangate_push_attempt_duration_seconds", &p->subs[i], &p->subs[i].attempt_hist,
                         attempt_text, ATTEMPT_BUCKETS);
    if (rc == 0)
        rc = family(b, "beangate_push_delivery_seconds", "histogram",
                    "Time from a job's put to the 2xx that delivered it (delays, waiting and retries included).");
    for (size_t i = 0; rc == 0 && i < p->count; i++)
        rc = render_hist(b, "beangate_push_delivery_seconds", &p->subs[i], &p->subs[i].delivery_hist,
                         delivery_text, DELIVERY_BUCKETS);
    if (rc == 0)
        rc = family(b, "beangate_push_failures_tracked", "gauge",
                    "Jobs whose last delivery failure is kept (GET /jobs/{id}; at most 100000).");
    if (rc == 0) rc = bg_buf_printf(b, "beangate_push_failures_tracked %u\n", p->failures.count);
    if (rc == 0)
        rc = family(b, "beangate_push_failures_dropped_total", "counter",
                    "Last-failure records dropped because the table was full (the oldest go first).");
    if (rc == 0)
        rc = bg_buf_printf(b, "beangate_push_failures_dropped_total %llu\n",
                           (unsigned long long)p->failures.evicted);
    return rc;
}

void push_describe(const struct push *p, FILE *f)
{
    for (size_t i = 0; p && i < p->count; i++) {
        const struct sub *s = &p->subs[i];
        fprintf(f, "  push       %s -> %s (concurrency %u", s->spec.tube, s->spec.url, s->spec.concurrency);
        char rate[32];
        if (s->spec.rate_count) fprintf(f, ", rate %s", rate_text(s, rate, sizeof rate));
        fprintf(f, ", %u attempts, %s)\n", s->spec.attempts, s->signed_ ? "signed" : "unsigned");
    }
}

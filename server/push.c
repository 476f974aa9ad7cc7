/* push.c - push delivery: each subscription reserves jobs from its tube and
 * POSTs them to its URL with libevent's HTTP client (push.h).
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
 * An attempt's HTTP callbacks only record what happened and queue the
 * delivery on the done list; kick_ev then deletes, releases or buries the
 * job and reserves more. So the engine is never called from inside a
 * libevent HTTP callback, which may itself run inside evhttp_make_request
 * (a connect that fails at once), nor from inside the engine's op. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
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

/* One slot of a subscription: one connection, one attempt at a time. */
struct delivery {
    struct sub *sub;
    struct evhttp_connection *conn; /* kept open between attempts */
    struct evhttp_request *req;     /* the attempt in flight; NULL otherwise */
    struct event *timer;            /* the attempt's timeout */
    int busy;                       /* a job is taken (in flight or done, not yet finished) */
    int cancelling;                 /* inside evhttp_cancel_request */
    int done;                       /* on the done list */
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
    char host_header[300];
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
};

struct push {
    struct event_base *base;
    struct bg_engine *engine;
    struct wal *wal;                /* deliveries wait for it; NULL: none */
    bg_time (*now)(void);
    void (*changed)(void *);
    void *changed_arg;
    struct evdns_base *dns;         /* only when a URL names a host */
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

/* ---- one attempt --------------------------------------------------------- */

static void kick(struct push *p) { event_active(p->kick_ev, EV_READ, 0); }

/* The attempt of d ended (its outcome is recorded): queue it for kick_cb. */
static void attempt_ended(struct delivery *d)
{
    struct push *p = d->sub->push;
    evtimer_del(d->timer);
    d->req = NULL;
    if (d->done) return;
    d->done = 1;
    d->next_done = NULL;
    if (p->done_tail) p->done_tail->next_done = d; else p->done_head = d;
    p->done_tail = d;
    kick(p);
}

/* Remember Retry-After from a response's headers. */
static void note_retry_after(struct delivery *d, struct evhttp_request *req)
{
    const char *v = evhttp_find_header(evhttp_request_get_input_headers(req), "Retry-After");
    if (!v || d->has_retry_after) return;
    d->has_retry_after = 1;
    snprintf(d->retry_after, sizeof d->retry_after, "%s", v);
}

/* The response head arrived: the status decides, whatever follows. */
static int on_head(struct evhttp_request *req, void *arg)
{
    struct delivery *d = arg;
    d->status = (unsigned)evhttp_request_get_response_code(req);
    note_retry_after(d, req);
    return 0;
}

static void on_error(enum evhttp_request_error err, void *arg)
{
    struct delivery *d = arg;
    if (d->cancelling) return;
    d->failure = err == EVREQ_HTTP_TIMEOUT ? BG_PUSH_FAIL_TIMEOUT : BG_PUSH_FAIL_CONNECTION;
}

/* The request finished: req NULL or with no status when it failed. A
 * failure libevent reports without its error callback is a connect that
 * failed (refused, unreachable, name not resolved). */
static void on_response(struct evhttp_request *req, void *arg)
{
    struct delivery *d = arg;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code > 0) {
        d->status = (unsigned)code;
        note_retry_after(d, req);
    } else if (d->failure == BG_PUSH_FAIL_NONE) {
        d->failure = BG_PUSH_FAIL_CONNECT;
    }
    attempt_ended(d);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct delivery *d = arg;
    if (!d->req) return;
    d->cancelling = 1;
    evhttp_cancel_request(d->req); /* frees it and resets the connection */
    d->cancelling = 0;
    d->failure = BG_PUSH_FAIL_TIMEOUT;
    attempt_ended(d);
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
    bg_time left = j->deadline_at > now + margin ? j->deadline_at - now - margin : 0;
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

/* A new connection for slot d; NULL on failure. */
static struct evhttp_connection *slot_connection(struct delivery *d)
{
    struct sub *s = d->sub;
    if (d->conn) return d->conn;
    d->conn = evhttp_connection_base_new(s->push->base, s->push->dns, s->spec.host, s->spec.port);
    if (!d->conn) return NULL;
    /* our own timer ends an attempt; libevent's must not come first */
    struct timeval tv = {(time_t)s->spec.timeout_s + 5, 0};
    evhttp_connection_set_timeout_tv(d->conn, &tv);
    evhttp_connection_set_retries(d->conn, 0);
    evhttp_connection_set_max_body_size(d->conn, PUSH_RESPONSE_BODY_MAX);
    evhttp_connection_set_max_headers_size(d->conn, HEADERS_MAX);
    return d->conn;
}

/* Start an attempt of job j (reserved by the holder) on slot d. */
static void attempt_start(struct delivery *d, const struct bg_job *j, bg_time now)
{
    struct sub *s = d->sub;
    d->job_id = j->id;
    d->reserves = j->reserves;
    d->status = 0;
    d->failure = BG_PUSH_FAIL_NONE;
    d->has_retry_after = 0;
    d->done = 0;
    d->started = now;
    s->attempts++;
    struct evhttp_connection *conn = slot_connection(d);
    struct evhttp_request *req = conn ? evhttp_request_new(on_response, d) : NULL;
    if (!req) {
        d->failure = BG_PUSH_FAIL_CONNECT;
        attempt_ended(d);
        return;
    }
    evhttp_request_set_header_cb(req, on_head);
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char id[24], num[24], ts[24];
    size_t body_len = j->body_size - 2;
    snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
    snprintf(ts, sizeof ts, "%lld", (long long)wall_seconds());
    evhttp_add_header(h, "Host", s->host_header);
    evhttp_add_header(h, "User-Agent", "beangate/" BEANGATE_VERSION);
    evhttp_add_header(h, "Content-Type", "application/octet-stream");
    evhttp_add_header(h, "X-Beangate-Job-Id", id);
    evhttp_add_header(h, "X-Beangate-Tube", j->tube->name);
    snprintf(num, sizeof num, "%u", j->pri);
    evhttp_add_header(h, "X-Beangate-Priority", num);
    snprintf(num, sizeof num, "%u", j->reserves);
    evhttp_add_header(h, "X-Beangate-Attempt", num);
    evhttp_add_header(h, "X-Beangate-Timestamp", ts);
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
        evhttp_add_header(h, "X-Beangate-Signature", sig);
    }
    evbuffer_add(evhttp_request_get_output_buffer(req), j->body, body_len);
    d->req = req;
    struct timeval tv = tv_of(attempt_timeout(s, j, now));
    evtimer_add(d->timer, &tv);
    /* a connect that fails at once may call on_response inside this call */
    if (evhttp_make_request(conn, req, EVHTTP_REQ_POST, s->spec.path) != 0 && !d->done) {
        d->failure = BG_PUSH_FAIL_CONNECT;
        attempt_ended(d);
    }
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
    if (j && j->state == BG_JOB_RESERVED && j->reserver == &s->holder && j->reserves == d->reserves &&
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
    d->reserves = j->reserves;
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
    if (!j || j->state != BG_JOB_RESERVED || j->reserves != d->reserves ||
        (j->reserver != &s->holder && j->reserver != &s->reserver)) {
        /* the engine took the reservation back (it cannot: an attempt ends
         * a margin before its reservation does, unless the loop stalled):
         * the job is not ours to touch */
        s->lost++;
        log_event(BG_LOG_WARN, "push_reservation_lost", "tube=%s job=%llu attempt=%u outcome=%s",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(reason));
        return;
    }
    struct bg_client *owner = j->reserver;
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
        log_event(BG_LOG_DEBUG, "push_retry", "tube=%s job=%llu attempt=%u reason=%s status=%u delay=%u",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(reason), d->status, delay);
        return;
    }
    case BG_PUSH_BURY: {
        enum bg_push_reason why = reason == BG_PUSH_HTTP_3XX || reason == BG_PUSH_HTTP_4XX
                                      ? reason : BG_PUSH_ATTEMPTS_EXHAUSTED;
        bg_bury(owner, d->job_id, pri, now);
        s->buried[why]++;
        record_failure(s, d, reason, 0);
        log_event(BG_LOG_WARN, "push_buried", "tube=%s job=%llu attempt=%u reason=%s failure=%s status=%u",
                  log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves,
                  bg_push_reason_name(why), bg_push_reason_name(reason), d->status);
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

/* Nonzero if host is an IPv4 or IPv6 address (no name to resolve). */
static int is_address(const char *host)
{
    unsigned char buf[16];
    return evutil_inet_pton(AF_INET, host, buf) == 1 || evutil_inet_pton(AF_INET6, host, buf) == 1;
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
    if (s->spec.port == 80)
        snprintf(s->host_header, sizeof s->host_header, v6 ? "[%s]" : "%s", s->spec.host);
    else
        snprintf(s->host_header, sizeof s->host_header, v6 ? "[%s]:%u" : "%s:%u", s->spec.host, s->spec.port);
    bg_rate_init(&s->rate, s->spec.rate_count, s->spec.rate_period);
    s->slots = calloc(s->spec.concurrency, sizeof *s->slots);
    s->rate_ev = evtimer_new(p->base, rate_cb, s);
    if (!s->slots || !s->rate_ev) return -1;
    for (uint32_t k = 0; k < s->spec.concurrency; k++) {
        s->slots[k].sub = s;
        if (!(s->slots[k].timer = evtimer_new(p->base, on_timeout, &s->slots[k]))) return -1;
    }
    uint32_t watching;
    if (bg_client_init_bare(p->engine, &s->reserver, &reserver_ops, s) != 0) return -1;
    if (bg_client_init_bare(p->engine, &s->holder, &bg_client_ops_never_wait, s) != 0) {
        bg_client_close(&s->reserver, p->now());
        return -1;
    }
    s->clients_up = 1;
    if (bg_client_watch(&s->reserver, s->spec.tube, &watching) != 0 ||
        bg_heap_reserve(&s->holder.reserved, s->spec.concurrency) != 0)
        return -1;
    return 0;
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
    int ok = p->kick_ev && p->grace_ev && p->subs;
    for (size_t i = 0; ok && i < setup->count; i++)
        if (!is_address(setup->specs[i].host) && !p->dns)
            ok = (p->dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS)) != NULL;
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
                  "backoff=%u..%u rate=%s signed=%s", log_str(s->spec.tube), log_str(s->spec.url),
                  s->spec.concurrency, s->spec.timeout_s, s->spec.attempts, s->spec.backoff_min_s,
                  s->spec.backoff_max_s, rate_text(s, rate, sizeof rate), s->signed_ ? "yes" : "no");
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
            if (d->req) {
                d->cancelling = 1;
                evhttp_cancel_request(d->req);
                d->req = NULL;
            }
            if (d->busy && s->clients_up) {
                /* back to ready, its priority kept; a cut attempt never buries */
                struct bg_job *j = bg_job_find(p->engine, d->job_id);
                if (j && j->state == BG_JOB_RESERVED &&
                    (j->reserver == &s->holder || j->reserver == &s->reserver))
                    bg_release(j->reserver, d->job_id, j->pri, 0, now);
                log_event(BG_LOG_INFO, "push_released", "tube=%s job=%llu attempt=%u reason=shutdown",
                          log_str(s->spec.tube), (unsigned long long)d->job_id, d->reserves);
                d->busy = 0;
            }
            if (d->timer) event_free(d->timer);
            if (d->conn) evhttp_connection_free(d->conn);
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
    if (p->dns) evdns_base_free(p->dns, 0);
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
            "last_error", s->last.job_id ? failure_json(&s->last, 1) : json_null(),
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

/* test_push.c - the pure parts of push delivery (core/push.c): the
 * subscription syntax, the retry policy, Retry-After, the rate limiter and
 * the table of last failures; and server/push.c's delivery slots against a
 * receiver in the same event loop, also behind a write-ahead log whose
 * syncs the test runs. Time is injected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "core.h"
#include "../../io/wal.h"
#include "../../server/push.h"
#include "tempdir.h"

/* ---- lists and specs ---------------------------------------------------- */

/* Every subscription of a list text, as "|"-joined words. */
static void split_all(const char *text, char *joined, size_t size)
{
    size_t pos = 0;
    unsigned line = 1;
    char one[256];
    joined[0] = '\0';
    while (bg_push_list_next(text, strlen(text), &pos, one, sizeof one, &line) == 1) {
        size_t n = strlen(joined);
        snprintf(joined + n, size - n, "%s%s@%u", n ? "|" : "", one, line);
    }
}

static void test_list_split(void **state)
{
    (void)state;
    char got[1024];
    split_all("tube=a url=x\ntube=b  url=y\n", got, sizeof got);
    assert_string_equal(got, "tube=a url=x@1|tube=b url=y@2");
    /* a ';' word separates; a ';' inside a word (tube names, URLs) does not */
    split_all("tube=a;b url=http://h/p;q ; tube=c url=z", got, sizeof got);
    assert_string_equal(got, "tube=a;b url=http://h/p;q@1|tube=c url=z@1");
    /* comments, blank lines, and a comment after words */
    split_all("# header\n\n  tube=a url=x # note\n\t# more\ntube=b url=y", got, sizeof got);
    assert_string_equal(got, "tube=a url=x@3|tube=b url=y@5");
    split_all("  \n # only comments\n;\n", got, sizeof got);
    assert_string_equal(got, "");
    /* too long for the buffer */
    char small[8];
    size_t pos = 0;
    unsigned line = 1;
    assert_int_equal(bg_push_list_next("tube=abcdefgh", 13, &pos, small, sizeof small, &line), BG_BAD_FORMAT);
}

static void test_spec_full_and_defaults(void **state)
{
    (void)state;
    struct bg_push_spec s;
    char why[200];
    assert_int_equal(bg_push_spec_parse("tube=emails url=http://127.0.0.1:8080/jobs?x=1 concurrency=8 "
                                        "rate=50/s timeout=30 attempts=10 backoff=1..600 "
                                        "secret-file=/etc/beangate/emails.key", &s, why, sizeof why), 0);
    assert_string_equal(s.tube, "emails");
    assert_string_equal(s.host, "127.0.0.1");
    assert_int_equal(s.port, 8080);
    assert_string_equal(s.path, "/jobs?x=1");
    assert_string_equal(s.url, "http://127.0.0.1:8080/jobs?x=1");
    assert_int_equal(s.concurrency, 8);
    assert_int_equal(s.rate_count, 50);
    assert_true(s.rate_period == BG_SECOND);
    assert_int_equal(s.timeout_s, 30);
    assert_int_equal(s.attempts, 10);
    assert_int_equal(s.backoff_min_s, 1);
    assert_int_equal(s.backoff_max_s, 600);
    assert_string_equal(s.secret_file, "/etc/beangate/emails.key");

    assert_int_equal(bg_push_spec_parse("url=HTTP://[::1]:9000 tube=t", &s, why, sizeof why), 0);
    assert_string_equal(s.host, "::1");
    assert_int_equal(s.port, 9000);
    assert_string_equal(s.path, "/");
    assert_int_equal(s.concurrency, BG_PUSH_DEFAULT_CONCURRENCY);
    assert_int_equal(s.rate_count, 0);
    assert_int_equal(s.timeout_s, BG_PUSH_DEFAULT_TIMEOUT);
    assert_int_equal(s.attempts, BG_PUSH_DEFAULT_ATTEMPTS);
    assert_int_equal(s.backoff_min_s, BG_PUSH_DEFAULT_BACKOFF_MIN);
    assert_int_equal(s.backoff_max_s, BG_PUSH_DEFAULT_BACKOFF_MAX);
    assert_string_equal(s.secret_file, "");

    assert_int_equal(bg_push_spec_parse("tube=t url=http://receiver.internal?a=b rate=120/m", &s, why, sizeof why), 0);
    assert_string_equal(s.host, "receiver.internal");
    assert_int_equal(s.port, 80);
    assert_string_equal(s.path, "/?a=b");
    assert_true(s.rate_period == 60 * BG_SECOND);
    assert_int_equal(s.tls, 0);
}

/* https:// (issue 23): port 443 by default, and the TLS files. */
static void test_spec_https(void **state)
{
    (void)state;
    struct bg_push_spec s;
    char why[200];
    assert_int_equal(bg_push_spec_parse("tube=t url=HTTPS://hooks.example/in?a=1", &s, why, sizeof why), 0);
    assert_int_equal(s.tls, 1);
    assert_string_equal(s.host, "hooks.example");
    assert_int_equal(s.port, 443);
    assert_string_equal(s.path, "/in?a=1");
    assert_string_equal(s.ca_file, "");
    assert_string_equal(s.cert_file, "");
    assert_string_equal(s.key_file, "");

    assert_int_equal(bg_push_spec_parse("tube=t url=https://[::1]:8443 ca-file=/etc/ca.pem "
                                        "cert-file=/etc/me.pem key-file=/etc/me.key", &s, why, sizeof why), 0);
    assert_int_equal(s.tls, 1);
    assert_string_equal(s.host, "::1");
    assert_int_equal(s.port, 8443);
    assert_string_equal(s.path, "/");
    assert_string_equal(s.ca_file, "/etc/ca.pem");
    assert_string_equal(s.cert_file, "/etc/me.pem");
    assert_string_equal(s.key_file, "/etc/me.key");
    assert_string_equal(bg_push_reason_name(bg_push_classify(0, 0, BG_PUSH_FAIL_TLS)), "tls_error");
    assert_int_equal(bg_push_action_of(BG_PUSH_TLS_FAILED, 1, 3), BG_PUSH_RELEASE);
    assert_int_equal(bg_push_action_of(BG_PUSH_TLS_FAILED, 3, 3), BG_PUSH_BURY);
}

static const struct bad_spec {
    const char *text;
    const char *why_has; /* a piece of the message */
} bad_specs[] = {
    {"tube=t url=ftp://h/", "must start with http:// or https://"},
    {"tube=t url=http://h:1/ ca-file=/ca.pem", "need an https:// url"},
    {"tube=t url=http://h:1/ cert-file=/c.pem key-file=/k.pem", "need an https:// url"},
    {"tube=t url=https://h:1/ cert-file=/c.pem", "go together"},
    {"tube=t url=https://h:1/ key-file=/k.pem", "go together"},
    {"tube=t url=https://h:1/ ca-file=", "ca-file: a path"},
    {"tube=t url=https://h:1/ ca-file=/a ca-file=/b", "given twice"},
    {"tube=t url=https://u@h:1/", "user or password"},
    {"tube=t url=http://:80/", "no host"},
    {"tube=t url=http:///x", "no host"},
    {"tube=t url=http://u:p@h:1/", "user or password"},
    {"tube=t url=http://h:1/#frag", "fragment"},
    {"tube=t url=http://h:0/", "port"},
    {"tube=t url=http://h:65536/", "port"},
    {"tube=t url=http://h:x/", "port"},
    {"tube=t url=http://h_a:1/", "host name"},
    {"tube=t url=http://[::1/", "closing ]"},
    {"tube=t url=http://[::1]x/", "after the IPv6"},
    {"tube=t", "url= is missing"},
    {"url=http://h:1/", "tube= is missing"},
    {"tube=-t url=http://h:1/", "tube name"},
    {"tube=t url=http://h:1/ colour=red", "unknown key 'colour'"},
    {"tube=t url=http://h:1/ tube=u", "given twice"},
    {"tube=t url=http://h:1/ concurrency", "not key=value"},
    {"tube=t url=http://h:1/ concurrency=0", "concurrency"},
    {"tube=t url=http://h:1/ concurrency=1025", "concurrency"},
    {"tube=t url=http://h:1/ timeout=0", "timeout"},
    {"tube=t url=http://h:1/ timeout=86401", "timeout"},
    {"tube=t url=http://h:1/ attempts=0", "attempts"},
    {"tube=t url=http://h:1/ backoff=5..1", "backoff"},
    {"tube=t url=http://h:1/ backoff=0..1", "backoff"},
    {"tube=t url=http://h:1/ backoff=5", "backoff"},
    {"tube=t url=http://h:1/ backoff=1..604801", "backoff"},
    {"tube=t url=http://h:1/ rate=5", "rate"},
    {"tube=t url=http://h:1/ rate=0/s", "rate"},
    {"tube=t url=http://h:1/ rate=5/d", "rate"},
    {"tube=t url=http://h:1/ secret-file=", "secret-file"},
};

static void test_spec_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
        struct bg_push_spec s;
        char why[200] = "";
        int rc = bg_push_spec_parse(bad_specs[i].text, &s, why, sizeof why);
        if (rc != BG_BAD_FORMAT) fail_msg("'%s' was accepted", bad_specs[i].text);
        if (!strstr(why, bad_specs[i].why_has))
            fail_msg("'%s': message '%s' lacks '%s'", bad_specs[i].text, why, bad_specs[i].why_has);
    }
}

/* ---- the retry policy --------------------------------------------------- */

static void test_classify(void **state)
{
    (void)state;
    static const struct {
        unsigned status;
        int retry_after;
        enum bg_push_failure failure;
        enum bg_push_reason reason;
    } cases[] = {
        {200, 0, BG_PUSH_FAIL_NONE, BG_PUSH_DELIVERED},
        {204, 1, BG_PUSH_FAIL_NONE, BG_PUSH_DELIVERED},   /* Retry-After on a 2xx means nothing */
        {299, 0, BG_PUSH_FAIL_CONNECTION, BG_PUSH_DELIVERED}, /* the head came: the status decides */
        {500, 0, BG_PUSH_FAIL_NONE, BG_PUSH_HTTP_5XX},
        {503, 1, BG_PUSH_FAIL_NONE, BG_PUSH_RETRY_AFTER},
        {429, 0, BG_PUSH_FAIL_NONE, BG_PUSH_HTTP_429},
        {400, 1, BG_PUSH_FAIL_NONE, BG_PUSH_RETRY_AFTER}, /* any Retry-After asks for a retry */
        {404, 0, BG_PUSH_FAIL_NONE, BG_PUSH_HTTP_4XX},
        {301, 0, BG_PUSH_FAIL_NONE, BG_PUSH_HTTP_3XX},
        {600, 0, BG_PUSH_FAIL_NONE, BG_PUSH_BAD_STATUS},
        {0, 0, BG_PUSH_FAIL_TIMEOUT, BG_PUSH_TIMEOUT},
        {0, 0, BG_PUSH_FAIL_CONNECT, BG_PUSH_CONNECT_FAILED},
        {0, 0, BG_PUSH_FAIL_CONNECTION, BG_PUSH_CONNECTION_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum bg_push_reason r = bg_push_classify(cases[i].status, cases[i].retry_after, cases[i].failure);
        if (r != cases[i].reason)
            fail_msg("case %zu (status %u): %s, want %s", i, cases[i].status, bg_push_reason_name(r),
                     bg_push_reason_name(cases[i].reason));
    }
    assert_string_equal(bg_push_reason_name(BG_PUSH_HTTP_5XX), "http_5xx");
    assert_string_equal(bg_push_reason_name(BG_PUSH_REASON_COUNT), "unknown");
}

static void test_actions(void **state)
{
    (void)state;
    assert_int_equal(bg_push_action_of(BG_PUSH_DELIVERED, 5, 5), BG_PUSH_DELETE);
    assert_int_equal(bg_push_action_of(BG_PUSH_HTTP_5XX, 1, 3), BG_PUSH_RELEASE);
    assert_int_equal(bg_push_action_of(BG_PUSH_HTTP_5XX, 2, 3), BG_PUSH_RELEASE);
    assert_int_equal(bg_push_action_of(BG_PUSH_HTTP_5XX, 3, 3), BG_PUSH_BURY);
    assert_int_equal(bg_push_action_of(BG_PUSH_TIMEOUT, 9, 3), BG_PUSH_BURY); /* kicked, then failed */
    assert_int_equal(bg_push_action_of(BG_PUSH_HTTP_4XX, 1, 3), BG_PUSH_BURY);
    assert_int_equal(bg_push_action_of(BG_PUSH_HTTP_3XX, 1, 3), BG_PUSH_BURY);
    assert_int_equal(bg_push_action_of(BG_PUSH_RETRY_AFTER, 3, 3), BG_PUSH_BURY);
    assert_int_equal(bg_push_action_of(BG_PUSH_SHUTDOWN, 3, 3), BG_PUSH_RELEASE); /* never buries */
    assert_int_equal(bg_push_action_of(BG_PUSH_CONNECT_FAILED, 1, 1), BG_PUSH_BURY);
}

static void test_backoff(void **state)
{
    (void)state;
    /* the first retry waits the minimum; the ceiling doubles up to max */
    for (uint64_t r = 0; r < 50; r++) assert_int_equal(bg_push_backoff(2, 600, 1, r), 2);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint64_t r = 0; r < 1000; r++) {
        uint32_t d = bg_push_backoff(2, 600, 4, r * 0x9E3779B97F4A7C15ull);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    assert_int_equal(lo, 2);
    assert_int_equal(hi, 16); /* 2 * 2^3 */
    for (uint64_t r = 0; r < 1000; r++) {
        uint32_t d = bg_push_backoff(1, 600, 1000000, r * 0x9E3779B97F4A7C15ull);
        assert_true(d >= 1 && d <= 600);
    }
    assert_int_equal(bg_push_backoff(1, 600, 1000000, 599), 600);
    assert_int_equal(bg_push_backoff(7, 7, 30, 12345), 7);
    assert_int_equal(bg_push_backoff(BG_PUSH_BACKOFF_MAX, BG_PUSH_BACKOFF_MAX, UINT32_MAX, UINT64_MAX),
                     BG_PUSH_BACKOFF_MAX);
    /* a receiver's Retry-After is kept within the backoff's bounds */
    assert_int_equal(bg_push_retry_delay(0, 1, 600), 1);
    assert_int_equal(bg_push_retry_delay(30, 1, 600), 30);
    assert_int_equal(bg_push_retry_delay(UINT64_MAX, 1, 600), 600);
}

static void test_retry_after(void **state)
{
    (void)state;
    const int64_t date = 784111777; /* Sun, 06 Nov 1994 08:49:37 GMT */
    uint64_t d;
    int64_t at;
    assert_int_equal(bg_push_retry_after("120", 0, &d), 0);
    assert_int_equal(d, 120);
    assert_int_equal(bg_push_retry_after(" 5 ", 0, &d), 0);
    assert_int_equal(d, 5);
    assert_int_equal(bg_push_retry_after("99999999999999999999999", 0, &d), 0);
    assert_true(d == UINT64_MAX);
    assert_int_equal(bg_http_date_parse("Sun, 06 Nov 1994 08:49:37 GMT", &at), 0);
    assert_true(at == date);
    assert_int_equal(bg_http_date_parse("Sunday, 06-Nov-94 08:49:37 GMT", &at), 0);
    assert_true(at == date);
    assert_int_equal(bg_http_date_parse("Sun Nov  6 08:49:37 1994", &at), 0);
    assert_true(at == date);
    assert_int_equal(bg_http_date_parse("Thu, 01 Jan 1970 00:00:00 GMT", &at), 0);
    assert_true(at == 0);
    assert_int_equal(bg_http_date_parse("Tue, 29 Feb 2028 23:59:59 GMT", &at), 0);
    assert_true(at == 1835481599);
    assert_int_equal(bg_push_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", date, &d), 0);
    assert_int_equal(d, 30);
    assert_int_equal(bg_push_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date + 100, &d), 0);
    assert_int_equal(d, 0); /* in the past */
    static const char *const bad[] = {"", "-1", "1.5", "5s", "Sun, 06 Nov 1994 08:49:37 UTC",
                                      "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 32 Nov 1994 08:49:37 GMT",
                                      "Sun, 06 Foo 1994 08:49:37 GMT", "06 Nov 1994 08:49:37 GMT",
                                      "Sun, 06 Nov 1994 08:49:37 GMT x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (bg_push_retry_after(bad[i], 0, &d) != BG_BAD_FORMAT) fail_msg("'%s' was accepted", bad[i]);
}

/* ---- the rate limiter ---------------------------------------------------- */

/* How many of n jobs may start by each call, one every `step` from t0. */
static void test_rate(void **state)
{
    (void)state;
    struct bg_rate r;
    bg_rate_init(&r, 5, BG_SECOND);
    bg_time now = 1000 * BG_SECOND;
    for (int i = 0; i < 5; i++) { /* a burst of one second's worth */
        assert_true(bg_rate_ready_at(&r, now) == now);
        bg_rate_take(&r, now);
    }
    assert_true(bg_rate_ready_at(&r, now) == now + BG_SECOND / 5);
    now += BG_SECOND / 5;
    assert_true(bg_rate_ready_at(&r, now) == now);
    bg_rate_take(&r, now);
    assert_true(bg_rate_ready_at(&r, now) == now + BG_SECOND / 5);
    /* idle long enough, the burst is back, not more */
    now += 10 * BG_SECOND;
    for (int i = 0; i < 5; i++) {
        assert_true(bg_rate_ready_at(&r, now) == now);
        bg_rate_take(&r, now);
    }
    assert_true(bg_rate_ready_at(&r, now) > now);

    bg_rate_init(&r, 120, 60 * BG_SECOND); /* 2/s: burst 2 */
    now = 5 * BG_SECOND;
    bg_rate_take(&r, now);
    bg_rate_take(&r, now);
    assert_true(bg_rate_ready_at(&r, now) == now + BG_SECOND / 2);
    bg_rate_init(&r, 30, 60 * BG_SECOND); /* 1 every 2 s: no burst */
    bg_rate_take(&r, now);
    assert_true(bg_rate_ready_at(&r, now) == now + 2 * BG_SECOND);
    bg_rate_init(&r, 0, 0); /* unlimited */
    for (int i = 0; i < 1000; i++) bg_rate_take(&r, now);
    assert_true(bg_rate_ready_at(&r, now) == now);
}

/* ---- the table of last failures ----------------------------------------- */

static void rec_of(struct bg_push_failure_rec *r, uint64_t id, uint32_t attempt)
{
    memset(r, 0, sizeof *r);
    r->job_id = id;
    r->attempt = attempt;
    r->status = 500;
    r->reason = BG_PUSH_HTTP_5XX;
}

static void collect(void *ctx, const struct bg_push_failure_rec *rec)
{
    char *s = ctx;
    size_t n = strlen(s);
    snprintf(s + n, 256 - n, "%s%llu", n ? "," : "", (unsigned long long)rec->job_id);
}

static void test_failures_bounded(void **state)
{
    (void)state;
    struct bg_push_failures t;
    struct bg_push_failure_rec r;
    bg_push_failures_init(&t, 3);
    assert_null(bg_push_failures_get(&t, 1));
    for (uint64_t id = 1; id <= 3; id++) {
        rec_of(&r, id, (uint32_t)id);
        assert_int_equal(bg_push_failures_set(&t, &r), 0);
    }
    rec_of(&r, 1, 7); /* an update makes 1 the newest */
    assert_int_equal(bg_push_failures_set(&t, &r), 0);
    assert_int_equal(bg_push_failures_get(&t, 1)->attempt, 7);
    rec_of(&r, 4, 1); /* full: 2, the oldest, goes */
    assert_int_equal(bg_push_failures_set(&t, &r), 0);
    assert_null(bg_push_failures_get(&t, 2));
    assert_int_equal(t.count, 3);
    assert_true(t.evicted == 1);
    char order[256] = "";
    bg_push_failures_each(&t, collect, order);
    assert_string_equal(order, "3,1,4");
    bg_push_failures_remove(&t, 3);
    bg_push_failures_remove(&t, 99); /* absent: nothing */
    assert_null(bg_push_failures_get(&t, 3));
    assert_int_equal(t.count, 2);
    rec_of(&r, 5, 1); /* a removed slot is used again: no eviction */
    assert_int_equal(bg_push_failures_set(&t, &r), 0);
    assert_true(t.evicted == 1);
    rec_of(&r, 0, 1);
    assert_int_equal(bg_push_failures_set(&t, &r), BG_BAD_FORMAT);
    bg_push_failures_free(&t);
}

static void test_failures_grow(void **state)
{
    (void)state;
    struct bg_push_failures t;
    struct bg_push_failure_rec r;
    bg_push_failures_init(&t, 1000);
    for (uint64_t id = 1; id <= 700; id++) {
        rec_of(&r, id * 3, (uint32_t)id);
        assert_int_equal(bg_push_failures_set(&t, &r), 0);
    }
    assert_int_equal(t.count, 700);
    assert_int_equal(t.cap, 1000); /* 64, 128, ... 512, then the limit */
    for (uint64_t id = 1; id <= 700; id++) {
        const struct bg_push_failure_rec *got = bg_push_failures_get(&t, id * 3);
        assert_non_null(got);
        assert_int_equal(got->attempt, id);
        assert_null(bg_push_failures_get(&t, id * 3 + 1));
    }
    for (uint64_t id = 701; id <= 1500; id++) {
        rec_of(&r, id * 3, (uint32_t)id);
        assert_int_equal(bg_push_failures_set(&t, &r), 0);
    }
    assert_int_equal(t.count, 1000);
    assert_true(t.evicted == 500);
    assert_null(bg_push_failures_get(&t, 500 * 3));
    assert_non_null(bg_push_failures_get(&t, 501 * 3));
    bg_push_failures_free(&t);
}

/* A failed allocation records nothing and leaves the table usable. */
static void test_failures_out_of_memory(void **state)
{
    (void)state;
    struct bg_push_failures t;
    struct bg_push_failure_rec r;
    bg_push_failures_init(&t, 100);
    rec_of(&r, 1, 1);
    bg_alloc_fail_after(1);
    assert_int_equal(bg_push_failures_set(&t, &r), BG_OUT_OF_MEMORY);
    assert_null(bg_push_failures_get(&t, 1));
    bg_alloc_fail_after(0);
    assert_int_equal(bg_push_failures_set(&t, &r), 0);
    assert_non_null(bg_push_failures_get(&t, 1));
    bg_push_failures_free(&t);
}


/* ---- delivery slots (server/push.c) ----------------------------------- */

/* A receiver in the test's own event loop: 2xx for the job named `good`,
 * 500 for every other. Answering `good` first moves the injected clock to
 * `advance_to`, so a delayed job comes due while that 2xx is on its way. */
struct slot_world {
    struct event_base *base;
    struct evhttp *http;
    struct bg_engine engine;
    struct bg_client producer;
    uint64_t good;
    bg_time advance_to;
    unsigned answered_good, answered_bad;
};

static bg_time fake_clock;
static bg_time fake_now(void) { return fake_clock; }

static void receiver_cb(struct evhttp_request *req, void *arg)
{
    struct slot_world *w = arg;
    const char *id = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Beangate-Job-Id");
    if (id && strtoull(id, NULL, 10) == w->good) {
        fake_clock = w->advance_to;
        w->answered_good++;
        evhttp_send_reply(req, 204, "No Content", NULL);
    } else {
        w->answered_bad++;
        evhttp_send_reply(req, 500, "Internal Server Error", NULL);
    }
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* A figure of the only subscription (GET /subscriptions). */
static json_int_t sub_figure(struct push *p, const char *name)
{
    json_t *list = push_subscriptions_json(p);
    json_int_t v = json_integer_value(json_object_get(json_array_get(list, 0), name));
    json_decref(list);
    return v;
}

/* Issue 21, defect 12: with two slots, job B (ready) goes out on one while
 * the reserver waits with the other free; job A is delayed and comes due
 * exactly when B's 2xx is finished. A must start on the free slot and get
 * its own outcome (500: released for a retry); B's 2xx deletes B and only
 * B. Before the fix, finish() freed B's slot before the catch-up that made
 * A due, A took that slot, B's 2xx deleted A (never delivered), B stayed
 * reserved, and A's 500 then counted a lost reservation. */
static void test_outcome_stays_with_its_attempt(void **state)
{
    (void)state;
    struct slot_world w;
    memset(&w, 0, sizeof w);
    fake_clock = 1000 * BG_SECOND;
    w.advance_to = fake_clock + 10 * BG_SECOND;
    assert_non_null(w.base = event_base_new());
    assert_non_null(w.http = evhttp_new(w.base));
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(w.http, "127.0.0.1", 0);
    assert_non_null(bound);
    evhttp_set_gencb(w.http, receiver_cb, &w);
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&addr, &alen), 0);

    assert_int_equal(bg_engine_init(&w.engine, 65535, NULL), 0);
    assert_int_equal(bg_client_init_bare(&w.engine, &w.producer, &bg_client_ops_never_wait, NULL), 0);
    uint64_t a_id = 0;
    assert_int_equal(bg_put_copy(&w.producer, "t", 1, 0, 60, "b", 1, fake_clock, &w.good), 0);
    assert_int_equal(bg_put_copy(&w.producer, "t", 1, 10, 60, "a", 1, fake_clock, &a_id), 0);

    char text[200];
    snprintf(text, sizeof text, "tube=t url=http://127.0.0.1:%u/ concurrency=2 attempts=5 backoff=1..1",
             (unsigned)ntohs(addr.sin_port));
    struct push_source src = {text, "test"};
    struct push_setup setup;
    assert_int_equal(push_setup_load(&setup, &src, 1, NULL, 1), 0);
    struct push *p = push_start(&setup, w.base, &w.engine, fake_now, NULL, NULL);
    assert_non_null(p);

    /* the loop turns until both answers were acted on (10 s of wall time at most) */
    struct event *wake = event_new(w.base, -1, EV_PERSIST, wake_cb, NULL);
    struct timeval tick = {0, 20000};
    event_add(wake, &tick);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        event_base_loop(w.base, EVLOOP_ONCE);
        if (w.answered_good && w.answered_bad && sub_figure(p, "in_flight") == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) fail_msg("the deliveries did not end within 10 s");
    }

    assert_int_equal(w.answered_good, 1);
    assert_int_equal(w.answered_bad, 1);
    assert_null(bg_job_find(&w.engine, w.good));           /* its 2xx deleted it */
    struct bg_job *a = bg_job_find(&w.engine, a_id);
    assert_non_null(a);                                     /* answered only 500: kept */
    assert_int_equal(a->state, BG_JOB_DELAYED);             /* released for its retry */
    assert_int_equal(sub_figure(p, "delivered"), 1);
    assert_int_equal(sub_figure(p, "reservations_lost"), 0);

    push_free(p);
    push_setup_free(&setup);
    event_free(wake);
    evhttp_free(w.http);
    bg_client_close(&w.producer, fake_clock);
    bg_engine_destroy(&w.engine);
    event_base_free(w.base);
}

/* ---- deliveries that wait for their put's sync --------------------------- */

/* A receiver that answers every job 204 after `answer_after` of injected
 * time, and a write-ahead log (synchronous: nothing is synced until the
 * test runs the flusher) that push delivery waits for. */
struct held_world {
    char dir[40];
    struct event_base *base;
    struct evhttp *http;
    struct bg_engine engine;
    struct bg_client producer;
    struct wal *wal;
    struct push_setup setup;
    struct push *push;
    struct event *wake;
    uint16_t port;
    bg_time answer_after;
    unsigned answered;
    unsigned last_attempt;      /* X-Beangate-Attempt of the last request */
};

static void held_receiver_cb(struct evhttp_request *req, void *arg)
{
    struct held_world *w = arg;
    const char *attempt = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Beangate-Attempt");
    w->last_attempt = attempt ? (unsigned)strtoul(attempt, NULL, 10) : 0;
    fake_clock += w->answer_after;
    w->answered++;
    evhttp_send_reply(req, 204, "No Content", NULL);
}

/* The receiver, the engine and its log; no subscription yet. */
static void held_world_open(struct held_world *w)
{
    memset(w, 0, sizeof *w);
    fake_clock = 1000 * BG_SECOND;
    tempdir_make(w->dir, sizeof w->dir, "push");
    assert_non_null(w->base = event_base_new());
    assert_non_null(w->http = evhttp_new(w->base));
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(w->http, "127.0.0.1", 0);
    assert_non_null(bound);
    evhttp_set_gencb(w->http, held_receiver_cb, w);
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&addr, &alen), 0);
    w->port = ntohs(addr.sin_port);
    assert_int_equal(bg_engine_init(&w->engine, 65535, NULL), 0);
    struct wal_config cfg = {.dir = w->dir, .fsync_ms = 0, .segment_size = 1 << 20, .synchronous = 1};
    assert_int_equal(wal_open(&w->wal, &cfg, &w->engine, w->base, fake_clock,
                              (uint64_t)time(NULL) * BG_SECOND), 0);
    assert_int_equal(bg_client_init_bare(&w->engine, &w->producer, &bg_client_ops_never_wait, NULL), 0);
    assert_non_null(w->wake = event_new(w->base, -1, EV_PERSIST, wake_cb, NULL));
    struct timeval tick = {0, 20000};
    event_add(w->wake, &tick);
}

/* Start push delivery of tube t to the receiver with `options`. */
static void held_world_push(struct held_world *w, const char *options)
{
    char text[200];
    snprintf(text, sizeof text, "tube=t url=http://127.0.0.1:%u/ %s", (unsigned)w->port, options);
    struct push_source src = {text, "test"};
    assert_int_equal(push_setup_load(&w->setup, &src, 1, NULL, 1), 0);
    assert_non_null(w->push = push_start(&w->setup, w->base, &w->engine, fake_now, NULL, NULL));
    push_set_log(w->push, w->wal);
}

static void held_world_close(struct held_world *w)
{
    push_free(w->push);
    push_setup_free(&w->setup);
    event_free(w->wake);
    evhttp_free(w->http);
    bg_client_close(&w->producer, fake_clock);
    wal_close(w->wal);
    bg_engine_destroy(&w->engine);
    event_base_free(w->base);
    tempdir_remove(w->dir);
}

/* Turn the loop until `answered` answers were given and nothing is in
 * flight (10 s of wall time at most). */
static void held_world_run(struct held_world *w, unsigned answered)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        event_base_loop(w->base, EVLOOP_ONCE);
        if (w->answered >= answered && sub_figure(w->push, "in_flight") == 0) return;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) fail_msg("the deliveries did not end within 10 s");
    }
}

/* Turn the loop until `n` jobs are taken (10 s of wall time at most). */
static void held_world_wait_taken(struct held_world *w, json_int_t n)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (sub_figure(w->push, "in_flight") != n) {
        event_base_loop(w->base, EVLOOP_ONCE);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) fail_msg("%d jobs were not taken within 10 s", (int)n);
    }
}

/* The log syncs what was appended: the holds it secures end. */
static void held_world_sync(struct held_world *w)
{
    wal_kick(w->wal);
    wal_run_flusher(w->wal);
}

/* Issue 21, push-hold 1: a delivery waits 1.5 s for its put's sync (TTR
 * 3 s, timeout 10 s: the attempt's timeout is 2 s), then the receiver
 * answers 204 after 1.9 s, inside that timeout. The 2xx must delete the
 * job, delivered once. Before the fix the attempt's timeout was counted
 * from the full TTR at the send, while the reservation had run since the
 * job was taken: its TTR ended under the attempt at 1.5 s, the job went to
 * the free slot and was delivered a second time, and the first 2xx counted
 * a lost reservation. */
static void test_attempt_gets_its_ttr_after_a_hold(void **state)
{
    (void)state;
    struct held_world w;
    held_world_open(&w);
    uint64_t id;
    assert_int_equal(bg_put_copy(&w.producer, "t", 1, 0, 3, "j", 1, fake_clock, &id), 0);
    held_world_push(&w, "concurrency=2 timeout=10 attempts=5 backoff=1..1");
    held_world_wait_taken(&w, 1);
    assert_int_equal(w.answered, 0); /* held: its put is not synced */
    fake_clock += BG_SECOND * 3 / 2;
    w.answer_after = BG_SECOND * 19 / 10;
    held_world_sync(&w);
    held_world_run(&w, 1);

    assert_int_equal(w.answered, 1);
    assert_null(bg_job_find(&w.engine, id));
    assert_int_equal(sub_figure(w.push, "delivered"), 1);
    assert_int_equal(sub_figure(w.push, "attempts_started"), 1);
    assert_int_equal(sub_figure(w.push, "reservations_lost"), 0);
    held_world_close(&w);
}

/* Issue 21, push-hold 2: the put waits for the log longer than the job's
 * TTR (2 s). The reservation ends as any TTR does (the job is ready
 * again); the held slot is freed without an attempt, a failure or a lost
 * reservation, and the job is delivered once, on its next reservation.
 * `tick`: the server's clock runs the engine's timers during the wait (a
 * second slot then takes the job again and waits too); without it the end
 * of the TTR is seen only when the log comes back. Before the fix, the
 * held slot's end counted a connect failure and a lost reservation, or
 * (no tick) sent the job under an ended TTR and delivered it twice. */
static void expired_hold(uint32_t concurrency, int tick)
{
    struct held_world w;
    held_world_open(&w);
    uint64_t id;
    assert_int_equal(bg_put_copy(&w.producer, "t", 1, 0, 2, "j", 1, fake_clock, &id), 0);
    char options[100];
    snprintf(options, sizeof options, "concurrency=%u timeout=10 attempts=5 backoff=1..1", concurrency);
    held_world_push(&w, options);
    held_world_wait_taken(&w, 1);
    fake_clock += 5 * BG_SECOND;
    if (tick) {
        bg_engine_catch_up(&w.engine, fake_clock); /* the TTR ends: ready, taken again */
        held_world_wait_taken(&w, concurrency < 2 ? 1 : 2);
    }
    assert_int_equal(w.answered, 0);
    held_world_sync(&w);
    held_world_run(&w, 1);

    assert_int_equal(w.answered, 1);
    assert_int_equal(w.last_attempt, 2); /* the job's second reservation */
    assert_null(bg_job_find(&w.engine, id));
    assert_int_equal(sub_figure(w.push, "delivered"), 1);
    assert_int_equal(sub_figure(w.push, "attempts_started"), 1);
    assert_int_equal(sub_figure(w.push, "retried"), 0);
    assert_int_equal(sub_figure(w.push, "reservations_lost"), 0);
    json_t *list = push_subscriptions_json(w.push);
    assert_true(json_is_null(json_object_get(json_array_get(list, 0), "last_error")));
    json_decref(list);
    held_world_close(&w);
}

static void test_expired_hold_frees_its_slot(void **state)
{
    (void)state;
    expired_hold(2, 1);
}

static void test_expired_hold_seen_when_the_log_returns(void **state)
{
    (void)state;
    expired_hold(1, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_split),
        cmocka_unit_test(test_spec_full_and_defaults),
        cmocka_unit_test(test_spec_https),
        cmocka_unit_test(test_spec_refusals),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_actions),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_rate),
        cmocka_unit_test(test_failures_bounded),
        cmocka_unit_test(test_failures_grow),
        cmocka_unit_test(test_failures_out_of_memory),
        cmocka_unit_test(test_outcome_stays_with_its_attempt),
        cmocka_unit_test(test_attempt_gets_its_ttr_after_a_hold),
        cmocka_unit_test(test_expired_hold_frees_its_slot),
        cmocka_unit_test(test_expired_hold_seen_when_the_log_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

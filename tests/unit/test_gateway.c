/* test_gateway.c - unit tests of the gateway: the route table, the error
 * table, JSON rendering of jobs, base64, reservation tokens, the
 * idempotency table and pages of tubes, data-driven where the cases are a
 * table; and the gateway in this process on a loopback port, with the
 * engine's time injected, to see that a request is matched once across the
 * access-handler calls of its body, a long-poll's resumption and a
 * response held for the log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../gateway/gateway.h"
#include "../../io/loop.h"
#include "tempdir.h"

/* ---- routing ----------------------------------------------------------- */

/* Every row of the route table, reached by a request: the row's method,
 * handler, body limit, auth rule and command counter, its path parameter,
 * and the Allow header of its path (the methods of the rows that share it). */
static const struct row_case {
    const char *method, *url;
    gw_handler handler;
    enum gw_body_limit body;
    enum gw_auth_rule auth;
    int command;
    const char *seg1;            /* the path parameter, if any */
    const char *allow;           /* Allow of a 405 on this path */
} row_cases[] = {
    {"GET", "/stats", gw_handle_stats, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS, NULL, "GET, HEAD"},
    {"GET", "/stats/tubes", gw_handle_stats_tubes, GW_BODY_NONE, GW_AUTH_TOKEN, -1, "tubes", "GET, HEAD"},
    {"GET", "/stats/history", gw_handle_stats_history, GW_BODY_NONE, GW_AUTH_TOKEN, -1, "history", "GET, HEAD"},
    {"GET", "/tubes", gw_handle_tubes, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_LIST_TUBES, NULL, "GET, HEAD"},
    {"GET", "/tubes/emails", gw_handle_tube, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS_TUBE, "emails",
     "GET, HEAD"},
    {"GET", "/tubes/emails/jobs", gw_handle_tube_jobs, GW_BODY_NONE, GW_AUTH_TOKEN, -1, "emails",
     "GET, HEAD, POST, DELETE"},
    {"POST", "/tubes/emails/jobs", gw_handle_put, GW_BODY_JOB, GW_AUTH_TOKEN, BG_CMD_PUT, "emails",
     "GET, HEAD, POST, DELETE"},
    {"DELETE", "/tubes/emails/jobs", gw_handle_tube_jobs_delete, GW_BODY_NONE, GW_AUTH_TOKEN, -1,
     "emails", "GET, HEAD, POST, DELETE"},
    {"POST", "/tubes/emails/jobs/batch", gw_handle_batch_put, GW_BODY_BATCH, GW_AUTH_TOKEN, BG_CMD_PUT,
     "emails", "POST"},
    {"POST", "/tubes/a/reservations", gw_handle_tube_reserve, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_RESERVE_WITH_TIMEOUT, "a", "POST"},
    {"POST", "/tubes/a/kick", gw_handle_tube_kick, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_KICK, "a", "POST"},
    {"POST", "/tubes/a/pause", gw_handle_tube_pause, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PAUSE_TUBE, "a",
     "POST"},
    {"GET", "/tubes/a/ready", gw_handle_peek_ready, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK_READY, "a",
     "GET, HEAD"},
    {"GET", "/tubes/a/delayed", gw_handle_peek_delayed, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK_DELAYED,
     "a", "GET, HEAD"},
    {"GET", "/tubes/a/buried", gw_handle_peek_buried, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK_BURIED, "a",
     "GET, HEAD"},
    {"POST", "/reservations", gw_handle_reserve, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_RESERVE_WITH_TIMEOUT,
     NULL, "POST"},
    {"GET", "/jobs/12", gw_handle_job, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_STATS_JOB, "12",
     "GET, HEAD, DELETE"},
    {"DELETE", "/jobs/12", gw_handle_job_delete, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_DELETE, "12",
     "GET, HEAD, DELETE"},
    {"GET", "/jobs/12/body", gw_handle_job_body, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_PEEK, "12", "GET, HEAD"},
    {"POST", "/jobs/12/release", gw_handle_job_release, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_RELEASE, "12",
     "POST"},
    {"POST", "/jobs/12/bury", gw_handle_job_bury, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_BURY, "12", "POST"},
    {"POST", "/jobs/12/touch", gw_handle_job_touch, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_TOUCH, "12", "POST"},
    {"POST", "/jobs/12/kick", gw_handle_job_kick, GW_BODY_NONE, GW_AUTH_TOKEN, BG_CMD_KICK_JOB, "12",
     "POST"},
    {"POST", "/jobs/12/reservations", gw_handle_job_reserve, GW_BODY_NONE, GW_AUTH_TOKEN,
     BG_CMD_RESERVE_JOB, "12", "POST"},
    {"GET", "/openapi.yaml", gw_handle_openapi, GW_BODY_NONE, GW_AUTH_TOKEN, -1, NULL, "GET, HEAD"},
    {"GET", "/auth", gw_handle_auth, GW_BODY_NONE, GW_AUTH_TOKEN, -1, NULL, "GET, HEAD"},
    {"GET", "/livez", gw_handle_livez, GW_BODY_NONE, GW_AUTH_OPEN, -1, NULL, "GET, HEAD"},
    {"GET", "/readyz", gw_handle_readyz, GW_BODY_NONE, GW_AUTH_OPEN, -1, NULL, "GET, HEAD"},
    {"GET", "/metrics", gw_handle_metrics, GW_BODY_NONE, GW_AUTH_METRICS, -1, NULL, "GET, HEAD"},
    {"GET", "/clients", gw_handle_clients, GW_BODY_NONE, GW_AUTH_TOKEN, -1, NULL, "GET, HEAD"},
    {"DELETE", "/clients/7", gw_handle_client_delete, GW_BODY_NONE, GW_AUTH_TOKEN, -1, "7", "DELETE"},
    {"GET", "/subscriptions", gw_handle_subscriptions, GW_BODY_NONE, GW_AUTH_TOKEN, -1, NULL, "GET, HEAD"},
    {"GET", "/ui/", gw_handle_ui_file, GW_BODY_NONE, GW_AUTH_PUBLIC, -1, NULL, "GET, HEAD"},
    {"GET", "/ui", gw_handle_ui_redirect, GW_BODY_NONE, GW_AUTH_PUBLIC, -1, NULL, "GET, HEAD"},
    {"GET", "/ui/app.js", gw_handle_ui_file, GW_BODY_NONE, GW_AUTH_PUBLIC, -1, "app.js", "GET, HEAD"},
};

/* Each case reaches its row with the row's method, handler, body limit,
 * auth rule and counter; every row of the table is reached by exactly one
 * case (a new row needs a case here); any other method on the path is 405
 * with the path's Allow list. */
static void test_route_rows(void **state)
{
    (void)state;
    size_t ncases = sizeof row_cases / sizeof row_cases[0];
    int reached[64] = {0};
    assert_true(gw_route_count() <= 64);
    for (size_t i = 0; i < ncases; i++) {
        const struct row_case *c = &row_cases[i];
        struct gw_match m;
        if (gw_match_route(c->method, c->url, &m) != 0)
            fail_msg("%s %s: status %d, want 0", c->method, c->url, m.status);
        const struct gw_route *row = m.route;
        assert_int_equal(m.method, gw_method_of(c->method));
        assert_int_equal(row->method, gw_method_of(c->method));
        if (row->handler != c->handler) fail_msg("%s %s: another handler", c->method, c->url);
        assert_int_equal(row->body, c->body);
        assert_int_equal(row->auth, c->auth);
        assert_int_equal(row->command, c->command);
        if (c->seg1) assert_string_equal(m.seg[1], c->seg1);
        assert_string_equal(m.allow, c->allow);
        int index = (int)(row - gw_route_at(0));
        assert_true(index >= 0 && index < gw_route_count());
        reached[index]++;
        /* the metrics label is the path's first row */
        assert_string_equal(gw_route_pattern(m.path), gw_route_pattern(index));
        assert_true(m.path <= index);
        struct gw_match other;
        assert_int_equal(gw_match_route("PATCH", c->url, &other), 405);
        assert_string_equal(other.allow, c->allow);
        assert_int_equal(other.path, m.path);
    }
    for (int i = 0; i < gw_route_count(); i++)
        if (reached[i] != 1) fail_msg("row %d (%s) reached by %d cases", i, gw_route_pattern(i), reached[i]);
    assert_int_equal(gw_route_count(), (int)ncases);
}

/* Rows of one path stand together (the Allow list is built from them) and
 * share the auth rule (a 401 or a 405 is decided on the path, before the
 * method's row is known). */
static void test_route_paths(void **state)
{
    (void)state;
    for (int i = 0; i < gw_route_count(); i++) {
        for (int k = i + 1; k < gw_route_count(); k++) {
            if (strcmp(gw_route_at(i)->pattern, gw_route_at(k)->pattern) != 0) continue;
            if (k != i + 1 && strcmp(gw_route_at(k - 1)->pattern, gw_route_at(i)->pattern) != 0)
                fail_msg("rows %d and %d share %s with another row between", i, k, gw_route_at(i)->pattern);
            assert_int_equal(gw_route_at(i)->auth, gw_route_at(k)->auth);
            if (gw_route_at(i)->method == gw_route_at(k)->method)
                fail_msg("rows %d and %d: the same path and method", i, k);
        }
        assert_int_not_equal(gw_route_at(i)->method, GW_HEAD); /* HEAD comes from GET */
        assert_int_not_equal(gw_route_at(i)->method, GW_OPTIONS); /* the lifecycle answers it (CORS) */
        assert_int_not_equal(gw_route_at(i)->method, GW_OTHER);
    }
    assert_null(gw_route_at(gw_route_count()));
    assert_null(gw_route_at(-1));
}

/* Paths that match no row, and methods that a path does not have. */
static const struct route_case {
    const char *method, *url;
    int status;              /* 404 or 405 */
    const char *allow;       /* for 405 */
} route_cases[] = {
    {"POST", "/stats", 405, "GET, HEAD"},
    {"HEAD", "/tubes/emails/reservations", 405, "POST"},
    {"DELETE", "/tubes/emails", 405, "GET, HEAD"},
    {"PUT", "/tubes/emails/jobs", 405, "GET, HEAD, POST, DELETE"},
    {"PUT", "/jobs/12", 405, "GET, HEAD, DELETE"},
    {"POST", "/jobs/12", 405, "GET, HEAD, DELETE"},
    {"GET", "/jobs/12/kick", 405, "POST"},
    {"DE", "/jobs/12", 405, "GET, HEAD, DELETE"}, /* method names match whole */
    {"get", "/stats", 405, "GET, HEAD"},          /* and with their case */
    {"GET", "/", 404, NULL},
    {"GET", "/nope", 404, NULL},
    {"GET", "/tubes/a/b/c/d", 404, NULL},
    {"GET", "/tubes//jobs", 404, NULL},
    {"GET", "tubes", 404, NULL},
    {"GET", "/jobs/1/2", 404, NULL},
    {"POST", "/jobs/1/nudge", 404, NULL},
    {"GET", "/tubes/a/peek", 404, NULL},
    {"POST", "/stats/tubes", 405, "GET, HEAD"},
    {"GET", "/stats/other", 404, NULL},
    {"POST", "/ui/app.js", 405, "GET, HEAD"},
    {"PUT", "/ui", 405, "GET, HEAD"},
    {"DELETE", "/ui/", 405, "GET, HEAD"},
    {"GET", "/ui/a/b", 404, NULL},           /* the dashboard's folder is flat */
    {"GET", "/ui//", 404, NULL},
};

/* Every row of route_cases routes as the table says; trailing slashes and
 * %2F in a segment are part of the path rules. */
static void test_routes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof route_cases / sizeof route_cases[0]; i++) {
        const struct route_case *c = &route_cases[i];
        struct gw_match m;
        int status = gw_match_route(c->method, c->url, &m);
        if (status != c->status) fail_msg("%s %s: status %d, want %d", c->method, c->url, status, c->status);
        assert_int_equal(m.status, status);
        if (c->status == 404) {
            assert_null(m.route);
            assert_int_equal(m.path, -1);
            continue;
        }
        assert_non_null(m.route);
        assert_string_equal(m.allow, c->allow);
    }
    struct gw_match m;
    assert_int_equal(gw_match_route("GET", "/tubes/", &m), 0);
    assert_true(m.route->handler == gw_handle_tubes);
    assert_int_equal(gw_match_route("GET", "/tubes/a%2Fb/ready", &m), 0);
    assert_string_equal(m.seg[1], "a/b");
    assert_true(m.route->handler == gw_handle_peek_ready);
    /* tubes "." and "..": a %2E left after unescaping (a browser's %252E) is
     * a dot, and a segment of dots is a tube name, not a step up */
    assert_int_equal(gw_match_route("POST", "/tubes/%2E%2e/kick", &m), 0);
    assert_string_equal(m.seg[1], "..");
    assert_true(m.route->handler == gw_handle_tube_kick);
    assert_int_equal(gw_match_route("GET", "/tubes/%2E", &m), 0);
    assert_string_equal(m.seg[1], ".");
    assert_true(m.route->handler == gw_handle_tube);
    /* a pattern that ends with '/' wants the '/': "/ui/" is the page, "/ui"
     * the redirect to it; other paths take a trailing '/' or not */
    assert_int_equal(gw_match_route("GET", "/ui/", &m), 0);
    assert_true(m.route->handler == gw_handle_ui_file);
    assert_string_equal(gw_route_pattern(m.path), "/ui/");
    assert_int_equal(gw_match_route("GET", "/ui", &m), 0);
    assert_true(m.route->handler == gw_handle_ui_redirect);
    assert_string_equal(gw_route_pattern(m.path), "/ui");
    assert_int_equal(gw_match_route("GET", "/ui/app.js/", &m), 0);
    assert_string_equal(m.seg[1], "app.js");
    assert_string_equal(gw_route_pattern(m.path), "/ui/{asset}");
    assert_int_equal(gw_match_route("GET", "/stats/", &m), 0);
    assert_true(m.route->handler == gw_handle_stats);
}

/* A URL for route pattern p ("/jobs/{id}/body"): each {x} filled with "7". */
static void url_of_pattern(const char *p, char *out, size_t size)
{
    size_t o = 0;
    while (*p && o + 2 < size) {
        if (*p == '{') {
            out[o++] = '7';
            p = strchr(p, '}') + 1;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
}

/* Over the whole route table: a GET row takes HEAD too, as the same row
 * and told apart as GW_HEAD; its path's Allow lists HEAD after GET. A path
 * without a GET row refuses HEAD and does not list it. */
static void test_head_wherever_get(void **state)
{
    (void)state;
    int with_get = 0;
    for (int i = 0; i < gw_route_count(); i++) {
        char url[128];
        url_of_pattern(gw_route_pattern(i), url, sizeof url);
        struct gw_match get, head;
        int get_status = gw_match_route("GET", url, &get);
        int head_status = gw_match_route("HEAD", url, &head);
        assert_int_equal(head_status, get_status);
        assert_true(head.route == get.route);
        assert_string_equal(head.allow, get.allow);
        if (gw_route_at(i)->method == GW_GET) {
            with_get++;
            assert_int_equal(get_status, 0);
            assert_true(get.route == gw_route_at(i));
            assert_int_equal(head.method, GW_HEAD);
            assert_int_equal(get.method, GW_GET);
            assert_non_null(strstr(head.allow, "GET, HEAD"));
        } else if (!strstr(get.allow, "GET")) {
            assert_int_equal(head_status, 405);
            assert_null(strstr(head.allow, "HEAD"));
        }
    }
    assert_true(with_get >= 12);
    struct gw_match m;
    assert_int_equal(gw_match_route("DELETE", "/jobs/7", &m), 0);
    assert_int_equal(m.method, GW_DELETE);
    assert_true(m.route->handler == gw_handle_job_delete);
    assert_int_equal(gw_match_route("HEAD", "/jobs/7", &m), 0);
    assert_true(m.route->handler == gw_handle_job); /* HEAD never deletes */
    assert_int_equal(gw_match_route("PATCH", "/jobs/7", &m), 405);
    assert_int_equal(m.method, GW_OTHER);
    /* OPTIONS is told apart, and matches no row: 405 with the path's methods,
     * which a CORS preflight's answer lists */
    assert_int_equal(gw_match_route("OPTIONS", "/jobs/7", &m), 405);
    assert_int_equal(m.method, GW_OPTIONS);
    assert_string_equal(m.allow, "GET, HEAD, DELETE");
}

/* ---- the gateway in this process: each request is matched once ---------- */

static bg_time fake_now = 1000 * BG_SECOND;
static bg_time fake_clock(void) { return fake_now; }

/* A gateway on a loopback port of this process, and its loop, over an
 * engine with a write-ahead log in a temporary directory, -f 0: every
 * response that reports a change waits until the log has it on disk. The
 * server hands the log each loop turn's records (wal_kick); live_turn does
 * the same, unless `log_paused`: then nothing reaches the disk. */
struct live {
    struct event_base *base;
    struct bg_engine engine;
    struct gateway *gw;
    unsigned short port;
    char dir[40];
    struct wal *wal;
    int log_paused;
};

/* A live gateway whose header timeout is header_timeout_s (0: the default). */
static void live_start_with(struct live *l, uint32_t header_timeout_s)
{
    memset(l, 0, sizeof *l);
    l->base = event_base_new();
    assert_non_null(l->base);
    assert_int_equal(bg_engine_init(&l->engine, 1000, NULL), 0);
    tempdir_make(l->dir, sizeof l->dir, "gw");
    struct wal_config wcfg = {.dir = l->dir, .segment_size = 1 << 20};
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    assert_int_equal(wal_open(&l->wal, &wcfg, &l->engine, l->base, fake_now,
                              (uint64_t)wall.tv_sec * BG_SECOND), 0);
    struct gateway_config cfg = {0};
    cfg.listen_addr = "127.0.0.1";
    cfg.port = "0";
    cfg.wal = l->wal;
    cfg.header_timeout_s = header_timeout_s;
    l->gw = gateway_start(l->base, &l->engine, &cfg, fake_clock, NULL, NULL);
    assert_non_null(l->gw);
    struct sockaddr_in bound;
    socklen_t len = sizeof bound;
    assert_int_equal(getsockname(gateway_listen_fd(l->gw), (struct sockaddr *)&bound, &len), 0);
    l->port = ntohs(bound.sin_port);
}

static void live_start(struct live *l) { live_start_with(l, 0); }

static void live_stop(struct live *l)
{
    gateway_stop(l->gw, loop_now() + BG_SECOND);
    wal_close(l->wal);
    bg_engine_destroy(&l->engine);
    event_base_free(l->base);
    tempdir_remove(l->dir);
}

/* A non-blocking connection to the gateway, with text sent on it. */
static int live_connect(struct live *l, const char *text)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(l->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0); /* loopback: at once */
    assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(send(fd, text, strlen(text), 0), (ssize_t)strlen(text));
    return fd;
}

/* One turn of the loop, and a millisecond's pause when nothing ran. */
static void live_turn(struct live *l)
{
    if (!l->log_paused) wal_kick(l->wal);
    event_base_loop(l->base, EVLOOP_NONBLOCK);
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
}

/* Turn the loop until *flag is nonzero (5 s at most). */
static void live_until(struct live *l, struct gw_request *const *flag)
{
    for (int i = 0; i < 5000 && !*flag; i++) live_turn(l);
    assert_non_null(*flag);
}

/* Turn the loop until the server closes fd (Connection: close), then the
 * status of the response read, 0 if none came. *got: the bytes, if asked. */
static int live_finish(struct live *l, int fd, char *got, size_t size)
{
    char buf[4096];
    size_t n = 0;
    for (int i = 0; i < 5000; i++) {
        live_turn(l);
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k == 0) break;
        if (k > 0) n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    if (got) snprintf(got, size, "%s", buf);
    int status = 0;
    return sscanf(buf, "HTTP/1.1 %d", &status) == 1 ? status : 0;
}

/* Nothing has come back on fd yet. */
static void assert_no_answer(int fd)
{
    char byte;
    assert_int_equal(recv(fd, &byte, 1, MSG_PEEK), -1);
}

#define CLOSE "Host: localhost\r\nConnection: close\r\n"

/* However often libmicrohttpd calls the access handler for a request, its
 * route is matched once: a body that arrives in two writes, a long-poll
 * that is suspended and resumed when a job comes, a response held until the
 * log says it is on disk, and 404/405/HEAD. */
static void test_match_once(void **state)
{
    (void)state;
    struct live l;
    live_start(&l);
    unsigned long before = gw_match_count();
    char got[4096];

    assert_int_equal(live_finish(&l, live_connect(&l, "GET /stats HTTP/1.1\r\n" CLOSE "\r\n"), NULL, 0), 200);
    assert_int_equal(live_finish(&l, live_connect(&l, "HEAD /stats HTTP/1.1\r\n" CLOSE "\r\n"), got,
                                 sizeof got), 200);
    assert_null(strstr(got, "current_jobs_ready")); /* HEAD: no body */
    assert_int_equal(live_finish(&l, live_connect(&l, "PUT /jobs/1 HTTP/1.1\r\n" CLOSE "\r\n"), got,
                                 sizeof got), 405);
    assert_non_null(strstr(got, "Allow: GET, HEAD, DELETE"));
    assert_int_equal(live_finish(&l, live_connect(&l, "GET /nope HTTP/1.1\r\n" CLOSE "\r\n"), NULL, 0), 404);
    assert_int_equal(gw_match_count() - before, 4);

    /* a body in two writes: the handler sees all of it */
    int fd = live_connect(&l, "POST /tubes/t/jobs HTTP/1.1\r\n" CLOSE "Content-Length: 10\r\n\r\nhello");
    for (int i = 0; i < 20; i++) live_turn(&l);
    assert_no_answer(fd);
    assert_int_equal(send(fd, "world", 5, 0), 5);
    assert_int_equal(live_finish(&l, fd, got, sizeof got), 201);
    struct bg_job *j = bg_job_find(&l.engine, 1);
    assert_non_null(j);
    assert_memory_equal(j->body, "helloworld", 10);
    assert_int_equal(gw_match_count() - before, 5);

    /* a long-poll, suspended, then resumed by a put of another client */
    fd = live_connect(&l, "POST /tubes/lp/reservations?timeout=5 HTTP/1.1\r\n" CLOSE "\r\n");
    live_until(&l, &l.gw->waiting);
    assert_no_answer(fd);
    struct bg_client producer;
    assert_int_equal(bg_client_init_bare(&l.engine, &producer, &bg_client_ops_never_wait, NULL), 0);
    uint64_t id = 0;
    assert_int_equal(bg_put_copy(&producer, "lp", 0, 0, 60, "job", 3, fake_now, &id), 0);
    assert_int_equal(live_finish(&l, fd, got, sizeof got), 200);
    assert_non_null(strstr(got, "\"reservation\""));
    assert_int_equal(gw_match_count() - before, 6);

    /* a put whose answer waits for the log: held while nothing reaches the
     * disk, answered once its record is there. The log must be idle first:
     * a batch still in flight hands the next one over when it ends. */
    uint64_t last = l.engine.reply_pos; /* the reservation's answer waited for the put */
    for (int i = 0; i < 5000 && !wal_reply_may_go(l.wal, last); i++) live_turn(&l);
    assert_true(wal_reply_may_go(l.wal, last));
    l.log_paused = 1;
    fd = live_connect(&l, "POST /tubes/h/jobs HTTP/1.1\r\n" CLOSE "Content-Length: 4\r\n\r\nheld");
    live_until(&l, &l.gw->held);
    for (int i = 0; i < 20; i++) live_turn(&l);
    assert_no_answer(fd);
    l.log_paused = 0;
    assert_int_equal(live_finish(&l, fd, NULL, 0), 201);
    assert_int_equal(gw_match_count() - before, 7);

    bg_client_close(&producer, fake_now);
    live_stop(&l);
}

/* ---- the header deadline and a head completed in the same loop turn ---- */

/* Text to send on fd from a timer of the loop. */
struct send_later {
    int fd;
    const char *text;
    int sent;
};

static void send_later_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct send_later *s = arg;
    assert_int_equal(send(s->fd, s->text, strlen(s->text), 0), (ssize_t)strlen(s->text));
    s->sent = 1;
}

/* Let more than `ms` milliseconds of real time pass without a loop turn. */
static void pass_without_turns(unsigned ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        struct timespec step = {0, 10000000};
        nanosleep(&step, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 <= (long)ms);
}

/* The rest of a head (`rest`) reaches the gateway in the loop turn in which
 * its 1 s header deadline fires, after the loop looked for I/O: a timer of
 * the test, due at once (so before the deadline, which began earlier),
 * sends it in that turn. Then one turn runs them both, the earlier timer
 * first; the status that comes back on fd. */
static int rest_at_the_deadline(struct live *l, int fd, const char *rest)
{
    struct send_later later = {fd, rest, 0};
    struct event *ev = evtimer_new(l->base, send_later_cb, &later);
    struct timeval at_once = {0, 1};
    assert_int_equal(evtimer_add(ev, &at_once), 0);
    pass_without_turns(1300); /* the deadline (1 s from its start, before this) has passed */
    event_base_loop(l->base, EVLOOP_NONBLOCK);
    assert_true(later.sent);
    event_free(ev);
    return live_finish(l, fd, NULL, 0);
}

/* Issue 21: a head completed in the loop turn in which its header deadline
 * fires is served, not answered 408 (before, the deadline's callback answered
 * 408 with the whole head in the kernel). For the first head, which this
 * file reads, and for a later head of a keep-alive connection, which
 * libmicrohttpd reads. An incomplete head still gets its 408. */
static void test_head_complete_at_its_deadline(void **state)
{
    (void)state;
    struct live l;
    live_start_with(&l, 1);

    /* the first head */
    int fd = live_connect(&l, "GET /stats HTTP/1.1\r\n");
    for (int i = 0; i < 5000 && l.gw->admit.open == 0; i++) live_turn(&l);
    assert_int_equal(l.gw->admit.open, 1);
    assert_int_equal(rest_at_the_deadline(&l, fd, CLOSE "\r\n"), 200);

    /* a later head: the first request's answer read, the second head begun */
    fd = live_connect(&l, "HEAD /stats HTTP/1.1\r\nHost: localhost\r\n\r\n");
    char got[4096] = "";
    size_t n = 0;
    for (int i = 0; i < 5000 && !strstr(got, "\r\n\r\n"); i++) {
        live_turn(&l);
        ssize_t k = recv(fd, got + n, sizeof got - 1 - n, 0);
        if (k > 0) n += (size_t)k;
        got[n] = '\0';
    }
    assert_non_null(strstr(got, "HTTP/1.1 200"));
    assert_int_equal(send(fd, "GET /stats HTTP/1.1\r\n", 21, 0), 21);
    /* the sweep sees the later head begin and starts its deadline */
    for (int i = 0; i < 5000 && !(l.gw->admit.wait_head && l.gw->admit.wait_head->head_started); i++)
        live_turn(&l);
    assert_non_null(l.gw->admit.wait_head);
    assert_true(l.gw->admit.wait_head->head_started);
    assert_int_equal(rest_at_the_deadline(&l, fd, CLOSE "\r\n"), 200);

    /* still incomplete when the deadline fires: 408 */
    fd = live_connect(&l, "GET /stats HTTP/1.1\r\n");
    for (int i = 0; i < 5000 && l.gw->admit.open == 0; i++) live_turn(&l);
    assert_int_equal(rest_at_the_deadline(&l, fd, "Host: localhost\r\n"), 408);

    live_stop(&l);
}

/* A URL longer than the match buffer is refused, not truncated. */
static void test_route_long_url(void **state)
{
    (void)state;
    char url[2048];
    memset(url, 'a', sizeof url);
    memcpy(url, "/tubes/", 7);
    url[sizeof url - 1] = '\0';
    struct gw_match m;
    assert_int_equal(gw_match_route("GET", url, &m), 404);
}

/* ---- the error table -------------------------------------------------- */

/* Every engine outcome the handlers can meet, and every conflict of a
 * request with a job's state, is one row of the error table: its status,
 * code and detail (a 409's code says what happened, not NOT_FOUND); an
 * outcome not in it is a 500 named by its beanstalk word. Each status has
 * its own title. */
static void test_outcome_problems(void **state)
{
    (void)state;
    /* status and code per outcome (the details are gateway/reply.c's prose:
     * each must be there, and the hints below must say what they promise) */
    static const struct { int outcome; unsigned status; const char *code; } want[] = {
        {BG_NOT_FOUND, 404, "NOT_FOUND"},
        {GW_RESERVATION_REQUIRED, 409, "RESERVATION_REQUIRED"},
        {GW_RESERVATION_MISMATCH, 409, "RESERVATION_MISMATCH"},
        {GW_RESERVED_ELSEWHERE, 409, "RESERVED_ELSEWHERE"},
        {GW_NOT_RESERVED, 409, "NOT_RESERVED"},
        {GW_NOT_BURIED_OR_DELAYED, 409, "NOT_BURIED_OR_DELAYED"},
        {GW_ALREADY_RESERVED, 409, "ALREADY_RESERVED"},
        {BG_BAD_FORMAT, 400, "BAD_FORMAT"},
        {BG_JOB_TOO_BIG, 413, "JOB_TOO_BIG"},
        {BG_DRAINING, 503, "DRAINING"},
        {BG_OUT_OF_MEMORY, 503, "OUT_OF_MEMORY"},
        {BG_LOG_UNAVAILABLE, 503, "LOG_UNAVAILABLE"},
        {BG_MEMORY_CEILING, 503, "OUT_OF_MEMORY"},
        {BG_INTERNAL_ERROR, 500, "INTERNAL_ERROR"},
        {BG_DEADLINE_SOON, 500, "DEADLINE_SOON"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct gw_problem p = gw_outcome_problem(want[i].outcome);
        if (p.status != want[i].status || strcmp(p.code, want[i].code) != 0 || p.detail == NULL ||
            p.detail[0] == '\0')
            fail_msg("outcome %d: %u %s \"%s\", want %u %s and a detail", want[i].outcome, p.status,
                     p.code, p.detail ? p.detail : "(null)", want[i].status, want[i].code);
    }
    /* the hints: where the token goes; no token for a reservation made elsewhere */
    assert_non_null(strstr(gw_outcome_problem(GW_RESERVATION_REQUIRED).detail, "X-Reservation: TOKEN"));
    assert_non_null(strstr(gw_outcome_problem(GW_RESERVED_ELSEWHERE).detail, "HTTP has no token"));
    assert_null(strstr(gw_outcome_problem(GW_RESERVED_ELSEWHERE).detail, "X-Reservation"));
    assert_non_null(strstr(gw_outcome_problem(BG_MEMORY_CEILING).detail, "--max-job-memory"));
    assert_string_equal(gw_outcome_problem(BG_INTERNAL_ERROR).detail, "internal error");
    static const struct { unsigned status; const char *title; } titles[] = {
        {400, "Bad Request"}, {401, "Unauthorized"}, {404, "Not Found"},
        {405, "Method Not Allowed"}, {409, "Conflict"}, {413, "Content Too Large"},
        {422, "Unprocessable Content"}, {500, "Internal Server Error"},
        {503, "Service Unavailable"},
    };
    for (size_t i = 0; i < sizeof titles / sizeof titles[0]; i++)
        assert_string_equal(gw_status_title(titles[i].status), titles[i].title);
    assert_true(GW_NO_REPLY < BG_LOG_UNAVAILABLE - 100); /* no outcome is mistaken for it */
    /* the gateway's conflicts lie between the engine's outcomes and GW_NO_REPLY */
    assert_true(GW_RESERVATION_REQUIRED < BG_LOG_UNAVAILABLE - 100 && GW_ALREADY_RESERVED > GW_NO_REPLY);
}

/* ---- JSON rendering ---------------------------------------------------- */

/* A job made in a fresh engine with the given body. */
static struct bg_job *make_job(struct bg_engine *e, struct bg_client *c, const char *body, size_t n)
{
    struct bg_job *j = bg_job_new(e, 7, 0, 30, (uint32_t)n + 2, 0);
    assert_non_null(j);
    memcpy(j->body, body, n);
    memcpy(j->body + n, "\r\n", 2);
    assert_int_equal(bg_put(c, c->use, j, 0), 0);
    return j;
}

static void noop_reserved(struct bg_client *c, struct bg_job *j) { (void)c; (void)j; }
static void noop_ended(struct bg_client *c, int o) { (void)c; (void)o; }
static const struct bg_client_ops noop_ops = {noop_reserved, noop_ended, NULL};

/* UTF-8 bodies render as "body"; other bytes as "body_base64" that decodes
 * back to the same bytes; the stats fields come from the stats model. */
static void test_json_job_bodies(void **state)
{
    (void)state;
    struct bg_engine e;
    struct bg_client c;
    assert_int_equal(bg_engine_init(&e, 1000, NULL), 0);
    assert_int_equal(bg_client_init(&e, &c, &noop_ops, NULL), 0);
    static const struct { const char *bytes; size_t n; int utf8; } bodies[] = {
        {"hello", 5, 1}, {"", 0, 1}, {"caf\xc3\xa9", 5, 1}, {"\x00\x01\x02\xff", 4, 0},
        {"\xc3", 1, 0}, {"a\r\nb", 4, 1}, {"\xff\xfe\xfd", 3, 0},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        struct bg_job *j = make_job(&e, &c, bodies[i].bytes, bodies[i].n);
        json_t *v = gw_json_job(&e, j, 5 * BG_SECOND, "tok", 1);
        assert_non_null(v);
        assert_int_equal(json_integer_value(json_object_get(v, "id")), j->id);
        assert_string_equal(json_string_value(json_object_get(v, "state")), "ready");
        assert_int_equal(json_integer_value(json_object_get(v, "priority")), 7);
        assert_int_equal(json_integer_value(json_object_get(v, "ttr")), 30);
        assert_int_equal(json_integer_value(json_object_get(v, "age")), 5);
        assert_string_equal(json_string_value(json_object_get(v, "reservation")), "tok");
        json_t *text = json_object_get(v, "body"), *b64 = json_object_get(v, "body_base64");
        if (bodies[i].utf8) {
            assert_non_null(text);
            assert_null(b64);
            assert_int_equal(json_string_length(text), bodies[i].n);
            assert_memory_equal(json_string_value(text), bodies[i].bytes, bodies[i].n);
        } else {
            assert_null(text);
            assert_non_null(b64);
            size_t n;
            int bad;
            char *raw = gw_base64_decode(json_string_value(b64), json_string_length(b64), &n, &bad);
            assert_non_null(raw);
            assert_int_equal(n, bodies[i].n);
            assert_memory_equal(raw, bodies[i].bytes, n);
            free(raw);
        }
        json_decref(v);
        v = gw_json_job(&e, j, 0, NULL, 0);
        assert_null(json_object_get(v, "body"));
        assert_null(json_object_get(v, "body_base64"));
        assert_null(json_object_get(v, "reservation"));
        json_decref(v);
    }
    bg_client_close(&c, 0);
    bg_engine_destroy(&e);
}

/* base64 decoding is RFC 4648's standard alphabet, strictly: padded to a
 * multiple of 4, nothing but the alphabet (no spaces, no line breaks, no
 * URL-safe - and _), '=' only at the end, and the unused bits of the last
 * character zero, so that each byte string has one accepted text. */
static void test_base64_decode(void **state)
{
    (void)state;
    static const struct { const char *in; const char *out; size_t n; } ok[] = {
        {"", "", 0}, {"YQ==", "a", 1}, {"YWI=", "ab", 2}, {"YWJj", "abc", 3},
        {"AAEC/w==", "\x00\x01\x02\xff", 4}, {"+/+/", "\xfb\xff\xbf", 3}, {"AA==", "\x00", 1},
        {"AAA=", "\x00\x00", 2}, {"YWJjZA==", "abcd", 4}, {"YWJjZGVm", "abcdef", 6},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t n;
        int bad = -1;
        char *raw = gw_base64_decode(ok[i].in, strlen(ok[i].in), &n, &bad);
        if (!raw) fail_msg("\"%s\" was refused", ok[i].in);
        assert_int_equal(n, ok[i].n);
        assert_memory_equal(raw, ok[i].out, n);
        free(raw);
    }
    static const struct { const char *in; const char *why; } bad[] = {
        {"Y", "one character"}, {"YQ", "unpadded"}, {"YWI", "unpadded"}, {"YQ=", "short padding"},
        {"YQ===", "over-padded"}, {"YQ====", "over-padded"}, {"====", "padding only"},
        {"YQ=x", "a character after the padding"}, {"Y=Q=", "padding inside"},
        {"YQ==YQ==", "padding in the middle"}, {"a b=", "a space"}, {"YWJj\n", "a line break"},
        {" YWJj", "a leading space"}, {"Y*==", "outside the alphabet"}, {"-_-_", "URL-safe alphabet"},
        {"\xc3\xa9\xc3\xa9", "not ASCII"}, {"YR==", "last bits not zero (2 of 4)"},
        {"YWJ=", "last bits not zero (2)"}, {"AB==", "last bits not zero"}, {"AAB=", "last bits not zero"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n;
        int why = -1;
        char *raw = gw_base64_decode(bad[i].in, strlen(bad[i].in), &n, &why);
        if (raw) fail_msg("\"%s\" (%s) was accepted", bad[i].in, bad[i].why);
        assert_int_equal(why, 1);
    }
}

/* ---- framing ------------------------------------------------------------- */

/* Each head: the status the framing check gives it (0: sound), and its code. */
static void test_head_check(void **state)
{
    (void)state;
    static const struct { const char *head; unsigned status; const char *code; } cases[] = {
        {"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", 0, NULL},
        {"GET / HTTP/1.0\r\n\r\n", 0, NULL},
        {"\r\nGET / HTTP/1.1\r\n\r\n", 0, NULL},
        {"GET / HTTP/1.1\nHost: localhost\n\n", 0, NULL},
        {"POST /t HTTP/1.1\r\nContent-Length: 3\r\n\r\n", 0, NULL},
        {"POST /t HTTP/1.1\r\ncontent-length:  3 \r\n\r\n", 0, NULL},
        {"POST /t HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", 0, NULL},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, NULL},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", 0, NULL},
        {"POST /t HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: +3\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: \r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, "JOB_TOO_BIG"},
        {"POST /t HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, "BAD_FORMAT"},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "NOT_IMPLEMENTED"},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "NOT_IMPLEMENTED"},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
         "NOT_IMPLEMENTED"},
        {"POST /t HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", 501, "NOT_IMPLEMENTED"},
        {"GET / HTTP/2.0\r\n\r\n", 505, "HTTP_VERSION_NOT_SUPPORTED"},
        {"GET / HTTP/1.2\r\n\r\n", 505, "HTTP_VERSION_NOT_SUPPORTED"},
        {"GET / HTTP/10.1\r\n\r\n", 505, "HTTP_VERSION_NOT_SUPPORTED"},
        {"GET / FTP/1.1\r\n\r\n", 400, "BAD_FORMAT"},
        {"GARBAGE\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET /\r\n\r\n", 400, "BAD_FORMAT"},
        {" GET / HTTP/1.1\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET / HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET / HTTP/1.1\r\nX-A: 1\r\n\t2\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET / HTTP/1.1\r\nContent-Length : 3\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET / HTTP/1.1\r\n: 3\r\n\r\n", 400, "BAD_FORMAT"},
        {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "BAD_FORMAT"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *h = cases[i].head;
        size_t end = gw_head_end(h, strlen(h));
        if (end != strlen(h)) fail_msg("head %zu: end %zu, want %zu", i, end, strlen(h));
        struct gw_problem p = {0};
        unsigned status = gw_head_check(h, end, GW_HEADER_FIELDS_MAX, &p);
        if (status != cases[i].status) fail_msg("head %zu (%s): status %u, want %u", i, h, status, cases[i].status);
        if (status) {
            assert_int_equal(p.status, status);
            assert_string_equal(p.code, cases[i].code);
            assert_non_null(p.detail);
        }
    }
    /* incomplete heads have no end yet */
    static const char *const partial[] = {"", "G", "GET / HTTP/1.1\r\n", "GET / HTTP/1.1\r\nHost: localhost\r\n\r",
                                          "\r\n\r\n"};
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++)
        assert_int_equal(gw_head_end(partial[i], strlen(partial[i])), 0);
    /* more fields than allowed */
    char many[4096] = "GET / HTTP/1.1\r\n";
    for (int i = 0; i <= GW_HEADER_FIELDS_MAX; i++) strcat(many, "X-A: 1\r\n");
    strcat(many, "\r\n");
    struct gw_problem p;
    assert_int_equal(gw_head_check(many, strlen(many), GW_HEADER_FIELDS_MAX, &p), 431);
    assert_string_equal(p.code, "HEADERS_TOO_LARGE");
}

/* The same fields, parsed: each field at a time, as libmicrohttpd gives them. */
static void test_framing_fields(void **state)
{
    (void)state;
    static const struct { const char *fields[3][2]; unsigned status; uint64_t length; } cases[] = {
        {{{"Host", "x"}}, 0, 0},
        {{{"Content-Length", "12"}}, 0, 12},
        {{{"CONTENT-LENGTH", "12"}, {"content-length", " 12"}}, 0, 12},
        {{{"Content-Length", "1"}, {"Content-Length", "2"}}, 400, 1},
        {{{"Content-Length", "1"}, {"Transfer-Encoding", "chunked"}}, 400, 1},
        {{{"Transfer-Encoding", "chunked"}}, 0, 0},
        {{{"Transfer-Encoding", "x-custom"}}, 501, 0},
        {{{"Content-Length", "18446744073709551615"}}, 0, UINT64_MAX},
        {{{"Content-Length", "18446744073709551616"}}, 413, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gw_framing f = {0};
        for (int k = 0; k < 3 && cases[i].fields[k][0]; k++)
            gw_framing_field(&f, cases[i].fields[k][0], strlen(cases[i].fields[k][0]),
                             cases[i].fields[k][1], strlen(cases[i].fields[k][1]));
        struct gw_problem p;
        unsigned status = gw_framing_verdict(&f, &p);
        if (status != cases[i].status) fail_msg("case %zu: status %u, want %u", i, status, cases[i].status);
        if (!status) assert_int_equal(f.length, cases[i].length);
    }
}

/* A batch put's body limit holds GW_BATCH_MAX jobs of the maximum size as
 * base64, with room for each entry's keys and numbers. */
static void test_batch_body_limit(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {0, 1, 2, 3, 4, 65535, 1048576};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t z = sizes[i];
        uint64_t b64 = (z + 2) / 3 * 4;
        assert_int_equal(gw_batch_body_limit(z), GW_BATCH_MAX * (b64 + GW_BATCH_ENTRY_SLACK));
    }
    /* the default -z: 100 entries of 87380 base64 characters */
    assert_int_equal(gw_batch_body_limit(65535), 8763600);
}

/* ---- tokens ------------------------------------------------------------ */

/* ---- CORS origins ------------------------------------------------------- */

/* The Host names served (guard.c): on a loopback bind the loopback names
 * and the list's; on another bind every name without a list, and with one
 * only the list's and the loopback names. */
static void test_allowed_hosts(void **state)
{
    (void)state;
    struct gw_hosts *loop = gw_hosts_new(NULL, 1), *open = gw_hosts_new(NULL, 0);
    struct gw_hosts *listed = gw_hosts_new("queue.internal,[fd00::1]", 0);
    assert_non_null(loop);
    assert_non_null(open);
    assert_non_null(listed);
    static const char *const loopback[] = {"localhost", "LOCALHOST:11301", "127.0.0.1", "127.0.0.1:1",
                                           "[::1]", "[::1]:65535", NULL};
    for (int i = 0; loopback[i]; i++) {
        assert_true(gw_hosts_allow(loop, loopback[i]));
        assert_true(gw_hosts_allow(listed, loopback[i]));
    }
    static const char *const foreign[] = {"attacker.example", "attacker.example:11301", "127.1", "127.0.0.2",
                                          "2130706433", "[::2]", "localhost:", "localhost:123456",
                                          "localhost:x", "localhost.", "", "queue.internal.example", NULL};
    for (int i = 0; foreign[i]; i++) {
        assert_false(gw_hosts_allow(loop, foreign[i]));
        assert_false(gw_hosts_allow(listed, foreign[i]));
        assert_true(gw_hosts_allow(open, foreign[i])); /* not loopback, no list: every name */
    }
    assert_true(gw_hosts_allow(listed, "Queue.Internal:8080"));
    assert_true(gw_hosts_allow(listed, "[FD00::1]"));
    assert_false(gw_hosts_allow(loop, "queue.internal"));
    assert_true(gw_hosts_allow(loop, NULL)); /* HTTP/1.0 without Host */
    gw_hosts_free(loop);
    gw_hosts_free(open);
    gw_hosts_free(listed);
    assert_null(gw_hosts_check("a,b.example,[::1]"));
    static const char *const bad[] = {"", "a,", ",a", "a:80", "http://a", "a b", "[zz]", "[]", NULL};
    for (int i = 0; bad[i]; i++) assert_non_null(gw_hosts_check(bad[i]));
    assert_null(gw_hosts_new("a:80", 1));
    /* the limits: GW_ALLOWED_HOSTS_MAX names, GW_ALLOWED_HOST_MAX bytes each */
    char list[GW_ALLOWED_HOSTS_MAX * 4 + 8] = "", name[GW_ALLOWED_HOST_MAX + 2];
    for (int i = 0; i < GW_ALLOWED_HOSTS_MAX; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%sh%d", i ? "," : "", i);
    assert_null(gw_hosts_check(list));
    strcat(list, ",one-more");
    assert_non_null(gw_hosts_check(list));
    memset(name, 'a', GW_ALLOWED_HOST_MAX);
    name[GW_ALLOWED_HOST_MAX] = '\0';
    assert_null(gw_hosts_check(name));
    name[GW_ALLOWED_HOST_MAX] = 'a';
    name[GW_ALLOWED_HOST_MAX + 1] = '\0';
    assert_non_null(gw_hosts_check(name));

    struct sockaddr_in v4 = {.sin_family = AF_INET};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET, "127.0.0.1", &v4.sin_addr);
    assert_true(gw_addr_is_loopback((struct sockaddr *)&v4));
    inet_pton(AF_INET, "127.3.2.1", &v4.sin_addr);
    assert_true(gw_addr_is_loopback((struct sockaddr *)&v4));
    inet_pton(AF_INET, "0.0.0.0", &v4.sin_addr);
    assert_false(gw_addr_is_loopback((struct sockaddr *)&v4));
    inet_pton(AF_INET, "192.168.1.2", &v4.sin_addr);
    assert_false(gw_addr_is_loopback((struct sockaddr *)&v4));
    inet_pton(AF_INET6, "::1", &v6.sin6_addr);
    assert_true(gw_addr_is_loopback((struct sockaddr *)&v6));
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &v6.sin6_addr);
    assert_true(gw_addr_is_loopback((struct sockaddr *)&v6));
    inet_pton(AF_INET6, "::", &v6.sin6_addr);
    assert_false(gw_addr_is_loopback((struct sockaddr *)&v6));
}

/* The origins of --http-cors-origins: exact http(s)://HOST[:PORT] only; a
 * refused list says why (the message's key words here). */
static void test_cors_origins(void **state)
{
    (void)state;
    static const struct { const char *list, *why; } cases[] = {
        {"https://app.example.com", NULL},
        {"http://localhost:3000,https://a.example", NULL},
        {"http://127.0.0.1:8080", NULL},
        {"http://[::1]:8080", NULL},
        {"HTTPS://App.Example.COM", NULL},
        {"*", "'*' is refused"},
        {"https://a.example,*", "'*' is refused"},
        {"https://a.example/", "no path"},
        {"https://a.example/x", "no path"},
        {"https://a.example?x", "no path"},
        {"https://user@a.example", "no path"},
        {"ftp://a.example", "http:// or https://"},
        {"a.example", "http:// or https://"},
        {"", "http:// or https://"},
        {"https://a.example,", "http:// or https://"},
        {"null", "http:// or https://"},
        {"https://", "no host"},
        {"https://:80", "no host"},
        {"http://[]", "IPv6"},
        {"http://[::1", "IPv6"},
        {"http://[zz]", "IPv6"},
        {"https://a.example:", "port"},
        {"https://a.example:0", "port"},
        {"https://a.example:65536", "port"},
        {"https://a.example:000080", "port"},
        {"https://a.example:8x", "port"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *why = gw_cors_check(cases[i].list);
        if (!cases[i].why != !why || (why && !strstr(why, cases[i].why)))
            fail_msg("\"%s\": %s, want %s", cases[i].list, why ? why : "accepted",
                     cases[i].why ? cases[i].why : "accepted");
        struct gw_cors *c = gw_cors_new(cases[i].list);
        assert_true((c == NULL) == (why != NULL));
        gw_cors_free(c);
    }
    /* 64 origins at most; 256 bytes each */
    char list[64 * 24 + 32], *p = list;
    for (int i = 0; i < 64; i++) p += sprintf(p, "%shttp://h%d.example", i ? "," : "", i);
    assert_null(gw_cors_check(list));
    strcpy(p, ",http://h64.example");
    assert_non_null(strstr(gw_cors_check(list), "more than 64"));
    char longest[300] = "https://";
    memset(longest + 8, 'a', 248);
    longest[256] = '\0';
    assert_null(gw_cors_check(longest));
    strcat(longest, "a");
    assert_non_null(strstr(gw_cors_check(longest), "longer than 256"));

    struct gw_cors *c = gw_cors_new("https://app.example.com,http://localhost:3000");
    assert_non_null(c);
    assert_true(gw_cors_allows(c, "https://app.example.com"));
    assert_true(gw_cors_allows(c, "http://localhost:3000"));
    assert_true(gw_cors_allows(c, "HTTPS://APP.EXAMPLE.COM"));
    assert_false(gw_cors_allows(c, "https://app.example.com:443"));
    assert_false(gw_cors_allows(c, "http://app.example.com"));
    assert_false(gw_cors_allows(c, "http://localhost:30000"));
    assert_false(gw_cors_allows(c, "http://localhost"));
    assert_false(gw_cors_allows(c, "https://app.example.com,http://localhost:3000"));
    assert_false(gw_cors_allows(c, "null"));
    assert_false(gw_cors_allows(c, ""));
    assert_false(gw_cors_allows(c, NULL));
    assert_false(gw_cors_allows(NULL, "https://app.example.com"));
    gw_cors_free(c);
}

/* Bearer tokens of an access file (issue 23): a presented token matches
 * its own line and yields that line's scope (NULL for an unscoped one),
 * the first line when a token is written twice; a wrong, longer, shorter
 * or empty token matches none and yields NULL; "Bearer " is required. */
static void test_bearer_token_scopes(void **state)
{
    (void)state;
    static const char file[] = "tok-produce produce:emails\n"
                               "tok-unscoped\n"
                               "tok-read read:*\n"
                               "tok-produce manage:*\n";
    struct bg_scopes *sc = NULL;
    char err[128];
    assert_int_equal(bg_scopes_parse(&sc, file, sizeof file - 1, err, sizeof err), 0);
    struct gw_auth *a = gw_auth_new(sc);
    assert_non_null(a);
    const struct bg_scope *scope = (const struct bg_scope *)1;
    assert_int_equal(gw_auth_match(a, "tok-produce", 11, &scope), 1);
    assert_ptr_equal(scope, bg_scopes_token_scope(sc, 0));
    assert_true(bg_scope_allows(scope, BG_SCOPE_PRODUCE, "emails", 6));
    assert_false(bg_scope_allows(scope, BG_SCOPE_MANAGE, "emails", 6)); /* the first line's */
    assert_int_equal(gw_auth_match(a, "tok-unscoped", 12, &scope), 1);
    assert_null(scope);
    assert_int_equal(gw_auth_match(a, "tok-read", 8, &scope), 1);
    assert_ptr_equal(scope, bg_scopes_token_scope(sc, 2));
    assert_non_null(scope);
    static const char *const wrong[] = {"tok-rea", "tok-readx", "tok-reae", "", "TOK-READ"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        scope = (const struct bg_scope *)1;
        assert_int_equal(gw_auth_match(a, wrong[i], strlen(wrong[i]), &scope), 0);
        assert_null(scope);
    }
    assert_int_equal(gw_auth_check(a, "Bearer tok-read", &scope), 1);
    assert_ptr_equal(scope, bg_scopes_token_scope(sc, 2));
    assert_int_equal(gw_auth_check(a, "Basic tok-read", &scope), 0);
    assert_int_equal(gw_auth_check(a, NULL, &scope), 0);
    gw_auth_free(a);
    bg_scopes_free(sc);
}

/* A token checks for its own reservation only: another id, another
 * reservation count, another key or any changed character fails. */
static void test_tokens(void **state)
{
    (void)state;
    struct bg_token_key k1 = {{1, 2, 3, 4}}, k2 = {{1, 2, 3, 5}};
    char t[BG_TOKEN_MAX];
    bg_token_make(&k1, 42, 3, t);
    assert_int_equal(bg_token_check(&k1, t, 42, 3), 0);
    assert_int_equal(bg_token_check(&k1, t, 42, 4), BG_NOT_FOUND);
    assert_int_equal(bg_token_check(&k1, t, 43, 3), BG_NOT_FOUND);
    assert_int_equal(bg_token_check(&k2, t, 42, 3), BG_NOT_FOUND);
    for (size_t i = 0; t[i]; i++) {
        char copy[BG_TOKEN_MAX];
        strcpy(copy, t);
        copy[i] = copy[i] == '0' ? '1' : '0';
        assert_int_equal(bg_token_check(&k1, copy, 42, 3), BG_NOT_FOUND);
    }
    assert_int_equal(bg_token_check(&k1, "", 42, 3), BG_NOT_FOUND);
    char longer[BG_TOKEN_MAX + 8];
    snprintf(longer, sizeof longer, "%sx", t);
    assert_int_equal(bg_token_check(&k1, longer, 42, 3), BG_NOT_FOUND);
}

/* ---- idempotency ------------------------------------------------------- */

static const uint64_t table_key[4] = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull,
                                       0x1716151413121110ull, 0x1f1e1d1c1b1a1918ull};

/* A put request into tube with body text and the default numbers. */
static struct gw_put_request put_req(const char *tube, const char *text)
{
    return (struct gw_put_request){tube, GW_DEFAULT_PRIORITY, 0, GW_DEFAULT_TTR, text, strlen(text)};
}

/* Keys are remembered for the window, then forgotten; bad keys are refused. */
static void test_idempotency(void **state)
{
    (void)state;
    struct gw_idempotency *t = gw_idempotency_new(table_key);
    assert_non_null(t);
    uint64_t id = 0;
    const char *st = NULL;
    uint64_t pos = 0;
    bg_time t0 = 100 * BG_SECOND;
    struct gw_put_request req = put_req("emails", "hello");
    assert_int_equal(gw_idempotency_lookup(t, "k1", &req, t0, &id, &st, &pos), GW_IDEM_NEW);
    assert_int_equal(gw_idempotency_remember(t, "k1", &req, 9, "delayed", 42, t0), 0);
    assert_int_equal(gw_idempotency_lookup(t, "k1", &req, t0 + BG_SECOND, &id, &st, &pos), GW_IDEM_SAME);
    assert_int_equal(pos, 42); /* a replay's answer waits for the original's log position */
    assert_int_equal(id, 9);
    assert_string_equal(st, "delayed");
    assert_int_equal(gw_idempotency_lookup(t, "k2", &req, t0, &id, &st, &pos), GW_IDEM_NEW);
    bg_time late = t0 + (bg_time)GW_IDEMPOTENCY_WINDOW_S * BG_SECOND;
    assert_int_equal(gw_idempotency_lookup(t, "k1", &req, late - 1, &id, &st, &pos), GW_IDEM_SAME);
    assert_int_equal(gw_idempotency_lookup(t, "k1", &req, late, &id, &st, &pos), GW_IDEM_NEW);
    static const char *const keys[] = {"a", "order-123", "x~!@#$%^&*()_+"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) assert_true(gw_idempotency_valid_key(keys[i]));
    char too_long[GW_IDEMPOTENCY_KEY_MAX + 2];
    memset(too_long, 'k', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = '\0';
    static const char *const bad[] = {"", "with space", "tab\t", "caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_false(gw_idempotency_valid_key(bad[i]));
    assert_false(gw_idempotency_valid_key(too_long));
    gw_idempotency_free(t);
}

/* A key is bound to its request: the same tube, priority, delay, ttr and
 * body replay; a change in any one of them is a mismatch, another tube
 * first. A body that differs after a NUL or only in length counts too. */
static void test_idempotency_fingerprint(void **state)
{
    (void)state;
    struct gw_idempotency *t = gw_idempotency_new(table_key);
    assert_non_null(t);
    static const char body[] = "pay 10\0EUR";
    struct gw_put_request first = {"pay", 5, 0, 30, body, sizeof body - 1};
    assert_int_equal(gw_idempotency_remember(t, "k", &first, 7, "ready", 0, 0), 0);
    uint64_t id = 0;
    const char *st = NULL;
    uint64_t pos = 0;
    struct gw_put_request same = first;
    assert_int_equal(gw_idempotency_lookup(t, "k", &same, 0, &id, &st, &pos), GW_IDEM_SAME);
    assert_int_equal(id, 7);
    struct gw_put_request other[7];
    for (int i = 0; i < 7; i++) other[i] = first;
    other[0].tube = "payments";
    other[1].pri = 6;
    other[2].delay_s = 1;
    other[3].ttr_s = 31;
    other[4].body = "pay 10\0USD";
    other[5].len = sizeof body - 2;          /* a prefix of the body */
    other[6].body = "pay 99\0EUR";
    assert_int_equal(gw_idempotency_lookup(t, "k", &other[0], 0, &id, &st, &pos), GW_IDEM_OTHER_TUBE);
    for (int i = 1; i < 7; i++)
        if (gw_idempotency_lookup(t, "k", &other[i], 0, &id, &st, &pos) != GW_IDEM_OTHER_REQUEST)
            fail_msg("changed field %d: not a mismatch", i);
    gw_idempotency_free(t);
}

/* The table never holds more than GW_IDEMPOTENCY_MAX keys: the oldest go. */
static void test_idempotency_bounded(void **state)
{
    (void)state;
    struct gw_idempotency *t = gw_idempotency_new(table_key);
    char key[32];
    struct gw_put_request req = put_req("t", "x");
    uint64_t id = 0, pos = 0;
    const char *st = NULL;
    for (int i = 0; i < GW_IDEMPOTENCY_MAX + 10; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(gw_idempotency_remember(t, key, &req, (uint64_t)i, "ready", 0, 0), 0);
    }
    assert_int_equal(gw_idempotency_lookup(t, "key-0", &req, 0, &id, &st, &pos), GW_IDEM_NEW);
    assert_int_equal(gw_idempotency_lookup(t, "key-9", &req, 0, &id, &st, &pos), GW_IDEM_NEW);
    assert_int_equal(gw_idempotency_lookup(t, "key-10", &req, 0, &id, &st, &pos), GW_IDEM_SAME);
    snprintf(key, sizeof key, "key-%d", GW_IDEMPOTENCY_MAX + 9);
    assert_int_equal(gw_idempotency_lookup(t, key, &req, 0, &id, &st, &pos), GW_IDEM_SAME);
    assert_int_equal(id, GW_IDEMPOTENCY_MAX + 9);
    gw_idempotency_free(t);
}

/* ---- the keyed hash ---------------------------------------------------- */

/* bg_siphash is SipHash-2-4: the reference vectors (key 00..0f, messages
 * 00, 00 01, ...), for every length that ends a word or not. */
static void test_siphash_vectors(void **state)
{
    (void)state;
    static const uint64_t key[2] = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
    static const struct { size_t len; uint64_t want; } v[] = {
        {0, 0x726fdb47dd0e0e31ull}, {1, 0x74f839c593dc67fdull}, {7, 0xab0200f58b01d137ull},
        {8, 0x93f5f5799a932462ull}, {15, 0xa129ca6149be45e5ull}, {16, 0x3f2acc7f57c29bdbull},
    };
    unsigned char msg[16];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (unsigned char)i;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (bg_siphash(key, msg, v[i].len) != v[i].want)
            fail_msg("length %zu: %016llx, want %016llx", v[i].len,
                     (unsigned long long)bg_siphash(key, msg, v[i].len), (unsigned long long)v[i].want);
    /* no bytes at NULL (an empty job body): the empty message, and nothing
     * passed to memcpy that UBSan stops (a put with an Idempotency-Key and
     * an empty body aborted the sanitizer build) */
    assert_true(bg_siphash(key, NULL, 0) == v[0].want);
}

/* The idempotency table's buckets depend on its key: keys found to share
 * one bucket under one table key (what an attacker who knew it would
 * send) spread over many buckets under another, and the same input hashes
 * differently under two keys. */
static void test_idempotency_hash_is_keyed(void **state)
{
    (void)state;
    static const uint64_t other_key[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull,
                                          0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
    struct gw_idempotency *a = gw_idempotency_new(table_key);
    struct gw_idempotency *b = gw_idempotency_new(other_key);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(bg_siphash(table_key, "order-1", 7) != bg_siphash(other_key, "order-1", 7));
    enum { N = 16 };
    char found[N][24];
    int n = 0;
    size_t target = gw_idempotency_bucket(a, "order-0");
    for (unsigned i = 0; n < N; i++) { /* about 65536 tries per key */
        char key[24];
        snprintf(key, sizeof key, "order-%u", i);
        if (gw_idempotency_bucket(a, key) == target) strcpy(found[n++], key);
    }
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= gw_idempotency_bucket(b, found[k]) == gw_idempotency_bucket(b, found[i]);
        distinct += !seen;
    }
    assert_true(distinct >= N - 2);
    gw_idempotency_free(a);
    gw_idempotency_free(b);
}

/* ---- the dashboard's files -------------------------------------------- */

/* The table built from ui/: index.html is there (and is what "" finds),
 * names are sorted and unique, each file has bytes, a known Content-Type
 * and a strong quoted ETag of 32 hex digits, distinct per content. */
static void test_ui_assets(void **state)
{
    (void)state;
    assert_true(gw_ui_assets_count >= 1);
    const struct gw_asset *index = gw_ui_find("index.html");
    assert_non_null(index);
    assert_ptr_equal(gw_ui_find(""), index);
    assert_string_equal(index->content_type, "text/html; charset=utf-8");
    static const char *const types[] = {"text/html; charset=utf-8", "text/css; charset=utf-8",
                                        "text/javascript; charset=utf-8", "image/svg+xml",
                                        "image/png", "text/plain; charset=utf-8"};
    for (size_t i = 0; i < gw_ui_assets_count; i++) {
        const struct gw_asset *a = &gw_ui_assets[i];
        assert_ptr_equal(gw_ui_find(a->name), a);
        if (i) assert_true(strcmp(gw_ui_assets[i - 1].name, a->name) < 0);
        assert_true(a->len > 0);
        assert_int_equal(a->bytes[a->len], 0); /* a NUL after the bytes */
        int known = 0;
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) known |= strcmp(a->content_type, types[k]) == 0;
        assert_true(known);
        assert_int_equal(strlen(a->etag), 34);
        assert_true(a->etag[0] == '"' && a->etag[33] == '"');
        assert_int_equal(strspn(a->etag + 1, "0123456789abcdef"), 32);
        for (size_t k = 0; k < i; k++)
            if (gw_ui_assets[k].len != a->len || memcmp(gw_ui_assets[k].bytes, a->bytes, a->len) != 0)
                assert_string_not_equal(gw_ui_assets[k].etag, a->etag);
    }
    static const char *const missing[] = {"nope.js", "INDEX.HTML", "index.html/", "../index.html", "/index.html"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) assert_null(gw_ui_find(missing[i]));
}

/* If-None-Match: "*", the tag itself, W/ of it, or one entry of a list. */
static void test_ui_etag_matches(void **state)
{
    (void)state;
    static const struct { const char *header; int match; } cases[] = {
        {"\"abc\"", 1}, {"W/\"abc\"", 1}, {"*", 1}, {" \"abc\" ", 1},
        {"\"x\", \"abc\"", 1}, {"\"x\",W/\"abc\"", 1}, {"\"x\" ,\t\"abc\"\t", 1},
        {NULL, 0}, {"", 0}, {"\"abd\"", 0}, {"abc", 0}, {"\"abc", 0}, {"\"abc\"x", 0},
        {"w/\"abc\"", 0}, {"\"x\", \"y\"", 0}, {"**", 0}, {",", 0}, {"\"ab\"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (gw_ui_etag_matches(cases[i].header, "\"abc\"") != cases[i].match)
            fail_msg("If-None-Match %s: want %d", cases[i].header ? cases[i].header : "(none)", cases[i].match);
}

/* ---- pages of tubes ----------------------------------------------------- */

/* Names of the page out[0..n), comma-separated, into buf. */
static const char *page_names(const struct bg_tube **out, uint32_t n, char *buf, size_t size)
{
    buf[0] = '\0';
    for (uint32_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", i ? "," : "", out[i]->name);
    return buf;
}

/* List order without filter and sort, a filter on a substring, a sort by a
 * stats field (ties by name) either way, by name either way, offset and
 * limit past the end. */
static void test_tube_page(void **state)
{
    (void)state;
    struct bg_engine e;
    struct bg_client c;
    assert_int_equal(bg_engine_init(&e, 1000, NULL), 0);
    assert_int_equal(bg_client_init(&e, &c, &noop_ops, NULL), 0);
    static const struct { const char *name; int ready; } tubes[] = {
        {"mail", 2}, {"sms", 5}, {"mail-eu", 0}, {"push", 5}, {"a/mail", 1},
    };
    uint64_t id;
    for (size_t i = 0; i < sizeof tubes / sizeof tubes[0]; i++) {
        assert_int_equal(bg_put_copy(&c, tubes[i].name, 0, 100, 60, "d", 1, 0, &id), 0); /* delayed */
        for (int k = 0; k < tubes[i].ready; k++)
            assert_int_equal(bg_put_copy(&c, tubes[i].name, 0, 0, 60, "r", 1, 0, &id), 0);
    }
    static const struct {
        const char *filter, *sort;
        int descending;
        uint64_t offset;
        uint32_t limit;
        uint64_t total;
        const char *want;
    } cases[] = {
        {NULL, NULL, 0, 0, 100, 6, "default,mail,sms,mail-eu,push,a/mail"},
        {NULL, NULL, 0, 2, 3, 6, "sms,mail-eu,push"},
        {"", NULL, 0, 5, 3, 6, "a/mail"},
        {NULL, NULL, 0, 6, 3, 6, ""},
        {NULL, NULL, 0, 1000, 3, 6, ""},
        {"mail", NULL, 0, 0, 100, 3, "mail,mail-eu,a/mail"},
        {"/", NULL, 0, 0, 100, 1, "a/mail"},
        {"nothing", NULL, 0, 0, 100, 0, ""},
        {NULL, "name", 0, 0, 100, 6, "a/mail,default,mail,mail-eu,push,sms"},
        {NULL, "name", 1, 0, 2, 6, "sms,push"},
        {NULL, "current_jobs_ready", 1, 0, 4, 6, "push,sms,mail,a/mail"},
        {NULL, "current_jobs_ready", 0, 0, 3, 6, "default,mail-eu,a/mail"},
        {"mail", "current_jobs_ready", 1, 1, 100, 3, "a/mail,mail-eu"},
        {"mail", NULL, 0, 1, 1, 3, "mail-eu"},
        {NULL, "current_jobs_delayed", 0, 0, 2, 6, "default,a/mail"},
    };
    const struct bg_tube *out[100];
    char names[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gw_tube_page_query q = {cases[i].filter, cases[i].sort ? gw_tube_sort_key(cases[i].sort) : -1,
                                       cases[i].descending, cases[i].offset, cases[i].limit, NULL};
        uint32_t n = 99;
        uint64_t total = 99;
        assert_int_equal(gw_tube_page(&e, 0, &q, out, &n, &total), 0);
        if (total != cases[i].total || strcmp(page_names(out, n, names, sizeof names), cases[i].want) != 0)
            fail_msg("case %zu: total %llu, page %s; want %llu, %s", i, (unsigned long long)total, names,
                     (unsigned long long)cases[i].total, cases[i].want);
    }
    assert_int_equal(gw_tube_sort_key("name"), 0);
    assert_int_equal(gw_tube_sort_key("nope"), -1);
    assert_int_equal(gw_tube_sort_key(""), -1);
    for (int i = 0; gw_tube_sort_key_name(i); i++) assert_int_equal(gw_tube_sort_key(gw_tube_sort_key_name(i)), i);
    assert_true(gw_tube_filter_valid(""));
    assert_true(gw_tube_filter_valid("-a/b+c;d.e$f_(g)"));
    assert_false(gw_tube_filter_valid("a b"));
    assert_false(gw_tube_filter_valid("<script>"));
    char long_filter[BG_TUBE_NAME_MAX + 2];
    memset(long_filter, 'a', sizeof long_filter - 1);
    long_filter[sizeof long_filter - 1] = '\0';
    assert_false(gw_tube_filter_valid(long_filter));
    long_filter[BG_TUBE_NAME_MAX] = '\0';
    assert_true(gw_tube_filter_valid(long_filter));
    bg_client_close(&c, 0);
    bg_engine_destroy(&e);
}

static int by_name_ref(const void *a, const void *b)
{
    return strcmp((*(const struct bg_tube *const *)a)->name, (*(const struct bg_tube *const *)b)->name);
}

static int by_name_desc_ref(const void *a, const void *b) { return by_name_ref(b, a); }

/* Reference order for test_tube_page_matches_a_full_sort: ready count,
 * then name, either way. */
static int ref_descending;
static int ref_order(const void *a, const void *b)
{
    const struct bg_tube *x = *(const struct bg_tube *const *)a, *y = *(const struct bg_tube *const *)b;
    if (x->ready.len != y->ready.len)
        return (x->ready.len < y->ready.len) == !ref_descending ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* With 300 tubes of random ready counts, every page (sort by ready or by
 * name, either way, offsets and limits across the whole range, with and
 * without a filter) equals the same slice of a full sort. */
static void test_tube_page_matches_a_full_sort(void **state)
{
    (void)state;
    struct bg_engine e;
    struct bg_client c;
    assert_int_equal(bg_engine_init(&e, 1000, NULL), 0);
    assert_int_equal(bg_client_init(&e, &c, &noop_ops, NULL), 0);
    srand(7);
    char name[32];
    uint64_t id;
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "t%03d-%c", (i * 37) % 300, i % 3 ? 'x' : 'y');
        int ready = rand() % 5;
        assert_int_equal(bg_put_copy(&c, name, 0, 100, 60, "d", 1, 0, &id), 0);
        for (int k = 0; k < ready; k++) assert_int_equal(bg_put_copy(&c, name, 0, 0, 60, "r", 1, 0, &id), 0);
    }
    const struct bg_tube *all[301], *out[GW_TUBE_PAGE_MAX];
    for (int by_ready = 0; by_ready < 2; by_ready++)
        for (int desc = 0; desc < 2; desc++)
            for (int filtered = 0; filtered < 2; filtered++) {
                size_t m = 0;
                for (uint32_t i = 0; i < e.tube_count; i++)
                    if (!filtered || strstr(e.tube_list[i]->name, "-y")) all[m++] = e.tube_list[i];
                ref_descending = desc;
                if (by_ready) qsort(all, m, sizeof all[0], ref_order);
                else qsort(all, m, sizeof all[0], desc ? by_name_desc_ref : by_name_ref);
                static const uint64_t offsets[] = {0, 1, 7, 99, 100, 250, 299, 300, 301};
                static const uint32_t limits[] = {1, 2, 10, 100, 500};
                for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++)
                    for (size_t li = 0; li < sizeof limits / sizeof limits[0]; li++) {
                        struct gw_tube_page_query q = {filtered ? "-y" : NULL,
                                                       gw_tube_sort_key(by_ready ? "current_jobs_ready" : "name"),
                                                       desc, offsets[oi], limits[li], NULL};
                        uint32_t n;
                        uint64_t total;
                        assert_int_equal(gw_tube_page(&e, 0, &q, out, &n, &total), 0);
                        assert_int_equal(total, m);
                        size_t want = offsets[oi] >= m ? 0 : m - offsets[oi] < limits[li] ? m - offsets[oi] : limits[li];
                        assert_int_equal(n, want);
                        for (uint32_t i = 0; i < n; i++)
                            if (out[i] != all[offsets[oi] + i])
                                fail_msg("ready %d desc %d filter %d offset %llu limit %u: [%u] %s, want %s", by_ready,
                                         desc, filtered, (unsigned long long)offsets[oi], limits[li], i, out[i]->name,
                                         all[offsets[oi] + i]->name);
                    }
            }
    bg_client_close(&c, 0);
    bg_engine_destroy(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_rows),
        cmocka_unit_test(test_route_paths),
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_route_long_url),
        cmocka_unit_test(test_match_once),
        cmocka_unit_test(test_head_complete_at_its_deadline),
        cmocka_unit_test(test_head_wherever_get),
        cmocka_unit_test(test_outcome_problems),
        cmocka_unit_test(test_json_job_bodies),
        cmocka_unit_test(test_base64_decode),
        cmocka_unit_test(test_head_check),
        cmocka_unit_test(test_framing_fields),
        cmocka_unit_test(test_batch_body_limit),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_bearer_token_scopes),
        cmocka_unit_test(test_cors_origins),
        cmocka_unit_test(test_allowed_hosts),
        cmocka_unit_test(test_idempotency),
        cmocka_unit_test(test_idempotency_bounded),
        cmocka_unit_test(test_idempotency_fingerprint),
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_idempotency_hash_is_keyed),
        cmocka_unit_test(test_ui_assets),
        cmocka_unit_test(test_ui_etag_matches),
        cmocka_unit_test(test_tube_page),
        cmocka_unit_test(test_tube_page_matches_a_full_sort),
    };
    return cmocka_run_group_tests_name("gateway", tests, NULL, NULL);
}

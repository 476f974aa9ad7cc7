/* push-bench: how fast beangate's push delivery is (issue 14).
 *
 * One process, one libevent loop, that is both ends of the pipe:
 *   - a receiver: libevent's evhttp server on a free loopback port, which
 *     answers 204 to every POST at once and, for a push run, reads the put
 *     time the producer wrote into the body;
 *   - a producer: one beanstalk connection to a beangate it starts itself
 *     with `--push 'tube=bench url=http://127.0.0.1:RECEIVER/ concurrency=C'`;
 *     it keeps `window` jobs between put and delivery (a closed loop, so the
 *     latency is that of a busy server, not of a backlog it built itself).
 * A push run measures jobs/s (jobs delivered / time from the first put to
 * the last delivery) and the put-to-delivery latency (p50, p99). Then wrk
 * (Debian's `wrk`) is run against the same receiver with the same number of
 * connections: the rate the receiver serves directly, which push is
 * compared with. Each is repeated and the medians are printed.
 *
 *   push-bench --beangate build/beangate -c 64 -n 200000 -r 5
 *
 * Every run is bounded in jobs and time (--timeout). Loopback only. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

struct options {
    const char *beangate;
    const char *wrk;
    int concurrency, runs, body, window, wrk_seconds, timeout_s, csv;
    long jobs;
};

struct run {
    struct options *o;
    struct event_base *base;
    struct bufferevent *bev;
    long put, delivered, replies;
    uint64_t first_put, last_delivery;
    uint64_t *latency;          /* ns, one per delivered job */
    int recording;              /* a push run: read put times from bodies */
    int failed;
    char body_pad[65536];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A free loopback TCP port (bound to port 0 a moment ago). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free_port");
        exit(2);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- the receiver ----------------------------------------------------------- */

static void put_more(struct run *r);

static void on_request(struct evhttp_request *req, void *arg)
{
    struct run *r = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (r->recording) {
        char stamp[21] = {0};
        evbuffer_copyout(in, stamp, 20);
        uint64_t put_at = strtoull(stamp, NULL, 10);
        uint64_t t = now_ns();
        if (r->delivered < r->o->jobs) r->latency[r->delivered] = t > put_at ? t - put_at : 0;
        r->delivered++;
        r->last_delivery = t;
    }
    evhttp_send_reply(req, 204, "No Content", NULL);
    if (r->recording) {
        if (r->delivered >= r->o->jobs) event_base_loopbreak(r->base);
        else put_more(r);
    }
}

/* ---- the producer --------------------------------------------------------------- */

/* Put jobs until `window` are between put and delivery, or all are put. */
static void put_more(struct run *r)
{
    struct evbuffer *out = bufferevent_get_output(r->bev);
    while (r->put < r->o->jobs && r->put - r->delivered < r->o->window) {
        char stamp[21];
        snprintf(stamp, sizeof stamp, "%020llu", (unsigned long long)now_ns());
        evbuffer_add_printf(out, "put 0 0 120 %d\r\n", r->o->body);
        evbuffer_add(out, stamp, 20);
        evbuffer_add(out, r->body_pad, (size_t)(r->o->body - 20));
        evbuffer_add(out, "\r\n", 2);
        if (!r->put) r->first_put = now_ns();
        r->put++;
    }
}

static void on_reply(struct bufferevent *bev, void *arg)
{
    struct run *r = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char *line;
    size_t n;
    while ((line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF))) {
        if (strncmp(line, "INSERTED ", 9) != 0 && strncmp(line, "USING ", 6) != 0) {
            fprintf(stderr, "push-bench: beangate answered %s\n", line);
            r->failed = 1;
            event_base_loopbreak(r->base);
        }
        r->replies++;
        free(line);
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct run *r = arg;
    (void)bev;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        fprintf(stderr, "push-bench: the beanstalk connection closed\n");
        r->failed = 1;
        event_base_loopbreak(r->base);
    }
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    (void)fd;
    (void)what;
    fprintf(stderr, "push-bench: timed out with %ld of %ld jobs delivered\n", r->delivered, r->o->jobs);
    r->failed = 1;
    event_base_loopbreak(r->base);
}

/* ---- processes ------------------------------------------------------------------ */

/* fork/exec argv with stdin from /dev/null and stdout to out_fd (-1: /dev/null). */
static pid_t spawn(char *const argv[], int out_fd)
{
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0);
        dup2(out_fd >= 0 ? out_fd : devnull, 1);
        dup2(devnull, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Connect to 127.0.0.1:port, retrying for up to 10 s; the fd or -1. */
static int connect_retry(int port)
{
    uint64_t deadline = now_ns() + 10000000000ull;
    while (now_ns() < deadline) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL); /* the server is starting: poll its port */
    }
    return -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A receiver on a free loopback port for r; its port. */
static int start_receiver(struct run *r, struct evhttp **http)
{
    *http = evhttp_new(r->base);
    evhttp_set_gencb(*http, on_request, r);
    evhttp_set_allowed_methods(*http, EVHTTP_REQ_POST);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(*http, "127.0.0.1", 0);
    if (!s) {
        fprintf(stderr, "push-bench: cannot bind the receiver\n");
        exit(2);
    }
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&a, &len);
    return ntohs(a.sin_port);
}

/* One push run: jobs/s, p50 and p99 (ms). 0, or -1 on failure. */
static int push_run(struct options *o, double *rate, double *p50, double *p99)
{
    struct run r = {.o = o, .recording = 1};
    memset(r.body_pad, 'x', sizeof r.body_pad);
    r.latency = calloc((size_t)o->jobs, sizeof *r.latency);
    r.base = event_base_new();
    struct evhttp *http;
    int rport = start_receiver(&r, &http);
    int port = free_port(), hport = free_port();
    char p[16], hp[16], sub[256];
    snprintf(p, sizeof p, "%d", port);
    snprintf(hp, sizeof hp, "%d", hport);
    snprintf(sub, sizeof sub, "tube=bench url=http://127.0.0.1:%d/ concurrency=%d timeout=60", rport,
             o->concurrency);
    char *argv[] = {(char *)o->beangate, "-l", "127.0.0.1", "-p", p, "--http-port", hp, "--push", sub, NULL};
    pid_t pid = spawn(argv, -1);
    int fd = connect_retry(port);
    if (fd < 0) {
        fprintf(stderr, "push-bench: beangate did not listen on %d\n", port);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    evutil_make_socket_nonblocking(fd);
    r.bev = bufferevent_socket_new(r.base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(r.bev, on_reply, NULL, on_event, &r);
    bufferevent_enable(r.bev, EV_READ | EV_WRITE);
    evbuffer_add_printf(bufferevent_get_output(r.bev), "use bench\r\n");
    struct event *guard = evtimer_new(r.base, on_timeout, &r);
    struct timeval tv = {o->timeout_s, 0};
    evtimer_add(guard, &tv);
    put_more(&r);
    event_base_dispatch(r.base);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    int rc = r.failed ? -1 : 0;
    if (!rc) {
        qsort(r.latency, (size_t)o->jobs, sizeof *r.latency, cmp_u64);
        *rate = (double)o->jobs / ((double)(r.last_delivery - r.first_put) / 1e9);
        *p50 = (double)r.latency[o->jobs / 2] / 1e6;
        *p99 = (double)r.latency[o->jobs * 99 / 100] / 1e6;
    }
    event_free(guard);
    bufferevent_free(r.bev);
    evhttp_free(http);
    event_base_free(r.base);
    free(r.latency);
    return rc;
}

static void on_child(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

/* wrk against the receiver: requests/s, or -1. */
static double wrk_run(struct options *o)
{
    struct run r = {.o = o};
    r.base = event_base_new();
    struct evhttp *http;
    int rport = start_receiver(&r, &http);
    char script[] = "/tmp/push-bench-wrk-XXXXXX";
    int sfd = mkstemp(script);
    char body[65536 + 1];
    memset(body, 'x', (size_t)o->body);
    body[o->body] = '\0';
    dprintf(sfd, "wrk.method = \"POST\"\nwrk.body = \"%s\"\nwrk.headers[\"Content-Type\"] = "
                 "\"application/octet-stream\"\n", body);
    close(sfd);
    char c[16], d[16], url[64];
    snprintf(c, sizeof c, "%d", o->concurrency);
    snprintf(d, sizeof d, "%ds", o->wrk_seconds);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", rport);
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    struct event *child = evsignal_new(r.base, SIGCHLD, on_child, r.base);
    event_add(child, NULL);
    char *argv[] = {(char *)o->wrk, "-t1", "-c", c, "-d", d, "-s", script, url, NULL};
    pid_t pid = spawn(argv, pipefd[1]);
    close(pipefd[1]);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) event_base_dispatch(r.base);
    char out[8192] = {0};
    ssize_t n = read(pipefd[0], out, sizeof out - 1);
    close(pipefd[0]);
    unlink(script);
    event_free(child);
    evhttp_free(http);
    event_base_free(r.base);
    const char *at = n > 0 ? strstr(out, "Requests/sec:") : NULL;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !at) {
        fprintf(stderr, "push-bench: wrk failed: %s\n", out);
        return -1;
    }
    return strtod(at + 13, NULL);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
            double t = v[k];
            v[k] = v[k - 1];
            v[k - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "Use: push-bench --beangate PATH [options]\n"
            " --beangate PATH   the beangate binary to start (one per run)\n"
            " -c N              concurrency: of the subscription and of wrk's connections (default 64)\n"
            " -n N              jobs per push run (default 100000)\n"
            " -r N              runs of each kind; medians are printed (default 5)\n"
            " -d BYTES          job and request body size, 20 to 65536 (default 100)\n"
            " -w N              jobs between put and delivery at most (default 2 x concurrency)\n"
            " --wrk PATH        the wrk binary (default wrk); --no-wrk skips the baseline\n"
            " --wrk-seconds S   each wrk run (default 5)\n"
            " --timeout S       a push run fails after S seconds (default 120)\n"
            " --csv             one line: concurrency,jobs_per_s,p50_ms,p99_ms,wrk_rps,ratio\n");
}

int main(int argc, char **argv)
{
    struct options o = {.wrk = "wrk", .concurrency = 64, .runs = 5, .body = 100, .wrk_seconds = 5,
                        .timeout_s = 120, .jobs = 100000};
    int no_wrk = 0;
    static const struct option longs[] = {
        {"beangate", required_argument, 0, 'B'}, {"wrk", required_argument, 0, 'W'},
        {"no-wrk", no_argument, 0, 'N'}, {"wrk-seconds", required_argument, 0, 'S'},
        {"timeout", required_argument, 0, 'T'}, {"csv", no_argument, 0, 'C'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "c:n:r:d:w:h", longs, NULL)) != -1) {
        switch (opt) {
        case 'B': o.beangate = optarg; break;
        case 'W': o.wrk = optarg; break;
        case 'N': no_wrk = 1; break;
        case 'S': o.wrk_seconds = atoi(optarg); break;
        case 'T': o.timeout_s = atoi(optarg); break;
        case 'C': o.csv = 1; break;
        case 'c': o.concurrency = atoi(optarg); break;
        case 'n': o.jobs = atol(optarg); break;
        case 'r': o.runs = atoi(optarg); break;
        case 'd': o.body = atoi(optarg); break;
        case 'w': o.window = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.beangate || o.concurrency < 1 || o.concurrency > 1024 || o.jobs < 1 || o.runs < 1 ||
        o.runs > 50 || o.body < 20 || o.body > 65536 || o.wrk_seconds < 1 || o.timeout_s < 1) {
        usage(stderr);
        return 2;
    }
    if (!o.window) o.window = 2 * o.concurrency;
    signal(SIGPIPE, SIG_IGN);
    double rate[50], p50[50], p99[50], wrk[50];
    for (int i = 0; i < o.runs; i++) {
        if (push_run(&o, &rate[i], &p50[i], &p99[i]) != 0) return 1;
        if (!o.csv)
            printf("push run %d: c=%d %ld jobs: %.0f jobs/s, put->delivery p50 %.3f ms, p99 %.3f ms\n", i + 1,
                   o.concurrency, o.jobs, rate[i], p50[i], p99[i]);
    }
    for (int i = 0; !no_wrk && i < o.runs; i++) {
        if ((wrk[i] = wrk_run(&o)) < 0) return 1;
        if (!o.csv) printf("wrk run %d: c=%d: %.0f requests/s\n", i + 1, o.concurrency, wrk[i]);
    }
    double mr = median(rate, o.runs), m50 = median(p50, o.runs), m99 = median(p99, o.runs);
    double mw = no_wrk ? 0 : median(wrk, o.runs);
    if (o.csv)
        printf("%d,%.0f,%.3f,%.3f,%.0f,%.2f\n", o.concurrency, mr, m50, m99, mw, mw > 0 ? mr / mw : 0);
    else
        printf("median of %d: push %.0f jobs/s, p50 %.3f ms, p99 %.3f ms; wrk %.0f requests/s; push/wrk %.2f\n",
               o.runs, mr, m50, m99, mw, mw > 0 ? mr / mw : 0);
    return 0;
}

/* gateway.h - the HTTP/JSON gateway: beanstalk as resources, served by
 * libmicrohttpd in external polling mode on the server's libevent loop, over
 * the same engine as the TCP protocol. No thread other than the loop's
 * touches the queue.
 *
 * Files:
 *   http.c    the daemon, its wiring into libevent, request bodies, routing
 *   routes.c  one handler per route: engine calls, JSON or raw replies
 *   json.c    rendering of jobs, tubes, stats and problem+json errors
 *   idempotency.c  Idempotency-Key -> job, for a window
 *   router.c  the route table and URL matching (no libmicrohttpd)
 *   auth.c    optional bearer tokens, compared in constant time
 *   metrics.c /metrics (Prometheus text), /livez, /readyz, request counters
 */
#ifndef BEANGATE_GATEWAY_H
#define BEANGATE_GATEWAY_H

#include <event2/event.h>
#include <jansson.h>
#include <microhttpd.h>

#include "../core/core.h"
#include "../io/wal.h"

#define GW_MAX_WAIT_S 30          /* long-poll cap */
#define GW_DEFAULT_PRIORITY 2147483648u /* 2^31, as common clients use */
#define GW_DEFAULT_TTR 60
#define GW_CONNECTION_LIMIT 1024
#define GW_IDLE_TIMEOUT_S 60
#define GW_IDEMPOTENCY_WINDOW_S 300   /* a retried put within this returns the first job */
#define GW_IDEMPOTENCY_KEY_MAX 128
#define GW_IDEMPOTENCY_STORED_MAX (GW_IDEMPOTENCY_KEY_MAX + 4) /* a batch entry's "KEY#99" */
#define GW_IDEMPOTENCY_MAX 100000     /* keys remembered at most */
#define GW_BATCH_MAX 100              /* entries in a batch put or reserve */
#define GW_BATCH_BODY_MAX (32u << 20) /* bytes of JSON in a batch put */

#define GW_AUTH_TOKEN_MAX 512         /* bytes in one bearer token */
#define GW_AUTH_TOKENS_MAX 256        /* tokens configured at most */
#define GW_METRICS_TUBES_MAX 1000     /* tubes exported in /metrics at most */

struct gateway_config {
    const char *listen_addr;      /* default 127.0.0.1 */
    const char *port;             /* default 11301 */
    /* the write-ahead log (NULL without -b): a response that reports a
     * change waits until the log's mark for it is on disk (-f 0) */
    struct wal *wal;
    void *log_arg;                /* process_info's argument */
    const char *const *tokens;    /* bearer tokens (copied); none: no auth */
    size_t token_count;
    int metrics_auth;             /* /metrics needs a token too */
    bg_time started_at;           /* the server's start, for uptime */
    /* process facts for GET /stats (binlog figures); arg is log_arg */
    void (*process_info)(void *arg, struct bg_process_info *pi);
};

struct gateway;

/* Start the gateway on base. NULL on failure (message printed). now() is
 * the server's monotonic clock; after_run() lets the server re-arm its
 * engine timer after the gateway changed the queue. */
struct gateway *gateway_start(struct event_base *base, struct bg_engine *engine,
                              const struct gateway_config *cfg, bg_time (*now)(void),
                              void (*after_run)(void *), void *after_run_arg);
/* Resume every suspended request, stop the daemon, free everything. */
void gateway_stop(struct gateway *gw);
/* /readyz answers 200 once the server says it serves (listeners up), and
 * while it is not draining. The gateway starts not ready. NULL: no-op. */
void gateway_set_ready(struct gateway *gw, int ready);

/* ---- internal: shared by http.c and routes.c --------------------------- */

/* One HTTP request as the gateway follows it across handler calls. */
struct gw_request {
    struct gateway *gw;
    struct MHD_Connection *conn;
    struct bg_buf body;
    uint64_t body_limit;
    int body_too_big;
    int responded;
    /* long-poll */
    struct bg_client waiter;
    int waiter_active;
    int suspended;
    int wait_outcome;             /* 0: got jobs; BG_TIMED_OUT */
    uint32_t want;                /* batch size asked for (0: single) */
    uint32_t got;
    /* metrics: from the first access-handler call to the completion */
    bg_time started;
    int route;                    /* route table index; -1: no route */
    int method;                   /* gw_metrics_method_index */
    unsigned status;              /* status queued; 0: none yet */
    int counted;                  /* in the cmd-* counters already */
    uint32_t commands;            /* beanstalk commands it performs (a batch put: its entries) */
    uint64_t job_ids[GW_BATCH_MAX]; /* reserved for this request, in order */
    uint32_t job_reserves[GW_BATCH_MAX];
    struct gw_request *next_woken;
    struct gw_request *prev_waiting, *next_waiting; /* gw->waiting */
    int listed;
    struct event *peer_ev;        /* watches the socket while listed */
    struct wal_hold hold;         /* response queued, waiting for the log */
    struct gw_request *held_prev, *held_next; /* gw->held */
    int held;
};

struct gateway {
    struct bg_engine *engine;
    struct event_base *base;
    struct MHD_Daemon *daemon;
    struct event *epoll_ev, *timer_ev, *run_ev;
    struct bg_client holder;      /* owns every HTTP reservation */
    struct bg_token_key key;
    bg_time (*now)(void);
    void (*after_run)(void *);
    void *after_run_arg;
    struct gw_request *woken;     /* long-polls resolved, to resume */
    struct gw_request *waiting;   /* every suspended long-poll */
    struct gw_idempotency *idempotency;
    struct gw_request *held;      /* responses waiting for the log */
    struct gateway_config cfg;
    struct gw_auth *auth;         /* NULL: no token configured */
    int metrics_auth;
    int ready;                    /* gateway_set_ready */
    bg_time started_at;
    uint64_t in_flight;           /* requests begun and not completed */
    struct gw_metrics *metrics;
};

/* Answer with a JSON value (taken over) and a status. */
enum MHD_Result gw_reply_json(struct MHD_Connection *c, unsigned status, json_t *v,
                              const char *location);
/* The same with one more header (name may be NULL). */
enum MHD_Result gw_reply_json_headers(struct MHD_Connection *c, unsigned status, json_t *v,
                                      const char *location, const char *name, const char *value);
/* Answer with application/problem+json for an outcome or status. */
enum MHD_Result gw_reply_problem(struct MHD_Connection *c, unsigned status, const char *code,
                                 const char *detail);
/* The same with one more header (name may be NULL). */
enum MHD_Result gw_reply_problem_header(struct MHD_Connection *c, unsigned status,
                                        const char *code, const char *detail,
                                        const char *name, const char *value);
/* The same with an Allow header (405). */
enum MHD_Result gw_reply_problem_allow(struct MHD_Connection *c, unsigned status, const char *code,
                                       const char *detail, const char *allow);
/* Answer with no body. */
enum MHD_Result gw_reply_empty(struct MHD_Connection *c, unsigned status);

/* router.c */
enum gw_route_id {
    R_STATS, R_TUBES, R_TUBE, R_TUBE_JOBS, R_TUBE_BATCH, R_TUBE_RESERVE, R_TUBE_KICK,
    R_TUBE_PAUSE, R_TUBE_PEEK, R_RESERVE, R_JOB, R_JOB_BODY, R_JOB_ACTION, R_JOB_RESERVE,
    R_OPENAPI, R_LIVEZ, R_READYZ, R_METRICS,
};
/* The methods the handlers tell apart; any other is GW_OTHER. */
enum gw_method { GW_GET, GW_HEAD, GW_POST, GW_DELETE, GW_OTHER };
enum gw_method gw_method_of(const char *method);
#define GW_MAX_SEGMENTS 4
struct gw_match {
    enum gw_route_id id;
    int index;                    /* in the route table (gw_route_pattern) */
    enum gw_method method;
    const char *allow;            /* the methods the path allows (the Allow header) */
    char buf[1024];
    char *seg[GW_MAX_SEGMENTS];   /* path segments, pointing into buf */
    int nseg;
};
/* Match method and url against the route table: 0 (m->id, m->method,
 * m->seg set), 404 (no such path) or 405 (m->allow lists the methods).
 * HEAD is allowed wherever GET is, and Allow then lists it too. */
int gw_match_route(const char *method, const char *url, struct gw_match *m);
/* The route table: its size, and the path pattern of entry i, such as
 * "/tubes/{tube}/jobs" (the label of the HTTP metrics). */
int gw_route_count(void);
const char *gw_route_pattern(int i);
/* The methods of entry i as the table writes them ("GET, DELETE"); HEAD is
 * implied by GET. NULL if i is out of range. */
const char *gw_route_methods(int i);
/* Turn every "%2F" (or "%2f") of s into '/', in place: the unescape callback
 * leaves them encoded so that a tube name may hold '/' in a path segment. */
void gw_decode_slashes(char *s);

/* routes.c: dispatch a complete request. */
enum MHD_Result gw_route(struct gw_request *r, const char *method, const char *url);
/* routes.c: a long-poll waiter got a job / ended. */
extern const struct bg_client_ops gw_waiter_ops;
/* http.c: queue r to be resumed on the next loop turn. */
void gw_wake(struct gw_request *r);
/* http.c: track / forget a suspended long-poll (resumed at shutdown).
 * While listed, its socket is watched: a client that closes or resets ends
 * the wait at once (wait_outcome BG_TIMED_OUT, woken). */
void gw_list(struct gw_request *r);
void gw_unlist(struct gw_request *r);
/* http.c: nonzero unless r's client has closed or reset its connection
 * (a FIN counts as gone, even after pipelined bytes). */
int gw_peer_alive(struct gw_request *r);
/* http.c: the status of the response queued for r, 0 if none yet. */
unsigned gw_queued_status(const struct gw_request *r);
/* http.c: release the jobs r reserved and did not deliver (r->got = 0). */
void gw_give_back(struct gw_request *r, bg_time now);

/* auth.c: bearer tokens */
struct gw_auth;
/* Copy n tokens (each 1..GW_AUTH_TOKEN_MAX bytes). NULL if one is too long
 * or memory ran out. */
struct gw_auth *gw_auth_new(const char *const *tokens, size_t n);
void gw_auth_free(struct gw_auth *a);
/* Nonzero if token[0..len) is one of the tokens. Constant time: compares
 * every byte of every configured token, whatever matches or not. */
int gw_auth_match(const struct gw_auth *a, const char *token, size_t len);
/* Nonzero if an Authorization header value is "Bearer <a token>". */
int gw_auth_check(const struct gw_auth *a, const char *authorization);

/* metrics.c */
struct gw_metrics;
struct gw_metrics *gw_metrics_new(void);
void gw_metrics_free(struct gw_metrics *m);
/* Index of an HTTP method for the metrics (unknown methods share one). */
int gw_metrics_method_index(const char *method);
const char *gw_metrics_method_name(int index);
/* Count one finished request: route index (-1: none), method index,
 * status (0: none was sent), and its duration. */
void gw_metrics_observe(struct gw_metrics *m, int route, int method, unsigned status,
                        double seconds);
/* Every metric in the Prometheus text format 0.0.4. 0 or BG_OUT_OF_MEMORY. */
int gw_metrics_render(const struct gateway *gw, struct bg_buf *out, bg_time now);
/* The handlers of /metrics, /livez and /readyz. */
enum MHD_Result gw_reply_metrics(struct gw_request *r);
enum MHD_Result gw_reply_livez(struct gw_request *r);
enum MHD_Result gw_reply_readyz(struct gw_request *r);

/* idempotency.c */
struct gw_idempotency;
/* What a put asks for: an Idempotency-Key is bound to it. */
struct gw_put_request {
    const char *tube;
    uint32_t pri, delay_s, ttr_s; /* as given, or their defaults */
    const void *body;
    size_t len;
};
/* What a key says about a put (gw_idempotency_lookup). */
enum gw_idempotency_match {
    GW_IDEM_NEW,                  /* no live entry: store the job */
    GW_IDEM_SAME,                 /* the same put again: answer the first job */
    GW_IDEM_OTHER_TUBE,           /* the key made a job in another tube */
    GW_IDEM_OTHER_REQUEST,        /* ... in this tube, from another body, priority, delay or ttr */
};
/* A table keyed by the 4 words of key (random, chosen at start): two for
 * the buckets, two for the request fingerprints. NULL: out of memory. */
struct gw_idempotency *gw_idempotency_new(const uint64_t key[4]);
void gw_idempotency_free(struct gw_idempotency *t);
/* Nonzero if key is 1..GW_IDEMPOTENCY_KEY_MAX visible ASCII characters. */
int gw_idempotency_valid_key(const char *key);
/* Look key up for the put req; for GW_IDEM_SAME, *job_id and *state are the
 * first put's job and answered state. */
enum gw_idempotency_match gw_idempotency_lookup(struct gw_idempotency *t, const char *key,
                                                const struct gw_put_request *req, bg_time now,
                                                uint64_t *job_id, const char **state);
/* Remember that key and the put req made job_id, answered with `state` (a
 * static string). 0, BG_BAD_FORMAT (key or tube too long) or
 * BG_OUT_OF_MEMORY. */
int gw_idempotency_remember(struct gw_idempotency *t, const char *key,
                            const struct gw_put_request *req, uint64_t job_id, const char *state,
                            bg_time now);
/* The bucket of key: a keyed hash, so it depends on the table's key. */
size_t gw_idempotency_bucket(const struct gw_idempotency *t, const char *key);

/* openapi.c (generated from openapi/openapi.yaml) */
extern const char gw_openapi_yaml[];
extern const size_t gw_openapi_yaml_len;

/* json.c */
/* Decode standard base64 (padding optional); NULL if invalid. *n = length. */
char *gw_base64_decode(const char *text, size_t len, size_t *n);
json_t *gw_json_job(const struct bg_engine *e, const struct bg_job *j, bg_time now,
                    const char *token, int with_body);
json_t *gw_json_tube(const struct bg_stats_tube *st);
/* Server stats; pi adds the write-ahead log's figures (may be NULL). */
json_t *gw_json_server(const struct bg_engine *e, const struct bg_process_info *pi);
#endif

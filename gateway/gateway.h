/* gateway.h - the HTTP/JSON gateway: beanstalk as resources, served by
 * libmicrohttpd in external polling mode on the server's libevent loop, over
 * the same engine as the TCP protocol. No thread other than the loop's
 * touches the queue.
 *
 * Files, from the top layer down. A file uses only what files of a lower
 * layer define, so there is no circle (tests/http/gateway_layers.py):
 *   http.c      the daemon, its wiring into libevent, the request lifecycle:
 *               match once, token, framing and body limits, dispatch,
 *               counters, replies held for the log. The only file that
 *               speaks MHD_Result.
 *   admit.c     the listening socket and every connection's life outside a
 *               request: accept with limits (overall, per address), the
 *               first request head checked before libmicrohttpd gets the
 *               socket, header deadlines, eviction, the fd-limit back-off
 *   router.c    the route table (path pattern, method, handler, body limit,
 *               auth rule, command counter) and URL matching
 *   routes.c    the handlers of the queue's resources: engine calls
 *   bulk.c      a bulk kick or delete run in bounded steps, one per loop turn
 *   metrics.c   /metrics (Prometheus text), /livez, /readyz, request counters
 *   ui.c        the dashboard's files at /ui/ (ui.h; ui/ built in by CMake)
 *   request.c   what a handler asks of its request: query numbers, headers,
 *               long-poll suspension, wake-up and the watch on its socket
 *   reply.c     responses: JSON, problem+json (status titles; the table of
 *               outcome -> status, code, detail), empty, raw job, bytes
 *   json.c      rendering of jobs, tubes and stats; base64
 *   framing.c   where a request's body ends: Content-Length and
 *               Transfer-Encoding judged once, for raw heads and parsed ones
 *   tube_page.c one page of the tubes' statistics (GET /stats/tubes)
 *   idempotency.c  Idempotency-Key -> job, for a window
 *   auth.c      optional bearer tokens, compared in constant time
 *   cors.c      the origins allowed to call from a browser (CORS), below reply.c
 *   guard.c     what a browser's page must not do: Host names (DNS rebinding),
 *               Host count, cross-site state changes (docs/security.md)
 */
#ifndef BEANGATE_GATEWAY_H
#define BEANGATE_GATEWAY_H

#include <event2/event.h>
#include <jansson.h>
#include <microhttpd.h>
#include <sys/socket.h>

#include "../core/core.h"
#include "../io/wal.h"
#include "ui.h"

#define GW_MAX_WAIT_DEFAULT_S 30  /* long-poll cap (--http-max-wait) */
#define GW_MAX_WAIT_LIMIT_S 3600  /* the largest cap one may set */
#define GW_DEFAULT_PRIORITY 2147483648u /* 2^31, as common clients use */
#define GW_DEFAULT_TTR 60
/* The limits of HTTP connections (docs/operations.md, "Limits"); each is a
 * setting (server/config.c) with this default. */
#define GW_MAX_CONNECTIONS_DEFAULT 1024   /* --http-max-connections */
#define GW_IDLE_TIMEOUT_DEFAULT_S 60      /* --http-idle-timeout */
#define GW_HEADER_TIMEOUT_DEFAULT_S 10    /* --http-header-timeout */
#define GW_MAX_HEADER_DEFAULT 8192       /* --http-max-header-size: bytes of a request head */
#define GW_BODY_BUFFER_DEFAULT (64u << 20) /* --http-max-body-buffer: bodies buffered at once */
#define GW_RESPONSE_BUFFER_DEFAULT (64u << 20) /* --http-max-response-buffer: responses held at once */
#define GW_HEADER_FIELDS_MAX 100          /* header fields of one request */
#define GW_LINGER_MS 1000                 /* a refused connection is read and dropped this long */
#define GW_LINGERING_MAX 256              /* ... at most this many at once; more are closed at once */
/* HTTPS refusals at the connection limit answered inside TLS: each costs a
 * handshake (a private-key signature) on the engine's loop, so at most this
 * many begin per second (a token bucket of as many); the rest are closed
 * unanswered. 16 signatures take a few ms of one CPU: an attacker replaying
 * ClientHellos cannot make the refusals eat the loop. */
#define GW_TLS_REFUSALS_PER_S 16
#define GW_SWEEP_MIN_MS 100               /* waiting connections are looked at every eighth */
#define GW_SWEEP_MAX_MS 1000              /* of the header timeout, within these bounds, */
#define GW_SWEEP_BATCH 256                /* this many per turn of the loop */
#define GW_SPARE_REQUESTS 64             /* freed request records kept for reuse (http.c) */
#define GW_PARK_AFTER_MS 2000             /* plain HTTP: a keep-alive connection idle this long is */
                                          /* taken back from libmicrohttpd (admit.c, parking) */
#define GW_PARK_TRIM_EVERY 64             /* the heap is trimmed after this many parkings */
#define GW_ACCEPT_BACKOFF_MS 250          /* accept pauses this long at the fd limit */
#define GW_ACCEPT_LOG_INTERVAL_S 10       /* a refusal at a limit is logged at most this often */
#define GW_IDEMPOTENCY_WINDOW_S 300   /* a retried put within this returns the first job */
#define GW_IDEMPOTENCY_KEY_MAX 128
#define GW_IDEMPOTENCY_STORED_MAX (GW_IDEMPOTENCY_KEY_MAX + 4) /* a batch entry's "KEY#99" */
#define GW_IDEMPOTENCY_MAX 100000     /* keys remembered at most */
#define GW_BATCH_MAX 100              /* entries in a batch put or reserve */
/* The bytes of JSON a batch put may send: GW_BATCH_MAX entries, each a job
 * of max_job_size bytes as base64 (4 characters per 3 bytes) and
 * GW_BATCH_ENTRY_SLACK bytes of keys, numbers and spaces. */
#define GW_BATCH_ENTRY_SLACK 256
uint64_t gw_batch_body_limit(uint64_t max_job_size);

#define GW_AUTH_TOKEN_MAX 512         /* bytes in one bearer token */
#define GW_AUTH_TOKENS_MAX 256        /* tokens configured at most */
#define GW_METRICS_TUBES_MAX 1000     /* tubes exported in /metrics at most */
#define GW_TUBE_PAGE_MAX 500          /* tubes in one page of GET /stats/tubes */
#define GW_TUBE_PAGE_DEFAULT 100
#define GW_JOB_PAGE_MAX 500           /* jobs in one page of GET /tubes/{tube}/jobs */
#define GW_JOB_PAGE_DEFAULT 50
/* The bulk kicks and deletes that run (bulk.c) share one step budget a
 * loop turn: GW_BULK_STEP_NS of engine work in all, served round robin, so
 * that N actions at once hold the loop no longer than one does. An
 * action's step calls the engine with GW_BULK_CHUNK_* jobs at a time, the
 * chunk halved or doubled to keep one call well under the budget. */
#define GW_BULK_STEP_NS 1000000       /* 1 ms of engine work a loop turn, all actions together */
#define GW_BULK_CHUNK_FIRST 256
#define GW_BULK_CHUNK_MIN 16
#define GW_BULK_CHUNK_MAX 8192
/* With a log, the steps of one turn act on at most GW_BULK_LOG_STEP_JOBS
 * jobs in all (a record each: about 70 KB of deletes, whatever the CPU's
 * speed), and the next turn's steps wait until the log has written them
 * (bulk.c), looking again this often (the loop's timers have ms precision;
 * a finished batch wakes the loop). */
#define GW_BULK_LOG_STEP_JOBS 4096
#define GW_BULK_LOG_POLL_NS 200000
/* A running action's client is watched (request.c's peer watch); where the
 * watch stopped (pipelined bytes without edge-triggered polling) the steps
 * ask the socket themselves, once every this many steps. */
#define GW_BULK_PEER_CHECK_STEPS 32
#define GW_CORS_ORIGINS_MAX 64        /* origins in --http-cors-origins at most */
#define GW_CORS_ORIGIN_MAX 256        /* bytes in one origin */
#define GW_ALLOWED_HOSTS_MAX 64       /* names in --http-allowed-hosts at most */
#define GW_ALLOWED_HOST_MAX 253       /* bytes in one name */
#define GW_CORS_MAX_AGE "600"         /* seconds a browser may keep a preflight's answer */
/* What a page of an allowed origin may send (beyond the CORS-safelisted
 * headers) and read (beyond the safelisted response headers). */
#define GW_CORS_ALLOW_HEADERS "Authorization, Content-Type, Idempotency-Key, X-Reservation"
#define GW_CORS_EXPOSE_HEADERS                                                                \
    "Location, X-Job-Id, X-Job-Tube, X-Job-Priority, X-Job-Ttr, X-Reservation, "             \
    "Idempotent-Replayed, Retry-After, Allow, WWW-Authenticate, ETag"

/* The responses held: every copied response counts its bytes in
 * count.held from when it is built until libmicrohttpd has sent it or
 * dropped it with its connection. While `refusable` is set (the handler of
 * a GET or HEAD runs: a read, which changed nothing), a response that
 * bg_reply_fits refuses is answered 503 RESPONSE_BUFFER_FULL instead; any
 * other response always goes, and counts. */
struct gw_response_budget {
    struct bg_reply_budget count;
    int refusable;
};

struct gateway_config {
    const char *listen_addr;      /* default 127.0.0.1 */
    const char *port;             /* default 11301 */
    /* the write-ahead log (NULL without -b): a response that reports a
     * change waits until the log's mark for it is on disk (-f 0) */
    struct wal *wal;
    void *log_arg;                /* process_info's argument */
    /* the access file's tokens and their scopes (core/core.h; kept, not
     * copied: it outlives the gateway); NULL or no token line: no auth */
    const struct bg_scopes *scopes;
    int metrics_auth;             /* /metrics needs a token too */
    bg_time started_at;           /* the server's start, for uptime */
    /* process facts for GET /stats (binlog figures); arg is log_arg */
    void (*process_info)(void *arg, struct bg_process_info *pi);
    uint32_t max_wait_s;          /* long-poll cap in seconds; 0: GW_MAX_WAIT_DEFAULT_S */
    const char *cors_origins;     /* comma-separated origins (gw_cors_check); NULL: CORS off */
    /* comma-separated host names served besides the loopback ones
     * (gw_hosts_check); NULL: on a loopback bind only those, on another
     * bind every Host */
    const char *allowed_hosts;
    /* more /metrics families from the server (the connection layer's
     * limits, job memory); arg is log_arg; 0 or BG_OUT_OF_MEMORY. NULL: none */
    int (*extra_metrics)(void *arg, struct bg_buf *out);
    /* limits (0: the GW_*_DEFAULT) */
    uint32_t max_connections;     /* open connections at most */
    uint32_t max_per_address;     /* ... from one client address (0: no cap of its own) */
    uint32_t header_timeout_s;    /* a request's head must be complete within this */
    uint32_t idle_timeout_s;      /* a connection with nothing going on is closed after this */
    uint32_t max_header_size;     /* bytes of a request head */
    uint64_t max_body_buffer;     /* bytes of request bodies buffered at once, all requests */
    uint64_t max_response_buffer; /* bytes of responses built and not yet sent, all connections */
    /* HTTPS (io/tls.h): the port speaks TLS with this listener's
     * credentials (reloaded on SIGHUP); NULL: plain HTTP. Outlives the
     * gateway. With its CA, verify_client refuses a client without a
     * certificate in the handshake. */
    struct tls_listener *tls;
    int tls_verify_client;
};

/* Push delivery's views (server/push.c), shown by GET /subscriptions,
 * GET /stats (subscriptions), GET /jobs/{id} (last_delivery_error) and
 * /metrics. Each function may be NULL; arg is passed to each. */
struct gw_push_hooks {
    void *arg;
    json_t *(*subscriptions)(void *arg);          /* a new JSON array */
    json_t *(*job_error)(void *arg, uint64_t id); /* a new object, or NULL: none known */
    int (*metrics)(void *arg, struct bg_buf *out); /* append families; 0 or BG_OUT_OF_MEMORY */
    /* nonzero if client c is push delivery's (a job it reserved is in flight) */
    int (*owns)(void *arg, const struct bg_client *c);
};

struct gateway;

/* Start the gateway on base. NULL on failure (message printed). now() is
 * the server's monotonic clock; after_run() lets the server re-arm its
 * engine timer after the gateway changed the queue. */
struct gateway *gateway_start(struct event_base *base, struct bg_engine *engine,
                              const struct gateway_config *cfg, bg_time (*now)(void),
                              void (*after_run)(void *), void *after_run_arg);
/* The stop sequence's first step (server/main.c): no new connections, no
 * new request dispatched (one that arrives now gets 503 SHUTTING_DOWN, and
 * nothing was done for it); every long-poll is answered as timed out. */
void gateway_stop_reading(struct gateway *gw);
/* The stop sequence's last step, after the log was finished: a held
 * response goes only if the log keeps the position it depends on
 * (wal_reply_may_go), the others' connections close without a status;
 * what goes is sent until deadline (loop_now's clock). Then stop the
 * daemon and free everything. NULL: nothing. */
void gateway_stop(struct gateway *gw, bg_time deadline);
/* /readyz answers 200 once the server says it serves (listeners up), and
 * while it is not draining. The gateway starts not ready. NULL: no-op. */
void gateway_set_ready(struct gateway *gw, int ready);
/* Replication: whether this node serves. state(arg, detail, size) returns
 * NULL while it does, else a problem code ("STANDBY", "LOST_LEADERSHIP")
 * with the detail written to detail; then /readyz and every API route
 * (the rows that take a token) answer 503 with them. NULL gw: no-op. */
typedef const char *(*gw_role_fn)(void *arg, char *detail, size_t size);
void gateway_set_role(struct gateway *gw, gw_role_fn state, void *arg);
/* The gateway's listening socket (for the startup block's address). */
int gateway_listen_fd(const struct gateway *gw);
/* Install push delivery's hooks (copied). NULL gw does nothing. */
void gateway_set_push(struct gateway *gw, const struct gw_push_hooks *hooks);
/* SIGHUP reloaded the access file: from the next request on, tokens are
 * matched against sc's (which must outlive the gateway, as cfg->scopes);
 * a request under way keeps the scope it began with. 0, or
 * BG_OUT_OF_MEMORY with the old tokens kept (auth.c). NULL gw: 0. */
int gateway_set_scopes(struct gateway *gw, const struct bg_scopes *sc);

/* ---- internal: shared by the gateway's files ----------------------------- */

struct gw_request;

/* The methods of the route table; HEAD is GET without the body (it is
 * served by the GET row); OPTIONS has no row (http.c answers it for every
 * path when CORS is on); any other method is GW_OTHER. */
enum gw_method { GW_GET, GW_HEAD, GW_POST, GW_DELETE, GW_OPTIONS, GW_OTHER };

/* How much body a route reads. The limit is checked against Content-Length
 * before any byte of the body is read (413 JOB_TOO_BIG). */
enum gw_body_limit {
    GW_BODY_NONE,   /* the route reads none: a body is dropped, not kept
                     * (above the max job size it is refused, as for a job) */
    GW_BODY_JOB,    /* one job: the max job size (-z) */
    GW_BODY_BATCH,  /* a batch put's JSON: gw_batch_body_limit(-z) */
};

/* Who may call a route when bearer tokens are configured (without tokens
 * everyone may). A path that matches no route needs a token, so that an
 * unknown path tells nothing. */
enum gw_auth_rule {
    GW_AUTH_TOKEN,    /* a valid bearer token */
    GW_AUTH_OPEN,     /* anyone: the health checks */
    GW_AUTH_PUBLIC,   /* anyone: public assets, the dashboard's files (they
                       * hold no data; the page's API calls need a token) */
    GW_AUTH_METRICS,  /* a token with --metrics-auth, else anyone */
};

/* Where the tube a row's scope check names comes from (issue 23: a
 * scoped token, core/core.h's scope section). */
enum gw_tube_source {
    GW_TUBE_NONE,   /* none: an open row, or a view of the whole server whose
                     * answer shows only the tubes the token sees */
    GW_TUBE_PATH,   /* the {tube} of the path */
    GW_TUBE_QUERY,  /* each tube of ?tubes= (POST /reservations) */
    GW_TUBE_JOB,    /* the tube of the {id} job; a job of a tube the token
                     * cannot see is answered 404, as a missing one */
    GW_TUBE_ALL,    /* every tube (a kind:* grant): rows about clients,
                     * whose tubes are any (GET/DELETE /clients) */
};
/* The kind of action a row needs: an enum bg_scope_kind, or one of these. */
#define GW_KIND_NONE (-1)   /* none (GW_TUBE_NONE rows) */
#define GW_KIND_DELETE (-2) /* consume with the job's reservation token, else manage */

/* A handler: 0 when it queued a response (or suspended the request), a
 * negative enum bg_outcome for the problem of the error table
 * (gw_reply_outcome), or GW_NO_REPLY (the connection is closed). */
typedef int (*gw_handler)(struct gw_request *r);

/* One row of the route table. */
struct gw_route {
    const char *pattern;          /* the path; a segment "*" matches any one segment */
    enum gw_method method;        /* a GW_GET row answers HEAD too */
    gw_handler handler;
    enum gw_body_limit body;
    enum gw_auth_rule auth;
    int command;                  /* the cmd-* counter (enum bg_cmd) it counts in; -1: none */
    int kind;                     /* the scope kind it needs (enum bg_scope_kind, GW_KIND_*) */
    enum gw_tube_source tube;     /* ... on which tube */
};

#define GW_MAX_SEGMENTS 4
/* The route of a request, found once, on its first access-handler call. */
struct gw_match {
    int status;                   /* 0: route is the row; 404: no such path; 405: not this method */
    const struct gw_route *route; /* status 0: the row; 405: the path's first row; 404: NULL */
    int path;                     /* index of the path's first row (the metrics label); -1: 404 */
    enum gw_method method;
    const char *allow;            /* the path's methods, as the Allow header lists them ("": 404) */
    char buf[1024];
    char *seg[GW_MAX_SEGMENTS];   /* path segments, pointing into buf, %2F decoded */
    int nseg;
};

/* What a bulk action does (bulk.c). */
enum gw_bulk_action { GW_BULK_KICK, GW_BULK_DELETE };

/* A bulk kick or delete of one tube's jobs in one state, as it runs in
 * steps while its request is suspended (bulk.c). The tube is named by the
 * request's path and looked up at each step, never held: it may be freed
 * (emptied and unused) meanwhile, and then there is nothing left to do. */
struct gw_bulk {
    struct gw_request *next_running, *prev_running; /* the ring of running actions (gw->bulk) */
    uint8_t running;              /* in that ring: steps still to come */
    uint8_t active;               /* this request runs (or ran) a bulk action */
    uint8_t action;               /* enum gw_bulk_action */
    uint8_t state;                /* enum bg_job_state of the jobs it acts on */
    uint32_t chunk;               /* jobs per engine call, adapted to the time it takes */
    uint64_t left;                /* jobs it may still act on (0: finished) */
    uint64_t done;                /* jobs kicked or deleted so far */
    uint64_t mark;                /* the log position its answer depends on */
    uint32_t steps;               /* loop turns it took so far */
    bg_time longest_step;         /* ns its longest step took (the loop's clock) */
    bg_time longest_step_cpu;     /* ns of CPU its longest step used (less when preempted) */
    bg_time longest_turn_cpu;     /* ns of CPU the longest turn it was in used, all actions' steps */
    bg_time log_waited;           /* ns its steps waited for the log in all */
};

/* The bulk actions running, and the step budget of this loop turn that
 * they share (bulk.c). */
struct gw_bulk_turns {
    struct event *ev;             /* runs the next turn's steps; NULL while no action runs */
    struct gw_request *next_up;   /* the action the next turn steps first; NULL: none runs */
    unsigned running;             /* actions in the ring */
    bg_time spent;                /* ns of steps in this turn (0 again once the timer ran) */
    uint64_t jobs;                /* jobs acted on in this turn (likewise) */
    uint64_t log_pos;             /* the log's newest record after the last step (wal_progress) */
    bg_time waiting_since;        /* when the steps began to wait for the log (0: not waiting) */
};

/* One HTTP request as the gateway follows it across handler calls. */
struct gw_request {
    struct gateway *gw;
    struct MHD_Connection *conn;
    struct gw_match match;        /* the route, matched once */
    struct bg_buf body;
    uint64_t body_limit;          /* bytes of body accepted (from the row) */
    int keep_body;                /* the handler reads the body (not GW_BODY_NONE) */
    int body_too_big;
    int body_refused;             /* over --http-max-body-buffer: 503, the body dropped */
    uint64_t body_reserved;       /* bytes of gw->body_buffered held for this body */
    int responded;
    /* the bearer token's scope (NULL: unscoped, or no token configured);
     * authenticated: a configured token was presented */
    const struct bg_scope *scope;
    int authenticated;
    /* long-poll */
    struct bg_client waiter;
    int waiter_active;
    int suspended;
    int wait_outcome;             /* 0: got jobs; BG_TIMED_OUT */
    uint32_t want;                /* batch size asked for (0: single) */
    uint32_t got;
    /* metrics: from the first access-handler call to the completion */
    bg_time started;
    bg_time dispatched;           /* the clock when its handler was called (the engine caught up to it) */
    int method;                   /* gw_metrics_method_index */
    unsigned status;              /* status queued; 0: none yet */
    int counted;                  /* in the cmd-* counters already */
    uint32_t commands;            /* beanstalk commands it performs (a batch put: its entries) */
    uint64_t job_ids[GW_BATCH_MAX]; /* reserved for this request, in order */
    uint32_t job_reserves[GW_BATCH_MAX];
    struct gw_request *next_woken;
    struct gw_request *next_spare; /* on gw->spare_requests once freed */
    struct gw_request *prev_waiting, *next_waiting; /* gw->waiting */
    int listed;
    struct event *peer_ev;        /* watches the socket while listed */
    struct gw_bulk bulk;          /* a bulk kick or delete */
    struct wal_hold hold;         /* response queued, waiting for the log */
    struct gw_request *held_prev, *held_next; /* gw->held */
    int held;
    int releasing;                /* counted in gw->releasing */
};

/* ---- admit.c: connections outside a request ------------------------------ */

/* Connections from one client address (a table keyed by bg_siphash). */
struct gw_addr {
    struct gw_addr *next;         /* in its bucket */
    unsigned char key[17];        /* family, then 4 or 16 address bytes */
    uint32_t count;               /* its open connections */
    uint32_t refs;                /* connections that point to it (closing ones too) */
    struct gw_conn *wait_head, *wait_tail; /* its waiting connections, oldest first */
};

/* One client connection. Before the hand-over it is admit.c's alone (its
 * first request head arrives); after it, libmicrohttpd owns the socket and
 * this is the connection's socket context, until libmicrohttpd closes it. */
struct gw_conn {
    struct gateway *gw;
    int fd;
    struct MHD_Connection *mhd;   /* NULL before the hand-over */
    struct gw_addr *addr;
    struct sockaddr_storage sa;
    socklen_t sa_len;
    struct event *read_ev;        /* before the hand-over: the head arriving; then only while lingering */
    struct event *deadline_ev;    /* the header deadline; while lingering, the linger's end */
    uint8_t waiting;              /* no request in progress: on the waiting lists (evictable) */
    uint8_t counted;              /* in the open counts (not closed by us yet) */
    uint8_t lingering;            /* answered and shut: reading what is left, then closed */
    uint8_t head_started;         /* a later request's first byte came, its head not yet whole */
    uint8_t deadline_extended;    /* its header deadline passed with bytes unread: one more loop turn */
    uint8_t consumed_unknown;     /* the request in progress has a chunked body: count at its end */
    uint8_t plain_text;           /* HTTPS: its first byte is not a TLS handshake's (answered in plain text) */
    uint8_t parking;              /* libmicrohttpd is asked to let it go; spare_fd keeps the socket */
    uint8_t parked;               /* idle, taken back from libmicrohttpd: admit.c's until its next head */
    struct gw_tls_refusal *tls_refusal; /* HTTPS: refused, its answer waiting for our own handshake */
    int spare_fd;                 /* while parking: a second descriptor of the socket */
    bg_time idle_since;           /* when its last request ended */
    struct gw_conn *park_next;    /* the sweep batch's list of connections being parked */
    uint64_t consumed;            /* TCP bytes of the requests begun so far (heads and bodies) */
    struct gw_conn *prev, *next;          /* gw->admit.wait_head: every waiting connection, oldest first */
    struct gw_conn *addr_prev, *addr_next; /* addr->wait_head */
};

/* Why a connection was refused or closed by the gateway (counters). */
enum gw_conn_event {
    GW_REFUSED_CONNECTIONS,       /* --http-max-connections, nothing to evict: 503 */
    GW_REFUSED_ADDRESS,           /* --http-max-connections-per-ip, nothing to evict: 503 */
    GW_REFUSED_FD_LIMIT,          /* accept failed: no descriptor (or memory) left */
    GW_CLOSED_EVICTED,            /* the oldest waiting connection, for a new one */
    GW_CLOSED_HEADER_TIMEOUT,     /* no complete head within --http-header-timeout: 408 */
    GW_CLOSED_BAD_HEAD,           /* a first head refused before libmicrohttpd (400, 413, 431, 501, 505) */
    GW_CLOSED_CLIENT,             /* the client left mid-request or broke the protocol (libmicrohttpd's word) */
    GW_CONN_EVENTS
};

struct gw_admit {
    int listen_fd;
    struct event *listen_ev, *backoff_ev;
    uint64_t open;                /* connections counted (pending and in libmicrohttpd) */
    uint64_t lingering;
    struct gw_addr **buckets;
    size_t nbuckets;              /* a power of two */
    uint64_t hash_key[2];
    struct gw_conn *wait_head, *wait_tail;
    struct gw_conn *linger_head;  /* refused connections read and dropped for a while */
    const struct timeval *header_tv; /* the header timeout, a common timeout of the base */
    struct event *sweep_ev;       /* begins a round of looking for later heads on waiting connections */
    struct event *sweep_more_ev;  /* the round's next batch, on the loop's next turn */
    const struct timeval *sweep_tv; /* the rounds' period: an eighth of the header timeout (GW_SWEEP_*) */
    struct gw_conn *sweep_cursor; /* the next waiting connection of the round; NULL: no round going */
    int sweep_armed;              /* sweep_ev is pending */
    int sweep_watched;            /* this round saw a connection still to watch */
    uint64_t parked;              /* connections parked now (beangate_http_connections_parked) */
    unsigned parked_untrimmed;    /* parkings since the heap was last trimmed */
    char *peek;                   /* max_header_size + 1 bytes: a head seen without reading it */
    void *conn_blocks;            /* the blocks gw_conn records come from (admit.c, conn_alloc) */
    struct gw_conn *free_conns;   /* their free slots */
    struct gw_conn *adding;       /* the connection MHD_add_connection is adding */
    int adding_started;
    uint64_t events[GW_CONN_EVENTS];
    uint64_t tls_refusal_tokens;  /* handshakes a TLS refusal may still begin now (GW_TLS_REFUSALS_PER_S) */
    bg_time tls_refusal_filled_at; /* when the tokens were last refilled */
    uint64_t tls_refusals_answered; /* refusals given a handshake (beangate_http_tls_refusals_total) */
    uint64_t tls_refusals_unanswered; /* refusals closed without one: over the budget or the linger cap */
    bg_time logged_at[GW_CONN_EVENTS]; /* the last warning of each (rate-limited) */
    uint64_t unlogged[GW_CONN_EVENTS];
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
    /* http.c's gw_run, for admit.c below it (parking runs the daemon) */
    void (*run_daemon)(struct gateway *gw);
    struct gw_request *woken;     /* long-polls resolved, to resume */
    struct gw_request *spare_requests; /* freed requests kept for the next (GW_SPARE_REQUESTS) */
    unsigned spare_count;
    struct gw_request *waiting;   /* every suspended long-poll */
    struct gw_bulk_turns bulk;    /* the bulk actions running (bulk.c) */
    struct gw_idempotency *idempotency;
    struct gw_request *held;      /* responses waiting for the log */
    uint64_t releasing;           /* held requests resumed at the stop, not completed yet */
    int stopping;                 /* gateway_stop_reading: nothing new is dispatched */
    struct gateway_config cfg;
    struct gw_auth *auth;         /* NULL: no token configured */
    int metrics_auth;
    int ready;                    /* gateway_set_ready */
    bg_time started_at;
    uint64_t in_flight;           /* requests begun and not completed */
    uint64_t body_buffered;       /* bytes held for request bodies (body_reserved summed) */
    struct gw_response_budget responses; /* responses held (reply.c counts them) */
    struct gw_admit admit;
    struct gw_metrics *metrics;
    struct gw_push_hooks push;    /* all NULL without push delivery */
    struct gw_cors *cors;         /* NULL: CORS off */
    struct gw_hosts *hosts;       /* the Host names served (guard.c) */
    gw_role_fn role;              /* gateway_set_role; NULL: always serving */
    void *role_arg;
    /* GET /stats/history and the tubes' rates (core/history.c), kept by
     * history_ev, a timer just after each second of gw->now begins */
    struct event *history_ev;
    struct bg_history history;
};

/* Start accepting on listening socket fd (non-blocking; taken over). 0, or
 * BG_OUT_OF_MEMORY / BG_IO_ERROR after a log line. */
int gw_admit_start(struct gateway *gw, int fd);
/* Close the listener and every connection libmicrohttpd does not own. */
void gw_admit_stop(struct gateway *gw);
/* Free what gw_admit_start made, once libmicrohttpd closed its connections. */
void gw_admit_free(struct gateway *gw);
/* libmicrohttpd's connection notices: started (the connection being added
 * becomes c's socket context) and closed (it is freed). */
void gw_conn_started(struct gateway *gw, struct MHD_Connection *c, void **socket_context);
void gw_conn_closed(struct gateway *gw, void *socket_context);
struct gw_framing;
/* A request's head is complete (its first access-handler call), framed
 * as f says: the connection is busy, neither waiting nor under a header
 * deadline. */
void gw_conn_request_began(struct gateway *gw, struct MHD_Connection *c, const struct gw_framing *f);
/* A request is over (at now) and the connection stays open: it waits for
 * the next head (idle time, then the header deadline from its first byte). */
void gw_conn_request_ended(struct gateway *gw, struct MHD_Connection *c, bg_time now);
/* Count a connection event (libmicrohttpd's notices of clients too). */
void gw_conn_count(struct gateway *gw, enum gw_conn_event e);
/* Run libmicrohttpd now, then re-arm its timer (http.c). */
void gw_run(struct gateway *gw);

/* ---- reply.c: responses (calls no other gateway file) ------------------ */

/* What a reply function returns when no response could be queued (out of
 * memory, or one was queued already): http.c then closes the connection.
 * Distinct from every enum bg_outcome. */
#define GW_NO_REPLY (-1000)

/* The gateway's own outcomes: a request that the job's state refuses. They
 * are rows of the error table, as the engine's outcomes are (409 each, with
 * its own code), distinct from every enum bg_outcome and from GW_NO_REPLY. */
enum gw_conflict {
    GW_RESERVATION_REQUIRED = -900, /* reserved over HTTP, and no token was given */
    GW_RESERVATION_MISMATCH,      /* a token that is not the job's current reservation */
    GW_RESERVED_ELSEWHERE,        /* reserved by a beanstalk or Gearman client, or by push */
    GW_NOT_RESERVED,              /* release, bury, touch of a ready, delayed or buried job */
    GW_NOT_BURIED_OR_DELAYED,     /* kick of a ready or reserved job */
    GW_ALREADY_RESERVED,          /* reserve-job of a reserved job */
};

/* One response header. */
struct gw_header {
    const char *name, *value;
};

/* An HTTP problem: the status, the `code` member and the `detail` text. */
struct gw_problem {
    int outcome;                  /* the enum bg_outcome it stands for */
    unsigned status;
    const char *code, *detail;
};
/* The problem for an engine outcome or an enum gw_conflict: the one table
 * of them (404 NOT_FOUND, 409 NOT_RESERVED, 413 JOB_TOO_BIG, 503 DRAINING /
 * OUT_OF_MEMORY / LOG_UNAVAILABLE, ...); an outcome not in it is 500 with
 * its beanstalk word as the code. */
struct gw_problem gw_outcome_problem(int outcome);
/* The title of a status in a problem ("Not Found"). */
const char *gw_status_title(unsigned status);

/* Each returns 0 (queued) or GW_NO_REPLY. */
/* A JSON value (taken over; NULL is out of memory), with a Location header
 * unless location is NULL. */
int gw_reply_json(struct MHD_Connection *c, unsigned status, json_t *v, const char *location);
/* The same with one more header (name may be NULL). */
int gw_reply_json_header(struct MHD_Connection *c, unsigned status, json_t *v,
                         const char *location, const char *name, const char *value);
/* The same for JSON text already written: n bytes of text, its newline
 * included (copied). */
int gw_reply_json_text(struct MHD_Connection *c, unsigned status, const char *text, size_t n,
                       const char *location, const char *name, const char *value);
/* The application/problem+json text of a problem (malloc'd; NULL: out of
 * memory). */
char *gw_problem_text(unsigned status, const char *code, const char *detail);
/* application/problem+json; a 503 carries Retry-After: 5. */
int gw_reply_problem(struct MHD_Connection *c, unsigned status, const char *code,
                     const char *detail);
/* The same with one more header (name may be NULL). */
int gw_reply_problem_header(struct MHD_Connection *c, unsigned status, const char *code,
                            const char *detail, const char *name, const char *value);
/* 403 PERMISSION_DENIED for a scoped token: its required_scope member is
 * `required` ("consume:emails", bg_scope_required). */
int gw_reply_permission_denied(struct MHD_Connection *c, const char *required);
/* The problem of gw_outcome_problem(outcome). */
int gw_reply_outcome(struct MHD_Connection *c, int outcome);
/* The same with a detail that says more about this request (the job's id
 * and state); NULL: the table's. */
int gw_reply_outcome_detail(struct MHD_Connection *c, int outcome, const char *detail);
/* No body. */
int gw_reply_empty(struct MHD_Connection *c, unsigned status);
/* n bytes of a Content-Type, copied (copy nonzero) or living as long as the
 * process, with one more header (name may be NULL). */
int gw_reply_bytes(struct MHD_Connection *c, unsigned status, const void *bytes, size_t n,
                   int copy, const char *type, const char *name, const char *value);
/* n bytes that live as long as the process (0 for a body-less status such
 * as 304), with a Content-Type unless type is NULL, and the count headers
 * of headers. */
int gw_reply_static(struct MHD_Connection *c, unsigned status, const void *bytes, size_t n,
                    const char *type, const struct gw_header *headers, size_t count);
/* 200 with job j's body as raw bytes and its metadata in X-Job-* headers
 * (X-Reservation too unless token is NULL). */
int gw_reply_raw_job(struct MHD_Connection *c, const struct bg_job *j, const char *token);
/* 204 to OPTIONS on a path whose methods are allow: Allow (with OPTIONS),
 * and for a CORS preflight (preflight nonzero) the Access-Control-Allow-
 * Methods, -Headers and -Max-Age of GW_CORS_*. */
int gw_reply_options(struct MHD_Connection *c, const char *allow, int preflight);
/* Every response from now on carries the CORS headers of cors (NULL: none):
 * Vary: Origin, and for an Origin that cors allows its echo in
 * Access-Control-Allow-Origin and GW_CORS_EXPOSE_HEADERS. One gateway per
 * process. */
void gw_reply_set_cors(const struct gw_cors *cors);
/* Keep the responses' count in b from now on (NULL: none). One gateway
 * per process. */
void gw_reply_set_budget(struct gw_response_budget *b);

/* ---- router.c: the route table ------------------------------------------ */

enum gw_method gw_method_of(const char *method);
/* Match method and url against the route table into m; returns m->status:
 * 0 (m->route, m->method, m->seg set), 404 or 405 (m->allow set). HEAD
 * matches a GET row; the Allow header lists HEAD after GET. */
int gw_match_route(const char *method, const char *url, struct gw_match *m);
/* How many times gw_match_route ran in this process (a test counts that a
 * request is matched once, however often libmicrohttpd calls back). */
unsigned long gw_match_count(void);
/* The table: its rows, row i (NULL out of range), and the label of row i:
 * its pattern with each '*' named as in openapi.yaml ("/tubes/{tube}/jobs"),
 * the route label of the HTTP metrics. */
int gw_route_count(void);
const struct gw_route *gw_route_at(int i);
const char *gw_route_pattern(int i);

/* ---- routes.c: the handlers of the route table --------------------------- */

int gw_handle_stats(struct gw_request *r);
int gw_handle_tubes(struct gw_request *r);
int gw_handle_stats_tubes(struct gw_request *r);
int gw_handle_stats_history(struct gw_request *r);
int gw_handle_tube(struct gw_request *r);
int gw_handle_put(struct gw_request *r);
int gw_handle_batch_put(struct gw_request *r);
int gw_handle_tube_reserve(struct gw_request *r);
int gw_handle_tube_kick(struct gw_request *r);
int gw_handle_tube_pause(struct gw_request *r);
int gw_handle_peek_ready(struct gw_request *r);
int gw_handle_peek_delayed(struct gw_request *r);
int gw_handle_peek_buried(struct gw_request *r);
int gw_handle_reserve(struct gw_request *r);
int gw_handle_job(struct gw_request *r);
int gw_handle_job_delete(struct gw_request *r);
int gw_handle_job_body(struct gw_request *r);
int gw_handle_job_release(struct gw_request *r);
int gw_handle_job_bury(struct gw_request *r);
int gw_handle_job_touch(struct gw_request *r);
int gw_handle_job_kick(struct gw_request *r);
int gw_handle_job_reserve(struct gw_request *r);
int gw_handle_openapi(struct gw_request *r);
int gw_handle_subscriptions(struct gw_request *r);
int gw_handle_auth(struct gw_request *r);
int gw_handle_tube_jobs(struct gw_request *r);
int gw_handle_tube_jobs_delete(struct gw_request *r);

/* ---- bulk.c: a bulk kick or delete in steps (below routes.c) ------------- */

/* Start kicking or deleting (action) up to `bound` jobs in `state` of the
 * tube r's path names, in serving order: when no other bulk action runs,
 * the first step runs now, in this loop turn's budget. 1: it finished
 * (r->bulk says what it did; answer now); 0: r is suspended and its steps
 * go on, taking turns with the other running actions, until it finishes,
 * its client leaves or the server stops; then r is resumed and its handler
 * is called again (r->bulk.active set; gw_bulk_end first). Delete counts
 * one cmd-delete per job deleted. */
int gw_bulk_start(struct gw_request *r, enum gw_bulk_action action, enum bg_job_state state,
                  uint64_t bound);
/* No more steps for r (its answer goes now, or it ended). Any time, any
 * number of times. */
void gw_bulk_end(struct gw_request *r);

/* ---- clients.c: who is connected (GET /clients, issue 26) ----------------- */

int gw_handle_clients(struct gw_request *r);
int gw_handle_client_delete(struct gw_request *r);
/* List r's engine client c (a long-poll) in GET /clients as an HTTP client
 * at r's peer, closed by close_now. Out of memory it is not listed. */
void gw_list_client(struct gw_request *r, struct bg_client *c, void (*close_now)(struct bg_client *, bg_time));

/* ---- ui.c: the dashboard's handlers (its file table: ui.h) -------------- */

int gw_handle_ui_redirect(struct gw_request *r);
int gw_handle_ui_file(struct gw_request *r);

/* ---- request.c: what handlers ask of their request ---------------------- */

/* The query parameter key (unescaped, %2F kept), or NULL. */
const char *gw_query(struct gw_request *r, const char *key);
/* The decimal query parameter key, at most max: 0 (*out set, or left as it
 * is when the parameter is absent) or -1 when it is not such a number. */
int gw_query_u64(struct gw_request *r, const char *key, uint64_t max, uint64_t *out);
/* A page's size from ?limit=, 1 to max (*limit left as it is when absent):
 * 0, or -1 with the 400 that names the range queued (*reply). */
int gw_query_limit(struct gw_request *r, uint64_t max, uint64_t *limit, int *reply);
/* The request header name (any case), or NULL. */
const char *gw_request_header(struct gw_request *r, const char *name);
/* The request's reservation token into *token: the X-Reservation header or
 * the reservation query parameter (the same name as the header of a raw
 * reply), NULL when neither is given. 0, or -1 when both are given and
 * differ (*token NULL). */
int gw_reservation_token(struct gw_request *r, const char **token);
/* The scope kind r's row needs (enum bg_scope_kind): the row's, and for
 * GW_KIND_DELETE consume when the request gives a reservation token, else
 * manage. GW_KIND_NONE for a row without one. */
int gw_request_kind(struct gw_request *r);
/* May r's token do what its row needs on tube name[0..len)? 1 if so (an
 * unscoped token, or no token configured, may do all); else 0 after a 403
 * PERMISSION_DENIED naming the scope it needs was queued into *reply. */
int gw_scope_permits(struct gw_request *r, const char *name, size_t len, int *reply);
/* May r's token do what its row needs on every tube (a kind:* grant)? 1 if
 * so; else 0 after a 403 naming "kind:*" was queued into *reply. */
int gw_scope_permits_all(struct gw_request *r, int *reply);
/* Nonzero if r's token sees tube name[0..len) (listings show only these). */
int gw_scope_sees(const struct gw_request *r, const char *name, size_t len);
/* Nonzero if Accept asks for application/octet-stream and not JSON. */
int gw_wants_raw(struct gw_request *r);
/* The HTTP connections open to the gateway now, r's included. */
unsigned gw_open_connections(const struct gw_request *r);
/* The status of the response queued for r, 0 if none yet. */
unsigned gw_queued_status(const struct gw_request *r);
/* Turn every "%2F" of s into '/' and every "%2E" into '.' (either case), in
 * place. The unescape callback leaves %2F encoded so that a tube name may
 * hold '/' in a path segment; a segment "." or ".." reaches here as %2E
 * only when sent as %252E, as the dashboard does: a browser's URL parser
 * removes "..", "%2E%2E" and their like from a path before sending it. */
void gw_decode_segment(char *s);
/* Suspend long-poll r: it is listed (resumed at shutdown) and its socket
 * watched: a client that closes or resets ends the wait at once
 * (wait_outcome BG_TIMED_OUT, woken). */
void gw_suspend(struct gw_request *r);
/* Take r off the list and stop watching its socket (no-op if not listed). */
void gw_unlist(struct gw_request *r);
/* Queue r to be resumed on the next loop turn. */
void gw_wake(struct gw_request *r);
/* Nonzero unless r's client has closed or reset its connection (a FIN
 * counts as gone, even after pipelined bytes). */
int gw_peer_alive(struct gw_request *r);
/* Release the jobs r reserved and did not deliver (r->got = 0). */
void gw_give_back(struct gw_request *r, bg_time now);

/* cors.c: the origins allowed to call from a browser */
struct gw_cors;
/* Check a comma-separated list of origins, each "http(s)://HOST[:PORT]"
 * (no path, no '*', at most GW_CORS_ORIGINS_MAX): NULL, or why it is
 * refused (a static string). */
const char *gw_cors_check(const char *list);
/* The origins of a list that gw_cors_check accepts (copied); NULL if it
 * does not, or out of memory. */
struct gw_cors *gw_cors_new(const char *list);
void gw_cors_free(struct gw_cors *c);
/* Nonzero if origin (a request's Origin header; NULL: none) is one of c's,
 * compared without regard to ASCII case. */
int gw_cors_allows(const struct gw_cors *c, const char *origin);

/* The length of the host at s[0..n): a name of letters, digits, '-' and
 * '.', or an [IPv6] address with its brackets; 0 if there is none. */
size_t gw_host_span(const char *s, size_t n);

/* guard.c: what a browser's page must not make the gateway do */
struct gw_hosts;
/* Check a comma-separated list of host names (each as gw_host_span has it,
 * no port, at most GW_ALLOWED_HOSTS_MAX): NULL, or why it is refused. */
const char *gw_hosts_check(const char *list);
/* Nonzero if sa is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x). */
int gw_addr_is_loopback(const struct sockaddr *sa);
/* The Host names a gateway bound to a loopback address (loopback nonzero)
 * or another serves: the loopback names and list's (NULL: none; then on
 * another bind every name). NULL if list is refused or out of memory. */
struct gw_hosts *gw_hosts_new(const char *list, int loopback);
void gw_hosts_free(struct gw_hosts *h);
/* Nonzero if h serves a request whose Host header is host (NULL: none), a
 * name with or without ":PORT", in any case. */
int gw_hosts_allow(const struct gw_hosts *h, const char *host);
struct gw_framing;
/* 0 if r (its head in, its fields counted in f; version as libmicrohttpd
 * gives it) may go on, else
 * the status of its problem, *p set: 400 no Host in HTTP/1.1 or two Hosts,
 * 421 a Host name not served, 403 a state-changing request a browser marks
 * as cross-site from an origin not in --http-cors-origins. */
unsigned gw_guard_check(struct gw_request *r, const char *version, const struct gw_framing *f,
                        struct gw_problem *p);

/* auth.c: bearer tokens, each with its scope */
struct gw_auth;
/* Copy the token lines of an access file (each token 1..GW_AUTH_TOKEN_MAX
 * bytes; their scopes are sc's, which must outlive the table). NULL if one
 * is too long or memory ran out. */
struct gw_auth *gw_auth_new(const struct bg_scopes *sc);
void gw_auth_free(struct gw_auth *a);
/* Nonzero if token[0..len) is one of the tokens, its scope into *scope
 * (NULL: unscoped; scope may be NULL). Constant time: compares every byte
 * of every configured token, whatever matches or not. */
int gw_auth_match(const struct gw_auth *a, const char *token, size_t len,
                  const struct bg_scope **scope);
/* Nonzero if an Authorization header value is "Bearer <a token>", its
 * scope into *scope as gw_auth_match. */
int gw_auth_check(const struct gw_auth *a, const char *authorization,
                  const struct bg_scope **scope);

/* metrics.c */
struct gw_metrics;
/* Counters for routes 0..n-1 labelled route_labels[i] (strings that outlive
 * the counters), and one more for requests that matched no route. */
struct gw_metrics *gw_metrics_new(const char *const *route_labels, int n);
void gw_metrics_free(struct gw_metrics *m);
/* Index of an HTTP method for the metrics (unknown methods share one). */
int gw_metrics_method_index(const char *method);
const char *gw_metrics_method_name(int index);
/* Count one finished request: route index (-1: none), method index,
 * status (0: none was sent), and its duration. */
void gw_metrics_observe(struct gw_metrics *m, int route, int method, unsigned status,
                        double seconds);
/* Every metric in the Prometheus text format 0.0.4, the per-tube series
 * of the tubes scope sees (NULL: all). 0 or BG_OUT_OF_MEMORY. */
int gw_metrics_render(const struct gateway *gw, struct bg_buf *out, bg_time now,
                      const struct bg_scope *scope);
/* Replication: the problem code (and detail) a request gets while this
 * node does not serve, or NULL (metrics.c, beside /readyz; gateway_set_role). */
const char *gw_role_refusal(const struct gateway *gw, char *detail, size_t size);
/* The handlers of /metrics, /livez and /readyz. */
int gw_handle_metrics(struct gw_request *r);
int gw_handle_livez(struct gw_request *r);
int gw_handle_readyz(struct gw_request *r);

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
/* Look key up for the put req; for GW_IDEM_SAME, *job_id, *state and
 * *position are the first put's job, answered state and the log position
 * its answer depended on (a replay's answer depends on it too). */
enum gw_idempotency_match gw_idempotency_lookup(struct gw_idempotency *t, const char *key,
                                                const struct gw_put_request *req, bg_time now,
                                                uint64_t *job_id, const char **state, uint64_t *position);
/* Remember that key and the put req made job_id, answered with `state` (a
 * static string) once the log kept `position` (engine->reply_pos). 0,
 * BG_BAD_FORMAT (key or tube too long) or BG_OUT_OF_MEMORY. */
int gw_idempotency_remember(struct gw_idempotency *t, const char *key,
                            const struct gw_put_request *req, uint64_t job_id, const char *state,
                            uint64_t position, bg_time now);
/* The bucket of key: a keyed hash, so it depends on the table's key. */
size_t gw_idempotency_bucket(const struct gw_idempotency *t, const char *key);

/* tube_page.c: a page of tubes, filtered by a substring of the name and
 * sorted by a TubeStats field, or in list order. Calls no other gateway
 * file. */
struct gw_tube_page_query {
    const char *filter;           /* NULL or "": every tube */
    int sort;                     /* gw_tube_sort_key; -1: list order (GET /tubes) */
    int descending;
    uint64_t offset;
    uint32_t limit;
    const struct bg_scope *scope; /* only the tubes it sees (bg_scope_sees); NULL: every tube */
};
/* The index of a sort key (a TubeStats field name), or -1. */
int gw_tube_sort_key(const char *name);
/* The name of sort key i; NULL past the last. */
const char *gw_tube_sort_key_name(int i);
/* Nonzero if filter is at most 200 tube-name characters. */
int gw_tube_filter_valid(const char *filter);
/* out[0..*n) = the page (at most q->limit tubes); *total = the tubes that
 * match. O(limit) in list order without a filter or scope; else O(T log k) for T
 * tubes and k = offset + limit. 0 or BG_OUT_OF_MEMORY. */
int gw_tube_page(const struct bg_engine *e, bg_time now, const struct gw_tube_page_query *q,
                 const struct bg_tube **out, uint32_t *n, uint64_t *total);

/* openapi.c (generated from openapi/openapi.yaml) */
extern const char gw_openapi_yaml[];
extern const size_t gw_openapi_yaml_len;

/* framing.c: where a request's body ends */
struct gw_framing {
    unsigned lengths;             /* Content-Length fields seen */
    unsigned codings;             /* Transfer-Encoding fields seen */
    uint64_t length;              /* the first Content-Length */
    int length_bad;               /* one is not decimal digits */
    int length_huge;              /* one does not fit in 64 bits */
    int length_conflict;          /* two disagree */
    int chunked;                  /* the one Transfer-Encoding is exactly chunked */
    unsigned hosts;               /* Host fields seen (judged by guard.c) */
    unsigned fields;              /* header fields seen (http.c counts them) */
};
/* 431: more than GW_HEADER_FIELDS_MAX fields. */
extern const struct gw_problem gw_too_many_fields;
/* Over HTTPS, a first head's limits that admit.c cannot see (encrypted)
 * and libmicrohttpd does not keep (its memory limit is larger), judged in
 * the request's first call for every head: its size in bytes and its
 * fields. 0, or 431 with p filled (its detail written to detail[n]). */
unsigned gw_tls_head_check(const struct gateway *gw, size_t size, unsigned fields, char *detail, size_t n,
                           struct gw_problem *p);
/* Take one header field (name any case; value with its spaces) into f. */
void gw_framing_field(struct gw_framing *f, const char *name, size_t name_len, const char *value,
                      size_t value_len);
/* 0 if the fields frame the body soundly, else the problem's status (400
 * conflicting or malformed Content-Length, or with Transfer-Encoding; 413
 * a length past 64 bits; 501 a transfer coding other than chunked), *p set. */
unsigned gw_framing_verdict(const struct gw_framing *f, struct gw_problem *p);
/* The length of the request head at the start of buf[0..n), through its
 * blank line (CRLF or LF line ends; empty lines before it are skipped);
 * 0 while it is not complete. */
size_t gw_head_end(const char *buf, size_t n);
/* A raw head (gw_head_end bytes): the request line (505 for a version other
 * than HTTP/1.0 or 1.1), header lines (400 for folding, a bad name or no
 * colon; 431 for more than max_fields) and the framing. 0 or the status,
 * *p set. */
unsigned gw_head_check(const char *head, size_t len, unsigned max_fields, struct gw_problem *p);

/* json.c */
/* Decode base64 as RFC 4648 section 4 has it, strictly: the standard
 * alphabet, padded with '=' to a multiple of 4 characters, nothing else
 * (no spaces, no line breaks), and the unused bits of the last character
 * zero (so every byte string has one encoding). NULL if text is not that,
 * or memory ran out (*bad tells which: 1 invalid, 0 memory). *n = length. */
char *gw_base64_decode(const char *text, size_t len, size_t *n, int *bad);
/* Job j as JSON: its stats; `reservation` (token, when given: the reply to
 * a reserve); without a token, a reserved job's `reserved_by` (the listed
 * client holding it, or null); its body when with_body. */
json_t *gw_json_job(struct bg_engine *e, const struct bg_job *j, bg_time now,
                    const char *token, int with_body);
json_t *gw_json_tube(const struct bg_stats_tube *st);
/* Server stats; pi adds the process's and the write-ahead log's figures
 * (may be NULL); http_connections: the gateway's open connections. */
json_t *gw_json_server(const struct bg_engine *e, const struct bg_process_info *pi,
                       unsigned http_connections);
#endif

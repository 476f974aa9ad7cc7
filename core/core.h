/* core.h - the beangate core: engine, sessions, log records, shared
 * utilities. Pure: no sockets, no libevent, no files, no clock reads. Every
 * entry point that needs the time takes `now`, monotonic nanoseconds.
 *
 * Result convention (the whole code base, core, io and front-ends): 0 is
 * success; a negative value is an outcome from enum bg_outcome (below). A
 * function that returns a count, a size or a descriptor returns it as a
 * non-negative value instead. Where a caller needs more detail than the
 * outcome (a Gearman packet's fault), it is a field beside it. Functions
 * returning pointers return NULL for "none" and document why it may be none.
 *
 * This header is the table of contents of core/; each section names the
 * file that implements it:
 *   outcomes            codec.c (bg_outcome_word)
 *   alloc.c             the one allocation wrapper (fault injection)
 *   parse.c             bg_parse_u64, the one decimal reader
 *   buf.c               growable byte buffer
 *   the stream          struct bg_stream: what every byte-stream session
 *                       shares with its connection (io/conn.c)
 *   heap.c              binary min-heap
 *   tree.c              the ordered index of a tube's jobs in one state
 *   engine.c            jobs, tubes, clients, time; peek, job ids; shards
 *                       (which ids and tubes an instance of N owns)
 *   clients.c           who is connected: the listed clients by id (GET /clients)
 *   audit.c             the engine's structure checked from scratch
 *   token.c             bg_siphash (the one keyed hash), reservation tokens
 *   scope.c             what a token or a client certificate may do: the one
 *                       place all three protocols ask (issue 23)
 *   journal.c           the write-ahead log's record format; engine <-> log;
 *                       CRC-32C (its checksum) and CRC-32 (the tube hash)
 *   binlog.h            beanstalkd's binlog.N files read (binlog.c): its own header
 *   stats.c             the one stats model
 *   history.c           the server's last 15 minutes, a sample a second, and
 *                       each tube's put and delete rates (issue 26)
 *   codec.c             the beanstalk session (bg_session)
 *   gearman.h           the Gearman packet codec (gearman.c) and the Gearman
 *                       session (gearman_session.c): its own header
 */
#ifndef BEANGATE_CORE_H
#define BEANGATE_CORE_H

#include <stddef.h>
#include <stdint.h>

/* The T whose member m is at p. */
#define container_of(p, T, m) ((T *)((char *)(p) - offsetof(T, m)))

typedef uint64_t bg_time; /* monotonic nanoseconds */

#define BG_SECOND ((bg_time)1000000000)
#define BG_DEADLINE_MARGIN BG_SECOND   /* DEADLINE_SOON safety margin */
#define BG_URGENT_PRIORITY 1024        /* pri below this counts as urgent */
#define BG_LINE_MAX 224                /* command line incl. CRLF */
#define BG_TUBE_NAME_MAX 200
#define BG_WATCH_MAX 10000             /* tubes one client may watch (beanstalkd: no limit) */
#define BG_JOB_SIZE_DEFAULT 65535
#define BG_JOB_SIZE_LIMIT (1024 * 1024 * 1024) /* -z is clamped to this */
#define BG_VERSION "1.12"              /* protocol level we reproduce */
#define BEANGATE_VERSION "0.1.0"

/* Outcomes. Each front-end renders them its own way (beanstalk words, HTTP
 * status codes). 0 means success. */
enum bg_outcome {
    BG_OK = 0,
    BG_NOT_FOUND = -1,
    BG_BAD_FORMAT = -2,
    BG_JOB_TOO_BIG = -3,
    BG_DRAINING = -4,
    BG_DEADLINE_SOON = -5,
    BG_TIMED_OUT = -6,
    BG_OUT_OF_MEMORY = -7,
    BG_INTERNAL_ERROR = -8,
    BG_EXPECTED_CRLF = -9,
    BG_UNKNOWN_COMMAND = -10,
    BG_NOT_IGNORED = -11,
    BG_WOULD_BLOCK = -12, /* reserve registered a waiter; answer comes later */
    BG_BURIED = -13,      /* the bury command's reply word (no put or release is ever buried
                           * for lack of memory: the timer heap keeps room for every job) */
    BG_LOG_UNAVAILABLE = -14, /* the write-ahead log cannot write (HTTP: 503 LOG_UNAVAILABLE) */
    BG_TORN = -15,        /* log data ends inside a record */
    BG_CORRUPT = -16,     /* a log record's checksum or structure is wrong */
    BG_IO_ERROR = -17,    /* a system call failed; errno is left set for the message */
    BG_MEMORY_CEILING = -18, /* the jobs held reach the job-memory ceiling (--max-job-memory):
                              * beanstalk answers OUT_OF_MEMORY, HTTP 503 OUT_OF_MEMORY */
    BG_PERMISSION_DENIED = -19, /* the session's scope does not allow it (core/scope.c):
                                 * beanstalk "PERMISSION_DENIED <kind>:<tube>" */
};

/* The name of an outcome, e.g. "NOT_FOUND": the beanstalk word where
 * beanstalk has one (a put the log cannot take is BG_LOG_UNAVAILABLE, which
 * the beanstalk codec answers with the reference's OUT_OF_MEMORY). */
const char *bg_outcome_word(int outcome);

/* ---- alloc.c: the one allocation wrapper (tests can fail the Nth call) --- */

void *bg_malloc(size_t size);
void *bg_realloc(void *ptr, size_t size);
void *bg_calloc(size_t count, size_t size);
void bg_free(void *ptr);
/* Make the nth allocation from now on fail (1 = the next one); 0 disables. */
void bg_alloc_fail_after(uint64_t nth);
/* Job memory (one allocation, counted like bg_malloc): up to BG_SLAB_MAX
 * bytes from size-class arenas, larger from malloc. Free with the size
 * given to bg_job_alloc. Only the engine calls these (on the loop thread:
 * they take no lock); others use bg_job_new and bg_job_discard. */
#define BG_SLAB_MAX 4096
void *bg_job_alloc(size_t size);
void bg_job_free_sized(void *p, size_t size);

/* ---- parse.c: the one decimal reader ----------------------------------- */

/* s[0..len) as a decimal number: one or more ASCII digits and nothing else,
 * at most max. 0 (*out set) or BG_BAD_FORMAT. */
int bg_parse_u64(const char *s, size_t len, uint64_t max, uint64_t *out);
/* How many ASCII digits s[0..len) starts with (0: none). */
size_t bg_digits_span(const char *s, size_t len);
/* Nonzero if line[0..len) (its line end left off) is an HTTP request line
 * ("METHOD SP target SP HTTP/1.x") or a Host header field (any case): what
 * a browser's request sent to the beanstalk or Gearman port starts with.
 * No beanstalk or Gearman client sends such a line; the sessions close the
 * connection on one (docs/security.md, "Cross-protocol requests"). */
int bg_line_is_http(const char *line, size_t len);

/* ---- buf.c: growable byte buffer ---------------------------------------- */

struct bg_buf {
    char *data;
    size_t len; /* bytes in use, starting at data + start */
    size_t start;
    size_t cap;
};

/* Append n bytes; 0 or BG_OUT_OF_MEMORY. */
int bg_buf_append(struct bg_buf *b, const void *bytes, size_t n);
/* Append formatted text (printf rules); 0 or BG_OUT_OF_MEMORY. */
int bg_buf_printf(struct bg_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Drop n bytes from the front (n <= len). */
void bg_buf_consume(struct bg_buf *b, size_t n);
/* Pointer to the first unconsumed byte. */
static inline char *bg_buf_head(const struct bg_buf *b) { return b->data + b->start; }
/* Make room for n more bytes at the tail; returns the tail or NULL. */
char *bg_buf_reserve(struct bg_buf *b, size_t n);
void bg_buf_clear(struct bg_buf *b);
void bg_buf_free(struct bg_buf *b);
/* Give room back: a buffer of more than BG_BUF_KEEP bytes that uses at
 * most a quarter of them is moved to the front and cut to twice what it
 * uses (at least BG_BUF_KEEP). An empty one is freed. */
#define BG_BUF_KEEP 4096
void bg_buf_shrink(struct bg_buf *b);

/* ---- the stream: a byte-stream session as its connection sees it -------- */

/* Replies built and not yet sent, every connection of a process together:
 * the connection layer keeps `held`, the bytes its connections' own output
 * buffers take. A reply a client can make as large as it likes (beanstalk's
 * list-tubes and list-tubes-watched; Gearman's admin listings) is refused
 * (OUT_OF_MEMORY; counted in `refused`) when it is over BG_REPLY_SMALL
 * bytes and does not fit under `max` beside what is held; when nothing is
 * held it always goes, so the memory is at most `max` and one reply. */
struct bg_reply_budget {
    uint64_t held, max, refused;
};
#define BG_REPLY_SMALL 16384        /* a reply of at most this many bytes is never refused */

/* Every session of a byte-stream protocol (beanstalk's bg_session,
 * Gearman's gm_session) starts with one. The session appends replies to
 * `out` and sets the flags; the connection layer (io/conn.c) writes `out`,
 * feeds input while neither flag is set, and sets the limits and the hook. */
struct bg_stream {
    struct bg_buf out;          /* reply bytes waiting to be written */
    struct bg_reply_budget *budget; /* the process's; NULL: no reply is ever refused */
    size_t out_limit;           /* feeding stops while out holds this much; 0: none */
    size_t out_max;             /* output others append past this overflows; 0: none */
    uint8_t blocked;            /* waiting (a blocked reserve): input stays buffered */
    uint8_t closing;            /* no more input: write out, then close */
    uint8_t overflow;           /* out passed out_max: close without writing */
    uint8_t phase;              /* enum bg_stream_phase, set by each feed */
    /* Output was appended outside the session's own feed (a wait ended,
     * another session's result): the connection must run. NULL: none. */
    void (*output_ready)(struct bg_stream *s);
    void *owner;                /* the connection layer's object */
};

/* Where a session stands in its peer's request after a feed, for the
 * connection layer's request deadline (--request-timeout). */
enum bg_stream_phase {
    BG_PHASE_NONE = 0,  /* at a request boundary: unconsumed input is a partial request */
    BG_PHASE_HEADER,    /* inside a request line or header the session discards as it
                         * comes (an over-long beanstalk line): it must end in time */
    BG_PHASE_BODY,      /* inside a body the session takes as it comes (a put's body,
                         * a Gearman packet's arguments): it must keep arriving */
};

/* Tell s's connection that output came from outside its feed. */
static inline void bg_stream_wake(struct bg_stream *s)
{
    if (s->output_ready) s->output_ready(s);
}

/* Nonzero if a reply of n bytes may be built while b holds its count and
 * `extra` bytes more: it is small, or fits under b's max, or nothing is
 * held at all; a refusal is counted. The one rule of every reply budget. */
static inline int bg_reply_fits(struct bg_reply_budget *b, uint64_t extra, uint64_t n)
{
    uint64_t held = b->held + extra;
    if (n <= BG_REPLY_SMALL || held == 0 || held + n <= b->max) return 1;
    b->refused++;
    return 0;
}

/* Nonzero if a reply of n bytes may be built on s: bg_reply_fits beside
 * what s's output holds now (which may not be counted yet); always without
 * a budget. */
static inline int bg_stream_may_reply(struct bg_stream *s, uint64_t n)
{
    return !s->budget || bg_reply_fits(s->budget, s->out.len, n);
}

/* ---- heap.c: binary min-heap of pointers, each item knows its slot ------ */

typedef int (*bg_heap_less_fn)(const void *a, const void *b);

struct bg_heap {
    void **items;
    uint32_t len, cap;
    bg_heap_less_fn less;
    size_t slot_offset; /* offset of a uint32_t slot index inside each item */
};

void bg_heap_init(struct bg_heap *h, bg_heap_less_fn less, size_t slot_offset);
/* Insert; 0 or BG_OUT_OF_MEMORY. */
int bg_heap_push(struct bg_heap *h, void *item);
/* Remove and return the item at slot i (0 = minimum). */
void *bg_heap_remove(struct bg_heap *h, uint32_t i);
static inline void *bg_heap_min(const struct bg_heap *h) { return h->len ? h->items[0] : NULL; }
/* Make room for n items in total; 0 or BG_OUT_OF_MEMORY. */
int bg_heap_reserve(struct bg_heap *h, uint32_t n);
void bg_heap_free(struct bg_heap *h);

/* ---- engine.c: jobs, tubes, clients, time ------------------------------- */

enum bg_job_state { BG_JOB_READY, BG_JOB_DELAYED, BG_JOB_RESERVED, BG_JOB_BURIED };

struct bg_tube;
struct bg_client;
struct bg_client_entry;    /* clients.c */
struct bg_client_registry; /* clients.c */
struct bg_engine;
struct bg_job;

/* A position in one state's serving order of one tube: after the job with
 * this (key, id). {0, 0} is the start. The key per state: ready: priority;
 * delayed: deadline (ns); buried: burial number (the tube's count of
 * burials when it was buried); reserved: 0 (id order). */
struct bg_job_cursor { uint64_t key; uint64_t id; };

/* ---- tree.c: the ordered index of one tube's jobs in one state ----------
 * Each tube keeps its ready, delayed, buried and reserved jobs in four of
 * these, each in its state's serving order, (key, id) as bg_job_cursor
 * says. An AVL tree threaded through the jobs (nodes == 0: a job's prev and
 * next are its left and right links, its heights its two subtrees'
 * heights; fields a ready, delayed or buried job does not use otherwise) or
 * through the jobs' side records (nodes == 1: reserved jobs, whose links
 * belong to their reserver's list; struct bg_job_more). Inserting and
 * removing never allocate, cost O(log n) and never fail; listing after a
 * cursor costs O(log n + listed); the first and last jobs are cached. A
 * job's key must not change while it is in. */
enum bg_tree_order {
    BG_ORDER_PRIORITY,  /* (pri, id): ready */
    BG_ORDER_DEADLINE,  /* (deadline_at, id): delayed, and buried (deadline_at
                         * holds a buried job's burial number) */
    BG_ORDER_ID,        /* (0, id): reserved */
};

struct bg_tree {
    void *root;
    void *first, *last;         /* the smallest and the largest, NULL when empty */
    void **finger;              /* a slot on the right spine where appends start (tree.c) */
    uint64_t len;               /* jobs in it */
    uint8_t order;              /* enum bg_tree_order */
    uint8_t nodes;              /* 1: the jobs' side records, 0: the jobs themselves */
};

void bg_tree_init(struct bg_tree *t, enum bg_tree_order order, int nodes);
/* Insert node n (a job, or a side record whose job is set); its key is not in t. */
void bg_tree_insert(struct bg_tree *t, void *n);
/* Remove the node of key k and return it; NULL if there is none. */
void *bg_tree_remove(struct bg_tree *t, struct bg_job_cursor k);
/* Job j's key in `order`. */
struct bg_job_cursor bg_job_key(const struct bg_job *j, enum bg_tree_order order);
/* The job of node n, and its key in t's order. */
struct bg_job *bg_tree_job(const struct bg_tree *t, const void *n);
struct bg_job_cursor bg_tree_key(const struct bg_tree *t, const void *n);
/* The first job, NULL if t is empty. O(1). */
static inline struct bg_job *bg_tree_first(const struct bg_tree *t)
{
    return t->first ? bg_tree_job(t, t->first) : NULL;
}
/* Up to max jobs that come after `after`, in order, into out; how many. */
size_t bg_tree_after(const struct bg_tree *t, struct bg_job_cursor after, struct bg_job **out, size_t max);
/* Check order, heights, balance, the count and the cached first and last, and call
 * visit (if not NULL) on every job (nonzero: the job does not belong). 0, or
 * BG_INTERNAL_ERROR with *broken saying what. For the audit: O(n). */
int bg_tree_audit(const struct bg_tree *t, int (*visit)(const struct bg_job *j, void *arg), void *arg,
                  const char **broken);

/* A job: the core record every job has (64 bytes before its body, which
 * follows in the same slab slot), and a side record (struct bg_job_more)
 * made the first time the job is reserved, delayed or buried, or restored
 * with a delay or a nonzero counter; it then stays until the job is
 * deleted. docs/performance.md "Memory per job" has the layout. */
struct bg_job {
    uint64_t id;
    struct bg_tube *tube;
    /* reserved: the reserver's list; ready, delayed, buried: the links of
     * the tube's index of that state (tree.c) */
    struct bg_job *prev, *next;
    struct bg_job_more *more;   /* NULL until needed (above) */
    bg_time created_at;
    uint32_t pri, ttr_s;
    uint32_t body_size;         /* bytes stored in body[], including CRLF */
    uint16_t heights;           /* ready, delayed, buried: its subtrees' heights
                                 * in the tube's index (tree.c) */
    uint8_t state;              /* enum bg_job_state */
    char body[];                /* body_size bytes, ends in "\r\n" */
};

/* A job's side record. The first four fields are the reserved index's
 * node (tree.c, nodes == 1) while the job is reserved. The engine keeps a
 * spare (bg_engine.free_more) so that taking a reservation never
 * allocates; read its fields through the bg_job_* accessors below, which
 * give 0 (NULL) for a job without one. */
struct bg_job_more {
    struct bg_job_more *left, *right;
    uint16_t heights;           /* its subtrees' heights in the reserved index */
    uint32_t timer_slot;        /* engine's job timer heap (delayed, reserved) */
    struct bg_job *job;         /* the job it belongs to */
    struct bg_client *reserver; /* NULL unless reserved */
    bg_time deadline_at;        /* delayed: ready time; reserved: TTR end;
                                 * buried: its burial number in its tube
                                 * (bg_tube.burials), the buried order's key */
    uint32_t delay_s;
    uint32_t reserver_slot;     /* reserved: slot in the reserver's heap */
    uint32_t reserves, timeouts, releases, buries, kicks;
};

static inline struct bg_client *bg_job_reserver(const struct bg_job *j) { return j->more ? j->more->reserver : NULL; }
/* delayed: ready time; reserved: TTR end (ns); else 0 or a burial number */
static inline bg_time bg_job_deadline(const struct bg_job *j) { return j->more ? j->more->deadline_at : 0; }
static inline uint32_t bg_job_delay(const struct bg_job *j) { return j->more ? j->more->delay_s : 0; }
static inline uint32_t bg_job_reserves(const struct bg_job *j) { return j->more ? j->more->reserves : 0; }
static inline uint32_t bg_job_timeouts(const struct bg_job *j) { return j->more ? j->more->timeouts : 0; }
static inline uint32_t bg_job_releases(const struct bg_job *j) { return j->more ? j->more->releases : 0; }
static inline uint32_t bg_job_buries(const struct bg_job *j) { return j->more ? j->more->buries : 0; }
static inline uint32_t bg_job_kicks(const struct bg_job *j) { return j->more ? j->more->kicks : 0; }

/* A watch entry: one client watching one tube. It is also the client's slot
 * in the tube's waiting set while the client waits. */
struct bg_watch {
    struct bg_tube *tube;
    struct bg_client *client;
    uint32_t wait_index; /* slot in tube->waiting, UINT32_MAX if not waiting */
};

struct bg_tube_counters {
    uint64_t total_jobs, cmd_delete, cmd_pause;
};

/* A tube's counters as the history's last two tube sweeps noted them
 * (history.c), for its rates; zero in a tube no sweep has noted yet. 28 bytes. */
struct bg_tube_rate_marks {
    uint32_t sweep;             /* the sweep that wrote [1]; 0: none */
    uint32_t put[2], del[2];    /* total_jobs, cmd_delete (low 32 bits) as the
                                 * sweep before it [0] and it [1] noted them */
    uint32_t at_us[2];          /* when: microseconds after the start of that
                                 * sweep ([0]: of the sweep before `sweep`) */
};

struct bg_tube {
    /* Hot: every reserve of a client that watches this tube reads these
     * first. The (pri, id) of the first ready job, or UINT32_MAX and
     * UINT64_MAX while there is none or the tube is paused. */
    uint32_t ready_top_pri;
    uint64_t ready_top_id;
    char name[BG_TUBE_NAME_MAX + 1];
    struct bg_tube *hash_next;
    uint32_t list_index;        /* slot in engine tube list (creation order) */
    uint32_t timer_slot;        /* paused-tube timer heap */
    uint32_t refs;              /* users, watchers, jobs */
    /* its jobs of each state in serving order, `len` their count (tree.c;
     * bg_tube_jobs lists them) */
    struct bg_tree ready;       /* by (pri, id) */
    struct bg_tree delayed;     /* by (deadline, id) */
    struct bg_tree buried;      /* by burial number */
    struct bg_tree reserved;    /* by id, through the jobs' side records */
    uint64_t burials;           /* burial numbers given out (the next is burials + 1) */
    struct bg_watch **waiting;  /* waiting clients, reference set order */
    uint32_t waiting_len, waiting_cap, waiting_cursor;
    uint32_t urgent_count;
    uint32_t using_count, watching_count;
    bg_time pause_ns;           /* 0 when not paused */
    bg_time unpause_at;
    struct bg_tube_counters stat;
    struct bg_tube_rate_marks rate_marks; /* history.c's, nobody else's */
};

/* What a front-end does when the engine resolves a wait asynchronously. */
struct bg_client_ops {
    /* A waiting client was handed job j (now reserved by it). */
    void (*job_reserved)(struct bg_client *c, struct bg_job *j);
    /* A wait ended without a job: BG_TIMED_OUT or BG_DEADLINE_SOON. */
    void (*wait_ended)(struct bg_client *c, int outcome);
    /* Optional (NULL: always alive). Asked right before a job is handed to
     * waiting c: 0 means whoever waits through c is gone, so c stops
     * waiting (wait_ended BG_TIMED_OUT) and the job goes to the next
     * waiter or stays ready. It may only look, not call the engine. */
    int (*alive)(struct bg_client *c);
};

struct bg_client {
    struct bg_engine *engine;
    const struct bg_client_ops *ops;
    void *owner;                /* the front-end's object */
    struct bg_tube *use;
    struct bg_watch **watch;    /* watched tubes, reference set order */
    struct bg_tube **watch_tube; /* watch[i]->tube, kept contiguous for reserve */
    uint32_t watch_len, watch_cap;
    struct bg_job *reserved_head, *reserved_tail;
    struct bg_heap reserved;    /* own reserved jobs by TTR deadline */
    uint32_t timer_slot;        /* engine's client timer heap */
    bg_time wait_started;
    bg_time wait_deadline;      /* UINT64_MAX: no timeout */
    bg_time wake_at;            /* min(wait_deadline, soonest TTR - margin) */
    uint8_t waiting, is_producer, is_worker;
    uint8_t sleeping;           /* bg_client_set_sleeping */
    struct bg_client_entry *listed; /* its row in GET /clients (clients.c); NULL: not listed */
};

struct bg_server_counters {
    uint64_t cmd[32];           /* requests of every front-end by the command they perform (enum bg_cmd) */
    uint64_t job_timeouts, total_jobs, total_connections;
    /* what happened to jobs, whichever front-end asked: reservations made
     * (a job reserved again counts again) and jobs deleted */
    uint64_t total_jobs_reserved, total_jobs_deleted;
    /* beanstalk and Gearman connections closed on a line of HTTP (bg_line_is_http) */
    uint64_t cross_protocol_closed;
    /* requests refused by the session's or the token's scope, on every
     * protocol (PERMISSION_DENIED, 403, or NOT_FOUND/404 for a job it
     * cannot see); GET /stats and /metrics show it, beanstalk's stats do
     * not (its keys are beanstalkd's) */
    uint64_t permission_denied;
};

struct bg_engine {
    uint64_t next_id;           /* the next id to give out: always of this shard's class */
    uint32_t shard_index, shard_count; /* instance index of count (bg_engine_set_shard); 0 of 1 */
    struct bg_job **jobs;       /* table by id, open addressing (engine.c "job table") */
    size_t jobs_mask, job_count;
    uint64_t jobs_scale;        /* a job's home slot: (id * jobs_scale) >> 64, masked */
    struct bg_tube **tubes;     /* hash table by name, keyed (bg_siphash) */
    uint64_t hash_key[2];
    size_t tubes_mask;
    struct bg_tube **tube_list; /* list-tubes order */
    uint32_t tube_count, tube_list_cap;
    struct bg_tube *default_tube;
    struct bg_heap job_timers;  /* delayed and reserved jobs by deadline */
    struct bg_heap tube_timers; /* paused tubes by unpause_at */
    struct bg_heap client_timers; /* waiting clients by wake_at */
    /* spare side records (struct bg_job_more): a reservation of a job that
     * has none takes one, made beforehand, so that it never allocates */
    struct bg_job_more *free_more; /* linked by left */
    uint32_t free_more_count;
    bg_time due_at;             /* no deadline in the three heaps is earlier:
                                 * lowered by every push, made exact by each
                                 * tick; catching up is one compare with it */
    uint32_t max_job_size;
    /* bytes held by jobs, BG_JOB_MEMORY each and BG_JOB_MORE_MEMORY more
     * for each side record (jobs whose body is still arriving and jobs
     * restored from the log included), and the ceiling
     * on it (0: none; bg_engine_job_fits) */
    uint64_t job_memory, max_job_memory;
    uint8_t draining;
    uint8_t journal_broken;     /* the log cannot write: puts are refused */
    const struct bg_journal_ops *journal;
    void *journal_ctx;
    /* The log position the change being made depends on, and with it the
     * reply that reports it: the log's hooks raise it to the position of
     * each record they append, bg_engine_show_job to the position of a
     * shown job's put while that may not be durable. A front-end zeroes it
     * before a request and reads it after; io/wal.h (wal_reply_may_go)
     * decides when a reply with that position may go. 0: nothing to wait
     * for. */
    uint64_t reply_pos;
    /* Called (if set) when tube t has ready jobs that no waiter took: after
     * a put, release, kick, delay or TTR end, or an unpause. It may only
     * note the fact (it runs inside engine calls). */
    void (*job_ready)(void *ctx, struct bg_tube *t);
    void *job_ready_ctx;
    /* current counts, kept as jobs move */
    uint64_t ready_count, urgent_count, reserved_count, delayed_count, buried_count;
    uint64_t clients, connections, producers, workers, waiting;
    struct bg_server_counters stat;
    struct bg_client_registry *registry; /* who is connected (clients.c); NULL until the first */
};

/* Set up an engine with the default tube; its tube-name table is hashed
 * under hash_key (random, chosen once at start; NULL: all zero, for tests
 * and tools). 0 or BG_OUT_OF_MEMORY. */
int bg_engine_init(struct bg_engine *e, uint32_t max_job_size, const uint64_t hash_key[2]);
/* Free every job, tube and table. Clients must have been closed. */
void bg_engine_destroy(struct bg_engine *e);

/* ---- Shards (engine.c). Instance `index` of `count` owns the job ids
 * that are index modulo count, so a job id alone tells which instance
 * holds the job: bg_shard_of_id. It gives out the smallest such id above 0
 * first (index, or count for index 0: id 0 never exists), then each next
 * one count higher. 0 of 1, the default, is every id from 1, as beanstalkd.
 * Tubes are placed by bg_shard_of_tube, the rule HAProxy's `crc32,mod(N)`
 * computes (contrib/haproxy, docs/scaling.md). ---- */
#define BG_SHARD_COUNT_MAX 1024
/* Make e instance index of count; call before any job is made or restored.
 * 0, or BG_BAD_FORMAT (count 0 or above BG_SHARD_COUNT_MAX, index >= count). */
int bg_engine_set_shard(struct bg_engine *e, uint32_t index, uint32_t count);
/* The instance, of count, that owns job id: id mod count. */
static inline uint32_t bg_shard_of_id(uint64_t id, uint32_t count)
{
    return (uint32_t)(id % count);
}
/* The instance, of count, that owns tube name[0..len): the CRC-32 of the
 * name's bytes (bg_crc32: zlib's, HAProxy's crc32 converter) mod count. */
uint32_t bg_shard_of_tube(const char *name, size_t len, uint32_t count);
/* An id was given out before (a log record names it): move next_id past it,
 * to the smallest id of this shard's class above it. Ids are never reused. */
void bg_engine_id_seen(struct bg_engine *e, uint64_t id);
/* The highest id given out so far (next_id - count), or 0 if none was. */
uint64_t bg_engine_last_id(const struct bg_engine *e);
/* How many jobs e holds whose id another shard owns (a log written with
 * another --shard); *first gets the smallest of them (0 if none). O(jobs). */
size_t bg_engine_foreign_jobs(const struct bg_engine *e, uint64_t *first);

/* Write the id of every job into ids (room for job_count); returns how
 * many (job_count). The order is the job table's. */
size_t bg_engine_job_ids(const struct bg_engine *e, uint64_t *ids);
/* The job `peek-ready` / `-delayed` / `-buried` shows in tube t: the next
 * ready job (by priority, then id), the next delayed job (by deadline), the
 * oldest buried job; NULL if there is none (or for BG_JOB_RESERVED). */
struct bg_job *bg_peek(const struct bg_tube *t, enum bg_job_state state);
/* Browsing a tube's jobs (issue 26), by struct bg_job_cursor (tree.c).
 * Up to max jobs of tube t in `state`, in serving order, that come after
 * *cursor, into out; returns how many and moves *cursor past the last one
 * (unchanged when none). The cursor stays valid as jobs come and go (a job
 * that left is simply not there any more; one that came after the cursor's
 * place shows on a later page). A paused tube's ready jobs are listed too.
 * Reads only: the caller catches up (bg_engine_catch_up) first. */
size_t bg_tube_jobs(const struct bg_tube *t, enum bg_job_state state,
                    struct bg_job_cursor *cursor, struct bg_job **out, size_t max);
/* Tube t's index of its jobs in `state` (tree.c). */
const struct bg_tree *bg_tube_index(const struct bg_tube *t, enum bg_job_state state);
/* The cursor just after job j, in j's current state. */
struct bg_job_cursor bg_job_cursor_of(const struct bg_job *j);
/* Kick up to max jobs of tube t that are in `state` (BG_JOB_BURIED or
 * BG_JOB_DELAYED; any other state kicks nothing), in serving order;
 * returns how many (each logged as a kick). O(max log n): a bulk kick runs
 * in steps of max jobs. */
uint64_t bg_kick_state(struct bg_engine *e, struct bg_tube *t, enum bg_job_state state,
                       uint64_t max, bg_time now);
/* Delete up to max jobs of tube t that are in `state` (ready, delayed or
 * buried; reserved deletes nothing), in serving order; returns how many
 * (each logged as a delete, counted in total-jobs-deleted and the tube's
 * cmd-delete). O(max log n). As after any delete, t is freed if nothing
 * refers to it any more: a caller that steps looks it up by name again. */
uint64_t bg_delete_state(struct bg_engine *e, struct bg_tube *t, enum bg_job_state state,
                         uint64_t max, bg_time now);
/* Find a job by id; NULL if there is none. */
struct bg_job *bg_job_find(const struct bg_engine *e, uint64_t id);
/* Find a tube by name (NUL-terminated); NULL if there is none. */
struct bg_tube *bg_tube_find(struct bg_engine *e, const char *name);
/* Nonzero if ch may appear in a tube name. */
int bg_tube_name_char(char ch);
/* Nonzero if name is a valid tube name of length len. */
int bg_tube_name_valid(const char *name, size_t len);

/* Ops for a client that never waits (an HTTP holder, a Gearman worker):
 * neither callback is ever called, and both do nothing. */
extern const struct bg_client_ops bg_client_ops_never_wait;

/* Attach a new client (a connection or an HTTP holder); it uses and watches
 * "default". 0 or BG_OUT_OF_MEMORY. */
int bg_client_init(struct bg_engine *e, struct bg_client *c,
                   const struct bg_client_ops *ops, void *owner);
/* Attach a client that uses and watches nothing yet (an HTTP holder or
 * long-poll): it does not show in any tube's using/watching counts until
 * it watches. 0 or BG_OUT_OF_MEMORY. */
int bg_client_init_bare(struct bg_engine *e, struct bg_client *c,
                        const struct bg_client_ops *ops, void *owner);
/* Detach: stop waiting, return reserved jobs to ready, drop tube refs. */
void bg_client_close(struct bg_client *c, bg_time now);
/* A client that waits for work outside the engine's waiting sets (a
 * Gearman worker after PRE_SLEEP) counts in current-waiting while
 * `sleeping` is set, as a blocked reserve does; closing clears it. */
void bg_client_set_sleeping(struct bg_client *c, int sleeping);
/* Refuse new jobs from now on (SIGUSR1, Gearman's `shutdown graceful`). */
void bg_engine_drain(struct bg_engine *e);
/* A connection of any protocol opened / closed (current-connections,
 * total-connections); HTTP requests are not connections. */
void bg_engine_connection_opened(struct bg_engine *e);
void bg_engine_connection_closed(struct bg_engine *e);
/* Count c as a producer / worker in stats (once). */
void bg_client_mark_producer(struct bg_client *c);
void bg_client_mark_worker(struct bg_client *c);
/* Use tube `name`, creating it. 0 or BG_OUT_OF_MEMORY. */
int bg_client_use(struct bg_client *c, const char *name);
/* Watch tube `name`, creating it; *count gets the watch count. 0, or
 * BG_OUT_OF_MEMORY (also when c watches BG_WATCH_MAX tubes already). */
int bg_client_watch(struct bg_client *c, const char *name, uint32_t *count);
/* Ignore tube `name`: 0, or BG_NOT_IGNORED for the last watched tube. */
int bg_client_ignore(struct bg_client *c, const char *name, uint32_t *count);
/* Stop watching tube `name`, even the last one (a Gearman worker may can-do
 * nothing). The client must not be waiting. 0 or BG_NOT_FOUND. */
int bg_client_unwatch(struct bg_client *c, const char *name);

/* What a job of body_size bytes (CRLF included) counts against the
 * job-memory ceiling: its 64-byte core record and its body; and a job with
 * a side record (ever reserved, delayed or buried) 80 bytes more, counted
 * when it is made but never refused for the ceiling. */
#define BG_JOB_MEMORY(body_size) (sizeof(struct bg_job) + (uint64_t)(body_size))
#define BG_JOB_MORE_MEMORY ((uint64_t)sizeof(struct bg_job_more))
/* 1 if a new job of body_size bytes (CRLF included) fits under the
 * job-memory ceiling (always, without one), else 0. */
int bg_engine_job_fits(const struct bg_engine *e, uint32_t body_size);
/* 1 while not even an empty job fits under the ceiling: every put is
 * refused (/readyz says so). Jobs restored from the log may hold more
 * than the ceiling; puts are refused until enough are deleted. */
int bg_engine_memory_full(const struct bg_engine *e);
/* Allocate a job (id assigned now, as the reference does) with room for
 * body_size bytes incl. CRLF; the caller fills body. It counts against the
 * job-memory ceiling from now on. NULL: out of memory, or the job does not
 * fit under the ceiling (bg_engine_job_fits tells which). */
struct bg_job *bg_job_new(struct bg_engine *e, uint32_t pri, uint32_t delay_s,
                          uint32_t ttr_s, uint32_t body_size, bg_time now);
/* Discard a job made by bg_job_new on e that never entered the engine. */
void bg_job_discard(struct bg_engine *e, struct bg_job *j);
/* Enter a new job into tube `t`: 0, else the job is freed and BG_DRAINING, BG_LOG_UNAVAILABLE (the log cannot
 * write: journal_broken) or BG_OUT_OF_MEMORY. */
int bg_put(struct bg_client *c, struct bg_tube *t, struct bg_job *j, bg_time now);

/* ---- Time. Every entry point below that takes `now` first does whatever
 * fell due by `now` (a deadline equal to `now` counts as passed): delayed
 * jobs become ready, reservations whose TTR ended go back to ready, pauses
 * end, and waits end (in that order, as bg_engine_tick). So an answer never
 * depends on whether the loop's timer ran bg_engine_tick before the
 * command: a job whose delay passed is reservable, a job whose TTR passed
 * is no longer its old owner's to touch, release or bury, a waiter whose
 * timeout passed gets TIMED_OUT rather than the next put's job (issue 11,
 * defect 3: `pause-tube T 0` then `reserve-with-timeout 0` timed out).
 * The catch-up costs one compare while nothing is due (due_at). It may
 * run other clients' ops callbacks; a client that is waiting calls no
 * entry point but bg_client_stop_waiting and bg_client_close (which stops
 * the wait before catching up), so no client is called back inside its
 * own call. A front-end that reads engine state itself (peek, stats, a
 * reservation check) calls bg_engine_catch_up first. ---- */

/* Reserve for c (not waiting): a job now (0, *out set), BG_DEADLINE_SOON
 * (no job, and a reservation of c ends within BG_DEADLINE_MARGIN),
 * BG_TIMED_OUT (timeout 0), or BG_WOULD_BLOCK (c now waits; ops report the
 * end). timeout_s < 0 waits forever. */
int bg_reserve(struct bg_client *c, int64_t timeout_s, bg_time now, struct bg_job **out);
/* Reserve job `id` in any state but reserved: 0 or BG_NOT_FOUND. */
int bg_reserve_job(struct bg_client *c, uint64_t id, bg_time now, struct bg_job **out);
/* Delete a job reserved by c, or ready, delayed or buried. */
int bg_delete(struct bg_client *c, uint64_t id, bg_time now);
int bg_release(struct bg_client *c, uint64_t id, uint32_t pri, uint32_t delay_s, bg_time now);
int bg_bury(struct bg_client *c, uint64_t id, uint32_t pri, bg_time now);
int bg_touch(struct bg_client *c, uint64_t id, bg_time now);
/* Give job `id`, reserved by c, a new TTR of ttr_s seconds (0 counts as
 * 1) that runs from now, and log the change: 0 or BG_NOT_FOUND. */
int bg_set_ttr(struct bg_client *c, uint64_t id, uint32_t ttr_s, bg_time now);
/* Kick up to n jobs of tube t (buried first, else delayed); returns count. */
uint64_t bg_kick(struct bg_engine *e, struct bg_tube *t, uint64_t n, bg_time now);
int bg_kick_job(struct bg_engine *e, uint64_t id, bg_time now);
/* Pause tube `name` for delay_s seconds; 0 ends any pause at once (and
 * serves the tube's waiters). 0, BG_NOT_FOUND or BG_OUT_OF_MEMORY. */
int bg_pause_tube(struct bg_engine *e, const char *name, uint32_t delay_s, bg_time now);
/* Stop waiting (a connection hung up mid-wait); no callback. */
void bg_client_stop_waiting(struct bg_client *c);

/* Do everything due at `now`: promote delayed jobs, expire TTRs, unpause
 * tubes, end waits. Returns the next deadline, or UINT64_MAX if none. */
bg_time bg_engine_tick(struct bg_engine *e, bg_time now);
/* The next deadline without doing anything. */
bg_time bg_engine_next_deadline(const struct bg_engine *e);
/* bg_engine_tick if anything may be due at `now`: one compare otherwise.
 * For a front-end about to read engine state itself (see "Time" above). */
static inline void bg_engine_catch_up(struct bg_engine *e, bg_time now)
{
    if (now >= e->due_at) bg_engine_tick(e, now);
}

/* Move reserved job j to client `to` (its deadline is kept). */
void bg_reservation_transfer(struct bg_job *j, struct bg_client *to);
/* Put j into the tube named `tube` (created if need be): as bg_put. */
int bg_put_named(struct bg_client *c, const char *tube, struct bg_job *j, bg_time now);
/* Make a job of a copy of body[0..len) (the stored CRLF is added here) and
 * put it into the tube named `tube`: 0 with *id set, else
 * BG_DRAINING, BG_LOG_UNAVAILABLE, BG_MEMORY_CEILING or BG_OUT_OF_MEMORY. For front-ends that have the body in
 * hand (HTTP, Gearman); the beanstalk codec reads straight into the job. */
int bg_put_copy(struct bg_client *c, const char *tube, uint32_t pri, uint32_t delay_s, uint32_t ttr_s,
                const void *body, uint32_t len, bg_time now, uint64_t *id);

/* ---- audit.c: the engine checked from scratch ---------------------------- */

/* Walk every job, tube and timer heap and check that the counts, slots,
 * heap orders, cached tops, the matching invariant and due_at agree.
 * 0, or BG_INTERNAL_ERROR with *broken naming the first broken rule. For
 * fuzzers and tests: it costs O(everything). */
int bg_engine_audit(const struct bg_engine *e, const char **broken);

/* ---- token.c: keyed hash; reservation tokens for connectionless clients - */

/* SipHash-2-4 of data[0..len) under a 128-bit key (data may be NULL when len
 * is 0). The keyed hash for every
 * table that clients fill: without the key (random, chosen at start by the
 * front-end) nobody can choose keys that share a bucket. */
uint64_t bg_siphash(const uint64_t key[2], const void *data, size_t len);
/* The hash of an id the server gave out (not chosen by clients, so it
 * needs no key): Fibonacci hashing. */
static inline uint64_t bg_hash_id(uint64_t id) { return id * 0x9E3779B97F4A7C15ull; }

#define BG_TOKEN_MAX 64
struct bg_token_key { uint64_t k[4]; };

/* Write the token of reservation number `reserves` of job `id`. */
void bg_token_make(const struct bg_token_key *key, uint64_t id, uint32_t reserves,
                   char out[BG_TOKEN_MAX]);
/* 0 if token names that reservation, else BG_NOT_FOUND (constant time). */
int bg_token_check(const struct bg_token_key *key, const char *token, uint64_t id,
                   uint32_t reserves);

/* ---- clients.c: who is connected (GET /clients, issue 26) -------------
 * A front-end lists each client a person would call a connection: a
 * beanstalk or Gearman connection, an HTTP long-poll while it lasts, a push
 * subscription. Each gets an id (from 1, ascending, never reused) and keeps
 * it until bg_client_close. The registry keeps one id-ordered array per
 * protocol (a new id always goes at the end; a closed one leaves a hole
 * until half the array is holes), so finding an id and reading a page after
 * a cursor are O(log n + page + holes passed), never a scan of everyone. */
enum bg_client_protocol {
    BG_CLIENT_BEANSTALK, BG_CLIENT_GEARMAN, BG_CLIENT_HTTP, BG_CLIENT_PUSH,
    BG_CLIENT_PROTOCOLS
};
#define BG_CLIENT_PEER_MAX 64        /* "ip:port" with an IPv6 address, and its NUL */
#define BG_CLIENT_RESERVED_SHOWN 20  /* reserved ids a listing names */

/* One listed client. The front-end fills peer, tls, name and close_now
 * after bg_client_list; the rest is the registry's. */
struct bg_client_entry {
    uint64_t id;
    struct bg_client *client;       /* its tubes, reservations and wait */
    struct bg_client *holder;       /* NULL, or a second client whose reservations are
                                     * this one's too (a push subscription's holder) */
    bg_time created_at, active_at;  /* listed; its peer's last request (bg_client_active) */
    uint8_t protocol;               /* enum bg_client_protocol */
    uint8_t tls;
    char peer[BG_CLIENT_PEER_MAX];  /* "ip:port"; "": none (a UNIX socket, push) */
    const char *name;               /* a push subscription's name; NULL */
    /* Close it now as its peer's hang-up would (reservations go back to
     * ready), or end a long-poll as timed out. NULL: it cannot be closed
     * (a push subscription: the configuration decides). May free c. */
    void (*close_now)(struct bg_client *c, bg_time now);
    uint32_t slot;                  /* in its protocol's array */
};

/* "beanstalk", "gearman", "http", "push". */
const char *bg_client_protocol_name(enum bg_client_protocol p);
/* The protocol named name[0..len): 0, or BG_BAD_FORMAT. */
int bg_client_protocol_parse(const char *name, size_t len, enum bg_client_protocol *out);
/* List client c (initialised, not listed) as a client of protocol p from
 * now on: its entry (id given, peer empty), or NULL out of memory (then it
 * is simply not listed). bg_client_close unlists it. */
struct bg_client_entry *bg_client_list(struct bg_client *c, enum bg_client_protocol p, bg_time now);
/* Count holder's reservations as those of listed c (a push subscription). */
void bg_client_list_holder(struct bg_client *c, struct bg_client *holder);
/* Take c out of the listing (nothing if it is not listed). */
void bg_client_unlist(struct bg_client *c);
/* c's peer sent a request at now: it is not idle. */
static inline void bg_client_active(struct bg_client *c, bg_time now)
{
    if (c->listed) c->listed->active_at = now;
}
/* The id that lists the reserver of job j, or 0 (an HTTP token's, a
 * Gearman background job's holder: no connection holds it). */
uint64_t bg_job_reserved_by(const struct bg_job *j);
/* The listed client of that id; NULL if there is none (now). */
struct bg_client_entry *bg_client_entry_find(const struct bg_engine *e, uint64_t id);
/* How many clients are listed, of protocol p (BG_CLIENT_PROTOCOLS: all). */
uint64_t bg_clients_count(const struct bg_engine *e, enum bg_client_protocol p);
/* Up to max listed clients with an id above `after`, of protocol p
 * (BG_CLIENT_PROTOCOLS: all), in id order, into out; returns how many, and
 * *more is set when more follow the last. */
size_t bg_clients_page(const struct bg_engine *e, enum bg_client_protocol p, uint64_t after,
                       struct bg_client_entry **out, size_t max, int *more);
/* How many jobs entry x's clients hold reserved, and the first ids of them
 * (up to max) into ids; *shown gets how many ids were written. */
uint64_t bg_client_entry_reserved(const struct bg_client_entry *x, uint64_t *ids, size_t max, size_t *shown);
/* Free the registry (bg_engine_destroy; every client closed). */
void bg_clients_free(struct bg_engine *e);

/* ---- scope.c: what a token or a client certificate may do --------------
 * The access file (--http-token-file) has one entry per line (# comments):
 *   TOKEN [GRANT ...]                    a bearer token for the gateway
 *   identity NAME [GRANT ...]            a client certificate's name (io/tls.h:
 *                                        cn:NAME, dns:NAME, email:NAME, uri:NAME),
 *                                        or * for any verified certificate
 * GRANT is KINDS:TUBES, each a comma-separated list: kinds among produce,
 * consume, manage, read (or *); tubes exact names, or prefixes ending in *
 * (a lone * is every tube). An entry without grants may do everything
 * (today's meaning of a token). docs/security.md has examples.
 * Which protocol action needs which kind is decided by the front-ends'
 * tables from these kinds; whether a scope allows it is decided only here. */
enum bg_scope_kind {
    BG_SCOPE_PRODUCE,   /* put */
    BG_SCOPE_CONSUME,   /* reserve, delete/release/bury/touch what one reserved */
    BG_SCOPE_MANAGE,    /* kick, pause, delete any job */
    BG_SCOPE_READ,      /* stats, peeks, the dashboard's views */
    BG_SCOPE_KINDS
};
#define BG_SCOPE_GRANTS_MAX 64       /* grants on one line */
#define BG_SCOPE_TUBES_MAX 64        /* tube patterns in one grant */
#define BG_SCOPE_LINE_MAX 8192       /* bytes of one line (without its newline) */
#define BG_SCOPE_TOKEN_MAX 512       /* bytes of one token */
#define BG_SCOPE_TOKENS_MAX 256      /* token lines (and added tokens) */
#define BG_SCOPE_IDENTITIES_MAX 256  /* identity lines */
#define BG_SCOPE_NAME_MAX 256        /* an identity name and its NUL (io/tls.h's TLS_IDENTITY_NAME_MAX) */
#define BG_SCOPE_REQUIRED_MAX (16 + BG_TUBE_NAME_MAX) /* "consume:" + a tube name + NUL */
/* One entry's grants. NULL wherever a scope is expected: unscoped (all). */
struct bg_scope;
/* A parsed access file. */
struct bg_scopes;

/* Parse an access file's text: 0, or BG_BAD_FORMAT with "line N: why" in
 * err (nothing is kept), or BG_OUT_OF_MEMORY. */
int bg_scopes_parse(struct bg_scopes **out, const char *text, size_t len, char *err, size_t errlen);
void bg_scopes_free(struct bg_scopes *sc);
/* Add an unscoped token (BEANGATE_HTTP_TOKENS) after the file's, with the
 * token lines' rules: 0, or BG_BAD_FORMAT with why in err, or
 * BG_OUT_OF_MEMORY. */
int bg_scopes_add_token(struct bg_scopes *sc, const char *token, size_t len, char *err, size_t errlen);
/* How many token lines; the token of line i (i < count), for gateway/auth.c's
 * constant-time match, and its scope (NULL: unscoped). */
size_t bg_scopes_token_count(const struct bg_scopes *sc);
const char *bg_scopes_token(const struct bg_scopes *sc, size_t i, size_t *len);
const struct bg_scope *bg_scopes_token_scope(const struct bg_scopes *sc, size_t i);
/* Whether sc has identity lines at all (without them, certificate holders
 * on the beanstalk and Gearman ports keep beanstalkd's behaviour). */
int bg_scopes_has_identities(const struct bg_scopes *sc);
/* The scope of the first identity line matching one of names[0..n), into
 * *out (NULL: unscoped): 0, or BG_NOT_FOUND when no line matches (the
 * certificate may do nothing). */
int bg_scopes_for_identity(const struct bg_scopes *sc, const char *const *names, size_t n,
                           const struct bg_scope **out);
/* 1 if s may do `kind` on the tube name[0..len), else 0. */
int bg_scope_allows(const struct bg_scope *s, enum bg_scope_kind kind, const char *name, size_t len);
/* 1 if s may do `kind` on at least one tube (beanstalk's server-wide
 * `stats` needs read somewhere). */
int bg_scope_allows_some(const struct bg_scope *s, enum bg_scope_kind kind);
/* 1 if s may do `kind` on every tube (a kind:* grant): what an action on a
 * whole client needs, whose tubes are any (GET/DELETE /clients). */
int bg_scope_allows_all(const struct bg_scope *s, enum bg_scope_kind kind);
/* The scope that allows nothing and sees nothing: a certificate no
 * identity line matches. */
const struct bg_scope *bg_scope_nothing(void);
/* 1 if s may do anything on the tube (listings show only such tubes). */
int bg_scope_sees(const struct bg_scope *s, const char *name, size_t len);
/* s's grants as the access file wrote them, one rule per (grant, tube
 * pattern), in the file's order: how many (0 for NULL, unscoped), and
 * rule i's kinds (bit 1 << enum bg_scope_kind each), with its pattern into
 * *pattern (NUL-terminated): a tube name, a prefix ending in '*', or "*". */
size_t bg_scope_rule_count(const struct bg_scope *s);
unsigned bg_scope_rule(const struct bg_scope *s, size_t i, char pattern[BG_TUBE_NAME_MAX + 2]);
/* "produce", "consume", "manage", "read". */
const char *bg_scope_kind_name(enum bg_scope_kind kind);
/* What a refusal names: "consume:emails" into out (BG_SCOPE_REQUIRED_MAX). */
void bg_scope_required(enum bg_scope_kind kind, const char *name, size_t len, char *out);

/* ---- push.c: the pure parts of push delivery (server/push.c does I/O) --- */

#define BG_PUSH_SUBSCRIPTIONS_MAX 64
#define BG_PUSH_URL_MAX 2048
#define BG_PUSH_CONCURRENCY_MAX 1024
#define BG_PUSH_TIMEOUT_MAX 86400       /* seconds */
#define BG_PUSH_ATTEMPTS_MAX 1000000
#define BG_PUSH_BACKOFF_MAX 604800      /* seconds (7 days) */
#define BG_PUSH_RATE_MAX 1000000        /* jobs per period */
#define BG_PUSH_DEFAULT_CONCURRENCY 1
#define BG_PUSH_DEFAULT_TIMEOUT 30
#define BG_PUSH_DEFAULT_ATTEMPTS 10
#define BG_PUSH_DEFAULT_BACKOFF_MIN 1
#define BG_PUSH_DEFAULT_BACKOFF_MAX 600
#define BG_PUSH_FAILURES_MAX 100000     /* jobs whose last failure is kept */

/* One subscription as the operator wrote it:
 *   tube=T url=http[s]://HOST[:PORT]/PATH [concurrency=N] [rate=N/s|N/m|N/h]
 *   [timeout=S] [attempts=N] [backoff=MIN..MAX] [secret-file=PATH]
 *   [ca-file=PATH] [cert-file=PATH key-file=PATH]   (https:// only) */
struct bg_push_spec {
    char tube[BG_TUBE_NAME_MAX + 1];
    char url[BG_PUSH_URL_MAX + 1];   /* as given */
    char host[256];                  /* an IPv6 address without its brackets */
    uint16_t port;                   /* 80 (443 for https) when the url names none */
    int tls;                         /* https:// */
    char path[BG_PUSH_URL_MAX + 2];  /* path and query; starts with '/' */
    uint32_t concurrency;            /* jobs in flight at most */
    uint32_t rate_count;             /* 0: no rate limit */
    bg_time rate_period;             /* rate_count jobs per this many ns */
    uint32_t timeout_s;              /* one attempt, at most (and below the TTR) */
    uint32_t attempts;               /* the attempt that fails at this number buries */
    uint32_t backoff_min_s, backoff_max_s;
    char secret_file[1024];          /* "": deliveries are not signed */
    char ca_file[1024];              /* "": the system's trust store (https) */
    char cert_file[1024];            /* "": no client certificate; set with key_file */
    char key_file[1024];
};

/* The next subscription of a list text s[*pos..len) (a --push value, a
 * --push-file, BEANGATE_PUSH): subscriptions are separated by newlines and
 * by a ';' that is a word of its own; a word that starts with '#' comments
 * out the rest of its line. Writes its words into out, one space apart,
 * and advances *pos; *line counts the newlines passed before it (for
 * messages). 1 (one found), 0 (none left) or BG_BAD_FORMAT (longer than
 * out_size). */
int bg_push_list_next(const char *s, size_t len, size_t *pos, char *out, size_t out_size,
                      unsigned *line);
/* Fill *out with the defaults. */
void bg_push_spec_defaults(struct bg_push_spec *s);
/* Parse one subscription (words one space apart): 0, or BG_BAD_FORMAT with
 * a message for people in why. Checks every value; the secret file is only
 * named here (the server reads it). */
int bg_push_spec_parse(const char *text, struct bg_push_spec *out, char *why, size_t why_size);
/* Parse an http:// or https:// URL into out's url, tls, host, port and
 * path: 0, or BG_BAD_FORMAT with why (another scheme, a user, a fragment,
 * no host, ...). */
int bg_push_url_parse(const char *url, struct bg_push_spec *out, char *why, size_t why_size);

/* What went wrong below HTTP in an attempt that got no status. */
enum bg_push_failure {
    BG_PUSH_FAIL_NONE, BG_PUSH_FAIL_TIMEOUT, BG_PUSH_FAIL_CONNECT, BG_PUSH_FAIL_CONNECTION,
    BG_PUSH_FAIL_TLS,
};
/* Why an attempt ended as it did (the metrics' reason label). */
enum bg_push_reason {
    BG_PUSH_DELIVERED,          /* 2xx */
    BG_PUSH_RETRY_AFTER,        /* any other status with a valid Retry-After */
    BG_PUSH_HTTP_429,
    BG_PUSH_HTTP_5XX,
    BG_PUSH_TIMEOUT,            /* no complete answer within the attempt's timeout */
    BG_PUSH_CONNECT_FAILED,     /* refused, unreachable, or the name did not resolve */
    BG_PUSH_CONNECTION_ERROR,   /* closed or reset, or not HTTP */
    BG_PUSH_BAD_STATUS,         /* a status outside 200-599 */
    BG_PUSH_TLS_FAILED,         /* https: the handshake or the certificates failed */
    BG_PUSH_HTTP_3XX,           /* redirects are not followed */
    BG_PUSH_HTTP_4XX,           /* other than 429 */
    BG_PUSH_ATTEMPTS_EXHAUSTED, /* a retryable failure at the last attempt */
    BG_PUSH_SHUTDOWN,           /* cut by the end of the shutdown grace */
    BG_PUSH_REASON_COUNT
};
enum bg_push_action { BG_PUSH_DELETE, BG_PUSH_RELEASE, BG_PUSH_BURY };

/* "http_5xx", ... */
const char *bg_push_reason_name(enum bg_push_reason r);
/* The reason of an attempt's end: status 0 when no response head came
 * (failure says why); a status, when one came, decides. */
enum bg_push_reason bg_push_classify(unsigned status, int has_retry_after, enum bg_push_failure failure);
/* What to do with the job after attempt number `attempt` ended for r:
 * delete (2xx), bury (3xx, 4xx but 429, or a retryable failure at attempt
 * >= max_attempts), or release (retry; also a shutdown cut). */
enum bg_push_action bg_push_action_of(enum bg_push_reason r, uint32_t attempt, uint32_t max_attempts);
/* Seconds to wait after failed attempt number `attempt` (1 = the first):
 * full jitter above the minimum, uniform in [min, min(max, min * 2^(attempt-1))];
 * random is any random 64-bit value. */
uint32_t bg_push_backoff(uint32_t min_s, uint32_t max_s, uint32_t attempt, uint64_t random);
/* The delay for a receiver's Retry-After of retry_after_s seconds: kept
 * within [min, max] of the subscription's backoff. */
uint32_t bg_push_retry_delay(uint64_t retry_after_s, uint32_t min_s, uint32_t max_s);
/* A Retry-After value: delta-seconds, or an HTTP-date (IMF-fixdate, RFC 850
 * or asctime; a past date gives 0). now_wall_s is Unix time. 0 with
 * *delay_s set, or BG_BAD_FORMAT. */
int bg_push_retry_after(const char *v, int64_t now_wall_s, uint64_t *delay_s);
/* An HTTP-date in any of its three forms as Unix seconds: 0 or BG_BAD_FORMAT. */
int bg_http_date_parse(const char *v, int64_t *out);

/* A rate limit (GCRA): rate_count jobs per period, with a burst of one
 * second's worth (at least 1). interval 0: unlimited. */
struct bg_rate { bg_time interval, burst, tat; };
void bg_rate_init(struct bg_rate *r, uint32_t count, bg_time period);
/* When the next job may start: now if it may start now. */
bg_time bg_rate_ready_at(const struct bg_rate *r, bg_time now);
/* Count one job started at now (after bg_rate_ready_at said now). */
void bg_rate_take(struct bg_rate *r, bg_time now);

/* The last delivery failure of a job (GET /jobs/{id}: last_delivery_error). */
struct bg_push_failure_rec {
    uint64_t job_id;            /* 0: a free slot */
    int64_t at_wall_s;          /* when the attempt ended, Unix seconds */
    bg_time retry_at;           /* released with a delay: when it is ready again; else 0 */
    uint32_t attempt;
    uint16_t status;            /* 0: no HTTP status */
    uint8_t reason;             /* enum bg_push_reason */
    uint8_t subscription;       /* index of the subscription */
};
struct bg_push_failure_slot {
    struct bg_push_failure_rec rec;
    uint32_t hash_next, older, newer;
};
/* A table of at most `limit` records by job id; when it is full the record
 * updated longest ago goes. Grows by doubling, never shrinks. */
struct bg_push_failures {
    struct bg_push_failure_slot *slots;
    uint32_t *buckets;
    unsigned bucket_bits;
    uint32_t cap, limit, count, free_head, newest, oldest;
    uint64_t evicted;           /* records dropped because the table was full */
};
void bg_push_failures_init(struct bg_push_failures *t, uint32_t limit);
void bg_push_failures_free(struct bg_push_failures *t);
/* Record (or replace) rec for rec->job_id, as the newest: 0, or
 * BG_OUT_OF_MEMORY (nothing recorded). */
int bg_push_failures_set(struct bg_push_failures *t, const struct bg_push_failure_rec *rec);
/* The record of job id, or NULL if none. */
const struct bg_push_failure_rec *bg_push_failures_get(const struct bg_push_failures *t, uint64_t id);
void bg_push_failures_remove(struct bg_push_failures *t, uint64_t id);
/* Call fn for every record, oldest first. fn must not change the table. */
void bg_push_failures_each(const struct bg_push_failures *t,
                           void (*fn)(void *ctx, const struct bg_push_failure_rec *rec), void *ctx);

/* ---- journal.c: the write-ahead log's record format (no files) --------- */

#define BG_JOURNAL_VERSION 1
#define BG_JOURNAL_HEADER_SIZE 16
/* The unit a kernel writes back (or not) after a crash of the machine: a
 * zero run up to a multiple of it is a page never written (journal.c). */
#define BG_JOURNAL_PAGE_SIZE 4096
enum bg_record_type {
    BG_REC_JOB = 1, BG_REC_UPDATE = 2, BG_REC_DELETE = 3, BG_REC_PAUSE = 4,
    BG_REC_SNAPSHOT_END = 5, /* the records before it in this segment are the
                              * whole state: older segments are superseded */
};

/* A job as the log keeps it. Times are wall-clock nanoseconds so that
 * delays survive a restart. body is NULL in an update record. */
struct bg_journal_job {
    uint64_t id;
    const char *tube;
    uint32_t pri;
    uint8_t state;              /* ready, delayed or buried (reserved logs as ready) */
    uint32_t delay_s, ttr_s;
    uint64_t deadline_wall;     /* delayed: when it becomes ready */
    uint64_t created_wall;
    uint32_t reserves, timeouts, releases, buries, kicks;
    uint32_t body_len;          /* including the CRLF */
    const char *body;
};

struct bg_journal_record {
    uint8_t type;               /* enum bg_record_type */
    struct bg_journal_job job;  /* JOB, UPDATE; DELETE uses job.id */
    char tube[BG_TUBE_NAME_MAX + 1];
    uint32_t pause_s;           /* PAUSE */
    uint64_t unpause_wall;
};

/* CRC-32C (Castagnoli): the log's record checksum. */
uint32_t bg_crc32c(const void *data, size_t n);
/* CRC-32 (IEEE 802.3: zlib's crc32, Go's crc32.ChecksumIEEE, PHP's crc32,
 * HAProxy's crc32 converter): the tube -> shard hash (bg_shard_of_tube). */
uint32_t bg_crc32(const void *data, size_t n);
void bg_journal_segment_header(char out[BG_JOURNAL_HEADER_SIZE]);
/* 0 if data starts with a segment header of our version, else BG_BAD_FORMAT. */
int bg_journal_check_header(const char *data, size_t len);
/* Append a record (JOB with body, or UPDATE without) to out. */
int bg_journal_encode_job(struct bg_buf *out, const struct bg_journal_job *r, int with_body);
int bg_journal_encode_delete(struct bg_buf *out, uint64_t id);
int bg_journal_encode_snapshot_end(struct bg_buf *out);
int bg_journal_encode_pause(struct bg_buf *out, const char *tube, uint32_t pause_s,
                            uint64_t unpause_wall);
/* Bytes a JOB record (with its body of body_len bytes, CRLF included) of a
 * job in a tube named by tube_len bytes takes, frame included. */
size_t bg_journal_job_record_size(size_t tube_len, uint32_t body_len);
/* Bytes of the record that starts at data[0..len) according to its length
 * field (it is not checked), or 0 if not even that is there. For cutting a
 * buffer of records this process encoded at a record boundary. */
size_t bg_journal_record_span(const char *data, size_t len);
/* Decode the record at data: 0 (*used bytes, rec points into data),
 * BG_TORN or BG_CORRUPT. */
int bg_journal_decode(const char *data, size_t len, struct bg_journal_record *rec, size_t *used);

/* Where a segment stops being readable, and what is wrong there. */
enum bg_journal_damage {
    BG_DAMAGE_NONE = 0,
    BG_DAMAGE_NO_HEADER,       /* shorter than a header, or a zero header: never written */
    BG_DAMAGE_BAD_HEADER,      /* a header that is not a beangate segment's */
    BG_DAMAGE_OTHER_VERSION,   /* our magic, another format version: not damage */
    BG_DAMAGE_TRUNCATED,       /* a record runs past the end of the data */
    BG_DAMAGE_CHECKSUM,        /* a believable frame whose checksum fails */
    BG_DAMAGE_BAD_RECORD,      /* the checksum matches, the fields are impossible */
    BG_DAMAGE_BAD_FRAME,       /* a length and type no record can have */
};

/* What follows the point where reading a segment stopped. */
struct bg_journal_tail {
    enum bg_journal_damage damage;
    size_t offset;             /* where reading stopped (0: the header) */
    size_t dropped_bytes;      /* from offset to the end of the data */
    uint64_t readable;         /* complete, valid records found after it */
    uint64_t readable_bytes;   /* bytes those records take */
    uint64_t readable_by_type[BG_REC_SNAPSHOT_END + 1];
    int search_complete;       /* 0: the search gave up (budget): more may be readable */
    int unwritten_page;        /* the bytes from offset up to the end of its page
                                * are all zero, and data follows: a page never
                                * written back */
};

/* The header's damage: BG_DAMAGE_NONE for a header of our version. */
enum bg_journal_damage bg_journal_header_damage(const char *data, size_t len);
/* Examine data[offset, len) of a segment whose reading stopped at offset
 * (0: a bad header). Bad records with a believable frame are skipped whole;
 * elsewhere the next valid record is searched byte by byte, checksumming at
 * most `budget` bytes. each(ctx, rec), if not NULL, sees every valid record
 * found after offset. Pure: the data is not changed. */
void bg_journal_examine(const char *data, size_t len, size_t offset, size_t budget,
                        struct bg_journal_tail *t,
                        void (*each)(void *ctx, const struct bg_journal_record *rec), void *ctx);
/* Nonzero if t is a torn tail: an interrupted write can have left it (no
 * header yet, or a bad record) and no valid record follows, or it starts
 * a page never written back (t->unwritten_page). Anything else is
 * damage. Only the newest segment may end in a torn tail. */
int bg_journal_tail_torn(const struct bg_journal_tail *t);
/* "checksum", "truncated", ... for messages. */
const char *bg_journal_damage_name(enum bg_journal_damage d);

/* ---- engine <-> log ----------------------------------------------------- */

/* What the engine tells the log. Set engine->journal to receive it. */
struct bg_journal_ops {
    /* j was put (with_body) or changed state, priority or counters */
    void (*job_saved)(void *ctx, const struct bg_job *j, int with_body);
    void (*job_deleted)(void *ctx, uint64_t id);
    void (*tube_paused)(void *ctx, const struct bg_tube *t);
    /* a reply shows job id (its id, body or state) to a client: raise
     * engine->reply_pos to what its put depends on */
    void (*job_shown)(void *ctx, uint64_t id);
};

/* What is being done (and its reply) depends on log position pos too. */
static inline void bg_engine_depends_on(struct bg_engine *e, uint64_t pos)
{
    if (pos > e->reply_pos) e->reply_pos = pos;
}

/* A reply is about to show j (RESERVED, FOUND, a job's JSON, a push
 * delivery): ids and bodies never escape before the put is kept, so the
 * reply depends on the put's log position (raises e->reply_pos). */
static inline void bg_engine_show_job(struct bg_engine *e, const struct bg_job *j)
{
    if (e->journal && e->journal->job_shown) e->journal->job_shown(e->journal_ctx, j->id);
}

/* The log position showing j depends on, apart from what e->reply_pos
 * holds (which keeps its value, raised by it). */
static inline uint64_t bg_engine_job_position(struct bg_engine *e, const struct bg_job *j)
{
    uint64_t before = e->reply_pos;
    e->reply_pos = 0;
    bg_engine_show_job(e, j);
    uint64_t pos = e->reply_pos;
    if (before > pos) e->reply_pos = before;
    return pos;
}

/* Recreate a job from the log (replacing one with the same id), in state
 * ready, delayed (ready at deadline_mono) or buried. 0 or BG_OUT_OF_MEMORY. */
int bg_engine_restore_job(struct bg_engine *e, const struct bg_journal_job *r,
                          bg_time deadline_mono, bg_time created_mono, bg_time now);
/* Apply an update record to an existing job: 0, BG_NOT_FOUND if there is
 * none, or BG_OUT_OF_MEMORY if the update needs the job's side record and
 * there is no memory for it (the job is left as it was). */
int bg_engine_restore_update(struct bg_engine *e, const struct bg_journal_job *r,
                             bg_time deadline_mono, bg_time now);
/* Forget a job (a delete record). */
void bg_engine_restore_delete(struct bg_engine *e, uint64_t id);
/* After the last record: drop tubes that only a pause record made. */
void bg_engine_restore_finish(struct bg_engine *e);
/* Restore a tube's pause (or its end, if unpause_mono has passed); creates
 * the tube, since its jobs may come in later records. */
int bg_engine_restore_pause(struct bg_engine *e, const char *tube, uint32_t pause_s,
                            bg_time unpause_mono, bg_time now);
/* Fill a log view of j (state reserved is logged as ready). */
void bg_journal_job_of(const struct bg_job *j, struct bg_journal_job *out);

/* ---- stats.c: the one stats model -------------------------------------- */

struct bg_stats_job {
    uint64_t id;
    const char *tube;
    const char *state;          /* "ready", "delayed", "reserved", "buried" */
    uint32_t pri;
    uint64_t age_s, delay_s, ttr_s, time_left_s;
    uint32_t reserves, timeouts, releases, buries, kicks;
};

struct bg_stats_tube {
    const char *name;
    uint64_t urgent, ready, reserved, delayed, buried, total_jobs;
    uint64_t using, watching, waiting, cmd_delete, cmd_pause;
    uint64_t pause_s, pause_left_s;
};

/* What the write-ahead log did with one sink (the disk, the stream):
 * batches handed to it, failed, handed again after a failure, and bytes it
 * took. For the JSON stats and /metrics, not beanstalk's stats. */
struct bg_log_sink_counters {
    uint64_t attempts, failures, retries, bytes;
};

/* Facts only the process knows, filled in by the server. */
struct bg_process_info {
    long pid;
    double utime, stime;        /* seconds */
    uint64_t uptime_s;
    const char *instance_id;
    const char *hostname;
    const char *os;
    const char *platform;
    uint64_t binlog_oldest, binlog_current, binlog_migrated, binlog_written;
    uint64_t binlog_max_size;
    uint64_t binlog_torn;       /* torn or corrupt tails dropped at recovery */
    uint64_t binlog_unlink_failures; /* superseded segments whose unlink failed (not ENOENT) */
    /* for the HTTP /stats (the dashboard), not in beanstalk's stats */
    uint64_t gearman_connections; /* open Gearman connections (in `connections` too) */
    int binlog_enabled;         /* -b */
    uint64_t binlog_bytes;      /* bytes in the log's segment files */
    int64_t binlog_sync_age_ms; /* since the log last synced; -1: no log, or -F (never) */
    struct bg_log_sink_counters binlog_disk, binlog_stream;
    /* replication (--replicate), for /metrics */
    int repl_enabled;
    const char *repl_role;      /* "standby", "taking_over", "primary", "lost" */
    int repl_primary;           /* 1 while this node serves as the primary */
    uint64_t repl_applied_seq, repl_published_seq, repl_stream_last_seq;
    uint64_t repl_messages_published, repl_publish_retries, repl_purges;
    uint64_t repl_lease_renewals, repl_lease_failures;
    int64_t repl_lease_age_ms;  /* since the primary last renewed its lease; -1: not primary */
};

void bg_stats_job(const struct bg_engine *e, const struct bg_job *j, bg_time now,
                  struct bg_stats_job *out);
void bg_stats_tube(const struct bg_tube *t, bg_time now, struct bg_stats_tube *out);

/* ---- history.c: the server's last minutes, and each tube's rates -------
 * Pure: the front-end that serves it (the gateway) calls bg_history_sample
 * and bg_history_sweep_tubes from a timer about once a second, with `now`,
 * and on the next loop turn again while bg_history_sweeping. */

#define BG_HISTORY_SAMPLES 900  /* one a second: 15 minutes */
#define BG_HISTORY_SWEEP_S 5    /* seconds between the starts of two sweeps of the tubes */
#define BG_HISTORY_SWEEP_STEP 4096 /* tubes noted in one step of a sweep (one loop turn) */

/* The series, in the order GET /stats/history lists them. The first
 * BG_HISTORY_COUNTERS are counters, kept as how much each grew in the
 * sample's second (a rate per second); the others are gauges, the value
 * read at the sample. */
enum bg_history_series {
    BG_HISTORY_PUT, BG_HISTORY_RESERVE, BG_HISTORY_DELETE,
    BG_HISTORY_READY, BG_HISTORY_RESERVED, BG_HISTORY_DELAYED, BG_HISTORY_BURIED,
    BG_HISTORY_CONNECTIONS,
    BG_HISTORY_SERIES
};
#define BG_HISTORY_COUNTERS 3
/* "put", "reserve", ...: the series' names, indexed by enum bg_history_series. */
extern const char *const bg_history_series_names[BG_HISTORY_SERIES];

/* One reading of every series: counters as their running totals. */
struct bg_history_reading {
    uint64_t v[BG_HISTORY_SERIES];
};

/* A ring of the last BG_HISTORY_SAMPLES seconds (fixed memory, ~58 KB: make
 * it once), and the tube sweeps' start times. Sample s stands for the
 * monotonic second s (now / BG_SECOND) and holds what changed since
 * second s - 1. */
struct bg_history {
    uint64_t second;            /* the newest sample's second (at start: the start's) */
    uint64_t totals[BG_HISTORY_COUNTERS]; /* the counters read at `second` */
    uint32_t newest, count;     /* ring slot of the newest sample; samples held */
    uint32_t sweep;             /* number of the latest tube sweep; 0: none yet */
    uint32_t sweep_left;        /* the tubes of tube_list[0, sweep_left) it has
                                 * still to visit (last first); 0: it is done */
    bg_time sweep_at[4];        /* [s & 3]: when sweep s started, for s = sweep
                                 * and the 3 before (sweep 0: BG_HISTORY_SWEEP_S
                                 * before sweep 1) */
    uint64_t ring[BG_HISTORY_SAMPLES][BG_HISTORY_SERIES];
};

/* Start an empty history at `now`, with `r` read then (the first sample, a
 * second later, shows what changed since). */
void bg_history_init(struct bg_history *h, const struct bg_history_reading *r, bg_time now);
/* Record reading r, taken at `now`: nothing if no new second began since
 * the newest sample; one sample if one did. If several did (the loop was
 * stalled), one sample for each missed second: each counter's growth over
 * the gap is spread evenly over them in whole numbers (the series still
 * sums to what happened), and each gauge is r's value. Returns the samples
 * added (a gap longer than the ring fills it: at most BG_HISTORY_SAMPLES). */
uint32_t bg_history_sample(struct bg_history *h, const struct bg_history_reading *r, bg_time now);
/* Series s, oldest first, into out (room for BG_HISTORY_SAMPLES); returns
 * how many (h->count). */
uint32_t bg_history_series(const struct bg_history *h, enum bg_history_series s, uint64_t *out);
/* The engine's figures as a reading; connections is e's (beanstalk and
 * Gearman) plus other_connections (the gateway's HTTP ones). */
void bg_history_read_engine(const struct bg_engine *e, uint64_t other_connections,
                            struct bg_history_reading *out);

/* One step of a sweep of the tubes, which notes each tube's put and
 * delete counters and the time: start a sweep if none is under way and
 * BG_HISTORY_SWEEP_S seconds began since the last one started (or none
 * was made), then note the next BG_HISTORY_SWEEP_STEP tubes of it at most
 * (the list's last first). Tubes made or freed between steps are handled:
 * every tube alive at a sweep's start is noted once by it. About 30 ns a
 * tube at 10^6 tubes, 0.2 ms a step (docs/performance.md, "The server's
 * history").
 * The first sweep notes a tube as if it had not changed in the
 * BG_HISTORY_SWEEP_S seconds before. Returns 1 if it took a step, else 0. */
int bg_history_sweep_tubes(struct bg_history *h, struct bg_engine *e, bg_time now);
/* Nonzero while a sweep is under way: call bg_history_sweep_tubes again. */
int bg_history_sweeping(const struct bg_history *h);
/* Tube t's puts and deletes per second from the moment the sweep before
 * the latest that noted it did (to the microsecond) to now: exact over that
 * window, which is about 5 to 10 seconds (a tube is noted once a sweep, and
 * sweeps start BG_HISTORY_SWEEP_S apart; longer if the loop stalled). A
 * tube no sweep has noted yet was made after the sweep before the latest
 * started, and counts from there from 0. 0 and 0 before the first sweep,
 * and for a tube the first sweep has not noted yet. */
void bg_tube_rates(const struct bg_history *h, const struct bg_tube *t, bg_time now,
                   double *put, double *del);

/* ---- codec.c: the beanstalk wire protocol ------------------------------- */

/* Commands, in the order of the reference's stats keys where counted. */
enum bg_cmd {
    BG_CMD_PUT, BG_CMD_PEEK, BG_CMD_PEEK_READY, BG_CMD_PEEK_DELAYED,
    BG_CMD_PEEK_BURIED, BG_CMD_RESERVE, BG_CMD_RESERVE_WITH_TIMEOUT,
    BG_CMD_DELETE, BG_CMD_RELEASE, BG_CMD_USE, BG_CMD_WATCH, BG_CMD_IGNORE,
    BG_CMD_BURY, BG_CMD_KICK, BG_CMD_TOUCH, BG_CMD_STATS, BG_CMD_STATS_JOB,
    BG_CMD_STATS_TUBE, BG_CMD_LIST_TUBES, BG_CMD_LIST_TUBE_USED,
    BG_CMD_LIST_TUBES_WATCHED, BG_CMD_PAUSE_TUBE,
    /* not shown in stats */
    BG_CMD_RESERVE_JOB, BG_CMD_KICK_JOB, BG_CMD_QUIT,
    BG_CMD_COUNT
};

/* The beanstalk name of each command, indexed by enum bg_cmd; the stats
 * keys (YAML cmd-put, JSON cmd_put, metrics command="put") come from it.
 * BG_CMD_STATS_SHOWN of them appear in `stats`. */
extern const char *const bg_cmd_names[BG_CMD_COUNT];
#define BG_CMD_STATS_SHOWN BG_CMD_RESERVE_JOB

/* Count n requests for command cmd in the cmd-* counters. The one place
 * every front-end counts (beanstalk, HTTP, Gearman), by the rule in
 * docs/operations.md ("Command counters"). */
void bg_count_cmd(struct bg_engine *e, enum bg_cmd cmd, uint64_t n);

enum bg_session_state {
    BG_WANT_COMMAND,   /* reading a command line (or blocked in reserve) */
    BG_WANT_BODY,      /* reading a put body into in_job */
    BG_SKIP_BYTES,     /* discarding a too-big body, then replying */
    BG_WANT_ENDLINE,   /* discarding the rest of an over-long line */
};

struct bg_session;

/* What the server gives a session besides its stream. */
struct bg_session_io {
    /* Fill in process facts for `stats`. */
    void (*process_info)(struct bg_session *s, struct bg_process_info *out);
    /* The session closes on a line of HTTP (bg_line_is_http); may be NULL. */
    void (*cross_protocol)(struct bg_session *s);
};

/* One beanstalk TCP connection as the codec sees it. A reserve that waits
 * sets stream.blocked until its answer is in stream.out; quit (or a reply
 * that cannot be appended) sets stream.closing. */
struct bg_session {
    struct bg_stream stream;    /* first: the connection layer's view */
    struct bg_client client;
    const struct bg_session_io *io;
    void *io_owner;
    uint8_t state;              /* enum bg_session_state */
    struct bg_job *in_job;      /* put body being read */
    uint32_t in_job_read;
    uint64_t skip_left;         /* BG_SKIP_BYTES: bytes still to discard */
    int skip_reply;             /* outcome to answer after skipping */
    /* What the session may do (core/scope.c); NULL: unscoped, the
     * reference's behaviour. Set by the front-end after bg_session_init. */
    const struct bg_scope *scope;
};

/* Attach a session to the engine (its stream zeroed). 0 or BG_OUT_OF_MEMORY. */
int bg_session_init(struct bg_engine *e, struct bg_session *s,
                    const struct bg_session_io *io, void *io_owner);
/* Release everything the session holds (reservations go back to ready). */
void bg_session_close(struct bg_session *s, bg_time now);
/* Execute every complete command in in[0..len); replies go to stream.out.
 * Returns the number of bytes consumed; stops early when the session
 * blocks, closes or its output reaches stream.out_limit. */
size_t bg_session_feed(struct bg_session *s, const char *in, size_t len, bg_time now);
/* The peer half-closed while the session waits: answer TIMED_OUT, or
 * whatever its wait's end was if that had passed by `now`. */
void bg_session_peer_eof(struct bg_session *s, bg_time now);

/* Render stats as the reference's YAML into out (the "OK n" line included). */
int bg_render_stats(struct bg_buf *out, const struct bg_engine *e,
                    const struct bg_process_info *pi);
int bg_render_stats_tube(struct bg_buf *out, const struct bg_stats_tube *st);
int bg_render_stats_job(struct bg_buf *out, const struct bg_stats_job *sj);

#endif

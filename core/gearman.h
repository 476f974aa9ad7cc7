/* gearman.h - the Gearman protocol's wire format, pure (no I/O).
 *
 * Binary packets: a 12-byte header ("\0REQ" or "\0RES", type and size as
 * big-endian u32) and `size` bytes of arguments separated by NUL; the last
 * argument (the data) runs to the end and may hold NULs. Text admin lines
 * ("status\n") share the port: a first byte that is not NUL starts one.
 *
 * Results follow core.h: 0 or a positive count on success, BG_BAD_FORMAT
 * for malformed input, with what is wrong (enum gm_fault) in the packet or
 * line. gearman_session.c (below) runs the protocol on the
 * engine; server/gearman.c plugs it into the connection layer.
 */
#ifndef BEANGATE_GEARMAN_H
#define BEANGATE_GEARMAN_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define GM_HEADER_SIZE 12
#define GM_ARGS_MAX 8                  /* no packet type has more */
#define GM_FUNCTION_MAX 512            /* gearmand's GEARMAN_FUNCTION_MAX_SIZE */
#define GM_UNIQUE_MAX 64               /* gearmand's GEARMAN_MAX_UNIQUE_SIZE */
#define GM_HANDLE_MAX 64               /* job handle */
#define GM_CLIENT_ID_MAX 64            /* SET_CLIENT_ID */
#define GM_OPTION_MAX 64               /* OPTION_REQ name */
#define GM_ADMIN_LINE_MAX 4096         /* a text admin line incl. "\n" */

/* Packet types (gearman.org protocol document numbering). */
enum gm_type {
    GM_CAN_DO = 1, GM_CANT_DO = 2, GM_RESET_ABILITIES = 3, GM_PRE_SLEEP = 4,
    GM_NOOP = 6, GM_SUBMIT_JOB = 7, GM_JOB_CREATED = 8, GM_GRAB_JOB = 9,
    GM_NO_JOB = 10, GM_JOB_ASSIGN = 11, GM_WORK_STATUS = 12,
    GM_WORK_COMPLETE = 13, GM_WORK_FAIL = 14, GM_GET_STATUS = 15,
    GM_ECHO_REQ = 16, GM_ECHO_RES = 17, GM_SUBMIT_JOB_BG = 18, GM_ERROR = 19,
    GM_STATUS_RES = 20, GM_SUBMIT_JOB_HIGH = 21, GM_SET_CLIENT_ID = 22,
    GM_CAN_DO_TIMEOUT = 23, GM_ALL_YOURS = 24, GM_WORK_EXCEPTION = 25,
    GM_OPTION_REQ = 26, GM_OPTION_RES = 27, GM_WORK_DATA = 28,
    GM_WORK_WARNING = 29, GM_GRAB_JOB_UNIQ = 30, GM_JOB_ASSIGN_UNIQ = 31,
    GM_SUBMIT_JOB_HIGH_BG = 32, GM_SUBMIT_JOB_LOW = 33,
    GM_SUBMIT_JOB_LOW_BG = 34, GM_SUBMIT_JOB_SCHED = 35,
    GM_SUBMIT_JOB_EPOCH = 36, GM_SUBMIT_REDUCE_JOB = 37,
    GM_SUBMIT_REDUCE_JOB_BACKGROUND = 38, GM_GRAB_JOB_ALL = 39,
    GM_JOB_ASSIGN_ALL = 40, GM_GET_STATUS_UNIQUE = 41,
    GM_STATUS_RES_UNIQUE = 42,
    GM_TYPE_LAST = 42
};

/* What is wrong with malformed input: the detail of a BG_BAD_FORMAT, for
 * the ERROR packet's code (gm_error_text). */
enum gm_fault {
    GM_FAULT_NONE = 0,
    GM_FAULT_MAGIC,       /* first four bytes are not "\0REQ" */
    GM_FAULT_TYPE,        /* type is 0, unknown, or not a request */
    GM_FAULT_ARGS,        /* fewer NUL separators than the type needs; an
                           * admin line with too many words */
    GM_FAULT_TOO_BIG,     /* size over the limit given to the parser; an
                           * admin line over GM_ADMIN_LINE_MAX */
    GM_FAULT_FIELD,       /* an argument is over its own limit (function,
                           * unique, handle, client id, option) */
};

/* One parsed packet. Arguments point into the parsed buffer (not copied);
 * arg[nargs-1] is the data argument when the type has one. */
struct gm_packet {
    uint32_t type;                 /* enum gm_type */
    uint32_t size;                 /* bytes after the header */
    uint32_t nargs;                /* arguments this type carries */
    const char *arg[GM_ARGS_MAX];
    uint32_t arg_len[GM_ARGS_MAX];
    uint8_t fault;                 /* enum gm_fault, with BG_BAD_FORMAT */
};

/* The name of packet type t ("SUBMIT_JOB"), or NULL if there is none. */
const char *gm_type_name(uint32_t t);
/* The beanstalk command (enum bg_cmd) a request of type t performs, for the
 * cmd-* counters (docs/operations.md, "Command counters"), or -1 if none:
 * SUBMIT_JOB* put, GRAB_JOB* reserve-with-timeout, WORK_COMPLETE, WORK_FAIL
 * and WORK_EXCEPTION delete, CAN_DO* watch, CANT_DO ignore, GET_STATUS*
 * stats-job. */
int gm_request_command(uint32_t t);
/* The same for an admin line's command: `cancel job` is a delete. */
int gm_admin_command(int cmd);
/* Number of arguments request type t carries (the data counts as one), or
 * BG_BAD_FORMAT if t is not a request a server accepts.
 * SUBMIT_REDUCE_JOB and SUBMIT_REDUCE_JOB_BACKGROUND carry 5 (function,
 * unique, reducer, aggregator, data), as gearmand reads them: it waits for
 * a fourth NUL. */
int gm_request_nargs(uint32_t t);

/* Parse one request packet at data[0..len). Returns the bytes it used (> 0)
 * and fills *p; 0 when more bytes are needed; or BG_BAD_FORMAT with
 * p->fault saying why (the connection is then answered ERROR and closed).
 * max_size bounds the packet's size field; GM_FAULT_TOO_BIG is reported
 * from the header alone. Nothing is reported before the 12-byte header is
 * there; GM_FAULT_MAGIC, _TYPE and _TOO_BIG come from the header alone,
 * GM_FAULT_ARGS and _FIELD once the whole packet is there. On every error p->type and
 * p->size hold the header's fields as sent (gearmand answers ERROR and keeps
 * the connection for "\0RES" magic, a response type and a unique id that
 * is too long: a server that wants that can skip GM_HEADER_SIZE + size).
 * A type with n arguments needs n-1 NULs; the last argument is the rest of
 * the packet and may hold NULs (also for CAN_DO, GET_STATUS, ...). A type
 * without arguments ignores any body (gearmand does too). Sizes above
 * INT32_MAX - 12 are GM_FAULT_TOO_BIG whatever max_size says. */
int gm_parse_request(const char *data, size_t len, uint32_t max_size,
                     struct gm_packet *p);

/* Append a "\0RES" packet of type t with n arguments (lengths len[i];
 * NUL-separated, the last one as is). 0 or BG_OUT_OF_MEMORY. */
int gm_encode_response(struct bg_buf *out, uint32_t t, uint32_t n,
                       const char *const *arg, const uint32_t *len);
/* The same for a "\0REQ" packet (tests and the benchmark use it). */
int gm_encode_request(struct bg_buf *out, uint32_t t, uint32_t n,
                      const char *const *arg, const uint32_t *len);

/* The ERROR packet's code and text for fault f (gearmand's words where it
 * has them). */
void gm_error_text(int fault, const char **code, const char **text);

/* ---- text admin protocol ------------------------------------------------ */

enum gm_admin_cmd {
    GM_ADMIN_STATUS, GM_ADMIN_WORKERS, GM_ADMIN_VERSION, GM_ADMIN_MAXQUEUE,
    GM_ADMIN_SHUTDOWN, GM_ADMIN_GETPID, GM_ADMIN_SHOW_JOBS,
    GM_ADMIN_SHOW_UNIQUE_JOBS, GM_ADMIN_VERBOSE, GM_ADMIN_CANCEL_JOB,
    GM_ADMIN_UNKNOWN
};

#define GM_ADMIN_ARGS_MAX 4
struct gm_admin_line {
    int cmd;                       /* enum gm_admin_cmd */
    uint32_t nargs;                /* words after the command word(s) */
    const char *arg[GM_ADMIN_ARGS_MAX];
    uint32_t arg_len[GM_ADMIN_ARGS_MAX];
    const char *word;              /* the first word, as sent */
    uint32_t word_len;
    uint8_t fault;                 /* enum gm_fault, with BG_BAD_FORMAT */
};

/* Find one admin line at data[0..len): returns the bytes it used including
 * the "\n" (a "\r" before it is dropped), 0 if no "\n" yet, or
 * BG_BAD_FORMAT with line->fault GM_FAULT_TOO_BIG once GM_ADMIN_LINE_MAX
 * bytes hold no "\n". Fills *line: the command and
 * its space-separated words (pointing into data).
 *
 * Words split as gearmand splits them: only ' ' separates, runs of spaces
 * count as one, but a leading space makes an empty first word and trailing
 * spaces an empty last word ("show jobs " is three words, "   " two empty
 * ones, "" one). A "\r" elsewhere or a tab is part of a word. Command words
 * match in any case ("SHOW Jobs"). More than 1 + GM_ADMIN_ARGS_MAX words:
 * BG_BAD_FORMAT, fault GM_FAULT_ARGS (gearmand closes the connection
 * without a reply).
 *
 * arg[] holds the words after the command's words, whatever the command
 * (gearmand ignores them for status, workers, version, getpid, verbose).
 * What gearmand 1.1.20 answers that the parse leaves to the server:
 *   "show" alone                 UNKNOWN, word "show", nargs 0:
 *                                "ERR UNKNOWN_COMMAND Unknown+server+commandshow\r\n"
 *   "show <not jobs> ..."        UNKNOWN, word "show", nargs > 0, and
 *   SHOW_JOBS / SHOW_UNIQUE_JOBS with nargs > 0 (also "show jobs "):
 *                                "ERR UNKNOWN_SHOW_ARGUMENTS\r\n"
 *   "cancel", "cancel x", and CANCEL_JOB with nargs 0:
 *                                "ERR UNKNOWN_COMMAND Unknown+server+commandcancel\r\n"
 *   "cancel x y" (UNKNOWN, word "cancel", nargs >= 2), CANCEL_JOB with
 *   nargs > 1:                   "ERR UNKNOWN_ERROR\r\n"
 *   "shutdown x" (x not "graceful"): "ERR UNKNOWN_COMMAND ...shutdown\r\n"
 *   "maxqueue" alone: "ERR INVALID_ARGUMENTS An+incomplete+set+of+arguments+
 *                      was+sent+to+this+command+maxqueue\r\n"
 *   any other UNKNOWN (also ""): "ERR UNKNOWN_COMMAND Unknown+server+command"
 *                      followed by the word as sent, "\r\n". */
int gm_admin_parse(const char *data, size_t len, struct gm_admin_line *line);

/* ---- function names and tubes ------------------------------------------ */

/* Encode Gearman function name fn[0..len) as a tube name in out (NUL
 * terminated). A name that is a valid tube name and holds no '$' is kept;
 * otherwise every byte that may not appear in a tube name, every '$', and
 * a leading '-' become "$XX" (two upper-case hex digits). Returns the tube
 * name's length, or BG_BAD_FORMAT if it would be longer than BG_TUBE_NAME_MAX
 * or fn is empty. */
int gm_function_to_tube(const char *fn, size_t len, char out[BG_TUBE_NAME_MAX + 1]);
/* The inverse: decode tube name `tube` (NUL terminated) into out (room for
 * out_cap bytes) and NUL-terminate it (the name itself may hold NULs).
 * Returns the function name's length, or BG_BAD_FORMAT if it and the NUL do not
 * fit (BG_TUBE_NAME_MAX + 1 bytes always do). A '$' not followed by two hex
 * digits (either case) is kept as is. */
int gm_tube_to_function(const char *tube, char *out, size_t out_cap);

/* ---- gearman_session.c: the protocol on the engine ---------------------- *
 *
 * A function is a tube (function names that are not tube names are encoded,
 * above). A submitted job is a beanstalk job in that tube; a worker is an
 * engine client that watches the tubes of its abilities. What gearmand keeps
 * beside the queue (foreground listeners, unique ids, WORK_STATUS numbers)
 * lives in a table of records by job id, only for the jobs that need one.
 * Sessions append replies to their own stream, results to their
 * listeners' streams (waking them), and change the engine only through its
 * functions. Pure: the time and the process facts come in from outside. */

#define GM_FUNCTIONS_MAX 65536         /* functions listed by `status` */
#define GM_ABILITIES_MAX 4096          /* CAN_DO per worker */
#define GM_SUBMIT_TTR 86400            /* a job's TTR unless CAN_DO_TIMEOUT says */
#define GM_PEER_MAX 46                 /* an IPv6 address as text */

struct gm_session;
struct gm_record;
struct gm_function;

/* How the admin `shutdown` stops the server. */
enum gm_stop {
    GM_STOP_NOW,                   /* `shutdown`: stop at once */
    GM_STOP_GRACEFUL,              /* `shutdown graceful`: take no new jobs or
                                    * connections; gm_server_sweep says when
                                    * no worker holds a job any more */
};

/* What only the process knows, and what only it can do. */
struct gm_hooks {
    void *ctx;                     /* every hook's first argument */
    long pid;                      /* the admin `getpid` */
    const char *hostname;          /* job handles are "H:<hostname>:<id>" */
    /* The admin `verbose` answer: "DEBUG", "INFO" or "WARNING". */
    const char *(*verbosity)(void *ctx);
    /* Wall-clock seconds since the epoch (SUBMIT_JOB_EPOCH). */
    uint64_t (*wall_s)(void *ctx);
    /* The admin `shutdown` was accepted. */
    void (*stop)(void *ctx, enum gm_stop how);
    /* A malformed request was answered with ERROR `code` (for a log line;
     * NULL: nothing). */
    void (*bad_request)(void *ctx, const struct gm_session *s, const char *code);
    /* The session closes on a line of HTTP (bg_line_is_http); NULL: nothing. */
    void (*cross_protocol)(void *ctx, const struct gm_session *s);
};

/* A hash table of records, chained through one of their next pointers. */
struct gm_table {
    struct gm_record **slot;
    size_t mask, count;
};

/* Every Gearman session of one engine, and what they share. */
struct gm_server {
    struct bg_engine *engine;
    struct gm_hooks hooks;
    uint64_t hash_key[2];          /* the keyed hash of the unique and function tables */
    struct gm_session *sessions;   /* every session, newest first */
    struct gm_session *sleepers;   /* workers after PRE_SLEEP, not yet woken */
    struct bg_client holder;       /* deletes jobs whose clients all left */
    struct gm_table by_id, by_unique;
    struct gm_function **functions; /* hash of gm_function by tube */
    size_t functions_mask, function_count;
    struct gm_function *function_list; /* newest first */
    uint32_t max_packet;           /* largest request size accepted */
    size_t sweep_cursor;           /* next record bucket the sweep looks at */
    uint8_t graceful;              /* `shutdown graceful` was accepted */
    uint8_t admin_shutdown;        /* `shutdown` is a command (else unknown) */
};

/* A worker ability: the tube of a CAN_DO, and its CAN_DO_TIMEOUT. */
struct gm_ability {
    char tube[BG_TUBE_NAME_MAX + 1];
    struct bg_tube *tube_ptr;      /* the tube, alive while the worker watches it */
    uint32_t timeout_s;
};

/* One Gearman connection as the protocol sees it. */
struct gm_session {
    struct bg_stream stream;       /* first: the connection layer's view */
    struct gm_server *g;
    struct gm_session *prev, *next; /* g->sessions */
    struct gm_session *sleep_prev, *sleep_next; /* g->sleepers, while sleeping */
    struct bg_client client;       /* the engine's view: bare, watches abilities */
    struct gm_ability *abilities;
    uint32_t ability_count, ability_cap;
    uint64_t *listening;           /* ids of the records this client listens to */
    uint32_t listening_count, listening_cap;
    int peer_fd;                   /* shown by `workers` */
    char peer[GM_PEER_MAX];
    char client_id[GM_CLIENT_ID_MAX + 1];
    uint8_t sleeping, exceptions;
    /* What the session may do (core/scope.c); NULL: unscoped, gearmand's
     * behaviour. Set by the front-end after gm_session_init. */
    const struct bg_scope *scope;
};

/* Set up g on engine e: requests up to max_packet bytes, `shutdown` a
 * command if admin_shutdown, tables hashed under hash_key (random, chosen at
 * start). Sets the engine's job_ready hook. 0 or BG_OUT_OF_MEMORY. */
int gm_server_init(struct gm_server *g, struct bg_engine *e, const struct gm_hooks *hooks,
                   uint32_t max_packet, int admin_shutdown, const uint64_t hash_key[2]);
/* Free what g holds (every session must be closed), unset the hook. */
void gm_server_destroy(struct gm_server *g, bg_time now);
/* One bounded step of the sweep (call it every 100 ms or so): look at the
 * next `budget` record buckets, fail foreground jobs that ended outside
 * Gearman (a beanstalk or HTTP delete) and drop records of jobs that are
 * gone. Returns 1 when a graceful shutdown is due (no session holds a
 * job), else 0. */
int gm_server_sweep(struct gm_server *g, size_t budget);

/* Attach a new session (memory zeroed by the caller, or not: it is
 * cleared) of the peer shown as fd / addr. 0 or BG_OUT_OF_MEMORY. */
int gm_session_init(struct gm_server *g, struct gm_session *s, int peer_fd, const char *peer_addr);
/* Execute every complete request or admin line in in[0..len) until the
 * output reaches stream.out_limit or the session closes: the bytes
 * consumed. */
size_t gm_session_feed(struct gm_session *s, const char *in, size_t len, bg_time now);
/* The connection is about to be closed for a limit of the server (a
 * request deadline, idle time): append an ERROR packet with code and text
 * (both NUL-terminated) as the session's last word, and close it. */
void gm_session_refuse(struct gm_session *s, const char *code, const char *text);
/* Detach: stop listening (a foreground job nobody waits for goes unless a
 * worker runs it), give reserved jobs back, free what s holds. */
void gm_session_close(struct gm_session *s, bg_time now);

#endif

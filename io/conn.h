/* conn.h - the connection layer: every byte-stream protocol (beanstalk,
 * Gearman) is served by it. It accepts (within the connection limits, and
 * backing off at the open-file limit), reads (one read() per readable event,
 * into one loop-wide buffer), feeds the bytes to the protocol's session,
 * writes all replies of a batch with one write(), applies back-pressure and
 * the per-connection limits (bytes each way, a request deadline, idle
 * time), runs sessions that got output from elsewhere (the loop's deferred
 * tasks), holds replies until the write-ahead log has them on disk (-f 0),
 * and counts connections in the engine's stats. A protocol brings a pure
 * session (core/) and plugs it in with a struct conn_protocol; nothing else
 * touches its sockets. A listener may be TLS (conn_server_start_tls): the
 * same, after a handshake, over GnuTLS records (io/tls.h).
 *
 * Memory: a connection keeps no buffer while it has nothing pending. Reads
 * go to one loop-wide buffer and are fed from there; only the unconsumed
 * tail (half a line, half a packet) is copied into the connection's own
 * input buffer. Replies are built in one loop-wide buffer too, and only
 * what the socket does not take at once is copied into the connection's
 * own output buffer. Both are freed once empty.
 */
#ifndef BEANGATE_CONN_H
#define BEANGATE_CONN_H

#include <netinet/in.h>

#include "../core/core.h"
#include "tls.h"
#include "wal.h"

#define CONN_READ_CHUNK 65536          /* the loop-wide read buffer: bytes per read() */
#define CONN_ACCEPT_BATCH 64           /* connections accepted per wake-up */

/* Who is on the other end, for a session that shows it (Gearman's
 * `workers`): the connection's fd number and the peer's address ("-" for
 * a UNIX socket). */
struct conn_peer {
    int fd;
    char addr[INET6_ADDRSTRLEN];
    uint16_t port;             /* the peer's port; 0 for a UNIX socket */
    /* The verified client certificate's names (io/tls.h), on a TLS
     * listener with a CA; NULL: plain TCP, or no client certificate. The
     * session maps it to a scope (core/scope.c) in open(). */
    const struct tls_identity *identity;
    int tls;                   /* 1 on a TLS listener (with or without a certificate) */
};

/* What a protocol allows one connection (docs/operations.md, "Limits"). */
struct conn_limits {
    size_t in_max;             /* reading pauses while this much input is unconsumed */
    size_t out_limit;          /* the stream's out_limit: feeding and reading pause */
    size_t out_max;            /* the stream's out_max (0: none): output others append
                                * past it drops the connection */
    bg_time request_timeout;   /* a request line, header or packet header must be in
                                * within this of its first byte, and a body must keep
                                * coming (no gap this long); 0: no deadline */
    bg_time idle_timeout;      /* closed after this long without a byte either way,
                                * unless the session waits for the server (a blocked
                                * reserve); 0: never */
};

/* Why the layer refused a connection or closed one itself. */
enum conn_reason {
    CONN_MAX_CONNECTIONS,      /* refused: --max-connections reached */
    CONN_MAX_PER_IP,           /* refused: --max-connections-per-ip reached */
    CONN_REQUEST_TIMEOUT,      /* closed: a request not complete in time */
    CONN_IDLE_TIMEOUT,         /* closed: idle for --idle-timeout */
    CONN_OUTPUT_LIMIT,         /* closed: output others appended passed out_max */
    CONN_REASON_COUNT
};
/* "max_connections", "request_timeout", ...: the log's and the metrics' name. */
const char *conn_reason_name(enum conn_reason r);

/* What every listener of the process shares: they draw on one budget of
 * descriptors. */
struct conn_config {
    uint64_t max_connections;  /* beanstalk and Gearman connections at once; 0: no limit */
    uint64_t max_per_ip;       /* of them from one client address (UNIX peers exempt); 0: no limit */
    uint64_t max_reply_memory; /* the budget of replies held unsent, all connections (bg_reply_budget) */
    uint64_t hash_key[2];      /* the keyed hash of the per-address table (random) */
};
/* Set the shared limits (before the first conn_server_start). */
void conn_configure(const struct conn_config *cfg);

/* The layer's counters since the start, every listener together. */
struct conn_counters {
    uint64_t open;                         /* connections open now */
    uint64_t closed[CONN_REASON_COUNT];    /* refused or closed, by reason */
    uint64_t accept_paused;                /* times accepting paused at the open-file limit */
    uint64_t reply_memory;                 /* bytes of replies held unsent now */
    uint64_t replies_refused;              /* large replies refused for --max-reply-memory */
};
void conn_get_counters(struct conn_counters *out);

/* One protocol's session, as the connection layer drives it. The session
 * is session_size bytes and starts with its struct bg_stream. */
struct conn_protocol {
    const char *name;          /* "beanstalk", "gearman" */
    const char *event_prefix;  /* before "accepted"/"dropped" in log events ("", "gearman_") */
    size_t session_size;
    struct conn_limits limits;
    void *ctx;                 /* open's first argument */
    /* Set up the session of a new connection (its memory is zeroed); the
     * layer sets the stream's limits, hook and owner afterwards. 0, or an
     * outcome: the connection is then closed at once. */
    int (*open)(void *ctx, struct bg_stream *s, const struct conn_peer *peer, bg_time now);
    /* Execute what is complete in in[0..len): the bytes consumed. Called
     * while the stream is neither blocked nor closing. */
    size_t (*feed)(struct bg_stream *s, const char *in, size_t len, bg_time now);
    /* The peer half-closed while the stream is blocked (NULL: nothing to
     * do): answer now, so that the stream is no longer blocked. */
    void (*peer_eof)(struct bg_stream *s, bg_time now);
    /* Release everything the session holds. */
    void (*close)(struct bg_stream *s, bg_time now);
    /* Nonzero while the session waits for the server on its peer's behalf
     * besides a blocked stream (reservations held, a sleeping worker, a
     * result awaited): such a connection is never idle. NULL: never. */
    int (*waiting)(const struct bg_stream *s);
    /* The layer is about to close the connection for `why`: append a last
     * word if the protocol has one (NULL: closed without one). */
    void (*limit_hit)(struct bg_stream *s, enum conn_reason why, bg_time now);
};

/* One listening socket and the connections accepted from it. */
struct conn_server;

/* Serve protocol p (which must outlive the server) on the listening socket
 * fd, over engine e (connection counts), holding replies for log w (NULL:
 * no log). *out is set. 0 or BG_OUT_OF_MEMORY. */
int conn_server_start(struct conn_server **out, const struct conn_protocol *p, int fd,
                      struct bg_engine *e, struct wal *w);
/* The TLS handshake's deadline when the protocol has no request deadline. */
#define CONN_TLS_HANDSHAKE_TIMEOUT (10 * BG_SECOND)
/* As conn_server_start, over TLS with tls's credentials (NULL: plain TCP;
 * tls must outlive the server). Each connection's handshake comes before
 * the protocol's open() (which gets the client certificate's names in
 * peer->identity) and must be done within the request deadline (or
 * CONN_TLS_HANDSHAKE_TIMEOUT); a first byte that does not begin a TLS
 * handshake record closes the connection at once (event tls_refused). */
int conn_server_start_tls(struct conn_server **out, const struct conn_protocol *p, int fd,
                          struct bg_engine *e, struct wal *w, struct tls_listener *tls);
/* List the session's client c in GET /clients (core/clients.c) as a
 * client of protocol p at peer, closed by close_now (which finds c's
 * stream and calls conn_close_stream). Out of memory it is not listed. */
void conn_list_client(struct bg_client *c, enum bg_client_protocol p, const struct conn_peer *peer,
                      void (*close_now)(struct bg_client *c, bg_time now), bg_time now);
/* Set peer's addr and port from sa (AF_INET or AF_INET6; NULL or another
 * family, a UNIX socket's: "-" and port 0). */
void conn_peer_address(struct conn_peer *peer, const struct sockaddr *sa);
/* Close s's connection now, as its peer's hang-up would (DELETE
 * /clients/{id}): the session is closed (reservations go back to ready)
 * and nothing more is written. Not from inside s's own callbacks. */
void conn_close_stream(struct bg_stream *s);
/* Stop accepting new connections (the listener stays open). */
void conn_server_pause(struct conn_server *cs);
/* The listening socket. */
int conn_server_fd(const struct conn_server *cs);
/* How many connections are open. */
uint64_t conn_server_count(const struct conn_server *cs);
/* The stop sequence's first step (server/main.c): no more accepts, no more
 * reads; every blocked session is answered as at its peer's end of
 * stream. NULL: nothing. */
void conn_server_stop_reading(struct conn_server *cs);
/* The stop sequence's last step, after the log was finished: write each
 * connection's output whose log position the log keeps (wal_reply_may_go),
 * waiting for slow sockets at most until deadline (loop_now's clock); the
 * rest is never sent. Close every connection and the listening socket;
 * free cs. NULL: nothing. */
void conn_server_stop(struct conn_server *cs, bg_time deadline);

#endif

/* conn.h - the connection layer: every byte-stream protocol (beanstalk,
 * Gearman) is served by it. It accepts, reads (one read() per readable
 * event), feeds the bytes to the protocol's session, writes all replies of
 * a batch with one write(), applies back-pressure, runs sessions that got
 * output from elsewhere (the loop's deferred tasks), holds replies until
 * the write-ahead log has them on disk (-f 0), and counts connections in
 * the engine's stats. A protocol brings a pure session (core/) and plugs
 * it in with a struct conn_protocol; nothing else touches its sockets.
 */
#ifndef BEANGATE_CONN_H
#define BEANGATE_CONN_H

#include <netinet/in.h>

#include "../core/core.h"
#include "wal.h"

#define CONN_READ_CHUNK 65536          /* bytes read per read() */
#define CONN_OUT_HIGH_WATER (4u << 20) /* stop feeding and reading while more is unsent */
#define CONN_ACCEPT_BATCH 64           /* connections accepted per wake-up */

/* Who is on the other end, for a session that shows it (Gearman's
 * `workers`): the connection's fd number and the peer's address ("-" for
 * a UNIX socket). */
struct conn_peer {
    int fd;
    char addr[INET6_ADDRSTRLEN];
};

/* What a protocol allows one connection. The place for every per-connection
 * limit of a protocol (issue 13 adds bytes per direction, a line deadline,
 * idle time and per-address caps here). */
struct conn_limits {
    size_t read_chunk;         /* bytes per read() */
    size_t in_limit;           /* reading pauses while this much input is unconsumed */
    size_t out_limit;          /* the stream's out_limit: feeding and reading pause */
    size_t out_max;            /* the stream's out_max (0: none): past it, dropped */
};

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
};

/* One listening socket and the connections accepted from it. */
struct conn_server;

/* Serve protocol p (which must outlive the server) on the listening socket
 * fd, over engine e (connection counts), holding replies for log w (NULL:
 * no log). *out is set. 0 or BG_OUT_OF_MEMORY. */
int conn_server_start(struct conn_server **out, const struct conn_protocol *p, int fd,
                      struct bg_engine *e, struct wal *w);
/* Stop accepting new connections (the listener stays open). */
void conn_server_pause(struct conn_server *cs);
/* The listening socket. */
int conn_server_fd(const struct conn_server *cs);
/* How many connections are open. */
uint64_t conn_server_count(const struct conn_server *cs);
/* Stop: no more accepts; answer every blocked session as at the peer's
 * end of stream; write what goes out without waiting (not replies held
 * for the log); close every connection and the listening socket; free cs.
 * NULL: nothing. */
void conn_server_stop(struct conn_server *cs);

#endif

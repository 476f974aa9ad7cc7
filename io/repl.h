/* repl.h - replication of the log through NATS JetStream (high
 * availability, docs/scaling.md "High availability"): a sink of the log's
 * batches, the leadership lease, and the standby's feed of the stream.
 *
 * The primary publishes each batch of log records (core/journal.c's
 * records, no segment header) to the stream's subject: one message, or a
 * few when the batch is larger than the messages NATS takes. Every publish
 * carries the stream sequence the publisher last saw (expected last
 * sequence), so a primary that lost its place cannot append: the stream
 * refuses, and the primary stops. Leadership is a key in a JetStream
 * key-value bucket whose entries expire after the lease time: the primary
 * renews it; a standby creates it once it has expired, applies the stream
 * to its end, and appends an empty takeover message, which fences the old
 * primary. A node that learns it cannot write (its append refused, its
 * lease held by another, cut off from NATS for a lease time, a takeover
 * without progress) posts `lost` and never renews or takes the lease again;
 * the server exits 75 and a supervisor starts it again as a standby
 * (docs/scaling.md, "The fault model").
 *
 * Threads: the log's flusher calls repl_append and repl_purge (they block
 * on NATS); repl's own thread keeps the lease and reads the stream while
 * standby; the loop thread gets the stream's messages and the role changes
 * through an eventfd (repl_config's callbacks run on the loop thread).
 * Without libnats (BEANGATE_NATS=OFF) repl_open says replication is
 * unavailable. */
#ifndef BEANGATE_REPL_H
#define BEANGATE_REPL_H

#include <stddef.h>
#include <stdint.h>
#include <event2/event.h>

struct repl;

/* What the server learns, on the loop thread. */
struct repl_events {
    void *arg;
    /* a standby's message of records (seq: its stream sequence): apply it.
     * 0, or a negative outcome: the standby cannot go on (it stops). */
    int (*apply)(void *arg, uint64_t seq, const char *data, size_t len);
    /* this node holds the lease and the stream up to seq is applied and
     * fenced: serve. stream_bytes: what the stream holds now. */
    void (*primary)(void *arg, uint64_t seq, uint64_t stream_bytes);
    /* leadership is lost or given up (why: a short phrase): stop serving
     * at once (the server exits 75) */
    void (*lost)(void *arg, const char *why);
};

struct repl_config {
    const char *servers;       /* "nats://h1:4222,nats://h2:4222" */
    const char *stream;        /* the stream's name; its subject is <stream>.log */
    const char *node_id;       /* this node's name in the lease */
    uint32_t lease_ms;         /* the lease's time to live */
    uint32_t renew_ms;         /* how often the primary renews it (< lease_ms) */
    uint32_t replicas;         /* the stream's and the lease bucket's replicas */
    uint64_t max_record;       /* the largest record this server can log */
};

/* The role, for stats and /readyz. */
enum repl_role { REPL_STANDBY, REPL_TAKING_OVER, REPL_PRIMARY, REPL_LOST };

struct repl_stats {
    enum repl_role role;
    uint64_t applied_seq;      /* standby: the last message applied */
    uint64_t stream_last_seq;  /* the stream's last sequence as last seen */
    uint64_t published_seq;    /* primary: the last message acknowledged */
    uint64_t messages_published, publish_retries, purges;
    uint64_t lease_renewals, lease_failures;
    int64_t lease_age_ms;      /* primary: since the last renewal; -1 otherwise */
};

/* Nonzero when this build has libnats. */
int repl_available(void);
/* Connect, make sure the stream and the lease bucket exist (creating them
 * with cfg's replicas), and start as a standby: messages are handed to
 * ev->apply from the first the stream holds; the lease is tried every
 * renew_ms. 0, or BG_IO_ERROR / BG_BAD_FORMAT after a message (also when
 * built without libnats: "replication unavailable"). */
int repl_open(struct repl **out, const struct repl_config *cfg, struct event_base *base,
              const struct repl_events *ev);
/* The flusher's side: append data (whole records) to the stream, as one or
 * more messages; retries while the stream cannot be reached. *first_seq:
 * the stream sequence of the first message. 0, REPL_FENCED (another node
 * appended: this one is no longer primary) or REPL_STOPPED (repl_stop). */
#define REPL_FENCED 1
#define REPL_STOPPED 2
int repl_append(struct repl *r, const char *data, size_t len, uint64_t *first_seq);
/* The flusher's side: remove the messages before seq (a snapshot starting
 * at seq supersedes them). 0 or BG_IO_ERROR (logged; the next snapshot
 * tries again). */
int repl_purge(struct repl *r, uint64_t seq);
/* Make blocked calls (repl_append's retries) give up: at once, or once ms
 * have passed (a last batch at shutdown gets that long). Any thread. */
void repl_stop(struct repl *r);
void repl_stop_within(struct repl *r, uint32_t ms);
void repl_get_stats(const struct repl *r, struct repl_stats *out);
const char *repl_role_name(enum repl_role role);
/* Stop the thread, give up the lease if held (so a standby takes over
 * without waiting for it to expire), disconnect, free. NULL: nothing. */
void repl_close(struct repl *r);

#endif

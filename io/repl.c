/* repl.c - the log replicated through NATS JetStream (libnats 3.4): the
 * flusher's sink (repl_append, repl_purge), the leadership lease, the
 * standby's reading of the stream and the takeover. repl.h says what each
 * thread does; docs/scaling.md "High availability" says why. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <nats/nats.h>
#include <nettle/base64.h>

#include "../core/core.h"
#include "eventlog.h"
#include "repl.h"

#define LEASE_KEY "primary"
#define TAKEOVER_HEADER "Beangate-Takeover"
#define QUEUE_CAP 1024           /* messages handed to the loop, not yet applied */
#define HEADER_ROOM 512          /* a message's headers, subject and framing */
#define RETRY_NS (50 * 1000000ull)
#define GET_WINDOW 128           /* requests by sequence in flight, at most */
#define GET_BYTES (16u << 20)    /* ... and about this many bytes of answers */
#define RESUBSCRIBE_MAX_NS (2000 * 1000000ull)

enum got_state { GOT_NONE, GOT_MESSAGE, GOT_MISSING };

struct queued {
    natsMsg *msg;
    uint64_t seq;
};

struct repl {
    struct repl_config cfg;
    char *servers, *stream, *node_id;   /* copies */
    char subject[160], bucket[160], nonce[17];
    struct repl_events ev;
    natsOptions *opts;
    natsConnection *nc;
    jsCtx *js;
    jsCtx *js_quick;             /* the lease's requests: the bounded wait of `quick` */
    kvStore *kv;                 /* the lease bucket, through js_quick once it exists */
    size_t max_msg;              /* data bytes in one message */
    jsOptions quick;             /* the standby's requests: a bounded wait (quick_wait_ms) */
    /* the thread */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int stopping;                /* under mu */
    uint64_t stop_at_ns;         /* under mu: stopping from then on (0: never) */
    /* standby -> loop */
    struct queued queue[QUEUE_CAP];
    size_t q_head, q_len;
    uint64_t handed_seq;         /* thread: the last message queued */
    uint64_t applied_seq;        /* loop: the last message applied (under mu) */
    int ev_primary, ev_lost;     /* under mu: events for the loop */
    uint64_t ev_seq, ev_bytes;
    char ev_why[256];
    int notify_fd;
    struct event *notify_ev;
    /* reading by sequence (thread) */
    natsSubscription *get_sub;   /* the answers: get_pattern */
    char get_inbox[80], get_pattern[96], get_subject[200];
    natsMsg *got[GET_WINDOW];    /* answers come out of order: by sequence % GET_WINDOW */
    unsigned char got_state[GET_WINDOW];
    size_t got_avg_len;          /* the answers' mean size, moving (sets the window) */
    uint64_t read_by_sequence;   /* messages read by sequence since the start (the log) */
    /* the lease (thread) */
    uint64_t lease_rev;
    uint64_t lease_sent_ns;      /* when the last confirmed renewal was sent (written under mu) */
    uint64_t renew_first_ns;     /* when the first renewal not yet confirmed was sent (0: none) */
    int unconfirmed;             /* renewals have failed for a lease time (said) */
    int end_unchecked;           /* primary: took its expired key back before it could read the stream's end */
    uint64_t absent_since_ns;    /* standby: the lease key absent, NATS answering, since then (0: not) */
    uint64_t trouble_ns;         /* standby: when NATS last failed to answer it (0: not lately) */
    char kv_stream[170];         /* the lease bucket's stream: KV_<bucket> */
    /* primary (flusher) */
    uint64_t last_seq;           /* the stream's last sequence as this node knows it */
    uint64_t msg_counter;
    /* stats (under mu) */
    struct repl_stats st;
};

int repl_available(void) { return 1; }

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int is_stopping(struct repl *r)
{
    pthread_mutex_lock(&r->mu);
    int s = r->stopping || (r->stop_at_ns && mono_ns() >= r->stop_at_ns);
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* What a failed NATS call said, as the log fields `error=... status=...
 * js_error=N`: libnats's text for this thread's last error when that error
 * is this call's status (it names the cause: "no responders", JetStream's
 * description), else the status's name; the status's name; and the
 * JetStream error code (0: none). Written into buf, which is returned. Call
 * it before any other NATS call on the thread. */
static const char *nats_error_fields(char *buf, size_t n, natsStatus s, jsErrCode jerr)
{
    natsStatus last = NATS_OK;
    const char *text = nats_GetLastError(&last);
    if (!text || !*text || last != s) text = natsStatus_GetText(s);
    snprintf(buf, n, "error=%s status=%s js_error=%d", log_str(text), log_str(natsStatus_GetText(s)),
             (int)jerr);
    return buf;
}

const char *repl_role_name(enum repl_role role)
{
    switch (role) {
    case REPL_STANDBY: return "standby";
    case REPL_TAKING_OVER: return "taking_over";
    case REPL_PRIMARY: return "primary";
    case REPL_LOST: return "lost";
    }
    return "?";
}

static void set_role(struct repl *r, enum repl_role role)
{
    pthread_mutex_lock(&r->mu);
    r->st.role = role;
    pthread_mutex_unlock(&r->mu);
}

static void wake_loop(struct repl *r)
{
    uint64_t one = 1;
    if (write(r->notify_fd, &one, sizeof one) != sizeof one) { /* the counter is full: it wakes anyway */ }
}

/* Tell the loop that leadership is lost (once). */
static void post_lost(struct repl *r, const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (!r->ev_lost) {
        r->ev_lost = 1;
        snprintf(r->ev_why, sizeof r->ev_why, "%s", why);
        r->st.role = REPL_LOST;
    }
    pthread_mutex_unlock(&r->mu);
    wake_loop(r);
}

/* ---- the lease ------------------------------------------------------------ */

/* Whether leadership was given up (post_lost): by the flusher when the
 * stream refused its append, or by this thread. A node in that state never
 * renews or takes the lease again. */
static int has_lost(struct repl *r)
{
    pthread_mutex_lock(&r->mu);
    int lost = r->st.role == REPL_LOST;
    pthread_mutex_unlock(&r->mu);
    return lost;
}

/* The lease is held at revision rev, confirmed by a renewal sent at sent_ns. */
static void lease_held(struct repl *r, uint64_t rev, uint64_t sent_ns)
{
    pthread_mutex_lock(&r->mu);
    r->lease_rev = rev;
    r->lease_sent_ns = sent_ns;
    pthread_mutex_unlock(&r->mu);
    r->renew_first_ns = 0;
    r->unconfirmed = 0;
}

/* Try to take the lease (it exists only while a primary renews it).
 * NATS_OK won; NATS_ERR someone holds it (JetStream refused the create);
 * anything else: the bucket did not answer. */
static natsStatus lease_try_take(struct repl *r)
{
    uint64_t rev = 0, sent = mono_ns();
    natsStatus s = kvStore_CreateString(&rev, r->kv, LEASE_KEY, r->node_id);
    if (s != NATS_OK) return s;
    lease_held(r, rev, sent);
    log_event(BG_LOG_WARN, "replication_lease_taken", "node=%s bucket=%s revision=%" PRIu64,
              log_str(r->node_id), log_str(r->bucket), rev);
    return NATS_OK;
}

static int stream_state(struct repl *r, jsOptions *o, uint64_t *last, uint64_t *bytes, uint64_t *first);

/* Whether stream `name` has a leader: its state is asked with the quick
 * wait, and only a stream's leader answers. */
static int stream_led(struct repl *r, const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, r->js, name, &r->quick, &jerr) != NATS_OK) return 0;
    jsStreamInfo_Destroy(si);
    return 1;
}

/* A standby's try of the lease: 1 won. It creates the key only when it
 * reads it absent (expired, or given back) while the stream and the lease
 * bucket answer (a node that cannot reach the stream does not take the
 * lease). After NATS trouble (a check or a create unanswered: a stream or
 * the bucket elects a leader after a NATS node was lost) it waits until
 * the key has been absent with both answering for a whole lease time: the
 * primary, whose lease expired during the election, takes its key back
 * within milliseconds once NATS answers, so an election is not followed by
 * a failover (a primary that died meanwhile is replaced a lease time
 * later). Without recent trouble (five lease times) it creates at once. */
static int standby_try_lease(struct repl *r)
{
    uint64_t now = mono_ns(), lease_ns = (uint64_t)r->cfg.lease_ms * 1000000ull;
    kvEntry *e = NULL;
    natsStatus g = kvStore_Get(&e, r->kv, LEASE_KEY);
    if (g == NATS_OK) { /* held */
        kvEntry_Destroy(e);
        r->absent_since_ns = 0;
        return 0;
    }
    uint64_t last = 0;
    if (g != NATS_NOT_FOUND || !stream_led(r, r->kv_stream) || stream_state(r, &r->quick, &last, NULL, NULL) != 0) {
        r->trouble_ns = mono_ns();
        r->absent_since_ns = 0;
        return 0;
    }
    if (!r->absent_since_ns) r->absent_since_ns = now;
    if (r->trouble_ns && now - r->trouble_ns > 5 * lease_ns) r->trouble_ns = 0;
    if (r->trouble_ns && now - r->absent_since_ns < lease_ns) return 0; /* the primary's turn first */
    natsStatus s = lease_try_take(r);
    if (s == NATS_OK) return 1;
    if (s != NATS_ERR) {
        r->trouble_ns = mono_ns();
        r->absent_since_ns = 0;
    }
    return 0;
}

/* Delete the lease if this node still holds it at its revision (a clean
 * stop, a takeover that gives up): a standby takes it at once instead of
 * after it expires. The delete is the key-value store's delete marker,
 * published with the expected last revision of the key, so a lease that
 * expired and was taken by another node meanwhile stays that node's. */
static void lease_give_back(struct repl *r)
{
    if (!r->lease_rev) return;
    char subject[200];
    snprintf(subject, sizeof subject, "$KV.%s.%s", r->bucket, LEASE_KEY);
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, subject, NULL, NULL, 0) != NATS_OK) return;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.ExpectLastSubjectSeq = r->lease_rev;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus st = natsMsgHeader_Set(m, "KV-Operation", "DEL");
    if (st == NATS_OK) st = js_PublishMsg(&pa, r->js_quick ? r->js_quick : r->js, m, &po, &jerr);
    if (st == NATS_OK) jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    char err[256] = "";
    if (st != NATS_OK) nats_error_fields(err, sizeof err, st, jerr);
    log_event(BG_LOG_WARN, "replication_lease_given_back", "node=%s revision=%" PRIu64 " done=%s %s",
              log_str(r->node_id), r->lease_rev, st == NATS_OK ? "yes" : "no (it expires)", err);
}

/* Whether the NATS server this node is connected to answers a round trip
 * within the lease time. A node cut off from NATS gets no answer; one whose
 * JetStream requests go unanswered while NATS elects a stream's or the
 * bucket's leader does. */
static int nats_answers(struct repl *r)
{
    return natsConnection_FlushTimeout(r->nc, (int64_t)r->cfg.lease_ms) == NATS_OK;
}

static int stream_ends_with_mine(struct repl *r);

/* Renew the lease if it is due. 0 held (or NATS cannot say yet), -1 lost
 * (posted). The rules (docs/scaling.md, "The fault model"):
 * - a renewal whose answer was lost may have been applied: the key then
 *   holds this node's name at the revision after the one it renewed, and
 *   the lease is this node's, renewed;
 * - the key held by anyone else at a later revision: lost (an earlier
 *   revision is a stale read from a replica that is behind: no answer);
 * - the key expired (the bucket could not renew it for a lease time, as
 *   while it elects a leader): taken again unless the stream ends with
 *   another node's message (lost; when the end cannot be read yet, it is
 *   checked at the next renewals); after such
 *   trouble a standby leaves it to the primary for a lease time
 *   (standby_try_lease);
 * - no answer from JetStream for a lease time: lost only when the NATS
 *   server does not answer either (this node is cut off from NATS); while
 *   NATS elects a leader, the primary waits, as its standby must;
 * - once leadership is lost (a fenced append), never renewed again. */
static int lease_renew_due(struct repl *r)
{
    if (has_lost(r)) return -1;
    uint64_t now = mono_ns(), lease_ns = (uint64_t)r->cfg.lease_ms * 1000000ull;
    if (now - r->lease_sent_ns < (uint64_t)r->cfg.renew_ms * 1000000ull) return 0;
    if (!r->renew_first_ns) r->renew_first_ns = now; /* the first renewal not yet confirmed */
    uint64_t rev = 0;
    natsStatus s = kvStore_UpdateString(&rev, r->kv, LEASE_KEY, r->node_id, r->lease_rev);
    if (s == NATS_OK) {
        if (r->unconfirmed) log_event(BG_LOG_WARN, "replication_lease_confirmed", "node=%s", log_str(r->node_id));
        lease_held(r, rev, now);
        int mine = r->end_unchecked ? stream_ends_with_mine(r) : 1;
        if (mine == 0) {
            post_lost(r, "the lease expired and another node appended to the stream since");
            return -1;
        }
        r->end_unchecked = mine < 0;
        pthread_mutex_lock(&r->mu);
        r->st.lease_renewals++;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    char err[256];
    nats_error_fields(err, sizeof err, s, 0);
    pthread_mutex_lock(&r->mu);
    r->st.lease_failures++;
    pthread_mutex_unlock(&r->mu);
    kvEntry *e = NULL;
    natsStatus g = kvStore_Get(&e, r->kv, LEASE_KEY);
    if (g == NATS_OK) {
        const char *holder = kvEntry_ValueString(e);
        uint64_t at = kvEntry_Revision(e);
        int named = holder && strcmp(holder, r->node_id) == 0;
        char who[96];
        snprintf(who, sizeof who, "%s", holder ? holder : "?");
        kvEntry_Destroy(e);
        if (named && at == r->lease_rev + 1) {
            /* an earlier renewal was applied and its answer lost: renewed
             * then, at the latest since the first unconfirmed one was sent */
            log_event(BG_LOG_WARN, "replication_lease_recognised", "node=%s revision=%" PRIu64 " msg=%s",
                      log_str(r->node_id), at, log_str("a renewal was applied but its answer was lost"));
            lease_held(r, at, r->renew_first_ns);
            pthread_mutex_lock(&r->mu);
            r->st.lease_renewals++;
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
        if (at > r->lease_rev) {
            char why[256];
            snprintf(why, sizeof why, "the lease is held by %s (revision %" PRIu64 ", this node's was %" PRIu64 ")",
                     who, at, r->lease_rev);
            post_lost(r, why);
            return -1;
        }
        /* unchanged (the renewal did not get through yet), or an older
         * revision: the read was answered by a replica of the bucket that is
         * behind (its leader is being elected), which cannot say */
    } else if (g == NATS_NOT_FOUND) {
        /* it expired (the bucket had no leader for a lease time): taken
         * again, unless another node appended meanwhile (this one is
         * fenced: it could not write, and would serve a stale state) */
        pthread_mutex_lock(&r->mu);
        int primary = r->st.role == REPL_PRIMARY;
        pthread_mutex_unlock(&r->mu);
        int mine = primary ? stream_ends_with_mine(r) : 1; /* a takeover's own message fences */
        if (mine == 0) {
            post_lost(r, "the lease expired and another node appended to the stream since");
            return -1;
        }
        /* the stream's end unreadable (its leader elected too): the key is
         * taken back at once, and the end checked at the next renewals */
        if (lease_try_take(r) == NATS_OK) {
            r->end_unchecked = mine < 0;
            return 0;
        }
    }
    if (mono_ns() - r->lease_sent_ns >= lease_ns) {
        if (!r->unconfirmed) {
            r->unconfirmed = 1;
            log_event(BG_LOG_WARN, "replication_lease_unconfirmed", "node=%s ms_since_renewal=%" PRIu64 " %s",
                      log_str(r->node_id), (mono_ns() - r->lease_sent_ns) / 1000000, err);
        }
        if (!nats_answers(r)) {
            post_lost(r, "cut off from NATS: the lease went unconfirmed for a lease time and the NATS server "
                         "does not answer");
            return -1;
        }
    }
    return 0;
}

/* ---- standby: the stream to the loop -------------------------------------- */

/* How long a standby's request to NATS (subscribing, the stream's state, a
 * message by sequence) may wait for its answer: a quarter of the lease
 * time, 100 ms to 1 s. No answer in that time is a failure that is retried,
 * so a request that is never answered (nats-server 2.9.10 may place the
 * consumer of a subscription on a server that is down) delays the lease
 * and the takeover by that much only. */
static int quick_wait_ms(const struct repl_config *cfg)
{
    uint32_t ms = cfg->lease_ms / 4;
    return (int)(ms < 100 ? 100 : ms > 1000 ? 1000 : ms);
}

/* The ordered consumer's idle heartbeat: libnats makes the consumer again
 * when none came for two of them (its server went down), so a standby whose
 * consumer was on a lost server reads on after about 2 s (10 s with
 * libnats's default of 5 s). */
#define ORDERED_HEARTBEAT_NS (1000 * 1000000ll)

/* Subscribe (an ordered consumer) to the stream from the message after
 * r->handed_seq (from its first message before any was handed), waiting
 * r->quick for the consumer. NULL when it failed (logged: the caller tries
 * again). Standby thread. */
static natsSubscription *subscribe_next(struct repl *r)
{
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = r->stream;
    so.Ordered = true;
    so.Config.Heartbeat = ORDERED_HEARTBEAT_NS;
    if (r->handed_seq) {
        so.Config.DeliverPolicy = js_DeliverByStartSequence;
        so.Config.OptStartSeq = r->handed_seq + 1;
    } else {
        so.Config.DeliverPolicy = js_DeliverAll;
    }
    natsSubscription *sub = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_SubscribeSync(&sub, r->js, r->subject, &r->quick, &so, &jerr);
    if (s == NATS_OK) return sub;
    char err[256];
    log_event(BG_LOG_WARN, "replication_subscribe_retry", "stream=%s from_seq=%" PRIu64 " %s",
              log_str(r->stream), r->handed_seq + 1, nats_error_fields(err, sizeof err, s, jerr));
    return NULL;
}

/* Wait until the loop's queue has room (or stopping). 1 room, 0 stopping. */
static int queue_room(struct repl *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->q_len == QUEUE_CAP && !r->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&r->cond, &r->mu, &ts);
    }
    int room = r->q_len < QUEUE_CAP;
    pthread_mutex_unlock(&r->mu);
    return room;
}

/* Queue message m (stream sequence seq) for the loop, which applies the
 * messages in the order queued: the next one after r->handed_seq, or a
 * later one when a purge removed those between. A message already handed
 * (the subscription delivers what was fetched by sequence) is dropped. The
 * queue has room (queue_room). 1 queued, 0 dropped. */
static int queue_msg(struct repl *r, natsMsg *m, uint64_t seq)
{
    if (seq <= r->handed_seq) {
        natsMsg_Destroy(m);
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    r->queue[(r->q_head + r->q_len) % QUEUE_CAP] = (struct queued){m, seq};
    r->q_len++;
    r->handed_seq = seq;
    if (seq > r->st.stream_last_seq) r->st.stream_last_seq = seq;
    pthread_mutex_unlock(&r->mu);
    wake_loop(r);
    return 1;
}

/* Wait up to wait_ns for the subscription's next message and queue it for
 * the loop (when the queue has room). 1 queued, 0 nothing. */
static int pump_one(struct repl *r, natsSubscription *sub, uint64_t wait_ns)
{
    if (!queue_room(r)) return 0;
    natsMsg *m = NULL;
    if (natsSubscription_NextMsg(&m, sub, (int64_t)(wait_ns / 1000000) + 1) != NATS_OK) return 0;
    jsMsgMetaData *meta = NULL;
    if (natsMsg_GetMetaData(&meta, m) != NATS_OK) { /* a status or control message */
        natsMsg_Destroy(m);
        return 0;
    }
    uint64_t seq = meta->Sequence.Stream;
    jsMsgMetaData_Destroy(meta);
    return queue_msg(r, m, seq);
}

/* Sleep ns or until stopping. */
static void nap(struct repl *r, uint64_t ns)
{
    pthread_mutex_lock(&r->mu);
    if (!r->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = (uint64_t)ts.tv_nsec + ns;
        ts.tv_sec += (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        pthread_cond_timedwait(&r->cond, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
}

/* The stream's last sequence, and (when not NULL) its bytes and first
 * sequence, asked with options o (NULL: the context's). 0 or -1. */
static int stream_state(struct repl *r, jsOptions *o, uint64_t *last, uint64_t *bytes, uint64_t *first)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, r->js, r->stream, o, &jerr) != NATS_OK) return -1;
    *last = si->State.LastSeq;
    if (bytes) *bytes = si->State.Bytes;
    if (first) *first = si->State.FirstSeq;
    jsStreamInfo_Destroy(si);
    return 0;
}

/* The stream's last sequence and the id (Nats-Msg-Id) of its last
 * message, "" when the stream is empty, asked with options o (NULL: the
 * context's). 0 or -1. */
static int stream_tail(struct repl *r, jsOptions *o, uint64_t *last, char *id, size_t n)
{
    id[0] = 0;
    if (stream_state(r, o, last, NULL, NULL) != 0) return -1;
    if (!*last) return 0;
    natsMsg *tail = NULL;
    jsErrCode jerr = 0;
    const char *tail_id = NULL;
    if (js_GetMsg(&tail, r->js, r->stream, *last, o, &jerr) != NATS_OK) return -1;
    if (natsMsgHeader_Get(tail, "Nats-Msg-Id", &tail_id) == NATS_OK && tail_id) snprintf(id, n, "%s", tail_id);
    natsMsg_Destroy(tail);
    return 0;
}

/* Whether the stream ends with a message this process appended (or is
 * empty): no other node took over since. 1 yes, 0 no, -1 cannot tell. */
static int stream_ends_with_mine(struct repl *r)
{
    uint64_t last = 0;
    char id[160], mine[96];
    if (stream_tail(r, &r->quick, &last, id, sizeof id) != 0) return -1;
    int len = snprintf(mine, sizeof mine, "%s.%s.", r->node_id, r->nonce);
    return !last || strncmp(id, mine, (size_t)len) == 0;
}

/* How long a takeover may go without progress (no message read or applied,
 * no takeover message appended) before it gives the lease back: ten lease
 * times, at least 10 s, far beyond a NATS leader election, so a takeover
 * that stalls (the stream unreadable to this node) never holds the lease
 * for good. */
static uint64_t takeover_stall_ns(const struct repl_config *cfg)
{
    uint64_t ms = (uint64_t)cfg->lease_ms * 10;
    return (ms < 10000 ? 10000 : ms) * 1000000ull;
}

#define REPL_STALLED 3 /* publish_one: a takeover message could not be appended in that time */

/* Publish one message (data may be empty: the takeover) with the expected
 * last sequence r->last_seq (none when it is 0: a stream never written).
 * Retries what may be passing (no quorum, a leader election, a lost
 * connection) until it is stored or refused. 0 (r->last_seq is its
 * sequence), REPL_FENCED (a primary's append refused: leadership lost, and
 * posted), REPL_STOPPED, or for the takeover message REPL_STALLED (not
 * stored within takeover_stall_ns; it renews the lease meanwhile, and
 * REPL_STOPPED means the lease was lost). Any thread that owns publishing. */
static int publish_one(struct repl *r, const char *data, size_t len, int takeover, int *retried)
{
    char id[128];
    snprintf(id, sizeof id, "%s.%s.%" PRIu64, r->node_id, r->nonce, ++r->msg_counter);
    uint64_t began = mono_ns();
    for (int attempt = 0;; attempt++) {
        if (is_stopping(r)) return REPL_STOPPED;
        natsMsg *m = NULL;
        natsStatus s = natsMsg_Create(&m, r->subject, NULL, data, (int)len);
        if (s == NATS_OK && takeover) s = natsMsgHeader_Set(m, TAKEOVER_HEADER, r->node_id);
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MsgId = id;
        po.ExpectLastSeq = r->last_seq;
        po.MaxWait = r->quick.Wait; /* an answer lost in a leader election is asked again soon */
        jsPubAck *pa = NULL;
        jsErrCode jerr = 0;
        if (s == NATS_OK) s = js_PublishMsg(&pa, r->js, m, &po, &jerr);
        natsMsg_Destroy(m);
        if (s == NATS_OK) {
            r->last_seq = pa->Sequence;
            jsPubAck_Destroy(pa);
            pthread_mutex_lock(&r->mu);
            r->st.published_seq = r->last_seq;
            if (r->last_seq > r->st.stream_last_seq) r->st.stream_last_seq = r->last_seq;
            r->st.messages_published++;
            pthread_mutex_unlock(&r->mu);
            if (*retried) log_event(BG_LOG_WARN, "replication_publish_recovered", "seq=%" PRIu64, r->last_seq);
            *retried = 0;
            return 0;
        }
        if (jerr == JSStreamWrongLastSequenceErr) {
            /* an earlier try of this very message may have been stored
             * with its acknowledgement lost: then the stream ends with it
             * (when the end cannot be read now, it is asked again) */
            uint64_t last = 0;
            char tail_id[sizeof id];
            int tail = attempt > 0 ? stream_tail(r, NULL, &last, tail_id, sizeof tail_id) : 0;
            if (tail == 0 && attempt > 0 && strcmp(tail_id, id) == 0) {
                r->last_seq = last;
                continue; /* counted as stored: the next attempt is a duplicate, acknowledged */
            }
            if (tail == 0) {
                /* a takeover reads on; a primary's append was refused
                 * because another node took over: it must step down (and
                 * never renew) */
                if (!takeover) post_lost(r, "another node appended to the stream: this one is fenced");
                return REPL_FENCED;
            }
            /* the end could not be read: retried as any passing failure */
        }
        if (!*retried) {
            char err[256];
            log_event(BG_LOG_WARN, "replication_publish_retry", "%s expected_last_seq=%" PRIu64,
                      nats_error_fields(err, sizeof err, s, jerr), r->last_seq);
        }
        *retried = 1;
        pthread_mutex_lock(&r->mu);
        r->st.publish_retries++;
        pthread_mutex_unlock(&r->mu);
        if (takeover && lease_renew_due(r) != 0) return REPL_STOPPED;
        if (takeover && mono_ns() - began > takeover_stall_ns(&r->cfg)) return REPL_STALLED;
        nap(r, RETRY_NS);
    }
}

int repl_append(struct repl *r, const char *data, size_t len, uint64_t *first_seq)
{
    size_t at = 0;
    int first = 1, retried = 0;
    while (at < len) {
        size_t take = 0;
        while (at + take < len) {
            size_t span = bg_journal_record_span(data + at + take, len - at - take);
            if (take && take + span > r->max_msg) break;
            take += span;
        }
        int rc = publish_one(r, data + at, take, 0, &retried);
        if (rc != 0) return rc;
        if (first && first_seq) *first_seq = r->last_seq;
        first = 0;
        at += take;
    }
    return 0;
}

int repl_purge(struct repl *r, uint64_t seq)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Purge.Sequence = seq;
    jsErrCode jerr = 0;
    natsStatus s = js_PurgeStream(r->js, r->stream, &o, &jerr);
    if (s != NATS_OK) {
        char err[256];
        log_event(BG_LOG_WARN, "replication_purge_failed", "before_seq=%" PRIu64 " %s", seq,
                  nats_error_fields(err, sizeof err, s, jerr));
        return BG_IO_ERROR;
    }
    pthread_mutex_lock(&r->mu);
    r->st.purges++;
    pthread_mutex_unlock(&r->mu);
    log_event(BG_LOG_INFO, "replication_purged", "before_seq=%" PRIu64, seq);
    return 0;
}

/* ---- the thread: standby, takeover, primary -------------------------------- */

static uint64_t applied(struct repl *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t a = r->applied_seq;
    pthread_mutex_unlock(&r->mu);
    return a;
}

/* ---- reading by sequence: no consumer needed ------------------------------ */

/* The stream's leader answers a request for one message by its sequence
 * ($JS.API.STREAM.MSG.GET) without a consumer, so a standby reads on when
 * its subscription cannot be made (nats-server 2.9.10 may place the
 * consumer on a server that is down). One request per round trip is too
 * slow to catch up thousands of messages within a failover, so up to
 * GET_WINDOW requests are in flight; each names its sequence in its reply
 * subject, and answers are put back in order in r->got. */

/* The answer to a request by sequence (JSON: the message with its data in
 * base64, or an error). 1 and *out (the data, as a message on r->subject)
 * when it holds the message; 0 when the stream has no message by that
 * sequence (purged, or not written yet); -1 when it is not understood. */
static int parse_get_reply(struct repl *r, natsMsg *reply, natsMsg **out)
{
    json_error_t jerr;
    json_t *root = json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, &jerr);
    if (!root) return -1;
    int rc = -1;
    json_t *err = json_object_get(root, "error"), *msg = json_object_get(root, "message");
    if (err) {
        rc = json_integer_value(json_object_get(err, "err_code")) == JSNoMessageFoundErr ? 0 : -1;
    } else if (json_is_object(msg)) {
        const char *b64 = json_string_value(json_object_get(msg, "data")); /* absent: empty */
        size_t in = b64 ? strlen(b64) : 0, len = BASE64_DECODE_LENGTH(in);
        uint8_t *data = malloc(len ? len : 1);
        struct base64_decode_ctx ctx;
        base64_decode_init(&ctx);
        if (data && base64_decode_update(&ctx, &len, data, in, b64 ? b64 : "") && base64_decode_final(&ctx) &&
            natsMsg_Create(out, r->subject, NULL, (const char *)data, (int)len) == NATS_OK)
            rc = 1;
        free(data);
    }
    json_decref(root);
    return rc;
}

/* Drop the answers kept for the window (they are asked again). */
static void forget_got(struct repl *r)
{
    for (int i = 0; i < GET_WINDOW; i++) {
        if (r->got[i]) natsMsg_Destroy(r->got[i]);
        r->got[i] = NULL;
        r->got_state[i] = GOT_NONE;
    }
}

/* Ask for message seq; its answer comes to <get_inbox>.<seq>. */
static natsStatus ask_by_sequence(struct repl *r, uint64_t seq)
{
    char reply[128], body[48];
    snprintf(reply, sizeof reply, "%s.%" PRIu64, r->get_inbox, seq);
    snprintf(body, sizeof body, "{\"seq\":%" PRIu64 "}", seq);
    return natsConnection_PublishRequestString(r->nc, r->get_subject, reply, body);
}

/* Read the messages after r->handed_seq up to `last` by sequence and queue
 * them in order, until `until` (monotonic ns). When the next one is gone
 * (a purge), reading goes on from the stream's first message. 1 when it
 * reached `last`, 0 when the time ran out, -1 when NATS did not answer
 * within the quick wait or answered what is not understood (logged; the
 * caller tries again later). Thread. */
static int read_by_sequence(struct repl *r, uint64_t last, uint64_t until)
{
    uint64_t next = r->handed_seq + 1, asked = r->handed_seq;
    forget_got(r); /* answers from an earlier call may still come: they are told apart by sequence */
    const char *why = NULL;
    char err[256] = "";
    natsStatus s = NATS_OK;
    if (!r->get_sub && (s = natsConnection_SubscribeSync(&r->get_sub, r->nc, r->get_pattern)) != NATS_OK) {
        r->get_sub = NULL;
        nats_error_fields(err, sizeof err, s, 0);
        why = "subscribe";
    }
    while (!why && next <= last && !is_stopping(r)) {
        size_t window = GET_BYTES / (r->got_avg_len ? r->got_avg_len : 1);
        window = window < 4 ? 4 : window > GET_WINDOW ? GET_WINDOW : window;
        while (asked < last && asked < next + window - 1) {
            if ((s = ask_by_sequence(r, asked + 1)) != NATS_OK) {
                nats_error_fields(err, sizeof err, s, 0);
                why = "publish";
                break;
            }
            asked++;
        }
        if (why) break;
        int slot = (int)(next % GET_WINDOW);
        if (r->got_state[slot] == GOT_NONE) {
            if (mono_ns() >= until) break; /* the time ran out */
            natsMsg *reply = NULL;
            s = natsSubscription_NextMsg(&reply, r->get_sub, (int64_t)r->quick.Wait);
            if (s != NATS_OK) {
                nats_error_fields(err, sizeof err, s, 0);
                why = "answer";
                break;
            }
            const char *dot = strrchr(natsMsg_GetSubject(reply), '.');
            uint64_t seq = dot ? strtoull(dot + 1, NULL, 10) : 0;
            if (seq >= next && seq < next + GET_WINDOW && r->got_state[seq % GET_WINDOW] == GOT_NONE) {
                natsMsg *m = NULL;
                int pr = parse_get_reply(r, reply, &m);
                if (pr < 0) {
                    snprintf(err, sizeof err, "answer=%s", log_str(natsMsg_GetData(reply)));
                    why = "parse";
                    natsMsg_Destroy(reply);
                    break;
                }
                size_t len = (size_t)natsMsg_GetDataLength(reply);
                r->got_avg_len = r->got_avg_len - r->got_avg_len / 8 + len / 8;
                r->got[seq % GET_WINDOW] = m;
                r->got_state[seq % GET_WINDOW] = pr ? GOT_MESSAGE : GOT_MISSING;
            } /* else an answer to an earlier call, or twice asked */
            natsMsg_Destroy(reply);
            continue;
        }
        if (r->got_state[slot] == GOT_MISSING) {
            uint64_t l = 0, first = 0;
            if (stream_state(r, &r->quick, &l, NULL, &first) != 0) {
                why = "state";
                break;
            }
            if (!(first > next && first <= l)) {
                snprintf(err, sizeof err, "first_seq=%" PRIu64 " last_seq=%" PRIu64, first, l);
                why = "missing";
                break;
            }
            forget_got(r); /* purged up to first: read on from there */
            asked = first - 1;
            next = first;
            continue;
        }
        if (!queue_room(r)) break;
        natsMsg *m = r->got[slot];
        r->got[slot] = NULL;
        r->got_state[slot] = GOT_NONE;
        queue_msg(r, m, next);
        next++;
        r->read_by_sequence++;
    }
    forget_got(r);
    if (!why) return next > last;
    log_event(BG_LOG_WARN, "replication_fetch_retry", "stream=%s seq=%" PRIu64 " failed=%s %s", log_str(r->stream),
              next, why, err);
    return -1;
}

/* Give up a takeover that made no progress for takeover_stall_ns: the lease
 * goes back, and leadership is posted lost (the server exits 75 and comes
 * back as a standby). -1. */
static int takeover_give_up(struct repl *r, uint64_t last)
{
    char why[128];
    snprintf(why, sizeof why, "the takeover made no progress for %" PRIu64 " ms at sequence %" PRIu64
             " of %" PRIu64 "; the lease is given back", takeover_stall_ns(&r->cfg) / 1000000, applied(r), last);
    lease_give_back(r);
    post_lost(r, why);
    return -1;
}

/* Whether a takeover stalled: the messages handed and applied (*seen) have
 * not changed for takeover_stall_ns (*progress_ns: when they last did). */
static int takeover_stalled(struct repl *r, uint64_t *seen, uint64_t *progress_ns)
{
    uint64_t now_seen = r->handed_seq + applied(r), now = mono_ns();
    if (now_seen != *seen) {
        *seen = now_seen;
        *progress_ns = now;
    }
    return now - *progress_ns > takeover_stall_ns(&r->cfg);
}

/* Holding the lease: read and apply the stream to its end, then append the
 * takeover message with that end as the expected last sequence. The
 * messages come from the subscription (NULL: none) while it delivers them,
 * else by sequence: a standby takes over without a consumer. It always
 * finishes or gives the lease back (takeover_give_up). 0 primary, -1
 * stopping or lost. */
static int take_over(struct repl *r, natsSubscription *sub)
{
    set_role(r, REPL_TAKING_OVER);
    uint64_t began = mono_ns(), read_before = r->read_by_sequence;
    uint64_t progress_ns = began, seen = r->handed_seq + applied(r), last = 0;
    for (;;) {
        if (is_stopping(r) || lease_renew_due(r) != 0) return -1;
        if (takeover_stalled(r, &seen, &progress_ns)) return takeover_give_up(r, last);
        uint64_t bytes = 0;
        if (stream_state(r, &r->quick, &last, &bytes, NULL) != 0) {
            nap(r, RETRY_NS);
            continue;
        }
        /* read up to the end, renewing the lease meanwhile */
        while (r->handed_seq < last && !is_stopping(r)) {
            if (lease_renew_due(r) != 0) return -1;
            if (takeover_stalled(r, &seen, &progress_ns)) return takeover_give_up(r, last);
            if (sub && pump_one(r, sub, 50000000ull)) continue;
            sub = NULL; /* it has nothing for now: the rest by sequence */
            uint64_t slice = (uint64_t)r->cfg.renew_ms * 1000000ull / 2 + 1;
            if (read_by_sequence(r, last, mono_ns() + slice) < 0) nap(r, RETRY_NS);
        }
        while (applied(r) < last && !is_stopping(r)) {
            if (lease_renew_due(r) != 0) return -1;
            if (takeover_stalled(r, &seen, &progress_ns)) return takeover_give_up(r, last);
            nap(r, 2000000ull);
        }
        r->last_seq = last;
        int retried = 0;
        int rc = publish_one(r, "", 0, 1, &retried);
        if (rc == REPL_STOPPED) return -1;
        if (rc == REPL_STALLED) return takeover_give_up(r, last);
        if (rc == REPL_FENCED) continue; /* the old primary appended meanwhile: read on */
        pthread_mutex_lock(&r->mu);
        r->st.role = REPL_PRIMARY;
        r->ev_primary = 1;
        r->ev_seq = r->last_seq;
        r->ev_bytes = bytes;
        r->applied_seq = r->last_seq;
        pthread_mutex_unlock(&r->mu);
        log_event(BG_LOG_WARN, "replication_primary",
                  "node=%s takeover_seq=%" PRIu64 " catch_up_ms=%" PRIu64 " read_by_sequence=%" PRIu64,
                  log_str(r->node_id), r->last_seq, (mono_ns() - began) / 1000000,
                  r->read_by_sequence - read_before);
        wake_loop(r);
        return 0;
    }
}

static void drop_subscription(natsSubscription **sub)
{
    if (!*sub) return;
    natsSubscription_Unsubscribe(*sub);
    natsSubscription_Destroy(*sub);
    *sub = NULL;
}

/* The thread: a standby tries the lease every poll (at most 100 ms) and,
 * between tries, reads the stream through its subscription, or by
 * sequence while it has none, so that it is never far behind when it
 * takes over. A failed subscribe is tried again later (a quick wait, then
 * doubling up to RESUBSCRIBE_MAX_NS), never in place of the lease. Then
 * primary: renew the lease until lost or stopping. */
static void *repl_main(void *arg)
{
    struct repl *r = arg;
    natsSubscription *sub = NULL;
    uint64_t poll_ns = (uint64_t)(r->cfg.renew_ms < 100 ? r->cfg.renew_ms : 100) * 1000000ull;
    uint64_t quick_ns = (uint64_t)quick_wait_ms(&r->cfg) * 1000000ull, resubscribe_ns = quick_ns;
    uint64_t next_try = 0, next_subscribe = 0;
    int primary = 0;
    while (!is_stopping(r)) {
        if (primary) {
            if (lease_renew_due(r) != 0) break;
            nap(r, (uint64_t)r->cfg.renew_ms * 1000000ull / 4 + 1);
            continue;
        }
        if (!sub && mono_ns() >= next_subscribe) {
            sub = subscribe_next(r);
            if (sub) {
                resubscribe_ns = quick_ns;
            } else {
                next_subscribe = mono_ns() + resubscribe_ns;
                resubscribe_ns = resubscribe_ns * 2 > RESUBSCRIBE_MAX_NS ? RESUBSCRIBE_MAX_NS : resubscribe_ns * 2;
            }
        }
        uint64_t now = mono_ns();
        if (now >= next_try) {
            next_try = now + poll_ns;
            if (standby_try_lease(r)) {
                if (take_over(r, sub) != 0) break;
                primary = 1;
                drop_subscription(&sub);
                continue;
            }
            now = mono_ns();
        }
        uint64_t wait = next_try > now ? next_try - now : 0;
        uint64_t last = 0;
        if (sub) {
            while (pump_one(r, sub, wait) && mono_ns() < next_try) {} /* drain what is there */
        } else if (stream_state(r, &r->quick, &last, NULL, NULL) == 0 && last > r->handed_seq) {
            if (read_by_sequence(r, last, next_try) < 0) nap(r, next_try > mono_ns() ? next_try - mono_ns() : 0);
        } else {
            nap(r, next_try > mono_ns() ? next_try - mono_ns() : 0);
        }
    }
    drop_subscription(&sub);
    return NULL;
}

/* ---- the loop's side ----------------------------------------------------- */

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct repl *r = arg;
    uint64_t n;
    if (read(fd, &n, sizeof n) != sizeof n) { /* spurious */ }
    for (;;) {
        pthread_mutex_lock(&r->mu);
        if (!r->q_len || r->ev_lost) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        struct queued q = r->queue[r->q_head];
        r->q_head = (r->q_head + 1) % QUEUE_CAP;
        r->q_len--;
        pthread_mutex_unlock(&r->mu);
        int rc = r->ev.apply(r->ev.arg, q.seq, natsMsg_GetData(q.msg), (size_t)natsMsg_GetDataLength(q.msg));
        natsMsg_Destroy(q.msg);
        if (rc != 0) {
            post_lost(r, "the standby cannot apply the stream");
            break;
        }
        pthread_mutex_lock(&r->mu);
        r->applied_seq = q.seq;
        r->st.applied_seq = q.seq;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    int primary = r->ev_primary, lost = r->ev_lost;
    r->ev_primary = 0;
    uint64_t seq = r->ev_seq, bytes = r->ev_bytes;
    char why[sizeof r->ev_why];
    memcpy(why, r->ev_why, sizeof why);
    if (lost) r->ev_lost = 2; /* said */
    pthread_mutex_unlock(&r->mu);
    if (lost == 1) {
        r->ev.lost(r->ev.arg, why);
        return;
    }
    if (primary) r->ev.primary(r->ev.arg, seq, bytes);
}

/* ---- open and close ------------------------------------------------------- */

/* Split "a,b,c" into the options' server list. */
static natsStatus set_servers(natsOptions *o, char *list)
{
    const char *urls[32];
    int n = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t && n < 32; t = strtok_r(NULL, ",", &save))
        if (*t) urls[n++] = t;
    if (!n) return NATS_INVALID_ARG;
    return natsOptions_SetServers(o, urls, n);
}

static int open_failed(struct repl *r, const char *op, natsStatus s, jsErrCode jerr)
{
    char err[256];
    log_event(BG_LOG_ERROR, "replication_open_failed", "servers=%s op=%s %s", log_str(r->cfg.servers), op,
              nats_error_fields(err, sizeof err, s, jerr));
    return BG_IO_ERROR;
}

/* Connect, find or make the stream and the lease bucket. 0 or BG_IO_ERROR. */
static int connect_all(struct repl *r)
{
    char *list = strdup(r->servers);
    if (!list) return BG_OUT_OF_MEMORY;
    natsStatus s = natsOptions_Create(&r->opts);
    if (s == NATS_OK) s = set_servers(r->opts, list);
    free(list);
    if (s == NATS_OK) s = natsOptions_SetName(r->opts, r->node_id);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(r->opts, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(r->opts, 100);
    if (s == NATS_OK) s = natsOptions_SetTimeout(r->opts, 1000);
    if (s == NATS_OK) s = natsOptions_SetPingInterval(r->opts, 1000);
    if (s == NATS_OK) s = natsOptions_SetMaxPingsOut(r->opts, 2);
    if (s != NATS_OK) return open_failed(r, "options", s, 0);
    if ((s = natsConnection_Connect(&r->nc, r->opts)) != NATS_OK) return open_failed(r, "connect", s, 0);
    int64_t payload = natsConnection_GetMaxPayload(r->nc);
    if (payload <= HEADER_ROOM || (uint64_t)(payload - HEADER_ROOM) < r->cfg.max_record) {
        log_event(BG_LOG_ERROR, "replication_open_failed",
                  "servers=%s op=check_max_payload max_payload=%" PRId64 " largest_record=%" PRIu64
                  " msg=%s", log_str(r->cfg.servers), payload, r->cfg.max_record,
                  log_str("a job of the maximum size (-z) would not fit in one NATS message: lower -z "
                          "or raise the NATS servers' max_payload"));
        return BG_BAD_FORMAT;
    }
    r->max_msg = (size_t)(payload - HEADER_ROOM);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    jsOptions_Init(&r->quick);
    r->quick.Wait = quick_wait_ms(&r->cfg);
    if ((s = natsConnection_JetStream(&r->js, r->nc, &jo)) != NATS_OK) return open_failed(r, "jetstream", s, 0);
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = r->stream;
    const char *subjects[1] = {r->subject};
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.Replicas = (int64_t)r->cfg.replicas;
    sc.DenyDelete = true;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    /* several tries: a cluster that has just started elects its meta leader first */
    for (int i = 0; i < 50; i++) {
        s = js_AddStream(&si, r->js, &sc, NULL, &jerr);
        if (s == NATS_OK || jerr == JSStreamNameExistErr) break;
        nats_Sleep(200);
    }
    if (s != NATS_OK && jerr == JSStreamNameExistErr) s = js_GetStreamInfo(&si, r->js, r->stream, NULL, &jerr);
    if (s != NATS_OK) return open_failed(r, "stream", s, jerr);
    if (si->Config && si->Config->Replicas != (int64_t)r->cfg.replicas)
        log_event(BG_LOG_WARN, "replication_replicas_differ", "stream=%s replicas=%" PRId64 " asked=%u",
                  log_str(r->stream), si->Config->Replicas, r->cfg.replicas);
    r->st.stream_last_seq = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = r->bucket;
    kc.History = 1;
    kc.TTL = (int64_t)r->cfg.lease_ms * 1000000; /* nanoseconds: the stream's max age */
    kc.StorageType = js_MemoryStorage;
    kc.Replicas = (int)r->cfg.replicas;
    for (int i = 0; i < 50; i++) {
        s = js_CreateKeyValue(&r->kv, r->js, &kc);
        if (s == NATS_OK) break;
        if (js_KeyValue(&r->kv, r->js, r->bucket) == NATS_OK) { /* it exists, made with other settings */
            kvStatus *ks = NULL;
            if (kvStore_Status(&ks, r->kv) == NATS_OK) {
                if (kvStatus_TTL(ks) != kc.TTL)
                    log_event(BG_LOG_WARN, "replication_lease_ttl_differs",
                              "bucket=%s ttl_ms=%" PRId64 " asked_ms=%u", log_str(r->bucket),
                              kvStatus_TTL(ks) / 1000000, r->cfg.lease_ms);
                kvStatus_Destroy(ks);
            }
            s = NATS_OK;
            break;
        }
        nats_Sleep(200);
    }
    if (s != NATS_OK) return open_failed(r, "lease_bucket", s, 0);
    natsInbox *inbox = NULL;
    if ((s = natsInbox_Create(&inbox)) != NATS_OK) return open_failed(r, "inbox", s, 0);
    snprintf(r->get_inbox, sizeof r->get_inbox, "%s", inbox);
    natsInbox_Destroy(inbox);
    snprintf(r->get_pattern, sizeof r->get_pattern, "%s.*", r->get_inbox);
    snprintf(r->get_subject, sizeof r->get_subject, "$JS.API.STREAM.MSG.GET.%s", r->stream);
    /* the lease's requests wait a quarter of the lease at most (as the
     * standby's do): while the bucket elects a leader (a NATS node lost),
     * a standby tries again soon instead of blocking 5 s on one request */
    kvStore *quick_kv = NULL;
    if (natsConnection_JetStream(&r->js_quick, r->nc, &r->quick) == NATS_OK &&
        js_KeyValue(&quick_kv, r->js_quick, r->bucket) == NATS_OK) {
        kvStore_Destroy(r->kv);
        r->kv = quick_kv;
    }
    return 0;
}

static void free_all(struct repl *r)
{
    for (size_t i = 0; i < r->q_len; i++) natsMsg_Destroy(r->queue[(r->q_head + i) % QUEUE_CAP].msg);
    forget_got(r);
    if (r->get_sub) natsSubscription_Destroy(r->get_sub);
    if (r->kv) kvStore_Destroy(r->kv);
    if (r->js_quick) jsCtx_Destroy(r->js_quick);
    if (r->js) jsCtx_Destroy(r->js);
    if (r->nc) {
        natsConnection_Close(r->nc);
        natsConnection_Destroy(r->nc);
    }
    if (r->opts) natsOptions_Destroy(r->opts);
    if (r->notify_ev) event_free(r->notify_ev);
    if (r->notify_fd >= 0) close(r->notify_fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cond);
    free(r->servers);
    free(r->stream);
    free(r->node_id);
    free(r);
}

int repl_open(struct repl **out, const struct repl_config *cfg, struct event_base *base,
              const struct repl_events *ev)
{
    struct repl *r = calloc(1, sizeof *r);
    if (!r) return BG_OUT_OF_MEMORY;
    r->cfg = *cfg;
    r->ev = *ev;
    r->notify_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cond, NULL);
    r->servers = strdup(cfg->servers);
    r->stream = strdup(cfg->stream);
    r->node_id = strdup(cfg->node_id);
    r->st.lease_age_ms = -1;
    r->got_avg_len = 1024;
    unsigned char raw[8] = {0};
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) { /* the pid and time below still differ */ }
    snprintf(r->nonce, sizeof r->nonce, "%02x%02x%02x%02x%08x", raw[0], raw[1], raw[2], raw[3],
             (unsigned)(raw[4] | raw[5] << 8 | raw[6] << 16) ^ (unsigned)getpid() ^ (unsigned)mono_ns());
    snprintf(r->subject, sizeof r->subject, "%s.log", cfg->stream);
    snprintf(r->bucket, sizeof r->bucket, "%s_lease", cfg->stream);
    snprintf(r->kv_stream, sizeof r->kv_stream, "KV_%s", r->bucket);
    int rc = !r->servers || !r->stream || !r->node_id ? BG_OUT_OF_MEMORY : connect_all(r);
    if (rc == 0) {
        r->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        r->notify_ev = r->notify_fd >= 0 ? event_new(base, r->notify_fd, EV_READ | EV_PERSIST, notify_cb, r) : NULL;
        if (!r->notify_ev || event_add(r->notify_ev, NULL) != 0) rc = BG_IO_ERROR;
    }
    if (rc == 0 && pthread_create(&r->thread, NULL, repl_main, r) != 0) rc = BG_IO_ERROR;
    if (rc != 0) {
        free_all(r);
        return rc;
    }
    r->thread_started = 1;
    log_event(BG_LOG_INFO, "replication_standby", "node=%s stream=%s lease_ms=%u", log_str(r->node_id),
              log_str(r->stream), r->cfg.lease_ms);
    *out = r;
    return 0;
}

void repl_stop(struct repl *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

void repl_stop_within(struct repl *r, uint32_t ms)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop_at_ns = mono_ns() + (uint64_t)ms * 1000000ull;
    pthread_mutex_unlock(&r->mu);
}

void repl_get_stats(const struct repl *r, struct repl_stats *out)
{
    struct repl *m = (struct repl *)r;
    pthread_mutex_lock(&m->mu);
    *out = m->st;
    if (m->st.role == REPL_PRIMARY) out->lease_age_ms = (int64_t)((mono_ns() - m->lease_sent_ns) / 1000000);
    pthread_mutex_unlock(&m->mu);
}

void repl_close(struct repl *r)
{
    if (!r) return;
    repl_stop(r);
    if (r->thread_started) pthread_join(r->thread, NULL);
    /* give the lease up (if this node still holds it: lease_give_back's
     * delete is conditional): a standby takes over at once instead of after
     * it expires */
    if (r->kv) lease_give_back(r);
    free_all(r);
}

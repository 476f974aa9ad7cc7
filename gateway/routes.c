/* routes.c - the handlers of the route table (router.c): one per path and
 * method. A handler reads its path parameter from the request's match,
 * calls the engine, and queues one response through reply.c (or returns an
 * outcome for the error table); http.c owns the daemon. Reservations made over
 * HTTP belong to the gateway's holder client and are named by tokens
 * (core/token.c), so they outlive the request that made them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/loop.h"
#include "gateway.h"

/* ---- replies ---------------------------------------------------------- */

static int bad_param(struct gw_request *r, const char *name)
{
    char detail[128];
    snprintf(detail, sizeof detail, "query parameter '%s' must be a non-negative integer in range", name);
    return gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
}

static int bad_tube(struct gw_request *r)
{
    return gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                            "tube names are 1-200 bytes of A-Za-z0-9-+/;.$_() not starting with '-'");
}

/* With --shard K/N, the shard that owns tube name[0..len) (bg_shard_of_tube:
 * CRC-32 mod N, what HAProxy computes in contrib/haproxy) when it is not
 * this one; else -1. Puts and reservations of another shard's tube are
 * refused, so that a job is never stranded where the proxy does not look
 * for it and a reserve never waits on a tube whose jobs go elsewhere. */
static int64_t other_shard(const struct gateway *gw, const char *name, size_t len)
{
    const struct bg_engine *e = gw->engine;
    if (e->shard_count == 1) return -1;
    uint32_t owner = bg_shard_of_tube(name, len, e->shard_count);
    if (owner == e->shard_index) return -1;
    return owner;
}

/* 421 WRONG_SHARD: tube name[0..len) belongs to shard `owner`. */
static int wrong_shard(struct gw_request *r, const char *name, size_t len, int64_t owner)
{
    const struct bg_engine *e = r->gw->engine;
    char detail[400];
    snprintf(detail, sizeof detail,
             "tube '%.*s' belongs to shard %lld of 0..%u (CRC-32 of its name mod %u); this is shard %u. "
             "Send it there: through the proxy, a reservation over several tubes needs them all on one shard",
             (int)len, name, (long long)owner, e->shard_count - 1, e->shard_count, e->shard_index);
    return gw_reply_problem(r->conn, 421, "WRONG_SHARD", detail);
}

static int not_found(struct gw_request *r, const char *what)
{
    return gw_reply_problem(r->conn, 404, "NOT_FOUND", what);
}

/* A job with its body, as JSON or raw bytes per Accept. */
static int reply_job_with_body(struct gw_request *r, const struct bg_job *j, const char *token)
{
    if (gw_wants_raw(r)) return gw_reply_raw_job(r->conn, j, token);
    return gw_reply_json(r->conn, 200, gw_json_job(r->gw->engine, j, r->gw->now(), token, 1), NULL);
}

/* ---- put --------------------------------------------------------------- */

static const char *const state_names[] = {"ready", "delayed", "reserved", "buried"};

/* The state a job entered when it was put (a waiting reserver may have
 * taken it at once). */
static const char *put_state(struct gateway *gw, uint64_t id)
{
    struct bg_job *j = bg_job_find(gw->engine, id);
    return j ? state_names[j->state] : "reserved";
}

/* A tube name that is JSON string text as it is: printable ASCII without
 * a quote or a backslash (every name the beanstalk rules allow). */
static int json_plain(const char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\') return 0;
    return 1;
}

/* Copy the n bytes of s to p; returns the end. */
static char *put_text(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* Write v in decimal at p (at most 20 bytes); returns the end. */
static char *put_decimal_u64(char *p, uint64_t v)
{
    char digits[20];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n) *p++ = digits[--n];
    return p;
}

#define PUT_TEXT(p, literal) put_text(p, literal, sizeof literal - 1)

/* 201 with Location for a put in state; replayed: an idempotent replay
 * (state is the first answer's). The usual answer is written directly,
 * without snprintf: the bytes, key order included, that jansson makes
 * for the object below (the hot path of HTTP put). */
static int reply_put(struct gw_request *r, uint64_t id, const char *tube, const char *state,
                     int replayed)
{
    char location[32], *l = PUT_TEXT(location, "/jobs/");
    *put_decimal_u64(l, id) = '\0';
    size_t tube_len = strlen(tube);
    if (!replayed && json_plain(tube) && tube_len <= BG_TUBE_NAME_MAX) {
        char text[64 + BG_TUBE_NAME_MAX], *p = PUT_TEXT(text, "{\"id\":");
        p = put_decimal_u64(p, id);
        p = PUT_TEXT(p, ",\"tube\":\"");
        p = put_text(p, tube, tube_len);
        p = PUT_TEXT(p, "\",\"state\":\"");
        p = put_text(p, state, strlen(state)); /* a state name: under 10 bytes */
        p = PUT_TEXT(p, "\"}\n");
        return gw_reply_json_text(r->conn, 201, text, (size_t)(p - text), location, NULL, NULL);
    }
    json_t *v = json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "tube", tube, "state", state);
    if (!replayed) return gw_reply_json(r->conn, 201, v, location);
    return gw_reply_json_header(r->conn, 201, v, location, "Idempotent-Replayed", "true");
}

static int bad_idempotency_key(struct gw_request *r)
{
    return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "Idempotency-Key must be 1-128 visible ASCII characters");
}

/* A put, under an Idempotency-Key or not. */
struct put_outcome {
    enum gw_idempotency_match match; /* GW_IDEM_NEW without a key */
    int rc;                       /* GW_IDEM_NEW: 0 (stored) or an engine outcome */
    uint64_t id;                  /* stored, or the first put's (GW_IDEM_SAME) */
    const char *state;            /* its state then */
};

/* Put req (key may be NULL). A key seen in the window with the same request
 * answers the first job again; with another request it stores nothing. */
static void put_with_key(struct gateway *gw, const struct gw_put_request *req, const char *key,
                         bg_time now, struct put_outcome *out)
{
    uint64_t position = 0;
    out->match = key ? gw_idempotency_lookup(gw->idempotency, key, req, now, &out->id, &out->state, &position)
                     : GW_IDEM_NEW;
    out->rc = 0;
    if (out->match == GW_IDEM_SAME) bg_engine_depends_on(gw->engine, position); /* a replay: the original's */
    if (out->match != GW_IDEM_NEW) return;
    if (gw->engine->draining) {
        out->rc = BG_DRAINING;
        return;
    }
    out->rc = bg_put_copy(&gw->holder, req->tube, req->pri, req->delay_s, req->ttr_s, req->body,
                          (uint32_t)req->len, now, &out->id);
    if (out->rc != 0) return;
    out->state = put_state(gw, out->id);
    if (key) /* best effort */
        gw_idempotency_remember(gw->idempotency, key, req, out->id, out->state, gw->engine->reply_pos, now);
}

#define IDEMPOTENCY_KEY_MISMATCH "IDEMPOTENCY_KEY_MISMATCH"

/* Why a key does not fit a put (GW_IDEM_OTHER_TUBE or _REQUEST). */
static const char *key_mismatch_detail(enum gw_idempotency_match match)
{
    return match == GW_IDEM_OTHER_TUBE
               ? "this Idempotency-Key was used in the last 300 s for a put into another tube; "
                 "nothing was stored: a new job needs a new key"
               : "this Idempotency-Key was used in the last 300 s for a put with another body, "
                 "priority, delay or ttr; nothing was stored: a new job needs a new key";
}

int gw_handle_put(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    const char *tube = r->match.seg[1];
    uint64_t pri = GW_DEFAULT_PRIORITY, delay = 0, ttr = GW_DEFAULT_TTR;
    if (!bg_tube_name_valid(tube, strlen(tube))) return bad_tube(r);
    int64_t owner = other_shard(gw, tube, strlen(tube));
    if (owner >= 0) return wrong_shard(r, tube, strlen(tube), owner);
    if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
    if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
    if (gw_query_u64(r, "ttr", UINT32_MAX, &ttr)) return bad_param(r, "ttr");
    if (r->body_too_big || r->body.len > gw->engine->max_job_size) return BG_JOB_TOO_BIG;
    const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (key && !gw_idempotency_valid_key(key)) return bad_idempotency_key(r);
    struct gw_put_request req = {tube, (uint32_t)pri, (uint32_t)delay, (uint32_t)ttr,
                                 bg_buf_head(&r->body), r->body.len};
    struct put_outcome out;
    put_with_key(gw, &req, key, r->dispatched, &out);
    switch (out.match) {
    case GW_IDEM_SAME: return reply_put(r, out.id, tube, out.state, 1);
    case GW_IDEM_OTHER_TUBE:
    case GW_IDEM_OTHER_REQUEST:
        return gw_reply_problem(r->conn, 422, IDEMPOTENCY_KEY_MISMATCH, key_mismatch_detail(out.match));
    case GW_IDEM_NEW:
        break;
    }
    if (out.rc != 0) return out.rc;
    return reply_put(r, out.id, tube, out.state, 0);
}

/* The result object of a batch entry that failed with an engine outcome. */
static json_t *entry_problem(int outcome)
{
    struct gw_problem p = gw_outcome_problem(outcome);
    return json_pack("{s:i, s:s, s:s}", "status", (int)p.status, "code", p.code, "detail", p.detail);
}

/* One entry of a batch put: the result object for it. key (or NULL) is
 * the entry's own idempotency key, "KEY#i", bound to the entry's own
 * fields: an entry stored under it in the window is answered again
 * instead of being stored twice, and another entry under it is refused. */
static json_t *batch_put_one(struct gateway *gw, const char *tube, json_t *entry, const char *key,
                             bg_time now)
{
    json_int_t pri = GW_DEFAULT_PRIORITY, delay = 0, ttr = GW_DEFAULT_TTR;
    const char *text = NULL, *b64 = NULL;
    size_t text_len = 0, b64_len = 0;
    json_error_t err;
    if (!json_is_object(entry) ||
        json_unpack_ex(entry, &err, JSON_STRICT, "{s?s%, s?s%, s?I, s?I, s?I}", "body", &text,
                       &text_len, "body_base64", &b64, &b64_len, "priority", &pri, "delay",
                       &delay, "ttr", &ttr) != 0 ||
        !text == !b64 || pri < 0 || pri > UINT32_MAX || delay < 0 || delay > UINT32_MAX ||
        ttr < 0 || ttr > UINT32_MAX)
        return json_pack("{s:i, s:s, s:s}", "status", 400, "code", "BAD_FORMAT", "detail",
                         "each entry needs exactly one of body or body_base64, and "
                         "priority, delay, ttr as unsigned 32-bit integers");
    char *decoded = NULL;
    size_t n = text_len;
    if (b64) {
        int bad;
        decoded = gw_base64_decode(b64, b64_len, &n, &bad);
        if (!decoded && !bad) return entry_problem(BG_OUT_OF_MEMORY);
        if (!decoded)
            return json_pack("{s:i, s:s, s:s}", "status", 400, "code", "BAD_FORMAT", "detail",
                             "body_base64 must be standard base64 (RFC 4648): A-Z a-z 0-9 + /, "
                             "padded with = to a multiple of 4 characters, no spaces or line "
                             "breaks, the unused bits of the last character zero");
        text = decoded;
    }
    json_t *result = NULL;
    if (n > gw->engine->max_job_size) {
        result = entry_problem(BG_JOB_TOO_BIG);
    } else {
        struct gw_put_request req = {tube, (uint32_t)pri, (uint32_t)delay, (uint32_t)ttr, text, n};
        struct put_outcome out;
        put_with_key(gw, &req, key, now, &out);
        switch (out.match) {
        case GW_IDEM_SAME:
            result = json_pack("{s:i, s:I, s:s, s:s, s:b}", "status", 201, "id", (json_int_t)out.id,
                               "tube", tube, "state", out.state, "replayed", 1);
            break;
        case GW_IDEM_OTHER_TUBE:
        case GW_IDEM_OTHER_REQUEST:
            result = json_pack("{s:i, s:s, s:s}", "status", 422, "code", IDEMPOTENCY_KEY_MISMATCH,
                               "detail", key_mismatch_detail(out.match));
            break;
        case GW_IDEM_NEW:
            result = out.rc == 0
                ? json_pack("{s:i, s:I, s:s, s:s}", "status", 201, "id", (json_int_t)out.id, "tube",
                            tube, "state", out.state)
                : entry_problem(out.rc);
            break;
        }
    }
    free(decoded);
    return result;
}

int gw_handle_batch_put(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    const char *tube = r->match.seg[1];
    if (!bg_tube_name_valid(tube, strlen(tube))) return bad_tube(r);
    int64_t owner = other_shard(gw, tube, strlen(tube));
    if (owner >= 0) return wrong_shard(r, tube, strlen(tube), owner);
    if (r->body_too_big) return BG_JOB_TOO_BIG;
    json_error_t err;
    json_t *doc = json_loadb(bg_buf_head(&r->body), r->body.len, 0, &err);
    if (!doc) {
        char detail[384];
        snprintf(detail, sizeof detail,
                 "the body is not JSON that beangate reads (line %d, column %d: %s); integers "
                 "anywhere in it must be within -9223372036854775808..9223372036854775807",
                 err.line, err.column, err.text);
        for (char *c = detail; *c; c++) /* jansson quotes the bytes near the error */
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
    }
    json_t *jobs = json_object_get(doc, "jobs");
    if (!json_is_array(jobs) || json_array_size(jobs) == 0 || json_array_size(jobs) > GW_BATCH_MAX) {
        json_decref(doc);
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                "send {\"jobs\": [...]} with 1 to 100 entries");
    }
    const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (key && !gw_idempotency_valid_key(key)) {
        json_decref(doc);
        return bad_idempotency_key(r);
    }
    /* with a key, entries stored before are answered again while draining;
     * new ones get 503 DRAINING each */
    if (gw->engine->draining && !key) {
        r->commands = (uint32_t)json_array_size(jobs); /* as many puts refused */
        json_decref(doc);
        return BG_DRAINING;
    }
    bg_time now = gw->now();
    json_t *results = json_array();
    size_t i;
    json_t *entry;
    char entry_key[GW_IDEMPOTENCY_STORED_MAX + 1];
    r->commands = 0; /* each entry is a put, unless malformed (400) or too big (413) */
    json_array_foreach(jobs, i, entry) {
        if (key) snprintf(entry_key, sizeof entry_key, "%s#%zu", key, i);
        json_t *result = batch_put_one(gw, tube, entry, key ? entry_key : NULL, now);
        json_int_t entry_status = json_integer_value(json_object_get(result, "status"));
        if (entry_status != 400 && entry_status != 413) r->commands++;
        json_array_append_new(results, result);
    }
    json_decref(doc);
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "results", results), NULL);
}

/* ---- reserve (long-poll) ---------------------------------------------- */

/* Take j from the waiter into the holder and remember it for the reply. */
static void take_job(struct gw_request *r, struct bg_job *j)
{
    struct gateway *gw = r->gw;
    if (bg_heap_reserve(&gw->holder.reserved, gw->holder.reserved.len + 1) != 0) return;
    bg_reservation_transfer(j, &gw->holder);
    r->job_ids[r->got] = j->id;
    r->job_reserves[r->got] = bg_job_reserves(j);
    r->got++;
}

static void waiter_job_reserved(struct bg_client *c, struct bg_job *j)
{
    struct gw_request *r = c->owner;
    take_job(r, j);
    gw_unlist(r);
    gw_wake(r);
}

static void waiter_wait_ended(struct bg_client *c, int outcome)
{
    struct gw_request *r = c->owner;
    r->wait_outcome = outcome;
    gw_unlist(r);
    gw_wake(r);
}

/* Asked by the engine right before it hands the waiter a job. */
static int waiter_alive(struct bg_client *c) { return gw_peer_alive(c->owner); }

static const struct bg_client_ops waiter_ops = {waiter_job_reserved, waiter_wait_ended, waiter_alive};

/* DELETE /clients/{id} of a waiting long-poll: it ends as if timed out
 * (204, or the jobs it got), and leaves the listing at once. */
static void waiter_close_now(struct bg_client *c, bg_time now)
{
    (void)now;
    bg_client_unlist(c);
    if (!c->waiting) return; /* its answer is on its way already */
    bg_client_stop_waiting(c);
    waiter_wait_ended(c, BG_TIMED_OUT);
}

/* Reply with what the long-poll got: 204, one job, or a batch. */
static int reply_reserved(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    bg_time now = gw->now();
    /* jobs available right now top up a batch */
    while (r->want > r->got) {
        struct bg_job *j = NULL;
        if (bg_reserve(&r->waiter, 0, now, &j) != 0) break;
        take_job(r, j);
    }
    if (r->got == 0) return gw_reply_empty(r->conn, 204);
    char token[BG_TOKEN_MAX];
    if (r->want == 0) {
        struct bg_job *j = bg_job_find(gw->engine, r->job_ids[0]);
        if (!j) return gw_reply_empty(r->conn, 204);
        bg_token_make(&gw->key, j->id, bg_job_reserves(j), token);
        return reply_job_with_body(r, j, token);
    }
    json_t *jobs = json_array();
    for (uint32_t i = 0; i < r->got; i++) {
        struct bg_job *j = bg_job_find(gw->engine, r->job_ids[i]);
        if (!j) continue;
        bg_token_make(&gw->key, j->id, bg_job_reserves(j), token);
        json_array_append_new(jobs, gw_json_job(gw->engine, j, now, token, 1));
    }
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "jobs", jobs), NULL);
}

/* Start a long-poll on a comma-separated list of tubes, or answer the
 * resumed one. */
static int reserve(struct gw_request *r, const char *tubes)
{
    struct gateway *gw = r->gw;
    if (r->waiter_active) { /* resumed */
        if (!gw_peer_alive(r)) {
            /* the client left after the engine's last look: its jobs go
             * back, and nothing is taken for it */
            gw_give_back(r, gw->now());
            return gw_reply_empty(r->conn, 204);
        }
        return reply_reserved(r);
    }
    uint64_t timeout = 0, count = 0;
    if (gw_query_u64(r, "timeout", UINT32_MAX, &timeout)) return bad_param(r, "timeout");
    if (gw_query_u64(r, "count", GW_BATCH_MAX, &count) || (gw_query(r, "count") && count == 0)) {
        char detail[64];
        snprintf(detail, sizeof detail, "query parameter 'count' must be 1 to %d", GW_BATCH_MAX);
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
    }
    if (timeout > gw->cfg.max_wait_s) timeout = gw->cfg.max_wait_s;
    if (!tubes || !*tubes) return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "name at least one tube");
    /* validate every name (empty ones included) before touching the engine */
    char names[2048];
    if (strlen(tubes) >= sizeof names) return bad_tube(r);
    int n = 0;
    const char *elsewhere = NULL; /* the first tube of another shard */
    size_t elsewhere_len = 0;
    int64_t owner = -1;
    for (const char *t = tubes;; n++) {
        const char *comma = strchr(t, ',');
        size_t len = comma ? (size_t)(comma - t) : strlen(t);
        if (!bg_tube_name_valid(t, len)) return bad_tube(r);
        /* a scoped token may consume from every tube of ?tubes= (the
         * path's tube was checked before the handler) */
        int refused;
        if (r->match.route->tube == GW_TUBE_QUERY && !gw_scope_permits(r, t, len, &refused))
            return refused;
        if (owner < 0 && (owner = other_shard(gw, t, len)) >= 0) elsewhere = t, elsewhere_len = len;
        if (!comma) break;
        t = comma + 1;
    }
    n++;
    if (n == 0 || n > 64) return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "name 1 to 64 tubes");
    if (elsewhere) return wrong_shard(r, elsewhere, elsewhere_len, owner);
    if (bg_client_init_bare(gw->engine, &r->waiter, &waiter_ops, r) != 0) return BG_OUT_OF_MEMORY;
    r->waiter_active = 1;
    gw_list_client(r, &r->waiter, waiter_close_now);
    r->want = (uint32_t)count;
    strcpy(names, tubes);
    uint32_t watching;
    for (char *save = NULL, *t = strtok_r(names, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (bg_client_watch(&r->waiter, t, &watching) != 0) return BG_OUT_OF_MEMORY;
    struct bg_job *j = NULL;
    int rc = bg_reserve(&r->waiter, (int64_t)timeout, gw->now(), &j);
    if (rc == 0) {
        take_job(r, j);
        return reply_reserved(r);
    }
    if (rc == BG_WOULD_BLOCK) {
        gw_suspend(r);
        return 0;
    }
    if (rc == BG_TIMED_OUT) return reply_reserved(r);
    return rc;
}

/* POST /tubes/{tube}/reservations */
int gw_handle_tube_reserve(struct gw_request *r) { return reserve(r, r->match.seg[1]); }

/* POST /reservations?tubes=a,b */
int gw_handle_reserve(struct gw_request *r)
{
    /* the query too was unescaped with %2F left as is */
    const char *tubes = gw_query(r, "tubes");
    char decoded[2048];
    if (tubes && strlen(tubes) < sizeof decoded) {
        strcpy(decoded, tubes);
        gw_decode_segment(decoded);
        tubes = decoded;
    }
    return reserve(r, tubes);
}

/* ---- jobs -------------------------------------------------------------- */

/* The 409 of a request that job j's state refuses (outcome, an enum
 * gw_conflict), with a detail that names the job, its state and who holds
 * it. `action` is what was asked ("delete", "release", ...). A job reserved
 * by another client is never answered with a hint to give a token. */
static int conflict(struct gw_request *r, const struct bg_job *j, int outcome, const char *action)
{
    struct gateway *gw = r->gw;
    char detail[320];
    unsigned long long id = (unsigned long long)j->id;
    const char *state = state_names[j->state];
    int by_push = j->state == BG_JOB_RESERVED && gw->push.owns && gw->push.owns(gw->push.arg, bg_job_reserver(j));
    const char *holder = j->state != BG_JOB_RESERVED ? NULL
                       : bg_job_reserver(j) == &gw->holder ? "over HTTP"
                       : by_push ? "by push delivery (an attempt is in flight)"
                                 : "by a beanstalk or Gearman client";
    switch (outcome) {
    case GW_RESERVED_ELSEWHERE:
        snprintf(detail, sizeof detail,
                 by_push ? "job %llu is reserved %s: only push delivery can %s it; wait until the "
                           "attempt ends"
                         : "job %llu is reserved %s: only that client can %s it (HTTP has no token "
                           "for it); it is free again when the client releases it or its TTR runs out",
                 id, holder, action);
        break;
    case GW_RESERVATION_REQUIRED:
        snprintf(detail, sizeof detail,
                 "job %llu is reserved over HTTP: to %s it, give the token of that reservation "
                 "(header X-Reservation: TOKEN, or ?reservation=TOKEN)", id, action);
        break;
    case GW_RESERVATION_MISMATCH:
        if (j->state == BG_JOB_RESERVED)
            snprintf(detail, sizeof detail,
                     "job %llu is reserved under another token: this one is wrong, or its "
                     "reservation has ended (TTR ran out, released, reserved again)", id);
        else
            snprintf(detail, sizeof detail,
                     "the reservation of this token has ended: job %llu is %s now", id, state);
        break;
    case GW_NOT_RESERVED:
        snprintf(detail, sizeof detail,
                 "job %llu is %s, not reserved: only a reserved job can be released, buried or "
                 "touched", id, state);
        break;
    case GW_NOT_BURIED_OR_DELAYED:
        snprintf(detail, sizeof detail, "job %llu is %s%s%s: only a buried or delayed job can be kicked",
                 id, state, holder ? " " : "", holder ? holder : "");
        break;
    case GW_ALREADY_RESERVED:
        snprintf(detail, sizeof detail, "job %llu is already reserved %s", id, holder ? holder : "");
        break;
    default:
        return gw_reply_outcome(r->conn, outcome);
    }
    return gw_reply_outcome_detail(r->conn, outcome, detail);
}

/* May the request `action` job j as the holder of its reservation? 0 if
 * so; else a reply was queued into *reply: 400 for a token given twice
 * (two different ones) or empty, or the 409 that says why not.
 * need_reserved: the action needs a reserved job (a ready, delayed or
 * buried job is deleted without a token). A token given for a job not
 * reserved under it is refused (409) even where none is needed: it says "I
 * hold this job", and a worker whose reservation ended learns so instead
 * of deleting a job that may be running elsewhere. */
static int check_reservation(struct gw_request *r, struct bg_job *j, int need_reserved,
                             const char *action, int *reply)
{
    struct gateway *gw = r->gw;
    const char *token;
    if (gw_reservation_token(r, &token) != 0) {
        *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                  "the X-Reservation header and ?reservation= differ: give the token once");
        return -1;
    }
    if (token && !*token) {
        *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                  "the reservation token is empty: give the token a reservation "
                                  "returned, or none");
        return -1;
    }
    int outcome = 0;
    if (j->state == BG_JOB_RESERVED && bg_job_reserver(j) != &gw->holder)
        outcome = GW_RESERVED_ELSEWHERE;
    else if (!token && j->state == BG_JOB_RESERVED)
        outcome = GW_RESERVATION_REQUIRED;
    else if (!token)
        outcome = need_reserved ? GW_NOT_RESERVED : 0;
    else if (j->state != BG_JOB_RESERVED || bg_token_check(&gw->key, token, j->id, bg_job_reserves(j)) != 0)
        outcome = GW_RESERVATION_MISMATCH;
    if (outcome) *reply = conflict(r, j, outcome, action);
    return outcome ? -1 : 0;
}

/* The job of a /jobs/{id} path, or NULL after queuing 400 (not an id), 404
 * (no such job, or one of a tube the token cannot see) or 403 (the token
 * may not do the row's kind on its tube) into *reply. */
static struct bg_job *path_job(struct gw_request *r, int *reply)
{
    const char *text = r->match.seg[1];
    uint64_t id = 0;
    if (bg_parse_u64(text, strlen(text), UINT64_MAX, &id) != 0) {
        *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT", "job ids are unsigned 64-bit integers");
        return NULL;
    }
    struct bg_job *j = bg_job_find(r->gw->engine, id);
    const char *tube = j ? j->tube->name : NULL;
    int hidden = j && !gw_scope_sees(r, tube, strlen(tube));
    if (!j || hidden) {
        r->gw->engine->stat.permission_denied += (uint64_t)hidden; /* counted as a refusal */
        *reply = not_found(r, "no such job");
        return NULL;
    }
    return gw_scope_permits(r, tube, strlen(tube), reply) ? j : NULL;
}

/* 200 with the job's state after an action (no body). */
static int reply_job(struct gw_request *r, uint64_t id)
{
    struct gateway *gw = r->gw;
    return gw_reply_json(r->conn, 200, gw_json_job(gw->engine, bg_job_find(gw->engine, id), gw->now(),
                                                   NULL, 0), NULL);
}

/* Job j as GET /jobs/{id} shows it: its statistics, its body too if
 * with_body, and its last push delivery failure (last_delivery_error) when
 * push delivery knows one. NULL: out of memory. */
static json_t *job_view(struct gw_request *r, const struct bg_job *j, bg_time now, int with_body)
{
    struct gateway *gw = r->gw;
    json_t *v = gw_json_job(gw->engine, j, now, NULL, with_body);
    json_t *failure = gw->push.job_error ? gw->push.job_error(gw->push.arg, j->id) : NULL;
    if (v && failure) json_object_set_new(v, "last_delivery_error", failure);
    else json_decref(failure);
    return v;
}

/* GET (and HEAD) /jobs/{id}: the job's view (job_view), no body. HEAD
 * never deletes. */
int gw_handle_job(struct gw_request *r)
{
    int reply;
    struct bg_job *j = path_job(r, &reply);
    if (!j) return reply;
    return gw_reply_json(r->conn, 200, job_view(r, j, r->gw->now(), 0), NULL);
}

/* DELETE /jobs/{id}: with its token when the job is reserved. */
int gw_handle_job_delete(struct gw_request *r)
{
    int reply;
    struct bg_job *j = path_job(r, &reply);
    if (!j || check_reservation(r, j, 0, "delete", &reply)) return reply;
    int rc = bg_delete(&r->gw->holder, j->id, r->gw->now());
    return rc == 0 ? gw_reply_empty(r->conn, 204) : rc;
}

/* GET /jobs/{id}/body: the raw bytes (peek). */
int gw_handle_job_body(struct gw_request *r)
{
    int reply;
    struct bg_job *j = path_job(r, &reply);
    return j ? gw_reply_raw_job(r->conn, j, NULL) : reply;
}

/* POST /jobs/{id}/kick: a buried or delayed job becomes ready. */
int gw_handle_job_kick(struct gw_request *r)
{
    int reply;
    struct bg_job *j = path_job(r, &reply);
    if (!j) return reply;
    if (bg_kick_job(r->gw->engine, j->id, r->gw->now()) != 0)
        return conflict(r, j, GW_NOT_BURIED_OR_DELAYED, "kick");
    return reply_job(r, j->id);
}

/* POST /jobs/{id}/reservations: reserve this job, whatever its tube. */
int gw_handle_job_reserve(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    int reply;
    struct bg_job *j = path_job(r, &reply);
    if (!j) return reply;
    if (j->state == BG_JOB_RESERVED) return conflict(r, j, GW_ALREADY_RESERVED, "reserve");
    int rc = bg_reserve_job(&gw->holder, j->id, gw->now(), &j);
    if (rc != 0) return rc;
    char token[BG_TOKEN_MAX];
    bg_token_make(&gw->key, j->id, bg_job_reserves(j), token);
    return reply_job_with_body(r, j, token);
}

/* The job of a release, bury or touch (action): the path's, reserved under
 * the request's token; NULL after a reply was queued into *reply. */
static struct bg_job *reserved_job(struct gw_request *r, const char *action, int *reply)
{
    struct bg_job *j = path_job(r, reply);
    return j && check_reservation(r, j, 1, action, reply) == 0 ? j : NULL;
}

/* The job's state after a release, bury or touch that returned rc. */
static int reply_action(struct gw_request *r, uint64_t id, int rc)
{
    return rc != 0 ? rc : reply_job(r, id);
}

/* POST /jobs/{id}/release?priority=&delay= */
int gw_handle_job_release(struct gw_request *r)
{
    int reply;
    struct bg_job *j = reserved_job(r, "release", &reply);
    if (!j) return reply;
    uint64_t pri = j->pri, delay = 0;
    if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
    if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
    return reply_action(r, j->id, bg_release(&r->gw->holder, j->id, (uint32_t)pri, (uint32_t)delay,
                                             r->gw->now()));
}

/* POST /jobs/{id}/bury?priority= */
int gw_handle_job_bury(struct gw_request *r)
{
    int reply;
    struct bg_job *j = reserved_job(r, "bury", &reply);
    if (!j) return reply;
    uint64_t pri = j->pri;
    if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
    return reply_action(r, j->id, bg_bury(&r->gw->holder, j->id, (uint32_t)pri, r->gw->now()));
}

/* POST /jobs/{id}/touch */
int gw_handle_job_touch(struct gw_request *r)
{
    int reply;
    struct bg_job *j = reserved_job(r, "touch", &reply);
    if (!j) return reply;
    return reply_action(r, j->id, bg_touch(&r->gw->holder, j->id, r->gw->now()));
}

/* ---- tubes and stats --------------------------------------------------- */

/* The tube of a /tubes/{tube} path, or NULL after queuing 400 (bad name)
 * or 404 (no such tube) into *reply. */
static struct bg_tube *path_tube(struct gw_request *r, int *reply)
{
    const char *name = r->match.seg[1];
    if (!bg_tube_name_valid(name, strlen(name))) {
        *reply = bad_tube(r);
        return NULL;
    }
    struct bg_tube *t = bg_tube_find(r->gw->engine, name);
    if (!t) *reply = not_found(r, "no such tube");
    return t;
}

/* A rate per second to two decimals: finer says nothing over 10 seconds. */
static double rate_hundredths(double r)
{
    return (double)(uint64_t)(r * 100 + 0.5) / 100;
}

/* Tube t's object of GET /tubes/{tube} and GET /stats/tubes: its stats
 * and its rates (core/history.c). */
static json_t *tube_json(struct gateway *gw, const struct bg_tube *t, bg_time now)
{
    struct bg_stats_tube st;
    bg_stats_tube(t, now, &st);
    double put, del;
    bg_tube_rates(&gw->history, t, now, &put, &del);
    json_t *v = gw_json_tube(&st);
    if (v)
        json_object_set_new(v, "rates", json_pack("{s:f, s:f}", "put", rate_hundredths(put), "delete",
                                                  rate_hundredths(del)));
    return v;
}

/* 200 with tube t's stats. */
static int reply_tube(struct gw_request *r, struct bg_tube *t)
{
    return gw_reply_json(r->conn, 200, tube_json(r->gw, t, r->gw->now()), NULL);
}

/* GET /tubes/{tube} */
int gw_handle_tube(struct gw_request *r)
{
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    return t ? reply_tube(r, t) : reply;
}

/* ---- a tube's jobs, and bulk actions on them (issue 26) ----------------- */

/* The state ?state= names into *state: 0; else a 400 naming the states
 * `allowed` (a bit per enum bg_job_state) was queued into *reply. Absent
 * is refused too: every route that reads it needs it. */
static int query_state(struct gw_request *r, unsigned allowed, enum bg_job_state *state, int *reply)
{
    const char *text = gw_query(r, "state");
    for (int s = 0; text && s < 4; s++)
        if ((allowed & (1u << s)) && strcmp(text, state_names[s]) == 0) {
            *state = (enum bg_job_state)s;
            return 0;
        }
    char detail[320];
    size_t o = (size_t)snprintf(detail, sizeof detail, "query parameter 'state' %s one of:",
                                text ? "must be" : "is required,");
    for (int s = 0, n = 0; s < 4; s++)
        if (allowed & (1u << s))
            o += (size_t)snprintf(detail + o, sizeof detail - o, "%s %s", n++ ? "," : "", state_names[s]);
    if (text && strcmp(text, "reserved") == 0)
        snprintf(detail + o, sizeof detail - o,
                 " (a reserved job belongs to the client that reserved it: it may only be "
                 "deleted one at a time, DELETE /jobs/{id})");
    *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
    return -1;
}

/* How many jobs tube t holds in `state` now. */
static uint64_t jobs_in_state(const struct bg_tube *t, enum bg_job_state state, bg_time now)
{
    struct bg_stats_tube st;
    bg_stats_tube(t, now, &st);
    return state == BG_JOB_READY ? st.ready : state == BG_JOB_DELAYED ? st.delayed
         : state == BG_JOB_RESERVED ? st.reserved : st.buried;
}

/* A page cursor as text ("KEY.ID", decimal: opaque to clients) and back:
 * 0, or -1 if text is not one. */
#define CURSOR_TEXT_MAX 48
static void cursor_text(struct bg_job_cursor c, char out[CURSOR_TEXT_MAX])
{
    snprintf(out, CURSOR_TEXT_MAX, "%llu.%llu", (unsigned long long)c.key, (unsigned long long)c.id);
}

static int cursor_parse(const char *text, struct bg_job_cursor *c)
{
    const char *dot = strchr(text, '.');
    if (!dot) return -1;
    return bg_parse_u64(text, (size_t)(dot - text), UINT64_MAX, &c->key) == 0 &&
           bg_parse_u64(dot + 1, strlen(dot + 1), UINT64_MAX, &c->id) == 0 ? 0 : -1;
}

/* GET /tubes/{tube}/jobs?state=&limit=&cursor=&body=: one page of the
 * tube's jobs in one state, in the order the engine serves them, after
 * the cursor; `next` continues after the last (null at the end). One more
 * job than the page is read to tell whether there are more. */
int gw_handle_tube_jobs(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    if (!t) return reply;
    enum bg_job_state state;
    if (query_state(r, 0xf, &state, &reply) != 0) return reply;
    uint64_t limit = GW_JOB_PAGE_DEFAULT, body = 0;
    if (gw_query_limit(r, GW_JOB_PAGE_MAX, &limit, &reply)) return reply;
    if (gw_query_u64(r, "body", 1, &body))
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "query parameter 'body' must be 0 or 1");
    struct bg_job_cursor cursor = {0, 0};
    const char *given = gw_query(r, "cursor");
    if (given && cursor_parse(given, &cursor) != 0)
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                "query parameter 'cursor' must be the 'next' of a page of this tube "
                                "and state, as it was given");
    struct bg_job *page[GW_JOB_PAGE_MAX + 1];
    size_t n = bg_tube_jobs(t, state, &cursor, page, (size_t)limit + 1);
    int more = n > limit;
    if (more) n = (size_t)limit;
    bg_time now = gw->now();
    json_t *jobs = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(jobs, job_view(r, page[i], now, body == 1));
    char next[CURSOR_TEXT_MAX];
    if (more) cursor_text(bg_job_cursor_of(page[n - 1]), next);
    return gw_reply_json(r->conn, 200,
                         json_pack("{s:s, s:s, s:I, s:o, s:s?}", "tube", t->name, "state",
                                   state_names[state], "count", (json_int_t)jobs_in_state(t, state, now),
                                   "jobs", jobs, "next", more ? next : NULL),
                         NULL);
}

/* ?bound=: at most this many jobs, N (0 to 2^32-1) or "all", into *bound
 * (left as it is when absent). 0, or -1 after a 400 was queued into *reply. */
static int query_bound(struct gw_request *r, uint64_t *bound, int *reply)
{
    const char *text = gw_query(r, "bound");
    if (text && strcmp(text, "all") == 0) {
        *bound = UINT64_MAX;
        return 0;
    }
    if (gw_query_u64(r, "bound", UINT32_MAX, bound) == 0) return 0;
    *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                              "query parameter 'bound' must be 'all' or 0 to 4294967295");
    return -1;
}

/* The answer of a bulk action that finished: {"kicked":n}, or
 * {"deleted":n,"state":S}, once the log holds it. One that was cut short
 * (the server stops, no memory for its next step, its client left) is 503
 * INTERRUPTED naming what it did. */
static int reply_bulk(struct gw_request *r)
{
    struct gw_bulk *b = &r->bulk;
    struct bg_engine *e = r->gw->engine;
    gw_bulk_end(r);
    if (b->mark > e->reply_pos) e->reply_pos = b->mark; /* the answer waits for the log */
    if (b->left > 0) {
        char detail[200];
        snprintf(detail, sizeof detail,
                 "the bulk %s stopped after %llu jobs (they are in the log) because the server "
                 "is stopping or out of memory; the other jobs were not touched: retry",
                 b->action == GW_BULK_KICK ? "kick" : "delete", (unsigned long long)b->done);
        return gw_reply_problem(r->conn, 503, "INTERRUPTED", detail);
    }
    json_t *v = b->action == GW_BULK_KICK
              ? json_pack("{s:I}", "kicked", (json_int_t)b->done)
              : json_pack("{s:I, s:s}", "deleted", (json_int_t)b->done, "state", state_names[b->state]);
    return gw_reply_json(r->conn, 200, v, NULL);
}

/* Kick or delete up to bound jobs of tube t in `state` (bulk.c): at most
 * as many as it holds in that state now, so that a bulk action ends even
 * while jobs keep entering the state. Answered now, or once it finishes. */
static int start_bulk(struct gw_request *r, struct bg_tube *t, enum gw_bulk_action action,
                      enum bg_job_state state, uint64_t bound)
{
    uint64_t there = jobs_in_state(t, state, r->gw->now());
    if (gw_bulk_start(r, action, state, bound < there ? bound : there) == 0) return 0;
    return reply_bulk(r);
}

/* POST /tubes/{tube}/kick?state=buried|delayed&bound=N|all: without state,
 * beanstalk's rule (its buried jobs if it has any, else its delayed ones).
 * bound: 1 by default. */
int gw_handle_tube_kick(struct gw_request *r)
{
    if (r->bulk.active) return reply_bulk(r); /* resumed */
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    if (!t) return reply;
    enum bg_job_state state = jobs_in_state(t, BG_JOB_BURIED, r->gw->now()) ? BG_JOB_BURIED : BG_JOB_DELAYED;
    if (gw_query(r, "state") &&
        query_state(r, 1u << BG_JOB_BURIED | 1u << BG_JOB_DELAYED, &state, &reply) != 0)
        return reply;
    uint64_t bound = 1;
    if (query_bound(r, &bound, &reply) != 0) return reply;
    return start_bulk(r, t, GW_BULK_KICK, state, bound);
}

/* DELETE /tubes/{tube}/jobs?state=ready|delayed|buried&bound=N|all (all by
 * default). It counts one cmd-delete per job deleted (bulk.c), none for
 * the request itself (its route counts in no counter). */
int gw_handle_tube_jobs_delete(struct gw_request *r)
{
    if (r->bulk.active) return reply_bulk(r); /* resumed */
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    if (!t) return reply;
    enum bg_job_state state;
    unsigned deletable = 1u << BG_JOB_READY | 1u << BG_JOB_DELAYED | 1u << BG_JOB_BURIED;
    if (query_state(r, deletable, &state, &reply) != 0) return reply;
    uint64_t bound = UINT64_MAX;
    if (query_bound(r, &bound, &reply) != 0) return reply;
    return start_bulk(r, t, GW_BULK_DELETE, state, bound);
}

/* POST /tubes/{tube}/pause?delay= */
int gw_handle_tube_pause(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    if (!t) return reply;
    uint64_t delay = 0;
    if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
    int rc = bg_pause_tube(gw->engine, t->name, (uint32_t)delay, gw->now());
    if (rc != 0) return rc;
    return reply_tube(r, t);
}

/* Answer a peek: job j (NULL: 404) with its body. */
static int reply_peek(struct gw_request *r, const struct bg_job *j)
{
    if (!j) return not_found(r, "no job in that state in this tube");
    return reply_job_with_body(r, j, NULL);
}

/* GET /tubes/{tube}/ready */
int gw_handle_peek_ready(struct gw_request *r)
{
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    return t ? reply_peek(r, bg_peek(t, BG_JOB_READY)) : reply;
}

/* GET /tubes/{tube}/delayed */
int gw_handle_peek_delayed(struct gw_request *r)
{
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    return t ? reply_peek(r, bg_peek(t, BG_JOB_DELAYED)) : reply;
}

/* GET /tubes/{tube}/buried */
int gw_handle_peek_buried(struct gw_request *r)
{
    int reply;
    struct bg_tube *t = path_tube(r, &reply);
    return t ? reply_peek(r, bg_peek(t, BG_JOB_BURIED)) : reply;
}

/* GET /tubes: the tubes the token sees */
int gw_handle_tubes(struct gw_request *r)
{
    struct bg_engine *e = r->gw->engine;
    json_t *names = json_array();
    for (uint32_t i = 0; i < e->tube_count; i++) {
        const char *name = e->tube_list[i]->name;
        if (gw_scope_sees(r, name, strlen(name))) json_array_append_new(names, json_string(name));
    }
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "tubes", names), NULL);
}

/* The query of GET /stats/tubes into q: 0, or a 400 BAD_FORMAT that names
 * the parameter was queued into *reply. filter is decoded into
 * filter_buf (it was unescaped with %2F left as is). */
static int tube_page_query(struct gw_request *r, struct gw_tube_page_query *q,
                           char *filter_buf, size_t filter_size, int *reply)
{
    uint64_t limit = GW_TUBE_PAGE_DEFAULT;
    *q = (struct gw_tube_page_query){NULL, -1, 0, 0, GW_TUBE_PAGE_DEFAULT, r->scope};
    const char *detail = NULL;
    char sort_detail[400];
    const char *sort = gw_query(r, "sort"), *order = gw_query(r, "order"), *filter = gw_query(r, "filter");
    if (gw_query_u64(r, "offset", UINT32_MAX, &q->offset)) {
        *reply = bad_param(r, "offset");
        return -1;
    }
    if (gw_query_limit(r, GW_TUBE_PAGE_MAX, &limit, reply)) return -1;
    if (sort && (q->sort = gw_tube_sort_key(sort)) < 0) {
        size_t o = (size_t)snprintf(sort_detail, sizeof sort_detail, "query parameter 'sort' must be one of:");
        for (int i = 0; gw_tube_sort_key_name(i) && o < sizeof sort_detail; i++)
            o += (size_t)snprintf(sort_detail + o, sizeof sort_detail - o, "%s %s", i ? "," : "",
                                  gw_tube_sort_key_name(i));
        detail = sort_detail;
    } else if (order && strcmp(order, "asc") != 0 && strcmp(order, "desc") != 0) {
        detail = "query parameter 'order' must be asc or desc";
    } else if (order && !sort) {
        detail = "query parameter 'order' needs 'sort'";
    } else if (filter) {
        if (strlen(filter) < filter_size) {
            strcpy(filter_buf, filter);
            gw_decode_segment(filter_buf);
            q->filter = filter_buf;
        }
        if (!q->filter || !gw_tube_filter_valid(q->filter))
            detail = "query parameter 'filter' must be at most 200 characters of A-Za-z0-9-+/;.$_()";
    }
    if (detail) {
        *reply = gw_reply_problem(r->conn, 400, "BAD_FORMAT", detail);
        return -1;
    }
    q->limit = (uint32_t)limit;
    q->descending = order && strcmp(order, "desc") == 0;
    return 0;
}

/* GET /stats/tubes: one page of the tubes' statistics (tube_page.c). */
int gw_handle_stats_tubes(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    struct gw_tube_page_query q;
    char filter[BG_TUBE_NAME_MAX * 3 + 1]; /* room for a name all of "%2F" */
    int reply;
    if (tube_page_query(r, &q, filter, sizeof filter, &reply) != 0) return reply;
    const struct bg_tube *page[GW_TUBE_PAGE_MAX];
    uint32_t n;
    uint64_t total;
    bg_time now = gw->now();
    int rc = gw_tube_page(gw->engine, now, &q, page, &n, &total);
    if (rc != 0) return rc;
    json_t *tubes = json_array();
    for (uint32_t i = 0; i < n; i++) json_array_append_new(tubes, tube_json(gw, page[i], now));
    return gw_reply_json(r->conn, 200,
                         json_pack("{s:I, s:I, s:I, s:o}", "total", (json_int_t)total, "offset",
                                   (json_int_t)q.offset, "limit", (json_int_t)q.limit, "tubes", tubes),
                         NULL);
}

/* GET /stats/history: the server's last minutes (core/history.c), each
 * series oldest first; `end` is the newest sample's second in Unix time. */
int gw_handle_stats_history(struct gw_request *r)
{
    const struct bg_history *h = &r->gw->history;
    uint64_t mono_s = r->gw->now() / BG_SECOND, wall_s = loop_wall_now() / BG_SECOND;
    uint64_t behind = mono_s > h->second ? mono_s - h->second : 0;
    struct bg_buf out = {0};
    uint64_t values[BG_HISTORY_SAMPLES];
    int rc = bg_buf_printf(&out, "{\"interval\":1,\"end\":%llu,\"series\":{",
                           (unsigned long long)(wall_s - behind));
    for (int s = 0; s < BG_HISTORY_SERIES && rc == 0; s++) {
        uint32_t n = bg_history_series(h, (enum bg_history_series)s, values);
        rc = bg_buf_printf(&out, "%s\"%s\":[", s ? "," : "", bg_history_series_names[s]);
        for (uint32_t i = 0; i < n && rc == 0; i++)
            rc = bg_buf_printf(&out, i ? ",%llu" : "%llu", (unsigned long long)values[i]);
        if (rc == 0) rc = bg_buf_append(&out, "]", 1);
    }
    if (rc == 0) rc = bg_buf_append(&out, "}}\n", 3);
    if (rc != 0) {
        bg_buf_free(&out);
        return BG_OUT_OF_MEMORY;
    }
    rc = gw_reply_json_text(r->conn, 200, bg_buf_head(&out), out.len, NULL, NULL, NULL);
    bg_buf_free(&out);
    return rc;
}

/* The push subscriptions as a JSON array (empty without push delivery),
 * those of tubes r's token sees. */
static json_t *push_list(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    json_t *list = gw->push.subscriptions ? gw->push.subscriptions(gw->push.arg) : NULL;
    if (!list) return json_array();
    for (size_t i = json_array_size(list); r->scope && i-- > 0;) {
        const char *tube = json_string_value(json_object_get(json_array_get(list, i), "tube"));
        if (!tube || !gw_scope_sees(r, tube, strlen(tube))) json_array_remove(list, i);
    }
    return list;
}

/* GET /stats: the server's figures (whole-server counts, for any token),
 * and the subscriptions of the tubes the token sees. */
int gw_handle_stats(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    struct bg_process_info pi = {0};
    pi.binlog_sync_age_ms = -1;
    if (gw->cfg.process_info) gw->cfg.process_info(gw->cfg.log_arg, &pi);
    json_t *v = gw_json_server(gw->engine, &pi, gw_open_connections(r));
    if (v) json_object_set_new(v, "subscriptions", push_list(r));

    return gw_reply_json(r->conn, 200, v, NULL);
}

/* GET /subscriptions: push delivery's subscriptions ({"subscriptions": []}
 * without push delivery), of the tubes the token sees. */
int gw_handle_subscriptions(struct gw_request *r)
{
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "subscriptions", push_list(r)), NULL);
}

/* GET /openapi.yaml: the document compiled in. */
int gw_handle_openapi(struct gw_request *r)
{
    return gw_reply_bytes(r->conn, 200, gw_openapi_yaml, gw_openapi_yaml_len, 0, "application/yaml",
                          NULL, NULL);
}

/* ---- what the token may do ------------------------------------------- */

/* The kinds of mask (bit 1 << enum bg_scope_kind each) as a JSON array of
 * their names. */
static json_t *kind_names(unsigned mask)
{
    json_t *kinds = json_array();
    for (int k = 0; k < BG_SCOPE_KINDS; k++)
        if (mask & (1u << k))
            json_array_append_new(kinds, json_string(bg_scope_kind_name((enum bg_scope_kind)k)));
    return kinds;
}

/* An unscoped token's one grant: every kind on every tube ("*"). */
static json_t *grant_of_everything(void)
{
    return json_pack("{s:o, s:[s]}", "kinds", kind_names((1u << BG_SCOPE_KINDS) - 1), "tubes", "*");
}

/* The scope's grants as the access file wrote them: [{kinds, tubes}] with
 * tube patterns (names, prefixes ending in *, * for all), one entry per run
 * of rules with the same kinds (a grant's tubes are such a run). Unscoped:
 * every kind on "*". */
static json_t *scope_patterns(const struct bg_scope *scope)
{
    json_t *out = json_array();
    if (!scope) {
        json_array_append_new(out, grant_of_everything());
        return out;
    }
    json_t *tubes = NULL;
    unsigned last = 0;
    for (size_t i = 0; i < bg_scope_rule_count(scope); i++) {
        char pattern[BG_TUBE_NAME_MAX + 2];
        unsigned kinds = bg_scope_rule(scope, i, pattern);
        if (!tubes || kinds != last) {
            tubes = json_array();
            json_array_append_new(out, json_pack("{s:o, s:o}", "kinds", kind_names(kinds), "tubes", tubes));
            last = kinds;
        }
        json_array_append_new(tubes, json_string(pattern));
    }
    return out;
}

/* GET /auth: what the presented token may do, for the dashboard to hide
 * what it may not. `grants`: an unscoped token (or none, with no token
 * configured) has one grant of every kind on every tube ("*"); a scoped
 * one, a grant for each set of kinds it has on the tubes that exist now,
 * with those tubes. `patterns`: its grants as the access file wrote them,
 * prefixes included, which also cover the tubes made later. */
int gw_handle_auth(struct gw_request *r)
{
    const unsigned all = (1u << BG_SCOPE_KINDS) - 1;
    json_t *grants = json_array();
    if (!r->scope) {
        json_array_append_new(grants, grant_of_everything());
    } else {
        struct bg_engine *e = r->gw->engine;
        json_t *by_mask[1u << BG_SCOPE_KINDS] = {0};
        for (uint32_t i = 0; i < e->tube_count; i++) {
            const char *name = e->tube_list[i]->name;
            unsigned mask = 0;
            for (int k = 0; k < BG_SCOPE_KINDS; k++)
                if (bg_scope_allows(r->scope, (enum bg_scope_kind)k, name, strlen(name))) mask |= 1u << k;
            if (!mask) continue;
            if (!by_mask[mask]) by_mask[mask] = json_array();
            json_array_append_new(by_mask[mask], json_string(name));
        }
        for (unsigned mask = all; mask > 0; mask--)
            if (by_mask[mask])
                json_array_append_new(grants, json_pack("{s:o, s:o}", "kinds", kind_names(mask), "tubes",
                                                        by_mask[mask]));
    }
    return gw_reply_json(r->conn, 200,
                         json_pack("{s:b, s:b, s:o, s:o}", "authenticated", r->authenticated, "scoped",
                                   r->scope != NULL, "grants", grants, "patterns", scope_patterns(r->scope)),
                         NULL);
}

/* routes.c - one handler per HTTP route. Handlers parse, call the engine,
 * and queue one response; http.c owns the daemon. Reservations made over
 * HTTP belong to the gateway's holder client and are named by tokens
 * (core/token.c), so they outlive the request that made them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int not_found(struct gw_request *r, const char *what)
{
    return gw_reply_problem(r->conn, 404, "NOT_FOUND", what);
}

/* A job with its body, as JSON or raw bytes per Accept. */
static int reply_job_with_body(struct gw_request *r, const struct bg_job *j,
                                           const char *token)
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

/* {id, tube, state} of a put job. */
static json_t *put_result(struct gateway *gw, uint64_t id, const char *tube)
{
    return json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "tube", tube, "state", put_state(gw, id));
}

/* 201 with Location for a put; replayed_state is the first answer's state
 * when this is an idempotent replay, else NULL. */
static int reply_put(struct gw_request *r, uint64_t id, const char *tube,
                                 const char *replayed_state)
{
    char location[48];
    snprintf(location, sizeof location, "/jobs/%llu", (unsigned long long)id);
    if (!replayed_state) return gw_reply_json(r->conn, 201, put_result(r->gw, id, tube), location);
    json_t *v = json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "tube", tube, "state", replayed_state);
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
    out->match = key ? gw_idempotency_lookup(gw->idempotency, key, req, now, &out->id, &out->state)
                     : GW_IDEM_NEW;
    out->rc = 0;
    if (out->match != GW_IDEM_NEW) return;
    if (gw->engine->draining) {
        out->rc = BG_DRAINING;
        return;
    }
    out->rc = bg_put_copy(&gw->holder, req->tube, req->pri, req->delay_s, req->ttr_s, req->body,
                          (uint32_t)req->len, now, &out->id);
    if (out->rc == BG_BURIED) out->rc = 0;
    if (out->rc != 0) return;
    out->state = put_state(gw, out->id);
    if (key) gw_idempotency_remember(gw->idempotency, key, req, out->id, out->state, now); /* best effort */
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

static int route_put(struct gw_request *r, const char *tube)
{
    struct gateway *gw = r->gw;
    uint64_t pri = GW_DEFAULT_PRIORITY, delay = 0, ttr = GW_DEFAULT_TTR;
    if (!bg_tube_name_valid(tube, strlen(tube))) return bad_tube(r);
    if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
    if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
    if (gw_query_u64(r, "ttr", UINT32_MAX, &ttr)) return bad_param(r, "ttr");
    if (r->body_too_big || r->body.len > gw->engine->max_job_size) return gw_reply_outcome(r->conn, BG_JOB_TOO_BIG);
    const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (key && !gw_idempotency_valid_key(key)) return bad_idempotency_key(r);
    struct gw_put_request req = {tube, (uint32_t)pri, (uint32_t)delay, (uint32_t)ttr,
                                 bg_buf_head(&r->body), r->body.len};
    struct put_outcome out;
    put_with_key(gw, &req, key, gw->now(), &out);
    switch (out.match) {
    case GW_IDEM_SAME: return reply_put(r, out.id, tube, out.state);
    case GW_IDEM_OTHER_TUBE:
    case GW_IDEM_OTHER_REQUEST:
        return gw_reply_problem(r->conn, 422, IDEMPOTENCY_KEY_MISMATCH, key_mismatch_detail(out.match));
    case GW_IDEM_NEW:
        break;
    }
    if (out.rc != 0) return gw_reply_outcome(r->conn, out.rc);
    return reply_put(r, out.id, tube, NULL);
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
        decoded = gw_base64_decode(b64, b64_len, &n);
        if (!decoded)
            return json_pack("{s:i, s:s, s:s}", "status", 400, "code", "BAD_FORMAT", "detail",
                             "body_base64 is not valid base64");
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

static int route_batch_put(struct gw_request *r, const char *tube)
{
    struct gateway *gw = r->gw;
    if (!bg_tube_name_valid(tube, strlen(tube))) return bad_tube(r);
    if (r->body_too_big) return gw_reply_outcome(r->conn, BG_JOB_TOO_BIG);
    json_error_t err;
    json_t *doc = json_loadb(bg_buf_head(&r->body), r->body.len, 0, &err);
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
        return gw_reply_outcome(r->conn, BG_DRAINING);
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
    r->job_reserves[r->got] = j->reserves;
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

const struct bg_client_ops gw_waiter_ops = {waiter_job_reserved, waiter_wait_ended, waiter_alive};

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
        bg_token_make(&gw->key, j->id, j->reserves, token);
        return reply_job_with_body(r, j, token);
    }
    json_t *jobs = json_array();
    for (uint32_t i = 0; i < r->got; i++) {
        struct bg_job *j = bg_job_find(gw->engine, r->job_ids[i]);
        if (!j) continue;
        bg_token_make(&gw->key, j->id, j->reserves, token);
        json_array_append_new(jobs, gw_json_job(gw->engine, j, now, token, 1));
    }
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "jobs", jobs), NULL);
}

/* Start a long-poll on a comma-separated list of tubes. */
static int route_reserve(struct gw_request *r, const char *tubes)
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
    if (gw_query_u64(r, "count", GW_BATCH_MAX, &count) || (gw_query(r, "count") && count == 0))
        return bad_param(r, "count");
    if (timeout > GW_MAX_WAIT_S) timeout = GW_MAX_WAIT_S;
    if (!tubes || !*tubes) return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "name at least one tube");
    /* validate every name (empty ones included) before touching the engine */
    char names[2048];
    if (strlen(tubes) >= sizeof names) return bad_tube(r);
    int n = 0;
    for (const char *t = tubes;; n++) {
        const char *comma = strchr(t, ',');
        size_t len = comma ? (size_t)(comma - t) : strlen(t);
        if (!bg_tube_name_valid(t, len)) return bad_tube(r);
        if (!comma) break;
        t = comma + 1;
    }
    n++;
    if (n == 0 || n > 64) return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "name 1 to 64 tubes");
    if (bg_client_init_bare(gw->engine, &r->waiter, &gw_waiter_ops, r) != 0)
        return gw_reply_outcome(r->conn, BG_OUT_OF_MEMORY);
    r->waiter_active = 1;
    r->want = (uint32_t)count;
    strcpy(names, tubes);
    uint32_t watching;
    for (char *save = NULL, *t = strtok_r(names, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (bg_client_watch(&r->waiter, t, &watching) != 0) return gw_reply_outcome(r->conn, BG_OUT_OF_MEMORY);
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
    return gw_reply_outcome(r->conn, rc);
}

/* ---- jobs -------------------------------------------------------------- */

/* Check the reservation token for an action on job j. 0 if the request may
 * act on j as the holder; otherwise a reply was queued into *reply. */
static int check_reservation(struct gw_request *r, struct bg_job *j, int need_reserved,
                             int *reply)
{
    struct gateway *gw = r->gw;
    const char *token = gw_query(r, "reservation");
    if (j->state != BG_JOB_RESERVED && !token && !need_reserved) return 0;
    if (!token) {
        *reply = gw_reply_problem(r->conn, 409, "RESERVATION_REQUIRED",
                                  j->state == BG_JOB_RESERVED
                                      ? "the job is reserved: pass ?reservation=TOKEN"
                                      : "the job is not reserved");
        return -1;
    }
    if (j->state != BG_JOB_RESERVED || j->reserver != &gw->holder ||
        bg_token_check(&gw->key, token, j->id, j->reserves) != 0) {
        *reply = gw_reply_problem(r->conn, 409, "RESERVATION_MISMATCH",
                                  "the reservation token is wrong or has expired");
        return -1;
    }
    return 0;
}

/* 405 for a method the route does not have, with its Allow header. */
static int method_not_allowed(struct gw_request *r, const struct gw_match *m)
{
    char detail[96];
    snprintf(detail, sizeof detail, "allowed: %s", m->allow);
    return gw_reply_problem_header(r->conn, 405, "METHOD_NOT_ALLOWED", detail, "Allow", m->allow);
}

/* /jobs/{id} and /jobs/{id}/{action}. */
static int route_job(struct gw_request *r, const struct gw_match *m)
{
    const char *id_text = m->seg[1];
    const char *action = m->nseg > 2 ? m->seg[2] : NULL;
    struct gateway *gw = r->gw;
    uint64_t id = 0;
    for (const char *p = id_text; *p; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (*p < '0' || *p > '9' || id > (UINT64_MAX - d) / 10) {
            id_text = "";
            break;
        }
        id = id * 10 + d;
    }
    if (!*id_text)
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "job ids are unsigned 64-bit integers");
    struct bg_job *j = bg_job_find(gw->engine, id);
    if (!j) return not_found(r, "no such job");
    bg_time now = gw->now();
    int reply;
    uint64_t pri = j->pri, delay = 0;
    if (!action) {
        switch (m->method) {
        case GW_GET:
        case GW_HEAD: /* HEAD is GET without the body: it never deletes */
            return gw_reply_json(r->conn, 200, gw_json_job(gw->engine, j, now, NULL, 0), NULL);
        case GW_DELETE: {
            if (check_reservation(r, j, 0, &reply)) return reply;
            int rc = bg_delete(&gw->holder, id, now);
            return rc == 0 ? gw_reply_empty(r->conn, 204) : gw_reply_outcome(r->conn, rc);
        }
        case GW_POST:
        case GW_OTHER:
            break;
        }
        return method_not_allowed(r, m);
    }
    if (strcmp(action, "body") == 0) return gw_reply_raw_job(r->conn, j, NULL);
    if (strcmp(action, "kick") == 0) {
        int rc = bg_kick_job(gw->engine, id, now);
        if (rc != 0) return gw_reply_problem(r->conn, 409, "NOT_FOUND", "only buried or delayed jobs can be kicked");
        return gw_reply_json(r->conn, 200, gw_json_job(gw->engine, j, now, NULL, 0), NULL);
    }
    if (strcmp(action, "reservations") == 0) {
        int rc = bg_reserve_job(&gw->holder, id, now, &j);
        if (rc != 0) return gw_reply_problem(r->conn, 409, "NOT_FOUND", "the job is already reserved");
        char token[BG_TOKEN_MAX];
        bg_token_make(&gw->key, j->id, j->reserves, token);
        return reply_job_with_body(r, j, token);
    }
    if (check_reservation(r, j, 1, &reply)) return reply;
    int rc;
    if (strcmp(action, "release") == 0) {
        if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
        if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
        rc = bg_release(&gw->holder, id, (uint32_t)pri, (uint32_t)delay, now);
    } else if (strcmp(action, "bury") == 0) {
        if (gw_query_u64(r, "priority", UINT32_MAX, &pri)) return bad_param(r, "priority");
        rc = bg_bury(&gw->holder, id, (uint32_t)pri, now);
    } else if (strcmp(action, "touch") == 0) {
        rc = bg_touch(&gw->holder, id, now);
    } else {
        return not_found(r, "no such route");
    }
    if (rc != 0 && rc != BG_BURIED) return gw_reply_outcome(r->conn, rc);
    j = bg_job_find(gw->engine, id);
    return gw_reply_json(r->conn, 200, gw_json_job(gw->engine, j, now, NULL, 0), NULL);
}

/* ---- tubes and stats --------------------------------------------------- */

static int route_tube(struct gw_request *r, const char *name, const char *action)
{
    struct gateway *gw = r->gw;
    if (!bg_tube_name_valid(name, strlen(name))) return bad_tube(r);
    struct bg_tube *t = bg_tube_find(gw->engine, name);
    if (!t) return not_found(r, "no such tube");
    bg_time now = gw->now();
    if (!action) {
        struct bg_stats_tube st;
        bg_stats_tube(t, now, &st);
        return gw_reply_json(r->conn, 200, gw_json_tube(&st), NULL);
    }
    if (strcmp(action, "kick") == 0) {
        uint64_t bound = 1;
        if (gw_query_u64(r, "bound", UINT32_MAX, &bound)) return bad_param(r, "bound");
        uint64_t n = bg_kick(gw->engine, t, bound, now);
        return gw_reply_json(r->conn, 200, json_pack("{s:I}", "kicked", (json_int_t)n), NULL);
    }
    if (strcmp(action, "pause") == 0) {
        uint64_t delay = 0;
        if (gw_query_u64(r, "delay", UINT32_MAX, &delay)) return bad_param(r, "delay");
        int rc = bg_pause_tube(gw->engine, name, (uint32_t)delay, now);
        if (rc != 0) return gw_reply_outcome(r->conn, rc);
        struct bg_stats_tube st;
        bg_stats_tube(bg_tube_find(gw->engine, name), now, &st);
        return gw_reply_json(r->conn, 200, gw_json_tube(&st), NULL);
    }
    struct bg_job *j;
    if (strcmp(action, "ready") == 0) j = bg_heap_min(&t->ready);
    else if (strcmp(action, "delayed") == 0) j = bg_heap_min(&t->delayed);
    else if (strcmp(action, "buried") == 0) j = t->buried_head;
    else return not_found(r, "no such route");
    if (!j) return not_found(r, "no job in that state in this tube");
    return reply_job_with_body(r, j, NULL);
}

static int route_list_tubes(struct gw_request *r)
{
    struct bg_engine *e = r->gw->engine;
    json_t *names = json_array();
    for (uint32_t i = 0; i < e->tube_count; i++) json_array_append_new(names, json_string(e->tube_list[i]->name));
    return gw_reply_json(r->conn, 200, json_pack("{s:o}", "tubes", names), NULL);
}

static int reply_openapi(struct gw_request *r)
{
    return gw_reply_bytes(r->conn, 200, gw_openapi_yaml, gw_openapi_yaml_len, 0, "application/yaml",
                          NULL, NULL);
}

/* ---- the cmd-* counters ------------------------------------------------- */

/* The beanstalk command a routed request performs (docs/operations.md,
 * "Command counters"), or -1 for none. */
static int route_command(const struct gw_match *m)
{
    const char *action = m->nseg > 2 ? m->seg[2] : "";
    switch (m->id) {
    case R_STATS: return BG_CMD_STATS;
    case R_TUBES: return BG_CMD_LIST_TUBES;
    case R_TUBE: return BG_CMD_STATS_TUBE;
    case R_TUBE_JOBS:
    case R_TUBE_BATCH: return BG_CMD_PUT;
    case R_TUBE_RESERVE:
    case R_RESERVE: return BG_CMD_RESERVE_WITH_TIMEOUT;
    case R_TUBE_KICK: return BG_CMD_KICK;
    case R_TUBE_PAUSE: return BG_CMD_PAUSE_TUBE;
    case R_TUBE_PEEK:
        return strcmp(action, "ready") == 0     ? BG_CMD_PEEK_READY
             : strcmp(action, "delayed") == 0  ? BG_CMD_PEEK_DELAYED
             : strcmp(action, "buried") == 0   ? BG_CMD_PEEK_BURIED : -1;
    case R_JOB:
        switch (m->method) {
        case GW_GET:
        case GW_HEAD: return BG_CMD_STATS_JOB;
        case GW_DELETE: return BG_CMD_DELETE;
        case GW_POST:
        case GW_OTHER: return -1;
        }
        return -1;
    case R_JOB_BODY: return BG_CMD_PEEK;
    case R_JOB_ACTION:
        return strcmp(action, "release") == 0 ? BG_CMD_RELEASE
             : strcmp(action, "bury") == 0    ? BG_CMD_BURY
             : strcmp(action, "touch") == 0   ? BG_CMD_TOUCH
             : strcmp(action, "kick") == 0    ? BG_CMD_KICK_JOB : -1;
    case R_JOB_RESERVE: return BG_CMD_RESERVE_JOB;
    case R_OPENAPI:
    case R_LIVEZ:
    case R_READYZ:
    case R_METRICS: return -1;
    }
    return -1;
}

/* Count a routed request in the cmd-* counters: once (a resumed long-poll
 * is not counted again), as r->commands commands, unless it was malformed
 * (400) or over a limit (413). */
static void count_request(struct gw_request *r, const struct gw_match *m)
{
    if (r->counted) return;
    r->counted = 1;
    unsigned status = gw_queued_status(r);
    int cmd = route_command(m);
    if (cmd < 0 || status == 400 || status == 413) return;
    bg_count_cmd(r->gw->engine, (enum bg_cmd)cmd, r->commands);
}

/* Run the handler of a routed request. */
static int dispatch(struct gw_request *r, const struct gw_match *m)
{
    char *const *seg = m->seg;
    /* the route reads job states (reservation checks, GET): bring the
     * engine up to now first, whether or not the loop's timer ran */
    bg_engine_catch_up(r->gw->engine, r->gw->now());
    switch (m->id) {
    case R_STATS: {
        struct bg_process_info pi = {0};
        if (r->gw->cfg.process_info) r->gw->cfg.process_info(r->gw->cfg.log_arg, &pi);
        return gw_reply_json(r->conn, 200, gw_json_server(r->gw->engine, &pi), NULL);
    }
    case R_TUBES: return route_list_tubes(r);
    case R_TUBE: return route_tube(r, seg[1], NULL);
    case R_TUBE_JOBS: return route_put(r, seg[1]);
    case R_TUBE_BATCH: return route_batch_put(r, seg[1]);
    case R_OPENAPI: return reply_openapi(r);
    case R_LIVEZ: return gw_reply_livez(r);
    case R_READYZ: return gw_reply_readyz(r);
    case R_METRICS: return gw_reply_metrics(r);
    case R_TUBE_RESERVE: return route_reserve(r, seg[1]);
    case R_TUBE_KICK:
    case R_TUBE_PAUSE:
    case R_TUBE_PEEK: return route_tube(r, seg[1], seg[2]);
    case R_RESERVE: {
        /* the query too was unescaped with %2F left as is */
        const char *tubes = gw_query(r, "tubes");
        char decoded[2048];
        if (tubes && strlen(tubes) < sizeof decoded) {
            strcpy(decoded, tubes);
            gw_decode_slashes(decoded);
            tubes = decoded;
        }
        return route_reserve(r, tubes);
    }
    case R_JOB:
    case R_JOB_BODY:
    case R_JOB_ACTION:
    case R_JOB_RESERVE: return route_job(r, m);
    }
    return not_found(r, "no such route");
}

int gw_route(struct gw_request *r, const char *method, const char *url)
{
    struct gw_match m;
    int status = gw_match_route(method, url, &m);
    if (status == 404) return not_found(r, "no such route");
    if (status == 405) return method_not_allowed(r, &m);
    if (!r->counted) r->commands = 1;
    int rc = dispatch(r, &m);
    count_request(r, &m);
    return rc;
}

/* clients.c - who is connected (issue 26): GET /clients and DELETE
 * /clients/{id} over core/clients.c's listing, and the gateway's own
 * listed clients, its long-polls (gw_list_client). */
#include <stdio.h>
#include <string.h>

#include "gateway.h"
#include "../io/conn.h"

#define CLIENTS_PAGE_DEFAULT 100
#define CLIENTS_PAGE_MAX 500

void gw_list_client(struct gw_request *r, struct bg_client *c, void (*close_now)(struct bg_client *, bg_time))
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct conn_peer peer = {.fd = -1, .tls = r->gw->cfg.tls != NULL};
    conn_peer_address(&peer, info ? info->client_addr : NULL);
    conn_list_client(c, BG_CLIENT_HTTP, &peer, close_now, r->gw->now()); /* the peer's text as io/conn.c's */
}

/* Whole seconds from `from` to now (0 if from is later). */
static json_int_t seconds_since(bg_time from, bg_time now)
{
    return now > from ? (json_int_t)((now - from) / BG_SECOND) : 0;
}

/* A listed client as GET /clients shows it. */
static json_t *client_json(const struct bg_client_entry *x, bg_time now)
{
    const struct bg_client *c = x->client;
    json_t *watching = json_array();
    for (uint32_t i = 0; i < c->watch_len; i++) json_array_append_new(watching, json_string(c->watch_tube[i]->name));
    uint64_t ids[BG_CLIENT_RESERVED_SHOWN];
    size_t shown;
    uint64_t reserved = bg_client_entry_reserved(x, ids, BG_CLIENT_RESERVED_SHOWN, &shown);
    json_t *reserved_ids = json_array();
    for (size_t i = 0; i < shown; i++) json_array_append_new(reserved_ids, json_integer((json_int_t)ids[i]));
    /* a blocked reserve, or a Gearman worker asleep since its last packet (PRE_SLEEP) */
    int waiting = c->waiting || c->sleeping;
    json_t *waiting_for = c->waiting    ? json_integer(seconds_since(c->wait_started, now))
                          : c->sleeping ? json_integer(seconds_since(x->active_at, now))
                                        : json_null();
    return json_pack("{s:I, s:s, s:b, s:o, s:o, s:I, s:I, s:o, s:o, s:I, s:o, s:b, s:o}",
                     "id", (json_int_t)x->id, "protocol", bg_client_protocol_name(x->protocol),
                     "tls", x->tls, "peer", x->peer[0] ? json_string(x->peer) : json_null(),
                     "name", x->name ? json_string(x->name) : json_null(),
                     "age", seconds_since(x->created_at, now), "idle", seconds_since(x->active_at, now),
                     "use", c->use ? json_string(c->use->name) : json_null(), "watching", watching,
                     "reserved", (json_int_t)reserved, "reserved_ids", reserved_ids, "waiting", waiting,
                     "waiting_for", waiting_for);
}

/* GET /clients?limit=N&cursor=C&protocol=P: a page of the listed clients
 * in id order; next is the cursor of the page after (the last id shown). */
int gw_handle_clients(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    uint64_t limit = CLIENTS_PAGE_DEFAULT, after = 0;
    int reply;
    if (gw_query_limit(r, CLIENTS_PAGE_MAX, &limit, &reply)) return reply;
    const char *cursor = gw_query(r, "cursor");
    if (cursor && bg_parse_u64(cursor, strlen(cursor), UINT64_MAX, &after) != 0)
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                "query parameter 'cursor' must be the 'next' of an earlier page");
    enum bg_client_protocol protocol = BG_CLIENT_PROTOCOLS; /* all */
    const char *name = gw_query(r, "protocol");
    if (name && bg_client_protocol_parse(name, strlen(name), &protocol) != 0)
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT",
                                "query parameter 'protocol' must be beanstalk, gearman, http or push");
    struct bg_client_entry *page[CLIENTS_PAGE_MAX];
    int more;
    size_t n = bg_clients_page(gw->engine, protocol, after, page, (size_t)limit, &more);
    bg_time now = gw->now();
    json_t *clients = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(clients, client_json(page[i], now));
    json_t *next = json_null();
    if (more) {
        char text[24];
        snprintf(text, sizeof text, "%llu", (unsigned long long)page[n - 1]->id);
        next = json_string(text);
    }
    return gw_reply_json(r->conn, 200,
                         json_pack("{s:I, s:o, s:o}", "count",
                                   (json_int_t)bg_clients_count(gw->engine, protocol), "clients", clients,
                                   "next", next),
                         NULL);
}

/* DELETE /clients/{id}: close the connection as its peer's hang-up would
 * (a long-poll ends as if timed out); its reservations go back to ready.
 * A push subscription is the configuration's to remove: 409. */
int gw_handle_client_delete(struct gw_request *r)
{
    struct gateway *gw = r->gw;
    const char *text = r->match.seg[1];
    uint64_t id = 0;
    if (bg_parse_u64(text, strlen(text), UINT64_MAX, &id) != 0 || id == 0)
        return gw_reply_problem(r->conn, 400, "BAD_FORMAT", "client ids are unsigned 64-bit integers from 1");
    struct bg_client_entry *x = bg_client_entry_find(gw->engine, id);
    if (!x) return gw_reply_problem(r->conn, 404, "NOT_FOUND", "no such client");
    if (!x->close_now)
        return gw_reply_problem(r->conn, 409, "NOT_CLOSABLE",
                                "a push subscription cannot be closed: it is removed from the configuration "
                                "(--push) and a restart");
    x->close_now(x->client, gw->now()); /* x may be gone after this */
    return gw_reply_empty(r->conn, 204);
}

/* clients.c - who is connected (issue 26): the listed clients of every
 * protocol, by id, for GET /clients and DELETE /clients/{id} (core.h's
 * clients section has the contract).
 *
 * One array per protocol of (id, entry) in ascending id order: a new client
 * always has the highest id, so it is appended. A closed client leaves a
 * hole (its id kept, the entry NULL) so that the array stays sorted without
 * moving anything; once half of an array is holes it is compacted (each
 * live entry learns its new slot), so every close costs O(1) amortised and
 * a page never passes more holes than there are live clients. */
#include <string.h>

#include "core.h"

struct client_slot {
    uint64_t id;
    struct bg_client_entry *entry; /* NULL: a hole */
};

struct client_array {
    struct client_slot *slots;
    uint32_t len, cap, holes;
};

struct bg_client_registry {
    uint64_t next_id;
    struct client_array by_protocol[BG_CLIENT_PROTOCOLS];
};

static const char *const protocol_names[BG_CLIENT_PROTOCOLS] = {"beanstalk", "gearman", "http", "push"};

const char *bg_client_protocol_name(enum bg_client_protocol p)
{
    return (unsigned)p < BG_CLIENT_PROTOCOLS ? protocol_names[p] : "?";
}

int bg_client_protocol_parse(const char *name, size_t len, enum bg_client_protocol *out)
{
    for (int p = 0; p < BG_CLIENT_PROTOCOLS; p++)
        if (strlen(protocol_names[p]) == len && memcmp(protocol_names[p], name, len) == 0) {
            *out = (enum bg_client_protocol)p;
            return 0;
        }
    return BG_BAD_FORMAT;
}

/* Drop a's holes, keeping the order; each entry learns its slot. */
static void array_compact(struct client_array *a)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < a->len; i++) {
        if (!a->slots[i].entry) continue;
        a->slots[kept] = a->slots[i];
        a->slots[kept].entry->slot = kept;
        kept++;
    }
    a->len = kept;
    a->holes = 0;
}

/* The first slot of a whose id is above `after` (a->len if none). */
static uint32_t array_after(const struct client_array *a, uint64_t after)
{
    uint32_t lo = 0, hi = a->len;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a->slots[mid].id <= after) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The first live slot of a from i on (a->len if none). */
static uint32_t array_live(const struct client_array *a, uint32_t i)
{
    while (i < a->len && !a->slots[i].entry) i++;
    return i;
}

struct bg_client_entry *bg_client_list(struct bg_client *c, enum bg_client_protocol p, bg_time now)
{
    struct bg_engine *e = c->engine;
    if ((unsigned)p >= BG_CLIENT_PROTOCOLS || c->listed) return NULL;
    if (!e->registry) {
        e->registry = bg_malloc(sizeof *e->registry);
        if (!e->registry) return NULL;
        memset(e->registry, 0, sizeof *e->registry);
        e->registry->next_id = 1;
    }
    struct client_array *a = &e->registry->by_protocol[p];
    if (a->len == a->cap) {
        if (a->holes >= a->len / 2 && a->holes) {
            array_compact(a);
        } else {
            uint32_t cap = a->cap ? a->cap * 2 : 16;
            struct client_slot *slots = bg_realloc(a->slots, cap * sizeof *slots);
            if (!slots) return NULL;
            a->slots = slots;
            a->cap = cap;
        }
    }
    struct bg_client_entry *x = bg_malloc(sizeof *x);
    if (!x) return NULL;
    memset(x, 0, sizeof *x);
    x->id = e->registry->next_id++;
    x->client = c;
    x->created_at = x->active_at = now;
    x->protocol = (uint8_t)p;
    x->slot = a->len;
    a->slots[a->len].id = x->id;
    a->slots[a->len].entry = x;
    a->len++;
    c->listed = x;
    return x;
}

void bg_client_list_holder(struct bg_client *c, struct bg_client *holder)
{
    if (!c->listed) return;
    c->listed->holder = holder;
    holder->listed = c->listed;
}

void bg_client_unlist(struct bg_client *c)
{
    struct bg_client_entry *x = c->listed;
    if (!x) return;
    if (x->client != c) { /* a holder: the listed client keeps the entry */
        x->holder = NULL;
        c->listed = NULL;
        return;
    }
    struct client_array *a = &c->engine->registry->by_protocol[x->protocol];
    a->slots[x->slot].entry = NULL;
    a->holes++;
    if (x->slot == a->len - 1) { /* the newest leaves no hole behind */
        while (a->len && !a->slots[a->len - 1].entry) a->len--, a->holes--;
    }
    if (a->holes > 8 && a->holes >= a->len / 2) array_compact(a);
    if (x->holder) x->holder->listed = NULL;
    c->listed = NULL;
    bg_free(x);
}

uint64_t bg_job_reserved_by(const struct bg_job *j)
{
    const struct bg_client *c = bg_job_reserver(j);
    return j->state == BG_JOB_RESERVED && c && c->listed ? c->listed->id : 0;
}

struct bg_client_entry *bg_client_entry_find(const struct bg_engine *e, uint64_t id)
{
    if (!e->registry || id == 0) return NULL;
    for (int p = 0; p < BG_CLIENT_PROTOCOLS; p++) {
        const struct client_array *a = &e->registry->by_protocol[p];
        uint32_t i = array_after(a, id - 1);
        if (i < a->len && a->slots[i].id == id) return a->slots[i].entry;
    }
    return NULL;
}

uint64_t bg_clients_count(const struct bg_engine *e, enum bg_client_protocol p)
{
    if (!e->registry) return 0;
    uint64_t n = 0;
    for (int q = 0; q < BG_CLIENT_PROTOCOLS; q++) {
        const struct client_array *a = &e->registry->by_protocol[q];
        if ((unsigned)p >= BG_CLIENT_PROTOCOLS || (int)p == q) n += a->len - a->holes;
    }
    return n;
}

size_t bg_clients_page(const struct bg_engine *e, enum bg_client_protocol p, uint64_t after,
                       struct bg_client_entry **out, size_t max, int *more)
{
    *more = 0;
    if (!e->registry) return 0;
    /* a merge of the protocols' arrays (one of them with a filter) */
    uint32_t at[BG_CLIENT_PROTOCOLS];
    const struct client_array *arrays = e->registry->by_protocol;
    for (int q = 0; q < BG_CLIENT_PROTOCOLS; q++)
        at[q] = (unsigned)p < BG_CLIENT_PROTOCOLS && (int)p != q
                    ? arrays[q].len
                    : array_live(&arrays[q], array_after(&arrays[q], after));
    size_t n = 0;
    for (;;) {
        int best = -1;
        for (int q = 0; q < BG_CLIENT_PROTOCOLS; q++)
            if (at[q] < arrays[q].len && (best < 0 || arrays[q].slots[at[q]].id < arrays[best].slots[at[best]].id))
                best = q;
        if (best < 0) return n;
        if (n == max) {
            *more = 1;
            return n;
        }
        out[n++] = arrays[best].slots[at[best]].entry;
        at[best] = array_live(&arrays[best], at[best] + 1);
    }
}

/* Add c's reservations to *count and their ids to ids[*shown..max). */
static void client_reserved(const struct bg_client *c, uint64_t *count, uint64_t *ids, size_t max,
                            size_t *shown)
{
    if (!c) return;
    *count += c->reserved.len;
    for (const struct bg_job *j = c->reserved_head; j && *shown < max; j = j->next) ids[(*shown)++] = j->id;
}

uint64_t bg_client_entry_reserved(const struct bg_client_entry *x, uint64_t *ids, size_t max, size_t *shown)
{
    uint64_t count = 0;
    *shown = 0;
    client_reserved(x->client, &count, ids, max, shown);
    client_reserved(x->holder, &count, ids, max, shown);
    return count;
}

void bg_clients_free(struct bg_engine *e)
{
    if (!e->registry) return;
    for (int p = 0; p < BG_CLIENT_PROTOCOLS; p++) bg_free(e->registry->by_protocol[p].slots);
    bg_free(e->registry);
    e->registry = NULL;
}

/* idempotency.c - remembers which job a put's Idempotency-Key created, and
 * what that put asked for, for GW_IDEMPOTENCY_WINDOW_S seconds: a retried
 * put returns the first job, and a different put under the same key is
 * told so. Bounded: at most GW_IDEMPOTENCY_MAX keys; the oldest go first.
 * Clients choose the keys, so buckets come from a keyed hash (SipHash
 * under a random key): nobody can aim many keys at one bucket. */
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

struct idem_entry {
    struct idem_entry *hash_next;
    struct idem_entry *older, *newer; /* age order */
    bg_time expires_at;
    uint64_t job_id;
    uint64_t position;          /* the log position the first answer depended on */
    uint64_t fingerprint;       /* of the request (priority, delay, ttr, body) */
    size_t bucket;
    const char *state;          /* the first answer's state (a static string) */
    char tube[BG_TUBE_NAME_MAX + 1];
    char key[GW_IDEMPOTENCY_STORED_MAX + 1];
};

#define BUCKETS 65536

struct gw_idempotency {
    struct idem_entry *buckets[BUCKETS];
    struct idem_entry *oldest, *newest;
    size_t count;
    uint64_t bucket_key[2];     /* buckets of keys */
    uint64_t fingerprint_key[2]; /* fingerprints of requests */
};

size_t gw_idempotency_bucket(const struct gw_idempotency *t, const char *key)
{
    return (size_t)(bg_siphash(t->bucket_key, key, strlen(key)) % BUCKETS);
}

/* A keyed hash of everything a put asks for but its tube (kept whole). */
static uint64_t fingerprint(const struct gw_idempotency *t, const struct gw_put_request *req)
{
    uint64_t body = bg_siphash(t->fingerprint_key, req->body, req->len);
    uint64_t fields[5] = {req->pri, req->delay_s, req->ttr_s, (uint64_t)req->len, body};
    unsigned char buf[sizeof fields];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(fields[i / 8] >> (8 * (i % 8)));
    return bg_siphash(t->fingerprint_key, buf, sizeof buf);
}

struct gw_idempotency *gw_idempotency_new(const uint64_t key[4])
{
    struct gw_idempotency *t = calloc(1, sizeof(struct gw_idempotency));
    if (!t) return NULL;
    memcpy(t->bucket_key, key, sizeof t->bucket_key);
    memcpy(t->fingerprint_key, key + 2, sizeof t->fingerprint_key);
    return t;
}

static void entry_remove(struct gw_idempotency *t, struct idem_entry *e)
{
    struct idem_entry **p = &t->buckets[e->bucket];
    while (*p != e) p = &(*p)->hash_next;
    *p = e->hash_next;
    if (e->older) e->older->newer = e->newer; else t->oldest = e->newer;
    if (e->newer) e->newer->older = e->older; else t->newest = e->older;
    t->count--;
    free(e);
}

/* Drop expired entries (they are in age order, so only from the front). */
static void expire(struct gw_idempotency *t, bg_time now)
{
    while (t->oldest && t->oldest->expires_at <= now) entry_remove(t, t->oldest);
}

int gw_idempotency_valid_key(const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || n > GW_IDEMPOTENCY_KEY_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (key[i] < 0x21 || key[i] > 0x7e) return 0;
    return 1;
}

enum gw_idempotency_match gw_idempotency_lookup(struct gw_idempotency *t, const char *key,
                                                const struct gw_put_request *req, bg_time now,
                                                uint64_t *job_id, const char **state, uint64_t *position)
{
    expire(t, now);
    for (struct idem_entry *e = t->buckets[gw_idempotency_bucket(t, key)]; e; e = e->hash_next) {
        if (strcmp(e->key, key) != 0) continue;
        if (strcmp(e->tube, req->tube) != 0) return GW_IDEM_OTHER_TUBE;
        if (e->fingerprint != fingerprint(t, req)) return GW_IDEM_OTHER_REQUEST;
        *job_id = e->job_id;
        *state = e->state;
        *position = e->position;
        return GW_IDEM_SAME;
    }
    return GW_IDEM_NEW;
}

int gw_idempotency_remember(struct gw_idempotency *t, const char *key,
                            const struct gw_put_request *req, uint64_t job_id, const char *state,
                            uint64_t position, bg_time now)
{
    if (strlen(key) > GW_IDEMPOTENCY_STORED_MAX || strlen(req->tube) > BG_TUBE_NAME_MAX)
        return BG_BAD_FORMAT;
    expire(t, now);
    if (t->count >= GW_IDEMPOTENCY_MAX) entry_remove(t, t->oldest);
    struct idem_entry *e = calloc(1, sizeof *e);
    if (!e) return BG_OUT_OF_MEMORY;
    strcpy(e->key, key);
    strcpy(e->tube, req->tube);
    e->job_id = job_id;
    e->fingerprint = fingerprint(t, req);
    e->state = state;
    e->position = position;
    e->expires_at = now + (bg_time)GW_IDEMPOTENCY_WINDOW_S * BG_SECOND;
    e->bucket = gw_idempotency_bucket(t, key);
    e->hash_next = t->buckets[e->bucket];
    t->buckets[e->bucket] = e;
    e->older = t->newest;
    if (t->newest) t->newest->newer = e; else t->oldest = e;
    t->newest = e;
    t->count++;
    return 0;
}

void gw_idempotency_free(struct gw_idempotency *t)
{
    if (!t) return;
    while (t->oldest) entry_remove(t, t->oldest);
    free(t);
}

/* idempotency.c - remembers which job a put's Idempotency-Key created, for
 * GW_IDEMPOTENCY_WINDOW_S seconds, so a retried put returns the first job.
 * Bounded: at most GW_IDEMPOTENCY_MAX keys; the oldest go first. */
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

struct idem_entry {
    struct idem_entry *hash_next;
    struct idem_entry *older, *newer; /* age order */
    bg_time expires_at;
    uint64_t job_id;
    const char *state;          /* the first answer's state (a static string) */
    char tube[BG_TUBE_NAME_MAX + 1];
    char key[GW_IDEMPOTENCY_STORED_MAX + 1];
};

#define BUCKETS 65536

struct gw_idempotency {
    struct idem_entry *buckets[BUCKETS];
    struct idem_entry *oldest, *newest;
    size_t count;
};

static size_t key_bucket(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return (size_t)(h % BUCKETS);
}

struct gw_idempotency *gw_idempotency_new(void) { return calloc(1, sizeof(struct gw_idempotency)); }

static void entry_remove(struct gw_idempotency *t, struct idem_entry *e)
{
    struct idem_entry **p = &t->buckets[key_bucket(e->key)];
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

int gw_idempotency_find(struct gw_idempotency *t, const char *key, bg_time now,
                        uint64_t *job_id, const char **tube, const char **state)
{
    expire(t, now);
    for (struct idem_entry *e = t->buckets[key_bucket(key)]; e; e = e->hash_next) {
        if (strcmp(e->key, key) == 0) {
            *job_id = e->job_id;
            *tube = e->tube;
            *state = e->state;
            return 0;
        }
    }
    return BG_NOT_FOUND;
}

int gw_idempotency_remember(struct gw_idempotency *t, const char *key, const char *tube,
                            uint64_t job_id, const char *state, bg_time now)
{
    if (strlen(key) > GW_IDEMPOTENCY_STORED_MAX) return BG_BAD_FORMAT;
    expire(t, now);
    if (t->count >= GW_IDEMPOTENCY_MAX) entry_remove(t, t->oldest);
    struct idem_entry *e = calloc(1, sizeof *e);
    if (!e) return BG_OUT_OF_MEMORY;
    strcpy(e->key, key);
    strcpy(e->tube, tube);
    e->job_id = job_id;
    e->state = state;
    e->expires_at = now + (bg_time)GW_IDEMPOTENCY_WINDOW_S * BG_SECOND;
    size_t b = key_bucket(key);
    e->hash_next = t->buckets[b];
    t->buckets[b] = e;
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

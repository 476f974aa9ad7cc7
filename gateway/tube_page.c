/* tube_page.c - one page of the tubes' statistics (GET /stats/tubes), for
 * the dashboard's tubes table at any number of tubes.
 *
 * Without a filter, sort key or scope, a page is a slice of the engine's tube list
 * (the order of GET /tubes): O(limit). With any, every tube is looked at
 * once: the first offset + limit matches in sort order are kept in a
 * bounded heap (O(T log k) for T tubes and k = offset + limit), then those
 * k are sorted. Sorting on the server keeps what the browser gets, and
 * what a poll costs in bytes, at one page whatever T is, and lets "the 100
 * tubes with the most ready jobs" be one request. (docs/performance.md
 * measures it at 10,000 tubes.) */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

/* The sort keys: the TubeStats field names, each a field of the stats
 * model (name sorts by the name itself). */
static const struct {
    const char *name;
    size_t field; /* offset of a uint64_t in struct bg_stats_tube */
} sort_keys[] = {
    {"name", 0},
    {"current_jobs_urgent", offsetof(struct bg_stats_tube, urgent)},
    {"current_jobs_ready", offsetof(struct bg_stats_tube, ready)},
    {"current_jobs_reserved", offsetof(struct bg_stats_tube, reserved)},
    {"current_jobs_delayed", offsetof(struct bg_stats_tube, delayed)},
    {"current_jobs_buried", offsetof(struct bg_stats_tube, buried)},
    {"total_jobs", offsetof(struct bg_stats_tube, total_jobs)},
    {"current_using", offsetof(struct bg_stats_tube, using)},
    {"current_watching", offsetof(struct bg_stats_tube, watching)},
    {"current_waiting", offsetof(struct bg_stats_tube, waiting)},
    {"cmd_delete", offsetof(struct bg_stats_tube, cmd_delete)},
    {"cmd_pause_tube", offsetof(struct bg_stats_tube, cmd_pause)},
    {"pause", offsetof(struct bg_stats_tube, pause_s)},
    {"pause_time_left", offsetof(struct bg_stats_tube, pause_left_s)},
};
#define SORT_KEYS ((int)(sizeof sort_keys / sizeof sort_keys[0]))

int gw_tube_sort_key(const char *name)
{
    for (int i = 0; i < SORT_KEYS; i++)
        if (strcmp(sort_keys[i].name, name) == 0) return i;
    return -1;
}

const char *gw_tube_sort_key_name(int key)
{
    return key >= 0 && key < SORT_KEYS ? sort_keys[key].name : NULL;
}

int gw_tube_filter_valid(const char *filter)
{
    size_t n = strlen(filter);
    if (n > BG_TUBE_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!bg_tube_name_char(filter[i])) return 0;
    return 1;
}

struct keyed {
    uint64_t key; /* descending order: the complement, so that one order serves */
    const struct bg_tube *tube;
};

typedef int (*order_fn)(const void *, const void *);

/* By key, then by name: a stable order between two polls. */
static int by_key(const void *a, const void *b)
{
    const struct keyed *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return strcmp(x->tube->name, y->tube->name);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct keyed *)a)->tube->name, ((const struct keyed *)b)->tube->name);
}

static int by_name_descending(const void *a, const void *b) { return by_name(b, a); }

/* heap[0..n) is a max-heap in `order` (its root the last of the kept):
 * move heap[i] down to its place. */
static void sift_down(struct keyed *heap, size_t n, size_t i, order_fn order)
{
    for (;;) {
        size_t big = i, l = 2 * i + 1, r = l + 1;
        if (l < n && order(&heap[l], &heap[big]) > 0) big = l;
        if (r < n && order(&heap[r], &heap[big]) > 0) big = r;
        if (big == i) return;
        struct keyed tmp = heap[i];
        heap[i] = heap[big];
        heap[big] = tmp;
        i = big;
    }
}

/* Offer x to the heap of the k first: kept if there is room or if it comes
 * before the last of them. */
static void keep_first(struct keyed *heap, size_t *n, size_t k, struct keyed x, order_fn order)
{
    if (*n < k) {
        size_t i = (*n)++;
        heap[i] = x;
        while (i > 0 && order(&heap[(i - 1) / 2], &heap[i]) < 0) {
            struct keyed tmp = heap[i];
            heap[i] = heap[(i - 1) / 2];
            heap[(i - 1) / 2] = tmp;
            i = (i - 1) / 2;
        }
    } else if (k > 0 && order(&x, &heap[0]) < 0) {
        heap[0] = x;
        sift_down(heap, *n, 0, order);
    }
}

int gw_tube_page(const struct bg_engine *e, bg_time now, const struct gw_tube_page_query *q,
                 const struct bg_tube **out, uint32_t *n, uint64_t *total)
{
    int filtered = q->filter && *q->filter;
    *n = 0;
    if (!filtered && !q->scope && q->sort < 0) {
        *total = e->tube_count;
        for (uint64_t i = q->offset; i < e->tube_count && *n < q->limit; i++) out[(*n)++] = e->tube_list[i];
        return 0;
    }
    /* without a sort key, the matches keep list order: take them as they come */
    size_t k = q->offset + q->limit < e->tube_count ? (size_t)(q->offset + q->limit) : e->tube_count;
    struct keyed *kept = malloc((k ? k : 1) * sizeof *kept);
    if (!kept) return BG_OUT_OF_MEMORY;
    order_fn order = q->sort > 0 ? by_key : q->descending ? by_name_descending : by_name;
    size_t m = 0, held = 0;
    struct bg_stats_tube st;
    for (uint32_t i = 0; i < e->tube_count; i++) {
        const struct bg_tube *t = e->tube_list[i];
        if (filtered && !strstr(t->name, q->filter)) continue;
        if (q->scope && !bg_scope_sees(q->scope, t->name, strlen(t->name))) continue;
        m++;
        if (q->sort < 0) {
            if (held < k) kept[held++] = (struct keyed){0, t};
            continue;
        }
        uint64_t key = 0;
        if (q->sort > 0) {
            bg_stats_tube(t, now, &st);
            key = *(const uint64_t *)((const char *)&st + sort_keys[q->sort].field);
            if (q->descending) key = ~key;
        }
        keep_first(kept, &held, k, (struct keyed){key, t}, order);
    }
    if (q->sort >= 0) qsort(kept, held, sizeof *kept, order);
    *total = m;
    for (uint64_t i = q->offset; i < held && *n < q->limit; i++) out[(*n)++] = kept[i].tube;
    free(kept);
    return 0;
}

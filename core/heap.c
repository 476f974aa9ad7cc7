/* heap.c - binary min-heap of pointers; each item stores its own slot so it
 * can be removed from the middle in O(log n). */
#include <string.h>

#include "core.h"

static inline uint32_t *slot_of(const struct bg_heap *h, void *item)
{
    return (uint32_t *)((char *)item + h->slot_offset);
}

static inline void place(struct bg_heap *h, uint32_t i, void *item)
{
    h->items[i] = item;
    *slot_of(h, item) = i;
}

void bg_heap_init(struct bg_heap *h, bg_heap_less_fn less, size_t slot_offset)
{
    h->items = NULL;
    h->len = h->cap = 0;
    h->less = less;
    h->slot_offset = slot_offset;
}

/* Move the item at slot i up until its parent is not greater. */
static void sift_up(struct bg_heap *h, uint32_t i)
{
    void *item = h->items[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!h->less(item, h->items[parent])) break;
        place(h, i, h->items[parent]);
        i = parent;
    }
    place(h, i, item);
}

/* Move the item at slot i down until no child is smaller. */
static void sift_down(struct bg_heap *h, uint32_t i)
{
    void *item = h->items[i];
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= h->len) break;
        if (child + 1 < h->len && h->less(h->items[child + 1], h->items[child])) child++;
        if (!h->less(h->items[child], item)) break;
        place(h, i, h->items[child]);
        i = child;
    }
    place(h, i, item);
}

int bg_heap_push(struct bg_heap *h, void *item)
{
    if (h->len == h->cap) {
        uint32_t cap = h->cap ? h->cap * 2 : 8;
        void **items = bg_realloc(h->items, cap * sizeof *items);
        if (!items) return BG_OUT_OF_MEMORY;
        h->items = items;
        h->cap = cap;
    }
    h->items[h->len] = item;
    sift_up(h, h->len++);
    return 0;
}

void *bg_heap_remove(struct bg_heap *h, uint32_t i)
{
    void *item = h->items[i];
    h->len--;
    if (i < h->len) {
        place(h, i, h->items[h->len]);
        if (i > 0 && h->less(h->items[i], h->items[(i - 1) / 2]))
            sift_up(h, i);
        else
            sift_down(h, i);
    }
    return item;
}

void bg_heap_free(struct bg_heap *h)
{
    bg_free(h->items);
    h->items = NULL;
    h->len = h->cap = 0;
}

int bg_heap_reserve(struct bg_heap *h, uint32_t n)
{
    if (n <= h->cap) return 0;
    uint32_t cap = h->cap ? h->cap : 8;
    while (cap < n) cap *= 2;
    /* not realloc: a reserved heap (job_timers holds room for every job)
     * is mostly empty, and realloc would copy, and so touch, all of its old
     * room; only the items in use are copied */
    void **items = bg_malloc(cap * sizeof *items);
    if (!items) return BG_OUT_OF_MEMORY;
    if (h->len) memcpy(items, h->items, h->len * sizeof *items);
    bg_free(h->items);
    h->items = items;
    h->cap = cap;
    return 0;
}

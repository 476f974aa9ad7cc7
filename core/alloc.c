/* alloc.c - the one allocation wrapper of core/, with fault injection, and
 * the job allocator.
 *
 * Jobs are most of beangate's memory and most of a put's page faults, so
 * they get their own allocator: size classes 8 bytes apart (64 above
 * 1 KiB) up to BG_SLAB_MAX bytes, carved from 2 MiB arenas that are
 * aligned to 2 MiB. A slot carries no header (glibc adds 8 bytes and rounds
 * to 16: a 214-byte job costs 224 bytes there, 216 here). Once a class has
 * more than one arena, its new arenas are madvise(MADV_HUGEPAGE)d: one
 * page fault and one TLB entry per 2 MiB of jobs instead of 512. An arena
 * whose last job is freed goes back to the OS, unless it is the only empty
 * arena of its class. Larger jobs, and every job in sanitizer builds (so that
 * ASan and LeakSanitizer keep watching job lifetimes), use malloc.
 *
 * bg_job_alloc counts as one allocation for bg_alloc_fail_after, exactly as
 * the malloc it replaces did; arenas are not counted. */
#include <stdlib.h>
#include <sys/mman.h>

#include "core.h"

#if defined(__SANITIZE_ADDRESS__)
#define BG_SLAB_DISABLED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define BG_SLAB_DISABLED 1
#endif
#endif

static uint64_t fail_countdown; /* 0: never fail */

/* Returns nonzero if this allocation should fail (fault injection). */
static int should_fail(void)
{
    if (fail_countdown == 0) return 0;
    if (--fail_countdown == 0) return 1;
    return 0;
}

void bg_alloc_fail_after(uint64_t nth) { fail_countdown = nth; }

void *bg_malloc(size_t size)
{
    if (should_fail()) return NULL;
    return malloc(size);
}

void *bg_realloc(void *ptr, size_t size)
{
    if (should_fail()) return NULL;
    return realloc(ptr, size);
}

/* Zeroed memory; large blocks come from fresh pages that stay untouched
 * (and out of RSS) until written. */
void *bg_calloc(size_t count, size_t size)
{
    if (should_fail()) return NULL;
    return calloc(count, size);
}

void bg_free(void *ptr) { free(ptr); }

/* ---- the job allocator -------------------------------------------------- */

#ifndef BG_SLAB_DISABLED

#define ARENA_SIZE ((size_t)2 << 20)
#define SLAB_FINE_MAX 1024                      /* 8-byte classes up to here */
#define SLAB_CLASSES (SLAB_FINE_MAX / 8 + (BG_SLAB_MAX - SLAB_FINE_MAX) / 64)

struct arena {
    struct arena *prev, *next; /* the class's list of arenas with free slots */
    void *free;                /* freed slots, linked through their first word */
    uint32_t bump;             /* offset of the next never-used slot */
    uint32_t live;             /* slots in use */
    uint32_t slot_size;
    uint16_t cls;
    uint8_t listed;            /* on the class's list */
};

#define ARENA_FIRST_SLOT ((sizeof(struct arena) + 15) & ~(size_t)15)

struct slab_class {
    struct arena *avail;       /* arenas with a free slot; allocate from the head */
    uint32_t arenas;           /* arenas of this class, full or not */
    uint32_t empty;            /* arenas with no slot in use (at most one) */
};

static struct slab_class classes[SLAB_CLASSES];

/* The class index of a size (1..BG_SLAB_MAX) and that class's slot size. */
static inline uint32_t slab_class_of(size_t size, uint32_t *slot_size)
{
    if (size <= SLAB_FINE_MAX) {
        uint32_t c = (uint32_t)((size + 7) / 8);
        *slot_size = c * 8;
        return c - 1;
    }
    uint32_t c = (uint32_t)((size - SLAB_FINE_MAX + 63) / 64);
    *slot_size = SLAB_FINE_MAX + c * 64;
    return SLAB_FINE_MAX / 8 - 1 + c;
}

static void avail_push(struct slab_class *k, struct arena *a)
{
    a->prev = NULL;
    a->next = k->avail;
    if (k->avail) k->avail->prev = a;
    k->avail = a;
    a->listed = 1;
}

static void avail_remove(struct slab_class *k, struct arena *a)
{
    if (a->prev) a->prev->next = a->next; else k->avail = a->next;
    if (a->next) a->next->prev = a->prev;
    a->prev = a->next = NULL;
    a->listed = 0;
}

/* A fresh arena, aligned to ARENA_SIZE, for class cls. NULL: no memory. */
static struct arena *arena_new(uint32_t cls, uint32_t slot_size, int huge)
{
    char *raw = mmap(NULL, 2 * ARENA_SIZE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *base = (char *)(((uintptr_t)raw + ARENA_SIZE - 1) & ~(uintptr_t)(ARENA_SIZE - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    if (base + ARENA_SIZE < raw + 2 * ARENA_SIZE)
        munmap(base + ARENA_SIZE, (size_t)(raw + 2 * ARENA_SIZE - (base + ARENA_SIZE)));
#ifdef MADV_HUGEPAGE
    /* the first arena of a class stays on small pages, so that a few jobs
     * of many sizes do not cost 2 MiB each */
    madvise(base, ARENA_SIZE, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)huge;
#endif
    struct arena *a = (struct arena *)base;
    a->prev = a->next = NULL;
    a->free = NULL;
    a->bump = (uint32_t)ARENA_FIRST_SLOT;
    a->live = 0;
    a->slot_size = slot_size;
    a->cls = (uint16_t)cls;
    a->listed = 0;
    return a;
}

#endif /* BG_SLAB_DISABLED */

void *bg_job_alloc(size_t size)
{
    if (should_fail()) return NULL;
#ifndef BG_SLAB_DISABLED
    if (size > 0 && size <= BG_SLAB_MAX) {
        uint32_t slot_size;
        uint32_t cls = slab_class_of(size, &slot_size);
        struct slab_class *k = &classes[cls];
        struct arena *a = k->avail;
        if (!a) {
            a = arena_new(cls, slot_size, k->arenas > 0);
            if (!a) return NULL;
            k->arenas++;
            k->empty++;
            avail_push(k, a);
        }
        void *p;
        if (a->live == 0) k->empty--;
        if (a->free) {
            p = a->free;
            a->free = *(void **)p;
        } else {
            p = (char *)a + a->bump;
            a->bump += slot_size;
        }
        a->live++;
        if (!a->free && a->bump + slot_size > ARENA_SIZE) avail_remove(k, a); /* full */
        return p;
    }
#endif
    return malloc(size);
}

void bg_job_free_sized(void *p, size_t size)
{
    if (!p) return;
#ifndef BG_SLAB_DISABLED
    if (size > 0 && size <= BG_SLAB_MAX) {
        struct arena *a = (struct arena *)((uintptr_t)p & ~(uintptr_t)(ARENA_SIZE - 1));
        struct slab_class *k = &classes[a->cls];
        *(void **)p = a->free;
        a->free = p;
        if (--a->live == 0) {
            if (k->empty > 0) { /* keep one empty arena, so that a put and a
                                 * delete at an arena's edge do not map and
                                 * unmap 2 MiB each time */
                if (a->listed) avail_remove(k, a);
                k->arenas--;
                munmap(a, ARENA_SIZE);
                return;
            }
            k->empty++;
        }
        if (!a->listed) avail_push(k, a);
        return;
    }
#endif
    free(p);
}

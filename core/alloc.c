/* alloc.c - the one allocation wrapper of core/, with fault injection. */
#include <stdlib.h>

#include "core.h"

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

void bg_free(void *ptr) { free(ptr); }

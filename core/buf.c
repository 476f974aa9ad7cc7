/* buf.c - growable byte buffer used for input and reply bytes. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

char *bg_buf_reserve(struct bg_buf *b, size_t n)
{
    if (b->start > 0 && b->start + b->len + n > b->cap) {
        /* slide the live bytes to the front before growing */
        memmove(b->data, b->data + b->start, b->len);
        b->start = 0;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *data = bg_realloc(b->data, cap);
        if (!data) return NULL;
        b->data = data;
        b->cap = cap;
    }
    return b->data + b->start + b->len;
}

int bg_buf_append(struct bg_buf *b, const void *bytes, size_t n)
{
    char *tail = bg_buf_reserve(b, n);
    if (!tail) return BG_OUT_OF_MEMORY;
    memcpy(tail, bytes, n);
    b->len += n;
    return 0;
}

int bg_buf_printf(struct bg_buf *b, const char *fmt, ...)
{
    va_list ap;
    char small[256];
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return BG_INTERNAL_ERROR;
    if ((size_t)n < sizeof small) return bg_buf_append(b, small, (size_t)n);
    char *tail = bg_buf_reserve(b, (size_t)n + 1);
    if (!tail) return BG_OUT_OF_MEMORY;
    va_start(ap, fmt);
    vsnprintf(tail, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void bg_buf_consume(struct bg_buf *b, size_t n)
{
    b->start += n;
    b->len -= n;
    if (b->len == 0) b->start = 0;
}

void bg_buf_clear(struct bg_buf *b)
{
    b->start = 0;
    b->len = 0;
}

void bg_buf_shrink(struct bg_buf *b)
{
    if (b->len == 0) {
        bg_buf_free(b);
        return;
    }
    if (b->cap <= BG_BUF_KEEP || b->len > b->cap / 4) return;
    memmove(b->data, b->data + b->start, b->len);
    b->start = 0;
    size_t cap = b->len * 2 > BG_BUF_KEEP ? b->len * 2 : BG_BUF_KEEP;
    char *data = bg_realloc(b->data, cap);
    if (!data) return; /* it keeps its room */
    b->data = data;
    b->cap = cap;
}

void bg_buf_free(struct bg_buf *b)
{
    bg_free(b->data);
    b->data = NULL;
    b->len = b->start = b->cap = 0;
}

/* fuzz_codec.c - libFuzzer harness for the beanstalk codec and the engine
 * behind it. The input is sent, in chunks whose sizes come from the input
 * itself, on two connections of one engine while time moves forward, so
 * blocking reserves, TTRs, delays and pauses all get exercised. ASan and
 * LeakSanitizer catch memory errors; the asserts catch broken accounting. */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#include <assert.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "core.h"

/* Feed data to s in chunks, ticking the engine between chunks. */
static void feed_chunks(struct bg_engine *e, struct bg_session *s, struct bg_buf *pending,
                        const uint8_t *data, size_t size, bg_time *now)
{
    size_t at = 0;
    while (at < size) {
        size_t chunk = 1 + data[at] % 97;
        if (chunk > size - at) chunk = size - at;
        bg_buf_append(pending, data + at, chunk);
        at += chunk;
        size_t used = bg_session_feed(s, bg_buf_head(pending), pending->len, *now);
        bg_buf_consume(pending, used);
        assert(pending->len < BG_LINE_MAX || s->state == BG_WAITING || s->state == BG_CLOSING);
        bg_buf_clear(&s->out); /* the "socket" took everything */
        *now += (bg_time)(data[at - 1] % 8) * 250000000ull;
        bg_engine_tick(e, *now);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bg_engine e;
    struct bg_session a, b;
    bg_time now = 1000 * BG_SECOND;
    if (bg_engine_init(&e, size && (data[0] & 1) ? 16 : BG_JOB_SIZE_DEFAULT) != 0) return 0;
    if (bg_session_init(&e, &a, NULL, NULL) != 0 || bg_session_init(&e, &b, NULL, NULL) != 0) abort();
    struct bg_buf pa = {0}, pb = {0};
    feed_chunks(&e, &a, &pa, data, size, &now);
    feed_chunks(&e, &b, &pb, data, size, &now);
    bg_session_close(&a, now);
    assert(e.reserved_count == b.client.reserved.len);
    now += 5000000ull * BG_SECOND;
    bg_engine_tick(&e, now);
    bg_session_close(&b, now);
    assert(e.reserved_count == 0 && e.waiting == 0);
    assert(e.ready_count + e.delayed_count + e.buried_count == e.job_count);
    bg_engine_destroy(&e);
    bg_buf_free(&pa);
    bg_buf_free(&pb);
    return 0;
}

/* fuzz_codec.c - libFuzzer harness for the beanstalk codec and the engine
 * behind it. The input is sent, in chunks whose sizes come from the input
 * itself, on two connections of one engine while time moves forward, so
 * blocking reserves, TTRs, delays and pauses all get exercised. Some chunks
 * come after time moved with no tick (as when the loop reads before its
 * timer fires), so the commands must catch up themselves. The first
 * connection may run under a scope (the top three bits of the first byte
 * pick one of fuzz_scopes.h's, or the scope of nothing; 0: unscoped), as a
 * TLS client certificate's identity line gives it (docs/security.md,
 * Scopes); the second is unscoped. ASan and LeakSanitizer catch memory
 * errors; the asserts catch broken accounting and a scope that let
 * through a put it does not allow. */
/* the checks are the point: keep assert() in release builds (NDEBUG) */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "core.h"
#include "fuzz_scopes.h"

/* Commands the engine has executed so far. */
static uint64_t commands_run(const struct bg_engine *e)
{
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof e->stat.cmd / sizeof e->stat.cmd[0]; i++) n += e->stat.cmd[i];
    return n;
}

/* The engine's structural audit must pass. */
static void audit(const struct bg_engine *e)
{
    const char *broken;
    if (bg_engine_audit(e, &broken) != 0) {
        fprintf(stderr, "engine audit: %s\n", broken);
        abort();
    }
}

/* Feed data to s in chunks while time moves; between chunks the engine is
 * ticked, except when the chunk's last byte has bit 4 set. */
static void feed_chunks(struct bg_engine *e, struct bg_session *s, struct bg_buf *pending,
                        const uint8_t *data, size_t size, bg_time *now)
{
    size_t at = 0;
    while (at < size) {
        size_t chunk = 1 + data[at] % 97;
        if (chunk > size - at) chunk = size - at;
        bg_buf_append(pending, data + at, chunk);
        at += chunk;
        uint64_t before = commands_run(e);
        size_t used = bg_session_feed(s, bg_buf_head(pending), pending->len, *now);
        bg_buf_consume(pending, used);
        assert(pending->len < BG_LINE_MAX || s->stream.blocked || s->stream.closing);
        /* the catch-up's one compare is safe: due_at never exceeds a deadline */
        assert(e->due_at <= bg_engine_next_deadline(e));
        /* a command ran: it did whatever was due and left nothing due */
        if (commands_run(e) != before) assert(bg_engine_next_deadline(e) > *now);
        bg_buf_clear(&s->stream.out); /* the "socket" took everything */
        *now += (bg_time)(data[at - 1] % 8) * 250000000ull;
        if (!(data[at - 1] & 0x10)) bg_engine_tick(e, *now);
        /* the whole structure, side records included: after the early
         * chunks (the audit is O(jobs + table), so not after every one) */
        if (at < 1024) audit(e);
    }
    audit(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bg_engine e;
    struct bg_session a, b;
    bg_time now = 1000 * BG_SECOND;
    if (bg_engine_init(&e, size && (data[0] & 1) ? 16 : BG_JOB_SIZE_DEFAULT, NULL) != 0) return 0;
    if (bg_session_init(&e, &a, NULL, NULL) != 0 || bg_session_init(&e, &b, NULL, NULL) != 0) abort();
    a.scope = fuzz_pick_scope(size ? data[0] >> 5 : 0);
    struct bg_buf pa = {0}, pb = {0};
    feed_chunks(&e, &a, &pa, data, size, &now);
    /* the first connection put only where its scope lets it (tubes are
     * freed when empty and unused, so a put may have left no tube behind) */
    for (uint32_t i = 0; i < e.tube_count; i++) {
        const struct bg_tube *t = e.tube_list[i];
        if (t->stat.total_jobs) assert(bg_scope_allows(a.scope, BG_SCOPE_PRODUCE, t->name, strlen(t->name)));
    }
    if (!bg_scope_allows_some(a.scope, BG_SCOPE_PRODUCE)) assert(e.stat.total_jobs == 0);
    /* an unscoped connection is never refused */
    if (!a.scope) assert(e.stat.permission_denied == 0);
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

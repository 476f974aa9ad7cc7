/* test_journal.c - the write-ahead log's record format: every record type
 * round-trips; every truncation reads as a torn tail; every flipped byte
 * reads as torn or corrupt, never as a different record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"

/* One encoded record of each kind, as the table below describes. */
struct record_case {
    const char *name;
    int type;
    struct bg_journal_job job;
    const char *pause_tube;
    uint32_t pause_s;
    uint64_t unpause_wall;
};

static const struct record_case cases[] = {
    {"job", BG_REC_JOB, {7, "emails", 10, BG_JOB_READY, 0, 60, 0, 123456789, 1, 2, 3, 4, 5, 7, "hello\r\n"}, NULL, 0, 0},
    {"job-binary", BG_REC_JOB, {8, "a", 0, BG_JOB_BURIED, 0, 1, 0, 1, 0, 0, 0, 1, 0, 6, "\0\r\n\xff\r\n"}, NULL, 0, 0},
    {"job-empty-body", BG_REC_JOB, {9, "t;$()", UINT32_MAX, BG_JOB_DELAYED, 100, 5, 999, 2, 0, 0, 0, 0, 0, 2, "\r\n"}, NULL, 0, 0},
    {"update", BG_REC_UPDATE, {UINT64_MAX, "default", 5, BG_JOB_DELAYED, 30, 60, 1ull << 62, 3, 9, 8, 7, 6, 5, 0, NULL}, NULL, 0, 0},
    {"delete", BG_REC_DELETE, {42, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}, NULL, 0, 0},
    {"pause", BG_REC_PAUSE, {0}, "paused-tube", 300, 1700000000000000000ull},
    {"snapshot-end", BG_REC_SNAPSHOT_END, {0}, NULL, 0, 0},
};

static void encode(const struct record_case *c, struct bg_buf *out)
{
    int r = c->type == BG_REC_SNAPSHOT_END ? bg_journal_encode_snapshot_end(out)
          : c->type == BG_REC_DELETE ? bg_journal_encode_delete(out, c->job.id)
          : c->type == BG_REC_PAUSE ? bg_journal_encode_pause(out, c->pause_tube, c->pause_s, c->unpause_wall)
          : bg_journal_encode_job(out, &c->job, c->type == BG_REC_JOB);
    assert_int_equal(r, 0);
}

static void assert_same(const struct record_case *c, const struct bg_journal_record *rec)
{
    assert_int_equal(rec->type, c->type);
    if (c->type == BG_REC_SNAPSHOT_END) return;
    if (c->type == BG_REC_PAUSE) {
        assert_string_equal(rec->tube, c->pause_tube);
        assert_int_equal(rec->pause_s, c->pause_s);
        assert_true(rec->unpause_wall == c->unpause_wall);
        return;
    }
    assert_true(rec->job.id == c->job.id);
    if (c->type == BG_REC_DELETE) return;
    assert_string_equal(rec->job.tube, c->job.tube);
    assert_int_equal(rec->job.pri, c->job.pri);
    assert_int_equal(rec->job.state, c->job.state);
    assert_int_equal(rec->job.delay_s, c->job.delay_s);
    assert_int_equal(rec->job.ttr_s, c->job.ttr_s);
    assert_true(rec->job.deadline_wall == c->job.deadline_wall);
    assert_true(rec->job.created_wall == c->job.created_wall);
    assert_int_equal(rec->job.reserves, c->job.reserves);
    assert_int_equal(rec->job.timeouts, c->job.timeouts);
    assert_int_equal(rec->job.releases, c->job.releases);
    assert_int_equal(rec->job.buries, c->job.buries);
    assert_int_equal(rec->job.kicks, c->job.kicks);
    if (c->type == BG_REC_JOB) {
        assert_int_equal(rec->job.body_len, c->job.body_len);
        assert_memory_equal(rec->job.body, c->job.body, c->job.body_len);
    } else {
        assert_null(rec->job.body);
    }
}

/* Each record decodes to what was encoded, alone and back to back. */
static void test_round_trip(void **state)
{
    (void)state;
    struct bg_buf all = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_buf one = {0};
        encode(&cases[i], &one);
        encode(&cases[i], &all);
        struct bg_journal_record rec;
        size_t used = 0;
        assert_int_equal(bg_journal_decode(bg_buf_head(&one), one.len, &rec, &used), 0);
        assert_int_equal(used, one.len);
        assert_same(&cases[i], &rec);
        bg_buf_free(&one);
    }
    size_t at = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_journal_record rec;
        size_t used;
        assert_int_equal(bg_journal_decode(bg_buf_head(&all) + at, all.len - at, &rec, &used), 0);
        assert_same(&cases[i], &rec);
        at += used;
    }
    assert_int_equal(at, all.len);
    bg_buf_free(&all);
}

/* Every proper prefix of a record is a torn tail. */
static void test_truncation_is_torn(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_buf one = {0};
        encode(&cases[i], &one);
        for (size_t n = 0; n < one.len; n++) {
            struct bg_journal_record rec;
            size_t used;
            assert_int_equal(bg_journal_decode(bg_buf_head(&one), n, &rec, &used), BG_TORN);
        }
        bg_buf_free(&one);
    }
}

/* Any single flipped byte is detected: the length field makes it torn or
 * corrupt, anything else fails the checksum. */
static void test_flipped_byte_is_detected(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bg_buf one = {0};
        encode(&cases[i], &one);
        for (size_t at = 0; at < one.len; at++) {
            for (int bit = 0; bit < 8; bit++) {
                char *copy = malloc(one.len);
                memcpy(copy, bg_buf_head(&one), one.len);
                copy[at] ^= (char)(1 << bit);
                struct bg_journal_record rec;
                size_t used;
                int r = bg_journal_decode(copy, one.len, &rec, &used);
                if (r == 0) fail_msg("case %s: flipping bit %d of byte %zu went unnoticed", cases[i].name, bit, at);
                assert_true(r == BG_TORN || r == BG_CORRUPT);
                free(copy);
            }
        }
        bg_buf_free(&one);
    }
}

/* The checksum is CRC-32C (Castagnoli): the standard check values. */
static void test_crc32c_vectors(void **state)
{
    (void)state;
    assert_int_equal(bg_crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(bg_crc32c("", 0), 0);
    unsigned char zeros[32] = {0};
    assert_int_equal(bg_crc32c(zeros, 32), 0x8A9136AAu);
}

/* A segment header is recognised; another version or magic is not. */
static void test_segment_header(void **state)
{
    (void)state;
    char h[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(h);
    assert_int_equal(bg_journal_check_header(h, sizeof h), 0);
    assert_int_equal(bg_journal_check_header(h, sizeof h - 1), BG_BAD_FORMAT);
    h[8] ^= 2; /* version */
    assert_int_equal(bg_journal_check_header(h, sizeof h), BG_BAD_FORMAT);
    bg_journal_segment_header(h);
    h[0] = 'X';
    assert_int_equal(bg_journal_check_header(h, sizeof h), BG_BAD_FORMAT);
}

/* The log's size accounting comes from here: a JOB record's size, and the
 * span of each record in a buffer of records (the batch cutter). */
static void test_record_sizes(void **state)
{
    (void)state;
    struct bg_buf b = {0};
    struct bg_journal_job j = cases[0].job;
    assert_int_equal(bg_journal_encode_job(&b, &j, 1), 0);
    assert_int_equal(bg_journal_job_record_size(strlen(j.tube), j.body_len), b.len);
    size_t first = b.len;
    assert_int_equal(bg_journal_encode_delete(&b, 7), 0);
    assert_int_equal(bg_journal_encode_job(&b, &j, 0), 0);
    size_t at = 0, spans[3], n = 0;
    while (at < b.len) {
        struct bg_journal_record rec;
        size_t used;
        assert_int_equal(bg_journal_decode(bg_buf_head(&b) + at, b.len - at, &rec, &used), 0);
        spans[n] = bg_journal_record_span(bg_buf_head(&b) + at, b.len - at);
        assert_int_equal(spans[n++], used);
        at += used;
    }
    assert_int_equal(n, 3);
    assert_int_equal(spans[0], first);
    assert_int_equal(bg_journal_record_span(bg_buf_head(&b), 3), 0); /* no length yet */
    bg_buf_free(&b);
}

/* A well-formed checksum over nonsense is still refused: bad state, a bad
 * tube name, a length that does not match the structure. */
static void test_structure_checked(void **state)
{
    (void)state;
    struct bg_journal_job j = cases[0].job;
    j.state = BG_JOB_RESERVED;
    struct bg_buf b = {0};
    assert_int_equal(bg_journal_encode_job(&b, &j, 1), 0);
    struct bg_journal_record rec;
    size_t used;
    assert_int_equal(bg_journal_decode(bg_buf_head(&b), b.len, &rec, &used), BG_CORRUPT);
    bg_buf_clear(&b);
    j = cases[0].job;
    j.tube = "-bad";
    assert_int_equal(bg_journal_encode_job(&b, &j, 1), 0);
    assert_int_equal(bg_journal_decode(bg_buf_head(&b), b.len, &rec, &used), BG_CORRUPT);
    bg_buf_free(&b);
}

/* Records restore jobs into an engine: ids continue above the highest, an
 * update moves a job, a delete removes it. */
static void test_restore_into_engine(void **state)
{
    (void)state;
    struct bg_engine e;
    assert_int_equal(bg_engine_init(&e, 65535, NULL), 0);
    bg_time now = 1000 * BG_SECOND;
    struct bg_journal_job j = cases[0].job;
    assert_int_equal(bg_engine_restore_job(&e, &j, now, now, now), 0);
    j.id = 20;
    j.state = BG_JOB_DELAYED;
    assert_int_equal(bg_engine_restore_job(&e, &j, now + 5 * BG_SECOND, now, now), 0);
    assert_int_equal(e.next_id, 21);
    assert_int_equal(e.ready_count, 1);
    assert_int_equal(e.delayed_count, 1);
    j.state = BG_JOB_BURIED;
    assert_int_equal(bg_engine_restore_update(&e, &j, now, now), 0);
    assert_int_equal(e.delayed_count, 0);
    assert_int_equal(e.buried_count, 1);
    assert_int_equal(bg_job_find(&e, 20)->state, BG_JOB_BURIED);
    bg_engine_restore_delete(&e, 7);
    assert_null(bg_job_find(&e, 7));
    assert_int_equal(e.ready_count, 0);
    assert_int_equal(bg_engine_restore_update(&e, &j, now, now), 0);
    j.id = 99;
    assert_int_equal(bg_engine_restore_update(&e, &j, now, now), BG_NOT_FOUND);
    bg_engine_restore_delete(&e, 200); /* a delete of an unknown job still moves ids on */
    assert_int_equal(e.next_id, 201);
    bg_engine_destroy(&e);
}

/* ---- after the first unreadable record: torn tail or damage ------------- */

#define BIG_BUDGET ((size_t)1 << 30)

/* A segment: the header, then n records (jobs, updates, deletes, pauses in
 * turn, job ids from 1); at[i] is where record i starts, at[n] the end. */
/* Append n records to seg (jobs, updates, deletes, pauses in turn, job
 * ids from first_id); at[i] is where record i starts, at[n] the end. */
static void append_records(struct bg_buf *seg, size_t n, size_t *at, uint64_t first_id)
{
    for (size_t i = 0; i < n; i++) {
        at[i] = seg->len;
        struct bg_journal_job j = cases[0].job;
        j.id = first_id + i;
        switch (i % 4) {
        case 0: assert_int_equal(bg_journal_encode_job(seg, &j, 1), 0); break;
        case 1: assert_int_equal(bg_journal_encode_job(seg, &j, 0), 0); break;
        case 2: assert_int_equal(bg_journal_encode_delete(seg, j.id), 0); break;
        default: assert_int_equal(bg_journal_encode_pause(seg, "tube-x", 5, 77), 0); break;
        }
    }
    at[n] = seg->len;
}

static void build_segment(struct bg_buf *seg, size_t n, size_t *at)
{
    char h[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(h);
    assert_int_equal(bg_buf_append(seg, h, sizeof h), 0);
    append_records(seg, n, at, 1);
}

/* Read records from `from` as recovery does; where it stops. */
static size_t first_bad(const char *data, size_t len, size_t from)
{
    struct bg_journal_record rec;
    size_t used;
    while (from < len && bg_journal_decode(data + from, len - from, &rec, &used) == 0) from += used;
    return from;
}

struct seen {
    uint64_t records, puts, last_id;
};

static void count_seen(void *ctx, const struct bg_journal_record *rec)
{
    struct seen *s = ctx;
    s->records++;
    if (rec->type == BG_REC_JOB) s->puts++;
    if (rec->type != BG_REC_PAUSE && rec->type != BG_REC_SNAPSHOT_END) s->last_id = rec->job.id;
}

/* A write cut anywhere in the last record is a torn tail: nothing readable
 * follows, and what was read before it is intact. */
static void test_cut_last_record_is_torn(void **state)
{
    (void)state;
    size_t at[9];
    struct bg_buf seg = {0};
    build_segment(&seg, 8, at);
    for (size_t k = 4; k < 8; k++) { /* job, update, delete, pause */
        for (size_t cut = at[k]; cut < at[k + 1]; cut++) {
            size_t bad = first_bad(bg_buf_head(&seg), cut, BG_JOURNAL_HEADER_SIZE);
            assert_int_equal(bad, cut == at[k] ? cut : at[k]);
            if (bad == cut) continue; /* cut at a record boundary: nothing to examine */
            struct bg_journal_tail t;
            bg_journal_examine(bg_buf_head(&seg), cut, bad, BIG_BUDGET, &t, NULL, NULL);
            assert_int_equal(t.damage, BG_DAMAGE_TRUNCATED);
            assert_int_equal(t.offset, at[k]);
            assert_int_equal(t.dropped_bytes, cut - at[k]);
            assert_int_equal(t.readable, 0);
            assert_true(bg_journal_tail_torn(&t));
        }
    }
    bg_buf_free(&seg);
}

/* Zeros or garbage after the last record (a machine crash after the file
 * grew) are a torn tail too. */
static void test_zeros_or_garbage_after_last_record_are_torn(void **state)
{
    (void)state;
    size_t at[9];
    struct bg_buf seg = {0};
    build_segment(&seg, 8, at);
    char zeros[4096] = {0};
    assert_int_equal(bg_buf_append(&seg, zeros, sizeof zeros), 0);
    struct bg_journal_tail t;
    size_t bad = first_bad(bg_buf_head(&seg), seg.len, BG_JOURNAL_HEADER_SIZE);
    assert_int_equal(bad, at[8]);
    bg_journal_examine(bg_buf_head(&seg), seg.len, bad, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_BAD_FRAME);
    assert_int_equal(t.dropped_bytes, sizeof zeros);
    assert_true(bg_journal_tail_torn(&t));
    seg.len = at[8];
    unsigned x = 12345;
    for (int i = 0; i < 4096; i++) {
        x = x * 1103515245u + 12345u;
        char c = (char)(x >> 16);
        assert_int_equal(bg_buf_append(&seg, &c, 1), 0);
    }
    bg_journal_examine(bg_buf_head(&seg), seg.len, at[8], BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.readable, 0);
    assert_true(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

/* Any byte of a record in the middle changed: reading stops at that record,
 * and every record after it is still found, so it is damage, not a torn
 * tail. Covers the checksum, the length, the type and every field. */
static void test_changed_byte_in_the_middle_is_damage(void **state)
{
    (void)state;
    enum { N = 12, K = 5 };
    static const unsigned char flips[] = {0x01, 0x80, 0xFF};
    for (size_t k = K; k < K + 4; k++) { /* each record type in the middle */
        size_t at[N + 1];
        struct bg_buf seg = {0};
        build_segment(&seg, N, at);
        for (size_t pos = at[k]; pos < at[k + 1]; pos++) {
            for (size_t f = 0; f < sizeof flips; f++) {
                char *data = bg_buf_head(&seg);
                data[pos] ^= (char)flips[f];
                size_t bad = first_bad(data, seg.len, BG_JOURNAL_HEADER_SIZE);
                assert_int_equal(bad, at[k]);
                struct bg_journal_tail t;
                struct seen seen = {0};
                bg_journal_examine(data, seg.len, bad, BIG_BUDGET, &t, count_seen, &seen);
                if (t.readable != N - k - 1)
                    fail_msg("record %zu, byte %zu ^ 0x%02x: %llu readable after, want %zu", k, pos - at[k],
                             flips[f], (unsigned long long)t.readable, N - k - 1);
                assert_int_equal(seen.records, t.readable);
                assert_int_equal(t.readable_bytes, at[N] - at[k + 1]);
                assert_int_equal(t.dropped_bytes, at[N] - at[k]);
                assert_false(bg_journal_tail_torn(&t));
                data[pos] ^= (char)flips[f];
            }
        }
        bg_buf_free(&seg);
    }
}

/* A zeroed 4 KiB block in the middle: the records after it are found. */
static void test_zeroed_block_is_damage(void **state)
{
    (void)state;
    enum { N = 120 };
    size_t at[N + 1];
    struct bg_buf seg = {0};
    build_segment(&seg, N, at);
    size_t from = at[10] + 7, to = from + 4096;
    assert_true(to < at[N]);
    memset(bg_buf_head(&seg) + from, 0, 4096);
    size_t first_after = 0;
    while (at[first_after] < to) first_after++;
    size_t bad = first_bad(bg_buf_head(&seg), seg.len, BG_JOURNAL_HEADER_SIZE);
    assert_int_equal(bad, at[10]);
    struct bg_journal_tail t;
    struct seen seen = {0};
    bg_journal_examine(bg_buf_head(&seg), seg.len, bad, BIG_BUDGET, &t, count_seen, &seen);
    assert_int_equal(t.readable, N - first_after);
    assert_int_equal(seen.last_id, N - 1); /* the last record with an id (N-1 is a delete) */
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

#define PAGE BG_JOURNAL_PAGE_SIZE

/* A segment: the header, a job whose body of body_len bytes (zeros, then
 * CRLF) makes the next record start at `next`, then n more records
 * (build_segment's kinds); at[i] is where record i of those starts, at[n]
 * the end. */
static void build_padded_segment(struct bg_buf *seg, size_t next, char fill, size_t n, size_t *at)
{
    char h[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(h);
    assert_int_equal(bg_buf_append(seg, h, sizeof h), 0);
    struct bg_journal_job j = cases[0].job;
    size_t fixed = bg_journal_job_record_size(strlen(j.tube), 0);
    assert_true(next > BG_JOURNAL_HEADER_SIZE + fixed + 2);
    j.body_len = (uint32_t)(next - BG_JOURNAL_HEADER_SIZE - fixed);
    char *body = malloc(j.body_len);
    assert_non_null(body);
    memset(body, fill, j.body_len);
    memcpy(body + j.body_len - 2, "\r\n", 2);
    j.body = body;
    assert_int_equal(bg_journal_encode_job(seg, &j, 1), 0);
    free(body);
    assert_int_equal(seg->len, next);
    append_records(seg, n, at, 100);
}

/* Examine seg from where reading stops. */
static void examine_all(struct bg_buf *seg, struct bg_journal_tail *t)
{
    size_t bad = first_bad(bg_buf_head(seg), seg->len, BG_JOURNAL_HEADER_SIZE);
    bg_journal_examine(bg_buf_head(seg), seg->len, bad, BIG_BUDGET, t, NULL, NULL);
}

/* A machine crash wrote back a later page of an unsynced write but not the
 * page before it: zeros from the end of the last good record up to a page
 * end, then valid records. Nothing from there on was synced: a torn tail.
 * Likewise a segment whose first page (its header) was never written. */
static void test_unwritten_page_before_records_is_torn(void **state)
{
    (void)state;
    size_t at[400];
    struct bg_buf seg = {0};
    build_padded_segment(&seg, 3000, 'x', 300, at);
    size_t k = 0;
    while (at[k + 1] + 9 <= PAGE) k++; /* the last record whose frame fits before the page end */
    memset(bg_buf_head(&seg) + at[k], 0, PAGE - at[k]);
    struct bg_journal_tail t;
    examine_all(&seg, &t);
    assert_int_equal(t.offset, at[k]);
    assert_int_equal(t.damage, BG_DAMAGE_BAD_FRAME);
    assert_true(t.unwritten_page);
    assert_true(t.readable > 0);
    assert_true(bg_journal_tail_torn(&t));
    /* more than one page never written */
    assert_true(at[300] > 2 * PAGE + 200);
    memset(bg_buf_head(&seg) + PAGE, 0, PAGE);
    examine_all(&seg, &t);
    assert_true(t.unwritten_page && t.readable > 0 && bg_journal_tail_torn(&t));
    /* the header's page */
    memset(bg_buf_head(&seg), 0, PAGE);
    bg_journal_examine(bg_buf_head(&seg), seg.len, 0, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_NO_HEADER);
    assert_true(t.unwritten_page && bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
    /* a record starting a byte before a page end (its frame crosses it,
     * the next page was written back): its length's low byte is zero
     * (sim seed 98654) */
    build_padded_segment(&seg, PAGE - 1, 'x', 300, at);
    bg_buf_head(&seg)[at[0]] = 0;
    examine_all(&seg, &t);
    assert_int_equal(t.offset, at[0]);
    assert_true(t.unwritten_page && t.readable > 0 && bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

/* What is not a page never written stays damage when records follow:
 * zeros at the stop that end before its page end; zeros that are a record's
 * own body (a job body may be all zeros) in a record whose checksum or
 * length no longer matches; a zero page that does not start where reading
 * stopped. */
static void test_zeros_that_are_no_unwritten_page_are_damage(void **state)
{
    (void)state;
    size_t at[400];
    struct bg_buf seg = {0};
    struct bg_journal_tail t;
    build_padded_segment(&seg, 3000, 'x', 300, at);
    size_t k = 0;
    while (at[k + 1] + 9 <= PAGE) k++;
    memset(bg_buf_head(&seg) + at[k], 0, PAGE - at[k] - 1); /* one byte short of the page end */
    bg_buf_head(&seg)[PAGE - 1] = 0x5a;
    examine_all(&seg, &t);
    assert_false(t.unwritten_page);
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
    /* a synced job whose body is 3 pages of zeros, then records; a changed
     * byte in its checksum, its length, or the body itself */
    static const size_t changed[] = {0, 4, 8, 100, 5000};
    for (size_t c = 0; c < sizeof changed / sizeof changed[0]; c++) {
        build_padded_segment(&seg, 3 * PAGE + 500, '\0', 20, at);
        bg_buf_head(&seg)[BG_JOURNAL_HEADER_SIZE + changed[c]] ^= 0x40;
        examine_all(&seg, &t);
        assert_int_equal(t.offset, BG_JOURNAL_HEADER_SIZE);
        assert_false(t.unwritten_page);
        assert_false(bg_journal_tail_torn(&t));
        bg_buf_free(&seg);
    }
    /* a good record, then a zero page inside a later record's body */
    build_padded_segment(&seg, 3000, 'x', 300, at);
    k = 0;
    while (at[k + 1] + 9 <= PAGE) k++;
    memset(bg_buf_head(&seg) + at[k] + 9, 0, PAGE - at[k] - 9);
    examine_all(&seg, &t);
    assert_false(t.unwritten_page);
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

/* A record cut by the end of the data whose body holds a whole valid
 * record is still a torn tail: a believable frame is skipped whole, never
 * searched (a client chooses body bytes). */
static void test_record_inside_a_cut_body_is_not_found(void **state)
{
    (void)state;
    struct bg_buf inner = {0}, seg = {0};
    assert_int_equal(bg_journal_encode_delete(&inner, 99), 0);
    char body[200];
    memset(body, 'b', sizeof body);
    memcpy(body + 50, bg_buf_head(&inner), inner.len);
    memcpy(body + sizeof body - 2, "\r\n", 2);
    struct bg_journal_job j = cases[0].job;
    j.body = body;
    j.body_len = sizeof body;
    char h[BG_JOURNAL_HEADER_SIZE];
    bg_journal_segment_header(h);
    assert_int_equal(bg_buf_append(&seg, h, sizeof h), 0);
    assert_int_equal(bg_journal_encode_job(&seg, &j, 1), 0);
    struct bg_journal_tail t;
    bg_journal_examine(bg_buf_head(&seg), seg.len - 10, BG_JOURNAL_HEADER_SIZE, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_TRUNCATED);
    assert_int_equal(t.readable, 0);
    assert_true(bg_journal_tail_torn(&t));
    bg_buf_free(&inner);
    bg_buf_free(&seg);
}

/* The header: never written (short or zero) can be torn; another magic or
 * a valid-checksum record with impossible fields is never torn. */
static void test_header_and_bad_record_damage(void **state)
{
    (void)state;
    char h[BG_JOURNAL_HEADER_SIZE], zeros[BG_JOURNAL_HEADER_SIZE] = {0};
    bg_journal_segment_header(h);
    assert_int_equal(bg_journal_header_damage(h, sizeof h), BG_DAMAGE_NONE);
    assert_int_equal(bg_journal_header_damage(h, 7), BG_DAMAGE_NO_HEADER);
    assert_int_equal(bg_journal_header_damage(h, 0), BG_DAMAGE_NO_HEADER);
    assert_int_equal(bg_journal_header_damage(zeros, sizeof zeros), BG_DAMAGE_NO_HEADER);
    assert_int_equal(bg_journal_header_damage("XYZ", 3), BG_DAMAGE_BAD_HEADER);
    struct bg_journal_tail t;
    bg_journal_examine(h, 7, 0, BIG_BUDGET, &t, NULL, NULL);
    assert_true(bg_journal_tail_torn(&t));
    h[8] ^= 2;
    assert_int_equal(bg_journal_header_damage(h, sizeof h), BG_DAMAGE_OTHER_VERSION);
    h[0] = 'X';
    assert_int_equal(bg_journal_header_damage(h, sizeof h), BG_DAMAGE_BAD_HEADER);
    bg_journal_examine(h, sizeof h, 0, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_BAD_HEADER);
    assert_false(bg_journal_tail_torn(&t));
    /* a zero header followed by records: the records are found, so damage */
    size_t at[5];
    struct bg_buf seg = {0};
    build_segment(&seg, 4, at);
    memset(bg_buf_head(&seg), 0, BG_JOURNAL_HEADER_SIZE);
    bg_journal_examine(bg_buf_head(&seg), seg.len, 0, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_NO_HEADER);
    assert_int_equal(t.readable, 4);
    assert_false(bg_journal_tail_torn(&t));
    /* good checksum, bad state: no interrupted write does that */
    struct bg_journal_job j = cases[0].job;
    j.state = BG_JOB_RESERVED;
    bg_journal_segment_header(h);
    bg_buf_clear(&seg);
    assert_int_equal(bg_buf_append(&seg, h, sizeof h), 0);
    assert_int_equal(bg_journal_encode_job(&seg, &j, 1), 0);
    bg_journal_examine(bg_buf_head(&seg), seg.len, BG_JOURNAL_HEADER_SIZE, BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_BAD_RECORD);
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

/* The search past damage stops at its budget and then never claims a torn
 * tail: what it did not look at may hold records. */
static void test_search_budget(void **state)
{
    (void)state;
    enum { N = 8 };
    size_t at[N + 1];
    struct bg_buf seg = {0};
    build_segment(&seg, N, at);
    char *data = bg_buf_head(&seg);
    memset(data + at[2], 0xEE, 9); /* an impossible frame: the next one is searched */
    struct bg_journal_tail t;
    bg_journal_examine(data, seg.len, at[2], BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.readable, N - 3);
    assert_true(t.search_complete);
    bg_journal_examine(data, seg.len, at[2], 0, &t, NULL, NULL);
    assert_false(t.search_complete);
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

/* A record with a good checksum and a type this version does not know, in
 * the middle: damage (never torn), skipped by its length; the records after
 * it are found. */
static void test_unknown_type_with_good_checksum(void **state)
{
    (void)state;
    enum { N = 6 };
    size_t at[N + 1];
    struct bg_buf seg = {0};
    build_segment(&seg, N, at);
    unsigned char *r = (unsigned char *)bg_buf_head(&seg) + at[2]; /* a delete */
    r[8] = 9;
    uint32_t crc = bg_crc32c(r + 8, 9);
    for (int i = 0; i < 4; i++) r[4 + i] = (unsigned char)(crc >> (8 * i));
    assert_int_equal(first_bad(bg_buf_head(&seg), seg.len, BG_JOURNAL_HEADER_SIZE), at[2]);
    struct bg_journal_tail t;
    bg_journal_examine(bg_buf_head(&seg), seg.len, at[2], BIG_BUDGET, &t, NULL, NULL);
    assert_int_equal(t.damage, BG_DAMAGE_BAD_RECORD);
    assert_int_equal(t.readable, N - 3);
    assert_false(bg_journal_tail_torn(&t));
    bg_journal_examine(bg_buf_head(&seg), at[3], at[2], BIG_BUDGET, &t, NULL, NULL); /* as the last one */
    assert_false(bg_journal_tail_torn(&t));
    bg_buf_free(&seg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncation_is_torn),
        cmocka_unit_test(test_flipped_byte_is_detected),
        cmocka_unit_test(test_segment_header),
        cmocka_unit_test(test_record_sizes),
        cmocka_unit_test(test_structure_checked),
        cmocka_unit_test(test_restore_into_engine),
        cmocka_unit_test(test_cut_last_record_is_torn),
        cmocka_unit_test(test_zeros_or_garbage_after_last_record_are_torn),
        cmocka_unit_test(test_changed_byte_in_the_middle_is_damage),
        cmocka_unit_test(test_zeroed_block_is_damage),
        cmocka_unit_test(test_unwritten_page_before_records_is_torn),
        cmocka_unit_test(test_zeros_that_are_no_unwritten_page_are_damage),
        cmocka_unit_test(test_record_inside_a_cut_body_is_not_found),
        cmocka_unit_test(test_header_and_bad_record_damage),
        cmocka_unit_test(test_search_budget),
        cmocka_unit_test(test_unknown_type_with_good_checksum),
    };
    return cmocka_run_group_tests_name("journal", tests, NULL, NULL);
}

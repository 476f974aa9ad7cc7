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
            assert_int_equal(bg_journal_decode(bg_buf_head(&one), n, &rec, &used), BG_JOURNAL_TORN);
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
                assert_true(r == BG_JOURNAL_TORN || r == BG_JOURNAL_CORRUPT);
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
    assert_int_equal(bg_journal_decode(bg_buf_head(&b), b.len, &rec, &used), BG_JOURNAL_CORRUPT);
    bg_buf_clear(&b);
    j = cases[0].job;
    j.tube = "-bad";
    assert_int_equal(bg_journal_encode_job(&b, &j, 1), 0);
    assert_int_equal(bg_journal_decode(bg_buf_head(&b), b.len, &rec, &used), BG_JOURNAL_CORRUPT);
    bg_buf_free(&b);
}

/* Records restore jobs into an engine: ids continue above the highest, an
 * update moves a job, a delete removes it. */
static void test_restore_into_engine(void **state)
{
    (void)state;
    struct bg_engine e;
    assert_int_equal(bg_engine_init(&e, 65535), 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncation_is_torn),
        cmocka_unit_test(test_flipped_byte_is_detected),
        cmocka_unit_test(test_segment_header),
        cmocka_unit_test(test_structure_checked),
        cmocka_unit_test(test_restore_into_engine),
    };
    return cmocka_run_group_tests_name("journal", tests, NULL, NULL);
}

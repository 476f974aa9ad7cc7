/* test_binlog.c - beanstalkd's binlog.N files read (core/binlog.c), fed
 * crafted bytes: a table of cases, each a few files written by a small
 * script, and what reading them must find (each file's status and where
 * its damage starts, the live jobs, the highest id). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "binlog.h"

/* ---- writing files as beanstalkd does ---------------------------------- */

struct file {
    unsigned char *data;
    size_t len, cap;
    int version;               /* the layout the records are written in */
    size_t op_at[32];          /* where each op of the script started */
};

static void put_bytes(struct file *f, const void *p, size_t n)
{
    if (f->len + n > f->cap) {
        f->cap = (f->len + n) * 2 + 64;
        f->data = realloc(f->data, f->cap);
        assert_non_null(f->data);
    }
    memcpy(f->data + f->len, p, n);
    f->len += n;
}

static void put_le(struct file *f, uint64_t v, size_t n)
{
    unsigned char b[8];
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    put_bytes(f, b, n);
}

/* A record: the name length (a negative one as given), the name, the job
 * record, and the body when body is not NULL. Times: delay 0, TTR 60 s,
 * created 1e18 ns, deadline 2e18 ns; counters from the id. */
static void put_record(struct file *f, long long name_len, const char *name, uint64_t id, unsigned state,
                       uint32_t body_size, const char *body)
{
    int v5 = f->version == 5;
    uint64_t unit = v5 ? 1000 : 1;
    put_le(f, (uint64_t)name_len, v5 ? 8 : 4);
    if (name_len > 0 && name) put_bytes(f, name, (size_t)name_len);
    unsigned char rec[80] = {0};
    struct file r = {0};
    put_le(&r, id, 8);
    put_le(&r, (uint32_t)(id * 10), 4);
    put_le(&r, 0, 4);
    put_le(&r, 0, 8);                                 /* delay */
    put_le(&r, 60000000000ull / unit, 8);             /* ttr */
    put_le(&r, body_size, 4);
    put_le(&r, 0, 4);
    put_le(&r, 1000000000000000000ull / unit, 8);     /* created */
    put_le(&r, 2000000000000000000ull / unit, 8);     /* deadline */
    for (uint32_t k = 0; k < 5; k++) put_le(&r, (uint32_t)id + k, 4);
    memcpy(rec, r.data, r.len);
    free(r.data);
    rec[76] = (unsigned char)state;
    put_bytes(f, rec, v5 ? 77 : 80);
    if (body) put_bytes(f, body, body_size);
}

/* A body of n bytes: 'a'... then CRLF (crlf), or 'a' to the end. */
static char *make_body(size_t n, int crlf)
{
    char *b = malloc(n ? n : 1);
    assert_non_null(b);
    memset(b, 'a', n);
    if (crlf && n >= 2) memcpy(b + n - 2, "\r\n", 2);
    return b;
}

/* Run a file's script: ops separated by spaces.
 *   v7 v5 v9        the version (9: one beanstalkd never wrote)
 *   full:ID:TUBE:STATE:BODYLEN   a full record (body ends in CRLF)
 *   short:ID:STATE  a short record
 *   nobody:ID:TUBE:BODYLEN       a full record's name and job record only
 *   badbody:ID:TUBE:BODYLEN      a full record whose body lacks its CRLF
 *   badname:N       a name length of N (no name), then a job record of id 1
 *   zeros:N  junk:N N zero bytes; N bytes of 0xAB
 *   cut:N           drop the last N bytes */
static void run_script(struct file *f, const char *script)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", script);
    int op = 0;
    for (char *save, *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save), op++) {
        f->op_at[op] = f->len;
        char tube[64];
        unsigned long long id, n;
        unsigned state;
        long long nl;
        if (sscanf(tok, "v%u", &state) == 1) {
            f->version = (int)state;
            put_le(f, state, 4);
        } else if (sscanf(tok, "full:%llu:%63[^:]:%u:%llu", &id, tube, &state, &n) == 4) {
            char *body = make_body(n, 1);
            put_record(f, (long long)strlen(tube), tube, id, state, (uint32_t)n, body);
            free(body);
        } else if (sscanf(tok, "short:%llu:%u", &id, &state) == 2) {
            put_record(f, 0, NULL, id, state, 7, NULL);
        } else if (sscanf(tok, "nobody:%llu:%63[^:]:%llu", &id, tube, &n) == 3) {
            put_record(f, (long long)strlen(tube), tube, id, 1, (uint32_t)n, NULL);
        } else if (sscanf(tok, "badbody:%llu:%63[^:]:%llu", &id, tube, &n) == 3) {
            char *body = make_body(n, 0);
            put_record(f, (long long)strlen(tube), tube, id, 1, (uint32_t)n, body);
            free(body);
        } else if (sscanf(tok, "badname:%lld", &nl) == 1) {
            put_record(f, nl, NULL, 1, 1, 7, NULL);
        } else if (sscanf(tok, "zeros:%llu", &n) == 1) {
            char *z = calloc(n ? n : 1, 1);
            put_bytes(f, z, n);
            free(z);
        } else if (sscanf(tok, "junk:%llu", &n) == 1) {
            for (unsigned long long k = 0; k < n; k++) put_bytes(f, "\xab", 1);
        } else if (sscanf(tok, "cut:%llu", &n) == 1) {
            f->len -= n;
        } else {
            fail_msg("bad script op %s", tok);
        }
    }
}

/* ---- the cases --------------------------------------------------------- */

struct binlog_case {
    const char *name;
    const char *files[4];      /* scripts, oldest first */
    /* per file: "ok", "torn:OP", "damaged:KIND:OP" or "never_written";
     * OP: the script op where the damage starts (-1: byte 0) */
    const char *expect[4];
    const char *live;          /* "ID=state ..." by id */
    uint64_t max_id;
};

static const struct binlog_case cases[] = {
    {"one-put", {"v7 full:1:t1:1:7"}, {"ok"}, "1=ready", 1},
    {"put-then-bury", {"v7 full:1:t1:1:7 short:1:3"}, {"ok"}, "1=buried", 1},
    {"put-then-delete", {"v7 full:1:t1:1:7 short:1:0"}, {"ok"}, "", 1},
    {"reserved-kept-as-reserved", {"v7 full:4:default:2:2"}, {"ok"}, "4=reserved", 4},
    {"delayed", {"v7 full:1:a:4:9 full:2:b:1:2"}, {"ok"}, "1=delayed 2=ready", 2},
    {"zero-prefill", {"v7 full:1:t1:1:7 short:1:4 zeros:4000"}, {"ok"}, "1=delayed", 1},
    {"closed-file-ends-at-record", {"v7 full:1:t:1:7", "v7 full:2:t:1:7 zeros:100"}, {"ok", "ok"}, "1=ready 2=ready", 2},
    {"torn-tail", {"v7 full:1:t:1:7", "v7 full:2:t:1:7 full:3:t:1:10 cut:3"}, {"ok", "torn:2"}, "1=ready 2=ready", 3},
    {"torn-name-only", {"v7 full:1:t:1:7 cut:60"}, {"torn:1"}, "", 0},
    {"torn-body-never-written", {"v7 full:1:t:1:7 nobody:2:t:10 zeros:300"}, {"torn:2"}, "1=ready", 2},
    {"torn-newest-with-records", {"v7 full:1:t:1:7 full:2:t:1:9 cut:4", "v7 zeros:2000", "zeros:512"},
     {"torn:2", "ok", "never_written"}, "1=ready", 2},
    {"truncated-in-older-file", {"v7 full:1:t:1:7 full:2:t:1:9 cut:4", "v7 full:3:t:1:7"},
     {"damaged:truncated:2", "ok"}, "1=ready 3=ready", 3},
    {"bad-state", {"v7 full:1:t:1:7 full:2:t:9:7 full:3:t:1:7"}, {"damaged:bad_state:2"}, "1=ready", 1},
    {"bad-state-short", {"v7 full:1:t:1:7 short:1:5 full:3:t:1:7"}, {"damaged:bad_state:2"}, "1=ready", 1},
    {"bad-body", {"v7 badbody:1:t:5 full:2:t:1:7"}, {"damaged:bad_body:1"}, "", 0},
    {"bad-version", {"v9 full:1:t:1:7", "v7 full:2:t:1:7"}, {"damaged:bad_version:-1", "ok"}, "2=ready", 2},
    {"bad-name-length", {"v7 full:1:t:1:7 badname:-1 zeros:100"}, {"damaged:bad_name_length:2"}, "1=ready", 1},
    {"name-too-long", {"v7 badname:201 zeros:400"}, {"damaged:bad_name_length:1"}, "", 0},
    {"bad-tube-name", {"v7 full:1:a*b:1:7 full:2:t:1:7"}, {"damaged:bad_tube_name:1"}, "", 0},
    {"data-after-end", {"v7 full:1:t:1:7 zeros:84 junk:8"}, {"damaged:data_after_end:3"}, "1=ready", 1},
    {"job-65535-bytes", {"v7 full:1:big:1:65535 full:2:big:1:65534"}, {"ok"}, "1=ready 2=ready", 2},
    {"short-without-full-ignored", {"v7 short:5:3 full:1:t:1:7"}, {"ok"}, "1=ready", 5},
    {"full-record-replaces", {"v7 full:1:t:1:7 short:1:0", "v7 full:2:t:1:7 full:2:t:3:7"}, {"ok", "ok"}, "2=buried", 2},
    {"never-written-files", {"", "zeros:2", "zeros:4096", "v7 full:1:t:1:7"},
     {"never_written", "never_written", "never_written", "ok"}, "1=ready", 1},
    {"version-5", {"v5 full:1:t1:1:7 full:2:t2:1:3 short:1:3 short:2:0"}, {"ok"}, "1=buried", 2},
    {"version-5-torn", {"v5 full:1:t1:1:7 full:2:t2:1:9 cut:2"}, {"torn:2"}, "1=ready", 2},
};

static const char *state_name(uint8_t s)
{
    static const char *const names[] = {"deleted", "ready", "reserved", "buried", "delayed"};
    return s < 5 ? names[s] : "?";
}

static int job_less(const void *a, const void *b)
{
    uint64_t x = ((const struct bg_binlog_job *)a)->id, y = ((const struct bg_binlog_job *)b)->id;
    return x < y ? -1 : x > y;
}

static void run_case(const struct binlog_case *c)
{
    struct file files[4] = {{0}};
    struct bg_binlog_file reports[4];
    struct bg_binlog log;
    bg_binlog_init(&log);
    size_t n = 0;
    for (; n < 4 && c->files[n]; n++) {
        run_script(&files[n], c->files[n]);
        assert_int_equal(bg_binlog_read(&log, (const char *)files[n].data, files[n].len, &reports[n]), 0);
    }
    bg_binlog_classify(reports, n);
    for (size_t i = 0; i < n; i++) {
        char got[96], kind[48];
        int op = -2;
        const struct bg_binlog_file *f = &reports[i];
        if (f->damage == BG_BINLOG_NEVER_WRITTEN) snprintf(got, sizeof got, "never_written");
        else if (f->damage == BG_BINLOG_OK) snprintf(got, sizeof got, "ok");
        else {
            if (sscanf(c->expect[i], "torn:%d", &op) != 1) sscanf(c->expect[i], "damaged:%47[^:]:%d", kind, &op);
            size_t want_at = op < 0 ? 0 : files[i].op_at[op];
            if (f->torn) snprintf(got, sizeof got, "torn:%d", f->offset == want_at ? op : -99);
            else
                snprintf(got, sizeof got, "damaged:%s:%d", bg_binlog_damage_name(f->damage),
                         f->offset == want_at ? op : -99);
        }
        if (strcmp(got, c->expect[i]) != 0)
            fail_msg("case %s file %zu: got %s (offset %zu), want %s", c->name, i, got, f->offset, c->expect[i]);
        assert_int_equal(bg_binlog_damaged(f), strncmp(c->expect[i], "damaged", 7) == 0);
    }
    struct bg_binlog_job *live = calloc(log.count + 1, sizeof *live);
    size_t k = 0;
    for (size_t i = 0; i < log.count; i++)
        if (log.jobs[i].live) live[k++] = log.jobs[i];
    qsort(live, k, sizeof *live, job_less);
    char got[256] = "";
    for (size_t i = 0; i < k; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu=%s", i ? " " : "",
                 (unsigned long long)live[i].id, state_name(live[i].state));
    if (strcmp(got, c->live) != 0) fail_msg("case %s: live jobs %s, want %s", c->name, got, c->live);
    if (log.max_id != c->max_id)
        fail_msg("case %s: max id %llu, want %llu", c->name, (unsigned long long)log.max_id,
                 (unsigned long long)c->max_id);
    for (size_t i = 0; i < k; i++) { /* each body as written, CRLF last */
        assert_true(live[i].body_len >= 2);
        assert_memory_equal(live[i].body + live[i].body_len - 2, "\r\n", 2);
    }
    free(live);
    bg_binlog_free(&log);
    for (size_t i = 0; i < n; i++) free(files[i].data);
}

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

/* Every field of a record comes through, in both formats (version 5's
 * times in microseconds become nanoseconds). */
static void test_fields(void **state)
{
    (void)state;
    for (int v = 5; v <= 7; v += 2) {
        struct file f = {0};
        char script[64];
        snprintf(script, sizeof script, "v%d full:9:emails:3:7", v);
        run_script(&f, script);
        struct bg_binlog log;
        struct bg_binlog_file report;
        bg_binlog_init(&log);
        assert_int_equal(bg_binlog_read(&log, (const char *)f.data, f.len, &report), 0);
        const struct bg_binlog_job *j = bg_binlog_find(&log, 9);
        assert_non_null(j);
        assert_int_equal(j->tube_len, 6);
        assert_memory_equal(j->tube, "emails", 6);
        assert_int_equal(j->pri, 90);
        assert_int_equal(j->state, BG_BINLOG_BURIED);
        assert_int_equal(j->ttr_ns, 60000000000ll);
        assert_int_equal(j->delay_ns, 0);
        assert_int_equal(j->created_ns, 1000000000000000000ll);
        assert_int_equal(j->deadline_ns, 2000000000000000000ll);
        assert_int_equal(j->reserves, 9);
        assert_int_equal(j->timeouts, 10);
        assert_int_equal(j->releases, 11);
        assert_int_equal(j->buries, 12);
        assert_int_equal(j->kicks, 13);
        assert_int_equal(j->body_len, 7);
        assert_memory_equal(j->body, "aaaaa\r\n", 7);
        assert_int_equal(report.version, v);
        assert_int_equal(report.records, 1);
        assert_int_equal(report.jobs_made, 1);
        assert_null(bg_binlog_find(&log, 8));
        bg_binlog_free(&log);
        free(f.data);
    }
}

/* Many jobs: the id table grows and finds each. */
static void test_many_jobs(void **state)
{
    (void)state;
    struct file f = {0};
    run_script(&f, "v7");
    for (uint64_t id = 1; id <= 5000; id++) {
        char body[] = "x\r\n";
        put_record(&f, 1, "t", id, id % 3 ? 1 : 3, 3, body);
        if (id % 2 == 0) put_record(&f, 0, NULL, id, 0, 3, NULL);
    }
    struct bg_binlog log;
    struct bg_binlog_file report;
    bg_binlog_init(&log);
    assert_int_equal(bg_binlog_read(&log, (const char *)f.data, f.len, &report), 0);
    assert_int_equal(report.damage, BG_BINLOG_OK);
    size_t live = 0;
    for (size_t i = 0; i < log.count; i++) live += log.jobs[i].live;
    assert_int_equal(live, 2500);
    for (uint64_t id = 1; id <= 5000; id++) assert_int_equal(bg_binlog_find(&log, id)->live, id % 2);
    assert_int_equal(log.max_id, 5000);
    bg_binlog_free(&log);
    free(f.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_many_jobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_codec_cases.c - data-driven codec tests: every directory under the
 * cases folder holds `input` (bytes sent on one connection), `expected`
 * (bytes the reference beanstalkd answered, recorded by
 * tests/codec/record_cases.py) and optionally `flags` (e.g. "-z 10").
 * Each case runs on a fresh engine at a fixed time, once with the input
 * fed whole and once split at every few bytes, and must match exactly. */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"

#define CASE_TIME ((bg_time)1000 * BG_SECOND)

static const char *cases_dir;

/* Read a whole file; NULL if it does not exist. */
static char *read_file(const char *dir, const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)n + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
    data[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return data;
}

/* The -z value of a flags file, or the default. */
static uint32_t max_job_size_of(const char *flags)
{
    const char *z = flags ? strstr(flags, "-z") : NULL;
    return z ? (uint32_t)strtoul(z + 2, NULL, 10) : BG_JOB_SIZE_DEFAULT;
}

/* Print bytes with C escapes, for a readable failure. */
static void print_escaped(const char *label, const char *p, size_t n)
{
    fprintf(stderr, "%s (%zu bytes): \"", label, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\r') fputs("\\r", stderr);
        else if (ch == '\n') fputs("\\n", stderr);
        else if (ch < 32 || ch > 126 || ch == '"' || ch == '\\') fprintf(stderr, "\\x%02x", ch);
        else fputc(ch, stderr);
    }
    fputs("\"\n", stderr);
}

/* Run input through a fresh session, `step` bytes at a time (0 = whole),
 * keeping unconsumed bytes like the server does. Returns the output. */
static struct bg_buf run_case(const char *input, size_t len, uint32_t max_job_size, size_t step)
{
    struct bg_engine e;
    struct bg_session s;
    assert_int_equal(bg_engine_init(&e, max_job_size, NULL), 0);
    assert_int_equal(bg_session_init(&e, &s, NULL, NULL), 0);
    struct bg_buf pending = {0};
    size_t sent = 0;
    while (sent < len) {
        size_t n = step && len - sent > step ? step : len - sent;
        assert_int_equal(bg_buf_append(&pending, input + sent, n), 0);
        sent += n;
        size_t used = bg_session_feed(&s, bg_buf_head(&pending), pending.len, CASE_TIME);
        bg_buf_consume(&pending, used);
        if (s.stream.closing) break;
    }
    struct bg_buf out = s.stream.out;
    s.stream.out = (struct bg_buf){0};
    bg_session_close(&s, CASE_TIME);
    bg_engine_destroy(&e);
    bg_buf_free(&pending);
    return out;
}

/* Copy a reply stream, writing every "time-left: N" value as "*" and fixing
 * the "OK n" length around it. The reference's clock moves while a case
 * runs (delay 100 shows 99); ours is fixed, so these values may differ. */
static struct bg_buf mask_time_left(const char *p, size_t n)
{
    struct bg_buf out = {0};
    const char *end = p + n;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t line = eol ? (size_t)(eol - p) + 1 : (size_t)(end - p);
        unsigned long long len;
        if (sscanf(p, "OK %llu\r\n", &len) == 1 && p + line + len + 2 <= end) {
            struct bg_buf yaml = {0};
            const char *y = p + line, *yend = y + len;
            while (y < yend) {
                const char *nl = memchr(y, '\n', (size_t)(yend - y));
                size_t ylen = nl ? (size_t)(nl - y) + 1 : (size_t)(yend - y);
                const char *key = memmem(y, ylen, "time-left: ", 11);
                if (key) {
                    assert_int_equal(bg_buf_append(&yaml, y, (size_t)(key - y) + 11), 0);
                    assert_int_equal(bg_buf_append(&yaml, "*\n", 2), 0);
                } else {
                    assert_int_equal(bg_buf_append(&yaml, y, ylen), 0);
                }
                y += ylen;
            }
            assert_int_equal(bg_buf_printf(&out, "OK %zu\r\n", yaml.len), 0);
            assert_int_equal(bg_buf_append(&out, bg_buf_head(&yaml), yaml.len), 0);
            bg_buf_free(&yaml);
            p += line + len;
            continue;
        }
        unsigned long long id, bytes;
        int body = (sscanf(p, "RESERVED %llu %llu\r\n", &id, &bytes) == 2 ||
                    sscanf(p, "FOUND %llu %llu\r\n", &id, &bytes) == 2) &&
                   p + line + bytes + 2 <= end;
        size_t take = line + (body ? bytes + 2 : 0);
        assert_int_equal(bg_buf_append(&out, p, take), 0);
        p += take;
    }
    return out;
}

/* Nonzero if two reply streams are equal once time-left values are masked. */
static int same_replies(const char *a, size_t alen, const char *b, size_t blen)
{
    if (alen == blen && (alen == 0 || memcmp(a, b, alen) == 0)) return 1;
    struct bg_buf ma = mask_time_left(a, alen), mb = mask_time_left(b, blen);
    int same = ma.len == mb.len && (ma.len == 0 || memcmp(bg_buf_head(&ma), bg_buf_head(&mb), ma.len) == 0);
    bg_buf_free(&ma);
    bg_buf_free(&mb);
    return same;
}

static void test_case(void **state)
{
    const char *dir = *state;
    size_t in_len, exp_len, flags_len;
    char *input = read_file(dir, "input", &in_len);
    char *expected = read_file(dir, "expected", &exp_len);
    char *flags = read_file(dir, "flags", &flags_len);
    assert_non_null(input);
    assert_non_null(expected);
    static const size_t steps[] = {0, 1, 7, 100};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        struct bg_buf out = run_case(input, in_len, max_job_size_of(flags), steps[i]);
        if (!same_replies(bg_buf_head(&out), out.len, expected, exp_len)) {
            fprintf(stderr, "case %s, fed %zu bytes at a time\n", dir, steps[i]);
            print_escaped("input", input, in_len);
            print_escaped("expected", expected, exp_len);
            print_escaped("got", bg_buf_head(&out), out.len);
            fail();
        }
        bg_buf_free(&out);
    }
    free(input);
    free(expected);
    free(flags);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct CMUnitTest *)a)->name, ((const struct CMUnitTest *)b)->name);
}

int main(int argc, char **argv)
{
    cases_dir = argc > 1 ? argv[1] : "tests/codec/cases";
    DIR *d = opendir(cases_dir);
    if (!d) {
        fprintf(stderr, "cannot open cases directory %s\n", cases_dir);
        return 1;
    }
    size_t n = 0, cap = 64;
    struct CMUnitTest *tests = calloc(cap, sizeof *tests);
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        if (n == cap) tests = realloc(tests, (cap *= 2) * sizeof *tests);
        char *path = malloc(strlen(cases_dir) + strlen(ent->d_name) + 2);
        sprintf(path, "%s/%s", cases_dir, ent->d_name);
        tests[n] = (struct CMUnitTest){strdup(ent->d_name), test_case, NULL, NULL, path};
        n++;
    }
    closedir(d);
    qsort(tests, n, sizeof *tests, by_name);
    if (n == 0) {
        fprintf(stderr, "no cases in %s\n", cases_dir);
        return 1;
    }
    int failed = _cmocka_run_group_tests("codec_cases", tests, n, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        free((char *)tests[i].name);
        free(tests[i].initial_state);
    }
    free(tests);
    return failed ? 1 : 0;
}

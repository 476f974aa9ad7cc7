/* test_parse.c - the one decimal reader (core/parse.c), case by case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "core.h"

static const struct parse_case {
    const char *text;
    uint64_t max;
    int outcome;
    uint64_t value;
} parse_cases[] = {
    {"0", UINT32_MAX, 0, 0},
    {"7", 9, 0, 7},
    {"9", 9, 0, 9},
    {"10", 9, BG_BAD_FORMAT, 0},
    {"9", 5, BG_BAD_FORMAT, 0},       /* one digit above a small max */
    {"4294967295", UINT32_MAX, 0, UINT32_MAX},
    {"4294967296", UINT32_MAX, BG_BAD_FORMAT, 0},
    {"18446744073709551615", UINT64_MAX, 0, UINT64_MAX},
    {"18446744073709551616", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"99999999999999999999", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"000000000000000000000042", 100, 0, 42}, /* leading zeros are digits */
    {"", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"-1", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"+1", UINT64_MAX, BG_BAD_FORMAT, 0},
    {" 1", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"1 ", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"1x", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"0x10", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"1e3", UINT64_MAX, BG_BAD_FORMAT, 0},
    {"\xd9\xa3", UINT64_MAX, BG_BAD_FORMAT, 0}, /* Arabic-Indic three: not ASCII */
};

static void test_parse_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++) {
        const struct parse_case *c = &parse_cases[i];
        uint64_t v = 12345;
        int rc = bg_parse_u64(c->text, strlen(c->text), c->max, &v);
        if (rc != c->outcome) fail_msg("case %zu \"%s\": outcome %d, want %d", i, c->text, rc, c->outcome);
        if (rc == 0 && v != c->value) fail_msg("case %zu \"%s\": value %llu", i, c->text, (unsigned long long)v);
        if (rc != 0 && v != 12345) fail_msg("case %zu \"%s\": *out written on failure", i, c->text);
    }
}

/* The length bounds the read: bytes past it are never looked at. */
static void test_parse_reads_only_len(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(bg_parse_u64("123xyz", 3, UINT64_MAX, &v), 0);
    assert_int_equal(v, 123);
    assert_int_equal(bg_parse_u64("123", 0, UINT64_MAX, &v), BG_BAD_FORMAT);
}

/* What a browser's request starts with, and lines of beanstalk and Gearman
 * that only look alike. */
static void test_line_is_http(void **state)
{
    (void)state;
    static const char *const http[] = {"POST / HTTP/1.1", "GET /?a=b HTTP/1.0", "OPTIONS * HTTP/1.1",
                                       "PUT http://x/y HTTP/1.1", "M-SEARCH * HTTP/1.1", "Host: x",
                                       "host:127.0.0.1", "HOST: a b c", NULL};
    for (int i = 0; http[i]; i++) assert_true(bg_line_is_http(http[i], strlen(http[i])));
    static const char *const other[] = {"", "POST /", "POST / HTTP/2", "GET  / HTTP/1.1", "GET / HTTP/1.1 ",
                                        "GET / x HTTP/1.1", " GET / HTTP/1.1", "GET / HTTP/1.", "GET / HTTP/1.x",
                                        "Hostname: x", "Host", "use HTTP/1.1", "put 0 0 60 5",
                                        "watch HTTP/1.1", "GET / HTTP/1.1\r", NULL};
    for (int i = 0; other[i]; i++) assert_false(bg_line_is_http(other[i], strlen(other[i])));
    assert_false(bg_line_is_http("POST / HTTP/1.1", 14)); /* only len bytes count */
}

static void test_digits_span(void **state)
{
    (void)state;
    assert_int_equal(bg_digits_span("123abc", 6), 3);
    assert_int_equal(bg_digits_span("abc", 3), 0);
    assert_int_equal(bg_digits_span("42", 1), 1);
    assert_int_equal(bg_digits_span("", 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_cases),
        cmocka_unit_test(test_parse_reads_only_len),
        cmocka_unit_test(test_digits_span),
        cmocka_unit_test(test_line_is_http),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

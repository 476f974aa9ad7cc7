/* test_scope.c - the access file (core/scope.c): tables of files that parse
 * or are refused with "line N: why", of questions a parsed file answers
 * (allows, sees, the identity match), each limit at and one past its bound
 * (generated files), and allocation failures (no leak, no half result). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"

/* ---- files refused or accepted ----------------------------------------- */

struct parse_case {
    const char *text;
    int rc;              /* 0 or BG_BAD_FORMAT */
    const char *err;     /* the whole error for BG_BAD_FORMAT */
    size_t tokens, identities;
    size_t len;          /* of text, when it holds a NUL (else strlen) */
};

static const struct parse_case parse_cases[] = {
    {"", 0, NULL, 0, 0, 0},
    {"# only a comment\n\n   \n\t\n", 0, NULL, 0, 0, 0},
    {"tok-one\n", 0, NULL, 1, 0, 0},
    {"  tok-one  \r\n", 0, NULL, 1, 0, 0},
    {"tok-one\ntok-two", 0, NULL, 2, 0, 0},
    {"tok-one produce:emails\n", 0, NULL, 1, 0, 0},
    {"tok-one produce,consume:emails,sms read:*\n", 0, NULL, 1, 0, 0},
    {"tok-one *:emails-*\n", 0, NULL, 1, 0, 0},
    {"tok-one\tproduce:emails  # not a comment mid-line\n", BG_BAD_FORMAT,
     "line 1: grant 2 is not KINDS:TUBES", 0, 0, 0},
    {"identity cn:alice consume:emails\n", 0, NULL, 0, 1, 0},
    {"identity dns:worker.example read:*\nidentity * \n", 0, NULL, 0, 2, 0},
    {"identity email:a@b\nidentity uri:spiffe://x/y\n", 0, NULL, 0, 2, 0},
    {"a\n\nidentity\n", BG_BAD_FORMAT, "line 3: identity line without a name", 0, 0, 0},
    {"identity alice\n", BG_BAD_FORMAT,
     "line 1: identity name must be cn:NAME, dns:NAME, email:NAME, uri:NAME or *", 0, 0, 0},
    {"identity cn:\n", BG_BAD_FORMAT,
     "line 1: identity name must be cn:NAME, dns:NAME, email:NAME, uri:NAME or *", 0, 0, 0},
    {"tok produce\n", BG_BAD_FORMAT, "line 1: grant 1 is not KINDS:TUBES", 0, 0, 0},
    {"tok read:x write:emails\n", BG_BAD_FORMAT,
     "line 1: grant 2: unknown kind (produce, consume, manage, read or *)", 0, 0, 0},
    {"tok :emails\n", BG_BAD_FORMAT,
     "line 1: grant 1: unknown kind (produce, consume, manage, read or *)", 0, 0, 0},
    {"tok produce,:emails\n", BG_BAD_FORMAT,
     "line 1: grant 1: unknown kind (produce, consume, manage, read or *)", 0, 0, 0},
    {"tok produce:\n", BG_BAD_FORMAT, "line 1: grant 1: empty tube name", 0, 0, 0},
    {"tok produce:a,,b\n", BG_BAD_FORMAT, "line 1: grant 1: empty tube name", 0, 0, 0},
    {"tok produce:-a\n", BG_BAD_FORMAT, "line 1: grant 1: a tube name starts with '-'", 0, 0, 0},
    {"tok produce:a!b\n", BG_BAD_FORMAT, "line 1: grant 1: a tube name has a byte tube names cannot have", 0, 0, 0},
    {"tok produce:a*b\n", BG_BAD_FORMAT, "line 1: grant 1: a tube name has a byte tube names cannot have", 0, 0, 0},
    {"tok\x01x\n", BG_BAD_FORMAT, "line 1: token has a byte that is not visible ASCII", 0, 0, 0},
    {"tok\xc3\xa9\n", BG_BAD_FORMAT, "line 1: token has a byte that is not visible ASCII", 0, 0, 0},
    {"secret-half other-half\n", BG_BAD_FORMAT, "line 1: grant 1 is not KINDS:TUBES", 0, 0, 0},
    {"secret-half other:half\n", BG_BAD_FORMAT,
     "line 1: grant 1: unknown kind (produce, consume, manage, read or *)", 0, 0, 0},
    {"ok\nok2\nnul\0x\n", BG_BAD_FORMAT, "line 3: line has a NUL byte", 0, 0, 13},
};

static size_t case_len(const struct parse_case *c)
{
    return c->len ? c->len : strlen(c->text);
}

static void test_parse_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++) {
        const struct parse_case *c = &parse_cases[i];
        struct bg_scopes *sc = (void *)1;
        char err[256];
        int rc = bg_scopes_parse(&sc, c->text, case_len(c), err, sizeof err);
        if (rc != c->rc) fail_msg("case %zu: rc %d, wanted %d (%s)", i, rc, c->rc, err);
        if (rc != 0) {
            assert_null(sc);
            if (strcmp(err, c->err) != 0) fail_msg("case %zu: error \"%s\", wanted \"%s\"", i, err, c->err);
            continue;
        }
        assert_int_equal(bg_scopes_token_count(sc), c->tokens);
        assert_int_equal(bg_scopes_has_identities(sc), c->identities > 0);
        bg_scopes_free(sc);
    }
}

/* ---- what a parsed file allows ----------------------------------------- */

static const char access_file[] =
    "# tokens\n"
    "full-token-0123456789\n"
    "producer-token-0123 produce:emails,sms\n"
    "worker-token-012345 consume:emails-* read:emails-*\n"
    "admin-token-0123456 *:*\n"
    "mixed-token-0123456 produce,consume:jobs manage:jobs-urgent read:stats*\n"
    "identity cn:alice consume:emails\n"
    "identity dns:ops.example manage,read:*\n"
    "identity cn:alice produce:never\n"        /* the first match wins */
    "identity cn:root\n"                      /* no grants: everything */
    "identity * read:public\n";

struct allow_case {
    size_t token;                /* index among the token lines */
    enum bg_scope_kind kind;
    const char *tube;
    int allows, sees;
};

static const struct allow_case allow_cases[] = {
    {0, BG_SCOPE_MANAGE, "anything", 1, 1},
    {1, BG_SCOPE_PRODUCE, "emails", 1, 1},
    {1, BG_SCOPE_PRODUCE, "sms", 1, 1},
    {1, BG_SCOPE_CONSUME, "emails", 0, 1},
    {1, BG_SCOPE_READ, "emails", 0, 1},
    {1, BG_SCOPE_PRODUCE, "emails2", 0, 0},   /* exact names are exact */
    {1, BG_SCOPE_PRODUCE, "email", 0, 0},
    {1, BG_SCOPE_PRODUCE, "default", 0, 0},
    {2, BG_SCOPE_CONSUME, "emails-", 1, 1},   /* a prefix covers itself */
    {2, BG_SCOPE_CONSUME, "emails-eu", 1, 1},
    {2, BG_SCOPE_READ, "emails-eu", 1, 1},
    {2, BG_SCOPE_PRODUCE, "emails-eu", 0, 1},
    {2, BG_SCOPE_MANAGE, "emails-eu", 0, 1},
    {2, BG_SCOPE_CONSUME, "emails", 0, 0},
    {2, BG_SCOPE_CONSUME, "Emails-eu", 0, 0},
    {3, BG_SCOPE_PRODUCE, "x", 1, 1},
    {3, BG_SCOPE_CONSUME, "x", 1, 1},
    {3, BG_SCOPE_MANAGE, "default", 1, 1},
    {3, BG_SCOPE_READ, "default", 1, 1},
    {4, BG_SCOPE_PRODUCE, "jobs", 1, 1},
    {4, BG_SCOPE_CONSUME, "jobs", 1, 1},
    {4, BG_SCOPE_MANAGE, "jobs", 0, 1},
    {4, BG_SCOPE_MANAGE, "jobs-urgent", 1, 1},
    {4, BG_SCOPE_PRODUCE, "jobs-urgent", 0, 1},
    {4, BG_SCOPE_READ, "stats", 1, 1},
    {4, BG_SCOPE_READ, "stats-daily", 1, 1},
    {4, BG_SCOPE_READ, "jobs", 0, 1},
    {4, BG_SCOPE_KINDS, "jobs", 0, 1},        /* not a kind: never allowed */
};

static void test_allows(void **state)
{
    (void)state;
    struct bg_scopes *sc;
    char err[256];
    assert_int_equal(bg_scopes_parse(&sc, access_file, strlen(access_file), err, sizeof err), 0);
    assert_int_equal(bg_scopes_token_count(sc), 5);
    size_t len;
    assert_string_equal(bg_scopes_token(sc, 1, &len), "producer-token-0123");
    assert_int_equal(len, 19);
    assert_null(bg_scopes_token_scope(sc, 0));
    for (size_t i = 0; i < sizeof allow_cases / sizeof allow_cases[0]; i++) {
        const struct allow_case *c = &allow_cases[i];
        const struct bg_scope *s = bg_scopes_token_scope(sc, c->token);
        int a = bg_scope_allows(s, c->kind, c->tube, strlen(c->tube));
        int v = bg_scope_sees(s, c->tube, strlen(c->tube));
        if (a != c->allows || v != c->sees)
            fail_msg("case %zu (token %zu, %s:%s): allows %d sees %d, wanted %d %d", i, c->token,
                     bg_scope_kind_name(c->kind), c->tube, a, v, c->allows, c->sees);
    }
    /* The tube is name[0..len), not a C string. */
    const struct bg_scope *producer = bg_scopes_token_scope(sc, 1);
    assert_true(bg_scope_allows(producer, BG_SCOPE_PRODUCE, "emails-more", 6));
    /* NULL is unscoped. */
    assert_true(bg_scope_allows(NULL, BG_SCOPE_MANAGE, "x", 1));
    assert_true(bg_scope_sees(NULL, "x", 1));
    bg_scopes_free(sc);
}

struct identity_case {
    const char *names[3];
    size_t n;
    int rc;
    enum bg_scope_kind kind;   /* then what the scope found allows */
    const char *tube;
    int allows;
    int unscoped;
};

static const struct identity_case identity_cases[] = {
    {{"cn:alice"}, 1, 0, BG_SCOPE_CONSUME, "emails", 1, 0},
    {{"cn:alice"}, 1, 0, BG_SCOPE_PRODUCE, "never", 0, 0},     /* the first line, not the third */
    {{"cn:bob", "dns:ops.example"}, 2, 0, BG_SCOPE_MANAGE, "x", 1, 0},
    {{"dns:ops.example", "cn:alice"}, 2, 0, BG_SCOPE_CONSUME, "emails", 1, 0}, /* line order */
    {{"cn:root"}, 1, 0, BG_SCOPE_MANAGE, "x", 1, 1},
    {{"cn:bob"}, 1, 0, BG_SCOPE_READ, "public", 1, 0},         /* the * line */
    {{"cn:bob"}, 1, 0, BG_SCOPE_READ, "emails", 0, 0},
    {{"cn:ALICE"}, 1, 0, BG_SCOPE_READ, "public", 1, 0},       /* exact bytes */
    {{"alice"}, 1, 0, BG_SCOPE_READ, "public", 1, 0},
    {{NULL}, 0, BG_NOT_FOUND, BG_SCOPE_READ, "public", 0, 0},  /* no certificate: no line */
};

/* bg_scope_rule: a line's grants back as written, one rule per (grant,
 * pattern), prefixes with their '*'. */
static void test_rules(void **state)
{
    (void)state;
    static const char text[] = "t produce,read:emails,mail-* manage:* consume:x\nall\n";
    struct bg_scopes *sc;
    char err[256];
    assert_int_equal(bg_scopes_parse(&sc, text, strlen(text), err, sizeof err), 0);
    const struct bg_scope *s = bg_scopes_token_scope(sc, 0);
    static const struct {
        unsigned kinds;
        const char *pattern;
    } want[] = {
        {1u << BG_SCOPE_PRODUCE | 1u << BG_SCOPE_READ, "emails"},
        {1u << BG_SCOPE_PRODUCE | 1u << BG_SCOPE_READ, "mail-*"},
        {1u << BG_SCOPE_MANAGE, "*"},
        {1u << BG_SCOPE_CONSUME, "x"},
    };
    assert_int_equal(bg_scope_rule_count(s), 4);
    for (size_t i = 0; i < 4; i++) {
        char pattern[BG_TUBE_NAME_MAX + 2];
        assert_int_equal(bg_scope_rule(s, i, pattern), want[i].kinds);
        assert_string_equal(pattern, want[i].pattern);
    }
    assert_int_equal(bg_scope_rule_count(bg_scopes_token_scope(sc, 1)), 0); /* unscoped */
    assert_int_equal(bg_scope_rule_count(bg_scope_nothing()), 0);
    bg_scopes_free(sc);
}

static void test_identities(void **state)
{
    (void)state;
    struct bg_scopes *sc;
    char err[256];
    assert_int_equal(bg_scopes_parse(&sc, access_file, strlen(access_file), err, sizeof err), 0);
    for (size_t i = 0; i < sizeof identity_cases / sizeof identity_cases[0]; i++) {
        const struct identity_case *c = &identity_cases[i];
        const struct bg_scope *s = (void *)1;
        int rc = bg_scopes_for_identity(sc, c->names, c->n, &s);
        if (rc != c->rc) fail_msg("case %zu: rc %d, wanted %d", i, rc, c->rc);
        if (rc != 0) continue;
        if ((s == NULL) != c->unscoped) fail_msg("case %zu: unscoped %d", i, s == NULL);
        if (bg_scope_allows(s, c->kind, c->tube, strlen(c->tube)) != c->allows)
            fail_msg("case %zu: %s:%s not %d", i, bg_scope_kind_name(c->kind), c->tube, c->allows);
    }
    bg_scopes_free(sc);

    /* Without a * line, an unknown certificate matches nothing. */
    const char *text = "identity cn:alice read:x\n";
    assert_int_equal(bg_scopes_parse(&sc, text, strlen(text), err, sizeof err), 0);
    const char *bob[] = {"cn:bob"};
    const struct bg_scope *s;
    assert_int_equal(bg_scopes_for_identity(sc, bob, 1, &s), BG_NOT_FOUND);
    assert_int_equal(bg_scopes_token_count(sc), 0);
    bg_scopes_free(sc);
    assert_int_equal(bg_scopes_for_identity(NULL, bob, 1, &s), BG_NOT_FOUND);
    assert_false(bg_scopes_has_identities(NULL));
}

static void test_required(void **state)
{
    (void)state;
    char out[BG_SCOPE_REQUIRED_MAX];
    bg_scope_required(BG_SCOPE_CONSUME, "emails-xyz", 6, out);
    assert_string_equal(out, "consume:emails");
    bg_scope_required(BG_SCOPE_PRODUCE, "", 0, out);
    assert_string_equal(out, "produce:");
    assert_string_equal(bg_scope_kind_name(BG_SCOPE_MANAGE), "manage");
    assert_string_equal(bg_scope_kind_name(BG_SCOPE_READ), "read");
    /* The longest name fits whole; a longer one (a Gearman function) is cut. */
    char name[BG_TUBE_NAME_MAX + 50];
    memset(name, 'n', sizeof name);
    bg_scope_required(BG_SCOPE_CONSUME, name, BG_TUBE_NAME_MAX, out);
    assert_int_equal(strlen(out), strlen("consume:") + BG_TUBE_NAME_MAX);
    bg_scope_required(BG_SCOPE_CONSUME, name, sizeof name, out);
    assert_int_equal(strlen(out), strlen("consume:") + BG_TUBE_NAME_MAX);
}

/* ---- every limit at and one past its bound ----------------------------- */

/* A growing text (the tests' own; plain malloc). */
struct text {
    char *s;
    size_t len;
};

static void put(struct text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    t->s = realloc(t->s, t->len + (size_t)n + 1);
    assert_non_null(t->s);
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static void put_repeat(struct text *t, char c, size_t n)
{
    for (size_t i = 0; i < n; i++) put(t, "%c", c);
}

enum limit {
    L_TOKEN_BYTES, L_TOKENS, L_IDENTITIES, L_IDENTITY_NAME, L_GRANTS, L_TUBES, L_TUBE_NAME, L_LINE,
};

/* The file with `count` of what `limit` bounds (on line 2, after a token
 * line, where the limit is on one line). */
static struct text limit_file(enum limit limit, size_t count)
{
    struct text t = {NULL, 0};
    put(&t, "first-token-0123456\n");
    switch (limit) {
    case L_TOKEN_BYTES:
        put_repeat(&t, 't', count);
        put(&t, "\n");
        break;
    case L_TOKENS:   /* count tokens in all */
        for (size_t i = 1; i < count; i++) put(&t, "token-%zu read:t%zu\n", i, i);
        break;
    case L_IDENTITIES:
        for (size_t i = 0; i < count; i++) put(&t, "identity cn:n%zu read:t\n", i);
        break;
    case L_IDENTITY_NAME: /* count bytes, "cn:" included */
        put(&t, "identity cn:");
        put_repeat(&t, 'a', count - 3);
        put(&t, " read:x\n");
        break;
    case L_GRANTS:
        put(&t, "tok");
        for (size_t i = 0; i < count; i++) put(&t, " read:t%zu", i);
        put(&t, "\n");
        break;
    case L_TUBES:
        put(&t, "tok read:t0");
        for (size_t i = 1; i < count; i++) put(&t, ",t%zu", i);
        put(&t, "\n");
        break;
    case L_TUBE_NAME:
        put(&t, "tok read:");
        put_repeat(&t, 'q', count);
        put(&t, "\n");
        break;
    case L_LINE: /* count bytes, padded with blanks */
        put(&t, "tok read:x");
        put_repeat(&t, ' ', count - 10);
        put(&t, "\r\n");
        break;
    }
    return t;
}

struct limit_case {
    enum limit limit;
    size_t at;           /* the most that parses */
    const char *past;    /* the error one past it */
};

static const struct limit_case limit_cases[] = {
    {L_TOKEN_BYTES, BG_SCOPE_TOKEN_MAX, "line 2: token longer than 512 bytes"},
    {L_TOKENS, BG_SCOPE_TOKENS_MAX, "line 257: more than 256 tokens"},
    {L_IDENTITIES, BG_SCOPE_IDENTITIES_MAX, "line 258: more than 256 identity lines"},
    {L_IDENTITY_NAME, BG_SCOPE_NAME_MAX - 1, "line 2: identity name longer than 255 bytes"},
    {L_GRANTS, BG_SCOPE_GRANTS_MAX, "line 2: more than 64 grants"},
    {L_TUBES, BG_SCOPE_TUBES_MAX, "line 2: grant 1: more than 64 tubes"},
    {L_TUBE_NAME, BG_TUBE_NAME_MAX, "line 2: grant 1: tube name longer than 200 bytes"},
    {L_LINE, BG_SCOPE_LINE_MAX, "line 2: line longer than 8192 bytes"},
};

static void test_limits(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof limit_cases / sizeof limit_cases[0]; i++) {
        const struct limit_case *c = &limit_cases[i];
        for (size_t past = 0; past <= 1; past++) {
            struct text t = limit_file(c->limit, c->at + past);
            struct bg_scopes *sc;
            char err[256];
            int rc = bg_scopes_parse(&sc, t.s, t.len, err, sizeof err);
            if (!past && rc != 0) fail_msg("limit %zu at its bound: %s", i, err);
            if (past && (rc != BG_BAD_FORMAT || strcmp(err, c->past) != 0))
                fail_msg("limit %zu past its bound: rc %d \"%s\", wanted \"%s\"", i, rc, err, c->past);
            bg_scopes_free(past ? NULL : sc);
            free(t.s);
        }
    }
}

/* ---- tokens added after the file (BEANGATE_HTTP_TOKENS) ---------------- */

static void test_add_token(void **state)
{
    (void)state;
    struct bg_scopes *sc;
    char err[256];
    const char *text = "file-token-01234567 read:x\n";
    assert_int_equal(bg_scopes_parse(&sc, text, strlen(text), err, sizeof err), 0);
    assert_int_equal(bg_scopes_add_token(sc, "env-token-0123456", 17, err, sizeof err), 0);
    assert_int_equal(bg_scopes_token_count(sc), 2);
    assert_null(bg_scopes_token_scope(sc, 1));
    assert_int_equal(bg_scopes_add_token(sc, "a b", 3, err, sizeof err), BG_BAD_FORMAT);
    assert_string_equal(err, "token has a byte that is not visible ASCII");
    char big[BG_SCOPE_TOKEN_MAX + 1];
    memset(big, 'b', sizeof big);
    assert_int_equal(bg_scopes_add_token(sc, big, sizeof big, err, sizeof err), BG_BAD_FORMAT);
    assert_string_equal(err, "token longer than 512 bytes");
    assert_int_equal(bg_scopes_add_token(sc, big, BG_SCOPE_TOKEN_MAX, err, sizeof err), 0);
    while (bg_scopes_token_count(sc) < BG_SCOPE_TOKENS_MAX)
        assert_int_equal(bg_scopes_add_token(sc, "t", 1, err, sizeof err), 0);
    assert_int_equal(bg_scopes_add_token(sc, "t", 1, err, sizeof err), BG_BAD_FORMAT);
    assert_string_equal(err, "more than 256 tokens");
    assert_int_equal(bg_scopes_token_count(sc), BG_SCOPE_TOKENS_MAX);
    bg_scopes_free(sc);
}

/* ---- allocation failures ----------------------------------------------- */

/* Every allocation of a parse failing in turn: BG_OUT_OF_MEMORY and nothing
 * kept (ASan finds a leak), until the parse needs no more than it gets. */
static void test_out_of_memory(void **state)
{
    (void)state;
    const char *text = "a-token\nb-token produce:x,y read:*\nidentity cn:a consume:q\nidentity *\n";
    for (uint64_t nth = 1;; nth++) {
        struct bg_scopes *sc = (void *)1;
        char err[256];
        bg_alloc_fail_after(nth);
        int rc = bg_scopes_parse(&sc, text, strlen(text), err, sizeof err);
        bg_alloc_fail_after(0);
        if (rc == 0) {
            assert_int_equal(bg_scopes_token_count(sc), 2);
            bg_scopes_free(sc);
            assert_true(nth > 3);
            break;
        }
        assert_int_equal(rc, BG_OUT_OF_MEMORY);
        assert_null(sc);
        assert_true(nth < 100);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_cases),
        cmocka_unit_test(test_allows),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_identities),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_add_token),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

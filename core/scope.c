/* scope.c - what a token or a client certificate may do (issue 23): the
 * access file's parser and the one place every protocol asks whether a
 * scope allows an action on a tube. The file's format is in core.h.
 *
 * A scope is a flat list of rules, one per (grant, tube pattern): a mask
 * of kinds and a tube name or prefix. A line's N grants of M tubes each
 * become N*M rules; the limits keep that small (BG_SCOPE_GRANTS_MAX grants,
 * BG_SCOPE_TUBES_MAX patterns a grant, BG_SCOPE_LINE_MAX bytes a line).
 * An entry without grants has no scope (NULL): it may do everything.
 * Errors never quote the line: a mistyped token must not reach a log. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

struct scope_rule {
    unsigned kinds;                    /* 1 << enum bg_scope_kind */
    int prefix;                        /* name is a prefix ("emails-*"; "*": "") */
    size_t len;
    char name[BG_TUBE_NAME_MAX + 1];
};

struct bg_scope {
    size_t count;
    struct scope_rule rules[];
};

struct scope_entry {
    char *key;                         /* the token, or the identity name */
    size_t len;
    struct bg_scope *scope;            /* NULL: unscoped */
};

struct entry_list {
    struct scope_entry *items;
    size_t count, cap;
};

struct bg_scopes {
    struct entry_list tokens, identities;
};

#define BG_STR_(x) #x
#define BG_STR(x) BG_STR_(x)
#define BG_SCOPE_NAME_MAX_TEXT 255 /* BG_SCOPE_NAME_MAX - 1 */
_Static_assert(BG_SCOPE_NAME_MAX_TEXT == BG_SCOPE_NAME_MAX - 1, "the message names the limit");

static const char *const kind_names[BG_SCOPE_KINDS] = {"produce", "consume", "manage", "read"};
#define ALL_KINDS ((1u << BG_SCOPE_KINDS) - 1)

/* The identity name prefixes io/tls.h produces. */
static const char *const identity_prefixes[] = {"cn:", "dns:", "email:", "uri:"};

const char *bg_scope_kind_name(enum bg_scope_kind kind)
{
    return (unsigned)kind < BG_SCOPE_KINDS ? kind_names[kind] : "?";
}

void bg_scope_required(enum bg_scope_kind kind, const char *name, size_t len, char *out)
{
    if (len > BG_TUBE_NAME_MAX) len = BG_TUBE_NAME_MAX;
    snprintf(out, BG_SCOPE_REQUIRED_MAX, "%s:%.*s", bg_scope_kind_name(kind), (int)len, name);
}

/* Whether rule r's pattern covers the tube name[0..len). */
static int rule_matches(const struct scope_rule *r, const char *name, size_t len)
{
    if (r->prefix) return len >= r->len && memcmp(name, r->name, r->len) == 0;
    return len == r->len && memcmp(name, r->name, len) == 0;
}

int bg_scope_allows(const struct bg_scope *s, enum bg_scope_kind kind, const char *name, size_t len)
{
    if (!s) return 1;
    if ((unsigned)kind >= BG_SCOPE_KINDS) return 0;
    for (size_t i = 0; i < s->count; i++)
        if ((s->rules[i].kinds & (1u << kind)) && rule_matches(&s->rules[i], name, len)) return 1;
    return 0;
}

int bg_scope_allows_some(const struct bg_scope *s, enum bg_scope_kind kind)
{
    if (!s) return 1;
    if ((unsigned)kind >= BG_SCOPE_KINDS) return 0;
    for (size_t i = 0; i < s->count; i++)
        if (s->rules[i].kinds & (1u << kind)) return 1;
    return 0;
}

int bg_scope_allows_all(const struct bg_scope *s, enum bg_scope_kind kind)
{
    /* only a lone * (a prefix of no bytes) matches the empty name */
    return bg_scope_allows(s, kind, "", 0);
}

const struct bg_scope *bg_scope_nothing(void)
{
    static const struct bg_scope nothing = {0};
    return &nothing;
}

int bg_scope_sees(const struct bg_scope *s, const char *name, size_t len)
{
    if (!s) return 1;
    for (size_t i = 0; i < s->count; i++)
        if (rule_matches(&s->rules[i], name, len)) return 1;
    return 0;
}

size_t bg_scope_rule_count(const struct bg_scope *s)
{
    return s ? s->count : 0;
}

unsigned bg_scope_rule(const struct bg_scope *s, size_t i, char pattern[BG_TUBE_NAME_MAX + 2])
{
    const struct scope_rule *r = &s->rules[i];
    memcpy(pattern, r->name, r->len);
    if (r->prefix) pattern[r->len] = '*';
    pattern[r->len + (size_t)r->prefix] = '\0';
    return r->kinds;
}

/* ---- the parser -------------------------------------------------------- */

struct parse_state {
    struct bg_scopes *sc;
    unsigned lineno;
    size_t grant;                      /* the grant being read, from 1 */
    char *err;
    size_t errlen;
};

/* Write "line N: why" into the error buffer; returns BG_BAD_FORMAT. */
static int refuse(struct parse_state *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct parse_state *p, const char *fmt, ...)
{
    if (p->errlen) {
        int n = snprintf(p->err, p->errlen, "line %u: ", p->lineno);
        if (n >= 0 && (size_t)n < p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return BG_BAD_FORMAT;
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* The next word of [*pos, end) (spaces and tabs separate words): its start
 * and length, or NULL at the end. */
static const char *next_word(const char **pos, const char *end, size_t *len)
{
    const char *s = *pos;
    while (s < end && is_blank(*s)) s++;
    if (s == end) return *pos = s, NULL;
    const char *e = s;
    while (e < end && !is_blank(*e)) e++;
    *pos = e;
    *len = (size_t)(e - s);
    return s;
}

/* Nonzero if every byte of s[0..n) is visible ASCII. */
static int visible_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f) return 0;
    return 1;
}

/* The kinds list k[0..n) ("produce,consume" or "*") into *mask. */
static int parse_kinds(struct parse_state *p, const char *k, size_t n, unsigned *mask)
{
    *mask = 0;
    const char *end = k + n;
    for (const char *s = k; s <= end;) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *e = comma ? comma : end;
        size_t len = (size_t)(e - s);
        unsigned bit = 0;
        if (len == 1 && *s == '*') bit = ALL_KINDS;
        for (int i = 0; i < BG_SCOPE_KINDS && !bit; i++)
            if (strlen(kind_names[i]) == len && memcmp(s, kind_names[i], len) == 0) bit = 1u << i;
        if (!bit)
            return refuse(p, "grant %zu: unknown kind (produce, consume, manage, read or *)", p->grant);
        *mask |= bit;
        s = e + 1;
    }
    return 0;
}

/* One tube pattern t[0..n) into r: a tube name, a prefix ending in '*', or
 * "*" (every tube). */
static int parse_pattern(struct parse_state *p, const char *t, size_t n, struct scope_rule *r)
{
    r->prefix = n > 0 && t[n - 1] == '*';
    size_t len = r->prefix ? n - 1 : n;
    if (len > BG_TUBE_NAME_MAX)
        return refuse(p, "grant %zu: tube name longer than %d bytes", p->grant, BG_TUBE_NAME_MAX);
    if (!r->prefix && len == 0) return refuse(p, "grant %zu: empty tube name", p->grant);
    for (size_t i = 0; i < len; i++)
        if (!bg_tube_name_char(t[i]))
            return refuse(p, "grant %zu: a tube name has a byte tube names cannot have", p->grant);
    if (!r->prefix && !bg_tube_name_valid(t, len))
        return refuse(p, "grant %zu: a tube name starts with '-'", p->grant);
    memcpy(r->name, t, len);
    r->name[len] = '\0';
    r->len = len;
    return 0;
}

/* The grants of one line ([pos, end), after the token or identity name)
 * into *out (NULL when there is none). */
static int parse_grants(struct parse_state *p, const char *pos, const char *end, struct bg_scope **out)
{
    *out = NULL;
    size_t grants = 0, rules = 0;
    size_t len;
    const char *scan = pos;
    for (const char *w; (w = next_word(&scan, end, &len));) {
        if (++grants > BG_SCOPE_GRANTS_MAX) return refuse(p, "more than %d grants", BG_SCOPE_GRANTS_MAX);
        const char *colon = memchr(w, ':', len);
        p->grant = grants;
        if (!colon) return refuse(p, "grant %zu is not KINDS:TUBES", p->grant);
        size_t tubes = 1;
        for (const char *c = colon + 1; c < w + len; c++) tubes += *c == ',';
        if (tubes > BG_SCOPE_TUBES_MAX)
            return refuse(p, "grant %zu: more than %d tubes", p->grant, BG_SCOPE_TUBES_MAX);
        rules += tubes;
    }
    if (grants == 0) return 0;
    struct bg_scope *s = bg_malloc(sizeof *s + rules * sizeof s->rules[0]);
    if (!s) return BG_OUT_OF_MEMORY;
    s->count = 0;
    int rc = 0;
    p->grant = 0;
    for (const char *w; rc == 0 && (w = next_word(&pos, end, &len));) {
        p->grant++;
        const char *colon = memchr(w, ':', len);
        unsigned mask;
        if ((rc = parse_kinds(p, w, (size_t)(colon - w), &mask)) != 0) break;
        const char *tend = w + len;
        for (const char *t = colon + 1; rc == 0 && t <= tend;) {
            const char *comma = memchr(t, ',', (size_t)(tend - t));
            const char *e = comma ? comma : tend;
            struct scope_rule *r = &s->rules[s->count];
            if ((rc = parse_pattern(p, t, (size_t)(e - t), r)) == 0) {
                r->kinds = mask;
                s->count++;
            }
            t = e + 1;
        }
    }
    if (rc != 0) {
        bg_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Append an entry (key copied) to list l, limited to max entries. */
static int add_entry(struct parse_state *p, struct entry_list *l, size_t max, const char *what,
                     const char *key, size_t len, struct bg_scope *scope)
{
    if (l->count == max) return refuse(p, "more than %zu %s", max, what);
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > max) cap = max;
        struct scope_entry *items = bg_realloc(l->items, cap * sizeof *items);
        if (!items) return BG_OUT_OF_MEMORY;
        l->items = items;
        l->cap = cap;
    }
    char *copy = bg_malloc(len + 1);
    if (!copy) return BG_OUT_OF_MEMORY;
    memcpy(copy, key, len);
    copy[len] = '\0';
    l->items[l->count++] = (struct scope_entry){copy, len, scope};
    return 0;
}

/* Check token t[0..n): NULL, or why it cannot be one. */
static const char *token_problem(const char *t, size_t n)
{
    if (memchr(t, '\0', n)) return "token has a NUL byte";
    if (n > BG_SCOPE_TOKEN_MAX) return "token longer than " BG_STR(BG_SCOPE_TOKEN_MAX) " bytes";
    if (!visible_ascii(t, n)) return "token has a byte that is not visible ASCII";
    return NULL;
}

/* Check an identity name n[0..len): NULL, or why it cannot be one. */
static const char *identity_problem(const char *n, size_t len)
{
    if (len >= BG_SCOPE_NAME_MAX) return "identity name longer than " BG_STR(BG_SCOPE_NAME_MAX_TEXT) " bytes";
    if (len == 1 && n[0] == '*') return NULL;
    for (size_t i = 0; i < sizeof identity_prefixes / sizeof identity_prefixes[0]; i++) {
        size_t pl = strlen(identity_prefixes[i]);
        if (len > pl && memcmp(n, identity_prefixes[i], pl) == 0) return NULL;
    }
    return "identity name must be cn:NAME, dns:NAME, email:NAME, uri:NAME or *";
}

/* One line (without its newline, NUL-free). */
static int parse_line(struct parse_state *p, const char *line, size_t n)
{
    const char *end = line + n, *pos = line;
    size_t len;
    const char *first = next_word(&pos, end, &len);
    if (!first || first[0] == '#') return 0;
    int identity = len == 8 && memcmp(first, "identity", 8) == 0;
    const char *key = first;
    if (identity) {
        key = next_word(&pos, end, &len);
        if (!key) return refuse(p, "identity line without a name");
        const char *why = identity_problem(key, len);
        if (why) return refuse(p, "%s", why);
    } else {
        const char *why = token_problem(first, len);
        if (why) return refuse(p, "%s", why);
    }
    struct bg_scope *scope;
    int rc = parse_grants(p, pos, end, &scope);
    if (rc != 0) return rc;
    if (identity)
        rc = add_entry(p, &p->sc->identities, BG_SCOPE_IDENTITIES_MAX, "identity lines", key, len, scope);
    else
        rc = add_entry(p, &p->sc->tokens, BG_SCOPE_TOKENS_MAX, "tokens", key, len, scope);
    if (rc != 0) bg_free(scope);
    return rc;
}

static void free_list(struct entry_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        bg_free(l->items[i].key);
        bg_free(l->items[i].scope);
    }
    bg_free(l->items);
}

void bg_scopes_free(struct bg_scopes *sc)
{
    if (!sc) return;
    free_list(&sc->tokens);
    free_list(&sc->identities);
    bg_free(sc);
}

int bg_scopes_parse(struct bg_scopes **out, const char *text, size_t len, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen) err[0] = '\0';
    struct bg_scopes *sc = bg_malloc(sizeof *sc);
    if (!sc) return BG_OUT_OF_MEMORY;
    memset(sc, 0, sizeof *sc);
    struct parse_state p = {sc, 0, 0, err, errlen};
    const char *end = text + len;
    int rc = 0;
    for (const char *line = text; rc == 0 && line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *e = nl ? nl : end;
        p.lineno++;
        size_t n = (size_t)(e - line);
        if (n && line[n - 1] == '\r') n--;
        if (n > BG_SCOPE_LINE_MAX) rc = refuse(&p, "line longer than %d bytes", BG_SCOPE_LINE_MAX);
        else if (memchr(line, '\0', n)) rc = refuse(&p, "line has a NUL byte");
        else rc = parse_line(&p, line, n);
        line = e + 1;
    }
    if (rc != 0) {
        bg_scopes_free(sc);
        return rc;
    }
    *out = sc;
    return 0;
}

int bg_scopes_add_token(struct bg_scopes *sc, const char *token, size_t len, char *err, size_t errlen)
{
    struct parse_state p = {sc, 0, 0, err, errlen};
    const char *why = token_problem(token, len);
    if (!why && sc->tokens.count == BG_SCOPE_TOKENS_MAX) why = "more than " BG_STR(BG_SCOPE_TOKENS_MAX) " tokens";
    if (why) {
        if (errlen) snprintf(err, errlen, "%s", why);
        return BG_BAD_FORMAT;
    }
    return add_entry(&p, &sc->tokens, BG_SCOPE_TOKENS_MAX, "tokens", token, len, NULL);
}

size_t bg_scopes_token_count(const struct bg_scopes *sc)
{
    return sc ? sc->tokens.count : 0;
}

const char *bg_scopes_token(const struct bg_scopes *sc, size_t i, size_t *len)
{
    if (len) *len = sc->tokens.items[i].len;
    return sc->tokens.items[i].key;
}

const struct bg_scope *bg_scopes_token_scope(const struct bg_scopes *sc, size_t i)
{
    return sc->tokens.items[i].scope;
}

int bg_scopes_has_identities(const struct bg_scopes *sc)
{
    return sc && sc->identities.count > 0;
}

int bg_scopes_for_identity(const struct bg_scopes *sc, const char *const *names, size_t n,
                           const struct bg_scope **out)
{
    *out = NULL;
    if (!sc) return BG_NOT_FOUND;
    for (size_t i = 0; i < sc->identities.count; i++) {
        const struct scope_entry *id = &sc->identities.items[i];
        int match = id->len == 1 && id->key[0] == '*' && n > 0;
        for (size_t j = 0; j < n && !match; j++)
            match = strlen(names[j]) == id->len && memcmp(names[j], id->key, id->len) == 0;
        if (match) {
            *out = id->scope;
            return 0;
        }
    }
    return BG_NOT_FOUND;
}
